"""Anthropic Messages protocol module: reassembly of the real corpus streams, rendering,
request parsing/rendering on real agent requests, the chain rule's normalisation, replies.

Real data only: ``corpus/wire/anthropic/*.sse`` (anthropic-sdk-python fixtures) and the
``/v1/messages`` lines of ``corpus/requests/*.jsonl``. Synthetic streams below cover rules the
corpus has no sample for (thinking, signature, citations, error events; PROVENANCE.md "Known gaps").
"""

from __future__ import annotations

import dataclasses
import json

import anthropic
import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event

from pvisor.adapters.protocols import anthropic as A
from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.adapters.protocols.base import IdSource, normalise_messages
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

STREAMS = ["basic_response.sse", "incomplete_partial_json_response.sse", "tool_use_response.sse"]
GOLDEN_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def _stream(corpus, name: str) -> bytes:
    return (corpus / "wire" / "anthropic" / name).read_bytes()


def _requests(corpus):
    """(file, line number, record) for every /v1/messages request of the request corpus.
    Lines are split on b"\\n" (never str.splitlines, which splits on U+2028 too)."""
    out = []
    for path in sorted((corpus / "requests").glob("*.jsonl")):
        for n, line in enumerate(path.read_bytes().split(b"\n")):
            if line.strip():
                rec = orjson.loads(line)
                if rec["path"] == "/v1/messages":
                    out.append((path.name, n, rec))
    return out


def _strip_raw(conv: Conversation) -> Conversation:
    """A deep copy of ``conv`` with every ``raw`` (and ``system_raw``) removed."""
    conv = dataclasses.replace(
        conv,
        system_raw=None,
        tools=[dataclasses.replace(t, raw=None) for t in conv.tools],
        messages=[
            dataclasses.replace(m, raw=None, parts=[dataclasses.replace(p, raw=None) for p in m.parts])
            for m in conv.messages
        ],
    )
    return conv


def _action_message(action: Action) -> Message:
    parts: list = list(action.reasoning)
    if action.text:
        parts.append(TextPart(action.text))
    parts += action.tool_calls
    return Message(role="assistant", parts=parts)


def _sdk_accumulate(data: bytes) -> dict:
    """The official SDK's own accumulator over our decoded events (reference behaviour)."""
    snap = None
    bufs: dict = {}
    for ev in decode_all([data]):
        obj = orjson.loads(ev.data)
        if obj["type"] in ("ping", "error"):
            continue
        snap = accumulate_event(event=obj, current_snapshot=snap, json_bufs=bufs)
    return snap.model_dump(mode="json", exclude_none=True)


# --------------------------------------------------------------------------- corpus streams


def test_corpus_has_the_expected_streams(corpus):
    assert sorted(p.name for p in (corpus / "wire" / "anthropic").glob("*.sse")) == STREAMS


@pytest.mark.parametrize("name", STREAMS)
def test_stream_reassembles_to_golden(corpus, golden, name):
    r = A.reassemble([_stream(corpus, name)])
    assert r.final is not None
    golden(f"wire/anthropic/{name}.final.json", orjson.dumps(r.final, option=GOLDEN_OPTS))
    # the final object is a valid Message for the official SDK
    anthropic.types.Message.model_validate(r.final)


def test_basic_response_facts(corpus):
    r = A.reassemble([_stream(corpus, "basic_response.sse")])
    assert r.complete and r.error is None and r.problems == []
    assert r.events == 9  # ping included: it is decoded, then skipped
    assert r.final["content"] == [{"type": "text", "text": "Hello there!"}]
    assert r.final["usage"] == {"input_tokens": 11, "output_tokens": 6}  # 6 assigned, not 1 + 6
    assert r.final["stop_reason"] == "end_turn"
    action = A.response_to_action(r.final)
    assert (action.text, action.tool_calls, action.stop_reason) == ("Hello there!", [], "end_turn")


