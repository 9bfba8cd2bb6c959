"""``pvisor demo``: gateway + scripted model + a tiny agent loop, offline; then ``journal show``."""

from __future__ import annotations

from pathlib import Path

import click

from pvisor.commands.journal import show


@click.command("demo")
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Run the capture path offline: a scripted model server, the gateway in front of it, and
    a built-in agent loop that makes one real shell tool call. Records the run in the journal
    (--journal) and shows it."""
    from pvisor.demo import main

    result = main(Path(ctx.obj["journal"]), say=lambda line: click.echo(line))
    click.echo("")
    ctx.invoke(show, run_id=result.run, as_json=False)
    click.echo("")
    click.echo("Next: pvisor journal body EXCHANGE --request   (the exact request an exchange sent)")
    click.echo("      pvisor journal body EXCHANGE --response  (the reassembled reply)")
