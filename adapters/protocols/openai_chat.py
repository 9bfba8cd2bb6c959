"""OpenAI Chat Completions: ``POST /v1/chat/completions`` (OpenCode, Qwen Code, mini-swe-agent
through litellm, the official SDKs).

Implements the module contract of :mod:`pvisor.adapters.protocols.base`. Sources (see
the upstream sources named here and docs/agents.md):

- stream framing (``data: <json>``, ``data: [DONE]``, error objects): openai-python
  ``_streaming.py``;
- reassembly rules: openai-python ``lib/streaming/chat/_completions.py``
  ``_accumulate_chunk`` and ``lib/streaming/_deltas.py::accumulate_delta``, with ``usage``
  assigned rather than summed;
- request shapes (``tool_calls``, ``role: tool``): the Chat Completions API reference;
- differences between agents (OpenCode re-serialises arguments; Qwen Code sends
  ``content: null`` where OpenCode sends ``""``; mini-swe-agent leaves ``content`` out):
  docs/agents.md and the recorded requests under ``tests/corpus/requests``.

Reasoning: some OpenAI-compatible servers (DeepSeek, vLLM and SGLang reasoning parsers, Qwen's
DashScope) stream ``reasoning_content`` next to ``content``; OpenAI itself sends none. It is read
into :class:`Reasoning`, and :func:`action_to_response` emits it only when the action has
reasoning text (clients that do not know the field ignore it).
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from pvisor.adapters.protocols.base import (
    check_insert,
    compact_json,
    dumps,
    field_state,
    final_object,
    openai_usage,
    function_tools_only,
    IdSource,
    json_type,
    loads_object,
    no_cache_breakpoints,
    no_cache_markers,
    no_converted_tool_raw,
    no_reasoning_keys,
    no_token_counts,
    normalise_conversation,
    nothing_to_strip,
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
    stream_in_body,
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

NAME = "openai-chat"
#: ``gen_ai.provider.name`` of the OpenTelemetry GenAI semantic conventions (exports: otel)
GEN_AI_PROVIDER = "openai"
#: ``gen_ai.operation.name`` of a model call of this protocol (Chat Completions: a chat)
GEN_AI_OPERATION = "chat"
CALL_ID_PREFIX = "call_"  # (contract.py)
PATHS: tuple[str, ...] = ("/v1/chat/completions",)
#: the wire-protocol facts (:class:`~pvisor.adapters.protocols.contract.WireProtocol` says what each means)
TITLE = "OpenAI Chat Completions"
DEFAULT_TARGET = ("POST", "/v1/chat/completions", "")
UNSTREAMED_TARGET = DEFAULT_TARGET
MODEL_IN_PATH = False
ENTRIES_KEY = "messages"
RESULTS_ROLE = "tool"
TOOL_SCHEMA_REQUIRED = False  # no ``parameters``: the function takes none
REQUIRED_PARAMS: dict[str, Any] = {}
SIGNED_REASONING = False
path_for_model = path_unchanged
converted_tool_raw = no_converted_tool_raw
cache_breakpoints = no_cache_breakpoints
CACHE_MARKERS = False
#: how the prompt cache reuses an earlier request's prompt (``pvisor diff``,
#: :mod:`pvisor.adapters.request_diff`): automatic, on an exact common prefix of prompts of
#: 1,024 tokens or more, hits counted in 128-token increments (OpenAI's prompt caching guide,
#: https://platform.openai.com/docs/guides/prompt-caching, and its cookbook "Prompt Caching
#: 201"); the cached count is the reply's ``usage.prompt_tokens_details.cached_tokens``
PROMPT_CACHE: dict[str, Any] = {
    "rule": "increments",
    "marker": None,
    "min_tokens": 1024,
    "increment_tokens": 128,
    "usage_field": "prompt_tokens_details.cached_tokens",
    "source": "https://platform.openai.com/docs/guides/prompt-caching",
}
#: a request's credential: ``authorization: Bearer <key>`` (OpenAI API reference, "Authentication")
CREDENTIAL_HEADERS, CREDENTIAL_QUERY = ("authorization",), ()
place_cache_markers = no_cache_markers
counts_tokens = no_token_counts
# the chain rule's comparison form with call ids kept (``call_`` ids are made by the server);
# re-serialised arguments compare parsed, ``content`` null, ``""`` and absent equal (docs/agents.md)
normalise = normalise_conversation
# nothing to strip: Chat Completions carries no signed reasoning (``reasoning_content`` is plain
# text, which servers take from anyone)
strip_reasoning = nothing_to_strip
# the model is the body's ``model`` field; the path is unchanged
with_model = with_body_model
offered_tools = tools_as_parsed
wants_stream = stream_in_body
# a ``chat.completion`` carries no signed or encrypted reasoning
reasoning_keys = no_reasoning_keys
tool_kind = function_tools_only

_CANONICAL_KEYS = ("model", "messages", "tools", "stream")
_SYSTEM_ROLES = ("system", "developer")
_PIECE = 64

_CHAT_STOP = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
_STOP_FROM_OTHER = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "STOP": "stop",
    "completed": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "MAX_TOKENS": "length",
    "max_output_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
    "SAFETY": "content_filter",
}


# --------------------------------------------------------------------------- routing


def matches(path: str) -> bool:
    """True for ``/v1/chat/completions`` (path without query string)."""
    return path in PATHS


# --------------------------------------------------------------------------- requests


def _content_text(content: Any) -> str:
    """Text of a system/developer message content: the string, or its text parts joined by
    ``"\\n\\n"`` (the same rule as Anthropic ``system`` blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(
            p.get("text") or ""
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text")
        )
    return ""


def _system_text(messages: list[dict]) -> str:
    return "\n\n".join(_content_text(m.get("content")) for m in messages)


def _content_parts(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return [TextPart(text=content)]
    if content is None:
        return []
    if isinstance(content, list):
        parts: list[Any] = []
        for j, p in enumerate(content):
            if not isinstance(p, dict):
                raise wrong_json(f"{where}[{j}]", p, "a content part object")
            kind = p.get("type")
            if kind == "text":
                parts.append(TextPart(text=p.get("text") or "", raw=p))
            else:
                parts.append(OtherPart(kind=str(kind) if kind is not None else "unknown", raw=p))
        return parts
    raise wrong_json(where, content, "a string, a list or null")


def _parse_tool_call(tc: Any, where: str) -> ToolCall:
    if not isinstance(tc, dict):
        raise wrong_json(where, tc, "a tool call object")
    if tc.get("type") == "custom" and isinstance(tc.get("custom"), dict):
        c = tc["custom"]
        raw_input = c.get("input") if isinstance(c.get("input"), str) else ""
        return ToolCall(
            id=tc.get("id"),
            name=c.get("name") or "",
            arguments_raw=raw_input,
            arguments=parse_arguments(raw_input),
            kind="custom",
            raw=tc,
        )
    fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
    args = fn.get("arguments")
    if isinstance(args, str):
        raw_args = args  # exact, as the agent sent it (OpenCode re-serialises it; docs/agents.md)
        parsed = parse_arguments(args)
    else:  # a client that sends an object instead of the JSON string
        raw_args = compact_json(args) if args is not None else ""
        parsed = args
    return ToolCall(
        id=tc.get("id"),
        name=fn.get("name") or "",
        arguments_raw=raw_args,
        arguments=parsed,
        kind="function",
        raw=tc,
    )


def _legacy_call(fc: dict) -> ToolCall:
    """The legacy single ``function_call`` of a message: a ToolCall without id."""
    args = fc.get("arguments") if isinstance(fc.get("arguments"), str) else ""
    return ToolCall(
        id=None, name=fc.get("name") or "", arguments_raw=args, arguments=parse_arguments(args), raw=fc
    )


def _parse_message(m: Any, i: int) -> Message:
    if not isinstance(m, dict):
        raise wrong_json(f"messages[{i}]", m, "an object")
    role = m.get("role")
    if not isinstance(role, str):
        raise BadInputError(f"request body messages[{i}] has no string 'role'")
    if role in ("tool", "function"):
        # role "function" is the legacy form: no id, the tool name instead
        result = ToolResult(
            call_id=m.get("tool_call_id") if role == "tool" else None,
            content=m.get("content"),
            is_error=None,
            name=m.get("name") if role == "function" else None,
            raw=m,
        )
        return Message(role="tool", parts=[result], raw=m)
    parts: list[Any] = []
    reasoning = m.get("reasoning_content")
    if isinstance(reasoning, str):
        parts.append(Reasoning(text=reasoning))
    parts += _content_parts(m.get("content"), f"messages[{i}].content")
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        parts += [_parse_tool_call(tc, f"messages[{i}].tool_calls[{j}]") for j, tc in enumerate(calls)]
    elif calls is not None:
        raise wrong_json(f"messages[{i}].tool_calls", calls, "a list")
    fc = m.get("function_call")
    if isinstance(fc, dict):
        parts.append(_legacy_call(fc))
    return Message(role=role, parts=parts, raw=m)


def _parse_tool(t: Any, i: int) -> ToolSpec:
    if not isinstance(t, dict):
        raise wrong_json(f"tools[{i}]", t, "an object")
    inner = t.get("function") if isinstance(t.get("function"), dict) else t.get("custom")
    if not isinstance(inner, dict):
        inner = t
    return ToolSpec(
        name=inner.get("name") or "",
        description=inner.get("description"),
        parameters=inner.get("parameters"),
        raw=t,
    )


@request_parser("OpenAI Chat Completions")
def parse_request(
    body: Any, *, path: str = "", query: str = "", memo: ParseMemo | None = None
) -> Conversation:
    """Read a Chat Completions request body into a :class:`Conversation`.

    Args:
        body: the request body, bytes/str of JSON or an already parsed dict.
        path, query: unused; accepted for the common contract.
        memo: a :class:`~pvisor.adapters.protocols.base.ParseMemo` shared by the requests of one
            session: a message read before is not read again.

    Returns:
        ``Conversation(protocol="openai-chat")``. The leading ``system``/``developer`` messages
        are the system prompt: ``system`` is their text joined with ``"\\n\\n"``, ``system_raw``
        the list of those message dicts exactly; later system messages stay in ``messages``.
        Assistant ``tool_calls`` become ToolCalls with ``arguments_raw`` the exact argument
        string (``arguments`` parsed, None if not JSON); legacy ``function_call`` a ToolCall
        with ``id=None``; ``reasoning_content`` a leading Reasoning part. ``role: tool`` (and
        legacy ``role: function``) messages become ``Message(role="tool")`` holding one
        ToolResult (``call_id`` = ``tool_call_id``, content exact, ``is_error`` None). A string
        content is one TextPart with ``raw=None``; ``content: null``/absent gives no part and
        ``""`` an empty TextPart (both normalise equal; the raw message keeps which it was).
        Non-text content parts (images, audio, files) are OtherParts. Every other top-level key
        goes into ``params`` in body order.

    Raises:
        BadInputError: the body is not a JSON object, or ``messages``/``tools``/a part has the
        wrong JSON type (the message names the field).
    """
    obj = loads_object(body)
    messages = obj.get("messages", [])
    if not isinstance(messages, list):
        raise wrong_json("field 'messages'", messages, "a list")
    tools = obj.get("tools") or []
    if not isinstance(tools, list):
        raise wrong_json("field 'tools'", tools, "a list")
    lead = 0
    while (
        lead < len(messages)
        and isinstance(messages[lead], dict)
        and messages[lead].get("role") in _SYSTEM_ROLES
    ):
        lead += 1
    system_msgs = messages[:lead]
    model = obj.get("model")
    return Conversation(
        protocol=NAME,
        model=model if isinstance(model, str) else None,
        system=_system_text(system_msgs) if system_msgs else None,
        system_raw=system_msgs if system_msgs else None,
        tools=[_parse_tool(t, i) for i, t in enumerate(tools)],
        messages=read_entries(memo, messages[lead:], lambda m, i: _parse_message(m, lead + i)),
        stream=obj.get("stream") is True,
        params={k: v for k, v in obj.items() if k not in _CANONICAL_KEYS},
    )


def _render_system(conv: Conversation) -> list[dict]:
    raw = conv.system_raw
    if (
        isinstance(raw, list)
        and raw
        and all(isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES for m in raw)
        and _system_text(raw) == (conv.system or "")
    ):
        return raw  # exact, roles (system/developer) and part lists kept
    if conv.system is None:
        return []
    return [{"role": "system", "content": conv.system}]


def _render_tool_call(tc: ToolCall) -> dict:
    raw = tc.raw if isinstance(tc.raw, dict) else None
    args = tc.arguments_raw
    if not args and tc.arguments is not None:
        args = compact_json(tc.arguments)
    if tc.kind == "custom":
        r = raw if raw and raw.get("type") == "custom" else None
        inner = overlay(r.get("custom") if r else None, {"name": tc.name, "input": args})
        return overlay(r, {"id": tc.id if tc.id is not None else OMIT, "type": "custom", "custom": inner})
    r = raw if raw and isinstance(raw.get("function"), dict) else None
    fn = overlay(r["function"] if r else None, {"name": tc.name, "arguments": args})
    return overlay(r, {"id": tc.id if tc.id is not None else OMIT, "type": "function", "function": fn})


def _render_content(parts: list[Any], raw: dict | None) -> Any:
    """The ``content`` of a rendered message: a string for one plain TextPart, a part list when
    parts came from a list (their ``raw``) or there are several or non-text ones; with no part,
    what the raw message had (``null``, ``[]``, or absent = OMIT), else null."""
    if not parts:
        if raw is not None:
            return raw["content"] if "content" in raw and raw["content"] in (None, []) else OMIT
        return None
    if len(parts) == 1 and isinstance(parts[0], TextPart) and parts[0].raw is None:
        return parts[0].text
    out = []
    for p in parts:
        if isinstance(p, TextPart):
            r = p.raw if isinstance(p.raw, dict) and p.raw.get("type") == "text" else None
            out.append(overlay(r, {"type": "text", "text": p.text}))
        else:
            out.append(dict(p.raw) if isinstance(p.raw, dict) else {"type": p.kind})
    return out


def _render_message(m: Message) -> list[dict]:
    """One canonical message as one or more Chat messages (each ToolResult is its own
    ``role: tool`` message; this also turns an Anthropic-style user message of results into
    Chat form)."""
    raw = m.raw if isinstance(m.raw, dict) else None
    out: list[dict] = []
    results = [p for p in m.parts if isinstance(p, ToolResult)]
    rest = [p for p in m.parts if not isinstance(p, ToolResult)]
    for res in results:
        r = raw if raw is not None and m.role == "tool" and len(results) == 1 else None
        if r is None and isinstance(res.raw, dict) and res.raw.get("role") in ("tool", "function"):
            r = res.raw
        content = res.content if res.content is not None else (None if r is None or "content" in r else OMIT)
        if res.call_id is None and res.name is not None:  # legacy role "function"
            out.append(overlay(r, {"role": "function", "name": res.name, "content": content}))
        else:
            out.append(overlay(r, {"role": "tool", "tool_call_id": res.call_id, "content": content}))
    if results and not rest:
        return out
    role = m.role if m.role != "tool" else "user"
    reasoning = [p for p in rest if isinstance(p, Reasoning)]
    calls = [p for p in rest if isinstance(p, ToolCall)]
    modern = [tc for tc in calls if tc.id is not None or tc.kind == "custom"]
    legacy = [tc for tc in calls if not (tc.id is not None or tc.kind == "custom")]
    content_parts = [p for p in rest if isinstance(p, (TextPart, OtherPart))]
    r = raw if raw is not None and raw.get("role") == m.role else None
    canonical: dict[str, Any] = {"role": role, "content": _render_content(content_parts, r)}
    if reasoning:
        canonical["reasoning_content"] = "".join(p.text for p in reasoning)
    elif r is not None and "reasoning_content" in r:
        canonical["reasoning_content"] = OMIT
    if modern:
        canonical["tool_calls"] = [_render_tool_call(tc) for tc in modern]
    elif r is not None and "tool_calls" in r:
        canonical["tool_calls"] = OMIT
    if legacy:
        tc = legacy[0]
        canonical["function_call"] = {
            "name": tc.name,
            "arguments": tc.arguments_raw or compact_json(tc.arguments or {}),
        }
    elif r is not None and "function_call" in r:
        canonical["function_call"] = OMIT
    if r is not None and "tool_calls" in r and r["tool_calls"] == [] and not modern:
        canonical["tool_calls"] = []
    out.append(overlay(r, canonical))
    return out


def _render_tool(t: ToolSpec) -> dict:
    raw = t.raw if isinstance(t.raw, dict) else None
    if raw is not None and raw.get("type") == "custom" and isinstance(raw.get("custom"), dict):
        inner = overlay(
            raw["custom"],
            {"name": t.name, "description": t.description if t.description is not None else OMIT},
        )
        return overlay(raw, {"type": "custom", "custom": inner})
    r = raw if raw is not None and isinstance(raw.get("function"), dict) else None
    fn = overlay(
        r["function"] if r else None,
        {
            "name": t.name,
            "description": t.description if t.description is not None else OMIT,
            "parameters": t.parameters if t.parameters is not None else OMIT,
        },
    )
    return overlay(r, {"type": "function", "function": fn})


def render_request(conv: Conversation) -> bytes:
    """A :class:`Conversation` as a Chat Completions request body (compact JSON bytes).

    Works from canonical fields alone; ``raw`` objects of this protocol's shape only add
    provider extras and their key order (canonical values win). ``system_raw`` (the leading
    system/developer messages) is used when its text equals ``system``, else one ``system``
    message. Tool call ``arguments`` are ``arguments_raw`` exactly. Key order: ``model``,
    ``messages``, ``tools``, then ``params``, with ``stream: true`` (when ``conv.stream``) just
    before ``stream_options`` or last.
    """
    out: dict[str, Any] = {}
    if conv.model is not None:
        out["model"] = conv.model
    messages = list(_render_system(conv))
    for m in conv.messages:
        messages += _render_message(m)
    out["messages"] = messages
    if conv.tools:
        out["tools"] = [_render_tool(t) for t in conv.tools]
    for k, v in conv.params.items():
        if k == "stream_options" and conv.stream:
            out["stream"] = True  # where OpenCode and Qwen Code put it
        if k not in out:
            out[k] = v
    if conv.stream:
        out["stream"] = True
    return dumps(out)


# --------------------------------------------------------------------------- streams


def _merge(acc: dict, delta: dict) -> None:
    """openai-python ``accumulate_delta`` for keys other than ``tool_calls``: strings
    concatenate, numbers add, dicts merge, lists extend, ``index``/``type``/``role`` are
    assigned, a null delta value changes nothing."""
    for k, v in delta.items():
        if k not in acc or acc[k] is None:
            acc[k] = copy.deepcopy(v)
            continue
        a = acc[k]
        if v is None:
            continue
        if k in ("index", "type", "role"):
            acc[k] = v  # some servers repeat role in every delta: never concatenate it
        elif isinstance(a, str) and isinstance(v, str):
            acc[k] = a + v
        elif isinstance(a, (int, float)) and isinstance(v, (int, float)) and not isinstance(a, bool):
            acc[k] = a + v
        elif isinstance(a, dict) and isinstance(v, dict):
            _merge(a, v)
        elif isinstance(a, list) and isinstance(v, list):
            a.extend(copy.deepcopy(v))
        else:
            acc[k] = v


class _Choice:
    __slots__ = ("index", "message", "calls", "finish_reason", "logprobs", "extras")

    def __init__(self, index: int) -> None:
        self.index = index
        self.message: dict[str, Any] = {}
        self.calls: dict[int, dict] = {}
        self.finish_reason: Any = None
        self.logprobs: Any = None
        self.extras: dict[str, Any] = {}


class _Accumulator:
    """Applies the reassembly rules of openai-python's ``_accumulate_chunk`` to decoded SSE events."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None
        self.choices: dict[int, _Choice] = {}
        self.usage: Any = None
        self.complete = False
        self.error: Any = None
        self.events = 0
        self.problems: list[str] = []

    def _problem(self, n: int, text: str) -> None:
        self.problems.append(f"event {n}: {text}")

    def event(self, ev: SSEEvent) -> None:
        self.events += 1
        n = self.events
        payloads: list[str] = []
        for line in ev.stray:
            # bare JSON lines (a server's error without "data:") are read; other lines reported
            if line.lstrip().startswith("{"):
                payloads.append(line)
            else:
                self._problem(n, f"line that is not SSE ignored: {line[:80]!r}")
        if ev.has_data:
            payloads.insert(0, ev.data)
        for data in payloads:
            self._data(n, data)

    def _data(self, n: int, data: str) -> None:
        if data.startswith("[DONE]"):
            self.complete = True
            return
        if self.complete:
            self._problem(n, "data after [DONE] ignored")
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._problem(n, f"data is not JSON, ignored: {data[:80]!r}")
            return
        if not isinstance(obj, dict):
            self._problem(n, f"data is a JSON {json_type(obj)}, not an object; ignored")
            return
        if obj.get("error"):
            self.error = obj
            return
        if obj.get("object") == "":
            return  # Azure content-filter annotation chunk (openai-python skips them too)
        if self.snapshot is None:
            self.snapshot = {k: v for k, v in obj.items() if k not in ("choices", "obfuscation", "usage")}
        else:
            for k, v in obj.items():
                if k in ("choices", "obfuscation", "usage", "id", "object", "created", "model"):
                    continue
                if k not in self.snapshot or v is not None:
                    self.snapshot[k] = v  # system_fingerprint and the like: last non-null wins
        if obj.get("usage") is not None:
            self.usage = obj["usage"]  # assigned from the chunk carrying it, never summed
        choices = obj.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            self._problem(n, "'choices' is not a list; ignored")
            return
        for c in choices:
            if not isinstance(c, dict):
                self._problem(n, "a choice is not an object; ignored")
                continue
            self._choice(n, c)

    def _choice(self, n: int, c: dict) -> None:
        index = c.get("index", 0)
        if not isinstance(index, int):
            self._problem(n, f"choice index {index!r} is not an integer; ignored")
            return
        st = self.choices.get(index)
        if st is None:
            st = self.choices[index] = _Choice(index)
        delta = c.get("delta")
        if isinstance(delta, dict):
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for frag in calls:
                    self._tool_call(n, st, frag)
                if "tool_calls" not in st.message:  # keeps the key's place in the message
                    st.message["tool_calls"] = [] if not calls else None
                rest = {k: v for k, v in delta.items() if k != "tool_calls"}
            else:
                rest = delta
            _merge(st.message, rest)
        elif delta is not None:
            self._problem(n, f"choice {index}: delta is not an object; ignored")
        if c.get("finish_reason") is not None:
            st.finish_reason = c["finish_reason"]
        lp = c.get("logprobs")
        if lp is not None:
            if st.logprobs is None:
                st.logprobs = copy.deepcopy(lp)
            elif isinstance(lp, dict) and isinstance(st.logprobs, dict):
                for k in ("content", "refusal"):
                    if isinstance(lp.get(k), list):
                        if isinstance(st.logprobs.get(k), list):
                            st.logprobs[k].extend(lp[k])
                        else:
                            st.logprobs[k] = list(lp[k])
        for k, v in c.items():
            if k in ("index", "delta", "finish_reason", "logprobs"):
                continue
            if k not in st.extras or v is not None:
                st.extras[k] = v

    def _tool_call(self, n: int, st: _Choice, frag: Any) -> None:
        if not isinstance(frag, dict):
            self._problem(n, f"choice {st.index}: a tool_calls fragment is not an object; ignored")
            return
        index = frag.get("index")
        if not isinstance(index, int):
            index = len(st.calls)  # fragments without an index: each is a new call
            self._problem(
                n, f"choice {st.index}: tool_calls fragment without an integer index, taken as call {index}"
            )
        body = {k: v for k, v in frag.items() if k != "index"}
        cur = st.calls.get(index)
        if cur is None:
            st.calls[index] = copy.deepcopy(body)
            return
        for k, v in body.items():
            if v is None:
                continue
            if k in ("id", "type"):
                if v != "":
                    cur[k] = v  # the first fragment carries them; a repeat must not concatenate
            elif k == "function" and isinstance(v, dict) and isinstance(cur.get("function"), dict):
                fn = cur["function"]
                for fk, fv in v.items():
                    if fk == "name" and isinstance(fv, str) and (fv == fn.get("name") or fv == ""):
                        continue  # servers that repeat the name in every fragment
                    _merge(fn, {fk: fv})
            else:
                _merge(cur, {k: v})

    def result(self) -> Reassembled:
        final: dict[str, Any] | None = None
        if self.snapshot is not None:
            final = dict(self.snapshot)
            final["object"] = "chat.completion"
            final["choices"] = [self._build_choice(self.choices[i]) for i in sorted(self.choices)]
            if self.usage is not None:
                final["usage"] = self.usage
        elif self.choices:
            self.problems.append("choices arrived but no chunk gave id/model; no final object")
        return Reassembled(
            final=final, complete=self.complete, events=self.events, error=self.error, problems=self.problems
        )

    @staticmethod
    def _build_choice(st: _Choice) -> dict:
        msg: dict[str, Any] = {
            "role": st.message.get("role") or "assistant",
            "content": st.message.get("content"),
        }
        for k, v in st.message.items():
            if k in msg:
                continue
            if k == "tool_calls" and st.calls:
                msg[k] = [st.calls[i] for i in sorted(st.calls)]  # index dropped: the non-streamed shape
            else:
                msg[k] = v
        if st.calls and "tool_calls" not in msg:
            msg["tool_calls"] = [st.calls[i] for i in sorted(st.calls)]
        choice = {
            "index": st.index,
            "message": msg,
            "logprobs": st.logprobs,
            "finish_reason": st.finish_reason,
        }
        for k, v in st.extras.items():
            choice.setdefault(k, v)
        return choice


def reassemble(chunks: Iterable[bytes] | bytes) -> Reassembled:
    """Reassemble a raw Chat Completions stream (byte chunks split anywhere) into the final
    object a non-streamed request returns: ``object: "chat.completion"``, ``choices[i]`` with
    ``message`` (``role``, ``content``, then ``tool_calls`` and any other streamed fields),
    ``logprobs``, ``finish_reason``; ``usage`` when a chunk carried one.

    Rules (openai-python ``_accumulate_chunk``/``accumulate_delta``): the
    first chunk is the snapshot (id, created, model, system_fingerprint, ...); per choice index,
    delta strings concatenate (content, refusal, reasoning_content); ``tool_calls`` fragments
    merge by their ``index`` (the first carries id, type and name, later ones argument pieces,
    which concatenate; a repeated id or name is not doubled); ``finish_reason`` and
    ``system_fingerprint`` are assigned when non-null; ``usage`` is assigned from the chunk
    carrying it (with ``include_usage`` a last chunk with ``choices: []``); ``data: [DONE]``
    sets ``complete``; a data object with an ``error`` key becomes ``Reassembled.error``.
    Never raises on bad data: unparsable events are reported in ``problems``.
    """
    # the stream code is off the request-only path (replay --prepare-only): sse loads here
    from pvisor.adapters.protocols.sse import events

    acc = _Accumulator()
    for ev in events(chunks):
        acc.event(ev)
    return acc.result()


def _chunk(envelope: dict, choice: dict) -> bytes:
    from pvisor.adapters.protocols.sse import encode_event  # off the request-only path

    return encode_event(dumps({**envelope, "choices": [choice]}))


def render_stream(final: dict, *, piece: int = _PIECE) -> bytes:
    """A final ``chat.completion`` object as a Chat Completions stream (``data: <json>\\n\\n``).

    Per choice: a first chunk whose delta has ``role`` and the non-string message fields (and
    ``""`` for each string field), then the string fields (``content``, ``refusal``,
    ``reasoning_content``, ...) in pieces of ``piece`` characters, then per tool call a first
    fragment (``index``, ``id``, ``type``, ``function.name``, ``arguments: ""``) and argument
    pieces, then a chunk with an empty delta and ``finish_reason`` (and ``logprobs``). Then,
    when the final has ``usage``, a chunk with ``choices: []`` and the usage
    (``stream_options.include_usage``), and ``data: [DONE]``. Reassembling the output gives
    ``final`` back (equal dicts).
    """
    final_object(final, "Chat Completions")
    from pvisor.adapters.protocols.sse import encode_event  # off the request-only path

    env = {k: v for k, v in final.items() if k not in ("choices", "usage")}
    env["object"] = "chat.completion.chunk"
    out: list[bytes] = []
    for pos, choice in enumerate(final.get("choices") or []):
        index = choice.get("index", pos)
        msg = choice.get("message") or {}
        first: dict[str, Any] = {}
        later: list[dict] = []
        for k, v in msg.items():
            if k == "tool_calls" and isinstance(v, list) and v and all(isinstance(tc, dict) for tc in v):
                for j, tc in enumerate(v):
                    head: dict[str, Any] = {"index": j, **tc}
                    fn = tc.get("function")
                    pieces: list[str] = []
                    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                        head["function"] = {**fn, "arguments": ""}
                        pieces = split_text(fn["arguments"], piece)
                    later.append({"tool_calls": [head]})
                    later += [{"tool_calls": [{"index": j, "function": {"arguments": p}}]} for p in pieces]
            elif isinstance(v, str) and k != "role":
                first[k] = ""
                later += [{k: p} for p in split_text(v, piece)]
            else:
                first[k] = v
        out.append(_chunk(env, {"index": index, "delta": first, "logprobs": None, "finish_reason": None}))
        for d in later:
            out.append(_chunk(env, {"index": index, "delta": d, "logprobs": None, "finish_reason": None}))
        last = {
            "index": index,
            "delta": {},
            "logprobs": choice.get("logprobs"),
            "finish_reason": choice.get("finish_reason"),
        }
        for k, v in choice.items():
            if k not in ("index", "message", "logprobs", "finish_reason"):
                last[k] = v
        out.append(_chunk(env, last))
    if final.get("usage") is not None:
        out.append(encode_event(dumps({**env, "choices": [], "usage": final["usage"]})))
    out.append(encode_event(b"[DONE]"))
    return b"".join(out)


# --------------------------------------------------------------------------- actions


def response_to_action(final: dict) -> Action:
    """Read a final ``chat.completion`` object (choice 0) as an :class:`Action`.

    ``text``: ``message.content`` (text parts joined when a server sends a list); ``reasoning``:
    ``reasoning_content`` when present; ``tool_calls``: ``message.tool_calls`` with
    ``arguments_raw`` the exact argument string the model produced (``arguments`` parsed, None
    when not JSON), custom tool calls with kind ``custom``, a legacy ``function_call`` with
    id None; ``usage``; ``stop_reason`` = ``finish_reason``; ``model``; ``raw`` = ``final``.
    """
    final_object(final, "Chat Completions")
    choices = final.get("choices") or []
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
    if choice is None and choices and isinstance(choices[0], dict):
        choice = choices[0]
    msg = (choice or {}).get("message") or {}
    content = msg.get("content")
    if isinstance(content, list):
        text = "".join(
            p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    else:
        text = content if isinstance(content, str) else ""
    reasoning = (
        [Reasoning(text=msg["reasoning_content"])] if isinstance(msg.get("reasoning_content"), str) else []
    )
    calls = [_parse_tool_call(tc, "tool_calls") for tc in msg.get("tool_calls") or [] if isinstance(tc, dict)]
    fc = msg.get("function_call")
    if isinstance(fc, dict):
        calls.append(_legacy_call(fc))
    usage = final.get("usage")
    return Action(
        text=text,
        reasoning=reasoning,
        tool_calls=calls,
        usage=usage if isinstance(usage, dict) else None,
        stop_reason=(choice or {}).get("finish_reason"),
        model=final.get("model"),
        raw=final,
    )


def reply_problem(final: Any) -> str | None:
    """Why a final ``chat.completion`` object carries no reply at all: ``choices`` missing,
    null or empty, or its choice without a ``message`` object. None when it has one."""
    if not isinstance(final, dict):
        return f"the response is a JSON {json_type(final)}, expected an object"
    choices = final.get("choices")
    if not isinstance(choices, list) or not choices:
        return f"the response holds no reply: {field_state(final, 'choices')}"
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), choices[0])
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return "the response holds no reply: its choice has no 'message' object"
    return None


def _usage(usage: dict) -> dict:
    """Usage in Chat's shape: Chat names pass through; Anthropic/Responses and Gemini counts are
    renamed (``total_tokens`` added)."""
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        return dict(usage)
    if "promptTokenCount" in usage or "candidatesTokenCount" in usage:
        p, c = usage.get("promptTokenCount") or 0, usage.get("candidatesTokenCount") or 0
    else:
        p, c = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish_reason(action: Action) -> str:
    sr = action.stop_reason
    if sr in _CHAT_STOP:
        return sr  # type: ignore[return-value]
    if sr in _STOP_FROM_OTHER:
        mapped = _STOP_FROM_OTHER[sr]
        return "tool_calls" if mapped == "stop" and action.tool_calls else mapped
    return "tool_calls" if action.tool_calls else "stop"


def action_to_response(
    action: Action, *, model: str | None = None, ids: IdSource | None = None, created: int = 0
) -> dict:
    """An :class:`Action` as a final ``chat.completion`` object (what a non-streamed request
    returns; :func:`render_stream` turns it into a stream).

    Shape: ``{"id": ids.next("chatcmpl-"), "object": "chat.completion", "created": created,
    "model", "choices": [{"index": 0, "message": {"role": "assistant", "content",
    ["reasoning_content"], ["tool_calls"]}, "logprobs": null, "finish_reason"}], ["usage"]}``.
    ``content`` is the text, or null when the reply is only tool calls (OpenAI's own form), or
    ``""`` when there is nothing. Tool calls keep the action's id when it has one (the agent
    echoes it, and the chain rule keeps call ids), else ``ids.next("call_")``; ``arguments`` is
    ``arguments_raw`` exactly. ``reasoning_content`` only when the action has reasoning text
    (see the module docstring). ``usage`` only when the action has one (renamed from other
    protocols). ``created`` is fixed (default 0) so the output is deterministic.
    """
    ids = ids if ids is not None else IdSource()
    cid = ids.next("chatcmpl-")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": action.text if action.text else (None if action.tool_calls else ""),
    }
    reasoning = "".join(r.text for r in action.reasoning)
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = []
    for tc in action.tool_calls:
        args = (
            tc.arguments_raw
            if tc.arguments_raw
            else compact_json(tc.arguments if tc.arguments is not None else {})
        )
        if tc.kind == "custom":
            calls.append(
                {
                    "id": tc.id or ids.next("call_"),
                    "type": "custom",
                    "custom": {"name": tc.name, "input": tc.arguments_raw},
                }
            )
        else:
            calls.append(
                {
                    "id": tc.id or ids.next("call_"),
                    "type": "function",
                    "function": {"name": tc.name, "arguments": args},
                }
            )
    if calls:
        message["tool_calls"] = calls
    out: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model or action.model or "unknown",
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(action)}
        ],
    }
    if action.usage:
        out["usage"] = _usage(action.usage)
    return out


def error_body(status: int, message: str, kind: str | None = None) -> bytes:
    """OpenAI's error shape: ``{"error":{"message","type","param":null,"code":null}}``
    (openai-python ``_exceptions.py`` reads ``error.message``/``type``/``param``/``code``).
    ``kind`` defaults from the status: 4xx invalid_request_error, 429 rate_limit_exceeded,
    5xx server_error."""
    if kind is None:
        kind = (
            "rate_limit_exceeded"
            if status == 429
            else "server_error"
            if status >= 500
            else "invalid_request_error"
        )
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


# --------------------------------------------------------------------------- rewrites

#: Phrases of 400 messages by which servers speaking Chat Completions refuse the reasoning a
#: request carries (OpenAI itself signs nothing on this wire), matched case-insensitively.
#: Where each was seen, quoted from the server's error body in public issue threads:
_REFUSALS = re.compile(
    "|".join(
        (
            # DeepSeek thinking mode, an assistant turn sent back without its reasoning: "The
            # `reasoning_content` in the thinking mode must be passed back to the API.":
            # JohnnyZ93/oai-compatible-copilot#215, anomalyco/opencode#24135, mnfst/modelparams.dev#29
            r"`?reasoning_content`? in the thinking mode must be passed back",
            # Gemini's OpenAI-compatible endpoint (/v1beta/openai/chat/completions): "Function call
            # is missing a thought_signature in functionCall parts.": manthanabc/paws#103
            r"missing a thought_signature",
        )
    ),
    re.IGNORECASE,
)


def entries(obj: dict) -> list:
    """The conversation of a parsed Chat Completions request body: its whole ``messages`` list
    (leading ``system``/``developer`` messages included; a new list of the body's own message
    objects); [] when it is missing or not a list."""
    messages = obj.get("messages")
    return list(messages) if isinstance(messages, list) else []


def insert_user_text(obj: dict, at: int, text: str) -> dict:
    """A copy of a parsed Chat Completions request body with ``{"role": "user", "content":
    text}`` inserted at index ``at`` of ``messages`` (``0 <= at <= len(entries(obj))``). After
    the ``tool`` messages answering an assistant's calls, a user message is what the API takes
    (the Chat Completions message shapes). Raises ValueError for ``at`` out of range or an empty ``text``."""
    messages = entries(obj)
    check_insert(at, len(messages), text)
    messages.insert(at, {"role": "user", "content": text})
    return {**obj, "messages": messages}


def reasoning_refusal(status: int, body: bytes) -> str | None:
    """When an error response (status 400..499, OpenAI's JSON shape, see :func:`error_body`; a
    Google-shaped one from Gemini's OpenAI-compatible endpoint too) says that the reasoning of
    the request was refused (phrases and sources at ``_REFUSALS``), the server's message (at most
    500 characters); else None."""
    return refusal_message(status, body, _REFUSALS)


# --------------------------------------------------------------------------- replies
# facts adapters/protocols/replies.py answers with

#: the field of a token-count response's count (None: the protocol has none):
#: no path of this protocol asks for a token count (:func:`counts_tokens`)
TOKEN_COUNT_FIELD: str | None = None

#: usage: ``prompt_tokens`` (cached ones within), ``completion_tokens`` (reasoning within), their details
normalised_usage = openai_usage("prompt", "completion")
