"""OpenHands: a descriptor without a launch profile (pvisor reads its trajectories, docs/native.md,
but does not start it). It calls the model through litellm: Chat Completions, Anthropic
Messages or Gemini by the model's provider prefix, not streamed."""

from __future__ import annotations

from .descriptor import LitellmAgent


class OpenHands(LitellmAgent):
    name = "openhands"
    title = "OpenHands"
    shell_tools = {"execute_bash": ("command",), "bash": ("command",)}
    finish_tools = ("finish",)


DESCRIPTOR = OpenHands()
