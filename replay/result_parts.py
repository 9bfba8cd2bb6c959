"""The parts of the result document read from the source and the prefix (:mod:`.result`
holds the document and its records).

- ``tool_calls`` (:class:`~.result.ToolCallRecord`, one per tool call of steps 1..N):
  :func:`tool_call_records` makes them from a source's steps, :class:`ToolCallMemo` makes each
  step's once for the prefixes of a batch (:meth:`~.batch.SourceReads.tool_calls`);
  :func:`match_results` pairs calls with the results that answer them (replay-only's playback
  too);
- ``prefix.message_count``, ``ends_with``, ``system_present``, ``tools_present``, ``model``
  and ``stream``: :func:`describe_prefix`, from the body read back or from the
  :func:`prefix_facts` the source knows already (a journal run's classification parsed every
  request it holds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from pvisor.journal.model import Step, ToolCall, ToolResult

from .result import ToolCallRecord, arguments_record, content_sha256
from .source import is_made_up

if TYPE_CHECKING:
    from pvisor.adapters.protocols.base import ParseMemo


def match_results(calls: list[ToolCall], results: list[ToolResult]) -> list[ToolResult | None]:
    """The result answering each call: the one with its call id, else the one at its
    position when that one answers no other call (Gemini CLI gives its own ids)."""
    by_id = {r.call_id: r for r in results if r.call_id is not None}
    call_ids = {c.id for c in calls if c.id is not None}
    out: list[ToolResult | None] = []
    for i, c in enumerate(calls):
        if c.id is not None and c.id in by_id:
            out.append(by_id[c.id])
        elif i < len(results) and (results[i].call_id is None or results[i].call_id not in call_ids):
            out.append(results[i])
        else:
            out.append(None)
    return out


class ToolCallMemo:
    """The ``tool_calls`` records of one sequence of steps, each step's made once (what the
    prefixes of a batch share: :meth:`~.batch.SourceReads.tool_calls`). The records of step i
    are the same for every boundary N > i, so :func:`tool_call_records` with a memo makes only
    the steps no earlier boundary reached, and A_N's own again when its observation was never
    sent (their flag). ``steps``: the steps (a memo serves them alone); ``wire``: as for
    :func:`tool_call_records`, the same for every boundary; ``made``: the records made so far
    (the tests count them). The records are shared by the documents of the prefixes: nothing
    may change them (prepare-only never does)."""

    __slots__ = ("steps", "wire", "made", "_records", "_ends")

    def __init__(self, steps: Sequence[Step], wire: Callable[[Any], list[str | None]] | None = None) -> None:
        self.steps = steps
        self.wire = wire
        self.made = 0
        self._records: list[ToolCallRecord] = []  # those of steps 1..len(_ends) - 1, in order
        self._ends = [0]  # _ends[i]: how many records steps 1..i have

    def records(self, after_step: int, unsent: bool) -> list[ToolCallRecord]:
        """:func:`tool_call_records` of ``after_step`` and ``unsent`` (a new list)."""
        whole = after_step - 1 if unsent and after_step > 0 else after_step
        for i in range(len(self._ends) - 1, whole):
            made = _step_records(self.steps[i], self.wire, False)
            self._records.extend(made)
            self._ends.append(len(self._records))
            self.made += len(made)
        out = self._records[: self._ends[whole]]
        if whole < after_step:  # A_N, its observation never sent: flagged, made for this boundary
            last = _step_records(self.steps[whole], self.wire, True)
            self.made += len(last)
            out.extend(last)
        return out


def _step_records(
    step: Step, wire: Callable[[Any], list[str | None]] | None, not_sent: bool
) -> list[ToolCallRecord]:
    """The records of one step's calls (:func:`tool_call_records`)."""
    calls = list(step.action.tool_calls)
    ids = wire(step.action) if wire is not None else [c.id for c in calls]
    results = [] if not_sent else list(step.observation.results)
    return [
        ToolCallRecord(
            step.n,
            cid,
            c.name,
            c.kind,
            *arguments_record(c.arguments_raw),
            content_sha256(r.content) if r is not None and not is_made_up(r) else None,
            observation_not_sent=not_sent,
        )
        for c, r, cid in zip(calls, match_results(calls, results), ids)
    ]


