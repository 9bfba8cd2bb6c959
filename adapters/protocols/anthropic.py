"""Anthropic Messages API: ``POST /v1/messages`` (Claude Code adds ``?beta=true``) and
``POST /v1/messages/count_tokens``.

Implements the module contract of :mod:`pvisor.adapters.protocols.base`. Sources (see
the upstream sources named here and docs/agents.md):

- stream framing and event names: the Messages streaming reference (docs.anthropic.com, "Streaming
  Messages") and anthropic-sdk-python ``_streaming.py``;
- reassembly rules: anthropic-sdk-python ``lib/streaming/_messages.py::accumulate_event``;
- request shapes (``system``, ``tools``, ``tool_use``/``tool_result`` blocks): the Messages API reference;
- what changes between two requests of one agent (``cache_control`` moving): docs/agents.md (per agent).

Rendering emits compact JSON; request bodies are never re-emitted from here for recording (the
journal keeps the agent's exact bytes), only for prefixes built from canonical conversations.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from pvisor.adapters.protocols.base import (
    as_list,
    check_insert,
    compact_json,
    count_sum,
    dig,
    dumps,
    field_state,
    final_object,
    first_int,
    function_tools_only,
    IdSource,
    json_type,
    loads_object,
    no_converted_tool_raw,
    normalise_conversation,
    OMIT,
    overlay,
    parse_arguments,
    ParseMemo,
    path_unchanged,
    read_entries,
    Reassembled,
    refusal_message,
    request_parser,
    split_text,
    TokenUsage,
    tools_as_parsed,
    with_body_model,
    wrong_json,
)
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

if TYPE_CHECKING:
    from pvisor.adapters.protocols.sse import SSEEvent

NAME = "anthropic"
#: ``gen_ai.provider.name`` of the OpenTelemetry GenAI semantic conventions (exports: otel)
GEN_AI_PROVIDER = "anthropic"
#: ``gen_ai.operation.name`` of a model call of this protocol (Anthropic Messages: a chat)
GEN_AI_OPERATION = "chat"
#: the prefix of a tool call id this protocol's replies carry (a handoff names its calls with it)
CALL_ID_PREFIX = "toolu_"
PATHS: tuple[str, ...] = ("/v1/messages", "/v1/messages/count_tokens")
#: the wire-protocol facts (:class:`~pvisor.adapters.protocols.contract.WireProtocol` says what each
#: means)
TITLE = "Anthropic"
DEFAULT_TARGET = ("POST", "/v1/messages", "")
UNSTREAMED_TARGET = DEFAULT_TARGET
MODEL_IN_PATH = False
ENTRIES_KEY = "messages"
RESULTS_ROLE = "user"
#: a tool_result's content takes ``image`` blocks (a handoff keeps an image B's re-run reads)
TOOL_RESULT_IMAGES = True
#: reasoning travels in blocks of its own (``thinking``, ``redacted_thinking``): a handoff with
#: ``--source-reasoning keep`` can serve them unchanged beside another agent's calls
STANDALONE_REASONING = True
TOOL_SCHEMA_REQUIRED = True  # ``input_schema`` is required
#: ``max_tokens`` of a render without a profile (the API requires one): Claude Code's own for its
#: default model (32000, seen in its requests)
DEFAULT_MAX_TOKENS = 32000
REQUIRED_PARAMS: dict[str, Any] = {"max_tokens": DEFAULT_MAX_TOKENS}
#: a thinking block needs a signature of its own: reasoning of another protocol has none
SIGNED_REASONING = True
CACHE_MARKERS = True
#: how the prompt cache reuses an earlier request's prompt (``pvisor diff``,
#: :mod:`pvisor.adapters.request_diff`): the prompt is read tools, system, messages, and a
#: ``cache_control`` block is a breakpoint that caches the prefix up to and including it; a later
#: request reads the cache only at its own breakpoints, each looking back about
#: ``lookback_blocks`` content blocks for a prefix cached at an earlier request's breakpoint
#: before its first change (prompt caching guide,
#: https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching: "tools, system,
#: messages" order, at most 4 breakpoints, "How automatic prefix checking works": "up to
#: approximately 20 blocks before your explicit breakpoint", 1,024 tokens at least on most
#: models); the cached count is the reply's ``usage.cache_read_input_tokens``. The guide's "What
#: invalidates the cache": a change of these top-level parameters, or images added or removed,
#: invalidates the messages' cache while tools and system stay cached
PROMPT_CACHE: dict[str, Any] = {
    "rule": "breakpoints",
    "marker": "cache_control",
    "min_tokens": 1024,
    "increment_tokens": None,
    "lookback_blocks": 20,
    "messages_invalidated_by": ("tool_choice", "thinking"),
    "messages_invalidated_by_blocks": ("image",),
    "usage_field": "cache_read_input_tokens",
    "source": "https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching",
}
#: where a request carries its credential (lower-case header names; query parameter names): an
#: API key in ``x-api-key``, an auth token (``ANTHROPIC_AUTH_TOKEN``, OAuth) as
#: ``authorization: Bearer`` (the Messages API reference, "Authentication"; anthropic-sdk-python
#: ``_client.py`` ``auth_headers``)
CREDENTIAL_HEADERS: tuple[str, ...] = ("x-api-key", "authorization")
CREDENTIAL_QUERY: tuple[str, ...] = ()
path_for_model = path_unchanged
converted_tool_raw = no_converted_tool_raw
# the model is the body's ``model`` field; the path is unchanged
with_model = with_body_model
offered_tools = tools_as_parsed
tool_kind = function_tools_only

# Block types whose input arrives as input_json_delta (the SDK's ``accumulate_event``).
_TOOL_BLOCKS = ("tool_use", "server_tool_use", "mcp_tool_use")
# Keys of the request body that have canonical fields; everything else goes to params.
_CANONICAL_KEYS = ("model", "system", "tools", "messages", "stream")
# Size of the pieces render_stream cuts text, thinking and tool input into.
_PIECE = 64

_ANTHROPIC_STOP = frozenset(
    {
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    }
)
_STOP_FROM_OTHER = {
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "MAX_TOKENS": "max_tokens",
    "max_output_tokens": "max_tokens",
    "content_filter": "refusal",
    "SAFETY": "refusal",
}

_ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# --------------------------------------------------------------------------- routing


def matches(path: str) -> bool:
    """True for ``/v1/messages`` and ``/v1/messages/count_tokens`` (path without query string)."""
    return path in PATHS


def counts_tokens(path: str) -> bool:
    """True for ``/v1/messages/count_tokens``: a request that carries a conversation but asks
    for a token count, not a reply (the chain rule leaves it out of every chain)."""
    return path == "/v1/messages/count_tokens"


def wants_stream(path: str, query: str, body: Any) -> bool:
    """True when the body (bytes or parsed dict) has ``"stream": true``; a body that does not
    parse asks for no stream. ``count_tokens`` never streams."""
    if path.endswith("/count_tokens"):
        return False
    try:
        obj = loads_object(body)
    except BadInputError:
        return False
    return obj.get("stream") is True


# --------------------------------------------------------------------------- requests


def _system_text(system: Any) -> str | None:
    """``system`` as text: the string itself, or the text blocks joined with ``"\\n\\n"``."""
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(
            b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text"
        )
    raise wrong_json("field 'system'", system, "a string or a list of blocks")


def _parse_block(block: Any, where: str) -> Any:
    if not isinstance(block, dict):
        raise wrong_json(where, block, "a content block object")
    kind = block.get("type")
    if kind == "text":
        return TextPart(text=block.get("text") or "", raw=block)
    if kind == "thinking":
        return Reasoning(text=block.get("thinking") or "", signature=block.get("signature"), raw=block)
    if kind == "redacted_thinking":
        return Reasoning(text="", encrypted=block.get("data"), raw=block)
    if kind in _TOOL_BLOCKS:
        inp = block.get("input")
        return ToolCall(
            id=block.get("id"),
            name=block.get("name") or "",
            arguments_raw=compact_json(inp if inp is not None else {}),
            arguments=inp if inp is not None else {},
            kind="function" if kind == "tool_use" else "server",
            raw=block,
        )
    if kind == "tool_result":
        is_error = block.get("is_error")
        return ToolResult(
            call_id=block.get("tool_use_id"),
            content=block.get("content"),
            is_error=is_error if isinstance(is_error, bool) else None,
            raw=block,
        )
    return OtherPart(kind=str(kind) if kind is not None else "unknown", raw=block)


def _parse_message(m: Any, i: int) -> Message:
    if not isinstance(m, dict):
        raise wrong_json(f"messages[{i}]", m, "an object")
    role = m.get("role")
    if not isinstance(role, str):
        raise BadInputError(f"request body messages[{i}] has no string 'role'")
    content = m.get("content")
    if isinstance(content, str):
        parts: list[Any] = [TextPart(text=content)]
    elif isinstance(content, list):
        parts = [_parse_block(b, f"messages[{i}].content[{j}]") for j, b in enumerate(content)]
    elif content is None:
        parts = []
    else:
        raise wrong_json(f"messages[{i}].content", content, "a string or a list of blocks")
    return Message(role=role, parts=parts, raw=m)


def _parse_tool(t: Any, i: int) -> ToolSpec:
    if not isinstance(t, dict):
        raise wrong_json(f"tools[{i}]", t, "an object")
    return ToolSpec(
        name=t.get("name") or "", description=t.get("description"), parameters=t.get("input_schema"), raw=t
    )


@request_parser("Anthropic Messages")
def parse_request(
    body: Any, *, path: str = "", query: str = "", memo: ParseMemo | None = None
) -> Conversation:
    """Read a Messages (or count_tokens) request body into a :class:`Conversation`.

    Args:
        body: the request body, bytes/str of JSON or an already parsed dict.
        path, query: unused (the model is in the body); accepted for the common contract.
        memo: a :class:`~pvisor.adapters.protocols.base.ParseMemo` shared by the requests of one
            session: a message read before is not read again.

    Returns:
        ``Conversation(protocol="anthropic")``: ``system`` is the string, or the text blocks
        joined with ``"\\n\\n"``; ``system_raw`` is ``system`` exactly as sent. ``messages`` keep
        their role (``user``/``assistant``; tool results stay inside ``user`` messages, as on the
        wire). Block mapping (Messages API content blocks): ``text`` -> TextPart; ``thinking`` ->
        Reasoning(text, signature); ``redacted_thinking`` -> Reasoning(encrypted=data);
        ``tool_use`` -> ToolCall (``arguments_raw`` = compact JSON of ``input``, the documented
        choice for object-carrying protocols in model.py); ``server_tool_use``/``mcp_tool_use``
        -> ToolCall(kind="server"); ``tool_result`` -> ToolResult (content exact, ``is_error``
        True/False/None as sent); anything else (image, document, ...) -> OtherPart. A string
        content becomes one TextPart with ``raw=None``. Every other top-level key goes into
        ``params`` in body order.

    Raises:
        BadInputError: the body is not a JSON object, or ``messages``/``tools``/a block has the
        wrong JSON type (the message names the field).
    """
    obj = loads_object(body)
    messages = obj.get("messages", [])
    if not isinstance(messages, list):
        raise wrong_json("field 'messages'", messages, "a list")
    tools = obj.get("tools", [])
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise wrong_json("field 'tools'", tools, "a list")
    model = obj.get("model")
    system = obj.get("system")
    return Conversation(
        protocol=NAME,
        model=model if isinstance(model, str) else None,
        system=_system_text(system),
        system_raw=system,
        tools=[_parse_tool(t, i) for i, t in enumerate(tools)],
        messages=read_entries(memo, messages, _parse_message),
        stream=obj.get("stream") is True,
        params={k: v for k, v in obj.items() if k not in _CANONICAL_KEYS},
    )


#: the first system text block a client sends to Anthropic's own host for billing attribution:
#: ``x-anthropic-billing-header: cc_version=...; cch=<hash>; ...;``, its hash new in every request
#: (Claude Code 2.1.332 without ANTHROPIC_BASE_URL, seen through intercept mode)
_BILLING_BLOCK = re.compile(r"\Ax-anthropic-billing-header:[^\n]*(?:\n\n|\Z)")


def normalise(conv: Conversation) -> dict:
    """The chain rule's comparison form: :func:`base.normalise_conversation` with call ids kept
    (``toolu_`` ids are made by the server, so an agent echoes them unchanged). Moving
    ``cache_control`` markers (Claude Code, litellm; docs/agents.md) and signatures do not count, nor
    does the billing block that leads the system prompt sent to Anthropic's own host."""
    out = normalise_conversation(conv, keep_call_ids=True)
    if out["system"].startswith("x-anthropic-billing-header:"):
        out["system"] = _BILLING_BLOCK.sub("", out["system"], count=1)
    return out


