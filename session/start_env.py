"""The start environment of a run: what ``pvisor run`` records of the environment its agent was
started in, and what a replay sets again from it (docs/journal.md "The start environment",
docs/replay.md "The recorded start state").

Recorded (:func:`recorded_environment`, the document ``pvisor.start-environment/v1`` stored in
``runs.environment``): the working directory (``cwd``: the workspace, where the agent was
started) and the variables of the agent's environment that came from the user's environment (or
a replay's ``[agents.NAME] environment``) unchanged: a replay can set them again. Left out:

- the variables pvisor set or changed for the agent (its launch profile's, the base URL,
  ``PWD``, ``TMPDIR``, intercept mode's proxy): the replay's own launch sets them again, for
  its own run;
- the machine's and the login session's (:data:`MACHINE_NAMES`, :data:`MACHINE_PREFIXES`:
  ``PATH``, ``HOME``, ``USER``, the terminal's, ``SSH_*``, ``XDG_*``, ``PVISOR_*``...): another
  machine, terminal or session has its own, and a recorded ``PATH`` could hide the replaying
  machine's programs from the agent;
- the variables that make programs load code, or that point tools at a machine's files,
  repository or cluster (:data:`UNSAFE_NAMES`, :data:`UNSAFE_PREFIXES`: ``LD_*``, ``PYTHON*``,
  ``NODE_OPTIONS``, ``BASH_ENV``, ``GIT_*``, ``KUBECONFIG``, ``DOCKER_*``...): set from a
  recording, which may be hostile, they run its code or aim the agent's tools elsewhere; listed
  in ``left_out`` as ``unsafe``;
- every variable that may hold a secret, by the journal's rules: a model-provider credential
  (:func:`~pvisor.adapters.agents.base.offline_credentials`), a name that says it holds one
  (the names of credential headers: token, secret, password, auth, api key..., and names with a
  ``KEY``, ``PASS``, ``PAT``, ``DSN``, ``JWT`` part), a value that may be one
  (:func:`~pvisor.journal.redact.secret_value`: a key-shaped token, a URL with user info, a JSON
  Web Token, base64 of a key-shaped token, each also percent-decoded or in hex); such names
  are listed in ``left_out`` (the value never is), and so are values that are not UTF-8 text
  (the name escaped) or longer than
  :data:`MAX_VALUE_BYTES`, and the credentials pvisor removed from the agent's environment
  (``removed``);
- the variables a rollout's ``key_file`` gave (``private``): the agent's alone, whatever their
  names and values look like, listed in ``left_out`` as ``secret``.

A replay never sets a variable that routes requests (:func:`routing`): its own gateway does.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pvisor.adapters.agents.base import offline_credentials
from pvisor.journal.paths import not_utf8
from pvisor.journal.redact import has_key_shape, is_secret_header, secret_value

#: the document's schema
SCHEMA = "pvisor.start-environment/v1"
#: a value longer than this (UTF-8 bytes) is left out (``too_long``)
MAX_VALUE_BYTES = 8192

#: variables of the machine and of the login session: never recorded (module docstring)
MACHINE_NAMES = frozenset(
    {
        "_", "PWD", "OLDPWD", "SHLVL", "PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "MAIL",
        "TMPDIR", "TMP", "TEMP", "TERM", "COLORTERM", "COLUMNS", "LINES", "DISPLAY", "WAYLAND_DISPLAY",
        "XAUTHORITY", "WINDOWID", "TMUX", "TMUX_PANE", "STY", "LS_COLORS", "PS1", "PS2", "PS4",
        "PROMPT_COMMAND", "INVOCATION_ID", "JOURNAL_STREAM", "MANAGERPID", "SYSTEMD_EXEC_PID",
        "DESKTOP_SESSION", "SESSION_MANAGER", "MOTD_SHOWN", "GPG_AGENT_INFO", "OLDPWD",
    }
)  # fmt: skip
#: prefixes of such variables (the terminal's, the session's, ssh's, pvisor's own settings)
MACHINE_PREFIXES = (
    "TERM_", "SSH_", "XDG_", "DBUS_", "HIST", "PVISOR_", "VSCODE_", "ITERM_", "KITTY_", "KONSOLE_",
    "GNOME_", "WT_", "TMUX_",
)  # fmt: skip

#: variables that route the agent's requests (a replay's own gateway or proxy does): never set
#: again by a replay, as replay.toml's ``environment`` refuses them, nor any name ending in one
#: of :data:`ROUTING_SUFFIXES` (:func:`routing`)
ROUTING_NAMES = frozenset({"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"})
#: name endings of variables that name where requests go (``OPENAI_BASE_URL``,
#: ``OPENAI_API_BASE``, ``AZURE_OPENAI_ENDPOINT``, ``OLLAMA_HOST``, ``FOO_PROXY``), whatever the value
ROUTING_SUFFIXES = (
    "_BASE_URL", "_API_BASE", "_BASE", "_API_URL", "_ENDPOINT", "_ENDPOINT_URL", "_HOST", "_PROXY",
)  # fmt: skip

#: variables never recorded nor set again, by the reason (module docstring; docs/journal.md)
UNSAFE_NAMES = {
    # the shell reads and runs these files or commands when it starts or prompts
    **dict.fromkeys(("BASH_ENV", "ENV", "PROMPT_COMMAND", "ZDOTDIR", "SHELLOPTS", "BASHOPTS", "IFS",
                     "INPUTRC", "CDPATH", "GLOBIGNORE"), "shell start-up"),
    # programs that tools run on the user's behalf
    **dict.fromkeys(("EDITOR", "VISUAL", "PAGER", "BROWSER", "SSH_ASKPASS", "SUDO_ASKPASS"), "program run"),
    # interpreters load code from these (modules, start-up files, options)
    **dict.fromkeys(("NODE_OPTIONS", "NODE_PATH", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT",
                     "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "LUA_PATH",
                     "LUA_CPATH", "GEM_HOME", "GEM_PATH", "RUSTC_WRAPPER", "GCONV_PATH", "LOCPATH",
                     "OPENSSL_CONF", "VIRTUAL_ENV"), "interpreter"),
    # the trust store: a recording's would let another certificate through
    **dict.fromkeys(("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                     "NODE_EXTRA_CA_CERTS"), "trust store"),
    # the cluster or daemon tools talk to
    **dict.fromkeys(("KUBECONFIG", "CONTAINER_HOST"), "cluster"),
}  # fmt: skip
#: prefixes of such variables: the dynamic loader's (``LD_PRELOAD``, ``DYLD_INSERT_LIBRARIES``),
#: Python's (``PYTHONPATH``, ``PYTHONSTARTUP``), npm's settings (its script shell), Python
#: environments' (``CONDA_*``, ``PYENV_*``), git's (the repository, work tree, ssh command,
#: configuration), bash's exported functions, docker's and Kubernetes' daemons
UNSAFE_PREFIXES = (
    ("LD_", "loader"), ("DYLD_", "loader"), ("PYTHON", "interpreter"), ("NPM_CONFIG_", "interpreter"),
    ("CONDA_", "interpreter"), ("PYENV_", "interpreter"), ("GIT_", "repository"),
    ("BASH_FUNC_", "shell start-up"),
    ("DOCKER_", "cluster"), ("KUBE", "cluster"), ("PODMAN_", "cluster"),
)  # fmt: skip

#: name parts that mark a secret beyond the credential headers' fragments (``DB_PASS``, ``SSH_KEY``,
#: ``GH_PAT``, ``SENTRY_DSN``)
_SECRET_PARTS = frozenset(
    {"KEY", "KEYS", "PASS", "PWD", "PASSPHRASE", "COOKIE", "PRIVATE", "SESSION", "PAT", "DSN", "JWT",
     "BEARER"}
)  # fmt: skip


class EnvFrom(str, enum.Enum):
    """``--env-from``: what a replay sets of the recorded start environment."""

    RECORDED = "recorded"  #: the recorded variables, set for the agent
    NONE = "none"  #: none: the agent gets pvisor's environment as it is


class EnvOutcome(str, enum.Enum):
    """``start_state.environment`` of a replay's result: what became of the start environment."""

    SET = "set"  #: the recorded variables were set for the agent
    NOT_SET = "not_set"  #: ``--env-from none``
    NOT_RECORDED = "not_recorded"  #: the source keeps none (a gateway capture, a native file)


