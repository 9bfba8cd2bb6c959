"""Rollouts per minute on this machine (docs/benchmarks.md, "Rollouts: continue_many here and on
Ray").

**The run.** mini-swe-agent (the agent that starts fastest; ``--agent``) captured once with
``pvisor run --script`` against the scripted model: one shell call per step for ``--steps``
steps, then its submit command.

**The rollouts.** ``--k`` continuations of it after step 1 (each: a new workspace with the
run's start snapshot restored, steps 1..N played back, request N+1 and the rest live) against a
scripted model on this machine (``"main_chain": "any-tools"``: one server answers every
rollout): one live step, then the end. Three batches, in this order: **alone** (k = 1, below),
then

- **local**: :func:`pvisor.session.continue_many` with ``concurrency`` = the machine's CPUs
  (each rollout a spawned process of its own);
- **ray local**: the same call with ``ray="local"``: a Ray started for the call with the
  machine's CPUs, each rollout a Ray task (the source run sent through the object store, the
  derived run merged back into the journal); Ray's start and stop are in the time.

Reported per batch: its wall time, rollouts per minute (k / wall), and the medians over its
rollouts of ``timings_ms.total`` (result.json: the rollout in its process, checks to result),
of the agent's attempt (the journal's: from its exec to its exit) and of the difference, pvisor's
cost per rollout beyond the agent's own life (its checks, the snapshot restore, the agent's
version check, gateway and sandbox start, the result). For scale, **the agent alone**:
``--repeat`` sequential ``pvisor run --script`` sessions of one request (the end at once), the
attempt's median (the agent's bare start-up and exit, nothing replayed); **one rollout alone**:
``continue_many`` with k = 1 (no other rollout competing for the CPUs); and Ray's own start and
stop (``ray.init(address="local")`` and ``ray.shutdown()`` here, median of ``--repeat``).

    python bench/rollouts_bench.py [--agents-dir DIR] [--agent mini-swe-agent] [--k 8]
        [--steps 3] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from agent_installs import ENTRYPOINTS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PVISOR = str(Path(sys.executable).with_name("pvisor"))
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's end (it loops on text)
TASK = "Count to the end, one step at a time."


def script(agent: str, steps: int) -> dict[str, Any]:
    """The captured run's turns: ``steps`` shell calls, then the end."""
    turns: list[dict[str, Any]] = [
        {"text": f"Step {i}.", "tool_calls": [{"tool": "@shell", "command": f"echo {i} >> log.txt"}]}
        for i in range(1, steps + 1)
    ]
    return {"model": "mock-model", "seed": 1, "turns": [*turns, end(agent)]}


def end(agent: str) -> dict[str, Any]:
    turn: dict[str, Any] = {"text": "Done."}
    if agent == "mini-swe-agent":
        turn["tool_calls"] = [{"tool": "@shell", "command": SUBMIT}]
    return turn


def live_script(agent: str) -> dict[str, Any]:
    """The live model's turns: turn 0 is never asked for (request 1 is played back), then one
    live step and the end; ``any-tools``: each rollout's requests are told apart by their
    history, not by the server's count."""
    live = {"text": "A live step.", "tool_calls": [{"tool": "@shell", "command": "echo live > live.txt"}]}
    return {"model": "live-model", "seed": 2, "main_chain": "any-tools",
            "turns": [{"text": "never served"}, live, end(agent)]}  # fmt: skip


