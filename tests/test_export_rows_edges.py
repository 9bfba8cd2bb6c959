"""Rows' edge cases a trainer would train wrong on (issue 41, the attacker's findings;
docs/exports.md "rows and parquet"): segments join only steps a chat template renders as an
extension, gaps and partial prompts are flagged and break, and odd inputs never crash a writer.
In process, on small inputs written here."""

from __future__ import annotations

import json

from cli_helpers import pvisor_main

from pvisor.adapters.exports.chat_rows import Segmenter, chat_request
from pvisor.adapters.exports.rows import iter_rows
from pvisor.adapters.native import read_native
from pvisor.adapters.protocols.validate import validate_request
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal
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


def _responses_run(path, first: int) -> list[dict]:
    """The rows of a Responses run of three requests chained by ``previous_response_id`` (each
    sends only the new tool output), recorded from request ``first`` on (0: all of them)."""
    tool = {"type": "function", "name": "shell", "description": "sh", "parameters": {"type": "object"}}

    def reply(rid: str, out: dict) -> bytes:
        usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
        body = {"id": rid, "object": "response", "status": "completed", "model": "gpt-5"}
        return json.dumps({**body, "output": [out], "usage": usage}).encode()

    def call(i: int) -> dict:
        args = json.dumps({"cmd": f"echo {i}"})
        return {
            "type": "function_call",
            "id": f"fc_{i}",
            "call_id": f"call_{i}",
            "name": "shell",
            "arguments": args,
        }

    def output(i: int) -> list[dict]:
        return [{"type": "function_call_output", "call_id": f"call_{i}", "output": str(i)}]

    task = [{"role": "user", "content": [{"type": "input_text", "text": "TASK"}]}]
    done = {
        "type": "message",
        "id": "m3",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "ok"}],
    }
    base = {"model": "gpt-5", "instructions": "SYS", "tools": [tool], "store": True}
    exchanges = [
        ({**base, "input": task}, reply("resp_1", call(1))),
        ({**base, "previous_response_id": "resp_1", "input": output(1)}, reply("resp_2", call(2))),
        ({**base, "previous_response_id": "resp_2", "input": output(2)}, reply("resp_3", done)),
    ]
    with Journal.open(path) as j:
        j.create_run(Run(id="prid", agent="codex", agent_version="0.171.0"))
        for body, answer in exchanges[first:]:
            j.record_exchange(
                "prid", "POST", "/v1/responses", [("content-type", "application/json")],
                protocol="openai-responses", status=200, request_body=json.dumps(body).encode(),
                response_body=answer, response_headers=[("content-type", "application/json")],
            )  # fmt: skip
    with JournalReader(path) as r:
        return list(iter_rows(r, "prid", bodies=False))


def test_a_responses_run_chained_by_previous_response_id_has_whole_prompts(tmp_path):
    rows = _responses_run(tmp_path / "j.sqlite", 0)
    assert [(r["segment"], r["segment_break"], r["flags"]) for r in rows] == [(0, None, [])] * 3
    # each prompt holds the task and every earlier call, as the server held them
    assert [m["role"] for m in rows[2]["prompt"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    for before, row in zip(rows, rows[1:]):
        assert row["prompt"][: len(before["prompt"]) + 1] == [*before["prompt"], before["completion"]]


def test_a_prompt_whose_earlier_response_is_not_in_the_journal_is_flagged_and_breaks(tmp_path):
    rows = _responses_run(tmp_path / "j.sqlite", 1)
    got = [(r["segment"], r["segment_break"], r["flags"]) for r in rows]
    assert got == [(0, None, ["prompt_incomplete"]), (1, "prompt_incomplete", ["prompt_incomplete"])]
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "tool"]


def test_the_chat_validator_refuses_a_call_no_tool_message_answers():
    call = {"role": "assistant", "content": None, "tool_calls": [_call("{}")]}
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}, call]}
    assert validate_request("openai-chat", body) == []  # the reply judged: nothing follows it
    body["messages"].append({"role": "user", "content": "and?"})
    assert [(p.path, p.what) for p in validate_request("openai-chat", body)] == [
        ("body.messages[1].tool_calls[0]", "no tool message answers tool_call_id 'c1' before the next turn")
    ]
    body["messages"].insert(2, {"role": "tool", "content": "ok", "tool_call_id": "c1"})
    assert validate_request("openai-chat", body) == []


