"""Each native adapter on small inputs written here: ordering by the format's own chain,
batches, results in call order, interrupted calls, left-out records, compaction, upserts."""

from __future__ import annotations

import json
from pathlib import Path

from native_helpers import opencode_db
from pvisor.adapters.native import read_native


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --------------------------------------------------------------------------- Claude Code


def _cc(kind: str, uuid: str, parent: str | None, **kw) -> dict:
    rec = {
        "parentUuid": parent,
        "isSidechain": False,
        "userType": "external",
        "cwd": "/w",
        "sessionId": "S",
        "version": "2.1.38",
        "type": kind,
        "uuid": uuid,
    }
    rec.update(kw)
    return rec


def _asst(uuid: str, parent: str, mid: str, block: dict, **kw) -> dict:
    return _cc(
        "assistant",
        uuid,
        parent,
        message={
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [block],
            "stop_reason": None,
            "usage": {"output_tokens": 1},
        },
        **kw,
    )


def _result(uuid: str, parent: str, call: str, text: str, error: bool = False) -> dict:
    block = {"type": "tool_result", "tool_use_id": call, "content": text}
    if error:
        block["is_error"] = True
    return _cc(
        "user", uuid, parent, message={"role": "user", "content": [block]}, toolUseResult={"stdout": text}
    )


def _user(uuid: str, parent: str | None, text: str, **kw) -> dict:
    return _cc("user", uuid, parent, message={"role": "user", "content": text}, **kw)


def _claude_session(tmp_path: Path) -> Path:
    """Task; A1 = one response (text, thinking, 2 parallel calls, a 3rd call written after
    the first result) split over lines whose results fork the chain; A2 text; written with
    step 2's lines first in the file (order comes from parentUuid, not the file)."""
    recs_a1 = [
        {"type": "queue-operation", "operation": "enqueue", "sessionId": "S"},
        _user("u1", None, "fix the bug"),
        _asst("a1", "u1", "msg_1", {"type": "text", "text": "Looking."}),
        _asst("a2", "a1", "msg_1", {"type": "thinking", "thinking": "hmm", "signature": "sig"}),
        _asst(
            "a3",
            "a2",
            "msg_1",
            {"type": "tool_use", "id": "toolu_A", "name": "Bash", "input": {"command": "ls"}},
        ),
        _cc("progress", "p1", "a3", data={"type": "hook_progress"}),
        _asst(
            "a4",
            "p1",
            "msg_1",
            {"type": "tool_use", "id": "toolu_B", "name": "Glob", "input": {"pattern": "*.py"}},
        ),
        # results fork: B's result is written first, each parented on its own tool_use line
        _result("r2", "a4", "toolu_B", "x.py"),
        _result("r1", "a3", "toolu_A", "x.py\ny.py", error=True),
        # the same response goes on after a result (Claude Code ran the first calls early)
        _asst(
            "a5",
            "r2",
            "msg_1",
            {"type": "tool_use", "id": "toolu_C", "name": "Read", "input": {"file_path": "x.py"}},
        ),
        _result("r3", "a5", "toolu_C", "print(1)"),
        {
            "parentUuid": "r3",
            "isSidechain": True,
            "type": "user",
            "uuid": "side1",
            "sessionId": "S",
            "version": "2.1.38",
            "message": {"role": "user", "content": "subagent prompt"},
        },
    ]
    recs_a2 = [
        _asst("b1", "r3", "msg_2", {"type": "text", "text": "Done."}),
        {"type": "last-prompt", "lastPrompt": "fix the bug", "leafUuid": "b1", "sessionId": "S"},
    ]
    return _jsonl(tmp_path / "s.jsonl", recs_a2 + recs_a1)


def test_claude_code_one_response_over_many_lines_is_one_action_with_results_in_call_order(tmp_path):
    result, _ = read_native(_claude_session(tmp_path), "claude-code")
    t = result.trajectory
    assert t.task == "fix the bug" and t.system is None and t.tools is None and t.model == "claude-x"
    assert len(t.steps) == 2
    a1 = t.steps[0].action
    assert (
        a1.text == "Looking."
        and [r.text for r in a1.reasoning] == ["hmm"]
        and a1.reasoning[0].signature == "sig"
    )
    assert [(c.id, c.name, c.arguments_raw) for c in a1.tool_calls] == [
        ("toolu_A", "Bash", '{"command":"ls"}'),
        ("toolu_B", "Glob", '{"pattern":"*.py"}'),
        ("toolu_C", "Read", '{"file_path":"x.py"}'),
    ]
    obs = t.steps[0].observation
    assert [(r.call_id, r.content, r.is_error) for r in obs.results] == [
        ("toolu_A", "x.py\ny.py", True),
        ("toolu_B", "x.py", False),
        ("toolu_C", "print(1)", False),
    ]
    assert t.steps[1].action.text == "Done." and t.steps[1].observation.results == []
    kinds = {lo.kind for lo in t.left_out}
    assert {"queue-operation", "last-prompt", "sidechain", "progress/hook_progress"} <= kinds
    assert result.diagnostics.warnings == []


