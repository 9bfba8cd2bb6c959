"""The capture gateway passes traffic through untouched (docs/gateway.md "Pass-through" and
"Routing"): every raw stream of the wire corpus byte for byte and chunk by chunk, unbuffered,
headers minus hop-by-hop ones, compressed request bodies as sent, raw paths not re-quoted.

Real servers on 127.0.0.1 (the gateway and programmable upstreams in the loop thread of
``stack``), real blocking clients in the test thread. Chunk boundaries are made deterministic
with barriers: the upstream sends chunk i+1 only after the client has read chunk i through the
gateway, so the gateway cannot have read two chunks at once.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import socket
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from gateway_helpers import (
    DEADLINE,
    Gate,
    hostport,
    http_request,
    json_upstream,
    open_stream,
    parse_response,
    raw_roundtrip,
    read_response,
    wait_exchanges,
)

from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import unpack_timings

# --------------------------------------------------------------------------- the wire corpus

# protocol directory -> (protocol module, upstream name, request path)
STREAM_ROUTES = {
    "anthropic": ("anthropic", "anthropic", "/v1/messages"),
    "openai-chat": ("openai-chat", "openai", "/v1/chat/completions"),
    "openai-responses": ("openai-responses", "openai", "/v1/responses"),
    "gemini": ("gemini", "gemini", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"),
}


def _corpus_dir() -> Path:
    from conftest import corpus_dir

    return corpus_dir()


def _stream_cases() -> list[str]:
    wire = _corpus_dir() / "wire"
    names = sorted(str(p.relative_to(wire)) for p in wire.glob("*/*.sse"))
    names += sorted(str(p.relative_to(wire)) for p in wire.glob("openai-responses/*.chunks.jsonl"))
    names += sorted(str(p.relative_to(wire)) for p in wire.glob("gemini/*.chunks.jsonl"))
    return names or ["<corpus missing>"]


def stream_bytes(corpus: Path, rel: str) -> bytes:
    """The raw stream of a corpus file: ``.sse`` as is; decoded Responses payloads framed as
    ``event: <type>\\ndata: <json>\\n\\n``; Gemini payloads as ``data: <json>\\r\\n\\r\\n``."""
    path = corpus / "wire" / rel
    raw = path.read_bytes()
    if rel.endswith(".sse"):
        return raw
    lines = [line for line in raw.split(b"\n") if line.strip()]
    if rel.startswith("openai-responses/"):
        return b"".join(
            b"event: " + orjson.loads(line)["type"].encode() + b"\ndata: " + line + b"\n\n" for line in lines
        )
    if rel.startswith("gemini/"):
        return b"".join(b"data: " + line + b"\r\n\r\n" for line in lines)
    raise AssertionError(rel)


def split_chunks(data: bytes, n: int = 5) -> list[bytes]:
    """``data`` cut into ``n`` pieces at uneven offsets (so cuts fall inside events and lines)."""
    cuts = sorted({max(1, min(len(data) - 1, len(data) * k // (n + 1) + 7 * k)) for k in range(1, n)})
    pieces, prev = [], 0
    for c in cuts:
        pieces.append(data[prev:c])
        prev = c
    pieces.append(data[prev:])
    assert b"".join(pieces) == data and all(pieces)
    return pieces


def stepped_stream(
    chunks: list[bytes], gates: list[Gate], content_type: str = "text/event-stream", headers=None
):
    """An upstream handler that sends ``chunks`` one by one, waiting on ``gates[i]`` after chunk i
    (set by the client once it has read chunk i through the gateway)."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": content_type, **(headers or {})})
        await resp.prepare(request)
        for i, chunk in enumerate(chunks):
            await resp.write(chunk)
            if i < len(gates):
                await gates[i].wait()
        await resp.write_eof()
        return resp

    return handler


def read_in_steps(resp: http.client.HTTPResponse, chunks: list[bytes], gates: list[Gate]) -> bytes:
    """Read each chunk's length through the gateway, then open the upstream's next gate."""
    got = bytearray()
    for i, chunk in enumerate(chunks):
        piece = resp.read(len(chunk))
        got += piece
        if i < len(gates):
            gates[i].set()
    rest = resp.read()
    return bytes(got) + rest


