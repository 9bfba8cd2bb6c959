"""``--format`` of the export commands, from the registry of export formats
(:mod:`pvisor.adapters.exports`): its choices, its help and the options a format reads.

The commands that offer it (``journal export``, ``trajectory export``) are defined when
``journal ls`` or ``trajectory show`` runs too: so the registry is asked when a value is checked
or help is shown, never when a command is defined, and checking a value that names a format
loads that format's module alone (tests/test_startup_imports.py: ``journal ls`` loads no
``pvisor.adapters``). A source is named by the value of its
:class:`~pvisor.adapters.exports.base.Source` (``"run"``, ``"native"``) for the same reason.
"""

from __future__ import annotations

from typing import Any, Callable

import click

#: the formats ``--format`` offers write a stream (a file or stdout); the others have commands
#: of their own (``pvisor report``)
STREAM = "stream"


def offered(source: str) -> list[Any]:
    """The registered formats that take ``source`` (a Source value) and write a stream."""
    from pvisor.adapters.exports import formats
    from pvisor.adapters.exports.base import Output, Source

    return formats(Source(source), Output(STREAM))


def offering(source: str, name: str) -> bool:
    """``name`` is a format :func:`offered` for ``source``; loads that format's module alone."""
    from pvisor.adapters.exports import find_format
    from pvisor.adapters.exports.base import Output, Source

    fmt = find_format(name)
    return fmt is not None and Source(source) in fmt.accepts and fmt.output is Output(STREAM)


class FormatChoice(click.Choice):
    """``click.Choice`` of the formats :func:`offered` for ``source``, asked of the registry each
    time (a format registered later is offered too); its messages are click.Choice's."""

    def __init__(self, source: str) -> None:  # click.Choice's fixed tuple is not made
        self.source = source
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f.name for f in offered(self.source))

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # a value that names an offered format is that format; anything else goes to
        # click.Choice, which lists every choice in its message
        plain = ctx is None or ctx.token_normalize_func is None
        if plain and isinstance(value, str) and offering(self.source, value):
            return value
        return super().convert(value, param, ctx)


class DerivedHelpOption(click.Option):
    """A ``click.Option`` whose help is made by ``help_from()`` when it is shown."""

    def __init__(self, *args: Any, help_from: Callable[[], str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_from = help_from

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = self.help_from()
        return super().get_help_record(ctx)


def format_option(source: str, tail: str, **kwargs: Any) -> Callable[[Any], Any]:
    """``--format`` (parameter ``fmt``): choices :func:`offered` for ``source``, help
    ``name: description; ...`` then ``tail``."""

    def help_text() -> str:
        from pvisor.adapters.exports.base import Source

        return "; ".join(f"{f.name}: {f.describe[Source(source)]}" for f in offered(source)) + tail

    return click.option(
        "--format", "fmt", type=FormatChoice(source), cls=DerivedHelpOption, help_from=help_text, **kwargs
    )


def readers(source: str, option: Any) -> list[str]:
    """The names of the formats :func:`offered` for ``source`` that read ``option`` (an Option)."""
    return [f.name for f in offered(source) if option in f.reads]


def listed(names: list[str]) -> str:
    """``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class DerivedHelpCommand:
    """A mix-in for a click command whose help (its docstring) has ``{fields}`` filled in by
    ``help_fields()`` when it is shown (a class attribute set by :func:`derived_help`)."""

    help_fields: Callable[[], dict[str, str]]

    @property
    def help(self) -> str | None:
        template = self.__dict__.get("_help_template")
        return None if template is None else template.format(**type(self).help_fields())

    @help.setter
    def help(self, value: str | None) -> None:
        self.__dict__["_help_template"] = value


def derived_help(base: type, help_fields: Callable[[], dict[str, str]]) -> type:
    """``base`` (a pvisor Command class) whose help fills its ``{fields}`` from
    ``help_fields()`` (:class:`DerivedHelpCommand`)."""
    return type(
        f"Derived{base.__name__}", (DerivedHelpCommand, base), {"help_fields": staticmethod(help_fields)}
    )
