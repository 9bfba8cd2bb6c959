"""The replay options, each declared once: :data:`OPTIONS`, and :class:`ReplaySpec`, one
invocation's values and the check of all of them.

Every option of ``pvisor replay`` is an :class:`Option` here, in the order ``pvisor replay
--help`` lists them (after mitmproxy's ``loader.add_option(name, type, default, help)``, in
``addons/serverplayback.py``): its name (the click destination and the field of the typed
records :class:`~pvisor.replay.prepare.PrepareOptions` and
:class:`~pvisor.session.replay.ReplayOptions`), its flag, its kind (how the command line and
``replay.toml`` read a value), its default, its help text, the modes that take it, its
``replay.toml`` key and the keyword of the Python API (:func:`pvisor.session.continue_run`).
Readers of the table: the click options of ``pvisor replay`` (:mod:`pvisor.commands.replay`
builds them from it), the keys ``replay.toml`` accepts (:mod:`.config`), and
``continue_run``'s keywords (:mod:`pvisor.session.api`).

The check. :meth:`ReplaySpec.check` returns every problem of the options as given (one mode,
the required options, options given to a mode that does not take them, ...), one error each,
with the wording each has always had; the modes add the problems of the files, the source and
the environment (:func:`~pvisor.replay.prepare.prepare`,
:func:`~pvisor.session.replay.replay_only`) and report them all at once as
:class:`ReplayProblems` (:func:`problems_error`: raised, or the outcome's error beside the
failed result.json that lists them), whose exit code is the first's in the order usage (2),
source (65), environment (69) (:func:`in_order`).

Imports: the standard library and pvisor's light modules only (prepare-only loads this module
on every run: no dataclass, whose methods are made with ``exec``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

from pvisor.adapters.agents import descriptor_names
from pvisor.adapters.protocols import PROTOCOL_MODULES
from pvisor.core.errors import BadInputError, PvisorError, UnavailableError, UsageError


class ReplayMode(str, enum.Enum):
    """What ``pvisor replay`` does (``mode``)."""

    PREPARE_ONLY = "prepare-only"  #: rebuild the prefix that ends at O_N, run nothing
    REPLAY_ONLY = "replay-only"  #: re-run the agent through step N, serving the recorded actions
    CONTINUE = "continue"  #: replay through step N, then go on with the live model (the default)


class OptionWarning(str, enum.Enum):
    """Codes of the result's warnings the options themselves call for (docs/result-protocol.md)."""

    #: replay.toml's continuation options under --prepare-only or --replay-only: dropped (the
    #: message names their keys; printed on stderr when the options are read)
    OPTIONS_IGNORED = "options_ignored"


#: the values of ``mode``
MODES: tuple[str, ...] = tuple(m.value for m in ReplayMode)
#: the values of ``sandbox`` and ``sandbox_network`` (:class:`pvisor.session.sandbox.SandboxMode`
#: and ``SandboxNetwork``, a layer above)
SANDBOX_MODES: tuple[str, ...] = ("auto", "bwrap", "none")
SANDBOX_NETWORKS: tuple[str, ...] = ("gateway", "host")
#: the values of ``env_from`` (:class:`pvisor.session.start_env.EnvFrom`, a layer above): the
#: recorded start environment set for the agent, or none
ENV_FROM: tuple[str, ...] = ("recorded", "none")
#: the values of ``reasoning`` (:class:`pvisor.replay.config.ReasoningPolicy`): keep the served
#: replies' reasoning, or strip it
REASONING: tuple[str, ...] = ("keep", "strip")

_ALL = frozenset(ReplayMode)
_AGENT = frozenset((ReplayMode.REPLAY_ONLY, ReplayMode.CONTINUE))
_LIVE = frozenset((ReplayMode.CONTINUE,))
_PREPARE = frozenset((ReplayMode.PREPARE_ONLY,))
_EPISODE = frozenset((ReplayMode.PREPARE_ONLY, ReplayMode.REPLAY_ONLY))


