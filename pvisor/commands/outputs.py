"""Checks for the files a command will write (``--log-file``, ``--ready-file``, ``export -o``),
made before anything starts, so that a path that cannot be written is a one-line usage error
(exit 2) and not a traceback halfway through."""

from __future__ import annotations

import os

from pvisor.journal.errors import UsageError
from pvisor.journal.paths import absolute


def check_output_path(path: str, option: str) -> None:
    """Raise UsageError naming ``option`` and ``path`` when ``path`` cannot be created or
    written: its directory is missing or not writable, or it is a directory itself."""
    if os.path.isdir(path):
        raise UsageError(f"cannot write {option} {path}: it is a directory")
    parent = os.path.dirname(absolute(path, f"{option} {path}"))
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {option} {path}: directory {parent} does not exist")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {option} {path}: permission denied")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {option} {path}: directory {parent} is not writable")
