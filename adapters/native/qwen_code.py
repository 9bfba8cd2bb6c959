"""Qwen Code chat recordings (``~/.qwen/projects/<cwd-slug>/chats/<session>.jsonl``) into a Trajectory.

Format rules (sources: docs/native.md, from QwenLM/qwen-code
packages/core/src/services/chatRecordingService.ts ``ChatRecord``; corpus files
``real-0.24.4_single*.jsonl`` and the agent-sessions fixtures):

- One ChatRecord per line: ``uuid``, ``parentUuid``, ``type`` (``user``, ``assistant``,
  ``tool_result``, ``system``), ``subtype``, ``version``, ``message`` (a Gemini API
  ``Content``: ``role`` and ``parts``), ``model``, ``usageMetadata``, ``toolCallResult``.
  A record without a uuid or of another type is left out with an ``unknown_record`` warning.
- Required shape: at least one record with ``uuid`` and ``message.parts`` (a list); a file
  without one (another agent's file, an empty file) is refused, exit 65, before its version is
  checked (a Claude Code file would otherwise be refused for its version).
- **Order is the parentUuid chain, never the timestamp or the file order.** A record whose
  ``parentUuid`` is not null but names no record of the file (its parent's line was lost or
  damaged) continues from the record before it in the file, with a ``broken_chain`` warning
  naming the line and the missing uuid (:func:`~.uuid_chain.mend_chain`), and the step that
  takes the record flagged ``broken_chain``; real forks (a parent that
  exists) are untouched. The chain is walked back from its leaf: the deepest
  ``user``/``assistant``/``tool_result`` record that no such record follows (``system`` records
  between them are walked through); ties: the later line.
  A record whose ``uuid`` was seen before replaces the earlier one (a streamed update: thought
  part first, then the final parts).
- An ``assistant`` record is an action: ``text`` parts (``thought: true`` ones are
  reasoning), ``functionCall{id, name, args}`` parts as one batch. Results are
  ``tool_result`` records with ``functionResponse`` parts, matched by id, in call order (the
  k-th call with an id gets the k-th result with it; a call id used twice warns
  ``duplicate_call_id``); ``toolCallResult.status == "error"`` (or a ``response.error``) sets
  ``is_error``. A ``user``/``assistant``/``tool_result`` record without a ``message`` object is
  left out with a ``malformed_record`` warning (the chain goes through it).
- A ``tool_result`` record whose ids answer no call of the chain (the assistant record was
  lost) is a gap step at its place: flag ``lost_action``, no action, its results the
  observation, a ``lost_action`` warning naming the line; later steps keep their numbers.
- ``system`` records are UI-only (``ui_telemetry``, ``attribution_snapshot``, ``slash_command``,
  ...) and left out; ``chat_compression`` is left out and flags the step before it
  ``compaction``; its ``systemPayload.compressedHistory`` (the summary, the acknowledgement
  carrying the call in flight, its result: 0.24.4 sends exactly these as the next request's
  messages) is the history of a :class:`~pvisor.journal.model.Compaction` after that step.
  The start-up reminders Qwen Code puts back in front of the summary from the second request
  on are in no record. ``isSidechain`` records (subagents) are left out.
- System prompt and tool definitions are not stored. Version: ``version`` of the first record.

Memory (issue 6, "Scale"): reading keeps the structure of each record only (uuid, parent, type,
call and result ids, a :class:`~.jsonl.LineRef`); ``traj.steps`` is a :class:`~.assembly.LazySteps`
whose steps read their records from the file again when built. All warnings are given while
reading.
"""

from __future__ import annotations

import sys
from dataclasses import field
from typing import TYPE_CHECKING, Any

from pvisor.journal.model import (
    Action,
    Compaction,
    Message,
    Reasoning,
    Step,
    TextPart,
    ToolResult,
    Trajectory,
)
from pvisor.core.record import Record

from .assembly import (
    LazySteps,
    LeftOutLines,
    as_dict,
    as_list,
    as_str,
    epoch_ms,
    interned,
    left_out,
    object_call,
)
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics
from .jsonl import JsonlSource, iter_json_records, pack_ref, unpack_ref
from .uuid_chain import SessionHeader, chain_depths, chain_leaf, mend_chain, take_uuid, walk_chain

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile("qwen-code", 0, 24, "`version` of the first record", "0.21.13 (fixture), 0.24.4")