class Kind:
    """How a value is read: the click type of its flag and the check of its ``replay.toml`` key.
    (Names, not an enum: this module is loaded by every prepare-only, and an enum class costs a
    few hundred microseconds to make.)"""

    AGENT = "agent"  #: an agent's name (descriptor_names())
    TEXT = "text"  #: a non-empty string
    RUN = "run"  #: a journal run id or unique prefix (the command line checks its characters)
    PATH = "path"  #: a path (relative ones in replay.toml: to the file's directory)
    STEP = "step"  #: an integer >= 0 (ASCII digits on the command line)
    COUNT = "count"  #: an integer >= 1
    SECONDS = "seconds"  #: a number of seconds > 0
    URL = "url"  #: an http:// or https:// URL
    CHOICE = "choice"  #: one of ``choices``
    FLAG = "flag"  #: a boolean (a flag on the command line)
    PROFILE = "profile"  #: ``JOURNAL[:RUN]``
    MODE = "mode"  #: one of :data:`MODES`
    OBJECT = "object"  #: a Python value of the API only (a mapping, a list, a callable)
    PATHS = "paths"  #: paths, the flag repeated (None when none is given); replay.toml: an array
    SIZE = "size"  #: a size in bytes, ``512M``, ``2G`` (replay.toml: such a string or an integer)
    CPUS = "cpus"  #: a number of CPUs >= 0.01 (replay.toml: a number)


class Refusal:
    """What a value given to a mode that does not take it does (names, as :class:`Kind`'s)."""

    REFUSED = "refused"  #: a usage error, from the command line or replay.toml alike
    FLAG = "flag"  #: a usage error from the command line; replay.toml's is ignored
    #: a usage error from the command line; replay.toml's a warning (``options_ignored``) in a
    #: mode that does not take it, then dropped
    WARNED = "warned"
    IGNORED = "ignored"  #: never an error (the other modes have no use for it)


#: an option's ``starts`` unless it says its own
STARTS_NOTHING = "starts nothing"


class Option:
    """One replay option, declared once.

    Fields: ``name`` (the click destination and the typed records' field), ``flag`` (``--x``;
    None: not on the command line), ``kind`` (:class:`Kind`), ``default`` (when no flag, file or
    keyword gives it), ``help`` (the command line's help text, None for the options of shared
    decorators), ``metavar``, ``modes`` (the :class:`ReplayMode` values that take it),
    ``toml`` (its key in replay.toml, or None) and ``rank`` (the key's place in the file's
    documented order, which error messages list), ``api`` (the keyword of ``continue_run``, or
    None), ``choices`` (of a :attr:`Kind.CHOICE`), ``refusal`` (:class:`Refusal`), ``starts``
    (how a refusal ends: what prepare-only does not do; for a prepare-only option, what the
    agent's modes do that refuses it), ``shared`` (the flag comes from a
    decorator other commands use too: ``intercept`` or ``progress``, :mod:`pvisor.commands`)."""

    __slots__ = (
        "name", "flag", "kind", "default", "help", "metavar", "modes", "toml", "rank", "api",
        "choices", "refusal", "starts", "shared",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        flag: str | None,
        kind: str,
        help: str | None = None,
        *,
        metavar: str | None = None,
        default: Any = None,
        modes: frozenset[ReplayMode] = _ALL,
        toml: str | None = None,
        rank: int = 0,
        api: str | None = None,
        choices: tuple[str, ...] = (),
        refusal: str = Refusal.IGNORED,
        starts: str = STARTS_NOTHING,
        shared: str | None = None,
    ) -> None:
        self.name = name
        self.flag = flag
        self.kind = kind
        self.help = help
        self.metavar = metavar
        self.default = default
        self.modes = modes
        self.toml = toml
        self.rank = rank
        self.api = api
        self.choices = choices
        self.refusal = refusal
        self.starts = starts
        self.shared = shared

    def __repr__(self) -> str:
        return f"Option({self.name!r}, {self.flag!r})"

    def refused(self, mode: ReplayMode) -> str:
        """The usage error's line for this option given to ``mode``, which does not take it."""
        shown = "--prepare-only" if mode is ReplayMode.PREPARE_ONLY else "--replay-only"
        if self.modes == _EPISODE:
            return f"{self.flag} is for --prepare-only and --replay-only; a continuation {self.starts}"
        if self.modes == _LIVE:
            return f"{self.flag} is for a continuation (no mode flag); {shown} sends nothing to a live model"
        if self.modes == _PREPARE and self.starts != STARTS_NOTHING:  # a reason of its own
            return f"{self.flag} is for --prepare-only; {shown} {self.starts}"
        if self.modes == _PREPARE:
            return (
                f"{self.flag} is for --prepare-only (a native render); replaying with the agent serves it in "
                "its own protocol"
            )
        return f"{self.flag} is for --replay-only and continuation; --prepare-only {self.starts}"


