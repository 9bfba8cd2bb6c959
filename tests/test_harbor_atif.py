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
#: sources whose usage objects have no shape pvisor reads as counts (none so far)
NO_COUNTS: tuple[str, ...] = ()


def _agent_steps(doc: dict) -> list[dict]:
    return [s for s in doc["steps"] if s["source"] == "agent"]


def _check_metrics_and_times(doc: dict, where: str, *, timed: bool) -> int:
    """Every agent step whose reply gave a usage (``extra.usage``) has ``metrics``, and
    ``final_metrics`` holds their sums (a total only where a step gives that count; the extra
    counts likewise); the timestamps are there (``timed``: on every step) and never go back.
    Returns the number of agent steps with metrics."""
    agent = _agent_steps(doc)
    sums: dict[str, int] = {}
    for step in agent:
        m = step.get("metrics")
        if step["extra"].get("usage") is not None and m is None:
            # only a usage of no shape the source knows gives no counts (tests below name them)
            assert where.startswith(NO_COUNTS), (where, step["step_id"], step["extra"]["usage"])
        for k, v in (m or {}).items():
            for name, n in v.items() if k == "extra" else [(k, v)]:
                assert isinstance(n, int) and n >= 0, (where, step["step_id"], m)
                sums[f"total_{name}"] = sums.get(f"total_{name}", 0) + n
    final = dict(doc["final_metrics"])
    assert final.pop("total_steps") == len(doc["steps"]), where
    assert {**final.pop("extra", {}), **final} == sums, (where, doc["final_metrics"], sums)
    stamps = [s.get("timestamp") for s in doc["steps"]]
    if timed:
        assert None not in stamps, (where, stamps)
    present = [s for s in stamps if s is not None]
    assert present == sorted(present), (where, present)  # ISO 8601 UTC "Z": text order is time order
    assert all(s.endswith("Z") for s in present), (where, present)
    return sum(1 for s in agent if s.get("metrics"))


def _check_tool_definitions(doc: dict, where: str) -> int:
    """Each ``agent.tool_definitions`` element is in OpenAI's function-calling schema, as Harbor's
    RFC asks (``{type: "function", function: {name, description, parameters}}``), never a
    protocol's own shape; a tool that is not a function is named in ``agent.extra.tools_dropped``.
    Returns the number of definitions."""
    defs = doc["agent"].get("tool_definitions") or []
    for d in defs:
        assert set(d) == {"type", "function"} and d["type"] == "function", (where, d)
        f = d["function"]
        assert set(f) == {"name", "description", "parameters"}, (where, d)
        assert isinstance(f["name"], str) and f["name"] and isinstance(f["description"], str), (where, d)
        assert isinstance(f["parameters"], dict) and f["parameters"].get("type") == "object", (where, d)
    for t in doc["agent"].get("extra", {}).get("tools_dropped", []):
        assert set(t) == {"name", "kind"} and t["kind"] != "function", (where, t)
    return len(defs)


def test_the_atif_of_every_agents_journal_run_passes_harbors_validator(captured, harbor, tmp_path):
    from pvisor.adapters.exports.atif import write_atif

    paths, counted, steps = [], {}, {}
    dropped: dict[str, set[str]] = {}
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
        # each step whose reply gave its usage has metrics, each step its request's time
        counted[agent] = _check_metrics_and_times(doc, agent, timed=True)
        steps[agent] = len(_agent_steps(doc))
        assert _check_tool_definitions(doc, agent) > 0, agent
        dropped[agent] = {t["kind"] for t in doc["agent"].get("extra", {}).get("tools_dropped", [])}
        paths.append(out)
    # the scripted replies carry no usage but in Anthropic's shape, where it is required: every
    # Claude Code step has metrics (its steps counted from the run: a capture in a loaded suite
    # may hold one more than the script's three)
    assert steps["claude-code"] >= 3, steps
    assert counted == {a: steps[a] if a == "claude-code" else 0 for a in AGENTS}, (counted, steps)
    # Codex offers a namespace of tools and the provider's web search: no function schema
    assert {"namespace", "web_search"} <= dropped["codex"], dropped
    errors = harbor(paths)
    assert {p: e for p, e in errors.items() if e} == {}


