"""What playback adds per served step (docs/benchmarks.md, "Playback: time per served step").

One synthetic Chat Completions run of ``--steps`` steps (a 2,000-character system prompt, one
tool with a 20,000-character description, per step one streamed tool call and a 1,000-character
result: each request repeats the whole conversation, as agents do) is recorded into a fresh
journal. Then two gateways answer the same requests, 1..S in order, sent by a blocking client
on this machine:

- **baseline**: the scripted model as the gateway's responder, its script made of the same
  actions, so that it serves the same bytes (same text, same calls) after parsing each request
  to count its turns;
- **playback**: :class:`pvisor.replay.playback.PlaybackResponder` at N = S - 1, serving the
  recorded response bytes after matching each request against the recording;
- **floor**: a responder that serves the recorded bytes by arrival order and reads nothing: what
  the gateway itself (relay, recorder, journal) costs, for reference.

All run in this process on the same kind of gateway (journal included), interleaved for
``--rounds`` rounds (baseline, playback, floor, baseline, ...). Reported per gateway: the median and
the 90th percentile of the time from sending a request to reading the last byte of its answer,
and per step index the difference of the medians; the figure of merit is the median over steps
of the added time. The aim is under 2 ms per served step.

    python bench/playback_bench.py [--steps 100] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import statistics
import tempfile
import threading
import time
from pathlib import Path

import orjson

from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.protocols import get_protocol
from pvisor.gateway.proxy import Gateway, GatewayConfig, finalize_response
from pvisor.gateway.responder import Serve, ServedBy
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_responder import ScriptedResponder
from pvisor.journal.model import Run
from pvisor.journal.writer import Journal
from pvisor.replay.playback import PathRewrites, PlaybackResponder
from pvisor.replay.recording import journal_recording

TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "d" * 20000,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
CHAT = get_protocol("openai-chat")


def build(path: Path, steps: int) -> tuple[str, list[bytes], list[dict], list[bytes]]:
    """Record the run; returns (run id, request bodies 1..S, scripted turns, reply bytes)."""
    run = f"bench{steps}"
    messages: list[dict] = [
        {"role": "system", "content": "S" * 2000},
        {"role": "user", "content": "the task"},
    ]
    bodies, turns, replies = [], [], []
    with Journal.open(path, finalize=finalize_response) as j:
        j.create_run(Run(id=run, agent="opencode", labels={"task": "the task"}))
        for i in range(steps):
            body = orjson.dumps({"model": "m", "messages": messages, "tools": [TOOL], "stream": True})
            command = f"echo {i}"
            final = {
                "id": f"chatcmpl-{i}",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": f"step {i}",
                            "tool_calls": [
                                {
                                    "id": f"call_{i}",
                                    "type": "function",
                                    "function": {
                                        "name": "bash",
                                        "arguments": orjson.dumps({"command": command}).decode(),
                                    },
                                }
                            ],
                        },
                    }
                ],
            }
            j.record_exchange(
                run,
                "POST",
                "/v1/chat/completions",
                [("content-type", "application/json")],
                protocol="openai-chat",
                status=200,
                request_body=body,
                response_body=CHAT.render_stream(final),
                streamed=True,
                response_headers=[("content-type", "text/event-stream")],
            )
            bodies.append(body)
            replies.append(CHAT.render_stream(final))
            turns.append({"text": f"step {i}", "tool_calls": [{"tool": "bash", "command": command}]})
            messages = messages + [
                final["choices"][0]["message"],
                {"role": "tool", "tool_call_id": f"call_{i}", "content": "o" * 1000},
            ]
    return run, bodies, turns, replies


class InOrder:
    """Serves ``replies`` one per request in arrival order, reading nothing (the floor)."""

    def __init__(self, replies: list[bytes]):
        self.replies = replies
        self.n = 0

    async def respond(self, request):
        body = self.replies[self.n]
        self.n += 1
        return Serve(
            200,
            [("Content-Type", "text/event-stream")],
            body=body,
            streamed=True,
            served_by=ServedBy.PLAYBACK,
        )


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)


def one_pass(url: str, bodies: list[bytes]) -> list[float]:
    """Seconds per request, sending 1..S in order on one keep-alive connection."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    out = []
    for body in bodies:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        out.append(time.perf_counter() - t0)
        assert resp.status == 200 and data, (resp.status, data[:200])
    conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-playback-bench-"))
    journal = tmp / "j.sqlite"
    run, bodies, turns, replies = build(journal, args.steps)
    n = args.steps - 1  # requests 1..N get A_k; request S = N+1 is the boundary
    lt = Loop()
    names = ("baseline", "playback", "floor")
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            if name == "floor":
                responder = InOrder(replies)
            elif name == "baseline":
                model = ScriptedModel(parse_script({"model": "m", "turns": turns}))
                responder = ScriptedResponder(model)
            else:
                rec = journal_recording(journal, run, "opencode", n, None)
                responder = PlaybackResponder(rec, n, get_descriptor("opencode"), PathRewrites([]))
            with Journal.open(tmp / f"gw-{name}-{r}.sqlite", finalize=finalize_response) as j:
                gw = Gateway(GatewayConfig(port=0, offline=True), j, responder)
                url = lt.run(gw.start())
                times[name].append(one_pass(url, bodies[:n]))
                lt.run(gw.stop())
            if name == "playback":
                assert not responder.divergence and len(responder.served) == n, responder.divergence
    med = {
        name: [statistics.median(rnd[i] for rnd in runs) * 1000 for i in range(n)]
        for name, runs in times.items()
    }
    added = [p - b for p, b in zip(med["playback"], med["baseline"])]
    figures = {
        "steps": args.steps,
        "rounds": args.rounds,
        "requests_per_round": n,
        "baseline_ms": {
            "median": statistics.median(med["baseline"]),
            "p90": sorted(med["baseline"])[int(0.9 * n)],
        },
        "playback_ms": {
            "median": statistics.median(med["playback"]),
            "p90": sorted(med["playback"])[int(0.9 * n)],
        },
        "floor_ms": {"median": statistics.median(med["floor"]), "p90": sorted(med["floor"])[int(0.9 * n)]},
        "playback_over_floor_ms": statistics.median([p - f for p, f in zip(med["playback"], med["floor"])]),
        "added_ms_per_step": {
            "median": statistics.median(added),
            "first_decile_steps": statistics.median(added[: max(1, n // 10)]),
            "last_decile_steps": statistics.median(added[-max(1, n // 10) :]),
        },
        "last_request_bytes": len(bodies[n - 1]),
    }
    print(
        f"{n} served steps x {args.rounds} rounds, "
        f"last request {figures['last_request_bytes'] / 1024:.0f} KiB"
    )
    for name in names:
        f = figures[f"{name}_ms"]
        print(f"  {name:9s} per request: median {f['median']:.2f} ms, p90 {f['p90']:.2f} ms")
    print(f"  playback over the floor: median {figures['playback_over_floor_ms']:.2f} ms per request")
    a = figures["added_ms_per_step"]
    print(
        f"  added by playback per served step: median {a['median']:.2f} ms "
        f"(first tenth of the steps {a['first_decile_steps']:.2f} ms, "
        f"last tenth {a['last_decile_steps']:.2f} ms)"
    )
    if args.json:
        args.json.write_text(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