def _render_system(conv: Conversation) -> Any:
    raw = conv.system_raw
    if raw is not None and conv.system is not None:
        try:
            if _system_text(raw) == conv.system:
                return raw  # exact, with cache_control on its blocks
        except BadInputError:
            pass
    return conv.system


def _tool_input(tc: ToolCall) -> Any:
    if tc.arguments is not None:
        return tc.arguments
    parsed = parse_arguments(tc.arguments_raw)
    if parsed is not None:
        return parsed
    # Free-form input (a Responses custom tool) has no object form; keep the text visible.
    return {"input": tc.arguments_raw} if tc.arguments_raw else {}


def _render_part(p: Any) -> dict:
    raw = p.raw if isinstance(p.raw, dict) else None
    if isinstance(p, TextPart):
        return overlay(raw if raw and raw.get("type") == "text" else None, {"type": "text", "text": p.text})
    if isinstance(p, Reasoning):
        if p.encrypted is not None and not p.text and p.signature is None:
            r = raw if raw and raw.get("type") == "redacted_thinking" else None
            return overlay(r, {"type": "redacted_thinking", "data": p.encrypted})
        r = raw if raw and raw.get("type") == "thinking" else None
        return overlay(
            r,
            {
                "type": "thinking",
                "thinking": p.text,
                "signature": p.signature if p.signature is not None else OMIT,
            },
        )
    if isinstance(p, ToolCall):
        r = raw if raw and raw.get("type") in _TOOL_BLOCKS else None
        kind = r["type"] if r else ("server_tool_use" if p.kind == "server" else "tool_use")
        return overlay(
            r,
            {"type": kind, "id": p.id if p.id is not None else OMIT, "name": p.name, "input": _tool_input(p)},
        )
    if isinstance(p, ToolResult):
        r = raw if raw and raw.get("type") == "tool_result" else None
        return overlay(
            r,
            {
                "type": "tool_result",
                "tool_use_id": p.call_id if p.call_id is not None else OMIT,
                "content": p.content if p.content is not None else OMIT,
                "is_error": p.is_error if p.is_error is not None else OMIT,
            },
        )
    if isinstance(p, OtherPart):
        return dict(raw) if raw is not None else {"type": p.kind}
    raise TypeError(f"not a canonical part: {p!r}")


