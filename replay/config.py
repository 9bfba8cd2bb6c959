"""The replay configuration file: ``pvisor replay --config replay.toml``.

The file holds the options of ``pvisor replay`` at its top level, all optional, and a table
per agent with how that agent is launched::

    agent = "claude-code"                    # --agent
    run = "r-20261201-..."                   # --run (a journal run id; not a path)
    trajectory = "session.jsonl"             # --trajectory (a native trajectory file)
    journal = "pvisor.db"                    # --journal
    after_step = 2                           # --after-step (integer >= 0)
    mode = "continue"                        # "prepare-only" | "replay-only" | "continue"
    output = "out"                           # --output
    workspace = "ws"                         # --workspace
    upstream = "https://api.anthropic.com"   # --upstream (http:// or https:// URL)
    max_steps = 20                           # --max-steps (integer >= 1)
    boundary_user_prompt = "..."             # --boundary-user-prompt
    reasoning = "keep"                       # --reasoning keep|strip
    live_model = "claude-sonnet-4-5"         # --live-model
    timeout = 900                            # --timeout (seconds, integer or float > 0)
    task = "..."                             # --task
    session = "..."                          # --session
    force = false                            # --force
    allow_unsupported = false                # --allow-unsupported
    protocol = "anthropic"                   # --protocol
    profile_from = "other.db:RUN"            # --profile-from JOURNAL[:RUN]
    refuse_outside = false                   # --refuse-outside
    allow_unrecorded = false                 # --allow-unrecorded
    sandbox = "auto"                         # --sandbox auto|bwrap|none
    sandbox_network = "gateway"              # --sandbox-network gateway|host
    sandbox_allow = ["cache", "~/.npm"]      # --sandbox-allow PATH, repeated (an array of paths)
    sandbox_memory = "2G"                    # --sandbox-memory (a size string, or bytes)
    sandbox_cpus = 1.5                       # --sandbox-cpus (a number >= 0.01)
    no_restore = false                       # --no-restore
    env_from = "recorded"                    # --env-from recorded|none

    [agents.claude-code]                     # applies when the replay's agent is claude-code
    entrypoint = "/opt/claude/bin/claude"    # --agent-entrypoint
    model = "claude-sonnet-4-5"              # the model the agent is launched with
    environment = { MAX_THINKING_TOKENS = "1024" }   # added to the agent's environment
    arguments = ["--verbose"]                # extra launch arguments

Flags override the file (:meth:`ReplayConfig.option`). The file only checks what it can check
alone: types, ranges, choices. Whether options go together (``--run`` with ``--trajectory``,
``--protocol`` outside prepare-only) is the command's check, made once flags and file are merged.
A missing ``mode`` is not filled in here: the command's default (``continue``) applies.

Paths. A relative path (``trajectory``, ``journal``, ``output``, ``workspace``, each of
``sandbox_allow``, the journal part of ``profile_from``, ``entrypoint``) is resolved against
the directory of the config file, not the working directory: the file is often kept beside the
data it names, and the same file run from another directory must mean the same files. ``~`` and
``~user`` are expanded; absolute paths are kept as they are. The directory is the one the file
was named in (symbolic links are not followed: a ``replay.toml`` linked into a task directory
names that directory's files). An ``entrypoint`` that is a bare name (no ``/``, no ``~``) is
kept as given, so that it is looked up on PATH exactly as ``--agent-entrypoint NAME`` is.

Errors: one line each, naming the file, the key and what was expected; never a traceback.

- :class:`~pvisor.core.errors.UsageError` (exit 2): the path given names no readable file
  (missing, a directory, no permission).
- :class:`~pvisor.core.errors.BadInputError` (exit 65): the file's content: not UTF-8, not
  TOML (the parser's message, with line and column, is kept), an unknown key (the known ones are
  listed), a wrong type (the expected one is named), a value out of range or not one of its
  choices, an empty text.

Messages print the names of environment variables, never their values (a value may be an API
key), nor launch arguments (``--api-key ...``), nor the ``upstream`` URL (it may carry
credentials), nor free text.

Imports: the standard library (and ``tomli`` on Python 3.10) and pvisor's light modules only.
"""

from __future__ import annotations

