"""The shared assembly of a native trajectory: steps, tool calls and results, what was left out.

- :class:`LazySteps`: a trajectory's steps built on demand from the plans an adapter recorded
  while reading (a large JSONL file holds its structure only);
- :class:`LeftOutLines`: a compact ``left_out`` for files with a left-out record on most lines;
- :func:`object_call`, :func:`string_call`, :func:`compact_json`: tool calls as the formats
  store their arguments (an object, a JSON string);
- :func:`order_results`: a step's results in the order of its calls, ``interrupted`` for a
  call without one (a warning in the
  :class:`~pvisor.adapters.native.diagnostics.Diagnostics`);
- :func:`left_out`, :func:`as_dict`, :func:`as_list`, :func:`as_str`, :func:`text_of`,
  :func:`interned`: reading fields of the wrong type as absent, texts of contents.

Depends on ``pvisor.journal`` and :mod:`pvisor.adapters.jsonio` only.
"""

from __future__ import annotations

import datetime
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Iterator, overload

import orjson

from pvisor.adapters.jsonio import dumps
from pvisor.core.errors import BadInputError
from pvisor.journal.model import LeftOut, Step, ToolCall, ToolResult, Trajectory

if TYPE_CHECKING:
    from .diagnostics import Diagnostics


class LazySteps(Sequence[Step]):
    """The steps of a trajectory, built on demand: ``plans[i]`` is whatever the adapter
    recorded about step ``i + 1`` while reading (line refs, call ids), ``build(plan)`` makes
    the :class:`~pvisor.journal.model.Step`, reading its texts through a :class:`JsonlSource`.
    Nothing is cached: iterating twice builds twice; memory holds the plans and one step.
    Warnings are the adapter's job while reading (``build`` must not add any), so ``--strict``
    and the warnings printed before the steps are complete."""

    def __init__(self, plans: list[Any], build: Callable[[Any], Step]) -> None:
        self._plans = plans
        self._build = build

    def __len__(self) -> int:
        return len(self._plans)

    @overload
    def __getitem__(self, i: int) -> Step: ...
    @overload
    def __getitem__(self, i: slice) -> list[Step]: ...
    def __getitem__(self, i: int | slice) -> Step | list[Step]:
        if isinstance(i, slice):
            return [self._build(p) for p in self._plans[i]]
        return self._build(self._plans[i])

    def __iter__(self) -> Iterator[Step]:
        for p in self._plans:
            yield self._build(p)

    def flagging(self, index: int, flag: str) -> "LazySteps":
        """These steps, the one at ``index`` built with ``flag`` added to its flags."""
        plan = self._plans[index]
        build = self._build

        def flagged(p: Any) -> Step:
            step = build(p)
            if p is plan and flag not in step.flags:
                step.flags.append(flag)
            return step

        return LazySteps(self._plans, flagged)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, LazySteps)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"LazySteps({len(self._plans)} steps)"


def compact_json(obj: Any) -> str:
    """``obj`` as compact JSON text, keys in their order, non-ASCII kept: how an argument
    object (Anthropic ``input``, Gemini ``args``) becomes ``ToolCall.arguments_raw``, the same
    way the wire-protocol modules serialise it (:func:`pvisor.adapters.jsonio.dumps`: an
    object nested deeper than orjson writes is written by the standard library the same
    way). Raises BadInputError (exit 65) past the interpreter's recursion limit."""
    try:
        return dumps(obj).decode()
    except ValueError:
        raise BadInputError("a value nested too deep to write as JSON") from None


def object_call(call_id: str | None, name: str, args: Any, raw: Any = None) -> ToolCall:
    """A ToolCall whose arguments the format stores as an object."""
    return ToolCall(
        id=call_id,
        name=name,
        arguments_raw=compact_json(args if args is not None else {}),
        arguments=args if args is not None else {},
        raw=raw,
    )


def string_call(
    call_id: str | None, name: str, arguments: str, raw: Any = None, kind: str = "function"
) -> ToolCall:
    """A ToolCall whose arguments the format stores as a JSON string (kept exactly)."""
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError:
        parsed = None
    raw_text = arguments if isinstance(arguments, str) else compact_json(arguments)
    return ToolCall(id=call_id, name=name, arguments_raw=raw_text, arguments=parsed, kind=kind, raw=raw)


