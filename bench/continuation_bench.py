"""What a continuation adds to each request it forwards to the live model (docs/benchmarks.md,
"Continuation: time per live request").

The synthetic Chat Completions run of ``bench/playback_bench.py`` (``--steps`` steps, each
request repeating the whole conversation) is recorded into a fresh journal. An upstream on this
machine answers each request with the run's next recorded reply, reading nothing. Three gateways
forward requests 1..S to it, sent in order by a blocking client:

- **forward**: the capture gateway (its default responder forwards everything): the baseline;
- **continuation**: :class:`pvisor.replay.continuation.ContinuationResponder` at N = 0, so that
  every request is a live one: matched against the recording (the served steps: none), then
  forwarded byte for byte;
- **continuation+prompt**: the same with a boundary user prompt, which every request carries
  once rewritten (the body parsed, the prompt inserted, the body written again).

Interleaved for ``--rounds`` rounds; reported per gateway the median and 90th percentile of the
time from sending a request to reading its last byte, and the median over steps of the time
each continuation adds to the forward.

    python bench/continuation_bench.py [--steps 100] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import orjson
from aiohttp import web
from playback_bench import Loop, build, one_pass
from pvisor.adapters.agents import get_descriptor
from pvisor.gateway.proxy import Gateway, GatewayConfig, finalize_response
from pvisor.journal.writer import Journal
from pvisor.replay.continuation import ContinuationResponder, LivePolicy
from pvisor.replay.playback import PathRewrites
from pvisor.replay.recording import journal_recording

PROMPT = "Now check the result once more."


class Upstream:
    """Answers request i with ``replies[i]`` (by arrival order), reading nothing."""

    def __init__(self, replies: list[bytes]):
        self.replies = replies
        self.n = 0
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = self.replies[self.n % len(self.replies)]
        self.n += 1
        return web.Response(body=body, headers={"Content-Type": "text/event-stream"})

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-continuation-bench-"))
    journal = tmp / "j.sqlite"
    run, bodies, _, replies = build(journal, args.steps)
    n = len(bodies)
    lt = Loop()
    up = Upstream(replies)
    upstream_url = lt.run(up.start())
    names = ("forward", "continuation", "continuation+prompt")
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            up.n = 0
            responder = None
            if name != "forward":
                rec = journal_recording(journal, run, "opencode", 0, None)
                policy = LivePolicy(boundary_prompt=PROMPT if name.endswith("prompt") else None)
                responder = ContinuationResponder(
                    rec, 0, get_descriptor("opencode"), PathRewrites([]), policy
                )
            with Journal.open(tmp / f"gw-{name}-{r}.sqlite", finalize=finalize_response) as j:
                cfg = GatewayConfig(port=0, upstreams={"openai": upstream_url})
                gw = Gateway(cfg, j, responder)
                url = lt.run(gw.start())
                times[name].append(one_pass(url, bodies))
                lt.run(gw.stop())
            if responder is not None:
                assert responder.divergence is None and len(responder.live) == n, responder.divergence
                assert all(lr.byte_identical for lr in responder.live) == (name == "continuation")
    lt.run(up.stop())
    med = {
        name: [statistics.median(rnd[i] for rnd in runs) * 1000 for i in range(n)]
        for name, runs in times.items()
    }
    figures: dict = {"steps": args.steps, "rounds": args.rounds, "last_request_bytes": len(bodies[-1])}
    for name in names:
        figures[f"{name}_ms"] = {
            "median": statistics.median(med[name]),
            "p90": sorted(med[name])[int(0.9 * n)],
        }
    for name in names[1:]:
        added = [c - f for c, f in zip(med[name], med["forward"])]
        figures[f"{name}_added_ms"] = {
            "median": statistics.median(added),
            "last_decile_steps": statistics.median(added[-max(1, n // 10) :]),
        }
    print(
        f"{n} live requests x {args.rounds} rounds, "
        f"last request {figures['last_request_bytes'] / 1024:.0f} KiB"
    )
    for name in names:
        f = figures[f"{name}_ms"]
        print(f"  {name:20s} per request: median {f['median']:.2f} ms, p90 {f['p90']:.2f} ms")
    for name in names[1:]:
        a = figures[f"{name}_added_ms"]
        print(
            f"  added by {name}: median {a['median']:.2f} ms "
            f"(last tenth of the steps {a['last_decile_steps']:.2f} ms)"
        )
    if args.json:
        args.json.write_text(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
