"""Cross-check: for every real agent captured through the gateway (the session captures of
tests/agent_captures.py), the trajectory read from the agent's own native file equals the
journal's trajectory of the same run, after the per-agent normalisation of docs/native.md
("Cross-check"):

- compared per step: the action's text (surrounding whitespace ignored), its tool calls
  (id, name, arguments parsed), and the observation's results (call id, content as text);
  and the task;
- Gemini CLI: call ids lose their ``<name>__`` prefix (the native file stores the id the
  agent made as ``<name>__<id>``); the model's reply had no call id, so the journal's calls
  have none and ids are compared on the results, where the journal has the agent's own id
  from request i+1; results are read as the text of their ``functionResponse.response``, one
  copy of a repeated result (the adapter keeps the one stored in the call);
- mini-swe-agent: the final submit command's observation ("action was not executed") is in
  the native file but never reached the model: the journal's last step has no results, so
  the native last step's results are dropped before comparing;
- Claude Code: the ``<system-reminder>`` blocks it appends to a result when sending it (they
  are not in its file) are removed;
- results compared as text: a list of content blocks is its texts joined; a Gemini/Qwen
  ``response`` object its ``output`` (or ``error``) string.

Every other difference fails."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import AGENTS, RESUME_TASK, RESUMED_TEXT
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.native import read_native
from pvisor.journal.model import Trajectory
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow


_REMINDER = re.compile(r"\s*<system-reminder>.*?</system-reminder>\s*", re.S)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(b) for b in content)
    if isinstance(content, dict):
        if "functionResponse" in content:
            return _text(content["functionResponse"].get("response"))
        for k in ("text", "output", "error", "content"):
            if k in content:
                return _text(content[k])
        return json.dumps(content, sort_keys=True)
    return json.dumps(content)


def _unremind(agent: str, text: str) -> str:
    """Claude Code adds ``<system-reminder>`` blocks to a tool result when it sends it (not in
    its file): removed before comparing."""
    return _REMINDER.sub("", text).rstrip() if agent == "claude-code" else text


def _call_id(agent: str, cid: str | None, name: str) -> str | None:
    if agent == "gemini-cli" and cid and cid.startswith(name + "__"):
        return cid[len(name) + 2 :]
    return cid


def _args(raw: str, parsed: Any) -> Any:
    if parsed is not None:
        return parsed
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def core(t: Trajectory, agent: str) -> dict[str, Any]:
    steps = []
    for s in t.steps:
        steps.append(
            {
                "text": s.action.text.strip(),
                "calls": [
                    (_call_id(agent, c.id, c.name), c.name, _args(c.arguments_raw, c.arguments))
                    for c in s.action.tool_calls
                ],
                "results": [
                    (_call_id(agent, r.call_id, r.name or ""), _unremind(agent, _text(r.content)))
                    for r in s.observation.results
                ],
            }
        )
    if agent == "mini-swe-agent" and steps:
        steps[-1]["results"] = []
    return {"task": t.task, "steps": steps}


@pytest.mark.parametrize("agent", list(AGENTS))
def test_native_file_trajectory_equals_the_journal_trajectory(captured, agent):
    cap = captured(agent)
    assert cap.proc.returncode == 0, cap.proc.stderr
    native_path = Path(cap.report["native_trajectory"])
    result, notes = read_native(native_path)
    assert notes == [f"detected format: {agent}"]
    with JournalReader(cap.journal) as r:
        journal = trajectory_from_journal(r, cap.run)
    native = result.trajectory
    native.steps = list(native.steps)  # built once: the id edits below must stick
    if agent == "gemini-cli":
        # Gemini replies carry no call id, so the journal's calls have none; the ids the agent
        # made are compared on the results (native ``<name>__<id>`` without its prefix)
        assert all(c.id is None for s in journal.steps for c in s.action.tool_calls)
        for s in journal.steps:
            for c in s.action.tool_calls:
                c.id = None
        for s in native.steps:
            for c in s.action.tool_calls:
                c.id = None
    got, want = core(native, agent), core(journal, agent)
    with JournalReader(cap.journal) as r:
        attempts = len(r.attempts(cap.run))
    if attempts > 1 and AGENTS[agent].resume == "new_chain":
        # test_agents.py resumed this session already: Gemini CLI and Qwen Code start a new
        # chain on resume, outside the journal's main chain, while their file goes on; the
        # resumed prompt and its reply follow the main chain's steps in the file
        extra = got["steps"][len(want["steps"]) :]
        got["steps"] = got["steps"][: len(want["steps"])]
        assert [x["text"] for x in extra] == [RESUMED_TEXT]
        assert RESUME_TASK in [
            p.text for m in native.steps[len(want["steps"]) - 1].observation.messages for p in m.parts
        ]
    assert got["steps"] == want["steps"]
    assert got["task"] is not None and (got["task"] == want["task"] or got["task"] in (want["task"] or ""))
    assert result.diagnostics.warnings == [], [str(w) for w in result.diagnostics.warnings]
