"""The ``pvisor`` command line: a thin click layer over the library.

Subcommands are loaded lazily (click's "lazily loading subcommands" pattern), so a command
imports only what it uses. Errors a user can cause end as ``pvisor: error: ...`` on stderr with
the exit code of :mod:`pvisor.journal.errors`, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from pvisor._version import __version__

#: command name -> ("module:attribute", one-line help shown by ``pvisor --help``)
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("pvisor.commands.demo:demo", "Run the capture path offline in seconds and show the journal."),
    "journal": ("pvisor.commands.journal:journal", "Inspect, export and verify the Event Journal."),
    "gateway": ("pvisor.commands.serve:gateway", "Run the capture gateway in front of a model API."),
    "serve-model": ("pvisor.commands.serve:serve_model", "Serve a scripted model offline (four protocols)."),
}

EXAMPLES = """
\b
Examples:
  pvisor demo                               offline demo: gateway, scripted model, one tool call
  pvisor gateway --port 0 --upstream anthropic=https://api.anthropic.com
  pvisor journal ls                         runs in the journal
  pvisor journal show r-3f2a9c0d1e2b        exchanges of one run
  pvisor journal body x-0123 --response     the reassembled reply of an exchange
  pvisor journal export --format jsonl > all.jsonl
  pvisor --journal ./j.sqlite journal verify

\b
Exit codes: 0 ok, 2 usage, 3 integrity error, 65 bad input data,
69 unavailable service, 124 timeout, 130 interrupted (Ctrl-C) (docs/cli.md).
"""


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first used."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module_name, attr = self.lazy[name][0].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # help text from the table, so that --help imports no subcommand
        rows = [(name, self.lazy[name][1]) for name in sorted(self.lazy)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _default_journal() -> str:
    from pvisor.journal.paths import default_journal_path

    return str(default_journal_path())


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="pvisor", message="%(prog)s %(version)s")
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False),
    envvar="PVISOR_JOURNAL",
    default=None,
    help="Event Journal file. Default: $PVISOR_JOURNAL, else $XDG_DATA_HOME/pvisor/journal.sqlite.",
)
@click.pass_context
def cli(ctx: click.Context, journal_path: str | None) -> None:
    """pvisor: capture coding-agent model exchanges into an Event Journal, and replay runs step-exactly."""
    ctx.ensure_object(dict)
    ctx.obj["journal"] = journal_path or _default_journal()


def _database_error_code(exc: Exception) -> int | None:
    """Exit code for an SQLite error that escaped the library: 69 when the journal is locked,
    3 for damage; None for anything else (a bug, which keeps its traceback)."""
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is None or not isinstance(exc, sqlite3.DatabaseError):
        return None
    from pvisor.journal.errors import EXIT_INTEGRITY, EXIT_UNAVAILABLE

    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return EXIT_UNAVAILABLE
    return EXIT_INTEGRITY


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``pvisor`` script. Maps PvisorError to its exit code."""
    from pvisor.journal.errors import PvisorError

    try:
        # standalone_mode=False: click returns ctx.exit()'s code instead of exiting
        rv = cli.main(args=argv, prog_name="pvisor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("pvisor: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except PvisorError as exc:
        click.echo(f"pvisor: error: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        # output piped into a pager or head that closed early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        code = _database_error_code(exc)
        if code is None:
            raise
        click.echo(f"pvisor: error: journal database error: {exc}", err=True)
        sys.exit(code)
    sys.exit(rv if isinstance(rv, int) else 0)
