"""Episodes: a run's main loop and each subagent it started, each read as a trajectory of its
own with its own steps (docs/steps.md, "Episodes").

- **Ids** (the same run read twice gives the same ids): ``main`` for the main loop (the default);
  a subagent of a journal run: the id of the parent's tool call that spawned it (as the agent
  sent it back with its result; ``TOOL@STEP`` for a call without one); a Claude Code
  session's subagent: ``agent-<agentId>``, the name of its transcript beside the session
  (``<session>/subagents/agent-<agentId>.jsonl``) or the ``agentId`` of its inline sidechain
  lines (``sidechain-K`` when they carry none: the K-th chain of such lines in file order, each
  from its own root); a Gemini CLI session's: the subagent's session id
  (its recording ``chats/<session>/<id>.jsonl`` beside the session file); a Codex session's: the
  subagent's session id (a rollout in the same directory whose ``session_meta`` names this
  session as its parent thread).
- **Journal run**: a subagent is a chain other than the main one (:mod:`pvisor.adapters.chains`)
  whose request 1's user texts hold the prompt of a main-loop call of a tool
  whose effect is ``subagent`` (the agent's descriptor). Other chains (title requests, a
  resumed session's new chain) are no episodes.
- **Native file**: the subagents the adapter lists beside the main loop (``meta["subagents"]``
  files: Claude Code, Gemini CLI; Claude Code's ``meta["sidechains"]`` inline lines), each read with the same
  adapter (a subagent's transcript reads its sidechain lines as the loop).
- **Parent**: the main-loop step, call id and tool of the call that spawned it, found the same
  way for both sources: a ``subagent`` call whose string argument (the prompt) is the episode's
  task or is in it; each call spawns one episode, in step order; None when no call matches.
  The call id is the one the agent sent the call back under, from both sources (a native file
  that stores its own form, Gemini CLI's ``<name>__<id>``, gives the agent's).

Errors: :class:`~.errors.ReplayBadInput` ``unknown_episode`` (exit 65, as an ``--after-step``
past the last step): the one line names the episodes the source has.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from pvisor.core.errors import shown
from pvisor.core.record import Record

from .errors import ReplayBadInput, ReplayUsageError, show_path

if TYPE_CHECKING:
    from pathlib import Path

    from pvisor.adapters.chains import Chain, Classification
    from pvisor.journal.model import Step

#: the main loop's episode id (the default of ``--episode``)
MAIN = "main"


class Episode(Record, record=True):
    """One episode of a source: ``id``; ``steps`` (int); ``task`` (its request 1's task, or None);
    ``parent_step`` (1-based main-loop step whose call spawned it), ``parent_call_id``,
    ``parent_tool`` (None for the main episode or an unlinked subagent); ``chain`` (journal: the
    chain number); ``path`` (native: the file it is read from); ``sidechain`` (native: the
    ``agentId`` of its inline lines, ``#K`` for the K-th chain of lines without one); ``note``: a warning
    ``(code, message)`` for a replay of it (journal: :func:`indistinct_note`), or None."""

    id: str
    steps: int
    task: str | None = None
    parent_step: int | None = None
    parent_call_id: str | None = None
    parent_tool: str | None = None
    chain: int | None = None
    path: str | None = None
    sidechain: str | None = None
    error: str | None = None
    note: tuple[str, str] | None = None

    def __init__(
        self,
        id: str,
        steps: int,
        task: str | None = None,
        parent_step: int | None = None,
        parent_call_id: str | None = None,
        parent_tool: str | None = None,
        chain: int | None = None,
        path: str | None = None,
        sidechain: str | None = None,
        error: str | None = None,
        note: tuple[str, str] | None = None,
    ) -> None:
        self.id = id
        self.steps = steps
        self.task = task
        self.parent_step = parent_step
        self.parent_call_id = parent_call_id
        self.parent_tool = parent_tool
        self.chain = chain
        self.path = path
        self.sidechain = sidechain
        #: why its file could not be read (it is left out of the listing; choosing it raises this)
        self.error = error
        self.note = note

    def parent(self) -> dict[str, Any] | None:
        """``{"step", "call_id", "tool"}`` of the call that spawned it, or None."""
        if self.parent_step is None:
            return None
        return {"step": self.parent_step, "call_id": self.parent_call_id, "tool": self.parent_tool}

    def summary(self) -> dict[str, Any]:
        """JSON-ready: ``id``, ``steps``, ``parent`` (:meth:`parent`)."""
        return {"id": self.id, "steps": self.steps, "parent": self.parent()}


def subagent_calls(main_steps: Sequence[Step], descriptor: Any) -> list[tuple[int, Any]]:
    """``(step, call)`` for each call of ``main_steps`` whose tool the agent's ``descriptor`` says
    starts a subagent (effect ``subagent``), in order."""
    from pvisor.adapters.agents.effects import Effect

    return [
        (step.n, call)
        for step in main_steps
        for call in step.action.tool_calls
        if descriptor.effect_of(call.name).effect is Effect.SUBAGENT
    ]


def link(episodes: Sequence[Episode], main_steps: Sequence[Step], agent: str) -> None:
    """Set each subagent episode's parent (module docstring): the first unused main-loop call of
    a ``subagent`` tool whose prompt argument is the episode's task or is in it."""
    from pvisor.adapters.agents import get_descriptor
    from pvisor.adapters.spawned import prompts_of

    calls = subagent_calls(main_steps, get_descriptor(agent))
    used: set[int] = set()
    for ep in episodes:
        task = (ep.task or "").strip()
        if ep.id == MAIN or not task:
            continue
        for k, (n, call) in enumerate(calls):
            prompts = prompts_of(call.arguments)
            if k not in used and any(p == task or p in task for p in prompts):
                used.add(k)
                ep.parent_step, ep.parent_call_id, ep.parent_tool = n, call.id, call.name
                break


def choose(episodes: Sequence[Episode], wanted: str, where: str) -> Episode:
    """The episode ``wanted`` of a source (``where`` names it); ReplayBadInput ``unknown_episode``
    naming the known ids otherwise."""
    if not wanted:
        raise ReplayUsageError("usage", "--episode: give an episode id (main, or a subagent's id)")
    for ep in episodes:
        if ep.id == wanted:
            if ep.error is not None:
                raise ReplayBadInput("bad_source", ep.error)
            return ep
    known = ", ".join(ep.id for ep in listed(episodes))
    raise ReplayBadInput(
        "unknown_episode",
        f"--episode {shown(show_path(wanted))}: {where} has no such episode (episodes: {known})",
    )


def listed(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes a source lists: those whose file could be read."""
    return [ep for ep in episodes if ep.error is None]


def skipped_files(episodes: Sequence[Episode]) -> list[Any]:
    """A ``subagent_skipped`` NativeWarning per episode whose file could not be read (where: the
    episode; message: why, naming its file)."""
    from pvisor.adapters.native.diagnostics import NativeWarning

    return [
        NativeWarning("subagent_skipped", f"episode {ep.id}", f"not read: {ep.error}")
        for ep in episodes
        if ep.error is not None
    ]


def _first_task(chain: Chain) -> str | None:
    """The user texts of the chain's request 1, context first and the task last (Gemini CLI puts
    the parent's prompt inside a template with more text after it)."""
    from pvisor.adapters.journal_trajectory import request_task

    task, context = request_task(chain.first.conversation())
    return None if task is None else "\n".join([*context, task])


def journal_episodes(classification: Classification, main_steps: Sequence[Step], agent: str) -> list[Episode]:
    """The episodes of a classified run: ``main`` (the main chain) and each other chain that a
    main-loop ``subagent`` call spawned (its id that call's id), in the order of their start."""
    c = classification
    if c.main is None:
        return []
    main = Episode(MAIN, len(main_steps), chain=c.main.number)
    others = [
        Episode("", len(ch.slots), _first_task(ch), chain=ch.number) for ch in c.chains if ch is not c.main
    ]
    link(others, main_steps, agent)
    linked = [ep for ep in others if ep.parent_step is not None]
    for ep in linked:
        ep.id = ep.parent_call_id or f"{ep.parent_tool}@{ep.parent_step}"
    for ep in linked:
        ep.note = indistinct_note(ep, main_steps, agent)
    return [main, *linked]


def indistinct_note(ep: Episode, main_steps: Sequence[Step], agent: str) -> tuple[str, str] | None:
    """``subagents_indistinct`` when another subagent call of the main loop has the prompt that
    linked ``ep`` to its parent call: such subagents send the same request 1, which the chain
    rule reads as a retry, so a journal run cannot tell their chains apart (docs/steps.md,
    "Episodes"); None otherwise."""
    from pvisor.adapters.agents import get_descriptor
    from pvisor.adapters.spawned import prompts_of

    task = (ep.task or "").strip()
    prompts = [
        {p for p in prompts_of(call.arguments) if p in task}
        for _, call in subagent_calls(main_steps, get_descriptor(agent))
    ]
    # the prompt is the longest string of the parent's that the task holds (a shared
    # subagent_type is in it too, by chance, at most)
    mine = max((p for ps in prompts for p in ps), key=len, default=None)
    same = sum(1 for ps in prompts if mine in ps) if mine else 0
    if same < 2:
        return None
    return (
        "subagents_indistinct",
        f"episode {ep.id}: {same} subagent calls of the main loop have the same prompt; their "
        "subagents send the same requests, which the chain rule reads as retries, so this "
        "episode's steps may hold another subagent's exchanges and miss some of its own "
        "(docs/steps.md, Episodes)",
    )


def journal_classification(classification: Classification, episode: Episode) -> Classification:
    """The classification with the episode's chain as its main chain: what
    :func:`~pvisor.adapters.journal_trajectory.build_trajectory` reads that episode's steps from."""
    if episode.id == MAIN:
        return classification
    chain = next(ch for ch in classification.chains if ch.number == episode.chain)
    return replace(classification, main=chain)


def native_episodes(path: Path, agent: str, traj: Any, read: Any = None) -> list[Episode]:
    """The episodes of the native file ``path`` read as ``traj`` by ``agent``'s adapter: ``main``
    and each subagent the adapter lists (its ``subagent_files``: ``meta["subagents"]`` files
    beside it, or Codex's rollouts naming it as their parent, read here for their steps and
    task; ``meta["sidechains"]`` inline lines), linked to their parent calls. Ids: the file's
    name without ``.jsonl`` (a Codex rollout's: the subagent's session id).
    ``read``: ``read_native``'s signature. A subagent file that cannot be read (BadInputError) is
    an episode with its ``error`` (:func:`listed` leaves it out, :func:`skipped_files` warns of it,
    :func:`choose` raises it)."""
    from pvisor.adapters.native import get_adapter, read_native
    from pvisor.core.errors import BadInputError

    meta = traj.meta or {}
    main = Episode(MAIN, len(traj.steps), traj.task, path=str(path))
    subs: list[Episode] = []
    for sub in get_adapter(agent).subagent_files(path, meta):
        stem = os.path.splitext(os.path.basename(sub["path"]))[0]
        name = sub["agent_id"] if stem.startswith("rollout-") else stem
        try:
            result, _ = (read or read_native)(sub["path"], agent, None)
        except BadInputError as exc:  # one unreadable subagent file leaves the others readable
            bad = Episode(name, 0, path=sub["path"])
            bad.error = exc.message
            subs.append(bad)
            continue
        t = result.trajectory
        subs.append(Episode(name, len(t.steps), t.task, path=sub["path"]))
    for side in meta.get("sidechains") or []:
        agent_id = side["agent_id"]
        result, _ = read_native(path, agent, sidechain=agent_id)
        t = result.trajectory
        # lines without an agentId: one episode per chain, numbered in file order
        name = f"sidechain-{agent_id[1:]}" if agent_id.startswith("#") else f"agent-{agent_id}"
        subs.append(Episode(name, len(t.steps), t.task, path=str(path), sidechain=agent_id))
    link(subs, traj.steps, agent)
    wire = _wire_ids(traj.steps, agent)
    for ep in subs:
        # the parent call's id as the agent sent it (Gemini CLI's file stores ``<name>__<id>``):
        # the id a journal run of the same session names it by
        ep.parent_call_id = wire.get((ep.parent_step, ep.parent_call_id), ep.parent_call_id)
    return [main, *subs]


def _wire_ids(steps: Sequence[Step], agent: str) -> dict[tuple[int, str | None], str | None]:
    """(step, call id as the native file stores it) -> the id the agent sends it back under
    (the descriptor's ``wire_action`` in its first protocol), for the steps whose calls it
    gives one for one."""
    from pvisor.adapters.agents import get_descriptor
    from pvisor.journal.model import ToolCall

    d = get_descriptor(agent)
    out: dict[tuple[int, str | None], str | None] = {}
    for step in steps:
        calls = [c for c in step.action.tool_calls if c.kind != "server"]
        wired = [
            p.id
            for p in d.wire_action(d.protocols[0], step.action).parts
            if isinstance(p, ToolCall) and p.kind != "server"
        ]
        if len(wired) == len(calls):
            out.update({(step.n, c.id): w for c, w in zip(calls, wired)})
    return out


def read_native_episode(path: Path, agent: str, episode: Episode, read: Any = None) -> Any:
    """``read_native``'s (result, notes) for a subagent episode of :func:`native_episodes`."""
    from pvisor.adapters.native import read_native

    if episode.sidechain is not None:
        return read_native(path, agent, sidechain=episode.sidechain)
    assert episode.path is not None
    return (read or read_native)(episode.path, agent, None)
