"""OpenAI Responses wire protocol (pvisor.adapters.protocols.openai_responses), on the real corpus:
tests/corpus/wire/openai-responses (decoded event payloads, framed here as SSE) and the Codex
0.171 requests in tests/corpus/requests/codex-0.171.0.jsonl."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson
import pytest

from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.adapters.protocols import openai_responses as R
from pvisor.adapters.protocols.base import IdSource
from pvisor.adapters.protocols.sse import decode_all
from pvisor.core.errors import BadInputError
from pvisor.journal.model import (
    Action,
    Conversation,
    Message,
    OtherPart,
    Reasoning,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)

STREAMS = ("function_call", "text_two_messages", "custom_tool_call")


# --------------------------------------------------------------------------- helpers


def chunk_lines(corpus: Path, name: str) -> list[bytes]:
    raw = (corpus / "wire" / "openai-responses" / f"{name}.chunks.jsonl").read_bytes()
    return [line for line in raw.split(b"\n") if line.strip()]


def frame(lines: list[bytes], eol: bytes = b"\n") -> bytes:
    """Each decoded payload as ``event: <type>`` + ``data: <json>`` + blank line."""
    out = bytearray()
    for line in lines:
        out += b"event: " + orjson.loads(line)["type"].encode() + eol + b"data: " + line + eol + eol
    return bytes(out)


def framings(corpus: Path, name: str) -> dict[str, bytes]:
    lines = chunk_lines(corpus, name)
    out = {"lf": frame(lines), "crlf": frame(lines, b"\r\n")}
    reframed = corpus / "wire" / "openai-responses" / f"{name}.reframed.sse"
    if reframed.exists():
        out["reframed"] = reframed.read_bytes()
    return out


def golden_bytes(final) -> bytes:
    return orjson.dumps(final, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def summary(r):
    return (r.final, r.complete, r.events, r.error, r.problems)


def requests(corpus: Path) -> list[dict]:
    raw = (corpus / "requests" / "codex-0.171.0.jsonl").read_bytes()
    return [orjson.loads(line) for line in raw.split(b"\n") if line.strip()]


def strip_raw(conv):
    """A copy without any ``raw`` (and no ``system_raw``). OtherPart keeps its raw: it is the
    part's whole content, not an extra (none occurs in the Codex corpus anyway)."""
    conv = copy.deepcopy(conv)
    conv.system_raw = None
    for t in conv.tools:
        t.raw = None
    for m in conv.messages:
        m.raw = None
        for p in m.parts:
            if not isinstance(p, OtherPart):
                p.raw = None
    return conv


def parts(conv, kind):
    return [p for m in conv.messages for p in m.parts if isinstance(p, kind)]


# --------------------------------------------------------------------------- registry and paths


def test_registry_and_paths():
    assert get_protocol("openai-responses") is R
    assert R.NAME == "openai-responses"
    assert R.matches("/v1/responses")
    assert not R.matches("/v1/responses/compact")
    assert not R.matches("/v1/chat/completions")
    assert protocol_for_path("/v1/responses") is R


def test_wants_stream():
    assert R.wants_stream("/v1/responses", "", b'{"model":"m","stream":true}')
    assert R.wants_stream("/v1/responses", "", {"stream": True})
    assert not R.wants_stream("/v1/responses", "", b'{"model":"m"}')
    assert not R.wants_stream("/v1/responses", "", b'{"stream":"yes"}')
    assert not R.wants_stream("/v1/responses", "", b"not json")


def test_error_body():
    body = orjson.loads(R.error_body(429, "slow down", "rate_limit_error"))
    assert body == {
        "error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": None}
    }


# --------------------------------------------------------------------------- reassembly: corpus


@pytest.mark.parametrize("name", STREAMS)
def test_corpus_stream_reassembles_to_golden(corpus, golden, name):
    results = {how: R.reassemble([data]) for how, data in framings(corpus, name).items()}
    first = results["lf"]
    assert first.complete and first.final is not None and first.error is None
    assert first.events == len(chunk_lines(corpus, name))
    for how, r in results.items():
        assert summary(r) == summary(first), how
    golden(f"wire/openai-responses/{name}.final.json", golden_bytes(first.final))


