"""``pvisor replay --batch MANIFEST (--output OUT | --rows FILE) [--concurrency K]`` without
``--prepare-only``: rollouts from a manifest (:mod:`pvisor.replay.rollout_manifest`,
:mod:`pvisor.session.rollouts`; docs/result-protocol.md "Rollouts from a manifest").

With ``--output OUT`` each line gets ``OUT/<name>/`` with the files a single replay writes.
With ``--rows FILE`` one row per line, JSON Lines, or Parquet when FILE ends in ``.parquet``
(the result as JSON text): ``line``, ``name``, ``mode``, ``status``, ``agent``, ``to_agent``,
``after_step``, ``derived_run``, ``ended_by``, ``live_steps``, ``workspace``, ``result``,
``error`` (``{code, message}`` or null); the replays' own files then go to a temporary
directory, removed at the end, and each path into it in a row's ``result`` is null
(:func:`not_kept`). Each failed line is one ``pvisor: error: MANIFEST line N: ...``
on stderr; the last line says how many rollouts were ok, in what time.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import click
import orjson

from pvisor.adapters.exports.rows import write_parquet_rows
from pvisor.commands.batch import BatchInterrupted, check_paths, write_rows
from pvisor.commands.cells import terminal_safe
from pvisor.commands.outputs import refuse_reading
from pvisor.core import progress
from pvisor.core.errors import PvisorError, UsageError
from pvisor.replay.errors import show_path
from pvisor.replay.rollout_manifest import RolloutLine, RolloutMode, bad_line, overlap, read_rollouts
from pvisor.session.rollouts import RolloutRow, check_concurrency, failed_row, run_rollouts

#: rows per Parquet row group
PARQUET_BATCH = 64


def run_rollout_batch(
    manifest: Path,
    *,
    output: Path | None,
    rows: Path | None,
    journal: Path | None,
    force: bool,
    default_mode: RolloutMode,
    concurrency: int,
    ray_address: str | None = None,
) -> int:
    """Run every line of ``manifest`` (``default_mode`` for a line without ``mode``); returns
    how many failed. ``journal``: the journal of the ``run`` lines that name none (None: the
    default journal). ``ray_address``: on that Ray cluster (:mod:`pvisor.session.ray_rollouts`)
    instead of here. UsageError (before anything runs) for the paths as the prepare-only batch
    refuses them (:func:`~pvisor.commands.batch.check_paths`); OutputError (exit 74) when the
    rows cannot be written. Ctrl-C, SIGTERM, SIGHUP: the rollouts running are stopped (their
    agents too), and exit 130, 143, 129 with a line saying how far the batch got."""
    if ray_address is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # before anything is written
            raise UsageError("--ray needs Ray: pip install '.[ray]' in a clone of pvisor (docs/install.md)")
    else:
        check_concurrency(concurrency)
    if journal is None:
        from pvisor.journal.paths import default_journal_path

        journal = default_journal_path()
    check_paths(manifest, output, rows, force, journal)
    read = list(read_rollouts(manifest, journal=journal, default_mode=default_mode))
    if output is not None:
        read = _apart_from_outputs(read, output, manifest)
    lines = [ln for _, ln in read if isinstance(ln, RolloutLine)]
    refuse_writing_sources(journal, lines, output, rows)
    if force:  # into a non-empty OUT/<name>/, as a single replay's --force
        lines = [_forced(ln) for ln in lines]
    bad = {n: failed_row(None, n, exc) for n, exc in read if isinstance(exc, PvisorError)}
    root = output if output is not None else Path(tempfile.mkdtemp(prefix="pvisor-rollouts-"))
    t0 = time.perf_counter()
    failed = done = 0
    stopping = _StopSignals()  # SIGTERM and SIGHUP stop the batch as Ctrl-C does
    stopped: list[RolloutRow] = []  # on Ray: the rollouts stopped, as they were brought back
    produced = _rows(lines, journal, root, concurrency, ray_address, stopped)
    try:
        with progress.task(f"rollouts of {show_path(manifest)}", len(read), progress.Unit.REQUESTS) as task:

            def counted() -> Iterator[RolloutRow]:
                nonlocal failed, done
                for row in _in_order(bad, produced):
                    done += 1
                    if not row.ok:
                        failed += 1
                        _say(f"pvisor: error: {show_path(manifest)} line {row.line}: {_message(row)}")
                    task.reach(done)
                    if output is None and row.result is not None:
                        row.result = not_kept(row.result, root)
                    yield row

            if rows is None:
                for _ in counted():
                    pass
            else:
                _write_rows(rows, counted())
    except KeyboardInterrupt as exc:
        _close(produced)  # the rollouts running stopped now: on Ray their runs come back meanwhile
        where = (
            f"{show_path(rows)} is left as it was"
            if rows is not None
            else f"their files are in {show_path(root)}"
        )
        # Ray raises a KeyboardInterrupt of its own for the one our handler raised in its wait
        signum = getattr(exc, "signum", None) or stopping.signum or signal.SIGINT
        by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
        raise BatchInterrupted(
            f"interrupted{by} after {done} of {len(read)} rollouts of {show_path(manifest)} "
            f"({failed} failed): {where}{kept_runs(stopped, journal)}",
            exit_code=128 + signum,
        ) from None
    finally:
        # the workers stopped now, wherever the signal came: a generator left suspended would
        # stop them only when collected (the interruption's traceback holds it)
        _close(produced)
        stopping.restore()
        if output is None:
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.perf_counter() - t0
    where = show_path(rows) if rows is not None else show_path(output)
    _say(
        f"{done - failed} of {done} rollouts ok from {show_path(manifest)} into {where}"
        f"{f' ({failed} failed)' if failed else ''} in {seconds:.1f} s"
    )
    return failed


def refuse_writing_sources(
    journal: Path, lines: list[RolloutLine], output: Path | None, rows: Path | None
) -> None:
    """UsageError (exit 2, before anything runs) when the batch would write over a file it reads:
    the ``rows`` file is the journal in use, one of its SQLite side files (``-wal``, ``-shm``),
    or a line's journal, trajectory or key_file, through links too (with ``--force`` the rows
    were renamed over the journal); or such a file lies in the ``OUT/<name>`` of a line, where
    its rollout's files are written."""
    sources = [(str(journal), None)] + [
        (str(p), ln) for ln in lines for p in (ln.journal, ln.trajectory, ln.key_file) if p is not None
    ]
    if rows is not None:
        refuse_reading(str(rows), "--rows", list(dict.fromkeys(src for src, _ in sources)))
    if output is None:
        return
    out = Path(os.path.realpath(output))
    for src, ln in sources:
        real = Path(os.path.realpath(src))
        for dest in lines:
            if (out / dest.name) in real.parents:
                reader = f"line {ln.index}'s" if ln is not None else "the journal in use,"
                raise UsageError(
                    f"--output {show_path(output)}: line {dest.index}'s directory {dest.name} holds "
                    f"{show_path(Path(src))}, {reader} which the batch reads: give another OUT"
                )


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP to the batch: stopped as by Ctrl-C, its exit code 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """SIGTERM and SIGHUP raise :class:`_Signalled` in the main thread while the batch runs (the
    first one; a later one is ignored, as the workers are being stopped); :meth:`restore` puts
    the previous handlers back. Without it the batch ended at once and its workers ran on."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        import threading

        self.previous: dict[int, Any] = {}
        self.signum: int | None = None  # the one that came
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._raise) for sig in self.SIGNALS}

    def _raise(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        for sig in self.previous:
            signal.signal(sig, signal.SIG_IGN)
        raise _Signalled(signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


def _close(produced: Iterator[RolloutRow]) -> None:
    """Stop ``produced`` (idempotent); a second Ctrl-C meanwhile ends only the wait it was in."""
    try:
        getattr(produced, "close", lambda: None)()
    except KeyboardInterrupt:
        getattr(produced, "close", lambda: None)()


def kept_runs(stopped: list[RolloutRow], journal: Path) -> str:
    """What the interruption's line adds for the rollouts stopped on Ray (``stopped``): the
    derived runs brought back into the journal (each line's own, else ``journal``), and the
    lines whose runs were not (killed: their rows say where their worker's private root is)."""
    from pvisor.session.ray_rollouts import KILLED

    if not stopped:
        return ""
    kept = [r.derived_run for r in stopped if r.derived_run is not None]
    lost = [r for r in stopped if (r.error_message or "").startswith(KILLED)]
    text = f"; {len(stopped)} rollout{'s' if len(stopped) != 1 else ''} still out stopped"
    if kept:
        text += f", the interrupted runs kept in {show_path(journal)} ({', '.join(kept)})"
    if lost:
        where = (lost[0].error_message or "").removeprefix(KILLED).strip()
        lines = ", ".join(str(r.line) for r in lost)
        text += f"; not brought back (killed after 30 s): line{'s' if len(lost) > 1 else ''} {lines} {where}"
    return text


def _apart_from_outputs(
    read: list[tuple[int, RolloutLine | PvisorError]], output: Path, manifest: Path
) -> list[tuple[int, RolloutLine | PvisorError]]:
    """``read`` with each line whose workspace is, lies in or holds a line's ``OUT/<name>``
    (where that rollout's files are written while the agent works) failed as a
    ``bad_manifest_line`` naming that line."""
    outs = [
        (output / ln.name, f"line {ln.index}'s output directory")
        for _, ln in read
        if isinstance(ln, RolloutLine)
    ]
    checked: list[tuple[int, RolloutLine | PvisorError]] = []
    for n, ln in read:
        if isinstance(ln, RolloutLine) and ln.workspace is not None:
            shared = overlap(ln.workspace, outs)
            if shared is not None:
                ln = bad_line(manifest, n, f"workspace {show_path(ln.workspace)} {shared}")
        checked.append((n, ln))
    return checked


def not_kept(doc: Any, root: Path) -> Any:
    """``doc`` (a result document, or a part of it) with each path into ``root`` (the temporary
    directory of the replays' own files under ``--rows``, removed at the end) null: a row never
    names a file that is gone."""
    if isinstance(doc, dict):
        return {k: not_kept(v, root) for k, v in doc.items()}
    if isinstance(doc, list):
        return [not_kept(v, root) for v in doc]
    if isinstance(doc, str) and (doc == str(root) or doc.startswith(str(root) + os.sep)):
        return None
    return doc


def _forced(line: RolloutLine) -> RolloutLine:
    import dataclasses

    return dataclasses.replace(line, options={**line.options, "force": True})


def _rows(
    lines: list[RolloutLine],
    journal: Path,
    root: Path,
    concurrency: int,
    ray_address: str | None,
    stopped: list[RolloutRow],
) -> Iterator[RolloutRow]:
    """The rows of ``lines``: here (:func:`run_rollouts`), in line order, or on Ray
    (:func:`~pvisor.session.ray_rollouts.rollouts_on_ray`), in the order they end."""
    if not lines:
        return iter(())
    if ray_address is None:
        return run_rollouts(lines, journal=journal, output_root=root, concurrency=concurrency)
    from pvisor.session.ray_rollouts import rollouts_on_ray  # Ray itself: imported when it runs

    # in the order they end (each names its line): one slow rollout holds none of the others back
    return rollouts_on_ray(ray_address, lines, journal=journal, output_root=root, stopped=stopped)


def _in_order(bad: dict[int, RolloutRow], rows: Iterator[RolloutRow]) -> Iterator[RolloutRow]:
    """The rows of the bad lines (``bad``, by line) merged into ``rows`` by line number."""
    pending = sorted(bad)
    for row in rows:
        while pending and pending[0] < row.line:
            yield bad[pending.pop(0)]
        yield row
    for n in pending:
        yield bad[n]


def _message(row: RolloutRow) -> str:
    text = row.error_message or row.status
    # a manifest line's own error already names the line
    return text.split(": ", 1)[1] if row.error_code == "bad_manifest_line" and ": " in text else text


def _say(line: str) -> None:
    click.echo(terminal_safe(line), err=True)  # a path from the manifest may hold escape sequences


def _write_rows(rows: Path, got: Iterator[RolloutRow]) -> None:
    """The rows into ``rows`` (:func:`~pvisor.commands.batch.write_rows`: beside it, renamed over
    it when all are written; a device or a FIFO written through)."""
    parquet = rows.suffix.lower() == ".parquet"
    if parquet:
        try:
            import pyarrow  # noqa: F401  (an optional extra that write_parquet_rows uses)
        except ImportError:
            raise UsageError(
                f"--rows {show_path(rows)}: Parquet needs pyarrow: pip install '.[parquet]' in a clone of "
                "pvisor (or a .jsonl file for JSON Lines)"
            ) from None

    def write(out: BinaryIO) -> None:
        if parquet:
            write_parquet_rows(out, rollout_schema(), (_text_row(r) for r in got), PARQUET_BATCH)
        else:
            for r in got:
                out.write(orjson.dumps(r.as_dict()) + b"\n")

    write_rows(rows, write)


def _text_row(row: RolloutRow) -> dict[str, Any]:
    flat = row.as_dict()
    flat["result"] = orjson.dumps(flat["result"]).decode() if flat["result"] is not None else None
    return flat


def rollout_schema() -> Any:
    """The Parquet schema of the rows (module docstring)."""
    import pyarrow as pa  # an optional extra (pvisor-replay[parquet]), not installed by default

    text = pa.string()
    return pa.schema(
        [
            ("line", pa.int64()),
            ("name", text),
            ("mode", text),
            ("status", text),
            ("agent", text),
            ("to_agent", text),
            ("after_step", pa.int64()),
            ("derived_run", text),
            ("ended_by", text),
            ("live_steps", pa.int64()),
            ("workspace", text),
            ("result", text),
            ("error", pa.struct([("code", text), ("message", text)])),
        ]
    )


__all__ = ["not_kept", "refuse_writing_sources", "rollout_schema", "run_rollout_batch"]
