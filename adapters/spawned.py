"""Which chain of a run is its main loop (docs/steps.md, "The chain rule, as implemented",
rule 4): the longest chain that is no subagent's.

A chain is a **subagent's** when its first request's user texts hold the prompt (a string
argument of at least :data:`MIN_PROMPT` characters) of a call of a subagent tool (the hint's
``subagent_tools``: the tools whose effect the agent's descriptor says is ``subagent``) that
another chain's requests carry (the parent's echo of its reply). Such a chain is never the main
one while another chain is not a subagent's: a subagent that makes more requests than its
parent would otherwise be read as the main loop. The texts are searched, not only the task:
Gemini CLI wraps the prompt in its subagent's template. No agent-specific branch: the tool names
come from the hint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from pvisor.journal.model import Conversation, Message, TextPart, ToolCall

if TYPE_CHECKING:
    from .chains import Chain

#: the shortest prompt argument a subagent is linked by (shorter strings, a ``description`` or
#: an agent type, would match by chance)
MIN_PROMPT = 8


def strings(value: Any) -> list[str]:
    """Every string inside a parsed JSON value (a call's arguments), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def prompts_of(arguments: Any) -> list[str]:
    """The prompts of one call: its stripped string arguments of at least :data:`MIN_PROMPT`
    characters, in order."""
    return [s.strip() for s in strings(arguments) if len(s.strip()) >= MIN_PROMPT]


def call_prompts(messages: Iterable[Message], tools: frozenset[str]) -> list[str]:
    """The prompts (:func:`prompts_of`) of the calls of ``tools`` that assistant ``messages``
    hold, in order."""
    return [
        s
        for m in messages
        for p in m.parts
        if isinstance(p, ToolCall) and p.name in tools
        for s in prompts_of(p.arguments)
    ]


def _user_texts(chain: Chain) -> list[str]:
    messages = chain.first.tail if chain.first.tail is not None else chain.first.conversation().messages
    return [p.text for m in messages if m.role == "user" for p in m.parts if isinstance(p, TextPart)]


def subagent_chains(chains: list[Chain], tools: frozenset[str]) -> set[int]:
    """The numbers of the chains that are a subagent's (module docstring)."""
    if not tools or len(chains) < 2:
        return set()
    prompts = {c.number: call_prompts((m for r in c.exchanges for m in r.tail or ()), tools) for c in chains}
    found: set[int] = set()
    for c in chains:
        others = [p for o in chains if o is not c for p in prompts[o.number]]
        if others and any(p in t for t in _user_texts(c) for p in others):
            found.add(c.number)
    return found


def main_chain(chains: list[Chain], prefer: Callable[[Conversation], bool] | None) -> Chain | None:
    """The main chain: the longest of the chains that are no subagent's (all of them when every
    chain is one); ties go to the chain whose first request ``prefer`` prefers, then to more
    tools, then to the earlier start. ``prefer``'s ``subagent_tools`` (a
    :class:`~pvisor.adapters.agents.descriptor.ChainHint`'s) name the subagent tools."""
    spawned = subagent_chains(chains, getattr(prefer, "subagent_tools", frozenset()))
    pool = [c for c in chains if c.number not in spawned] or chains
    if not pool:
        return None
    longest = max(len(c.slots) for c in pool)

    def rank(c: Chain) -> tuple:
        hinted = False
        if prefer is not None and len(c.slots) == longest:
            try:
                hinted = bool(prefer(c.first.conversation()))
            except Exception:  # a hint is advice; a failing one prefers nothing
                hinted = False
        return (len(c.slots), hinted, len(c.first.tool_names), -c.first.exchange.seq)

    return max(pool, key=rank)