def test_tool_use_response_facts(corpus):
    r = A.reassemble([_stream(corpus, "tool_use_response.sse")])
    assert r.complete and r.problems == []
    text, tool = r.final["content"]
    assert text["text"] == "I'll check the current weather in Paris for you."
    assert tool["input"] == {"location": "Paris"}
    assert tool["caller"] == {"type": "direct"}  # fields of content_block_start are kept
    # the exact streamed text stays available next to the parsed input
    assert r.tool_input_raw == {1: '{"location": "Paris"}'}
    assert r.final["usage"]["output_tokens"] == 65 and r.final["usage"]["input_tokens"] == 377
    action = A.response_to_action(r.final)
    assert action.stop_reason == "tool_use" and action.model == "claude-sonnet-4-20250514"
    (call,) = action.tool_calls
    assert (call.id, call.name) == ("toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather")
    assert call.arguments_raw == '{"location":"Paris"}'  # compact JSON of input (model.py)
    assert call.arguments == {"location": "Paris"}
    assert action.raw is r.final


def test_incomplete_partial_json_is_flagged(corpus):
    r = A.reassemble([_stream(corpus, "incomplete_partial_json_response.sse")])
    assert r.complete  # message_stop arrived; the block inside it did not end
    assert len(r.problems) == 1
    assert "content block 1 (tool_use) has no content_block_stop" in r.problems[0]
    raw = r.tool_input_raw[1]
    assert raw.startswith('{"filename": "taxes.txt", "lines_of_text": [\n"# COMPREHENSIVE TAX GUIDE')
    assert raw.endswith('\n"Filing taxes')
    tool = r.final["content"][1]
    assert tool["name"] == "make_file" and tool["input"] == {}  # left unparsed, as started
    assert r.final["stop_reason"] == "max_tokens"
    assert r.final["usage"]["output_tokens"] == 124
    assert r.final["usage"]["service_tier"] == "standard"


@pytest.mark.parametrize("name", ["basic_response.sse", "tool_use_response.sse"])
def test_reassembly_agrees_with_the_sdk(corpus, name):
    data = _stream(corpus, name)
    ours = A.reassemble([data]).final
    sdk = _sdk_accumulate(data)
    sdk.pop("stop_details", None)  # the SDK fills an absent field with null
    assert {k: v for k, v in ours.items() if v is not None} == sdk


# --------------------------------------------------------------------------- render and split


@pytest.mark.parametrize("piece", [1, 5, 64])
@pytest.mark.parametrize("name", STREAMS)
def test_render_stream_roundtrip(corpus, name, piece):
    final = A.reassemble([_stream(corpus, name)]).final
    data = A.render_stream(final, piece=piece)
    again = A.reassemble([data])
    assert again.final == final
    assert again.complete and again.problems == [] and again.error is None
    # every event carries an event: line equal to its data type (the Messages streaming reference)
    for ev in decode_all([data]):
        assert ev.event == orjson.loads(ev.data)["type"]
    # the SDK's own accumulator reads our stream to the same message
    sdk = _sdk_accumulate(data)
    sdk.pop("stop_details", None)
    assert sdk == {k: v for k, v in final.items() if v is not None}


@pytest.mark.parametrize("name", STREAMS)
def test_every_split_gives_the_same_result(corpus, name):
    data = _stream(corpus, name)
    ref = A.reassemble([data])
    for i in range(len(data) + 1):
        r = A.reassemble([data[:i], data[i:]])
        assert (r.final, r.complete, r.problems, r.tool_input_raw, r.events) == (
            ref.final,
            ref.complete,
            ref.problems,
            ref.tool_input_raw,
            ref.events,
        ), f"split at byte {i}"
    r = A.reassemble(data[i : i + 1] for i in range(len(data)))
    assert (r.final, r.complete, r.problems, r.events) == (ref.final, ref.complete, ref.problems, ref.events)


