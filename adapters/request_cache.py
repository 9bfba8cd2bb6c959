"""What B can reuse of A's prompt in the provider's prompt cache (``pvisor diff``, docs/diff.md
"cache"): the blocks of a prompt in reading order (:class:`Block`) and :func:`prompt_cache`, by
the protocol module's ``PROMPT_CACHE`` fact (its rule, cited there). The comparison itself is
:mod:`pvisor.adapters.request_diff`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from pvisor.adapters.protocols.base import TokenUsage

#: bytes per token of the estimate (the scripted model counts a quarter of a body's bytes)
BYTES_PER_TOKEN = 4


def canonical(value: Any) -> bytes:
    """``value``'s canonical JSON bytes (sorted keys): the same JSON is the same bytes."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)


@dataclass(slots=True)
class Block:
    """One block of a prompt in reading order: ``path`` (``tools[2]``, ``system[0]``,
    ``messages[3].parts[1]``), ``message``/``part`` indices (None outside the messages),
    ``field`` (``model``, ``tools``, ``system``, ``role``, ``text``, ``tool_call``,
    ``tool_result``, ``reasoning`` or a part's own kind), ``value`` (the provider JSON, marker
    left out), ``key`` (its canonical bytes: sorted keys), ``marker`` (it carried the protocol's
    cache marker; ``auto``: placed by the request's top-level marker, :func:`with_automatic`);
    ``source``: a message part's canonical part (None outside the messages) and ``loose`` its
    normalised forms once judged (:class:`~pvisor.adapters.request_diff_kinds.Judge`)."""

    path: str
    message: int | None
    part: int | None
    field: str
    value: Any
    key: bytes
    marker: bool = False
    auto: bool = False  #: the marker is the request's own (automatic caching), not the block's
    source: Any = None
    loose: Any = None

    @property
    def size(self) -> int:
        return len(self.key)


def cache_sentence(cache: dict[str, Any]) -> str:
    """``cache: 41,200 of 52,010 prompt bytes reusable (up to messages[6].parts[0]); 2,702
    tokens after them (estimate)``."""
    upto = f" (up to {cache['reused_upto']})" if cache.get("reused_upto") else ""
    mark = " (estimate)" if cache["estimate"] else f" ({cache['basis']})"
    return (
        f"cache: {cache['reusable_bytes']:,} of {cache['prompt_bytes']:,} prompt bytes reusable{upto}; "
        f"{cache['tokens_reused']:,} tokens reused, {cache['tokens_after']:,} after{mark}"
    )


def first_differing_byte(a: bytes, b: bytes) -> int | None:
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


def param_differs(pa: dict, pb: dict, name: str) -> bool:
    """Whether parameter ``name`` differs as the provider reads it (canonical bytes: ``true`` is
    not ``1``), one side lacking it included."""
    return (name in pa) != (name in pb) or (name in pa and canonical(pa[name]) != canonical(pb[name]))


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
        if param_differs(*params, name):
            return f"{name} differs"
    for kind in fact.get("messages_invalidated_by_blocks", ()):
        # a dict's "type" key in compact sorted JSON; a quote inside a string is escaped
        needle = b'"type":' + orjson.dumps(kind)
        na, nb = (sum(blk.key.count(needle) for blk in x[d:] if blk.message is not None) for x in (a, b))
        if na != nb:
            return f"the number of {kind} blocks differs (A {na}, B {nb})"
    return None


def prompt_cache(
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
            common += first_differing_byte(a[d].key, b[d].key) or 0
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


__all__ = (
    "BYTES_PER_TOKEN",
    "Block",
    "cache_sentence",
    "canonical",
    "first_differing_byte",
    "param_differs",
    "prompt_cache",
)
