"""The ``pvisor`` command line: a thin click layer over the library.

Subcommands are loaded lazily (click's "lazily loading subcommands" pattern), so a command
imports only what it uses. Errors a user can cause end as ``pvisor: error: ...`` on stderr with
the exit code of :mod:`pvisor.core.errors`, never a traceback.
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
import sys

import click

from pvisor._version import __version__
from pvisor.commands.base import Group, PathParam, one_line

#: command name -> ("module:attribute", one-line help shown by ``pvisor --help``)
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("pvisor.commands.demo:demo", "Run the capture path offline in seconds and show the journal."),
    "journal": ("pvisor.commands.journal:journal", "Inspect, export and verify the Event Journal."),
    "gateway": ("pvisor.commands.serve:gateway", "Run the capture gateway in front of a model API."),
    "serve-model": ("pvisor.commands.serve:serve_model", "Serve a scripted model offline (four protocols)."),
    "run": ("pvisor.commands.run:run", "Run an agent CLI headless behind the gateway and record it."),
    "env": ("pvisor.commands.env:env", "Print what points your own agent session at a running gateway."),
    "ca": ("pvisor.commands.ca:ca", "The CA intercept mode's proxy signs with (pvisor ca path)."),
    "adapters": (
        "pvisor.commands.trajectory:adapters",
        "List the native trajectory adapters and their format profiles.",
    ),
    "trajectory": (
        "pvisor.commands.trajectory:trajectory",
        "Read an agent's native trajectory file as steps; export ATIF.",
    ),
    "report": (
        "pvisor.commands.report:report",
        "Write a run as one HTML page: steps, exchanges, O against O'.",
    ),
    "diff": (
        "pvisor.commands.diff:diff",
        "Where two requests, runs or attempts part, and what it costs in cache.",
    ),
    "view": (
        "pvisor.commands.view:view",
        "What the agent saw at a pause (an observer view, JSON): --step K (transition K, from 0), "
        "--after-step N.",
    ),
    "snapshot": (
        "pvisor.commands.snapshot:snapshot",
        "List a run's workspace snapshots; restore the workspace at --step K (a transition) or "
        "--after-step N.",
    ),
    "replay": (
        "pvisor.commands.replay:replay",
        "Rebuild the request that ends at step N's observation; re-run the agent to step N (--replay-only).",
    ),
    "handoff": (
        "pvisor.commands.handoff:handoff",
        "Hand a run over to the next agent at a pause: its history re-run as that agent's own actions.",
    ),
}

EXAMPLES = """
\b
Examples:
  pvisor demo                               offline demo: gateway, scripted model, one tool call
  pvisor gateway --port 0 --upstream anthropic=https://api.anthropic.com
  pvisor run --agent claude-code -- "make the failing test pass"
  pvisor env --agent codex --gateway http://127.0.0.1:8787 --run codex-1
  pvisor gateway --mode intercept --port 8080   a forward proxy for HTTPS_PROXY (ca path: its CA)
  pvisor journal ls                         runs in the journal
  pvisor journal show r-3f2a9c0d1e2b        exchanges of one run
  pvisor journal body x-0123 --response     the reassembled reply of an exchange
  pvisor journal export --format jsonl > all.jsonl
  pvisor report r-3f2a9c0d1e2b --open          a run as one HTML page
  pvisor snapshot restore r-3f2a9c0d1e2b --step 1 --into ws-1   after transition 1 (step 2)
  pvisor view r-3f2a9c0d1e2b --step 0 --output runs/pause.json   what the agent saw then
  pvisor trajectory show ~/.claude/projects/-src-app/SESSION.jsonl
  pvisor trajectory export rollout.jsonl --format atif > run.atif.json
  pvisor --journal ./j.sqlite journal verify

