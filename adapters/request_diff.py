"""Where two request bodies part, and what that costs in the provider's prompt cache
(``pvisor diff``, docs/diff.md).

:func:`diff_requests` compares two request bodies A and B (bytes) of one protocol:

- **bytes**: the first byte where the bodies differ (``first_byte``, 0-based), None when they
  are equal;
- **structure**: each body is read with its protocol module's ``parse_request`` (the module owns
  its request shape) and the two prompts are compared in the order the model reads them: the
  model, the tools, the system prompt, then the messages, part by part (each block as its
  provider JSON, its keys in any order, the protocol's cache marker left out: moving a marker is
  not a change of the prompt). The first block that differs is named as the online matcher names
  a divergence (:class:`~pvisor.adapters.matcher.Divergence`): message index, part index, field,
  expected (A) against got (B), shown by :func:`~pvisor.adapters.matcher.first_difference`, and
  a reason (changed, moved, added, missing). Then the other body parameters (``max_tokens``,
  ``stream``, ...), which are no part of the prompt;
- **verdict** (:class:`DiffVerdict`): ``same`` (equal bytes), ``bytes_only`` (the bodies parse to
  equal JSON: key order, whitespace, escapes; nothing for the cache to lose), ``differs``;
- **cache**: what B can reuse of A's prompt in the provider's prompt cache, by the protocol's
  ``PROMPT_CACHE`` fact (its rule, cited there): ``breakpoints`` (Anthropic: the longest prefix
  that ends at a ``cache_control`` breakpoint of A before the first difference and that a
  breakpoint of B reaches within its lookback, :func:`_breakpoint_reuse`),
  ``increments`` (OpenAI: the common prefix, from 1,024 tokens, in 128-token increments),
  ``prefix`` (Gemini's implicit caching: the common prefix past a minimum; not documented
  further, so always an estimate). Bytes are counted in the prompt's own order (each block as
  compact JSON; ``prompt_bytes`` in all), not as offsets of the body: a body may put its
  ``messages`` before its ``tools``. Tokens are B's recorded usage where its response reports
  cached tokens (``usage_b``, read with the module's ``normalised_usage``: Anthropic
  ``cache_read_input_tokens``, OpenAI ``cached_tokens``, Gemini ``cachedContentTokenCount``),
  else an estimate of a quarter of the bytes (the rule of the scripted model's token counts,
  :func:`pvisor.adapters.protocols.replies.token_count_reply`), marked ``"estimate": true``.

A body that is not JSON, or not a request of its protocol, is compared as bytes only (a
``note`` says why). :func:`diff_runs` aligns two runs (or attempts) step by step by their
main-loop exchanges; :func:`report_section` is a derived run's section of the report page.
"""

from __future__ import annotations

import enum
import gc
import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import orjson

from pvisor.adapters.matcher import first_difference
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import ParseMemo, TokenUsage
from pvisor.core.errors import BadInputError
from pvisor.journal.model import Conversation, Exchange
from pvisor.journal.redact import redact_document, redact_path

#: bytes per token of the estimate (the scripted model counts a quarter of a body's bytes)
BYTES_PER_TOKEN = 4
#: characters of expected/got shown
SHOWN = 120
#: the deepest nesting a body is read to (orjson writes no deeper): a deeper body is compared
#: as bytes only
MAX_DEPTH = 255


class DiffVerdict(str, enum.Enum):
    """How two request bodies compare."""

    SAME = "same"  #: byte for byte
    BYTES_ONLY = "bytes_only"  #: other bytes, equal JSON: the prompt is unchanged
    DIFFERS = "differs"  #: the prompt or a parameter differs


@dataclass(slots=True)
class Block:
    """One block of a prompt in reading order: ``path`` (``tools[2]``, ``system[0]``,
    ``messages[3].parts[1]``), ``message``/``part`` indices (None outside the messages),
    ``field`` (``model``, ``tools``, ``system``, ``role``, ``text``, ``tool_call``,
    ``tool_result``, ``reasoning`` or a part's own kind), ``value`` (the provider JSON, marker
    left out), ``key`` (its canonical bytes: sorted keys), ``marker`` (it carried the protocol's
    cache marker; ``auto``: placed by the request's top-level marker, :func:`with_automatic`)."""

    path: str
    message: int | None
    part: int | None
    field: str
    value: Any
    key: bytes
    marker: bool = False
    auto: bool = False  #: the marker is the request's own (automatic caching), not the block's

    @property
    def size(self) -> int:
        return len(self.key)


@dataclass(slots=True)
class Structure:
    """Where two prompts part, in the manner of the matcher's divergences."""

    path: str
    message: int | None
    part: int | None
    field: str
    expected: str | None
    got: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "message": self.message,
            "part": self.part,
            "field": self.field,
            "expected": self.expected,
            "got": self.got,
            "reason": self.reason,
        }

    def sentence(self) -> str:
        where = self.path
        if self.message is not None:
            where = f"message {self.message}" + (f" part {self.part}" if self.part is not None else "")
        text = f"{where}: {self.reason}"
        if self.expected is not None or self.got is not None:
            text += f" (expected {self.expected}, got {self.got})"
        return text


