"""Starting the agent of a run: its executable (:func:`find_executable`) and version
(:func:`check_version`, ``<exe> --version`` within 10 s), its launch plan's files and
environment (:func:`write_files`, :func:`apply_env`), the agent's process itself
(:func:`launch_agent`: stdin, stdout and stderr to files, its own session and process group,
stopped on ``--timeout``, a stop signal or after its end; what it left behind ended), and its
native trajectory exported or found afterwards (:func:`native_trajectory`). The process group
is supervised with :mod:`pvisor.session.supervise`. What cannot be run raises
:class:`AgentUnavailable` (exit 69)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Collection, Mapping

from pvisor.adapters.agents.base import (
    VERSION_TIMEOUT_S,
    AgentProfile,
    ExportPlan,
    LaunchContext,
    LaunchPlan,
)
from pvisor.gateway.parent_death import die_with_parent
from pvisor.core.errors import OutputError, UnavailableError
from pvisor.core.outfile import create_private, read_back
from pvisor.journal.paths import absolute, make_directories
from pvisor.session.sandbox import STATUS_LIMIT, Sandbox, SandboxUnavailable, inside, parse_status, real
from pvisor.session.session import StopSignals
from pvisor.session.supervise import (
    KILL_GRACE_S,
    STOP_SIGNALS,
    STRAY_GRACE_S,
    GroupGuard,
    descendants,
    end_group,
    end_strays,
    exit_status,
    reap_children,
    stop_group,
)


#: how long ``opencode export`` may take
EXPORT_TIMEOUT_S = 60.0

#: how much longer than the relay's own stop pvisor waits before it kills a sandbox: the relay
#: gives the agent :data:`KILL_GRACE_S` and what it left :data:`STRAY_GRACE_S`, then says its status
SANDBOX_GRACE_S = KILL_GRACE_S + STRAY_GRACE_S + 2.0

#: how long bwrap's processes may take to go once it exited, before they count as strays
SETTLE_S = 1.0

#: how long pvisor waits for the relay's status line once bwrap exited (it is written before)
STATUS_WAIT_S = 5.0

#: how much of the agent's stdout pvisor reads back (its session id, its final status), bytes
OUTPUT_LIMIT = 256 << 20
#: the largest native trajectory pvisor reads, bytes
NATIVE_LIMIT = 1 << 30

#: ``warn(line)``: one warning line for the user
Warn = Callable[[str], None]


class AgentUnavailable(UnavailableError):
    """The agent cannot be run (exit 69): its executable is missing or not executable, its
    version cannot be told or is outside its profile, or it cannot be started."""


def apply_env(base: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """``base`` with ``changes`` applied (a None value removes the variable)."""
    env = dict(base)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def find_executable(profile: AgentProfile, entrypoint: str | None) -> str:
    """The agent's executable: ``entrypoint`` when given (a path to an executable file, or a bare
    command name looked up on PATH), else the profile's command found on PATH. Raises
    UnavailableError (exit 69) naming what is missing."""
    if entrypoint and os.sep not in entrypoint and not entrypoint.startswith("~"):
        found = shutil.which(entrypoint)  # a bare name, as a shell would take it: looked up on PATH
        if found is None:
            raise AgentUnavailable(
                f"--agent-entrypoint {entrypoint}: not on PATH (expected the {profile.title} executable; "
                "give a path or fix PATH)"
            )
        return found
    if entrypoint:
        path = absolute(os.path.expanduser(entrypoint), f"--agent-entrypoint {entrypoint}")
        if not os.path.exists(path):
            raise AgentUnavailable(
                f"--agent-entrypoint {path} does not exist (expected the {profile.title} executable, "
                f"'{profile.executable}')"
            )
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise AgentUnavailable(f"--agent-entrypoint {path} is not an executable file")
        return path
    found = shutil.which(profile.executable)
    if found is None:
        raise AgentUnavailable(
            f"{profile.title}: '{profile.executable}' is not on PATH; install it, or give "
            "--agent-entrypoint PATH"
        )
    return found


def _run_quick(argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> tuple[int | None, str]:
    """Run ``argv`` (stdin /dev/null, output to a file, own process group) for at most
    ``timeout`` s. Returns (exit code or None after a timeout, stdout and stderr as text)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        code: int | None = None
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:  # also on Ctrl-C: its own session does not get the terminal's SIGINT
            end_group(proc.pid, kill=True)
            if code is None:
                proc.wait()
        out.seek(0)
        return code, out.read(64 * 1024).decode("utf-8", "replace")