def test_function_call_facts(corpus):
    """PROVENANCE.md: concatenated deltas == arguments.done == completed arguments == {"city":"Beijing"}."""
    events = [orjson.loads(line) for line in chunk_lines(corpus, "function_call")]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done")
    assert all("obfuscation" in e for e in events if e["type"].endswith(".delta"))
    r = R.reassemble([frame(chunk_lines(corpus, "function_call"))])
    item = r.final["output"][0]
    assert deltas == done == item["arguments"] == '{"city":"Beijing"}'
    assert r.problems == []
    assert r.final["status"] == "completed"
    assert r.final["usage"]["total_tokens"] == 70
    assert item["call_id"] == "call_2FQdm3Br7Qb35YUBSkDR7kue" and item["name"] == "get_weather"
    # without the terminal event the items view gives the same output (deltas + output_item.done)
    truncated = R.reassemble([frame(chunk_lines(corpus, "function_call")[:-1])])
    assert not truncated.complete
    assert truncated.final["output"] == r.final["output"]
    assert truncated.final["status"] == "in_progress"


def test_function_call_deltas_alone_rebuild_arguments(corpus):
    """Without arguments.done, output_item.done and the terminal event the deltas still rebuild the call."""
    lines = [
        line
        for line in chunk_lines(corpus, "function_call")
        if orjson.loads(line)["type"]
        in ("response.created", "response.output_item.added", "response.function_call_arguments.delta")
    ]
    r = R.reassemble([frame(lines)])
    assert r.final["output"][0]["arguments"] == '{"city":"Beijing"}'
    assert not r.complete
    assert any("sequence_number gap" in p for p in r.problems)


def test_custom_tool_call_facts(corpus):
    r = R.reassemble([frame(chunk_lines(corpus, "custom_tool_call"))])
    item = r.final["output"][0]
    assert item["type"] == "custom_tool_call"
    assert item["input"] == "SELECT * FROM users WHERE age > 25"
    assert r.problems == []  # this hand-written fixture has no sequence_number at all
    action = R.response_to_action(r.final)
    assert [(c.kind, c.name, c.arguments_raw, c.arguments, c.id) for c in action.tool_calls] == [
        ("custom", "write_sql", "SELECT * FROM users WHERE age > 25", None, "call_custom_sql_001")
    ]


def test_text_two_messages_facts(corpus):
    """The upstream fixture is trimmed (sequence numbers jump, deltas are cut, output_index 1 is
    missing): the reassembler must say so and still take the completed response."""
    r = R.reassemble([frame(chunk_lines(corpus, "text_two_messages"))])
    assert r.complete
    assert [i["phase"] for i in r.final["output"]] == ["commentary", "final_answer"]
    assert "sequence_number gap: 6..40 missing before response.output_text.done (41)" in r.problems
    assert any("concatenated deltas 'Got it' differ" in p for p in r.problems)
    assert "output_index 1 never announced by output_item.added" in r.problems
    action = R.response_to_action(r.final)
    assert action.text.startswith("Got it — I’ll quickly check")
    assert action.text.endswith("investor-grade morning brief with timestamps.")
    assert action.usage["input_tokens"] == 7112 and action.stop_reason == "completed"


# --------------------------------------------------------------------------- render -> reassemble


@pytest.mark.parametrize("name", STREAMS)
def test_render_stream_round_trip(corpus, name):
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    final = R.reassemble([frame(chunk_lines(corpus, name))]).final
    data = R.render_stream(final)
    again = R.reassemble([data])
    assert again.final == final
    assert again.complete and again.problems == [] and again.error is None
    events = decode_all([data])
    assert [orjson.loads(e.data)["sequence_number"] for e in events] == list(range(len(events)))
    assert all(e.event == orjson.loads(e.data)["type"] for e in events)
    assert events[0].event == "response.created" and events[-1].event == "response.completed"
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events[2:-1]:  # created/in_progress/completed carry the corpus response object, which
        adapter.validate_python(orjson.loads(e.data))  # (trimmed fixtures) the current SDK rejects
    # the items view alone (terminal event dropped) rebuilds the same output
    cut = data[: data.rindex(b"event: response.completed")]
    partial = R.reassemble([cut])
    assert not partial.complete and partial.problems == []
    assert partial.final["output"] == final["output"]


