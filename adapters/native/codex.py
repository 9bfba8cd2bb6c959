"""Codex CLI rollout JSONL (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl``) into a Trajectory.

Format rules (sources: docs/native.md, from openai/codex
codex-rs/protocol/src/protocol.rs ``RolloutLine``/``RolloutItem``; corpus files
``real-0.171.0_single-then-resume.jsonl``, the 0.146.0 schema-coverage fixture and the
claude-code-log synthetic rollout):

- Each line is ``{"timestamp", "type", "payload"}``. Only ``response_item`` lines are the
  model-visible history (Responses-API items); ``event_msg`` lines are UI and telemetry copies
  and are left out, as are ``turn_context``, ``world_state`` and unknown types.
  ``session_meta`` gives the metadata, the version (``payload.cli_version``) and the system
  prompt (``payload.base_instructions.text``; None when absent). Tool definitions are not
  stored (``tools`` is None; ``meta["dynamic_tools"]`` when present).
- A file with neither a well-formed ``session_meta`` nor a ``response_item`` line is not a
  rollout: BadInputError (exit 65) naming the file and its first record's line.
- Order is file order: Codex appends items as they happen and stores no parent chain; the
  file position is the item's ordinal. Timestamps are never used to reorder.
- An action is a run of model-output items (``reasoning``, assistant ``message``,
  ``function_call``, ``custom_tool_call``, ``local_shell_call``, ``web_search_call``,
  ``tool_search_call``) in file order; it ends at the first input item (a call output, a
  user or developer message) or at a usage record (``token_usage_record``,
  ``event_msg/token_count``), which Codex writes once per model response.
- ``function_call.arguments`` is a JSON string, kept exactly; ``custom_tool_call.input`` is
  free text (kind ``custom``). Outputs (``*_call_output``) belong to the step whose action
  made the call with that ``call_id`` (an output written after a later action's items still
  answers its own call), else to the last step; they are put in call order; ``output`` kept
  exactly (a string, or a list/object in newer builds). Codex stores no error flag:
  ``is_error`` is None. A call with no output item whose end event (``exec_command_end``,
  ``item_completed`` of a ``CommandExecution``) carries its output takes that output
  (``output_from_event``), not an ``interrupted`` result; with both, an event's output not
  within the item's is ``output_differs`` (both digests), the item's kept.
- Duplicates: an item equal to an earlier one (a call with the same ``call_id`` and the same
  content; an output equal to an earlier output of that ``call_id`` when every call of the id
  has its output; a reasoning or assistant message item of the same model response) is a line
  written twice: the first is kept, the copy left out with ``duplicate_record`` (without it a
  repeated call reads as a second call, ``interrupted``). A repeated ``call_id`` with other
  content is a distinct call (fixtures with trimmed ids): ``duplicate_call_id``, and outputs
  are paired with the calls of that id in order of appearance (an output answers the first
  call of its id still without one, a call the provider runs last; an output for an id whose
  calls are all answered goes to the latest call's step, after its results, with
  ``duplicate_call_id``).
- A damaged record (a ``session_meta`` without a payload object, a ``response_item`` without
  a typed payload: a flipped byte in a key) is skipped with ``malformed_record``; the file is
  refused only when no well-formed rollout record is left.
- User and developer messages after an action are observation messages; before the first
  action the last user message is the task, everything else ``meta["task_context"]``.
- An output whose ``call_id`` no call of the file has (the line of that call was lost) is a
  gap step at its place: flag ``lost_action``, no action, the output its observation, a
  ``lost_action`` warning naming the line; the later steps keep their numbers (also when it
  is step 1's call: the output then comes before any action the file holds).
- ``compacted`` (with ``replacement_history``) replaces the history the model sees: the items
  of ``replacement_history`` become a :class:`~pvisor.journal.model.Compaction` after the step
  before it (every later request starts with them, the developer item and context included;
  the prefix renders them as recorded), the line is left out (``compaction``) and that step
  flagged ``compaction``. Without ``replacement_history`` (older builds) the file does not say
  what the model saw after it: the compaction is not rebuilt and a prefix after it is refused
  (``compaction_not_rebuilt``). The reply to Codex's own summary request is written
  as an ordinary assistant message just before the record: a lone message (no call) whose text
  ends the record's ``message`` is no step (left out, ``compaction_summary``). The base
  instructions Codex sends first are in no ``replacement_history``: the descriptor keeps the
  leading system message in front of it.

Memory (issue 6, "Scale"): the file is read twice. The first pass streams it and keeps per
step only the :class:`~.jsonl.LineRef` of its items, outputs, messages and usage record, plus
what the warnings need (call ids and names); every warning, ``task``, ``model``,
``left_out`` and ``meta`` are decided there. ``traj.steps`` is a :class:`~.assembly.LazySteps`
that reads a step's lines again when the step is used.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable

import orjson

from pvisor.adapters.protocols.base import TokenUsage, first_int
from pvisor.core.errors import BadInputError
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

from .assembly import LazySteps, as_dict, as_list, as_str, epoch_ms, left_out, string_call, text_of
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics
from .jsonl import JsonlSource, LineRef, iter_json_records

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile("codex", 0, 171, "`session_meta.payload.cli_version`", "0.146.0 (fixture), 0.171.0")

_OUTPUT_ITEMS = {
    "reasoning",
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "web_search_call",
    "tool_search_call",
    "image_generation_call",
}
_RESULT_ITEMS = {
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "tool_search_call_output",
}


class _Plan:
    """What the first pass keeps of one step: refs of its action's output items, of the usage
    record (None when none gave usage), of its outputs and observation messages (file order),
    and the flags set while reading (``compaction``; ``interrupted`` is re-derived). Kept for
    every step of the file: ``messages`` and ``flags`` stay the shared ``()`` while empty."""

    __slots__ = ("n", "items", "usage", "results", "messages", "flags")

    def __init__(self, n: int) -> None:
        self.n = n
        self.items: list[LineRef] = []
        self.usage: LineRef | None = None
        self.results: list[LineRef] = []
        self.messages: tuple[LineRef, ...] | list[LineRef] = ()
        self.flags: tuple[str, ...] = ()


class _Call:
    """One tool call as the first pass keeps it: its id, whether the provider runs it
    (``server``: no output expected), its line (``n``) and ref, the index of its step, the ref
    of the output paired with it (None while none is), and the next call with the same id
    (``same``: ids are unique in a well-formed file, so the chain is almost always one long)."""

    __slots__ = ("id", "server", "n", "ref", "step", "output", "same")

    def __init__(self, call_id: str | None, server: bool, n: int, ref: LineRef, step: int) -> None:
        self.id = call_id
        self.server = server
        self.n = n
        self.ref = ref
        self.step = step
        self.output: LineRef | None = None
        self.same: _Call | None = None


def _chain(first: _Call | None):
    while first is not None:
        yield first
        first = first.same


def _add_output(action: Action, payload: dict) -> None:
    """Add one model-output item to ``action`` (text, reasoning or a tool call)."""
    t = payload["type"]
    action.raw.append(payload)
    if t == "message":
        action.text += text_of(payload.get("content"))
    elif t == "reasoning":
        summary = "".join(
            as_str(s.get("text")) or "" for s in as_list(payload.get("summary")) if isinstance(s, dict)
        )
        action.reasoning.append(
            Reasoning(text=summary, encrypted=as_str(payload.get("encrypted_content")), raw=payload)
        )
    elif t == "function_call":
        action.tool_calls.append(
            string_call(
                as_str(payload.get("call_id")),
                as_str(payload.get("name")) or "",
                payload.get("arguments") or "",
                raw=payload,
            )
        )
    elif t == "custom_tool_call":
        call = string_call(
            as_str(payload.get("call_id")),
            as_str(payload.get("name")) or "",
            payload.get("input") or "",
            raw=payload,
            kind="custom",
        )
        call.arguments = None
        action.tool_calls.append(call)
    elif t == "local_shell_call":
        action.tool_calls.append(
            string_call(
                as_str(payload.get("call_id")), "local_shell", payload.get("action") or {}, raw=payload
            )
        )
    else:  # provider-side calls (web search, tool search)
        call = string_call(
            as_str(payload.get("call_id")) or as_str(payload.get("id")),
            t,
            payload.get("action") or payload.get("arguments") or {},
            raw=payload,
        )
        call.kind = "server"
        action.tool_calls.append(call)


def _call_head(payload: dict) -> tuple[str | None, str, str]:
    """(call id, name, kind) of an output item as :func:`_add_output` would make its call."""
    t = payload["type"]
    if t == "function_call":
        return as_str(payload.get("call_id")), as_str(payload.get("name")) or "", "function"
    if t == "custom_tool_call":
        return as_str(payload.get("call_id")), as_str(payload.get("name")) or "", "custom"
    if t == "local_shell_call":
        return as_str(payload.get("call_id")), "local_shell", "function"
    return as_str(payload.get("call_id")) or as_str(payload.get("id")), t, "server"


def _usage(obj: dict) -> Any:
    """The usage a usage record gives its action, or None when it gives none."""
    payload = obj.get("payload")
    if not isinstance(payload, dict):
        return None
    info = payload.get("info") if obj.get("type") == "event_msg" else payload
    if isinstance(info, dict):
        return info.get("last_token_usage") or info
    return None


#: the fields of ``session_meta.payload`` kept in ``meta``, in this order
_SESSION_FIELDS = ("id", "cwd", "originator", "cli_version", "source", "model_provider", "forked_from_id")


class _Reading:
    """One pass over a rollout: each record handled by its ``type`` (:meth:`scan` dispatches),
    the steps' plans (``plans``) and calls (``calls``, per step in order, for the
    ``interrupted`` warnings) kept as line refs, the task and its context, what was left out."""

    def __init__(self, path: Path) -> None:
        self.traj = Trajectory()
        self.meta: dict[str, Any] = {"format": "codex rollout jsonl", "task_context": []}
        self.plans: list[_Plan] = []
        self.calls: list[list[_Call]] = []
        self.in_action = False  # an action is being read (its response not ended)
        self.context: list[str] = []
        self.version_seen = False
        self.first: tuple[int, Any] | None = (
            None  # the first record's line and type, for the missing-shape error
        )
        self.rollout = False  # a session_meta or response_item line was seen
        self.source = JsonlSource(path)
        # call id -> its first call (the others of the id chained by ``same``): an output goes to
        # the step of the first call of its id still without one; an exact repeat of a call is a duplicate
        self.by_id: dict[str, _Call] = {}
        self.strays: dict[str, LineRef] = {}  # call id of no call -> its first output's ref
        # the reasoning and message items of the action being read (one model response), to see
        # one written twice
        self.said: list[dict] = []
        # call id -> (line, ref) of the event_msg records that end a command of that id, in file
        # order: the output of a call whose function_call_output line is missing
        self.events: dict[str, list[tuple[int, LineRef]]] = {}

    def scan(self, path: Path, diag: Diagnostics) -> None:
        """Read every record of ``path``; then BadInputError (exit 65) when none has the rollout's
        shape, ``no_version`` when no ``session_meta`` gave one, and the ``interrupted`` warnings."""
        # a local table: bound methods kept on self would make a reference cycle
        handlers: dict[str, Callable[[int, Any, Any, dict, LineRef, Diagnostics], None]] = {
            "session_meta": self.session_meta,
            "turn_context": self.turn_context,
            "token_usage_record": self.usage,
            "compacted": self.compacted,
            "response_item": self.response_item,
        }
        for n, obj, ref in iter_json_records(path, diag):
            kind = obj.get("type")
            payload = obj.get("payload")
            if self.first is None:
                self.first = (n, kind)
            if kind == "event_msg":  # a token count is a usage record, any other event a UI record
                is_usage = isinstance(payload, dict) and payload.get("type") == "token_count"
                handler = self.usage if is_usage else self.other
                event_id = _event_call_id(payload)
                if event_id is not None:
                    self.events.setdefault(event_id, []).append((n, ref))
            else:
                handler = handlers.get(kind) if isinstance(kind, str) else None
            (handler or self.other)(n, kind, payload, obj, ref, diag)
        if not self.rollout:
            what = (
                "required record shape missing: no Codex rollout record (type session_meta/response_item) in "
                "the file"
            )
            if self.first is None:
                raise BadInputError(f"{diag.path}: {what} (no JSON object in it)")
            raise BadInputError(
                f"{diag.path}: line {self.first[0]}: {what}; the first record has type {self.first[1]!r}"
            )
        if not self.version_seen:
            PROFILE.check(None, "file", diag)
        used: set[str] = set()  # "line N" of the events that stand for a missing output
        for plan, step_calls in zip(self.plans, self.calls):
            used.update(_outputs_from_events(plan, step_calls, self.events, self.source, diag))
            _warn_interrupted(plan.n, step_calls, plan.results, self.source, diag)
        if used:  # an event read as a call's output is no longer left out
            self.traj.left_out = [x for x in self.traj.left_out if x.where not in used]
        self.meta["task_context"] = self.context

    def session_meta(
        self, n: int, kind: Any, payload: Any, obj: dict, ref: LineRef, diag: Diagnostics
    ) -> None:
        """The session's fields, its system prompt and dynamic tools; the version checked once."""
        traj, meta = self.traj, self.meta
        if not isinstance(payload, dict):
            _malformed(traj, diag, n, "session_meta without a payload object")
            return
        self.rollout = True
        if not self.version_seen:
            PROFILE.check(payload.get("cli_version"), f"line {n}", diag)
            self.version_seen = True
        meta.update({k: payload[k] for k in _SESSION_FIELDS if k in payload})
        bi = as_dict(payload.get("base_instructions"))
        if isinstance(bi, dict) and isinstance(bi.get("text"), str):
            traj.system = bi["text"]
        if payload.get("dynamic_tools"):
            meta["dynamic_tools"] = payload["dynamic_tools"]

    def turn_context(
        self, n: int, kind: Any, payload: Any, obj: dict, ref: LineRef, diag: Diagnostics
    ) -> None:
        """The turn's settings: its model noted, the record left out."""
        if not isinstance(payload, dict):
            self.other(n, kind, payload, obj, ref, diag)
            return
        traj, meta = self.traj, self.meta
        if isinstance(payload.get("model"), str):
            traj.model = traj.model or payload["model"]
            meta.setdefault("models", [])
            if payload["model"] not in meta["models"]:
                meta["models"].append(payload["model"])
        left_out(traj, f"line {n}", "turn_context", "turn settings, not model input")

    def usage(self, n: int, kind: Any, payload: Any, obj: dict, ref: LineRef, diag: Diagnostics) -> None:
        """A usage record: the usage of the action being read, which it ends."""
        if self.in_action and _usage(obj) is not None:
            self.plans[-1].usage = ref
        self.in_action, self.said = False, []
        left_out(
            self.traj,
            f"line {n}",
            str(kind if kind != "event_msg" else "event_msg/token_count"),
            "usage record (ends a model response)",
        )

    def compacted(self, n: int, kind: Any, payload: Any, obj: dict, ref: LineRef, diag: Diagnostics) -> None:
        """A ``compacted`` record: the step before flagged ``compaction``, its replacement history a
        compaction; the reply to Codex's own summary request is no step."""
        traj, plans, calls = self.traj, self.plans, self.calls
        message = as_str(as_dict(payload).get("message"))
        if plans and message and _is_summary_reply(plans[-1], calls[-1], message, self.source):
            # the reply to Codex's own summary request: no step of the main loop
            plans.pop()
            calls.pop()
            left_out(
                traj,
                f"line {n}",
                "compaction_summary",
                "the assistant message before this compacted record is the model's "
                "summary (its text ends the record's message), not a main-loop step",
            )
        if plans and "compaction" not in plans[-1].flags:
            plans[-1].flags += ("compaction",)
        history = as_dict(payload).get("replacement_history")
        if isinstance(history, list):
            _compaction(traj, plans, history, as_str(as_dict(payload).get("message")), n, diag)
            reason = (
                "compacted history: its replacement_history is what the model sees from here on (trajectory "
                "compactions); the step before is flagged"
            )
        else:
            if plans:
                traj.compactions.append(
                    Compaction(len(plans), [], "compacted", f"line {n}", message, rebuilt=False)
                )
            reason = (
                "compacted history without replacement_history: what the model saw after it is not in the "
                "file; flagged on the step before"
            )
        left_out(traj, f"line {n}", "compaction", reason)
        self.in_action, self.said = False, []

    def other(self, n: int, kind: Any, payload: Any, obj: dict, ref: LineRef, diag: Diagnostics) -> None:
        """Any other record: UI or telemetry, left out (``unknown_record`` unless an event or world
        state)."""
        sub = payload.get("type") if isinstance(payload, dict) else None
        if kind not in ("event_msg", "world_state"):
            diag.warn("unknown_record", f"line {n}", f"record type {kind!r} left out")
        left_out(
            self.traj,
            f"line {n}",
            sys.intern(f"{kind}/{sub}") if sub else str(kind),
            "UI or telemetry record, not model-visible history",
        )

    def response_item(
        self, n: int, kind: Any, payload: Any, obj: dict, ref: LineRef, diag: Diagnostics
    ) -> None:
        """A ``response_item``: a model output goes to the action being read; an input item (a
        call's output, a message) ends it."""
        if not (isinstance(payload, dict) and isinstance(payload.get("type"), str)):
            _malformed(self.traj, diag, n, "response_item without a typed payload")
            return
        self.rollout = True
        t = payload["type"]
        call_id = as_str(payload.get("call_id"))
        if t in _OUTPUT_ITEMS or (t == "message" and payload.get("role") == "assistant"):
            self.output_item(n, t, call_id, payload, ref, diag)
            return
        owner: _Call | None = None  # for an output: the call it answers
        if t in _RESULT_ITEMS and call_id is not None:
            repeated, owner = self.owner(n, t, call_id, payload, ref, diag)
            if repeated:
                return
        # an input item ends the action
        self.in_action, self.said = False, []
        if t in _RESULT_ITEMS:
            if owner is not None and self.plans:  # the usual output, without a call: as output_of_call
                self.plans[owner.step].results.append(ref)
            else:
                self.output_of_call(n, t, call_id, owner, ref, diag)
        elif t == "message":
            self.input_message(payload, ref)
        else:
            left_out(self.traj, f"line {n}", f"response_item/{t}", "item type not read into the trajectory")

    def output_item(
        self, n: int, t: str, call_id: str | None, payload: dict, ref: LineRef, diag: Diagnostics
    ) -> None:
        """A model output item (text, reasoning, a call) added to the action being read, which it
        starts when none is; an exact repeat is left out, a call reusing an id warned."""
        plans, calls, by_id = self.plans, self.calls, self.by_id
        if t == "message" or t == "reasoning":
            if self.in_action and payload in self.said:
                _duplicate(self.traj, diag, n, t, "an earlier line of the same response")
                return
            self.said.append(payload)
        elif call_id is not None and call_id in by_id:
            if any(self.source.load(c.ref).get("payload") == payload for c in _chain(by_id[call_id])):
                _duplicate(self.traj, diag, n, f"{t} {call_id}", "an earlier line")
                return
        if not self.in_action:
            self.in_action = True
            plans.append(_Plan(len(plans) + 1))
            calls.append([])
        plans[-1].items.append(ref)
        if t == "message" or t == "reasoning":
            return
        head_id, _, head_kind = _call_head(payload)
        call = _Call(head_id, head_kind == "server", n, ref, len(plans) - 1)
        calls[-1].append(call)
        if call_id is None:
            return
        prev = by_id.get(call_id)
        if prev is None:
            by_id[call_id] = call
        else:
            *_, last = _chain(prev)
            last.same = call
            diag.warn(
                "duplicate_call_id",
                f"line {n}",
                f"{t} {call_id} shares its id with the call at line {prev.n} "
                "(other content); outputs paired with the calls of the id in order of appearance",
            )

    def owner(
        self, n: int, t: str, call_id: str, payload: dict, ref: LineRef, diag: Diagnostics
    ) -> tuple[bool, _Call | None]:
        """(an exact repeat of an earlier output: left out, the call a call's output answers):
        the first call of the id without an output; with none, the last call of the id
        (``duplicate_call_id`` warned); None for an id no call has."""
        if call_id in self.by_id:
            chain = list(_chain(self.by_id[call_id]))
            # the first call of the id without an output; a call the provider runs
            # (a tool search) only when no other call of the id waits for one
            owner = next((c for c in chain if c.output is None and not c.server), None) or next(
                (c for c in chain if c.output is None), None
            )
            if owner is None and any(
                self.source.load(c.output).get("payload") == payload for c in chain if c.output is not None
            ):
                _duplicate(self.traj, diag, n, f"{t} {call_id}", "an earlier line")
                return True, None
            if owner is None:
                diag.warn(
                    "duplicate_call_id",
                    f"line {n}",
                    f"{t} {call_id}: every call of the id (last at line {chain[-1].n}) has its output; "
                    "this one is kept after the last call's step results",
                )
                owner = chain[-1]
            else:
                owner.output = ref
            return False, owner
        if call_id in self.strays:
            if self.source.load(self.strays[call_id]).get("payload") == payload:
                _duplicate(self.traj, diag, n, f"{t} {call_id}", "an earlier line")
                return True, None
        return False, None

    def output_of_call(
        self, n: int, t: str, call_id: str | None, owner: _Call | None, ref: LineRef, diag: Diagnostics
    ) -> None:
        """A call's output, a result of the step whose action made the call; the output of a call
        no line holds makes a gap step (``lost_action``)."""
        plans = self.plans
        if owner is None and call_id is not None and call_id not in self.strays:
            # the output of a call no line holds: the line of that action was lost. A gap
            # step stands at its place, so that the later steps keep their numbers (step 1's
            # too: the output then comes before any action the file holds)
            self.strays[call_id] = ref
            gap = _Plan(len(plans) + 1)
            gap.flags = ("lost_action",)
            plans.append(gap)
            self.calls.append([])
            diag.warn(
                "lost_action",
                f"line {n}",
                f"{t} {call_id} answers a call no line of the file holds: "
                f"the action of step {gap.n} was lost; a gap step stands at its place",
            )
            gap.results.append(ref)
            return
        if not plans:
            left_out(self.traj, f"line {n}", t, "a call output before any action")
            return
        # the step whose action made the call, not the step being read (a late output)
        plans[owner.step if owner is not None else len(plans) - 1].results.append(ref)

    def input_message(self, payload: dict, ref: LineRef) -> None:
        """A message that is not the model's: before the first action the task (the last user
        message) or its context; after it an observation message of the last step."""
        plans = self.plans
        if not plans:
            role = as_str(payload.get("role")) or "user"
            texts = [text_of([b]) for b in as_list(payload.get("content")) if isinstance(b, dict)]
            if role == "user":
                if self.traj.task is not None:
                    self.context.append(self.traj.task)
                self.traj.task = texts[-1] if texts else ""
                self.context.extend(texts[:-1])
            else:
                self.context.extend(texts)
            return
        if plans[-1].messages:
            plans[-1].messages.append(ref)  # type: ignore[union-attr]
        else:
            plans[-1].messages = [ref]


