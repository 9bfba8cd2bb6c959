"""Modes of what pvisor writes, under umask 000 (issue 35 item 10): the directories it creates
above the journal, and every output file (exports, reports, views, prefix files) and the
directories made for them are private, 0600 and 0700, as the journal is; never the umask's 0666
and 0777. Each command runs as a subprocess with the umask set to 000."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import PVISOR
from journal_helpers import snapshot

from pvisor.journal.writer import Journal

NATIVE = Path(__file__).parent / "corpus" / "native" / "claude-code" / "spotter_short.jsonl"


def _umask_000() -> None:
    os.umask(0)


def _modes(root: Path) -> dict[str, int]:
    """Mode bits of ``root`` and of everything below it, by path relative to its parent."""
    out = {root.name: stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root.parent))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def _private(modes: dict[str, int], root: Path) -> None:
    for rel, mode in modes.items():
        want = 0o700 if (root.parent / rel).is_dir() else 0o600
        assert mode == want, f"{rel}: {oct(mode)}, expected {oct(want)} ({modes})"


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("modes") / "j.sqlite"
    with Journal.open(path) as j:
        j.record_exchange(
            "r-modes",
            "POST",
            "/v1/messages",
            [],
            status=200,
            request_body=b'{"messages": [{"role": "user", "content": "hi"}]}',
            response_body=b'{"content": []}',
        )
        snapshot(j, "r-modes", "s-modes00000000001", {"a.txt": b"a\n"})
    return path


def test_directories_made_above_a_new_journal_are_0700(tmp_path):
    path = tmp_path / "data" / "pvisor" / "deep" / "journal.sqlite"
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys\nfrom pvisor.journal.writer import Journal\nJournal.open(sys.argv[1]).close()",
         str(path)],
        capture_output=True, text=True, preexec_fn=_umask_000, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for d in (tmp_path / "data", tmp_path / "data" / "pvisor", path.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, (d, oct(d.stat().st_mode))
    for f in path.parent.iterdir():  # the journal and its -wal and -shm
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, (f, oct(f.stat().st_mode))


@pytest.mark.parametrize(
    "args, written",
    [
        (["journal", "export", "r-modes", "-o", "out/x/e.jsonl"], "out"),
        (["report", "r-modes", "-o", "out/x/r.html"], "out"),
        (["view", "r-modes", "--output", "out/x/v.json"], "out"),
        (
            [
                "replay",
                "--trajectory",
                str(NATIVE),
                "--agent",
                "claude-code",
                "--after-step",
                "1",
                "--prepare-only",
                "--output",
                "out/prefix",
            ],
            "out",
        ),
    ],  # fmt: skip
    ids=["export", "report", "view", "prefix"],
)
def test_output_files_and_their_directories_are_private_under_umask_000(journal, tmp_path, args, written):
    proc = subprocess.run(
        [str(PVISOR), "--journal", str(journal), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=_umask_000,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    modes = _modes(tmp_path / written)
    assert any((tmp_path / rel).is_file() for rel in modes), modes
    _private(modes, tmp_path / written)


def test_an_export_over_a_file_left_by_a_crash_is_still_private(journal, tmp_path):
    """A temporary file of an interrupted export keeps its old mode when opened again: the new
    export is 0600 all the same."""
    (tmp_path / "e.jsonl.tmp").write_bytes(b"half")
    (tmp_path / "e.jsonl.tmp").chmod(0o666)
    proc = subprocess.run(
        [str(PVISOR), "--journal", str(journal), "journal", "export", "r-modes", "-o", "e.jsonl"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=_umask_000,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "e.jsonl").stat().st_mode) == 0o600