def tool_call_records(
    steps: Sequence[Step],
    after_step: int,
    wire: Callable[[Any], list[str | None]] | None = None,
    unsent: bool = False,
    memo: ToolCallMemo | None = None,
) -> list[ToolCallRecord]:
    """``tool_calls`` of the result: one record per tool call of steps 1..N, in order.
    ``wire(action)``: the call ids as the agent sends them (a native file may store its own
    form: Gemini CLI's ``<name>__<id>``), so that ``call_id`` names the id the prefix carries.
    ``unsent``: O_N was never sent (A_N is the agent's finish action, :func:`~.source.finish_at`):
    the calls of A_N are flagged ``observation_not_sent`` and have no historical observation.
    ``memo``: the :class:`ToolCallMemo` of ``steps`` and ``wire`` (a batch's), whose records
    are made once for all boundaries; None: made here."""
    if memo is not None:
        assert memo.steps is steps and memo.wire is wire
        return memo.records(after_step, unsent)
    out: list[ToolCallRecord] = []
    for i in range(after_step):
        out.extend(_step_records(steps[i], wire, unsent and i == after_step - 1))
    return out


def prefix_facts(conv: Any) -> dict[str, Any]:
    """What the result's ``prefix`` record says of a prefix body parsed as the
    :class:`~pvisor.journal.model.Conversation` ``conv``, whatever its boundary:
    ``message_count``; ``last``, the last message's kind (``action`` for the assistant's,
    ``observation`` for one holding a tool result, ``other``; None when there is no message);
    ``system_present``, ``tools_present``, ``model``, ``stream``. A journal run's are taken
    when the classification parses each request (:class:`~.prefix.ClassifiedRun`), so that a
    recorded prefix is not parsed again."""
    last = conv.messages[-1] if conv.messages else None
    if last is None:
        kind = None
    elif last.role == "assistant":
        kind = "action"
    elif any(isinstance(p, ToolResult) for p in last.parts):
        kind = "observation"
    else:
        kind = "other"
    return {
        "message_count": len(conv.messages),
        "last": kind,
        "system_present": bool(conv.system),
        "tools_present": bool(conv.tools),
        "model": conv.model,
        "stream": conv.stream,
    }


def describe_prefix(
    protocol: str,
    body: bytes,
    path: str,
    query: str,
    after_step: int,
    facts: dict[str, Any] | None = None,
    memo: ParseMemo | None = None,
) -> dict[str, Any]:
    """``message_count``, ``ends_with``, ``system_present`` and ``tools_present`` (and ``model``
    and ``stream``) of a prefix body, read back with the protocol module (the body must parse: a
    rendered one always does, a recorded one parsed when the chain rule read it), or from its
    ``facts`` (:func:`prefix_facts`) when they are known. ``memo``: the
    :class:`~pvisor.adapters.protocols.base.ParseMemo` of the bodies of one source (a batch's
    prefixes of one native file repeat each other's messages: only the new ones are read)."""
    if facts is None:
        from pvisor.adapters.protocols import get_protocol

        conv = get_protocol(protocol).parse_request(body, path=path, query=query, memo=memo)
        facts = prefix_facts(conv)
    last = facts["last"]
    if last is None:
        ends = "nothing"
    elif last != "other":
        ends = last
    elif after_step == 0:
        ends = "task"
    else:
        ends = "observation"
    return {
        "message_count": facts["message_count"],
        "ends_with": ends,
        "system_present": facts["system_present"],
        "tools_present": facts["tools_present"],
        "model": facts["model"],
        "stream": facts["stream"],
    }


__all__ = ["ToolCallMemo", "describe_prefix", "match_results", "prefix_facts", "tool_call_records"]
