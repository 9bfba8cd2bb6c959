"""The connections a gateway holds: a bound on how many are open at once, and a deadline for
each request's head (docs/gateway.md, "Slow and too many clients").

A client that sends its request line and headers a byte at a time (or nothing at all) holds a
connection, and with it a file descriptor, for as long as it likes: 1,100 of them took every
descriptor of a gateway (limit 1024), and requests of real agents timed out. Here:

- **head deadline** (``--header-timeout``, seconds): a connection that has not sent a whole
  request head within that time of opening, or of the first byte of its next request on a
  kept-alive connection, is closed;
- **bound** (``--max-connections``): at the bound, a new connection makes room by closing the
  oldest open connection that has no request in progress (it is still sending its head, or it
  is idle between requests) and has been open for :data:`EVICT_AFTER_S` at least; when there
  is none, the new one is answered ``503`` with a one-line body and ``Connection: close`` and
  closed;
- **one warning line**, at most every :data:`WARN_INTERVAL_S` seconds, counting what was
  closed or refused since the last one (never a line, let alone a traceback, per connection).

Built on aiohttp's low-level server: :class:`GuardedServer` makes :class:`GuardedConnection`,
a ``RequestHandler`` that reports to a :class:`ConnectionGuard`.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

DEFAULT_HEADER_TIMEOUT_S = 20.0
DEFAULT_MAX_CONNECTIONS = 512
#: refused connections read (and dropped) at most at once; beyond, one is closed at once
REFUSED_LINGER_MAX = 32
#: descriptors the gateway needs beside its connections' (journal, writer pipes, log file,
#: about 20) and the refused ones it reads for a second
FD_RESERVE = 64 + REFUSED_LINGER_MAX
#: a connection younger than this (seconds) is never closed to make room: a client that has just
#: connected gets the time to send its head, however fast others connect
EVICT_AFTER_S = 0.5
#: at most one warning line this often (seconds)
WARN_INTERVAL_S = 10.0
#: a refused connection is read (and the bytes dropped) this long after its 503 went out, so
#: that the client reads the 503 rather than a reset; then it is closed
REFUSED_LINGER_S = 1.0

_REFUSAL_TEXT = b"pvisor gateway: too many open connections (--max-connections); retry later\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" % len(_REFUSAL_TEXT)
) + _REFUSAL_TEXT


def connection_bound(wanted: int) -> tuple[int, str | None]:
    """The bound on open connections that the process's descriptor limit allows for ``wanted``:
    each connection may need two descriptors (the agent's and the upstream's) and
    :data:`FD_RESERVE` more are kept. Raises the soft limit (``RLIMIT_NOFILE``) up to the hard
    one when it is too low. Returns ``(bound, why lowered or None)``."""
    need = 2 * wanted + FD_RESERVE
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return wanted, None
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, None
    bound = max(1, (soft - FD_RESERVE) // 2)
    return bound, (
        f"--max-connections {wanted} lowered to {bound}: the process may open {soft} files (ulimit -n)"
    )


class ConnectionGuard:
    """Counts the open connections of one server and enforces its bound and head deadline.

    ``max_connections``: the bound; ``header_timeout``: seconds (0: no deadline);
    ``loggers``: where the warning line goes (the terminal's and the log file's)."""

    def __init__(self, max_connections: int, header_timeout: float, loggers: tuple[logging.Logger, ...]):
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.loggers = loggers
        self.open: dict[GuardedConnection, float] = {}  # -> when it opened (monotonic); oldest first
        self.lingering = 0
        # since the last warning line
        self.timed_out = self.evicted = self.refused = 0
        # since the start, for tests and the bench (``pvisor gateway`` has no other place for them)
        self.total_timed_out = self.total_evicted = self.total_refused = 0
        self._last_warn = -WARN_INTERVAL_S
        self._warn_handle: asyncio.TimerHandle | None = None

    def admit(self, conn: GuardedConnection) -> bool:
        """Whether a new connection may open: True after making room if need be."""
        now = time.monotonic()
        if len(self.open) >= self.max_connections:
            victim = None
            for c, since in self.open.items():  # oldest first
                if now - since < EVICT_AFTER_S:
                    break  # the rest are younger: each gets its chance to send a head
                if not c.busy():
                    victim = c
                    break
            if victim is None:
                self.refused += 1
                self.total_refused += 1
                self._warn()
                return False
            self.evicted += 1
            self.total_evicted += 1
            self.open.pop(victim, None)
            victim.force_close()
            self._warn()
        self.open[conn] = now
        return True

    def closed(self, conn: GuardedConnection) -> None:
        self.open.pop(conn, None)

    def head_late(self) -> None:
        self.timed_out += 1
        self.total_timed_out += 1
        self._warn()

    def _warn(self) -> None:
        now = time.monotonic()
        wait = self._last_warn + WARN_INTERVAL_S - now
        if wait <= 0:
            self.say()
        elif self._warn_handle is None:
            self._warn_handle = asyncio.get_running_loop().call_later(wait, self.say)

    def say(self) -> None:
        """Log the warning line for what happened since the last one (nothing when nothing did)."""
        if self._warn_handle is not None:
            self._warn_handle.cancel()
            self._warn_handle = None
        parts = []
        if self.timed_out:
            parts.append(
                f"{self.timed_out} closed for sending no whole request head within "
                f"{self.header_timeout:g} s (--header-timeout)"
            )
        if self.evicted:
            parts.append(f"{self.evicted} idle or slow closed to make room")
        if self.refused:
            parts.append(f"{self.refused} refused with 503, none being idle or slow for {EVICT_AFTER_S:g} s")
        if not parts:
            return
        self.timed_out = self.evicted = self.refused = 0
        self._last_warn = time.monotonic()
        line = f"connections ({len(self.open)} open, at most {self.max_connections}): " + "; ".join(parts)
        for lg in self.loggers:
            if lg.handlers or lg.propagate:  # the log file's logger has a handler only with --log-file
                lg.warning("%s", line)


class GuardedConnection(RequestHandler):
    """aiohttp's ``RequestHandler`` under a :class:`ConnectionGuard`."""

    __slots__ = ("guard", "_head_timer", "_refused", "_linger")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._refused = not self.guard.admit(self)
        if self._refused:
            self._refuse(transport)  # type: ignore[arg-type]
            return
        super().connection_made(transport)
        self._arm()

    def _refuse(self, transport: asyncio.Transport) -> None:
        guard = self.guard
        if guard.lingering >= REFUSED_LINGER_MAX:  # a flood of refusals: no linger for more
            transport.abort()
            return
        guard.lingering += 1
        transport.write(REFUSAL)
        if transport.can_write_eof():
            transport.write_eof()
        self._linger = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.abort)

    def busy(self) -> bool:
        """A request is in progress (its head arrived and its handler, or its response, is not done)."""
        # aiohttp's own state (3.10 to 3.14): the parsed heads waiting for the handler, the
        # request being handled, and (3.11+) the response being finished
        return bool(
            getattr(self, "_messages", None)
            or getattr(self, "_current_request", None) is not None
            or getattr(self, "_request_in_progress", False)
        )

    def _arm(self) -> None:
        timeout = self.guard.header_timeout
        if timeout > 0:
            self._head_timer = asyncio.get_running_loop().call_later(timeout, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport is not None and not self.busy():
            self.guard.head_late()
            self.force_close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the linger ends
        if self._head_timer is None and data and not self.busy():
            self._arm()  # the first byte of the next request's head on a kept-alive connection
        super().data_received(data)
        if self._head_timer is not None and self.busy():
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._refused:
            self.guard.lingering -= 1
            if self._linger is not None:
                self._linger.cancel()
            return
        self.guard.closed(self)
        super().connection_lost(exc)


class GuardedServer(web.Server):
    """aiohttp's low-level ``web.Server`` whose connections are :class:`GuardedConnection`."""

    def __init__(self, handler: Any, guard: ConnectionGuard, **kwargs: Any):
        super().__init__(handler, **kwargs)
        self.guard = guard

    def __call__(self) -> RequestHandler:
        conn = GuardedConnection(self, loop=self._loop, **self._kwargs)
        conn.guard = self.guard
        return conn
