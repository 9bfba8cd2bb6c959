"""Intercept mode: a forward proxy (mitmdump) in front of the gateway, for agents that honour
``HTTPS_PROXY`` but cannot be given a base URL (docs/intercept.md).

Layout: the agent's CONNECT to a model API host is decrypted by mitmdump with a certificate of
pvisor's own CA; the addon (:mod:`.intercept_addon`) hands each request to the pvisor gateway
over plain HTTP on the loopback address, where the same responder seam, relay and recorder
answer and record it as for the reverse proxy (``capture = intercept``). Every other host is
a raw TCP tunnel (mitmproxy's ``allow_hosts``): never decrypted, never recorded.

mitmdump runs in a process of its own (mitmproxy replaces the event loop's task factory, and
pins h11 and h2 versions the official SDKs do not accept): the extra
``pvisor-replay[intercept]`` (mitmproxy 11), or any mitmdump 11 found through
``--mitmdump PATH``, ``$PVISOR_MITMDUMP`` or ``PATH``. It dies with pvisor
(``PR_SET_PDEATHSIG``); its own output goes through :func:`~pvisor.journal.redact.redact_text`
before it is shown or logged.

The CA lives in the conf directory (``--confdir``; default ``$PVISOR_CA_DIR``, else
``$XDG_DATA_HOME/pvisor/ca``, mode 0700, created on first use): mitmproxy writes
``mitmproxy-ca.pem`` (key and certificate, 0600) and ``mitmproxy-ca-cert.pem`` (the certificate
an agent trusts); pvisor adds ``ca-bundle.pem``, the system's CA bundle plus that certificate,
for runtimes whose variable replaces the system store (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yarl import URL

from pvisor.adapters.protocols import UPSTREAMS
from pvisor.core.errors import BadInputError, UnavailableError, UsageError
from pvisor.journal.redact import redact_text

from .access import listen_url, new_token
from .parent_death import die_with_parent
from .routing import check_upstream_url

#: the environment variable naming mitmdump (after ``--mitmdump``, before ``PATH``)
MITMDUMP_ENV = "PVISOR_MITMDUMP"
#: the environment variable naming the CA's directory (after ``--confdir``)
CA_DIR_ENV = "PVISOR_CA_DIR"
#: the mitmproxy versions intercept mode was verified with
MITMPROXY_VERSIONS = ">=11,<12"
#: seconds mitmdump gets to listen (it loads its CA, or creates it: a key of 2048 bits)
START_TIMEOUT_S = 60.0
#: seconds mitmdump gets to stop after SIGTERM, before SIGKILL
STOP_GRACE_S = 5.0
CA_CERT = "mitmproxy-ca-cert.pem"
CA_KEY = "mitmproxy-ca.pem"
CA_BUNDLE = "ca-bundle.pem"
ADDON = Path(__file__).with_name("intercept_addon.py")

#: what to add to a line of mitmdump's that names a cause the user can mend
_HINTS = {
    "does not trust the proxy's certificate": (
        " (the agent must trust pvisor's CA: `pvisor env --agent NAME --gateway PROXY --intercept` "
        "prints how; docs/intercept.md)"
    ),
}

#: mitmdump's own lines (a child of the gateway's logger: the CLI shows its warnings on stderr)
log = logging.getLogger("pvisor.gateway.intercept")

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:\d{1,5})?$")


def model_hosts() -> dict[str, str]:
    """``host:port`` -> origin of the public model APIs (the upstreams' default URLs, from the
    protocol modules): ``{"api.anthropic.com:443": "https://api.anthropic.com", ...}``."""
    return dict(host_entry(URL(default)) for default, _ in UPSTREAMS.values())


def host_entry(url: URL) -> tuple[str, str]:
    """(``host:port``, origin) of an http(s) URL; the origin keeps an explicit non-default port."""
    host = (url.host or "").lower()
    port = url.port or (443 if url.scheme == "https" else 80)
    default = 443 if url.scheme == "https" else 80
    origin = f"{url.scheme}://{host}" + ("" if port == default else f":{port}")
    return f"{host}:{port}", origin


def parse_host(text: str, option: str) -> tuple[str, str]:
    """(``host:port``, origin) of ``HOST`` or ``HOST:PORT`` (HTTPS, port 443 by default).
    Raises UsageError naming ``option`` and what a host looks like."""
    if not _HOST.match(text) or (":" in text and not 0 < int(text.rsplit(":", 1)[1]) < 65536):
        raise UsageError(f"{option} {text!r}: give a host name, or HOST:PORT (such as llm.example.com:8443)")
    return host_entry(URL(f"https://{text}"))


def parse_redirect(text: str) -> tuple[str, str, str]:
    """(``host:port``, origin, URL) of ``HOST=URL`` (``--redirect``). Raises UsageError."""
    host, sep, url = text.partition("=")
    if not sep or not host or not url:
        raise UsageError(
            f"--redirect {text!r}: give HOST=URL, such as api.anthropic.com=http://127.0.0.1:9000"
        )
    key, origin = parse_host(host, "--redirect")
    try:
        check_upstream_url(url)
    except ValueError as exc:
        raise UsageError(f"--redirect {host}: {exc}") from None
    return key, origin, url.rstrip("/")


@dataclass
class InterceptConfig:
    """Settings of intercept mode.

    Fields: ``host``/``port`` the proxy listens on (port 0: a free one); ``confdir`` the CA's
    directory (None: :func:`default_confdir`); ``hosts`` extra hosts to intercept
    (``--intercept-host``, ``host:port`` -> origin); ``redirects`` ``host:port`` -> the URL
    its requests go to instead (``--redirect``; a redirected host is intercepted);
    ``mitmdump`` its path (None: :func:`find_mitmdump`)."""

    host: str = "127.0.0.1"
    port: int = 8080
    confdir: Path | None = None
    hosts: dict[str, str] = field(default_factory=dict)
    redirects: dict[str, tuple[str, str]] = field(default_factory=dict)
    mitmdump: str | None = None

    def intercepted(self) -> dict[str, str]:
        """``host:port`` -> origin of every intercepted host."""
        hosts = model_hosts()
        hosts.update(self.hosts)
        hosts.update({key: origin for key, (origin, _) in self.redirects.items()})
        return hosts

    def origins(self) -> dict[str, str]:
        """origin -> the base URL its requests go to (itself, or its redirect)."""
        out = {origin: origin for origin in self.intercepted().values()}
        out.update({origin: url for origin, url in self.redirects.values()})
        return out


def default_confdir() -> Path:
    """``$PVISOR_CA_DIR``, else ``$XDG_DATA_HOME/pvisor/ca`` (``~/.local/share/pvisor/ca``)."""
    if os.environ.get(CA_DIR_ENV):
        return Path(os.environ[CA_DIR_ENV]).expanduser().absolute()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser().absolute() / "pvisor" / "ca"


#: mitmdumps whose ``--version`` was checked, by (path, mtime): once per process
_CHECKED: dict[tuple[str, float], None] = {}


def find_mitmdump(explicit: str | None = None) -> str:
    """The mitmdump to run: ``explicit`` (``--mitmdump``), ``$PVISOR_MITMDUMP``, else the one
    on ``PATH``, checked to be mitmproxy 11 by its ``--version``. Raises UnavailableError
    (exit 69) saying how to install it, or what the program found is instead."""
    given = explicit or os.environ.get(MITMDUMP_ENV)
    if given:
        path = Path(given).expanduser()
        where = "--mitmdump" if explicit else f"${MITMDUMP_ENV}"
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UnavailableError(f"{where} {given}: no executable file there (give the path of mitmdump)")
        return _checked(str(path.absolute()), f"{where} {given}")
    found = shutil.which("mitmdump")
    if found:
        return _checked(found, f"mitmdump on PATH ({found})")
    raise UnavailableError(
        "intercept mode needs mitmdump (mitmproxy 11), and none is on PATH: install it with "
        "pvisor's extra pvisor-replay[intercept] in an environment of its own (`pip install "
        "'.[intercept]'` in a clone of pvisor; docs/install.md), or `pipx install 'mitmproxy>=11,<12'`, "
        "then give its path with --mitmdump or $PVISOR_MITMDUMP"
    )


def _checked(exe: str, what: str) -> str:
    """``exe`` when its ``--version`` says mitmproxy 11; else UnavailableError naming ``what``."""
    key = (exe, os.stat(exe).st_mtime)
    if key in _CHECKED:
        return exe
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, timeout=START_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
        text = (out.stdout or b"").decode("utf-8", "replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnavailableError(f"{what}: `--version` did not answer ({type(exc).__name__})") from None
    first = text.strip().splitlines()[0] if text.strip() else ""
    if not text.startswith("Mitmproxy: "):
        shown = repr(redact_text(first)[:120]) if first else "nothing"
        raise UnavailableError(
            f"{what} is not mitmdump: its --version printed {shown} "
            f"(intercept mode needs mitmproxy {MITMPROXY_VERSIONS})"
        )
    version = first.split(":", 1)[1].strip()
    if not version.startswith("11."):
        raise UnavailableError(
            f"{what} is mitmproxy {version}; intercept mode was verified with mitmproxy {MITMPROXY_VERSIONS} "
            "(the extra pvisor-replay[intercept] in an environment of its own: pip install '.[intercept]' "
            "in a clone of pvisor)"
        )
    _CHECKED[key] = None
    return exe


def _private_dir(path: Path) -> Path:
    """``path`` as a directory of mode 0700 (created if missing). Raises BadInputError when it
    is something else, or belongs to another user."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except OSError as exc:
        raise BadInputError(f"CA directory {path}: {exc.strerror or exc}") from None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise BadInputError(f"CA directory {path} belongs to another user: its key would not be private")
    os.chmod(path, 0o700)
    return path


