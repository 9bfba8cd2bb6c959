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
   such process left when the agent ends is ended too (:func:`~pvisor.session.supervise.end_strays`).
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
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson
from pvisor.adapters.agents import get_profile
from pvisor.adapters.agents.base import (
    AgentProfile,
    AgentStatus,
    LaunchContext,
    LaunchPlan,
    offline_credentials,
)
from pvisor.adapters.protocols import UPSTREAMS
from pvisor.core.errors import BadInputError, OutputError, PvisorError, UnavailableError, UsageError
from pvisor.gateway.intercept import default_confdir, host_entry, intercept_env
from pvisor.gateway.proxy import GatewayConfig, os_error_reason
from pvisor.gateway.responder import Responder
from pvisor.gateway.routing import USERINFO_REFUSED, check_upstream_url, has_userinfo
from pvisor.gateway.scripted_model import ScriptedModel, load_script
from pvisor.gateway.scripted_responder import ScriptedResponder
from pvisor.journal.model import Attempt, Run
from pvisor.journal.paths import (
    CWD_GONE_HINT,
    absolute,
    cwd_gone,
    make_directories,
    not_utf8,
    run_directory,
)
from pvisor.journal.producer import new_run_id
from pvisor.journal.reader import JournalReader
from pvisor.journal.redact import redact_path
from pvisor.journal.snapshots import SnapshotKind, snapshot_driver
from pvisor.session.children import (
    check_child_workspace,
    child_target,
    claim_child,
    release_child,
    workspace_manifest_digest,
)
from pvisor.session.launch import (
    apply_env,
    check_version,
    find_executable,
    launch_agent,
    native_trajectory,
    open_outputs,
    read_output,
    vetted_native,
    write_files,
)
from pvisor.session.limits import ResourceLimits, RunCgroup
from pvisor.session.run_report import EXIT_AGENT_FAILED, RunReport
from pvisor.session.containment import AgentKey, agent_sandbox, key_swap, relay_proxy, sandbox_mode
from pvisor.session.sandbox import (
    Sandbox,
    SandboxMode,
    SandboxNetwork,
    sandbox_record,
)
from pvisor.session.session import Session, SessionConfig, StopSignals
from pvisor.session.start_env import recorded_environment
from pvisor.session.steps import derive_steps, snapshot_warnings
from pvisor.session.supervise import STOP_SIGNALS, become_subreaper, exit_status
from yarl import URL

#: the key given to an agent that talks to the scripted model (it checks nothing)
SCRIPT_API_KEY = "pvisor-scripted-model-key"

#: how long the run waits for the journal when another process holds its write lock: the
#: writer keeps everything in memory meanwhile and warns every 30 s (a run is never lost to a
#: lock held for seconds or minutes)
JOURNAL_WAIT_S = 600.0

#: exit code after Ctrl-C (SIGINT); SIGHUP gives 129 and SIGTERM 143 (128 + signal number)
EXIT_INTERRUPTED = 130