def _render_message(m: Message) -> dict:
    raw = m.raw if isinstance(m.raw, dict) else None
    role = m.role if m.role in ("user", "assistant") else "user"
    parts = m.parts
    raw_content = raw.get("content") if raw is not None else None
    if (
        len(parts) == 1
        and isinstance(parts[0], TextPart)
        and parts[0].raw is None
        and not isinstance(raw_content, list)
    ):
        content: Any = parts[0].text  # a string content stays a string
    elif not parts:
        content = raw_content if isinstance(raw_content, list) else ""
    else:
        content = [_render_part(p) for p in parts]
    return overlay(raw, {"role": role, "content": content})


def _render_tool(t: ToolSpec) -> dict:
    raw = t.raw if isinstance(t.raw, dict) and "function" not in t.raw else None
    return overlay(
        raw,
        {
            "name": t.name,
            "description": t.description if t.description is not None else OMIT,
            "input_schema": t.parameters if t.parameters is not None else OMIT,
        },
    )


def render_request(conv: Conversation) -> bytes:
    """A :class:`Conversation` as a Messages request body (compact JSON bytes).

    Works from canonical fields alone; ``raw`` objects, where present and of this protocol's
    shape, only contribute provider extras (``cache_control``, ``citations``, ``type: custom``
    on tools) and their key order, canonical values always win. ``system_raw`` is used when its
    text equals ``system``. Key order: ``model``, ``messages``, ``system``, ``tools``, then
    ``params`` in order, then ``stream: true`` when ``conv.stream``. Messages of role ``tool``
    or ``system`` (from another protocol) render as ``user``.
    """
    out: dict[str, Any] = {}
    if conv.model is not None:
        out["model"] = conv.model
    out["messages"] = [_render_message(m) for m in conv.messages]
    system = _render_system(conv)
    if system is not None:
        out["system"] = system
    if conv.tools:
        out["tools"] = [_render_tool(t) for t in conv.tools]
    for k, v in conv.params.items():
        if k not in out:
            out[k] = v
    if conv.stream:
        out["stream"] = True
    return dumps(out)


# --------------------------------------------------------------------------- streams