def test_the_atif_of_every_agents_journal_run_starts_with_its_system_prompt(captured, tmp_path):
    """Step 1 is the system prompt of the run's first request, however the protocol sends it:
    Anthropic ``system``, Chat's first message, Gemini ``systemInstruction``, and Codex's
    ``developer`` input messages (Codex 0.171 sends no Responses ``instructions``), as
    ``trajectory export`` of Codex's own rollout file gives it."""
    from pvisor.adapters.exports.atif import write_atif
    from pvisor.adapters.journal_trajectory import trajectory_from_journal
    from pvisor.adapters.protocols import get_protocol
    from pvisor.adapters.protocols.openai_responses import developer_prompt

    for agent in AGENTS:
        cap = captured(agent)
        out = tmp_path / f"{agent}.atif.json"
        with JournalReader(cap.journal) as r, out.open("wb") as f:
            write_atif(r, cap.run, f)
            ex = r.exchange(trajectory_from_journal(r, cap.run).meta["steps"][0]["exchange"])
            conv = get_protocol(ex.protocol).parse_request(r.request_body(ex), path=ex.path)
        first = json.loads(out.read_bytes())["steps"][0]
        prompt = conv.system or developer_prompt(conv)
        assert prompt, agent  # every agent sends one
        assert first["source"] == "system" and first["step_id"] == 1, (agent, first)
        assert first["message"].startswith(prompt[:200]), (agent, first["message"][:200], prompt[:200])
        if agent == "codex":
            assert conv.system is None  # the developer messages alone say it
            assert first["message"].startswith("You are a coding agent running in the Codex CLI")


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
    with_metrics: dict[str, int] = {}
    defined = 0
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
        # the files the real agents wrote (real-*) give every reply's record its time
        timed = sample.split("/")[1].startswith("real-")
        doc = json.loads(out.read_bytes())
        with_metrics[sample] = _check_metrics_and_times(doc, sample, timed=timed)
        defined += _check_tool_definitions(doc, sample)
        paths.append(out)
    assert refused == NO_STEP
    assert len(paths) >= 30
    assert defined > 0  # the files that keep their tools give them in the function schema
    # each format that keeps usage gives metrics: one file of each at least
    for fmt in ("claude-code", "codex", "gemini-cli", "qwen-code", "opencode", "mini-swe-agent", "openhands"):
        assert any(n for s, n in with_metrics.items() if s.startswith(fmt + "/")), (fmt, with_metrics)
    errors = harbor(paths)
    assert {p: e for p, e in errors.items() if e} == {}


def _atif_of(sample: str) -> dict:
    from pvisor.adapters.native import read_native
    from pvisor.adapters.native.render import to_atif

    result, notes = read_native(native_dir() / sample)
    return to_atif(result, notes[0].split(": ", 1)[1])


def test_atif_metrics_count_every_input_token_as_the_conventions_do():
    """Claude Code's Anthropic usage counts cache reads and writes apart from ``input_tokens``:
    ATIF's ``prompt_tokens`` is their sum, ``cached_tokens`` the reads; Gemini CLI's ``tokens``
    count thoughts apart from ``output``; Codex's ``input_tokens`` hold the cached ones."""
    cached = 0
    for step in _agent_steps(_atif_of("claude-code/spotter_short.jsonl")):
        u, m = step["extra"]["usage"], step["metrics"]
        reads, writes = u.get("cache_read_input_tokens", 0), u.get("cache_creation_input_tokens", 0)
        assert m["prompt_tokens"] == u["input_tokens"] + reads + writes, (u, m)
        assert m["cached_tokens"] == reads and m["completion_tokens"] == u["output_tokens"]
        assert m["extra"]["cache_creation_input_tokens"] == writes
        cached += reads
    assert cached > 0  # the file has cache reads: the sum is not input_tokens alone
    # Gemini CLI's input leaves the tool-use prompt out and its output the thoughts
    steps = [s for s in _agent_steps(_atif_of("gemini-cli/agent-history_gemini_with_tool_error.jsonl"))]
    assert len(steps) >= 5 and all(
        s["metrics"]["prompt_tokens"] == s["extra"]["usage"]["input"] + s["extra"]["usage"].get("tool", 0)
        and s["metrics"]["completion_tokens"]
        == s["extra"]["usage"]["output"] + s["extra"]["usage"].get("thoughts", 0)
        for s in steps
    ), [(s["extra"]["usage"], s.get("metrics")) for s in steps]
    # Codex's token_usage_record (and token_count) hold the cached tokens within input_tokens
    codex = [s.get("metrics") for s in _agent_steps(_atif_of("codex/real-0.171.0_single-then-resume.jsonl"))]
    assert codex and all(
        m
        == {
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "cached_tokens": 0,
            "extra": {"cache_creation_input_tokens": 0, "reasoning_tokens": 0},
        }
        for m in codex
    ), codex


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


def test_a_record_time_reads_as_epoch_milliseconds_or_not_at_all():
    """What the formats write (ISO 8601 with Z or an offset, OpenHands' without a zone: UTC,
    OpenCode's epoch milliseconds) reads as a time; anything else, and a time whose zone moves
    it out of what ATIF's timestamp can say, gives none, never an error."""
    from pvisor.adapters.native.assembly import epoch_ms
    from pvisor.adapters.native.render import iso_time

    assert iso_time(epoch_ms("2026-11-29T06:32:48.612Z")) == "2026-11-29T06:32:48.612Z"
    assert iso_time(epoch_ms("2026-11-29T07:32:48.612+01:00")) == "2026-11-29T06:32:48.612Z"
    assert iso_time(epoch_ms("2025-01-27T22:45:13.764393")) == "2025-01-27T22:45:13.764Z"
    assert iso_time(epoch_ms(1732000000000)) == "2024-11-19T07:06:40.000Z"
    for bad in ("0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "banana bread!", "", None, True,
                float("nan"), -5, 10**20, {"t": 1}):  # fmt: skip
        assert epoch_ms(bad) is None, bad
