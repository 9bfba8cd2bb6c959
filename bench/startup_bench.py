"""Start-up of the short commands against the stack floor (issue 21; docs/benchmarks.md
"Replay prepare-only: fidelity and startup").

    python bench/startup_bench.py              # 40 rounds
    python bench/startup_bench.py --rounds 100
    python bench/startup_bench.py --baseline OTHER/bin/pvisor   # and the same commands of another build

Each round runs, in an order shuffled per round, ``python -c 'import click, orjson'`` (the
stack floor: the interpreter and the two libraries every pvisor command loads) and each
command as a user types it (the ``pvisor`` script beside this interpreter): ``--version``,
``journal ls`` of a journal with one run, ``trajectory show`` of a small Codex rollout with and
without ``--agent`` (detection asks every adapter), and ``replay --prepare-only`` of it. Wall
time from launch to exit; the table gives medians and each median over the floor's. With
``--baseline`` the same commands of another build (an earlier commit installed in a venv of its
own) run in the same rounds, for a before-and-after in one run. Run it on an idle machine: the
ratios hold under load better than the times, not perfectly.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROLLOUT = HERE.parent / "tests" / "corpus" / "native" / "codex" / "real-0.171.0_single-then-resume.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--baseline", metavar="PVISOR", help="another build's pvisor script, measured beside")
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("pvisor"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        journal = work / "journal.sqlite"
        from pvisor.journal.model import Run
        from pvisor.journal.writer import Journal

        with Journal.open(journal) as j:
            j.create_run(Run(id="r-bench", agent="codex"))
            j.record_exchange("r-bench", "POST", "/v1/responses", [], protocol="openai-responses", status=200,
                              request_body=b"{}")  # fmt: skip
        commands = {
            "stack floor: python -c 'import click, orjson'": [sys.executable, "-c", "import click, orjson"],
            "pvisor --version": [exe, "--version"],
            "pvisor journal ls": [exe, "--journal", str(journal), "journal", "ls"],
            "pvisor trajectory show FILE --agent codex": [
                exe,
                "trajectory",
                "show",
                str(ROLLOUT),
                "--agent",
                "codex",
            ],
            "pvisor trajectory show FILE (detected)": [exe, "trajectory", "show", str(ROLLOUT)],
            "pvisor replay --prepare-only": [
                exe,
                "replay",
                "--agent",
                "codex",
                "--trajectory",
                str(ROLLOUT),
                "--after-step",
                "1",
                "--prepare-only",
                "--output",
                str(work / "out"),
                "--force",
            ],  # fmt: skip
        }
        if args.baseline:
            base = {
                f"baseline: {k}": [args.baseline, *v[1:]]
                for k, v in commands.items()
                if k.startswith("pvisor")
            }
            for k, v in base.items():  # its own output directory
                commands[k] = [str(work / "out-base") if x == str(work / "out") else x for x in v]
        times: dict[str, list[float]] = {k: [] for k in commands}
        rng = random.Random(21)
        for _ in range(args.rounds):
            order = list(commands)
            rng.shuffle(order)
            for name in order:
                t = time.perf_counter()
                proc = subprocess.run(commands[name], capture_output=True, cwd=work)
                times[name].append((time.perf_counter() - t) * 1000)
                if proc.returncode != 0:
                    sys.exit(f"startup_bench: {name} failed: {proc.stderr.decode()[-1000:]}")
    floor = statistics.median(times["stack floor: python -c 'import click, orjson'"])
    print(
        f"{args.rounds} rounds, shuffled, Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}:"
    )
    print()
    print("| command | median ms | / stack floor |")
    print("|---|---:|---:|")
    for name, v in times.items():
        m = statistics.median(v)
        print(f"| {name} | {m:.1f} | {m / floor:.2f}x |")


if __name__ == "__main__":
    main()
