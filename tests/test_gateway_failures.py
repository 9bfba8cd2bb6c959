"""Failures through the capture gateway (docs/gateway.md "Failures and outcomes" and "Secrets"):
each is passed on as it happened, recorded with its outcome, and loses nothing else in the
journal (a good exchange before and after each failure is checked to be there).

Upstreams that break on purpose run in the loop thread of ``stack``; clients are blocking
sockets in the test thread. Every wait is a barrier or a poll with a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import quote, quote_plus

import orjson
import pytest
from aiohttp import web
from gateway_helpers import (
    DEADLINE,
    Gate,
    dead_url,
    hostport,
    http_request,
    json_upstream,
    open_stream,
    parse_response,
    raw_response,
    read_http_request,
    read_response,
    read_until_closed,
    start_socket_upstream,
    wait_exchanges,
)

from pvisor.adapters.protocols import get_protocol
from pvisor.journal.reader import JournalReader

GOOD_PATH = "/v1/chat/completions"  # served by the good (openai) upstream
GOOD_REPLY = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[]}'


@pytest.fixture
def good(stack):
    """The URL of an upstream that always answers ``GOOD_REPLY``."""
    return stack.raw_upstream(json_upstream(GOOD_REPLY)).url


def good_exchange(gw, n: int) -> None:
    status, _, body = http_request(
        gw.url, "POST", GOOD_PATH, b'{"good":%d}' % n, {"Content-Type": "application/json"}
    )
    assert (status, body) == (200, GOOD_REPLY)


def assert_around(stack, gw, exs, middle_outcome: str) -> None:
    """Exchanges are [good 1, the failure, good 2], all recorded, the good ones intact."""
    assert [e.outcome for e in exs] == ["ok", middle_outcome, "ok"], [
        (e.path, e.outcome, e.error) for e in exs
    ]
    assert [e.seq for e in exs] == [1, 2, 3]
    with stack.reader(gw) as r:
        assert r.request_body(exs[0]) == b'{"good":1}' and r.response_body(exs[0]) == GOOD_REPLY
        assert r.request_body(exs[2]) == b'{"good":2}' and r.response_body(exs[2]) == GOOD_REPLY


def raw_post(path: str, body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
        % (path.encode(), len(body), extra, body)
    )


# --------------------------------------------------------------------------- upstream HTTP errors


@pytest.mark.parametrize("status,streamed", [(400, False), (429, False), (500, False), (529, True)])
def test_upstream_http_error_passed_on_unchanged(stack, good, status, streamed):
    body = get_protocol("anthropic").error_body(status, "upstream says no")
    if streamed:
        body = b"event: error\ndata: " + body + b"\n\n"

    async def handler(request):
        return web.Response(
            status=status,
            body=body,
            headers={
                "Content-Type": "text/event-stream" if streamed else "application/json",
                "Retry-After": "7",
                "request-id": "req_err",
            },
        )

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good})
    good_exchange(gw, 1)
    got_status, headers, got = http_request(
        gw.url, "POST", "/v1/messages", b'{"stream":%s}' % (b"true" if streamed else b"false")
    )
    good_exchange(gw, 2)
    assert (got_status, got) == (status, body)
    assert dict(headers)["Retry-After"] == "7" and dict(headers)["request-id"] == "req_err"
    assert "x-pvisor-error" not in {k.lower() for k, _ in headers}
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "upstream_error")
    assert exs[1].status == status and exs[1].streamed == streamed
    with stack.reader(gw) as r:
        assert r.response_body(exs[1], raw=True) == body


# --------------------------------------------------------------------------- upstream unreachable

PROTOCOL_CASES = [
    # (protocol, path, dead upstream, upstream of the good exchange)
    ("anthropic", "/v1/messages", "anthropic", "openai"),
    ("openai-chat", "/v1/chat/completions", "openai", "anthropic"),
    ("openai-responses", "/v1/responses", "openai", "anthropic"),
    ("gemini", "/v1beta/models/gemini-2.5-pro:generateContent", "gemini", "openai"),
]


def assert_error_shape(protocol: str, status: int, body: bytes, kind: str) -> str:
    """The protocol's JSON error shape; returns the message."""
    obj = orjson.loads(body)
    if protocol == "anthropic":
        assert obj["type"] == "error" and set(obj["error"]) == {"type", "message"}
        assert obj["error"]["type"] == kind
        return obj["error"]["message"]
    if protocol.startswith("openai"):
        assert set(obj["error"]) == {"message", "type", "param", "code"}
        assert obj["error"]["type"] == kind
        return obj["error"]["message"]
    assert protocol == "gemini"
    assert set(obj["error"]) == {"code", "message", "status"} and obj["error"]["code"] == status
    return obj["error"]["message"]