def test_claude_code_steps_after_the_last_last_prompt_record_are_read(tmp_path):
    # a session cut off mid-turn: its last last-prompt record names an earlier leaf
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "first"),
            _asst("a1", "u1", "msg_1", {"type": "text", "text": "one"}),
            {"type": "last-prompt", "lastPrompt": "first", "leafUuid": "a1", "sessionId": "S"},
            _user("u2", "a1", "second"),
            _asst("a2", "u2", "msg_2", {"type": "text", "text": "two"}),
        ],
    )
    t = read_native(p, "claude-code")[0].trajectory
    assert [s.action.text for s in t.steps] == ["one", "two"]


def test_claude_code_session_ending_in_system_and_progress_lines_keeps_every_step(tmp_path):
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "go"),
            _asst(
                "a1",
                "u1",
                "msg_1",
                {"type": "tool_use", "id": "toolu_A", "name": "Bash", "input": {"command": "ls"}},
            ),
            _asst(
                "a2",
                "a1",
                "msg_1",
                {"type": "tool_use", "id": "toolu_B", "name": "Bash", "input": {"command": "pwd"}},
            ),
            _result("r1", "a1", "toolu_A", "x"),  # a fork: r1 is a childless user line
            _result("r2", "a2", "toolu_B", "/w"),
            _asst("a3", "r2", "msg_2", {"type": "text", "text": "done"}),
            _cc("progress", "p1", "a3", data={"type": "hook_progress"}),
            _cc("system", "s1", "p1", subtype="turn_duration"),
        ],
    )
    t = read_native(p, "claude-code")[0].trajectory
    assert [s.action.text for s in t.steps] == ["", "done"]
    assert [r.call_id for r in t.steps[0].observation.results] == ["toolu_A", "toolu_B"]


def test_claude_code_call_without_result_ends_the_step_interrupted(tmp_path):
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "go"),
            _asst(
                "a1",
                "u1",
                "msg_1",
                {"type": "tool_use", "id": "toolu_A", "name": "Bash", "input": {"command": "sleep 99"}},
            ),
        ],
    )
    result, _ = read_native(p, "claude-code")
    [s] = result.trajectory.steps
    assert (
        s.flags == ["interrupted"]
        and s.observation.results[0].call_id == "toolu_A"
        and s.observation.results[0].content == ""
    )
    assert result.diagnostics.codes() == ["interrupted"]


def test_claude_code_compaction_keeps_the_history_and_flags_the_summary(tmp_path):
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "task one"),
            _asst("a1", "u1", "msg_1", {"type": "text", "text": "first"}),
            _cc(
                "system",
                "cb",
                None,
                subtype="compact_boundary",
                logicalParentUuid="a1",
                content="Conversation compacted",
            ),
            _user("sum", "cb", "This session is being continued. Summary: ...", isCompactSummary=True),
            _asst("a2", "sum", "msg_2", {"type": "text", "text": "second"}),
        ],
    )
    t = read_native(p, "claude-code")[0].trajectory
    assert [s.action.text for s in t.steps] == ["first", "second"]
    assert t.steps[0].flags == ["compaction"]
    assert t.steps[0].observation.messages[0].parts[0].text.startswith("This session is being continued")
    assert any(lo.kind == "compaction_boundary" for lo in t.left_out)


