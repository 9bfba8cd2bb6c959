"""Progress of long work (reading a large native file, a long run's steps, an export, a report,
a replay), reported to whoever listens.

Library code wraps a long loop in a task and says how far it got::

    with progress.task("reading rollout.jsonl", total=size, unit=Unit.BYTES) as t:
        for chunk in chunks:
            ...
            t.advance(len(chunk))

Nobody listens unless a caller installs a :class:`Sink` with :func:`listening` (the command
line does, with a bar on stderr when stderr is a terminal and ``--no-progress`` is not given);
then a task costs one call per :meth:`Task.advance`, and without a sink a no-op. One task is
shown at a time: a task opened while another is open is silent, so a library function that
reports its own progress can be called from one that reports the whole.

The sink is held in a :class:`contextvars.ContextVar`, so it follows the code into the asyncio
tasks it starts, and two threads do not share it.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Protocol
else:
    # the interfaces below are for the type checker: a typing.Protocol class costs every short
    # command twice a plain class's making (0.07 M instructions each), and none is checked at run time
    Protocol = object


class Unit(str, enum.Enum):
    """What a task counts: how a sink shows its position."""

    BYTES = "bytes"
    STEPS = "steps"
    EXCHANGES = "exchanges"
    REQUESTS = "requests"
    BLOBS = "blobs"


class Bar(Protocol):
    """What a sink draws for one task."""

    def update(self, n: int) -> None:
        """``n`` more units done (``n`` >= 0)."""

    def close(self) -> None:
        """The task ended (done, failed or cut short)."""


class Sink(Protocol):
    """Whoever shows progress: :meth:`start` is called once per shown task."""

    def start(self, label: str, total: int, unit: Unit) -> Bar:
        """A bar for a task of ``total`` units (``total`` >= 0) called ``label``."""


class Task:
    """The handle a long loop reports through; see the module docstring."""

    __slots__ = ("_bar", "done", "total")

    def __init__(self, bar: Bar | None, total: int) -> None:
        self._bar = bar
        self.total = total
        #: units reported so far, capped at ``total``
        self.done = 0

    def advance(self, n: int = 1) -> None:
        """``n`` more units are done."""
        if self._bar is None or n <= 0:
            return
        n = min(n, self.total - self.done)
        if n > 0:
            self.done += n
            self._bar.update(n)

    def reach(self, done: int) -> None:
        """``done`` units are done in all (a position that goes back is ignored)."""
        self.advance(done - self.done)


_sink: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("pvisor_progress_sink", default=None)
_open: contextvars.ContextVar[Task | None] = contextvars.ContextVar("pvisor_progress_open", default=None)
_SILENT = Task(None, 0)


@contextlib.contextmanager
def listening(sink: Sink | None) -> Iterator[None]:
    """Show the tasks opened inside the block on ``sink`` (None: show nothing)."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


@contextlib.contextmanager
def task(label: str, total: int, unit: Unit = Unit.STEPS) -> Iterator[Task]:
    """A task of ``total`` units called ``label`` (``"reading FILE"``, ``"steps of RUN"``); shown
    when a sink listens and no other task is open; the bar closes when the block ends."""
    sink = _sink.get()
    shown = sink is not None and _open.get() is None
    bar = sink.start(label, max(total, 0), unit) if shown else None
    t = Task(bar, max(total, 0))
    token = _open.set(t)
    try:
        yield t
    finally:
        _open.reset(token)
        if bar is not None:
            bar.close()


def active() -> bool:
    """True when a task opened now would be shown (a caller may skip counting a total)."""
    return _sink.get() is not None and _open.get() is None


def current() -> Task:
    """The innermost open task (silent when it is not shown, or when none is open): a loop deep
    inside a task reports to it without being handed it (the lines of a native file, read for
    ``reading FILE``)."""
    return _open.get() or _SILENT
