"""A handoff's translation: agent A's actions A_1..A_N as actions of agent B, by their effect.

:func:`translate` takes the source's steps (a :class:`~pvisor.replay.recording.Recording`'s),
the source's descriptor and a :class:`Target`: B's descriptor, its protocol and the tools B
declared in its own request 1 (playback reads them there; never assumed). Per source call, by
its effect (:mod:`pvisor.adapters.agents.effects`, read through A's ``tool_effects``):

- **shell** -> B's shell call with the same command (a working directory other than the
  workspace becomes ``cd DIR && ``); ``translated``;
- **write**, **edit**, **patch** -> a B shell call that makes the same change (a here-document,
  a ``python3`` replacement script, the patch's files); ``reproduced``. One whose recorded
  result is an error changed nothing: it is ``rendered_as_text``, not reproduced;
- **read** -> B's read tool when B declares one and the read has no line range, else a shell
  read (``cat``, ``sed -n``); ``translated``;
- **anything else** (list, plan, subagent, web, server tools, unknown tools) is not re-run: its
  recorded result is written as text in B's own message, ``rendered_as_text``. An action left
  without a call of B's gets a carrier, B's shell call ``true``, since a reply without a tool call
  ends five of the six agents (and is a format error to mini-swe-agent);
- a step without a call is ``not_reenactable`` and left out (B's steps are then fewer);
- reasoning is dropped, written as a note or kept, and counted (:mod:`.source_reasoning`).

B's calls get ids of B's protocol (``CALL_ID_PREFIX`` of its module); each translated step's
observation holds the source's recorded results in the order of B's calls, so that O and O″
are compared per call. Every call's arguments are checked against the parameter schema B
declared for the tool (:func:`argument_problems`); a refusal is :class:`TranslationRefused`.

Pure: no file, process or socket.
"""

from __future__ import annotations

import base64
import enum
import json
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

from pvisor.adapters.agents.effects import Effect, Role, ToolEffect
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import compact_json
from pvisor.core.errors import BadInputError
from pvisor.journal.model import Action, Observation, Step, TextPart, ToolCall, ToolResult, ToolSpec

from .routes import SUBAGENT_REASON, Routes, SessionFiles
from .shell_text import (
    WRITE_PART,
    edit_command,
    files_command,
    operand,
    patch_command,
    patch_operations,
    write_command,
    write_parts,
)
from .source_images import image_read, placeholder
from .source_reasoning import ReasoningAccount, SourceReasoning, reasoning_of, with_note


class CallFate(str, enum.Enum):
    """What became of one source call in a handoff (the report's ``fate``)."""

    TRANSLATED = "translated"  #: B's call of the same kind (shell to shell, read to read)
    REPRODUCED = "reproduced"  #: a B shell call that makes the same change to the workspace
    RENDERED_AS_TEXT = "rendered_as_text"  #: not re-run: its recorded result written in B's message
    NOT_REENACTABLE = "not_reenactable"  #: left out: nothing of B's can carry it
    DROPPED = "dropped"  #: left out on purpose (said why)


class TranslationRefused(BadInputError):
    """A translated call that B's declared tool schema refuses, or a target without a shell
    tool: exit 65 (the source cannot be handed to this agent as it stands)."""


@dataclass(frozen=True)
class Target:
    """The agent a run is handed to: its ``descriptor``, ``protocol``, the ``tools`` it declared
    in its request 1 (parsed), its ``workspace`` (absolute) and the source's recorded workspace
    (``recorded_workspace``, to tell which paths lie inside it; None when unknown)."""

    descriptor: Any
    protocol: str
    tools: Sequence[ToolSpec]
    workspace: str
    recorded_workspace: str | None = None
    #: source step -> the files that step changed, from the source's snapshots around it
    #: (path relative to the workspace, the new bytes or None when removed); only for the steps
    #: whose calls cannot say what they changed (:data:`UNSAID`); absent: unknown
    changes: Mapping[int, list[tuple[str, bytes | None]]] | None = None
    #: whether an absolute path exists in B's workspace when B starts (before its request 1's
    #: answer), to know that a write makes a new file, which needs no read first; None: unknown
    exists: Callable[[str], bool] | None = None
    #: whether a path (relative to the workspace) existed in the source's workspace before a
    #: source step (its snapshots): (step, path) -> True, False, or None when unknown; absent:
    #: unknown. B re-enacts the steps before, so a file the source's write made is new in B too
    existed: Callable[[int, str], bool | None] | None = None
    #: what becomes of A's reasoning (:mod:`.source_reasoning`)
    source_reasoning: SourceReasoning = SourceReasoning.DROP


@dataclass
class CallAccount:
    """One source call and what became of it: ``step`` (source step), ``call_id``, ``tool``,
    ``effect``, ``fate``, the B ``target_step`` and ``target_tool`` that carry it (None when
    left out), ``target_index`` (its position among that step's calls), ``reason``."""

    step: int
    call_id: str | None
    tool: str
    effect: str
    fate: CallFate
    target_step: int | None = None
    target_tool: str | None = None
    target_index: int | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "call_id": self.call_id,
            "tool": self.tool,
            "effect": self.effect,
            "fate": self.fate.value,
            "target_step": self.target_step,
            "target_tool": self.target_tool,
            "target_index": self.target_index,
            "reason": self.reason,
        }


