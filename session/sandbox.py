"""The sandbox of a run's agent: bubblewrap (``bwrap``) around the agent, with the relay of
:mod:`pvisor.session.relay` inside as its supervisor (docs/replay.md "The sandbox").

- :class:`SandboxMode` (``--sandbox auto|bwrap|none``; :data:`ENV_SANDBOX` sets the default)
  and :class:`SandboxNetwork` (``--sandbox-network gateway|host``).
- :func:`bwrap_problem`: whether a working bwrap is here (on PATH, or :data:`ENV_BWRAP`, and a
  trial ``bwrap --ro-bind / / --unshare-net --unshare-pid --die-with-parent --cap-drop ALL true``
  exits 0),
  tried once per process; :func:`resolve_mode` turns ``auto`` into ``bwrap`` or ``none`` (one
  warning) and refuses ``bwrap`` where it cannot run (exit 69).
- :class:`Sandbox`: what one agent's sandbox binds (writable, hidden, bound back read-only), its
  network rule and the relay's sockets; :meth:`Sandbox.argv` the bwrap command line, and after
  the run :attr:`Sandbox.status` (the relay's status line, :func:`parse_status`) and
  :meth:`Sandbox.to_json`. The relay's configuration and status never pass through a file the
  agent can write: an unlinked file and a pipe only the relay holds (docs/replay.md "The sandbox").
- :class:`UnixRelay`: a forwarder outside the sandbox from a Unix socket to a TCP port on
  127.0.0.1 (intercept mode's mitmdump), the other end of the relay's listener inside.

Mount order (bwrap applies its options in order, a later mount over an earlier one): ``/``
read-only, ``/dev``, ``/proc``, then every other mount by the depth of its path (a deeper path
mounts over its parent's mount), at one depth the hidden ones (an empty tmpfs) first, then
those bound back read-only, then the writable ones; last, the hidden places of Unix sockets
(:func:`socket_places`) remounted read-only.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from pvisor.core.errors import UnavailableError, UsageError
from pvisor.core.helpers import frozen, helper_argv

#: what every sandbox is made with beside its mounts and its network: a PID namespace of its own
#: (a kill of pvisor ends every process in it), bwrap's death with pvisor's, and no capability
#: left: bwrap started by root keeps root's capabilities inside unless told, and with
#: CAP_SYS_ADMIN a recorded ``umount ~`` or ``mount -o remount,rw /`` undoes the sandbox
NAMESPACES = ("--unshare-pid", "--die-with-parent", "--cap-drop", "ALL")

#: the environment variable that sets ``--sandbox``'s default (``auto``, ``bwrap`` or ``none``)
ENV_SANDBOX = "PVISOR_SANDBOX"
#: the environment variable naming the bwrap executable (default: ``bwrap`` on PATH)
ENV_BWRAP = "PVISOR_BWRAP"
#: how long the trial bwrap may take, seconds
TRIAL_TIMEOUT_S = 10.0
#: how many entries of the private /tmp the result lists at most
TMP_LISTED = 100


class SandboxMode(str, enum.Enum):
    """``--sandbox``: where the agent runs."""

    AUTO = "auto"  #: bwrap when it is installed and works here, else none (one warning)
    BWRAP = "bwrap"  #: in a bubblewrap sandbox; refused (exit 69) where bwrap cannot run
    NONE = "none"  #: as the user's own process, without a sandbox


class SandboxNetwork(str, enum.Enum):
    """``--sandbox-network``: what the sandboxed agent can reach."""

    GATEWAY = "gateway"  #: a network namespace with only loopback, where the relay reaches the gateway
    HOST = "host"  #: the host's network (no network namespace); the relay only supervises


class SandboxUnavailable(UnavailableError):
    """``--sandbox bwrap`` where bwrap cannot run, or a sandbox that cannot start (exit 69);
    a replay's ``errors[].code`` ``sandbox_unavailable``."""

    code = "sandbox_unavailable"


