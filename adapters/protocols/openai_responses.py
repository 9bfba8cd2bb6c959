"""OpenAI Responses API (``POST /v1/responses``), the protocol Codex CLI speaks.

Implements the wire-protocol module contract of :mod:`pvisor.adapters.protocols.base`.
Sources: openai-python
``lib/streaming/responses/_responses.py::accumulate_event`` (reassembly), the OpenAI streaming
guide (event types, ``sequence_number``), vercel/ai fixtures (``custom_tool_call_input.delta``,
reasoning summary events, the ``obfuscation`` padding field) and the Codex 0.171 requests in
``corpus/requests/codex-0.171.0.jsonl``.

How a request body maps to the canonical :class:`~pvisor.journal.model.Conversation`:

- ``instructions`` (when a non-null value) is the system prompt: ``system_raw`` keeps it exactly,
  ``system`` is its text. Codex 0.171 sends no ``instructions``: its base prompt and skill list are
  ``role: developer`` message items at the start of ``input``. Those stay **messages** (role
  ``developer``), in input order, so that the input round-trips item for item and the chain rule
  compares them as part of the message prefix (a changed developer prompt breaks the chain at
  message 0 exactly as a changed system prompt would). :func:`developer_prompt` returns their
  text for display.
- ``input`` items are grouped into messages:
    * a ``message`` item whose role is not ``assistant`` is one Message with that role
      (``user``, ``developer``, ``system``); ``raw`` is the item; so is any other item with
      such a ``role`` (Codex's ``additional_tools`` item, ``role: developer``: the client's own
      input, never a reply; :func:`offered_tools` reads the tools it holds);
    * a run of consecutive model-output items (``reasoning``, assistant ``message``,
      ``function_call``, ``custom_tool_call``, provider-run calls such as ``web_search_call``,
      and unknown item types) is one ``assistant`` Message, so that one model reply (one action,
      one batch of parallel calls) is one message as in the other protocols; ``raw`` is the list
      of items;
    * a run of consecutive ``*_output`` items (``function_call_output``,
      ``custom_tool_call_output``, ...) is one ``tool`` Message; ``raw`` is the list of items.
- Parts: ``input_text``/``output_text`` content -> TextPart; other content parts -> OtherPart;
  ``function_call`` -> ToolCall (``id`` = ``call_id``, ``arguments_raw`` the exact string);
  ``custom_tool_call`` -> ToolCall kind ``custom`` (``arguments_raw`` = ``input``);
  provider-run ``*_call`` items (web/file search, code interpreter, image generation, MCP,
  tool search) -> ToolCall kind ``server`` (name = type without ``_call``, arguments = the item's
  other fields, id None: no result ever answers them); ``function_call_output`` /
  ``custom_tool_call_output`` -> ToolResult (``call_id``, content = ``output``); ``reasoning`` ->
  Reasoning (text = summary texts joined with a blank line, ``encrypted`` =
  ``encrypted_content`` verbatim); anything else -> OtherPart(kind = item type).
- Item ``id``\\ s (server ``fc_``/``msg_``/``rs_`` ids and the ``msg_``/``fco_`` ids Codex makes
  itself) are not canonical fields, so the chain rule never sees them; ``call_id``\\ s are
  server-made and are compared (``keep_call_ids=True``).
- ``previous_response_id`` stays in ``params``: with it the server holds part of the prefix
  (the server adds the stored response's input and output), which the journal must mark incomplete.
- ``stream: true`` -> ``Conversation.stream``; every other top-level field -> ``params``.

Rendering (:func:`render_request`) works from canonical fields alone and uses ``raw`` only while
it still says what the canonical fields say: a message whose ``raw`` re-parses to the same parts
is emitted verbatim (byte-exact for unchanged input), otherwise it is rebuilt part by part, each
part overlaying its canonical fields onto a copy of its own ``raw`` item to keep provider extras
(``status``, ``id``, ``phase``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable


from pvisor.adapters.protocols.base import (
    as_list,
    check_insert,
    compact_json,
    dig,
    dumps,
    field_state,
    first_int,
    openai_usage,
    IdSource,
    json_type,
    loads_json,
    loads_object,
    memo_message,
    no_cache_breakpoints,
    no_cache_markers,
    no_token_counts,
    normalise_conversation,
    parse_arguments,
    ParseMemo,
    path_unchanged,
    place,
    Reassembled,
    refusal_message,
    request_parser,
    same_parts,
    short,
    stream_in_body,
    strip_volatile,
    with_body_model,
)
from pvisor.core.lazyre import LazyPattern
from pvisor.journal.model import (
    Action,
    Conversation,
    Message,
    OtherPart,
    Part,
    Reasoning,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)

if TYPE_CHECKING:
    from pvisor.adapters.protocols.sse import SSEEvent

NAME = "openai-responses"
#: ``gen_ai.provider.name`` of the OpenTelemetry GenAI semantic conventions (exports: otel)
GEN_AI_PROVIDER = "openai"
#: ``gen_ai.operation.name`` of a model call (a chat, as the conventions' OpenAI spans name it)
GEN_AI_OPERATION = "chat"
#: the prefix of a tool call id this protocol's replies carry (a handoff names its calls with it)
CALL_ID_PREFIX = "call_"
#: Exact request paths served (no query string). ``/v1/responses/compact`` and
#: ``GET /v1/responses/{id}`` are different endpoints and are not handled here.
PATHS: tuple[str, ...] = ("/v1/responses",)
#: the wire-protocol facts (:class:`~pvisor.adapters.protocols.contract.WireProtocol` says what each
#: means)
TITLE = "OpenAI Responses"
DEFAULT_TARGET = ("POST", "/v1/responses", "")
UNSTREAMED_TARGET = DEFAULT_TARGET
MODEL_IN_PATH = False
ENTRIES_KEY = "input"
RESULTS_ROLE = "tool"
#: a function_call_output takes ``input_image`` content (a handoff keeps an image B's re-run reads)
TOOL_RESULT_IMAGES = True
#: reasoning travels in items of its own (``encrypted_content``): ``--source-reasoning keep``
STANDALONE_REASONING = True
TOOL_SCHEMA_REQUIRED = True  # a function tool's ``parameters`` is required
REQUIRED_PARAMS: dict[str, Any] = {}
SIGNED_REASONING = False
path_for_model = path_unchanged
cache_breakpoints = no_cache_breakpoints
CACHE_MARKERS = False
#: how the prompt cache reuses an earlier request's prompt (``pvisor diff``,
#: :mod:`pvisor.adapters.request_diff`): as Chat Completions' (OpenAI's prompt caching guide,
#: https://platform.openai.com/docs/guides/prompt-caching: an exact common prefix of 1,024
#: tokens or more, in 128-token increments); the cached count is the reply's
#: ``usage.input_tokens_details.cached_tokens``
PROMPT_CACHE: dict[str, Any] = {
    "rule": "increments",
    "marker": None,
    "min_tokens": 1024,
    "increment_tokens": 128,
    "usage_field": "input_tokens_details.cached_tokens",
    "source": "https://platform.openai.com/docs/guides/prompt-caching",
}
#: where a request carries its credential: ``authorization: Bearer <key>`` (the OpenAI API
#: reference, "Authentication"; Codex sends its key so); no query parameter
CREDENTIAL_HEADERS: tuple[str, ...] = ("authorization",)
CREDENTIAL_QUERY: tuple[str, ...] = ()
place_cache_markers = no_cache_markers
counts_tokens = no_token_counts
# the model is the body's ``model`` field; the path is unchanged
with_model = with_body_model
# a stream when the body has ``"stream": true`` (OpenAI Responses API reference)
wants_stream = stream_in_body

#: ``created_at`` of replies rendered by :func:`action_to_response` (2026-01-01T00:00:00Z), fixed
#: so that a rendered reply is byte-identical from run to run.
FIXED_CREATED_AT = 1767225600

_TEXT_TYPES = frozenset({"input_text", "output_text"})
# the fields of a message item (others, e.g. a Chat message's tool_calls, are not carried over)
_MESSAGE_KEYS = frozenset({"type", "id", "role", "content", "status", "phase"})
# provider-run tool items: the model's call and its result live in one item, no client output
_SERVER_CALL_TYPES = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_call",
        "tool_search_call",
    }
)

_RESULT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
_TERMINAL = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
#: the events of a whole part (event type without ``.added``/``.done`` -> the item's list of
#: parts, the index field)
_PART_EVENTS = {
    "response.content_part": ("content", "content_index"),
    "response.reasoning_summary_part": ("summary", "summary_index"),
}
#: the events of a string field, streamed as ``.delta`` events and assigned by ``.done`` (event
#: type without the suffix -> the item's list of parts holding it, the index field, the part a
#: delta creates, the field; a list of None: the field is the item's own)
_TEXT_EVENTS: dict[str, tuple] = {
    "response.output_text": ("content", "content_index", {"type": "output_text", "text": ""}, "text"),
    "response.refusal": ("content", "content_index", {"type": "refusal", "refusal": ""}, "refusal"),
    "response.function_call_arguments": (None, None, None, "arguments"),
    "response.custom_tool_call_input": (None, None, None, "input"),
    "response.reasoning_summary_text": (
        "summary",
        "summary_index",
        {"type": "summary_text", "text": ""},
        "text",
    ),
    "response.reasoning_text": ("content", "content_index", {"type": "reasoning_text", "text": ""}, "text"),
}


# --------------------------------------------------------------------------- paths


def matches(path: str) -> bool:
    """True for ``/v1/responses`` (the path without query string)."""
    return path in PATHS


# --------------------------------------------------------------------------- request items -> parts


def _reasoning_text(item: dict) -> str:
    """Visible reasoning of a ``reasoning`` item: ``summary[].text`` joined with a blank line,
    or, when there is no summary text, ``content[]`` ``reasoning_text`` joined the same way."""
    texts = [s.get("text", "") for s in as_list(item.get("summary")) if isinstance(s, dict) and s.get("text")]
    if not texts:
        texts = [
            c.get("text", "")
            for c in as_list(item.get("content"))
            if isinstance(c, dict) and c.get("type") == "reasoning_text" and c.get("text")
        ]
    return "\n\n".join(texts)


def _content_parts(content: Any) -> list[Part]:
    """Parts of a ``message`` item's ``content`` (a string or a list of content parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    if not isinstance(content, list):
        return [OtherPart("invalid_content", raw=content)]
    parts: list[Part] = []
    for c in content:
        if isinstance(c, dict) and c.get("type") in _TEXT_TYPES and isinstance(c.get("text", ""), str):
            parts.append(TextPart(c.get("text", ""), raw=c))
        else:
            kind = c.get("type") if isinstance(c, dict) and isinstance(c.get("type"), str) else "unknown"
            parts.append(OtherPart(kind, raw=c))
    return parts


