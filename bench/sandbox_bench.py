"""What the sandbox adds to a replay (docs/benchmarks.md, "The sandbox: start-up and per-step cost").

A Codex run of ``--steps`` steps (each one shell call, ``echo N``) is captured once with the
scripted model. Then replay-only runs it after step 0 (the agent starts, is served nothing and is
ended at request 1: the start-up) and after step S (every step served and re-run), with
``--sandbox bwrap`` and ``--sandbox none`` interleaved for ``--rounds`` rounds. Reported: the
median of ``timings_ms.agent`` (the agent's whole run, from launch to its end) per mode and
boundary; the start-up cost (bwrap minus none at N = 0) and the cost per step
(((bwrap - none) at N = S) - ((bwrap - none) at N = 0)) / S. The aim: under 100 ms per run and
under 1 ms per step.

    python bench/sandbox_bench.py --codex PATH [--steps 20] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PVISOR = str(Path(sys.executable).with_name("pvisor"))


def _pvisor(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([PVISOR, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"pvisor {' '.join(args[:4])} ... failed: {proc.stderr[-2000:]}")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codex", required=True, help="the Codex executable")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pvisor-sandbox-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVISOR_")}
    env["HOME"] = str(root / "home")
    (root / "home").mkdir()
    journal = str(root / "data" / "j.sqlite")
    turns = [
        {"text": f"Step {i}.", "tool_calls": [{"tool": "@shell", "command": f"echo {i}"}]}
        for i in range(a.steps)
    ]
    (root / "script.json").write_text(
        json.dumps({"model": "mock-model", "seed": 1, "turns": [*turns, {"text": "Done."}]})
    )
    (root / "ws").mkdir()
    capture = ["--journal", journal, "run", "--agent", "codex", "--agent-entrypoint", a.codex,
               "--script", str(root / "script.json"), "--workspace", str(root / "ws"), "--timeout", "600",
               "--json", "--", "Count."]  # fmt: skip
    proc = _pvisor(capture, env, root)
    run = json.loads(proc.stdout)["run"]
    agent_ms: dict[tuple[str, int], list[float]] = {}
    wall_ms: dict[tuple[str, int], list[float]] = {}
    for r in range(a.rounds):
        for n in (0, a.steps):
            for mode in ("bwrap", "none") if r % 2 == 0 else ("none", "bwrap"):
                ws, out = root / f"ws-{mode}-{n}-{r}", root / f"out-{mode}-{n}-{r}"
                ws.mkdir()
                t = time.perf_counter()
                replay = ["--journal", journal, "replay", "--agent", "codex", "--run", run,
                          "--after-step", str(n), "--replay-only", "--workspace", str(ws),
                          "--output", str(out), "--agent-entrypoint", a.codex, "--sandbox", mode,
                          "--no-progress"]  # fmt: skip
                _pvisor(replay, env, root)
                wall_ms.setdefault((mode, n), []).append((time.perf_counter() - t) * 1000)
                doc = json.loads((out / "result.json").read_text())
                agent_ms.setdefault((mode, n), []).append(doc["timings_ms"]["agent"])
                shutil.rmtree(ws)
    med = {k: statistics.median(v) for k, v in agent_ms.items()}
    start = med[("bwrap", 0)] - med[("none", 0)]
    per_step = ((med[("bwrap", a.steps)] - med[("none", a.steps)]) - start) / a.steps
    report = {
        "steps": a.steps,
        "rounds": a.rounds,
        "agent_ms_median": {f"{m}@{n}": v for (m, n), v in sorted(med.items())},
        "wall_ms_median": {f"{m}@{n}": statistics.median(v) for (m, n), v in sorted(wall_ms.items())},
        "agent_ms": {f"{m}@{n}": v for (m, n), v in sorted(agent_ms.items())},
        "startup_added_ms": start,
        "per_step_added_ms": per_step,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