@pytest.mark.parametrize("protocol,path,dead,alive", PROTOCOL_CASES)
def test_upstream_down_gives_502_in_protocol_shape(stack, protocol, path, dead, alive):
    good_up = stack.raw_upstream(json_upstream(GOOD_REPLY))
    gw = stack.gateway(upstreams={dead: dead_url(), alive: good_up.url})
    good_path = "/v1/messages" if alive == "anthropic" else GOOD_PATH

    def good_call(n):
        assert http_request(gw.url, "POST", good_path, b'{"good":%d}' % n)[::2] == (200, GOOD_REPLY)

    good_call(1)
    status, headers, body = http_request(
        gw.url, "POST", path, b'{"model":"m"}', {"Content-Type": "application/json"}
    )
    good_call(2)
    assert status == 502
    h = {k.lower(): v for k, v in headers}
    assert h["x-pvisor-error"] == "upstream_unreachable"
    assert h["content-type"].startswith("application/json")
    message = assert_error_shape(protocol, 502, body, "upstream_unreachable")
    assert "Connection refused" in message and "127.0.0.1" not in message
    exs = wait_exchanges(gw, 3)
    assert [e.outcome for e in exs] == ["ok", "upstream_unreachable", "ok"]
    bad = exs[1]
    assert (bad.status, bad.protocol, bad.bytes_received) == (502, protocol, 0)
    assert "Connection refused" in bad.error
    with stack.reader(gw) as r:
        assert r.request_body(bad) == b'{"model":"m"}'
        assert r.response_body(bad) == body
        assert r.request_body(exs[2]) == b'{"good":2}'


def test_connect_timeout_is_upstream_unreachable(stack, good, monkeypatch):
    """A connect that never completes (a listener whose accept queue is full drops SYNs on
    Linux) is ``upstream_unreachable`` once the connect timeout passes, not a stall."""
    import pvisor.gateway.forwarder as forwarder

    monkeypatch.setattr(forwarder, "SOCK_CONNECT_TIMEOUT_S", 0.3)
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = socket.create_connection(full.getsockname(), timeout=DEADLINE)  # fills the queue
    try:
        gw = stack.gateway(
            upstreams={"anthropic": "http://127.0.0.1:%d" % full.getsockname()[1], "openai": good}
        )
        good_exchange(gw, 1)
        status, headers, body = http_request(gw.url, "POST", "/v1/messages", b"{}")
        good_exchange(gw, 2)
    finally:
        queued.close()
        full.close()
    assert status == 502
    assert dict((k.lower(), v) for k, v in headers)["x-pvisor-error"] == "upstream_unreachable"
    assert "no connection within 0.3 s" in assert_error_shape("anthropic", 502, body, "upstream_unreachable")
    exs = wait_exchanges(gw, 3)
    assert [e.outcome for e in exs] == ["ok", "upstream_unreachable", "ok"]


# --------------------------------------------------------------------------- resets


@pytest.mark.parametrize("how", ["close", "abort"])
def test_reset_before_response_headers_gives_502(stack, good, how):
    async def behaviour(up, reader, writer):
        up.requests.append(await read_http_request(reader))
        if how == "abort":
            writer.transport.abort()
        else:
            writer.close()

    up = start_socket_upstream(stack, behaviour)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good})
    good_exchange(gw, 1)
    status, headers, body = http_request(gw.url, "POST", "/v1/messages", b'{"model":"m"}')
    good_exchange(gw, 2)
    assert status == 502
    assert dict((k.lower(), v) for k, v in headers)["x-pvisor-error"] == "upstream_reset"
    assert_error_shape("anthropic", 502, body, "upstream_reset")
    assert up.connections == 1 and len(up.requests) == 1 and up.requests[0].endswith(b'{"model":"m"}')
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "upstream_reset")
    assert exs[1].status == 502 and "before answering" in exs[1].error