def check_version(
    profile: AgentProfile, exe: str, *, use_home: bool, allow_unsupported: bool, warn: Warn
) -> str | None:
    """The agent's version, from ``<exe> --version`` (mini-swe-agent: ``--help``) run with a
    throwaway home (unless ``use_home``) for at most 10 s. Raises UnavailableError (exit 69)
    when it cannot be told or is outside the profile's range, unless ``allow_unsupported``
    (then a warning, and None when unknown)."""
    argv = profile.version_argv(exe)
    shown = " ".join([os.path.basename(exe), *argv[1:]])
    with tempfile.TemporaryDirectory(prefix="pvisor-version-") as tmp:
        env = apply_env(os.environ, profile.version_env(None if use_home else Path(tmp)))
        try:
            code, output = _run_quick(argv, env, tmp, VERSION_TIMEOUT_S)
        except OSError as exc:
            raise AgentUnavailable(f"cannot run {exe}: {exc.strerror}") from None
    version = profile.read_version(output)
    hint = "; give --allow-unsupported to run it anyway"
    if version is None:
        if code is None:
            problem = f"`{shown}` did not answer within {VERSION_TIMEOUT_S:g} s"
        else:
            first = next((line.strip() for line in output.splitlines() if line.strip()), "")
            problem = f"`{shown}` exited with {code}" + (
                f" and printed {first[:120]!r}" if first else " and printed nothing"
            )
        message = f"cannot tell the version of {profile.title} at {exe}: {problem}"
        if not allow_unsupported:
            raise AgentUnavailable(message + hint)
        warn(message + "; going on (--allow-unsupported)")
        return None
    if version not in profile.versions:
        message = (
            f"{profile.title} {version} at {exe} is not a supported version (supported: {profile.versions})"
        )
        if not allow_unsupported:
            raise AgentUnavailable(message + hint)
        warn(message + "; going on (--allow-unsupported)")
    return version


def write_files(files: dict[Path, str], beneath: Path | None = None) -> None:
    """Write the plan's files: mode 0600, missing parent directories 0700. A file in ``beneath``
    (the run directory, which holds the agent's private home: the agent may write there, and a
    resumed run finds what it left) is made new through no link
    (:func:`~pvisor.core.outfile.create_private`). Raises OutputError (exit 74) naming the file
    when something the agent left is in the way."""
    for path, text in files.items():
        try:
            if beneath is not None and path.is_relative_to(beneath):
                out = create_private(path, beneath)
            else:
                make_directories(path.parent)
                out = create_private(path)
            with out:
                out.write(text.encode("utf-8"))
        except OSError as exc:
            raise OutputError(
                f"cannot write {path}: {exc.strerror or exc} (was it left in the run directory by the agent? "
                "remove it)"
            ) from None


