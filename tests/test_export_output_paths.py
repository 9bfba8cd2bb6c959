"""Where an export's ``-o FILE`` may go (issue 41 fixes): never over a file the command reads
(the journal, its ``-wal``/``-shm``, through a link; a native source), and one rule for exit
codes: 2 for what is wrong as given (an empty path, a directory, a path below a file), 74 with the
OS's reason for what the OS refuses when writing; ``/dev/stdout`` is written through descriptor 1.
The CLI runs in process (``pvisor.cli.main``) against a journal written by the real writer."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import orjson
import pytest
from agent_helpers import PVISOR
from native_helpers import native_dir

from cli_inprocess import pvisor
from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
CODEX_ROLLOUT = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
REPLY = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}]}'


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-1", agent="mini-swe-agent"))
        j.record_exchange(
            "r-1", "POST", "/v1/chat/completions", [], protocol="openai-chat", status=200,
            request_body=CHAT, response_body=REPLY,
        )  # fmt: skip
    return path


@pytest.mark.parametrize("fmt", ["rows", "jsonl", "parquet", "har"])
@pytest.mark.parametrize("target", ["j.sqlite", "j.sqlite-wal", "j.sqlite-shm", "link"])
def test_an_export_over_the_journal_it_reads_is_refused_before_writing(
    journal, capsysbinary, monkeypatch, fmt, target
):
    monkeypatch.chdir(journal.parent)
    (journal.parent / "link").symlink_to("j.sqlite")
    before = {p.name: p.read_bytes() for p in journal.parent.glob("j.sqlite*")}
    argv = ["--journal", "j.sqlite", "journal", "export", "r-1", "--format", fmt, "-o", target]
    code, out, err = pvisor(capsysbinary, *argv)
    assert code == 2, err
    assert err.count("\n") == 1 and f"--output {target}" in err and str(journal) in err, err
    assert {p.name: p.read_bytes() for p in journal.parent.glob("j.sqlite*")} == before
    assert not list(journal.parent.glob("*.tmp"))


def test_a_report_over_the_journal_is_refused(journal, capsysbinary):
    before = journal.read_bytes()
    code, _, err = pvisor(capsysbinary, "--journal", str(journal), "report", "r-1", "-o", str(journal))
    assert code == 2 and "which this command reads" in err, err
    assert journal.read_bytes() == before


@pytest.mark.parametrize(
    "target, code, says",
    [
        ("", 2, "an empty path"),
        (".", 2, "is a directory"),
        ("afile/x.jsonl", 2, "afile is not a directory"),
        ("/proc/x.json", 74, "No such file or directory"),
        ("/proc/nope/x.json", 74, "No such file or directory"),
        ("/dev/full", 74, "No space left on device"),
    ],
)
def test_an_output_that_cannot_be_written_exits_by_the_documented_rule(
    journal, capsysbinary, monkeypatch, target, code, says
):
    monkeypatch.chdir(journal.parent)
    (journal.parent / "afile").write_text("x")
    got, out, err = pvisor(capsysbinary, "--journal", "j.sqlite", "journal", "export", "r-1", "-o", target)
    assert (got, out) == (code, b""), err
    assert err.startswith("pvisor: error: ") and says in err and err.count("\n") == 1, err


def test_dev_stdout_to_a_pipe_is_written_through_the_descriptor(journal):
    proc = subprocess.run(
        [str(PVISOR), "--journal", str(journal), "journal", "export", "r-1", "-o", "/dev/stdout"],
        capture_output=True, env={**os.environ, "PVISOR_NO_PROGRESS": "1"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(b"{") and b'"r-1"' in proc.stdout


@pytest.mark.parametrize("fmt", ["atif", "rows"])
def test_trajectory_export_writes_o_file_as_stdout_would(capsysbinary, tmp_path, fmt):
    code, whole, err = pvisor(capsysbinary, "trajectory", "export", str(CODEX_ROLLOUT), "--format", fmt)
    assert code == 0, err
    out = tmp_path / "new" / f"x.{fmt}"
    code, printed, err = pvisor(
        capsysbinary, "trajectory", "export", str(CODEX_ROLLOUT), "--format", fmt, "-o", str(out), "--json"
    )
    assert code == 0, err
    assert out.read_bytes() == whole and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700 and not list(out.parent.glob("*.tmp"))
    summary = orjson.loads(printed)
    assert summary["path"] == str(out) and summary["format"] == fmt and summary["count"] >= 1


def test_trajectory_export_over_what_it_reads_is_refused(capsysbinary, journal, tmp_path):
    native = tmp_path / "rollout.jsonl"
    native.write_bytes(CODEX_ROLLOUT.read_bytes())
    before = native.read_bytes()
    code, _, err = pvisor(
        capsysbinary, "trajectory", "export", str(native), "--format", "rows", "-o", str(native)
    )
    assert code == 2 and f"is the file {native}" in err and err.count("\n") == 1, err
    assert native.read_bytes() == before
    wal = f"{journal}-wal"
    argv = [
        "trajectory",
        "export",
        str(native),
        "--format",
        "rows",
        "--profile-from",
        str(journal),
        "-o",
        wal,
    ]
    code, _, err = pvisor(capsysbinary, *argv)
    assert code == 2 and "the wal file of" in err, err