@dataclass(slots=True)
class RequestDiff:
    """What :func:`diff_requests` found (``to_json`` is the contract's shape, docs/diff.md)."""

    verdict: DiffVerdict
    first_byte: int | None
    a_bytes: int
    b_bytes: int
    structure: Structure | None = None
    cache: dict[str, Any] | None = None
    note: str | None = None
    extends: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "first_byte": self.first_byte,
            "a_bytes": self.a_bytes,
            "b_bytes": self.b_bytes,
            "structure": self.structure.to_json() if self.structure is not None else None,
            "cache": self.cache,
            "note": self.note,
            "extends": self.extends,
        }

    def sentence(self) -> str:
        """One line: the verdict, the byte, the structure, the cache figures."""
        if self.verdict is DiffVerdict.SAME:
            return f"same bytes ({self.a_bytes:,} bytes)"
        text = (
            f"{self.verdict.value}: bodies part at byte {self.first_byte:,} "
            f"(A {self.a_bytes:,} bytes, B {self.b_bytes:,})"
        )
        if self.note:
            text += f"; {self.note}"
        if self.structure is not None:
            text += f"; {self.structure.sentence()}"
        if self.cache is not None:
            text += f"; {cache_sentence(self.cache)}"
        return text


def cache_sentence(cache: dict[str, Any]) -> str:
    """``cache: 41,200 of 52,010 prompt bytes reusable (up to messages[6].parts[0]); 2,702
    tokens after them (estimate)``."""
    upto = f" (up to {cache['reused_upto']})" if cache.get("reused_upto") else ""
    mark = " (estimate)" if cache["estimate"] else f" ({cache['basis']})"
    return (
        f"cache: {cache['reusable_bytes']:,} of {cache['prompt_bytes']:,} prompt bytes reusable{upto}; "
        f"{cache['tokens_reused']:,} tokens reused, {cache['tokens_after']:,} after{mark}"
    )


# --------------------------------------------------------------------------- reading a prompt


def _strip(value: Any, marker: str | None) -> tuple[Any, bool]:
    """``value`` without the cache marker key (a dict's own), and whether it had one."""
    if marker and isinstance(value, dict) and marker in value:
        return {k: v for k, v in value.items() if k != marker}, True
    return value, False


def _key(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)


def _part_value(p: Any) -> Any:
    """A part's provider JSON; for a part written as a bare string (Anthropic ``"content":
    "hi"``) its text, so that a string where a block was is a difference."""
    if p.raw is not None:
        return p.raw
    if hasattr(p, "text"):
        return p.text
    return {k: getattr(p, k) for k in getattr(p, "__slots__", ()) or vars(p) if k != "raw"}


_PART_FIELDS = {
    "TextPart": "text",
    "Reasoning": "reasoning",
    "ToolCall": "tool_call",
    "ToolResult": "tool_result",
}


def prompt_blocks(conv: Conversation, marker: str | None, seen: dict | None = None) -> list[Block]:
    """The prompt of ``conv`` as blocks in reading order: model, tools, system, messages (a
    ``role`` block per message, then its parts). ``seen``: the blocks of messages read before,
    by (``id`` of the message, index), for messages a :class:`ParseMemo` gives again (the caller
    keeps the memo, and so the messages, alive as long as ``seen``)."""
    blocks: list[Block] = []

    def add(path: str, message: int | None, part: int | None, fld: str, value: Any) -> None:
        value, marked = _strip(value, marker)
        blocks.append(Block(path, message, part, fld, value, _key(value), marked))

    if conv.model is not None:
        add("model", None, None, "model", conv.model)
    for i, t in enumerate(conv.tools):
        add(f"tools[{i}]", None, None, "tools", t.raw if t.raw is not None else t.name)
    system = conv.system_raw
    if isinstance(system, list):
        for j, s in enumerate(system):
            add(f"system[{j}]", None, None, "system", s)
    elif system is not None:
        add("system", None, None, "system", system)
    for m, msg in enumerate(conv.messages):
        known = seen.get((id(msg), m)) if seen is not None else None
        if known is not None:
            blocks.extend(known)
            continue
        start = len(blocks)
        add(f"messages[{m}]", m, None, "role", msg.role)
        for p, part in enumerate(msg.parts):
            kind = _PART_FIELDS.get(type(part).__name__) or getattr(part, "kind", "other")
            add(f"messages[{m}].parts[{p}]", m, p, kind, _part_value(part))
        if seen is not None:
            seen[(id(msg), m)] = blocks[start:]
    return blocks


