"""``pvisor replay --replay-only``: re-run a recorded run up to step N with the live agent.

In order (docs/replay.md):

1. The options are checked: an agent with a launch profile, exactly one source, ``--workspace``
   (required, a directory, not the recorded run's own workspace nor inside or around it),
   ``--output`` (not inside the workspace; not empty unless ``--force`` or only a failed
   replay's files are there).
2. The source is read into a :class:`~pvisor.replay.recording.Recording` (a journal run, or the
   agent's native file); the task is its ``task`` label, the recorded command line read by the
   descriptor, the prompt of its first main-loop request read by the descriptor (a run captured
   by ``pvisor gateway``), the native file's task, or ``--task``.
3. The agent is launched as ``pvisor run`` launches it (:func:`pvisor.session.run.run_agent`:
   its launch profile, a private home, its own session, supervision) with the recorded task and
   model, a dummy key and no upstream: the gateway answers through
   :class:`~pvisor.replay.playback.PlaybackResponder`. The derived run goes into the journal
   with mode ``replay-only``, its parent run and the boundary step.
4. Request N+1 is kept as the prefix and answered with the synthetic final reply; the agent then
   ends (or is stopped ``end_grace`` seconds later). ``prefix.json``, ``prefix.request.json``
   and ``result.json`` (docs/result-protocol.md, a
   :class:`~pvisor.replay.result.ResultDocument`) are written; a replay that does not succeed
   writes its ``result.json`` with status ``failed`` or ``diverged`` and returns it with the
   error beside it (:class:`~pvisor.replay.errors.ReplayFailed`, or the error that stopped it,
   with the documented exit code); the error never carries the document.

This module runs those steps; its parts are :mod:`.replay_options` (the arguments),
:mod:`.replay_checks` (the options checked before anything runs), :mod:`.replay_result` (the
result filled in once the agent ran) and :mod:`.continuation_result` (a continuation's part of it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pvisor.adapters.native.assembly import text_of
from pvisor.core import progress
from pvisor.core.errors import BadInputError, PvisorError, UsageError
from pvisor.journal.model import RunMode
from pvisor.journal.reader import JournalReader
from pvisor.replay.continuation import ContinuationResponder, LivePolicy, ReasoningPolicy
from pvisor.replay.errors import ReplayBadInput, ReplayUsageError, show_path
from pvisor.replay.numbering import Wording, pause_of
from pvisor.replay.episode_playback import EpisodePlayback
from pvisor.replay.episodes import MAIN
from pvisor.replay.playback import PathRewrites, PlaybackResponder
from pvisor.replay.recording import TaskOrigin, journal_recording, native_recording
from pvisor.replay.output import (
    RESULT_FILE,
    check_output,
    commit_temps,
    create_output,
    write_file,
    write_temps,
)
from pvisor.replay.result import (
    ResultDocument,
    ResultMessage,
    ResultStatus,
    dump_result,
    elapsed_ms,
    file_sha256,
    notes_messages,
    workspace_digest,
)
from pvisor.replay.snapshots import restore_snapshot, run_snapshots
from pvisor.replay.source import descriptor
from pvisor.replay.spec import ReplayProblems, in_order, problems_error
from pvisor.session.children import (
    check_child_workspace,
    child_named,
    child_target,
    claim_child,
    release_child,
)
from pvisor.session.continuation_result import fill_live
from pvisor.session.handoff_result import (
    PauseReset,
    SourceSnapshots,
    check_reset,
    check_source_reasoning,
    fill_handoff,
    handoff_failure,
    handoff_refusal,
    handoff_lineage,
    handoff_responder,
    start_snapshot_of,
)
from pvisor.session.launch import AgentUnavailable
from pvisor.session.replay_checks import (
    agent_missing,
    check_before_acting,
    check_boundary_prompt,
    check_live,
    check_options,
    check_own_workspace,
    has_key,
    limits_of,
    resolved,
)
from pvisor.session.replay_options import (
    DEFAULT_TIMEOUT_S,
    END_GRACE_S,
    ReplayOnlyOptions,
    ReplayOptions,
)
from pvisor.session.replay_result import (
    failure,
    fill_after,
    observation_counts,
    fill_prefix,
    fill_restored,
    label_status,
    remove_prefix_files,
)
from pvisor.session.run import RunRequest, run_agent, without_userinfo
from pvisor.session.run_report import RunReport
from pvisor.session.start_state import likely_cause, start_environment, start_snapshot, withheld_files
from pvisor.session.sandbox import (
    SandboxMode,
    SandboxNetwork,
    default_mode,
    failed_calls,
    resolve_mode,
    sandbox_summary,
)


#: the names this module gave before its split (the options moved to :mod:`.replay_options`)
__all__ = [
    "DEFAULT_TIMEOUT_S",
    "END_GRACE_S",
    "ReplayOnlyOptions",
    "ReplayOnlyOutcome",
    "ReplayOptions",
    "continue_replay",
    "hand_over",
    "replay_only",
]


@dataclass
class ReplayOnlyOutcome:
    """What a replay-only or continuation did: the ``result`` document (the dict written,
    ``record.to_json()``), the output directory, the ``record``
    (:class:`~pvisor.replay.result.ResultDocument`) and the ``error`` that ended it (a
    :class:`~pvisor.core.errors.PvisorError` with its code and exit code; None when the
    status is ``ok``)."""

    result: dict[str, Any]
    output: Path
    record: ResultDocument | None = None
    error: PvisorError | None = None

    def summary(self) -> str:
        r = self.result
        # (observation_counts: a finish action's calls, a handoff's carriers and reads served
        # first are not counted; a call without a recorded or replayed result is counted apart)
        seen = r["observations"]
        ended = r["agent_run"]["ended_by"]
        prefix = r["prefix"]
        where = (
            f"prefix {prefix['path']} ({prefix['bytes']} bytes, ending with the {prefix['ends_with']})"
            if prefix
            else "no prefix"
        )
        live = r.get("continuation")
        b = r["boundary"]
        episode = (r.get("source") or {}).get("episode")
        of = f" of episode {episode['id']}" if episode else ""  # a subagent's own steps
        head = f"{r['agent']} {{}} step {b['after_step']} of {b['steps_total']}{of} as run {r['derived_run']}"
        h = r.get("handoff")
        if h:
            # a handoff: who took over, and what became of the source's calls
            fates: dict[str, int] = {}
            for c in h["calls"]:
                fates[c["fate"]] = fates.get(c["fate"], 0) + 1
            said = ", ".join(f"{n} {f}" for f, n in fates.items()) or "no call"
            if not h["translated"]:  # the same agent: a continuation from the pause
                said = f"{len(h['calls'])} call(s) served as recorded"
            ws = h["workspace"]
            state = (
                "the workspace equals the pause's snapshot"
                if ws["equal"]
                else f"the workspace differs from the pause's snapshot in {ws['differences_total']} path(s)"
                if ws["compared"]
                else "the workspace not compared"
            )
            head = (
                f"{h['from_agent']} handed over to {{}} after step {b['after_step']} of {b['steps_total']} "
                f"as run {r['derived_run']} ({h['target_steps']} step(s) of its own: {said}; {state})"
            )
        rerun = (
            f"{r['replayed_tool_calls']} tool call(s) re-run, {seen['equal_normalised']} of "
            f"{seen['compared']} observation(s) equal once normalised"
        )
        if seen["not_compared"]:
            rerun += f", {seen['not_compared']} not compared (no recorded or no replayed result)"
        if r["playback"]["task_origin"] == TaskOrigin.REQUEST.value:
            # the run kept no task (a `pvisor gateway` capture): say where the agent's came from
            rerun += "; the task read from its first request"
        if live is not None:
            br = live["boundary_request"]
            sent = (
                "request N+1 forwarded byte-identical"
                if br and br["byte_identical"]
                else f"request N+1 forwarded with {', '.join(br['why'])}"
                if br
                else "no request N+1"
            )
            went = f"{live['live_steps']} live step(s) from {live['upstream']}"
            ended_live = live["ended_by"]
            verb = head.format(r["agent"]) if h else f"continued {head.format('after')}"
            return f"{verb}: {rerun}; {where}; {sent}; {went}; ended by {ended_live}"
        if h:
            return f"{head.format(r['agent'])}: {rerun}; {where}; the agent ended by {ended}"
        return f"replayed {head.format('to')}: {rerun}; {where}; the agent ended by {ended}"

    def sandbox_line(self) -> str | None:
        """The line printed after the summary (and before an error): where the agent ran and how
        many calls its sandbox stopped (:func:`~pvisor.session.sandbox.sandbox_summary`); None
        when the agent did not run."""
        return sandbox_summary(self.result.get("sandbox"))


def _record(opts: ReplayOptions) -> Any:
    agent = opts.source_agent or opts.agent  # a handoff reads the source as its own agent's
    if opts.run is not None:
        return journal_recording(opts.journal, opts.run, agent, opts.after_step, opts.task, opts.episode)
    assert opts.trajectory is not None
    if opts.episode not in (None, MAIN):
        raise ReplayUsageError(
            "usage",
            f"--episode {opts.episode} with --trajectory: a native file's subagent is replayed with the "
            "agent from its journal run only (--run RUN); --prepare-only reads it from the file",
        )
    return native_recording(
        opts.trajectory, agent, opts.after_step, opts.task, opts.session, opts.allow_damaged
    )


def is_live(mode: RunMode, opts: ReplayOptions) -> bool:
    """Whether the replay goes on with the live model after its boundary: a continuation, and a
    handoff without ``replay_only``."""
    return mode is RunMode.CONTINUATION or (mode is RunMode.HANDOFF and not opts.replay_only)


def _source_descriptor(opts: ReplayOptions, d: Any) -> Any:
    """The descriptor that reads the source's calls: the source agent's in a handoff, else ``d``."""
    if opts.source_agent is None or opts.source_agent == opts.agent:
        return d
    return descriptor(opts.source_agent)


def _fill_recording(result: ResultDocument, rec: Any) -> None:
    result.fill_source(rec)
    result.warnings += notes_messages(rec.notes)


def _origin_phrase(origin: str | None) -> str:
    """The task's origin (:class:`~pvisor.replay.recording.TaskOrigin`'s value) as the
    ``task_unusable`` message names it."""
    return {
        TaskOrigin.LABEL.value: "the run's task label",
        TaskOrigin.ARGV.value: "from the recorded command line",
        TaskOrigin.TRAJECTORY.value: "the native file's",
        TaskOrigin.REQUEST.value: "read from the run's first request",
        TaskOrigin.OPTION.value: "--task",
    }.get(origin or "", "recorded")


def _no_task(source: Path | None, rec: Any) -> str:
    """The ``no_task`` message: where no task was found, and why the first request gave none."""
    where = show_path(source)
    if rec.kind == "native":
        return (
            f"{where} holds no task for the agent (no first user message, or a blank one): give --task TEXT"
        )
    if rec.no_task_why is not None:
        return (
            f"{where}: run {rec.run} has no task label and no command line, and its first request gives no "
            f"task for sure ({rec.no_task_why}): give --task TEXT, the prompt the agent was given"
        )
    return (
        f"{where} holds no task for the agent (no task label, no command line, and no prompt in its first "
        "request to read it from): give --task TEXT"
    )


def replay_only(
    opts: ReplayOptions, warn: Callable[[str], None], problems: Sequence[PvisorError] = ()
) -> ReplayOnlyOutcome:
    """Replay ``opts`` (module docstring). Returns the outcome once the output directory was
    accepted and ``result.json`` written: ``error`` None when its status is ``ok``, else the
    error that ended it (ReplayFailed, ReplayBadInput, ReplayUsageError, UnavailableError, ...;
    :class:`~pvisor.replay.spec.ReplayProblems` for several problems found before anything ran,
    ``problems`` among them: those the caller found in the options already). Raises what is
    refused before (the options, the output directory, the child run)."""
    return _replay_agent(opts, warn, RunMode.REPLAY_ONLY, problems)


def continue_replay(
    opts: ReplayOptions, warn: Callable[[str], None], problems: Sequence[PvisorError] = ()
) -> ReplayOnlyOutcome:
    """Replay ``opts`` through step N, then continue with the live model (docs/replay.md
    "Continuation"). Returns and raises as :func:`replay_only`; the result document holds the
    continuation's fields as well (``continuation``, ``live_requests``, ...)."""
    return _replay_agent(opts, warn, RunMode.CONTINUATION, problems)


