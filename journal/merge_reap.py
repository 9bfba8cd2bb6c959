"""The reaped image of a merge source (docs/journal.md "Merging journals"): the rows a source's
exchanges would hold once a writer of that journal reaped the dead leases on it.

A writer that died (a killed worker) leaves its lease open and its exchanges in flight
(``outcome`` NULL, a streamed response in ``response_parts``). The next writer of the journal
reaps it (:meth:`pvisor.journal.writer.Journal` ``_reap_dead_writers``): joins the parts into the
``response_body`` blob, sets ``bytes_received``, ``outcome = 'incomplete'`` and the error
``writer W (pid P) ended while the exchange was in flight``, and closes the lease (``dead``).
A merge copies such a run as that reaper would write it, with the source's writer id and pid:
DST's own writers then find nothing to reap, so the run in DST stays what the source gives, and
merging the source again (reaped meanwhile or not) finds the same run, not a clash.

Tables made (temp schema of the merge's connection), for a source schema ``a`` with exchanges
to reap only: ``merge_reaped_<a>`` (``id``, ``error``, ``joined``: 1 when parts were joined,
``response_body``, ``bytes_received``), ``merge_reaped_blobs_<a>`` (the joined bodies, as
``blobs`` rows) and the view ``merge_exchanges_<a>`` (the source's exchanges with those
columns replaced). This module imports only the journal package.
"""

from __future__ import annotations

import sqlite3

from . import blobs
from .housekeeping import live_writers
from .reader import JournalReader


def dead_error(writer: int, pid: int) -> str:
    """The error the reaper gives an exchange of the dead writer ``writer`` (pid ``pid``)."""
    return f"writer {writer} (pid {pid}) ended while the exchange was in flight"


def reap_image(conn: sqlite3.Connection, alias: str, reader: JournalReader) -> int:
    """Build the reaped image of the source attached as ``alias`` (read through ``reader``) when
    a dead lease on it left exchanges in flight; returns how many exchanges it changes (0: no
    table is made, the source's rows are copied as they are)."""
    rc = reader.conn
    live = {w[0] for w in live_writers(rc)}
    cols = {r[1] for r in rc.execute("PRAGMA table_info(exchanges)")}
    if "writer_id" not in cols:
        return 0
    rows = [
        (ex, wid, pid)
        for ex, wid, pid in rc.execute(
            "SELECT e.id, w.id, w.pid FROM exchanges e JOIN writers w ON w.id = e.writer_id"
            " WHERE e.outcome IS NULL AND w.closed_ms IS NULL ORDER BY e.rowid"
        )
        if wid not in live
    ]
    if not rows:
        return 0
    has_parts = bool(
        rc.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'response_parts'").fetchone()
    )
    conn.execute(
        f"CREATE TEMP TABLE merge_reaped_{alias} (id TEXT PRIMARY KEY, error TEXT, joined INTEGER,"
        " response_body TEXT, bytes_received INTEGER)"
    )
    conn.execute(
        f"CREATE TEMP TABLE merge_reaped_blobs_{alias} (sha256 TEXT PRIMARY KEY, size INTEGER, codec TEXT,"
        " base TEXT, data BLOB)"
    )
    for ex, wid, pid in rows:
        parts = (
            rc.execute(
                "SELECT data FROM response_parts WHERE exchange_id = ? ORDER BY offset", (ex,)
            ).fetchall()
            if has_parts
            else []
        )
        sha = size = None
        if parts:  # the reaper's assemble_parts: the parts joined, stored as one blob
            data = b"".join(r[0] for r in parts)
            sha, size = blobs.sha256_hex(data), len(data)
            codec, stored = blobs.encode(data)
            conn.execute(
                f"INSERT OR IGNORE INTO temp.merge_reaped_blobs_{alias} VALUES (?, ?, ?, NULL, ?)",
                (sha, size, codec, stored),
            )
        conn.execute(
            f"INSERT INTO temp.merge_reaped_{alias} VALUES (?, ?, ?, ?, ?)",
            (ex, dead_error(wid, pid), 1 if parts else 0, sha, size),
        )
    picked = []
    for c in (r[1] for r in conn.execute(f"PRAGMA {alias}.table_info(exchanges)")):
        if c == "outcome":
            picked.append("CASE WHEN r.id IS NULL THEN e.outcome ELSE 'incomplete' END AS outcome")
        elif c == "error":
            picked.append("CASE WHEN r.id IS NULL THEN e.error ELSE r.error END AS error")
        elif c in ("response_body", "bytes_received"):
            picked.append(f"CASE WHEN r.joined = 1 THEN r.{c} ELSE e.{c} END AS {c}")
        else:
            picked.append(f"e.{c} AS {c}")
    conn.execute(
        f"CREATE TEMP VIEW merge_exchanges_{alias} AS SELECT {', '.join(picked)} FROM {alias}.exchanges e"
        f" LEFT JOIN temp.merge_reaped_{alias} r ON r.id = e.id"
    )
    return len(rows)


def exchanges_of(conn: sqlite3.Connection, schema: str) -> str:
    """The exchanges of ``schema`` as a merge reads them: its reaped image when it has one."""
    view = f"merge_exchanges_{schema}"
    if conn.execute("SELECT 1 FROM temp.sqlite_master WHERE type = 'view' AND name = ?", (view,)).fetchone():
        return f"temp.{view}"
    return f"{schema}.exchanges"


def reaped_rows(conn: sqlite3.Connection, alias: str) -> bool:
    """Whether the source ``alias`` has a reaped image."""
    return exchanges_of(conn, alias) != f"{alias}.exchanges"


__all__ = ["dead_error", "exchanges_of", "reap_image", "reaped_rows"]