def test_crlf_framing_gives_the_same_result(corpus):
    data = _stream(corpus, "tool_use_response.sse")
    ref = A.reassemble([data])
    assert A.reassemble([data.replace(b"\n", b"\r\n")]).final == ref.final


# --------------------------------------------------------------------------- rules without corpus sample


def _ev(kind: str, **data) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def test_thinking_signature_citations_and_usage_rules():
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 7, "output_tokens": 1},
    }
    data = b"".join(
        [
            _ev("message_start", message=start),
            _ev(
                "content_block_start",
                index=0,
                content_block={"type": "thinking", "thinking": "", "signature": ""},
            ),
            _ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Let me "}),
            _ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "think."}),
            _ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "SIG-A"}),
            _ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "SIG-B"}),
            _ev("content_block_stop", index=0),
            _ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
            _ev(
                "content_block_delta",
                index=1,
                delta={"type": "citations_delta", "citation": {"cited_text": "a"}},
            ),
            _ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "Done"}),
            _ev(
                "content_block_delta",
                index=1,
                delta={"type": "citations_delta", "citation": {"cited_text": "b"}},
            ),
            _ev("content_block_stop", index=1),
            _ev("brand_new_event", payload=1),  # unknown: ignored, counted
            _ev(
                "content_block_start",
                index=2,
                content_block={"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}},
            ),
            _ev("content_block_stop", index=2),  # no input_json_delta at all: input stays {}
            _ev(
                "message_delta",
                delta={"stop_reason": "tool_use", "stop_sequence": None},
                usage={"output_tokens": 30, "input_tokens": None, "cache_read_input_tokens": 9},
            ),
            _ev(
                "message_delta",
                delta={"stop_reason": "tool_use", "stop_sequence": None},
                usage={"output_tokens": 31},
            ),
            _ev("message_stop"),
        ]
    )
    r = A.reassemble([data])
    assert r.complete and r.problems == [] and r.events == 18
    thinking, text, tool = r.final["content"]
    assert thinking == {"type": "thinking", "thinking": "Let me think.", "signature": "SIG-B"}  # assigned
    assert text == {"type": "text", "text": "Done", "citations": [{"cited_text": "a"}, {"cited_text": "b"}]}
    assert tool["input"] == {}
    # output_tokens assigned (31, not 1+30+31); null input_tokens keeps 10; non-null cache value taken
    assert r.final["usage"] == {"input_tokens": 10, "cache_read_input_tokens": 9, "output_tokens": 31}
    assert A.reassemble([A.render_stream(r.final)]).final == r.final
    action = A.response_to_action(r.final)
    assert action.reasoning == [Reasoning(text="Let me think.", signature="SIG-B", raw=thinking)]
    assert action.text == "Done"