def with_automatic(blocks: list[Block], conv: Conversation, marker: str | None) -> list[Block]:
    """``blocks`` with the breakpoint of the request's top-level ``marker`` (Anthropic's
    automatic caching: a ``cache_control`` at the top of the body; the prompt caching guide,
    https://platform.claude.com/docs/en/build-with-claude/prompt-caching: "the system
    automatically applies the cache breakpoint to the last cacheable block") on its last
    cacheable block: a content block (no model, no role) that is no thinking block and no empty
    text (the guide's "What cannot be cached"). A copy of that block is marked: the blocks of a
    :class:`Reading` are shared with other requests."""
    if not marker or marker not in conv.params:
        return blocks
    for i in range(len(blocks) - 1, -1, -1):
        blk = blocks[i]
        empty = blk.value == "" or (isinstance(blk.value, dict) and blk.value.get("text") == "")
        if blk.field not in ("model", "role", "reasoning") and not empty:
            return [*blocks[:i], replace(blk, marker=True, auto=True), *blocks[i + 1 :]]
    return blocks


def _first_differing_byte(a: bytes, b: bytes) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length when one is a
    prefix of the other), None when equal. Halving compares slices (memcmp), never a Python
    loop over bytes."""
    if a == b:
        return None
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # invariant: a[:lo] == b[:lo]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------- comparing


def _find(blocks: list[Block], key: bytes, start: int) -> int | None:
    return next((i for i in range(start, len(blocks)) if blocks[i].key == key), None)


def _structure(a: list[Block], b: list[Block], d: int) -> Structure:
    """The structure sentence of the first differing block ``d`` (one side may have ended)."""
    if d >= len(a):
        blk = b[d]
        more = len(b) - d
        return Structure(
            blk.path,
            blk.message,
            blk.part,
            blk.field,
            "(end of A)",
            _shown(blk.value),
            f"B extends A: {more} more block(s) after A's {len(a)}",
        )
    if d >= len(b):
        blk = a[d]
        return Structure(
            blk.path,
            blk.message,
            blk.part,
            blk.field,
            _shown(blk.value),
            "(end of B)",
            f"B ends here: A's {len(a) - d} block(s) from {blk.path} on are missing",
        )
    x, y = a[d], b[d]
    moved_to = _find(b, x.key, d + 1)
    moved_from = _find(a, y.key, d + 1)
    if moved_from is not None:
        reason = f"a block was moved: B's {y.path} is A's {a[moved_from].path}"
    elif moved_to is not None:
        reason = f"a block was inserted: A's {x.path} is B's {b[moved_to].path}"
    elif x.field != y.field or x.path != y.path:
        reason = f"A's {x.path} ({x.field}) is B's {y.path} ({y.field})"
    else:
        reason = f"the {y.field.replace('_', ' ')} differs"
    expected, got = _difference(x.value, y.value)
    return Structure(y.path, y.message, y.part, y.field, expected, got, reason)


def _difference(expected: Any, got: Any, where: str = "") -> tuple[str, str]:
    """Expected (A) and got (B) as :func:`~pvisor.adapters.matcher.first_difference` shows
    them, each key-shaped token of either replaced by ``REDACTED`` first
    (:func:`~pvisor.journal.redact.redact_document`, as the report redacts): a body keeps what
    the user pasted, and a view that starts a few characters before the first difference
    would cut a key's prefix off, the shape every redaction finds keys by."""
    return first_difference(redact_document(expected), redact_document(got), where, SHOWN)


def _shown(value: Any) -> str:
    return _difference(value, None)[0]


def _params(conv: Conversation) -> dict[str, Any]:
    return dict(conv.params, stream=conv.stream)


def _param_differs(pa: dict, pb: dict, name: str) -> bool:
    """Whether parameter ``name`` differs as the provider reads it (canonical bytes: ``true`` is
    not ``1``), one side lacking it included."""
    return (name in pa) != (name in pb) or (name in pa and _key(pa[name]) != _key(pb[name]))


def _params_structure(ca: Conversation, cb: Conversation) -> Structure | None:
    pa, pb = _params(ca), _params(cb)
    for name in [*pa, *(k for k in pb if k not in pa)]:
        if _param_differs(pa, pb, name):
            # one key each (or none): the matcher's view names a side that lacks it "(absent)"
            only_a, only_b = ({name: p[name]} if name in p else {} for p in (pa, pb))
            exp, got = _difference(only_a, only_b)
            return Structure(
                f"params.{name}",
                None,
                None,
                "params",
                exp,
                got,
                f"the parameter {name} differs (the prompt is the same)",
            )
    return None


def _usage(mod: Any, usage_b: Any) -> TokenUsage | None:
    if usage_b is None:
        return None
    usage = mod.normalised_usage(usage_b)
    return usage if usage.cached_input_tokens is not None else None


#: blocks of the prompt that are no content block of the provider's (the lookback counts
#: content blocks: tools, system blocks, message parts)
_NOT_CONTENT = ("model", "role")


def _mark_path(blk: Block) -> str:
    return f"{blk.path} (automatic)" if blk.auto else blk.path


def _marks(blocks: list[Block]) -> list[int]:
    return [i for i, blk in enumerate(blocks) if blk.marker]


