"""``pvisor ARGV`` run in the test's own process: :func:`pvisor.cli.main` with ``argv``, its
stdout and stderr captured, its exit code returned, and the process left as it found it.

A subprocess of the ``pvisor`` script costs about a quarter of a second of interpreter start and
imports; a short command (``journal ls/show/export/body/verify/sql/rm/vacuum/scrub``, ``trajectory
show/export``, ``view``, ``snapshot ls/restore``, ``replay --prepare-only``) run here costs what
the command does. What only a process shows stays a subprocess: exit codes on signals, start-up and
import checks, the installed script itself, a process that must die, and output at the level of
file descriptors (``>&-``, ``/dev/full``): this capture replaces ``sys.stdout``, not fd 1.

Given ``argv``, :func:`pvisor.cli.main` never ends the process with ``os._exit`` (its fast exit is
for the ``pvisor`` process only: ``_state["entry"]`` is false) and leaves the garbage collector
alone; it always ends with ``SystemExit``, whose code is the exit code.

Isolation: each call runs in the working directory and the environment it is given (``env``, as
``subprocess.run``'s, is the whole environment), with stdin the given bytes (else empty, as
``/dev/null``), and restores afterwards the working directory, the environment, ``sys.stdin``,
``sys.stdout`` and ``sys.stderr``, every signal handler, and :mod:`pvisor.cli`'s module state. A
call that leaves a thread running fails: the next test would share it.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
from dataclasses import dataclass


@dataclass
class Outcome:
    """What a run of the command gave, named as :class:`subprocess.CompletedProcess` names it:
    ``returncode`` (the exit code), ``stdout`` and ``stderr`` (bytes, or str with ``text``)."""

    args: list[str]
    returncode: int
    stdout: bytes | str
    stderr: bytes | str


class _Pipe(io.BytesIO):
    """A BytesIO whose bytes stay readable after its stream is closed (a command may close
    stdout, as a process may close fd 1 before it ends)."""

    def close(self) -> None:
        self.flush()


def _text(data: bytes, errors: str) -> str:
    # as subprocess.run(text=True) reads a pipe: the locale's encoding, universal newlines
    return data.decode(sys.__stdout__.encoding or "utf-8", errors).replace("\r\n", "\n").replace("\r", "\n")


def _stream(buffer: io.BytesIO, like) -> io.TextIOWrapper:
    """A text stream over ``buffer`` with the encoding and error handler the interpreter gives a
    pipe (``like``: the process's original stream), as the ``pvisor`` process would have."""
    return io.TextIOWrapper(
        buffer,
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "strict",
    )


def pvisor_main(
    argv: list[str | bytes | os.PathLike],
    *,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    input: bytes | str | None = None,
    text: bool = False,
    errors: str = "strict",
) -> Outcome:
    """Run ``pvisor ARGV`` in this process. ``argv`` without the program name; a bytes argument
    reaches the command as the ``pvisor`` process would see it (decoded with surrogateescape).
    ``text``: stdout and stderr decoded (``errors``) as ``subprocess.run(text=True)`` does.
    An exception the command does not turn into an exit code propagates (the ``pvisor`` process
    would print its traceback and exit 1)."""
    from pvisor import cli

    args = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else a for a in argv]
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals()}
    threads = set(threading.enumerate())
    saved_state = dict(cli._state)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    data = input.encode() if isinstance(input, str) else (input or b"")
    out, err = _Pipe(), _Pipe()
    code: int
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        cli._state.update(journal=None, entry=False, fast_exit=False)
        # held here too: a wrapper no one holds closes its buffer when it is collected
        streams = (
            _stream(io.BytesIO(data), sys.__stdin__),
            _stream(out, sys.__stdout__),
            _stream(err, sys.__stderr__),
        )
        sys.stdin, sys.stdout, sys.stderr = streams
        try:
            cli.main(args)
            code = 0  # main ends with sys.exit; a return would be a bug the code below shows
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:  # sys.exit("message"): the interpreter prints it and exits 1
                print(exc.code, file=sys.stderr)
                code = 1
        for stream in streams[1:]:
            if not stream.closed:
                stream.flush()
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        cli._state.clear()
        cli._state.update(saved_state)
        os.chdir(saved_cwd)
        if dict(os.environ) != saved_env:
            os.environ.clear()
            os.environ.update(saved_env)
        for signum, handler in handlers.items():
            if signal.getsignal(signum) is not handler and handler is not None:
                signal.signal(signum, handler)
    left = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not left, f"pvisor {' '.join(args)} left threads running: {left}"
    stdout, stderr = out.getvalue(), err.getvalue()
    return Outcome(
        args=["pvisor", *args],
        returncode=code,
        stdout=_text(stdout, errors) if text else stdout,
        stderr=_text(stderr, errors) if text else stderr,
    )
