"""Peak memory of the gateway and its journal writer for large and endless responses
(docs/reliability.md, "Memory"; issue 35, item 1).

A real ``pvisor gateway`` (under ``prlimit --as``, a safety net far above what it should use)
forwards to an upstream in this process that streams Server-Sent Events of 64 KiB, each made
from its sequence number, as fast as they are taken; clients read them through the gateway
and check that what they got is exactly the upstream's stream from its first byte. Meanwhile
a second session's small exchange goes through the same gateway. At the end the gateway's
and its writer's peak RSS (``VmHWM`` of ``/proc/PID/status``, each) are read, the gateway is
stopped with SIGTERM (exit 0 expected), and the journal is checked: each large response is
stored up to ``--max-response-body`` (byte-exact) and flagged ``truncated`` when it was longer,
the second session's exchange is whole.

    python bench/memory.py finite [--mib 200] [--cap SIZE]
    python bench/memory.py endless [--seconds 60] [--cap SIZE]
    python bench/memory.py concurrent [--streams 8] [--mib 300] [--cap SIZE]
    python bench/memory.py reassembly [--streams 32] [--seconds 40]
    (any: [--as-limit SIZE] [--json FILE]; finite, endless, concurrent: [--baseline EXE])

``--baseline EXE`` measures another install's ``pvisor`` (the commit before a change) the same
way in the same run, first, and prints both: ``{"baseline": ..., "pvisor": ...}``. A baseline
that the ``--as-limit`` safety net or its own failure stops is reported with its error.

``--cap`` is passed as ``--max-response-body`` (default: the gateway's own default).
``reassembly`` (issue 35, item 15) keeps ``--streams`` clients sending small streamed chat
requests back to back for ``--seconds``: then it counts the finished streams the writer has not
reassembled yet (``response_final`` NULL: its backlog), and times the stop (SIGTERM to exit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

PVISOR = shutil.which("pvisor", path=os.path.dirname(sys.executable)) or "pvisor"
EVENT = 64 * 1024  # bytes per SSE event
_HEAD = b'data: {"seq":%012d,"pad":"'
_TAIL = b'"}\n\n'
_PAD = b"x" * (EVENT - len(_HEAD % 0) - len(_TAIL))
MIB = 1024 * 1024
CHAT_EVENT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"some words "},"finish_reason":null}]}\n\n'
)


def event(n: int) -> bytes:
    """The upstream's event ``n`` (0-based): exactly :data:`EVENT` bytes."""
    return _HEAD % n + _PAD + _TAIL


def stream_prefix(size: int) -> bytes:
    """The first ``size`` bytes of the upstream's stream."""
    out = bytearray()
    n = 0
    while len(out) < size:
        out += event(n)
        n += 1
    return bytes(out[:size])


async def _upstream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(
            {"id": "chatcmpl-small", "object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "small"}, "finish_reason": "stop"}]}
        )  # fmt: skip
    total = body.get("bytes")  # None: for ever
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if "events" in body:  # a small chat stream the writer reassembles
        for i in range(body["events"]):
            await resp.write(CHAT_EVENT)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    n = sent = 0
    try:
        while total is None or sent < total:
            data = event(n)
            if total is not None and sent + len(data) > total:
                data = data[: total - sent]
            await resp.write(data)
            sent += len(data)
            n += 1
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        pass  # the client (through the gateway) went away: an endless stream ends so
    return resp


async def start_upstream() -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _upstream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


def vm_hwm_mib(pid: int) -> float | None:
    """Peak RSS (VmHWM) of ``pid`` in MiB; None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def writer_pid(pid: int) -> int | None:
    """The journal writer process of gateway ``pid`` (its one child)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


async def _read_stream(session: ClientSession, url: str, size: int | None, seconds: float | None) -> dict:
    """One streaming client: reads for ``seconds`` (an endless stream) or to the end, checking
    every byte against the upstream's stream. Returns what it got."""
    got = 0
    n = 0
    pending = b""  # bytes of the current event received so far
    wrong = None
    t0 = time.monotonic()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    if size is not None:
        body["bytes"] = size
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        status = resp.status
        async for chunk in resp.content.iter_any():
            got += len(chunk)
            pending += chunk
            while len(pending) >= EVENT:
                if wrong is None and pending[:EVENT] != event(n):
                    wrong = n
                pending = pending[EVENT:]
                n += 1
            if seconds is not None and time.monotonic() - t0 >= seconds:
                break
    if pending and wrong is None and pending != event(n)[: len(pending)]:
        wrong = n
    return {"status": status, "received": got, "first_wrong_event": wrong}


async def _small(session: ClientSession, url: str) -> dict:
    body = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "small"}]}
    async with session.post(url + "/run/r-second/v1/chat/completions", json=body) as resp:
        return {"status": resp.status, "body": await resp.read()}


