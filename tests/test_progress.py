"""Progress bars on long work (issue 19): a bar on stderr when stderr is a terminal, nothing when
it is not, none with ``--no-progress`` or ``$PVISOR_NO_PROGRESS``, and stdout the same in every
case. The commands run as a user runs them, with stderr on a real pseudo-terminal
(:func:`pty.openpty`); the library's task rules are checked through its own seam, a sink.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
import threading
from pathlib import Path

import orjson
import pytest
from agent_helpers import capture_scripted
from conftest import corpus_dir
from test_gateway_cli import ENV, PVISOR
from test_report import long_run

from pvisor.core import progress
from pvisor.core.progress import Unit

CODEX = corpus_dir() / "native" / "codex" / "agent-sessions_schema_coverage.jsonl"
#: what click's bar ends with once a task is done (``label [####] 100% ...``)
FULL = re.compile(r"\[#+\]\s+(\d+/\d+\s+)?100%")


class Tty:
    """A command's run with stderr (and, when asked, stdout) on a pseudo-terminal."""

    def __init__(self, stdout: str, terminal: str, returncode: int) -> None:
        self.stdout, self.terminal, self.returncode = stdout, terminal, returncode


def run_on_tty(
    args: list[str], *, stdout_on_tty: bool = False, env: dict | None = None, cwd: Path | None = None
) -> Tty:
    """Run ``pvisor ARGS`` with stderr on a pseudo-terminal of 120 columns; what the terminal
    received is read by a thread as it comes (a full pty would block the command)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [*PVISOR, *args],
        stdin=subprocess.DEVNULL,
        stdout=slave if stdout_on_tty else subprocess.PIPE,
        stderr=slave,
        env=env or ENV,
        cwd=cwd,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every end of the slave side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out = proc.stdout.read() if proc.stdout is not None else b""
    proc.wait(timeout=300)
    reader.join(timeout=30)
    os.close(master)
    return Tty(out.decode(), b"".join(chunks).decode("utf-8", "replace"), proc.returncode)


def plain(args: list[str], env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PVISOR, *args], capture_output=True, text=True, env=env or ENV, cwd=cwd, timeout=300
    )


# --------------------------------------------------------------------------- the library's rules


class Recorder:
    """A sink that keeps what it was told: (label, total, unit, [updates], closed)."""

    def __init__(self) -> None:
        self.bars: list[dict] = []

    def start(self, label: str, total: int, unit: Unit):
        bar = {"label": label, "total": total, "unit": unit, "updates": [], "closed": False}
        self.bars.append(bar)

        class Bar:
            def update(self, n: int) -> None:
                bar["updates"].append(n)

            def close(self) -> None:
                bar["closed"] = True

        return Bar()


def test_a_task_reports_to_the_sink_and_a_nested_one_stays_silent():
    sink = Recorder()
    with progress.listening(sink):
        with progress.task("outer", 3) as outer:
            outer.advance()
            with progress.task("inner", 10, Unit.BYTES) as inner:
                inner.advance(4)
                progress.current().advance(4)  # the innermost task: the silent one
            outer.reach(3)
            outer.advance(5)  # past the total: capped
        assert progress.current().total == 0  # none open: the silent task
    assert [b["label"] for b in sink.bars] == ["outer"]
    assert sink.bars[0]["updates"] == [1, 2]
    assert sink.bars[0]["closed"]


def test_without_a_sink_nothing_is_drawn_and_a_closed_bar_is_closed_on_error():
    with progress.task("alone", 5) as t:
        t.advance(5)
        assert t.done == 0  # silent: it does not even count
    sink = Recorder()
    with pytest.raises(RuntimeError), progress.listening(sink), progress.task("fails", 2):
        raise RuntimeError("cut short")
    assert sink.bars[0]["closed"] and sink.bars[0]["updates"] == []


def test_the_journal_steps_of_a_long_run_report_exchanges_then_steps(tmp_path: Path):
    """The library reports the classification by exchange and the steps one by one, to the end."""
    from pvisor.adapters.journal_trajectory import trajectory_from_journal
    from pvisor.journal.reader import JournalReader

    run = long_run(tmp_path / "j.sqlite", 30)
    sink = Recorder()
    with JournalReader(tmp_path / "j.sqlite") as r, progress.listening(sink):
        traj = trajectory_from_journal(r, run)
    assert len(traj.steps) == 30
    assert [(b["label"], b["total"], sum(b["updates"])) for b in sink.bars] == [
        (f"reading run {run}", 30, 30),
        (f"steps of run {run}", 30, 30),
    ]


# --------------------------------------------------------------------------- the commands


def test_reading_a_native_file_draws_a_bar_on_a_terminal_only(tmp_path: Path):
    """``trajectory show``: the bar counts the file's bytes on a terminal; with stderr a pipe,
    --no-progress or PVISOR_NO_PROGRESS=1 nothing is drawn; stdout is the same every time."""
    args = ["trajectory", "show", str(CODEX)]
    on_tty = run_on_tty(args)
    assert on_tty.returncode == 0, on_tty.terminal
    size = CODEX.stat().st_size
    assert f"reading {CODEX.name}" in on_tty.terminal
    assert FULL.search(on_tty.terminal), on_tty.terminal
    assert f"{size / 1024:.1f} KiB of {size / 1024:.1f} KiB" in on_tty.terminal

    piped = plain(args)
    assert piped.returncode == 0
    assert "reading" not in piped.stderr and "%" not in piped.stderr
    for quiet in (
        run_on_tty([*args, "--no-progress"]),
        run_on_tty(args, env={**ENV, "PVISOR_NO_PROGRESS": "1"}),
    ):
        assert quiet.returncode == 0
        assert "reading" not in quiet.terminal and "100%" not in quiet.terminal, quiet.terminal
        assert quiet.stdout == on_tty.stdout
    assert piped.stdout == on_tty.stdout


def test_an_export_draws_its_steps_bar_only_when_stdout_is_not_the_terminal(tmp_path: Path):
    to_pipe = run_on_tty(["trajectory", "export", str(CODEX), "--format", "atif"])
    assert to_pipe.returncode == 0, to_pipe.terminal
    assert "writing steps" in to_pipe.terminal and FULL.search(to_pipe.terminal.split("writing steps")[-1])
    assert json.loads(to_pipe.stdout)["schema_version"].startswith("ATIF")
    to_tty = run_on_tty(["trajectory", "export", str(CODEX), "--format", "atif"], stdout_on_tty=True)
    assert to_tty.returncode == 0
    assert "reading" in to_tty.terminal  # before the document: drawn
    assert "writing steps" not in to_tty.terminal  # it would be drawn into the document


def test_journal_steps_export_and_report_draw_their_bars(tmp_path: Path):
    journal = tmp_path / "j.sqlite"
    run = long_run(journal, 40)
    steps = run_on_tty(["--journal", str(journal), "journal", "steps", run])
    assert steps.returncode == 0, steps.terminal
    assert f"reading run {run}" in steps.terminal and f"steps of run {run}" in steps.terminal
    assert re.search(r"40/40\s+100%", steps.terminal), steps.terminal
    assert steps.stdout == plain(["--journal", str(journal), "journal", "steps", run]).stdout

    out = tmp_path / "all.jsonl"
    export = run_on_tty(["--journal", str(journal), "journal", "export", run, "-o", str(out)])
    assert export.returncode == 0, export.terminal
    assert "exporting" in export.terminal and re.search(r"40/40\s+100%", export.terminal)
    assert sum(1 for line in out.read_bytes().splitlines() if orjson.loads(line)["type"] == "exchange") == 40
    quiet = run_on_tty(["--journal", str(journal), "journal", "export", run, "-o", str(out), "--no-progress"])
    assert quiet.returncode == 0 and "exporting" not in quiet.terminal

    page = tmp_path / "run.html"
    rep = run_on_tty(["--journal", str(journal), "report", run, "-o", str(page)])
    assert rep.returncode == 0, rep.terminal
    assert f"page of run {run}" in rep.terminal and page.exists()
    assert rep.stdout.strip() == str(page)


@pytest.mark.slow
def test_a_replay_draws_the_requests_served_up_to_the_boundary(tmp_path: Path):
    """A real Claude Code run of three tool calls, replayed to step 2 with stderr on a terminal:
    the bar of the replay reaches request N + 1 = 3 of 3."""
    ws2 = tmp_path / "ws2"
    ws2.mkdir()
    script = {"turns": [
        {"text": "One.", "tool_calls": [{"tool": "@shell", "command": "echo 1 > one.txt"}]},
        {"text": "Two.", "tool_calls": [{"tool": "@shell", "command": "echo 2 > two.txt"}]},
        {"text": "Three.", "tool_calls": [{"tool": "@shell", "command": "echo 3 > three.txt"}]},
        {"text": "Done."},
    ]}  # fmt: skip
    cap = capture_scripted("claude-code", tmp_path, script, "Write three files")
    journal, captured, exe, env = cap.journal, cap.run, cap.exe, cap.env
    rep = run_on_tty(
        ["--journal", str(journal), "replay", "--agent", "claude-code", "--agent-entrypoint", exe,
         "--run", captured, "--after-step", "2", "--replay-only", "--workspace", str(ws2),
         "--output", str(tmp_path / "out")],
        env={**env, "PYTHONSAFEPATH": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert rep.returncode == 0, rep.terminal
    assert "replaying claude-code to step 2" in rep.terminal
    assert re.search(r"3/3\s+100%", rep.terminal), rep.terminal
    assert json.loads((tmp_path / "out" / "result.json").read_text())["status"] == "ok"
