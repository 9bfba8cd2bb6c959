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

A file pvisor makes in a directory that someone else may write (a run's directory and the
agent's private home: the agent writes them from inside its sandbox, and they outlive it) is
opened with :func:`create_private`, and read back with :func:`read_regular`: neither follows a
symbolic link, nor blocks on a FIFO, nor reads without bound, so that nothing the agent planted
there makes pvisor write or read elsewhere as the user.

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


def _beneath(path: str | os.PathLike, beneath: str | os.PathLike | None) -> tuple[int, str]:
    """A descriptor of the directory holding ``path`` and the file's name. With ``beneath`` (a
    directory ``path`` lies in, trusted), every directory between them is walked without
    following a link (missing ones made, 0700); without it, ``path``'s directory as it is.
    Raises OSError (ELOOP or ENOTDIR for a link or a file in the way)."""
    path = os.path.abspath(os.fspath(path))
    if beneath is None:
        where, name = os.path.split(path)
        return os.open(where or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
    root = os.path.abspath(os.fspath(beneath))
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if rel in (".", "") or parts[0] == ".." or os.path.isabs(rel):
        raise ValueError(f"{path} is not inside {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                why = "a symbolic link or a file where a directory was expected"
                raise OSError(exc.errno, why, path) from None
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def create_private(path: str | os.PathLike, beneath: str | os.PathLike | None = None) -> BinaryIO:
    """A new, empty file at ``path`` (mode 0600) opened ``"wb"`` (its descriptor readable too:
    :func:`read_back`), never through a link: what is
    there (a file, a symbolic link, a FIFO, a socket) is unlinked first, never followed nor
    truncated; a directory there is refused (IsADirectoryError). ``beneath``: a directory
    ``path`` lies in, from which no link is followed (:func:`_beneath`). Raises OSError."""
    dfd, name = _beneath(path, beneath)
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o600, dir_fd=dfd)
        except FileExistsError:
            if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                raise IsADirectoryError(errno.EISDIR, "a directory is in the way", os.fspath(path)) from None
            os.unlink(name, dir_fd=dfd)
            fd = os.open(name, flags, 0o600, dir_fd=dfd)
    finally:
        os.close(dfd)
    return open(fd, "wb")


def read_back(f: BinaryIO, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of the file ``f`` (one :func:`create_private` opened: what was
    written to it, whatever now lies at its path) and whether there were more."""
    data = os.pread(f.fileno(), limit + 1, 0)
    return data[:limit], len(data) > limit


def read_regular(
    path: str | os.PathLike, limit: int, beneath: str | os.PathLike | None = None
) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of the regular file ``path`` and whether there were more. Opened
    without following a link (no link between ``beneath`` and it either: :func:`_beneath`) and
    without blocking: a symbolic link, a FIFO, a device or a directory raises OSError, as a
    missing file does (FileNotFoundError)."""
    dfd, name = _beneath(path, beneath)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "a symbolic link, not a file", os.fspath(path)) from None
        raise
    finally:
        os.close(dfd)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        data = f.read(limit + 1)
    return data[:limit], len(data) > limit


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


__all__ = ["create_private", "in_place", "open_private", "read_back", "read_regular", "replacing"]
