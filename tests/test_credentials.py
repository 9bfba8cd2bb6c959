"""Dummy keys (issue 37, docs/replay.md "Keys in a continuation"): the agent holds a dummy key,
the gateway puts the real one in its place when it forwards (gateway/credentials.py), and the
real key never reaches the agent, the journal, a log or an error.

Real parts: the gateway on 127.0.0.1 port 0 with an upstream of the test's that records what it
received (the scripted model behind it), the official SDKs, and Claude Code through ``pvisor run
--dummy-key``. What is looked for in the journal is looked for in the file's bytes, in every form
an encoding could hide the key in (:func:`~pvisor.journal.redact.secret_forms`).
"""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import quote

import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from agent_helpers import entrypoint, pvisor, user_env
from gateway_helpers import http_request
from google import genai
from google.genai import types
from test_intercept import mitmdump

from pvisor.adapters.protocols import PROTOCOL_MODULES, UPSTREAMS, get_protocol
from pvisor.gateway.credentials import KeySwap, UpstreamCredentials, credential_places
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_server import ScriptedModelServer
from pvisor.journal.reader import JournalReader
from pvisor.journal.redact import credential, secret_forms

#: real keys that are not key-shaped: the journal's redaction by shape would not catch them, so
#: only the swap (and the journal's redaction by header name) keeps them out
REAL = {
    "anthropic": "real-anthropic-key-7Qm2xT9vL4pR8wZ1",
    "openai": "real-openai-key-3Hk8Wq5Zn1Bv6Yc0",
    "gemini": "real-gemini-key-9Ft2Lp7Mx4Rs1Dd5",
}
DUMMY = {name: f"dummy-{name}-key-0123456789abcdef" for name in REAL}
SCRIPT = {"turns": [{"text": "Hello from upstream."}] * 8}


def forms(value: str) -> set[bytes]:
    """Every form of ``value`` the journal must not hold: as is, percent-encoded, hex, base64."""
    return secret_forms(value) | {value.encode()}


def assert_nowhere(data: bytes, value: str, where: str) -> None:
    found = [f for f in forms(value) if f in data]
    assert not found, f"{where} holds a form of the real key: {found[:3]}"


def journal_bytes(path: Path) -> bytes:
    """The journal file and its WAL, as bytes."""
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*") if p.is_file())


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def credentials() -> UpstreamCredentials:
    return UpstreamCredentials([KeySwap(name, DUMMY[name], REAL[name]) for name in REAL])


def scripted_upstream(stack, script: dict = SCRIPT):
    """An upstream that records every request (``.requests``: method, raw path, headers, body)
    and answers it with the scripted model (all four protocols, by path)."""
    model = ScriptedModel(parse_script(script, "test script"))

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        path, _, query = request.raw_path.partition("?")
        reply = model.answer(request.method, path, query, await request.read())
        return web.Response(status=reply.status, headers=reply.headers, body=b"".join(reply.chunks))

    return stack.raw_upstream(handler)


def sdk_call(protocol: str, base: str, key: str) -> str:
    """One request of the protocol's official SDK with ``key``; the reply's text."""
    if protocol == "anthropic":
        client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=30)
        msg = client.messages.create(
            model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
        return msg.content[0].text
    if protocol == "openai-chat":
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=30)
        chat = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
        return chat.choices[0].message.content or ""
    if protocol == "openai-responses":
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=30)
        return client.responses.create(model="gpt-test", input="hi").output_text
    client = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base, timeout=30_000))
    return client.models.generate_content(model="gemini-2.5-pro", contents="hi").text or ""


# --------------------------------------------------------------------------- the protocol facts


def test_every_protocol_declares_where_its_key_goes():
    facts = {
        name: (get_protocol(name).CREDENTIAL_HEADERS, get_protocol(name).CREDENTIAL_QUERY)
        for name in PROTOCOL_MODULES
    }
    assert facts == {
        "anthropic": (("x-api-key", "authorization"), ()),
        "openai-chat": (("authorization",), ()),
        "openai-responses": (("authorization",), ()),
        "gemini": (("x-goog-api-key",), ("key",)),
    }
    assert credential_places("openai") == (frozenset({"authorization"}), frozenset())
    assert set(UPSTREAMS) == {"anthropic", "openai", "gemini"}


# --------------------------------------------------------------------------- the gateway


@pytest.mark.parametrize("protocol", sorted(PROTOCOL_MODULES))
def test_the_sdk_sends_the_dummy_and_the_upstream_gets_the_real_key(stack, protocol):
    upstream_name = next(n for n, (_, ps) in UPSTREAMS.items() if protocol in ps)
    up = scripted_upstream(stack)
    gw = stack.gateway(upstreams={upstream_name: up.url}, credentials=credentials())
    assert sdk_call(protocol, gw.url, DUMMY[upstream_name])  # a reply came back through the gateway
    headers = lower(up.requests[0][2])
    # where this SDK sends its key (Anthropic's: x-api-key, or a Bearer token), in its own form
    sent = {h: v for h, v in headers.items() if h in credential_places(upstream_name)[0]}
    assert sent and {credential(v) for v in sent.values()} == {REAL[upstream_name]}
    assert all(v.startswith("Bearer ") for h, v in sent.items() if h == "authorization")
    assert DUMMY[upstream_name] not in repr(headers)
    stack.drain(gw)
    data = journal_bytes(gw.journal_path)
    for real in REAL.values():
        assert_nowhere(data, real, "the journal")
    with JournalReader(gw.journal_path) as r:
        (ex,) = r.exchanges(gw.run)
    assert ex.status == 200 and set(sent) <= set(ex.secret_fingerprints)