Warn = Callable[[str], None]


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
    profile's own settings win), those named in ``private_env`` never recorded (start_env.py);
    ``agent_args``: more launch arguments
    (:meth:`~pvisor.adapters.agents.base.AgentProfile.with_arguments`); ``dummy_key``: give the
    agent a dummy key even with an upstream or the public API (``--dummy-key``): the user's key
    of the profile's ``key_env`` (from ``agent_env``, else pvisor's environment) goes to the
    gateway, which puts it in place of the dummy when it forwards (:func:`key_swap`), and every
    other model-provider credential variable is removed from the agent's environment, as in an
    offline run (:func:`~pvisor.adapters.agents.base.offline_credentials`); with
    no such key (a local model server that checks none) the dummy is forwarded as it is.
    ``snapshots``: snapshot the workspace at the start,
    at every candidate main-loop request and at the end (``--no-snapshots`` turns it off), with
    the driver ``snapshot_driver``. ``intercept``: run the agent through intercept mode (an
    :class:`~pvisor.gateway.intercept.InterceptConfig`: ``HTTPS_PROXY`` and pvisor's CA instead
    of a base URL pointing at the gateway; docs/intercept.md), None for the reverse proxy.
    ``child_run``: run as the pending child run of a handoff (``TrajectoryReplay.restore_handoff``
    created it): the run is filed under that id, its lineage kept, once
    (:func:`~pvisor.session.children.child_target`); the workspace defaults to where the handoff
    restored it. ``child_option``: how errors name it (``--child-run``, or a Python caller's
    ``child_run=``). The child run is claimed in the journal before the run starts
    (:func:`~pvisor.session.children.claim_child`) unless ``child_claimed`` says when this
    process claimed it already (a replay, before restoring its workspace; Unix epoch ms: the
    attempt's start), and given back when the start fails before the agent ran.
    ``max_response_body``: the gateway's ``--max-response-body`` (None: its default).
    ``sandbox``: where the agent runs (:class:`~pvisor.session.sandbox.SandboxMode`: ``none``
    for ``pvisor run`` unless asked; ``auto`` resolves to bwrap or none), ``sandbox_network``
    its network rule, ``sandbox_allow`` more writable paths, ``sandbox_hide`` more hidden ones
    (a replay's recorded workspace). ``sandbox_memory`` (bytes) and ``sandbox_cpus`` (CPUs):
    the limits of a cgroup the agent (or its sandbox) is started in, with or without a sandbox
    (:mod:`pvisor.session.limits`; None: no limit; UnavailableError, exit 69, before anything
    is recorded where no cgroup can be made).
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
    pause_transition: int | None = None
    workspace_snapshot: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    upstream_label: str | None = None
    end_grace: float = 30.0
    agent_env: dict[str, str] = field(default_factory=dict)
    private_env: frozenset[str] = frozenset()
    agent_args: list[str] = field(default_factory=list)
    dummy_key: bool = False
    snapshots: bool = True
    snapshot_driver: str = "filesystem"
    intercept: Any = None
    child_run: str | None = None
    child_option: str = "--child-run"
    child_claimed: int | None = None
    max_response_body: int | None = None
    sandbox: SandboxMode = SandboxMode.NONE
    #: what was asked for when a caller resolved ``sandbox`` itself (replay: ``auto``), for the
    #: record's ``fallback``; None: ``sandbox`` as asked
    sandbox_asked: SandboxMode | None = None
    sandbox_network: SandboxNetwork = SandboxNetwork.GATEWAY
    sandbox_allow: list[Path] = field(default_factory=list)
    sandbox_hide: list[Path] = field(default_factory=list)
    sandbox_memory: int | None = None
    sandbox_cpus: float | None = None

    @property
    def limits(self) -> ResourceLimits | None:
        """The cgroup's limits, None without ``sandbox_memory`` and ``sandbox_cpus``."""
        if self.sandbox_memory is None and self.sandbox_cpus is None:
            return None
        return ResourceLimits(memory=self.sandbox_memory, cpus=self.sandbox_cpus)


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


def data_dir_of(journal_path: Path) -> Path:
    """The data directory: the directory holding the journal file."""
    return Path(absolute(journal_path, f"--journal {journal_path}")).parent


def run_dir_of(journal_path: Path, run_id: str) -> Path:
    """``<data dir>/runs/<run id>``."""
    return run_directory(journal_path, run_id)


def without_userinfo(url: str) -> str:
    """``url`` without its user info (``https://user:key@host`` -> ``https://host``) and with a
    key-shaped path segment ``REDACTED`` (a key pasted into the base path): how an upstream URL
    is shown in labels, results and errors."""
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
            f"{profile.title} has no native resume; --resume works with the agents that have one "
            "(docs/agents.md)"
        )
    path = Path(req.journal_path)
    if not path.exists():
        raise UsageError(f"no run {req.resume!r} to resume: journal {path} does not exist")
    with JournalReader(path) as r:
        run = r.run(req.resume)
        attempts = r.attempts(run.id)
    if run.agent != profile.name:
        raise UsageError(
            f"run {run.id} was captured with {run.agent or 'an unknown agent'}, not {profile.name}; give "
            f"--agent {run.agent}"
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


def _check_request(req: RunRequest, warn: Warn) -> AgentProfile:
    """The checks of ``req`` that need nothing run: text that is not UTF-8, options that do not go
    together, an unknown snapshot driver, an upstream that is no URL, an empty or unfit task, a
    timeout of 0. Returns the agent's launch profile; UsageError (exit 2) for the first problem."""
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
            f"intercept mode is not verified with {profile.title} (docs/agents.md): the run goes on; check "
            "that its exchanges reached the journal"
        )
    if req.snapshots:
        snapshot_driver(req.snapshot_driver)  # an unknown driver is a usage error before anything starts
    if req.upstream and req.script:
        raise UsageError("give --upstream URL or --script FILE, not both")
    if req.responder is not None and (req.script or req.resume):
        raise UsageError("a run under a responder takes no --script or --resume")
    if req.upstream:
        try:
            check_upstream_url(req.upstream)
        except ValueError as exc:
            raise UsageError(f"--upstream {without_userinfo(req.upstream)}: {exc}") from None
        if has_userinfo(req.upstream):
            raise UsageError(f"--upstream {without_userinfo(req.upstream)}: {USERINFO_REFUSED}")
    if not req.task.strip():
        raise UsageError(
            'give the task after --, e.g. pvisor run --agent claude-code -- "fix the failing test"'
        )
    unfit = profile.task_unfit(req.task)
    if unfit is not None:
        raise UsageError(f"the task {unfit}")
    if req.timeout <= 0:
        raise UsageError(f"--timeout must be more than 0 seconds, not {req.timeout:g}")
    return profile


def _workspace_of(req: RunRequest, resume: _Resume | None, child: Run | None) -> Path:
    """The agent's workspace, absolute: ``--workspace``, else the resumed run's, else where the
    handoff restored a child run's pause, else the current directory. UsageError (exit 2) when it
    is no directory or the current directory is gone."""
    workspace = req.workspace or (resume.workspace if resume else None)
    if workspace is None and child is not None and child.labels.get("workspace"):
        workspace = Path(child.labels["workspace"])  # where the handoff restored the pause
    if workspace is None and cwd_gone():
        raise UsageError(f"no --workspace, and {CWD_GONE_HINT} (the default workspace)")
    workspace = Path(absolute(workspace or os.curdir, f"--workspace {workspace}"))
    if not workspace.is_dir():
        raise UsageError(f"workspace {workspace} is not a directory")
    return workspace


def _model_of(req: RunRequest, profile: AgentProfile, resume: _Resume | None) -> str | None:
    """The model the agent is told to use: ``--model``, else the resumed run's; the profile's
    scripted model with a script or a responder. UsageError (exit 2) when the agent needs one."""
    model = req.model or (resume.run.labels.get("model") if resume else None)
    if req.script or req.responder is not None:
        model = model or profile.script_model
    elif profile.needs_model and not model:
        raise UsageError(
            f"{profile.title} needs a model name with --upstream or the public API: give --model NAME"
        )
    return model


def _load_script(req: RunRequest) -> Any:
    """The ``--script`` loaded (None without one), before the version check: a wrong script is
    told at once. UsageError (exit 2) for a missing file, BadInputError (65) for a bad one."""
    if not req.script:
        return None
    if not os.path.exists(req.script):
        raise UsageError(
            f"--script {req.script}: no such file (expected a JSON or TOML script, docs/scripted-model.md)"
        )
    return load_script(req.script)  # BadInputError (65) names the file and field


def _sandbox_of(req: RunRequest, use_home: bool, warn: Warn) -> SandboxMode:
    """The sandbox the agent runs in (:func:`~pvisor.session.containment.sandbox_mode`), its
    ``--sandbox-allow`` paths checked for valid UTF-8 first (exit 2)."""
    for path in req.sandbox_allow:
        check_utf8("--sandbox-allow", path)
    return sandbox_mode(req, data_dir_of(req.journal_path), use_home, warn)


@dataclass
class _Start:
    """What the checks of :func:`_run_agent` settled, before anything of the run is made: the
    request, the agent's ``profile``, executable ``exe`` and ``version`` (None: unknown), the run
    resumed or the handoff's ``child`` run (or neither), the ``run_id`` and its ``run_dir``, the
    absolute ``workspace``, the ``model``, the loaded ``script`` and ``use_home``."""

    req: RunRequest
    profile: AgentProfile
    exe: str
    version: str | None
    resume: _Resume | None
    run_id: str
    run_dir: Path
    workspace: Path
    model: str | None
    script: Any
    use_home: bool
    child: Run | None
    warn: Warn
    #: the dummy key the agent gets in place of the user's (``dummy_key`` with a key to swap;
    #: set by :func:`session_config`), or None
    agent_key: str | None = None
    #: the resolved ``--sandbox`` (bwrap or none)
    sandbox: SandboxMode = SandboxMode.NONE
    #: the agent's sandbox once planned (:func:`~pvisor.session.containment.agent_sandbox`), None
    #: without one
    box: Sandbox | None = None
    #: the run's cgroup (``sandbox_memory``, ``sandbox_cpus``), None without limits
    cgroup: RunCgroup | None = None
    #: the key the agent was given (set by :func:`_prepare_launch`)
    key: AgentKey = AgentKey.AGENT

    @property
    def attempt(self) -> int:
        """The attempt's number: 1, or the next one of a resumed run."""
        return self.resume.attempt if self.resume else 1

    @property
    def home(self) -> Path | None:
        """The agent's private home in the run directory (None with ``--use-home``)."""
        return None if self.use_home else self.run_dir / "home"


def _run_agent(req: RunRequest, warn: Warn) -> RunReport:
    profile = _check_request(req, warn)
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
            f"run {resume.run.id} was captured {'with' if resume.use_home else 'without'} --use-home; its "
            "resume does the same"
        )
    workspace = _workspace_of(req, resume, child)
    model = _model_of(req, profile, resume)
    script = _load_script(req)
    sandbox = _sandbox_of(req, use_home, warn)
    version = check_version(
        profile, exe, use_home=use_home, allow_unsupported=req.allow_unsupported, warn=warn
    )
    run_id = resume.run.id if resume else child.id if child is not None else new_run_id()
    run_dir = run_dir_of(req.journal_path, run_id)
    try:
        run_dir.relative_to(workspace)
        warn(
            f"the run directory {run_dir} is inside the workspace {workspace}: the agent can see it (use "
            "--journal elsewhere)"
        )
    except ValueError:
        pass
    if child is not None and req.child_claimed is None:
        # in the journal, before anything of the run is made: of two starts at once one goes on
        req.child_claimed = claim_child(req.journal_path, child.id, req.child_option)
    start = _Start(
        req, profile, exe, version, resume, run_id, run_dir, workspace, model, script, use_home, child, warn,
        sandbox=sandbox,
    )  # fmt: skip
    try:
        limits = req.limits
        if limits is not None:
            # before the gateway, the journal and the agent: no cgroup, nothing run (exit 69)
            start.cgroup = RunCgroup.create(run_id, limits)
        return asyncio.run(_run(start))
    except BaseException:
        if child is not None:
            release_child(req.journal_path, child.id)
        raise
    finally:
        if start.cgroup is not None:
            start.cgroup.close()  # (closed after the agent's end already: a no-op then)