#: the longest first line read for a rollout's ``session_meta`` (its base instructions run to
#: tens of kilobytes); a longer one is not looked at
_META_LINE_MAX = 1 << 20


def _spawned_by(path: str) -> tuple[str, str] | None:
    """(session id, parent thread id) of a subagent's rollout, from its first line's
    ``session_meta``; None for another file, a root session or a line that is not JSON."""
    try:
        with open(path, "rb") as f:
            first = orjson.loads(f.readline(_META_LINE_MAX))
    except (OSError, orjson.JSONDecodeError):
        return None
    payload = as_dict(first.get("payload")) if isinstance(first, dict) else {}
    if not isinstance(first, dict) or first.get("type") != "session_meta":
        return None
    spawn = as_dict(as_dict(as_dict(payload.get("source")).get("subagent")).get("thread_spawn"))
    parent = as_str(spawn.get("parent_thread_id")) or as_str(payload.get("parent_thread_id"))
    sid = as_str(payload.get("id"))
    return (sid, parent) if sid and parent else None


class CodexAdapter(NativeAdapter):
    name = "codex"
    description = "Codex CLI rollout JSONL ($CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl)"
    profiles = (PROFILE,)

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """A ``token_count`` event's ``last_token_usage``, or a ``token_usage_record``'s payload
        (its ``usage``), each ``{input_tokens, cached_input_tokens, cache_write_input_tokens?,
        output_tokens, reasoning_output_tokens, total_tokens}``: Codex counts as the Responses
        API does, the cached tokens within ``input_tokens`` and the reasoning ones within
        ``output_tokens`` (``total_tokens`` is input plus output)."""
        if isinstance(usage, dict) and isinstance(usage.get("usage"), dict):
            usage = usage["usage"]
        if not isinstance(usage, dict):
            return TokenUsage()
        return TokenUsage(
            input_tokens=first_int(usage.get("input_tokens")),
            cached_input_tokens=first_int(usage.get("cached_input_tokens")),
            cache_creation_input_tokens=first_int(usage.get("cache_write_input_tokens")),
            output_tokens=first_int(usage.get("output_tokens")),
            reasoning_tokens=first_int(usage.get("reasoning_output_tokens")),
        )

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """The records read by type (:class:`_Reading`); steps built lazily from the plans."""
        r = _Reading(path)
        r.scan(path, diag)
        traj, source = r.traj, r.source
        traj.steps = LazySteps(r.plans, lambda plan: _build(plan, source))
        traj.meta = r.meta
        return NativeResult(traj, PROFILE, diag)

    def subagent_files(self, path: Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
        """The rollouts ``rollout-*.jsonl`` beside ``path`` (same directory) whose
        ``session_meta`` says they are a subagent this session spawned:
        ``payload.source.subagent.thread_spawn.parent_thread_id`` (or
        ``payload.parent_thread_id``) is its ``id``. ``agent_id``: the subagent's session id.
        Only the first line of each is read (at most 1 MiB); one that cannot be read is
        skipped."""
        session = meta.get("id")
        if not isinstance(session, str):
            return []
        found = []
        folder = os.path.dirname(os.path.abspath(path))
        for name in sorted(os.listdir(folder)):
            other = os.path.join(folder, name)
            rollout = name.startswith("rollout-") and name.endswith(".jsonl")
            if not rollout or os.path.samefile(other, path):
                continue
            child = _spawned_by(other)
            if child is not None and child[1] == session:
                found.append({"path": other, "agent_id": child[0]})
        return found


def _is_summary_reply(plan: _Plan, step_calls: list, message: str, source: JsonlSource) -> bool:
    """Whether the step just read is the reply to the summary request: one assistant message,
    no call, no output, whose text the ``compacted`` record's message ends with (Codex writes
    the reply as an ordinary item before the record; the request itself is never written)."""
    if step_calls or plan.results or plan.messages or len(plan.items) != 1:
        return False
    item = as_dict(source.load(plan.items[0]).get("payload"))
    if item.get("type") != "message" or item.get("role") != "assistant":
        return False
    text = "".join(as_str(b.get("text")) or "" for b in as_list(item.get("content")) if isinstance(b, dict))
    return bool(text.strip()) and message.rstrip().endswith(text.strip())


def _compaction(
    traj: Trajectory, plans: list[_Plan], history: list[Any], message: str | None, n: int, diag: Diagnostics
) -> None:
    """A ``compacted`` record's ``replacement_history`` as a :class:`Compaction` after the
    current step: the items read as Responses input (each message keeps its item as ``raw``, so
    the render sends it as recorded, without the file-only key); the observation messages
    written after the record follow the history. An item that is not an object is left out of
    the history with ``malformed_record`` (the render would send what the agent did not)."""
    from pvisor.adapters.protocols import get_protocol

    items = [i for i in history if isinstance(i, dict)]
    if len(items) != len(history):
        diag.warn(
            "malformed_record",
            f"line {n}",
            f"replacement_history holds {len(history) - len(items)} item(s) that are not objects: left out",
        )
    try:
        msgs = get_protocol("openai-responses").parse_request({"input": items}).messages
    except BadInputError as exc:
        diag.warn(
            "malformed_record",
            f"line {n}",
            f"replacement_history is not Responses input ({exc.message}): the compaction is not used",
        )
        return
    after = len(plans)
    taken = len(plans[-1].messages) if plans else 0
    traj.compactions.append(
        Compaction(
            after_step=after,
            history=msgs,
            kind="compacted",
            where=f"line {n}",
            summary=message or None,
            messages_from=taken,
        )
    )


def _duplicate(traj: Trajectory, diag: Diagnostics, n: int, what: str, first: str) -> None:
    diag.warn("duplicate_record", f"line {n}", f"{what} repeats {first} exactly; one copy kept")
    left_out(traj, f"line {n}", "duplicate", f"an exact copy of {first}")


def _malformed(traj: Trajectory, diag: Diagnostics, n: int, what: str) -> None:
    diag.warn("malformed_record", f"line {n}", f"{what}; skipped")
    left_out(traj, f"line {n}", "malformed", what)


#: the ``event_msg`` payload types that end a command and carry its output (the UI's copy)
_COMMAND_EVENTS = ("exec_command_end", "item_completed")


def _event_call_id(payload: Any) -> str | None:
    """The call id of an ``event_msg`` payload that ends a command and carries its output
    (``exec_command_end`` with ``call_id``; ``item_completed`` of an item of type
    ``CommandExecution``, whose ``id`` is the call id), else None."""
    if not isinstance(payload, dict) or payload.get("type") not in _COMMAND_EVENTS:
        return None
    if payload["type"] == "item_completed":
        item = as_dict(payload.get("item"))
        if item.get("type") != "CommandExecution" or _event_output(payload) is None:
            return None
        return as_str(item.get("id"))
    return as_str(payload.get("call_id")) if _event_output(payload) is not None else None


def _event_output(payload: dict) -> str | None:
    """The output text a command's end event carries: ``formatted_output`` (the text formatted
    for the model, in the builds that write it), else ``aggregated_output`` (stdout and stderr
    as they came), else ``stdout`` then ``stderr``; None when it carries none."""
    body = as_dict(payload.get("item")) if payload.get("type") == "item_completed" else payload
    for key in ("formatted_output", "aggregated_output"):
        if isinstance(body.get(key), str):
            return body[key]
    out, err = as_str(body.get("stdout")), as_str(body.get("stderr"))
    if out is None and err is None:
        return None
    return (out or "") + (err or "")


def _output_text(output: Any) -> str:
    """A ``function_call_output``'s output as text to compare: the string, else compact JSON."""
    return (
        output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, separators=(",", ":"))
    )


