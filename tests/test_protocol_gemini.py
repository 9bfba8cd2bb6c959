"""Gemini wire protocol (pvisor.adapters.protocols.gemini), on the real corpus:
tests/corpus/wire/gemini (decoded GenerateContentResponse payloads, framed here as SSE, as a JSON
array and in the Code Assist envelope) and the Gemini CLI 0.61 requests in
tests/corpus/requests/gemini-cli-0.61.0.jsonl."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson
import pytest

from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.adapters.protocols import gemini as G
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

STREAMS = ("text", "tool_call")
SIG = "EqUCCqICAb4+9vsh8Pd5taZVoPzSvjWWwzBrvhEQWBLCGa7IdY8FBMm7Z6dC"  # base64, like real signatures


# --------------------------------------------------------------------------- helpers


def chunk_lines(corpus: Path, name: str) -> list[bytes]:
    raw = (corpus / "wire" / "gemini" / f"{name}.chunks.jsonl").read_bytes()
    return [line for line in raw.split(b"\n") if line.strip()]


def sse(lines: list[bytes], eol: bytes = b"\r\n") -> bytes:
    return b"".join(b"data: " + line + eol + eol for line in lines)


def pretty(line: bytes) -> bytes:
    return orjson.dumps(orjson.loads(line), option=orjson.OPT_INDENT_2)


def framings(corpus: Path, name: str) -> dict[str, bytes]:
    """The same payloads in every framing the module accepts."""
    lines = chunk_lines(corpus, name)
    return {
        "crlf": sse(lines),
        "lf": sse(lines, b"\n"),
        "reframed": (corpus / "wire" / "gemini" / f"{name}.reframed.sse").read_bytes(),
        # streamGenerateContent without alt=sse: one JSON array sent in pieces
        "array": b"[" + b",\r\n".join(lines) + b"]",
        "array-pretty": b"[" + b"\n,\r\n".join(pretty(line) for line in lines) + b"\n]",
        # Gemini CLI logged in with Google: {"response": {...}, "traceId": ...}
        "code-assist": sse([b'{"response":' + line + b',"traceId":"t-1"}' for line in lines]),
    }


def golden_bytes(final) -> bytes:
    return orjson.dumps(final, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def summary(r):
    return (r.final, r.complete, r.events, r.error, r.problems)


def requests(corpus: Path) -> list[dict]:
    raw = (corpus / "requests" / "gemini-cli-0.61.0.jsonl").read_bytes()
    return [orjson.loads(line) for line in raw.split(b"\n") if line.strip()]


def parse(req: dict):
    return G.parse_request(req["body"], path=req["path"], query=req["query"])


def strip_raw(conv):
    """A copy without any ``raw`` (and no ``system_raw``). OtherPart keeps its raw: it is the
    part's whole content, not an extra (none occurs in the Gemini CLI corpus anyway)."""
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


def canonical(conv):
    """Everything a conversation says, without raw."""
    return (
        conv.model,
        conv.system,
        conv.stream,
        conv.params,
        [(t.name, t.description, t.parameters) for t in conv.tools],
        [
            (
                m.role,
                [(type(p).__name__, {k: getattr(p, k) for k in p.__slots__ if k != "raw"}) for p in m.parts],
            )
            for m in conv.messages
        ],
    )


def parts(conv, kind):
    return [p for m in conv.messages for p in m.parts if isinstance(p, kind)]


# --------------------------------------------------------------------------- registry and paths


def test_registry_and_paths():
    assert get_protocol("gemini") is G and G.NAME == "gemini"
    assert len(G.PATHS) == 6
    for path in (
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
        "/v1/models/gemini-2.5-flash:generateContent",
        "/v1beta/models/gemini-2.5-pro:countTokens",
    ):
        assert G.matches(path) and protocol_for_path(path) is G
    for path in (
        "/v1beta/models/gemini-2.5-pro",
        "/v1beta/models/a/b:generateContent",
        "/v1internal:streamGenerateContent",
        "/v1beta/models/x:embedContent",
        "/v1/responses",
    ):
        assert not G.matches(path)
    assert G.parse_path("/v1beta/models/gemini-3.5-flash-lite:generateContent") == (
        "gemini-3.5-flash-lite",
        "generateContent",
    )


def test_wants_stream():
    assert G.wants_stream("/v1beta/models/m:streamGenerateContent", "alt=sse", b"{}")
    assert G.wants_stream("/v1beta/models/m:streamGenerateContent", "", b"{}")  # JSON-array stream
    assert not G.wants_stream("/v1beta/models/m:generateContent", "", b'{"stream":true}')
    assert not G.wants_stream("/v1beta/models/m:countTokens", "", b"{}")


