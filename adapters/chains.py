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
4. The **main chain** is the longest; ties go to the chain whose first request the profile's
   hint prefers (``prefer``), then to more tools, then to the earlier start.
5. Roles: the kept exchange of each slot of the main chain is ``main``; every other exchange is
   ``auxiliary``: the retries of a main-chain slot, every request of another chain (reported,
   with its chain number, never merged), and the non-candidates of rule 1 (chain None).

Public API: :func:`classify_run` (from a journal) and :func:`classify_exchanges` (from
exchanges and their request bodies) return a :class:`Classification`; its ``roles()`` is what
``Journal.set_exchange_roles`` stores. :func:`read_final_response` reads an exchange's final
response object from a journal.

Each body is read once: a :class:`~pvisor.adapters.protocols.base.ParseMemo` per protocol gives
a message seen in an earlier body without reading it again, and each request keeps the parsed
messages it appends to its chain (``Request.tail``), from which the journal adapter takes the
observations without parsing the bodies a second time.
"""

from __future__ import annotations

import enum
import gc
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import orjson

from pvisor.adapters.agents.descriptor import ChainHint, action_message  # noqa: F401  (re-exported)
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import ParseMemo
from pvisor.journal import progress
from pvisor.journal.content_encoding import DecodeError, decode_body
from pvisor.journal.errors import BadInputError
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
            f"its previous_response_id {req.previous_response_id} names no response of this run: the server holds "
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
        text = f"its first message differs from that of {where}, and the messages after it extend that request (a regenerated first message, as when a session is resumed)"
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
        own = conv.messages
        if req.previous_response_id is not None:
            responses.follow(req, seen, reader)
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
        if repeats:
            chain = max(repeats, key=lambda c: last_active[c.number])
            tail_from = len(chain.slots[-2].latest.messages) if len(chain.slots) > 1 else 0
            chain.slots[-1].requests.append(req)
        elif extends:

            def fit(c: Chain) -> tuple:
                # the most messages extended, then the same system prompt and tools, then the chain active last
                a = c.slots[-1].latest
                return (
                    len(a.messages),
                    (a.system_key == req.system_key) + (a.tools_key == req.tools_key),
                    last_active[c.number],
                )

            chain = max(extends, key=fit)
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
    main = _main_chain(chains, prefer)
    if main is not None:
        main.role = "main"
    left_out = _left_out(requests, chains, main, compacted)
    run_id = run if run is not None else (requests[0].exchange.run if requests else "")
    return Classification(run=run_id, requests=requests, chains=chains, main=main, left_out=left_out)


#: how far back a request after a compaction looks for the summary exchange it carries
COMPACTION_LOOKBACK = 8
#: a line of a summary shorter than this (a heading, a tag) says nothing about who carries it
_SUMMARY_LINE_MIN = 16
_TAG = re.compile(r"<[^>]*>")


def _texts(messages: list[Message]) -> str:
    out: list[str] = []
    for m in messages:
        for p in m.parts:
            if isinstance(p, TextPart):
                out.append(p.text)
            elif isinstance(p, ToolResult) and isinstance(p.content, str):
                out.append(p.content)
    return "\n".join(out)


def _summary_lines(text: str) -> list[str]:
    """The lines of a summary reply that another request can be recognised by: tags removed
    (agents drop the summary's own tags), stripped, at least :data:`_SUMMARY_LINE_MIN` long."""
    return [ln.strip() for ln in _TAG.sub("\n", text).splitlines() if len(ln.strip()) >= _SUMMARY_LINE_MIN]


def _summary_share(lines: list[str], text: str) -> float:
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
    continues no chain, and its messages hold at least half the lines (:func:`_summary_lines`)
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
        lines = _summary_lines(action.text)
        if not lines:
            continue
        if text is None:
            text = _texts(own)
        if _summary_share(lines, text) < 0.5:
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


def _main_chain(chains: list[Chain], prefer: Prefer | None) -> Chain | None:
    if not chains:
        return None
    longest = max(len(c.slots) for c in chains)

    def rank(c: Chain) -> tuple:
        hinted = False
        if prefer is not None and len(c.slots) == longest:
            try:
                hinted = bool(prefer(c.first.conversation()))
            except Exception:  # a hint is advice; a failing one prefers nothing
                hinted = False
        return (len(c.slots), hinted, len(c.first.tool_names), -c.first.exchange.seq)

    return max(chains, key=rank)


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
                kept = slot.kept
                for r in slot.retries:
                    reason = f"the same request as {kept.id} ({r.describe_outcome()}); the step keeps {kept.id} ({kept.describe_outcome()})"
                    changed = [
                        k for k in ("system_changed", "tools_changed") if k in changes_between(r, kept)
                    ]
                    if changed:
                        reason += f"; {' and '.join(changed)} between them"
                    found[r.id] = LeftOutExchange(r.id, r.exchange.seq, "retry", reason, chain.number)
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
        head = f"chain {chain.number}: {_n(len(chain.slots), 'request')}, {_n(len(chain.first.tool_names), 'tool')}"
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
) -> Classification:
    """Apply the chain rule to the run ``run_id`` (or a unique prefix) of a journal.

    ``on_request_body`` is handed each request body as it is read (a caller that needs the
    bodies too, as the report does, reads them once). Raises UsageError (from the reader) when
    no run or several match; IntegrityError when a stored body is damaged.
    """
    run = reader.run(run_id)
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
            )
    finally:
        if collecting:
            gc.enable()


