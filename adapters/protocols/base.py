"""What every wire-protocol module shares: the reassembly result, deterministic ids, JSON helpers
and the normalisation used by the chain rule.

A wire-protocol module (``anthropic``, ``openai_chat``, ``openai_responses``, ``gemini``) is a
plain module that satisfies :class:`~.contract.WireProtocol` structurally: its facts as constants (the
protocol name, paths, the default request target, where the conversation lives, the role of
tool results, what the API requires) and its functions (parse, reassemble, render, rewrite).
The registry (:data:`pvisor.adapters.protocols.PROTOCOL_MODULES`) names each module;
:func:`~pvisor.adapters.protocols.get_protocol` returns it typed as :class:`~.contract.WireProtocol`, and
tests/test_protocol_registry.py checks that every registered module has every member. Code
outside the protocol modules reads these facts from the module, never branches on a
protocol's name.

The Responses module adds ``expand_previous_response(obj, history)`` and
``conversation_items(request_obj, final)``: a request continuing a stored response
(``previous_response_id``) rewritten to carry the whole conversation itself.

``parse_request`` also takes ``memo=`` (a :class:`ParseMemo`): a caller reading many requests of
one session (the chain rule) passes one, so that a message already read in an earlier body is
not read and checked again.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import field, fields as dc_fields
from typing import Any, Callable

import orjson

from pvisor.core.errors import BadInputError
from pvisor.journal.model import (
    Conversation,
    Message,
    OtherPart,
    Reasoning,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from pvisor.core.record import Record, record
from pvisor.core.lazyre import LazyPattern


@record
class Reassembled(Record):
    """Result of reassembling a streamed response.

    Fields:
        final: the final response object (provider shape), or None if nothing usable arrived.
        complete: True when the protocol's terminal event was seen (Anthropic ``message_stop``,
            Chat ``[DONE]``, Responses ``response.completed|incomplete|failed``, Gemini: a chunk
            with ``finishReason``).
        events: number of events decoded.
        error: an error event delivered inside the stream (its JSON object), or None.
        problems: what was odd: unparsable event data, sequence gaps, unterminated tool input.
        tool_input_raw: for protocols whose final object holds tool input *parsed* (Anthropic
            ``input_json_delta``), the exact streamed input text per content-block index, so the
            bytes the model produced stay available; includes blocks left unterminated (their
            ``input`` in ``final`` stays as the block start gave it, and ``problems`` names them).
            Empty for protocols whose final object already carries the argument string.
    """

    final: dict[str, Any] | None
    complete: bool
    events: int = 0
    error: Any = None
    problems: list[str] = field(default_factory=list)
    tool_input_raw: dict[int, str] = field(default_factory=dict)

    def __init__(
        self,
        final: dict[str, Any] | None,
        complete: bool,
        events: int = 0,
        error: Any = None,
        problems: list[str] | None = None,
        tool_input_raw: dict[int, str] | None = None,
    ) -> None:
        self.final = final
        self.complete = complete
        self.events = events
        self.error = error
        self.problems = [] if problems is None else problems
        self.tool_input_raw = {} if tool_input_raw is None else tool_input_raw


def loads_json(text: str) -> Any:
    """orjson, falling back to json for lone-surrogate escapes orjson rejects (a JSON escape of half
    a UTF-16 pair is valid JSON, not valid UTF-8). Raises ValueError for text that is not JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def short(value: Any, n: int = 60) -> str:
    """``value`` (a string, else its repr) cut to ``n`` characters and an ellipsis, for a
    problem's sentence."""
    s = value if isinstance(value, str) else repr(value)
    return s if len(s) <= n else s[:n] + "…"


def place(lst: list, idx: Any, value: Any) -> None:
    """Put ``value`` at ``idx`` of a list being reassembled (appended when idx is not an int
    >= 0), leaving None in skipped slots."""
    if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
        lst.append(value)
        return
    while len(lst) < idx:
        lst.append(None)
    if idx < len(lst):
        lst[idx] = value
    else:
        lst.append(value)


