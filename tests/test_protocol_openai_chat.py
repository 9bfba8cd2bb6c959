"""OpenAI Chat Completions protocol module: reassembly of the real corpus streams, rendering,
request parsing/rendering on real agent requests (OpenCode, Qwen Code, mini-swe-agent), the
chain rule's normalisation, replies.

Real data only: ``corpus/wire/openai-chat/*.sse`` (openai-python snapshots) and the
``/v1/chat/completions`` lines of ``corpus/requests/*.jsonl``. Synthetic streams cover rules
the corpus has no sample for (error chunks, reasoning_content, repeated ids).
"""

from __future__ import annotations

import dataclasses
import json

import openai
import orjson
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.adapters.protocols import openai_chat as C
from pvisor.adapters.protocols.base import IdSource, dumps, normalise_messages
from pvisor.adapters.protocols.sse import decode_all
from pvisor.core.errors import BadInputError
from pvisor.journal.model import (
    Action,
    Conversation,
    Message,
    Reasoning,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)

STREAMS = ["finish_length_with_usage.sse", "parallel_tool_calls.sse", "tool_call_with_usage.sse"]
GOLDEN_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def _stream(corpus, name: str) -> bytes:
    return (corpus / "wire" / "openai-chat" / name).read_bytes()


def _requests(corpus):
    """(file, line number, record) for every /v1/chat/completions request of the corpus.
    Lines are split on b"\\n" (never str.splitlines, which splits on U+2028 too)."""
    out = []
    for path in sorted((corpus / "requests").glob("*.jsonl")):
        for n, line in enumerate(path.read_bytes().split(b"\n")):
            if line.strip():
                rec = orjson.loads(line)
                if rec["path"] == "/v1/chat/completions":
                    out.append((path.name, n, rec))
    return out


def _strip_raw(conv: Conversation) -> Conversation:
    return dataclasses.replace(
        conv,
        system_raw=None,
        tools=[dataclasses.replace(t, raw=None) for t in conv.tools],
        messages=[
            dataclasses.replace(m, raw=None, parts=[dataclasses.replace(p, raw=None) for p in m.parts])
            for m in conv.messages
        ],
    )


def _reply_final(rec) -> dict:
    """The recorded reply as a final object: a non-streamed body as is, recorded chunks framed
    as the SSE they were sent as and reassembled."""
    resp = rec["response"]
    if "streamed_chunks" not in resp:
        return resp
    data = (
        b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in resp["streamed_chunks"]) + b"data: [DONE]\n\n"
    )
    r = C.reassemble([data])
    assert r.complete and r.problems == []
    return r.final


def _action_message(action: Action) -> Message:
    parts: list = list(action.reasoning)
    if action.text:
        parts.append(TextPart(action.text))
    parts += action.tool_calls
    return Message(role="assistant", parts=parts)


def _sdk_snapshot(data: bytes) -> dict:
    """openai-python's own accumulator (ChatCompletionStreamState) over our decoded chunks."""
    state = ChatCompletionStreamState()
    for ev in decode_all([data]):
        if ev.data.startswith("[DONE]"):
            break
        state.handle_chunk(ChatCompletionChunk.model_validate(orjson.loads(ev.data)))
    return state.current_completion_snapshot.model_dump(mode="json", exclude_none=True)


def _core(final: dict) -> dict:
    """The fields both accumulators must agree on."""
    choices = []
    for c in final["choices"]:
        m = c["message"]
        choices.append(
            {
                "index": c["index"],
                "finish_reason": c["finish_reason"],
                "role": m.get("role"),
                "content": m.get("content"),
                "refusal": m.get("refusal"),
                "tool_calls": [
                    (t["id"], t["type"], t["function"]["name"], t["function"]["arguments"])
                    for t in m.get("tool_calls") or []
                ],
            }
        )
    return {k: final.get(k) for k in ("id", "object", "created", "model", "system_fingerprint", "usage")} | {
        "choices": choices
    }


# --------------------------------------------------------------------------- corpus streams


def test_corpus_has_the_expected_streams(corpus):
    assert sorted(p.name for p in (corpus / "wire" / "openai-chat").glob("*.sse")) == STREAMS


