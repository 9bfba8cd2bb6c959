"""Launch profiles: how pvisor starts a real agent CLI headless with the gateway in front of it.

A **launch profile** (one module per agent in this package) is declarative: it says which
executable to look for, which versions it was verified with, which wire protocol the agent
speaks (and so which gateway upstream serves it), and, given a :class:`LaunchContext`, returns
a :class:`LaunchPlan`: the command line, the changes to the environment and the files to
write before the agent starts. It also reads what the agent leaves behind: the session id
from the agent's own JSON stdout, and where its native trajectory was saved. Running the
process, the gateway and the journal is the caller's job (``pvisor run``, in
:mod:`pvisor.session.run`); a profile never starts anything.

Where things go (``pvisor run``):

- ``<data dir>/runs/<run>/`` is the **run directory** (the data dir is the directory holding
  the journal file). It holds the agent's stdout and stderr per attempt, config files that
  must not live in a home (OpenCode's ``opencode.json``), exports (OpenCode's session JSON)
  and, unless ``--use-home``, the agent's **private home** ``<run dir>/home``: ``HOME`` and the
  XDG base directories point there, so the agent's config, sessions and caches never touch the
  user's home, and never the workspace.
- With ``--use-home`` the agent keeps the user's own ``HOME`` and configuration (logins,
  settings); pvisor then only sets environment variables and command-line overrides.

Sources: the recipes verified with each pinned agent (docs/agents.md) and each agent's
``--help``; the details per agent are in ``docs/agents.md``.
"""

from __future__ import annotations

import enum
import os
from dataclasses import field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

import orjson

from . import agent as agent_row
from .descriptor import AgentDescriptor
from pvisor.core.record import FrozenRecord, Record, record
from pvisor.core.lazyre import LazyPattern

if TYPE_CHECKING:
    from pathlib import Path

_set = object.__setattr__  # how a FrozenRecord sets its fields in __init__

#: hosts that must never go through an HTTP(S) proxy: the gateway listens on one of them
NO_PROXY = "127.0.0.1,localhost,::1"

#: model-provider credentials removed from the agent's environment in offline runs (``--script``,
#: where the agent gets only a dummy key): none is needed, and a tool the agent runs could print
#: one into the journal. With ``--upstream`` or the public API they stay (the agent needs its key).
CREDENTIAL_ENV: tuple[str, ...] = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_ORG_ID",
    "OPENAI_ORGANIZATION",
    "OPENAI_PROJECT_ID",
    "CODEX_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "AZURE_API_KEY",
    "AZURE_OPENAI_AD_TOKEN",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GENAI_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_ACCESS_TOKEN",
    "DASHSCOPE_API_KEY",
    "QWEN_API_KEY",
    "OPENROUTER_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "DEEPSEEK_API_KEY",
    "XAI_API_KEY",
    "TOGETHER_API_KEY",
    "TOGETHERAI_API_KEY",
    "FIREWORKS_API_KEY",
    "COHERE_API_KEY",
    "CO_API_KEY",
    "PERPLEXITY_API_KEY",
    "HF_TOKEN",
    "HUGGINGFACE_API_KEY",
    "HUGGING_FACE_HUB_TOKEN",
    "REPLICATE_API_TOKEN",
    "LITELLM_API_KEY",
    "LITELLM_MASTER_KEY",
)

#: name prefixes and suffixes of credentials removed as well in offline runs (every AWS variable:
#: Bedrock keys, session tokens, profiles; any ``*_API_KEY``)
CREDENTIAL_PREFIXES: tuple[str, ...] = ("AWS_",)
CREDENTIAL_SUFFIXES: tuple[str, ...] = ("_API_KEY", "_AUTH_TOKEN")


#: the most bytes one argument of a command line may hold on Linux, its terminating NUL
#: included (MAX_ARG_STRLEN, 32 pages of 4 KiB): a longer one fails the start with E2BIG
#: ("Argument list too long")
MAX_ARGUMENT_BYTES = 131072