# --------------------------------------------------------------------------- the online matcher


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


class MatchKind(str, enum.Enum):
    """What an incoming request is to playback (:class:`OnlineMatcher`)."""

    MAIN = "main"  #: main-loop request k: it carries the served A_1..A_(k-1) and the task
    RETRY = "retry"  #: main-loop request k again (answered before)
    AUXILIARY = "auxiliary"  #: not a main-loop request (a title request, a probe, a memory request)
    DIVERGED = "diverged"  #: a main-loop request that does not carry what was served


@dataclass(slots=True)
class Divergence:
    """Where an incoming main-loop request left the recording, in the manner of a VCR.py miss:
    ``request`` k (1-based, the request it would be), ``message`` and ``part`` indices in the
    incoming request, ``expected`` and ``got`` (short renderings), ``reason`` (one sentence),
    ``nearest``: the recorded request it was matched against (an exchange id, or
    ``trajectory step K``)."""

    request: int
    message: int | None
    part: int | None
    expected: str | None
    got: str | None
    reason: str
    nearest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "message": self.message,
            "part": self.part,
            "expected": self.expected,
            "got": self.got,
            "reason": self.reason,
            "nearest": self.nearest,
        }

    def sentence(self) -> str:
        where = f"request {self.request}"
        if self.message is not None:
            where += f", message {self.message}" + (f" part {self.part}" if self.part is not None else "")
        text = f"{where}: {self.reason}"
        if self.expected is not None or self.got is not None:
            text += f" (expected {self.expected}, got {self.got})"
        if self.nearest:
            text += f"; nearest recorded request: {self.nearest}"
        return text


@dataclass(slots=True)
class Difference:
    """A difference between a replayed request and the recording that is not a divergence:
    ``request`` k, ``part`` (``system``, ``tools``, ``context``, ``compaction``), ``detail`` (one sentence)."""

    request: int
    part: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request, "part": self.part, "detail": self.detail}


@dataclass(slots=True)
class OnlineMatch:
    """The matcher's answer for one request: ``kind``; ``request`` k for MAIN, RETRY and
    DIVERGED (None otherwise); ``conversation`` (None when the body did not parse);
    ``reason`` why it is auxiliary; ``divergence``; ``differences`` found in it that were not
    reported for an earlier request; ``stream`` whether it asks for a stream."""

    kind: MatchKind
    request: int | None = None
    conversation: Conversation | None = None
    reason: str | None = None
    divergence: Divergence | None = None
    differences: list[Difference] = field(default_factory=list)
    stream: bool = False
    #: for the agent's summary request met again: the recorded compaction it belongs to
    compaction: "RecordedCompaction | None" = None