def session_config(start: _Start) -> tuple[SessionConfig, Responder | None, str]:
    """The run's session, built once: its :class:`~pvisor.session.session.SessionConfig` (the
    gateway on 127.0.0.1 ``--port``, the run's id and attempt, the workspace snapshots, intercept
    mode), the responder that answers in the gateway (replay's playback, the scripted model;
    None: the upstream answers) and what the run's ``upstream`` label names."""
    req, profile = start.req, start.profile
    gateway = GatewayConfig(
        host="127.0.0.1", port=req.port, run=start.run_id, attempt=start.attempt, shutdown_grace=5.0
    )
    responder: Responder | None = None
    if req.responder is not None:
        # replay's playback answers in the gateway; nothing is forwarded, no key is needed
        responder = req.responder(RunSetup(start.run_id, start.run_dir, start.home, start.workspace))
        if req.upstream:  # a continuation: what the responder forwards goes to the live upstream
            gateway.upstreams = {profile.upstream: req.upstream}
        else:
            gateway.offline = True
        upstream_label = req.upstream_label or "responder"
    elif start.script is not None:
        # the scripted model answers in the gateway itself (served_by: scripted); nothing is forwarded
        responder = ScriptedResponder(ScriptedModel(start.script))
        gateway.offline = True
        upstream_label = "script:" + absolute(req.script or "", f"--script {req.script}")
    else:
        upstream_url = req.upstream or UPSTREAMS[profile.upstream][0]
        upstream_label = without_userinfo(upstream_url)
        # one explicit upstream: paths no protocol owns (Claude's HEAD /api/hello, GET /v1/models)
        # go to it too
        gateway.upstreams = {profile.upstream: upstream_url}
    if req.dummy_key and not gateway.offline:
        gateway.credentials, start.agent_key = key_swap(req, profile)
    if req.max_response_body is not None:
        gateway.max_response_body = req.max_response_body
    if req.snapshots:
        # the journal and the runs' own files (their private homes) never go into snapshots
        gateway.workspace = start.workspace
        gateway.snapshot_driver = req.snapshot_driver
        gateway.snapshot_exclude = (req.journal_path, start.run_dir.parent)
    if req.intercept is not None and req.upstream:
        # an --upstream becomes the redirect of the agent's public model host (its requests go there)
        key, origin = host_entry(URL(UPSTREAMS[profile.upstream][0]))
        req.intercept.redirects[key] = (origin, req.upstream.rstrip("/"))
    unix = None
    if start.box is not None and start.box.network is SandboxNetwork.GATEWAY:
        unix = os.path.join(start.box.socket_dir, "gateway.sock")  # where the relay inside forwards
    config = SessionConfig(req.journal_path, gateway, req.intercept, JOURNAL_WAIT_S, unix)
    return config, responder, upstream_label