def hand_over(
    opts: ReplayOptions, warn: Callable[[str], None], problems: Sequence[PvisorError] = ()
) -> ReplayOnlyOutcome:
    """Hand the source over to ``opts.agent`` (a handoff: :mod:`pvisor.session.handover`; its
    source read as ``opts.source_agent``'s). Returns and raises as :func:`replay_only`; the
    result (mode ``handoff``) holds the handoff report, and ``continuation`` unless
    ``opts.replay_only``."""
    return _replay_agent(opts, warn, RunMode.HANDOFF, problems)


def _replay_agent(
    opts: ReplayOptions, warn: Callable[[str], None], mode: RunMode, problems: Sequence[PvisorError]
) -> ReplayOnlyOutcome:
    t0 = time.perf_counter()
    problems = list(problems)
    d, source_ok = check_options(opts, problems)
    live = is_live(mode, opts)
    upstream = check_live(opts, d, problems) if live else None
    out: Path | None = None
    try:
        out = Path(
            check_output(
                opts.output,
                opts.workspace,
                opts.force,
                "the output must not be where the agent works (it can read and change it)",
            )
        )
    except PvisorError as exc:
        problems.append(exc)
        source_ok = False  # a journal is read only when what it could write beside it is checked
    if problems:
        return _refuse(opts, mode, d, problems, out, source_ok, t0)
    assert out is not None
    child = claimed = None
    if opts.child_run is not None:
        child = child_target(opts.journal, opts.child_run, opts.child_option)
        if child.boundary_step is not None and child.boundary_step != opts.after_step:
            # the caller's own words: child_run= from Python, --child-run from the command line
            w = Wording.PYTHON if opts.child_option.endswith("=") else Wording.CLI
            raise UsageError(
                f"{child_named(opts.child_option, child.id)}: the handoff's child run continues "
                f"{_pause_of(child)}; this replay is {w.option('after_step', opts.after_step)}"
            )
        # in the journal, before the output or the workspace is touched: of two replays started
        # at once one goes on, the other is refused as a start made later is
        claimed = claim_child(opts.journal, child.id, opts.child_option)
    try:
        outcome = _replay_claimed(opts, warn, mode, d, child, claimed, t0, upstream, out)
    except BaseException:
        if child is not None:
            release_child(opts.journal, child.id)  # a no-op once the agent's attempt was recorded
        raise
    if outcome.error is not None and child is not None:
        release_child(opts.journal, child.id)
    return outcome