_CONV = ("user", "assistant", "tool_result")
_KNOWN = frozenset(_CONV + ("system",))

_SHAPE = "no Qwen Code chat record (a record with uuid and message.parts) in the file"


class _Rec(Record, record=True):
    """One record: ``ref`` is its packed :class:`~.jsonl.LineRef`; ``ids`` are the call ids of
    an assistant's ``functionCall`` parts (with names) or of a tool_result's
    ``functionResponse`` parts; ``on`` marks the main chain. Strings are interned: a 200 MB
    file has some 200k records."""

    line: int
    type: str | None
    parent: str | None
    ref: int
    subtype: str | None = None
    model: str | None = None
    ids: tuple = ()
    on: bool = False

    def __init__(
        self,
        line: int,
        type: str | None,
        parent: str | None,
        ref: int,
        subtype: str | None = None,
        model: str | None = None,
        ids: tuple = (),
        on: bool = False,
    ) -> None:
        self.line = line
        self.type = type
        self.parent = parent
        self.ref = ref
        self.subtype = subtype
        self.model = model
        self.ids = ids
        self.on = on


class _Plan(Record, record=True):
    """Step ``n``: its assistant record, the tool_result and user records after it, and how
    many ``chat_compression`` records followed it."""

    n: int
    action: _Rec
    results: list[_Rec] = field(default_factory=list)
    messages: list[int] | None = None
    compactions: int = 0
    lost: bool = False  #: a gap: ``action`` is the tool_result record whose calls no record holds
    bridged: bool = False  #: a record of the step follows a lost record (its parent not in the file)

    def __init__(
        self,
        n: int,
        action: _Rec,
        results: list[_Rec] | None = None,
        messages: list[int] | None = None,
        compactions: int = 0,
        lost: bool = False,
        bridged: bool = False,
    ) -> None:
        self.n = n
        self.action = action
        self.results = [] if results is None else results
        self.messages = messages
        self.compactions = compactions
        self.lost = lost
        self.bridged = bridged


def _parts(obj: dict) -> list:
    return as_list(as_dict(obj.get("message")).get("parts"))


def _responses(parts: list) -> list[dict]:
    return [
        p["functionResponse"]
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)
    ]


def _user_texts(parts: list) -> list[str]:
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]


def _history(contents: list) -> list[Message]:
    """``compressedHistory`` (Gemini ``Content`` objects, what the model sees after the
    compression: the summary, the agent's acknowledgement with the call in flight, its result)
    as messages of no protocol: texts, calls and results read as the steps' are, ``raw`` None,
    so each protocol renders its own shape. Thought parts and anything else are left out."""
    out: list[Message] = []
    for c in contents:
        if not isinstance(c, dict):
            continue
        role = "assistant" if c.get("role") == "model" else "user"
        parts: list[Any] = []
        for p in as_list(c.get("parts")):
            if not isinstance(p, dict) or p.get("thought"):
                continue
            if isinstance(p.get("text"), str):
                parts.append(TextPart(p["text"]))
            elif isinstance(p.get("functionCall"), dict):
                fc = p["functionCall"]
                parts.append(object_call(as_str(fc.get("id")), as_str(fc.get("name")) or "", fc.get("args")))
            elif isinstance(p.get("functionResponse"), dict):
                fr = p["functionResponse"]
                parts.append(
                    ToolResult(
                        as_str(fr.get("id")), fr.get("response"), is_error=False, name=as_str(fr.get("name"))
                    )
                )
        out.append(Message(role, parts))
    return out