async def launch_agent(
    plan: LaunchPlan,
    env: dict[str, str],
    workspace: Path,
    outputs: tuple[BinaryIO, BinaryIO],
    timeout: float,
    run_id: str,
    attempt: int,
    journal: Any,
    stop: StopSignals,
    ended: asyncio.Event | None = None,
    end_grace: float = 30.0,
    keep: Collection[int] = (),
    sandbox: Sandbox | None = None,
    enter: Callable[[], None] | None = None,
) -> tuple[int | None, bool, bool, int, bool]:
    """Run the agent, its stdout and stderr going to ``outputs`` (open files,
    :func:`open_outputs`; the caller's to close); returns (returncode, timed out, interrupted,
    stray processes ended, stopped after the end). On ``--timeout`` or a stop signal the
    agent's process group is stopped; so it is ``end_grace`` seconds after ``ended`` is set
    (the responder told it to end, and it goes on); then, as after a normal exit, every process it left behind
    (:func:`~pvisor.session.supervise.end_strays`). A launch failure ends the attempt in the
    journal and raises UnavailableError.

    With a ``sandbox`` (:class:`~pvisor.session.sandbox.Sandbox`) the agent runs under the
    relay in bwrap: bwrap starts with the stop signals ignored (they survive exec), so that
    pvisor's SIGTERM to its process group reaches the relay alone, which stops the agent with
    the same grace and says its status on a pipe only it holds (the agent's return code, the
    processes it ended; without it the return code is bwrap's, :attr:`Sandbox.status` None);
    pvisor kills the group after :data:`SANDBOX_GRACE_S`. A sandbox that does not start (bwrap's
    mounts, the relay) raises UnavailableError with bwrap's or the relay's line: the agent never ran.

    ``enter``: run in the started process between fork and exec, after the rest of its
    ``preexec_fn`` (the run's cgroup: :meth:`~pvisor.session.limits.RunCgroup.enter`), so that
    the agent, or bwrap and everything in the sandbox, is born inside."""
    if stop.event.is_set():  # a signal came while the gateway started: never start the agent
        return None, False, True, 0, False
    argv, pass_fds, preexec = plan.argv, (), _then(die_with_parent(), enter)
    ready_r = ready_w = config_fd = -1
    out, err = outputs
    if sandbox is not None:
        # the status pipe: its write end only the relay holds (bwrap's init closes it, the agent
        # does not inherit it); the configuration an unlinked file (docs/replay.md "The sandbox")
        ready_r, ready_w = os.pipe()
        config_fd = sandbox.config_file(plan.argv, ready_w, KILL_GRACE_S, STRAY_GRACE_S)
        argv = sandbox.argv(sandbox.relay_argv(config_fd), str(workspace))
        pass_fds, preexec = (ready_w, config_fd), _ignoring_stops(preexec)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL if plan.stdin is None else subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=str(workspace),
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=pass_fds,
        )
    except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument (checked before)
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        journal.end_attempt(run_id, attempt, None, {"error": f"cannot start the agent: {why}"})
        if ready_r >= 0:
            os.close(ready_r)
        raise AgentUnavailable(f"cannot start {argv[0]}: {why}") from None
    finally:
        for fd in (ready_w, config_fd):
            if fd >= 0:
                os.close(fd)
    guard = GroupGuard(proc.pid)  # the agent (or bwrap) leads its own group (its own session)
    feed = asyncio.ensure_future(_feed(proc, plan.stdin)) if plan.stdin is not None else None
    said: tuple[asyncio.StreamReader, asyncio.BaseTransport] | None = None
    try:
        if sandbox is not None:
            said = await _status_pipe(ready_r)
            await _sandbox_started(proc, said[0], err, sandbox, journal, run_id, attempt)
        grace = SANDBOX_GRACE_S if sandbox else KILL_GRACE_S
        ran = await _supervise(proc, guard, timeout, keep, stop, ended, end_grace, grace, sandbox is not None)
        if sandbox is not None and said is not None:
            sandbox.status = await _relay_status(said[0])
    finally:
        if feed is not None:
            feed.cancel()
        guard.release()
        if said is not None:
            said[1].close()
    if sandbox is None:
        return ran
    status = sandbox.status
    returncode, timed_out, interrupted, strays, after_end = ran
    if status is not None:  # type-checked (parse_status): the relay's, no file the agent wrote
        returncode = status["returncode"]  # the agent's, not bwrap's
        strays += status["strays"]
    return returncode, timed_out, interrupted, strays, after_end


async def _status_pipe(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream reading the relay's status pipe ``fd`` (its lines buffered as they come, so the
    relay never blocks on it), and its transport (closing it closes ``fd``)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STATUS_LIMIT)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


async def _relay_status(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The relay's status line, read once bwrap exited (:func:`~pvisor.session.sandbox.parse_status`);
    None when the relay said none (killed, or died) or something else."""
    try:
        line = await asyncio.wait_for(reader.readline(), STATUS_WAIT_S)
    except (asyncio.TimeoutError, ValueError, OSError):  # ValueError: a line over STATUS_LIMIT
        return None
    return parse_status(line) if line.strip() else None


def open_outputs(paths: tuple[Path, Path]) -> tuple[BinaryIO, BinaryIO]:
    """The agent's stdout and stderr files (``attempt-N.stdout``, ``.stderr`` of the run
    directory) made new, through no link (:func:`~pvisor.core.outfile.create_private`: what an
    earlier attempt's agent left there is replaced, never followed). Raises OutputError (exit
    74) naming the file (a directory in the way)."""
    opened: list[BinaryIO] = []
    try:
        for path in paths:
            opened.append(create_private(path))
    except OSError as exc:
        for f in opened:
            f.close()
        raise OutputError(
            f"cannot write {exc.filename or path}: {exc.strerror or exc} (left in the run directory by the "
            "agent? remove it)"
        ) from None
    return opened[0], opened[1]


def read_output(out: BinaryIO, path: Path, warn: Warn) -> bytes:
    """What the agent wrote to its stdout, read back from pvisor's own descriptor ``out`` (never
    by its ``path``, where the agent may have left a FIFO or a link), at most
    :data:`OUTPUT_LIMIT` bytes (a warning naming ``path`` when more)."""
    try:
        data, more = read_back(out, OUTPUT_LIMIT)
    except OSError as exc:
        warn(f"{path}: {exc.strerror or exc}: the agent's output is not read")
        return b""
    if more:
        warn(f"{path}: more than {OUTPUT_LIMIT >> 20} MiB; only its first {OUTPUT_LIMIT >> 20} MiB are read")
    return data


def vetted_native(native: Path | None, roots: Collection[str], warn: Warn) -> Path | None:
    """``native`` (the native trajectory found after the run) when pvisor may read it: a regular
    file (not a symbolic link, a FIFO, a device), at most :data:`NATIVE_LIMIT` bytes, and with a
    sandbox inside one of its writable ``roots`` (real paths: no link in its path leads out);
    else None with a warning naming it. After a sandboxed agent nothing of it runs any more:
    what is checked here stays so."""
    if native is None:
        return None
    import stat

    try:
        st = os.lstat(native)
    except OSError:
        return None
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file (a symbolic link, a FIFO or a device left in its place?)"
    elif roots and not any(inside(os.path.realpath(native), r) for r in roots):
        problem = "it lies outside what the sandbox let the agent write (through a symbolic link?)"
    elif st.st_size > NATIVE_LIMIT:
        problem = f"more than {NATIVE_LIMIT >> 20} MiB"
    if problem is None:
        return native
    warn(f"native trajectory {native}: {problem}; not read")
    return None


def _then(first: Callable[[], None] | None, then: Callable[[], None] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` running ``first``, then ``then`` (either may be None)."""
    if first is None or then is None:
        return first or then

    def preexec() -> None:
        first()
        then()

    return preexec


