"""The capture gateway: an aiohttp server that answers agents through the responder seam and
records every exchange in the journal.

Hot path per request: resolve the route (string operations), read the request body, hand the
request as plain data to the responder (:mod:`pvisor.gateway.responder`; by default every
request is forwarded upstream by :class:`~pvisor.gateway.forwarder.UpstreamForwarder`), and
write each chunk of the answer to the agent as soon as it is there, keeping a reference to it
for the journal (:meth:`Gateway._relay`, the one relay every answer goes through). The relay fills
in the exchange's :class:`~pvisor.journal.exchange_end.ExchangeEnd` as it goes; when the
exchange ends, that record goes to the journal writer unchanged, through the
:class:`~pvisor.gateway.recorder.Recorder`, which redacts, decodes, compresses and reassembles
off the event loop. Nothing here waits for the disk or parses a body.

Failure handling and outcomes: docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from time import perf_counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import aiohttp
import orjson
from aiohttp import web

from pvisor.adapters.protocols import UPSTREAMS, get_protocol
from pvisor.journal.exchange_end import CaptureMode, ExchangeEnd, Outcome, ServedBy
from pvisor.journal.model import TRUNCATED_FLAG
from pvisor.journal.redact import redact_url
from pvisor.journal.snapshots import SnapshotKind, SnapshotRecord, snapshot_driver
from pvisor.journal.producer import new_run_id
from pvisor.journal.writer import Journal

from .access import InterceptGate, TokenGate, listen_url
from .connections import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    ConnectionGuard,
    GuardedServer,
    connection_bound,
)
from .credentials import UpstreamCredentials
from .finalize import FINALIZER, finalize_response
from .forwarder import HOP_BY_HOP, SOCK_CONNECT_TIMEOUT_S, UpstreamForwarder, forwardable, os_error_reason
from .log_file import LogFile
from .lifecycle import InFlight, close_idle_connections, route_aiohttp_logs, unroute_aiohttp_logs
from .recorder import Current, Recorder, ResponseBudget, us_since
from .responder import Answer, Forward, IncomingRequest, Refuse, Responder, Serve, StreamBroken
from .routing import INTERCEPT_HEADER, RUN_HEADER, Route, Router, origin_form
from .snapshots import WorkspaceSnapshots

__all__ = [
    "FINALIZER",
    "Gateway",
    "GatewayConfig",
    "finalize_response",
    "os_error_reason",
    "SOCK_CONNECT_TIMEOUT_S",
]

MIB = 1024 * 1024
DEFAULT_MAX_BODY = 64 * MIB
DEFAULT_STALL_TIMEOUT_S = 600.0
#: response bytes journaled of one exchange (--max-response-body): far above any model reply,
#: and below SQLite's limit of 1,000,000,000 bytes for one blob
DEFAULT_MAX_RESPONSE_BODY = 256 * MIB
#: response bytes the gateway keeps for the journal across all exchanges in flight
DEFAULT_RESPONSE_BUDGET = 512 * MIB

_RESPONSE_DROP = HOP_BY_HOP
_INTERCEPT_LOWER = INTERCEPT_HEADER.lower()
# the agent's connection broke (reading its body, or writing to it). ConnectionError, not only
# ConnectionResetError: aiohttp raises a plain ConnectionError("Connection lost") to a write
# waiting for the agent to read (a fast stream to a slow agent) when the agent goes away
_CLIENT_GONE = (ConnectionError, aiohttp.ClientConnectionError, asyncio.IncompleteReadError)

#: events worth a line on the terminal (an internal error); the CLI shows them on stderr
log = logging.getLogger("pvisor.gateway")


@dataclass
class GatewayConfig:
    """Settings of one gateway.

    Fields: ``host``/``port`` to listen on (port 0: any free port); ``upstreams`` name -> base
    URL given by the user (``--upstream NAME=URL``; the others take their public defaults);
    ``run`` the gateway's run id (generated when None); ``max_body`` request body limit in
    bytes; ``max_response_body`` the response bytes journaled of one exchange and
    ``response_budget`` those kept across the exchanges in flight (past either the answer is
    still relayed whole, journaled in part and flagged ``truncated``); ``stall_timeout``
    seconds without upstream bytes before giving up; ``log_file``;
    ``shutdown_grace`` seconds :meth:`Gateway.stop` waits for exchanges in flight;
    ``attempt`` the attempt number recorded for the exchanges of the gateway's own run (``pvisor
    run --resume`` records a native resume as attempt 2, 3, ...; other runs get 1); ``offline``
    refuse every Forward answer (no upstream is contacted: replay-only); ``workspace`` the
    directory snapshotted when a candidate main-loop request arrives (None: no snapshots), with
    the snapshot driver named ``snapshot_driver``, never reading ``snapshot_exclude`` (the
    journal, a run's own files) when they lie inside it; ``token`` the token every request must
    carry as the path prefix ``/t/<token>`` (:mod:`.access`; None: none needed, for a loopback
    address); ``intercept_token`` and ``intercept_origins`` (origin -> base URL: the origin
    itself or its ``--redirect`` address) serve intercept mode's mitmdump addon
    (docs/intercept.md; None: the gateway takes no intercepted request); with ``intercept_only``
    the gateway takes nothing else (a request without the addon's header gets 401, unrecorded:
    the gateway behind mitmdump is no reverse proxy for whoever finds its port);
    ``header_timeout`` seconds a connection may take to send a whole request head (0: no limit)
    and ``max_connections`` the bound on open connections (:mod:`.connections`);
    ``credentials`` the keys the gateway adds when it forwards in place of the agent's dummy
    (:class:`~pvisor.gateway.credentials.UpstreamCredentials`; None: requests are forwarded with
    the agent's own credentials, as it sent them).
    """

    host: str = "127.0.0.1"
    port: int = 8787
    upstreams: dict[str, str] = field(default_factory=dict)
    run: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    max_response_body: int = DEFAULT_MAX_RESPONSE_BODY
    response_budget: int = DEFAULT_RESPONSE_BUDGET
    stall_timeout: float = DEFAULT_STALL_TIMEOUT_S
    log_file: Path | None = None
    shutdown_grace: float = 10.0
    attempt: int = 1
    offline: bool = False
    workspace: Path | None = None
    snapshot_driver: str = "filesystem"
    snapshot_exclude: tuple[Path, ...] = ()
    token: str | None = None
    intercept_token: str | None = None
    intercept_origins: dict[str, str] | None = None
    intercept_only: bool = False
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    credentials: UpstreamCredentials | None = None


class Gateway:
    """The gateway bound to a :class:`~pvisor.journal.writer.Journal`, answering through
    ``responder`` (default: its :class:`~pvisor.gateway.forwarder.UpstreamForwarder`, the
    capture gateway; an offline gateway must be given one).

    ``await start()`` returns the URL it listens on; ``await stop()`` stops accepting, lets
    in-flight exchanges finish for ``shutdown_grace`` seconds (less after :meth:`hurry`),
    cancels the rest (each is recorded ``incomplete`` with the bytes it had moved) and closes.
    The journal is not closed here: its owner closes it. With ``config.offline`` a
    :class:`~pvisor.gateway.responder.Forward` answer is refused (502): nothing leaves the
    machine (replay-only).
    """

    def __init__(self, config: GatewayConfig, journal: Journal | None, responder: Responder | None = None):
        self.config = config
        self.run = config.run or new_run_id()
        all_upstreams = {name: default for name, (default, _) in UPSTREAMS.items()}
        all_upstreams.update(config.upstreams)
        self.router = Router(all_upstreams, set(config.upstreams), self.run, config.intercept_origins)
        self._gate = TokenGate(config.token) if config.token is not None else None
        self._intercept = (
            InterceptGate(config.intercept_token, config.intercept_origins or {})
            if config.intercept_token is not None
            else None
        )
        self.forwarder = UpstreamForwarder(self.router.upstreams, config.stall_timeout, config.credentials)
        if responder is None and config.offline:
            raise ValueError("an offline gateway forwards nothing: give it a responder")
        self.responder: Responder = responder if responder is not None else self.forwarder
        self.url: str | None = None
        self._runner: web.ServerRunner | None = None
        self._sites: list[web.BaseSite] = []
        self._inflight = InFlight()
        self.budget = ResponseBudget(config.max_response_body, config.response_budget)
        self._log = _new_logger()
        self.connections: ConnectionGuard | None = None  # made by start()
        self.recorder = Recorder(journal, self._log)
        self._log_file: LogFile | None = None
        self._routed_logs = False
        self.snapshots: WorkspaceSnapshots | None = None
        if config.workspace is not None:
            self.snapshots = WorkspaceSnapshots(
                config.workspace,
                lambda: self.recorder.journal,
                snapshot_driver(config.snapshot_driver),
                (*config.snapshot_exclude, *([config.log_file] if config.log_file else [])),
            )

    @property
    def log(self) -> logging.Logger:
        """The gateway's own logger (one line per exchange into ``--log-file``; no handler
        without one)."""
        return self._log

    @property
    def journal(self) -> Journal:
        assert self.recorder.journal is not None
        return self.recorder.journal

    @journal.setter
    def journal(self, journal: Journal) -> None:
        self.recorder.journal = journal

    # ------------------------------------------------------------------ lifecycle

    async def start(self, sockets: Sequence[socket.socket] = ()) -> str:
        """Bind and serve. Returns ``http://HOST:PORT``. On any failure (the log file cannot be
        opened, the port is taken) everything started so far is closed before the error
        propagates. No run row is written here: the journal creates it with the run's first
        exchange, so a gateway that records nothing leaves no empty run. ``sockets``: sockets
        bound already to ``config.host`` and ``config.port``, served instead of binding here
        (:class:`pvisor.session.session.Session` binds before it opens the journal); they are
        closed with the gateway, also when the start fails."""
        try:
            if self.config.log_file is not None:
                self._log_file = LogFile(self._log, self.config.log_file)
            route_aiohttp_logs(self._log)  # one line each in the log file, never a traceback on the terminal
            self._routed_logs = True
            await self.forwarder.start()
            bound, lowered = connection_bound(self.config.max_connections)
            if lowered:
                log.warning("%s", lowered)
            self.connections = ConnectionGuard(bound, self.config.header_timeout, (log, self._log))
            server = GuardedServer(self.handle, self.connections, auto_decompress=False, access_log=None)
            # a body is read chunk by chunk against --max-body, not by aiohttp's client_max_size;
            # stop() has ended every handler before the runner's own shutdown, which then only
            # closes idle connections
            self._runner = web.ServerRunner(
                server, handle_signals=False, access_log=None, shutdown_timeout=1.0
            )
            await self._runner.setup()
            sites = (
                [web.SockSite(self._runner, sock) for sock in sockets]
                if sockets
                else [web.TCPSite(self._runner, self.config.host, self.config.port)]
            )
            for site in sites:
                await site.start()
                self._sites.append(site)
        except BaseException:
            await self._close()
            for sock in sockets:
                sock.close()
            raise
        sock = self._runner.addresses[0]
        self.url = listen_url(sock[0], sock[1])
        self._log.info("listening %s run=%s", self.url, self.run)
        return self.url

    @property
    def port(self) -> int:
        """The port it listens on (after :meth:`start`)."""
        assert self._runner is not None and self._runner.addresses, "Gateway.start() was not awaited"
        return self._runner.addresses[0][1]

    @property
    def in_flight(self) -> int:
        """Requests being handled now."""
        return len(self._inflight)

    def hurry(self) -> None:
        """Make a running or coming :meth:`stop` cancel the exchanges in flight at once
        instead of waiting for them (a second SIGINT)."""
        self._inflight.hurry()

    async def stop(self) -> int:
        """Stop accepting; wait up to ``shutdown_grace`` s for in-flight exchanges (less after
        :meth:`hurry`); cancel the rest, each recorded ``incomplete`` with what it had moved;
        close the connections, the upstream session and the log file. Returns how many were
        cancelled (0 when called again)."""
        if self._sites:
            sites, self._sites = self._sites, []
            for site in sites:
                await site.stop()
            close_idle_connections(self._runner)
        cancelled = await self._inflight.settle(self.config.shutdown_grace)
        if cancelled:
            self._log.info("cancelled %d exchange(s) in flight", cancelled)
        await self._close()
        return cancelled

    async def _close(self) -> None:
        """Close what :meth:`start` opened (idempotent; also after a failed start)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self.connections is not None:
            self.connections.say()  # what was closed or refused since the last warning line
        await self.forwarder.close()
        if self.snapshots is not None:
            await self.snapshots.close()
        if self._routed_logs:
            unroute_aiohttp_logs(self._log)
            self._routed_logs = False
        if self._log_file is not None:
            log_file, self._log_file = self._log_file, None
            self._log.info("stopped")
            log_file.close()  # writes what is queued, then closes the file; never raises

    async def watch_journal(self, interval: float = 0.5) -> str:
        """Return the journal writer's error as soon as it has one (checked every ``interval``
        s): from then on nothing is recorded, so the gateway must not go on answering."""
        while self.journal.error is None:
            await asyncio.sleep(interval)
        return self.journal.error

    async def take_snapshot(
        self, kind: SnapshotKind, run: str | None = None, attempt: int | None = None
    ) -> SnapshotRecord | None:
        """Snapshot the workspace now for ``run`` (default the gateway's own), e.g. ``START``
        before the agent starts and ``END`` after it ended; None without a workspace. Waits for
        the walk (in its thread: the loop goes on serving)."""
        if self.snapshots is None:
            return None
        pending = self.snapshots.take(run or self.run, attempt or self.config.attempt, kind)
        records = await asyncio.shield(pending.done)
        return next(r for r in records if r.id == pending.id)

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait until no request is in flight (up to ``timeout`` s), then until the journal has
        committed everything queued. An exchange is queued after its last byte is written, so a
        client may hold a response before its exchange is recorded; after ``drain`` it is."""
        await self._inflight.wait_idle(timeout)
        await asyncio.get_running_loop().run_in_executor(None, self.journal.flush)

    # ------------------------------------------------------------------ request handling

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        cur = Current()
        task = asyncio.current_task()
        self._inflight.add(task)
        try:
            return await self._handle(request, cur)
        except asyncio.CancelledError:
            # stop() cancelled it after the grace period: record what it had (the relay
            # loop records its own, with the bytes moved), then let the connection close
            if cur.end is not None:
                self._finish(
                    cur, None, Outcome.INCOMPLETE, "gateway stopped while the exchange was in flight"
                )
            raise
        except Exception as exc:
            return self._internal_error(request, cur, exc)
        finally:
            self.budget.release(cur)
            self._inflight.discard(task)

    async def _handle(self, request: web.BaseRequest, cur: Current) -> web.StreamResponse:
        if self.recorder.journal is not None and self.recorder.journal.error is not None:
            return self._journal_down()
        admitted = self._admit(request)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        raw_path, origin = admitted
        route = self.router.resolve(raw_path, request.headers.get(RUN_HEADER), origin)
        if route.kind == "health":
            return web.json_response(
                {"ok": True, "run": self.run, "inflight": len(self._inflight) - 1},
                dumps=lambda o: orjson.dumps(o).decode(),
            )
        headers, attempt = self._begin(request, cur, route, origin)
        end = cur.end
        assert end is not None
        # the body first, also for the answers the gateway gives itself, so that it is recorded
        refused = await self._read_body(request, cur)
        if refused is not None:
            return refused
        self.recorder.request_read(end)
        refusal = _refusal(request, route, origin)
        if refusal is not None:
            return self._refuse(cur, refusal)
        pending = end.pending
        incoming = IncomingRequest(
            exchange=pending.id,
            run=route.run,
            attempt=attempt,
            method=request.method,
            path=route.path,
            query=route.query,
            target=route.target,
            headers=tuple(headers),
            body=end.request_body or b"",
            encoding=end.request_encoding,
            upstream=route.upstream,
            protocol=route.protocol,
            t0=pending.t0,
            base=route.base,
            workspace_read=cur.snapshot.done if cur.snapshot is not None else None,
        )
        answer = await self._answer(incoming, end)
        if isinstance(answer, Refuse):
            return self._refuse(cur, answer)
        end.served_by = answer.served_by
        end.flags = tuple(answer.flags)
        try:
            return await self._relay(request, cur, answer, us_since(pending))
        except BaseException:
            await _aclose(answer.chunks)  # cut short (cancelled, or a bug): an upstream body cannot be reused
            raise

    def _admit(self, request: web.BaseRequest) -> tuple[str, str | None] | web.StreamResponse:
        """The request's path without this gateway's token and the intercepted origin it names
        (None in reverse mode), or the 401 for a request without the token."""
        raw_path = origin_form(request.raw_path)  # no user info, no fragment: never forwarded or kept
        if self._gate is not None:
            stripped = self._gate.strip(raw_path)
            if stripped is None:
                return self._unauthorized(request)
            raw_path = stripped
        origin = None
        if self._intercept is not None and INTERCEPT_HEADER in request.headers:
            origin = self._intercept.origin(request.headers[INTERCEPT_HEADER])
            if origin is None:
                return self._unauthorized(request, intercepted=True)
        elif self.config.intercept_only:
            return self._unauthorized(request, intercepted=True)
        return raw_path, origin

    def _begin(
        self, request: web.BaseRequest, cur: Current, route: Route, origin: str | None
    ) -> tuple[list[tuple[str, str]], int]:
        """Begin the exchange of ``cur`` in the journal, its :class:`ExchangeEnd` filled in from
        here on, and the workspace snapshot of a candidate request started. Returns the request
        headers recorded and the attempt."""
        if origin is None:
            headers = list(request.headers.items())
            capture = CaptureMode.REVERSE
        else:  # the addon's header is the gateway's business, not the agent's: never recorded
            headers = [kv for kv in request.headers.items() if kv[0].lower() != _INTERCEPT_LOWER]
            capture = CaptureMode.INTERCEPT
        attempt = self.config.attempt if route.run == self.run else 1
        pending = self.recorder.begin(route, request.method, headers, attempt, capture)
        cur.route = route
        # the exchange's end, filled in from here on (served_by: the gateway's own until an answer
        # says who), handed to the journal unchanged when the exchange ends
        cur.end = ExchangeEnd(
            pending,
            request_encoding=request.headers.get("Content-Encoding"),
            served_by=ServedBy.REFUSED,
            max_body=self.config.max_response_body,
        )
        if self.snapshots is not None and request.method == "POST" and self.router.is_candidate(route):
            # the walk starts now and the request goes on at once; the answer's first byte waits for it
            cur.snapshot = self.snapshots.take(route.run, attempt, SnapshotKind.REQUEST, pending.id)
        return headers, attempt

    async def _answer(self, incoming: IncomingRequest, end: ExchangeEnd) -> Answer:
        """The responder's answer to ``incoming``, a :class:`Forward` carried out by the
        forwarder (or refused when the gateway forwards nothing)."""
        answer: Answer = await self.responder.respond(incoming)
        if not isinstance(answer, Forward):
            return answer
        if self.config.offline:
            return Refuse(
                502,
                "pvisor_offline",
                "this gateway forwards nothing (replay-only): no upstream is used",
                Outcome.UPSTREAM_UNREACHABLE,
                headers=[("x-pvisor-error", "offline")],
            )
        fwd = answer
        if fwd.body is not None:
            end.forwarded_body = fwd.body  # journaled beside the agent's bytes
        answer = await self.forwarder.forward(incoming, fwd)
        if isinstance(answer, Refuse) and fwd.flags:
            answer.flags = (*answer.flags, *fwd.flags)
        return answer

    async def _read_body(self, request: web.BaseRequest, cur: Current) -> web.StreamResponse | None:
        """Read the request body into ``cur.end.request_body``, bounded by --max-body. Returns the
        response when the exchange ends here (413, or the agent went away)."""
        end = cur.end
        assert end is not None
        max_body = self.config.max_body
        if request.content_length is not None and request.content_length > max_body:
            return self._oversize(cur, request.content_length)
        parts: list[bytes] = []
        size = 0
        try:
            if (
                request.headers.get("Expect", "").lower() == "100-continue"
                and request.version >= aiohttp.HttpVersion11
            ):
                # the client waits for this before it sends the body (Expect is not forwarded)
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            async for data in request.content.iter_any():
                size += len(data)
                parts.append(data)
                if size > max_body:
                    end.request_body = b"".join(parts)
                    return self._oversize(cur, size)
        except _CLIENT_GONE as exc:
            end.request_body = b"".join(parts)
            self._finish(
                cur,
                None,
                Outcome.ABORTED_BY_CLIENT,
                f"client went away while sending the request: {type(exc).__name__}",
            )
            return _nobody_listens()
        end.request_body = b"".join(parts)
        return None

    async def _relay(
        self, request: web.BaseRequest, cur: Current, answer: Serve, headers_us: int
    ) -> web.StreamResponse:
        """Write ``answer`` to the agent chunk by chunk (the one relay of every answer) and
        record the exchange with what was moved: an async ``chunks`` source that raises
        :class:`StreamBroken` is passed on as far as it got and the connection cut; an agent
        that goes away stops the source (``aclose``)."""
        route, end = cur.route, cur.end
        assert route is not None and end is not None
        # Gemini :streamGenerateContent answers a JSON array without alt=sse: a stream by its path
        streamed = answer.streamed or (
            answer.served_by is ServedBy.UPSTREAM and self.router.path_streams(route)
        )
        resp = _response_head(answer, streamed)
        source = answer.chunks if answer.body is None else ([answer.body] if answer.body else [])
        moved = _Moved(streamed, headers_us, list(answer.headers))
        moved.outcome = Outcome.UPSTREAM_ERROR if answer.status >= 400 else Outcome.OK
        if cur.snapshot is not None and self.snapshots is not None:
            # no byte of the answer (so no tool call it asks for) before the workspace was read
            held = perf_counter()
            await asyncio.shield(cur.snapshot.done)
            self.snapshots.held(cur.snapshot.id, int((perf_counter() - held) * 1e6))
        try:
            await resp.prepare(request)
        except _CLIENT_GONE:
            await _aclose(source)
            self._end_relay(
                cur, answer, moved, Outcome.ABORTED_BY_CLIENT, "client went away before the response started"
            )
            return resp
        cur.started = True
        self.recorder.response_started(end, answer.status, moved.up_headers, moved.chunks, streamed)
        if request.method != "HEAD" and source is not None:
            await self._copy(resp, cur, answer, source, moved)
        elif source is not None:
            await _aclose(source)
        if moved.outcome is Outcome.UPSTREAM_RESET:
            # pass on exactly what arrived, then cut the connection: the agent must see a broken stream
            self._end_relay(cur, answer, moved, moved.outcome, moved.error)
            if request.transport is not None:
                request.transport.abort()
            return resp
        if moved.outcome is not Outcome.ABORTED_BY_CLIENT:
            try:
                await resp.write_eof()
            except _CLIENT_GONE:
                # every byte received reached the agent (a failed write breaks out above): one
                # that stops reading at its last event (data: [DONE]) and closes got the whole
                # answer, the chunked terminator aside; the outcome stays what it was
                pass
        self._end_relay(cur, answer, moved, moved.outcome, moved.error)
        return resp

    async def _copy(
        self, resp: web.StreamResponse, cur: Current, answer: Serve, source: Any, moved: _Moved
    ) -> None:
        """The relay's loop: each chunk of ``source`` written to the agent and kept for the
        journal (within --max-response-body and the budget) with its timing; ``moved`` gets the
        counts, and the outcome when the stream broke or the agent went away. The counts live
        in locals while it runs: this is the gateway's hot path."""
        end = cur.end
        assert end is not None
        pending = end.pending
        t0 = pending.t0
        chunks, timings = moved.chunks, moved.timings
        received = delivered = 0
        truncated = False
        first_us: int | None = None  # the first byte's µs since start (a chunk kept or not)
        sync = not hasattr(source, "__aiter__")
        it = iter(source) if sync else source.__aiter__()
        while True:
            try:
                chunk = next(it, None) if sync else await it.__anext__()
                if chunk is None:
                    break
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                moved.counted(received, delivered, first_us)
                self._end_relay(cur, answer, moved, Outcome.INCOMPLETE, _stopped(received, delivered))
                raise
            except StreamBroken as exc:
                moved.outcome, moved.error = Outcome(exc.outcome), exc.message
                break
            n = len(chunk)
            if first_us is None:
                first_us = int((perf_counter() - t0) * 1e6)
            received += n
            if not truncated:
                # the journal keeps what fits --max-response-body and the budget; the agent gets all
                kept = self.budget.take(cur, n)
                if kept:
                    chunks.append(chunk if kept == n else chunk[:kept])
                    timings += (int((perf_counter() - t0) * 1e6) if timings else first_us, kept)
                if kept < n:
                    truncated = True
                    end.flags = (*end.flags, TRUNCATED_FLAG)
            try:
                await resp.write(chunk)
            except asyncio.CancelledError:
                moved.counted(received, delivered, first_us)
                self._end_relay(cur, answer, moved, Outcome.INCOMPLETE, _stopped(received, delivered))
                raise
            except _CLIENT_GONE:
                await _aclose(source)  # stop the upstream generating for nobody
                moved.outcome = Outcome.ABORTED_BY_CLIENT
                moved.error = f"client went away after {delivered} of {received} bytes"
                break
            delivered += n
            pending.delivered = delivered  # for the journal while the exchange is in flight
        moved.counted(received, delivered, first_us)

    def _end_relay(
        self, cur: Current, answer: Serve, moved: _Moved, outcome: Outcome, error: str | None
    ) -> None:
        """End a relayed exchange with what was moved. What was moved goes into the end only
        now: an exchange cut short before (a bug, a cancellation) is recorded without it, by
        the handler."""
        end = cur.end
        assert end is not None
        end.response_headers = moved.up_headers
        end.response_body = moved.chunks  # the writer takes the chunks as they are: never joined here
        end.streamed = moved.streamed
        end.chunk_timings = moved.timings
        end.headers_us = moved.headers_us
        end.first_byte_us = moved.first_us
        end.bytes_received = moved.received
        end.bytes_delivered = moved.delivered
        self._finish(cur, answer.status, outcome, error)

    def _internal_error(self, request: web.BaseRequest, cur: Current, exc: Exception) -> web.StreamResponse:
        """A bug or an unforeseen condition: record the exchange (``incomplete``, error
        ``pvisor internal error: <type>``), log one line (the type only: an exception's text
        may hold a URL with a key), and answer 500 in the protocol's JSON error shape unless
        the response has started (then the connection is cut)."""
        kind = type(exc).__name__
        message = f"pvisor internal error: {kind}"
        if cur.route:
            query = "?" + cur.route.query if cur.route.query else ""
            where = f"{request.method} {redact_url(cur.route.path + query)}"
        else:
            where = request.method
        exchange = cur.end.pending.id if cur.end is not None else "-"
        log.error("%s (exchange %s, %s)", message, exchange, where)
        status = None if cur.started else 500
        if cur.end is not None:
            self._finish(cur, status, Outcome.INCOMPLETE, message)
        if cur.started:
            if request.transport is not None:
                request.transport.abort()
            return _nobody_listens()
        route = cur.route or Route("no_route", self.run, None, "", "", "", None)
        resp = web.Response(
            status=500,
            body=self._error_body(route, 500, "pvisor_internal_error", message),
            headers={"Content-Type": "application/json"},
        )
        resp.force_close()
        return resp

    # ------------------------------------------------------------------ the gateway's own answers

    def _error_body(self, route: Route, status: int, kind: str, message: str) -> bytes:
        if route.protocol is not None:
            return get_protocol(route.protocol).error_body(status, message, kind)
        return orjson.dumps({"error": {"type": kind, "message": message}})

    def _journal_down(self) -> web.StreamResponse:
        """503 once the journal writer has stopped (a full disk): a capture gateway must not
        answer what it cannot record. Not journaled (it cannot be); the gateway is stopping."""
        message = "the pvisor journal cannot record (its writer stopped); the gateway is stopping"
        body = orjson.dumps(
            {"type": "error", "error": {"type": "pvisor_journal_unavailable", "message": message}}
        )
        resp = web.Response(status=503, body=body, content_type="application/json")
        resp.force_close()
        return resp

    def _unauthorized(self, request: web.BaseRequest, intercepted: bool = False) -> web.StreamResponse:
        """401 for a request without this gateway's token (in its path, or for ``intercepted``
        in intercept mode's header). Not journaled (whoever can reach the port could fill the
        journal) and not forwarded; the log file gets one line with the caller's address and
        method, never the path (it may hold a mistyped token)."""
        peer = request.remote or "-"
        why = (
            f"its {INTERCEPT_HEADER} header names no intercepted origin with this gateway's token"
            if intercepted
            else "no valid gateway token in the path (/t/<token>/...)"
        )
        if self._log.handlers:
            self._log.info("refused %s from %s: %s", request.method, peer, why)
        message = f"this gateway refused the request: {why}"
        body = orjson.dumps({"type": "error", "error": {"type": "pvisor_unauthorized", "message": message}})
        resp = web.Response(status=401, body=body, content_type="application/json")
        resp.force_close()
        return resp

    def _refuse(self, cur: Current, refusal: Refuse) -> web.StreamResponse:
        """Answer ``refusal.status`` in the protocol's JSON error shape and record it (with the
        request body read so far), ``served_by: refused``."""
        assert cur.route is not None
        payload = self._error_body(cur.route, refusal.status, refusal.kind, refusal.message)
        headers = [("Content-Type", "application/json"), *refusal.headers]
        resp = web.Response(status=refusal.status, body=payload)
        for k, v in headers:
            resp.headers[k] = v
        if refusal.close:
            resp.force_close()
        end = cur.end
        assert end is not None
        end.served_by = ServedBy.REFUSED
        end.flags = tuple(refusal.flags)
        end.response_headers = headers
        end.response_body = payload
        end.bytes_received = 0
        end.bytes_delivered = len(payload)
        # Outcome(...): a responder outside pvisor may still name its outcome by its string
        self._finish(cur, refusal.status, Outcome(refusal.outcome), f"{refusal.kind}: {refusal.message}")
        return resp

    def _finish(self, cur: Current, status: int | None, outcome: Outcome, error: str | None) -> None:
        """End the exchange of ``cur`` (once: nothing when it was recorded already): its status,
        outcome, error and end time go into ``cur.end``, which the recorder hands to the journal."""
        end = cur.end
        assert end is not None
        if cur.recorded:
            return
        end.status = status
        end.outcome = outcome
        end.error = error
        end.ended_us = us_since(end.pending)
        self.recorder.finish(cur)

    def _oversize(self, cur: Current, size: int) -> web.StreamResponse:
        assert cur.end is not None
        cur.end.request_bytes = size
        msg = (
            f"request body of {size} bytes or more exceeds the gateway limit of {self.config.max_body} bytes "
            "(--max-body)"
        )
        return self._refuse(
            cur,
            Refuse(
                413,
                "pvisor_request_too_large",
                msg,
                Outcome.OVERSIZE,
                headers=[("Connection", "close")],
                close=True,
            ),
        )


