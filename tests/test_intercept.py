"""Intercept mode (issue 18): ``pvisor gateway --mode intercept`` is a forward proxy built on the
real mitmdump (mitmproxy 11, from ``.venv-intercept``: ``$PVISOR_MITMDUMP``) that records what
goes to the model API hosts through the same responder seam and recorder as the reverse proxy.

A scripted model server speaking HTTPS with a certificate of its own (trustme) stands in for
the public Anthropic, OpenAI and Gemini hosts (``--redirect``); the official SDKs reach it
through the proxy, trusting pvisor's CA, and once more through a reverse gateway: the two
journals differ only in ``capture`` (headers' case and order and chunk boundaries cannot show:
the journal keeps headers as a dict and bodies whole). Streams pass unbuffered; another host
is tunnelled untouched and never recorded; a WebSocket upgrade to a model host is refused and
recorded; no byte of a key lands in a journal, its WAL, a log or an export.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import time
from pathlib import Path

import anthropic
import httpx2
import openai
import orjson
import pytest
import trustme
from aiohttp import web
from agent_helpers import children, entrypoint, pvisor, user_env, wait_gone
from gateway_helpers import DEADLINE, Gate
from google import genai
from google.genai import types
from test_gateway_cli import ENV, PVISOR, Proc

from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_server import ScriptedModelServer
from pvisor.journal.model import unpack_timings
from pvisor.journal.reader import JournalReader

ANTHROPIC_KEY = "sk-ant-api03-Iq9Tz3LmR7vX2pKw5NbH8cJd1FsG4aEu6oYq0ZxWd"
OPENAI_KEY = "sk-proj-Wm4Zr8KvT1nQx5BdL9yYc2PjF7sGa3UeNo6Rt"
GEMINI_KEY = "AIzaSyR8kW2qZm9Xv7Lp3Tb4Nc5Hj1Fd6Gs0Yf"
SECRETS_SENT = [ANTHROPIC_KEY, OPENAI_KEY, GEMINI_KEY]

MODEL_HOSTS = ("api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com")
SCRIPT = {"turns": [{"text": "Let me look.", "tool_calls": [{"tool": "@shell", "command": "ls -la"}]}]}
SHELL = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def mitmdump() -> str:
    """The mitmdump of ``.venv-intercept``; fails (never skips) when it is not there."""
    path = os.environ.get("PVISOR_MITMDUMP", "")
    if not (path and os.access(path, os.X_OK)):
        pytest.fail(
            "$PVISOR_MITMDUMP names no mitmdump: ./scripts/test installs pvisor-replay[intercept] into "
            ".venv-intercept and sets it",
            pytrace=False,
        )
    return path


# --------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA of the test upstream's own (trustme) and its server certificate for 127.0.0.1."""
    where = tmp_path_factory.mktemp("upstream-ca")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(where / "upstream-ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    return {"ca": ca, "ca_pem": where / "upstream-ca.pem", "server": server}


@pytest.fixture(scope="module")
def upstream(loop_thread, certs):
    """The scripted model over HTTPS (four protocols, by path)."""
    server = ScriptedModelServer(
        ScriptedModel(parse_script(SCRIPT, "test script")), ssl_context=certs["server"]
    )
    url = loop_thread.run(server.start())
    yield url
    loop_thread.run(server.stop())


def gateway_env(tmp: Path, certs) -> dict[str, str]:
    """pvisor's environment: mitmdump, a CA directory of the test's, and the test upstream's CA
    for the gateway's own connections upstream (``SSL_CERT_FILE``, read by OpenSSL)."""
    return {
        **ENV,
        "PVISOR_MITMDUMP": mitmdump(),
        "PVISOR_CA_DIR": str(tmp / "pvisor-ca"),
        "SSL_CERT_FILE": str(certs["ca_pem"]),
    }


def start_intercept(procs, tmp: Path, certs, targets: dict[str, str], *extra: str) -> tuple[Proc, dict]:
    """``pvisor gateway --mode intercept`` redirecting each model host of ``targets``; returns the
    process and its ready file (``url`` the proxy, ``ca`` the certificate)."""
    ready = tmp / "ready-intercept.json"
    args = ["--journal", str(tmp / "intercept.sqlite"), "gateway", "--mode", "intercept", "--port", "0"]
    for host, url in targets.items():
        args += ["--redirect", f"{host}={url}"]
    args += [
        "--run",
        "intercepted",
        "--log-file",
        str(tmp / "intercept.log"),
        "--ready-file",
        str(ready),
        *extra,
    ]
    p = procs(args, env=gateway_env(tmp, certs))
    p.listening()
    return p, json.loads(ready.read_text())


def proxy_client_ssl(info: dict) -> ssl.SSLContext:
    """A client context trusting pvisor's CA only (what the agent is told to trust)."""
    return ssl.create_default_context(cafile=info["ca"])


def proxy_client(info: dict, timeout: float = 15.0) -> httpx2.Client:
    """A client going through the intercept proxy of ``info``, trusting pvisor's CA only."""
    return httpx2.Client(proxy=info["url"], verify=proxy_client_ssl(info), timeout=httpx2.Timeout(timeout))


def stream_messages(client: httpx2.Client):
    """A streamed Anthropic Messages request to api.anthropic.com (a context manager)."""
    return client.stream(
        "POST",
        "https://api.anthropic.com/v1/messages",
        headers={"x-api-key": ANTHROPIC_KEY, "content-type": "application/json"},
        content=b'{"model":"claude-test","max_tokens":8,"stream":true,"messages":[]}',
    )


# --------------------------------------------------------------------------- the SDKs


def sdk_calls(base: str | None, proxy: str | None, verify) -> list:
    """One request per (SDK, streamed or not): the anthropic, openai (Chat Completions and
    Responses) and google-genai clients, against ``base`` (reverse) or their public hosts
    through ``proxy`` (intercept). Returns what each SDK gave back (dumps)."""
    client_args = {"proxy": proxy, "verify": verify} if proxy else {}
    out = []
    a = anthropic.Anthropic(
        base_url=base,
        api_key=ANTHROPIC_KEY,
        max_retries=0,
        timeout=30,
        http_client=anthropic.DefaultHttpxClient(**client_args) if proxy else None,
    )
    kw = dict(
        model="claude-test",
        max_tokens=256,
        messages=[{"role": "user", "content": "List the files."}],
        tools=[{"name": "bash", "description": "Run a shell command.", "input_schema": SHELL}],
    )
    out.append(a.messages.create(**kw).model_dump())
    out.append([e.model_dump() for e in a.messages.create(**kw, stream=True)])
    o = openai.OpenAI(
        base_url=(base + "/v1") if base else None,
        api_key=OPENAI_KEY,
        max_retries=0,
        timeout=30,
        http_client=openai.DefaultHttpxClient(**client_args) if proxy else None,
    )
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run.", "parameters": SHELL}}]
    msgs = [{"role": "user", "content": "List the files."}]
    out.append(o.chat.completions.create(model="gpt-test", messages=msgs, tools=tools).model_dump())
    out.append(
        [
            c.model_dump()
            for c in o.chat.completions.create(model="gpt-test", messages=msgs, tools=tools, stream=True)
        ]
    )
    rtools = [{"type": "function", "name": "bash", "description": "Run.", "parameters": SHELL}]
    out.append(o.responses.create(model="gpt-test", input="List the files.", tools=rtools).model_dump())
    out.append(
        [
            e.model_dump()
            for e in o.responses.create(model="gpt-test", input="List the files.", tools=rtools, stream=True)
        ]
    )
    options = types.HttpOptions(base_url=base) if base else types.HttpOptions(client_args=client_args)
    g = genai.Client(api_key=GEMINI_KEY, http_options=options)
    cfg = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="bash", parameters=SHELL)])]
    )
    res = g.models.generate_content(model="gemini-2.5-pro", contents="List the files.", config=cfg)
    out.append(res.candidates[0].model_dump())
    stream = g.models.generate_content_stream(model="gemini-2.5-pro", contents="List the files.", config=cfg)
    out.append([c.candidates[0].model_dump() for c in stream])
    return out