def _short(value: Any, n: int = 120) -> str:
    text = (
        value
        if isinstance(value, str)
        else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode(errors="replace")
    )
    return text if len(text) <= n else text[: n - 3] + "..."


def _groups(messages: list[Message]) -> list[tuple[int, list[Message]]]:
    """Runs of consecutive assistant messages (one reply may be several items, Responses), each
    with the index of its first message."""
    out: list[tuple[int, list[Message]]] = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        if out and out[-1][0] + len(out[-1][1]) == i:
            out[-1][1].append(m)
        else:
            out.append((i, [m]))
    return out


def _user_texts(messages: list[Message]) -> list[str]:
    """The text parts of the user messages before the first assistant message."""
    out = []
    for m in messages:
        if m.role == "assistant":
            break
        if m.role == "user":
            out += [p.text for p in m.parts if isinstance(p, TextPart) and p.text]
    return out


def _collapse(text: str) -> str:
    return " ".join(text.split())


@dataclass(slots=True)
class RecordedCompaction:
    """A compaction of the recording, as playback meets it again: after step ``after_step``
    the agent asked for a summary with a request whose last user text was ``prompt`` (volatile
    parts masked), and request ``after_step + 1`` carried the reply, recognised by its
    ``summary_lines`` (:func:`_summary_lines`), with ``kept`` (what the replies it kept after the
    summary say, :func:`said`) before the later steps' replies. Made by
    :func:`recorded_compactions` from a classification."""

    after_step: int
    prompt: str
    summary_lines: list[str]
    kept: list[tuple[str, list[Any]]]
    exchange: str = ""  #: the recorded summary exchange, whose reply playback serves again
    history_messages: int = 0  #: messages of request ``after_step + 1``, the first that carries the summary
    summary_sha256: str | None = None  #: of the summary reply's text

    def record(self) -> dict[str, Any]:
        """The result's ``prefix.compaction`` for a prefix or replay from the journal run."""
        return {
            "after_step": self.after_step,
            "kind": "summary_request",
            "where": f"exchange {self.exchange}",
            "history_messages": self.history_messages,
            "summary_sha256": self.summary_sha256,
        }


def _last_user_text(messages: list[Message]) -> str:
    last = next((m for m in reversed(messages) if m.role == "user"), None)
    return "".join(p.text for p in last.parts if isinstance(p, TextPart)) if last is not None else ""


def recorded_compactions(
    c: Classification, final_response: Callable[[Exchange], Any]
) -> list[RecordedCompaction]:
    """The compactions of the main chain of ``c`` (slots whose ``compaction`` is set), for
    :class:`OnlineMatcher`; ``final_response`` gives an exchange's final response object."""
    out: list[RecordedCompaction] = []
    if c.main is None:
        return out
    for i, slot in enumerate(c.main.slots):
        summary = slot.compaction
        if summary is None or summary.protocol is None:
            continue
        mod = get_protocol(summary.protocol)
        try:
            action = mod.response_to_action(final_response(summary.exchange))
            prompt = _last_user_text(summary.conversation().messages)
            kept = [said(mod, msgs) for _, msgs in _groups(slot.kept.conversation().messages)]
        except (BadInputError, TypeError, AttributeError):
            continue
        digest = (
            hashlib.sha256(action.text.encode("utf-8", "surrogatepass")).hexdigest() if action.text else None
        )
        out.append(
            RecordedCompaction(
                i, prompt, _summary_lines(action.text), kept, summary.id, len(slot.kept.messages), digest
            )
        )
    return out


