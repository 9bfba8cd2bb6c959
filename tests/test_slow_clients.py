"""Slow and too many clients (issue 35, item 5; docs/gateway.md, "Slow and too many clients"):
1,100 connections sending a byte a second took every file descriptor of a gateway, real requests
timed out, and 133,312 tracebacks went to stderr. Here, in small: a gateway bounded to a few
connections, with a short head deadline, under more slow connections than its bound. A real
request still gets its answer, the slow ones are closed after the deadline, a connection beyond
the bound while every one is busy gets a 503 with one line, and stderr has no traceback and at
most a few warning lines. (The long attack: bench/slow_clients.py, docs/reliability.md.)"""

from __future__ import annotations

import re
import socket

from gateway_helpers import DEADLINE, Gate, hostport, http_request, json_upstream, open_stream, poll
from test_gateway_cli import ENV

SLOW = 24  # connections, against a bound of 6
HEAD = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Slow: "


def _gateway(procs, tmp_path, upstream: str, *extra: str):
    gw = procs(
        [
            "--journal",
            str(tmp_path / "journal.sqlite"),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={upstream}",
            "--run",
            "r-slow",
            *extra,
        ],
        env=ENV,
    )
    return gw, gw.listening()


def _open_slow(url: str, n: int) -> list[socket.socket]:
    """``n`` connections that each send the start of a request head, and never its end (then a
    byte of a header value now and then: :func:`_trickle`)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(hostport(url), timeout=DEADLINE)
        s.sendall(HEAD)
        socks.append(s)
    return socks


def _closed(s: socket.socket) -> bool:
    """Whether the gateway closed ``s`` (EOF or a reset), reading what it sent; never blocks."""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _trickle(socks: list[socket.socket]) -> None:
    """One more byte of the head on every connection still open (as a slowloris client does)."""
    for s in socks:
        try:
            s.send(b"a")
        except OSError:
            pass


def test_slow_clients_are_closed_after_the_head_deadline_and_a_real_request_is_answered(
    stack, procs, tmp_path
):
    up = stack.raw_upstream(json_upstream(b'{"id":"msg_1","content":"ok"}'))
    gw, url = _gateway(procs, tmp_path, up.url, "--max-connections", "6", "--header-timeout", "2")
    slow = _open_slow(url, SLOW)  # 6 take every slot; the others, beyond the bound, get a 503
    try:
        # the real request makes room once a slow connection has had its half second (until then
        # it is refused with a 503, which the official SDKs retry), and is answered
        def answered():
            status, _, body = http_request(url, "POST", "/v1/messages", b'{"model":"m"}')
            assert status in (200, 503), status
            return body if status == 200 else None

        assert poll(answered, "the real request answered", interval=0.1) == b'{"id":"msg_1","content":"ok"}'

        def all_closed():
            _trickle(slow)
            return all(_closed(s) for s in slow)

        poll(all_closed, "every slow connection closed", deadline=DEADLINE, interval=0.2)
    finally:
        for s in slow:
            s.close()
    assert gw.stop() == 0
    stderr = gw.err.rest()
    assert "Traceback" not in stderr, stderr
    warnings = [line for line in stderr.splitlines() if "connections (" in line]
    assert 1 <= len(warnings) <= 3, stderr
    said = " ".join(warnings)
    assert "1 idle or slow closed to make room" in said, stderr
    assert "5 closed for sending no whole request head within 2 s (--header-timeout)" in said, stderr
    # the slow connections beyond the bound, and the real request's tries before there was room
    refused = sum(int(n) for n in re.findall(r"(\d+) refused with 503", said))
    assert refused >= SLOW - 6, stderr


def test_a_connection_beyond_the_bound_while_every_one_is_busy_gets_a_503_line(stack, procs, tmp_path):
    release = Gate(stack.lt)
    arrived: list[int] = []

    async def handler(request):
        from aiohttp import web

        await request.read()
        arrived.append(1)
        await release.wait()
        return web.json_response({"ok": True})

    up = stack.raw_upstream(handler)
    gw, url = _gateway(procs, tmp_path, up.url, "--max-connections", "2")
    busy = []
    try:
        for _ in range(2):
            host, port = hostport(url)
            s = socket.create_connection((host, port), timeout=DEADLINE)
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            busy.append(s)
        poll(lambda: len(arrived) == 2, "both requests at the upstream")
        status, headers, body = http_request(url, "POST", "/v1/messages", b"{}")
        assert status == 503, (status, body)
        assert body == b"pvisor gateway: too many open connections (--max-connections); retry later\n"
        assert ("Connection", "close") in headers
    finally:
        release.set()
    for s in busy:
        s.settimeout(DEADLINE)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        s.close()
    # room again: a new connection is served
    conn, resp = open_stream(url, "POST", "/v1/messages", b"{}")
    release.set()
    assert resp.status == 200
    conn.close()
    assert gw.stop() == 0
    stderr = gw.err.rest()
    assert "Traceback" not in stderr
    assert "1 refused with 503, none being idle or slow for 0.5 s" in stderr, stderr
