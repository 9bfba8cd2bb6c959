"""Step 2 of a scrub (:mod:`pvisor.journal.scrub`), the journal's rows: every row that names an
old blob digest names the new one (:func:`rewrite_rows`), and the text is replaced in every
metadata cell but identifiers and digests (:func:`scrub_cells`); which tables and columns are
searched (:func:`text_cells`, :func:`identifier_cells`), and where a blob is used, for messages
(:func:`blob_place`)."""

from __future__ import annotations

import sqlite3
from typing import Callable

from pvisor.core.errors import UsageError

from .scrub_json import json_broken
from .scrub_pattern import Pattern
from .scrub_report import ScrubReport


#: columns that hold identifiers or digests: never text-replaced (the body columns are remapped)
_IDENTIFIER_COLUMNS = frozenset(
    {"id", "run_id", "exchange_id", "parent_run", "sha256", "base", "manifest", "workspace_snapshot"}
    | {"request_body", "response_body", "response_final", "forwarded_body"}
    | {"chunk_timings", "secret_fingerprints"}  # packed numbers; digests of secrets
)


#: tables whose text cells are scrubbed, with the condition that picks a run's rows
TEXT_TABLES = {
    "runs": "id = :run",
    "attempts": "run_id = :run",
    "exchanges": "run_id = :run",
    "events": "run_id = :run",
    "snapshots": "run_id = :run",
    "response_parts": "exchange_id IN (SELECT id FROM exchanges WHERE run_id = :run)",
    "writers": None,  # belongs to no run: scrubbed only without --run
}


BODY_COLUMNS = ("request_body", "response_body", "response_final", "forwarded_body")


#: the size columns of an exchange and the body whose stored size each is, when it is
_SIZE_COLUMNS = (
    ("request_bytes", "request_body"),
    ("bytes_received", "response_body"),
    ("bytes_delivered", "response_body"),
)


def blob_place(conn: sqlite3.Connection, sha: str) -> str:
    """Where blob ``sha`` is used, for a message: an exchange's body or a snapshot."""
    for col in BODY_COLUMNS:
        if not has_column(conn, "exchanges", col):
            continue
        row = conn.execute(f"SELECT id, run_id FROM exchanges WHERE {col} = ? LIMIT 1", (sha,)).fetchone()
        if row is not None:
            return f"the {col.replace('_', ' ')} of exchange {row[0]} (run {row[1]}, blob {sha[:12]})"
    row = conn.execute("SELECT id, run_id FROM snapshots WHERE manifest = ? LIMIT 1", (sha,)).fetchone()
    if row is not None:
        return f"the manifest of snapshot {row[0]} (run {row[1]}, blob {sha[:12]})"
    return f"blob {sha[:12]} (a file of a workspace snapshot, or a manifest)"


def rewrite_rows(
    conn: sqlite3.Connection, mapping: dict[str, str], sizes: dict[str, int], report: ScrubReport
) -> None:
    """Step 2, digests: every row that names an old sha256 names the new one, and a size column
    that gave the old body's size gives the new one's (one that differed, a body cut at a cap or
    delivered otherwise than received, keeps its figure: the replacement is not what went over
    the wire either way). ``chunk_timings`` keep the offsets of the chunks as they arrived."""
    if not mapping:
        return
    conn.execute(
        "CREATE TEMP TABLE scrub_map(old TEXT PRIMARY KEY, new TEXT NOT NULL, old_size INTEGER, "
        "new_size INTEGER)"
    )
    try:
        conn.executemany(
            "INSERT INTO scrub_map VALUES (?, ?, ?, ?)",
            [(old, new, sizes[old], sizes[new]) for old, new in mapping.items()],
        )
        for size_col, body_col in _SIZE_COLUMNS:
            if has_column(conn, "exchanges", size_col):
                conn.execute(
                    f"UPDATE exchanges SET {size_col} = "
                    f"(SELECT new_size FROM scrub_map WHERE old = {body_col})"
                    f" WHERE {size_col} = (SELECT old_size FROM scrub_map WHERE old = {body_col})"
                )
        refs = [("exchanges", c) for c in BODY_COLUMNS if has_column(conn, "exchanges", c)]
        refs.append(("snapshots", "manifest"))
        if has_column(conn, "runs", "workspace_snapshot"):  # a handoff's child names the manifest restored
            refs.append(("runs", "workspace_snapshot"))
        for table, col in refs:
            report.rows_rewritten += conn.execute(
                f"UPDATE {table} SET {col} = (SELECT new FROM scrub_map WHERE old = {col})"
                f" WHERE {col} IN (SELECT old FROM scrub_map)"
            ).rowcount
        # the snapshot.taken event names its manifest too
        report.rows_rewritten += conn.execute(
            "UPDATE events SET data = json_set(data, '$.manifest',"
            " (SELECT new FROM scrub_map WHERE old = json_extract(data, '$.manifest')))"
            " WHERE kind = 'snapshot.taken' AND json_valid(data)"
            " AND json_extract(data, '$.manifest') IN (SELECT old FROM scrub_map)"
        ).rowcount
    finally:
        conn.execute("DROP TABLE temp.scrub_map")


