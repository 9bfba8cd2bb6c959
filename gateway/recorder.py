"""The recorder: the one place where the gateway's exchanges go into the journal.

Every answer, whoever gave it (:class:`~pvisor.journal.exchange_end.ServedBy`), is recorded the
same way: :meth:`Recorder.begin` when the request's head arrives (no I/O), :meth:`Recorder.request_read`
and :meth:`Recorder.response_started` as the exchange goes on (no I/O either: what an exchange
in flight has is stored every commit window), then exactly one :meth:`Recorder.finish` with
the exchange's :class:`~pvisor.journal.exchange_end.ExchangeEnd`, which the relay filled in
(what was moved, the outcome, ``served_by``, the answer's flags) and which goes to the journal
as it is.
The journal writer thread redacts secrets, decodes, compresses and stores off the event loop;
the optional log file gets one line per exchange (secrets redacted from the URL).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pvisor.journal.exchange_end import ExchangeEnd
from pvisor.journal.exchange_end import CaptureMode
from pvisor.journal.producer import JournalProducer, PendingExchange
from pvisor.journal.redact import redact_text, redact_url

from .routing import Route

if TYPE_CHECKING:
    from .snapshots import PendingSnapshot


@dataclass(slots=True)
class Current:
    """What one request handler has so far, so that an exchange cut short (cancelled at
    shutdown, or an internal error) is still recorded with it: ``end`` is the exchange's
    end as far as it is known (made when the exchange begins, None before), the other fields
    the handler's own state."""

    end: ExchangeEnd | None = None
    route: Route | None = None
    started: bool = False  # the response head went out: no other answer is possible
    recorded: bool = False
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


def us_since(pending: PendingExchange) -> int:
    """Microseconds since the exchange began."""
    return int((time.perf_counter() - pending.t0) * 1e6)


class Recorder:
    """Journals the exchanges of one gateway. ``journal`` may be set after construction (``pvisor
    run`` opens it once the port is bound); ``log`` is the gateway's own logger (no handler: no
    log file)."""

    def __init__(self, journal: JournalProducer | None, log: logging.Logger):
        self.journal = journal
        self.log = log

    def begin(
        self,
        route: Route,
        method: str,
        headers: list[tuple[str, str]],
        attempt: int,
        capture: CaptureMode = CaptureMode.REVERSE,
    ) -> PendingExchange:
        """Register the exchange whose request head has arrived on ``route`` (``capture``: how)."""
        assert self.journal is not None
        return self.journal.begin_exchange(
            route.run,
            method,
            route.path,
            headers,
            query=route.query,
            protocol=route.protocol,
            attempt=attempt,
            capture=capture.value,
        )

    def request_read(self, end: ExchangeEnd) -> None:
        """The request body of ``end`` has been read whole: handed to the journal with the
        exchange in flight (no I/O), which stores it if the exchange is still in flight after a
        commit window, so that a crash keeps the request."""
        assert self.journal is not None
        self.journal.request_read(end.pending, end.request_body or b"", end.request_encoding)

    def response_started(
        self,
        end: ExchangeEnd,
        status: int,
        headers: list[tuple[str, str]],
        chunks: list[bytes],
        streamed: bool,
    ) -> None:
        """The answer's head went out; ``chunks`` is the relay's list of what it received: the
        journal stores what it holds every commit window while the exchange is in flight."""
        assert self.journal is not None
        self.journal.response_started(end.pending, status, headers, chunks, streamed)

    def finish(self, cur: Current) -> None:
        """Hand the exchange's end (``cur.end``, as the relay made it) to the journal, once
        (later calls do nothing), and log one line of it."""
        end, route = cur.end, cur.route
        assert end is not None and route is not None and self.journal is not None
        if cur.recorded:
            return
        cur.recorded = True
        self.journal.end_exchange(end)
        if self.log.handlers:
            pending = end.pending
            target = route.path + ("?" + route.query if route.query else "")
            self.log.info(
                "%s %s %s %s %s %s %s %s req=%dB resp=%sB %.1fms%s",
                route.run,
                pending.id,
                pending.method,
                redact_url(target),
                end.status if end.status is not None else "-",
                end.outcome.value,
                "stream" if end.streamed else "-",
                end.served_by.value if end.served_by is not None else "-",
                end.request_bytes if end.request_bytes is not None else len(end.request_body or b""),
                end.bytes_received if end.bytes_received is not None else end.response_size(),
                us_since(pending) / 1000,
                f" error={redact_text(end.error)}" if end.error else "",
            )
