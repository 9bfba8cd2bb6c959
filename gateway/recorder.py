"""The recorder: the one place where the gateway's exchanges go into the journal.

Every answer, whoever gave it (:class:`~pvisor.gateway.responder.ServedBy`), is recorded the
same way: :meth:`Recorder.begin` when the request's head arrives (no I/O), :meth:`Recorder.request_read`
and :meth:`Recorder.response_started` as the exchange goes on (no I/O either: what an exchange
in flight has is stored every commit window), then exactly one :meth:`Recorder.finish` with
what was moved, the outcome, ``served_by`` and the answer's flags.
The journal writer thread redacts secrets, decodes, compresses and stores off the event loop;
the optional log file gets one line per exchange (secrets redacted from the URL).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pvisor.journal.model import CaptureMode
from pvisor.journal.redact import redact_text, redact_url
from pvisor.journal.writer import Journal, PendingExchange

from .responder import ServedBy
from .routing import Route

if TYPE_CHECKING:
    from .snapshots import PendingSnapshot


@dataclass(slots=True)
class Current:
    """What one request handler has so far, so that an exchange cut short (cancelled at
    shutdown, or an internal error) is still recorded with it."""

    pending: PendingExchange | None = None
    route: Route | None = None
    body: bytes | None = None
    body_size: int | None = None  # size on the wire when the body was refused unread (413)
    encoding: str | None = None
    started: bool = False  # the response head went out: no other answer is possible
    recorded: bool = False
    served_by: ServedBy = ServedBy.REFUSED
    flags: tuple[str, ...] = ()
    forwarded: bytes | None = None  # a responder's own body sent upstream instead of the agent's
    snapshot: PendingSnapshot | None = None  # the workspace walk the answer's first byte waits for
    held: int = 0  # response bytes kept for the journal, counted in the gateway's ResponseBudget


class ResponseBudget:
    """How many response bytes the gateway keeps for the journal: at most ``per_exchange``
    (``--max-response-body``) for one exchange and ``total`` across the exchanges in flight
    (docs/gateway.md, "Response size"). Bytes past either are relayed to the agent, never
    kept: the exchange is journaled up to there and flagged ``truncated``. Used on the event
    loop only (no lock)."""

    def __init__(self, per_exchange: int, total: int):
        self.per_exchange = per_exchange
        self.total = total
        self.held = 0  # bytes kept by the exchanges in flight

    def take(self, cur: Current, n: int) -> int:
        """How many of ``n`` more bytes exchange ``cur`` may keep (all, some or none); they
        count against both bounds until :meth:`release`."""
        room = min(n, self.per_exchange - cur.held, self.total - self.held)
        if room <= 0:
            return 0
        cur.held += room
        self.held += room
        return room

    def release(self, cur: Current) -> None:
        """The exchange of ``cur`` went to the journal writer: its bytes no longer count."""
        self.held -= cur.held
        cur.held = 0


def size_of(body: bytes | list[bytes] | None) -> int:
    """Bytes of a body given whole or as a list of chunks."""
    if body is None:
        return 0
    return len(body) if isinstance(body, (bytes, bytearray)) else sum(len(c) for c in body)


def us_since(pending: PendingExchange) -> int:
    """Microseconds since the exchange began."""
    return int((time.perf_counter() - pending.t0) * 1e6)


class Recorder:
    """Journals the exchanges of one gateway. ``journal`` may be set after construction (``pvisor
    run`` opens it once the port is bound); ``log`` is the gateway's own logger (no handler: no
    log file)."""

    def __init__(self, journal: Journal | None, log: logging.Logger, max_body: int | None = None):
        self.journal = journal
        self.log = log
        self.max_body = max_body  # --max-response-body: the writer decodes an error body up to it

    def begin(
        self,
        cur: Current,
        route: Route,
        method: str,
        headers: list[tuple[str, str]],
        attempt: int,
        capture: CaptureMode = CaptureMode.REVERSE,
    ) -> PendingExchange:
        """Register the exchange of ``cur`` (its request head has arrived; ``capture``: how)."""
        assert self.journal is not None
        cur.route = route
        cur.pending = self.journal.begin_exchange(
            route.run,
            method,
            route.path,
            headers,
            query=route.query,
            protocol=route.protocol,
            attempt=attempt,
            capture=capture.value,
        )
        return cur.pending

    def request_read(self, cur: Current) -> None:
        """The request body of ``cur`` has been read whole: handed to the journal with the
        exchange in flight (no I/O), which stores it if the exchange is still in flight after a
        commit window, so that a crash keeps the request."""
        assert cur.pending is not None and self.journal is not None
        self.journal.request_read(cur.pending, cur.body or b"", cur.encoding)

    def response_started(
        self, cur: Current, status: int, headers: list[tuple[str, str]], chunks: list[bytes], streamed: bool
    ) -> None:
        """The answer's head went out; ``chunks`` is the relay's list of what it received: the
        journal stores what it holds every commit window while the exchange is in flight."""
        assert cur.pending is not None and self.journal is not None
        self.journal.response_started(cur.pending, status, headers, chunks, streamed)

    def finish(
        self,
        cur: Current,
        status: int | None,
        outcome: str,
        error: str | None,
        request_body: bytes | None = None,
        response_headers: list[tuple[str, str]] | None = None,
        response_body: bytes | list[bytes] | None = None,
        streamed: bool = False,
        timings: list[int] | None = None,
        headers_us: int | None = None,
        first_byte_us: int | None = None,
        received: int | None = None,
        delivered: int | None = None,
    ) -> None:
        """Queue the exchange of ``cur`` for the journal, once (later calls do nothing).
        ``timings`` is the flat (µs since start, chunk length) list; ``response_body`` the bytes
        or the relay's list of chunks (never joined here: the writer gets the chunks as they
        are); ``served_by``, ``flags`` and the forwarded body (when a responder sent other
        bytes upstream) come from ``cur``."""
        pending, route = cur.pending, cur.route
        assert pending is not None and route is not None and self.journal is not None
        if cur.recorded:
            return
        cur.recorded = True
        self.journal.finish_exchange(
            pending,
            status=status,
            response_headers=response_headers or (),
            request_body=request_body,
            response_body=response_body,
            streamed=streamed,
            chunk_timings=timings or (),
            outcome=outcome,
            error=error,
            headers_us=headers_us,
            first_byte_us=first_byte_us,
            bytes_received=received,
            bytes_delivered=delivered,
            request_encoding=cur.encoding,
            request_bytes=cur.body_size,
            served_by=cur.served_by.value,
            flags=cur.flags,
            forwarded_body=cur.forwarded,
            max_body=self.max_body,
        )
        if self.log.handlers:
            target = route.path + ("?" + route.query if route.query else "")
            self.log.info(
                "%s %s %s %s %s %s %s %s req=%dB resp=%sB %.1fms%s",
                route.run,
                pending.id,
                pending.method,
                redact_url(target),
                status if status is not None else "-",
                outcome,
                "stream" if streamed else "-",
                cur.served_by.value,
                cur.body_size if cur.body_size is not None else len(request_body or b""),
                received if received is not None else size_of(response_body),
                us_since(pending) / 1000,
                f" error={redact_text(error)}" if error else "",
            )