def _sha256(text: str) -> str:
    import hashlib  # only for a damaged file: a short command's start does not load it

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _outputs_from_events(
    plan: _Plan,
    step_calls: list[_Call],
    events: dict[str, list[tuple[int, LineRef]]],
    source: JsonlSource,
    diag: Diagnostics,
) -> list[str]:
    """The end events of step ``plan.n``'s commands against their outputs. A call whose
    ``function_call_output`` line is missing but whose end event (``exec_command_end``,
    ``item_completed``) carries its output completed: the event's output is its result
    (``output_from_event``: the UI's copy, which may lack the header the model was sent), not an
    ``interrupted`` observation. A call with both whose outputs disagree (the event's output is
    not within the item's) keeps the item's, the model-visible one, with ``output_differs``
    naming the event's line and both SHA-256 digests. Returns where (``"line N"``) the events
    read as outputs are."""
    used: list[str] = []
    if not events:
        return used
    paired = {id(c.output) for c in step_calls if c.output is not None}
    left = [r for r in plan.results if id(r) not in paired]
    left_ids = [as_str(source.load(r)["payload"].get("call_id")) for r in left] if left else []
    for c in step_calls:
        if c.server or c.id is None or not events.get(c.id):
            continue
        line, ref = events[c.id].pop(0)
        event_text = _event_output(source.load(ref)["payload"]) or ""
        if c.output is None and c.id not in left_ids:
            c.output = ref
            plan.results.append(ref)
            used.append(f"line {line}")
            diag.warn(
                "output_from_event",
                f"line {line}",
                f"tool call {c.id} of step {plan.n} has no function_call_output line; its output is taken "
                f"from this event_msg (the UI's copy, sha256 {_sha256(event_text)}), not flagged interrupted",
            )
            continue
        if c.output is None:
            continue
        item = source.load(c.output)["payload"]
        item_text = _output_text(item.get("output"))
        if event_text not in item_text:
            diag.warn(
                "output_differs",
                f"line {line}",
                f"tool call {c.id} of step {plan.n}: this event_msg's output (sha256 {_sha256(event_text)}) "
                f"is not in its function_call_output's (sha256 {_sha256(item_text)}); the "
                "function_call_output, which the model was sent, is used",
            )
    return used