@pytest.mark.parametrize("name", STREAMS)
def test_stream_reassembles_to_golden(corpus, golden, name):
    r = C.reassemble([_stream(corpus, name)])
    assert r.final is not None
    golden(f"wire/openai-chat/{name}.final.json", orjson.dumps(r.final, option=GOLDEN_OPTS))
    # it looks like a non-streamed completion, and the SDK accepts it as one
    assert r.final["object"] == "chat.completion"
    assert all("index" not in tc for c in r.final["choices"] for tc in c["message"].get("tool_calls") or [])
    ChatCompletion.model_validate(r.final)


@pytest.mark.parametrize("name", STREAMS)
def test_reassembly_agrees_with_the_sdk(corpus, name):
    data = _stream(corpus, name)
    ours = C.reassemble([data]).final
    sdk = _sdk_snapshot(data)
    assert _core(ours) == _core(sdk)


def test_parallel_tool_calls_facts(corpus):
    r = C.reassemble([_stream(corpus, "parallel_tool_calls.sse")])
    assert r.complete and r.problems == [] and r.error is None and r.events == 26
    (choice,) = r.final["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_JMW1whyEaYG438VE1OIflxA2", "GetWeatherArgs"),
        ("call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price"),
    ]
    assert calls[0]["function"]["arguments"] == '{"city": "Edinburgh", "country": "GB", "units": "c"}'
    assert calls[1]["function"]["arguments"] == '{"ticker": "AAPL", "exchange": "NASDAQ"}'
    assert r.final["usage"]["prompt_tokens"] == 149 and r.final["usage"]["completion_tokens"] == 60
    assert r.final["system_fingerprint"] == "fp_5050236cbd"
    action = C.response_to_action(r.final)
    # exact argument strings, spaces and all
    assert [c.arguments_raw for c in action.tool_calls] == [
        '{"city": "Edinburgh", "country": "GB", "units": "c"}',
        '{"ticker": "AAPL", "exchange": "NASDAQ"}',
    ]
    assert action.tool_calls[1].arguments == {"ticker": "AAPL", "exchange": "NASDAQ"}
    assert action.stop_reason == "tool_calls" and action.text == "" and action.usage["total_tokens"] == 209


def test_tool_call_with_usage_facts(corpus):
    r = C.reassemble([_stream(corpus, "tool_call_with_usage.sse")])
    assert r.complete and r.problems == []
    msg = r.final["choices"][0]["message"]
    assert msg["tool_calls"] == [
        {
            "id": "call_4XzlGBLtUe9dy3GVNV4jhq7h",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"New York City"}'},
        }
    ]
    assert msg["refusal"] is None
    # the usage-only chunk has choices: [] (stream_options.include_usage)
    assert r.final["usage"] == {
        "prompt_tokens": 44,
        "completion_tokens": 16,
        "total_tokens": 60,
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def test_finish_length_facts(corpus):
    r = C.reassemble([_stream(corpus, "finish_length_with_usage.sse")])
    assert r.complete
    (choice,) = r.final["choices"]
    assert choice["message"] == {"role": "assistant", "content": '{"', "refusal": None}
    assert choice["finish_reason"] == "length"
    assert r.final["usage"]["total_tokens"] == 80
    action = C.response_to_action(r.final)
    assert (action.text, action.stop_reason) == ('{"', "length")


def test_missing_done_means_incomplete(corpus):
    data = _stream(corpus, "tool_call_with_usage.sse")
    cut = data[: data.index(b"data: [DONE]")]
    r = C.reassemble([cut])
    assert not r.complete and r.final == C.reassemble([data]).final


# --------------------------------------------------------------------------- render and split


@pytest.mark.parametrize("piece", [1, 7, 64])
@pytest.mark.parametrize("name", STREAMS)
def test_render_stream_roundtrip(corpus, name, piece):
    final = C.reassemble([_stream(corpus, name)]).final
    data = C.render_stream(final, piece=piece)
    assert data.endswith(b"data: [DONE]\n\n")
    again = C.reassemble([data])
    assert again.final == final
    assert again.complete and again.problems == [] and again.error is None
    events = decode_all([data])
    assert all(ev.event is None for ev in events)  # no event: lines in Chat streams
    usage_chunk = orjson.loads(events[-2].data)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == final["usage"]
    assert _core(_sdk_snapshot(data)) == _core(final)


@pytest.mark.parametrize("name", STREAMS)
def test_every_split_gives_the_same_result(corpus, name):
    data = _stream(corpus, name)
    ref = C.reassemble([data])
    for i in range(len(data) + 1):
        r = C.reassemble([data[:i], data[i:]])
        assert (r.final, r.complete, r.problems, r.events) == (
            ref.final,
            ref.complete,
            ref.problems,
            ref.events,
        ), f"split at byte {i}"
    r = C.reassemble(data[i : i + 1] for i in range(len(data)))
    assert (r.final, r.complete, r.problems, r.events) == (ref.final, ref.complete, ref.problems, ref.events)


# --------------------------------------------------------------------------- rules without corpus sample


def _chunk(delta=None, finish=None, index=0, **top) -> bytes:
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m", **top}
    if "choices" not in top:
        obj["choices"] = [{"index": index, "delta": delta or {}, "finish_reason": finish}]
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_reasoning_refusal_repeats_and_usage_rules():
    data = b"".join(
        [
            _chunk({"role": "assistant", "content": "", "reasoning_content": "think "}, usage=None),
            _chunk({"role": "assistant", "reasoning_content": "more"}, usage=None),  # role repeated
            _chunk({"content": "Hi"}),
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "run", "arguments": ""},
                        }
                    ]
                }
            ),
            # a server that repeats id and name in every fragment must not get them doubled
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "run", "arguments": '{"x":'},
                        }
                    ]
                }
            ),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
            _chunk({}, finish="tool_calls", system_fingerprint="fp_1"),
            _chunk(choices=[], usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
            _chunk(choices=[], usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}),
            b"data: [DONE]\n\n",
        ]
    )
    r = C.reassemble([data])
    assert r.complete and r.problems == []
    msg = r.final["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"] == "Hi" and msg["reasoning_content"] == "think more"
    assert msg["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "run", "arguments": '{"x": 1}'}}
    ]
    assert r.final["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
    }  # assigned, not summed
    assert r.final["system_fingerprint"] == "fp_1"
    action = C.response_to_action(r.final)
    assert action.reasoning == [Reasoning(text="think more")] and action.text == "Hi"
    assert C.reassemble([C.render_stream(r.final, piece=2)]).final == r.final


