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

:class:`ReadOnly` is the authorizer ``pvisor journal sql`` puts on its connection (already opened
``mode=ro``): it lets a statement read and refuses, before it runs, whatever would write a file
or change the connection's state (``ATTACH``, which creates the file it names, ``VACUUM INTO``,
which attaches its target, writes to any table, a ``PRAGMA`` that sets a value or acts).

A blob that is missing or damaged makes the function raise :class:`IntegrityError` (exit 3 from
``pvisor journal sql``); SQLite reports only "user-defined function raised exception", so the
last error is kept in :attr:`Functions.error` for the caller to name.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .content_encoding import DecodeError, decode_body
from pvisor.core.errors import PvisorError
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


#: the authorizer's action codes a statement that only reads is made of (sqlite.org/c3ref/c_alter_table.html)
_READS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)

#: the other action codes by name, for the line that says what was refused (sqlite3's module
#: holds the result codes under the same prefix, with the same numbers: so listed, not looked up)
_ACTIONS = {
    getattr(sqlite3, f"SQLITE_{name.replace(' ', '_')}"): name
    for name in (
        "ALTER TABLE", "ANALYZE", "ATTACH", "CREATE INDEX", "CREATE TABLE", "CREATE TEMP INDEX",
        "CREATE TEMP TABLE", "CREATE TEMP TRIGGER", "CREATE TEMP VIEW", "CREATE TRIGGER", "CREATE VIEW",
        "CREATE VTABLE", "DELETE", "DETACH", "DROP INDEX", "DROP TABLE", "DROP TEMP INDEX", "DROP TEMP TABLE",
        "DROP TEMP TRIGGER", "DROP TEMP VIEW", "DROP TRIGGER", "DROP VIEW", "DROP VTABLE", "INSERT", "PRAGMA",
        "REINDEX", "SAVEPOINT", "TRANSACTION", "UPDATE",
    )
}  # fmt: skip

#: pragmas that only read even when given an argument (a table's name, a count of errors)
READING_PRAGMAS = frozenset(
    {
        "collation_list", "compile_options", "database_list", "foreign_key_check", "foreign_key_list",
        "function_list", "index_info", "index_list", "index_xinfo", "integrity_check", "module_list",
        "pragma_list", "quick_check", "table_info", "table_list", "table_xinfo",
    }
)  # fmt: skip

#: pragmas that act without an argument: they write the database (a checkpoint, ANALYZE, freeing pages)
ACTING_PRAGMAS = frozenset({"incremental_vacuum", "optimize", "wal_checkpoint"})

#: SQL functions a read-only statement may not call: they change the connection's state or
#: hand out a native pointer (sqlite.org/lang_corefunc.html, fts3.html#f3tknzr, fts5.html#extending_fts5).
#: ``fts3_tokenizer('simple', x'41...')`` replaced the tokenizer's pointer (what a crafted FTS3
#: table would call), and with one argument printed it; ``load_extension`` loads native code;
#: ``fts5(?)`` hands out the FTS5 API pointer; ``sqlite_rename_*`` and ``sqlite_drop_column`` are
#: ALTER TABLE's internals
DENIED_FUNCTIONS = frozenset(
    {
        "fts3_tokenizer", "load_extension", "fts5", "sqlite_rename_column", "sqlite_rename_table",
        "sqlite_rename_test", "sqlite_rename_quotefix", "sqlite_drop_column",
    }
)  # fmt: skip

#: the schema tables SQLite itself reads for a pragma's table-valued function, as an UPDATE
#: action code (seen with SQLite 3.40): no statement of the user's can write them on a read-only connection
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_temp_master", "sqlite_schema", "sqlite_temp_schema"})


class ReadOnly:
    """An authorizer (``conn.set_authorizer(ReadOnly())``) that lets a statement read and denies
    every other action: writes to any table (temporary ones too), creating or dropping anything,
    ``ATTACH`` and ``DETACH`` (and so ``VACUUM``, which attaches its target), transactions, and a
    ``PRAGMA`` that is given a value (``journal_mode=DELETE``) or acts (:data:`ACTING_PRAGMAS`),
    but not one of :data:`READING_PRAGMAS`, and a call of one of :data:`DENIED_FUNCTIONS`
    (``fts3_tokenizer``, ``load_extension``). :attr:`refused` says what the first denied action
    was (``ATTACH``, ``DELETE on runs``, ``PRAGMA journal_mode=DELETE``, ``BEGIN``), None while
    none was; SQLite then fails the statement with "not authorized" before it runs.
    :attr:`schema_row`: that action was a write of a row of the schema (``INSERT on
    sqlite_master``), the first action of a CREATE or DROP, which the statement names better."""

    def __init__(self) -> None:
        self.refused: str | None = None
        self.schema_row = False

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None
    ) -> int:
        denied_function = action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS
        if not denied_function and (action in _READS or self._reads(action, arg1, arg2)):
            return sqlite3.SQLITE_OK
        row = action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)
        if self.refused is None:
            name = _ACTIONS.get(action, f"action {action}")
            if action == sqlite3.SQLITE_PRAGMA:
                name = f"PRAGMA {arg1}" + (f"={arg2}" if arg2 is not None else "")
            elif denied_function:
                name = f"the function {arg2.lower()}()"
            elif action == sqlite3.SQLITE_TRANSACTION and arg1:
                name = arg1  # BEGIN, COMMIT, ROLLBACK
            elif row and arg1:
                name = f"{name} on {arg1}"
            self.refused, self.schema_row = name, row and arg1 in _SCHEMA_TABLES
        return sqlite3.SQLITE_DENY

    @staticmethod
    def _reads(action: int, arg1: str | None, arg2: str | None) -> bool:
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            return name in READING_PRAGMAS or (arg2 is None and name not in ACTING_PRAGMAS)
        return action == sqlite3.SQLITE_UPDATE and arg1 in _SCHEMA_TABLES
