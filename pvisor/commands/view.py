"""``pvisor view``: what the agent saw at a step of a journal run or a native trajectory file,
as an observer view (JSON, schema ``pvisor.view/v2``, docs/snapshots.md "Pause views")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import orjson

from pvisor.adapters.native import check_source_file
from pvisor.commands.base import Command, PathParam, one_line
from pvisor.commands.outputs import check_output_path, make_output_parent
from pvisor.commands.params import pause_options, refuse_key_shaped
from pvisor.commands.progress import progress_option
from pvisor.core.errors import OutputError, UsageError, shown
from pvisor.core.outfile import open_private
from pvisor.journal.exported import is_export
from pvisor.journal.paths import require_utf8
from pvisor.replay.numbering import Wording, where
from pvisor.replay.source import check_damage
from pvisor.replay.views import PauseKind, PauseSpec, TrajectoryReplay


@click.command("view", cls=Command)
@click.argument("source", metavar="RUN|FILE")
@pause_options(
    step_help="Pause at transition K, zero-based: after it (transitions 0..K, journal steps 1..K+1); "
    "with --before, before it (0..K-1). --step K is --after-step K+1. Default: the last transition.",
    after_step_help="Pause after N journal steps (0: the task alone): --after-step N is --step N-1, and "
    "--step K --before is --after-step K.",
)
@click.option(
    "--progress",
    "fraction",
    type=float,
    default=None,
    metavar="F",
    help="Pause at transition round(F x (T-1)) of T transitions (halves up), F from 0 to 1: 0 the first, "
    "1 the last; a point in the run, not a measure of the task done.",
)
@click.option(
    "--before-commitment",
    "before_commitment",
    is_flag=True,
    help="Pause before the first commit or finish action (git commit, a submit or finish tool).",
)
@click.option(
    "--before",
    is_flag=True,
    help="Pause before transition K instead of after it (through journal step K), with the workspace "
    "taken before A(K+1) ran; --step 0 --before is the task alone.",
)
@click.option(
    "--agent", default=None, metavar="NAME", help="FILE's adapter (default: detected from the file)."
)
@click.option(
    "--allow-damaged",
    "allow_damaged",
    is_flag=True,
    help="Write the view of a native FILE the reader had to repair (a chain bridged past a lost line, a "
    "line lost); each repair is in the view's `repairs`. Refused by default (exit 65), as a prefix is.",
)
@click.option(
    "--episode",
    default=None,
    metavar="ID",
    help="View this episode: a subagent's id as `pvisor trajectory show` lists it (default: main); its "
    "steps are numbered from 1.",
)
@click.option(
    "--output",
    "output",
    type=PathParam(dir_okay=False, readable=False),
    default=None,
    help="Write the view here (default: stdout); missing directories are created (0700).",
)
@click.pass_context
@progress_option
def view(
    ctx: click.Context,
    source: str,
    step: int | None,
    after_step: int | None,
    fraction: float | None,
    before_commitment: bool,
    before: bool,
    agent: str | None,
    allow_damaged: bool,
    episode: str | None,
    output: str | None,
) -> None:
    """Write the observer view of a pause of RUN (a journal run id or unique prefix) or FILE
    (a native trajectory file, or a journal export of one run: an existing path is always read
    as one; a RUN|FILE with a slash that does not exist is a missing file): the task, system
    prompt, tool names and every step through the pause, actions and observations, without
    gateway internals, signatures, encrypted reasoning or credentials; for a journal run
    recorded with a workspace, the snapshot a handoff restores. A native FILE the reader had to
    repair (a chain bridged past a lost line, a line lost) is refused, exit 65, unless
    --allow-damaged: then the view lists each repair in its `repairs`.

    Pauses are numbered as transitions, from 0: transition K is journal step K+1 (A(K+1) with
    O(K+1)). Without --step, --after-step, --progress or --before-commitment: the last
    transition (a run without a step: the task alone).

    \b
    Examples:
      pvisor view r-3f2a9c0d1e2b --step 0 --output runs/local-pause.json
      pvisor view r-3f2a9c0d1e2b --step 2 --before
      pvisor view r-3f2a9c0d1e2b --after-step 0
      pvisor view r-3f2a9c0d1e2b --progress 0.5 --output half.json
      pvisor view ~/.codex/sessions/2026/12/01/rollout-....jsonl --before-commitment
    """
    # the view is JSON, which cannot carry a name that is not UTF-8
    for option, value in (("RUN|FILE", source), ("--journal", ctx.obj["journal"]), ("--output", output)):
        require_utf8(option, value)

    chosen = [
        name
        for name, given in (
            ("--step", step is not None),
            ("--after-step", after_step is not None),
            ("--progress", fraction is not None),
            ("--before-commitment", before_commitment),
        )
        if given
    ]
    if len(chosen) > 1:
        raise UsageError(f"give one pause at most: {' and '.join(chosen)} both choose the pause")
    if output is not None:
        check_output_path(output, "--output", create_parents=True)
    replay = _read_source(ctx, source, agent, episode)
    if replay.source.get("kind") == "native":
        # as a prefix is: a view across a repair may not be what the agent saw
        check_damage(replay.warnings, Path(replay.read_from or source), allow_damaged, for_view=True)
    replay.wording = Wording.CLI
    v = replay.view(_pause_spec(step, after_step, fraction, before_commitment, before))
    name = "run " + v.run if v.run else one_line(source)  # a file's name may hold control characters
    if replay.source.get("episode"):  # a subagent's own steps
        name += f" episode {replay.source['episode']['id']}"
    if v.transition is None:
        click.echo(
            f"pvisor: warning: {name} has no transition (0 journal steps): the view holds the task alone",
            err=True,
        )
    data = orjson.dumps(v.to_json(), option=orjson.OPT_INDENT_2) + b"\n"
    if output is None:
        sys.stdout.buffer.write(data)
        return
    make_output_parent(output, "--output")
    try:
        with open_private(output) as f:
            f.write(data)
    except OSError as exc:
        raise OutputError(f"cannot write --output {output}: {exc.strerror or exc}") from None
    click.echo(f"view of {name} {where(v.position)} written to {one_line(output)}", err=True)


def _read_source(ctx: click.Context, source: str, agent: str | None, episode: str | None = None):
    """The :class:`~pvisor.replay.views.TrajectoryReplay` of RUN|FILE: an existing path (or
    ``-``) is a native trajectory file or a journal export, anything else a run of the journal.
    UsageError (exit 2) for a missing file or run, naming both readings."""
    native = os.path.lexists(source) or source == "-"
    if native and source != "-":
        check_source_file(Path(source), source)  # a FIFO or a device could block or never end
    if native and source != "-" and _is_export(source):
        if episode is not None and episode != "main":  # the main loop is what an export is read as
            raise UsageError(
                f"--episode {shown(one_line(episode))}: {one_line(source)} is a journal export, whose "
                "subagents are not read (only its main loop, --episode main); view the run in its "
                "journal instead"
            )
        if episode is not None:
            click.echo(
                f"pvisor: note: {one_line(source)} is a journal export: its main loop is read, "
                "its subagents are not",
                err=True,
            )
        # a journal export of one run, as TrajectoryReplay.from_event_log reads it: no workspace
        replay = TrajectoryReplay.from_event_log(source)
    elif native:
        replay = TrajectoryReplay.from_trajectory(Path(source), agent, wording=Wording.CLI, episode=episode)
        for w in replay.warnings:  # a subagent's own warnings name its file
            named = source if getattr(w, "code", None) == "subagent_skipped" else replay.read_from or source
            click.echo(f"pvisor: warning: {one_line(named)}: {one_line(w)}", err=True)
    else:
        # neither a file nor (it may be) a run: a key pasted here is never echoed back
        refuse_key_shaped("RUN|FILE", source, "a run id or a file")
        if "/" in source or source.startswith("~"):
            # a run id never holds a slash: this was meant as a file
            raise UsageError(f"RUN|FILE {source}: no such file")
        if agent is not None:
            raise UsageError(
                f"--agent is for a native FILE; {source} is no file, so it is read as a journal run"
            )
        try:
            replay = TrajectoryReplay.from_journal(Path(ctx.obj["journal"]), source, episode)
        except UsageError as exc:
            # say both readings: the user may have meant a file with a typo in its name
            raise UsageError(f"{exc.message}; and no file {source} here") from None
    return replay


def _pause_spec(
    step: int | None, after_step: int | None, fraction: float | None, before_commitment: bool, before: bool
):
    """The :class:`~pvisor.replay.views.PauseSpec` the pause options choose (one at most, checked
    before): before the first commitment, at a progress fraction, or at a step (None: the last)."""
    if before_commitment:
        return PauseSpec(None, PauseKind.BEFORE_COMMITMENT, before=before)
    if fraction is not None:
        return PauseSpec(None, PauseKind.PROGRESS, progress=fraction, before=before)
    return PauseSpec(None, PauseKind.STEP, step=step, before=before, after_step=after_step)


def _is_export(path: str) -> bool:
    """Whether ``path`` is a journal export (``pvisor journal export RUN --format jsonl``)."""
    return os.path.isfile(path) and is_export(path)
