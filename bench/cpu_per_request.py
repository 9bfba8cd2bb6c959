"""Where a proxy's CPU goes: CPU time per request of the bare pass-through and of the pvisor
gateway, the latter split into its event-loop thread, its other threads (the journal writer thread
when ``PVISOR_JOURNAL_WRITER=thread``; the sender and reply threads of a writer process) and
its journal writer process.

Same set-up as bench/gateway (proxy on CPU 0; upstream and wrk on CPU 1). Prints one line per
target and workload: requests/s, p50, CPU µs per request (process; per thread for pvisor),
read from /proc/PID/task/TID/stat (utime + stime) before and after the measured run.

Usage: bench/.venv/bin/python bench/cpu_per_request.py [--seconds 6] [--workloads json@32,json@1]
       [--rounds 1] [--pvisor NAME=PATH ...]

``--pvisor NAME=COMMAND`` measures another ``pvisor`` beside the installed one (a venv of an older
commit's ``bin/pvisor``; ``"python bench/loop_only_gateway.py"``, the gateway without its journal
writer's work), repeatable: every round runs every target on every workload in turn,
so the figures of one run compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gateway_bench import PVISOR_VARIANTS, pin, stop, wait_listening  # noqa: E402
from loadgen import BODIES  # noqa: E402

TICK_US = 1_000_000 / os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> dict[int, int]:
    """utime + stime of every thread of ``pid`` and of its child processes (pvisor's journal
    writer process), by thread id; a child's threads are keyed by negative ids."""
    out: dict[int, int] = {}
    children: list[int] = []

    def read(process: int, sign: int) -> None:
        for task in Path(f"/proc/{process}/task").iterdir():
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[sign * int(task.name)] = int(fields[11]) + int(fields[12])
            if sign > 0:
                try:
                    children.extend(int(c) for c in (task / "children").read_text().split())
                except OSError:
                    pass

    read(pid, 1)
    for child in children:
        read(child, -1)
    return out


def wrk(url: str, body: str, conc: int, seconds: int) -> dict:
    body_file = Path(tempfile.mkdtemp()) / "body.json"
    body_file.write_bytes(BODIES[body])
    env = {**os.environ, "PVISOR_BENCH_BODY_FILE": str(body_file)}
    cmd = [
        *pin(1),
        "wrk",
        "-t1",
        f"-c{conc}",
        f"-d{seconds}s",
        "-s",
        str(HERE / "wrk_report.lua"),
        url + "/v1/chat/completions",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--workloads", default="json@1,json@32,stream@1,stream@32")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--uvloop",
        action="store_true",
        help="also measure the bare proxy and pvisor on uvloop's event loop "
        "(bare+uv; pvisor+uv: --event-loop uvloop)",
    )
    ap.add_argument(
        "--pvisor",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another pvisor executable to measure (repeatable); the installed one is 'pvisor'",
    )
    ap.add_argument(
        "--variants",
        action="store_true",
        help="also measure pvisor with its journal writer as a thread and on CPU 1 "
        "(pvisor-thread, pvisor-w1)",
    )
    args = ap.parse_args()
    py = sys.executable
    executables = {"pvisor": [str(Path(py).parent / "pvisor")]}
    # the installed pvisor's targets: the environment and the `pvisor gateway` arguments of each
    # (another --pvisor COMMAND may not know them, and gets none)
    envs: dict[str, dict[str, str]] = {}
    extras: dict[str, list[str]] = {"pvisor": PVISOR_VARIANTS["pvisor"][1]}
    if args.variants:
        for name, (env, extra) in PVISOR_VARIANTS.items():
            if name not in ("pvisor", "pvisor-uv", "pvisor-baseline"):
                executables[name], envs[name], extras[name] = executables["pvisor"], env, extra
    if args.uvloop:
        executables["pvisor+uv"], extras["pvisor+uv"] = executables["pvisor"], PVISOR_VARIANTS["pvisor-uv"][1]
    for spec in args.pvisor:
        name, _, command = spec.partition("=")
        executables[name] = shlex.split(command)  # a path, or a command with its arguments
    up = subprocess.Popen(
        [*pin(1), py, str(HERE / "upstream.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    upstream = wait_listening(up, "upstream")
    try:
        for _ in range(args.rounds):
            for w in args.workloads.split(","):
                for target in ("bare", *(["bare+uv"] if args.uvloop else []), *executables):
                    body, conc = w.split("@")
                    tmp = Path(tempfile.mkdtemp())
                    if target in ("bare", "bare+uv"):
                        cmd = [
                            *pin(0),
                            py,
                            *([str(HERE / "uvloop_run.py")] if target == "bare+uv" else []),
                            str(HERE / "bare_proxy.py"),
                            "--port",
                            "0",
                            "--upstream",
                            upstream,
                        ]
                    else:
                        cmd = [
                            *pin(0),
                            *executables[target],
                            "--journal",
                            str(tmp / "j.sqlite"),
                            "gateway",
                            "--port",
                            "0",
                            "--upstream",
                            f"openai={upstream}",
                            *extras.get(target, []),
                        ]
                    proc = subprocess.Popen(
                        cmd,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                        env={**os.environ, **envs.get(target, {})},
                    )
                    url = wait_listening(proc, target)
                    try:
                        wrk(url, body, int(conc), 1)  # warm-up
                        before = thread_ticks(proc.pid)
                        r = wrk(url, body, int(conc), args.seconds)
                        after = thread_ticks(proc.pid)
                    finally:
                        stop(proc)
                    n = r["requests"]
                    per = {tid: (after[tid] - before.get(tid, 0)) * TICK_US / n for tid in after}
                    main_us = per.pop(proc.pid, 0.0)
                    child_us = sum(v for tid, v in per.items() if tid < 0)
                    others = " ".join(
                        f"{v:.0f}"
                        for tid, v in sorted(per.items(), key=lambda kv: -kv[1])
                        if v >= 1 and tid > 0
                    )
                    print(
                        f"{target:13s} {w:10s} {n / (r['duration_us'] / 1e6):7.0f} req/s  "
                        f"p50 {r['p50_us'] / 1000:7.2f} ms  "
                        f"CPU {main_us + sum(per.values()):5.0f} µs/req (loop thread {main_us:.0f}; "
                        f"other threads {others or '-'}; "
                        f"writer process {child_us:.0f})",
                        flush=True,
                    )
    finally:
        stop(up)


if __name__ == "__main__":
    main()
