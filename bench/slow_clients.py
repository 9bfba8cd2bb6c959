"""The slow-client attack on a gateway (issue 35, item 5; docs/reliability.md, "Slow clients"),
in its long version: ``--clients`` connections (1,100) that each send a byte of a request head
per second for ``--seconds`` (30), each reopened a second after the gateway closes it (as a
slowloris tool does), while one well-behaved client sends a request every 0.2 s. The gateway runs as
``pvisor gateway`` under ``prlimit --nofile=--nofile`` (1024: the common default), as a user
starts it.

Printed as JSON: the well-behaved requests answered and failed, their latency (p50, max); the
slow connections opened and closed by the gateway; the gateway's most open descriptors; its
stderr (lines, bytes, tracebacks, warning lines); its exit code after SIGTERM.

    python bench/slow_clients.py [--clients 1100] [--seconds 30] [--nofile 1024]
                                 [--pvisor PATH] [--json FILE] [-- GATEWAY ARGS ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

HEAD = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Slow: "
ANSWER = b'{"id":"msg_1","type":"message","content":[{"type":"text","text":"ok"}]}'


async def _upstream() -> tuple[web.AppRunner, str]:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/messages", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


class Counts:
    def __init__(self) -> None:
        self.opened = self.closed_by_gateway = self.connect_failed = 0
        self.ok = self.failed = 0
        self.latencies: list[float] = []
        self.failures: dict[str, int] = {}


async def _slow(host: str, port: int, stop: asyncio.Event, counts: Counts) -> None:
    """One slow client: a byte a second until the gateway closes it, then a new connection a
    second later."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            counts.connect_failed += 1
            await asyncio.sleep(1)
            continue
        counts.opened += 1
        try:
            writer.write(HEAD[:1])
            sent = 1
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                    if not data:
                        counts.closed_by_gateway += 1
                        break
                except asyncio.TimeoutError:
                    pass
                writer.write(HEAD[sent : sent + 1] if sent < len(HEAD) else b"a")
                sent += 1
        except OSError:
            counts.closed_by_gateway += 1
        finally:
            writer.close()
        await asyncio.sleep(1)  # its next byte's tick: a new connection


async def _client(url: str, stop: asyncio.Event, counts: Counts) -> None:
    """The well-behaved client: a request every 0.2 s, each on a new connection, 10 s at most."""
    async with ClientSession(timeout=ClientTimeout(total=10)) as session:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                async with session.post(
                    url + "/v1/messages", data=b'{"model":"m"}', headers={"Connection": "close"}
                ) as resp:
                    body = await resp.read()
                ok = resp.status == 200 and body == ANSWER
                key = f"status {resp.status}"
            except Exception as exc:  # noqa: BLE001 - counted by kind
                ok, key = False, type(exc).__name__
            if ok:
                counts.ok += 1
                counts.latencies.append(time.monotonic() - t0)
            else:
                counts.failed += 1
                counts.failures[key] = counts.failures.get(key, 0) + 1
            await asyncio.sleep(0.2)


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def attack(pvisor: str, clients: int, seconds: float, nofile: int, extra: list[str]) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, clients + 512)), hard))
    runner, upstream = await _upstream()
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-slow-"))
    err = open(tmp / "stderr", "wb+")
    proc = subprocess.Popen(
        [
            "prlimit",
            f"--nofile={nofile}",
            pvisor,
            "--journal",
            str(tmp / "journal.sqlite"),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={upstream}",
            *extra,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=err,
    )
    counts = Counts()
    try:
        readline = proc.stdout.readline  # type: ignore[union-attr]
        line = await asyncio.get_running_loop().run_in_executor(None, readline)
        url = line.decode().split()[-1]
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(_slow(host, int(port), stop, counts)) for _ in range(clients)]
        tasks.append(asyncio.ensure_future(_client(url, stop, counts)))
        most_fds = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            most_fds = max(most_fds, _fds(proc.pid))
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait(tasks, timeout=15)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
        await runner.cleanup()
    err.seek(0)
    stderr = err.read().decode("utf-8", "replace")
    err.close()
    shutil.rmtree(tmp, ignore_errors=True)
    lat = sorted(counts.latencies)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "slow_clients": clients,
        "seconds": seconds,
        "nofile": nofile,
        "gateway_args": extra,
        "requests_ok": counts.ok,
        "requests_failed": counts.failed,
        "failures": counts.failures,
        "latency_p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "latency_max_ms": round(lat[-1] * 1000, 1) if lat else None,
        "slow_opened": counts.opened,
        "slow_closed_by_gateway": counts.closed_by_gateway,
        "slow_connect_failed": counts.connect_failed,
        "gateway_most_fds": most_fds,
        "stderr_lines": len(stderr.splitlines()),
        "stderr_bytes": len(stderr.encode()),
        "tracebacks": stderr.count("Traceback"),
        "warning_lines": [ln for ln in stderr.splitlines() if "warning" in ln][:20],
        "exit_code": code,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=1100)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--nofile", type=int, default=1024, help="the gateway's descriptor limit (prlimit)")
    ap.add_argument(
        "--pvisor",
        default=shutil.which("pvisor", path=os.path.dirname(sys.executable)) or "pvisor",
        help="the pvisor executable (default: this Python's)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("gateway_args", nargs="*", help="more `pvisor gateway` arguments (after --)")
    args = ap.parse_args()
    out = asyncio.run(attack(args.pvisor, args.clients, args.seconds, args.nofile, args.gateway_args))
    print(json.dumps(out, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    ok = out["tracebacks"] == 0 and out["requests_failed"] == 0 and out["exit_code"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