def default_mode(fallback: SandboxMode) -> SandboxMode:
    """``--sandbox``'s default: :data:`ENV_SANDBOX` when set, else ``fallback``. UsageError
    (exit 2) for a value that is not a mode."""
    value = os.environ.get(ENV_SANDBOX, "")
    if not value:
        return fallback
    try:
        return SandboxMode(value)
    except ValueError:
        raise UsageError(
            f"{ENV_SANDBOX}={value!r}: expected one of {', '.join(m.value for m in SandboxMode)}"
        ) from None


_TRIED: dict[str, str | None] = {}


def bwrap_path() -> str | None:
    """The bwrap executable: :data:`ENV_BWRAP` (a path, or a name looked up on PATH), else
    ``bwrap`` on PATH (None: not found, or not an executable file)."""
    given = os.environ.get(ENV_BWRAP)
    if given:
        return shutil.which(given)  # a path is checked as it is, a name looked up on PATH
    return shutil.which("bwrap")


def bwrap_problem() -> str | None:
    """Why bwrap cannot sandbox an agent here (None: it can): not installed, or its trial
    (new user, network and PID namespaces) fails, with its first line of output. Tried once per
    process and bwrap path."""
    path = bwrap_path()
    key = path or ""
    if key in _TRIED:
        return _TRIED[key]
    if path is None:
        where = os.environ.get(ENV_BWRAP)
        problem = (
            # a directory or a file without execute permission is there, but cannot be run
            f"{ENV_BWRAP}={where}: not an executable file (expected the bwrap executable)"
            if where and os.sep in where and os.path.exists(where)
            else f"{ENV_BWRAP}={where}: no such executable"
            if where
            else "bubblewrap (bwrap) is not installed (the Debian package bubblewrap)"
        )
    else:
        argv = [path, "--ro-bind", "/", "/", *NAMESPACES, "--unshare-net", "true"]
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=TRIAL_TIMEOUT_S
            )
            first = next(
                (ln.strip() for ln in done.stderr.decode("utf-8", "replace").splitlines() if ln.strip()), ""
            )
            problem = (
                None
                if done.returncode == 0
                else f"{path} cannot make its namespaces here (exit {done.returncode}"
                + (f": {first[:200]}" if first else "")
                + "; user namespaces may be refused, as inside many containers)"
            )
        except subprocess.TimeoutExpired:
            problem = f"{path} did not answer within {TRIAL_TIMEOUT_S:g} s"
        except OSError as exc:
            problem = f"cannot run {path}: {exc.strerror}"
    _TRIED[key] = problem
    return problem


def resolve_mode(mode: SandboxMode, warn: Callable[[str], None]) -> SandboxMode:
    """``bwrap`` or ``none``: ``auto`` is bwrap when :func:`bwrap_problem` finds none, else none
    with one warning naming ``--sandbox none`` and :data:`ENV_SANDBOX`; ``bwrap`` where it cannot
    run raises :class:`SandboxUnavailable` (exit 69)."""
    if mode is SandboxMode.NONE:
        return mode
    problem = bwrap_problem()
    if problem is None:
        return SandboxMode.BWRAP
    if mode is SandboxMode.BWRAP:
        raise SandboxUnavailable(f"--sandbox bwrap: {problem}; give --sandbox none to run without one")
    warn(
        f"no sandbox: {problem}; the agent runs without one (give --sandbox none, or set "
        f"{ENV_SANDBOX}=none, to say so and silence this)"
    )
    return SandboxMode.NONE


# --------------------------------------------------------------------------- what is bound