def _breakpoint_reuse(mod: Any, a: list[Block], b: list[Block], d: int, starts: list[int]) -> tuple[int, str]:
    """The bytes of B's prompt (in reading order) the cache serves by the ``breakpoints`` rule,
    and the basis sentence. Anthropic's prompt caching guide
    (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching, "How automatic prefix
    checking works"): a request reads the cache only at its own ``cache_control`` breakpoints,
    each checking the block boundaries up to about 20 content blocks before it for a prefix an
    earlier request cached at one of its breakpoints ("The automatic prefix checking only looks
    back approximately 20 content blocks from each explicit breakpoint"). So the reusable prefix
    is the longest that (a) ends at a breakpoint of A (an entry A wrote), (b) lies before the
    first differing block ``d``, and (c) is reached by a breakpoint of B at or after it within
    ``PROMPT_CACHE["lookback_blocks"]`` content blocks (tools, system blocks, message parts; the
    model and a message's role are no blocks); else 0."""
    fact = mod.PROMPT_CACHE
    lookback, marker = fact["lookback_blocks"], fact["marker"]
    marks_b = _marks(b)
    if not marks_b:
        return 0, f"{mod.TITLE}: B sets no {marker} breakpoint: it reads no cache"
    marks_a = [j for j in _marks(a) if j < d]
    if not marks_a:
        return 0, f"{mod.TITLE}: A sets no {marker} breakpoint before the first difference"
    pos = [0]  # pos[i + 1]: content blocks in b[: i + 1]
    for blk in b:
        pos.append(pos[-1] + (blk.field not in _NOT_CONTENT))
    for j in reversed(marks_a):
        k = next((k for k in marks_b if k >= j and pos[k + 1] - pos[j + 1] <= lookback), None)
        if k is not None:
            return starts[j + 1], (
                f"{mod.TITLE}: up to A's breakpoint at {_mark_path(a[j])}, read by B's breakpoint at "
                f"{_mark_path(b[k])} (B's breakpoints look back {lookback} blocks)"
            )
    return 0, (
        f"{mod.TITLE}: no breakpoint of B reaches back to A's breakpoints before the first difference "
        f"(the last at {a[marks_a[-1]].path}; B's breakpoints look back {lookback} blocks)"
    )


def _messages_invalidated(fact: Any, a: list[Block], b: list[Block], d: int, params: Any) -> str | None:
    """Why the provider drops the messages' cache though tools and system stay cached, or None:
    a top-level parameter of ``PROMPT_CACHE["messages_invalidated_by"]`` differs (Anthropic
    ``tool_choice``, ``thinking``), or the number of blocks of a type of
    ``messages_invalidated_by_blocks`` (images) differs, anywhere in the messages (the blocks
    before ``d`` are the same on both sides: only the rest is counted). ``params``: both
    sides' parameters (:func:`_params`)."""
    for name in fact.get("messages_invalidated_by", ()):
        if _param_differs(*params, name):
            return f"{name} differs"
    for kind in fact.get("messages_invalidated_by_blocks", ()):
        # a dict's "type" key in compact sorted JSON; a quote inside a string is escaped
        needle = b'"type":' + orjson.dumps(kind)
        na, nb = (sum(blk.key.count(needle) for blk in x[d:] if blk.message is not None) for x in (a, b))
        if na != nb:
            return f"the number of {kind} blocks differs (A {na}, B {nb})"
    return None