def mitmdump_argv(mitmdump: str, confdir: Path, *extra: str) -> list[str]:
    """The command line every mitmdump of pvisor starts with: its warnings only (``--quiet``
    would hide those too, such as a client that does not trust the CA), no flow printed,
    pvisor's addon, the CA in ``confdir``, nothing read or written elsewhere."""
    return [
        mitmdump,
        "--set",
        f"confdir={confdir}",
        "--set",
        "termlog_verbosity=warn",
        "--set",
        "flow_detail=0",
        "-s",
        str(ADDON),
        *extra,
    ]


def _run_env(settings: dict) -> dict[str, str]:
    env = dict(os.environ)
    env["PVISOR_INTERCEPT"] = json.dumps(settings)
    # mitmdump's own interpreter must not see the caller's Python settings or proxies
    for name in ("PYTHONPATH", "PYTHONHOME", "HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        env.pop(name, None)
    return env


def ensure_ca(confdir: Path | None = None, mitmdump: str | None = None) -> Path:
    """The CA certificate's path in ``confdir`` (default :func:`default_confdir`), created with
    mitmdump on first use (key 0600 in a 0700 directory), and the bundle beside it brought up
    to date. Raises UnavailableError when mitmdump is missing or fails."""
    confdir = _private_dir(confdir or default_confdir())
    cert = confdir / CA_CERT
    if not cert.is_file():
        exe = find_mitmdump(mitmdump)
        r, w = os.pipe()
        try:
            proc = subprocess.run(
                mitmdump_argv(exe, confdir, "--set", "server=false"),
                env=_run_env({"ca_only": True, "ready_fd": w}),
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=START_TIMEOUT_S,
                preexec_fn=die_with_parent(),
            )
        except subprocess.TimeoutExpired:
            raise UnavailableError(
                f"mitmdump did not create its CA in {confdir} within {START_TIMEOUT_S:g} s"
            ) from None
        finally:
            os.close(w)
            os.close(r)
        if not cert.is_file():
            raise UnavailableError(
                f"mitmdump did not create its CA in {confdir} (exit {proc.returncode}): "
                f"{_last_line(proc.stderr or proc.stdout)}"
            )
    key = confdir / CA_KEY
    try:
        pem = key.read_bytes() if key.is_file() else b""
    except OSError as exc:
        raise BadInputError(f"CA key {key}: {exc.strerror or exc}") from None
    if b"PRIVATE KEY-----" not in pem or b"BEGIN CERTIFICATE-----" not in pem:
        raise BadInputError(
            f"CA key {key}: {'missing' if not pem else 'no PEM key and certificate in it'} beside {CA_CERT}: "
            "remove the mitmproxy-ca* files of that directory to make a new CA (agents must then trust the "
            "new certificate), or give another --confdir"
        )
    for name in (CA_KEY, "mitmproxy-ca.p12"):  # mitmproxy writes them under umask 077; make sure
        if (confdir / name).exists():
            os.chmod(confdir / name, 0o600)
    _write_bundle(confdir)
    return cert


def system_ca_file() -> Path | None:
    """The system's CA bundle (OpenSSL's default file, else certifi's), or None."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    try:
        import certifi  # not a dependency of pvisor: used when another package installed it

        return Path(certifi.where())
    except ImportError:
        return None


def _write_bundle(confdir: Path) -> Path:
    """``ca-bundle.pem``: the system bundle plus the CA certificate (rewritten when older)."""
    cert = confdir / CA_CERT
    bundle = confdir / CA_BUNDLE
    system = system_ca_file()
    newest = max(cert.stat().st_mtime, system.stat().st_mtime if system else 0)
    if bundle.is_file() and bundle.stat().st_mtime >= newest:
        return bundle
    parts = [system.read_bytes()] if system else []
    parts.append(cert.read_bytes())
    tmp = bundle.with_suffix(".tmp")
    tmp.write_bytes(b"\n".join(p.rstrip(b"\n") for p in parts) + b"\n")
    os.replace(tmp, bundle)
    return bundle


def _last_line(data: bytes | str) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return redact_text(lines[-1]) if lines else "it printed nothing"


def serve_intercepted(config: Any, intercept: InterceptConfig) -> None:
    """Make the gateway of ``config`` (a :class:`~pvisor.gateway.proxy.GatewayConfig`) the one
    behind intercept mode's mitmdump: a new token for the addon, the origins it may name, and
    nothing answered without them."""
    config.intercept_token = new_token()
    config.intercept_origins = intercept.origins()
    config.intercept_only = True


async def start_proxy(intercept: InterceptConfig, gateway: Any) -> "InterceptProxy":
    """Start mitmdump in front of ``gateway`` (a started :class:`~pvisor.gateway.proxy.Gateway`
    whose config went through :func:`serve_intercepted`, on the loopback address); returns
    the :class:`InterceptProxy` once it listens (its ``url`` and ``ca_cert`` set)."""
    proxy = InterceptProxy(intercept, "127.0.0.1", gateway.port, gateway.config.intercept_token, gateway.log)
    await proxy.start()
    return proxy


class InterceptProxy:
    """mitmdump in front of a running gateway (``gateway_host``, ``gateway_port``, with
    ``token`` as its ``intercept_token``).

    ``await start()`` returns the proxy's URL (``http://127.0.0.1:PORT``) once it listens;
    :attr:`exited` is set if mitmdump dies; ``await stop()`` ends it. Its output lines go to
    ``log`` (a ``logging.Logger`` or None), redacted; the last ones name the cause when it
    fails to start."""

    def __init__(self, config: InterceptConfig, gateway_host: str, gateway_port: int, token: str, log=None):
        self.config = config
        self.gateway = (gateway_host, gateway_port)
        self.token = token
        self.log = log
        self.url: str | None = None
        self.ca_cert: Path | None = None
        self.pid: int | None = None
        self.exited = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._tail: deque[str] = deque(maxlen=20)
        self._relay = False  # show its lines on stderr (between listening and stopping)
        self._readers: list[asyncio.Task] = []

    def allow_hosts(self) -> list[str]:
        """mitmproxy ``allow_hosts`` patterns: exactly the intercepted ``host:port`` pairs."""
        return [f"^{re.escape(key)}$" for key in sorted(self.config.intercepted())]

    async def start(self) -> str:
        confdir = self.config.confdir or default_confdir()
        self.ca_cert = ensure_ca(confdir, self.config.mitmdump)
        exe = find_mitmdump(self.config.mitmdump)
        extra = [
            "--listen-host",
            self.config.host,
            "--listen-port",
            str(self.config.port),
            "--set",
            "connection_strategy=lazy",  # an intercepted host is never contacted by mitmdump
            "--set",
            "upstream_cert=false",
        ]
        for pattern in self.allow_hosts():
            extra += ["--set", f"allow_hosts={pattern}"]
        r, w = os.pipe()
        os.set_blocking(r, False)
        settings = {
            "gateway": list(self.gateway),
            "token": self.token,
            "hosts": self.config.intercepted(),
            "ready_fd": w,
        }
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *mitmdump_argv(exe, confdir, *extra),
                env=_run_env(settings),
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=die_with_parent(),
                # a terminal's Ctrl-C goes to pvisor alone: it stops mitmdump once the exchanges
                # in flight (which pass through mitmdump) have ended
                start_new_session=True,
            )
        except OSError as exc:
            os.close(r)
            raise UnavailableError(f"cannot start mitmdump {exe}: {exc.strerror or exc}") from None
        finally:
            os.close(w)
        self.pid = self._proc.pid
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            asyncio.ensure_future(self._pump(self._proc.stdout)),
            asyncio.ensure_future(self._pump(self._proc.stderr)),
        ]
        watcher = asyncio.ensure_future(self._watch())
        self._readers.append(watcher)
        try:
            line = await self._ready(r)
        finally:
            os.close(r)
        if line is None:
            try:  # its pipe closed: it is exiting (give it a moment to be reaped, and its output read)
                await asyncio.wait_for(self.exited.wait(), STOP_GRACE_S)
            except asyncio.TimeoutError:
                pass
            code = self.returncode
            await self.stop()
            port = self.config.port
            where = f"{self.config.host}:{port}" if port else f"a free port of {self.config.host}"
            if code is None:
                raise UnavailableError(f"mitmdump did not listen on {where} within {START_TIMEOUT_S:g} s")
            raise UnavailableError(
                f"mitmdump could not listen on {where} (it exited with code {code}): {self.cause()}"
            )
        host, port = json.loads(line)["listen"][:2]
        host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.url = listen_url(host, port)
        self._relay = True  # from now on its warnings are the user's business
        if self.log is not None and self.log.handlers:
            self.log.info("intercept proxy listening %s (mitmdump pid %s)", self.url, self.pid)
        return self.url

    async def _ready(self, fd: int) -> str | None:
        """The addon's line on ``fd``, or None when mitmdump exits (or takes too long) first."""
        loop = asyncio.get_running_loop()
        got: asyncio.Future[bytes] = loop.create_future()
        buf = bytearray()

        def readable() -> None:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                return
            if not data:
                if not got.done():
                    got.set_result(bytes(buf))
                return
            buf.extend(data)
            if b"\n" in buf and not got.done():
                got.set_result(bytes(buf))

        loop.add_reader(fd, readable)
        try:
            done, _ = await asyncio.wait(
                [got, asyncio.ensure_future(self.exited.wait())],
                timeout=START_TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            loop.remove_reader(fd)
        if got in done and b"\n" in got.result():
            return got.result().split(b"\n", 1)[0].decode()
        return None

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):  # a line beyond the reader's limit
                raw = await stream.read(65536)
            if not raw:
                return
            line = redact_text(raw.decode("utf-8", "replace").rstrip())
            if line:
                self._tail.append(line)
                # its warnings are the user's business (an agent that does not trust the CA
                # says so only here): on stderr, and in the log file
                if self._relay:
                    hint = _HINTS.get(next((k for k in _HINTS if k in line), ""), "")
                    log.warning("mitmdump: %s%s", line, hint)
                if self.log is not None and self.log.handlers:
                    self.log.info("mitmdump: %s", line)

    async def _watch(self) -> None:
        assert self._proc is not None
        await self._proc.wait()
        self.exited.set()

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def last_output(self) -> str:
        """mitmdump's last line of output (redacted), or a placeholder."""
        return self._tail[-1] if self._tail else "it printed nothing"

    def cause(self) -> str:
        """The line of mitmdump's output that names why it stopped (``address already in use``),
        without its time stamp: the first error line that is not its closing summary, else its
        last line."""
        for line in self._tail:
            text = re.sub(r"^\[[0-9:.]+\](\[[^\]]*\])?\s*", "", line)
            if "rror" in text and not text.startswith("Error logged during startup"):
                return text
        return self.last_output()

    async def stop(self) -> None:
        """End mitmdump: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S` s (idempotent)."""
        proc = self._proc
        if proc is None:
            return
        self._relay = False  # what it says while it is stopped (a cancelled flow) is no news
        if proc.returncode is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        deadline = time.monotonic() + 2.0
        for task in self._readers:
            left = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(task, left)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
        self._readers = []


def no_proxy_for(intercepted: dict[str, str], *values: str | None) -> tuple[str, list[str]]:
    """(``NO_PROXY`` for an agent, the entries left out): the entries of ``values`` (the user's
    ``NO_PROXY`` and ``no_proxy``), each once, without those that would send an intercepted
    host around the proxy (``*``, the host itself, a domain it is in: ``openai.com``,
    ``.openai.com``), plus the loopback names the gateway listens on. With no intercepted host
    (the reverse proxy) nothing is left out."""
    hosts = {key.rsplit(":", 1)[0] for key in intercepted}
    entries: list[str] = []
    for value in values:
        for entry in (value or "").split(","):
            entry = entry.strip()
            if entry and entry not in entries:
                entries.append(entry)
    kept: list[str] = []
    dropped: list[str] = []
    for entry in entries:
        name = entry.lower()
        if not name.startswith("[") and name.count(":") == 1:
            name = name.split(":")[0]  # host:port
        name = name.lstrip("*").lstrip(".")
        if hosts and (entry == "*" or any(h == name or h.endswith("." + name) for h in hosts if name)):
            dropped.append(entry)
        else:
            kept.append(entry)
    for local in ("127.0.0.1", "localhost", "::1"):
        if local not in kept:
            kept.append(local)
    return ",".join(kept), dropped


def intercept_env(
    proxy_url: str,
    confdir: Path,
    ca_vars: dict[str, str],
    intercepted: dict[str, str],
    environ: dict[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """(the environment an agent needs to go through intercept mode, the ``NO_PROXY`` entries
    of ``environ`` left out): ``HTTPS_PROXY`` (and the lower-case spelling some runtimes read);
    ``NO_PROXY`` of :func:`no_proxy_for`; and each variable of ``ca_vars`` (name -> ``cert`` or
    ``bundle``: whether the runtime adds the file to its store, or replaces its store with it)
    pointing at the CA in ``confdir``."""
    environ = environ or {}
    no_proxy, dropped = no_proxy_for(intercepted, environ.get("NO_PROXY"), environ.get("no_proxy"))
    env = {"HTTPS_PROXY": proxy_url, "https_proxy": proxy_url, "NO_PROXY": no_proxy, "no_proxy": no_proxy}
    for name, kind in ca_vars.items():
        env[name] = str(confdir / (CA_CERT if kind == "cert" else CA_BUNDLE))
    return env, dropped
