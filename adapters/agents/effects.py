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
    WRITE = "write"  #: writes a whole file: reproduced by a shell call
    EDIT = "edit"  #: replaces a string in a file: reproduced by a shell call
    PATCH = "patch"  #: applies a patch (Codex ``apply_patch``): reproduced by a shell call
    LIST = "list"  #: lists, globs or searches files: rendered as text (part 2 maps it)
    PLAN = "plan"  #: a plan, todo list or goal: rendered as text
    SUBAGENT = "subagent"  #: starts a subagent: rendered as text
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


class ToolEffect:
    """One tool's effect and argument roles: ``effect`` (:class:`Effect`), ``args`` (role ->
    argument name), ``offset_base`` (0 or 1: the first line's number for :attr:`Role.OFFSET`).
    Immutable and hashable; compared by value."""

    __slots__ = ("effect", "args", "offset_base")

    def __init__(self, effect: Effect, offset_base: int = 0, **args: str) -> None:
        object.__setattr__(self, "effect", effect)
        object.__setattr__(self, "args", {Role(k): v for k, v in args.items()})
        object.__setattr__(self, "offset_base", offset_base)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ToolEffect is immutable: cannot set {name}")

    def arg(self, role: Role) -> str | None:
        """The name of the argument that plays ``role``, or None."""
        return self.args.get(role)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolEffect):
            return NotImplemented
        return (self.effect, self.args, self.offset_base) == (other.effect, other.args, other.offset_base)

    def __hash__(self) -> int:
        return hash((self.effect, tuple(sorted(self.args.items())), self.offset_base))

    def __repr__(self) -> str:
        args = ", ".join(f"{k.value}={v!r}" for k, v in self.args.items())
        return f"ToolEffect({self.effect.value}{', ' if args else ''}{args})"


def shell(command: str = "command", workdir: str | None = None, description: str | None = None) -> ToolEffect:
    """A shell tool whose ``command`` argument holds the command."""
    extra = {k: v for k, v in (("workdir", workdir), ("description", description)) if v}
    return ToolEffect(Effect.SHELL, command=command, **extra)


def read(path: str, offset: str | None = None, limit: str | None = None, offset_base: int = 0) -> ToolEffect:
    """A tool that reads the file its ``path`` argument names (a line range by offset/limit)."""
    extra = {k: v for k, v in (("offset", offset), ("limit", limit)) if v}
    return ToolEffect(Effect.READ, offset_base=offset_base, path=path, **extra)


def write(path: str, content: str) -> ToolEffect:
    """A tool that writes ``content`` as the whole file ``path``."""
    return ToolEffect(Effect.WRITE, path=path, content=content)


def edit(path: str, old: str, new: str, all_: str | None = None) -> ToolEffect:
    """A tool that replaces ``old`` by ``new`` in ``path`` (every occurrence when ``all_``)."""
    return ToolEffect(Effect.EDIT, path=path, old=old, new=new, **({"all": all_} if all_ else {}))


def kinds(effect: Effect, *names: str) -> dict[str, ToolEffect]:
    """``names`` -> a :class:`ToolEffect` of ``effect`` without argument roles."""
    return {n: ToolEffect(effect) for n in names}
