"""What an agent's tools do, by effect: the facts a handoff translates one agent's calls by.

Each descriptor lists its tools in :attr:`~pvisor.adapters.agents.descriptor.AgentDescriptor.
tool_effects` (one line per agent): tool name -> :class:`ToolEffect`, the tool's :class:`Effect`
and which of its arguments play which :class:`Role`. A handoff (docs/handoff.md) reads the
source agent's calls through the source's table and writes the target's calls through the
target's, among the tools the target declared in its own request 1 (never assumed from the
table alone: a tool in the table that the request does not offer is not used).

Sources: the tool definitions each pinned agent sent in its requests (Claude Code 2.1 captured
at test time; Codex 0.171.0, Gemini CLI 0.61.0, OpenCode 1.18.33, Qwen Code 0.24.4 and
mini-swe-agent 2.4.6 in this project's corpus of requests), docs/agents.md. Light on purpose:
prepare-only imports the descriptors.
"""

from __future__ import annotations

import enum
from typing import Any


class Effect(str, enum.Enum):
    """What a call of a tool does to the world (how a handoff carries it)."""

    SHELL = "shell"  #: runs a shell command: re-run as the target's shell call
    READ = "read"  #: reads one file: the target's read tool, else a shell read
    WRITE = "write"  #: writes a whole file: the target's write tool, else a shell call
    EDIT = "edit"  #: replaces a string in a file: the target's edit tool, else a shell call
    PATCH = "patch"  #: applies a patch (Codex ``apply_patch``): reproduced by a shell call
    LIST = "list"  #: lists, globs or searches files: rendered as text
    PLAN = "plan"  #: a plan, todo list or goal: the target's tool of its :class:`PlanKind`, else text
    SUBAGENT = "subagent"  #: starts a subagent: rendered as text with its recorded result
    WEB = "web"  #: fetches or searches the web: rendered as text
    OTHER = "other"  #: anything else (MCP, notebooks, questions): rendered as text


class Role(str, enum.Enum):
    """What an argument of a tool holds."""

    COMMAND = "command"  #: the shell command (a string, or an argv list)
    WORKDIR = "workdir"  #: the shell command's working directory
    PATH = "path"  #: the file read, written or edited
    CONTENT = "content"  #: a whole file's new content
    OLD = "old"  #: the text an edit replaces
    NEW = "new"  #: the text it puts instead
    ALL = "all"  #: replace every occurrence (a boolean)
    OFFSET = "offset"  #: a read's first line (see :attr:`ToolEffect.offset_base`)
    LIMIT = "limit"  #: how many lines a read gives
    START = "start"  #: a read's first line, 1-based (Gemini CLI ``start_line``)
    END = "end"  #: a read's last line, 1-based and included (Gemini CLI ``end_line``)
    PATCH = "patch"  #: the patch text (a free-form input when the argument is ``""``)
    DESCRIPTION = "description"  #: a short text for people (Claude Code ``Bash.description``)
    INSTRUCTION = "instruction"  #: what an edit is for, in words (Gemini CLI ``replace.instruction``)
    TODOS = "todos"  #: a todo list's items (an array of objects: :class:`TodoShape`)


class PlanKind(str, enum.Enum):
    """What a plan tool holds: a todo list (the whole list each call) or a goal. A todo list
    goes to the target's todo tool only; a goal call only to the target's goal tool of the same
    name (goals of two agents are not one thing: Codex's ``update_goal`` takes ``paused``, Qwen
    Code's a ``reason``)."""

    TODO = "todo"  #: the whole todo list, each item a task and its status
    GOAL = "goal"  #: creates, updates or reads the session's goal


#: the statuses a todo item may have, as a handoff carries them between agents (every agent's
#: status words are among these)
TODO_STATUSES = ("pending", "in_progress", "completed", "cancelled", "blocked")


class TodoShape:
    """A todo tool's item: ``text`` (the key holding the task), ``status`` (the key holding its
    status), ``statuses`` (the statuses the tool takes, of :data:`TODO_STATUSES`), ``active``
    (a key holding the task as it is being done, Claude Code ``activeForm``; filled from the
    source's, else the task), ``fill`` (keys the tool requires that other agents do not have,
    and the value given when the source item has none: OpenCode ``priority``). Immutable."""

    __slots__ = ("text", "status", "statuses", "active", "fill")

    def __init__(
        self,
        text: str,
        status: str,
        statuses: tuple[str, ...] = ("pending", "in_progress", "completed"),
        active: str | None = None,
        fill: tuple[tuple[str, str], ...] = (),
    ) -> None:
        for k, v in (("text", text), ("status", status), ("statuses", statuses), ("active", active)):
            object.__setattr__(self, k, v)
        object.__setattr__(self, "fill", fill)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TodoShape is immutable: cannot set {name}")

    def _key(self) -> tuple:
        return (self.text, self.status, self.statuses, self.active, self.fill)

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, TodoShape) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"TodoShape({self.text!r}, {self.status!r})"


