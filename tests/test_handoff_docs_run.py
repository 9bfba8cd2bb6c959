"""The run of docs/handoff.md's example (a real Claude Code against the scripted model: a shell
call, a write, an edit, two reads at once, a TodoWrite Claude Code does not offer, the end), each
turn with plain reasoning, handed over by ``pvisor handoff`` to the real CLIs offline,
``--replay-only``: what a new user met with it (issue 39's fixes). Nothing is mocked."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from agent_helpers import capture_scripted, entrypoint
from cli_helpers import pvisor_main

REPO = Path(__file__).resolve().parents[1]
#: docs/handoff.md "Try it offline": its steps.json (the first json block), read from the page
_PAGE = (REPO / "docs" / "handoff.md").read_text()
TURNS = json.loads(_PAGE.split("```json\n", 1)[1].split("```", 1)[0])["turns"]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
SCRIPT = {"turns": [dict(t, reasoning=f"I think: {t['text']}") for t in TURNS]}


class Source:
    def __init__(self, root: Path):
        (root / "ws").mkdir()
        (root / "ws" / "seed.txt").write_text("seed\n")
        cap = capture_scripted("claude-code", root, SCRIPT, "Write the greeting and the notes")
        self.root, self.journal, self.run, self.env = root, cap.journal, cap.run, cap.env
        [native] = (root / "runs" / self.run / "home" / ".claude" / "projects").glob("*/*.jsonl")
        self.native = native


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Source:
    return Source(tmp_path_factory.mktemp("handoff-docs-run"))


def _cli(source: Source, tmp_path: Path, *args: str, to: str, src: tuple[str, ...] = ()):
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor_main(
        ["--journal", str(source.journal), "handoff", *(src or ("--run", source.run)), "--to-agent", to,
         "--agent-entrypoint", str(entrypoint(to)), "--workspace", str(ws), "--output", str(out),
         "--replay-only", *args],
        env=source.env, cwd=tmp_path, text=True,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else None
    return proc, result


def _error_line(proc) -> str:
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("pvisor: error: ")]
    return line


@pytest.mark.parametrize("to", ["opencode", "qwen-code"])
def test_keep_refused_at_the_next_agents_request_one_is_handoff_refused_exit_65(source, tmp_path, to):
    """OpenCode and Qwen Code pick their protocol at run time: the refusal comes at their request
    1 and ends them at once; that is the error (not their early end), its reason in the line."""
    proc, result = _cli(source, tmp_path, "--after-step", "4", "--source-reasoning", "keep", to=to)
    line = _error_line(proc)
    assert proc.returncode == 65, proc.stderr
    said = f"pvisor: error: handoff_refused: handoff to {to}: --source-reasoning keep: "
    assert line.startswith(said), line
    assert "made over anthropic and the next agent speaks openai-chat" in line
    assert result["status"] == "failed"
    assert [e["code"] for e in result["errors"]] == ["handoff_refused"]
    assert result["handoff"]["refused"] in line


def test_keep_refused_before_anything_runs_says_why_in_the_report(source, tmp_path):
    """Gemini CLI speaks one protocol: refused before it starts, and ``handoff.refused`` says why
    as after a refusal at request 1 (the report's shape: docs/result-schema.json)."""
    proc, result = _cli(source, tmp_path, "--after-step", "4", "--source-reasoning", "keep", to="gemini-cli")
    assert proc.returncode == 65, proc.stderr
    assert [e["code"] for e in result["errors"]] == ["handoff_refused"]
    h = result["handoff"]
    assert h is not None and "next agent speaks gemini" in h["refused"]
    assert (h["from_agent"], h["to_agent"], h["pause"]["after_step"], h["calls"]) == (
        "claude-code",
        "gemini-cli",
        4,
        [],
    )
    assert h["workspace"]["compared"] is False and h["lineage"]["parent_run"] == source.run
    jsonschema.validate(result, SCHEMA)


def _replay(source: Source, tmp_path: Path, *args: str):
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor_main(
        ["--journal", str(source.journal), "replay", "--agent", "claude-code", "--agent-entrypoint",
         str(entrypoint("claude-code")), "--workspace", str(ws), "--output", str(out), "--replay-only",
         *args],
        env=source.env, cwd=tmp_path, text=True,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("how", ["handoff", "native handoff", "replay"])
def test_a_tool_the_recorded_run_did_not_offer_either_is_no_divergence(source, tmp_path, how):
    """The script's TodoWrite (step 5) was never offered by Claude Code under ``pvisor run``: the
    recorded call was answered with Claude Code's error, and so is the served one; B = A re-runs
    the five steps (the journal run, its native file, and a plain replay of the run)."""
    if how == "replay":
        proc, result = _replay(source, tmp_path, "--run", source.run, "--after-step", "5")
    else:
        native = ("--trajectory", str(source.native), "--agent", "claude-code")
        src = native if how == "native handoff" else ()
        proc, result = _cli(source, tmp_path, "--step", "4", to="claude-code", src=src)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "ok" and result["errors"] == []
    assert result["boundary"]["after_step"] == 5


def test_a_request_that_never_offers_a_called_tool_is_named_when_the_agent_ends(source, tmp_path):
    """A native file whose shell call names a tool Claude Code never offers (answered without an
    error): no request is the main loop, and the error line says why, not only that it ended."""
    bad = tmp_path / "renamed.jsonl"
    bad.write_text(source.native.read_text().replace('"name":"Bash"', '"name":"Bashful"'))
    src = ("--trajectory", str(bad), "--agent", "claude-code")
    proc, result = _cli(source, tmp_path, "--step", "4", to="claude-code", src=src)
    assert proc.returncode == 1, proc.stderr
    line = _error_line(proc)
    said = "after main-loop request 0, before request 6: no request was taken for the main loop (not the "
    assert said in line
    assert "it does not offer the tools the recorded actions call (Bashful))" in line
    assert [e["code"] for e in result["errors"]] == ["agent_ended_early"]


def test_the_summary_counts_no_carrier_as_a_compared_observation(source, tmp_path):
    """Into Codex the TodoWrite is text, carried by ``true``, which has no recorded result: the
    summary compares the five observations of the source's calls (the matrix's ``O=O″ 1/5``)."""
    proc, result = _cli(source, tmp_path, "--step", "4", to="codex")
    assert proc.returncode == 0, proc.stderr
    h = result["handoff"]
    assert h["carriers"] == [5] and len(result["tool_calls"]) == 6
    observed = [c["observation"] for c in h["calls"] if c["observation"]]
    same = sum(1 for o in observed if o["equal_normalised"])
    assert (same, len(observed)) == (1, 5)
    assert "6 tool call(s) re-run, 1 of 5 observation(s) equal once normalised;" in proc.stdout, proc.stdout


def test_progress_is_rounded_half_up_as_the_docs_say(source, tmp_path):
    """``--progress 0.5`` of the run's 6 transitions: round(0.5 x 5) halves up, transition 3 (Python's
    ``round`` would give 2), journal steps 1..4 kept; docs/handoff.md's table says the same rule."""
    proc, result = _cli(source, tmp_path, "--progress", "0.5", to="claude-code")
    assert proc.returncode == 0, proc.stderr
    assert result["handoff"]["pause"] == {"after_step": 4, "transition": 3}
    [row] = [line for line in _PAGE.splitlines() if line.startswith("| `--progress F` |")]
    assert "halves up" in row and "0.5 of 6 transitions is transition 3" in row


def test_the_help_says_writes_and_edits_go_to_the_next_agents_own_tools():
    proc = pvisor_main(["handoff", "--help"], text=True)
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "a write or an edit becomes a shell call" not in said
    assert "a write, an edit, a read or a plan goes to its own tool of that kind where it declares" in said
    assert "transition round(F x (T-1)) of T, halves up" in said


def test_a_start_that_fails_after_the_restore_records_it(source, tmp_path):
    """The start snapshot is restored into the empty workspace before the agent is started; an
    executable of another version (exit 69) ends the handoff there: the result says what the
    workspace holds now (``workspace.restored_from``), not null."""
    fake = tmp_path / "codex"
    fake.write_text("#!/bin/sh\necho 'codex-cli 0.1.0'\n")
    fake.chmod(0o755)
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor_main(
        ["--journal", str(source.journal), "handoff", "--run", source.run, "--step", "4", "--to-agent",
         "codex", "--agent-entrypoint", str(fake), "--workspace", str(ws), "--output", str(out),
         "--replay-only"],
        env=source.env, cwd=tmp_path, text=True,
    )  # fmt: skip
    assert proc.returncode == 69, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert [e["code"] for e in result["errors"]] == ["agent_unavailable"]
    assert [p.name for p in ws.iterdir()] == ["seed.txt"]
    w = result["workspace"]
    assert w is not None and w["restored_from"]["run"] == source.run and w["restored_from"]["kind"] == "start"
    assert w["unchanged"] is True and w["entries"] == 1
    jsonschema.validate(result, SCHEMA)
