"""``pvisor journal ...``: list runs, show a run's exchanges and steps, print bodies, export, verify."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Callable

import click

from pvisor.commands.base import Command, Group, PathParam, one_line
import orjson

from pvisor.commands.exports import DerivedHelpOption, derived_help, format_option, listed, offered, readers
from pvisor.commands.cells import action_cell, clip, counted, observation_cell, terminal_safe, print_table
from pvisor.commands.outputs import check_export_path, refuse_reading, write_export, written_summary
from pvisor.commands.params import EXCHANGE_ID, MERGED_RUN_ID, RUN_ID, RUN_ID_TO_REMOVE
from pvisor.commands.progress import is_terminal, progress_option
from pvisor.commands.reading import emit_json, open_reader, utc_time
from pvisor.core import progress
from pvisor.core.errors import EXIT_INTEGRITY, EXIT_UNAVAILABLE, UsageError
from pvisor.journal.model import (
    HANDOFF_FROM_LABEL,
    HANDOFF_TO_LABEL,
    TRUNCATED_FLAG,
    Run,
    RunMode,
    run_lineage,
    unpack_timings,
)
from pvisor.journal.paths import absolute
from pvisor.journal.reader import JournalReader, body_json_field

if TYPE_CHECKING:
    from pvisor.journal.scrub import Pattern, ScrubReport


@click.group("journal", cls=Group)
def journal() -> None:
    """Inspect, export and verify the Event Journal; remove a run (rm) and its space (vacuum);
    merge journals (merge).

    Only rm, scrub and vacuum write to the journal, and merge to the journal given as --into;
    every other command opens it read-only."""


@journal.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List runs: id, agent, mode, status (pending: a handoff's child run not started yet;
    restoring: one whose restore_handoff has not finished; open: an attempt not ended; ended),
    the run it derives from (PARENT@STEPS: its parent run and the journal steps kept), creation
    time (UTC), exchanges by outcome."""
    path = ctx.obj["journal"]
    absolute(path, f"--journal {path}")  # a relative path in a deleted directory is not "no journal yet"
    if not os.path.exists(path):
        if as_json:
            emit_json([])
        else:
            click.echo(f"no journal at {one_line(path)} yet: nothing captured", err=True)
        return
    with open_reader(ctx) as r:
        runs = r.run_summaries()
    if as_json:
        emit_json(runs)
        return
    if not runs:
        click.echo("no runs", err=True)
        return
    rows = [
        [
            s["id"],
            s["agent"] or "-",
            s["mode"],
            s["status"],
            # the lineage of a derived or child run: its parent and the steps kept
            f"{s['parent_run']}@{s['boundary_step']}" if s["parent_run"] else "-",
            utc_time(s["created_ms"]),
            str(s["exchanges"]),
            ",".join(f"{k}={v}" for k, v in sorted(s["outcomes"].items())) or "-",
        ]
        for s in runs
    ]
    print_table(rows, ["RUN", "AGENT", "MODE", "STATUS", "FROM", "CREATED (UTC)", "EXCHANGES", "OUTCOMES"])


def _exchange_dict(ex) -> dict:
    d = {name: getattr(ex, name) for name in ex.__slots__}
    d["chunk_timings"] = [list(t) for t in unpack_timings(ex.chunk_timings)]
    return d


#: the columns of show's exchanges, and of each line of show --follow
_EXCHANGE_COLUMNS = ("SEQ", "EXCHANGE", "REQUEST", "PROTOCOL", "STATUS", "OUTCOME", "STREAM", "REQ_BYTES",
                     "RESP_BYTES_TO_AGENT", "MS", "CHAIN", "ROLE")  # fmt: skip


def _exchange_cells(e) -> list[str]:
    """One exchange as the cells of :data:`_EXCHANGE_COLUMNS` (``-`` for what is not known yet)."""
    target = e.path + ("?" + e.query if e.query else "")
    return [
        str(e.seq),
        e.id,
        f"{e.method} {target}",
        e.protocol or "-",
        str(e.status) if e.status is not None else "-",
        # a response journaled only in part shows so beside how it ended (docs/cli.md)
        (e.outcome or "-") + (" (truncated)" if TRUNCATED_FLAG in e.flags else ""),
        "stream" if e.streamed else "-",
        str(e.request_bytes),
        str(e.bytes_delivered),
        f"{e.ended_us / 1000:.1f}" if e.ended_us is not None else "-",
        str(e.chain) if e.chain is not None else "-",
        e.role or "-",
    ]