class _Accumulator:
    """Applies the reassembly rules of the SDK's ``accumulate_event`` to decoded SSE events."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None
        self.position: dict[int, int] = {}  # event index -> position in content
        self.open: dict[int, str] = {}  # started, not stopped: index -> block type
        self.bufs: dict[int, str] = {}  # raw input_json_delta text per index
        self.complete = False
        self.error: Any = None
        self.events = 0
        self.problems: list[str] = []

    def _problem(self, n: int, kind: str | None, text: str) -> None:
        self.problems.append(f"event {n} ({kind or 'no type'}): {text}")

    def event(self, ev: SSEEvent) -> None:
        self.events += 1
        n = self.events
        for line in ev.stray:
            self._problem(n, ev.event, f"line that is not SSE ignored: {line[:80]!r}")
        if not ev.has_data:
            if ev.event is not None:
                self._problem(n, ev.event, "event without data ignored")
            return
        try:
            data = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            self._problem(n, ev.event, f"data is not JSON, ignored: {ev.data[:80]!r}")
            return
        if not isinstance(data, dict):
            self._problem(n, ev.event, f"data is a JSON {json_type(data)}, not an object; ignored")
            return
        kind = data.get("type")
        if not isinstance(kind, str):
            kind = ev.event
        elif ev.event is not None and ev.event != kind:
            self._problem(n, kind, f"SSE event name {ev.event!r} differs from data type {kind!r}")
        if self.complete and kind not in ("ping",):
            self._problem(n, kind, "event after message_stop ignored")
            return
        if kind == "ping":
            return
        if kind == "error":
            self.error = data
            return
        if kind == "message_start":
            message = data.get("message")
            if not isinstance(message, dict):
                self._problem(n, kind, "no message object; ignored")
            elif self.snapshot is not None:
                self._problem(n, kind, "second message_start ignored")
            else:
                if not isinstance(message.get("content"), list):
                    message["content"] = []
                self.snapshot = message
            return
        if kind not in (
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ):
            # unknown event types are to be ignored (the streaming reference says so); counted in events
            return
        snap = self.snapshot
        if snap is None:
            self._problem(n, kind, "before message_start; ignored")
            return
        if kind == "message_stop":
            self.complete = True
        elif kind == "message_delta":
            self._message_delta(n, kind, snap, data)
        else:
            self._block_event(n, kind, snap, data)

    def _message_delta(self, n: int, kind: str, snap: dict, data: dict) -> None:
        delta = data.get("delta")
        if isinstance(delta, dict):
            for k, v in delta.items():
                if k == "container" and v is None:
                    continue
                snap[k] = v
        usage = data.get("usage")
        if isinstance(usage, dict):
            current = snap.get("usage")
            if not isinstance(current, dict):
                current = snap["usage"] = {}
            for k, v in usage.items():
                # output_tokens is cumulative: assign, never add; the rest only when non-null
                # so the message_start values survive (SDK accumulate_event; envoy ai-gateway#2290).
                if k == "output_tokens" or v is not None:
                    current[k] = v

    def _block_event(self, n: int, kind: str, snap: dict, data: dict) -> None:
        content = snap["content"]
        index = data.get("index")
        if not isinstance(index, int):
            self._problem(n, kind, "no integer index; ignored")
            return
        if kind == "content_block_start":
            block = data.get("content_block")
            if not isinstance(block, dict):
                self._problem(n, kind, f"index {index}: no content_block object; ignored")
                return
            if index != len(content):
                self._problem(n, kind, f"index {index} at content position {len(content)}")
            if index in self.position:
                self._problem(n, kind, f"index {index} started twice")
            self.position[index] = len(content)
            content.append(block)
            btype = block.get("type")
            self.open[index] = btype if isinstance(btype, str) else "unknown"
            if btype == "fallback":
                to = block.get("to")
                if isinstance(to, dict) and isinstance(to.get("model"), str):
                    snap["model"] = to["model"]  # beta fallback block (the SDK's ``accumulate_event``)
            return
        pos = self.position.get(index)
        if pos is None:
            self._problem(n, kind, f"index {index} was never started; ignored")
            return
        block = content[pos]
        btype = block.get("type")
        if kind == "content_block_stop":
            if index not in self.open:
                self._problem(n, kind, f"index {index} stopped twice")
                return
            del self.open[index]
            buf = self.bufs.get(index)
            if buf:  # an empty buffer leaves input as the start gave it (usually {})
                try:
                    block["input"] = orjson.loads(buf)
                except orjson.JSONDecodeError:
                    self._problem(
                        n,
                        kind,
                        f"index {index}: tool input is not valid JSON ({len(buf)} chars); "
                        "input left as started",
                    )
            return
        if index not in self.open:
            self._problem(n, kind, f"index {index}: delta after content_block_stop")
        delta = data.get("delta")
        if not isinstance(delta, dict):
            self._problem(n, kind, f"index {index}: no delta object; ignored")
            return
        dtype = delta.get("type")
        if dtype == "text_delta" and btype == "text":
            block["text"] = (block.get("text") or "") + str(delta.get("text", ""))
        elif dtype == "input_json_delta":
            self.bufs[index] = self.bufs.get(index, "") + str(delta.get("partial_json", ""))
        elif dtype == "thinking_delta" and btype == "thinking":
            block["thinking"] = (block.get("thinking") or "") + str(delta.get("thinking", ""))
        elif dtype == "signature_delta" and btype == "thinking":
            block["signature"] = delta.get("signature")  # assign, not append
        elif dtype == "citations_delta" and btype == "text":
            citations = block.get("citations")
            if not isinstance(citations, list):
                citations = block["citations"] = []
            citations.append(delta.get("citation"))
        elif dtype == "compaction_delta":
            for k in ("content", "encrypted_content"):
                if k in delta:
                    block[k] = delta[k]
        else:
            self._problem(n, kind, f"index {index}: delta type {dtype!r} on a {btype!r} block ignored")

    def result(self) -> Reassembled:
        for index, btype in self.open.items():
            buf = self.bufs.get(index)
            if buf:
                self.problems.append(
                    f"content block {index} ({btype}) has no content_block_stop: its input JSON "
                    f"({len(buf)} chars) was left unparsed, input kept as the block start gave it"
                )
            else:
                self.problems.append(f"content block {index} ({btype}) has no content_block_stop")
        return Reassembled(
            final=self.snapshot,
            complete=self.complete,
            events=self.events,
            error=self.error,
            problems=self.problems,
            tool_input_raw=dict(self.bufs),
        )


def reassemble(chunks: Iterable[bytes] | bytes) -> Reassembled:
    """Reassemble a raw Messages event stream (byte chunks split anywhere) into the final
    ``message`` object, the same shape a non-streamed request returns.

    Rules (anthropic-sdk-python ``accumulate_event``): ``message_start``
    gives the snapshot; ``content_block_start`` appends (an index other than the position is
    reported; deltas are routed by index anyway); ``text_delta``/``thinking_delta`` append;
    ``signature_delta`` assigns; ``input_json_delta`` is collected per block as raw text and
    parsed at ``content_block_stop`` (an empty buffer leaves ``input`` as started, usually
    ``{}``); ``citations_delta`` appends to ``citations``; ``message_delta`` assigns its delta
    keys and usage (``output_tokens`` always, other usage fields when non-null, never added);
    ``ping`` is skipped; unknown events are ignored (counted in ``events``); ``error`` becomes
    ``Reassembled.error``; ``message_stop`` sets ``complete``. A tool block without
    ``content_block_stop`` keeps its unparsed text in ``tool_input_raw`` and is named in
    ``problems``. Never raises on bad data: unparsable events are reported in ``problems``.
    """
    # the stream code is off the request-only path (replay --prepare-only): sse loads here
    from pvisor.adapters.protocols.sse import events

    acc = _Accumulator()
    for ev in events(chunks):
        acc.event(ev)
    return acc.result()


def _event(kind: str, data: dict) -> bytes:
    from pvisor.adapters.protocols.sse import encode_event  # off the request-only path

    return encode_event(dumps(data), kind)


def render_stream(final: dict, *, piece: int = _PIECE) -> bytes:
    """A final ``message`` object as a Messages event stream (``event: <type>\\ndata: <json>\\n\\n``).

    Sequence (the streaming reference): ``message_start`` (the message with empty ``content``,
    ``stop_reason``/``stop_sequence`` null, ``usage`` of the final), one ``ping``, per block
    ``content_block_start`` + deltas + ``content_block_stop`` (text as ``text_delta``, citations
    as ``citations_delta``, thinking as ``thinking_delta`` then one ``signature_delta``, tool
    blocks as ``input_json_delta`` of the compact input JSON, other blocks whole in the start),
    ``message_delta`` (stop reason, stop sequence, usage), ``message_stop``. Text is cut into
    pieces of ``piece`` characters. Reassembling the output gives ``final`` back (equal dicts).
    """
    final_object(final, "Anthropic")
    out: list[bytes] = []
    start = dict(final)
    start["content"] = []
    for k in ("stop_reason", "stop_sequence"):
        if k in start:
            start[k] = None
    out.append(_event("message_start", {"type": "message_start", "message": start}))
    out.append(_event("ping", {"type": "ping"}))
    for index, block in enumerate(final.get("content") or []):
        deltas: list[dict] = []
        head = dict(block)
        btype = block.get("type")
        if btype == "text" and isinstance(block.get("text"), str):
            head["text"] = ""
            deltas += [{"type": "text_delta", "text": p} for p in split_text(block["text"], piece)]
            if isinstance(block.get("citations"), list):
                head["citations"] = []
                deltas += [{"type": "citations_delta", "citation": c} for c in block["citations"]]
        elif btype == "thinking" and isinstance(block.get("thinking"), str):
            head["thinking"] = ""
            deltas += [
                {"type": "thinking_delta", "thinking": p} for p in split_text(block["thinking"], piece)
            ]
            sig = block.get("signature")
            if isinstance(sig, str) and sig:
                head["signature"] = ""
                deltas.append({"type": "signature_delta", "signature": sig})
        elif btype in _TOOL_BLOCKS and "input" in block and block["input"] != {}:
            head["input"] = {}
            deltas += [
                {"type": "input_json_delta", "partial_json": p}
                for p in split_text(compact_json(block["input"]), piece)
            ]
        out.append(
            _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": head}
            )
        )
        for d in deltas:
            out.append(
                _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            )
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta_event: dict[str, Any] = {
        "type": "message_delta",
        "delta": {k: final[k] for k in ("stop_reason", "stop_sequence") if k in final},
    }
    usage = final.get("usage")
    if isinstance(usage, dict):
        delta_event["usage"] = {
            k: v
            for k, v in usage.items()
            if v is not None
            and k
            in (
                "output_tokens",
                "input_tokens",
                "cache_creation_input_tokens",
                "cache_read_input_tokens",
                "server_tool_use",
            )
        }
    out.append(_event("message_delta", delta_event))
    out.append(_event("message_stop", {"type": "message_stop"}))
    return b"".join(out)


# --------------------------------------------------------------------------- actions


def response_to_action(final: dict) -> Action:
    """Read a final ``message`` object as an :class:`Action`.

    ``text``: the text blocks concatenated (no separator); ``reasoning``: ``thinking`` blocks
    (text + signature) and ``redacted_thinking`` blocks (``encrypted`` = data), in order;
    ``tool_calls``: ``tool_use`` blocks (kind ``function``) and ``server_tool_use`` /
    ``mcp_tool_use`` blocks (kind ``server``), ``arguments_raw`` = compact JSON of ``input``
    (the protocol carries an object; model.py's documented choice, and what a request echoes
    back parses equal); ``usage``, ``stop_reason``, ``model``; ``raw`` = ``final``.
    """
    final_object(final, "Anthropic")
    text: list[str] = []
    reasoning: list[Reasoning] = []
    calls: list[ToolCall] = []
    for block in final.get("content") or []:
        if not isinstance(block, dict):
            continue
        btype = block.get("type")
        if btype == "text":
            text.append(block.get("text") or "")
        elif btype in ("thinking", "redacted_thinking"):
            part = _parse_block(block, "content")
            reasoning.append(part)
        elif btype in _TOOL_BLOCKS:
            calls.append(_parse_block(block, "content"))
    usage = final.get("usage")
    return Action(
        text="".join(text),
        reasoning=reasoning,
        tool_calls=calls,
        usage=usage if isinstance(usage, dict) else None,
        stop_reason=final.get("stop_reason"),
        model=final.get("model"),
        raw=final,
    )


def _usage(usage: dict | None) -> dict:
    """Usage in Anthropic's shape. Messages/Responses names pass through; Chat and Gemini counts
    are renamed. Always present: the SDK's ``Message.usage`` is required."""
    if not usage:
        return {"input_tokens": 0, "output_tokens": 0}
    if "input_tokens" in usage and "output_tokens" in usage:
        return dict(usage)
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        return {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
        }
    if "promptTokenCount" in usage or "candidatesTokenCount" in usage:
        return {
            "input_tokens": usage.get("promptTokenCount") or 0,
            "output_tokens": usage.get("candidatesTokenCount") or 0,
        }
    return {"input_tokens": usage.get("input_tokens") or 0, "output_tokens": usage.get("output_tokens") or 0}