@pytest.mark.parametrize("rel", _stream_cases())
def test_corpus_stream_passes_through_byte_identical(stack, corpus, rel):
    data = stream_bytes(corpus, rel)
    proto_name, upstream_name, path = STREAM_ROUTES[rel.split("/")[0]]
    chunks = split_chunks(data)
    gates = [Gate(stack.lt) for _ in chunks[:-1]]
    up = stack.raw_upstream(stepped_stream(chunks, gates))
    gw = stack.gateway(upstreams={upstream_name: up.url})

    conn, resp = open_stream(gw.url, "POST", path, body=b'{"stream":true}')
    try:
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "text/event-stream"
        received = read_in_steps(resp, chunks, gates)
    finally:
        conn.close()
    assert received == data, "the client did not receive the upstream's bytes unchanged"

    (ex,) = wait_exchanges(gw, 1)
    assert (ex.outcome, ex.status, ex.protocol, ex.streamed) == ("ok", 200, proto_name, True)
    assert (ex.bytes_received, ex.bytes_delivered) == (len(data), len(data))
    timings = unpack_timings(ex.chunk_timings)
    assert [n for _, n in timings] == [len(c) for c in chunks], (
        "chunk timings must count the upstream's chunks"
    )
    assert [t for t, _ in timings] == sorted(t for t, _ in timings)
    with stack.reader(gw) as r:
        assert r.response_body(ex, raw=True) == data
        expected = get_protocol(proto_name).reassemble(chunks).final
        assert get_protocol(proto_name).reassemble([data]).final == expected
        if expected is None:
            assert ex.response_final is None
        else:
            assert r.response_body(ex) == orjson.dumps(expected)
            assert r.blob(ex.response_final) == orjson.dumps(expected)


def _gated_stream(
    stack, released: Gate, before: list[bytes], after: list[bytes], timed_out: list | None = None
):
    """An upstream that sends an event-stream head and the events ``before``, waits for
    ``released`` (10 s deadline, noted in ``timed_out``), then sends ``after`` and ends."""

    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in before:
            await resp.write(event)
        try:
            await released.wait(DEADLINE)
        except TimeoutError:
            if timed_out is not None:
                timed_out.append(True)
            return resp
        for event in after:
            await resp.write(event)
        await resp.write_eof()
        return resp

    return stack.raw_upstream(handler)


def test_stream_is_not_buffered(stack):
    """Chunk 1 reaches the client while the upstream still holds chunk 2 (barrier, 10 s deadline)."""
    released = Gate(stack.lt)
    timed_out: list[bool] = []
    up = _gated_stream(stack, released, [b"event: one\ndata: 1\n\n"], [b"event: two\ndata: 2\n\n"], timed_out)
    gw = stack.gateway(upstreams={"anthropic": up.url})
    conn, resp = open_stream(gw.url, "POST", "/v1/messages", timeout=DEADLINE)
    try:
        try:
            first = resp.read(len(b"event: one\ndata: 1\n\n"))
        except socket.timeout:
            pytest.fail("chunk 1 did not reach the client within 10 s: the gateway buffers the stream")
        assert first == b"event: one\ndata: 1\n\n"
        health = orjson.loads(http_request(gw.url, "GET", "/__pvisor/health")[2])
        assert health == {"ok": True, "run": gw.run, "inflight": 1}
        released.set()
        assert resp.read() == b"event: two\ndata: 2\n\n"
    finally:
        conn.close()
    assert not timed_out
    (ex,) = wait_exchanges(gw, 1)
    assert ex.outcome == "ok"
    assert len(unpack_timings(ex.chunk_timings)) == 2


def test_non_streamed_json_passes_through(stack):
    body = b'{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}]}'
    up = stack.raw_upstream(json_upstream(body))
    gw = stack.gateway(upstreams={"anthropic": up.url})
    status, headers, data = http_request(
        gw.url, "POST", "/v1/messages", b'{"model":"m","messages":[]}', {"Content-Type": "application/json"}
    )
    assert (status, data) == (200, body)
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.outcome, ex.streamed, ex.response_final) == ("ok", False, None)
    with stack.reader(gw) as r:
        assert r.response_body(ex) == body
        assert r.request_body(ex) == b'{"model":"m","messages":[]}'


# --------------------------------------------------------------------------- headers

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
    "proxy-authorization",
    "proxy-foo",
}


