"""The journal writer process: reads the frames :class:`~pvisor.journal.writer_process.JournalProcess`
sends and hands them to the writer thread of a :class:`~pvisor.journal.writer.Journal` of its
own, which does what it does in any process (batches, lease, reaping, reassembly).

Started by the parent only: ``main([read_fd, reply_fd, path, finalize, max_decoded,
busy_timeout_ms])``. It ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C, or a closed terminal,
reaches the whole process group:
the gateway decides when to stop, and the writer stops when the gateway's end of the pipe
closes, after committing everything it has read; this is also what happens when the gateway
is killed). Its log records go to the parent, which logs them as its own.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any, Callable

from pvisor.core.errors import PvisorError
from .messages import MessageKind
from .reassembly import resolve_finalizer
from .writer import Journal
from .writer_wire import (
    WireError,
    decode_exchange,
    encode_reply,
    apply_inflight,
    read_message,
)


class _Replies:
    """The reply pipe, written by the reader and by logging from the writer thread."""

    def __init__(self, fd: int):
        self._fd = fd
        self._lock = threading.Lock()
        self.gone = False

    def send(self, reply: tuple) -> None:
        data = encode_reply(reply)
        with self._lock:
            if self.gone:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError:
                self.gone = True  # the parent is gone: go on committing what was read


class _ToParent(logging.Handler):
    def __init__(self, replies: _Replies):
        super().__init__()
        self._replies = replies

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._replies.send(("log", record.levelno, record.getMessage()))
        except Exception:  # pragma: no cover - logging must never stop the writer
            pass


class _LazyFinalizer:
    """The reassembler named ``module:function``, imported by a thread of its own as the child
    starts (:meth:`load`): the writer thread never stops committing for the import (the
    protocol modules take tens of milliseconds). Until it is loaded, reassembly in the writer's
    idle slices waits (:meth:`ready`); a flush or a close that needs it imports it at once."""

    def __init__(self, name: str):
        self._name = name
        self._fn: Callable | None = None
        self._loaded = threading.Event()

    def load(self) -> None:
        try:
            self._fn = resolve_finalizer(self._name)
        except Exception:  # noqa: BLE001 - reported when it is first called
            pass
        finally:
            self._loaded.set()

    def ready(self) -> bool:
        return self._loaded.is_set()

    def __call__(self, *args: Any) -> Any:
        if self._fn is None:
            self._fn = resolve_finalizer(self._name)
        return self._fn(*args)


def _exchange(journal: Journal, replies: _Replies, payload: Any, bodies: list[bytes]) -> None:
    # the child's own copy of an exchange it wrote in flight knows its row is on disk
    pending = journal.inflight.pop(payload[0][0], None)
    if pending is not None:
        # the parts sent in flight are stored (or rolled back and then not needed): the
        # finished exchange brings its whole body, and the parts need not be held beside it
        pending.chunks = None
    journal.put_message((MessageKind.EXCHANGE, decode_exchange(payload, bodies, pending)))


def _inflight(journal: Journal, replies: _Replies, payload: Any, bodies: list[bytes]) -> None:
    apply_inflight(journal.inflight, payload, bodies)


def _blobs(journal: Journal, replies: _Replies, payload: Any, bodies: list[bytes]) -> None:
    journal.put_blobs(list(zip(payload, bodies)))


def _flush(journal: Journal, replies: _Replies, payload: Any, bodies: list[bytes]) -> None:
    try:
        journal.flush()
        error = None
    except PvisorError as exc:
        error = str(exc)
    replies.send(("flushed", payload, error))


def _as_it_is(kind: MessageKind) -> Callable[[Journal, _Replies, Any, list[bytes]], None]:
    """The handler of a message the writer thread takes as it came (runs, attempts, snapshots)."""

    def handle(journal: Journal, replies: _Replies, payload: Any, bodies: list[bytes]) -> None:
        journal.put_message((kind, payload))

    return handle


#: what the child does with each message kind it reads (``close`` ends its read loop: main)
HANDLERS: dict[MessageKind, Callable[[Journal, _Replies, Any, list[bytes]], None]] = {
    MessageKind.EXCHANGE: _exchange,
    MessageKind.INFLIGHT: _inflight,
    MessageKind.BLOBS: _blobs,
    MessageKind.FLUSH: _flush,
    **{
        kind: _as_it_is(kind)
        for kind in (
            MessageKind.RUN,
            MessageKind.RUN_UPDATE,
            MessageKind.ATTEMPT,
            MessageKind.ATTEMPT_END,
            MessageKind.EXCHANGE_ROLES,
            MessageKind.SNAPSHOT,
            MessageKind.SNAPSHOT_HOLD,
            MessageKind.SNAPSHOT_BIND,
        )
    },
}


def main(argv: list[str]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    read_fd, reply_fd, path, finalize, max_decoded, busy_ms = argv
    replies = _Replies(int(reply_fd))
    logger = logging.getLogger("pvisor")
    logger.addHandler(_ToParent(replies))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    finalizer = _LazyFinalizer(finalize) if finalize else None
    if finalizer is not None:
        threading.Thread(target=finalizer.load, name="pvisor-finalizer-import", daemon=True).start()
    try:
        journal = Journal.open(
            path,
            finalize=finalizer,
            max_decoded=int(max_decoded),
            busy_timeout_ms=int(busy_ms),
        )
    except PvisorError as exc:
        replies.send(("failed", type(exc).__name__, str(exc)))
        sys.exit(1)
    except Exception as exc:
        replies.send(
            (
                "failed",
                "UnavailableError",
                f"journal {path}: cannot open: {type(exc).__name__}: {exc}",
            )
        )
        sys.exit(1)
    replies.send(
        (
            "ready",
            journal.writer_id,
            journal.fingerprint_key.hex(),
            list(journal.reaped),
        )
    )

    def watch() -> None:  # the writer thread ends at close, or when it failed: tell the gateway at once
        journal.wait_stopped()
        if journal.error is not None:
            replies.send(("error", journal.error, journal.recorded))

    threading.Thread(target=watch, name="pvisor-journal-watch", daemon=True).start()
    close_timeout = 60.0
    with open(int(read_fd), "rb", buffering=1 << 20) as stream:
        while True:
            try:
                message = read_message(stream)
            except WireError as exc:
                # the parent died inside a frame, or sent what this writer cannot read: what came
                # before it is committed, and the gateway (if it lives) stops as for any writer failure
                replies.send(("error", f"journal message not understood: {exc}", journal.recorded))
                break
            if message is None:
                break
            kind, payload, bodies = message
            if kind is MessageKind.CLOSE:
                close_timeout = float(payload)
                break
            HANDLERS[kind](journal, replies, payload, bodies)
    journal.close(close_timeout)
    replies.send(("closed", journal.error, journal.recorded))
