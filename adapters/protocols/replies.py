"""Answers in a wire protocol: an action, a minimal reply, a token count, a local answer.

What playback (:mod:`pvisor.replay.playback`) and the scripted model
(:mod:`pvisor.gateway.scripted_model`) send back is made here, as a :class:`Reply`: ``status``,
``headers``, body ``chunks`` (one per write). The gateway turns a :class:`Reply` into the
responder seam's answer (:func:`pvisor.gateway.responder.serve_reply` -> ``Serve``); this module
stays below the gateway and knows nothing of it.

- :func:`render_reply`: an :class:`~pvisor.journal.model.Action` as protocol ``mod``'s 200 reply,
  an event stream or one JSON body (the protocol's ``action_to_response`` and ``render_stream``).
- :func:`minimal_reply`: a valid answer to any request (a reply of a short text, no tool call).
- :func:`token_count_reply`: a token count in the protocol's shape (its ``TOKEN_COUNT_FIELD``).
- :func:`local_reply`: what no protocol owns (a model listing, a reachability probe, a 404).
- :func:`error_payload`: the protocol's JSON error body for a status and a message.

Ids come from :class:`~pvisor.adapters.protocols.base.IdSource` seeded by the caller: the same
action and seed give the same bytes. Errors: BadInputError for a model-API body that does not
parse (:func:`minimal_reply`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import orjson

from pvisor.adapters.protocols import protocol_for_path
from pvisor.adapters.protocols.base import IdSource, loads_object
from pvisor.journal.model import Action


@dataclass(slots=True)
class Reply:
    """What to send back: ``status``, ``headers``, body ``chunks`` (one per write), ``delay_s``
    (seconds to wait before answering), ``kind`` (what answered, for the scripted model's log:
    ``turn``, ``aux``, ``after_end``, ``error``, ``local``, ``summary``)."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes]
    delay_s: float = 0.0
    kind: str = "turn"  # turn | aux | after_end | error | local | summary


def local_reply(method: str, path: str, model: str) -> Reply:
    """The answer to a request no protocol owns: a model listing for ``GET .../models``, a
    plain 200 for ``GET /`` and ``HEAD /`` (reachability probes), else 404."""
    if path.rstrip("/").endswith("/models") and method == "GET":
        listing = {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "pvisor",
                    "type": "model",
                    "display_name": model,
                }
            ],
            "models": [{"name": f"models/{model}", "displayName": model}],
        }
        return Reply(200, {"Content-Type": "application/json"}, [orjson.dumps(listing)], kind="local")
    if path == "/" and method in ("GET", "HEAD"):
        return Reply(200, {"Content-Type": "text/plain"}, [b"pvisor scripted model\n"], kind="local")
    return Reply(
        404,
        {"Content-Type": "application/json"},
        [
            orjson.dumps(
                {
                    "error": {
                        "type": "not_found",
                        "message": f"the scripted model does not serve {method} {path}",
                    }
                }
            )
        ],
        kind="local",
    )


def error_payload(path: str, status: int, message: str) -> bytes:
    """The JSON error body of the protocol serving ``path`` (all carry ``error.message``, which
    the SDKs show), or a generic ``{"error": {...}}`` elsewhere."""
    mod = protocol_for_path(path)
    if mod is not None:
        return mod.error_body(status, message)
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return orjson.dumps({"error": {"type": kind, "message": message}})


def render_reply(
    mod: Any,
    action: Action,
    *,
    model: str,
    stream: bool,
    seed: int,
    chunk_events: int = 1,
    final: dict | None = None,
) -> Reply:
    """``action`` as the 200 reply of protocol module ``mod``: an event stream (``chunk_events``
    events per chunk) when ``stream``, else one JSON body. Ids come from ``IdSource(seed)``:
    the same action and seed give the same bytes. ``final``: that final response object, when
    the caller has made it already (it is not made twice)."""
    if final is None:
        final = mod.action_to_response(action, model=model, ids=IdSource(seed))
    if stream:
        return Reply(
            200,
            {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            split_events(mod.render_stream(final), chunk_events),
        )
    return Reply(200, {"Content-Type": "application/json"}, [orjson.dumps(final)])


def token_count_reply(mod: ModuleType, body: bytes) -> Reply:
    """A token count (a quarter of the body's bytes, at least 1) in the shape of protocol
    module ``mod`` (its ``TOKEN_COUNT_FIELD``: Gemini ``totalTokens``, Anthropic
    ``input_tokens``), for a path its ``counts_tokens`` accepts."""
    field = mod.TOKEN_COUNT_FIELD
    return Reply(
        200,
        {"Content-Type": "application/json"},
        [orjson.dumps({field: max(1, len(body) // 4)})],
        kind="local",
    )


def minimal_reply(
    method: str,
    path: str,
    query: str,
    body: bytes,
    *,
    text: str = "OK",
    model: str = "mock-model",
    seed: int = 0,
) -> Reply:
    """A minimal valid answer to any request: a token count for token-count paths, a reply of
    ``text`` (no tool call) in the protocol of a model-API path (streamed when asked), else
    :func:`local_reply`. Raises BadInputError for a model-API body that does not parse."""
    mod = protocol_for_path(path)
    if mod is None:
        return local_reply(method, path, model)
    if mod.counts_tokens(path):
        return token_count_reply(mod, body)
    obj = loads_object(body) if body else {}
    conv = mod.parse_request(obj, path=path, query=query)
    reply = render_reply(
        mod,
        Action(text=text),
        model=conv.model or model,
        stream=mod.wants_stream(path, query, obj),
        seed=seed,
    )
    reply.kind = "aux"
    return reply


def split_events(data: bytes, per_chunk: int) -> list[bytes]:
    """Split an event stream into chunks of ``per_chunk`` events (on blank lines)."""
    sep = b"\r\n\r\n" if b"\r\n\r\n" in data[:4096] else b"\n\n"
    events = [e + sep for e in data.split(sep) if e]
    if not data.endswith(sep) and events:
        events[-1] = events[-1][: -len(sep)]
    return [b"".join(events[i : i + per_chunk]) for i in range(0, len(events), per_chunk)] or [data]


__all__ = [
    "Reply",
    "error_payload",
    "local_reply",
    "minimal_reply",
    "render_reply",
    "split_events",
    "token_count_reply",
]
