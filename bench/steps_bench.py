"""How long `pvisor journal steps` takes on long runs (docs/benchmarks.md, "Steps of a long run").

Builds one synthetic Chat Completions run per size into a fresh journal: a 2,000-character
system prompt, one tool with a 20,000-character description, and per step one tool call and a
1,000-character result, each request repeating the whole conversation as agents do (so the
request bodies of a run of N steps add up to about N^2/2 KB). Then runs the installed
`pvisor journal steps RUN` on it (output to /dev/null) and reports the wall time and the peak
resident memory of that process, the best of ``--repeat`` runs.

    python bench/steps_bench.py [--steps 200,400,1000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "d" * 20000,
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def reply(message: dict, finish: str) -> bytes:
    return orjson.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "model": "g",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        }
    )


def build(path: Path, steps: int) -> str:
    run = f"big{steps}"
    messages = [{"role": "system", "content": "S" * 2000}, {"role": "user", "content": "task"}]
    with Journal.open(path) as j:
        j.create_run(Run(id=run, agent="bench"))
        for i in range(steps):
            call = {
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": orjson.dumps({"command": f"echo {i}"}).decode(),
                        },
                    }
                ],
            }
            j.record_exchange(
                run,
                "POST",
                "/v1/chat/completions",
                protocol="openai-chat",
                status=200,
                request_body=orjson.dumps({"model": "g", "messages": messages, "tools": [BASH]}),
                response_body=reply(call, "tool_calls"),
            )
            messages = messages + [
                {"role": "assistant", **call},
                {"role": "tool", "tool_call_id": f"call_{i}", "content": "o" * 1000},
            ]
    return run


def measure(path: Path, run: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one `pvisor journal steps` process."""
    pvisor = shutil.which("pvisor", path=os.path.dirname(sys.executable)) or "pvisor"
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as out:
        proc = subprocess.Popen([pvisor, "--journal", str(path), "journal", "steps", run], stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"pvisor journal steps {run} failed")
    return wall, usage.ru_maxrss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="200,400,1000", help="comma-separated run lengths")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the best is reported")
    ap.add_argument("--keep", type=Path, help="build the journals in this directory and keep them")
    ap.add_argument("--build", nargs=2, metavar=("PATH", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:  # in a process of its own, so that the measured processes start small
        build(Path(args.build[0]), int(args.build[1]))
        return
    where = args.keep or Path(tempfile.mkdtemp(prefix="pvisor-steps-bench-"))
    where.mkdir(parents=True, exist_ok=True)
    print(f"{'steps':>6} {'request bytes':>14} {'wall s':>8} {'peak RSS MiB':>13}")
    try:
        for n in (int(s) for s in args.steps.split(",")):
            path = where / f"big{n}.sqlite"
            if not path.exists():
                subprocess.run([sys.executable, __file__, "--build", str(path), str(n)], check=True)
            run = f"big{n}"
            from pvisor.journal.reader import JournalReader

            with JournalReader(path) as r:
                total = sum(e.request_bytes for e in r.exchanges(run))
            best = min((measure(path, run) for _ in range(args.repeat)), key=lambda m: m[0])
            print(f"{n:>6} {total:>14,} {best[0]:>8.2f} {best[1] / 1024:>13.0f}")
    finally:
        if args.keep is None:
            shutil.rmtree(where)


if __name__ == "__main__":
    main()
