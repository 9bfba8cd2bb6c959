"""An agent's echo of a reply against the reply: the same action or a changed one.

An agent sends each reply back in its next request (its history). :func:`same_said` tells
whether the echo says what the reply said (:func:`pvisor.adapters.chains.said` of each), an
argument the agent filled in at its default counting as no change (:func:`filled_defaults`), and
a call echoed under another name of the same tool (the descriptor's ``echo_aliases``: Claude
Code echoes a ``Task`` call as ``Agent``) too.
Read by the online matcher (a served action echoed) and the journal's trajectory builder (the
``action_changed_by_agent`` flag).
"""

from __future__ import annotations

from typing import Any


#: argument values an agent may fill in for an argument the model left out (its default)
_DEFAULTS: tuple[Any, ...] = (False, None, "", [], {})


def filled_defaults(expected: Any, got: Any) -> bool:
    """Whether the normalised tool call ``got`` (an agent's echo of a served call) is
    ``expected`` with arguments added at an empty or false value: the agent filled in the
    defaults of arguments the reply left out (Claude Code 2.1 echoes an ``Edit`` with
    ``"replace_all": false``), which is no change of the action."""
    if not (isinstance(expected, dict) and isinstance(got, dict)):
        return False
    ea, ga = expected.get("arguments"), got.get("arguments")
    if not (isinstance(ea, dict) and isinstance(ga, dict)):
        return False
    if {k: v for k, v in expected.items() if k != "arguments"} != {
        k: v for k, v in got.items() if k != "arguments"
    }:
        return False
    return all(k in ga and ga[k] == v for k, v in ea.items()) and all(
        ga[k] in _DEFAULTS for k in ga.keys() - ea.keys()
    )


def echo_aliases(agent: str | None) -> dict[str, str]:
    """The descriptor's ``echo_aliases`` of ``agent`` (tool name in a reply -> the name the agent
    echoes the call under); empty for an agent pvisor has no descriptor of."""
    from pvisor.adapters.agents import descriptor_names, get_descriptor

    if agent is None or agent not in descriptor_names():
        return {}
    return dict(get_descriptor(agent).echo_aliases)


def renamed(said_: tuple[str, list[Any]], aliases: dict[str, str]) -> tuple[str, list[Any]]:
    """:func:`said` of a reply with each call's name as the agent echoes it (``aliases``)."""
    if not aliases:
        return said_
    calls = [
        {**c, "name": aliases[c["name"]]} if isinstance(c, dict) and c.get("name") in aliases else c
        for c in said_[1]
    ]
    return said_[0], calls


def same_said(
    expected: tuple[str, list[Any]], got: tuple[str, list[Any]], aliases: dict[str, str] | None = None
) -> bool:
    """Whether an echo (:func:`said` of it) says what the reply said: the same text and the same
    calls, a call whose arguments the agent filled in at their defaults counting as the same
    (:func:`filled_defaults`), a call echoed under its alias (``aliases``, the descriptor's
    ``echo_aliases``) too."""
    if got == expected:
        return True
    expected = renamed(expected, aliases or {})
    return (
        got[0] == expected[0]
        and len(got[1]) == len(expected[1])
        and all(e == g or filled_defaults(e, g) for e, g in zip(expected[1], got[1]))
    )
