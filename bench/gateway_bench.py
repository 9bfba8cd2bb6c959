"""What the capture gateway costs: added latency against a direct connection, side by side with
a bare aiohttp pass-through and mitmdump. Run through ``bench/gateway`` (it installs what this
needs); results go to ``bench/results/`` and the table into ``docs/benchmarks.md``.

Three processes per measurement: the upstream (``bench/upstream.py``) and the load generator
(``bench/loadgen.py``) pinned to CPU 1, the proxy under test pinned to CPU 0 (``taskset``).
Targets are interleaved within each round, so drift in the machine hits all of them alike.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO = HERE.parent
WORKLOADS = [("json", 1), ("json", 32), ("json", 128), ("stream", 1), ("stream", 32), ("stream", 128)]
WORKLOAD_NAMES = {"json": "10 KB JSON", "stream": "200-event stream"}
MARK_BEGIN = "<!-- bench/gateway: begin -->"
MARK_END = "<!-- bench/gateway: end -->"
AGENT_BEGIN = "<!-- bench/gateway agents: begin -->"
AGENT_END = "<!-- bench/gateway agents: end -->"
AGENT_CONCURRENCY = (1, 4, 16, 64)


def pin(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) >= 2 else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(proc: subprocess.Popen, what: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} exited before listening (code {proc.poll()})")
        if line.startswith("listening "):
            return line.split()[1].strip()
    raise RuntimeError(f"{what} did not start within {timeout} s")


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def peak_rss_kib(pid: int) -> int | None:
    """VmHWM of ``pid`` plus its children's (pvisor's journal writer process), in KiB."""
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    total = None
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total = (total or 0) + int(line.split()[1])
        except OSError:
            continue
    return total


#: pvisor targets: the same gateway with its journal writer placed differently (docs/journal.md)
#: or on another event loop: (environment, extra `pvisor gateway` arguments)
PVISOR_VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    # the default: the writer in a process of its own, on the CPU the gateway may use; asyncio's loop
    "pvisor": ({}, ["--event-loop", "asyncio"]),
    "pvisor-thread": (
        {"PVISOR_JOURNAL_WRITER": "thread"},
        ["--event-loop", "asyncio"],
    ),  # the writer as a thread
    "pvisor-w1": ({"PVISOR_WRITER_CPUS": "1"}, ["--event-loop", "asyncio"]),  # the writer process on CPU 1
    "pvisor-uv": ({}, ["--event-loop", "uvloop"]),  # on uvloop (bench venv); compare with bare-uv
    # the `pvisor` of --baseline (another install: a change's before and after in one run)
    "pvisor-baseline": ({}, ["--event-loop", "asyncio"]),
}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Target:
    """A proxy (or none, for direct) that can be started and stopped for one round."""

    def __init__(self, name: str, args: argparse.Namespace, upstream: str):
        self.name, self.args, self.upstream = name, args, upstream
        self.proc: subprocess.Popen | None = None
        self.url = upstream
        self.tmp: Path | None = None

    def start(self) -> None:
        py = sys.executable
        if self.name == "direct":
            return
        if self.name in ("bare", "bare-uv"):
            uv = [str(HERE / "uvloop_run.py")] if self.name == "bare-uv" else []
            self.proc = subprocess.Popen(
                [*pin(0), py, *uv, str(HERE / "bare_proxy.py"), "--port", "0", "--upstream", self.upstream],
                stdout=subprocess.PIPE,
                text=True,
            )
            self.url = wait_listening(self.proc, "bare proxy")
        elif self.name in PVISOR_VARIANTS:
            env = {**os.environ, **PVISOR_VARIANTS[self.name][0]}
            self.tmp = Path(tempfile.mkdtemp(prefix="pvisor-bench-"))
            # the installed console script: `python -m pvisor` from the checkout would import its pvisor/
            pvisor = str(Path(sys.executable).parent / "pvisor")
            if self.name == "pvisor-baseline":
                pvisor = self.args.baseline
            self.proc = subprocess.Popen(
                [
                    *pin(0),
                    pvisor,
                    "--journal",
                    str(self.tmp / "journal.sqlite"),
                    "gateway",
                    "--port",
                    "0",
                    "--upstream",
                    f"openai={self.upstream}",
                    *PVISOR_VARIANTS[self.name][1],
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            self.url = wait_listening(self.proc, "pvisor gateway")
        elif self.name == "mitmdump":
            port = free_port()
            self.proc = subprocess.Popen(
                [
                    *pin(0),
                    self.args.mitmdump,
                    "--mode",
                    f"reverse:{self.upstream}",
                    "--listen-host",
                    "127.0.0.1",
                    "--listen-port",
                    str(port),
                    "-q",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            wait_port(port)
            self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> dict:
        info: dict = {}
        if self.proc is not None:
            info["peak_rss_kib"] = peak_rss_kib(self.proc.pid)
            stop(self.proc)
        if self.tmp is not None:
            journal = self.tmp / "journal.sqlite"
            import sqlite3

            conn = sqlite3.connect(journal)
            n = conn.execute("SELECT count(*) FROM exchanges").fetchone()[0]
            blob_bytes = conn.execute("SELECT COALESCE(SUM(length(data)), 0) FROM blobs").fetchone()[0]
            conn.close()
            size = sum(p.stat().st_size for p in self.tmp.iterdir())
            info.update(exchanges=n, journal_bytes=size, blob_bytes=blob_bytes)
            shutil.rmtree(self.tmp, ignore_errors=True)
        return info


def measure(url: str, body: str, concurrency: int, args: argparse.Namespace) -> dict:
    """p50/p99 latency (ms) of POSTs to ``url`` at ``concurrency``: wrk when available (C,
    closed loop, ``args.seconds`` per point after a 1 s warm-up), else bench/loadgen.py."""
    target = url + "/v1/chat/completions"
    if args.loadgen == "wrk":
        body_file = HERE / "results" / f".body-{body}.json"
        body_file.parent.mkdir(exist_ok=True)
        from loadgen import BODIES

        body_file.write_bytes(BODIES[body])
        env = {**os.environ, "PVISOR_BENCH_BODY_FILE": str(body_file)}
        base = [
            *pin(1),
            "wrk",
            "-t1",
            f"-c{concurrency}",
            "--timeout",
            "30s",
            "-s",
            str(HERE / "wrk_report.lua"),
        ]
        subprocess.run([*base, "-d1s", target], env=env, capture_output=True, timeout=120)  # warm-up
        proc = subprocess.run(
            [*base, f"-d{args.seconds}s", target], env=env, capture_output=True, text=True, timeout=600
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("{")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed against {url}: {proc.stdout[-1000:]} {proc.stderr[-1000:]}")
        out = json.loads(line)
        if out["errors"] or out["non2xx"] or not out["requests"]:
            raise RuntimeError(f"{out['errors']} failed and {out['non2xx']} non-2xx requests against {url}")
        return {
            "p50": out["p50_us"] / 1000,
            "p99": out["p99_us"] / 1000,
            "n": out["requests"],
            "rps": out["requests"] / (out["duration_us"] / 1e6),
        }
    n = args.requests * max(1, concurrency // 4) if concurrency > 1 else args.requests
    proc = subprocess.run(
        [
            *pin(1),
            sys.executable,
            str(HERE / "loadgen.py"),
            "--url",
            target,
            "--body",
            body,
            "--concurrency",
            str(concurrency),
            "--requests",
            str(n),
            "--warmup",
            str(max(20, concurrency * 2)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)
    lat = sorted(out["latencies_ms"])
    if out["errors"] or not lat:
        raise RuntimeError(f"{out['errors']} failed requests against {url}")
    return {
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "n": len(lat),
        "rps": len(lat) / out["wall_s"],
    }


def summarise(raw: dict, targets: list[str]) -> dict:
    """Per target and workload: median over rounds of added p50/p99 (target minus direct in the same
    round), min and max."""
    out: dict = {}
    for t in targets:
        if t == "direct":
            continue
        for body, c in WORKLOADS:
            key = f"{body}@{c}"
            added50 = [r[t][key]["p50"] - r["direct"][key]["p50"] for r in raw["rounds"]]
            added99 = [r[t][key]["p99"] - r["direct"][key]["p99"] for r in raw["rounds"]]
            out.setdefault(t, {})[key] = {
                "p50_added_ms": statistics.median(added50),
                "p50_added_min": min(added50),
                "p50_added_max": max(added50),
                "p99_added_ms": statistics.median(added99),
                "p99_added_min": min(added99),
                "p99_added_max": max(added99),
                "direct_p50_ms": statistics.median(r["direct"][key]["p50"] for r in raw["rounds"]),
            }
    return out


def markdown(summary: dict, raw: dict, targets: list[str]) -> str:
    lines = []
    meta = raw["meta"]
    load = (
        f"wrk, {meta['seconds']} s per point after a 1 s warm-up"
        if meta["loadgen"] == "wrk"
        else f"bench/loadgen.py, {meta['requests']} requests per point at concurrency 1 (more above)"
    )
    lines.append(
        f"Measured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), Python {meta['python']}, "
        f"{meta['rounds']} rounds; load: {load}; proxy pinned to CPU 0, upstream and load generator "
        f"to CPU 1: {meta['pinned']}."
    )
    lines.append("")
    lines.append(
        "Added latency against direct, in ms: median over rounds of each round's p50 (p99), "
        "with [min, max] over rounds."
    )
    lines.append("")
    head = (
        ["workload", "conc.", "direct p50"]
        + [f"{t} p50 [min, max]" for t in targets if t != "direct"]
        + [f"{t} p99" for t in targets if t != "direct"]
    )
    ratios = [
        (t, peer) for peer in ("bare", "mitmdump") if peer in summary for t in targets if t in PVISOR_VARIANTS
    ]
    if "pvisor-uv" in summary and "bare-uv" in summary:
        ratios.append(("pvisor-uv", "bare-uv"))
    head += [f"{t} / {peer} (p50)" for t, peer in ratios]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for body, c in WORKLOADS:
        key = f"{body}@{c}"
        any_t = next(iter(summary.values()))[key]
        row = [WORKLOAD_NAMES[body], str(c), f"{any_t['direct_p50_ms']:.2f}"]
        for t in targets:
            if t == "direct":
                continue
            s = summary[t][key]
            row.append(f"+{s['p50_added_ms']:.2f} [{s['p50_added_min']:.2f}, {s['p50_added_max']:.2f}]")
        for t in targets:
            if t == "direct":
                continue
            row.append(f"+{summary[t][key]['p99_added_ms']:.2f}")
        for t, peer in ratios:
            a, b = summary[t][key]["p50_added_ms"], summary[peer][key]["p50_added_ms"]
            # a ratio of a non-positive "added latency" means nothing (see docs/benchmarks.md)
            row.append(f"{a / b:.2f}" if a > 0 and b > 0.005 else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    pv = [r["pvisor_info"] for r in raw["rounds"] if r.get("pvisor_info")]
    if pv:
        per = statistics.median(i["journal_bytes"] / max(1, i["exchanges"]) for i in pv)
        blob = statistics.median(i["blob_bytes"] / max(1, i["exchanges"]) for i in pv)
        rss = max(i["peak_rss_kib"] or 0 for i in pv)
        lines.append("")
        lines.append(
            f"pvisor journal: {per:,.0f} bytes per exchange on disk (the file after the WAL checkpoint, over "
            f"{statistics.median(i['exchanges'] for i in pv):,.0f} exchanges a round; "
            "the benchmark repeats one request and two "
            "response bodies, stored once each, so this is the exchange row, its event and indexes: "
            f"{blob:,.1f} blob bytes per "
            f"exchange). Gateway peak RSS {rss / 1024:.1f} MiB (VmHWM of the gateway plus its journal "
            "writer process, the largest over the rounds, each round all workloads)."
        )
    return "\n".join(lines)


def update_docs(table: str, begin: str = MARK_BEGIN, end: str = MARK_END) -> None:
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n{table}\n{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


# --------------------------------------------------------------------------- coding-agent scenarios


def measure_scenario(url: str, scenario: str, concurrency: int, seconds: float) -> dict:
    """One point of ``bench/scenarios.py`` (pinned to CPU 1 beside the upstream): p50 and p99
    of time to first byte and of the whole response (ms), the p99 gap between chunks of a
    stream, requests timed and answered."""
    proc = subprocess.run(
        [
            *pin(1),
            sys.executable,
            str(HERE / "scenarios.py"),
            "--url",
            url,
            "--scenario",
            scenario,
            "--concurrency",
            str(concurrency),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {scenario} failed against {url}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)
    if out["errors"] or not out["requests"]:
        raise RuntimeError(
            f"{out['errors']} failed requests ({out['requests']} timed) in {scenario}@{concurrency} "
            f"against {url}"
        )
    from scenarios import percentile

    point = {"n": out["requests"], "sent": out["sent"]}
    for key in ("ttfb", "total"):
        point[f"{key}_p50"] = percentile(out[f"{key}_ms"], 0.5)
        point[f"{key}_p99"] = percentile(out[f"{key}_ms"], 0.99)
    if scenario == "stream":
        # None: every response came in one piece (the proxy buffered the stream)
        point["gap_p99"] = percentile(out["gaps_ms"], 0.99) if out["gaps_ms"] else None
    return point


def agent_suite(args: argparse.Namespace, targets: list[str], upstream: str) -> dict:
    """Every round: per target, per scenario a fresh proxy (its peak RSS and journal are the
    scenario's), every concurrency of :data:`AGENT_CONCURRENCY` in turn."""
    from scenarios import SCENARIOS

    raw: dict = {
        "meta": {
            "date": dt.date.today().isoformat(),
            "machine": platform.machine() + " " + platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "rounds": args.rounds,
            "seconds": args.seconds,
            "pinned": bool(pin(0)),
            "concurrency": list(AGENT_CONCURRENCY),
        },
        "rounds": [],
    }
    for r in range(args.rounds):
        result: dict = {}
        for name in targets:
            for scenario in SCENARIOS:
                t = Target(name, args, upstream)
                t.start()
                try:
                    for c in AGENT_CONCURRENCY:
                        point = measure_scenario(t.url, scenario, c, args.seconds)
                        result.setdefault(name, {})[f"{scenario}@{c}"] = point
                        print(
                            f"round {r + 1} {name:9s} {scenario:9s} c={c:<3d} "
                            f"total p50 {point['total_p50']:.2f} ms "
                            f"ttfb p50 {point['ttfb_p50']:.2f} ms",
                            file=sys.stderr,
                        )
                finally:
                    info = t.stop()
                info["sent"] = sum(result[name][f"{scenario}@{c}"]["sent"] for c in AGENT_CONCURRENCY)
                result.setdefault(f"{name}_info", {})[scenario] = info
        raw["rounds"].append(result)
    return raw


def agent_markdown(raw: dict, targets: list[str]) -> str:
    from scenarios import SCENARIO_NAMES, SCENARIOS

    meta = raw["meta"]
    rounds = raw["rounds"]
    peers = [t for t in targets if t != "direct"]

    def med(t: str, key: str, field: str) -> float:
        return statistics.median(r[t][key][field] for r in rounds)

    def gap(t: str, key: str) -> str:
        values = [r[t][key]["gap_p99"] for r in rounds]
        return "buffered" if any(v is None for v in values) else f"{statistics.median(values):.2f}"

    def added(t: str, key: str, field: str) -> float:
        return statistics.median(r[t][key][field] - r["direct"][key][field] for r in rounds)

    lines = [
        f"Measured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), Python {meta['python']}, "
        f"{meta['rounds']} rounds; "
        f"bench/scenarios.py, {meta['seconds']:g} s per point after 0.5 s of warm-up; "
        "proxy pinned to CPU 0, upstream and "
        f"client to CPU 1: {meta['pinned']}.",
        "",
        "Added latency against direct, in ms (median over rounds of each round's p50 and p99 "
        "of the whole response):",
        "",
    ]
    head = ["scenario", "conc.", "direct p50"] + [f"{t} p50 / p99" for t in peers]
    if "pvisor" in peers and "bare" in peers:
        head.append("pvisor / bare (p50)")
    if "pvisor" in peers and "mitmdump" in peers:
        head.append("pvisor / mitmdump (p50)")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario in SCENARIOS:
        for c in meta["concurrency"]:
            key = f"{scenario}@{c}"
            row = [SCENARIO_NAMES[scenario], str(c), f"{med('direct', key, 'total_p50'):.2f}"]
            for t in peers:
                row.append(f"+{added(t, key, 'total_p50'):.2f} / +{added(t, key, 'total_p99'):.2f}")
            for peer in ("bare", "mitmdump"):
                if "pvisor" in peers and peer in peers:
                    a, b = added("pvisor", key, "total_p50"), added(peer, key, "total_p50")
                    row.append(f"{a / b:.2f}" if a > 0 and b > 0.005 else "n/a")
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "The 200-event stream: time to first byte added (p50 / p99) and the p99 gap between chunks, in ms:",
        "",
    ]
    head = ["conc.", "direct TTFB p50", "direct gap p99"] + [
        f"{t} TTFB added p50 / p99 / gap p99" for t in peers
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in meta["concurrency"]:
        key = f"stream@{c}"
        row = [str(c), f"{med('direct', key, 'ttfb_p50'):.2f}", gap("direct", key)]
        for t in peers:
            row.append(f"+{added(t, key, 'ttfb_p50'):.2f} / +{added(t, key, 'ttfb_p99'):.2f} / {gap(t, key)}")
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Peak RSS of the proxy (MiB, the largest over rounds, a fresh proxy per scenario) "
        "and pvisor's journal:",
        "",
    ]
    head = (
        ["scenario"]
        + [f"{t} RSS" for t in peers]
        + ["pvisor journal bytes / exchange", "exchanges journaled / answered"]
    )
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario in SCENARIOS:
        row = [SCENARIO_NAMES[scenario]]
        for t in peers:
            row.append(
                f"{max((r[f'{t}_info'][scenario].get('peak_rss_kib') or 0) for r in rounds) / 1024:.1f}"
            )
        if "pvisor" in peers:
            infos = [r["pvisor_info"][scenario] for r in rounds]
            per = statistics.median(i["journal_bytes"] / max(1, i["exchanges"]) for i in infos)
            row += [f"{per:,.0f}", " ".join(f"{i['exchanges']}/{i['sent']}" for i in infos)]
        else:
            row += ["-", "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    default_workloads = ",".join(f"{b}@{c}" for b, c in WORKLOADS)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--loadgen",
        choices=["wrk", "python"],
        default="wrk" if shutil.which("wrk") else "python",
        help="load generator: wrk (default when installed) or bench/loadgen.py",
    )
    ap.add_argument("--seconds", type=int, default=4, help="wrk: measured seconds per point")
    ap.add_argument(
        "--requests",
        type=int,
        default=400,
        help="python load generator: requests per point at concurrency 1 (x concurrency/4 above)",
    )
    ap.add_argument(
        "--mitmdump",
        default=shutil.which("mitmdump"),
        help="mitmdump executable (bench/gateway installs one)",
    )
    ap.add_argument("--targets", default="direct,bare,pvisor,mitmdump")
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="PVISOR",
        help="the pvisor executable of target pvisor-baseline (another install, e.g. of the commit "
        "before a change: both measured in the same rounds)",
    )
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument(
        "--workloads",
        default=default_workloads,
        help="comma-separated BODY@CONCURRENCY points, e.g. json@1,stream@32 "
        "(for profiling; the docs table wants all)",
    )
    ap.add_argument(
        "--from-results",
        metavar="JSON",
        help="rebuild the table (and docs) from a saved bench/results file, measuring nothing",
    )
    ap.add_argument(
        "--suite",
        choices=["wrk", "agents"],
        default="wrk",
        help="wrk: the JSON and stream workloads (default); "
        "agents: the coding-agent scenarios of bench/scenarios.py",
    )
    args = ap.parse_args()
    if args.suite == "agents":
        targets = args.targets.split(",")
        if "mitmdump" in targets and not args.mitmdump:
            sys.exit(
                "mitmdump not found: run bench/gateway (installs it), or pass --targets without mitmdump"
            )
        up = subprocess.Popen(
            [*pin(1), sys.executable, str(HERE / "upstream.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            raw = agent_suite(args, targets, wait_listening(up, "upstream"))
        finally:
            stop(up)
        results_dir = HERE / "results"
        results_dir.mkdir(exist_ok=True)
        (results_dir / f"gateway-agents-{raw['meta']['date']}.json").write_text(
            json.dumps({"raw": raw}, indent=1)
        )
        table = agent_markdown(raw, targets)
        print(table)
        if not args.no_docs:
            update_docs(table, AGENT_BEGIN, AGENT_END)
        return
    if args.from_results:
        saved = json.loads(Path(args.from_results).read_text())
        raw = saved["raw"]
        targets = list(raw["rounds"][0].keys() - {"pvisor_info"})
        targets = [t for t in ("direct", "bare", "bare-uv", *PVISOR_VARIANTS, "mitmdump") if t in targets]
        WORKLOADS[:] = [(k.split("@")[0], int(k.split("@")[1])) for k in raw["rounds"][0]["direct"]]
        table = markdown(summarise(raw, targets), raw, targets)
        print(table)
        if not args.no_docs:
            update_docs(table)
        return
    targets = args.targets.split(",")
    if "pvisor-baseline" in targets and not args.baseline:
        sys.exit("target pvisor-baseline needs --baseline PVISOR (the other install's pvisor)")
    WORKLOADS[:] = [(w.split("@")[0], int(w.split("@")[1])) for w in args.workloads.split(",")]
    if "mitmdump" in targets and not args.mitmdump:
        sys.exit("mitmdump not found: run bench/gateway (installs it), or pass --targets without mitmdump")
    up = subprocess.Popen(
        [*pin(1), sys.executable, str(HERE / "upstream.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    upstream = wait_listening(up, "upstream")
    raw = {
        "meta": {
            "date": dt.date.today().isoformat(),
            "machine": platform.machine() + " " + platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "rounds": args.rounds,
            "requests": args.requests,
            "pinned": bool(pin(0)),
            "loadgen": args.loadgen,
            "seconds": args.seconds,
        },
        "rounds": [],
    }
    try:
        for r in range(args.rounds):
            result: dict = {}
            for name in targets:
                t = Target(name, args, upstream)
                t.start()
                try:
                    result[name] = {}
                    for body, c in WORKLOADS:
                        result[name][f"{body}@{c}"] = measure(t.url, body, c, args)
                        print(
                            f"round {r + 1} {name:9s} {body:6s} c={c:<3d} "
                            f"p50 {result[name][f'{body}@{c}']['p50']:.2f} ms",
                            file=sys.stderr,
                        )
                finally:
                    info = t.stop()
                if name == "pvisor":
                    result["pvisor_info"] = info
            raw["rounds"].append(result)
    finally:
        stop(up)
    summary = summarise(raw, targets)
    table = markdown(summary, raw, targets)
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    (results_dir / f"gateway-{raw['meta']['date']}.json").write_text(
        json.dumps({"raw": raw, "summary": summary}, indent=1)
    )
    print(table)
    if not args.no_docs:
        update_docs(table)


if __name__ == "__main__":
    main()