def _stop_reason(action: Action) -> str:
    sr = action.stop_reason
    if sr in _ANTHROPIC_STOP:
        return sr  # type: ignore[return-value]
    if sr in _STOP_FROM_OTHER:
        return _STOP_FROM_OTHER[sr]
    return "tool_use" if action.tool_calls else "end_turn"


def action_to_response(action: Action, *, model: str | None = None, ids: IdSource | None = None) -> dict:
    """An :class:`Action` as a final ``message`` object (what a non-streamed request returns;
    :func:`render_stream` turns it into a stream).

    Shape: ``{"id": ids.next("msg_"), "type": "message", "role": "assistant", "model",
    "content": [thinking/redacted_thinking..., text, tool_use...], "stop_reason",
    "stop_sequence": null, "usage"}``. Reasoning renders as ``thinking`` blocks (``signature``
    as given, ``""`` when none, since the SDK requires the field) or, for encrypted reasoning
    without text, ``redacted_thinking``. Tool calls keep the action's call id when it has one, so
    the agent's next request echoes the id the recorded conversation has (the chain rule keeps
    call ids for this protocol); a missing id is drawn from ``ids.next("toolu_")``. ``input``
    is ``arguments`` (or ``arguments_raw`` parsed). ``stop_reason``: the action's if it is an
    Anthropic value, mapped from other protocols' values, else ``tool_use``/``end_turn``.
    ``usage`` is always present (zeros when the action has none). ``model`` defaults to
    ``action.model``. Deterministic for a given ``IdSource`` seed.
    """
    ids = ids if ids is not None else IdSource()
    msg_id = ids.next("msg_")
    content: list[dict] = []
    for r in action.reasoning:
        if r.encrypted is not None and not r.text and r.signature is None:
            content.append({"type": "redacted_thinking", "data": r.encrypted})
        else:
            content.append({"type": "thinking", "thinking": r.text, "signature": r.signature or ""})
    if action.text:
        content.append({"type": "text", "text": action.text})
    for tc in action.tool_calls:
        content.append(
            {
                "type": "server_tool_use" if tc.kind == "server" else "tool_use",
                "id": tc.id or ids.next("toolu_"),
                "name": tc.name,
                "input": _tool_input(tc),
            }
        )
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model or action.model or "unknown",
        "content": content,
        "stop_reason": _stop_reason(action),
        "stop_sequence": None,
        "usage": _usage(action.usage),
    }