def _cache(
    mod: Any,
    a: list[Block],
    b: list[Block],
    d: int,
    usage_b: Any,
    unchanged: bool = False,
    params: tuple[dict, dict] = ({}, {}),
) -> dict[str, Any]:
    """The cache figures of B against A whose first differing block is ``d`` (``len`` of both
    when the prompts are equal: ``unchanged``); ``params``: A's and B's other parameters
    (:func:`_params`). A change that drops the messages' cache (:func:`_messages_invalidated`)
    ends the comparable prefix at the first message."""
    fact = mod.PROMPT_CACHE
    starts = [0]
    for blk in b:
        starts.append(starts[-1] + blk.size)
    total = starts[-1]
    why = _messages_invalidated(fact, a, b, d, params)
    if why is not None:
        unchanged = False
        d = min(d, next((i for i, blk in enumerate(b) if blk.message is not None), len(b)))
    if unchanged and fact["rule"] == "breakpoints" and _marks(a) != _marks(b):
        unchanged = False  # the same prompt, but B reads the cache at other breakpoints
    if unchanged:
        reusable, basis = total, "the prompt is unchanged: the difference costs no cache"
    elif fact["rule"] == "breakpoints":
        reusable, basis = _breakpoint_reuse(mod, a, b, d, starts)
    else:
        common = starts[min(d, len(b))]
        if d < len(a) and d < len(b):  # the common start of the first differing block counts
            common += _first_differing_byte(a[d].key, b[d].key) or 0
        tokens = common // BYTES_PER_TOKEN
        step = fact.get("increment_tokens") or 1
        reusable = tokens // step * step * BYTES_PER_TOKEN
        basis = f"{mod.TITLE}: the common prefix" + (f" in {step}-token increments" if step > 1 else "")
    if why is not None:
        basis += f"; {why}: the messages' cache is invalidated (tools and system stay cached)"
    # a breakpoint rule that found no entry has said why; a prefix found may be under the minimum
    found = reusable or fact["rule"] != "breakpoints"
    if not unchanged and found and reusable // BYTES_PER_TOKEN < fact.get("min_tokens", 0):
        reusable, basis = 0, basis + f", below the {fact['min_tokens']:,}-token minimum"
    upto = (
        next((blk.path for k, blk in enumerate(b) if starts[k + 1] >= reusable), None) if reusable else None
    )
    after = next((blk.path for k, blk in enumerate(b) if starts[k + 1] > reusable), None)
    out = {
        "rule": fact["rule"],
        "prompt_bytes": total,
        "reusable_bytes": reusable,
        "reused_upto": upto,
        "first_uncached": after,
        "tokens_reused": reusable // BYTES_PER_TOKEN,
        "tokens_after": (total - reusable + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN,
        "estimate": True,
        "basis": basis,
    }
    usage = None if unchanged else _usage(mod, usage_b)
    if usage is not None:
        out["tokens_reused"] = usage.cached_input_tokens
        if usage.input_tokens is not None:
            out["tokens_after"] = max(0, usage.input_tokens - usage.cached_input_tokens)
        out["estimate"] = False
        out["basis"] = f"B's recorded usage ({fact['usage_field']})"
    return out


class Reading:
    """What one side of a comparison of many requests keeps between them (:func:`diff_runs`):
    a :class:`ParseMemo` per protocol and the blocks of the messages it gave, so that the
    conversation every request repeats is read once."""

    __slots__ = ("memos", "seen")

    def __init__(self) -> None:
        self.memos: dict[str, ParseMemo] = {}
        self.seen: dict[Any, list[Block]] = {}

    def parse(self, mod: Any, body: Any, path: str) -> Conversation:
        return mod.parse_request(body, path=path, memo=self.memos.setdefault(mod.NAME, ParseMemo()))


def diff_requests(
    a: bytes,
    b: bytes,
    protocol: str | None,
    usage_b: dict | None = None,
    *,
    path_a: str = "",
    path_b: str = "",
    readings: tuple[Reading, Reading] | None = None,
) -> RequestDiff:
    """Compare request bodies ``a`` and ``b`` of ``protocol`` (a name of ``PROTOCOL_MODULES``,
    or None: then as JSON only). ``usage_b``: B's response's usage object in the protocol's
    own shape (the ground truth of the cache figures where it reports cached tokens);
    ``path_a``/``path_b``: the request paths (Gemini names the model in the path);
    ``readings``: what each side keeps across many requests (:class:`Reading`). Never raises
    for a body that is not JSON or not a request: it is compared as bytes, with a ``note``."""
    first = _first_differing_byte(a, b)
    if first is None:
        return RequestDiff(DiffVerdict.SAME, None, len(a), len(b))
    out = RequestDiff(DiffVerdict.DIFFERS, first, len(a), len(b))
    read = read_pair(a, b)
    if isinstance(read, str):
        out.note = read
        return out
    ja, jb, same = read
    if same:
        out.verdict = DiffVerdict.BYTES_ONLY
    if protocol is None:
        if out.verdict is DiffVerdict.DIFFERS:
            out.structure = _json_structure(ja, jb)
        out.note = "no protocol: compared as JSON"
        return out
    mod = get_protocol(protocol)
    ra, rb = readings if readings is not None else (Reading(), Reading())
    try:
        ca, cb = ra.parse(mod, ja, path_a), rb.parse(mod, jb, path_b)  # each body parsed once
    except BadInputError as exc:
        out.note = f"{exc.message}: compared as JSON only"
        if out.verdict is DiffVerdict.DIFFERS:
            out.structure = _json_structure(ja, jb)
        return out
    marker = mod.PROMPT_CACHE.get("marker")
    ba = with_automatic(prompt_blocks(ca, marker, ra.seen), ca, marker)
    bb = with_automatic(prompt_blocks(cb, marker, rb.seen), cb, marker)
    d = next((i for i, (x, y) in enumerate(zip(ba, bb)) if x.key != y.key), min(len(ba), len(bb)))
    if d < max(len(ba), len(bb)):
        # the prompt differs though the bodies may not: Gemini names the model in the path
        out.verdict = DiffVerdict.DIFFERS
        out.structure = _structure(ba, bb, d)
        out.extends = d == len(ba)
        out.cache = _cache(mod, ba, bb, d, usage_b, params=(_params(ca), _params(cb)))
    else:
        if out.verdict is DiffVerdict.DIFFERS:
            out.structure = _params_structure(ca, cb) or _json_structure(ja, jb)
        out.cache = _cache(mod, ba, bb, d, usage_b, unchanged=True, params=(_params(ca), _params(cb)))
    return out


def _json_structure(ja: Any, jb: Any) -> Structure:
    exp, got = _difference(ja, jb)
    return Structure("body", None, None, "body", exp, got, "the JSON differs")


def read_pair(a: bytes, b: bytes) -> tuple[Any, Any, bool] | str:
    """Bodies ``a`` and ``b`` read as JSON: (A's value, B's value, whether they are the same
    JSON), or the note saying why they are compared as bytes only (a body that is not JSON, or
    that nests deeper than :data:`MAX_DEPTH` levels: the blocks' keys are written by orjson,
    which writes no deeper, and the comparisons recurse).
    The same JSON is equal canonical bytes (sorted keys), never Python's ``==``, which takes
    ``true`` for ``1`` and ``1.0`` for ``1``: other prompts as the provider renders them;
    confirmed by the standard library's reading, which keeps an integer past 64 bits exact
    where orjson reads a float (two such integers would compare equal)."""
    values = []
    for which, body in (("A", a), ("B", b)):
        deep = f"body {which} nests deeper than {MAX_DEPTH} levels: compared as bytes only"
        try:
            value = orjson.loads(body)
            values.append((value, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)))
        except orjson.JSONDecodeError as exc:  # orjson reads 1,024 levels
            return deep if "depth limit" in str(exc) else f"body {which} is not JSON: compared as bytes only"
        except orjson.JSONEncodeError:  # orjson writes 255 levels: "Recursion limit reached"
            return deep
    (ja, ka), (jb, kb) = values
    return ja, jb, ka == kb and _exact(a) == _exact(b)