def _item_type(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    t = item.get("type")
    if t is None and "role" in item:
        return "message"  # EasyInputMessage: ``type`` may be omitted
    return t if isinstance(t, str) else None


def _item_side(item: Any) -> str:
    """``own`` (a user/developer/system message: its own Message), ``assistant`` (model output)
    or ``tool`` (a result the client sends back)."""
    t = _item_type(item)
    if t is None:
        return "own"
    if t == "message":
        return "assistant" if item.get("role") == "assistant" else "own"
    if item.get("role") in ("user", "developer", "system"):
        return "own"  # an input item of the client's own with a role (Codex's additional_tools)
    if t.endswith("_output"):
        return "tool"
    return "assistant"


def _item_to_call(item: dict) -> ToolCall | None:
    """ToolCall for ``function_call``, ``custom_tool_call`` and provider-run call items, else None."""
    t = item.get("type")
    if t == "function_call":
        args = item.get("arguments", "")
        raw_args = args if isinstance(args, str) else compact_json(args)
        return ToolCall(
            item.get("call_id"),
            str(item.get("name", "")),
            raw_args,
            parse_arguments(raw_args),
            "function",
            item,
        )
    if t == "custom_tool_call":
        text = item.get("input", "")
        text = text if isinstance(text, str) else compact_json(text)
        return ToolCall(
            item.get("call_id"), str(item.get("name", "")), text, parse_arguments(text), "custom", item
        )
    if t in _SERVER_CALL_TYPES:
        args = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
        return ToolCall(None, t[: -len("_call")], compact_json(args), args, "server", item)
    return None


def _item_parts(item: Any) -> list[Part]:
    """Canonical parts of one input/output item (see the module docstring for the mapping)."""
    t = _item_type(item)
    if t is None:
        return [OtherPart("invalid_item", raw=item)]
    if t == "message":
        return _content_parts(item.get("content"))
    if t == "reasoning":
        enc = item.get("encrypted_content")
        return [Reasoning(_reasoning_text(item), None, enc if isinstance(enc, str) else None, raw=item)]
    if t in _RESULT_TYPES:
        return [ToolResult(item.get("call_id"), item.get("output"), raw=item)]
    call = _item_to_call(item)
    if call is not None:
        return [call]
    return [OtherPart(t, raw=item)]


def _items_to_messages(items: list, memo: ParseMemo | None = None) -> list[Message]:
    """Group input items into messages (module docstring, "input items are grouped"); with a
    ``memo``, the leading items of a list read before and any message (an item, or a group of
    items) read before are not read again."""
    if memo is not None:
        read = memo.start(items)
        out, starts, first = read.messages, read.starts, memo.next_entry(read)
    else:
        out, starts, first = [], [], 0
    group: list = []
    group_side = ""
    group_start = 0

    def flush() -> None:
        nonlocal group, group_side
        if group:
            members, side = group, group_side

            def build() -> Message:
                parts: list[Part] = []
                for it in members:
                    parts.extend(_item_parts(it))
                return Message(side, parts, raw=members)

            out.append(memo_message(memo, members, build, side))
            starts.append(group_start)
        group, group_side = [], ""

    for idx in range(first, len(items)):
        item = items[idx]
        side = _item_side(item)
        if side == "own":
            flush()
            role = item.get("role", "user") if isinstance(item, dict) else "user"
            out.append(
                memo_message(
                    memo,
                    item,
                    lambda item=item, role=role: Message(str(role), _item_parts(item), raw=item),
                    "own",
                )
            )
            starts.append(idx)
        else:
            if side != group_side:
                flush()
                group_side = side
                group_start = idx
            group.append(item)
    flush()
    return out


def _system_text(value: Any) -> str | None:
    """Text of ``instructions``: the string itself, or the texts of a list of input items."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for m in _items_to_messages(value):
            texts.extend(p.text for p in m.parts if isinstance(p, TextPart))
        return "\n\n".join(texts)
    return None


@request_parser("OpenAI Responses")
def parse_request(
    body: Any, *, path: str = "", query: Any = "", memo: ParseMemo | None = None
) -> Conversation:
    """Read a Responses request body (bytes, str or parsed dict) into a Conversation.

    Mapping: module docstring. ``model`` from the body. Raises BadInputError when the body is not
    a JSON object. Never fails on odd items: they become OtherPart. ``memo``: a
    :class:`~pvisor.adapters.protocols.base.ParseMemo` shared by the requests of one session."""
    obj = loads_object(body, "Responses request body")
    conv = Conversation(protocol=NAME)
    model = obj.get("model")
    conv.model = model if isinstance(model, str) else None
    for key, value in obj.items():
        if key == "model" and conv.model is not None:
            continue
        if key == "instructions" and value is not None and _system_text(value) is not None:
            conv.system_raw = value
            conv.system = _system_text(value)
        elif key == "stream" and value is True:
            conv.stream = True
        elif key == "input" and isinstance(value, str):
            conv.messages = [Message("user", [TextPart(value)], raw=value)]
        elif key == "input" and isinstance(value, list) and value:
            conv.messages = _items_to_messages(value, memo)
        elif key == "tools" and isinstance(value, list) and value:
            conv.tools = [_tool_spec(t) for t in value]
        else:
            conv.params[key] = value
    return conv


def _tool_spec(tool: Any) -> ToolSpec:
    """ToolSpec of one ``tools[]`` entry. Function tools carry their JSON Schema ``parameters``;
    other kinds (``custom``, ``web_search``, ``namespace``, ...) keep everything in ``raw``."""
    if not isinstance(tool, dict):
        return ToolSpec("", None, None, raw=tool)
    kind = tool.get("type", "function")
    name = tool.get("name")
    name = name if isinstance(name, str) else str(kind)
    desc = tool.get("description") if isinstance(tool.get("description"), str) else None
    params = tool.get("parameters") if kind == "function" else None
    return ToolSpec(name, desc, params, raw=tool)


def developer_prompt(conv: Conversation) -> str | None:
    """The text of the leading ``developer``/``system`` messages of ``input`` (where Codex puts
    its base prompt), joined with a blank line; None when the input starts otherwise."""
    texts: list[str] = []
    for m in conv.messages:
        if m.role not in ("developer", "system"):
            break
        texts.extend(p.text for p in m.parts if isinstance(p, TextPart))
    return "\n\n".join(texts) if texts else None


def server_held_prefix(conv: Conversation) -> str | None:
    """Why part of this request's prefix lives on the server, or None when the body holds all of
    it: ``previous_response_id`` (the server adds the earlier response's input and output) or an
    ``item_reference`` input item (the server adds the stored response's input and output). A
    journal prefix of such a request is incomplete."""
    if conv.params.get("previous_response_id"):
        return "previous_response_id"
    for m in conv.messages:
        if any(isinstance(p, OtherPart) and p.kind == "item_reference" for p in m.parts):
            return "item_reference"
    return None


# --------------------------------------------------------------------------- normalise


def _is_function_tool(t: ToolSpec) -> bool:
    return not isinstance(t.raw, dict) or t.raw.get("type", "function") == "function"


def normalise(conv: Conversation) -> dict:
    """The chain rule's comparison form (:func:`~pvisor.adapters.protocols.base.normalise_conversation`
    with ``keep_call_ids=True``: Responses ``call_id``\\ s are made by the server and echoed).

    Item ids that Codex adds (``msg_…``, ``fco_…``) never reach canonical fields. Tools that are
    not function tools (``web_search``, ``namespace``, ``custom``) compare by their whole
    definition, without ids: a change in them is a change of tools."""
    out = normalise_conversation(conv, keep_call_ids=True)
    _normalise_other_tools(conv, out)
    return out


def _normalise_other_tools(conv: Conversation, out: dict) -> None:
    # the same stripping (ids, cache markers, signatures) as every part gets
    for spec, norm in zip(conv.tools, out["tools"]):
        if not _is_function_tool(spec):
            norm["parameters"] = strip_volatile(
                {k: v for k, v in spec.raw.items() if k not in ("name", "description")}
            )


# --------------------------------------------------------------------------- render request


def _raw_items_if_current(msg: Message) -> list | None:
    """The message's raw items when they still parse to exactly this message, else None."""
    raw = msg.raw
    if isinstance(raw, dict):
        items = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        return None
    again = _items_to_messages(items)
    if len(again) == 1 and again[0].role == msg.role and same_parts(again[0].parts, msg.parts):
        return list(items)
    return None


def _is_content_other(p: OtherPart) -> bool:
    """Whether an OtherPart is a message content part (``input_image``, ``refusal``, ...) rather
    than a whole item."""
    kind = p.raw.get("type") if isinstance(p.raw, dict) and isinstance(p.raw.get("type"), str) else p.kind
    return kind == "refusal" or kind.startswith("input_") or kind.startswith("output_")


def _text_content(p: TextPart, default_type: str) -> dict:
    c = (
        dict(p.raw)
        if isinstance(p.raw, dict) and p.raw.get("type") in _TEXT_TYPES
        else {"type": default_type}
    )
    c["text"] = p.text
    return c


def _call_item(tc: ToolCall) -> dict:
    raw = tc.raw if isinstance(tc.raw, dict) else None
    if tc.kind == "server":
        args = tc.arguments if isinstance(tc.arguments, dict) else {}
        if raw is not None and isinstance(raw.get("type"), str):
            item = dict(raw)
            item.update(args)
            return item
        item = {"type": f"{tc.name}_call"}
        if tc.id is not None:
            item["id"] = tc.id
        item.update(args)
        return item
    if tc.kind == "custom":
        item = (
            dict(raw)
            if raw is not None and raw.get("type") == "custom_tool_call"
            else {"type": "custom_tool_call"}
        )
        if tc.id is not None:
            item["call_id"] = tc.id
        item["name"] = tc.name
        item["input"] = tc.arguments_raw
        return item
    item = dict(raw) if raw is not None and raw.get("type") == "function_call" else {"type": "function_call"}
    item["name"] = tc.name
    item["arguments"] = tc.arguments_raw
    if tc.id is not None:
        item["call_id"] = tc.id
    return item


def _reasoning_item(r: Reasoning) -> dict:
    raw = r.raw if isinstance(r.raw, dict) and r.raw.get("type") == "reasoning" else None
    item = dict(raw) if raw is not None else {"type": "reasoning", "summary": []}
    if _reasoning_text(item) != r.text:
        item["summary"] = [{"type": "summary_text", "text": r.text}] if r.text else []
        if _reasoning_text(item) != r.text:  # the old text came from ``content``
            item.pop("content", None)
    if r.encrypted is not None:
        item["encrypted_content"] = r.encrypted
    elif item.get("encrypted_content") is not None:
        del item["encrypted_content"]
    return item


def _result_item(tr: ToolResult, call_kinds: dict) -> dict:
    raw = tr.raw if isinstance(tr.raw, dict) and tr.raw.get("type") in _RESULT_TYPES else None
    if raw is not None:
        item = dict(raw)
    else:
        custom = call_kinds.get(tr.call_id) == "custom"
        item = {"type": "custom_tool_call_output" if custom else "function_call_output"}
    if tr.call_id is not None:
        item["call_id"] = tr.call_id
    content = tr.content
    item["output"] = content if isinstance(content, (str, list)) else compact_json(content)
    return item


def _message_items(msg: Message, call_kinds: dict) -> list:
    """Input items of one message: its raw items when current, else rebuilt part by part."""
    raw_items = _raw_items_if_current(msg)
    if raw_items is not None:
        return raw_items
    role = msg.role if msg.role in ("user", "assistant", "system", "developer") else "user"
    text_type = "output_text" if role == "assistant" else "input_text"
    # wrappers of the raw message items, used in order for the rebuilt message items
    raw_list = msg.raw if isinstance(msg.raw, list) else [msg.raw] if isinstance(msg.raw, dict) else []
    wrappers = [it for it in raw_list if _item_type(it) == "message"]
    items: list = []
    pending: list = []

    def flush() -> None:
        nonlocal pending
        if not pending:
            return
        wrapper = wrappers.pop(0) if wrappers else None
        item: dict[str, Any] = {"type": "message"}
        if wrapper is not None:
            item.update((k, v) for k, v in wrapper.items() if k in _MESSAGE_KEYS)
        item["role"] = role
        if (
            wrapper is not None
            and isinstance(wrapper.get("content"), str)
            and len(pending) == 1
            and isinstance(pending[0], TextPart)
            and pending[0].raw is None
        ):
            item["content"] = pending[0].text
        else:
            item["content"] = [
                _text_content(p, text_type) if isinstance(p, TextPart) else p.raw for p in pending
            ]
        items.append(item)
        pending = []

    for p in msg.parts:
        if isinstance(p, TextPart) or (isinstance(p, OtherPart) and _is_content_other(p)):
            pending.append(p)
            continue
        flush()
        if isinstance(p, ToolCall):
            items.append(_call_item(p))
        elif isinstance(p, Reasoning):
            items.append(_reasoning_item(p))
        elif isinstance(p, ToolResult):
            items.append(_result_item(p, call_kinds))
        elif isinstance(p, OtherPart):
            items.append(p.raw)
    flush()
    return items


def _tool_def(t: ToolSpec) -> Any:
    raw = t.raw if isinstance(t.raw, dict) else None
    if raw is not None and not _is_function_tool(t):
        return raw
    if t.raw is not None and raw is None:
        return t.raw  # a malformed entry, kept as it was
    # raw is reused only when it is a Responses function tool (not another protocol's definition)
    d = dict(raw) if raw is not None and raw.get("type") == "function" else {"type": "function"}
    d["name"] = t.name
    if t.description is not None:
        d["description"] = t.description
    elif d.get("description") is not None:
        del d["description"]
    if t.parameters is not None:
        d["parameters"] = t.parameters
    elif d.get("parameters") is not None:
        del d["parameters"]
    return d


def render_request(conv: Conversation) -> bytes:
    """A Conversation as a Responses request body (compact JSON bytes).

    Key order: ``model``, ``instructions``, ``stream``, ``input``, ``tools``, then ``params`` in
    their order (Codex 0.171's order, so an unchanged Codex body renders byte-identical). Uses
    ``raw`` only where it still matches the canonical fields (module docstring)."""
    out: dict[str, Any] = {}
    if conv.model is not None:
        out["model"] = conv.model
    if conv.system_raw is not None and _system_text(conv.system_raw) == conv.system:
        out["instructions"] = conv.system_raw
    elif conv.system:
        out["instructions"] = conv.system
    if conv.stream:
        out["stream"] = True
    msgs = conv.messages
    if (
        len(msgs) == 1
        and isinstance(msgs[0].raw, str)
        and msgs[0].role == "user"
        and same_parts(msgs[0].parts, [TextPart(msgs[0].raw)])
    ):
        out["input"] = msgs[0].raw
    elif msgs:
        call_kinds = {
            p.id: p.kind for m in msgs for p in m.parts if isinstance(p, ToolCall) and p.id is not None
        }
        items: list = []
        for m in msgs:
            items.extend(_message_items(m, call_kinds))
        out["input"] = items
    if conv.tools:
        out["tools"] = [_tool_def(t) for t in conv.tools]
    for k, v in conv.params.items():
        if k not in out:
            out[k] = v
    return dumps(out)


# --------------------------------------------------------------------------- reassembly


class _Accumulator:
    """State of one Responses stream being reassembled (rules: openai-python's ``accumulate_event``
    for Responses)."""

    def __init__(self) -> None:
        self.snapshot: dict | None = None
        self.items: list = []
        self.terminal: Any = None
        self.terminal_type: str | None = None
        self.error: Any = None
        self.problems: list[str] = []
        self.events = 0
        self.last_seq: int | None = None
        self.seen_seq: set[int] = set()
        self.started = False
        self.warned_no_created = False

    # -- helpers

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def item(self, obj: dict, what: str) -> dict | None:
        idx = obj.get("output_index")
        if isinstance(idx, int) and 0 <= idx < len(self.items) and isinstance(self.items[idx], dict):
            return self.items[idx]
        self.problem(f"{what} for output_index {idx!r} that no output_item.added announced")
        return None

    def sub(self, container: dict, key: str, idx: Any, default: dict) -> dict:
        """``container[key][idx]``, created from ``default`` (and the list) when missing."""
        lst = container.get(key)
        if not isinstance(lst, list):
            lst = container[key] = []
        if isinstance(idx, int) and 0 <= idx < len(lst) and isinstance(lst[idx], dict):
            return lst[idx]
        part = dict(default)
        place(lst, idx, part)
        return part

    def append(self, container: dict | None, key: str, delta: Any) -> None:
        if container is None:
            return
        if not isinstance(delta, str):
            self.problem(f"delta for {key!r} is not a string: {short(delta)}")
            return
        prev = container.get(key)
        container[key] = (prev if isinstance(prev, str) else "") + delta

    def settle(self, container: dict | None, key: str, value: Any, what: str) -> None:
        """Assign the ``.done`` value; report when streamed deltas said something else."""
        if container is None or value is None:
            return
        prev = container.get(key)
        if isinstance(prev, str) and prev and prev != value:
            self.problem(
                f"{what}: concatenated deltas {short(prev)!r} differ from the done value {short(value)!r}"
            )
        container[key] = value

    # -- events

    def on_sse(self, ev: SSEEvent) -> None:
        for line in ev.stray:
            self.problem(f"non-SSE line ignored: {short(line)!r}")
        if not ev.has_data:
            if ev.event is not None:
                self.problem(f"event {ev.event!r} without data ignored")
            return
        self.events += 1
        n = self.events
        try:
            obj = loads_json(ev.data)
        except ValueError:
            self.problem(f"event {n}: data is not JSON: {short(ev.data)!r}")
            return
        if not isinstance(obj, dict):
            self.problem(f"event {n}: data is a JSON {json_type(obj)}, expected an object")
            return
        etype = obj.get("type")
        if not isinstance(etype, str):
            etype = ev.event
        elif ev.event is not None and ev.event != etype:
            self.problem(f"event {n}: SSE event name {ev.event!r} differs from its type {etype!r}")
        if not isinstance(etype, str):
            self.problem(f"event {n}: no type")
            return
        seq = obj.get("sequence_number")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq in self.seen_seq:
                self.problem(f"sequence_number {seq} repeated ({etype}); the repeat is ignored")
                return
            if self.last_seq is not None:
                if seq > self.last_seq + 1:
                    gap = (
                        f"{self.last_seq + 1}"
                        if seq == self.last_seq + 2
                        else f"{self.last_seq + 1}..{seq - 1}"
                    )
                    self.problem(f"sequence_number gap: {gap} missing before {etype} ({seq})")
                elif seq < self.last_seq:
                    self.problem(f"sequence_number {seq} ({etype}) arrived after {self.last_seq}")
            self.seen_seq.add(seq)
            self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)
        if self.terminal_type is not None and etype != "error":
            self.problem(f"{etype} after the terminal {self.terminal_type}")
        try:
            self.apply(etype, obj)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            self.problem(f"event {n} ({etype}) could not be applied: {type(exc).__name__}: {exc}")

    def apply(self, etype: str, obj: dict) -> None:
        """Apply one event (the rules at :func:`reassemble`), in steps: the response's life
        (created, error, terminal, snapshots), whole output items, whole parts, string fields."""
        if etype == "response.created":
            self.created(obj)
            return
        if etype == "error":
            if self.error is None:
                self.error = obj
            else:
                self.problem(f"another error event: {short(obj.get('message'))!r}")
            return
        if self.snapshot is None and not self.warned_no_created:
            self.warned_no_created = True
            self.problem(f"{etype} before response.created")
        self.started = True
        if etype in _TERMINAL:
            self.terminal_type = etype
            self.terminal = obj.get("response")
            if not isinstance(self.terminal, dict):
                self.problem(f"{etype} without a response object")
            return
        if etype in ("response.in_progress", "response.queued"):
            if isinstance(obj.get("response"), dict):
                self.snapshot = obj["response"]
            return
        stem, _, step = etype.rpartition(".")
        if stem == "response.output_item":
            self.output_item(etype, step, obj)
        elif stem in _PART_EVENTS and step in ("added", "done"):
            self.whole_part(etype, _PART_EVENTS[stem], obj)
        elif stem in _TEXT_EVENTS and step in ("delta", "done"):
            self.text(etype, _TEXT_EVENTS[stem], step, obj)
        elif etype == "response.output_text.annotation.added":
            self.annotation(etype, obj)
        # other events (web_search_call.*, mcp_call.*, ...) carry no content of their own: the
        # item's final form arrives with output_item.done

    def created(self, obj: dict) -> None:
        if self.started:
            self.problem("response.created is not the first event")
        resp = obj.get("response")
        if isinstance(resp, dict):
            self.snapshot = resp
            if not self.items and isinstance(resp.get("output"), list):
                self.items = list(resp["output"])
        else:
            self.problem("response.created without a response object")
        self.started = True

    def output_item(self, etype: str, step: str, obj: dict) -> None:
        idx = obj.get("output_index")
        if step == "added":
            if isinstance(idx, int) and idx < len(self.items) and self.items[idx] is not None:
                self.problem(f"output_item.added for output_index {idx}, already taken")
        elif step == "done":
            if not (isinstance(idx, int) and 0 <= idx < len(self.items) and self.items[idx] is not None):
                self.problem(f"output_item.done for output_index {idx!r} without output_item.added")
        else:
            return
        place(self.items, idx, obj.get("item"))

    def whole_part(self, etype: str, where: tuple[str, str], obj: dict) -> None:
        """``content_part.*`` and ``reasoning_summary_part.*``: the part at its index."""
        item = self.item(obj, etype)
        if item is not None:
            key, index_key = where
            lst = item.get(key)
            if not isinstance(lst, list):
                lst = item[key] = []
            place(lst, obj.get(index_key), obj.get("part"))

    def text(self, etype: str, where: tuple, step: str, obj: dict) -> None:
        """A ``.delta`` appended to a string field, a ``.done`` assigning it (:meth:`settle`)."""
        item = self.item(obj, etype)
        if item is None:
            return
        key, index_key, empty, field = where
        part = item if key is None else self.sub(item, key, obj.get(index_key), empty)
        if step == "delta":
            self.append(part, field, obj.get("delta"))
        else:
            self.settle(part, field, obj.get(field), etype)

    def annotation(self, etype: str, obj: dict) -> None:
        item = self.item(obj, etype)
        if item is None:
            return
        part = self.sub(item, "content", obj.get("content_index"), {"type": "output_text", "text": ""})
        anns = part.get("annotations")
        if not isinstance(anns, list):
            anns = part["annotations"] = []
        place(anns, obj.get("annotation_index"), obj.get("annotation"))

    def result(self) -> Reassembled:
        holes = [i for i, it in enumerate(self.items) if it is None]
        if holes:
            self.problem(f"output_index {', '.join(map(str, holes))} never announced by output_item.added")
        streamed = [it for it in self.items if it is not None]
        final: dict | None
        if isinstance(self.terminal, dict):
            final = self.terminal
            out = final.get("output")
            if isinstance(out, list) and streamed and out != streamed:
                if len(out) != len(streamed):
                    self.problem(
                        f"{self.terminal_type} lists {len(out)} output items, "
                        f"the stream delivered {len(streamed)}"
                    )
                else:
                    for i, (a, b) in enumerate(zip(out, streamed)):
                        if a != b:
                            self.problem(
                                f"{self.terminal_type} output item {i} differs from the streamed item"
                            )
        elif self.snapshot is not None or streamed:
            final = dict(self.snapshot or {})
            final["output"] = streamed
        else:
            final = None
        return Reassembled(
            final=final,
            complete=self.terminal_type is not None,
            events=self.events,
            error=self.error,
            problems=self.problems,
        )


def reassemble(chunks: Iterable[bytes]) -> Reassembled:
    """A raw Responses event stream (byte chunks, any split) into the final response object.

    Rules (openai-python ``accumulate_event``): ``response.created`` gives
    the snapshot and must come first; ``output_item.added`` places an item at ``output_index``;
    ``content_part.added``, ``output_text.delta``, ``function_call_arguments.delta``,
    ``custom_tool_call_input.delta``, reasoning summary/text deltas build it up, each ``.done``
    event assigns the full value (a disagreement with the deltas is reported);
    ``output_item.done`` gives the item's final form; ``response.completed|incomplete|failed``
    are terminal (``complete=True``) and their ``response`` is the final object; without one,
    the final object is the latest snapshot with the streamed items as ``output``. An ``error``
    event becomes ``Reassembled.error``. ``sequence_number`` gaps, repeats (the repeat is
    ignored) and reordering are reported in ``problems``; the ``obfuscation`` padding of delta
    events is ignored. Never raises on bad data: unparsable events become problems."""
    # the stream code is off the request-only path (replay --prepare-only): sse loads here
    from pvisor.adapters.protocols.sse import events

    acc = _Accumulator()
    for ev in events(chunks):
        acc.on_sse(ev)
    return acc.result()


# --------------------------------------------------------------------------- render stream


class _EventWriter:
    """Events with consecutive ``sequence_number``\\ s from 0, framed as SSE."""

    def __init__(self) -> None:
        from pvisor.adapters.protocols.sse import encode_event  # off the request-only path

        self.encode = encode_event
        self.seq = 0
        self.out = bytearray()

    def emit(self, etype: str, **fields: Any) -> None:
        ev = {"type": etype, **fields, "sequence_number": self.seq}
        self.seq += 1
        self.out += self.encode(dumps(ev), etype)


def _in_progress(item: dict, **replace: Any) -> dict:
    added = dict(item)
    added.update(replace)
    if "status" in added:
        added["status"] = "in_progress"
    return added


def _emit_text(w: _EventWriter, stem: str, key: str, value: str, at: dict, **tails: dict) -> None:
    """A string field as ``stem.delta`` (the whole value, none when empty) and ``stem.done``
    (``key``: the value); ``at``: the fields locating it, ``tails``: fields after them
    (``delta``/``done``: output_text's ``logprobs``)."""
    if value:
        w.emit(f"{stem}.delta", **at, delta=value, **tails.get("delta", {}))
    w.emit(f"{stem}.done", **at, **{key: value}, **tails.get("done", {}))


def _render_message(w: _EventWriter, o: int, iid: str, item: dict) -> None:
    """A ``message`` item's content parts: text and refusal parts as an empty part, their text
    and the whole part; other parts whole."""
    w.emit("response.output_item.added", output_index=o, item=_in_progress(item, content=[]))
    for c, part in enumerate(item["content"]):
        at = {"item_id": iid, "output_index": o, "content_index": c}
        ptype = part.get("type") if isinstance(part, dict) else None
        key = "text" if ptype == "output_text" else "refusal" if ptype == "refusal" else None
        if key is None or not isinstance(part.get(key), str):
            w.emit("response.content_part.added", **at, part=part)
            w.emit("response.content_part.done", **at, part=part)
            continue
        empty = dict(part)
        empty[key] = ""
        if "annotations" in empty:
            empty["annotations"] = []
        w.emit("response.content_part.added", **at, part=empty)
        if key == "text":
            logprobs = part.get("logprobs") if isinstance(part.get("logprobs"), list) else []
            tails = {"delta": {"logprobs": []}, "done": {"logprobs": logprobs}}
            _emit_text(w, "response.output_text", "text", part[key], at, **tails)
        else:
            _emit_text(w, "response.refusal", "refusal", part[key], at)
        w.emit("response.content_part.done", **at, part=part)


def _render_reasoning(w: _EventWriter, o: int, iid: str, item: dict) -> None:
    """A ``reasoning`` item: its summary parts (empty, text, whole) and its ``reasoning_text``
    content."""
    summary = item.get("summary") if isinstance(item.get("summary"), list) else []
    content = item.get("content") if isinstance(item.get("content"), list) else None
    added = _in_progress(item, summary=[])
    if content is not None:
        added["content"] = []
    w.emit("response.output_item.added", output_index=o, item=added)
    for s, part in enumerate(summary):
        at = {"item_id": iid, "output_index": o, "summary_index": s}
        if not (isinstance(part, dict) and isinstance(part.get("text"), str)):
            w.emit("response.reasoning_summary_part.added", **at, part=part)
            continue
        w.emit("response.reasoning_summary_part.added", **at, part={**part, "text": ""})
        _emit_text(w, "response.reasoning_summary_text", "text", part["text"], at)
        w.emit("response.reasoning_summary_part.done", **at, part=part)
    for c, part in enumerate(content or ()):
        if (
            isinstance(part, dict)
            and part.get("type") == "reasoning_text"
            and isinstance(part.get("text"), str)
        ):
            at = {"item_id": iid, "output_index": o, "content_index": c}
            _emit_text(w, "response.reasoning_text", "text", part["text"], at)


def _render_item(w: _EventWriter, o: int, item: Any) -> None:
    """One output item as ``output_item.added``, the events of its streamed fields and
    ``output_item.done``."""
    if not isinstance(item, dict):
        w.emit("response.output_item.added", output_index=o, item=item)
        w.emit("response.output_item.done", output_index=o, item=item)
        return
    t = item.get("type")
    iid = item.get("id") if isinstance(item.get("id"), str) else ""
    at = {"item_id": iid, "output_index": o}
    if t == "message" and isinstance(item.get("content"), list):
        _render_message(w, o, iid, item)
    elif t == "function_call" and isinstance(item.get("arguments"), str):
        w.emit("response.output_item.added", output_index=o, item=_in_progress(item, arguments=""))
        _emit_text(w, "response.function_call_arguments", "arguments", item["arguments"], at)
    elif t == "custom_tool_call" and isinstance(item.get("input"), str):
        w.emit("response.output_item.added", output_index=o, item=_in_progress(item, input=""))
        _emit_text(w, "response.custom_tool_call_input", "input", item["input"], at)
    elif t == "reasoning":
        _render_reasoning(w, o, iid, item)
    else:
        w.emit("response.output_item.added", output_index=o, item=item)
    w.emit("response.output_item.done", output_index=o, item=item)


def render_stream(final: dict) -> bytes:
    """A final response object as a Responses SSE stream (``event: <type>`` + ``data:`` lines).

    Sequence: ``response.created`` -> ``response.in_progress`` -> per output item
    ``output_item.added``, its content/summary parts with one delta each and the ``.done``
    events, ``output_item.done`` -> the terminal event named by ``final["status"]``
    (``response.completed|incomplete|failed``; none for other statuses), with consecutive
    ``sequence_number``\\ s from 0. The created/in-progress snapshot is ``final`` with an empty
    ``output`` (and, before a terminal event, ``status: in_progress`` and ``usage: null``).
    :func:`reassemble` of the result gives ``final`` back."""
    w = _EventWriter()
    terminal = {v: k for k, v in _TERMINAL.items()}.get(final.get("status"))
    snap = dict(final)
    snap["output"] = []
    if terminal is not None:
        snap["status"] = "in_progress"
        for key in ("usage", "completed_at"):
            if key in snap:
                snap[key] = None
    w.emit("response.created", response=snap)
    w.emit("response.in_progress", response=snap)
    for o, item in enumerate(as_list(final.get("output"))):
        _render_item(w, o, item)
    if terminal is not None:
        w.emit(terminal, response=final)
    return bytes(w.out)


# --------------------------------------------------------------------------- actions


def response_to_action(final: dict) -> Action:
    """Read a Responses final object as an Action: ``text`` = the ``output_text`` (and
    ``refusal``) of assistant ``message`` items concatenated; ``reasoning`` from ``reasoning``
    items (summary text, ``encrypted_content``); ``tool_calls`` from ``function_call`` (exact
    ``arguments`` string), ``custom_tool_call`` (``input``) and provider-run call items (kind
    ``server``), in output order; ``usage`` as given; ``stop_reason`` = ``status``
    (``completed``, ``incomplete``, ``failed``); ``model``; ``raw`` = ``final``."""
    action = Action(raw=final)
    if not isinstance(final, dict):
        return action
    texts: list[str] = []
    for item in as_list(final.get("output")):
        t = _item_type(item)
        if t == "message":
            for c in as_list(item.get("content")):
                if isinstance(c, dict) and c.get("type") in _TEXT_TYPES and isinstance(c.get("text"), str):
                    texts.append(c["text"])
                elif isinstance(c, dict) and c.get("type") == "refusal" and isinstance(c.get("refusal"), str):
                    texts.append(c["refusal"])
            continue
        for p in _item_parts(item) if t is not None else ():
            if isinstance(p, Reasoning):
                action.reasoning.append(p)
            elif isinstance(p, ToolCall):
                action.tool_calls.append(p)
    action.text = "".join(texts)
    usage = final.get("usage")
    action.usage = usage if isinstance(usage, dict) else None
    status = final.get("status")
    action.stop_reason = status if isinstance(status, str) else None
    model = final.get("model")
    action.model = model if isinstance(model, str) else None
    return action


def reply_problem(final: Any) -> str | None:
    """Why a Responses final object carries no reply at all: ``status`` ``failed`` (its
    ``error`` message), or no ``output`` list. None when it has one (an empty list included)."""
    if not isinstance(final, dict):
        return f"the response is a JSON {json_type(final)}, expected an object"
    if final.get("status") == "failed":
        message = dig(final, "error", "message")
        return "the response failed" + (f": {message}" if isinstance(message, str) else "")
    if not isinstance(final.get("output"), list):
        return f"the response holds no reply: {field_state(final, 'output')}"
    return None


def responses_usage(usage: Any) -> dict | None:
    """A usage object in the Responses shape. A Responses usage is returned as is; Anthropic
    (``input_tokens``/``output_tokens``/``cache_*``), Chat Completions (``prompt_tokens``/
    ``completion_tokens``) and Gemini (``promptTokenCount``/``candidatesTokenCount``/
    ``thoughtsTokenCount``) usages are converted; None for anything else."""
    if not isinstance(usage, dict):
        return None
    if {
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "input_tokens_details",
        "output_tokens_details",
    } <= usage.keys():
        return usage
    thoughts = first_int(usage.get("thoughtsTokenCount"))
    inp = first_int(usage.get("input_tokens"), usage.get("prompt_tokens"), usage.get("promptTokenCount"))
    out = first_int(
        usage.get("output_tokens"), usage.get("completion_tokens"), usage.get("candidatesTokenCount")
    )
    if inp is None and out is None:
        return None
    inp, out = inp or 0, out or 0
    if "candidatesTokenCount" in usage and thoughts:
        out += thoughts  # Gemini counts thoughts apart; Responses output tokens include reasoning
    cached = first_int(
        usage.get("cache_read_input_tokens"),
        dig(usage, "prompt_tokens_details", "cached_tokens"),
        dig(usage, "input_tokens_details", "cached_tokens"),
        usage.get("cachedContentTokenCount"),
    )
    written = first_int(
        usage.get("cache_creation_input_tokens"), dig(usage, "input_tokens_details", "cache_write_tokens")
    )
    reasoning = first_int(
        thoughts,
        dig(usage, "completion_tokens_details", "reasoning_tokens"),
        dig(usage, "output_tokens_details", "reasoning_tokens"),
    )
    total = first_int(usage.get("total_tokens"), usage.get("totalTokenCount"))
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cache_write_tokens": written or 0, "cached_tokens": cached or 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": total if total is not None else inp + out,
    }