def test_two_choices_are_kept_apart():
    data = b"".join(
        [
            _chunk({"role": "assistant", "content": "A"}, index=0),
            _chunk({"role": "assistant", "content": "B"}, index=1),
            _chunk({"content": "a"}, index=0),
            _chunk({}, finish="stop", index=1),
            _chunk({}, finish="stop", index=0),
            b"data: [DONE]\n\n",
        ]
    )
    r = C.reassemble([data])
    assert [c["message"]["content"] for c in r.final["choices"]] == ["Aa", "B"]
    assert C.reassemble([C.render_stream(r.final)]).final == r.final


def test_error_chunk_becomes_the_outcome():
    data = (
        _chunk({"role": "assistant", "content": "par"})
        + b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
    )
    r = C.reassemble([data])
    assert r.error == {"error": {"message": "overloaded", "type": "server_error"}}
    assert not r.complete and r.final["choices"][0]["message"]["content"] == "par"
    bare = C.reassemble([b'{"error": {"message": "quota", "type": "insufficient_quota"}}\n'])
    assert bare.error["error"]["type"] == "insufficient_quota" and bare.final is None


def test_garbage_lines_are_reported_not_raised(corpus):
    good = _stream(corpus, "tool_call_with_usage.sse")
    data = b"data: {oops\n\nnot sse at all\n\ndata: 42\n\n" + good + b"data: after done\n\n"
    r = C.reassemble([data])
    assert r.final == C.reassemble([good]).final and r.complete
    assert any("data is not JSON" in p for p in r.problems)
    assert any("not SSE" in p for p in r.problems)
    assert any("not an object" in p for p in r.problems)
    assert any("after [DONE]" in p for p in r.problems)
    nothing = C.reassemble([b"\xff\xfe\x00\n\n"])
    assert nothing.final is None and not nothing.complete and nothing.problems
    with pytest.raises(BadInputError):
        C.render_stream([])


# --------------------------------------------------------------------------- requests