CODEX_SERVER_CALLS = [
    *CODEX_ORPHAN[:3],
    {"type": "response_item", "payload": {"type": "web_search_call", "id": "ws-1", "status": "completed",
                                          "action": {"type": "search", "query": "pvisor"}}},
    {"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                          "content": [{"type": "output_text", "text": "found it"}]}},
    {"type": "response_item", "payload": {"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": "thanks"}]}},
    {"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                          "content": [{"type": "output_text", "text": "done"}]}},
]  # fmt: skip


def test_calls_the_provider_ran_are_listed_as_server_tools_not_sent_as_function_calls(tmp_path):
    result, _ = read_native(_write_jsonl(tmp_path / "rollout.jsonl", CODEX_SERVER_CALLS))
    rows = list(iter_native_rows(result, "codex"))
    assert any(c["kind"] == "server" for r in rows for c in r["action"]["tool_calls"])
    for r in rows:
        body = chat_request("m", r["prompt"], r["tools"], r["completion"])
        assert validate_request("openai-chat", body) == [], r["step"]
        calls = [c for m in [*r["prompt"], r["completion"]] for c in m.get("tool_calls") or []]
        assert calls == [], r["step"]
    assert all({"name": "web_search_call", "kind": "server"} in r["tools_dropped"] for r in rows)


def _chat_run(
    path, replies: list[dict], tools: list[str], usage: dict | None = None, result: str = "ok"
) -> None:
    """A Chat Completions run ``c`` of one request per reply message, offering function tools
    ``tools``; each request sends the earlier replies back with a result for each call; each
    reply gives ``usage`` when not None; each result is the text ``result``."""

    def tool(name: str) -> dict:
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}

    messages: list[dict] = [{"role": "user", "content": "go"}]
    with Journal.open(path) as j:
        j.create_run(Run(id="c", agent="opencode", agent_version="1.0.0"))
        for n, reply in enumerate(replies):
            body = {"model": "m", "messages": messages, "tools": [tool(t) for t in tools]}
            answer = {"id": f"r{n}", "object": "chat.completion", "model": "m", "created": 0,
                      "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]}  # fmt: skip
            if usage is not None:
                answer["usage"] = usage
            j.record_exchange(
                "c", "POST", "/v1/chat/completions", [("content-type", "application/json")],
                protocol="openai-chat", status=200, request_body=json.dumps(body).encode(),
                response_body=json.dumps(answer).encode(),
                response_headers=[("content-type", "application/json")],
            )  # fmt: skip
            results = [
                {"role": "tool", "tool_call_id": c["id"], "content": result}
                for c in reply.get("tool_calls", [])
            ]
            messages = [*messages, reply, *results]


def _fn(cid: str, name: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_tools_the_completion_calls_but_the_rows_do_not_offer_are_listed_and_warned(tmp_path):
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [_fn("a", "bash"), _fn("b", "WebSearch")]},
        {"role": "assistant", "content": None, "tool_calls": [_fn("c", "Glob"), _fn("d", "WebSearch")]},
        {"role": "assistant", "content": "done"},
    ]
    _chat_run(tmp_path / "j.sqlite", replies, ["bash"])
    for fmt in ("rows", "parquet"):
        proc = pvisor_main(
            ["--journal", tmp_path / "j.sqlite", "journal", "export", "c", "--format", fmt, "--no-progress"],
            text=fmt == "rows",
        )
        assert proc.returncode == 0, proc.stderr
        stderr = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode()
        warnings = [x for x in stderr.splitlines() if x.startswith("pvisor: warning:")]
        assert len(warnings) == 1 and "do not offer: WebSearch, Glob " in warnings[0], stderr
    rows = [
        json.loads(x)
        for x in pvisor_main(
            ["--journal", tmp_path / "j.sqlite", "journal", "export", "c", "--format", "rows"]
        ).stdout.splitlines()
    ]
    assert [r["tools_unoffered"] for r in rows] == [["WebSearch"], ["Glob", "WebSearch"], []]


