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


def cwd_gone() -> bool:
    """Whether the current working directory no longer exists (deleted while pvisor ran in it,
    or before it started there): relative paths then cannot be resolved."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


#: what a user is told when a relative path meets a deleted working directory
CWD_GONE_HINT = (
    "the current directory no longer exists (was it deleted?); "
    "cd to a directory that exists, or give absolute paths"
)


def absolute(path: str | os.PathLike, what: str) -> str:
    """``os.path.abspath(path)``. Raises UsageError naming ``what`` (``--log-file g.log``) when
    ``path`` is relative and the current directory was deleted, instead of the bare
    FileNotFoundError of ``os.getcwd``."""
    try:
        return os.path.abspath(path)
    except FileNotFoundError:
        from .errors import UsageError

        raise UsageError(f"{what}: a relative path, but {CWD_GONE_HINT}") from None


def run_directory(journal_path: str | os.PathLike, run_id: str) -> Path:
    """``<data dir>/runs/<run id>``, the data dir being the directory holding the journal file:
    where ``pvisor run`` keeps a run's agent output, private home and exports."""
    return Path(absolute(journal_path, f"--journal {journal_path}")).parent / "runs" / run_id