def fits_argument(text: str) -> bool:
    """Whether ``text`` fits one argument of a command line (:data:`MAX_ARGUMENT_BYTES`)."""
    return len(text.encode("utf-8", "surrogatepass")) < MAX_ARGUMENT_BYTES


def offline_credentials(environ: Mapping[str, str]) -> list[str]:
    """The variables of ``environ`` that :data:`CREDENTIAL_ENV`, :data:`CREDENTIAL_PREFIXES`
    or :data:`CREDENTIAL_SUFFIXES` name, plus every name of :data:`CREDENTIAL_ENV`."""
    found = [k for k in environ if k.startswith(CREDENTIAL_PREFIXES) or k.endswith(CREDENTIAL_SUFFIXES)]
    return sorted(set(CREDENTIAL_ENV) | set(found))


#: timeout of ``<agent> --version``, seconds
VERSION_TIMEOUT_S = 10.0

_VERSION = LazyPattern(r"(\d+)\.(\d+)(?:\.(\d+))?")


@record
class VersionRange(FrozenRecord):
    """Versions ``minimum <= v < below`` (tuples of integers, compared element-wise, missing
    parts counting as 0), e.g. ``VersionRange((2, 1, 0), (2, 2))`` is 2.1.x."""

    minimum: tuple[int, ...]
    below: tuple[int, ...]

    def __init__(self, minimum: tuple[int, ...], below: tuple[int, ...]) -> None:
        _set(self, "minimum", minimum)
        _set(self, "below", below)

    def __contains__(self, version: object) -> bool:
        parsed = parse_version(version) if isinstance(version, str) else None
        if parsed is None:
            return False
        n = max(len(parsed), len(self.minimum), len(self.below))

        def pad(t: tuple[int, ...]) -> tuple[int, ...]:
            return t + (0,) * (n - len(t))

        return pad(self.minimum) <= pad(parsed) < pad(self.below)

    def __str__(self) -> str:
        return f">={'.'.join(map(str, self.minimum))}, <{'.'.join(map(str, self.below))}"


def parse_version(text: str) -> tuple[int, ...] | None:
    """The first ``X.Y[.Z]`` in ``text`` as a tuple of integers, or None."""
    m = _VERSION.search(text)
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def version_string(text: str) -> str | None:
    """The first ``X.Y[.Z]`` in ``text`` (what ``--version`` printed), or None."""
    m = _VERSION.search(text)
    return m.group(0) if m else None


@record
class LaunchContext(FrozenRecord):
    """What a profile needs to plan one attempt.

    Fields:
        executable: path of the agent's entry point (``--agent-entrypoint``, else found on PATH).
        base_url: the gateway's URL with the run id in the path, no trailing slash:
            ``http://127.0.0.1:PORT/run/<run id>``. The gateway strips ``/run/<id>`` and files
            every exchange under that run.
        run_dir: ``<data dir>/runs/<run id>``; exists.
        home: the private home (``<run dir>/home``, exists), or None with ``--use-home``.
        workspace: the directory the agent works in (its cwd).
        attempt: 1 for the first try of the run, 2, 3, ... for native resumes.
        model: the model name to ask for, or None for the agent's own default.
        api_key: the key to give the agent (a dummy for the scripted model), or None: the
            agent then reads the user's own key from the environment (it goes to the upstream
            through the gateway, which never records it).
    """

    executable: str
    base_url: str
    run_dir: Path
    home: Path | None
    workspace: Path
    attempt: int = 1
    model: str | None = None
    api_key: str | None = None

    def __init__(
        self,
        executable: str,
        base_url: str,
        run_dir: Path,
        home: Path | None,
        workspace: Path,
        attempt: int = 1,
        model: str | None = None,
        api_key: str | None = None,
    ) -> None:
        _set(self, "executable", executable)
        _set(self, "base_url", base_url)
        _set(self, "run_dir", run_dir)
        _set(self, "home", home)
        _set(self, "workspace", workspace)
        _set(self, "attempt", attempt)
        _set(self, "model", model)
        _set(self, "api_key", api_key)


