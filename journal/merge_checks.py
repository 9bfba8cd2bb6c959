"""Checks of what a merge copies (docs/journal.md "Merging journals"): every blob new to DST is
restored from its source (decoded, its bases followed) and its sha256 compared, so that a body
that no longer decodes is refused (exit 3) as a missing one is, instead of being copied into a
DST that then fails ``journal verify``. Blobs DST holds already are not read again. Also the
error of a failed SQLite statement of a merge (:func:`failed`).

This module imports only the journal package and core.
"""

from __future__ import annotations

import os
import sqlite3

from pvisor.core.errors import IntegrityError, OutputError, PvisorError, UnavailableError

from .merge_files import uri
from .reader import BUSY_TIMEOUT_S, JournalReader

#: blobs read per query
BATCH = 500


def verify_new_blobs(
    conn: sqlite3.Connection, table: str, alias: str, reader: JournalReader, path: str
) -> int:
    """Restore each blob listed in the temp table ``table`` (column ``sha``) from the source
    ``path`` (attached to ``conn`` as ``alias``, read through ``reader``), in the order the
    source stored them (a base before its frames: the reader's cache makes each frame one decode).
    Returns how many were checked. IntegrityError (exit 3) naming the blob and the source, when
    one does not decode or restores to other bytes than its sha256 says. A base the source lacks
    (DST holds it) is left to the merge's base check."""
    shas = [
        r[0]
        for r in conn.execute(
            f"SELECT m.sha FROM temp.{table} m JOIN {alias}.blobs b ON b.sha256 = m.sha ORDER BY b.rowid"
        )
    ]
    for sha in shas:
        try:
            reader.blob(sha)
        except IntegrityError as exc:
            if exc.message.endswith("is missing"):
                continue
            prefix = f"journal {reader.path}: "
            detail = exc.message[len(prefix) :] if exc.message.startswith(prefix) else exc.message
            verify = f"pvisor --journal {path} journal verify"
            raise IntegrityError(f"journal {path} is damaged: {detail} ({verify}); nothing merged") from None
    return len(shas)


def failed(exc: sqlite3.DatabaseError, srcs: list[str], dst: str) -> PvisorError:
    """The error of a failed SQLite statement: UnavailableError (69) when ``dst`` stayed locked,
    OutputError (74) when its file system is full, else IntegrityError (3) naming the first of
    the files that does not pass ``PRAGMA quick_check`` (a source, else ``dst``), else
    UnavailableError."""
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return UnavailableError(
            f"journal {dst} is locked by another process (still busy after {BUSY_TIMEOUT_S:g} s); "
            "nothing merged"
        )
    if "full" in text:
        return OutputError(f"journal {dst}: no room on its file system ({exc}); nothing merged")
    return damage(exc, srcs, dst)


def damage(exc: sqlite3.Error, srcs: list[str], dst: str) -> PvisorError:
    """IntegrityError naming the first of the files that does not pass ``PRAGMA quick_check``
    (a source, else ``dst``), else UnavailableError."""
    for path in [*srcs, dst]:
        if not os.path.exists(path):
            continue
        try:
            c = sqlite3.connect(uri(path, "ro"), uri=True)
            try:
                bad = [r[0] for r in c.execute("PRAGMA quick_check")] != ["ok"]
            finally:
                c.close()
        except sqlite3.DatabaseError:
            bad = True
        if bad:
            return IntegrityError(f"journal {path} is damaged ({exc}); nothing merged")
    return UnavailableError(f"journal merge into {dst} could not finish: {exc}; nothing merged")


__all__ = ["damage", "failed", "verify_new_blobs"]
