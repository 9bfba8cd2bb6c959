"""The journal writer: one thread that owns the SQLite connection and commits in batches.

Callers (the gateway's event loop, tests, importers) never wait for the disk: they make the
producer calls of :class:`~pvisor.journal.producer.JournalProducer`, each of which hands one
message (:mod:`pvisor.journal.messages`) to a queue, and the writer thread redacts, decodes,
compresses and inserts (:mod:`pvisor.journal.rows`: one row writer per message kind), committing each
batch within 100 ms (``BEGIN IMMEDIATE``, ``busy_timeout``,
``synchronous=NORMAL`` in WAL mode). An exchange still in flight after a commit tick is written
as a row with ``outcome`` NULL, so that if this process dies, the next writer finds its lease
row (pid, host, start, heartbeat) dead and marks those rows ``incomplete``.

Typical use::

    with Journal.open(path) as journal:
        journal.create_run(Run(id="r-1", agent="codex"))
        ex = journal.begin_exchange("r-1", "POST", "/v1/responses", [("content-type", "application/json")])
        ...
        journal.finish_exchange(ex, status=200, request_body=body, response_body=raw, streamed=True)
        journal.flush()  # tests: wait until everything queued is committed
"""

from __future__ import annotations

import math
import os
import queue
import secrets
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

import logging

from sqlite_utils import Database

from .content_encoding import DEFAULT_LIMIT
from pvisor.core.errors import BadInputError, IntegrityError, UnavailableError, UsageError
from .messages import URGENT, MessageKind, unknown_message
from .paths import absolute, create_private_file
from .producer import (
    BLOB_WAIT_S,
    COMMIT_INTERVAL_S,
    SNAPSHOT_QUEUE_BYTES,
    JournalProducer,
    PendingExchange,
    now_ms,
)
from .reassembly import FINALIZE_CATCHUP_S, FINALIZE_SLICE_S, Finalizer, Reassembly
from .rows import Rows
from .schema import MIGRATION_SET, apply_migrations, known_migration_names

GATHER_S = 0.05  # a batch is committed at most this long after its first message arrived
LOCK_WARN_INTERVAL_S = 30.0
HEARTBEAT_INTERVAL_S = 2.0
DEAD_AFTER_MS = 60_000  # a lease not renewed for this long is dead even on another host
BUSY_TIMEOUT_MS = 5000
BATCH_MAX = 256

log = logging.getLogger("pvisor.journal")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc)
    return "locked" in msg or "busy" in msg