def test_claude_code_rewound_branch_is_left_out_and_subagent_files_are_linked_not_mixed(tmp_path):
    p = _jsonl(
        tmp_path / "S.jsonl",
        [
            _user("u1", None, "task"),
            _asst("a1", "u1", "msg_old", {"type": "text", "text": "abandoned"}),
            _asst("a2", "u1", "msg_new", {"type": "text", "text": "kept"}),
            _asst("a2", "u1", "msg_new", {"type": "text", "text": "kept"}),  # duplicated line
        ],
    )
    sub = tmp_path / "S" / "subagents"
    sub.mkdir(parents=True)
    _jsonl(sub / "agent-abc.jsonl", [_user("x1", None, "sub task")])
    result, _ = read_native(p, "claude-code")
    t = result.trajectory
    assert [s.action.text for s in t.steps] == ["kept"]  # the repeated line replaces, never doubles
    assert any(lo.kind == "branch" and "msg_old" in lo.reason for lo in t.left_out)
    assert t.meta["subagents"] == [{"path": str(sub / "agent-abc.jsonl"), "agent_id": "abc"}]
    assert any(lo.kind == "subagent" for lo in t.left_out)
    assert "duplicate_record" in result.diagnostics.codes()


def test_claude_code_damaged_lines_do_not_stop_the_read(tmp_path):
    p = tmp_path / "s.jsonl"
    lines = [
        json.dumps(_user("u1", None, "task")),
        "garbage {",
        "\x00" * 64,
        json.dumps(_asst("a1", "u1", "m1", {"type": "text", "text": "ok"})),
        '{"parentUuid": "a1", "trunc',
    ]
    p.write_text("\n".join(lines))
    result, _ = read_native(p, "claude-code")
    assert [s.action.text for s in result.trajectory.steps] == ["ok"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("malformed_line", "line 2"),
        ("nul_block", "line 3"),
        ("truncated_line", "line 5"),
    ]


# --------------------------------------------------------------------------- Codex


def _rl(kind: str, payload: dict) -> dict:
    return {"timestamp": "2026-01-01T00:00:00Z", "type": kind, "payload": payload}


def test_codex_reads_response_items_only_with_batches_and_outputs_in_call_order(tmp_path):
    p = _jsonl(
        tmp_path / "rollout.jsonl",
        [
            _rl("session_meta", {"id": "T", "cli_version": "0.171.0", "base_instructions": {"text": "SYS"}}),
            _rl(
                "response_item",
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "<permissions>"}],
                },
            ),
            _rl(
                "response_item",
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "do it"}]},
            ),
            _rl("event_msg", {"type": "user_message", "message": "do it"}),
            _rl("turn_context", {"model": "gpt-x"}),
            _rl(
                "response_item",
                {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": "plan"}],
                    "encrypted_content": "ENC",
                },
            ),
            _rl(
                "response_item",
                {
                    "type": "function_call",
                    "name": "exec_command",
                    "arguments": '{"cmd": "a"}',
                    "call_id": "c1",
                },
            ),
            _rl(
                "response_item",
                {
                    "type": "custom_tool_call",
                    "name": "apply_patch",
                    "input": "*** Begin Patch",
                    "call_id": "c2",
                },
            ),
            _rl("event_msg", {"type": "token_count", "info": {"last_token_usage": {"total_tokens": 5}}}),
            _rl("response_item", {"type": "custom_tool_call_output", "call_id": "c2", "output": "patched"}),
            _rl("response_item", {"type": "function_call_output", "call_id": "c1", "output": "A"}),
            _rl("event_msg", {"type": "exec_command_end", "call_id": "c1"}),
            _rl(
                "response_item",
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done"}],
                },
            ),
            _rl("brand_new_type", {"x": 1}),
        ],
    )
    result, _ = read_native(p)
    t = result.trajectory
    assert (
        t.system == "SYS"
        and t.task == "do it"
        and t.meta["task_context"] == ["<permissions>"]
        and t.model == "gpt-x"
    )
    assert len(t.steps) == 2
    a1 = t.steps[0].action
    assert [(c.id, c.kind, c.arguments_raw) for c in a1.tool_calls] == [
        ("c1", "function", '{"cmd": "a"}'),
        ("c2", "custom", "*** Begin Patch"),
    ]
    assert (
        a1.reasoning[0].text == "plan"
        and a1.reasoning[0].encrypted == "ENC"
        and a1.usage == {"total_tokens": 5}
    )
    assert [(r.call_id, r.content) for r in t.steps[0].observation.results] == [
        ("c1", "A"),
        ("c2", "patched"),
    ]
    assert t.steps[1].action.text == "done"
    assert result.diagnostics.codes() == ["unknown_record"]


def test_codex_newer_minor_version_warns_unverified_profile(tmp_path):
    p = _jsonl(tmp_path / "rollout.jsonl", [_rl("session_meta", {"id": "T", "cli_version": "0.999.0"})])
    result, _ = read_native(p, "codex")
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("unverified_profile", "line 1")]


