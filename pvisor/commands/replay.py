"""``pvisor replay``: prepare-only and replay-only (continuation comes next).

Output: one summary line on stdout; with ``--result -`` the result document (indented JSON)
goes to stdout instead and the summary line to stderr, so stdout is exactly one JSON value.
The journal comes from the global ``--journal`` (``ctx.obj["journal"]``), read only with
``--run``. Docs: docs/result-protocol.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from pvisor.journal.errors import UsageError

_PROTOCOLS = ["anthropic", "openai-chat", "openai-responses", "gemini"]


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


def _path(opt: str, value: str | None) -> Path | None:
    """An option's path; an empty one is a usage error (``Path("")`` would silently be ``.``)."""
    if value is None:
        return None
    if value == "":
        raise UsageError(f'{opt} "": an empty path (give . for the current directory)')
    return Path(value)


@click.command("replay")
@click.option("--agent", required=True, metavar="NAME", help="The agent: claude-code, codex, gemini-cli, qwen-code, opencode, mini-swe-agent, openhands, swe-agent.")
@click.option("--trajectory", type=str, default=None, metavar="PATH", help="The agent's native trajectory file (source).")
@click.option("--run", "run_id", default=None, metavar="ID", help="A run of the journal (id or unique prefix) (source).")
@click.option("--after-step", "after_step", type=_StepNumber(), required=True, metavar="N", help="Keep the task and steps 1..N (0 <= N <= steps); exclude A(N+1) and after.")
@click.option("--prepare-only", "prepare_only_flag", is_flag=True, help="Write the prefix and the result; execute nothing, start nothing, open no socket.")
@click.option("--replay-only", "replay_only_flag", is_flag=True, help="Re-run the agent through steps 1..N with the recorded actions in --workspace; record the prefix at request N+1 and end the agent.")
@click.option("--output", type=str, required=True, metavar="DIR", help="Directory for prefix.json, prefix.request.json, result.json (not inside the workspace).")
@click.option("--workspace", type=str, default=None, metavar="DIR", help="prepare-only: digest it before and after (never written). replay-only (required): the new directory the agent re-runs its tools in.")
@click.option("--agent-entrypoint", "entrypoint", default=None, metavar="PATH", help="replay-only: the agent's executable (default: its command on PATH).")
@click.option("--task", default=None, metavar="TEXT", help="replay-only: the task, when the source holds none.")
@click.option("--timeout", type=float, default=900.0, show_default=True, metavar="SECONDS", help="replay-only: how long the agent may take.")
@click.option("--allow-unsupported", is_flag=True, help="replay-only: run an installed agent version outside its profile's range.")
@click.option("--journal", "journal_opt", default=None, metavar="PATH", help="The journal (as the global --journal, which it overrides).")
@click.option("--protocol", type=click.Choice(_PROTOCOLS), default=None, help="Wire protocol of a native render (agents that speak several); default per agent.")
@click.option("--profile-from", "profile_from", default=None, metavar="JOURNAL[:RUN]", help="A capture of the same agent (same major version): system prompt, tools and request parameters the native file lacks.")
@click.option("--session", default=None, metavar="ID", help="One session of an OpenCode store holding several.")
@click.option("--force", is_flag=True, help="Write into a non-empty --output (its earlier prefix and result files are replaced).")
@click.option("--result", "result_to", default=None, metavar="-", help="'-': print result.json to stdout (the summary line goes to stderr).")
@click.pass_context
def replay(ctx: click.Context, agent: str, trajectory: str | None, run_id: str | None, after_step: int, prepare_only_flag: bool,
           replay_only_flag: bool, output: str, workspace: str | None, entrypoint: str | None, task: str | None, timeout: float,
           allow_unsupported: bool, journal_opt: str | None, protocol: str | None, profile_from: str | None, session: str | None,
           force: bool, result_to: str | None) -> None:
    """Rebuild the request that ends at observation O_N of step N (--after-step N) from a
    journal run (--run, recorded bytes) or a native trajectory (--trajectory, rendered).

    --prepare-only writes DIR/prefix.json (the request body for inference N+1, exact bytes),
    DIR/prefix.request.json (method, path, query, non-secret headers) and DIR/result.json
    (schema sandbox-playback.result/v3, docs/result-protocol.md). --replay-only re-runs the agent
    through steps 1..N in --workspace, serving it the recorded actions, and writes the same files
    with the prefix the agent sent at request N+1 and O against O' per tool call (docs/replay.md)."""
    if prepare_only_flag == replay_only_flag:
        raise UsageError("give one mode: --prepare-only (rebuild the prefix, run nothing) or --replay-only (re-run the agent through "
                         "step N in a new --workspace); continuation with the live model comes later")
    if result_to is not None and result_to != "-":
        raise UsageError(f"--result {result_to}: only '-' (stdout) is supported; result.json is always written into --output")
    from pvisor.replay.prepare import PrepareOptions, prepare_only

    if journal_opt == "":
        raise UsageError("--journal is empty: give the journal file's path")
    journal = journal_opt or (ctx.obj.get("journal") if ctx.obj else None)
    if replay_only_flag:
        for opt, value in (("--protocol", protocol), ("--profile-from", profile_from)):
            if value is not None:
                raise UsageError(f"{opt} is for --prepare-only (a native render); --replay-only serves the agent in its own protocol")
        _replay_only(agent, trajectory, run_id, after_step, output, workspace, entrypoint, task, timeout, allow_unsupported, journal,
                     session, force, result_to)
        return
    for opt, value in (("--agent-entrypoint", entrypoint), ("--task", task)):
        if value is not None:
            raise UsageError(f"{opt} is for --replay-only; --prepare-only starts nothing")
    opts = PrepareOptions(
        agent=agent,
        after_step=after_step,
        output=_path("--output", output),
        trajectory=_path("--trajectory", trajectory),
        run=run_id,
        journal=Path(journal) if journal and run_id is not None else None,
        workspace=_path("--workspace", workspace),
        protocol=protocol,
        profile_from=profile_from,
        force=force,
        session=session,
    )
    # (a workspace_changed is raised by prepare_only: exit 1 through the error path)
    _report(lambda: prepare_only(opts), result_to)