def _exact(body: bytes) -> str:
    """``body``'s canonical JSON text by the standard library: integers exact, floats as
    floats (``1.0`` and ``1.00`` alike), sorted keys."""
    return json.dumps(json.loads(body), sort_keys=True)


# --------------------------------------------------------------------------- runs


#: the flag of playback's synthetic final reply: its request is never a step
_SYNTHETIC_END = "synthetic_end"


@dataclass(slots=True)
class Side:
    """One side of a run comparison: a journal's ``reader``, the ``run`` (its whole id) and
    ``attempt`` (None: every attempt), and its main-loop exchanges as (step n, exchange)."""

    reader: Any
    run: str
    attempt: int | None
    steps: list[tuple[int, Exchange]]

    def to_json(self) -> dict[str, Any]:
        return {
            "journal": self.reader.path,
            "run": self.run,
            "attempt": self.attempt,
            "steps": len(self.steps),
        }


def main_steps(
    reader: Any, run_id: str, attempt: int | None = None, hint: list[str] | None = None
) -> list[tuple[int, Exchange]]:
    """The run's main-loop exchanges as (step n, exchange), step 1 first; with ``attempt`` only
    those that attempt sent (still numbered in the whole run). The roles the chain rule stored
    (``pvisor run`` stores them) are taken when every exchange has one, else the run is
    classified (:func:`~pvisor.adapters.chains.classify_run`). Playback's synthetic final
    request is never a step. ``hint``: the main-loop exchange ids in step order where the caller
    has them (a trajectory read already: ``meta["steps"][i]["exchange"]``). UsageError for an
    unknown run (the reader's)."""
    run = reader.run(run_id)
    exchanges = reader.exchanges(run.id)
    if hint is not None:
        by_id = {e.id: e for e in exchanges}
        main = [by_id[x] for x in hint if x in by_id]
    elif exchanges and all(e.role is not None for e in exchanges):
        main = [e for e in exchanges if e.role == "main"]
    else:
        from pvisor.adapters.chains import classify_run  # here: only a run without stored roles

        main = [r.exchange for r in classify_run(reader, run.id).main_requests]
    while main and _SYNTHETIC_END in main[-1].flags:
        main.pop()
    return [(n, e) for n, e in enumerate(main, 1) if attempt is None or e.attempt == attempt]


def first_request(reader: Any, run_id: str, attempt: int) -> Exchange | None:
    """The first request of ``attempt`` that carries a conversation (a POST of a protocol, not
    a token count), for an attempt with no main-loop step of its own (Gemini CLI's resume starts
    a new chain)."""
    for e in reader.exchanges(run_id):
        if e.attempt == attempt and e.protocol and e.request_body and e.method == "POST":
            if not get_protocol(e.protocol).counts_tokens(e.path):
                return e
    return None


def response_usage(reader: Any, ex: Exchange) -> Any:
    """The usage object of an exchange's reply in its protocol's own shape, or None (no reply,
    a reply that does not read)."""
    if not ex.protocol or not (ex.response_final or ex.response_body):
        return None
    from pvisor.adapters.chains import read_final_response

    try:
        final, _ = read_final_response(reader, ex)
        if not isinstance(final, dict):
            return None
        return get_protocol(ex.protocol).response_to_action(final).usage
    except (BadInputError, ValueError, TypeError, KeyError):
        return None