@journal.command("show")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for machines (with --follow: one line each)."
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Print each exchange as it is written, until the run's attempts have ended (or Ctrl-C).",
)
@click.pass_context
def show(ctx: click.Context, run_id: str, as_json: bool, follow: bool) -> None:
    """Show one run (id or unique prefix) and its exchanges in arrival order. With --follow, the
    exchanges recorded so far and then each one as it finishes, one line each (JSON Lines with
    --json), until the run is over: all its attempts ended and nothing in flight. A run the
    gateway captures on its own has no attempts: Ctrl-C ends that (exit 0)."""
    if follow:
        _follow(ctx, run_id, as_json)
        return
    with open_reader(ctx) as r:
        run = r.run(run_id)
        attempts = r.attempts(run.id)
        exchanges = r.exchanges(run.id)
        r_status = r.run_status(run)
        children = [c for c in r.runs() if c.parent_run == run.id] if not as_json else []
    if as_json:
        emit_json(
            {
                "run": {**{name: getattr(run, name) for name in run.__slots__}, "status": r_status},
                "attempts": [{name: getattr(a, name) for name in a.__slots__} for a in attempts],
                "exchanges": [_exchange_dict(e) for e in exchanges],
            }
        )
        return
    click.echo(
        terminal_safe(
            f"run {run.id}  agent={run.agent or '-'} version={run.agent_version or '-'} mode={run.mode} "
            f"created={utc_time(run.created_ms)}"
        )
    )
    _lineage(run, r_status)
    if run.argv:
        import shlex

        click.echo(
            terminal_safe("  argv: " + shlex.join(run.argv))
        )  # quoted: copy-pastable, a task with spaces stays one argument
    for k, v in sorted(run.labels.items()):
        click.echo(terminal_safe(f"  {k}: {v}"))
    for a in attempts:
        click.echo(
            f"  attempt {a.n}: started {utc_time(a.started_ms)} "
            f"exit={a.exit_code if a.exit_code is not None else '-'}"
        )
    for c in children:
        click.echo(terminal_safe(f"  child run {c.id}: {c.mode}, {c.agent or '-'}, {_pause(c)}"))
    if not exchanges:
        click.echo("  no exchanges")
        return
    print_table([_exchange_cells(e) for e in exchanges], list(_EXCHANGE_COLUMNS))
    if all(e.role is None for e in exchanges):
        click.echo(f"  (roles not stored yet; `pvisor journal steps {run.id}` derives them)")


def _pause(run: Run) -> str:
    """The pause a derived or child run continues from: ``after step 2 (transition 1)``."""
    from pvisor.replay.numbering import pause_of

    return pause_of(run.boundary_step, run.pause_transition)


def _lineage(run: Run, status: str) -> None:
    """``show``'s lines of where ``run`` comes from: the run (or the native file) it was handed off
    or replayed from, the pause, the pause's snapshot, and a handoff's agents."""
    lineage = run_lineage(run)
    if lineage is None:
        return
    kind = run.labels.get("source_kind")
    parent = run.parent_run or (
        f"the {kind} file {run.labels['source']}" if kind and run.labels.get("source") else "-"
    )
    if lineage["mode"] == RunMode.HANDOFF.value or run.pause_transition is not None:
        snap = f", workspace snapshot {run.workspace_snapshot[:12]}" if run.workspace_snapshot else ""
        click.echo(terminal_safe(f"  handed off from {parent} {_pause(run)}{snap}; {status}"))
        if lineage[HANDOFF_FROM_LABEL] or lineage[HANDOFF_TO_LABEL]:
            click.echo(
                terminal_safe(
                    f"  handed from agent {lineage[HANDOFF_FROM_LABEL] or '-'} "
                    f"to agent {lineage[HANDOFF_TO_LABEL] or '-'}"
                )
            )
    else:
        click.echo(terminal_safe(f"  derived from {parent} after step {run.boundary_step}"))


