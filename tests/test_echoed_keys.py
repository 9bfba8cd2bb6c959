"""An upstream error that echoes the request's key, compressed as the official SDKs ask for it
(issue 35, item 2): the journal stores it decoded and cleaned of the key, the coding recorded;
the agent gets it as the upstream sent it. Through the real gateway, the official anthropic and
openai SDKs and an upstream on 127.0.0.1; the key is looked for in every form the tests know
(tests/test_journal_secrets.py ``_forms``: as sent, percent-encoded, base64) in what is stored,
decoded as a reader decodes it, in an export and in the files."""

from __future__ import annotations

import gzip
import io
import random
import subprocess
import zlib

import anthropic
import brotli
import openai
import orjson
import pytest
from aiohttp import web
from gateway_helpers import http_request
from test_gateway_cli import ENV, PVISOR
from test_journal_secrets import _forms

from pvisor.journal.content_encoding import decode_body, decode_prefix
from pvisor.journal.rows import MAX_DECODED_ERROR

try:
    from compression import zstd  # Python >= 3.14
except ImportError:
    from backports import zstd

ANTHROPIC_KEY = "sk-ant-api03-" + "EchoGz4Lr8Tv2Wx6Yb1Nc5Md9Kf3Hg7Js0Pa/+="
OPENAI_KEY = "sk-proj-" + "EchoBr9Kl2Mn6Pq0Rs3Tu7Vw1Xy5Za"
SECRETS_SENT = [ANTHROPIC_KEY, OPENAI_KEY]  # scanned for after the module too (conftest)

CODERS = {
    "gzip": lambda b: gzip.compress(b, mtime=0),
    "br": brotli.compress,
    "zstd": zstd.compress,
    "deflate": zlib.compress,
}


def echoing_upstream(coding: str):
    """An upstream that refuses every request with 401, quoting the key it got, compressed with
    ``coding`` (which the request must have asked for in ``Accept-Encoding``)."""

    async def handler(request: web.BaseRequest) -> web.Response:
        asked = {c.strip() for c in request.headers.get("Accept-Encoding", "").split(",")}
        assert coding in asked, asked
        key = request.headers.get("x-api-key") or request.headers["Authorization"].partition(" ")[2]
        body = (
            b'{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key: '
            + key.encode()
            + b'"}}'
        )
        return web.Response(
            status=401,
            body=CODERS[coding](body),
            headers={"Content-Type": "application/json", "Content-Encoding": coding},
        )

    return handler


def assert_no_key(data: bytes, key: str, where: str) -> None:
    for form in _forms(key):
        assert form not in data, f"the key ({form!r}) is in {where}"