# (file, messages after the system prompt, tool calls, tool results) per request, in file order
EXPECTED_COUNTS = [
    ("mini-swe-agent-2.4.6.jsonl", 1, 0, 0),
    ("mini-swe-agent-2.4.6.jsonl", 3, 1, 1),
    ("mini-swe-agent-2.4.6.jsonl", 1, 0, 0),
    ("mini-swe-agent-2.4.6.jsonl", 4, 2, 2),
    ("opencode-1.18.33.jsonl", 2, 0, 0),
    ("opencode-1.18.33.jsonl", 1, 0, 0),
    ("opencode-1.18.33.jsonl", 3, 1, 1),
    ("opencode-1.18.33.jsonl", 2, 0, 0),
    ("opencode-1.18.33.jsonl", 1, 0, 0),
    ("opencode-1.18.33.jsonl", 4, 2, 2),
    ("qwen-code-0.24.4.jsonl", 1, 0, 0),
    ("qwen-code-0.24.4.jsonl", 3, 1, 1),
    ("qwen-code-0.24.4.jsonl", 1, 0, 0),
    ("qwen-code-0.24.4.jsonl", 4, 2, 2),
    ("qwen-code-0.24.4.jsonl", 5, 1, 1),
    ("qwen-code-0.24.4.jsonl", 7, 1, 1),
]


def test_corpus_requests_parse(corpus):
    counts = []
    for name, n, rec in _requests(corpus):
        body = rec["body"]
        conv = C.parse_request(orjson.dumps(body), path=rec["path"])
        assert conv.protocol == "openai-chat" and conv.model == body["model"]
        lead = [m for m in body["messages"][:1] if m["role"] == "system"]
        assert conv.system_raw == lead and conv.system == lead[0]["content"]
        assert len(conv.messages) == len(body["messages"]) - 1
        assert [t.name for t in conv.tools] == [t["function"]["name"] for t in body.get("tools", [])]
        assert list(conv.params) == [k for k in body if k not in ("model", "messages", "tools", "stream")]
        assert conv.stream == C.wants_stream(rec["path"], "", body) == (body.get("stream") is True)
        calls = [p for m in conv.messages for p in m.parts if isinstance(p, ToolCall)]
        results = [p for m in conv.messages for p in m.parts if isinstance(p, ToolResult)]
        # independent count from the raw body
        assert len(calls) == sum(len(m.get("tool_calls") or []) for m in body["messages"])
        assert len(results) == sum(m["role"] == "tool" for m in body["messages"])
        seen: list[str] = []
        raw_args = [tc["function"]["arguments"] for m in body["messages"] for tc in m.get("tool_calls") or []]
        assert [c.arguments_raw for c in calls] == raw_args  # exact strings
        for m in conv.messages:
            for p in m.parts:
                if isinstance(p, ToolCall):
                    assert isinstance(p.arguments, dict)
                    seen.append(p.id)
                if isinstance(p, ToolResult):
                    assert m.role == "tool" and len(m.parts) == 1 and p.is_error is None
                    assert p.call_id in seen, f"{name}:{n}: result for unknown call {p.call_id}"
        counts.append((name, len(conv.messages), len(calls), len(results)))
    assert counts == EXPECTED_COUNTS


def test_corpus_requests_render_back(corpus):
    for name, n, rec in _requests(corpus):
        body = rec["body"]
        conv = C.parse_request(body)
        rendered = C.render_request(conv)
        back = orjson.loads(rendered)
        # with raw present nothing is lost: same fields, message bytes identical
        assert back == body, f"{name}:{n}"
        assert orjson.dumps(back["messages"]) == orjson.dumps(body["messages"])
        assert C.normalise(C.parse_request(rendered)) == C.normalise(conv)
        # from canonical fields alone
        bare = C.render_request(_strip_raw(conv))
        assert C.normalise(C.parse_request(bare)) == C.normalise(conv), f"{name}:{n}"


def _extends(a: dict, b: dict) -> bool:
    return (
        (a["system"], a["tools"]) == (b["system"], b["tools"])
        and len(b["messages"]) > len(a["messages"])
        and b["messages"][: len(a["messages"])] == a["messages"]
    )


# (file, line of request i, line of request i+1) for every "extends" pair in the corpus
EXPECTED_CHAINS = [
    ("mini-swe-agent-2.4.6.jsonl", 0, 1),
    ("mini-swe-agent-2.4.6.jsonl", 2, 3),
    ("opencode-1.18.33.jsonl", 2, 3),
    ("opencode-1.18.33.jsonl", 5, 6),
    ("qwen-code-0.24.4.jsonl", 0, 1),
    ("qwen-code-0.24.4.jsonl", 2, 3),
]


