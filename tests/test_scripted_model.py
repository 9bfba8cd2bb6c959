"""The scripted model (gateway/scripted_model.py) and its server (docs/scripted-model.md).

The engine is driven in process (``ScriptedModel.answer``) where only the reply matters, and over
HTTP (``stack.scripted``, ``pvisor serve-model``) where the server is what is tested.
"""

from __future__ import annotations

import http.client
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.adapters.protocols.replies import Reply
from pvisor.gateway.scripted_model import ScriptedModel, load_script, parse_script
from pvisor.core.errors import BadInputError

PVISOR = Path(sys.executable).with_name("pvisor")
PROTOCOLS = ("anthropic", "openai-chat", "openai-responses", "gemini")
SHELL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
SYSTEM = "You are a coding agent."


# --------------------------------------------------------------------------- requests in the four protocols


def build_request(
    protocol: str,
    k: int,
    *,
    system: str = SYSTEM,
    tools: tuple[str, ...] = ("bash",),
    stream: bool = False,
    model: str = "req-model",
) -> tuple[str, str, bytes]:
    """(path, query, body) of a request holding ``k`` earlier assistant turns, each a text and a
    ``bash`` call answered by its result."""
    if protocol == "anthropic":
        msgs: list = [{"role": "user", "content": "Do the task."}]
        for i in range(k):
            msgs.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": f"step {i}"},
                        {
                            "type": "tool_use",
                            "id": f"toolu_{i}",
                            "name": "bash",
                            "input": {"command": f"echo {i}"},
                        },
                    ],
                }
            )
            msgs.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{i}\n"}],
                }
            )
        body = {
            "model": model,
            "max_tokens": 1024,
            "system": system,
            "messages": msgs,
            "tools": [{"name": t, "description": t, "input_schema": SHELL_SCHEMA} for t in tools],
        }
        if stream:
            body["stream"] = True
        return "/v1/messages", "", orjson.dumps(body)
    if protocol == "openai-chat":
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Do the task."}]
        for i in range(k):
            msgs.append(
                {
                    "role": "assistant",
                    "content": f"step {i}",
                    "tool_calls": [
                        {
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": orjson.dumps({"command": f"echo {i}"}).decode(),
                            },
                        }
                    ],
                }
            )
            msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"{i}\n"})
        body = {"model": model, "messages": msgs}
        if tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t, "parameters": SHELL_SCHEMA}} for t in tools
            ]
        if stream:
            body["stream"] = True
        return "/v1/chat/completions", "", orjson.dumps(body)
    if protocol == "openai-responses":
        items: list = [{"role": "user", "content": [{"type": "input_text", "text": "Do the task."}]}]
        for i in range(k):
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"step {i}"}],
                }
            )
            items.append(
                {
                    "type": "function_call",
                    "call_id": f"call_{i}",
                    "name": "bash",
                    "arguments": orjson.dumps({"command": f"echo {i}"}).decode(),
                }
            )
            items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": f"{i}\n"})
        body = {
            "model": model,
            "instructions": system,
            "input": items,
            "tools": [{"type": "function", "name": t, "parameters": SHELL_SCHEMA} for t in tools],
        }
        if stream:
            body["stream"] = True
        return "/v1/responses", "", orjson.dumps(body)
    assert protocol == "gemini"
    contents: list = [{"role": "user", "parts": [{"text": "Do the task."}]}]
    for i in range(k):
        contents.append(
            {
                "role": "model",
                "parts": [
                    {"text": f"step {i}"},
                    {"functionCall": {"name": "bash", "args": {"command": f"echo {i}"}}},
                ],
            }
        )
        contents.append(
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "bash", "response": {"output": f"{i}\n"}}}],
            }
        )
    body = {"contents": contents, "systemInstruction": {"parts": [{"text": system}]}}
    if tools:
        body["tools"] = [
            {
                "functionDeclarations": [
                    {"name": t, "description": t, "parametersJsonSchema": SHELL_SCHEMA} for t in tools
                ]
            }
        ]
    method = "streamGenerateContent" if stream else "generateContent"
    return f"/v1beta/models/{model}:{method}", "alt=sse" if stream else "", orjson.dumps(body)


def ask(model: ScriptedModel, protocol: str, k: int, **kw) -> Reply:
    path, query, body = build_request(protocol, k, **kw)
    return model.answer("POST", path, query, body)


def final_of(protocol: str, reply: Reply) -> dict:
    """The final response object of a reply (reassembled when streamed)."""
    mod = get_protocol(protocol)
    data = b"".join(reply.chunks)
    if reply.headers["Content-Type"] == "text/event-stream":
        r = mod.reassemble([data])
        assert r.complete and not r.problems, r.problems
        return r.final
    return orjson.loads(data)


def said(protocol: str, reply: Reply) -> tuple[str, list[tuple[str, dict]]]:
    """(text, [(tool, arguments)]) of a 200 reply."""
    assert reply.status == 200, reply.chunks
    action = get_protocol(protocol).response_to_action(final_of(protocol, reply))
    return action.text, [(c.name, c.arguments) for c in action.tool_calls]


def model_of(script: dict) -> ScriptedModel:
    return ScriptedModel(parse_script(script, "test script"))


def http_request(base: str, method: str, target: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers dict with lower-case names, body)."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(
            method,
            target,
            body=body,
            headers=headers or ({"Content-Type": "application/json"} if body is not None else {}),
        )
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- turn choice

