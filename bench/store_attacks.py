"""Attacks on what the journal stores and restores (issue 35, items 4 and 9), the figures of
docs/reliability.md.

``blobs``: a 98 KB zstd frame that inflates to 3 GiB put in place of a request body and of a
snapshot's file (sizes declared 300,000 bytes) in a real journal; each command that reads blobs
runs under an address-space limit (``--limit-mb``, default 2048: below the bomb's 3 GiB, a
safety net) and its exit code, error line (the last line of a traceback) and peak RSS are printed.

``depth``: a manifest of a directory nested N deep (a file at every level) restored by
``pvisor snapshot restore`` from a real journal; prints the wall time per depth.

    .venv-test/bin/python bench/store_attacks.py blobs
    .venv-test/bin/python bench/store_attacks.py depth 1000 2000 4000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from pvisor.journal.snapshots import SnapshotKind, SnapshotRecord
from pvisor.journal.writer import Journal

PVISOR = Path(sys.executable).with_name("pvisor")
GIB = 1 << 30


def rle_bomb(total: int) -> bytes:
    """One zstd frame of RLE blocks decoding to ``total`` zero bytes (4 bytes per 128 KiB)."""
    block = 128 * 1024
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0x00, 7 << 3]))
    n = total // block
    for i in range(n):
        out += ((block << 3) | 2 | (1 if i == n - 1 else 0)).to_bytes(3, "little") + b"\x00"
    return bytes(out)


def body(seed: int, size: int = 300_000) -> bytes:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 9))) for _ in range(800)]
    text = " ".join(rng.choice(words) for _ in range(size // 4)).encode()
    return (b'{"t": "' + text)[: size - 2] + b'"}'


def snapshot(j: Journal, run: str, entries: list[dict], blobs: dict[str, bytes]) -> None:
    manifest = orjson.dumps(
        {"schema": "pvisor.snapshot-manifest/v1", "entries": entries, "warnings": []},
        option=orjson.OPT_SORT_KEYS,
    )
    j.put_blobs(list(blobs.items()))
    j.record_snapshot(
        SnapshotRecord(id="s-" + run[2:].ljust(18, "0")[:18], run=run, attempt=1, kind=SnapshotKind.START,
                       driver="filesystem", taken_ms=1.0, manifest=manifest,
                       digest=hashlib.sha256(manifest).hexdigest())
    )  # fmt: skip


def run_limited(args: list[str], limit: int, cwd: Path) -> tuple[int, str, float, float]:
    """(exit code, first stderr line, peak RSS in MB, seconds) of ``pvisor ARGS``."""

    def lim() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t = time.perf_counter()
    proc = subprocess.Popen(
        [str(PVISOR), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, preexec_fn=lim
    )
    err = proc.stderr.read().decode("utf-8", "replace")  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    first = lines[-1] if lines and "Traceback" in err else (lines[0] if lines else "")
    return proc.returncode, first, usage.ru_maxrss / 1024, time.perf_counter() - t


def blobs_attack(limit_mb: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="pvisor-bomb-"))
    try:
        path = root / "j.sqlite"
        b, f = body(1), body(2)
        with Journal.open(path) as j:
            ex = j.record_exchange("r-bomb", "POST", "/v1/messages", [], status=200, request_body=b)
            fsha = hashlib.sha256(f).hexdigest()
            snapshot(j, "r-snap", [{"path": "big.txt", "kind": "file", "mode": 420, "size": len(f),
                                    "sha256": fsha}], {fsha: f})  # fmt: skip
        bomb = rle_bomb(3 * GIB)
        with sqlite3.connect(path) as conn:
            for sha in (hashlib.sha256(b).hexdigest(), fsha):
                conn.execute(
                    "UPDATE blobs SET codec = 'zstd', base = NULL, data = ? WHERE sha256 = ?", (bomb, sha)
                )
        conn.close()
        print(f"bomb: {len(bomb):,} bytes of zstd -> {3 * GIB:,} bytes; limit {limit_mb} MB of address space")
        native = (
            Path(__file__).resolve().parent.parent / "tests/corpus/native/claude-code/spotter_short.jsonl"
        )
        (root / "ws").mkdir()
        commands = {
            "journal verify": ["journal", "verify"],
            "journal body": ["journal", "body", ex, "--request"],
            "journal export": ["journal", "export", "r-bomb", "-o", str(root / "e.jsonl")],
            "journal sql": ["journal", "sql", "SELECT length(pvisor_body(request_body)) FROM exchanges"],
            "snapshot restore": ["snapshot", "restore", "r-snap", "--after-step", "0",
                                 "--into", str(root / "i")],
            "replay --workspace-from": ["replay", "--trajectory", str(native), "--agent", "claude-code",
                                        "--after-step", "1", "--replay-only", "--workspace", str(root / "ws"),
                                        "--workspace-from", "r-snap", "--output", str(root / "o")],
        }  # fmt: skip
        print("| command | exit | peak RSS | s | stderr (last line of a traceback) |\n|---|---|---|---|---|")
        for name, args in commands.items():
            code, line, rss, secs = run_limited(["--journal", str(path), *args], limit_mb << 20, root)
            print(
                f"| `{name}` | {code} | {rss:,.0f} MB | {secs:.1f} | {line[:150].replace(str(root), '…')} |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def depth_attack(depths: list[int], timeout: float) -> None:
    print("| depth | entries | manifest bytes | exit | seconds |\n|---|---|---|---|---|")
    for n in depths:
        root = Path(tempfile.mkdtemp(prefix="pvisor-depth-"))
        try:
            data = b"x\n"
            sha = hashlib.sha256(data).hexdigest()
            entries: list[dict] = []
            for d in range(1, n + 1):
                entries.append({"path": "/".join(["d"] * d), "kind": "dir", "mode": 0o755})
                entries.append({"path": "/".join(["d"] * (d - 1) + ["f"]), "kind": "file", "mode": 0o644,
                                "size": 2, "sha256": sha})  # fmt: skip
            entries.sort(key=lambda e: e["path"])
            path = root / "j.sqlite"
            with Journal.open(path) as j:
                snapshot(j, "r-deep", entries, {sha: data})
            size = len(orjson.dumps(entries))
            t = time.perf_counter()
            try:
                proc = subprocess.run(
                    [str(PVISOR), "--journal", str(path), "snapshot", "restore", "r-deep",
                     "--after-step", "0", "--into", str(root / "into")],
                    capture_output=True, timeout=timeout,
                )  # fmt: skip
                code: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                code = f"killed after {timeout:.0f} s"
            print(
                f"| {n:,} | {len(entries):,} | {size:,} | {code} | {time.perf_counter() - t:.2f} |",
                flush=True,
            )
        finally:
            # rm handles any depth (Python's rmtree recurses)
            subprocess.run(["rm", "-rf", str(root)], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="attack", required=True)
    b = sub.add_parser("blobs")
    b.add_argument("--limit-mb", type=int, default=2048)
    d = sub.add_parser("depth")
    d.add_argument("depths", type=int, nargs="*", default=[1000, 2000, 4000])
    d.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    if a.attack == "blobs":
        blobs_attack(a.limit_mb)
    else:
        depth_attack(a.depths, a.timeout)


if __name__ == "__main__":
    main()