def test_error_event_after_200_becomes_the_outcome():
    data = (
        _ev(
            "message_start",
            message={
                "id": "m",
                "type": "message",
                "role": "assistant",
                "model": "x",
                "content": [],
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        )
        + _ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
        + _ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
        + _ev("error", error={"type": "overloaded_error", "message": "Overloaded"})
    )
    r = A.reassemble([data])
    assert r.error == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert not r.complete
    assert r.final["content"] == [{"type": "text", "text": "Hi"}]
    assert r.problems == ["content block 0 (text) has no content_block_stop"]


def test_index_that_is_not_the_position_is_reported_and_routed():
    data = (
        _ev(
            "message_start",
            message={"id": "m", "type": "message", "role": "assistant", "model": "x", "content": []},
        )
        + _ev("content_block_start", index=3, content_block={"type": "text", "text": ""})
        + _ev("content_block_delta", index=3, delta={"type": "text_delta", "text": "ok"})
        + _ev("content_block_stop", index=3)
        + _ev("message_stop")
    )
    r = A.reassemble([data])
    assert r.final["content"] == [{"type": "text", "text": "ok"}]
    assert len(r.problems) == 1 and "index 3 at content position 0" in r.problems[0]


def test_garbage_lines_are_reported_not_raised(corpus):
    good = _stream(corpus, "basic_response.sse")
    head, tail = good.split(b"event: ping", 1)
    data = (
        head
        + b"event: content_block_delta\ndata: {not json\n\nthis is no sse line\n\ndata: [1, 2]\n\nevent: ping"
        + tail
    )
    r = A.reassemble([data])
    assert r.final == A.reassemble([good]).final and r.complete
    assert any("data is not JSON" in p for p in r.problems)
    assert any("not SSE" in p for p in r.problems)
    assert any("not an object" in p for p in r.problems)
    nothing = A.reassemble([b"\x00\xff garbage\n\ndata: nope\n\n"])
    assert nothing.final is None and not nothing.complete and nothing.problems
    before_start = A.reassemble([_ev("content_block_stop", index=0)])
    assert before_start.final is None and "before message_start" in before_start.problems[0]
    with pytest.raises(BadInputError):
        A.render_stream(None)


# --------------------------------------------------------------------------- requests


# (messages, tool calls, tool results) per /v1/messages request, in file order
EXPECTED_COUNTS = [("mini-swe-agent-2.4.6.jsonl", 1, 0, 0), ("mini-swe-agent-2.4.6.jsonl", 3, 1, 1)]


def test_corpus_requests_parse(corpus):
    reqs = _requests(corpus)
    counts = []
    for name, n, rec in reqs:
        body = rec["body"]
        conv = A.parse_request(orjson.dumps(body), path=rec["path"])
        assert conv.protocol == "anthropic" and conv.model == body["model"]
        assert len(conv.messages) == len(body["messages"])
        assert conv.system == "You are a helpful assistant that can interact with a computer."
        assert conv.system_raw == body["system"]
        assert [t.name for t in conv.tools] == [t["name"] for t in body["tools"]]
        assert conv.tools[0].parameters == body["tools"][0]["input_schema"]
        assert list(conv.params) == [
            k for k in body if k not in ("model", "system", "tools", "messages", "stream")
        ]
        assert conv.stream is False and not A.wants_stream(rec["path"], "", body)
        calls = [p for m in conv.messages for p in m.parts if isinstance(p, ToolCall)]
        results = [p for m in conv.messages for p in m.parts if isinstance(p, ToolResult)]
        # independent count from the raw body
        blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
        assert len(calls) == sum(b["type"] == "tool_use" for b in blocks)
        assert len(results) == sum(b["type"] == "tool_result" for b in blocks)
        seen: list[str] = []
        for m in conv.messages:
            for p in m.parts:
                if isinstance(p, ToolCall):
                    assert p.arguments_raw == json.dumps(
                        p.arguments, separators=(",", ":"), ensure_ascii=False
                    )
                    seen.append(p.id)
                if isinstance(p, ToolResult):
                    assert p.call_id in seen, f"{name}:{n}: result for unknown call {p.call_id}"
                    assert p.is_error is None  # litellm sends no is_error
        counts.append((name, len(conv.messages), len(calls), len(results)))
    assert counts == EXPECTED_COUNTS


def test_corpus_requests_render_back(corpus):
    for name, n, rec in _requests(corpus):
        body = rec["body"]
        conv = A.parse_request(body)
        rendered = A.render_request(conv)
        assert isinstance(rendered, bytes) and b"\n" not in rendered  # compact JSON
        back = orjson.loads(rendered)
        # with raw present nothing is lost: same fields, same message bytes
        assert back == body
        assert orjson.dumps(back["messages"]) == orjson.dumps(body["messages"])
        assert A.normalise(A.parse_request(rendered)) == A.normalise(conv)
        # from canonical fields alone
        bare = A.render_request(_strip_raw(conv))
        assert A.normalise(A.parse_request(bare)) == A.normalise(conv)
        assert b"cache_control" not in bare


def test_chain_rule_on_real_requests_with_moving_cache_control(corpus):
    """mini-swe-agent (litellm) moves cache_control from the task's text block to the newest
    tool_result (agents.md); request 2 must still extend request 1, and the appended assistant
    message must be the recorded reply of request 1."""
    (_, _, first), (_, _, second) = _requests(corpus)
    assert "cache_control" in first["body"]["messages"][0]["content"][0]
    assert "cache_control" not in second["body"]["messages"][0]["content"][0]
    a = A.normalise(A.parse_request(first["body"]))
    b = A.normalise(A.parse_request(second["body"]))
    assert a["system"] == b["system"] and a["tools"] == b["tools"]
    assert b["messages"][: len(a["messages"])] == a["messages"]
    reply = A.response_to_action(first["response"])
    assert b["messages"][len(a["messages"])] == normalise_messages([_action_message(reply)])[0]


def test_normalise_ignores_cache_control_signatures_and_content_form():
    body = {
        "model": "m",
        "system": [
            {"type": "text", "text": "S1"},
            {"type": "text", "text": "S2", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "run",
                "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "task", "cache_control": {"type": "ephemeral"}}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig-1"},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "ls", "description": "list"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "a.txt"}],
                    }
                ],
            },
        ],
    }
    moved = json.loads(json.dumps(body))
    moved["system"] = "S1\n\nS2"
    del moved["tools"][0]["cache_control"]
    moved["messages"][0]["content"] = "task"
    moved["messages"][1]["content"][0]["signature"] = "sig-2"
    moved["messages"][1]["content"][1]["input"] = {"description": "list", "command": "ls"}
    moved["messages"][2]["content"][0]["content"] = "a.txt"
    moved["messages"][2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert A.normalise(A.parse_request(moved)) == A.normalise(A.parse_request(body))
    changed = json.loads(json.dumps(moved))
    changed["messages"][2]["content"][0]["content"] = "b.txt"
    assert A.normalise(A.parse_request(changed)) != A.normalise(A.parse_request(body))
    errored = json.loads(json.dumps(moved))
    errored["messages"][2]["content"][0]["is_error"] = True
    assert A.normalise(A.parse_request(errored)) != A.normalise(A.parse_request(body))


def test_parse_request_block_mapping_and_render_from_canonical_fields():
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "redacted_thinking", "data": "ENC"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {"path": "ü.txt"}},
                    {
                        "type": "server_tool_use",
                        "id": "srvtoolu_b",
                        "name": "web_search",
                        "input": {"query": "q"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "boom", "is_error": True},
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "fine", "is_error": False},
                ],
            },
        ],
        "stream": True,
        "temperature": 0,
    }
    conv = A.parse_request(body)
    assert conv.stream and A.wants_stream("/v1/messages", "beta=true", body)
    assert conv.system is None and conv.params == {"max_tokens": 100, "temperature": 0}
    user, assistant, results = conv.messages
    assert (
        isinstance(user.parts[0], TextPart)
        and isinstance(user.parts[1], OtherPart)
        and user.parts[1].kind == "image"
    )
    th, red, text, call, server = assistant.parts
    assert (th.text, th.signature) == ("t", "s")
    assert (red.text, red.encrypted) == ("", "ENC")
    assert text.text == "calling"
    assert (call.kind, call.arguments_raw, call.arguments) == (
        "function",
        '{"path":"ü.txt"}',
        {"path": "ü.txt"},
    )
    assert server.kind == "server"
    assert [(r.call_id, r.content, r.is_error) for r in results.parts] == [
        ("toolu_a", "boom", True),
        ("toolu_a", "fine", False),
    ]
    bare = orjson.loads(A.render_request(_strip_raw(conv)))
    assert bare["messages"][1]["content"] == body["messages"][1]["content"]
    assert bare["messages"][2]["content"] == body["messages"][2]["content"]
    assert bare["stream"] is True and bare["temperature"] == 0
    # a conversation built by hand (no raw anywhere) renders to a valid body
    hand = Conversation(
        protocol="anthropic",
        model="m",
        system="be brief",
        tools=[ToolSpec(name="Bash", description="run", parameters={"type": "object"})],
        messages=[
            Message("user", [TextPart("hi")]),
            Message("assistant", [ToolCall(id="toolu_1", name="Bash", arguments_raw='{"command": "ls"}')]),
            Message("user", [ToolResult(call_id="toolu_1", content="x")]),
        ],
    )
    assert orjson.loads(A.render_request(hand)) == {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]},
        ],
        "system": "be brief",
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
    }


