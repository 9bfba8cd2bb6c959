"""The wire between a gateway and its journal writer process (:mod:`pvisor.journal.writer_process`).

Two pipes, both private to one parent and its child, so the format is whatever both sides of
one installed pvisor agree on (it is never stored):

- **messages**, parent to child: one frame per producer call. A frame is a header
  ``struct "<IH"`` (the length of the metadata in bytes, the number of bodies), then one
  ``"<Q"`` length per body, then the metadata (a pickle, protocol 5, of ``(kind, payload)``
  made of tuples, strings, numbers and small bytes only), then the bodies themselves. Bodies
  travel as they are, written from the producer's own ``bytes`` by ``os.writev``: they are
  never copied into the pickle. An exchange's metadata is a plain tuple
  (:func:`encode_exchange`) because pickling the ``FinishedExchange`` dataclass costs five
  times more on the event loop.
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
from typing import Any, BinaryIO, Sequence

from .model import Attempt, Run
from .snapshots import SnapshotKind, SnapshotRecord
from .writer import FinishedExchange, PendingExchange

HEAD = struct.Struct("<IH")
LENGTH = struct.Struct("<Q")
REPLY_HEAD = struct.Struct("<I")

#: message kinds whose payload is pickled as it is (rare messages: runs, attempts, snapshots)
_PLAIN = frozenset(
    {
        "run",
        "run_update",
        "attempt",
        "attempt_end",
        "exchange_roles",
        "snapshot",
        "snapshot_hold",
        "snapshot_bind",
        "flush",
        "close",
    }
)
# what a plain payload may hold (checked when the child unpickles: nothing else is ever built)
_SAFE_CLASSES = {
    ("pvisor.journal.model", "Run"): Run,
    ("pvisor.journal.model", "Attempt"): Attempt,
    ("pvisor.journal.snapshots", "SnapshotRecord"): SnapshotRecord,
    ("pvisor.journal.snapshots", "SnapshotKind"): SnapshotKind,
}


class WireError(Exception):
    """The pipe ended inside a frame, or a frame is not one this pvisor writes."""


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


def encode_exchange(f: FinishedExchange) -> tuple[tuple, list[bytes]]:
    """``(payload, bodies)`` of one finished exchange: the request, response and forwarded
    bodies (those not None, in that order) go out of band; the payload says which are there.
    A response body given as a list of chunks stays one: :func:`encode` writes its chunks as
    one body, so the child reads it whole and the producer never joins it. An exchange sent in
    flight before (the child holds its head, and its request body when it is the same) is named
    by its id only."""
    p = f.pending
    has_request: int | bool = f.request_body is not None
    if has_request and p.request_stored and f.request_body is p.request_body:
        has_request = SENT_IN_FLIGHT
    bodies = [
        b
        for b in (
            None if has_request == SENT_IN_FLIGHT else f.request_body,
            f.response_body,
            f.forwarded_body,
        )
        if b is not None
    ]
    payload = (
        (p.id,) if p.persisted else _pending_tuple(p),
        f.status,
        f.response_headers,
        has_request,
        f.response_body is not None,
        f.forwarded_body is not None,
        f.streamed,
        f.chunk_timings,
        f.outcome,
        f.error,
        f.headers_us,
        f.first_byte_us,
        f.ended_us,
        f.bytes_received,
        f.bytes_delivered,
        f.request_encoding,
        f.request_bytes,
        f.served_by,
        f.flags,
        f.max_body,
    )
    return payload, bodies


def decode_exchange(
    payload: Sequence[Any], bodies: list[bytes], pending: PendingExchange | None
) -> FinishedExchange:
    """The inverse of :func:`encode_exchange`; ``pending``: the child's own record of the
    exchange when it was sent in flight earlier (it knows whether the row is on disk, and holds
    the head and the request body the payload then leaves out).

    Raises WireError for an exchange named by its id only that was never sent in flight."""
    (
        pt,
        status,
        response_headers,
        has_rq,
        has_rs,
        has_fw,
        streamed,
        timings,
        outcome,
        error,
        headers_us,
        first_byte_us,
        ended_us,
        received,
        delivered,
        encoding,
        request_bytes,
        served_by,
        flags,
        max_body,
    ) = payload
    if pending is None and len(pt) == 1:
        raise WireError(f"exchange {pt[0]} ended without having been sent in flight")
    it = iter(bodies)
    if has_rq == SENT_IN_FLIGHT:
        request_body = pending.request_body  # type: ignore[union-attr]
    else:
        request_body = next(it) if has_rq else None
    return FinishedExchange(
        pending=pending if pending is not None else pending_from(pt),
        status=status,
        response_headers=response_headers,
        request_body=request_body,
        response_body=next(it) if has_rs else None,
        streamed=streamed,
        chunk_timings=timings,
        outcome=outcome,
        error=error,
        headers_us=headers_us,
        first_byte_us=first_byte_us,
        ended_us=ended_us,
        bytes_received=received,
        bytes_delivered=delivered,
        request_encoding=encoding,
        request_bytes=request_bytes,
        served_by=served_by,
        flags=tuple(flags),
        forwarded_body=next(it) if has_fw else None,
        max_body=max_body,
    )


def encode(message: tuple[str, Any]) -> list[bytes | memoryview]:
    """The buffers of one frame, for ``os.writev``: header, lengths, metadata, bodies.

    Raises ValueError for a message kind the writer does not know (a programming error)."""
    kind, payload = message
    if kind == "exchange":
        payload, bodies = encode_exchange(payload)
    elif kind == "inflight":
        payload, bodies = encode_inflight(payload)
    elif kind == "blobs":
        bodies = [data for _, data in payload]
        payload = [sha for sha, _ in payload]
    elif kind in _PLAIN:
        bodies = []
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown journal message {kind!r}")
    meta = pickle.dumps((kind, payload), protocol=5)
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


def read_message(stream: BinaryIO) -> tuple[str, Any, list[bytes]] | None:
    """The next frame of a buffered binary stream as ``(kind, payload, bodies)``; None at a
    clean end (the parent closed its end, or died, between two frames).

    Raises WireError for a frame cut short or not made by :func:`encode`."""
    head = stream.read(HEAD.size)
    if not head:
        return None
    if len(head) != HEAD.size:
        raise WireError("the pipe ended inside a frame header")
    meta_len, n = HEAD.unpack(head)
    lengths = struct.unpack(f"<{n}Q", _read_exact(stream, 8 * n)) if n else ()
    kind, payload = _Unpickler(io.BytesIO(_read_exact(stream, meta_len))).load()
    return kind, payload, [_read_exact(stream, size) for size in lengths]


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
