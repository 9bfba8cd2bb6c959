"""One session: the capture gateway with what surrounds it, composed in one place.

``pvisor gateway``, ``pvisor run`` (and replay-only and continuation through it) and ``pvisor
demo`` each build one :class:`SessionConfig` from their options and run one :class:`Session`
with it. Its parts, in the order they start (:data:`PARTS`):

1. ``signals``: the stop signals (SIGINT, SIGTERM, SIGHUP) handled by the event loop
   (:class:`StopSignals`), when the caller gives them; from here on no signal interrupts the
   session with a KeyboardInterrupt, the clean-up included.
2. ``listen``: the gateway's address bound (:func:`listening_sockets`). A port that is taken
   fails here, before anything is opened: the journal stays as it was (docs/cli.md).
3. ``journal``: the journal opened for writing (:func:`~pvisor.journal.writer_process.open_journal`).
4. ``gateway``: the :class:`~pvisor.gateway.proxy.Gateway` built with its journal, its
   responder (None: the upstream forwarder; replay's playback, the scripted model) and its
   workspace snapshots (``config.gateway.workspace``), serving the bound address.
5. ``mitmdump``: intercept mode's forward proxy in front of the gateway
   (:func:`~pvisor.gateway.intercept.start_proxy`), when ``config.intercept`` is given.

:meth:`Session.stop` ends them in one order, after success and after failure alike (a start
that fails stops what it had started, then raises): the gateway first (it stops accepting,
lets the exchanges in flight finish through mitmdump up to ``shutdown_grace`` s, records the
rest ``incomplete``), then mitmdump (nothing passes through it any more), then the journal
(it commits what the gateway handed it and waits for a writer process), and the signal handlers
last. A caller may stop the gateway earlier itself (``pvisor run`` does, before it derives the
steps): :meth:`~pvisor.gateway.proxy.Gateway.stop` is idempotent, as is every part's stop.

Errors: :meth:`Session.start` raises the OSError of the address (the port is taken, the host
unknown) or of the gateway's log file (its ``filename`` set), and what opening the journal or
starting mitmdump raises (:class:`~pvisor.core.errors.PvisorError`); the caller says them in
its words.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable

from pvisor.gateway.intercept import InterceptConfig, serve_intercepted, start_proxy
from pvisor.gateway.proxy import FINALIZER, Gateway, GatewayConfig
from pvisor.gateway.responder import Responder
from pvisor.journal.producer import JournalProducer
from pvisor.journal.writer_process import open_journal
from pvisor.session.supervise import STOP_SIGNALS

#: the parts of a session in the order they start; :meth:`Session.stop` ends them in reverse
#: of this order, except that mitmdump ends after the gateway (the exchanges in flight pass
#: through it), and the signals last
PARTS = ("signals", "listen", "journal", "gateway", "mitmdump")


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP while a session runs, on the running event loop. The first sets
    :attr:`event` and is kept in :attr:`signum`; every later one sets :attr:`hurry` (no more
    grace for what is in flight) and calls :attr:`on_repeat` when set. :meth:`install` and
    :meth:`remove` are called by :class:`Session` (first and last)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.hurry = asyncio.Event()
        self.signum: int | None = None
        self.on_repeat: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, signum: int) -> None:
        if self.event.is_set():
            self.hurry.set()
            if self.on_repeat is not None:
                self.on_repeat()
        else:
            self.signum = signum
            self.event.set()

    async def wait(self) -> int:
        """Return the first signal's number once it came."""
        await self.event.wait()
        assert self.signum is not None
        return self.signum

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number (SIGHUP 129, SIGINT 130, SIGTERM 143)."""
        return 128 + (self.signum or signal.SIGINT)

    def install(self) -> None:
        """Handle the signals on the running loop from now on (once: installed, it is kept)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self, sig)

    def remove(self) -> None:
        """Idempotent."""
        if self._loop is not None:
            loop, self._loop = self._loop, None
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bind ``host``:``port`` (0: a free port) as asyncio's ``create_server`` does: one socket
    per address ``host`` resolves to (``""``: every interface), ``SO_REUSEADDR`` on POSIX, IPv6
    sockets IPv6-only. Not listening yet: the gateway serves them. Raises the OSError of the
    first address that cannot be bound (``socket.gaierror`` for a host that does not resolve),
    with every socket bound so far closed."""
    infos = socket.getaddrinfo(host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)  # fmt: skip
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # an address family this machine cannot open (IPv6 off): as asyncio
                continue
            sockets.append(sock)
            if os.name == "posix" and sys.platform != "cygwin":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
        if not sockets:
            raise OSError(f"no address to listen on for {host!r}")
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def unix_listener(path: str) -> socket.socket:
    """A Unix socket bound at ``path`` (not listening yet: the gateway serves it). Raises the
    OSError of the bind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class SessionConfig:
    """Everything a :class:`Session` is built from, made once from a command's options and read
    by the session and by the command that runs it (``pvisor gateway``:
    :func:`pvisor.commands.serve.session_config`; ``pvisor run``, replay-only and continuation:
    :func:`pvisor.session.run.session_config`; the demo).

    Fields: ``journal`` the journal file; ``gateway`` the gateway's settings
    (:class:`~pvisor.gateway.proxy.GatewayConfig`: where it listens, its upstreams and limits,
    the token, the workspace it snapshots); ``intercept`` an
    :class:`~pvisor.gateway.intercept.InterceptConfig` to run mitmdump in front of the gateway
    (None: a reverse proxy only), whose gateway settings are made to serve it when the record
    is built (:func:`~pvisor.gateway.intercept.serve_intercepted`); ``journal_wait`` seconds the
    journal's close may wait for a lock held by another process (None: its default);
    ``unix_socket``: a path where the gateway also listens, a Unix socket (a sandboxed agent's
    relay forwards to it: :mod:`pvisor.session.sandbox`), None for none."""

    journal: str | os.PathLike[str]
    gateway: GatewayConfig
    intercept: InterceptConfig | None = None
    journal_wait: float | None = None
    unix_socket: str | None = None

    def __post_init__(self) -> None:
        if self.intercept is not None:
            serve_intercepted(self.gateway, self.intercept)


