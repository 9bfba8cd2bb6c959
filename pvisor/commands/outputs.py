"""Checks for the files a command will write (``--log-file``, ``--ready-file``, ``export -o``),
made before anything starts, so that a path that cannot be written is a one-line usage error
(exit 2) and not a traceback halfway through; and the one way a command's ``--output``/``-o``
makes the directories it names that do not exist yet (mode 0700, :func:`make_output_parent`)."""

from __future__ import annotations

import os

from pvisor.core.errors import OutputError, UsageError
from pvisor.journal.paths import absolute, make_directories


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path):
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    return path


def check_output_path(path: str, option: str, *, create_parents: bool = False) -> None:
    """Raise UsageError naming ``option`` and ``path`` when ``path`` cannot be created or
    written: its directory is missing (unless ``create_parents``: then the nearest directory
    that exists must be writable, and :func:`make_output_parent` makes the rest) or not
    writable, a component of it is a file, or it is a directory itself."""
    if os.path.isdir(path):
        raise UsageError(f"cannot write {option} {path}: it is a directory")
    parent = os.path.dirname(absolute(path, f"{option} {path}"))
    if not os.path.isdir(parent):
        if not create_parents:
            if os.path.exists(parent):
                raise UsageError(f"cannot write {option} {path}: {parent} is not a directory")
            raise UsageError(f"cannot write {option} {path}: directory {parent} does not exist")
        there = _nearest_existing(parent)
        if not os.path.isdir(there):
            raise UsageError(f"cannot write {option} {path}: {there} is not a directory")
        if not os.access(there, os.W_OK | os.X_OK):
            raise UsageError(f"cannot write {option} {path}: directory {there} is not writable")
        return
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {option} {path}: permission denied")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {option} {path}: directory {parent} is not writable")


def make_output_parent(path: str, option: str) -> None:
    """Create the directories of the output file ``path`` that do not exist yet (mode 0700), right
    before it is written; OutputError (exit 74) naming ``option`` when one cannot be made."""
    parent = os.path.dirname(absolute(path, f"{option} {path}"))
    try:
        make_directories(parent)
    except OSError as exc:
        raise OutputError(
            f"cannot write {option} {path}: cannot create {parent}: {exc.strerror or exc}"
        ) from None
