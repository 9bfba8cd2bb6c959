"""``pvisor handoff`` and :func:`handoff`: the next agent B takes over a run of agent A at a pause.

docs/handoff.md. In order:

1. The pause is resolved on the source (a journal run, or A's native file) as ``pvisor view``
   resolves it (:class:`~pvisor.replay.views.PauseSpec`: ``--step K [--before]``,
   ``--after-step N``, ``--progress F``, ``--before-commitment``): N steps kept.
2. B starts on the recorded task in ``workspace``: the source run's start snapshot restored when
   the workspace is empty and the run has one (else as given, one warning), contained by the
   sandbox as any replay.
3. Playback serves B, at its requests 1..M, A_1..A_N translated by effect into the tools B
   declared in its own request 1 (:mod:`pvisor.replay.translate`); B re-runs them. Request M+1
   ends at B's own observation and goes to the live model (``replay_only``: it is recorded and
   B is ended). B = A is a continuation from the pause (nothing translated) with a handoff's
   lineage.
4. The result (mode ``handoff``) carries the handoff report (:mod:`.handoff_result`); the derived
   run is filed in the journal as the parent's child (mode ``handoff``, parent run, pause,
   snapshot digest, labels naming both agents).

Errors: as a replay's (docs/result-protocol.md), and ``handoff_refused`` (exit 65: B's schema
refuses a translated call, or B declared no shell tool), ``workspace_diverged`` (exit 1 with
``strict_workspace``). A pause that the source does not have is a usage error (exit 2; no result
is written: the pause is the command's, as ``pvisor view``'s); a source that cannot be read at
all is the replay's own source error (a failed result.json in an output it accepted).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from pvisor.adapters.agents import agent_names
from pvisor.core.errors import PvisorError, UsageError
from pvisor.journal.paths import default_journal_path
from pvisor.journal.redact import has_key_shape
from pvisor.replay.numbering import Position, Wording
from pvisor.replay.recording import journal_recording, native_recording
from pvisor.replay.source_reasoning import SourceReasoning
from pvisor.replay.views import HandoffBranch, PauseKind, PauseSpec, TrajectoryReplay
from pvisor.session.api import Result, Source, agent_of, source_of
from pvisor.session.replay import ReplayOnlyOutcome, hand_over
from pvisor.session.replay_checks import related, resolved
from pvisor.session.replay_options import DEFAULT_TIMEOUT_S, ReplayOptions


def resolve_pause(
    journal: Path, run: str | None, trajectory: Path | None, agent: str | None, pause: Any, wording: Wording
) -> Position:
    """The pause ``pause`` (a :class:`PauseSpec`, or an int: the steps kept) on the source, as
    ``pvisor view`` resolves it. UsageError (exit 2) for a pause out of range, BadInputError
    (exit 65) for a source that cannot be read or a commitment it does not have."""
    if isinstance(pause, bool) or not isinstance(pause, (int, PauseSpec)):
        raise UsageError(
            f"pause={pause!r}: give a PauseSpec (kind step, progress or before_commitment) or the steps "
            "kept (an int)"
        )
    spec = pause if isinstance(pause, PauseSpec) else PauseSpec(None, PauseKind.STEP, after_step=pause)
    if run is not None:
        replay = TrajectoryReplay.from_journal(journal, run)
    else:
        assert trajectory is not None
        replay = TrajectoryReplay.from_trajectory(trajectory, agent, wording=wording)
    replay.wording = wording
    position, _ = replay.resolve(spec)
    return position


def unreadable_source(
    journal: Path, run: str | None, trajectory: Path | None, agent: str | None, **read: Any
) -> bool:
    """Whether the source cannot be read at all as the replay reads it (``read``: ``task``,
    ``session``, ``allow_damaged``): then the replay's own read says why, in its words, and
    writes the failed result.json (:func:`pvisor.session.replay.hand_over`), rather than the
    pause's. False for a missing journal (nothing is opened, let alone created) and an agent
    not given (the pause's error says to give it)."""
    if agent is None or (run is not None and not journal.exists()):
        return False
    try:
        if run is not None:
            journal_recording(journal, run, agent, 0, read.get("task"))
        else:
            assert trajectory is not None
            native_recording(
                trajectory, agent, 0, read.get("task"), read.get("session"), bool(read.get("allow_damaged"))
            )
    except PvisorError:
        return True
    return False


def pause_or_source_error(
    journal: Path,
    run: str | None,
    trajectory: Path | None,
    agent: str | None,
    pause: Any,
    wording: Wording,
    **read: Any,
) -> int:
    """The steps kept at ``pause`` (:func:`resolve_pause`), or 0 when the source cannot be read
    at all (:func:`unreadable_source`): the replay then refuses it with its own source error and
    a failed result. Raises the pause's error otherwise."""
    try:
        return resolve_pause(journal, run, trajectory, agent, pause, wording).kept
    except PvisorError:
        if unreadable_source(journal, run, trajectory, agent, **read):
            return 0  # never used to pick a step: the source's read fails first
        raise


def agent_the_file_says(path: Path) -> str | None:
    """The agent a trajectory in an interchange format (ATIF) names, as its reader maps it
    (docs/native.md, "ATIF as a source": ``atif`` for one pvisor does not know); None for an
    agent's own file (which does not say which agent wrote it for sure) or a file that cannot be
    read (the replay's read then says why)."""
    from pvisor.adapters.agents import format_names
    from pvisor.adapters.native import detect, read_native

    try:
        found = detect(path)
        if len(found) != 1 or found[0] not in format_names():
            return None
        return read_native(path, found[0])[0].agent
    except PvisorError:
        return None


def handoff_options(
    *,
    to_agent: str,
    journal: Path,
    run: str | None,
    trajectory: Path | None,
    agent: str,
    after_step: int,
    workspace: Path | None,
    output: Path,
    source_reasoning: Any = SourceReasoning.DROP,
    reasoning_option: str = "--source-reasoning",
    **options: Any,
) -> ReplayOptions:
    """The replay options of a handoff to ``to_agent`` of the source (``run`` of ``journal``, or
    ``agent``'s native ``trajectory``) after ``after_step`` steps. UsageError (exit 2) for an
    unknown ``to_agent`` and a ``source_reasoning`` that is no
    :class:`~pvisor.replay.source_reasoning.SourceReasoning` (named as ``reasoning_option``)."""
    if to_agent not in agent_names():
        raise UsageError(
            f"--to-agent {to_agent!r}: the next agent is one pvisor starts: {', '.join(agent_names())}"
        )
    try:
        mode = SourceReasoning(source_reasoning)
    except ValueError:
        choices = ", ".join(m.value for m in SourceReasoning)
        raise UsageError(f"{reasoning_option} {source_reasoning!r}: expected one of {choices}") from None
    return ReplayOptions(
        source_reasoning=mode,
        agent=to_agent,
        source_agent=agent,
        after_step=after_step,
        output=output,
        workspace=workspace,
        journal=journal,
        run=run,
        trajectory=trajectory,
        **options,
    )


def run_handoff(
    opts: ReplayOptions, warn: Callable[[str], None], problems: Sequence[PvisorError] = ()
) -> ReplayOnlyOutcome:
    """Hand the source over (module docstring): the outcome of the derived run (result.json
    written), or raised what is refused before anything ran."""
    return hand_over(opts, warn, problems)


def handoff(
    source: Source | HandoffBranch,
    pause: Any = None,
    *,
    to_agent: str,
    workspace: os.PathLike[str] | str,
    output: os.PathLike[str] | str | None = None,
    agent: str | None = None,
    journal: os.PathLike[str] | str | None = None,
    replay_only: bool = False,
    upstream: str | None = None,
    max_steps: int | None = None,
    boundary_prompt: str | None = None,
    live_model: str | None = None,
    model: str | None = None,
    entrypoint: str | None = None,
    task: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    force: bool = False,
    allow_unsupported: bool = False,
    allow_damaged: bool = False,
    strict_workspace: bool = False,
    restore: bool = True,
    reset_to_pause: bool = False,
    source_reasoning: SourceReasoning | str = SourceReasoning.DROP,
    sandbox: str | None = None,
    sandbox_network: str = "gateway",
    warn: Callable[[str], None] | None = None,
) -> Result:
    """Hand ``source`` over to ``to_agent`` at ``pause``, as ``pvisor handoff`` does.

    ``source``: a journal run id (str), a native file as a path object (with ``agent``; an ATIF
    file's by default), or a :class:`~pvisor.replay.views.HandoffBranch` (what
    ``TrajectoryReplay.restore_handoff`` returned): then the source is the branch's parent run in
    the branch's journal, the pause is the branch's (``through_step`` steps kept; ``pause`` None,
    or one that resolves to it), and the derived run is filed under the branch's pending child
    run (its id, mode ``handoff`` and lineage kept; it starts once). ``pause``: a
    :class:`~pvisor.replay.views.PauseSpec`, or the steps kept as an int.

    ``workspace``: where B re-runs the history, from the source run's start state (its start
    snapshot is restored into it when it is empty, unless ``restore`` is False). For a branch it
    must be a new directory, not the branch's own: that one holds the state AT the pause, and
    re-running the history on it would apply A_1..A_N a second time.

    ``output``: result.json and the prefix files (default: a new temporary directory);
    ``replay_only``: end B at its boundary request, not going on with the live model at
    ``upstream`` (None: B's public API, its key from the environment); ``strict_workspace``,
    ``reset_to_pause``, ``source_reasoning`` (a ``SourceReasoning`` or its value) as
    ``--strict-workspace``, ``--reset-to-pause``, ``--source-reasoning``; the others as ``pvisor
    replay``'s. Returns a :class:`~pvisor.session.api.Result` whenever a result was written,
    whatever its status (``derived_run``: B's run). Raises PvisorError (``exit_code``: 2 usage,
    65 a source that cannot be used, 69 an agent not installed) when none could be: bad options,
    a refused output, a pause out of range, a branch's child run started already. ``warn``:
    given each warning line, those said before the agent starts as they come, then the result's.
    """
    for name, value in (("to_agent", to_agent), ("agent", agent)):
        if isinstance(value, str):
            _refuse_key_shaped(name, value, "an agent name")
    journal_path, run, trajectory, child_run, agent, after_step = _source_and_pause(
        source, pause, journal, workspace, agent, task, allow_damaged
    )
    out = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="pvisor-handoff-"))
    opts = handoff_options(
        to_agent=to_agent,
        journal=journal_path,
        run=run,
        trajectory=trajectory,
        agent=agent,
        after_step=after_step,
        workspace=Path(workspace),
        output=out,
        replay_only=replay_only,
        upstream=upstream,
        max_steps=max_steps,
        boundary_prompt=boundary_prompt,
        live_model=live_model,
        model=model,
        entrypoint=entrypoint,
        task=task,
        timeout=timeout,
        force=force,
        allow_unsupported=allow_unsupported,
        allow_damaged=allow_damaged,
        strict_workspace=strict_workspace,
        restore_start=restore,
        reset_to_pause=reset_to_pause,
        **_reasoning(source_reasoning),
        sandbox=sandbox,
        sandbox_network=sandbox_network,
        child_run=child_run,
        child_option="child_run=",
    )
    said = warn or (lambda _m: None)
    outcome = run_handoff(opts, said)
    # the result's warnings too (the command prints them once the run ended)
    for w in outcome.result.get("warnings") or ():
        said(w["message"])
    if outcome.error is not None:
        return Result(outcome.result, opts.output, outcome.error.message, outcome.error.exit_code)
    return Result(outcome.result, outcome.output)


