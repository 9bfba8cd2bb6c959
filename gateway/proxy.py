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
import logging
import logging.handlers
import os
import queue
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from pvisor.adapters.protocols import UPSTREAMS, get_protocol
from pvisor.journal.model import Run, redact_url
from pvisor.journal.writer import Journal, PendingExchange, new_run_id

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
    bytes; ``stall_timeout`` seconds without upstream bytes before giving up; ``log_file``.
    """

    host: str = "127.0.0.1"
    port: int = 8787
    upstreams: dict[str, str] = field(default_factory=dict)
    run: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    stall_timeout: float = DEFAULT_STALL_TIMEOUT_S
    log_file: Path | None = None
    shutdown_grace: float = 10.0


class Gateway:
    """The capture gateway bound to a :class:`~pvisor.journal.writer.Journal`.

    ``await start()`` returns the URL it listens on; ``await stop()`` stops accepting, lets
    in-flight exchanges finish for ``shutdown_grace`` seconds, and closes. The journal is not
    closed here: its owner closes it (which marks anything left in flight ``incomplete``).
    """

    def __init__(self, config: GatewayConfig, journal: Journal):
        self.config = config
        self.journal = journal
        self.run = config.run or new_run_id()
        all_upstreams = {name: default for name, (default, _) in UPSTREAMS.items()}
        all_upstreams.update(config.upstreams)
        self.router = Router(all_upstreams, set(config.upstreams), self.run)
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._session: aiohttp.ClientSession | None = None
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._log, self._log_listener = _make_logger(config.log_file)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Bind and serve. Returns ``http://HOST:PORT``."""
        self.journal.create_run(Run(id=self.run, mode="capture"))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=SOCK_CONNECT_TIMEOUT_S, sock_read=self.config.stall_timeout),
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO,
            cookie_jar=aiohttp.DummyCookieJar(),  # never carry one agent's cookies to another
        )
        server = web.Server(self.handle, auto_decompress=False, access_log=None)
        # a body is read chunk by chunk against --max-body, not by aiohttp's client_max_size
        self._runner = web.ServerRunner(server, handle_signals=False, access_log=None, shutdown_timeout=self.config.shutdown_grace)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await self._site.start()
        sock = self._runner.addresses[0]
        host = sock[0] if ":" not in sock[0] else f"[{sock[0]}]"
        self.url = f"http://{host}:{sock[1]}"
        self._log.info("listening %s run=%s", self.url, self.run)
        return self.url

    async def stop(self) -> None:
        """Stop accepting, wait up to ``shutdown_grace`` s for in-flight exchanges, close."""
        if self._site is not None:
            await self._site.stop()
        try:
            await asyncio.wait_for(self._idle.wait(), self.config.shutdown_grace)
        except asyncio.TimeoutError:
            pass
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self._log.info("stopped")
        if self._log_listener is not None:
            self._log_listener.stop()
            self._log_listener = None

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait until no request is in flight (up to ``timeout`` s), then until the journal has
        committed everything queued. An exchange is queued after its last byte is written, so a
        client may hold a response before its exchange is recorded; after ``drain`` it is."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        await asyncio.get_running_loop().run_in_executor(None, self.journal.flush)

    # ------------------------------------------------------------------ request handling

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self._inflight += 1
        self._idle.clear()
        try:
            return await self._handle(request)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        route = self.router.resolve(request.raw_path, request.headers.get(RUN_HEADER))
        if route.kind == "health":
            return web.json_response({"ok": True, "run": self.run, "inflight": self._inflight - 1}, dumps=lambda o: orjson.dumps(o).decode())
        headers = list(request.headers.items())
        pending = self.journal.begin_exchange(route.run, request.method, route.path, headers, query=route.query, protocol=route.protocol)
        if route.kind == "no_route":
            msg = f"no upstream for {request.method} {route.path}: give --upstream NAME=URL, or use a /anthropic/, /openai/ or /gemini/ prefix"
            return await self._local_error(request, pending, route, 404, "pvisor_no_route", msg, "upstream_unreachable")
        if route.kind == "bad_run":
            msg = f"{RUN_HEADER} must be a run id: letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit"
            return await self._local_error(request, pending, route, 400, "pvisor_bad_run_id", msg, "upstream_unreachable")
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._local_error(
                request, pending, route, 426, "pvisor_websocket_unsupported", "the pvisor gateway does not proxy WebSocket; use HTTP", "upstream_unreachable"
            )
        # request body, bounded by --max-body
        max_body = self.config.max_body
        if request.content_length is not None and request.content_length > max_body:
            return await self._oversize(request, pending, route, request.content_length)
        parts: list[bytes] = []
        size = 0
        try:
            if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= aiohttp.HttpVersion11:
                # the client waits for this before it sends the body (Expect is not forwarded)
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            async for data in request.content.iter_any():
                size += len(data)
                if size > max_body:
                    return await self._oversize(request, pending, route, size)
                parts.append(data)
        except (ConnectionResetError, aiohttp.ClientConnectionError, asyncio.IncompleteReadError) as exc:
            self._finish(pending, route, status=None, outcome="aborted_by_client", error=f"client went away while sending the request: {type(exc).__name__}", request_body=b"".join(parts))
            raise
        body = b"".join(parts)
        encoding = request.headers.get("Content-Encoding")
        fwd_headers = _forwardable(headers, _REQUEST_DROP)
        url = URL(self.router.upstreams[route.upstream] + route.target, encoded=True)
        send_body = body if (body or request.method not in ("GET", "HEAD", "OPTIONS")) else None
        assert self._session is not None
        try:
            upstream = await self._session.request(request.method, url, headers=fwd_headers, data=send_body, allow_redirects=False)
        except aiohttp.ClientConnectorError as exc:
            return await self._upstream_failed(request, pending, route, body, encoding, "upstream_unreachable", f"cannot connect to upstream {route.upstream}: {_reason(exc)}")
        except aiohttp.ConnectionTimeoutError:  # before TimeoutError: a connect timeout is no stall
            return await self._upstream_failed(request, pending, route, body, encoding, "upstream_unreachable",
                                               f"cannot connect to upstream {route.upstream}: no connection within {SOCK_CONNECT_TIMEOUT_S:g} s")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
            return await self._upstream_failed(request, pending, route, body, encoding, "upstream_reset", f"upstream {route.upstream} closed the connection before answering: {_reason(exc)}")
        except asyncio.TimeoutError:
            return await self._upstream_failed(request, pending, route, body, encoding, "upstream_reset", f"upstream {route.upstream} sent no response within {self.config.stall_timeout:g} s")
        headers_us = _us_since(pending)
        try:
            return await self._relay(request, pending, route, upstream, body, encoding, headers_us)
        finally:
            upstream.release()

    async def _relay(self, request: web.BaseRequest, pending: PendingExchange, route: Route, upstream: aiohttp.ClientResponse,
                     body: bytes, encoding: str | None, headers_us: int) -> web.StreamResponse:
        up_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in _forwardable(up_headers, _RESPONSE_DROP):
            resp.headers.add(k, v)
        ctype = upstream.headers.get("Content-Type", "")
        streamed = ctype.startswith("text/event-stream") or (
            route.protocol is not None and get_protocol(route.protocol).wants_stream(route.path, route.query, {})
        )
        chunks: list[bytes] = []
        timings: list[tuple[int, int]] = []
        received = delivered = 0
        first_byte_us: int | None = None
        outcome = "upstream_error" if upstream.status >= 400 else "ok"
        error: str | None = None
        try:
            await resp.prepare(request)
        except (ConnectionResetError, aiohttp.ClientConnectionError):
            upstream.close()
            self._finish(pending, route, upstream.status, "aborted_by_client", "client went away before the response started", body, encoding,
                         up_headers, b"", streamed, timings, headers_us, None, 0, 0)
            return resp
        if request.method != "HEAD":
            t0 = pending.t0
            it = upstream.content.iter_any().__aiter__()
            while True:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    break
                except _UPSTREAM_READ_ERRORS as exc:
                    outcome = "upstream_reset"
                    if isinstance(exc, asyncio.TimeoutError):
                        error = f"upstream {route.upstream} sent nothing for {self.config.stall_timeout:g} s (received {received} bytes)"
                    else:
                        error = f"upstream {route.upstream} connection broke after {received} bytes: {_reason(exc)}"
                    break
                n = len(chunk)
                if first_byte_us is None:
                    first_byte_us = int((time.perf_counter() - t0) * 1e6)
                received += n
                chunks.append(chunk)
                timings.append((int((time.perf_counter() - t0) * 1e6), n))
                try:
                    await resp.write(chunk)
                except (ConnectionResetError, aiohttp.ClientConnectionError):
                    upstream.close()  # stop the upstream generating for nobody
                    outcome, error = "aborted_by_client", f"client went away after {delivered} of {received} bytes"
                    break
                delivered += n
        raw = b"".join(chunks)
        if outcome == "upstream_reset":
            # pass on exactly what arrived, then cut the connection: the agent must see a broken stream
            self._finish(pending, route, upstream.status, outcome, error, body, encoding, up_headers, raw, streamed, timings, headers_us, first_byte_us, received, delivered)
            if request.transport is not None:
                request.transport.abort()
            return resp
        if outcome != "aborted_by_client":
            try:
                await resp.write_eof()
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                outcome, error = "aborted_by_client", "client went away before the end of the response"
        self._finish(pending, route, upstream.status, outcome, error, body, encoding, up_headers, raw, streamed, timings, headers_us, first_byte_us, received, delivered)
        return resp

    # ------------------------------------------------------------------ local answers and recording

    def _finish(self, pending: PendingExchange, route: Route, status: int | None, outcome: str, error: str | None,
                request_body: bytes | None = None, encoding: str | None = None, response_headers: list[tuple[str, str]] | None = None,
                response_body: bytes | None = None, streamed: bool = False, timings: list[tuple[int, int]] | None = None,
                headers_us: int | None = None, first_byte_us: int | None = None, received: int | None = None, delivered: int | None = None) -> None:
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
            request_encoding=encoding,
        )
        if self._log.handlers:
            target = route.path + ("?" + route.query if route.query else "")
            self._log.info(
                "%s %s %s %s %s %s %s req=%dB resp=%sB %.1fms%s",
                route.run, pending.id, pending.method, redact_url(target), status if status is not None else "-", outcome,
                "stream" if streamed else "-", len(request_body or b""), received if received is not None else len(response_body or b""),
                _us_since(pending) / 1000, f" error={error}" if error else "",
            )

    def _error_body(self, route: Route, status: int, kind: str, message: str) -> bytes:
        if route.protocol is not None:
            return get_protocol(route.protocol).error_body(status, message, kind)
        return orjson.dumps({"error": {"type": kind, "message": message}})

    async def _local_error(self, request: web.BaseRequest, pending: PendingExchange, route: Route, status: int, kind: str,
                           message: str, outcome: str, request_body: bytes | None = None, encoding: str | None = None,
                           extra_headers: dict[str, str] | None = None) -> web.StreamResponse:
        payload = self._error_body(route, status, kind, message)
        headers = {"Content-Type": "application/json", **(extra_headers or {})}
        resp = web.Response(status=status, body=payload, headers=headers)
        self._finish(pending, route, status, outcome, f"{kind}: {message}", request_body, encoding, list(headers.items()), payload, received=0, delivered=len(payload))
        return resp

    async def _oversize(self, request: web.BaseRequest, pending: PendingExchange, route: Route, size: int) -> web.StreamResponse:
        msg = f"request body of {size} bytes or more exceeds the gateway limit of {self.config.max_body} bytes (--max-body)"
        resp = await self._local_error(request, pending, route, 413, "pvisor_request_too_large", msg, "oversize", extra_headers={"Connection": "close"})
        resp.force_close()
        return resp

    async def _upstream_failed(self, request: web.BaseRequest, pending: PendingExchange, route: Route, body: bytes,
                               encoding: str | None, outcome: str, message: str) -> web.StreamResponse:
        return await self._local_error(request, pending, route, 502, outcome, message, outcome,
                                       body, encoding, extra_headers={"x-pvisor-error": outcome})


def _us_since(pending: PendingExchange) -> int:
    return int((time.perf_counter() - pending.t0) * 1e6)


def os_error_reason(err: OSError) -> str:
    """``Connection refused`` for an OSError. Its own text is not used: asyncio's says
    ``Connect call failed ('10.0.0.1', 443)`` and aiohappyeyeballs joins several such."""
    if isinstance(err, socket.gaierror):
        return err.strerror or type(err).__name__  # "Name or service not known": no host in it
    if err.errno:
        return os.strerror(err.errno)
    return type(err).__name__


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


def _make_logger(path: Path | None) -> tuple[logging.Logger, Any]:
    """A logger whose records go through a queue to a file-writing thread (the loop never
    waits for the disk). Without ``path`` it has no handler and logs nothing."""
    log = logging.getLogger(f"pvisor.gateway.{id(path)}")
    log.propagate = False
    log.setLevel(logging.INFO)
    for h in list(log.handlers):
        log.removeHandler(h)
    if path is None:
        return log, None
    q: queue.SimpleQueue = queue.SimpleQueue()
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    listener = logging.handlers.QueueListener(q, file_handler)
    listener.start()
    log.addHandler(logging.handlers.QueueHandler(q))
    return log, listener
