"""The wire between a gateway and its journal writer process (:mod:`pvisor.journal.writer_process`).

Two pipes, both private to one parent and its child, so the format is whatever both sides of
one installed pvisor agree on (it is never stored):

- **messages**, parent to child: one frame per producer call. A frame is a header
  ``struct "<IH"`` (the length of the metadata in bytes, the number of bodies), then one
  ``"<Q"`` length per body, then the metadata (a pickle, protocol 5, of ``(kind, payload)``
  made of tuples, strings, numbers and small bytes only; ``kind`` is a
  :class:`~pvisor.journal.messages.MessageKind`'s value), then the bodies themselves. Bodies
  travel as they are, written from the producer's own ``bytes`` by ``os.writev``: they are
  never copied into the pickle. Each kind has its encoder (:data:`ENCODERS`); an exchange's end
  is a plain tuple of the :class:`~pvisor.journal.exchange_end.ExchangeEnd`'s fields
  (:func:`encode_exchange`) because pickling the record costs five times more on the event
  loop.
- **replies**, child to parent: ``struct "<I"`` length, then a pickle of a tuple
  (``("ready", writer_id, fingerprint_key_hex, reaped)``, ``("failed", error_class, message)``,
  ``("flushed", token, error)``, ``("log", levelno, message)``, ``("error", message,
  recorded)``, ``("closed", error, recorded)``; ``recorded``: the exchanges whose end the
  child committed).
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any, BinaryIO, Callable, Sequence

from .exchange_end import ExchangeEnd
from .messages import MessageKind, UnknownMessage, message_kind, unknown_message
from .exchange_end import Outcome, ServedBy
from .model import Attempt, Run
from .producer import PendingExchange
from .snapshots import SnapshotKind, SnapshotRecord

HEAD = struct.Struct("<IH")
LENGTH = struct.Struct("<Q")
REPLY_HEAD = struct.Struct("<I")

# what a plain payload may hold (checked when the child unpickles: nothing else is ever built)
_SAFE_CLASSES = {
    ("pvisor.journal.model", "Run"): Run,
    ("pvisor.journal.model", "Attempt"): Attempt,
    ("pvisor.journal.snapshots", "SnapshotRecord"): SnapshotRecord,
    ("pvisor.journal.snapshots", "SnapshotKind"): SnapshotKind,
}


class WireError(Exception):
    """The pipe ended inside a frame, or a frame is not one this pvisor writes (an unknown
    message kind among them)."""


def _pending_tuple(p: PendingExchange) -> tuple:
    # aiohttp's header names are multidict's istr: as plain str they pickle as strings (fast,
    # and the child needs no multidict to read them)
    headers = [(str(k), v) for k, v in p.headers]
    return (
        p.id,
        p.run,
        p.attempt,
        p.method,
        p.path,
        p.query,
        headers,
        p.protocol,
        p.started_ms,
        p.t0,
        p.capture,
    )


def pending_from(t: Sequence[Any]) -> PendingExchange:
    return PendingExchange(*t)


def encode_inflight(p: PendingExchange) -> tuple[tuple, list[bytes]]:
    """``(payload, bodies)`` of what exchange ``p`` in flight has that was not sent yet (its
    head, its request body once read, its response head, the response bytes received since);
    marks it sent on ``p``. Call it with the sender's lock held."""
    bodies: list[bytes] = []
    new_request = p.request_body is not None and not p.request_stored
    if new_request:
        bodies.append(p.request_body)  # type: ignore[arg-type]
        p.request_stored = True
    head = None
    if p.status is not None and not p.head_stored:
        head = (p.status, [(str(k), v) for k, v in p.response_headers or ()], p.streamed)
        p.head_stored = True
    chunks = p.chunks
    new_part = chunks is not None and len(chunks) > p.parts_taken
    if new_part:
        n = len(chunks)  # type: ignore[arg-type]  # the event loop may append meanwhile
        # the chunks themselves, written as one body (no joined copy in the producer)
        part = chunks[p.parts_taken : n]  # type: ignore[index]
        bodies.append(part)
        p.parts_taken, p.parts_bytes = n, p.parts_bytes + sum(map(len, part))
    p.persisted = True
    p.delivered_stored = p.delivered
    return (_pending_tuple(p), p.request_encoding, new_request, head, new_part, p.delivered), bodies