# --------------------------------------------------------------------------- Gemini CLI


def test_gemini_cli_upserts_rewind_and_one_copy_of_a_repeated_result(tmp_path):
    call = {
        "id": "run_shell_command__x_0",
        "name": "run_shell_command",
        "args": {"command": "ls"},
        "status": "success",
        "result": [
            {
                "functionResponse": {
                    "id": "run_shell_command__x_0",
                    "name": "run_shell_command",
                    "response": {"output": "a.txt"},
                }
            }
        ],
    }
    p = _jsonl(
        tmp_path / "session-x.jsonl",
        [
            {"sessionId": "G", "projectHash": "h", "startTime": "t", "kind": "main"},
            {
                "$set": {
                    "messages": [{"id": "ctx", "type": "user", "content": [{"text": "<session_context>"}]}]
                }
            },
            {"id": "m1", "type": "user", "content": [{"text": "list files"}]},
            {"id": "m2", "type": "gemini", "content": "", "model": "gemini-x"},
            {
                "id": "m2",
                "type": "gemini",
                "content": "",
                "model": "gemini-x",
                "toolCalls": [call],
            },  # replaces m2 in place
            {
                "id": "m3",
                "type": "user",
                "content": [{"functionResponse": call["result"][0]["functionResponse"]}],
            },
            {"id": "m4", "type": "gemini", "content": "wrong turn", "model": "gemini-x"},
            {"$rewindTo": "m4"},
            {"id": "m5", "type": "info", "content": "UI note"},
            {"id": "m6", "type": "gemini", "content": "There is a.txt", "model": "gemini-x"},
            {"$set": {"lastUpdated": "t2"}},
        ],
    )
    t = read_native(p)[0].trajectory
    assert (
        t.task == "list files"
        and t.meta["task_context"] == ["<session_context>"]
        and t.meta["lastUpdated"] == "t2"
    )
    assert [s.action.text for s in t.steps] == ["", "There is a.txt"]
    [c] = t.steps[0].action.tool_calls
    assert (c.id, c.name, c.arguments) == ("run_shell_command__x_0", "run_shell_command", {"command": "ls"})
    [r] = t.steps[0].observation.results
    assert r.content == call["result"] and r.is_error is False
    kinds = [lo.kind for lo in t.left_out]
    assert "rewound" in kinds and "functionResponse_copy" in kinds and "info" in kinds


def test_gemini_cli_legacy_json_with_an_error_call(tmp_path):
    p = tmp_path / "session-old.json"
    p.write_text(
        json.dumps(
            {
                "sessionId": "G",
                "projectHash": "h",
                "messages": [
                    {"id": "1", "type": "user", "content": "run"},
                    {
                        "id": "2",
                        "type": "gemini",
                        "content": "",
                        "toolCalls": [
                            {
                                "id": "run_shell_command-1",
                                "name": "run_shell_command",
                                "args": {"command": "false"},
                                "status": "error",
                                "result": [
                                    {
                                        "functionResponse": {
                                            "id": "run_shell_command-1",
                                            "name": "run_shell_command",
                                            "response": {"error": "exit 1"},
                                        }
                                    }
                                ],
                            }
                        ],
                    },
                ],
            }
        )
    )
    t = read_native(p)[0].trajectory
    [r] = t.steps[0].observation.results
    assert r.is_error is True and t.meta["format"] == "gemini-cli legacy session json"


# --------------------------------------------------------------------------- Qwen Code


def _q(kind: str, uuid: str, parent: str | None, parts: list | None = None, **kw) -> dict:
    rec = {
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": "Q",
        "timestamp": "t",
        "type": kind,
        "cwd": "/w",
        "version": "0.24.4",
    }
    if parts is not None:
        rec["message"] = {"role": "model" if kind == "assistant" else "user", "parts": parts}
    rec.update(kw)
    return rec


