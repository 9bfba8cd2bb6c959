"""``pvisor gateway`` and ``pvisor serve-model``: long-running servers until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import click
import orjson

from pvisor.journal.errors import UnavailableError, UsageError

_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.I)
_UNITS = {None: 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def parse_size(text: str) -> int:
    """``64MiB`` -> 67108864. Units: B, KB/MB/GB (powers of 1000), KiB/MiB/GiB and K/M/G (powers of 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a size such as 64MiB, 500KB or 1048576")
    return int(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]


def parse_upstreams(values: tuple[str, ...]) -> dict[str, str]:
    from pvisor.adapters.protocols import UPSTREAMS

    out: dict[str, str] = {}
    for v in values:
        name, eq, url = v.partition("=")
        name = name.strip().lower()
        if not eq or name not in UPSTREAMS:
            raise click.BadParameter(f"{v!r}: expected NAME=URL with NAME one of {', '.join(UPSTREAMS)}", param_hint="--upstream")
        if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", url):
            raise click.BadParameter(f"{v!r}: the URL must be http:// or https:// with a host, no query", param_hint="--upstream")
        if name in out:
            raise click.BadParameter(f"upstream {name!r} given twice", param_hint="--upstream")
        out[name] = url
    return out


def _write_ready_file(path: str | None, info: dict) -> None:
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(info) + b"\n")
    os.replace(tmp, path)  # readers never see a half-written file


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


@click.command("gateway")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True, help="Port; 0 picks a free one.")
@click.option("--upstream", "upstreams", multiple=True, metavar="NAME=URL",
              help="Upstream for NAME (anthropic, openai, gemini); repeatable. Others use the public API hosts.")
@click.option("--run", "run_id", default=None, help="Run id for exchanges without X-Pvisor-Run or /run/<id>/ (default: a new id).")
@click.option("--max-body", default="64MiB", show_default=True, help="Largest request body accepted (413 beyond).")
@click.option("--stall-timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True,
              help="Seconds without upstream bytes before the exchange is given up.")
@click.option("--log-file", type=click.Path(dir_okay=False, writable=True), default=None, help="Append one line per exchange (secrets removed).")
@click.option("--ready-file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write {url, run, pid} as JSON here once listening.")
@click.pass_context
def gateway(ctx: click.Context, host: str, port: int, upstreams: tuple[str, ...], run_id: str | None, max_body: str,
            stall_timeout: float, log_file: str | None, ready_file: str | None) -> None:
    """Run the capture gateway: point an agent's base URL at it and every model exchange is
    recorded in the journal. Prints `listening http://HOST:PORT` when ready; stops on
    SIGINT/SIGTERM after in-flight exchanges finish.

    \b
    Examples:
      pvisor gateway --port 0 --upstream anthropic=https://api.anthropic.com
      ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude -p "fix the test"
    """
    from pvisor.gateway.proxy import Gateway, GatewayConfig, finalize_response, os_error_reason
    from pvisor.journal.writer import Journal

    from pvisor.gateway.routing import RUN_ID_PATTERN

    if run_id is not None and not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise UsageError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    config = GatewayConfig(
        host=host, port=port, upstreams=parse_upstreams(upstreams), run=run_id, max_body=parse_size(max_body),
        stall_timeout=stall_timeout, log_file=Path(log_file) if log_file else None,
    )

    async def serve() -> None:
        journal = Journal.open(ctx.obj["journal"], finalize=finalize_response)
        gw = Gateway(config, journal)
        try:
            try:
                url = await gw.start()
            except OSError as exc:
                raise UnavailableError(f"cannot listen on {host}:{port}: {os_error_reason(exc)}") from None
            # the ready file first: whoever sees the listening line can read it at once
            _write_ready_file(ready_file, {"url": url, "run": gw.run, "pid": os.getpid(), "journal": str(ctx.obj["journal"])})
            click.echo(f"listening {url}")
            click.echo(f"run {gw.run}; journal {ctx.obj['journal']}", err=True)
            await _wait_for_signal()
            click.echo("stopping: waiting for exchanges in flight", err=True)
            await gw.stop()
        finally:
            journal.close()

    asyncio.run(serve())


@click.command("serve-model")
@click.option("--script", "script_path", required=True, type=click.Path(dir_okay=False), help="Script file (.json or .toml), see docs/scripted-model.md.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port; 0 picks a free one.")
@click.option("--ready-file", type=click.Path(dir_okay=False, writable=True), default=None, help="Write {url, pid} as JSON here once listening.")
def serve_model(script_path: str, host: str, port: int, ready_file: str | None) -> None:
    """Serve a scripted model offline, in the four protocols (Anthropic Messages, OpenAI Chat
    Completions, OpenAI Responses, Gemini), streamed or not. Prints `listening http://HOST:PORT`.

    \b
    Example:
      pvisor serve-model --script turns.json --port 0
    """
    from pvisor.gateway.proxy import os_error_reason
    from pvisor.gateway.scripted_model import ScriptedModel, load_script
    from pvisor.gateway.scripted_server import ScriptedModelServer

    model = ScriptedModel(load_script(script_path))

    async def serve() -> None:
        server = ScriptedModelServer(model, host, port)
        try:
            url = await server.start()
        except OSError as exc:
            raise UnavailableError(f"cannot listen on {host}:{port}: {os_error_reason(exc)}") from None
        _write_ready_file(ready_file, {"url": url, "pid": os.getpid()})
        click.echo(f"listening {url}")
        try:
            await _wait_for_signal()
        finally:
            await server.stop()

    asyncio.run(serve())
