"""The official SDKs (anthropic, openai Chat Completions and Responses, google-genai) against the
scripted model server, once directly and once through the capture gateway.

Per (protocol, stream, turn kind):
- what the SDK returns (the final object, or the list of events it yields) is identical both ways;
- the same request body sent raw (http.client: de-chunked, no decompression) gets the same status,
  the same body bytes and the same headers except hop-by-hop ones and ``Date``;
- the journal holds one exchange per request through the gateway, outcome ``ok``, the right
  protocol and ``streamed``; for a stream its ``response_final`` equals the non-streamed reply of
  the same turn (reassembly on real traffic).
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from pvisor.adapters.protocols import get_protocol

SHELL_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "The command."}},
    "required": ["command"],
}
SYSTEM = "You are a careful coding agent."
TASK = "List the files, then read a.txt and b.txt."

TURNS = {
    "text": {"text": "Nothing to run: the answer is 42."},
    "tool": {"text": "Let me look.", "tool_calls": [{"tool": "@shell", "command": "ls -la"}]},
    "parallel": {
        "text": "Two at once.",
        "tool_calls": [
            {"tool": "@shell", "command": "cat a.txt"},
            {"tool": "@shell", "command": "cat b.txt"},
        ],
    },
    "reasoning": {"text": "The files agree.", "reasoning": "Compare a.txt with b.txt first."},
}
#: (text, [(tool name, arguments)], reasoning) each kind must come back as
EXPECTED = {
    "text": ("Nothing to run: the answer is 42.", [], None),
    "tool": ("Let me look.", [("bash", {"command": "ls -la"})], None),
    "parallel": (
        "Two at once.",
        [("bash", {"command": "cat a.txt"}), ("bash", {"command": "cat b.txt"})],
        None,
    ),
    "reasoning": ("The files agree.", [], "Compare a.txt with b.txt first."),
}
PROTOCOLS = ("anthropic", "openai-chat", "openai-responses", "gemini")
GEMINI_MODEL = "gemini-2.5-pro"

# RFC 9110 hop-by-hop fields (the gateway may rewrite them), and Date (differs between two requests)
_SKIP_HEADERS = {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "date"}

# the keys the official SDKs send, in their providers' formats: none may reach the journal
ANTHROPIC_KEY = "sk-ant-api03-Q7vX2mPz9LkR4tYw8NbC3hJd6FsG1aEu5oIq0ZxWc"
OPENAI_KEY = "sk-proj-Hq3Zr8KvT1nWx5BdL9mYc2PjF7sGa4UeNo6Rk"
GEMINI_KEY = "AIzaSyT4kW9qZm2Xv7Lp3Rb8Nc5Hj1Fd6Gs0Ye"
SECRETS_SENT = [ANTHROPIC_KEY, OPENAI_KEY, GEMINI_KEY]


def comparable_headers(headers) -> list[tuple[str, str]]:
    items = headers.items() if isinstance(headers, dict) else headers
    return sorted(
        (k.lower(), v)
        for k, v in items
        if k.lower() not in _SKIP_HEADERS and not k.lower().startswith("proxy-")
    )


def dump(obj) -> dict:
    """model_dump() of an SDK object; google-genai's ``sdk_http_response`` keeps its headers
    minus hop-by-hop ones and Date."""
    d = obj.model_dump()
    if d.get("sdk_http_response") is not None:
        d["sdk_http_response"]["headers"] = comparable_headers(d["sdk_http_response"]["headers"] or {})
    return d


# --------------------------------------------------------------------------- one SDK call per protocol


def sdk_call(protocol: str, base: str, stream: bool):
    """Make the protocol's SDK request against ``base``; return the final object's dump, or the
    dumps of the events the SDK yields for a stream."""
    if protocol == "anthropic":
        client = anthropic.Anthropic(base_url=base, api_key=ANTHROPIC_KEY, max_retries=0, timeout=30)
        kw = dict(
            model="claude-test",
            max_tokens=1024,
            system=SYSTEM,
            messages=[{"role": "user", "content": TASK}],
            tools=[{"name": "bash", "description": "Run a shell command.", "input_schema": SHELL_SCHEMA}],
        )
        if stream:
            return [dump(e) for e in client.messages.create(**kw, stream=True)]
        return dump(client.messages.create(**kw))
    if protocol in ("openai-chat", "openai-responses"):
        client = openai.OpenAI(base_url=base + "/v1", api_key=OPENAI_KEY, max_retries=0, timeout=30)
        if protocol == "openai-chat":
            kw = dict(
                model="gpt-test",
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}],
                tools=[
                    {
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "description": "Run a shell command.",
                            "parameters": SHELL_SCHEMA,
                        },
                    }
                ],
            )
            create = client.chat.completions.create
        else:
            kw = dict(
                model="gpt-test",
                instructions=SYSTEM,
                input=TASK,
                tools=[
                    {
                        "type": "function",
                        "name": "bash",
                        "description": "Run a shell command.",
                        "parameters": SHELL_SCHEMA,
                        "strict": False,
                    }
                ],
            )
            create = client.responses.create
        if stream:
            return [dump(e) for e in create(**kw, stream=True)]
        return dump(create(**kw))
    assert protocol == "gemini"
    client = genai.Client(api_key=GEMINI_KEY, http_options=types.HttpOptions(base_url=base, timeout=30_000))
    config = types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(
                        name="bash", description="Run a shell command.", parameters_json_schema=SHELL_SCHEMA
                    )
                ]
            )
        ],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    if stream:
        return [
            dump(e)
            for e in client.models.generate_content_stream(model=GEMINI_MODEL, contents=TASK, config=config)
        ]
    return dump(client.models.generate_content(model=GEMINI_MODEL, contents=TASK, config=config))


def sdk_summary(protocol: str, result: dict) -> tuple[str, list[tuple[str, dict]], str | None]:
    """(text, tool calls, reasoning) read from a non-streamed SDK result's dump."""
    calls: list[tuple[str, dict]] = []
    texts: list[str] = []
    reasoning = None
    if protocol == "anthropic":
        for b in result["content"]:
            if b["type"] == "text":
                texts.append(b["text"])
            elif b["type"] == "tool_use":
                calls.append((b["name"], b["input"]))
            elif b["type"] == "thinking":
                reasoning = b["thinking"]
    elif protocol == "openai-chat":
        msg = result["choices"][0]["message"]
        texts.append(msg["content"] or "")
        calls = [
            (c["function"]["name"], orjson.loads(c["function"]["arguments"])) for c in msg["tool_calls"] or []
        ]
        reasoning = msg.get("reasoning_content")
    elif protocol == "openai-responses":
        for item in result["output"]:
            if item["type"] == "message":
                texts += [c["text"] for c in item["content"]]
            elif item["type"] == "function_call":
                calls.append((item["name"], orjson.loads(item["arguments"])))
            elif item["type"] == "reasoning":
                reasoning = "".join(s["text"] for s in item["summary"])
    else:
        for p in result["candidates"][0]["content"]["parts"]:
            if p.get("function_call"):
                calls.append((p["function_call"]["name"], p["function_call"]["args"]))
            elif p.get("thought"):
                reasoning = p["text"]
            elif p.get("text") is not None:
                texts.append(p["text"])
    return "".join(texts), calls, reasoning


