"""Fidelity benchmark of ``pvisor replay --prepare-only`` (issue 7), the published experiment
reproduced: per adapter twenty synthetic native trajectories with two tool batches each,
``--after-step 1 --prepare-only``, three repetitions in an order shuffled with a fixed seed
(7 adapters x 20 x 3 = 420 attempts; SWE-agent's 60 are run too and reported apart).

    bench/fidelity/run                          # installs pvisor non-editable, runs, prints the table
    bench/fidelity/run --docs                   # and rewrites the table in docs/benchmarks.md
    python bench/fidelity/run.py --pvisor PATH  # against any pvisor executable (its python is the floor's)

Every attempt: a fresh workspace holding a pre-existing file (random bytes) and a fresh output
directory outside it; the whole CLI run is timed from launch (``Popen``) to exit (``wait``), so
interpreter start and imports count. The checker (check.py, standard library only, never
imports pvisor) rechecks every prefix and workspace against the generator's manifest; a failed
sample is counted invalid and its time is kept in the latency figures (never dropped, never
zero). In the same shuffled schedule, 60 runs each of ``python -c pass`` and ``python -c
'import click, orjson'`` (the stack floor) with the same interpreter as pvisor, and of that floor
with the cyclic collector off (as pvisor's entry point imports, pvisor/entry.py), the second
ratio of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import check  # noqa: E402
import generate  # noqa: E402

SEVEN = ("claude-code", "codex", "gemini-cli", "qwen-code", "opencode", "mini-swe-agent", "openhands")
FLOORS = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import click, orjson'": ["-c", "import click, orjson"],
    # the stack floor as pvisor's entry point imports it (pvisor/entry.py): the second ratio
    "python -c 'import gc; gc.disable(); import click, orjson'": [
        "-c",
        "import gc; gc.disable(); import click, orjson",
    ],
}
BEGIN, END = "<!-- bench/fidelity: begin -->", "<!-- bench/fidelity: end -->"


def _timed(argv: list[str], cwd: Path | None = None) -> tuple[float, float, int, bytes, bytes]:
    """Wall milliseconds from launch to exit, the child's CPU milliseconds (user + system,
    from ``os.wait4``: less sensitive than wall time to other load on the machine), exit
    code, stdout, stderr."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        ms = (time.perf_counter() - t0) * 1000.0
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        p.stdout.close()
        err.seek(0)
        return ms, (usage.ru_utime + usage.ru_stime) * 1000.0, p.returncode, out, err.read()


def _attempt(pvisor: str, item: dict, out: Path, ws: Path) -> list[str]:
    """The command line of one attempt: prepare-only of ``item``'s file after step 1."""
    return [
        pvisor, "replay", "--agent", item["agent"], "--trajectory", item["file"], "--after-step", "1",
        "--prepare-only", "--output", str(out), "--workspace", str(ws), "--result", "-",
    ]  # fmt: skip


