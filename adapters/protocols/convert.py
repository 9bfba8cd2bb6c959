"""The transcoder: a conversation of one wire protocol rendered in another, with what was dropped
or rewritten on the way.

What a conversation keeps across protocols is its canonical fields
(:class:`~pvisor.journal.model.Conversation`: the system prompt's text, tool definitions by
name, description and JSON-Schema parameters, messages of text, reasoning, tool calls and tool
results); the other protocol's own objects (``raw``: blocks, items, contents as sent) mean
nothing in the target and are left out (:func:`plain`), so that the target's ``render_request``
lays each part out in its own shape. The target's facts decide the rest
(:class:`~pvisor.adapters.protocols.contract.WireProtocol`): ``RESULTS_ROLE`` (the role tool
results are sent with), ``TOOL_SCHEMA_REQUIRED``, ``converted_tool_raw`` (Responses
``strict``), ``REQUIRED_PARAMS``, ``SIGNED_REASONING`` (reasoning without a signature of the
target's own is refused by its API, so left out).

- :func:`convert`: a whole conversation, returning :class:`Converted` (the conversation, and
  each :class:`Change` dropped or rewritten); :func:`render` the same and the request body.
- The pieces prepare-only's native render (:mod:`pvisor.replay.prefix`) uses when it renders a
  native trajectory or a ``--profile-from`` capture of another protocol: :func:`plain`,
  :func:`plain_message`, :func:`plain_action`, :func:`texts_only`, :func:`convert_tools`,
  :func:`without_unsigned_reasoning`.

Pure: nothing given is changed (copies are made), nothing is written, no error but KeyError for
an unknown protocol name.
"""

from __future__ import annotations

import copy
from dataclasses import field, replace
from typing import Any

from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Action, Conversation, Message, Reasoning, TextPart, ToolResult, ToolSpec
from pvisor.core.record import Record, record

#: a profile or conversation tool that is not a function tool (a provider's built-in such as
#: Anthropic ``web_search``): the target has no equivalent
TOOL_NOT_CONVERTED = "tool_not_converted"
#: a reasoning block without a signature of the target's own (``SIGNED_REASONING``)
REASONING_NOT_CONVERTED = "reasoning_not_converted"
#: a body parameter of the source protocol (its names and meanings are its own)
PARAM_NOT_CONVERTED = "param_not_converted"
#: a parameter the target requires, given its default (``REQUIRED_PARAMS``)
PARAM_DEFAULTED = "param_defaulted"
#: the system prompt as the source sent it (its blocks, items or messages): its text is rendered
SYSTEM_RESHAPED = "system_reshaped"
#: a message of tool results sent with the target's ``RESULTS_ROLE``
RESULTS_ROLE_CHANGED = "results_role_changed"


@record
class Change(Record):
    """One thing the transcoder dropped or rewrote.

    Fields:
        kind: one of this module's constants (:data:`TOOL_NOT_CONVERTED`, ...).
        where: the place in the source conversation: ``tools[i]``, ``messages[i]``,
            ``params.NAME``, ``system``.
        detail: one sentence saying what it was and what became of it.
    """

    kind: str
    where: str
    detail: str

    def __init__(self, kind: str, where: str, detail: str) -> None:
        self.kind = kind
        self.where = where
        self.detail = detail


@record
class Converted(Record):
    """A conversation rendered in another protocol.

    Fields:
        conversation: the conversation of the target protocol (``protocol`` set to it).
        dropped: what could not pass (:class:`Change`, in source order).
        rewritten: what passed in another shape.
    """

    conversation: Conversation
    dropped: list[Change] = field(default_factory=list)
    rewritten: list[Change] = field(default_factory=list)

    def __init__(
        self,
        conversation: Conversation,
        dropped: list[Change] | None = None,
        rewritten: list[Change] | None = None,
    ) -> None:
        self.conversation = conversation
        self.dropped = [] if dropped is None else dropped
        self.rewritten = [] if rewritten is None else rewritten


# --------------------------------------------------------------------------- pieces


def plain(part: Any) -> Any:
    """``part`` (a message part, tool definition, reasoning or tool call) without the source
    protocol's own object (``raw``): the canonical fields alone."""
    return replace(part, raw=None) if getattr(part, "raw", None) is not None else part


def plain_message(m: Message) -> Message:
    """``m`` of canonical parts alone, its own ``raw`` left out too."""
    return Message(m.role, [plain(p) for p in m.parts])


def plain_action(a: Action) -> Action:
    """An action without its raw reply and its reasoning's and tool calls' ``raw``."""
    return replace(
        a, raw=None, reasoning=[plain(r) for r in a.reasoning], tool_calls=[plain(c) for c in a.tool_calls]
    )


def texts_only(m: Message) -> Message:
    """``m`` with its text parts of canonical text alone (another protocol's text blocks carry
    its own keys); other parts as they are."""
    return Message(m.role, [TextPart(p.text) if isinstance(p, TextPart) else p for p in m.parts])