def _refuse(
    opts: ReplayOptions,
    mode: RunMode,
    d: Any,
    problems: list[PvisorError],
    out: Path | None,
    source_ok: bool,
    t0: float,
) -> ReplayOnlyOutcome:
    """``problems`` with the source's own problem (when its options let it be read) and a
    missing agent: raised (:func:`~pvisor.replay.spec.raise_problems`) unless the output
    directory ``out`` was accepted (else None) and one of those was found; then a failed
    result.json in it lists them all in ``errors``, returned as the outcome with the error (the
    one problem, or :class:`~pvisor.replay.spec.ReplayProblems`). Usage errors alone write
    nothing, as ever."""
    rec = None
    found: list[PvisorError] = []
    if source_ok:
        try:
            rec = _record(opts)
        except PvisorError as exc:
            found.append(exc)
        else:
            unrecorded = None if opts.allow_unrecorded else rec.unrecorded_error(opts.after_step)
            if unrecorded is not None:
                found.append(unrecorded)
    missing = agent_missing(opts, d)
    if missing is not None:
        found.append(missing)
    problems += found
    error = problems_error(problems)
    assert error is not None
    if not found or out is None or not source_ok:
        raise error  # (a document names its source: none without one)
    result = _start(opts, mode)
    if rec is not None:
        _fill_recording(result, rec)
    elif getattr(found[0], "recording", None) is not None:
        _fill_recording(result, found[0].recording)  # type: ignore[attr-defined]
    create_output(out, opts.output)
    return _failed_outcome(result, in_order(problems), out, t0, error)


