"""Benchmark upstream: a fast OpenAI-Chat-shaped model server.

POST /v1/chat/completions with ``"stream": false`` answers a ~10 KB ``chat.completion`` body;
with ``"stream": true`` a 200-event ``chat.completion.chunk`` stream and ``data: [DONE]``. The
bodies are built once at start, so the upstream's own cost is as small as it can be.

Usage: python bench/upstream.py --port 0   (prints ``listening http://127.0.0.1:PORT``)
       python bench/upstream.py --port 0 --certfile C --keyfile K   (HTTPS: ``listening https://...``)
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

TEXT = ("The quick brown fox jumps over the lazy dog. " * 230)[:10_000]
JSON_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2500, "total_tokens": 2510},
    },
    separators=(",", ":"),
).encode()


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    obj = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


STREAM_EVENTS = (
    [_chunk({"role": "assistant", "content": ""})]
    + [_chunk({"content": f"token{i} "}) for i in range(198)]
    + [_chunk({}, "stop")]
)
assert len(STREAM_EVENTS) == 200
STREAM_EVENTS.append(b"data: [DONE]\n\n")


async def handle(request: web.BaseRequest) -> web.StreamResponse:
    body = await request.read()
    if b'"stream":true' in body or b'"stream": true' in body:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            for event in STREAM_EVENTS:
                await resp.write(event)
            await resp.write_eof()
        except ConnectionResetError:  # the load generator closed its connections at the end of a run
            pass
        return resp
    return web.Response(body=JSON_BODY, content_type="application/json")


async def main(port: int, certfile: str | None = None, keyfile: str | None = None) -> None:
    ctx = None
    if certfile:
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certfile, keyfile)
    runner = web.ServerRunner(web.Server(handle), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
    await site.start()
    scheme = "https" if ctx else "http"
    print(f"listening {scheme}://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--certfile", default=None, help="serve HTTPS with this certificate (PEM)")
    ap.add_argument("--keyfile", default=None, help="and this key (PEM)")
    a = ap.parse_args()
    asyncio.run(main(a.port, a.certfile, a.keyfile))
