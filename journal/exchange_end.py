"""The end of one exchange: everything the gateway's relay knows of it when it ends, in one record.

An :class:`ExchangeEnd` is built by the relay (``gateway/proxy.py``) as the exchange goes on and
handed over once it ended: unchanged to the recorder (``gateway/recorder.py``), to the journal's
producer (:meth:`~pvisor.journal.producer.JournalProducer.end_exchange`), over the writer wire
to a writer process (:func:`pvisor.journal.writer_wire.encode_exchange`, a flat tuple) and to
the writer thread, which makes the ``exchanges`` row from it (:mod:`pvisor.journal.rows`).
A new column of an exchange's end is one field here, one item of the wire's tuple and one
value of the row.

Fields (docs/journal.md, "exchanges", gives the columns they become):

``pending``
    The exchange's start (:class:`~pvisor.journal.producer.PendingExchange`): its id, run,
    method, path, headers and start time, and what was handed over while it was in flight
    (the request body once read, the response's head and bytes). A writer process got it
    early, in the ``inflight`` message sent as the request was read: the end then names it by
    its id, and does not send a request body that went then (``SENT_IN_FLIGHT``).
``status``
    The HTTP status the agent got (the upstream's, or the gateway's own), None when no
    response began.
``outcome``
    How it ended, an :class:`Outcome`. The writer turns ``OK`` into
    ``DECODE_ERROR`` when the request body does not decode (the row's outcome).
``error``
    One line on what went wrong, or None; secrets are redacted from it in the writer.
``request_body``, ``request_encoding``, ``request_bytes``
    The request body as received (still ``request_encoding``-encoded: the writer decodes it),
    or None; its ``Content-Encoding``; its size on the wire when the body was refused unread
    (413: ``--max-body``), None for the body's length.
``response_headers``
    The response headers as sent to the agent, secrets included (redacted in the writer).
``response_body``
    The response bytes kept for the journal: ``bytes``, or the relay's list of chunks, never
    joined on the event loop (the writer joins it; a writer process gets the chunks as one
    body on the wire). The writer keeps the joined bytes in this field (the same bytes, held
    once, not twice).
``streamed``
    The response was an event stream.
``chunk_timings``
    (µs since the start, chunk length in bytes) of every chunk kept: a flat
    ``[µs, length, µs, length, ...]`` list, pairs, or bytes already packed
    (:func:`~pvisor.journal.model.pack_timings`, done in the writer).
``headers_us``, ``first_byte_us``, ``ended_us``
    µs after the start when the answer's head was there, when its first body byte came, and
    when the exchange ended (None: not reached).
``bytes_received``, ``bytes_delivered``
    Response bytes read from the upstream (or the responder) and written to the agent; None
    for the size of ``response_body``.
``served_by``
    Who produced the answer, a :class:`ServedBy` (None: not known).
``flags``
    The exchange's flags: the answer's (``synthetic_end``, ...), ``truncated`` when the
    response was kept only in part (``--max-response-body``, the response budget); the writer
    adds ``truncated`` or ``undecodable_dropped`` to the row for an error body it could not keep
    whole (the record's own flags stay as the relay gave them).
``forwarded_body``
    The bytes sent upstream when a responder sent other bytes than the agent's, or None.
``max_body``
    The response bytes the journal keeps of one exchange (``--max-response-body``), which also
    bounds an error body decoded; None: the writer's own bound.

This module imports nothing of pvisor's but :mod:`.record` and :mod:`.model`. It defines the
enums of an exchange's end, :class:`Outcome` and :class:`ServedBy`.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import TYPE_CHECKING, Any

from .model import TRUNCATED_FLAG
from pvisor.core.record import Record, record

if TYPE_CHECKING:
    from .producer import PendingExchange


# the enums of an exchange's end live here, not in the model: the model is on every short
# command's path, these only on the gateway's and the writer's
class Outcome(str, enum.Enum):
    """How an exchange ended (``exchanges.outcome``; docs/gateway.md, "Failure handling").
    Readers show a row still in flight (outcome NULL) as ``in_flight``, which is no value of
    this enum: nothing ever writes it."""

    OK = "ok"  #: the exchange completed; the upstream status may still be an error (see UPSTREAM_ERROR)
    UPSTREAM_ERROR = "upstream_error"  #: the upstream answered with HTTP status >= 400, passed on unchanged
    UPSTREAM_RESET = "upstream_reset"  #: the upstream connection broke before or during the response
    UPSTREAM_UNREACHABLE = "upstream_unreachable"  #: no connection to the upstream could be made
    ABORTED_BY_CLIENT = "aborted_by_client"  #: the agent went away before the response ended
    OVERSIZE = "oversize"  #: the request body exceeded the gateway's --max-body
    DECODE_ERROR = "decode_error"  #: the request's Content-Encoding could not be undone; raw bytes kept
    INCOMPLETE = "incomplete"  #: the gateway or the writer stopped while the exchange was in flight


#: the values of :class:`Outcome`, in its order
OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)


class CaptureMode(str, enum.Enum):
    """How the gateway received an exchange (``exchanges.capture``; docs/gateway.md)."""

    REVERSE = "reverse"  #: the agent sent it to the gateway's URL (a base-URL override)
    INTERCEPT = "intercept"  #: sent to the model API's host, through intercept mode's forward proxy


class ServedBy(str, enum.Enum):
    """Who produced the bytes the agent got (``exchanges.served_by``)."""

    UPSTREAM = "upstream"  #: a model API (or any server) the gateway forwarded to
    SCRIPTED = "scripted"  #: the scripted model, in process
    PLAYBACK = "playback"  #: replay's playback: a recorded or rendered action
    REFUSED = "refused"  #: the gateway itself: no route, oversize, upstream unreachable, ...


@record
class ExchangeEnd(Record):
    """The end of one exchange (module docstring: every field)."""

    pending: PendingExchange
    status: int | None = None
    outcome: Outcome = Outcome.OK
    error: str | None = None
    request_body: bytes | None = None
    request_encoding: str | None = None
    request_bytes: int | None = None
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    response_body: bytes | list[bytes] | None = None
    streamed: bool = False
    chunk_timings: Any = b""
    headers_us: int | None = None
    first_byte_us: int | None = None
    ended_us: int | None = None
    bytes_received: int | None = None
    bytes_delivered: int | None = None
    served_by: ServedBy | None = None
    flags: tuple[str, ...] = ()
    forwarded_body: bytes | None = None
    max_body: int | None = None

    def __init__(
        self,
        pending: PendingExchange,
        status: int | None = None,
        outcome: Outcome = Outcome.OK,
        error: str | None = None,
        request_body: bytes | None = None,
        request_encoding: str | None = None,
        request_bytes: int | None = None,
        response_headers: list[tuple[str, str]] | None = None,
        response_body: bytes | list[bytes] | None = None,
        streamed: bool = False,
        chunk_timings: Any = b"",
        headers_us: int | None = None,
        first_byte_us: int | None = None,
        ended_us: int | None = None,
        bytes_received: int | None = None,
        bytes_delivered: int | None = None,
        served_by: ServedBy | None = None,
        flags: tuple[str, ...] = (),
        forwarded_body: bytes | None = None,
        max_body: int | None = None,
    ) -> None:
        self.pending = pending
        self.status = status
        self.outcome = outcome
        self.error = error
        self.request_body = request_body
        self.request_encoding = request_encoding
        self.request_bytes = request_bytes
        self.response_headers = [] if response_headers is None else response_headers
        self.response_body = response_body
        self.streamed = streamed
        self.chunk_timings = chunk_timings
        self.headers_us = headers_us
        self.first_byte_us = first_byte_us
        self.ended_us = ended_us
        self.bytes_received = bytes_received
        self.bytes_delivered = bytes_delivered
        self.served_by = served_by
        self.flags = flags
        self.forwarded_body = forwarded_body
        self.max_body = max_body

    @property
    def truncated(self) -> bool:
        """Whether the relay kept the response only in part (flag ``truncated``)."""
        return TRUNCATED_FLAG in self.flags

    def response_size(self) -> int:
        """Bytes of ``response_body``, given whole or as chunks (0 for None)."""
        body = self.response_body
        if body is None:
            return 0
        return len(body) if isinstance(body, (bytes, bytearray)) else sum(map(len, body))


__all__ = ["ExchangeEnd"]
