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

from pvisor.commands.base import Command, one_line
from pvisor.commands.params import RUN_ID, intercept_config, intercept_options
from pvisor.commands.progress import progress_option
from pvisor.core.errors import UsageError
from pvisor.replay.spec import (
    BY_NAME,
    CLI_OPTIONS,
    Kind,
    OptionWarning,
    Refusal,
    ReplayMode,
    ReplaySpec,
    raise_problems,
)

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


#: the click type of each kind of option (:class:`~pvisor.replay.spec.Kind`); None: click's text
_CLICK_TYPES: dict[str, Any] = {
    Kind.RUN: RUN_ID,
    Kind.STEP: _StepNumber(),
    Kind.SECONDS: float,
    Kind.COUNT: int,
}


def spec_options(command: Any) -> Any:
    """The options of ``pvisor replay``, made from :data:`pvisor.replay.spec.CLI_OPTIONS` in
    their order; those of shared decorators (``intercept``: :func:`intercept_options`) by them."""
    return declared_options(CLI_OPTIONS)(command)


def declared_options(options: Any, helps: dict[str, str] | None = None) -> Any:
    """A decorator adding the click options of ``options`` (:class:`~pvisor.replay.spec.Option`
    records, in their order): ``pvisor replay``'s, or a subset of them (``pvisor handoff``),
    ``helps`` giving another help text by option name."""
    return lambda command: _declare(list(options), command, helps or {})


def _declare(options: list[Any], command: Any, helps: dict[str, str]) -> Any:
    for o in reversed(options):
        if o.shared == "intercept" and o.name == "intercept":
            command = intercept_options(command)
        if o.shared is not None:
            continue  # --no-progress: progress_option, on the function itself
        kw: dict[str, Any] = {"help": helps.get(o.name, o.help)}
        if o.kind == Kind.PATHS:  # repeatable; None when not given, as any other option
            kw.update(multiple=True, metavar=o.metavar, callback=lambda _c, _p, v: list(v) or None)
        elif o.kind == Kind.FLAG:
            kw["is_flag"] = True
            if o.toml is not None:
                kw["default"] = None  # "not given": replay.toml's value applies (ReplayConfig.option)
        else:
            kw["default"] = None
            if o.kind == Kind.CHOICE:
                kw["type"] = click.Choice(list(o.choices))
            elif _CLICK_TYPES.get(o.kind) is not None:
                kw["type"] = _CLICK_TYPES[o.kind]
            if o.metavar is not None:
                kw["metavar"] = o.metavar
        command = click.option(o.flag, o.name, **kw)(command)
    return command


@click.command("replay", cls=Command)
@spec_options
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
    if flags["result"] is not None and flags["result"] != "-":
        raise UsageError(
            f"--result {flags['result']}: only '-' (stdout) is supported; result.json is always written into "
            "--output"
        )
    if flags["batch"] is not None or flags["rows"] is not None or flags["ray"] is not None:
        _batch(ctx, flags)
        return
    if flags["concurrency"] is not None:
        raise UsageError("--concurrency is for --batch MANIFEST (rollouts at once)")
    spec = _merged(flags)
    problems = spec.check()
    if spec.mode is None or any(spec[name] is None for name in ("agent", "after_step", "output")):
        raise_problems(problems)  # no mode to check the rest against
    journal = spec["journal"] or (ctx.obj.get("journal") if ctx.obj else None)
    if spec.mode is not ReplayMode.PREPARE_ONLY:
        _replay_agent(spec, journal, problems)
        return
    from pvisor.replay.prepare import PrepareOptions, prepare

    found = len(problems)
    paths = {name: _collected(problems, _path, BY_NAME[name].flag, spec[name]) for name in _PATHS}
    if len(problems) > found:
        raise_problems(problems)  # an empty path: the checks of the records would misread its None
    # (option_notes is no option: the options' own warnings, found by _merged)
    opts = PrepareOptions(
        **spec.fields(
            n for n in PrepareOptions.__slots__ if n in BY_NAME and n not in paths and n != "journal"
        ),
        **paths,
        journal=journal if journal and spec["run"] is not None else None,
        option_notes=spec["option_notes"] or (),
    )
    # (a workspace_changed is the outcome's error: exit 1 through the error path)
    report_outcome(lambda: prepare(opts, problems), spec["result"])


#: the options that name a file or directory (the records take them checked: :func:`_path`)
_PATHS = ("output", "trajectory", "workspace")


