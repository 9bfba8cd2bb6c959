"""A journal writer in a process of its own, so that the gateway's event loop never shares the
interpreter's lock with redaction, hashing, compression and SQLite.

:class:`JournalProcess` has the producer calls of :class:`~pvisor.journal.writer.Journal`
(it is a :class:`~pvisor.journal.producer.JournalProducer`) and starts a child,
:mod:`pvisor.journal.writer_child`, that runs the same writer thread on the same file. Each
call becomes one frame (:mod:`pvisor.journal.writer_wire`): the caller pickles a small tuple
and queues it with the bodies as they are, in memory, without a system call; a sender thread
writes what is queued every 20 ms (at once for a flush, a close or 8 MiB waiting) with
``os.writev`` on a non-blocking pipe of 1 MiB, so the sender and the child wake once per batch,
not once per exchange (every wake-up the loop causes hands the interpreter lock, and on a
shared CPU the CPU, away: measured, waking the sender at every 256 KiB cost the loop more than
the writer's own work), and the bodies are copied only into the pipe. Nothing on the caller's thread waits
for the disk or for the child.

Promises, as the thread writer's (docs/journal.md, "Writing"):

- the lease row (``writers``) is the child's: its pid, its heartbeat; a writer that opens the
  journal after the child was killed reaps it as any dead writer;
- an exchange is sent to the child as soon as its request has been read, written to the pipe
  before the gateway forwards it (:meth:`JournalProcess.request_read`); what it has since
  (the response's head and bytes) is sent every commit window (100 ms) while it is in flight,
  and the child writes it as in flight (``outcome`` NULL) once it is a commit window old;
- a ``kill -9`` of the gateway loses only what was not yet written to the pipe (the child
  reads to the end, commits, marks what is in flight ``incomplete`` and closes its lease):
  never an exchange whose request reached an upstream; only what came in the last 20 ms (the
  sender's interval): response bytes, and the ends of exchanges that finished then (each is
  kept ``incomplete``, with its request); a
  ``kill -9`` of the child loses its last commit window, and the gateway sees it (:attr:`error`
  names the process and how it ended) and stops as for any writer failure.

Choosing it: :func:`open_journal` (``PVISOR_JOURNAL_WRITER=process|thread``, default
``process``; ``PVISOR_WRITER_CPUS`` the CPUs the child may run on, as ``taskset`` writes them).
"""

from __future__ import annotations

import collections
import enum
import fcntl
import itertools
import logging
import math
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from pvisor.core import errors
from .content_encoding import DEFAULT_LIMIT
from pvisor.core.helpers import frozen, helper_argv
from pvisor.core.errors import UnavailableError, UsageError
from .messages import URGENT, MessageKind
from .reassembly import resolve_finalizer
from .producer import BLOB_WAIT_S, COMMIT_INTERVAL_S, SNAPSHOT_QUEUE_BYTES, JournalProducer, PendingExchange
from .writer import BUSY_TIMEOUT_MS, Journal
from .writer_wire import WireError, encode, read_reply

log = logging.getLogger("pvisor.journal")

WRITER_ENV = "PVISOR_JOURNAL_WRITER"
CPUS_ENV = "PVISOR_WRITER_CPUS"
PIPE_BYTES = 1 << 20  # the pipe's buffer (F_SETPIPE_SZ; Linux lets anyone ask up to 1 MiB)
START_TIMEOUT_S = 60.0  # the child's start: interpreter, imports, migrations, the lease
_IOV_MAX = 512  # buffers per writev (Linux allows 1024)
SEND_INTERVAL_S = 0.02  # what producers queued is written to the pipe this often
SEND_NOW_BYTES = 8 << 20  # or as soon as this much waits (a burst: a wake-up of the sender costs the loop)
_CPU_RANGE = re.compile(r"(\d{1,6})(?:-(\d{1,6}))?")
_F_SETPIPE_SZ = 1031


class WriterMode(enum.Enum):
    """Where the journal's writer runs."""

    THREAD = "thread"  #: a thread of the producer's process (:class:`~pvisor.journal.writer.Journal`)
    PROCESS = "process"  #: a process of its own (:class:`JournalProcess`)