\b
Exit codes: 0 ok, 1 replay failed or the agent failed by its own account,
2 usage, 3 integrity error, 65 bad input data,
69 unavailable service, 74 output cannot be written, 124 timeout,
130 interrupted (Ctrl-C; run: 129 SIGHUP, 143 SIGTERM),
141 output pipe closed (docs/cli.md).
"""


class PipeClosed(Exception):
    """stdout's reader went away (``| head``). Click turns a BrokenPipeError into exit 1 on
    its own; raised instead of it, this reaches :func:`main`, which exits 141 quietly."""


class LazyGroup(Group):
    """A group whose subcommands are imported when first used."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # --version --json / --verify (in any order): the build's identity (core/artifact.py);
        # plain --version stays click's
        lead = []  # the options before the command (a command's own arguments are its own)
        for arg in args:
            if not arg.startswith("-") or arg == "--":
                break
            lead.append(arg)
        if "--version" in lead and set(lead) & VERSION_FLAGS:
            others = [a for a in args if a != "--version" and a not in VERSION_FLAGS]
            if others:
                from pvisor.core.errors import UsageError

                raise UsageError(
                    f"--version takes only --json and --verify beside it, not {' '.join(others)}"
                )
            _version(json_out="--json" in args, verify="--verify" in args)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            if name in _FAST_EXIT and _state["entry"]:
                # a short-lived process that ends with os._exit (:func:`_exit`): the cyclic
                # collector would only rescan the objects its imports create
                gc.disable()
            module_name, attr = self.lazy[name][0].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            if _state["entry"] and name not in _FAST_EXIT:
                # the entry point imported with the collector off (pvisor/entry.py): what the
                # imports made stays out of every later collection, and it is on again
                gc.freeze()
                gc.enable()
            return command
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise PipeClosed() from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # help text from the table, so that --help imports no subcommand
        rows = [(name, self.lazy[name][1]) for name in sorted(self.lazy)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


#: what may follow --version (docs/install.md "Which build produced a result")
VERSION_FLAGS = frozenset({"--json", "--verify"})


def _version(json_out: bool, verify: bool) -> None:
    """``--version --json``: the build's identity as one JSON object on stdout; ``--verify``:
    every file of a bundle checked against its manifest, exit 0 when they agree, else 3
    (IntegrityError) with one line per difference; outside a bundle exit 2."""
    import orjson

    from pvisor.core import artifact
    from pvisor.core.errors import IntegrityError, UsageError

    problems: list[str] = []
    if verify:
        try:
            problems = artifact.verify()
        except artifact.ArtifactError as exc:
            raise (UsageError if not artifact.frozen() else IntegrityError)(str(exc)) from None
    if json_out:
        from pvisor._version import DISTRIBUTION, source_commit

        out = artifact.identity(__version__, distribution=DISTRIBUTION, commit=source_commit())
        if verify:
            out["verified"] = not problems
            out["problems"] = problems
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    elif not problems:  # --verify alone
        click.echo(
            f"pvisor {__version__}: every file of {os.path.dirname(artifact.manifest_path())} matches "
            "its manifest"
        )
    if verify and problems:
        for line in problems:
            click.echo(f"pvisor: {line}", err=True)
        raise IntegrityError(
            f"the build at {os.path.dirname(artifact.manifest_path())} differs from its manifest "
            f"in {len(problems)} file(s)"
        )
    raise click.exceptions.Exit(0)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version`` alone: ``pvisor VERSION (DISTRIBUTION, commit C)`` (click's version_option,
    whose help text would go through gettext: pvisor/commands/base.py)."""
    if value and not ctx.resilient_parsing:
        from pvisor._version import version_line

        click.echo(version_line(), color=ctx.color)
        ctx.exit()


def _default_journal() -> str:
    from pvisor.journal.paths import default_journal_name

    return default_journal_name()


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
    epilog=EXAMPLES,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--version",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_print_version,
    help="Show the version and exit. --version --json: the build's identity (version, commit, "
    "executable and manifest sha256); --version --verify: check a bundle's files against its manifest.",
)
@click.option(
    "--journal",
    "journal_path",
    type=PathParam(),
    envvar="PVISOR_JOURNAL",
    default=None,
    help="Event Journal file. Default: $PVISOR_JOURNAL, else $XDG_DATA_HOME/pvisor/journal.sqlite.",
)
@click.pass_context
def cli(ctx: click.Context, journal_path: str | None) -> None:
    """pvisor: capture coding-agent model exchanges into an Event Journal, and replay runs step-exactly."""
    from pvisor.core.errors import UsageError

    ctx.ensure_object(dict)
    if journal_path == "":
        raise UsageError(
            "--journal is empty: give the journal file's path (or leave --journal out for the default)"
        )
    from pvisor.journal.paths import plain_path

    path = plain_path(journal_path or _default_journal())  # as a Path would read it: j.sqlite/ is j.sqlite
    if os.path.isdir(path):
        raise UsageError(f"--journal {path} is a directory, expected a journal file")
    if os.path.exists(path) and not os.path.isfile(path):
        # a FIFO or a device: SQLite would block on it or read garbage
        raise UsageError(f"--journal {path} is not a regular file, expected a journal file")
    ctx.obj["journal"] = path
    _state["journal"] = path
    _state["fast_exit"] = bool(_state["entry"]) and ctx.invoked_subcommand in _FAST_EXIT


#: what the error handling of :func:`main` needs to know: the journal in use; whether this
#: process was started as the ``pvisor`` command (``main()`` without argv); whether it may end
#: without the interpreter's teardown (:func:`_exit`)
_state: dict[str, object] = {"journal": None, "entry": False, "fast_exit": False}

#: commands whose process ends with ``os._exit`` once their output is flushed (:func:`_exit`):
#: they leave no thread, no open journal to write back, no unflushed file. The interpreter's
#: teardown (freeing every imported module) is a sixth of a ``replay --prepare-only`` run.
_FAST_EXIT = frozenset({"replay"})


def _exit(code: int) -> None:
    """``sys.exit(code)``; for a command of :data:`_FAST_EXIT` run as the ``pvisor`` process,
    flush stdout and stderr, run the ``atexit`` handlers (a spooled input's temporary file is
    removed by one) and end with ``os._exit(code)``. A flush that fails takes the usual way
    (``sys.exit``, whose final flush reports it)."""
    if _state["fast_exit"]:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            sys.exit(code)
        import atexit

        atexit._run_exitfuncs()
        os._exit(code)
    sys.exit(code)


#: errno values of a write that failed for want of room or a working device
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _database_error_code(exc: Exception) -> int | None:
    """Exit code for an SQLite error that escaped the library: 69 when the journal is locked,
    3 for damage; None for anything else (a bug, which keeps its traceback)."""
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is None or not isinstance(exc, sqlite3.DatabaseError):
        return None
    from pvisor.core.errors import EXIT_INTEGRITY, EXIT_UNAVAILABLE

    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return EXIT_UNAVAILABLE
    return EXIT_INTEGRITY


def _reserve_std_fds() -> bool:
    """Open /dev/null on a closed fd 0, 1 or 2 (``pvisor ... >&-``), so no file this process
    opens later (a journal, a socket) becomes its stdout. Returns False when stdout was
    closed: there is nowhere to write the output (exit 74)."""
    ok = True
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            if fd == 1:
                ok = False
            try:
                got = os.open(os.devnull, os.O_RDWR)
                if got != fd:
                    os.dup2(got, fd)
                    os.close(got)
            except OSError:
                pass
    return ok


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``pvisor`` script. Maps PvisorError to its exit code; exit 74 at
    once when stdout is closed."""
    from pvisor.core.errors import PvisorError

    _state["entry"], _state["fast_exit"] = argv is None, False
    if sys.stdout is None or not _reserve_std_fds():
        from pvisor.core.errors import EXIT_IOERR

        sys.stdout = open(os.devnull, "w")
        if sys.stderr is not None:
            sys.stderr.write("pvisor: error: cannot write output: stdout is closed\n")
        sys.exit(EXIT_IOERR)
    try:
        # standalone_mode=False: click returns ctx.exit()'s code instead of exiting
        rv = cli.main(args=argv, prog_name="pvisor", standalone_mode=False)
        sys.stdout.flush()  # a write error of the last output shows here, not at exit
    except click.exceptions.Exit as exc:
        try:
            sys.stdout.flush()
        except OSError:
            _silence_stdout()  # the command's own exit code says how it ended (journal verify: 3)
        _exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("pvisor: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        no_command = getattr(click.exceptions, "NoArgsIsHelpError", ())
        if isinstance(exc, no_command) and exc.ctx is not None:
            # a group with no command (pvisor, pvisor journal): its help, as --help shows it, on
            # stderr with click's exit 2 (click 8.2 and newer raise this; before, the help came
            # as a plain exit)
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(exc.exit_code)
        # click's own usage errors (bad choice, bad value, unknown option) as one line like ours
        where = exc.ctx.command_path if exc.ctx is not None else "pvisor"
        message = " ".join(exc.format_message().split()).rstrip(
            "."
        )  # one line: click lists choices on several
        click.echo(f"pvisor: error: {message} (see '{where} --help')", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except PvisorError as exc:
        for line in exc.lines():
            click.echo(f"pvisor: error: {one_line(line)}", err=True)
        _exit(exc.exit_code)
    except (BrokenPipeError, PipeClosed):
        # output piped into a pager or head that closed early: quietly, as a tool killed by SIGPIPE
        from pvisor.core.errors import EXIT_BROKEN_PIPE

        _silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    except KeyboardInterrupt:
        sys.exit(130)
    except FileNotFoundError:
        from pvisor.journal.paths import CWD_GONE_HINT, cwd_gone

        if not cwd_gone():
            raise
        # a relative path met a deleted working directory where no command said which path
        click.echo(f"pvisor: error: {CWD_GONE_HINT}", err=True)
        sys.exit(2)
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        from pvisor.core.errors import EXIT_IOERR

        what = exc.filename if exc.filename is not None else "output"
        _silence_stdout()
        click.echo(f"pvisor: error: cannot write {what}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_IOERR)
    except Exception as exc:
        code = _database_error_code(exc)
        if code is None:
            raise
        from pvisor.journal.paths import CWD_GONE_HINT, cwd_gone

        if cwd_gone() and not os.path.isabs(str(_state["journal"] or "")):
            click.echo(
                f"pvisor: error: journal {_state['journal']}: a relative path, but {CWD_GONE_HINT}", err=True
            )
            sys.exit(2)
        where = f"journal {_state['journal']}: " if _state["journal"] else "journal "
        click.echo(f"pvisor: error: {where}database error: {exc}", err=True)
        sys.exit(code)
    _exit(rv if isinstance(rv, int) else 0)
