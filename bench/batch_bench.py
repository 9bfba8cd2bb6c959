"""Batch preparation benchmark (issue 21; docs/benchmarks.md "Batch preparation").

    python bench/batch_bench.py                    # the experiment, the Ray run and the 10,000-step curve
    python bench/batch_bench.py --no-ray --steps 10,100,1000
    python bench/batch_bench.py --singles 60       # more single-prepare processes for the baseline
    python bench/batch_bench.py --only-runs        # the journal run beside the native file alone

1. The published experiment's trajectories (bench/fidelity/generate.py: 20 per adapter for the
   seven adapters, seed 420), each three times, in a shuffled order: 420 lines, ``--after-step
   1``. In one run: the baseline, one ``pvisor replay --prepare-only`` process per prefix (the
   median of ``--singles`` of them, each launched and waited for); the whole batch command with
   ``--rows FILE.jsonl`` and with ``--output DIR``, wall time from launch to exit divided by
   the lines (best of ``--repeat``); the same lines on Ray (``--ray local``: a Ray started by
   the command on this machine's CPUs); ``prepare_many`` in this process.
2. The curve: Codex rollouts of 10 to 10,000 steps (bench/native_bench.py's step: an action,
   a tool call, a 1.8 KB output), read once (timed apart), then ten boundaries each (N =
   steps/10, 2 steps/10, ..., steps) prepared in one process; per boundary the prefix's size and
   the time ``result.json`` reports (``timings_ms.total``), and the time per MB of prefix.
3. One run twice (issue 41): a 200-step mini-swe-agent run (:func:`chat_run`: per step an
   action with one bash call and a 1.8 KB output, a last answer without a call) written as a
   journal run through pvisor's own journal writer (each request the whole conversation so
   far, as the agent sends it) and as its native file. For each, 50 boundaries (N = 4, 8, ...,
   200) in one process: the first prefix (the source read, and for the journal run
   classified), then each further prefix with the batch's cache (what every prefix beyond the
   first costs, wall and CPU time, and of it the source's part, ``timings_ms.prefix``), the
   same with each outcome's row written to a JSON Lines file as ``--rows FILE.jsonl`` writes
   it, and with its three files written as ``--output DIR`` writes them (what the files add:
   bytes to the page cache, no fsync), each the best of ``--passes`` passes; against the same
   boundaries each prepared with a cache of its own (what a batch paid per journal line before
   issue 41: the run read and classified for every line).

Every figure is wall time on this machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "fidelity"))
sys.path.insert(0, str(HERE))

import generate  # noqa: E402
import native_bench  # noqa: E402

SEVEN = ("claude-code", "codex", "gemini-cli", "qwen-code", "opencode", "mini-swe-agent", "openhands")


def pvisor() -> list[str]:
    exe = Path(sys.executable).with_name("pvisor")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pvisor"]


def run(cmd: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"batch_bench: {' '.join(cmd[:6])} ... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return took


def experiment(work: Path, args) -> list[str]:
    man = generate.generate(work / "traj", SEVEN, 20, 420)
    lines = [{"trajectory": it["file"], "agent": it["agent"], "after_step": 1} for it in man["items"]] * 3
    random.Random(420).shuffle(lines)
    manifest = work / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    n = len(lines)
    singles = []
    for i, line in enumerate(lines[: args.singles]):
        cmd = [*pvisor(), "replay", "--agent", line["agent"], "--trajectory", line["trajectory"],
               "--after-step", "1", "--prepare-only", "--output", str(work / f"single-{i}")]  # fmt: skip
        singles.append(run(cmd, work))
    figures = {"one process per prefix (baseline)": statistics.median(singles) * 1000}

    def best(extra: list[str], clean: Path) -> float:
        times = []
        for _ in range(args.repeat):
            if clean.exists():
                shutil.rmtree(clean) if clean.is_dir() else clean.unlink()
            times.append(run([*pvisor(), "replay", "--prepare-only", "--batch", str(manifest), *extra], work))
        return min(times) * 1000 / n

    figures["batch, --rows FILE.jsonl (whole command)"] = best(
        ["--rows", str(work / "rows.jsonl")], work / "rows.jsonl"
    )
    figures["batch, --output DIR (whole command)"] = best(["--output", str(work / "out")], work / "out")
    if not args.no_ray:
        figures["batch on Ray, --ray local (whole command)"] = best(
            ["--rows", str(work / "ray.jsonl"), "--ray", "local"], work / "ray.jsonl"
        )
    from pvisor.replay.batch import prepare_many

    t = time.perf_counter()
    outs = list(prepare_many(lines))
    figures["prepare_many in one process (no files)"] = (time.perf_counter() - t) * 1000 / n
    assert all(o.status.value == "ok" for o in outs)
    base = figures["one process per prefix (baseline)"]
    out = [
        f"{n} prefixes ({len(man['items'])} trajectories x 3, shuffled), {os.cpu_count()} CPUs, Python "
        f"{sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}:",
        "",
        "| how | ms per prefix | against one process each |",
        "|---|---|---|",
    ]
    out += [f"| {k} | {v:.2f} | {base / v:.1f}x |" for k, v in figures.items()]
    return out


def curve(work: Path, steps: list[int]) -> list[str]:
    from pvisor.replay.batch import SourceReads, prepare_many
    from pvisor.replay.prepare import PrepareOptions

    out = ["", "| steps | N | prefix | ms | ms per MB |", "|---|---|---|---|---|"]
    for s in steps:
        path = work / f"codex-{s}.jsonl"
        with open(path, "w") as fh:
            for r in native_bench._codex_head():
                fh.write(json.dumps(r) + "\n")
            for i in range(s):
                for r in native_bench._codex(i):
                    fh.write(json.dumps(r) + "\n")
        bounds = sorted({max(1, s * k // 10) for k in range(1, 11)})
        reads = SourceReads()
        t = time.perf_counter()
        options = [PrepareOptions("codex", 1, None, trajectory=path)]  # type: ignore[arg-type]
        [first] = prepare_many(options, reads=reads)
        read_ms = (time.perf_counter() - t) * 1000
        assert first.status.value == "ok", first.error
        reqs = [PrepareOptions("codex", n, None, trajectory=path) for n in bounds]  # type: ignore[arg-type]
        per_mb = []
        for n, o in zip(bounds, prepare_many(reqs, reads=reads)):
            assert o.status.value == "ok", o.error
            size = len(o.prefix.body)
            ms = o.result["timings_ms"]["total"]
            per_mb.append(ms / (size / 1e6))
            if n in (bounds[0], bounds[len(bounds) // 2], bounds[-1]):
                out.append(f"| {s:,} | {n:,} | {size / 1e6:.2f} MB | {ms:.1f} | {ms / (size / 1e6):.1f} |")
        out.append(
            f"| {s:,} | (reading and parsing the file, once) | {path.stat().st_size / 1e6:.1f} MB file | "
            f"{read_ms:.0f} | ms/MB over the 10 boundaries: {min(per_mb):.0f} to {max(per_mb):.0f} |"
        )
    return out


BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def chat_run(
    journal: Path, native: Path, steps: int, run: str = "chat", agent: str | None = "mini-swe-agent"
) -> str:
    """One mini-swe-agent run of ``steps`` steps (steps - 1 actions with one bash call and a
    1.8 KB output each, then an answer without a call), written as run ``run`` of ``journal``
    (pvisor's journal writer: one Chat Completions exchange per step, each request the whole
    conversation so far) and as its native file ``native`` (mini-swe-agent's trajectory
    format). ``agent``: what the run records (None: a run of no recorded agent, as a gateway
    capture). Returns ``run``. tests/test_batch_journal_runs.py builds its runs with it."""
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    messages: list[dict] = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "fix the tests"},
    ]
    with Journal.open(journal) as j:
        j.create_run(Run(id=run, agent=agent, agent_version="2.4.6" if agent else None))
        for n in range(steps):
            action: dict = {"role": "assistant", "content": native_bench.TEXT}
            if n < steps - 1:
                command = json.dumps({"command": f"pytest t{n}.py"})
                action["tool_calls"] = [
                    {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": command}}
                ]
            reply = {
                "id": f"r{n}",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": action,
                        "finish_reason": "tool_calls" if n < steps - 1 else "stop",
                    }
                ],
            }
            body = {"model": "m", "messages": messages, "tools": [BASH_TOOL]}
            j.record_exchange(
                run,
                "POST",
                "/v1/chat/completions",
                [("content-type", "application/json")],
                protocol="openai-chat",
                status=200,
                request_body=json.dumps(body).encode(),
                response_body=json.dumps(reply).encode(),
                response_headers=[("content-type", "application/json")],
            )
            messages = [*messages, action]
            if n < steps - 1:
                messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": native_bench.RESULT})
    doc = {"info": {"mini_version": "2.4.6"}, "messages": messages, "trajectory_format": "mini-swe-agent-1.1"}
    native.write_text(json.dumps(doc))
    return run


class _Collector:
    """Milliseconds the cyclic garbage collector ran while on (``gc.callbacks``): its full
    collections walk every object the batch holds, the classified run's too."""

    def __init__(self) -> None:
        self.ms, self._t = 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.ms += (time.perf_counter() - self._t) * 1000

    def __enter__(self) -> "_Collector":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _further(
    opts, bounds: list[int], work: Path | None, rows: Path | None
) -> tuple[float, float, float, float, list]:
    """One pass of section 3: a new :class:`SourceReads`, the first prefix, then the further
    ones. ``work``: write each prefix's three files under it (``--output DIR``); ``rows``: write
    each outcome's row to that JSON Lines file as the command does (``--rows FILE.jsonl``).
    Returns (first prefix ms, further prefixes wall ms, CPU ms and of it the cyclic
    collector's ms each, their outcomes)."""
    from pvisor.commands.batch import row
    from pvisor.replay.batch import SourceReads, prepare_many

    reads = SourceReads()
    out = (lambda i: work / str(i)) if work is not None else (lambda i: None)
    t = time.perf_counter()
    [first] = prepare_many([opts(bounds[0], out(0))], reads=reads)
    first_ms = (time.perf_counter() - t) * 1000
    fh = open(rows, "wb") if rows is not None else None
    t, c = time.perf_counter(), time.process_time()
    rest = []
    with _Collector() as collector:
        for o in prepare_many([opts(n, out(i)) for i, n in enumerate(bounds[1:], 1)], reads=reads):
            if fh is not None:
                fh.write(orjson.dumps(row(o)) + b"\n")
            rest.append(o)
    if fh is not None:
        fh.close()
    wall, cpu = (time.perf_counter() - t) * 1000 / len(rest), (time.process_time() - c) * 1000 / len(rest)
    assert all(o.status.value == "ok" for o in [first, *rest]), [o.error for o in rest if o.error]
    assert reads.runs.runs_classified <= 1
    reads.close()
    return first_ms, wall, cpu, collector.ms / len(rest), rest