def capture_headers(seen: list, response=None):
    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        seen.append([(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers])
        if response is not None:
            return await response(request)
        return web.Response(body=b"{}", headers={"Content-Type": "application/json"})

    return handler


def test_request_headers_reach_upstream_without_hop_by_hop(stack):
    seen: list = []
    up = stack.raw_upstream(capture_headers(seen))
    gw = stack.gateway(upstreams={"anthropic": up.url})
    body = b'{"model":"m"}'
    sent = [
        ("Host", "gateway.example:1234"),
        ("anthropic-version", "2023-06-01"),
        ("X-Custom-One", "Value With  Spaces"),
        ("x-dup", "a"),
        ("Connection", "keep-alive, X-Named-Hop"),
        ("X-Named-Hop", "must not pass"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Trailer", "X-Checksum"),
        ("Upgrade", "h2c"),
        ("Proxy-Connection", "keep-alive"),
        ("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0"),
        ("Proxy-Foo", "bar"),
        ("X-Pvisor-Run", "r-other"),
        ("x-dup", "b"),
        ("Content-Length", str(len(body))),
        ("X-Last", "1"),
    ]
    req = (
        b"POST /v1/messages?beta=true HTTP/1.1\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in sent)
        + b"\r\n"
        + body
    )
    host, port = hostport(gw.url)
    with socket.create_connection((host, port), timeout=DEADLINE) as s:
        s.sendall(req)
        raw = read_response(s)
    status, _, got, complete = parse_response(raw)
    assert (status, got, complete) == (200, b"{}", True)

    (upstream_saw,) = seen
    dropped = HOP_BY_HOP | {"host", "content-length", "x-pvisor-run", "x-named-hop"}
    expected = [(k, v) for k, v in sent if k.lower() not in dropped]
    assert [(k, v) for k, v in upstream_saw if k.lower() not in ("host", "content-length")] == expected
    names = {k.lower(): v for k, v in upstream_saw}
    assert names["host"] == f"127.0.0.1:{hostport(up.url)[1]}"
    assert names["content-length"] == str(len(body))
    assert up.requests[0][1] == "/v1/messages?beta=true" and up.requests[0][3] == body

    (ex,) = wait_exchanges(gw, 1, run="r-other")
    assert ex.run == "r-other" and ex.outcome == "ok"


def test_gateway_adds_no_headers_of_its_own(stack):
    seen: list = []
    up = stack.raw_upstream(capture_headers(seen))
    gw = stack.gateway(upstreams={"openai": up.url})
    body = b'{"model":"m","input":"hi"}'
    raw = raw_roundtrip(
        gw.url,
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (len(body), body),
    )
    assert parse_response(raw)[0] == 200
    assert sorted(k.lower() for k, _ in seen[0]) == ["content-length", "host"], seen[0]
    assert up.requests[0][3] == body

    # a chunked request body goes upstream as the same bytes, with a Content-Length
    seen.clear()
    raw = raw_roundtrip(
        gw.url,
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b'5\r\n{"a":\r\n3\r\n1}\n\r\n0\r\n\r\n',
    )
    assert parse_response(raw)[0] == 200
    assert sorted(k.lower() for k, _ in seen[0]) == ["content-length", "host"], seen[0]
    assert up.requests[1][3] == b'{"a":1}\n'


def test_response_headers_and_gzip_body_reach_client_unchanged(stack):
    payload = orjson.dumps({"id": "resp_1", "text": "x" * 2000})
    gz = gzip.compress(payload, mtime=0)
    upstream_headers = [
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
        ("X-Request-Id", "req_0123456789"),
        ("anthropic-ratelimit-requests-remaining", "99"),
        ("Set-Cookie", "__cf_bm=abc; Path=/; HttpOnly"),
        ("Set-Cookie", "other=def; Path=/"),
        ("Vary", "Accept-Encoding"),
        ("Date", "Thu, 01 Jan 2026 00:00:00 GMT"),
        ("Server", "upstream-test/1.0"),
        ("Keep-Alive", "timeout=5"),
        ("Trailer", "X-Checksum"),
        ("Connection", "X-Named-Hop"),
        ("X-Named-Hop", "must not pass"),
        ("Proxy-Foo", "bar"),
    ]

    async def handler(request):
        resp = web.Response(status=201, body=gz)
        for k, v in upstream_headers:
            resp.headers.add(k, v)
        return resp

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url})

    def fetch(url: str):
        with socket.create_connection(hostport(url), timeout=DEADLINE) as s:
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            return parse_response(read_response(s))

    direct_status, direct_headers, direct_body, _ = fetch(up.url)
    status, headers, body, complete = fetch(gw.url)
    assert (status, body, complete) == (201, gz, True)
    assert direct_body == gz and gzip.decompress(body) == payload

    def end_to_end(hs):
        return [(k, v) for k, v in hs if k.lower() not in HOP_BY_HOP | {"x-named-hop"}]

    assert end_to_end(headers) == end_to_end(direct_headers)
    names = [k.lower() for k, _ in headers]
    direct_names = [k.lower() for k, _ in direct_headers]
    for hop in ("x-named-hop", "keep-alive", "trailer", "proxy-foo"):
        assert hop in direct_names and hop not in names, hop
    assert ("Connection", "X-Named-Hop") not in headers
    assert ("Content-Length", str(len(gz))) in headers
    assert [v for k, v in headers if k == "Set-Cookie"] == [
        "__cf_bm=abc; Path=/; HttpOnly",
        "other=def; Path=/",
    ]

    (ex,) = wait_exchanges(gw, 1)
    assert ex.status == 201 and ex.outcome == "ok"
    assert "set-cookie" not in ex.response_headers and ex.response_headers["content-encoding"] == "gzip"
    with stack.reader(gw) as r:
        assert r.response_body(ex, raw=True) == gz


