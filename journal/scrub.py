"""Removing a leaked string from a journal for good (``pvisor journal scrub``), docs/journal.md
"Scrubbing a leaked secret".

A key that reached a tool's output is in every later request body of the run (each repeats the
conversation), in the stored response, in the workspace files a snapshot kept, and in the run
directory (agent output, private home). Bodies are content-addressed and stored as zstd frames
against an earlier body (:mod:`pvisor.journal.blobs`), so replacing the text is not an
``UPDATE``:

1. Every blob is restored, parents before children (the forest of ``base`` references, file
   blobs before the snapshot manifests that list them). A blob whose bytes hold the text gets
   the replacement and so a new sha256; a blob whose base changed is re-encoded against the new
   base (its own bytes may be unchanged): every frame compressed against a changed body, up to
   the next keyframe, is rewritten. A response received with a ``Content-Encoding`` is searched
   decoded and stored again in its coding. A manifest names the new sha256 and size of each
   changed file.
2. Every row naming an old sha256 (``exchanges``' body columns, ``snapshots.manifest``,
   ``runs.workspace_snapshot``, the ``snapshot.taken`` event) is rewritten, and every text cell of
   the metadata tables (headers, labels, argv, errors, events, in-flight ``response_parts``) gets
   the replacement; identifiers and digests are left.
3. After the commit, with ``secure_delete`` on: a WAL checkpoint with truncation, ``VACUUM``
   (temporary store in memory) and a second truncating checkpoint, so that no free page, WAL
   frame or temporary file keeps the old bytes.
4. The run directories: each file holding the text gets it replaced (a text file by the
   replacement, a binary one, such as an agent's own SQLite database, by as many ``*`` as the
   text has bytes, so that its structure stays).
5. The journal is verified (:meth:`JournalReader.verify`) and the journal file, its WAL and the
   run directories are searched again for the text's bytes: what remains is reported.

What is replaced (a literal text with its JSON-escaped forms, or a regular expression) is a
:class:`~pvisor.journal.scrub_pattern.Pattern`. With ``run`` only the
blobs and rows of that run are searched; a body it shares with another run is changed for both
(one blob). Like rm, scrub refuses while a live writer holds the lease (it keeps lane state that
names the old blobs) unless ``force``. Steps 1 and 2 are one transaction: an interrupted scrub
changes nothing.

This module runs the steps in their order and the check after (step 5); step 1 is
:mod:`~pvisor.journal.scrub_blobs`, step 2 :mod:`~pvisor.journal.scrub_rows`, step 4
:mod:`~pvisor.journal.scrub_files`, the JSON a replacement must keep
:mod:`~pvisor.journal.scrub_json`, the report :mod:`~pvisor.journal.scrub_report`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from pvisor.core.errors import IntegrityError, PvisorError, UnavailableError, UsageError

from .content_encoding import DecodeError, decode_body
from .housekeeping import check_writers, journal_bytes, live_writers, open_for_writing, started_by
from .paths import run_directory, runs_directory
from .reader import JournalReader
from .scrub_blobs import body_codings, run_blobs, scrub_blobs, streamed_bodies
from .scrub_files import found_in_tree, scrub_tree
from .scrub_json import scrub_split
from .scrub_pattern import DEFAULT_REPLACEMENT, Pattern
from .scrub_report import ScrubReport
from .scrub_rows import TEXT_TABLES, blob_place, identifier_cells, rewrite_rows, scrub_cells, text_cells


def scrub(
    journal: str | os.PathLike,
    pattern: Pattern,
    *,
    run_id: str | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> ScrubReport:
    """Replace ``pattern`` in the journal and its run directories (module docstring). ``run_id``
    (an id or unique prefix) limits it to one run; ``dry_run`` does all of it in a transaction
    that is rolled back, touches no file, and reports what would change (``files_changed``: the
    files that hold the text). Returns the report; the caller decides what a problem or a
    remaining match means (the CLI exits 3). Raises UsageError for an unknown run, and when a
    replacement would leave a body or cell that was JSON no longer JSON (a regex matching part
    of an escape sequence): nothing changed then; UnavailableError (exit 69) while a live writer
    holds the journal (without ``force``), when it stays locked, or when it cannot be written;
    IntegrityError (nothing changed) when a blob cannot be restored."""
    path = Path(journal)
    run = None
    if run_id is not None:
        with JournalReader(path) as reader:
            run = reader.run(run_id).id
    # a crafted run id (IntegrityError) is refused here, before anything changes
    dirs = [run_directory(path, run)] if run else sorted(runs_directory(path).glob("*"))
    report = ScrubReport(pattern.describe, run, dry_run=dry_run)
    report.bytes_before = journal_bytes(path)
    conn = open_for_writing(path)
    try:
        if force:
            report.live_writers = [started_by(pid, host) for _, pid, host in live_writers(conn)]
        check_writers(conn, path, force, "scrub")
        _refuse_identifiers(conn, path, pattern, run)
        failures: list[BaseException] = []  # what a function called by SQLite raised (Ctrl-C)
        try:
            # overwrite what rows and pages leave behind, from the first change on
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("BEGIN IMMEDIATE")
            try:
                with JournalReader(path) as reader:
                    mapping, sizes = scrub_blobs(conn, reader, pattern, run, report)
                rewrite_rows(conn, mapping, sizes, report)
                scrub_cells(conn, pattern, run, report, failures)
                conn.execute("ROLLBACK" if dry_run else "COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if failures:  # a Ctrl-C inside SQLite's call of our function: what it was, not SQLite's word
                raise failures[0] from None
            raise UnavailableError(_not_written(path, exc)) from None
        except KeyboardInterrupt:
            raise ScrubInterrupted(
                f"journal {path}: scrub interrupted before its commit: it changed nothing"
            ) from None
        if dry_run:
            report.bytes_after = report.bytes_before
            report.wal_truncated = None
        else:
            try:
                first = _checkpoint(conn)
                conn.execute("VACUUM")
                report.wal_truncated = _checkpoint(conn) and first
            except sqlite3.OperationalError as exc:
                raise UnavailableError(
                    f"journal {path}: the text is replaced, but its old pages could not be cleared ({exc}): "
                    "run pvisor journal vacuum when no other process has the journal open"
                ) from None
            except KeyboardInterrupt:
                raise ScrubInterrupted(_after_commit(path, "the old pages were not cleared yet")) from None
    finally:
        conn.close()
    report.run_dirs = [str(d) for d in dirs if d.is_dir() and not d.is_symlink()]
    if dry_run:
        for d in report.run_dirs:
            for p, _, where in found_in_tree(Path(d), pattern):
                (report.names_changed if where in ("name", "target") else report.files_changed).append(p)
        _hide(report, pattern)
        return report
    report.bytes_after = journal_bytes(path)
    try:
        for d in report.run_dirs:
            scrub_tree(Path(d), pattern, report)
        with JournalReader(path) as reader:
            report.problems = reader.verify().problems
        report.remaining = _remaining(path, run, [Path(d) for d in report.run_dirs], pattern, report)
    except KeyboardInterrupt:
        raise ScrubInterrupted(
            _after_commit(path, "the run directories and the check after were not done")
        ) from None
    _hide(report, pattern)
    return report


class ScrubInterrupted(PvisorError):
    """Ctrl-C during a scrub: exit 130, and a message that says whether the journal changed."""

    exit_code = 130


def _after_commit(path: Path, what: str) -> str:
    return (
        f"journal {path}: scrub interrupted after its commit: the journal's bodies and rows are scrubbed, "
        f"but {what}; "
        "run the same scrub again to finish (it is safe to repeat)"
    )


def _hide(report: ScrubReport, pattern: Pattern) -> None:
    """Every path and place of the report with the text replaced (a file's name may hold it)."""
    for name in ("run_dirs", "files_changed", "names_changed", "remaining", "problems"):
        setattr(report, name, [pattern.hide(v) for v in getattr(report, name)])
    for left in report.not_rewritten:
        left["path"] = pattern.hide(left["path"])
        left["why"] = pattern.hide(left["why"])


def _refuse_identifiers(conn: sqlite3.Connection, path: Path, pattern: Pattern, run: str | None) -> None:
    """UsageError (nothing changed) when a run or exchange id holds the text: ids are never
    rewritten, and the labels and paths derived from them would be (the run directory keeps
    its name), so removing the run comes first."""
    conn.create_function("pvisor_scrub_found", 1, pattern.found_text, deterministic=True)
    for table, what in (("runs", "run"), ("exchanges", "exchange"), ("attempts", "attempt of run")):
        col = "id" if table != "attempts" else "run_id"
        where = "pvisor_scrub_found(" + col + ")" + (" AND " + TEXT_TABLES[table] if run is not None else "")
        row = conn.execute(f"SELECT {col} FROM {table} WHERE {where} LIMIT 1", {"run": run}).fetchone()
        if row is not None:
            raise UsageError(
                f"journal {path}: scrub changed nothing: the text is in the id of {what} "
                f"{pattern.hide(row[0])}, "
                "and ids are never rewritten: pvisor journal rm that run first, then scrub"
            )


def _not_written(path: Path, exc: sqlite3.OperationalError) -> str:
    """The one line for an SQLite error while the transaction ran (nothing changed)."""
    text = str(exc)
    if "readonly" in text or "unable to open" in text:
        return (
            f"journal {path}: scrub changed nothing: the journal or its directory {path.parent} is not "
            f"writable ({text})"
        )
    if "locked" in text or "busy" in text:
        return (
            f"journal {path}: scrub changed nothing: another process kept it locked past the timeout ({text})"
        )
    return f"journal {path}: scrub could not finish (nothing changed): {text}"


def _checkpoint(conn: sqlite3.Connection) -> bool:
    """A truncating WAL checkpoint; False when a reader kept it from finishing."""
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return busy == 0


def _remaining(
    path: Path, run: str | None, dirs: list[Path], pattern: Pattern, report: ScrubReport
) -> list[str]:
    """Step 5: where the text is still found: a blob (restored, and decoded from its content
    coding), a metadata cell, an identifier (never rewritten), the journal file or its WAL as
    bytes (not for one run: other runs may hold the text), a file or name of the run
    directories (with why it was left, when it was)."""
    out = []
    with JournalReader(path) as reader:
        conn = reader.conn
        conn.create_function("pvisor_scrub_found", 1, pattern.found_text, deterministic=True)
        codings = body_codings(conn)
        streamed = streamed_bodies(conn)
        wanted = run_blobs(conn, reader, run) if run else None
        # in the order they were stored: a lane's next body is one frame from the one restored last
        for (sha,) in conn.execute("SELECT sha256 FROM blobs ORDER BY rowid").fetchall():
            if wanted is not None and sha not in wanted:
                continue
            try:
                data = reader.blob(sha)
            except IntegrityError:
                continue  # the verification names it
            if sha in codings:
                with contextlib.suppress(DecodeError):  # one that does not decode was searched raw
                    data = decode_body(data, codings[sha])
            if pattern.found(data):
                out.append(blob_place(conn, sha))
            elif sha in streamed and scrub_split(data, pattern)[1]:
                out.append(f"{blob_place(conn, sha)}, split between the stream's events")
        for table, col, where_run in text_cells(conn, run):
            where = f"pvisor_scrub_found({col})" + (f" AND {where_run}" if run is not None else "")
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}", {"run": run}).fetchone()[0]
            if n:
                out.append(f"{table}.{col} ({n} rows)")
        for table, col, where_run in identifier_cells(conn, run):
            where = f"pvisor_scrub_found({col})" + (f" AND {where_run}" if run is not None else "")
            ids = [
                r[0] for r in conn.execute(f"SELECT {col} FROM {table} WHERE {where} LIMIT 3", {"run": run})
            ]
            if ids:
                out.append(
                    f"{table}.{col} of {len(ids)}{'+' if len(ids) == 3 else ''} row(s): an identifier, never "
                    "rewritten (pvisor journal rm removes its run)"
                )
    if run is None:
        for p in (path, Path(f"{path}-wal")):
            with contextlib.suppress(OSError):
                if p.is_file() and pattern.found(p.read_bytes()):
                    out.append(str(p))
    why = {left["path"]: left["why"] for left in report.not_rewritten}
    for d in dirs:
        for p, note, _ in found_in_tree(d, pattern):
            out.append(f"{p} ({why[p]})" if p in why else f"{p}{note}")
    return out


__all__ = ["DEFAULT_REPLACEMENT", "Pattern", "ScrubReport", "scrub"]