def writer_mode(environ: dict[str, str] | None = None) -> WriterMode:
    """The mode ``PVISOR_JOURNAL_WRITER`` asks for (default process).

    Raises UsageError (exit 2) naming the variable for any other value."""
    value = (os.environ if environ is None else environ).get(WRITER_ENV, "").strip().lower()
    if not value:
        return WriterMode.PROCESS
    try:
        return WriterMode(value)
    except ValueError:
        raise UsageError(f"{WRITER_ENV}={value!r}: expected 'process' or 'thread'") from None


def writer_cpus(environ: dict[str, str] | None = None) -> set[int] | None:
    """The CPUs ``PVISOR_WRITER_CPUS`` names (``1``, ``0,2``, ``2-3``), None when unset: the
    child then runs where the gateway may (it inherits the gateway's affinity).

    Any CPU of the machine may be named, also one the gateway itself may not use (a gateway
    under ``taskset -c 0`` with its writer on CPU 1); one the system refuses (a container's
    cpuset) is refused when the writer starts.

    Raises UsageError (exit 2) for a list that is not CPU numbers of this machine."""
    value = (os.environ if environ is None else environ).get(CPUS_ENV, "").strip()
    if not value:
        return None
    machine = set(range(os.cpu_count() or 1))
    cpus: set[int] = set()
    for part in value.split(","):
        m = _CPU_RANGE.fullmatch(part.strip())
        if m is None:
            raise UsageError(f"{CPUS_ENV}={value!r}: expected CPU numbers such as '1', '0,2' or '2-3'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi:
            raise UsageError(f"{CPUS_ENV}={value!r}: {part.strip()} names no CPU")
        if hi not in machine:
            # checked before the range is built: a range of a billion is refused, not allocated
            raise UsageError(f"{CPUS_ENV}={value!r}: this machine has CPUs 0-{max(machine)} only")
        cpus.update(range(lo, hi + 1))
    return cpus


def open_journal(
    path: str | os.PathLike,
    *,
    finalize: str | None = None,
    mode: WriterMode | None = None,
    **kwargs: Any,
) -> JournalProducer:
    """Open the journal at ``path`` for writing, with its writer where ``mode`` says (default:
    :func:`writer_mode`). ``finalize``: the reassembler as ``module:function`` (both modes
    import it by name; the process imports it when it first reassembles).

    Raises what :meth:`Journal.open` raises (UsageError, BadInputError, IntegrityError,
    UnavailableError), and UsageError for a bad ``PVISOR_JOURNAL_WRITER`` or ``PVISOR_WRITER_CPUS``.
    """
    mode = mode or writer_mode()
    cpus = writer_cpus()  # checked in either mode: a bad value is never silently ignored
    if mode is WriterMode.THREAD:
        return Journal.open(path, finalize=resolve_finalizer(finalize), **kwargs)
    return JournalProcess.open(path, finalize=finalize, cpus=cpus, **kwargs)


class JournalProcess(JournalProducer):
    """The producer side of a journal written by a child process. Open with :meth:`open`;
    close with :meth:`close` (or use it as a context manager). Thread-safe.

    Attributes as :class:`~pvisor.journal.writer.Journal`'s: ``path``, ``writer_id`` (the
    child's lease row), ``fingerprint_key``, ``reaped``, :attr:`error`; ``pid``: the child's.
    """

    def __init__(self, path: Path, proc: subprocess.Popen, fd: int, reply_fd: int, stderr: Any):
        self.path = path
        self.pid = proc.pid
        self.processes = (proc.pid,)
        self.where = f"process {proc.pid}"
        self._proc = proc
        self._fd = fd
        self._stderr = stderr
        self._inflight: dict = {}
        self.writer_id: int | None = None
        self.fingerprint_key = b""
        self.reaped: list[int] = []
        self.recorded: int | None = None  # the child's count, in its "error" and "closed" replies
        self._error: str | None = None
        self._closed = False
        self._lock = threading.Lock()  # one writer of the pipe at a time, frames whole and in order
        self._backlog: collections.deque = collections.deque()
        self._backlog_bytes = 0
        self._wake = threading.Event()
        self._stopping = False
        self._ready = threading.Event()
        self._failed: tuple[str, str] | None = None
        self._closed_ack = threading.Event()
        self._flushes: dict[int, list] = {}
        self._tokens = itertools.count(1)
        self._replies = threading.Thread(
            target=self._read_replies,
            args=(reply_fd,),
            name="pvisor-journal-replies",
            daemon=True,
        )
        self._sender = threading.Thread(target=self._send_loop, name="pvisor-journal-sender", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        *,
        finalize: str | None = None,
        max_decoded: int = DEFAULT_LIMIT,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        cpus: set[int] | None = None,
    ) -> "JournalProcess":
        """Start the writer process for the journal at ``path``; return when it holds the
        lease (the schema migrated), as :meth:`Journal.open` does.

        Raises the error the child met opening the file (UsageError, BadInputError,
        IntegrityError, UnavailableError, with the thread writer's message), UnavailableError
        when the child cannot start or ends before it is ready, UsageError for CPUs this
        machine does not have."""
        path = Path(path)
        r, w = os.pipe()
        rr, rw = os.pipe()
        stderr = tempfile.TemporaryFile()  # read only when the child ends unexpectedly
        # the parent's sys.path: the child imports the same pvisor, from a venv, an editable
        # install or PYTHONPATH alike (-I: nothing else, not the working directory)
        code = (
            "import sys, json; sys.path[:0] = json.loads(sys.argv[1]);"
            " from pvisor.journal.writer_child import main; main(sys.argv[2:])"
        )
        args = [str(r), str(rw), str(path), finalize or "", str(max_decoded), str(busy_timeout_ms)]
        if frozen():  # a bundle: its executable runs the writer (core/helpers.py); no sys.path to pass
            argv = helper_argv("writer", code, args)
        else:
            argv = helper_argv("writer", code, [orjson.dumps([p for p in sys.path if p]).decode(), *args])
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(r, rw),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                close_fds=True,
            )
        except OSError as exc:
            for fd in (r, w, rr, rw):
                os.close(fd)
            stderr.close()
            raise UnavailableError(
                f"journal {path}: cannot start the writer process: {exc.strerror}"
            ) from None
        os.close(r)
        os.close(rw)
        journal = cls(path, proc, w, rr, stderr)
        if cpus:
            try:
                os.sched_setaffinity(proc.pid, cpus)
            except OSError as exc:
                journal._abort()
                raise UsageError(
                    f"{CPUS_ENV}: cannot run the writer on CPUs {sorted(cpus)}: {exc.strerror}"
                ) from None
        try:
            fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # a smaller pipe only means more writes wait for the sender thread
        os.set_blocking(w, False)
        journal._replies.start()
        if not journal._ready.wait(START_TIMEOUT_S):
            journal._abort()
            raise UnavailableError(
                f"journal {path}: the writer process did not start within {START_TIMEOUT_S:.0f} s"
            )
        if journal._failed is not None:
            cls_name, message = journal._failed
            journal._abort()
            error = getattr(errors, cls_name, None)
            if not (isinstance(error, type) and issubclass(error, errors.PvisorError)):
                error = UnavailableError
            raise error(message)
        if journal._error is not None:
            journal._abort()
            raise UnavailableError(f"journal {path}: {journal._error}")
        journal._sender.start()
        return journal

    def _abort(self) -> None:
        """Stop a child that failed to start (it committed nothing of ours)."""
        self._closed = True
        try:
            os.close(self._fd)
        except OSError:
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._replies.ident is not None:
            self._replies.join(5)
        self._stderr.close()

    @property
    def error(self) -> str | None:
        """Why the writer stopped (nothing more is recorded), or None while it works."""
        return self._error

    def close(self, timeout: float = 60.0) -> None:
        """Send what is queued, let the child commit it, mark what is still in flight
        ``incomplete``, close the lease and checkpoint; wait for the child to end. Idempotent.
        ``timeout``: as :meth:`Journal.close` (the child gives up on a journal locked for that long)."""
        if self._closed:
            return
        self._closed = True
        if self._error is None:
            with (
                self._lock
            ):  # exchanges that never finished: the child writes them, then marks them incomplete
                for p in list(self._inflight.values()):
                    if p.due(math.inf):
                        self._append_locked(encode((MessageKind.INFLIGHT, p)))
                self._append_locked(encode((MessageKind.CLOSE, timeout)))
        self._stopping = True
        self._wake.set()
        self._sender.join(timeout + self._grace())
        with self._lock:  # a sender still waiting for room must never write to a closed (reused) fd
            if self._sender.is_alive() and self._error is None:
                self._error = f"the writer process (pid {self.pid}) did not read what was sent"
            try:
                os.close(self._fd)  # the child reads to the end of the pipe, then stops
            except OSError:
                pass
        self._closed_ack.wait(timeout + self._grace())
        try:
            self._proc.wait(self._grace())
        except subprocess.TimeoutExpired:
            log.error(
                "journal %s: the writer process (pid %d) did not stop; killed",
                self.path,
                self.pid,
            )
            self._proc.kill()
            self._proc.wait()
        self._replies.join(5)
        self._stderr.close()

    def _grace(self) -> float:
        return BUSY_TIMEOUT_MS / 1000 + 10

    def flush(self, timeout: float = 30.0) -> None:
        """Block until every message queued before this call is committed.

        Raises UnavailableError when the writer stopped or did not commit within ``timeout``."""
        self._raise_if_failed()
        token = next(self._tokens)
        waiter: list = [threading.Event(), None]
        self._flushes[token] = waiter
        self._put((MessageKind.FLUSH, token))
        if not waiter[0].wait(timeout):
            self._flushes.pop(token, None)
            raise UnavailableError(f"journal {self.path}: writer did not commit within {timeout:.0f} s")
        if waiter[1] is not None:
            raise UnavailableError(waiter[1])
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise UnavailableError(f"journal {self.path}: writer stopped: {self._error}")

    # ------------------------------------------------------------------ sending

    def _put(self, message: tuple[MessageKind, Any]) -> None:
        parts = encode(message)  # outside the lock: other producers need not wait for the pickle
        with self._lock:
            self._append_locked(parts)
        if self._backlog_bytes >= SEND_NOW_BYTES or message[0] in URGENT:
            self._wake.set()

    def _append_locked(self, parts: list) -> None:
        # no system call here: one write per exchange would wake the writer process (and
        # switch to it, on a shared CPU) once per exchange; the sender writes batches
        if self._error is not None:
            return  # the child is gone: the gateway stops on the error, nothing more is recorded
        self._backlog.extend(parts)
        self._backlog_bytes += sum(len(p) for p in parts)

    def _broken(self, exc: OSError) -> None:
        if self._error is None:
            self._error = f"the writer process (pid {self.pid}) went away: {exc.strerror or exc}"
        self._backlog.clear()
        self._backlog_bytes = 0

    def _send_loop(self) -> None:
        """Every :data:`SEND_INTERVAL_S` (at once for a flush, a close or a large backlog):
        write what waits, in as few ``writev`` calls as the pipe allows, and send exchanges in
        flight for longer than a commit window, so the child writes them as in flight."""
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        last_stale = time.monotonic()
        while True:
            self._wake.wait(SEND_INTERVAL_S)
            self._wake.clear()
            now = time.monotonic()
            if now - last_stale >= COMMIT_INTERVAL_S:
                self._send_stale()
                last_stale = now
            while True:
                with self._lock:
                    if not self._backlog or self._error is not None:
                        break
                    full = self._writev_locked()
                if full:
                    poller.poll(100)  # outside the lock: producers go on queueing
            if self._stopping:
                return

    def _writev_locked(self) -> bool:
        """One ``writev`` of what waits (the lock held); True when the pipe took less than offered."""
        chunk = list(itertools.islice(self._backlog, _IOV_MAX))
        try:
            n = os.writev(self._fd, chunk)
        except BlockingIOError:
            return True
        except OSError as exc:
            self._broken(exc)
            return False
        self._backlog_bytes -= n
        full = n < sum(len(c) for c in chunk)
        while n and self._backlog:
            head = self._backlog[0]
            if n >= len(head):
                n -= len(head)
                self._backlog.popleft()
            else:
                self._backlog[0] = memoryview(head)[n:]
                n = 0
        while self._backlog and not len(self._backlog[0]):
            # an empty body (a GET's request) is never reported written: without this, a backlog
            # ending in one would be offered again and again
            self._backlog.popleft()
        return full

    def request_read(self, pending: PendingExchange, body: bytes, encoding: str | None = None) -> None:
        """As :meth:`JournalProducer.request_read`, and the exchange in flight (its head and its
        request) goes into the pipe now, on the caller's thread, with whatever waits before it:
        the gateway forwards the request only after this, so a ``kill -9`` of the gateway keeps
        every exchange whose request an upstream saw (the child reads the pipe to its end and
        marks it ``incomplete``). Only when the pipe is full (the child behind by a whole
        pipe, 1 MiB) does the frame wait for the sender thread like any other."""
        super().request_read(pending, body, encoding)
        with self._lock:
            if self._error is not None or self._closed or pending.id not in self._inflight:
                return
            self._append_locked(encode((MessageKind.INFLIGHT, pending)))
            while self._backlog and self._error is None:
                if self._writev_locked():
                    self._wake.set()  # the pipe is full: the sender writes the rest when it can
                    break

    def _send_stale(self) -> None:
        now = time.perf_counter()
        for p in list(self._inflight.values()):
            # progress here means "sent in flight": the child keeps its own copy, and stores it
            if p.due(now):
                with self._lock:
                    # still in flight under the lock: its end, if it comes now, is queued after this
                    if p.id in self._inflight and p.due(now):
                        self._append_locked(encode((MessageKind.INFLIGHT, p)))

    def _wait_blob_room(self, size: int) -> None:
        """Hold a snapshot taker while the pipe's backlog is over the snapshot budget (the
        child also holds its own queue to it): memory stays bounded however large the walk."""
        deadline = time.monotonic() + BLOB_WAIT_S
        while self._backlog_bytes > SNAPSHOT_QUEUE_BYTES and self._error is None and not self._closed:
            if time.monotonic() > deadline:
                log.warning(
                    "journal %s: %d bytes wait to be sent to the writer process",
                    self.path,
                    self._backlog_bytes,
                )
                return
            time.sleep(0.05)

    # ------------------------------------------------------------------ replies

    def _read_replies(self, fd: int) -> None:
        with open(fd, "rb", buffering=1 << 16) as stream:
            while True:
                try:
                    reply = read_reply(stream)
                except (WireError, EOFError, ValueError):
                    reply = None
                if reply is None:
                    break
                self._on_reply(reply)
        if not self._closed_ack.is_set():
            # no log line of its own: whoever watches the journal (the gateway) says it once
            self._error = self._error or self._how_it_ended()
        # release whoever waits
        self._ready.set()
        self._closed_ack.set()
        for waiter in list(self._flushes.values()):
            waiter[0].set()

    def _how_it_ended(self) -> str:
        try:
            code = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            return f"the writer process (pid {self.pid}) closed its pipe"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        last = ""
        try:
            self._stderr.seek(0)
            lines = [ln for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            last = f" ({lines[-1].strip()[:300]})" if lines else ""
        except (OSError, ValueError):
            pass
        return f"the writer process (pid {self.pid}) {how}{last}"

    def _on_reply(self, reply: tuple) -> None:
        kind = reply[0]
        if kind == "ready":
            _, self.writer_id, key, self.reaped = reply
            self.fingerprint_key = bytes.fromhex(key)
            self._ready.set()
        elif kind == "failed":
            self._failed = (reply[1], reply[2])
            self._ready.set()
        elif kind == "flushed":
            waiter = self._flushes.pop(reply[1], None)
            if waiter is not None:
                waiter[1] = reply[2]
                waiter[0].set()
        elif kind == "log":
            log.log(reply[1], "%s", reply[2])
        elif kind == "error":
            self._error, self.recorded = reply[1], reply[2]
            for waiter in list(self._flushes.values()):
                waiter[0].set()  # flush() raises the error
        elif kind == "closed":
            self.recorded = reply[2]
            if reply[1] is not None or not self._closed:
                self._error = reply[1] or self._error or f"the writer process (pid {self.pid}) stopped"
            self._closed_ack.set()