def apply_inflight(inflight: dict[str, PendingExchange], payload: Sequence[Any], bodies: list[bytes]) -> None:
    """The inverse of :func:`encode_inflight`, on the child's own copies of the exchanges in
    flight (``inflight``, its writer's). Each field is set before the one the writer thread
    tests (the encoding before the body, the status last), so that thread never sees
    half of an update."""
    pt, encoding, new_request, head, new_part, delivered = payload
    p = inflight.get(pt[0])
    if p is None:
        p = inflight[pt[0]] = pending_from(pt)
    it = iter(bodies)
    if new_request:
        p.request_encoding = encoding
        p.request_body = next(it)
    if head is not None:
        p.response_headers, p.streamed = head[1], head[2]
        p.status = head[0]
    p.delivered = delivered
    if new_part:
        part = next(it)
        if p.chunks is None:
            p.chunks = [part]
            p.own_chunks = True  # the child's own list: its writer lets go of what it committed
        else:
            p.chunks.append(part)


#: ``has_request`` of an exchange whose request body went with it in flight: the child takes
#: its own copy (neither the body nor the head is sent twice)
SENT_IN_FLIGHT = 2


#: Outcome and ServedBy members by value: the wire carries the values (strings pickle small and
#: fast), the child gets the members back by one dict lookup
_OUTCOMES = {o.value: o for o in Outcome}
_SERVED_BY = {s.value: s for s in ServedBy}


def encode_exchange(end: ExchangeEnd) -> tuple[tuple, list[bytes]]:
    """``(payload, bodies)`` of one exchange's end: the request, response and forwarded
    bodies (those not None, in that order) go out of band; the payload says which are there,
    then holds the other fields in :class:`~pvisor.journal.exchange_end.ExchangeEnd`'s order
    (enums as their values). A response body given as a list of chunks stays one:
    :func:`encode` writes its chunks as one body, so the child reads it whole and the producer
    never joins it. An exchange sent in flight before (the child holds its head, and its
    request body when it is the same) is named by its id only."""
    p = end.pending
    has_request: int | bool = end.request_body is not None
    if has_request and p.request_stored and end.request_body is p.request_body:
        has_request = SENT_IN_FLIGHT
    bodies = [
        b
        for b in (
            None if has_request == SENT_IN_FLIGHT else end.request_body,
            end.response_body,
            end.forwarded_body,
        )
        if b is not None
    ]
    served_by = end.served_by
    payload = (
        (p.id,) if p.persisted else _pending_tuple(p),
        has_request,
        end.response_body is not None,
        end.forwarded_body is not None,
        end.status,
        end.outcome.value,
        end.error,
        end.request_encoding,
        end.request_bytes,
        end.response_headers,
        end.streamed,
        end.chunk_timings,
        end.headers_us,
        end.first_byte_us,
        end.ended_us,
        end.bytes_received,
        end.bytes_delivered,
        None if served_by is None else served_by.value,
        end.flags,
        end.max_body,
    )
    return payload, bodies


def decode_exchange(
    payload: Sequence[Any], bodies: list[bytes], pending: PendingExchange | None
) -> ExchangeEnd:
    """The inverse of :func:`encode_exchange`; ``pending``: the child's own record of the
    exchange when it was sent in flight earlier (it knows whether the row is on disk, and holds
    the head and the request body the payload then leaves out).

    Raises WireError for an exchange named by its id only that was never sent in flight, or
    an outcome or served_by this pvisor does not know."""
    (
        pt,
        has_rq,
        has_rs,
        has_fw,
        status,
        outcome,
        error,
        encoding,
        request_bytes,
        response_headers,
        streamed,
        timings,
        headers_us,
        first_byte_us,
        ended_us,
        received,
        delivered,
        served_by,
        flags,
        max_body,
    ) = payload
    if pending is None and len(pt) == 1:
        raise WireError(f"exchange {pt[0]} ended without having been sent in flight")
    try:
        outcome = _OUTCOMES[outcome]
        served_by = None if served_by is None else _SERVED_BY[served_by]
    except KeyError as exc:
        raise WireError(
            f"exchange {pt[0]}: {exc.args[0]!r} is no outcome or served_by of this pvisor"
        ) from None
    it = iter(bodies)
    if has_rq == SENT_IN_FLIGHT:
        request_body = pending.request_body  # type: ignore[union-attr]
    else:
        request_body = next(it) if has_rq else None
    return ExchangeEnd(
        pending if pending is not None else pending_from(pt),
        status,
        outcome,
        error,
        request_body,
        encoding,
        request_bytes,
        response_headers,
        next(it) if has_rs else None,
        streamed,
        timings,
        headers_us,
        first_byte_us,
        ended_us,
        received,
        delivered,
        served_by,
        tuple(flags),
        next(it) if has_fw else None,
        max_body,
    )