_INCOMPLETE_STOPS = frozenset({"incomplete", "max_tokens", "length", "MAX_TOKENS", "max_output_tokens"})


def action_to_response(
    action: Action, *, model: str | None, ids: IdSource, created_at: int = FIXED_CREATED_AT
) -> dict:
    """An Action as a Responses final object (the body of a non-streamed reply; feed it to
    :func:`render_stream` for a stream).

    Output items in order: one ``reasoning`` item per Reasoning (``summary`` from its text,
    ``encrypted_content`` when given), one assistant ``message`` with the text (if any), then one
    ``function_call`` (``arguments`` = ``arguments_raw`` exactly) or ``custom_tool_call``
    (``input``) per tool call; provider-run calls are copied from their raw item. Ids come from
    ``ids`` (``resp_``, ``rs_``, ``msg_``, ``fc_``, ``ctc_``; ``call_`` when a call has no id) and
    ``created_at`` is fixed, so equal inputs give equal bytes. ``status`` is ``incomplete``
    (reason ``max_output_tokens``) when the stop reason says the output was cut, else
    ``completed``. ``usage`` is :func:`responses_usage` of the action's usage."""
    resp_id = ids.next("resp_")
    output: list[dict] = []
    for r in action.reasoning:
        item: dict[str, Any] = {
            "id": ids.next("rs_"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": r.text}] if r.text else [],
        }
        if r.encrypted is not None:
            item["encrypted_content"] = r.encrypted
        output.append(item)
    if action.text:
        output.append(
            {
                "id": ids.next("msg_"),
                "type": "message",
                "status": "completed",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": action.text}],
                "role": "assistant",
            }
        )
    for tc in action.tool_calls:
        if tc.kind == "server":
            if isinstance(tc.raw, dict) and isinstance(tc.raw.get("type"), str):
                output.append(dict(tc.raw))
            continue
        if tc.kind == "custom":
            output.append(
                {
                    "id": ids.next("ctc_"),
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": tc.id or ids.next("call_"),
                    "input": tc.arguments_raw,
                    "name": tc.name,
                }
            )
        else:
            output.append(
                {
                    "id": ids.next("fc_"),
                    "type": "function_call",
                    "status": "completed",
                    "arguments": tc.arguments_raw,
                    "call_id": tc.id or ids.next("call_"),
                    "name": tc.name,
                }
            )
    incomplete = action.stop_reason in _INCOMPLETE_STOPS
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": "incomplete" if incomplete else "completed",
        "completed_at": None if incomplete else created_at,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": None,
        "model": model if model is not None else (action.model or ""),
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "tool_choice": "auto",
        "tools": [],
        "usage": responses_usage(action.usage),
        "metadata": {},
    }


