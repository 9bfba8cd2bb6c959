"""The agents pvisor knows: ONE table, :data:`AGENTS`, and the lists derived from it.

Each agent is one module under this package, named by its :class:`Agent` row, defining
``DESCRIPTOR`` (:mod:`.descriptor`: what it sends, how it is read and replayed) and, when pvisor
starts it, ``PROFILE`` (:mod:`.base`: how it is launched); its native files are read by the
module of the same name under :mod:`pvisor.adapters.native` (``ADAPTER``, and ``SIGNATURE``
unless :mod:`pvisor.adapters.native.signatures` holds one of that name). A new agent is those
modules plus one row of :data:`AGENTS`, in the manner of mitmproxy's ``default_addons()``.

Every other list is derived from the table, here or where it is used: the agents ``pvisor run``
starts (:func:`agent_names`, :func:`executables`), every agent with a descriptor
(:func:`descriptor_names`), the native readers (:func:`native_names`, read by
:mod:`pvisor.adapters.native`), their signatures, and the CLI's help texts. The rows hold only
what a short command needs before any agent module is imported (names for ``--agent``, the
command on PATH for ``--help``): :func:`get_descriptor`, :func:`get_profile` and
:func:`pvisor.adapters.native.get_adapter` import only the module asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pvisor.core.errors import UsageError

if TYPE_CHECKING:  # importing base costs its dataclasses: only when a profile is asked for
    from .base import AgentProfile
    from .descriptor import AgentDescriptor


class Agent:
    """One row of :data:`AGENTS`.

    Fields: ``name`` (the ``--agent`` name), ``module`` (the module of this package defining
    ``DESCRIPTOR``, and of :mod:`pvisor.adapters.native` reading its native files),
    ``executable`` (the command ``pvisor run`` looks up on PATH; None: pvisor reads and replays
    the agent's files but does not start it, its module has no ``PROFILE``), ``native`` (a
    native reader module exists), ``format`` (the row is an interchange format that any agent's
    run may be written in, not an agent: ATIF. Its reader reads a file of that format whatever
    ``--agent`` names, detection tries its signature first, and its descriptor is the generic one
    used when the file's agent is none pvisor knows: docs/native.md). A plain class, not a dataclass
    or a NamedTuple: the table is read on the short commands' paths (``run --help``), where
    building those costs more than the table itself (tests/test_startup_imports.py).
    """

    __slots__ = ("name", "module", "executable", "native", "format")

    def __init__(
        self, name: str, module: str, executable: str | None = None, native: bool = True, format: bool = False
    ):
        self.name = name
        self.module = module
        self.executable = executable
        self.native = native
        self.format = format

    def __repr__(self) -> str:
        fmt = ", format=True" if self.format else ""
        return f"Agent({self.name!r}, {self.module!r}, {self.executable!r}, native={self.native}{fmt})"


#: every agent pvisor knows, in documentation order: the one list every other is derived from
AGENTS: list[Agent] = [
    Agent("claude-code", "claude_code", "claude"),
    Agent("codex", "codex", "codex"),
    Agent("gemini-cli", "gemini_cli", "gemini"),
    Agent("qwen-code", "qwen_code", "qwen"),
    Agent("opencode", "opencode", "opencode"),
    Agent("mini-swe-agent", "mini_swe_agent", "mini"),
    Agent("openhands", "openhands"),
    Agent("swe-agent", "swe_agent"),
    Agent("atif", "atif", format=True),
]


def agent(name: str) -> Agent | None:
    """The row of agent ``name``, or None."""
    return next((a for a in AGENTS if a.name == name), None)


def agent_names() -> list[str]:
    """The names ``--agent`` of ``pvisor run`` accepts (agents with a launch profile), in
    documentation order."""
    return [a.name for a in AGENTS if a.executable is not None]


def executables() -> list[str]:
    """The commands ``pvisor run`` looks up on PATH, one per agent of :func:`agent_names`."""
    return [a.executable for a in AGENTS if a.executable is not None]


def descriptor_names() -> list[str]:
    """Every agent with a descriptor, in documentation order."""
    return [a.name for a in AGENTS]


def native_names() -> list[str]:
    """Every agent whose native files pvisor reads, in documentation order."""
    return [a.name for a in AGENTS if a.native]


def format_names() -> list[str]:
    """The interchange formats among the rows (``format``): read whatever agent wrote them."""
    return [a.name for a in AGENTS if a.format]


def get_descriptor(name: str) -> "AgentDescriptor":
    """The descriptor of agent ``name``. Raises UsageError listing the known names."""
    row = agent(name)
    if row is None:
        raise UsageError(f"unknown agent {name!r}; expected one of {', '.join(descriptor_names())}")
    return importlib.import_module(f"{__name__}.{row.module}").DESCRIPTOR


def find_descriptor(name: str | None) -> "AgentDescriptor | None":
    """The descriptor of agent ``name``, or None for no name or an agent pvisor has no
    descriptor of (a run's recorded agent may be any string)."""
    return get_descriptor(name) if name is not None and agent(name) is not None else None


def get_profile(name: str) -> "AgentProfile":
    """The launch profile called ``name``. Raises UsageError listing the known names (an agent
    with a descriptor but no launch profile is named as such)."""
    row = agent(name)
    if row is None or row.executable is None:
        if row is not None:
            raise UsageError(
                f"pvisor reads {name} trajectories but cannot start {name} (no launch profile); "
                f"agents it starts: {', '.join(agent_names())}"
            )
        raise UsageError(f"unknown agent {name!r}; expected one of {', '.join(agent_names())}")
    return importlib.import_module(f"{__name__}.{row.module}").PROFILE


__all__ = [
    "AGENTS",
    "Agent",
    "agent",
    "agent_names",
    "descriptor_names",
    "executables",
    "format_names",
    "get_descriptor",
    "get_profile",
    "native_names",
]
