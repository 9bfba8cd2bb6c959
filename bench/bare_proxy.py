"""Benchmark baseline: the barest aiohttp pass-through proxy, no journal, no parsing.

The floor for a Python gateway: the same client and server settings as pvisor's gateway
(no auto-decompression, no pool limit, chunks written as they arrive), nothing else.

Usage: python bench/bare_proxy.py --port 0 --upstream http://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web
from yarl import URL

DROP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


async def main(port: int, upstream: str) -> None:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600),
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
    )

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in DROP]
        async with session.request(
            request.method, URL(upstream + request.raw_path, encoded=True), headers=headers, data=body
        ) as up:
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in DROP or k.lower() == "content-length":
                    resp.headers.add(k, v)
            try:
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            except ConnectionResetError:  # the load generator closed its connections at the end of a run
                pass
            return resp

    runner = web.ServerRunner(web.Server(handle, auto_decompress=False), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"listening http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--upstream", required=True)
    a = ap.parse_args()
    asyncio.run(main(a.port, a.upstream.rstrip("/")))
