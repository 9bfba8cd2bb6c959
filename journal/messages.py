"""The messages a journal producer hands its writer: one kind each, its payload field by field.

A producer call (:class:`~pvisor.journal.producer.JournalProducer`) queues one message
``(kind, payload)``: to the writer thread of a :class:`~pvisor.journal.writer.Journal` as it is,
or over the pipe to a writer process (:mod:`pvisor.journal.writer_wire` encodes it, the child
:mod:`pvisor.journal.writer_child` decodes it and queues it to its own writer thread). Each side
dispatches on :class:`MessageKind` through a table (kind -> function), so a kind none of them
knows is refused with one error (:class:`UnknownMessage`), never ignored.

Payloads, by kind:

``run``
    A :class:`~pvisor.journal.model.Run`: inserted unless the run exists.
``run_update``
    ``(run_id, {column: value})``: columns of the run to set (``labels`` merged).
``attempt``
    An :class:`~pvisor.journal.model.Attempt`: its row.
``attempt_end``
    ``(run_id, n, ended_ms, exit_code, labels)``: the end of attempt ``n``.
``exchange_roles``
    ``(run_id, [(chain or None, "main" | "auxiliary", exchange_id), ...])``: the chain rule's
    classification.
``inflight``
    A :class:`~pvisor.journal.producer.PendingExchange` still in flight: what it has that was
    not handed over yet (a writer process only; the thread writer reads the producer's own).
``exchange``
    An :class:`~pvisor.journal.exchange_end.ExchangeEnd`: the exchange's row.
``blobs``
    ``[(sha256 hex, bytes), ...]``: blobs of a workspace snapshot.
``snapshot``
    A :class:`~pvisor.journal.snapshots.SnapshotRecord`: its row and manifest.
``snapshot_hold``
    ``(snapshot_id, µs)``: how long the answer's first byte waited for the snapshot.
``snapshot_bind``
    ``(run_id, {snapshot_id: step or None})``: the step each snapshot comes after.
``flush``
    A ``threading.Event`` the writer sets once everything before it is committed (a writer
    process: a token number, answered with a ``flushed`` reply).
``close``
    A ``threading.Event`` set when the writer closed (a writer process: the timeout in
    seconds it may wait for a locked journal).

This module imports nothing of pvisor's.
"""

from __future__ import annotations

import enum


class MessageKind(str, enum.Enum):
    """The kind of one message from a producer to its writer (module docstring: the payloads)."""

    RUN = "run"
    RUN_UPDATE = "run_update"
    ATTEMPT = "attempt"
    ATTEMPT_END = "attempt_end"
    EXCHANGE_ROLES = "exchange_roles"
    INFLIGHT = "inflight"
    EXCHANGE = "exchange"
    BLOBS = "blobs"
    SNAPSHOT = "snapshot"
    SNAPSHOT_HOLD = "snapshot_hold"
    SNAPSHOT_BIND = "snapshot_bind"
    FLUSH = "flush"
    CLOSE = "close"


class UnknownMessage(ValueError):
    """A message of a kind the writer does not know (a programming error, or a frame another
    program wrote into the pipe)."""


def unknown_message(value: object) -> UnknownMessage:
    """The error for a message kind ``value`` that is none of :class:`MessageKind`: one line
    naming it and the kinds there are."""
    known = ", ".join(k.value for k in MessageKind)
    return UnknownMessage(f"unknown journal message kind {value!r} (the writer knows: {known})")


def message_kind(value: object) -> MessageKind:
    """The :class:`MessageKind` ``value`` names (a member, or its string).

    Raises UnknownMessage (:func:`unknown_message`) for any other value."""
    try:
        return MessageKind(value)
    except ValueError:
        raise unknown_message(value) from None


#: the kinds that are handed to the writer at once (the sender of a writer process does not
#: wait for its interval)
URGENT = frozenset({MessageKind.FLUSH, MessageKind.CLOSE})

__all__ = ["MessageKind", "UnknownMessage", "URGENT", "message_kind", "unknown_message"]