@record
class LaunchPlan(Record):
    """One attempt's command line and what must be in place before it starts.

    Fields:
        argv: the command line, ``argv[0]`` the executable.
        env: changes to the inherited environment: name -> value, or None to remove the variable.
        files: files to write (mode 0600, parent directories 0700) before the agent starts:
            path -> text.
        native_path: the native trajectory path when it is fixed in advance (mini-swe-agent's
            ``-o``), else None (found after the run from the session id).
        stdin: bytes the agent reads on its standard input (a task too long for its command
            line, :meth:`AgentProfile.task_on_stdin`), or None: no input (``/dev/null``).
    """

    argv: list[str]
    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)
    native_path: Path | None = None
    stdin: bytes | None = None

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str | None] | None = None,
        files: dict[Path, str] | None = None,
        native_path: Path | None = None,
        stdin: bytes | None = None,
    ) -> None:
        self.argv = argv
        self.env = {} if env is None else env
        self.files = {} if files is None else files
        self.native_path = native_path
        self.stdin = stdin


@record
class EnvSnippet(Record):
    """What a user pastes to point their own agent session at a running gateway
    (``pvisor env``): environment variables to export, files to write, and the command to run
    (``argv``, the agent's own arguments such as Codex's ``-c`` overrides), plus ``notes``
    (one sentence each) shown as comments."""

    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __init__(
        self,
        env: dict[str, str],
        files: dict[Path, str] | None = None,
        argv: list[str] | None = None,
        notes: list[str] | None = None,
    ) -> None:
        self.env = env
        self.files = {} if files is None else files
        self.argv = [] if argv is None else argv
        self.notes = [] if notes is None else notes


@record
class ExportPlan(FrozenRecord):
    """A command that writes the native trajectory after the run (OpenCode's ``opencode export
    ID``), given the least it needs: run ``argv`` in ``scratch`` (a fresh, empty directory pvisor
    made for it, never the workspace, whose files the agent wrote) with the attempt's environment
    and ``env``'s changes (name -> value, None removes it), after ``files`` (path -> text, fresh
    files in ``scratch``: a configuration written by pvisor, not the run's the agent could
    change) are written; its stdout is saved to ``output``. Run in the agent's sandbox when it
    had one (docs/replay.md "The sandbox")."""

    argv: list[str]
    output: Path
    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)

    def __init__(
        self,
        argv: list[str],
        output: Path,
        env: dict[str, str | None] | None = None,
        files: dict[Path, str] | None = None,
    ) -> None:
        _set(self, "argv", argv)
        _set(self, "output", output)
        _set(self, "env", {} if env is None else env)
        _set(self, "files", {} if files is None else files)


