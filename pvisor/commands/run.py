"""``pvisor run``: run a real agent CLI headless with the capture gateway in front of it."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from pvisor.adapters.agents import agent_names, executables
from pvisor.adapters.agents.base import AgentOutcome
from pvisor.commands.base import Command, PathParam, one_line
from pvisor.commands.logs import show_on_stderr
from pvisor.commands.params import (
    RUN_ID,
    Seconds,
    intercept_config,
    intercept_options,
    max_response_body_option,
)
from pvisor.core.errors import EXIT_TIMEOUT
from pvisor.session.limits import parse_cpus, parse_size
from pvisor.session.run import RunRequest, run_agent
from pvisor.session.sandbox import SandboxMode, SandboxNetwork, default_mode


def _warn(message: str) -> None:
    click.echo(f"pvisor: warning: {message}", err=True)


@click.command("run", cls=Command)
@click.option(
    "--agent", required=True, type=click.Choice(agent_names()), help="The agent CLI to run (docs/agents.md)."
)
@click.option(
    "--agent-entrypoint",
    "entrypoint",
    metavar="PATH",
    default=None,
    help=f"The agent's executable (default: its command on PATH: {', '.join(executables())}).",
)
@click.option(
    "--upstream",
    metavar="URL",
    default=None,
    help="Model API the gateway forwards to (default: the agent's public API).",
)
@click.option(
    "--script",
    "script",
    type=PathParam(dir_okay=False),
    default=None,
    help="Answer from this script with the built-in scripted model, offline (docs/scripted-model.md).",
)
@click.option(
    "--workspace",
    type=PathParam(file_okay=False),
    default=None,
    help="Directory the agent works in (default: the current one).",
)
@click.option(
    "--timeout",
    type=Seconds(0.001),
    default=1800.0,
    show_default=True,
    help="Seconds the agent may run; then its process group is killed (exit 124).",
)
@click.option(
    "--resume",
    "resume",
    type=RUN_ID,
    metavar="RUN",
    default=None,
    help="Continue RUN's session through the agent's native resume, as its next attempt.",
)
@click.option(
    "--model",
    default=None,
    help="Model name to ask for (default: the agent's own; required by some with --upstream).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Gateway port on 127.0.0.1; 0 picks a free one.",
)
@click.option(
    "--allow-unsupported", is_flag=True, help="Run an agent version outside the verified range (a warning)."
)
@click.option(
    "--use-home",
    is_flag=True,
    help="Use your real home and agent config (logins, settings) instead of a private home.",
)
@click.option(
    "--no-snapshots",
    "no_snapshots",
    is_flag=True,
    help="Do not snapshot the workspace (by default: at the start, at every model request, at the end).",
)
@click.option(
    "--snapshot-driver",
    "snapshot_driver",
    default="filesystem",
    show_default=True,
    metavar="NAME",
    help="The snapshot driver (one registered under the entry point group pvisor.snapshot_drivers).",
)
@click.option(
    "--child-run",
    "child_run",
    metavar="ID",
    default=None,
    help="Run as the pending child run ID of a handoff (TrajectoryReplay.restore_handoff created it): "
    "filed under ID with its lineage, once; default workspace: where the handoff restored the pause.",
)
@click.option(
    "--dummy-key",
    "dummy_key",
    is_flag=True,
    help="Give the agent a dummy key; the gateway adds your real one (its key variable) when it "
    'forwards, so nothing the agent runs can read it (docs/replay.md, "Keys in a continuation").',
)
@click.option(
    "--sandbox",
    "sandbox",
    type=click.Choice(["auto", "bwrap", "none"]),
    default=None,
    help="Run the agent in a bubblewrap sandbox (bwrap), or not (none, the default: a live capture stays "
    "transparent; PVISOR_SANDBOX sets it); auto: bwrap when it works here.",
)
@click.option(
    "--sandbox-network",
    "sandbox_network",
    type=click.Choice(["gateway", "host"]),
    default="gateway",
    show_default=True,
    help="In the sandbox: reach only the gateway (gateway), or the host's network (host).",
)
@click.option(
    "--sandbox-allow",
    "sandbox_allow",
    multiple=True,
    type=PathParam(),
    metavar="PATH",
    help="In the sandbox: let the agent write PATH too (repeatable).",
)
@click.option(
    "--sandbox-memory",
    "sandbox_memory",
    metavar="SIZE",
    default=None,
    help="At most SIZE of memory (512M, 2G) for the agent and all it starts, through a cgroup of the "
    "run's, with or without a sandbox (exit 69 where none can be made); past it the kernel kills.",
)
@click.option(
    "--sandbox-cpus",
    "sandbox_cpus",
    metavar="N",
    default=None,
    help="At most N CPUs' time (0.5, 2) for the agent and all it starts, through the run's cgroup.",
)
@max_response_body_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON for machines.")
@click.argument("task", nargs=-1, required=False)
@intercept_options
@click.pass_context
def run(
    ctx: click.Context,
    agent: str,
    entrypoint: str | None,
    upstream: str | None,
    script: str | None,
    workspace: str | None,
    timeout: float,
    resume: str | None,
    model: str | None,
    port: int,
    allow_unsupported: bool,
    use_home: bool,
    no_snapshots: bool,
    snapshot_driver: str,
    child_run: str | None,
    dummy_key: bool,
    sandbox: str | None,
    sandbox_network: str,
    sandbox_allow: tuple[str, ...],
    sandbox_memory: str | None,
    sandbox_cpus: str | None,
    max_response_body: int,
    as_json: bool,
    task: tuple[str, ...],
    intercept: bool,
    confdir: str | None,
    mitmdump: str | None,
) -> None:
    """Run an agent CLI headless with the gateway in front of it, and record the run.

    The gateway starts on 127.0.0.1 and the agent gets a base URL carrying the run id; its
    config and sessions go to a private home under <data dir>/runs/<run>/ (the data dir holds
    the journal), never your home or the workspace. Prints the run id, the steps captured and
    the native trajectory path. Exits with the agent's exit code; 124 when --timeout killed it;
    130 / 143 / 129 after Ctrl-C / SIGTERM / SIGHUP (the agent and what it left running are
    stopped, the attempt recorded); pvisor's own failures: 2 usage, 65 bad input, 69 agent or
    port unavailable (docs/cli.md). With --script no real API key reaches the agent.

    \b
    Examples:
      pvisor run --agent claude-code -- "make the failing test pass"
      pvisor run --agent codex --script turns.json --workspace ws -- "write hello.txt"
      pvisor run --agent claude-code --resume r-3f2a9c0d1e2b -- "now add a test"
      pvisor run --agent claude-code --intercept --script turns.json -- "write hello.txt"
      pvisor run --agent codex --child-run child-1 -- "go on from the pause"
    """
    request = RunRequest(
        agent=agent,
        task=" ".join(task),
        journal_path=Path(ctx.obj["journal"]),
        entrypoint=entrypoint,
        upstream=upstream,
        script=script,
        workspace=Path(workspace) if workspace else None,
        timeout=timeout,
        resume=resume,
        allow_unsupported=allow_unsupported,
        use_home=use_home,
        port=port,
        model=model,
        snapshots=not no_snapshots,
        snapshot_driver=snapshot_driver,
        intercept=intercept_config(intercept, confdir, mitmdump),
        child_run=child_run,
        dummy_key=dummy_key,
        max_response_body=max_response_body,
        sandbox=SandboxMode(sandbox) if sandbox else default_mode(SandboxMode.NONE),
        sandbox_network=SandboxNetwork(sandbox_network),
        sandbox_allow=[Path(p) for p in sandbox_allow],
        # a bad value: exit 2 naming the option, before anything runs
        sandbox_memory=parse_size(sandbox_memory) if sandbox_memory is not None else None,
        sandbox_cpus=parse_cpus(sandbox_cpus) if sandbox_cpus is not None else None,
    )
    undo = show_on_stderr(
        ("pvisor.journal", "pvisor.gateway")
    )  # e.g. "journal ... is locked by another process"
    try:
        report = run_agent(request, _warn)
    finally:
        undo()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        _print_report(report)
    _say_how_it_ended(ctx, report, agent, timeout)
    ctx.exit(report.exit_code)


def _say_how_it_ended(ctx: click.Context, report, agent: str, timeout: float) -> None:
    """One line on stderr when the agent did not end well: killed after ``--timeout`` (then exit
    124 here), stopped by a signal, failed by its own account, or exited with a code."""
    if report.timed_out:
        click.echo(
            f"pvisor: error: {agent} did not finish within {timeout:g} s: its process group was killed "
            f"(run {report.run}, attempt {report.attempt})",
            err=True,
        )
        ctx.exit(EXIT_TIMEOUT)
    if report.interrupted:
        click.echo(
            f"pvisor: interrupted by {report.interrupt_signal or 'a signal'}: {agent} was stopped, the "
            "attempt recorded "
            f"(run {report.run}, attempt {report.attempt}; exit {report.exit_code})",
            err=True,
        )
    elif report.failed_by_own_account:
        own = report.agent_status
        click.echo(
            f"pvisor: {agent} exited 0 but failed by its own account: {own.detail or 'no reason given'} "
            f"({own.source}: {_status_file(report)})",
            err=True,
        )
    elif report.agent_exit_code:
        own = report.agent_status
        if own is not None and own.outcome is AgentOutcome.FAILED and own.detail:
            # the reason is often on its stdout, its stderr empty (Claude Code's "Not logged in")
            click.echo(
                f"pvisor: {agent} exited with code {report.agent_exit_code}: {own.detail} "
                f"({own.source}: {_status_file(report)}; its stderr: {report.stderr})",
                err=True,
            )
        else:
            click.echo(
                f"pvisor: {agent} exited with code {report.agent_exit_code} (its stdout: {report.stdout}; "
                f"its stderr: {report.stderr})",
                err=True,
            )


def _status_file(report) -> str:
    """The file the agent's own status was read from: its trajectory or its stdout."""
    own = report.agent_status
    if own is not None and "trajectory" in own.source and report.native_path is not None:
        return str(report.native_path)
    return str(report.stdout)