def _encode_blobs(payload: list[tuple[str, bytes]]) -> tuple[list[str], list[bytes]]:
    return [sha for sha, _ in payload], [data for _, data in payload]


def _encode_plain(payload: Any) -> tuple[Any, list[bytes]]:
    # rare messages (runs, attempts, snapshots, flush, close): pickled as they are
    return payload, []


#: how each message kind goes on the wire: ``payload -> (metadata, bodies)``
ENCODERS: dict[MessageKind, Callable[[Any], tuple[Any, list]]] = {
    MessageKind.RUN: _encode_plain,
    MessageKind.RUN_UPDATE: _encode_plain,
    MessageKind.ATTEMPT: _encode_plain,
    MessageKind.ATTEMPT_END: _encode_plain,
    MessageKind.EXCHANGE_ROLES: _encode_plain,
    MessageKind.INFLIGHT: encode_inflight,
    MessageKind.EXCHANGE: encode_exchange,
    MessageKind.BLOBS: _encode_blobs,
    MessageKind.SNAPSHOT: _encode_plain,
    MessageKind.SNAPSHOT_HOLD: _encode_plain,
    MessageKind.SNAPSHOT_BIND: _encode_plain,
    MessageKind.FLUSH: _encode_plain,
    MessageKind.CLOSE: _encode_plain,
}


def encode(message: tuple[MessageKind, Any]) -> list[bytes | memoryview]:
    """The buffers of one frame, for ``os.writev``: header, lengths, metadata, bodies.

    Raises UnknownMessage (a ValueError) for a message kind the writer does not know (a
    programming error)."""
    kind, payload = message
    encoder = ENCODERS.get(kind)
    if encoder is None:
        raise unknown_message(kind)
    payload, bodies = encoder(payload)
    meta = pickle.dumps((getattr(kind, "value", kind), payload), protocol=5)
    parts: list[bytes | memoryview] = [HEAD.pack(len(meta), len(bodies))]
    if bodies:
        sizes = (len(b) if not isinstance(b, list) else sum(map(len, b)) for b in bodies)
        parts.append(struct.pack(f"<{len(bodies)}Q", *sizes))
    parts.append(meta)
    for b in bodies:
        if isinstance(b, list):
            parts.extend(c for c in b if c)  # a chunk list: one body on the wire (no empty buffer)
        else:
            parts.append(b)
    return parts


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        cls = _SAFE_CLASSES.get((module, name))
        if cls is None:
            raise WireError(f"journal message names {module}.{name}, which the writer never receives")
        return cls


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise WireError(f"the pipe ended inside a frame ({len(data)} of {n} bytes)")
    return data


def read_message(stream: BinaryIO) -> tuple[MessageKind, Any, list[bytes]] | None:
    """The next frame of a buffered binary stream as ``(kind, payload, bodies)``; None at a
    clean end (the parent closed its end, or died, between two frames).

    Raises WireError for a frame cut short or not made by :func:`encode`, or of a message
    kind this writer does not know."""
    head = stream.read(HEAD.size)
    if not head:
        return None
    if len(head) != HEAD.size:
        raise WireError("the pipe ended inside a frame header")
    meta_len, n = HEAD.unpack(head)
    lengths = struct.unpack(f"<{n}Q", _read_exact(stream, 8 * n)) if n else ()
    value, payload = _Unpickler(io.BytesIO(_read_exact(stream, meta_len))).load()
    bodies = [_read_exact(stream, size) for size in lengths]  # the frame is read whole either way
    try:
        kind = message_kind(value)
    except UnknownMessage as exc:
        raise WireError(str(exc)) from None
    return kind, payload, bodies


def encode_reply(reply: tuple) -> bytes:
    body = pickle.dumps(reply, protocol=5)
    return REPLY_HEAD.pack(len(body)) + body


def read_reply(stream: BinaryIO) -> tuple | None:
    """The next reply, or None when the child's end closed (it exited or died).

    Raises WireError for a reply cut short."""
    head = stream.read(REPLY_HEAD.size)
    if len(head) < REPLY_HEAD.size:
        return None
    (n,) = REPLY_HEAD.unpack(head)
    return pickle.loads(_read_exact(stream, n))