class AgentProfile(AgentDescriptor):
    """Base class of the launch profiles: a descriptor (:mod:`.descriptor`) of an agent that
    ``pvisor run`` can start (one subclass per agent; see the class attributes).

    Class attributes:
        name: the adapter name used on the command line and in the journal (``claude-code``).
        title: the agent's name for people (``Claude Code``).
        executable: the command looked up on PATH when no ``--agent-entrypoint`` is given
            (read from the agent's row of :data:`pvisor.adapters.agents.AGENTS`).
        versions: the versions this profile was verified with (``--allow-unsupported``
            launches others).
        protocol: the wire protocol the agent speaks (``anthropic``, ``openai-responses``,
            ``openai-chat``, ``gemini``).
        upstream: the gateway upstream serving that protocol (``anthropic``, ``openai``, ``gemini``).
        script_model: the model name asked for when running against the scripted model.
        needs_model: the agent cannot start without a model name (then ``--model`` is required
            with ``--upstream``).
        resumable: the agent has a native resume of a session.
        resume_extends_chain: its resume sends the old conversation unchanged, so that the
            resumed requests extend the main chain; False when it regenerates its first context
            message (a new chain in the same run).
        auxiliary_first_prompt: auxiliary exchanges expected on a first prompt (documentation
            and tests; the chain rule decides, never this number).
        json_stdout: the agent prints JSON events on stdout (its session id is read there).
        key_env: the variable the agent reads its API key from.
        removed_env: variables removed from the agent's environment: they would send its
            requests around the gateway (Bedrock, Vertex) or put its config elsewhere.
        ca_env: intercept mode (docs/intercept.md): the variables through which the agent's
            runtime trusts pvisor's CA, name -> ``cert`` (a file added to its built-in store:
            Node's ``NODE_EXTRA_CA_CERTS``) or ``bundle`` (a file replacing it: the system's
            CAs plus pvisor's, for ``SSL_CERT_FILE`` and ``REQUESTS_CA_BUNDLE``).
        intercept_unset_env: intercept mode: base-URL variables the plan sets that the agent
            needs none of (its own default is the public host, reached through HTTPS_PROXY).
        intercept_verified: intercept mode was verified with this agent by the tests
            (docs/agents.md has the table); ``pvisor run --intercept`` warns for the others.
        intercept_notes: sentences for ``pvisor env --intercept`` (what else the agent needs).
        task_option: the option the task is attached to in one argument (``--prompt=``), or
            "" when the task is an argument of its own.
        task_stdin: the argument that makes the agent read its task on stdin, documented by the
            agent (Codex: ``codex exec -``), or None: the task goes on the command line only.
    """

    name: str = ""
    title: str = ""
    versions: VersionRange = VersionRange((0,), (0,))
    protocol: str = ""  # the protocol ``pvisor run`` points it at (its first of ``protocols``)
    upstream: str = ""
    script_model: str = "mock-model"
    needs_model: bool = False
    resumable: bool = True
    resume_extends_chain: bool = True
    auxiliary_first_prompt: int = 0
    json_stdout: bool = True
    launchable = True
    key_env: str = ""
    removed_env: tuple[str, ...] = ()
    ca_env: dict[str, str] = {"SSL_CERT_FILE": "bundle"}
    intercept_unset_env: tuple[str, ...] = ()
    intercept_verified: bool = False
    intercept_notes: tuple[str, ...] = ()
    task_option: str = ""
    task_stdin: str | None = None

    @property
    def executable(self) -> str:
        """The command looked up on PATH (its row of the agent table)."""
        row = agent_row(self.name)
        return row.executable if row is not None and row.executable is not None else ""

    # ------------------------------------------------------------------ version

    def version_argv(self, executable: str) -> list[str]:
        """The command that prints the agent's version (``<exe> --version``)."""
        return [executable, "--version"]

    def read_version(self, output: str) -> str | None:
        """The version string in what :meth:`version_argv` printed, or None."""
        return version_string(output)

    def version_env(self, home: Path | None) -> dict[str, str | None]:
        """Environment changes for the version check: a throwaway ``home`` (some agents create
        their config directory even for ``--version``), or None with ``--use-home``."""
        env: dict[str, str | None] = {"NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}
        if home is not None:
            env.update(private_home_env(home))
        return env

    # ------------------------------------------------------------------ launching

    def task_argument(self, task: str) -> str:
        """The argument of the command line that carries ``task`` (:attr:`task_option`)."""
        return self.task_option + task

    def task_on_stdin(self, task: str) -> bool:
        """Whether the plan gives ``task`` on stdin (:attr:`task_stdin`): when it does not fit
        one argument (:func:`fits_argument`), or is the very argument that asks for stdin."""
        return self.task_stdin is not None and (
            task == self.task_stdin or not fits_argument(self.task_argument(task))
        )

    def task_unfit(self, task: str) -> str | None:
        """Why ``task`` cannot be given to the agent, a phrase after "the task" (a NUL character,
        which no command line and no C string carries; more bytes than one argument of its
        command line holds when it reads no task on stdin), or None."""
        if "\x00" in task:
            return (
                f"holds a NUL character (character {task.index(chr(0)) + 1}), which no command line can carry"
            )
        if self.task_stdin is None and not fits_argument(self.task_argument(task)):
            size = len(task.encode("utf-8", "surrogatepass"))
            room = MAX_ARGUMENT_BYTES - 1 - len(self.task_option.encode())
            return (
                f"is {size} bytes, more than the {room} that {self.title} can be given on its command line "
                "(one argument, Linux's MAX_ARG_STRLEN), and it reads no task on stdin"
            )
        return None

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        """The plan of one attempt: the headless command for ``task``, or with ``session_id``
        the native resume of that session with ``task`` as the next prompt. Raises UsageError
        when the agent cannot resume."""
        raise NotImplementedError

    def with_arguments(self, argv: list[str], extra: list[str]) -> list[str]:
        """``argv`` with ``extra`` launch arguments (a replay config's ``arguments``): before
        the ``--`` that ends the options when there is one (the task follows it), else at the
        end, where every pinned agent still reads options."""
        at = argv.index("--") if "--" in argv else len(argv)
        return [*argv[:at], *extra, *argv[at:]]

    def base_env(self, ctx: LaunchContext) -> dict[str, str | None]:
        """Environment changes every profile makes: no proxy for the gateway's host, the
        private home (``HOME`` and the XDG base directories) unless ``--use-home``, the
        removed variables, and the API key when one is given; with a given (dummy) key, every
        provider credential of the environment is removed first (:func:`offline_credentials`)."""
        env: dict[str, str | None] = {"NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}
        if ctx.home is not None:
            env.update(private_home_env(ctx.home))
        for name in self.removed_env:
            env[name] = None
        if ctx.api_key is not None:
            for name in offline_credentials(os.environ):
                env[name] = None
        if ctx.api_key is not None and self.key_env:
            env[self.key_env] = ctx.api_key
        return env

    # ------------------------------------------------------------------ after the run

    def session_id(self, stdout: bytes) -> str | None:
        """The session id the agent printed on its JSON stdout, or None."""
        return None

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        """How the agent itself says its run ended, read from its JSON ``stdout`` or its
        native trajectory ``native``: an agent can fail while exiting 0 (mini-swe-agent's
        ``RepeatedFormatError``), or exit 1 with its reason on stdout and nothing on stderr
        (Claude Code's "Not logged in"). Never raises."""
        return AgentStatus(AgentOutcome.UNKNOWN, None, "this agent reports no final status")

    def find_native(self, ctx: LaunchContext, session_id: str | None, plan: LaunchPlan) -> Path | None:
        """The native trajectory file of the session, found by its session id (or the plan's
        fixed path); None when there is none."""
        return plan.native_path if plan.native_path is not None and plan.native_path.exists() else None

    def export_plan(self, ctx: LaunchContext, session_id: str | None, scratch: Path) -> ExportPlan | None:
        """A command that exports the native trajectory after the run, or None (the agent
        writes its own file); ``scratch``: the fresh, empty directory it runs in
        (:class:`ExportPlan`)."""
        return None

    # ------------------------------------------------------------------ pvisor env

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        """What a user pastes to point their own session at the gateway whose run URL is
        ``base_url`` (``http://HOST:PORT/run/<id>``); ``run_dir`` is where files go that must
        not be written into a project (OpenCode's config)."""
        raise NotImplementedError


# --------------------------------------------------------------------------- final status


class AgentOutcome(str, enum.Enum):
    """How an agent says its run ended (:meth:`AgentProfile.final_status`)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  #: it said nothing that reads as either (no result line, no trajectory)


#: the longest ``detail`` kept (an agent's error message can quote a whole response)
STATUS_DETAIL_CHARS = 500


@record
class AgentStatus(FrozenRecord):
    """The agent's own account of its run.

    Fields:
        outcome: an :class:`AgentOutcome`.
        detail: its own words, one line of at most :data:`STATUS_DETAIL_CHARS` characters with
            key-shaped tokens redacted (``Not logged in · Please run /login``,
            ``RepeatedFormatError``, ``error_max_turns``), or None.
        source: where it was read (``the result line of its stdout``, ``info.exit_status of
            its trajectory``), or why nothing was.
    """

    outcome: AgentOutcome
    detail: str | None
    source: str

    def __init__(self, outcome: AgentOutcome, detail: str | None, source: str) -> None:
        _set(self, "outcome", outcome)
        _set(self, "detail", detail)
        _set(self, "source", source)

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "detail": self.detail, "source": self.source}


def status(outcome: AgentOutcome, detail: Any, source: str) -> AgentStatus:
    """An :class:`AgentStatus` with ``detail`` made one short line without keys (text as
    agents give it: a string, or a JSON value shown compactly)."""
    from pvisor.journal.redact import redact_text

    if detail is None or detail == "":
        return AgentStatus(outcome, None, source)
    text = detail if isinstance(detail, str) else orjson.dumps(detail).decode()
    # one line of printable text: it goes to a terminal (an escape sequence is not run there)
    text = " ".join("".join(c if c.isprintable() else " " for c in redact_text(text)).split())
    if len(text) > STATUS_DETAIL_CHARS:
        text = text[: STATUS_DETAIL_CHARS - 1] + "…"
    return AgentStatus(outcome, text, source)


def last_line(stdout: bytes, types: Iterable[str]) -> dict[str, Any] | None:
    """The last JSON line of ``stdout`` whose ``type`` is one of ``types``, or None."""
    wanted = set(types)
    found = None
    for obj in json_lines(stdout):
        if obj.get("type") in wanted:
            found = obj
    return found


def stream_json_result(stdout: bytes) -> AgentStatus:
    """The final status in a ``stream-json`` output as Claude Code and Qwen Code print it: the
    last ``{"type": "result"}`` line, ``is_error`` saying how it went, the reason in ``result``
    (Claude Code: ``"Not logged in · Please run /login"``), ``error.message`` (Qwen Code),
    ``errors`` or ``subtype`` (``error_max_turns``)."""
    line = last_line(stdout, ("result",))
    source = "the result line of its stdout"
    if line is None:
        return status(AgentOutcome.UNKNOWN, None, "no result line on its stdout")
    if line.get("is_error") is not True and line.get("subtype") in (None, "success"):
        return status(AgentOutcome.SUCCEEDED, None, source)
    error = line.get("error")
    reason = next(
        (
            r
            for r in (
                line.get("result"),
                error.get("message") if isinstance(error, dict) else error,
                line.get("errors") or None,
                line.get("terminal_reason") if line.get("terminal_reason") != "completed" else None,
                line.get("subtype"),
            )
            if r
        ),
        None,
    )
    return status(AgentOutcome.FAILED, reason, source)


# --------------------------------------------------------------------------- helpers


def private_home_env(home: Path) -> dict[str, str | None]:
    """``HOME`` and the XDG base directories (config, data, cache, state) inside ``home``."""
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }


def user_home(env: dict[str, str] | None = None) -> Path:
    """The user's home (``$HOME``), for ``--use-home`` runs."""
    from pathlib import Path  # launching only: prepare-only loads no pathlib

    env = os.environ if env is None else env
    return Path(env.get("HOME") or os.path.expanduser("~"))


def json_lines(stdout: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON Lines output, one per line; other lines are skipped. Split on
    ``\\n`` bytes only (never ``str.splitlines``, which also splits inside strings on U+2028)."""
    for line in stdout.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def first_value(stdout: bytes, key: str, **match: Any) -> str | None:
    """``obj[key]`` of the first JSON line whose fields equal ``match`` and that has a string
    ``key``; None when no line does."""
    for obj in json_lines(stdout):
        if all(obj.get(k) == v for k, v in match.items()):
            value = obj.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def find_file(roots: Iterable[Path], pattern: str) -> Path | None:
    """The newest file matching the glob ``pattern`` under any of ``roots`` (recursively), or
    None. Used with a pattern naming the session id, never a rebuilt cwd slug."""
    found: list[Path] = []
    for root in roots:
        if root.is_dir():
            found.extend(p for p in root.rglob(pattern) if p.is_file())
    if not found:
        return None
    return max(found, key=lambda p: p.stat().st_mtime)


def json_text(obj: Any) -> str:
    """``obj`` as indented JSON text with a final newline (config files)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n"


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (JSON string escapes are valid TOML)."""
    return orjson.dumps(value).decode()
