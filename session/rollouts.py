"""Rollouts from a manifest: :func:`run_rollout` runs one :class:`~pvisor.replay.rollout_manifest.
RolloutLine` (a replay-only, a continuation, a handoff, or a prepare-only) and returns its
:class:`RolloutRow`; :func:`run_rollouts` runs many on this machine (docs/result-protocol.md
"Rollouts from a manifest").

:func:`run_rollout` depends on nothing of its caller's but its arguments (no current directory,
no global state): a worker process or a Ray task calls it with the journal where the source
run is read and the derived run written, the output directory and, optionally, the workspace.
It never raises for a rollout's own failure: that is a ``failed`` row with the error's code and
message. A line's ``key_file`` is read here, on the machine that runs the rollout, and its
variables go into the agent's environment only (never into a row, a result or a message).

:func:`run_rollouts` runs each agent rollout in a process of its own (``spawn``, one rollout
per process, as :func:`~pvisor.session.api.continue_many`: pvisor ends what an agent leaves
behind by walking its own descendants, which two agents in one process would mistake for each
other's); prepare-only lines run in the caller's process, as the prepare-only batch runs them.
"""

from __future__ import annotations

import dataclasses
import enum
import multiprocessing
import os
import re
import signal
import sqlite3
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from multiprocessing.connection import wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvisor.core.errors import OutputError, PvisorError, UsageError
from pvisor.replay.errors import error_code, error_detail, show_path
from pvisor.replay.rollout_manifest import RolloutLine, RolloutMode, in_line_keys
from pvisor.replay.spec import BY_NAME, ReplayMode, ReplayProblems, ReplaySpec


class RowStatus(str, enum.Enum):
    """How a rollout ended: its result document's ``status``, ``failed`` without one."""

    OK = "ok"
    DIVERGED = "diverged"
    FAILED = "failed"


class RolloutError(str, enum.Enum):
    """Codes of a row's error that no result document has (the rest are the result's codes)."""

    #: the line's key_file is missing, unreadable, or holds a line that is not NAME=VALUE
    BAD_KEY_FILE = "bad_key_file"
    #: the process that ran the rollout ended before it returned a row
    WORKER_DIED = "worker_died"
    #: a bug of pvisor's in this rollout alone (the others go on)
    INTERNAL = "internal_error"


@dataclass
class RolloutRow:
    """One rollout's outcome: ``line`` (the manifest's line number), ``name``, ``mode`` (a
    :class:`~pvisor.replay.rollout_manifest.RolloutMode` value), ``status`` (a
    :class:`RowStatus` value), ``agent`` (the agent that ran: the source's, or None before it
    was known), ``to_agent`` (a handoff's), ``after_step``, ``derived_run`` (the run it made in
    the journal, or None), ``ended_by`` (why the live part ended, else why the agent ended),
    ``live_steps``, ``workspace`` (where the agent ran; None when a default one was removed, the
    rollout having failed before its agent wrote anything), ``result`` (the result document, or
    None), ``error_code`` and ``error_message`` (None when ok)."""

    line: int
    name: str | None
    mode: str | None
    status: str
    agent: str | None = None
    to_agent: str | None = None
    after_step: int | None = None
    derived_run: str | None = None
    ended_by: str | None = None
    live_steps: int = 0
    workspace: str | None = None
    result: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == RowStatus.OK.value

    def as_dict(self) -> dict[str, Any]:
        """The row as ``--rows`` writes it: the fields above, the error as ``{code, message}``
        (or None)."""
        row = dataclasses.asdict(self)
        code, message = row.pop("error_code"), row.pop("error_message")
        row["error"] = {"code": code, "message": message} if code is not None else None
        return row


def failed_row(
    line: RolloutLine | None, index: int, exc: BaseException, code: str | None = None
) -> RolloutRow:
    """The failed row of line ``index`` (``line``: its RolloutLine, None for a line that is none)
    for ``exc``; ``code`` when the error has none of its own."""
    return RolloutRow(
        line=index,
        name=line.name if line is not None else None,
        mode=line.mode.value if line is not None else None,
        status=RowStatus.FAILED.value,
        agent=line.agent if line is not None else None,
        to_agent=line.to_agent if line is not None else None,
        after_step=line.after_step if line is not None else None,
        workspace=str(line.workspace) if line is not None and line.workspace is not None else None,
        error_code=code or error_code(exc),
        error_message=said(exc),
    )