def exchanges(journal: Path, run: str) -> list:
    with JournalReader(journal) as r:
        return [
            (
                e,
                r.blob(e.request_body) if e.request_body else b"",
                r.blob(e.response_body) if e.response_body else b"",
            )
            for e in r.exchanges(run)
        ]


def test_the_sdks_through_intercept_mode_get_what_the_reverse_proxy_gives_and_the_journals_agree(
    procs, tmp_path, certs, upstream
):
    """The three SDKs, streamed and not, through intercept mode (their public hosts, redirected
    to the HTTPS test upstream) and through a reverse gateway to the same upstream: the SDKs
    return the same objects; the two journals hold the same exchanges (method, path, query,
    protocol, status, request headers, request and response bytes, reassembled reply), and
    differ in ``capture`` alone (and the ``Date`` the upstream sent)."""
    p, info = start_intercept(procs, tmp_path, certs, dict.fromkeys(MODEL_HOSTS, upstream))
    rev = procs(
        ["--journal", str(tmp_path / "reverse.sqlite"), "gateway", "--port", "0", "--run", "reversed"]
        + [a for name in ("anthropic", "openai", "gemini") for a in ("--upstream", f"{name}={upstream}")],
        env=gateway_env(tmp_path, certs),
    )
    through_proxy = sdk_calls(None, info["url"], proxy_client_ssl(info))
    direct = sdk_calls(rev.listening(), None, None)
    assert through_proxy == direct
    assert p.stop() == 0 and rev.stop() == 0

    got = exchanges(tmp_path / "intercept.sqlite", "intercepted")
    want = exchanges(tmp_path / "reverse.sqlite", "reversed")
    assert len(got) == len(want) == 8
    for (g, g_req, g_resp), (w, w_req, w_resp) in zip(got, want):
        assert (g.capture, w.capture) == ("intercept", "reverse")
        assert (g.method, g.path, g.query, g.protocol, g.status, g.streamed, g.outcome, g.served_by) == (
            w.method,
            w.path,
            w.query,
            w.protocol,
            w.status,
            w.streamed,
            w.outcome,
            w.served_by,
        ), g.path
        assert g.request_headers == w.request_headers
        assert g_req == w_req and g_resp == w_resp, g.path
        assert g.response_final == w.response_final
        assert {k: v for k, v in g.response_headers.items() if k != "date"} == {
            k: v for k, v in w.response_headers.items() if k != "date"
        }
        assert "x-pvisor-intercept" not in g.request_headers
    assert {e.protocol for e, _, _ in got} == {"anthropic", "openai-chat", "openai-responses", "gemini"}
    # an export of the intercepted run, for the module's scan for keys as well
    export = subprocess.run(
        [*PVISOR, "--journal", str(tmp_path / "intercept.sqlite"), "journal", "export", "intercepted",
         "--format", "jsonl", "-o", str(tmp_path / "export.jsonl")],
        env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert export.returncode == 0 and (tmp_path / "export.jsonl").stat().st_size > 0, export.stderr
    # every exchange is in the log file too, and no key is anywhere (the module's scan checks the files)
    assert (tmp_path / "intercept.log").read_text().count(" upstream req=") == 8


# --------------------------------------------------------------------------- streams, tunnels, WebSocket


async def tls_server(handler, ctx: ssl.SSLContext) -> tuple[web.ServerRunner, str]:
    """An aiohttp server of ``handler`` speaking HTTPS on 127.0.0.1 (on the loop thread)."""
    runner = web.ServerRunner(web.Server(handler), handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
    return runner, f"https://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
def gated_upstream(loop_thread, certs):
    """An HTTPS upstream that sends the first event of a stream, then waits for the test's
    gate before the rest: a proxy that buffered would deliver nothing until the end."""
    gate = Gate(loop_thread)
    first = b'event: message_start\ndata: {"type":"message_start"}\n\n'
    rest = [
        b'event: ping\ndata: {"type":"ping"}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await gate.wait()
        for part in rest:
            await resp.write(part)
        await resp.write_eof()
        return resp

    runner, url = loop_thread.run(tls_server(handler, certs["server"]))
    yield url, gate, first + b"".join(rest)
    gate.set()
    loop_thread.run(runner.cleanup())


def test_a_stream_passes_through_intercept_mode_unbuffered_and_byte_for_byte(
    procs, tmp_path, certs, gated_upstream
):
    """The client reads the first event while the upstream still holds the rest (each chunk
    goes on as it comes, through the gateway's relay and mitmdump's streamed response); the
    whole body is the upstream's bytes, and the journal has its chunk timings."""
    url, gate, body = gated_upstream
    p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": url})
    client = proxy_client(info)
    got = b""
    with stream_messages(client) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_raw():
            got += chunk
            if b"message_start" in got and not gate.is_set():
                gate.set()  # only now does the upstream send the rest
    assert got == body
    p.stop()
    ((ex, _, resp_bytes),) = exchanges(tmp_path / "intercept.sqlite", "intercepted")
    assert resp_bytes == body and ex.streamed and ex.capture == "intercept"
    assert len(unpack_timings(ex.chunk_timings)) >= 2


@pytest.fixture
def other_host(loop_thread, tmp_path):
    """An HTTPS server that is no model host, with a CA of its own."""
    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    ca.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))

    async def handler(request: web.BaseRequest) -> web.Response:
        return web.Response(body=b"not a model: " + request.path.encode())

    runner, url = loop_thread.run(tls_server(handler, ctx))
    yield url, tmp_path / "other-ca.pem"
    loop_thread.run(runner.cleanup())


def test_another_host_is_tunnelled_untouched_and_never_recorded(procs, tmp_path, certs, upstream, other_host):
    """A client that trusts only that host's own CA gets its answer through the proxy: the TLS
    session is the server's, not one of pvisor's certificates (a tunnel, never decrypted), and
    nothing of it is in the journal or the log."""
    url, ca = other_host
    p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": upstream})
    client = httpx2.Client(proxy=info["url"], verify=ssl.create_default_context(cafile=str(ca)), timeout=15)
    resp = client.get(url + "/secret-path?key=" + GEMINI_KEY)
    assert resp.status_code == 200 and resp.content == b"not a model: /secret-path"
    # and pvisor's CA does not verify it: the certificate the client saw was the host's own
    with pytest.raises(httpx2.ConnectError):
        proxy_client(info).get(url + "/x")
    p.stop()
    with JournalReader(tmp_path / "intercept.sqlite") as r:
        assert r.exchanges() == []
    assert "secret-path" not in (tmp_path / "intercept.log").read_text()


def test_a_websocket_upgrade_to_a_model_host_is_refused_and_recorded(procs, tmp_path, certs, upstream):
    """Codex's first transport: an upgrade to api.openai.com is answered 426 with the cause, and
    recorded (refused); nothing is tunnelled unrecorded."""
    p, info = start_intercept(procs, tmp_path, certs, {"api.openai.com": upstream})
    client = proxy_client(info)
    resp = client.get(
        "https://api.openai.com/v1/responses",
        headers={
            "Authorization": f"Bearer {OPENAI_KEY}",
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert resp.status_code == 426
    assert "does not record WebSocket" in resp.text and "https://api.openai.com" in resp.text
    p.stop()
    ((ex, _, _),) = exchanges(tmp_path / "intercept.sqlite", "intercepted")
    assert ex.status == 426 and ex.served_by == "refused" and ex.capture == "intercept"
    assert "pvisor_websocket_unsupported" in ex.error


def test_one_run_per_proxy_and_the_run_header_files_a_request_elsewhere(procs, tmp_path, certs, upstream):
    """Without a /run/<id> path, an intercepted request goes to the proxy's run (--run); one
    with ``X-Pvisor-Run`` goes to that run, and the header is neither forwarded nor kept."""
    p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": upstream})
    client = proxy_client(info)
    body = b'{"model":"claude-test","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
    for headers in ({}, {"X-Pvisor-Run": "session-b"}):
        resp = client.post(
            "https://api.anthropic.com/v1/messages",
            headers={"x-api-key": ANTHROPIC_KEY, "content-type": "application/json", **headers},
            content=body,
        )
        assert resp.status_code == 200
    p.stop()
    with JournalReader(tmp_path / "intercept.sqlite") as r:
        assert [e.run for e in r.exchanges()] == ["intercepted", "session-b"]
        assert all("x-pvisor-run" not in e.request_headers for e in r.exchanges())


def test_a_forged_intercept_header_at_the_gateway_is_refused_unrecorded(procs, tmp_path, certs, upstream):
    """Only the gateway's own mitmdump may name an origin: a request that sends the header with
    another token straight to the inner gateway gets 401, and is neither forwarded nor recorded."""
    p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": upstream})
    resp = httpx2.post(
        info["gateway"] + "/v1/messages",
        headers={"X-Pvisor-Intercept": "forgedforgedforgedforged https://api.anthropic.com"},
        content=b"{}",
        timeout=15,
    )
    assert resp.status_code == 401 and "X-Pvisor-Intercept" in resp.text
    # nor is it a reverse proxy for whoever finds its port
    for path in ("/v1/messages", "/run/evil/v1/chat/completions"):
        resp = httpx2.post(info["gateway"] + path, content=b"{}", timeout=15)
        assert resp.status_code == 401, path
    p.stop()
    with JournalReader(tmp_path / "intercept.sqlite") as r:
        assert r.exchanges() == [] and r.runs() == []


def test_a_compressed_error_that_echoes_the_key_is_stored_decoded_without_it(
    loop_thread, procs, tmp_path, certs
):
    """Issue 35, item 2, in intercept mode: the anthropic SDK through the proxy to its public host,
    whose (test) server refuses the key and quotes it, zstd-compressed as the SDK asked; the
    SDK gets the quote, the journal the decoded error without the key, the coding recorded."""
    from test_echoed_keys import assert_no_key, echoing_upstream

    from pvisor.journal.content_encoding import decode_body

    runner, url = loop_thread.run(tls_server(echoing_upstream("zstd"), certs["server"]))
    try:
        p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": url})
        client = anthropic.Anthropic(
            api_key=ANTHROPIC_KEY,
            max_retries=0,
            timeout=30,
            http_client=anthropic.DefaultHttpxClient(proxy=info["url"], verify=proxy_client_ssl(info)),
        )
        with pytest.raises(anthropic.AuthenticationError) as err:
            client.messages.create(
                model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert ANTHROPIC_KEY in str(err.value)
        assert p.stop() == 0
    finally:
        loop_thread.run(runner.cleanup())
    ((ex, _, stored),) = exchanges(tmp_path / "intercept.sqlite", "intercepted")
    assert ex.capture == "intercept" and ex.status == 401
    named = ex.response_headers.get("content-encoding")  # as a reader decodes it
    assert_no_key(decode_body(stored, named) if named else stored, ANTHROPIC_KEY, "the stored body")
    assert b"invalid x-api-key: <redacted>" in stored
    assert ex.response_headers["pvisor-decoded-content-encoding"] == "zstd"
    assert "content-encoding" not in ex.response_headers


# --------------------------------------------------------------------------- CA, env, bad input


def test_ca_path_creates_the_ca_once_with_its_key_private(tmp_path):
    """``pvisor ca path`` prints the certificate's path, creating the CA on first use: the
    directory 0700, the key 0600; ``--bundle`` is the system's CAs plus it; a second call keeps
    the same CA."""
    env = {**ENV, "PVISOR_MITMDUMP": mitmdump(), "PVISOR_CA_DIR": str(tmp_path / "ca")}
    first = subprocess.run([*PVISOR, "ca", "path"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    cert = Path(first.stdout.strip())
    assert cert == tmp_path / "ca" / "mitmproxy-ca-cert.pem" and b"BEGIN CERTIFICATE" in cert.read_bytes()
    assert stat.S_IMODE((tmp_path / "ca").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "ca" / "mitmproxy-ca.pem").stat().st_mode) == 0o600
    bundle = subprocess.run([*PVISOR, "ca", "path", "--bundle"], env=env, capture_output=True, text=True)
    data = Path(bundle.stdout.strip()).read_bytes()
    assert cert.read_bytes().strip() in data and data.count(b"BEGIN CERTIFICATE") > 10
    again = subprocess.run([*PVISOR, "ca", "path"], env=env, capture_output=True, text=True, timeout=60)
    assert again.stdout == first.stdout and cert.read_bytes() == Path(again.stdout.strip()).read_bytes()


def env_json(*args: str, **extra: str) -> dict:
    p = subprocess.run(
        [*PVISOR, "env", *args, "--shell", "json"],
        env={
            **{k: v for k, v in ENV.items() if k.lower() != "no_proxy"},
            "PVISOR_CA_DIR": "/srv/ca",
            **extra,
        },
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_env_intercept_gives_the_proxy_and_the_ca_each_runtime_reads():
    """Node agents get NODE_EXTRA_CA_CERTS (the certificate, added to their store); Codex its own
    variable and SSL_CERT_FILE (the bundle) and a provider of the public host that speaks HTTP;
    mini-swe-agent the bundle. NO_PROXY keeps the user's entries but the intercepted hosts."""
    claude = env_json(
        "--agent", "claude-code", "--gateway", "http://127.0.0.1:8080", "--intercept",
        NO_PROXY="corp.example,api.anthropic.com",
    )  # fmt: skip
    e = claude["env"]
    assert (
        e["HTTPS_PROXY"] == "http://127.0.0.1:8080"
        and e["NODE_EXTRA_CA_CERTS"] == "/srv/ca/mitmproxy-ca-cert.pem"
    )
    assert "ANTHROPIC_BASE_URL" not in e
    assert e["NO_PROXY"] == "corp.example,127.0.0.1,localhost,::1"
    # a domain of an intercepted host, or *, would send it around the proxy (Python and curl
    # match domains by suffix); the lower-case spelling counts too; what was left out is said
    wide = env_json(
        "--agent", "claude-code", "--gateway", "http://127.0.0.1:8080", "--intercept",
        NO_PROXY="openai.com,*,.googleapis.com,corp.example", no_proxy="lower.example",
    )  # fmt: skip
    assert wide["env"]["NO_PROXY"] == "corp.example,lower.example,127.0.0.1,localhost,::1"
    assert any("openai.com, *, .googleapis.com" in n for n in wide["notes"]), wide["notes"]
    codex = env_json("--agent", "codex", "--gateway", "http://127.0.0.1:8080", "--intercept")
    assert codex["env"]["CODEX_CA_CERTIFICATE"] == "/srv/ca/mitmproxy-ca-cert.pem"
    assert codex["env"]["SSL_CERT_FILE"] == "/srv/ca/ca-bundle.pem"
    argv = " ".join(codex["argv"])
    assert 'base_url="https://api.openai.com/v1"' in argv and 'wire_api="responses"' in argv
    assert any("WebSocket" in n for n in codex["notes"])
    mini = env_json("--agent", "mini-swe-agent", "--gateway", "http://127.0.0.1:8080", "--intercept")
    assert mini["env"]["SSL_CERT_FILE"] == mini["env"]["REQUESTS_CA_BUNDLE"] == "/srv/ca/ca-bundle.pem"


@pytest.mark.parametrize(
    "args,code,expected",
    [
        (["gateway", "--mode", "intercept", "--redirect", "api.anthropic.com"], 2, "give HOST=URL"),
        (["gateway", "--mode", "intercept", "--redirect", "api.anthropic.com=ftp://x"], 2,
         "http:// or https://"),
        (["gateway", "--mode", "intercept", "--intercept-host", "bad host!"], 2, "give a host name"),
        (["gateway", "--mode", "intercept", "--upstream", "anthropic=http://127.0.0.1:1"], 2, "--redirect"),
        (["gateway", "--redirect", "api.anthropic.com=http://127.0.0.1:1"], 2, "go with --mode intercept"),
        (["gateway", "--mode", "intercept", "--host", "0.0.0.0"], 2, "listens on this machine only"),
        (["gateway", "--mode", "intercept", "--host", "0.0.0.0", "--allow-remote"], 2,
         "listens on this machine only"),
        (["env", "--agent", "codex", "--gateway", "http://127.0.0.1:8080", "--intercept", "--run", "r1"], 2,
         "--run does not go with --intercept"),
        (["replay", "--agent", "claude-code", "--run", "r", "--after-step", "1", "--output", "o",
          "--prepare-only", "--intercept"], 2, "--intercept is for --replay-only"),
    ],
    ids=["redirect-no-url", "redirect-bad-url", "bad-host", "upstream", "redirect-reverse", "remote",
         "remote-allowed", "env-run", "prepare"],
)  # fmt: skip
def test_bad_intercept_options_get_one_line_and_exit_2(tmp_path, args, code, expected):
    p = subprocess.run(
        [*PVISOR, "--journal", str(tmp_path / "j.sqlite"), *args],
        env={**ENV, "PVISOR_MITMDUMP": mitmdump(), "PVISOR_CA_DIR": str(tmp_path / "ca")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == code, p.stderr
    lines = p.stderr.strip().splitlines()
    assert expected in lines[0] and "Traceback" not in p.stderr
    if args[0] == "replay":
        # replay reports every problem of an invocation at once, one line each, usage first: the
        # journal named here does not exist either
        assert len(lines) == 2 and "no such journal file" in lines[1], lines
        assert all(line.startswith("pvisor: error: ") for line in lines)
    else:
        assert len(lines) == 1


def test_without_mitmdump_intercept_mode_says_how_to_install_it_and_exits_69(tmp_path):
    env = {k: v for k, v in ENV.items() if k != "PVISOR_MITMDUMP"}
    env.update(PATH="/usr/bin:/bin", PVISOR_CA_DIR=str(tmp_path / "ca"))
    cmd = [*PVISOR, "--journal", str(tmp_path / "j.sqlite"), "gateway"]
    p = subprocess.run(cmd + ["--mode", "intercept"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 69 and "pvisor-replay[intercept]" in p.stderr and "Traceback" not in p.stderr
    env["PVISOR_MITMDUMP"] = str(tmp_path / "nowhere" / "mitmdump")
    p = subprocess.run(cmd + ["--mode", "intercept"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 69 and "no executable file there" in p.stderr


@pytest.mark.parametrize("program", ["/bin/true", "/bin/false", "/bin/echo"])
def test_a_program_that_is_not_mitmdump_is_named_as_such(tmp_path, program):
    env = {**ENV, "PVISOR_MITMDUMP": program, "PVISOR_CA_DIR": str(tmp_path / "ca")}
    p = subprocess.run(
        [*PVISOR, "--journal", str(tmp_path / "j.sqlite"), "gateway", "--mode", "intercept", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 69 and f"$PVISOR_MITMDUMP {program} is not mitmdump" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_a_damaged_ca_key_is_one_line_and_exit_65(tmp_path):
    """A CA directory whose key file holds no key: refused before mitmdump starts, by the
    gateway and by ``pvisor ca path`` alike, and the file is left as it was."""
    ca = tmp_path / "ca"
    ca.mkdir(mode=0o700)
    (ca / "mitmproxy-ca-cert.pem").write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    (ca / "mitmproxy-ca.pem").write_text("garbage\n")
    env = {**ENV, "PVISOR_MITMDUMP": mitmdump(), "PVISOR_CA_DIR": str(ca)}
    for args in (["gateway", "--mode", "intercept", "--port", "0"], ["ca", "path"]):
        p = subprocess.run(
            [*PVISOR, "--journal", str(tmp_path / "j.sqlite"), *args], env=env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert p.returncode == 65, p.stderr
        assert "no PEM key and certificate in it" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert (ca / "mitmproxy-ca.pem").read_text() == "garbage\n"


def test_ctrl_c_lets_a_stream_in_flight_finish_through_the_proxy(procs, tmp_path, certs, gated_upstream):
    """Ctrl-C reaches the whole foreground process group: mitmdump, in a session of its own,
    is not cut by it; the gateway waits for the stream in flight (its grace), which ends whole
    through mitmdump; then both stop, exit 130, without a traceback."""
    import threading

    url, gate, body = gated_upstream
    p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": url})
    client = proxy_client(info, 30.0)
    got: list[bytes] = []

    def read() -> None:
        with stream_messages(client) as resp:
            for chunk in resp.iter_raw():
                got.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 15
    while b"message_start" not in b"".join(got) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(p.p.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    p.err.wait_for(r"^stopping: waiting for 1 exchange", deadline=15)
    gate.set()
    reader.join(30)
    assert b"".join(got) == body
    assert p.p.wait(DEADLINE) == 130
    err = p.err.rest()
    assert "Traceback" not in err and "CancelledError" not in err, err
    ((ex, _, resp_bytes),) = exchanges(tmp_path / "intercept.sqlite", "intercepted")
    assert ex.outcome == "ok" and resp_bytes == body


def mitmdump_children(pid: int) -> list[int]:
    """The child processes of ``pid`` that run mitmdump."""
    run = {c: Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0") for c in children(pid)}
    return [c for c, argv in run.items() if any(a.endswith(b"/mitmdump") for a in argv[:2])]


def test_a_client_that_does_not_trust_the_ca_is_named_on_stderr(procs, tmp_path, certs, upstream):
    """mitmdump's warning for a client that refused pvisor's certificate reaches the user's
    terminal, with what to do; the request is not recorded (it never arrived)."""
    p, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": upstream})
    with pytest.raises(httpx2.ConnectError):
        httpx2.Client(proxy=info["url"], verify=ssl.create_default_context(), timeout=15).get(
            "https://api.anthropic.com/v1/models"
        )
    line = p.err.wait_for(
        r"pvisor: warning: mitmdump: .*does not trust the proxy's certificate.*", deadline=15
    )
    assert "pvisor env --agent NAME --gateway PROXY --intercept" in line.group(0)
    p.stop()
    with JournalReader(tmp_path / "intercept.sqlite") as r:
        assert r.exchanges() == []


def test_a_taken_port_and_a_dead_mitmdump_end_the_gateway_with_69(procs, tmp_path, certs, upstream):
    """mitmdump cannot listen (the port is taken): one line with its cause, exit 69. mitmdump
    killed while the gateway runs: the gateway says so and stops, exit 69."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    p = subprocess.run(
        [
            *PVISOR,
            "--journal",
            str(tmp_path / "j.sqlite"),
            "gateway",
            "--mode",
            "intercept",
            "--port",
            str(port),
        ],
        env=gateway_env(tmp_path, certs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    taken.close()
    assert p.returncode == 69, p.stderr
    assert (
        f"mitmdump could not listen on 127.0.0.1:{port}" in p.stderr and "address already in use" in p.stderr
    )
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr

    proc, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": upstream})
    dumps = mitmdump_children(proc.p.pid)
    assert len(dumps) == 1
    os.kill(dumps[0], signal.SIGKILL)
    assert proc.p.wait(DEADLINE) == 69
    assert proc.err.wait_for(r"mitmdump \(pid \d+\) exited with code -9", deadline=10)


def test_mitmdump_dies_with_the_gateway_killed_by_sigkill(procs, tmp_path, certs, upstream):
    proc, info = start_intercept(procs, tmp_path, certs, {"api.anthropic.com": upstream})
    dumps = mitmdump_children(proc.p.pid)
    assert len(dumps) == 1
    os.kill(proc.p.pid, signal.SIGKILL)
    assert wait_gone(dumps[0], 10), "mitmdump outlived the gateway"


# --------------------------------------------------------------------------- packaging


def test_the_test_venv_keeps_the_sdks_it_asks_for_and_mitmproxy_lives_apart():
    """mitmproxy 11 beside the SDKs would pull them down by major versions: the test venv has
    every requirement of the test extra at the version it asks for, and no mitmproxy; the
    mitmdump of the tests is 11.x, in an environment of its own."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in requires("pvisor-replay") or []]
    test = [r for r in reqs if r.marker is not None and r.marker.evaluate({"extra": "test"})]
    assert {r.name for r in test} >= {"anthropic", "openai", "google-genai"}
    for r in test:
        if r.marker.evaluate({"extra": ""}):
            continue  # a base requirement
        assert r.specifier.contains(version(r.name), prereleases=True), (
            f"{r.name} {version(r.name)} not {r.specifier}"
        )
    with pytest.raises(PackageNotFoundError):
        version("mitmproxy")
    out = subprocess.run([mitmdump(), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("Mitmproxy: 11."), out


# --------------------------------------------------------------------------- the real agents


def agent_env(tmp: Path) -> dict[str, str]:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return user_env(home, PVISOR_MITMDUMP=mitmdump(), PVISOR_CA_DIR=str(tmp / "ca"))


def run_through_proxy(agent: str, tmp: Path, script: dict, task: str) -> tuple[dict, Path]:
    """``pvisor run --intercept --script`` of the pinned ``agent``: (its --json report, journal)."""
    ws = tmp / "ws"
    ws.mkdir()
    (tmp / "s.json").write_text(json.dumps(script))
    journal = tmp / "j.sqlite"
    run = pvisor(
        ["--journal", str(journal), "run", "--agent", agent, "--agent-entrypoint", str(entrypoint(agent)),
         "--intercept", "--script", str(tmp / "s.json"), "--workspace", str(ws), "--timeout", "240", "--json",
         "--", task],
        env=agent_env(tmp), cwd=tmp, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "not verified" not in run.stderr and "Traceback" not in run.stderr
    return orjson.loads(run.stdout), journal


@pytest.mark.slow
@pytest.mark.parametrize(
    "agent", ["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent"]
)
def test_each_agent_is_captured_through_intercept_mode(tmp_path, agent):
    """Each of the six agents, given HTTPS_PROXY and the CA variables of its runtime instead of
    the gateway's URL, sends its model requests to its public host through the proxy: they are
    recorded (``capture = intercept``, answered by the scripted model), the steps are derived,
    and the tools ran (the files are there)."""
    from agent_helpers import TASK, script_for

    report, journal = run_through_proxy(agent, tmp_path, script_for(agent), TASK)
    assert report["steps"] == 3 and report["tool_calls_per_step"][:2] == [1, 3], report
    assert report["intercept_proxy"].startswith("http://127.0.0.1:")
    assert sorted(p.name for p in (tmp_path / "ws").iterdir() if p.suffix == ".txt") == [
        "a.txt",
        "b.txt",
        "c.txt",
    ]
    with JournalReader(journal) as r:
        exs = r.exchanges(report["run"])
        labels = r.run(report["run"]).labels
    assert exs and {e.capture for e in exs} == {"intercept"} and labels["capture"] == "intercept"
    assert {e.served_by for e in exs} == {"scripted"}
    assert len([e for e in exs if e.role == "main"]) == 3


@pytest.mark.slow
def test_claude_code_replays_and_continues_through_intercept_mode(tmp_path, loop_thread):
    """A run captured through intercept mode is replayed through it (``--replay-only
    --intercept``: the tool re-run, the agent ended at request N+1 by playback), and continued
    (``--intercept --upstream``: the public host redirected to a live model server, which gets
    request N+1)."""
    script = {"turns": [{"text": "Writing.",
                         "tool_calls": [{"tool": "@shell", "command": "echo hi > hello.txt"}]},
                        {"text": "Done."}]}  # fmt: skip
    report, journal = run_through_proxy("claude-code", tmp_path, script, "write hello.txt")
    assert (tmp_path / "ws" / "hello.txt").read_text() == "hi\n"
    exe = str(entrypoint("claude-code"))
    env = agent_env(tmp_path)

    def replay(name: str, *extra: str) -> dict:
        ws = tmp_path / name
        ws.mkdir()
        rep = pvisor(
            ["--journal", str(journal), "replay", "--agent", "claude-code", "--agent-entrypoint", exe,
             "--run", report["run"], "--after-step", "1", "--intercept", "--workspace", str(ws),
             "--output", str(tmp_path / f"out-{name}"), *extra],
            env=env, cwd=tmp_path, timeout=300,
        )  # fmt: skip
        assert rep.returncode == 0, rep.stderr
        assert (ws / "hello.txt").read_text() == "hi\n"
        return json.loads((tmp_path / f"out-{name}" / "result.json").read_text())

    only = replay("ws-replay", "--replay-only")
    assert only["mode"] == "replay-only" and (tmp_path / "out-ws-replay" / "prefix.json").stat().st_size > 0
    live_server = ScriptedModelServer(ScriptedModel(parse_script({"turns": [{"text": "Live."}]}, "live")))
    live_url = loop_thread.run(live_server.start())
    try:
        cont = replay("ws-live", "--upstream", live_url, "--max-steps", "2")
    finally:
        loop_thread.run(live_server.stop())
    assert cont["mode"] == "continuation" and live_server.requests >= 1
    with JournalReader(journal) as r:
        derived = {run: r.exchanges(run) for run in (only["derived_run"], cont["derived_run"])}
    for exs in derived.values():
        assert exs and {e.capture for e in exs} == {"intercept"}
    assert {e.served_by for e in derived[only["derived_run"]]} == {"playback"}
    live = [e for e in derived[cont["derived_run"]] if "live" in e.flags]
    assert live and {e.served_by for e in live} == {"upstream"}


@pytest.mark.slow
def test_the_offline_example_of_docs_intercept_runs_as_written(tmp_path):
    """docs/intercept.md "Try it offline": the command as written (agents.md's turns.json), with
    the pinned Claude Code first on PATH: the file is made and every exchange is intercepted."""
    import re
    import sys

    docs = Path(__file__).resolve().parents[1] / "docs"
    [script] = re.findall(r"```json\n(.*?)```", (docs / "agents.md").read_text(), flags=re.S)
    commands = [
        line[2:]
        for block in re.findall(r"```console\n(.*?)```", (docs / "intercept.md").read_text(), flags=re.S)
        for line in block.splitlines()
        if line.startswith("$ ")
    ]
    assert len(commands) == 1 and "--intercept" in commands[0]
    (tmp_path / "turns.json").write_text(script)
    env = agent_env(tmp_path)
    env.update(
        PATH=os.pathsep.join(
            [str(entrypoint("claude-code").parent), os.path.dirname(sys.executable), env["PATH"]]
        ),
        PVISOR_JOURNAL=str(tmp_path / "data" / "j.sqlite"),
    )
    proc = subprocess.run(
        ["bash", "-c", commands[0]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ws" / "hello.txt").read_text() == "hello\n"
    with JournalReader(tmp_path / "data" / "j.sqlite") as r:
        exs = r.exchanges()
    assert exs and {e.capture for e in exs} == {"intercept"}


def test_a_ca_directory_of_another_user_is_refused(tmp_path):
    """The CA's key must stay private: a --confdir that belongs to someone else is exit 65, and
    nothing is created in it."""
    if os.geteuid() != 0:
        from conftest import cannot_run_here

        cannot_run_here("giving a directory to another user needs root")
    other = tmp_path / "theirs"
    other.mkdir()
    os.chown(other, 65534, 65534)
    env = {**ENV, "PVISOR_MITMDUMP": mitmdump()}
    p = subprocess.run(
        [*PVISOR, "ca", "path", "--confdir", str(other)], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 65 and "belongs to another user" in p.stderr and "Traceback" not in p.stderr
    assert list(other.iterdir()) == []


def test_the_intercept_benchmark_runs_its_four_paths(tmp_path):
    """bench/intercept_latency.py, reduced to a few requests: it measures the four paths and
    writes the ratios docs/benchmarks.md shows (the figures themselves come from its full run)."""
    import sys

    bench = Path(__file__).resolve().parents[1] / "bench" / "intercept_latency.py"
    out = tmp_path / "intercept.json"
    p = subprocess.run(
        [sys.executable, str(bench), "--mitmdump", mitmdump(), "--rounds", "1", "--requests", "3",
         "--warmup", "1", "--output", str(out)],
        env=ENV, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert [r["workload"] for r in doc["rows"]] == ["json", "stream"]
    for row in doc["rows"]:
        assert row["requests"] == 3 and set(row["p50_ms"]) == {"direct", "reverse", "mitmdump", "intercept"}
        assert row["intercept_over_mitmdump"] > 0
    assert "| json |" in p.stdout