def test_render_stream_without_terminal_status_round_trips():
    final = {
        "id": "resp_x",
        "object": "response",
        "status": "in_progress",
        "output": [
            {
                "id": "rs_1",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "think"}],
                "encrypted_content": "ENC",
            },
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [
                    {"type": "refusal", "refusal": "no"},
                    {"type": "output_text", "text": "hi", "annotations": []},
                ],
            },
            {
                "id": "ws_1",
                "type": "web_search_call",
                "status": "completed",
                "action": {"type": "search", "query": "q"},
            },
        ],
    }
    r = R.reassemble([R.render_stream(final)])
    assert r.final == final and not r.complete and r.problems == []


# --------------------------------------------------------------------------- split invariance


@pytest.mark.slow
@pytest.mark.parametrize("name", STREAMS)
def test_every_split_reassembles_the_same(corpus, name):
    """Every 2-chunk split of the LF framing (and of the CRLF framing of the smallest stream,
    where a split can fall between CR and LF), and every framing fed one byte at a time. (The
    SSE decoder's per-byte loop makes every split of every framing take a minute.)"""
    for how, data in framings(corpus, name).items():
        whole = summary(R.reassemble([data]))
        if how == "lf" or (how == "crlf" and name == "custom_tool_call"):
            for i in range(1, len(data)):
                assert summary(R.reassemble([data[:i], data[i:]])) == whole, (how, i)
        assert summary(R.reassemble(data[i : i + 1] for i in range(len(data)))) == whole, how


# --------------------------------------------------------------------------- stream damage


def test_sequence_gap_is_reported(corpus):
    lines = chunk_lines(corpus, "function_call")
    del lines[5]  # the delta with sequence_number 5
    r = R.reassemble([frame(lines)])
    assert "sequence_number gap: 5 missing before response.function_call_arguments.delta (6)" in r.problems
    assert r.complete  # the completed response is still the final object
    assert any("concatenated deltas" in p for p in r.problems)


def test_repeated_event_is_reported_and_ignored(corpus):
    lines = chunk_lines(corpus, "function_call")
    lines.insert(5, lines[4])  # delta 4 ("city") twice
    r = R.reassemble([frame(lines)])
    assert (
        "sequence_number 4 repeated (response.function_call_arguments.delta); the repeat is ignored"
        in r.problems
    )
    assert not any("differ" in p for p in r.problems)  # the repeat was not applied
    assert r.final["output"][0]["arguments"] == '{"city":"Beijing"}'


def test_out_of_order_is_reported(corpus):
    lines = chunk_lines(corpus, "function_call")
    lines[4], lines[5] = lines[5], lines[4]
    r = R.reassemble([frame(lines)])
    assert "sequence_number 4 (response.function_call_arguments.delta) arrived after 5" in r.problems


def test_truncated_stream_is_not_complete(corpus):
    data = frame(chunk_lines(corpus, "text_two_messages"))
    cut = data[: data.index(b"event: response.output_item.added", data.index(b'"sequence_number":43'))]
    r = R.reassemble([cut])
    assert not r.complete
    assert len(r.final["output"]) == 1 and r.final["output"][0]["status"] == "completed"
    assert r.final["id"] == "resp_0a63f40a2632b74300699f8818e5648196a8fa657ae8091421"
    assert R.reassemble([b""]).final is None and not R.reassemble([b""]).complete


def test_error_event_and_failed_response():
    err = {"type": "error", "code": "server_error", "message": "boom", "param": None, "sequence_number": 1}
    created = {
        "type": "response.created",
        "response": {"id": "resp_1", "status": "in_progress", "output": []},
        "sequence_number": 0,
    }
    data = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in (created, err)
    )
    r = R.reassemble([data])
    assert r.error == err and not r.complete
    failed = {
        "type": "response.failed",
        "response": {
            "id": "resp_1",
            "status": "failed",
            "output": [],
            "error": {"code": "server_error", "message": "boom"},
        },
        "sequence_number": 2,
    }
    r = R.reassemble([data + b"event: response.failed\ndata: " + orjson.dumps(failed) + b"\n\n"])
    assert r.complete and r.final["status"] == "failed" and r.error == err