def _collected(problems: list[Any], check: Any, *args: Any) -> Any:
    """``check(*args)``, or None with its usage error added to ``problems``."""
    from pvisor.core.errors import PvisorError

    try:
        return check(*args)
    except PvisorError as exc:
        problems.append(exc)
        return None


#: the options a batch takes from each manifest line (under their replay.toml key), never from the
#: command line
_PER_LINE = (
    "agent", "trajectory", "run", "after_step", "workspace", "protocol", "profile_from", "session", "episode",
)  # fmt: skip


def _batch(ctx: click.Context, flags: dict[str, Any]) -> None:
    """``--prepare-only --batch MANIFEST (--output OUT | --rows FILE)``: replay/batch.py.
    Exit 0 when every line was prepared, 1 when some were not (each named on stderr)."""
    if flags["batch"] is None:
        which = "--rows" if flags["rows"] is not None else "--ray"
        raise UsageError(f"{which} is for --batch MANIFEST (a row per manifest line)")
    if flags["prepare_only"] and flags["replay_only"]:
        raise UsageError("--batch takes one of --prepare-only and --replay-only (the lines' default mode)")
    if not flags["prepare_only"]:
        _rollout_batch(ctx, flags)
        return
    if flags["concurrency"] is not None:
        raise UsageError("--concurrency is for a --batch of rollouts (--prepare-only runs in one process)")
    for name in _PER_LINE:
        if flags[name] is not None:
            raise UsageError(f"{BY_NAME[name].flag} comes from each line of --batch (the key {name!r})")
    for o in CLI_OPTIONS:
        # what prepare-only refuses (a batch is many prepare-only), and --config and --result
        refused = ReplayMode.PREPARE_ONLY not in o.modes and o.refusal != Refusal.IGNORED and o.shared is None
        if (refused or o.name in ("config", "result")) and flags[o.name] is not None:
            raise UsageError("--batch takes --output or --rows, --journal, --force and --allow-damaged only")
    if (flags["output"] is None) == (flags["rows"] is None):
        raise UsageError("--batch needs one of --output OUT (a directory per line) or --rows FILE")
    if flags["ray"] is not None and flags["rows"] is None:
        raise UsageError(
            "--ray writes rows: give --rows FILE (the workers may not share this machine's disk)"
        )
    for opt, key in (("--batch", "batch"), ("--rows", "rows")):
        if flags[key] == "":
            raise UsageError(f'{opt} "": an empty path, expected a file')
    manifest = _as_path(_path("--batch", flags["batch"]))
    output = _as_path(_path("--output", flags["output"]))
    rows = _as_path(_path("--rows", flags["rows"]))
    journal = flags["journal"] or (ctx.obj.get("journal") if ctx.obj else None)
    from pvisor.commands.batch import run_batch

    failed = run_batch(
        manifest,
        output=output,
        rows=rows,
        journal=_as_path(journal) if journal else None,
        force=bool(flags["force"]),
        allow_damaged=bool(flags["allow_damaged"]),
        ray_address=flags["ray"],
    )
    if failed:
        ctx.exit(1)


#: what a --batch of rollouts takes on the command line; each line gives the rest
_ROLLOUT_FLAGS = frozenset(
    {"batch", "output", "rows", "journal", "force", "replay_only", "concurrency", "ray"}
)


def _rollout_batch(ctx: click.Context, flags: dict[str, Any]) -> None:
    """``--batch MANIFEST (--output OUT | --rows FILE) [--concurrency K | --ray ADDRESS]
    [--replay-only]`` without --prepare-only: rollouts (pvisor/commands/rollouts.py; on Ray,
    pvisor/session/ray_rollouts.py). Exit 0 when every line's
    rollout was ok, 1 when some were not (each named on stderr)."""
    for o in CLI_OPTIONS:
        if o.name in _ROLLOUT_FLAGS or o.shared == "progress" or flags[o.name] in (None, False):
            continue
        if o.name in _PER_LINE or o.toml is not None or o.name in ("entrypoint", "model"):
            key = o.toml or o.name
            raise UsageError(f"{o.flag} comes from each line of --batch (the key {key!r})")
        raise UsageError(
            "--batch of rollouts takes --output or --rows, --journal, --force, --replay-only, "
            "--concurrency and --ray only"
        )
    if flags["ray"] is not None and flags["concurrency"] is not None:
        raise UsageError(
            "--concurrency is for rollouts here: on --ray each rollout takes one CPU of the cluster"
        )
    if flags["ray"] == "":
        raise UsageError('--ray "": give an address (local, auto or ray://HOST:10001)')
    if (flags["output"] is None) == (flags["rows"] is None):
        raise UsageError("--batch needs one of --output OUT (a directory per line) or --rows FILE")
    for opt, key in (("--batch", "batch"), ("--rows", "rows")):
        if flags[key] == "":
            raise UsageError(f'{opt} "": an empty path, expected a file')
    from pvisor.commands.rollouts import run_rollout_batch
    from pvisor.replay.rollout_manifest import RolloutMode

    journal = flags["journal"] or (ctx.obj.get("journal") if ctx.obj else None)
    failed = run_rollout_batch(
        _as_path(_path("--batch", flags["batch"])),
        output=_as_path(_path("--output", flags["output"])),
        rows=_as_path(_path("--rows", flags["rows"])),
        journal=_as_path(journal) if journal else None,
        force=bool(flags["force"]),
        default_mode=RolloutMode.REPLAY_ONLY if flags["replay_only"] else RolloutMode.CONTINUATION,
        concurrency=flags["concurrency"] if flags["concurrency"] is not None else 2,
        ray_address=flags["ray"],
    )
    if failed:
        ctx.exit(1)