# --------------------------------------------------------------------------- routing


@pytest.fixture
def three_upstreams(stack):
    ups = {
        name: stack.raw_upstream(json_upstream(b'{"upstream":"%s"}' % name.encode()))
        for name in ("anthropic", "openai", "gemini")
    }
    gw = stack.gateway(upstreams={name: up.url for name, up in ups.items()})
    return gw, ups


ROUTES = [
    # (request path, upstream, path the upstream sees, protocol, journal path)
    ("/v1/messages", "anthropic", "/v1/messages", "anthropic", "/v1/messages"),
    ("/v1/messages?beta=true", "anthropic", "/v1/messages?beta=true", "anthropic", "/v1/messages"),
    (
        "/v1/messages/count_tokens",
        "anthropic",
        "/v1/messages/count_tokens",
        "anthropic",
        "/v1/messages/count_tokens",
    ),
    ("/v1/chat/completions", "openai", "/v1/chat/completions", "openai-chat", "/v1/chat/completions"),
    ("/v1/responses", "openai", "/v1/responses", "openai-responses", "/v1/responses"),
    (
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        "gemini",
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        "gemini",
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
    ),
    (
        "/v1/models/gemini-2.5-pro:generateContent",
        "gemini",
        "/v1/models/gemini-2.5-pro:generateContent",
        "gemini",
        "/v1/models/gemini-2.5-pro:generateContent",
    ),
    ("/anthropic/v1/models", "anthropic", "/v1/models", None, "/v1/models"),
    ("/openai/v1/models?limit=2", "openai", "/v1/models?limit=2", None, "/v1/models"),
    ("/gemini/v1beta/models", "gemini", "/v1beta/models", None, "/v1beta/models"),
    ("/openai/v1/responses", "openai", "/v1/responses", "openai-responses", "/v1/responses"),
    ("/gemini", "gemini", "/", None, "/"),
    ("/anthropic?x=1", "anthropic", "/?x=1", None, "/"),
]


def test_routing_by_protocol_path_and_mount_prefix(stack, three_upstreams):
    gw, ups = three_upstreams
    for path, upstream, upstream_path, _, _ in ROUTES:
        status, _, body = http_request(gw.url, "POST", path, b"{}")
        assert (status, body) == (200, b'{"upstream":"%s"}' % upstream.encode()), path
    for name, up in ups.items():
        assert [r[1] for r in up.requests] == [u for _, n, u, _, _ in ROUTES if n == name]
    exs = wait_exchanges(gw, len(ROUTES))
    assert [(e.path, e.protocol, e.outcome) for e in exs] == [(j, p, "ok") for _, _, _, p, j in ROUTES]