def order_results(step: Step, diag: Diagnostics, *, no_result: frozenset[str] = frozenset()) -> None:
    """Put ``step``'s results in the order of its tool calls (matched by call id); a call
    without a result gets an empty one marked ``{"interrupted": True}``, the step the flag
    ``interrupted`` and ``diag`` an ``interrupted`` warning. Calls the provider runs itself
    (kind ``server``) and calls named in ``no_result`` (OpenHands ``finish``) expect none.
    Results that answer no call are kept, after."""
    by_id = {r.call_id: r for r in step.observation.results}
    ordered = []
    for call in step.action.tool_calls:
        r = by_id.pop(call.id, None)
        if r is None:
            if call.kind == "server" or call.name in no_result:
                continue
            r = ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
            if "interrupted" not in step.flags:
                step.flags.append("interrupted")
            diag.warn(
                "interrupted",
                f"step {step.n}",
                f"tool call {call.id} ({call.name}) has no result in the file",
            )
        ordered.append(r)
    step.observation.results = ordered + list(by_id.values())


def left_out(traj: Trajectory, where: str, kind: str, reason: str) -> None:
    traj.left_out.append(LeftOut(where, kind, reason))


def as_dict(value: Any) -> dict:
    """``value`` when it is a JSON object, else ``{}``: a field of the wrong type reads as absent."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    """``value`` when it is a JSON array, else ``[]``."""
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    """``value`` when it is a string, else None (ids, names and parents of the wrong type)."""
    return value if isinstance(value, str) else None


def text_of(content: Any) -> str:
    """Text of a result or message content: a string as is; a list of blocks/parts: their
    ``text`` fields joined (Anthropic ``text`` blocks, Responses ``input_text``/``output_text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, str):
                out.append(b)
            elif isinstance(b, dict) and isinstance(b.get("text"), str):
                out.append(b["text"])
        return "".join(out)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return compact_json(content)


def epoch_ms(value: Any) -> float | None:
    """A record's time as Unix epoch milliseconds: an ISO 8601 string (``Z`` or an offset; one
    without either, as OpenHands writes, read as UTC) or a number of epoch milliseconds (OpenCode's
    ``time.created``); None for anything else (no time, or text that is none)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) and 0 < value < 1e14 else None
    if not isinstance(value, str) or not 10 <= len(value) <= 40:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.timezone.utc)
        ms = stamp.timestamp() * 1000
    except (ValueError, OverflowError):  # not a time; or one whose zone moves it out of range
        return None
    return ms if 0 < ms < 1e14 else None  # from 1970 to the year 5138, what iso_time writes


def interned(s: str | None) -> str | None:
    """``s`` interned (ids, names and types repeated over a large file kept once); None as is."""
    return sys.intern(s) if s else s


class LeftOutLines(Sequence[LeftOut]):
    """A trajectory's ``left_out`` for a file with a left-out record on most lines (Claude Code
    ``progress`` lines): each entry kept as a line number (or the index of a ``where`` string)
    and the index of its (kind, reason) pair, 8 bytes an entry instead of a LeftOut object of
    three strings; :class:`~pvisor.journal.model.LeftOut` objects are made when read. Reads as
    the list of LeftOut(where, kind, reason) it stands for (``len``, index, iteration, ``==``
    with a list); :meth:`append` takes a LeftOut, :meth:`add` a line number."""

    def __init__(self) -> None:
        from array import array

        self._where = array("q")  # line number, or -(index into _wheres) - 1
        self._pair = array("I")
        self._pairs: list[tuple[str, str]] = []
        self._pair_ix: dict[tuple[str, str], int] = {}
        self._wheres: list[str] = []

    def _code(self, kind: str, reason: str) -> int:
        key = (kind, reason)
        i = self._pair_ix.get(key)
        if i is None:
            i = self._pair_ix[key] = len(self._pairs)
            self._pairs.append(key)
        return i

    def add(self, line: int, kind: str, reason: str) -> None:
        """Left out: the record at line ``line`` (where ``"line <line>"``)."""
        self._where.append(line)
        self._pair.append(self._code(kind, reason))

    def append(self, lo: LeftOut) -> None:
        w = lo.where
        if w.startswith("line ") and w[5:].isdigit() and not w[5:].startswith("0"):
            self._where.append(int(w[5:]))
        else:
            self._where.append(-len(self._wheres) - 1)
            self._wheres.append(w)
        self._pair.append(self._code(lo.kind, lo.reason))

    def _get(self, i: int) -> LeftOut:
        w = self._where[i]
        kind, reason = self._pairs[self._pair[i]]
        return LeftOut(f"line {w}" if w >= 0 else self._wheres[-w - 1], kind, reason)

    def __len__(self) -> int:
        return len(self._where)

    @overload
    def __getitem__(self, i: int) -> LeftOut: ...
    @overload
    def __getitem__(self, i: slice) -> list[LeftOut]: ...
    def __getitem__(self, i: int | slice) -> LeftOut | list[LeftOut]:
        if isinstance(i, slice):
            return [self._get(j) for j in range(len(self._where))[i]]
        return self._get(range(len(self._where))[i])

    def __iter__(self) -> Iterator[LeftOut]:
        for i in range(len(self._where)):
            yield self._get(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, LeftOutLines)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"LeftOutLines({len(self)} records)"