def proc_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (Linux ``/proc/PID/stat`` field 22), to
    tell a live writer from a recycled pid; None where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process. A zombie is not: a writer killed while its parent
    died too stays one for good where nothing reaps orphans (a container whose pid 1 does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


class Journal(JournalProducer):
    """The write side of an Event Journal file. Thread-safe to call from any thread; all SQLite
    work happens in one writer thread. Open with :meth:`open`; close with :meth:`close` (or use
    it as a context manager).

    Raises:
        UnavailableError: the file is locked by others past the busy timeout, or cannot be opened.
        BadInputError: the file exists but is not an SQLite database.
    """

    def __init__(
        self,
        path: Path,
        *,
        finalize: Finalizer | None = None,
        max_decoded: int = DEFAULT_LIMIT,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ):
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.finalize = finalize
        self.max_decoded = max_decoded
        self.reassembly = Reassembly(self.path, finalize, lambda conn, data: self.rows.put_blob(conn, data))
        self.rows = Rows(self.path, max_decoded, self.reassembly)
        #: what the writer thread does with each message kind
        self._apply: dict[MessageKind, Callable[[sqlite3.Connection, Any], None]] = {
            **self.rows.handlers(),
            MessageKind.FLUSH: _nothing,  # it only asks for the commit (its event is set after it)
            MessageKind.CLOSE: self._close_rows,
        }
        if set(self._apply) != set(MessageKind):  # pragma: no cover - programming error
            raise unknown_message(sorted(set(MessageKind) - set(self._apply)))
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._put = self._queue.put
        self._inflight: dict[str, PendingExchange] = {}
        self._closed = False
        self._error: BaseException | None = None
        self.reaped: list[int] = []  # ids of dead writers whose exchanges this writer marked incomplete
        self._abandon = False
        self._blob_bytes = 0  # snapshot blob bytes queued, not committed (put_blob's budget)
        self._blob_room = threading.Condition()
        self._urgent = threading.Event()  # flush/close: commit now, do not wait for more messages
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pvisor-journal-writer", daemon=True)

    @property
    def writer_id(self) -> int | None:
        """The writer's lease row (``writers.id``), once it holds the lease."""
        return self.rows.writer_id

    @property
    def fingerprint_key(self) -> bytes:
        """The journal's key of secret fingerprints (``meta.fingerprint_key``), once open."""
        return self.rows.fingerprint_key

    @property
    def inflight(self) -> dict[str, PendingExchange]:
        """The exchanges begun and not finished, by id: the writer thread writes each as a row
        with ``outcome`` NULL after a commit tick (the writer child keeps its copies of the
        gateway's here, :func:`~pvisor.journal.writer_wire.apply_inflight`)."""
        return self._inflight

    def put_message(self, message: tuple[MessageKind, Any]) -> None:
        """Hand one message (:mod:`pvisor.journal.messages`) to the writer thread as it is: the
        writer child's way for the messages the gateway's producer made."""
        self._put(message)

    def wait_stopped(self) -> None:
        """Block until the writer thread ends: at :meth:`close`, or when it failed (:attr:`error`)."""
        self._thread.join()

    @property
    def unreassembled(self) -> int:
        """Streams dropped from the reassembly queue (``FINALIZE_QUEUE_MAX``), left to readers."""
        return self.reassembly.skipped

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, path: str | os.PathLike, **kwargs: Any) -> "Journal":
        """Create or open the journal at ``path``, migrate its schema, take a writer lease and
        start the writer thread. Returns when the writer is ready."""
        journal = cls(Path(path), **kwargs)
        journal._thread.start()
        journal._ready.wait()
        if journal._error is not None:
            journal._thread.join()
            raise journal._error
        return journal

    def close(self, timeout: float = 60.0) -> None:
        """Commit everything queued, mark exchanges still in flight ``incomplete``, release the
        lease and checkpoint the WAL. Idempotent. If the journal stays locked by another process
        for ``timeout`` seconds, give up: what is still queued is lost, and an error is logged."""
        if self._closed:
            return
        self._closed = True
        if self._error is not None or not self._thread.is_alive():
            return  # the writer already stopped (and logged what it could not record)
        done = threading.Event()
        self._queue.put((MessageKind.CLOSE, done))
        self._urgent.set()
        if not done.wait(timeout):
            self._abandon = True
            done.wait(self.busy_timeout_ms / 1000 + 5)
        self._thread.join(self.busy_timeout_ms / 1000 + 5)

    @property
    def error(self) -> str | None:
        """Why the writer thread stopped (it then records nothing more), or None while it works."""
        return None if self._error is None else f"{type(self._error).__name__}: {self._error}"

    def flush(self, timeout: float = 30.0) -> None:
        """Block until every message queued before this call is committed (for tests and
        commands; the gateway's hot path never calls it)."""
        self._raise_if_failed()
        done = threading.Event()
        self._queue.put((MessageKind.FLUSH, done))
        self._urgent.set()
        if not done.wait(timeout):
            raise UnavailableError(f"journal {self.path}: writer did not commit within {timeout:.0f} s")
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise UnavailableError(f"journal {self.path}: writer stopped: {self._error}")

    def _wait_blob_room(self, size: int) -> None:
        deadline = time.monotonic() + BLOB_WAIT_S
        with self._blob_room:
            while self._blob_bytes > SNAPSHOT_QUEUE_BYTES and self._error is None and not self._closed:
                if time.monotonic() > deadline:
                    # the writer cannot commit (another process holds the journal's lock): go on
                    # in memory rather than hold the walk, and the gateway's stop, for ever
                    log.warning(
                        "journal %s: %d bytes of snapshot blobs wait to be written",
                        self.path,
                        self._blob_bytes,
                    )
                    break
                self._urgent.set()
                self._blob_room.wait(0.5)
            self._blob_bytes += size

    # ------------------------------------------------------------------ writer thread

    def _connect(self) -> sqlite3.Connection:
        absolute(self.path, f"journal {self.path}")  # a relative path in a deleted directory: say so
        if self.path.is_dir():
            raise UsageError(f"journal {self.path} is a directory; give a file path")
        try:
            create_private_file(self.path)
        except OSError as exc:
            raise UnavailableError(f"cannot create journal {self.path}: {exc.strerror}") from None
        if not os.access(self.path, os.R_OK | os.W_OK) or not os.access(self.path.parent, os.W_OK | os.X_OK):
            raise UnavailableError(
                f"journal {self.path} is not writable (the file and its directory must be, for the WAL)"
            )
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            # before anything writes (even the switch to WAL): refuse someone else's database
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                )
            }
            if tables and "runs" not in tables:
                conn.close()
                raise BadInputError(
                    f"{self.path} is an SQLite database but not a pvisor journal "
                    f"(it has tables {', '.join(sorted(tables)[:5])}); give --journal a new file"
                )
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc):
                raise BadInputError(f"{self.path} is not a pvisor journal (not an SQLite database)") from None
            if "malformed" in str(exc):
                raise IntegrityError(f"journal {self.path} is damaged: {exc}") from None
            raise UnavailableError(f"cannot open journal {self.path}: {exc}") from None
        if mode.lower() != "wal":
            conn.close()
            raise UnavailableError(f"journal {self.path}: cannot switch to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = OFF")
        return conn

    def _setup(self, conn: sqlite3.Connection) -> None:
        try:
            self._setup_schema(conn)
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc):
                raise UnavailableError(f"journal {self.path} is read-only: {exc}") from None
            if "disk is full" in str(exc):
                raise UnavailableError(
                    f"journal {self.path}: cannot open: no room on its file system ({exc})"
                ) from None
            if _is_busy(exc):
                raise UnavailableError(
                    f"journal {self.path} is locked by another process "
                    f"(waited {self.busy_timeout_ms / 1000:g} s)"
                ) from None
            raise
        except sqlite3.DatabaseError as exc:
            raise IntegrityError(f"journal {self.path} is damaged: {exc}") from None

    def _setup_schema(self, conn: sqlite3.Connection) -> None:
        db = Database(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            known = set(known_migration_names())
            if "_sqlite_migrations" in tables:
                applied = {
                    r[0]
                    for r in conn.execute(
                        "SELECT name FROM _sqlite_migrations WHERE migration_set = ?", (MIGRATION_SET,)
                    )
                }
                newer = applied - known
                if newer:
                    raise BadInputError(
                        f"journal {self.path} was written by a newer pvisor "
                        f"(schema {', '.join(sorted(newer))}); upgrade pvisor"
                    )
            apply_migrations(db)
            row = conn.execute("SELECT value FROM meta WHERE key = 'fingerprint_key'").fetchone()
            if row is None:
                key = secrets.token_hex(32)
                conn.executemany(
                    "INSERT INTO meta(key, value) VALUES (?, ?)",
                    [
                        ("fingerprint_key", key),
                        ("journal_id", "j-" + secrets.token_hex(8)),
                        ("created_ms", str(now_ms())),
                    ],
                )
            else:
                key = row[0]
            self.rows.fingerprint_key = bytes.fromhex(key)
            t = now_ms()
            cur = conn.execute(
                "INSERT INTO writers(pid, host, proc_start, started_ms, heartbeat_ms) VALUES (?, ?, ?, ?, ?)",
                (os.getpid(), socket.gethostname(), proc_start(os.getpid()), t, t),
            )
            self.rows.writer_id = cur.lastrowid
            self.rows.event(conn, "writer.started", data={"pid": os.getpid()})
            self._reap_dead_writers(conn)
            self.rows.flush_events(conn)
            conn.execute("COMMIT")
        except BaseException:
            if (
                conn.in_transaction
            ):  # a failed COMMIT (a full disk) has ended it: the cause must show, not this
                conn.execute("ROLLBACK")
            self.rows.events.clear()
            raise

    def _reap_dead_writers(self, conn: sqlite3.Connection) -> None:
        host = socket.gethostname()
        t = now_ms()
        rows = conn.execute(
            "SELECT id, pid, host, proc_start, heartbeat_ms FROM writers WHERE closed_ms IS NULL AND id != ?",
            (self.writer_id,),
        ).fetchall()
        for wid, pid, whost, pstart, heartbeat in rows:
            if whost == host:
                dead = not pid_alive(pid) or (pstart is not None and proc_start(pid) != pstart)
            else:
                dead = t - heartbeat > DEAD_AFTER_MS
            if not dead:
                continue
            self.rows.assemble_parts(conn, wid)
            n = conn.execute(
                "UPDATE exchanges SET outcome = 'incomplete', error = ?"
                " WHERE writer_id = ? AND outcome IS NULL",
                (f"writer {wid} (pid {pid}) ended while the exchange was in flight", wid),
            ).rowcount
            conn.execute("UPDATE writers SET closed_ms = ?, closed_how = 'dead' WHERE id = ?", (t, wid))
            self.rows.event(
                conn, "writer.reaped", data={"writer": wid, "pid": pid, "exchanges_marked_incomplete": n}
            )
            self.reaped.append(wid)

    def _run(self) -> None:
        try:
            conn = self._connect()
            self._setup(conn)
        except BaseException as exc:  # reported to open()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.reassembly.last = time.monotonic()
        self.reassembly.load_unfinished(conn)
        last_heartbeat = time.monotonic()
        batch: list[tuple[MessageKind, Any]] = []  # messages not committed yet; kept across a retry
        locked_since: float | None = None
        try:
            while True:
                self._gather(batch)
                now = time.monotonic()
                beat = now - last_heartbeat >= HEARTBEAT_INTERVAL_S
                now_pc = time.perf_counter()
                stale = [p for p in list(self._inflight.values()) if p.due(now_pc)]
                if not (batch or stale or beat):
                    if (
                        self.reassembly.queue
                        and not self._inflight
                        and self._queue.empty()
                        and self.reassembly.ready()
                    ):
                        self._reassemble_slice(conn, FINALIZE_SLICE_S)
                    continue
                closing = next((payload for kind, payload in batch if kind is MessageKind.CLOSE), None)
                try:
                    self._commit(conn, batch, stale, beat)
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc) or (closing is not None and self._abandon):
                        raise
                    # another process holds the write lock past busy_timeout: keep everything
                    # in memory and try again
                    if locked_since is None or now - locked_since >= LOCK_WARN_INTERVAL_S:
                        log.warning(
                            "journal %s is locked by another process; %d message(s) wait in memory, retrying",
                            self.path,
                            len(batch),
                        )
                        locked_since = now
                    continue
                if locked_since is not None:
                    log.warning("journal %s is writable again; the waiting messages are committed", self.path)
                    locked_since = None
                if beat:
                    last_heartbeat = now
                self._committed(conn, batch, closing is not None, now)
                batch = []
                if closing is not None:
                    try:
                        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    except sqlite3.OperationalError:
                        pass  # another connection is reading; the checkpoint happens later
                    conn.close()
                    closing.set()
                    return
        except BaseException as exc:
            self._stopped(conn, batch, exc)

    def _gather(self, batch: list[tuple[MessageKind, Any]]) -> None:
        """Add the next messages to ``batch``: one waited for (at most COMMIT_INTERVAL_S) when
        it is empty, then those that arrive within GATHER_S, up to BATCH_MAX."""
        if not batch:
            try:
                batch.append(self._queue.get(timeout=COMMIT_INTERVAL_S))
            except queue.Empty:
                pass
        # let messages gather for a little while, asleep (a blocked get would wake this
        # thread, and take the GIL, for every message): one transaction for many exchanges
        # costs far less writer time than one each. flush() and close() wake it at once.
        if batch and batch[-1][0] not in URGENT:
            self._urgent.wait(GATHER_S)
        self._urgent.clear()
        while batch and len(batch) < BATCH_MAX:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break

    def _committed(
        self, conn: sqlite3.Connection, batch: list[tuple[MessageKind, Any]], closing: bool, now: float
    ) -> None:
        """After ``batch`` was committed: count its exchanges, free its snapshot blobs' room,
        reassemble (a slice when due, all of it at a flush or at close) and wake the flushes."""
        ended = sum(1 for kind, _ in batch if kind is MessageKind.EXCHANGE)
        self.recorded += ended  # type: ignore[operator]
        self._release_blob_room(batch)
        if not closing and self.reassembly.due(now):
            # commits first: no catch-up while a full batch of messages waits
            behind = self.reassembly.behind and self._queue.qsize() < BATCH_MAX
            self._reassemble_slice(conn, FINALIZE_CATCHUP_S if behind else FINALIZE_SLICE_S, behind)
        if closing or any(kind is MessageKind.FLUSH for kind, _ in batch):
            self._reassemble_all(conn, closing)
        for kind, payload in batch:
            if kind is MessageKind.FLUSH:
                payload.set()

    def _stopped(
        self, conn: sqlite3.Connection, batch: list[tuple[MessageKind, Any]], exc: BaseException
    ) -> None:
        """The writer thread failed with ``exc``: say so once, and release everyone waiting for
        a flush or a close (later calls raise UnavailableError)."""
        self._error = exc
        # no count here: what is lost is also in a writer process's pipe and in its gateway's
        # queue; the producer counts it exactly (unrecorded) once it has closed the journal
        log.error("journal %s: writer stopped: %s; from now on nothing is recorded", self.path, exc)
        for kind, payload in batch:
            if kind in URGENT:
                payload.set()
        while True:
            try:
                kind, payload = self._queue.get_nowait()
            except queue.Empty:
                break
            if kind in URGENT:
                payload.set()
        try:
            conn.close()
        except Exception:
            pass

    def _release_blob_room(self, batch: list[tuple[MessageKind, Any]]) -> None:
        freed = sum(len(data) for kind, payload in batch if kind is MessageKind.BLOBS for _, data in payload)
        if freed:
            with self._blob_room:
                self._blob_bytes -= freed
                self._blob_room.notify_all()

    def _commit(
        self,
        conn: sqlite3.Connection,
        batch: list[tuple[MessageKind, Any]],
        stale: list[PendingExchange],
        beat: bool,
    ) -> None:
        """Write one batch in one transaction. On failure the transaction is rolled back and the
        in-memory state it touched (compression lanes, in-flight marks) is reset, so the same
        batch can be written again."""
        conn.execute("BEGIN IMMEDIATE")
        self.rows.new_transaction()
        # every exchange in flight, not only the stale ones: a close writes the rest
        saved = [(p, p.progress()) for p in list(self._inflight.values())]
        try:
            for p in stale:
                self.rows.write_inflight(conn, p)
            for kind, payload in batch:
                apply = self._apply.get(kind)
                if apply is None:
                    raise unknown_message(kind)
                apply(conn, payload)
            if beat:
                conn.execute("UPDATE writers SET heartbeat_ms = ? WHERE id = ?", (now_ms(), self.writer_id))
            self.rows.flush_events(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            # bodies written in the rolled-back transaction are gone: start lanes afresh
            self.rows.reset()
            for p, progress in saved:
                p.restore(progress)
            raise
        for p in stale:
            chunks = p.chunks
            if p.own_chunks and chunks is not None:
                # committed into response_parts: a writer process need not hold them too (one
                # part per commit window, so this list stays short); a thread writer's list is
                # the gateway's own, which hands it over whole when the exchange ends
                for i in range(min(p.parts_taken, len(chunks))):
                    chunks[i] = b""

    def _reassemble_slice(self, conn: sqlite3.Connection, budget_s: float, catch_up: bool = False) -> None:
        """:meth:`Reassembly.run` for ``budget_s``; a journal locked by another process leaves
        the reassembly for a later tick."""
        try:
            self.reassembly.run(conn, budget_s, catch_up)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise

    def _reassemble_all(self, conn: sqlite3.Connection, closing: bool) -> None:
        """:meth:`Reassembly.run` of everything (flush, close), waiting while another process
        holds the write lock (a warning every :data:`LOCK_WARN_INTERVAL_S`), as a commit does:
        a lock must never stop the writer. An abandoned close leaves the reassembly to the next
        writer (it queues what is not reassembled)."""
        warned: float | None = None
        while True:
            try:
                self.reassembly.run(conn, None)
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                if closing and self._abandon:
                    return
                now = time.monotonic()
                if warned is None or now - warned >= LOCK_WARN_INTERVAL_S:
                    log.warning(
                        "journal %s is locked by another process; %d response(s) wait to be reassembled, "
                        "retrying",
                        self.path,
                        len(self.reassembly.queue),
                    )
                    warned = now

    def _close_rows(self, conn: sqlite3.Connection, payload: Any = None) -> None:
        if self.unreassembled:
            log.warning(
                "journal %s: %d streamed response(s) were not reassembled (the writer fell behind "
                "under load); readers reassemble them when they need them",
                self.path,
                self.unreassembled,
            )
            self.rows.event(conn, "reassembly.skipped", data={"streams": self.unreassembled})
        for p in list(self._inflight.values()):
            if p.due(math.inf):
                self.rows.write_inflight(conn, p)
        self.rows.assemble_parts(conn, self.writer_id)
        conn.execute(
            "UPDATE exchanges SET outcome = 'incomplete',"
            " error = 'gateway stopped while the exchange was in flight'"
            " WHERE writer_id = ? AND outcome IS NULL",
            (self.writer_id,),
        )
        conn.execute(
            "UPDATE writers SET closed_ms = ?, closed_how = 'closed' WHERE id = ?", (now_ms(), self.writer_id)
        )
        self.rows.event(conn, "writer.closed")


def _nothing(conn: sqlite3.Connection, payload: Any) -> None:
    """A flush: nothing to write."""