class IdSource:
    """Deterministic ids for rendered replies: ``next("msg_")`` gives ``msg_`` + 24 hex digits
    from a counter started at ``seed``, so two runs with the same seed give identical bytes."""

    __slots__ = ("_n", "_seed")

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._n = 0

    def next(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._seed:08x}{self._n:016x}"


def dumps(obj: Any) -> bytes:
    """Compact JSON (orjson), the serialisation used for every rendered body and event."""
    return orjson.dumps(obj)


def loads_object(body: bytes | bytearray | memoryview | str | dict, what: str = "request body") -> dict:
    """Parse a JSON object. Raises BadInputError naming ``what`` when it is not one."""
    if isinstance(body, dict):
        return body
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if isinstance(body, (bytes, bytearray, memoryview)):
            try:
                bytes(body).decode("utf-8")
            except UnicodeDecodeError as bad:
                raise BadInputError(
                    f"{what} is not valid UTF-8 JSON: byte 0x{bad.object[bad.start]:02x} "
                    f"at offset {bad.start} is not UTF-8"
                ) from None
        raise BadInputError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadInputError(f"{what} is a JSON {json_type(obj)}, expected an object")
    return obj


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages: ``null``, ``boolean``, ``number``,
    ``string``, ``array``, ``object`` (the Python type name for anything else)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def field_state(obj: dict, key: str) -> str:
    """How a field of a JSON object stands, for ``reply_problem`` messages: ``no 'choices'
    field``, ``'choices' is null``, ``'choices' is an empty array``, ``'choices' is a JSON
    string``."""
    if key not in obj:
        return f"no '{key}' field"
    value = obj[key]
    if value is None:
        return f"'{key}' is null"
    if isinstance(value, (list, dict)) and not value:
        return f"'{key}' is an empty {json_type(value)}"
    return f"'{key}' is a JSON {json_type(value)}"


@record
class MemoRead(Record):
    """One list of conversation entries read with a :class:`ParseMemo`: the ``entries``, the
    ``messages`` read from them and the entry index each message ``starts`` at; ``source``, the
    earlier read whose first ``reused`` messages it took over; ``data``, what the caller
    attached to it (the chain rule: the messages' comparison keys). Compared by identity (a
    memo's reads are told apart by which they are, never by their possibly large contents)."""

    entries: list
    messages: list[Message]
    starts: list[int]
    source: "MemoRead | None" = None
    reused: int = 0
    data: Any = None

    def __init__(
        self,
        entries: list,
        messages: list[Message],
        starts: list[int],
        source: "MemoRead | None" = None,
        reused: int = 0,
        data: Any = None,
    ) -> None:
        self.entries = entries
        self.messages = messages
        self.starts = starts
        self.source = source
        self.reused = reused
        self.data = data

    __eq__ = object.__eq__  # as eq=False left it: by identity
    __hash__ = object.__hash__