#: every replay option, in the order of ``pvisor replay --help``
OPTIONS: tuple[Option, ...] = (
    Option("agent", "--agent", Kind.AGENT, f"The agent: {', '.join(descriptor_names())}.",
           metavar="NAME", toml="agent", rank=0, api="agent"),
    Option("trajectory", "--trajectory", Kind.PATH, "The agent's native trajectory file (source).",
           metavar="PATH", toml="trajectory", rank=2, api="source"),
    Option("run", "--run", Kind.RUN, "A run of the journal (id or unique prefix) (source).",
           metavar="ID", toml="run", rank=1, api="source"),
    Option("after_step", "--after-step", Kind.STEP,
           "Keep the task and steps 1..N (0 <= N <= steps); exclude A(N+1) and after.",
           metavar="N", toml="after_step", rank=4, api="after_step"),
    Option("prepare_only", "--prepare-only", Kind.FLAG,
           "Write the prefix and the result; execute nothing, start nothing, open no socket.",
           default=False),
    Option("replay_only", "--replay-only", Kind.FLAG,
           "Re-run the agent through steps 1..N with the recorded actions in --workspace; record the prefix "
           "at request N+1 and end the agent.", default=False),
    Option("output", "--output", Kind.PATH,
           "Directory for prefix.json, prefix.request.json, result.json (not inside the workspace).",
           metavar="DIR", toml="output", rank=6, api="output"),
    Option("workspace", "--workspace", Kind.PATH,
           "prepare-only: digest it before and after (never written). replay-only and continuation "
           "(required): the new directory the agent re-runs its tools in.",
           metavar="DIR", toml="workspace", rank=7, api="workspace"),
    Option("workspace_from", "--workspace-from", Kind.RUN,
           "replay-only, continuation: restore RUN's recorded start state (its step-0 snapshot) into the "
           "empty --workspace first.",
           metavar="RUN", modes=_AGENT, toml="workspace_from", rank=8, refusal=Refusal.REFUSED,
           starts="never writes the workspace"),
    Option("no_restore", "--no-restore", Kind.FLAG,
           "replay-only, continuation: start in --workspace as it is; by default the recorded run's start "
           "snapshot is restored into an empty --workspace (a non-empty one is kept, with a warning).",
           default=False, modes=_AGENT, toml="no_restore", rank=30, api="no_restore", refusal=Refusal.WARNED,
           starts="never writes the workspace"),
    Option("env_from", "--env-from", Kind.CHOICE,
           "replay-only, continuation: set the environment variables the recorded run's agent was started "
           "with (recorded, the default) or none.", default=ENV_FROM[0], modes=_AGENT, choices=ENV_FROM,
           toml="env_from", rank=31, api="env_from", refusal=Refusal.WARNED),
    Option("child_run", "--child-run", Kind.TEXT,
           "replay-only, continuation: file the derived run under ID, the pending child run of a handoff "
           "(TrajectoryReplay.restore_handoff) that continues --run after step N; once.",
           metavar="ID", modes=_AGENT, toml="child_run", rank=9, api="child_run", refusal=Refusal.REFUSED,
           starts="makes no run"),
    Option("entrypoint", "--agent-entrypoint", Kind.PATH,
           "replay-only, continuation: the agent's executable (default: its command on PATH).",
           metavar="PATH", modes=_AGENT, api="entrypoint", refusal=Refusal.FLAG),
    Option("task", "--task", Kind.TEXT, "replay-only, continuation: the task, when the source holds none.",
           metavar="TEXT", modes=_AGENT, toml="task", rank=16, api="task", refusal=Refusal.FLAG),
    Option("timeout", "--timeout", Kind.SECONDS,
           "replay-only, continuation: how long the agent may take (default 900).",
           metavar="SECONDS", default=900.0, modes=_AGENT, toml="timeout", rank=15, api="timeout"),
    Option("allow_unsupported", "--allow-unsupported", Kind.FLAG,
           "replay-only, continuation: run an installed agent version outside its profile's range.",
           default=False, modes=_AGENT, toml="allow_unsupported", rank=20, api="allow_unsupported"),
    Option("upstream", "--upstream", Kind.URL,
           "continuation: the live model's base URL (default: the agent's public API, with the key from the "
           "environment).", metavar="URL", modes=_LIVE, toml="upstream", rank=10, api="upstream",
           refusal=Refusal.WARNED),
    Option("max_steps", "--max-steps", Kind.COUNT,
           "continuation: at most K live steps (main-loop requests N+1..N+K), then a final reply ends the "
           "agent (default: no limit).", metavar="K", modes=_LIVE, toml="max_steps", rank=11, api="max_steps",
           refusal=Refusal.WARNED),
    Option("boundary_prompt", "--boundary-user-prompt", Kind.TEXT,
           "continuation: a user message placed once after O'_N, before the first live inference.",
           metavar="TEXT", modes=_LIVE, toml="boundary_user_prompt", rank=12, api="boundary_user_prompt",
           refusal=Refusal.WARNED),
    Option("reasoning", "--reasoning", Kind.CHOICE,
           "continuation: keep the served replies' reasoning (default; a refusal is reported) or strip it so "
           "that the live API accepts the request.", default=REASONING[0], modes=_LIVE,
           toml="reasoning", rank=13, api="reasoning", choices=REASONING, refusal=Refusal.WARNED),
    Option("live_model", "--live-model", Kind.TEXT,
           "continuation: ask the live upstream for this model instead of the recorded one.",
           metavar="NAME", modes=_LIVE, toml="live_model", rank=14, api="live_model", refusal=Refusal.WARNED),
    Option("model", "--model", Kind.TEXT,
           "replay-only, continuation: the model the agent is launched with (default: the recorded one).",
           metavar="NAME", modes=_AGENT, api="model", refusal=Refusal.FLAG),
    Option("config", "--config", Kind.PATH,
           "A replay.toml with any of these options and a table per agent (entrypoint, environment, "
           "arguments, model); flags override it.", metavar="FILE"),
    Option("journal", "--journal", Kind.PATH, "The journal (as the global --journal, which it overrides).",
           metavar="PATH", toml="journal", rank=3, api="journal"),
    Option("protocol", "--protocol", Kind.CHOICE,
           "Wire protocol of a native render (agents that speak several); default per agent.",
           modes=_PREPARE, toml="protocol", rank=21, choices=tuple(PROTOCOL_MODULES),
           refusal=Refusal.REFUSED),
    Option("profile_from", "--profile-from", Kind.PROFILE,
           "A capture of the same agent (same major version): system prompt, tools and request parameters "
           "the native file lacks.", metavar="JOURNAL[:RUN]", modes=_PREPARE, toml="profile_from", rank=22,
           refusal=Refusal.REFUSED),
    Option("session", "--session", Kind.TEXT, "One session of an OpenCode store holding several.",
           metavar="ID", toml="session", rank=17, api="session"),
    Option("episode", "--episode", Kind.TEXT,
           "prepare-only, replay-only: the episode whose steps are read, a subagent's id as `pvisor "
           "trajectory show` or the result lists it (default: main, the main loop).", metavar="ID",
           modes=_EPISODE, refusal=Refusal.REFUSED,
           starts="would hand a subagent to the live model, which only its parent agent can go on with"),
    Option("force", "--force", Kind.FLAG,
           "Write into a non-empty --output (its earlier prefix and result files are replaced).",
           default=False, toml="force", rank=18, api="force"),
    Option("allow_damaged", "--allow-damaged", Kind.FLAG,
           "Build the prefix from a damaged native file (lost or unreadable lines, a repaired chain) and "
           "list each repair; refused by default.", default=False, toml="allow_damaged", rank=19,
           api="allow_damaged"),
    Option("refuse_outside", "--refuse-outside", Kind.FLAG,
           "replay-only, continuation: exit 2 before the agent starts when the plan lists a recorded call "
           "naming a place outside the new workspace.", default=False, modes=_AGENT, toml="refuse_outside",
           rank=23, api="refuse_outside", refusal=Refusal.FLAG, starts="runs nothing"),
    Option("allow_unrecorded", "--allow-unrecorded", Kind.FLAG,
           "replay-only, continuation: re-run the calls of steps 1..N that have no recorded result (an "
           "interrupted batch) instead of refusing them (observation_not_recorded).", default=False,
           modes=_AGENT, toml="allow_unrecorded", rank=24, api="allow_unrecorded", refusal=Refusal.FLAG,
           starts="re-runs no call"),
    Option("result", "--result", Kind.TEXT,
           "'-': print result.json to stdout (the summary line goes to stderr).", metavar="-"),
    Option("batch", "--batch", Kind.PATH,
           "Many replays from a manifest, one JSON line each (trajectory or run, agent, after_step, ...): "
           "--prepare-only prefixes in one process, else rollouts (mode continuation, replay-only or "
           "handoff) each in a process of its own; OUT/<name>/ for each, or --rows.", metavar="MANIFEST"),
    Option("rows", "--rows", Kind.PATH,
           "With --batch: one row per line (prefix, request, result; a rollout's run, status and result) "
           "into FILE, JSON Lines, or Parquet for FILE.parquet.", metavar="FILE"),
    Option("concurrency", "--concurrency", Kind.COUNT,
           "With --batch of rollouts: at most K at once, each in a process of its own (default 2).",
           metavar="K", modes=_AGENT),
    Option("ray", "--ray", Kind.TEXT,
           "With --batch: run the lines on this Ray cluster ('local' starts one here, 'auto' or "
           "ray://HOST:10001 joins one; extra pvisor-replay[ray]): prefixes (--prepare-only, with --rows), "
           "or rollouts, one Ray task each, never retried.", metavar="ADDRESS", modes=_PREPARE),
    Option("intercept", "--intercept", Kind.FLAG, default=False, modes=_AGENT, refusal=Refusal.FLAG,
           shared="intercept"),
    Option("confdir", "--confdir", Kind.PATH, modes=_AGENT, refusal=Refusal.FLAG, shared="intercept"),
    Option("mitmdump", "--mitmdump", Kind.PATH, modes=_AGENT, refusal=Refusal.FLAG, shared="intercept"),
    Option("sandbox", "--sandbox", Kind.CHOICE,
           "replay-only, continuation: run the agent in a bubblewrap sandbox (bwrap), not (none), or bwrap "
           "when it works here (auto, the default; PVISOR_SANDBOX sets it).", modes=_AGENT,
           choices=SANDBOX_MODES, toml="sandbox", rank=25, refusal=Refusal.FLAG, api="sandbox"),
    Option("sandbox_network", "--sandbox-network", Kind.CHOICE,
           "replay-only, continuation: in the sandbox reach only the gateway (gateway, the default) or the "
           "host's network (host).", default=SANDBOX_NETWORKS[0], modes=_AGENT, choices=SANDBOX_NETWORKS,
           toml="sandbox_network", rank=26, refusal=Refusal.FLAG, api="sandbox_network"),
    Option("sandbox_allow", "--sandbox-allow", Kind.PATHS,
           "replay-only, continuation: in the sandbox let the agent write PATH too (repeatable).",
           metavar="PATH", modes=_AGENT, toml="sandbox_allow", rank=27, refusal=Refusal.FLAG,
           api="sandbox_allow"),
    Option("sandbox_memory", "--sandbox-memory", Kind.SIZE,
           "replay-only, continuation: at most SIZE of memory (512M, 2G) for the agent and all it starts, "
           "through a cgroup of the run's (exit 69 where none can be made); past it the kernel kills.",
           metavar="SIZE", modes=_AGENT, toml="sandbox_memory", rank=28, refusal=Refusal.FLAG,
           api="sandbox_memory", starts="starts nothing"),
    Option("sandbox_cpus", "--sandbox-cpus", Kind.CPUS,
           "replay-only, continuation: at most N CPUs' time (0.5, 2) for the agent and all it starts, "
           "through the run's cgroup.", metavar="N", modes=_AGENT, toml="sandbox_cpus", rank=29,
           refusal=Refusal.FLAG, api="sandbox_cpus", starts="starts nothing"),
    Option("no_progress", "--no-progress", Kind.FLAG, default=False, shared="progress"),
    # the Python API's own: replay.toml has them in an [agents.NAME] table
    Option("agent_env", None, Kind.OBJECT, "Variables added to the agent's environment.", default=None,
           modes=_AGENT, api="environment"),
    Option("agent_args", None, Kind.OBJECT, "Extra launch arguments of the agent.", default=None,
           modes=_AGENT, api="arguments"),
    Option("warn", None, Kind.OBJECT, "A function given each warning line (default: ignored).",
           modes=_AGENT, api="warn"),
    # replay.toml's own: the command line says it with --prepare-only or --replay-only
    Option("mode", None, Kind.MODE, "prepare-only, replay-only or continue (the default).",
           default=ReplayMode.CONTINUE.value, toml="mode", rank=5),
)  # fmt: skip

