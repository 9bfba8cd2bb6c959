"""The Datasette plugin of pvisor (entry point ``pvisor`` in the ``datasette`` group; the extra
``pvisor-replay[datasette]``): ``datasette journal.sqlite`` browses runs with readable bodies.

For every database that is a pvisor journal (it has ``runs``, ``exchanges`` and ``blobs``) it
registers on each connection Datasette opens the functions of :mod:`pvisor.journal.sql`
(``pvisor_body``, ``pvisor_json``), so the views ``exchange_bodies`` and ``run_summary`` (in
every journal since schema 9) show each exchange's request and response as text; the foreign
keys of schema 8 link runs, attempts, exchanges, snapshots and blobs; and two canned queries
open one exchange's bodies and one run's exchanges by id. Other databases are left alone.
Source of the hooks: Datasette's plugin hooks documentation (``prepare_connection``,
``canned_queries``).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from datasette import hookimpl

from .sql import register

_JOURNAL_TABLES = ("runs", "exchanges", "blobs")


def is_journal(conn: sqlite3.Connection) -> bool:
    """Whether ``conn``'s main database has a journal's tables."""
    names = {
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)", _JOURNAL_TABLES
        )
    }
    return len(names) == len(_JOURNAL_TABLES)


@hookimpl
def prepare_connection(conn: sqlite3.Connection, database: str, datasette: Any) -> None:
    if is_journal(conn):
        register(conn, f"{database} (Datasette)")


@hookimpl
def canned_queries(datasette: Any, database: str) -> Any:
    db = datasette.databases.get(database)
    if db is None or getattr(db, "is_memory", False):
        return None

    async def queries() -> dict[str, dict[str, str]]:
        # (an awaitable, as the hook allows: whether it is a journal is a query)
        tables = set(await db.table_names())
        if not tables.issuperset(_JOURNAL_TABLES):
            return {}
        return {
            "exchange": {
                "title": "One exchange's request and response, as text",
                "sql": "SELECT id, run_id, seq, role, method, path, status, outcome, request, response, "
                "response_raw FROM exchange_bodies WHERE id = :exchange",
            },
            "run_exchanges": {
                "title": "A run's exchanges in order, with the start of each body",
                "sql": "SELECT seq, id, role, status, outcome, substr(request, 1, 300) AS request, "
                "substr(response, 1, 300) AS response FROM exchange_bodies WHERE run_id = :run ORDER BY seq",
            },
        }

    return queries