TURN_SCRIPT = {
    "aux_reply": "AUX",
    "after_end": "The end.",
    "turns": [
        {"text": f"turn {i}", "tool_calls": [{"tool": "@shell", "command": f"echo {i}"}]} for i in range(3)
    ],
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_turn_is_chosen_by_assistant_messages_not_arrival(protocol, stream):
    m = model_of(TURN_SCRIPT)
    # out of order on purpose: the state of the conversation picks the turn
    for k in (2, 0, 3, 1, 0):
        text, calls = said(protocol, ask(m, protocol, k, stream=stream))
        if k < 3:
            assert (text, calls) == (f"turn {k}", [("bash", {"command": f"echo {k}"})])
        else:
            assert (text, calls) == ("The end.", [])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_auxiliary_requests_get_aux_reply_and_do_not_shift_turns(protocol):
    m = model_of(TURN_SCRIPT)
    # a request without tools before any main request is auxiliary (main_chain "tools"), and
    # does not define the main chain
    assert said(protocol, ask(m, protocol, 0, tools=())) == ("AUX", [])
    assert said(protocol, ask(m, protocol, 0)) == ("turn 0", [("bash", {"command": "echo 0"})])
    # a title request (no tools) and a background request (other system prompt, same tools)
    # race the main loop; the main loop still gets turn 1, then turn 2
    assert said(protocol, ask(m, protocol, 1, tools=())) == ("AUX", [])
    assert said(protocol, ask(m, protocol, 1, system="Extract memories from this conversation.")) == (
        "AUX",
        [],
    )
    assert said(protocol, ask(m, protocol, 1)) == ("turn 1", [("bash", {"command": "echo 1"})])
    assert said(protocol, ask(m, protocol, 2, tools=("bash", "read_file"))) == ("AUX", [])  # other tool names
    assert said(protocol, ask(m, protocol, 2)) == ("turn 2", [("bash", {"command": "echo 2"})])
    assert said(protocol, ask(m, protocol, 3)) == ("The end.", [])


def test_main_chain_first_counts_a_toolless_chat():
    m = model_of({**TURN_SCRIPT, "main_chain": "first", "turns": [{"text": "first"}, {"text": "second"}]})
    assert said("openai-chat", ask(m, "openai-chat", 0, tools=())) == ("first", [])
    assert said("openai-chat", ask(m, "openai-chat", 1, tools=())) == ("second", [])
    assert said("openai-chat", ask(m, "openai-chat", 1)) == ("AUX", [])  # the chain had no tools


def test_main_chain_any_tools_serves_several_sessions_at_once():
    # rollouts whose system prompts name their own workspaces share one server
    m = model_of({**TURN_SCRIPT, "main_chain": "any-tools"})
    assert said("anthropic", ask(m, "anthropic", 1, system="cwd: /ws-0")) == (
        "turn 1",
        [("bash", {"command": "echo 1"})],
    )
    assert said("anthropic", ask(m, "anthropic", 1, system="cwd: /ws-1")) == (
        "turn 1",
        [("bash", {"command": "echo 1"})],
    )
    assert said("anthropic", ask(m, "anthropic", 1, tools=())) == ("AUX", [])
    # under the default rule the second session would be auxiliary
    one = model_of(TURN_SCRIPT)
    ask(one, "anthropic", 1, system="cwd: /ws-0")
    assert said("anthropic", ask(one, "anthropic", 1, system="cwd: /ws-1")) == ("AUX", [])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_same_request_same_bytes(protocol, stream):
    script = {
        "seed": 5,
        "turns": [
            {"text": "a", "tool_calls": [{"tool": "@shell", "command": "ls"}]},
            {"text": "b", "reasoning": "think", "tool_calls": [{"tool": "@shell", "command": "ls"}]},
        ],
    }
    one, two = model_of(script), model_of(script)
    first = ask(one, protocol, 1, stream=stream)
    again = ask(one, protocol, 1, stream=stream)
    other_instance = ask(two, protocol, 1, stream=stream)
    assert (
        (first.status, first.headers, first.chunks)
        == (again.status, again.headers, again.chunks)
        == (other_instance.status, other_instance.headers, other_instance.chunks)
    )
    # ids come from (seed, turn): another turn or another seed gives other ids
    body = b"".join(first.chunks)
    assert b"".join(ask(one, protocol, 0, stream=stream).chunks) != body
    assert b"".join(ask(model_of({**script, "seed": 6}), protocol, 1, stream=stream).chunks) != body


def test_two_servers_with_one_script_answer_identical_bytes(stack):
    script = {
        "seed": 3,
        "turns": [
            {
                "text": "x",
                "tool_calls": [{"tool": "@shell", "command": "ls"}, {"tool": "@shell", "command": "pwd"}],
            }
        ],
    }
    urls = [stack.scripted(script), stack.scripted(script)]
    for protocol in PROTOCOLS:
        for stream in (False, True):
            path, query, body = build_request(protocol, 0, stream=stream)
            target = path + ("?" + query if query else "")
            (s1, h1, b1), (s2, h2, b2) = (http_request(u, "POST", target, body) for u in urls)
            assert s1 == s2 == 200
            assert b1 == b2 and len(b1) > 100
            h1.pop("date"), h2.pop("date")
            assert h1 == h2


def test_fixed_timestamps():
    from pvisor.adapters.protocols.openai_responses import FIXED_CREATED_AT

    a, b = (
        model_of({"seed": 1, "turns": [{"text": "t"}]}),
        model_of({"seed": 2, "turns": [{"text": "u"}, {"text": "v"}]}),
    )
    assert final_of("openai-chat", ask(a, "openai-chat", 0))["created"] == 0
    assert final_of("openai-chat", ask(b, "openai-chat", 1, stream=True))["created"] == 0
    assert final_of("openai-responses", ask(a, "openai-responses", 0))["created_at"] == FIXED_CREATED_AT
    assert (
        final_of("openai-responses", ask(b, "openai-responses", 1, stream=True))["created_at"]
        == FIXED_CREATED_AT
    )


# --------------------------------------------------------------------------- @shell and real agents' tools

#: agent request file -> (protocol, streamed, shell tool, its command property) of its main requests
AGENTS = {
    "codex-0.171.0.jsonl": ("openai-responses", True, "exec_command", "cmd"),
    "gemini-cli-0.61.0.jsonl": ("gemini", True, "run_shell_command", "command"),
    "qwen-code-0.24.4.jsonl": ("openai-chat", True, "run_shell_command", "command"),
    "opencode-1.18.33.jsonl": ("openai-chat", True, "bash", "command"),
    "mini-swe-agent-2.4.6.jsonl": ("openai-chat", False, "bash", "command"),
}
SHELL_TURN = {
    "turns": [
        {
            "text": "Running it.",
            "tool_calls": [{"tool": "@shell", "command": "echo 'hi there' > x.txt"}],
            "repeat": 10,
        }
    ]
}


def corpus_requests(corpus: Path, name: str) -> list[dict]:
    lines = (corpus / "requests" / name).read_bytes().split(b"\n")
    return [
        r for r in (orjson.loads(line) for line in lines if line.strip()) if isinstance(r.get("body"), dict)
    ]


def _query(q) -> str:
    return "&".join(f"{k}={v}" for k, v in q.items()) if isinstance(q, dict) else (q or "")


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_shell_resolves_to_each_agents_shell_tool(stack, corpus, agent):
    protocol, streamed, tool, prop = AGENTS[agent]
    requests = [r for r in corpus_requests(corpus, agent) if r["body"].get("tools")]
    first = requests[0]
    assert protocol_for_path(first["path"]).NAME == protocol
    # over HTTP: the agent's first main request, its body as sent
    url = stack.scripted(SHELL_TURN)
    query = _query(first["query"])
    status, headers, data = http_request(
        url, first["method"], first["path"] + ("?" + query if query else ""), orjson.dumps(first["body"])
    )
    assert status == 200, data
    assert headers["content-type"] == ("text/event-stream" if streamed else "application/json")
    reply = Reply(status, {"Content-Type": headers["content-type"]}, [data])
    assert said(protocol, reply) == ("Running it.", [(tool, {prop: "echo 'hi there' > x.txt"})])
    # in process: every request of the agent that carries tools (later steps, other sessions,
    # mini-swe-agent's Anthropic requests), each as the first request a fresh model sees
    for r in requests:
        mod = protocol_for_path(r["path"])
        rep = ScriptedModel(parse_script(SHELL_TURN)).answer(
            r["method"], r["path"], _query(r["query"]), orjson.dumps(r["body"])
        )
        text, calls = said(mod.NAME, rep)
        assert (text, calls) == ("Running it.", [(tool, {prop: "echo 'hi there' > x.txt"})]), (
            r.get("n", r.get("seq")),
            r["path"],
        )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shell_without_a_shell_tool_is_a_json_400(stack, protocol):
    url = stack.scripted({"turns": [{"tool_calls": [{"tool": "@shell", "command": "ls"}]}]})
    path, query, body = build_request(protocol, 0, tools=("read_file", "edit"))
    status, headers, data = http_request(url, "POST", path + ("?" + query if query else ""), body)
    assert status == 400 and headers["content-type"].startswith("application/json")
    message = orjson.loads(data)["error"]["message"]
    assert "'@shell'" in message and "no shell tool" in message and "read_file, edit" in message


# --------------------------------------------------------------------------- turn features


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_parallel_calls_named_tools_and_arguments(protocol, stream):
    m = model_of(
        {
            "turns": [
                {
                    "text": "Three at once.",
                    "tool_calls": [
                        {"tool": "@shell", "command": "cat a.txt", "arguments": {"description": "read a"}},
                        {"tool": "@shell", "command": "cat b.txt"},
                        {"tool": "read_file", "arguments": {"path": "c.txt", "limit": 5}},
                    ],
                }
            ]
        }
    )
    reply = ask(m, protocol, 0, stream=stream, tools=("bash", "read_file"))
    assert said(protocol, reply) == (
        "Three at once.",
        [
            ("bash", {"command": "cat a.txt", "description": "read a"}),
            ("bash", {"command": "cat b.txt"}),
            ("read_file", {"path": "c.txt", "limit": 5}),
        ],
    )
    calls = get_protocol(protocol).response_to_action(final_of(protocol, reply)).tool_calls
    if protocol != "gemini":  # Gemini function calls carry no id
        assert len({c.id for c in calls}) == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_repeat_and_after_end(protocol):
    m = model_of(
        {
            "after_end": "Nothing left.",
            "turns": [
                {"text": "again", "repeat": 3},
                {"text": "last", "tool_calls": [{"tool": "@shell", "command": "true"}]},
            ],
        }
    )
    got = [said(protocol, ask(m, protocol, k)) for k in range(6)]
    assert (
        got == [("again", [])] * 3 + [("last", [("bash", {"command": "true"})])] + [("Nothing left.", [])] * 2
    )
    # repeated turns are distinct replies (ids from the turn number)
    assert b"".join(ask(m, protocol, 0).chunks) != b"".join(ask(m, protocol, 1).chunks)


def test_error_turns_pass_status_and_body_through(stack):
    body_obj = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    turns = [
        {"error": {"status": 529, "body": body_obj}},
        {"error": {"status": 500, "body": "upstream exploded\n"}},
        {"error": {"status": 429}},
        {"text": "recovered"},
    ]
    for stream in (False, True):
        url = stack.scripted({"turns": turns})
        # the errors before a reply answer the retries of that reply's state, in order: the
        # same request (state 0) gets 529, 500, 429, then the reply
        path, _, body = build_request("anthropic", 0, stream=stream)
        for status, check in [
            (529, lambda d: orjson.loads(d) == body_obj),
            (500, lambda d: d == b"upstream exploded\n"),
            (429, lambda d: "error" in orjson.loads(d)),
        ]:
            st, headers, data = http_request(url, "POST", path, body)
            assert st == status and check(data), (status, stream, data)
            assert headers["content-type"] == "application/json"  # an error is never an event stream
        st, _, data = http_request(url, "POST", path, body)
        assert st == 200 and b"recovered" in data
        st, _, data = http_request(url, "POST", path, body)  # a later retry gets the reply again
        assert st == 200 and b"recovered" in data
    # the SDK sees the error as the status it carries (max_retries=0: one request)
    url = stack.scripted({"turns": turns})
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=30)
    with pytest.raises(anthropic.APIStatusError) as exc:
        client.messages.create(
            model="m",
            max_tokens=10,
            system=SYSTEM,
            messages=[{"role": "user", "content": "go"}],
            tools=[{"name": "bash", "input_schema": SHELL_SCHEMA}],
        )
    assert exc.value.status_code == 529 and exc.value.body == body_obj