def start_gateway(
    tmp: Path, upstream: str, cap: int | None, as_limit: int, pvisor: str = PVISOR
) -> tuple[subprocess.Popen, str]:
    ready = tmp / "ready.json"
    argv = [pvisor, "--journal", str(tmp / "journal.sqlite"), "gateway", "--port", "0",
            "--upstream", f"openai={upstream}", "--ready-file", str(ready), "--run", "r-big"]  # fmt: skip
    if cap is not None:
        argv += ["--max-response-body", str(cap)]
    prlimit = shutil.which("prlimit")
    if prlimit:
        argv = [prlimit, f"--as={as_limit}", *argv]  # a safety net only: it execs the gateway
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the gateway did not start: {proc.communicate()[1].decode()[-2000:]}")
        time.sleep(0.02)
    return proc, json.loads(ready.read_text())["url"]


async def _measure(
    tmp: Path,
    streams: int,
    size: int | None,
    seconds: float | None,
    cap: int | None,
    as_limit: int,
    pvisor: str = PVISOR,
) -> dict:
    runner, upstream = await start_upstream()
    proc, url = start_gateway(tmp, upstream, cap, as_limit, pvisor)
    writer = writer_pid(proc.pid)
    try:
        timeout = ClientTimeout(total=None, sock_read=60)
        async with ClientSession(connector=TCPConnector(limit=0), timeout=timeout) as session:
            t0 = time.monotonic()
            big = [asyncio.create_task(_read_stream(session, url, size, seconds)) for _ in range(streams)]
            await asyncio.sleep(min(0.5, (seconds or 1) / 4))
            small = await _small(session, url)  # another session, while the large ones run
            results = await asyncio.gather(*big)
            elapsed = time.monotonic() - t0
        # every exchange ends in the journal; then the peaks, while both processes live
        await asyncio.sleep(0.5)
        peaks = {"gateway_mib": vm_hwm_mib(proc.pid), "writer_mib": vm_hwm_mib(writer) if writer else None}
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 120)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await runner.cleanup()
    return {
        **peaks,
        "exit_code": code,
        "stderr": stderr[-2000:],
        "seconds": round(elapsed, 2),
        "streams": results,
        "small": small,
        "journal": str(tmp / "journal.sqlite"),
    }


async def _reassembly(tmp: Path, clients: int, seconds: float, as_limit: int) -> dict:
    import sqlite3

    runner, upstream = await start_upstream()
    proc, url = start_gateway(tmp, upstream, None, as_limit)
    answered = 0
    try:
        body = {"model": "m", "stream": True, "events": 20, "messages": [{"role": "user", "content": "go"}]}
        end = time.monotonic() + seconds

        async def client(session: ClientSession) -> None:
            nonlocal answered
            while time.monotonic() < end:
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                answered += 1

        samples: list[int] = []

        def backlog() -> tuple[int, int]:
            with sqlite3.connect(f"file:{tmp / 'journal.sqlite'}?mode=ro", uri=True) as db:
                return db.execute(
                    "SELECT coalesce(sum(response_final IS NULL), 0), count(*) FROM exchanges"
                    " WHERE streamed = 1 AND outcome = 'ok'"
                ).fetchone()

        async def sample() -> None:  # the streams not reassembled yet, every second of the load
            while time.monotonic() < end - 1:
                await asyncio.sleep(1.0)
                samples.append((await asyncio.to_thread(backlog))[0])

        async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=60)) as session:
            await asyncio.gather(sample(), *(client(session) for _ in range(clients)))
        await asyncio.sleep(0.5)  # the last exchanges committed
        left, streams = backlog()
        peaks = {"gateway_mib": vm_hwm_mib(proc.pid), "writer_mib": vm_hwm_mib(writer_pid(proc.pid) or 0)}
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 120)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await runner.cleanup()
    return {**peaks, "answered": answered, "streams_journaled": streams,
            "not_reassembled_during_load": {"max": max(samples, default=0),
                                            "last": samples[-1] if samples else 0},
            "not_reassembled_after": left, "stop_s": round(stop_s, 2), "exit_code": code}  # fmt: skip


