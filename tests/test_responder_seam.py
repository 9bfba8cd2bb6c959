"""The responder seam of the gateway (gateway/responder.py): whatever answers, one relay writes
the answer to the agent chunk by chunk and one recorder journals it with ``served_by``.

In the manner of mitmproxy's ``test_serverplayback.py``: small responders written here answer
through the real gateway on 127.0.0.1, a real client reads, and the real journal is checked.
Chunk boundaries are fixed with barriers (the source yields chunk 2 only after the client has
read chunk 1), never with clocks.
"""

from __future__ import annotations

import socket
import sqlite3
import struct

import orjson
import pytest
from gateway_helpers import (
    DEADLINE,
    Gate,
    hostport,
    http_request,
    json_upstream,
    open_stream,
    parse_response,
    read_until_closed,
    wait_exchanges,
)

from pvisor.gateway.responder import Forward, IncomingRequest, Refuse, Serve, ServedBy, StreamBroken
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_responder import ScriptedResponder
from pvisor.journal.reader import JournalReader
from pvisor.journal.schema import schema_version
from pvisor.journal.writer import Journal

PLAIN = (str, bytes, int, float, type(None), tuple)


class Recording:
    """A responder that keeps every request it got and answers with ``answer(request)``."""

    def __init__(self, answer):
        self.answer = answer
        self.seen: list[IncomingRequest] = []

    async def respond(self, request):
        self.seen.append(request)
        return self.answer(request)


def test_a_served_body_reaches_the_agent_and_is_journaled_with_who_served_it(stack):
    body = b'{"id":"msg_1","type":"message","role":"assistant","content":[]}'
    resp = Recording(
        lambda r: Serve(
            200,
            [("Content-Type", "application/json"), ("x-served", "yes")],
            body=body,
            served_by=ServedBy.PLAYBACK,
            flags=("synthetic_end",),
        )
    )
    gw = stack.gateway({}, responder=resp)
    status, headers, got = http_request(
        gw.url,
        "POST",
        "/run/r-seam/v1/messages?beta=true",
        b'{"model":"m","messages":[]}',
        headers={"x-api-key": "sk-secret-seam", "Content-Type": "application/json"},
    )
    assert (status, got) == (200, body)
    assert dict((k.lower(), v) for k, v in headers)["x-served"] == "yes"
    [req] = resp.seen
    # plain data across the seam: no aiohttp object, the route applied, the secret available to forward
    for name in IncomingRequest.__slots__:
        assert isinstance(getattr(req, name), PLAIN), (name, type(getattr(req, name)))
    assert (req.run, req.method, req.path, req.query, req.protocol, req.upstream) == (
        "r-seam",
        "POST",
        "/v1/messages",
        "beta=true",
        "anthropic",
        "anthropic",
    )
    assert req.body == b'{"model":"m","messages":[]}' and req.header("X-API-KEY") == "sk-secret-seam"
    [ex] = wait_exchanges(gw, 1, "r-seam")
    assert (ex.served_by, ex.flags, ex.outcome, ex.status) == ("playback", ("synthetic_end",), "ok", 200)
    with JournalReader(gw.journal_path) as r:
        assert r.response_body(ex, raw=True) == body and r.request_body(ex) == b'{"model":"m","messages":[]}'
    assert b"sk-secret-seam" not in gw.journal_path.read_bytes()


def test_an_async_source_is_relayed_chunk_by_chunk(stack):
    gate = Gate(stack.lt)

    async def chunks():
        yield b"data: one\n\n"
        await gate.wait()  # only once the client has read chunk 1 through the gateway
        yield b"data: two\n\n"

    gw = stack.gateway(
        {},
        responder=Recording(
            lambda r: Serve(
                200,
                [("Content-Type", "text/event-stream")],
                chunks=chunks(),
                streamed=True,
                served_by=ServedBy.PLAYBACK,
            )
        ),
    )
    conn, resp = open_stream(gw.url, "POST", "/v1/chat/completions")
    try:
        assert resp.read(11) == b"data: one\n\n"
        gate.set()
        assert resp.read() == b"data: two\n\n"
    finally:
        conn.close()
    [ex] = wait_exchanges(gw, 1)
    assert (
        ex.streamed
        and ex.served_by == "playback"
        and ex.bytes_delivered == 22
        and len(ex.chunk_timings) == 24
    )