#: option name -> its declaration
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
#: the options of the command line, in the order of its help
CLI_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.flag is not None)
#: ``TOML_OPTIONS``: the options of replay.toml's top level, in the file's documented order;
#: ``API_NAMES``: the keywords of :func:`pvisor.session.continue_run` (``source`` is
#: ``trajectory`` or ``run``). Made when first read (:func:`__getattr__`): a prepare-only
#: without --config reads neither
TOML_OPTIONS: tuple[Option, ...]
API_NAMES: tuple[str, ...]


def __getattr__(name: str) -> Any:
    if name == "TOML_OPTIONS":
        value: Any = tuple(sorted((o for o in OPTIONS if o.toml is not None), key=lambda o: o.rank))
    elif name == "API_NAMES":
        value = tuple(dict.fromkeys(o.api for o in OPTIONS if o.api is not None))
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


# --------------------------------------------------------------------------- problems

#: the exit codes of the kinds of problem, in the order the first decides the exit code
PROBLEM_ORDER: tuple[type[PvisorError], ...] = (UsageError, BadInputError, UnavailableError)


def _rank(exc: PvisorError) -> int:
    for i, kind in enumerate(PROBLEM_ORDER):
        if isinstance(exc, kind):
            return i
    return len(PROBLEM_ORDER)


