"""Which differences of two requests are incidental (``pvisor diff``, docs/diff.md "Incidental
differences"): made by each run anew, saying nothing the other run's prompt does not.

A difference of two prompts (:class:`~pvisor.adapters.request_diff.Structure`) is of one
:class:`DifferenceKind`, the first of these that makes the two sides equal (each including those
before it):

- ``run_paths``: each run's own directories (:mod:`.request_diff_paths`);
- ``agent_ids``: ids the agent or its protocol makes in every run. A message part is compared as
  the online matcher and the chain rule compare it (the protocol module's ``normalise``: its
  client-made ids, signatures and cache markers left out; Codex's ``fco_…`` item ids, Gemini
  CLI's call ids); a parameter without the keys the agent's descriptor names
  (:attr:`~pvisor.adapters.agents.descriptor.AgentDescriptor.run_params`: Claude Code's
  ``metadata.user_id``, Codex's ``prompt_cache_key``); a body whose prompt and parameters read
  the same, without the ids the chain rule strips at any depth
  (:func:`~pvisor.adapters.protocols.base.strip_volatile`: Codex's ``msg_…`` item ids, which
  the protocol's reading of a message does not keep);
- ``decorations``: a tool result equal once each side's agent normalises its tool output
  (:meth:`~pvisor.adapters.agents.descriptor.AgentDescriptor.normalise_output`: Codex's
  ``Chunk ID:`` and ``Wall time:``), as a replay compares its observations;
- ``real``: anything else.

Incidental differences still cost cache: the provider compares bytes (the cache figures count
them). :class:`Judge` tells the kind; :func:`collapsed` is the short clause that names the
incidental ones in the text form.
"""

from __future__ import annotations

import enum
from typing import Any

from pvisor.adapters.protocols.base import strip_volatile
from pvisor.adapters.request_cache import Block, canonical
from pvisor.adapters.request_diff_paths import RunPaths
from pvisor.journal.model import Conversation, Message


class DifferenceKind(str, enum.Enum):
    """What a difference of two requests is made of (module docstring)."""

    RUN_PATHS = "run_paths"  #: each run's own directories
    AGENT_IDS = "agent_ids"  #: ids the agent or its protocol makes in every run
    DECORATIONS = "decorations"  #: the agent's decorations of tool output (a chunk id, a time)
    REAL = "real"  #: the prompts say something else

    @property
    def incidental(self) -> bool:
        return self is not DifferenceKind.REAL


#: how the text form names the incidental differences of each kind (:func:`collapsed`)
KIND_NAMES = {
    DifferenceKind.RUN_PATHS: "the runs' own paths",
    DifferenceKind.AGENT_IDS: "the agent's ids",
    DifferenceKind.DECORATIONS: "the agent's output decorations",
}
#: each kind's reason, after the field's name (``the tool result differs only in ...``)
KIND_REASONS = {
    DifferenceKind.RUN_PATHS: "differs only in the runs' own directories (pvisor's private home of each run)",
    DifferenceKind.AGENT_IDS: "differs only in ids the agent or its protocol makes in every run",
    DifferenceKind.DECORATIONS: (
        "differs only in the agent's decorations of tool output (and ids), as a replay compares observations"
    ),
}


def agent_of(reader: Any, run_id: str | None) -> Any:
    """The descriptor of run ``run_id``'s agent, or None (no run, an agent pvisor has no
    descriptor of: its differences are told by the protocol's rules only)."""
    from pvisor.adapters.agents import find_descriptor

    if not run_id or not reader.run_exists(run_id):
        return None
    return find_descriptor(reader.run(run_id).agent)


def _decorated(value: Any, agent: Any) -> Any:
    """``value`` (a normalised tool result's content) with every string's decorations
    normalised by ``agent``'s descriptor."""
    if isinstance(value, str):
        return agent.normalise_output(value)
    if isinstance(value, list):
        return [_decorated(v, agent) for v in value]
    if isinstance(value, dict):
        return {k: _decorated(v, agent) for k, v in value.items()}
    return value


def _without(value: Any, keys: list[list[str]]) -> Any:
    """``value`` without each dotted key path of ``keys`` (``[]``: the whole value)."""
    if any(not k for k in keys):
        return None
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for head in {k[0] for k in keys}:
        if head in out:
            rest = [k[1:] for k in keys if k[0] == head]
            out[head] = _without(out[head], rest)
            if out[head] is None:
                del out[head]
    return out