def test_qwen_code_chain_order_later_record_replaces_and_results_by_id(tmp_path):
    p = _jsonl(
        tmp_path / "q.jsonl",
        [
            _q("user", "u1", None, [{"text": "go"}]),
            _q("assistant", "a1", "u1", [{"text": "thinking...", "thought": True}]),
            _q("system", "s1", "a1", subtype="ui_telemetry"),
            _q(
                "assistant",
                "a1",
                "u1",
                [
                    {"text": "thinking...", "thought": True},
                    {"functionCall": {"id": "c1", "name": "run_shell_command", "args": {"command": "a"}}},
                    {"functionCall": {"id": "c2", "name": "run_shell_command", "args": {"command": "b"}}},
                ],
                model="qwen-x",
            ),
            _q(
                "tool_result",
                "t2",
                "a1",
                [
                    {
                        "functionResponse": {
                            "id": "c2",
                            "name": "run_shell_command",
                            "response": {"output": "B"},
                        }
                    }
                ],
            ),
            _q(
                "tool_result",
                "t1",
                "t2",
                [
                    {
                        "functionResponse": {
                            "id": "c1",
                            "name": "run_shell_command",
                            "response": {"error": "boom"},
                        }
                    }
                ],
                toolCallResult={"callId": "c1", "status": "error"},
            ),
            _q("assistant", "a2", "t1", [{"text": "done"}], model="qwen-x"),
        ],
    )
    result, _ = read_native(p)
    t = result.trajectory
    assert t.task == "go" and [s.action.text for s in t.steps] == ["", "done"]
    a1 = t.steps[0].action
    assert [c.id for c in a1.tool_calls] == ["c1", "c2"] and a1.reasoning[0].text == "thinking..."
    assert [(r.call_id, r.is_error) for r in t.steps[0].observation.results] == [("c1", True), ("c2", False)]
    assert result.diagnostics.codes() == ["duplicate_record"]


# --------------------------------------------------------------------------- mini-swe-agent


def test_mini_swe_agent_tool_calling_with_parallel_calls_and_a_format_error(tmp_path):
    p = tmp_path / "t.traj.json"
    p.write_text(
        json.dumps(
            {
                "trajectory_format": "mini-swe-agent-1.1",
                "info": {"mini_version": "2.4.6"},
                "messages": [
                    {"role": "system", "content": "SYS"},
                    {"role": "user", "content": "TASK"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "bash", "arguments": '{"command": "a"}'},
                            },
                            {
                                "id": "c2",
                                "type": "function",
                                "function": {"name": "bash", "arguments": '{"command": "b"}'},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "A", "extra": {"returncode": 0}},
                    {"role": "tool", "tool_call_id": "c2", "content": "B", "extra": {"returncode": 2}},
                    {"role": "assistant", "content": "no tool call here"},
                    {
                        "role": "user",
                        "content": "Format error: ...",
                        "extra": {"interrupt_type": "FormatError"},
                    },
                    {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
                ],
            }
        )
    )
    t = read_native(p)[0].trajectory
    assert t.system == "SYS" and t.task == "TASK" and len(t.steps) == 2
    assert [(c.id, c.arguments_raw) for c in t.steps[0].action.tool_calls] == [
        ("c1", '{"command": "a"}'),
        ("c2", '{"command": "b"}'),
    ]
    assert [(r.content, r.is_error) for r in t.steps[0].observation.results] == [("A", False), ("B", True)]
    assert t.steps[1].observation.messages[0].parts[0].text == "Format error: ..."
    assert [lo.kind for lo in t.left_out] == ["exit"]


# --------------------------------------------------------------------------- OpenCode


def _oc_export(tmp_path: Path) -> Path:
    p = tmp_path / "export.json"
    p.write_text(
        json.dumps(
            {
                "info": {"id": "ses_1", "version": "1.18.33", "projectID": "global"},
                "messages": [
                    {
                        "info": {"id": "msg_1", "sessionID": "ses_1", "role": "user"},
                        "parts": [{"id": "p1", "type": "text", "text": '"task"'}],
                    },
                    {
                        "info": {"id": "msg_2", "sessionID": "ses_1", "role": "assistant", "modelID": "m"},
                        "parts": [
                            {"id": "p2", "type": "step-start"},
                            {
                                "id": "p3",
                                "type": "tool",
                                "callID": "c1",
                                "tool": "bash",
                                "state": {"status": "completed", "input": {"command": "a"}, "output": "A"},
                            },
                            {
                                "id": "p4",
                                "type": "tool",
                                "callID": "c2",
                                "tool": "bash",
                                "state": {"status": "error", "input": {"command": "b"}, "error": "failed"},
                            },
                            {
                                "id": "p5",
                                "type": "step-finish",
                                "reason": "tool-calls",
                                "tokens": {"input": 1},
                            },
                            {"id": "p6", "type": "step-start"},
                            {
                                "id": "p7",
                                "type": "tool",
                                "callID": "c3",
                                "tool": "bash",
                                "state": {"status": "running", "input": {"command": "c"}},
                            },
                            {"id": "p8", "type": "step-finish", "reason": "tool-calls"},
                        ],
                    },
                ],
            }
        )
    )
    return p