import datetime
import difflib
import enum
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pvisor.adapters.agents import descriptor_names
from pvisor.core.errors import BadInputError, UsageError
from pvisor.core.resources import cpu_share, size_bytes

from .errors import show_path
from .spec import MODES, TOML_OPTIONS, Kind

# declared with the options in .spec; named here too, where the file's values are read
from .spec import REASONING as REASONING  # noqa: E402
from .spec import ReplayMode as ReplayMode


class ReasoningPolicy(str, enum.Enum):
    """What happens to recorded reasoning in the replayed history (``reasoning``; its values are
    :data:`~.spec.REASONING`)."""

    KEEP = "keep"
    STRIP = "strip"


#: the mode when neither the flags nor the file give one
DEFAULT_MODE = ReplayMode.CONTINUE.value

#: keys of an ``[agents.NAME]`` table
AGENT_KEYS: tuple[str, ...] = ("entrypoint", "model", "environment", "arguments")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: environment names pvisor sets for the agent to route it through the gateway (upper-cased)
_ROUTING_NAMES = frozenset({"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"})


@dataclass(slots=True, frozen=True)
class AgentSettings:
    """How one agent is launched (an ``[agents.NAME]`` table).

    Fields:
        entrypoint: the agent's executable (``--agent-entrypoint``): an absolute path (a relative
            one resolved against the config file's directory, ``~`` expanded) or a bare command
            name looked up on PATH; None: the agent's command on PATH.
        model: the model the agent is launched with; None: the agent's own default.
        environment: variable name -> value added to the agent's environment (values may be
            secrets: never print them).
        arguments: extra launch arguments, in order.
    """

    entrypoint: str | None = None
    model: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class ReplayConfig:
    """A loaded config file.

    Fields:
        path: the file, absolute (its ``parent`` is the directory relative paths were resolved
            against).
        options: option name (a top-level key such as ``after_step``) -> value, only for the keys
            the file sets. Values: ``str`` (paths resolved and absolute, ``mode`` and
            ``reasoning`` as their ``.value`` strings), ``int`` (``after_step``, ``max_steps``),
            ``float`` (``timeout``, ``sandbox_cpus``), ``bool`` (``force``, ``allow_unsupported``),
            ``list[str]`` (``sandbox_allow``, resolved), ``int`` bytes (``sandbox_memory``).
        agents: agent name -> its settings, for the agent tables the file has.
    """

    path: Path
    options: dict[str, Any]
    agents: dict[str, AgentSettings]

    def settings(self, agent: str) -> AgentSettings:
        """The settings of ``agent``: its table, else empty settings (a new object each call)."""
        found = self.agents.get(agent)
        return found if found is not None else AgentSettings()

    def option(self, name: str, flag_value: Any) -> Any:
        """Flags override the file: ``flag_value`` when it is not None, else the file's value of
        option ``name``, else None. So a flag whose "not given" is not None (a click flag's False,
        a default such as 900) always wins: give such options ``default=None``.

        Raises KeyError for a name that is not an option of the file (a programming error)."""
        if name not in OPTION_KEYS:
            raise KeyError(f"{name!r} is not a replay option; expected one of {', '.join(OPTION_KEYS)}")
        if flag_value is not None:
            return flag_value
        return self.options.get(name)


def load_config(path: str | Path) -> ReplayConfig:
    """Read and check the config file ``path``. Returns a :class:`ReplayConfig`.

    Raises UsageError (exit 2) when ``path`` is missing, a directory or unreadable, and
    BadInputError (exit 65) for anything wrong in its content; each message is one line naming
    the file and the key (module docstring)."""
    shown = show_path(path)
    where = f"config file {shown}"
    raw = _read(path, where)
    data = _parse(raw, where)
    absolute = Path(os.path.abspath(os.fspath(path)))
    base = absolute.parent
    options: dict[str, Any] = {}
    agents: dict[str, AgentSettings] = {}
    unknown = [key for key in data if key not in OPTION_KEYS and key != "agents"]
    if unknown:
        raise BadInputError(f"{where}: {_unknown(unknown, (*OPTION_KEYS, 'agents'))}")
    for key, value in data.items():
        if key == "agents":
            agents = _agents(value, where, base)
        else:
            options[key] = _OPTIONS[key](value, _Ctx(where, key, base))
    return ReplayConfig(path=absolute, options=options, agents=agents)