def in_order(problems: Iterable[PvisorError]) -> list[PvisorError]:
    """``problems`` ordered usage (exit 2), source (65), environment (69), then the rest; in
    the order found within each."""
    return sorted(problems, key=_rank)


class ReplayProblems(PvisorError):
    """Several problems of one invocation (usage, source, environment), found before anything
    ran. ``problems``: the errors in :func:`in_order` order; ``exit_code``: the first's;
    ``message``: one line per problem, each as its error would print it alone. A failed result
    document listing them all in ``errors``, when one was written, is the outcome's beside it,
    never an attribute of the error."""

    def __init__(self, problems: list[PvisorError]):
        self.problems = in_order(problems)
        super().__init__("\n".join(p.message for p in self.problems), exit_code=self.problems[0].exit_code)

    def lines(self) -> list[str]:
        """The messages, one per problem."""
        return [p.message for p in self.problems]


def problems_error(problems: list[PvisorError]) -> PvisorError | None:
    """The error of ``problems``: None for no problem; the one error itself for one (its class,
    code and wording as ever); :class:`ReplayProblems` for several."""
    seen: set[tuple[type, str]] = set()
    unique = []
    for p in problems:  # a check made twice (the command's and the mode's) says it once
        if (type(p), p.message) not in seen:
            seen.add((type(p), p.message))
            unique.append(p)
    if len(unique) == 1:
        return unique[0]
    return ReplayProblems(unique) if unique else None


