"""An HTTP server around :class:`~pvisor.gateway.scripted_model.ScriptedModel` (``pvisor serve-model``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from pvisor.core.errors import BadInputError

from .access import listen_url
from .lifecycle import InFlight, close_idle_connections, route_aiohttp_logs, unroute_aiohttp_logs
from pvisor.adapters.protocols.replies import error_payload

from .scripted_model import ScriptedModel

# aiohttp's records go nowhere: a malformed request must not print a traceback
_QUIET = logging.getLogger("pvisor.gateway.scripted_server.aiohttp")
_QUIET.propagate = False


class ScriptedModelServer:
    """Serve a scripted model on ``host:port`` (port 0: any free port). ``await start()``
    returns the base URL; ``await stop()`` stops accepting, waits up to ``shutdown_grace``
    seconds for requests in flight (less after :meth:`hurry`), cancels the rest and closes.
    Streams are written one chunk per ``chunk_events`` events, each flushed as written. With an
    ``ssl_context`` (a server context) it speaks HTTPS, as a model API host does (the tests of
    intercept mode stand it in for one)."""

    def __init__(
        self,
        model: ScriptedModel,
        host: str = "127.0.0.1",
        port: int = 0,
        shutdown_grace: float = 10.0,
        ssl_context: Any = None,
    ):
        self.model = model
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.shutdown_grace = shutdown_grace
        self.url: str | None = None
        self.requests = 0
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self._inflight = InFlight()
        self._routed_logs = False

    async def start(self) -> str:
        """Bind and serve; on failure (port taken) close what was opened, then raise."""
        try:
            route_aiohttp_logs(_QUIET)
            self._routed_logs = True
            server = web.Server(self.handle, access_log=None)
            self._runner = web.ServerRunner(
                server, handle_signals=False, access_log=None, shutdown_timeout=1.0
            )
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
            await site.start()
            self._site = site
        except BaseException:
            await self._close()
            raise
        host, port = self._runner.addresses[0][:2]
        self.url = listen_url(host, port, "https" if self.ssl_context is not None else "http")
        return self.url

    @property
    def in_flight(self) -> int:
        """Requests being answered now."""
        return len(self._inflight)

    def hurry(self) -> None:
        """Make :meth:`stop` cancel the requests in flight at once (a second SIGINT)."""
        self._inflight.hurry()

    async def stop(self) -> None:
        if self._site is not None:
            site, self._site = self._site, None
            await site.stop()
            close_idle_connections(self._runner)
        await self._inflight.settle(self.shutdown_grace)
        await self._close()

    async def _close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._routed_logs:
            unroute_aiohttp_logs(_QUIET)
            self._routed_logs = False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        with self._inflight.track():
            return await self._handle(request)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.requests += 1
        path, _, query = request.raw_path.partition("?")
        try:
            # not request.read(): its client_max_size (1 MiB) is less than a long agent session
            body = await request.content.read()
        except (ConnectionResetError, aiohttp.ClientConnectionError, asyncio.IncompleteReadError):
            return _closed()  # the client went away: nobody to answer
        except (web.RequestPayloadError, HttpProcessingError):
            encoding = request.headers.get("Content-Encoding")
            what = f"Content-Encoding {encoding!r}" if encoding else "its transfer framing"
            return _error(path, 400, f"the request body could not be decoded ({what})", close=True)
        try:
            reply = self.model.answer(request.method, path, query, body)
        except BadInputError as exc:
            # the protocol's own error shape, so that SDKs show the message (all carry error.message)
            return _error(path, 400, exc.message)
        except Exception as exc:  # a bug: a JSON 500 naming it, never a traceback on the terminal
            return _error(path, 500, f"scripted model internal error: {type(exc).__name__}: {exc}")
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        if len(reply.chunks) == 1:
            resp.content_length = len(reply.chunks[0])
        try:
            await resp.prepare(request)
            if request.method != "HEAD":  # the headers (Content-Length included) and no body
                for chunk in reply.chunks:
                    await resp.write(chunk)
            await resp.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionError):
            pass  # the client went away mid-reply
        return resp


def _error(path: str, status: int, message: str, close: bool = False) -> web.Response:
    """``status`` with the JSON error shape of the protocol serving ``path`` (a generic
    ``{"error": {...}}`` elsewhere)."""
    resp = web.Response(
        status=status, body=error_payload(path, status, message), content_type="application/json"
    )
    if close:
        resp.force_close()
    return resp


def _closed() -> web.Response:
    resp = web.Response(status=499)
    resp.force_close()
    return resp