def test_a_gemini_key_in_the_query_is_swapped_in_place(stack):
    up = scripted_upstream(stack)
    gw = stack.gateway(upstreams={"gemini": up.url}, credentials=credentials())
    body = orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    path = f"/v1beta/models/gemini-2.5-pro:generateContent?alt=json&key={quote(DUMMY['gemini'])}&x=1"
    status, _, _ = http_request(gw.url, "POST", path, body, {"Content-Type": "application/json"})
    assert status == 200
    (_, raw_path, _, _), *_ = up.requests
    assert raw_path.endswith(f"?alt=json&key={quote(REAL['gemini'], safe='')}&x=1")
    stack.drain(gw)
    assert_nowhere(journal_bytes(gw.journal_path), REAL["gemini"], "the journal")


def test_only_the_dummy_is_replaced_and_only_where_the_protocol_carries_a_key(stack):
    """Another key passes as the agent sent it (it holds nothing the agent did not hold); the
    dummy in a header the protocol does not carry its key in, or of another upstream, stays."""
    up = scripted_upstream(stack)
    gw = stack.gateway(upstreams={"anthropic": up.url}, credentials=credentials())
    body = orjson.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    cases = [
        {"x-api-key": "the-agents-own-key-42"},
        {"x-api-key": DUMMY["openai"]},
        {"x-api-key": DUMMY["anthropic"] + "x"},
        {"x-other": DUMMY["anthropic"]},
        {"authorization": f"Bearer {DUMMY['anthropic']}"},
        {},
    ]
    for headers in cases:
        status, _, _ = http_request(
            gw.url, "POST", "/v1/messages", body, {"Content-Type": "application/json", **headers}
        )
        assert status == 200
    got = [lower(r[2]) for r in up.requests]
    assert got[0]["x-api-key"] == "the-agents-own-key-42"
    assert got[1]["x-api-key"] == DUMMY["openai"]
    assert got[2]["x-api-key"] == DUMMY["anthropic"] + "x"
    assert got[3]["x-other"] == DUMMY["anthropic"]
    assert got[4]["authorization"] == f"Bearer {REAL['anthropic']}"
    assert "x-api-key" not in got[5] and "authorization" not in got[5]


def test_without_credentials_the_gateway_forwards_the_agents_key_as_today(stack):
    up = scripted_upstream(stack)
    gw = stack.gateway(upstreams={"openai": up.url})
    assert sdk_call("openai-chat", gw.url, DUMMY["openai"])
    assert lower(up.requests[0][2])["authorization"] == f"Bearer {DUMMY['openai']}"


def test_an_upstream_that_echoes_the_key_never_shows_it_to_the_agent_or_the_journal(stack):
    """An error that quotes the key it refused, as sent, percent-encoded and in base64, cut into
    5-byte chunks (a key across a chunk boundary), and a response header that repeats it."""
    real = REAL["anthropic"]
    echo = (
        b'{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key '
        + real.encode()
        + b" ("
        + quote(real, safe="").encode()
        + b", "
        + base64.b64encode(real.encode())
        + b')"}}'
    )

    async def refuse(request: web.BaseRequest) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=401, headers={"Content-Type": "application/json", "X-Echo-Key": f"key={real}"}
        )
        await resp.prepare(request)
        for i in range(0, len(echo), 5):
            await resp.write(echo[i : i + 5])
        await resp.write_eof()
        return resp

    up = stack.raw_upstream(refuse)
    gw = stack.gateway(upstreams={"anthropic": up.url}, credentials=credentials())
    body = orjson.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    status, headers, got = http_request(
        gw.url,
        "POST",
        "/v1/messages",
        body,
        {"Content-Type": "application/json", "x-api-key": DUMMY["anthropic"]},
    )
    assert status == 401 and lower(up.requests[0][2])["x-api-key"] == real
    assert_nowhere(got, real, "the response the agent got")
    assert_nowhere(repr(headers).encode(), real, "the response headers the agent got")
    assert got.count(b"<redacted>") == 3 and b"authentication_error" in got
    assert dict(headers)["X-Echo-Key"] == "key=<redacted>"
    stack.drain(gw)
    assert_nowhere(journal_bytes(gw.journal_path), real, "the journal")


