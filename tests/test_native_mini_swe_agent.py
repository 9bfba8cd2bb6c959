"""mini-swe-agent trajectory JSON (adapters/native/mini_swe_agent.py).

Every corpus sample is read and compared with values taken from its raw JSON here (not through
the adapter): steps, tool calls with their exact argument strings, results with their return
codes, the system prompt and the task. Small inputs written by the tests cover what the corpus
lacks: format errors after a dropped reply, Responses-API messages, a missing result, and the
damaged-input classes of a single-document format (truncated file, invalid UTF-8 in a tool
output, the wrong format given with --agent, an unknown major version) and bad input a new
user might give (an empty file or message list, JSON Lines, deep nesting): refused naming the
file and the shape expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from native_helpers import (
    assert_refused_naming_file_and_shape,
    assert_steps_match,
    bad_documents,
    native_dir,
    read_sample,
    refused,
)
from pvisor.adapters.native import read_native
from pvisor.core.errors import BadInputError


def _samples() -> list[str]:
    return sorted(p.name for p in (native_dir() / "mini-swe-agent").glob("*.json"))


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(b["text"] for b in content if isinstance(b, dict) and "text" in b)
    return content or ""


def _raw_steps(doc) -> tuple[str | None, str | None, list[dict]]:
    """(system, task, steps) read from the raw messages: one step per assistant message, tool
    messages and later user messages attached to the step before them."""
    msgs = doc if isinstance(doc, list) else doc["messages"]
    system = task = None
    steps: list[dict] = []
    for m in msgs:
        role = m["role"]
        if role == "system" and not steps:
            system = _text(m["content"])
        elif role == "assistant":
            steps.append(
                {
                    "text": _text(m.get("content")),
                    "results": [],
                    "messages": [],
                    "calls": [
                        (c["id"], c["function"]["name"], c["function"]["arguments"])
                        for c in m.get("tool_calls") or []
                    ],
                }
            )
        elif role == "tool":
            rc = m["extra"]["returncode"]
            steps[-1]["results"].append((m["tool_call_id"], m["content"], rc != 0))
        elif role == "user":
            if task is None and not steps:
                task = _text(m["content"])
            else:
                steps[-1]["messages"].append(_text(m["content"]))
    return system, task, steps


def test_the_mini_swe_agent_corpus_is_there():
    names = _samples()
    assert {
        "real-2.4.6_single.traj.json",
        "real-2.4.6_parallel.traj.json",
        "real-2.4.6_textbased.traj.json",
    } <= set(names)
    assert any(n.startswith("v1_") for n in names)


@pytest.mark.parametrize("name", _samples())
def test_corpus_sample_matches_its_raw_json(name):
    path = native_dir() / "mini-swe-agent" / name
    doc, result = read_sample(path, "mini-swe-agent")
    t = result.trajectory
    system, task, raw = _raw_steps(doc)
    assert t.system == system and t.task == task and t.tools is None
    assert_steps_match(t.steps, raw)
    # the last step ran the submit command; what follows it in the file never reached the model
    last = t.steps[-1]
    assert "submitted" in last.flags
    assert ("observation_not_sent" in last.flags) == bool(raw[-1]["results"] or raw[-1]["messages"])
    assert all(not s.flags for s in t.steps[:-1])
    if isinstance(doc, dict):
        assert t.meta["trajectory_format"] == doc["trajectory_format"]
        assert t.model == doc["info"]["config"]["model"]["model_name"]
        assert [lo.kind for lo in t.left_out] == [m["role"] for m in doc["messages"] if m["role"] == "exit"]
        assert result.diagnostics.codes() == []
    else:
        assert result.diagnostics.codes() == ["no_version"]
    # naming the adapter gives the same trajectory
    again, notes2 = read_native(path, "mini-swe-agent")
    assert notes2 == [] and [(s.action.text, s.flags) for s in again.trajectory.steps] == [
        (s.action.text, s.flags) for s in t.steps
    ]


def test_parallel_calls_are_one_batch_with_results_in_call_order():
    path = native_dir() / "mini-swe-agent" / "real-2.4.6_parallel.traj.json"
    msgs = json.loads(path.read_text())["messages"]
    t = read_native(path)[0].trajectory
    first = t.steps[0]
    want = [c["function"]["arguments"] for c in msgs[2]["tool_calls"]]
    assert len(want) == 2 and [c.arguments_raw for c in first.action.tool_calls] == want
    assert [c.arguments["command"] for c in first.action.tool_calls] == [
        json.loads(a)["command"] for a in want
    ]
    assert [r.call_id for r in first.observation.results] == [
        msgs[3]["tool_call_id"],
        msgs[4]["tool_call_id"],
    ]
    assert [r.content for r in first.observation.results] == [msgs[3]["content"], msgs[4]["content"]]
    # the submit call's padded result: returncode -1, "action was not executed"
    [padded] = t.steps[1].observation.results
    assert (
        padded.content == msgs[6]["content"]
        and "action was not executed" in padded.content
        and padded.is_error is True
    )
    assert t.steps[1].flags == ["submitted", "observation_not_sent"]


def test_text_based_actions_have_no_tool_call_and_observations_are_user_messages():
    path = native_dir() / "mini-swe-agent" / "real-2.4.6_textbased.traj.json"
    msgs = json.loads(path.read_text())["messages"]
    t = read_native(path)[0].trajectory
    assert [s.action.tool_calls for s in t.steps] == [[], []]
    assert "```mswea_bash_command" in t.steps[0].action.text
    assert [m.parts[0].text for m in t.steps[0].observation.messages] == [msgs[3]["content"]]
    # the submit step is followed by the exit record only: nothing unsent to flag
    assert t.steps[1].flags == ["submitted"] and t.meta["exit"]["exit_status"] == "Submitted"


def test_v1_submission_message_is_kept_and_flagged():
    path = native_dir() / "mini-swe-agent" / "v1_gemini-3-pro_django__django-16255.traj.json"
    doc = json.loads(path.read_text())
    t = read_native(path)[0].trajectory
    assert doc["trajectory_format"] == "mini-swe-agent-1" and t.meta["instance_id"] == doc["instance_id"]
    assert len(t.steps) == sum(m["role"] == "assistant" for m in doc["messages"]) == 17
    assert (
        t.steps[-1].observation.messages[0].parts[0].text
        == doc["messages"][-1]["content"]
        == doc["info"]["submission"]
    )
    assert t.steps[-1].flags == ["submitted", "observation_not_sent"]


# --------------------------------------------------------------------------- small inputs


def _write(tmp_path: Path, messages, fmt="mini-swe-agent-1.1", name="t.traj.json") -> Path:
    p = tmp_path / name
    p.write_text(
        json.dumps(
            {
                "info": {"mini_version": "2.4.6", "exit_status": "Submitted"},
                "messages": messages,
                "trajectory_format": fmt,
            }
        )
    )
    return p


_HEAD = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK"}]


def _call(cid: str, command: str) -> dict:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }


def test_a_format_error_after_a_dropped_tool_calling_reply_is_a_step_of_its_own(tmp_path):
    p = _write(
        tmp_path,
        _HEAD
        + [
            {"role": "assistant", "content": None, "tool_calls": [_call("c1", "ls")]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt", "extra": {"returncode": 0}},
            # the next reply had no tool call: not stored, only the format error follows
            {
                "role": "user",
                "content": "Error: No tool calls found",
                "extra": {"interrupt_type": "FormatError"},
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c2", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
            },
            {"role": "tool", "tool_call_id": "c2", "content": "not executed", "extra": {"returncode": -1}},
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted", "submission": ""}},
        ],
    )
    t = read_native(p)[0].trajectory
    assert len(t.steps) == 3
    dropped = t.steps[1]
    assert dropped.action.text == "" and dropped.action.tool_calls == []
    assert dropped.flags == ["action_dropped_by_agent", "action_not_stored"]
    assert [m.parts[0].text for m in dropped.observation.messages] == ["Error: No tool calls found"]
    assert t.steps[0].observation.messages == []
    assert t.steps[2].flags == ["submitted", "observation_not_sent"]
    assert set(t.meta["flags"]) == {
        "action_dropped_by_agent",
        "action_not_stored",
        "submitted",
        "observation_not_sent",
    }


def test_a_text_based_format_error_keeps_the_dropped_reply_text(tmp_path):
    p = _write(
        tmp_path,
        _HEAD
        + [
            {
                "role": "user",
                "content": "Please always provide EXACTLY ONE action",
                "extra": {
                    "interrupt_type": "FormatError",
                    "n_actions": 0,
                    "model_response": "I think I am done.",
                },
            },
            {"role": "assistant", "content": "ok\n\n```mswea_bash_command\nls\n```"},
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>\n</output>",
                "extra": {"returncode": 0},
            },
        ],
    )
    t = read_native(p)[0].trajectory
    assert [s.action.text for s in t.steps] == ["I think I am done.", "ok\n\n```mswea_bash_command\nls\n```"]
    assert (
        t.steps[0].flags == ["action_dropped_by_agent"] and t.steps[1].flags == []
    )  # no submit: nothing flagged
    assert t.task == "TASK"


def test_a_v1_format_error_follows_its_stored_reply(tmp_path):
    p = _write(
        tmp_path,
        _HEAD
        + [
            {"role": "assistant", "content": "two blocks ```bash\na\n``` ```bash\nb\n```"},
            {"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks."},
        ],
        fmt="mini-swe-agent-1",
    )
    t = read_native(p)[0].trajectory
    assert len(t.steps) == 1 and t.steps[0].flags == []
    assert t.steps[0].observation.messages[0].parts[0].text.startswith("Please always")


def test_responses_api_messages(tmp_path):
    p = _write(
        tmp_path,
        _HEAD
        + [
            {
                "object": "response",
                "model": "gpt-x",
                "status": "completed",
                "output": [
                    {"type": "message", "content": [{"type": "output_text", "text": "two calls"}]},
                    {
                        "type": "function_call",
                        "call_id": "fc1",
                        "name": "bash",
                        "arguments": '{"command":"a"}',
                    },
                    {
                        "type": "function_call",
                        "call_id": "fc2",
                        "name": "bash",
                        "arguments": '{"command": "b"}',
                    },
                ],
            },
            {"type": "function_call_output", "call_id": "fc2", "output": "B", "extra": {"returncode": 1}},
            {"type": "function_call_output", "call_id": "fc1", "output": "A", "extra": {"returncode": 0}},
        ],
    )
    t = read_native(p)[0].trajectory
    [s] = t.steps
    assert s.action.text == "two calls" and s.action.model == "gpt-x"
    assert [(c.id, c.arguments_raw) for c in s.action.tool_calls] == [
        ("fc1", '{"command":"a"}'),
        ("fc2", '{"command": "b"}'),
    ]
    assert [(r.call_id, r.content, r.is_error) for r in s.observation.results] == [
        ("fc1", "A", False),
        ("fc2", "B", True),
    ]


def test_a_call_without_result_ends_with_an_interrupted_observation(tmp_path):
    p = _write(
        tmp_path, _HEAD + [{"role": "assistant", "content": "", "tool_calls": [_call("c1", "sleep 100")]}]
    )
    result = read_native(p)[0]
    [s] = result.trajectory.steps
    assert s.flags == ["interrupted"] and [(r.call_id, r.content) for r in s.observation.results] == [
        ("c1", "")
    ]
    assert result.diagnostics.codes() == ["interrupted"]


# --------------------------------------------------------------------------- damaged input


def test_truncated_file_is_refused_naming_it(tmp_path):
    src = (native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json").read_bytes()
    p = tmp_path / "cut.traj.json"
    p.write_bytes(src[: len(src) // 2])
    with pytest.raises(BadInputError) as exc:
        read_native(p, "mini-swe-agent")
    assert (
        str(p) in exc.value.message
        and "not a JSON document" in exc.value.message
        and exc.value.exit_code == 65
    )


def test_invalid_utf8_in_a_tool_output_is_kept_as_replacement_characters(tmp_path):
    p = _write(
        tmp_path,
        _HEAD
        + [
            {"role": "assistant", "content": "", "tool_calls": [_call("c1", "cat bin")]},
            {"role": "tool", "tool_call_id": "c1", "content": "A\udcffB", "extra": {"returncode": 0}},
        ],
    )
    p.write_bytes(p.read_bytes().replace(b"A\\udcffB", b"A\xff\xfeB"))
    result = read_native(p)[0]
    assert result.trajectory.steps[0].observation.results[0].content == "A\ufffd\ufffdB"
    assert result.diagnostics.codes() == ["invalid_utf8"]


def test_lone_surrogate_in_a_tool_output_is_flagged(tmp_path):
    p = _write(
        tmp_path,
        _HEAD
        + [
            {"role": "assistant", "content": "", "tool_calls": [_call("c1", "x")]},
            {"role": "tool", "tool_call_id": "c1", "content": "A\ud800B", "extra": {"returncode": 0}},
        ],
    )
    result = read_native(p)[0]
    assert result.trajectory.steps[0].observation.results[0].content == "A\ufffdB"
    assert result.diagnostics.codes() == ["lone_surrogate"]


def test_wrong_format_given_with_agent_is_refused(tmp_path):
    openhands = native_dir() / "openhands" / "tests_runtime_trajs_basic.json"
    message = refused(openhands, "mini-swe-agent")
    assert (
        "messages[0]" in message
        and "without a role" in message
        and "expected a mini-swe-agent trajectory" in message
    )
    opencode = native_dir() / "opencode" / "real-1.18.33_export_single.json"
    message = refused(opencode, "mini-swe-agent")
    assert str(opencode) in message and "messages[0]: a message without a role" in message
    jsonl = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    message = refused(jsonl, "mini-swe-agent")
    assert (
        str(jsonl) in message
        and "not a JSON document" in message
        and "expected a mini-swe-agent trajectory" in message
    )


@pytest.mark.parametrize(
    ("content", "says"),
    bad_documents(
        (b"[]", "messages: no messages (an empty list)"),
        (
            b'{"info": {}, "messages": [], "trajectory_format": "mini-swe-agent-1.1"}',
            "messages: no messages (an empty list)",
        ),
        (b'{"history": []}', "document: not a mini-swe-agent trajectory: no `messages` list"),
    ),
)
def test_bad_input_is_refused_naming_the_file_and_the_shape_expected(tmp_path, content, says):
    assert_refused_naming_file_and_shape(
        tmp_path / "bad.json", content, "mini-swe-agent", says, "a mini-swe-agent trajectory: a JSON object"
    )


def test_a_version_with_thousands_of_digits_is_refused(tmp_path):
    p = _write(tmp_path, _HEAD, fmt="mini-swe-agent-" + "1" * 5000)
    assert "trajectory_format" in refused(p)


def test_unknown_major_version_is_refused_naming_trajectory_format(tmp_path):
    p = _write(tmp_path, _HEAD, fmt="mini-swe-agent-2.0")
    with pytest.raises(BadInputError) as exc:
        read_native(p)
    assert (
        "trajectory_format" in exc.value.message
        and "major 2" in exc.value.message
        and exc.value.exit_code == 65
    )


def test_newer_minor_version_is_read_with_a_warning(tmp_path):
    p = _write(tmp_path, _HEAD + [{"role": "assistant", "content": "hi"}], fmt="mini-swe-agent-1.2")
    result = read_native(p)[0]
    assert [s.action.text for s in result.trajectory.steps] == ["hi"]
    assert result.diagnostics.codes() == ["unverified_profile"]
    assert result.diagnostics.warnings[0].where == "trajectory_format"


def test_an_unknown_message_shape_after_the_start_is_left_out_with_a_warning(tmp_path):
    p = _write(tmp_path, _HEAD + [{"role": "assistant", "content": "hi"}, {"kind": "something new"}])
    result = read_native(p)[0]
    assert [s.action.text for s in result.trajectory.steps] == ["hi"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("unknown_record", "messages[3]")]
    assert [(lo.where, lo.kind) for lo in result.trajectory.left_out] == [("messages[3]", "unknown")]


def test_a_submit_step_whose_result_the_file_lacks_is_interrupted_not_observation_not_sent(tmp_path):
    """The real 2.4.6 run (tests/corpus/native/mini-swe-agent) with its last tool message, the
    submit call's padded result, lost: the file holds no observation of step 2, so it is not
    flagged ``observation_not_sent`` ("the observation is in the file but the model never saw
    it") beside ``interrupted``, as it was; the observation it holds is flagged as before."""
    doc = json.loads((native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json").read_text())
    assert doc["messages"][5]["role"] == "tool" and doc["messages"][6]["role"] == "exit"
    del doc["messages"][5]
    p = tmp_path / "lost.traj.json"
    p.write_text(json.dumps(doc))
    result, _ = read_native(p, "mini-swe-agent")
    last = list(result.trajectory.steps)[-1]
    assert last.flags == ["interrupted", "submitted"]
    assert "observation_not_sent" not in result.trajectory.meta["flags"]