def _start(opts: ReplayOptions, mode: RunMode) -> ResultDocument:
    """The result document of a replay with the agent before anything is done (status failed),
    with the options' own warnings (``opts.option_notes``)."""
    result = ResultDocument.start(
        mode,
        opts.agent,
        opts.trajectory,
        opts.journal if opts.run is not None else None,
        opts.run,
        opts.after_step,
    )
    result.warnings += notes_messages(opts.option_notes)
    return result


def _replay_claimed(
    opts: ReplayOptions,
    warn: Callable[[str], None],
    mode: RunMode,
    d: Any,
    child: Any,
    claimed: int | None,
    t0: float,
    upstream: str | None,
    out: Path,
) -> ReplayOnlyOutcome:
    """:func:`_replay_agent` once the options are checked (``upstream``: the live model's URL of
    a continuation; ``out``: the accepted output directory) and the child run (if any) is
    claimed (``claimed``: when): the source read, the workspace restored and digested, the
    agent run with playback, the result filled in and written."""
    live = is_live(mode, opts)
    result = _start(opts, mode)
    if live and mode is RunMode.HANDOFF:
        result.continuation = None
    timings = result.timings_ms
    create_output(out, opts.output)
    assert opts.workspace is not None
    ws = resolved(opts.workspace)
    restored = None
    try:
        sd = _source_descriptor(opts, d)
        rec = _read_source(opts, d, sd, child, result, live, ws)
        # a handoff's source snapshots, read once (start state, lineage, reset, comparison)
        snaps = SourceSnapshots(opts.journal, rec, opts.after_step) if mode is RunMode.HANDOFF else None
        if snaps is not None:
            check_reset(opts, snaps)
            check_source_reasoning(opts, rec, snaps, result)
        # before anything runs or is written into the workspace
        check_before_acting(opts, rec, sd, ws, result, warn)
        start_from = opts.workspace_from
        state = None
        if snaps is None:
            # the recorded start state: the start snapshot and the start environment
            state = start_snapshot(opts, rec, ws, result)
            start_environment(opts, rec, ws, state, result)
            result.start_state = state.to_json()
            start_from = state.snapshot_run
        elif start_from is None:
            start_from = start_snapshot_of(opts, rec, ws, warn, snaps)
        if start_from is not None:
            t = time.perf_counter()
            restored = _restore_start(opts.journal, start_from, ws)
            timings.workspace_restore = elapsed_ms(t, time.perf_counter())
            if state is not None:
                withheld_files(state, restored, result)
        t = time.perf_counter()
        ws_before = workspace_digest(ws)
        timings.workspace_before = elapsed_ms(t, time.perf_counter())
        t = time.perf_counter()
        given = state.variables if state is not None else {}
        p, report = _run_with_playback(opts, warn, mode, d, rec, result, ws, claimed, upstream, snaps, given)
        timings.agent = elapsed_ms(t, time.perf_counter())
        result.agent_started = True
        fill_after(result, opts, rec, p, report, ws, ws_before, out, warn, restored)
        if state is not None:
            likely_cause(state, result, rec)
            result.start_state = state.to_json()
        result.sandbox = dict(
            report.sandbox, failed_calls=failed_calls(report.sandbox, p.replayed_observations(), text_of)
        )
        if child is not None:
            # the derived run is the handoff's child: its lineage is the journal's, whose snapshot
            # is the one the handoff restored (what --workspace-from restored stays in
            # workspace.restored_from)
            assert result.lineage is not None
            result.lineage.workspace_snapshot = child.workspace_snapshot
            if mode is not RunMode.HANDOFF:  # a handoff compares with the pause's snapshot itself
                _check_child_boundary(result, opts, child, p.n, warn)
        if live:
            fill_live(result, opts, rec, p, report, upstream)
        if snaps is not None:
            fill_handoff(result, opts, rec, p, report, snaps, getattr(p, "reset", None))
        result.observations = observation_counts(result)
        files = fill_prefix(result, opts, rec, p, out)
        return _write_outcome(result, opts, p, report, files, out, t0)
    except PvisorError as exc:
        if restored is not None and result.workspace is None:
            # the agent did not start (or ended in error) after the start snapshot was restored:
            # the result says what the workspace now holds, so that the next attempt's "not
            # empty" is explained
            fill_restored(result, ws, restored)
        return _write_failed(result, opts, d, exc, out, t0)


