"""A model call's request and reply as the OpenTelemetry GenAI conventions' messages (the JSON of
``gen_ai.input.messages``, ``gen_ai.output.messages`` and ``gen_ai.system_instructions``;
semantic-conventions ``docs/gen-ai/gen-ai-input-messages.json``, ``gen-ai-output-messages.json``,
``gen-ai-system-instructions.json``), made from pvisor's canonical conversation
(:class:`~pvisor.journal.model.Conversation`, a protocol's ``parse_request``) and action
(:class:`~pvisor.journal.model.Action`, its ``response_to_action``), so that every protocol gives
the one schema (docs/exports.md, "otel").

Shapes:

- a message: ``{"role", "parts": [...]}``; an output message adds ``finish_reason``;
- parts: ``{"type": "text", "content"}``; ``{"type": "reasoning", "content"}`` (reasoning with
  visible text; signed or encrypted reasoning without text is left out: it says nothing a
  reader can show); ``{"type": "tool_call", "id", "name", "arguments"}`` (``arguments`` the
  parsed object, else the exact text); ``{"type": "tool_call_response", "id", "response"}``
  (the result's content as the agent sent it: a string, or the provider's blocks); any other
  part (an image, a document) ``{"type": KIND, "content": RAW}``, the conventions' generic part;
- roles: the conversation's (``user``, ``assistant``, ``system``, ``developer``); the tool
  results of a message are a message of role ``tool`` of their own, in place (Anthropic and
  Gemini send them inside a user message, the conventions as the tool's);
- the system instructions: ``[{"type": "text", "content": SYSTEM}]``, or None when the request
  has none.
"""

from __future__ import annotations

from typing import Any

from pvisor.adapters.jsonio import dumps
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.core.errors import PvisorError
from pvisor.journal.model import (
    Action,
    Conversation,
    Message,
    OtherPart,
    Reasoning,
    TextPart,
    ToolCall,
    ToolResult,
)

#: the conventions' ``finish_reason`` values (FinishReason in gen-ai-output-messages.json)
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CONTENT_FILTER = "content_filter"
FINISH_TOOL_CALL = "tool_call"
FINISH_ERROR = "error"

#: words of a protocol's stop reason that say the reply hit its token limit, or was filtered
#: (Anthropic ``max_tokens``, Chat ``length``, Gemini ``MAX_TOKENS``, Responses
#: ``max_output_tokens``; ``content_filter``, ``SAFETY``, ``refusal``)
_LENGTH_WORDS = ("length", "max")
_FILTER_WORDS = ("filter", "safety", "refusal", "blocklist", "prohibited", "recitation")


def part(p: Any) -> dict[str, Any] | None:
    """The conventions' part of a canonical part (module docstring), or None (reasoning without
    text)."""
    if isinstance(p, TextPart):
        return {"type": "text", "content": p.text}
    if isinstance(p, Reasoning):
        return {"type": "reasoning", "content": p.text} if p.text else None
    if isinstance(p, ToolCall):
        return tool_call(p)
    if isinstance(p, ToolResult):
        return {"type": "tool_call_response", "id": p.call_id, "response": p.content}
    if isinstance(p, OtherPart):
        return {"type": p.kind, "content": p.raw}
    raise TypeError(f"not a canonical part: {p!r}")  # pragma: no cover - a programming error


def tool_call(c: ToolCall) -> dict[str, Any]:
    """``{"type": "tool_call", "id", "name", "arguments"}``: the parsed arguments, else (not
    JSON, a free-form tool's input) the exact text."""
    args = c.arguments if c.arguments is not None else c.arguments_raw
    return {"type": "tool_call", "id": c.id, "name": c.name, "arguments": args}


def _messages(m: Message) -> list[dict[str, Any]]:
    """The conventions' messages of one canonical message: its parts in order, a run of tool
    results as a message of role ``tool``."""
    out: list[dict[str, Any]] = []
    for p in m.parts:
        role = "tool" if isinstance(p, ToolResult) else m.role
        converted = part(p)
        if converted is None:
            continue
        if not out or out[-1]["role"] != role:
            out.append({"role": role, "parts": []})
        out[-1]["parts"].append(converted)
    if not m.parts:
        out.append({"role": m.role, "parts": []})
    return out


def input_messages(conv: Conversation | None) -> list[dict[str, Any]] | None:
    """``gen_ai.input.messages`` of a request's conversation (its messages, the system prompt
    apart: :func:`system_instructions`); None when the request did not parse."""
    if conv is None:
        return None
    return [x for m in conv.messages for x in _messages(m)]


def system_instructions(conv: Conversation | None) -> list[dict[str, Any]] | None:
    """``gen_ai.system_instructions``: the request's system prompt as one text part; None when
    it has none or did not parse."""
    if conv is None or conv.system is None:
        return None
    return [{"type": "text", "content": conv.system}]


def finish_reason(action: Action) -> str:
    """The conventions' ``finish_reason`` of a reply: ``tool_call`` when it calls a tool,
    ``length`` when its stop reason says a token limit, ``content_filter`` when it says a
    filter, else ``stop``. The rule reads words of any protocol's stop reason
    (:data:`_LENGTH_WORDS`, :data:`_FILTER_WORDS`), so one rule serves the four."""
    if action.tool_calls:
        return FINISH_TOOL_CALL
    said = (action.stop_reason or "").lower()
    if any(w in said for w in _LENGTH_WORDS):
        return FINISH_LENGTH
    if any(w in said for w in _FILTER_WORDS):
        return FINISH_CONTENT_FILTER
    return FINISH_STOP


def output_messages(action: Action | None) -> list[dict[str, Any]] | None:
    """``gen_ai.output.messages`` of a reply: one assistant message (reasoning, text, tool
    calls, in that order, as the replies give them) with its :func:`finish_reason`; None when
    the exchange has no reply that reads as one."""
    if action is None:
        return None
    parts = [p for p in (part(r) for r in action.reasoning) if p is not None]
    if action.text:
        parts.append({"type": "text", "content": action.text})
    parts.extend(tool_call(c) for c in action.tool_calls)
    return [{"role": "assistant", "parts": parts, "finish_reason": finish_reason(action)}]


def reply_of(mod: Any, final: Any) -> tuple[Action | None, TokenUsage]:
    """A reply's final object (the provider's shape: a non-streamed reply, or a stream
    reassembled) read by its protocol module ``mod``: its action and its token counts, one
    spelling for every protocol (``mod.normalised_usage``: cache reads and writes, reasoning).
    ``(None, TokenUsage())`` when ``mod`` is None, ``final`` is not an object or does not read
    as a reply (an error body)."""
    if mod is None or not isinstance(final, dict):
        return None, TokenUsage()
    try:
        action = mod.response_to_action(final)
    except PvisorError:  # a reply that does not read as one: no action, no counts
        return None, TokenUsage()
    return action, mod.normalised_usage(action.usage)


def json_text(value: Any) -> str | None:
    """``value`` as JSON text (a string as it is), for an attribute; None for None, and for a
    value nested deeper than JSON can be written (the attribute is then left out)."""
    if value is None or isinstance(value, str):
        return value
    try:
        return dumps(value).decode()
    except ValueError:
        return None