def test_run_prefix_and_header_select_the_run_and_are_not_forwarded(stack, three_upstreams):
    gw, ups = three_upstreams
    http_request(gw.url, "POST", "/run/r-prefix/v1/messages?beta=true", b"{}")
    http_request(gw.url, "POST", "/v1/messages", b"{}", {"X-Pvisor-Run": "r-header"})
    http_request(
        gw.url, "POST", "/run/r-prefix/openai/v1/models", b"{}", {"X-Pvisor-Run": "r-header"}
    )  # prefix wins
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    assert [r[1] for r in ups["anthropic"].requests] == [
        "/v1/messages?beta=true",
        "/v1/messages",
        "/v1/messages",
    ]
    assert [r[1] for r in ups["openai"].requests] == ["/v1/models"]
    for _, _, headers, _ in ups["anthropic"].requests + ups["openai"].requests:
        assert "x-pvisor-run" not in {k.lower() for k in headers}
    prefixed = wait_exchanges(gw, 2, run="r-prefix")
    assert [(e.path, e.query, e.protocol) for e in prefixed] == [
        ("/v1/messages", "beta=true", "anthropic"),
        ("/v1/models", "", None),
    ]
    (by_header,) = wait_exchanges(gw, 1, run="r-header")
    assert by_header.path == "/v1/messages"
    (own,) = wait_exchanges(gw, 1)
    assert own.run == gw.run
    with stack.reader(gw) as r:
        assert {"r-prefix", "r-header", gw.run} <= {run.id for run in r.runs()}


def test_invalid_run_header_is_a_recorded_400(stack, three_upstreams):
    gw, ups = three_upstreams
    status, _, body = http_request(gw.url, "POST", "/v1/messages", b"{}", {"X-Pvisor-Run": "../../etc"})
    assert status == 400
    err = orjson.loads(body)["error"]
    assert err["type"] == "pvisor_bad_run_id" and "X-Pvisor-Run" in err["message"]
    assert not any(up.requests for up in ups.values())
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.status, ex.outcome, ex.run) == (400, "upstream_unreachable", gw.run)
    # the /run/<id>/ prefix wins over a bad header
    status, _, _ = http_request(gw.url, "POST", "/run/r-ok/v1/messages", b"{}", {"X-Pvisor-Run": "bad id"})
    assert status == 200


@pytest.mark.parametrize(
    "path",
    [
        "/run/bad%20id/v1/chat/completions",
        "/run//v1/chat/completions",
        "/run/" + "r" * 200 + "/v1/chat/completions",
        "/run/.hidden/v1/chat/completions",
        "/run/",
    ],
)
def test_invalid_run_id_in_the_path_is_a_recorded_400(stack, three_upstreams, path):
    gw, ups = three_upstreams
    status, headers, body = http_request(
        gw.url, "POST", path, b'{"model":"m"}', {"X-Pvisor-Run": "r-good-header"}
    )
    assert status == 400, body
    err = orjson.loads(body)["error"]
    assert err["type"] == "pvisor_bad_run_id" and "/run/<id>/" in err["message"]
    assert not any(up.requests for up in ups.values())  # neither forwarded with the prefix nor elsewhere
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.status, ex.outcome, ex.run) == (400, "upstream_unreachable", gw.run)
    with stack.reader(gw) as r:
        assert r.request_body(ex) == b'{"model":"m"}'


def test_unknown_path_without_single_upstream_is_a_recorded_404(stack, three_upstreams):
    gw, ups = three_upstreams
    status, headers, body = http_request(gw.url, "GET", "/v1/models?key=abc")
    assert status == 404
    err = orjson.loads(body)["error"]
    assert err["type"] == "pvisor_no_route" and "/v1/models" in err["message"]
    assert dict(headers)["Content-Type"].startswith("application/json")
    assert not any(up.requests for up in ups.values())
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.status, ex.path, ex.outcome, ex.query) == (
        404,
        "/v1/models",
        "upstream_unreachable",
        "key=REDACTED",
    )
    assert ex.error.startswith("pvisor_no_route")


