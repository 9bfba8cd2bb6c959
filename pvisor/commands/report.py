"""``pvisor report``: a run as one self-contained HTML page (docs/report.md)."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click

from pvisor.adapters.exports import get_format
from pvisor.adapters.exports.base import JournalSource, Settings
from pvisor.commands.base import Command, PathParam, one_line
from pvisor.commands.outputs import check_export_path, make_output_parent, refuse_reading
from pvisor.commands.params import RUN_ID, Size
from pvisor.commands.progress import progress_option
from pvisor.core.errors import OutputError
from pvisor.journal.reader import JournalReader

#: the export format this command writes (pvisor.adapters.exports.report)
REPORT = "report"


@click.command("report", cls=Command)
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option(
    "--output",
    "-o",
    type=PathParam(dir_okay=False, readable=False),
    default=None,
    help="The page to write (default: RUN.html in the current directory; missing directories are created, "
    "0700).",
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
@click.pass_context
@progress_option
def report(
    ctx: click.Context,
    run_id: str,
    output: str | None,
    body_limit: int,
    no_parent: bool,
    no_workspace: bool,
    open_it: bool,
) -> None:
    """Write RUN (id or unique prefix) as one HTML page that needs no network: its steps with
    their tool calls and observations, the auxiliary exchanges greyed, timings and token usage,
    each exchange's request and response; for a replay, the boundary and O against O′, with the
    parent run's page written beside it and linked. Prints the path of each page written.

    \b
    Examples:
      pvisor report r-3f2a9c0d1e2b
      pvisor report r-3f2a9c0d1e2b -o run.html --open
    """
    form = get_format(REPORT)
    with JournalReader(Path(ctx.obj["journal"])) as reader:
        run = reader.run(run_id)  # an unknown run is a usage error before anything is written
        path = Path(output) if output is not None else Path(f"{run.id}.{form.extension}")
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