class StartWarning(str, enum.Enum):
    """Codes of the result's warnings about the start state (docs/result-protocol.md)."""

    #: the non-empty --workspace was kept as given, not restored
    WORKSPACE_NOT_RESTORED = "workspace_not_restored"
    #: the journal run keeps no start environment (a gateway capture)
    NO_RECORDED_ENVIRONMENT = "no_recorded_environment"
    #: the restored start snapshot withheld secret files (``.env``, keys...): the user supplies them
    SECRET_FILES_WITHHELD = "secret_files_withheld"


class WorkspaceOutcome(str, enum.Enum):
    """``start_state.workspace`` of a replay's result: what the agent started in."""

    RESTORED = "restored"  #: a start snapshot restored into the empty workspace
    KEPT = "kept"  #: the workspace held something: kept as given (one warning)
    NO_RESTORE = "no_restore"  #: ``--no-restore``: the workspace as given
    NO_SNAPSHOT = "no_snapshot"  #: the source has no start snapshot (a native file, a run without one)


def secret_variable(name: str, value: str) -> bool:
    """Whether variable ``name`` may hold a secret: its name (a credential header's fragments,
    a ``KEY``, ``PASS``... part, a key-shaped name) or its value (a key-shaped token, a URL with
    a password)."""
    upper = name.upper()
    if is_secret_header(name) or has_key_shape(name):
        return True
    parts = set(re.split(r"[^A-Z0-9]+", upper))
    if parts & _SECRET_PARTS or upper.endswith("KEY"):
        return True
    return secret_value(value)


