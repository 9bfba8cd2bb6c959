"""The responder seam: what answers a request the gateway received.

A **responder** takes one :class:`IncomingRequest` (plain data: method, path, query, header
list, body bytes and what routing found) and returns one **answer**, also plain data:

- :class:`Forward`: send the request to an upstream (optionally with another body); the
  gateway's :class:`~pvisor.gateway.forwarder.UpstreamForwarder` does it and gives back a
  :class:`Serve` of the upstream's bytes;
- :class:`Serve`: these bytes, as one ``body`` or as ``chunks`` (an iterable or an async
  iterable of ``bytes``, written to the agent one by one as they come);
- :class:`Refuse`: the gateway answers itself with a status and the protocol's JSON error.

No aiohttp object crosses the seam (the mitmproxy addon of intercept mode calls responders from
another event loop in another process), so a responder is tested with plain values, in process
(tests/test_responder_seam.py). The shape follows httpx's one-method transport
(``handle_async_request``): one coroutine, :meth:`Responder.respond`.

A reply made in a protocol below the gateway (:class:`~pvisor.adapters.protocols.replies.Reply`:
status, headers, body chunks; the scripted model's and playback's) crosses the seam as a
:class:`Serve` by :func:`serve_reply`.

What answered is journaled as ``served_by`` (:class:`ServedBy`); flags an answer carries
(``synthetic_end``, ...) go into the exchange's ``flags`` column (docs/journal.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterable, Iterable, Protocol, Union

from pvisor.journal.content_encoding import DecodeError, decode_body
from pvisor.journal.exchange_end import Outcome, ServedBy

if TYPE_CHECKING:
    from pvisor.adapters.protocols.replies import Reply


@dataclass(slots=True)
class IncomingRequest:
    """One request as a responder sees it (read-only by convention: not frozen, because a
    frozen dataclass's ``__init__`` costs twice as much on the gateway's hot path).

    Fields:
        exchange: the journal exchange id it is recorded under.
        run, attempt: the run (and attempt) it belongs to.
        method: HTTP method.
        path: the path without run and mount prefixes and without query (``/v1/messages``).
        query: the raw query string without ``?`` (still percent-encoded; may hold a ``key=``).
        target: path and query as they are appended to an upstream base URL.
        headers: the request headers as received, in order (secrets included: a responder
            that forwards needs them; none is ever journaled by a responder).
        body: the body bytes as received (still content-encoded when ``encoding`` is set).
        encoding: the request's ``Content-Encoding``, or None.
        upstream: the upstream name routing chose, or None when no upstream serves the path.
        protocol: the wire protocol module serving ``path``, or None.
        t0: ``time.perf_counter()`` when the request arrived (for timings).
        base: the base URL a forward goes to instead of the upstream's: intercept mode's
            origin the agent addressed (or its ``--redirect`` address), else None.
        workspace_read: done once the gateway's workspace snapshot for this request was taken
            (an ``asyncio.Future``), or None when it takes none: a responder that changes the
            workspace (a handoff's ``--reset-to-pause``) awaits it first.
    """

    exchange: str
    run: str
    attempt: int
    method: str
    path: str
    query: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    encoding: str | None = None
    upstream: str | None = None
    protocol: str | None = None
    t0: float = 0.0
    base: str | None = None
    workspace_read: Any = None

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    def decoded_body(self) -> bytes:
        """The body with its ``Content-Encoding`` undone. Raises DecodeError naming the coding."""
        if not self.encoding:
            return self.body
        return decode_body(self.body, self.encoding)


#: chunks of a :class:`Serve`: bytes written one at a time (a list, or an async source)
Chunks = Union[Iterable[bytes], AsyncIterable[bytes]]


@dataclass(slots=True)
class Forward:
    """Send the request upstream. ``body``: bytes to send instead of the agent's (None: as
    received, with its Content-Encoding; otherwise journaled as ``forwarded_body`` beside the
    agent's); ``upstream``: another upstream name (None: the routed one); ``target``: another
    path and query to append to the upstream's base URL (None: the agent's, as routed; a
    continuation that asks Gemini for another model changes the path); ``flags``: journaled
    with the exchange, whatever the upstream answers."""

    body: bytes | None = None
    upstream: str | None = None
    target: str | None = None
    flags: tuple[str, ...] = ()


@dataclass(slots=True)
class Serve:
    """Answer with these bytes.

    Fields:
        status, reason: HTTP status and reason phrase (None: the standard one).
        headers: response headers in order (hop-by-hop ones are dropped by the relay).
        body: the whole body; or
        chunks: its pieces, written in order as they come (an async source may raise
            :class:`StreamBroken` to cut the response where it broke).
        streamed: the response is an event stream (journal ``streamed``).
        served_by: who produced it.
        flags: flags journaled with the exchange (``synthetic_end``, ...).
    """

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    chunks: Chunks | None = None
    streamed: bool = False
    served_by: ServedBy = ServedBy.UPSTREAM
    flags: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(slots=True)
class Refuse:
    """The gateway answers ``status`` itself, in the protocol's JSON error shape.

    Fields: ``kind`` the error type (``pvisor_no_route``); ``message`` one sentence for the
    agent and the journal; ``outcome`` the journal :class:`Outcome` (``UPSTREAM_UNREACHABLE``,
    ``OVERSIZE``, ...); ``headers`` extra response headers; ``close`` close the connection after."""

    status: int
    kind: str
    message: str
    outcome: Outcome = Outcome.UPSTREAM_UNREACHABLE
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False
    flags: tuple[str, ...] = ()


Answer = Union[Forward, Serve, Refuse]


class StreamBroken(Exception):
    """Raised by an async ``chunks`` source when its bytes stop before the end (an upstream
    reset or stall): the relay passes on what arrived, journals ``outcome`` (an
    :class:`Outcome`: a code, as an error carries) and ``message`` and cuts the connection, so
    the agent sees a broken stream as it happened."""

    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome = outcome
        self.message = message


class Responder(Protocol):
    """Answers requests. :meth:`respond` may await (a forwarder waits for the upstream's
    headers; playback does not) but must never block the event loop on the disk."""

    async def respond(self, request: IncomingRequest) -> Answer:  # pragma: no cover - a protocol
        ...


def decode_or_refuse(request: IncomingRequest) -> bytes | Refuse:
    """The decoded body, or a 400 :class:`Refuse` naming the coding that cannot be undone (for
    responders that read bodies: scripted model, playback)."""
    try:
        return request.decoded_body()
    except DecodeError as exc:
        return Refuse(
            400,
            "pvisor_bad_content_encoding",
            f"the request body cannot be decoded: {exc}",
            outcome=Outcome.DECODE_ERROR,
        )


def serve_reply(reply: "Reply", served_by: ServedBy, flags: tuple[str, ...] = ()) -> Serve:
    """A :class:`~pvisor.adapters.protocols.replies.Reply` as a :class:`Serve` answer: one body,
    or its chunks as written; an event stream when its Content-Type says so."""
    headers = list(reply.headers.items())
    streamed = reply.headers.get("Content-Type", "").startswith("text/event-stream")
    if len(reply.chunks) == 1:
        return Serve(
            reply.status, headers, body=reply.chunks[0], streamed=streamed, served_by=served_by, flags=flags
        )
    return Serve(
        reply.status, headers, chunks=list(reply.chunks), streamed=streamed, served_by=served_by, flags=flags
    )