def test_error_turns_belong_to_the_state_of_the_reply_they_precede(stack):
    # an SDK that retries sees the error once, then the reply: the script moves on
    url = stack.scripted(
        {
            "turns": [
                {"text": "first", "tool_calls": [{"tool": "@shell", "command": "true"}]},
                {
                    "error": {
                        "status": 529,
                        "body": {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
                    },
                    "repeat": 2,
                },
                {"text": "after the storm"},
            ]
        }
    )
    st, _, data = http_request(url, "POST", *build_request("anthropic", 0, stream=False)[::2])
    assert st == 200 and b"first" in data
    path, _, body = build_request("anthropic", 1, stream=False)
    got = [http_request(url, "POST", path, body)[0] for _ in range(3)]
    assert got == [529, 529, 200]
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=2, timeout=30)
    reply = client.messages.create(
        model="m",
        max_tokens=10,
        system=SYSTEM,
        messages=[{"role": "user", "content": "go"}],
        tools=[{"name": "bash", "input_schema": SHELL_SCHEMA}],
    )
    assert reply.content[0].text == "first"  # state 0 owes no error


def test_delayed_turn_arrives(stack):
    url = stack.scripted({"turns": [{"text": "slow but sure", "delay_ms": 30}]})
    for protocol in ("anthropic", "gemini"):
        for stream in (False, True):
            path, query, body = build_request(protocol, 0, stream=stream)
            st, headers, data = http_request(url, "POST", path + ("?" + query if query else ""), body)
            assert st == 200 and said(
                protocol, Reply(st, {"Content-Type": headers["content-type"]}, [data])
            ) == ("slow but sure", [])


def test_chunk_events_changes_chunking_not_bytes():
    one = ask(model_of({"turns": [{"text": "x" * 500}]}), "anthropic", 0, stream=True)
    three = ask(model_of({"chunk_events": 3, "turns": [{"text": "x" * 500}]}), "anthropic", 0, stream=True)
    assert b"".join(one.chunks) == b"".join(three.chunks)
    assert len(one.chunks) > len(three.chunks) > 1


# --------------------------------------------------------------------------- other paths


