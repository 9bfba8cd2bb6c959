"""Issue 39 (part 2, item 1): a handoff's edit reaches the next agent as its own edit tool, with
the real CLIs. A Claude Code run (``pvisor run --script``, captured at test time) Reads a note
that is in its workspace from the start, touches it and makes another file through its shell,
then Edits the note; it is handed with ``--replay-only`` after the Edit to Gemini CLI, OpenCode
and Qwen Code, one at a time. Each ends with the note edited, and its own session file (read
with pvisor's native adapter) holds the edit as a call of its own edit tool (``replace``,
``edit``, ``edit``) with the source's old and new text, no shell call of B's made the change,
and the report says so (``translated``, reason ``native edit``). Qwen Code refuses to edit a file
whose mtime changed since its session read it: the read served first (``inserted_reads``) is in
its session file, before the edit."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from agent_helpers import capture_scripted, entrypoint, pvisor

from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.agents.effects import Effect, Role
from pvisor.adapters.native import read_native

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
TASK = "Read the note, then edit it."
#: B -> its edit tool, and whether its edit tool wants a read first (served after the shell)
EDIT_TOOL = {"gemini-cli": ("replace", False), "opencode": ("edit", False), "qwen-code": ("edit", True)}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Claude Code's run: Read notes.txt, a shell call touching it, Edit it (two -> three)."""
    root = tmp_path_factory.mktemp("routes")
    (root / "ws").mkdir()
    (root / "ws" / "notes.txt").write_text("one\ntwo\n")
    note = str(root / "ws" / "notes.txt")
    script = {
        "model": "mock-model",
        "turns": [
            {"text": "Read the note.", "tool_calls": [{"tool": "Read", "arguments": {"file_path": note}}]},
            {
                "text": "Touch it.",
                "tool_calls": [{"tool": "@shell", "command": "touch notes.txt && echo alpha > a.txt"}],
            },
            {
                "text": "Edit the note: two becomes three.",
                "tool_calls": [
                    {
                        "tool": "Edit",
                        "arguments": {"file_path": note, "old_string": "two", "new_string": "three"},
                    }
                ],
            },
            {"text": "Done."},
        ],
    }
    cap = capture_scripted("claude-code", root, script, TASK)
    assert (root / "ws" / "notes.txt").read_text() == "one\nthree\n"  # Claude Code's own Edit ran
    return cap, root


@pytest.mark.parametrize("b", sorted(EDIT_TOOL))
def test_an_edit_reaches_the_next_agent_as_its_own_edit_tool(source, b):
    cap, root = source
    tool, reads_first = EDIT_TOOL[b]
    ws, out = root / f"ws-{b}", root / f"out-{b}"
    ws.mkdir()
    args = [
        "--journal", str(cap.journal), "handoff", "--run", cap.run, "--after-step", "3",
        "--to-agent", b, "--agent-entrypoint", str(entrypoint(b)), "--workspace", str(ws),
        "--output", str(out), "--timeout", "240", "--replay-only",
    ]  # fmt: skip
    proc = pvisor(args, env=cap.env, cwd=root, timeout=400)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "ok" and result["errors"] == []
    # the note edited, the workspace the pause's
    assert (ws / "notes.txt").read_text() == "one\nthree\n"
    h = result["handoff"]
    assert h["workspace"]["equal"] and h["boundary_request"]["valid"], h["workspace"]
    edit = h["calls"][2]
    assert (edit["tool"], edit["fate"], edit["target_tool"]) == ("Edit", "translated", tool)
    assert edit["reason"].startswith("native edit")
    assert [(r["source_step"], r["path"]) for r in h["inserted_reads"]] == (
        [(3, "notes.txt")] if reads_first else []
    )
    # B's own session file holds the edit as its edit tool's call, and no shell call of B's made it
    native = Path(result["agent_run"]["native_trajectory"])
    read, _ = read_native(native, b)
    calls = [c for s in read.trajectory.steps for c in s.action.tool_calls]
    d = get_descriptor(b)
    effects = [(d.effect_of(c.name).effect, c.name) for c in calls]
    edits = [c for c in calls if c.name == tool]
    assert len(edits) == 1 and d.effect_of(tool).effect is Effect.EDIT, effects
    fx = d.effect_of(tool)
    got = edits[0].arguments
    assert Path(got[fx.arg(Role.PATH)]) == ws / "notes.txt"
    assert (got[fx.arg(Role.OLD)], got[fx.arg(Role.NEW)]) == ("two", "three")
    assert [e for e, _ in effects if e is Effect.SHELL] == [Effect.SHELL]  # the source's own only
    reads = [n for e, n in effects[: effects.index((Effect.EDIT, tool))] if e is Effect.READ]
    assert len(reads) == (2 if reads_first else 1), effects  # the source's Read, and one served first