def _ignoring_stops(then: Callable[[], None] | None) -> Callable[[], None]:
    """A ``preexec_fn``: the stop signals ignored (an ignored signal stays ignored across exec:
    bwrap does not die of pvisor's SIGTERM, the relay inside handles it), then ``then``."""

    def preexec() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if then is not None:
            then()

    return preexec


async def _sandbox_started(
    proc: Any,
    reader: asyncio.StreamReader,
    stderr: BinaryIO,
    sandbox: Sandbox,
    journal: Any,
    run_id: str,
    attempt: int,
) -> None:
    """Wait for the relay's first line (it started the agent) or for bwrap's end; a sandbox that
    ended without starting the agent ends the attempt and raises SandboxUnavailable (exit 69)
    with bwrap's or the relay's own line."""
    try:
        line = await reader.readline()  # the relay's line, not the end, says it started
    except (ValueError, OSError):
        line = b""
    try:
        said = json.loads(line) if line.strip() else {}
    except ValueError:
        said = {}
    if isinstance(said, dict) and type(said.get("pid")) is int:
        return
    await proc.wait()
    why = said.get("error") if isinstance(said, dict) else None
    if not isinstance(why, str) or not why:
        why = _last_line(stderr) or f"bwrap exited with {exit_status(proc.returncode)}"
    journal.end_attempt(run_id, attempt, None, {"error": f"the sandbox did not start: {why[:300]}"})
    raise SandboxUnavailable(
        f"the sandbox did not start the agent: {why[:300]} (--sandbox none runs it without one)"
    )