def test_error_body():
    assert orjson.loads(G.error_body(429, "quota", "RESOURCE_EXHAUSTED")) == {
        "error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}
    }


# --------------------------------------------------------------------------- reassembly: corpus


@pytest.mark.parametrize("name", STREAMS)
def test_corpus_stream_reassembles_to_golden(corpus, golden, name):
    results = {how: G.reassemble([data]) for how, data in framings(corpus, name).items()}
    first = results["crlf"]
    assert first.complete and first.error is None and first.problems == []
    assert first.events == len(chunk_lines(corpus, name))
    for how, r in results.items():
        assert summary(r) == summary(first), how
    golden(f"wire/gemini/{name}.final.json", golden_bytes(first.final))


def test_tool_call_facts(corpus):
    """PROVENANCE.md: chunk 1 carries a whole functionCall (+thoughtSignature), chunk 2 an empty
    text part + finishReason STOP; usageMetadata repeated on each chunk."""
    chunks = [orjson.loads(line) for line in chunk_lines(corpus, "tool_call")]
    first_part = chunks[0]["candidates"][0]["content"]["parts"][0]
    assert first_part["functionCall"] == {"name": "weather", "args": {"location": "San Francisco"}}
    assert first_part["thoughtSignature"].startswith("EqUCCqICAb4")
    final = G.reassemble([sse(chunk_lines(corpus, "tool_call"))]).final
    cand = final["candidates"][0]
    assert cand["content"]["parts"] == [first_part, {"text": ""}]
    assert cand["finishReason"] == "STOP" and cand["index"] == 0 and cand["content"]["role"] == "model"
    assert final["usageMetadata"] == chunks[-1]["usageMetadata"]
    assert (
        final["responseId"] == "b36LacjwM668nsEP2tbsgQQ" and final["modelVersion"] == "gemini-3-pro-preview"
    )
    action = G.response_to_action(final)
    assert [(c.name, c.arguments_raw, c.arguments, c.id) for c in action.tool_calls] == [
        ("weather", '{"location":"San Francisco"}', {"location": "San Francisco"}, None)
    ]
    assert action.tool_calls[0].raw["thoughtSignature"] == first_part["thoughtSignature"]
    assert action.stop_reason == "STOP" and action.model == "gemini-3-pro-preview" and action.text == ""


def test_text_facts(corpus):
    """Three text chunks concatenate into one part; the signature of the last (empty) text part
    stays on it; usage is the last chunk's (candidatesTokenCount 23, not 5)."""
    chunks = [orjson.loads(line) for line in chunk_lines(corpus, "text")]
    texts = [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks]
    final = G.reassemble([sse(chunk_lines(corpus, "text"))]).final
    (part,) = final["candidates"][0]["content"]["parts"]
    assert part["text"] == "".join(texts) == 'There are **3** "r"s in strawberry.\n\nst**r**awbe**rr**y'
    assert part["thoughtSignature"] == chunks[2]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    assert chunks[0]["usageMetadata"]["candidatesTokenCount"] == 5
    assert (
        final["usageMetadata"]["candidatesTokenCount"] == 23
        and final["usageMetadata"] == chunks[-1]["usageMetadata"]
    )
    action = G.response_to_action(final)
    assert action.text == part["text"]
    assert [(r.text, r.signature) for r in action.reasoning] == [("", part["thoughtSignature"])]


