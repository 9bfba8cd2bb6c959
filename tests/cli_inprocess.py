"""``pvisor ARGV`` run in the test's own process (``pvisor.cli.main``), for the tests of
commands that start no agent: faster than a subprocess, and its output read through pytest's
``capsysbinary``."""

from __future__ import annotations

from pvisor.cli import main


def pvisor(capsysbinary, *argv: str) -> tuple[int, bytes, str]:
    """``pvisor ARGV`` in this process: (exit code, stdout bytes, stderr text)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsysbinary.readouterr()
    return code, out, err.decode()
