"""``pvisor run``: one attempt of a real agent CLI, headless, with the capture gateway in front.

What happens, in order (docs/cli.md, docs/agents.md):

1. The launch profile (:mod:`pvisor.adapters.agents`) is looked up. With ``--resume RUN`` the
   run must be in the journal, captured with the same agent, with a session id. The agent's
   executable is the ``--agent-entrypoint`` or the profile's command on PATH; ``<exe>
   --version`` (10 s) must report a version in the profile's range unless
   ``--allow-unsupported``.
2. The gateway starts in this process on ``127.0.0.1:--port`` (0: a free port) with one upstream,
   the profile's: ``--upstream URL``, the built-in scripted model server (``--script``, offline)
   or the public API. Only once the port is bound is the journal opened, so every failure up
   to here leaves the journal as it was.
3. The run directory ``<data dir>/runs/<run>/`` (data dir: the journal's directory) and the
   agent's private home in it are created, the profile's files written, the run and attempt
   rows recorded (agent, version, argv, workspace, model).
4. The agent runs in the workspace with stdin ``/dev/null``, stdout and stderr to
   ``attempt-N.stdout`` / ``attempt-N.stderr`` in the run directory (a pipe would deadlock on
   long JSON output), ``TMPDIR`` in ``<run dir>/tmp``, in a new session, so that on
   ``--timeout`` or a stop signal (SIGINT, SIGTERM, SIGHUP) its whole process group is killed
   (SIGTERM, then SIGKILL after 5 s, at once after a second signal). pvisor is a child
   subreaper (Linux), so what the agent started in sessions of its own stays below it; every
   such process left when the agent ends is ended too (:func:`end_strays`).
5. The session id is read from the agent's stdout, the native trajectory found (or exported,
   OpenCode), the run's exchanges classified by the chain rule
   (:mod:`pvisor.adapters.chains`) into main-loop and auxiliary ones, the roles stored, and the
   steps counted (:mod:`pvisor.adapters.journal_trajectory`).

The agent's exit code is the result; pvisor's own failures raise :class:`PvisorError` with the
documented codes (2 usage, 65 bad data, 69 unavailable, 124 timeout, 128 + N after signal N:
129 SIGHUP, 130 SIGINT, 143 SIGTERM).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

import orjson

from pvisor.adapters.agents import get_profile
from pvisor.adapters.agents.base import (
    VERSION_TIMEOUT_S,
    AgentOutcome,
    AgentProfile,
    AgentStatus,
    LaunchContext,
    LaunchPlan,
)
from pvisor.adapters.protocols import UPSTREAMS
from pvisor.gateway.parent_death import die_with_parent
from pvisor.journal.child_runs import Claim, claim_child_run, release_child_run
from pvisor.journal.errors import BadInputError, PvisorError, UnavailableError, UsageError, shown
from pvisor.journal.outfile import open_private
from pvisor.journal.paths import CWD_GONE_HINT, absolute, cwd_gone, make_directories, not_utf8
from pvisor.journal.model import RUN_ID_PATTERN, Attempt, Run, RunMode
from pvisor.journal.reader import JournalReader
from pvisor.journal.snapshots import SnapshotKind
from pvisor.journal.producer import new_run_id
from pvisor.session.supervise import (
    STOP_SIGNALS,
    GroupGuard,
    become_subreaper,
    end_group,
    end_strays,
    exit_status,
    stop_group,
)

if TYPE_CHECKING:  # the session's parts load when a run starts, after the checks
    from pvisor.session.session import StopSignals

#: the key given to an agent that talks to the scripted model (it checks nothing)
SCRIPT_API_KEY = "pvisor-scripted-model-key"

#: how long ``opencode export`` may take
EXPORT_TIMEOUT_S = 60.0

#: how long the run waits for the journal when another process holds its write lock: the
#: writer keeps everything in memory meanwhile and warns every 30 s (a run is never lost to a
#: lock held for seconds or minutes)
JOURNAL_WAIT_S = 600.0

#: exit code after Ctrl-C (SIGINT); SIGHUP gives 129 and SIGTERM 143 (128 + signal number)
EXIT_INTERRUPTED = 130

#: what ``pvisor run`` exits with when the agent exited 0 but its own final status says it
#: failed (mini-swe-agent's ``RepeatedFormatError``): a failure is never reported as a success
EXIT_AGENT_FAILED = 1

Warn = Callable[[str], None]


class AgentUnavailable(UnavailableError):
    """The agent cannot be run (exit 69): its executable is missing or not executable, its
    version cannot be told or is outside its profile, or it cannot be started."""


@dataclass
class RunRequest:
    """The options of ``pvisor run`` (see docs/cli.md).

    Fields: ``agent`` name; ``task`` text; ``journal_path``; ``entrypoint`` (None: look the
    profile's executable up on PATH); ``upstream`` base URL or ``script`` path (neither: the
    public API); ``workspace`` (None: the current directory, or the resumed run's);
    ``timeout`` seconds; ``resume`` run id; ``allow_unsupported``; ``use_home``; ``port`` of
    the gateway (0: a free one); ``model`` (None: the profile's choice). A run under a
    responder (replay's playback) gives ``responder``, a factory called with the
    :class:`RunSetup` once the run id is known (the gateway then forwards nothing and the agent
    gets a dummy key), ``mode``, ``parent_run`` and ``boundary_step`` (the derived run's
    lineage), ``labels`` (more run labels), ``upstream_label`` (what ``labels.upstream`` names)
    and ``end_grace``: seconds the agent may still run once the responder's ``ended`` is set,
    before it is stopped. With a responder, ``upstream`` is where its :class:`Forward` answers go
    (a continuation); the agent then reads the user's key from the environment, as with
    ``--upstream``. ``agent_env``: variables added to the agent's environment (the launch
    profile's own settings win); ``agent_args``: more launch arguments
    (:meth:`~pvisor.adapters.agents.base.AgentProfile.with_arguments`); ``dummy_key``: give the
    agent a dummy key even with an upstream (a local model server that checks none, when the
    user has no key in the environment). ``snapshots``: snapshot the workspace at the start,
    at every candidate main-loop request and at the end (``--no-snapshots`` turns it off), with
    the driver ``snapshot_driver``. ``intercept``: run the agent through intercept mode (an
    :class:`~pvisor.gateway.intercept.InterceptConfig`: ``HTTPS_PROXY`` and pvisor's CA instead
    of a base URL pointing at the gateway; docs/intercept.md), None for the reverse proxy.
    ``child_run``: run as the pending child run of a handoff (``TrajectoryReplay.restore_handoff``
    created it): the run is filed under that id, its lineage kept, once (:func:`child_target`);
    the workspace defaults to where the handoff restored it. ``child_option``: how errors name
    it (``--child-run``, or a Python caller's ``child_run=``). The child run is claimed in the
    journal before the run starts (:func:`claim_child`) unless ``child_claimed`` says when this
    process claimed it already (a replay, before restoring its workspace; Unix epoch ms: the
    attempt's start), and given back when the start fails before the agent ran.
    ``max_response_body``: the gateway's ``--max-response-body`` (None: its default).
    """

    agent: str
    task: str
    journal_path: Path
    entrypoint: str | None = None
    upstream: str | None = None
    script: str | None = None
    workspace: Path | None = None
    timeout: float = 1800.0
    resume: str | None = None
    allow_unsupported: bool = False
    use_home: bool = False
    port: int = 0
    model: str | None = None
    responder: "ResponderFactory | None" = None
    mode: str = "capture"
    parent_run: str | None = None
    boundary_step: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    upstream_label: str | None = None
    end_grace: float = 30.0
    agent_env: dict[str, str] = field(default_factory=dict)
    agent_args: list[str] = field(default_factory=list)
    dummy_key: bool = False
    snapshots: bool = True
    snapshot_driver: str = "filesystem"
    intercept: Any = None
    child_run: str | None = None
    child_option: str = "--child-run"
    child_claimed: int | None = None
    max_response_body: int | None = None


@dataclass(frozen=True)
class RunSetup:
    """What a responder factory learns before the agent starts: the new ``run`` id, its
    ``run_dir``, the agent's private ``home`` (None with ``--use-home``) and ``workspace``."""

    run: str
    run_dir: Path
    home: Path | None
    workspace: Path


#: ``factory(setup) -> responder``: the answer source of a run under a responder (playback);
#: the responder may have an ``ended`` asyncio.Event, set once the agent was told to end
ResponderFactory = Callable[[RunSetup], Any]


@dataclass
class RunReport:
    """What one ``pvisor run`` did. ``exit_code`` is what the command exits with: the agent's
    own code, 124 after ``--timeout``, 128 + the signal's number after a stop signal (130 Ctrl-C,
    129 SIGHUP, 143 SIGTERM; ``interrupt_signal`` names it). ``stray_processes_killed``: how
    many processes the agent left running (in its group or escaped into their own session)
    pvisor ended after it. ``steps`` and the counts after it are None when the steps could not
    be derived (``steps_error`` says why). ``attempt_steps``: the main-loop chains this attempt
    sent requests in, ``{"chain": N, "steps": K, "main": bool}`` each, K its requests of this
    attempt (after a Gemini CLI or Qwen Code resume, a new chain that ``steps`` does not
    count, the main chain being the first attempt's)."""

    run: str
    attempt: int
    agent: str
    agent_version: str | None
    exit_code: int
    agent_exit_code: int | None
    timed_out: bool
    interrupted: bool
    workspace: Path
    run_dir: Path
    stdout: Path
    stderr: Path
    gateway: str
    argv: list[str]
    session_id: str | None = None
    native_path: Path | None = None
    steps: int | None = None
    tool_calls_per_step: list[int] = field(default_factory=list)
    exchanges: int | None = None
    main_exchanges: int | None = None
    auxiliary_exchanges: int | None = None
    chains: int | None = None
    main_chain: int | None = None
    attempt_chains: list[int] = field(default_factory=list)
    attempt_steps: list[dict[str, Any]] = field(default_factory=list)
    steps_error: str | None = None
    stray_processes_killed: int = 0
    interrupt_signal: str | None = None
    stopped_after_end: bool = False
    snapshots: int = 0
    snapshot_warnings: list[str] = field(default_factory=list)
    intercept_proxy: str | None = None
    #: the agent's own account of how it ended (:meth:`AgentProfile.final_status`)
    agent_status: AgentStatus | None = None

    @property
    def failed_by_own_account(self) -> bool:
        """The agent exited 0 but says it failed: the run exits :data:`EXIT_AGENT_FAILED`."""
        return (
            self.agent_exit_code == 0
            and not (self.timed_out or self.interrupted)
            and self.agent_status is not None
            and self.agent_status.outcome is AgentOutcome.FAILED
        )

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (docs/cli.md)."""
        return {
            "run": self.run,
            "attempt": self.attempt,
            "agent": self.agent,
            "agent_version": self.agent_version,
            "exit_code": self.exit_code,
            "agent_exit_code": self.agent_exit_code,
            "agent_status": self.agent_status.to_json() if self.agent_status else None,
            "timed_out": self.timed_out,
            "interrupted": self.interrupted,
            "interrupt_signal": self.interrupt_signal,
            "stray_processes_killed": self.stray_processes_killed,
            "stopped_after_end": self.stopped_after_end,
            "steps": self.steps,
            "tool_calls_per_step": self.tool_calls_per_step,
            "exchanges": self.exchanges,
            "main_exchanges": self.main_exchanges,
            "auxiliary_exchanges": self.auxiliary_exchanges,
            "chains": self.chains,
            "main_chain": self.main_chain,
            "attempt_chains": self.attempt_chains,
            "attempt_steps": self.attempt_steps,
            "steps_error": self.steps_error,
            "snapshots": self.snapshots,
            "snapshot_warnings": self.snapshot_warnings,
            "session_id": self.session_id,
            "native_trajectory": str(self.native_path) if self.native_path else None,
            "workspace": str(self.workspace),
            "run_dir": str(self.run_dir),
            "stdout": str(self.stdout),
            "stderr": str(self.stderr),
            "gateway": self.gateway,
            "intercept_proxy": self.intercept_proxy,
            "argv": self.argv,
        }


# --------------------------------------------------------------------------- checks


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
    command name looked up on PATH), else the profile's command found on PATH. Raises UnavailableError (exit 69) naming what is
    missing."""
    if entrypoint and os.sep not in entrypoint and not entrypoint.startswith("~"):
        found = shutil.which(entrypoint)  # a bare name, as a shell would take it: looked up on PATH
        if found is None:
            raise AgentUnavailable(
                f"--agent-entrypoint {entrypoint}: not on PATH (expected the {profile.title} executable; give a path or fix PATH)"
            )
        return found
    if entrypoint:
        path = absolute(os.path.expanduser(entrypoint), f"--agent-entrypoint {entrypoint}")
        if not os.path.exists(path):
            raise AgentUnavailable(
                f"--agent-entrypoint {path} does not exist (expected the {profile.title} executable, '{profile.executable}')"
            )
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise AgentUnavailable(f"--agent-entrypoint {path} is not an executable file")
        return path
    found = shutil.which(profile.executable)
    if found is None:
        raise AgentUnavailable(
            f"{profile.title}: '{profile.executable}' is not on PATH; install it, or give --agent-entrypoint PATH"
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


def data_dir_of(journal_path: Path) -> Path:
    """The data directory: the directory holding the journal file."""
    return Path(absolute(journal_path, f"--journal {journal_path}")).parent


def run_dir_of(journal_path: Path, run_id: str) -> Path:
    """``<data dir>/runs/<run id>``."""
    from pvisor.journal.paths import run_directory

    return run_directory(journal_path, run_id)


def without_userinfo(url: str) -> str:
    """``url`` without its user info (``https://user:key@host`` -> ``https://host``) and with a
    key-shaped path segment ``REDACTED`` (a key pasted into the base path): how an upstream URL
    is shown in labels, results and errors."""
    from pvisor.journal.redact import redact_path

    return redact_path(re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", url))


@dataclass
class _Resume:
    run: Run
    attempt: int
    session_id: str
    workspace: Path | None
    use_home: bool


def _resume_target(req: RunRequest, profile: AgentProfile) -> _Resume:
    """Look up the run to resume. UsageError (exit 2) for an unknown run or another agent;
    BadInputError (exit 65) for a run without a session id or whose private home is gone."""
    assert req.resume is not None
    if not profile.resumable:
        raise UsageError(
            f"{profile.title} has no native resume; --resume works with the agents that have one (docs/agents.md)"
        )
    path = Path(req.journal_path)
    if not path.exists():
        raise UsageError(f"no run {req.resume!r} to resume: journal {path} does not exist")
    with JournalReader(path) as r:
        run = r.run(req.resume)
        attempts = r.attempts(run.id)
    if run.agent != profile.name:
        raise UsageError(
            f"run {run.id} was captured with {run.agent or 'an unknown agent'}, not {profile.name}; give --agent {run.agent}"
            if run.agent
            else f"run {run.id} was not started by pvisor run (no agent recorded); cannot resume it"
        )
    session = run.labels.get("session_id")
    if not session:
        raise BadInputError(
            f"run {run.id} has no session id recorded (the agent printed none), so it cannot be resumed"
        )
    use_home = run.labels.get("home") == "user"
    if not use_home:
        home = run_dir_of(req.journal_path, run.id) / "home"
        if not home.is_dir():
            raise BadInputError(
                f"the private home of run {run.id} ({home}) is gone, and the session with it; cannot resume"
            )
    ws = run.labels.get("workspace")
    n = max((a.n for a in attempts), default=1) + 1
    return _Resume(
        run=run, attempt=n, session_id=session, workspace=Path(ws) if ws else None, use_home=use_home
    )


def child_named(option: str, child: str) -> str:
    """``--child-run ID`` or ``child_run='ID'``: the option as its caller wrote it, a long id
    shortened (:func:`~pvisor.journal.errors.shown`)."""
    return f"{option}{shown(repr(child))}" if option.endswith("=") else f"{option} {shown(child)}"


def child_target(
    journal_path: Path, child: str, option: str = "--child-run", *, claimed: bool = False
) -> Run:
    """The pending child run ``child`` of a handoff, to be started now. UsageError (exit 2),
    naming ``option``, when the journal or the run is missing, the run is no handoff's child, its
    restore has not finished, or it was started already (a child run starts once). Only reads:
    :func:`claim_child` takes it; ``claimed``: this process took it already (its claim is the
    attempt the run now has)."""
    path = Path(journal_path)
    named = child_named(option, child)
    if not child or not child.strip():
        raise UsageError(
            f"{option} is empty: give the id of the handoff's child run (pvisor journal ls lists it)"
        )
    if not re.fullmatch(RUN_ID_PATTERN, child):
        raise UsageError(
            f"{named}: not a run id (letters, digits, '.', '_' and '-', at most 128, starting with a letter "
            "or digit): give the id of the handoff's child run (pvisor journal ls lists it)"
        )
    if not path.exists():
        raise UsageError(f"{named}: journal {path} does not exist")
    with JournalReader(path) as r:
        if not r.run_exists(child):
            raise UsageError(
                f"{named}: no run {child} in journal {path}; a handoff's child run is created by "
                "TrajectoryReplay.restore_handoff (docs/snapshots.md)"
            )
        run = r.run(child)
        status = r.run_status(run)
        attempts = r.attempts(run.id)
    if run.mode != RunMode.HANDOFF.value:
        raise UsageError(
            f"{named}: run {child} is a {run.mode} run, not a handoff's child run (created pending by "
            "TrajectoryReplay.restore_handoff)"
        )
    if claimed:
        return run
    if status == "restoring":
        raise UsageError(
            f"{named}: the handoff's child run {child} is still being restored (its restore_handoff has not "
            f"finished; one that died leaves it so: pvisor journal rm {child}, and hand the pause off again)"
        )
    if status != "pending":
        what = (
            f"attempt {len(attempts)} began {_when(attempts[-1].started_ms)}"
            if attempts
            else "it has exchanges"
        )
        raise UsageError(
            f"{named}: the handoff's child run {child} was started already ({what}): a child run "
            "starts once; hand the pause off again under a new child id"
        )
    return run


def claim_child(journal_path: Path, child: str, option: str = "--child-run") -> int:
    """Take the pending child run ``child`` for this start, in one transaction of the journal
    (:func:`~pvisor.journal.child_runs.claim_child_run`), before the agent starts: of starts made
    at once exactly one gets it; the others raise the UsageError (exit 2) of
    :func:`child_target` for a child run started already. Returns when it was claimed (Unix
    epoch ms: its attempt 1's start)."""
    when = int(time.time() * 1000)
    outcome = claim_child_run(journal_path, child, when)
    if outcome is Claim.CLAIMED:
        return when
    child_target(journal_path, child, option)  # says why, as for a start made later
    raise UsageError(  # the winner released it meanwhile: still, this start did not get it
        f"{child_named(option, child)}: another start took the handoff's child run {child}: a child run "
        "starts once"
    )


def _when(ms: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def workspace_manifest_digest(workspace: Path, start: Any = None) -> str | None:
    """The manifest digest of ``workspace`` as a snapshot of it would have (the ``start``
    snapshot's when one was taken; else a walk that stores nothing), or None when it cannot be
    read."""
    if start is not None and getattr(start, "digest", None):
        return start.digest
    import hashlib

    from pvisor.journal.snapshots import FilesystemDriver

    try:
        return FilesystemDriver().checkpoint(workspace, lambda b: hashlib.sha256(b).hexdigest()).digest()
    except (OSError, UsageError):
        return None


def check_child_workspace(child: Run, digest: str | None, where: str, warn: Warn) -> bool:
    """Warn (one line) when ``digest``, the manifest digest of the workspace the child run starts
    from (``where``), differs from the snapshot its handoff restored; True when they agree."""
    want = child.workspace_snapshot
    if not want or digest == want:
        return True
    warn(
        f"{where} differs from the snapshot the handoff restored for child run {child.id} (manifest "
        f"{want[:12]}, {'now ' + digest[:12] if digest else 'unreadable'}): the agent starts from another "
        "state"
    )
    return False


def _write_files(files: dict[Path, str]) -> None:
    """Write the plan's files: mode 0600, missing parent directories 0700."""
    for path, text in files.items():
        make_directories(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)


# --------------------------------------------------------------------------- the run


class _Signalled(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP) before the run's event loop handles them."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_agent(req: RunRequest, warn: Warn) -> RunReport:
    """Run one attempt (see the module docstring). Raises PvisorError for pvisor's own
    failures, and with exit code 128 + N for a stop signal N (SIGINT, SIGTERM, SIGHUP) that came
    before the agent started (the version check); the agent's exit code, a timeout and a later
    interruption are in the report."""

    def raise_signalled(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, raise_signalled)
    try:
        return _run_agent(req, warn)
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        raise PvisorError(
            f"interrupted by {signal.Signals(signum).name} before {req.agent} started; nothing was run",
            exit_code=128 + signum,
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_utf8(option: str, value: str | os.PathLike | None) -> None:
    """Raise UsageError (exit 2) when ``value`` (as Python decoded it from the command line or
    the environment, undecodable bytes as lone surrogates) is not valid UTF-8 text: the journal
    stores text, and the agents' JSON cannot carry such bytes."""
    shown = not_utf8(value)
    if shown is not None:
        raise UsageError(
            f"{option} '{shown}' is not valid UTF-8 (the bytes shown as \\xNN); give UTF-8 text or paths"
        )


def _run_agent(req: RunRequest, warn: Warn) -> RunReport:
    for option, value in (
        ("the task", req.task),
        ("--model", req.model),
        ("--workspace", req.workspace),
        ("--journal", req.journal_path),
        ("--agent-entrypoint", req.entrypoint),
        ("--script", req.script),
        ("--upstream", req.upstream),
        ("--resume", req.resume),
        (req.child_option, req.child_run),
    ):
        check_utf8(option, value)
    if req.child_run is not None and req.resume is not None:
        raise UsageError(
            f"{req.child_option} starts a handoff's child run, --resume continues a run: give one of them"
        )
    if req.resume is not None and not req.resume.strip():
        raise UsageError(
            "--resume is empty: give the id of the run to continue (pvisor journal ls lists them)"
        )
    profile = get_profile(req.agent)
    if req.intercept is not None and not profile.intercept_verified:
        warn(
            f"intercept mode is not verified with {profile.title} (docs/agents.md): the run goes on; check that "
            "its exchanges reached the journal"
        )
    if req.snapshots:
        from pvisor.journal.snapshots import snapshot_driver

        snapshot_driver(req.snapshot_driver)  # an unknown driver is a usage error before anything starts
    if req.upstream and req.script:
        raise UsageError("give --upstream URL or --script FILE, not both")
    if req.responder is not None and (req.script or req.resume):
        raise UsageError("a run under a responder takes no --script or --resume")
    if req.upstream:
        from pvisor.gateway.routing import check_upstream_url

        try:
            check_upstream_url(req.upstream)
        except ValueError as exc:
            raise UsageError(f"--upstream {without_userinfo(req.upstream)}: {exc}") from None
    if not req.task.strip():
        raise UsageError(
            'give the task after --, e.g. pvisor run --agent claude-code -- "fix the failing test"'
        )
    unfit = profile.task_unfit(req.task)
    if unfit is not None:
        raise UsageError(f"the task {unfit}")
    if req.timeout <= 0:
        raise UsageError(f"--timeout must be more than 0 seconds, not {req.timeout:g}")
    resume = _resume_target(req, profile) if req.resume else None
    child = (
        child_target(req.journal_path, req.child_run, req.child_option, claimed=req.child_claimed is not None)
        if req.child_run is not None
        else None
    )
    exe = find_executable(profile, req.entrypoint)
    use_home = resume.use_home if resume else req.use_home
    if resume and req.use_home != resume.use_home:
        warn(
            f"run {resume.run.id} was captured {'with' if resume.use_home else 'without'} --use-home; its resume does the same"
        )
    workspace = req.workspace or (resume.workspace if resume else None)
    if workspace is None and child is not None and child.labels.get("workspace"):
        workspace = Path(child.labels["workspace"])  # where the handoff restored the pause
    if workspace is None and cwd_gone():
        raise UsageError(f"no --workspace, and {CWD_GONE_HINT} (the default workspace)")
    workspace = Path(absolute(workspace or os.curdir, f"--workspace {workspace}"))
    if not workspace.is_dir():
        raise UsageError(f"workspace {workspace} is not a directory")
    model = req.model or (resume.run.labels.get("model") if resume else None)
    if req.script or req.responder is not None:
        model = model or profile.script_model
    elif profile.needs_model and not model:
        raise UsageError(
            f"{profile.title} needs a model name with --upstream or the public API: give --model NAME"
        )
    script = None
    if req.script:  # before the version check: a wrong script is told at once
        from pvisor.gateway.scripted_model import load_script

        if not os.path.exists(req.script):
            raise UsageError(
                f"--script {req.script}: no such file (expected a JSON or TOML script, docs/scripted-model.md)"
            )
        script = load_script(req.script)  # BadInputError (65) names the file and field
    version = check_version(
        profile, exe, use_home=use_home, allow_unsupported=req.allow_unsupported, warn=warn
    )
    run_id = resume.run.id if resume else child.id if child is not None else new_run_id()
    run_dir = run_dir_of(req.journal_path, run_id)
    try:
        run_dir.relative_to(workspace)
        warn(
            f"the run directory {run_dir} is inside the workspace {workspace}: the agent can see it (use --journal elsewhere)"
        )
    except ValueError:
        pass
    if child is not None and req.child_claimed is None:
        # in the journal, before anything of the run is made: of two starts at once one goes on
        req.child_claimed = claim_child(req.journal_path, child.id, req.child_option)
    try:
        return asyncio.run(
            _run(
                req,
                profile,
                exe,
                version,
                resume,
                run_id,
                run_dir,
                workspace,
                model,
                script,
                use_home,
                warn,
                child,
            )
        )
    except BaseException:
        if child is not None:
            release_child(req.journal_path, child.id)
        raise


def release_child(journal_path: Path, child: str) -> None:
    """Give the claim of the child run ``child`` back when its start failed before the agent ran
    (the attempt was not recorded), so that it can be started later; a journal locked past the
    busy timeout keeps the claim (``journal ls`` then shows the run open)."""
    try:
        release_child_run(journal_path, child)
    except PvisorError:
        pass


async def _run(
    req: RunRequest,
    profile: AgentProfile,
    exe: str,
    version: str | None,
    resume: _Resume | None,
    run_id: str,
    run_dir: Path,
    workspace: Path,
    model: str | None,
    script: Any,
    use_home: bool,
    warn: Warn,
    child: Run | None = None,
) -> RunReport:
    from pvisor.gateway.proxy import GatewayConfig, os_error_reason
    from pvisor.gateway.scripted_model import ScriptedModel
    from pvisor.gateway.scripted_responder import ScriptedResponder
    from pvisor.session.session import Session, Snapshots, StopSignals

    attempt = resume.attempt if resume else 1
    session = None
    stop = StopSignals()
    stop.install()  # from here on a signal stops the agent and the attempt still ends in the journal
    become_subreaper()
    try:
        responder = None
        if req.responder is not None:
            # replay's playback answers in the gateway; nothing is forwarded, no key is needed
            home = None if use_home else run_dir / "home"
            responder = req.responder(RunSetup(run_id, run_dir, home, workspace))
            if req.upstream:  # a continuation: what the responder forwards goes to the live upstream
                config = GatewayConfig(
                    host="127.0.0.1",
                    port=req.port,
                    upstreams={profile.upstream: req.upstream},
                    run=run_id,
                    attempt=attempt,
                    shutdown_grace=5.0,
                )
            else:
                config = GatewayConfig(
                    host="127.0.0.1",
                    port=req.port,
                    run=run_id,
                    attempt=attempt,
                    shutdown_grace=5.0,
                    offline=True,
                )
            upstream_label = req.upstream_label or "responder"
        elif script is not None:
            # the scripted model answers in the gateway itself (served_by: scripted); nothing is forwarded
            responder = ScriptedResponder(ScriptedModel(script))
            config = GatewayConfig(
                host="127.0.0.1", port=req.port, run=run_id, attempt=attempt, shutdown_grace=5.0, offline=True
            )
            upstream_label = "script:" + absolute(req.script or "", f"--script {req.script}")
        else:
            upstream_url = req.upstream or UPSTREAMS[profile.upstream][0]
            upstream_label = without_userinfo(upstream_url)
            # one explicit upstream: paths no protocol owns (Claude's HEAD /api/hello, GET /v1/models) go to it too
            config = GatewayConfig(
                host="127.0.0.1",
                port=req.port,
                upstreams={profile.upstream: upstream_url},
                run=run_id,
                attempt=attempt,
                shutdown_grace=5.0,
            )
        if req.max_response_body is not None:
            config.max_response_body = req.max_response_body
        if req.intercept is not None:
            _intercept_gateway(req, profile, config)
        # the journal and the runs' own files (their private homes) never go into snapshots
        snapshots = Snapshots(workspace, req.snapshot_driver, (req.journal_path, run_dir.parent))
        # signals (installed above), address, journal, gateway, mitmdump; one stop order
        session = Session(
            req.journal_path,
            config,
            responder,
            intercept=req.intercept,
            snapshots=snapshots if req.snapshots else None,
            signals=stop,
            journal_wait=JOURNAL_WAIT_S,
        )
        try:
            url = await session.start()  # the journal is opened once the port is bound
        except OSError as exc:
            raise UnavailableError(
                f"cannot listen on 127.0.0.1:{req.port}: {os_error_reason(exc)} (give another --port, or 0 for a free one)"
            ) from None
        return await _attempt(
            req,
            profile,
            exe,
            version,
            resume,
            run_id,
            run_dir,
            workspace,
            model,
            use_home,
            warn,
            attempt,
            url,
            upstream_label,
            session.gateway,
            session.journal,
            stop,
            responder,
            session.proxy,
            child,
        )
    finally:
        if session is not None:  # the gateway, mitmdump, the journal, the signal handlers
            await session.stop()
        stop.remove()  # a failure before the session was made


def _intercept_gateway(req: RunRequest, profile: AgentProfile, config: Any) -> None:
    """Make ``config`` serve intercept mode's mitmdump: an ``--upstream`` becomes the redirect
    of the agent's public model host (its requests go there instead)."""
    from pvisor.gateway.intercept import host_entry, serve_intercepted
    from yarl import URL

    if req.upstream:
        key, origin = host_entry(URL(UPSTREAMS[profile.upstream][0]))
        req.intercept.redirects[key] = (origin, req.upstream.rstrip("/"))
    serve_intercepted(config, req.intercept)


def _through_proxy(
    env: dict[str, str], profile: AgentProfile, intercept: Any, proxy: Any, warn: Warn
) -> None:
    """The agent's environment for intercept mode: ``HTTPS_PROXY``, the CA variables its runtime
    reads (:attr:`~pvisor.adapters.agents.base.AgentProfile.ca_env`), ``NO_PROXY`` without the
    intercepted hosts, and no base-URL variable the agent needs none of."""
    from pvisor.gateway.intercept import default_confdir, intercept_env

    confdir = intercept.confdir or default_confdir()
    changes, dropped = intercept_env(proxy.url, confdir, profile.ca_env, intercept.intercepted(), env)
    env.update(changes)
    for name in profile.intercept_unset_env:
        env.pop(name, None)
    if dropped:
        warn(
            f"NO_PROXY: left out {', '.join(dropped)} for the agent: it would send its model requests around the proxy"
        )


async def _attempt(
    req: RunRequest,
    profile: AgentProfile,
    exe: str,
    version: str | None,
    resume: _Resume | None,
    run_id: str,
    run_dir: Path,
    workspace: Path,
    model: str | None,
    use_home: bool,
    warn: Warn,
    attempt: int,
    url: str,
    upstream_label: str,
    gw: Any,
    journal: Any,
    stop: StopSignals,
    responder: Any = None,
    proxy: Any = None,
    child: Run | None = None,
) -> RunReport:
    make_directories(run_dir)  # runs/ too, 0700 whatever the umask
    os.chmod(run_dir, 0o700)
    home = None if use_home else run_dir / "home"
    if home is not None:
        home.mkdir(exist_ok=True, mode=0o700)
    ctx = LaunchContext(
        executable=exe,
        # intercept mode: the agent addresses the model API's own host, through HTTPS_PROXY
        base_url=UPSTREAMS[profile.upstream][0] if proxy is not None else f"{url}/run/{run_id}",
        run_dir=run_dir,
        home=home,
        workspace=workspace,
        attempt=attempt,
        model=model,
        api_key=SCRIPT_API_KEY
        if req.script or req.dummy_key or (responder is not None and not req.upstream)
        else None,
    )
    plan = profile.plan(ctx, req.task, session_id=resume.session_id if resume else None)
    if req.agent_args:
        plan.argv = profile.with_arguments(plan.argv, req.agent_args)
    _write_files(plan.files)
    env = apply_env({**os.environ, **req.agent_env}, plan.env)
    if proxy is not None:
        _through_proxy(env, profile, req.intercept, proxy, warn)
    env["PWD"] = str(
        workspace
    )  # as a shell sets it: OpenCode takes its directory from $PWD, not from its cwd
    tmp = (
        run_dir / "tmp"
    )  # the agent's and its tools' temporary files stay with the run, not in a shared /tmp
    tmp.mkdir(exist_ok=True, mode=0o700)
    env.update(TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp))
    labels = {
        "workspace": str(workspace),
        "run_dir": str(run_dir),
        "home": str(home) if home else "user",
        "upstream": upstream_label,
        "task": req.task,
        **req.labels,
    }
    if model:
        labels["model"] = model
    if proxy is not None:
        labels["capture"] = "intercept"
    if child is not None:
        # the handoff's pending child run: filed under its id, its mode and lineage kept
        labels["started_as"] = req.mode
        journal.update_run(run_id, agent=profile.name, agent_version=version, argv=plan.argv, labels=labels)
    elif resume is None:
        journal.create_run(
            Run(
                id=run_id,
                agent=profile.name,
                agent_version=version,
                argv=plan.argv,
                mode=req.mode,
                labels=labels,
                parent_run=req.parent_run,
                boundary_step=req.boundary_step,
            )
        )
    stdout_path = run_dir / f"attempt-{attempt}.stdout"
    stderr_path = run_dir / f"attempt-{attempt}.stderr"
    journal.start_attempt(
        Attempt(
            run=run_id,
            n=attempt,
            # a child run's attempt began when this start claimed it (what a refused start says)
            started_ms=req.child_claimed or 0,
            labels={
                "argv": orjson.dumps(plan.argv).decode(),
                "agent_version": version or "",
                "stdout": str(stdout_path),
                "stderr": str(stderr_path),
            },
        )
    )
    journal.flush(JOURNAL_WAIT_S)  # the run and attempt rows exist before the first exchange arrives

    start = await gw.take_snapshot(SnapshotKind.START)  # the workspace as the agent finds it
    if child is not None and req.responder is None:
        # the next agent starts where the handoff restored the pause (a replay compares at N)
        digest = await asyncio.get_running_loop().run_in_executor(
            None, workspace_manifest_digest, workspace, start
        )
        check_child_workspace(child, digest, f"workspace {workspace}", warn)
    ended = getattr(responder, "ended", None)
    # pvisor's own helpers are no strays of the agent: the journal's writer, intercept's mitmdump
    keep = (*journal.processes, *((proxy.pid,) if proxy is not None and proxy.pid else ()))
    returncode, timed_out, interrupted, strays, after_end = await _launch(
        plan,
        env,
        workspace,
        stdout_path,
        stderr_path,
        req.timeout,
        run_id,
        attempt,
        journal,
        stop,
        ended,
        req.end_grace,
        keep,
    )
    stopped = timed_out or interrupted or after_end
    if stopped:
        # the agent was stopped: its requests still in flight (a live model thinking) have no
        # one to answer; they are cut at once and recorded incomplete
        gw.hurry()
    await gw.drain(1.0 if stopped else 10.0)
    end = await gw.take_snapshot(SnapshotKind.END)  # the last step's tools have run

    stdout = stdout_path.read_bytes() if stdout_path.exists() else b""
    session_id = profile.session_id(stdout) if profile.json_stdout else None
    native = await _native(profile, ctx, plan, session_id, env, workspace, warn, keep)
    own = profile.final_status(stdout, native)
    report = RunReport(
        run=run_id,
        attempt=attempt,
        agent=profile.name,
        agent_version=version,
        exit_code=0,
        agent_exit_code=exit_status(returncode),
        timed_out=timed_out,
        interrupted=interrupted,
        workspace=workspace,
        run_dir=run_dir,
        stdout=stdout_path,
        stderr=stderr_path,
        gateway=url,
        intercept_proxy=proxy.url if proxy is not None else None,
        argv=plan.argv,
        session_id=session_id,
        native_path=native,
        stray_processes_killed=strays,
        interrupt_signal=signal.Signals(stop.signum).name if interrupted and stop.signum else None,
        stopped_after_end=after_end,
        agent_status=own,
    )
    report.exit_code = stop.exit_code if interrupted else 124 if timed_out else (report.agent_exit_code or 0)
    if report.failed_by_own_account:
        report.exit_code = EXIT_AGENT_FAILED
    if strays:
        warn(
            f"the agent left {strays} process(es) running after it {'was stopped' if timed_out or interrupted else 'exited'}; "
            "pvisor ended them"
        )

    await gw.stop()  # every exchange (and every snapshot) is recorded before the steps are derived
    journal.flush(JOURNAL_WAIT_S)
    _derive_steps(report, journal, profile, warn)
    _snapshot_warnings(report, start, end, warn)
    if report.agent_exit_code == 0 and report.steps == 0 and not report.attempt_steps:
        warn(
            f"{profile.title} exited with code 0 but no step was captured: it sent no request to the model (did it read the "
            f"task as an option, or fail before starting? see {stdout_path} and {stderr_path})"
        )
    run_labels: dict[str, str] = {}
    attempt_labels = {"timed_out": "true" if timed_out else "false"}
    if interrupted:
        attempt_labels["interrupted"] = report.interrupt_signal or "true"
    if strays:
        attempt_labels["stray_processes_killed"] = str(strays)
    attempt_labels["agent_outcome"] = own.outcome.value
    if own.detail:
        attempt_labels["agent_detail"] = own.detail
    if session_id:
        run_labels["session_id"] = attempt_labels["session_id"] = session_id
    if native:
        run_labels["native_path"] = attempt_labels["native_path"] = str(native)
    if run_labels:
        journal.update_run(run_id, labels=run_labels)
    journal.end_attempt(run_id, attempt, report.agent_exit_code, attempt_labels)
    journal.flush(JOURNAL_WAIT_S)
    return report


async def _launch(
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
) -> tuple[int | None, bool, bool, int, bool]:
    """Run the agent; returns (returncode, timed out, interrupted, stray processes ended,
    stopped after the end). On ``--timeout`` or a stop signal the agent's process group is
    stopped; so it is ``end_grace`` seconds after ``ended`` is set (the responder told it to
    end, and it goes on); then, as after a normal exit, every process it left behind
    (:func:`end_strays`). A launch failure ends the attempt in the journal and raises
    UnavailableError."""
    if stop.event.is_set():  # a signal came while the gateway started: never start the agent
        return None, False, True, 0, False
    with open_private(stdout_path) as out, open_private(stderr_path) as err:
        try:
            proc = await asyncio.create_subprocess_exec(
                *plan.argv,
                stdin=subprocess.DEVNULL if plan.stdin is None else subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=str(workspace),
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument (checked before)
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            journal.end_attempt(run_id, attempt, None, {"error": f"cannot start the agent: {why}"})
            raise AgentUnavailable(f"cannot start {plan.argv[0]}: {why}") from None
    guard = GroupGuard(proc.pid)  # the agent leads its own group (its own session)
    feed = asyncio.ensure_future(_feed(proc, plan.stdin)) if plan.stdin is not None else None
    try:
        return await _supervise(proc, guard, timeout, keep, stop, ended, end_grace)
    finally:
        if feed is not None:
            feed.cancel()
        guard.release()


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
) -> tuple[int | None, bool, bool, int, bool]:
    """Wait for the agent of :func:`_launch` until it exits, times out, is stopped or outlives
    its end; then end what it left behind."""
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
        await stop_group(proc, stop.hurry)
    await waiter
    # what the agent left running: in its group (shell jobs, helpers) or in sessions of their own
    keep = (*keep, *((guard.pid,) if guard.pid is not None else ()))
    strays = await end_strays(hurry=stop.hurry, keep=keep)
    end_group(proc.pid, kill=True)  # where /proc cannot be walked (not Linux): at least its group
    return proc.returncode, timed_out, interrupted, strays, after_end


async def _after(event: asyncio.Event, grace: float) -> None:
    """Return ``grace`` seconds after ``event`` is set."""
    await event.wait()
    await asyncio.sleep(grace)


async def _native(
    profile: AgentProfile,
    ctx: LaunchContext,
    plan: LaunchPlan,
    session_id: str | None,
    env: dict[str, str],
    workspace: Path,
    warn: Warn,
    keep: Collection[int] = (),
) -> Path | None:
    """The native trajectory: exported (OpenCode) or found by session id / fixed path."""
    export = profile.export_plan(ctx, session_id)
    if export is None:
        return profile.find_native(ctx, session_id, plan)
    err_path = export.output.with_suffix(".stderr")
    with open_private(export.output) as out, open_private(err_path) as err:
        proc = await asyncio.create_subprocess_exec(
            *export.argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=str(workspace),
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        try:
            await asyncio.wait_for(proc.wait(), EXPORT_TIMEOUT_S)
        except asyncio.TimeoutError:
            await stop_group(proc)
    await end_strays(keep=keep)
    if proc.returncode != 0 or export.output.stat().st_size == 0:
        warn(
            f"`{' '.join([os.path.basename(export.argv[0]), *export.argv[1:]])}` failed (exit {exit_status(proc.returncode)}; see {err_path}): no native trajectory"
        )
        return None
    return export.output


def _attempt_steps(classification: Any, attempt: int) -> list[dict[str, Any]]:
    """Per chain of the agent's own loop that ``attempt`` sent requests in: its number, its
    requests (steps) from this attempt, and whether it is the run's main chain. A chain counts
    as the agent's loop when it is the main chain or starts with the main chain's system prompt
    and tools (a resume that regenerated its first context message); title and memory requests
    have other ones and are left out."""
    main = classification.main
    if main is None:
        return []
    out = []
    for chain in classification.chains:
        if chain is not main and (chain.first.system_key, chain.first.tools_key) != (
            main.first.system_key,
            main.first.tools_key,
        ):
            continue
        n = sum(1 for slot in chain.slots if slot.kept.exchange.attempt == attempt)
        if n:
            out.append({"chain": chain.number, "steps": n, "main": chain is main})
    return out


def _snapshot_warnings(report: RunReport, start: Any, end: Any, warn: Warn) -> None:
    """Say once what the start and end snapshots could not hold (a file over the size limit):
    the user learns it now, not when restoring. A walk that failed is in the report too (the
    gateway's log said it on stderr when it happened)."""
    seen: list[str] = []
    shown = 0
    for snap in (start, end):
        if snap is None:
            continue
        for line in ([f"failed: {snap.error}"] if snap.error else []) + snap.warnings:
            if line in seen:
                continue
            seen.append(line)
            if line.startswith("failed: "):
                continue
            shown += 1
            if shown <= 5:
                warn(f"workspace snapshot: {line}")
    report.snapshot_warnings = seen
    if shown > 5:
        warn(f"workspace snapshot: {shown - 5} more (pvisor snapshot ls {report.run})")


def _derive_steps(report: RunReport, journal: Any, profile: AgentProfile, warn: Warn) -> None:
    """Classify the run's exchanges with the chain rule, store their roles and count the steps
    (the whole run: every attempt). A failure here is a warning: the capture itself is done."""
    from pvisor.adapters.chains import classify_run
    from pvisor.adapters.journal_trajectory import build_trajectory

    try:
        with JournalReader(journal.path) as reader:
            classification = classify_run(reader, report.run, prefer=profile.chain_hint)
            trajectory = build_trajectory(reader, classification)
            attempts = {ex.id: ex.attempt for ex in reader.exchanges(report.run)}
            reader_snapshots = reader.snapshots(report.run)
    except PvisorError as exc:
        report.steps_error = exc.message
    except Exception as exc:  # a bug in deriving steps must not lose the agent's exit code
        report.steps_error = f"{type(exc).__name__}: {exc}"
    else:
        roles = classification.roles()
        journal.set_exchange_roles(report.run, roles)
        snapshots = reader_snapshots
        if snapshots:
            from pvisor.replay.snapshots import bind_steps

            journal.bind_snapshots(report.run, bind_steps(snapshots, trajectory))
        report.snapshots = len(snapshots)
        report.steps = len(trajectory.steps)
        report.tool_calls_per_step = [len(s.action.tool_calls) for s in trajectory.steps]
        report.exchanges = len(roles)
        report.main_exchanges = sum(1 for _, role in roles.values() if role == "main")
        report.auxiliary_exchanges = sum(1 for _, role in roles.values() if role == "auxiliary")
        report.chains = len(classification.chains)
        report.main_chain = classification.main.number if classification.main is not None else None
        report.attempt_chains = sorted(
            {
                chain
                for ex_id, (chain, _) in roles.items()
                if chain is not None and attempts.get(ex_id) == report.attempt
            }
        )
        report.attempt_steps = _attempt_steps(classification, report.attempt)
        return
    warn(f"run {report.run}: the steps could not be derived: {report.steps_error}")