def _own_status(r) -> str:
    """``; by its own account: failed (RepeatedFormatError)``, or nothing when it said nothing."""
    own = r.agent_status
    if own is None or own.outcome is AgentOutcome.UNKNOWN:
        return ""
    return f"; by its own account: {own.outcome.value}" + (f" ({own.detail})" if own.detail else "")


def _limits_line(limits: dict) -> str:
    """The report's line on the run's cgroup: its limits and what they did."""
    said = []
    if limits["memory_limit"] is not None:
        hit = "; limit hit" if limits["memory_limit_hit"] else ""
        kills = f", {limits['oom_kills']} process(es) killed by the kernel" if limits["oom_kills"] else ""
        peak = f", peak {limits['memory_peak']} bytes" if limits["memory_peak"] is not None else ""
        said.append(f"memory {limits['memory_limit']} bytes{peak}{hit}{kills}")
    if limits["cpus"] is not None:
        said.append(f"{limits['cpus']:g} CPUs, throttled {limits['cpu_throttled']} time(s)")
    return f"{'; '.join(said)} (cgroup {limits['version']})"


def _print_report(r) -> None:
    version = f" {r.agent_version}" if r.agent_version else ""
    click.echo(f"run {r.run}  agent {r.agent}{version}  attempt {r.attempt}")
    click.echo(one_line(f"  workspace: {r.workspace}"))  # paths are shown escaped, never raw
    status = (
        "timed out"
        if r.timed_out
        else f"interrupted ({r.interrupt_signal})"
        if r.interrupted
        else f"exit code {r.agent_exit_code}{_own_status(r)}"
    )
    click.echo(f"  agent: {status}")
    if r.sandbox.get("mode") != "none":
        click.echo(f"  sandbox: {r.sandbox['mode']} (network {r.sandbox['network']})")
    limits = r.sandbox.get("limits")
    if limits is not None:
        click.echo(f"  limits: {_limits_line(limits)}")
    if r.steps is not None:
        calls = ", ".join(map(str, r.tool_calls_per_step))
        click.echo(
            f"  steps captured: {r.steps}"
            + (f" (tool calls per step: {calls})" if calls else "")
            + (
                "  WARNING: the agent exited 0 without a single step"
                if r.steps == 0 and r.agent_exit_code == 0 and not r.attempt_steps
                else ""
            )
        )
        if r.attempt > 1 or any(not c["main"] for c in r.attempt_steps):
            this = "; ".join(
                f"chain {c['chain']}{' (main)' if c['main'] else ''}, {c['steps']} "
                f"step{'' if c['steps'] == 1 else 's'}"
                for c in r.attempt_steps
            )
            click.echo(f"  this attempt: {this or 'no step'}")
        click.echo(
            f"  exchanges: {r.exchanges} (main-loop {r.main_exchanges}, auxiliary {r.auxiliary_exchanges}) "
            f"in {r.chains} chain(s)" + (f"; main chain {r.main_chain}" if r.main_chain is not None else "")
        )
    else:
        click.echo(f"  steps captured: unknown ({r.steps_error})")
    click.echo(
        f"  workspace snapshots: {r.snapshots}" + (f" (pvisor snapshot ls {r.run})" if r.snapshots else "")
    )
    click.echo(f"  session: {r.session_id or '-'}")
    click.echo(one_line(f"  native trajectory: {r.native_path or '-'}"))
    if r.stray_processes_killed:
        click.echo(f"  left-over processes ended: {r.stray_processes_killed}")
    click.echo(one_line(f"  agent output: {r.stdout}  {r.stderr}"))
    click.echo(f"next: pvisor journal steps {r.run}    pvisor journal show {r.run}")