@dataclass
class Translation:
    """The source's steps as B's: ``steps`` (B's steps 1..M, each with the source's recorded
    results in the order of its calls), ``calls`` (one :class:`CallAccount` per source call),
    ``skipped`` (what of a source step is left out, ``what``: ``action`` or ``observation``,
    with why: the handoff report's ``not_reenactable``), ``step_map`` (source step -> B's steps),
    ``carriers`` (B steps whose only call is the carrier ``true``), ``reasoning`` (what became of
    A's reasoning: :class:`~pvisor.replay.source_reasoning.ReasoningAccount`; its ``dropped`` is
    ``reasoning_dropped``), ``images`` (the report's ``handoff.images`` before B ran:
    :func:`~pvisor.replay.source_images.account_images`), ``shell_tool`` and ``read_tool`` used
    (None: none)."""

    steps: list[Step] = field(default_factory=list)
    calls: list[CallAccount] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    step_map: dict[int, list[int]] = field(default_factory=dict)
    carriers: list[int] = field(default_factory=list)
    reasoning: ReasoningAccount = field(default_factory=ReasoningAccount)
    images: dict[str, Any] = field(default_factory=dict)
    shell_tool: str | None = None
    read_tool: str | None = None
    #: B calls that make a step's workspace changes from the source's snapshots: ``source_step``,
    #: ``target_step``, ``paths``
    from_snapshots: list[dict[str, Any]] = field(default_factory=list)
    #: reads served before B's own edit or write tool changes a file B must read first
    #: (``reads_before_change``): ``source_step``, ``call_id`` (the source call that needed
    #: it), ``target_step``, ``target_index``, ``target_tool``, ``path`` (as the workspace names it)
    inserted_reads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def target_steps(self) -> int:
        return len(self.steps)

    @property
    def reasoning_dropped(self) -> dict[str, int]:
        """The reasoning items left out: ``provider_bound`` (signed, encrypted), ``plain``."""
        return self.reasoning.dropped


# --------------------------------------------------------------------------- schema


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, types: Any) -> bool:
    names = types if isinstance(types, list) else [types]
    for name in names:
        py = _JSON_TYPES.get(name)
        if py is None:
            return True  # a type this check does not know: not refused here
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, py):
            return True
    return False


def argument_problems(schema: Any, args: Any) -> list[str]:
    """What a tool's parameter ``schema`` (JSON Schema, as the agent declared it) refuses in
    ``args``: a missing required property, a property of the wrong type or outside its enum, a
    property the schema forbids (``additionalProperties: false``). [] when it accepts them, or
    when the schema says nothing checkable. Top level only (the calls a handoff writes are flat)."""
    if not isinstance(schema, dict):
        return []
    if not isinstance(args, dict):
        return [f"expected an object of arguments, got {type(args).__name__}"]
    out: list[str] = []
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    for name in schema.get("required") or ():
        if name not in args:
            out.append(f"required argument {name!r} is missing")
    for name, value in args.items():
        spec = props.get(name)
        if spec is None:
            if schema.get("additionalProperties") is False:
                out.append(f"argument {name!r} is not one the tool declares")
            continue
        if not isinstance(spec, dict):
            continue
        types = spec.get("type")
        if types is not None and not _type_ok(value, types):
            out.append(f"argument {name!r} should be {types}, got {type(value).__name__}")
        if isinstance(spec.get("enum"), list) and value not in spec["enum"]:
            out.append(f"argument {name!r} is not one of {spec['enum']}")
    return out


# --------------------------------------------------------------------------- shell text

#: effects whose calls may change the workspace in ways their arguments do not say, when they are
#: not re-run (a subagent's edits, an MCP tool's, a write whose arguments a handoff cannot read)
UNSAID = frozenset({Effect.SUBAGENT, Effect.OTHER, Effect.WRITE, Effect.EDIT, Effect.PATCH})


# --------------------------------------------------------------------------- translation