def _scan(path: Path, traj: Trajectory, meta: dict[str, Any], diag: Diagnostics) -> dict[str, _Rec]:
    """The first pass: every record with a uuid kept by it as a :class:`_Rec` (line, type,
    parent, packed ref, and the call or result ids of assistant and tool-result records);
    records without a uuid, of a subagent or of a type unknown to the profile left out (the
    unknown ones warned), a conversational record without a ``message`` marked malformed.
    BadInputError (exit 65) when no record has the format's shape."""
    header = SessionHeader(PROFILE, meta, ("sessionId", "cwd"), _SHAPE)
    recs: dict[str, _Rec] = {}
    intern = sys.intern
    for n, obj, ref in iter_json_records(path, diag):
        uuid = obj.get("uuid")
        kind = as_str(obj.get("type"))
        header.see(
            obj,
            n,
            diag,
            shaped=isinstance(uuid, str) and isinstance(as_dict(obj.get("message")).get("parts"), list),
        )
        if not isinstance(uuid, str):
            diag.warn("unknown_record", f"line {n}", f"record type {obj.get('type')!r} without uuid left out")
            left_out(traj, f"line {n}", str(obj.get("type")), "record without uuid")
            continue
        uuid = take_uuid(obj, n, recs, traj, diag, "record")
        if uuid is None:
            continue
        if kind not in _KNOWN:
            diag.warn("unknown_record", f"line {n}", f"record type {obj.get('type')!r} left out")
        parent = as_str(obj.get("parentUuid"))
        sub = as_str(obj.get("subtype"))
        rec = recs[uuid] = _Rec(n, interned(kind), interned(parent), pack_ref(ref), interned(sub))
        if kind not in _CONV:
            continue
        if not isinstance(obj.get("message"), dict):
            diag.warn(
                "malformed_record",
                f"line {n}",
                f"a {kind} record without a `message` object; left out",
            )
            rec.type = "malformed"
            continue
        parts = _parts(obj)
        if kind == "assistant":
            model = as_str(obj.get("model"))
            rec.model = interned(model)
            rec.ids = tuple(
                (
                    interned(as_str(p["functionCall"].get("id"))),
                    intern(as_str(p["functionCall"].get("name")) or ""),
                )
                for p in parts
                if isinstance(p, dict)
                and not isinstance(p.get("text"), str)
                and isinstance(p.get("functionCall"), dict)
            )
        elif kind == "tool_result":
            rec.ids = tuple(interned(as_str(fr.get("id"))) for fr in _responses(parts))
    header.finish(diag)
    return recs


def _plans(
    chain: list[Any],
    traj: Trajectory,
    meta: dict[str, Any],
    source: JsonlSource,
    diag: Diagnostics,
    bridged: set[int],
) -> list[_Plan]:
    """The main chain made into step plans, each record by its type: an assistant record an
    action, tool results the results of the step before (a gap step for results of calls no
    record holds: ``lost_action``), user records the task or observation messages, a
    ``chat_compression`` record a compaction, the rest left out. Each record is dropped from
    ``chain`` once planned (the plans take its place in memory). ``bridged``: the lines of the
    records whose parent is lost; the step that takes one is marked ``bridged``."""
    plans: list[_Plan] = []
    context: list[str] = meta["task_context"]
    called = {cid for r in chain if r is not None and r.type == "assistant" for cid, _ in r.ids}
    for i, r in enumerate(chain):
        chain[i] = None
        t = r.type
        if t == "assistant":
            plans.append(_Plan(len(plans) + 1, r))
        elif t == "tool_result" and r.ids and not any(cid in called for cid in r.ids):
            # results of calls no record holds: the assistant record was lost (a gap step)
            gap = _Plan(len(plans) + 1, r, [r], lost=True)
            plans.append(gap)
            called.update(r.ids)
            diag.warn(
                "lost_action",
                f"line {r.line}",
                f"tool result(s) {', '.join(str(c) for c in r.ids)} answer a call no record "
                f"holds: the action of step {gap.n} was lost; a gap step stands at its place",
            )
        elif t == "tool_result":
            if not plans:
                left_out(traj, f"line {r.line}", "tool_result", "a result before any action")
                continue
            plans[-1].results.append(r)
        elif t == "user":
            if not plans:
                texts = _user_texts(_parts(source.load(unpack_ref(r.ref))))
                if traj.task is not None:
                    context.append(traj.task)
                traj.task = texts[-1] if texts else ""
                context.extend(texts[:-1])
            elif plans[-1].messages is None:
                plans[-1].messages = [r.ref]
            else:
                plans[-1].messages.append(r.ref)
        elif t == "malformed":
            left_out(traj, f"line {r.line}", "malformed", "malformed record (no `message` object)")
        else:
            _system(r, plans, traj, meta, source)
        if r.line in bridged and plans:
            # a record lost before this one: the step that took it (an assistant record's own,
            # or the one a result or message is observation of); before any step, none
            plans[-1].bridged = True
    return plans


