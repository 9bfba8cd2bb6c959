"""The progress bar of long commands: ``--no-progress`` and a :class:`pvisor.core.progress.Sink`
drawing :func:`click.progressbar` on stderr.

A bar is drawn only when stderr is a terminal (nothing goes into a log or a pipe) and
``--no-progress`` is not given; ``PVISOR_NO_PROGRESS=1`` turns it off for every command
(docs/cli.md "Progress"). stdout is never touched: a command's output stays what it is.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import click

from pvisor.core import progress
from pvisor.core.progress import Unit

#: the environment variable that turns bars off everywhere (any value but "", "0")
NO_PROGRESS_ENV = "PVISOR_NO_PROGRESS"


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class _ClickBar:
    """One :func:`click.progressbar` on stderr."""

    def __init__(self, label: str, total: int, unit: Unit) -> None:
        self.unit = unit
        self.total = total
        self.done = 0
        self._bar = click.progressbar(
            length=total,
            label=label,
            file=sys.stderr,
            show_eta=True,
            show_percent=True,
            show_pos=unit is not Unit.BYTES,
            item_show_func=self._item if unit is Unit.BYTES else None,
            width=24,
        )
        self._bar.__enter__()

    def _item(self, _: Any) -> str:
        return f"{_size(self.done)} of {_size(self.total)}"

    def update(self, n: int) -> None:
        self.done += n
        self._bar.update(n, self.done)

    def close(self) -> None:
        self._bar.__exit__(None, None, None)


class ClickSink:
    """Draws each shown task as a click progress bar on stderr."""

    def start(self, label: str, total: int, unit: Unit) -> _ClickBar:
        return _ClickBar(label, total, unit)


def wanted(no_progress: bool) -> bool:
    """True when a bar is to be drawn: stderr is a terminal, and neither ``--no-progress`` nor
    ``$PVISOR_NO_PROGRESS`` says no."""
    if no_progress or os.environ.get(NO_PROGRESS_ENV, "") not in ("", "0"):
        return False
    return is_terminal(sys.stderr)


def progress_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` a ``--no-progress`` flag and run it with bars on stderr when
    :func:`wanted` says so (the flag does not reach the command's function)."""

    @click.option(
        "--no-progress",
        "no_progress",
        is_flag=True,
        help="No progress bar on stderr (none is drawn when stderr is not a terminal).",
    )
    @functools.wraps(command)
    def wrapper(*args: Any, no_progress: bool, **kwargs: Any) -> Any:
        with progress.listening(ClickSink() if wanted(no_progress) else None):
            return command(*args, **kwargs)

    return wrapper