async def _run(start: _Start) -> RunReport:
    req = start.req
    session = None
    relay = None
    stop = StopSignals()
    stop.install()  # from here on a signal stops the agent and the attempt still ends in the journal
    become_subreaper()
    try:
        data_dir = data_dir_of(start.req.journal_path)
        start.box = agent_sandbox(
            start.req, start.sandbox, start.workspace, start.run_dir, data_dir, start.exe
        )
        config, responder, upstream_label = session_config(start)
        # signals (installed above), address, journal, gateway, mitmdump; one stop order
        session = Session(config, responder, signals=stop)
        try:
            url = await session.start()  # the journal is opened once the port is bound
        except OSError as exc:
            raise UnavailableError(
                f"cannot listen on 127.0.0.1:{req.port}: {os_error_reason(exc)} (give another --port, or 0 "
                "for a free one)"
            ) from None
        relay = await relay_proxy(start.box, session, start.req.intercept)
        return await _attempt(start, session, url, upstream_label, stop, responder)
    finally:
        if relay is not None:
            await relay.stop()
        if session is not None:  # the gateway, mitmdump, the journal, the signal handlers
            await session.stop()
        if start.box is not None:
            start.box.close()
        stop.remove()  # a failure before the session was made


def _through_proxy(
    env: dict[str, str], profile: AgentProfile, intercept: Any, proxy: Any, warn: Warn
) -> None:
    """The agent's environment for intercept mode: ``HTTPS_PROXY``, the CA variables its runtime
    reads (:attr:`~pvisor.adapters.agents.base.AgentProfile.ca_env`), ``NO_PROXY`` without the
    intercepted hosts, and no base-URL variable the agent needs none of."""
    confdir = intercept.confdir or default_confdir()
    changes, dropped = intercept_env(proxy.url, confdir, profile.ca_env, intercept.intercepted(), env)
    env.update(changes)
    for name in profile.intercept_unset_env:
        env.pop(name, None)
    if dropped:
        warn(
            f"NO_PROXY: left out {', '.join(dropped)} for the agent: it would send its model requests "
            "around the proxy"
        )