HEAD_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n"
)
PART = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1"}}\n\n'
    b'event: ping\ndata: {"type":"ping"}\n\n'
)


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_reset_after_headers_forwards_what_arrived_then_cuts(stack, good, framing):
    client_read = Gate(stack.lt)

    async def behaviour(up, reader, writer):
        up.requests.append(await read_http_request(reader))
        if framing == "chunked":
            writer.write(HEAD_CHUNKED + b"%x\r\n%s\r\n" % (len(PART), PART))
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 5000\r\n\r\n" + PART
            )
        await writer.drain()
        await client_read.wait()  # the client holds the part: now break the connection
        writer.transport.abort()

    up = start_socket_upstream(stack, behaviour)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good})
    good_exchange(gw, 1)
    with socket.create_connection(hostport(gw.url), timeout=DEADLINE) as s:
        s.sendall(raw_post("/v1/messages", b'{"stream":true}'))
        raw = b""
        while not (b"\r\n\r\n" in raw and parse_response(raw)[2] == PART):
            data = s.recv(65536)
            assert data, f"connection closed before the part arrived: {raw!r}"
            raw += data
        client_read.set()
        raw += read_until_closed(s)
    good_exchange(gw, 2)
    status, headers, body, complete = parse_response(raw)
    assert status == 200 and body == PART and not complete, raw
    if framing == "chunked":
        # exactly the forwarded chunk and nothing after it: no terminating chunk, no error text
        assert raw.endswith(b"\r\n\r\n%x\r\n%s\r\n" % (len(PART), PART))
    else:
        assert ("Content-Length", "5000") in headers and raw.endswith(b"\r\n\r\n" + PART)
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "upstream_reset")
    bad = exs[1]
    assert (bad.status, bad.bytes_received, bad.bytes_delivered) == (200, len(PART), len(PART))
    assert "connection broke after %d bytes" % len(PART) in bad.error
    with stack.reader(gw) as r:
        assert r.response_body(bad, raw=True) == PART


def test_stall_mid_stream_is_upstream_reset_naming_the_stall(stack, good):
    release = Gate(stack.lt)

    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(PART)
        try:
            await release.wait(DEADLINE)  # stall: nothing more until the test ends
        except TimeoutError:
            pass
        return resp

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good}, stall_timeout=0.5)
    try:
        good_exchange(gw, 1)
        conn, resp = open_stream(gw.url, "POST", "/v1/messages", b'{"stream":true}')
        try:
            assert resp.read(len(PART)) == PART
            with pytest.raises(http.client.IncompleteRead) as exc:
                resp.read()  # the gateway gives up after 0.5 s without bytes and cuts the connection
            assert exc.value.partial == b""
        finally:
            conn.close()
        good_exchange(gw, 2)
        exs = wait_exchanges(gw, 3)
    finally:
        release.set()
    assert_around(stack, gw, exs, "upstream_reset")
    bad = exs[1]
    assert "sent nothing for 0.5 s" in bad.error and (bad.bytes_received, bad.bytes_delivered) == (
        len(PART),
        len(PART),
    )


def test_stall_before_headers_is_502_upstream_reset(stack, good):
    release = Gate(stack.lt)

    async def handler(request):
        try:
            await release.wait(DEADLINE)
        except TimeoutError:
            pass
        return web.Response(body=b"{}")

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good}, stall_timeout=0.5)
    try:
        good_exchange(gw, 1)
        status, headers, body = http_request(gw.url, "POST", "/v1/messages", b"{}")
        good_exchange(gw, 2)
        exs = wait_exchanges(gw, 3)
    finally:
        release.set()
    assert status == 502 and dict((k.lower(), v) for k, v in headers)["x-pvisor-error"] == "upstream_reset"
    assert "0.5 s" in assert_error_shape("anthropic", 502, body, "upstream_reset")
    assert_around(stack, gw, exs, "upstream_reset")


# --------------------------------------------------------------------------- client gone


