"""Rows' edge cases a trainer would train wrong on (issue 41, the attacker's findings;
docs/exports.md "rows and parquet"): segments join only steps a chat template renders as an
extension, gaps and partial prompts are flagged and break, and odd inputs never crash a writer.
In process, on small inputs written here."""

from __future__ import annotations

import json

from pvisor.adapters.exports.chat_rows import Segmenter
from pvisor.adapters.native import read_native
from pvisor.replay.native_rows import iter_native_rows


def _call(args: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}


def _segments(args_written: str, args_sent_back: str) -> list[tuple[int, str | None]]:
    """Two rows: the model wrote a call with ``args_written``, the agent sent it back with
    ``args_sent_back``."""
    task = {"role": "user", "content": "go"}
    done = {"role": "assistant", "content": "done"}
    written = {"role": "assistant", "content": None, "tool_calls": [_call(args_written)]}
    back = {"role": "assistant", "content": None, "tool_calls": [_call(args_sent_back)]}
    result = {"role": "tool", "content": "ok", "tool_call_id": "c1"}
    s = Segmenter()
    return [s.next([task], [], written, False, False), s.next([task, back, result], [], done, False, False)]


def test_arguments_sent_back_as_another_text_break_the_segment():
    assert _segments('{"a": 1}', '{"a": 1}') == [(0, None), (0, None)]
    # a chat template renders the string verbatim: another text is another prompt
    assert _segments("abc", '"abc"') == [(0, None), (1, "prefix_changed")]
    assert _segments('{"a":1,"a":2}', '{"a":2}') == [(0, None), (1, "arguments_reserialised")]
    assert _segments('{"n": 1e2}', '{"n":100.0}') == [(0, None), (1, "arguments_reserialised")]
    assert _segments('{"a": 1, "b": 2}', '{"b":2,"a":1}') == [(0, None), (1, "arguments_reserialised")]


def _tool(default) -> list[dict]:
    schema = {"type": "object", "properties": {"x": {"type": "integer", "default": default}}}
    return [{"type": "function", "function": {"name": "f", "description": "", "parameters": schema}}]


def test_tools_that_render_otherwise_break_the_segment_though_python_calls_them_equal():
    prompt = [{"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "ok"}
    s = Segmenter()
    got = [s.next(prompt, _tool(d), reply, False, False) for d in (1, True, 1.0, 1.0)]
    assert got == [(0, None), (1, "tools_changed"), (2, "tools_changed"), (3, "prefix_changed")]


CODEX_ORPHAN = [
    {"type": "session_meta", "payload": {"id": "s1", "cwd": "/w", "originator": "codex_exec",
                                         "cli_version": "0.171.0", "model_provider": "openai",
                                         "base_instructions": {"text": "You are Codex."}}},
    {"type": "turn_context", "payload": {"cwd": "/w", "model": "gpt-5"}},
    {"type": "response_item", "payload": {"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": "do the thing"}]}},
    {"type": "response_item", "payload": {"type": "function_call", "name": "exec_command",
                                          "arguments": '{"cmd": "echo 0"}', "call_id": "call_0"}},
    {"type": "response_item", "payload": {"type": "function_call_output", "call_id": "call_0",
                                          "output": "out 0\n"}},
    # a result naming no call: the file lost the action that made it (a gap row)
    {"type": "response_item", "payload": {"type": "function_call_output", "call_id": "ghost_0",
                                          "output": "orphan output 0"}},
    {"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                          "content": [{"type": "output_text", "text": "done"}]}},
]  # fmt: skip


def _write_jsonl(path, lines: list[dict]):
    ts = "2026-11-29T06:32:48.520Z"
    path.write_text("".join(json.dumps({"timestamp": ts, **x}) + "\n" for x in lines))
    return path


def test_a_gap_row_has_no_completion_and_the_segment_breaks_after_it(tmp_path):
    result, _ = read_native(_write_jsonl(tmp_path / "rollout.jsonl", CODEX_ORPHAN))
    rows = list(iter_native_rows(result, "codex"))
    got = [(r["step"], r["flags"], r["segment"], r["segment_break"]) for r in rows]
    assert got == [(1, [], 0, None), (2, ["lost_action"], 0, None), (3, [], 1, "no_completion")]
    assert rows[1]["completion"] == {"role": "assistant", "content": None}
