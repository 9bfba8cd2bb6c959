"""Benchmark load generator: N requests at concurrency C against one URL; prints latencies.

Each request is timed from send to the last byte of the response body (ms). Output: one JSON
object on stdout: {"latencies_ms": [...], "errors": n, "wall_s": s}.

Usage: python bench/loadgen.py --url URL --body json|stream --concurrency C --requests N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

BODIES = {
    "json": json.dumps(
        {"model": "bench-model", "messages": [{"role": "user", "content": "hello"}], "stream": False}
    ).encode(),
    "stream": json.dumps(
        {"model": "bench-model", "messages": [{"role": "user", "content": "hello"}], "stream": True}
    ).encode(),
}


async def main(url: str, body_kind: str, concurrency: int, requests: int, warmup: int) -> None:
    body = BODIES[body_kind]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench-not-a-secret"}
    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) as s:

        async def one(record: bool) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                async with s.post(url, data=body, headers=headers) as r:
                    async for _ in r.content.iter_any():
                        pass
                    if r.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
                return
            if record:
                latencies.append((time.perf_counter() - t0) * 1000)

        async def worker(n: int, record: bool) -> None:
            for _ in range(n):
                await one(record)

        await asyncio.gather(*(worker(max(1, warmup // concurrency), False) for _ in range(concurrency)))
        t = time.perf_counter()
        per = requests // concurrency
        await asyncio.gather(*(worker(per, True) for _ in range(concurrency)))
        wall = time.perf_counter() - t
    print(json.dumps({"latencies_ms": latencies, "errors": errors, "wall_s": wall}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--body", choices=sorted(BODIES), required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    a = ap.parse_args()
    asyncio.run(main(a.url, a.body, a.concurrency, a.requests, a.warmup))