def error_body(status: int, message: str, kind: str = "invalid_request_error") -> bytes:
    """The OpenAI error shape: ``{"error":{"message","type","param":null,"code":null}}``
    (openai-python ``_exceptions.py`` reads ``message``, ``type``, ``param``, ``code``).
    ``status`` is the HTTP status the body goes with (not part of the body)."""
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


# --------------------------------------------------------------------------- rewrites

#: Phrases of the API's 4xx messages saying that reasoning items a request carries were refused,
#: matched case-insensitively. Where each was seen, quoted from the API's error body in public
#: issue threads:
_REFUSALS = LazyPattern(
    "|".join(
        (
            # "The encrypted content gAAA...Rg== could not be verified." (another account's or
            # organisation's encrypted reasoning), later with "Reason: Encrypted content could not
            # be decrypted or parsed.": openai/codex#8132, openai/codex#8145, openai/codex#35334,
            # smallmain/vscode-unify-chat-provider#178, QuantumNous/new-api#4662
            r"encrypted content\b.*\bcould not be verified",
            r"encrypted content could not be decrypted or parsed",
            # 404 "Item with id 'rs_0496...' not found. Items are not persisted when `store` is set
            # to false.": can1357/oh-my-pi#41, anomalyco/opencode#7724, openai/openai-agents-python#2020
            r"item with id '?rs_[^' ]*'? not found",
            # "Item 'rs_0c38...' of type 'reasoning' was provided without its required following
            # item.": continuedev/continue#8933, openai/openai-node#1567, openai/openai-agents-js#326
            r"of type 'reasoning' was provided without its required following item",
        )
    ),
    re.IGNORECASE,
)
#: ``error.code`` of the encrypted-content refusal (openai/codex#8126, #8128, #8132)
_REFUSAL_CODES = frozenset({"invalid_encrypted_content"})


