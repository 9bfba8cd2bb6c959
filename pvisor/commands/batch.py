"""``pvisor replay --prepare-only --batch MANIFEST (--output OUT | --rows FILE)``: the command
side of :mod:`pvisor.replay.batch` (docs/result-protocol.md "Many prefixes in one process").

With ``--output OUT`` each manifest line gets ``OUT/<name>/`` with the three files of a single
prepare-only. With ``--rows FILE`` nothing else is written: one row per line, JSON Lines (the
prefix body embedded as it is, a JSON value), or Parquet when FILE ends in ``.parquet``
(pyarrow, the extra ``pvisor-replay[parquet]``; the prefix, request and result as JSON text).
A row: ``line``, ``name``, ``status``, ``agent``, ``after_step``, ``prefix_sha256``,
``prefix``, ``request``, ``result``, ``error`` (``{code, message}`` or null). Each failed line
is one ``pvisor: error: MANIFEST line N: ...`` on stderr; the last line says how many were
prepared, in what time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import click
import orjson

from pvisor.adapters.exports.rows import write_parquet_rows
from pvisor.commands.cells import terminal_safe
from pvisor.core import progress
from pvisor.core.errors import OutputError, PvisorError, UsageError
from pvisor.commands.outputs import refuse_reading, write_export
from pvisor.core.outfile import in_place
from pvisor.journal.paths import default_journal_path, make_directories, require_utf8
from pvisor.replay.batch import (
    ROW_HEAD,
    BatchOutcome,
    Status,
    prepare_many,
    read_manifest,
    request_from,
    row_head,
    text_row,
)
from pvisor.replay.errors import ReplayUsageError, error_code, error_detail, show_path
from pvisor.replay.ray_data import prepare_dataset
from pvisor.replay.output import same_file

#: rows per Parquet row group
PARQUET_BATCH = 512
#: a batch stops when this many lines in a row could not be written (a full disk, a failing device)
MAX_UNWRITTEN = 3


def run_batch(
    manifest: Path,
    *,
    output: Path | None,
    rows: Path | None,
    journal: Path | None,
    force: bool,
    allow_damaged: bool,
    ray_address: str | None = None,
) -> int:
    """Prepare every line of ``manifest``; returns how many failed. ``ray_address``: prepare on
    that Ray cluster (``local`` starts one here) instead of in this process (rows only).
    UsageError (before anything is written) for a manifest that is missing or not a file, an
    ``--output`` that is a file, not empty without ``force``, holds the manifest or cannot be
    created, a ``--rows`` file that is the manifest, exists without ``force`` or whose
    directory is missing, a path that is not UTF-8; OutputError (exit 74) when the rows cannot
    be written. The rows go to a temporary file renamed over ``rows`` when all are written:
    an interrupted or failed batch leaves the earlier file as it was. Ctrl-C: exit 130 with a
    line that says how far the batch got."""
    check_paths(manifest, output, rows, force, journal)
    total = _count_lines(manifest)
    labels: dict[int, str] = {}  # line -> its name, for the rows
    readers_of_rows: list[int] = []  # lines whose source is the rows file: it is not replaced then

    requests = _requests(manifest, journal, output, rows, force, allow_damaged, labels, readers_of_rows)
    t0 = time.perf_counter()
    failed = done = 0
    label = show_path(rows) if rows is not None else None
    outcomes: Iterator[BatchOutcome] = iter(())
    if ray_address is None:
        # its own SourceReads, closed when the lines are done: the journals it kept open too
        outcomes = prepare_many(requests, row_label=label)

    def counted() -> Iterator[BatchOutcome]:
        nonlocal failed, done
        unwritten = 0  # lines in a row whose files could not be written
        for outcome in outcomes:
            done += 1
            unwritten = (
                unwritten + 1 if outcome.error is not None and isinstance(outcome.error, OutputError) else 0
            )
            if unwritten == MAX_UNWRITTEN:  # a full disk fails every line alike: one line says so
                raise OutputError(
                    f"--output {show_path(output)}: {MAX_UNWRITTEN} lines in a row could not be written "
                    f"(line {outcome.index}: {_message(outcome)}); stopped after {done} of {total} lines"
                )
            if outcome.name is None and outcome.index in labels:
                outcome.name = labels[outcome.index]
            if outcome.status is Status.FAILED:
                failed += 1
                _say(f"pvisor: error: {show_path(manifest)} line {outcome.index}: {_message(outcome)}")
            task.reach(done)
            yield outcome

    try:
        with progress.task(f"preparing {show_path(manifest)}", total, progress.Unit.REQUESTS) as task:
            if ray_address is not None:
                outcomes = _on_ray(ray_address, requests, label)  # type: ignore[assignment]
            if rows is None:
                for _ in counted():
                    pass
            else:
                _write_rows(rows, counted(), readers_of_rows)
    except KeyboardInterrupt:
        where = (
            f"{show_path(rows)} is left as it was"
            if rows is not None
            else f"their files are in {show_path(output)}"
        )
        raise BatchInterrupted(
            f"interrupted after {done} of {total} lines of {show_path(manifest)} ({failed} failed): {where}"
        ) from None
    seconds = time.perf_counter() - t0
    where = show_path(rows) if rows is not None else show_path(output)
    per = f", {seconds / done * 1000:.2f} ms each" if done else ""
    _say(
        f"prepared {done - failed} of {done} prefixes from {show_path(manifest)} into {where}"
        f"{f' ({failed} failed)' if failed else ''} in {seconds:.2f} s{per}"
    )
    return failed


def check_paths(
    manifest: Path, output: Path | None, rows: Path | None, force: bool, journal: Path | None = None
) -> None:
    """The UsageErrors of :func:`run_batch`'s paths, before anything is written. ``journal``: the
    journal the batch reads (None: the default journal), which ``rows`` must not be, nor one of
    its SQLite side files (:func:`~pvisor.commands.outputs.refuse_reading`), through links too."""
    for opt, path in (("--batch", manifest), ("--output", output), ("--rows", rows)):
        require_utf8(opt, path)
    if not manifest.is_file():
        what = "no such file" if not manifest.exists() else "not a regular file"
        raise UsageError(f"--batch {show_path(manifest)}: {what}")
    if output is not None:
        if output.exists() and not output.is_dir():
            raise UsageError(f"--output {show_path(output)} exists and is not a directory")
        if output.is_dir() and not force and any(output.iterdir()):
            raise UsageError(f"--output {show_path(output)} is not empty; give --force to write into it")
        if output.resolve() in manifest.resolve().parents:
            raise UsageError(
                f"--output {show_path(output)} holds the manifest: a line's files could replace it"
            )
        probe = output / f".pvisor-batch-{os.getpid()}"
        try:
            make_directories(output)  # what does not exist yet: mode 0700, as every --output
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        except OSError as exc:
            raise UsageError(
                f"--output {show_path(output)}: cannot write into it: {exc.strerror or exc}"
            ) from None
    if rows is not None:
        if rows.exists() and (rows.resolve() == manifest.resolve() or same_file(rows, manifest)):
            raise UsageError(f"--rows {show_path(rows)} is the manifest: choose another file")
        if rows.is_dir():
            raise UsageError(f"--rows {show_path(rows)} is a directory, expected a file to write")
        # a device or a FIFO is written through, never replaced (write_rows): no --force for it
        if rows.exists() and not force and not in_place(str(rows)):
            raise UsageError(f"--rows {show_path(rows)} exists; give --force to replace it")
        if not rows.parent.is_dir():
            raise UsageError(f"--rows {show_path(rows)}: no such directory {show_path(rows.parent)}")
        refuse_reading(str(rows), "--rows", [str(journal or default_journal_path())])


def _requests(
    manifest: Path,
    journal: Path | None,
    output: Path | None,
    rows: Path | None,
    force: bool,
    allow_damaged: bool,
    labels: dict[int, str],
    readers_of_rows: list[int],
) -> Iterator[tuple[int, Any]]:
    """The manifest's lines as (line, :class:`~pvisor.replay.prepare.PrepareOptions`) or
    (line, the line's error), in order; fills ``labels`` (line -> its name) and
    ``readers_of_rows`` (lines whose source is the ``rows`` file) as it goes."""
    names: dict[str, int] = {}  # output directory -> the line that has it
    for n, obj in read_manifest(manifest):
        if isinstance(obj, PvisorError):
            yield n, obj
            continue
        try:
            opts = request_from(obj, n, manifest=manifest, journal=journal, output=output)
        except PvisorError as exc:
            yield n, exc
            continue
        if isinstance(obj.get("name"), str):
            labels[n] = obj["name"]
        if output is not None:  # two lines into one directory: the second would replace the first
            first = names.setdefault(opts.output.name, n)
            if first != n:
                yield n, _bad_line(manifest, n, f"name {opts.output.name!r} is line {first}'s already")
                continue
        if rows is not None:  # the rows file replaces what it names when the batch ends
            for key in ("trajectory", "journal"):
                source = getattr(opts, key)
                if source is not None and reads(rows, source):
                    readers_of_rows.append(n)
                    yield (
                        n,
                        _bad_line(manifest, n, f"{key} is the --rows file, which the batch would replace"),
                    )
                    break
            else:
                source = None
            if source is not None:
                continue
        opts.force = force
        opts.allow_damaged = opts.allow_damaged or allow_damaged
        yield n, opts


class BatchInterrupted(PvisorError):
    """Ctrl-C during a batch: exit 130, and how far it got."""

    exit_code = 130


def _bad_line(manifest: Path, n: int, what: str) -> ReplayUsageError:
    return ReplayUsageError("bad_manifest_line", f"{show_path(manifest)} line {n}: {what}")


def _write_rows(rows: Path, outcomes: Iterator[BatchOutcome], readers: list[int]) -> None:
    """The rows into ``rows`` (:func:`write_rows`), unless a line reads ``rows`` (``readers``,
    filled while the lines are prepared): then the file is kept and UsageError says why no rows
    were written."""

    def write(out: BinaryIO) -> None:
        if rows.suffix.lower() == ".parquet":
            _write_parquet(out, outcomes, rows)
        else:
            for outcome in outcomes:
                out.write(orjson.dumps(row(outcome)) + b"\n")
        if readers:  # raised inside: the temporary file goes, the old one stays
            raise UsageError(
                f"--rows {show_path(rows)} is a source of line {readers[0]}: it is kept, and no rows "
                "were written"
            )

    write_rows(rows, write)


def write_rows(rows: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(out)`` into the ``--rows`` file as an export's ``-o`` is written
    (:func:`~pvisor.commands.outputs.write_export`): a regular file (a symbolic link's target)
    written beside itself and renamed over it when all rows are written, so that an interrupted
    or failed batch leaves the earlier file as it was; a device or a FIFO written through, never
    replaced (as root, a rename over ``/dev/stdout`` replaced the node); stdout's own file through
    descriptor 1. OutputError (exit 74) when it cannot be written."""
    write_export(str(rows), "--rows", write)


def reads(rows: Path, source: str | os.PathLike) -> bool:
    """Whether the ``--rows`` file is ``source``, one of its SQLite side files (``-wal``,
    ``-shm``, ``-journal``) or where the rows are written first, through links too."""
    try:
        refuse_reading(str(rows), "--rows", [str(source)])
    except UsageError:
        return True
    return False


class _RayOutcome:
    """An outcome prepared on Ray: the row's JSON texts as they came back (written as they are)."""

    __slots__ = ("index", "name", "status", "error", "result", "prefix", "_row")

    def __init__(self, row: dict[str, Any]) -> None:
        self._row = row
        self.index = row["line"]
        self.name = row["name"]
        self.status = Status(row["status"])
        self.error = _RayError(row["error_code"], row["error_message"]) if row["error_code"] else None


class _RayError(PvisorError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _on_ray(address: str, requests: Iterator[tuple[int, Any]], label: str | None) -> Iterator[Any]:
    """The outcomes of ``requests`` prepared on the Ray cluster at ``address``, in line order:
    the lines that are no request fail here, the others go to :func:`prepare_dataset` with
    absolute paths (which the workers must see)."""
    from pvisor.session.ray_rollouts import connect

    started = connect(address)  # UsageError without Ray, UnavailableError without a cluster
    import ray  # the optional extra, found by connect

    local: list[Any] = []
    items: list[dict[str, Any]] = []
    for n, opts in requests:
        if isinstance(opts, PvisorError):
            local.append(BatchOutcome(n, None, Status.FAILED, None, None, opts, None))
            continue
        items.append(
            {
                "line": n,
                "agent": opts.agent,
                "after_step": opts.after_step,
                "trajectory": str(opts.trajectory.resolve()) if opts.trajectory is not None else None,
                "run": opts.run,
                "journal": str(opts.journal.resolve()) if opts.journal is not None else None,
                "workspace": str(opts.workspace.resolve()) if opts.workspace is not None else None,
                "protocol": opts.protocol,
                "profile_from": opts.profile_from,
                "session": opts.session,
                "allow_damaged": opts.allow_damaged,
            }
        )
    import ray.data  # the optional extra, found above

    # Ray Data's progress bars and INFO lines would fill stderr, where the lines of failed requests go
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        got: list[Any] = list(local)
        if items:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
            ds = prepare_dataset(
                ray.data.from_items(items), concurrency=min(workers, len(items)), row_label=label or "ray"
            )
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=1024):
                got.extend(_RayOutcome(r) for r in batch.to_pylist())
    finally:
        if started:
            ray.shutdown()
    got.sort(key=lambda o: o.index)
    return iter(got)


def _count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            n += block.count(b"\n")
    return n


def _message(outcome: BatchOutcome) -> str:
    exc = outcome.error
    if exc is None:
        return "failed"
    text = error_detail(exc)
    # a manifest line's own error already names the line
    return text.split(": ", 1)[1] if error_code(exc) == "bad_manifest_line" and ": " in text else text


def _say(line: str) -> None:
    click.echo(terminal_safe(line), err=True)  # a path from the manifest may hold escape sequences


def row(outcome: BatchOutcome) -> dict[str, Any]:
    """The row of one outcome (module docstring); ``prefix`` is the body as an
    :class:`orjson.Fragment` (written as it is, not parsed again)."""
    if isinstance(outcome, _RayOutcome):
        raw = outcome._row
        texts = {
            k: orjson.Fragment(raw[k].encode()) if raw[k] is not None else None for k in ("prefix", "request")
        }
        return {
            **{k: raw[k] for k in ROW_HEAD},
            **texts,
            "result": orjson.loads(raw["result"]) if raw["result"] is not None else None,
            "error": {"code": raw["error_code"], "message": raw["error_message"]}
            if raw["error_code"]
            else None,
        }
    p, exc = outcome.prefix, outcome.error
    return {
        **row_head(outcome),
        "prefix": orjson.Fragment(p.body) if p is not None else None,
        "request": p.request if p is not None else None,
        "result": outcome.result,
        "error": {"code": error_code(exc), "message": error_detail(exc)} if exc is not None else None,
    }


def parquet_schema() -> Any:
    import pyarrow as pa  # an optional extra (pvisor-replay[parquet]), not installed by default

    return pa.schema(
        [
            ("line", pa.int64()),
            ("name", pa.string()),
            ("status", pa.string()),
            ("agent", pa.string()),
            ("after_step", pa.int64()),
            ("prefix_sha256", pa.string()),
            ("prefix", pa.string()),
            ("request", pa.string()),
            ("result", pa.string()),
            ("error", pa.struct([("code", pa.string()), ("message", pa.string())])),
        ]
    )


#: the largest step number a Parquet int64 column holds; a larger one (out of range for every
#: source anyway) is null there, its exact value in the result document's text
INT64_MAX = 2**63 - 1


def _parquet_row(outcome: BatchOutcome) -> dict[str, Any]:
    """The Parquet row of an outcome: its text row (on Ray it came back as one), the error as
    a struct, a step number past int64 as null."""
    flat = dict(outcome._row) if isinstance(outcome, _RayOutcome) else text_row(outcome)
    code, message = flat.pop("error_code"), flat.pop("error_message")
    flat["error"] = {"code": code, "message": message} if code else None
    if isinstance(flat["after_step"], int) and flat["after_step"] > INT64_MAX:
        flat["after_step"] = None
    return flat


def _write_parquet(out: BinaryIO, outcomes: Iterator[BatchOutcome], shown: Path) -> None:
    try:
        import pyarrow  # noqa: F401  (an optional extra that write_parquet_rows uses)
    except ImportError:
        raise UsageError(
            f"--rows {show_path(shown)}: Parquet needs pyarrow: pip install '.[parquet]' in a clone of "
            "pvisor (or a .jsonl file for JSON Lines)"
        ) from None
    write_parquet_rows(out, parquet_schema(), (_parquet_row(o) for o in outcomes), PARQUET_BATCH)


__all__ = ["BatchInterrupted", "check_paths", "parquet_schema", "reads", "row", "run_batch", "write_rows"]