def test_merge_rules():
    """Adjacent text pieces join per kind (thought / not); a signed part is closed; function calls
    stay whole; several candidates stay apart."""
    chunks = [
        {
            "candidates": [
                {"content": {"parts": [{"text": "Let me ", "thought": True}], "role": "model"}, "index": 0}
            ]
        },
        {
            "candidates": [
                {
                    "content": {
                        "parts": [{"text": "think.", "thought": True, "thoughtSignature": SIG}],
                        "role": "model",
                    },
                    "index": 0,
                }
            ]
        },
        {
            "candidates": [
                {"content": {"parts": [{"text": "Answer", "thought": True}], "role": "model"}, "index": 0}
            ]
        },
        {
            "candidates": [
                {"content": {"parts": [{"text": "Ans"}], "role": "model"}, "index": 0},
                {"content": {"parts": [{"text": "B1"}], "role": "model"}, "index": 1},
            ]
        },
        {
            "candidates": [
                {"content": {"parts": [{"text": "wer"}, {"text": " two"}], "role": "model"}, "index": 0},
                {"content": {"parts": [{"text": "B2"}], "role": "model"}, "index": 1},
            ]
        },
        {
            "candidates": [
                {
                    "content": {"parts": [{"functionCall": {"name": "f", "args": {}}}], "role": "model"},
                    "index": 0,
                }
            ]
        },
        {
            "candidates": [
                {
                    "content": {"parts": [{"text": "after"}], "role": "model"},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {"totalTokenCount": 9},
        },
    ]
    r = G.reassemble([sse([orjson.dumps(c) for c in chunks])])
    assert r.complete and r.problems == []
    c0, c1 = r.final["candidates"]
    assert c0["content"]["parts"] == [
        {"text": "Let me think.", "thought": True, "thoughtSignature": SIG},
        {"text": "Answer", "thought": True},
        {"text": "Answer"},
        {"text": " two"},  # a second part inside one chunk stays a part of its own
        {"functionCall": {"name": "f", "args": {}}},
        {"text": "after"},
    ]
    assert c1 == {"content": {"parts": [{"text": "B1B2"}], "role": "model"}, "index": 1}
    assert G.reassemble([G.render_stream(r.final)]).final == r.final


# --------------------------------------------------------------------------- render -> reassemble


@pytest.mark.parametrize("name", STREAMS)
def test_render_stream_round_trip(corpus, name):
    from google.genai import types

    final = G.reassemble([sse(chunk_lines(corpus, name))]).final
    data = G.render_stream(final)
    again = G.reassemble([data])
    assert again.final == final and again.complete and again.problems == []
    events = decode_all([data])
    assert len(events) >= 2  # text is split into pieces, parts go one per chunk
    assert data.endswith(b"\r\n\r\n") and all(e.event is None and not e.stray for e in events)
    for e in events:
        types.GenerateContentResponse.model_validate_json(e.data)
    assert G.reassemble([G.render_stream(final, eol=b"\n")]).final == final


def test_render_stream_odd_finals():
    no_index = {
        "candidates": [{"content": {"parts": [{"text": "a"}, {"text": "b"}], "role": "model"}}],
        "responseId": "r",
    }
    assert G.stream_chunks(no_index) == [no_index]
    assert G.reassemble([G.render_stream(no_index)]).final == no_index
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}
    r = G.reassemble([G.render_stream(blocked)])
    assert r.final == blocked and r.complete
    safety = {"candidates": [{"finishReason": "SAFETY", "index": 0, "safetyRatings": []}]}
    assert G.reassemble([G.render_stream(safety)]).final == safety
    long = {
        "candidates": [
            {
                "content": {
                    "parts": [{"text": "x" * 450, "thought": True}, {"text": "y" * 3}],
                    "role": "model",
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ]
    }
    assert len(G.stream_chunks(long)) == 5  # 3 thought pieces, then "yyy" in 2 pieces
    assert G.reassemble([G.render_stream(long)]).final == long


# --------------------------------------------------------------------------- split invariance


@pytest.mark.slow
@pytest.mark.parametrize("name", STREAMS)
def test_every_split_reassembles_the_same(corpus, name):
    for how, data in framings(corpus, name).items():
        whole = summary(G.reassemble([data]))
        for i in range(1, len(data)):
            assert summary(G.reassemble([data[:i], data[i:]])) == whole, (how, i)
        assert summary(G.reassemble(data[i : i + 1] for i in range(len(data)))) == whole, how


# --------------------------------------------------------------------------- stream damage

ERROR = {
    "error": {
        "code": 429,
        "message": "Resource has been exhausted (e.g. check quota).",
        "status": "RESOURCE_EXHAUSTED",
    }
}


def test_bare_json_error_lines(corpus):
    """python-genai reads non-``data:`` lines brace-balanced; an ``{"error": ...}`` object is the
    stream's error, also when pretty-printed over several lines."""
    lines = chunk_lines(corpus, "text")
    for error_bytes in (orjson.dumps(ERROR), orjson.dumps(ERROR, option=orjson.OPT_INDENT_2)):
        data = sse(lines[:1]) + error_bytes + b"\r\n"
        r = G.reassemble([data])
        assert r.error == ERROR and not r.complete and r.problems == []
        assert r.final["candidates"][0]["content"]["parts"] == [{"text": "There are **3**"}]
        assert summary(G.reassemble(data[i : i + 1] for i in range(len(data)))) == summary(r)
    only = G.reassemble([orjson.dumps(ERROR, option=orjson.OPT_INDENT_2)])
    assert only.error == ERROR and only.final is None and not only.complete
    in_array = G.reassemble([b"[" + orjson.dumps(ERROR) + b"]"])
    assert in_array.error == ERROR


def test_truncated_stream_is_not_complete(corpus):
    lines = chunk_lines(corpus, "text")
    r = G.reassemble([sse(lines[:2])])
    assert not r.complete and r.problems == []
    assert r.final["candidates"][0]["content"]["parts"] == [
        {"text": 'There are **3** "r"s in strawberry.\n\nst**r**awbe**rr**y'}
    ]
    data = framings(corpus, "text")["array-pretty"]
    cut = G.reassemble([data[: data.rindex(b"{\n") + 40]])  # inside the last (finishing) object
    assert not cut.complete and cut.events == 2
    assert cut.final == r.final
    assert any("unterminated JSON at the end of the stream" in p for p in cut.problems)
    assert G.reassemble([]).final is None


def test_garbage_gives_problems_not_exceptions(corpus):
    lines = chunk_lines(corpus, "tool_call")
    junk = (
        b'data: {not json\r\n\r\ndata: [DONE]\r\n\r\ndata: 42\r\n\r\ndata: {"candidates": 5}\r\n\r\n'
        b'data: {"candidates": [7]}\r\n\r\nhello there\r\n\r\n\xff\xfe\r\n\r\n'
    )
    r = G.reassemble([sse(lines[:1]), junk, sse(lines[1:])])
    assert r.complete
    assert r.final == G.reassemble([sse(lines)]).final
    text = "\n".join(r.problems)
    assert "not JSON: '{not json'" in text and "not JSON: '[DONE]'" in text
    assert "a JSON number, expected an object" in text
    assert "candidates is a JSON number, expected an array" in text
    assert "candidate 0 is not an object" in text
    assert "non-JSON text outside data lines ignored: 'hello there'" in text


# --------------------------------------------------------------------------- requests

EXPECTED = [  # (messages, tool calls, tool results) per request of the corpus
    (1, 0, 0),
    (3, 1, 1),
    (1, 0, 0),
    (5, 1, 2),
    (7, 2, 3),
    (1, 0, 0),
    (3, 2, 2),
]


def test_corpus_requests_parse(corpus):
    reqs = requests(corpus)
    assert len(reqs) == len(EXPECTED)
    for req, (n_msgs, n_calls, n_results) in zip(reqs, EXPECTED):
        assert G.matches(req["path"])
        conv = parse(req)
        aux = req["path"].endswith(":generateContent")
        assert conv.model == ("gemini-3.5-flash-lite" if aux else "gemini-2.5-pro")
        assert conv.stream is not aux
        assert len(conv.messages) == n_msgs
        assert len(parts(conv, ToolCall)) == n_calls and len(parts(conv, ToolResult)) == n_results
        calls: dict[str, str] = {}
        for m in conv.messages:
            assert m.role == ("assistant" if m.raw["role"] == "model" else "user")
            for p in m.parts:
                if isinstance(p, ToolCall):
                    assert m.role == "assistant" and p.id.startswith(
                        "run_shell_command_"
                    )  # made by Gemini CLI
                    assert p.arguments == orjson.loads(p.arguments_raw) and "command" in p.arguments
                    calls[p.id] = p.name
                elif isinstance(p, ToolResult):
                    assert calls.get(p.call_id) == p.name == "run_shell_command"  # id and name match
                    assert p.content["output"].startswith("<untrusted_context>")
        assert conv.params == {"generationConfig": req["body"]["generationConfig"]}
        if aux:
            assert conv.system is None and conv.tools == []
        else:
            assert conv.system.startswith("You are a non-interactive CLI agent")
            assert conv.system_raw == req["body"]["systemInstruction"]
            assert len(conv.tools) == 16 and conv.tools[8].name == "run_shell_command"
            decl = req["body"]["tools"][0]["functionDeclarations"][8]
            assert conv.tools[8].parameters == decl["parametersJsonSchema"]


def test_corpus_requests_render_round_trip(corpus):
    for req in requests(corpus):
        conv = parse(req)
        body = G.render_request(conv)
        assert body == orjson.dumps(req["body"])  # unchanged input renders byte-identical
        assert G.normalise(G.parse_request(body, path=req["path"])) == G.normalise(conv)


def test_corpus_requests_render_from_canonical_fields(corpus):
    for req in requests(corpus):
        conv = parse(req)
        bare = strip_raw(conv)
        again = G.parse_request(G.render_request(bare), path=req["path"])
        assert G.normalise(again) == G.normalise(bare) == G.normalise(conv)
        assert canonical(again) == canonical(bare)  # ids, args, responses, roles, params all kept


def test_changed_tool_result_keeps_part_extras(corpus):
    req = requests(corpus)[1]
    conv = parse(req)
    conv.messages[2].parts[0].content = {"output": "new observation"}
    body = orjson.loads(G.render_request(conv))
    want = copy.deepcopy(req["body"]["contents"][2])
    want["parts"][0]["functionResponse"]["response"] = {"output": "new observation"}
    assert body["contents"][2] == want
    assert list(body["contents"][2]["parts"][0]["functionResponse"]) == ["name", "response", "id"]
    assert body["contents"][:2] == req["body"]["contents"][:2]  # the signed call part unchanged


def test_consecutive_main_loop_requests_extend(corpus):
    reqs = requests(corpus)
    norm = [G.normalise(parse(r)) for r in reqs]
    for a, b in ((0, 1), (3, 4), (5, 6)):
        assert norm[b]["messages"][: len(norm[a]["messages"])] == norm[a]["messages"], (a, b)
        assert norm[b]["system"] == norm[a]["system"] and norm[b]["tools"] == norm[a]["tools"]
    # the session-title request shares nothing with the main loop
    assert norm[2]["system"] == "" and norm[2]["messages"][0] != norm[1]["messages"][0]


def test_client_ids_and_skip_signature_do_not_count(corpus):
    """Gemini CLI sends the model's functionCall back with an id it made and
    ``thoughtSignature: skip_thought_signature_validator``; the reply had neither."""
    reqs = requests(corpus)
    for a, b in ((0, 1), (3, 4), (5, 6)):
        reply = {"contents": [{"role": "model", "parts": reqs[a]["reply"]["parts"]}]}
        assert all(
            "id" not in p["functionCall"] and "thoughtSignature" not in p
            for p in reply["contents"][0]["parts"]
        )
        echoed = reqs[b]["body"]["contents"][len(reqs[a]["body"]["contents"])]
        assert echoed["parts"][0]["thoughtSignature"] == G.SKIP_SIGNATURE
        assert echoed["parts"][0]["functionCall"]["id"].startswith("run_shell_command_")
        n = len(reqs[a]["body"]["contents"])
        assert (
            G.normalise(G.parse_request(reply))["messages"]
            == G.normalise(parse(reqs[b]))["messages"][n : n + 1]
        )
    # a real signature, the skip marker and none compare equal; different arguments do not
    part = reqs[1]["body"]["contents"][1]["parts"][0]
    variants = []
    for sig in (None, G.SKIP_SIGNATURE, SIG):
        p = {k: v for k, v in part.items() if k != "thoughtSignature"}
        if sig:
            p["thoughtSignature"] = sig
        variants.append(G.normalise(G.parse_request({"contents": [{"role": "model", "parts": [p]}]})))
    assert variants[0] == variants[1] == variants[2]
    other = copy.deepcopy(part)
    other["functionCall"]["args"]["command"] = "rm -rf /"
    assert G.normalise(G.parse_request({"contents": [{"role": "model", "parts": [other]}]})) != variants[0]
    # a part that is nothing but a signature compares as absent
    bare_sig = {"contents": [{"role": "model", "parts": [{"thoughtSignature": SIG}, part]}]}
    conv = G.parse_request(bare_sig)
    assert isinstance(conv.messages[0].parts[0], Reasoning) and conv.messages[0].parts[0].signature == SIG
    assert G.normalise(conv) == variants[0]


def test_resume_duplicates_function_response(corpus):
    """After a resume Gemini CLI sends the old call without its signature and two identical
    functionResponse parts for it; the context message is regenerated (a new chain)."""
    reqs = requests(corpus)
    before, after = parse(reqs[1]), parse(reqs[3])
    assert [type(p) for p in after.messages[2].parts] == [ToolResult, ToolResult]
    assert after.messages[2].parts[0].content == after.messages[2].parts[1].content
    assert "thoughtSignature" in reqs[1]["body"]["contents"][1]["parts"][0]
    assert "thoughtSignature" not in reqs[3]["body"]["contents"][1]["parts"][0]
    n_before, n_after = G.normalise(before)["messages"], G.normalise(after)["messages"]
    assert len(n_after[2]["parts"]) == 1
    assert n_after[1:3] == n_before[1:3]
    assert n_after[0] != n_before[0]  # <session_context> regenerated: a new chain starts
    # two results with the same content for two different calls both count
    two = {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "f", "response": {"output": "ok"}, "id": "a"}},
                    {"functionResponse": {"name": "f", "response": {"output": "ok"}, "id": "b"}},
                ],
            }
        ]
    }
    assert len(G.normalise(G.parse_request(two))["messages"][0]["parts"]) == 2