def test_chain_rule_on_real_requests(corpus):
    """Each main-loop request extends the previous one, and what it appends first is the
    recorded reply, although OpenCode re-serialises the arguments (`{"command": "x"}` comes back
    as `{"command":"x"}`), Qwen Code sends `content: null`, OpenCode `""` and mini-swe-agent
    no content at all (agents.md)."""
    reqs = _requests(corpus)
    norm = [(name, n, C.normalise(C.parse_request(rec["body"])), rec) for name, n, rec in reqs]
    pairs = []
    for name, n, a, rec in norm:
        for name2, n2, b, _ in norm:
            if name2 == name and n2 > n and _extends(a, b):
                pairs.append((name, n, n2))
                reply = C.response_to_action(_reply_final(rec))
                assert b["messages"][len(a["messages"])] == normalise_messages([_action_message(reply)])[0]
                break
    assert pairs == EXPECTED_CHAINS
    # the re-serialisation and the content forms really are in the data
    by_key = {(name, n): rec for name, n, rec in reqs}
    sent = by_key[("opencode-1.18.33.jsonl", 3)]["body"]["messages"][2]
    streamed = C.response_to_action(_reply_final(by_key[("opencode-1.18.33.jsonl", 2)])).tool_calls[0]
    assert sent["content"] == "" and sent["tool_calls"][0]["function"]["arguments"] != streamed.arguments_raw
    assert by_key[("qwen-code-0.24.4.jsonl", 1)]["body"]["messages"][2]["content"] is None
    assert "content" not in by_key[("mini-swe-agent-2.4.6.jsonl", 1)]["body"]["messages"][2]
    # Qwen Code's memory-extraction request carries the conversation under another system prompt
    memory = C.normalise(C.parse_request(by_key[("qwen-code-0.24.4.jsonl", 5)]["body"]))
    main = C.normalise(C.parse_request(by_key[("qwen-code-0.24.4.jsonl", 4)]["body"]))
    assert (
        memory["system"] != main["system"] and memory["messages"][: len(main["messages"])] == main["messages"]
    )


def test_normalise_unifies_agent_differences():
    base = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "out"},
        ],
    }
    opencode = json.loads(json.dumps(base))
    opencode["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"command":"x"}'  # re-serialised
    qwen = json.loads(json.dumps(base))
    qwen["messages"][2]["content"] = None
    qwen["messages"][1]["content"] = [{"type": "text", "text": "task"}]
    qwen["messages"][3]["content"] = [{"type": "text", "text": "out"}]
    mini = json.loads(json.dumps(base))
    del mini["messages"][2]["content"]
    ref = C.normalise(C.parse_request(base))
    for variant in (opencode, qwen, mini):
        assert C.normalise(C.parse_request(variant)) == ref
    for path, value in [
        ((2, "tool_calls", 0, "function", "arguments"), '{"command": "y"}'),
        ((2, "tool_calls", 0, "id"), "call_2"),
        ((3, "content"), "other"),
        ((2, "content"), "text"),
    ]:
        changed = json.loads(json.dumps(base))
        target = changed["messages"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert C.normalise(C.parse_request(changed)) != ref, path


def test_parse_request_shapes_and_render_from_canonical_fields():
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "d1"}]},
            {"role": "system", "content": "s2"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "why",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "not json"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": None},
            {"role": "system", "content": "late system note"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            }
        ],
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conv = C.parse_request(body)
    assert conv.system == "d1\n\ns2" and conv.system_raw == body["messages"][:2]
    user, assistant, tool, late = conv.messages
    assert [type(p).__name__ for p in user.parts] == ["TextPart", "OtherPart"]
    reasoning, call = assistant.parts
    assert reasoning.text == "why" and call.arguments_raw == "not json" and call.arguments is None
    assert tool.role == "tool" and tool.parts[0].content is None and tool.parts[0].call_id == "call_1"
    assert late.role == "system"
    assert conv.params == {"temperature": 0.2, "stream_options": {"include_usage": True}}
    assert orjson.loads(C.render_request(conv)) == body
    bare = orjson.loads(C.render_request(_strip_raw(conv)))
    assert bare["messages"][0] == {"role": "system", "content": "d1\n\ns2"}
    assert bare["messages"][2]["tool_calls"][0]["function"]["arguments"] == "not json"
    assert bare["messages"][2]["reasoning_content"] == "why"
    assert bare["tools"][0] == {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
    }
    assert list(bare)[-2:] == ["stream", "stream_options"]
    # an Anthropic-style message of several results renders as one tool message each
    hand = Conversation(
        protocol="openai-chat",
        model="m",
        tools=[ToolSpec(name="f", parameters={"type": "object"})],
        messages=[
            Message("user", [ToolResult(call_id="c1", content="r1"), ToolResult(call_id="c2", content="r2")])
        ],
    )
    assert orjson.loads(C.render_request(hand))["messages"] == [
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
    ]


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"", "not valid JSON"),
        (b"nope", "not valid JSON"),
        (b"[]", "expected an object"),
        (b"null", "expected an object"),
        (b'{"messages": {}}', "'messages'"),
        (b'{"messages": [1]}', "messages[0]"),
        (b'{"messages": [{"role": "user", "content": 3}]}', "messages[0].content"),
        (b'{"messages": [{"role": "assistant", "tool_calls": {}}]}', "messages[0].tool_calls"),
        (b'{"messages": [], "tools": "x"}', "'tools'"),
    ],
)
def test_bad_request_bodies_raise_bad_input(body, fragment):
    with pytest.raises(BadInputError) as info:
        C.parse_request(body)
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- replies