def test_system_raw_is_used_only_when_it_matches_system():
    conv = A.parse_request(
        {
            "model": "m",
            "system": [{"type": "text", "text": "old", "cache_control": {"type": "ephemeral"}}],
            "messages": [],
        }
    )
    assert orjson.loads(A.render_request(conv))["system"] == conv.system_raw
    conv.system = "new"
    assert orjson.loads(A.render_request(conv))["system"] == "new"


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected an object"),
        (b'"text"', "expected an object"),
        (b'{"messages": "hi"}', "'messages'"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": ["x"]}]}', "messages[0].content[0]"),
        (b'{"messages": [{"content": "x"}]}', "'role'"),
        (b'{"messages": [], "tools": {}}', "'tools'"),
        (b'{"messages": [], "system": 3}', "'system'"),
    ],
)
def test_bad_request_bodies_raise_bad_input(body, fragment):
    with pytest.raises(BadInputError) as info:
        A.parse_request(body)
    assert fragment in str(info.value)
    assert info.value.exit_code == 65


# --------------------------------------------------------------------------- replies


def _sample_action() -> Action:
    return Action(
        text="Running two commands.",
        reasoning=[Reasoning(text="plan", signature="sig"), Reasoning(encrypted="opaque")],
        tool_calls=[
            ToolCall(id=None, name="Bash", arguments_raw='{"command": "ls"}', arguments={"command": "ls"}),
            ToolCall(id="toolu_kept", name="Bash", arguments_raw='{"command":"pwd"}'),
        ],
        usage={"input_tokens": 12, "output_tokens": 5},
        model="claude-sonnet-4-5",
    )