def test_parts_and_tool_kinds_round_trip():
    body = {
        "contents": [
            {
                "role": "user",
                "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "AA=="}}],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "Hmm.", "thought": True, "thoughtSignature": SIG},
                    {"text": "Calling."},
                    {"functionCall": {"name": "read", "args": {"path": "a"}}},
                    {"executableCode": {"language": "PYTHON", "code": "1"}},
                ],
            },
            {"parts": [{"functionResponse": {"name": "read", "response": {"content": "A"}}}]},
        ],
        "systemInstruction": {"parts": [{"text": "one"}, {"text": "two"}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "read",
                        "description": "Read a file",
                        "parameters": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}}},
                    },
                    {"name": "now"},
                ]
            },
            {"googleSearch": {}},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    }
    conv = G.parse_request(body, path="/v1/models/gemini-2.5-flash:generateContent")
    assert conv.model == "gemini-2.5-flash" and not conv.stream
    assert conv.system == "one\n\ntwo"
    assert [(t.name, t.parameters is not None) for t in conv.tools] == [
        ("read", True),
        ("now", False),
        ("googleSearch", False),
    ]
    user, model, result = conv.messages
    assert [type(p) for p in user.parts] == [TextPart, OtherPart] and user.parts[1].kind == "inlineData"
    assert [type(p) for p in model.parts] == [Reasoning, TextPart, ToolCall, OtherPart]
    assert (model.parts[0].text, model.parts[0].signature) == ("Hmm.", SIG)
    assert result.role == "user" and result.parts[0].call_id is None and result.parts[0].name == "read"
    assert orjson.loads(G.render_request(conv)) == body
    bare = strip_raw(conv)
    rendered = orjson.loads(G.render_request(bare))
    assert (
        rendered["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"]
        == body["tools"][0]["functionDeclarations"][0]["parameters"]
    )
    assert rendered["systemInstruction"] == {"parts": [{"text": "one\n\ntwo"}], "role": "user"}
    assert G.normalise(G.parse_request(rendered)) == G.normalise(bare)
    changed = copy.deepcopy(body)
    changed["tools"][1] = {"googleSearch": {"timeRangeFilter": {}}}
    assert G.normalise(G.parse_request(changed))["tools"] != G.normalise(conv)["tools"]