def _source_and_pause(
    source: Any,
    pause: Any,
    journal: os.PathLike[str] | str | None,
    workspace: os.PathLike[str] | str,
    agent: str | None,
    task: str | None,
    allow_damaged: bool,
) -> tuple[Path, str | None, Path | None, str | None, str, int]:
    """:func:`handoff`'s source read: (journal, run, trajectory, the branch's child run or None,
    the source's agent, the steps kept at the pause). UsageError (exit 2) naming the parameter
    for a source or pause that is not one; what the source's read raises."""
    child_run = None
    if isinstance(source, HandoffBranch):
        journal_path, run, trajectory, child_run = _of_branch(source, pause, journal, workspace)
        pause = source.through_step
    else:
        journal_path = Path(journal) if journal is not None else default_journal_path()
        if isinstance(source, (str, os.PathLike)):
            _refuse_key_shaped("source", os.fspath(source), "a run id or a file")
        run, trajectory = source_of(
            source,
            "a journal run id (str), a native trajectory file (pathlib.Path) or a HandoffBranch "
            "(TrajectoryReplay.restore_handoff)",
        )
        if pause is None:
            raise UsageError(
                "pause= is needed: a PauseSpec (kind step, progress or before_commitment) or the steps kept "
                "(an int)"
            )
    if agent is None and trajectory is not None:
        # an interchange file (ATIF) names its agent, as the command line takes it
        agent = agent_the_file_says(trajectory)
    if agent is None and trajectory is not None:
        raise UsageError("agent= is needed with a native trajectory (which agent wrote it?)")
    after_step = pause_or_source_error(
        journal_path,
        run,
        trajectory,
        agent,
        pause,
        Wording.PYTHON,
        task=task,
        allow_damaged=allow_damaged,
    )
    if agent is None:
        assert run is not None
        agent = agent_of(journal_path, run)
    return journal_path, run, trajectory, child_run, agent, after_step