def _read_source(
    opts: ReplayOptions, d: Any, sd: Any, child: Any, result: ResultDocument, live: bool, ws: Path
) -> Any:
    """The source read into its recording (filled into ``result``) and checked against what the
    run needs: the child run's parent, a task the agent can be started with, a boundary prompt a
    request N+1 can carry (``live``), a workspace ``ws`` that is not the recorded run's own."""
    source_path = opts.trajectory if opts.trajectory is not None else opts.journal
    if opts.trajectory is not None:
        result.source.sha256 = file_sha256(opts.trajectory)
    rec = _record(opts)
    _fill_recording(result, rec)
    if child is not None and child.parent_run and rec.run and child.parent_run != rec.run:
        raise ReplayUsageError(
            "usage",
            f"{child_named(opts.child_option, child.id)}: the handoff's child run continues run "
            f"{child.parent_run}; this replay is of run {rec.run}",
        )
    if rec.task is None:
        raise ReplayBadInput("no_task", _no_task(source_path, rec))
    unfit = d.task_unfit(rec.task)
    if unfit is not None:
        raise ReplayBadInput(
            "task_unusable",
            f"{show_path(source_path)}: the task ({_origin_phrase(rec.task_origin)}) {unfit}; no agent "
            "can be started with it (--prepare-only starts none)",
        )
    if live:
        check_boundary_prompt(opts, rec, sd)
    check_own_workspace(rec, ws)
    return rec


