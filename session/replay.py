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
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pvisor.core import progress
from pvisor.core.errors import BadInputError, PvisorError, UsageError
from pvisor.journal.model import RunMode
from pvisor.replay.errors import (
    ReplayBadInput,
    ReplayFailed,
    ReplayUsageError,
    show_path,
)
from pvisor.replay.prepare import check_utf8_option
from pvisor.replay.agent_result import AgentRunEnd, AgentRunRecord, PlaybackSummary
from pvisor.replay.spec import REASONING, collect, in_order, problems_error
from pvisor.replay.output import (
    check_output,
    commit_temps,
    create_output,
    write_file,
    write_temps,
)
from pvisor.replay.result import (
    PREFIX_FILE,
    REQUEST_FILE,
    RESULT_FILE,
    Lineage,
    ResultDocument,
    ResultMessage,
    ResultStatus,
    WorkspaceRecord,
    dump_result,
    elapsed_ms,
    file_sha256,
    notes_messages,
    prefix_record,
    workspace_digest,
)

#: seconds the agent may go on after its synthetic final reply before it is stopped
END_GRACE_S = 30.0
#: default --timeout of a replay, seconds
DEFAULT_TIMEOUT_S = 900.0


@dataclass
class ReplayOptions:
    """The arguments of one replay-only (``pvisor replay --replay-only``; docs/replay.md).

    Fields: ``agent``; ``after_step`` N; ``output`` directory; ``workspace`` (required: where
    the agent re-runs its tools); exactly one of ``trajectory`` (native file) and ``run``
    (journal run, read from ``journal``); ``journal`` (also where the derived run goes);
    ``entrypoint`` (the agent's executable; default its command on PATH); ``task`` (when the
    source holds none, or to replay with another); ``session`` (OpenCode stores);
    ``timeout`` seconds for the whole agent run; ``force``; ``allow_unsupported`` (an installed
    agent version outside its profile's range); ``end_grace`` seconds after the synthetic end;
    ``model`` the agent is launched with (default: the recorded one); ``agent_env`` and
    ``agent_args`` (a config's ``environment`` and ``arguments``).

    A continuation (:func:`continue_replay`) also reads: ``upstream`` (the live model's base URL;
    None: the agent's public API, which needs the user's key in the environment),
    ``max_steps`` (None: no budget; else >= 1), ``boundary_prompt``, ``reasoning`` (``keep`` or
    ``strip``), ``live_model`` (None: the model the agent asks for); ``allow_damaged``: play a
    damaged native file back anyway (each repair listed); ``workspace_from``: a journal run
    whose start snapshot is restored into the (empty) ``workspace`` before the agent starts;
    ``child_run``: the pending child run of a handoff the derived run is filed under (it must
    continue the replayed run after step N; :func:`pvisor.session.children.child_target`), its
    workspace compared at the boundary with the snapshot the handoff restored;
    ``child_option``: how errors name it (``--child-run``, ``child_run=``)."""

    agent: str
    after_step: int
    output: Path
    workspace: Path | None
    journal: Path
    trajectory: Path | None = None
    run: str | None = None
    entrypoint: str | None = None
    task: str | None = None
    session: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    force: bool = False
    allow_unsupported: bool = False
    end_grace: float = END_GRACE_S
    model: str | None = None
    agent_env: dict[str, str] = field(default_factory=dict)
    agent_args: list[str] = field(default_factory=list)
    upstream: str | None = None
    max_steps: int | None = None
    boundary_prompt: str | None = None
    reasoning: str = "keep"
    live_model: str | None = None
    allow_damaged: bool = False
    workspace_from: str | None = None
    intercept: Any = None
    child_run: str | None = None
    child_option: str = "--child-run"