def reply_problem(final: Any) -> str | None:
    """Why a final ``message`` object carries no reply at all: it has no ``content`` list (an
    empty list is an empty reply, not a missing one). None when it has one."""
    if not isinstance(final, dict):
        return f"the response is a JSON {json_type(final)}, expected an object"
    if not isinstance(final.get("content"), list):
        return f"the response holds no reply: {field_state(final, 'content')}"
    return None


def error_body(status: int, message: str, kind: str | None = None) -> bytes:
    """Anthropic's error shape: ``{"type":"error","error":{"type":kind,"message":message}}``
    (docs "Errors"; the SDK reads ``error.type``/``error.message``). ``kind`` defaults from the
    status: 400 invalid_request_error, 401 authentication_error, 403 permission_error,
    404 not_found_error, 413 request_too_large, 429 rate_limit_error, 529 overloaded_error,
    otherwise api_error."""
    if kind is None:
        kind = _ERROR_KINDS.get(status, "api_error")
    return dumps({"type": "error", "error": {"type": kind, "message": message}})


# --------------------------------------------------------------------------- rewrites

#: ``thinking`` parameter types that turn extended thinking on (``{"type": "enabled",
#: "budget_tokens": N}``; ``{"type": "adaptive"}``, what Claude Code 2.x sends)
_THINKING_ON = ("enabled", "adaptive")

#: Phrases of the API's 400 ``invalid_request_error`` messages saying that reasoning a request
#: carries was refused, matched case-insensitively (backticks optional: some reports drop them).
#: Where each was seen, quoted from the API's error body in public issue threads:
_REFUSALS = re.compile(
    "|".join(
        (
            # "messages.1.content.0: Invalid `signature` in `thinking` block" (a block another
            # model or account signed): lbjlaq/Antigravity-Manager#498, ding113/claude-code-hub#518,
            # anomalyco/opencode#48637, NoeFabris/opencode-antigravity-auth#73
            r"invalid `?signature`? in `?thinking`? block",
            # "messages.23.content.2: Invalid `data` in `redacted_thinking` block":
            # anthropics/claude-code#56708, microsoft/vscode#316787
            r"invalid `?data`? in `?redacted_thinking`? block",
            # "`thinking` or `redacted_thinking` blocks in the latest assistant message cannot be
            # modified. These blocks must remain as they were in the original response.":
            # anthropics/claude-code#19539, anthropics/claude-code#63203
            r"blocks in the latest assistant message cannot be modified",
            # "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found
            # `tool_use`. When `thinking` is enabled, a final `assistant` message must start with a
            # thinking block ...": anomalyco/opencode#3077, mastra-ai/mastra#7799,
            # deepset-ai/haystack-core-integrations#2146
            r"expected `?thinking`? or `?redacted_thinking`?, but found",
            # "When providing `thinking` or `redacted_thinking` blocks, the blocks must match the
            # parameters during the original request.": anthropics/claude-code#2171
            r"blocks must match the parameters during the original request",
            # "messages.7.content.0.thinking.signature: Field required":
            # lbjlaq/Antigravity-Manager#270, justlovemaki/AIClient2API#437
            r"thinking\.signature: field required",
            # "When thinking is disabled, an `assistant` message in the final position cannot
            # contain `thinking`.": anthropics/claude-code#7946, tailcallhq/forgecode#1853
            r"when thinking is disabled, an `?assistant`? message in the final position cannot contain",
        )
    ),
    re.IGNORECASE,
)