def test_answers_the_gateway_gives_itself_record_the_request_body(stack, three_upstreams):
    gw, ups = three_upstreams
    chunked = (
        b"POST /v2/unknown HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b'5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'
    )
    assert parse_response(raw_roundtrip(gw.url, chunked))[0] == 404
    assert (
        http_request(gw.url, "POST", "/v1/messages", b'{"run":"bad"}', {"X-Pvisor-Run": "not a run id"})[0]
        == 400
    )
    ws = (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade, close\r\nContent-Length: 8\r\n"
        b'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n{"ws":1}'
    )
    assert parse_response(raw_roundtrip(gw.url, ws))[0] == 426
    assert not any(up.requests for up in ups.values())
    exs = wait_exchanges(gw, 3)
    assert [(e.status, e.request_bytes) for e in exs] == [(404, 7), (400, 13), (426, 8)]
    with stack.reader(gw) as r:
        assert [r.request_body(e) for e in exs] == [b'{"a":1}', b'{"run":"bad"}', b'{"ws":1}']


def test_unknown_path_goes_to_the_only_upstream(stack):
    up = stack.raw_upstream(json_upstream(b'{"data":[]}'))
    gw = stack.gateway(upstreams={"openai": up.url + "/proxy"})
    assert http_request(gw.url, "GET", "/v1/models")[::2] == (200, b'{"data":[]}')
    assert http_request(gw.url, "POST", "/v1/responses", b"{}")[0] == 200
    assert http_request(gw.url, "POST", "/something/else?q=1", b"{}")[0] == 200
    # anthropic's own path goes to its (default, public) upstream, never to the single fallback
    assert [r[1] for r in up.requests] == [
        "/proxy/v1/models",
        "/proxy/v1/responses",
        "/proxy/something/else?q=1",
    ]
    exs = wait_exchanges(gw, 3)
    assert [(e.method, e.path, e.protocol) for e in exs] == [
        ("GET", "/v1/models", None),
        ("POST", "/v1/responses", "openai-responses"),
        ("POST", "/something/else", None),
    ]


def test_health_answers_locally_and_is_not_recorded(stack, three_upstreams):
    gw, ups = three_upstreams
    status, _, body = http_request(gw.url, "GET", "/__pvisor/health")
    assert status == 200
    assert orjson.loads(body) == {"ok": True, "run": gw.run, "inflight": 0}
    assert http_request(gw.url, "POST", "/v1/messages", b"{}")[0] == 200
    (ex,) = wait_exchanges(gw, 1)
    assert ex.path == "/v1/messages"
    assert not any(r[1].startswith("/__pvisor") for up in ups.values() for r in up.requests)


def test_raw_path_is_not_requoted(stack):
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"gemini": up.url})
    paths = [
        "/v1beta/models/tuned%2Fmodel:generateContent?alt=sse&x=a%2Bb+c&y=%3A",
        "/gemini/v1beta/files/a%2Fb+c:d%20e?q=%2F%2f",
        "/v1beta/models/m:countTokens?key=%41%42",
    ]
    for p in paths:
        assert http_request(gw.url, "POST", p, b"{}")[0] == 200
    assert [r[1] for r in up.requests] == [paths[0], paths[1].removeprefix("/gemini"), paths[2]]
    exs = wait_exchanges(gw, 3)
    assert exs[0].path == "/v1beta/models/tuned%2Fmodel:generateContent" and exs[0].protocol == "gemini"
    assert exs[2].query == "key=REDACTED"


def test_head_is_proxied_without_body_with_upstream_content_length(stack):
    async def handler(request):
        if request.method == "HEAD":
            resp = web.StreamResponse(
                status=200, headers={"Content-Type": "text/html", "Content-Length": "1234", "X-Up": "head"}
            )
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        return web.Response(body=b"after", headers={"Content-Type": "text/plain"})

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url})
    host, port = hostport(gw.url)
    conn = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        conn.request("HEAD", "/")
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Length") == "1234" and resp.getheader("X-Up") == "head"
        assert resp.read() == b""
        # the connection is still usable: no stray body bytes were sent after the HEAD response
        conn.request("GET", "/after")
        resp2 = conn.getresponse()
        assert (resp2.status, resp2.read()) == (200, b"after")
    finally:
        conn.close()
    assert [(m, p) for m, p, _, _ in up.requests] == [("HEAD", "/"), ("GET", "/after")]
    exs = wait_exchanges(gw, 2)
    assert [(e.method, e.status, e.outcome, e.response_body) for e in exs[:1]] == [
        ("HEAD", 200, "ok", exs[0].response_body)
    ]
    with stack.reader(gw) as r:
        assert not r.response_body(exs[0], raw=True)


