"""OpenHands (V0) event-list trajectory JSON (``save_trajectory_path``, the UI download, a
``replay_trajectory_path`` file) into a Trajectory.

Format rules (sources: docs/native.md, from All-Hands-AI/OpenHands
openhands/events/serialization/event.py and openhands/events/tool.py; corpus files
``harbor_rfc_openhands_trajectory.json`` (OpenHands 0.58.0) and ``tests_runtime_trajs_*.json``):

- The document is a JSON list of events ``{id, timestamp, source, message, action |
  observation, args | (content, extras), cause, tool_call_metadata?}``, read in event-id order
  (a repeated id keeps the later event, warning ``duplicate_record``).
- ``action: "system"`` gives the system prompt (``args.content``) and the tool definitions
  (``args.tools``, OpenAI ``{type, function}``).
- Agent actions with ``tool_call_metadata`` are tool calls; the calls of one model response
  share ``model_response.id`` (``total_calls_in_response`` of them) and form one action. The
  exact arguments string comes from ``model_response.choices[0].message.tool_calls`` (matched
  by ``tool_call_id``); when absent, the event's ``args`` as compact JSON. The response's
  ``content`` is the action text. An agent ``message`` action without metadata is an action
  of its own (text only).
- Observations answer calls by ``tool_call_metadata.tool_call_id`` (else ``cause``); ``content``
  kept exactly; ``is_error`` True for ``observation: "error"``, else None. The ``finish``
  call expects no observation. User ``message`` actions: the first is the task, later ones
  observation messages. ``recall``, ``agent_state_changed``, ``null`` observations and
  environment events are left out.
- Version: ``args.openhands_version`` of the system event; files without one are read by shape.
- ``recall`` events stay left out. The user-side ``recall`` action is never sent to the model
  (``ConversationMemory._process_action`` returns no message for it). The ``recall``
  observation is: with ``enable_prompt_extensions`` (agent config, not in the file) it becomes
  a user message, but its text is rendered by OpenHands' prompt templates
  (``build_workspace_context`` / ``build_microagent_info``, ``additional_info.j2``,
  ``microagent_info.j2``) from the event's ``extras`` (repo, runtime hosts, date, working dir,
  microagent knowledge filtered by ``disabled_microagents``); none of that text is stored, and
  the event's ``content`` ("Added workspace context") is a UI note the model never saw
  (source: openhands/memory/conversation_memory.py ``_process_observation``). The exact
  message cannot be read from the file, so it is not invented: the left-out entry says so
  (kind ``observation/recall``, reason naming the unstored message).
- Refused (BadInputError, exit 65, naming the file and the shape expected, :data:`EXPECTED`):
  a file that is not one JSON document (empty, JSON Lines, nested too deep), a document that
  is not a list, an empty list, an item that is not an object, and a list whose first event
  has neither ``action`` nor ``observation`` (another agent's message list).
- The Harbor RFC sample ``harbor_rfc_openhands_trajectory.json`` is this format (a list of V0
  events from OpenHands 0.58.0, the input of Harbor's converter), not ATIF; an ATIF document
  (``{schema_version: "ATIF-v1.x", ...}``) is read by the ATIF reader (:mod:`.atif`); given
  to this adapter it is refused naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pvisor.core.errors import BadInputError
from pvisor.journal.model import Action, Message, Step, TextPart, ToolResult, ToolSpec, Trajectory

from .assembly import as_dict, as_list, as_str, compact_json, epoch_ms, left_out, order_results, string_call
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics, require
from .documents import read_document

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile(
    "openhands",
    0,
    58,
    "`args.openhands_version` of the system event (else by shape)",
    "0.58.0; replay tests of Jan 2025",
)

#: calls that end the run and never get an observation
_NO_RESULT = frozenset({"finish"})
#: the shape this adapter reads, named when it refuses a file
EXPECTED = (
    "an OpenHands V0 event list: a JSON array of {id, source, action | observation, args | content, ...} "
    "events"
)
#: why a recall observation is left out (module docstring)
_RECALL_REASON = (
    "workspace context / microagent knowledge: OpenHands sends the model a user message rendered from "
    "its prompt "
    "templates and this event's extras; that text is not stored in the file (`content` is a UI note)"
)


class _Events:
    """The events read in order (:meth:`event` dispatches by kind: the system event, a user
    action, an agent action, an observation): agent actions made steps (one per model response,
    its tool calls gathered), observations their results, user messages the task or observation
    messages."""

    def __init__(self, diag: Diagnostics) -> None:
        self.diag = diag
        self.traj = Trajectory()
        self.meta: dict[str, Any] = {"format": "openhands event list json", "task_context": []}
        self.steps: list[Step] = []
        self.by_response: dict[str, Step] = {}
        self.call_step: dict[str, Step] = {}
        self.version_seen = False

    def event(self, i: int, e: Any) -> None:
        """Event ``i``: BadInputError (exit 65) unless an object; then by kind."""
        where = f"event {e.get('id', i) if isinstance(e, dict) else i}"
        require(isinstance(e, dict), self.diag, where, "an event that is not an object")
        # a field of the wrong type reads as absent
        action, obs, source = (
            as_str(e.get("action")),
            as_str(e.get("observation")),
            as_str(e.get("source")),
        )
        tcm = as_dict(e.get("tool_call_metadata"))
        args = as_dict(e.get("args"))
        if action == "system":
            self.system(args, where)
        elif action is not None and source == "user":
            self.user(e, action, args, where)
        elif action is not None and source == "agent":
            self.agent(e, action, args, tcm, where)
        elif obs is not None:
            self.observation(e, obs, tcm, where)
        else:
            left_out(self.traj, where, "event", "an event that is neither action nor observation")

    def system(self, args: dict, where: str) -> None:
        """The system event: the system prompt, the tools, the version (checked)."""
        traj, meta = self.traj, self.meta
        traj.system = as_str(args.get("content"))
        tools = args.get("tools")
        if isinstance(tools, list):
            fns = [(t, as_dict(t.get("function"))) for t in tools if isinstance(t, dict)]
            traj.tools = [
                ToolSpec(
                    name=as_str(f.get("name")) or "",
                    description=as_str(f.get("description")),
                    parameters=f.get("parameters"),
                    raw=t,
                )
                for t, f in fns
            ]
        if args.get("openhands_version"):
            PROFILE.check(args["openhands_version"], where, self.diag)
            meta["agent_version"] = args["openhands_version"]
            self.version_seen = True
        meta["agent_class"] = args.get("agent_class")

    def user(self, e: dict, action: str, args: dict, where: str) -> None:
        """A user action: a message is the task or an observation message; others left out."""
        traj, steps = self.traj, self.steps
        if action != "message":
            left_out(
                traj,
                where,
                f"user/{action}",
                "a recall request: never sent to the model"
                if action == "recall"
                else "a user-side action that is not a message; not read by this profile",
            )
            return
        text = as_str(args.get("content")) or as_str(e.get("message")) or ""
        if not steps and traj.task is None:
            traj.task = text
        elif steps:
            steps[-1].observation.messages.append(Message("user", [TextPart(text)], raw=e))
        else:
            self.meta["task_context"].append(text)

    def agent(self, e: dict, action: str, args: dict, tcm: dict, where: str) -> None:
        """An agent action: a tool call of the step of its model response (made on its first
        call); a message without a call is a step of its own, other actions left out."""
        steps = self.steps
        if not tcm:
            if action == "message":
                steps.append(
                    Step(
                        n=len(steps) + 1,
                        action=Action(
                            text=as_str(args.get("content")) or as_str(e.get("message")) or "", raw=e
                        ),
                        time_ms=epoch_ms(e.get("timestamp")),
                    )
                )
            else:
                left_out(
                    self.traj,
                    where,
                    f"agent/{action}",
                    "an agent action without a tool call (state change)",
                )
            return
        resp = as_dict(tcm.get("model_response"))
        rid = as_str(resp.get("id")) or f"event-{e.get('id')}"
        choices = as_list(resp.get("choices"))
        choice = as_dict(choices[0]) if choices else {}
        msg = as_dict(choice.get("message"))
        step = self.by_response.get(rid)
        if step is None:
            content = msg.get("content")
            step = Step(
                n=len(steps) + 1,
                action=Action(
                    text=content if isinstance(content, str) else "",
                    model=as_str(resp.get("model")),
                    usage=resp.get("usage"),
                    stop_reason=as_str(choice.get("finish_reason")),
                    raw=resp,
                ),
                time_ms=epoch_ms(e.get("timestamp")),  # the first event of the model response
            )
            steps.append(step)
            self.by_response[rid] = step
        cid = as_str(tcm.get("tool_call_id"))
        raw_args = None
        for tc in as_list(msg.get("tool_calls")):
            if isinstance(tc, dict) and tc.get("id") == cid:
                raw_args = as_dict(tc.get("function")).get("arguments")
        if raw_args is None:
            raw_args = compact_json(args)
        call = string_call(cid, as_str(tcm.get("function_name")) or str(action), raw_args, raw=e)
        step.action.tool_calls.append(call)
        if cid:
            self.call_step[cid] = step

    def observation(self, e: dict, obs: str, tcm: dict, where: str) -> None:
        """An observation: the result of the tool call it answers; one that answers none is
        left out."""
        cid = as_str(tcm.get("tool_call_id"))
        step = self.call_step.get(cid) if cid else None
        if step is None:
            left_out(
                self.traj,
                where,
                f"observation/{obs}",
                _RECALL_REASON
                if obs == "recall"
                else "an observation that answers no tool call (state change, ...)",
            )
            return
        step.observation.results.append(
            ToolResult(
                cid,
                e.get("content"),
                is_error=True if obs == "error" else None,
                name=as_str(tcm.get("function_name")),
                raw=e,
            )
        )


class OpenHandsAdapter(NativeAdapter):
    name = "openhands"
    description = "OpenHands V0 trajectory: JSON list of events (save_trajectory_path)"
    profiles = (PROFILE,)
    #: ``tool_call_metadata.model_response.usage`` is LiteLLM's, in Chat Completions' shape
    usage_protocol = "openai-chat"

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        events = read_document(path, diag, EXPECTED)
        if isinstance(events, dict) and str(events.get("schema_version", "")).startswith("ATIF"):
            raise BadInputError(
                f"{diag.path}: document: a Harbor ATIF trajectory "
                f"({str(events['schema_version'])[:40]}), not "
                "an OpenHands event list; read it without --agent (detected), or with --agent atif"
            )
        require(
            isinstance(events, list),
            diag,
            "document",
            f"not an OpenHands trajectory: the document is not a JSON list of events; expected {EXPECTED}",
        )
        require(events, diag, "document", f"no events (an empty list); expected {EXPECTED}")
        reading = _Events(diag)
        traj, meta, steps = reading.traj, reading.meta, reading.steps
        events = self._ordered(events, diag)
        first = events[0]
        require(
            "action" in first or "observation" in first,
            diag,
            f"event {first.get('id', 0)}",
            f"not an OpenHands event: no `action` or `observation`; expected {EXPECTED}",
        )
        for i, e in enumerate(events):
            reading.event(i, e)
        if not reading.version_seen:
            meta["agent_version"] = None  # the replay-test files have no system event: read by shape
        for s in steps:
            order_results(s, diag, no_result=_NO_RESULT)
        traj.steps = steps
        traj.model = next((s.action.model for s in steps if s.action.model), None)
        traj.meta = meta
        return NativeResult(traj, PROFILE, diag)

    @staticmethod
    def _ordered(events: list[Any], diag: Diagnostics) -> list[Any]:
        """Events in event-id order (the stream's own ordinal, never ``timestamp``); an id seen
        twice keeps the later event (``duplicate_record``). Left as is when an id is not an int."""
        for i, e in enumerate(events):
            require(
                isinstance(e, dict),
                diag,
                f"events[{i}]",
                f"an event that is not a JSON object; expected {EXPECTED}",
            )
        if not all(isinstance(e.get("id"), int) and not isinstance(e.get("id"), bool) for e in events):
            return events
        by_id: dict[int, dict] = {}
        for e in events:
            if e["id"] in by_id:
                diag.warn(
                    "duplicate_record", f"event {e['id']}", "event id repeated; the later event is used"
                )
            by_id[e["id"]] = e
        return [by_id[k] for k in sorted(by_id)]


ADAPTER = OpenHandsAdapter()
