"""The capture gateway: an aiohttp reverse proxy that records every exchange in the journal.

Hot path per request: resolve the route (string operations), read the request body, send it
upstream unchanged, and write each upstream chunk to the agent as soon as it arrives
(``iter_any``), keeping a reference to it for the journal. When the exchange ends, one
message goes to the journal writer thread, which redacts, decodes, compresses and reassembles
off the event loop. Nothing here waits for the disk or parses a body.

Failure handling and outcomes: docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import logging.handlers
import os
import queue
import socket
import ssl
import time
from time import perf_counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from pvisor.adapters.protocols import UPSTREAMS, get_protocol
from pvisor.journal.model import redact_url
from pvisor.journal.writer import Journal, PendingExchange, new_run_id

from .lifecycle import InFlight, close_idle_connections, route_aiohttp_logs, unroute_aiohttp_logs
from .routing import RUN_HEADER, Route, Router

MIB = 1024 * 1024
DEFAULT_MAX_BODY = 64 * MIB
DEFAULT_STALL_TIMEOUT_S = 600.0
SOCK_CONNECT_TIMEOUT_S = 30.0

# RFC 9110 §7.6.1 hop-by-hop fields, plus Host (aiohttp sets the upstream's) and Content-Length
# (recomputed from the body we send).
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "proxy-connection", "proxy-authenticate", "proxy-authorization", "expect"}
)
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length", RUN_HEADER.lower()}
_RESPONSE_DROP = _HOP_BY_HOP
_SKIP_AUTO = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_UPSTREAM_READ_ERRORS = (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, asyncio.TimeoutError, aiohttp.ClientConnectionError)
# the agent's connection broke (reading its body, or writing to it)
_CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionError, asyncio.IncompleteReadError)

#: events worth a line on the terminal (an internal error); the CLI shows them on stderr
log = logging.getLogger("pvisor.gateway")


def _forwardable(headers: list[tuple[str, str]], drop: frozenset[str]) -> list[tuple[str, str]]:
    named: set[str] = set()
    for k, v in headers:
        if k.lower() == "connection":
            named |= {t.strip().lower() for t in v.split(",") if t.strip()}
    return [(k, v) for k, v in headers if (kl := k.lower()) not in drop and kl not in named and not kl.startswith("proxy-")]


def finalize_response(protocol: str | None, streamed: bool, body: bytes) -> bytes | None:
    """Journal finalizer: reassemble a streamed response into its final object (compact JSON),
    using the protocol module. Runs in the journal writer thread. None for non-streamed bodies
    (they are their own final form) and for unknown protocols."""
    if protocol is None or not streamed or not body:
        return None
    result = get_protocol(protocol).reassemble([body])
    if result.final is None:
        return None
    return orjson.dumps(result.final)


@dataclass
class GatewayConfig:
    """Settings of one gateway.

    Fields: ``host``/``port`` to listen on (port 0: any free port); ``upstreams`` name -> base
    URL given by the user (``--upstream NAME=URL``; the others take their public defaults);
    ``run`` the gateway's run id (generated when None); ``max_body`` request body limit in
    bytes; ``stall_timeout`` seconds without upstream bytes before giving up; ``log_file``;
    ``shutdown_grace`` seconds :meth:`Gateway.stop` waits for exchanges in flight;
    ``attempt`` the attempt number recorded for the exchanges of the gateway's own run (``pvisor
    run --resume`` records a native resume as attempt 2, 3, ...; other runs get 1).
    """

    host: str = "127.0.0.1"
    port: int = 8787
    upstreams: dict[str, str] = field(default_factory=dict)
    run: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    stall_timeout: float = DEFAULT_STALL_TIMEOUT_S
    log_file: Path | None = None
    shutdown_grace: float = 10.0
    attempt: int = 1


@dataclass(slots=True)
class _Current:
    """What one request handler has so far, so that an exchange cut short (cancelled at
    shutdown, or an internal error) is still recorded with it."""

    pending: PendingExchange | None = None
    route: Route | None = None
    body: bytes | None = None
    body_size: int | None = None  # size on the wire when the body was refused unread (413)
    encoding: str | None = None
    started: bool = False  # the response head went out: no other answer is possible
    recorded: bool = False


class Gateway:
    """The capture gateway bound to a :class:`~pvisor.journal.writer.Journal`.

    ``await start()`` returns the URL it listens on; ``await stop()`` stops accepting, lets
    in-flight exchanges finish for ``shutdown_grace`` seconds (less after :meth:`hurry`),
    cancels the rest (each is recorded ``incomplete`` with the bytes it had moved) and closes.
    The journal is not closed here: its owner closes it.
    """

    def __init__(self, config: GatewayConfig, journal: Journal):
        self.config = config
        self.journal = journal
        self.run = config.run or new_run_id()
        all_upstreams = {name: default for name, (default, _) in UPSTREAMS.items()}
        all_upstreams.update(config.upstreams)
        self.router = Router(all_upstreams, set(config.upstreams), self.run)
        self.url: str | None = None
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self._session: aiohttp.ClientSession | None = None
        self._inflight = InFlight()
        self._log = _new_logger()
        self._log_listener: logging.handlers.QueueListener | None = None
        self._routed_logs = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Bind and serve. Returns ``http://HOST:PORT``. On any failure (the log file cannot be
        opened, the port is taken) everything started so far is closed before the error
        propagates. No run row is written here: the journal creates it with the run's first
        exchange, so a gateway that records nothing leaves no empty run."""
        try:
            if self.config.log_file is not None:
                self._log_listener = _open_log_file(self._log, self.config.log_file)
            route_aiohttp_logs(self._log)  # one line each in the log file, never a traceback on the terminal
            self._routed_logs = True
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=SOCK_CONNECT_TIMEOUT_S, sock_read=self.config.stall_timeout),
                auto_decompress=False,
                skip_auto_headers=_SKIP_AUTO,
                cookie_jar=aiohttp.DummyCookieJar(),  # never carry one agent's cookies to another
            )
            server = web.Server(self.handle, auto_decompress=False, access_log=None)
            # a body is read chunk by chunk against --max-body, not by aiohttp's client_max_size;
            # stop() has ended every handler before the runner's own shutdown, which then only
            # closes idle connections
            self._runner = web.ServerRunner(server, handle_signals=False, access_log=None, shutdown_timeout=1.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.config.host, self.config.port)
            await site.start()
            self._site = site
        except BaseException:
            await self._close()
            raise
        sock = self._runner.addresses[0]
        host = sock[0] if ":" not in sock[0] else f"[{sock[0]}]"
        self.url = f"http://{host}:{sock[1]}"
        self._log.info("listening %s run=%s", self.url, self.run)
        return self.url

    def hurry(self) -> None:
        """Make a running or coming :meth:`stop` cancel the exchanges in flight at once
        instead of waiting for them (a second SIGINT)."""
        self._inflight.hurry()

    async def stop(self) -> None:
        """Stop accepting; wait up to ``shutdown_grace`` s for in-flight exchanges (less after
        :meth:`hurry`); cancel the rest, each recorded ``incomplete`` with what it had moved;
        close the connections, the upstream session and the log file."""
        if self._site is not None:
            site, self._site = self._site, None
            await site.stop()
            close_idle_connections(self._runner)
        cancelled = await self._inflight.settle(self.config.shutdown_grace)
        if cancelled:
            self._log.info("cancelled %d exchange(s) in flight", cancelled)
        await self._close()

    async def _close(self) -> None:
        """Close what :meth:`start` opened (idempotent; also after a failed start)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        if self._routed_logs:
            unroute_aiohttp_logs(self._log)
            self._routed_logs = False
        if self._log_listener is not None:
            self._log.info("stopped")
            for h in list(self._log.handlers):
                self._log.removeHandler(h)
            self._log_listener.stop()  # writes what is queued, then closes the file
            for h in self._log_listener.handlers:
                h.close()
            self._log_listener = None

    async def watch_journal(self, interval: float = 0.5) -> str:
        """Return the journal writer's error as soon as it has one (checked every ``interval``
        s): from then on nothing is recorded, so the gateway must not go on answering."""
        while self.journal.error is None:
            await asyncio.sleep(interval)
        return self.journal.error

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait until no request is in flight (up to ``timeout`` s), then until the journal has
        committed everything queued. An exchange is queued after its last byte is written, so a
        client may hold a response before its exchange is recorded; after ``drain`` it is."""
        await self._inflight.wait_idle(timeout)
        await asyncio.get_running_loop().run_in_executor(None, self.journal.flush)

    # ------------------------------------------------------------------ request handling

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        cur = _Current()
        task = asyncio.current_task()
        self._inflight.add(task)
        try:
            return await self._handle(request, cur)
        except asyncio.CancelledError:
            # stop() cancelled it after the grace period: record what it had (the relay
            # loop records its own, with the bytes moved), then let the connection close
            if cur.pending is not None and not cur.recorded:
                self._finish(cur, None, "incomplete", "gateway stopped while the exchange was in flight", cur.body)
            raise
        except Exception as exc:
            return self._internal_error(request, cur, exc)
        finally:
            self._inflight.discard(task)

    async def _handle(self, request: web.BaseRequest, cur: _Current) -> web.StreamResponse:
        route = self.router.resolve(request.raw_path, request.headers.get(RUN_HEADER))
        if route.kind == "health":
            return web.json_response({"ok": True, "run": self.run, "inflight": len(self._inflight) - 1}, dumps=lambda o: orjson.dumps(o).decode())
        headers = list(request.headers.items())
        cur.route = route
        attempt = self.config.attempt if route.run == self.run else 1
        cur.pending = self.journal.begin_exchange(route.run, request.method, route.path, headers, query=route.query,
                                                  protocol=route.protocol, attempt=attempt)
        cur.encoding = request.headers.get("Content-Encoding")
        # the body first, also for the answers the gateway gives itself, so that it is recorded
        refused = await self._read_body(request, cur)
        if refused is not None:
            return refused
        if route.kind == "no_route":
            msg = f"no upstream for {request.method} {route.path}: give --upstream NAME=URL, or use a /anthropic/, /openai/ or /gemini/ prefix"
            return self._local_error(cur, 404, "pvisor_no_route", msg, "upstream_unreachable")
        if route.kind == "bad_run":
            msg = (f"the run id in {RUN_HEADER} or in the /run/<id>/ path prefix must be 1 to 128 letters, digits, '.', '_' or '-', "
                   "starting with a letter or digit")
            return self._local_error(cur, 400, "pvisor_bad_run_id", msg, "upstream_unreachable")
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return self._local_error(cur, 426, "pvisor_websocket_unsupported", "the pvisor gateway does not proxy WebSocket; use HTTP", "upstream_unreachable")
        body = cur.body or b""
        fwd_headers = _forwardable(headers, _REQUEST_DROP)
        url = URL(self.router.upstreams[route.upstream] + route.target, encoded=True)
        send_body = body if (body or request.method not in ("GET", "HEAD", "OPTIONS")) else None
        assert self._session is not None
        try:
            upstream = await self._session.request(request.method, url, headers=fwd_headers, data=send_body, allow_redirects=False)
        except aiohttp.ClientConnectorError as exc:
            return self._upstream_failed(cur, "upstream_unreachable", f"cannot connect to upstream {route.upstream}: {_reason(exc)}")
        except aiohttp.ConnectionTimeoutError:  # before TimeoutError: a connect timeout is no stall
            return self._upstream_failed(cur, "upstream_unreachable", f"cannot connect to upstream {route.upstream}: no connection within {SOCK_CONNECT_TIMEOUT_S:g} s")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
            return self._upstream_failed(cur, "upstream_reset", f"upstream {route.upstream} closed the connection before answering: {_reason(exc)}")
        except asyncio.TimeoutError:
            return self._upstream_failed(cur, "upstream_reset", f"upstream {route.upstream} sent no response within {self.config.stall_timeout:g} s")
        headers_us = _us_since(cur.pending)
        try:
            return await self._relay(request, cur, upstream, headers_us)
        except BaseException:
            upstream.close()  # cut short (cancelled, or a bug): this connection cannot be reused
            raise
        finally:
            upstream.release()

    async def _read_body(self, request: web.BaseRequest, cur: _Current) -> web.StreamResponse | None:
        """Read the request body into ``cur.body``, bounded by --max-body. Returns the response
        when the exchange ends here (413, or the agent went away)."""
        max_body = self.config.max_body
        if request.content_length is not None and request.content_length > max_body:
            return self._oversize(cur, request.content_length)
        parts: list[bytes] = []
        size = 0
        try:
            if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= aiohttp.HttpVersion11:
                # the client waits for this before it sends the body (Expect is not forwarded)
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            async for data in request.content.iter_any():
                size += len(data)
                parts.append(data)
                if size > max_body:
                    cur.body = b"".join(parts)
                    return self._oversize(cur, size)
        except _CLIENT_GONE as exc:
            cur.body = b"".join(parts)
            self._finish(cur, None, "aborted_by_client", f"client went away while sending the request: {type(exc).__name__}", cur.body)
            return _nobody_listens()
        cur.body = b"".join(parts)
        return None

    async def _relay(self, request: web.BaseRequest, cur: _Current, upstream: aiohttp.ClientResponse, headers_us: int) -> web.StreamResponse:
        route = cur.route
        assert route is not None and cur.pending is not None
        up_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in _forwardable(up_headers, _RESPONSE_DROP):
            resp.headers.add(k, v)
        streamed = upstream.headers.get("Content-Type", "").startswith("text/event-stream") or self.router.path_streams(route)
        chunks: list[bytes] = []
        timings: list[int] = []  # flat (µs since start, length) pairs: packed by the journal writer
        received = delivered = 0
        outcome = "upstream_error" if upstream.status >= 400 else "ok"
        error: str | None = None

        def finish(outcome: str, error: str | None) -> None:
            self._finish(cur, upstream.status, outcome, error, cur.body, up_headers, b"".join(chunks), streamed, timings, headers_us,
                         timings[0] if timings else None, received, delivered)

        try:
            await resp.prepare(request)
        except _CLIENT_GONE:
            upstream.close()
            finish("aborted_by_client", "client went away before the response started")
            return resp
        cur.started = True
        if request.method != "HEAD":
            t0 = cur.pending.t0
            it = upstream.content.iter_any().__aiter__()
            while True:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    finish("incomplete", f"gateway stopped while the exchange was in flight (received {received} bytes, delivered {delivered})")
                    raise
                except _UPSTREAM_READ_ERRORS as exc:
                    outcome = "upstream_reset"
                    if isinstance(exc, asyncio.TimeoutError):
                        error = f"upstream {route.upstream} sent nothing for {self.config.stall_timeout:g} s (received {received} bytes)"
                    else:
                        error = f"upstream {route.upstream} connection broke after {received} bytes: {_reason(exc)}"
                    break
                n = len(chunk)
                received += n
                chunks.append(chunk)
                timings += (int((perf_counter() - t0) * 1e6), n)
                try:
                    await resp.write(chunk)
                except asyncio.CancelledError:
                    finish("incomplete", f"gateway stopped while the exchange was in flight (received {received} bytes, delivered {delivered})")
                    raise
                except _CLIENT_GONE:
                    upstream.close()  # stop the upstream generating for nobody
                    outcome, error = "aborted_by_client", f"client went away after {delivered} of {received} bytes"
                    break
                delivered += n
        if outcome == "upstream_reset":
            # pass on exactly what arrived, then cut the connection: the agent must see a broken stream
            finish(outcome, error)
            if request.transport is not None:
                request.transport.abort()
            return resp
        if outcome != "aborted_by_client":
            try:
                await resp.write_eof()
            except _CLIENT_GONE:
                outcome, error = "aborted_by_client", "client went away before the end of the response"
        finish(outcome, error)
        return resp

    def _internal_error(self, request: web.BaseRequest, cur: _Current, exc: Exception) -> web.StreamResponse:
        """A bug or an unforeseen condition: record the exchange (``incomplete``, error
        ``pvisor internal error: <type>``), log one line (the type only: an exception's text
        may hold a URL with a key), and answer 500 in the protocol's JSON error shape unless
        the response has started (then the connection is cut)."""
        kind = type(exc).__name__
        message = f"pvisor internal error: {kind}"
        where = f"{request.method} {redact_url(cur.route.path + ('?' + cur.route.query if cur.route.query else ''))}" if cur.route else request.method
        exchange = cur.pending.id if cur.pending is not None else "-"
        log.error("%s (exchange %s, %s)", message, exchange, where)
        status = None if cur.started else 500
        if cur.pending is not None and not cur.recorded:
            self._finish(cur, status, "incomplete", message, cur.body)
        if cur.started:
            if request.transport is not None:
                request.transport.abort()
            return _nobody_listens()
        route = cur.route or Route("no_route", self.run, None, "", "", "", None)
        resp = web.Response(status=500, body=self._error_body(route, 500, "pvisor_internal_error", message), headers={"Content-Type": "application/json"})
        resp.force_close()
        return resp

    # ------------------------------------------------------------------ local answers and recording

    def _finish(self, cur: _Current, status: int | None, outcome: str, error: str | None,
                request_body: bytes | None = None, response_headers: list[tuple[str, str]] | None = None,
                response_body: bytes | None = None, streamed: bool = False, timings: list[int] | None = None,
                headers_us: int | None = None, first_byte_us: int | None = None, received: int | None = None, delivered: int | None = None) -> None:
        pending, route = cur.pending, cur.route
        assert pending is not None and route is not None
        if cur.recorded:
            return
        cur.recorded = True
        self.journal.finish_exchange(
            pending,
            status=status,
            response_headers=response_headers or (),
            request_body=request_body,
            response_body=response_body,
            streamed=streamed,
            chunk_timings=timings or (),
            outcome=outcome,
            error=error,
            headers_us=headers_us,
            first_byte_us=first_byte_us,
            bytes_received=received,
            bytes_delivered=delivered,
            request_encoding=cur.encoding,
            request_bytes=cur.body_size,
        )
        if self._log.handlers:
            target = route.path + ("?" + route.query if route.query else "")
            self._log.info(
                "%s %s %s %s %s %s %s req=%dB resp=%sB %.1fms%s",
                route.run, pending.id, pending.method, redact_url(target), status if status is not None else "-", outcome,
                "stream" if streamed else "-", cur.body_size if cur.body_size is not None else len(request_body or b""), received if received is not None else len(response_body or b""),
                _us_since(pending) / 1000, f" error={error}" if error else "",
            )

    def _error_body(self, route: Route, status: int, kind: str, message: str) -> bytes:
        if route.protocol is not None:
            return get_protocol(route.protocol).error_body(status, message, kind)
        return orjson.dumps({"error": {"type": kind, "message": message}})

    def _local_error(self, cur: _Current, status: int, kind: str, message: str, outcome: str,
                     extra_headers: dict[str, str] | None = None, close: bool = False) -> web.StreamResponse:
        """Answer ``status`` in the protocol's JSON error shape and record it (with the request
        body read so far)."""
        assert cur.route is not None
        payload = self._error_body(cur.route, status, kind, message)
        headers = {"Content-Type": "application/json", **(extra_headers or {})}
        resp = web.Response(status=status, body=payload, headers=headers)
        if close:
            resp.force_close()
        self._finish(cur, status, outcome, f"{kind}: {message}", cur.body, list(headers.items()), payload, received=0, delivered=len(payload))
        return resp

    def _oversize(self, cur: _Current, size: int) -> web.StreamResponse:
        cur.body_size = size
        msg = f"request body of {size} bytes or more exceeds the gateway limit of {self.config.max_body} bytes (--max-body)"
        return self._local_error(cur, 413, "pvisor_request_too_large", msg, "oversize", extra_headers={"Connection": "close"}, close=True)

    def _upstream_failed(self, cur: _Current, outcome: str, message: str) -> web.StreamResponse:
        return self._local_error(cur, 502, outcome, message, outcome, extra_headers={"x-pvisor-error": outcome})


