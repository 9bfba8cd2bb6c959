"""``pvisor env``: what to paste to point your own agent session at a running gateway."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import click
import orjson

from pvisor.adapters.agents import agent_names, get_profile
from pvisor.adapters.protocols import UPSTREAMS
from pvisor.commands.base import Command, PathParam
from pvisor.commands.params import NEW_RUN_ID
from pvisor.core.errors import UsageError
from pvisor.gateway.intercept import CA_CERT, default_confdir, intercept_env, model_hosts, no_proxy_for
from pvisor.gateway.routing import check_upstream_url
from pvisor.journal.paths import absolute
from pvisor.journal.producer import new_run_id
from pvisor.session.run import check_utf8, run_dir_of

_MARK = "PVISOR_EOF"


@click.command("env", cls=Command)
@click.option(
    "--agent", required=True, type=click.Choice(agent_names()), help="The agent CLI (docs/agents.md)."
)
@click.option(
    "--gateway",
    "gateway_url",
    required=True,
    metavar="URL",
    help="The running gateway, e.g. http://127.0.0.1:8787.",
)
@click.option(
    "--run",
    "run_id",
    type=NEW_RUN_ID,
    default=None,
    help="Run id put into the base URL's path (default: a new one).",
)
@click.option("--model", default=None, help="Model name, for the agents that need one in their config.")
@click.option(
    "--intercept",
    is_flag=True,
    help="--gateway is intercept mode's proxy: print HTTPS_PROXY and the CA the agent must trust instead.",
)
@click.option(
    "--confdir",
    type=PathParam(file_okay=False),
    default=None,
    help="With --intercept: the CA's directory the gateway was given (default $PVISOR_CA_DIR, else "
    "~/.local/share/pvisor/ca).",
)
@click.option(
    "--shell",
    type=click.Choice(["bash", "fish", "json"]),
    default="bash",
    show_default=True,
    help="Output syntax.",
)
@click.pass_context
def env(
    ctx: click.Context,
    agent: str,
    gateway_url: str,
    run_id: str | None,
    model: str | None,
    shell: str,
    intercept: bool,
    confdir: str | None,
) -> None:
    """Print what to paste into a shell to point your own AGENT session at a running gateway:
    environment variables, config files (as here-docs) and the command to start it (for Codex,
    its -c overrides). The run id goes into the base URL's path (/run/<id>), so sessions
    sharing one gateway stay apart in the journal. Nothing is written or started.

    \b
    With --intercept, --gateway is the proxy of `pvisor gateway --mode intercept`: the agent
    keeps its own model host and reaches it through HTTPS_PROXY, trusting pvisor's CA; every
    exchange goes to that gateway's run (--run does not apply).

    \b
    Examples:
      pvisor env --agent claude-code --gateway http://127.0.0.1:8787 --run fix-tests
      pvisor env --agent codex --gateway http://127.0.0.1:8787 --shell fish
      pvisor env --agent claude-code --gateway http://127.0.0.1:8080 --intercept
    """
    for option, value in (
        ("--gateway", gateway_url),
        ("--run", run_id),
        ("--model", model),
        ("--journal", ctx.obj["journal"]),
    ):
        check_utf8(option, value)
    try:
        check_upstream_url(gateway_url)
    except ValueError as exc:
        raise UsageError(
            f"--gateway: {exc} (the URL the gateway printed, such as http://127.0.0.1:8787)"
        ) from None
    base = gateway_url.rstrip("/")
    # the only path a gateway's URL has is the token of one that listens beyond this machine
    if re.match(r"^[a-z]+://[^/]+/.", base + "/") and not re.fullmatch(
        r"[a-z]+://[^/]+/t/[A-Za-z0-9_-]{16,256}", base
    ):
        raise UsageError(
            "--gateway: give the gateway's URL as it printed it, without a path of your own "
            "(pvisor adds /run/<id>), such as http://127.0.0.1:8787"
        )
    if intercept:
        _intercept(agent, base, run_id, model, shell, confdir, ctx)
        return
    if confdir is not None:
        raise UsageError("--confdir goes with --intercept")
    if run_id is None:
        run_id = new_run_id()
    profile = get_profile(agent)
    base_url = f"{base}/run/{run_id}"
    snippet = profile.snippet(base_url, run_dir_of(Path(ctx.obj["journal"]), run_id), model)
    header = f"pvisor env: {profile.title} through the gateway at {base}, run {run_id}"
    if "NO_PROXY" in snippet.env:  # the gateway's loopback names added to the user's own entries
        snippet.env["NO_PROXY"] = no_proxy_for({}, os.environ.get("NO_PROXY"), os.environ.get("no_proxy"))[0]
    _emit(profile, snippet, header, run_id, base_url, shell)


def _intercept(
    agent: str, proxy: str, run_id: str | None, model: str | None, shell: str, confdir: str | None, ctx
) -> None:
    """The snippet of ``pvisor env --intercept``: the agent's own public host as its base URL
    (or none), HTTPS_PROXY, NO_PROXY and the CA variables of its runtime."""
    if run_id is not None:
        raise UsageError(
            "--run does not go with --intercept: intercepted exchanges go to the intercept gateway's run "
            "(start it with --run ID)"
        )
    if "/t/" in proxy:
        raise UsageError("--intercept: give the proxy's URL as the intercept gateway printed it")
    profile = get_profile(agent)
    public = UPSTREAMS[profile.upstream][0]
    snippet = profile.snippet(public, run_dir_of(Path(ctx.obj["journal"]), "intercept"), model)
    for name in profile.intercept_unset_env:
        snippet.env.pop(name, None)
    ca_dir = Path(absolute(confdir, f"--confdir {confdir}")) if confdir else default_confdir()
    changes, dropped = intercept_env(proxy, ca_dir, profile.ca_env, model_hosts(), dict(os.environ))
    snippet.env.update(changes)
    snippet.notes = [*snippet.notes, *profile.intercept_notes]
    if dropped:
        snippet.notes.append(
            f"NO_PROXY leaves out {', '.join(dropped)} of yours: it would send the model requests around "
            "the proxy"
        )
    if not (ca_dir / CA_CERT).is_file():
        snippet.notes.append(
            f"the CA is not in {ca_dir} yet: `pvisor ca path` (or the intercept gateway) creates it"
        )
    if not profile.intercept_verified:
        snippet.notes.append(
            f"intercept mode is not verified with {profile.title} (docs/agents.md): check the journal after "
            "a first request"
        )
    header = f"pvisor env: {profile.title} through the intercept proxy at {proxy} (CA in {ca_dir})"
    _emit(profile, snippet, header, None, public, shell)


def _emit(profile, snippet, header: str, run_id: str | None, base_url: str, shell: str) -> None:
    if shell == "json":
        doc = {
            "agent": profile.name,
            "run": run_id,
            "base_url": base_url,
            "env": snippet.env,
            "files": [{"path": str(p), "content": text} for p, text in snippet.files.items()],
            "argv": snippet.argv,
            "notes": snippet.notes,
        }
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return
    lines = [f"# {header}"] + [f"# {note}" for note in snippet.notes]
    for name, value in snippet.env.items():
        lines.append(
            f"export {name}={shlex.quote(value)}"
            if shell == "bash"
            else f"set -gx {name} {_fish_quote(value)}"
        )
    for path, text in snippet.files.items():
        if shell == "bash":
            if _MARK in text:  # cannot happen with our configs; never emit a broken here-doc
                raise UsageError(f"file {path} contains {_MARK}")
            lines.append(
                f"mkdir -p {shlex.quote(str(path.parent))} && cat > {shlex.quote(str(path))} <<'{_MARK}'"
            )
            lines.extend(text.rstrip("\n").split("\n"))
            lines.append(_MARK)
        else:
            lines.append(
                f"mkdir -p {_fish_quote(str(path.parent))}; and printf '%s\\n' "
                f"{_fish_quote(text.rstrip(chr(10)))} > {_fish_quote(str(path))}"
            )
    quote = shlex.quote if shell == "bash" else _fish_quote
    lines.append(" ".join(quote(a) for a in snippet.argv))
    click.echo("\n".join(lines))


def _fish_quote(value: str) -> str:
    """``value`` for fish: as is when it holds only safe characters, else single-quoted (inside,
    only backslash and quote are escaped)."""
    if value and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