class ToolEffect:
    """One tool's effect and argument roles: ``effect`` (:class:`Effect`), ``args`` (role ->
    argument name), ``offset_base`` (0 or 1: the first line's number for :attr:`Role.OFFSET`),
    ``needs_limit`` (a read whose :attr:`Role.OFFSET` is taken only with a :attr:`Role.LIMIT`:
    Qwen Code), ``plan`` (a plan tool's :class:`PlanKind`, else None), ``todo`` (a todo tool's
    :class:`TodoShape`, else None). Immutable and hashable; compared by value."""

    __slots__ = ("effect", "args", "offset_base", "needs_limit", "plan", "todo")

    def __init__(
        self,
        effect: Effect,
        offset_base: int = 0,
        needs_limit: bool = False,
        plan: PlanKind | None = None,
        todo: TodoShape | None = None,
        **args: str,
    ) -> None:
        object.__setattr__(self, "effect", effect)
        object.__setattr__(self, "args", {Role(k): v for k, v in args.items()})
        object.__setattr__(self, "offset_base", offset_base)
        object.__setattr__(self, "needs_limit", needs_limit)
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "todo", todo)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ToolEffect is immutable: cannot set {name}")

    def arg(self, role: Role) -> str | None:
        """The name of the argument that plays ``role``, or None."""
        return self.args.get(role)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolEffect):
            return NotImplemented
        return self._key() == other._key()

    def _key(self) -> tuple:
        extra = (self.offset_base, self.needs_limit, self.plan, self.todo)
        return (self.effect, tuple(sorted(self.args.items())), *extra)

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        args = ", ".join(f"{k.value}={v!r}" for k, v in self.args.items())
        return f"ToolEffect({self.effect.value}{', ' if args else ''}{args})"


def shell(command: str = "command", workdir: str | None = None, description: str | None = None) -> ToolEffect:
    """A shell tool whose ``command`` argument holds the command."""
    extra = {k: v for k, v in (("workdir", workdir), ("description", description)) if v}
    return ToolEffect(Effect.SHELL, command=command, **extra)


def read(
    path: str,
    offset: str | None = None,
    limit: str | None = None,
    offset_base: int = 0,
    needs_limit: bool = False,
) -> ToolEffect:
    """A tool that reads the file its ``path`` argument names (a line range by offset/limit)."""
    extra = {k: v for k, v in (("offset", offset), ("limit", limit)) if v}
    return ToolEffect(Effect.READ, offset_base=offset_base, needs_limit=needs_limit, path=path, **extra)


def write(path: str, content: str) -> ToolEffect:
    """A tool that writes ``content`` as the whole file ``path``."""
    return ToolEffect(Effect.WRITE, path=path, content=content)


def edit(
    path: str, old: str, new: str, all_: str | None = None, instruction: str | None = None
) -> ToolEffect:
    """A tool that replaces ``old`` by ``new`` in ``path`` (every occurrence when ``all_``;
    ``instruction``: an argument saying what the edit is for, Gemini CLI's required one)."""
    extra = {k: v for k, v in (("all", all_), ("instruction", instruction)) if v}
    return ToolEffect(Effect.EDIT, path=path, old=old, new=new, **extra)


def todos(arg: str, shape: TodoShape) -> ToolEffect:
    """A todo tool: its ``arg`` holds the whole list, items of ``shape``."""
    return ToolEffect(Effect.PLAN, plan=PlanKind.TODO, todo=shape, todos=arg)


def goals(*names: str) -> dict[str, ToolEffect]:
    """``names`` -> goal tools (:attr:`PlanKind.GOAL`)."""
    return {n: ToolEffect(Effect.PLAN, plan=PlanKind.GOAL) for n in names}


def kinds(effect: Effect, *names: str) -> dict[str, ToolEffect]:
    """``names`` -> a :class:`ToolEffect` of ``effect`` without argument roles."""
    return {n: ToolEffect(effect) for n in names}