def _sample_action() -> Action:
    return Action(
        text="",
        reasoning=[Reasoning(text="r")],
        tool_calls=[
            ToolCall(id=None, name="bash", arguments_raw='{"command": "ls"}'),
            ToolCall(id="call_kept", name="bash", arguments_raw="", arguments={"command": "pwd"}),
        ],
        usage={"input_tokens": 9, "output_tokens": 4},
    )


def test_action_to_response_is_deterministic_and_valid():
    one = C.action_to_response(_sample_action(), model="mock-model", ids=IdSource(3))
    two = C.action_to_response(_sample_action(), model="mock-model", ids=IdSource(3))
    assert dumps(one) == dumps(two) and C.render_stream(one) == C.render_stream(two)
    assert one["id"] == "chatcmpl-00000003" + "0" * 15 + "1" and one["created"] == 0
    msg = one["choices"][0]["message"]
    assert msg["content"] is None and msg["reasoning_content"] == "r"
    assert msg["tool_calls"][0]["id"].startswith("call_00000003")
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'  # exact
    assert msg["tool_calls"][1] == {
        "id": "call_kept",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command":"pwd"}'},
    }
    assert one["choices"][0]["finish_reason"] == "tool_calls"
    assert one["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    parsed = ChatCompletion.model_validate(one)
    assert parsed.choices[0].message.tool_calls[1].function.name == "bash"
    assert C.reassemble([C.render_stream(one)]).final == one
    assert _core(_sdk_snapshot(C.render_stream(one))) == _core(one)
    back = C.response_to_action(one)
    assert [c.arguments_raw for c in back.tool_calls] == ['{"command": "ls"}', '{"command":"pwd"}']
    text_only = C.action_to_response(
        Action(text="hello", stop_reason="end_turn"), model="m", ids=IdSource(3), created=99
    )
    assert text_only["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert (
        text_only["choices"][0]["finish_reason"] == "stop"
        and "usage" not in text_only
        and text_only["created"] == 99
    )
    ChatCompletion.model_validate(text_only)
    assert b"usage" not in C.render_stream(text_only)


def test_corpus_replies_survive_action_roundtrip(corpus):
    for name in STREAMS:
        final = C.reassemble([_stream(corpus, name)]).final
        again = C.action_to_response(C.response_to_action(final), ids=IdSource(1))
        m0, m1 = final["choices"][0]["message"], again["choices"][0]["message"]
        assert m1["content"] == m0["content"] and m1.get("tool_calls") == m0.get("tool_calls")
        assert again["usage"] == final["usage"] and again["model"] == final["model"]
        assert again["choices"][0]["finish_reason"] == final["choices"][0]["finish_reason"]


# --------------------------------------------------------------------------- small contract items


def test_paths_registry_and_error_body():
    assert C.matches("/v1/chat/completions") and not C.matches("/v1/chat/completions/x")
    assert not C.matches("/v1/messages")
    assert protocol_for_path("/v1/chat/completions") is C and get_protocol("openai-chat") is C
    assert C.wants_stream("/v1/chat/completions", "", b'{"stream": true}')
    assert not C.wants_stream("/v1/chat/completions", "", b'{"stream": false}')
    assert not C.wants_stream("/v1/chat/completions", "", b"[")
    body = orjson.loads(C.error_body(400, "bad request", "invalid_request_error"))
    assert body == {
        "error": {"message": "bad request", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert orjson.loads(C.error_body(503, "down"))["error"]["type"] == "server_error"
    assert orjson.loads(C.error_body(429, "slow down"))["error"]["type"] == "rate_limit_exceeded"
    openai.types.ErrorObject.model_validate(body["error"])
