"""A replay's output directory and the files written into it (docs/replay.md): the three
file names (:data:`PREFIX_FILE`, :data:`REQUEST_FILE`, :data:`RESULT_FILE`), the checks of the
directory before anything runs, its creation, and files written under temporary names and
renamed into place. What the files hold is :mod:`.result`'s.

The directory: :func:`check_output` refuses one inside the workspace, not a directory, or not
empty without ``force`` (unless a failed replay left it, :func:`failed_before`);
:func:`create_output` makes it (mode 0700), :func:`remove_made` takes away what an interrupted
prepare made. Files: :func:`write_temps`, :func:`commit_temps`, :func:`write_file` (an earlier
file is replaced, never written through).

Errors: :class:`~pvisor.replay.errors.ReplayUsageError` ``output_refused``/``bad_path`` (exit 2),
:class:`~pvisor.replay.errors.ReplayOutputError` (exit 74) for a file or directory that cannot be
written.
"""

from __future__ import annotations

import errno
import os

import orjson

from .errors import ReplayOutputError, ReplayUsageError, show_path

#: file names written into the output directory
PREFIX_FILE = "prefix.json"
REQUEST_FILE = "prefix.request.json"
RESULT_FILE = "result.json"
OUTPUT_FILES = (PREFIX_FILE, REQUEST_FILE, RESULT_FILE)


def is_inside(child: str, parent: str) -> bool:
    """Whether the resolved path ``child`` is ``parent`` or under it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def resolve_path(path: str | os.PathLike) -> str:
    """``Path(path).resolve()`` as a string: ``os.path.realpath``, and a symlink loop (which
    realpath leaves as it is, and ``resolve`` finds by a ``stat``) is ReplayUsageError
    ``bad_path`` naming the path, as is a path the system refuses."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as exc:
        raise ReplayUsageError("bad_path", f"{show_path(path)}: cannot be resolved ({_why(exc)})") from None
    try:
        os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReplayUsageError(
                "bad_path", f"{show_path(path)}: cannot be resolved (a symlink loop)"
            ) from None
    except ValueError as exc:
        raise ReplayUsageError("bad_path", f"{show_path(path)}: cannot be resolved ({_why(exc)})") from None
    return real


def _why(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or "a symlink loop"


def check_output(
    output: str | os.PathLike,
    workspace: str | os.PathLike | None,
    force: bool,
    why: str = "prepare-only never writes the workspace",
) -> str:
    """The resolved output directory (a str), or ReplayUsageError ``output_refused`` when it is
    (or is inside) the workspace, is not a directory or lies below a file, or is not empty
    without ``force``."""
    out = resolve_path(output)
    if workspace is not None and is_inside(out, resolve_path(workspace)):
        raise ReplayUsageError(
            "output_refused", f"--output {output} is inside --workspace {workspace}: {why}"
        )
    if not os.path.exists(out):
        # the directories that do not exist yet are made (create_output): one of its parents
        # that is a file is a usage error here, not a failed write later
        there = os.path.dirname(out)
        while there and not os.path.lexists(there) and os.path.dirname(there) != there:
            there = os.path.dirname(there)
        if os.path.lexists(there) and not os.path.isdir(there):
            raise ReplayUsageError(
                "output_refused", f"--output {output}: {show_path(there)} is not a directory"
            )
    elif not os.path.isdir(out):
        raise ReplayUsageError("output_refused", f"--output {output} exists and is not a directory")
    elif not force and os.listdir(out) and not failed_before(out):
        raise ReplayUsageError(
            "output_refused", f"--output {output} is not empty; give --force to write into it"
        )
    return out


def failed_before(out: str | os.PathLike) -> bool:
    """Whether ``out`` holds only what a replay that did not succeed left (its files, a
    ``result.json`` whose status is not ``ok``): a failed replay never blocks its retry."""
    try:
        names = set(os.listdir(out))
        if RESULT_FILE not in names or not names <= set(OUTPUT_FILES):
            return False
        with open(os.path.join(out, RESULT_FILE), "rb") as fh:
            status = orjson.loads(fh.read()).get("status")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(status, str) and status != "ok"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are one file (a hard link, a symlink); False when either cannot
    be looked at (missing, a path the system refuses)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def create_output(out: str | os.PathLike, given: str | os.PathLike) -> None:
    """Create the output directory ``out`` and its missing parents (mode 0700,
    :func:`~pvisor.journal.paths.make_directories`); ReplayOutputError (exit 74) naming
    ``given``, the ``--output`` as the user gave it, when it cannot be."""
    from pvisor.journal.paths import make_directories

    try:
        make_directories(out)
    except OSError as exc:
        raise ReplayOutputError(f"cannot create --output {show_path(given)}: {exc.strerror or exc}") from None


def to_be_made(out: str | os.PathLike) -> list[str]:
    """The directories of ``out`` (itself and its parents) that do not exist yet, outermost
    first: what :func:`create_output` is about to make, and what :func:`remove_made` takes away
    when the prepare is interrupted, even in the middle of making them."""
    missing: list[str] = []
    here = os.path.abspath(out)
    while not os.path.isdir(here) and os.path.dirname(here) != here:
        missing.append(here)
        here = os.path.dirname(here)
    return missing[::-1]


def remove_made(made: list[str]) -> None:
    """Remove the directories of :func:`to_be_made` (``made``) that exist, with what they hold:
    a prepare interrupted (Ctrl-C) before its files were written leaves no empty or partial
    output directory. A directory that was there before is not in ``made`` and stays."""
    if made:
        import shutil

        shutil.rmtree(made[0], ignore_errors=True)


# --------------------------------------------------------------------------- writing files


def write_file(path: str, data: bytes) -> None:
    commit_temps(write_temps([(path, data)]))


def drop_temps(tmps: list[tuple[str, str]]) -> None:
    for tmp, _ in tmps:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_temps(
    files: list[tuple[str, bytes]], tmps: list[tuple[str, str]] | None = None
) -> list[tuple[str, str]]:
    """Write each ``(path, data)`` under a temporary name beside ``path``; returns (and
    appends to ``tmps``) the ``(temporary, path)`` pairs. On an error every temporary file of
    ``tmps`` is removed and ReplayOutputError is raised."""
    tmps = [] if tmps is None else tmps
    for path, data in files:
        where, name = os.path.split(path)
        tmp = os.path.join(where, f".{name}.tmp-{os.getpid()}")
        tmps.append((tmp, path))
        try:
            from pvisor.core.outfile import open_private

            with open_private(tmp) as fh:
                fh.write(data)
        except OSError as exc:
            drop_temps(tmps)
            raise ReplayOutputError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None
    return tmps


def commit_temps(tmps: list[tuple[str, str]]) -> None:
    """Rename every temporary file into place (os.replace: an earlier file, or a symbolic link
    in its place, is replaced, never written through); on an error the temporary files left
    are removed and ReplayOutputError is raised."""
    for i, (tmp, path) in enumerate(tmps):
        try:
            os.replace(tmp, path)
        except OSError as exc:
            drop_temps(tmps[i:])
            raise ReplayOutputError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None
