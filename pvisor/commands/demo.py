"""``pvisor demo``: gateway + scripted model + a tiny agent loop, offline; then ``journal show``."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from pvisor.commands.base import Command
from pvisor.commands.journal import show
from pvisor.journal.reader import JournalReader
from pvisor.session.demo import main


@click.command("demo", cls=Command)
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Run the capture path offline: a scripted model server, the gateway in front of it, and
    a built-in agent loop that makes one real shell tool call. Records the run in the journal
    (--journal) and shows it."""
    journal = Path(ctx.obj["journal"])
    result = main(journal, say=lambda line: click.echo(line))
    click.echo("")
    ctx.invoke(show, run_id=result.run, as_json=False)
    with JournalReader(journal) as r:
        first = r.exchanges(result.run)[0].id
    me = invoked_as()
    click.echo("")
    click.echo(f"Next: {me} journal steps {result.run}           (the run as steps)")
    click.echo(f"      {me} journal body {first} --request   (the exact request an exchange sent)")
    click.echo(f"      {me} report {result.run} --open          (the run as a page in your browser)")


def invoked_as() -> str:
    """How to type this command again: ``pvisor`` when that is what PATH finds, else the path
    it was started by (``.venv/bin/pvisor`` from ``scripts/demo``, which puts nothing on PATH)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "pvisor"
    if os.path.basename(argv0) != "pvisor" or os.sep not in argv0:
        on_path = shutil.which("pvisor")
        return "pvisor" if on_path else f"{os.path.basename(sys.executable)} -m pvisor"
    found = shutil.which("pvisor")
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return "pvisor"
    rel = os.path.relpath(argv0)
    return rel if not rel.startswith("..") and len(rel) < len(argv0) else argv0
