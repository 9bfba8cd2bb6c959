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

The agents' own run time varies by hundreds of milliseconds, more than a step's share of the
sandbox, so ``--hop`` measures what the sandbox adds to each request by itself: the relay
(:mod:`pvisor.session.relay`, as pvisor starts it) in front of an HTTP server that listens on a
TCP port and on a Unix socket, and a client that sends ``--requests`` keep-alive requests with a
64 KiB body, alternately straight to the TCP port and through the relay's listener (TCP, relay,
Unix socket); reported: the median round trip of each and their difference.

    python bench/sandbox_bench.py --hop [--requests 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import shutil
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PVISOR = str(Path(sys.executable).with_name("pvisor"))


def _pvisor(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([PVISOR, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"pvisor {' '.join(args[:4])} ... failed: {proc.stderr[-2000:]}")
    return proc


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as the gateway (aiohttp) sets TCP_NODELAY

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        reply = body[:1024]
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _UnixHandler(_Handler):
    disable_nagle_algorithm = False  # no TCP on a Unix socket

    def address_string(self) -> str:
        return "unix"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(direct: int, relayed: int, requests: int, out: str) -> None:
    """The relay's agent: round trips alternately to ``direct`` and ``relayed``, written to ``out``."""
    body = b"x" * 65536
    conns = {name: http.client.HTTPConnection("127.0.0.1", port) for name, port in (("direct", direct),
             ("relayed", relayed))}  # fmt: skip
    times: dict[str, list[float]] = {"direct": [], "relayed": []}
    for i in range(requests):
        for name in ("direct", "relayed") if i % 2 == 0 else ("relayed", "direct"):
            t = time.perf_counter()
            conns[name].request("POST", "/", body=body)
            conns[name].getresponse().read()
            times[name].append((time.perf_counter() - t) * 1000)
    Path(out).write_text(json.dumps(times))


def hop(requests: int, json_out: str | None) -> None:
    root = Path(tempfile.mkdtemp(prefix="pvisor-hop-", dir="/tmp"))
    tcp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    unix_path = str(root / "gw.sock")
    unix = _UnixServer(unix_path, _UnixHandler)
    for server in (tcp, unix):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    relayed = _free_port()
    times_file = str(root / "times.json")
    client = [sys.executable, __file__, "--client", str(tcp.server_address[1]), str(relayed), str(requests),
              times_file]  # fmt: skip
    config = tempfile.TemporaryFile()  # the relay reads its configuration from a descriptor
    doc = {"argv": client, "listen": [["127.0.0.1", relayed, unix_path]], "ready_fd": -1, "grace": 5.0,
           "stray_grace": 2.0, "skip_tmp": [], "tmp_listed": 0}  # fmt: skip
    config.write(json.dumps(doc).encode())
    config.flush()
    config.seek(0)
    fd = config.fileno()
    from pvisor.session import relay

    argv = [sys.executable, "-I", "-S", relay.__file__, str(fd)]
    subprocess.run(argv, check=True, timeout=600, pass_fds=(fd,))
    config.close()
    times = json.loads(Path(times_file).read_text())
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {"requests": requests, "body_bytes": 65536, "median_ms": med,
              "relay_added_ms": med["relayed"] - med["direct"]}  # fmt: skip
    text = json.dumps(report, indent=2)
    print(text)
    if json_out:
        Path(json_out).write_text(text + "\n")
    tcp.shutdown()
    unix.shutdown()
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        direct, relayed, requests, out = sys.argv[2:6]
        _client(int(direct), int(relayed), int(requests), out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--hop", action="store_true", help="measure the relay's hop alone")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--codex", help="the Codex executable")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.hop:
        hop(a.requests, a.json)
        return
    if not a.codex:
        ap.error("--codex PATH is needed (or --hop)")
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