def test_models_head_root_count_tokens_and_404(stack):
    url = stack.scripted({"model": "scripted-1", "turns": [{"text": "hi"}]})
    st, headers, data = http_request(url, "HEAD", "/")
    assert st == 200 and data == b""
    st, _, data = http_request(url, "GET", "/")
    assert st == 200 and data
    for path in ("/v1/models", "/v1beta/models"):
        st, _, data = http_request(url, "GET", path)
        listing = orjson.loads(data)
        assert (
            st == 200
            and listing["data"][0]["id"] == "scripted-1"
            and listing["models"][0]["name"] == "models/scripted-1"
        )
    assert [m.id for m in anthropic.Anthropic(base_url=url, api_key="k", max_retries=0).models.list()] == [
        "scripted-1"
    ]
    assert [m.id for m in openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0).models.list()] == [
        "scripted-1"
    ]
    g = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=url))
    assert [m.name for m in g.models.list()] == ["models/scripted-1"]
    # count_tokens: an estimate of body length / 4
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "count these words please"}]})
    st, _, data = http_request(url, "POST", "/v1/messages/count_tokens", body)
    assert st == 200 and orjson.loads(data) == {"input_tokens": len(body) // 4}
    body = orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "count these words please"}]}]})
    st, _, data = http_request(url, "POST", "/v1beta/models/g:countTokens", body)
    assert st == 200 and orjson.loads(data) == {"totalTokens": len(body) // 4}
    assert (
        anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        .messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}])
        .input_tokens
        > 0
    )
    assert g.models.count_tokens(model="g", contents="hello").total_tokens > 0
    # count_tokens is not a step: the next main request still gets turn 0
    path, _, body = build_request("anthropic", 0)
    assert b'"hi"' in http_request(url, "POST", path, body)[2]
    st, _, data = http_request(url, "POST", "/v2/whatever", b"{}")
    assert st == 404 and "/v2/whatever" in orjson.loads(data)["error"]["message"]
    st, _, data = http_request(url, "POST", "/v1/messages", b"{not json")
    assert st == 400 and "not valid JSON" in orjson.loads(data)["error"]["message"]


