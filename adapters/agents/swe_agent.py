"""SWE-agent: a descriptor without a launch profile (pvisor reads its trajectories, docs/native.md,
but does not start it). It calls the model through litellm: Chat Completions, Anthropic
Messages or Gemini by the model's provider prefix, not streamed."""

from __future__ import annotations

from .descriptor import LitellmAgent


class SweAgent(LitellmAgent):
    name = "swe-agent"
    title = "SWE-agent"
    finish_tools = ("submit",)


DESCRIPTOR = SweAgent()
