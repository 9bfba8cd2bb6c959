"""A trajectory given as a stream (``-`` for stdin, a pipe such as ``<(zcat f.jsonl.gz)``, a
FIFO) copied into a temporary file, bounded: adapters read a file twice (its structure, then
each step by offset), which a stream cannot do.

Bounds (docs/native.md, "Reading from a stream"):

- at most ``max_input`` bytes (default :data:`MAX_INPUT_BYTES`, 1 GiB; ``--max-input``): a
  stream that gives more (``yes |``, a runaway producer) stops the command with exit 65, and
  the partial copy is removed, so an endless stream never fills the temporary directory;
- at most ``timeout`` seconds (default :data:`INPUT_TIMEOUT_S`; ``--input-timeout``) without a
  byte: a FIFO no process writes to, or a producer that stalls, stops the command with exit 2
  instead of hanging;
- devices and sockets are refused (exit 2) without being read: ``/dev/zero`` never ends and is
  not a trajectory; a terminal on stdin is refused too (nothing was piped in).

Every error names the input as the user gave it (``-: ...`` for stdin).
"""

from __future__ import annotations

import os
import stat

from pvisor.core.errors import BadInputError, OutputError, UsageError
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

#: the most a stream may give (1 GiB); larger trajectories are read as files
MAX_INPUT_BYTES = 1 << 30
#: seconds a stream may go without giving a byte
INPUT_TIMEOUT_S = 30.0
_CHUNK = 1 << 20

_REFUSED = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _human(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"


def needs_spool(path: Path) -> bool:
    """True when ``path`` is ``-`` or anything but a regular file or a directory."""
    if str(path) == "-":
        return True
    mode = os.stat(path).st_mode
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def spool(path: str | Path, *, max_input: int = MAX_INPUT_BYTES, timeout: float = INPUT_TIMEOUT_S) -> str:
    """Copy the stream ``path`` (``-``: stdin) into a new temporary file and return its path,
    removed when the process exits (steps are read from it as they are iterated). A regular
    file on stdin (``< file``) is copied too, without the size bound (it ends). Raises
    UsageError (exit 2) for a device, a socket, a terminal on stdin or
    ``timeout`` seconds without a byte; BadInputError (65) past ``max_input`` bytes;
    OutputError (74) when the temporary directory cannot take the copy. A partial copy is
    removed before raising."""
    import atexit  # lazily, with tempfile (random, shutil): only a stream needs them
    import tempfile

    shown = "-" if str(path) == "-" else str(path)
    fd, bounded = _open(path, shown)
    tmp_fd, name = tempfile.mkstemp(prefix="pvisor-input-", suffix="" if shown == "-" else _suffix(shown))
    try:
        _copy(fd, tmp_fd, shown, max_input if bounded else None, timeout, os.path.dirname(name))
    except BaseException:
        os.close(tmp_fd)
        os.unlink(name)
        raise
    finally:
        if fd != 0:
            os.close(fd)
    os.close(tmp_fd)
    atexit.register(_remove, name)
    return name


def _suffix(name: str) -> str:
    """``Path(name).suffix``: the last dotted part of the last component, if it has one."""
    base = os.path.basename(name.rstrip("/"))
    dot = base.rfind(".")
    return base[dot:] if 0 < dot < len(base) - 1 else ""


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


def _open(path: Path, shown: str) -> tuple[int, bool]:
    """(fd to read, whether the size bound applies)."""
    if shown == "-":
        fd = 0
        try:
            st = os.fstat(fd)
        except OSError:
            raise UsageError(
                "-: standard input is closed; pipe or redirect a trajectory file into it"
            ) from None
        if os.isatty(fd):
            raise UsageError("-: standard input is a terminal; pipe or redirect a trajectory file into it")
    else:
        st = os.stat(path)
        fd = -1
    kind = _REFUSED.get(stat.S_IFMT(st.st_mode))
    if kind is not None:
        what = "standard input is" if shown == "-" else "is"
        raise UsageError(f"{shown}: {what} {kind}, not a trajectory file; give a file, or pipe one through -")
    if fd == -1:
        # O_NONBLOCK: opening a FIFO no process has open for writing would block here, before
        # the timeout below could apply
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    return fd, not stat.S_ISREG(st.st_mode)


def _copy(fd: int, out: int, shown: str, max_input: int | None, timeout: float, tmp_dir: str) -> None:
    import select  # here: only a pipe is copied; every read of a native file imports this module

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    total = 0
    while True:
        if not poller.poll(timeout * 1000):
            raise UsageError(
                f"{shown}: no data for {timeout:g} s (is a process writing to it?); "
                "--input-timeout S waits longer"
            )
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            continue  # woken with nothing to read yet
        if not chunk:
            return
        total += len(chunk)
        if max_input is not None and total > max_input:
            raise BadInputError(
                f"{shown}: the stream gave more than {_human(max_input)} (--max-input); "
                "raise --max-input, or give the trajectory as a file"
            )
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
        except OSError as exc:
            raise OutputError(
                f"{shown}: cannot copy the stream to a temporary file in {tmp_dir}: {exc.strerror or exc} "
                "(set TMPDIR to a directory with room, or give the trajectory as a file)"
            ) from None
