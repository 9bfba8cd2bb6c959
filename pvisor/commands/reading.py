"""What the commands that read the Event Journal share (``pvisor journal ...``, ``pvisor
snapshot ...``): the journal the command line names (``--journal``, held in ``ctx.obj``)
opened read-only, a JSON document written to stdout, and a time of the journal (Unix epoch ms)
as UTC text. The tables' cells are :mod:`pvisor.commands.cells`'s."""

from __future__ import annotations

import datetime as _dt
import sys

import click
import orjson

from pvisor.journal.reader import JournalReader


def open_reader(ctx: click.Context) -> JournalReader:
    """A reader of the journal named by ``--journal`` (``ctx.obj["journal"]``), to be used as a
    context manager; opening it raises the journal's own errors (a missing file: exit 2)."""
    return JournalReader(ctx.obj["journal"])


def emit_json(obj) -> None:
    """``obj`` as JSON indented by two spaces, one document and a newline on stdout (bytes)."""
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")


def utc_time(ms: float | None) -> str:
    """Unix epoch milliseconds as ``YYYY-MM-DD HH:MM:SS`` (UTC); ``-`` for none (None or 0)."""
    if not ms:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