class Session:
    """The gateway and what surrounds it (see the module docstring for the parts and their
    order). ``config``: the :class:`SessionConfig` (``config.gateway.host`` and ``port`` are
    where it listens); ``responder``: its answer source (None: forward to the gateway's
    upstreams); ``signals``: :class:`StopSignals` to handle while the session lives.

    After :meth:`start`: :attr:`gateway`, :attr:`journal`, :attr:`proxy` (None without
    intercept) and :attr:`url` (the gateway's). Usable as ``async with``."""

    def __init__(
        self,
        config: SessionConfig,
        responder: Responder | None = None,
        *,
        signals: StopSignals | None = None,
    ) -> None:
        self.config = config
        self.responder = responder
        self.signals = signals
        self.journal: JournalProducer | None = None
        self.gateway: Gateway | None = None
        self.proxy: Any = None
        self.url: str | None = None
        #: the parts started so far, in order (a subset of :data:`PARTS`)
        self.started: list[str] = []

    async def start(self) -> str:
        """Start the parts in :data:`PARTS` order; return the gateway's URL. On a failure what
        started is stopped (:meth:`stop`) before the error propagates."""
        try:
            if self.signals is not None:
                self.signals.install()
                self.started.append("signals")
            sockets = listening_sockets(self.config.gateway.host, self.config.gateway.port)
            if self.config.unix_socket is not None:
                try:  # after the TCP ones: the gateway's URL is the first socket's
                    sockets.append(unix_listener(self.config.unix_socket))
                except BaseException:
                    for sock in sockets:
                        sock.close()
                    raise
            self.started.append("listen")
            try:
                self.journal = open_journal(self.config.journal, finalize=FINALIZER)
                self.started.append("journal")
                self.gateway = Gateway(self.config.gateway, self.journal, self.responder)
            except BaseException:
                for sock in sockets:
                    sock.close()
                raise
            self.url = await self.gateway.start(sockets)
            self.started.append("gateway")
            if self.config.intercept is not None:
                self.proxy = await start_proxy(self.config.intercept, self.gateway)
                self.started.append("mitmdump")
        except BaseException:
            await self.stop()
            raise
        return self.url

    async def stop(self) -> int:
        """Stop the gateway (letting the exchanges in flight finish, up to ``shutdown_grace``
        s), mitmdump, the journal, the signal handlers, in this order; each also when one before
        it failed. Returns how many exchanges were cancelled (0 when the gateway was stopped
        before). Idempotent."""
        cancelled = 0
        try:
            if self.gateway is not None:
                cancelled = await self.gateway.stop()
        finally:
            try:
                if self.proxy is not None:  # after the gateway: the exchanges in flight pass through it
                    await self.proxy.stop()
            finally:
                try:
                    # also after a writer failure: a writer process is waited for
                    if self.journal is not None:
                        if self.config.journal_wait is None:
                            self.journal.close()
                        else:
                            self.journal.close(timeout=self.config.journal_wait)
                finally:
                    if self.signals is not None:  # last: no signal interrupts the clean-up
                        self.signals.remove()
        return cancelled

    async def take_snapshot(self, kind: Any, run: str | None = None, attempt: int | None = None) -> Any:
        """A workspace snapshot now (:meth:`~pvisor.gateway.proxy.Gateway.take_snapshot`), None
        when ``config.gateway.workspace`` is None."""
        assert self.gateway is not None, "Session.start() was not awaited"
        return await self.gateway.take_snapshot(kind, run, attempt)

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


__all__ = ["PARTS", "STOP_SIGNALS", "Session", "SessionConfig", "StopSignals", "listening_sockets"]