def test_action_to_response_is_deterministic_and_valid():
    one = A.action_to_response(_sample_action(), model="claude-sonnet-4-5", ids=IdSource(7))
    two = A.action_to_response(_sample_action(), model="claude-sonnet-4-5", ids=IdSource(7))
    assert A.dumps(one) == A.dumps(two)
    assert A.render_stream(one) == A.render_stream(two)
    assert A.action_to_response(_sample_action(), ids=IdSource(8))["id"] != one["id"]
    assert one["id"] == "msg_00000007" + "0" * 15 + "1"
    thinking, redacted, text, call1, call2 = one["content"]
    assert thinking == {"type": "thinking", "thinking": "plan", "signature": "sig"}
    assert redacted == {"type": "redacted_thinking", "data": "opaque"}
    assert text == {"type": "text", "text": "Running two commands."}
    assert call1["id"].startswith("toolu_00000007") and call1["input"] == {"command": "ls"}
    assert call2["id"] == "toolu_kept" and call2["input"] == {"command": "pwd"}
    assert one["stop_reason"] == "tool_use" and one["usage"] == {"input_tokens": 12, "output_tokens": 5}
    msg = anthropic.types.Message.model_validate(one)
    assert msg.content[3].input == {"command": "ls"}
    # the streamed form reassembles to the same object, and reads back as the same action
    assert A.reassemble([A.render_stream(one)]).final == one
    back = A.response_to_action(one)
    assert back.text == "Running two commands." and [c.name for c in back.tool_calls] == ["Bash", "Bash"]
    assert [c.arguments for c in back.tool_calls] == [{"command": "ls"}, {"command": "pwd"}]
    assert back.reasoning[0].signature == "sig" and back.reasoning[1].encrypted == "opaque"


