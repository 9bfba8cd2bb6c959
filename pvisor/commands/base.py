"""The click pieces every pvisor command is built from, without click's translation lookup.

click passes the text of its own help option (``--help``), of ``version_option`` and the name of
each ``click.Path`` through :func:`gettext.gettext` when a command is defined or parsed; the
first such call imports :mod:`locale` (its tables of locale aliases) to work out the languages
to look for: 4.2 million instructions, 2.4 % of the stack floor ``python -c 'import click,
orjson'`` and the largest single module of a short command's start (docs/benchmarks.md,
"Replay prepare-only: fidelity and startup"). pvisor has no translations, so its commands use:

- :class:`Command` and :class:`Group`: click's, whose help option (:meth:`get_help_option`, the
  public method click asks) is made here with its text as written. A :class:`Group`'s
  subcommands and subgroups are of these classes too (``command_class``, ``group_class``);
  ``@click.command(..., cls=Command)`` for a command defined on its own.
- :class:`PathParam` for ``click.Path``: a path as ``str`` (or ``path_type``), checked as
  click.Path checks it (``exists``, ``file_okay``, ``dir_okay``, ``readable``; ``-`` with
  ``allow_dash``), named in help as ``PATH``, ``FILE`` or ``DIRECTORY`` as click names it.

The messages of errors still go through click's own text (and its gettext): only a command line
in error pays for it. ``tests/test_startup_imports.py`` checks that the short commands do not
load :mod:`locale`; ``tests/test_cli.py`` that every command of the tree is of these classes.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable

import click

#: the help option's text (click's own, as it reads untranslated)
HELP_TEXT = "Show this message and exit."


def _show_help(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


class _OwnHelp:
    """:meth:`get_help_option` without click's translated text: the same eager flag, under the
    context's help option names, made once per command (click relies on the same object each
    time it orders the parameters)."""

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        names = self.get_help_option_names(ctx)  # type: ignore[attr-defined]
        if not names or not self.add_help_option:  # type: ignore[attr-defined]
            return None
        made = self.__dict__.get("_pvisor_help_option")  # (names, option)
        if made is None or made[0] != tuple(names):
            option = click.Option(
                [*names, "pvisor_help"],
                is_flag=True,
                is_eager=True,
                expose_value=False,
                callback=_show_help,
                help=HELP_TEXT,
            )
            made = self.__dict__["_pvisor_help_option"] = (tuple(names), option)
        return made[1]


class Command(_OwnHelp, click.Command):
    """A click command whose help option carries no translation lookup (module docstring)."""


class Group(_OwnHelp, click.Group):
    """A click group whose help option carries no translation lookup, and whose subcommands and
    subgroups are :class:`Command` and :class:`Group` (module docstring)."""

    command_class = Command
    group_class = type  # subgroups are of the class of the group that makes them


def one_line(text: object) -> str:
    """``text`` (a string, or what ``str`` makes of it: a path, a warning object) with control
    and format characters (newline, ESC, U+202E) escaped, so that a message naming a file or
    value stays one line and prints as written: ``\\n``, ``\\x1b``, ``\\u202e``; a byte that
    was not UTF-8 (held as a surrogate escape, U+DC80 to U+DCFF, as :func:`os.fsdecode` gives
    it) as the byte it was, ``\\xff``."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    if "\udc80" <= c <= "\udcff":
        return f"\\x{ord(c) - 0xDC00:02x}"
    return c.encode("unicode_escape").decode("ascii")


class PathParam(click.ParamType):
    """``click.Path(exists, file_okay, dir_okay, allow_dash, path_type, readable)`` without its
    translated name (module docstring). The value is the path as given (``str``;
    ``path_type(value)`` when given). When the path exists it must be readable (unless
    ``readable`` is False: an output, or an input whose reader names the system's reason), and a
    file where ``file_okay`` is False or a directory where ``dir_okay`` is False is refused; when
    it does not, only ``exists=True`` refuses it. Errors are click's BadParameter: ``Invalid
    value for '--x': ...`` (exit 2)."""

    def __init__(
        self,
        exists: bool = False,
        file_okay: bool = True,
        dir_okay: bool = True,
        allow_dash: bool = False,
        path_type: Callable[[str], Any] | None = None,
        readable: bool = True,
    ) -> None:
        self.exists = exists
        self.readable = readable
        self.file_okay = file_okay
        self.dir_okay = dir_okay
        self.allow_dash = allow_dash
        self.path_type = path_type
        # click.Path's names: a metavar of PATH, FILE or DIRECTORY in help
        self.name = "file" if not dir_okay else "directory" if not file_okay else "path"

    def to_info_dict(self) -> dict[str, Any]:
        info = super().to_info_dict()
        info.update(
            exists=self.exists,
            file_okay=self.file_okay,
            dir_okay=self.dir_okay,
            allow_dash=self.allow_dash,
            readable=self.readable,
        )
        return info

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(self.path_type, type) and isinstance(value, self.path_type):
            return value
        text = os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)
        if not (self.allow_dash and text == "-"):
            what, shown = self.name.title(), click.format_filename(text)
            try:
                st = os.stat(text)
            except OSError:
                if self.exists:
                    self.fail(f"{what} {shown!r} does not exist.", param, ctx)
                return self._result(text)
            if not self.file_okay and stat.S_ISREG(st.st_mode):
                self.fail(f"{what} {shown!r} is a file.", param, ctx)
            if not self.dir_okay and stat.S_ISDIR(st.st_mode):
                self.fail(f"{what} {shown!r} is a directory.", param, ctx)
            if self.readable and not os.access(text, os.R_OK):
                self.fail(f"{what} {shown!r} is not readable.", param, ctx)
        return self._result(text)

    def _result(self, text: str) -> Any:
        return text if self.path_type is None else self.path_type(text)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(incomplete, type="dir" if self.dir_okay and not self.file_okay else "file")]


__all__ = ["HELP_TEXT", "Command", "Group", "PathParam", "one_line"]
