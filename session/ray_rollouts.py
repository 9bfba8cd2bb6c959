"""Rollouts on a Ray cluster: :func:`rollouts_on_ray` runs each
:class:`~pvisor.replay.rollout_manifest.RolloutLine` (replay-only, continuation, handoff) as one
Ray task and yields its :class:`~pvisor.session.rollouts.RolloutRow` as the task ends, with the
derived runs merged into the caller's journal (docs/result-protocol.md "Rollouts on Ray").

What travels, and how (a cluster shares no filesystem, and Ray keeps a task's arguments in its
control store, which its dashboard shows):

- driver -> worker, through Ray's object store: the source run with what it needs (attempts,
  exchanges, snapshots, the blobs they name) as the bytes of a small journal made by
  :func:`~pvisor.journal.merge.merge_journals`, or a native trajectory file's bytes; and the line
  itself with those paths taken out (:class:`TaskSpec`; its other paths, ``workspace``,
  ``key_file``, ``entrypoint``, are the worker's). Never the driver's journal or source file by
  path, never a key nor any of the driver's environment: no ``runtime_env``. The worker's agent
  reads its key from the worker's own environment or the line's ``key_file``.
- on the worker: a private temporary root of its own
  (``pvisor-ray-<line>-<token>-<host>-<pid>-*`` under the worker's temporary directory,
  :data:`ROOT_PREFIX`; ``token`` the driver's name for the task, ``host`` a digest of the
  worker's host name, ``pid`` the worker's), holding the journal, the source file, a new workspace (the
  run's start snapshot restored into it by the replay, unless the line names a workspace: a path
  on the worker) and the output directory; removed when the task ends, also when it is
  cancelled. The root of a worker that was killed (it could not remove it) is removed by the
  next task on that node (:func:`remove_dead_roots`: a root whose pid is gone).
- worker -> driver: the row, the output's small files (``result.json``, ``prefix.json``,
  ``prefix.request.json``) and the derived runs as the bytes of a journal without the blobs the
  source journal sent held (``omit_blobs``: the driver's journal holds them); the driver writes
  the files into ``output_root/<name>/``, then merges those runs into its journal (their
  lineage, ``parent_run``, names the source run), keeping them in a file when it cannot
  (:func:`_keep`). A result document names the worker's paths (its
  journal, workspace, output), which are gone by then.

Tasks run with ``num_cpus=1`` and ``max_retries=0``: a rollout that failed is never run again
behind the caller's back (a rerun repeats the agent's side effects and makes a second derived
run); retrying is a new line. Each Ray failure is that line's failed row, and the batch goes on:
:class:`RayFailure` gives the codes.

Stopping (Ctrl-C, or the caller closing the iteration): each task still out is cancelled as a
Ctrl-C stops a replay (``ray.cancel(force=False)``: a KeyboardInterrupt on the worker, which the
replay takes as SIGINT: its agent stopped, its derived run ended ``interrupted``), and the
driver waits up to :data:`STOP_GRACE_S` seconds for them: their derived runs are merged as any
other's. A task that has not ended by then is killed (``force=True``): its runs are not brought
back, and its row says where its private root is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import time
import warnings
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvisor.core.errors import PvisorError, UnavailableError, UsageError
from pvisor.journal.merge import merge_journals
from pvisor.journal.reader import JournalReader
from pvisor.replay.errors import error_detail
from pvisor.replay.rollout_manifest import RolloutLine, RolloutMode
from pvisor.session.rollouts import RolloutError, RolloutRow, RowStatus, failed_row, run_rollout

#: what each task asks of Ray: one CPU, and never a retry (module docstring). No ``runtime_env``:
#: it is stored where the dashboard shows it, and a key must not be there.
TASK_OPTIONS: dict[str, Any] = {"num_cpus": 1, "max_retries": 0, "retry_exceptions": False}

#: the output files a worker sends back (each small: the prefix is one request body)
OUTPUT_FILES = ("result.json", "prefix.json", "prefix.request.json")

#: the name of a worker's private root starts with this, then the line number and ``-``
ROOT_PREFIX = "pvisor-ray-"

#: the variable that tells Ray Client to send the cluster's token (Ray's token authentication)
AUTH_MODE_ENV = "RAY_AUTH_MODE"

#: seconds an address is given to take a TCP connection before Ray is asked to join it
PROBE_S = 10.0

#: the longest message of a Ray failure kept in a row, in characters
MESSAGE_CHARS = 300

#: seconds the driver waits, once stopped, for its cancelled tasks to end their rollouts and
#: send their runs back, before it kills them
STOP_GRACE_S = 30.0

#: how the row of a task killed once the batch was stopped begins (its runs not brought back)
KILLED = "killed after the batch was stopped: its runs were not brought back"

#: a worker's private root: ROOT_PREFIX, the line, the task's token, the worker's pid, mkdtemp's
_ROOT_NAME = re.compile(re.escape(ROOT_PREFIX) + r"\d+-[0-9a-f]+-([0-9a-f]{8})-(\d+)-")


class RayFailure(str, enum.Enum):
    """The error codes of a row Ray failed (the rollout's own failures keep the replay's codes)."""

    #: the worker process (or its node) died mid-rollout: killed, out of memory (the code a local
    #: rollout's dead process has too)
    WORKER_DIED = RolloutError.WORKER_DIED.value
    #: the task raised (a bug in pvisor on the worker, or a worker that cannot import it)
    TASK_FAILED = "ray_task_failed"
    #: an object the task needed or made was lost (its owner or node gone)
    OBJECT_LOST = "object_lost"
    #: the task was cancelled
    CANCELLED = "ray_task_cancelled"
    #: the cluster cannot be reached any more, or Ray failed otherwise
    RAY_UNAVAILABLE = "ray_unavailable"
    #: the source could not be sent, or the derived runs not merged back (the driver's side)
    TRANSFER_FAILED = "transfer_failed"


@dataclass(frozen=True)
class TaskSpec:
    """A task's one argument beside its object refs: ``line`` with the driver's paths taken out
    (``journal`` and ``trajectory`` None: their bytes travel as refs), ``source_runs`` (the runs
    the journal bytes hold: every other run the worker's journal ends with is derived),
    ``trajectory_name`` (the native file's name, whose suffix adapters read; None without one),
    ``token``."""

    line: RolloutLine
    source_runs: tuple[str, ...]
    trajectory_name: str | None
    #: the driver's name for the task, in its worker's private root's name (:func:`root_glob`)
    token: str = ""


@dataclass(frozen=True)
class TaskResult:
    """What a task returns: the ``row`` as the worker's run made it, the output's ``files``
    (name -> bytes, of :data:`OUTPUT_FILES` those written), ``journal`` (the derived runs as
    a journal's bytes without the source journal's blobs, None when there are none),
    ``derived`` (their ids), ``worker_journal`` (where the worker's journal was: a path on the
    worker, removed since)."""

    row: RolloutRow
    files: dict[str, bytes]
    journal: bytes | None
    derived: tuple[str, ...]
    worker_journal: str


def source_of(line: RolloutLine, journal: Path, workdir: Path) -> tuple[TaskSpec, bytes | None, bytes | None]:
    """The driver's half of a task: (spec, journal bytes, trajectory bytes). A journal run is
    extracted with :func:`merge_journals` from the line's journal (else ``journal``) into a new
    file under ``workdir`` and read back; a native file is read as it is. UsageError (code
    ``usage``, as a local rollout's) for a missing journal or a run it does not hold; PvisorError
    when the run cannot be extracted (a locked or damaged journal) or the file read."""
    blob: bytes | None = None
    native: bytes | None = None
    runs: tuple[str, ...] = ()
    if line.run is not None:
        source = line.journal if line.journal is not None else journal
        if not source.exists():
            raise UsageError(f"journal {source}: no such journal file")
        with JournalReader(source) as r:  # an unknown run: the error a local rollout gives
            line = dataclasses.replace(line, run=r.run(line.run).id)  # a prefix: the whole id
        tmp = Path(tempfile.mkdtemp(prefix="source-", dir=workdir)) / "journal.sqlite"
        report = merge_journals([source], tmp, runs={line.run})
        runs = tuple(report.runs) or (line.run,)
        blob = tmp.read_bytes()
        shutil.rmtree(tmp.parent, ignore_errors=True)
    if line.trajectory is not None:
        try:
            native = line.trajectory.read_bytes()
        except OSError as exc:
            raise UsageError(f"trajectory {line.trajectory}: cannot read it: {exc.strerror or exc}") from None
    spec = TaskSpec(
        dataclasses.replace(line, journal=None, trajectory=None),
        runs,
        line.trajectory.name if line.trajectory is not None else None,
        secrets.token_hex(4),
    )
    return spec, blob, native


def run_task(spec: TaskSpec, journal: bytes | None, trajectory: bytes | None) -> TaskResult:
    """The worker's half (the Ray task's function; Ray hands it the refs' bytes): the rollout in
    a private temporary root of its own, removed when it returns (module docstring). Cancelled
    (``ray.cancel(force=False)``: a KeyboardInterrupt here), the rollout stops as a replay stops
    on Ctrl-C, and its row and derived runs are still returned."""
    line = spec.line
    remove_dead_roots(Path(tempfile.gettempdir()))
    name = f"{ROOT_PREFIX}{line.index}-{spec.token or 'x'}-{_host()}-{os.getpid()}-"
    root = Path(tempfile.mkdtemp(prefix=name))
    try:
        wj = root / "journal.sqlite"
        out = root / "output"
        held: frozenset[str] = frozenset()  # blobs the source journal sent held
        try:
            if journal is not None:
                _write_private(wj, journal)
                held = _blobs_of(wj)  # the driver's journal has them: not sent back
            row = _run_in(root, spec, trajectory)
        except KeyboardInterrupt:  # cancelled before (or after) the replay handled its stop signals
            exc = PvisorError(
                "interrupted: the batch was stopped (ray.cancel) before its agent ran to an end"
            )
            row = failed_row(line, line.index, exc, "interrupted")
            if line.workspace is None:
                row.workspace = None
        # from here on a second cancel must not lose what the rollout recorded: each step is
        # repeated when one interrupts it (a merge is one transaction; the files are read again)
        return _uninterrupted(lambda: _send_back(spec, row, wj, out, root, held))
    finally:
        _uninterrupted(lambda: shutil.rmtree(root, ignore_errors=True))


def _run_in(root: Path, spec: TaskSpec, trajectory: bytes | None) -> RolloutRow:
    """The rollout of ``spec`` in the private ``root`` (its journal, written there already; the
    source file, the workspace, the output)."""
    line = spec.line
    wj = root / "journal.sqlite"
    changes: dict[str, Any] = {"journal": wj if line.run is not None else None}
    if trajectory is not None:
        (root / "source").mkdir()
        changes["trajectory"] = root / "source" / (spec.trajectory_name or "trajectory")
        _write_private(changes["trajectory"], trajectory)
    workspace = line.workspace
    if workspace is None:  # a new one: the replay restores the run's start snapshot into it
        workspace = root / "workspace"
        workspace.mkdir()
    row = run_rollout(
        dataclasses.replace(line, **changes), journal=wj, output=root / "output", workspace=workspace
    )
    if line.workspace is None:  # removed with the root: a path that no longer means anything
        row = dataclasses.replace(row, workspace=None)
    return row


def _send_back(
    spec: TaskSpec, row: RolloutRow, wj: Path, out: Path, root: Path, held: frozenset[str]
) -> TaskResult:
    """The task's result: ``row``, the output's files, the runs ``wj`` holds beside the source's,
    without the blobs ``held`` (the source journal's: the driver's journal has them)."""
    files = {n: (out / n).read_bytes() for n in OUTPUT_FILES if (out / n).is_file()}
    derived: tuple[str, ...] = ()
    blob = None
    try:
        if wj.exists():
            with JournalReader(wj) as r:
                derived = tuple(run.id for run in r.runs() if run.id not in spec.source_runs)
        if derived:
            back = root / "derived.sqlite"
            back.unlink(missing_ok=True)
            merge_journals([wj], back, runs=set(derived), omit_blobs=held)
            blob = back.read_bytes()
    except PvisorError as exc:  # the row stays, saying its runs could not be sent back
        row = _failed(spec.line, _code(exc), f"its runs cannot be sent back: {error_detail(exc)}", row)
        derived, blob = (), None
    if row.derived_run is None and len(derived) == 1:  # interrupted before its result was written
        row = dataclasses.replace(row, derived_run=derived[0])
    return TaskResult(row, files, blob, derived, str(wj))


def _uninterrupted(step: Any, tries: int = 3) -> Any:
    """``step()``, again when a KeyboardInterrupt (a cancel) interrupts it, at most ``tries`` times."""
    for _ in range(tries - 1):
        try:
            return step()
        except KeyboardInterrupt:
            continue
    return step()


def remove_dead_roots(tmp: Path) -> list[Path]:
    """Remove the private roots under ``tmp`` whose worker (the pid in the name, on this host)
    is gone: a worker killed mid-rollout could not remove its own. Returns those removed. Best
    effort: a root that cannot be listed or removed stays."""
    removed = []
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        m = _ROOT_NAME.match(entry.name)
        # another host's (a temporary directory shared by containers): its pids are not ours
        if m is None or m.group(1) != _host() or _alive(int(m.group(2))):
            continue
        try:
            if (
                entry.is_dir(follow_symlinks=False)
                and entry.stat(follow_symlinks=False).st_uid == os.getuid()
            ):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _host() -> str:
    """This host's tag in a root's name: 8 hex digits of its name's SHA-256."""
    import hashlib

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def root_glob(spec: TaskSpec) -> str:
    """The name of ``spec``'s private root on its worker, as a glob (the pid and mkdtemp's part)."""
    return f"{ROOT_PREFIX}{spec.line.index}-{spec.token or 'x'}-*"


def _blobs_of(journal: Path) -> frozenset[str]:
    """The sha256 of every blob ``journal`` holds (the source journal as it was sent)."""
    with JournalReader(journal) as r:
        return frozenset(sha for (sha,) in r.conn.execute("SELECT sha256 FROM blobs"))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def connect(address: str, named: str | None = None) -> bool:
    """Ray initialised for ``address`` (``local`` starts one here with the machine's CPUs,
    ``auto`` or ``ray://HOST:10001`` joins one), its logs kept off stderr; True when this call
    started it (the caller shuts it down), False when Ray was already initialised (used as it
    is). ``named``: how the messages name the address (default ``--ray ADDRESS``; the Python API
    says ``ray='ADDRESS'``). UsageError without Ray installed or for an empty address,
    UnavailableError when it cannot connect. The caller's handlers of the stop signals (SIGINT,
    SIGTERM, SIGHUP) are put back after Ray's start, which sets its own (SIGTERM ended the
    driver with Ray's C++ stack dump)."""
    named = named or f"--ray {address}"
    if not address.strip():
        raise UsageError(f"{named or repr(address)}: give an address (local, auto or ray://HOST:10001)")
    try:
        import ray  # an optional extra (pvisor-replay[ray]), not installed by default
    except ImportError:
        raise UsageError(
            "--ray needs Ray: pip install '.[ray]' in a clone of pvisor (docs/install.md)"
        ) from None
    logging.getLogger("ray").setLevel(logging.WARNING)
    if ray.is_initialized():
        return False
    unreachable = _unreachable(address)
    if unreachable is not None:
        raise UnavailableError(f"{named}: cannot connect to Ray: {unreachable}")
    handlers = _stop_handlers()
    try:
        with warnings.catch_warnings():  # Ray Client warns of a timeout before it raises it
            warnings.simplefilter("ignore")
            ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        hint = ""
        if address.startswith("ray://") and AUTH_MODE_ENV not in os.environ:
            # Ray Client sends the cluster's token only when told to (Ray's own rule)
            hint = f" (a cluster with token authentication: set {AUTH_MODE_ENV}=token, and its token, here)"
        raise UnavailableError(f"{named}: cannot connect to Ray: {in_our_words(exc, named)}{hint}") from None
    except SystemExit as exc:  # Ray's own SIGTERM handler, while it starts: stopped as by ours
        if exc.code != signal.SIGTERM:
            raise
        with contextlib.suppress(Exception):
            ray.shutdown()
        stop = KeyboardInterrupt(signal.SIGTERM)
        stop.signum = signal.SIGTERM  # type: ignore[attr-defined]
        raise stop from None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    for name in ("ray", "ray.data"):  # after init, which sets its own levels
        logging.getLogger(name).setLevel(logging.ERROR)
    return True


#: how Ray's advice names its own command's flag and variable (pvisor has no --address)
_ADDRESS_FLAG = re.compile(r"setting `?--address`? flag(?: or `?RAY_ADDRESS`? environment variable)?")


def in_our_words(exc: BaseException, named: str = "--ray") -> str:
    """What Ray said when it could not connect, in one line, its advice to set "``--address``
    flag or ``RAY_ADDRESS``" (its own command's) said as ``--ray ADDRESS`` (``ray=ADDRESS`` when
    ``named`` is the Python API's ``ray=...``)."""
    flag = "--ray ADDRESS" if named.startswith("--") else "ray=ADDRESS"
    return _ADDRESS_FLAG.sub(f"giving {flag} (or setting RAY_ADDRESS)", _one_line(exc))


def _stop_handlers() -> dict[int, Any]:
    """The Python handlers of the stop signals now (none outside the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    found = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    return {sig: h for sig, h in found.items() if h is not None}


def _unreachable(address: str) -> str | None:
    """Why ``HOST:PORT`` (a head's GCS) or ``ray://HOST:PORT`` (its client server) takes no TCP
    connection within :data:`PROBE_S`, else None (``local``, ``auto``: Ray's own lookup, which
    fails at once). Ray itself retries an address that does not answer for minutes, printing
    lines of its own."""
    target = address.removeprefix("ray://")
    host, colon, port = target.rpartition(":")
    if not colon or not port.isdigit() or not host:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
    except OSError as exc:
        return f"{target} takes no connection: {exc.strerror or exc}"
    return None


def rollouts_on_ray(
    address: str,
    lines: Sequence[RolloutLine],
    *,
    journal: Path,
    output_root: Path | None,
    stopped: list[RolloutRow] | None = None,
    named: str | None = None,
) -> Iterator[RolloutRow]:
    """Each of ``lines`` as one Ray task on the cluster at ``address`` (:func:`connect`); its
    row yielded when it ends, in the order they end (each names its line). Derived runs are
    merged as they come into the line's own ``journal``, else ``journal`` (created when
    missing): where a local rollout writes them. ``journal`` is also where a ``run`` line
    without a journal of its own is read from. At most :func:`window_of` tasks are submitted at
    a time, each line's source extracted and put when its turn comes. With ``output_root`` each
    line's output files go into ``output_root/<name>/``. A line that fails, on the worker or in
    Ray, is a failed row (:class:`RayFailure` for Ray's part); nothing is retried. Ray is
    started (or joined) only once a line's source is ready to be sent: a batch whose lines all
    fail here, or are prepare-only, never starts one. Raises only before the first row:
    UsageError (no Ray), UnavailableError (no cluster).

    Stopped (a KeyboardInterrupt while it runs, or the iteration closed), the tasks still out
    are cancelled and waited for (module docstring: at most :data:`STOP_GRACE_S` s); their rows
    (``interrupted``, their derived runs merged; or ``ray_task_cancelled`` for one killed,
    naming its private root) are appended to ``stopped`` when given. ``named``: as
    :func:`connect`'s."""
    import ray  # connect() raised UsageError without it

    state: dict[str, Any] = {"started": None}
    workdir = Path(tempfile.mkdtemp(prefix="pvisor-ray-driver."))
    pending: dict[Any, tuple[RolloutLine, TaskSpec]] = {}
    held: list[RolloutLine | RolloutRow] = []  # what comes before Ray is joined: yielded after

    def flush() -> Iterator[RolloutRow]:
        return _held_rows(held, journal, output_root or workdir)

    try:
        sent: dict[tuple[str, str], Any] = {}  # one ref per source run, for many lines
        firsts: dict[tuple[str, str], TaskSpec] = {}
        # the lines of each source still to be submitted: its ref is dropped after the last
        uses = Counter(
            _source_key(line, journal) for line in lines if line.mode is not RolloutMode.PREPARE_ONLY
        )
        waiting = deque(lines)
        window = 2  # until Ray is joined: then window_of(ray)
        while waiting or pending:
            while waiting and len(pending) < window:  # a source is put only when its line's turn comes
                line = waiting.popleft()
                if line.mode is RolloutMode.PREPARE_ONLY:
                    held.append(line)
                    if state["started"] is not None:
                        yield from flush()
                    continue
                key = _source_key(line, journal)
                uses[key] -= 1
                try:
                    spec, key, blob, native = _source(line, journal, workdir, firsts)
                except UsageError as exc:  # the line's own: the row a local rollout has for it
                    held.append(failed_row(line, line.index, exc))
                    continue
                except PvisorError as exc:
                    held.append(_failed(line, _code(exc), error_detail(exc)))
                    continue
                if state["started"] is None:  # the first line that runs: Ray joined (or its error raised)
                    state["started"] = connect(address, named)
                    state["task"] = ray.remote(**TASK_OPTIONS)(run_task)
                    window = window_of(ray)
                try:
                    ref = _submit(ray, state["task"], spec, key, (blob, native), sent, uses[key] <= 0)
                    pending[ref] = (line, spec)
                except Exception as exc:  # noqa: BLE001 - Ray's own failure to take an object: this line's
                    held.append(_failed(line, RayFailure.RAY_UNAVAILABLE.value, _one_line(exc)))
                del blob, native  # the object store has them
                yield from flush()  # Ray is joined: the rows held back go out
            # Ray joined, or no line left that would need it: the rows held back go out
            yield from flush()
            if not pending:
                continue
            try:
                done, _ = ray.wait(list(pending), num_returns=1)  # at most `window` refs
            except Exception as exc:  # noqa: BLE001 - the cluster is gone: every line still out fails
                yield from _cluster_gone(exc, pending, waiting, held)
                yield from flush()  # the prepare-only lines still waiting: here, as ever
                return
            for ref in done:
                line, _spec = pending.pop(ref)
                yield collect_row(ray, ref, line, journal, output_root, workdir)
    finally:
        if pending:  # stopped: nothing of the caller's runs on, and what they recorded is kept
            rows = _stop(ray, pending, journal, output_root, workdir)
            if stopped is not None:
                stopped.extend(rows)
        shutil.rmtree(workdir, ignore_errors=True)
        if state["started"]:
            ray.shutdown()
            if address == "local":  # this machine's workers: what a killed one left
                remove_dead_roots(Path(tempfile.gettempdir()))


def _held_rows(held: list, journal: Path, out: Path) -> Iterator[RolloutRow]:
    """The rows ``held`` back until Ray was joined (or found not needed), emptied as they go: a
    failed row as it is, a prepare-only line run here (as the local batch runs it) into
    ``out/<name>``."""
    while held:
        item = held.pop(0)
        if isinstance(item, RolloutRow):
            yield item
        else:
            yield run_rollout(item, journal=item.journal or journal, output=out / item.name)


def _submit(
    ray: Any, task: Any, spec: TaskSpec, key: Any, data: tuple[Any, Any], sent: dict, last: bool
) -> Any:
    """The task of ``spec`` submitted with its source's refs: a journal run's bytes (``data``:
    (journal bytes or None, trajectory bytes or None)) put once for all the lines of ``key``
    (``sent``: its ref; a later line's bytes are None), dropped by the driver after its ``last``
    line (the tasks hold it then); a native file's bytes put for its line alone."""
    blob, native = data
    try:
        if key is not None and blob is not None:
            sent[key] = ray.put(blob)
        jref = sent[key] if key is not None else (ray.put(blob) if blob is not None else None)
        nref = ray.put(native) if native is not None else None
        return task.remote(spec, jref, nref)
    finally:
        if key is not None and last:
            sent.pop(key, None)


def _cluster_gone(
    exc: BaseException, pending: dict[Any, tuple[RolloutLine, TaskSpec]], waiting: Any, held: list
) -> Iterator[RolloutRow]:
    """A failed row for every line still out or waiting to run on a cluster that is gone; the
    prepare-only lines waiting go to ``held`` (they run here)."""
    gone = [ln for ln, _spec in pending.values()]
    gone += [ln for ln in waiting if ln.mode is not RolloutMode.PREPARE_ONLY]
    held.extend(ln for ln in waiting if ln.mode is RolloutMode.PREPARE_ONLY)
    waiting.clear()
    pending.clear()
    for line in gone:
        yield _failed(line, RayFailure.RAY_UNAVAILABLE.value, _one_line(exc))


def _stop(
    ray: Any,
    pending: dict[Any, tuple[RolloutLine, TaskSpec]],
    journal: Path,
    output_root: Path | None,
    workdir: Path,
) -> list[RolloutRow]:
    """The tasks of ``pending`` cancelled as a Ctrl-C stops a replay, waited for up to
    :data:`STOP_GRACE_S` s (a second KeyboardInterrupt ends the wait), their rows collected
    (their runs merged); the rest killed, each a ``ray_task_cancelled`` row naming its root."""
    rows: list[RolloutRow] = []
    try:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=False, recursive=False)
        deadline = time.monotonic() + STOP_GRACE_S
        while pending and deadline > time.monotonic():
            done, _ = ray.wait(list(pending), num_returns=1, timeout=deadline - time.monotonic())
            for ref in done:
                line, _spec = pending.pop(ref)
                rows.append(collect_row(ray, ref, line, journal, output_root, workdir))
    except KeyboardInterrupt:  # stopped again: no more waiting
        pass
    except Exception:  # noqa: BLE001 - the cluster is gone: what is still out is lost
        pass
    for ref, (line, spec) in list(pending.items()):
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True, recursive=False)
        rows.append(
            _failed(
                line,
                RayFailure.CANCELLED.value,
                f"{KILLED} (its worker's private root {root_glob(spec)} in the worker's temporary directory "
                "is removed by the next rollout on that node)",
            )
        )
    pending.clear()
    return rows


def _source(
    line: RolloutLine, journal: Path, workdir: Path, firsts: dict[tuple[str, str], TaskSpec]
) -> tuple[TaskSpec, tuple[str, str] | None, bytes | None, bytes | None]:
    """(spec, key, journal bytes, trajectory bytes) of ``line`` (:func:`source_of`); ``key``
    names a journal run, whose bytes are extracted once for all its lines (``firsts``: the first
    spec of each key; a later line's bytes are None, its ref the first's)."""
    key = _source_key(line, journal)
    if key is not None and key in firsts:
        first = firsts[key]
        spec = TaskSpec(
            dataclasses.replace(line, journal=None, trajectory=None, run=first.line.run),
            first.source_runs,
            None,
            secrets.token_hex(4),
        )
        return spec, key, None, None
    spec, blob, native = source_of(line, journal, workdir)
    if key is not None:
        firsts[key] = spec
    return spec, key, blob, native


#: tasks submitted at a time, per CPU of the cluster (:func:`window_of`)
WINDOW_PER_CPU = 2


def window_of(ray: Any) -> int:
    """How many tasks :func:`rollouts_on_ray` keeps submitted at once: :data:`WINDOW_PER_CPU` per
    CPU the cluster has when the batch starts (at least 2), so that a CPU freed finds the next
    task waiting while the sources of the lines after it are not yet extracted and put."""
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
    except Exception:  # noqa: BLE001 - Ray could not say: the least window
        cpus = 1
    return max(2, WINDOW_PER_CPU * cpus)


def _source_key(line: RolloutLine, journal: Path) -> tuple[str, str] | None:
    """The source a journal run's lines share (its journal, its run); None for a native file."""
    return (
        (str(line.journal or journal), line.run) if line.run is not None and line.trajectory is None else None
    )


def collect_row(
    ray: Any, ref: Any, line: RolloutLine, journal: Path, output_root: Path | None, workdir: Path
) -> RolloutRow:
    """The row of a finished task: its files written into ``output_root/<name>/`` first, then its
    derived runs merged into the line's journal, else ``journal``. A merge that fails keeps
    them in a file beside that journal (:func:`_keep`) that its row's message names, with the
    command that finishes it; a derived run whose parent that journal does not hold (deleted
    meanwhile) is a row warning, ``parent_not_in_journal``."""
    try:
        got: TaskResult = ray.get(ref)
    except ray.exceptions.RayError as exc:
        failure, message = ray_failure(exc)
        return _failed(line, failure.value, message)
    row = got.row
    out = output_root / (line.name or f"line-{line.index}") if output_root is not None else None
    try:  # before the merge, whatever it does: the rollout's files are its own
        if out is not None and got.files:
            out.mkdir(parents=True, exist_ok=True, mode=0o700)
            for name, data in got.files.items():
                (out / name).write_bytes(data)
    except OSError as exc:
        row = _failed(line, "output_error", f"cannot write {line.name}'s files: {exc.strerror or exc}", row)
    if got.journal is None:
        return row
    into = (
        line.journal or journal
    )  # where a local rollout writes it: the line's own journal, else the batch's
    tmp = workdir / f"derived-{line.index}.sqlite"
    try:
        _write_private(tmp, got.journal)
        report = merge_journals([tmp], into, runs=set(got.derived))
    except (PvisorError, OSError) as exc:
        detail = (
            error_detail(exc) if isinstance(exc, PvisorError) else f"cannot write it: {exc.strerror or exc}"
        )
        code = _code(exc) if isinstance(exc, PvisorError) else RayFailure.TRANSFER_FAILED.value
        return _failed(line, code, f"{detail}; {_keep(got.journal, line, into)}", row)
    finally:
        tmp.unlink(missing_ok=True)
    missing = {report.missing_parents[r] for r in got.derived if r in report.missing_parents}
    if missing and isinstance(row.result, dict):
        said = {
            "code": "parent_not_in_journal",
            "message": f"journal {into} does not hold run {', '.join(sorted(missing))}, the parent of the "
            "derived run merged into it (removed or replaced while the batch ran?)",
        }
        row = dataclasses.replace(
            row, result={**row.result, "warnings": [*row.result.get("warnings", []), said]}
        )
    return row


#: the name of the file that keeps a line's derived runs its journal did not take (:func:`_keep`)
KEPT_NAME = "derived.sqlite"


def _keep(data: bytes, line: RolloutLine, into: Path) -> str:
    """Keep the derived runs' journal bytes a merge did not take, beside ``into`` as
    ``<into>.line-<N>.derived.sqlite`` (not in the output directory: with ``--rows`` that is a
    temporary one, removed); a name taken gets a suffix of its own. What the row's message
    says: where, and the command that finishes the merge (the file leaves out the source run's
    blobs, which ``into`` holds)."""
    where = into.with_name(f"{into.name}.line-{line.index}.{KEPT_NAME}")
    try:
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            _write_private(where, data)
        except FileExistsError:
            fd, name = tempfile.mkstemp(prefix=where.stem + "-", suffix=".sqlite", dir=where.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            where = Path(name)
    except OSError as exc:
        return f"its derived runs are lost: they cannot be kept in {where}: {exc.strerror or exc}"
    return f"its derived runs are kept in {where}: pvisor journal merge {where} --into {into}"


def _code(exc: PvisorError) -> str:
    """The row's code of an error on the driver's side: the error's own result code (a journal
    locked, ``journal_unavailable``), else :attr:`RayFailure.TRANSFER_FAILED`."""
    return exc.code if isinstance(getattr(exc, "code", None), str) else RayFailure.TRANSFER_FAILED.value  # type: ignore[attr-defined]


def ray_failure(exc: BaseException) -> tuple[RayFailure, str]:
    """The row's code of an exception Ray raised (``ray.exceptions``) and what Ray said, in one
    line of at most :data:`MESSAGE_CHARS`: a task's own exception (``ZeroDivisionError: ...``,
    not Ray's traceback), else Ray's message's first line."""
    import ray.exceptions as e

    names = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "LocalRayletDiedError")
    if isinstance(exc, tuple(getattr(e, n) for n in names if hasattr(e, n))):
        failure = RayFailure.WORKER_DIED
    elif isinstance(exc, e.TaskCancelledError):
        failure = RayFailure.CANCELLED
    elif isinstance(exc, e.ObjectLostError):
        failure = RayFailure.OBJECT_LOST
    elif isinstance(exc, e.RayTaskError):
        failure = RayFailure.TASK_FAILED
    else:
        failure = RayFailure.RAY_UNAVAILABLE
    cause = getattr(exc, "cause", None) if isinstance(exc, e.RayTaskError) else None
    return failure, _one_line(cause if isinstance(cause, BaseException) else exc, with_type=True)


def _one_line(exc: BaseException, *, with_type: bool = False) -> str:
    lines = [s.strip() for s in str(exc).splitlines() if s.strip()]
    text = lines[0] if lines else ""
    text = f"{type(exc).__name__}: {text}" if with_type or not text else text
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _failed(line: RolloutLine, code: str, message: str, row: RolloutRow | None = None) -> RolloutRow:
    """A failed row of ``line`` (``row``: what the worker's run said, kept but for the error)."""
    if row is not None:
        return dataclasses.replace(row, status=RowStatus.FAILED.value, error_code=code, error_message=message)
    return RolloutRow(
        line=line.index,
        name=line.name,
        mode=line.mode.value,
        status=RowStatus.FAILED.value,
        agent=line.agent,
        to_agent=line.to_agent,
        after_step=line.after_step,
        derived_run=None,
        ended_by=None,
        live_steps=0,
        workspace=None,
        result=None,
        error_code=code,
        error_message=message,
    )


__all__ = [
    "KILLED",
    "OUTPUT_FILES",
    "ROOT_PREFIX",
    "TASK_OPTIONS",
    "RayFailure",
    "TaskResult",
    "TaskSpec",
    "STOP_GRACE_S",
    "collect_row",
    "connect",
    "in_our_words",
    "ray_failure",
    "remove_dead_roots",
    "root_glob",
    "rollouts_on_ray",
    "run_task",
    "source_of",
]