def test_result_name_from_call_when_missing():
    """A ToolResult without a name (from another protocol) takes the name of the call it answers."""
    conv = G.parse_request(
        {"contents": [{"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "ls", "args": {}}}]}]}
    )
    conv.messages.append(Message("tool", [ToolResult("c1", "a.txt")]))
    body = orjson.loads(G.render_request(conv))
    assert body["contents"][1] == {
        "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a.txt"}, "id": "c1"}}],
        "role": "user",
    }


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
    body = orjson.loads(G.render_request(anthropic_conversation()))
    assert body == {
        "contents": [
            {"parts": [{"text": "hi"}], "role": "user"},
            {"parts": [{"functionCall": {"id": "toolu_1", "args": {"a": 1}, "name": "ls"}}], "role": "model"},
            {
                "parts": [
                    {"functionResponse": {"name": "ls", "response": {"output": "out"}, "id": "toolu_1"}}
                ],
                "role": "user",
            },
        ],
        "systemInstruction": {"parts": [{"text": "sys"}], "role": "user"},
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "ls", "description": "List", "parametersJsonSchema": {"type": "object"}}
                ]
            }
        ],
    }


# --------------------------------------------------------------------------- actions


def _action():
    return Action(
        text="Created a.txt and b.txt.",
        reasoning=[Reasoning("Two files, two calls.", SIG)],
        tool_calls=[
            ToolCall(
                None, "run_shell_command", '{"command": "echo one > a.txt"}', {"command": "echo one > a.txt"}
            ),
            ToolCall(None, "run_shell_command", '{"command":"echo two > b.txt"}', None),
        ],
        usage={"input_tokens": 100, "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 10}},
        stop_reason="tool_use",
    )


def test_action_to_response_is_deterministic_and_sdk_valid():
    from google.genai import types

    first = G.action_to_response(_action(), model="gemini-2.5-pro", ids=IdSource(3))
    second = G.action_to_response(_action(), model="gemini-2.5-pro", ids=IdSource(3))
    assert G.render_stream(first) == G.render_stream(second)
    assert (
        first["responseId"]
        != G.action_to_response(_action(), model="gemini-2.5-pro", ids=IdSource(4))["responseId"]
    )
    parsed = types.GenerateContentResponse.model_validate(first)
    assert parsed.text == "Created a.txt and b.txt."
    assert [(fc.name, fc.args) for fc in parsed.function_calls] == [
        ("run_shell_command", {"command": "echo one > a.txt"}),
        ("run_shell_command", {"command": "echo two > b.txt"}),
    ]
    thought = parsed.candidates[0].content.parts[0]
    assert thought.thought and thought.text == "Two files, two calls." and thought.thought_signature
    assert (
        parsed.usage_metadata.candidates_token_count == 30
        and parsed.usage_metadata.thoughts_token_count == 10
    )
    assert parsed.model_version == "gemini-2.5-pro" and parsed.candidates[0].finish_reason == "STOP"
    for e in decode_all([G.render_stream(first)]):
        types.GenerateContentResponse.model_validate_json(e.data)
    assert G.reassemble([G.render_stream(first)]).final == first


def test_response_action_round_trip(corpus):
    a = G.response_to_action(G.action_to_response(_action(), model="m", ids=IdSource()))
    assert a.text == "Created a.txt and b.txt."
    assert [(r.text, r.signature) for r in a.reasoning] == [("Two files, two calls.", SIG)]
    assert [c.arguments for c in a.tool_calls] == [
        {"command": "echo one > a.txt"},
        {"command": "echo two > b.txt"},
    ]
    assert a.stop_reason == "STOP" and a.model == "m"
    for name in STREAMS:  # a recorded reply survives action -> response with its signatures
        final = G.reassemble([sse(chunk_lines(corpus, name))]).final
        action = G.response_to_action(final)
        rebuilt = G.action_to_response(action, model=action.model, ids=IdSource())
        want = [p for p in final["candidates"][0]["content"]["parts"] if p != {"text": ""}]
        assert rebuilt["candidates"][0]["content"]["parts"] == want
        assert rebuilt["usageMetadata"] == final["usageMetadata"]
    envelope = {"response": G.reassemble([sse(chunk_lines(corpus, "tool_call"))]).final, "traceId": "t"}
    assert G.response_to_action(envelope).tool_calls[0].name == "weather"


def test_cut_reply_and_custom_arguments():
    final = G.action_to_response(
        Action(
            tool_calls=[ToolCall("call_1", "apply_patch", "*** Begin Patch", None, "custom")],
            stop_reason="max_tokens",
        ),
        model="m",
        ids=IdSource(),
    )
    cand = final["candidates"][0]
    assert cand["finishReason"] == "MAX_TOKENS"
    assert cand["content"]["parts"] == [
        {"functionCall": {"name": "apply_patch", "args": {"input": "*** Begin Patch"}, "id": "call_1"}}
    ]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{oops", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[]", "JSON array, expected an object"),
        (b"null", "expected an object"),
    ],
)
def test_bad_request_body(body, words):
    with pytest.raises(BadInputError) as exc:
        G.parse_request(body, path="/v1beta/models/m:generateContent")
    assert words in str(exc.value) and "Gemini request body" in str(exc.value)