def test_action_from_other_protocols_maps_stop_reason_and_usage():
    act = Action(
        text="done", stop_reason="stop", usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    )
    out = A.action_to_response(act, model="m", ids=IdSource())
    assert out["stop_reason"] == "end_turn" and out["usage"] == {"input_tokens": 3, "output_tokens": 4}
    anthropic.types.Message.model_validate(out)
    out = A.action_to_response(Action(stop_reason="length"), model="m", ids=IdSource())
    assert (
        out["stop_reason"] == "max_tokens"
        and out["content"] == []
        and out["usage"] == {"input_tokens": 0, "output_tokens": 0}
    )
    anthropic.types.Message.model_validate(out)


def test_corpus_finals_survive_action_roundtrip(corpus):
    for name in ("basic_response.sse", "tool_use_response.sse"):
        final = A.reassemble([_stream(corpus, name)]).final
        act = A.response_to_action(final)
        again = A.action_to_response(act, ids=IdSource(1))
        assert again["content"] == [{k: v for k, v in b.items() if k != "caller"} for b in final["content"]]
        assert again["usage"] == final["usage"] and again["stop_reason"] == final["stop_reason"]
        assert again["model"] == final["model"]


# --------------------------------------------------------------------------- small contract items


def test_paths_registry_and_error_body():
    assert A.matches("/v1/messages") and A.matches("/v1/messages/count_tokens")
    assert not A.matches("/v1/messages/") and not A.matches("/v1/chat/completions")
    assert protocol_for_path("/v1/messages") is A and get_protocol("anthropic") is A
    assert not A.wants_stream("/v1/messages/count_tokens", "", {"stream": True})
    assert not A.wants_stream("/v1/messages", "", b"{oops")
    assert not A.wants_stream("/v1/messages", "", {"stream": "true"})
    body = orjson.loads(A.error_body(529, "Overloaded"))
    assert body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert (
        orjson.loads(A.error_body(400, "bad", "invalid_request_error"))["error"]["type"]
        == "invalid_request_error"
    )
    assert orjson.loads(A.error_body(502, "upstream down"))["error"]["type"] == "api_error"
    anthropic.types.ErrorResponse.model_validate(body)


def _with_billing(cch: str, messages: list) -> dict:
    return {
        "model": "claude-test",
        "max_tokens": 64,
        "system": [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.332; cch={cch}; cc_turn_index=1;",
            },
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": messages,
    }


def test_the_billing_block_sent_to_anthropics_own_host_is_no_change_of_system_prompt():
    """Claude Code sends api.anthropic.com (no ANTHROPIC_BASE_URL: intercept mode) a first system
    block whose ``cch=`` hash is new in every request. The chain rule's form leaves it out, so
    the next request continues the chain without ``system_changed``, and the scripted model
    answers it with the next turn instead of its auxiliary reply (both failed before)."""
    from pvisor.gateway.scripted_model import ScriptedModel, parse_script

    first = [{"role": "user", "content": "hi"}]
    second = first + [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
    ]
    a = A.parse_request(_with_billing("77bf6", first), path="/v1/messages")
    b = A.parse_request(_with_billing("ee97d", second), path="/v1/messages")
    assert a.system != b.system  # kept as sent
    # the chain rule keys the system prompt by this form (adapters/chains.py, system_key)
    assert A.normalise(a)["system"] == A.normalise(b)["system"] == "You are Claude Code."
    m = ScriptedModel(parse_script({"turns": [{"text": "one"}, {"text": "two"}], "aux_reply": "AUX"}))
    texts = []
    for body in (_with_billing("77bf6", first), _with_billing("ee97d", second)):
        reply = m.answer("POST", "/v1/messages", "", orjson.dumps(body))
        texts.append(orjson.loads(b"".join(reply.chunks))["content"][0]["text"])
    assert texts == ["one", "two"]