def _run_with_playback(
    opts: ReplayOptions,
    warn: Callable[[str], None],
    mode: RunMode,
    d: Any,
    rec: Any,
    result: ResultDocument,
    ws: Path,
    claimed: int | None,
    upstream: str | None,
    snaps: SourceSnapshots | None = None,
    variables: dict[str, str] | None = None,
) -> tuple[Any, RunReport]:
    """The agent run in ``ws`` as ``pvisor run`` runs it, answered by playback (and, in a
    continuation, the live ``upstream`` after step N), a progress bar counting the main-loop
    requests served up to the boundary N + 1. ``snaps``: a handoff's source snapshots (None
    otherwise); ``variables``: the recorded start environment's, set for the agent below the
    config's ``environment``. Returns the responder and the run's report."""
    live = is_live(mode, opts)
    holder: dict[str, Any] = {}
    labels = {"source_kind": rec.kind, "source": show_path(rec.path)}
    if rec.kind == "native":
        labels["source_sha256"] = result.source.sha256 or ""
    lineage = handoff_lineage(opts, rec, snaps) if snaps is not None else {}
    labels.update(lineage.get("labels", {}))
    handing = mode is RunMode.HANDOFF
    what = f"handing {rec.agent} over to {opts.agent} at" if handing else f"replaying {opts.agent} to"
    with progress.task(f"{what} step {opts.after_step}", opts.after_step + 1) as task:

        def make(setup: Any) -> Any:
            responder = _responder(opts, rec, d, live, setup, snaps)
            responder.on_request = task.reach
            if handing and opts.reset_to_pause:
                responder.reset = responder.on_boundary = PauseReset(opts, snaps, setup.workspace)
            holder["responder"] = responder
            return responder

        # resolved here (auto: bwrap or none, its one warning): a sandboxed continuation gets a dummy key
        asked = _enum(SandboxMode, opts.sandbox, "sandbox") or default_mode(SandboxMode.AUTO)
        sandbox = resolve_mode(asked, warn)
        limits = limits_of(opts)
        request = RunRequest(
            agent=opts.agent,
            task=rec.task,
            journal_path=opts.journal,
            entrypoint=opts.entrypoint,
            workspace=ws,
            timeout=opts.timeout,
            allow_unsupported=opts.allow_unsupported,
            model=opts.model or (rec.model if rec.agent == opts.agent else None),
            responder=make,
            mode=mode.value,
            parent_run=rec.run,
            boundary_step=opts.after_step,
            pause_transition=lineage.get("pause_transition"),
            workspace_snapshot=lineage.get("workspace_snapshot"),
            labels=labels,
            upstream_label=f"playback:{rec.kind}"
            + (f", then {without_userinfo(upstream)}" if upstream else ""),
            end_grace=opts.end_grace,
            upstream=upstream,
            agent_env={**(variables or {}), **opts.agent_env},
            private_env=opts.private_env,
            agent_args=list(opts.agent_args),
            intercept=opts.intercept,
            child_run=opts.child_run,
            child_option=opts.child_option,
            child_claimed=claimed,
            dummy_key=_dummy_key(opts, d, live, sandbox, warn),
            sandbox=sandbox,
            sandbox_asked=asked,
            sandbox_network=_enum(SandboxNetwork, opts.sandbox_network, "sandbox_network")
            or SandboxNetwork.GATEWAY,
            sandbox_allow=[Path(p) for p in opts.sandbox_allow or ()],
            # what the recorded run used: hidden from the agent (the recorded calls name it)
            sandbox_hide=[Path(p) for p in (rec.workspace, rec.home, rec.run_dir) if p],
            sandbox_memory=limits.memory if limits is not None else None,
            sandbox_cpus=limits.cpus if limits is not None else None,
        )
        try:
            report = run_agent(request, warn)
        except AgentUnavailable as exc:
            exc.code = "agent_unavailable"  # type: ignore[attr-defined]
            raise
    return holder["responder"], report


