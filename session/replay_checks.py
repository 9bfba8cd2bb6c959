"""The options of a replay with the agent (replay-only and continuation) checked before anything
runs: every problem added to the caller's list (usage errors, exit 2; a missing agent, exit 69),
so that one invocation says them all at once (docs/replay.md). Also the checks made once the
source is read: a boundary prompt that no request N+1 could carry, a workspace that is the
recorded run's own, and before the agent acts (:func:`check_before_acting`) the calls without
a recorded result and the plan of what the served calls name outside the workspace."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from pvisor.adapters.agents import get_profile
from pvisor.adapters.native import check_source_file
from pvisor.adapters.protocols import UPSTREAMS
from pvisor.core.errors import PvisorError, UsageError
from pvisor.gateway.routing import USERINFO_REFUSED, check_upstream_url, has_userinfo
from pvisor.journal.reader import JournalReader
from pvisor.replay.errors import ReplayUsageError, show_path
from pvisor.replay.plan import plan_for
from pvisor.replay.prepare import check_utf8_option
from pvisor.replay.source import descriptor, finish_at
from pvisor.replay.spec import REASONING, collect, raise_problems
from pvisor.session.launch import find_executable
from pvisor.session.limits import ResourceLimits, parse_cpus, parse_size
from pvisor.session.replay_options import ReplayOptions
from pvisor.session.run import without_userinfo
from pvisor.session.start_state import env_from


def resolved(path: Path) -> Path:
    """``path`` with its symbolic links followed (it need not exist)."""
    return Path(os.path.realpath(path))


def related(a: Path, b: Path) -> bool:
    """Whether ``a`` is ``b``, lies inside it or holds it."""
    return a == b or a in b.parents or b in a.parents


def check_options(opts: ReplayOptions, problems: list[PvisorError]) -> tuple[Any, bool]:
    """Every problem of the options, each added to ``problems`` (usage errors, exit 2, in the
    order they were always checked). Returns the agent's descriptor (None for an unknown agent)
    and whether the source can be read (its options passed)."""
    d = None
    try:
        d = descriptor(opts.agent)
    except PvisorError as exc:
        problems.append(exc)
    source_ok = _check_texts(opts, problems) and d is not None
    if d is not None and not d.launchable:
        source_ok = False  # the source read for this agent would only say again that it is the wrong one
        problems.append(
            ReplayUsageError(
                "no_launch_profile",
                f"--replay-only runs the agent, and pvisor cannot start {opts.agent} (no launch profile); "
                "--prepare-only works from its trajectory",
            )
        )
    source_ok = _check_source(opts, problems) and source_ok
    workspace_ok = _check_workspace(opts, problems)
    source_ok = _check_files(opts, problems, workspace_ok) and source_ok
    if opts.timeout <= 0:
        problems.append(UsageError(f"--timeout must be more than 0 seconds, not {opts.timeout:g}"))
    if opts.model is not None and not opts.model.strip():
        problems.append(UsageError("--model is empty: give a model name, or leave the option out"))
    collect(problems, limits_of, opts)
    collect(problems, env_from, opts)
    if opts.no_restore and opts.workspace_from is not None:
        problems.append(
            UsageError(
                "--no-restore starts in --workspace as it is, --workspace-from restores a run into it: "
                "give one"
            )
        )
    if (
        workspace_ok
        and opts.workspace is not None
        and resolved(opts.workspace) in resolved(opts.journal).parents
    ):
        source_ok = False  # reading it would write its -wal/-shm files into the workspace
        problems.append(
            ReplayUsageError(
                "workspace_refused",
                f"--journal {show_path(opts.journal)} lies inside --workspace "
                f"{show_path(opts.workspace)}: the agent could read or change it",
            )
        )
    return d, source_ok


def limits_of(opts: ReplayOptions) -> ResourceLimits | None:
    """The limits of the run's cgroup (``sandbox_memory``: a size text or bytes;
    ``sandbox_cpus``: a number or its text), None when neither is given. UsageError (exit 2)
    naming ``--sandbox-memory`` or ``--sandbox-cpus`` for a bad value."""
    memory, cpus = opts.sandbox_memory, opts.sandbox_cpus
    if memory is None and cpus is None:
        return None
    return ResourceLimits(
        memory=None if memory is None else parse_size(str(memory)),
        cpus=None if cpus is None else parse_cpus(str(cpus)),
    )


def _check_texts(opts: ReplayOptions, problems: list[PvisorError]) -> bool:
    """Each text option valid UTF-8; False when one naming the source is not."""
    ok = True
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
            ok = False
    return ok


def _check_source(opts: ReplayOptions, problems: list[PvisorError]) -> bool:
    """Exactly one source, a run id that is not blank, a task that is not blank, a step N >= 0;
    False when the source cannot be read."""
    ok = True
    if (opts.trajectory is None) == (opts.run is None):
        ok = False
        problems.append(
            UsageError(
                "give exactly one source: --trajectory PATH (a native file) or --run ID (a journal run)"
            )
        )
    if opts.run is not None and not opts.run.strip():
        ok = False
        problems.append(
            UsageError(
                "--run is empty: give a run id or a unique prefix of one (pvisor journal ls lists them)"
            )
        )
    if opts.task is not None and not opts.task.strip():
        problems.append(UsageError("--task is blank: give the task the agent is to be given"))
    if opts.after_step < 0:
        ok = False
        problems.append(
            ReplayUsageError(
                "usage", f"--after-step {opts.after_step}: N counts steps from 0 (the task alone)"
            )
        )
    return ok


def _check_workspace(opts: ReplayOptions, problems: list[PvisorError]) -> bool:
    """``--workspace`` given and a directory."""
    if opts.workspace is None:
        problems.append(
            ReplayUsageError(
                "workspace_refused",
                "replaying with the agent (--replay-only, continuation) needs --workspace DIR: "
                "a new directory where it re-runs its tools "
                "(never the recorded run's own: recorded commands can delete or push)",
            )
        )
        return False
    if not opts.workspace.is_dir():
        # a file (or a link to one) is there: "no such directory" would send the user looking
        what = "not a directory" if os.path.lexists(opts.workspace) else "no such directory"
        problems.append(
            ReplayUsageError("workspace_refused", f"--workspace {show_path(opts.workspace)}: {what}")
        )
        return False
    return True


def _check_files(opts: ReplayOptions, problems: list[PvisorError], workspace_ok: bool) -> bool:
    """The journal a run or ``--workspace-from`` is read from, ``--workspace-from``'s run and
    the native file; False when the source cannot be read."""
    ok = True
    journal_ok = opts.journal.exists()
    if (opts.run is not None or opts.workspace_from is not None) and not journal_ok:
        ok = opts.run is None
        problems.append(UsageError(f"--journal {show_path(opts.journal)}: no such journal file"))
    if opts.workspace_from is not None and journal_ok:
        collect(problems, check_workspace_from, opts, workspace_ok)
    if opts.trajectory is not None:
        if not collect(
            problems, check_source_file, opts.trajectory, f"--trajectory {show_path(opts.trajectory)}"
        ):
            ok = False
    return ok


def check_workspace_from(opts: ReplayOptions, workspace_ok: bool) -> None:
    """``--workspace-from RUN``: a run of the journal, restored into an empty ``--workspace``."""
    assert opts.workspace_from is not None
    if not opts.workspace_from.strip():
        raise UsageError(
            "--workspace-from is empty: give the run whose start state to restore (pvisor snapshot ls RUN)"
        )
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
            f"--workspace {show_path(opts.workspace)} is not empty: --workspace-from restores the "
            "recorded start state into an empty directory",
        )


def agent_missing(opts: ReplayOptions, d: Any) -> PvisorError | None:
    """The agent's executable looked up as the run will (exit 69 ``agent_unavailable`` when it is
    missing), or None: for the problems reported together before anything runs."""
    if d is None or not d.launchable:
        return None
    try:
        find_executable(get_profile(opts.agent), opts.entrypoint)
    except PvisorError as exc:
        exc.code = "agent_unavailable"  # type: ignore[attr-defined]
        return exc
    return None


def check_live(opts: ReplayOptions, d: Any, problems: list[PvisorError]) -> str | None:
    """The continuation's options checked, each problem added to ``problems``; returns the live
    upstream's base URL (``--upstream``, else the agent's public API, whose key must be in the
    environment), None when it is refused."""
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
        if has_userinfo(opts.upstream):
            problems.append(
                ReplayUsageError("usage", f"--upstream {without_userinfo(opts.upstream)}: {USERINFO_REFUSED}")
            )
            return None
        return opts.upstream
    if d is None:
        return None
    url = UPSTREAMS[d.upstream][0]
    key = d.key_env
    if key and not has_key(opts, key):
        problems.append(
            ReplayUsageError(
                "missing_api_key",
                f"a continuation forwards request N+1 to {url}, which needs {key} in the environment: "
                "set it, or give --upstream URL (a local model server)",
            )
        )
        return None
    return url


def has_key(opts: ReplayOptions, key: str) -> bool:
    """Whether the agent will find its API key ``key`` (a config's environment, or pvisor's)."""
    return bool(opts.agent_env.get(key) or os.environ.get(key))


def check_boundary_prompt(opts: ReplayOptions, rec: Any, d: Any) -> None:
    """A boundary prompt needs a request N+1: refused when N is the last step and A_N made no
    tool call or is the agent's finish action (the agent ends after A_N; only its native resume
    could send more)."""
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


def check_own_workspace(rec: Any, ws: Path) -> None:
    """ReplayUsageError ``workspace_refused`` when ``ws`` is, holds or lies in the recorded
    run's own workspace (``rec.workspace``)."""
    if rec.workspace and related(resolved(Path(rec.workspace)), ws):
        raise ReplayUsageError(
            "workspace_refused",
            f"--workspace {show_path(ws)} is, holds or lies in the recorded run's own workspace "
            f"{rec.workspace}: recorded commands can delete or push; give a new directory",
        )


