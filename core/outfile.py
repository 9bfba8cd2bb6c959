"""Writing a command's output file (``journal export -o``, ``report -o``) so that a failure
leaves what was there, without replacing what is not a file.

A regular file (or a path where nothing is yet) is written beside itself as ``PATH.tmp`` and
renamed over it when whole: a full disk or an interrupted export leaves the old file, and no
reader sees half of the new one. A symbolic link is followed: its target is what is written
(renamed over, when it is a regular file), and the link stays. A character or block device, a
FIFO or a socket (``/dev/null``, ``/dev/stdout``, a named pipe a reader waits on) is written in
place: renaming over it would replace the node itself (as root, ``-o /dev/null`` turned
``/dev/null`` into a regular file).

A file written here, or opened with :func:`open_private`, is created with mode 0600 whatever
the umask: a command's output holds prompts and code, private as the journal is.

This module imports nothing of pvisor's (the journal package's rule).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import BinaryIO, Iterator


def in_place(path: str) -> bool:
    """True when ``path`` (after its symbolic links) is something other than a regular file or
    nothing: a device, a FIFO or a socket, written in place."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def open_private(path: str | os.PathLike, mode: str = "wb") -> BinaryIO:
    """``open(path, mode)`` for ``"wb"`` or ``"ab"``, a file it creates having mode 0600 whatever
    the umask (an existing file keeps its own). Raises OSError."""
    if mode not in ("wb", "ab"):
        raise ValueError(f"open_private: mode {mode!r}, expected 'wb' or 'ab'")
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
    return open(os.open(path, flags, 0o600), mode)


@contextlib.contextmanager
def replacing(path: str) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s whole new content into (module docstring). On a clean
    exit the content is in place; on an exception the temporary file is removed, the old content
    stays, and the exception goes on. Raises OSError when the file cannot be opened."""
    target = os.path.realpath(path) if os.path.islink(path) else path
    if in_place(target):
        # O_NONBLOCK: opening a FIFO no process reads would block for ever; it fails instead
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise OSError(exc.errno, "no process reads this FIFO", path) from None
            raise
        os.set_blocking(fd, True)
        with open(fd, "wb") as out:
            yield out
        return
    tmp = f"{target}.tmp"
    out = open_private(tmp)
    try:
        with out:
            os.fchmod(out.fileno(), 0o600)  # a temporary file a crash left keeps its mode: not this one
            yield out
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            if os.path.isfile(tmp):
                os.unlink(tmp)
        raise


__all__ = ["in_place", "open_private", "replacing"]
