"""A handoff's workspace with real agents (pinned CLIs under .agents/, offline against the scripted
model): the start snapshot restored into an empty workspace, a step whose call is not re-run
(Claude Code's NotebookEdit) made by a shell call from the source's snapshots, the workspace
compared with the pause's snapshot (a difference listed; ``--strict-workspace`` makes it
diverged), and ``reset_to_pause`` making the workspace the pause's snapshot at B's boundary."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from agent_helpers import capture_scripted, entrypoint, pvisor

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
NOTEBOOK = {
    "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "source": ["print(1)"], "outputs": []}],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A Claude Code run: a shell call, a Write of a notebook, a Read of it, a NotebookEdit (a tool
    whose effect a handoff does not re-run), then an end."""
    root = tmp_path_factory.mktemp("handoff-ws")
    ws = root / "ws"
    ws.mkdir()
    nb = str(ws / "n.ipynb")
    script = {
        "model": "mock-model",
        "seed": 3,
        "turns": [
            {"text": "A file.", "tool_calls": [{"tool": "@shell", "command": "echo alpha > a.txt"}]},
            {
                "text": "A notebook.",
                "tool_calls": [
                    {"tool": "Write", "arguments": {"file_path": nb, "content": json.dumps(NOTEBOOK) + "\n"}}
                ],
            },
            {"text": "Read it.", "tool_calls": [{"tool": "Read", "arguments": {"file_path": nb}}]},
            {
                "text": "Edit the cell.",
                "tool_calls": [
                    {
                        "tool": "NotebookEdit",
                        "arguments": {"notebook_path": nb, "cell_id": "c1", "new_source": "print(2)"},
                    }
                ],
            },
            {"text": "Done."},
        ],
    }
    cap = capture_scripted("claude-code", root, script, "Edit the notebook.")
    assert "print(2)" in (ws / "n.ipynb").read_text()  # the source's own edit happened
    return cap, root


def _handoff(cap, root: Path, name: str, *extra: str, prepare=None):
    ws, out = root / f"ws-{name}", root / f"out-{name}"
    ws.mkdir()
    if prepare is not None:
        prepare(ws)
    proc = pvisor(
        ["--journal", str(cap.journal), "handoff", "--run", cap.run, "--after-step", "4",
         "--to-agent", "codex", "--agent-entrypoint", str(entrypoint("codex")),
         "--workspace", str(ws), "--output", str(out), "--replay-only", *extra],
        env=cap.env, cwd=root, timeout=400,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return proc, result, ws


def test_a_step_not_re_run_is_made_from_the_snapshots_and_the_workspace_equals_the_pause(source):
    cap, root = source
    proc, result, ws = _handoff(cap, root, "plain")
    assert proc.returncode == 0, proc.stderr
    h = result["handoff"]
    # the empty workspace got the source's start snapshot (the capture started in an empty one)
    assert result["workspace"]["restored_from"] is not None
    fates = {c["tool"]: c["fate"] for c in h["calls"]}
    assert fates == {
        "Bash": "translated",
        "Write": "reproduced",
        "Read": "translated",
        "NotebookEdit": "rendered_as_text",
    }
    assert [f["paths"] for f in h["from_snapshots"]] == [["n.ipynb"]]
    assert h["from_snapshots"][0]["source_step"] == 4
    assert "print(2)" in (ws / "n.ipynb").read_text()
    assert h["workspace"]["compared"] and h["workspace"]["equal"], h["workspace"]
    assert h["boundary_request"]["valid"] and h["boundary_request"]["protocol"] == "openai-responses"


def test_a_workspace_that_differs_is_listed_and_strict_makes_it_diverged(source):
    cap, root = source

    def extra_file(ws: Path) -> None:
        (ws / "stray.txt").write_text("not in the source\n")

    proc, result, _ = _handoff(cap, root, "lax", prepare=extra_file)
    assert proc.returncode == 0, proc.stderr
    # a workspace that is not empty is kept as given, with one warning naming --no-restore
    assert "--no-restore" in proc.stderr
    ws = result["handoff"]["workspace"]
    assert not ws["equal"] and {"path": "stray.txt", "change": "added"} in ws["differences"]
    assert "stray.txt" in proc.stderr  # warned
    proc, result, _ = _handoff(cap, root, "strict", "--strict-workspace", prepare=extra_file)
    assert proc.returncode == 1, proc.stderr
    assert result["status"] == "diverged"
    assert [e["code"] for e in result["errors"]] == ["workspace_diverged"]
    assert "stray.txt" in proc.stderr.strip().splitlines()[-1]


def test_reset_to_pause_makes_the_workspace_the_pause_snapshot(source):
    cap, root = source

    def stray(ws: Path) -> None:
        (ws / "stray.txt").write_text("x\n")
        (ws / "sub").mkdir()
        (ws / "sub" / "deep.txt").write_text("y\n")

    proc, result, ws = _handoff(cap, root, "reset", "--reset-to-pause", prepare=stray)
    assert proc.returncode == 0, proc.stderr
    h = result["handoff"]
    # the comparison says what the re-enactment left; the reset then removed it
    assert {d["path"] for d in h["workspace"]["differences"]} == {"stray.txt", "sub", "sub/deep.txt"}
    removed = ["stray.txt", "sub", "sub/deep.txt"]
    assert h["workspace"]["reset_to_pause"] == {"done": True, "removed": removed, "error": None}
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "n.ipynb"]
    assert "print(2)" in (ws / "n.ipynb").read_text()


def test_a_native_file_is_handed_over_as_a_journal_run_is(source):
    """The source as Claude Code's own session file (``--trajectory``): the same calls and fates
    as from the journal, the files made in the new workspace; nothing is compared (a native
    file keeps no snapshot: ``why_not_compared`` says so) and the child names no parent run."""
    from pvisor.journal.reader import JournalReader

    cap, root = source
    with JournalReader(cap.journal) as reader:
        native = reader.run(cap.run).labels["native_path"]
    ws, out = root / "ws-native", root / "out-native"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "handoff", "--trajectory", native, "--agent", "claude-code",
         "--after-step", "4", "--to-agent", "codex", "--agent-entrypoint", str(entrypoint("codex")),
         "--workspace", str(ws), "--output", str(out), "--replay-only"],
        env=cap.env, cwd=root, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "keeps no workspace snapshot" in proc.stderr  # said before the agent started
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    h = result["handoff"]
    fates = {c["tool"]: c["fate"] for c in h["calls"]}
    assert fates == {
        "Bash": "translated",
        "Write": "reproduced",
        "Read": "translated",
        "NotebookEdit": "rendered_as_text",
    }
    assert (ws / "a.txt").read_text() == "alpha\n" and "print(1)" in (ws / "n.ipynb").read_text()
    assert h["workspace"]["compared"] is False and "native file" in h["workspace"]["why_not_compared"]
    assert h["lineage"]["parent_run"] is None and h["from_snapshots"] == []
    assert h["boundary_request"]["valid"]