def unsafe(name: str) -> str | None:
    """Why variable ``name`` is never recorded nor set (:data:`UNSAFE_NAMES`,
    :data:`UNSAFE_PREFIXES`; any case), or None."""
    upper = name.upper()
    if upper in UNSAFE_NAMES:
        return UNSAFE_NAMES[upper]
    return next((why for prefix, why in UNSAFE_PREFIXES if upper.startswith(prefix)), None)


def routing(name: str) -> bool:
    """Whether variable ``name`` names where requests go (:data:`ROUTING_NAMES`,
    :data:`ROUTING_SUFFIXES`; any case): a replay never sets it."""
    upper = name.upper()
    return upper in ROUTING_NAMES or upper.endswith(ROUTING_SUFFIXES)


def _settable(name: str, value: str) -> bool:
    """Whether the OS can set ``name`` to ``value`` and it is short enough to record; checked
    before the secret search, whose cost grows faster than the value's length."""
    ok_name = bool(name) and "=" not in name and "\x00" not in name
    return ok_name and "\x00" not in value and len(value.encode("utf-8", "surrogatepass")) <= MAX_VALUE_BYTES


def _machine(name: str) -> bool:
    return name in MACHINE_NAMES or name.startswith(MACHINE_PREFIXES)


def _escaped(name: str) -> str:
    """A name that is not UTF-8 as ``left_out`` shows it: its bytes, those not ASCII as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")


def _utf8(text: str) -> bool:
    return not_utf8(text) is None  # a byte os.environ decoded as a lone surrogate fails


def recorded_environment(
    base: Mapping[str, str], env: Mapping[str, str], cwd: Path, private: Collection[str] = ()
) -> dict[str, Any]:
    """The start environment document of an agent started in ``cwd`` with ``env``, where
    ``base`` is the environment pvisor began from (its own and a replay's added variables):
    ``{schema, cwd, variables: {name: value}, left_out: {name: why}}``, ``why`` one of
    ``secret``, ``credential``, ``unsafe``, ``removed``, ``not_utf8`` (the name escaped when it
    is the part that is not UTF-8), ``too_long`` (module docstring). ``private``: names never
    recorded whatever their values (a rollout's ``key_file``), left out as ``secret``."""
    credentials = set(offline_credentials(env)) | set(offline_credentials(base))
    variables: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for name in sorted(base):
        # a credential (or what may be one) pvisor removed or replaced for the agent
        if env.get(name) != base[name] and not _machine(name) and not has_key_shape(name) and _utf8(name):
            if name in credentials or secret_variable(name, base[name] if _utf8(base[name]) else ""):
                left_out[name] = "removed"
    for name in sorted(env):
        value = env[name]
        if base.get(name) != value or _machine(name):
            continue  # pvisor's own for this run, or the machine's
        if name in private:
            if not has_key_shape(name):
                left_out[name] = "secret"
            continue
        if not _utf8(name):
            shown = _escaped(name)
            if not has_key_shape(shown):
                left_out[shown] = "not_utf8"
            continue
        if unsafe(name) is not None:
            why = "unsafe"
        elif not _utf8(value):
            why = "not_utf8"
        elif name in credentials:
            why = "credential"
        elif len(value.encode("utf-8")) > MAX_VALUE_BYTES:  # before the secret search (its cost)
            why = "too_long"
        elif secret_variable(name, value):
            why = "secret"
        else:
            variables[name] = value
            continue
        if not has_key_shape(name):
            left_out[name] = why
    return {"schema": SCHEMA, "cwd": str(cwd), "variables": variables, "left_out": left_out}


#: a recorded ``cwd`` longer than this (characters; Linux's PATH_MAX) is no path a run recorded
MAX_CWD_CHARS = 4096


def recorded_cwd(doc: Any, fallback: str | None) -> str | None:
    """The working directory the start environment document ``doc`` names (a path text, as
    ``start_state.cwd.recorded`` shows it), None when a crafted ``doc`` holds no path there (no
    object, not a string, NUL, longer than :data:`MAX_CWD_CHARS`); ``fallback`` when ``doc`` is
    None (no document recorded)."""
    if doc is None:
        return fallback
    cwd = doc.get("cwd") if isinstance(doc, dict) else None
    if not isinstance(cwd, str) or "\x00" in cwd or len(cwd) > MAX_CWD_CHARS:
        return None
    return cwd


def replay_variables(doc: dict[str, Any] | None, rewrite: Any) -> dict[str, str]:
    """The variables a replay sets from the recorded document ``doc`` (None: none), each value
    with the recorded paths rewritten to the replay's (``rewrite(text) -> text``: the recorded
    workspace, home and run directory named in a value become the new ones). A variable that
    reads as a secret now (the rules may have grown since it was recorded), a machine's one, an
    unsafe one (:func:`unsafe`) and one that routes requests (:func:`routing`) are never set; nor,
    from a crafted document, one the OS cannot set (a name empty or holding ``=`` or NUL, a value
    holding NUL), a value longer than :data:`MAX_VALUE_BYTES` (as recording leaves out), or
    anything of a document that is no object."""
    if not isinstance(doc, dict) or not isinstance(doc.get("variables"), dict):
        return {}
    return {
        str(k): rewrite(v)
        for k, v in doc["variables"].items()
        if isinstance(v, str)
        and _settable(str(k), v)
        and not _machine(str(k))
        and unsafe(str(k)) is None
        and not routing(str(k))
        and not secret_variable(str(k), v)
    }
