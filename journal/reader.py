"""Read-only access to an Event Journal: runs, exchanges, bodies, verification, export.

Readers never write: the file is opened with ``mode=ro``. Only when SQLite cannot open it that
way because the ``-shm`` file cannot be created (read-only media or directory) and the WAL is
empty or absent is it opened with ``immutable=1``; a journal locked by a writer past the busy
timeout is an UnavailableError (exit 69), never read without its lock. Every body restored from
a blob is checked against its sha256. A journal whose ``_sqlite_migrations`` names migrations
this pvisor does not know (written by a newer pvisor) is refused, as the writer refuses it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import OrderedDict
from dataclasses import field
from typing import IO, TYPE_CHECKING, Any, Iterator

import orjson

from pvisor.core import progress
from pvisor.core.errors import BadInputError, IntegrityError, PvisorError, UnavailableError, UsageError
from .model import RESTORING, RESTORING_LABEL, Attempt, Exchange, Run, RunMode, unpack_timings
from .paths import absolute
from pvisor.core.record import Record

if TYPE_CHECKING:
    from .snapshots import Manifest, SnapshotRecord

_CACHE_BYTES = 64 * 1024 * 1024
#: seconds a reader waits for a writer's lock (sqlite3's busy timeout)
BUSY_TIMEOUT_S = 5.0
#: the migration set and the migrations this pvisor knows (journal/schema.py registers them;
#: kept here too so that a reader need not import sqlite-utils; a test checks they agree)
MIGRATION_SET = "pvisor.journal"
KNOWN_MIGRATIONS = (
    "m001_initial",
    "m002_exchanges_by_arrival",
    "m003_served_by",
    "m004_forwarded_body",
    "m005_snapshots",
    "m006_response_parts",
    "m007_capture",
    "m008_foreign_keys",
    "m009_readable_views",
    "m010_handoff_lineage",
    "m011_start_environment",
)
#: SQLite result codes (Python 3.11+ ``sqlite_errorname``) and message fragments (3.10) of an
#: open that failed only because the -shm file cannot be created or written
_READ_ONLY_MEDIA_CODES = frozenset(
    {"SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY", "SQLITE_READONLY_CANTINIT", "SQLITE_READONLY"}
)
_READ_ONLY_MEDIA_TEXT = ("unable to open database file", "readonly database", "read-only")

#: the columns this reader uses, per table (schema: docs/journal.md)
_COLUMNS = {
    "runs": (
        "id",
        "agent",
        "agent_version",
        "argv",
        "created_ms",
        "parent_run",
        "boundary_step",
        "mode",
        "labels",
    ),
    "attempts": ("run_id", "n", "started_ms", "ended_ms", "exit_code", "labels"),
    "exchanges": (
        "id",
        "run_id",
        "attempt",
        "seq",
        "protocol",
        "method",
        "path",
        "query",
        "request_headers",
        "secret_fingerprints",
        "request_encoding",
        "request_body",
        "request_bytes",
        "status",
        "response_headers",
        "response_body",
        "response_final",
        "streamed",
        "chunk_timings",
        "outcome",
        "error",
        "started_ms",
        "headers_us",
        "first_byte_us",
        "ended_us",
        "bytes_received",
        "bytes_delivered",
        "chain",
        "role",
    ),
    "blobs": ("sha256", "size", "codec", "base", "data"),
    "events": ("seq", "ts_ms", "kind", "run_id", "exchange_id", "writer_id", "data"),
}
#: JSON-valued columns, checked by verify
_JSON_COLUMNS = {
    "runs": ("argv", "labels"),
    "attempts": ("labels",),
    "exchanges": ("request_headers", "secret_fingerprints", "response_headers"),
}


def _json(row: sqlite3.Row, column: str, table: str) -> Any:
    """Parse a JSON column; IntegrityError naming the table, row and column when it is damaged."""
    try:
        return orjson.loads(row[column])
    except (orjson.JSONDecodeError, TypeError):
        ident = row["id"] if "id" in row.keys() else f"{row['run_id']}/{row['n']}"
        raise IntegrityError(f"journal damaged: {table} {ident}: column {column} is not valid JSON") from None


def _locked(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc) or "busy" in str(exc)


def _read_only_media(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return name in _READ_ONLY_MEDIA_CODES
    return any(t in str(exc) for t in _READ_ONLY_MEDIA_TEXT)


def _uri(path: str) -> str:
    """An SQLite URI of the journal file: its real path with ``%``, ``?`` and ``#`` escaped, the
    characters a URI's path cannot hold as they are (https://sqlite.org/uri.html, 3.1)."""
    real = os.path.realpath(absolute(path, f"journal {path}"))
    return "file:" + real.replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _connect_ro(path: str) -> sqlite3.Connection:
    absolute(path, f"journal {path}")  # a relative path in a deleted directory: say so, not "does not exist"
    if not os.path.exists(path):
        raise UsageError(f"journal {path} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"journal {path} is a directory, expected a journal file")
    uri = _uri(path) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise BadInputError(f"{path} is not a pvisor journal (not an SQLite database)") from None
        if "malformed" in str(exc):
            raise IntegrityError(f"journal {path} is damaged: {exc}") from None
        if _locked(exc):
            raise UnavailableError(
                f"journal {path} is locked by another process (still busy after {BUSY_TIMEOUT_S:g} s): {exc}"
            ) from None
        wal = path + "-wal"
        if not _read_only_media(exc) or (os.path.exists(wal) and os.stat(wal).st_size > 0):
            raise UnavailableError(f"cannot open journal {path} read-only: {exc}") from None
    # read-only media or directory, where the -shm file cannot be created: safe only when the
    # WAL holds nothing (a rollback-journal file is then locked by nobody who could write it)
    return sqlite3.connect(
        _uri(path) + "?immutable=1",
        uri=True,
        check_same_thread=False,
    )


def holds_run(path: str | os.PathLike, run_id: str) -> bool:
    """Whether the regular file ``path`` is a journal that holds a run of exactly ``run_id``,
    found without leaving a file beside it (a read-only open of a WAL journal leaves ``-wal``
    and ``-shm`` behind): a journal whose WAL is absent or empty holds everything in its main
    file and is read ``immutable``; one whose WAL holds commits is read as every reader reads
    it (its writer's ``-shm`` is there already). False for a file that is no journal, one that
    cannot be read, or anything but a regular file (never opened: a FIFO would block)."""
    import stat

    where = os.fspath(path)
    try:
        if not stat.S_ISREG(os.stat(where).st_mode):
            return False
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if os.read(fd, 16) != b"SQLite format 3\x00":
                return False
        finally:
            os.close(fd)
        wal = where + "-wal"
        busy = os.path.exists(wal) and os.path.getsize(wal) > 0
    except OSError:
        return False
    try:
        if busy:
            with JournalReader(where) as reader:
                return reader.run_exists(run_id)
        conn = sqlite3.connect(_uri(where) + "?immutable=1", uri=True)
        try:
            return conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None
        finally:
            conn.close()
    except (sqlite3.Error, PvisorError):
        return False


def _check_migrations(conn: sqlite3.Connection, path: str) -> None:
    """BadInputError when the journal was written by a newer pvisor (migrations this one does not know)."""
    try:
        applied = {
            r[0]
            for r in conn.execute(
                "SELECT name FROM _sqlite_migrations WHERE migration_set = ?", (MIGRATION_SET,)
            )
        }
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc) or "no such column" in str(exc):
            return  # no migration table: the table checks below say what is missing
        raise
    newer = applied - set(KNOWN_MIGRATIONS)
    if newer:
        raise BadInputError(
            f"journal {path} was written by a newer pvisor (schema {', '.join(sorted(newer))}); "
            "upgrade pvisor to read it"
        )