def entries(obj: dict) -> list:
    """The conversation of a parsed Messages request body: its ``messages`` list (a new list of
    the body's own message objects); [] when it is missing or not a list."""
    messages = obj.get("messages")
    return list(messages) if isinstance(messages, list) else []


def insert_user_text(obj: dict, at: int, text: str) -> dict:
    """A copy of a parsed Messages request body with a user turn holding ``text`` right after
    the first ``at`` messages (``0 <= at <= len(entries(obj))``).

    When message ``at - 1`` is a ``user`` message, a ``{"type": "text", "text": text}`` block is
    appended at the end of its content (a string content becomes a text block first, an empty
    one none; the ``tool_result`` blocks a user message starts with stay first, as the API
    requires); otherwise ``{"role": "user", "content": [{"type": "text", "text": text}]}`` is
    inserted at index ``at``. Raises ValueError for ``at`` out of range or an empty ``text``
    (the API refuses empty text blocks)."""
    messages = entries(obj)
    check_insert(at, len(messages), text)
    block = {"type": "text", "text": text}
    prev = messages[at - 1] if at > 0 else None
    if isinstance(prev, dict) and prev.get("role") == "user":
        content = prev.get("content")
        if isinstance(content, str):
            new_content = ([{"type": "text", "text": content}] if content else []) + [block]
        elif isinstance(content, list):
            new_content = [*content, block]
        else:
            new_content = [block]
        messages[at - 1] = {**prev, "content": new_content}
    else:
        messages.insert(at, {"role": "user", "content": [block]})
    return {**obj, "messages": messages}


def _reasoning_key(block: Any) -> str | None:
    """The key of a ``thinking`` block (``"sig:" + signature``, ``"sig:"`` when it has none) or
    a ``redacted_thinking`` block (``"data:" + data``); None for any other block."""
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind == "thinking":
        sig = block.get("signature")
        return "sig:" + (sig if isinstance(sig, str) else "")
    if kind == "redacted_thinking":
        data = block.get("data")
        return "data:" + data if isinstance(data, str) else None
    return None


def reasoning_keys(final: dict) -> set[str]:
    """The reasoning keys of a final ``message`` object: ``"sig:" + signature`` for each
    ``thinking`` block (``"sig:"`` for an empty signature, as :func:`action_to_response` renders
    reasoning without one) and ``"data:" + data`` for each ``redacted_thinking`` block. An
    agent echoes these blocks unchanged, so :func:`strip_reasoning` finds them by the same keys.
    Empty for anything but a dict."""
    if not isinstance(final, dict):
        return set()
    return {k for b in as_list(final.get("content")) if (k := _reasoning_key(b)) is not None}


def _without_thinking_edits(cm: Any) -> tuple[Any, int]:
    """``context_management`` without its ``clear_thinking_*`` edits (the strategy manages
    thinking blocks when extended thinking is on: Anthropic docs, "Context editing"), and how
    many were removed. An object left with no edit and no other field is returned as OMIT."""
    edits = cm.get("edits") if isinstance(cm, dict) else None
    if not isinstance(edits, list):
        return cm, 0
    keep = [
        e for e in edits if not (isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking"))
    ]
    removed = len(edits) - len(keep)
    if not removed:
        return cm, 0
    if not keep and cm.keys() == {"edits"}:
        return OMIT, removed
    return {**cm, "edits": keep}, removed


def strip_reasoning(obj: dict, served: set[str], path: str) -> tuple[dict, str, list[dict]]:
    """Drop from a parsed Messages request body the reasoning the live model would refuse:
    ``thinking`` and ``redacted_thinking`` blocks of assistant messages whose key (see
    :func:`reasoning_keys`) is in ``served``, the keys of replies the live upstream did not
    produce (its signature check fails on another model's, account's or a script's blocks:
    "Invalid `signature` in `thinking` block").

    Returns ``(body, path, rewrites)``: the body unchanged (the same object) when nothing
    matched, else a copy; ``path`` as given. Rewrites, in message order:

    - ``thinking_dropped`` (``entry`` = message index): the blocks dropped from that message;
    - ``thinking_kept``: a message whose content is nothing but served blocks keeps them, since
      an assistant message must not be sent empty and an empty text block is refused too;
    - ``thinking_off`` (``entry`` None), last: blocks were dropped from the last assistant
      message and the request has thinking on (``{"type": "enabled" | "adaptive"}``). With
      thinking on, the final assistant message of a tool turn must start with a signed
      thinking block ("Expected `thinking` or `redacted_thinking`, but found `tool_use`"), so
      the ``thinking`` parameter is removed, and with it any ``clear_thinking_*`` edit of
      ``context_management``.
    """
    messages = entries(obj)
    assistant = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
    last = assistant[-1] if assistant else None
    rewrites: list[dict] = []
    dropped_last = False
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), list)):
            continue
        content = m["content"]
        keep = [b for b in content if _reasoning_key(b) not in served]
        n = len(content) - len(keep)
        if not n:
            continue
        if not keep:
            rewrites.append(
                {
                    "entry": i,
                    "kind": "thinking_kept",
                    "detail": f"{n} thinking block(s) the live upstream did not produce kept: without them "
                    "the assistant message would be empty, which the API refuses",
                }
            )
            continue
        messages[i] = {**m, "content": keep}
        dropped_last = dropped_last or i == last
        detail = f"dropped {n} thinking block(s) the live upstream did not produce"
        rewrites.append({"entry": i, "kind": "thinking_dropped", "detail": detail})
    if not any(r["kind"] == "thinking_dropped" for r in rewrites):
        return obj, path, rewrites
    out = {**obj, "messages": messages}
    if dropped_last:
        out, off = reasoning_off(out, "the last assistant message lost its signed thinking")
        rewrites += off
    return out, path, rewrites


