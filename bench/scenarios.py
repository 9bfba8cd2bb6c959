"""Coding-agent scenarios of the gateway benchmark (``bench/gateway --suite agents``;
docs/benchmarks.md "Gateway: coding-agent scenarios").

Each scenario is what an agent's traffic looks like, sent by ``concurrency`` independent
sessions (a closed loop each) against one URL, timed by this aiohttp client per request:

- ``stream``: a 200-event Chat Completions stream per request: time to first byte, gaps
  between chunks (their p99: a gateway that holds chunks shows there), and the whole response;
- ``body400k``: a 100k-token request (about 400 KB of conversation) with a small reply: what
  reading, forwarding and journaling a large body costs;
- ``toolloop``: a tool-call loop of 50 requests per session, each repeating the conversation
  so far and adding an assistant tool call and a 6 KB tool result (the journal's delta storage
  under load: request i is request i-1 plus a little).

Run as a program it measures one scenario against one URL and prints one JSON object:
``{"requests", "sent", "errors", "wall_s", "ttfb_ms": [...], "total_ms": [...], "gaps_ms": [...]}``
(``requests``: those timed, inside the measured window; ``sent``: every one answered, warm-up
included; ``gaps_ms`` only for ``stream``).

    python bench/scenarios.py --url URL --scenario stream|body400k|toolloop --concurrency C [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

SCENARIOS = ("stream", "body400k", "toolloop")
SCENARIO_NAMES = {
    "stream": "200-event stream",
    "body400k": "400 KB request",
    "toolloop": "50-request tool loop",
}
LOOP_STEPS = 50
TOOL_RESULT = ("src/app.py:12: def handler(event):  # the tool's output line\n" * 100)[:6000]
SYSTEM = "You are a coding agent. " * 200  # 4.8 KB, as agents' system prompts are long


def _chat(messages: list, stream: bool) -> bytes:
    return json.dumps(
        {"model": "bench-model", "messages": messages, "stream": stream, "tools": [_TOOL]},
        separators=(",", ":"),
    ).encode()


_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def stream_body() -> bytes:
    return _chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}], True)


def large_body(size: int = 400_000) -> bytes:
    """A conversation of about ``size`` bytes: the system prompt, then user and tool turns."""
    messages: list = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Fix the failing test."},
    ]
    i = 0
    while sum(len(json.dumps(m)) for m in messages) < size:
        messages += _step(i)
        i += 1
    return _chat(messages, False)


def _step(i: int) -> list:
    call = {
        "id": f"call_{i:04d}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": f"pytest -k t{i}"})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": f"step {i}\n" + TOOL_RESULT},
    ]


_STEP_BYTES: list[bytes] = []


def loop_bodies(session: int, steps: int = LOOP_STEPS) -> list[bytes]:
    """The ``steps`` requests of one session's tool loop: request k holds steps 1..k-1. Made by
    joining pre-encoded JSON (the client must not be what limits the run); each session's user
    message differs, so no two sessions' bodies are equal."""
    if not _STEP_BYTES:
        _STEP_BYTES.extend(
            b",".join(json.dumps(m, separators=(",", ":")).encode() for m in _step(i)) for i in range(steps)
        )
    head = (
        b'{"model":"bench-model","stream":false,"tools":['
        + json.dumps(_TOOL, separators=(",", ":")).encode()
        + b'],"messages":['
        + json.dumps({"role": "system", "content": SYSTEM}, separators=(",", ":")).encode()
        + b","
        + json.dumps(
            {"role": "user", "content": f"Session {session}: fix the test."}, separators=(",", ":")
        ).encode()
    )
    return [head + b"".join(b"," + step for step in _STEP_BYTES[:k]) + b"]}" for k in range(steps)]


async def run(url: str, scenario: str, concurrency: int, seconds: float, warmup: float = 0.5) -> dict:
    """Measure ``scenario`` against ``url`` (a base URL: ``/v1/chat/completions`` is added) with
    ``concurrency`` sessions for ``seconds`` after ``warmup`` seconds. A ``toolloop`` session
    sends its 50 requests in order, then starts another loop."""
    import aiohttp

    target = url.rstrip("/") + "/v1/chat/completions"
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench-not-a-secret"}
    ttfb: list[float] = []
    total: list[float] = []
    gaps: list[float] = []
    errors = 0
    requests = 0
    sent = 0  # every request answered, warm-up and edges included (what the journal must hold)
    fixed = {"stream": stream_body(), "body400k": large_body()}
    t_start = time.perf_counter()
    measure_from = t_start + warmup
    stop_at = measure_from + seconds

    async def one(s: aiohttp.ClientSession, body: bytes) -> None:
        nonlocal errors, requests, sent
        t0 = time.perf_counter()
        first = None
        last = None
        my_gaps = []
        try:
            async with s.post(target, data=body, headers=headers) as r:
                async for _ in r.content.iter_any():
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    elif last is not None:
                        my_gaps.append((now - last) * 1000)
                    last = now
                if r.status != 200:
                    errors += 1
        except aiohttp.ClientError:
            errors += 1
            return
        sent += 1
        end = time.perf_counter()
        if t0 >= measure_from and end <= stop_at:
            requests += 1
            ttfb.append(((first or end) - t0) * 1000)
            total.append((end - t0) * 1000)
            gaps.extend(my_gaps)

    async def session(s: aiohttp.ClientSession, n: int) -> None:
        loop_round = 0
        while time.perf_counter() < stop_at:
            if scenario == "toolloop":
                for body in loop_bodies(n * 1000 + loop_round):
                    if time.perf_counter() >= stop_at:
                        break
                    await one(s, body)
                loop_round += 1
            else:
                await one(s, fixed[scenario])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) as s:
        await asyncio.gather(*(session(s, n) for n in range(concurrency)))
    out = {
        "requests": requests,
        "sent": sent,
        "errors": errors,
        "wall_s": seconds,
        "ttfb_ms": ttfb,
        "total_ms": total,
    }
    if scenario == "stream":
        out["gaps_ms"] = gaps
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--scenario", choices=SCENARIOS, required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a.url, a.scenario, a.concurrency, a.seconds, a.warmup))))
