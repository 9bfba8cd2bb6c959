"""What workspace snapshots cost a request: the walk, and the hold of the answer's first byte
(docs/benchmarks.md, "Workspace snapshots: the hold before the first byte").

Synthetic workspaces (``--files`` files of 1 to 8 KiB in nested directories, a few executables
and symlinks, as a small repository) are made once and left to age past the racy window (files
changed in the last 2 s are read again). Two gateways answer the same requests with the same
fixed reply, interleaved round by round:

- **baseline**: no workspace (what every request costs without snapshots);
- **snapshots**: ``--workspace`` set, so every request starts a walk and its answer's first
  byte waits for it.

Per workspace size, three scenarios: **cold** (a new gateway: every file is read and hashed),
**unchanged** (the same gateway again: every file is trusted by its inode, size and times),
**one changed** (one file rewritten before each request, as a tool step does). Each also with a
model that thinks ``--think`` ms before its first byte (the responder waits), where the walk
runs meanwhile. Reported: time to first byte at the client (median over requests and rounds),
what the snapshots gateway adds to the baseline's, the walk and the hold (journal columns
``walk_us`` and ``hold_us``).

    python bench/snapshot_bench.py [--files 200 2000 20000] [--requests 20] [--rounds 3]
        [--think 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from pvisor.gateway.proxy import Gateway, GatewayConfig, finalize_response
from pvisor.gateway.responder import Serve, ServedBy
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

from playback_bench import Loop  # bench/ is the script's directory: on the path

REPLY = b'{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}]}'


class Reply:
    """Answers every request with :data:`REPLY` after ``think`` seconds (a model's thinking time)."""

    def __init__(self, think: float) -> None:
        self.think = think

    async def respond(self, request):
        if self.think:
            await asyncio.sleep(self.think)
        return Serve(200, [("Content-Type", "application/json")], body=REPLY, served_by=ServedBy.SCRIPTED)


def make_workspace(root: Path, files: int, seed: int = 1) -> int:
    """A tree of ``files`` files (1-8 KiB, 20 per directory, 3 levels), 1 in 50 executable, 1 in
    100 a symlink. Returns its total bytes."""
    rnd = random.Random(seed)
    total = 0
    for i in range(files):
        d = root / f"pkg{i // 400}" / f"mod{(i // 20) % 20}"
        d.mkdir(parents=True, exist_ok=True)
        size = rnd.randint(1024, 8192)
        p = d / f"file{i}.py"
        p.write_bytes(rnd.randbytes(size // 2).hex().encode()[:size])
        total += size
        if i % 50 == 0:
            os.chmod(p, 0o755)
        if i % 100 == 0:
            os.symlink(p.name, d / f"link{i}")
    return total


def requests(url: str, n: int, before: callable = None) -> list[float]:
    """Time to first byte (s) of ``n`` requests on one connection; ``before()`` runs before each."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    out = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        conn.request("POST", "/v1/messages", body=b'{"model":"m","messages":[]}')
        resp = conn.getresponse()  # the status line is the first byte the relay writes
        out.append(time.perf_counter() - t0)
        assert resp.read() == REPLY
    conn.close()
    return out


def measure(lt: Loop, tmp: Path, ws: Path | None, think: float, n: int, changing: Path | None, tag: str):
    """(TTFBs, walk_us list, hold_us list) of one gateway: ``n`` requests (the first is cold)."""
    path = tmp / f"{tag}.sqlite"
    with Journal.open(path, finalize=finalize_response) as j:
        gw = Gateway(GatewayConfig(port=0, offline=True, workspace=ws), j, Reply(think))
        url = lt.run(gw.start())
        counter = [0]

        def change() -> None:
            counter[0] += 1
            changing.write_text(f"edit {counter[0]}\n")

        ttfb = requests(url, n, change if changing is not None else None)
        lt.run(gw.stop())
    walks, holds = [], []
    if ws is not None:
        with JournalReader(path) as r:
            for s in r.snapshots(gw.run):
                walks.append(s.walk_us / 1000)
                holds.append((s.hold_us or 0) / 1000)
    path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return ttfb, walks, holds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, nargs="+", default=[200, 2000, 20000])
    ap.add_argument(
        "--requests", type=int, default=20, help="requests per gateway (the first one is the cold walk)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--think", type=float, default=50.0, help="the thinking model's delay before its first byte, ms"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-snapshot-bench-"))
    lt = Loop()
    figures: dict = {
        "requests": args.requests,
        "rounds": args.rounds,
        "think_ms": args.think,
        "workspaces": [],
    }
    try:
        for files in args.files:
            ws = tmp / f"ws-{files}"
            ws.mkdir()
            size = make_workspace(ws, files)
            changing = ws / "pkg0" / "mod0" / "file0.py"
            time.sleep(2.1)  # past the racy window: the files are old enough to be trusted unread
            row: dict = {"files": files, "bytes": size}
            for think in (0.0, args.think / 1000):
                for scenario in ("unchanged", "one_changed"):
                    base: list[float] = []
                    snap: list[float] = []
                    cold_walk: list[float] = []
                    walks: list[float] = []
                    holds: list[float] = []
                    cold_ttfb: list[float] = []
                    for r in range(args.rounds):
                        b, _, _ = measure(lt, tmp, None, think, args.requests, None, f"base-{files}-{r}")
                        t, w, h = measure(
                            lt,
                            tmp,
                            ws,
                            think,
                            args.requests,
                            changing if scenario == "one_changed" else None,
                            f"snap-{files}-{r}",
                        )
                        base += b[1:]
                        snap += t[1:]
                        cold_ttfb.append(t[0])
                        cold_walk.append(w[0])
                        walks += w[1:]
                        holds += h[1:]
                    key = f"{scenario}_think{int(think * 1000)}"
                    row[key] = {
                        "baseline_ttfb_ms": statistics.median(base) * 1000,
                        "snapshots_ttfb_ms": statistics.median(snap) * 1000,
                        "added_ms": (statistics.median(snap) - statistics.median(base)) * 1000,
                        "walk_ms": statistics.median(walks),
                        "hold_ms": statistics.median(holds),
                        "cold_walk_ms": statistics.median(cold_walk),
                        "cold_ttfb_ms": statistics.median(cold_ttfb) * 1000,
                    }
                    f = row[key]
                    print(
                        f"{files:6d} files {size / 1e6:6.1f} MB  {scenario:11s} "
                        f"think {think * 1000:3.0f} ms: "
                        f"ttfb {f['baseline_ttfb_ms']:7.2f} -> {f['snapshots_ttfb_ms']:7.2f} ms "
                        f"(+{f['added_ms']:.2f}), walk {f['walk_ms']:.2f} ms, hold {f['hold_ms']:.2f} ms; "
                        f"cold walk {f['cold_walk_ms']:.1f} ms"
                    )
            figures["workspaces"].append(row)
            shutil.rmtree(ws)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
