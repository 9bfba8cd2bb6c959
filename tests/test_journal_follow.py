"""``pvisor journal show RUN --follow`` (issue 20): the real command reading a journal that the
real writer of this process fills while it runs. Each exchange must be printed before the next
one is written (read line by line from the command's pipe), in the order they finish, and the
command must end on its own when the run's attempts have ended."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pvisor.journal.model import Attempt, Run
from pvisor.journal.writer import Journal

PVISOR = [sys.executable, "-m", "pvisor"]
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
LINE_TIMEOUT_S = 30  # generous on a loaded machine; a line normally comes within the poll (0.2 s)


def follow(journal: Path, run: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*PVISOR, "--journal", str(journal), "journal", "show", run, "--follow", *args],
        # unbuffered: a buffered reader's readline can take two lines off the pipe at once, and
        # the selector of next_line then waits on an empty pipe for the line already read
        bufsize=0,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )


def next_line(proc: subprocess.Popen) -> bytes:
    """The command's next line of output; fails when none comes within LINE_TIMEOUT_S."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(LINE_TIMEOUT_S):
        proc.kill()
        pytest.fail(f"no line from show --follow within {LINE_TIMEOUT_S} s: {proc.stderr.read()!r}")
    return proc.stdout.readline()


def exchange(j: Journal, run: str, path: str) -> str:
    return j.record_exchange(run, "POST", path, [], protocol="openai-chat", status=200, request_body=b"{}")


def test_follow_prints_each_exchange_as_it_finishes_and_ends_with_the_run(tmp_path: Path):
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-follow", agent="codex"))
        j.start_attempt(Attempt(run="r-follow", n=1))
        first = exchange(j, "r-follow", "/v1/one")
        j.flush()
        proc = follow(path, "r-fol", "--json")
        try:
            assert json.loads(next_line(proc))["id"] == first  # what was there before it started
            pending = j.begin_exchange("r-follow", "POST", "/v1/slow", [], protocol="openai-chat")
            j.flush()
            fast = exchange(j, "r-follow", "/v1/fast")
            j.flush()
            got = json.loads(next_line(proc))
            assert (got["id"], got["path"], got["outcome"]) == (fast, "/v1/fast", "ok")  # finished first
            j.finish_exchange(pending, status=200, request_body=b"{}", response_body=b'{"ok": 1}')
            j.flush()
            got = json.loads(next_line(proc))
            assert (got["id"], got["path"], got["bytes_received"]) == (pending.id, "/v1/slow", 9)
            assert proc.poll() is None  # the attempt has not ended: it keeps following
            j.end_attempt("r-follow", 1, 0)
            j.flush()
            assert proc.wait(timeout=LINE_TIMEOUT_S) == 0
            assert proc.stdout.read() == b"" and proc.stderr.read() == b""
        finally:
            proc.kill()
            proc.wait()


def test_follow_of_an_ended_run_prints_it_and_stops_and_bad_input_gets_one_line(tmp_path: Path):
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-done", agent="codex"))
        j.start_attempt(Attempt(run="r-done", n=1))
        ids = [exchange(j, "r-done", f"/v1/{i}") for i in range(3)]
        j.end_attempt("r-done", 1, 0)
    proc = subprocess.run(
        [*PVISOR, "--journal", str(path), "journal", "show", "r-done", "-f"],
        capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("run r-done  agent=codex") and lines[1].startswith("SEQ  EXCHANGE")
    assert [line.split()[1] for line in lines[2:5]] == ids and lines[5] == "run r-done is over"
    bad = subprocess.run(
        [*PVISOR, "--journal", str(path), "journal", "show", "r-nope", "--follow"],
        capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "no run 'r-nope'" in bad.stderr and bad.stderr.count("\n") == 1


def test_ctrl_c_ends_a_follow_of_a_gateway_capture_quietly(tmp_path: Path):
    """A run the gateway captures on its own has no attempts: it is followed until Ctrl-C."""
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-gw"))
        exchange(j, "r-gw", "/v1/messages")
    proc = follow(path, "r-gw")
    try:
        assert next_line(proc).startswith(b"run r-gw")
        next_line(proc)  # the columns
        assert b"/v1/messages" in next_line(proc)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=LINE_TIMEOUT_S) == 0
        assert b"Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_a_follow_ends_when_its_run_is_removed(tmp_path: Path):
    """``journal rm`` of the followed run (its attempt never ended) ends the follow with a line
    saying so, instead of waiting for an end that cannot come."""
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-gone", agent="codex"))
        j.start_attempt(Attempt(run="r-gone", n=1))
        exchange(j, "r-gone", "/v1/one")
        j.flush()
        proc = follow(path, "r-gone", "--json")
        try:
            assert json.loads(next_line(proc))["path"] == "/v1/one"
            rm = subprocess.run(
                [*PVISOR, "--journal", str(path), "journal", "rm", "r-gone", "--force"],
                capture_output=True, text=True, env=ENV, timeout=60,
            )  # fmt: skip
            assert rm.returncode == 0, rm.stderr
            assert proc.wait(timeout=LINE_TIMEOUT_S) == 0
            assert proc.stderr.read() == b"pvisor: run r-gone was removed from the journal while followed\n"
        finally:
            proc.kill()
            proc.wait()