def test_client_gone_mid_stream_closes_upstream_and_is_recorded(stack, good):
    client_gone = Gate(stack.lt)
    upstream_closed = Gate(stack.lt)
    sent_after = []

    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(PART)
        await client_gone.wait()
        end = time.monotonic() + DEADLINE
        try:
            # keep streaming until the gateway closes this connection (it must, at once)
            while time.monotonic() < end:
                await resp.write(b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n')
                sent_after.append(1)
                await asyncio.sleep(0)  # only lets the loop run the gateway between writes
        except ConnectionError:  # aiohttp: "Cannot write to closing transport"
            upstream_closed.set()
            raise
        return resp

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good})
    good_exchange(gw, 1)
    conn, resp = open_stream(gw.url, "POST", "/v1/messages", b'{"stream":true}')
    assert resp.read(len(PART)) == PART
    conn.close()
    resp.close()
    client_gone.set()
    upstream_closed.wait_sync(what="upstream connection closed by the gateway")
    good_exchange(gw, 2)
    exs = wait_exchanges(gw, 3)  # polls the journal (deadline) until all three are finished
    assert_around(stack, gw, exs, "aborted_by_client")
    bad = exs[1]
    assert bad.bytes_delivered >= len(PART) and bad.bytes_received >= bad.bytes_delivered
    assert "client went away" in bad.error


def test_gateway_stop_marks_exchange_in_flight_incomplete(stack, good):
    release = Gate(stack.lt)

    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(PART)
        try:
            await release.wait(DEADLINE)
        except TimeoutError:
            pass
        return resp

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good}, shutdown_grace=0.2)
    try:
        good_exchange(gw, 1)
        conn, resp = open_stream(gw.url, "POST", "/v1/messages", b'{"stream":true}')
        assert resp.read(len(PART)) == PART
        stack.lt.run(gw.gateway.stop())  # the upstream still holds the stream: grace runs out
        gw.journal.close()
        conn.close()
    finally:
        release.set()
    with JournalReader(gw.journal_path) as r:
        exs = r.exchanges(gw.run)
    assert [e.outcome for e in exs] == ["ok", "incomplete"]
    assert "in flight" in exs[1].error


# --------------------------------------------------------------------------- local refusals


def test_body_over_max_body_is_413_with_content_length(stack, good):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good}, max_body=1000)
    good_exchange(gw, 1)
    with socket.create_connection(hostport(gw.url), timeout=DEADLINE) as s:
        # only the head is sent: the gateway refuses on the declared length without reading a body
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n"
        )
        raw = read_response(s)
        # then the body: the gateway reads it away and closes the connection (Connection: close)
        s.sendall(b"b" * 5000)
        assert read_until_closed(s) == b""
    good_exchange(gw, 2)
    status, headers, body, complete = parse_response(raw)
    assert status == 413 and complete and ("Connection", "close") in headers
    assert assert_error_shape("anthropic", 413, body, "pvisor_request_too_large")
    assert up.requests == []
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "oversize")
    assert exs[1].status == 413 and "5000" in exs[1].error and "--max-body" in exs[1].error
    assert exs[1].request_bytes == 5000 and exs[1].request_body is None  # declared size, body never read


def test_body_over_max_body_is_413_when_chunked(stack, good):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good}, max_body=1000)
    good_exchange(gw, 1)
    chunk = b"x" * 1500
    with socket.create_connection(hostport(gw.url), timeout=DEADLINE) as s:
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n"
            % (len(chunk), chunk)
        )
        raw = read_response(s)  # refused once 1500 > 1000 bytes arrived, before the body ends
        s.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
        assert read_until_closed(s) == b""
    good_exchange(gw, 2)
    status, headers, body, complete = parse_response(raw)
    assert status == 413 and complete
    assert_error_shape("anthropic", 413, body, "pvisor_request_too_large")
    assert up.requests == []
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "oversize")
    assert exs[1].status == 413
    # what was read before the refusal is recorded, and counted
    assert 1000 < exs[1].request_bytes <= 1500
    with stack.reader(gw) as r:
        assert r.request_body(exs[1]) == b"x" * exs[1].request_bytes


