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
- on the worker: a private temporary root of its own (``pvisor-ray-<line>-*`` under the
  worker's temporary directory, :data:`ROOT_PREFIX`), holding the journal, the source file, a
  new workspace (the run's start snapshot restored into it by the replay, unless the line names
  a workspace: a path on the worker) and the output directory; removed when the task ends.
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import os
import shutil
import socket
import tempfile
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
from pvisor.session.rollouts import RolloutError, RolloutRow, RowStatus, run_rollout

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
    ``trajectory_name`` (the native file's name, whose suffix adapters read; None without one)."""

    line: RolloutLine
    source_runs: tuple[str, ...]
    trajectory_name: str | None


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
    file under ``workdir`` and read back; a native file is read as it is. PvisorError when the
    run cannot be extracted (unknown run, a locked or damaged journal) or the file read."""
    blob: bytes | None = None
    native: bytes | None = None
    runs: tuple[str, ...] = ()
    if line.run is not None:
        source = line.journal if line.journal is not None else journal
        if not source.exists():
            raise UsageError(f"journal {source}: no such journal file")
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
    )
    return spec, blob, native


def run_task(spec: TaskSpec, journal: bytes | None, trajectory: bytes | None) -> TaskResult:
    """The worker's half (the Ray task's function; Ray hands it the refs' bytes): the rollout in
    a private temporary root of its own, removed when it returns (module docstring)."""
    line = spec.line
    root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{line.index}-"))
    try:
        wj = root / "journal.sqlite"
        if journal is not None:
            _write_private(wj, journal)
        changes: dict[str, Any] = {"journal": wj if line.run is not None else None}
        held = _blobs_of(wj) if journal is not None else frozenset()  # the driver's journal has them
        if trajectory is not None:
            (root / "source").mkdir()
            changes["trajectory"] = root / "source" / (spec.trajectory_name or "trajectory")
            _write_private(changes["trajectory"], trajectory)
        workspace = line.workspace
        if workspace is None:  # a new one: the replay restores the run's start snapshot into it
            workspace = root / "workspace"
            workspace.mkdir()
        out = root / "output"
        row = run_rollout(dataclasses.replace(line, **changes), journal=wj, output=out, workspace=workspace)
        if line.workspace is None:  # removed with the root: a path that no longer means anything
            row = dataclasses.replace(row, workspace=None)
        files = {n: (out / n).read_bytes() for n in OUTPUT_FILES if (out / n).is_file()}
        derived: tuple[str, ...] = ()
        blob = None
        try:
            if wj.exists():
                with JournalReader(wj) as r:
                    derived = tuple(run.id for run in r.runs() if run.id not in spec.source_runs)
            if derived:
                back = root / "derived.sqlite"
                merge_journals([wj], back, runs=set(derived), omit_blobs=held)
                blob = back.read_bytes()
        except PvisorError as exc:  # the row stays, saying its runs could not be sent back
            row = _failed(line, _code(exc), f"its runs cannot be sent back: {error_detail(exc)}", row)
            derived, blob = (), None
        return TaskResult(row, files, blob, derived, str(wj))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _blobs_of(journal: Path) -> frozenset[str]:
    """The sha256 of every blob ``journal`` holds (the source journal as it was sent)."""
    with JournalReader(journal) as r:
        return frozenset(sha for (sha,) in r.conn.execute("SELECT sha256 FROM blobs"))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def connect(address: str) -> bool:
    """Ray initialised for ``address`` (``local`` starts one here with the machine's CPUs,
    ``auto`` or ``ray://HOST:10001`` joins one), its logs kept off stderr; True when this call
    started it (the caller shuts it down), False when Ray was already initialised (used as it
    is). UsageError without Ray installed, UnavailableError when it cannot connect."""
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
        raise UnavailableError(f"--ray {address}: cannot connect to Ray: {unreachable}")
    try:
        with warnings.catch_warnings():  # Ray Client warns of a timeout before it raises it
            warnings.simplefilter("ignore")
            ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        hint = ""
        if address.startswith("ray://") and AUTH_MODE_ENV not in os.environ:
            # Ray Client sends the cluster's token only when told to (Ray's own rule)
            hint = f" (a cluster with token authentication: set {AUTH_MODE_ENV}=token, and its token, here)"
        raise UnavailableError(f"--ray {address}: cannot connect to Ray: {_one_line(exc)}{hint}") from None
    for name in ("ray", "ray.data"):  # after init, which sets its own levels
        logging.getLogger(name).setLevel(logging.ERROR)
    return True


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
    address: str, lines: Sequence[RolloutLine], *, journal: Path, output_root: Path | None
) -> Iterator[RolloutRow]:
    """Each of ``lines`` as one Ray task on the cluster at ``address`` (:func:`connect`); its
    row yielded when it ends, in the order they end (each names its line). Derived runs are
    merged as they come into the line's own ``journal``, else ``journal`` (created when
    missing): where a local rollout writes them. ``journal`` is also where a ``run`` line
    without a journal of its own is read from. At most :func:`window_of` tasks are submitted at
    a time, each line's source extracted and put when its turn comes. With ``output_root`` each
    line's output files go into ``output_root/<name>/``. A line that fails, on the worker or in
    Ray, is a failed row (:class:`RayFailure` for Ray's part); nothing is retried. Raises only
    before the first task: UsageError (no Ray), UnavailableError (no cluster)."""
    import ray  # connect() raised UsageError without it

    started = connect(address)
    task = ray.remote(**TASK_OPTIONS)(run_task)
    workdir = Path(tempfile.mkdtemp(prefix="pvisor-ray-driver."))
    pending: dict[Any, RolloutLine] = {}
    try:
        sent: dict[
            tuple[str, str] | None, tuple[TaskSpec, Any]
        ] = {}  # one ref per source run, for many lines
        uses = Counter(
            _source_key(line, journal) for line in lines if line.mode is not RolloutMode.PREPARE_ONLY
        )
        waiting = deque(lines)
        window = window_of(ray)
        while waiting or pending:
            while waiting and len(pending) < window:  # a source is put only when its line's turn comes
                line = waiting.popleft()
                if line.mode is RolloutMode.PREPARE_ONLY:  # nothing runs: here, as the local batch does
                    out = (output_root or workdir) / line.name
                    yield run_rollout(line, journal=line.journal or journal, output=out)
                    continue
                try:
                    ref = _submit(task, line, journal, workdir, sent, uses)
                except PvisorError as exc:
                    yield _failed(line, _code(exc), error_detail(exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - Ray's own failure to take an object: this line's
                    yield _failed(line, RayFailure.RAY_UNAVAILABLE.value, _one_line(exc))
                    continue
                pending[ref] = line
            if not pending:
                continue
            try:
                done, _ = ray.wait(list(pending), num_returns=1)  # at most `window` refs
            except Exception as exc:  # noqa: BLE001 - the cluster is gone: every line still out fails
                for line in [*pending.values(), *waiting]:
                    yield _failed(line, RayFailure.RAY_UNAVAILABLE.value, _one_line(exc))
                return
            for ref in done:
                line = pending.pop(ref)
                yield _collect(ray, ref, line, journal, output_root, workdir)
    finally:
        for ref in pending:  # the caller stopped early: nothing of theirs runs on
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        shutil.rmtree(workdir, ignore_errors=True)
        if started:
            ray.shutdown()


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


def _submit(task: Any, line: RolloutLine, journal: Path, workdir: Path, sent: dict, uses: Counter) -> Any:
    """The task of ``line`` submitted; a journal run's bytes are put once for all its lines, and
    the driver's ref to them dropped once the last of them (``uses`` counts them) is submitted
    (the tasks waiting hold them meanwhile)."""
    import ray

    key = _source_key(line, journal)
    uses[key] -= 1
    if key is not None and key in sent:
        first, ref = sent.pop(key) if uses[key] <= 0 else sent[key]
        spec = TaskSpec(dataclasses.replace(line, journal=None, trajectory=None), first.source_runs, None)
        return task.remote(spec, ref, None)
    spec, blob, native = source_of(line, journal, workdir)
    jref = ray.put(blob) if blob is not None else None
    del blob  # the object store has it
    if key is not None and uses[key] > 0:
        sent[key] = (spec, jref)
    return task.remote(spec, jref, ray.put(native) if native is not None else None)


def _collect(
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
    "OUTPUT_FILES",
    "ROOT_PREFIX",
    "TASK_OPTIONS",
    "RayFailure",
    "TaskResult",
    "TaskSpec",
    "connect",
    "ray_failure",
    "rollouts_on_ray",
    "run_task",
    "source_of",
]