def real(path: str | os.PathLike[str]) -> str:
    """``path`` absolute with every symlink resolved (what bwrap mounts)."""
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (both real paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def install_root(path: str, hidden: str) -> str:
    """What to bind back for ``path`` (a real path inside the hidden directory ``hidden``) so
    that it runs: the directory above its outermost ``node_modules`` (an npm prefix), else the
    nearest virtual environment around it (``pyvenv.cfg``), else the prefix of a ``bin``
    directory, else its directory; never ``hidden`` itself or above it."""
    parts = Path(path).parts
    candidates: list[str] = []
    if "node_modules" in parts:
        candidates.append(str(Path(*parts[: parts.index("node_modules")])))
    d = os.path.dirname(path) if os.path.isfile(path) else path
    probe = d
    while inside(probe, hidden) and probe != hidden:
        if os.path.exists(os.path.join(probe, "pyvenv.cfg")):
            candidates.append(probe)
            break
        probe = os.path.dirname(probe)
    if os.path.basename(d) == "bin":
        candidates.append(os.path.dirname(d))
    candidates.append(d)
    for c in candidates:
        if inside(c, hidden) and c != hidden:
            return c
    return path


def shebang_interpreter(exe: str, path_env: str | None) -> str | None:
    """The interpreter a script's ``#!`` line names (``#!/usr/bin/env node``: ``node`` looked
    up on ``path_env``), real; None for no script or none found."""
    try:
        with open(exe, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    name = words[0]
    if os.path.basename(name) == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        if not rest:
            return None
        found = shutil.which(rest[0], path=path_env)
        return real(found) if found else None
    return real(name) if os.path.exists(name) else None


#: where Unix sockets live by convention (the Filesystem Hierarchy Standard's ``/run``, and
#: ``/var/run`` that is often a link to it: docker, dbus, systemd; ``/var/tmp``): a network
#: namespace does not cover a socket file, whose connect() needs no write to its mount
SOCKET_PLACES = ("/run", "/var/run", "/var/tmp")


def socket_places(env: dict[str, str] | os._Environ[str]) -> list[str]:
    """The directories that hold this machine's Unix sockets, real and existing, to hide from
    an agent whose network is the gateway: :data:`SOCKET_PLACES`, ``$XDG_RUNTIME_DIR``, the
    directory of ``$SSH_AUTH_SOCK`` and of each ``unix:path=`` of
    ``$DBUS_SESSION_BUS_ADDRESS`` (an abstract socket is the network namespace's); never ``/``
    nor what lies in ``/tmp`` (a private one already)."""
    wanted: list[str] = list(SOCKET_PLACES)
    if env.get("XDG_RUNTIME_DIR"):
        wanted.append(env["XDG_RUNTIME_DIR"])
    if env.get("SSH_AUTH_SOCK"):
        wanted.append(os.path.dirname(env["SSH_AUTH_SOCK"]))
    for address in (env.get("DBUS_SESSION_BUS_ADDRESS") or "").split(";"):
        kind, _, params = address.partition(":")
        for param in params.split(",") if kind == "unix" else ():
            key, _, value = param.partition("=")
            if key == "path" and value:
                wanted.append(os.path.dirname(value))
    found: list[str] = []
    for p in wanted:
        if not os.path.isabs(p):
            continue
        r = real(p)
        if os.path.isdir(r) and r != "/" and not inside(r, "/tmp") and r not in found:
            found.append(r)
    return found


@dataclass
class Sandbox:
    """One agent's sandbox (a bwrap mode). Fields: ``bwrap`` the executable, ``network``;
    ``writable`` (the workspace, the run directory, ``--sandbox-allow``), ``hidden`` (the
    user's home, the pvisor data directory, the recorded workspace; ``/tmp`` is a private tmpfs
    as well), ``bound_back`` (read-only, inside a hidden directory: what the agent and pvisor's
    relay need to run), real paths; ``relayed``: (host, port, Unix socket) the relay listens on
    inside and forwards to; ``socket_dir``: the private directory of those sockets (bound in).
    After the run: ``status`` (the relay's status line, :func:`parse_status`; None when it said
    none: it was killed, or never started)."""

    bwrap: str
    network: SandboxNetwork
    writable: list[str]
    hidden: list[str]
    bound_back: list[str]
    socket_dir: str
    relayed: list[tuple[str, int, str]] = field(default_factory=list)
    status: dict[str, Any] | None = None
    #: those of ``hidden`` that stay read-only as well (the places of Unix sockets: what was
    #: read-only stays so, only emptied)
    sealed: list[str] = field(default_factory=list)

    def bind_back(self, path: str | os.PathLike[str]) -> None:
        """Bind ``path`` back read-only where a hidden directory (or /tmp) covers it (intercept
        mode's CA, made once mitmdump started)."""
        p = real(path)
        if any(inside(p, w) for w in self.writable) or p in self.bound_back:
            return
        if any(inside(p, h) for h in ["/tmp", *self.hidden]) and os.path.exists(p):
            self.bound_back.append(p)

    def mounts(self) -> list[str]:
        """bwrap's mount options, in order (module docstring)."""
        order = {"--tmpfs": 0, "--ro-bind": 1, "--bind": 2}
        items: list[tuple[str, str]] = [("--tmpfs", "/tmp")]
        items += [("--tmpfs", p) for p in self.hidden]
        items += [("--ro-bind", p) for p in self.bound_back]
        items += [("--bind", p) for p in [*self.writable, self.socket_dir]]
        items.sort(key=lambda it: (len(Path(it[1]).parts), order[it[0]]))
        argv = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for kind, p in dict.fromkeys(items):
            argv += [kind, p] if kind == "--tmpfs" else [kind, p, p]
        for p in self.sealed:  # last: the mounts inside were made first (their directories)
            if p in self.hidden and p not in self.bound_back:  # never what is bound there
                argv += ["--remount-ro", p]
        return argv

    def argv(self, relay: list[str], workspace: str) -> list[str]:
        """The command line that starts ``relay`` (the relay's own command line) in the sandbox,
        its working directory ``workspace``."""
        net = ["--unshare-net"] if self.network is SandboxNetwork.GATEWAY else []
        return [self.bwrap, *self.mounts(), *net, *NAMESPACES, "--chdir", workspace, "--", *relay]

    def relay_argv(self, config_fd: int) -> list[str]:
        """The relay's command line: pvisor's interpreter (``-I -S``) with the relay's code, or
        a bundle's helper (:func:`~pvisor.core.helpers.helper_argv`); ``config_fd`` the
        descriptor of :meth:`config_file`."""
        from pvisor.session import relay

        code = ""
        if not frozen():  # a bundle runs its helper by name: no source file to give it
            with open(relay.__file__, encoding="utf-8") as f:
                code = f.read()
        return helper_argv("relay", code, [str(config_fd)], site=False)

    def config_file(self, agent_argv: list[str], ready_fd: int, grace: float, stray_grace: float) -> int:
        """The relay's configuration (JSON: the agent's command line, the ports to relay, the
        status pipe ``ready_fd``, the graces) in an unlinked file, read from its start: the
        descriptor (inheritable: the caller passes it to the relay, and closes it). Never a
        path: nothing the agent can reach from the sandbox holds it."""
        doc = {
            "argv": agent_argv,
            "listen": [list(r) for r in self.relayed],
            "ready_fd": ready_fd,
            "grace": grace,
            "stray_grace": stray_grace,
            "skip_tmp": [self.socket_dir, *self.hidden, *self.bound_back, *self.writable],
            "tmp_listed": TMP_LISTED,
        }
        with tempfile.TemporaryFile() as f:  # unlinked at once: no path names it
            f.write(json.dumps(doc).encode("utf-8"))
            f.flush()
            fd = os.dup(f.fileno())
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
        return fd

    def to_json(self) -> dict[str, Any]:
        """What the sandbox allowed, for a run's report and a replay's result."""
        return {
            "mode": SandboxMode.BWRAP.value,
            "network": self.network.value,
            "writable": list(self.writable),
            "hidden": ["/tmp", *self.hidden],
            "read_only_bound_back": list(self.bound_back),
            "failed_calls": [],
            "tmp_writes": list((self.status or {}).get("tmp") or []),
            "fallback": None,
        }

    def close(self) -> None:
        """Remove the sockets' private directory. Idempotent."""
        shutil.rmtree(self.socket_dir, ignore_errors=True)


#: the relay's status line at most (bytes): more is no status of the relay's
STATUS_LIMIT = 1 << 20


def parse_status(line: bytes | str) -> dict[str, Any] | None:
    """The relay's status line (:mod:`pvisor.session.relay`): ``{"returncode": int, "strays":
    int >= 0, "tmp": [str, ...], "stopped": bool}``, each field type-checked; None for anything
    else (no line: the relay was killed or died; a line of another shape), never an exception."""
    try:
        doc = json.loads(line)
    except (ValueError, TypeError):
        return None
    if not isinstance(doc, dict):
        return None
    rc, strays, tmp, stopped = (doc.get(k) for k in ("returncode", "strays", "tmp", "stopped"))
    if type(rc) is not int or type(strays) is not int or strays < 0 or type(stopped) is not bool:
        return None
    if not isinstance(tmp, list) or not all(isinstance(t, str) for t in tmp):
        return None
    return {"returncode": rc, "strays": strays, "tmp": tmp[:TMP_LISTED], "stopped": stopped}


def plan_sandbox(
    *,
    network: SandboxNetwork,
    workspace: Path,
    run_dir: Path,
    data_dir: Path,
    allow: Iterable[Path] = (),
    hide: Iterable[Path | str] = (),
    executables: Iterable[str] = (),
    path_env: str | None = None,
    extra_read: Iterable[str] = (),
) -> Sandbox:
    """The :class:`Sandbox` of one agent: ``workspace``, ``run_dir`` and ``allow`` writable;
    the user's home (``$HOME``), ``data_dir`` and ``hide`` (the recorded workspace) hidden
    (those that exist), and with the gateway's network the places of this machine's Unix
    sockets (:func:`socket_places`); bound back read-only where they lie in a hidden directory (``/tmp``
    included): the ``executables`` (real path) and the interpreter each one's ``#!`` line names
    (looked up on ``path_env``), pvisor's own interpreter and its prefixes, ``extra_read`` (a
    CA file). Its socket directory is made (0700, under /tmp: a Unix socket's path is at most
    108 bytes). Raises SandboxUnavailable when bwrap is gone meanwhile."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable("--sandbox: bwrap is gone")
    writable = list(dict.fromkeys(real(p) for p in [workspace, run_dir, *allow]))
    home = os.environ.get("HOME")
    wanted = [*(p for p in [home] if p), data_dir, *hide]
    sealed = socket_places(os.environ) if network is SandboxNetwork.GATEWAY else []
    # one the agent may write anyway (a workspace that holds /var/tmp) is left as it is
    sealed = [p for p in sealed if not any(inside(p, w) for w in writable)]
    wanted += sealed  # the host's network (host) keeps its sockets: its resolver's under /run
    hidden: list[str] = []
    for p in wanted:
        r = real(p)
        if os.path.isdir(r) and r != "/" and r not in hidden:
            hidden.append(r)
    # a hidden directory inside another (a recorded home in its run directory) is hidden with it
    hidden = [
        p for p in hidden
        if not any(h != p and inside(p, h) and not any(inside(p, w) and inside(w, h) for w in writable)
                   for h in hidden)
    ]  # fmt: skip
    # what must stay readable: the agent's executables and interpreters, pvisor's interpreter
    needed: list[str] = []
    for exe in executables:
        r = real(exe)
        needed.append(r)
        interp = shebang_interpreter(r, path_env)
        if interp:
            needed.append(interp)
    needed += [real(sys.executable), real(sys.prefix), real(sys.base_prefix), *(real(p) for p in extra_read)]
    covered = ["/tmp", *hidden]
    bound_back: list[str] = []
    for p in needed:
        if any(inside(p, w) for w in writable):
            continue
        for h in covered:
            if inside(p, h):
                root = install_root(p, h)
                if root not in bound_back and os.path.exists(root):
                    bound_back.append(root)
                break
    socket_dir = tempfile.mkdtemp(prefix="pvisor-", dir="/tmp")
    return Sandbox(bwrap, network, writable, hidden, bound_back, socket_dir, sealed=sealed)


def no_sandbox(fallback: str | None = None) -> dict[str, Any]:
    """The sandbox record of an agent run without one; ``fallback``: why ``--sandbox auto`` ran
    none (:func:`bwrap_problem`), None when none was asked for."""
    return {
        "mode": SandboxMode.NONE.value,
        "network": None,
        "writable": [],
        "hidden": [],
        "read_only_bound_back": [],
        "failed_calls": [],
        "tmp_writes": [],
        "fallback": fallback,
    }


def sandbox_record(box: Sandbox | None, asked: SandboxMode) -> dict[str, Any]:
    """The sandbox record of a run: what ``box`` allowed, or :func:`no_sandbox` (with why, when
    ``asked`` was ``auto`` and resolved to none: bwrap's problem here, already found)."""
    if box is not None:
        return box.to_json()
    return no_sandbox(bwrap_problem() if asked is SandboxMode.AUTO else None)


def check_allow(allow: Iterable[Path], data_dir: Path, hide: Iterable[Path | str] = ()) -> None:
    """Refuse (UsageError, exit 2) a ``--sandbox-allow`` path that is ``/`` or holds what the
    sandbox hides: the user's home (``$HOME``), the pvisor data directory ``data_dir`` (the
    journal and every run) or ``hide`` (what the recorded run used): bound writable, it would
    make them visible and writable again. A path inside one of them (``~/.claude``) is allowed:
    it alone becomes visible and writable. ``/tmp`` and a path holding it are refused (the
    machine's own /tmp, with other runs' gateway sockets, in place of the private one), and so
    is a path holding or inside ``/proc`` or ``/dev`` (the machine's processes and devices)."""
    home = os.environ.get("HOME")
    hidden = [(p, "your home") for p in [home] if p]
    hidden.append((data_dir, "the pvisor data directory (the journal and its runs)"))
    hidden += [(p, "what the recorded run used") for p in hide]
    for path in allow:
        r = real(path)
        if r == "/":
            raise UsageError(
                f"--sandbox-allow {path}: the whole file system would be writable and nothing hidden; "
                "allow only what the agent needs (e.g. --sandbox-allow ~/.claude), or give --sandbox none"
            )
        for system, what in (
            ("/proc", "the machine's processes"),
            ("/dev", "the machine's devices"),
        ):
            if inside(system, r) or inside(r, system):
                raise UsageError(
                    f"--sandbox-allow {path}: {system} would be the machine's own ({what}), not the "
                    "sandbox's; allow only what the agent needs, or give --sandbox none"
                )
        if inside("/tmp", r):
            raise UsageError(
                f"--sandbox-allow {path}: it holds /tmp, which would be the machine's own (with other runs' "
                "gateway sockets) instead of the sandbox's private one; allow a directory inside it, or "
                "give --sandbox none"
            )
        for h, what in hidden:
            rh = real(h)
            if rh != "/" and inside(rh, r):
                raise UsageError(
                    f"--sandbox-allow {path}: it holds {rh}, {what}, which the sandbox hides (an allowed "
                    "path is visible and writable to the agent); allow a path inside it (e.g. "
                    "--sandbox-allow ~/.claude), or give --sandbox none"
                )


def unused_options(network: SandboxNetwork, allow: Iterable[Path]) -> str | None:
    """The warning for sandbox options given to an agent that runs without a sandbox
    (``--sandbox-network host``, ``--sandbox-allow``), None when none was given."""
    given = (["--sandbox-network host"] if network is SandboxNetwork.HOST else []) + (
        ["--sandbox-allow"] if list(allow) else []
    )
    if not given:
        return None
    verb = "has" if len(given) == 1 else "have"
    return (
        f"{' and '.join(given)} {verb} no effect without a sandbox: the agent runs as your own process, "
        "with your files and your network"
    )


#: what an observation says when the sandbox stopped a call: (pattern, reason); best effort
FAILURE_SIGNS: tuple[tuple[str, str], ...] = (
    (r"[Rr]ead-only file system|EROFS", "read_only"),
    (r"[Pp]ermission denied|EACCES|EPERM", "permission_denied"),
    (r"Network is unreachable|Connection refused|Couldn't connect to server|Failed to connect|"
     r"Could not resolve host|Temporary failure in name resolution|Name or service not known|"
     r"ECONNREFUSED|ENETUNREACH|EAI_AGAIN|ENOTFOUND", "network"),
)  # fmt: skip
#: what an observation says of a path the sandbox hides (an empty directory in its place)
NOT_FOUND = r"[Nn]o such file or directory|ENOENT"


def failed_calls(
    record: dict[str, Any], observations: list[list[Any]], text_of: Callable[[Any], str], first: int = 1
) -> list[dict]:
    """The calls whose observation says the sandbox stopped them: per step (numbered from
    ``first``) and result (``call_id``, ``content`` read with ``text_of``), one entry
    ``{step, call_id, reason, evidence, reasons: [{reason, evidence}]}``: ``reasons`` each reason
    found, in the order of the lines, with the first line that shows it (a line matching
    :data:`FAILURE_SIGNS`, or :data:`NOT_FOUND` naming a hidden path: ``hidden``); ``reason``
    and ``evidence`` the first of them. Empty without a sandbox."""
    import re

    if record.get("mode") != SandboxMode.BWRAP.value:
        return []
    hidden = [h for h in record.get("hidden", []) if h != "/tmp"]
    found: list[dict] = []
    for step, results in enumerate(observations, first):
        for r in results:
            text = text_of(r.content)
            reasons: dict[str, str] = {}
            for line in re.split(r"\r?\n|\\n", text):  # a JSON-encoded output keeps its \n escaped
                for pattern, why in FAILURE_SIGNS:
                    if why not in reasons and re.search(pattern, line):
                        reasons[why] = line.strip()[:200]
                if "hidden" not in reasons and re.search(NOT_FOUND, line) and any(h in line for h in hidden):
                    reasons["hidden"] = line.strip()[:200]
            if reasons:
                listed = [{"reason": why, "evidence": line} for why, line in reasons.items()]
                found.append({"step": step, "call_id": r.call_id, **listed[0], "reasons": listed})
    return found


def sandbox_summary(record: dict[str, Any] | None, where: str = "result.json") -> str | None:
    """The line a replay prints of its sandbox record (None: the agent did not run): its mode and
    network and how many calls it stopped (``where`` names the document holding them), or that
    the calls ran without one (and why, when ``--sandbox auto`` fell back)."""
    if not record:
        return None
    if record.get("mode") != SandboxMode.BWRAP.value:
        why = f"; {record['fallback']}" if record.get("fallback") else ""
        return f"sandbox: none (no sandbox: the calls ran as you{why})"
    n = len(record.get("failed_calls") or [])
    stopped = f"{n} call(s) stopped by it ({where} sandbox.failed_calls)" if n else "no call stopped by it"
    return f"sandbox: bwrap (network {record.get('network')}); {stopped}"


# --------------------------------------------------------------------------- a relay outside


class UnixRelay:
    """A forwarder outside the sandbox: connections to the Unix socket ``path`` go to
    ``host``:``port`` (intercept mode's mitmdump), byte for byte. ``await start()``, ``await
    stop()``."""

    def __init__(self, path: str, host: str, port: int) -> None:
        self.path, self.host, self.port = path, host, port
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await asyncio.gather(_pump(reader, up_w), _pump(up_r, writer))
        finally:
            writer.close()
            up_w.close()
            if task is not None:
                self._tasks.discard(task)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):  # before wait_closed, which waits for the connections
                task.cancel()
            await self._server.wait_closed()
            self._server = None


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        writer.close()


__all__ = [
    "ENV_BWRAP",
    "ENV_SANDBOX",
    "Sandbox",
    "SandboxMode",
    "SandboxNetwork",
    "SandboxUnavailable",
    "UnixRelay",
    "bwrap_problem",
    "check_allow",
    "default_mode",
    "failed_calls",
    "no_sandbox",
    "parse_status",
    "plan_sandbox",
    "resolve_mode",
    "sandbox_record",
    "socket_places",
    "sandbox_summary",
    "unused_options",
]