def _last_line(stderr: BinaryIO) -> str:
    """The last non-empty line written to ``stderr`` (bwrap's message; read back from pvisor's
    own descriptor, :func:`~pvisor.core.outfile.read_back`), at most 300 characters."""
    try:
        head, _ = read_back(stderr, 64 * 1024)
    except OSError:
        return ""
    lines = [ln.strip() for ln in head[-4096:].decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


async def _feed(proc: Any, data: bytes) -> None:
    """Write ``data`` (the task, :attr:`LaunchPlan.stdin`) to the agent's stdin and close it;
    an agent that exits without reading it all is no error of this."""
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


async def _supervise(
    proc: Any,
    guard: GroupGuard,
    timeout: float,
    keep: Collection[int],
    stop: StopSignals,
    ended: asyncio.Event | None,
    end_grace: float,
    kill_grace: float = KILL_GRACE_S,
    settle: bool = False,
) -> tuple[int | None, bool, bool, int, bool]:
    """Wait for the agent of :func:`launch_agent` until it exits, times out, is stopped or outlives
    its end (its group then stopped, SIGKILL after ``kill_grace`` s); then end what it left behind
    (``settle``: a sandbox, whose bwrap processes get :data:`SETTLE_S` to go first)."""
    waiter = asyncio.ensure_future(proc.wait())
    stopper = asyncio.ensure_future(stop.event.wait())
    ender = asyncio.ensure_future(_after(ended, end_grace)) if ended is not None else None
    done, _ = await asyncio.wait(
        {waiter, stopper} | ({ender} if ender else set()),
        timeout=timeout,
        return_when=asyncio.FIRST_COMPLETED,
    )
    stopper.cancel()
    if ender is not None:
        ender.cancel()
    timed_out = interrupted = after_end = False
    if waiter not in done:
        interrupted = stop.event.is_set()
        after_end = not interrupted and ender is not None and ender in done
        timed_out = not interrupted and not after_end
        await stop_group(proc, stop.hurry, kill_grace)
    await waiter
    # what the agent left running: in its group (shell jobs, helpers) or in sessions of their own
    keep = (*keep, *((guard.pid,) if guard.pid is not None else ()))
    if settle:
        # a sandbox: bwrap's own init may still be exiting, re-parented to pvisor; it is no stray
        await _settled(keep, SETTLE_S)
    strays = await end_strays(hurry=stop.hurry, keep=keep)
    end_group(proc.pid, kill=True)  # where /proc cannot be walked (not Linux): at least its group
    return proc.returncode, timed_out, interrupted, strays, after_end


async def _settled(keep: Collection[int], limit: float) -> None:
    """Wait up to ``limit`` s until this process has no live descendant but ``keep``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        reap_children(keep)
        if not [p for p, st in descendants(os.getpid()).items() if st != "Z" and p not in keep]:
            return
        await asyncio.sleep(0.02)


async def _after(event: asyncio.Event, grace: float) -> None:
    """Return ``grace`` seconds after ``event`` is set."""
    await event.wait()
    await asyncio.sleep(grace)


async def native_trajectory(
    profile: AgentProfile,
    ctx: LaunchContext,
    plan: LaunchPlan,
    session_id: str | None,
    env: dict[str, str],
    workspace: Path,
    warn: Warn,
    keep: Collection[int] = (),
    sandbox: Sandbox | None = None,
) -> Path | None:
    """The native trajectory: exported (OpenCode: :meth:`AgentProfile.export_plan`) or found by
    session id / fixed path. The export is a program the agent's files can steer (OpenCode loads
    plugins), so it gets the least it needs: a fresh working directory (made here, removed
    after; no repository is looked for above it), its plan's fresh files and environment, and,
    when the agent ran in ``sandbox``, the same sandbox (its mounts and network rule, that
    directory writable too) with the relay as its supervisor. ``workspace`` is not its working
    directory."""
    scratch = Path(tempfile.mkdtemp(prefix="pvisor-export-"))
    try:
        export = profile.export_plan(ctx, session_id, scratch)
        if export is None:
            return profile.find_native(ctx, session_id, plan)
        return await _export(export, env, scratch, warn, keep, sandbox)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _export(
    export: ExportPlan,
    env: dict[str, str],
    scratch: Path,
    warn: Warn,
    keep: Collection[int],
    sandbox: Sandbox | None,
) -> Path | None:
    """Run ``export`` in ``scratch`` (in a copy of ``sandbox`` when given) for at most
    :data:`EXPORT_TIMEOUT_S`; its output file, or None with a warning when it failed."""
    write_files(export.files)
    # PWD: OpenCode takes its directory from it; no repository above scratch is taken for its own
    changes = {**export.env, "PWD": str(scratch), "GIT_CEILING_DIRECTORIES": str(scratch.parent)}
    run_env = apply_env(env, changes)
    argv, pass_fds, config_fd = export.argv, (), -1
    if sandbox is not None:
        box = dataclasses.replace(
            sandbox,
            writable=[*sandbox.writable, real(scratch)],
            relayed=[],  # it needs no network: the relay only supervises
            status=None,
        )
        # no status pipe: the export's own exit code and output are what pvisor reads
        config_fd = box.config_file(argv, -1, KILL_GRACE_S, STRAY_GRACE_S)
        argv, pass_fds = box.argv(box.relay_argv(config_fd), str(scratch)), (config_fd,)
    err_path = export.output.with_suffix(".stderr")
    # pvisor's own files in the run directory: never through a link the agent planted there
    with create_private(export.output) as out, create_private(err_path) as err:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=str(scratch),
                env=run_env,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                pass_fds=pass_fds,
            )
        finally:
            if config_fd >= 0:
                os.close(config_fd)
        try:
            await asyncio.wait_for(proc.wait(), EXPORT_TIMEOUT_S)
        except asyncio.TimeoutError:
            await stop_group(proc)  # bwrap's end ends its PID namespace, the export in it
    await end_strays(keep=keep)
    if proc.returncode != 0 or export.output.stat().st_size == 0:
        warn(
            f"`{' '.join([os.path.basename(export.argv[0]), *export.argv[1:]])}` failed (exit "
            f"{exit_status(proc.returncode)}; see {err_path}): no native trajectory"
        )
        return None
    return export.output
