"""SWE-agent .traj (adapters/native/swe_agent.py): every corpus sample compared with values
read from its raw ``history`` here; the wrong format given with --agent and bad input a new
user might give (empty file, JSON Lines, empty history, deep nesting) are refused naming the
file and the shape expected."""

from __future__ import annotations

import pytest

from native_helpers import (
    assert_refused_naming_file_and_shape,
    bad_documents,
    native_dir,
    read_sample,
    refused,
)

SA = native_dir() / "swe-agent"


@pytest.mark.parametrize("name", sorted(p.name for p in SA.glob("*.traj")))
def test_corpus_sample_matches_its_raw_history(name):
    doc, result = read_sample(SA / name, "swe-agent")
    t = result.trajectory
    hist = doc["history"]
    assert t.system == hist[0]["content"] and hist[0]["role"] == "system"
    assert t.task == next(h["content"] for h in hist if h["role"] == "user" and not h.get("is_demo"))
    assert t.meta["task_context"] == [h["content"] for h in hist if h.get("is_demo")]
    actions = [(i, h) for i, h in enumerate(hist) if h["role"] == "assistant"]
    assert len(t.steps) == len(actions)
    for s, (i, h) in zip(t.steps, actions):
        assert s.action.text == h["content"]
        assert [(c.id, c.name, c.arguments_raw) for c in s.action.tool_calls] == [
            (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in h.get("tool_calls") or []
        ]
        nxt = hist[i + 1] if i + 1 < len(hist) else None
        if nxt is None:
            assert not s.observation.results and not s.observation.messages
        elif nxt["role"] == "tool":
            assert [(r.call_id, r.content, r.is_error) for r in s.observation.results] == [
                (nxt["tool_call_ids"][0], nxt["content"], None)
            ]
        else:
            assert [m.parts[0].text for m in s.observation.messages] == [nxt["content"]]
    assert t.steps[-1].flags[0] == "submitted" and all(not s.flags for s in t.steps[:-1])
    assert ("observation_not_sent" in t.steps[-1].flags) == (hist[-1]["role"] != "assistant")
    assert t.tools is None and result.diagnostics.codes() == []


def test_wrong_format_given_with_agent_is_refused():
    mini = native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json"
    message = refused(mini, "swe-agent")
    assert str(mini) in message and "no `history` list" in message and "expected a SWE-agent .traj" in message


@pytest.mark.parametrize(
    ("content", "says"),
    bad_documents(
        (b'{"history": []}', "history: no history items (an empty list)"),
        (b'{"history": [{"content": "x"}]}', "history[0]: not a SWE-agent history item: no role"),
        (b'[{"role": "user", "content": "x"}]', "document: not a SWE-agent trajectory: no `history` list"),
    ),
)
def test_bad_input_is_refused_naming_the_file_and_the_shape_expected(tmp_path, content, says):
    assert_refused_naming_file_and_shape(
        tmp_path / "bad.traj", content, "swe-agent", says, "a SWE-agent .traj: a JSON object"
    )