def _dummy_key(
    opts: ReplayOptions, d: Any, live: bool, sandbox: SandboxMode, warn: Callable[[str], None]
) -> bool:
    """Whether the agent of a continuation gets a dummy key (the gateway swaps the user's key in
    when it forwards: :func:`~pvisor.session.containment.key_swap`): in a sandbox, so that no recorded or
    live call can read the user's key; and with a local upstream and no key of the user's, since
    the agent still wants one to start. Not in intercept mode, whose forwards are never swapped
    (a sandboxed agent then keeps the key: one warning)."""
    if not live or not d.key_env:
        return False
    if sandbox is SandboxMode.BWRAP:
        if opts.intercept is None:
            return True
        warn(
            f"intercept mode: the sandboxed agent holds your {d.key_env} (a dummy key is swapped through "
            "the reverse proxy only; drop --intercept to keep the key out of the sandbox)"
        )
    return bool(opts.upstream and not has_key(opts, d.key_env))


def _enum(kind: Any, value: Any, name: str) -> Any:
    """``value`` as a member of the enum ``kind`` (None for None); ReplayUsageError for another
    (a Python caller's: the command line checks its choices)."""
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ReplayUsageError("usage", f"{name}={value!r}: expected one of {choices}") from None


def _responder(
    opts: ReplayOptions, rec: Any, d: Any, live: bool, setup: Any, snaps: SourceSnapshots | None
) -> Any:
    """The gateway's responder for the run ``setup`` (:class:`~pvisor.session.run.RunSetup`):
    playback of ``rec`` through step N with the recorded paths rewritten to the run's, then the
    synthetic end (replay-only) or the live model (a continuation)."""
    pairs = [(rec.workspace, str(setup.workspace), "workspace")]
    if rec.home and setup.home is not None:
        pairs.append((rec.home, str(setup.home), "home"))
    if rec.run_dir:
        pairs.append((rec.run_dir, str(setup.run_dir), "run_dir"))
        # the run id alone: agents also name their home relative to the workspace (../runs/<id>/home)
        pairs.append((Path(rec.run_dir).name, setup.run, "run_id"))
    rewrites = PathRewrites([p for p in pairs if p[0]])
    policy = LivePolicy(
        max_steps=opts.max_steps,
        boundary_prompt=opts.boundary_prompt,
        reasoning=ReasoningPolicy(opts.reasoning),
        live_model=opts.live_model,
    )
    if opts.source_agent is not None and opts.source_agent != opts.agent:
        assert snaps is not None
        return handoff_responder(
            opts, rec, d, rewrites, str(setup.workspace), policy if live else None, snaps
        )
    if not live:
        if rec.parent is not None:  # a subagent episode: the main loop served up to its parent step
            return EpisodePlayback(rec, opts.after_step, d, rewrites)
        return PlaybackResponder(rec, opts.after_step, d, rewrites)
    return ContinuationResponder(rec, opts.after_step, d, rewrites, policy)