def test_the_credentials_never_show_the_key():
    creds = credentials()
    assert not any(real in repr(creds) for real in REAL.values())
    assert not any(real in repr(KeySwap("openai", "dummy-key-1234", real)) for real in REAL.values())
    for swap, says in [
        (KeySwap("azure", DUMMY["openai"], REAL["openai"]), "unknown upstream 'azure'"),
        (KeySwap("openai", "short", REAL["openai"]), "the dummy key for upstream openai must be"),
        (KeySwap("openai", DUMMY["openai"], REAL["openai"] + "\n"), "the key for upstream openai must be"),
        (KeySwap("openai", REAL["openai"], REAL["openai"]), "is the key itself"),
    ]:
        with pytest.raises(ValueError) as err:
            UpstreamCredentials([swap])
        assert says in str(err.value) and REAL["openai"] not in str(err.value)


# --------------------------------------------------------------------------- pvisor run --dummy-key


class RecordingModelServer(ScriptedModelServer):
    """The scripted model server, recording the credential headers (``x-api-key``,
    ``authorization``) of every request it answers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys: list[dict[str, str]] = []

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.keys.append(
            {k.lower(): v for k, v in request.headers.items() if k.lower() in ("x-api-key", "authorization")}
        )
        return await super()._handle(request)


def run_with_dummy_key(agent: str, url: str, tmp_path: Path, env: dict[str, str], *extra: str):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return pvisor(
        [
            "--journal",
            str(tmp_path / "data" / "journal.sqlite"),
            "run",
            "--agent",
            agent,
            "--agent-entrypoint",
            str(entrypoint(agent)),
            "--upstream",
            url,
            "--dummy-key",
            *extra,
            "--workspace",
            str(ws),
            "--json",
            "--",
            "Show me your environment.",
        ],
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "agent, key_env, header",
    [("claude-code", "ANTHROPIC_API_KEY", "x-api-key"), ("codex", "OPENAI_API_KEY", "authorization")],
)
def test_an_agent_under_a_dummy_key_never_holds_the_real_one(loop_thread, tmp_path, agent, key_env, header):
    """``pvisor run --dummy-key --upstream URL`` with the user's key in the agent's key variable:
    the upstream gets the real key with every request (in the agent's own header), the agent's
    tools see only the dummy (its ``env`` and its /proc environ, recorded as the observation),
    another credential variable is gone, and nothing pvisor wrote (the journal, the run
    directory: the agent's stdout and its native session) holds the real key in any form.
    Fails before the swap: ``--dummy-key`` was unknown, and without it the agent held the key."""
    real = f"real-user-key-for-{agent}-5Vb8Nq2Wx7Kd"
    script = {
        "turns": [
            {
                "text": "Looking at my environment.",
                "tool_calls": [{"tool": "@shell", "command": "env; tr '\\0' '\\n' < /proc/self/environ"}],
            },
            {"text": "Done."},
        ]
    }
    server = RecordingModelServer(ScriptedModel(parse_script(script, "test script")))
    url = loop_thread.run(server.start())
    try:
        home = tmp_path / "home"
        home.mkdir()
        env = user_env(home, **{key_env: real, "OTHER_SERVICE_API_KEY": "another-secret-Zt4Lq"})
        # Codex asks for the scripted model's name: its default model's tools have no shell tool
        model = ["--model", "gpt-5-codex"] if agent == "codex" else []
        proc = run_with_dummy_key(agent, url, tmp_path, env, *model)
    finally:
        loop_thread.run(server.stop())
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert report["steps"] == 2
    expected = f"Bearer {real}" if header == "authorization" else real
    assert server.keys and all(keys.get(header) == expected for keys in server.keys), server.keys
    journal = tmp_path / "data" / "journal.sqlite"
    with JournalReader(journal) as r:
        bodies = b"".join(r.request_body(ex) or b"" for ex in r.exchanges(report["run"]))
    observed = bodies.decode()
    assert f"{key_env}=pvisor-dummy-key-" in observed  # the tool ran and saw the dummy
    assert "OTHER_SERVICE_API_KEY" not in observed
    files = [path for path in (tmp_path / "data").rglob("*") if path.is_file()]
    assert journal in files and any(path.name.endswith(".stdout") for path in files)
    for path in files:
        assert_nowhere(path.read_bytes(), real, str(path))
        assert b"another-secret-Zt4Lq" not in path.read_bytes(), path
    assert_nowhere((proc.stdout + proc.stderr).encode(), real, "pvisor's output")


def test_a_dummy_key_in_intercept_mode_is_refused_before_anything_runs(tmp_path):
    """Intercept mode forwards to the host the agent addressed, where no key is swapped: exit 2,
    one line, no journal made, and the key not in the message."""
    real = "real-user-key-for-intercept-8Jd3"
    home = tmp_path / "home"
    home.mkdir()
    env = user_env(home, ANTHROPIC_API_KEY=real, PVISOR_MITMDUMP=mitmdump())
    proc = run_with_dummy_key("claude-code", "http://127.0.0.1:9", tmp_path, env, "--intercept")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a dummy key is given through the reverse proxy only" in lines[0]
    assert real not in proc.stderr and not (tmp_path / "data" / "journal.sqlite").exists()
