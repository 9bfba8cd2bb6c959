"""Option types shared by the commands: sizes, seconds, and the run and exchange ids the journal's
commands look up. A bad size or number of seconds is click's usage error (exit 2) naming the
option, as ``Error: Invalid value for '--max-body': '1x' is not a size such as 64MiB, 500KB or
1048576``; a bad id is pvisor's UsageError (exit 2), one line naming it (:class:`JournalId`)."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import click

from pvisor.commands.base import PathParam
from pvisor.core.lazyre import LazyPattern

_SIZE = LazyPattern(r"^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.I)
_UNITS = {
    None: 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(text: str) -> int:
    """``64MiB`` -> 67108864. Units: B, KB/MB/GB (powers of 1000), KiB/MiB/GiB and K/M/G (powers
    of 1024). Raises ValueError with the reason."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 64MiB, 500KB or 1048576")
    return int(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]


class Size(click.ParamType):
    """A size in bytes, written as :func:`parse_size` reads it; at least ``minimum``, at most
    ``maximum`` (None: no bound)."""

    name = "size"

    def __init__(self, minimum: int = 0, maximum: int | None = None) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            size = value
        else:
            try:
                size = parse_size(str(value))
            except ValueError:
                self.fail(f"{_quoted(value)} is not a size such as 64MiB, 500KB or 1048576", param, ctx)
        if size < self.minimum:
            self.fail(f"{_quoted(value)} is too small (at least {self.minimum} B)", param, ctx)
        if self.maximum is not None and size > self.maximum:
            self.fail(f"{_quoted(value)} is too large (at most {self.maximum:,} B)", param, ctx)
        return size


def _quoted(value: Any) -> str:
    """``value`` quoted in a message, escaped as :func:`~pvisor.commands.base.one_line` escapes
    (a byte that is not UTF-8 as ``\\xff``, not as Python's ``\\udcff``)."""
    from pvisor.commands.base import one_line

    return f"'{one_line(str(value))}'"


#: the longest wait any option takes, in seconds (24 days): what poll() and the event loop's
#: timers can hold (a 32-bit count of milliseconds); more overflowed into a traceback
MAX_SECONDS = 2_147_483.0


class Seconds(click.ParamType):
    """A finite number of seconds from ``minimum`` to :data:`MAX_SECONDS` (``nan`` and ``inf``
    are refused)."""

    name = "seconds"

    def __init__(self, minimum: float) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{_quoted(value)} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < self.minimum:
            self.fail(f"{_quoted(value)} is not a finite number of seconds >= {self.minimum:g}", param, ctx)
        if seconds > MAX_SECONDS:
            self.fail(
                f"{_quoted(value)} is more than {MAX_SECONDS:.0f} seconds (24 days), the longest wait",
                param,
                ctx,
            )
        return seconds


class JournalId(click.ParamType):
    """A run or exchange id of the journal, or a unique prefix of one (``what``: ``"run"`` or
    ``"exchange"``), checked before the journal is opened as :func:`~pvisor.journal.model.is_run_id`
    checks an id (both kinds are made of :data:`~pvisor.journal.model.RUN_ID_PATTERN`'s
    characters, and so is a prefix of one). Refused with UsageError (exit 2, one line naming the
    argument or option, as ``view`` and ``replay`` refuse a name that is not UTF-8): an empty
    value (``--resume is empty: ...``, ``an empty run id matches nothing: ...``); one that is
    not UTF-8 (bytes on the command line that SQLite could not be given), shown as ``\\xNN``:
    ``RUN r-\\xff: not valid UTF-8 (file names and ids must be UTF-8)``; one of other
    characters, shown with its control characters escaped and a long one shortened; one holding
    a key-shaped token, not shown (a key is never an id). ``new``: the id of a run to make
    (``gateway --run``, ``env --run``), where a prefix means nothing: the same rule as the
    gateway's for a run id in a path or header (:func:`~pvisor.journal.model.is_run_id`).
    ``give``: what the message of an empty value asks for instead of an id or a unique prefix
    (``journal rm`` takes no prefix but with ``--prefix``)."""

    def __init__(self, what: str, new: bool = False, give: str | None = None) -> None:
        self.what = what
        self.new = new
        self.give = give  # what an empty value's message asks for, when not the id or a prefix
        self.name = f"{what} id"
        self.a = "an" if what[0] in "aeiou" else "a"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from pvisor.commands.base import one_line
        from pvisor.core.errors import UsageError, shown
        from pvisor.journal.model import is_run_id
        from pvisor.journal.paths import require_utf8

        text = os.fsdecode(value) if isinstance(value, bytes) else str(value)
        if is_run_id(text):
            return text
        named = _named(param, self.what.upper())
        if not text:
            empty = (
                f"{named} is empty" if named.startswith("-") else f"an empty {self.what} id matches nothing"
            )
            if self.new:
                raise UsageError(f"{empty}: give {self.a} {self.what} id ({_ID_CHARACTERS})")
            if self.give:
                raise UsageError(f"{empty}: give {self.give}")
            raise UsageError(
                f"{empty}: give {self.a} {self.what} id or a unique prefix of one "
                "(pvisor journal ls lists them)"
            )
        require_utf8(named, shown(text))
        refuse_key_shaped(named, text, f"{self.a} {self.what} id")
        raise UsageError(f"{named} {one_line(shown(text))}: not {self.a} {self.what} id ({_ID_CHARACTERS})")