def test_expect_100_continue_is_answered_and_oversize_refused_before_the_body(stack):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"anthropic": up.url}, max_body=1000)
    body = b'{"model":"m"}'
    with socket.create_connection(hostport(gw.url), timeout=DEADLINE) as s:
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
            % len(body)
        )
        interim = b""
        while b"\r\n\r\n" not in interim:  # a client such as curl waits for this before sending the body
            data = s.recv(65536)
            assert data, interim
            interim += data
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        status, _, got, _ = parse_response(read_response(s))
        assert (status, got) == (200, b'{"ok":true}')
        # a declared length over --max-body: the 413 comes at once, no 100 Continue
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"
        )
        raw = read_response(s)
        assert raw.startswith(b"HTTP/1.1 413 ") and parse_response(raw)[3]
        s.sendall(b"b" * 5000)  # a client that sends anyway: read away, then the connection closes
        assert read_until_closed(s) == b""
    assert len(up.requests) == 1 and up.requests[0][3] == body
    assert "expect" not in {k.lower() for k in up.requests[0][2]}
    exs = wait_exchanges(gw, 2)
    assert [e.outcome for e in exs] == ["ok", "oversize"]


def test_body_at_max_body_passes(stack):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"anthropic": up.url}, max_body=1000)
    assert http_request(gw.url, "POST", "/v1/messages", b"y" * 1000)[0] == 200
    assert up.requests[0][3] == b"y" * 1000


def test_websocket_upgrade_is_a_recorded_426(stack, good):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"openai": good, "anthropic": up.url})
    good_exchange(gw, 1)
    raw = raw_response(
        gw.url,
        b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    good_exchange(gw, 2)
    status, _, body, _ = parse_response(raw)
    assert status == 426
    assert_error_shape("openai-responses", 426, body, "pvisor_websocket_unsupported")
    exs = wait_exchanges(gw, 3)
    assert [e.outcome for e in exs] == ["ok", "upstream_unreachable", "ok"]
    assert (exs[1].status, exs[1].path, exs[1].method) == (426, "/v1/responses", "GET")
    assert "websocket" in exs[1].error.lower()
    assert len([r for r in up.requests]) == 0


# --------------------------------------------------------------------------- the gateway's own failures


def test_https_upstream_speaking_plain_http_names_the_tls_failure(stack, good):
    plain = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"anthropic": plain.url.replace("http://", "https://"), "openai": good})
    good_exchange(gw, 1)
    status, headers, body = http_request(gw.url, "POST", "/v1/messages", b'{"model":"m"}')
    good_exchange(gw, 2)
    assert status == 502
    message = assert_error_shape("anthropic", 502, body, "upstream_unreachable")
    assert (
        "TLS handshake failed" in message
        and "plain HTTP" in message
        and "Operation not permitted" not in message
    ), message
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "upstream_unreachable")
    assert "TLS handshake failed" in exs[1].error


@pytest.mark.parametrize("when", ["before the response", "after the response started"])
def test_unexpected_exception_is_recorded_answered_and_logged_in_one_line(
    stack, good, tmp_path, monkeypatch, capfd, caplog, when
):
    """A bug (here: the relay raising) is not aiohttp's text/plain 500 with a traceback: the
    exchange is recorded ``incomplete`` naming the exception type only (its text could hold a
    URL with a key), the agent gets a 500 in the protocol's JSON shape if nothing was sent yet
    (else the connection is cut), and one line is logged."""
    import pvisor.gateway.proxy as proxy

    secretish = "https://user:PVSECRETBUG0001@example.invalid/?key=PVSECRETBUG0002"

    async def broken_relay(self, request, cur, upstream, headers_us):
        if when == "after the response started":
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            cur.started = True
            await resp.write(PART)
        raise RuntimeError(f"boom {secretish}")

    up = stack.raw_upstream(json_upstream())
    log = tmp_path / "gw.log"
    gw = stack.gateway(upstreams={"anthropic": up.url, "openai": good}, log_file=log)
    good_exchange(gw, 1)
    monkeypatch.setattr(proxy.Gateway, "_relay", broken_relay)
    with socket.create_connection(hostport(gw.url), timeout=DEADLINE) as s:
        s.sendall(raw_post("/v1/messages", b'{"model":"m"}'))
        raw = read_until_closed(s)
    monkeypatch.undo()
    good_exchange(gw, 2)
    status, headers, body, complete = parse_response(raw)
    if when == "before the response":
        assert status == 500 and complete
        assert (
            assert_error_shape("anthropic", 500, body, "pvisor_internal_error")
            == "pvisor internal error: RuntimeError"
        )
    else:
        assert status == 200 and body == PART and not complete
    exs = wait_exchanges(gw, 3)
    assert_around(stack, gw, exs, "incomplete")
    assert exs[1].error == "pvisor internal error: RuntimeError"
    with stack.reader(gw) as r:
        assert r.request_body(exs[1]) == b'{"model":"m"}'
    stack.lt.run(gw.gateway.stop())
    err = capfd.readouterr().err
    assert "Traceback" not in err and "PVSECRETBUG" not in err, err
    records = [rec for rec in caplog.records if rec.name == "pvisor.gateway"]
    assert [(rec.levelname, rec.getMessage(), rec.exc_info) for rec in records] == [
        ("ERROR", f"pvisor internal error: RuntimeError (exchange {exs[1].id}, POST /v1/messages)", None)
    ]
    text = log.read_text()
    assert "Traceback" not in text and "PVSECRETBUG" not in text
    assert len([line for line in text.splitlines() if "pvisor internal error: RuntimeError" in line]) == 1


