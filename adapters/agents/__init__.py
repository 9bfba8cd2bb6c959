"""Agent descriptors (:mod:`.descriptor`) and launch profiles (:mod:`.base`), one module per
agent. :func:`get_descriptor` and :func:`get_profile` import only the module asked for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pvisor.journal.errors import UsageError

if TYPE_CHECKING:  # importing base costs its dataclasses: only when a profile is asked for
    from .base import AgentProfile
    from .descriptor import AgentDescriptor

#: agent name -> module (under this package) defining ``PROFILE``: the agents ``pvisor run`` starts
AGENT_MODULES: dict[str, str] = {
    "claude-code": "claude_code",
    "codex": "codex",
    "gemini-cli": "gemini_cli",
    "opencode": "opencode",
    "qwen-code": "qwen_code",
    "mini-swe-agent": "mini_swe_agent",
}

#: agent name -> module defining ``DESCRIPTOR``: every agent pvisor knows (read, prepare, replay)
DESCRIPTOR_MODULES: dict[str, str] = {
    "claude-code": "claude_code",
    "codex": "codex",
    "gemini-cli": "gemini_cli",
    "qwen-code": "qwen_code",
    "opencode": "opencode",
    "mini-swe-agent": "mini_swe_agent",
    "openhands": "openhands",
    "swe-agent": "swe_agent",
}


def agent_names() -> list[str]:
    """The names ``--agent`` of ``pvisor run`` accepts, in documentation order."""
    return list(AGENT_MODULES)


def descriptor_names() -> list[str]:
    """Every agent with a descriptor, in documentation order."""
    return list(DESCRIPTOR_MODULES)


def get_descriptor(name: str) -> "AgentDescriptor":
    """The descriptor of agent ``name``. Raises UsageError listing the known names."""
    module = DESCRIPTOR_MODULES.get(name)
    if module is None:
        raise UsageError(f"unknown agent {name!r}; expected one of {', '.join(DESCRIPTOR_MODULES)}")
    return importlib.import_module(f"{__name__}.{module}").DESCRIPTOR


def get_profile(name: str) -> "AgentProfile":
    """The launch profile called ``name``. Raises UsageError listing the known names (an agent
    with a descriptor but no launch profile is named as such)."""
    module = AGENT_MODULES.get(name)
    if module is None:
        if name in DESCRIPTOR_MODULES:
            raise UsageError(
                f"pvisor reads {name} trajectories but cannot start {name} (no launch profile); "
                f"agents it starts: {', '.join(AGENT_MODULES)}"
            )
        raise UsageError(f"unknown agent {name!r}; expected one of {', '.join(AGENT_MODULES)}")
    return importlib.import_module(f"{__name__}.{module}").PROFILE


__all__ = [
    "AGENT_MODULES",
    "DESCRIPTOR_MODULES",
    "agent_names",
    "descriptor_names",
    "get_descriptor",
    "get_profile",
]
