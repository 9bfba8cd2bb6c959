"""``pvisor report``: a run as one self-contained HTML page (docs/report.md)."""

from __future__ import annotations

import datetime
import webbrowser
from pathlib import Path
from typing import Any

import click

from pvisor.adapters.agents import descriptor_names
from pvisor.adapters.exports import get_format
from pvisor.adapters.exports.base import JournalSource, Settings
from pvisor.adapters.exports.report import write_folder
from pvisor.adapters.exports.report_index import INDEX_NAME, is_report_folder, page_name, page_names
from pvisor.commands.base import Command, PathParam, one_line
from pvisor.commands.outputs import check_export_path, make_output_parent, refuse_reading
from pvisor.commands.params import RUN_ID, Size
from pvisor.commands.progress import progress_option
from pvisor.commands.reading import utc_time
from pvisor.core.errors import OutputError, UsageError
from pvisor.journal.model import Run
from pvisor.journal.paths import make_directories
from pvisor.journal.reader import JournalReader

#: the export format this command writes (pvisor.adapters.exports.report)
REPORT = "report"
#: the folder --all writes when -o is not given, in the current directory
DEFAULT_FOLDER = "pvisor-report"
#: the runs --all writes when --limit is not given: the newest ones
DEFAULT_LIMIT = 100


class Since(click.ParamType):
    """``--since``: an ISO 8601 date (``2026-12-01``) or date-time (``2026-12-01T09:30``,
    ``2026-12-01 09:30:00``, ``...Z``, ``...+02:00``), UTC unless it names an offset; the value
    is Unix epoch milliseconds. A bad value is click's one-line error naming the flag (exit 2)."""

    name = "date"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            when = datetime.datetime.fromisoformat(str(value).strip())
        except ValueError:
            self.fail(
                f"{value!r} is not an ISO date or date-time (2026-12-01, 2026-12-01T09:30, "
                "2026-12-01T09:30:00+02:00; UTC unless an offset is given)",
                param,
                ctx,
            )
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        try:  # the index names it in UTC: an offset may push it out of years 1 to 9999
            when = when.astimezone(datetime.timezone.utc)
        except OverflowError:
            self.fail(f"{value!r} is out of range in UTC (years 1 to 9999)", param, ctx)
        return int(when.timestamp() * 1000)


SINCE = Since()


def make_folder(folder: str, option: str) -> None:
    """Create ``folder`` and its missing parents (0700); OutputError (exit 74) when the OS refuses."""
    try:
        make_directories(folder)
    except OSError as exc:
        why = exc.strerror or exc
        raise OutputError(f"cannot write {option} {folder}: cannot create it: {why}") from None


@click.command("report", cls=Command)
@click.argument("run_id", metavar="RUN", type=RUN_ID, required=False)
@click.option(
    "--output",
    "-o",
    type=PathParam(readable=False),
    default=None,
    help="The page to write (default: RUN.html in the current directory; missing directories are created, "
    f"0700); with --all the folder (default: {DEFAULT_FOLDER}/).",
)
@click.option(
    "--body-limit",
    type=Size(1024),
    default="8KiB",
    show_default=True,
    help="Bytes of each request and response body the page keeps (head and tail).",
)
@click.option(
    "--no-parent", is_flag=True, help="For a derived run, do not write the parent run's page beside it."
)
@click.option(
    "--no-workspace",
    is_flag=True,
    help="Leave out the files each step changed (their names and diffs, from the run's snapshots).",
)
@click.option("--open", "open_it", is_flag=True, help="Open the page in the default browser once written.")
@click.option(
    "--all", "all_runs", is_flag=True, help="Instead of RUN: a folder of the runs' pages and their index."
)
@click.option("--since", type=SINCE, default=None, help="With --all: runs created at or after DATE (UTC).")
@click.option(
    "--agent", type=click.Choice(descriptor_names()), default=None, help="With --all: the runs of this agent."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help=f"With --all: the N newest runs selected (default: {DEFAULT_LIMIT}).",
)
@click.pass_context
@progress_option
def report(
    ctx: click.Context,
    run_id: str | None,
    output: str | None,
    body_limit: int,
    no_parent: bool,
    no_workspace: bool,
    open_it: bool,
    all_runs: bool,
    since: int | None,
    agent: str | None,
    limit: int | None,
) -> None:
    """Write RUN (id or unique prefix) as one HTML page that needs no network: its steps with
    their tool calls and observations, the auxiliary exchanges greyed, timings and token usage,
    each exchange's request and response; for a replay, the boundary and O against O′, with the
    parent run's page written beside it and linked. Prints the path of each page written.

    \b
    With --all instead of RUN: a folder of pages, one per run selected (the newest --limit ones,
    created since --since, of --agent), and index.html listing them, each page linked to its
    parent and child runs in the folder. Prints the path of each file written, the index last.

    \b
    Examples:
      pvisor report r-3f2a9c0d1e2b
      pvisor report r-3f2a9c0d1e2b -o run.html --open
      pvisor report --all --since 2026-12-01 --agent codex -o codex-runs
    """
    if all_runs or run_id is None:
        _check_all(run_id, all_runs, no_parent)
        written = _write_all(
            ctx, output, body_limit, since, agent, limit or DEFAULT_LIMIT, workspace=not no_workspace
        )
        if written:
            _done(written, open_it)
        return
    for flag, value in (("--since", since), ("--agent", agent), ("--limit", limit)):
        if value is not None:
            raise UsageError(f"{flag} selects runs for --all: give --all instead of RUN, or leave {flag} out")
    if output in ("", "-"):  # check_export_path offers "-" for stdout: a report is files
        raise UsageError(
            f"--output {output!r}: a report is a page written as a file, with its parent's page "
            "beside it: give a FILE (e.g. run.html)"
        )
    form = get_format(REPORT)
    with JournalReader(Path(ctx.obj["journal"])) as reader:
        run = reader.run(run_id)  # an unknown run is a usage error before anything is written
        path = (
            Path(output) if output is not None else Path(page_name(run.id)).with_suffix(f".{form.extension}")
        )
        check_export_path(output if output is not None else str(path), "--output")
        refuse_reading(str(path), "--output", [str(ctx.obj["journal"])])
        make_output_parent(str(path), "--output")
        settings = Settings(body_limit=body_limit, with_parent=not no_parent, workspace=not no_workspace)
        try:
            written = form.write(JournalSource(reader, run.id), path, settings).paths
        except OSError as exc:
            raise OutputError(f"cannot write --output {path}: {exc.strerror or exc}") from None
    for p in written:
        click.echo(one_line(str(p)))
    if open_it:
        if not webbrowser.open(written[0].resolve().as_uri()):
            click.echo(f"pvisor: warning: no browser to open {one_line(str(written[0]))}", err=True)


