"""``pvisor replay``: prepare-only, replay-only and continuation (the default mode).

Output: one summary line on stdout; with ``--result -`` the result document (indented JSON)
goes to stdout instead and the summary line to stderr, so stdout is exactly one JSON value.
The journal comes from the global ``--journal`` (``ctx.obj["journal"]``), read only with
``--run``. Docs: docs/result-protocol.md.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from pvisor.adapters.agents import descriptor_names
from pvisor.commands.base import Command, one_line

from pvisor.commands.params import RUN_ID, intercept_config, intercept_options
from pvisor.adapters.protocols import PROTOCOL_MODULES
from pvisor.commands.progress import progress_option
from pvisor.journal.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

#: the longest --after-step accepted, in digits (leading zeros aside)
MAX_STEP_DIGITS = 4000


class _StepNumber(click.ParamType):
    """--after-step: ASCII digits only (``int()`` would also take " 1", "1_0" and "１")."""

    name = "N"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        if not (text.isascii() and text.isdigit()):
            self.fail(f"{text!r} is not a step number (0, 1, 2, ... in ASCII digits)", param, ctx)
        digits = text.lstrip("0") or "0"
        if len(digits) > MAX_STEP_DIGITS:
            # int() refuses past 4300 digits; no trajectory has that many steps
            self.fail(f"a step number of {len(digits)} digits (at most {MAX_STEP_DIGITS})", param, ctx)
        return int(digits)


def _path(opt: str, value: str | None) -> str | None:
    """An option's path; an empty one is a usage error (``Path("")`` would silently be ``.``).
    A string: prepare-only takes its paths as given and loads no pathlib (docs/benchmarks.md)."""
    if value is None:
        return None
    if value == "":
        raise UsageError(f'{opt} "": an empty path (give . for the current directory)')
    from pvisor.journal.paths import plain_path

    return plain_path(value)  # as a Path would name it: ./t.jsonl is t.jsonl, out/ is out


def _as_path(value: str | None) -> Path | None:
    """``value`` as a Path, for the modes that start an agent (:mod:`pvisor.session.replay`)."""
    from pathlib import Path

    return None if value is None else Path(value)


@click.command("replay", cls=Command)
@click.option(
    "--agent",
    default=None,
    metavar="NAME",
    help=f"The agent: {', '.join(descriptor_names())}.",
)
@click.option(
    "--trajectory",
    type=str,
    default=None,
    metavar="PATH",
    help="The agent's native trajectory file (source).",
)
@click.option(
    "--run",
    "run_id",
    type=RUN_ID,
    default=None,
    metavar="ID",
    help="A run of the journal (id or unique prefix) (source).",
)
@click.option(
    "--after-step",
    "after_step",
    type=_StepNumber(),
    default=None,
    metavar="N",
    help="Keep the task and steps 1..N (0 <= N <= steps); exclude A(N+1) and after.",
)
@click.option(
    "--prepare-only",
    "prepare_only_flag",
    is_flag=True,
    help="Write the prefix and the result; execute nothing, start nothing, open no socket.",
)
@click.option(
    "--replay-only",
    "replay_only_flag",
    is_flag=True,
    help="Re-run the agent through steps 1..N with the recorded actions in --workspace; record the prefix at request N+1 and end the agent.",
)
@click.option(
    "--output",
    type=str,
    default=None,
    metavar="DIR",
    help="Directory for prefix.json, prefix.request.json, result.json (not inside the workspace).",
)
@click.option(
    "--workspace",
    type=str,
    default=None,
    metavar="DIR",
    help="prepare-only: digest it before and after (never written). replay-only and continuation (required): the new directory the agent re-runs its tools in.",
)
@click.option(
    "--workspace-from",
    "workspace_from",
    type=RUN_ID,
    default=None,
    metavar="RUN",
    help="replay-only, continuation: restore RUN's recorded start state (its step-0 snapshot) into the empty --workspace first.",
)
@click.option(
    "--child-run",
    "child_run",
    default=None,
    metavar="ID",
    help="replay-only, continuation: file the derived run under ID, the pending child run of a handoff "
    "(TrajectoryReplay.restore_handoff) that continues --run after step N; once.",
)
@click.option(
    "--agent-entrypoint",
    "entrypoint",
    default=None,
    metavar="PATH",
    help="replay-only, continuation: the agent's executable (default: its command on PATH).",
)
@click.option(
    "--task",
    default=None,
    metavar="TEXT",
    help="replay-only, continuation: the task, when the source holds none.",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="replay-only, continuation: how long the agent may take (default 900).",
)
@click.option(
    "--allow-unsupported",
    is_flag=True,
    default=None,
    help="replay-only, continuation: run an installed agent version outside its profile's range.",
)
@click.option(
    "--upstream",
    default=None,
    metavar="URL",
    help="continuation: the live model's base URL (default: the agent's public API, with the key from the environment).",
)
@click.option(
    "--max-steps",
    "max_steps",
    type=int,
    default=None,
    metavar="K",
    help="continuation: at most K live steps (main-loop requests N+1..N+K), then a final reply ends the agent (default: no limit).",
)
@click.option(
    "--boundary-user-prompt",
    "boundary_prompt",
    default=None,
    metavar="TEXT",
    help="continuation: a user message placed once after O'_N, before the first live inference.",
)
@click.option(
    "--reasoning",
    type=click.Choice(["keep", "strip"]),
    default=None,
    help="continuation: keep the served replies' reasoning (default; a refusal is reported) or strip it so that the live API accepts the request.",
)
@click.option(
    "--live-model",
    "live_model",
    default=None,
    metavar="NAME",
    help="continuation: ask the live upstream for this model instead of the recorded one.",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME",
    help="replay-only, continuation: the model the agent is launched with (default: the recorded one).",
)
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="FILE",
    help="A replay.toml with any of these options and a table per agent (entrypoint, environment, arguments, model); flags override it.",
)
@click.option(
    "--journal",
    "journal_opt",
    default=None,
    metavar="PATH",
    help="The journal (as the global --journal, which it overrides).",
)
@click.option(
    "--protocol",
    type=click.Choice(list(PROTOCOL_MODULES)),
    default=None,
    help="Wire protocol of a native render (agents that speak several); default per agent.",
)
@click.option(
    "--profile-from",
    "profile_from",
    default=None,
    metavar="JOURNAL[:RUN]",
    help="A capture of the same agent (same major version): system prompt, tools and request parameters the native file lacks.",
)
@click.option(
    "--session", default=None, metavar="ID", help="One session of an OpenCode store holding several."
)
@click.option(
    "--force",
    is_flag=True,
    default=None,
    help="Write into a non-empty --output (its earlier prefix and result files are replaced).",
)
@click.option(
    "--allow-damaged",
    "allow_damaged",
    is_flag=True,
    default=None,
    help="Build the prefix from a damaged native file (lost or unreadable lines, a repaired chain) and list each repair; refused by default.",
)
@click.option(
    "--result",
    "result_to",
    default=None,
    metavar="-",
    help="'-': print result.json to stdout (the summary line goes to stderr).",
)
@click.option(
    "--batch",
    "batch",
    default=None,
    metavar="MANIFEST",
    help="prepare-only: many prefixes in one process, one JSON line each (trajectory or run, agent, after_step, ...); "
    "OUT/<name>/ for each, or --rows.",
)
@click.option(
    "--rows",
    "rows",
    default=None,
    metavar="FILE",
    help="With --batch: one row per line (prefix, request, result) into FILE, JSON Lines, or Parquet for FILE.parquet.",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="With --batch and --rows: prepare on this Ray cluster ('local' starts one here; extra "
    "pvisor-replay[ray]).",
)
@intercept_options
@click.pass_context
@progress_option
def replay(ctx: click.Context, **flags: Any) -> None:
    """Rebuild the request that ends at observation O_N of step N (--after-step N) from a
    journal run (--run, recorded bytes) or a native trajectory (--trajectory, rendered), and
    go on from there.

    \b
    Modes (docs/replay.md):
      --prepare-only  write DIR/prefix.json (the request body for inference N+1, exact bytes),
                      DIR/prefix.request.json and DIR/result.json; run nothing.
      --replay-only   re-run the agent through steps 1..N in --workspace, serving it the
                      recorded actions; record the prefix it sends at request N+1; end it.
      (no flag)       continuation: as --replay-only, then request N+1 and every later one go
                      to the live model (--upstream URL, default the agent's public API), for at
                      most --max-steps K live steps; the derived run is in the journal.

    \b
    Example (continue a captured run after step 2 against a local model server):
      pvisor replay --agent claude-code --run RUN --after-step 2 --workspace ws2 \\
        --output out --upstream http://127.0.0.1:8000 --max-steps 5 \\
        --boundary-user-prompt "Now add a test."
    """
    from pvisor.replay.errors import ReplayUsageError

    if flags["result_to"] is not None and flags["result_to"] != "-":
        raise UsageError(
            f"--result {flags['result_to']}: only '-' (stdout) is supported; result.json is always written into --output"
        )
    if flags["batch"] is not None or flags["rows"] is not None or flags["ray_address"] is not None:
        _batch(ctx, flags)
        return
    o = _merged(flags)
    if o["prepare_only_flag"] and o["replay_only_flag"]:
        raise UsageError(
            "give one mode at most: --prepare-only (rebuild the prefix, run nothing), --replay-only (re-run the agent "
            "through step N in a new --workspace), or neither (continue with the live model after step N)"
        )
    for name, opt in (("agent", "--agent"), ("after_step", "--after-step"), ("output", "--output")):
        if o[name] is None:
            raise UsageError(f"missing option {opt} (on the command line, or in --config)")
    if o["max_steps"] is not None and o["max_steps"] < 1:
        raise ReplayUsageError(
            "usage",
            f"--max-steps {o['max_steps']}: a continuation runs at least one live step "
            "(--replay-only runs none)",
        )
    if o["journal_opt"] == "":
        raise UsageError("--journal is empty: give the journal file's path")
    journal = o["journal_opt"] or (ctx.obj.get("journal") if ctx.obj else None)
    live_opts = ("upstream", "max_steps", "boundary_prompt", "reasoning", "live_model")
    if o["prepare_only_flag"] or o["replay_only_flag"]:
        mode = "--prepare-only" if o["prepare_only_flag"] else "--replay-only"
        for name in live_opts:
            if flags[name] is not None:
                raise UsageError(
                    f"--{name.replace('_', '-').replace('boundary-prompt', 'boundary-user-prompt')} is for a "
                    f"continuation (no mode flag); {mode} sends nothing to a live model"
                )
    if not o["prepare_only_flag"]:
        for opt, name in (("--protocol", "protocol"), ("--profile-from", "profile_from")):
            if o[name] is not None:
                raise UsageError(
                    f"{opt} is for --prepare-only (a native render); replaying with the agent serves it in its own "
                    "protocol"
                )
        _replay_agent(o, journal, live=not o["replay_only_flag"])
        return
    if o["workspace_from"] is not None:
        raise UsageError(
            "--workspace-from is for --replay-only and continuation; --prepare-only never writes the workspace"
        )
    if o["child_run"] is not None:
        raise UsageError("--child-run is for --replay-only and continuation; --prepare-only makes no run")
    for opt, name in (("--agent-entrypoint", "entrypoint"), ("--task", "task"), ("--model", "model")):
        if flags[name] is not None:
            raise UsageError(f"{opt} is for --replay-only and continuation; --prepare-only starts nothing")
    for opt, name in (("--intercept", "intercept"), ("--confdir", "confdir"), ("--mitmdump", "mitmdump")):
        if flags[name]:
            raise UsageError(f"{opt} is for --replay-only and continuation; --prepare-only starts nothing")
    from pvisor.replay.prepare import PrepareOptions, prepare

    opts = PrepareOptions(
        agent=o["agent"],
        after_step=o["after_step"],
        output=_path("--output", o["output"]),
        trajectory=_path("--trajectory", o["trajectory"]),
        run=o["run_id"],
        journal=journal if journal and o["run_id"] is not None else None,
        workspace=_path("--workspace", o["workspace"]),
        protocol=o["protocol"],
        profile_from=o["profile_from"],
        force=bool(o["force"]),
        session=o["session"],
        allow_damaged=bool(o["allow_damaged"]),
    )
    # (a workspace_changed is the outcome's error: exit 1 through the error path)
    _report(lambda: prepare(opts), o["result_to"])


#: the options a batch takes from each manifest line, never from the command line
_PER_LINE = (
    "agent",
    "trajectory",
    "run_id",
    "after_step",
    "workspace",
    "protocol",
    "profile_from",
    "session",
)


def _batch(ctx: click.Context, flags: dict[str, Any]) -> None:
    """``--prepare-only --batch MANIFEST (--output OUT | --rows FILE)``: replay/batch.py.
    Exit 0 when every line was prepared, 1 when some were not (each named on stderr)."""
    if flags["batch"] is None:
        which = "--rows" if flags["rows"] is not None else "--ray"
        raise UsageError(f"{which} is for --batch MANIFEST (a row per manifest line)")
    if not flags["prepare_only_flag"] or flags["replay_only_flag"]:
        raise UsageError("--batch is for --prepare-only (many prefixes in one process)")
    for name in _PER_LINE:
        if flags[name] is not None:
            opt = "--run" if name == "run_id" else f"--{name.replace('_', '-')}"
            raise UsageError(f"{opt} comes from each line of --batch (the key {name.replace('_id', '')!r})")
    for name in (
        "config_path",
        "result_to",
        *_LIVE,
        "workspace_from",
        "child_run",
        "entrypoint",
        "task",
        "model",
    ):
        if flags[name] is not None:
            raise UsageError("--batch takes --output or --rows, --journal, --force and --allow-damaged only")
    if (flags["output"] is None) == (flags["rows"] is None):
        raise UsageError("--batch needs one of --output OUT (a directory per line) and --rows FILE")
    if flags["ray_address"] is not None and flags["rows"] is None:
        raise UsageError(
            "--ray writes rows: give --rows FILE (the workers may not share this machine's disk)"
        )
    for opt, key in (("--batch", "batch"), ("--rows", "rows")):
        if flags[key] == "":
            raise UsageError(f'{opt} "": an empty path, expected a file')
    manifest = _as_path(_path("--batch", flags["batch"]))
    output = _as_path(_path("--output", flags["output"]))
    rows = _as_path(_path("--rows", flags["rows"]))
    journal = flags["journal_opt"] or (ctx.obj.get("journal") if ctx.obj else None)
    from pvisor.commands.batch import run_batch

    failed = run_batch(
        manifest,
        output=output,
        rows=rows,
        journal=_as_path(journal) if journal else None,
        force=bool(flags["force"]),
        allow_damaged=bool(flags["allow_damaged"]),
        ray_address=flags["ray_address"],
    )
    if failed:
        ctx.exit(1)


#: command-line names -> keys of a replay.toml (docs/replay.md "Config")
_CONFIG_KEYS = {
    "agent": "agent",
    "trajectory": "trajectory",
    "run_id": "run",
    "after_step": "after_step",
    "output": "output",
    "workspace": "workspace",
    "task": "task",
    "timeout": "timeout",
    "allow_unsupported": "allow_unsupported",
    "upstream": "upstream",
    "max_steps": "max_steps",
    "boundary_prompt": "boundary_user_prompt",
    "reasoning": "reasoning",
    "live_model": "live_model",
    "journal_opt": "journal",
    "protocol": "protocol",
    "profile_from": "profile_from",
    "session": "session",
    "force": "force",
    "allow_damaged": "allow_damaged",
    "workspace_from": "workspace_from",
    "child_run": "child_run",
}


def _merged(flags: dict[str, Any]) -> dict[str, Any]:
    """The options: each flag, else the --config file's value (top level, then for entrypoint
    and model the agent's table); the file's ``mode`` sets the mode flags no flag set. Adds
    ``agent_env`` and ``agent_args`` (the agent's table)."""
    o = dict(flags)
    o["agent_env"], o["agent_args"] = {}, []
    path = flags["config_path"]
    if path is None:
        return o
    if path == "":
        raise UsageError('--config "": an empty path')
    from pvisor.replay.config import load_config

    cfg = load_config(path)
    for name, key in _CONFIG_KEYS.items():
        o[name] = cfg.option(key, flags[name])
    if not (flags["prepare_only_flag"] or flags["replay_only_flag"]):
        mode = cfg.option("mode", None)
        mode = getattr(mode, "value", mode)
        o["prepare_only_flag"] = mode == "prepare-only"
        o["replay_only_flag"] = mode == "replay-only"
    if o["agent"] is not None:
        settings = cfg.settings(o["agent"])
        o["entrypoint"] = flags["entrypoint"] if flags["entrypoint"] is not None else settings.entrypoint
        o["model"] = flags["model"] if flags["model"] is not None else settings.model
        o["agent_env"], o["agent_args"] = dict(settings.environment), list(settings.arguments)
    for name in ("output", "workspace", "trajectory", "journal_opt"):
        if o[name] is not None and not isinstance(o[name], str):
            o[name] = str(o[name])
    if o["reasoning"] is not None and not isinstance(o["reasoning"], str):
        o["reasoning"] = o["reasoning"].value
    if o["prepare_only_flag"] or o["replay_only_flag"]:
        ignored = [_CONFIG_KEYS[n] for n in _LIVE if flags[n] is None and o[n] is not None]
        if ignored:
            mode = "--prepare-only" if o["prepare_only_flag"] else "--replay-only"
            _note(
                f"pvisor: warning: {path}: {', '.join(ignored)} are for a continuation; {mode} ignores them"
            )
            for n in _LIVE:
                if flags[n] is None:
                    o[n] = None
    return o


#: the options of a continuation only
_LIVE = ("upstream", "max_steps", "boundary_prompt", "reasoning", "live_model")


def _report(replay: Any, result_to: str | None) -> None:
    """Run ``replay()`` (an outcome with ``result``, ``error`` and ``summary()``) and tell how
    it went: warnings and the summary line (control characters of the paths it names escaped,
    as every message escapes them: ``--output 'o\x1b[2J'`` must not clear the terminal); with
    ``--result -`` the document on stdout, also the failed one beside an error (stdout stays
    one JSON value) and the summary on stderr; the error is then raised."""
    from pvisor.replay.result import dump_result

    outcome = replay()
    if outcome.error is not None:
        if result_to == "-":
            sys.stdout.buffer.write(dump_result(outcome.result))
            sys.stdout.buffer.flush()
        raise outcome.error
    for w in outcome.result["warnings"]:
        _note(f"pvisor: warning: {one_line(w['message'])}")
    if result_to == "-":
        sys.stdout.buffer.write(dump_result(outcome.result))
        sys.stdout.buffer.flush()
        _note(one_line(outcome.summary()))
    else:
        click.echo(one_line(outcome.summary()))


def _replay_agent(o: dict[str, Any], journal: str | None, live: bool) -> None:
    from pvisor.session.replay import DEFAULT_TIMEOUT_S, ReplayOptions, continue_replay, replay_only

    import gc

    # the fast-exit path turned it off; a replay runs an agent for minutes (what the imports
    # made stays out of its collections: pvisor/entry.py)
    gc.freeze()
    gc.enable()
    if journal is None:
        from pvisor.journal.paths import default_journal_path

        journal = str(default_journal_path())
    opts = ReplayOptions(
        agent=o["agent"],
        after_step=o["after_step"],
        output=_as_path(_path("--output", o["output"])),
        workspace=_as_path(_path("--workspace", o["workspace"])),
        journal=_as_path(journal),
        trajectory=_as_path(_path("--trajectory", o["trajectory"])),
        run=o["run_id"],
        entrypoint=o["entrypoint"],
        task=o["task"],
        session=o["session"],
        timeout=o["timeout"] if o["timeout"] is not None else DEFAULT_TIMEOUT_S,
        force=bool(o["force"]),
        allow_unsupported=bool(o["allow_unsupported"]),
        model=o["model"],
        agent_env=o["agent_env"],
        agent_args=o["agent_args"],
        upstream=o["upstream"],
        max_steps=o["max_steps"],
        boundary_prompt=o["boundary_prompt"],
        reasoning=o["reasoning"] or "keep",
        live_model=o["live_model"],
        allow_damaged=bool(o["allow_damaged"]),
        workspace_from=o["workspace_from"],
        child_run=o["child_run"],
        intercept=intercept_config(bool(o["intercept"]), o["confdir"], o["mitmdump"]),
    )
    run = continue_replay if live else replay_only
    _report(lambda: run(opts, lambda m: _note(f"pvisor: warning: {m}")), o["result_to"])


def _note(line: str) -> None:
    """A line for people on stderr. The three files are written by now: stderr that cannot be
    written (``2>/dev/full``) does not make the command fail with another error's code; the
    CLI's final flush still reports it (exit 74)."""
    try:
        click.echo(line, err=True)
    except OSError:
        pass