def has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    return column in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def scrub_cells(
    conn: sqlite3.Connection,
    pattern: Pattern,
    run: str | None,
    report: ScrubReport,
    failures: list[BaseException] | None = None,
) -> None:
    """Step 2, metadata: the text replaced in every cell but identifiers and digests. UsageError
    (the caller rolls back) when a cell that was JSON (headers, labels, argv, an event's data)
    would no longer parse."""
    broken: list[str] = []
    where_now = ""

    def found(value):
        try:
            return pattern.found_text(value)
        except BaseException as exc:  # SQLite reports only that the function failed: keep what it was
            if failures is not None:
                failures.append(exc)
            raise

    def sub_cell(value):
        try:
            return _sub_cell(value)
        except BaseException as exc:
            if failures is not None:
                failures.append(exc)
            raise

    def _sub_cell(value):
        new = pattern.sub_text(value)
        if new is not value and isinstance(value, (str, bytes)):
            old_b = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
            new_b = new.encode("utf-8", "surrogatepass") if isinstance(new, str) else new
            if json_broken(old_b, new_b):
                broken.append(where_now)
                return value
        return new

    conn.create_function("pvisor_scrub", 1, sub_cell)
    conn.create_function("pvisor_scrub_found", 1, found, deterministic=True)
    for table, col, where_run in text_cells(conn, run):
        where_now = f"{table}.{col}"
        where = f"pvisor_scrub_found({col})" + (f" AND {where_run}" if run is not None else "")
        report.cells_changed += conn.execute(
            f"UPDATE {table} SET {col} = pvisor_scrub({col}) WHERE {where}", {"run": run}
        ).rowcount
        if broken:
            raise UsageError(
                f"scrub changed nothing: the replacement would leave a cell of {broken[0]} no longer valid "
                "JSON (the regex matches part of an escape sequence or of the JSON around the text); "
                "match the text as stored, or give the literal text instead of --regex"
            )


def text_cells(conn: sqlite3.Connection, run: str | None) -> list[tuple[str, str, str | None]]:
    """(table, column, condition picking the run's rows) of every column scrub searches."""
    return _cells(
        conn, run, lambda name, kind: name not in _IDENTIFIER_COLUMNS and kind.upper() in ("TEXT", "BLOB", "")
    )


def identifier_cells(conn: sqlite3.Connection, run: str | None) -> list[tuple[str, str, str | None]]:
    """(table, column, condition) of the identifier columns of the tables scrub searches."""
    return _cells(conn, run, lambda name, kind: name in ("id", "run_id", "exchange_id", "parent_run"))


def _cells(
    conn: sqlite3.Connection, run: str | None, keep: Callable[[str, str], bool]
) -> list[tuple[str, str, str | None]]:
    """(table, column, condition picking the run's rows) of the columns of :data:`TEXT_TABLES`
    (those of the tables this journal has; with ``run``, of the tables that name a run) whose
    name and declared type ``keep`` accepts, in the tables' and the columns' order."""
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = []
    for table, where_run in TEXT_TABLES.items():
        if table not in present or (run is not None and where_run is None):
            continue
        for r in conn.execute(f"PRAGMA table_info({table})"):
            if keep(r[1], r[2]):
                out.append((table, r[1], where_run))
    return out