def _nobody_listens() -> web.StreamResponse:
    """The return value of a handler whose agent is gone (or whose connection was cut): aiohttp
    finds the transport closed and sends nothing."""
    resp = web.Response(status=499)
    resp.force_close()
    return resp


def _us_since(pending: PendingExchange) -> int:
    return int((time.perf_counter() - pending.t0) * 1e6)


def os_error_reason(err: OSError) -> str:
    """``Connection refused`` for an OSError. Its own text is not used: asyncio's says
    ``Connect call failed ('10.0.0.1', 443)`` and aiohappyeyeballs joins several such. A TLS
    failure is named as one (its errno would read "Operation not permitted")."""
    if isinstance(err, ssl.SSLError):
        reason = err.reason or type(err).__name__
        if isinstance(err, ssl.SSLCertVerificationError):
            return f"TLS certificate verification failed ({err.verify_message or reason})"
        hint = " (does the upstream speak plain HTTP? then give an http:// URL)" if reason in _PLAIN_HTTP_REASONS else ""
        return f"TLS handshake failed: {reason}{hint}"
    if isinstance(err, socket.gaierror):
        return err.strerror or type(err).__name__  # "Name or service not known": no host in it
    if err.errno:
        return os.strerror(err.errno)
    return type(err).__name__


#: what OpenSSL says when the server answered a TLS ClientHello in plain HTTP
_PLAIN_HTTP_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"})


def _reason(exc: BaseException) -> str:
    """A short reason for an aiohttp error, without the URL (which may carry a ``key=``) or the
    address."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return os_error_reason(exc.os_error)
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno:
        return os_error_reason(exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{type(exc).__name__} {exc.status}"
    return type(exc).__name__


_LOGGER_IDS = itertools.count(1)


def _new_logger() -> logging.Logger:
    """A logger of a gateway's own, without handlers until :func:`_open_log_file` (then it
    logs nothing)."""
    log = logging.getLogger(f"pvisor.gateway.log{next(_LOGGER_IDS)}")
    log.propagate = False
    log.setLevel(logging.INFO)
    return log


def _open_log_file(log: logging.Logger, path: Path) -> logging.handlers.QueueListener:
    """Make ``log`` append to ``path`` through a queue and a file-writing thread (the loop never
    waits for the disk). Raises OSError when the file cannot be opened for appending."""
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    q: queue.SimpleQueue = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(q, file_handler)
    listener.start()
    log.addHandler(logging.handlers.QueueHandler(q))
    return listener
