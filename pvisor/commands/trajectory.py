"""``pvisor adapters`` and ``pvisor trajectory show|export``: native trajectory files read into
steps (docs/native.md). Warnings go to stderr as ``pvisor: warning: FILE: WHERE: CODE: ...``;
``--strict`` turns any warning into exit 65.

Output streams: the trajectory's steps (built one at a time from the file by the JSONL
adapters) are iterated once and each is written as soon as it is made, so memory holds the
trajectory's structure and one step, never the whole document or table:

- ``--json`` and ``export`` write with :func:`~pvisor.adapters.native.render.write_json` /
  ``write_atif`` (bytes identical to dumping the whole document); every write is completed
  or raises, so a reader that closes the pipe early (``| head -c 100``) ends the command
  with exit 141 (:func:`pvisor.cli.main`) as for the table, and a full disk with 74;
- the human table buffers its first :data:`TABLE_BUFFER_ROWS` rows: a trajectory with no
  more steps gets columns as wide as their widest cell; a longer one prints those rows and
  streams the rest with each column at its maximum width (STEP: digits of the step count,
  ACTION: :data:`ACTION_WIDTH`, OBSERVATION: :data:`OBSERVATION_WIDTH`; FLAGS last, unpadded).
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

from pvisor.commands.base import Command, Group, PathParam, one_line
import orjson

from pvisor.commands.exports import format_option
from pvisor.commands.params import Seconds, Size
from pvisor.commands.progress import is_terminal, progress_option
from pvisor.core import progress
from pvisor.core.errors import BadInputError


#: the human table's rows kept to size its columns; past this many steps, rows stream at the
#: columns' maximum widths
TABLE_BUFFER_ROWS = 1000
#: the widest ACTION cell (``pvisor.commands.cells.action_cell`` clips tool calls to 90)
ACTION_WIDTH = 90
#: OBSERVATION cells are clipped to this many characters
OBSERVATION_WIDTH = 60
HEADER = ["STEP", "ACTION (TOOL CALLS)", "OBSERVATION", "FLAGS"]


def _emit_json(obj) -> None:
    from pvisor.adapters.native.render import JSON_OPTIONS, write_all

    write_all(sys.stdout.buffer, orjson.dumps(obj, option=JSON_OPTIONS) + b"\n")


def _stream_json(write, result, name: str) -> None:
    """``write(result, name, out)`` to stdout (binary), after what click wrote as text; with no
    bar when stdout is the terminal too (it would be drawn into the document)."""
    sys.stdout.flush()
    with progress.listening(None) if is_terminal(sys.stdout) else contextlib.nullcontext():
        write(result, name, sys.stdout.buffer)
    sys.stdout.buffer.flush()  # a closed pipe or a full disk shows here, inside the command


@click.command("adapters", cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def adapters(as_json: bool) -> None:
    """List the native trajectory adapters and their format profiles."""
    from pvisor.adapters.native import adapter_names, get_adapter

    rows = []
    for name in adapter_names():
        a = get_adapter(name)
        for p in a.profiles:
            rows.append(
                {
                    "adapter": name,
                    "profile": p.name,
                    "version_from": p.version_from,
                    "verified_with": p.verified_with,
                    "description": a.description,
                }
            )
    if as_json:
        _emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['adapter']:<16}{r['profile']:<22}{r['description']}")
        click.echo(f"{'':<16}version: {r['version_from']}; verified with {r['verified_with']}")


def _read(file: str, agent: str | None, strict: bool, session: str | None, limits: dict):
    from pvisor.adapters.native import read_native
    from pvisor.commands.params import refuse_key_shaped
    from pvisor.journal.paths import plain_path

    if file != "-" and not os.path.lexists(file):
        refuse_key_shaped("FILE", file, "a file")  # a key pasted here is never echoed back
    result, notes = read_native(plain_path(file), agent, session, **limits)
    for note in notes:
        click.echo(one_line(f"pvisor: note: {note}"), err=True)
    for w in result.diagnostics.warnings:  # the file's name and what it held, never raw
        click.echo(one_line(f"pvisor: warning: {file}: {w}"), err=True)
    if strict and result.diagnostics.warnings:
        raise BadInputError(f"{file}: {sum(result.diagnostics.counts.values())} warning(s) and --strict")
    return result, agent or result.agent or notes[0].split(": ", 1)[1]


def stream_limits(f):
    """``--max-input`` and ``--input-timeout``: the bounds of a trajectory read from a stream."""
    f = click.option(
        "--input-timeout",
        type=Seconds(0.001),
        default=None,
        metavar="S",
        help="When FILE is - or a pipe: seconds without a byte before giving up (default 30).",
    )(f)
    return click.option(
        "--max-input", type=Size(1), default=None, metavar="SIZE",
        help="When FILE is - or a pipe: the most it may give (default 1GiB); a larger trajectory is "
             "read as a file.",
    )(f)  # fmt: skip


@click.group("trajectory", cls=Group)
def trajectory() -> None:
    """Read native trajectory files (the files agents write themselves) as steps."""


@trajectory.command("show")
@click.argument("file", type=PathParam(readable=False))
@click.option(
    "--agent", default=None, help="The adapter (see `pvisor adapters`); default: detected from the file."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the trajectory as JSON (schema pvisor.native-trajectory/v1).",
)
@click.option("--strict", is_flag=True, help="Exit 65 when reading gave any warning.")
@click.option(
    "--session",
    default=None,
    metavar="ID",
    help="In an OpenCode store (opencode.db, storage/) of several sessions, read this one (as `opencode "
    "session list` names it); default: the latest root session.",
)
@click.option(
    "--episode",
    default=None,
    metavar="ID",
    help="Show this episode's steps: a subagent's id as the episodes line lists it (default: main).",
)
@stream_limits
@progress_option
def show(
    file: str,
    agent: str | None,
    as_json: bool,
    strict: bool,
    session: str | None,
    episode: str | None,
    max_input: int | None,
    input_timeout: float | None,
) -> None:
    """Show FILE's steps: actions, tool calls, observations, the episodes (the main loop and
    each subagent, with the call that spawned it), and what was left out."""
    from pvisor.adapters.native.render import write_json
    from pvisor.commands.cells import clip, terminal_safe
    from pvisor.replay.episodes import listed

    result, name = _read(
        file, agent, strict, session, {"max_input": max_input, "input_timeout": input_timeout}
    )
    episodes = _episodes(file, result, name, strict)
    if episode is not None:
        result = _episode_result(file, result, name, episodes, episode, strict)
    episodes = listed(episodes)
    if len(episodes) > 1:  # a file without subagents reads as it always did
        result.trajectory.meta["episodes"] = [ep.summary() for ep in episodes]
    if as_json:
        _stream_json(write_json, result, name)
        return
    t = result.trajectory
    click.echo(terminal_safe(f"{file}  adapter={name} profile={result.profile.name} model={t.model or '-'}"))
    click.echo(f"task: {clip(t.task or '-', 100)}")
    click.echo(
        f"system prompt: {'stored' if t.system is not None else 'absent'}; tools: "
        f"{'stored (%d)' % len(t.tools) if t.tools is not None else 'absent'}"
    )
    if len(episodes) > 1:
        click.echo(terminal_safe(f"episodes: {'; '.join(_episode_cell(ep) for ep in episodes)}"))
    if not _stream_table(t.steps):
        click.echo("0 steps")
    click.echo(f"left out: {len(t.left_out)} record(s)")


def _episodes(file: str, result, name: str, strict: bool = False) -> list:
    """The episodes of the file read (:mod:`pvisor.replay.episodes`): the main loop and each
    subagent its adapter lists; only ``main`` for a stream, a directory or a format's file. A
    subagent file that cannot be read is a warning naming it (exit 65 under ``strict``)."""
    from pvisor.adapters.native import adapter_names, get_adapter
    from pvisor.replay.episodes import MAIN, Episode, native_episodes, skipped_files

    t = result.trajectory
    # a stream, a directory (an OpenCode store) or a format read for another agent: one episode
    if not os.path.isfile(file) or name not in adapter_names():
        return [Episode(MAIN, len(t.steps), t.task)]
    if not (t.meta.get("sidechains") or get_adapter(name).subagent_files(plain(file), t.meta)):
        return [Episode(MAIN, len(t.steps), t.task)]
    found = native_episodes(plain(file), name, t)
    skipped = skipped_files(found)
    for w in skipped:
        click.echo(one_line(f"pvisor: warning: {file}: {w}"), err=True)
    if strict and skipped:
        raise BadInputError(f"{one_line(file)}: {len(skipped)} subagent file(s) not read and --strict")
    return found


def _episode_result(file: str, result, name: str, episodes: list, wanted: str, strict: bool = False):
    """The read result of the episode ``wanted``; exit 65 ``unknown_episode`` naming the known ones
    (``bad_source`` for one whose file could not be read); under ``strict`` exit 65 when reading
    its own file gave a warning."""
    from pvisor.replay.episodes import MAIN, choose, read_native_episode

    chosen = choose(episodes, wanted, file)
    if chosen.id == MAIN:
        return result
    sub, _notes = read_native_episode(plain(file), name, chosen)
    for w in sub.diagnostics.warnings:
        click.echo(one_line(f"pvisor: warning: {chosen.path}: {w}"), err=True)
    # the document says whose steps it holds: the episode, with the call that spawned it
    sub.trajectory.meta["episode"] = chosen.summary()
    if strict and sub.diagnostics.warnings:
        count = sum(sub.diagnostics.counts.values())
        raise BadInputError(one_line(f"{chosen.path}: {count} warning(s) and --strict"))
    return sub


def _episode_cell(ep) -> str:
    """``ID (N steps[, spawned by step K call ID TOOL])``."""
    parent = ep.parent()
    by = f", spawned by step {parent['step']} call {parent['call_id']} {parent['tool']}" if parent else ""
    return f"{ep.id} ({ep.steps} step{'' if ep.steps == 1 else 's'}{by})"


def plain(file: str):
    from pvisor.journal.paths import plain_path

    return plain_path(file)


def _row(step) -> list[str]:
    from pvisor.commands.cells import action_cell, clip, observation_cell, terminal_safe

    # cells are one line of at most their column's width (clip escapes control characters)
    return [
        terminal_safe(str(step.n)),
        action_cell(step),
        clip(observation_cell(step), OBSERVATION_WIDTH),
        terminal_safe(",".join(step.flags) or "-"),
    ]


def _stream_table(steps) -> int:
    """Print the steps table (rules in the module docstring), iterating ``steps`` once;
    returns the number of rows (0: nothing printed)."""
    it = iter(steps)
    rows: list[list[str]] = []
    for step in it:
        rows.append(_row(step))
        if len(rows) == TABLE_BUFFER_ROWS:
            break
    if not rows:
        return 0
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    more = len(rows) == TABLE_BUFFER_ROWS and len(steps) > TABLE_BUFFER_ROWS
    if more:
        widths = [max(widths[0], len(str(len(steps)))), ACTION_WIDTH, OBSERVATION_WIDTH, 0]

    def echo(r: list[str]) -> None:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())

    for r in [HEADER, *rows]:
        echo(r)
    count = len(rows)
    del rows
    for step in it:
        echo(_row(step))
        count += 1
    return count


@trajectory.command("export")
@click.argument("file", type=PathParam(readable=False))
@format_option("native", ".", required=True)
@click.option("--agent", default=None, help="The adapter; default: detected from the file.")
@click.option("--strict", is_flag=True, help="Exit 65 when reading gave any warning.")
@click.option(
    "--session",
    default=None,
    metavar="ID",
    help="In an OpenCode store (opencode.db, storage/) of several sessions, read this one (as `opencode "
    "session list` names it); default: the latest root session.",
)
@click.option(
    "--episode",
    default=None,
    metavar="ID",
    help="Export this episode: a subagent's id as `pvisor trajectory show` lists it (default: main).",
)
@click.option(
    "--profile-from",
    default=None,
    metavar="JOURNAL[:RUN]",
    help="rows and parquet: the tools of a capture of the same agent, for a file that stores none.",
)
@click.option(
    "--output",
    "-o",
    type=PathParam(dir_okay=False, allow_dash=True, readable=False),
    default=None,
    help="Write to a file instead of stdout ('-': stdout), as FILE.tmp renamed when whole (mode 0600); "
    "missing directories are created (0700).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --output: print a JSON summary {path, format, count, unit}."
)
@stream_limits
@progress_option
def export(
    file: str,
    fmt: str,
    agent: str | None,
    strict: bool,
    session: str | None,
    episode: str | None,
    profile_from: str | None,
    output: str | None,
    as_json: bool,
    max_input: int | None,
    input_timeout: float | None,
) -> None:
    """Write FILE's trajectory to stdout (or -o FILE) as ATIF v1.7 (exact argument strings in
    `extra`), JSON, or training rows (JSON Lines or Parquet).

    \b
    Examples:
      pvisor trajectory export rollout.jsonl --format atif -o run.atif.json
      pvisor trajectory export rollout.jsonl --format parquet -o rows.parquet --json
    """
    from pvisor.adapters.exports import get_format
    from pvisor.adapters.exports.base import NativeSource, Option, Settings
    from pvisor.commands.exports import listed, readers
    from pvisor.commands.outputs import check_export_path, refuse_reading, write_export, written_summary
    from pvisor.core.errors import UsageError

    form = get_format(fmt)
    if profile_from is not None and Option.PROFILE_FROM not in form.reads:
        raise UsageError(f"--profile-from is for --format {listed(readers('native', Option.PROFILE_FROM))}")
    if output == "-":
        output = None
    if output is not None:
        check_export_path(output, "--output")
        read = [file] if file != "-" else []
        if profile_from is not None:
            from pvisor.replay.profile import parse_profile_spec

            read.append(str(parse_profile_spec(profile_from)[0]))
        refuse_reading(output, "--output", read)
    elif form.binary and is_terminal(sys.stdout):
        raise UsageError(
            f"--format {fmt} writes binary data: give -o FILE.{form.extension}, or redirect stdout"
        )
    settings = Settings(profile_from=profile_from)
    result, name = _read(
        file, agent, strict, session, {"max_input": max_input, "input_timeout": input_timeout}
    )
    if episode is not None:
        result = _episode_result(file, result, name, _episodes(file, result, name, strict), episode, strict)
    if output is None:
        _stream_json(
            lambda result, name, out: form.write(NativeSource(result, name), out, settings), result, name
        )
        return
    n = write_export(
        output, "--output", lambda out: form.write(NativeSource(result, name), out, settings).count
    )
    written_summary(output, fmt, form.unit, n, as_json)
