"""An HTTP server around :class:`~pvisor.gateway.scripted_model.ScriptedModel` (``pvisor serve-model``)."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from pvisor.adapters.protocols import protocol_for_path
from pvisor.journal.errors import BadInputError

from .scripted_model import ScriptedModel


class ScriptedModelServer:
    """Serve a scripted model on ``host:port`` (port 0: any free port). ``await start()``
    returns the base URL; ``await stop()`` closes. Streams are written one chunk per
    ``chunk_events`` events, each flushed as written."""

    def __init__(self, model: ScriptedModel, host: str = "127.0.0.1", port: int = 0):
        self.model = model
        self.host = host
        self.port = port
        self.url: str | None = None
        self.requests = 0
        self._runner: web.ServerRunner | None = None

    async def start(self) -> str:
        server = web.Server(self.handle, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.requests += 1
        body = await request.read()
        path, _, query = request.raw_path.partition("?")
        try:
            reply = self.model.answer(request.method, path, query, body)
        except BadInputError as exc:
            # the protocol's own error shape, so that SDKs show the message (all carry error.message)
            mod = protocol_for_path(path)
            if mod is not None:
                payload = mod.error_body(400, exc.message)
            else:  # pragma: no cover - answer() raises only for protocol paths
                payload = orjson.dumps({"error": {"type": "invalid_request_error", "message": exc.message}})
            return web.Response(status=400, body=payload, content_type="application/json")
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        if len(reply.chunks) == 1:
            resp.content_length = len(reply.chunks[0])
        await resp.prepare(request)
        for chunk in reply.chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp
