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
  breakpoint of B reaches within its lookback, :mod:`.request_cache`),
  ``increments`` (OpenAI: the common prefix, from 1,024 tokens, in 128-token increments),
  ``prefix`` (Gemini's implicit caching: the common prefix past a minimum; not documented
  further, so always an estimate). Bytes are counted in the prompt's own order (each block as
  compact JSON; ``prompt_bytes`` in all), not as offsets of the body: a body may put its
  ``messages`` before its ``tools``. Tokens are B's recorded usage where its response reports
  cached tokens (``usage_b``, read with the module's ``normalised_usage``: Anthropic
  ``cache_read_input_tokens``, OpenAI ``cached_tokens``, Gemini ``cachedContentTokenCount``),
  else an estimate of a quarter of the bytes (the rule of the scripted model's token counts,
  :func:`pvisor.adapters.protocols.replies.token_count_reply`), marked ``"estimate": true``.

Each difference has a kind (:mod:`.request_diff_kinds`): the runs' own directories, ids the agent
or its protocol makes in every run, the agent's decorations of tool output (incidental: the
prompts say the same, though the cache pays for them), or real; a pair's real differences come
first, and a run's first real parting step is the first with one.

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
from pvisor.adapters.protocols.base import ParseMemo
from pvisor.adapters.request_cache import (
    BYTES_PER_TOKEN,
    Block,
    cache_sentence,
    canonical,
    first_differing_byte,
    param_differs,
    prompt_cache,
)
from pvisor.adapters.request_diff_kinds import KIND_REASONS, DifferenceKind, Judge, agent_of, collapsed
from pvisor.adapters.request_diff_paths import RunPaths, run_directories
from pvisor.adapters.request_diff_runs import Side, first_request, main_steps, response_usage, synthetic_end
from pvisor.core.errors import BadInputError
from pvisor.journal.model import Conversation, Exchange
from pvisor.journal.redact import redact_document, redact_path

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
class Structure:
    """Where two prompts part, in the manner of the matcher's divergences."""

    path: str
    message: int | None
    part: int | None
    field: str
    expected: str | None
    got: str | None
    reason: str
    #: what the difference is made of (:mod:`.request_diff_kinds`): incidental unless ``real``
    kind: DifferenceKind = DifferenceKind.REAL

    @property
    def run_paths(self) -> bool:
        """The blocks differ only in each run's own directories (:mod:`.request_diff_paths`)."""
        return self.kind is DifferenceKind.RUN_PATHS

    @property
    def incidental(self) -> bool:
        return self.kind.incidental

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "message": self.message,
            "part": self.part,
            "field": self.field,
            "expected": self.expected,
            "got": self.got,
            "reason": self.reason,
            "run_paths": self.run_paths,
            "kind": self.kind.value,
            "incidental": self.incidental,
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
    #: the first real difference of each part of the prompt (model, tools, system, messages),
    #: and the incidental ones before it, then the parameters that differ; the real ones first
    #: (each group in reading order), ``structure`` first; at most :data:`MAX_DIFFERENCES`
    differences: list[Structure] = field(default_factory=list)
    #: the differences found past :data:`MAX_DIFFERENCES` (not in ``differences``)
    more_differences: int = 0
    #: every block of the prompt that differs differs only in each run's own directories, and
    #: no parameter the cache keys the messages on differs (the prompts say the same; another
    #: parameter, no part of the prompt, may: Anthropic's ``metadata`` names each run's session)
    only_run_paths: bool = False
    #: it differs, and every difference (blocks, parameters, ids outside them) is incidental
    only_incidental: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "first_byte": self.first_byte,
            "a_bytes": self.a_bytes,
            "b_bytes": self.b_bytes,
            "structure": self.structure.to_json() if self.structure is not None else None,
            "differences": [d.to_json() for d in self.differences],
            "more_differences": self.more_differences,
            "only_run_paths": self.only_run_paths,
            "only_incidental": self.only_incidental,
            "cache": self.cache,
            "note": self.note,
            "extends": self.extends,
        }

    def sentence(self) -> str:
        """One line: the verdict, the real differences (the first leads), the incidental ones
        in one clause (:func:`~.request_diff_kinds.collapsed`), the byte, the cache figures."""
        if self.verdict is DiffVerdict.SAME:
            return f"same bytes ({self.a_bytes:,} bytes)"
        found = self.found()
        text = f"{self.verdict.value}{self.how}: " + "; ".join(
            [
                *found,
                f"bodies part at byte {self.first_byte:,} (A {self.a_bytes:,} bytes, B {self.b_bytes:,})",
            ]
        )
        if self.note:
            text += f"; {self.note}"
        if self.cache is not None:
            text += f"; {cache_sentence(self.cache)}"
        return text

    @property
    def how(self) -> str:
        """How the verdict is qualified: `` only in the runs' own directories`` when every
        difference is of them, `` only incidentally`` when every one is incidental, else ``""``
        (``only_run_paths`` alone does not say it: a parameter no part of the prompt may
        differ besides)."""
        if not self.only_incidental:
            return ""
        return ONLY_RUN_PATHS if all(d.run_paths for d in self.differences) else ONLY_INCIDENTAL

    def found(self) -> list[str]:
        """The differences as clauses: each real one (``then`` before the second on), the
        incidental ones collapsed (``also: ...``, or alone when there is no real one), and
        ``N more`` when :data:`MAX_DIFFERENCES` left some out."""
        real = [d for d in self.differences if not d.incidental]
        out = [("then " if i else "") + d.sentence() for i, d in enumerate(real)]
        incidental = [d for d in self.differences if d.incidental]
        if incidental:
            out.append(("also: " if real else "") + collapsed(incidental))
        if self.more_differences:
            out.append(f"{self.more_differences:,} more")
        return out


