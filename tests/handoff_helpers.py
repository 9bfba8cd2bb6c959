"""Helpers for the handoff tests: an agent's request 1 as the real CLI sent it (read from the
session's capture, tests/agent_captures.py), and the request B would send at N+1 after a
translated history (request 1 with the translated actions and their observations appended)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.agents.descriptor import action_message
from pvisor.adapters.chains import classify_run
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Conversation, Message, Step, ToolSpec
from pvisor.journal.reader import JournalReader

#: the six agents pvisor launches, in the order of the issue's chained cycle
LAUNCHABLE = ("claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent")


@dataclass(frozen=True)
class FirstRequest:
    """An agent's first main-loop request of a capture: ``protocol``, ``path``, the ``body``
    (the parsed JSON object) and the ``tools`` it offered the model (parsed)."""

    agent: str
    protocol: str
    path: str
    body: dict[str, Any]
    tools: tuple[ToolSpec, ...]

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


def first_request(cap: Any) -> FirstRequest:
    """The first main-loop request of ``cap`` (a :class:`agent_captures.Capture`) read from its
    journal: the chain rule of the agent's descriptor picks the main loop (auxiliary requests,
    a title or a quota check, are not request 1)."""
    d = get_descriptor(cap.agent)
    with JournalReader(cap.journal) as reader:
        c = classify_run(reader, cap.run, prefer=d.chain_hint)
        first = c.main_requests[0]
        body = reader.request_body(first.exchange)
        path = first.exchange.path
    assert body is not None and first.protocol, f"{cap.agent}: request 1 has no body or protocol"
    mod = get_protocol(first.protocol)
    conv = mod.parse_request(body, path=path)
    return FirstRequest(cap.agent, first.protocol, path, orjson.loads(body), tuple(mod.offered_tools(conv)))


def request_after(protocol: str, body: dict[str, Any], steps: Sequence[Step]) -> dict[str, Any]:
    """``body`` (request 1) with ``steps``' actions and observations appended, in the body's
    own shape: the entries the protocol module renders for them follow the body's entries, as
    :func:`pvisor.replay.prefix.append_action` appends an action (rendered together, so that a
    result that names no tool takes the name of the call it answers, as Gemini wants)."""
    mod = get_protocol(protocol)
    messages: list[Message] = []
    for step in steps:
        messages.append(action_message(step.action))
        if step.observation.results:
            messages.append(Message(mod.RESULTS_ROLE, list(step.observation.results)))
        messages.extend(step.observation.messages)
    rendered = orjson.loads(mod.render_request(Conversation(protocol=protocol, messages=messages)))
    out = orjson.loads(orjson.dumps(body))
    key = mod.ENTRIES_KEY
    entries = out.get(key)
    if isinstance(entries, str):  # a Responses input given as one string
        entries = [{"role": "user", "content": [{"type": "input_text", "text": entries}]}]
    out[key] = list(entries or []) + list(rendered.get(key) or [])
    return out
