"""Helpers for the gateway tests: barriers between the test thread and the server loop, plain
blocking HTTP clients (``http.client`` and raw sockets), journal polling with a deadline, and
upstreams that misbehave on purpose.

Every wait here has a deadline (``DEADLINE`` seconds) and fails the test when it passes; none
of them sleeps to let something happen.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from aiohttp import web

from pvisor.journal.model import Exchange
from pvisor.journal.reader import JournalReader

DEADLINE = 10.0


class Gate:
    """A one-shot barrier usable from both sides: ``set()`` from any thread, ``await wait()`` in
    the server loop, ``wait_sync()`` in the test thread. Both waits fail after ``DEADLINE``."""

    def __init__(self, lt) -> None:
        self.lt = lt
        self._tev = threading.Event()
        self._aev: asyncio.Event = lt.run(_new_event())

    def set(self) -> None:
        self._tev.set()
        self.lt.call(self._aev.set)

    def is_set(self) -> bool:
        return self._tev.is_set()

    async def wait(self, timeout: float = DEADLINE) -> None:
        await asyncio.wait_for(self._aev.wait(), timeout)

    def wait_sync(self, timeout: float = DEADLINE, what: str = "gate") -> None:
        assert self._tev.wait(timeout), f"{what} not reached within {timeout} s"


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


def hostport(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", int(u.port or 80)


def http_request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | list | None = None,
    timeout: float = DEADLINE,
) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request with ``http.client`` (which de-chunks but never decompresses)."""
    host, port = hostport(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
        items = headers.items() if isinstance(headers, dict) else (headers or [])
        for k, v in items:
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.getheaders(), data
    finally:
        conn.close()


def open_stream(
    url: str,
    method: str,
    path: str,
    body: bytes = b"{}",
    headers: dict[str, str] | None = None,
    timeout: float = DEADLINE,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Start a request and return once the response headers arrived; read the body in pieces
    with ``resp.read(n)`` (exactly n de-chunked bytes, or a timeout after ``timeout``)."""
    host, port = hostport(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def raw_roundtrip(url: str, request: bytes, timeout: float = DEADLINE) -> bytes:
    """Send ``request`` bytes as they are on a new socket and read until the server closes."""
    host, port = hostport(url)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(request)
        return read_until_closed(s)


def raw_response(url: str, request: bytes, timeout: float = DEADLINE) -> bytes:
    """Send ``request`` bytes on a new socket and read one response by its framing (the
    connection may stay open)."""
    host, port = hostport(url)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(request)
        return read_response(s)


def read_until_closed(s: socket.socket) -> bytes:
    """Everything the peer sends until it closes (EOF or reset)."""
    out = bytearray()
    while True:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return bytes(out)


def read_response(s: socket.socket) -> bytes:
    """Read one complete response (keep-alive connection: by its framing, not by EOF)."""
    raw = b""
    while True:
        if b"\r\n\r\n" in raw and parse_response(raw)[3]:
            return raw
        data = s.recv(65536)
        if not data:
            return raw
        raw += data


def parse_response(raw: bytes) -> tuple[int, list[tuple[str, str]], bytes, bool]:
    """Parse one HTTP/1.1 response from raw bytes: (status, headers, body, complete). The body is
    de-chunked when chunked; ``complete`` says whether the terminating chunk (or the whole
    Content-Length) arrived."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {raw[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = [(k, v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
    names = {k.lower(): v for k, v in headers}
    if names.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        pos = 0
        while True:
            eol = rest.find(b"\r\n", pos)
            if eol < 0:
                return status, headers, bytes(body), False
            size = int(rest[pos:eol].split(b";")[0], 16)
            if size == 0:
                return status, headers, bytes(body), rest[eol + 2 : eol + 4] == b"\r\n"
            start = eol + 2
            if len(rest) < start + size + 2:
                body += rest[start : start + size]
                return status, headers, bytes(body), False
            body += rest[start : start + size]
            pos = start + size + 2
    if "content-length" in names:
        n = int(names["content-length"])
        return status, headers, rest[:n], len(rest) >= n
    return status, headers, rest, True


def poll(fn: Callable[[], Any], what: str, deadline: float = DEADLINE, interval: float = 0.02) -> Any:
    """Call ``fn`` until it returns something truthy; fail after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not reached within {deadline} s (last value {value!r})")
        threading.Event().wait(interval)


def wait_exchanges(gw, n: int, run: str | None = None, *, finished: bool = True) -> list[Exchange]:
    """Poll the gateway's journal until its run holds ``n`` exchanges (all finished, unless
    ``finished`` is False). Returns them in seq order."""

    def check():
        gw.journal.flush()
        with JournalReader(gw.journal_path) as r:
            exs = r.exchanges(run or gw.run)
        if len(exs) >= n and (not finished or all(e.outcome != "in_flight" for e in exs)):
            return exs
        return None

    return poll(check, f"{n} exchanges in the journal")


def dead_url() -> str:
    """The URL of a port that was bound and then closed: connecting is refused at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


async def read_http_request(reader: asyncio.StreamReader) -> bytes:
    """Read one HTTP request (head and Content-Length body) from an asyncio stream."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    body = await reader.readexactly(length) if length else b""
    return head + body


class SocketUpstream:
    """A bare asyncio TCP server for upstreams that break HTTP: ``behaviour(reader, writer)`` runs
    per connection. ``requests`` holds the raw requests read with :func:`read_http_request`."""

    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.behaviour(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self.url

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


def start_socket_upstream(stack, behaviour) -> SocketUpstream:
    up = SocketUpstream(behaviour)
    stack.lt.run(up.start())
    stack._stops.append(up.stop)
    return up


def json_upstream(payload: bytes = b'{"ok":true}', status: int = 200, content_type: str = "application/json"):
    """A handler answering every request with ``payload``."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=status, body=payload, headers={"Content-Type": content_type})

    return handler
