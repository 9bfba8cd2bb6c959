"""The temporary files of a merge (docs/journal.md "Merging journals"): a new DST is built beside
it as ``.DST.merge-HOST-PID-HEX``, and more sources than one pass attaches go through a staging
journal ``.pvisor-merge-HOST-PID-HEX.sqlite`` in the same directory (each with SQLite's
``-journal``, ``-wal`` and ``-shm``). A merge removes its own when it ends; one killed
(SIGKILL, a power cut) cannot, so every merge into DST first removes those left beside it by a
merge of this host whose process is gone. The host in the name makes that safe on a directory
shared between machines: a pid is looked up only on the host that gave it.

Also the SQLite URI of a path, and the error of a DST directory that cannot be made.
This module imports only the journal package and core.
"""

from __future__ import annotations

import os
import re
import secrets
import socket

from pvisor.core.errors import UsageError

from .writer import pid_alive

#: the files SQLite may make beside a database
SUFFIXES = ("", "-journal", "-wal", "-shm")
#: the temporary name's tail: ``merge-HOST-PID-HEX`` (HOST may hold ``-`` itself)
_TAIL = re.compile(r"merge-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>[0-9]+)-[0-9a-f]{8}(?:\.sqlite)?")


def _host() -> str:
    """This host's name as it goes in a file name (only letters, digits, ``.``, ``_``, ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def temp_path(parent: str, name: str) -> str:
    """A new temporary path in ``parent`` for ``name`` (``DST``'s base name: ``.DST.merge-...``;
    empty: the staging journal ``.pvisor-merge-....sqlite``)."""
    tail = f"merge-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    return os.path.join(parent, f".{name}.{tail}" if name else f".pvisor-{tail}.sqlite")


def remove(path: str) -> None:
    """Remove the temporary database ``path`` and SQLite's files beside it."""
    for suffix in SUFFIXES:
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass


def remove_stale(dst: str) -> list[str]:
    """Remove the temporary files beside ``dst`` that a merge into it (or a staging journal in
    its directory) left when it was killed: this host's, whose pid runs no process. Returns the
    databases removed. A directory that cannot be listed, or a file that cannot be removed, is
    left as it is (the merge goes on)."""
    parent = os.path.dirname(os.path.abspath(dst))
    prefixes = (f".{os.path.basename(dst)}.", ".pvisor-")
    host = _host()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        base = next((name[: -len(x)] for x in SUFFIXES if x and name.endswith(x)), name)
        for prefix in prefixes:
            m = _TAIL.fullmatch(base[len(prefix) :]) if base.startswith(prefix) else None
            # the staging journal's name ends in .sqlite, DST's temporary one does not
            if m is None or m["host"] != host or base.endswith(".sqlite") != (prefix == ".pvisor-"):
                continue
            pid = int(m["pid"])
            if pid == os.getpid() or pid_alive(pid) or os.path.join(parent, base) in removed:
                continue
            try:
                remove(os.path.join(parent, base))
            except OSError:
                continue
            removed.append(os.path.join(parent, base))
    return removed


def uri(path: str, mode: str | None) -> str:
    """An SQLite URI of ``path`` (its real path, ``%``, ``?`` and ``#`` escaped: sqlite.org/uri.html)."""
    real = os.path.realpath(path)
    text = "file:" + real.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    return text + (f"?mode={mode}" if mode else "")


def directory_error(dst: str, parent: str, exc: OSError) -> UsageError:
    """The error of ``dst``'s directory ``parent`` that could not be made: the component of its
    path that is a file, when one is (``File exists`` would say nothing), else why."""
    walk = parent
    while walk and not os.path.lexists(walk):
        walk = os.path.dirname(walk) if os.path.dirname(walk) != walk else ""
    if walk and not os.path.isdir(walk):
        return UsageError(
            f"--into {dst}: {walk} is a file, not a directory: cannot create {dst}'s directory in it"
        )
    return UsageError(f"--into {dst}: cannot create its directory: {exc.strerror}")


def created_at(dst: str) -> str:
    """Where a missing DST is created: ``dst``, or the target of ``dst`` when it is a symbolic
    link to nothing yet (the link is kept and comes to name the new journal). UsageError (exit
    2) for a link whose target's directory does not exist (merge makes no directory through a
    link) or a loop of links."""
    if not os.path.islink(dst):
        return dst
    target = os.path.realpath(dst)
    try:
        os.stat(dst)
    except FileNotFoundError:
        pass
    except OSError as exc:  # ELOOP
        raise UsageError(
            f"--into {dst} is a symbolic link that resolves to no file ({exc.strerror})"
        ) from None
    if not os.path.isdir(os.path.dirname(target)):
        raise UsageError(
            f"--into {dst} is a dangling symbolic link to {target}, whose directory does not exist: "
            "create it, or give --into a path that is not a link"
        )
    return target


__all__ = ["SUFFIXES", "created_at", "directory_error", "remove", "remove_stale", "temp_path", "uri"]