def test_created_must_come_first(corpus):
    lines = chunk_lines(corpus, "function_call")
    lines[0], lines[1] = lines[1], lines[0]
    r = R.reassemble([frame(lines)])
    assert "response.created is not the first event" in r.problems
    assert "response.in_progress before response.created" in r.problems


def test_garbage_gives_problems_not_exceptions(corpus):
    data = frame(chunk_lines(corpus, "function_call"))
    junk = (
        b"data: {not json\n\n"
        b"data: [1,2,3]\n\n"
        b"event: response.output_text.delta\n"
        b'data: {"type":"response.output_text.delta","output_index":7,"delta":"x"}\n\n'
        b'data: {"type":"response.function_call_arguments.delta","output_index":0,"delta":5}\n\n'
        b'data: {"type":"response.content_part.added","output_index":0,"content_index":"x","part":1}\n\n'
        b"this is not sse\n\n"
        b"\xff\xfe\n\n"
    )
    cut = data.index(b"\n\n", data.index(b"response.output_item.added")) + 2  # between two events
    r = R.reassemble([data[:cut], junk, data[cut:]])
    assert r.final["output"][0]["arguments"] == '{"city":"Beijing"}' and r.complete
    text = "\n".join(r.problems)
    assert "data is not JSON" in text
    assert "data is a JSON array" in text
    assert "output_index 7 that no output_item.added announced" in text
    assert "delta for 'arguments' is not a string" in text
    assert "non-SSE line ignored: 'this is not sse'" in text


# --------------------------------------------------------------------------- requests


EXPECTED_MESSAGES = [4, 6, 8, 10, 4, 6]
EXPECTED_CALLS = [0, 1, 1, 2, 0, 2]


def test_corpus_requests_parse(corpus):
    reqs = requests(corpus)
    assert len(reqs) == len(EXPECTED_MESSAGES)
    for i, req in enumerate(reqs):
        assert req["path"] == "/v1/responses" and R.matches(req["path"])
        conv = R.parse_request(req["body"], path=req["path"])
        items = req["body"]["input"]
        assert conv.model == "gpt-5-codex" and conv.stream
        assert conv.system is None and conv.system_raw is None  # Codex 0.171 sends no instructions
        assert len(conv.messages) == EXPECTED_MESSAGES[i]
        calls, results = parts(conv, ToolCall), parts(conv, ToolResult)
        assert len(calls) == EXPECTED_CALLS[i] == sum(it["type"] == "function_call" for it in items)
        assert len(results) == sum(it["type"] == "function_call_output" for it in items) == len(calls)
        # every result answers an earlier call
        seen: set[str] = set()
        for m in conv.messages:
            for p in m.parts:
                if isinstance(p, ToolCall):
                    seen.add(p.id)
                    assert p.id.startswith("call_") and p.name == "exec_command"
                    assert p.arguments_raw == next(
                        it["arguments"] for it in items if it.get("call_id") == p.id
                    )
                    assert p.arguments == orjson.loads(p.arguments_raw)
                elif isinstance(p, ToolResult):
                    assert p.call_id in seen
                    assert p.content.startswith("Chunk ID: ")
        assert [t.name for t in conv.tools][:2] == ["exec_command", "write_stdin"]
        assert [t.name for t in conv.tools][-1] == "web_search"
        assert "previous_response_id" not in conv.params and conv.params["store"] is False
        assert R.server_held_prefix(conv) is None
        assert conv.messages[0].role == conv.messages[1].role == "developer"
        assert R.developer_prompt(conv).startswith("You are a coding agent running in the Codex CLI")


def test_parallel_calls_form_one_assistant_message(corpus):
    conv = R.parse_request(requests(corpus)[5]["body"])
    assistant, tool = conv.messages[4], conv.messages[5]
    assert assistant.role == "assistant" and [type(p) for p in assistant.parts] == [ToolCall, ToolCall]
    assert tool.role == "tool" and [p.call_id for p in tool.parts] == [p.id for p in assistant.parts]


def test_corpus_requests_render_round_trip(corpus):
    for req in requests(corpus):
        conv = R.parse_request(req["body"])
        body = R.render_request(conv)
        assert body == orjson.dumps(req["body"])  # unchanged input renders byte-identical
        assert R.normalise(R.parse_request(body)) == R.normalise(conv)