def _prepare_launch(
    start: _Start, url: str, responder: Any, proxy: Any
) -> tuple[LaunchContext, LaunchPlan, dict[str, str]]:
    """The run directory (0700), the agent's private home and temporary directory in it, its
    launch plan (:meth:`AgentProfile.plan`, its files written) and its environment: the base URL
    of the gateway (intercept mode: ``HTTPS_PROXY`` and the CA instead), ``PWD`` and ``TMPDIR``."""
    req, profile, run_dir, workspace = start.req, start.profile, start.run_dir, start.workspace
    make_directories(run_dir)  # runs/ too, 0700 whatever the umask
    os.chmod(run_dir, 0o700)
    home = start.home
    for mine in [p for p in (home, run_dir / "tmp") if p is not None and p.is_symlink()]:
        # an earlier attempt's agent (in a sandbox) can leave one: pvisor writes and reads there
        raise OutputError(
            f"{mine} is a symbolic link, not the run's own directory (left by the agent of an earlier "
            "attempt?); remove it"
        )
    if home is not None:
        home.mkdir(exist_ok=True, mode=0o700)
    ctx = LaunchContext(
        executable=start.exe,
        # intercept mode: the agent addresses the model API's own host, through HTTPS_PROXY
        base_url=UPSTREAMS[profile.upstream][0] if proxy is not None else f"{url}/run/{start.run_id}",
        run_dir=run_dir,
        home=home,
        workspace=workspace,
        attempt=start.attempt,
        model=start.model,
        api_key=start.agent_key
        or (
            SCRIPT_API_KEY
            if req.script or req.dummy_key or (responder is not None and not req.upstream)
            else None
        ),
    )
    start.key = (
        AgentKey.SWAPPED if start.agent_key else AgentKey.DUMMY if ctx.api_key is not None else AgentKey.AGENT
    )
    plan = profile.plan(ctx, req.task, session_id=start.resume.session_id if start.resume else None)
    if req.agent_args:
        plan.argv = profile.with_arguments(plan.argv, req.agent_args)
    write_files(plan.files, run_dir)
    env = apply_env({**os.environ, **req.agent_env}, plan.env)
    if ctx.api_key is not None:
        # a dummy key and no real credential: also none a config's environment (agent_env) added
        for name in offline_credentials(env):
            if plan.env.get(name) is None:
                env.pop(name, None)
    if proxy is not None:
        _through_proxy(env, profile, req.intercept, proxy, start.warn)
    env["PWD"] = str(
        workspace
    )  # as a shell sets it: OpenCode takes its directory from $PWD, not from its cwd
    tmp = (
        run_dir / "tmp"
    )  # the agent's and its tools' temporary files stay with the run, not in a shared /tmp
    tmp.mkdir(exist_ok=True, mode=0o700)
    env.update(TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp))
    return ctx, plan, env


