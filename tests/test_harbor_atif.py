"""ATIF that Harbor accepts (issue 34, item 8): every ATIF pvisor writes, of each real agent's
journal run (the session's shared captures) and of every native corpus file, is checked by
Harbor's own validator, run in Harbor's venv (Python 3.12+, made by scripts/test; its Python in
$PVISOR_HARBOR_PYTHON) as one subprocess for many documents (tests/harbor_validate.py). The rows
of every agent's run carry the call ids the agent sent, which its results answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from agent_helpers import AGENTS
from cli_helpers import pvisor_main
from native_helpers import native_dir, opencode_db_from_dump

from pvisor.core.errors import BadInputError
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow  # the captures run real agents (once per test session)

#: native corpus files that hold no step (no system prompt, task or action): ATIF needs one,
#: so the export refuses them with one line
NO_STEP = {"qwen-code/agent-sessions_system_telemetry.jsonl"}


def _agent_steps(doc: dict) -> list[dict]:
    return [s for s in doc["steps"] if s["source"] == "agent"]


def test_the_atif_of_every_agents_journal_run_passes_harbors_validator(captured, harbor, tmp_path):
    from pvisor.adapters.exports.atif import write_atif

    paths = []
    for agent in AGENTS:
        cap = captured(agent)
        assert cap.proc.returncode == 0, cap.proc.stderr
        out = tmp_path / f"{agent}.atif.json"
        with JournalReader(cap.journal) as r, out.open("wb") as f:
            write_atif(r, cap.run, f)
        doc = json.loads(out.read_bytes())
        answered = 0
        for step in _agent_steps(doc):
            ids = [c["tool_call_id"] for c in step.get("tool_calls", [])]
            results = step.get("observation", {}).get("results", [])
            # the results answer the calls by the ids the agent sent: none made up for them
            assert [r["source_call_id"] for r in results] == ids[: len(results)], (agent, step)
            answered += len(results)
            assert not any(
                c.get("extra", {}).get("made_up_id") for c in step.get("tool_calls", [])[: len(results)]
            )
        assert answered == 4, (agent, answered)  # step 1's call and step 2's batch of three
        paths.append(out)
    errors = harbor(paths)
    assert {p: e for p, e in errors.items() if e} == {}


def test_the_rows_of_every_agents_journal_run_carry_the_agents_call_ids(captured):
    from pvisor.adapters.exports.rows import iter_rows

    for agent in AGENTS:
        cap = captured(agent)
        with JournalReader(cap.journal) as r:
            rows = list(iter_rows(r, cap.run, bodies=False))
        answered = 0
        for row in rows:
            ids = [c["id"] for c in row["action"]["tool_calls"]]
            results = [res["call_id"] for res in row["observation"]["results"]]
            assert results == ids[: len(results)] and None not in results, (agent, row["step"], ids, results)
            answered += len(results)
        assert answered == 4, agent
    # Gemini CLI named the calls itself (the scripted replies give no id): journal steps says so
    from pvisor.adapters.journal_trajectory import trajectory_from_journal, trajectory_to_json

    cap = captured("gemini-cli")
    with JournalReader(cap.journal) as r:
        steps = trajectory_to_json(trajectory_from_journal(r, cap.run, wire_ids=True))["steps"]
    assert steps[0]["details"]["reply_call_ids"] == [None]
    assert steps[0]["action"]["tool_calls"][0]["id"] == steps[0]["observation"]["results"][0]["call_id"]


def _samples() -> list[str]:
    root = native_dir()
    return sorted(f"{p.parent.name}/{p.name}" for p in root.glob("*/*") if p.name != "PROVENANCE.md")


def test_the_atif_of_every_native_corpus_file_passes_harbors_validator(harbor, tmp_path):
    from pvisor.adapters.native import read_native
    from pvisor.adapters.native.render import write_atif

    paths, refused = [], set()
    for sample in _samples():
        path = native_dir() / sample
        if sample.endswith("opencode-db-dump.json"):
            path = opencode_db_from_dump(path, tmp_path / "opencode.db")
        result, notes = read_native(path)
        agent = notes[0].split(": ", 1)[1]
        out = tmp_path / (sample.replace("/", "__") + ".atif.json")
        try:
            with out.open("wb") as f:
                write_atif(result, agent, f)
        except BadInputError as exc:
            assert "no step" in exc.message and exc.exit_code == 65, (sample, exc.message)
            assert out.read_bytes() == b""  # refused before a byte was written
            refused.add(sample)
            continue
        paths.append(out)
    assert refused == NO_STEP
    assert len(paths) >= 30
    errors = harbor(paths)
    assert {p: e for p, e in errors.items() if e} == {}


def test_a_lost_actions_result_names_its_call_id_outside_source_call_id(tmp_path):
    """Codex's schema-coverage fixture has an output whose id answers no call (a lost action):
    Harbor refuses a ``source_call_id`` that names no tool call of its step."""
    sample = native_dir() / "codex" / "agent-sessions_schema_coverage.jsonl"
    proc = pvisor_main(["trajectory", "export", str(sample), "--format", "atif"])  # in this process
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    [lost] = [s for s in _agent_steps(doc) if "lost_action" in s["extra"].get("flags", [])]
    assert "tool_calls" not in lost
    [result] = lost["observation"]["results"]
    assert "source_call_id" not in result and result["extra"]["call_id"] == "[trimmed for fixture]"


def test_a_native_file_with_no_step_is_refused_with_one_line(tmp_path):
    [sample] = NO_STEP
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pvisor",
            "trajectory",
            "export",
            str(native_dir() / sample),
            "--format",
            "atif",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert proc.returncode == 65 and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "no step" in errors[0] and "ATIF" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_journal_run_with_no_main_loop_exchange_is_refused_as_atif(tmp_path):
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-empty", agent="codex"))
        j.record_exchange("r-empty", "HEAD", "/", status=200)  # a probe: no step
    out = tmp_path / "run.atif.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pvisor", "--journal", str(journal), "journal", "export", "r-empty"]
        + ["--format", "atif", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert proc.returncode == 65, proc.stderr
    [line] = proc.stderr.splitlines()
    assert "run r-empty: no step to export as ATIF" in line
    assert not any(p.name.startswith("run.atif") for p in tmp_path.iterdir())  # nor its .tmp