class ParseMemo:
    """What ``parse_request(..., memo=memo)`` remembers across the requests of one session.

    Every main-loop request repeats the whole conversation, so reading a run request by request
    reads each message again and again. With a memo:

    - a list of entries (Anthropic or Chat messages, Gemini contents, Responses input items)
      that starts with the entries of one of the last few lists read gives that list's messages
      at once (but the last, whose group may go on), found by comparing the parsed JSON values
      in one C-level list comparison;
    - any other entry (an Anthropic or Chat message, a Gemini content, a group of Responses
      items) whose JSON is byte-for-byte that of an entry read before gives the very Message
      object read then;
    - a message :func:`check_conversation` passed is not checked again.

    So only new entries are read in Python. A list is remembered only once its conversation
    passed the checks (``request_parser`` calls :meth:`commit`). One memo per protocol module;
    the messages of a conversation read with a memo must not be changed in place.
    ``values`` is free for the caller to remember things per message (keyed by ``id(message)``,
    valid while the memo lives: the memo keeps every message it returned by :meth:`message`).
    """

    RECENT = 4

    __slots__ = ("_messages", "_held", "checked", "values", "_recent", "_pending")

    def __init__(self) -> None:
        self._messages: dict[bytes, Message] = {}
        self._held: set[int] = set()
        self.checked: set[int] = set()
        self.values: dict[int, Any] = {}
        self._recent: list[MemoRead] = []
        self._pending: MemoRead | None = None

    def message(self, raw: Any, build: Callable[[], Message], tag: str = "") -> Message:
        """The message read from ``raw`` by ``build()``, or the one read before from equal JSON."""
        try:
            key = tag.encode() + b"\0" + orjson.dumps(raw)
        except (TypeError, orjson.JSONEncodeError):  # lone surrogates, integers past 64 bits
            return build()
        hit = self._messages.get(key)
        if hit is None:
            hit = self._messages[key] = build()
            self._held.add(id(hit))
        return hit

    def holds(self, message: Message) -> bool:
        """Whether ``message`` is one this memo returned (so ``values`` may be keyed by its id)."""
        return id(message) in self._held

    def start(self, entries: list) -> MemoRead:
        """Begin reading ``entries``: a :class:`MemoRead` whose ``messages`` and ``starts``
        already hold what an earlier list with the same leading entries gave (all its messages
        but the last); the caller reads on from entry ``next_entry(read)`` and appends."""
        best: MemoRead | None = None
        for old in self._recent:
            n = len(old.entries)
            if not old.messages or len(entries) < n or (best is not None and n <= len(best.entries)):
                continue
            if entries[n - 1] == old.entries[n - 1] and entries[:n] == old.entries:
                best = old
        if best is None:
            read = MemoRead(entries, [], [])
        else:
            keep = len(best.messages) - 1
            read = MemoRead(entries, best.messages[:keep], best.starts[:keep], best, keep)
        self._pending = read
        return read

    @staticmethod
    def next_entry(read: MemoRead) -> int:
        """The first entry of ``read`` not yet read into a message."""
        return read.source.starts[read.reused] if read.source is not None else 0

    def commit(self) -> None:
        """The conversation being read passed its checks: remember its list."""
        if self._pending is not None:
            if self._pending.source is not None:
                self._pending.source.source = None  # one level back is all a caller reads
            self._recent.insert(0, self._pending)
            del self._recent[self.RECENT :]
            self._pending = None

    def discard(self) -> None:
        """The conversation being read failed: forget its list."""
        self._pending = None

    def trusted(self, messages: list[Message]) -> int:
        """How many leading ``messages`` (of the list being read) came from a list that passed
        the checks."""
        p = self._pending
        return p.reused if p is not None and p.messages is messages else 0

    def last_read(self, messages: list[Message]) -> MemoRead | None:
        """The remembered read whose ``messages`` is this very list (the last one committed)."""
        return self._recent[0] if self._recent and self._recent[0].messages is messages else None


def memo_message(memo: "ParseMemo | None", raw: Any, build: Callable[[], Message], tag: str = "") -> Message:
    """``memo.message(raw, build, tag)``, or ``build()`` without a memo."""
    return build() if memo is None else memo.message(raw, build, tag)


def read_entries(
    memo: "ParseMemo | None", entries: list, build: Callable[[Any, int], Message]
) -> list[Message]:
    """One message per entry, ``build(entry, index)``; with a memo, only entries not read
    before are built (see :class:`ParseMemo`)."""
    if memo is None:
        return [build(e, i) for i, e in enumerate(entries)]
    read = memo.start(entries)
    out, starts = read.messages, read.starts
    for i in range(memo.next_entry(read), len(entries)):
        e = entries[i]
        out.append(memo.message(e, lambda e=e, i=i: build(e, i)))
        starts.append(i)
    return out


#: what reading a body of an unexpected shape raises (``None.get``, ``"a" + 5``, ``{[1]: ...}``)
_READ_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ValueError)


