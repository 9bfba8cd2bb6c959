"""The producer side of a journal: the calls the gateway, importers and tests make, each of
which hands one message to a writer and returns at once (never waiting for the disk).

:class:`JournalProducer` is the interface (:class:`~pvisor.journal.writer.Journal` hands its
messages to a writer thread, :class:`~pvisor.journal.writer_process.JournalProcess` to a writer
process); the messages are those of :mod:`pvisor.journal.messages`. An exchange is begun with
:meth:`JournalProducer.begin_exchange` (a :class:`PendingExchange`, no I/O), told what it has
while in flight (:meth:`~JournalProducer.request_read`, :meth:`~JournalProducer.response_started`)
and ended once with an :class:`~pvisor.journal.exchange_end.ExchangeEnd`
(:meth:`~JournalProducer.end_exchange`; importers and tests: :meth:`~JournalProducer.finish_exchange`
with its fields as keywords, or :meth:`~JournalProducer.record_exchange`).

Typical use::

    with Journal.open(path) as journal:
        journal.create_run(Run(id="r-1", agent="codex"))
        ex = journal.begin_exchange("r-1", "POST", "/v1/responses", [("content-type", "application/json")])
        ...
        journal.finish_exchange(ex, status=200, request_body=body, response_body=raw, streamed=True)
        journal.flush()  # tests: wait until everything queued is committed
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .exchange_end import ExchangeEnd
from .messages import MessageKind
from .exchange_end import Outcome, ServedBy
from .model import Attempt, Run
from .snapshots import SnapshotRecord

#: an exchange in flight this long (s) is written as in flight (``outcome`` NULL); also the
#: writer's commit interval
COMMIT_INTERVAL_S = 0.1
#: bytes of snapshot blobs that may wait in the queue before :meth:`JournalProducer.put_blobs` waits
SNAPSHOT_QUEUE_BYTES = 64 << 20
#: seconds put_blobs waits for room at most (then it queues anyway)
BLOB_WAIT_S = 30.0


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


@dataclass(slots=True)
class PendingExchange:
    """An exchange that has begun. Made by :meth:`JournalProducer.begin_exchange`; ended by
    :meth:`JournalProducer.end_exchange`. ``started_ms`` is Unix epoch ms; ``t0`` a perf_counter value."""

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


class JournalProducer:
    """The producer side of a journal writer: the calls the gateway, importers and tests make.
    Each queues one message and returns at once (never waiting for the disk); subclasses say
    where messages go (:meth:`_put`): :class:`~pvisor.journal.writer.Journal` to its writer thread,
    :class:`pvisor.journal.writer_process.JournalProcess` to a writer process of its own."""

    path: Path
    _inflight: dict[str, PendingExchange]
    #: pids of processes this writer runs (its writer process), which a caller that ends
    #: stray processes must leave alone
    processes: tuple[int, ...] = ()
    #: where the writer runs, for people: ``thread`` or ``process PID``
    where: str = "thread"
    #: exchanges handed over by :meth:`end_exchange` (the producer's count)
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

    def _put(self, message: tuple[MessageKind, Any]) -> None:  # pragma: no cover - abstract
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
        self._put((MessageKind.RUN, run))

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Queue an update of run columns (agent, agent_version, argv, labels, mode, ...)."""
        self._put((MessageKind.RUN_UPDATE, (run_id, fields)))

    def start_attempt(self, attempt: Attempt) -> None:
        """Queue an attempt row."""
        if not attempt.started_ms:
            attempt.started_ms = now_ms()
        self._put((MessageKind.ATTEMPT, attempt))

    def end_attempt(
        self, run_id: str, n: int, exit_code: int | None, labels: dict[str, str] | None = None
    ) -> None:
        """Queue the end of an attempt (end time now, the agent's exit code, extra labels)."""
        self._put((MessageKind.ATTEMPT_END, (run_id, n, now_ms(), exit_code, labels or {})))

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
        self._put((MessageKind.EXCHANGE_ROLES, (run_id, checked)))

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
        :class:`~pvisor.journal.exchange_end.CaptureMode` value).
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

    def end_exchange(self, end: ExchangeEnd) -> None:
        """Hand over the end of the exchange ``end.pending`` (one message; the gateway's relay
        builds ``end``, :mod:`pvisor.journal.exchange_end` says every field). ``end`` is the
        writer's from now on: the caller must not change it, nor a chunk list in it. An
        ``ended_us`` of None is stamped now (µs since the exchange began)."""
        pending = end.pending
        if end.ended_us is None:
            end.ended_us = int((time.perf_counter() - pending.t0) * 1e6)
        self._inflight.pop(pending.id, None)
        self.finished += 1
        if self.error is not None:
            self.finished_after_error += 1  # the writer is gone: said when the gateway stops
        self._put((MessageKind.EXCHANGE, end))

    def finish_exchange(self, pending: PendingExchange, **fields: Any) -> None:
        """:meth:`end_exchange` of ``ExchangeEnd(pending, **fields)`` (importers, tests): the
        keywords are the fields of :class:`~pvisor.journal.exchange_end.ExchangeEnd`, where
        ``outcome`` and ``served_by`` may also be given as their strings, ``flags`` and
        ``response_headers`` as any iterable. Bodies are bytes as on the wire: the request body
        still content-encoded when ``request_encoding`` is set (decoded in the writer; failure
        makes the outcome ``decode_error`` and keeps the raw bytes), the response body raw,
        whole or as the list of its chunks.

        Raises TypeError for a keyword that is no field, ValueError for an outcome or a
        served_by that is none."""
        if "outcome" in fields:
            fields["outcome"] = Outcome(fields["outcome"])
        if fields.get("served_by") is not None:
            fields["served_by"] = ServedBy(fields["served_by"])
        if "flags" in fields:
            fields["flags"] = tuple(fields["flags"])
        if fields.get("response_headers") is not None:
            fields["response_headers"] = list(fields["response_headers"])
        self.end_exchange(ExchangeEnd(pending, **fields))

    # ------------------------------------------------------------------ workspace snapshots

    def put_blobs(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Queue ``(sha256 hex, bytes)`` pairs as blobs (one message), each stored
        standalone-compressed unless it exists; the caller computed the digests. For snapshot
        takers, in their own thread: it waits while more than :data:`SNAPSHOT_QUEUE_BYTES` of
        blobs wait to be committed, so a large first snapshot is held to that much memory;
        never call it on the event loop."""
        self._wait_blob_room(sum(len(data) for _, data in items))
        self._put((MessageKind.BLOBS, list(items)))

    def record_snapshot(self, record: SnapshotRecord) -> None:
        """Queue a snapshot row (and its manifest blob); its file blobs went by :meth:`put_blobs`
        before it, so the row is committed with them or after them."""
        self._put((MessageKind.SNAPSHOT, record))

    def set_snapshot_hold(self, snapshot_id: str, hold_us: int) -> None:
        """Queue how long the gateway held its answer's first byte for the snapshot (µs)."""
        self._put((MessageKind.SNAPSHOT_HOLD, (snapshot_id, int(hold_us))))

    def bind_snapshots(self, run_id: str, after_step: dict[str, int | None]) -> None:
        """Queue the binding of a run's snapshots to steps (snapshot id -> the step whose tools
        the workspace has seen, 0 before the first action; None: no step, an auxiliary
        request). Snapshots of the run not named keep their binding."""
        self._put((MessageKind.SNAPSHOT_BIND, (run_id, dict(after_step))))

    def record_exchange(
        self, run: str, method: str, path: str, headers: Iterable[tuple[str, str]] = (), **kw: Any
    ) -> str:
        """Begin and finish an exchange in one call (importers, tests). Returns the exchange id.
        Keyword arguments: ``query``, ``attempt``, ``protocol`` and those of :meth:`finish_exchange`."""
        begin_kw = {k: kw.pop(k) for k in ("query", "attempt", "protocol") if k in kw}
        p = self.begin_exchange(run, method, path, headers, **begin_kw)
        self.finish_exchange(p, **kw)
        return p.id


__all__ = [
    "BLOB_WAIT_S",
    "COMMIT_INTERVAL_S",
    "JournalProducer",
    "PendingExchange",
    "SNAPSHOT_QUEUE_BYTES",
    "new_exchange_id",
    "new_run_id",
    "now_ms",
]
