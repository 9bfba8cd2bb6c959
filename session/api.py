"""The Python API of continuation, for pipelines: :func:`continue_run` and :func:`continue_many`.

Import them from ``pvisor.session`` (``from pvisor.session import continue_run``; the old path
``pvisor.replay`` warns). They do what ``pvisor replay`` without a mode flag does (docs/replay.md
"Continuation"; the result document is docs/result-protocol.md), and return a :class:`Result` for
every replay that wrote a result document, whatever its status, so that a pipeline sampling many
rollouts reads each outcome instead of catching exceptions. Errors before any result exists (a usage
error, an output directory that is refused) raise :class:`~pvisor.core.errors.PvisorError` from
:func:`continue_run`; :func:`continue_many` returns them as a :class:`Result` with
``document`` None.

Several continuations run in processes of their own (one gateway, one agent and one process
tree each): pvisor ends every process its agent leaves behind by walking its own descendants,
which two agents in one process would mistake for each other's.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from pvisor.core.errors import PvisorError, UsageError
from pvisor.journal.paths import default_journal_path
from pvisor.journal.reader import JournalReader
from pvisor.replay.spec import API_NAMES, OPTIONS, ReplayMode, ReplaySpec
from pvisor.session.replay import ReplayOptions, continue_replay

#: a source: a journal run id (str) or a native trajectory file (a path object)
Source = Union[str, "os.PathLike[str]"]


@dataclass
class Result:
    """What one continuation did.

    Fields: ``document`` (the result document, ``result.json``; None when the replay failed
    before it could write one), ``output`` (the directory holding prefix.json,
    prefix.request.json and result.json), ``error`` (the error, one line per problem when several
    were found at once, or None), ``exit_code`` (what ``pvisor replay`` would have exited with:
    0 for status ``ok``; for several problems, the first's in the order usage, source,
    environment)."""

    document: dict[str, Any] | None
    output: Path
    error: str | None = None
    exit_code: int = 0

    @property
    def status(self) -> str:
        """``ok``, ``diverged`` or ``failed`` (``failed`` without a document)."""
        return self.document["status"] if self.document is not None else "failed"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def derived_run(self) -> str | None:
        """The derived run's id in the journal (None when the agent never started)."""
        return self.document.get("derived_run") if self.document is not None else None

    @property
    def live_steps(self) -> int:
        """Live main-loop requests the upstream answered with success."""
        live = (self.document or {}).get("continuation") or {}
        return int(live.get("live_steps") or 0)

    @property
    def ended_by(self) -> str | None:
        """Why the live part ended (``continuation.ended_by``), or None."""
        live = (self.document or {}).get("continuation") or {}
        return live.get("ended_by")

    @property
    def prefix(self) -> Path | None:
        """``prefix.json`` (request N+1 as the agent sent it), or None."""
        p = self.output / "prefix.json"
        return p if self.document is not None and self.document.get("prefix") else None