def test_odd_contents_do_not_raise():
    body = {
        "contents": [5, {"role": "model", "parts": "x"}, {"parts": [7, {}, {"functionCall": {"name": "f"}}]}],
        "systemInstruction": 3,
        "tools": [1, {"functionDeclarations": [2]}],
    }
    conv = G.parse_request(body)
    assert [m.role for m in conv.messages] == ["user", "assistant", "user"]
    assert conv.params["systemInstruction"] == 3
    assert [t.raw for t in conv.tools] == [1, 2]
    rendered = orjson.loads(G.render_request(conv))
    assert rendered["contents"] == body["contents"] and rendered["systemInstruction"] == 3
    assert G.response_to_action({"candidates": "x"}).text == ""


# --------------------------------------------------------------------------- snake_case fields

SNAKE_BODY = {
    "system_instruction": {"parts": [{"text": "You are Gemini CLI."}], "role": "user"},
    "tools": [
        {
            "function_declarations": [
                {
                    "name": "run_shell_command",
                    "description": "Run a shell command.",
                    "parameters_json_schema": {
                        "type": "object",
                        "properties": {"cmd": {"type": "string"}},
                        "required": ["cmd"],
                    },
                }
            ]
        },
        {"google_search": {}},
    ],
    "contents": [
        {
            "role": "user",
            "parts": [{"text": "Look at this."}, {"inline_data": {"mime_type": "image/png", "data": "iVBO"}}],
        },
        {
            "role": "model",
            "parts": [
                {
                    "function_call": {"id": "c1", "name": "run_shell_command", "args": {"cmd": "ls"}},
                    "thought_signature": "sig-1",
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "function_response": {
                        "id": "c1",
                        "name": "run_shell_command",
                        "response": {"output": "a.txt"},
                    }
                }
            ],
        },
    ],
    "generation_config": {"temperature": 0},
}


