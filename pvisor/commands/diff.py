"""``pvisor diff A B``: where two requests, two runs, or two attempts part, and what that costs in
the prompt cache (docs/diff.md; the comparison is :mod:`pvisor.adapters.request_diff`).

A and B are each ``[JOURNAL:]ID[@N]``: JOURNAL a journal's path (default: ``--journal``'s), split
at the LAST colon (ids hold no colon: a path may); ID an exchange id, or a run id, either whole or
a unique prefix; ``@N`` names attempt N of a run (``RUN@2``: a native resume). Exit 0 when the
prompts are the same (``same`` or ``bytes_only`` everywhere), 1 when they differ, as diff(1); the
errors exit as docs/cli.md lists (2 usage, 3 damage, 65 not a journal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import click
import orjson

from pvisor.adapters.request_diff import cache_sentence, diff_exchanges, diff_runs
from pvisor.adapters.request_diff_kinds import collapsed
from pvisor.commands.base import Command, one_line
from pvisor.commands.params import refuse_key_shaped
from pvisor.core.errors import PvisorError, UsageError
from pvisor.journal.model import is_run_id
from pvisor.journal.paths import plain_path, require_utf8
from pvisor.journal.reader import JournalReader


@dataclass
class Named:
    """One side as given: the argument, its journal path and id, the attempt (or None)."""

    given: str
    journal: str
    ident: str
    attempt: int | None


def parse_side(which: str, given: str, default_journal: str) -> Named:
    """``[JOURNAL:]ID[@N]`` split: the journal at the last colon, the attempt after ``@``.
    UsageError naming ``which`` (``A`` or ``B``) for an empty part, an id of other characters,
    or an attempt that is no number of at least 1; for an argument that holds a key-shaped token
    anywhere (id or journal path), checked first and never shown (``A holds a key-shaped token
    (not shown): ...``, :func:`~pvisor.commands.params.refuse_key_shaped`)."""

    refuse_key_shaped(which, given, "an exchange or run id")
    require_utf8(which, given)
    journal, sep, ident = given.rpartition(":")
    if not sep:
        journal = default_journal
    elif not journal:
        raise UsageError(
            f"{which} {one_line(given)}: the journal before ':' is empty: write JOURNAL:ID or ID"
        )
    ident, at, attempt_text = ident.partition("@")
    attempt = None
    if at:
        if not attempt_text.isdigit() or int(attempt_text) < 1:
            raise UsageError(
                f"{which} {one_line(given)}: the attempt after '@' must be a number from 1 (RUN@2)"
            )
        attempt = int(attempt_text)
    if not ident:
        raise UsageError(f"{which} {one_line(given)}: no id: give an exchange or run id (or a unique prefix)")
    if not is_run_id(ident):
        raise UsageError(
            f"{which} {one_line(given)}: {one_line(ident)!s} is not an exchange or run id "
            "(letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit); "
            "name a journal as JOURNAL:ID"
        )
    journal = _absolute(plain_path(journal))
    if os.path.isdir(journal):
        raise UsageError(f"{which}: journal {one_line(journal)} is a directory, expected a journal file")
    return Named(given, journal, ident, attempt)


def _absolute(path: str) -> str:
    """``path`` absolute, as the default journal is, so that both sides' journals are named
    alike (``--json``'s ``journal``); as given when the working directory is gone."""
    try:
        return os.path.abspath(path)
    except OSError:  # getcwd() of a deleted directory
        return path


def resolve(reader: Any, side: Named, which: str) -> tuple[str, Any]:
    """(``"exchange"``, Exchange) or (``"run"``, Run) for ``side`` in its journal: an exact id
    before a prefix; UsageError when it names nothing, several, or both a run and an exchange."""

    found: dict[str, Any] = {}
    errors: list[str] = []
    kinds = (
        (("run", reader.run),)
        if side.attempt is not None
        else (("exchange", reader.exchange), ("run", reader.run))
    )
    for kind, look in kinds:
        try:
            found[kind] = look(side.ident)
        except UsageError as exc:
            errors.append(exc.message)
        except PvisorError:
            raise
    if len(found) == 2:
        exact = [k for k, v in found.items() if v.id == side.ident]
        if len(exact) != 1:
            raise UsageError(
                f"{which} {one_line(side.ident)} is ambiguous in journal {one_line(reader.path)}: "
                f"exchange {found['exchange'].id} and run {found['run'].id}"
            )
        found = {exact[0]: found[exact[0]]}
    if not found:
        ambiguous = next((e for e in errors if "ambiguous" in e), None)
        what = "run" if side.attempt is not None else "run or exchange"
        raise UsageError(
            f"{which}: {one_line(ambiguous)}"
            if ambiguous
            else f"{which}: no {what} {one_line(side.ident)} in journal {one_line(reader.path)}"
        )
    kind, value = next(iter(found.items()))
    if kind == "run" and side.attempt is not None:
        if side.attempt not in [a.n for a in reader.attempts(value.id)]:
            raise UsageError(f"{which}: run {value.id} has no attempt {side.attempt}")
    return kind, value


@click.command("diff", cls=Command)
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the comparison as one JSON document (docs/diff.md)."
)
@click.pass_context
def diff(ctx: click.Context, a: str, b: str, as_json: bool) -> None:
    """Where the requests of A and B part: the first byte, the block (message, part, field,
    expected against got, why), and what B can reuse of A's prompt cache. A and B are each
    [JOURNAL:]ID[@N]: two exchanges, two runs (aligned step by step), or two attempts of a run
    (RUN@1 RUN@2: the resumed attempt's first request against the one it extends). Exit 0 when
    the prompts are the same, 1 when they differ.

    \b
    Examples:
      pvisor diff x-0123 x-4567
      pvisor diff r-3f2a9c0d1e2b r-9c1b2a3d4e5f --json
      pvisor diff r-3f2a9c0d1e2b@1 r-3f2a9c0d1e2b@2
      pvisor diff old.sqlite:r-3f2a r-3f2a
    """

    default = str(ctx.obj["journal"])
    sides = [parse_side("A", a, default), parse_side("B", b, default)]
    readers: dict[str, Any] = {}
    try:
        for side in sides:
            if side.journal not in readers:
                readers[side.journal] = JournalReader(side.journal)
        ra, rb = readers[sides[0].journal], readers[sides[1].journal]
        (kind_a, va), (kind_b, vb) = resolve(ra, sides[0], "A"), resolve(rb, sides[1], "B")
        if kind_a != kind_b:
            raise UsageError(
                f"A is {'an' if kind_a == 'exchange' else 'a'} {kind_a} and B "
                f"{'an' if kind_b == 'exchange' else 'a'} {kind_b}: "
                "give two exchanges or two runs (RUN@N: an attempt)"
            )
        if kind_a == "exchange":
            found = diff_exchanges(ra, va, rb, vb)
            doc = {
                "kind": "exchanges",
                "a": _exchange_json(ra, va),
                "b": _exchange_json(rb, vb),
                **found.to_json(),
            }
            lines = _exchange_lines(found)
            differs = found.verdict.value == "differs"
        else:
            runs = diff_runs(ra, va.id, rb, vb.id, attempt_a=sides[0].attempt, attempt_b=sides[1].attempt)
            doc = {"kind": "runs", **runs.to_json()}
            lines = runs.lines()
            differs = runs.differs
    finally:
        for reader in readers.values():
            reader.close()
    if as_json:
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        for line in lines:
            click.echo(one_line(line))
    if differs:
        ctx.exit(1)


