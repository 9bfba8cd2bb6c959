"""Where the journal lives and how its file is created (mode 0600 in a 0700 directory)."""

from __future__ import annotations

import os
from pathlib import Path

JOURNAL_ENV = "PVISOR_JOURNAL"


def data_dir() -> Path:
    """``$XDG_DATA_HOME/pvisor``, or ``~/.local/share/pvisor`` (XDG Base Directory spec)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "pvisor"


def default_journal_path() -> Path:
    """``$PVISOR_JOURNAL`` if set, else ``<data dir>/journal.sqlite``."""
    env = os.environ.get(JOURNAL_ENV)
    return Path(env) if env else data_dir() / "journal.sqlite"


def create_private_file(path: Path) -> bool:
    """Create ``path`` with mode 0600 (its missing parent directories with 0700) unless it exists.

    Returns True when the file was created now. SQLite gives the ``-wal`` and ``-shm`` files the
    mode of the database file, so they are private too.
    """
    path = Path(path)
    parent = path.parent
    if not parent.exists():
        os.makedirs(parent, mode=0o700, exist_ok=True)
        os.chmod(parent, 0o700)  # makedirs' mode is filtered by the umask
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return True
