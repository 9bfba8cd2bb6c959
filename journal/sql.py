"""SQL over a journal with its bodies readable: two functions and two views, registered on any
SQLite connection (``pvisor journal sql``, the Datasette plugin).

Bodies are stored as content-addressed blobs, most of them zstd frames compressed against the
previous body of their lane (:mod:`pvisor.journal.blobs`), so no SQL tool can read them as they
are. Registered here:

- ``pvisor_body(sha256)`` -> BLOB: the restored bytes of the blob ``sha256`` (NULL for NULL).
- ``pvisor_json(sha256 [, content_encoding])`` -> TEXT: the same bytes as UTF-8 text, after
  undoing ``content_encoding`` (``gzip``, ``br``, ``zstd``, ``deflate``; a response is stored as
  received, its ``content-encoding`` header in ``response_headers``; a request body is stored
  decoded already) when given; NULL for NULL, or for bytes that are not UTF-8 text (an image, a
  body whose encoding could not be undone). A JSON body reads with SQLite's own
  ``json_extract``; a streamed response is its event-stream text (``response_final`` is the
  reassembled JSON).
- view ``exchange_bodies``: one row per exchange with its run, attempt, seq, chain, role,
  method, path, status, outcome, served_by, and ``request``, ``response`` (the reassembled
  final response of a stream, else the body, its content encoding undone) and ``response_raw``
  (the bytes as streamed) as text.
- view ``run_summary``: one row per run with its agent, version, mode, parent, boundary,
  creation time (UTC), attempts, exchanges, main-loop exchanges and the bytes received.

A blob that is missing or damaged makes the function raise :class:`IntegrityError` (exit 3 from
``pvisor journal sql``); SQLite reports only "user-defined function raised exception", so the
last error is kept in :attr:`Functions.error` for the caller to name.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .content_encoding import DecodeError, decode_body
from .errors import PvisorError
from .reader import BlobRestorer
from .schema import VIEWS_M009

#: the views (m009 of :mod:`pvisor.journal.schema` puts them in every journal), created as TEMP
#: views on a connection to a journal written before it (a read-only one takes them too)
VIEWS = VIEWS_M009


class Functions:
    """The two functions of one connection; :attr:`error` is the last PvisorError they raised."""

    def __init__(self, conn: sqlite3.Connection, label: str) -> None:
        self.blobs = BlobRestorer(conn, label)
        self.error: PvisorError | None = None

    def body(self, sha: Any) -> bytes | None:
        if sha is None:
            return None
        try:
            return self.blobs.restore(str(sha))
        except PvisorError as exc:
            self.error = exc
            raise

    def text(self, sha: Any, encoding: Any = None) -> str | None:
        data = self.body(sha)
        if data is None:
            return None
        if encoding:
            try:
                data = decode_body(data, str(encoding))
            except DecodeError:
                return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None


def register(conn: sqlite3.Connection, label: str, *, views: bool = True) -> Functions:
    """Register ``pvisor_body`` and ``pvisor_json`` on ``conn`` and, with ``views``, create the
    :data:`VIEWS` the database does not hold already as TEMP views. ``label`` names the journal
    in errors. Returns the :class:`Functions` (its ``error``)."""
    fns = Functions(conn, label)
    # deterministic: SQLite may use them in indexes and views, and call them once per value
    conn.create_function("pvisor_body", 1, fns.body, deterministic=True)
    conn.create_function("pvisor_json", -1, fns.text, deterministic=True)
    if views:
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")}
        for name, select in VIEWS.items():
            if name not in have:
                conn.execute(f"CREATE TEMP VIEW IF NOT EXISTS {name} AS {select}")
    return fns