def test_a_source_that_breaks_is_passed_on_as_far_as_it_got_then_cut(stack):
    async def chunks():
        yield b"data: part\n\n"
        raise StreamBroken(
            "upstream_reset", "upstream anthropic connection broke after 12 bytes: ClientPayloadError"
        )

    gw = stack.gateway(
        {},
        responder=Recording(
            lambda r: Serve(200, [("Content-Type", "text/event-stream")], chunks=chunks(), streamed=True)
        ),
    )
    with socket.create_connection(hostport(gw.url), timeout=DEADLINE) as s:
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        raw = read_until_closed(s)
    status, _, body, complete = parse_response(raw)
    assert status == 200 and body == b"data: part\n\n" and not complete
    [ex] = wait_exchanges(gw, 1)
    assert ex.outcome == "upstream_reset" and "after 12 bytes" in ex.error and ex.bytes_received == 12


def test_an_agent_gone_mid_stream_stops_the_source(stack):
    gate, stopped = Gate(stack.lt), Gate(stack.lt)

    class Source:
        def __init__(self):
            self.n = 0

        def __aiter__(self):
            return self

        async def __anext__(self):
            self.n += 1
            if self.n > 1:
                await gate.wait()
            return b"x" * 65536

        async def aclose(self):
            stopped.set()

    gw = stack.gateway(
        {},
        responder=Recording(lambda r: Serve(200, [("Content-Type", "text/event-stream")], chunks=Source())),
    )
    conn, resp = open_stream(gw.url, "POST", "/v1/messages")
    resp.read(10)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    gate.set()
    stopped.wait_sync(what="the source's aclose")
    [ex] = wait_exchanges(gw, 1)
    assert ex.outcome == "aborted_by_client" and ex.bytes_delivered < ex.bytes_received


def test_a_refusal_is_the_protocols_error_shape_served_by_refused(stack):
    gw = stack.gateway(
        {},
        responder=Recording(lambda r: Refuse(409, "pvisor_test_refusal", "not now", "upstream_unreachable")),
    )
    status, _, body = http_request(gw.url, "POST", "/v1/chat/completions", b"{}")
    assert status == 409 and orjson.loads(body)["error"]["message"] == "not now"
    [ex] = wait_exchanges(gw, 1)
    assert (ex.served_by, ex.outcome, ex.error) == (
        "refused",
        "upstream_unreachable",
        "pvisor_test_refusal: not now",
    )


def test_forward_sends_the_responders_body_upstream_and_journals_the_agents(stack):
    up = stack.raw_upstream(json_upstream(b'{"ok":1}'))
    gw = stack.gateway({"openai": up.url}, responder=Recording(lambda r: Forward(body=b'{"rewritten":true}')))
    status, _, body = http_request(
        gw.url,
        "POST",
        "/v1/chat/completions",
        b'{"sent":"by agent"}',
        headers={"Content-Type": "application/json"},
    )
    assert (status, body) == (200, b'{"ok":1}')
    assert up.requests[0][3] == b'{"rewritten":true}'
    [ex] = wait_exchanges(gw, 1)
    assert ex.served_by == "upstream"
    with JournalReader(gw.journal_path) as r:
        # both: what the agent sent and what went upstream
        assert r.request_body(ex) == b'{"sent":"by agent"}'
        assert r.forwarded_body(ex) == b'{"rewritten":true}'


def test_a_forward_of_the_agents_own_bytes_keeps_no_second_body(stack):
    up = stack.raw_upstream(json_upstream(b'{"ok":1}'))
    gw = stack.gateway({"openai": up.url}, responder=Recording(lambda r: Forward()))
    assert http_request(gw.url, "POST", "/v1/chat/completions", b'{"sent":1}')[0] == 200
    assert up.requests[0][3] == b'{"sent":1}'
    [ex] = wait_exchanges(gw, 1)
    with JournalReader(gw.journal_path) as r:
        assert ex.forwarded_body is None and r.forwarded_body(ex) is None
        assert r.request_body(ex) == b'{"sent":1}'


def test_an_offline_gateway_forwards_nothing(stack):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway({"openai": up.url}, responder=Recording(lambda r: Forward()), offline=True)
    status, headers, body = http_request(gw.url, "POST", "/v1/chat/completions", b"{}")
    assert status == 502 and up.requests == []
    assert "forwards nothing" in orjson.loads(body)["error"]["message"]
    [ex] = wait_exchanges(gw, 1)
    assert ex.served_by == "refused"