# --------------------------------------------------------------------------- secrets


SECRETS = {
    "authorization": "sk-ant-PVSECRETAUTHZ0001+/x=",
    "x-api-key": "sk-ant-PVSECRETXAPIKEY0002",
    "x-goog-api-key": "AIzaPVSECRETGOOGKEY0003",
    "api-key": "PVSECRETAZUREKEY0004",
    "proxy-authorization": "PVSECRETPROXY0005",
    "cookie": "PVSECRETCOOKIE0006",
    "x-amz-security-token": "PVSECRETAMZTOKEN0007/+=",
    "key": "AIzaPVSECRETQUERYKEY0008+/",
}
SET_COOKIE_SECRET = "PVSECRETSETCOOKIE0009"
SECRETS_SENT = [*SECRETS.values(), SET_COOKIE_SECRET]  # checked after the module (conftest)


def secret_headers() -> list[tuple[str, str]]:
    return [
        ("Authorization", "Bearer " + SECRETS["authorization"]),
        ("x-api-key", SECRETS["x-api-key"]),
        ("x-goog-api-key", SECRETS["x-goog-api-key"]),
        ("api-key", SECRETS["api-key"]),
        ("Proxy-Authorization", "Bearer " + SECRETS["proxy-authorization"]),
        ("Cookie", "session=" + SECRETS["cookie"]),
        ("X-Amz-Security-Token", SECRETS["x-amz-security-token"]),
        ("Content-Type", "application/json"),
    ]


def secret_forms() -> dict[str, bytes]:
    forms: dict[str, bytes] = {}
    for name, value in [*SECRETS.items(), ("set-cookie", SET_COOKIE_SECRET)]:
        raw = value.encode()
        core = re.search(r"PVSECRET[A-Z]+[0-9]{4}", value).group(0)
        forms[f"{name} raw"] = raw
        forms[f"{name} core"] = core.encode()
        forms[f"{name} base64"] = base64.b64encode(raw)
        forms[f"{name} base64url"] = base64.urlsafe_b64encode(raw)
        forms[f"{name} base64 bearer"] = base64.b64encode(b"Bearer " + raw)
        forms[f"{name} url"] = quote(value, safe="").encode()
        forms[f"{name} url-plus"] = quote_plus(value).encode()
    return forms


def assert_no_secret(data: bytes, where: str) -> None:
    found = [name for name, form in secret_forms().items() if form in data]
    assert not found, f"secret forms {found} found in {where}"


SECRET_PATHS = [
    "/v1/messages?beta=true&key=" + quote(SECRETS["key"], safe=""),
    "/v1/chat/completions?key=" + quote(SECRETS["key"], safe=""),
    "/v1/responses?key=" + quote(SECRETS["key"], safe=""),
    "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=" + quote(SECRETS["key"], safe=""),
    "/v1/models?key=" + quote(SECRETS["key"], safe=""),  # no route when several upstreams
]


