"""Real servers on 127.0.0.1 for tests: an event loop in a background thread that runs the
gateway, the scripted model server and programmable upstreams, while tests use ordinary
blocking clients (the official SDKs) in the test thread.

Use through the ``loop_thread`` / ``stack`` fixtures of conftest.py::

    def test_x(stack):
        up = stack.scripted({"turns": [{"text": "hi"}]})        # base URL of a scripted model
        gw = stack.gateway(upstreams={"anthropic": up})         # a Gateway with its own journal
        ... requests to gw.url ...
        exchanges = stack.exchanges(gw)                         # flushes, then reads the journal
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web

from pvisor.gateway.proxy import Gateway, GatewayConfig, finalize_response
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_server import ScriptedModelServer
from pvisor.journal.model import Exchange
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal


class LoopThread:
    """An asyncio loop running in a daemon thread. ``run(coro)`` waits for the result
    (raising its exception) with a deadline."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class RunningGateway:
    """A started gateway: ``url``, ``run`` (its run id), ``journal`` and ``journal_path``."""

    gateway: Gateway
    journal: Journal
    journal_path: Path
    url: str
    run: str
    log_file: Path | None = None


class RawUpstream:
    """An aiohttp server whose handler the test writes (``async def handler(request)``).
    ``requests`` collects (method, raw_path, headers, body bytes) of everything it received."""

    def __init__(self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]):
        self.handler = handler
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.runner: web.ServerRunner | None = None
        self.url = ""

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.method, request.raw_path, dict(request.headers), body))
        return await self.handler(request)

    async def start(self) -> str:
        self.runner = web.ServerRunner(
            web.Server(self._handle, auto_decompress=False), handle_signals=False, access_log=None
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % self.runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Stack:
    """Starts servers on the loop thread and stops them all at teardown."""

    lt: LoopThread
    tmp: Path
    _stops: list[Callable[[], Awaitable]] = field(default_factory=list)
    _journals: list[Journal] = field(default_factory=list)

    def scripted(self, script: dict) -> str:
        """Start a scripted model server; return its base URL."""
        server = ScriptedModelServer(ScriptedModel(parse_script(script, "test script")))
        url = self.lt.run(server.start())
        self._stops.append(server.stop)
        return url

    def raw_upstream(self, handler) -> RawUpstream:
        up = RawUpstream(handler)
        self.lt.run(up.start())
        self._stops.append(up.stop)
        return up

    def gateway(
        self, upstreams: dict[str, str], *, name: str = "gw", responder: Any = None, **config: Any
    ) -> RunningGateway:
        """Start a gateway with its own journal file under tmp/<name>/ (answering through
        ``responder`` when given, else forwarding everything upstream)."""
        path = self.tmp / name / "journal.sqlite"
        journal = Journal.open(path, finalize=finalize_response)
        self._journals.append(journal)
        cfg = GatewayConfig(port=0, upstreams=upstreams, **config)
        gw = Gateway(cfg, journal, responder)
        url = self.lt.run(gw.start())
        self._stops.append(gw.stop)
        return RunningGateway(gw, journal, path, url, gw.run, cfg.log_file)

    def exchanges(self, gw: RunningGateway, run: str | None = None) -> list[Exchange]:
        """:meth:`drain` the gateway, then read the exchanges of its run (or ``run``)."""
        self.drain(gw)
        with JournalReader(gw.journal_path) as r:
            return r.exchanges(run or gw.run)

    def drain(self, gw: RunningGateway, timeout: float = 10.0) -> None:
        """Wait until the gateway has no request in flight and its journal has committed
        (:meth:`Gateway.drain`): a client can hold a whole response before the exchange is
        queued, so reading the journal right after a request could miss it."""
        self.lt.run(gw.gateway.drain(timeout), timeout + 5)

    def reader(self, gw: RunningGateway) -> JournalReader:
        self.drain(gw)
        return JournalReader(gw.journal_path)

    def close(self) -> None:
        for stop in reversed(self._stops):
            try:
                self.lt.run(stop(), timeout=15)
            except Exception:
                pass
        for j in self._journals:
            j.close()
