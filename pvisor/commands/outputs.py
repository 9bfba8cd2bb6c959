"""Checks for the files a command will write (``--log-file``, ``--ready-file``, ``export -o``),
made before anything starts, so that a path that cannot be written is a one-line usage error
(exit 2) and not a traceback halfway through; and the one way a command's ``--output``/``-o``
makes the directories it names that do not exist yet (mode 0700, :func:`make_output_parent`)."""

from __future__ import annotations

import os
import sys
from typing import BinaryIO, Callable, TypeVar

from pvisor.core.errors import OutputError, UsageError
from pvisor.journal.paths import absolute, make_directories

T = TypeVar("T")


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


# the files SQLite keeps beside a database: writing over one of them loses the database too
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def refuse_reading(output: str, option: str, sources: list[str]) -> None:
    """UsageError (exit 2) when the file ``output`` names (after symbolic links) is one a command
    reads: one of ``sources``, or a SQLite file beside one (``-wal``, ``-shm``, ``-journal``),
    or where ``output`` would be written first (``FILE.tmp``). Checked before anything is
    written: an export written over the journal it reads would replace every run with it."""
    out = os.path.realpath(output)
    written = (out, out + ".tmp")
    for source in sources:
        base = os.path.realpath(source)
        for side in SQLITE_SIDE_FILES:
            there = base + side
            same = there in written
            if not same and os.path.exists(there) and os.path.exists(out):
                same = os.path.samefile(there, out)
            if same:
                raise UsageError(
                    f"{option} {output} is {'the file' if not side else 'the ' + side[1:] + ' file of'} "
                    f"{source}, which this command reads: give another FILE"
                )


def check_export_path(output: str, option: str) -> None:
    """UsageError (exit 2) for an ``-o`` FILE that is wrong as given, before anything is read:
    empty, a directory, or below something that is not a directory (``afile/x.jsonl``). What the
    OS refuses only when asked (a directory not writable, a read-only or full file system,
    ``/proc``) is exit 74 when writing (:func:`write_export`), with the OS's reason."""
    if output == "":
        raise UsageError(f"{option} '': an empty path; give a FILE, or - for stdout")
    if os.path.isdir(output):
        raise UsageError(f"cannot write {option} {output}: it is a directory")
    there = _nearest_existing(os.path.dirname(absolute(output, f"{option} {output}")))
    if not os.path.isdir(there):
        raise UsageError(f"cannot write {option} {output}: {there} is not a directory")


def is_stdout(output: str) -> bool:
    """True when ``output`` is the file already open as stdout (``/dev/stdout``, ``/dev/fd/1``,
    or the file stdout is redirected to): written through descriptor 1, never renamed over (a
    pipe or a socket has no path to rename to)."""
    try:
        a, b = os.stat(output), os.fstat(1)
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_export(output: str, option: str, write: Callable[[BinaryIO], T]) -> T:
    """``write(out)`` into the file ``output`` (checked by :func:`check_export_path`): its missing
    directories made (0700), then written as ``FILE.tmp`` (mode 0600) and renamed over ``FILE``
    when whole (core/outfile.py; a device or a FIFO written in place; stdout's own file through
    descriptor 1). OutputError (exit 74) naming ``option``, ``output`` and the OS's reason when
    it cannot be created or written."""
    from pvisor.core.outfile import replacing

    if is_stdout(output):
        sys.stdout.flush()
        result = write(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return result
    from pvisor.core.outfile import in_place

    make_output_parent(output, option)
    # a file is written beside itself and renamed when whole: a failure leaves what was there
    left = "" if in_place(output) else "; nothing was written"
    try:
        with replacing(output) as f:
            return write(f)
    except OSError as exc:
        raise OutputError(f"cannot write {option} {output}: {exc.strerror or exc}{left}") from None


def written_summary(output: str, fmt: str, unit: str, count: int, as_json: bool) -> None:
    """What an export to ``-o FILE`` says once written: ``wrote N <unit> to FILE`` on stderr, or
    with ``--json`` the summary ``{path, format, count, unit}`` on stdout (``lines`` too when the
    unit is lines, as before the other formats came)."""
    import click

    from pvisor.commands.base import one_line
    from pvisor.commands.cells import counted
    from pvisor.commands.reading import emit_json

    if as_json:
        summary: dict = {"path": output, "format": fmt, "count": count, "unit": unit}
        if unit == "lines":
            summary["lines"] = count
        emit_json(summary)
    else:
        singular = {"entries": "entry"}.get(unit, unit[:-1])
        click.echo(f"wrote {counted(count, singular, unit)} to {one_line(output)}", err=True)
