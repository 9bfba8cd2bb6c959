"""What the journal writer costs per exchange, with nothing else running, against the floor of
the SQLite work it cannot avoid (docs/benchmarks.md, "The writer's own cost, and its floor").

The exchange is the gateway benchmark's 10 KB JSON one (``bench/upstream.py``'s body, the
request of ``bench/loadgen.py``), with its real headers. Three measurements, each in its own
fresh journal, interleaved round by round:

- **journal**: ``Journal`` (the writer thread) given ``--exchanges`` exchanges through
  ``begin_exchange``/``finish_exchange`` by the calling thread, then closed; reported: the
  writer thread's CPU time (``/proc/self/task/TID/stat``) per exchange. ``--unique`` makes every
  response body differ (a new id per answer, as a real model's), so each one is hashed,
  compressed and inserted; without it the body repeats, as in the gateway benchmark, and only
  its hash and lookup are paid.
- **floor**: the same rows written by plain ``sqlite3`` calls: per exchange the sha256 of both
  bodies, their lookups, the compression and insert of a body not stored yet, the exchange row
  and its event, in transactions of the writer's batch size, every other parameter computed
  beforehand. What no writer of this schema can go below in Python.
- **producer**: the calling thread's CPU per exchange in the journal measurement (what the
  gateway's event loop pays to hand an exchange over).

    python bench/writer_cost.py [--exchanges 20000] [--rounds 3] [--unique]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import BODIES  # noqa: E402  (bench/ on the path above)
from pvisor.journal import blobs  # noqa: E402  (bench/ on the path above)
from pvisor.journal.writer import Journal  # noqa: E402  (bench/ on the path above)
from upstream import JSON_BODY  # noqa: E402  (bench/ on the path above)

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
REQUEST_HEADERS = [
    ("Host", "127.0.0.1:8080"),
    ("Content-Type", "application/json"),
    ("Authorization", "Bearer sk-bench-not-a-secret"),
    ("Content-Length", str(len(BODIES["json"]))),
]
RESPONSE_HEADERS = [
    ("Content-Type", "application/json; charset=utf-8"),
    ("Content-Length", str(len(JSON_BODY))),
]
EXCHANGE_INSERT = (
    "INSERT OR REPLACE INTO exchanges(id, run_id, attempt, seq, protocol, method, path, query,"
    " request_headers, secret_fingerprints, dropped_headers, request_encoding, request_body,"
    " request_bytes, status, response_headers, response_body, response_final, streamed, chunk_timings,"
    " outcome, error, started_ms, headers_us, first_byte_us,"
    " ended_us, bytes_received, bytes_delivered, writer_id, lane_pos, served_by, flags, forwarded_body)"
    " VALUES (" + ",".join("?" * 33) + ")"
)  # the writer's own statement (journal/writer.py, _write_exchange)
BATCH = 60  # exchanges per transaction: what the writer gathers at ~3,000 exchanges/s


def thread_cpu_s(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def response(i: int, unique: bool) -> bytes:
    return JSON_BODY.replace(b"chatcmpl-bench", b"chatcmpl-%08d" % i) if unique else JSON_BODY


def journal_run(path: Path, n: int, unique: bool) -> tuple[float, float]:
    """(writer thread CPU s, producer CPU s) for ``n`` exchanges."""
    bodies = [response(i, unique) for i in range(n)]
    journal = Journal.open(path)
    tid = journal._thread.native_id
    before = thread_cpu_s(tid)
    producer0 = time.thread_time()
    for body in bodies:
        p = journal.begin_exchange(
            "r-bench", "POST", "/v1/chat/completions", REQUEST_HEADERS, protocol="openai_chat"
        )
        journal.finish_exchange(
            p,
            status=200,
            response_headers=RESPONSE_HEADERS,
            request_body=BODIES["json"],
            response_body=body,
            headers_us=900,
            first_byte_us=950,
            served_by="upstream",
        )
    producer = time.thread_time() - producer0
    journal.flush(timeout=600)
    writer = thread_cpu_s(tid) - before
    journal.close()
    return writer, producer


def floor_run(path: Path, n: int, unique: bool) -> float:
    """CPU s of the floor: what no writer of this schema avoids (each body's sha256, the
    compression of a body not stored yet, the statements), with every other parameter made
    beforehand."""
    Journal.open(path).close()  # the schema
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    request = BODIES["json"]
    rows = []
    for i in range(n):
        body = response(i, unique)
        rows.append(
            (
                body,
                [
                    f"x-{i:08d}",
                    "r-bench",
                    1,
                    i + 1,
                    "openai_chat",
                    "POST",
                    "/v1/chat/completions",
                    "",
                    '[["Host","127.0.0.1:8080"]]',
                    "{}",
                    "[]",
                    None,
                    None,
                    len(request),
                    200,
                    '{"content-type":"application/json"}',
                    None,
                    None,
                    0,
                    None,
                    "ok",
                    None,
                    time.time() * 1000,
                    900,
                    950,
                    1000,
                    len(body),
                    len(body),
                    1,
                    i,
                    "upstream",
                    "[]",
                    None,
                ],
            )
        )
    conn.execute("INSERT INTO runs(id, created_ms) VALUES ('r-bench', 0)")
    t0 = time.thread_time()
    for start in range(0, n, BATCH):
        conn.execute("BEGIN IMMEDIATE")
        events = []
        for body, row in rows[start : start + BATCH]:
            shas = []
            for data in (request, body):
                sha = blobs.sha256_hex(data)
                if conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)).fetchone() is None:
                    codec, stored = blobs.encode(data, None)
                    conn.execute(
                        "INSERT INTO blobs(sha256, size, codec, base, data) VALUES (?, ?, ?, NULL, ?)",
                        (sha, len(data), codec, stored),
                    )
                shas.append(sha)
            row[12], row[16] = shas
            conn.execute(EXCHANGE_INSERT, row)
            events.append((0, "exchange.finished", "r-bench", row[0], 1, '{"outcome":"ok","status":200}'))
        conn.executemany(
            "INSERT INTO events(ts_ms, kind, run_id, exchange_id, writer_id, data) VALUES (?,?,?,?,?,?)",
            events,
        )
        conn.execute("COMMIT")
    cpu = time.thread_time() - t0
    conn.close()
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exchanges", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unique", action="store_true", help="every response body differs (a new id per answer)")
    args = ap.parse_args()
    results: dict[str, list[float]] = {"journal writer": [], "producer": [], "floor": []}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            writer, producer = journal_run(Path(tmp) / "j.sqlite", args.exchanges, args.unique)
            floor = floor_run(Path(tmp) / "f.sqlite", args.exchanges, args.unique)
        for name, s in (("journal writer", writer), ("producer", producer), ("floor", floor)):
            results[name].append(s / args.exchanges * 1e6)
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.1f} µs" for k, v in results.items()), flush=True)
    kind = "unique" if args.unique else "repeated"
    print(f"median over {args.rounds} rounds, {args.exchanges} exchanges each, response bodies {kind}:")
    for name, values in results.items():
        print(f"  {name:15s} {statistics.median(values):6.1f} µs of CPU per exchange")
    assert threading.active_count() == 1


if __name__ == "__main__":
    main()