def test_corpus_requests_render_from_canonical_fields(corpus):
    for req in requests(corpus):
        conv = R.parse_request(req["body"])
        bare = strip_raw(conv)
        again = R.parse_request(R.render_request(bare))
        assert R.normalise(again) == R.normalise(bare)
        # everything the conversation says survives: ids, arguments, outputs, roles
        assert [
            (
                m.role,
                [
                    (
                        type(p),
                        getattr(p, "text", None),
                        getattr(p, "id", None),
                        getattr(p, "arguments_raw", None),
                        getattr(p, "call_id", None),
                        getattr(p, "content", None),
                    )
                    for p in m.parts
                ],
            )
            for m in again.messages
        ] == [
            (
                m.role,
                [
                    (
                        type(p),
                        getattr(p, "text", None),
                        getattr(p, "id", None),
                        getattr(p, "arguments_raw", None),
                        getattr(p, "call_id", None),
                        getattr(p, "content", None),
                    )
                    for p in m.parts
                ],
            )
            for m in conv.messages
        ]
        assert again.params == conv.params and again.model == conv.model and again.stream


def test_changed_tool_result_keeps_item_extras(corpus):
    """Replay swaps an observation: the rebuilt item keeps its type, id and key order."""
    req = requests(corpus)[1]
    conv = R.parse_request(req["body"])
    result = conv.messages[5].parts[0]
    result.content = "new observation"
    body = orjson.loads(R.render_request(conv))
    original = req["body"]["input"][5]
    assert body["input"][5] == {**original, "output": "new observation"}
    assert list(body["input"][5]) == list(original)
    assert body["input"][:5] == req["body"]["input"][:5]


def test_codex_consecutive_requests_extend(corpus):
    """Codex repeats the previous request's items exactly and appends the reply and the results,
    also across its native resume (requests 2 -> 3); system prompt and tools stay equal."""
    reqs = requests(corpus)
    norm = [R.normalise(R.parse_request(r["body"])) for r in reqs]
    for a, b in ((0, 1), (1, 2), (2, 3), (4, 5)):
        assert norm[b]["messages"][: len(norm[a]["messages"])] == norm[a]["messages"], (a, b)
        assert len(norm[b]["messages"]) > len(norm[a]["messages"])
        assert norm[b]["system"] == norm[a]["system"] and norm[b]["tools"] == norm[a]["tools"]
    # a new session does not extend the previous one (other task text)
    assert norm[4]["messages"][: len(norm[3]["messages"])] != norm[3]["messages"]


def test_codex_echoes_the_reply_items(corpus):
    """The scripted server's reply items (server ids, status) normalise like the items Codex sends
    back in the next request."""
    reqs = requests(corpus)
    for a, b in ((0, 1), (1, 2), (2, 3), (4, 5)):
        reply = reqs[a]["reply"]["items"]
        final = {"id": "resp_x", "status": "completed", "output": reply}
        action = R.response_to_action(final)
        assert [(c.id, c.arguments_raw) for c in action.tool_calls] == [
            (i["call_id"], i["arguments"]) for i in reply if i["type"] == "function_call"
        ]
        n = len(R.parse_request(reqs[a]["body"]).messages)
        appended = R.normalise(R.parse_request(reqs[b]["body"]))["messages"][n]
        assert R.normalise(R.parse_request({"input": reply}))["messages"] == [appended]


def test_client_item_ids_do_not_count(corpus):
    """Codex gives input items ids of its own (msg_<uuid>, fco_<uuid>); dropping or changing them
    (and the status field) leaves the normalised form unchanged, while call ids do count."""
    body = requests(corpus)[3]["body"]
    base = R.normalise(R.parse_request(body))
    changed = copy.deepcopy(body)
    for i, item in enumerate(changed["input"]):
        if i % 2:
            item.pop("id", None)
        else:
            item["id"] = f"other_{i}"
        item.pop("status", None)
    assert R.normalise(R.parse_request(changed)) == base
    other_call = copy.deepcopy(body)
    other_call["input"][4]["call_id"] = "call_other"
    assert R.normalise(R.parse_request(other_call)) != base