def _user_item(text: str) -> dict:
    """A user message item holding ``text``: what a string ``input`` stands for."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def entries(obj: dict) -> list:
    """The conversation of a parsed Responses request body: its ``input`` items (a new list of
    the body's own item objects); a string ``input`` as the one item it stands for,
    ``[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": S}]}]``
    (OpenAI Responses API reference, ``input``); [] when it is missing or neither."""
    value = obj.get("input")
    if isinstance(value, str):
        return [_user_item(value)]
    return list(value) if isinstance(value, list) else []


def insert_user_text(obj: dict, at: int, text: str) -> dict:
    """A copy of a parsed Responses request body with the item ``{"type": "message", "role":
    "user", "content": [{"type": "input_text", "text": text}]}`` inserted at index ``at`` of
    :func:`entries` (``0 <= at <= len(entries(obj))``; a string input becomes its item list).
    ``at`` should not split a ``reasoning`` item from the item it precedes, which the API
    refuses ("... of type 'reasoning' was provided without its required following item").
    Raises ValueError for ``at`` out of range or an empty ``text``."""
    items = entries(obj)
    check_insert(at, len(items), text)
    items.insert(at, _user_item(text))
    return {**obj, "input": items}


def _reasoning_item_keys(item: dict) -> set[str]:
    """``"id:" + id`` and ``"enc:" + encrypted_content`` of a reasoning item, those it has."""
    keys = set()
    if isinstance(item.get("id"), str):
        keys.add("id:" + item["id"])
    if isinstance(item.get("encrypted_content"), str):
        keys.add("enc:" + item["encrypted_content"])
    return keys


def reasoning_keys(final: dict) -> set[str]:
    """The reasoning keys of a final Responses object: for each ``reasoning`` item of
    ``output``, ``"id:" + id`` when it has an id and ``"enc:" + encrypted_content`` when present
    (Codex sends the item back whole, with both, when ``include`` asks for
    ``reasoning.encrypted_content``; a client may also refer to it by id). Empty for anything
    but a dict."""
    if not isinstance(final, dict):
        return set()
    keys: set[str] = set()
    for item in as_list(final.get("output")):
        if _item_type(item) == "reasoning":
            keys |= _reasoning_item_keys(item)
    return keys


def _is_item_reference(item: Any) -> bool:
    """An ``item_reference`` input item: ``{"type": "item_reference", "id": ...}``, or the bare
    ``{"id": ...}`` the API also takes as one (``type`` is optional)."""
    return (
        isinstance(item, dict)
        and isinstance(item.get("id"), str)
        and (item.get("type") == "item_reference" or item.keys() == {"id"})
    )


def strip_reasoning(obj: dict, served: set[str], path: str) -> tuple[dict, str, list[dict]]:
    """Drop from a parsed Responses request body the reasoning items the live model would
    refuse: ``reasoning`` input items whose id key or encrypted-content key (see
    :func:`reasoning_keys`) is in ``served``, the keys of replies the live upstream did not
    produce ("The encrypted content ... could not be verified", "Item with id 'rs_...' not
    found"), and the ``item_reference`` items that refer to a dropped item or to a served id.
    The item that followed a dropped reasoning item stays (an answer or call without its
    reasoning is accepted). ``include`` is left as it is: the live model's own reasoning items
    still need ``reasoning.encrypted_content``.

    Returns ``(body, path, rewrites)``: the body unchanged (the same object) when nothing
    matched, else a copy; ``path`` as given. One rewrite of kind ``reasoning_item_dropped`` per
    dropped item (``entry`` = its index in :func:`entries`), in input order."""
    items = obj.get("input")
    if not isinstance(items, list):
        return obj, path, []
    drop: dict[int, str] = {}
    dropped_ids: set[str] = set()
    for i, item in enumerate(items):
        if _item_type(item) == "reasoning" and _reasoning_item_keys(item) & served:
            rid = item.get("id") if isinstance(item.get("id"), str) else None
            if rid is not None:
                dropped_ids.add(rid)
            drop[i] = f"reasoning item {rid or '(no id)'} dropped: the live upstream did not produce it"
    for i, item in enumerate(items):
        if _is_item_reference(item) and (item["id"] in dropped_ids or "id:" + item["id"] in served):
            drop[i] = f"item_reference to reasoning item {item['id']} dropped with it"
    if not drop:
        return obj, path, []
    rewrites = [{"entry": i, "kind": "reasoning_item_dropped", "detail": drop[i]} for i in sorted(drop)]
    return {**obj, "input": [item for i, item in enumerate(items) if i not in drop]}, path, rewrites


def reasoning_refusal(status: int, body: bytes) -> str | None:
    """When an error response (status 400..499, OpenAI's JSON shape, see :func:`error_body`)
    says that reasoning items of the request were refused (encrypted content that does not
    verify, a reasoning item id the server does not hold, a reasoning item cut from its
    following item; phrases and sources at ``_REFUSALS``, also ``code:
    "invalid_encrypted_content"``), the API's message (at most 500 characters); else None."""
    return refusal_message(status, body, _REFUSALS, _REFUSAL_CODES)


def expand_previous_response(obj: dict, history: dict[str, list]) -> tuple[dict, dict | None]:
    """A parsed Responses request body that continues a stored response (``previous_response_id``,
    the server prepends that response's input and output) rewritten to carry the
    whole conversation itself, so that another upstream, or one that never stored it, can
    answer it.

    ``history`` maps a response id to the full list of input items of the conversation up to
    and including that response's output items (what :func:`conversation_items` gives). When
    ``previous_response_id`` is a key of ``history``: a copy whose ``input`` is
    ``history[id]`` followed by this request's :func:`entries` (a string input as its item),
    without ``previous_response_id``, and the record ``{"previous_response_id": id,
    "items_added": len(history[id])}``. Otherwise ``(obj, None)``, ``obj`` itself."""
    prev = obj.get("previous_response_id")
    if not isinstance(prev, str) or prev not in history:
        return obj, None
    earlier = list(history[prev])
    out = {k: v for k, v in obj.items() if k != "previous_response_id"}
    out["input"] = earlier + entries(obj)
    return out, {"previous_response_id": prev, "items_added": len(earlier)}


def conversation_items(request_obj: dict, final: dict) -> list:
    """The conversation after a response: the request's :func:`entries` followed by the final
    Responses object's ``output`` items (a new list; no output items when ``final`` has none).
    Pass the request as :func:`expand_previous_response` rewrote it, so that the list holds the
    whole conversation; it is what ``history[final["id"]]`` is for the next request."""
    output = as_list(final.get("output")) if isinstance(final, dict) else []
    return entries(request_obj) + list(output)


def _flat_tools(tools: list[Any], namespace: str | None, out: list[ToolSpec]) -> None:
    for t in tools:
        if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("tools"), list):
            _flat_tools(t["tools"], str(t.get("name") or ""), out)
            continue
        spec = _tool_spec(t)
        if namespace is not None and isinstance(spec.raw, dict):
            spec.raw = {**spec.raw, "namespace": namespace}  # where it was defined, for a caller of the tool
        out.append(spec)


def offered_tools(conv: Conversation) -> list[ToolSpec]:
    """The tools the request offers the model: its ``tools`` and the tools of its
    ``additional_tools`` input items (Codex 0.171 with its default model sends every tool in one
    ``{"type": "additional_tools", "role": "developer", "tools": [...]}`` item and no ``tools``
    field; seen in the requests it sent under ``pvisor run``), ``namespace`` entries flattened
    into their tools (each keeping the namespace's name in ``raw["namespace"]``), in order."""
    out: list[ToolSpec] = []
    _flat_tools([t.raw for t in conv.tools], None, out)
    for m in conv.messages:
        for p in m.parts:
            raw = getattr(p, "raw", None)
            if (
                isinstance(p, OtherPart)
                and isinstance(raw, dict)
                and raw.get("type") == "additional_tools"
                and isinstance(raw.get("tools"), list)
            ):
                _flat_tools(raw["tools"], None, out)
    return out


def tool_kind(spec: ToolSpec) -> str:
    """``custom`` for a custom (free-form input) tool, else ``function``: how a call of it is
    written (``custom_tool_call`` with ``input``, or ``function_call`` with ``arguments``)."""
    return "custom" if isinstance(spec.raw, dict) and spec.raw.get("type") == "custom" else "function"


def converted_tool_raw(tool: ToolSpec) -> dict:
    """The definition of a function tool of another protocol rendered here: ``{"type":
    "function", "name", "strict"}``, ``strict`` false unless the Chat Completions definition
    (``tool.raw["function"]["strict"]``) said true: Chat Completions' strict defaults to false,
    Responses' to true, and the meaning is kept."""
    fn = (
        tool.raw.get("function")
        if isinstance(tool.raw, dict) and isinstance(tool.raw.get("function"), dict)
        else {}
    )
    return {"type": "function", "name": tool.name, "strict": bool(fn.get("strict", False))}


# --------------------------------------------------------------------------- replies
# facts adapters/protocols/replies.py answers with

#: the field of a token-count response's count (None: the protocol has none):
#: no path of this protocol asks for a token count (:func:`counts_tokens`)
TOKEN_COUNT_FIELD: str | None = None

#: usage: ``input_tokens`` (cached ones within), ``output_tokens`` (reasoning within), their details
normalised_usage = openai_usage("input", "output")
