"""``pvisor journal sql QUERY``: one read-only SQL statement over the journal, with the bodies
readable (``pvisor_body``, ``pvisor_json``, views ``exchange_bodies`` and ``run_summary``:
:mod:`pvisor.journal.sql`, docs/journal.md "SQL").

Output: a table for people (cells cut to :data:`CELL_CHARS` characters, control characters
escaped), ``--json`` (an array of objects) or ``--csv`` (a header row, then the rows). A BLOB
value is its text when it is UTF-8, else ``<N bytes>`` in the table, ``{"$base64": true,
"encoded": ...}`` in JSON (Datasette's convention) and ``base64:...`` in CSV.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import click

from pvisor.commands.base import Command
import orjson

from pvisor.core.errors import UsageError

#: the widest table cell; --json and --csv keep whole values
CELL_CHARS = 120


def _table_cell(value: Any) -> str:
    from pvisor.commands.cells import clip

    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(value)} bytes>"
    return clip(str(value), CELL_CHARS)


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            return {"$base64": True, "encoded": base64.b64encode(value).decode()}
    return value


def _csv_value(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            return "base64:" + base64.b64encode(value).decode()
    return "" if value is None else value


def _first_word(query: str) -> str:
    """The first keyword of ``query``, upper case, past blanks and comments (``--`` to the end
    of the line, ``/* ... */``)."""
    import re

    m = re.match(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*([A-Za-z]*)", query, re.S)
    return m.group(1).upper() if m else ""


def _check_utf8(query: str) -> None:
    """UsageError (exit 2) naming the first byte of ``query`` that is not UTF-8 (``\\xNN``, as the
    shell gave it: Python keeps an undecodable argv byte as a lone surrogate, which SQLite cannot
    take) and where it is."""
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(query[exc.start])
        what = f"byte \\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"character U+{code:04X}"
        raise UsageError(
            f"the query is not UTF-8: {what} at character {exc.start + 1}; give the SQL text as UTF-8"
        ) from None


class _StopOnInterrupt:
    """While entered (on the main thread), Ctrl-C (SIGINT) stops the running statement: SQLite
    runs its C loop without returning to Python, where the default handler would raise
    KeyboardInterrupt, so the handler only marks ``interrupted`` and a progress handler, which
    SQLite calls every :data:`PROGRESS_OPS` virtual machine steps, ends the statement with
    ``sqlite3.OperationalError: interrupted``. The earlier handler is back on exit."""

    #: SQLite VM instructions between two calls of the progress handler (a few ms at most)
    PROGRESS_OPS = 10_000

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.interrupted = False
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted = True

    def __enter__(self) -> "_StopOnInterrupt":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        self.conn.set_progress_handler(lambda: self.interrupted, self.PROGRESS_OPS)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        self.conn.set_progress_handler(None, 0)
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self.interrupted and exc[0] is None:
            raise KeyboardInterrupt  # Ctrl-C as the statement ended: stop before the output


@click.command("sql", cls=Command)
@click.argument("query")
@click.option("--json", "as_json", is_flag=True, help="Print an array of objects, whole values.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV with a header row, whole values.")
@click.pass_context
def sql(ctx: click.Context, query: str, as_json: bool, as_csv: bool) -> None:
    """Run QUERY, one read-only SQL statement, on the journal, with pvisor_body(sha256) (bytes),
    pvisor_json(sha256 [, content_encoding]) (text) and the views exchange_bodies and run_summary.

    \b
    Examples:
      pvisor journal sql "SELECT id, agent, exchanges FROM run_summary"
      pvisor journal sql "SELECT seq, json_extract(request, '$.model') FROM exchange_bodies WHERE run_id = 'r-3f2a'"
      pvisor journal sql --csv "SELECT id, status, length(response) FROM exchange_bodies"
    """  # noqa: E501 (an example click prints as written)
    from pvisor.journal.reader import JournalReader
    from pvisor.journal.sql import ReadOnly, register

    if as_json and as_csv:
        raise UsageError("give --json or --csv, not both")
    if not query.strip():
        raise UsageError('the query is empty: give one SQL statement, e.g. "SELECT * FROM run_summary"')
    _check_utf8(query)
    path = ctx.obj["journal"]
    with JournalReader(path) as reader:
        fns = register(reader.conn, path)
        # the connection is read-only (mode=ro) already; the authorizer refuses, before it runs,
        # what would still write (ATTACH and VACUUM INTO create files) or change the connection
        guard = ReadOnly()
        reader.conn.isolation_level = None  # no BEGIN of sqlite3's own before a statement
        reader.conn.set_authorizer(guard)
        cursor = reader.conn.cursor()
        cursor.row_factory = None
        stop = _StopOnInterrupt(reader.conn)
        try:
            with stop:
                cursor.execute(query)
                columns = [d[0] for d in cursor.description or ()]
                rows = cursor.fetchall()
        except (sqlite3.Warning, sqlite3.ProgrammingError) as exc:
            if "one statement" not in str(exc):
                raise UsageError(f"SQL error: {exc} (in: {query.strip()[:200]})") from None
            raise UsageError("journal sql runs one statement at a time; give the others one by one") from None
        except sqlite3.Error as exc:
            if stop.interrupted:
                raise KeyboardInterrupt from None  # pvisor: aborted, exit 130 (docs/cli.md)
            if fns.error is not None:
                raise fns.error from None  # a damaged body: IntegrityError, exit 3
            if guard.refused is not None:
                # VACUUM is refused as the ATTACH of its target, CREATE and DROP as the write of
                # their schema row: named by the statement's own word
                word = _first_word(query)
                what = word if word == "VACUUM" or (guard.schema_row and word) else guard.refused
                raise UsageError(
                    f"journal sql only reads the journal: {what} is refused (one statement that reads: "
                    "SELECT, WITH, or a PRAGMA that reads)"
                ) from None
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise UsageError(f"journal sql only reads the journal: {exc}") from None
            raise UsageError(f"SQL error: {exc} (in: {query.strip()[:200]})") from None
    if as_json:
        sys.stdout.buffer.write(
            orjson.dumps([{c: _json_value(v) for c, v in zip(columns, row)} for row in rows]) + b"\n"
        )
    elif as_csv:
        import csv

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(columns)
        for row in rows:
            out.writerow([_csv_value(v) for v in row])
    elif columns:
        from pvisor.commands.cells import counted, print_table

        print_table([[_table_cell(v) for v in row] for row in rows], columns)
        click.echo(counted(len(rows), "row"), err=True)