def test_snake_case_request_fields_read_as_camel_case():
    """The API reads both spellings; python-genai sends ``parameters_json_schema`` as given."""
    conv = G.parse_request(SNAKE_BODY, path="/v1beta/models/m:generateContent")
    camel = G.parse_request(
        {
            "systemInstruction": SNAKE_BODY["system_instruction"],
            "tools": [
                {
                    "functionDeclarations": [
                        {
                            **{
                                k: v
                                for k, v in SNAKE_BODY["tools"][0]["function_declarations"][0].items()
                                if k != "parameters_json_schema"
                            },
                            "parametersJsonSchema": SNAKE_BODY["tools"][0]["function_declarations"][0][
                                "parameters_json_schema"
                            ],
                        }
                    ]
                },
                {"googleSearch": {}},
            ],
            "contents": [
                {
                    "role": "user",
                    "parts": [
                        {"text": "Look at this."},
                        {"inlineData": {"mime_type": "image/png", "data": "iVBO"}},
                    ],
                },
                {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {"id": "c1", "name": "run_shell_command", "args": {"cmd": "ls"}},
                            "thoughtSignature": "sig-1",
                        }
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "id": "c1",
                                "name": "run_shell_command",
                                "response": {"output": "a.txt"},
                            }
                        }
                    ],
                },
            ],
        },
        path="/v1beta/models/m:generateContent",
    )
    assert conv.system == "You are Gemini CLI." and conv.system_raw == SNAKE_BODY["system_instruction"]
    assert [(t.name, t.parameters) for t in conv.tools] == [
        (
            "run_shell_command",
            {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        ),
        ("googleSearch", None),
    ]
    assert conv.params == {"generation_config": {"temperature": 0}}
    user, model, result = conv.messages
    assert [type(p).__name__ for p in user.parts] == ["TextPart", "OtherPart"] and user.parts[
        1
    ].kind == "inlineData"
    [call] = model.parts
    assert (call.id, call.name, call.arguments) == (
        "c1",
        "run_shell_command",
        {"cmd": "ls"},
    ) and call.raw == SNAKE_BODY["contents"][1]["parts"][0]
    assert (result.parts[0].call_id, result.parts[0].content) == ("c1", {"output": "a.txt"})
    # the two spellings compare equal but for the raw objects of other parts and tools
    norm, norm_camel = G.normalise(conv), G.normalise(camel)
    assert norm["system"] == norm_camel["system"] and norm["tools"][0] == norm_camel["tools"][0]
    assert norm["messages"][1:] == norm_camel["messages"][1:]
    # an unchanged body renders its contents as sent; what is rendered anew is camelCase
    again = orjson.loads(G.render_request(conv))
    assert again["contents"] == SNAKE_BODY["contents"] and "systemInstruction" in again
    assert again["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "run_shell_command",
                    "description": "Run a shell command.",
                    "parametersJsonSchema": SNAKE_BODY["tools"][0]["function_declarations"][0][
                        "parameters_json_schema"
                    ],
                }
            ]
        },
        {"googleSearch": {}},
    ]
    call.arguments, call.arguments_raw = {"cmd": "pwd"}, '{"cmd":"pwd"}'
    changed = orjson.loads(G.render_request(conv))["contents"][1]
    assert changed == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"id": "c1", "name": "run_shell_command", "args": {"cmd": "pwd"}},
                "thoughtSignature": "sig-1",
            }
        ],
    }