def test_previous_response_id_and_instructions():
    body = {
        "model": "gpt-5",
        "instructions": "Be brief.",
        "previous_response_id": "resp_prev",
        "input": "hi",
        "store": True,
    }
    conv = R.parse_request(orjson.dumps(body))
    assert conv.system == conv.system_raw == "Be brief."
    assert conv.params == {"previous_response_id": "resp_prev", "store": True}
    assert R.server_held_prefix(conv) == "previous_response_id"
    assert [(m.role, m.parts[0].text) for m in conv.messages] == [("user", "hi")]
    assert orjson.loads(R.render_request(conv)) == body
    bare = R.render_request(strip_raw(conv))  # without raw the string input becomes one message item
    assert orjson.loads(bare)["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    assert R.normalise(R.parse_request(bare)) == R.normalise(conv)
    nulls = {"model": "m", "instructions": None, "stream": False, "input": [], "tools": []}
    assert orjson.loads(R.render_request(R.parse_request(nulls))) == nulls


def test_reasoning_custom_and_other_items_round_trip(corpus):
    custom = R.reassemble([frame(chunk_lines(corpus, "custom_tool_call"))]).final["output"][0]
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "First."}, {"type": "summary_text", "text": "Second."}],
        "encrypted_content": "gAAAAABenc==",
    }
    body = {
        "model": "gpt-5.2-codex",
        "input": [
            {"role": "user", "content": "Which users are over 25?"},
            reasoning,
            custom,
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "q"},
            },
            {
                "type": "custom_tool_call_output",
                "call_id": "call_custom_sql_001",
                "output": [{"type": "input_text", "text": "3 rows"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
                ],
            },
            {"type": "item_reference", "id": "msg_old"},
        ],
    }
    conv = R.parse_request(body)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "user", "assistant"]
    r, call, server = conv.messages[1].parts
    assert isinstance(r, Reasoning) and r.text == "First.\n\nSecond." and r.encrypted == "gAAAAABenc=="
    assert (call.kind, call.arguments_raw, call.arguments) == (
        "custom",
        "SELECT * FROM users WHERE age > 25",
        None,
    )
    assert (server.kind, server.name, server.arguments) == (
        "server",
        "web_search",
        {"action": {"type": "search", "query": "q"}},
    )
    assert (
        isinstance(conv.messages[3].parts[1], OtherPart) and conv.messages[3].parts[1].kind == "input_image"
    )
    assert R.server_held_prefix(conv) == "item_reference"
    assert orjson.loads(R.render_request(conv)) == body
    bare = strip_raw(conv)
    rendered = orjson.loads(R.render_request(bare))
    assert rendered["input"][1] == {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "First.\n\nSecond."}],
        "encrypted_content": "gAAAAABenc==",
    }
    assert rendered["input"][4]["type"] == "custom_tool_call_output"  # from the call's kind
    assert R.normalise(R.parse_request(rendered)) == R.normalise(bare) == R.normalise(conv)


def test_normalise_compares_non_function_tools_whole(corpus):
    body = requests(corpus)[0]["body"]
    base = R.normalise(R.parse_request(body))
    changed = copy.deepcopy(body)
    ns = next(t for t in changed["tools"] if t["type"] == "namespace")
    ns["description"] = ns.get("description", "") + " (changed)"
    assert R.normalise(R.parse_request(changed)) != base
    web = next(t for t in changed["tools"] if t["type"] == "web_search")
    web["external_web_access"] = not web.get("external_web_access", False)
    assert R.normalise(R.parse_request(changed))["tools"] != base["tools"]


def anthropic_conversation():
    """A conversation as the Anthropic module would read it: its raws are Anthropic blocks."""
    cc = {"type": "ephemeral"}
    return Conversation(
        protocol="anthropic",
        model="m",
        system="sys",
        system_raw=[{"type": "text", "text": "sys", "cache_control": cc}],
        tools=[
            ToolSpec(
                "ls",
                "List",
                {"type": "object"},
                raw={"name": "ls", "description": "List", "input_schema": {"type": "object"}},
            )
        ],
        messages=[
            Message(
                "user",
                [TextPart("hi", raw={"type": "text", "text": "hi", "cache_control": cc})],
                raw={"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": cc}]},
            ),
            Message(
                "assistant",
                [
                    ToolCall(
                        "toolu_1",
                        "ls",
                        '{"a":1}',
                        {"a": 1},
                        raw={"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"a": 1}},
                    )
                ],
                raw={
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"a": 1}}],
                },
            ),
            Message(
                "user",
                [
                    ToolResult(
                        "toolu_1",
                        "out",
                        raw={"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"},
                    )
                ],
                raw={
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"}],
                },
            ),
        ],
    )