def _reasoning(mode: Any) -> dict[str, Any]:
    """:func:`handoff`'s ``source_reasoning`` for :func:`handoff_options`, named in its words."""
    return {"source_reasoning": mode, "reasoning_option": "source_reasoning="}


def _refuse_key_shaped(name: str, text: str, what: str) -> None:
    """UsageError (exit 2) naming the parameter ``name`` when ``text`` holds a key-shaped token,
    never showing it (as the command line's ``refuse_key_shaped``): a key pasted for a run id, a
    path or an agent would be echoed by the error that names the value."""
    if has_key_shape(text):
        raise UsageError(f"{name} holds a key-shaped token (not shown): a key is never {what}")


def _of_branch(
    branch: HandoffBranch, pause: Any, journal: Any, workspace: Any
) -> tuple[Path, str, None, str]:
    """(journal, parent run, no trajectory, child run) of a handoff from ``branch``; UsageError
    (exit 2) for a branch without a journal or parent run, a ``journal`` or ``pause`` that
    is not the branch's, and a ``workspace`` that is, holds or lies in the branch's restored
    directory."""
    if branch.journal is None or not branch.parent_run:
        raise UsageError(
            f"source: HandoffBranch of child run {branch.child_run} names no journal or parent run: give "
            "the branch TrajectoryReplay.restore_handoff returned"
        )
    journal_path = Path(branch.journal)
    if journal is not None and resolved(Path(journal)) != resolved(journal_path):
        raise UsageError(
            f"journal={os.fspath(journal)!r}: the HandoffBranch's child run {branch.child_run} is in journal "
            f"{journal_path}; leave journal= out"
        )
    if pause is not None:
        kept = resolve_pause(journal_path, branch.parent_run, None, None, pause, Wording.PYTHON).kept
        if kept != branch.through_step:
            raise UsageError(
                f"pause={pause!r} keeps {kept} step(s); the HandoffBranch's child run {branch.child_run} "
                f"continues after step {branch.through_step}: leave pause= out"
            )
    if isinstance(branch.workspace, (str, os.PathLike)) and isinstance(workspace, (str, os.PathLike)):
        mine, theirs = resolved(Path(workspace)), resolved(Path(branch.workspace))
        if related(mine, theirs):
            raise UsageError(
                f"workspace={os.fspath(workspace)!r} is, holds or lies in the HandoffBranch's restored "
                f"directory {theirs}, which holds the state at the pause: the next agent re-runs the "
                "history from the start state, so give a new empty directory"
            )
    return journal_path, branch.parent_run, None, branch.child_run


__all__ = [
    "agent_the_file_says",
    "handoff",
    "handoff_options",
    "pause_or_source_error",
    "resolve_pause",
    "run_handoff",
    "unreadable_source",
]
