"""The workspace digest of the result protocol: sha256 over sorted (relative path, mode, sha256 of
content or symlink target), checked against an independent implementation written here from
docs/result-protocol.md, and for what it must and must not notice."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pvisor.replay.workspace import digest_workspace


def reference_digest(root: Path) -> str:
    lines = []
    for p in root.rglob("*"):
        st = os.lstat(p)
        rel = p.relative_to(root).as_posix().encode()
        if p.is_symlink():
            d = hashlib.sha256(os.fsencode(os.readlink(p))).hexdigest()
        elif p.is_file():
            d = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            d = "-"
        lines.append(rel + b"\0" + oct(st.st_mode)[2:].encode() + b"\0" + d.encode() + b"\n")
    return hashlib.sha256(b"".join(sorted(lines))).hexdigest()


def make(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_bytes(b"one")
    (root / "x.bin").write_bytes(bytes(range(256)) * 5000)
    (root / "l").symlink_to("a/b/f.txt")
    return root


def test_digest_matches_the_documented_definition(tmp_path):
    ws = make(tmp_path / "ws")
    d = digest_workspace(ws)
    assert d.sha256 == reference_digest(ws)
    assert d.entries == 5 and d.files == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert digest_workspace(empty).sha256 == hashlib.sha256(b"").hexdigest()


def test_digest_notices_content_mode_names_and_link_targets_not_times(tmp_path):
    ws = make(tmp_path / "ws")
    base = digest_workspace(ws).sha256
    os.utime(ws / "x.bin", ns=(1, 1))
    assert digest_workspace(ws).sha256 == base  # times do not count
    (ws / "a" / "b" / "f.txt").write_bytes(b"two")
    changed = digest_workspace(ws).sha256
    assert changed != base
    (ws / "a" / "b" / "f.txt").write_bytes(b"one")
    assert digest_workspace(ws).sha256 == base
    (ws / "x.bin").chmod(0o700)
    assert digest_workspace(ws).sha256 != base  # the mode counts
    os.chmod(ws / "x.bin", os.stat(ws / "a" / "b" / "f.txt").st_mode & 0o7777)
    assert digest_workspace(ws).sha256 == base
    (ws / "l").unlink()
    (ws / "l").symlink_to("x.bin")  # another target, never followed
    assert digest_workspace(ws).sha256 not in (base, changed)
    assert digest_workspace(ws).sha256 == reference_digest(ws)
    (ws / "new-empty-dir").mkdir()  # an empty directory is an entry
    with_dir = digest_workspace(ws).sha256
    assert with_dir == reference_digest(ws)
    (ws / "new-empty-dir").rename(ws / "renamed-dir")
    assert digest_workspace(ws).sha256 != with_dir  # names count