def journaled(journal: str) -> list[dict]:
    """The exchanges of the journal: run, outcome, flags, sizes and the response body."""
    from pvisor.journal.reader import JournalReader

    with JournalReader(journal) as reader:
        return [
            {
                "run": e.run,
                "outcome": e.outcome,
                "flags": list(e.flags),
                "received": e.bytes_received,
                "delivered": e.bytes_delivered,
                "body": reader.response_body(e, raw=True) or b"",
            }  # fmt: skip
            for e in reader.exchanges()
        ]


def measure(
    streams: int = 1,
    size: int | None = None,
    seconds: float | None = None,
    cap: int | None = None,
    as_limit: int = 8 << 30,
    tmp: Path | None = None,
    pvisor: str = PVISOR,
) -> dict:
    """Run ``streams`` large responses (``size`` bytes each, None: endless, read for
    ``seconds``) through a gateway with ``--max-response-body cap`` (None: its default).
    Returns the peaks (MiB), the exit code, what each client got and the journal's path."""
    if tmp is not None:
        return asyncio.run(_measure(tmp, streams, size, seconds, cap, as_limit, pvisor))
    with tempfile.TemporaryDirectory(prefix="pvisor-memory-") as d:
        out = asyncio.run(_measure(Path(d), streams, size, seconds, cap, as_limit, pvisor))
        out["journaled"] = [
            {k: (len(v) if k == "body" else v) for k, v in e.items()} for e in journaled(out["journal"])
        ]
        return out


def main() -> None:
    from pvisor.commands.params import parse_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["finite", "endless", "concurrent", "reassembly"])
    ap.add_argument("--mib", type=int, default=None, help="bytes of each response, in MiB")
    ap.add_argument("--seconds", type=float, default=60.0, help="endless: how long the client reads")
    ap.add_argument(
        "--streams", type=int, default=None, help="concurrent (8), reassembly (32): how many at once"
    )
    ap.add_argument("--cap", default=None, help="--max-response-body (default: the gateway's)")
    ap.add_argument("--as-limit", default="8GiB", help="prlimit --as of the gateway (a safety net)")
    ap.add_argument("--json", default=None, help="also write the result here")
    ap.add_argument(
        "--baseline", default=None, help="another install's pvisor, measured first in the same run"
    )
    a = ap.parse_args()
    cap = parse_size(a.cap) if a.cap else None
    limit = parse_size(a.as_limit)
    if a.what == "reassembly":
        with tempfile.TemporaryDirectory(prefix="pvisor-memory-") as d:
            seconds = a.seconds if "--seconds" in sys.argv else 40.0
            out = asyncio.run(_reassembly(Path(d), a.streams or 32, seconds, limit))
        print(json.dumps(out, indent=2))
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
        return
    if a.what == "finite":
        shape = (1, (a.mib or 200) * MIB, None)
    elif a.what == "endless":
        shape = (1, None, a.seconds)
    else:
        shape = (a.streams or 8, (a.mib or 300) * MIB, None)

    def one(pvisor: str) -> dict:
        out = measure(*shape, cap, limit, pvisor=pvisor)
        for s in out["streams"]:
            s["received_mib"] = round(s["received"] / MIB, 1)
        return {k: v for k, v in out.items() if k != "journal"}

    if a.baseline:
        try:
            before = one(a.baseline)
        except Exception as exc:  # the old gateway killed by the safety net, or failing its way
            before = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        result = {"baseline": before, "pvisor": one(PVISOR)}
    else:
        result = one(PVISOR)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if a.json:
        Path(a.json).write_text(text)


if __name__ == "__main__":
    main()