class OnlineMatcher:
    """Tells, one incoming request at a time, which main-loop request of a recording it is.

    The recording is what playback serves: ``served`` (A_1..A_N as served, path rewrites
    applied), the ``task`` (None: not checked) and ``recorded`` main-loop conversations (request
    k's, when the source has them; index 0 at least gives the system prompt, tools and context
    of the run). ``descriptor`` gives the agent's volatile context; ``rewrite`` maps recorded
    paths (workspace, home) to the new ones in texts; ``mask`` masks what else is volatile in a
    text once rewritten (paths below the new private home, whose names hold the workspace's);
    ``nearest`` names recorded request k for messages; ``dropped`` the steps whose action the
    agent left out of its history in the recording (``action_dropped_by_agent``: mini-swe-agent
    drops a reply it answers with a format error), so that request k carries the others only.
    Rules (docs/replay.md "What playback answers"):

    - not a POST to a model-API path, a token count, or a body that does not parse: auxiliary;
    - a main-loop candidate has the recording's tool names, or its system prompt modulo
      volatile context, or at least 80 % of its tool names; anything else is auxiliary;
    - the candidate's replies (runs of assistant messages) must be the served actions in order,
      once normalised (text and tool calls; reasoning, signatures and client ids ignored): k is
      their number plus one (plus the dropped steps before k: among the requests with as many
      replies, the one whose recorded request has as many messages, else the next one not yet
      answered). A reply that differs, or more replies than were served, is a
      divergence; so is a task missing from the user text before the first reply, and a tool
      the next served action calls that the request no longer offers;
    - k answered before is a retry;
    - system prompt, tools and context that differ modulo volatile context are listed
      (:class:`Difference`), once each, never fatal;
    - across a compaction of the recording (``compactions``): a request whose last user text
      is the recorded summary request's is that request again, auxiliary (playback answers it
      with the recorded summary); a request carrying the recorded summary is request
      ``after_step + 1`` plus its replies after the ones the agent kept, which must say what
      the recorded ones said; the task is not looked for (the summary replaced it).

    :meth:`serve` registers what was served at k beyond the recording (the synthetic end);
    after :meth:`go_live` (a continuation handed request N+1 to the live model) replies past
    step N are the live model's and are not checked.
    """

    def __init__(
        self,
        protocol: str,
        served: list[Action],
        *,
        task: str | None,
        recorded: list[Conversation],
        descriptor: Any,
        prompt: list[Any] | None = None,
        rewrite: Callable[[str], str] | None = None,
        nearest: Callable[[int], str | None] | None = None,
        mask: Callable[[str], str] | None = None,
        dropped: Iterable[int] = (),
        compactions: Iterable[RecordedCompaction] = (),
    ):
        self.protocol = protocol
        self.compactions = list(compactions)
        self.mod = get_protocol(protocol)
        self.served: dict[int, Action] = {i + 1: a for i, a in enumerate(served)}
        self.task = task
        self.prompt = prompt
        self.recorded = recorded
        self.descriptor = descriptor
        self.rewrite = rewrite or (lambda s: s)
        self.mask = mask or (lambda s: s)
        self.dropped = set(dropped)
        self.nearest = nearest or (lambda k: None)
        self.answered = 0
        #: replies of steps past this one are the live model's (None: every reply is served)
        self.live_after: int | None = None
        self._reported: set[tuple[str, str]] = set()
        first = recorded[0] if recorded else None
        self._tools = {t.name for t in self.mod.offered_tools(first)} if first is not None else set()
        self._system = self._masked(first.system) if first is not None and first.system is not None else None
        # a recording without tool definitions (a native file that stores none) learns them from
        # the first request that offers every tool the served actions call and carries the task
        self._learn = not self._tools
        self._called = {c.name for a in served for c in a.tool_calls if c.kind != "server"}
        self._said = {k: said(self.mod, [action_message(a)]) for k, a in self.served.items()}
        # each request repeats the conversation: a memo reads only the messages not seen before,
        # and what a run of those messages says is kept by their identity
        self._memo = ParseMemo()
        self._said_of: dict[tuple[int, ...], tuple[str, list[Any]]] = {}
        self._prompts: dict[str, list[RecordedCompaction]] = {}
        for c in self.compactions:
            if c.prompt:
                self._prompts.setdefault(self._masked(c.prompt), []).append(c)

    def _said_group(self, msgs: list[Message]) -> tuple[str, list[Any]]:
        if not all(self._memo.holds(m) for m in msgs):
            return said(self.mod, msgs)
        key = tuple(id(m) for m in msgs)
        hit = self._said_of.get(key)
        if hit is None:
            hit = self._said_of[key] = said(self.mod, msgs)
        return hit

    def _masked(self, text: str | None, recorded: bool = True) -> str:
        text = text or ""
        if recorded:
            text = self.rewrite(text)
        return self.descriptor.mask_volatile(self.mask(text))

    def serve(self, k: int, action: Action) -> None:
        """Playback served ``action`` at main-loop request ``k`` (beyond the recording)."""
        self.served[k] = action
        self._said[k] = said(self.mod, [action_message(action)])

    def answered_up_to(self, k: int) -> None:
        self.answered = max(self.answered, k)

    def go_live(self, n: int) -> None:
        """From now on the replies after step ``n`` come from the live model: a request that
        carries them is main-loop request (their number + 1), never a divergence."""
        self.live_after = n

    def match(self, method: str, path: str, query: str, body: bytes) -> OnlineMatch:
        """The :class:`OnlineMatch` of one request (``body`` decoded)."""
        if self.mod.counts_tokens(path):
            return OnlineMatch(MatchKind.AUXILIARY, reason=f"{method} {path} asks for a token count")
        if method.upper() != "POST" or not self.mod.matches(path):
            return OnlineMatch(
                MatchKind.AUXILIARY, reason=f"{method} {path} is not a {self.protocol} model request"
            )
        try:
            conv = self.mod.parse_request(body, path=path, query=query, memo=self._memo)
        except BadInputError as exc:
            return OnlineMatch(
                MatchKind.AUXILIARY, reason=f"the body does not read as a request: {exc.message}"
            )
        stream = conv.stream
        names = {t.name for t in self.mod.offered_tools(conv)}
        if self._prompts:
            # the recorded compactions still ahead: the one after the step answered last first
            ahead = [
                c
                for c in self._prompts.get(self._masked(_last_user_text(conv.messages), recorded=False), ())
                if c.after_step >= self.answered
            ]
            if ahead:
                again = min(ahead, key=lambda c: c.after_step)
                return OnlineMatch(
                    MatchKind.AUXILIARY,
                    conversation=conv,
                    stream=stream,
                    compaction=again,
                    reason=f"the agent's summary request (it compacts its context, as recorded after step {again.after_step})",
                )
        if self._learn:
            if not (self._called <= names and names and self._check_task(conv, 1) is None):
                return OnlineMatch(
                    MatchKind.AUXILIARY,
                    conversation=conv,
                    stream=stream,
                    reason="not the main loop: it does not offer the tools the recorded actions call, or lacks the task",
                )
            self._learn = False
            self._tools = names
            self._system = self._masked(conv.system, recorded=False)
        same_system = self._system is not None and self._masked(conv.system, recorded=False) == self._system
        union = names | self._tools
        close_tools = bool(union) and len(names & self._tools) / len(union) >= 0.8
        if not (names == self._tools or same_system or close_tools):
            why = "other tools" if names != self._tools else "another system prompt"
            return OnlineMatch(
                MatchKind.AUXILIARY,
                conversation=conv,
                stream=stream,
                reason=f"not the main loop: {why} ({len(names)} tools against {len(self._tools)})",
            )
        groups = _groups(conv.messages)
        comp = self._carried(conv) if self.compactions else None
        if comp is not None:
            kept, later = groups[: len(comp.kept)], groups[len(comp.kept) :]
            k = comp.after_step + 1 + len(later)
            out = OnlineMatch(MatchKind.MAIN, request=k, conversation=conv, stream=stream)
            divergence = (
                self._check_kept(kept, comp, k)
                or self._check_replies(later, conv, k, start=comp.after_step + 1)
                or self._check_tools(names, k)
            )
        else:
            k = self._request_number(len(groups), len(conv.messages))
            out = OnlineMatch(MatchKind.MAIN, request=k, conversation=conv, stream=stream)
            divergence = (
                self._check_replies(groups, conv, k)
                or self._check_task(conv, k)
                or self._check_prompt(conv, k)
                or self._check_tools(names, k)
            )
        if divergence is not None:
            out.kind, out.divergence = MatchKind.DIVERGED, divergence
            return out
        out.differences = self._differences(conv, names, same_system, k)
        if comp is None:
            missed = next((c for c in self.compactions if c.after_step + 1 == k), None)
            if missed is not None and ("compaction", str(missed.after_step)) not in self._reported:
                self._reported.add(("compaction", str(missed.after_step)))
                out.differences.append(
                    Difference(
                        k,
                        "compaction",
                        f"the recording compacted its history after step {missed.after_step} and "
                        "the replayed agent did not: give it the environment and arguments it compacted with "
                        "(the prefix holds the whole history instead)",
                    )
                )
        if k <= self.answered:
            out.kind = MatchKind.RETRY
        return out

    def _echoed(self, k: int, start: int = 1) -> list[int]:
        """The steps from ``start`` to before request ``k`` whose actions its history carries."""
        return [i for i in range(start, k) if i not in self.dropped]

    def _carried(self, conv: Conversation) -> RecordedCompaction | None:
        """The recorded compaction whose summary the request carries: at least half its lines,
        as the chain rule finds it; of several, the one with the most of its lines (two
        summaries may share lines), the later on a tie. None when none."""
        text = _texts(conv.messages)
        best: tuple[float, int] | None = None
        found = None
        for i, c in enumerate(self.compactions):
            share = _summary_share(c.summary_lines, text)
            if share >= 0.5 and (best is None or (share, i) > best):
                best, found = (share, i), c
        return found

    def _check_kept(
        self, groups: list[tuple[int, list[Message]]], comp: RecordedCompaction, k: int
    ) -> Divergence | None:
        """The replies the agent kept after the summary say what the recorded ones said."""
        for n, (at, msgs) in enumerate(groups):
            expected = comp.kept[n]
            got = self._said_group(msgs)
            if got != expected:
                return Divergence(
                    k,
                    at,
                    None,
                    _short(expected[0] or "a reply"),
                    _short(got[0] or "a reply"),
                    f"reply {n + 1} kept after the summary of the compaction after step {comp.after_step} was changed",
                    self.nearest(k),
                )
        return None

    def _request_number(self, replies: int, messages: int) -> int:
        """Which request k carries ``replies`` runs of assistant messages (module rules)."""
        if not self.dropped:
            return replies + 1
        top = max(self.served, default=0) + 2
        candidates = [k for k in range(1, top + 1) if len(self._echoed(k)) == replies]
        if not candidates:
            return replies + 1 + len(self.dropped)
        if len(candidates) == 1:
            return candidates[0]
        same = [
            k
            for k in candidates
            if k - 1 < len(self.recorded) and len(self.recorded[k - 1].messages) == messages
        ]
        if len(same) == 1:
            return same[0]
        ahead = [k for k in candidates if k > self.answered]
        return ahead[0] if ahead else candidates[-1]

    def _check_replies(
        self, groups: list[tuple[int, list[Message]]], conv: Conversation, k: int, start: int = 1
    ) -> Divergence | None:
        order = self._echoed(k, start)
        for n, (at, msgs) in enumerate(groups):
            i = order[n] if n < len(order) else max(order, default=start - 1) + n - len(order) + 1
            if self.live_after is not None and i > self.live_after:
                continue  # the live model's reply: nothing to compare it with
            expected = self._said.get(i) if n < len(order) else None
            if expected is None:
                return Divergence(
                    k,
                    at,
                    None,
                    "no reply here",
                    _short(said(self.mod, msgs)[0] or "a reply"),
                    f"the request carries {len(groups)} replies, but only {len(self.served)} were served",
                    self.nearest(i),
                )
            got = self._said_group(msgs)
            if got == expected:
                continue
            if got[0] != expected[0]:
                return Divergence(
                    k,
                    at,
                    0,
                    _short(expected[0]),
                    _short(got[0]),
                    f"the text of served action A_{i} was changed",
                    self.nearest(k),
                )
            for j, (e, g) in enumerate(zip(expected[1], got[1])):
                if e != g:
                    return Divergence(
                        k,
                        at,
                        j,
                        _short(e),
                        _short(g),
                        f"tool call {j + 1} of served action A_{i} was changed",
                        self.nearest(k),
                    )
            return Divergence(
                k,
                at,
                None,
                f"{len(expected[1])} tool call(s)",
                f"{len(got[1])}",
                f"served action A_{i} comes back with another number of tool calls",
                self.nearest(k),
            )
        return None

    def _check_task(self, conv: Conversation, k: int) -> Divergence | None:
        if not self.task:
            return None
        texts = _user_texts(conv.messages)
        # as given, with its white space collapsed, or JSON-escaped (OpenCode quotes the prompt)
        escaped = json.dumps(self.task, ensure_ascii=False)[1:-1]
        if any(self.task in t or escaped in t for t in texts) or _collapse(self.task) in _collapse(
            " ".join(texts)
        ):
            return None
        # the agent's own context comes first: the last text is where its prompt stands
        return Divergence(
            k,
            0,
            None,
            _short(self.task),
            _short(texts[-1]) if texts else "no user text",
            "the task is not in the request",
            self.nearest(k),
        )

    def _check_prompt(self, conv: Conversation, k: int) -> Divergence | None:
        """Request 1 repeats the user's prompt of recorded request 1 (``prompt``: the agent's
        own context left out, :meth:`AgentDescriptor.prompt_parts`): the task given is the
        recorded one, not only a text the request holds. Texts are equal as sent, or with
        their volatile parts masked (mini-swe-agent's system information) and the recorded
        paths rewritten; other parts (images) by their raw form."""
        if k != 1 or self.prompt is None:
            return None
        got = self.descriptor.prompt_parts(conv)

        def same(e: Any, g: Any) -> bool:
            if isinstance(e, TextPart) and isinstance(g, TextPart):
                return e.text == g.text or self._masked(e.text) == self._masked(g.text, recorded=False)
            return type(e) is type(g) and getattr(e, "raw", None) == getattr(g, "raw", None)

        if len(got) == len(self.prompt) and all(same(e, g) for e, g in zip(self.prompt, got)):
            return None

        def shown(parts: list[Any]) -> str:
            texts = [
                p.text if isinstance(p, TextPart) else f"<{getattr(p, 'kind', type(p).__name__)}>"
                for p in parts
            ]
            return _short(" | ".join(texts)) if texts else "no prompt"

        return Divergence(
            k,
            None,
            None,
            shown(self.prompt),
            shown(got),
            "the user's prompt differs from recorded request 1's: the agent was not given the recorded task",
            self.nearest(k),
        )

    def _check_tools(self, names: set[str], k: int) -> Divergence | None:
        action = self.served.get(k)
        if action is None or not names and not self._tools:
            return None
        missing = [c.name for c in action.tool_calls if c.kind != "server" and c.name not in names]
        if missing:
            return Divergence(
                k,
                None,
                None,
                ", ".join(missing),
                "not offered",
                f"served action A_{k} calls tool(s) the agent no longer offers: {', '.join(missing)}",
                self.nearest(k),
            )
        return None

    def _differences(
        self, conv: Conversation, names: set[str], same_system: bool, k: int
    ) -> list[Difference]:
        out: list[Difference] = []

        def note(part: str, key: str, detail: str) -> None:
            if (part, key) not in self._reported:
                self._reported.add((part, key))
                out.append(Difference(k, part, detail))

        if not same_system and self._system is not None:
            note("system", "", "the system prompt differs from the recorded one beyond its volatile context")
        added, removed = sorted(names - self._tools), sorted(self._tools - names)
        if added or removed:
            note("tools", f"{added}{removed}", f"tools added {added}, removed {removed}")
        recorded = self.recorded[min(k, len(self.recorded)) - 1] if self.recorded else None
        if recorded is not None:
            want = [self._masked(t) for t in _user_texts(recorded.messages)]
            got = [self._masked(t, recorded=False) for t in _user_texts(conv.messages)]
            if want != got:
                i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                note(
                    "context",
                    str(i),
                    f"the context before the first reply differs at text part {i} beyond its volatile parts",
                )
        return out
