"""``pvisor handoff``: the next agent takes over a run at a pause, its history re-enacted as its
own actions (docs/handoff.md). Output as ``pvisor replay``'s: one summary line on stdout (with
``--result -`` the result document on stdout and the summary on stderr)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pvisor.commands.base import Command
from pvisor.commands.params import pause_options, refuse_key_shaped
from pvisor.commands.progress import progress_option
from pvisor.commands.replay import declared_options, report_outcome
from pvisor.core.errors import UsageError
from pvisor.replay.spec import BY_NAME

#: the options of ``pvisor replay`` a handoff takes, in ``pvisor replay --help``'s order
SHARED = (
    "agent",
    "trajectory",
    "run",
    "replay_only",
    "output",
    "workspace",
    "entrypoint",
    "task",
    "timeout",
    "allow_unsupported",
    "upstream",
    "max_steps",
    "boundary_prompt",
    "live_model",
    "model",
    "session",
    "force",
    "allow_damaged",
    "refuse_outside",
    "allow_unrecorded",
    "result",
    "sandbox",
    "sandbox_network",
    "sandbox_allow",
    "sandbox_memory",
    "sandbox_cpus",
)


#: the help of the shared options that ``pvisor replay`` words for its own modes
HELPS = {
    "workspace": "(required) The new directory the next agent re-runs the history in; the source run's "
    "start snapshot is restored into it when it is empty.",
    "output": "(required) The directory of result.json, prefix.json and prefix.request.json.",
    "replay_only": "End the next agent at its request after the pause (recorded as the prefix) instead of "
    "sending it to the live model.",
    "agent": "The source's agent (default: the journal run's, or the agent an ATIF --trajectory names; else "
    "required with --trajectory).",
}


@click.command("handoff", cls=Command)
@click.option(
    "--to-agent",
    "to_agent",
    required=True,
    metavar="NAME",
    help="The next agent, which takes over at the pause (the source's own: a continuation from it).",
)
@pause_options(
    step_help="Pause at transition K, zero-based: after it (journal steps 1..K+1 kept); with --before, "
    "before it. --step K is --after-step K+1.",
    after_step_help="Pause after N journal steps (0: the task alone).",
)
@click.option("--before", is_flag=True, help="Pause before transition K instead of after it.")
@click.option(
    "--progress",
    "fraction",
    type=float,
    default=None,
    metavar="F",
    help="Pause at a fraction 0..1 of the run: transition round(F x (T-1)) of T, halves up.",
)
@click.option(
    "--before-commitment", "before_commitment", is_flag=True, help="Pause before the first commit or finish."
)
@click.option(
    "--strict-workspace",
    "strict_workspace",
    is_flag=True,
    help="A workspace that differs from the pause's snapshot after re-enactment makes the handoff diverged.",
)
@click.option(
    "--reset-to-pause",
    "reset_to_pause",
    is_flag=True,
    help="Make the workspace the pause's snapshot before request N+1 is answered or forwarded (the entries "
    "it does not hold removed); the report lists what it removed.",
)
@click.option(
    "--no-restore",
    "no_restore",
    is_flag=True,
    help="Start the next agent in --workspace as it is (no start snapshot restored, no warning).",
)
@click.option(
    "--source-reasoning",
    "source_reasoning",
    type=click.Choice(["drop", "text", "keep"]),
    default="drop",
    show_default=True,
    help="What becomes of the source's reasoning in the history served to the next agent: drop it "
    "(counted), text (its visible text as a labelled note in the next agent's message; never a signature "
    "or encrypted content), keep (served unchanged: only to the same protocol and model family, else the "
    "handoff is refused, exit 65).",
)
@declared_options([BY_NAME[name] for name in SHARED], HELPS)
@click.pass_context
@progress_option
def handoff(ctx: click.Context, **flags: Any) -> None:
    """Hand a run (--run ID, or --trajectory FILE with --agent) over to --to-agent at a pause:
    the next agent starts on the recorded task at the source's start state, re-runs the
    history translated into its own tools (a shell call stays a shell call; a write, an edit, a
    read or a plan goes to its own tool of that kind where it declares one, else a shell call
    makes it; what cannot be re-run is written as its own earlier note), and its request N+1
    goes to the live model (--replay-only: recorded, then ended). The result (DIR/result.json,
    mode handoff) accounts for every call; the derived run is filed in the journal under its
    parent.

    \b
    Example (Claude Code's run handed to Codex after step 3, offline against a local model):
      pvisor handoff --run RUN --after-step 3 --to-agent codex --workspace ws2 \\
        --output out --upstream http://127.0.0.1:8000 --max-steps 5
    """
    from pvisor.session.handover import (
        agent_the_file_says,
        handoff_options,
        pause_or_source_error,
        run_handoff,
    )
    from pvisor.journal.paths import default_journal_path
    from pvisor.replay.numbering import Wording

    if flags["result"] is not None and flags["result"] != "-":
        raise UsageError(f"--result {flags['result']}: only '-' (stdout) is supported")
    _check_flags(flags)
    _check_mode(flags)
    if (flags["run"] is None) == (flags["trajectory"] is None):
        raise UsageError("give the source: --run ID (a journal run) or --trajectory FILE --agent NAME")
    for name in ("output", "workspace"):
        if not flags[name]:
            raise UsageError(f"--{name} is required: give a directory")
    journal = Path(ctx.obj.get("journal") if ctx.obj and ctx.obj.get("journal") else default_journal_path())
    trajectory = Path(flags["trajectory"]) if flags["trajectory"] else None
    agent = flags["agent"]
    if agent is None and trajectory is not None:
        agent = agent_the_file_says(trajectory)
    if agent is None and trajectory is not None:
        raise UsageError("--trajectory needs --agent NAME (which agent wrote it?)")
    spec = _pause_spec(flags)
    # a source that cannot be read at all: the replay's read refuses it (a failed result.json)
    after_step = pause_or_source_error(
        journal,
        flags["run"],
        trajectory,
        agent,
        spec,
        Wording.CLI,
        task=flags["task"],
        session=flags["session"],
        allow_damaged=bool(flags["allow_damaged"]),
    )
    if agent is None:
        from pvisor.session.api import agent_of

        agent = agent_of(journal, flags["run"], "--agent NAME")
    opts = handoff_options(
        to_agent=flags["to_agent"],
        journal=journal,
        run=flags["run"],
        trajectory=trajectory,
        agent=agent,
        after_step=after_step,
        workspace=Path(flags["workspace"]),
        output=Path(flags["output"]),
        replay_only=bool(flags["replay_only"]),
        strict_workspace=flags["strict_workspace"],
        restore_start=not flags["no_restore"],
        reset_to_pause=flags["reset_to_pause"],
        source_reasoning=flags["source_reasoning"],
        entrypoint=flags["entrypoint"],
        task=flags["task"],
        timeout=flags["timeout"] if flags["timeout"] is not None else 900.0,
        allow_unsupported=bool(flags["allow_unsupported"]),
        upstream=flags["upstream"],
        max_steps=flags["max_steps"],
        boundary_prompt=flags["boundary_prompt"],
        live_model=flags["live_model"],
        model=flags["model"],
        session=flags["session"],
        force=bool(flags["force"]),
        allow_damaged=bool(flags["allow_damaged"]),
        refuse_outside=bool(flags["refuse_outside"]),
        allow_unrecorded=bool(flags["allow_unrecorded"]),
        sandbox=flags["sandbox"],
        sandbox_network=flags["sandbox_network"] or "gateway",
        sandbox_allow=[Path(p) for p in flags["sandbox_allow"] or ()] or None,
        sandbox_memory=flags["sandbox_memory"],
        sandbox_cpus=flags["sandbox_cpus"],
    )
    report_outcome(lambda: run_handoff(opts, _warn), flags["result"])


def _check_flags(flags: dict[str, Any]) -> None:
    """UsageError (exit 2) for a key-shaped value (never shown) and for no pause or two."""
    # every value a message may name, before one does: a key pasted there is never shown
    for name, flag, what in (
        ("to_agent", "--to-agent", "an agent name"),
        ("agent", "--agent", "an agent name"),
        ("trajectory", "--trajectory", "a file"),
        ("workspace", "--workspace", "a directory"),
        ("output", "--output", "a directory"),
        ("entrypoint", "--agent-entrypoint", "an executable"),
    ):
        if flags[name] is not None:
            refuse_key_shaped(flag, flags[name], what)
    chosen = [
        name
        for name, given in (
            ("--step", flags["step"] is not None),
            ("--after-step", flags["after_step"] is not None),
            ("--progress", flags["fraction"] is not None),
            ("--before-commitment", flags["before_commitment"]),
        )
        if given
    ]
    if len(chosen) != 1:
        raise UsageError(
            "give the pause: one of --step K [--before], --after-step N, --progress F, --before-commitment"
            if not chosen
            else f"give one pause: {' and '.join(chosen)} both choose it"
        )


def _check_mode(flags: dict[str, Any]) -> None:
    """UsageError (exit 2; one line each) for a continuation's option with ``--replay-only``
    (``--upstream``, ``--max-steps``, ``--boundary-user-prompt``, ``--live-model``): refused as
    ``pvisor replay`` refuses them (:meth:`~pvisor.replay.spec.ReplaySpec.refused_in_mode`)."""
    from pvisor.replay.spec import ReplayMode, ReplaySpec, raise_problems

    values = {name: flags[name] for name in SHARED}
    given = [name for name, v in values.items() if v is not None and v is not False]
    mode = ReplayMode.REPLAY_ONLY if flags["replay_only"] else ReplayMode.CONTINUE
    raise_problems(list(ReplaySpec(values, given, mode).refused_in_mode()))


def _pause_spec(flags: dict[str, Any]) -> Any:
    """The :class:`~pvisor.replay.views.PauseSpec` the pause options name."""
    from pvisor.replay.views import PauseKind, PauseSpec

    if flags["before_commitment"]:
        return PauseSpec(None, PauseKind.BEFORE_COMMITMENT, before=flags["before"])
    elif flags["fraction"] is not None:
        return PauseSpec(None, PauseKind.PROGRESS, progress=flags["fraction"], before=flags["before"])
    else:
        return PauseSpec(
            None, PauseKind.STEP, step=flags["step"], after_step=flags["after_step"], before=flags["before"]
        )


def _warn(message: str) -> None:
    try:
        click.echo(f"pvisor: warning: {message}", err=True)
    except OSError:
        pass
