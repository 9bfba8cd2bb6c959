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
from typing import Any, Callable, Collection, Mapping

from pvisor.adapters.agents.base import (
    VERSION_TIMEOUT_S,
    AgentProfile,
    ExportPlan,
    LaunchContext,
    LaunchPlan,
)
from pvisor.gateway.parent_death import die_with_parent
from pvisor.core.errors import UnavailableError
from pvisor.core.outfile import open_private
from pvisor.journal.paths import absolute, make_directories
from pvisor.session.sandbox import Sandbox, SandboxUnavailable, real
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
#: gives the agent :data:`KILL_GRACE_S` and what it left :data:`STRAY_GRACE_S`, then writes its status
SANDBOX_GRACE_S = KILL_GRACE_S + STRAY_GRACE_S + 2.0

#: how long bwrap's processes may take to go once it exited, before they count as strays
SETTLE_S = 1.0

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


def write_files(files: dict[Path, str]) -> None:
    """Write the plan's files: mode 0600, missing parent directories 0700."""
    for path, text in files.items():
        make_directories(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)


async def launch_agent(
    plan: LaunchPlan,
    env: dict[str, str],
    workspace: Path,
    stdout_path: Path,
    stderr_path: Path,
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
    """Run the agent; returns (returncode, timed out, interrupted, stray processes ended,
    stopped after the end). On ``--timeout`` or a stop signal the agent's process group is
    stopped; so it is ``end_grace`` seconds after ``ended`` is set (the responder told it to
    end, and it goes on); then, as after a normal exit, every process it left behind
    (:func:`~pvisor.session.supervise.end_strays`). A launch failure ends the attempt in the
    journal and raises UnavailableError.

    With a ``sandbox`` (:class:`~pvisor.session.sandbox.Sandbox`) the agent runs under the
    relay in bwrap: bwrap starts with the stop signals ignored (they survive exec), so that
    pvisor's SIGTERM to its process group reaches the relay alone, which stops the agent with
    the same grace and writes its status (the agent's return code, the processes it ended);
    pvisor kills the group after :data:`SANDBOX_GRACE_S`. A sandbox that does not start (bwrap's
    mounts, the relay) raises UnavailableError with bwrap's or the relay's line: the agent never ran.

    ``enter``: run in the started process between fork and exec, after the rest of its
    ``preexec_fn`` (the run's cgroup: :meth:`~pvisor.session.limits.RunCgroup.enter`), so that
    the agent, or bwrap and everything in the sandbox, is born inside."""
    if stop.event.is_set():  # a signal came while the gateway started: never start the agent
        return None, False, True, 0, False
    argv, pass_fds, preexec = plan.argv, (), _then(die_with_parent(), enter)
    ready_r = ready_w = -1
    if sandbox is not None:
        ready_r, ready_w = os.pipe()
        sandbox.write_config(plan.argv, ready_w, KILL_GRACE_S, STRAY_GRACE_S)
        argv = sandbox.argv(sandbox.relay_argv(), str(workspace))
        pass_fds, preexec = (ready_w,), _ignoring_stops(preexec)
    with open_private(stdout_path) as out, open_private(stderr_path) as err:
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
            raise AgentUnavailable(f"cannot start {argv[0]}: {why}") from None
        finally:
            if ready_w >= 0:
                os.close(ready_w)
    guard = GroupGuard(proc.pid)  # the agent (or bwrap) leads its own group (its own session)
    feed = asyncio.ensure_future(_feed(proc, plan.stdin)) if plan.stdin is not None else None
    try:
        if sandbox is not None:
            await _sandbox_started(proc, ready_r, stderr_path, sandbox, journal, run_id, attempt)
        grace = SANDBOX_GRACE_S if sandbox else KILL_GRACE_S
        ran = await _supervise(proc, guard, timeout, keep, stop, ended, end_grace, grace, sandbox is not None)
    finally:
        if feed is not None:
            feed.cancel()
        guard.release()
    if sandbox is None:
        return ran
    status = sandbox.read_status()
    returncode, timed_out, interrupted, strays, after_end = ran
    if status is not None and isinstance(status.get("returncode"), int):
        returncode = status["returncode"]  # the agent's, not bwrap's
        strays += int(status.get("strays") or 0)
    return returncode, timed_out, interrupted, strays, after_end


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
    proc: Any, ready_r: int, stderr_path: Path, sandbox: Sandbox, journal: Any, run_id: str, attempt: int
) -> None:
    """Wait for the relay's first line (it started the agent) or for bwrap's end; a sandbox that
    ended without starting the agent ends the attempt and raises SandboxUnavailable (exit 69)
    with bwrap's or the relay's own line."""
    loop = asyncio.get_running_loop()
    try:
        line = await loop.run_in_executor(None, _read_line, ready_r)
    finally:
        os.close(ready_r)
    try:
        said = json.loads(line) if line.strip() else {}
    except ValueError:
        said = {}
    if isinstance(said, dict) and isinstance(said.get("pid"), int):
        return
    await proc.wait()
    why = said.get("error") if isinstance(said, dict) else None
    if not why:
        why = _last_line(stderr_path) or f"bwrap exited with {exit_status(proc.returncode)}"
    journal.end_attempt(run_id, attempt, None, {"error": f"the sandbox did not start: {why}"})
    raise SandboxUnavailable(
        f"the sandbox did not start the agent: {why} (--sandbox none runs it without one)"
    )


def _read_line(fd: int) -> str:
    """The first line from ``fd``, or what came before its end (bwrap holds the pipe too while
    it runs: the relay's line, not the end, says it started)."""
    chunks = []
    while True:
        data = os.read(fd, 4096)
        chunks.append(data)
        if not data or b"\n" in data:
            return b"".join(chunks).decode("utf-8", "replace")


def _last_line(path: Path) -> str:
    """The last non-empty line of ``path`` (bwrap's message), at most 300 characters."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
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
    argv = export.argv
    if sandbox is not None:
        box = dataclasses.replace(
            sandbox,
            writable=[*sandbox.writable, real(scratch)],
            relayed=[],  # it needs no network: the relay only supervises
            status_path=str(scratch / "relay-status.json"),
            config_path=str(scratch / "relay.json"),
            status=None,
        )
        box.write_config(argv, -1, KILL_GRACE_S, STRAY_GRACE_S)
        argv = box.argv(box.relay_argv(), str(scratch))
    err_path = export.output.with_suffix(".stderr")
    with open_private(export.output) as out, open_private(err_path) as err:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=str(scratch),
            env=run_env,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
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