# --------------------------------------------------------------------------- scripts


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("unknown.json", b'{"turns": [], "temperature": 1}', ["unknown field(s) temperature"]),
        (
            "unknown_turn.json",
            b'{"turns": [{"text": "a", "txt": "b"}]}',
            ["turns[0]", "unknown field(s) txt"],
        ),
        (
            "unknown_call.json",
            b'{"turns": [{"tool_calls": [{"tool": "bash", "cmd": "ls"}]}]}',
            ["turns[0].tool_calls[0]", "unknown field(s) cmd"],
        ),
        ("no_turns.json", b'{"model": "m"}', ["'turns' must be a list"]),
        ("seed.json", b'{"seed": "1", "turns": []}', ["'seed' must be an integer"]),
        ("bool_seed.json", b'{"seed": true, "turns": []}', ["'seed'"]),
        ("text.json", b'{"turns": [{"text": 5}]}', ["turns[0].text", "expected a string"]),
        ("repeat.json", b'{"turns": [{"text": "a", "repeat": 0}]}', ["turns[0].repeat"]),
        ("delay.json", b'{"turns": [{"text": "a", "delay_ms": -1}]}', ["turns[0].delay_ms"]),
        (
            "calls.json",
            b'{"turns": [{"tool_calls": {"tool": "bash"}}]}',
            ["turns[0].tool_calls", "expected a list"],
        ),
        (
            "args.json",
            b'{"turns": [{"tool_calls": [{"tool": "bash", "arguments": [1]}]}]}',
            ["turns[0].tool_calls[0].arguments"],
        ),
        (
            "shell.json",
            b'{"turns": [{"tool_calls": [{"tool": "@shell"}]}]}',
            ["turns[0].tool_calls[0]", "'@shell' needs a 'command'"],
        ),
        ("error.json", b'{"turns": [{"error": {"status": 200}}]}', ["turns[0].error", "400..599"]),
        (
            "error_body.json",
            b'{"turns": [{"error": {"status": 500, "body": 5}}]}',
            ["turns[0].error", "body"],
        ),
        (
            "error_key.json",
            b'{"turns": [{"error": {"status": 500, "message": "x"}}]}',
            ["turns[0].error", "message"],
        ),
        ("chain.json", b'{"main_chain": "all", "turns": []}', ["main_chain"]),
        ("chunks.json", b'{"chunk_events": 0, "turns": []}', ["chunk_events"]),
        ("list.json", b'[{"text": "a"}]', ["expected an object"]),
        ("broken.json", b'{"turns": [', ["not valid JSON"]),
        ("broken.toml", b"turns = [\n", ["not valid TOML"]),
        ("latin1.toml", b'model = "\xe9"\nturns = []\n', ["not valid TOML"]),
        ("types.toml", b'seed = 1.5\n[[turns]]\ntext = "a"\n', ["'seed'"]),
    ],
)
def test_bad_scripts_name_file_and_field(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(BadInputError) as exc:
        load_script(path)
    message = exc.value.message
    assert str(path) in message
    for w in words:
        assert w in message, message
    assert exc.value.exit_code == 65


def test_documented_example_script_behaves_as_documented():
    import re

    doc = Path(__file__).resolve().parents[1] / "docs" / "scripted-model.md"
    example = re.findall(r"```json\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)[0]
    m = ScriptedModel(parse_script(orjson.loads(example), "docs/scripted-model.md"))
    got = []
    # state 2 is asked twice: the 529, then the client's retry gets the reply
    for k in (0, 1, 2, 2, 3, 4, 5, 6):
        reply = ask(m, "anthropic", k)
        got.append(
            (reply.status, reply.delay_s)
            if reply.status != 200
            else (said("anthropic", reply), reply.delay_s)
        )
    assert got == [
        (("Let me look.", [("bash", {"command": "ls -la"})]), 0),
        (("Two at once.", [("bash", {"command": "cat a.txt"}), ("bash", {"command": "cat b.txt"})]), 0),
        (529, 0),
        (("Thinking done.", []), 0.05),
        (("Still here.", []), 0),
        (("Still here.", []), 0),
        (("All done.", []), 0),
        (("Done.", []), 0),
    ]
    assert said("anthropic", ask(m, "anthropic", 0, tools=())) == ("OK", [])


def test_missing_script_file(tmp_path):
    with pytest.raises(BadInputError, match="cannot read script .*nope.json"):
        load_script(tmp_path / "nope.json")


def test_toml_script_works(tmp_path):
    path = tmp_path / "turns.toml"
    path.write_text(
        'model = "toml-model"\nseed = 9\naux_reply = "aux"\n\n'
        '[[turns]]\ntext = "Listing."\n[[turns.tool_calls]]\ntool = "@shell"\ncommand = "ls -la"\n\n'
        '[[turns]]\ntext = "Done."\nrepeat = 2\n',
        encoding="utf-8",
    )
    script = load_script(path)
    assert (script.model, script.seed, script.aux_reply, len(script.turns)) == ("toml-model", 9, "aux", 2)
    as_json = parse_script(
        {
            "model": "toml-model",
            "seed": 9,
            "aux_reply": "aux",
            "turns": [
                {"text": "Listing.", "tool_calls": [{"tool": "@shell", "command": "ls -la"}]},
                {"text": "Done.", "repeat": 2},
            ],
        }
    )
    for k in range(4):
        a, b = ask(ScriptedModel(script), "anthropic", k), ask(ScriptedModel(as_json), "anthropic", k)
        assert a.chunks == b.chunks
    assert said("anthropic", ask(ScriptedModel(script), "anthropic", 0)) == (
        "Listing.",
        [("bash", {"command": "ls -la"})],
    )


def test_serve_model_bad_script_exits_65(tmp_path):
    for name, content in (
        ("bad.json", b'{"turns": [{"text": "a", "colour": "red"}]}'),
        ("bad.toml", b"turns = "),
    ):
        path = tmp_path / name
        path.write_bytes(content)
        proc = subprocess.run(
            [str(PVISOR), "serve-model", "--script", str(path), "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 65, proc.stderr
        assert proc.stderr.startswith("pvisor: error:") and str(path) in proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert (
        "colour"
        in subprocess.run(
            [str(PVISOR), "serve-model", "--script", str(tmp_path / "bad.json")],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        ).stderr
    )


def test_serve_model_beyond_this_machine_needs_allow_remote(tmp_path):
    """``serve-model --host 0.0.0.0`` listened on every address with no further flag, where the
    gateway needs ``--allow-remote`` (issue 35 item 14): refused in one line, exit 2, before the
    script is read, by the gateway's own rule. With ``--allow-remote`` it goes on to listen; shown
    without opening anything beyond loopback: every try uses a port a loopback socket holds, so
    the bind fails (exit 69), which only a command past the refusal reaches."""
    script = tmp_path / "s.json"
    script.write_bytes(orjson.dumps({"turns": [{"text": "hi"}]}))

    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(PVISOR), "serve-model", "--script", str(script), *args],
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    held = socket.socket()  # every try below binds its port: none can listen beyond loopback, even unfixed
    try:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        for host in ("0.0.0.0", "::", "example.org"):
            proc = serve("--host", host, "--port", port)
            assert proc.returncode == 2 and proc.stdout == "", (host, proc.stderr)
            assert proc.stderr.startswith(f"pvisor: error: --host {host} listens beyond this machine: ")
            assert proc.stderr.count("\n") == 1 and "add --allow-remote" in proc.stderr
        proc = serve("--host", "0.0.0.0", "--port", port, "--allow-remote")
        assert proc.returncode == 69 and f"cannot listen on 0.0.0.0:{port}" in proc.stderr, proc.stderr
    finally:
        held.close()


def _read_line(proc: subprocess.Popen, deadline: float) -> str:
    """One line of the child's stdout, failing at ``deadline`` (never blocks past it)."""
    buf = b""
    fd = proc.stdout.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no line from {proc.args} in time; got {buf!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            data = os.read(fd, 1)
            assert data, f"{proc.args} closed stdout; exit {proc.poll()}; got {buf!r}"
            buf += data
    return buf.decode()


def test_serve_model_subprocess_serves_and_stops_on_sigterm(tmp_path):
    script = tmp_path / "s.json"
    script.write_bytes(
        orjson.dumps(
            {
                "model": "sub-model",
                "turns": [{"text": "from a subprocess", "tool_calls": [{"tool": "@shell", "command": "ls"}]}],
            }
        )
    )
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [str(PVISOR), "serve-model", "--script", str(script), "--port", "0", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        line = _read_line(proc, time.monotonic() + 30)
        assert line.startswith("listening http://127.0.0.1:"), line
        url = line.split()[1]
        port = int(url.rsplit(":", 1)[1])
        assert port > 0
        assert orjson.loads(ready.read_bytes())["url"] == url
        for stream in (False, True):
            path, _, body = build_request("anthropic", 0, stream=stream)
            st, headers, data = http_request(url, "POST", path, body)
            assert said("anthropic", Reply(st, {"Content-Type": headers["content-type"]}, [data])) == (
                "from a subprocess",
                [("bash", {"command": "ls"})],
            )
        st, _, data = http_request(url, "GET", "/v1/models")
        assert b"sub-model" in data
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read().decode()
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_serve_model_on_ipv6_loopback_says_its_url_with_brackets(tmp_path):
    """``serve-model --host ::1`` printed ``listening http://::1:PORT`` and wrote it to
    --ready-file, a URL no client parses; the gateway said ``http://[::1]:PORT``. Both make it
    with gateway/access.py listen_url, and the URL answers."""
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        from conftest import cannot_run_here

        cannot_run_here("no IPv6 loopback address (::1) here")
    script = tmp_path / "s.json"
    script.write_bytes(orjson.dumps({"model": "six", "turns": [{"text": "hi"}]}))
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [str(PVISOR), "serve-model", "--script", str(script), "--host", "::1", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        line = _read_line(proc, time.monotonic() + 30)
        assert line.startswith("listening http://[::1]:"), line
        url = line.split()[1]
        assert orjson.loads(ready.read_bytes())["url"] == url
        assert b"six" in http_request(url, "GET", "/v1/models")[2]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# --------------------------------------------------------------------------- bodies the server must survive


def test_head_root_through_the_gateway_has_no_body(stack):
    """Claude Code's ``HEAD /`` through the gateway: the scripted server sends the headers
    (Content-Length kept) and no body, so the gateway's client reads a clean response."""
    url = stack.scripted({"turns": [{"text": "hi"}]})
    direct = http_request(url, "GET", "/")
    gw = stack.gateway(upstreams={"anthropic": url})
    u = urlsplit(gw.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("HEAD", "/", headers={"User-Agent": "claude-cli/2.0.0 (external, cli)"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("Content-Length") == str(len(direct[2])) and resp.read() == b""
        # the connection is still usable: nothing stray followed the HEAD response
        path, _, body = build_request("anthropic", 0)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and b'"hi"' in resp.read()
    finally:
        conn.close()
    exs = stack.exchanges(gw)
    assert [(e.method, e.path, e.status, e.outcome) for e in exs] == [
        ("HEAD", "/", 200, "ok"),
        ("POST", "/v1/messages", 200, "ok"),
    ]


def test_request_body_over_one_mib_is_answered(stack):
    url = stack.scripted({"turns": [{"text": "read it all"}]})
    path, _, _ = build_request("anthropic", 0)
    big = {
        "model": "m",
        "max_tokens": 10,
        "system": SYSTEM,
        "tools": [{"name": "bash", "input_schema": SHELL_SCHEMA}],
        "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}],
    }
    body = orjson.dumps(big)
    assert len(body) > 3 * 1024 * 1024
    st, headers, data = http_request(url, "POST", path, body)
    assert st == 200, data[:300]
    assert said("anthropic", Reply(st, {"Content-Type": headers["content-type"]}, [data])) == (
        "read it all",
        [],
    )


WRONG_TYPES = [
    # (path, body, words in the error message)
    ("/v1/messages", {"tools": [{"name": 5}], "messages": []}, ["Anthropic Messages", "tool 0"]),
    ("/v1/messages", {"system": [{"type": "text", "text": 5}], "messages": []}, ["Anthropic Messages"]),
    (
        "/v1/chat/completions",
        {"tools": [{"type": "function", "function": {"name": 5}}], "messages": []},
        ["OpenAI Chat Completions", "tool 0"],
    ),
    (
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": [1], "text": "x"}]}]},
        ["OpenAI Responses"],
    ),
]


@pytest.mark.parametrize(
    "path,body,words", WRONG_TYPES, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(WRONG_TYPES)]
)
def test_valid_json_of_wrong_types_is_a_400_in_the_protocols_shape(stack, path, body, words):
    url = stack.scripted({"turns": [{"text": "a", "tool_calls": [{"tool": "@shell", "command": "ls"}]}]})
    st, headers, data = http_request(url, "POST", path, orjson.dumps(body))
    assert st == 400 and headers["content-type"].startswith("application/json"), data
    assert data == protocol_for_path(path).error_body(400, orjson.loads(data)["error"]["message"])
    message = orjson.loads(data)["error"]["message"]
    for w in words:
        assert w in message, message


@pytest.mark.parametrize(
    "encoding,body",
    [("gzip", b"\x1f\x8b\x08\x00\x00\x00\x00\x00 not gzip at all"), ("deflate", b"not deflate")],
)
def test_undecodable_request_body_is_a_400(stack, encoding, body):
    url = stack.scripted({"turns": [{"text": "a"}]})
    st, headers, data = http_request(
        url, "POST", "/v1/messages", body, {"Content-Type": "application/json", "Content-Encoding": encoding}
    )
    assert st == 400 and headers["content-type"].startswith("application/json")
    assert f"Content-Encoding '{encoding}'" in orjson.loads(data)["error"]["message"]
    # the server goes on serving
    path, _, ok = build_request("anthropic", 0)
    assert http_request(url, "POST", path, ok)[0] == 200


def test_non_utf8_body_is_named_as_such(stack):
    url = stack.scripted({"turns": [{"text": "a"}]})
    st, _, data = http_request(url, "POST", "/v1/chat/completions", b'{"messages": "\xff\xfe"}')
    message = orjson.loads(data)["error"]["message"]
    assert st == 400 and "not valid UTF-8 JSON" in message and "surrogates" not in message, message


# ---------------------------------------------------------------------- wrong types anywhere (property test)

VALUES = [5, -1, 2.5, True, None, [], [1, "x"], {}, {"x": 1}, "text", [[]], {"type": 5}]


def _paths(obj, prefix=()):
    """Every (key or index) path into a JSON value."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


def _replaced(obj, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {k: (_replaced(v, rest, value) if k == head else v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [(_replaced(v, rest, value) if i == head else v) for i, v in enumerate(obj)]
    return obj  # an earlier replacement in this variant removed the path


def _variants(body: dict, rng, n: int):
    """``n`` copies of ``body`` with 1 to 3 values replaced at random paths. Half of the picks
    come from the first four levels, where the fields every protocol reads are."""
    paths = _paths(body)
    shallow = [p for p in paths if len(p) <= 4]
    for _ in range(n):
        b = body
        for _ in range(rng.randint(1, 3)):
            pool = shallow if shallow and rng.random() < 0.5 else paths
            b = _replaced(b, rng.choice(pool), rng.choice(VALUES))
        yield b


def _corpus_by_protocol(corpus: Path) -> dict[str, list[tuple[str, str, dict]]]:
    out: dict[str, list] = {p: [] for p in PROTOCOLS}
    for f in sorted((corpus / "requests").glob("*.jsonl")):
        for r in corpus_requests(corpus, f.name):
            mod = protocol_for_path(r["path"])
            if mod is not None and not r["path"].endswith(("count_tokens", ":countTokens")):
                out[mod.NAME].append((r["path"], _query(r["query"]), r["body"]))
    for p in PROTOCOLS:  # and the requests the tests build, with tool calls and results
        path, query, body = build_request(p, 2)
        out[p].append((path, query, orjson.loads(body)))
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_types_anywhere_parse_or_raise_bad_input(corpus, protocol):
    """Real requests with values replaced by ints, lists, nulls, dicts (seeded): each
    parse_request either parses or raises BadInputError, and the scripted model either answers
    or raises BadInputError (a 400), never anything else (a 500 with a traceback)."""
    import random

    requests = _corpus_by_protocol(corpus)[protocol]
    assert requests, protocol
    mod = get_protocol(protocol)
    rng = random.Random(20261129)
    script = {"turns": [{"text": "t", "tool_calls": [{"tool": "@shell", "command": "ls"}], "repeat": 3}]}
    outcomes = {"parsed": 0, "bad_input": 0}
    per_request = max(40, 600 // len(requests))
    for path, query, body in requests:
        for variant in _variants(body, rng, per_request):
            raw = orjson.dumps(variant)
            try:
                mod.parse_request(variant, path=path, query=query)
                mod.parse_request(raw, path=path, query=query)
                outcomes["parsed"] += 1
            except BadInputError as exc:
                assert exc.exit_code == 65
                outcomes["bad_input"] += 1
            try:
                reply = ScriptedModel(parse_script(script)).answer("POST", path, query, raw)
                assert isinstance(reply, Reply)
            except BadInputError:
                pass
    # both sides were exercised: the test is not vacuous
    assert sum(outcomes.values()) == per_request * len(requests)
    # not vacuous: many variants still parse; and all but Gemini (which reads anything
    # tolerantly, see test_protocol_gemini.py) refuse some
    assert outcomes["parsed"] > 50 and (protocol == "gemini" or outcomes["bad_input"] > 10), outcomes


# --------------------------------------------------------------------------- huge repeat


def test_repeat_counts_pick_turns_at_their_boundaries():
    # (a repeat of 10**12 runs in a memory-limited process below: here, if turns were ever
    # expanded into a list again, it would exhaust the test machine's memory)
    n = 10**6
    m = model_of({"turns": [{"text": "a", "repeat": n}, {"text": "b", "repeat": 2}, {"text": "c"}]})
    assert [m.turn_at(k).text for k in (0, 1, n - 1, n, n + 1, n + 2)] == ["a", "a", "a", "b", "b", "c"]
    assert m.turn_at(n + 3) is None and m.turn_at(10**15) is None
    assert said("anthropic", ask(m, "anthropic", 3)) == ("a", [])


def test_serve_model_with_huge_repeat_runs_in_bounded_memory(tmp_path):
    """``repeat: 10**12`` under a 2 GiB address-space limit: the server starts and answers (a
    list of 10**12 turns would need terabytes)."""
    script = tmp_path / "huge.json"
    script.write_bytes(
        orjson.dumps({"turns": [{"text": "again and again", "repeat": 10**12}, {"text": "never reached"}]})
    )
    limit = 2 * 1024**3
    wrapper = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
        "os.execv(sys.executable, [sys.executable, '-m', 'pvisor'] + sys.argv[1:])" % (limit, limit)
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, "serve-model", "--script", str(script), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    try:
        line = _read_line(proc, time.monotonic() + 30)
        url = line.split()[1]
        for k in (0, 5):
            path, _, body = build_request("anthropic", k)
            st, headers, data = http_request(url, "POST", path, body)
            assert said("anthropic", Reply(st, {"Content-Type": headers["content-type"]}, [data])) == (
                "again and again",
                [],
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# --------------------------------------------------------------------------- stopping serve-model


def _serve_model(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(PVISOR), "serve-model", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stderr_line(proc: subprocess.Popen, prefix: bytes, deadline: float) -> bytes:
    """Read the child's stderr until a line starting with ``prefix`` (deadline)."""
    buf = b""
    fd = proc.stderr.fileno()
    while True:
        for line in buf.split(b"\n")[:-1]:
            if line.startswith(prefix):
                return line
        left = deadline - time.monotonic()
        assert left > 0, f"no stderr line starting {prefix!r}; got {buf!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            data = os.read(fd, 65536)
            assert data, f"stderr closed; exit {proc.poll()}; got {buf!r}"
            buf += data


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["SIGINT", "SIGTERM"])
def test_serve_model_second_signal_cancels_a_reply_in_flight(tmp_path, sig, code):
    """A reply in flight that cannot finish (a 20 MB stream to a client that stopped reading
    fills the socket buffers, so the server waits to write), and a grace period far past the
    deadline: the first signal waits, the second ends it at once. Exit 130 on SIGINT, 0 on
    SIGTERM."""
    script = tmp_path / "long.json"
    script.write_bytes(orjson.dumps({"turns": [{"text": "y" * (8 * 1024 * 1024)}]}))
    proc = _serve_model(["--script", str(script), "--port", "0", "--shutdown-grace", "3600"])
    try:
        url = _read_line(proc, time.monotonic() + 30).split()[1]
        u = urlsplit(url)
        path, _, body = build_request("anthropic", 0, stream=True)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(30)
        s.connect((u.hostname, u.port))
        try:
            s.sendall(
                b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
            )
            got = b""
            while b"content_block_delta" not in got:  # the stream has started: the reply is in flight
                data = s.recv(4096)
                assert data, got
                got += data
            proc.send_signal(sig)
            _stderr_line(proc, b"stopping: waiting for 1 exchange(s) in flight", time.monotonic() + 30)
            proc.send_signal(sig)
            _stderr_line(proc, b"stopping now: cancelling", time.monotonic() + 30)
            assert proc.wait(timeout=30) == code
        finally:
            s.close()
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_serve_model_idle_sigint_exits_130(tmp_path):
    script = tmp_path / "s.json"
    script.write_bytes(orjson.dumps({"turns": [{"text": "t"}]}))
    proc = _serve_model(["--script", str(script), "--port", "0"])
    try:
        _read_line(proc, time.monotonic() + 30)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_serve_model_unwritable_ready_file_is_a_usage_error(tmp_path):
    script = tmp_path / "s.json"
    script.write_bytes(orjson.dumps({"turns": [{"text": "t"}]}))
    proc = subprocess.run(
        [
            str(PVISOR),
            "serve-model",
            "--script",
            str(script),
            "--port",
            "0",
            "--ready-file",
            "/nonexistent-pvisor-dir/r.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr == "pvisor: error: cannot write --ready-file /nonexistent-pvisor-dir/r.json: "
        "directory /nonexistent-pvisor-dir does not exist\n"
    )
    assert proc.stdout == ""
    (tmp_path / "afile").write_text("")
    proc = subprocess.run(
        [str(PVISOR), "serve-model", "--script", str(script), "--port", "0", "--ready-file",
         str(tmp_path / "afile" / "r.json")],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"pvisor: error: cannot write --ready-file {tmp_path}/afile/r.json: {tmp_path}/afile is not a "
        "directory\n"
    )


# --------------------------------------------------------------------------- usage and compaction

USAGE_PATHS = {
    "anthropic": ("input_tokens", "output_tokens"),
    "openai-chat": ("prompt_tokens", "completion_tokens"),
    "openai-responses": ("input_tokens", "output_tokens"),
    "gemini": ("promptTokenCount", "candidatesTokenCount"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_turn_usage_is_reported_in_each_protocols_shape(protocol, stream):
    m = model_of(
        {
            "turns": [
                {"text": "big", "usage": {"input_tokens": 150_000, "output_tokens": 42}},
                {"text": "plain"},
            ]
        }
    )
    final = final_of(protocol, ask(m, protocol, 0, stream=stream))
    usage = final["usage"] if protocol != "gemini" else final["usageMetadata"]
    i, o = USAGE_PATHS[protocol]
    assert (usage[i], usage[o]) == (150_000, 42)
    # a turn without usage reports none of these counts (or zeros where the protocol requires usage)
    plain = final_of(protocol, ask(m, protocol, 1, stream=stream))
    other = plain.get("usage") if protocol != "gemini" else plain.get("usageMetadata")
    assert not other or not any(other.get(k) for k in (i, o)), other


COMPACTION_SCRIPT = {
    "turns": [
        {"text": f"turn {i}", "tool_calls": [{"tool": "@shell", "command": f"echo {i}"}]} for i in range(4)
    ],
    "compaction": {
        "when": ["Summarise the conversation"],
        "summary": "We echoed numbers.",
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "agent_messages": ["Got it."],
    },
}


def _anthropic(messages: list, system: str = SYSTEM, tools: tuple[str, ...] = ("bash",)) -> bytes:
    return orjson.dumps(
        {
            "model": "m",
            "max_tokens": 10,
            "system": system,
            "messages": messages,
            "tools": [{"name": t, "description": t, "input_schema": SHELL_SCHEMA} for t in tools],
        }
    )


def test_summary_request_gets_the_summary_and_a_marker_and_later_turns_go_on():
    m = model_of(COMPACTION_SCRIPT)
    _, _, body = build_request("anthropic", 2)
    history = orjson.loads(body)["messages"]
    assert said("anthropic", ask(m, "anthropic", 2)) == ("turn 2", [("bash", {"command": "echo 2"})])
    # the agent asks for a summary: same history plus its summary prompt, here without tools and
    # with another system prompt (as Claude Code does); the rule comes before the main chain's
    summary_req = [*history, {"role": "user", "content": "Summarise the conversation so far."}]
    reply = m.answer("POST", "/v1/messages", "", _anthropic(summary_req, system="You summarise.", tools=()))
    assert reply.kind == "summary"
    text, calls = said("anthropic", reply)
    assert text == "We echoed numbers.\n\n[pvisor scripted summary of 2 turns]" and calls == []
    assert final_of("anthropic", reply)["usage"]["input_tokens"] == 10
    # after the compaction the agent's history is the summary: the turn is still the third
    after = [{"role": "user", "content": f"This session continues. {text}"}]
    assert said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(after))) == (
        "turn 2",
        [("bash", {"command": "echo 2"})],
    )
    # and the turns go on from it; the agent's own acknowledgement is no turn
    later = [
        *after,
        {"role": "assistant", "content": "Got it."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t2", "name": "bash", "input": {"command": "echo 2"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "2"}]},
    ]
    assert said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(later))) == (
        "turn 3",
        [("bash", {"command": "echo 3"})],
    )
    # a second compaction summarises from the state the first marker gives
    second = [*later, {"role": "user", "content": "Summarise the conversation again."}]
    text2, _ = said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(second)))
    assert text2.endswith("[pvisor scripted summary of 3 turns]")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_summary_rule_applies_in_every_protocol(protocol):
    m = model_of(COMPACTION_SCRIPT)
    path, query, body = build_request(protocol, 1)
    obj = orjson.loads(body)
    ask_text = "Please Summarise the conversation."
    if protocol in ("anthropic", "openai-chat"):
        obj["messages"].append({"role": "user", "content": ask_text})
    elif protocol == "openai-responses":
        obj["input"].append({"role": "user", "content": [{"type": "input_text", "text": ask_text}]})
    else:
        obj["contents"].append({"role": "user", "parts": [{"text": ask_text}]})
    text, _ = said(protocol, m.answer("POST", path, query, orjson.dumps(obj)))
    assert text.endswith("[pvisor scripted summary of 1 turns]")


def test_without_a_compaction_rule_a_summary_request_is_ordinary_and_a_marker_still_counts():
    # the marker is read whatever the script (it can only come from a summary reply); what the
    # rule adds is recognising the summary request
    m = model_of({k: v for k, v in COMPACTION_SCRIPT.items() if k != "compaction"})
    after = [{"role": "user", "content": "[pvisor scripted summary of 2 turns]"}]
    assert said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(after)))[0] == "turn 2"
    asked = [{"role": "user", "content": "Summarise the conversation"}]
    assert said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(asked)))[0] == "turn 0"


@pytest.mark.parametrize(
    "content, words",
    [
        (
            {"turns": [{"text": "a", "usage": {"input_tokens": 1}}]},
            ["turns[0].usage", "missing output_tokens"],
        ),
        (
            {"turns": [{"text": "a", "usage": {"input_tokens": 1, "output_tokens": 2, "cached": 3}}]},
            ["turns[0].usage", "unknown field(s) cached"],
        ),
        ({"turns": [{"text": "a", "usage": {"input_tokens": -1, "output_tokens": 1}}]}, ["turns[0].usage"]),
        ({"turns": [{"text": "a", "usage": {"input_tokens": True, "output_tokens": 1}}]}, ["turns[0].usage"]),
        ({"turns": [], "compaction": {"summary": "x"}}, ["compaction.when", "at least one"]),
        ({"turns": [], "compaction": {"when": "x"}}, ["compaction.when", "list of non-empty texts"]),
        (
            {"turns": [], "compaction": {"when": ["x"], "reply": "y"}},
            ["compaction", "unknown field(s) reply"],
        ),
        ({"turns": [], "compaction": {"when": ["x"], "agent_messages": [""]}}, ["compaction.agent_messages"]),
        (
            {
                "turns": [],
                "compaction": {"when": ["x"], "usage": {"input_tokens": 1, "output_tokens": 2, "total": 3}},
            },
            ["compaction.usage"],
        ),
        ({"turns": [], "compaction": ["x"]}, ["compaction", "expected an object"]),
    ],
)
def test_bad_usage_and_compaction_name_the_field(content, words):
    with pytest.raises(BadInputError) as exc:
        parse_script(content, "s.json")
    for w in words:
        assert w in exc.value.message, exc.value.message


def test_documented_subagent_turns_answer_a_subagents_own_loop_by_its_state():
    import re

    doc = Path(__file__).resolve().parents[1] / "docs" / "scripted-model.md"
    example = re.findall(r"```json\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)[1]
    m = ScriptedModel(parse_script(orjson.loads(example), "docs/scripted-model.md"))
    assert said("anthropic", ask(m, "anthropic", 0, tools=("bash", "Agent")))[1][0][0] == "Agent"
    # the subagent: another system prompt and tools; its own state picks its turn
    sub = {"system": "You are a subagent.", "tools": ("bash",)}
    assert said("anthropic", ask(m, "anthropic", 0, **sub)) == (
        "",
        [("bash", {"command": "echo sub-step-1 > sub.txt; cat sub.txt"})],
    )
    assert said("anthropic", ask(m, "anthropic", 1, **sub)) == ("Wrote sub.txt.", [])
    assert said("anthropic", ask(m, "anthropic", 2, **sub)) == ("OK", [])
    # a request off the main chain without tools keeps aux_reply; the main loop its own turns
    assert said("anthropic", ask(m, "anthropic", 0, system="Write a title.", tools=())) == ("OK", [])
    assert said("anthropic", ask(m, "anthropic", 1, tools=("bash", "Agent"))) == ("Done.", [])
    with pytest.raises(BadInputError, match="'subagent_turns' take no 'error'"):
        parse_script({"turns": [], "subagent_turns": [{"error": {"status": 500}}]})


def test_documented_compaction_example_behaves_as_documented(tmp_path):
    import re

    doc = Path(__file__).resolve().parents[1] / "docs" / "scripted-model.md"
    [example] = re.findall(r"```toml\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.DOTALL)
    (tmp_path / "s.toml").write_text(example)
    m = ScriptedModel(load_script(tmp_path / "s.toml"))
    assert final_of("anthropic", ask(m, "anthropic", 1))["usage"]["input_tokens"] == 190000
    _, _, body = build_request("anthropic", 2)
    asking = [
        *orjson.loads(body)["messages"],
        {"role": "user", "content": "Write a summary of the conversation so far."},
    ]
    summary, _ = said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(asking, tools=())))
    assert summary == "We listed the files twice.\n\n[pvisor scripted summary of 2 turns]"
    after = [{"role": "user", "content": summary}]
    assert said("anthropic", m.answer("POST", "/v1/messages", "", _anthropic(after))) == ("Done.", [])


def test_a_summary_request_holding_the_history_as_text_counts_its_serialised_replies():
    # OpenCode writes the conversation into one user message; a later compaction serialises only
    # what came after the previous summary, which it quotes after it
    m = model_of(
        {
            **COMPACTION_SCRIPT,
            "compaction": {**COMPACTION_SCRIPT["compaction"], "serialized_assistant": "\n\n[Assistant]:"},
        }
    )
    first = (
        'Summarise the conversation:\n<conversation>\n[User]: "Do it."\n\n'
        "[Assistant]: turn 0\n[Assistant tool call]: bash({})\n[Tool result]: 0\n\n"
        "[Assistant]: turn 1\n[Assistant tool call]: bash({})\n[Tool result]: 1\n</conversation>"
    )
    text, _ = said(
        "openai-chat",
        m.answer(
            "POST",
            "/v1/chat/completions",
            "",
            orjson.dumps(
                {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": "You summarise."},
                        {"role": "user", "content": first},
                    ],
                }
            ),
        ),
    )
    assert text.endswith("[pvisor scripted summary of 2 turns]")
    second = (
        "Summarise the conversation:\n<conversation>\n[User]: Continue.\n\n"
        "[Assistant]: turn 2\n[Tool result]: 2\n</conversation>\n"
        f"<prior-summary>\n{text}\n</prior-summary>"
    )
    text2, _ = said(
        "openai-chat",
        m.answer(
            "POST",
            "/v1/chat/completions",
            "",
            orjson.dumps(
                {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": "You summarise."},
                        {"role": "user", "content": second},
                    ],
                }
            ),
        ),
    )
    assert text2.endswith("[pvisor scripted summary of 3 turns]")
    # without the field the same request counts no turn
    plain = model_of(COMPACTION_SCRIPT)
    text3, _ = said(
        "openai-chat",
        plain.answer(
            "POST",
            "/v1/chat/completions",
            "",
            orjson.dumps(
                {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": "You summarise."},
                        {"role": "user", "content": first},
                    ],
                }
            ),
        ),
    )
    assert text3.endswith("[pvisor scripted summary of 0 turns]")