def run_beside_file(work: Path, steps: int, count: int, passes: int = 3) -> list[str]:
    """Section 3 of the module docstring: the table's rows, each figure the best of ``passes``."""
    from pvisor.replay.batch import prepare_many
    from pvisor.replay.prepare import PrepareOptions

    journal, native = work / "runs.sqlite", work / "run.traj.json"
    run = chat_run(journal, native, steps)
    bounds = [steps * k // count for k in range(1, count + 1)]
    agent = "mini-swe-agent"  # output None: nothing written, the prefix kept
    sources = {
        "journal run": lambda n, out=None: PrepareOptions(agent, n, cast(Any, out), run=run, journal=journal),
        "native file": lambda n, out=None: PrepareOptions(agent, n, cast(Any, out), trajectory=native),
    }
    out = [
        "",
        f"One {steps}-step mini-swe-agent run as a journal run and as its native file, {count} boundaries "
        f"(N = {bounds[0]}, {bounds[1]}, ..., {bounds[-1]}) in one process, each figure the best of "
        f"{passes} passes (a pass: a new batch cache, the first prefix, the {count - 1} further ones):",
        "",
        "| source | first prefix ms | each further prefix ms (CPU ms) | of it the source's part ms "
        "| with its --rows row ms | with its --output files ms (of it writing) | of these the cyclic "
        "collector ms | mean prefix | each prefix with a cache of its own ms | runs read and classified |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, opts in sources.items():
        mem = [_further(opts, bounds, None, None) for _ in range(passes)]
        rows = [_further(opts, bounds, None, work / "rows.jsonl") for _ in range(passes)]
        files = []
        for i in range(passes):
            files.append(_further(opts, bounds, work / f"out-{name[0]}-{i}", None))
            shutil.rmtree(work / f"out-{name[0]}-{i}")
        first_ms = min(p[0] for p in mem)
        further, cpu = min(p[1] for p in mem), min(p[2] for p in mem)
        rest = mem[0][4]
        part = statistics.median(o.result["timings_ms"]["prefix"] for o in rest)
        size = statistics.mean(len(o.prefix.body) for o in rest) / 1000
        row_ms, file_ms = min(p[1] for p in rows), min(p[1] for p in files)
        collected = "/".join(f"{min(p[3] for p in m):.2f}" for m in (mem, rows, files))
        t = time.perf_counter()
        for n in bounds:
            [o] = prepare_many([opts(n)])  # a SourceReads of its own: the source read again
        alone = (time.perf_counter() - t) * 1000 / len(bounds)
        out.append(
            f"| {name} | {first_ms:.1f} | {further:.2f} ({cpu:.2f}) | {part:.2f} | {row_ms:.2f} | "
            f"{file_ms:.2f} ({file_ms - further:.2f}) | {collected} | {size:.0f} KB | {alone:.1f} | "
            f"{1 if name == 'journal run' else '-'} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--singles", type=int, default=30, help="single-prepare processes for the baseline")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many batch runs")
    ap.add_argument("--steps", default="10,100,1000,10000", help="rollout lengths of the curve")
    ap.add_argument("--no-ray", action="store_true", help="leave out the Ray run")
    ap.add_argument("--run-steps", type=int, default=200, help="steps of the run read as journal and file")
    ap.add_argument("--boundaries", type=int, default=50, help="boundaries of that run")
    ap.add_argument("--only-runs", action="store_true", help="the journal run beside the native file alone")
    ap.add_argument("--passes", type=int, default=3, help="section 3: each figure the best of this many")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines = []
        if not args.only_runs:
            lines += experiment(work, args)
            lines += curve(work, [int(x) for x in args.steps.split(",")])
        lines += run_beside_file(work, args.run_steps, args.boundaries, args.passes)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