def test_secrets_never_reach_journal_log_export_or_errors(stack, tmp_path):
    async def echo(request):
        return web.Response(
            body=b'{"ok":true}',
            headers={
                "Content-Type": "application/json",
                "Set-Cookie": f"__cf_bm={SET_COOKIE_SECRET}; Path=/",
            },
        )

    ups = {n: stack.raw_upstream(echo) for n in ("anthropic", "openai", "gemini")}
    log_live = tmp_path / "live.log"
    log_dead = tmp_path / "dead.log"
    live = stack.gateway(
        upstreams={n: u.url for n, u in ups.items()}, name="live", log_file=log_live, max_body=4096
    )
    dead = stack.gateway(
        upstreams={n: dead_url() for n in ups}, name="dead", log_file=log_dead, max_body=4096
    )

    client_saw = bytearray()
    for gw in (live, dead):
        for path in SECRET_PATHS:
            status, headers, body = http_request(gw.url, "POST", path, b'{"model":"m"}', secret_headers())
            client_saw += body
            client_saw += b"".join(f"{k}: {v}\n".encode() for k, v in headers if k.lower() != "set-cookie")
            if gw is dead:
                assert status in (502, 404), (path, status)
            else:
                assert status in (200, 404), (path, status)
        # a refusal too: oversize body, and a websocket upgrade
        status, headers, body = http_request(gw.url, "POST", SECRET_PATHS[0], b"z" * 5000, secret_headers())
        assert status == 413
        client_saw += body
    assert_no_secret(bytes(client_saw), "what the client received (error messages)")

    # forwarding keeps the credentials (except Proxy-Authorization, which is hop-by-hop)
    forwarded = [r for u in ups.values() for r in u.requests]
    assert len(forwarded) == 4
    for _, raw_path, headers, _ in forwarded:
        h = {k.lower(): v for k, v in headers.items()}
        assert h["authorization"] == "Bearer " + SECRETS["authorization"]
        assert h["x-api-key"] == SECRETS["x-api-key"] and h["x-goog-api-key"] == SECRETS["x-goog-api-key"]
        assert h["api-key"] == SECRETS["api-key"] and h["cookie"] == "session=" + SECRETS["cookie"]
        assert h["x-amz-security-token"] == SECRETS["x-amz-security-token"]
        assert "proxy-authorization" not in h
        assert raw_path.endswith("key=" + quote(SECRETS["key"], safe=""))

    # the journal files while the gateways run
    for gw in (live, dead):
        exs = wait_exchanges(gw, len(SECRET_PATHS) + 1)
        assert {e.outcome for e in exs} <= {"ok", "upstream_unreachable", "oversize"}
        for e in exs:
            assert e.query.endswith("key=REDACTED")
            assert {
                "authorization",
                "x-api-key",
                "x-goog-api-key",
                "api-key",
                "proxy-authorization",
                "cookie",
                "x-amz-security-token",
                "?key",
            } <= set(e.secret_fingerprints)
        files = [p for p in gw.journal_path.parent.iterdir() if p.name.startswith("journal.sqlite")]
        assert {p.name for p in files} >= {"journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"}
        for p in files:
            assert_no_secret(p.read_bytes(), f"{p} (gateway running)")
        assert all("response:set-cookie" in e.secret_fingerprints for e in exs if e.outcome == "ok")

    # stop both, then the files, the logs and an export
    for gw in (live, dead):
        stack.lt.run(gw.gateway.stop())
        gw.journal.close()
        for p in gw.journal_path.parent.iterdir():
            assert_no_secret(p.read_bytes(), f"{p} (after stop)")
        export = subprocess.run(
            [sys.executable, "-m", "pvisor", "--journal", str(gw.journal_path), "journal", "export"],
            capture_output=True,
            timeout=60,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
        assert export.returncode == 0, export.stderr
        assert export.stdout.count(b'"type":"exchange"') == len(SECRET_PATHS) + 1
        assert_no_secret(export.stdout + export.stderr, f"pvisor journal export of {gw.journal_path}")
    for gw, log in ((live, log_live), (dead, log_dead)):
        text = log.read_bytes()
        lines = [
            line
            for line in text.split(b"\n")
            if line.split(b" ")[2:3] == [gw.run.encode()] and line.split(b" ")[3].startswith(b"x-")
        ]
        assert len(lines) == len(SECRET_PATHS) + 1 and all(b"key=REDACTED" in line for line in lines), text
        assert_no_secret(text, f"log file {log}")
    assert b"Connection refused" in log_dead.read_bytes()