def diff_exchanges(
    ra: Any,
    a: Exchange,
    rb: Any,
    b: Exchange,
    readings: tuple[Reading, Reading] | None = None,
    detail: bool = True,
) -> RequestDiff:
    """:func:`diff_requests` of two journaled exchanges (A's protocol, else B's), with B's
    recorded usage. Without ``detail`` only the verdict and the bytes (no structure, no cache:
    one C-level JSON comparison, no protocol reading). IntegrityError when a stored body is
    damaged (the reader's)."""
    body_a = ra.request_body(a) or b""
    body_b = rb.request_body(b) or b""
    if not detail:
        return bytes_diff(body_a, body_b)
    protocol = a.protocol if a.protocol == b.protocol else None
    usage = response_usage(rb, b) if body_a != body_b else None
    out = diff_requests(body_a, body_b, protocol, usage, path_a=a.path, path_b=b.path, readings=readings)
    if out.verdict is DiffVerdict.DIFFERS:
        out.note = _body_note("A", a, body_a) or _body_note("B", b, body_b) or out.note
    return out


def _body_note(which: str, ex: Exchange, body: bytes) -> str | None:
    """Why ``ex``'s stored body is no request to read, where the journal says: none sent (a
    GET), or one that did not decode from its ``Content-Encoding`` (stored as received)."""
    if not body:
        return f"{which} ({ex.method} {redact_path(ex.path)}) has no request body"
    if ex.outcome == "decode_error":
        return (
            f"{which}'s body did not decode from its Content-Encoding ({ex.request_encoding}): "
            "its stored bytes are compared"
        )
    return None


def bytes_diff(a: bytes, b: bytes) -> RequestDiff:
    """The verdict and first byte of two bodies only (``note`` says so)."""
    first = _first_differing_byte(a, b)
    out = RequestDiff(DiffVerdict.SAME if first is None else DiffVerdict.DIFFERS, first, len(a), len(b))
    if first is not None:
        read = read_pair(a, b)
        if not isinstance(read, str) and read[2]:
            out.verdict = DiffVerdict.BYTES_ONLY
        out.note = "not detailed: verdict and bytes only"
    return out


@dataclass(slots=True)
class StepDiff:
    """Step ``step`` of B against A's ``a_step``: exchange ids ``a`` and ``b`` and the diff."""

    step: int
    a_step: int
    a: str
    b: str
    diff: RequestDiff

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "a_step": self.a_step, "a": self.a, "b": self.b, **self.diff.to_json()}


@dataclass(slots=True)
class RunDiff:
    """:func:`diff_runs`'s answer: ``mode`` ``steps`` (aligned step by step) or ``extends``
    (B's first request against the request of A it extends); ``steps`` the pairs compared;
    ``only_a``/``only_b`` the step numbers one side has past the other's."""

    a: Side
    b: Side
    mode: str
    steps: list[StepDiff] = field(default_factory=list)
    only_a: list[int] = field(default_factory=list)
    only_b: list[int] = field(default_factory=list)

    @property
    def first_parting(self) -> StepDiff | None:
        return next((s for s in self.steps if s.diff.verdict is DiffVerdict.DIFFERS), None)

    def summary(self) -> dict[str, Any]:
        counts = {v.value: 0 for v in DiffVerdict}
        for s in self.steps:
            counts[s.diff.verdict.value] += 1
        first = self.first_parting
        return {
            "aligned": len(self.steps),
            **counts,
            "only_a": len(self.only_a),
            "only_b": len(self.only_b),
            "first_parting_step": first.step if first is not None else None,
        }

    @property
    def differs(self) -> bool:
        # an attempt B with no request to set against A's last one: one side has requests
        lopsided = not self.steps and bool(self.a.steps) != bool(self.b.steps)
        return self.first_parting is not None or bool(self.only_a or self.only_b) or lopsided

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "mode": self.mode,
            "steps": [s.to_json() for s in self.steps],
            "only_a": self.only_a,
            "only_b": self.only_b,
            "summary": self.summary(),
        }

    def lines(self) -> list[str]:
        """The text form, one line per finding: a line per step compared, the steps one side
        lacks, then the first step that parts (or the run that has no main-loop request)."""
        out = [f"step {s.step}{_against(s)}: {s.diff.sentence()}" for s in self.steps]
        for side, steps in (("A", self.only_a), ("B", self.only_b)):
            if steps:
                out.append(f"steps {_span(steps)} only in {side}")
        first = self.first_parting
        empty = [side for side, s in (("A", self.a), ("B", self.b)) if not s.steps]
        if len(empty) == 2:
            out.append("neither run has a main-loop request")
        elif empty and not self.steps:
            out.append(f"run {empty[0]} has no main-loop request")
        elif first is not None:
            out.append(f"first parting step: {first.step} (A {first.a}, B {first.b})")
        elif self.only_a or self.only_b:
            out.append("the aligned steps' requests do not part; one run has more steps")
        else:
            out.append(f"the {len(self.steps)} aligned step(s) send the same prompts")
        return out


def _against(s: StepDiff) -> str:
    return "" if s.a_step == s.step else f" against A's step {s.a_step}"