def _record_start(
    start: _Start, journal: Any, plan: LaunchPlan, upstream_label: str, proxy: Any
) -> tuple[Path, Path]:
    """Record the run (created; a child run's row updated; a resumed run's kept) and its attempt
    in the journal, flushed before the first exchange arrives. Returns the attempt's stdout and
    stderr files (``attempt-N.stdout`` / ``.stderr`` in the run directory)."""
    req, profile, run_id, run_dir = start.req, start.profile, start.run_id, start.run_dir
    home = start.home
    labels = {
        "workspace": str(start.workspace),
        "run_dir": str(run_dir),
        "home": str(home) if home else "user",
        "upstream": upstream_label,
        "task": req.task,
        **req.labels,
    }
    if start.model:
        labels["model"] = start.model
    if proxy is not None:
        labels["capture"] = "intercept"
    if start.box is not None:
        labels["sandbox"] = f"bwrap, network {start.box.network.value}"
    if start.child is not None:
        # the handoff's pending child run: filed under its id, its mode and lineage kept
        labels["started_as"] = req.mode
        journal.update_run(
            run_id, agent=profile.name, agent_version=start.version, argv=plan.argv, labels=labels
        )
    elif start.resume is None:
        journal.create_run(
            Run(
                id=run_id,
                agent=profile.name,
                agent_version=start.version,
                argv=plan.argv,
                mode=req.mode,
                labels=labels,
                parent_run=req.parent_run,
                boundary_step=req.boundary_step,
                pause_transition=req.pause_transition,
                workspace_snapshot=req.workspace_snapshot,
            )
        )
    stdout_path = run_dir / f"attempt-{start.attempt}.stdout"
    stderr_path = run_dir / f"attempt-{start.attempt}.stderr"
    journal.start_attempt(
        Attempt(
            run=run_id,
            n=start.attempt,
            # a child run's attempt began when this start claimed it (what a refused start says)
            started_ms=req.child_claimed or 0,
            labels={
                "argv": orjson.dumps(plan.argv).decode(),
                "agent_version": start.version or "",
                "stdout": str(stdout_path),
                "stderr": str(stderr_path),
            },
        )
    )
    journal.flush(JOURNAL_WAIT_S)  # the run and attempt rows exist before the first exchange arrives
    return stdout_path, stderr_path