def _exchange_json(reader: Any, ex: Any) -> dict[str, Any]:
    """One side's names; ``attempt`` None for an exchange of a run with no attempt (a bare
    ``pvisor gateway`` capture: the journal's attempt column then says 1 though none ran)."""
    attempts = reader.attempts(ex.run) if ex.run and reader.run_exists(ex.run) else []
    attempted = any(a.n == ex.attempt for a in attempts)
    return {
        "journal": reader.path,
        "exchange": ex.id,
        "run": ex.run,
        "attempt": ex.attempt if attempted else None,
        "seq": ex.seq,
    }


def _exchange_lines(found: Any) -> list[str]:
    """One line per finding of two exchanges' diff: the verdict and first byte, a note, a
    ``where:`` line per real difference, the incidental ones in one ``also:`` line (``only
    incidental:`` when there is no real one), the differences past the cap, the cache."""

    if found.verdict.value == "same":
        return [f"same: the bodies are equal ({found.a_bytes:,} bytes)"]
    lines = [
        f"{found.verdict.value}: bodies part at byte {found.first_byte:,} "
        f"(A {found.a_bytes:,} bytes, B {found.b_bytes:,})"
    ]
    if found.note:
        lines.append(f"note: {found.note}")
    real = [d for d in found.differences if not d.incidental]
    lines += [f"where: {d.sentence()}" for d in real]
    incidental = [d for d in found.differences if d.incidental]
    if incidental:
        lines.append(f"{'also' if real else 'only incidental'}: {collapsed(incidental)}")
    if found.more_differences:
        lines.append(f"{found.more_differences:,} more differences not shown")
    if found.cache is not None:
        lines.append(cache_sentence(found.cache))
    return lines