# --------------------------------------------------------------------------- reading


def _read(path: str | Path, where: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except IsADirectoryError:
        raise UsageError(f"{where}: is a directory; expected a TOML file") from None
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{where}: no such file") from None
    except PermissionError:
        raise UsageError(f"{where}: cannot be read (permission denied)") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    except ValueError:  # a NUL in the path
        raise UsageError(f"{where}: not a valid path") from None


def _parse(raw: bytes, where: str) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig")  # a UTF-8 byte-order mark (some Windows editors write one) is dropped
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BadInputError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}); TOML files are UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message ends with "(at line L, column C)"
        message = " ".join(str(exc).split())
        raise BadInputError(f"{where}: not valid TOML: {message}") from None


# --------------------------------------------------------------------------- checks


@dataclass(slots=True)
class _Ctx:
    """Where a value is: the file (for messages), its dotted key, the directory for paths."""

    where: str
    key: str
    base: Path

    def fail(self, what: str) -> BadInputError:
        return BadInputError(f"{self.where}: key '{self.key}': {what}")


def _toml_type(value: Any) -> str:
    """The TOML name of a parsed value's type."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, datetime.datetime):
        return "date-time"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, datetime.time):
        return "time"
    return type(value).__name__


def _unknown(keys: list[str], known: tuple[str, ...]) -> str:
    named = ", ".join(repr(k) for k in keys)
    hint = ""
    if len(keys) == 1 and keys[0] in AGENT_KEYS and keys[0] not in known:
        hint = f" ({keys[0]} belongs in the agent's table, [agents.NAME])"
    elif len(keys) == 1 and keys[0] == "agent_entrypoint":
        hint = " (the entrypoint belongs in the agent's table: [agents.NAME] entrypoint = ...)"
    elif len(keys) == 1:
        close = difflib.get_close_matches(keys[0], known, n=1)
        if close:
            hint = f" (did you mean '{close[0]}'?)"
    return f"unknown key{'s' if len(keys) > 1 else ''} {named}{hint}; known keys: {', '.join(known)}"


def _string(value: Any, ctx: _Ctx, *, hint: str = "") -> str:
    """A non-empty string without NUL; the value itself is never printed."""
    if not isinstance(value, str):
        raise ctx.fail(f"expected a string, got {_toml_type(value)}{hint}")
    if not value.strip():
        raise ctx.fail("expected a non-empty string, got an empty one")
    if "\0" in value:
        raise ctx.fail("the string contains a NUL character")
    return value


def _text(value: Any, ctx: _Ctx) -> str:
    return _string(value, ctx)


def _agent(value: Any, ctx: _Ctx) -> str:
    hint = " (an agent's launch settings go in an [agents.NAME] table)" if isinstance(value, dict) else ""
    name = _string(value, ctx, hint=hint)
    if name not in descriptor_names():
        raise ctx.fail(f"unknown agent {_short(name)}; expected one of {', '.join(descriptor_names())}")
    return name


def _choice(choices: tuple[str, ...]) -> Callable[[Any, _Ctx], str]:
    def check(value: Any, ctx: _Ctx) -> str:
        text = _string(value, ctx)
        if text not in choices:
            raise ctx.fail(f"unknown value {_short(text)}; expected one of {', '.join(choices)}")
        return text

    return check


def _mode(value: Any, ctx: _Ctx) -> str:
    """``mode``: one of :data:`MODES`; ``continuation`` (the word result.json uses) is ``continue``."""
    text = _string(value, ctx)
    if text == "continuation":
        return ReplayMode.CONTINUE.value
    return _choice(MODES)(text, ctx)


def _integer(minimum: int) -> Callable[[Any, _Ctx], int]:
    def check(value: Any, ctx: _Ctx) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ctx.fail(f"expected an integer >= {minimum}, got {_toml_type(value)}")
        if value < minimum:
            raise ctx.fail(f"expected an integer >= {minimum}, got {value}")
        return value

    return check


def _seconds(value: Any, ctx: _Ctx) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.fail(f"expected a number of seconds (integer or float) > 0, got {_toml_type(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ctx.fail(f"expected a number of seconds (integer or float) > 0, got {value}")
    return float(value)


def _boolean(value: Any, ctx: _Ctx) -> bool:
    if not isinstance(value, bool):
        raise ctx.fail(f"expected a boolean (true or false), got {_toml_type(value)}")
    return value


def _url(value: Any, ctx: _Ctx) -> str:
    text = _string(value, ctx)
    try:
        parts = urlsplit(text)
        port_ok = parts.port is None or parts.port >= 0  # .port raises ValueError for a bad port
        ok = port_ok and parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a bad port, a bad IPv6 literal
        ok = False
    if not ok or any(c.isspace() for c in text):
        # (the URL is not printed: it may carry a user and password)
        raise ctx.fail("expected an http:// or https:// URL with a host, such as https://api.anthropic.com")
    return text


def _resolve(text: str, ctx: _Ctx) -> str:
    """``text`` (a path) with ``~`` expanded, relative to the config file's directory."""
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        raise ctx.fail(f"cannot expand {_short(text.split(os.sep, 1)[0])}: no such user")
    if os.path.isabs(expanded):
        return expanded
    return str(ctx.base / expanded)