#: how a step says that its requests differ only in each run's own directories
ONLY_RUN_PATHS = " only in the runs' own directories"
#: how a step says that every difference of its requests is incidental
ONLY_INCIDENTAL = " only incidentally"
#: differences named per pair of requests at most (``differences``)
MAX_DIFFERENCES = 6


def plural(n: int, word: str) -> str:
    """``1 block``, ``2 blocks``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


# --------------------------------------------------------------------------- reading a prompt


def _strip(value: Any, marker: str | None) -> tuple[Any, bool]:
    """``value`` without the cache marker key (a dict's own), and whether it had one."""
    if marker and isinstance(value, dict) and marker in value:
        return {k: v for k, v in value.items() if k != marker}, True
    return value, False


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

    def add(
        path: str, message: int | None, part: int | None, fld: str, value: Any, source: Any = None
    ) -> None:
        value, marked = _strip(value, marker)
        blocks.append(Block(path, message, part, fld, value, canonical(value), marked, source=source))

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
            add(f"messages[{m}].parts[{p}]", m, p, kind, _part_value(part), part)
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


# --------------------------------------------------------------------------- comparing


def _find(blocks: list[Block], key: bytes, start: int) -> int | None:
    return next((i for i in range(start, len(blocks)) if blocks[i].key == key), None)


def _structure(
    a: list[Block], b: list[Block], d: int, scope: str = "", judge: Judge | None = None
) -> Structure:
    """The structure sentence of the first differing block ``d`` (one side may have ended);
    ``scope``: the part of the prompt ``a`` and ``b`` are (``messages``), or the whole;
    ``judge``: tells the kind of a block that changed in place (one added, missing or moved is
    ``real``)."""
    of = f" of the {scope}" if scope else ""
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
            f"B extends A: {plural(more, 'more block')}{of} after A's {plural(len(a), 'block')}",
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
            f"B ends here: A's {plural(len(a) - d, 'block')}{of} from {blk.path} on are missing",
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
        kind = judge.block(x, y) if judge is not None else DifferenceKind.REAL
        what = f"the {y.field.replace('_', ' ')}"
        expected, got = _difference(x.value, y.value)
        reason = f"{what} {KIND_REASONS[kind]}" if kind.incidental else f"{what} differs"
        return Structure(y.path, y.message, y.part, y.field, expected, got, reason, kind)
    expected, got = _difference(x.value, y.value)
    return Structure(y.path, y.message, y.part, y.field, expected, got, reason)


def _section(blk: Block) -> str:
    """The part of the prompt a block is in: ``model``, ``tools``, ``system``, ``messages``."""
    return "messages" if blk.message is not None else blk.field


def _only_paths(x: Block, y: Block, paths: tuple[RunPaths, RunPaths] | None) -> bool:
    """Whether blocks ``x`` (A's) and ``y`` (B's) are equal once each run's own directories
    are placeholders (:meth:`RunPaths.replace`)."""
    return bool(paths) and paths[0].replace(x.key) == paths[1].replace(y.key)


def _differences(a: list[Block], b: list[Block], d: int, judge: Judge) -> list[Structure]:
    """The first real difference of each part of the prompt from block ``d`` on (model, tools,
    system, messages: each part is compared on its own, so that a system prompt that differs
    does not hide the message that does), and in a part the incidental differences
    (:class:`~.request_diff_kinds.Judge`) up to it; at most :data:`MAX_DIFFERENCES` in a part
    (the caller keeps as many in all). Blocks come in those parts' order, each contiguous."""
    out: list[Structure] = []
    parts: dict[str, tuple[list[Block], list[Block]]] = {}
    for side, blocks in ((0, a), (1, b)):
        for blk in blocks[d:]:
            parts.setdefault(_section(blk), ([], []))[side].append(blk)
    for scope, (sa, sb) in parts.items():
        i, common, found = 0, min(len(sa), len(sb)), 0
        while found < MAX_DIFFERENCES:
            i = next((k for k in range(i, common) if sa[k].key != sb[k].key), common)
            if i >= max(len(sa), len(sb)):
                break
            out.append(_structure(sa, sb, i, scope, judge))
            found += 1
            if not out[-1].incidental:
                break
            i += 1
    return out


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


def _params_structures(ca: Conversation, cb: Conversation, judge: Judge) -> list[Structure]:
    """Each parameter that differs, in body order, with its kind (a parameter the agents make
    anew in every run is named by those keys: ``params.metadata.user_id``)."""
    pa, pb = _params(ca), _params(cb)
    out = []
    for name in _differing(ca, cb):
        kind, shown = judge.param(name, pa, pb)
        # one key each (or none): the matcher's view names a side that lacks it "(absent)"
        only_a, only_b = ({name: p[name]} if name in p else {} for p in (pa, pb))
        exp, got = _difference(only_a, only_b)
        why = KIND_REASONS[kind] if kind.incidental else "differs (the prompt is the same)"
        reason = f"the parameter {shown} {why}"
        out.append(Structure(f"params.{shown}", None, None, "params", exp, got, reason, kind))
    return out


def _differing(ca: Conversation, cb: Conversation) -> list[str]:
    """The names of the parameters that differ, in A's body order, then B's own."""
    pa, pb = _params(ca), _params(cb)
    return [name for name in [*pa, *(k for k in pb if k not in pa)] if param_differs(pa, pb, name)]


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
    paths: tuple[RunPaths, RunPaths] | None = None,
    why_json: str = "no protocol",
    agents: tuple[Any, Any] | None = None,
) -> RequestDiff:
    """Compare request bodies ``a`` and ``b`` of ``protocol`` (a name of ``PROTOCOL_MODULES``,
    or None: then as JSON only). ``usage_b``: B's response's usage object in the protocol's
    own shape (the ground truth of the cache figures where it reports cached tokens);
    ``path_a``/``path_b``: the request paths (Gemini names the model in the path);
    ``readings``: what each side keeps across many requests (:class:`Reading`); ``paths``: each
    side's run's own directories (:func:`~.request_diff_paths.run_directories`): a difference
    made only of them is named so (``run_paths``, ``only_run_paths``); ``agents``: each side's
    agent descriptor (or None), whose ids and output decorations are incidental too
    (:mod:`.request_diff_kinds`: ``kind``, ``only_incidental``); ``why_json``: the
    note's reason when ``protocol`` is None. Never raises
    for a body that is not JSON or not a request: it is compared as bytes, with a ``note``."""
    first = first_differing_byte(a, b)
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
    mod = get_protocol(protocol) if protocol is not None else None
    judge = Judge(mod, paths, agents)
    if mod is None:
        if out.verdict is DiffVerdict.DIFFERS:
            _found(out, [_json_structure(ja, jb, judge)])
        out.note = f"{why_json}: compared as JSON"
        return out
    ra, rb = readings if readings is not None else (Reading(), Reading())
    try:
        ca, cb = ra.parse(mod, ja, path_a), rb.parse(mod, jb, path_b)  # each body parsed once
    except BadInputError as exc:
        out.note = f"{exc.message}: compared as JSON only"
        if out.verdict is DiffVerdict.DIFFERS:
            _found(out, [_json_structure(ja, jb, judge)])
        return out
    marker = mod.PROMPT_CACHE.get("marker")
    ba = with_automatic(prompt_blocks(ca, marker, ra.seen), ca, marker)
    bb = with_automatic(prompt_blocks(cb, marker, rb.seen), cb, marker)
    d = next((i for i, (x, y) in enumerate(zip(ba, bb)) if x.key != y.key), min(len(ba), len(bb)))
    if d < max(len(ba), len(bb)):
        # the prompt differs though the bodies may not: Gemini names the model in the path
        out.verdict = DiffVerdict.DIFFERS
        whole = _structure(ba, bb, d, judge=judge)  # worded for the whole prompt
        found = [whole if x.path == whole.path else x for x in _differences(ba, bb, d, judge)]
        params = _params_structures(ca, cb, judge)  # no part of the prompt: named after it
        _found(out, found + params)
        keyed = mod.PROMPT_CACHE.get("messages_invalidated_by", ())
        out.only_run_paths = (
            len(ba) == len(bb)
            and all(x.key == y.key or _only_paths(x, y, paths) for x, y in zip(ba[d:], bb[d:]))
            and not any(param_differs(_params(ca), _params(cb), name) for name in keyed)
        )
        out.only_incidental = (
            len(ba) == len(bb)
            and all(x.key == y.key or judge.block(x, y).incidental for x, y in zip(ba[d:], bb[d:]))
            and all(p.incidental for p in params)
        )
        out.extends = d == len(ba)
        out.cache = prompt_cache(mod, ba, bb, d, usage_b, params=(_params(ca), _params(cb)))
    else:
        if out.verdict is DiffVerdict.DIFFERS:
            params = _params_structures(ca, cb, judge)
            # what differs besides them: what the protocol's reading keeps nowhere (Codex's
            # message item ids); a body's top-level keys are its parameters' names
            names = set(_differing(ca, cb))
            rest = [
                {k: v for k, v in j.items() if k not in names} if isinstance(j, dict) else j for j in (ja, jb)
            ]
            if canonical(rest[0]) != canonical(rest[1]):
                params.append(_json_structure(*rest, judge))
            _found(out, params)
        out.cache = prompt_cache(mod, ba, bb, d, usage_b, unchanged=True, params=(_params(ca), _params(cb)))
    return out