async def _attempt(
    start: _Start, session: Any, url: str, upstream_label: str, stop: StopSignals, responder: Any
) -> RunReport:
    """One attempt in the started ``session``: recorded, launched, waited for, its native
    trajectory found, its steps derived, its end recorded."""
    req, profile, workspace, warn = start.req, start.profile, start.workspace, start.warn
    gw, journal, proxy = session.gateway, session.journal, session.proxy
    ctx, plan, env = _prepare_launch(start, url, responder, proxy)
    stdout_path, stderr_path = _record_start(start, journal, plan, upstream_label, proxy)
    if start.resume is None:
        # what a replay sets again: the user's variables the agent got, never a secret (start_env.py)
        base = {**os.environ, **req.agent_env}
        recorded = recorded_environment(base, env, workspace, req.private_env)
        journal.update_run(start.run_id, environment=recorded)
    box = start.box

    first = await gw.take_snapshot(SnapshotKind.START)  # the workspace as the agent finds it
    if start.child is not None and req.responder is None:
        # the next agent starts where the handoff restored the pause (a replay compares at N)
        digest = await asyncio.get_running_loop().run_in_executor(
            None, workspace_manifest_digest, workspace, first
        )
        check_child_workspace(start.child, digest, f"workspace {workspace}", warn)
    ended = getattr(responder, "ended", None)
    # pvisor's own helpers are no strays of the agent: the journal's writer, intercept's mitmdump
    keep = (*journal.processes, *((proxy.pid,) if proxy is not None and proxy.pid else ()))
    try:
        outputs = open_outputs((stdout_path, stderr_path))
    except OutputError as exc:  # what an earlier attempt's agent left in the run directory
        journal.end_attempt(start.run_id, start.attempt, None, {"error": str(exc)})
        raise
    try:
        ran = await launch_agent(
            plan,
            env,
            workspace,
            outputs,
            req.timeout,
            start.run_id,
            start.attempt,
            journal,
            stop,
            ended,
            req.end_grace,
            keep,
            box,
            start.cgroup.enter if start.cgroup is not None else None,
        )
        # read back from pvisor's own descriptor: the path may now hold a FIFO or a link
        stdout = read_output(outputs[0], stdout_path, warn)
    finally:
        for f in outputs:
            f.close()
    if start.cgroup is not None:
        # what is left in it killed (for up to seconds: off the event loop), its report read
        await asyncio.get_running_loop().run_in_executor(None, start.cgroup.close)
    _, timed_out, interrupted, _, after_end = ran
    stopped = timed_out or interrupted or after_end
    if stopped:
        # the agent was stopped: its requests still in flight (a live model thinking) have no
        # one to answer; they are cut at once and recorded incomplete
        gw.hurry()
    await gw.drain(1.0 if stopped else 10.0)
    last = await gw.take_snapshot(SnapshotKind.END)  # the last step's tools have run

    if box is not None and box.status is None and ran[0] is not None:  # the agent was started
        warn(
            "the sandbox's relay said no status (killed, or it died: a process in the sandbox can signal "
            "it); the agent's exit code is bwrap's and no stray process inside is counted"
        )
    session_id = profile.session_id(stdout) if profile.json_stdout else None
    native = await native_trajectory(profile, ctx, plan, session_id, env, workspace, warn, keep, box)
    native = vetted_native(native, box.writable if box is not None else (), warn)
    own = profile.final_status(stdout, native)
    report = _report(start, url, proxy, plan, stop, ran, (stdout_path, stderr_path), session_id, native, own)

    await gw.stop()  # every exchange (and every snapshot) is recorded before the steps are derived
    journal.flush(JOURNAL_WAIT_S)
    derive_steps(report, journal, profile, warn)
    snapshot_warnings(report, first, last, warn)
    if report.agent_exit_code == 0 and report.steps == 0 and not report.attempt_steps:
        warn(
            f"{profile.title} exited with code 0 but no step was captured: it sent no request to the model "
            "(did it read the "
            f"task as an option, or fail before starting? see {stdout_path} and {stderr_path})"
        )
    _record_end(report, journal)
    return report