def test_raw_of_another_protocol_is_not_carried_over():
    body = orjson.loads(R.render_request(anthropic_conversation()))
    assert body == {
        "model": "m",
        "instructions": "sys",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "name": "ls", "arguments": '{"a":1}', "call_id": "toolu_1"},
            {"type": "function_call_output", "call_id": "toolu_1", "output": "out"},
        ],
        "tools": [
            {"type": "function", "name": "ls", "description": "List", "parameters": {"type": "object"}}
        ],
    }


# --------------------------------------------------------------------------- actions


def _action():
    return Action(
        text="Done: created out.txt.",
        reasoning=[Reasoning("Plan the edit.", None, "gAAAAAB-encrypted")],
        tool_calls=[
            ToolCall("call_a", "exec_command", '{"cmd": "ls"}', {"cmd": "ls"}),
            ToolCall(None, "apply_patch", "*** Begin Patch\n*** End Patch", None, "custom"),
        ],
        usage={"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 100},
        stop_reason="tool_use",
        model="gpt-5-codex",
    )


def test_action_to_response_is_deterministic_and_sdk_valid():
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    first = R.action_to_response(_action(), model="gpt-5-codex", ids=IdSource(7))
    second = R.action_to_response(_action(), model="gpt-5-codex", ids=IdSource(7))
    assert R.render_stream(first) == R.render_stream(second)
    assert orjson.dumps(first) == orjson.dumps(second)
    assert R.action_to_response(_action(), model="gpt-5-codex", ids=IdSource(8))["id"] != first["id"]
    parsed = Response.model_validate(first)
    assert parsed.status == "completed" and parsed.output_text == "Done: created out.txt."
    assert [o.type for o in parsed.output] == ["reasoning", "message", "function_call", "custom_tool_call"]
    assert parsed.output[2].arguments == '{"cmd": "ls"}' and parsed.output[2].call_id == "call_a"
    assert (
        parsed.output[3].call_id.startswith("call_")
        and parsed.output[3].input == "*** Begin Patch\n*** End Patch"
    )
    assert parsed.output[0].encrypted_content == "gAAAAAB-encrypted"
    assert parsed.usage.input_tokens == 120 and parsed.usage.input_tokens_details.cached_tokens == 100
    assert first["id"].startswith("resp_") and first["output"][1]["id"].startswith("msg_")
    assert first["output"][2]["id"].startswith("fc_")
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in decode_all([R.render_stream(first)]):
        adapter.validate_python(orjson.loads(e.data))
    assert R.reassemble([R.render_stream(first)]).final == first


def test_response_action_round_trip(corpus):
    action = R.response_to_action(R.action_to_response(_action(), model="gpt-5-codex", ids=IdSource(1)))
    want = _action()
    assert action.text == want.text
    assert [(r.text, r.encrypted) for r in action.reasoning] == [("Plan the edit.", "gAAAAAB-encrypted")]
    assert [(c.name, c.arguments_raw, c.kind) for c in action.tool_calls] == [
        (c.name, c.arguments_raw, c.kind) for c in want.tool_calls
    ]
    assert action.tool_calls[0].id == "call_a"
    assert action.model == "gpt-5-codex" and action.stop_reason == "completed"
    recorded = R.reassemble([frame(chunk_lines(corpus, "function_call"))]).final
    a = R.response_to_action(recorded)
    assert a.raw is recorded and a.usage == recorded["usage"] and a.model == "gpt-5.1-2025-11-13"
    again = R.response_to_action(R.action_to_response(a, model=a.model, ids=IdSource(0)))
    assert [(c.id, c.name, c.arguments_raw) for c in again.tool_calls] == [
        ("call_2FQdm3Br7Qb35YUBSkDR7kue", "get_weather", '{"city":"Beijing"}')
    ]
    assert again.usage == recorded["usage"]  # already Responses-shaped: kept as is


def test_incomplete_action():
    final = R.action_to_response(Action(text="cut", stop_reason="max_tokens"), model="m", ids=IdSource())
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    data = R.render_stream(final)
    assert decode_all([data])[-1].event == "response.incomplete"
    assert R.reassemble([data]).final == final


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "body, words",
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "JSON array, expected an object"),
        (b'"text"', "JSON string, expected an object"),
    ],
)
def test_bad_request_body(body, words):
    with pytest.raises(BadInputError) as exc:
        R.parse_request(body)
    assert words in str(exc.value) and "Responses request body" in str(exc.value)


