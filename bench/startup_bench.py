"""Start-up of the short commands against the stack floor (issue 21; docs/benchmarks.md
"Replay prepare-only: fidelity and startup").

    python bench/startup_bench.py              # 40 rounds
    python bench/startup_bench.py --rounds 100
    python bench/startup_bench.py --baseline OTHER/bin/pvisor   # and the same commands of another build
    python bench/startup_bench.py --bundle dist/pvisor/pvisor   # and of a bundle (scripts/build-bundle)
    python bench/startup_bench.py --instructions   # instructions under valgrind, once each

Each round runs, in an order shuffled per round, ``python -c 'import click, orjson'`` (the
stack floor: the interpreter and the two libraries every pvisor command loads) and each
command as a user types it (the ``pvisor`` script beside this interpreter): ``--version``,
``journal ls`` of a journal with one run, ``trajectory show`` of a small Codex rollout with and
without ``--agent`` (detection asks every adapter), and ``replay --prepare-only`` of it; and
the floor with the cyclic collector off, as pvisor's entry point imports (pvisor/entry.py), in a
column of its own. Wall time from launch to exit and CPU time (user and system, of the process
and its children); the table gives medians and each median over the floor's. With
``--baseline`` the same commands of another build (an earlier commit's ``pvisor`` script, fairest
from a copy of this venv with ``pip install --no-deps`` of that checkout: the same site-packages
and a script of pip's shape, where a hand-written script that puts a ``pip install --target``
first on ``sys.path`` pays a path entry per import and skips the ``re`` pip's script imports)
run in the same rounds, for a before-and-after in one run; with ``--bundle`` those of a
self-contained build (docs/install.md), against this venv's. Run it on an idle machine: the
ratios hold under load better than the times, not perfectly.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the floor as pvisor's entry point imports it, the cyclic collector off (pvisor/entry.py): shown
#: beside the stack floor so that what the collector alone gives is plain to see
GC_OFF_FLOOR = "floor, collector off: python -c 'import gc; gc.disable(); import click, orjson'"
ROLLOUT = HERE.parent / "tests" / "corpus" / "native" / "codex" / "real-0.171.0_single-then-resume.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--baseline", metavar="PVISOR", help="another build's pvisor script, measured beside")
    ap.add_argument(
        "--bundle", metavar="DIR/pvisor", help="a bundle's executable (scripts/build-bundle), beside"
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="instead of timing rounds, count each command's instructions once under valgrind",
    )
    args = ap.parse_args()
    # the commands run in a directory of their own: paths given relative to the caller's
    args.baseline, args.bundle = (os.path.abspath(p) if p else p for p in (args.baseline, args.bundle))
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
            GC_OFF_FLOOR: [sys.executable, "-c", "import gc; gc.disable(); import click, orjson"],
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
        for label, other in (("baseline", args.baseline), ("bundle", args.bundle)):
            if not other:
                continue
            more = {f"{label}: {k}": [other, *v[1:]] for k, v in commands.items() if k.startswith("pvisor")}
            for k, v in more.items():  # its own output directory
                commands[k] = [str(work / f"out-{label}") if x == str(work / "out") else x for x in v]
        if args.instructions:
            counts = {name: instructions(argv, work) for name, argv in commands.items()}
            floor_name = "stack floor: python -c 'import click, orjson'"
            print(f"Instructions (valgrind callgrind, one run each), Python {sys.version.split()[0]}:")
            print()
            print("| command | instructions | / stack floor | / floor, collector off |")
            print("|---|---:|---:|---:|")
            for name, n in counts.items():
                print(
                    f"| {name} | {n / 1e6:.1f}M | {n / counts[floor_name]:.3f}x "
                    f"| {n / counts[GC_OFF_FLOOR]:.3f}x |"
                )
            return
        times: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        rng = random.Random(21)
        for _ in range(args.rounds):
            order = list(commands)
            rng.shuffle(order)
            for name in order:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                proc = subprocess.run(commands[name], capture_output=True, cwd=work)
                times[name].append((time.perf_counter() - t) * 1000)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                cpu[name].append(used * 1000)
                if proc.returncode != 0:
                    sys.exit(f"startup_bench: {name} failed: {proc.stderr.decode()[-1000:]}")
    floor_name = "stack floor: python -c 'import click, orjson'"
    floor, floor_cpu = statistics.median(times[floor_name]), statistics.median(cpu[floor_name])
    gc_off = statistics.median(times[GC_OFF_FLOOR])
    print(
        f"{args.rounds} rounds, shuffled, Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}:"
    )
    print()
    print(
        "| command | median ms | / stack floor | median CPU ms | CPU / floor CPU | / floor, collector off |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, v in times.items():
        m, c = statistics.median(v), statistics.median(cpu[name])
        print(f"| {name} | {m:.1f} | {m / floor:.2f}x | {c:.1f} | {c / floor_cpu:.2f}x | {m / gc_off:.2f}x |")


def instructions(argv: list[str], cwd: Path) -> int:
    """Instructions ``argv`` executes (valgrind's callgrind, which counts every instruction of
    the process: the same figure on every run, where wall time on a shared machine moves by
    several percent)."""
    # --trace-children: a bundle's bootloader executes itself again; every process counts.
    # A fixed hash seed: with a random one, set and dict probes (an enum class's creation among
    # them) vary from run to run by up to half a million instructions a command
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        cwd=cwd,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.findall(rb"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        sys.exit(f"startup_bench: {' '.join(argv)} under valgrind: {proc.stderr.decode()[-1000:]}")
    return sum(int(n) for n in found)


if __name__ == "__main__":
    main()