class VerifyReport(Record, record=True):
    """Result of :meth:`JournalReader.verify`: ``problems`` (each a sentence naming the table,
    row or blob), counts of what was checked, ``ok`` when no problem was found."""

    problems: list[str] = field(default_factory=list)
    runs: int = 0
    exchanges: int = 0
    blobs: int = 0
    blob_bytes_stored: int = 0
    blob_bytes_restored: int = 0

    def __init__(
        self,
        problems: list[str] | None = None,
        runs: int = 0,
        exchanges: int = 0,
        blobs: int = 0,
        blob_bytes_stored: int = 0,
        blob_bytes_restored: int = 0,
    ) -> None:
        self.problems = [] if problems is None else problems
        self.runs = runs
        self.exchanges = exchanges
        self.blobs = blobs
        self.blob_bytes_stored = blob_bytes_stored
        self.blob_bytes_restored = blob_bytes_restored

    @property
    def ok(self) -> bool:
        return not self.problems


class JournalReader:
    """Read an Event Journal. ``JournalReader(path)``; use as a context manager or call ``close``.
    ``reader.path`` is the journal's path as given, a str.

    Raises:
        UsageError: the file does not exist, or is a directory.
        BadInputError: the file is not an SQLite database, not a pvisor journal, or one written
            by a newer pvisor.
        UnavailableError: it cannot be opened read-only, or is locked past the busy timeout.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.conn = _connect_ro(self.path)
        self.conn.row_factory = sqlite3.Row
        self._blobs = BlobRestorer(self.conn, str(self.path))
        try:
            names = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "runs" not in names or "exchanges" not in names:
                raise BadInputError(
                    f"{self.path} is an SQLite database but not a pvisor journal "
                    "(no runs and exchanges tables)"
                )
            if "_sqlite_migrations" in names:
                _check_migrations(self.conn, self.path)
        except BaseException:
            self.conn.close()
            raise
        missing = [t for t in _COLUMNS if t not in names]
        if missing:
            raise IntegrityError(f"journal {self.path} is damaged: table(s) {', '.join(missing)} missing")
        for table, columns in _COLUMNS.items():
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            lost = [c for c in columns if c not in have]
            if lost:
                raise IntegrityError(
                    f"journal {self.path} is damaged: table {table} lacks column(s) {', '.join(lost)}"
                )

    def __enter__(self) -> "JournalReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def _row_by_id(self, table: str, what: str, ident: str) -> sqlite3.Row:
        """The row of ``table`` whose id is ``ident``, else the one that starts with it (case
        counts: :data:`PREFIX_MATCH`); UsageError when none or several match, or ``ident`` is
        empty (and no row's id is: a foreign journal's run of id '' is read by its id)."""
        rows = self.conn.execute(f"SELECT * FROM {table} WHERE id = ?", (ident,)).fetchall()
        if not rows and not ident:
            raise UsageError(
                f"an empty {what} id matches nothing: give a {what} id or a unique prefix of one"
            )
        if not rows:
            rows = self.conn.execute(
                f"SELECT * FROM {table} WHERE {PREFIX_MATCH} LIMIT 3", prefix_args(ident)
            ).fetchall()
        if not rows:
            raise UsageError(f"no {what} {ident!r} in journal {self.path}")
        if len(rows) > 1:
            raise UsageError(
                f"{what} id {ident!r} is ambiguous in journal {self.path}: {', '.join(r['id'] for r in rows)}"
            )
        return rows[0]

    # ------------------------------------------------------------------ runs

    @staticmethod
    def _run(row: sqlite3.Row) -> Run:
        return Run(
            id=row["id"],
            agent=row["agent"],
            agent_version=row["agent_version"],
            argv=_json(row, "argv", "runs"),
            created_ms=row["created_ms"],
            parent_run=row["parent_run"],
            boundary_step=row["boundary_step"],
            mode=row["mode"],
            labels=_json(row, "labels", "runs"),
            # a journal older than m010 read without migrating it (readers never write) has neither
            pause_transition=row["pause_transition"] if "pause_transition" in row.keys() else None,
            workspace_snapshot=row["workspace_snapshot"] if "workspace_snapshot" in row.keys() else None,
        )

    def runs(self) -> list[Run]:
        """All runs, oldest first."""
        return [self._run(r) for r in self.conn.execute("SELECT * FROM runs ORDER BY created_ms, rowid")]

    def child_runs(self, run_id: str) -> list[Run]:
        """The runs whose ``parent_run`` is ``run_id`` (the exact id), oldest first: a run's
        replays, continuations and handoffs (one query: a page of each of a thousand runs read
        the whole table a thousand times)."""
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE parent_run = ? ORDER BY created_ms, rowid", (run_id,)
        )
        return [self._run(r) for r in rows]

    def run(self, run_id: str) -> Run:
        """The run ``run_id`` (or a unique prefix of it). Raises UsageError when none or several match."""
        return self._run(self._row_by_id("runs", "run", run_id))

    def run_environment(self, run_id: str) -> dict[str, Any] | None:
        """The start environment ``pvisor run`` recorded for run ``run_id`` (the exact id): the
        ``runs.environment`` document (docs/journal.md "The start environment"), or None for a
        run that has none (a ``pvisor gateway`` capture, a run made before schema 11, a journal
        older than m011 read without migrating it). IntegrityError when it is not JSON."""
        if "environment" not in {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}:
            return None
        row = self.conn.execute("SELECT id, environment FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None or row["environment"] is None:
            return None
        return _json(row, "environment", "runs")

    def attempts(self, run_id: str) -> list[Attempt]:
        return [
            Attempt(
                run=r["run_id"],
                n=r["n"],
                started_ms=r["started_ms"],
                ended_ms=r["ended_ms"],
                exit_code=r["exit_code"],
                labels=_json(r, "labels", "attempts"),
            )
            for r in self.conn.execute("SELECT * FROM attempts WHERE run_id = ? ORDER BY n", (run_id,))
        ]

    def run_status(self, run: Run) -> str:
        """``pending`` (a handoff's child run created and never started: no attempt, no
        exchange), ``restoring`` (a handoff's child run whose workspace ``restore_handoff`` is
        still restoring, or whose restore died), ``open`` (an attempt has not ended: running, or
        its pvisor was killed; a child run's start holds it so from before its agent starts),
        ``ended`` (every attempt ended), or ``-`` (no attempt: a ``pvisor gateway`` capture)."""
        rows = self.conn.execute(
            "SELECT count(*), count(ended_ms) FROM attempts WHERE run_id = ?", (run.id,)
        ).fetchone()
        if rows[0]:
            return "ended" if rows[0] == rows[1] else "open"
        if (
            run.mode == RunMode.HANDOFF.value
            and not self.conn.execute(
                "SELECT 1 FROM exchanges WHERE run_id = ? LIMIT 1", (run.id,)
            ).fetchone()
        ):
            return "restoring" if run.labels.get(RESTORING_LABEL) == RESTORING else "pending"
        return "-"

    def run_summaries(self) -> list[dict[str, Any]]:
        """Per run: id, agent, mode, status (:meth:`run_status`), created_ms, lineage
        (parent_run, boundary_step, pause_transition, workspace_snapshot: the manifest digest a
        handoff restored), exchange count, outcome counts, bytes."""
        out = []
        for run in self.runs():
            rows = self.conn.execute(
                "SELECT COALESCE(outcome, 'in_flight') AS o, count(*) AS n, SUM(request_bytes) AS rq, "
                "SUM(bytes_received) AS rs"
                " FROM exchanges WHERE run_id = ? GROUP BY o",
                (run.id,),
            ).fetchall()
            out.append(
                {
                    "id": run.id,
                    "agent": run.agent,
                    "agent_version": run.agent_version,
                    "mode": run.mode,
                    "status": self.run_status(run),
                    "created_ms": run.created_ms,
                    "parent_run": run.parent_run,
                    "boundary_step": run.boundary_step,
                    "pause_transition": run.pause_transition,
                    "workspace_snapshot": run.workspace_snapshot,
                    "exchanges": sum(r["n"] for r in rows),
                    "outcomes": {r["o"]: r["n"] for r in rows},
                    "request_bytes": sum(r["rq"] or 0 for r in rows),
                    "response_bytes": sum(r["rs"] or 0 for r in rows),
                }
            )
        return out

    # ------------------------------------------------------------------ exchanges

    @staticmethod
    def _exchange(row: sqlite3.Row) -> Exchange:
        return Exchange(
            id=row["id"],
            run=row["run_id"],
            attempt=row["attempt"],
            seq=row["seq"],
            protocol=row["protocol"],
            method=row["method"],
            path=row["path"],
            query=row["query"],
            request_headers=_json(row, "request_headers", "exchanges"),
            secret_fingerprints=_json(row, "secret_fingerprints", "exchanges"),
            request_encoding=row["request_encoding"],
            request_body=row["request_body"],
            request_bytes=row["request_bytes"],
            status=row["status"],
            response_headers=_json(row, "response_headers", "exchanges"),
            response_body=row["response_body"],
            response_final=row["response_final"],
            streamed=bool(row["streamed"]),
            chunk_timings=row["chunk_timings"] or b"",
            outcome=row["outcome"] if row["outcome"] is not None else "in_flight",
            error=row["error"],
            started_ms=row["started_ms"],
            headers_us=row["headers_us"],
            first_byte_us=row["first_byte_us"],
            ended_us=row["ended_us"],
            bytes_received=row["bytes_received"],
            bytes_delivered=row["bytes_delivered"],
            chain=row["chain"],
            role=row["role"],
            # a journal of schema 2 read without migrating it (readers never write) has neither
            served_by=row["served_by"] if "served_by" in row.keys() else None,
            flags=tuple(orjson.loads(row["flags"])) if "flags" in row.keys() and row["flags"] else (),
            forwarded_body=row["forwarded_body"] if "forwarded_body" in row.keys() else None,
            capture=row["capture"] if "capture" in row.keys() else "reverse",
        )

    def exchanges(self, run_id: str | None = None) -> list[Exchange]:
        """Exchanges of one run in arrival order (seq), or of all runs."""
        if run_id is None:
            cur = self.conn.execute("SELECT * FROM exchanges ORDER BY run_id, seq, started_ms")
        else:
            cur = self.conn.execute(
                "SELECT * FROM exchanges WHERE run_id = ? ORDER BY seq, started_ms", (run_id,)
            )
        return [self._exchange(r) for r in cur]

    def exchange(self, exchange_id: str) -> Exchange:
        """The exchange ``exchange_id`` (or a unique prefix). Raises UsageError when none or several match."""
        return self._exchange(self._row_by_id("exchanges", "exchange", exchange_id))

    def events(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Journal events in sequence order (all, or those of one run)."""
        if run_id is None:
            cur = self.conn.execute("SELECT * FROM events ORDER BY seq")
        else:
            cur = self.conn.execute("SELECT * FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        return [{**dict(r), "data": orjson.loads(r["data"]) if r["data"] is not None else None} for r in cur]

    def has_event(self, run_id: str, kind: str) -> bool:
        """Whether run ``run_id`` has an event of ``kind`` (one indexed lookup; no event is read)."""
        return (
            self.conn.execute(
                "SELECT 1 FROM events WHERE run_id = ? AND kind = ? LIMIT 1", (run_id, kind)
            ).fetchone()
            is not None
        )

    def follow(self, run_id: str, *, poll_s: float = 0.2) -> Iterator[Exchange]:
        """The finished exchanges of run ``run_id``: those in the journal now (in arrival order),
        then each as the writer commits it (in the order they finish, read from the
        ``exchange.finished`` events every ``poll_s`` seconds). Returns when the run is over: it
        has attempts, all ended, and no exchange in flight (a bare gateway capture has no
        attempts: it is followed until the caller stops), or when it was removed (``journal rm``).
        UsageError for an unknown run."""
        run = self.run(run_id).id
        conn = self.conn
        # the events' position first: an exchange finishing meanwhile is in both, yielded once
        (last,) = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        seen: set[str] = set()
        for ex in self.exchanges(run):
            if ex.outcome is not None:
                seen.add(ex.id)
                yield ex
        while True:
            rows = conn.execute(
                "SELECT seq, exchange_id FROM events WHERE run_id = ? AND kind = 'exchange.finished'"
                " AND seq > ? ORDER BY seq",
                (run, last),
            ).fetchall()
            for seq, ex_id in rows:
                last = seq
                if ex_id not in seen:
                    row = conn.execute("SELECT * FROM exchanges WHERE id = ?", (ex_id,)).fetchone()
                    if row is not None:
                        seen.add(ex_id)
                        yield self._exchange(row)
            if not rows and (self._run_over(run) or not self.run_exists(run)):
                return
            if not rows:
                time.sleep(poll_s)

    def run_exists(self, run: str) -> bool:
        """Whether a run of exactly this id is in the journal (now: each call reads anew)."""
        return self.conn.execute("SELECT 1 FROM runs WHERE id = ?", (run,)).fetchone() is not None

    def _run_over(self, run: str) -> bool:
        attempts, open_attempts = self.conn.execute(
            "SELECT count(*), count(*) - count(ended_ms) FROM attempts WHERE run_id = ?", (run,)
        ).fetchone()
        if not attempts or open_attempts:
            return False
        in_flight = self.conn.execute(
            "SELECT 1 FROM exchanges WHERE run_id = ? AND outcome IS NULL LIMIT 1", (run,)
        ).fetchone()
        return in_flight is None

    # ------------------------------------------------------------------ workspace snapshots

    def has_snapshots_table(self) -> bool:
        return (
            self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'"
            ).fetchone()
            is not None
        )

    def snapshots(self, run_id: str) -> list[SnapshotRecord]:
        """The run's workspace snapshots in the order they were taken (``manifest`` not loaded:
        ``digest`` names its blob; :meth:`manifest` reads it). [] for a journal of schema 4
        or older."""
        from .snapshots import SnapshotKind, SnapshotRecord

        if not self.has_snapshots_table():
            return []
        rows = self.conn.execute(
            "SELECT * FROM snapshots WHERE run_id = ? ORDER BY taken_ms, rowid", (run_id,)
        ).fetchall()
        out = []
        for r in rows:
            try:
                kind = SnapshotKind(r["kind"])
            except ValueError:
                raise IntegrityError(
                    f"journal {self.path}: snapshot {r['id']} has kind {r['kind']!r}"
                ) from None
            out.append(
                SnapshotRecord(
                    id=r["id"],
                    run=r["run_id"],
                    attempt=r["attempt"],
                    kind=kind,
                    driver=r["driver"],
                    taken_ms=r["taken_ms"],
                    exchange=r["exchange_id"],
                    digest=r["manifest"],
                    walk_us=r["walk_us"] or 0,
                    entries=r["entries"],
                    files=r["files"],
                    bytes=r["bytes"],
                    read_bytes=r["read_bytes"],
                    warnings=_json(r, "warnings", "snapshots"),
                    error=r["error"],
                    after_step=r["after_step"],
                    hold_us=r["hold_us"],
                )
            )
        return out

    def manifest(self, snapshot: SnapshotRecord) -> Manifest:
        """The manifest of ``snapshot``. IntegrityError when its blob is missing or damaged,
        BadInputError when it does not read as a manifest (both name the snapshot)."""
        from .snapshots import Manifest

        if snapshot.digest is None:
            raise IntegrityError(
                f"journal {self.path}: snapshot {snapshot.id} has no manifest "
                f"({snapshot.error or 'the walk failed'})"
            )
        return Manifest.decode(self.blob(snapshot.digest), f"journal {self.path}: snapshot {snapshot.id}")

    # ------------------------------------------------------------------ blobs

    def blob(self, sha: str) -> bytes:
        """Restore the blob whose content sha256 is ``sha``, following its prefix references.

        Raises IntegrityError when the blob or a base is missing, cannot be decoded, or restores
        to bytes whose sha256 differs.
        """
        return self._blobs.restore(sha)

    def _body(self, ex: Exchange, part: str, sha: str) -> bytes:
        """A body of an exchange; its IntegrityError names the exchange and the part."""
        try:
            return self.blob(sha)
        except IntegrityError as exc:
            prefix = f"journal {self.path}: "
            detail = exc.message[len(prefix) :] if exc.message.startswith(prefix) else exc.message
            raise IntegrityError(f"{prefix}exchange {ex.id}: {part}: {detail}") from None

    def request_body(self, ex: Exchange) -> bytes | None:
        """The stored request body: decoded from its Content-Encoding, or the raw bytes when
        decoding failed (outcome ``decode_error``). None when the request had no body.
        IntegrityError (naming the exchange and blob) when it is damaged."""
        return self._body(ex, "request body", ex.request_body) if ex.request_body else None

    def forwarded_body(self, ex: Exchange) -> bytes | None:
        """The bytes forwarded upstream when they differ from the agent's request body (a
        continuation's boundary prompt or reasoning rewrite), else None. IntegrityError (naming
        the exchange and blob) when it is damaged."""
        return self._body(ex, "forwarded body", ex.forwarded_body) if ex.forwarded_body else None

    def response_body(self, ex: Exchange, *, raw: bool = False) -> bytes | None:
        """The response: with ``raw`` the bytes exactly as received (event-stream framing,
        content encoding intact); otherwise the reassembled final response when there is one,
        else the raw bytes. None when nothing was received. IntegrityError (naming the exchange
        and blob) when it is damaged."""
        if not raw and ex.response_final:
            return self._body(ex, "final response", ex.response_final)
        return self._body(ex, "response body", ex.response_body) if ex.response_body else None

    # ------------------------------------------------------------------ integrity

    def verify(self) -> VerifyReport:
        """Check SQLite integrity, that every referenced blob exists, and that every blob
        restores to bytes with its sha256. Never raises for damage: it is reported."""
        rep = VerifyReport()
        try:
            for (msg,) in self.conn.execute("PRAGMA integrity_check"):
                if msg != "ok":
                    rep.problems.append(f"sqlite integrity_check: {msg}")
        except sqlite3.DatabaseError as exc:
            rep.problems.append(f"sqlite integrity_check failed: {exc}")
            return rep
        rep.runs = self.conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        rep.exchanges = self.conn.execute("SELECT count(*) FROM exchanges").fetchone()[0]
        cols = ["request_body", "response_body", "response_final"]
        if "forwarded_body" in {r[1] for r in self.conn.execute("PRAGMA table_info(exchanges)")}:
            cols.append("forwarded_body")
        for col in cols:
            for ex_id, sha in self.conn.execute(
                f"SELECT e.id, e.{col} FROM exchanges e LEFT JOIN blobs b ON b.sha256 = e.{col}"
                f" WHERE e.{col} IS NOT NULL AND b.sha256 IS NULL"
            ):
                rep.problems.append(f"exchange {ex_id}: {col} blob {sha} is missing")
        for sha, base in self.conn.execute(
            "SELECT b.sha256, b.base FROM blobs b LEFT JOIN blobs c ON c.sha256 = b.base "
            "WHERE b.base IS NOT NULL AND c.sha256 IS NULL"
        ):
            rep.problems.append(f"blob {sha}: base blob {base} is missing")
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'snapshots'").fetchone():
            rep.problems.extend(self._snapshot_problems())
        for (ex_id,) in self.conn.execute(
            "SELECT e.id FROM exchanges e LEFT JOIN runs r ON r.id = e.run_id WHERE r.id IS NULL"
        ):
            rep.problems.append(f"exchange {ex_id}: its run is missing")
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'response_parts'").fetchone():
            # parts belong to exchanges in flight only: a finished one has its body whole
            for ex_id, outcome in self.conn.execute(
                "SELECT DISTINCT p.exchange_id, e.outcome FROM response_parts p LEFT JOIN exchanges e"
                " ON e.id = p.exchange_id WHERE e.id IS NULL OR e.outcome IS NOT NULL"
            ):
                what = (
                    "has no exchange row" if outcome is None else f"belong to a finished exchange ({outcome})"
                )
                rep.problems.append(f"response_parts of exchange {ex_id} {what}")
        for table, columns in _JSON_COLUMNS.items():
            key = "id" if table != "attempts" else "run_id || '/' || n"
            for col in columns:
                for (ident,) in self.conn.execute(f"SELECT {key} FROM {table} WHERE json_valid({col}) = 0"):
                    rep.problems.append(f"{table} {ident}: column {col} is not valid JSON")
        self._blobs.clear()
        for sha, stored in self.conn.execute(
            "SELECT sha256, length(data) FROM blobs ORDER BY rowid"
        ).fetchall():
            rep.blobs += 1
            rep.blob_bytes_stored += stored
            try:
                rep.blob_bytes_restored += len(self.blob(sha))
            except IntegrityError as exc:
                msg = str(exc).split(": ", 1)[-1]
                if msg not in rep.problems:
                    rep.problems.append(msg)
        return rep

    def _snapshot_problems(self) -> list[str]:
        """What :meth:`verify` finds wrong with the blobs the snapshots reference: a manifest
        that is missing or does not restore or parse, a file it lists (docs/journal.md
        "Workspace snapshots (format)": ``entries``, each file with its ``path`` and ``sha256``) whose
        blob is missing, each named by run, snapshot and path. Blobs that exist are restored and
        checked against their sha256 with all the others."""
        problems = []
        have = {r[0] for r in self.conn.execute("SELECT sha256 FROM blobs")}
        for run_id, snap_id, manifest in self.conn.execute(
            "SELECT run_id, id, manifest FROM snapshots WHERE manifest IS NOT NULL ORDER BY rowid"
        ).fetchall():
            where = f"run {run_id}: snapshot {snap_id}"
            if manifest not in have:
                problems.append(f"{where}: manifest blob {manifest} is missing")
                continue
            try:
                doc = orjson.loads(self.blob(manifest))
            except (IntegrityError, orjson.JSONDecodeError) as exc:
                problems.append(f"{where}: manifest blob {manifest} does not restore or parse: {exc}")
                continue
            entries = doc.get("entries") if isinstance(doc, dict) else None
            for e in entries if isinstance(entries, list) else ():
                sha = e.get("sha256") if isinstance(e, dict) else None
                if isinstance(sha, str) and sha not in have:
                    problems.append(f"{where}: file {e.get('path')!r}: blob {sha} is missing")
        return problems

    # ------------------------------------------------------------------ export

    def export_jsonl(self, out: IO[bytes], run_id: str | None = None, *, bodies: bool = True) -> int:
        """Write runs, attempts and exchanges (with bodies) as JSON Lines; return the line count.

        One object per line, with ``"type"`` ``run``, ``attempt`` or ``exchange``. A body is
        ``{"body": str}`` when it is valid UTF-8, else ``{"body_b64": str}``; one written already
        in this export (the same sha256) is ``{"ref": sha256}``, so each body is written once.
        With ``bodies=False`` ``request``, ``response`` and ``final`` are null (the exchange's
        ``request_body``, ``response_body`` and ``response_final`` still name them by sha256).
        Secrets are not in the journal, so they cannot be in the export.
        """
        written: set[str] = set()

        def field(sha: str | None, read: Any) -> dict[str, str] | None:
            if not bodies or sha is None:
                return None
            if sha in written:
                return {"ref": sha}
            written.add(sha)
            return body_json_field(read())

        runs = [self.run(run_id)] if run_id is not None else self.runs()
        n = 0
        total = self._exchange_count(runs[0].id if run_id is not None else None) if progress.active() else 0
        with progress.task("exporting", total, progress.Unit.EXCHANGES) as task:
            for run in runs:
                out.write(orjson.dumps({"type": "run", **_asdict(run)}) + b"\n")
                n += 1
                for att in self.attempts(run.id):
                    out.write(orjson.dumps({"type": "attempt", **_asdict(att)}) + b"\n")
                    n += 1
                for ex in self.exchanges(run.id):
                    d = _asdict(ex)
                    d["chunk_timings"] = [list(t) for t in unpack_timings(ex.chunk_timings)]
                    d["request"] = field(ex.request_body, lambda: self.request_body(ex))
                    d["response"] = field(ex.response_body, lambda: self.response_body(ex, raw=True))
                    d["final"] = field(ex.response_final, lambda: self.response_body(ex))
                    out.write(orjson.dumps({"type": "exchange", **d}) + b"\n")
                    n += 1
                    task.advance()
        return n

    def _exchange_count(self, run_id: str | None) -> int:
        """How many exchanges one run (or, with None, the journal) holds."""
        if run_id is None:
            return self.conn.execute("SELECT count(*) FROM exchanges").fetchone()[0]
        return self.conn.execute("SELECT count(*) FROM exchanges WHERE run_id = ?", (run_id,)).fetchone()[0]


class BlobRestorer:
    """Restores the blobs of one SQLite connection to a journal (the reader's, or one that a
    SQL tool opened: :mod:`pvisor.journal.sql`), keeping the bodies it restored last (an LRU
    of :data:`_CACHE_BYTES`): the next body of a lane is one frame away from the previous one.
    ``label`` names the journal in errors."""

    def __init__(self, conn: sqlite3.Connection, label: str) -> None:
        self.conn = conn
        self.label = label
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes = 0

    def clear(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0

    def restore(self, sha: str) -> bytes:
        """Restore the blob whose content sha256 is ``sha``, following its prefix references.

        Raises IntegrityError when the blob or a base is missing, cannot be decoded, or restores
        to bytes whose sha256 differs.
        """
        hit = self._cache.get(sha)
        if hit is not None:
            self._cache.move_to_end(sha)
            return hit
        from . import blobs  # here: zstd and hashlib load only when a body is read

        # walk down to a keyframe (or a cached body), then decode upwards; rows as plain tuples
        # (sha256, size, codec, base, data, type of data): the connection may be a SQL tool's
        chain: list[tuple] = []
        cur = sha
        base_bytes: bytes | None = None
        while True:
            cursor = self.conn.cursor()
            cursor.row_factory = None
            row = cursor.execute(
                "SELECT sha256, size, codec, base, CAST(data AS BLOB), typeof(data) "
                "FROM blobs WHERE sha256 = ?",
                (cur,),
            ).fetchone()
            if row is None:
                what = "blob" if cur == sha else f"base blob {cur} of blob"
                raise IntegrityError(f"journal {self.label}: {what} {sha} is missing")
            chain.append(row)
            if len(chain) > blobs.STANDALONE_EVERY + 2:
                raise IntegrityError(f"journal {self.label}: blob {sha} has a reference loop")
            if row[2] != "zstd-prefix":
                break
            cached = self._cache.get(row[3])
            if cached is not None:
                base_bytes = cached
                break
            cur = row[3]
        data = base_bytes
        for row_sha, size, codec, _, stored, dtype in reversed(chain):
            if dtype != "blob":
                raise IntegrityError(f"journal {self.label}: blob {row_sha} holds {dtype}, not bytes")
            try:
                data = blobs.decode(codec, stored, data if codec == "zstd-prefix" else None, size=size)
            except (ValueError, blobs.ZstdError) as exc:
                raise IntegrityError(
                    f"journal {self.label}: blob {row_sha} cannot be decoded: {exc}"
                ) from None
            if blobs.sha256_hex(data) != row_sha or len(data) != size:
                raise IntegrityError(
                    f"journal {self.label}: blob {row_sha} restores to different bytes (digest mismatch)"
                )
            self._remember(row_sha, data)
        assert data is not None
        return data

    def _remember(self, sha: str, data: bytes) -> None:
        self._cache[sha] = data
        self._cache_bytes += len(data)
        while self._cache_bytes > _CACHE_BYTES and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old)


def _asdict(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__ if name != "chunk_timings"} | (
        {"chunk_timings": obj.chunk_timings} if "chunk_timings" in obj.__slots__ else {}
    )


def body_json_field(data: bytes | None) -> dict[str, str] | None:
    if data is None:
        return None
    try:
        return {"body": data.decode("utf-8")}
    except UnicodeDecodeError:
        import base64

        return {"body_b64": base64.b64encode(data).decode()}


#: the SQL condition "id starts with the prefix", case and every character counting (LIKE would
#: ignore the case of ASCII letters: ``show SNAPRUN`` once chose the run ``snaprun``); its
#: arguments are :func:`prefix_args`. ``id >= ?`` lets SQLite start at the prefix in the index.
PREFIX_MATCH = "id >= ? AND substr(id, 1, ?) = ?"


def prefix_args(prefix: str) -> tuple[str, int, str]:
    """The arguments of :data:`PREFIX_MATCH` for ``prefix`` (SQLite's substr counts characters,
    as Python's len does)."""
    return (prefix, len(prefix), prefix)
