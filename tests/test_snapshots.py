"""Workspace snapshots, the library (journal/snapshots.py; issue 15, structure first): a real
directory tree checkpointed into content-addressed blobs and restored exactly, and crafted
manifests that must write nothing outside the target."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from pvisor.journal.errors import BadInputError, UsageError
from pvisor.journal.snapshots import Entry, EntryKind, FilesystemDriver, Manifest, snapshot_driver


class Blobs:
    """A content-addressed store: what the journal's blob table is to the driver."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts = 0

    def put(self, b: bytes) -> str:
        self.puts += 1
        h = hashlib.sha256(b).hexdigest()
        self.data[h] = b
        return h

    def get(self, h: str) -> bytes:
        return self.data[h]


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry below ``root``: kind, mode and content or link text."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), p.read_bytes())
    return out


def _workspace(root: Path) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "secret.txt").write_text("s")
    (root / "secret.txt").chmod(0o600)
    (root / "empty").mkdir()
    (root / "empty").chmod(0o750)
    (root / "bin" / "data.bin").parent.mkdir()
    (root / "bin" / "data.bin").write_bytes(bytes(range(256)) * 4)
    os.symlink("src/pkg/mod.py", root / "link-in")
    os.symlink("/etc/hostname", root / "link-out")  # kept as a link, never followed
    return root


def test_a_tree_restores_exactly_contents_modes_and_symlinks(tmp_path):
    ws = _workspace(tmp_path / "ws")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    assert [e.path for e in m.entries] == sorted(e.path for e in m.entries) and m.warnings == []
    assert {e.path: e.kind for e in m.entries}["link-out"] is EntryKind.SYMLINK
    out = tmp_path / "out"
    FilesystemDriver().restore(Manifest.decode(m.encode()), blobs.get, out)
    assert _tree(out) == _tree(ws)


def test_unchanged_files_cost_nothing_and_an_unchanged_tree_has_one_digest(tmp_path):
    ws = _workspace(tmp_path / "ws")
    blobs = Blobs()
    first = FilesystemDriver().checkpoint(ws, blobs.put)
    stored = len(blobs.data)
    again = FilesystemDriver().checkpoint(ws, blobs.put)
    assert again.digest() == first.digest() and len(blobs.data) == stored
    (ws / "run.sh").write_text("#!/bin/sh\necho changed\n")
    changed = FilesystemDriver().checkpoint(ws, blobs.put)
    assert changed.digest() != first.digest() and len(blobs.data) == stored + 1  # one new blob


def test_pvisorignore_is_honoured_with_gitignore_rules(tmp_path):
    ws = _workspace(tmp_path / "ws")
    (ws / ".pvisorignore").write_text("*.bin\nsrc/\n!keep.bin\n")
    (ws / "keep.bin").write_bytes(b"k")
    paths = {e.path for e in FilesystemDriver().checkpoint(ws, Blobs().put).entries}
    assert "bin/data.bin" not in paths and not any(p.startswith("src") for p in paths)
    assert {"keep.bin", ".pvisorignore", "run.sh", "bin"} <= paths


def test_size_limits_leave_files_out_with_a_warning_naming_them(tmp_path):
    ws = _workspace(tmp_path / "ws")
    m = FilesystemDriver(max_file_bytes=512).checkpoint(ws, Blobs().put)
    assert "bin/data.bin" not in {e.path for e in m.entries}
    assert any(w.startswith("bin/data.bin: 1024 bytes, over the limit") for w in m.warnings), m.warnings
    total = FilesystemDriver(max_total_bytes=30).checkpoint(ws, Blobs().put)
    assert any("would pass its limit of 30 bytes" in w for w in total.warnings) and total.total_bytes <= 30


def test_a_non_empty_target_is_refused_unless_forced(tmp_path):
    ws = _workspace(tmp_path / "ws")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.sh").write_text("old")
    with pytest.raises(UsageError) as exc:
        FilesystemDriver().restore(m, blobs.get, out)
    assert "not empty" in exc.value.message and "--force" in exc.value.message and exc.value.exit_code == 2
    FilesystemDriver().restore(m, blobs.get, out, force=True)
    assert (out / "run.sh").read_text() == "#!/bin/sh\necho run\n"


@pytest.mark.parametrize(
    "entries, words",
    [
        ([Entry("../escape", EntryKind.FILE, 0o644, 1, "x")], "'../escape'"),
        ([Entry("/etc/escape", EntryKind.FILE, 0o644, 1, "x")], "'/etc/escape'"),
        ([Entry("a/../../escape", EntryKind.FILE, 0o644, 1, "x")], "'a/../../escape'"),
        (
            [
                Entry("d", EntryKind.SYMLINK, 0o777, target="/tmp"),
                Entry("d/escape", EntryKind.FILE, 0o644, 1, "x"),
            ],
            "below the symlink 'd'",
        ),
        (
            [
                Entry("d", EntryKind.SYMLINK, 0o777, target=".."),
                Entry("d/x/escape", EntryKind.FILE, 0o644, 1, "x"),
            ],
            "below the symlink 'd'",
        ),
    ],
)
def test_crafted_manifests_write_nothing_outside_the_target(tmp_path, entries, words):
    outside = tmp_path / "escape"
    target = tmp_path / "box" / "target"
    with pytest.raises(BadInputError) as exc:
        FilesystemDriver().restore(Manifest(entries), lambda h: b"x", target)
    assert words in exc.value.message and exc.value.exit_code == 65
    assert (
        not outside.exists()
        and not (tmp_path / "box" / "escape").exists()
        and not Path("/etc/escape").exists()
    )
    assert not target.exists() or not any(target.iterdir())  # checked before anything was written


def test_a_decoded_manifest_refuses_unsafe_paths_and_wrong_shapes(tmp_path):
    with pytest.raises(BadInputError) as exc:
        Manifest.decode(
            b'{"schema": "pvisor.snapshot-manifest/v1", "entries": '
            b'[{"path": "../x", "kind": "file", "mode": 420, "size": 1, "sha256": "a"}]}'
        )
    assert "entries[0]" in exc.value.message and "'../x'" in exc.value.message
    with pytest.raises(BadInputError):
        Manifest.decode(b'{"schema": "other", "entries": []}')
    with pytest.raises(BadInputError) as exc:
        Manifest.decode(
            b'{"schema": "pvisor.snapshot-manifest/v1", "entries": '
            b'[{"path": "a", "kind": "fifo", "mode": 420}]}'
        )
    assert "fifo" in exc.value.message


def test_a_blob_that_does_not_match_is_refused(tmp_path):
    m = Manifest([Entry("a.txt", EntryKind.FILE, 0o644, 1, hashlib.sha256(b"a").hexdigest())])
    with pytest.raises(BadInputError) as exc:
        FilesystemDriver().restore(m, lambda h: b"b", tmp_path / "t")
    assert "a.txt" in exc.value.message and "does not match" in exc.value.message


def test_the_filesystem_driver_is_registered_as_an_entry_point():
    from importlib.metadata import entry_points

    assert "filesystem" in {ep.name for ep in entry_points(group="pvisor.snapshot_drivers")}
    assert isinstance(snapshot_driver("filesystem"), FilesystemDriver)
    with pytest.raises(UsageError) as exc:
        snapshot_driver("nope")
    assert "filesystem" in exc.value.message