@pytest.mark.parametrize(
    "sdk,coding",
    [("anthropic", c) for c in CODERS] + [("openai", "gzip"), ("openai", "br")],
)
def test_a_compressed_error_that_echoes_the_key_is_stored_decoded_without_it(stack, tmp_path, sdk, coding):
    up = stack.raw_upstream(echoing_upstream(coding))
    gw = stack.gateway({"anthropic": up.url, "openai": up.url}, log_file=tmp_path / "gw.log")
    if sdk == "anthropic":
        key = ANTHROPIC_KEY
        client = anthropic.Anthropic(api_key=key, base_url=gw.url, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as err:
            client.messages.create(
                model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
    else:
        key = OPENAI_KEY
        client = openai.OpenAI(api_key=key, base_url=gw.url + "/v1", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    # the agent got the upstream's answer unharmed: its SDK decoded it and read the message
    assert key in str(err.value)
    [ex] = stack.exchanges(gw)
    assert ex.status == 401 and ex.outcome == "upstream_error"
    with stack.reader(gw) as r:
        stored = r.response_body(ex, raw=True)
        out = io.BytesIO()
        r.export_jsonl(out)
    # what a reader makes of it, decoded as the stored headers say, holds no form of the key
    named = ex.response_headers.get("content-encoding")
    assert_no_key(decode_body(stored, named) if named else stored, key, "the stored body, decoded")
    assert_no_key(out.getvalue(), key, "an export")
    # stored decoded, the coding recorded in the place of content-encoding
    assert stored == (
        b'{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key: <redacted>"}}'
    )
    assert "content-encoding" not in ex.response_headers
    assert ex.response_headers["pvisor-decoded-content-encoding"] == coding
    # `journal body --response --raw` gives those stored bytes
    body = subprocess.run(
        [*PVISOR, "--journal", str(gw.journal_path), "journal", "body", ex.id, "--response", "--raw"],
        env=ENV,
        capture_output=True,
        timeout=60,
    )
    assert body.returncode == 0 and body.stdout == stored, body.stderr
    stack.lt.run(gw.gateway.stop())
    gw.journal.close()
    for f in gw.journal_path.parent.iterdir():
        assert_no_key(f.read_bytes(), key, f.name)
    assert_no_key((tmp_path / "gw.log").read_bytes(), key, "the log file")


PARTIAL_KEY = "sk-ant-api03-" + "EchoPart7Hx2Qv5Lm8Nz1Bc4Df6Gj9Kr0Ts3W"
SECRETS_SENT.append(PARTIAL_KEY)
ECHO = b'{"type":"error","error":{"message":"invalid x-api-key: ' + PARTIAL_KEY.encode() + b'"}}'
REDACTED = b'{"type":"error","error":{"message":"invalid x-api-key: <redacted>"}}'
NOISE = random.Random(35).randbytes(400_000)  # incompressible: the gzip body is as long


@pytest.mark.parametrize(
    "coding,body,cap,stored_start,flags",
    [
        # decodes past the cap (wire 1 KB, 1 MiB decoded): was stored whole decoded, uncapped
        ("gzip", gzip.compress(ECHO + b" " * (1 << 20), mtime=0), 64 << 10, REDACTED, ["truncated"]),
        # a bomb under the default cap (60 KB on the wire, 64 MiB decoded): decoded to 8 MiB only
        ("gzip", gzip.compress(ECHO + b" " * (64 << 20), mtime=0), None, REDACTED, ["truncated"]),
        # cut by the cap on the wire: the gzip prefix did not decode whole and was stored compressed
        ("gzip", gzip.compress(ECHO + NOISE, mtime=0), 64 << 10, REDACTED, ["truncated"]),
        # a br label on gzip bytes, an unknown coding: nothing decodes; was stored as it came
        ("br", gzip.compress(ECHO, mtime=0), None, b"", ["undecodable_dropped"]),
        ("compress", gzip.compress(ECHO, mtime=0), None, b"", ["undecodable_dropped"]),
    ],
    ids=["past_cap", "bomb_under_default_cap", "cut_on_wire", "wrong_label", "unknown_coding"],
)
def test_an_error_body_that_does_not_decode_whole_is_stored_decoded_in_part_or_not_at_all(
    stack, coding, body, cap, stored_start, flags
):
    """An error whose coded body does not decode whole is stored decoded as far as it decodes,
    at most ``--max-response-body``, cleaned of the key and flagged ``truncated``; one none of
    which decodes is stored empty, flagged ``undecodable_dropped``: never compressed as it came
    (gunzip gave the key back), never decoded past the cap (778 KB of gzip became 267 MB)."""

    async def handler(request: web.BaseRequest) -> web.Response:
        headers = {"Content-Type": "application/json", "Content-Encoding": coding}
        return web.Response(status=401, body=body, headers=headers)

    up = stack.raw_upstream(handler)
    gw = stack.gateway({"anthropic": up.url}, **({"max_response_body": cap} if cap else {}))
    status, _, got = http_request(gw.url, "POST", "/v1/messages", b"{}", headers={"x-api-key": PARTIAL_KEY})
    assert status == 401 and got == body  # the agent gets the answer as it came
    [ex] = stack.exchanges(gw)
    with stack.reader(gw) as r:
        stored = r.response_body(ex, raw=True) or b""
    assert list(ex.flags) == flags
    assert stored.startswith(stored_start)
    assert len(stored) <= (cap or (MAX_DECODED_ERROR if flags == ["truncated"] else len(ECHO)))
    assert "content-encoding" not in ex.response_headers
    assert ex.response_headers["pvisor-decoded-content-encoding"] == coding
    gunzipped = decode_prefix(stored, "gzip", limit=1 << 30)[0] if stored[:2] == b"\x1f\x8b" else b""
    for data in (stored, gunzipped):
        assert_no_key(data, PARTIAL_KEY, "the stored body")


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory, corpus):
    from corpus_runs import record_corpus_runs

    path = tmp_path_factory.mktemp("continuation") / "j.sqlite"
    return path, record_corpus_runs(corpus, path)


CONTINUATION_KEY = "sk-proj-" + "EchoLive5Zr8KvT1nWx3BdL9mYc2PjF7"
SECRETS_SENT.append(CONTINUATION_KEY)


def test_a_continuation_stores_a_compressed_echo_of_the_live_key_without_it(stack, corpus_journal):
    """A continuation forwards request N+1 of a recorded Codex run to the live model with the
    key the agent has from its environment; the live model refuses it, quoting it, gzip-
    compressed as the agent asked: the journal keeps the decoded error without the key."""
    from gateway_helpers import http_request

    from pvisor.adapters.agents import get_descriptor
    from pvisor.replay.continuation import ContinuationResponder, LivePolicy
    from pvisor.replay.playback import PathRewrites
    from pvisor.replay.recording import journal_recording

    journal, lines = corpus_journal
    rec = journal_recording(journal, "codex-parallel", "codex", 1, None)
    p = ContinuationResponder(rec, 1, get_descriptor("codex"), PathRewrites([]), LivePolicy())
    up = stack.raw_upstream(echoing_upstream("gzip"))
    gw = stack.gateway({"openai": up.url}, responder=p, name="continuation")
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {CONTINUATION_KEY}",
        "Accept-Encoding": "gzip, deflate, br, zstd",
    }
    for line, want in zip(lines["codex-parallel"][:2], (200, 401)):
        body = orjson.dumps(line.line["body"])
        status, _, _ = http_request(gw.url, "POST", line.line["path"], body, headers=headers)
        assert status == want
    [(_, _, sent, _)] = up.requests
    assert sent["Authorization"] == f"Bearer {CONTINUATION_KEY}"  # the live model got the key
    served, live = stack.exchanges(gw)
    assert (served.served_by, live.served_by, live.status) == ("playback", "upstream", 401)
    with stack.reader(gw) as r:
        stored = r.response_body(live, raw=True)
    named = live.response_headers.get("content-encoding")
    assert_no_key(decode_body(stored, named) if named else stored, CONTINUATION_KEY, "the stored body")
    assert b"invalid x-api-key: <redacted>" in stored
    assert live.response_headers["pvisor-decoded-content-encoding"] == "gzip"