def _instructions(argv: list[str], cwd: Path) -> int:
    """Instructions ``argv`` executes, counted by valgrind's callgrind: the same on every run
    within 0.2 %, where wall time on a shared machine moves by several percent."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        cwd=cwd,
    )
    found = re.search(rb"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        sys.exit(f"run.py: {' '.join(argv)} under valgrind: {proc.stderr.decode()[-1000:]}")
    return int(found.group(1))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pvisor", required=True, help="the pvisor executable (a non-editable install)")
    ap.add_argument("--seed", type=int, default=420)
    ap.add_argument("--per-agent", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-swe-agent", action="store_true")
    ap.add_argument(
        "--docs", action="store_true", help="rewrite the table between the markers in docs/benchmarks.md"
    )
    ap.add_argument("--save", default=None, help="write every sample as JSON here")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="also count, under valgrind, the instructions of one attempt per adapter and of the floors",
    )
    ap.add_argument(
        "--self-test",
        action="store_true",
        help="check that the checker rejects wrong samples (one trajectory per adapter), then exit",
    )
    args = ap.parse_args()
    pvisor = str(Path(args.pvisor).resolve())
    python = str(Path(pvisor).parent / "python")
    agents = SEVEN if args.no_swe_agent else SEVEN + ("swe-agent",)
    if args.self_test:
        return self_test(pvisor, agents, args.seed)

    with tempfile.TemporaryDirectory(prefix="pvisor-fidelity-") as tmp:
        tmp = Path(tmp)
        manifest = generate.generate(tmp / "traj", agents, args.per_agent, args.seed)
        schedule = [("pvisor", k) for k in range(len(manifest["items"])) for _ in range(args.reps)]
        schedule += [("floor", name) for name in FLOORS for _ in range(args.per_agent * args.reps)]
        random.Random(args.seed).shuffle(schedule)
        # warm the page cache and pyc files once (not measured)
        _timed([pvisor, "--help"], tmp)
        samples, floors, floor_cpu = [], {name: [] for name in FLOORS}, {name: [] for name in FLOORS}
        for n, (kind, what) in enumerate(schedule):
            if kind == "floor":
                ms, cpu, *_ = _timed([python, *FLOORS[what]], tmp)
                floors[what].append(ms)
                floor_cpu[what].append(cpu)
                continue
            item = manifest["items"][what]
            ws, out = tmp / f"ws{n}", tmp / f"out{n}"
            (ws / "src").mkdir(parents=True)
            pre = ws / "src" / "existing.txt"
            pre_bytes = os.urandom(256).hex().encode() + b"\n"
            pre.write_bytes(pre_bytes)
            (ws / "README.md").write_text("workspace of attempt %d\n" % n)
            before = check.inventory(ws)
            ms, cpu, code, stdout, stderr = _timed(_attempt(pvisor, item, out, ws), tmp)
            reasons = check.check_sample(item, code, stdout, out, ws, before, pre, pre_bytes)
            if code != 0:
                reasons.append(stderr.decode(errors="replace").strip()[-300:])
            samples.append(
                {
                    "agent": item["agent"],
                    "index": item["index"],
                    "ms": ms,
                    "cpu_ms": cpu,
                    "valid": not reasons,
                    "reasons": reasons,
                }
            )
            shutil.rmtree(ws)
            shutil.rmtree(out, ignore_errors=True)
            if (n + 1) % 100 == 0:
                print(f"{n + 1}/{len(schedule)}", file=sys.stderr)
        counts: dict[str, int] = {}
        if args.instructions:
            for name, argv in FLOORS.items():
                counts[name] = _instructions([python, *argv], tmp)
            for agent in agents:
                item = next(i for i in manifest["items"] if i["agent"] == agent)
                ws, out = tmp / f"ws-{agent}", tmp / f"out-{agent}"
                (ws / "src").mkdir(parents=True)
                counts[agent] = _instructions(_attempt(pvisor, item, out, ws), tmp)

    rows = []
    for agent in agents:
        ss = [s for s in samples if s["agent"] == agent]
        ms = [s["ms"] for s in ss]
        rows.append(
            {
                "agent": agent,
                "valid": sum(s["valid"] for s in ss),
                "n": len(ss),
                "median": statistics.median(ms),
                "p90": _pct(ms, 0.9),
                "max": max(ms),
                "cpu_median": statistics.median(s["cpu_ms"] for s in ss),
                "instructions": counts.get(agent),
                "reasons": sorted(
                    {
                        r
                        for s in ss
                        for r in s["reasons"]
                        if not r.startswith(("observation of", "arguments of", "calls ["))
                    }
                    | {
                        r.split(" of ")[0]
                        for s in ss
                        for r in s["reasons"]
                        if r.startswith(("observation of", "arguments of"))
                    }
                ),
            }
        )
    floor_med = {name: statistics.median(v) for name, v in floors.items()}
    floor_cpu_med = {name: statistics.median(v) for name, v in floor_cpu.items()}
    table = render(rows, floor_med, floor_cpu_med, len(schedule), args, counts)
    print(table)
    if args.save:
        Path(args.save).write_text(
            json.dumps({"rows": rows, "floors": floors, "floor_cpu": floor_cpu, "samples": samples}, indent=1)
        )
    if args.docs:
        doc = HERE.parent.parent / "docs" / "benchmarks.md"
        text = doc.read_text()
        a, b = text.index(BEGIN), text.index(END)
        doc.write_text(text[:a] + BEGIN + "\n" + table + "\n" + text[b:])


def self_test(pvisor: str, agents, seed: int) -> None:
    """Negative controls: per adapter, one trajectory prepared right (must be valid), with
    ``--after-step 2`` (A2 and O2 in the prefix: must be invalid), with ``--after-step 0``
    (the first batch missing: invalid), and right but with the pre-existing file rewritten and
    a file added after the run (invalid)."""
    with tempfile.TemporaryDirectory(prefix="pvisor-fidelity-selftest-") as tmp:
        tmp = Path(tmp)
        manifest = generate.generate(tmp / "traj", agents, 1, seed)
        failures = 0
        for item in manifest["items"]:
            for case, step, tamper, want_valid in (
                ("right", "1", False, True),
                ("after-step 2", "2", False, False),
                ("after-step 0", "0", False, False),
                ("workspace changed", "1", True, False),
            ):
                ws, out = (
                    tmp / f"ws-{item['agent']}-{step}-{tamper}",
                    tmp / f"out-{item['agent']}-{step}-{tamper}",
                )
                ws.mkdir()
                pre = ws / "existing.txt"
                pre.write_bytes(b"before\n")
                before = check.inventory(ws)
                _, _, code, stdout, _ = _timed(
                    [
                        pvisor,
                        "replay",
                        "--agent",
                        item["agent"],
                        "--trajectory",
                        item["file"],
                        "--after-step",
                        step,
                        "--prepare-only",
                        "--output",
                        str(out),
                        "--workspace",
                        str(ws),
                        "--result",
                        "-",
                    ],
                    tmp,
                )
                if tamper:
                    pre.write_bytes(b"after\n")
                    (ws / "new.txt").write_text("x")
                reasons = check.check_sample(item, code, stdout, out, ws, before, pre, b"before\n")
                ok = (not reasons) == want_valid
                failures += not ok
                print(
                    f"{'ok  ' if ok else 'FAIL'} {item['agent']:15} {case:18} -> "
                    f"{'valid' if not reasons else 'invalid: ' + '; '.join(reasons)[:150]}"
                )
        print(f"self-test: {failures} unexpected verdicts")
        if failures:
            raise SystemExit(1)


def render(rows: list[dict], floor_med: dict, floor_cpu_med: dict, runs: int, args, counts: dict) -> str:
    click_floor = floor_med["python -c 'import click, orjson'"]
    click_cpu = floor_cpu_med["python -c 'import click, orjson'"]
    gc_off = floor_med["python -c 'import gc; gc.disable(); import click, orjson'"]
    seven = [r for r in rows if r["agent"] in SEVEN]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} "
        f"({os.cpu_count()} CPUs), Python {platform.python_version()}, "
        f"non-editable install; seed {args.seed}, {args.per_agent} trajectories x {args.reps} "
        "repetitions per adapter, "
        f"{sum(r['n'] for r in seven)} attempts for the seven adapters ({runs} runs in the shuffled "
        "schedule with the floors" + (" and SWE-agent" if len(rows) > len(seven) else "") + ").",
        "",
        "| adapter | valid | median ms | p90 ms | max ms | median / stack floor | median CPU ms "
        "| CPU / floor CPU | median / floor, collector off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = r["agent"] if r["agent"] in SEVEN else f"({r['agent']}, not one of the seven)"
        lines.append(
            f"| {name} | {r['valid']}/{r['n']} | {r['median']:.1f} | {r['p90']:.1f} | {r['max']:.1f} "
            f"| {r['median'] / click_floor:.2f}x | {r['cpu_median']:.1f} "
            f"| {r['cpu_median'] / click_cpu:.2f}x | {r['median'] / gc_off:.2f}x |"
        )
    lines.append("")
    lines.append(
        "Floors in the same run (medians of %d runs each, the same interpreter): "
        % (args.per_agent * args.reps)
        + ", ".join(f"`{k}` {v:.1f} ms (CPU {floor_cpu_med[k]:.1f} ms)" for k, v in floor_med.items())
        + "."
    )
    if counts:
        stack, off = (
            counts["python -c 'import click, orjson'"],
            counts["python -c 'import gc; gc.disable(); import click, orjson'"],
        )
        lines += [
            "",
            "Instructions (valgrind callgrind, the first trajectory of each adapter, once; the floors "
            f"{stack / 1e6:.1f}M and, collector off, {off / 1e6:.1f}M):",
            "",
            "| adapter | instructions | / stack floor | / floor, collector off |",
            "|---|---:|---:|---:|",
        ]
        for r in rows:
            name = r["agent"] if r["agent"] in SEVEN else f"({r['agent']}, not one of the seven)"
            n = r["instructions"]
            lines.append(f"| {name} | {n / 1e6:.1f}M | {n / stack:.3f}x | {n / off:.3f}x |")
    bad = [r for r in rows if r["valid"] < r["n"]]
    if bad:
        lines.append("")
        lines.append(
            "Why samples were invalid: "
            + "; ".join(f"{r['agent']}: {', '.join(r['reasons'])}" for r in bad)
            + "."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
