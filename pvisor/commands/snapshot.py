"""``pvisor snapshot ...``: list a run's workspace snapshots and restore one into a directory."""

from __future__ import annotations

import os
from pathlib import Path

import click

from pvisor.commands.base import Group, PathParam, one_line
from pvisor.commands.cells import counted, print_table
from pvisor.commands.params import RUN_ID, pause_options
from pvisor.commands.reading import emit_json, open_reader, utc_time
from pvisor.core.errors import UsageError
from pvisor.replay.numbering import resolve_step, transitions, where
from pvisor.replay.snapshots import restore_snapshot, run_snapshots


@click.group("snapshot", cls=Group)
def snapshot() -> None:
    """List and restore the workspace snapshots of a run (the journal is only read)."""


@snapshot.command("ls")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@click.pass_context
def ls(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """List RUN's snapshots (id or unique prefix): when each was taken, the journal step whose
    tools it has seen (AFTER: after step N, which is before transition N; '-' for an auxiliary
    request), the request it was taken for, its size, what its walk read and how long the answer
    waited for it."""
    with open_reader(ctx) as r:
        rs = run_snapshots(r, run_id)
    if as_json:
        emit_json(
            {
                "run": rs.run,
                "steps_total": rs.steps_total,
                "bound": rs.bound,
                "snapshots": [_record_json(s) for s in rs.snapshots],
            }
        )
        return
    if not rs.snapshots:
        click.echo(f"run {rs.run}: no workspace snapshot ({transitions(rs.steps_total)})")
        return
    click.echo(f"run {rs.run}: {counted(len(rs.snapshots), 'snapshot')}, {transitions(rs.steps_total)}")
    rows = []
    for s in rs.snapshots:
        rows.append(
            [
                s.id,
                utc_time(s.taken_ms),
                s.kind.value,
                "-" if s.after_step is None else str(s.after_step),
                s.exchange or "-",
                str(s.files),
                str(s.bytes),
                str(s.read_bytes),
                f"{s.walk_us / 1000:.1f}",
                "-" if s.hold_us is None else f"{s.hold_us / 1000:.1f}",
                (s.digest or "-")[:12],
                f"error: {s.error}"
                if s.error
                else "; ".join(s.warnings[:2]) + (" ..." if len(s.warnings) > 2 else ""),
            ]
        )
    print_table(
        rows,
        [
            "SNAPSHOT",
            "TAKEN",
            "KIND",
            "AFTER",
            "EXCHANGE",
            "FILES",
            "BYTES",
            "READ",
            "WALK_MS",
            "HOLD_MS",
            "MANIFEST",
            "NOTES",
        ],
    )


@snapshot.command("restore")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@pause_options(
    step_help="Restore the workspace after transition K, zero-based (after journal step K+1); with "
    "--before, before it ran (after step K). --step K is --after-step K+1.",
    after_step_help="Restore the workspace after N journal steps (0: the start state). What --step K meant "
    "before pvisor numbered transitions (CHANGELOG.md).",
)
@click.option(
    "--before",
    is_flag=True,
    help="With --step K: the workspace before transition K ran (A(K+1)); --step 0 --before is the start "
    "state.",
)
@click.option(
    "--into",
    "into",
    type=PathParam(file_okay=False),
    required=True,
    help="Directory to restore into (created when missing; must be empty unless --force).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Restore into a directory that is not empty (files of the snapshot replace theirs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was restored as JSON.")
@click.pass_context
def restore(
    ctx: click.Context,
    run_id: str,
    step: int | None,
    after_step: int | None,
    before: bool,
    into: str,
    force: bool,
    as_json: bool,
) -> None:
    """Restore RUN's workspace at a pause into --into: --step K (transition K, zero-based: journal
    step K+1) or --after-step N (N journal steps kept). Nothing is written outside it, whatever
    names or symlinks the snapshot holds.

    \b
    Examples:
      pvisor snapshot restore r-3f2a9c0d1e2b --step 0 --into ws-after-0
      pvisor snapshot restore r-3f2a9c0d1e2b --step 2 --before --into ws-before-2
      pvisor snapshot restore r-3f2a9c0d1e2b --after-step 0 --into ws-start
    """
    if not into:
        # Path("") is the working directory: an empty value must not restore into it
        raise UsageError("--into is empty: give the directory to restore into")
    if step is None and after_step is None:
        raise UsageError(
            "give the pause: --step K (transition K, zero-based: after journal step K+1) or --after-step N "
            "(N journal steps kept; 0: the start state)"
        )
    with open_reader(ctx) as r:
        rs = run_snapshots(r, run_id)
        pos = resolve_step(
            rs.steps_total, step=step, before=before, after_step=after_step, run=f"run {rs.run}"
        )
        snap = rs.pick(pos.kept)
        try:
            done = restore_snapshot(r, snap, Path(into), force=force)
        except KeyboardInterrupt:
            # the usual 'pvisor: aborted' would leave the user to find out that what is there
            # is not the snapshot
            if not os.path.lexists(into):
                raise
            click.echo(
                f"pvisor: aborted: --into {one_line(into)} is partial: the restore was interrupted "
                "(restore again with --force, or remove it)",
                err=True,
            )
            ctx.exit(130)
    if as_json:
        emit_json({**done.to_json(), "transition": pos.transition, "before": pos.before})
        return
    click.echo(
        f"restored run {rs.run} {where(pos)} (snapshot {snap.id}, {snap.kind.value}) "
        f"into {one_line(str(done.into))}: "
        f"{counted(done.files, 'file')}, {done.bytes} bytes, manifest {done.digest[:12]}"
    )
    if done.withheld:
        names = ", ".join(one_line(w["path"]) for w in done.withheld)
        click.echo(
            f"withheld as secret, not restored: {names} "
            "(the snapshot never stored them: supply them yourself)",
            err=True,
        )


def _record_json(s) -> dict:
    return {
        "id": s.id,
        "kind": s.kind.value,
        "attempt": s.attempt,
        "after_step": s.after_step,
        "exchange": s.exchange,
        "driver": s.driver,
        "manifest": s.digest,
        "taken_ms": s.taken_ms,
        "walk_us": s.walk_us,
        "hold_us": s.hold_us,
        "entries": s.entries,
        "files": s.files,
        "bytes": s.bytes,
        "read_bytes": s.read_bytes,
        "warnings": s.warnings,
        "error": s.error,
    }