def _merged(flags: dict[str, Any]) -> ReplaySpec:
    """The options: each flag, else the --config file's value (top level, then for entrypoint
    and model the agent's table); the file's ``mode`` sets the mode flags no flag set. Adds
    ``agent_env`` and ``agent_args`` (the agent's table). The keys are those of
    :data:`~pvisor.replay.spec.TOML_OPTIONS`."""
    o = dict(flags)
    o["agent_env"], o["agent_args"] = {}, []
    # given on the command line (a shared flag's empty value is as good as none, as it always was)
    given = [n for n, v in flags.items() if v is not None and v is not False and (v or not BY_NAME[n].shared)]
    path = flags["config"]
    if path is None:
        return ReplaySpec(o, given, _mode(o))
    if path == "":
        raise UsageError('--config "": an empty path')
    from pvisor.replay.config import load_config
    from pvisor.replay.spec import TOML_OPTIONS  # made when first read: only a --config reads it

    cfg = load_config(path)
    for opt in TOML_OPTIONS:
        if opt.name in flags:
            o[opt.name] = cfg.option(opt.toml, flags[opt.name])
    if not (flags["prepare_only"] or flags["replay_only"]):
        mode = cfg.option("mode", None)
        mode = getattr(mode, "value", mode)
        o["prepare_only"] = mode == ReplayMode.PREPARE_ONLY.value
        o["replay_only"] = mode == ReplayMode.REPLAY_ONLY.value
    if o["agent"] is not None:
        settings = cfg.settings(o["agent"])
        o["entrypoint"] = flags["entrypoint"] if flags["entrypoint"] is not None else settings.entrypoint
        o["model"] = flags["model"] if flags["model"] is not None else settings.model
        o["agent_env"], o["agent_args"] = dict(settings.environment), list(settings.arguments)
    for name in ("output", "workspace", "trajectory", "journal"):
        if o[name] is not None and not isinstance(o[name], str):
            o[name] = str(o[name])
    if o["reasoning"] is not None and not isinstance(o["reasoning"], str):
        o["reasoning"] = o["reasoning"].value
    if o["prepare_only"] or o["replay_only"]:
        _warn_ignored(o, flags, path)
    return ReplaySpec(o, given, _mode(o))


def _warn_ignored(o: dict[str, Any], flags: dict[str, Any], path: Any) -> None:
    """replay.toml's keys the mode of ``o`` (prepare-only or replay-only) has no use for
    (:attr:`Refusal.WARNED` options whose modes leave it out; not given on the command line,
    where they are usage errors): dropped from ``o``, with one warning line on stderr and the
    same in ``o["option_notes"]`` (result.json's first warning, ``options_ignored``). The
    continuation's own keys are said as before; those replay-only takes too (``no_restore``,
    ``env_from``) are said apart."""
    from pvisor.replay.spec import TOML_OPTIONS  # made when first read: only a --config reads it

    mode = ReplayMode.PREPARE_ONLY if o["prepare_only"] else ReplayMode.REPLAY_ONLY
    warned = [opt for opt in TOML_OPTIONS if opt.refusal == Refusal.WARNED and mode not in opt.modes]
    warned.sort(key=lambda opt: CLI_OPTIONS.index(opt))
    # (a key at its default changes nothing: replay.toml's template lists no_restore = false)
    ignored = [
        opt
        for opt in warned
        if flags[opt.name] is None
        and o[opt.name] is not None
        and (ReplayMode.REPLAY_ONLY not in opt.modes or o[opt.name] != opt.default)
    ]
    if not ignored:
        return
    live = [opt.toml for opt in ignored if ReplayMode.REPLAY_ONLY not in opt.modes]
    agent = [opt.toml for opt in ignored if ReplayMode.REPLAY_ONLY in opt.modes]
    parts = [f"{', '.join(live)} are for a continuation"] if live else []
    if agent:
        parts.append(f"{', '.join(agent)} are for replay-only and a continuation")
    said = f"{path}: {'; '.join(parts)}; --{mode.value} ignores them"
    _note(f"pvisor: warning: {said}")
    # and in result.json, first of its warnings (report_outcome does not print it again)
    o["option_notes"] = [(OptionWarning.OPTIONS_IGNORED.value, said)]
    for opt in warned:
        if flags[opt.name] is None:
            o[opt.name] = None