# --------------------------------------------------------------------------- raw requests


def raw_request(base: str, method: str, target: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request with http.client: (status, headers, de-chunked body; never decompressed)."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(
            method,
            target,
            body=body,
            headers={"Content-Type": "application/json", "Accept-Encoding": "gzip, br, zstd"},
        )
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()
    finally:
        conn.close()


def non_streamed_variant(protocol: str, path: str, query: str, body: bytes) -> tuple[str, bytes]:
    """The same request asking for a non-streamed reply: (target, body)."""
    if protocol == "gemini":
        return path.replace(":streamGenerateContent", ":generateContent"), body
    obj = orjson.loads(body)
    obj.pop("stream", None)
    obj.pop("stream_options", None)
    return path, orjson.dumps(obj)


# --------------------------------------------------------------------------- the test


@pytest.mark.parametrize("kind", sorted(TURNS))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sdk_identical_with_and_without_gateway(stack, protocol, stream, kind):
    upstream = stack.scripted({"seed": 7, "turns": [TURNS[kind]]})
    gw = stack.gateway(upstreams={"anthropic": upstream, "openai": upstream, "gemini": upstream})

    # 1. the SDK sees the same thing with and without the gateway
    direct = sdk_call(protocol, upstream, stream)
    through = sdk_call(protocol, gw.url, stream)
    assert through == direct
    if stream:
        assert len(direct) >= 2  # a real event stream, not one blob
    else:
        assert sdk_summary(protocol, direct) == EXPECTED[kind]

    # 2. the SDK's request body, sent raw, gets the same bytes and headers both ways
    [sdk_ex] = stack.exchanges(gw)
    with stack.reader(gw) as r:
        body = r.request_body(sdk_ex)
    target = sdk_ex.path + ("?" + sdk_ex.query if sdk_ex.query else "")
    st_d, h_d, b_d = raw_request(upstream, sdk_ex.method, target, body)
    st_g, h_g, b_g = raw_request(gw.url, sdk_ex.method, target, body)
    assert st_d == st_g == 200
    assert b_g == b_d
    assert comparable_headers(h_g) == comparable_headers(h_d)
    ctype = dict((k.lower(), v) for k, v in h_d)["content-type"]
    assert ctype.startswith("text/event-stream" if stream else "application/json")
    assert "content-encoding" not in dict((k.lower(), v) for k, v in h_g)

    # 3. the journal: one exchange per request through the gateway
    mod = get_protocol(protocol)
    exchanges = stack.exchanges(gw)
    assert [(e.protocol, e.streamed, e.outcome, e.status) for e in exchanges] == [
        (protocol, stream, "ok", 200)
    ] * 2
    nt_target, nt_body = non_streamed_variant(protocol, sdk_ex.path, sdk_ex.query, body)
    st_n, _, plain_reply = raw_request(upstream, "POST", nt_target, nt_body)
    assert st_n == 200
    plain_obj = orjson.loads(plain_reply)
    action = mod.response_to_action(plain_obj)
    text, calls, reasoning = EXPECTED[kind]
    assert (action.text, [(c.name, c.arguments) for c in action.tool_calls]) == (text, calls)
    assert "".join(x.text for x in action.reasoning) == (reasoning or "")
    with stack.reader(gw) as r:
        for ex in exchanges:
            assert r.request_body(ex) == body
            assert r.response_body(ex, raw=True) == b_d
            if stream:
                assert ex.response_final is not None
                assert orjson.loads(r.response_body(ex)) == plain_obj  # reassembled == the non-streamed reply
            else:
                assert r.response_body(ex) == plain_reply