def _done(written: list[Path], open_it: bool) -> None:
    """Print the files of --all (the index last) and open the index with --open."""
    for p in written:
        click.echo(one_line(str(p)))
    if open_it and not webbrowser.open(written[-1].resolve().as_uri()):
        click.echo(f"pvisor: warning: no browser to open {one_line(str(written[-1]))}", err=True)


def _check_all(run_id: str | None, all_runs: bool, no_parent: bool) -> None:
    """UsageError for RUN and --all together, neither, or --no-parent with --all."""
    if not all_runs:
        raise UsageError("Missing argument 'RUN': give a run's id, or --all for a folder of every run's page")
    if run_id is not None:
        raise UsageError(f"RUN {run_id} and --all: give one of them (--all writes every run's page)")
    if no_parent:
        raise UsageError("--no-parent is for one RUN: --all writes the pages of the runs it selects only")


def _select(runs: list[Run], since: int | None, agent: str | None, limit: int) -> list[Run]:
    """The runs --all writes: created at or after ``since`` (epoch ms), of ``agent``, the
    ``limit`` newest, newest first."""
    chosen = [
        r for r in runs if (since is None or r.created_ms >= since) and (agent is None or r.agent == agent)
    ]
    return chosen[::-1][:limit]


def _selection(n: int, total: int, since: int | None, agent: str | None, limit: int) -> str:
    """The index's line naming the selection: ``3 of 5 runs (--agent codex, --limit 3)``."""
    how = [f"--since {utc_time(since)} UTC" if since is not None else "", f"--agent {agent}" if agent else ""]
    how.append(f"--limit {limit}" if n == limit and n < total else "")
    said = ", ".join(h for h in how if h)
    return f"{n} of {total} runs" + (f" ({said})" if said else "") + ", newest first"


def _write_all(
    ctx: click.Context,
    output: str | None,
    body_limit: int,
    since: int | None,
    agent: str | None,
    limit: int,
    workspace: bool = True,
) -> list[Path]:
    """``--all``: the folder written (module docstring; docs/report.md "A folder of runs"); the
    files written, or [] when no run is selected (said on stderr, nothing written)."""
    journal = str(ctx.obj["journal"])
    if output in ("", "-"):  # Path("") is the current directory; "-" is no stdout for a folder
        raise UsageError(f"-o {output!r}: --all writes a folder of pages: give a DIR")
    folder = Path(output if output is not None else DEFAULT_FOLDER)
    _check_folder(folder, journal)
    with JournalReader(Path(journal)) as reader:
        runs = reader.runs()
        chosen = _select(runs, since, agent, limit)
        if not chosen:
            what = "no run" if not runs else f"none of the journal's {len(runs)} runs matches --since/--agent"
            click.echo(f"pvisor: {what}: nothing written", err=True)
            return []
        ids = [r.id for r in chosen]
        for name in [*page_names(ids).values(), INDEX_NAME]:
            target = folder / name
            if target.is_dir():
                raise UsageError(f"cannot write -o {folder}: {target} is a directory")
            refuse_reading(str(target), "-o", [journal])
        make_folder(str(folder), "-o")
        try:
            said = _selection(len(ids), len(runs), since, agent, limit)
            return write_folder(reader, ids, folder, body_limit, said, workspace=workspace)
        except OSError as exc:
            where = exc.filename or folder
            raise OutputError(f"cannot write -o {folder}: {one_line(where)}: {exc.strerror or exc}") from None


def _check_folder(folder: Path, journal: str) -> None:
    """UsageError (exit 2) for an -o of --all that is no folder to write pages into: the journal
    or a file SQLite keeps beside it (its ``-wal``, which opening the journal makes: a directory
    there would lock every writer out), a file, below a file, or a directory that is not empty
    and no folder an earlier --all wrote (whose files pvisor would write over without knowing
    them)."""
    text = str(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"cannot write -o {text}: it is a file, not a directory (--all writes a folder)")
    refuse_reading(text, "-o", [journal])
    if folder.is_dir():
        if any(folder.iterdir()) and not is_report_folder(folder):
            raise UsageError(
                f"cannot write -o {text}: it is not empty and pvisor report --all did not write it "
                "(no index.html of its own): give a new or empty directory"
            )
        return
    check_export_path(text, "-o")
