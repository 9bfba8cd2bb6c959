"""A step as a trainer reads it: the prompt, tools and completion in OpenAI Chat Completions form,
usage by the OpenTelemetry GenAI counts, and the chain segment the step belongs to
(docs/exports.md "rows and parquet").

- :func:`chat_prompt`: a parsed request (:class:`Conversation` of any protocol) as
  ``(prompt, tools, tools_dropped)``: the transcoder (:func:`pvisor.adapters.protocols.convert.
  convert`) takes it to ``openai-chat``, the Chat module renders it, and each message is made
  plain (:func:`plain_chat_message`): ``{role, content}`` with ``content`` the message's texts
  joined (as an action's ``text`` joins its text blocks), an assistant's ``reasoning_content``
  (reasoning text only: never a signature or encrypted content) and ``tool_calls``
  (``[{id, type: "function", function: {name, arguments}}]``, ``arguments`` a string), a tool
  message's ``tool_call_id``. Provider markers (``cache_control``) and the source's own objects
  do not pass; non-text parts (images, documents) are left out of ``content``.
- :func:`chat_completion`: an :class:`Action` as one assistant message of the same form.
- Calls of kind ``server`` (tools the provider ran: web search, tool search) are left out of
  both, as no tool message answers them; their tools are listed in ``tools_dropped``.
- :func:`chat_usage`: ``(usage, usage_raw)``: ``normalised_usage`` (of the protocol, or of the
  native adapter for a file's own usage shape), and the
  provider's own object.
- :class:`Segmenter`: gives each row its ``segment`` (0-based) and ``segment_break``
  (:class:`SegmentBreak` or None) by the extension property.

Pure: nothing is written; KeyError only for an unknown protocol name.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Any, Callable, Iterable

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.adapters.protocols.convert import (
    TOOL_NOT_CONVERTED,
    convert,
    convert_tools,
    plain,
    plain_action,
    plain_message,
)
from pvisor.journal.model import Action, Conversation, Message, TextPart, ToolCall, ToolResult

#: the protocol of the rows' messages
CHAT = "openai-chat"


class SegmentBreak(str, enum.Enum):
    """Why a row starts a new segment (its ``segment_break``; the first row's is null). Judged in
    this order when the extension property does not hold."""

    #: the agent replaced its history (a compaction) after the step before
    COMPACTION = "compaction"
    #: a continuation sent the live model the boundary user prompt (the step's flag)
    BOUNDARY_PROMPT = "boundary_prompt"
    #: the row's prompt is partial (its flag ``prompt_incomplete``): part of the context the
    #: model answered lives on the server (a Responses ``previous_response_id`` naming no
    #: response of the run, an ``item_reference``), so no row before joins it
    PROMPT_INCOMPLETE = "prompt_incomplete"
    #: the row before is a gap (flagged ``lost_action`` or ``no_reply``): it has no completion,
    #: so nothing joins it to this row's prompt
    NO_COMPLETION = "no_completion"
    #: the tools differ from the row before's (a chat template renders them into the prompt)
    TOOLS_CHANGED = "tools_changed"
    #: the messages extend the row before's once each call's arguments are compared as parsed
    #: JSON: the agent sent its calls back re-serialised (OpenCode: key order, spacing), so the
    #: text a template renders changed
    ARGUMENTS_RESERIALISED = "arguments_reserialised"
    #: the messages extend the row before's once ``reasoning_content`` is ignored: reasoning of
    #: an earlier turn was stripped (or a reply's reasoning never sent back)
    REASONING_STRIPPED = "reasoning_stripped"
    #: anything else: an earlier message was changed, removed or reordered
    PREFIX_CHANGED = "prefix_changed"


def _text(content: Any) -> str | None:
    """A rendered Chat ``content`` (string, part list, None) as one string: its text parts'
    texts joined with nothing between them (an action's ``text`` joins its blocks so), other
    parts (images, documents, files) left out; None stays None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return orjson.dumps(content).decode()


def _call(tc: dict[str, Any]) -> dict[str, Any]:
    """A rendered tool call as a function call. A freeform (``custom``) call's input text is its
    ``arguments`` as it is: no function takes it, the call stands as the model wrote it."""
    if tc.get("type") == "custom" and isinstance(tc.get("custom"), dict):
        fn = {"name": tc["custom"].get("name") or "", "arguments": tc["custom"].get("input") or ""}
    else:
        f = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        args = f.get("arguments")
        fn = {"name": f.get("name") or "", "arguments": args if isinstance(args, str) else ""}
    return {"id": tc.get("id") or "", "type": "function", "function": fn}


def plain_chat_message(m: dict[str, Any]) -> dict[str, Any]:
    """A rendered Chat message in the rows' form (module docstring). ``developer`` reads as
    ``system``; a legacy ``function`` result as a ``tool`` message of an empty id."""
    role = m.get("role")
    if role == "developer":
        role = "system"
    if role == "function":
        return {"role": "tool", "content": _text(m.get("content")) or "", "tool_call_id": ""}
    if role != "assistant":
        out: dict[str, Any] = {"role": role, "content": _text(m.get("content")) or ""}
        if role == "tool":
            out["tool_call_id"] = m.get("tool_call_id") or ""
        return out
    out = {"role": "assistant", "content": _text(m.get("content"))}
    if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
        out["reasoning_content"] = m["reasoning_content"]
    calls = [_call(tc) for tc in m.get("tool_calls") or [] if isinstance(tc, dict)]
    if isinstance(m.get("function_call"), dict):  # the legacy single call
        fc = m["function_call"]
        calls.append(_call({"type": "function", "function": fc}))
    if calls:
        out["tool_calls"] = calls
    return out


def chat_tool(t: Any) -> dict[str, Any]:
    """A function tool (:class:`ToolSpec`) as a Chat tool object ``{type: "function", function:
    {name, description, parameters}}`` (``description`` "" and ``parameters`` the empty object
    schema when the source gave none)."""
    return {
        "type": "function",
        "function": {
            "name": t.name,
            "description": t.description or "",
            "parameters": t.parameters
            if isinstance(t.parameters, dict)
            else {"type": "object", "properties": {}},
        },
    }


def _dropped_tools(source: list[Any], changes: Iterable[Any]) -> list[dict[str, str]]:
    """``[{name, kind}]`` of each source tool a :data:`TOOL_NOT_CONVERTED` change left out
    (``kind``: the tool's ``type`` as its protocol sent it, such as ``web_search_20250305``,
    ``custom``, ``namespace``)."""
    out = []
    for c in changes:
        if c.kind != TOOL_NOT_CONVERTED or not c.where.startswith("tools["):
            continue
        t = source[int(c.where[len("tools[") : -1])]
        raw_type = t.raw.get("type") if isinstance(t.raw, dict) else None
        out.append({"name": t.name, "kind": str(raw_type or "unknown")})
    return out


#: a call the provider ran itself (:class:`ToolCall` ``kind``): no tool message answers it
SERVER = "server"


def _server_calls_out(conv: Conversation) -> list[str]:
    """Take the calls of kind :data:`SERVER` out of ``conv``'s messages (in place; a message left
    with no part goes) and give their names, in order, once each. A result that names such a
    call stays as its text (a user's or a tool's text part), never as a tool message."""
    names: list[str] = []
    ids: set[str] = set()
    messages = []
    for m in conv.messages:
        parts = []
        for p in m.parts:
            if isinstance(p, ToolCall) and p.kind == SERVER:
                names.append(p.name)
                ids.add(p.id or "")
            elif isinstance(p, ToolResult) and p.call_id is not None and p.call_id in ids:
                if isinstance(p.content, str) and p.content:
                    parts.append(TextPart(p.content))
            else:
                parts.append(p)
        if len(parts) == len(m.parts):
            messages.append(m)
        elif parts:
            messages.append(Message(m.role, parts))
    conv.messages = messages
    return list(dict.fromkeys(names))


def _server_dropped(dropped: list[dict[str, str]], names: Iterable[str]) -> list[dict[str, str]]:
    """``dropped`` with each server tool of ``names`` not listed yet, as ``{name, kind: "server"}``."""
    have = {d["name"] for d in dropped}
    return [*dropped, *({"name": n, "kind": SERVER} for n in dict.fromkeys(names) if n not in have)]


def chat_prompt(conv: Conversation) -> tuple[list[dict], list[dict], list[dict]]:
    """``(prompt, tools, tools_dropped)`` of a request's conversation of any protocol (module
    docstring). The system prompt is the first message (``system``) when there is one. Calls
    the provider ran (server tools) are left out of the messages and listed in
    ``tools_dropped`` (kind ``server``) when the tools do not list them."""
    server = _server_calls_out(conv)
    converted = convert(conv, CHAT)
    c = converted.conversation
    changes = list(converted.dropped)
    if conv.protocol == CHAT:  # convert gives a Chat conversation back as it is: make it plain
        c.tools, gone = convert_tools(CHAT, CHAT, c.tools)
        changes.extend(gone)
        c.messages = [plain_message(m) for m in c.messages]
        c.system_raw = None
    tools = [chat_tool(t) for t in c.tools]
    c.tools, c.params, c.stream = [], {}, False
    body = orjson.loads(get_protocol(CHAT).render_request(c))
    prompt = [plain_chat_message(m) for m in body["messages"]]
    return prompt, tools, _server_dropped(_dropped_tools(conv.tools, changes), server)


def chat_completion(action: Action, call_ids: list[str | None] | None = None) -> dict[str, Any]:
    """The action as one assistant message (module docstring): its reasoning text as
    ``reasoning_content``, its text as ``content`` (None when it has none), its calls with the
    arguments as the model wrote them. ``call_ids``: the calls' ids as the agent sends them back
    (a native file's may differ from its wire ids), one per call; None: the action's."""
    a = plain_action(action)
    if call_ids is not None and len(call_ids) == len(a.tool_calls):
        a.tool_calls = [replace(c, id=i) for c, i in zip(a.tool_calls, call_ids)]
    # the provider ran these itself: no tool message will answer them (chat_prompt)
    a.tool_calls = [c for c in a.tool_calls if c.kind != SERVER]
    parts: list[Any] = [*a.reasoning]
    if a.text:
        parts.append(TextPart(a.text))
    parts.extend(plain(c) for c in a.tool_calls)
    conv = Conversation(protocol=CHAT, messages=[Message("assistant", parts)])
    body = orjson.loads(get_protocol(CHAT).render_request(conv))
    msg = plain_chat_message(body["messages"][-1])
    if not msg.get("content"):
        msg["content"] = None
    return msg


def chat_usage(normalise: Callable[[Any], TokenUsage], usage: Any) -> tuple[dict[str, Any] | None, Any]:
    """``(usage, usage_raw)``: the OpenTelemetry GenAI counts of the reply's usage (``normalise``
    of it, :meth:`TokenUsage.as_dict`: a protocol module's ``normalised_usage`` for a journal
    run, the native adapter's for a native file, whose usage is kept in the format's own shape)
    and the usage object as the provider or the file gave it; both None when there is none. A
    count that is no integer in ``[0, 2**63)`` is None (the raw usage keeps it)."""
    if not isinstance(usage, dict):
        return None, None
    counts = {k: v if _count(v) else None for k, v in normalise(usage).as_dict().items()}
    return counts, usage


#: a count must fit a signed 64-bit integer (Parquet's int64, most readers' integers)
COUNT_LIMIT = 2**63


def _count(v: Any) -> bool:
    # a provider or a file may write anything: a negative, a float, a bool, 2**64
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < COUNT_LIMIT


# --------------------------------------------------------------------------- segments


def _parsed(args: str) -> bytes:
    try:
        return orjson.dumps(orjson.loads(args), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        return args.encode()


def chain_form(m: dict[str, Any], reasoning: bool = True, parsed: bool = False) -> tuple:
    """What the extension property compares of a message: role, content (None as ""),
    ``reasoning_content`` (unless ``reasoning`` is False), each call's id, name and arguments
    (the exact string: a chat template renders it verbatim, so a call sent back re-serialised,
    keys reordered or spaced otherwise, is another text; with ``parsed``, the parsed JSON value
    as sorted-key text, a string that is no JSON as it is: only to name a break's reason),
    ``tool_call_id``."""
    calls = tuple(
        (
            c["id"],
            c["function"]["name"],
            _parsed(c["function"]["arguments"]) if parsed else c["function"]["arguments"],
        )
        for c in m.get("tool_calls") or ()
    )
    return (
        m["role"],
        m.get("content") or "",
        (m.get("reasoning_content") or "") if reasoning else "",
        calls,
        m.get("tool_call_id"),
    )


#: a step's flags that mark a gap: no reply of the model stands in the row (empty completion)
GAP_FLAGS = frozenset({"lost_action", "no_reply"})


def _tools_text(tools: list[dict]) -> bytes:
    # compared as JSON text with sorted keys: a template renders 1, true and 1.0 differently,
    # which Python's == takes for one value
    return orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)


def _extends(prompt: list[dict], before: list[dict], reasoning: bool, parsed: bool = False) -> bool:
    if len(prompt) < len(before):
        return False
    return all(
        chain_form(a, reasoning, parsed) == chain_form(b, reasoning, parsed) for a, b in zip(prompt, before)
    )


class Segmenter:
    """Segments of consecutive rows (feed them in step order with :meth:`next`). Row k extends
    row k-1 when row k-1 is no gap, row k's tools equal row k-1's (as JSON text with sorted keys)
    and its prompt starts with row k-1's prompt followed by row k-1's completion (none when it is
    empty: no text, reasoning or call), message by message in :func:`chain_form`; else row k
    starts the next segment, with the first reason of :class:`SegmentBreak` that fits."""

    def __init__(self) -> None:
        self.segment = -1
        self._before: list[dict] | None = None
        self._tools: bytes | None = None
        self._gap = False

    def next(
        self,
        prompt: list[dict],
        tools: list[dict],
        completion: dict,
        compacted: bool,
        boundary: bool,
        gap: bool = False,
        incomplete: bool = False,
    ) -> tuple[int, str | None]:
        """``(segment, segment_break)`` of the next row. ``compacted``: the agent compacted its
        history after the row before; ``boundary``: the row's request carried the boundary
        prompt; ``gap``: the row is a gap (:data:`GAP_FLAGS`), the next row starts a segment;
        ``incomplete``: the row's prompt is partial, it starts a segment."""
        before, before_tools, after_gap = self._before, self._tools, self._gap
        tools_text = _tools_text(tools)
        # an empty completion (no text, reasoning or call) is never sent back as a message
        empty = not (
            completion.get("content") or completion.get("reasoning_content") or completion.get("tool_calls")
        )
        self._before, self._tools, self._gap = [*prompt] if empty else [*prompt, completion], tools_text, gap
        if before is None:
            self.segment = 0
            return 0, None
        if not (after_gap or incomplete) and tools_text == before_tools and _extends(prompt, before, True):
            return self.segment, None
        self.segment += 1
        if compacted:
            why = SegmentBreak.COMPACTION
        elif boundary:
            why = SegmentBreak.BOUNDARY_PROMPT
        elif incomplete:
            why = SegmentBreak.PROMPT_INCOMPLETE
        elif after_gap:
            why = SegmentBreak.NO_COMPLETION
        elif tools_text != before_tools:
            why = SegmentBreak.TOOLS_CHANGED
        elif _extends(prompt, before, True, parsed=True):
            why = SegmentBreak.ARGUMENTS_RESERIALISED
        elif _extends(prompt, before, False):
            why = SegmentBreak.REASONING_STRIPPED
        else:
            why = SegmentBreak.PREFIX_CHANGED
        return self.segment, why.value


def chat_request(model: str, prompt: list[dict], tools: list[dict], completion: dict) -> dict[str, Any]:
    """The row as one Chat Completions request ``{model, messages: prompt + [completion],
    tools}`` (``tools`` only when there are some): what the strict validator checks."""
    body: dict[str, Any] = {"model": model, "messages": [*prompt, completion]}
    if tools:
        body["tools"] = tools
    return body


def trainer_columns(
    conv: Conversation | None,
    action: Action,
    protocol: str,
    segments: Segmenter,
    *,
    compacted: bool = False,
    boundary: bool = False,
    tools_absent: bool = False,
    gap: bool = False,
    incomplete: bool = False,
    call_ids: list[str | None] | None = None,
    normalise_usage: Callable[[Any], TokenUsage] | None = None,
) -> dict[str, Any]:
    """The trainer's columns of one row: ``prompt``, ``tools``, ``tools_dropped``,
    ``tools_absent``, ``tools_unoffered`` (the names, once each, of the tools the completion
    calls that ``tools`` does not offer; empty when ``tools_absent``), ``completion``, ``usage``,
    ``usage_raw``, ``segment``, ``segment_break``.
    ``conv``: the request the model answered (None when it cannot be read: prompt and tools
    empty, the row its own segment's start); ``protocol``: of the reply's usage; ``call_ids``:
    :func:`chat_completion`'s; ``normalise_usage``: how the action's usage reads (default: the
    ``protocol`` module's ``normalised_usage``); ``gap``: the step is flagged a gap
    (:data:`GAP_FLAGS`); ``incomplete``: the prompt is partial (:class:`SegmentBreak`
    ``PROMPT_INCOMPLETE``)."""
    prompt, tools, dropped = chat_prompt(conv) if conv is not None else ([], [], [])
    completion = chat_completion(action, call_ids)
    dropped = _server_dropped(dropped, (c.name for c in action.tool_calls if c.kind == SERVER))
    usage, usage_raw = chat_usage(normalise_usage or get_protocol(protocol).normalised_usage, action.usage)
    offered = {t["function"]["name"] for t in tools}
    called = [c["function"]["name"] for c in completion.get("tool_calls") or ()]
    # a file without tools gives none to compare with: unknown, not unoffered
    unoffered = [] if tools_absent else [n for n in dict.fromkeys(called) if n not in offered]
    segment, why = segments.next(prompt, tools, completion, compacted, boundary, gap, incomplete)
    return {
        "prompt": prompt,
        "tools": tools,
        "tools_dropped": dropped,
        "tools_absent": tools_absent,
        "tools_unoffered": unoffered,
        "completion": completion,
        "usage": usage,
        "usage_raw": usage_raw,
        "segment": segment,
        "segment_break": why,
    }