def _options(given: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The :class:`~pvisor.session.replay.ReplayOptions` of :func:`continue_run`'s keywords
    ``given`` (:data:`~pvisor.replay.spec.API_NAMES`: each read through its option of
    :data:`~pvisor.replay.spec.OPTIONS`), and the problems :meth:`ReplaySpec.check` finds."""
    source, journal, output = given["source"], given["journal"], given["output"]
    journal_path = Path(journal) if journal is not None else default_journal_path()
    run, trajectory = source_of(source, "a journal run id (str) or a native trajectory file (pathlib.Path)")
    agent = given["agent"]
    if agent is None:
        if run is None:
            raise UsageError("agent= is needed with a native trajectory (which agent wrote it?)")
        agent = agent_of(journal_path, run)
    out = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="pvisor-continue-"))
    values = {o.name: given[o.api] for o in OPTIONS if o.api in given and o.api != "source"}
    values.update(
        agent=agent,
        output=out,
        workspace=Path(given["workspace"]),
        journal=journal_path,
        trajectory=trajectory,
        run=run,
        agent_env=dict(given["environment"] or {}),
        agent_args=list(given["arguments"] or []),
    )
    spec = ReplaySpec(values, given, ReplayMode.CONTINUE)
    fields = [f.name for f in dataclasses.fields(ReplayOptions) if f.name in values]
    return ReplayOptions(**spec.fields(fields), child_option="child_run="), spec.check()


def source_of(source: Any, expected: str) -> tuple[str | None, Path | None]:
    """(run, trajectory) of a Python caller's ``source``: a journal run id (a ``str``) or a native
    file (a path object). UsageError (exit 2) saying ``expected`` for anything else."""
    if isinstance(source, str):
        return source, None
    if isinstance(source, os.PathLike):
        return None, Path(source)
    raise UsageError(f"source {source!r}: give {expected}")


def agent_of(journal: Path, run: str, option: str = "agent=") -> str:
    """The agent a journal run was captured with (its row: nothing else is read). UsageError
    (exit 2) for a missing journal, an unknown run, or a run that names none (``option``: how to
    give one, ``agent=`` or ``--agent NAME``)."""
    if not journal.exists():
        raise UsageError(f"journal {journal}: no such journal file")
    with JournalReader(journal) as r:
        found = r.run(run)
    if not found.agent:
        raise UsageError(f"run {found.id} names no agent: give {option}")
    return found.agent


def continue_run(
    source: Source,
    after_step: int,
    workspace: os.PathLike[str] | str,
    upstream: str | None = None,
    *,
    agent: str | None = None,
    output: os.PathLike[str] | str | None = None,
    journal: os.PathLike[str] | str | None = None,
    max_steps: int | None = None,
    boundary_user_prompt: str | None = None,
    reasoning: str = "keep",
    live_model: str | None = None,
    model: str | None = None,
    entrypoint: str | None = None,
    task: str | None = None,
    timeout: float = 900.0,
    environment: Mapping[str, str] | None = None,
    arguments: Sequence[str] | None = None,
    force: bool = False,
    allow_unsupported: bool = False,
    allow_damaged: bool = False,
    session: str | None = None,
    child_run: str | None = None,
    refuse_outside: bool = False,
    allow_unrecorded: bool = False,
    sandbox: str | None = None,
    sandbox_network: str = "gateway",
    sandbox_allow: Sequence[os.PathLike[str] | str] | None = None,
    sandbox_memory: str | int | None = None,
    sandbox_cpus: str | float | None = None,
    no_restore: bool = False,
    env_from: str = "recorded",
    warn: Callable[[str], None] | None = None,
) -> Result:
    """Continue ``source`` after step ``after_step`` in ``workspace`` with the live model at
    ``upstream`` (None: the agent's public API, its key from the environment), as ``pvisor
    replay`` without a mode flag does. ``agent`` defaults to the journal run's; ``output`` to a
    new temporary directory; ``journal`` to the default journal (the derived run goes there).
    ``environment`` and ``arguments`` are added to the agent's environment and command line;
    ``allow_damaged`` plays a native file the reader had to repair back anyway; ``child_run``
    files the derived run under the pending child run of a handoff
    (``TrajectoryReplay.restore_handoff``; as ``--child-run``); ``refuse_outside`` and
    ``allow_unrecorded`` are ``--refuse-outside`` and ``--allow-unrecorded``; ``sandbox`` (``auto``,
    ``bwrap``, ``none``; None: ``PVISOR_SANDBOX``, else ``auto``), ``sandbox_network`` and
    ``sandbox_allow`` as ``--sandbox``, ``--sandbox-network`` and ``--sandbox-allow``;
    ``sandbox_memory`` (``"2G"``, or bytes) and ``sandbox_cpus`` (``1.5``) as ``--sandbox-memory``
    and ``--sandbox-cpus``; ``no_restore`` and ``env_from`` (``recorded``, ``none``) as
    ``--no-restore`` and ``--env-from``; ``warn``
    gets each warning line (default: ignored; they are in the document too), the plan's lines among them.

    Returns a :class:`Result` whenever a result document was written (also for status
    ``failed`` or ``diverged``). Raises PvisorError (with ``exit_code``) when none could be:
    bad options, an output directory that is refused. Call it from the main thread (the agent's
    stop signals are handled there)."""
    # the keywords are the replay options' API names (pvisor.replay.spec.API_NAMES), warn aside
    given = {name: value for name, value in locals().items() if name in API_NAMES and name != "warn"}
    opts, problems = _options(given)
    outcome = continue_replay(opts, warn or (lambda _m: None), problems)
    if outcome.error is not None:
        return Result(outcome.result, opts.output, outcome.error.message, outcome.error.exit_code)
    return Result(outcome.result, outcome.output)


#: a worker's state: its caller's pid, the caller's stop event, whether a rollout runs
_worker: dict[str, Any] = {}


def _start_worker(caller: int, stop: Any) -> None:
    """A worker's start (started with SIGINT blocked, :func:`_run_all`): SIGTERM to it when
    ``caller`` ends, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``): its rollout then stops its
    agent as a replay does on SIGTERM (before: a caller ended by SIGTERM left its workers and
    their agents running). A Ctrl-C is taken only while a rollout runs (a KeyboardInterrupt
    there, before and after its replay handles it), ignored otherwise (it printed a worker's
    traceback). ``stop``: set by the caller once interrupted: a rollout not begun never runs."""
    import signal

    from pvisor.session.rollouts import die_with_parent

    _worker.update(caller=caller, stop=stop, running=False)
    die_with_parent(caller)
    signal.signal(signal.SIGINT, _on_sigint)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _on_sigint(_signum: int, _frame: Any) -> None:
    if _worker.get("running"):
        raise KeyboardInterrupt


def _one(kwargs: dict[str, Any]) -> Result:
    """One continuation in a worker process: never raises (a pickled error may not unpickle).
    Ends the worker quietly when its caller is gone (nobody reads the result)."""
    out = Path(kwargs.get("output") or ".")
    stop = _worker.get("stop")
    if stop is not None and stop.is_set():
        return Result(None, out, "interrupted: the caller was stopped before this rollout began", 130)
    _worker["running"] = True
    try:
        result = continue_run(**kwargs)
    except PvisorError as exc:
        result = Result(None, out, exc.message, exc.exit_code)
    except KeyboardInterrupt:
        result = Result(None, out, "interrupted by SIGINT before the rollout ended", 130)
    except Exception as exc:  # noqa: BLE001 - a bug must not take the other rollouts with it
        result = Result(None, out, f"{type(exc).__name__}: {exc}", 70)
    finally:
        _worker["running"] = False
    if _worker.get("caller") is not None and os.getppid() != _worker["caller"]:
        os._exit(0)  # sending the result would fail with a traceback
    return result


def continue_many(
    source: Source,
    after_step: int,
    k: int,
    workspace_factory: Callable[[int], os.PathLike[str] | str] | None,
    upstream: str | None = None,
    *,
    concurrency: int | None = None,
    output_root: os.PathLike[str] | str | None = None,
    ray: str | None = None,
    **options: Any,
) -> list[Result]:
    """``k`` continuations of ``source`` from the same boundary (after step ``after_step``):
    sampling several rollouts after step N. ``workspace_factory(i)`` gives rollout ``i``'s
    workspace (a new directory each, in the state the recorded run started from); rollout ``i``
    writes into ``output_root/rollout-<i>`` (default: a new temporary directory). At most
    ``concurrency`` (default 2) run at once, each in a process of its own with a gateway of its own; each
    gets its own derived run in the journal and its own result. ``options`` are those of
    :func:`continue_run`. Returns the k results in rollout order; a rollout that could not
    start is a :class:`Result` with ``document`` None and its ``error``. The workers are
    started with ``spawn``, which imports the calling script again: call this under
    ``if __name__ == "__main__":``.

    ``ray``: a Ray address (``local`` starts one here with the machine's CPUs; ``auto`` or
    ``ray://HOST:10001`` joins a cluster; the extra ``pvisor-replay[ray]``): each rollout is a
    Ray task of :mod:`pvisor.session.ray_rollouts` (one CPU each, never retried: how many
    run at once is the cluster's, and ``concurrency=`` is refused, as ``--concurrency`` with
    ``--ray``; an empty address is refused too: UsageError), the source sent through Ray's
    object store and each derived run merged back into ``journal``. The factory cannot run on a
    worker: it runs here, and its value is a path *on the worker* (on a local Ray, this
    machine); with ``workspace_factory=None`` each rollout gets a new workspace in its
    worker's private temporary root, the run's start snapshot restored into it, removed when
    the rollout ends. No key travels in a task:
    ``environment=`` and ``arguments=`` are refused (UsageError); the agents read their keys
    from the workers' environment, or from ``key_file=`` (a file of ``NAME=VALUE`` lines on
    the workers). A rollout Ray failed (its worker killed, ...) is a Result with ``document``
    None, its ``error`` saying what Ray said, ``exit_code`` 69."""
    if k < 1:
        raise UsageError(f"k={k}: continue_many runs at least one rollout")
    if ray is not None:
        if not isinstance(ray, str) or not ray.strip():
            raise UsageError(f"ray={ray!r}: give an address (local, auto or ray://HOST:10001)")
        if concurrency is not None:
            raise UsageError(
                "concurrency= is for rollouts here: with ray= each rollout takes one CPU of the cluster"
            )
    concurrency = 2 if concurrency is None else concurrency
    if concurrency < 1:
        raise UsageError(f"concurrency={concurrency}: at least 1")
    if options.get("child_run") is not None:
        raise UsageError(
            "child_run= names one run: continue_many makes k of them; continue a handoff's child run with "
            "continue_run(..., child_run=ID)"
        )
    root = Path(output_root) if output_root is not None else Path(tempfile.mkdtemp(prefix="pvisor-rollouts-"))
    if ray is not None:
        return _on_ray(ray, source, after_step, k, workspace_factory, upstream, root, options)
    if workspace_factory is None:
        raise UsageError(
            "workspace_factory=None is for ray=: give a function of i that makes rollout i's workspace"
        )
    jobs = []
    for i in range(k):
        kw = dict(options)
        kw.update(
            source=source,
            after_step=after_step,
            workspace=workspace_factory(i),
            upstream=upstream,
            output=root / f"rollout-{i}",
        )
        kw.pop("warn", None)  # a callable of the caller's process cannot run in a worker
        jobs.append(kw)
    return list(_run_all(jobs, concurrency))


def _run_all(jobs: list[dict[str, Any]], concurrency: int) -> Iterator[Result]:
    """The results of ``jobs`` (:func:`continue_run`'s keywords), each in a worker process.
    Stopped (Ctrl-C in the caller), the rollouts running get SIGTERM (their agents stopped as a
    replay stops them) and those not begun never run (before: a rollout already queued ran to
    its end, up to its timeout, while the caller waited)."""
    import signal

    # spawn: a fresh interpreter per worker (no inherited event loop, signal handlers or
    # threads); one rollout per worker process, so no agent's leftovers meet the next one
    extra: dict[str, Any] = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    with ProcessPoolExecutor(
        max_workers=min(concurrency, len(jobs)),
        mp_context=ctx,
        initializer=_start_worker,
        initargs=(os.getpid(), stop),
        **extra,
    ) as pool:
        # SIGINT blocked while the jobs are submitted: the workers started now, and the pool's
        # thread (which starts the later ones) inherit the mask; each unblocks it once its
        # handler is set (a Ctrl-C in a worker's start-up printed a traceback)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            results = pool.map(_one, jobs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            yield from results
        except BaseException:
            stop.set()
            # the pool's own processes (the standard library keeps them in _processes)
            for process in list(getattr(pool, "_processes", {}).values()):
                if process.is_alive():
                    process.terminate()
            raise


#: continue_many's keywords that are a rollout line's own fields (the rest go to its options)
_LINE_FIELDS = ("agent", "journal", "max_steps", "timeout", "key_file", "warn")


def _on_ray(
    address: str,
    source: Source,
    after_step: int,
    k: int,
    workspace_factory: Callable[[int], os.PathLike[str] | str] | None,
    upstream: str | None,
    root: Path,
    options: dict[str, Any],
) -> list[Result]:
    """:func:`continue_many` with ``ray=`` (its docstring): the k rollouts as rollout lines run
    by :func:`~pvisor.session.ray_rollouts.rollouts_on_ray`, their results in rollout order."""
    from pvisor.replay.rollout_manifest import RolloutLine, RolloutMode, refused_value
    from pvisor.replay.spec import OPTIONS
    from pvisor.session.ray_rollouts import rollouts_on_ray

    for name in ("environment", "arguments"):
        if options.get(name):
            raise UsageError(
                f"{name}= with ray=: a task's arguments reach Ray's control store and dashboard; set the "
                "agents' variables in the workers' environment, or give key_file= (a file on the workers)"
            )
    by_api = {o.api: o.name for o in OPTIONS if o.api is not None}
    unknown = sorted(n for n in options if n not in by_api and n not in _LINE_FIELDS)
    if unknown:
        raise UsageError(f"continue_many: unknown keyword {unknown[0]}=")
    run, trajectory = source_of(source, "a journal run id (str) or a native trajectory file (pathlib.Path)")
    made = workspace_factory
    workspaces = [Path(made(i)).absolute() if made is not None else None for i in range(k)]
    # what a task carries reaches Ray's control store: checked as a manifest line is, before anything is sent
    why = refused_value({"source": source, "upstream": upstream, **options, "workspace_factory": workspaces})
    if why is not None:
        raise UsageError(f"continue_many with ray=: {why}")
    journal = Path(options["journal"]) if options.get("journal") is not None else default_journal_path()
    given = {
        by_api[n]: v
        for n, v in options.items()
        if n in by_api and n not in _LINE_FIELDS and n not in ("environment", "arguments") and v is not None
    }
    key_file = options.get("key_file")
    lines = [
        RolloutLine(
            index=i + 1,
            name=f"rollout-{i}",
            mode=RolloutMode.CONTINUATION,
            agent=options.get("agent"),
            to_agent=None,
            run=run,
            trajectory=trajectory.absolute() if trajectory is not None else None,
            journal=journal.absolute() if run is not None else None,
            after_step=after_step,
            upstream=upstream,
            max_steps=options.get("max_steps"),
            workspace=workspaces[i],
            key_file=Path(key_file).absolute() if key_file is not None else None,
            timeout=float(options.get("timeout") or 900.0),
            options=given,
        )
        for i in range(k)
    ]
    rows = {
        row.line: row
        for row in rollouts_on_ray(
            address, lines, journal=journal.absolute(), output_root=root, named=f"ray={address!r}"
        )
    }
    return [_result(rows[i + 1], root / f"rollout-{i}") for i in range(k)]


def _result(row: Any, output: Path) -> Result:
    """The :class:`Result` of a rollout row: the exit code ``pvisor replay`` has for its error
    code (:data:`~pvisor.replay.errors.ERROR_CODES` says it), 69 for a row Ray failed."""
    from pvisor.replay.errors import ERROR_CODES
    from pvisor.session.ray_rollouts import RayFailure

    if row.status == "ok":
        return Result(row.result, output)
    code = row.error_code or ""
    if code in {f.value for f in RayFailure}:
        exit_code = 69
    else:
        said = re.search(r"\(exit (\d+)", ERROR_CODES.get(code, ""))
        exit_code = int(said.group(1)) if said else 1
    return Result(row.result, output, row.error_message or row.status, exit_code)
