"""What contains a run's agent, decided once per run (:mod:`pvisor.session.run` calls it): the
sandbox it runs in (:func:`sandbox_mode`, :func:`agent_sandbox`, :func:`relay_proxy`: the
mechanism is :mod:`pvisor.session.sandbox`) and the key it holds (:class:`AgentKey`,
:func:`key_swap`: the gateway's side is :mod:`pvisor.gateway.credentials`). docs/replay.md
"The sandbox" and "Keys in a continuation"."""

from __future__ import annotations

import enum
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pvisor.core.errors import UsageError
from pvisor.gateway.credentials import KeySwap, UpstreamCredentials
from pvisor.session.sandbox import (
    Sandbox,
    SandboxMode,
    SandboxNetwork,
    UnixRelay,
    check_allow,
    plan_sandbox,
    resolve_mode,
    unused_options,
)
from yarl import URL

if TYPE_CHECKING:
    from pvisor.adapters.agents.base import AgentProfile
    from pvisor.session.run import RunRequest

#: ``warn(line)``: one warning line for the user
Warn = Callable[[str], None]


class AgentKey(str, enum.Enum):
    """The key the agent was given (the ``key`` of the result's and the report's ``sandbox``
    record; docs/replay.md "Keys in a continuation")."""

    AGENT = "agent"  #: its own: the user's key in its environment (or its own login), readable by its tools
    DUMMY = "dummy"  #: a dummy, and no key put in its place (nothing forwarded, or no user key to add)
    SWAPPED = "swapped"  #: a dummy; the gateway puts the user's key in its place when it forwards


def sandbox_mode(req: RunRequest, data_dir: Path, use_home: bool, warn: Warn) -> SandboxMode:
    """The sandbox the agent runs in, resolved (:func:`~pvisor.session.sandbox.resolve_mode`):
    UsageError (exit 2) for ``--use-home`` in a sandbox without ``--sandbox-allow`` and for a
    ``--sandbox-allow`` that is no existing path, ``/`` or holds what the sandbox hides
    (:func:`~pvisor.session.sandbox.check_allow`); SandboxUnavailable (69) for ``--sandbox bwrap``
    where bwrap cannot run. Without a sandbox, one warning for the sandbox options given.
    ``data_dir``: the pvisor data directory (the journal's)."""
    for path in req.sandbox_allow:
        if not os.path.exists(path):
            raise UsageError(
                f"--sandbox-allow {path}: no such file or directory (expected a path the agent may write)"
            )
    check_allow(req.sandbox_allow, data_dir, req.sandbox_hide)
    mode = resolve_mode(req.sandbox, warn)
    if mode is SandboxMode.NONE:
        unused = unused_options(req.sandbox_network, req.sandbox_allow)
        if unused is not None:
            warn(unused)
        return mode
    if mode is SandboxMode.BWRAP and use_home and not req.sandbox_allow:
        raise UsageError(
            "--use-home in a sandbox: your home is hidden from the agent there; give --sandbox-allow PATH "
            "for what it may use (e.g. --sandbox-allow ~/.claude), or --sandbox none"
        )
    return mode


def key_swap(req: RunRequest, profile: AgentProfile) -> tuple[UpstreamCredentials | None, str | None]:
    """The key swap of a ``dummy_key`` run that forwards: the gateway's
    :class:`~pvisor.gateway.credentials.UpstreamCredentials` holding the user's key of the
    profile's ``key_env`` (``agent_env`` first, then pvisor's environment) for the profile's
    upstream, and the dummy the agent gets instead (``pvisor-dummy-key-`` and 32 random hex
    digits, new for every run: a local process that never read the agent's environment cannot
    use the key through the gateway). (None, None) when there is no key to swap. UsageError
    (exit 2) in intercept mode, whose forwards are never swapped."""
    real = {**os.environ, **req.agent_env}.get(profile.key_env) if profile.key_env else None
    if not real:
        return None, None
    if req.intercept is not None:
        raise UsageError(
            "a dummy key is given through the reverse proxy only: in intercept mode the agent would send "
            f"it to the model host unswapped (drop --intercept, or let the agent keep {profile.key_env})"
        )
    dummy = "pvisor-dummy-key-" + secrets.token_hex(16)
    try:
        return UpstreamCredentials([KeySwap(profile.upstream, dummy, real)]), dummy
    except ValueError as exc:  # a key too short or with white space: named, never shown
        raise UsageError(f"{profile.key_env}: {exc}") from None


def agent_sandbox(
    req: RunRequest, mode: SandboxMode, workspace: Path, run_dir: Path, data_dir: Path, exe: str
) -> Sandbox | None:
    """The agent's :class:`~pvisor.session.sandbox.Sandbox` when it runs in bwrap: the
    workspace, the run directory and ``--sandbox-allow`` writable; the user's home, the data
    directory and the request's ``sandbox_hide`` hidden; the agent's executable and
    interpreter and pvisor's own bound back where hidden (intercept mode's CA once made:
    :func:`relay_proxy`). ``mode``: the resolved ``--sandbox``; ``data_dir``: the journal's
    directory; ``exe``: the agent's executable."""
    if mode is not SandboxMode.BWRAP:
        return None
    path_env = {**os.environ, **req.agent_env}.get("PATH")
    return plan_sandbox(
        network=req.sandbox_network,
        workspace=workspace,
        run_dir=run_dir,
        data_dir=data_dir,
        allow=req.sandbox_allow,
        hide=req.sandbox_hide,
        executables=[exe],
        path_env=path_env,
    )


async def relay_proxy(box: Sandbox | None, session: Any, intercept: Any) -> UnixRelay | None:
    """Intercept mode in a sandbox with the gateway's network: a forwarder from a Unix socket
    to mitmdump's port, and the relay inside told to listen on that port too. ``session``: the
    started :class:`~pvisor.session.session.Session`; ``intercept``: its intercept settings."""
    if box is None or box.network is not SandboxNetwork.GATEWAY:
        return None
    gw = session.gateway
    box.relayed.append((gw.config.host, gw.port, os.path.join(box.socket_dir, "gateway.sock")))
    if session.proxy is None:
        return None
    if session.proxy.ca_cert is not None:
        box.bind_back(session.proxy.ca_cert)  # the agent trusts pvisor's CA by its path
    path = os.path.join(box.socket_dir, "proxy.sock")
    relay = UnixRelay(path, "127.0.0.1", URL(session.proxy.url).port or 0)
    await relay.start()
    box.relayed.append((intercept.host, URL(session.proxy.url).port or 0, path))
    return relay