# --------------------------------------------------------------------------- compressed request bodies


def codex_body(corpus: Path) -> bytes:
    line = (corpus / "requests" / "codex-0.171.0.jsonl").read_bytes().split(b"\n")[0]
    return orjson.dumps(orjson.loads(line)["body"])


def zstd_module():
    try:
        from compression import zstd  # Python >= 3.14
    except ImportError:
        from backports import zstd
    return zstd


@pytest.mark.parametrize("framing", ["one-shot", "streaming"])
def test_zstd_request_body_forwarded_byte_identical_and_journaled_decoded(stack, corpus, framing):
    zstd = zstd_module()
    body = codex_body(corpus)
    if framing == "one-shot":
        compressed = zstd.compress(body, level=3)
    else:  # as Codex does: a streaming frame without a content size
        c = zstd.ZstdCompressor(level=3)
        compressed = c.compress(body) + c.flush()
    assert compressed != body
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"openai": up.url})
    status, _, _ = http_request(
        gw.url,
        "POST",
        "/v1/responses",
        compressed,
        {"Content-Type": "application/json", "Content-Encoding": "zstd"},
    )
    assert status == 200
    (_, _, headers, forwarded) = up.requests[0]
    assert hashlib.sha256(forwarded).hexdigest() == hashlib.sha256(compressed).hexdigest()
    assert headers["Content-Encoding"] == "zstd"
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.outcome, ex.request_encoding, ex.request_bytes) == ("ok", "zstd", len(compressed))
    with stack.reader(gw) as r:
        assert r.request_body(ex) == body
    assert ex.protocol == "openai-responses"


def test_gzip_request_body_forwarded_and_journaled_decoded(stack, corpus):
    body = codex_body(corpus)
    compressed = gzip.compress(body, compresslevel=6, mtime=0)
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"openai": up.url})
    assert (
        http_request(
            gw.url,
            "POST",
            "/v1/responses",
            compressed,
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )[0]
        == 200
    )
    assert up.requests[0][3] == compressed and up.requests[0][2]["Content-Encoding"] == "gzip"
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.outcome, ex.request_encoding, ex.request_bytes) == ("ok", "gzip", len(compressed))
    with stack.reader(gw) as r:
        assert r.request_body(ex) == body


def test_corrupt_zstd_body_forwarded_unchanged_and_kept_raw(stack):
    corrupt = b"\x28\xb5\x2f\xfd" + b"this is not a zstd frame at all" * 3
    up = stack.raw_upstream(json_upstream())
    gw = stack.gateway(upstreams={"openai": up.url})
    assert (
        http_request(
            gw.url,
            "POST",
            "/v1/responses",
            corrupt,
            {"Content-Type": "application/json", "Content-Encoding": "zstd"},
        )[0]
        == 200
    )
    assert up.requests[0][3] == corrupt
    (ex,) = wait_exchanges(gw, 1)
    assert (ex.outcome, ex.status, ex.request_encoding) == ("decode_error", 200, "zstd")
    assert "zstd" in ex.error
    with stack.reader(gw) as r:
        assert r.request_body(ex) == corrupt
        assert r.response_body(ex) == b'{"ok":true}'


def test_a_streams_head_reaches_the_client_before_its_first_event(stack):
    """The gateway writes a whole body's head together with its bytes, but never holds a
    stream's head back: an agent may wait for the status before the model's first event."""
    released = Gate(stack.lt)
    up = _gated_stream(stack, released, [], [b"event: one\ndata: 1\n\n"])
    gw = stack.gateway(upstreams={"anthropic": up.url})
    try:
        conn, resp = open_stream(gw.url, "POST", "/v1/messages", timeout=3)
    except socket.timeout:
        released.set()
        pytest.fail("the stream's head did not reach the client while the upstream held its first event")
    try:
        # open_stream returned: the status line and headers arrived while the upstream holds the event
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        released.set()
        assert resp.read() == b"event: one\ndata: 1\n\n"
    finally:
        released.set()
        conn.close()
    (ex,) = wait_exchanges(gw, 1)
    assert ex.outcome == "ok"
