"""The journal writer: one thread that owns the SQLite connection and commits in batches.

Callers (the gateway's event loop, tests, importers) never wait for the disk: they hand one
message per finished exchange to a queue, and the writer thread redacts, decodes, compresses
and inserts, committing each batch within 100 ms (``BEGIN IMMEDIATE``, ``busy_timeout``,
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

import collections
import itertools
import math
import os
import queue
import secrets
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import logging

import orjson

from . import blobs
from .content_encoding import DECODED_ENCODING_HEADER, DEFAULT_LIMIT, DecodeError, decode_body, decode_prefix
from .errors import BadInputError, IntegrityError, UnavailableError, UsageError
from .model import TRUNCATED_FLAG, UNDECODABLE_FLAG, Attempt, Run, pack_timings
from .redact import (
    REQUEST_HEADER_ALLOW,
    redact_echoed_secrets,
    redact_exchange_meta,
    redact_path,
    redact_text,
    request_secrets,
)
from .paths import absolute, create_private_file
from .snapshots import SnapshotRecord

COMMIT_INTERVAL_S = 0.1
GATHER_S = 0.05  # a batch is committed at most this long after its first message arrived
LOCK_WARN_INTERVAL_S = 30.0
FINALIZE_SLICE_S = 0.02  # reassembly done per idle tick, so a new request waits at most this
#: under constant load (never idle) reassembly still follows a commit: when this many streams
#: wait, until half as many do (for FINALIZE_CATCHUP_S at most), and a slice when none was
#: reassembled for FINALIZE_EVERY_S; the backlog stays near this bound and each stream is
#: reassembled within seconds, instead of all of them at close
FINALIZE_BACKLOG = 256
FINALIZE_CATCHUP_S = 0.1
FINALIZE_EVERY_S = 1.0
#: streams waiting to be reassembled, at most: past it the oldest is left for readers
FINALIZE_QUEUE_MAX = 10_000
#: streams larger than this, on the wire or decoded (a gzip stream is decoded with this bound),
#: are not reassembled by the writer: one reassembly is a single call that holds the writer
#: (no commit meanwhile) and takes several times its size in memory, about 40-80 ms per MiB
#: (docs/journal.md); a reader reassembles them when it needs the final response
FINALIZE_MAX_BYTES = 4 << 20
#: what a compressed error body is decoded to, at most (and never past --max-response-body):
#: errors are a few hundred bytes, while a crafted one decodes to gigabytes from a few KB on the
#: wire, and the writer decodes and cleans it in one call that holds every other commit
MAX_DECODED_ERROR = 8 << 20
HEARTBEAT_INTERVAL_S = 2.0
DEAD_AFTER_MS = 60_000  # a lease not renewed for this long is dead even on another host
BUSY_TIMEOUT_MS = 5000
BATCH_MAX = 256
#: bytes of snapshot blobs that may wait in the queue before :meth:`Journal.put_blob` waits
SNAPSHOT_QUEUE_BYTES = 64 << 20
#: seconds put_blobs waits for room at most (then it queues anyway)
BLOB_WAIT_S = 30.0

#: ``finalize(protocol, streamed, decoded_response_body) -> final response JSON bytes | None``,
#: called in the writer thread while the producer is idle, at flush and at close (the gateway
#: passes the protocol modules' reassembly).
Finalizer = Callable[[str | None, bool, bytes], bytes | None]


log = logging.getLogger("pvisor.journal")


def cut_secret_prefix(body: bytes, secrets: Iterable[str]) -> bytes:
    """``body`` (an error response journaled in part, flag ``truncated``) without the start of
    a credential it ends with (8 characters or more): the cut may fall inside an echoed key,
    which the redaction of whole keys does not find."""
    for value in secrets:
        needle = value.encode("utf-8", "surrogateescape")
        for k in range(min(len(needle) - 1, len(body)), 7, -1):
            if body.endswith(needle[:k]):
                return body[:-k]
    return body


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc)
    return "locked" in msg or "busy" in msg


def new_run_id() -> str:
    """``r-`` + 12 random hex digits."""
    return "r-" + secrets.token_hex(6)


_ID_PREFIX = secrets.token_hex(4)  # per process: ids of concurrent writers never collide in practice
_id_counter = itertools.count(1)


def new_exchange_id() -> str:
    """``x-`` + 16 hex digits: 8 random per process, then a counter (no system call per id)."""
    return f"x-{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFF:08x}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _proc_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (Linux ``/proc/PID/stat`` field 22), to
    tell a live writer from a recycled pid; None where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def _pid_alive(pid: int) -> bool:
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


@dataclass(slots=True)
class PendingExchange:
    """An exchange that has begun. Made by :meth:`Journal.begin_exchange`; pass it to
    :meth:`Journal.finish_exchange`. ``started_ms`` is Unix epoch ms; ``t0`` a perf_counter value."""

    id: str
    run: str
    attempt: int
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    protocol: str | None
    started_ms: float
    t0: float
    capture: str = "reverse"  # a CaptureMode value
    persisted: bool = False
    # What the producer has so far, kept while in flight (no I/O), so that an exchange still in
    # flight after a commit window is stored with it: a crash keeps the request and the response
    # up to the last commit (Journal.request_read, Journal.response_started).
    request_body: bytes | None = None
    request_encoding: str | None = None
    status: int | None = None
    response_headers: list[tuple[str, str]] | None = None
    streamed: bool = False
    chunks: list[bytes] | None = None  # the relay's own list of the response's chunks
    delivered: int = 0  # bytes of the response the agent has been given so far
    own_chunks: bool = False  # ``chunks`` is the writer's own (a writer process's): see Journal._commit
    # How far the writer got (its thread only; in the gateway of a writer process: what was sent)
    request_stored: bool = False
    request_sha: str | None = None
    lane_pos: int | None = None
    request_error: str | None = None
    head_stored: bool = False
    parts_taken: int = 0  # chunks stored as response parts
    parts_bytes: int = 0  # their bytes: the next part's offset
    delivered_stored: int = 0  # the ``delivered`` last stored (or sent)

    def due(self, now: float) -> bool:
        """Whether the writer has something of this exchange in flight to store at ``now``
        (a perf_counter value): it began a commit window ago and is not stored as far as it got."""
        if now - self.t0 < COMMIT_INTERVAL_S:
            return False
        return (
            not self.persisted
            or (self.request_body is not None and not self.request_stored)
            or (self.status is not None and not self.head_stored)
            or (self.chunks is not None and len(self.chunks) > self.parts_taken)
            or (self.chunks is not None and self.delivered != self.delivered_stored)
        )

    def progress(self) -> tuple:
        return (self.persisted, self.request_stored, self.request_sha, self.lane_pos, self.request_error,
                self.head_stored, self.parts_taken, self.parts_bytes, self.delivered_stored)  # fmt: skip

    def restore(self, saved: tuple) -> None:
        """Back to :meth:`progress` ``saved`` (a transaction that stored more was rolled back)."""
        (self.persisted, self.request_stored, self.request_sha, self.lane_pos, self.request_error,
         self.head_stored, self.parts_taken, self.parts_bytes, self.delivered_stored) = saved  # fmt: skip


@dataclass(slots=True)
class FinishedExchange:
    """Everything the writer needs to store one exchange (the single queue message per exchange)."""

    pending: PendingExchange
    status: int | None
    response_headers: list[tuple[str, str]]
    request_body: bytes | None
    response_body: bytes | list[bytes] | None  # a list: the producer's chunks, joined by the writer only
    streamed: bool
    chunk_timings: Any  # as given to finish_exchange; packed in the writer thread
    outcome: str
    error: str | None
    headers_us: int | None
    first_byte_us: int | None
    ended_us: int
    bytes_received: int
    bytes_delivered: int
    request_encoding: str | None
    request_bytes: int
    served_by: str | None = None
    flags: tuple[str, ...] = ()
    forwarded_body: bytes | None = None
    #: the response bytes the journal keeps of this exchange (``--max-response-body``; None:
    #: the writer's ``max_decoded``): an error body is stored decoded up to this many bytes
    max_body: int | None = None


@dataclass(slots=True)
class _Lane:
    """Per (run, method, path) delta-compression state: recent body shas by lane position."""

    pos: int = -1
    last: tuple[str, bytes] | None = None  # (sha, body) at pos
    keyframes: dict[int, tuple[str, bytes]] = field(default_factory=dict)


class JournalProducer:
    """The producer side of a journal writer: the calls the gateway, importers and tests make.
    Each queues one message and returns at once (never waiting for the disk); subclasses say
    where messages go (:meth:`_put`): :class:`Journal` to its writer thread,
    :class:`pvisor.journal.writer_process.JournalProcess` to a writer process of its own."""

    path: Path
    _inflight: dict[str, PendingExchange]
    #: pids of processes this writer runs (its writer process), which a caller that ends
    #: stray processes must leave alone
    processes: tuple[int, ...] = ()
    #: where the writer runs, for people: ``thread`` or ``process PID``
    where: str = "thread"
    #: exchanges handed over by :meth:`finish_exchange` (the producer's count)
    finished: int = 0
    #: of them, those handed over once the writer had stopped (never recorded)
    finished_after_error: int = 0
    #: exchanges whose end the writer committed (its count; None while a writer process has
    #: not said it)
    recorded: int | None = 0

    @property
    def unrecorded(self) -> int:
        """Exchanges handed over whose end the writer has not committed: once a writer that
        stopped is closed, those it never will, exactly (a full disk: answered, not recorded).
        A writer process that died without saying its count: those handed over after it
        stopped, at least."""
        if self.recorded is None:
            return self.finished_after_error
        return max(0, self.finished - self.recorded)

    @property
    def error(self) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _put(self, message: tuple[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _wait_blob_room(self, size: int) -> None:  # pragma: no cover - abstract
        """Wait (in a snapshot taker's thread) while too many blob bytes wait to be written."""
        raise NotImplementedError

    def close(self, timeout: float = 60.0) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __enter__(self) -> "JournalProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ API used by producers

    def create_run(self, run: Run) -> None:
        """Queue a run row (``INSERT OR IGNORE``: an existing run keeps its row)."""
        if not run.created_ms:
            run.created_ms = now_ms()
        self._put(("run", run))

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Queue an update of run columns (agent, agent_version, argv, labels, mode, ...)."""
        self._put(("run_update", (run_id, fields)))

    def start_attempt(self, attempt: Attempt) -> None:
        """Queue an attempt row."""
        if not attempt.started_ms:
            attempt.started_ms = now_ms()
        self._put(("attempt", attempt))

    def end_attempt(
        self, run_id: str, n: int, exit_code: int | None, labels: dict[str, str] | None = None
    ) -> None:
        """Queue the end of an attempt (end time now, the agent's exit code, extra labels)."""
        self._put(("attempt_end", (run_id, n, now_ms(), exit_code, labels or {})))

    def set_exchange_roles(self, run_id: str, roles: dict[str, tuple[int | None, str]]) -> None:
        """Queue the chain rule's classification of a run's exchanges (one message, applied in
        one transaction of the writer thread): ``roles`` maps exchange id -> (chain number or
        None, ``"main"`` | ``"auxiliary"``), as returned by
        ``pvisor.adapters.chains.Classification.roles()``. Exchanges of the run not in ``roles``
        keep their columns; ids that are not exchanges of ``run_id`` are ignored and counted in
        the ``exchange.roles`` event. Call it after the exchanges have finished (:meth:`flush`):
        an exchange still in flight is rewritten when it finishes, without its role.

        Raises ValueError naming the exchange for a role or chain of the wrong kind.
        """
        checked: list[tuple[int | None, str, str]] = []
        for ex_id, value in roles.items():
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise ValueError(f"exchange {ex_id}: expected (chain, role), got {value!r}")
            chain, role = value
            if role not in ("main", "auxiliary"):
                raise ValueError(f"exchange {ex_id}: role must be 'main' or 'auxiliary', not {role!r}")
            if chain is not None and (not isinstance(chain, int) or isinstance(chain, bool) or chain < 1):
                raise ValueError(f"exchange {ex_id}: chain must be a number from 1 or None, not {chain!r}")
            checked.append((chain, role, str(ex_id)))
        self._put(("exchange_roles", (run_id, checked)))

    def begin_exchange(
        self,
        run: str,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]],
        *,
        query: str = "",
        attempt: int = 1,
        protocol: str | None = None,
        capture: str = "reverse",
    ) -> PendingExchange:
        """Register an exchange that has just arrived. Costs no I/O: the exchange lives in memory
        until it finishes, or is written as in flight at the next commit tick.

        Args: run id; HTTP method; path without query; raw request headers (secrets included:
        they are redacted in the writer thread before anything is stored); raw query string;
        attempt number; protocol module name if known; how the gateway received it (a
        :class:`~pvisor.journal.model.CaptureMode` value).
        """
        p = PendingExchange(
            id=new_exchange_id(),
            run=run,
            attempt=attempt,
            method=method,
            path=path,
            query=query,
            headers=list(headers),
            protocol=protocol,
            started_ms=time.time() * 1000.0,
            t0=time.perf_counter(),
            capture=capture,
        )
        self._inflight[p.id] = p
        return p

    def request_read(self, pending: PendingExchange, body: bytes, encoding: str | None = None) -> None:
        """The request body of ``pending`` has been read whole (bytes as on the wire, still
        ``encoding``-encoded). Costs no I/O: kept with the exchange, so that the writer stores
        it if the exchange is still in flight a commit window after it began (a crash, or a
        ``kill -9``, then keeps the request). ``finish_exchange`` still passes the body."""
        pending.request_body = body
        pending.request_encoding = encoding

    def response_started(
        self,
        pending: PendingExchange,
        status: int,
        headers: Iterable[tuple[str, str]],
        chunks: list[bytes],
        streamed: bool,
    ) -> None:
        """The response of ``pending`` has begun; ``chunks`` is the list the producer appends
        every chunk it receives to (read, never changed, by the writer). Costs no I/O. While
        the exchange is in flight the writer appends what arrived to ``response_parts`` every
        commit window, so a crash keeps the response up to the last commit. A response with a
        status of 400 or more is not kept in parts: an error may echo the request's key, and
        is cleaned of it only when whole."""
        pending.status = status
        pending.response_headers = list(headers)
        pending.streamed = streamed
        if status < 400:
            pending.chunks = chunks

    def finish_exchange(
        self,
        pending: PendingExchange,
        *,
        status: int | None,
        response_headers: Iterable[tuple[str, str]] = (),
        request_body: bytes | None = None,
        response_body: bytes | list[bytes] | None = None,
        streamed: bool = False,
        chunk_timings: Iterable[Sequence[int]] | Sequence[int] | bytes = b"",
        outcome: str = "ok",
        error: str | None = None,
        headers_us: int | None = None,
        first_byte_us: int | None = None,
        bytes_received: int | None = None,
        bytes_delivered: int | None = None,
        request_encoding: str | None = None,
        request_bytes: int | None = None,
        served_by: str | None = None,
        flags: Iterable[str] = (),
        forwarded_body: bytes | None = None,
        max_body: int | None = None,
    ) -> None:
        """Queue a finished exchange (one message). Bodies are bytes as on the wire: the request
        body still content-encoded when ``request_encoding`` is set (it is decoded in the writer;
        failure sets outcome ``decode_error`` and keeps the raw bytes), the response body raw,
        whole or as the list of its chunks (a list is never joined on the caller's thread: the
        writer process gets the chunks as they are; the caller must not change it afterwards).
        ``chunk_timings``: (µs since start, length) pairs, a flat [µs, length, µs, length, ...]
        list, or already packed bytes; packed in the writer thread.
        ``request_bytes``: the request body's size on the wire when the body itself is not
        passed (a body refused by its declared Content-Length); default its length.
        ``served_by``: who produced the response (``upstream``, ``scripted``, ``playback``,
        ``refused``; None when not known); ``flags``: strings such as ``synthetic_end``;
        ``forwarded_body``: the bytes sent upstream when a responder sent other bytes than the
        agent's (stored decoded, as a blob of its own); ``max_body``: the response bytes kept of
        one exchange (the gateway's ``--max-response-body``), which bounds an error body decoded
        (None: ``max_decoded``)."""
        ended_us = int((time.perf_counter() - pending.t0) * 1e6)
        self._inflight.pop(pending.id, None)
        self.finished += 1
        if self.error is not None:
            self.finished_after_error += 1  # the writer is gone: said when the gateway stops
        rb = 0 if response_body is None else (
            len(response_body) if isinstance(response_body, bytes) else sum(map(len, response_body))
        )  # fmt: skip
        self._put(
            (
                "exchange",
                FinishedExchange(
                    pending=pending,
                    status=status,
                    response_headers=list(response_headers),
                    request_body=request_body,
                    response_body=response_body,
                    streamed=streamed,
                    chunk_timings=chunk_timings,
                    outcome=outcome,
                    error=error,
                    headers_us=headers_us,
                    first_byte_us=first_byte_us,
                    ended_us=ended_us,
                    bytes_received=rb if bytes_received is None else bytes_received,
                    bytes_delivered=rb if bytes_delivered is None else bytes_delivered,
                    request_encoding=request_encoding,
                    request_bytes=len(request_body or b"") if request_bytes is None else request_bytes,
                    served_by=served_by,
                    flags=tuple(flags),
                    forwarded_body=forwarded_body,
                    max_body=max_body,
                ),
            )
        )

    # ------------------------------------------------------------------ workspace snapshots

    def put_blobs(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Queue ``(sha256 hex, bytes)`` pairs as blobs (one message), each stored
        standalone-compressed unless it exists; the caller computed the digests. For snapshot
        takers, in their own thread: it waits while more than :data:`SNAPSHOT_QUEUE_BYTES` of
        blobs wait to be committed, so a large first snapshot is held to that much memory;
        never call it on the event loop."""
        self._wait_blob_room(sum(len(data) for _, data in items))
        self._put(("blobs", list(items)))

    def record_snapshot(self, record: SnapshotRecord) -> None:
        """Queue a snapshot row (and its manifest blob); its file blobs went by :meth:`put_blobs`
        before it, so the row is committed with them or after them."""
        self._put(("snapshot", record))

    def set_snapshot_hold(self, snapshot_id: str, hold_us: int) -> None:
        """Queue how long the gateway held its answer's first byte for the snapshot (µs)."""
        self._put(("snapshot_hold", (snapshot_id, int(hold_us))))

    def bind_snapshots(self, run_id: str, after_step: dict[str, int | None]) -> None:
        """Queue the binding of a run's snapshots to steps (snapshot id -> the step whose tools
        the workspace has seen, 0 before the first action; None: no step, an auxiliary
        request). Snapshots of the run not named keep their binding."""
        self._put(("snapshot_bind", (run_id, dict(after_step))))

    def record_exchange(
        self, run: str, method: str, path: str, headers: Iterable[tuple[str, str]] = (), **kw: Any
    ) -> str:
        """Begin and finish an exchange in one call (importers, tests). Returns the exchange id.
        Keyword arguments: ``query``, ``attempt``, ``protocol`` and those of :meth:`finish_exchange`."""
        begin_kw = {k: kw.pop(k) for k in ("query", "attempt", "protocol") if k in kw}
        p = self.begin_exchange(run, method, path, headers, **begin_kw)
        self.finish_exchange(p, **kw)
        return p.id


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
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._put = self._queue.put
        self._inflight: dict[str, PendingExchange] = {}
        self._closed = False
        self._error: BaseException | None = None
        self.writer_id: int | None = None
        self.fingerprint_key: bytes = b""
        self.reaped: list[int] = []  # ids of dead writers whose exchanges this writer marked incomplete
        self.unreassembled = 0  # streams dropped from the reassembly queue (FINALIZE_QUEUE_MAX)
        self._abandon = False
        self._events: list[tuple] = []  # event rows of the transaction in progress
        self._last_of_run: dict[
            str, tuple
        ] = {}  # run -> (seq, started_ms, id) of its last exchange, this transaction
        self._blob_bytes = 0  # snapshot blob bytes queued, not committed (put_blob's budget)
        self._blob_room = threading.Condition()
        self._urgent = threading.Event()  # flush/close: commit now, do not wait for more messages
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pvisor-journal-writer", daemon=True)

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
        self._queue.put(("close", done))
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
        self._queue.put(("flush", done))
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
                    f"{self.path} is an SQLite database but not a pvisor journal (it has tables {', '.join(sorted(tables)[:5])}); "
                    "give --journal a new file"
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
                    f"journal {self.path} is locked by another process (waited {self.busy_timeout_ms / 1000:g} s)"
                ) from None
            raise
        except sqlite3.DatabaseError as exc:
            raise IntegrityError(f"journal {self.path} is damaged: {exc}") from None

    def _setup_schema(self, conn: sqlite3.Connection) -> None:
        from sqlite_utils import Database

        from .schema import MIGRATION_SET, apply_migrations, known_migration_names

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
                        f"journal {self.path} was written by a newer pvisor (schema {', '.join(sorted(newer))}); upgrade pvisor"
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
            self.fingerprint_key = bytes.fromhex(key)
            t = now_ms()
            cur = conn.execute(
                "INSERT INTO writers(pid, host, proc_start, started_ms, heartbeat_ms) VALUES (?, ?, ?, ?, ?)",
                (os.getpid(), socket.gethostname(), _proc_start(os.getpid()), t, t),
            )
            self.writer_id = cur.lastrowid
            self._event(conn, "writer.started", data={"pid": os.getpid()})
            self._reap_dead_writers(conn)
            self._flush_events(conn)
            conn.execute("COMMIT")
        except BaseException:
            if (
                conn.in_transaction
            ):  # a failed COMMIT (a full disk) has ended it: the cause must show, not this
                conn.execute("ROLLBACK")
            self._events.clear()
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
                dead = not _pid_alive(pid) or (pstart is not None and _proc_start(pid) != pstart)
            else:
                dead = t - heartbeat > DEAD_AFTER_MS
            if not dead:
                continue
            self._assemble_parts(conn, wid)
            n = conn.execute(
                "UPDATE exchanges SET outcome = 'incomplete', error = ? WHERE writer_id = ? AND outcome IS NULL",
                (f"writer {wid} (pid {pid}) ended while the exchange was in flight", wid),
            ).rowcount
            conn.execute("UPDATE writers SET closed_ms = ?, closed_how = 'dead' WHERE id = ?", (t, wid))
            self._event(
                conn, "writer.reaped", data={"writer": wid, "pid": pid, "exchanges_marked_incomplete": n}
            )
            self.reaped.append(wid)

    def _event(
        self,
        conn: sqlite3.Connection,
        kind: str,
        run: str | None = None,
        exchange: str | None = None,
        data: Any = None,
    ) -> None:
        """Queue an event row for the current transaction (written by :meth:`_flush_events`)."""
        self._events.append(
            (
                now_ms(),
                kind,
                run,
                exchange,
                self.writer_id,
                orjson.dumps(data).decode() if data is not None else None,
            )
        )

    def _flush_events(self, conn: sqlite3.Connection) -> None:
        if self._events:
            conn.executemany(
                "INSERT INTO events(ts_ms, kind, run_id, exchange_id, writer_id, data) VALUES (?, ?, ?, ?, ?, ?)",
                self._events,
            )
            self._events.clear()

    def _run(self) -> None:
        try:
            conn = self._connect()
            self._setup(conn)
        except BaseException as exc:  # reported to open()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._lanes: dict[tuple[str, str, str], _Lane] = {}
        self._known_runs: set[str] = set()
        self._to_finalize: collections.deque[tuple[str, str, str, str | None]] = collections.deque()
        self._last_finalize = time.monotonic()
        self._queue_unfinalized(conn)
        last_heartbeat = time.monotonic()
        batch: list[tuple[str, Any]] = []  # messages not committed yet; kept across a retry
        locked_since: float | None = None
        try:
            while True:
                if not batch:
                    try:
                        batch.append(self._queue.get(timeout=COMMIT_INTERVAL_S))
                    except queue.Empty:
                        pass
                # let messages gather for a little while, asleep (a blocked get would wake this
                # thread, and take the GIL, for every message): one transaction for many exchanges
                # costs far less writer time than one each. flush() and close() wake it at once.
                if batch and batch[-1][0] not in ("flush", "close"):
                    self._urgent.wait(GATHER_S)
                self._urgent.clear()
                while batch and len(batch) < BATCH_MAX:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                now = time.monotonic()
                beat = now - last_heartbeat >= HEARTBEAT_INTERVAL_S
                now_pc = time.perf_counter()
                stale = [p for p in list(self._inflight.values()) if p.due(now_pc)]
                if not (batch or stale or beat):
                    if (
                        self._to_finalize
                        and not self._inflight
                        and self._queue.empty()
                        and self._finalizer_ready()
                    ):
                        self._finalize_slice(conn, FINALIZE_SLICE_S)
                    continue
                closing = next((payload for kind, payload in batch if kind == "close"), None)
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
                self.recorded += sum(1 for kind, _ in batch if kind == "exchange")  # type: ignore[operator]
                self._release_blob_room(batch)
                if (
                    self._to_finalize
                    and closing is None
                    and (
                        len(self._to_finalize) >= FINALIZE_BACKLOG
                        or now - self._last_finalize >= FINALIZE_EVERY_S
                    )
                    and self._finalizer_ready()
                ):
                    # commits first: no catch-up while a full batch of messages waits
                    behind = len(self._to_finalize) >= FINALIZE_BACKLOG and self._queue.qsize() < BATCH_MAX
                    self._finalize_slice(conn, FINALIZE_CATCHUP_S if behind else FINALIZE_SLICE_S, behind)
                if closing is not None or any(kind == "flush" for kind, _ in batch):
                    self._finalize_waiting(conn, closing is not None)
                for kind, payload in batch:
                    if kind == "flush":
                        payload.set()
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
            self._error = exc
            # no count here: what is lost is also in a writer process's pipe and in its gateway's
            # queue; the producer counts it exactly (unrecorded) once it has closed the journal
            log.error("journal %s: writer stopped: %s; from now on nothing is recorded", self.path, exc)
            # release anyone waiting; later calls raise UnavailableError
            for kind, payload in batch:
                if kind in ("flush", "close"):
                    payload.set()
            while True:
                try:
                    kind, payload = self._queue.get_nowait()
                except queue.Empty:
                    break
                if kind in ("flush", "close"):
                    payload.set()
            try:
                conn.close()
            except Exception:
                pass

    def _release_blob_room(self, batch: list[tuple[str, Any]]) -> None:
        freed = sum(len(data) for kind, payload in batch if kind == "blobs" for _, data in payload)
        if freed:
            with self._blob_room:
                self._blob_bytes -= freed
                self._blob_room.notify_all()

    def _commit(
        self, conn: sqlite3.Connection, batch: list[tuple[str, Any]], stale: list[PendingExchange], beat: bool
    ) -> None:
        """Write one batch in one transaction. On failure the transaction is rolled back and the
        in-memory state it touched (compression lanes, in-flight marks) is reset, so the same
        batch can be written again."""
        conn.execute("BEGIN IMMEDIATE")
        self._last_of_run.clear()  # other writers may have added exchanges since the last transaction
        # every exchange in flight, not only the stale ones: a close writes the rest
        saved = [(p, p.progress()) for p in list(self._inflight.values())]
        try:
            for p in stale:
                self._write_inflight(conn, p)
            for kind, payload in batch:
                if kind == "close":
                    self._close_rows(conn)
                elif kind != "flush":
                    self._apply(conn, kind, payload)
            if beat:
                conn.execute("UPDATE writers SET heartbeat_ms = ? WHERE id = ?", (now_ms(), self.writer_id))
            self._flush_events(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._events.clear()
            # bodies written in the rolled-back transaction are gone: start lanes afresh
            self._lanes.clear()
            self._known_runs.clear()
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

    def _finalizer_ready(self) -> bool:
        """Whether the reassembler can run now without an import (a writer process loads it
        in the background: journal.writer_child)."""
        ready = getattr(self.finalize, "ready", None)
        return ready is None or bool(ready())

    def _finalize_slice(self, conn: sqlite3.Connection, budget_s: float, catch_up: bool = False) -> None:
        """:meth:`_finalize_pending` for ``budget_s`` (with ``catch_up``: or until half of
        :data:`FINALIZE_BACKLOG` wait); a journal locked by another process leaves the
        reassembly for a later tick."""
        try:
            self._finalize_pending(conn, budget_s, FINALIZE_BACKLOG // 2 if catch_up else 0)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise

    def _finalize_pending(self, conn: sqlite3.Connection, budget_s: float | None, leave: int = 0) -> None:
        """Reassemble queued streamed responses into their final objects (``response_final``),
        oldest first, for at most ``budget_s`` seconds (None: all) and while more than ``leave``
        wait. Each is read back from its blob, so the queue holds ids, not bodies. Runs while
        the producer is idle, at flush and at close, and under constant load after a commit
        when the backlog reaches :data:`FINALIZE_BACKLOG` or none ran for
        :data:`FINALIZE_EVERY_S`: reassembly is CPU work that competes with a thread writer's
        event loop for the GIL, so it waits for idle time where it can, but never without
        bound."""
        self._last_finalize = time.monotonic()
        if not self._to_finalize:
            return
        deadline = None if budget_s is None else time.monotonic() + budget_s
        conn.execute("BEGIN IMMEDIATE")
        try:
            while len(self._to_finalize) > leave and (deadline is None or time.monotonic() < deadline):
                ex_id, protocol, sha, encoding = self._to_finalize[0]
                row = conn.execute("SELECT codec, data, size FROM blobs WHERE sha256 = ?", (sha,)).fetchone()
                final = None
                if row is not None:
                    try:
                        raw = blobs.decode(row[0], row[1], size=row[2])
                        if encoding:
                            raw = decode_body(raw, encoding, limit=FINALIZE_MAX_BYTES)
                        final = self.finalize(protocol, True, raw)
                    except DecodeError:
                        pass  # over FINALIZE_MAX_BYTES decoded, or corrupt: left to readers
                    except Exception as exc:  # a reassembly failure must not lose the exchange
                        log.warning(
                            "journal %s: exchange %s: response reassembly failed: %s",
                            self.path,
                            ex_id,
                            type(exc).__name__,
                        )
                if final is not None:
                    conn.execute(
                        "UPDATE exchanges SET response_final = ? WHERE id = ?",
                        (self._put_blob(conn, final), ex_id),
                    )
                self._to_finalize.popleft()
            self._flush_events(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._events.clear()
            raise

    def _finalize_waiting(self, conn: sqlite3.Connection, closing: bool) -> None:
        """:meth:`_finalize_pending` of everything (flush, close), waiting while another process
        holds the write lock (a warning every :data:`LOCK_WARN_INTERVAL_S`), as a commit does:
        a lock must never stop the writer. An abandoned close leaves the reassembly to the next
        writer (it queues what is not reassembled)."""
        warned: float | None = None
        while True:
            try:
                self._finalize_pending(conn, None)
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                if closing and self._abandon:
                    return
                now = time.monotonic()
                if warned is None or now - warned >= LOCK_WARN_INTERVAL_S:
                    log.warning(
                        "journal %s is locked by another process; %d response(s) wait to be reassembled, retrying",
                        self.path,
                        len(self._to_finalize),
                    )
                    warned = now

    def _queue_unfinalized(self, conn: sqlite3.Connection) -> None:
        """Streamed responses a previous writer recorded but did not reassemble (it died, or
        ran without a reassembler): queue them, newest 10,000 at most."""
        if self.finalize is None:
            return
        rows = conn.execute(
            "SELECT id, protocol, response_body, response_headers FROM exchanges WHERE streamed = 1 AND response_final IS NULL"
            " AND response_body IS NOT NULL AND protocol IS NOT NULL AND outcome IS NOT NULL"
            f" AND bytes_received <= {FINALIZE_MAX_BYTES}"
            f" AND flags NOT LIKE '%\"{TRUNCATED_FLAG}\"%' ORDER BY rowid DESC LIMIT 10000"
        ).fetchall()
        for ex_id, protocol, sha, headers in reversed(rows):
            try:
                enc = orjson.loads(headers).get("content-encoding")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            self._to_finalize.append((ex_id, protocol, sha, enc))

    def _close_rows(self, conn: sqlite3.Connection) -> None:
        if self.unreassembled:
            log.warning(
                "journal %s: %d streamed response(s) were not reassembled (the writer fell behind "
                "under load); readers reassemble them when they need them",
                self.path,
                self.unreassembled,
            )
            self._event(conn, "reassembly.skipped", data={"streams": self.unreassembled})
        for p in list(self._inflight.values()):
            if p.due(math.inf):
                self._write_inflight(conn, p)
        self._assemble_parts(conn, self.writer_id)
        conn.execute(
            "UPDATE exchanges SET outcome = 'incomplete', error = 'gateway stopped while the exchange was in flight'"
            " WHERE writer_id = ? AND outcome IS NULL",
            (self.writer_id,),
        )
        conn.execute(
            "UPDATE writers SET closed_ms = ?, closed_how = 'closed' WHERE id = ?", (now_ms(), self.writer_id)
        )
        self._event(conn, "writer.closed")

    # ------------------------------------------------------------------ row writers (writer thread)

    def _ensure_run(self, conn: sqlite3.Connection, run: str) -> None:
        if run in self._known_runs:
            return
        cur = conn.execute("INSERT OR IGNORE INTO runs(id, created_ms) VALUES (?, ?)", (run, now_ms()))
        if cur.rowcount:
            self._event(conn, "run.created", run=run)
        self._known_runs.add(run)

    def _apply(self, conn: sqlite3.Connection, kind: str, payload: Any) -> None:
        if kind == "exchange":
            self._write_exchange(conn, payload)
        elif kind == "run":
            r: Run = payload
            cur = conn.execute(
                "INSERT OR IGNORE INTO runs(id, agent, agent_version, argv, created_ms, parent_run, "
                "boundary_step, mode, labels, pause_transition, workspace_snapshot) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r.id,
                    r.agent,
                    r.agent_version,
                    orjson.dumps(r.argv).decode(),
                    r.created_ms,
                    r.parent_run,
                    r.boundary_step,
                    r.mode,
                    orjson.dumps(r.labels).decode(),
                    r.pause_transition,
                    r.workspace_snapshot,
                ),
            )
            if cur.rowcount:
                self._event(conn, "run.created", run=r.id, data={"agent": r.agent, "mode": r.mode})
        elif kind == "run_update":
            run_id, fields = payload
            self._ensure_run(conn, run_id)
            allowed = {"agent", "agent_version", "argv", "parent_run", "boundary_step", "mode", "labels"}
            sets, args = [], []
            for k, v in fields.items():
                if k not in allowed:
                    raise ValueError(f"unknown run field {k!r}")
                if k == "labels":
                    old = conn.execute("SELECT labels FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
                    v = {**orjson.loads(old), **v}
                sets.append(f"{k} = ?")
                args.append(orjson.dumps(v).decode() if k in ("argv", "labels") else v)
            if sets:
                conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?", (*args, run_id))
                self._event(conn, "run.updated", run=run_id, data=sorted(fields))
        elif kind == "exchange_roles":
            run_id, rows = payload
            changed = 0
            for chain, role, ex_id in rows:
                changed += conn.execute(
                    "UPDATE exchanges SET chain = ?, role = ? WHERE id = ? AND run_id = ?",
                    (chain, role, ex_id, run_id),
                ).rowcount
            counts = {
                "main": sum(1 for r in rows if r[1] == "main"),
                "auxiliary": sum(1 for r in rows if r[1] == "auxiliary"),
                "unknown": len(rows) - changed,
            }
            if counts["unknown"]:
                log.warning(
                    "journal %s: run %s: %d exchange id(s) given roles are not exchanges of the run",
                    self.path,
                    run_id,
                    counts["unknown"],
                )
            self._event(conn, "exchange.roles", run=run_id, data=counts)
        elif kind == "blobs":
            for sha, data in payload:
                self._put_blob(conn, data, sha=sha)
        elif kind == "snapshot":
            self._write_snapshot(conn, payload)
        elif kind == "snapshot_hold":
            conn.execute("UPDATE snapshots SET hold_us = ? WHERE id = ?", (payload[1], payload[0]))
        elif kind == "snapshot_bind":
            run_id, binding = payload
            for snap_id, step in binding.items():
                conn.execute(
                    "UPDATE snapshots SET after_step = ? WHERE id = ? AND run_id = ?", (step, snap_id, run_id)
                )
            self._event(conn, "snapshot.bound", run=run_id, data={"snapshots": len(binding)})
        elif kind == "attempt":
            a: Attempt = payload
            self._ensure_run(conn, a.run)
            conn.execute(
                "INSERT OR REPLACE INTO attempts(run_id, n, started_ms, ended_ms, exit_code, labels) VALUES (?, ?, ?, ?, ?, ?)",
                (a.run, a.n, a.started_ms, a.ended_ms, a.exit_code, orjson.dumps(a.labels).decode()),
            )
            self._event(conn, "attempt.started", run=a.run, data={"attempt": a.n})
        elif kind == "attempt_end":
            run_id, n, ended, code, labels = payload
            old = conn.execute(
                "SELECT labels FROM attempts WHERE run_id = ? AND n = ?", (run_id, n)
            ).fetchone()
            merged = {**(orjson.loads(old[0]) if old else {}), **labels}
            if old is None:
                self._ensure_run(conn, run_id)
                conn.execute(
                    "INSERT INTO attempts(run_id, n, started_ms, ended_ms, exit_code, labels) VALUES (?, ?, ?, ?, ?, ?)",
                    (run_id, n, ended, ended, code, orjson.dumps(merged).decode()),
                )
            else:
                conn.execute(
                    "UPDATE attempts SET ended_ms = ?, exit_code = ?, labels = ? WHERE run_id = ? AND n = ?",
                    (ended, code, orjson.dumps(merged).decode(), run_id, n),
                )
            self._event(conn, "attempt.ended", run=run_id, data={"attempt": n, "exit_code": code})
        else:  # pragma: no cover - programming error
            raise ValueError(f"unknown journal message {kind!r}")

    @staticmethod
    def _credentials(p: PendingExchange) -> set[str]:
        """The credentials ``p``'s request carried (:func:`request_secrets`): never stored, and
        redacted from whatever of the exchange repeats them (response headers, the coding)."""
        return request_secrets(p.query, p.headers, p.path)

    def _meta_columns(self, p: PendingExchange) -> tuple:
        red = redact_exchange_meta(p.query, p.headers, self.fingerprint_key, allow=REQUEST_HEADER_ALLOW)
        return (
            red.query,
            orjson.dumps(red.headers).decode(),
            orjson.dumps(red.secrets).decode(),
            orjson.dumps(red.dropped).decode(),
        )

    def _place(self, conn: sqlite3.Connection, p: PendingExchange) -> int:
        """The ``seq`` of ``p`` in its run: its rank by arrival (``started_ms``, then id) among
        the run's exchanges. A row already written keeps its seq; a new one shifts the rows that
        arrived after it, so seq stays dense and in arrival order even when several writers
        (gateways) share a run, or a long exchange finishes after later ones."""
        if p.persisted:  # written in flight earlier: keeps its seq
            row = conn.execute("SELECT seq FROM exchanges WHERE id = ?", (p.id,)).fetchone()
            if row is not None:
                return row[0]
        last = self._last_of_run.get(p.run)  # valid within this transaction only
        if last is None:
            last = conn.execute(
                "SELECT seq, started_ms, id FROM exchanges WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                (p.run,),
            ).fetchone()
        if last is None:
            self._last_of_run[p.run] = (1, p.started_ms, p.id)
            return 1
        if (last[1], last[2]) < (p.started_ms, p.id):
            # the usual case: it arrived after every exchange written so far
            self._last_of_run[p.run] = (last[0] + 1, p.started_ms, p.id)
            return last[0] + 1
        later = conn.execute(
            "SELECT count(*) FROM exchanges WHERE run_id = ? AND (started_ms > ? OR (started_ms = ? AND id > ?))",
            (p.run, p.started_ms, p.started_ms, p.id),
        ).fetchone()[0]
        seq = last[0] - later + 1
        conn.execute("UPDATE exchanges SET seq = seq + 1 WHERE run_id = ? AND seq >= ?", (p.run, seq))
        self._last_of_run[p.run] = (last[0] + 1, last[1], last[2])
        return seq

    def _write_inflight(self, conn: sqlite3.Connection, p: PendingExchange) -> None:
        """Store what exchange ``p`` in flight has that is not stored yet: its row (outcome
        NULL), its request body once read, its response head, the response bytes received
        since the last commit (one ``response_parts`` row)."""
        if not p.persisted:
            self._ensure_run(conn, p.run)
            query, headers, fps, dropped = self._meta_columns(p)
            conn.execute(
                "INSERT OR IGNORE INTO exchanges(id, run_id, attempt, seq, protocol, method, path, query, request_headers,"
                " secret_fingerprints, dropped_headers, started_ms, writer_id, capture, outcome)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL)",
                (
                    p.id,
                    p.run,
                    p.attempt,
                    self._place(conn, p),
                    p.protocol,
                    p.method,
                    redact_path(p.path),
                    query,
                    headers,
                    fps,
                    dropped,
                    p.started_ms,
                    self.writer_id,
                    p.capture,
                ),
            )
            self._event(conn, "exchange.started", run=p.run, exchange=p.id)
            p.persisted = True
        if p.request_body is not None and not p.request_stored:
            p.request_sha, p.lane_pos, p.request_error = self._request_blob(
                conn, p, p.request_body, p.request_encoding
            )
            conn.execute(
                "UPDATE exchanges SET request_body = ?, request_bytes = ?, request_encoding = ?, lane_pos = ? WHERE id = ?",
                (
                    p.request_sha,
                    len(p.request_body),
                    redact_text(p.request_encoding, self._credentials(p)) if p.request_encoding else None,
                    p.lane_pos,
                    p.id,
                ),
            )
            p.request_stored = True
        if p.status is not None and not p.head_stored:
            red = redact_exchange_meta(
                "",
                p.response_headers or [],
                self.fingerprint_key,
                allow=None,
                credentials=self._credentials(p),
            )
            conn.execute(
                "UPDATE exchanges SET status = ?, response_headers = ?, streamed = ? WHERE id = ?",
                (p.status, orjson.dumps(red.headers).decode(), 1 if p.streamed else 0, p.id),
            )
            p.head_stored = True
        chunks = p.chunks
        if chunks is not None and len(chunks) > p.parts_taken:
            n = len(chunks)  # the producer may append meanwhile: what is past n waits for the next commit
            data = b"".join(chunks[p.parts_taken : n])
            conn.execute(
                "INSERT OR REPLACE INTO response_parts(exchange_id, offset, data) VALUES (?, ?, ?)",
                (p.id, p.parts_bytes, data),
            )
            p.parts_taken, p.parts_bytes = n, p.parts_bytes + len(data)
        if chunks is not None and (p.parts_bytes or p.delivered != p.delivered_stored):
            delivered = min(p.delivered, p.parts_bytes)
            conn.execute(
                "UPDATE exchanges SET bytes_received = ?, bytes_delivered = ? WHERE id = ?",
                (p.parts_bytes, delivered, p.id),
            )
            p.delivered_stored = p.delivered

    def _request_blob(
        self, conn: sqlite3.Connection, p: PendingExchange, body: bytes, encoding: str | None
    ) -> tuple[str, int | None, str | None]:
        """Store a request body: decoded when ``encoding`` is set, in the lane of its run and
        path. Returns (sha256, lane position, decode error): a body that does not decode is
        stored raw, outside the lane, with the reason."""
        if encoding:
            try:
                body = decode_body(body, encoding, limit=self.max_decoded)
            except DecodeError as exc:
                return self._put_blob(conn, body), None, str(exc)
        sha, pos = self._put_request_body(conn, p, body)
        return sha, pos, None

    def _redacted_error(
        self, body: bytes, headers: dict[str, str], p: PendingExchange, limit: int
    ) -> tuple[bytes, tuple[str, ...]]:
        """An error response ``body`` cleaned of the credentials of ``p``'s request, and the flags
        it adds. A body received with a ``Content-Encoding`` (the SDKs ask for gzip, br, zstd) is
        decoded first, streaming and at most ``limit`` bytes (the exchange's
        ``--max-response-body``) or :data:`MAX_DECODED_ERROR`, and stored decoded: ``headers``
        (the stored response headers, changed in place) then record the coding as
        ``pvisor-decoded-content-encoding`` instead of ``content-encoding``. The decoded start
        is kept when the rest is cut at ``limit`` or
        does not decode (a cut or corrupt stream): flag ``truncated``. A body none of which
        decodes (an unknown coding, a wrong label) is never kept as it came (a key in it would
        be hidden by the coding): the stored body is empty, flag ``undecodable_dropped``."""
        flags: tuple[str, ...] = ()
        encoding = headers.get("content-encoding")
        if encoding and encoding.strip().lower() != "identity":
            headers[DECODED_ENCODING_HEADER] = headers.pop("content-encoding")
            try:
                body, whole = decode_prefix(body, encoding, limit=min(limit, MAX_DECODED_ERROR))
            except DecodeError:
                return b"", (UNDECODABLE_FLAG,)
            if not whole:
                flags = (TRUNCATED_FLAG,)
        elif len(body) > limit:
            body, flags = body[:limit], (TRUNCATED_FLAG,)
        body = redact_echoed_secrets(body, p.query, p.headers, p.path)
        if flags:
            body = cut_secret_prefix(body, request_secrets(p.query, p.headers, p.path))
        return body, flags

    def _assemble_parts(self, conn: sqlite3.Connection, writer_id: int) -> None:
        """Join the response parts of ``writer_id``'s exchanges still in flight into their
        ``response_body`` (they are about to be marked ``incomplete``) and remove the parts."""
        ids = [r[0] for r in conn.execute(
            "SELECT DISTINCT p.exchange_id FROM response_parts p JOIN exchanges e ON e.id = p.exchange_id"
            " WHERE e.writer_id = ? AND e.outcome IS NULL", (writer_id,))]  # fmt: skip
        for ex_id in ids:
            data = b"".join(r[0] for r in conn.execute(
                "SELECT data FROM response_parts WHERE exchange_id = ? ORDER BY offset", (ex_id,)))  # fmt: skip
            conn.execute(
                "UPDATE exchanges SET response_body = ?, bytes_received = ? WHERE id = ?",
                (self._put_blob(conn, data), len(data), ex_id),
            )
            conn.execute("DELETE FROM response_parts WHERE exchange_id = ?", (ex_id,))

    def _put_blob(
        self,
        conn: sqlite3.Connection,
        data: bytes,
        base: tuple[str, bytes] | None = None,
        sha: str | None = None,
    ) -> str:
        sha = sha or blobs.sha256_hex(data)
        if conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)).fetchone() is None:
            if base is not None and base[0] == sha:
                base = None
            codec, stored = blobs.encode(data, base[1] if base else None)
            conn.execute(
                "INSERT INTO blobs(sha256, size, codec, base, data) VALUES (?, ?, ?, ?, ?)",
                (sha, len(data), codec, base[0] if codec == "zstd-prefix" else None, stored),
            )
        return sha

    def _put_request_body(self, conn: sqlite3.Connection, p: PendingExchange, body: bytes) -> tuple[str, int]:
        return self._put_lane_blob(conn, (p.run, p.method, p.path), body)

    def _put_lane_blob(
        self, conn: sqlite3.Connection, key: tuple[str, str, str], body: bytes, sha: str | None = None
    ) -> tuple[str, int]:
        """Store ``body`` compressed against an earlier body of its lane ``key`` (a run's
        requests to one path, or its snapshot manifests; the reference ``blobs.reference_position``
        picks keeps chains short): a body that repeats the last one with a little more costs
        little. ``sha``: the body's sha256 when the caller has it (a snapshot manifest's digest)."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        pos = lane.pos + 1
        ref = blobs.reference_position(pos)
        if ref is None:
            base = None
        elif ref == pos - 1:
            base = lane.last
        else:
            base = lane.keyframes.get(ref)
        sha = self._put_blob(conn, body, base, sha=sha)
        lane.pos = pos
        lane.last = (sha, body)
        if pos % blobs.KEYFRAME_EVERY == 0:
            # keep only what the next keyframe references
            lane.keyframes = {pos: (sha, body)}
        return sha, pos

    def _write_snapshot(self, conn: sqlite3.Connection, r: SnapshotRecord) -> None:
        self._ensure_run(conn, r.run)
        manifest = None
        if r.manifest is not None:
            # each manifest repeats the last one but for what changed: stored as a delta
            manifest, _ = self._put_lane_blob(conn, (r.run, "SNAPSHOT", "manifest"), r.manifest, r.digest)
        conn.execute(
            "INSERT OR REPLACE INTO snapshots(id, run_id, attempt, kind, exchange_id, driver, manifest, taken_ms, walk_us,"
            " entries, files, bytes, read_bytes, warnings, error, after_step, writer_id)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                r.id,
                r.run,
                r.attempt,
                r.kind.value,
                r.exchange,
                r.driver,
                manifest,
                r.taken_ms,
                r.walk_us,
                r.entries,
                r.files,
                r.bytes,
                r.read_bytes,
                orjson.dumps(r.warnings).decode(),
                r.error,
                r.after_step,
                self.writer_id,
            ),
        )
        self._event(
            conn,
            "snapshot.taken",
            run=r.run,
            exchange=r.exchange,
            data={"snapshot": r.id, "kind": r.kind.value, "manifest": manifest, "error": r.error},
        )

    def _write_exchange(self, conn: sqlite3.Connection, f: FinishedExchange) -> None:
        p = f.pending
        self._ensure_run(conn, p.run)
        outcome, error = f.outcome, f.error
        request_sha = None
        lane_pos = None
        if f.request_body is not None:
            if p.request_stored and (f.request_body is p.request_body or f.request_body == p.request_body):
                # stored while in flight: the same bytes are not stored (nor their lane moved) twice
                request_sha, lane_pos, decode_error = p.request_sha, p.lane_pos, p.request_error
            else:
                request_sha, lane_pos, decode_error = self._request_blob(
                    conn, p, f.request_body, f.request_encoding
                )
            if decode_error is not None:
                if outcome == "ok":
                    outcome = "decode_error"
                error = error or f"request body: {decode_error}"
        forwarded_sha = self._put_blob(conn, f.forwarded_body) if f.forwarded_body is not None else None
        response_sha = None
        resp_headers = redact_exchange_meta(
            "", f.response_headers, self.fingerprint_key, allow=None, credentials=self._credentials(p)
        )
        if f.response_body is not None:
            if isinstance(f.response_body, list):
                f.response_body = b"".join(f.response_body)
                p.chunks = None  # the chunks go now: the body is never held twice for long
            body = f.response_body
            if f.status is not None and f.status >= 400 and body:
                # an error may echo the key the request carried ("invalid key sk-..."): never kept
                limit = self.max_decoded if f.max_body is None else min(f.max_body, self.max_decoded)
                body, added = self._redacted_error(body, resp_headers.headers, p, limit)
                if TRUNCATED_FLAG in f.flags:
                    body = cut_secret_prefix(body, request_secrets(p.query, p.headers, p.path))
                f.flags = (*f.flags, *(a for a in added if a not in f.flags))
            response_sha = self._put_blob(conn, body)
            if (
                self.finalize is not None
                and f.streamed
                and body
                and p.protocol is not None
                and TRUNCATED_FLAG not in f.flags  # the reply is not whole: readers reassemble what there is
                and len(f.response_body) <= FINALIZE_MAX_BYTES
            ):
                # reassembly holds the GIL for milliseconds: done when the gateway is idle
                if len(self._to_finalize) >= FINALIZE_QUEUE_MAX:
                    # the writer fell that far behind: the oldest is left to readers (and to the
                    # next writer, which queues what it finds unreassembled); said at close
                    self._to_finalize.popleft()
                    self.unreassembled += 1
                self._to_finalize.append(
                    (p.id, p.protocol, response_sha, resp_headers.headers.get("content-encoding"))
                )
        query, headers, fps, dropped = self._meta_columns(p)
        if error:  # an error text may quote the URL or an upstream's echo of the key
            error = redact_text(error, request_secrets(p.query, p.headers, p.path))
        fps_all = orjson.loads(fps)
        fps_all.update({"response:" + k: v for k, v in resp_headers.secrets.items()})
        conn.execute(
            "INSERT OR REPLACE INTO exchanges(id, run_id, attempt, seq, protocol, method, path, query, request_headers,"
            " secret_fingerprints, dropped_headers, request_encoding, request_body, request_bytes, status, response_headers,"
            " response_body, response_final, streamed, chunk_timings, outcome, error, started_ms, headers_us, first_byte_us,"
            " ended_us, bytes_received, bytes_delivered, writer_id, lane_pos, served_by, flags, forwarded_body, capture)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                p.id,
                p.run,
                p.attempt,
                self._place(conn, p),
                p.protocol,
                p.method,
                redact_path(p.path),
                query,
                headers,
                orjson.dumps(fps_all).decode(),
                dropped,
                # a key sent as the Content-Encoding value is not stored in clear either
                redact_text(f.request_encoding, self._credentials(p)) if f.request_encoding else None,
                request_sha,
                f.request_bytes,
                f.status,
                orjson.dumps(resp_headers.headers).decode(),
                response_sha,
                None,
                1 if f.streamed else 0,
                pack_timings(f.chunk_timings) or None,
                outcome,
                error,
                p.started_ms,
                f.headers_us,
                f.first_byte_us,
                f.ended_us,
                f.bytes_received,
                f.bytes_delivered,
                self.writer_id,
                lane_pos,
                f.served_by,
                orjson.dumps(list(f.flags)).decode(),
                forwarded_sha,
                p.capture,
            ),
        )
        if p.parts_taken:
            conn.execute("DELETE FROM response_parts WHERE exchange_id = ?", (p.id,))  # whole now
        self._event(
            conn, "exchange.finished", run=p.run, exchange=p.id, data={"outcome": outcome, "status": f.status}
        )
