"""Intercept mode's added latency, against the reverse proxy and against plain mitmdump.

One HTTPS upstream (bench/upstream.py with a certificate of its own, made with the openssl CLI)
and one sequential client (the standard library's http.client over one kept-alive connection,
as an agent's SDK does), the same requests through four paths, one request per path in turn:

- ``direct``: HTTPS to the upstream;
- ``reverse``: the pvisor gateway at its own URL (a base-URL override), forwarding over HTTPS;
- ``mitmdump``: plain ``mitmdump`` as a forward proxy, no addon (its CA trusted by the client,
  the upstream's CA by mitmdump): what intercepting at all costs;
- ``intercept``: ``pvisor gateway --mode intercept`` (mitmdump, pvisor's addon, the gateway,
  the journal) with the upstream's host given as ``--intercept-host``.

A request's latency is from sending it to the last byte of its response; "added" is a path's
median minus ``direct``'s. The aim of issue 18: intercept adds at most 1.3x what mitmdump adds.

Usage: bench/intercept [--rounds 5] [--requests 200] [--workloads json,stream]
       (python bench/intercept_latency.py --mitmdump PATH ... from a venv with pvisor)
Writes bench/results/intercept-DATE.json and prints the table of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gateway_bench import free_port, wait_port  # noqa: E402  (bench/: the gateway benchmark's helpers)

REQUEST = {
    "json": json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    "stream": json.dumps(
        {"model": "bench-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode(),
}
PATHS = ("direct", "reverse", "mitmdump", "intercept")


def make_cert(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), with the openssl CLI."""
    cert, key = where / "upstream.pem", where / "upstream.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def read_line(proc: subprocess.Popen, prefix: str) -> str:
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode().strip()
        if line.startswith(prefix):
            return line[len(prefix) :]
    raise SystemExit(f"{proc.args[0]} ended before printing {prefix!r}")