def _path(value: Any, ctx: _Ctx) -> str:
    return _resolve(_string(value, ctx), ctx)


def _paths(value: Any, ctx: _Ctx) -> list[str]:
    """An array of paths (``sandbox_allow``), each resolved as :func:`_path` resolves one."""
    if not isinstance(value, list):
        raise ctx.fail(f"expected an array of paths, got {_toml_type(value)}")
    return [_path(item, _Ctx(ctx.where, f"{ctx.key}[{i}]", ctx.base)) for i, item in enumerate(value)]


def _size(value: Any, ctx: _Ctx) -> int:
    """A size (``sandbox_memory``): a string such as ``"2G"``, or an integer of bytes."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        expected = 'expected a size such as "512M" or "2G", or a number of bytes'
        raise ctx.fail(f"{expected}, got {_toml_type(value)}")
    try:
        return size_bytes(str(value))
    except ValueError as exc:
        raise ctx.fail(f"{_short(str(value))}: {exc}") from None


def _cpus(value: Any, ctx: _Ctx) -> float:
    """A number of CPUs (``sandbox_cpus``), integer or float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.fail(f"expected a number of CPUs such as 0.5 or 2, got {_toml_type(value)}")
    try:
        return cpu_share(str(value))
    except ValueError as exc:
        raise ctx.fail(f"{value}: {exc}") from None


def _profile_spec(value: Any, ctx: _Ctx) -> str:
    """``JOURNAL[:RUN]`` with JOURNAL resolved. As ``--profile-from`` reads it
    (:func:`pvisor.replay.profile.parse_profile_spec`): a path that exists as given wins over a
    split at its last colon (a journal file may have a colon in its name); else what follows the
    last colon is the run."""
    text = _string(value, ctx)
    whole = _resolve(text, ctx)
    if ":" not in text or os.path.exists(whole):
        return whole
    journal, _, run = text.rpartition(":")
    if not journal.strip():
        raise ctx.fail("expected JOURNAL[:RUN], got an empty journal path before the ':'")
    resolved = _resolve(journal, ctx)
    return f"{resolved}:{run}" if run else resolved


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


#: how each kind of option (:class:`~.spec.Kind`) is checked: (value, context) -> the stored value
_CHECKS: dict[str, Callable[[Any, _Ctx], Any]] = {
    Kind.AGENT: _agent,
    Kind.TEXT: _text,
    Kind.RUN: _text,
    Kind.PATH: _path,
    Kind.STEP: _integer(0),
    Kind.COUNT: _integer(1),
    Kind.SECONDS: _seconds,
    Kind.URL: _url,
    Kind.FLAG: _boolean,
    Kind.PROFILE: _profile_spec,
    Kind.MODE: _mode,
    Kind.PATHS: _paths,
    Kind.SIZE: _size,
    Kind.CPUS: _cpus,
}


def _check_of(kind: str, choices: tuple[str, ...]) -> Callable[[Any, _Ctx], Any]:
    return _choice(choices) if kind == Kind.CHOICE else _CHECKS[kind]


