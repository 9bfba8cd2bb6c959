"""What the gateway and the scripted model server share about running and stopping: the request
handlers in flight (for a graceful stop that ends on time), and aiohttp's own log records turned
into one-line messages.

Stopping (docs/gateway.md): stop accepting; wait for the handlers in flight up to a grace
period, or less if :meth:`InFlight.hurry` is called (a second Ctrl-C); cancel the ones still
running (each records what it had so far when it sees the CancelledError); then close.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import logging
from typing import Any, Callable, Coroutine, Iterator

from aiohttp import web

from pvisor.core.errors import UsageError

#: aiohttp's loggers: ``aiohttp.server`` logs a traceback for a malformed request
#: (``Content-Length: abc``) and for a handler that raises
AIOHTTP_LOGGERS = ("aiohttp.server", "aiohttp.access", "aiohttp.web")

#: how long cancelled handlers get to record what they had and unwind
CANCEL_WAIT_S = 5.0


class EventLoop(enum.Enum):
    """The event loop a server runs on (``pvisor gateway --event-loop``)."""

    ASYNCIO = "asyncio"  #: asyncio's own selector loop (the default: uvloop did not measure better)
    AUTO = "auto"  #: uvloop when it is installed (the extra ``pvisor-replay[uvloop]``), else asyncio's
    UVLOOP = "uvloop"  #: uvloop's loop (libuv); a usage error when uvloop is not installed


def loop_factory(choice: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop ``choice`` names, None for asyncio's own.

    Raises UsageError (exit 2) for ``UVLOOP`` when uvloop cannot be imported."""
    if choice is EventLoop.ASYNCIO:
        return None
    try:
        import uvloop  # the optional uvloop extra
    except ImportError:
        if choice is EventLoop.UVLOOP:
            raise UsageError(
                "--event-loop uvloop: uvloop is not installed "
                "(pip install '.[uvloop]' in a clone of pvisor; docs/install.md)"
            ) from None
        return None
    return uvloop.new_event_loop


def run_on(choice: EventLoop, main: Coroutine[Any, Any, Any]) -> Any:
    """Run ``main`` to its end on a new loop of the kind ``choice`` names (as ``asyncio.run``)."""
    factory = loop_factory(choice)
    if factory is None:
        return asyncio.run(main)
    if hasattr(asyncio, "Runner"):  # Python 3.11+
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    import uvloop  # the optional extra (loop_factory found it); Python 3.10 takes it through the policy

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        return asyncio.run(main)
    finally:
        asyncio.set_event_loop_policy(None)


#: young-generation threshold once serving: a collection every 20,000 allocations, not 700
GC_THRESHOLD = (20_000, 20, 40)


def tune_gc_for_serving() -> None:
    """Once a server has started: move everything allocated so far (modules, configuration)
    into the permanent generation, so that collections never scan it again, and collect the
    young generation less often. Measured (bench/cpu_per_request.py): the gateway's CPU per
    10 KB exchange at concurrency 32 drops by about a fifth; Python's defaults collect every
    700 allocations and rescan every long-lived object on each full collection."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class InFlight:
    """The request handler tasks in progress.

    ``with inflight.track(): ...`` around a handler's body; :meth:`wait_idle` until none is left;
    :meth:`settle` at shutdown: wait up to a grace period (cut short by :meth:`hurry`), then
    cancel what is left and wait for it to unwind.
    """

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._hurry = asyncio.Event()

    def __len__(self) -> int:
        return len(self.tasks)

    def add(self, task: asyncio.Task) -> None:
        """A handler task starts (the gateway's hot path: no context manager)."""
        self.tasks.add(task)
        self._idle.clear()

    def discard(self, task: asyncio.Task) -> None:
        """A handler task ends."""
        self.tasks.discard(task)
        if not self.tasks:
            self._idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None
        self.add(task)
        try:
            yield
        finally:
            self.discard(task)

    def hurry(self) -> None:
        """Stop waiting for handlers in flight: :meth:`settle` cancels them at once."""
        self._hurry.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True once no handler is in flight; False after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def settle(self, grace: float) -> int:
        """Wait up to ``grace`` seconds (less after :meth:`hurry`) for the handlers in flight,
        then cancel those still running and wait up to :data:`CANCEL_WAIT_S` for them to end.
        Returns how many were cancelled."""
        if self.tasks and not self._hurry.is_set():
            waits = {asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(self._hurry.wait())}
            try:
                await asyncio.wait(waits, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        left = [t for t in self.tasks if not t.done()]
        for t in left:
            t.cancel()
        if left:
            await asyncio.wait(left, timeout=CANCEL_WAIT_S)
        return len(left)


def close_idle_connections(runner: web.BaseRunner | None) -> None:
    """Close the kept-alive connections that are idle, and make the busy ones close after their
    response: once stopping has begun, no new request may start on an old connection."""
    server = getattr(runner, "server", None) if runner is not None else None
    pre_shutdown = getattr(server, "pre_shutdown", None)  # aiohttp >= 3.10
    if pre_shutdown is not None:
        pre_shutdown()


def one_line(record: logging.LogRecord) -> str:
    """A log record as one line: its message, and the exception's type (never its traceback,
    nor its text, which for a malformed request may quote the request's header bytes)."""
    text = " ".join(record.getMessage().split())
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None:
        text += f" ({type(exc).__name__})"
    return text


class _Forward(logging.Handler):
    """Passes aiohttp's records, as one line, to each target logger registered."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[logging.Logger] = []

    def emit(self, record: logging.LogRecord) -> None:
        for target in self.targets:
            if target.handlers:
                target.log(record.levelno, "%s: %s", record.name, one_line(record))


_forward = _Forward()
_saved_propagate: dict[str, bool] = {}


def route_aiohttp_logs(target: logging.Logger) -> None:
    """Send aiohttp's own log records to ``target`` (a log file's logger; one without handlers
    drops them) as one line each, and nowhere else: no traceback reaches the terminal."""
    if not _forward.targets:
        for name in AIOHTTP_LOGGERS:
            lg = logging.getLogger(name)
            _saved_propagate[name] = lg.propagate
            lg.propagate = False
            lg.addHandler(_forward)
    _forward.targets.append(target)


def unroute_aiohttp_logs(target: logging.Logger) -> None:
    """Undo :func:`route_aiohttp_logs` for ``target`` (aiohttp's loggers are restored when no
    target is left)."""
    if target in _forward.targets:
        _forward.targets.remove(target)
        if not _forward.targets:
            for name in AIOHTTP_LOGGERS:
                lg = logging.getLogger(name)
                lg.removeHandler(_forward)
                lg.propagate = _saved_propagate.pop(name, True)