async def _aclose(source: object) -> None:
    """Stop an async chunk source that has an ``aclose`` (an upstream body: its connection
    is dropped); nothing for a list."""
    close = getattr(source, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # a source that fails to stop must not hide how the exchange ended
            pass


def _nobody_listens() -> web.StreamResponse:
    """The return value of a handler whose agent is gone (or whose connection was cut): aiohttp
    finds the transport closed and sends nothing."""
    resp = web.Response(status=499)
    resp.force_close()
    return resp


@dataclass(slots=True)
class _Moved:
    """What the relay moved of one answer: the upstream's headers, the chunks kept for the
    journal and their timings (flat (µs since start, length) pairs, packed by the journal
    writer), bytes received and delivered, the first byte's µs since start, and how the relay
    ended (``outcome``, ``error``)."""

    streamed: bool
    headers_us: int
    up_headers: list[tuple[str, str]]
    chunks: list[bytes] = field(default_factory=list)
    timings: list[int] = field(default_factory=list)
    received: int = 0
    delivered: int = 0
    first_us: int | None = None
    outcome: Outcome = Outcome.OK
    error: str | None = None

    def counted(self, received: int, delivered: int, first_us: int | None) -> None:
        self.received, self.delivered, self.first_us = received, delivered, first_us


def _stopped(received: int, delivered: int) -> str:
    """The error of an exchange the gateway's stop cancelled while it relayed."""
    return (
        f"gateway stopped while the exchange was in flight (received {received} bytes, delivered {delivered})"
    )


def _response_head(answer: Serve, streamed: bool) -> web.StreamResponse:
    """The response to the agent, status and headers of ``answer``, not yet sent."""
    resp = web.StreamResponse(status=answer.status, reason=answer.reason)
    for k, v in forwardable(answer.headers, _RESPONSE_DROP):
        resp.headers.add(k, v)
    if answer.body is not None and "Content-Length" not in resp.headers:
        resp.content_length = len(answer.body)
    if not streamed:
        # a whole body: its head goes out with its first bytes, in one write (a packet, and
        # a wake-up of the agent, less per exchange; aiohttp's own Response does the same).
        # A stream's head goes at once: the agent may wait for it before the first event.
        resp._send_headers_immediately = False
    return resp


def _refusal(request: web.BaseRequest, route: Route, origin: str | None) -> Refuse | None:
    """The gateway's own refusal of a request it read: a bad run id, a path that could climb
    out of the upstream's base path, a WebSocket upgrade; None for one it answers."""
    if route.kind == "bad_run":
        msg = (
            f"the run id in {RUN_HEADER} or in the /run/<id>/ path prefix must be 1 to 128 letters, "
            "digits, '.', '_' or '-', starting with a letter or digit"
        )
        return Refuse(400, "pvisor_bad_run_id", msg)
    if route.kind == "bad_path":
        msg = "the path must have no '.' or '..' segment: it could climb out of the upstream's base path"
        return Refuse(400, "pvisor_bad_path", msg)
    if request.headers.get("Upgrade", "").lower() == "websocket":
        # never tunnelled unrecorded: the agent must fall back to HTTP (docs/intercept.md)
        where = f" to {origin}" if origin else ""
        return Refuse(
            426,
            "pvisor_websocket_unsupported",
            f"the pvisor gateway does not record WebSocket: the upgrade{where} is refused; "
            "make the agent use HTTP",
        )
    return None


_LOGGER_IDS = itertools.count(1)


def _new_logger() -> logging.Logger:
    """A logger of a gateway's own, without handlers until a :class:`~.log_file.LogFile` (else it
    logs nothing)."""
    log = logging.getLogger(f"pvisor.gateway.log{next(_LOGGER_IDS)}")
    log.propagate = False
    log.setLevel(logging.INFO)
    return log