def _mode(o: dict[str, Any]) -> ReplayMode | None:
    """The mode of the merged options; None for two at once (a usage error)."""
    if o["prepare_only"] and o["replay_only"]:
        return None
    if o["prepare_only"]:
        return ReplayMode.PREPARE_ONLY
    return ReplayMode.REPLAY_ONLY if o["replay_only"] else ReplayMode.CONTINUE


def report_outcome(replay: Any, result_to: str | None) -> None:
    """Run ``replay()`` (an outcome with ``result``, ``error`` and ``summary()``) and tell how
    it went: warnings and the summary line (control characters of the paths it names escaped,
    as every message escapes them: ``--output 'o\x1b[2J'`` must not clear the terminal); with
    ``--result -`` the document on stdout, also the failed one beside an error (stdout stays
    one JSON value) and the summary on stderr; after the summary (or before the error) the line
    of the agent's sandbox, when an agent ran; the error is then raised."""
    from pvisor.replay.result import dump_result

    outcome = replay()
    # where the agent ran and what its sandbox stopped (None: it did not run; prepare-only's
    # outcome runs none): a stopped call shows only as an observation that differs otherwise
    boxed = outcome.sandbox_line() if hasattr(outcome, "sandbox_line") else None
    if outcome.error is not None:
        if result_to == "-":
            sys.stdout.buffer.write(dump_result(outcome.result))
            sys.stdout.buffer.flush()
        if boxed:
            _note(one_line(boxed))
        raise outcome.error
    for w in outcome.result["warnings"]:
        if w["code"] != OptionWarning.OPTIONS_IGNORED.value:  # printed when the options were read
            _note(f"pvisor: warning: {one_line(w['message'])}")
    if result_to == "-":
        sys.stdout.buffer.write(dump_result(outcome.result))
        sys.stdout.buffer.flush()
        _note(one_line(outcome.summary()))
        if boxed:
            _note(one_line(boxed))
    else:
        click.echo(one_line(outcome.summary()))
        if boxed:
            click.echo(one_line(boxed))


def _replay_agent(spec: ReplaySpec, journal: str | None, problems: list[Any]) -> None:
    from pvisor.session.replay import ReplayOptions, continue_replay, replay_only

    import dataclasses
    import gc

    # the fast-exit path turned it off; a replay runs an agent for minutes (what the imports
    # made stays out of its collections: pvisor/entry.py)
    gc.freeze()
    gc.enable()
    if journal is None:
        from pvisor.journal.paths import default_journal_path

        journal = str(default_journal_path())
    found = len(problems)
    paths = {name: _as_path(_collected(problems, _path, BY_NAME[name].flag, spec[name])) for name in _PATHS}
    intercept = _collected(
        problems, intercept_config, bool(spec["intercept"]), spec["confdir"], spec["mitmdump"]
    )
    if len(problems) > found:
        raise_problems(problems)  # an empty path: the checks of the records would misread its None
    fields = [f.name for f in dataclasses.fields(ReplayOptions) if f.name in BY_NAME and f.name not in paths]
    opts = ReplayOptions(
        **spec.fields(n for n in fields if n not in ("journal", "intercept")),
        **paths,
        journal=_as_path(journal),
        intercept=intercept,
        option_notes=list(spec["option_notes"] or ()),
    )
    run = continue_replay if spec.mode is ReplayMode.CONTINUE else replay_only
    report_outcome(lambda: run(opts, lambda m: _note(f"pvisor: warning: {m}"), problems), spec["result"])


def _note(line: str) -> None:
    """A line for people on stderr. The three files are written by now: stderr that cannot be
    written (``2>/dev/full``) does not make the command fail with another error's code; the
    CLI's final flush still reports it (exit 74)."""
    try:
        click.echo(line, err=True)
    except OSError:
        pass