def _write_outcome(
    result: ResultDocument,
    opts: ReplayOptions,
    p: Any,
    report: RunReport,
    files: list[tuple[Path, bytes]],
    out: Path,
    t0: float,
) -> ReplayOnlyOutcome:
    """The status and error of the replay the agent ran, ``result.json`` written after the
    prefix ``files`` (a diverged replay still shows how far it got)."""
    # a refusal at B's request 1 ended B: that, not B's early end, is the error
    error = handoff_refusal(result, opts) or failure(result, p, report, opts) or handoff_failure(result, opts)
    result.status = (
        ResultStatus.DIVERGED
        if p.divergence is not None or getattr(error, "code", None) == "workspace_diverged"
        else ResultStatus.FAILED
        if error
        else ResultStatus.OK
    )
    result.timings_ms.total = elapsed_ms(t0, time.perf_counter())
    if error is not None:
        result.errors.append(ResultMessage(error.code, error.detail))
    label_status(result, opts.journal)
    if not files:
        remove_prefix_files(out)  # no prefix files of an earlier replay beside this result
    # a diverged replay still shows how far it got; result.json last
    document = result.to_json()
    tmps = write_temps(files)
    write_temps([(out / RESULT_FILE, dump_result(document))], tmps)
    commit_temps(tmps)
    return ReplayOnlyOutcome(document, out, result, error)


def _write_failed(
    result: ResultDocument, opts: ReplayOptions, d: Any, exc: PvisorError, out: Path, t0: float
) -> ReplayOnlyOutcome:
    """The failed ``result.json`` of a replay ``exc`` stopped, returned with its error."""
    if getattr(exc, "recording", None) is not None and result.boundary.steps_total is None:
        _fill_recording(result, exc.recording)  # type: ignore[attr-defined]
    result.status = ResultStatus.FAILED
    label_status(result, opts.journal)
    # a source that stops the replay before the agent starts: a missing agent is said too
    missing = agent_missing(opts, d) if isinstance(exc, BadInputError) and not result.agent_started else None
    # several problems found before the agent acts (check_before_acting): each is an error
    problems = list(exc.problems) if isinstance(exc, ReplayProblems) else [exc]
    if missing is not None:
        problems.append(missing)
    error = problems_error(problems)
    assert error is not None
    return _failed_outcome(result, problems, out, t0, error)


def _failed_outcome(
    result: ResultDocument, problems: Sequence[PvisorError], out: Path, t0: float, error: PvisorError
) -> ReplayOnlyOutcome:
    """``result`` with ``problems`` as its errors, written as the failed ``result.json`` in
    ``out`` (no prefix files left beside it; a result that cannot be written is the error's
    loss, not another), returned with ``error``."""
    for problem in problems:
        result.add_error(problem)
    result.timings_ms.total = elapsed_ms(t0, time.perf_counter())
    remove_prefix_files(out)
    document = result.to_json()
    try:
        write_file(out / RESULT_FILE, dump_result(document))
    except PvisorError:
        pass
    return ReplayOnlyOutcome(document, out, result, error)


def _restore_start(journal: Path, run: str, ws: Path) -> dict[str, Any]:
    """Restore the start snapshot (the workspace after step 0) of journal run ``run`` into the
    empty ``ws``: the ``workspace.restored_from`` object of the result. ReplayBadInput
    ``no_snapshot`` when the run has none (or its walk failed)."""
    with JournalReader(journal) as reader:
        snaps = run_snapshots(reader, run)
        try:
            snap = snaps.pick(0)
        except BadInputError as exc:
            raise ReplayBadInput("no_snapshot", f"--workspace-from {run}: {exc.message}") from None
        return restore_snapshot(reader, snap, ws).to_json()


def _pause_of(child: Any) -> str:
    return pause_of(child.boundary_step, child.pause_transition)


def _check_child_boundary(
    result: ResultDocument, opts: ReplayOptions, child: Any, served: int, warn: Callable[[str], None]
) -> None:
    """Compare the workspace after the replayed step N (the derived run's snapshot after its
    ``served`` steps: request N+1's) with the snapshot the handoff restored for ``child``; one
    warning line and a result warning ``handoff_workspace_differs`` when they differ or cannot
    be compared."""
    try:
        with JournalReader(opts.journal) as reader:
            # the derived run's steps: a handoff's (``served``, B's own) may be more or fewer
            digest = run_snapshots(reader, child.id).pick(served).digest
    except PvisorError:
        digest = None
    said: list[str] = []
    where = f"the replay's workspace {_pause_of(child)}"
    if not check_child_workspace(child, digest, where, said.append):
        warn(said[0])
        result.warn("handoff_workspace_differs", said[0])