def test_the_default_responder_forwards_and_the_scripted_one_answers_in_process(stack):
    up = stack.raw_upstream(json_upstream(b'{"from":"upstream"}'))
    capture = stack.gateway({"openai": up.url}, name="capture")
    assert http_request(capture.url, "POST", "/v1/chat/completions", b"{}")[2] == b'{"from":"upstream"}'
    assert wait_exchanges(capture, 1)[0].served_by == "upstream"

    import openai

    model = ScriptedModel(parse_script({"turns": [{"text": "scripted hello"}], "main_chain": "first"}))
    gw = stack.gateway({}, name="scripted", responder=ScriptedResponder(model), offline=True)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="dummy", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "scripted hello"
    [ex] = wait_exchanges(gw, 1)
    assert ex.served_by == "scripted" and ex.streamed and ex.outcome == "ok"


def test_a_schema_2_journal_is_read_without_served_by_and_migrated_by_the_next_writer(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.record_exchange(
            "r-old", "POST", "/v1/messages", status=200, request_body=b"{}", response_body=b"{}"
        )
    # back to what an older pvisor wrote: no served_by, no flags, two migrations
    conn = sqlite3.connect(path)
    for view in ("exchange_bodies", "run_summary"):  # (views came later; they name the columns)
        conn.execute(f"DROP VIEW {view}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = 'm009_readable_views'")
    conn.execute("ALTER TABLE exchanges DROP COLUMN forwarded_body")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = 'm004_forwarded_body'")
    conn.execute("ALTER TABLE exchanges DROP COLUMN served_by")
    conn.execute("ALTER TABLE exchanges DROP COLUMN flags")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = 'm003_served_by'")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    with JournalReader(path) as r:
        [ex] = r.exchanges("r-old")
        assert ex.served_by is None and ex.flags == ()
    with Journal.open(path) as j:
        j.record_exchange(
            "r-new",
            "POST",
            "/v1/messages",
            status=200,
            request_body=b"{}",
            response_body=b"{}",
            served_by="scripted",
            flags=["synthetic_end"],
        )
    with JournalReader(path) as r:
        assert r.exchanges("r-old")[0].served_by is None
        assert (r.exchanges("r-new")[0].served_by, r.exchanges("r-new")[0].flags) == (
            "scripted",
            ("synthetic_end",),
        )
        assert r.conn.execute("PRAGMA user_version").fetchone()[0] == schema_version()
        assert r.exchanges("r-new")[0].forwarded_body is None


@pytest.mark.parametrize("path,method", [("/", "HEAD"), ("/v1/models", "GET")])
def test_requests_no_protocol_owns_reach_the_responder(stack, path, method):
    resp = Recording(
        lambda r: Serve(200, [("Content-Type", "application/json")], body=b"{}", served_by=ServedBy.PLAYBACK)
    )
    gw = stack.gateway({}, responder=resp)
    status, _, _ = http_request(gw.url, method, path)
    assert status == 200 and resp.seen[0].upstream is None and resp.seen[0].protocol is None


def test_an_agent_that_closes_after_the_last_byte_got_the_whole_answer(stack):
    """An SDK that stops reading at the last event (``data: [DONE]``) and closes the connection
    before the chunked terminator got every byte: ``ok``, not ``aborted_by_client`` (a flaky
    failure of the intercept tests under load). The gateway notices the close before the source
    ends, which the test waits for on the gateway's loop (its connections gone), not by a clock."""
    import asyncio

    gate = Gate(stack.lt)
    last = b"data: [DONE]\n\n"

    class Source:
        def __init__(self):
            self.n = 0

        def __aiter__(self):
            return self

        async def __anext__(self):
            self.n += 1
            if self.n == 1:
                return last
            await gate.wait()
            raise StopAsyncIteration

    gw = stack.gateway(
        {},
        responder=Recording(lambda r: Serve(200, [("Content-Type", "text/event-stream")], chunks=Source())),
    )
    conn, resp = open_stream(gw.url, "POST", "/v1/chat/completions")
    assert resp.read(len(last)) == last
    # closed with a reset, as a client process that exits does with unread bytes pending
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.sock.close()
    conn.close()

    async def closed_on_the_gateways_side():
        server = gw.gateway._runner.server
        while any(h.transport is not None and not h.transport.is_closing() for h in server.connections):
            await asyncio.sleep(0)

    stack.lt.run(closed_on_the_gateways_side())
    gate.set()
    [ex] = wait_exchanges(gw, 1)
    assert (ex.outcome, ex.error) == ("ok", None)
    assert ex.bytes_delivered == ex.bytes_received == len(last)
