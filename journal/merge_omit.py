"""Blobs a merge leaves out (``merge_journals(..., omit_blobs=)``, docs/journal.md "Merging
journals"): a transfer journal carries runs to a journal that holds those blobs already (a Ray
worker's derived runs, sent back without the source run's workspace files and bodies). Its
snapshot manifests, and the bases they are stored against, are always kept: merging it reads
them to find the files they list. It is marked (``meta.blobs_left_out``), so that merging it
into a journal lacking a blob it left out says so.

This module imports only the journal package and core.
"""

from __future__ import annotations

import sqlite3

#: the ``meta`` key of a journal made with ``omit_blobs``
LEFT_OUT = "blobs_left_out"


def leave_out(conn: sqlite3.Connection, alias: str, omit: frozenset[str]) -> int:
    """Remove from ``temp.merge_blobs_<alias>`` (the blobs the source ``alias`` brings) those of
    ``omit``, but the manifests of the runs' snapshots (``temp.merge_runs_<alias>``) and their
    bases; returns how many were removed."""
    a = alias
    has = conn.execute(
        f"SELECT 1 FROM {a}.sqlite_master WHERE type = 'table' AND name = 'snapshots'"
    ).fetchone()
    conn.execute(f"CREATE TEMP TABLE merge_keep_{a} (sha TEXT PRIMARY KEY)")
    if has:
        conn.execute(
            f"""INSERT INTO temp.merge_keep_{a}
            WITH RECURSIVE keep(sha) AS (
                SELECT manifest FROM {a}.snapshots WHERE manifest IS NOT NULL
                AND run_id IN (SELECT id FROM temp.merge_runs_{a})
                UNION
                SELECT b.base FROM keep k JOIN {a}.blobs b ON b.sha256 = k.sha WHERE b.base IS NOT NULL
            )
            SELECT sha FROM keep"""
        )
    before = conn.execute(f"SELECT count(*) FROM temp.merge_blobs_{a}").fetchone()[0]
    conn.executemany(
        f"DELETE FROM temp.merge_blobs_{a} WHERE sha = ?"
        f" AND NOT EXISTS (SELECT 1 FROM temp.merge_keep_{a} k WHERE k.sha = ?)",
        [(x, x) for x in omit],
    )
    return before - conn.execute(f"SELECT count(*) FROM temp.merge_blobs_{a}").fetchone()[0]


def mark(conn: sqlite3.Connection) -> None:
    """Mark ``main`` (inside the merge's transaction) as a journal whose runs name blobs it lacks."""
    conn.execute("INSERT OR REPLACE INTO main.meta(key, value) VALUES (?, '1')", (LEFT_OUT,))


def left_out(conn: sqlite3.Connection, alias: str) -> bool:
    """Whether the source ``alias`` was made with ``omit_blobs`` (:data:`LEFT_OUT`)."""
    return conn.execute(f"SELECT 1 FROM {alias}.meta WHERE key = ?", (LEFT_OUT,)).fetchone() is not None


__all__ = ["LEFT_OUT", "leave_out", "left_out", "mark"]