class Client:
    """One kept-alive connection along one path; :meth:`once` times one request (seconds)."""

    def __init__(self, kind: str, up_port: int, ctx: ssl.SSLContext, via: int | None = None) -> None:
        if kind == "plain":  # the reverse gateway: plain HTTP to it
            self.conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", via, timeout=30)
        elif via is not None:  # a forward proxy: CONNECT, then TLS to what it presents
            self.conn = http.client.HTTPSConnection("127.0.0.1", via, context=ctx, timeout=30)
            self.conn.set_tunnel("127.0.0.1", up_port)
        else:
            self.conn = http.client.HTTPSConnection("127.0.0.1", up_port, context=ctx, timeout=30)

    def once(self, body: bytes) -> float:
        t0 = time.perf_counter()
        self.conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-bench-not-a-key"},
        )
        resp = self.conn.getresponse()
        data = resp.read()
        elapsed = time.perf_counter() - t0
        if resp.status != 200 or not data:
            raise SystemExit(f"status {resp.status} ({data[:200]!r})")
        return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mitmdump", default=os.environ.get("PVISOR_MITMDUMP", "mitmdump"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200, help="requests per path, workload and round")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--workloads", default="json,stream")
    ap.add_argument(
        "--event-loop", default="asyncio", choices=("asyncio", "uvloop"), help="of both pvisor gateways"
    )
    ap.add_argument(
        "--output", default=None, help="the JSON results (default bench/results/intercept-DATE.json)"
    )
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-intercept-bench-"))
    cert, key = make_cert(tmp)
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "SSL_CERT_FILE": str(cert), "PVISOR_MITMDUMP": a.mitmdump}
    env["PVISOR_CA_DIR"] = str(tmp / "pvisor-ca")
    try:
        up = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "upstream.py"),
                "--port",
                "0",
                "--certfile",
                str(cert),
                "--keyfile",
                str(key),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its traceback when it is terminated at the end
        )
        procs.append(up)
        up_port = int(read_line(up, "listening https://127.0.0.1:"))
        pvisor = [
            sys.executable,
            "-m",
            "pvisor",
            "--journal",
            str(tmp / "journal.sqlite"),
            "gateway",
            "--port",
            "0",
            "--event-loop",
            a.event_loop,
        ]
        rev = subprocess.Popen(
            [*pvisor, "--upstream", f"openai=https://127.0.0.1:{up_port}"], stdout=subprocess.PIPE, env=env
        )
        procs.append(rev)
        rev_port = int(read_line(rev, "listening http://127.0.0.1:"))
        mitm_port = free_port()
        mitm = subprocess.Popen(
            [a.mitmdump, "--quiet", "--listen-host", "127.0.0.1", "--listen-port", str(mitm_port),
             "--set", f"confdir={tmp / 'mitm-ca'}", "--set", f"ssl_verify_upstream_trusted_ca={cert}"],
            stdout=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        procs.append(mitm)
        wait_port(mitm_port, 60.0)  # mitmdump loads its CA first
        icp = subprocess.Popen(
            [*pvisor, "--mode", "intercept", "--intercept-host", f"127.0.0.1:{up_port}"],
            stdout=subprocess.PIPE,
            env=env,
        )
        procs.append(icp)
        icp_port = int(read_line(icp, "listening http://127.0.0.1:"))
        direct_ctx = ssl.create_default_context(cafile=str(cert))
        mitm_ctx = ssl.create_default_context(cafile=str(tmp / "mitm-ca" / "mitmproxy-ca-cert.pem"))
        icp_ctx = ssl.create_default_context(cafile=str(tmp / "pvisor-ca" / "mitmproxy-ca-cert.pem"))
        clients = {
            "direct": Client("tls", up_port, direct_ctx),
            "reverse": Client("plain", up_port, direct_ctx, rev_port),
            "mitmdump": Client("tls", up_port, mitm_ctx, mitm_port),
            "intercept": Client("tls", up_port, icp_ctx, icp_port),
        }  # fmt: skip
        samples: dict[str, dict[str, list[float]]] = {w: {p: [] for p in PATHS} for w in workloads}
        for w in workloads:
            for p in PATHS:
                for _ in range(a.warmup):
                    clients[p].once(REQUEST[w])
        for r in range(a.rounds):
            for w in workloads:
                # one request per path in turn: the machine's drift falls on every path alike
                for _ in range(a.requests):
                    for p in PATHS:
                        samples[w][p].append(clients[p].once(REQUEST[w]))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    rows = []
    for w in workloads:
        med = {p: statistics.median(samples[w][p]) * 1000 for p in PATHS}
        p99 = {p: statistics.quantiles(samples[w][p], n=100)[98] * 1000 for p in PATHS}
        added = {p: med[p] - med["direct"] for p in PATHS if p != "direct"}
        rows.append(
            {
                "workload": w,
                "requests": len(samples[w]["direct"]),
                "p50_ms": {p: round(v, 3) for p, v in med.items()},
                "p99_ms": {p: round(v, 3) for p, v in p99.items()},
                "added_ms": {p: round(v, 3) for p, v in added.items()},
                "intercept_over_mitmdump": round(added["intercept"] / added["mitmdump"], 3),
                "intercept_over_reverse": round(added["intercept"] / added["reverse"], 3),
            }
        )
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rounds": a.rounds,
        "requests_per_round": a.requests,
        "mitmdump": subprocess.run([a.mitmdump, "--version"], capture_output=True, text=True).stdout.split(
            "\n"
        )[0],
        "cpus": os.cpu_count(),
        "event_loop": a.event_loop,
        "rows": rows,
    }
    out = Path(a.output) if a.output else HERE / "results" / f"intercept-{doc['date'][:10]}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print("| workload | direct p50 | reverse added | mitmdump added | intercept added | intercept / mitmdump "
          "| intercept / reverse | p99 direct / reverse / mitmdump / intercept |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        m, ad, q = row["p50_ms"], row["added_ms"], row["p99_ms"]
        print(
            f"| {row['workload']} | {m['direct']:.2f} ms | +{ad['reverse']:.2f} ms "
            f"| +{ad['mitmdump']:.2f} ms "
            f"| +{ad['intercept']:.2f} ms | {row['intercept_over_mitmdump']:.2f}x "
            f"| {row['intercept_over_reverse']:.2f}x "
            f"| {q['direct']:.2f} / {q['reverse']:.2f} / {q['mitmdump']:.2f} / {q['intercept']:.2f} ms |"
        )
    print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
