"""Answers in a wire protocol (adapters/protocols/replies.py) crossing the responder seam: a reply
made for each protocol's path becomes a ``Serve`` by ``gateway.responder.serve_reply`` and reads
back with that protocol's own parser; a token count has the shape its protocol module states
(``TOKEN_COUNT_FIELD``), with no branch on a protocol anywhere else."""

from __future__ import annotations

import orjson
import pytest

from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol, protocol_for_path
from pvisor.adapters.protocols.replies import minimal_reply, render_reply
from pvisor.gateway.responder import Serve, ServedBy, serve_reply
from pvisor.journal.model import Action, ToolCall

#: protocol -> (reply path, streamed reply path and query, a request body)
REQUESTS = {
    "anthropic": (
        "/v1/messages",
        ("/v1/messages", ""),
        {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "openai-chat": (
        "/v1/chat/completions",
        ("/v1/chat/completions", ""),
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    "openai-responses": ("/v1/responses", ("/v1/responses", ""), {"model": "m", "input": "hi"}),
    "gemini": (
        "/v1beta/models/m:generateContent",
        ("/v1beta/models/m:streamGenerateContent", "alt=sse"),
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    ),
}
#: protocol -> its token-count path, for the protocols that have one
COUNT_PATHS = {"anthropic": "/v1/messages/count_tokens", "gemini": "/v1beta/models/m:countTokens"}


def _read(serve: Serve, mod) -> Action:
    if serve.streamed:
        return mod.response_to_action(mod.reassemble(list(serve.chunks or [serve.body])).final)
    return mod.response_to_action(orjson.loads(serve.body))


@pytest.mark.parametrize("protocol", list(PROTOCOL_MODULES))
def test_a_minimal_reply_crosses_the_seam_and_reads_back_in_its_protocol(protocol):
    path, (stream_path, query), body = REQUESTS[protocol]
    mod = get_protocol(protocol)
    assert protocol_for_path(path) is mod
    plain = serve_reply(minimal_reply("POST", path, "", orjson.dumps(body)), ServedBy.PLAYBACK, ("x",))
    assert (plain.status, plain.streamed, plain.served_by, plain.flags) == (
        200,
        False,
        ServedBy.PLAYBACK,
        ("x",),
    )
    assert _read(plain, mod).text == "OK"
    streamed_body = dict(body, stream=True) if protocol != "gemini" else body
    streamed = serve_reply(
        minimal_reply("POST", stream_path, query, orjson.dumps(streamed_body), text="streamed"),
        ServedBy.SCRIPTED,
    )
    assert streamed.status == 200 and streamed.streamed
    assert ("Content-Type", "text/event-stream") in streamed.headers
    assert _read(streamed, mod).text == "streamed"


@pytest.mark.parametrize("protocol", list(PROTOCOL_MODULES))
def test_an_action_rendered_in_a_protocol_is_the_same_bytes_for_the_same_seed(protocol):
    mod = get_protocol(protocol)
    action = Action(
        text="Listing.",
        tool_calls=[
            ToolCall(id=None, name="bash", arguments_raw='{"command":"ls"}', arguments={"command": "ls"})
        ],
    )
    once = render_reply(mod, action, model="m", stream=True, seed=3, chunk_events=2)
    again = render_reply(mod, action, model="m", stream=True, seed=3, chunk_events=2)
    assert once.chunks == again.chunks and len(once.chunks) > 1
    read = _read(serve_reply(once, ServedBy.PLAYBACK), mod)
    assert read.text == "Listing." and [c.name for c in read.tool_calls] == ["bash"]
    assert read.tool_calls[0].arguments == {"command": "ls"}


@pytest.mark.parametrize("protocol", list(PROTOCOL_MODULES))
def test_a_token_count_has_the_shape_its_protocol_module_states(protocol):
    mod = get_protocol(protocol)
    if mod.TOKEN_COUNT_FIELD is None:
        assert protocol not in COUNT_PATHS and not any(mod.counts_tokens(p) for p in mod.PATHS)
        return
    path = COUNT_PATHS[protocol]
    assert mod.counts_tokens(path)
    body = orjson.dumps(REQUESTS[protocol][2])
    serve = serve_reply(minimal_reply("POST", path, "", body), ServedBy.PLAYBACK)
    assert serve.status == 200 and not serve.streamed
    assert orjson.loads(serve.body) == {mod.TOKEN_COUNT_FIELD: len(body) // 4}


def test_a_path_no_protocol_owns_gets_a_local_answer():
    listing = serve_reply(minimal_reply("GET", "/v1/models", "", b"", model="m"), ServedBy.PLAYBACK)
    assert listing.status == 200 and orjson.loads(listing.body)["data"][0]["id"] == "m"
    missing = serve_reply(minimal_reply("POST", "/nowhere", "", b""), ServedBy.PLAYBACK)
    assert missing.status == 404 and "does not serve POST /nowhere" in missing.body.decode()
