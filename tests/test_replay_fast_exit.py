"""``pvisor replay`` run as the process ends with ``os._exit`` after flushing its output and
running the ``atexit`` handlers (pvisor/cli.py ``_exit``: the interpreter's teardown is a sixth
of a prepare-only's run time); exit codes and output are those of the usual exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus" / "native" / "claude-code" / "spotter_short.jsonl"

SCRIPT = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("atexit handler ran\\n"))
sys.argv = ["pvisor", *sys.argv[1:]]
from pvisor.cli import main
main()
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120
    )


def test_success_flushes_stdout_and_runs_atexit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _run(
        "replay",
        "--agent",
        "claude-code",
        "--trajectory",
        str(CORPUS),
        "--after-step",
        "1",
        "--prepare-only",
        "--output",
        str(out),
        "--result",
        "-",
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["status"] == "ok"  # the whole document, flushed before os._exit
    assert p.stderr.startswith("prepared ") and p.stderr.endswith("atexit handler ran\n")
    assert json.loads((out / "result.json").read_text())["status"] == "ok"


def test_failure_keeps_its_exit_code(tmp_path: Path) -> None:
    p = _run(
        "replay",
        "--agent",
        "claude-code",
        "--trajectory",
        str(CORPUS),
        "--after-step",
        "9",
        "--prepare-only",
        "--output",
        str(tmp_path / "o"),
    )
    assert p.returncode == 65
    assert "after_step_out_of_range" in p.stderr and p.stderr.endswith("atexit handler ran\n")


def test_full_stdout_is_exit_74(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        return
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [
                sys.executable,
                "-P",
                "-c",
                SCRIPT,
                "replay",
                "--agent",
                "claude-code",
                "--trajectory",
                str(CORPUS),
                "--after-step",
                "1",
                "--prepare-only",
                "--output",
                str(tmp_path / "o"),
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert p.returncode == 74, p.stderr