def test_opencode_step_brackets_are_actions_and_the_call_part_holds_its_result(tmp_path):
    result, notes = read_native(_oc_export(tmp_path))
    t = result.trajectory
    assert notes == ["detected format: opencode"] and t.task == '"task"' and len(t.steps) == 2
    assert [(r.call_id, r.content, r.is_error) for r in t.steps[0].observation.results] == [
        ("c1", "A", False),
        ("c2", "failed", True),
    ]
    assert t.steps[0].action.stop_reason == "tool-calls"
    assert t.steps[1].flags == ["interrupted"] and result.diagnostics.codes() == ["interrupted"]


def test_opencode_db_is_read_read_only(tmp_path):
    db_path = opencode_db(
        tmp_path / "opencode.db",
        [("ses_1", None, "1.18.33", "/w", "t", 5), ("ses_0", "ses_1", "1.18.33", "/w", "sub", 9)],
        [("msg_1", "ses_1", {"role": "user"}), ("msg_2", "ses_1", {"role": "assistant", "modelID": "m"})],
        [
            ("prt_1", "msg_1", "ses_1", {"type": "text", "text": "hello"}),
            ("prt_2", "msg_2", "ses_1", {"type": "text", "text": "hi"}),
        ],
    )
    before = db_path.read_bytes()
    db_path.chmod(0o444)
    t = read_native(db_path)[0].trajectory
    assert t.task == "hello" and [s.action.text for s in t.steps] == ["hi"]
    assert [lo.where for lo in t.left_out] == ["session ses_0"]  # the subagent session
    assert db_path.read_bytes() == before and not (tmp_path / "opencode.db-wal").exists()


# --------------------------------------------------------------------------- OpenHands


def test_openhands_calls_of_one_response_are_one_batch_with_exact_arguments(tmp_path):
    resp = {
        "id": "chatcmpl-1",
        "model": "gpt-x",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "two calls",
                    "tool_calls": [
                        {"id": "t1", "function": {"name": "execute_bash", "arguments": '{"command":  "a"}'}},
                        {"id": "t2", "function": {"name": "execute_bash", "arguments": '{"command": "b"}'}},
                    ],
                },
            }
        ],
    }
    events = [
        {
            "id": 0,
            "source": "agent",
            "action": "system",
            "args": {
                "content": "SYS",
                "tools": [{"type": "function", "function": {"name": "execute_bash", "parameters": {}}}],
                "openhands_version": "0.58.0",
            },
        },
        {"id": 1, "source": "user", "action": "message", "args": {"content": "TASK"}},
        {
            "id": 2,
            "source": "agent",
            "action": "run",
            "args": {"command": "a"},
            "tool_call_metadata": {
                "function_name": "execute_bash",
                "tool_call_id": "t1",
                "model_response": resp,
                "total_calls_in_response": 2,
            },
        },
        {
            "id": 3,
            "source": "agent",
            "action": "run",
            "args": {"command": "b"},
            "tool_call_metadata": {
                "function_name": "execute_bash",
                "tool_call_id": "t2",
                "model_response": resp,
                "total_calls_in_response": 2,
            },
        },
        {
            "id": 4,
            "source": "agent",
            "observation": "run",
            "content": "B",
            "cause": 3,
            "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": "t2"},
        },
        {
            "id": 5,
            "source": "agent",
            "observation": "run",
            "content": "A",
            "cause": 2,
            "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": "t1"},
        },
        {"id": 6, "source": "environment", "observation": "agent_state_changed", "content": "", "extras": {}},
    ]
    p = tmp_path / "traj.json"
    p.write_text(json.dumps(events))
    t = read_native(p)[0].trajectory
    assert t.system == "SYS" and [x.name for x in t.tools] == ["execute_bash"] and t.task == "TASK"
    [s] = t.steps
    assert s.action.text == "two calls" and [c.arguments_raw for c in s.action.tool_calls] == [
        '{"command":  "a"}',
        '{"command": "b"}',
    ]
    assert [(r.call_id, r.content) for r in s.observation.results] == [("t1", "A"), ("t2", "B")]