def request_parser(protocol: str) -> Callable[[Callable[..., Conversation]], Callable[..., Conversation]]:
    """Decorator for a protocol module's ``parse_request``: whatever the body, the result is a
    :class:`Conversation` whose fields have their documented types, or a BadInputError naming
    ``protocol`` (``"Anthropic Messages"``) and the problem. Never another exception.

    Protocol modules read provider JSON tolerantly and check the types that matter to them; a
    value of a type nobody expected (``{"tools": [{"name": 5}]}``, a list where a string key
    should be) either surfaces as TypeError/AttributeError/KeyError/IndexError/ValueError while
    reading, or passes through into a canonical field. The first is turned into BadInputError
    here; the second is caught by :func:`check_conversation` on the result, so that code using
    the conversation (the scripted model, the chain rule) may rely on the field types.
    """

    def wrap(fn: Callable[..., Conversation]) -> Callable[..., Conversation]:
        @functools.wraps(fn)
        def parse_request(
            body: Any, *, path: str = "", query: Any = "", memo: ParseMemo | None = None
        ) -> Conversation:
            if memo is not None:
                memo.discard()  # a list is remembered only from a conversation that passed
            try:
                conv = fn(body, path=path, query=query, memo=memo)
                check_conversation(conv, memo)
            except BadInputError as exc:
                if not exc.message.startswith("request body"):
                    raise  # it names its protocol already ("Gemini request body ...")
                raise BadInputError(f"{protocol} {exc.message}") from None
            except _READ_ERRORS as exc:
                raise BadInputError(
                    f"{protocol} request body has a value of an unexpected type or shape "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            if memo is not None:
                memo.commit()
            return conv

        return parse_request

    return wrap


def _want(value: Any, optional: bool, types: tuple[type, ...], what: str, expected: str) -> None:
    if (value is None and optional) or (
        isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    ):
        return
    raise BadInputError(f"request body: {what} is a JSON {json_type(value)}, expected {expected}")


def check_conversation(conv: Conversation, memo: ParseMemo | None = None) -> None:
    """Check the types of a parsed conversation's canonical fields (model, system, tool names,
    roles, texts, call ids and names, argument strings); BadInputError naming the first that is
    wrong. ``raw``, ``params``, tool parameters and result contents may hold anything. Messages
    a ``memo`` has checked before are not checked again."""
    _want(conv.model, True, (str,), "the model", "a string")
    _want(conv.system, True, (str,), "the system prompt", "a string")
    for i, t in enumerate(conv.tools):
        _want(t.name, False, (str,), f"the name of tool {i}", "a string")
        _want(t.description, True, (str,), f"the description of tool {i} ({t.name})", "a string")
    checked = memo.checked if memo is not None else None
    skip = memo.trusted(conv.messages) if memo is not None else 0
    for i in range(skip, len(conv.messages)):
        m = conv.messages[i]
        if checked is not None and id(m) in checked:
            continue
        _check_message(i, m)
        if checked is not None and memo.holds(m):
            checked.add(id(m))


def _check_message(i: int, m: Message) -> None:
    _want(m.role, False, (str,), f"the role of message {i}", "a string")
    for j, p in enumerate(m.parts):
        where = f"message {i} part {j}"
        if isinstance(p, TextPart):
            _want(p.text, False, (str,), f"the text of {where}", "a string")
        elif isinstance(p, Reasoning):
            _want(p.text, False, (str,), f"the reasoning text of {where}", "a string")
            _want(p.signature, True, (str,), f"the signature of {where}", "a string")
            _want(p.encrypted, True, (str,), f"the encrypted reasoning of {where}", "a string")
        elif isinstance(p, ToolCall):
            _want(p.id, True, (str,), f"the tool call id of {where}", "a string")
            _want(p.name, False, (str,), f"the tool name of {where}", "a string")
            _want(p.arguments_raw, False, (str,), f"the tool arguments of {where}", "a string")
        elif isinstance(p, ToolResult):
            _want(p.call_id, True, (str,), f"the tool call id of {where}", "a string")
            _want(p.is_error, True, (bool,), f"is_error of {where}", "true or false")
            _want(p.name, True, (str,), f"the tool name of {where}", "a string")
        elif isinstance(p, OtherPart):
            _want(p.kind, False, (str,), f"the type of {where}", "a string")
        else:  # pragma: no cover - a protocol module bug
            raise TypeError(f"not a canonical part: {p!r}")


def wrong_json(where: str, value: Any, expected: str) -> BadInputError:
    """The error of a request body part of the wrong JSON type: ``request body WHERE is a JSON
    TYPE, expected EXPECTED`` (``where``: ``field 'tools'``, ``messages[3].content``)."""
    return BadInputError(f"request body {where} is a JSON {json_type(value)}, expected {expected}")


def final_object(final: Any, title: str) -> dict:
    """``final`` when it is a final response object (a dict); else raises BadInputError
    ``TITLE final response is a JSON TYPE, expected an object``."""
    if not isinstance(final, dict):
        raise BadInputError(f"{title} final response is a JSON {json_type(final)}, expected an object")
    return final


def compact_json(obj: Any) -> str:
    """Compact JSON text of a parsed value: the ``arguments_raw`` of protocols that carry objects."""
    return orjson.dumps(obj).decode()


def parse_arguments(raw: str) -> Any:
    """Parse a tool call's JSON argument string; None when it is not JSON."""
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None


#: Marker for :func:`overlay`: leave the key out (unless the raw object has it, see there).
OMIT: Any = object()


def overlay(raw: Any, canonical: dict[str, Any]) -> dict[str, Any]:
    """Render a provider object from canonical values, keeping provider extras from ``raw``.

    The result has ``raw``'s keys in ``raw``'s order (extras such as ``cache_control`` kept),
    each key of ``canonical`` replacing the raw value; keys of ``canonical`` that ``raw`` lacks
    follow in ``canonical``'s order. A canonical value of :data:`OMIT` drops the key, except
    that a key ``raw`` holds as ``null`` stays ``null`` (an optional field sent as ``null``
    renders as sent). ``raw`` that is not a dict counts as absent. Used by
    ``render_request`` so that a parsed body renders back with its extras, and a body whose
    ``raw`` was stripped still renders from canonical fields alone.
    """
    out: dict[str, Any] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            if k in canonical:
                c = canonical[k]
                if c is not OMIT:
                    out[k] = c
                elif v is None:
                    out[k] = None
            else:
                out[k] = v
    for k, c in canonical.items():
        if k not in out and c is not OMIT:
            out[k] = c
    return out


def split_text(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of at most ``size`` characters (no piece for ""), for rendering
    streamed deltas deterministically."""
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------- normalisation


def _norm_content(content: Any) -> Any:
    """Unify null, "" and [] and a list of pure text blocks into a string; drop cache markers."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if not content:
            return ""
        if all(
            isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text") for b in content
        ):
            return "".join(b.get("text", "") for b in content)
        return [strip_volatile(b) for b in content]
    return strip_volatile(content)


_VOLATILE_KEYS = frozenset({"cache_control", "signature", "thoughtSignature", "thought_signature", "id"})


def strip_volatile(obj: Any) -> Any:
    """A copy of ``obj`` without the keys the chain rule ignores (``cache_control``,
    signatures, ids), at any depth."""
    if isinstance(obj, dict):
        return {k: strip_volatile(v) for k, v in obj.items() if k not in _VOLATILE_KEYS}
    if isinstance(obj, list):
        return [strip_volatile(v) for v in obj]
    return obj


def normalise_part(part: Any, *, keep_call_ids: bool) -> dict | None:
    """The comparison form of one canonical part, or None for a part that compares as absent
    (empty text). Signatures, encrypted reasoning, cache markers and (unless ``keep_call_ids``)
    call ids are dropped; arguments compare parsed."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, Reasoning):
        return {"type": "reasoning", "text": part.text}
    if isinstance(part, ToolCall):
        d: dict[str, Any] = {
            "type": "tool_call",
            "name": part.name,
            "arguments": part.arguments if part.arguments is not None else part.arguments_raw,
        }
        if keep_call_ids:
            d["id"] = part.id
        return d
    if isinstance(part, ToolResult):
        d = {"type": "tool_result", "content": _norm_content(part.content)}
        if part.is_error:
            d["is_error"] = True
        if keep_call_ids:
            d["call_id"] = part.call_id
        return d
    if isinstance(part, OtherPart):
        return {"type": part.kind, "raw": strip_volatile(part.raw)}
    raise TypeError(f"not a canonical part: {part!r}")


def normalise_messages(messages: list[Message], *, keep_call_ids: bool = True) -> list[dict]:
    """Normalised messages (see :func:`normalise_part`). Adjacent text parts of one message are
    joined, so a string content and one text block compare equal; empty messages are kept."""
    out: list[dict] = []
    for m in messages:
        parts: list[dict] = []
        for p in m.parts:
            d = normalise_part(p, keep_call_ids=keep_call_ids)
            if d is None:
                continue
            if d["type"] == "text" and parts and parts[-1]["type"] == "text":
                parts[-1] = {"type": "text", "text": parts[-1]["text"] + d["text"]}
            else:
                parts.append(d)
        out.append({"role": m.role, "parts": parts})
    return out


def normalise_conversation(conv: Conversation, *, keep_call_ids: bool = True) -> dict:
    """The chain rule's comparison form: ``{"system", "tools", "messages"}``.

    Per docs/steps.md (the chain rule) and docs/agents.md: drop ``cache_control`` markers,
    signatures and client-made ids, parse JSON-string arguments, unify null and empty content.
    ``keep_call_ids=False`` for protocols whose call ids the client makes (Gemini CLI invents
    ``functionCall.id``).
    """
    return {
        "system": conv.system or "",
        "tools": [
            {"name": t.name, "description": t.description or "", "parameters": strip_volatile(t.parameters)}
            for t in conv.tools
        ],
        "messages": normalise_messages(conv.messages, keep_call_ids=keep_call_ids),
    }


def as_list(value: Any) -> list:
    """``value`` when it is a list, else [] (tolerant reading of provider JSON)."""
    return value if isinstance(value, list) else []


def first_int(*values: Any) -> int | None:
    """The first value that is an int (not a bool), or None: reads a count from whichever of
    several providers' usage fields is present."""
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def token_counts(usage: Any) -> tuple[int | None, int | None]:
    """(input tokens, output tokens) of a reply's usage as any of the four protocols reports it:
    Anthropic and Responses ``input_tokens``/``output_tokens``, Chat Completions
    ``prompt_tokens``/``completion_tokens``, Gemini ``promptTokenCount``/``candidatesTokenCount``;
    None for a count that is not there."""
    if not isinstance(usage, dict):
        return None, None
    return (
        first_int(usage.get("input_tokens"), usage.get("prompt_tokens"), usage.get("promptTokenCount")),
        first_int(
            usage.get("output_tokens"), usage.get("completion_tokens"), usage.get("candidatesTokenCount")
        ),
    )


@record
class TokenUsage(Record):
    """A reply's token counts by the OpenTelemetry GenAI conventions (``gen_ai.usage.*``), one
    spelling for the four protocols: each protocol module's ``normalised_usage`` makes it from
    its own usage object. A count the reply did not report is None.

    Fields:
        input_tokens: every input token, cached ones included (Anthropic reports cached reads
            and cache writes apart from ``input_tokens``: their sum; the others include them).
        cached_input_tokens: input tokens read from the provider's prompt cache.
        cache_creation_input_tokens: input tokens written to the cache (Anthropic), else None.
        output_tokens: every output token, reasoning included (Gemini reports thoughts apart
            from ``candidatesTokenCount``: their sum).
        reasoning_tokens: the output tokens spent on reasoning, where the provider says.
    """

    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None

    def __init__(
        self,
        input_tokens: int | None = None,
        cached_input_tokens: int | None = None,
        cache_creation_input_tokens: int | None = None,
        output_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> None:
        self.input_tokens = input_tokens
        self.cached_input_tokens = cached_input_tokens
        self.cache_creation_input_tokens = cache_creation_input_tokens
        self.output_tokens = output_tokens
        self.reasoning_tokens = reasoning_tokens

    def as_dict(self) -> dict[str, int | None]:
        """The five counts by name (the rows' ``usage`` column, ATIF metrics' source)."""
        return {
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


def count_sum(*values: Any) -> int | None:
    """The sum of the values that are ints (not bools); None when none is."""
    found = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return sum(found) if found else None


def openai_usage(inputs: str, outputs: str) -> Callable[[Any], TokenUsage]:
    """The ``normalised_usage`` of an OpenAI usage object whose counts are ``INPUTS_tokens`` and
    ``OUTPUTS_tokens`` (Chat Completions ``prompt``/``completion``, Responses ``input``/``output``):
    cached tokens are within the input (``INPUTS_tokens_details.cached_tokens``; those written to
    the cache ``cache_write_tokens``, where a provider reports them), reasoning within the output
    (``OUTPUTS_tokens_details.reasoning_tokens``)."""
    input_details, output_details = f"{inputs}_tokens_details", f"{outputs}_tokens_details"
    inputs, outputs = f"{inputs}_tokens", f"{outputs}_tokens"

    def normalised_usage(usage: Any) -> TokenUsage:
        if not isinstance(usage, dict):
            return TokenUsage()
        return TokenUsage(
            input_tokens=first_int(usage.get(inputs)),
            cached_input_tokens=first_int(dig(usage, input_details, "cached_tokens")),
            cache_creation_input_tokens=first_int(dig(usage, input_details, "cache_write_tokens")),
            output_tokens=first_int(usage.get(outputs)),
            reasoning_tokens=first_int(dig(usage, output_details, "reasoning_tokens")),
        )

    return normalised_usage


def dig(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``, or None as soon as a level is not a dict."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


# --------------------------------------------------------------------------- rewrites


def check_insert(at: Any, count: int, text: Any) -> None:
    """The arguments of an ``insert_user_text``: ``at`` an int with ``0 <= at <= count`` (the
    number of entries) and ``text`` a non-empty string. Raises ValueError otherwise."""
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= count:
        raise ValueError(f"insert position {at!r} is not between 0 and {count} (the number of entries)")
    if not isinstance(text, str) or not text:
        what = "empty" if isinstance(text, str) else f"a JSON {json_type(text)}"
        raise ValueError(f"the text to insert is {what}, expected a non-empty string")


def with_body_model(obj: dict, path: str, model: str) -> tuple[dict, str, dict | None]:
    """``with_model`` of the protocols that name the model in the body (Anthropic, Chat
    Completions, Responses): a copy of ``obj`` with ``"model": model`` (in place, or last when
    absent), ``path`` unchanged, and ``{"from": old, "to": model}`` (``old`` None when absent);
    ``(obj, path, None)`` when the body already asks for ``model``. Raises ValueError for a model
    that is not a non-empty string."""
    if not isinstance(model, str) or not model:
        what = "empty" if isinstance(model, str) else f"a JSON {json_type(model)}"
        raise ValueError(f"the model is {what}, expected a non-empty string")
    old = obj.get("model")
    if old == model:
        return obj, path, None
    return {**obj, "model": model}, path, {"from": old, "to": model}


#: the longest provider message :func:`refusal_message` returns
REFUSAL_MAX = 500


def error_object(body: Any) -> Any:
    """The ``error`` member of a provider's JSON error body (``{"error": {...}}`` in all four
    protocols; Gemini's ``streamGenerateContent`` sends it as the first element of a JSON
    array), from bytes, str or an already parsed value; None when the body is not such JSON."""
    obj = body
    if isinstance(body, (bytes, bytearray, memoryview, str)):
        try:
            obj = orjson.loads(bytes(body) if isinstance(body, memoryview) else body)
        except orjson.JSONDecodeError:
            return None
    if isinstance(obj, list) and obj:
        obj = obj[0]
    return obj.get("error") if isinstance(obj, dict) else None


def refusal_message(
    status: int, body: Any, pattern: "re.Pattern[str]", codes: frozenset[str] = frozenset()
) -> str | None:
    """A module's ``reasoning_refusal``: the ``error.message`` of a 4xx JSON error body
    (``{"error": {"message": ...}}``, the shape of all four providers, Anthropic's with
    ``"type": "error"`` around it; Gemini's ``streamGenerateContent`` sends it as the first
    element of a JSON array) when ``pattern`` finds a match in it or ``error.code`` is one of
    ``codes``; cut to :data:`REFUSAL_MAX` characters. None for another status, a body that is
    not such JSON (bytes, str or already parsed), or any other message."""
    if not isinstance(status, int) or not 400 <= status <= 499:
        return None
    error = error_object(body)
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    if not isinstance(message, str):
        return None
    if pattern.search(message) or (isinstance(error.get("code"), str) and error["code"] in codes):
        return message[:REFUSAL_MAX]
    return None


#: a complete Anthropic thinking signature: standard base64, padded (what the API returns)
_SIGNATURE = LazyPattern(r"^[A-Za-z0-9+/]+={0,2}$")

#: step flags of thinking signatures the live API would refuse (docs/native.md, docs/steps.md)
SIGNATURE_FLAGS = ("thinking_signature_empty", "thinking_signature_missing", "thinking_signature_incomplete")


def signature_flags(reasoning: list[Reasoning]) -> list[str]:
    """The flags of an action's Anthropic ``thinking`` blocks (``Reasoning`` whose ``raw`` is
    one) whose signature the live API would refuse, each once, in :data:`SIGNATURE_FLAGS` order:
    ``thinking_signature_empty`` (``""``: what scripted models write),
    ``thinking_signature_missing`` (no ``signature`` key) and ``thinking_signature_incomplete``
    (not padded standard base64 of a length divisible by 4: cut off, or a placeholder). Nothing
    is changed: the block is passed on as recorded, and the flag says so."""
    found: set[str] = set()
    for r in reasoning:
        raw = r.raw
        if not (isinstance(raw, dict) and raw.get("type") == "thinking"):
            continue
        sig = raw.get("signature")
        if sig is None or not isinstance(sig, str):
            found.add("thinking_signature_missing")
        elif sig == "":
            found.add("thinking_signature_empty")
        elif len(sig) % 4 or not _SIGNATURE.match(sig):
            found.add("thinking_signature_incomplete")
    return [f for f in SIGNATURE_FLAGS if f in found]


def path_unchanged(path: str, model: str) -> str:
    """``path_for_model`` of the protocols that name the model in the body: ``path`` as it is."""
    return path


def no_converted_tool_raw(tool: ToolSpec) -> dict | None:
    """``converted_tool_raw`` of the protocols whose ``render_request`` writes a converted
    function tool from its canonical fields alone: None."""
    return None


def no_cache_breakpoints(body: bytes) -> int | None:
    """``cache_breakpoints`` of the protocols without cache breakpoints in the body: None."""
    return None


def no_cache_markers(body: dict[str, Any]) -> int | None:
    """``place_cache_markers`` of the protocols without cache markers: the body unchanged, None."""
    return None


def no_token_counts(path: str) -> bool:
    """``counts_tokens`` of the protocols whose every path asks for a reply: False."""
    return False


def stream_in_body(path: str, query: Any, body: Any) -> bool:
    """``wants_stream`` of the protocols that ask for a stream in the body: True when the body
    (bytes or a parsed dict) has ``"stream": true``; a body that is not a JSON object asks for
    no stream."""
    try:
        obj = loads_object(body)
    except BadInputError:
        return False
    return obj.get("stream") is True


def nothing_to_strip(obj: dict, served: set[str], path: str) -> tuple[dict, str, list[dict]]:
    """``strip_reasoning`` of the protocols without signed reasoning: ``(obj, path, [])``."""
    return obj, path, []


def no_reasoning_keys(final: dict) -> set[str]:
    """``reasoning_keys`` of the protocols without signed reasoning: always empty."""
    return set()


def tools_as_parsed(conv: Conversation) -> list[ToolSpec]:
    """``offered_tools`` of the protocols whose tool definitions are all in ``tools``: the
    request's tool definitions as parsed."""
    return list(conv.tools)


def function_tools_only(spec: ToolSpec) -> str:
    """``tool_kind`` of the protocols whose every tool is a function: ``function``."""
    return "function"


def same_parts(a: list, b: list) -> bool:
    """Parts equal in every canonical field (``raw`` ignored, except for OtherPart whose raw is
    its content): whether a message's ``raw`` still says what its parts say."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if type(x) is not type(y):
            return False
        for f in dc_fields(x):
            if f.name == "raw" and not isinstance(x, OtherPart):
                continue
            if getattr(x, f.name) != getattr(y, f.name):
                return False
    return True
