"""The chain rule: which exchanges of a run are its main loop, and which are auxiliary.

Rule (docs/steps.md, "The chain rule, as implemented"), with no agent-specific branch:

1. Every ``POST`` exchange whose path is a model-API request path with a complete, parsable
   body is a **candidate**: its body is parsed with its protocol module (``parse_request``) and
   normalised (``normalise``: cache markers, signatures and client-made ids dropped, arguments
   parsed, empty content unified; Gemini compares without call ids). Everything else is
   auxiliary at once: other paths (``HEAD /``, ``GET /v1/models``) and other methods
   (``HEAD /v1/messages``), a missing, empty, cut (oversize) or unparsable body, token-count
   paths (``counts_tokens``).
2. Candidates are taken in arrival order (``seq``). Request B **repeats** the latest request A
   of a chain when both use the same protocol and their normalised messages, system prompt
   and tools are all equal: B is a retry of the same step (after an upstream 5xx, a broken
   stream). B **extends** A when both use the same protocol, B's normalised messages start with
   all of A's and are longer, and the system prompt and the tools are equal; one of the two
   may change (the step is then flagged ``system_changed`` or ``tools_changed``), not both: a
   request that continues a conversation under another system prompt *and* other tools (Qwen
   Code's memory-extraction request) is another chain. B joins the chain it repeats, else the
   chain whose latest request it extends with the most messages (ties: the one whose system
   prompt and tools are unchanged, then the chain active last); otherwise it starts a new
   chain, whose break from the earlier requests is described (``Chain.breaks``).
   A Responses request with ``previous_response_id`` carries only what follows that response:
   its messages are those of the exchange whose response has that id (the latest earlier one),
   then that response's reply, then its own input, so it extends that exchange's request.
   A request that continues no chain but carries the summary an earlier exchange S replied
   (:func:`_after_compaction`: the agent compacted its context) is the next slot of the chain
   S summarised (``Slot.compaction`` is S); S is auxiliary, kind ``compaction``.
3. A chain's length is its number of distinct requests (**slots**); the exchanges of one slot
   sent the same request, and the slot keeps the last one that succeeded (status 2xx and a
   response body), else its last one.
4. The **main chain** is the longest that is no subagent's (:mod:`pvisor.adapters.spawned`);
   ties go to the chain whose first request the profile's hint prefers (``prefer``), then to
   more tools, then to the earlier start.
5. Roles: the kept exchange of each slot of the main chain is ``main``; every other exchange is
   ``auxiliary``: the retries of a main-chain slot, every request of another chain (reported,
   with its chain number, never merged), and the non-candidates of rule 1 (chain None).

Public API: :func:`classify_run` (from a journal) and :func:`classify_exchanges` (from
exchanges and their request bodies) return a :class:`Classification`; its ``roles()`` is what
``Journal.set_exchange_roles`` stores. :func:`read_final_response` reads an exchange's final
response object from a journal. The online matcher, which tells one incoming request at a time
which main-loop request of a recording it is, is :mod:`pvisor.adapters.matcher`.

Each body is read once: a :class:`~pvisor.adapters.protocols.base.ParseMemo` per protocol gives
a message seen in an earlier body without reading it again, and each request keeps the parsed
messages it appends to its chain (``Request.tail``), from which the journal adapter takes the
observations without parsing the bodies a second time.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import orjson

from pvisor.adapters.agents.descriptor import ChainHint, action_message  # noqa: F401  (re-exported)
from pvisor.adapters.agents import descriptor_names, get_descriptor
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import ParseMemo
from pvisor.adapters.spawned import main_chain
from pvisor.core import progress
from pvisor.journal.content_encoding import DecodeError, decode_body
from pvisor.core.errors import BadInputError
from pvisor.journal.model import Action, Conversation, Exchange, Message, TextPart, ToolResult
from pvisor.journal.reader import JournalReader

#: ``prefer(conversation) -> bool``: the profile's tie-break hint, asked about the first request
#: of each chain that ties for the longest.
Prefer = Callable[[Conversation], bool]

#: left-out kinds (``LeftOutExchange.kind``)
LEFT_OUT_KINDS = (
    "non_protocol",
    "no_request_body",
    "unknown_protocol",
    "unparsable",
    "token_count",
    "retry",
    "chain",
    "compaction",
)


def _key(obj: Any) -> bytes:
    """A short key of a normalised value: sha256 of its JSON with object keys sorted (so key
    order never matters; list order does)."""
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # an integer past 64 bits, say
        data = json.dumps(obj, sort_keys=True, default=repr).encode()
    return hashlib.sha256(data).digest()


@dataclass(slots=True)
class Request:
    """One exchange as the chain rule sees it.

    Fields: ``exchange``; ``messages`` one key per normalised message; ``system_key`` and
    ``tools_key`` keys of the normalised system prompt and tools; ``left_out`` (kind, reason)
    for a non-candidate; for a candidate, ``protocol``, ``model``, ``tool_names`` and
    ``system_chars`` of its conversation; ``tail_from`` and ``tail``: the parsed messages from
    index ``tail_from`` on, what the request appends to the previous request of its chain (all
    of them for a chain's first request); ``previous_response_id`` (Responses) and ``base``,
    the request of the exchange whose response it names, with ``base_reply``, that response's
    reply as an assistant message. The whole conversation is not kept, so that a long run's
    bodies are never all in memory at once: :meth:`conversation` parses the body again when it
    is needed.
    """

    exchange: Exchange
    messages: list[bytes] = field(default_factory=list)
    system_key: bytes = b""
    tools_key: bytes = b""
    left_out: tuple[str, str] | None = None
    protocol: str | None = None
    model: str | None = None
    tool_names: list[str] = field(default_factory=list)
    system_chars: int = 0
    body_of: Callable[[Exchange], bytes | None] | None = field(default=None, repr=False)
    tail_from: int = 0
    tail: list[Message] | None = field(default=None, repr=False)
    previous_response_id: str | None = None
    base: "Request | None" = field(default=None, repr=False)
    base_reply: list[Message] = field(default_factory=list, repr=False)

    @property
    def id(self) -> str:
        return self.exchange.id

    @property
    def succeeded(self) -> bool:
        """The exchange ended with a 2xx status and a response body."""
        ex = self.exchange
        return (
            ex.outcome == "ok"
            and ex.status is not None
            and 200 <= ex.status < 300
            and ex.response_body is not None
        )

    def conversation(self) -> Conversation:
        """The request's parsed conversation (a candidate's body parsed again); for a request
        with a followed ``previous_response_id``, the messages of its ``base`` and
        ``base_reply`` come first.

        Raises BadInputError when called on a non-candidate."""
        if self.left_out is not None or self.body_of is None or self.protocol is None:
            raise BadInputError(
                f"exchange {self.id} has no conversation: {self.left_out[1] if self.left_out else 'not read'}"
            )
        body = self.body_of(self.exchange)
        conv = get_protocol(self.protocol).parse_request(
            body, path=self.exchange.path, query=self.exchange.query
        )
        if self.base is not None:
            conv.messages = self.base.conversation().messages + self.base_reply + conv.messages
        return conv

    def messages_from(self, start: int) -> list[Message]:
        """The parsed messages of the request from index ``start`` on: from ``tail`` when it
        holds them, else from the body parsed again."""
        if self.tail is not None and start >= self.tail_from:
            return self.tail[start - self.tail_from :]
        return self.conversation().messages[start:]

    def describe_outcome(self) -> str:
        """``status 529`` or ``status 200, outcome aborted_by_client``, for reasons."""
        ex = self.exchange
        status = f"status {ex.status}" if ex.status is not None else "no status"
        return status if ex.outcome == "ok" else f"{status}, outcome {ex.outcome}"


@dataclass(slots=True)
class Slot:
    """One request position of a chain: the exchanges that sent the same request (a retry
    repeats it), in arrival order. ``kept`` is the one that stands for the step."""

    requests: list[Request]
    #: the exchange whose reply the next request of the chain carries, when the trajectory
    #: found it is not the last that succeeded (a retry answered after the agent went on)
    chosen: "Request | None" = None
    #: for the first request after a compaction: the summary exchange whose reply it carries
    compaction: "Request | None" = None

    @property
    def kept(self) -> Request:
        """The exchange chosen for the step (:attr:`chosen`), else the last exchange that
        succeeded, else the last one."""
        if self.chosen is not None:
            return self.chosen
        for r in reversed(self.requests):
            if r.succeeded:
                return r
        return self.requests[-1]

    @property
    def latest(self) -> Request:
        return self.requests[-1]

    @property
    def retries(self) -> list[Request]:
        """The exchanges of the slot other than the kept one."""
        kept = self.kept
        return [r for r in self.requests if r is not kept]


@dataclass(slots=True)
class Chain:
    """A maximal sequence of requests linked by "extends".

    Fields: ``number`` (1-based, by first arrival); ``slots``; ``role`` (``main`` or
    ``auxiliary``); ``breaks``: for a chain that is not the run's first, why its first request
    continues no earlier chain (a sentence naming the nearest earlier request);
    ``nearest``: that request's exchange id and ``common_messages`` the number of leading
    normalised messages they share.
    """

    number: int
    slots: list[Slot] = field(default_factory=list)
    role: str = "auxiliary"
    breaks: str | None = None
    nearest: str | None = None
    common_messages: int = 0

    @property
    def first(self) -> Request:
        return self.slots[0].requests[0]

    @property
    def exchanges(self) -> list[Request]:
        return [r for s in self.slots for r in s.requests]

    def summary(self) -> dict[str, Any]:
        """JSON-ready: ``chain``, ``role``, ``requests`` (slots), ``exchanges`` (ids, retries
        included, in arrival order), ``first_seq``, ``last_seq``, ``attempts``, ``protocol``,
        ``model``, ``tools`` (count of the first request), ``system_chars``, ``breaks``,
        ``nearest``, ``common_messages``."""
        exs = self.exchanges
        first = self.first
        return {
            "chain": self.number,
            "role": self.role,
            "requests": len(self.slots),
            "exchanges": [r.id for r in exs],
            "first_seq": exs[0].exchange.seq,
            "last_seq": exs[-1].exchange.seq,
            "attempts": sorted({r.exchange.attempt for r in exs}),
            "protocol": first.protocol,
            "model": first.model,
            "tools": len(first.tool_names),
            "system_chars": first.system_chars,
            "breaks": self.breaks,
            "nearest": self.nearest,
            "common_messages": self.common_messages,
        }


@dataclass(slots=True)
class LeftOutExchange:
    """An auxiliary exchange and why: ``exchange`` id, ``seq``, ``kind`` (one of
    :data:`LEFT_OUT_KINDS`), ``reason`` (a sentence), ``chain`` (None outside every chain)."""

    exchange: str
    seq: int
    kind: str
    reason: str
    chain: int | None = None


@dataclass(slots=True)
class Classification:
    """The chain rule's result for one run.

    Fields: ``run`` id; ``requests`` every exchange in arrival order; ``chains`` by number;
    ``main`` the main chain (None when no exchange is a candidate); ``left_out`` the auxiliary
    exchanges in arrival order.
    """

    run: str
    requests: list[Request]
    chains: list[Chain]
    main: Chain | None
    left_out: list[LeftOutExchange]

    def roles(self) -> dict[str, tuple[int | None, str]]:
        """exchange id -> (chain number or None, ``main`` | ``auxiliary``), for every exchange
        of the run: the argument of ``Journal.set_exchange_roles``."""
        out: dict[str, tuple[int | None, str]] = {}
        for chain in self.chains:
            for slot in chain.slots:
                kept = slot.kept
                for r in slot.requests:
                    out[r.id] = (chain.number, "main" if chain.role == "main" and r is kept else "auxiliary")
        for lo in self.left_out:
            if lo.kind == "compaction":  # a summary request belongs to the chain it summarises
                out[lo.exchange] = (lo.chain, "auxiliary")
        for r in self.requests:
            out.setdefault(r.id, (None, "auxiliary"))
        return out

    def keep(self, slot: Slot, request: Request) -> None:
        """Make ``request`` (the one whose reply the next request carries) the exchange ``slot`` of
        the main chain keeps, so that :meth:`roles` and the ``retry`` entries of ``left_out`` name it."""
        assert self.main is not None and request in slot.requests
        slot.chosen = request
        others = [lo for lo in self.left_out if all(lo.exchange != r.id for r in slot.requests)]
        self.left_out = sorted([*others, *retries_left_out(slot, self.main.number)], key=lambda lo: lo.seq)

    @property
    def main_requests(self) -> list[Request]:
        """The kept request of each slot of the main chain: main-loop request i is index i-1."""
        return [s.kept for s in self.main.slots] if self.main is not None else []


# --------------------------------------------------------------------------- candidates

#: outcomes of an exchange whose request may have arrived only in part
_CUT_SHORT = frozenset({"aborted_by_client", "incomplete", "in_flight"})


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class _Reader:
    """Reads the candidates of one run: one :class:`ParseMemo` per protocol, and memos of the
    normalised tools."""

    def __init__(self, body_of: Callable[[Exchange], bytes | None]):
        self.body_of = body_of
        self.memos: dict[str, ParseMemo] = {}
        self.tool_keys: dict[bytes, bytes] = {}

    def read(self, ex: Exchange) -> tuple[Request, Conversation | None]:
        """Parse and normalise one exchange: (request, its conversation), or the request marked
        left out with the reason and None."""
        req = Request(ex, body_of=self.body_of)
        where = f"{ex.method} {ex.path}"
        if ex.protocol is None:
            req.left_out = ("non_protocol", f"{where} is not a model-API request path")
            return req, None
        if ex.method.upper() != "POST":
            req.left_out = ("non_protocol", f"{where} asks for no reply: model-API requests are POST")
            return req, None
        try:
            mod = get_protocol(ex.protocol)
        except KeyError:
            req.left_out = ("unknown_protocol", f"protocol {ex.protocol!r} is not one this pvisor reads")
            return req, None
        if mod.counts_tokens(ex.path):
            req.left_out = ("token_count", f"{where} asks for a token count, not a reply")
            return req, None
        if ex.outcome == "oversize":
            req.left_out = (
                "no_request_body",
                f"{where} was refused as oversize (status {ex.status}): "
                f"its body of {ex.request_bytes} bytes or more was not stored whole",
            )
            return req, None
        body = self.body_of(ex)
        if body is None:
            req.left_out = ("no_request_body", f"{where} has no stored request body (outcome {ex.outcome})")
            return req, None
        if not body:
            req.left_out = ("no_request_body", f"{where} has an empty request body")
            return req, None
        memo = self.memos.setdefault(mod.NAME, ParseMemo())
        try:
            conv = mod.parse_request(body, path=ex.path, query=ex.query, memo=memo)
        except BadInputError as exc:
            if ex.status is None and ex.outcome in _CUT_SHORT:
                req.left_out = (
                    "no_request_body",
                    f"{where}: the request ended before its body did "
                    f"(outcome {ex.outcome}, {_n(len(body), 'byte')} stored)",
                )
            else:
                req.left_out = ("unparsable", f"request body does not parse: {exc.message}")
            return req, None
        try:
            self._keys(mod, memo, conv, req)
        except BadInputError as exc:
            req.left_out = ("unparsable", f"request body does not parse: {exc.message}")
            return req, None
        req.protocol = conv.protocol
        req.model = conv.model
        req.tool_names = [t.name for t in mod.offered_tools(conv)]
        req.system_chars = len(conv.system or "")
        prev = conv.params.get("previous_response_id")
        req.previous_response_id = prev if isinstance(prev, str) and prev else None
        return req, conv

    def _keys(self, mod: Any, memo: ParseMemo, conv: Conversation, req: Request) -> None:
        """Fill ``req.messages``, ``system_key`` and ``tools_key``: a message the memo read
        before keeps the key computed then; the others are normalised together."""
        read = memo.last_read(conv.messages)
        if read is not None and read.source is not None and isinstance(read.source.data, list):
            keys: list[bytes | None] = read.source.data[: read.reused]  # the messages taken over
        else:
            keys = []
        fresh: list[int] = []
        values = memo.values
        for i in range(len(keys), len(conv.messages)):
            m = conv.messages[i]
            k = values.get(id(m)) if memo.holds(m) else None
            keys.append(k)
            if k is None:
                fresh.append(i)
        try:
            tools_raw: bytes | None = orjson.dumps([t.raw for t in conv.tools])
        except (TypeError, orjson.JSONEncodeError):
            tools_raw = None
        tools_key = (
            self.tool_keys.get(mod.NAME.encode() + b"\0" + tools_raw) if tools_raw is not None else None
        )
        view = Conversation(
            protocol=conv.protocol,
            system=conv.system,
            tools=conv.tools if tools_key is None else [],
            messages=[conv.messages[i] for i in fresh],
        )
        norm = mod.normalise(view)
        for i, n in zip(fresh, norm["messages"]):
            k = keys[i] = _key(n)
            if memo.holds(conv.messages[i]):
                memo.values[id(conv.messages[i])] = k
        if tools_key is None:
            tools_key = _key(norm["tools"])
            if tools_raw is not None:
                self.tool_keys[mod.NAME.encode() + b"\0" + tools_raw] = tools_key
        req.messages = keys  # type: ignore[assignment]  # every entry is filled now
        if read is not None:
            read.data = keys
        req.system_key = _key(norm["system"])
        req.tools_key = tools_key


def read_final_response(reader: JournalReader, ex: Exchange) -> tuple[Any, str | None]:
    """The final response object of an exchange (the stored ``response_final`` of a stream,
    else the body, decoded and reassembled when needed) and, when there is none, why.

    Raises IntegrityError (naming the exchange) when a stored body is damaged."""
    if ex.response_body is None:
        return None, f"no response body (outcome {ex.outcome})"
    if ex.response_final:
        data = reader.response_body(ex)
    else:
        data = reader.response_body(ex, raw=True)
        encoding = next((v for k, v in ex.response_headers.items() if k.lower() == "content-encoding"), None)
        if encoding and data is not None:
            try:
                data = decode_body(data, encoding)
            except DecodeError as exc:
                return None, f"the response's Content-Encoding cannot be undone: {exc}"
        if ex.streamed and ex.protocol is not None:
            try:
                mod = get_protocol(ex.protocol)
            except KeyError:
                return None, f"protocol {ex.protocol!r} is not one this pvisor reads"
            result = mod.reassemble([data or b""])
            if result.final is None:
                return None, "the event stream holds no response"
            return result.final, None
    try:
        return orjson.loads(data or b""), None
    except orjson.JSONDecodeError as exc:
        return None, f"the response is not JSON: {exc}"


# --------------------------------------------------------------------------- linking


def _common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _relation(a: Request, b: Request) -> str | None:
    """``"repeats"``, ``"extends"`` or None: how request ``b`` relates to the earlier ``a``."""
    if a.protocol != b.protocol:
        return None
    same_system = a.system_key == b.system_key
    same_tools = a.tools_key == b.tools_key
    if not (same_system or same_tools):
        return None
    n = len(a.messages)
    if len(b.messages) < n or b.messages[:n] != a.messages:
        return None
    if len(b.messages) == n:
        # a retry sends the very same request; the same messages under other tools or another
        # system prompt are another request (a title request without tools, say)
        return "repeats" if same_system and same_tools else None
    return "extends"


def changes_between(prev: Request, req: Request) -> dict[str, Any]:
    """What ``req`` changed against the earlier ``prev`` of its chain: ``{"system_changed":
    True}`` and/or ``{"tools_changed": True, "tools_added": [names], "tools_removed": [names]}``
    (a tool whose definition changed is in neither list); {} when neither changed."""
    out: dict[str, Any] = {}
    if prev.system_key != req.system_key:
        out["system_changed"] = True
    if prev.tools_key != req.tools_key:
        before, after = prev.tool_names, req.tool_names
        out["tools_changed"] = True
        out["tools_added"] = [t for t in after if t not in before]
        out["tools_removed"] = [t for t in before if t not in after]
    return out


def _describe_break(req: Request, earlier: list[Request], chain_of: dict[str, int]) -> tuple[str, str, int]:
    """Why ``req`` continues no earlier chain: (sentence, nearest earlier exchange id, leading
    messages shared with it). The nearest is the earlier request sharing the most leading
    messages (the latest among equals)."""

    def closeness(p: Request) -> tuple:
        # leading messages shared, then those shared after the first one (a regenerated first
        # message), then same system prompt, same tools; max() keeps the first of equals: the latest
        return (
            _common_prefix(p.messages, req.messages),
            _common_prefix(p.messages[1:], req.messages[1:]),
            p.system_key == req.system_key,
            p.tools_key == req.tools_key,
        )

    best = max(reversed(earlier), key=closeness)
    common = _common_prefix(best.messages, req.messages)
    if req.previous_response_id is not None and req.base is None:
        text = (
            f"its previous_response_id {req.previous_response_id} names no response of this run: "
            "the server holds "
            f"the conversation before it (nearest: {best.id} (chain {chain_of[best.id]}))"
        )
        return text, best.id, common
    diffs: list[str] = []
    if best.system_key != req.system_key:
        diffs.append("another system prompt")
    if best.tools_key != req.tools_key:
        diffs.append(f"other tools ({len(req.tool_names)} against {len(best.tool_names)})")
    where = f"{best.id} (chain {chain_of[best.id]})"
    if best.protocol != req.protocol:
        diffs.insert(0, f"another protocol ({req.protocol} against {best.protocol})")
    if common == len(best.messages) == len(req.messages) and diffs:
        text = f"sends the messages of {where} under {_and(diffs)}"
    elif common == len(best.messages) and common > 0:
        if len(diffs) >= 2 or best.protocol != req.protocol:
            text = f"continues the conversation of {where} under {_and(diffs)}"
        else:
            text = f"extends {where}, which is not the latest request of its chain (a fork)"
            if diffs:
                text += f", with {diffs[0]}"
    elif (
        common == 0
        and len(best.messages) > 1
        and _common_prefix(best.messages[1:], req.messages[1:]) == len(best.messages) - 1
    ):
        text = (
            f"its first message differs from that of {where}, and the messages after it extend that request "
            "(a regenerated first message, as when a session is resumed)"
        )
        if diffs:
            text += f"; {_and(diffs)}"
    elif common == 0:
        text = f"its first message differs from that of every earlier request (nearest: {where})"
        if diffs:
            text += f"; {_and(diffs)}"
    else:
        text = f"shares its first {_n(common, 'message')} with {where}, then differs at message {common}"
        if diffs:
            text += f"; {_and(diffs)}"
    return text, best.id, common


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def classify_exchanges(
    exchanges: Iterable[Exchange],
    request_body: Callable[[Exchange], bytes | None],
    *,
    prefer: Prefer | None = None,
    run: str | None = None,
    final_response: Callable[[Exchange], Any] | None = None,
    on_conversation: Callable[[Request, Conversation], None] | None = None,
) -> Classification:
    """Apply the chain rule (module docstring) to one run's exchanges.

    Args:
        exchanges: the exchanges of one run; ordered here by ``seq``.
        request_body: gives an exchange's stored request body (bytes, or None when there is
            none), such as ``JournalReader.request_body``; called once per exchange here, and
            again by :meth:`Request.conversation`.
        prefer: the profile's tie-break hint (a :class:`ChainHint` or any callable
            ``Conversation -> bool``), asked about the first request of each tied chain.
        run: the run id (default: that of the first exchange).
        final_response: gives an exchange's final response object (or None), such as
            ``lambda ex: read_final_response(reader, ex)[0]``; needed to follow a Responses
            ``previous_response_id`` (without it, such a request starts a chain of its own).
        on_conversation: handed each candidate and its body's conversation as soon as it is
            parsed (the body alone, before a ``previous_response_id`` is followed), so that a
            caller that needs something of every body (prepare-only's description of a prefix)
            does not parse it again. The conversation must not be changed, nor kept: its
            messages are shared with the other requests' (:class:`ParseMemo`).

    Returns:
        A :class:`Classification`. Never raises for bad bodies: they are left out with a reason.
    """
    ordered = sorted(exchanges, key=lambda e: (e.seq, e.started_ms, e.id))
    reader = _Reader(request_body)
    responses = _ResponseIds(final_response)
    requests: list[Request] = []
    chains: list[Chain] = []
    chain_of: dict[str, int] = {}
    seen: list[Request] = []
    last_active: dict[int, int] = {}  # chain number -> position of its latest request
    compacted: dict[str, tuple[int, str]] = {}  # summary exchange -> (chain, the request that carries it)
    for pos, ex in enumerate(ordered):
        req, conv = reader.read(ex)
        requests.append(req)
        if conv is None:
            continue
        if on_conversation is not None:
            on_conversation(req, conv)
        own = conv.messages
        if req.previous_response_id is not None:
            responses.follow(req, seen, reader)
        repeats, extends = _related(chains, req)
        if repeats:
            chain = max(repeats, key=lambda c: last_active[c.number])
            tail_from = len(chain.slots[-2].latest.messages) if len(chain.slots) > 1 else 0
            chain.slots[-1].requests.append(req)
        elif extends:
            chain = _best_extended(extends, req, last_active)
            tail_from = len(chain.slots[-1].latest.messages)
            chain.slots.append(Slot([req]))
        elif (
            resumed := _after_compaction(req, own, seen, chains, chain_of, responses, compacted)
        ) is not None:
            chain, summary = resumed
            if summary.id in compacted:
                # a later request carrying the same summary, its first messages rewritten
                # (Qwen Code puts its start-up reminders back): the next step of that chain
                tail_from = len(chain.slots[-1].latest.messages)
                chain.slots.append(Slot([req]))
            else:
                chain.slots.append(Slot([req], compaction=summary))
                compacted[summary.id] = (chain.number, req.id)
                tail_from = 0
        else:
            chain = Chain(number=len(chains) + 1, slots=[Slot([req])])
            if seen:
                chain.breaks, chain.nearest, chain.common_messages = _describe_break(req, seen, chain_of)
            chains.append(chain)
            tail_from = 0
        req.tail_from = tail_from
        req.tail = _tail(req, own, tail_from)
        chain_of[req.id] = chain.number
        last_active[chain.number] = pos
        seen.append(req)

    chains = [c for c in chains if c.slots]  # a chain whose one request was a summary
    main = main_chain(chains, prefer)
    if main is not None:
        main.role = "main"
    left_out = _left_out(requests, chains, main, compacted)
    run_id = run if run is not None else (requests[0].exchange.run if requests else "")
    return Classification(run=run_id, requests=requests, chains=chains, main=main, left_out=left_out)


def _related(chains: list[Chain], req: Request) -> tuple[list[Chain], list[Chain]]:
    """The chains whose latest request ``req`` repeats, and those it extends."""
    repeats: list[Chain] = []
    extends: list[Chain] = []
    for chain in chains:
        if not chain.slots:  # emptied: its one request was a summary
            continue
        rel = _relation(chain.slots[-1].latest, req)
        if rel == "repeats":
            repeats.append(chain)
        elif rel == "extends":
            extends.append(chain)
    return repeats, extends


def _best_extended(extends: list[Chain], req: Request, last_active: dict[int, int]) -> Chain:
    """Of the chains ``req`` extends, the one it continues."""

    def fit(c: Chain) -> tuple:
        # the most messages extended, then the same system prompt and tools, then the chain
        # active last
        a = c.slots[-1].latest
        return (
            len(a.messages),
            (a.system_key == req.system_key) + (a.tools_key == req.tools_key),
            last_active[c.number],
        )

    return max(extends, key=fit)


#: how far back a request after a compaction looks for the summary exchange it carries
COMPACTION_LOOKBACK = 8
#: a line of a summary shorter than this (a heading, a tag) says nothing about who carries it
_SUMMARY_LINE_MIN = 16
_TAG = re.compile(r"<[^>]*>")


def message_texts(messages: list[Message]) -> str:
    """The texts of ``messages`` (text parts and string tool results), one per line."""
    out: list[str] = []
    for m in messages:
        for p in m.parts:
            if isinstance(p, TextPart):
                out.append(p.text)
            elif isinstance(p, ToolResult) and isinstance(p.content, str):
                out.append(p.content)
    return "\n".join(out)


def summary_lines(text: str) -> list[str]:
    """The lines of a summary reply that another request can be recognised by: tags removed
    (agents drop the summary's own tags), stripped, at least :data:`_SUMMARY_LINE_MIN` long."""
    return [ln.strip() for ln in _TAG.sub("\n", text).splitlines() if len(ln.strip()) >= _SUMMARY_LINE_MIN]


def summary_share(lines: list[str], text: str) -> float:
    """The share of a summary's ``lines`` that ``text`` holds: a request carries the summary
    when it is at least one half (the chain rule and the online matcher ask the same)."""
    return sum(ln in text for ln in lines) / len(lines) if lines else 0.0


def _after_compaction(
    req: Request,
    own: list[Message],
    seen: list[Request],
    chains: list[Chain],
    chain_of: dict[str, int],
    responses: "_ResponseIds",
    compacted: dict[str, tuple[int, str]],
) -> tuple[Chain, Request] | None:
    """The chain ``req`` continues after a compaction, and the summary exchange: ``req``
    continues no chain, and its messages hold at least half the lines (:func:`summary_lines`)
    of the text reply of an exchange S among the last :data:`COMPACTION_LOOKBACK` requests
    before it, of the same attempt; the chain is S's own when S extended it (S is then taken out of it: a
    summary is no step), else the chain whose latest request came before S and shares
    ``req``'s system prompt or tools, the one active last. None otherwise, and when the
    classification cannot read responses."""
    if responses.final_response is None or req.protocol is None:
        return None
    text = None
    mod = get_protocol(req.protocol)
    for summary in reversed(seen[-COMPACTION_LOOKBACK:]):
        # within one attempt: a resumed session sends its history again, earlier replies
        # included, and is no compaction (a compaction right at a resume is not recognised)
        if summary.exchange.attempt != req.exchange.attempt:
            break
        if summary.protocol != req.protocol or not summary.succeeded:
            continue
        final = responses._final(summary)
        try:
            action = mod.response_to_action(final) if isinstance(final, dict) else None
        except BadInputError:
            action = None
        if action is None or action.tool_calls or not action.text:
            continue
        lines = summary_lines(action.text)
        if not lines:
            continue
        if text is None:
            text = message_texts(own)
        if summary_share(lines, text) < 0.5:
            continue
        if summary.id in compacted:  # a summary an earlier request carried already
            return chains[compacted[summary.id][0] - 1], summary
        home = chains[chain_of[summary.id] - 1]
        if len(home.slots) > 1 and home.slots[-1].latest is summary and len(home.slots[-1].requests) == 1:
            prev = home.slots[-2].latest
            if prev.system_key != req.system_key and prev.tools_key != req.tools_key:
                # another conversation quoting the chain's last reply (a memory request under
                # another system prompt and other tools): no compaction of this chain
                return None
            home.slots.pop()  # the summary request had extended the chain: it is no step of it
            return home, summary
        before = [
            c
            for c in chains
            if c.slots
            and c is not home
            and c.slots[-1].latest.exchange.seq < summary.exchange.seq
            and c.slots[-1].latest.protocol == req.protocol
            and (
                c.slots[-1].latest.system_key == req.system_key
                or c.slots[-1].latest.tools_key == req.tools_key
            )
        ]
        if not before:
            return None
        if len(home.slots) == 1 and len(home.slots[0].requests) == 1:
            home.slots.clear()  # a chain of the summary alone: dropped when the chains are ranked
        return max(before, key=lambda c: c.slots[-1].latest.exchange.seq), summary
    return None


def _tail(req: Request, own: list[Message], start: int) -> list[Message]:
    """The parsed messages of ``req`` from index ``start`` on (``own``: the messages of its body)."""
    if req.base is None:
        return own[start:]
    appended = req.base_reply + own
    n = len(req.base.messages)
    return appended[start - n :] if start >= n else req.base.messages_from(start) + appended


class _ResponseIds:
    """Follows Responses ``previous_response_id``: the response id of each earlier exchange,
    read at most once."""

    def __init__(self, final_response: Callable[[Exchange], Any] | None):
        self.final_response = final_response
        self.ids: dict[str, str | None] = {}

    def _final(self, req: Request) -> Any:
        if self.final_response is None:
            return None
        try:
            return self.final_response(req.exchange)
        except BadInputError:
            return None

    def follow(self, req: Request, seen: list[Request], reader: _Reader) -> None:
        """Set ``req.base`` to the latest earlier request (same protocol) whose response has
        the id ``req.previous_response_id``, ``req.base_reply`` to that response's reply, and
        prefix ``req.messages`` with theirs. Nothing when no such exchange is in the run."""
        if self.final_response is None:
            return
        mod = get_protocol(req.protocol or req.exchange.protocol or "")
        for earlier in reversed(seen):
            if earlier.protocol != req.protocol:
                continue
            if earlier.id not in self.ids:
                final = self._final(earlier)
                rid = final.get("id") if isinstance(final, dict) else None
                self.ids[earlier.id] = rid if isinstance(rid, str) else None
            if self.ids[earlier.id] != req.previous_response_id:
                continue
            final = self._final(earlier)
            try:
                action = mod.response_to_action(final) if isinstance(final, dict) else Action()
            except BadInputError:
                action = Action()
            reply = action_message(action)
            req.base = earlier
            req.base_reply = [reply] if reply.parts else []
            keys = [
                _key(n)
                for n in mod.normalise(Conversation(protocol=mod.NAME, messages=req.base_reply))["messages"]
            ]
            req.messages = earlier.messages + keys + req.messages
            return


def retries_left_out(slot: Slot, chain: int) -> list[LeftOutExchange]:
    """The ``retry`` entries of main-chain ``slot`` (chain number ``chain``): each exchange but the
    kept one, the reason naming the kept one, both outcomes, and why when :attr:`Slot.chosen`."""
    kept = slot.kept
    why = ", whose reply the next request carries" if slot.chosen is not None else ""
    out = []
    for r in slot.retries:
        reason = (
            f"the same request as {kept.id} ({r.describe_outcome()}); "
            f"the step keeps {kept.id} ({kept.describe_outcome()}){why}"
        )
        changed = [k for k in ("system_changed", "tools_changed") if k in changes_between(r, kept)]
        if changed:
            reason += f"; {' and '.join(changed)} between them"
        out.append(LeftOutExchange(r.id, r.exchange.seq, "retry", reason, chain))
    return out


def _left_out(
    requests: list[Request],
    chains: list[Chain],
    main: Chain | None,
    compacted: dict[str, tuple[int, str]] | None = None,
) -> list[LeftOutExchange]:
    found: dict[str, LeftOutExchange] = {}
    for r in requests:
        if r.left_out is not None:
            found[r.id] = LeftOutExchange(r.id, r.exchange.seq, r.left_out[0], r.left_out[1])
    for sid, (number, by) in (compacted or {}).items():
        seq = next(r.exchange.seq for r in requests if r.id == sid)
        found[sid] = LeftOutExchange(
            sid,
            seq,
            "compaction",
            f"the agent's summary request: request {by} of chain {number} "
            "carries its reply in place of the conversation before it",
            number,
        )
    for chain in chains:
        if chain is main:
            for slot in chain.slots:
                found.update((lo.exchange, lo) for lo in retries_left_out(slot, chain.number))
            continue
        assert main is not None  # a run with chains has a main chain
        main_note = f"the main chain is chain {main.number} ({_n(len(main.slots), 'request')})"
        diffs = []
        if chain.first.system_key != main.first.system_key:
            diffs.append("another system prompt")
        if chain.first.tools_key != main.first.tools_key:
            diffs.append("other tools")
        if diffs:
            main_note += f", with {' and '.join(diffs)}"
        head = (
            f"chain {chain.number}: {_n(len(chain.slots), 'request')}, "
            f"{_n(len(chain.first.tool_names), 'tool')}"
        )
        tail = f"; {chain.breaks}" if chain.breaks else ""
        for r in chain.exchanges:
            found[r.id] = LeftOutExchange(
                r.id, r.exchange.seq, "chain", f"{head}{tail}; {main_note}".rstrip("; "), chain.number
            )
    return [found[r.id] for r in requests if r.id in found]


def classify_run(
    reader: JournalReader,
    run_id: str,
    *,
    prefer: Prefer | None = None,
    on_request_body: Callable[[Exchange, bytes | None], None] | None = None,
    on_conversation: Callable[[Request, Conversation], None] | None = None,
) -> Classification:
    """Apply the chain rule to the run ``run_id`` (or a unique prefix) of a journal.

    ``on_request_body`` is handed each request body as it is read (a caller that needs the
    bodies too, as the report does, reads them once); ``on_conversation`` each candidate's
    parsed body (:func:`classify_exchanges`). ``prefer`` None: the hint of the run's
    agent's descriptor, if pvisor knows that agent. Raises UsageError (from the reader) when
    no run or several match; IntegrityError when a stored body is damaged.
    """
    run = reader.run(run_id)
    if prefer is None and run.agent in descriptor_names():
        prefer = get_descriptor(run.agent).chain_hint
    exchanges = reader.exchanges(run.id)
    # reading a long run allocates millions of parsed JSON values and no reference cycle: the
    # cyclic collector would only rescan them, a quarter of the time (docs/benchmarks.md)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with progress.task(f"reading run {run.id}", len(exchanges), progress.Unit.EXCHANGES) as task:

            def request_body(ex: Exchange) -> bytes | None:
                task.advance()  # parsing each request is the cost of classifying a long run
                body = reader.request_body(ex)
                if on_request_body is not None:
                    on_request_body(ex, body)
                return body

            return classify_exchanges(
                exchanges,
                request_body,
                prefer=prefer,
                run=run.id,
                final_response=lambda ex: read_final_response(reader, ex)[0],
                on_conversation=on_conversation,
            )
    finally:
        if collecting:
            gc.enable()


def said(mod: Any, messages: list[Message]) -> tuple[str, list[Any]]:
    """What assistant messages say, for comparing an agent's echo of a reply with the reply:
    their text joined, and their normalised tool calls in order (reasoning and other blocks left
    out: agents may drop reasoning from their history without dropping the action, and an
    Anthropic echo carries the provider's server tool results that no action holds)."""
    norm = mod.normalise(Conversation(protocol=mod.NAME, messages=messages))
    text: list[str] = []
    calls: list[Any] = []
    for m in norm["messages"]:
        for p in m["parts"]:
            if p["type"] == "text":
                text.append(p["text"])
            elif p["type"] == "tool_call":
                calls.append(p)
    return "".join(text), calls