def test_usage_counts_outside_int64_are_null_and_parquet_is_written(tmp_path):
    raw = {"prompt_tokens": 2**63, "completion_tokens": -5, "total_tokens": 7}
    _chat_run(tmp_path / "j.sqlite", [{"role": "assistant", "content": "done"}], [], raw)
    base = ["--journal", tmp_path / "j.sqlite", "journal", "export", "c", "--no-progress"]
    proc = pvisor_main([*base, "--format", "parquet"])
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "rows.parquet").write_bytes(proc.stdout)
    import pyarrow.parquet as pq

    back = pq.read_table(tmp_path / "rows.parquet").to_pylist()
    assert back[0]["usage"]["input_tokens"] is None and back[0]["usage"]["output_tokens"] is None
    assert json.loads(back[0]["usage_raw"]) == raw  # the provider's counts kept as they came
    row = json.loads(pvisor_main([*base, "--format", "rows"]).stdout)
    assert (row["usage"]["input_tokens"], row["usage"]["output_tokens"]) == (None, None)


def test_requests_whose_bodies_do_not_parse_are_named_in_a_warning(tmp_path):
    # Node's JSON.stringify writes a cut emoji as a lone surrogate escape, which orjson refuses
    calls = [{"role": "assistant", "content": None, "tool_calls": [_fn(f"c{n}", "bash")]} for n in range(2)]
    _chat_run(
        tmp_path / "j.sqlite", [*calls, {"role": "assistant", "content": "done"}], ["bash"], result="\ud83d"
    )
    proc = pvisor_main(
        ["--journal", tmp_path / "j.sqlite", "journal", "export", "c", "--format", "rows"], text=True
    )
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("pvisor: warning:")]
    assert len(warnings) == 1 and "run c: 2 request(s) left out of the rows" in warnings[0], proc.stderr
    assert "no low surrogate" in warnings[0]


def test_parquet_row_groups_are_capped_by_their_text_too(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pvisor.adapters.exports.rows import write_parquet_rows

    schema = pa.schema([("step", pa.int64()), ("prompt", pa.string())])
    rows = [{"step": n, "prompt": "x" * 600} for n in range(5)]
    with (tmp_path / "r.parquet").open("wb") as f:
        assert write_parquet_rows(f, schema, iter(rows), batch_size=256, batch_bytes=1000) == 5
    back = pq.ParquetFile(tmp_path / "r.parquet")
    # a group is written once its rows hold 1000 bytes of text: two rows of 600 each
    assert [back.metadata.row_group(i).num_rows for i in range(back.num_row_groups)] == [2, 2, 1]
    assert back.read().to_pylist() == rows


def test_texts_are_joined_as_the_docs_say():
    # docs/exports.md "The messages": system blocks with a blank line, other text parts with nothing
    from pvisor.adapters.exports.chat_rows import chat_prompt
    from pvisor.adapters.protocols import get_protocol

    def prompt(protocol: str, body: dict, path: str) -> list[dict]:
        return chat_prompt(
            get_protocol(protocol).parse_request(json.dumps(body).encode(), path=path, query="")
        )[0]

    texts = [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]
    system = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    body = {"model": "m", "max_tokens": 5, "system": system, "messages": [{"role": "user", "content": texts}]}
    want = [{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "xy"}]
    assert prompt("anthropic", body, "/v1/messages") == want
    chat = [{"role": "system", "content": system}, {"role": "user", "content": texts}]
    assert prompt("openai-chat", {"model": "m", "messages": chat}, "/v1/chat/completions") == want
    gemini = {
        "systemInstruction": {"parts": [{"text": "A"}, {"text": "B"}]},
        "contents": [{"role": "user", "parts": [{"text": "x"}, {"text": "y"}]}],
    }
    assert prompt("gemini", gemini, "/v1beta/models/m:generateContent") == want
    dev = [{"type": "input_text", "text": "D1"}, {"type": "input_text", "text": "D2"}]
    responses = {"model": "m", "instructions": "A", "input": [{"role": "developer", "content": dev}]}
    got = prompt("openai-responses", responses, "/v1/responses")
    assert got == [{"role": "system", "content": "A"}, {"role": "system", "content": "D1D2"}]