def said(exc: BaseException) -> str:
    """A row's ``error.message`` for ``exc``: its message (each of several problems' own, joined
    by ``; ``), with the flags it names said as the line's keys (:func:`~pvisor.replay.
    rollout_manifest.in_line_keys`): a manifest line has no command line."""
    parts = exc.problems if isinstance(exc, ReplayProblems) else [exc]
    return "; ".join(in_line_keys(error_detail(p)) for p in parts)  # type: ignore[arg-type]


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: the largest key_file read (bytes): NAME=VALUE lines, not a data file (a device such as
#: /dev/zero, or a huge file, was read without bound)
MAX_KEY_FILE_BYTES = 1 << 20


def read_key_file(path: Path) -> dict[str, str]:
    """The ``NAME=VALUE`` lines of ``path`` (blank lines and ``#`` comments skipped; a value
    taken as it is, one pair of surrounding quotes removed). UsageError with the code
    ``bad_key_file`` naming the file and the line number, never a value, for a file that cannot be
    read, is not a regular file (a FIFO, a device: opened without blocking, never read), is
    larger than :data:`MAX_KEY_FILE_BYTES`, is not UTF-8, or holds a line that is not such a pair
    or holds a NUL byte (``/proc/self/environ``: NUL-separated)."""
    shown = show_path(path)
    try:
        # O_NONBLOCK: opening a FIFO no process writes would block for ever (the timeout is later)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _key_file_error(f"key_file {shown}: {exc.strerror or exc}") from None
    with open(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _key_file_error(f"key_file {shown}: not a regular file")
            data = f.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise _key_file_error(f"key_file {shown}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise _key_file_error(f"key_file {shown}: larger than {MAX_KEY_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _key_file_error(f"key_file {shown}: not UTF-8") from None
    env: dict[str, str] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "\0" in line:  # no environment variable holds one: the agent could not be started
            raise _key_file_error(f"key_file {shown} line {i}: holds a NUL byte (not shown)")
        name, eq, value = line.removeprefix("export ").partition("=")
        if not eq or not _NAME.fullmatch(name.strip()):
            raise _key_file_error(f"key_file {shown} line {i}: expected NAME=VALUE (not shown)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name.strip()] = value
    return env


def _key_file_error(message: str) -> UsageError:
    exc = UsageError(message)
    exc.code = RolloutError.BAD_KEY_FILE.value  # type: ignore[attr-defined]
    return exc


def _replay_options(
    line: RolloutLine, journal: Path, output: Path, workspace: Path, env: dict[str, str]
) -> Any:
    """The :class:`~pvisor.session.replay.ReplayOptions` of ``line`` and the problems its
    options have (:meth:`~pvisor.replay.spec.ReplaySpec.check`): each value read through its
    option of :data:`~pvisor.replay.spec.OPTIONS` (a default where the line gives none)."""
    from pvisor.session.handover import handoff_options
    from pvisor.session.replay import ReplayOptions

    values: dict[str, Any] = {name: v for name, v in line.options.items() if name in BY_NAME}
    values.update(
        agent=line.agent,
        run=line.run,
        trajectory=line.trajectory,
        after_step=line.after_step,
        upstream=line.upstream,
        max_steps=line.max_steps,
        timeout=line.timeout,
        output=output,
        workspace=workspace,
        journal=journal,
        agent_env=env,
        agent_args=[],
    )
    mode = line.mode.replay_mode
    if line.options.get("replay_only"):  # a handoff that ends the next agent at request N+1
        mode = ReplayMode.REPLAY_ONLY
    spec = ReplaySpec(values, [k for k, v in values.items() if v is not None], mode)
    problems = spec.check()
    # the fields the line gives (a default where its value is None); ReplayOptions' own otherwise
    kw = spec.fields(
        f.name for f in dataclasses.fields(ReplayOptions) if f.name in values and f.name in BY_NAME
    )
    # a key_file's variables reach the agent alone: never the recorded start environment
    kw.update(agent_env=env, private_env=frozenset(env), agent_args=[])
    if line.mode is not RolloutMode.HANDOFF:
        return ReplayOptions(**kw, child_option="child_run="), problems
    assert line.to_agent is not None and line.agent is not None
    for name in ("agent", "journal", "run", "trajectory", "after_step", "workspace", "output"):
        kw.pop(name)
    kw.update(
        restore_start=not kw.pop("no_restore", False),
        strict_workspace=bool(line.options.get("strict_workspace")),
        reset_to_pause=bool(line.options.get("reset_to_pause")),
        replay_only=bool(line.options.get("replay_only")),
    )
    opts = handoff_options(
        to_agent=line.to_agent,
        journal=journal,
        run=line.run,
        trajectory=line.trajectory,
        agent=line.agent,
        after_step=line.after_step,
        workspace=workspace,
        output=output,
        source_reasoning=line.options.get("source_reasoning", "drop"),
        reasoning_option="source_reasoning",
        child_option="child_run=",
        **kw,
    )
    return opts, problems


def _with_agent(line: RolloutLine, journal: Path) -> RolloutLine:
    """``line`` with its source's agent: the journal run's, or the one an interchange file
    names. UsageError when none is known."""
    if line.agent is not None:
        return line
    from pvisor.session.api import agent_of
    from pvisor.session.handover import agent_the_file_says

    if line.run is not None:
        agent = agent_of(journal, line.run, "agent in the line")
    else:
        assert line.trajectory is not None
        agent = agent_the_file_says(line.trajectory)
        if agent is None:
            raise UsageError("a trajectory line needs agent (which agent wrote it?)")
    return dataclasses.replace(line, agent=agent)


def run_rollout(
    line: RolloutLine, *, journal: Path, output: Path, workspace: Path | None = None
) -> RolloutRow:
    """Run ``line`` (module docstring): its source read from ``journal`` (a ``run`` line; the
    line's own ``journal`` is the caller's to resolve) and its derived run written there, its
    files (result.json, prefix.json, prefix.request.json) into ``output``, the agent in
    ``workspace`` (else the line's, else a new directory, into which the recorded start
    snapshot is restored as a replay restores it into an empty workspace). Returns its row;
    never raises for the rollout's failure (KeyboardInterrupt and the like pass). Call it from
    a process's main thread (the agent's stop signals are handled there)."""
    journal, output = Path(journal).absolute(), Path(output).absolute()
    if line.mode is RolloutMode.PREPARE_ONLY:
        return _prepare(line, journal, output)
    ws = workspace or line.workspace
    row = _run_rollout(line, journal, output, ws)
    if ws is None and not row.ok and row.workspace is not None and _empty(Path(row.workspace)):
        # the default workspace of a rollout that failed before its agent wrote anything: not
        # left behind in the temporary directory, one per failed line
        os.rmdir(row.workspace)
        row.workspace = None
    return row


def _unused(row: RolloutRow) -> bool:
    """Whether ``row``'s workspace is an empty directory its failed rollout's agent never used
    (a worker that died may have left its agent running in it: kept)."""
    if row.ok or row.workspace is None or row.error_code == RolloutError.WORKER_DIED.value:
        return False
    return _empty(Path(row.workspace))


def _empty(directory: Path) -> bool:
    try:
        return not any(os.scandir(directory))
    except OSError:
        return False


def _run_rollout(line: RolloutLine, journal: Path, output: Path, ws: Path | None) -> RolloutRow:
    try:
        line = _with_agent(line, journal)
        env = read_key_file(line.key_file) if line.key_file is not None else {}
        if ws is None:
            ws = Path(tempfile.mkdtemp(prefix=f"pvisor-rollout-{line.name}-"))
        ws = Path(ws).absolute()
        line = dataclasses.replace(line, workspace=ws)
        opts, problems = _replay_options(line, journal, output, ws, env)
        del env  # the agent's environment only
        from pvisor.session.replay import continue_replay, hand_over, replay_only

        run = {RolloutMode.REPLAY_ONLY: replay_only, RolloutMode.CONTINUATION: continue_replay}.get(
            line.mode, hand_over
        )
        outcome = run(opts, lambda _m: None, problems)
    except PvisorError as exc:
        return failed_row(line, line.index, exc)
    except Exception as exc:  # noqa: BLE001 - a bug must not take the other rollouts with it
        return failed_row(line, line.index, exc, RolloutError.INTERNAL.value)
    return _row(line, outcome.result, outcome.error)


def _row(line: RolloutLine, doc: dict[str, Any], error: PvisorError | None) -> RolloutRow:
    """The row of ``line``'s outcome: its result document ``doc`` and ``error``."""
    live = doc.get("continuation") or {}
    return RolloutRow(
        line=line.index,
        name=line.name,
        mode=line.mode.value,
        status=doc.get("status") or RowStatus.FAILED.value,
        agent=line.agent,
        to_agent=line.to_agent,
        after_step=line.after_step,
        derived_run=doc.get("derived_run"),
        ended_by=live.get("ended_by") or (doc.get("agent_run") or {}).get("ended_by"),
        live_steps=int(live.get("live_steps") or 0),
        workspace=str(line.workspace) if line.workspace is not None else None,
        result=doc,
        error_code=error_code(error) if error is not None else None,
        error_message=said(error) if error is not None else None,
    )


def _prepare(line: RolloutLine, journal: Path, output: Path) -> RolloutRow:
    """A prepare-only line, in this process, as the prepare-only batch prepares it."""
    from pvisor.replay.batch import Status, prepare_many
    from pvisor.replay.prepare import PrepareOptions

    o = line.options
    assert line.agent is not None
    opts = PrepareOptions(
        agent=line.agent,
        after_step=line.after_step,
        output=output,
        trajectory=line.trajectory,
        run=line.run,
        journal=journal if line.run is not None else None,
        workspace=line.workspace,
        protocol=o.get("protocol"),
        profile_from=o.get("profile_from"),
        session=o.get("session"),
        allow_damaged=bool(o.get("allow_damaged")),
        episode=o.get("episode"),
    )
    opts.force = bool(o.get("force"))
    outcome = next(iter(prepare_many([(line.index, opts)])))
    if outcome.result is None:
        assert outcome.error is not None
        return failed_row(line, line.index, outcome.error)
    doc, error = outcome.result, outcome.error
    row = _row(line, doc, error)
    row.status = RowStatus.OK.value if outcome.status is Status.OK else RowStatus.FAILED.value
    return row


#: prctl option: the signal this process gets when its parent ends (Linux)
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGTERM to this worker when ``parent`` (the batch) ends, even by SIGKILL (Linux
    ``prctl(PR_SET_PDEATHSIG)``; best effort elsewhere): a rollout stops its agent on it, as on
    the batch's own SIGTERM. Ends this process at once when ``parent`` is gone already."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it ended before the prctl: nobody waits for this rollout
        os._exit(0)


def _child(args: tuple[RolloutLine, Path, Path, int], conn: Any) -> None:
    """A worker process's body: one rollout, its row sent back on ``conn`` (never an exception:
    a pickled error may not unpickle). Quiet when stopped: a Ctrl-C (KeyboardInterrupt) ends it
    without a row or a traceback, and so does a batch gone before the row is sent."""
    line, journal, output, parent = args
    try:
        die_with_parent(parent)
        # started with SIGINT blocked (_Worker.start), so that a Ctrl-C during its start-up
        # printed no traceback; from here on a Ctrl-C is a KeyboardInterrupt, caught below
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        try:
            row = run_rollout(line, journal=journal, output=output)
        except Exception as exc:  # noqa: BLE001 - a bug must not take the other rollouts with it
            row = failed_row(line, line.index, exc, RolloutError.INTERNAL.value)
        conn.send(row)
        conn.close()
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        pass  # the batch was interrupted or is gone: it reads no row, and says how far it got


def derived_run_in(journal: Path, workspace: Path, since_ms: int) -> str | None:
    """The run a rollout made in ``journal``: the newest created since ``since_ms`` (Unix epoch
    milliseconds) whose agent ran in ``workspace`` (its ``workspace`` label); None when there is
    none or the journal cannot be read (a worker that died may have made none)."""
    from pvisor.journal.reader import JournalReader

    names = {str(workspace), os.path.realpath(workspace)}
    try:
        with JournalReader(journal) as r:
            found = [
                run.id
                for run in r.runs()
                if run.created_ms >= since_ms and run.labels.get("workspace") in names
            ]
    except (PvisorError, OSError, sqlite3.Error):
        return None
    return found[-1] if found else None


class _Worker:
    """One rollout's process (``spawn``: a fresh interpreter, no inherited event loop, signal
    handlers or threads) and the pipe its row comes back on."""

    def __init__(self, line: RolloutLine, job: tuple[RolloutLine, Path, Path]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.line = line
        self.journal = job[1]
        self.started_ms = int(time.time() * 1000)
        self.conn, self._child_end = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_child, args=((*job, os.getpid()), self._child_end), name=f"pvisor-rollout-{line.index}"
        )

    def start(self) -> None:
        """Start the worker with SIGINT blocked (the mask outlives the exec) until its own
        handler is in place (:func:`_child`): a Ctrl-C to the terminal's process group reaches
        the worker too, and in its start-up (imports) printed a KeyboardInterrupt traceback. Ours
        comes once the worker started (blocked meanwhile, never lost)."""
        can = hasattr(signal, "pthread_sigmask")  # POSIX
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if can else None
        try:
            self.process.start()
        finally:
            self._child_end.close()  # ours closed: the pipe reads EOF once the worker's end is gone
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def row(self) -> RolloutRow:
        """The row the worker sent, or a ``worker_died`` row when it ended without one (its
        workspace, and the run it made in the journal when it made one)."""
        try:
            row: RolloutRow = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            code = self.process.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            exc = PvisorError(f"the process running the rollout ended before it returned a row ({how})")
            row = failed_row(self.line, self.line.index, exc, RolloutError.WORKER_DIED.value)
            if self.line.workspace is not None:
                row.derived_run = derived_run_in(self.journal, self.line.workspace, self.started_ms)
        self.conn.close()
        self.process.join(30)
        return row

    def interrupt(self) -> None:
        """The batch stopped (Ctrl-C, SIGTERM, SIGHUP): the worker stops its agent as a single
        replay does on SIGTERM (before the agent starts, the worker just ends)."""
        if self.process.is_alive() and self.process.pid is not None:
            try:
                os.kill(self.process.pid, signal.SIGTERM)
            except OSError:
                pass

    def stop(self) -> None:
        """After :meth:`interrupt`: the worker killed when it has not ended 30 seconds later."""
        if self.process.pid is None:  # interrupted before it started
            self.conn.close()
            return
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


#: the most rollouts a batch runs at once (each a process, a gateway and an agent)
MAX_CONCURRENCY = 64


def check_concurrency(concurrency: int) -> None:
    """UsageError (exit 2) for a ``concurrency`` outside 1..:data:`MAX_CONCURRENCY` (before:
    ``--concurrency 1000000000`` was accepted). At most as many run as there are agent lines."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency {concurrency}: expected 1 to {MAX_CONCURRENCY} rollouts at once")


def run_rollouts(
    lines: Iterable[RolloutLine], *, journal: Path, output_root: Path, concurrency: int
) -> Iterator[RolloutRow]:
    """Run ``lines`` on this machine, at most ``concurrency`` agent rollouts at once, each in a
    process of its own (module docstring), and yield their rows in line order. Each writes into
    ``output_root/<name>``; a line's own ``journal`` is used for it, else ``journal``. A rollout
    whose process dies (killed, out of memory) fails its row alone (``worker_died``); the
    others go on. UsageError for a ``concurrency`` outside 1..:data:`MAX_CONCURRENCY`
    (:func:`check_concurrency`). Stopping the iteration (Ctrl-C) stops the
    rollouts running (SIGTERM, as a single replay stops on it) and starts no more; a worker
    whose caller's process (or the thread that iterates) ends, even by SIGKILL, gets SIGTERM
    and stops its agent too (Linux)."""
    check_concurrency(concurrency)
    todo = list(lines)
    root = Path(output_root).absolute()

    def job(ln: RolloutLine) -> tuple[RolloutLine, Path, Path]:
        return ln, Path(ln.journal or journal).absolute(), root / ln.name

    waiting = [ln for ln in todo if ln.mode is not RolloutMode.PREPARE_ONLY]
    running: dict[int, _Worker] = {}
    done: dict[int, RolloutRow] = {}

    made: set[int] = set()  # the lines whose workspace is a new directory made here

    def fill() -> None:
        while waiting and len(running) < concurrency:
            nxt = waiting.pop(0)
            if nxt.workspace is None:
                # made here, not in the worker: a worker that dies still has its workspace named
                try:
                    ws = tempfile.mkdtemp(prefix=f"pvisor-rollout-{nxt.name}-")
                except OSError as exc:
                    why = f"cannot create a workspace in {tempfile.gettempdir()}: {exc.strerror or exc}"
                    done[nxt.index] = failed_row(nxt, nxt.index, OutputError(why))
                    continue
                nxt = dataclasses.replace(nxt, workspace=Path(ws))
                made.add(nxt.index)
            running[nxt.index] = worker = _Worker(nxt, job(nxt))
            worker.start()  # known before it starts: a Ctrl-C in start() stops it too

    try:
        for ln in todo:
            fill()  # the agents start first: a prepare-only line in this process meanwhile
            if ln.mode is RolloutMode.PREPARE_ONLY:
                yield run_rollout(ln, journal=job(ln)[1], output=job(ln)[2])
                continue
            while ln.index not in done:
                fill()
                if ln.index in done:
                    break
                ready = wait([w.conn for w in running.values()])
                for w in [w for w in running.values() if w.conn in ready]:
                    done[w.line.index] = w.row()
                    del running[w.line.index]
            row = done.pop(ln.index)
            if _unused(row) and ln.index in made:
                # a rollout that failed before its agent wrote anything: no empty directory left behind
                os.rmdir(row.workspace)
                row.workspace = None
            yield row
    finally:
        for w in running.values():
            w.interrupt()
        for w in running.values():
            w.stop()


__all__ = [
    "RolloutError",
    "RolloutRow",
    "RowStatus",
    "MAX_CONCURRENCY",
    "MAX_KEY_FILE_BYTES",
    "check_concurrency",
    "derived_run_in",
    "die_with_parent",
    "failed_row",
    "read_key_file",
    "run_rollout",
    "run_rollouts",
    "said",
]