def _found(out: RequestDiff, found: list[Structure]) -> None:
    """``out``'s differences from ``found`` (in reading order): the real ones first, at most
    :data:`MAX_DIFFERENCES`; ``structure`` the first of them (the first real one, if any)."""
    ordered = [x for x in found if not x.incidental] + [x for x in found if x.incidental]
    out.differences, out.more_differences = ordered[:MAX_DIFFERENCES], max(0, len(ordered) - MAX_DIFFERENCES)
    out.structure = ordered[0] if ordered else None
    out.only_incidental = bool(found) and all(x.incidental for x in found)


def _json_structure(ja: Any, jb: Any, judge: Judge) -> Structure:
    exp, got = _difference(ja, jb)
    kind = judge.body(ja, jb)
    reason = f"the JSON {KIND_REASONS[kind]}" if kind.incidental else "the JSON differs"
    return Structure("body", None, None, "body", exp, got, reason, kind)


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


def diff_exchanges(
    ra: Any,
    a: Exchange,
    rb: Any,
    b: Exchange,
    readings: tuple[Reading, Reading] | None = None,
    detail: bool = True,
    paths: tuple[RunPaths, RunPaths] | None = None,
    agents: tuple[Any, Any] | None = None,
) -> RequestDiff:
    """:func:`diff_requests` of two journaled exchanges of one protocol (of two protocols, or
    none: as JSON), with B's recorded usage, each run's own directories (``paths``) and each
    run's agent descriptor (``agents``), both read from the journal when not given. Without
    ``detail`` only the verdict and the bytes (no structure, no cache: one C-level JSON
    comparison, no protocol reading). IntegrityError when a stored body is damaged (the
    reader's)."""
    body_a = ra.request_body(a) or b""
    body_b = rb.request_body(b) or b""
    if not detail:
        return bytes_diff(body_a, body_b)
    protocol = a.protocol if a.protocol == b.protocol else None
    why = "no protocol"
    if a.protocol != b.protocol:
        why = f"different protocols ({a.protocol or 'none'} against {b.protocol or 'none'})"
    usage = response_usage(rb, b) if body_a != body_b else None
    if paths is None and body_a != body_b:
        paths = (run_directories(ra, a.run), run_directories(rb, b.run))
    if agents is None and body_a != body_b:
        agents = (agent_of(ra, a.run), agent_of(rb, b.run))
    out = diff_requests(
        body_a,
        body_b,
        protocol,
        usage,
        path_a=a.path,
        path_b=b.path,
        readings=readings,
        paths=paths,
        why_json=why,
        agents=agents,
    )
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
    first = first_differing_byte(a, b)
    out = RequestDiff(DiffVerdict.SAME if first is None else DiffVerdict.DIFFERS, first, len(a), len(b))
    if first is not None:
        read = read_pair(a, b)
        if not isinstance(read, str) and read[2]:
            out.verdict = DiffVerdict.BYTES_ONLY
        out.note = "not detailed: verdict and bytes only"
    return out


