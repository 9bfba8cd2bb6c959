"""Where the journal lives and how its file is created (mode 0600 in a 0700 directory).

Strings and ``os.path`` on the paths every command takes (the journal's, a source file's):
``pathlib`` brings ``urllib.parse`` and ``ipaddress`` with it, 3.6 ms of a short command's
start on the machine of docs/benchmarks.md; functions that return a :class:`~pathlib.Path`
import it when called."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

JOURNAL_ENV = "PVISOR_JOURNAL"


def plain_path(path: str) -> str:
    """``str(Path(path))`` without pathlib (which the short commands do not load): duplicate
    slashes, ``.`` components and a trailing slash removed, ``..`` kept (it may follow a
    symbolic link), two leading slashes kept as POSIX allows, ``""`` as ``.``. So that
    ``--journal j.sqlite/`` is the journal ``j.sqlite`` and a result names ``./t.jsonl`` as
    ``t.jsonl``, as they did when every path was a Path."""
    root = (
        "//" if path.startswith("//") and not path.startswith("///") else "/" if path.startswith("/") else ""
    )
    parts = [p for p in path.split("/") if p and p != "."]
    return root + "/".join(parts) if root or parts else "."


def not_utf8(value: str | os.PathLike | None) -> str | None:
    """``value`` (a path or id as Python decoded it from the command line or the environment:
    bytes that are not UTF-8 as lone surrogates) with those bytes shown as ``\\xNN`` when it is
    not UTF-8, for a message; None when it is UTF-8 (or None)."""
    if value is None:
        return None
    text = os.fspath(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return None


def require_utf8(option: str, value: str | os.PathLike | None) -> None:
    """Raise UsageError (exit 2) when ``value`` is not UTF-8 (:func:`not_utf8`): it could not be
    stored in the journal nor written as JSON. The message shows those bytes as ``\\xNN``:
    ``--output o\\xff: not valid UTF-8 (file names and ids must be UTF-8)``."""
    shown = not_utf8(value)
    if shown is not None:
        from pvisor.core.errors import UsageError

        raise UsageError(f"{option} {shown}: not valid UTF-8 (file names and ids must be UTF-8)")


def data_dir_name() -> str:
    """``$XDG_DATA_HOME/pvisor``, or ``~/.local/share/pvisor`` (XDG Base Directory spec)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "pvisor")


def data_dir() -> Path:
    """:func:`data_dir_name` as a Path."""
    from pathlib import Path

    return Path(data_dir_name())


def default_journal_name() -> str:
    """``$PVISOR_JOURNAL`` if set, else ``<data dir>/journal.sqlite``."""
    return os.environ.get(JOURNAL_ENV) or os.path.join(data_dir_name(), "journal.sqlite")


def default_journal_path() -> Path:
    """:func:`default_journal_name` as a Path."""
    from pathlib import Path

    return Path(default_journal_name())


def create_private_file(path: str | os.PathLike) -> bool:
    """Create ``path`` with mode 0600 (its missing parent directories with 0700) unless it exists.

    Returns True when the file was created now. SQLite gives the ``-wal`` and ``-shm`` files the
    mode of the database file, so they are private too.
    """
    make_directories(os.path.dirname(os.path.abspath(path)))  # each one 0700, not only the last
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return True


def make_directories(path: str | os.PathLike) -> list[str]:
    """Create the directory ``path`` and its missing parents, each with mode 0700 (a command's
    output may hold prompts and code: private, as the journal's directory is), and return the
    directories created, outermost first ([] when ``path`` is a directory already). Raises
    OSError (``FileExistsError`` when a component is a file; what was made stays)."""
    missing: list[str] = []
    here = os.path.abspath(path)
    while not os.path.isdir(here):
        missing.append(here)
        up = os.path.dirname(here)
        if up == here:
            break
        here = up
    made = []
    for d in reversed(missing):
        os.mkdir(d, 0o700)
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask
        made.append(d)
    return made


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
        from pvisor.core.errors import UsageError

        raise UsageError(f"{what}: a relative path, but {CWD_GONE_HINT}") from None


def runs_directory(journal_path: str | os.PathLike) -> Path:
    """``<data dir>/runs``, the data dir being the directory holding the journal file: the
    directory that holds every run directory."""
    from pathlib import Path

    return Path(absolute(journal_path, f"--journal {journal_path}")).parent / "runs"


def run_directory(journal_path: str | os.PathLike, run_id: str) -> Path:
    """``<data dir>/runs/<run id>`` (:func:`runs_directory`): where ``pvisor run`` keeps a run's
    agent output, private home and exports. Raises IntegrityError (exit 3) when ``run_id`` is
    not a run id (:func:`journal.model.is_run_id`: one name of letters, digits, ``.``, ``_``,
    ``-``, so never ``..`` nor a ``/``): an id read from a damaged or crafted journal
    (``r/../../victim``) never names a directory outside ``runs/``."""
    from .model import is_run_id
    from .redact import redact_shapes

    runs = runs_directory(journal_path)
    # a run id is one path component (no '/', never '.' or '..'): its directory is a child of runs/
    if not is_run_id(run_id) or (runs / run_id).parent != runs:
        from pvisor.core.errors import IntegrityError

        shown = redact_shapes(run_id) if isinstance(run_id, str) else run_id
        raise IntegrityError(
            f"journal {journal_path}: run {shown!r} has an id that is not a run id (letters, digits, "
            "'.', '_' and '-', starting with a letter or digit): the journal is damaged; "
            "no run directory is derived from it"
        )
    return runs / run_id
