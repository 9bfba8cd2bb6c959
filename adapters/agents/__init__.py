"""Launch profiles of real agent CLIs, one module per agent (see :mod:`.base` for what a
profile is). :func:`get_profile` imports only the module asked for."""

from __future__ import annotations

import importlib

from pvisor.journal.errors import UsageError

from .base import AgentProfile

#: agent name -> module (under this package) defining ``PROFILE``
AGENT_MODULES: dict[str, str] = {
    "claude-code": "claude_code",
    "codex": "codex",
    "gemini-cli": "gemini_cli",
    "opencode": "opencode",
    "qwen-code": "qwen_code",
    "mini-swe-agent": "mini_swe_agent",
}


def agent_names() -> list[str]:
    """The names ``--agent`` accepts, in documentation order."""
    return list(AGENT_MODULES)


def get_profile(name: str) -> AgentProfile:
    """The launch profile called ``name``. Raises UsageError listing the known names."""
    module = AGENT_MODULES.get(name)
    if module is None:
        raise UsageError(f"unknown agent {name!r}; expected one of {', '.join(AGENT_MODULES)}")
    return importlib.import_module(f"{__name__}.{module}").PROFILE


__all__ = ["AGENT_MODULES", "AgentProfile", "agent_names", "get_profile"]