def _warn_interrupted(
    n: int, step_calls: list[_Call], results: list[LineRef], source: JsonlSource, diag: Diagnostics
) -> None:
    """The ``interrupted`` warnings :func:`_order` gives step ``n`` (built later, without
    warnings): a call (not run by the provider) that no output of the step answers. Outputs
    paired by the first pass answer their call; the others (an output of no call, of an id
    whose call is in another step) are matched by id as :func:`_order` does. The call's name
    and a stray output's id are read again from their lines only then."""
    paired = {id(c.output) for c in step_calls if c.output is not None}
    left = [r for r in results if id(r) not in paired]
    left_ids = [as_str(source.load(r)["payload"].get("call_id")) for r in left] if left else []
    for c in step_calls:
        if c.output is not None:
            continue
        if c.id in left_ids:
            left_ids.remove(c.id)
        elif not c.server:
            name = _call_head(source.load(c.ref)["payload"])[1]
            diag.warn("interrupted", f"step {n}", f"tool call {c.id} ({name}) has no result in the file")


def _build(plan: _Plan, source: JsonlSource) -> Step:
    """Step ``plan.n`` from its lines, read again through ``source``."""
    action = Action(raw=[])
    step = Step(n=plan.n, action=action, flags=list(plan.flags))
    for ref in plan.items:
        record = source.load(ref)
        if step.time_ms is None:  # the line of the reply's first item
            step.time_ms = epoch_ms(record.get("timestamp"))
        _add_output(action, record["payload"])
    if plan.usage is not None:
        action.usage = _usage(source.load(plan.usage))
    for ref in plan.results:
        payload = source.load(ref)["payload"]
        event_id = _event_call_id(payload)
        if event_id is not None:  # a command's end event stands for its missing output item
            result = ToolResult(event_id, _event_output(payload), is_error=None, raw=payload)
        else:
            result = ToolResult(
                as_str(payload.get("call_id")), payload.get("output"), is_error=None, raw=payload
            )
        step.observation.results.append(result)
    for ref in plan.messages:
        payload = source.load(ref)["payload"]
        role = as_str(payload.get("role")) or "user"
        texts = [text_of([b]) for b in as_list(payload.get("content")) if isinstance(b, dict)]
        step.observation.messages.append(Message(role, [TextPart(x) for x in texts], raw=payload))
    _order(step)  # its warnings were given by the first pass
    return step


def _order(step: Step) -> None:
    """:func:`~.assembly.order_results` pairing by id in order of appearance, as the first pass
    pairs: with two calls of one id, the first of the step's results with that id (file order)
    answers the first call, the next the second (``order_results`` keeps one result per id);
    calls the provider runs (kind ``server``) take a result only after the others. A call
    without a result gets an empty one marked ``{"interrupted": True}`` (none for a server
    call) and the step the flag ``interrupted``. Results that answer no call are kept, after."""
    left = list(step.observation.results)
    calls = step.action.tool_calls
    got: list[ToolResult | None] = [None] * len(calls)
    for server in (False, True):
        for i, call in enumerate(calls):
            if (call.kind == "server") == server:
                j = next((j for j, x in enumerate(left) if x.call_id == call.id), None)
                if j is not None:
                    got[i] = left.pop(j)
    ordered = []
    for call, r in zip(calls, got):
        if r is None:
            if call.kind == "server":
                continue
            r = ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
            if "interrupted" not in step.flags:
                step.flags.append("interrupted")
        ordered.append(r)
    step.observation.results = ordered + left


ADAPTER = CodexAdapter()
