"""``pvisor demo``: the capture path offline (scripted model, gateway, a built-in agent loop that
runs one real shell command), recorded in the journal; two runs record identical bodies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pvisor.journal.reader import JournalReader

PVISOR = Path(sys.executable).with_name("pvisor")


def run_demo(journal: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PVISOR), "--journal", str(journal), "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=journal.parent,
    )


@pytest.fixture(scope="module")
def two_demos(tmp_path_factory) -> list[tuple[Path, subprocess.CompletedProcess]]:
    """Two runs of the demo, each with its own journal."""
    out = []
    for name in ("first", "second"):
        journal = tmp_path_factory.mktemp(name) / "journal.sqlite"
        out.append((journal, run_demo(journal)))
    return out


def test_demo_runs_the_tool_and_journals_two_exchanges(two_demos):
    journal, proc = two_demos[0]
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    # the steps, the tool really ran, and the journal table
    assert "step 1: model says" in out and "step 2: model says" in out and "step 3" not in out
    assert "-> 'hello from pvisor'" in out
    assert "SEQ" in out and "EXCHANGE" in out and "OUTCOME" in out
    with JournalReader(journal) as r:
        [run] = r.runs()
        assert run.agent == "pvisor-demo" and run.mode == "capture"
        assert f"run {run.id}" in out
        exchanges = r.exchanges(run.id)
        assert [(e.protocol, e.method, e.path, e.streamed, e.outcome, e.status) for e in exchanges] == [
            ("anthropic", "POST", "/v1/messages", True, "ok", 200)
        ] * 2
        for e in exchanges:
            assert e.id in out
        # the second request carries the command's real output back to the model
        second = orjson.loads(r.request_body(exchanges[1]))
        [result] = [b for b in second["messages"][-1]["content"] if b["type"] == "tool_result"]
        assert result["content"] == "hello from pvisor\n" and result["is_error"] is False
        first_reply = orjson.loads(r.response_body(exchanges[0]))
        [call] = [b for b in first_reply["content"] if b["type"] == "tool_use"]
        assert result["tool_use_id"] == call["id"] and call["name"] == "bash"
        report = r.verify()
        assert report.ok, report.problems
        assert report.exchanges == 2
    verify = subprocess.run(
        [str(PVISOR), "--journal", str(journal), "journal", "verify"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_two_demo_runs_record_identical_bodies(two_demos):
    bodies = []
    for journal, proc in two_demos:
        assert proc.returncode == 0, proc.stderr
        with JournalReader(journal) as r:
            [run] = r.runs()
            exchanges = r.exchanges(run.id)
            bodies.append(
                (
                    run.id,
                    [
                        (r.request_body(e), r.response_body(e, raw=True), r.response_body(e))
                        for e in exchanges
                    ],
                )
            )
    (run_a, a), (run_b, b) = bodies
    assert run_a != run_b  # two runs, not one journal read twice
    assert len(a) == len(b) == 2
    for i, (x, y) in enumerate(zip(a, b)):
        assert x[0] == y[0], f"request body of exchange {i + 1} differs"
        assert x[1] == y[1], f"raw response body of exchange {i + 1} differs"
        assert x[2] == y[2], f"reassembled response of exchange {i + 1} differs"
        assert x[1].startswith(b"event: message_start")  # the raw stream, not the reassembled form


def test_the_closing_hints_name_a_command_that_runs(tmp_path: Path):
    """``scripts/demo`` puts nothing on PATH: the hints name the pvisor it was started as, with
    the demo's own run and exchange ids, and each runs as printed (issue 19)."""
    import os
    import shlex

    journal = tmp_path / "journal.sqlite"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no pvisor on it
    proc = subprocess.run(
        [str(PVISOR), "--journal", str(journal), "demo"], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tail = proc.stdout[proc.stdout.index("Next: ") :].splitlines()
    hints = [line.split("(")[0].replace("Next:", "").strip() for line in tail]
    assert len(hints) == 3 and all(h.startswith(str(PVISOR) + " ") for h in hints), hints
    for hint in hints:
        words = [w for w in shlex.split(hint) if w != "--open"]
        ran = subprocess.run(
            [words[0], "--journal", str(journal), *words[1:]], capture_output=True, text=True, timeout=120,
            stdin=subprocess.DEVNULL, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert ran.returncode == 0, (hint, ran.stderr)
