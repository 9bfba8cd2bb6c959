"""tests/cli_helpers.py's ``pvisor_main``, which the tests that read pvisor's output use instead of
a subprocess: the command runs in the working directory and environment it is given, its output
comes back byte for byte with its exit code, and the test process is left as it was (working
directory, environment, std streams, signal handlers, pvisor.cli's module state)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from cli_helpers import pvisor_main

from pvisor import cli
from pvisor.journal.model import Run
from pvisor.journal.writer import Journal


def _journal(path: Path) -> str:
    with Journal.open(path) as j:
        j.create_run(Run(id="r-helper0001", agent="codex"))
        return j.record_exchange(
            "r-helper0001", "POST", "/v1/responses", [], protocol="openai-responses", status=200,
            request_body=b"\xff\xfe binary", response_body=b"{}",
        )  # fmt: skip


def test_the_command_runs_where_and_with_what_it_is_given_and_the_process_is_left_as_it_was(tmp_path):
    _journal(tmp_path / "rel.sqlite")
    before = (os.getcwd(), dict(os.environ), sys.stdin, sys.stdout, sys.stderr, dict(cli._state))
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals()}
    # a relative --journal found in cwd; $PVISOR_JOURNAL of env only
    env = {k: v for k, v in os.environ.items() if k != "PVISOR_JOURNAL"}
    by_cwd = pvisor_main(["--journal", "rel.sqlite", "journal", "ls", "--json"], cwd=tmp_path, env=env)
    by_env = pvisor_main(
        ["journal", "ls", "--json"], cwd=tmp_path, env={**env, "PVISOR_JOURNAL": "rel.sqlite"}
    )
    assert by_cwd.returncode == by_env.returncode == 0, (by_cwd.stderr, by_env.stderr)
    assert b"r-helper0001" in by_cwd.stdout and by_cwd.stdout == by_env.stdout
    # journal sql sets a SIGINT handler while its query runs: it is the test's again after
    assert (
        pvisor_main(["--journal", str(tmp_path / "rel.sqlite"), "journal", "sql", "SELECT 1"]).returncode == 0
    )
    assert (os.getcwd(), dict(os.environ), sys.stdin, sys.stdout, sys.stderr, dict(cli._state)) == before
    assert {s: signal.getsignal(s) for s in signal.valid_signals()} == handlers


def test_output_is_bytes_exact_and_the_exit_code_is_the_commands(tmp_path):
    journal = tmp_path / "j.sqlite"
    exchange = _journal(journal)
    body = pvisor_main(["--journal", str(journal), "journal", "body", exchange, "--request"])
    assert (body.returncode, body.stdout, body.stderr) == (0, b"\xff\xfe binary", b"")
    missing = pvisor_main(["--journal", str(journal), "journal", "show", "r-nope"], text=True)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith("pvisor: error: ") and missing.stderr.count("\n") == 1
    usage = pvisor_main(["journal", "ls", "--no-such-option"], text=True)
    assert usage.returncode == 2 and "--no-such-option" in usage.stderr
    assert pvisor_main(["--help"], text=True).stdout.startswith("Usage: pvisor")
    # stdin is what the call gives, else empty (as /dev/null)
    empty = pvisor_main(["--journal", str(journal), "journal", "scrub", "-"], text=True)
    assert empty.returncode == 2 and "stdin was empty" in empty.stderr