@dataclass(slots=True)
class StepDiff:
    """Step ``step`` of B against A's ``a_step``: exchange ids ``a`` and ``b`` and the diff.
    ``step`` None: B's first request started a new chain (it is no step of B's main loop);
    ``after_boundary``: one side's request is the one after a replay's boundary (answered by
    playback's synthetic final reply, :func:`synthetic_end`)."""

    step: int | None
    a_step: int
    a: str
    b: str
    diff: RequestDiff
    after_boundary: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "a_step": self.a_step,
            "a": self.a,
            "b": self.b,
            "after_boundary": self.after_boundary,
            **self.diff.to_json(),
        }

    @property
    def label(self) -> str:
        """``step 4``, ``step 2 (the request after the boundary)``, ``B's request 1 (a new
        chain)``."""
        if self.step is None:
            return "B's request 1 (a new chain)"
        return f"step {self.step}" + (" (the request after the boundary)" if self.after_boundary else "")


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

    @property
    def first_real_parting(self) -> StepDiff | None:
        """The first step with a real difference (not only incidental ones: the runs' own
        directories, the agent's ids, its output decorations; :mod:`.request_diff_kinds`)."""
        return next(
            (s for s in self.steps if s.diff.verdict is DiffVerdict.DIFFERS and not s.diff.only_incidental),
            None,
        )

    def summary(self) -> dict[str, Any]:
        counts = {v.value: 0 for v in DiffVerdict}
        for s in self.steps:
            counts[s.diff.verdict.value] += 1
        first = self.first_parting
        real = self.first_real_parting
        return {
            "aligned": len(self.steps),
            **counts,
            "only_run_paths": sum(s.diff.only_run_paths for s in self.steps),
            "only_incidental": sum(s.diff.only_incidental for s in self.steps),
            "only_a": len(self.only_a),
            "only_b": len(self.only_b),
            "first_parting_step": first.step if first is not None else None,
            "first_real_parting_step": real.step if real is not None else None,
        }

    @property
    def differs(self) -> bool:
        # an attempt B with no request to set against A's last one: one side has requests
        lopsided = not self.steps and bool(self.a.steps) != bool(self.b.steps)
        return self.first_parting is not None or bool(self.only_a or self.only_b) or lopsided

    def _parting_line(self, first: StepDiff) -> str:
        """``first real parting step: 2 (A x-…, B x-…)``, then the first step that parts only
        incidentally before it, if any; or that every step that parts does so incidentally."""
        real = self.first_real_parting
        if real is first:
            return f"first parting step: {first.label.removeprefix('step ')} (A {first.a}, B {first.b})"
        how = first.diff.how
        before = f"the first parting step, {first.label.removeprefix('step ')} (A {first.a}, B {first.b})"
        if real is None:
            return f"no real parting: every step that parts differs{ONLY_INCIDENTAL}; {before}, differs{how}"
        return (
            f"first real parting step: {real.label.removeprefix('step ')} (A {real.a}, B {real.b}); "
            f"{before}, differs{how}"
        )

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
        out = [f"{s.label}{_against(s)}: {s.diff.sentence()}" for s in self.steps]
        for side, steps in (("A", self.only_a), ("B", self.only_b)):
            if steps:
                out.append(f"step{'s' if len(steps) > 1 else ''} {_span(steps)} only in {side}")
        first = self.first_parting
        empty = [side for side, s in (("A", self.a), ("B", self.b)) if not s.steps]
        if len(empty) == 2:
            out.append("neither run has a main-loop request")
        elif empty and not self.steps:
            out.append(f"run {empty[0]} has no main-loop request")
        elif first is not None:
            out.append(self._parting_line(first))
        elif self.only_a or self.only_b:
            out.append("the aligned steps' requests do not part; one run has more steps")
        else:
            n = len(self.steps)
            out.append(f"the {plural(n, 'aligned step')} send{'s' if n == 1 else ''} the same prompts")
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
    paths = (run_directories(reader_a, a.run), run_directories(reader_b, b.run))
    agents = (agent_of(reader_a, a.run), agent_of(reader_b, b.run))
    same_run = a.run == b.run and reader_a.path == reader_b.path
    follows = bool(a.steps and b.steps and b.steps[0][0] == a.steps[-1][0] + 1)
    if attempt_b is not None and a.steps and ((same_run and follows) or not b.steps):
        n, ex_b = b.steps[0] if b.steps else (None, first_request(reader_b, b.run, attempt_b))
        out = RunDiff(a, b, "extends")
        if ex_b is not None:
            a_n, ex_a = a.steps[-1]
            found = diff_exchanges(reader_a, ex_a, reader_b, ex_b, paths=paths, agents=agents)
            out.steps.append(StepDiff(n, a_n, ex_a.id, ex_b.id, found))
        return out
    a.end, b.end = synthetic_end(reader_a, a.run, attempt_a), synthetic_end(reader_b, b.run, attempt_b)
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
            found = diff_exchanges(
                reader_a, ea, reader_b, eb, readings if full else None, full, paths, agents
            )
            detailed += full and found.verdict is not DiffVerdict.SAME
            out.steps.append(StepDiff(nb, na, ea.id, eb.id, found))
    finally:
        if collecting:
            gc.enable()
    k = len(out.steps)
    after = _after_boundary(a, b, k, paths, agents)
    if after is not None:
        out.steps.append(after)
    skip = k + (after is not None)
    out.only_a = [n for n, _ in a.steps[skip:]]
    out.only_b = [n for n, _ in b.steps[skip:]]
    return out


def _after_boundary(
    a: Side, b: Side, k: int, paths: tuple[RunPaths, RunPaths], agents: tuple[Any, Any]
) -> StepDiff | None:
    """The request after a replay's boundary against the other run's step there: when one
    side's ``k`` steps all were aligned and its :func:`synthetic_end` request follows them, it
    is set against the other side's step ``k + 1`` (the request that carries the replayed
    observation: where a replay parts, if it does); None otherwise."""
    for mine, other, flip in ((b, a, False), (a, b, True)):
        if mine.end is not None and len(mine.steps) == k and len(other.steps) > k:
            n_mine = mine.steps[-1][0] + 1 if mine.steps else 1
            n_other, ex_other = other.steps[k]
            ea, eb = (mine.end, ex_other) if flip else (ex_other, mine.end)
            found = diff_exchanges(a.reader, ea, b.reader, eb, paths=paths, agents=agents)
            step, a_step = (n_other, n_mine) if flip else (n_mine, n_other)
            return StepDiff(step, a_step, ea.id, eb.id, found, after_boundary=True)
    return None


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
        "steps": [
            {"step": s.step, "a": s.a, "b": s.b, "after_boundary": s.after_boundary, **s.diff.to_json()}
            for s in found.steps
        ],
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
