"""``pvisor replay --prepare-only --batch MANIFEST (--output OUT | --rows FILE)``: the command
side of :mod:`pvisor.replay.batch` (docs/replay.md "Batch preparation").

With ``--output OUT`` each manifest line gets ``OUT/<name>/`` with the three files of a single
prepare-only. With ``--rows FILE`` nothing else is written: one row per line, JSON Lines (the
prefix body embedded as it is, a JSON value), or Parquet when FILE ends in ``.parquet``
(pyarrow, the extra ``pvisor-sandbox[parquet]``; the prefix, request and result as JSON text).
A row: ``line``, ``name``, ``status``, ``agent``, ``after_step``, ``prefix_sha256``,
``prefix``, ``request``, ``result``, ``error`` (``{code, message}`` or null). Each failed line
is one ``pvisor: error: MANIFEST line N: ...`` on stderr; the last line says how many were
prepared, in what time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import click
import orjson

from pvisor.journal import progress
from pvisor.journal.errors import OutputError, PvisorError, UnavailableError, UsageError
from pvisor.replay.batch import BatchOutcome, SourceReads, Status, prepare_many, read_manifest, request_from
from pvisor.replay.errors import error_code, error_detail, show_path

#: rows per Parquet row group
PARQUET_BATCH = 512


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
    that Ray cluster (``local`` starts one here) instead of in this process (rows only). UsageError for a manifest
    that is missing or not a file, an ``--output`` that is a file or not empty without
    ``force``, a ``--rows`` file that is the manifest or whose directory is missing;
    OutputError (exit 74) when a row cannot be written."""
    if not manifest.is_file():
        what = "no such file" if not manifest.exists() else "not a file"
        raise UsageError(f"--batch {show_path(manifest)}: {what}")
    if output is not None:
        if output.exists() and not output.is_dir():
            raise UsageError(f"--output {show_path(output)} exists and is not a directory")
        if output.is_dir() and not force and any(output.iterdir()):
            raise UsageError(f"--output {show_path(output)} is not empty; give --force to write into it")
    if rows is not None:
        if rows.exists() and rows.resolve() == manifest.resolve():
            raise UsageError(f"--rows {show_path(rows)} is the manifest: choose another file")
        if not rows.parent.is_dir():
            raise UsageError(f"--rows {show_path(rows)}: no such directory {show_path(rows.parent)}")
    total = _count_lines(manifest)

    def requests() -> Iterator[tuple[int, Any]]:
        for n, obj in read_manifest(manifest):
            if isinstance(obj, PvisorError):
                yield n, obj
                continue
            try:
                opts = request_from(obj, n, manifest=manifest, journal=journal, output=output)
            except PvisorError as exc:
                yield n, exc
                continue
            opts.force = force
            opts.allow_damaged = opts.allow_damaged or allow_damaged
            yield n, opts

    t0 = time.perf_counter()
    failed = done = 0
    label = show_path(rows) if rows is not None else None
    outcomes: Iterator[BatchOutcome] = iter(())
    if ray_address is None:
        outcomes = prepare_many(requests(), reads=SourceReads(), row_label=label)
    with progress.task(f"preparing {show_path(manifest)}", total, progress.Unit.REQUESTS) as task:

        def counted() -> Iterator[BatchOutcome]:
            nonlocal failed, done
            for outcome in outcomes:
                done += 1
                if outcome.status is Status.FAILED:
                    failed += 1
                    _say(f"pvisor: error: {show_path(manifest)} line {outcome.index}: {_message(outcome)}")
                task.reach(done)
                yield outcome

        if ray_address is not None:
            outcomes = _on_ray(ray_address, requests(), label)  # type: ignore[assignment]
        if rows is None:
            for _ in counted():
                pass
        elif rows.suffix == ".parquet":
            _write_parquet(rows, counted())
        else:
            _write_jsonl(rows, counted())
    seconds = time.perf_counter() - t0
    where = show_path(rows) if rows is not None else show_path(output)
    per = f", {seconds / done * 1000:.2f} ms each" if done else ""
    _say(
        f"prepared {done - failed} of {done} prefixes from {show_path(manifest)} into {where}"
        f"{f' ({failed} failed)' if failed else ''} in {seconds:.2f} s{per}"
    )
    return failed


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
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'pvisor-sandbox[ray]'") from None
    from pvisor.replay.ray_data import prepare_dataset

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
    import logging

    import ray.data

    # Ray Data's progress bars and INFO lines would fill stderr, where the lines of failed requests go
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray").setLevel(logging.WARNING)
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UnavailableError(f"--ray {address}: cannot connect to Ray: {exc}") from None
    for name in ("ray", "ray.data"):  # after init, which sets its own levels
        logging.getLogger(name).setLevel(logging.ERROR)
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
    click.echo(line, err=True)


