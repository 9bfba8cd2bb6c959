"""The warnings and errors pvisor's own loggers (``pvisor.journal``, ``pvisor.gateway``) log while
a command serves or runs, shown on stderr as one ``pvisor: warning: ...`` (or ``pvisor: error:
...``) line each: the journal locked by another process, a snapshot that failed, an upstream that
went away. Used by ``pvisor gateway`` and ``pvisor run``."""

from __future__ import annotations

import logging
from typing import Callable

import click

from pvisor.gateway.lifecycle import one_line


class StderrLines(logging.Handler):
    """Log records as one ``pvisor: warning: ...`` (or ``error``) line on stderr each (control
    characters escaped: :func:`pvisor.gateway.lifecycle.one_line`)."""

    def emit(self, record: logging.LogRecord) -> None:
        level = "error" if record.levelno >= logging.ERROR else "warning"
        try:
            click.echo(f"pvisor: {level}: {one_line(record)}", err=True)
        except Exception:  # stderr closed: nothing to tell
            pass


def show_on_stderr(names: tuple[str, ...]) -> Callable[[], None]:
    """Show the warnings and errors of the loggers ``names`` on stderr; returns the undo."""
    handler = StderrLines(logging.WARNING)
    loggers = [logging.getLogger(n) for n in names]
    for lg in loggers:
        lg.addHandler(handler)

    def undo() -> None:
        for lg in loggers:
            lg.removeHandler(handler)

    return undo
