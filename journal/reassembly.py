"""Reassembly of streamed responses into their final objects (``exchanges.response_final``), done
by the journal's writer thread when it has time.

A streamed response is stored as it came (its event stream); the protocol modules' reassembler
(a :data:`Finalizer`, the gateway passes ``pvisor.gateway.finalize:finalize_response``) turns it
into the final response JSON, the body a whole answer would have had. That is CPU work holding
the interpreter's lock for milliseconds per stream (about 40-80 ms per MiB, docs/journal.md),
so the writer queues the streams it stored (:meth:`Reassembly.offer`: ids and blob digests, not
bodies) and reassembles them in slices: while the producer is idle, at flush and at close, and
under constant load after a commit (:meth:`Reassembly.due`). Streams over
:data:`FINALIZE_MAX_BYTES`, cut short (flag ``truncated``), or pushed out of a full queue are
left to readers, which reassemble what they need on demand.

The writer thread (:class:`~pvisor.journal.writer.Journal`) owns one :class:`Reassembly` and its
connection; it handles a journal locked by another process (a slice gives up, a flush waits).
"""

from __future__ import annotations

import collections
import importlib
import logging
import sqlite3
import time
from pathlib import Path
from typing import Callable

import orjson

from . import blobs
from .content_encoding import DecodeError, decode_body
from .model import TRUNCATED_FLAG

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

#: ``finalize(protocol, streamed, decoded_response_body) -> final response JSON bytes | None``,
#: called in the writer thread while the producer is idle, at flush and at close (the gateway
#: passes the protocol modules' reassembly).
Finalizer = Callable[[str | None, bool, bytes], bytes | None]


def resolve_finalizer(name: str | None) -> Finalizer | None:
    """The function ``module:attribute`` names (a journal finalizer), imported now; None for
    no name. Raises ImportError or AttributeError for a name that names nothing."""
    if not name:
        return None
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


#: ``put_blob(conn, data) -> sha256 hex``: the writer's own store of a blob
PutBlob = Callable[[sqlite3.Connection, bytes], str]

log = logging.getLogger("pvisor.journal")


class Reassembly:
    """The streams one writer waits to reassemble, and how it does. ``finalize`` None: the
    writer reassembles nothing (readers do); ``path`` names the journal in log lines;
    ``put_blob`` stores a final response.

    Attributes: ``queue`` of ``(exchange id, protocol, response blob sha256, content-encoding
    or None)``, oldest first; ``skipped``: streams pushed out of a full queue (said at close);
    ``last``: ``time.monotonic()`` of the last slice."""

    def __init__(self, path: Path, finalize: Finalizer | None, put_blob: PutBlob):
        self.path = path
        self.finalize = finalize
        self._put_blob = put_blob
        self.queue: collections.deque[tuple[str, str, str, str | None]] = collections.deque()
        self.skipped = 0
        self.last = time.monotonic()

    def ready(self) -> bool:
        """Whether the reassembler can run now without an import (a writer process loads it in
        the background: journal.writer_child)."""
        ready = getattr(self.finalize, "ready", None)
        return ready is None or bool(ready())

    def wants(self, protocol: str | None, streamed: bool, flags: tuple[str, ...], size: int) -> bool:
        """Whether a stored response of ``size`` bytes (as received) is one to reassemble."""
        return (
            self.finalize is not None
            and streamed
            and protocol is not None
            and TRUNCATED_FLAG not in flags  # the reply is not whole: readers reassemble what there is
            and size <= FINALIZE_MAX_BYTES
        )

    def offer(self, exchange: str, protocol: str, sha: str, encoding: str | None) -> None:
        """Queue the stream stored as blob ``sha`` of ``exchange``; a full queue lets go of its
        oldest (left to readers, and to the next writer, which queues what it finds
        unreassembled; counted in :attr:`skipped`)."""
        if len(self.queue) >= FINALIZE_QUEUE_MAX:
            self.queue.popleft()
            self.skipped += 1
        self.queue.append((exchange, protocol, sha, encoding))

    def due(self, now: float) -> bool:
        """Whether a slice is due after a commit at ``now`` (``time.monotonic()``) under
        constant load: :data:`FINALIZE_BACKLOG` streams wait, or none was reassembled for
        :data:`FINALIZE_EVERY_S`, and the reassembler is ready."""
        return (
            bool(self.queue)
            and (len(self.queue) >= FINALIZE_BACKLOG or now - self.last >= FINALIZE_EVERY_S)
            and self.ready()
        )

    @property
    def behind(self) -> bool:
        """Whether :data:`FINALIZE_BACKLOG` streams or more wait (a slice then catches up)."""
        return len(self.queue) >= FINALIZE_BACKLOG

    def run(self, conn: sqlite3.Connection, budget_s: float | None, catch_up: bool = False) -> None:
        """Reassemble queued streams, oldest first, in one transaction, for at most ``budget_s``
        seconds (None: all) and, with ``catch_up``, until half of :data:`FINALIZE_BACKLOG`
        wait. Each is read back from its blob. Raises sqlite3.OperationalError (a locked
        journal: the transaction is rolled back, the queue keeps what was not committed)."""
        self.last = time.monotonic()
        if not self.queue:
            return
        leave = FINALIZE_BACKLOG // 2 if catch_up else 0
        deadline = None if budget_s is None else time.monotonic() + budget_s
        conn.execute("BEGIN IMMEDIATE")
        try:
            while len(self.queue) > leave and (deadline is None or time.monotonic() < deadline):
                ex_id, protocol, sha, encoding = self.queue[0]
                row = conn.execute("SELECT codec, data, size FROM blobs WHERE sha256 = ?", (sha,)).fetchone()
                final = None
                if row is not None:
                    try:
                        raw = blobs.decode(row[0], row[1], size=row[2])
                        if encoding:
                            raw = decode_body(raw, encoding, limit=FINALIZE_MAX_BYTES)
                        final = self.finalize(protocol, True, raw)  # type: ignore[misc]
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
                self.queue.popleft()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def load_unfinished(self, conn: sqlite3.Connection) -> None:
        """Queue the streamed responses a previous writer recorded but did not reassemble (it
        died, or ran without a reassembler), newest 10,000 at most."""
        if self.finalize is None:
            return
        rows = conn.execute(
            "SELECT id, protocol, response_body, response_headers FROM exchanges"
            " WHERE streamed = 1 AND response_final IS NULL"
            " AND response_body IS NOT NULL AND protocol IS NOT NULL AND outcome IS NOT NULL"
            f" AND bytes_received <= {FINALIZE_MAX_BYTES}"
            f" AND flags NOT LIKE '%\"{TRUNCATED_FLAG}\"%' ORDER BY rowid DESC LIMIT 10000"
        ).fetchall()
        for ex_id, protocol, sha, headers in reversed(rows):
            try:
                enc = orjson.loads(headers).get("content-encoding")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            self.queue.append((ex_id, protocol, sha, enc))


__all__ = [
    "FINALIZE_BACKLOG",
    "FINALIZE_CATCHUP_S",
    "FINALIZE_EVERY_S",
    "FINALIZE_MAX_BYTES",
    "FINALIZE_QUEUE_MAX",
    "FINALIZE_SLICE_S",
    "Finalizer",
    "PutBlob",
    "Reassembly",
]