def reasoning_off(obj: dict, why: str) -> tuple[dict, list[dict]]:
    """A Messages request body with thinking turned off when it is on (``{"type": "enabled" |
    "adaptive"}``): with thinking on, the final assistant message of a tool turn must start with
    a signed thinking block ("Expected `thinking` or `redacted_thinking`, but found `tool_use`"),
    which a conversation of replies the live model did not produce (a handoff's, or one whose
    blocks were dropped) does not have. The ``thinking`` parameter is removed, and with it any
    ``clear_thinking_*`` edit of ``context_management``. Returns ``(body, rewrites)``: ``obj``
    itself and [] when thinking is off, else a copy and one ``thinking_off`` rewrite whose detail
    says ``why``."""
    thinking = obj.get("thinking")
    if not (isinstance(thinking, dict) and thinking.get("type") in _THINKING_ON):
        return obj, []
    out = dict(obj)
    del out["thinking"]
    detail = (
        f"thinking ({thinking.get('type')}) turned off: {why}, which a request with thinking on "
        "must send back"
    )
    if "context_management" in out:
        cm, removed = _without_thinking_edits(out["context_management"])
        if cm is OMIT:
            del out["context_management"]
        else:
            out["context_management"] = cm
        if removed:
            detail += f"; {removed} clear_thinking edit(s) of context_management removed with it"
    return out, [{"entry": None, "kind": "thinking_off", "detail": detail}]


def reasoning_refusal(status: int, body: bytes) -> str | None:
    """When an error response (status 400..499, Anthropic's JSON shape, see :func:`error_body`)
    says that reasoning the request carried was refused (a bad signature, modified or missing
    thinking blocks; the phrases matched are listed with their sources at ``_REFUSALS``), the
    API's message (at most 500 characters); else None."""
    return refusal_message(status, body, _REFUSALS)


def cache_breakpoints(body: bytes) -> int:
    """The number of ``cache_control`` blocks of a request body (a JSON object): in ``system``
    and ``tools`` when they are lists, and in each message's ``content`` list (the API allows at
    most 4)."""
    obj = orjson.loads(body)
    return sum(
        1
        for part in (
            obj.get("system"),
            obj.get("tools"),
            *[m.get("content") for m in obj.get("messages") or [] if isinstance(m, dict)],
        )
        if isinstance(part, list)
        for b in part
        if isinstance(b, dict) and "cache_control" in b
    )


#: Anthropic allows at most this many ``cache_control`` breakpoints per request
MAX_CACHE_BREAKPOINTS = 4


def _scrub_cache_control(messages: Any) -> int:
    n = 0
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and "cache_control" in b:
                    del b["cache_control"]
                    n += 1
    return n


def _count_cache_control(value: Any) -> int:
    if isinstance(value, list):
        return sum(1 for b in value if isinstance(b, dict) and "cache_control" in b)
    return 0


def place_cache_markers(body: dict[str, Any]) -> int:
    """Place ``cache_control`` the way Claude Code 2.1 and litellm do (the two Anthropic clients
    recorded, the Claude Code requests): markers on system blocks and tools stay as given (the
    profile's), every marker in the messages is removed, and one ``{"type": "ephemeral"}`` goes
    on the last block of the final user message, while the request holds fewer than
    :data:`MAX_CACHE_BREAKPOINTS` (4) markers. A string content becomes one text block for it.
    Returns the number of markers."""
    messages = body.get("messages") or []
    _scrub_cache_control(messages)
    fixed = _count_cache_control(body.get("system")) + _count_cache_control(body.get("tools"))
    if fixed >= MAX_CACHE_BREAKPOINTS:
        return fixed
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                m["content"] = content = [{"type": "text", "text": content}]
            if isinstance(content, list) and content and isinstance(content[-1], dict):
                content[-1]["cache_control"] = {"type": "ephemeral"}
                return fixed + 1
            break
    return fixed


# --------------------------------------------------------------------------- replies
# facts adapters/protocols/replies.py answers with

#: the field of a token-count response's count (None: the protocol has none):
#: Anthropic's ``/v1/messages/count_tokens`` answers ``{"input_tokens": N}``
TOKEN_COUNT_FIELD: str | None = "input_tokens"


def normalised_usage(usage: Any) -> TokenUsage:
    """:class:`TokenUsage` of a Messages reply's ``usage``: ``input_tokens`` counts only what was
    neither read from nor written to the cache, so the input is ``input_tokens +
    cache_read_input_tokens + cache_creation_input_tokens``; the reasoning count is
    ``output_tokens_details.thinking_tokens`` where the reply gives it."""
    if not isinstance(usage, dict):
        return TokenUsage()
    read = first_int(usage.get("cache_read_input_tokens"))
    created = first_int(usage.get("cache_creation_input_tokens"))
    return TokenUsage(
        input_tokens=count_sum(usage.get("input_tokens"), read, created),
        cached_input_tokens=read,
        cache_creation_input_tokens=created,
        output_tokens=first_int(usage.get("output_tokens")),
        reasoning_tokens=first_int(dig(usage, "output_tokens_details", "thinking_tokens")),
    )
