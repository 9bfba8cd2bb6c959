"""SWE-agent trajectory (``<instance>/<instance>.traj``) into a Trajectory.

Format rules (sources: docs/native.md, from SWE-agent/SWE-agent
sweagent/types.py ``HistoryItem``/``TrajectoryStep`` and docs/usage/trajectories.md; corpus files
``demo_function_calling_*.traj`` (1.x, function calling) and ``test_data_gpt4_*.traj`` (0.x,
real gpt-4 runs, text actions)):

- The document is ``{environment, trajectory, history, info, replay_config}`` (a demonstration
  may hold ``history`` only). ``history`` is the conversation the model saw, in order: it is
  what this adapter reads. ``trajectory[]`` repeats it per step (``action``, ``observation``,
  ``response``, ``thought``, ``query``) and is not read again.
- ``history`` items: ``{role, content, agent, message_type?, tool_calls?, tool_call_ids?,
  is_demo?, thought?, action?}``. Items of another ``agent`` than the main one (``main`` in 1.x,
  ``primary`` in 0.x) are left out.
- The first ``system`` item is the system prompt; ``user`` items with ``is_demo`` (the
  demonstration sent with the prompt) go to ``meta["task_context"]``; the first other
  ``user`` item is the task.
- Each ``assistant`` item is an action: ``content`` text; ``tool_calls`` in the OpenAI shape
  (``function.arguments`` a JSON string, kept exactly; SWE-agent allows exactly one per reply).
  0.x replies carry the command in the text (``action`` field): no tool call, as in the request.
- ``tool`` items answer by ``tool_call_ids`` (call ids repeat across steps in the demos: a
  result goes to the latest call with that id); ``user`` items after an action are
  observation messages. No error flag is stored: ``is_error`` None.
- The ``submit`` command ends the run: its observation (the diff) is in the file but the model
  never saw it: the last step is flagged ``submitted`` and ``observation_not_sent``.
- Tool definitions are not stored (they come from the config's tool bundles): ``tools`` None.
- No format version is stored: read by shape (``info.swe_agent_version`` recorded when present).
- Refused (BadInputError, exit 65, naming the file and the shape expected, :data:`EXPECTED`):
  a file that is not one JSON document (empty, JSON Lines, nested too deep), a document
  without a ``history`` list or with an empty one, an item that is not an object with a role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pvisor.journal.model import Action, Message, Step, TextPart, ToolResult, Trajectory

from .assembly import as_dict, as_list, as_str, left_out, string_call, text_of
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics, require
from .documents import read_document

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile(
    "swe-agent",
    1,
    0,
    "by shape (`history` of role/content items; no format version stored)",
    "0.x test data, 1.x demonstrations",
    by_shape=True,
)

_MAIN_AGENTS = (None, "main", "primary")
#: the shape this adapter reads, named when it refuses a file
EXPECTED = "a SWE-agent .traj: a JSON object {history: [{role, content, agent}, ...], trajectory, info}"


class SweAgentAdapter(NativeAdapter):
    name = "swe-agent"
    description = "SWE-agent .traj (history of model messages), function-calling and text actions"
    profiles = (PROFILE,)

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """Read ``path``; raises BadInputError (65) naming ``history[i]`` for an item that is
        not an object with a role."""
        doc = read_document(path, diag, EXPECTED, arrays=("history", "trajectory"))
        require(
            isinstance(doc, dict) and isinstance(doc.get("history"), list),
            diag,
            "document",
            f"not a SWE-agent trajectory: no `history` list; expected {EXPECTED}",
        )
        require(doc["history"], diag, "history", f"no history items (an empty list); expected {EXPECTED}")
        info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
        traj = Trajectory()
        meta: dict[str, Any] = {
            "format": "swe-agent traj",
            "task_context": [],
            "exit_status": info.get("exit_status"),
            "agent_version": info.get("swe_agent_version"),
        }
        steps: list[Step] = []
        call_step: dict[str, Step] = {}
        for i, h in enumerate(doc["history"]):
            where = f"history[{i}]"
            require(
                isinstance(h, dict) and isinstance(h.get("role"), str),
                diag,
                where,
                f"not a SWE-agent history item: no role; expected {EXPECTED}",
            )
            role = h["role"]
            if as_str(h.get("agent")) not in _MAIN_AGENTS:
                left_out(traj, where, f"agent/{h.get('agent')}", "an item of another agent than the main one")
                continue
            if role == "system" and not steps and traj.system is None:
                traj.system = text_of(h.get("content"))
            elif role == "assistant":
                action = Action(text=text_of(h.get("content")), raw=h)
                for c in as_list(h.get("tool_calls")):
                    if not isinstance(c, dict):
                        continue
                    fn = as_dict(c.get("function"))
                    action.tool_calls.append(
                        string_call(
                            as_str(c.get("id")),
                            as_str(fn.get("name")) or "",
                            fn.get("arguments") or "",
                            raw=c,
                        )
                    )
                step = Step(n=len(steps) + 1, action=action)
                steps.append(step)
                for c in action.tool_calls:
                    if c.id:
                        call_step[c.id] = step
            elif role == "tool":
                ids = [as_str(x) for x in as_list(h.get("tool_call_ids"))] or [None]
                step = call_step.get(ids[0]) if ids[0] else None
                step = step or (steps[-1] if steps else None)
                if step is None:
                    left_out(traj, where, "tool", "a tool result before any action")
                    continue
                step.observation.results.append(ToolResult(ids[0], h.get("content"), is_error=None, raw=h))
            elif role == "user":
                text = text_of(h.get("content"))
                if h.get("is_demo"):
                    meta["task_context"].append(text)
                elif traj.task is None and not steps:
                    traj.task = text
                elif steps:
                    steps[-1].observation.messages.append(Message("user", [TextPart(text)], raw=h))
                else:
                    meta["task_context"].append(text)
            else:
                left_out(traj, where, role, "a role the profile does not read")
        for s in steps:
            done = {r.call_id for r in s.observation.results}
            for c in s.action.tool_calls:
                if c.id not in done:
                    s.observation.results.append(
                        ToolResult(c.id, "", is_error=None, name=c.name, raw={"interrupted": True})
                    )
                    if "interrupted" not in s.flags:
                        s.flags.append("interrupted")
                    diag.warn(
                        "interrupted", f"step {s.n}", f"tool call {c.id} ({c.name}) has no result in the file"
                    )
        if steps and self._submits(steps[-1]):
            steps[-1].flags.append("submitted")
            if steps[-1].observation.results or steps[-1].observation.messages:
                steps[-1].flags.append("observation_not_sent")
        traj.steps = steps
        model = (doc.get("replay_config") or {}) if isinstance(doc.get("replay_config"), dict) else {}
        traj.model = (
            (((model.get("agent") or {}).get("model") or {}).get("name"))
            if isinstance(model.get("agent"), dict)
            else None
        )
        traj.meta = meta
        return NativeResult(traj, PROFILE, diag)

    @staticmethod
    def _submits(s: Step) -> bool:
        if any(c.name == "submit" for c in s.action.tool_calls):
            return True
        raw = s.action.raw if isinstance(s.action.raw, dict) else {}
        return isinstance(raw.get("action"), str) and raw["action"].strip() == "submit"


ADAPTER = SweAgentAdapter()