def convert_tools(
    source_protocol: str, protocol: str, tools: list[ToolSpec]
) -> tuple[list[ToolSpec], list[Change]]:
    """Tools sent in ``source_protocol``, for a render in ``protocol``: the canonical ToolSpec
    (name, description, JSON-Schema parameters) without the other protocol's ``raw``
    definition, so that the target's ``render_request`` writes its own shape (Gemini
    ``functionDeclarations``, Responses flat function tools, Anthropic ``input_schema``). A
    function without parameters gets the empty object schema where the target requires one
    (``TOOL_SCHEMA_REQUIRED``); the target's ``converted_tool_raw`` adds what the canonical
    fields do not carry (Responses ``strict``: false unless the Chat definition said true). A
    tool that is not a function tool (a provider's built-in such as Anthropic ``web_search``)
    has no equivalent: left out, a :data:`TOOL_NOT_CONVERTED` change. Returns (tools, dropped)."""
    mod = get_protocol(protocol)
    out: list[ToolSpec] = []
    dropped: list[Change] = []
    for i, t in enumerate(tools):
        raw_type = t.raw.get("type") if isinstance(t.raw, dict) else None
        if t.parameters is None and raw_type not in (None, "function"):
            dropped.append(
                Change(
                    TOOL_NOT_CONVERTED,
                    f"tools[{i}]",
                    f"tool {t.name} ({raw_type}) of {source_protocol} has no {protocol} equivalent: left out",
                )
            )
            continue
        params = copy.deepcopy(t.parameters)
        if params is None and mod.TOOL_SCHEMA_REQUIRED:
            params = {"type": "object", "properties": {}}  # Chat/Gemini: no parameters = none taken
        raw = mod.converted_tool_raw(t)
        out.append(ToolSpec(name=t.name, description=t.description, parameters=params, raw=raw))
    return out, dropped


def without_unsigned_reasoning(protocol: str, messages: list[Message]) -> tuple[list[Message], list[Change]]:
    """The messages without reasoning ``protocol`` cannot take when it is ``SIGNED_REASONING``
    (a thinking block needs a signature of its own: reasoning of another protocol has none, nor
    encrypted content, nor a raw block of the target's); a message left with no part is left out.
    Returns (messages, one :data:`REASONING_NOT_CONVERTED` change per block left out); for
    another protocol, the messages as they are."""
    mod = get_protocol(protocol)
    if not mod.SIGNED_REASONING:
        return messages, []
    out: list[Message] = []
    dropped: list[Change] = []
    for i, m in enumerate(messages):
        parts = [
            p
            for p in m.parts
            if not (isinstance(p, Reasoning) and not p.signature and not p.encrypted and p.raw is None)
        ]
        dropped.extend(
            Change(
                REASONING_NOT_CONVERTED,
                f"messages[{i}]",
                f"a reasoning block without a {mod.TITLE} signature: left out",
            )
            for _ in range(len(m.parts) - len(parts))
        )
        if parts or not m.parts:
            out.append(Message(m.role, parts, raw=m.raw) if len(parts) != len(m.parts) else m)
    return out, dropped


# --------------------------------------------------------------------------- whole conversations


def convert(conv: Conversation, protocol: str) -> Converted:
    """``conv`` (of ``conv.protocol``) as a conversation of ``protocol`` (module docstring). The
    model and the stream flag pass; the system prompt passes as its text (its shape a
    :data:`SYSTEM_RESHAPED` rewrite); tools by :func:`convert_tools`; messages of canonical
    parts, a message of tool results alone with the target's ``RESULTS_ROLE`` (consecutive ones,
    Chat's one message per result, joined into one: every protocol's render lays the results of
    one action out itself); reasoning by :func:`without_unsigned_reasoning`; the source's
    parameters are dropped (:data:`PARAM_NOT_CONVERTED`) and the target's required ones given
    their defaults. A conversation already of ``protocol`` is returned as a copy, unchanged."""
    if conv.protocol == protocol:
        return Converted(copy.deepcopy(conv))
    mod = get_protocol(protocol)
    dropped: list[Change] = []
    rewritten: list[Change] = []
    out = Conversation(protocol=protocol, model=conv.model, system=conv.system, stream=conv.stream)
    if conv.system_raw is not None:
        rewritten.append(
            Change(
                SYSTEM_RESHAPED,
                "system",
                f"the system prompt's {conv.protocol} shape: its text is sent in the {protocol} shape",
            )
        )
    out.tools, gone = convert_tools(conv.protocol, protocol, conv.tools)
    dropped.extend(gone)
    for k in conv.params:
        dropped.append(Change(PARAM_NOT_CONVERTED, f"params.{k}", f"{conv.protocol} parameter {k}: left out"))
    for k, v in mod.REQUIRED_PARAMS.items():
        out.params[k] = copy.deepcopy(v)
        rewritten.append(Change(PARAM_DEFAULTED, f"params.{k}", f"{protocol} requires {k}: {v!r} given"))
    messages: list[Message] = []
    results_at: int | None = None  # index in ``messages`` of the results message being joined
    for i, m in enumerate(conv.messages):
        msg = plain_message(m)
        if msg.parts and all(isinstance(p, ToolResult) for p in msg.parts):
            if msg.role != mod.RESULTS_ROLE:
                rewritten.append(
                    Change(
                        RESULTS_ROLE_CHANGED,
                        f"messages[{i}]",
                        f"tool results sent as {mod.RESULTS_ROLE}, not {msg.role}",
                    )
                )
            if results_at is not None:
                messages[results_at].parts.extend(msg.parts)
                continue
            msg = Message(mod.RESULTS_ROLE, list(msg.parts))
            results_at = len(messages)
        else:
            results_at = None
        messages.append(msg)
    out.messages, gone = without_unsigned_reasoning(protocol, messages)
    dropped.extend(gone)
    return Converted(out, dropped, rewritten)


def render(conv: Conversation, protocol: str) -> tuple[bytes, Converted]:
    """:func:`convert`, and the request body of the result (``render_request`` of
    ``protocol``, compact JSON)."""
    converted = convert(conv, protocol)
    return get_protocol(protocol).render_request(converted.conversation), converted