class Judge:
    """Tells the :class:`DifferenceKind` of differences of A's and B's requests: ``mod`` the
    protocol module (None: compared as JSON), ``paths`` each run's own directories, ``agents``
    each side's agent descriptor (or None). A block's normalised forms are kept on it
    (``Block.loose``): a long run's messages are judged once per side."""

    __slots__ = ("mod", "paths", "agents")

    def __init__(
        self, mod: Any, paths: tuple[RunPaths, RunPaths] | None, agents: tuple[Any, Any] | None
    ) -> None:
        self.mod = mod
        self.paths = paths if paths and (paths[0] or paths[1]) else None
        self.agents = agents or (None, None)

    def _placed(self, side: int, key: bytes) -> bytes:
        return self.paths[side].replace(key) if self.paths else key

    def _loose(self, blk: Block, side: int) -> tuple[bytes, bytes] | None:
        """(the part as the chain rule compares it, and with its tool output's decorations
        normalised), each as canonical JSON with the run's directories placeholders; None for
        a block that is no message part."""
        if blk.source is None or self.mod is None:
            return None
        if blk.loose is None:
            conv = Conversation(protocol=self.mod.NAME, messages=[Message("user", [blk.source])])
            parts = self.mod.normalise(conv)["messages"][0]["parts"]
            agent = self.agents[side]
            plain = [
                {**p, "content": _decorated(p["content"], agent)}
                if agent is not None and p.get("type") == "tool_result"
                else p
                for p in parts
            ]
            blk.loose = (self._placed(side, canonical(parts)), self._placed(side, canonical(plain)))
        return blk.loose

    def block(self, x: Block, y: Block) -> DifferenceKind:
        """The kind of A's block ``x`` against B's ``y`` (which differ)."""
        if self.paths and self._placed(0, x.key) == self._placed(1, y.key):
            return DifferenceKind.RUN_PATHS
        lx, ly = self._loose(x, 0), self._loose(y, 1)
        if lx is None or ly is None:
            return DifferenceKind.REAL
        if lx[0] == ly[0]:
            return DifferenceKind.AGENT_IDS
        return DifferenceKind.DECORATIONS if lx[1] == ly[1] else DifferenceKind.REAL

    def param(self, name: str, pa: dict, pb: dict) -> tuple[DifferenceKind, str]:
        """The kind of parameter ``name`` that differs, and the name to show it by (the keys
        of it the agents make anew, ``metadata.user_id``, when they are what differs)."""
        a, b = canonical(pa.get(name)), canonical(pb.get(name))
        if name in pa and name in pb and self.paths and self._placed(0, a) == self._placed(1, b):
            return DifferenceKind.RUN_PATHS, name
        mine = sorted(
            {
                k
                for agent in self.agents
                if agent is not None
                for k in agent.run_params
                if k.split(".")[0] == name
            }
        )
        if mine:
            keys = [k.split(".")[1:] for k in mine]
            if canonical(_without(pa.get(name), keys)) == canonical(_without(pb.get(name), keys)):
                differ = [k for k in mine if _at(pa, k) != _at(pb, k)]
                return DifferenceKind.AGENT_IDS, ", ".join(differ or mine)
        return DifferenceKind.REAL, name

    def body(self, ja: Any, jb: Any) -> DifferenceKind:
        """The kind of two bodies whose prompts and parameters read the same: ``agent_ids``
        when they are the same without the ids the chain rule strips at any depth."""
        same = canonical(strip_volatile(ja)) == canonical(strip_volatile(jb))
        return DifferenceKind.AGENT_IDS if same else DifferenceKind.REAL


def _at(params: dict, dotted: str) -> bytes:
    value: Any = params
    for k in dotted.split("."):
        value = value.get(k) if isinstance(value, dict) else None
    return canonical(value)


def where(d: Any) -> str:
    """Where a difference is, for :func:`collapsed`: ``message 5``, ``system[2]``, a parameter's
    name."""
    if d.message is not None:
        return f"message {d.message}"
    return d.path.removeprefix("params.")


def collapsed(differences: list[Any]) -> str:
    """The incidental ``differences`` in one short clause, by kind, without their expected and
    got: ``the runs' own paths in system[2], message 0; the agent's ids in message 5;
    metadata.user_id`` (a parameter by its name alone)."""
    groups: dict[DifferenceKind, list[str]] = {}
    params: list[str] = []
    for d in differences:
        if d.field == "params":
            params.append(where(d))
            continue
        names = groups.setdefault(d.kind, [])
        if where(d) not in names:
            names.append(where(d))
    clauses = [f"{KIND_NAMES[k]} in {', '.join(v)}" for k, v in groups.items()]
    return "; ".join(clauses + params)


__all__ = ("DifferenceKind", "Judge", "KIND_NAMES", "KIND_REASONS", "agent_of", "collapsed", "where")