def _follow(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """``show --follow``: one line per finished exchange, flushed as it comes."""
    with open_reader(ctx) as r:
        run = r.run(run_id)
        if not as_json:
            click.echo(
                terminal_safe(
                    f"run {run.id}  agent={run.agent or '-'} mode={run.mode}  (following; Ctrl-C ends)"
                )
            )
            click.echo("  ".join(_EXCHANGE_COLUMNS))
        try:
            for e in r.follow(run.id):
                if as_json:
                    sys.stdout.buffer.write(orjson.dumps(_exchange_dict(e)) + b"\n")
                    sys.stdout.buffer.flush()
                    continue
                click.echo(terminal_safe("  ".join(_exchange_cells(e))))
                sys.stdout.flush()
        except KeyboardInterrupt:
            return  # the way a follow is ended
        removed = not r.run_exists(run.id)
    if removed:
        click.echo(f"pvisor: run {run.id} was removed from the journal while followed", err=True)
    elif not as_json:
        click.echo(f"run {run.id} is over")


@journal.command("body")
@click.argument("exchange_id", metavar="EXCHANGE", type=EXCHANGE_ID)
@click.option(
    "--request", "want_request", is_flag=True, help="The request body (decoded from its Content-Encoding)."
)
@click.option(
    "--response",
    "want_response",
    is_flag=True,
    help="The response: the reassembled final object for streams.",
)
@click.option(
    "--forwarded",
    "want_forwarded",
    is_flag=True,
    help="The bytes forwarded upstream when they differ from the request body (a continuation's boundary "
    "prompt or rewrites).",
)
@click.option(
    "--raw",
    is_flag=True,
    help="With --response: the bytes exactly as received (event-stream framing intact).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Wrap the body in JSON: {exchange, part, sha256, body | body_b64}.",
)
@click.pass_context
def body(
    ctx: click.Context,
    exchange_id: str,
    want_request: bool,
    want_response: bool,
    want_forwarded: bool,
    raw: bool,
    as_json: bool,
) -> None:
    """Print the restored bytes of a body of EXCHANGE (id or unique prefix) to stdout: give
    exactly one of --request, --response and --forwarded."""
    if want_request + want_response + want_forwarded > 1:
        raise UsageError("give one of --request, --response and --forwarded")
    if not (want_request or want_response or want_forwarded):
        raise UsageError("say which body: --request, --response or --forwarded")
    part = "request" if want_request else "forwarded" if want_forwarded else "response"
    kept = None  # of a response journaled only in part: the bytes the journal holds
    with open_reader(ctx) as r:
        ex = r.exchange(exchange_id)
        if part == "request":
            sha = ex.request_body
            data = r.request_body(ex)
        elif part == "forwarded":
            sha = ex.forwarded_body
            data = r.forwarded_body(ex)
            if data is None:
                raise UsageError(
                    f"exchange {ex.id} has no forwarded body: it went upstream as the agent sent it, or "
                    "not at all"
                )
        else:
            sha = ex.response_body if raw or not ex.response_final else ex.response_final
            data = r.response_body(ex, raw=raw)
            if TRUNCATED_FLAG in ex.flags and data is not None:
                kept = (
                    len(data) if raw or not ex.response_final else len(r.response_body(ex, raw=True) or b"")
                )
    if data is None:
        raise UsageError(f"exchange {ex.id} has no {part} body")
    if kept is not None:
        # what follows is not the whole response: say so where the bytes do not go
        click.echo(
            f"pvisor: note: the response of exchange {ex.id} was journaled only in part: the first "
            f"{kept:,} bytes of {ex.bytes_received:,} received (--max-response-body)",
            err=True,
        )
    if as_json:
        emit_json(
            {"exchange": ex.id, "part": part, "raw": raw, "sha256": sha, **(body_json_field(data) or {})}
        )
        return
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _export_help() -> dict[str, str]:
    return {"every_run": listed([f.name for f in offered("runs")])}


def _readers_help(option: str, template: str) -> Callable[[], str]:
    def made() -> str:
        from pvisor.adapters.exports.base import Option

        return template.format(", ".join(readers("run", Option(option))))

    return made


@journal.command("export", cls=derived_help(Command, _export_help))
@click.argument("run_id", metavar="[RUN]", required=False, type=RUN_ID)
@format_option("run", ". docs/exports.md", default="jsonl", show_default=True)
@click.option(
    "--output",
    "-o",
    type=PathParam(dir_okay=False, allow_dash=True, readable=False),
    default=None,
    help="Write to a file instead of stdout ('-': stdout); missing directories are created (0700).",
)
@click.option(
    "--no-bodies",
    is_flag=True,
    cls=DerivedHelpOption,
    help_from=_readers_help("--no-bodies", "Leave the bodies out ({}): metadata only."),
)
@click.option(
    "--with-content",
    is_flag=True,
    cls=DerivedHelpOption,
    help_from=_readers_help("--with-content", "{}: add each exchange's request and reply as span events."),
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --output: print a JSON summary {path, format, count}."
)
@click.pass_context
@progress_option
def export(
    ctx: click.Context,
    run_id: str | None,
    fmt: str,
    output: str | None,
    no_bodies: bool,
    with_content: bool,
    as_json: bool,
) -> None:
    """Export RUN (or every run, for {every_run}) in one of the formats of docs/exports.md.

    \b
    Examples:
      pvisor journal export r-3f2a9c0d1e2b --format atif -o run.atif.json
      pvisor journal export r-3f2a9c0d1e2b --format rows -o rows.jsonl
      pvisor journal export --format otel --with-content -o traces.jsonl
      pvisor journal export --format jsonl --no-bodies > meta.jsonl
    """
    from pvisor._version import __version__
    from pvisor.adapters.exports import get_format
    from pvisor.adapters.exports.base import JournalSource, Option, Settings, Source

    form = get_format(fmt)
    if Source.RUNS not in form.accepts and run_id is None:
        raise UsageError(f"--format {fmt} exports one run: give RUN (pvisor journal ls lists them)")
    if no_bodies and Option.NO_BODIES not in form.reads:
        raise UsageError(
            f"--no-bodies is for {listed(readers('run', Option.NO_BODIES))}; {fmt} holds no bodies"
            + (" unless --with-content" if Option.WITH_CONTENT in form.reads else "")
        )
    if with_content and Option.WITH_CONTENT not in form.reads:
        raise UsageError(
            f"--with-content is for {listed([f'--format {n}' for n in readers('run', Option.WITH_CONTENT)])}"
        )
    if output == "-":
        output = None
    if output is not None:
        check_export_path(output, "--output")
        refuse_reading(output, "--output", [absolute(ctx.obj["journal"], "--journal")])
    elif form.binary and is_terminal(sys.stdout):
        raise UsageError(
            f"--format {fmt} writes binary data: give -o FILE.{form.extension}, or redirect stdout"
        )
    settings = Settings(bodies=not no_bodies, with_content=with_content, version=__version__)

    def write(r: JournalReader, out) -> int:
        return form.write(JournalSource(r, run_id), out, settings).count

    with open_reader(ctx) as r:
        if run_id is not None:
            run_id = r.run(run_id).id  # an unknown run is an error before any file is touched
        if output is not None:
            n = write_export(output, "--output", lambda f: write(r, f))
        else:
            # no bar drawn into the output when stdout is the terminal too
            with progress.listening(None) if is_terminal(sys.stdout) else contextlib.nullcontext():
                n = write(r, sys.stdout.buffer)
            sys.stdout.buffer.flush()
    if output is not None:
        written_summary(output, fmt, form.unit, n, as_json)


@journal.command("verify")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def verify(ctx: click.Context, as_json: bool) -> int:
    """Check integrity: SQLite pages, every referenced blob present, every blob restoring to
    its sha256. Exit 3 when anything is wrong."""
    with open_reader(ctx) as r:
        rep = r.verify()
    if as_json:
        emit_json(
            {
                "ok": rep.ok,
                "problems": rep.problems,
                "runs": rep.runs,
                "exchanges": rep.exchanges,
                "blobs": rep.blobs,
                "blob_bytes_stored": rep.blob_bytes_stored,
                "blob_bytes_restored": rep.blob_bytes_restored,
            }
        )
    else:
        for p in rep.problems:
            click.echo(f"problem: {p}", err=True)
        status = "ok" if rep.ok else f"{len(rep.problems)} problem(s)"
        click.echo(
            f"{status}: {rep.runs} runs, {rep.exchanges} exchanges, {rep.blobs} blobs "
            f"({rep.blob_bytes_stored} bytes stored for {rep.blob_bytes_restored} bytes of bodies)"
        )
    if not rep.ok:
        ctx.exit(EXIT_INTEGRITY)
    return 0


@journal.command("steps")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the trajectory as JSON (schema pvisor.steps/v1, docs/steps.md).",
)
@click.pass_context
@progress_option
def steps(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show RUN (id or unique prefix) as steps: its main-loop exchanges by the chain rule, each
    step's tool calls and observation, flags, and the auxiliary exchanges left out."""
    from pvisor.adapters.journal_trajectory import trajectory_from_journal, trajectory_to_json

    with open_reader(ctx) as r:
        traj = trajectory_from_journal(r, run_id, wire_ids=True)
    if as_json:
        emit_json(trajectory_to_json(traj))
        return
    meta = traj.meta
    chains = meta["chains"]
    click.echo(
        terminal_safe(
            f"run {meta['run']}  agent={meta['agent'] or '-'} protocol={meta['protocol'] or '-'} "
            f"model={traj.model or '-'}"
        )
    )
    if not traj.steps:
        click.echo(f"no main-loop exchange: 0 steps ({counted(len(traj.left_out), 'auxiliary exchange')})")
    else:
        click.echo(f"task: {clip(traj.task or '-', 100)}")
        click.echo(f"main chain {meta['main_chain']} of {len(chains)}: {counted(len(traj.steps), 'step')}")
        rows = [
            [str(s.n), d["exchange"], action_cell(s), observation_cell(s), ",".join(s.flags) or "-"]
            for s, d in zip(traj.steps, meta["steps"])
        ]
        print_table(rows, ["STEP", "EXCHANGE", "ACTION (TOOL CALLS)", "OBSERVATION", "FLAGS"])
        # a live step of a continuation whose request went upstream rewritten: what the model got
        for s, d in zip(traj.steps, meta["steps"]):
            fwd = d.get("forwarded")
            if fwd is None:
                continue
            added = "".join(f"; it added {clip(t, 60)!r}" for t in fwd["added_user_text"])
            click.echo(
                terminal_safe(
                    f"step {s.n}: the live model got other bytes than the agent sent{added} "
                    f"(pvisor journal body {d['exchange']} --forwarded; the agent's: --request)"
                )
            )
    aux = meta["auxiliary"]
    click.echo(f"auxiliary: {len(aux)}")
    for a in aux:
        click.echo(terminal_safe(f"  seq {a['seq']}  {a['exchange']}  [{a['kind']}] {a['reason']}"))


def _add_sql() -> None:
    from pvisor.commands.sql import sql

    journal.add_command(sql)


# --------------------------------------------------------------------------- rm, vacuum


@journal.command("rm")
@click.argument("run_id", metavar="RUN", type=RUN_ID_TO_REMOVE)
@click.option(
    "--prefix",
    is_flag=True,
    help="RUN is the start of run ids: remove every run whose id starts with it, each listed.",
)
@click.option("--dry-run", is_flag=True, help="List the runs that would be removed; remove nothing.")
@click.option(
    "--force", is_flag=True, help="Remove it even while a writer (gateway, pvisor run) holds the journal."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print what was removed as JSON (with --prefix an array; with --dry-run the runs as ls --json).",
)
@click.pass_context
def rm(ctx: click.Context, run_id: str, prefix: bool, dry_run: bool, force: bool, as_json: bool) -> None:
    """Remove RUN, its whole id (a unique prefix is not enough; --prefix removes every run whose
    id starts with RUN): its attempts, exchanges, events, snapshots, the bodies no other run
    names, and its run directory (agent output, private home). --dry-run lists what would go.
    The freed pages are reused; pvisor journal vacuum gives them back to the disk."""
    from pvisor.journal.housekeeping import remove_run, runs_to_remove

    chosen = runs_to_remove(ctx.obj["journal"], run_id, prefix=prefix)
    if dry_run:
        if as_json:
            emit_json(chosen)
            return
        for s in chosen:
            click.echo(
                terminal_safe(
                    f"would remove run {s['id']}: agent {s['agent'] or '-'}, mode {s['mode']}, "
                    f"created {utc_time(s['created_ms'])}, {counted(s['exchanges'], 'exchange')}"
                )
            )
        click.echo(f"nothing removed (--dry-run): {counted(len(chosen), 'run')} would go", err=True)
        return
    going = {s["id"] for s in chosen}
    reports = []
    for s in chosen:
        rep = remove_run(ctx.obj["journal"], s["id"], force=force)
        reports.append(rep.to_json())
        if as_json:
            continue
        click.echo(
            f"removed run {rep.run}: {counted(rep.attempts, 'attempt')}, "
            f"{counted(rep.exchanges, 'exchange')}, "
            f"{counted(rep.events, 'event')}, {counted(rep.snapshots, 'snapshot')}; "
            f"{counted(rep.blobs_removed, 'blob')} "
            f"({rep.bytes_freed} bytes stored) removed, {rep.blobs_kept} kept (other runs name them)"
        )
        click.echo(terminal_safe(f"run directory: {rep.run_dir or '- (none)'}"))
        orphans = [c for c in rep.orphaned_children if c not in going]  # not those this rm removes too
        if orphans:
            click.echo(
                f"pvisor: note: {counted(len(orphans), 'run')} derived from it stay "
                f"({', '.join(orphans)}); their parent is gone",
                err=True,
            )
    if as_json:
        emit_json(reports if prefix else reports[0])


@journal.command("vacuum")
@click.option("--force", is_flag=True, help="Vacuum even while a writer holds the journal.")
@click.option("--json", "as_json", is_flag=True, help="Print {before, after} in bytes as JSON.")
@click.pass_context
def vacuum_cmd(ctx: click.Context, force: bool, as_json: bool) -> None:
    """Give the journal's free pages back to the disk: checkpoint the WAL, truncate it, VACUUM."""
    from pvisor.journal.housekeeping import vacuum

    before, after = vacuum(ctx.obj["journal"], force=force)
    if as_json:
        emit_json({"before": before, "after": after})
    else:
        click.echo(f"journal {ctx.obj['journal']}: {before} bytes -> {after} bytes")


@journal.command("merge")
@click.argument("sources", metavar="SRC...", nargs=-1, required=True)
@click.option(
    "--into",
    "into",
    required=True,
    metavar="DST",
    help="The journal to merge into (created when missing; missing directories too, 0700; a link to "
    "nothing yet: at its target).",
)
@click.option(
    "--run",
    "runs",
    multiple=True,
    type=MERGED_RUN_ID,
    metavar="RUN",
    help="Only this run (its whole id; repeat for more), with what it needs.",
)
@click.option(
    "--dry-run", is_flag=True, help="List what would come (runs, rows, blobs, bytes); write nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def merge_cmd(
    sources: tuple[str, ...], into: str, runs: tuple[str, ...], dry_run: bool, as_json: bool
) -> None:
    """Copy the runs of the journals SRC... into the journal DST: every run (or each --run) with its
    attempts, exchanges, snapshots, events and the blobs they name. Blobs DST holds are not copied
    again; run, exchange and snapshot ids are kept; events are renumbered into DST's order. A run
    DST holds already with the same rows is skipped; an id held with other content is a clash (exit
    65, nothing merged). One transaction: all or nothing. docs/journal.md "Merging journals".

    \b
    Examples:
      pvisor journal merge worker-1.sqlite worker-2.sqlite --into all.sqlite
      pvisor journal merge worker-1.sqlite --into all.sqlite --run r-3f2a9c0d1e2b --dry-run
    """
    from pvisor.journal.merge import stopped

    rep = _merge_stoppable(list(sources), into, set(runs) if runs else None, dry_run)
    try:
        if as_json:
            emit_json(rep.as_dict())
        else:
            _merge_summary(rep)
        for run, parent in rep.missing_parents.items():
            click.echo(
                terminal_safe(
                    f"pvisor: note: run {run} derives from run {parent}, which {one_line(into)} does not hold"
                    f"{' (nor will)' if dry_run else ''}: its lineage names a run elsewhere"
                ),
                err=True,
            )
    except KeyboardInterrupt as exc:
        rep.interrupted = True  # while the report was printed: the merge itself is done
        rep.stopped_by = getattr(exc, "signum", signal.SIGINT)
    if rep.interrupted:
        how = stopped(rep.stopped_by or signal.SIGINT)
        said = (
            f"journal merge --dry-run {how}: nothing merged"
            if dry_run
            else f"journal merge {how} after its commit: the merge into {one_line(into)} is complete"
        )
        click.echo(terminal_safe(f"pvisor: {said}"), err=True)


class _MergeStopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP during ``journal merge``: raised where the merge is, as Ctrl-C is, so
    that it rolls back and removes its temporary journal; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _merge_stoppable(sources: list[str], into: str, runs: set[str] | None, dry_run: bool):
    """:func:`~pvisor.journal.merge.merge_journals`, SIGTERM and SIGHUP handled as Ctrl-C is
    (exit 143, 129 before the commit, with one line; after it the merge is complete)."""
    from pvisor.journal.merge import merge_journals

    def raise_stopped(signum: int, frame) -> None:
        raise _MergeStopped(signum)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig in previous:
        signal.signal(sig, raise_stopped)
    try:
        return merge_journals(sources, into, runs=runs, dry_run=dry_run)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _merge_summary(rep) -> None:
    """``journal merge``'s lines: each run (would be) copied or skipped, then the totals."""
    would = "would copy" if rep.dry_run else "copied"
    for d in rep.details:
        lineage = f" (from {d['parent_run']}@{d['boundary_step']})" if d["parent_run"] else ""
        what = would if d["copied"] else "already there, skipped:"
        click.echo(
            terminal_safe(
                f"{what} run {d['run']} from {d['source']}: agent {d['agent'] or '-'}, mode {d['mode']}"
                f"{lineage}, {counted(d['exchanges'], 'exchange')}, {counted(d['snapshots'], 'snapshot')}"
            )
        )
    dst = one_line(rep.into) + (" (would be created)" if rep.dry_run and rep.created else
                                " (created)" if rep.created else "")  # fmt: skip
    totals = (
        f"{counted(len(rep.runs), 'run')}, {counted(rep.exchanges, 'exchange')}, "
        f"{counted(rep.snapshots, 'snapshot')}, {counted(rep.events, 'event')}; "
        f"{counted(rep.blobs_copied, 'blob')} new ({rep.bytes_copied} bytes stored), "
        f"{rep.blobs_shared} shared; "
        f"{len(rep.skipped)} already there"
    )
    if rep.dry_run:
        click.echo(terminal_safe(f"nothing merged (--dry-run) into {dst}: {totals}"), err=True)
    else:
        click.echo(terminal_safe(f"merged into {dst}: {totals}"))


@journal.command("scrub")
@click.argument("text", metavar="[TEXT]", required=False)
@click.option(
    "--regex", "regex", metavar="RE", help="Replace what this regular expression (Python, on bytes) matches."
)
@click.option(
    "--run", "run_id", type=RUN_ID, metavar="RUN", help="Only the bodies, rows and run directory of RUN."
)
@click.option(
    "--replacement",
    default=None,
    metavar="TEXT",
    help="What the text becomes in bodies and rows (default [scrubbed]; a binary file gets as many *).",
)
@click.option(
    "--force", is_flag=True, help="Scrub even while a writer (gateway, pvisor run) holds the journal."
)
@click.option(
    "--dry-run", is_flag=True, help="Count what would change (rolled back), touch no file, print the report."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@progress_option
def scrub_cmd(
    ctx: click.Context,
    text: str | None,
    regex: str | None,
    run_id: str | None,
    replacement: str | None,
    force: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Replace a leaked TEXT (or --regex RE) in every stored body, header and row, and in the run
    directories (files and names), so that no byte of it is left: changed bodies get a new
    sha256 and every frame stored against them is re-encoded; then secure_delete, a truncating
    WAL checkpoint and VACUUM. TEXT '-' reads it from stdin (one line, or all of it), keeping it
    out of the shell history. The journal is verified after, and searched again: exit 3 when the
    text is still found or the journal does not verify, 69 when another process kept the WAL
    from being emptied. docs/journal.md "Scrubbing a leaked secret"."""
    from pvisor.journal.scrub import DEFAULT_REPLACEMENT, Pattern, scrub

    if text == "-":
        text = _stdin_value("the text")  # bytes: what the user piped, whatever its encoding
    elif regex == "-":
        regex = _stdin_value("--regex")
    pattern = Pattern(text, regex, DEFAULT_REPLACEMENT if replacement is None else replacement)
    rep = scrub(ctx.obj["journal"], pattern, run_id=run_id, force=force, dry_run=dry_run)
    _scrub_summary(ctx, rep, pattern, dry_run, as_json)
    if rep.live_writers:
        click.echo(
            f"pvisor: warning: forced past live writer(s) (pid {', '.join(map(str, rep.live_writers))}): "
            "a body they "
            "store next may be a frame against a blob scrub replaced; stop them, then run pvisor journal "
            "verify",
            err=True,
        )
    nothing = not (rep.matches or rep.cells_changed or rep.files_changed or rep.names_changed)
    if nothing and not rep.remaining and not rep.not_rewritten:
        click.echo(
            "pvisor: note: nothing held the text (not the bodies, the rows or the run directories): "
            "check its spelling, or try --regex",
            err=True,
        )
    if dry_run:
        return
    _scrub_errors(ctx, rep)
    if rep.problems:
        ctx.exit(EXIT_INTEGRITY)
    if not rep.wal_truncated:
        ctx.exit(EXIT_UNAVAILABLE)
    if rep.remaining:
        ctx.exit(EXIT_INTEGRITY)


def _scrub_summary(
    ctx: click.Context, rep: ScrubReport, pattern: Pattern, dry_run: bool, as_json: bool
) -> None:
    """What ``journal scrub`` changed (or would), as JSON or three lines on stdout."""
    if as_json:
        emit_json(rep.to_json())
    else:
        verb, done = ("would scrub", "would change") if dry_run else ("scrubbed", "changed")
        click.echo(
            f"{verb} {pattern.describe}{f' in run {rep.run}' if rep.run else ''}: "
            f"{counted(rep.matches, 'match', 'matches')} in bodies, {counted(rep.blobs_changed, 'blob')} "
            f"{done}, "
            f"{rep.blobs_reencoded} re-encoded against a changed base, {counted(rep.rows_rewritten, 'row')} "
            f"renamed, {counted(rep.cells_changed, 'cell')} of metadata"
        )
        what = "hold it" if dry_run else "rewritten"
        renamed = "" if dry_run else f", {counted(len(rep.names_changed), 'name')} changed"
        click.echo(
            terminal_safe(
                f"run directories: {len(rep.run_dirs)} searched, {counted(len(rep.files_changed), 'file')} "
                f"{what}{renamed}"
            )
        )
        if not dry_run:
            verdict = "does not verify" if rep.problems else "verified"
            click.echo(
                terminal_safe(
                    f"journal {ctx.obj['journal']}: {rep.bytes_before} bytes -> {rep.bytes_after} bytes, "
                    f"{verdict}"
                )
            )


def _scrub_errors(ctx: click.Context, rep: ScrubReport) -> None:
    """One ``pvisor: error:`` line on stderr per thing a scrub could not finish."""
    for problem in rep.problems:
        click.echo(
            terminal_safe(f"pvisor: error: the journal does not verify after scrub: {problem}"), err=True
        )
    journal = ctx.obj["journal"]  # already as a Path names it (cli: plain_path)
    wal = {journal, f"{journal}-wal"}
    for place in rep.remaining:
        if not rep.wal_truncated and place in wal:
            continue  # the WAL line below says why
        click.echo(terminal_safe(f"pvisor: error: scrub left the text in {place}"), err=True)
    if not rep.wal_truncated:
        click.echo(
            "pvisor: error: the text is replaced in the journal's rows, but another process reads the "
            "journal, so "
            "the checkpoint could not finish: the old pages may remain in the journal file until it "
            "does; run "
            "pvisor journal vacuum when that process has closed",
            err=True,
        )
    left = {entry["path"] for entry in rep.not_rewritten}
    if left and not rep.problems:
        click.echo(
            f"pvisor: error: the journal is scrubbed, but {counted(len(left), 'file')} of the run "
            "directories "
            f"{'was' if len(left) == 1 else 'were'} left as listed: fix what is said and run the same "
            "scrub again "
            "(it is safe to repeat)",
            err=True,
        )


def _stdin_value(what: str) -> bytes:
    """``-``: the value read from stdin as bytes, without one final newline (``\\n`` or
    ``\\r\\n``). UsageError when stdin is empty."""
    data = sys.stdin.buffer.read()
    if data.endswith(b"\n"):
        data = data[:-1].removesuffix(b"\r")
    if not data:
        raise UsageError(
            f"scrub: {what} is '-', but stdin was empty: pipe it in (echo \"$KEY\" | pvisor journal scrub -)"
        )
    return data


_add_sql()