#: the name of the options before continuation came
ReplayOnlyOptions = ReplayOptions


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
        from pvisor.replay.recording import TaskOrigin

        r = self.result
        # the calls of a finish action have no observation (never sent): not counted
        calls = [c for c in r["tool_calls"] if not c["observation_not_sent"]]
        same = sum(1 for c in calls if c["equal_normalised"])
        ended = r["agent_run"]["ended_by"]
        prefix = r["prefix"]
        where = (
            f"prefix {prefix['path']} ({prefix['bytes']} bytes, ending with the {prefix['ends_with']})"
            if prefix
            else "no prefix"
        )
        live = r.get("continuation")
        b = r["boundary"]
        head = f"{r['agent']} {{}} step {b['after_step']} of {b['steps_total']} as run {r['derived_run']}"
        rerun = (
            f"{r['replayed_tool_calls']} tool call(s) re-run, {same} of {len(calls)} observation(s) "
            "equal once normalised"
        )
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
            return f"continued {head.format('after')}: {rerun}; {where}; {sent}; {went}; ended by {live['ended_by']}"
        return f"replayed {head.format('to')}: {rerun}; {where}; the agent ended by {ended}"


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _related(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def _check(opts: ReplayOnlyOptions, problems: list[PvisorError]) -> tuple[Any, bool]:
    """Every problem of the options, each added to ``problems`` (usage errors, exit 2, in the
    order they were always checked). Returns the agent's descriptor (None for an unknown agent)
    and whether the source can be read (its options passed)."""
    from pvisor.replay.source import descriptor

    d = None
    try:
        d = descriptor(opts.agent)
    except PvisorError as exc:
        problems.append(exc)
    source_ok = d is not None
    for opt, value in (
        ("--output", opts.output),
        ("--trajectory", opts.trajectory),
        ("--run", opts.run),
        ("--journal", opts.journal),
        ("--workspace", opts.workspace),
        ("--task", opts.task),
        ("--agent-entrypoint", opts.entrypoint),
        ("--session", opts.session),
    ):
        if not collect(problems, check_utf8_option, opt, value) and opt in (
            "--trajectory",
            "--run",
            "--journal",
        ):
            source_ok = False
    if d is not None and not d.launchable:
        source_ok = False  # the source read for this agent would only say again that it is the wrong one
        problems.append(
            ReplayUsageError(
                "no_launch_profile",
                f"--replay-only runs the agent, and pvisor cannot start {opts.agent} (no launch profile); "
                "--prepare-only works from its trajectory",
            )
        )
    if (opts.trajectory is None) == (opts.run is None):
        source_ok = False
        problems.append(
            UsageError(
                "give exactly one source: --trajectory PATH (a native file) or --run ID (a journal run)"
            )
        )
    if opts.run is not None and not opts.run.strip():
        source_ok = False
        problems.append(
            UsageError(
                "--run is empty: give a run id or a unique prefix of one (pvisor journal ls lists them)"
            )
        )
    if opts.task is not None and not opts.task.strip():
        problems.append(UsageError("--task is blank: give the task the agent is to be given"))
    if opts.after_step < 0:
        source_ok = False
        problems.append(
            ReplayUsageError(
                "usage", f"--after-step {opts.after_step}: N counts steps from 0 (the task alone)"
            )
        )
    workspace_ok = False
    if opts.workspace is None:
        problems.append(
            ReplayUsageError(
                "workspace_refused",
                "replaying with the agent (--replay-only, continuation) needs --workspace DIR: "
                "a new directory where it re-runs its tools "
                "(never the recorded run's own: recorded commands can delete or push)",
            )
        )
    elif not opts.workspace.is_dir():
        problems.append(
            ReplayUsageError(
                "workspace_refused", f"--workspace {show_path(opts.workspace)}: no such directory"
            )
        )
    else:
        workspace_ok = True
    journal_ok = opts.journal.exists()
    if (opts.run is not None or opts.workspace_from is not None) and not journal_ok:
        source_ok = source_ok and opts.run is None
        problems.append(UsageError(f"--journal {show_path(opts.journal)}: no such journal file"))
    if opts.workspace_from is not None and journal_ok:
        collect(problems, _check_workspace_from, opts, workspace_ok)
    if opts.trajectory is not None:
        from pvisor.adapters.native import check_source_file

        if not collect(
            problems, check_source_file, opts.trajectory, f"--trajectory {show_path(opts.trajectory)}"
        ):
            source_ok = False
    if opts.timeout <= 0:
        problems.append(UsageError(f"--timeout must be more than 0 seconds, not {opts.timeout:g}"))
    if opts.model is not None and not opts.model.strip():
        problems.append(UsageError("--model is empty: give a model name, or leave the option out"))
    if (
        workspace_ok
        and opts.workspace is not None
        and _resolved(opts.workspace) in _resolved(opts.journal).parents
    ):
        source_ok = False  # reading it would write its -wal/-shm files into the workspace
        problems.append(
            ReplayUsageError(
                "workspace_refused",
                f"--journal {show_path(opts.journal)} lies inside --workspace {show_path(opts.workspace)}: "
                "the agent could read or change it",
            )
        )
    return d, source_ok


def _check_workspace_from(opts: ReplayOnlyOptions, workspace_ok: bool) -> None:
    """``--workspace-from RUN``: a run of the journal, restored into an empty ``--workspace``."""
    assert opts.workspace_from is not None
    if not opts.workspace_from.strip():
        raise UsageError(
            "--workspace-from is empty: give the run whose start state to restore (pvisor snapshot ls RUN)"
        )
    from pvisor.journal.reader import JournalReader

    with JournalReader(opts.journal) as reader:
        reader.run(opts.workspace_from)  # an unknown run: a usage error before anything is written
    if not workspace_ok:
        return
    assert opts.workspace is not None
    try:
        holds = any(opts.workspace.iterdir())
    except OSError as exc:
        raise ReplayUsageError(
            "workspace_refused",
            f"--workspace {show_path(opts.workspace)} cannot be read ({exc.strerror})",
        ) from None
    if holds:
        raise ReplayUsageError(
            "workspace_refused",
            f"--workspace {show_path(opts.workspace)} is not empty: --workspace-from restores the recorded "
            "start state into an empty directory",
        )


def _restore_start(journal: Path, run: str, ws: Path) -> dict[str, Any]:
    """Restore the start snapshot (the workspace after step 0) of journal run ``run`` into the
    empty ``ws``: the ``workspace.restored_from`` object of the result. ReplayBadInput
    ``no_snapshot`` when the run has none (or its walk failed)."""
    from pvisor.core.errors import BadInputError
    from pvisor.journal.reader import JournalReader
    from pvisor.replay.snapshots import restore_snapshot, run_snapshots

    with JournalReader(journal) as reader:
        snaps = run_snapshots(reader, run)
        try:
            snap = snaps.pick(0)
        except BadInputError as exc:
            raise ReplayBadInput("no_snapshot", f"--workspace-from {run}: {exc.message}") from None
        return restore_snapshot(reader, snap, ws).to_json()


def _record(opts: ReplayOnlyOptions) -> Any:
    from pvisor.replay.recording import journal_recording, native_recording

    if opts.run is not None:
        return journal_recording(opts.journal, opts.run, opts.agent, opts.after_step, opts.task)
    assert opts.trajectory is not None
    return native_recording(
        opts.trajectory, opts.agent, opts.after_step, opts.task, opts.session, opts.allow_damaged
    )


def _fill_recording(result: ResultDocument, rec: Any) -> None:
    result.fill_source(rec)
    result.warnings += notes_messages(rec.notes)


def _origin_phrase(origin: str | None) -> str:
    """The task's origin (:class:`~pvisor.replay.recording.TaskOrigin`'s value) as the
    ``task_unusable`` message names it."""
    from pvisor.replay.recording import TaskOrigin

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


def _replay_agent(
    opts: ReplayOptions, warn: Callable[[str], None], mode: RunMode, problems: Sequence[PvisorError]
) -> ReplayOnlyOutcome:
    from pvisor.session.children import child_target, claim_child, release_child

    t0 = time.perf_counter()
    problems = list(problems)
    d, source_ok = _check(opts, problems)
    live = mode is RunMode.CONTINUATION
    upstream = _check_live(opts, d, problems) if live else None
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
            from pvisor.replay.numbering import Wording

            # the caller's own words: child_run= from Python, --child-run from the command line
            w = Wording.PYTHON if opts.child_option.endswith("=") else Wording.CLI
            raise UsageError(
                f"{_named(opts.child_option, child.id)}: the handoff's child run continues "
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


def _agent_missing(opts: ReplayOptions, d: Any) -> PvisorError | None:
    """The agent's executable looked up as the run will (exit 69 ``agent_unavailable`` when it is
    missing), or None: for the problems reported together before anything runs."""
    from pvisor.adapters.agents import get_profile
    from pvisor.session.launch import find_executable

    if d is None or not d.launchable:
        return None
    try:
        find_executable(get_profile(opts.agent), opts.entrypoint)
    except PvisorError as exc:
        exc.code = "agent_unavailable"  # type: ignore[attr-defined]
        return exc
    return None


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
    missing = _agent_missing(opts, d)
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
    for problem in in_order(problems):
        result.add_error(problem)
    result.timings_ms.total = elapsed_ms(t0, time.perf_counter())
    create_output(out, opts.output)
    _remove_prefix_files(out)
    document = result.to_json()
    try:
        write_file(out / RESULT_FILE, dump_result(document))
    except PvisorError:
        pass
    return ReplayOnlyOutcome(document, out, result, error)


def _start(opts: ReplayOptions, mode: RunMode) -> ResultDocument:
    """The result document of a replay with the agent before anything is done (status failed)."""
    return ResultDocument.start(
        mode,
        opts.agent,
        opts.trajectory,
        opts.journal if opts.run is not None else None,
        opts.run,
        opts.after_step,
    )


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
    claimed (``claimed``: when)."""
    from pvisor.session.launch import AgentUnavailable
    from pvisor.session.run import RunRequest, run_agent, without_userinfo
    from pvisor.replay.playback import PathRewrites, PlaybackResponder, recorded_prefix

    live = mode is RunMode.CONTINUATION
    result = _start(opts, mode)
    timings = result.timings_ms
    create_output(out, opts.output)
    holder: dict[str, Any] = {}
    assert opts.workspace is not None
    ws = _resolved(opts.workspace)
    try:
        source_path = opts.trajectory if opts.trajectory is not None else opts.journal
        if opts.trajectory is not None:
            result.source.sha256 = file_sha256(opts.trajectory)
        rec = _record(opts)
        _fill_recording(result, rec)
        if child is not None and child.parent_run and rec.run and child.parent_run != rec.run:
            raise ReplayUsageError(
                "usage",
                f"{_named(opts.child_option, child.id)}: the handoff's child run continues run "
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
            _check_boundary_prompt(opts, rec, d)
        if rec.workspace and _related(_resolved(Path(rec.workspace)), ws):
            raise ReplayUsageError(
                "workspace_refused",
                f"--workspace {show_path(ws)} is, holds or lies in the recorded run's own workspace "
                f"{rec.workspace}: recorded commands can delete or push; give a new directory",
            )
        if opts.workspace_from is not None:
            t = time.perf_counter()
            restored = _restore_start(opts.journal, opts.workspace_from, ws)
            holder["restored"] = restored
            timings.workspace_restore = elapsed_ms(t, time.perf_counter())
        t = time.perf_counter()
        ws_before = workspace_digest(ws)
        timings.workspace_before = elapsed_ms(t, time.perf_counter())

        def make(setup: Any) -> Any:
            pairs = [(rec.workspace, str(setup.workspace), "workspace")]
            if rec.home and setup.home is not None:
                pairs.append((rec.home, str(setup.home), "home"))
            if rec.run_dir:
                pairs.append((rec.run_dir, str(setup.run_dir), "run_dir"))
                # the run id alone: agents also name their home relative to the workspace (../runs/<id>/home)
                pairs.append((Path(rec.run_dir).name, setup.run, "run_id"))
            rewrites = PathRewrites([p for p in pairs if p[0]])
            if live:
                from pvisor.replay.continuation import ContinuationResponder, LivePolicy, ReasoningPolicy

                policy = LivePolicy(
                    max_steps=opts.max_steps,
                    boundary_prompt=opts.boundary_prompt,
                    reasoning=ReasoningPolicy(opts.reasoning),
                    live_model=opts.live_model,
                )
                responder: Any = ContinuationResponder(rec, opts.after_step, d, rewrites, policy)
            else:
                responder = PlaybackResponder(rec, opts.after_step, d, rewrites)
            responder.on_request = task.reach
            holder["responder"] = responder
            return responder

        labels = {"source_kind": rec.kind, "source": show_path(rec.path)}
        if rec.kind == "native":
            labels["source_sha256"] = result.source.sha256 or ""
        t = time.perf_counter()
        # the bar counts main-loop requests served, up to the boundary N + 1
        with progress.task(f"replaying {opts.agent} to step {opts.after_step}", opts.after_step + 1) as task:
            try:
                report = run_agent(
                    RunRequest(
                        agent=opts.agent,
                        task=rec.task,
                        journal_path=opts.journal,
                        entrypoint=opts.entrypoint,
                        workspace=ws,
                        timeout=opts.timeout,
                        allow_unsupported=opts.allow_unsupported,
                        model=opts.model or rec.model,
                        responder=make,
                        mode=mode.value,
                        parent_run=rec.run,
                        boundary_step=opts.after_step,
                        labels=labels,
                        upstream_label=f"playback:{rec.kind}"
                        + (f", then {without_userinfo(upstream)}" if upstream else ""),
                        end_grace=opts.end_grace,
                        upstream=upstream,
                        agent_env=dict(opts.agent_env),
                        agent_args=list(opts.agent_args),
                        intercept=opts.intercept,
                        child_run=opts.child_run,
                        child_option=opts.child_option,
                        child_claimed=claimed,
                        # a local upstream and no key of the user's: the agent still wants one to start
                        dummy_key=bool(
                            live and opts.upstream and d.key_env and not _has_key(opts, d.key_env)
                        ),
                    ),
                    warn,
                )
            except AgentUnavailable as exc:
                exc.code = "agent_unavailable"  # type: ignore[attr-defined]
                raise
        timings.agent = elapsed_ms(t, time.perf_counter())
        result.agent_started = True
        p = holder["responder"]
        _fill_after(result, opts, rec, p, report, ws, ws_before, out, warn, holder.get("restored"))
        if child is not None:
            # the derived run is the handoff's child: its lineage is the journal's, whose snapshot
            # is the one the handoff restored (what --workspace-from restored stays in
            # workspace.restored_from)
            assert result.lineage is not None
            result.lineage.workspace_snapshot = child.workspace_snapshot
            _check_child_boundary(result, opts, child, warn)
        if live:
            _fill_live(result, opts, rec, p, report, upstream)
        prefix = recorded_prefix(p)
        files: list[tuple[Path, bytes]] = []
        if prefix is not None:
            body, meta, exchange, rendered = prefix
            from pvisor.adapters.jsonio import dumps

            origin = {
                k: ("rendered" if rendered and k == "messages" else "replay")
                for k in ("messages", "task_context", "system", "tools", "params", "request")
            }
            # the recorded compaction the replayed agent compacted again at (journal sources)
            comp = next((c for c in reversed(rec.compactions) if c.after_step <= opts.after_step), None)
            compaction = comp.record() if comp is not None else None
            result.prefix = prefix_record(
                rec.protocol, body, meta, out, opts.after_step, rendered, exchange, origin, compaction
            )
            files = [(out / PREFIX_FILE, body), (out / REQUEST_FILE, dumps(meta, indent=True) + b"\n")]
        failure = _failure(result, p, report, opts)
        result.status = (
            ResultStatus.DIVERGED
            if p.divergence is not None
            else ResultStatus.FAILED
            if failure
            else ResultStatus.OK
        )
        timings.total = elapsed_ms(t0, time.perf_counter())
        if failure is not None:
            result.errors.append(ResultMessage(failure.code, failure.detail))
        if not files:
            _remove_prefix_files(out)  # no prefix files of an earlier replay beside this result
        # a diverged replay still shows how far it got; result.json last
        document = result.to_json()
        tmps = write_temps(files)
        write_temps([(out / RESULT_FILE, dump_result(document))], tmps)
        commit_temps(tmps)
        return ReplayOnlyOutcome(document, out, result, failure)
    except PvisorError as exc:
        if getattr(exc, "recording", None) is not None and result.boundary.steps_total is None:
            _fill_recording(result, exc.recording)  # type: ignore[attr-defined]
        result.status = ResultStatus.FAILED
        # a source that stops the replay before the agent starts: a missing agent is said too
        missing = (
            _agent_missing(opts, d) if isinstance(exc, BadInputError) and not result.agent_started else None
        )
        problems = [exc] if missing is None else [exc, missing]
        for problem in problems:
            result.add_error(problem)
        timings.total = elapsed_ms(t0, time.perf_counter())
        _remove_prefix_files(out)
        document = result.to_json()
        try:
            write_file(out / RESULT_FILE, dump_result(document))
        except PvisorError:
            pass
        error = problems_error(problems)
        assert error is not None
        return ReplayOnlyOutcome(document, out, result, error)


def _named(option: str, value: str) -> str:
    """``--child-run ID`` or ``child_run='ID'``: an option as its caller wrote it."""
    from pvisor.session.children import child_named

    return child_named(option, value)


def _pause_of(child: Any) -> str:
    from pvisor.replay.numbering import pause_of

    return pause_of(child.boundary_step, child.pause_transition)


def _check_child_boundary(
    result: ResultDocument, opts: ReplayOptions, child: Any, warn: Callable[[str], None]
) -> None:
    """Compare the workspace after the replayed step N (the derived run's snapshot bound to N:
    request N+1's) with the snapshot the handoff restored for ``child``; one warning line and a
    result warning ``handoff_workspace_differs`` when they differ or cannot be compared."""
    from pvisor.session.children import check_child_workspace
    from pvisor.journal.reader import JournalReader
    from pvisor.replay.snapshots import run_snapshots

    try:
        with JournalReader(opts.journal) as reader:
            digest = run_snapshots(reader, child.id).pick(opts.after_step).digest
    except PvisorError:
        digest = None
    said: list[str] = []
    where = f"the replay's workspace {_pause_of(child)}"
    if not check_child_workspace(child, digest, where, said.append):
        warn(said[0])
        result.warn("handoff_workspace_differs", said[0])


def _remove_prefix_files(out: Path) -> None:
    for name in (PREFIX_FILE, REQUEST_FILE):
        try:
            (out / name).unlink()
        except OSError:
            pass


def _ended_by(p: Any, report: Any) -> AgentRunEnd:
    if report.interrupted:
        return AgentRunEnd.INTERRUPTED
    if report.timed_out:
        return AgentRunEnd.TIMEOUT
    if report.stopped_after_end:
        return AgentRunEnd.STOPPED_AFTER_END
    if p.synthetic:
        return AgentRunEnd.SYNTHETIC_END
    return AgentRunEnd.AGENT


def _fill_after(
    result: ResultDocument,
    opts: ReplayOnlyOptions,
    rec: Any,
    p: Any,
    report: Any,
    ws: Path,
    ws_before: Any,
    out: Path,
    warn: Callable[[str], None],
    restored: dict[str, Any] | None = None,
) -> None:
    from pvisor.replay.playback import playback_record

    ws_after = workspace_digest(ws)
    result.workspace = WorkspaceRecord(
        show_path(ws),
        ws_before.sha256,
        ws_after.sha256,
        ws_before.sha256 == ws_after.sha256,
        ws_after.entries,
        restored,
    )
    record = playback_record(p)
    result.path_rewrites = record["path_rewrites"]
    result.auxiliary = record["auxiliary"]
    result.context_differences = record["context_differences"]
    result.tool_differences = record["tool_differences"]
    result.divergence = record["divergence"]
    result.synthetic_end = record["synthetic_end"]
    result.playback = PlaybackSummary(
        record["served"], record["requests"], rec.task_origin, p.boundary is not None
    )
    result.tool_calls = p.tool_calls()
    result.replayed_tool_calls = sum(
        1 for c in result.tool_calls if c.replayed_observation_sha256 is not None
    )
    result.live_requests = 0
    result.derived_run = report.run
    result.lineage = Lineage(
        rec.run,
        opts.after_step,
        result.mode,
        show_path(rec.path),
        restored["manifest"] if restored else None,
    )
    native = str(report.native_path) if report.native_path else None
    result.agent_run = AgentRunRecord(
        report.run,
        report.agent_version,
        rec.agent_version,
        report.agent_exit_code,
        _ended_by(p, report),
        native,
        bool(native and p.synthetic),
        str(report.stdout),
        str(report.stderr),
        str(report.run_dir),
        report.steps,
        report.agent_status.to_json() if report.agent_status else None,
    )
    if rec.agent_version and report.agent_version and rec.agent_version != report.agent_version:
        result.warn(
            "agent_version_differs",
            f"the recording was made with {opts.agent} {rec.agent_version}, "
            f"the installed one is {report.agent_version}",
        )
    if native and p.synthetic:
        result.warn(
            "synthetic_end_in_native",
            f"the agent's native trajectory {native} ends with pvisor's synthetic final reply (request "
            f"{p.synthetic[0].request}), not a model's",
        )
    position: dict[int, int] = {}  # the call's place in its step's batch, from 1
    for c in result.tool_calls:
        position[c.step] = position.get(c.step, 0) + 1
        if c.equal_normalised is False:
            # Gemini's function calls carry no id: such a call is named by its place in the batch
            which = c.call_id or f"call {position[c.step]} of the step"
            result.warn("observation_differs", f"step {c.step} {c.name} ({which}): O' differs from O")
    if report.steps_error:
        result.warn("steps_not_derived", report.steps_error)


def _failure(result: ResultDocument, p: Any, report: Any, opts: ReplayOnlyOptions) -> ReplayFailed | None:
    """The error of a replay that did not succeed, or None."""
    if p.divergence is not None:
        return ReplayFailed("diverged", f"the replay diverged at {p.divergence.sentence()}")
    if report.interrupted:
        where = "after" if p.boundary is not None else "before"
        return ReplayFailed(
            "interrupted",
            f"interrupted by {report.interrupt_signal or 'a signal'} {where} request {opts.after_step + 1}",
            exit_code=report.exit_code,
        )
    live = result.continuation or None  # ABSENT outside a continuation
    if live is not None and p.boundary is not None:
        return _live_failure(live, opts)
    if p.boundary is not None:
        return None
    last = p.latest[0] if p.latest is not None else 0
    if result.prefix is not None:  # A_N made no tool call or finished: the agent ended after it
        return None
    if report.timed_out:
        return ReplayFailed(
            "agent_timeout",
            f"the agent did not reach request {opts.after_step + 1} within --timeout {opts.timeout:g} s "
            f"(its furthest main-loop request was {last})",
            exit_code=124,
        )
    return ReplayFailed(
        "agent_ended_early",
        f"the agent exited (code {report.agent_exit_code}) after main-loop request {last}, before request "
        f"{opts.after_step + 1}; see {report.stderr}",
    )


# --------------------------------------------------------------------------- continuation


class ContinuationEnd(str, enum.Enum):
    """Why a continuation's live part ended (``continuation.ended_by``)."""

    AGENT = "agent"  #: the agent ended by itself after a live reply
    STEP_BUDGET = "step_budget"  #: --max-steps live steps ran; the synthetic final reply ended it
    UPSTREAM_ERROR = "upstream_error"  #: the last live request failed (refused, unreachable)
    REASONING_REJECTED = "reasoning_rejected"  #: the upstream refused the served reasoning
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    DIVERGED = "diverged"  #: playback diverged before N+1: nothing went live
    NOT_REACHED = "not_reached"  #: the agent never sent request N+1


def _check_live(opts: ReplayOptions, d: Any, problems: list[PvisorError]) -> str | None:
    """The continuation's options checked, each problem added to ``problems``; returns the live
    upstream's base URL (``--upstream``, else the agent's public API, whose key must be in the
    environment), None when it is refused."""
    from pvisor.adapters.protocols import UPSTREAMS
    from pvisor.session.run import without_userinfo
    from pvisor.gateway.routing import check_upstream_url

    for opt, value in (
        ("--upstream", opts.upstream),
        ("--boundary-user-prompt", opts.boundary_prompt),
        ("--live-model", opts.live_model),
        ("--model", opts.model),
    ):
        if not collect(problems, check_utf8_option, opt, value) and opt == "--upstream":
            return None
    if opts.max_steps is not None and opts.max_steps < 1:
        problems.append(
            ReplayUsageError(
                "usage",
                f"--max-steps {opts.max_steps}: a continuation runs at least one live step "
                "(--replay-only runs none)",
            )
        )
    if opts.boundary_prompt is not None and not opts.boundary_prompt.strip():
        problems.append(
            ReplayUsageError(
                "usage", "--boundary-user-prompt is empty: give the text, or leave the option out"
            )
        )
    if opts.live_model is not None and not opts.live_model.strip():
        problems.append(
            ReplayUsageError("usage", "--live-model is empty: give a model name, or leave the option out")
        )
    if opts.reasoning not in REASONING:
        problems.append(ReplayUsageError("usage", f"--reasoning {opts.reasoning!r}: expected keep or strip"))
    if opts.upstream is not None:
        try:
            check_upstream_url(opts.upstream)
        except ValueError as exc:
            problems.append(ReplayUsageError("usage", f"--upstream {without_userinfo(opts.upstream)}: {exc}"))
            return None
        return opts.upstream
    if d is None:
        return None
    url = UPSTREAMS[d.upstream][0]
    key = d.key_env
    if key and not _has_key(opts, key):
        problems.append(
            ReplayUsageError(
                "missing_api_key",
                f"a continuation forwards request N+1 to {url}, which needs {key} in the environment: set "
                "it, or give --upstream URL (a local model server)",
            )
        )
        return None
    return url


def _has_key(opts: ReplayOptions, key: str) -> bool:
    """Whether the agent will find its API key ``key`` (a config's environment, or pvisor's)."""
    return bool(opts.agent_env.get(key) or os.environ.get(key))


def _check_boundary_prompt(opts: ReplayOptions, rec: Any, d: Any) -> None:
    """A boundary prompt needs a request N+1: refused when N is the last step and A_N made no
    tool call or is the agent's finish action (the agent ends after A_N; only its native resume
    could send more)."""
    from pvisor.replay.source import finish_at

    if opts.boundary_prompt is None:
        return
    n = opts.after_step
    if n != len(rec.steps) or n == 0:
        return
    finish = finish_at(d, rec.steps, n)
    if finish is not None:
        why = f"A_{n} is the agent's {finish}, which ends its run"
    elif not [c for c in rec.steps[n - 1].action.tool_calls if c.kind != "server"]:
        why = f"A_{n} made no tool call"
    else:
        return
    resume = (
        " (only its native resume could: pvisor run --resume)"
        if d.resumable
        else f"; a prompt can follow an earlier step (N < {n})"
    )
    raise ReplayUsageError(
        "boundary_prompt_impossible",
        f"--boundary-user-prompt after step {n}: it is the last step and {why}, so the agent "
        f"sends no request N+1 to carry the prompt{resume}",
    )


def _error_message(body: bytes | None) -> str | None:
    """``error.message`` of a provider's JSON error body (all four protocols; an ``error`` that
    is a string as it is), the start of a body that is not JSON, or None."""
    import orjson

    from pvisor.adapters.protocols.base import error_object

    if not body:
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", "replace")
    err = error_object(obj)
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return err if isinstance(err, str) else None


def _fill_live(
    result: ResultDocument, opts: ReplayOptions, rec: Any, p: Any, report: Any, upstream: str | None
) -> None:
    """The continuation's fields of the result (docs/result-protocol.md "Continuation"): every
    forwarded request with what the upstream answered (read back from the journal), the
    boundary request, rewrites, expansions, and why it ended."""
    from pvisor.adapters.protocols import get_protocol
    from pvisor.session.run import without_userinfo
    from pvisor.journal.redact import redact_text
    from pvisor.journal.reader import JournalReader

    mod = get_protocol(rec.protocol)
    answered: dict[str, Any] = {}
    bodies: dict[str, bytes | None] = {}
    with JournalReader(opts.journal) as r:
        for ex in r.exchanges(report.run):
            answered[ex.id] = ex
        for lr in p.live:
            ex = answered.get(lr.exchange)
            if ex is not None and (ex.status is None or ex.status >= 400):
                bodies[lr.exchange] = r.response_body(ex)
    requests = []
    for lr in p.live:
        row = lr.to_json()
        ex = answered.get(lr.exchange)
        row["status"] = ex.status if ex is not None else None
        row["outcome"] = ex.outcome if ex is not None else "not_recorded"
        row["error"] = None
        if ex is not None and (ex.status is None or ex.status >= 400):
            message = _error_message(bodies.get(lr.exchange)) or ex.error or ex.outcome
            row["error"] = redact_text(message, p.secrets)[:500]
            refusal = mod.reasoning_refusal(ex.status or 0, bodies.get(lr.exchange) or b"")
            row["reasoning_rejected"] = refusal is not None
        requests.append(row)
    main = [r for r in requests if r["request"] is not None]
    ok_steps = sorted(
        {
            r["request"]
            for r in main
            if r["outcome"] == "ok" and r["status"] is not None and 200 <= r["status"] < 300
        }
    )
    boundary = next((r for r in main if r["request"] == opts.after_step + 1), None)
    last = main[-1] if main else None
    # a request cut short by pvisor stopping the agent (timeout, signal) is not the upstream's failure
    cut = last is not None and last["outcome"] in _CUT_OUTCOMES and (report.timed_out or report.interrupted)
    failed_last = last is not None and last["error"] is not None and not cut
    rejected = next((r for r in main if r.get("reasoning_rejected")), None)
    if p.divergence is not None:
        ended = ContinuationEnd.DIVERGED
    elif report.interrupted:
        ended = ContinuationEnd.INTERRUPTED
    elif p.budget_end is not None:
        ended = ContinuationEnd.STEP_BUDGET
    elif failed_last and last.get("reasoning_rejected"):
        ended = ContinuationEnd.REASONING_REJECTED
    elif failed_last:
        ended = ContinuationEnd.UPSTREAM_ERROR
    elif report.timed_out:
        ended = ContinuationEnd.TIMEOUT
    elif p.boundary is None and not _no_request_after(p):
        ended = ContinuationEnd.NOT_REACHED
    else:
        ended = ContinuationEnd.AGENT
    prompt = opts.boundary_prompt
    result.live_requests = len(requests)
    result.boundary_user_prompt_injected = bool(p.prompt_injected)
    result.continuation = {
        "upstream": without_userinfo(upstream or ""),
        "recorded_model": rec.model,
        "live_model": opts.live_model,
        "max_steps": opts.max_steps,
        "reasoning": opts.reasoning,
        "live_steps": len(ok_steps),
        "ended_by": ended.value,
        "boundary_request": {
            "exchange": boundary["exchange"],
            "sent_sha256": boundary["sent_sha256"],
            "forwarded_sha256": boundary["forwarded_sha256"],
            "byte_identical": boundary["byte_identical"],
            "why": boundary["changes"],
            "status": boundary["status"],
        }
        if boundary is not None
        else None,
        "boundary_user_prompt": {
            "text": prompt,
            "at_entry": p.boundary_at,
            "requests": [r["exchange"] for r in requests if r["prompt_at"] is not None],
            "not_placed": p.prompt_misses,
        }
        if prompt is not None
        else None,
        "requests": requests,
        "reasoning_rewrites": [
            {"exchange": r["exchange"], **w}
            for r in requests
            for w in r["rewrites"]
            if w["of"] == "reasoning"
        ],
        "model_rewrites": [
            {"exchange": r["exchange"], **w} for r in requests for w in r["rewrites"] if w["of"] == "model"
        ],
        "expansions": list(p.expansions),
        "reasoning_rejected": {
            "exchange": rejected["exchange"],
            "request": rejected["request"],
            "message": rejected["error"],
        }
        if rejected is not None
        else None,
        "upstream_error": {
            "exchange": last["exchange"],
            "request": last["request"],
            "status": last["status"],
            "outcome": last["outcome"],
            "message": last["error"],
        }
        if failed_last
        else None,
        "step_budget_end": p.budget_end,
    }
    if p.prompt_misses:
        result.warn(
            "boundary_prompt_not_placed",
            f"{len(p.prompt_misses)} later request(s) no longer reach the boundary (the agent rewrote its "
            "history, a compaction?): the boundary user prompt was not placed in them",
        )
    if opts.boundary_prompt is None and boundary is None and ended is ContinuationEnd.AGENT:
        what = f"is the agent's {p.finish}" if p.finish is not None else "made no tool call"
        result.warn(
            "no_live_request",
            f"A_{opts.after_step} {what} and the agent ended after it: nothing went to the live model",
        )


def _live_failure(live: dict[str, Any], opts: ReplayOptions) -> ReplayFailed | None:
    """The error of a continuation that went live but did not end well, or None."""
    ended = live["ended_by"]
    if ended == ContinuationEnd.REASONING_REJECTED.value:
        rej = live["reasoning_rejected"] or live["upstream_error"]
        return ReplayFailed(
            "reasoning_rejected",
            f"the live upstream {live['upstream']} refused the served reasoning at request {rej['request']}: "
            f"{rej['message']}"
            + (
                " (--reasoning strip rewrites it so that the live API accepts it)"
                if opts.reasoning == "keep"
                else " (even with --reasoning strip: the upstream also refuses what strip leaves)"
            ),
        )
    if ended == ContinuationEnd.UPSTREAM_ERROR.value:
        err = live["upstream_error"]
        unreachable = err["status"] is None or err["outcome"] in ("upstream_unreachable", "upstream_reset")
        what = "could not be reached" if unreachable else f"answered {err['status']}"
        return ReplayFailed(
            "upstream_unreachable" if unreachable else "upstream_error",
            f"the live upstream {live['upstream']} {what} at request {err['request']}: {err['message']}",
            exit_code=69 if unreachable else 1,
        )
    if ended == ContinuationEnd.TIMEOUT.value:
        return ReplayFailed(
            "agent_timeout",
            f"the continuation was still running after --timeout {opts.timeout:g} s (the agent was stopped; "
            f"{live['live_steps']} live step(s) are in the derived run)",
            exit_code=124,
        )
    return None


#: outcomes of an exchange pvisor itself cut short (the gateway stopped, the agent went away)
_CUT_OUTCOMES = frozenset({"incomplete", "aborted_by_client", "in_flight"})


def _no_request_after(p: Any) -> bool:
    return p.latest is not None and p.latest[0] == p.n
