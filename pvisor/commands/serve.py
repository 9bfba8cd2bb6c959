"""``pvisor gateway`` and ``pvisor serve-model``: long-running servers until SIGINT/SIGTERM.

Stopping: the first SIGINT or SIGTERM stops accepting and waits for the exchanges in flight up
to ``--shutdown-grace`` seconds, then cancels the rest; a second signal cancels them at once.
Exit code 130 after SIGINT (Ctrl-C), 0 after SIGTERM (a service stop), 69 when the journal
writer stopped while the gateway ran.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
import stat
from pathlib import Path
from typing import Any

import click
import orjson

from pvisor.adapters.protocols import UPSTREAMS
from pvisor.commands.base import Command, PathParam
from pvisor.commands.logs import show_on_stderr
from pvisor.commands.outputs import check_output_path
from pvisor.commands.params import NEW_RUN_ID, Seconds, Size, max_response_body_option
from pvisor.core.errors import EXIT_UNAVAILABLE, UnavailableError, UsageError
from pvisor.gateway.access import check_token, is_loopback, new_token
from pvisor.gateway.intercept import InterceptConfig, parse_host, parse_redirect
from pvisor.gateway.lifecycle import EventLoop, loop_factory, run_on, tune_gc_for_serving
from pvisor.gateway.proxy import GatewayConfig, os_error_reason
from pvisor.gateway.routing import check_upstream_url
from pvisor.gateway.scripted_model import ScriptedModel, load_script
from pvisor.gateway.scripted_server import ScriptedModelServer
from pvisor.journal.paths import absolute
from pvisor.journal.redact import redact_path
from pvisor.journal.snapshots import SnapshotKind
from pvisor.journal.snapshots import snapshot_driver as find_driver
from pvisor.session.session import Session, SessionConfig, StopSignals

EXIT_INTERRUPTED = 130  # SIGINT, as a shell reports Ctrl-C


def _without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` replaced and a key-shaped part ``REDACTED`` (a key
    pasted into the base path), for error messages."""
    return redact_path(re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@", r"\1***@", url))


def parse_upstreams(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, eq, url = v.partition("=")
        name = name.strip().lower()
        if not eq or name not in UPSTREAMS:
            shown = f"{name}={_without_userinfo(url)}" if eq else v
            raise click.BadParameter(
                f"{shown!r}: expected NAME=URL with NAME one of {', '.join(UPSTREAMS)}",
                param_hint="--upstream",
            )
        try:
            check_upstream_url(url)
        except ValueError as exc:
            raise click.BadParameter(
                f"{name}={_without_userinfo(url)}: {exc} (an http:// or https:// URL with a host)",
                param_hint="--upstream",
            ) from None
        if name in out:
            raise click.BadParameter(f"upstream {name!r} given twice", param_hint="--upstream")
        out[name] = url
    return out


def _write_ready_file(path: str | None, info: dict) -> None:
    if not path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        # a device or a pipe (/dev/null, a FIFO a supervisor reads) is written in place: never
        # replaced, which as root would leave a regular file where /dev/null was
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a FIFO nobody reads: an error, not a hang
            try:
                os.set_blocking(fd, True)
                os.write(fd, orjson.dumps(info) + b"\n")
            finally:
                os.close(fd)
        except OSError as exc:
            why = "no process has the FIFO open for reading" if exc.errno == errno.ENXIO else exc.strerror
            raise UsageError(f"cannot write --ready-file {path}: {why}") from None
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        # 0600 whatever the umask: the URL in it may hold the gateway's token
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as f:
            os.fchmod(fd, 0o600)  # a file left by an earlier process keeps its mode otherwise
            f.write(orjson.dumps(info) + b"\n")
        os.replace(tmp, path)  # readers never see a half-written file
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UsageError(f"cannot write --ready-file {path}: {exc.strerror}") from None


def _exit_code(signals: Any) -> int:
    """A server's exit code after the :class:`~pvisor.session.session.StopSignals` it got: 130
    after SIGINT, 129 after SIGHUP (as a shell reports them), 0 after SIGTERM (a service stop)."""
    if signals.signum == signal.SIGHUP:
        return 128 + signal.SIGHUP
    return EXIT_INTERRUPTED if signals.signum == signal.SIGINT else 0


def _say(line: str) -> None:
    try:
        click.echo(line, err=True)
    except OSError:  # the terminal went away (SIGHUP): the stop goes on without it
        pass


def _stopping(signals: Any, server: Any, grace: float) -> None:
    """Say that the server stops (how long it waits, when something is in flight), and make a
    second signal stop it at once."""
    n = server.in_flight
    if n:
        _say(
            f"stopping: waiting for {n} exchange(s) in flight (up to {grace:g} s; a second signal cancels "
            "them now)"
        )
    else:
        _say("stopping")

    def now() -> None:
        _say("stopping now: cancelling the exchanges in flight")
        server.hurry()

    signals.on_repeat = now


@click.command("gateway", cls=Command)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8787, show_default=True, help="Port; 0 picks a free one."
)
@click.option(
    "--upstream",
    "upstreams",
    multiple=True,
    metavar="NAME=URL",
    help="Upstream for NAME (anthropic, openai, gemini); repeatable. Others use the public API hosts.",
)
@click.option(
    "--run",
    "run_id",
    type=NEW_RUN_ID,
    default=None,
    help="Run id for exchanges without X-Pvisor-Run or /run/<id>/ (default: a new id).",
)
@click.option(
    "--max-body",
    type=Size(1),
    default="64MiB",
    show_default=True,
    help="Largest request body accepted (413 beyond).",
)
@max_response_body_option
@click.option(
    "--stall-timeout",
    type=Seconds(0.1),
    default=600.0,
    show_default=True,
    help="Seconds without upstream bytes before the exchange is given up.",
)
@click.option(
    "--header-timeout",
    type=Seconds(0),
    default=20.0,
    show_default=True,
    help="Seconds a connection may take to send a whole request head before it is closed (0: no limit).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, 1_000_000),
    default=512,
    show_default=True,
    help="Open connections at most; beyond, the oldest idle or slow one is closed, or the new one gets 503.",
)
@click.option(
    "--shutdown-grace",
    type=Seconds(0),
    default=10.0,
    show_default=True,
    help="On SIGINT/SIGTERM, seconds to let exchanges in flight finish before cancelling them.",
)
@click.option(
    "--log-file",
    type=PathParam(dir_okay=False, readable=False),
    default=None,
    help="Append one line per exchange (secrets removed).",
)
@click.option(
    "--ready-file",
    type=PathParam(dir_okay=False, readable=False),
    default=None,
    help='Once listening, write {"url", "run", "pid", "journal"} here as JSON '
    "(before the listening line is printed).",
)
@click.option(
    "--workspace",
    type=PathParam(file_okay=False, exists=True),
    default=None,
    help="Snapshot this directory at start, at every model request and at stop (pvisor snapshot ls RUN).",
)
@click.option(
    "--snapshot-driver",
    "snapshot_driver",
    default="filesystem",
    show_default=True,
    metavar="NAME",
    help="The snapshot driver of --workspace (one registered under pvisor.snapshot_drivers).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Let --host be an address beyond this machine; every request then needs the token in its path.",
)
@click.option(
    "--token",
    envvar="PVISOR_GATEWAY_TOKEN",
    default=None,
    metavar="TOKEN",
    help="The token requests carry as /t/TOKEN/... (default with --allow-remote: a new one, printed). "
    "Given here it shows in ps: prefer $PVISOR_GATEWAY_TOKEN or --token-file.",
)
@click.option(
    "--token-file",
    type=PathParam(dir_okay=False),
    default=None,
    help="Read the token from this file (its first line), instead of --token or $PVISOR_GATEWAY_TOKEN "
    "(giving it with either is refused).",
)
@click.option(
    "--event-loop",
    "event_loop",
    type=click.Choice(["asyncio", "uvloop", "auto"]),
    default="asyncio",
    show_default=True,
    help="uvloop needs pvisor-replay[uvloop]; auto: uvloop when installed, else asyncio's loop.",
)
@click.option(
    "--mode",
    type=click.Choice(["reverse", "intercept"]),
    default="reverse",
    show_default=True,
    help="reverse: agents use the gateway's URL as base URL; intercept: a forward proxy for HTTPS_PROXY "
    "(mitmproxy; docs/intercept.md).",
)
@click.option(
    "--intercept-host",
    "intercept_hosts",
    multiple=True,
    metavar="HOST[:PORT]",
    help="Intercept mode: record this host too (the public Anthropic, OpenAI and Gemini hosts always are).",
)
@click.option(
    "--redirect",
    "redirects",
    multiple=True,
    metavar="HOST=URL",
    help="Intercept mode: send what goes to HOST to URL instead (a local model server, a test upstream).",
)
@click.option(
    "--confdir",
    type=PathParam(file_okay=False),
    default=None,
    help="Intercept mode: the CA's directory (default $PVISOR_CA_DIR, else ~/.local/share/pvisor/ca).",
)
@click.option(
    "--mitmdump",
    default=None,
    metavar="PATH",
    help="Intercept mode: the mitmdump to run (default $PVISOR_MITMDUMP, else the one on PATH).",
)
@click.pass_context
def gateway(ctx: click.Context, **options: Any) -> None:
    """Run the capture gateway: point an agent's base URL at it and every model exchange is
    recorded in the journal. Prints `listening http://HOST:PORT` when ready.

    With --mode intercept it is a forward proxy instead (set HTTPS_PROXY to the URL it prints,
    and make the agent trust the CA of `pvisor ca path`): requests to the model API hosts are
    recorded; every other host is tunnelled untouched and not recorded.

    SIGINT/SIGTERM: stop accepting, let exchanges in flight finish (up to --shutdown-grace),
    cancel the rest (recorded incomplete); a second signal cancels at once. Exit 130 after
    SIGINT, 0 after SIGTERM, 69 if the journal writer stops (disk full, say) while running.

    \b
    Examples:
      pvisor gateway --port 0 --upstream anthropic=https://api.anthropic.com
      ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude -p "fix the test"
      pvisor gateway --mode intercept --port 8080
    """
    # the options (one parameter each, declared by the decorators above) are read by name from
    # ctx.params: session_config() makes the session's record of them once
    config = session_config(ctx)
    log_file, ready_file = options["log_file"], options["ready_file"]
    for option, path in (("--log-file", log_file), ("--ready-file", ready_file)):
        if path:
            check_output_path(path, option)
    loop_choice = EventLoop(options["event_loop"])
    loop_factory(loop_choice)  # uvloop asked for and missing: a usage error before anything starts
    undo = show_on_stderr(("pvisor.journal", "pvisor.gateway"))
    try:
        serving = _serve_gateway(config, ready_file, log_file, options["host"], options["port"])
        code = run_on(loop_choice, serving)
    finally:
        undo()
    ctx.exit(code)


def session_config(ctx: click.Context) -> SessionConfig:
    """The options of ``pvisor gateway`` (``ctx.params``, by their names in :func:`gateway`)
    checked and made its :class:`~pvisor.session.session.SessionConfig`, once: the gateway's
    settings (its ``token`` the one requests must carry) and intercept mode's
    :class:`~pvisor.gateway.intercept.InterceptConfig` (None: reverse proxy). UsageError (exit 2)
    for options that do not go together or a bad value."""
    o = ctx.params
    host, port, workspace = o["host"], o["port"], o["workspace"]
    if o["mode"] == "intercept" and (o["allow_remote"] or not is_loopback(host)):
        raise UsageError(
            f"--mode intercept listens on this machine only: give a loopback --host (127.0.0.1), "
            f"not {host}, and no --allow-remote"
        )
    token = o["token"]
    if o["token_file"] is not None:
        source = ctx.get_parameter_source("token")
        if source is click.core.ParameterSource.COMMANDLINE:
            raise UsageError("give the token with --token or with --token-file, not both")
        if source is click.core.ParameterSource.ENVIRONMENT:
            # neither silently wins over the other: the one meant may not be the one used
            raise UsageError("give the token with $PVISOR_GATEWAY_TOKEN or with --token-file, not both")
        token = _read_token_file(o["token_file"])
    token = _access_token(host, o["allow_remote"], token)
    intercept = None
    if o["mode"] == "intercept":
        intercept = _intercept_config(
            host, port, o["upstreams"], o["intercept_hosts"], o["redirects"], o["confdir"], o["mitmdump"]
        )
    elif o["intercept_hosts"] or o["redirects"] or o["confdir"] or o["mitmdump"]:
        raise UsageError("--intercept-host, --redirect, --confdir and --mitmdump go with --mode intercept")
    gateway = GatewayConfig(
        host="127.0.0.1" if intercept else host,
        port=0 if intercept else port,
        upstreams=parse_upstreams(o["upstreams"]),
        run=o["run_id"],
        max_body=o["max_body"],
        max_response_body=o["max_response_body"],
        stall_timeout=o["stall_timeout"],
        header_timeout=o["header_timeout"],
        max_connections=o["max_connections"],
        log_file=Path(o["log_file"]) if o["log_file"] else None,
        shutdown_grace=o["shutdown_grace"],
        workspace=Path(absolute(workspace, f"--workspace {workspace}")) if workspace else None,
        snapshot_exclude=(Path(ctx.obj["journal"]),),
        snapshot_driver=o["snapshot_driver"],
        token=token,
    )
    config = SessionConfig(ctx.obj["journal"], gateway, intercept)
    if workspace:
        find_driver(o["snapshot_driver"])  # an unknown driver is a usage error before anything starts
    return config


async def _serve_gateway(
    config: SessionConfig, ready_file: str | None, log_file: str | None, host: str, port: int
) -> int:
    """Serve the gateway of ``config`` in one :class:`~pvisor.session.session.Session` until a
    stop signal, the journal writer's end or mitmdump's; returns the exit code (module
    docstring). ``host`` and ``port``: the options, as errors name them."""
    signals = StopSignals()
    # signals, address, journal, gateway, mitmdump; stopped in one order (pvisor.session.session)
    session = Session(config, signals=signals)
    failed = False
    proxy_died = False
    try:
        try:
            url = await session.start()
        except OSError as exc:
            if exc.filename is not None:  # the log file, not the socket
                raise UsageError(f"cannot write --log-file {log_file}: {exc.strerror}") from None
            raise UnavailableError(f"cannot listen on {host}:{port}: {os_error_reason(exc)}") from None
        gw, journal = session.gateway, session.journal
        assert gw is not None and journal is not None
        tune_gc_for_serving()
        await session.take_snapshot(SnapshotKind.START)  # before the ready file: no agent has started yet
        _announce(url, session, ready_file)
        failed, proxy_died = await _until_stopped(signals, session)
        _stopping(signals, gw, config.gateway.shutdown_grace)
        await session.take_snapshot(SnapshotKind.END)
        # mitmdump stays until the exchanges in flight have ended (they pass through it);
        # a new connection meanwhile gets its 502 for the gateway that no longer accepts
        cancelled = await gw.stop()
        if cancelled:
            _say(f"stopped: cancelled {cancelled} exchange(s) still in flight (recorded incomplete)")
    finally:
        await session.stop()  # after a failed start or an error too: the gateway, mitmdump, the journal
    journal = session.journal
    assert journal is not None
    if journal.error is not None:
        if not failed:  # it stopped while the gateway was stopping
            click.echo(f"pvisor: error: journal writer stopped: {journal.error}", err=True)
        if journal.unrecorded:
            click.echo(f"pvisor: warning: {journal.unrecorded} exchange(s) answered but not recorded"
                       " (the journal writer had stopped before committing them)", err=True)  # fmt: skip
        return EXIT_UNAVAILABLE
    if proxy_died:
        return EXIT_UNAVAILABLE
    return _exit_code(signals)


def _announce(url: str, session: Session, ready_file: str | None) -> None:
    """Write the ready file, then print ``listening BASE`` on stdout and the run, journal,
    writer, event loop (and intercept mode's hosts and CA) on stderr."""
    gw, journal, proxy = session.gateway, session.journal, session.proxy
    assert gw is not None and journal is not None
    token, intercept = session.config.gateway.token, session.config.intercept
    journal_path = session.config.journal
    extra: dict[str, Any] = {}
    if proxy is not None:
        extra = {"mode": "intercept", "gateway": url, "ca": str(proxy.ca_cert)}
        url = proxy.url
    # the ready file first: whoever sees the listening line can read it at once
    base = f"{url}/t/{token}" if token else url  # the base URL agents are given
    _write_ready_file(
        ready_file,
        {"url": base, "run": gw.run, "pid": os.getpid(), "journal": str(journal_path), **extra},
    )
    click.echo(f"listening {base}")
    loop_name = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    needs = "; requests need the token in their path (the base URL above)" if token else ""
    if proxy is not None:
        redirected = {origin: url for origin, url in intercept.redirects.values()}
        hosts = ", ".join(
            o.partition("://")[2] + (f" -> {_without_userinfo(redirected[o])}" if o in redirected else "")
            for o in sorted(intercept.intercepted().values())
        )
        needs = f"; intercepting {hosts}; CA certificate {proxy.ca_cert}"
    click.echo(
        f"run {gw.run}; journal {journal_path}; writer {journal.where}; event loop {loop_name}{needs}",
        err=True,
    )


async def _until_stopped(signals: Any, session: Any) -> tuple[bool, bool]:
    """Wait for a stop signal, the journal writer's end or mitmdump's exit (then stopped, and
    said on stderr); returns (the writer stopped, mitmdump died)."""
    gw, journal, proxy = session.gateway, session.journal, session.proxy
    waits = [asyncio.ensure_future(signals.wait()), asyncio.ensure_future(gw.watch_journal())]
    if proxy is not None:
        waits.append(asyncio.ensure_future(proxy.exited.wait()))
    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    failed = waits[1] in done
    if failed:
        click.echo(f"pvisor: error: journal writer stopped: {journal.error}", err=True)
    proxy_died = False
    if proxy is not None and waits[2] in done:
        proxy_died = True
        click.echo(
            f"pvisor: error: mitmdump (pid {proxy.pid}) exited with code {proxy.returncode}: "
            f"{proxy.last_output()}; the gateway stops",
            err=True,
        )
        await proxy.stop()
    return failed, proxy_died


def _intercept_config(
    host: str,
    port: int,
    upstreams: tuple[str, ...],
    intercept_hosts: tuple[str, ...],
    redirects: tuple[str, ...],
    confdir: str | None,
    mitmdump: str | None,
) -> Any:
    """The :class:`~pvisor.gateway.intercept.InterceptConfig` of ``pvisor gateway --mode
    intercept``; UsageError for options that do not go with it."""
    if upstreams:
        raise UsageError(
            "--upstream does not go with --mode intercept: the agent's own host is the upstream "
            "(give --redirect HOST=URL to send it elsewhere)"
        )
    config = InterceptConfig(host=host, port=port, mitmdump=mitmdump)
    if confdir:
        config.confdir = Path(absolute(confdir, f"--confdir {confdir}"))
    for text in intercept_hosts:
        key, origin = parse_host(text, "--intercept-host")
        config.hosts[key] = origin
    for text in redirects:
        key, origin, url = parse_redirect(text)
        if key in config.redirects:
            raise UsageError(f"--redirect: {key.rsplit(':', 1)[0]} given twice")
        config.redirects[key] = (origin, url)
    return config


def _read_token_file(path: str) -> str:
    """The token in the first line of the file ``path`` (without its line end); UsageError
    naming the file, never its content, when it cannot be read or holds no token."""
    try:
        with open(path, "rb") as f:
            first = f.read(4096).split(b"\n", 1)[0].rstrip(b"\r")
    except OSError as exc:
        raise UsageError(f"cannot read --token-file {path}: {exc.strerror}") from None
    try:
        return check_token(first.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise UsageError(
            f"--token-file {path}: its first line must be the token: 16 to 256 letters, digits, '_' or '-'"
        ) from None


def _access_token(host: str, allow_remote: bool, token: str | None) -> str | None:
    """The token requests must carry, or None (a loopback gateway without --token). UsageError
    for a host beyond this machine without --allow-remote, or a token that cannot be one."""
    check_listen_host(
        host,
        allow_remote,
        "spend the upstream keys it forwards and write into your journal; add --allow-remote (every request "
        "then needs a token in its path)",
    )
    if token is None:
        return new_token() if allow_remote else None
    try:
        return check_token(token)
    except ValueError as exc:
        raise UsageError(f"--token (or $PVISOR_GATEWAY_TOKEN): {exc}") from None


def check_listen_host(host: str, allow_remote: bool, risk: str) -> None:
    """UsageError (exit 2) for an empty ``--host``, or one beyond this machine (not loopback:
    :func:`~pvisor.gateway.access.is_loopback`) without ``--allow-remote``; ``risk`` ends the
    sentence ``whoever reaches it could ...`` and says what follows ``add --allow-remote``. The
    rule of every pvisor server (``gateway``, ``serve-model``)."""
    if not host.strip():
        raise UsageError("--host: an empty address; give 127.0.0.1, or an address with --allow-remote")
    if not is_loopback(host) and not allow_remote:
        raise UsageError(f"--host {host} listens beyond this machine: whoever reaches it could {risk}")


@click.command("serve-model", cls=Command)
@click.option(
    "--script",
    "script_path",
    required=True,
    type=PathParam(dir_okay=False),
    help="Script file (.json or .toml), see docs/scripted-model.md.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port; 0 picks a free one."
)
@click.option(
    "--shutdown-grace",
    type=Seconds(0),
    default=10.0,
    show_default=True,
    help="On SIGINT/SIGTERM, seconds to let requests in flight finish before cancelling them.",
)
@click.option(
    "--ready-file",
    type=PathParam(dir_okay=False, readable=False),
    default=None,
    help='Once listening, write {"url", "pid"} here as JSON (before the listening line is printed).',
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Let --host be an address beyond this machine (0.0.0.0): whoever reaches it is served.",
)
@click.pass_context
def serve_model(
    ctx: click.Context,
    script_path: str,
    host: str,
    port: int,
    shutdown_grace: float,
    ready_file: str | None,
    allow_remote: bool,
) -> None:
    """Serve a scripted model offline, in the four protocols (Anthropic Messages, OpenAI Chat
    Completions, OpenAI Responses, Gemini), streamed or not. Prints `listening http://HOST:PORT`.
    Loopback only unless --allow-remote, as the gateway.
    SIGINT/SIGTERM stop it as they stop the gateway (exit 130 after SIGINT, 0 after SIGTERM).

    \b
    Example:
      pvisor serve-model --script turns.json --port 0
    """
    # as the gateway: no address beyond this machine unless asked for (a script may hold a task's
    # code, and every request is served, with no token)
    check_listen_host(
        host, allow_remote, "read its script's replies and keep it busy; add --allow-remote to serve it there"
    )
    model = ScriptedModel(load_script(script_path))
    if ready_file:
        check_output_path(ready_file, "--ready-file")

    async def serve() -> int:
        signals = StopSignals()
        signals.install()
        server = ScriptedModelServer(model, host, port, shutdown_grace=shutdown_grace)
        try:
            try:
                url = await server.start()
            except OSError as exc:
                raise UnavailableError(f"cannot listen on {host}:{port}: {os_error_reason(exc)}") from None
            _write_ready_file(ready_file, {"url": url, "pid": os.getpid()})
            click.echo(f"listening {url}")
            await signals.wait()
            _stopping(signals, server, shutdown_grace)
        finally:
            await server.stop()
            signals.remove()
        return _exit_code(signals)

    ctx.exit(asyncio.run(serve()))