def test_odd_items_do_not_raise():
    body = {
        "input": [
            5,
            {"type": "mystery", "x": 1},
            {"foo": "bar"},
            {"type": "message", "role": "user", "content": 3},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}},
        ]
    }
    conv = R.parse_request(body)
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "user", "assistant"]
    assert R.normalise(conv)["messages"][4]["parts"][0]["arguments"] == {"a": 1}
    assert isinstance(R.render_request(conv), bytes)
    assert R.response_to_action({"output": 5}).tool_calls == []


# ---------------------------------------------------------------- tools sent as input items (issue 14 item 5)

#: the shape Codex 0.171 sends with its default model (no model configured): no ``tools`` field,
#: every tool in one ``additional_tools`` input item, grouped in namespaces
ADDITIONAL_TOOLS_BODY = {
    "model": "gpt-6.2-sol",
    "stream": True,
    "store": False,
    "input": [
        {
            "type": "additional_tools",
            "id": "at_1",
            "role": "developer",
            "tools": [
                {
                    "type": "namespace",
                    "name": "functions",
                    "description": "",
                    "tools": [
                        {
                            "type": "custom",
                            "name": "exec",
                            "description": "Run JavaScript",
                            "format": {"type": "grammar", "syntax": "lark", "definition": "start: SOURCE"},
                        },
                        {
                            "type": "function",
                            "name": "wait",
                            "description": "Wait",
                            "strict": False,
                            "parameters": {
                                "type": "object",
                                "properties": {"cell_id": {"type": "string"}},
                                "required": ["cell_id"],
                            },
                        },
                    ],
                },
                {
                    "type": "namespace",
                    "name": "clock",
                    "description": "",
                    "tools": [
                        {
                            "type": "function",
                            "name": "sleep",
                            "description": "Sleep",
                            "strict": False,
                            "parameters": {"type": "object", "properties": {}},
                        }
                    ],
                },
            ],
        },
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "make a.txt"}]},
    ],
}


def test_additional_tools_item_is_the_clients_own_input_and_its_tools_are_offered():
    conv = R.parse_request(ADDITIONAL_TOOLS_BODY)
    # the item is the client's (role developer), never read as a reply of the model
    assert [m.role for m in conv.messages] == ["developer", "developer", "user"] and conv.tools == []
    offered = R.offered_tools(conv)
    assert [(t.name, t.raw["namespace"], R.tool_kind(t)) for t in offered] == [
        ("exec", "functions", "custom"),
        ("wait", "functions", "function"),
        ("sleep", "clock", "function"),
    ]
    assert offered[1].parameters["required"] == ["cell_id"]
    # the body renders back as it was sent
    assert orjson.loads(R.render_request(conv)) == ADDITIONAL_TOOLS_BODY


def test_scripted_model_calls_a_free_form_tool_offered_as_an_input_item():
    from pvisor.gateway.scripted_model import ScriptedModel, parse_script

    m = ScriptedModel(
        parse_script(
            {"turns": [{"text": "Running.", "tool_calls": [{"tool": "exec", "command": "text('hi')"}]}]}
        )
    )
    reply = m.answer("POST", "/v1/responses", "", orjson.dumps({**ADDITIONAL_TOOLS_BODY, "stream": False}))
    # the main chain is found by the tools the item offers, and the call is a custom_tool_call
    assert reply.kind == "turn"
    out = orjson.loads(b"".join(reply.chunks))["output"]
    calls = [o for o in out if o["type"] != "message"]
    assert [(c["type"], c["name"], c["input"]) for c in calls] == [("custom_tool_call", "exec", "text('hi')")]