#: top-level key -> its check (value, context) -> the stored value; in documentation order
#: (the keys and kinds are declared once, in :data:`~.spec.OPTIONS`)
_OPTIONS: dict[str, Callable[[Any, _Ctx], Any]] = {
    o.toml: _check_of(o.kind, o.choices) for o in TOML_OPTIONS if o.toml is not None
}

#: the top-level option keys, in documentation order (``agents`` holds the agent tables)
OPTION_KEYS: tuple[str, ...] = tuple(_OPTIONS)


# --------------------------------------------------------------------------- agent tables


def _agents(value: Any, where: str, base: Path) -> dict[str, AgentSettings]:
    if not isinstance(value, dict):
        raise BadInputError(
            f"{where}: key 'agents': expected a table of [agents.NAME] tables, got {_toml_type(value)}"
        )
    known = tuple(descriptor_names())
    unknown = [name for name in value if name not in known]
    if unknown:
        listed = ", ".join(_short(n) for n in unknown)
        raise BadInputError(
            f"{where}: key 'agents': unknown agent{'s' if len(unknown) > 1 else ''} {listed}; "
            f"expected one of {', '.join(known)}"
        )
    return {name: _agent_table(table, _Ctx(where, f"agents.{name}", base)) for name, table in value.items()}


def _agent_table(table: Any, ctx: _Ctx) -> AgentSettings:
    if not isinstance(table, dict):
        raise ctx.fail(
            f"expected a table (entrypoint, model, environment, arguments), got {_toml_type(table)}"
        )
    unknown = [key for key in table if key not in AGENT_KEYS]
    if unknown:
        raise ctx.fail(_unknown(unknown, AGENT_KEYS))

    def at(key: str) -> _Ctx:
        return _Ctx(ctx.where, f"{ctx.key}.{key}", ctx.base)

    entrypoint = None
    if "entrypoint" in table:
        entrypoint = _string(table["entrypoint"], at("entrypoint"))
        if os.sep in entrypoint or entrypoint.startswith("~"):
            entrypoint = _resolve(entrypoint, at("entrypoint"))
        # else a bare command name: looked up on PATH, as --agent-entrypoint NAME is
    model = _string(table["model"], at("model")) if "model" in table else None
    environment = _environment(table["environment"], at("environment")) if "environment" in table else {}
    arguments = _arguments(table["arguments"], at("arguments")) if "arguments" in table else []
    return AgentSettings(entrypoint=entrypoint, model=model, environment=environment, arguments=arguments)


def _environment(value: Any, ctx: _Ctx) -> dict[str, str]:
    """Names and string values; names pvisor sets to route the agent are refused. Messages name
    variables, never print a value."""
    if not isinstance(value, dict):
        raise ctx.fail(f'expected a table of NAME = "value" strings, got {_toml_type(value)}')
    environment: dict[str, str] = {}
    for name, val in value.items():
        if not _ENV_NAME.fullmatch(name):
            expected = "letters, digits and _, not a digit first"
            raise ctx.fail(f"{_short(name)} is not a valid variable name (expected {expected})")
        upper = name.upper()
        if upper.endswith("_BASE_URL") or upper in _ROUTING_NAMES:
            raise ctx.fail(
                f"{name} cannot be set here: pvisor sets it so that the agent reaches the model through the "
                f"gateway; give the model API as 'upstream' instead"
            )
        if not isinstance(val, str):
            raise ctx.fail(f"{name}: expected a string value (quote it), got {_toml_type(val)}")
        if "\0" in val:
            raise ctx.fail(f"{name}: the value contains a NUL character")
        environment[name] = val
    return environment


def _arguments(value: Any, ctx: _Ctx) -> list[str]:
    """A list of strings; an argument is never printed (it may be ``--api-key KEY``)."""
    if not isinstance(value, list):
        raise ctx.fail(f"expected an array of strings, got {_toml_type(value)}")
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise ctx.fail(f"item {i}: expected a string, got {_toml_type(arg)}")
        if "\0" in arg:
            raise ctx.fail(f"item {i}: the string contains a NUL character")
    return list(value)