def check_before_acting(
    opts: ReplayOptions, rec: Any, d: Any, ws: Path, result: Any, warn: Callable[[str], None]
) -> None:
    """What the replay would do that the user must hear of before the agent starts, filled into
    ``result`` (:class:`~pvisor.replay.result.ResultDocument`): ``unrecorded``, the calls of
    steps 1..N without a recorded result, refused as prepare-only refuses them
    (``observation_not_recorded``, exit 65) unless ``--allow-unrecorded``; and ``plan``, what the
    served calls name outside the new workspace ``ws`` (:func:`~pvisor.replay.plan.plan_for`),
    its lines given to ``warn`` (a heading, one line per item; none for an empty plan), refused
    (exit 2 ``outside_workspace``, one line naming the first item and how many there are) with
    ``--refuse-outside``. Raises the problems found (both at once when both are)."""
    problems: list[PvisorError] = []
    result.unrecorded = [
        {"step": step.n, "call_id": c.id, "tool": c.name} for step, calls in rec.unrecorded for c in calls
    ]
    unrecorded = rec.unrecorded_error(opts.after_step)
    if unrecorded is not None and not opts.allow_unrecorded:
        problems.append(unrecorded)
    plan = plan_for(rec, opts.after_step, d, str(ws))
    result.plan = plan.to_json()
    for line in plan.lines():
        warn(line)
    if plan.items and opts.refuse_outside:
        problems.append(
            ReplayUsageError(
                "outside_workspace",
                f"--refuse-outside: the plan lists {len(plan.items)} place(s) the recorded calls name "
                f"outside the new workspace, the first: {plan.items[0].line()}",
            )
        )
    raise_problems(problems)