def _system(r: _Rec, plans: list[_Plan], traj: Trajectory, meta: dict[str, Any], source: JsonlSource) -> None:
    """A system or UI record on the chain, left out; a ``chat_compression`` after a step is a
    compaction (its ``compressedHistory`` what the model sees from there on)."""
    t, sub = r.type, r.subtype
    if sub == "chat_compression" and plans:
        plans[-1].compactions += 1
        meta["compactions"].append({"step": plans[-1].n, "line": r.line})
        payload = as_dict(source.load(unpack_ref(r.ref)).get("systemPayload"))
        history = payload.get("compressedHistory")
        if isinstance(history, list):
            msgs = _history(history)
            summary = (
                "".join(p.text for p in msgs[0].parts if isinstance(p, TextPart))
                if msgs and msgs[0].role == "user"
                else None
            )
            traj.compactions.append(
                Compaction(
                    plans[-1].n,
                    msgs,
                    "chat_compression",
                    f"line {r.line}",
                    summary,
                    len(plans[-1].messages or ()),
                )
            )
    left_out(
        traj,
        f"line {r.line}",
        sys.intern(f"{t}/{sub}" if sub else str(t)),
        "UI-only or bookkeeping record",
    )


class QwenCodeAdapter(NativeAdapter):
    name = "qwen-code"
    description = "Qwen Code chat JSONL (~/.qwen/projects/<cwd-slug>/chats/<session>.jsonl)"
    profiles = (PROFILE,)
    #: an assistant record's ``usageMetadata`` is Gemini's (Qwen Code is a Gemini CLI fork)
    usage_protocol = "gemini"

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """The records read (:func:`_scan`), the chain mended and walked from its leaf (records off
        it left out), the chain made into step plans (:func:`_plans`); steps built lazily."""
        traj = Trajectory()
        traj.left_out = LeftOutLines()  # a left-out telemetry record on most steps: kept compactly
        meta: dict[str, Any] = {"format": "qwen-code chat jsonl", "task_context": [], "compactions": []}
        recs = _scan(path, traj, meta, diag)
        bridged = mend_chain(recs, diag)
        chain = walk_chain(recs, self._leaf(recs), diag)
        for r in chain:
            r.on = True
        for r in recs.values():
            if not r.on:
                left_out(
                    traj, f"line {r.line}", str(r.type), "off the main chain (an abandoned branch or rewind)"
                )
        del recs  # from here each record is dropped once planned: the plans take its place in memory
        source = JsonlSource(path)
        plans = _plans(chain, traj, meta, source, diag, bridged)
        first_call: dict[str | None, int] = {}
        for p in plans:
            if not p.lost:
                self._warn_unanswered(p, first_call, diag)
        traj.steps = LazySteps(plans, lambda plan: self._step(plan, source))
        traj.model = next((p.action.model for p in plans if p.action.model), None)
        traj.meta = meta
        return NativeResult(traj, PROFILE, diag)

    @staticmethod
    def _leaf(recs: dict[str, _Rec]) -> str | None:
        """The deepest user/assistant/tool_result record that no such record follows (system
        records in between walked through: a session ends with telemetry records that are not
        the conversation's end); ties: the later line."""
        followed: set[str] = set()
        for r in recs.values():
            if r.type not in _CONV:
                continue
            seen: set[str] = set()
            cur = r.parent
            while cur is not None and cur in recs and cur not in seen and recs[cur].type not in _CONV:
                seen.add(cur)
                cur = recs[cur].parent
            if cur is not None:
                followed.add(cur)
        return chain_leaf(
            recs, chain_depths(recs), (u for u, r in recs.items() if r.type in _CONV), followed.__contains__
        )

    @staticmethod
    def _warn_unanswered(plan: _Plan, first_call: dict[str | None, int], diag: Diagnostics) -> None:
        """``duplicate_call_id`` for a call id used before (in this step or an earlier one), and
        ``interrupted`` for each call of the step without a result (as :meth:`_step` pairs them:
        the step's results with an id, in order, to its calls with that id, in order)."""
        answered: dict[str | None, int] = {}
        for r in plan.results:
            for cid in r.ids:
                answered[cid] = answered.get(cid, 0) + 1
        for cid, name in plan.action.ids:
            if cid in first_call:
                diag.warn(
                    "duplicate_call_id",
                    f"line {plan.action.line}",
                    f"tool call id {cid} ({name}) used before (step {first_call[cid]}); results paired "
                    "in order of appearance",
                )
            else:
                first_call[cid] = plan.n
            if answered.get(cid, 0) > 0:
                answered[cid] -= 1
            else:
                diag.warn(
                    "interrupted", f"step {plan.n}", f"tool call {cid} ({name}) has no result in the file"
                )

    @staticmethod
    def _step(plan: _Plan, source: JsonlSource) -> Step:
        if plan.lost:
            step = Step(n=plan.n, action=Action(), flags=["lost_action"])
            for rec in plan.results:
                for fr in _responses(_parts(source.load(unpack_ref(rec.ref)))):
                    step.observation.results.append(
                        ToolResult(
                            as_str(fr.get("id")),
                            fr.get("response"),
                            is_error=False,
                            name=as_str(fr.get("name")),
                            raw=fr,
                        )
                    )
            for ref in plan.messages or ():
                m = source.load(unpack_ref(ref))
                step.observation.messages.append(
                    Message("user", [TextPart(x) for x in _user_texts(_parts(m))], raw=m.get("message"))
                )
            return step
        obj = source.load(unpack_ref(plan.action.ref))
        action = Action(
            model=as_str(obj.get("model")), usage=obj.get("usageMetadata"), raw=obj.get("message")
        )
        texts = []
        for p in _parts(obj):
            if not isinstance(p, dict):
                continue
            if isinstance(p.get("text"), str):
                if p.get("thought"):
                    action.reasoning.append(
                        Reasoning(text=p["text"], signature=p.get("thoughtSignature"), raw=p)
                    )
                else:
                    texts.append(p["text"])
            elif isinstance(p.get("functionCall"), dict):
                fc = p["functionCall"]
                action.tool_calls.append(
                    object_call(as_str(fc.get("id")), as_str(fc.get("name")) or "", fc.get("args"), raw=p)
                )
        action.text = "".join(texts)
        step = Step(
            n=plan.n,
            action=action,
            flags=["compaction"] * plan.compactions,
            time_ms=epoch_ms(obj.get("timestamp")),  # the assistant record's own time
        )
        if plan.bridged:
            step.flags.append("broken_chain")
        found: list[ToolResult] = []
        for rec in plan.results:
            r = source.load(unpack_ref(rec.ref))
            status = as_dict(r.get("toolCallResult")).get("status")
            for fr in _responses(_parts(r)):
                err = status == "error" or (
                    isinstance(fr.get("response"), dict) and "error" in fr["response"]
                )
                found.append(
                    ToolResult(
                        as_str(fr.get("id")),
                        fr.get("response"),
                        is_error=err,
                        name=as_str(fr.get("name")),
                        raw=fr,
                    )
                )
        # results in call order: the k-th call with an id gets the k-th result with it
        by_id: dict[str | None, list[ToolResult]] = {}
        for res in found:
            by_id.setdefault(res.call_id, []).append(res)
        for call in action.tool_calls:
            got = by_id.get(call.id)
            if got:
                step.observation.results.append(got.pop(0))
            else:
                step.observation.results.append(
                    ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
                )
                if "interrupted" not in step.flags:
                    step.flags.append("interrupted")
        step.observation.results.extend(
            res for res in found if any(res is x for x in by_id.get(res.call_id, ()))
        )
        for ref in plan.messages or ():
            m = source.load(unpack_ref(ref))
            step.observation.messages.append(
                Message("user", [TextPart(x) for x in _user_texts(_parts(m))], raw=m.get("message"))
            )
        return step


ADAPTER = QwenCodeAdapter()