def row(outcome: BatchOutcome) -> dict[str, Any]:
    """The row of one outcome (module docstring); ``prefix`` is the body as an
    :class:`orjson.Fragment` (written as it is, not parsed again)."""
    if isinstance(outcome, _RayOutcome):
        raw = outcome._row
        texts = {
            k: orjson.Fragment(raw[k].encode()) if raw[k] is not None else None for k in ("prefix", "request")
        }
        return {
            "line": raw["line"],
            "name": raw["name"],
            "status": raw["status"],
            "agent": raw["agent"],
            "after_step": raw["after_step"],
            "prefix_sha256": raw["prefix_sha256"],
            **texts,
            "result": orjson.loads(raw["result"]) if raw["result"] is not None else None,
            "error": {"code": raw["error_code"], "message": raw["error_message"]}
            if raw["error_code"]
            else None,
        }
    r = outcome.result
    p = outcome.prefix
    exc = outcome.error
    return {
        "line": outcome.index,
        "name": outcome.name,
        "status": outcome.status.value,
        "agent": r["agent"] if r is not None else None,
        "after_step": r["boundary"]["after_step"] if r is not None else None,
        "prefix_sha256": r["prefix"]["sha256"] if r is not None and r["prefix"] is not None else None,
        "prefix": orjson.Fragment(p.body) if p is not None else None,
        "request": p.request if p is not None else None,
        "result": r,
        "error": {"code": error_code(exc), "message": error_detail(exc)} if exc is not None else None,
    }


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "wb")
    except OSError as exc:
        raise UsageError(f"--rows {show_path(path)}: {exc.strerror or exc}") from None


def _write_jsonl(path: Path, outcomes: Iterator[BatchOutcome]) -> None:
    with _open(path) as out:
        for outcome in outcomes:
            try:
                out.write(orjson.dumps(row(outcome)) + b"\n")
            except OSError as exc:
                raise OutputError(f"cannot write --rows {show_path(path)}: {exc.strerror or exc}") from None


def parquet_schema() -> Any:
    import pyarrow as pa

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


def _parquet_row(outcome: BatchOutcome) -> dict[str, Any]:
    if isinstance(outcome, _RayOutcome):
        raw = outcome._row
        flat = {
            k: raw[k] for k in ("line", "name", "status", "agent", "after_step", "prefix_sha256", "prefix")
        }
        flat.update(request=raw["request"], result=raw["result"])
        flat["error"] = (
            {"code": raw["error_code"], "message": raw["error_message"]} if raw["error_code"] else None
        )
        return flat
    flat = row(outcome)
    p = outcome.prefix
    # JSON is UTF-8 (RFC 8259) and every protocol encoder writes it so; bytes that are not
    # (none seen) become U+FFFD here, the JSON Lines rows keep them as they are
    flat["prefix"] = p.body.decode("utf-8", "replace") if p is not None else None
    for key in ("request", "result"):
        flat[key] = orjson.dumps(flat[key]).decode() if flat[key] is not None else None
    return flat


def _write_parquet(path: Path, outcomes: Iterator[BatchOutcome]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(
            f"--rows {show_path(path)}: Parquet needs pyarrow: pip install 'pvisor-sandbox[parquet]' "
            "(or a .jsonl file for JSON Lines)"
        ) from None
    schema = parquet_schema()
    batch: list[dict[str, Any]] = []
    with _open(path) as out, pq.ParquetWriter(out, schema) as writer:
        n = 0
        for outcome in outcomes:
            batch.append(_parquet_row(outcome))
            n += 1
            if len(batch) == PARQUET_BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))


__all__ = ["parquet_schema", "row", "run_batch"]