def _span(steps: list[int]) -> str:
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"


def diff_runs(
    reader_a: Any,
    run_a: str,
    reader_b: Any,
    run_b: str,
    *,
    attempt_a: int | None = None,
    attempt_b: int | None = None,
    detail: int | None = None,
    hints: dict[str, list[str]] | None = None,
) -> RunDiff:
    """Compare two runs (or attempts of runs) by their main-loop requests.

    Two attempts of one run in one journal where B's first step follows A's last (a native
    resume: ``RUN@1`` against ``RUN@2``), or an attempt B with no main-loop step of its own
    (its first request started a new chain), compare B's first request with A's last
    main-loop request, the one it extends (mode ``extends``). Otherwise the steps are aligned
    in order, A's i-th main-loop request against B's i-th (mode ``steps``; whole runs: step n
    against step n). ``detail``: how many differing steps are read in full (structure, cache;
    None: all); the others get their verdict and first byte only. ``hints``: main-loop exchange
    ids by run id (:func:`main_steps`). UsageError for an unknown run; IntegrityError for a
    damaged body."""
    hints = hints or {}
    a = Side(reader_a, reader_a.run(run_a).id, attempt_a, [])
    b = Side(reader_b, reader_b.run(run_b).id, attempt_b, [])
    a.steps = main_steps(reader_a, a.run, attempt_a, hints.get(a.run))
    b.steps = main_steps(reader_b, b.run, attempt_b, hints.get(b.run))
    same_run = a.run == b.run and reader_a.path == reader_b.path
    follows = bool(a.steps and b.steps and b.steps[0][0] == a.steps[-1][0] + 1)
    if attempt_b is not None and a.steps and ((same_run and follows) or not b.steps):
        n, ex_b = b.steps[0] if b.steps else (None, first_request(reader_b, b.run, attempt_b))
        out = RunDiff(a, b, "extends")
        if ex_b is not None:
            a_n, ex_a = a.steps[-1]
            out.steps.append(
                StepDiff(n or 0, a_n, ex_a.id, ex_b.id, diff_exchanges(reader_a, ex_a, reader_b, ex_b))
            )
        return out
    out = RunDiff(a, b, "steps")
    readings = (Reading(), Reading())
    # reading a long run allocates millions of parsed JSON values and no reference cycle: the
    # cyclic collector would only rescan them (as pvisor.adapters.chains.classify_run does)
    collecting = gc.isenabled()
    gc.disable()
    try:
        detailed = 0
        for (na, ea), (nb, eb) in zip(a.steps, b.steps):
            full = detail is None or detailed < detail
            found = diff_exchanges(reader_a, ea, reader_b, eb, readings if full else None, full)
            detailed += full and found.verdict is not DiffVerdict.SAME
            out.steps.append(StepDiff(nb, na, ea.id, eb.id, found))
    finally:
        if collecting:
            gc.enable()
    k = len(out.steps)
    out.only_a = [n for n, _ in a.steps[k:]]
    out.only_b = [n for n, _ in b.steps[k:]]
    return out


#: differing steps the report's section reads in full (structure and cache); the later ones
#: give their verdict and first byte (``pvisor diff PARENT RUN`` reads every step in full)
REPORT_DETAIL_STEPS = 50


def report_section(
    reader: Any, run_id: str, *, hints: dict[str, list[str]] | None = None
) -> dict[str, Any] | None:
    """The report page's ``diff`` section of a derived run: its steps' requests against its
    parent's, step by step (no bodies: ``{"against": parent run, "steps": [{"step", "a", "b",
    **RequestDiff.to_json()}], "only_a", "only_b", "summary": RunDiff.summary()}``), the first
    :data:`REPORT_DETAIL_STEPS` differing steps in full; None for a run that derives from
    nothing or from a run that is not in this journal (a native file). ``hints``: the main-loop
    exchange ids of the run and its parent, by run id, when the caller read their trajectories
    (``[d["exchange"] for d in traj.meta["steps"]]``): the runs are then not classified again."""
    run = reader.run(run_id)
    if not run.parent_run or not reader.run_exists(run.parent_run):
        return None
    found = diff_runs(reader, run.parent_run, reader, run.id, detail=REPORT_DETAIL_STEPS, hints=hints)
    return {
        "against": run.parent_run,
        "steps": [{"step": s.step, "a": s.a, "b": s.b, **s.diff.to_json()} for s in found.steps],
        "only_a": found.only_a,
        "only_b": found.only_b,
        "summary": found.summary(),
    }


__all__: Iterable[str] = (
    "BYTES_PER_TOKEN",
    "Block",
    "DiffVerdict",
    "Reading",
    "RequestDiff",
    "RunDiff",
    "Side",
    "StepDiff",
    "Structure",
    "cache_sentence",
    "diff_exchanges",
    "diff_requests",
    "diff_runs",
    "main_steps",
    "prompt_blocks",
    "with_automatic",
    "REPORT_DETAIL_STEPS",
    "bytes_diff",
    "report_section",
)