def _report(
    start: _Start,
    url: str,
    proxy: Any,
    plan: LaunchPlan,
    stop: StopSignals,
    ran: tuple[int | None, bool, bool, int, bool],
    outputs: tuple[Path, Path],
    session_id: str | None,
    native: Path | None,
    own: AgentStatus,
) -> RunReport:
    """The attempt's :class:`RunReport` from what :func:`launch_agent` returned (``ran``) and the
    exit code the command exits with; a warning when the agent left processes running."""
    returncode, timed_out, interrupted, strays, after_end = ran
    report = RunReport(
        run=start.run_id,
        attempt=start.attempt,
        agent=start.profile.name,
        agent_version=start.version,
        exit_code=0,
        agent_exit_code=exit_status(returncode),
        timed_out=timed_out,
        interrupted=interrupted,
        workspace=start.workspace,
        run_dir=start.run_dir,
        stdout=outputs[0],
        stderr=outputs[1],
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
    report.sandbox = sandbox_record(start.box, start.req.sandbox_asked or start.req.sandbox)
    cgroup = start.cgroup.report if start.cgroup is not None else None
    report.sandbox.update(key=start.key.value, limits=cgroup.to_json() if cgroup is not None else None)
    report.exit_code = stop.exit_code if interrupted else 124 if timed_out else (report.agent_exit_code or 0)
    if report.failed_by_own_account:
        report.exit_code = EXIT_AGENT_FAILED
    if strays:
        start.warn(
            f"the agent left {strays} process(es) running after it "
            f"{'was stopped' if timed_out or interrupted else 'exited'}; "
            "pvisor ended them"
        )
    return report


def _record_end(report: RunReport, journal: Any) -> None:
    """End the attempt in the journal with how it ended (timed out, interrupted, strays, the
    agent's own outcome) and give the run its session id and native trajectory path."""
    own = report.agent_status
    assert own is not None
    run_labels: dict[str, str] = {}
    attempt_labels = {"timed_out": "true" if report.timed_out else "false"}
    if report.interrupted:
        attempt_labels["interrupted"] = report.interrupt_signal or "true"
    if report.stray_processes_killed:
        attempt_labels["stray_processes_killed"] = str(report.stray_processes_killed)
    attempt_labels["agent_outcome"] = own.outcome.value
    if own.detail:
        attempt_labels["agent_detail"] = own.detail
    if report.session_id:
        run_labels["session_id"] = attempt_labels["session_id"] = report.session_id
    if report.native_path:
        run_labels["native_path"] = attempt_labels["native_path"] = str(report.native_path)
    if run_labels:
        journal.update_run(report.run, labels=run_labels)
    journal.end_attempt(report.run, report.attempt, report.agent_exit_code, attempt_labels)
    journal.flush(JOURNAL_WAIT_S)