#: what a run or exchange id is made of (journal/model.py's RUN_ID_PATTERN), as messages say it
_ID_CHARACTERS = "letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit"


def refuse_key_shaped(named: str, text: str, what: str) -> None:
    """UsageError (exit 2) when ``text`` holds a key-shaped token
    (:func:`~pvisor.journal.redact.has_key_shape`), never showing it: ``RUN holds a key-shaped
    token (not shown): a key is never a run id``. ``named``: the argument or option; ``what``:
    what it should have been (``a run id``, ``a run id or a file``). Every command that looks up
    a value it was given checks this before it names the value in a message."""
    from pvisor.core.errors import UsageError
    from pvisor.journal.redact import has_key_shape

    if has_key_shape(text):
        raise UsageError(f"{named} holds a key-shaped token (not shown): a key is never {what}")


def _named(param: click.Parameter | None, default: str) -> str:
    """How a message names ``param``: an option by its longest name (``--run``), an argument by
    its metavar without brackets (``RUN``)."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    if param is not None and param.metavar:
        return param.metavar.strip("[]")
    return default


#: the types of an argument or option that names a run, or an exchange, of the journal
RUN_ID = JournalId("run")
EXCHANGE_ID = JournalId("exchange")
#: the type of ``journal rm``'s RUN: a whole id, or with ``--prefix`` the start of the ids removed
RUN_ID_TO_REMOVE = JournalId(
    "run", give="a run's whole id, or the start of run ids with --prefix (pvisor journal ls lists them)"
)
#: the type of ``journal merge --run``: a whole id of a run in a source journal
MERGED_RUN_ID = JournalId("run", give="a run's whole id (pvisor --journal SRC journal ls lists them)")
#: the type of an option that names a run to make (``gateway --run``, ``env --run``): a whole id
NEW_RUN_ID = JournalId("run", new=True)


def intercept_options(command):
    """``--intercept``, ``--confdir`` and ``--mitmdump`` of ``pvisor run`` and ``pvisor replay``:
    run the agent through intercept mode (docs/intercept.md)."""
    command = click.option(
        "--mitmdump",
        default=None,
        metavar="PATH",
        help="With --intercept: the mitmdump to run (default $PVISOR_MITMDUMP, else the one on PATH).",
    )(command)
    command = click.option(
        "--confdir",
        type=PathParam(file_okay=False),
        default=None,
        help="With --intercept: the CA's directory (default $PVISOR_CA_DIR, else ~/.local/share/pvisor/ca).",
    )(command)
    return click.option(
        "--intercept",
        is_flag=True,
        help="Reach the agent's own model host through HTTPS_PROXY and pvisor's CA (mitmproxy) instead of "
        "giving it the gateway's URL.",
    )(command)


def intercept_config(intercept: bool, confdir: str | None, mitmdump: str | None):
    """The :class:`~pvisor.gateway.intercept.InterceptConfig` of a run through intercept mode
    (its proxy on a free loopback port), or None without ``--intercept``. UsageError for
    ``--confdir`` or ``--mitmdump`` without it."""
    from pathlib import Path

    from pvisor.core.errors import UsageError
    from pvisor.journal.paths import absolute

    if not intercept:
        if confdir or mitmdump:
            raise UsageError("--confdir and --mitmdump go with --intercept")
        return None
    from pvisor.gateway.intercept import InterceptConfig, find_mitmdump

    config = InterceptConfig(host="127.0.0.1", port=0, mitmdump=find_mitmdump(mitmdump))
    if confdir:
        config.confdir = Path(absolute(confdir, f"--confdir {confdir}"))
    return config


def pause_options(step_help: str, after_step_help: str) -> Any:
    """The two ways to name a pause (replay/numbering.py): ``--step K``, the documents'
    transition (zero-based), and ``--after-step N``, the journal steps kept; both optional
    integers from 0, passed as ``step`` and ``after_step``. ``view`` and ``snapshot restore``
    give each its own help."""

    def decorate(f: Any) -> Any:
        f = click.option(
            "--after-step", "after_step", type=click.IntRange(min=0), default=None, metavar="N",
            help=after_step_help,
        )(f)  # fmt: skip
        return click.option(
            "--step", "step", type=click.IntRange(min=0), default=None, metavar="K", help=step_help
        )(f)

    return decorate


#: the largest ``--max-response-body``: below SQLite's limit of 1,000,000,000 bytes for one
#: blob, which a response journaled whole must fit (docs/gateway.md, "Response size")
MAX_RESPONSE_BODY_LIMIT = 900_000_000

#: ``--max-response-body`` of ``gateway`` and ``run``: the response bytes journaled of one
#: exchange (the default is pvisor.gateway.proxy.DEFAULT_MAX_RESPONSE_BODY, 256 MiB)
max_response_body_option = click.option(
    "--max-response-body",
    "max_response_body",
    type=Size(1, MAX_RESPONSE_BODY_LIMIT),
    default="256MiB",
    show_default=True,
    help="Response bytes journaled per exchange; past it the agent still gets every byte, the journal "
    "keeps the first ones and flags the exchange truncated.",
)