def _report(replay: Any, result_to: str | None) -> None:
    """Run ``replay()`` (an outcome with ``result`` and ``summary()``) and tell how it went:
    warnings and the summary line; with ``--result -`` the document on stdout, also the failed
    one of an error (stdout stays one JSON value) and the summary on stderr."""
    from pvisor.journal.errors import PvisorError
    from pvisor.replay.prepare import dump_result

    try:
        outcome = replay()
    except PvisorError as exc:
        failed = getattr(exc, "result", None)
        if result_to == "-" and failed is not None:
            sys.stdout.buffer.write(dump_result(failed))
            sys.stdout.buffer.flush()
        raise
    for w in outcome.result["warnings"]:
        _note(f"pvisor: warning: {w['message']}")
    if result_to == "-":
        sys.stdout.buffer.write(dump_result(outcome.result))
        sys.stdout.buffer.flush()
        _note(outcome.summary())
    else:
        click.echo(outcome.summary())


def _replay_only(agent: str, trajectory: str | None, run_id: str | None, after_step: int, output: str, workspace: str | None,
                 entrypoint: str | None, task: str | None, timeout: float, allow_unsupported: bool, journal: str | None,
                 session: str | None, force: bool, result_to: str | None) -> None:
    from pvisor.replay_run import ReplayOnlyOptions, replay_only

    import gc

    gc.enable()  # the fast-exit path turned it off; a replay runs an agent for minutes
    if journal is None:
        from pvisor.journal.paths import default_journal_path

        journal = str(default_journal_path())
    opts = ReplayOnlyOptions(
        agent=agent, after_step=after_step, output=_path("--output", output), workspace=_path("--workspace", workspace),
        journal=Path(journal), trajectory=_path("--trajectory", trajectory), run=run_id, entrypoint=entrypoint, task=task,
        session=session, timeout=timeout, force=force, allow_unsupported=allow_unsupported,
    )
    _report(lambda: replay_only(opts, lambda m: _note(f"pvisor: warning: {m}")), result_to)


def _note(line: str) -> None:
    """A line for people on stderr. The three files are written by now: stderr that cannot be
    written (``2>/dev/full``) does not make the command fail with another error's code; the
    CLI's final flush still reports it (exit 74)."""
    try:
        click.echo(line, err=True)
    except OSError:
        pass