class LiveModel:
    """The scripted model served from a thread of its own: ``url``; :meth:`stop`."""

    def __init__(self, data: dict[str, Any]) -> None:
        from pvisor.gateway.scripted_model import ScriptedModel, parse_script
        from pvisor.gateway.scripted_server import ScriptedModelServer

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = ScriptedModelServer(ScriptedModel(parse_script(data, "live script")))
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def environment(home: Path) -> dict[str, str]:
    """The agents' environment: a home of their own, and the keys a live upstream asks for
    (the scripted model reads none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "PVISOR_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".data"),
               XDG_CACHE_HOME=str(home / ".cache"), OPENAI_API_KEY="sk-bench-not-a-key",
               ANTHROPIC_API_KEY="sk-ant-bench-not-a-key", PYTHONSAFEPATH="1")  # fmt: skip
    return env


def capture(root: Path, agent: str, entrypoint: Path, steps: int) -> tuple[Path, str]:
    """``pvisor run --script`` of ``agent``: (journal, run id)."""
    journal = root / "data" / "j.sqlite"
    for d in ("data", "ws"):
        (root / d).mkdir()
    (root / "script.json").write_text(json.dumps(script(agent, steps)))
    args = [PVISOR, "--journal", str(journal), "run", "--agent", agent, "--agent-entrypoint", str(entrypoint),
            "--script", str(root / "script.json"), "--workspace", str(root / "ws"), "--timeout", "600",
            "--json", "--", TASK]  # fmt: skip
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=900, cwd=root, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise SystemExit(f"capture failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return journal, json.loads(proc.stdout)["run"]


def attempt_ms(journal: Path, run: str) -> float:
    """The run's first attempt in ms: from the agent's exec to its exit (the journal's)."""
    from pvisor.journal.reader import JournalReader

    with JournalReader(journal) as r:
        a = r.attempts(run)[0]
    return float(a.ended_ms - a.started_ms)


def bare_agent(root: Path, agent: str, entrypoint: Path, repeat: int) -> dict[str, Any]:
    """``repeat`` sessions of one request (the end at once) with ``pvisor run --script``: the
    median attempt (the agent's start-up and exit) and ``pvisor run``'s wall time."""
    attempts, walls = [], []
    for i in range(repeat):
        sub = root / f"bare-{i}"
        sub.mkdir()
        t = time.perf_counter()
        journal, run = capture(sub, agent, entrypoint, 0)
        walls.append((time.perf_counter() - t) * 1000)
        attempts.append(attempt_ms(journal, run))
    return {"attempt_ms_median": statistics.median(attempts), "wall_ms_median": statistics.median(walls)}


def ray_start_stop(repeat: int) -> float:
    """The median ms of ``ray.init(address="local")`` then ``ray.shutdown()``."""
    import ray

    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        ray.shutdown()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def batch(
    how: str, root: Path, journal: Path, run: str, url: str, entrypoint: Path, k: int
) -> dict[str, Any]:
    """One batch of ``k`` continuations (``how``: ``alone``, ``local`` or ``ray local``)."""
    from pvisor.session import continue_many

    tag = how.replace(" ", "-")
    out = root / f"out-{tag}"
    extra: dict[str, Any] = {"ray": "local"} if how == "ray local" else {"concurrency": os.cpu_count() or 1}

    def workspace(i: int) -> Path:
        ws = root / f"ws-{tag}-{i}"
        ws.mkdir()
        return ws

    t = time.perf_counter()
    results = continue_many(run, 1, k, workspace, url, journal=journal, output_root=out,
                            entrypoint=str(entrypoint), max_steps=1, timeout=600, **extra)  # fmt: skip
    wall = time.perf_counter() - t
    bad = [r.error for r in results if not r.ok]
    if bad:
        raise SystemExit(f"{how}: {len(bad)} of {k} rollouts failed: {bad[0]}")
    totals = [r.document["timings_ms"]["total"] for r in results]
    attempts = [attempt_ms(journal, r.derived_run) for r in results]
    return {
        "how": how,
        "k": k,
        "wall_s": wall,
        "rollouts_per_minute": k / wall * 60,
        "total_ms_median": statistics.median(totals),
        "agent_ms_median": statistics.median(attempts),
        "pvisor_ms_median": statistics.median(t - a for t, a in zip(totals, attempts)),
        "timings_ms": [r.document["timings_ms"] for r in results],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_agents = Path(os.environ.get("PVISOR_AGENTS_DIR", REPO / ".agents"))
    ap.add_argument("--agents-dir", type=Path, default=default_agents)
    ap.add_argument("--agent", default="mini-swe-agent")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    entrypoint = args.agents_dir / ENTRYPOINTS[args.agent]
    if not os.access(entrypoint, os.X_OK):
        raise SystemExit(f"{args.agent} is not installed at {entrypoint}: run scripts/install-agents")
    out_json = args.json.resolve() if args.json is not None else None
    root = Path(tempfile.mkdtemp(prefix="pvisor-rollouts-bench-"))
    (root / "home").mkdir()
    os.environ.clear()
    os.environ.update(environment(root / "home"))  # the rollouts' processes (and Ray's workers) inherit it
    os.chdir(root)  # Ray puts the driver's directory first on its workers' path: not a checkout
    journal, run = capture(root, args.agent, entrypoint, args.steps)
    bare = bare_agent(root, args.agent, entrypoint, args.repeat)
    live = LiveModel(live_script(args.agent))
    try:
        got = [batch("alone", root, journal, run, live.url, entrypoint, 1)]
        got += [
            batch(how, root, journal, run, live.url, entrypoint, args.k) for how in ("local", "ray local")
        ]
    finally:
        live.stop()
    ray_ms = ray_start_stop(args.repeat)
    fig = {
        "agent": args.agent,
        "steps": args.steps,
        "k": args.k,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "bare_agent": bare,
        "ray_start_stop_ms": ray_ms,
        "batches": got,
    }
    print(
        f"{args.agent}, {args.k} continuations after step 1 of {args.steps}; the agent alone (one request): "
        f"{bare['attempt_ms_median'] / 1000:.2f} s; Ray's start and stop: {ray_ms / 1000:.2f} s"
    )
    print(
        "| batch | wall | rollouts/min | per rollout: total | the agent (exec to exit) | pvisor beyond it |"
    )
    print("|---|---|---|---|---|---|")
    for b in got:
        print(
            f"| {b['how']} ({b['k']}) | {b['wall_s']:.1f} s | {b['rollouts_per_minute']:.1f} "
            f"| {b['total_ms_median'] / 1000:.2f} s | {b['agent_ms_median'] / 1000:.2f} s "
            f"| {b['pvisor_ms_median'] / 1000:.2f} s |"
        )
    if out_json is not None:
        out_json.write_text(json.dumps(fig, indent=2) + "\n")


if __name__ == "__main__":
    main()
