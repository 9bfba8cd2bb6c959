"""What ``pvisor journal scrub`` costs on a long run (docs/benchmarks.md, "Journal scrub").

Builds, with the real writer, a journal of one run of N main-loop requests (each repeats the
conversation and adds a turn of about 1 KB, as an agent's requests do; stored as zstd frames
against the previous one) whose tool output shows a key at request 10, so that every later
request holds it. Then times, on a copy each, in the same run:

- ``scrub``: the key replaced (every blob restored and searched, the changed ones re-encoded
  against their new bases, rows renamed, secure_delete, checkpoints and VACUUM, the search
  after), as the library call ``pvisor.journal.scrub.scrub``;
- the baseline ``verify``: ``JournalReader.verify``, which restores every blob once (the floor
  of anything that must read every body), and ``VACUUM INTO`` a new file (a copy).

It reports the seconds, the journal's size before and after, and the peak RSS of the scrub
(``VmHWM`` of a child per measurement, so that each peak is its own; Linux).

    python bench/scrub_bench.py [--requests 500,2000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

KEY = "sk-live-7Qw9Zx3Lm2Pv8Rt5YbBench"


def build(path: Path, requests: int) -> None:
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    messages: list[dict] = [{"role": "system", "content": "You are a coding agent. " * 200}]
    with Journal.open(path) as j:
        j.create_run(Run(id="r-long", agent="codex"))
        for n in range(1, requests + 1):
            out = f"OPENAI_API_KEY={KEY}\n" if n == 10 else f"line {n}\n" * 60
            messages.append({"role": "tool", "content": out})
            body = orjson.dumps({"model": "m", "messages": messages})
            reply = orjson.dumps({"choices": [{"message": {"content": f"step {n}"}}]})
            j.record_exchange("r-long", "POST", "/v1/chat/completions", [], protocol="openai-chat",
                              status=200, request_body=body, response_body=reply)  # fmt: skip
        j.flush()


def measure(what: str, path: Path) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of ``what`` on ``path``, in a child process."""
    code = f"""
import sys, time
from pathlib import Path
path = Path({str(path)!r})
t = time.perf_counter()
if {what!r} == "scrub":
    from pvisor.journal.scrub import Pattern, scrub
    rep = scrub(path, Pattern({KEY!r}))
    assert rep.clean and rep.blobs_changed, rep
elif {what!r} == "verify":
    from pvisor.journal.reader import JournalReader
    with JournalReader(path) as r:
        assert r.verify().ok
else:
    import sqlite3
    c = sqlite3.connect(path)
    c.execute("VACUUM INTO ?", (str(path) + ".copy",))
    c.close()
took = time.perf_counter() - t
# VmHWM: this process's own peak (ru_maxrss would carry the parent's over the exec)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1]
print(took, hwm)
"""
    # run beside the journal: from the checkout, its pvisor/ directory would shadow the installed package
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=path.parent)
    if proc.returncode != 0:
        sys.exit(f"scrub_bench: the {what} measurement failed:\n{proc.stderr}")
    seconds, rss = proc.stdout.split()
    return float(seconds), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", default="500,2000", help="comma-separated run lengths")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many")
    args = ap.parse_args()
    print("| requests | journal | decoded bodies | scrub | RSS | baseline: verify | VACUUM INTO | after |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.requests.split(",")]:
            src = Path(tmp, f"src-{n}", "journal.sqlite")
            src.parent.mkdir()
            build(src, n)
            size = os.path.getsize(src)
            from pvisor.journal.reader import JournalReader

            with JournalReader(src) as r:
                decoded = r.verify().blob_bytes_restored
            best: dict[str, tuple[float, int]] = {}
            after = 0
            for _ in range(args.repeat):
                for what in ("scrub", "verify", "copy"):
                    work = Path(tmp, f"work-{n}-{what}")
                    shutil.rmtree(work, ignore_errors=True)
                    shutil.copytree(src.parent, work)
                    s, rss = measure(what, work / "journal.sqlite")
                    if what == "scrub":
                        after = os.path.getsize(work / "journal.sqlite")
                    if what not in best or s < best[what][0]:
                        best[what] = (s, rss)
            mb = 1e6
            print(
                f"| {n:,} | {size / mb:.1f} MB | {decoded / mb:,.0f} MB | {best['scrub'][0]:.2f} s | "
                f"{best['scrub'][1] / 1024:.0f} MiB | {best['verify'][0]:.2f} s | {best['copy'][0]:.2f} s | "
                f"{after / mb:.1f} MB |"
            )


if __name__ == "__main__":
    main()
