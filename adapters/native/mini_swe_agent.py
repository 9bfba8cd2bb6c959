"""mini-swe-agent trajectory JSON (the ``-o`` file, ``<instance>.traj.json``) into a Trajectory.

Format rules (sources: docs/native.md, from SWE-agent/mini-swe-agent
src/minisweagent/agents/default.py ``serialize``, models/litellm_model.py ``parse_actions``,
models/utils/actions_toolcall.py and docs/usage/output_files.md; corpus files
``real-2.4.6_*.traj.json`` (tool-calling with Chat and Anthropic models, text-based), the v1
SWE-bench runs ``v1_*`` and the Harbor RFC file (v1), and the upstream bare-list test data):

- The document is ``{info, messages, trajectory_format}``; the upstream test data is a bare
  list of messages. ``trajectory_format`` is the version: ``mini-swe-agent-1.1`` (v2, read as
  1.1) or ``mini-swe-agent-1`` (v1, read as 1.0): one profile covers both; a bare list has
  none (warning ``no_version``). ``mini-swe-agent-2`` (an unknown major) is refused.
- ``messages[0]`` (role ``system``) is the system prompt; the first ``user`` message is the
  task (content a string, or a list of ``{type: text}`` blocks as in the Harbor RFC file:
  texts joined). Tool definitions are not stored (the ``bash`` tool is ``BASH_TOOL``, a
  constant in the code): ``Trajectory.tools`` is None.
- Each ``assistant`` message is an action: ``content`` text; ``tool_calls`` in the OpenAI
  shape (``function.arguments`` a JSON string, kept exactly; several calls = one batch) in
  tool-calling mode. In the text-based mode (v1 ```` ```bash ````, v2 ```` ```mswea_bash_command ````
  blocks) the command is in the text and the action has no tool call, as in the model request.
  Model and usage from ``extra.response``. Responses-API models store the response object
  (``object: "response"``, ``output`` items ``message`` / ``function_call{call_id, name,
  arguments}``) and answer with ``{type: "function_call_output", call_id, output}``.
- ``tool`` messages answer calls by ``tool_call_id``; results are put in call order.
  ``is_error`` is ``extra.returncode != 0`` when the message has a return code, else None.
  ``user`` messages after an action (text-mode observations, human commands, format errors)
  are observation messages.
- A reply that does not parse (no tool call, wrong tool, not exactly one command block) is
  **not stored**: ``parse_actions`` raises ``FormatError`` before the message is added, and only
  the ``user`` message with ``extra.interrupt_type: "FormatError"`` follows the previous
  observation. Such a message opens a step of its own flagged ``action_dropped_by_agent``: its
  action text is ``extra.model_response`` (text-based models store it), else empty and the
  step is also flagged ``action_not_stored``. (v1 added the reply before parsing it: there the
  format error follows the assistant message and is its observation.)
- The final submit command (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``; v1 also
  ``MINI_SWE_AGENT_FINAL_OUTPUT``) ends the run: what follows it in the file (v2: the padded
  result ``returncode -1``, "action was not executed"; v1: a ``user`` message holding the
  submission) was never sent to the model. The last step is flagged ``submitted`` and, when
  the file holds such an observation, ``observation_not_sent`` (kept, not dropped); a submit
  step whose result the file lacks is ``interrupted`` alone.
- ``exit`` messages (v2: ``extra.exit_status``, ``submission``) are left out; the exit status
  goes to ``meta``.
- ``info.config.environment.cwd``, the directory its commands ran in (``/testbed`` in a
  SWE-bench container; empty: mini's own working directory), goes to ``meta["cwd"]`` when it
  names one: a replay of the file maps it to the new workspace (the recorded workspace).
- Refused (BadInputError, exit 65, naming the file and the shape expected, :data:`EXPECTED`):
  a file that is not one JSON document (empty, JSON Lines, nested too deep to parse), a
  document without a ``messages`` list, an empty one, and a first message without a role: a
  file of another agent is never read as an empty trajectory.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.journal.model import Action, Message, Step, TextPart, ToolResult, Trajectory

from .assembly import as_dict, as_list, as_str, epoch_ms, left_out, string_call, text_of
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics, require
from .documents import read_document

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile(
    "mini-swe-agent",
    1,
    1,
    "`trajectory_format` (mini-swe-agent-1.1 -> 1.1, mini-swe-agent-1 -> 1.0)",
    "1.13.4, 1.15.0 (v1), 2.4.6",
)

#: the shape this adapter reads, named when it refuses a file
EXPECTED = (
    "a mini-swe-agent trajectory: a JSON object {info, messages: [{role, content}, ...], trajectory_format} "
    "(or a bare JSON array of messages)"
)

#: the commands that end a run (v2 and v1 spellings; docs/advanced/v2_migration.md)
SUBMIT_MARKERS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
#: the command block of a text-based reply (v2 default ``action_regex``, and v1's ```bash)
_BLOCK = re.compile(r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```", re.S)

#: step flags this adapter sets, for ``meta["flags"]``
FLAGS = {
    "action_dropped_by_agent": (
        "the reply did not parse (format error); the agent did not store it in its history"
    ),
    "action_not_stored": "the dropped reply's content is not in the file (tool-calling models)",
    "submitted": "the step ran the final submit command",
    "observation_not_sent": (
        "the submit step's observation is in the file but the run ended: the model never saw it"
    ),
    "interrupted": "a tool call without a result in the file",
}


def _extra(m: dict[str, Any]) -> dict[str, Any]:
    e = m.get("extra")
    return e if isinstance(e, dict) else {}


def _is_action(m: dict[str, Any]) -> bool:
    return m.get("role") == "assistant" or m.get("object") == "response"


def _header(doc: Any, traj: Trajectory, meta: dict[str, Any], diag: Diagnostics) -> list:
    """The document's messages, its format version checked and its ``info`` (versions, exit
    status, instance, the task template, the model) noted; a bare list of messages is read with
    the pinned profile. BadInputError (exit 65) for a document without ``messages`` or of
    another format."""
    if isinstance(doc, list):
        PROFILE.check(None, "document", diag)
        meta["trajectory_format"] = None
        return doc
    require(
        isinstance(doc, dict) and isinstance(doc.get("messages"), list),
        diag,
        "document",
        f"not a mini-swe-agent trajectory: no `messages` list; expected {EXPECTED}",
    )
    fmt = doc.get("trajectory_format")
    version = None
    if fmt is not None:
        require(
            isinstance(fmt, str) and fmt.startswith("mini-swe-agent-"),
            diag,
            "trajectory_format",
            f"format {fmt!r} is not a mini-swe-agent trajectory format",
        )
        version = fmt[len("mini-swe-agent-") :]
        if re.fullmatch(r"\d+", version):
            version += ".0"
    PROFILE.check(version, "trajectory_format", diag)
    messages = doc["messages"]
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    meta.update(
        {
            "trajectory_format": fmt,
            "mini_version": info.get("mini_version"),
            "exit_status": info.get("exit_status"),
        }
    )
    if "instance_id" in doc:
        meta["instance_id"] = doc["instance_id"]
    agent_cfg = (
        ((info.get("config") or {}).get("agent") or {}) if isinstance(info.get("config"), dict) else {}
    )
    if isinstance(agent_cfg, dict) and isinstance(agent_cfg.get("instance_template"), str):
        meta["instance_template"] = agent_cfg["instance_template"]  # the task is rendered into it
    cfg = ((info.get("config") or {}).get("model") or {}) if isinstance(info.get("config"), dict) else {}
    if isinstance(cfg, dict) and isinstance(cfg.get("model_name"), str):
        traj.model = cfg["model_name"]
    env_cfg = (
        ((info.get("config") or {}).get("environment") or {}) if isinstance(info.get("config"), dict) else {}
    )
    if isinstance(env_cfg, dict) and isinstance(env_cfg.get("cwd"), str) and env_cfg["cwd"]:
        # where its commands ran (empty: its own working directory, which the file does not name);
        # a replay maps it to the new workspace, so that a recorded `pwd` is no false difference
        meta["cwd"] = env_cfg["cwd"]
    return messages


class _Messages:
    """The messages read in order (:meth:`message` dispatches by role): an assistant message
    (or a Responses object) a step, tool results its results, user messages the task or
    observation messages (a format error's reply a step of its own), the exit record noted."""

    def __init__(self, traj: Trajectory, meta: dict[str, Any], diag: Diagnostics) -> None:
        self.traj, self.meta, self.diag = traj, meta, diag
        self.steps: list[Step] = []
        self.call_step: dict[str, Step] = {}
        self.prev: dict[str, Any] | None = None  # the previous message read

    def message(self, i: int, m: Any) -> None:
        """``messages[i]``: BadInputError (exit 65) unless an object; then by role."""
        traj, steps = self.traj, self.steps
        where = f"messages[{i}]"
        require(isinstance(m, dict), self.diag, where, "a message that is not a JSON object")
        role = m.get("role")
        if _is_action(m):
            # v2 keeps when the message was added: ``extra.timestamp``, epoch seconds
            stamp = as_dict(m.get("extra")).get("timestamp")
            seconds = isinstance(stamp, (int, float)) and not isinstance(stamp, bool)
            step = Step(
                n=len(steps) + 1,
                action=MiniSweAgentAdapter._action(m),
                time_ms=epoch_ms(stamp * 1000) if seconds else None,
            )
            steps.append(step)
            for c in step.action.tool_calls:
                if c.id:
                    self.call_step[c.id] = step
        elif role == "tool" or m.get("type") == "function_call_output":
            self.result(m, role, where)
        elif role == "system" and not steps and traj.system is None:
            traj.system = text_of(m.get("content"))
        elif role == "user":
            self.user(m)
        elif role == "exit":
            self.meta["exit"] = {k: v for k, v in _extra(m).items() if k in ("exit_status", "submission")}
            left_out(traj, where, "exit", "the exit record (exit status and submission), not a model message")
        elif role is None:
            # before anything was recognised this is not a mini-swe-agent file; later an item
            # of a shape this profile does not know (formats drift): left out with a warning
            require(
                steps or traj.task is not None or traj.system is not None,
                self.diag,
                where,
                f"a message without a role (not a mini-swe-agent message); expected {EXPECTED}",
            )
            self.diag.warn("unknown_record", where, "a message without a role; left out")
            left_out(traj, where, "unknown", "a message without a role")
        else:
            left_out(traj, where, str(role), "a message role the profile does not read")
        self.prev = m

    def result(self, m: dict, role: Any, where: str) -> None:
        """A tool result (Chat ``tool`` message or Responses ``function_call_output``): a result
        of the step that made its call, else of the last step."""
        steps = self.steps
        cid = as_str(m.get("tool_call_id") if role == "tool" else m.get("call_id"))
        step = self.call_step.get(cid) if cid is not None else None
        if step is None:
            step = steps[-1] if steps else None
        if step is None:
            left_out(self.traj, where, "tool", "a tool result before any action")
            return
        content = m.get("content") if role == "tool" else m.get("output")
        rc = _extra(m).get("returncode")
        step.observation.results.append(
            ToolResult(cid, content, is_error=None if rc is None else rc != 0, raw=m)
        )

    def user(self, m: dict) -> None:
        """A user message: the task, its context, or an observation message; after a reply the
        agent dropped (a format error) a step of its own stands for that reply."""
        traj, steps, prev = self.traj, self.steps, self.prev
        text = text_of(m.get("content"))
        msg = Message("user", [TextPart(text)], raw=m)
        ex = _extra(m)
        if (
            ex.get("interrupt_type") == "FormatError"
            and (prev is None or not _is_action(prev))
            and (steps or traj.task is not None)
        ):
            # the reply that caused it was never added to the messages
            reply = ex.get("model_response")
            step = Step(
                n=len(steps) + 1,
                action=Action(text=reply if isinstance(reply, str) else "", raw=None),
                flags=["action_dropped_by_agent"] + ([] if isinstance(reply, str) else ["action_not_stored"]),
            )
            step.observation.messages.append(msg)
            steps.append(step)
        elif traj.task is None and not steps:
            traj.task = text
        elif steps:
            steps[-1].observation.messages.append(msg)
        else:
            self.meta["task_context"].append(text)


class MiniSweAgentAdapter(NativeAdapter):
    name = "mini-swe-agent"
    description = (
        "mini-swe-agent trajectory JSON (-o FILE, <instance>.traj.json), tool-calling and text-based, v1 and "
        "v2"
    )
    profiles = (PROFILE,)

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """The ``usage`` of a message's ``extra.response`` (LiteLLM's response): Chat
        Completions' (``prompt_tokens``, ...) or, for a Responses-API model, the Responses
        API's (``input_tokens``, ...), each read as its protocol reads it."""
        if not isinstance(usage, dict):
            return TokenUsage()
        protocol = "openai-chat" if "prompt_tokens" in usage else "openai-responses"
        return get_protocol(protocol).normalised_usage(usage)

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """Read ``path``; raises BadInputError (65) naming ``trajectory_format`` for an unknown
        major and ``messages[i]`` for a message that is not an object with a role."""
        doc = read_document(path, diag, EXPECTED, arrays=("messages",))
        traj = Trajectory()
        meta: dict[str, Any] = {"format": "mini-swe-agent trajectory json", "task_context": [], "flags": {}}
        messages = _header(doc, traj, meta, diag)
        require(messages, diag, "messages", f"no messages (an empty list); expected {EXPECTED}")
        reading = _Messages(traj, meta, diag)
        for i, m in enumerate(messages):
            reading.message(i, m)
        steps = reading.steps
        for s in steps:
            self._order_results(s, diag)
        if steps and self._submits(steps[-1]) and meta.get("exit_status") in (None, "Submitted"):
            last = steps[-1]
            last.flags.append("submitted")
            # an observation the file holds, not the reader's placeholder for a result the file
            # lacks (an ``interrupted`` step): that one was never in the file to be not sent
            held = [r for r in last.observation.results if r.raw != {"interrupted": True}]
            if held or last.observation.messages:
                last.flags.append("observation_not_sent")
        traj.steps = steps
        traj.model = traj.model or next((s.action.model for s in steps if s.action.model), None)
        meta["flags"] = {f: FLAGS[f] for f in FLAGS if any(f in s.flags for s in steps)}
        traj.meta = meta
        return NativeResult(traj, PROFILE, diag)

    # ------------------------------------------------------------------ pieces

    @staticmethod
    def _action(m: dict[str, Any]) -> Action:
        """An Action from a Chat-shaped assistant message or a Responses-API response object."""
        if m.get("object") == "response":
            action = Action(
                model=as_str(m.get("model")), usage=m.get("usage"), stop_reason=as_str(m.get("status")), raw=m
            )
            texts = []
            for item in as_list(m.get("output")):
                if not isinstance(item, dict):
                    continue
                if item.get("type") == "message":
                    texts.append(text_of(item.get("content")))
                elif item.get("type") == "function_call":
                    action.tool_calls.append(
                        string_call(
                            as_str(item.get("call_id")),
                            as_str(item.get("name")) or "",
                            item.get("arguments") or "",
                            raw=item,
                        )
                    )
            action.text = "".join(texts)
            return action
        action = Action(text=text_of(m.get("content")), raw=m)
        resp = _extra(m).get("response")
        if isinstance(resp, dict):
            action.model = resp.get("model")
            action.usage = resp.get("usage")
            choices = resp.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                action.stop_reason = choices[0].get("finish_reason")
        for c in as_list(m.get("tool_calls")):
            if not isinstance(c, dict):
                continue
            fn = as_dict(c.get("function"))
            action.tool_calls.append(
                string_call(
                    as_str(c.get("id")), as_str(fn.get("name")) or "", fn.get("arguments") or "", raw=c
                )
            )
        return action

    @staticmethod
    def _order_results(s: Step, diag: Diagnostics) -> None:
        """Results in call order; a call without a result gets an interrupted one."""
        if not s.action.tool_calls:
            return
        by_id: dict[Any, ToolResult] = {}
        extra: list[ToolResult] = []
        for r in s.observation.results:
            if r.call_id in by_id:
                extra.append(r)  # a second result for the same id: kept after the others
            else:
                by_id[r.call_id] = r
        ordered = []
        for c in s.action.tool_calls:
            r = by_id.pop(c.id, None)
            if r is None:
                r = ToolResult(c.id, "", is_error=None, name=c.name, raw={"interrupted": True})
                if "interrupted" not in s.flags:
                    s.flags.append("interrupted")
                diag.warn(
                    "interrupted", f"step {s.n}", f"tool call {c.id} ({c.name}) has no result in the file"
                )
            ordered.append(r)
        s.observation.results = ordered + list(by_id.values()) + extra

    @staticmethod
    def _submits(s: Step) -> bool:
        """Whether step ``s`` ran the submit command (in a tool call's arguments, or in a
        command block of a text-based reply)."""
        commands = [c.arguments_raw for c in s.action.tool_calls] or _BLOCK.findall(s.action.text)
        return any(mark in cmd for cmd in commands for mark in SUBMIT_MARKERS)


ADAPTER = MiniSweAgentAdapter()
