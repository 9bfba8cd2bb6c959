"""Workspace snapshots, the library (journal/snapshots.py; issue 15, structure first): a real
directory tree checkpointed into content-addressed blobs and restored exactly, and crafted
manifests that must write nothing outside the target."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from agent_helpers import PVISOR
from cli_helpers import pvisor_main

from pvisor.core.errors import BadInputError, UsageError
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


# --------------------------------------------------------------------------- through the CLI


def _journal_with_snapshot(
    path: Path, manifest: bytes, blobs: dict[str, bytes], driver: str = "filesystem"
) -> str:
    """A journal holding one run whose start snapshot, taken by ``driver``, has ``manifest``
    (as stored: possibly crafted) and ``blobs``; returns the run id."""
    from pvisor.journal.snapshots import SnapshotKind, SnapshotRecord
    from pvisor.journal.writer import Journal

    with Journal.open(path) as j:
        j.put_blobs(list(blobs.items()))
        j.record_snapshot(
            SnapshotRecord(
                id="s-crafted0000000001",
                run="r-crafted",
                attempt=1,
                kind=SnapshotKind.START,
                driver=driver,
                taken_ms=1.0,
                manifest=manifest,
                digest=hashlib.sha256(manifest).hexdigest(),
            )
        )
    return "r-crafted"


def _restore_cli(journal: Path, into: Path, cwd: Path):
    """``pvisor snapshot restore r-crafted --after-step 0`` in this process (tests/cli_helpers.py)."""
    return pvisor_main(
        [
            "--journal",
            str(journal),
            "snapshot",
            "restore",
            "r-crafted",
            "--after-step",
            "0",
            "--into",
            str(into),
        ],
        cwd=cwd,
        text=True,
    )


@pytest.mark.parametrize(
    "entries, words",
    [
        ([{"path": "../escape", "kind": "file", "mode": 420, "size": 1, "sha256": "X"}], "'../escape'"),
        (
            [{"path": "/tmp/escape-abs", "kind": "file", "mode": 420, "size": 1, "sha256": "X"}],
            "'/tmp/escape-abs'",
        ),
        (
            [
                {"path": "d", "kind": "symlink", "mode": 511, "target": ".."},
                {"path": "d/escape", "kind": "file", "mode": 420, "size": 1, "sha256": "X"},
            ],
            "below the symlink 'd'",
        ),
    ],
)
def test_restore_of_a_crafted_journal_snapshot_writes_nothing_outside(tmp_path, entries, words):
    sha = hashlib.sha256(b"x").hexdigest()
    for e in entries:
        if e.get("sha256") == "X":
            e["sha256"] = sha
    manifest = orjson.dumps({"schema": "pvisor.snapshot-manifest/v1", "entries": entries, "warnings": []})
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {sha: b"x"})
    box = tmp_path / "box"
    box.mkdir()
    proc = _restore_cli(journal, box / "into", tmp_path)
    assert proc.returncode == 65 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("pvisor: error: ") and words in line
    assert sorted(os.listdir(box)) in ([], ["into"]) and not (tmp_path / "escape").exists()
    assert not Path("/tmp/escape-abs").exists()
    assert not (box / "into").exists() or not any((box / "into").iterdir())


def test_a_run_without_a_step_says_what_can_be_paused(tmp_path):
    """A run of 0 journal steps has no transition: --step K is refused naming --after-step 0 (the
    start state), which restores; a view without a pause holds the task alone, and says so."""
    sha = hashlib.sha256(b"a\n").hexdigest()
    manifest = orjson.dumps(
        {
            "schema": "pvisor.snapshot-manifest/v1",
            "entries": [{"path": "a.txt", "kind": "file", "mode": 420, "size": 2, "sha256": sha}],
            "warnings": [],
        }
    )
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {sha: b"a\n"})

    def cli(*args: str):
        return pvisor_main(["--journal", str(journal), *args], cwd=tmp_path, text=True)

    for pause in (["--step", "0"], ["--step", "0", "--before"]):
        proc = cli("snapshot", "restore", "r-crafted", *pause, "--into", str(tmp_path / "r"))
        assert proc.returncode == 2 and not (tmp_path / "r").exists()
        assert proc.stderr == (
            f"pvisor: error: {' '.join(pause)}: run r-crafted has no transition (0 journal steps: only the "
            "task alone, after step 0); the task alone is --after-step 0\n"
        )
    proc = cli("snapshot", "restore", "r-crafted", "--into", str(tmp_path / "r"))
    assert proc.returncode == 2 and "give the pause: --step K (transition K, zero-based" in proc.stderr
    proc = cli("snapshot", "restore", "r-crafted", "--after-step", "0", "--into", str(tmp_path / "r"))
    assert proc.returncode == 0 and (tmp_path / "r" / "a.txt").read_text() == "a\n"
    assert "at the task alone (after step 0 of 0 journal steps)" in proc.stdout, proc.stdout
    view = cli("view", "r-crafted")
    assert view.returncode == 0, view.stderr
    doc = orjson.loads(view.stdout)
    assert (doc["through_step"], doc["pause"]["transition"], doc["workspace"]["kind"]) == (0, None, "start")
    assert view.stderr == (
        "pvisor: warning: run r-crafted has no transition (0 journal steps): the view holds the task alone\n"
    )
    progress = cli("view", "r-crafted", "--progress", "0.5")
    assert progress.returncode == 2 and "the task alone is --after-step 0" in progress.stderr
    # no commitment in no step: what works is named, not --step or --progress
    commitment = cli("view", "r-crafted", "--before-commitment")
    assert commitment.returncode == 65 and commitment.stderr == (
        "pvisor: error: no commitment in run r-crafted: it has no transition (0 journal steps); its one "
        "pause is the task alone (--after-step 0)\n"
    )
    from pvisor.harness import PauseSpec, TrajectoryReplay

    with pytest.raises(BadInputError) as exc:
        TrajectoryReplay.from_journal(journal, "r-crafted").view(PauseSpec(id="c", kind="before_commitment"))
    assert exc.value.message.endswith("its one pause is the task alone (kind step with after_step=0)")


def test_restore_of_a_snapshot_whose_blob_is_missing_names_it(tmp_path):
    sha = hashlib.sha256(b"gone").hexdigest()
    manifest = orjson.dumps(
        {
            "schema": "pvisor.snapshot-manifest/v1",
            "entries": [{"path": "a.txt", "kind": "file", "mode": 420, "size": 4, "sha256": sha}],
            "warnings": [],
        }
    )
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {})
    proc = _restore_cli(journal, tmp_path / "into", tmp_path)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert f"blob {sha} is missing" in proc.stderr


def test_a_driver_of_another_package_is_found_by_its_entry_point(tmp_path):
    """A package registers a driver under pvisor.snapshot_drivers (a dist-info on the path, as
    pip installs it); the gateway's snapshots and the restore both go through it."""
    site = tmp_path / "site"
    (site / "tally_driver-1.0.dist-info").mkdir(parents=True)
    (site / "tally_driver-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tally-driver\nVersion: 1.0\n"
    )
    (site / "tally_driver-1.0.dist-info" / "entry_points.txt").write_text(
        "[pvisor.snapshot_drivers]\ntally = tally_driver:Tally\n"
    )
    (site / "tally_driver.py").write_text(
        "from pvisor.journal.snapshots import FilesystemDriver\n"
        "class Tally(FilesystemDriver):\n"
        "    name = 'tally'\n"
        "    def restore(self, manifest, get, target, force=False):\n"
        "        super().restore(manifest, get, target, force)\n"
        "        (target / 'restored-by-tally').write_text(str(len(manifest.entries)))\n"
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    journal = tmp_path / "j.sqlite"
    proc = subprocess.Popen(
        [
            str(PVISOR),
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--run",
            "r-tally",
            "--workspace",
            str(ws),
            "--snapshot-driver",
            "tally",
            "--upstream",
            "anthropic=http://127.0.0.1:9",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening "), proc.stderr.read()
    finally:
        proc.terminate()
        proc.wait(30)
    restore = subprocess.run(
        [
            str(PVISOR),
            "--journal",
            str(journal),
            "snapshot",
            "restore",
            "r-tally",
            "--after-step",
            "0",
            "--into",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert restore.returncode == 0, restore.stderr
    assert (tmp_path / "r" / "a.txt").read_text() == "a\n" and (
        tmp_path / "r" / "restored-by-tally"
    ).read_text() == "1"
    unknown = subprocess.run(
        [
            str(PVISOR),
            "--journal",
            str(journal),
            "gateway",
            "--workspace",
            str(ws),
            "--snapshot-driver",
            "nope",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert unknown.returncode == 2 and "no snapshot driver 'nope'; known: filesystem" in unknown.stderr


def test_a_walks_encoding_is_the_canonical_one(tmp_path):
    """The manifest a walk encodes from its entries' own JSON (reused for unchanged files) is
    byte for byte the canonical encoding of the same manifest, first walk and later ones."""
    ws = _workspace(tmp_path / "ws")
    driver = FilesystemDriver(racy_ns=0)
    blobs = Blobs()
    for change in (None, "run.sh", "new.txt"):
        if change:
            (ws / change).write_text(f"changed {change}\n")
        m = driver.checkpoint(ws, blobs.put)
        assert m.encoded_entries is not None
        plain = Manifest(list(m.entries), list(m.warnings))
        assert m.encode() == plain.encode() == orjson.dumps(plain.to_json(), option=orjson.OPT_SORT_KEYS)
        assert Manifest.decode(m.encode()).entries == m.entries


def test_a_target_that_cannot_be_made_is_one_usage_error(tmp_path):
    ws = _workspace(tmp_path / "ws")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    (tmp_path / "regular").write_text("a file\n")
    with pytest.raises(UsageError) as exc:
        FilesystemDriver().restore(m, blobs.get, tmp_path / "regular" / "sub")
    assert exc.value.exit_code == 2 and "cannot create it: Not a directory" in exc.value.message
    assert (tmp_path / "regular").read_text() == "a file\n"


@pytest.mark.parametrize("blocker", ["dir-where-a-file-goes", "link-where-a-dir-goes", "file-on-the-way"])
def test_a_forced_restore_that_cannot_replace_what_is_there_writes_nothing(tmp_path, blocker):
    ws = _workspace(tmp_path / "ws")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("mine\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if blocker == "dir-where-a-file-goes":
        (out / "run.sh").mkdir()  # the snapshot has a file run.sh
        words = "the target holds a directory at 'run.sh', where the snapshot has a file"
    elif blocker == "link-where-a-dir-goes":
        os.symlink(elsewhere, out / "src")  # the snapshot has a directory src
        words = "the target holds a link at 'src', where the snapshot has a directory"
    else:
        (out / "src").write_text("in the way\n")
        words = "the target holds a file at 'src', where the snapshot has a directory"
    before = sorted(os.listdir(out))
    with pytest.raises(UsageError) as exc:
        FilesystemDriver().restore(m, blobs.get, out, force=True)
    assert words in exc.value.message and "nothing was written" in exc.value.message
    assert sorted(os.listdir(out)) == before and os.listdir(elsewhere) == []
    assert (out / "mine.txt").read_text() == "mine\n"


def test_a_name_that_is_not_utf8_is_left_out_with_a_warning(tmp_path):
    ws = _workspace(tmp_path / "ws")
    bad = os.fsencode(ws) + b"/bad\xffname"
    with open(bad, "wb") as f:
        f.write(b"x")
    os.symlink(b"target\xfe", os.fsencode(ws) + b"/badlink")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    paths = {e.path for e in m.entries}
    assert (
        "run.sh" in paths
        and "badlink" not in paths
        and not any("name" in p for p in paths if p.startswith("bad"))
    )
    assert "b'bad\\xffname': the name is not valid UTF-8: left out" in m.warnings
    assert "badlink: a symlink whose target is not valid UTF-8: left out" in m.warnings
    assert Manifest.decode(m.encode()).entries == m.entries  # the manifest is still JSON


def test_a_directory_swapped_for_a_symlink_during_the_walk_is_not_followed(tmp_path):
    """A tool replaces a directory by a link to outside between the walk's listing of its
    parent and its own listing: the walk leaves it out and reads nothing outside."""
    ws = tmp_path / "ws"
    (ws / "zz").mkdir(parents=True)
    (ws / "zz" / "inside.txt").write_text("inside\n")
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE\n")
    read: list[bytes] = []

    class Swap(FilesystemDriver):
        def _entries(self, walk, dir_fd, rel_dir, items):
            done = super()._entries(walk, dir_fd, rel_dir, items)
            if rel_dir == "":  # zz was seen as a directory, not entered yet: swap it now
                (ws / "zz" / "inside.txt").unlink()
                (ws / "zz").rmdir()
                os.symlink(secret, ws / "zz")
            return done

    m = Swap().checkpoint(ws, lambda data: read.append(data) or hashlib.sha256(data).hexdigest())
    assert b"PRIVATE\n" not in read and not any(e.path.startswith("zz/") for e in m.entries)
    assert any(w.startswith("zz: not read") for w in m.warnings), m.warnings


def test_a_file_swapped_for_a_fifo_during_the_walk_is_not_waited_on(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "b.txt").write_text("b\n")

    class Swap(FilesystemDriver):
        def _entries(self, walk, dir_fd, rel_dir, items):
            for d in items:  # a DirEntry keeps its lstat: the walk will take a.txt for a file
                d.stat(follow_symlinks=False)
            (ws / "a.txt").unlink()
            os.mkfifo(ws / "a.txt")  # ... which is a FIFO by the time it is opened
            return super()._entries(walk, dir_fd, rel_dir, items)

    import threading

    done: list = []
    t = threading.Thread(target=lambda: done.append(Swap().checkpoint(ws, Blobs().put)), daemon=True)
    t.start()
    t.join(20)
    assert done, "the walk waited on a FIFO"
    [m] = done
    assert [e.path for e in m.entries] == ["b.txt"]
    assert any(w.startswith("a.txt: not read") for w in m.warnings), m.warnings


def test_restore_clears_setuid_and_refuses_a_nul_in_a_link_target(tmp_path):
    data = b"#!/bin/sh\n"
    sha = hashlib.sha256(data).hexdigest()
    m = Manifest([Entry("tool", EntryKind.FILE, 0o4755, len(data), sha)])
    FilesystemDriver().restore(m, lambda h: data, tmp_path / "t")
    assert stat.S_IMODE((tmp_path / "t" / "tool").stat().st_mode) == 0o755
    with pytest.raises(BadInputError) as exc:
        Manifest.decode(
            b'{"schema": "pvisor.snapshot-manifest/v1", "entries": '
            b'[{"path": "l", "kind": "symlink", "mode": 511, "target": "a\\u0000b"}]}'
        )
    assert "entries[0]" in exc.value.message and "NUL" in exc.value.message


def test_a_handoff_restores_into_the_environment_of_another_driver(tmp_path):
    """restore_handoff's environment may be what a snapshot driver of another package restores
    into (here an object holding files in memory): the driver the snapshot names gets it as it
    is, and the child run is saved with the snapshot's digest. The journal of one run is read by
    from_event_log too."""
    site = tmp_path / "site"
    (site / "memory_driver-1.0.dist-info").mkdir(parents=True)
    (site / "memory_driver-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: memory-driver\nVersion: 1.0\n"
    )
    (site / "memory_driver-1.0.dist-info" / "entry_points.txt").write_text(
        "[pvisor.snapshot_drivers]\nmemory = memory_driver:Memory\n"
    )
    (site / "memory_driver.py").write_text(
        "class Environment:\n"
        "    def __init__(self):\n"
        "        self.files = {}\n"
        "class Memory:\n"
        "    name = 'memory'\n"
        "    def checkpoint(self, root, put):\n"
        "        raise NotImplementedError\n"
        "    def restore(self, manifest, get, target, force=False):\n"
        "        for e in manifest.entries:\n"
        "            target.files[e.path] = get(e.sha256).decode()\n"
    )
    sha = hashlib.sha256(b"a\n").hexdigest()
    manifest = orjson.dumps(
        {
            "schema": "pvisor.snapshot-manifest/v1",
            "entries": [{"path": "a.txt", "kind": "file", "mode": 420, "size": 2, "sha256": sha}],
            "warnings": [],
        }
    )
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {sha: b"a\n"}, driver="memory")
    code = (
        "import json, sys\n"
        "from memory_driver import Environment\n"
        "from pvisor.harness import PauseSpec, TrajectoryReplay\n"
        "replay = TrajectoryReplay.from_event_log(sys.argv[1])\n"
        "[view] = replay.materialize_pauses([PauseSpec(id='start', kind='step', after_step=0)])\n"
        "env = Environment()\n"
        "branch = TrajectoryReplay.restore_handoff(view, env, 'child-env')\n"
        "print(json.dumps([env.files, branch.workspace is env, branch.through_step, branch.snapshot_hash]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(journal)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    files, same, through, digest = json.loads(proc.stdout)
    assert files == {"a.txt": "a\n"} and same is True and through == 0
    from pvisor.journal.reader import JournalReader

    with JournalReader(journal) as r:
        child = r.run("child-env")
        assert (child.mode, child.parent_run, child.boundary_step, child.workspace_snapshot) == (
            "handoff",
            "r-crafted",
            0,
            digest,
        )
        assert child.labels["snapshot_driver"] == "memory" and r.run_status(child) == "pending"


# --------------------------------------------------------------------------- handoffs at once


def _a_txt_journal(tmp_path: Path, driver: str = "filesystem") -> Path:
    """A journal whose run r-crafted (0 steps) has a start snapshot holding a.txt, by ``driver``."""
    sha = hashlib.sha256(b"a\n").hexdigest()
    manifest = orjson.dumps(
        {
            "schema": "pvisor.snapshot-manifest/v1",
            "entries": [{"path": "a.txt", "kind": "file", "mode": 420, "size": 2, "sha256": sha}],
            "warnings": [],
        }
    )
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {sha: b"a\n"}, driver=driver)
    return journal


#: a process that hands r-crafted's start off to child ARGV[3] into ARGV[2] (a directory, or with
#: GATED set an environment of the gated driver): exit 0 and what it restored, or 2 and the error
HANDOFF = (
    "import json, os, sys\n"
    "from pvisor.harness import PauseSpec, TrajectoryReplay\n"
    "from pvisor.core.errors import UsageError\n"
    "replay = TrajectoryReplay.from_journal(sys.argv[1], 'r-crafted')\n"
    "[view] = replay.materialize_pauses([PauseSpec(id='start', kind='step', after_step=0)])\n"
    "env = sys.argv[2]\n"
    "if os.environ.get('GATED'):\n"
    "    from gated_driver import Environment\n"
    "    env = Environment(env)\n"
    "try:\n"
    "    branch = TrajectoryReplay.restore_handoff(view, env, sys.argv[3])\n"
    "except UsageError as exc:\n"
    "    print(exc.message)\n"
    "    sys.exit(2)\n"
    "print(json.dumps(branch.to_json()))\n"
)


def test_handoffs_made_at_once_under_one_child_id_save_one(tmp_path):
    """Three restore_handoff calls with one child id, made at the same moment: the journal gives
    the id to one, which restores; the others are refused naming child_episode_id before they
    restore anything, and nothing of theirs is left as that child. (The snapshot's driver, of
    another package, holds each restore at a gate until all have come or ended.)"""
    from agent_helpers import GATE_SH, start_together

    site = tmp_path / "site"
    (site / "gated_driver-1.0.dist-info").mkdir(parents=True)
    (site / "gated_driver-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gated-driver\nVersion: 1.0\n"
    )
    (site / "gated_driver-1.0.dist-info" / "entry_points.txt").write_text(
        "[pvisor.snapshot_drivers]\ngated = gated_driver:Gated\n"
    )
    (site / "gated_driver.py").write_text(
        "import os, subprocess\n"
        "class Environment:\n"
        "    def __init__(self, name):\n"
        "        self.name, self.files = name, {}\n"
        "    def __repr__(self):\n"
        "        return f'Environment({self.name!r})'\n"
        "class Gated:\n"
        "    name = 'gated'\n"
        "    def checkpoint(self, root, put):\n"
        "        raise NotImplementedError\n"
        "    def restore(self, manifest, get, target, force=False):\n"
        f"        subprocess.run(['bash', '-c', {GATE_SH!r}, 'gate', os.environ['GATE']], check=True)\n"
        "        for e in manifest.entries:\n"
        "            target.files[e.path] = get(e.sha256).decode()\n"
    )
    journal = _a_txt_journal(tmp_path, driver="gated")
    gate = tmp_path / "gate"
    env = {**os.environ, "PYTHONPATH": str(site), "GATED": "1", "GATE": str(gate)}
    procs = start_together(
        [[sys.executable, "-c", HANDOFF, str(journal), f"env-{i}", "child-x"] for i in range(3)],
        gate,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert sorted(p.returncode for p in procs) == [0, 2, 2], [
        (p.returncode, p.stdout, p.stderr) for p in procs
    ]
    [won] = [json.loads(p.stdout) for p in procs if p.returncode == 0]
    for p in procs:
        if p.returncode == 2:
            assert p.stdout == (
                f"restore_handoff: child_episode_id='child-x': journal {journal} has a run child-x already; "
                "give a new id for the child run\n"
            )
    assert len(list(tmp_path.glob("gate.arrived.*"))) == 1  # the refused ones restored nothing
    from pvisor.journal.reader import JournalReader

    with JournalReader(journal) as r:
        child = r.run("child-x")
        assert child.labels["workspace"] == won["workspace"] and r.run_status(child) == "pending"
        assert "handoff_restore" not in child.labels
        assert [x.id for x in r.runs()] == ["r-crafted", "child-x"]


def test_a_handoff_into_a_directory_another_restore_is_writing_waits_then_is_refused(tmp_path):
    """A restore into a directory waits while another restore writes into it (its lock on the
    directory), then finds it not empty and is refused as a later one would be: one line naming
    environment=, its child run not saved, nothing of it written."""
    import fcntl

    journal = _a_txt_journal(tmp_path)
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    fd = os.open(env_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another restore writing into it holds it
        proc = subprocess.Popen(
            [sys.executable, "-c", HANDOFF, str(journal), str(env_dir), "child-y"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        waiting = f":{os.fstat(fd).st_ino} "
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with open("/proc/locks") as f:
                if any("->" in line and waiting in line for line in f):
                    break  # it waits for the lock
            time.sleep(0.02)
        (env_dir / "b.txt").write_text("the other restore's\n")
    finally:
        os.close(fd)  # the other restore is done
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    assert out == (
        f"restore_handoff: environment={str(env_dir)!r}: not empty; give force=True to restore into it "
        "anyway\n"
    )
    assert sorted(os.listdir(env_dir)) == ["b.txt"]
    from pvisor.journal.reader import JournalReader

    with JournalReader(journal) as r:
        assert not r.run_exists("child-y") and [x.id for x in r.runs()] == ["r-crafted"]
    # the directory free and empty again: the same handoff goes through
    (env_dir / "b.txt").unlink()
    again = subprocess.run(
        [sys.executable, "-c", HANDOFF, str(journal), str(env_dir), "child-y"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert again.returncode == 0 and (env_dir / "a.txt").read_text() == "a\n", again.stdout + again.stderr


def test_a_child_id_that_is_a_prefix_of_a_run_or_has_one_is_refused(tmp_path):
    """A prefix of a run id names that run (journal show, --run): a child id that is one, or
    that starts with a run's id, would make such lookups ambiguous. Refused, nothing written."""
    from pvisor.harness import PauseSpec, TrajectoryReplay
    from pvisor.journal.reader import JournalReader

    journal = _a_txt_journal(tmp_path)
    [view] = TrajectoryReplay.from_journal(journal, "r-crafted").materialize_pauses(
        [PauseSpec(id="start", kind="step", after_step=0)]
    )
    for child, said in (
        ("r-craft", "has a run r-crafted (r-crafted starts with it: a prefix lookup would name both)"),
        (
            "r-crafted-2",
            "has a run r-crafted (r-crafted is the start of it: a prefix lookup would name both)",
        ),
        ("r-crafted", "has a run r-crafted already"),
    ):
        with pytest.raises(UsageError) as exc:
            TrajectoryReplay.restore_handoff(view, tmp_path / "ws", child)
        assert exc.value.message == (
            f"restore_handoff: child_episode_id={child!r}: journal {journal} {said}; give a new id for the "
            "child run"
        )
        assert not (tmp_path / "ws").exists()
    TrajectoryReplay.restore_handoff(view, tmp_path / "ws", "child-ok")
    with pytest.raises(UsageError, match="has a run child-ok .child-ok is the start of it"):
        TrajectoryReplay.restore_handoff(view, tmp_path / "ws2", "child-ok2")
    with JournalReader(journal) as r:
        assert [x.id for x in r.runs()] == ["r-crafted", "child-ok"]


def test_restore_handoff_refuses_an_environment_that_is_no_directory_path(tmp_path):
    """environment= of the filesystem driver is a directory path: None, a number, bytes, an
    empty string (not the current directory silently), a NUL, a name too long are each one
    UsageError naming environment=, and no child run is saved."""
    from pvisor.harness import PauseSpec, TrajectoryReplay
    from pvisor.journal.reader import JournalReader

    journal = _a_txt_journal(tmp_path)
    [view] = TrajectoryReplay.from_journal(journal, "r-crafted").materialize_pauses(
        [PauseSpec(id="start", kind="step", after_step=0)]
    )
    long_name = "n" * 300
    for environment, said in (
        (None, "environment=None: give the directory to restore the workspace into"),
        (5, "environment=5: a directory path as str or pathlib.Path, not int"),
        (b"ws-bytes", "environment=b'ws-bytes': a directory path as str or pathlib.Path, not bytes"),
        ("", "environment='': empty; give a directory path ('.' for the current directory)"),
        (str(tmp_path / "a\x00b"), "a path cannot hold a NUL character"),
        (str(tmp_path / long_name), "has 300 bytes, more than a file name may (255)"),
        (tmp_path / "missing" / long_name, "has 300 bytes, more than a file name may (255)"),
    ):
        with pytest.raises(UsageError) as exc:
            TrajectoryReplay.restore_handoff(view, environment, "child-e")
        message = exc.value.message
        assert message.startswith("restore_handoff: environment=") and said in message, message
        assert "\n" not in message and len(message) < 300, message
    assert sorted(os.listdir(tmp_path)) == ["j.sqlite", "j.sqlite-shm", "j.sqlite-wal"]
    with JournalReader(journal) as r:
        assert [x.id for x in r.runs()] == ["r-crafted"]


def test_restore_clears_setuid_and_setgid_on_directories_too(tmp_path):
    """A crafted snapshot restored by root must not leave a setgid directory (its files would
    take a group of the snapshot's choosing), a setuid one, nor a sticky one (issue 35 attacks:
    a mode of -1 came back 0o1777, world-writable and sticky)."""
    m = Manifest(
        [
            Entry("shared", EntryKind.DIR, 0o2775),
            Entry("suid", EntryKind.DIR, 0o4755),
            Entry("tmp", EntryKind.DIR, 0o3777),
        ]
    )
    FilesystemDriver().restore(m, lambda h: b"", tmp_path / "t")
    modes = {name: stat.S_IMODE((tmp_path / "t" / name).stat().st_mode) for name in ("shared", "suid", "tmp")}
    assert modes == {"shared": 0o775, "suid": 0o755, "tmp": 0o777}


@pytest.mark.parametrize("mode", [-1, 0o177777777, 0o10000])
def test_a_recorded_mode_outside_the_permission_bits_is_damage(mode):
    """A manifest mode of -1 or 0o177777777 was masked to 0o7777 and restored 0o1777: a mode
    outside 0..0o7777 (what stat.S_IMODE records) is refused in one line naming the entry."""
    doc = {
        "schema": "pvisor.snapshot-manifest/v1",
        "entries": [{"path": "a", "kind": "dir", "mode": 0o755}, {"path": "m", "kind": "dir", "mode": mode}],
    }
    with pytest.raises(BadInputError) as exc:
        Manifest.decode(orjson.dumps(doc))
    assert exc.value.message.endswith(
        f"entries[1]: mode {mode} is outside 0..0o7777 (stat's permission bits)"
    )


def test_restore_into_a_new_directory_makes_it_0700_under_umask_000(tmp_path):
    """Under umask 000, ``snapshot restore --into NEW`` made NEW (and its parents) 0777: they are
    0700, as every directory pvisor makes; the files inside keep their recorded modes."""
    from journal_helpers import snapshot

    from pvisor.journal.writer import Journal

    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.record_exchange("r-umask", "POST", "/v1/messages", [], status=200, request_body=b"{}")
        snapshot(j, "r-umask", "s-umask00000000001", {"a.txt": b"a\n"})
    into = tmp_path / "new" / "into"
    proc = subprocess.run(
        ["sh", "-c", 'umask 000; exec "$@"', "sh", str(PVISOR), "--journal", str(journal)]
        + ["snapshot", "restore", "r-umask", "--after-step", "0", "--into", str(into)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (into.parent, into, into / "a.txt")}
    assert modes == {into.parent: 0o700, into: 0o700, into / "a.txt": 0o644}


#: run the real CLI in a subprocess, counting the files and directories it opens (PEP 578 audit
#: event "open": os.open and open both raise it)
_COUNTING_CLI = """
import atexit, sys
opened = [0]
def hook(event, args):
    if event == "open":
        opened[0] += 1
sys.addaudithook(hook)
atexit.register(lambda: sys.stderr.write(f"opened {opened[0]}\\n"))
sys.argv = ["pvisor", *sys.argv[1:]]
from pvisor.entry import main
main()
"""


def test_a_manifest_1500_deep_restores_with_opens_linear_in_its_entries(tmp_path):
    """A directory nested 1,500 deep with a file at every level (3,000 entries, 4.7 MB of
    manifest): restore, and a forced restore over it, open about 2.5 files and directories per
    entry. Before, every entry reopened each level from the root (about 2 million opens per
    restore: 50 s here, 104 s at 2,000 deep), and the forced restore's look at the target named
    each path whole (past PATH_MAX: 'File name too long'). The depth is kept low for the
    suite's time: deleting such a tree takes seconds (bench/store_attacks.py depth goes to 4,000)."""
    depth = 1500
    data = b"x\n"
    sha = hashlib.sha256(data).hexdigest()
    entries = []
    for d in range(1, depth + 1):
        entries.append({"path": "/".join(["d"] * d), "kind": "dir", "mode": 0o755})
        entries.append(
            {
                "path": "/".join(["d"] * (d - 1) + ["f"]),
                "kind": "file",
                "mode": 0o644,
                "size": 2,
                "sha256": sha,
            }
        )
    entries.sort(key=lambda e: e["path"])
    manifest = orjson.dumps({"schema": "pvisor.snapshot-manifest/v1", "entries": entries, "warnings": []})
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {sha: data})
    into = tmp_path / "into"
    try:
        for extra in ([], ["--force"]):
            proc = subprocess.run(
                [sys.executable, "-c", _COUNTING_CLI, "--journal", str(journal), "snapshot", "restore",
                 "r-crafted", "--after-step", "0", "--into", str(into), *extra],
                capture_output=True, text=True, cwd=tmp_path, timeout=120,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-2000:]
            opened = int(proc.stderr.rsplit("opened ", 1)[1])
            # 1,500 files; 1,500 levels down and back up to write, then to set the directories'
            # modes; forced, once more to look at what the target holds
            assert opened <= (4 if extra else 3) * len(entries), opened
            # the deepest file is there, reached one level at a time
            fd = os.open(into, os.O_RDONLY | os.O_DIRECTORY)
            for _ in range(depth - 1):
                nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nxt
            try:
                assert os.stat("f", dir_fd=fd).st_size == 2 and stat.S_ISDIR(os.stat("d", dir_fd=fd).st_mode)
            finally:
                os.close(fd)
    finally:
        subprocess.run(["rm", "-rf", str(into)], check=False)  # shutil.rmtree recurses: too deep


def test_a_directory_moved_out_of_the_target_during_a_deep_restore_is_not_climbed_through(tmp_path):
    """Past 64 levels the restore climbs back to a directory with ``..``; a directory moved
    meanwhile (here out of the target, while a file below it is written) would lead elsewhere:
    the climb finds another directory than the one entered and stops, writing nothing outside."""
    data = b"x\n"
    sha = hashlib.sha256(data).hexdigest()
    chain = ["/".join(["d"] * n) for n in range(1, 71)]
    entries = [Entry(p, EntryKind.DIR, 0o755) for p in chain]
    entries += [
        Entry(chain[-1] + "/f", EntryKind.FILE, 0o644, 2, sha),
        Entry("d/g", EntryKind.FILE, 0o644, 2, sha),
    ]
    target, outside = tmp_path / "t", tmp_path / "outside"

    def get(h: str) -> bytes:
        if not outside.exists():  # while the deepest file is written: d/d goes out of the target
            os.rename(target / "d" / "d", outside)
        return data

    try:
        with pytest.raises(BadInputError) as exc:
            FilesystemDriver().restore(Manifest(entries), get, target)
        assert "moved while the restore wrote below it" in exc.value.message
        assert sorted(os.listdir(tmp_path)) == ["outside", "t"]
        assert sorted(os.listdir(target / "d")) == []  # g was not written anywhere
        assert not (outside / "g").exists()
    finally:
        subprocess.run(["rm", "-rf", str(target), str(outside)], check=False)


#: the pvisor command with SIGINT sent to itself (what Ctrl-C does) when the restore opens file f05
_CTRL_C_AT_F05 = """
import os, signal, sys
sent = []
def hook(event, args):
    if event == "open" and not sent and os.fsdecode(args[0] or "").endswith("f05"):
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(hook)
sys.argv = ["pvisor", *sys.argv[1:]]
from pvisor.entry import main
main()
"""


def test_ctrl_c_during_a_restore_names_the_partial_target(tmp_path):
    """Ctrl-C during ``snapshot restore`` printed ``pvisor: aborted`` (exit 130) and left part of
    the snapshot in --into without saying so: the line now says the target is partial and
    names it."""
    data = b"x\n"
    sha = hashlib.sha256(data).hexdigest()
    entries = [
        {"path": f"f{i:02}", "kind": "file", "mode": 0o644, "size": 2, "sha256": sha} for i in range(20)
    ]
    manifest = orjson.dumps({"schema": "pvisor.snapshot-manifest/v1", "entries": entries, "warnings": []})
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, {sha: data})
    into = tmp_path / "into"
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C_AT_F05, "--journal", str(journal), "snapshot", "restore", "r-crafted",
         "--after-step", "0", "--into", str(into)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == (
        f"pvisor: aborted: --into {into} is partial: the restore was interrupted "
        "(restore again with --force, or remove it)\n"
    )
    assert 0 < len(list(into.iterdir())) < 20  # it is partial indeed


# --------------------------------------------------------------------------- secret files

#: a key as a user's .env holds it
KEY = "sk-ant-api03-snapshotsecret0123456789abcdef"


def _secret_workspace(root: Path) -> Path:
    """A workspace holding secret files beside ordinary ones: ``{path: why}`` of the secret ones
    is :data:`SECRET_WHY`."""
    (root / "deploy").mkdir(parents=True)
    (root / ".env").write_text(f"ANTHROPIC_API_KEY={KEY}\n")
    (root / ".env.local").write_text("DEBUG=1\n")
    (root / ".env.example").write_text("ANTHROPIC_API_KEY=\n")  # a template: kept
    (root / "deploy" / "server.pem").write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n")
    (root / "deploy" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (root / "deploy" / "id_ed25519.pub").write_text("ssh-ed25519 AAAA me@host\n")  # public: kept
    (root / ".npmrc").write_text("//registry.npmjs.org/:_authToken=npm_plainwords0123\n")
    (root / ".pypirc").write_text("[distutils]\nindex-servers = pypi\n")  # no token: kept
    (root / "notes.txt").write_text(f"remember {KEY}\n")
    (root / "app.py").write_text("print('hi')\n")
    return root


SECRET_WHY = {
    ".env": "secret_name",
    ".env.local": "secret_name",
    ".npmrc": "token_in_config",
    "deploy/id_ed25519": "secret_name",
    "deploy/server.pem": "secret_name",
    "notes.txt": "key_shaped",
}


def test_secret_files_are_withheld_named_in_the_manifest_and_never_stored(tmp_path):
    ws = _secret_workspace(tmp_path / "ws")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    assert {w.path: w.why.value for w in m.withheld} == SECRET_WHY
    sizes = {w.path: w.size for w in m.withheld}
    assert sizes[".env"] == (ws / ".env").stat().st_size
    kept = {e.path for e in m.entries if e.kind is EntryKind.FILE}
    assert kept == {".env.example", ".pypirc", "app.py", "deploy/id_ed25519.pub"}
    stored = b"".join(blobs.data.values()) + m.encode()
    assert KEY.encode() not in stored and b"npm_plainwords0123" not in stored and b"MIIB" not in stored
    # no digest of a withheld file's content: nothing confirms a guess
    for rel in SECRET_WHY:
        assert hashlib.sha256((ws / rel).read_bytes()).hexdigest().encode() not in m.encode()
    # the manifest round-trips, and a restore writes none of them
    again = Manifest.decode(m.encode())
    assert again.withheld == m.withheld and again.digest() == m.digest()
    out = tmp_path / "out"
    FilesystemDriver().restore(again, blobs.get, out)
    assert not any((out / rel).exists() for rel in SECRET_WHY)
    assert (out / "app.py").read_text() == "print('hi')\n"


def test_a_manifest_without_secret_files_is_the_one_older_versions_wrote(tmp_path):
    """A tree without secret files encodes as before (no ``withheld`` key: its digest is the
    old one), and a journal's older manifest restores."""
    ws = _workspace(tmp_path / "ws")
    m = FilesystemDriver().checkpoint(ws, Blobs().put)
    assert b"withheld" not in m.encode()
    assert sorted(orjson.loads(m.encode())) == ["entries", "schema", "warnings"]
    old = orjson.dumps({"schema": "pvisor.snapshot-manifest/v1", "entries": [], "warnings": []})
    assert Manifest.decode(old).withheld == []


def test_restore_through_the_cli_reports_the_withheld_files(tmp_path):
    ws = _secret_workspace(tmp_path / "ws")
    blobs = Blobs()
    m = FilesystemDriver().checkpoint(ws, blobs.put)
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, m.encode(), blobs.data)
    proc = pvisor_main(
        ["--journal", str(journal), "snapshot", "restore", "r-crafted", "--after-step", "0", "--into",
         str(tmp_path / "into"), "--json"], cwd=tmp_path, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert {w["path"]: w["why"] for w in done["withheld"]} == SECRET_WHY
    assert not (tmp_path / "into" / ".env").exists() and KEY not in proc.stdout + proc.stderr
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("j.sqlite*"))
    assert KEY.encode() not in stored
    text = pvisor_main(
        ["--journal", str(journal), "snapshot", "restore", "r-crafted", "--after-step", "0", "--into",
         str(tmp_path / "into2")], cwd=tmp_path, text=True,
    )  # fmt: skip
    assert text.returncode == 0 and "withheld as secret, not restored: .env, .env.local" in text.stderr


def test_an_older_snapshot_holding_a_secret_file_restores_without_it(tmp_path):
    """A manifest written before snapshots withheld secret files (the same schema) restores as
    it did, except the file named as a secret one: left out and reported."""
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (f"K={KEY}\n".encode(), b"print(1)\n")}
    env_sha, app_sha = list(blobs)
    entries = [
        {"path": ".env", "kind": "file", "mode": 0o600, "size": len(blobs[env_sha]), "sha256": env_sha},
        {"path": "app.py", "kind": "file", "mode": 0o644, "size": 9, "sha256": app_sha},
    ]
    manifest = orjson.dumps({"schema": "pvisor.snapshot-manifest/v1", "entries": entries, "warnings": []})
    journal = tmp_path / "j.sqlite"
    _journal_with_snapshot(journal, manifest, blobs)
    proc = pvisor_main(
        ["--journal", str(journal), "snapshot", "restore", "r-crafted", "--after-step", "0", "--into",
         str(tmp_path / "into"), "--json"], cwd=tmp_path, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["withheld"] == [
        {"path": ".env", "size": len(blobs[env_sha]), "why": "secret_name"}
    ]
    assert sorted(os.listdir(tmp_path / "into")) == ["app.py"]