def raise_problems(problems: list[PvisorError]) -> None:
    """Raise :func:`problems_error` of ``problems``; nothing for no problem."""
    error = problems_error(problems)
    if error is not None:
        raise error


def collect(problems: list[PvisorError], check: Callable[..., Any], *args: Any) -> bool:
    """Run ``check(*args)``; a PvisorError it raises is added to ``problems``. Returns whether
    it passed (checks that need what it checked are skipped when it did not)."""
    try:
        check(*args)
    except PvisorError as exc:
        problems.append(exc)
        return False
    return True


# --------------------------------------------------------------------------- an invocation


class ReplaySpec:
    """One invocation's options: ``values`` (option name -> value, None where nothing gave one;
    :data:`OPTIONS` names them), ``given`` (the names set on the command line or by keyword, as
    opposed to replay.toml) and the ``mode``.

    :meth:`check` lists every problem of the options themselves; :meth:`fields` gives the
    typed records' keyword arguments for a mode."""

    __slots__ = ("values", "given", "mode")

    def __init__(self, values: dict[str, Any], given: Iterable[str] = (), mode: ReplayMode | None = None):
        self.values = values
        self.given = frozenset(given)
        self.mode = mode

    def __getitem__(self, name: str) -> Any:
        return self.values.get(name)

    def value(self, name: str) -> Any:
        """The option's value, else its declared default."""
        v = self.values.get(name)
        return BY_NAME[name].default if v is None else v

    def check(self) -> list[PvisorError]:
        """Every problem of the options as given, one usage error (exit 2) each, with the
        wording each has always had: two modes at once, a required option missing, an option
        given to a mode that does not take it, ``--max-steps`` below 1, an empty ``--journal``.
        A mode's own checks (files, the source, the environment) come after, in the mode."""
        v = self.values
        problems: list[PvisorError] = []
        if v.get("prepare_only") and v.get("replay_only"):
            problems.append(
                UsageError(
                    "give one mode at most: --prepare-only (rebuild the prefix, run nothing), --replay-only "
                    "(re-run the agent through step N in a new --workspace), or neither (continue with the "
                    "live model after step N)"
                )
            )
        for name in ("agent", "after_step", "output"):
            if v.get(name) is None:
                problems.append(
                    UsageError(f"missing option {BY_NAME[name].flag} (on the command line, or in --config)")
                )
        max_steps = v.get("max_steps")
        if max_steps is not None and max_steps < 1:
            from .errors import ReplayUsageError

            problems.append(
                ReplayUsageError(
                    "usage",
                    f"--max-steps {max_steps}: a continuation runs at least one live step "
                    "(--replay-only runs none)",
                )
            )
        if v.get("journal") == "":
            problems.append(UsageError("--journal is empty: give the journal file's path"))
        if not (v.get("prepare_only") and v.get("replay_only")):
            problems += self.refused_in_mode()
        return problems

    def refused_in_mode(self) -> list[UsageError]:
        """A usage error (exit 2) for each option given that :attr:`mode` does not take (a live
        option with ``--replay-only``: "--max-steps is for a continuation ..."), in the order of
        :data:`OPTIONS`; ``pvisor replay`` and ``pvisor handoff`` alike. None without a mode."""
        v, mode = self.values, self.mode
        problems: list[UsageError] = []
        if mode is None:
            return problems
        for o in OPTIONS:
            if mode in o.modes or o.refusal == Refusal.IGNORED or o.flag is None or o.name not in v:
                continue
            if o.refusal == Refusal.REFUSED:
                given = v.get(o.name) is not None
            else:
                given = o.name in self.given and v.get(o.name) not in (None, False)
            if given:
                problems.append(UsageError(o.refused(mode)))
        return problems

    def fields(self, names: Iterable[str]) -> dict[str, Any]:
        """``{name: value}`` for ``names``, each value its default when nothing gave one."""
        return {name: self.value(name) for name in names}