def _args(call: ToolCall) -> dict[str, Any]:
    if isinstance(call.arguments, dict):
        return call.arguments
    try:
        value = json.loads(call.arguments_raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _text_of(content: Any) -> str:
    """A recorded result's content as text (parts joined), for a rendered note."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(c) for c in content)
    if isinstance(content, dict):
        if (image := placeholder(content)) is not None:  # never an image's bytes as text
            return image
        for key in ("text", "output", "content"):
            if key in content:
                return _text_of(content[key])
        return json.dumps(content, ensure_ascii=False, sort_keys=True)
    if isinstance(content, TextPart):
        return content.text
    return str(content)


#: the ``target_tool`` of a call a text-mode target gives in a fenced block of its text
TEXT_MODE_TOOL = "text"


class _Translator:
    def __init__(self, source: Any, target: Target) -> None:
        self.source = source
        self.t = target
        self.mod = get_protocol(target.protocol)
        self.specs = {s.name: s for s in target.tools}
        self.routes = Routes(target.descriptor, self.specs, self.mod.tool_kind)
        self.shell = self._shell_tool()
        self.reader = self.routes.reader  # B's read tool for text (never a reader of images only)
        self.text_mode = self.shell is None and target.descriptor.text_command is not None and not self.specs
        if self.shell is None and not self.text_mode:
            offered = ", ".join(sorted(self.specs)) or "none"
            raise TranslationRefused(
                f"{target.descriptor.name} declared no shell tool in its request 1 (tools: {offered}): "
                "a handoff re-runs the history through B's shell"
            )
        self.out = Translation(
            shell_tool=self.shell, read_tool=self.reader, reasoning=ReasoningAccount(target.source_reasoning)
        )
        self.kept: list = []  # the reasoning the source step being translated keeps (_emit)
        self.prefix = self.mod.CALL_ID_PREFIX
        self.files = SessionFiles(target.exists)
        #: reads B must be served before the source step being translated: (call, path)
        self.reads_first: list[tuple[ToolCall, str]] = []
        #: why the last write or edit could not go to B's own tool for want of a read, or None
        self.unread: str | None = None

    def _shell_tool(self) -> str | None:
        """B's declared shell tool that its facts describe (first in the facts' order, then its
        ``shell_tools``)."""
        d = self.t.descriptor
        names = [n for n, fx in d.tool_effects.items() if fx.effect is Effect.SHELL]
        names += [n for n in d.shell_tools if n not in names]
        for name in names:
            if name in self.specs and self.mod.tool_kind(self.specs[name]) == "function":
                return name
        return None

    # -- paths

    def _rel(self, path: str) -> str:
        """A recorded path as B's shell names it: relative when inside the recorded workspace
        (B's shell starts in B's workspace), else as recorded."""
        ws = (self.t.recorded_workspace or "").rstrip("/")
        if ws and (path == ws or path.startswith(ws + "/")):
            rest = path[len(ws) :].lstrip("/")
            return rest or "."
        return path

    def _abs(self, path: str) -> str:
        """A recorded path in B's workspace, absolute (B's read tools want absolute paths)."""
        rel = self._rel(path)
        if rel.startswith("/"):
            return rel
        return posixpath.normpath(posixpath.join(self.t.workspace, rel))

    # -- B's calls

    def _made(self, command: str) -> str:
        """A command of a handoff's own (a reproduced change) as B's shell runs it: through
        ``base64 -d | bash`` when B's shell refuses what the command's data holds
        (:attr:`~pvisor.adapters.agents.descriptor.AgentDescriptor.shell_refuses`: Gemini CLI
        refuses ``$(`` and backticks even in a quoted here-document). Never for a source's own
        shell command, which B's shell judges as it is."""
        refuses = self.t.descriptor.shell_refuses
        if refuses is None or not refuses.search(command):
            return command
        data = base64.b64encode(command.encode("utf-8", "surrogatepass")).decode()
        return f"printf '%s' {data} | base64 -d | bash"

    def _shell_call(self, command: str, description: str | None) -> tuple[str, dict[str, Any]]:
        if self.shell is None:  # text mode: the command goes in a fenced block of B's text (_emit)
            return TEXT_MODE_TOOL, {"command": command}
        fx = self.t.descriptor.effect_of(self.shell)
        args: dict[str, Any] = {fx.arg(Role.COMMAND) or "command": command}
        spec = self.specs.get(self.shell)
        props = (spec.parameters or {}).get("properties", {}) if spec is not None else {}
        desc_arg = fx.arg(Role.DESCRIPTION)
        if desc_arg and desc_arg in props:
            args[desc_arg] = description or _describe(command)
        return self.shell, self._filled(self.shell, args, description or _describe(command))

    def _filled(self, tool: str, args: dict[str, Any], text: str) -> dict[str, Any]:
        """``args`` with a required string argument B declares and the translation has no value
        for given ``text`` (a description of the call)."""
        spec = self.specs.get(tool)
        schema = spec.parameters if spec is not None else None
        if isinstance(schema, dict):
            props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
            for name in schema.get("required") or ():
                p = props.get(name)
                if name not in args and isinstance(p, dict) and _type_ok("", p.get("type", "string")):
                    args[name] = text
        return args

    def _call(self, source: int, step: int, index: int, tool: str, args: dict[str, Any]) -> ToolCall:
        """B's call ``index`` of its step ``step``, made for source step ``source`` (the step
        the user knows: the refusal names it, and B's step when the numbers differ)."""
        spec = self.specs.get(tool)
        problems = argument_problems(spec.parameters if spec is not None else None, args)
        if problems:
            mine = f" (its step {step})" if step != source else ""
            raise TranslationRefused(
                f"step {source}: {self.t.descriptor.name}'s {tool} refuses the translated call{mine}: "
                + "; ".join(problems)
            )
        # the step, then the call's place in two digits; a place of 100 or more after an ``x``:
        # appended bare it would make step 1000's call 100 the id of step 10001's call 0
        place = f"{index:02d}" if index < 100 else f"x{index}"
        cid = f"{self.prefix}pvh{step:04d}{place}"
        args = _utf8(args)
        return ToolCall(id=cid, name=tool, arguments_raw=compact_json(args), arguments=args)

    # -- one source call

    def _command_of(self, fx: ToolEffect, args: dict[str, Any]) -> str | None:
        cmd = args.get(fx.arg(Role.COMMAND) or "command")
        if isinstance(cmd, list) and all(isinstance(c, str) for c in cmd):
            # Codex's ``shell`` tool: an argv, usually ["bash", "-lc", SCRIPT]
            cmd = cmd[2] if len(cmd) == 3 and cmd[1] in ("-lc", "-c") else shlex.join(cmd)
        if not isinstance(cmd, str):
            return None
        wd = args.get(fx.arg(Role.WORKDIR) or "") if fx.arg(Role.WORKDIR) else None
        if isinstance(wd, str) and wd:
            rel = self._rel(wd)
            if rel not in (".", ""):
                cmd = f"cd {operand(rel)} && {cmd}"
        return cmd

    def _read(self, fx: ToolEffect, args: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
        """(tool, args, how) of a source read: B's read tool (a line range in its own terms,
        :meth:`~pvisor.replay.routes.Routes.read`), else a shell read."""
        path = args.get(fx.arg(Role.PATH) or "")
        if not isinstance(path, str) or not path or "\x00" in path:
            return None
        routed = image_read(self.t.descriptor, self.specs, self._rel(path), self._abs(path), self._shell_call)
        if routed is not None:  # an image file: B's reader of images (replay/source_images.py)
            return routed
        first, last = _range(fx, args)
        route = self.routes.read(self._abs(path), first, last)
        if route is not None:
            self.files.read(self._abs(path), route.whole)
            return route.tool, self._filled(route.tool, route.args, path), route.how
        rel = self._rel(path)
        if first is None and last is None:
            cmd = f"cat {operand(rel)}"
        else:
            cmd = f"sed -n '{first or 1},{last if last is not None else '$'}p' {operand(rel)}"
        tool, a = self._shell_call(cmd, f"Read {rel}")
        return tool, a, "shell read"

    def _change(self, fx: ToolEffect, args: dict[str, Any], raw: str) -> str | None:
        """The shell command that makes a write's, an edit's or a patch's change, or None.
        ``raw``: the call's arguments as carried (a free-form tool's whole input)."""
        if fx.effect is Effect.PATCH:
            key = fx.arg(Role.PATCH)
            if key:
                text = args.get(key)
            else:  # free-form (Codex's custom apply_patch): the input is the patch; a function
                # form of the tool holds it in ``input``
                text = args.get("input", args.get("patch")) if args else raw
            if not isinstance(text, str):
                return None
            ops = patch_operations(text)
            if ops is None or "\x00" in text:
                return None
            return patch_command(
                [(k, self._rel(p), _rel_move(self, a) if k == "update" else a) for k, p, a in ops]
            )
        path = args.get(fx.arg(Role.PATH) or "")
        if not isinstance(path, str) or not path or "\x00" in path:
            return None  # a NUL: no file has that name (and no command can hold it)
        if fx.effect is Effect.WRITE:
            content = args.get(fx.arg(Role.CONTENT) or "")
            return write_command(self._rel(path), content) if isinstance(content, str) else None
        old, new = args.get(fx.arg(Role.OLD) or ""), args.get(fx.arg(Role.NEW) or "")
        if not isinstance(old, str) or not isinstance(new, str):
            return None
        if (
            old == ""
        ):  # an edit with no old text creates the file (Claude Code, OpenCode, Gemini CLI, Qwen Code)
            return write_command(self._rel(path), new)
        every = _replace_all(fx, args)
        return edit_command(self._rel(path), old, new, every)

    # -- steps

    def run(self, steps: Sequence[Step]) -> Translation:
        for step in steps:
            self._step(step)
        return self.out

    def _step(self, step: Step) -> None:
        a = step.action
        results = list(step.observation.results)
        calls = list(a.tool_calls)
        text = a.text
        from_text = False
        if not calls and self.source.text_command is not None:
            calls = [
                ToolCall(
                    id=None, name="bash", arguments_raw=compact_json({"command": c}), arguments={"command": c}
                )
                for c in self.source.text_commands(a)
            ]
            if calls:
                from_text = True
                # the commands become B's calls: left in the text, a text-mode B would read two blocks
                text = self.source.text_command.sub("", a.text).strip()
        if from_text and len(calls) == 1 and not results and step.observation.messages:
            # text mode: the agent sends the command's output back as a user message, its result
            said = [_text_of(p) for m in step.observation.messages for p in m.parts]
            results = [ToolResult(call_id=None, content="\n".join(said))]
        elif step.observation.messages:
            # B re-runs the calls and sends its own observation: a later prompt or a format error
            # the source's observation held is not sent again
            self.out.skipped.append(
                {
                    "step": step.n,
                    "what": "observation",
                    "reason": "the observation holds more than tool results (a later prompt, a format error)",
                }
            )
        self.kept, note = reasoning_of(a, self.out.reasoning, served=bool(calls))
        if not calls:
            self.out.skipped.append(
                {
                    "step": step.n,
                    "what": "action",
                    "reason": "the step has no tool call (a reply without one ends B)",
                }
            )
            return
        by_id = {r.call_id: r for r in results if r.call_id is not None}
        planned: list[tuple[ToolCall, str, dict[str, Any], CallFate, str | None, ToolResult | None]] = []
        notes: list[str] = []
        for i, call in enumerate(calls):
            hist = by_id.get(call.id) if call.id is not None else None
            if hist is None and i < len(results) and results[i].call_id in (None, call.id):
                hist = results[i]
            self._one(step, call, hist, planned, notes)
        extra = self._from_snapshots(step, planned)
        first = self._read_first(step)
        self._emit(step, with_note(note, text), planned, notes, extra)
        if first is not None:
            self.out.step_map[step.n].insert(0, first)

    def _from_snapshots(self, step: Step, planned: list) -> tuple[str, dict[str, Any], list[str]] | None:
        """B's shell call making the step's workspace changes from the source's snapshots, when a
        call of the step that may change the workspace is not re-run (its arguments do not say
        what it changed) and the snapshots say: (tool, arguments, paths); else None."""
        unsaid = [
            p
            for p in planned
            if p[3] is CallFate.RENDERED_AS_TEXT and self.source.effect_of(p[0].name).effect in UNSAID
        ]
        changes = (self.t.changes or {}).get(step.n)
        if not unsaid or not changes:
            return None
        for i, p in enumerate(planned):
            if p in unsaid:
                planned[i] = (*p[:4], f"{p[4]}; its workspace changes made by shell from the snapshots", p[5])
        command = self._made(files_command(changes))
        for rel, data in changes:  # made after the step's calls: known to B only as shell output
            self.files.shell_change(self._abs(rel), data is not None)
        tool, args = self._shell_call(command, f"Make step {step.n}'s changes to the files")
        return tool, args, [c[0] for c in changes]

    def _one(
        self, step: Step, call: ToolCall, hist: ToolResult | None, planned: list, notes: list[str]
    ) -> None:
        fx = self.source.effect_of(call.name) if call.kind != "server" else ToolEffect(Effect.WEB)
        args = _args(call)
        if fx.effect is Effect.SHELL:
            cmd = self._command_of(fx, args)
            if cmd is not None:
                how = self._shell_read_first(step, call, cmd)
                self.files.shell()  # a command may change any file: B reads again before its edit
                desc = args.get(fx.arg(Role.DESCRIPTION) or "") if fx.arg(Role.DESCRIPTION) else None
                tool, targs = self._shell_call(cmd, desc if isinstance(desc, str) and desc else None)
                planned.append((call, tool, targs, CallFate.TRANSLATED, how, hist))
                return
        elif fx.effect is Effect.READ:
            got = self._read(fx, args)
            if got is not None:
                tool, targs, how = got
                planned.append((call, tool, targs, CallFate.TRANSLATED, how or None, hist))
                return
        elif fx.effect in (Effect.WRITE, Effect.EDIT, Effect.PATCH):
            # a change that failed in the source (its result an error: Claude Code's Write of a
            # file not read first) changed nothing there: reproducing it would
            failed = hist is not None and hist.is_error
            native = self._native_change(step, call, fx, args) if not failed else None
            if native is not None:
                tool, targs, how = native
                planned.append((call, tool, targs, CallFate.TRANSLATED, how, hist))
                return
            cmd = self._change(fx, args, call.arguments_raw) if not failed else None
            if cmd is not None:
                self._changed_by_shell(fx, args)
                more = self._more_parts(fx, args)
                if more:  # a long write: its first part here, the others in the steps after it
                    cmd = more.pop(0)
                made = self._made(cmd)
                if made != cmd:  # what the encoded command does, said in B's own words
                    notes.append(f"The {fx.effect.value} below runs this, encoded for my shell:\n{cmd}")
                tool, targs = self._shell_call(made, f"{fx.effect.value.capitalize()} as {call.name} did")
                why = f"{fx.effect.value} made by shell" + (
                    f" in {len(more) + 1} parts, one a step" if more else ""
                )
                if self.unread:  # B's own tool could not: it wants a read first that cannot come
                    why += f" ({self.unread})"
                planned.append((call, tool, targs, CallFate.REPRODUCED, why, hist))
                for part in more:
                    tool, targs = self._shell_call(self._made(part), f"Go on with the write of {call.name}")
                    planned.append((None, tool, targs, CallFate.REPRODUCED, None, None))
                return
        elif fx.effect is Effect.PLAN and not (hist is not None and hist.is_error):
            # (a plan call that failed in the source set no plan there: not re-run, as a change)
            route = self.routes.plan(fx, call.name, args)
            spec = self.specs.get(route.tool) if route is not None else None
            if route is not None and not argument_problems(spec.parameters if spec else None, route.args):
                planned.append((call, route.tool, route.args, CallFate.TRANSLATED, route.how, hist))
                return
        # not re-run: the recorded call and result as text in B's own message
        notes.append(_note(call, hist, self.source))
        if fx.effect is Effect.PLAN and hist is not None and hist.is_error:
            why = "the plan call failed in the source (its result is an error): not re-run"
        elif fx.effect is Effect.PLAN:
            why = self.routes.plan_reason(fx, call.name)
        elif fx.effect is Effect.SUBAGENT:
            why = SUBAGENT_REASON
        elif fx.effect not in (Effect.SHELL, Effect.READ, Effect.WRITE, Effect.EDIT, Effect.PATCH):
            why = f"a call of kind {fx.effect.value} is not re-run"
        elif fx.effect in (Effect.WRITE, Effect.EDIT, Effect.PATCH) and hist is not None and hist.is_error:
            why = f"the {fx.effect.value} failed in the source (its result is an error): nothing to reproduce"
        else:
            why = f"its arguments do not say what the {fx.effect.value} did"
        planned.append((call, "", {}, CallFate.RENDERED_AS_TEXT, why, hist))

    def _more_parts(self, fx: ToolEffect, args: dict[str, Any]) -> list[str]:
        """The commands of a write too long for one command (:data:`WRITE_PART`): the first
        writes, the others append; [] for a write of one part, an edit or a patch."""
        if fx.effect is not Effect.WRITE:
            return []
        path, content = args.get(fx.arg(Role.PATH) or ""), args.get(fx.arg(Role.CONTENT) or "")
        if not isinstance(path, str) or not isinstance(content, str) or len(content) <= WRITE_PART:
            return []
        rel = self._rel(path)
        parts = write_parts(content)
        return [write_command(rel, parts[0])] + [write_command(rel, p, append=True) for p in parts[1:]]

    def _native_change(
        self, step: Step, call: ToolCall, fx: ToolEffect, args: dict[str, Any]
    ) -> tuple[str, dict[str, Any], str] | None:
        """(tool, args, how) of a write or an edit by B's own tool, a read of the file served
        first where B wants one (:meth:`_read_first`); None: B's shell makes it (part 1's way),
        also when B must read first and cannot (no read tool, or a call earlier in the same step
        may change the file after the read)."""
        self.unread = None
        path = args.get(fx.arg(Role.PATH) or "")
        if not isinstance(path, str) or not path or "\x00" in path:
            return None
        where = self._abs(path)
        if fx.effect is Effect.WRITE:
            content = args.get(fx.arg(Role.CONTENT) or "")
            route = self.routes.write(where, content) if isinstance(content, str) else None
        elif fx.effect is Effect.EDIT:
            old, new = args.get(fx.arg(Role.OLD) or ""), args.get(fx.arg(Role.NEW) or "")
            every = _replace_all(fx, args)
            said = args.get(fx.arg(Role.INSTRUCTION) or "") if fx.arg(Role.INSTRUCTION) else None
            words = said if isinstance(said, str) and said.strip() else step.action.text.strip()
            ok = isinstance(old, str) and isinstance(new, str)
            route = self.routes.edit(where, self._rel(path), old, new, every, words or None) if ok else None
        else:
            return None
        if route is None:
            return None
        how = route.how
        rel = self._rel(path)
        before = self._existed(step, rel) if not rel.startswith("/") else None
        if self.t.descriptor.reads_before_change and self.files.needs_read(where, before):
            if self.routes.reader is None or not self.files.can_read_first(where):
                b = self.t.descriptor.name
                self.unread = (
                    f"{b} changes only a file it read, and declared no read tool"
                    if self.routes.reader is None
                    else f"{b} changes only a file it read, and a call before it in the step may change it"
                )
                return None
            self._queue_read(call, where)
            how += f"; {self.t.descriptor.name} read the file first (inserted_reads)"
        self.files.native_change(where)
        return route.tool, self._filled(route.tool, route.args, f"{fx.effect.value.capitalize()} {path}"), how

    def _shell_read_first(self, step: Step, call: ToolCall, cmd: str) -> str | None:
        """Queue a read (:meth:`_read_first`) of each file B's shell would refuse to change with
        the source's own ``cmd`` for want of one (:meth:`~pvisor.adapters.agents.descriptor.
        AgentDescriptor.shell_reads_first`: Qwen Code's in-place ``sed``), when it lies in B's
        workspace, may exist and is not fresh in B's session; the call's how, or None."""
        queued = []
        for path in self.t.descriptor.shell_reads_first(cmd):
            where = self._abs(path)  # a path in the recorded workspace is B's (playback rewrites it)
            rel = self._inside(where)
            if rel is None or self.routes.reader is None:
                continue  # outside the workspace: the handoff does not restore it
            before = self._existed(step, rel)
            if not self.files.needs_read(where, before) or not self.files.can_read_first(where):
                continue  # fresh, surely absent, or a call before it in the step may change it
            self._queue_read(call, where)
            queued.append(rel)
        if not queued:
            return None
        b = self.t.descriptor.name
        return f"{b}'s shell changes in place only a file it read: read first (inserted_reads)"

    def _inside(self, where: str) -> str | None:
        """``where`` (absolute) relative to B's workspace, or None when it lies outside."""
        ws = self.t.workspace.rstrip("/")
        return posixpath.relpath(where, ws) if where.startswith(ws + "/") else None

    def _existed(self, step: Step, rel: str) -> bool | None:
        """Whether ``rel`` existed in the source's workspace before ``step`` (its snapshots;
        None: unknown)."""
        return self.t.existed(step.n, rel) if self.t.existed is not None else None

    def _queue_read(self, call: ToolCall, where: str) -> None:
        """A read of ``where`` for B before the step (:meth:`_read_first`), once a path."""
        if all(p != where for _c, p in self.reads_first):
            self.reads_first.append((call, where))

    def _changed_by_shell(self, fx: ToolEffect, args: dict[str, Any]) -> None:
        """Bookkeeping of a change reproduced by B's shell: the file it wrote or edited is no
        longer as B last read it (a patch may touch several: any file)."""
        path = args.get(fx.arg(Role.PATH) or "")
        if fx.effect is Effect.PATCH or not isinstance(path, str):
            self.files.shell()
        else:
            self.files.shell_change(self._abs(path))

    def _read_first(self, step: Step) -> int | None:
        """B's step serving the reads its edit and write tools want before ``step``'s changes
        (whole files, B's read tool), listed in ``inserted_reads``; its number, or None when
        none is needed. Resets the step's bookkeeping."""
        wanted, self.reads_first = self.reads_first, []
        self.files.next_step()
        if not wanted or self.routes.reader is None:
            return None
        n = len(self.out.steps) + 1
        calls: list[ToolCall] = []
        rels: list[str] = []
        for i, (src, where) in enumerate(wanted):
            route = self.routes.read(where, None, None)
            assert route is not None  # a reader reads a whole file
            tc = self._call(step.n, n, i, route.tool, self._filled(route.tool, route.args, where))
            calls.append(tc)
            rel = self._inside(where) or where
            rels.append(rel)
            self.out.inserted_reads.append(
                {
                    "source_step": step.n,
                    "call_id": src.id,
                    "target_step": n,
                    "target_index": i,
                    "target_tool": route.tool,
                    "path": rel,
                }
            )
        said = f"Before I change {' and '.join(rels)}, I read {'it' if len(rels) == 1 else 'them'} first."
        results = [ToolResult(call_id=tc.id, content="") for tc in calls]
        self.out.steps.append(
            Step(
                n=n,
                action=Action(text=_utf8(said), tool_calls=calls),
                observation=Observation(results=results),
            )
        )
        return n

    def _account(
        self,
        step: Step,
        src: ToolCall,
        fate: CallFate,
        why: str | None,
        target_step: int,
        tool: str | None = None,
        index: int | None = None,
    ) -> CallAccount:
        """The account of source call ``src`` of ``step``: carried by B's ``tool`` (None: as
        text) as call ``index`` of B's step ``target_step``."""
        effect = self.source.effect_of(src.name).effect.value
        return CallAccount(step.n, src.id, src.name, effect, fate, target_step, tool, index, why)

    def _emit(
        self, step: Step, text: str, planned: list, notes: list[str], extra: tuple[str, dict, list] | None
    ) -> None:
        """B's step(s) of one source step: one with every call when B takes several calls at once
        (text mode: one per command), the rendered notes in its text."""
        runnable = [p for p in planned if p[3] is not CallFate.RENDERED_AS_TEXT and p[0] is not None]
        # the parts of a long write after its first, each a step of its own: in order, after it
        later = [p for p in planned if p[0] is None]
        body = "\n\n".join(x for x in [text.strip(), *notes] if x)
        groups = [runnable] if not self.text_mode else [[p] for p in runnable] or [[]]
        if not runnable:
            groups = [[]]
        groups += [[p] for p in later]
        made: list[int] = []
        for g, group in enumerate(groups):
            n = len(self.out.steps) + 1
            calls: list[ToolCall] = []
            results: list[ToolResult] = []
            for i, (src, tool, targs, fate, why, hist) in enumerate(group):
                tc = self._call(step.n, n, i, tool, targs)
                calls.append(tc)
                content = hist.content if hist is not None else None
                results.append(
                    ToolResult(call_id=tc.id, content=content, is_error=hist.is_error if hist else None)
                )
                if src is not None:
                    self.out.calls.append(self._account(step, src, fate, why, n, tool, i))
            if extra is not None and g == len(groups) - 1:
                tool, targs, paths = extra
                tc = self._call(step.n, n, len(calls), tool, targs)
                calls.append(tc)
                results.append(ToolResult(call_id=tc.id, content=""))
                self.out.from_snapshots.append({"source_step": step.n, "target_step": n, "paths": paths})
            if not calls:
                tool, targs = self._shell_call("true", "Carry the notes above")
                tc = self._call(step.n, n, 0, tool, targs)
                calls.append(tc)
                results.append(ToolResult(call_id=tc.id, content=""))
                self.out.carriers.append(n)
            said = body if g == 0 else ""
            if self.text_mode:
                cmd = _fenced(_args(calls[0]).get("command", "true"))
                said = (_unfenced(said) + "\n\n" if said else "") + f"```mswea_bash_command\n{cmd}\n```"
                calls = []
            action = Action(text=_utf8(said), tool_calls=calls, reasoning=self.kept if g == 0 else [])
            self.out.steps.append(Step(n=n, action=action, observation=Observation(results=results)))
            made.append(n)
        first = made[0]
        for src, _tool, _targs, fate, why, _hist in planned:
            if fate is CallFate.RENDERED_AS_TEXT:
                self.out.calls.append(self._account(step, src, fate, why, first))
        self.out.step_map[step.n] = made


def _rel_move(tr: _Translator, arg: Any) -> Any:
    move, hunks = arg
    return (tr._rel(move) if move else None, hunks)


def _utf8(value: Any) -> Any:
    """``value`` (a string, or the strings of a list or dict) as UTF-8 can carry it: a lone
    surrogate, which a recorded JSON escape may hold (``\\ud800``) and no request body can,
    becomes U+FFFD, as the agents' runtimes write it to a file or a request."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    if isinstance(value, dict):
        return {k: _utf8(v) for k, v in value.items()}
    return value


def _unfenced(text: str) -> str:
    """Text of a text-mode step (the source's words, the rendered notes) with no fence left: a
    text-mode agent runs the first fenced block of its reply, and a recorded text holding
    ```` ```mswea_bash_command ```` would be run in place of the translated command. Every
    backtick followed by another gets a zero-width space after it: breaking each ```` ``` ````
    once would leave three in a run of four, a fence all the same."""
    return re.sub(r"`(?=`)", "`\u200b", text)


def _fenced(command: str) -> str:
    """``command`` as a text-mode block may carry it: a command holding a fence (a markdown file
    written by a here-document) would end the block early, so it is run from base64."""
    if "```" not in command:
        return command
    data = base64.b64encode(command.encode("utf-8", "surrogatepass")).decode()
    return f"eval \"$(printf '%s' {data} | base64 -d)\""


def _replace_all(fx: ToolEffect, args: dict[str, Any]) -> bool:
    """Whether an edit replaces every occurrence: its replace-all argument is JSON ``true``
    (``"false"``, ``1`` or a list are no boolean: the edit tools' schemas take none, and
    ``bool("false")`` would replace them all)."""
    return fx.arg(Role.ALL) is not None and args.get(fx.arg(Role.ALL) or "") is True


def _range(fx: ToolEffect, args: dict[str, Any]) -> tuple[int | None, int | None]:
    """A read's first and last line, 1-based and included (None: not given)."""
    start, end = args.get(fx.arg(Role.START) or ""), args.get(fx.arg(Role.END) or "")
    start, end = (v if isinstance(v, int) and not isinstance(v, bool) else None for v in (start, end))
    if start is not None or end is not None:
        return (start, end)
    off, lim = args.get(fx.arg(Role.OFFSET) or ""), args.get(fx.arg(Role.LIMIT) or "")
    first = off + (1 - fx.offset_base) if isinstance(off, int) and not isinstance(off, bool) else None
    if isinstance(lim, int) and not isinstance(lim, bool):
        return (first or 1, (first or 1) + lim - 1)
    return (first, None)


def _describe(command: str) -> str:
    line = command.strip().split("\n", 1)[0]
    return f"Run {line}" if len(line) <= 80 else f"Run {line[:77]}..."


def _note(call: ToolCall, hist: ToolResult | None, source: Any) -> str:
    """A call that is not re-run, as B's own words: what it was called with and what it gave
    (without what the source agent wraps around results of its own: Claude Code's
    ``<system-reminder>`` blocks, its descriptor's ``prompt_wrappers``)."""
    args = call.arguments_raw if call.arguments_raw else "{}"
    said = f"Earlier I called {call.name} with {args}"
    if hist is None:
        return said + "; it gave no recorded result."
    text = _text_of(hist.content)
    for wrapper in source.prompt_wrappers:
        text = wrapper.sub("\n", text)
    return said + f"; it returned:\n{text.strip()}"


def translate(steps: Sequence[Step], source: Any, target: Target) -> Translation:
    """The source's ``steps`` (A_1..A_N with their observations) as B's (module docstring).
    ``source``: A's descriptor. Raises :class:`TranslationRefused` when B declared no shell tool
    or B's schema refuses a translated call."""
    return _Translator(source, target).run(steps)
