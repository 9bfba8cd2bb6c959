"""One numbering rule for pauses, the documents' own (docs/snapshots.md "Steps and transitions").

A run's journal steps are numbered from 1: step i is A_i with O_i. The documents number the same
steps from 0 and call them **transitions**: transition K is step K+1 (A(K+1) with O(K+1)). A
pause is a point between steps, named two ways:

- ``--step K`` (``step=K``): transition K. Without ``--before`` the pause is after it (the
  transitions 0..K are kept, K+1 steps); with ``--before`` it is before it (0..K-1 kept, K
  steps: the workspace taken before A(K+1) ran). ``--step 0 --before`` is the task alone.
- ``--after-step N`` (``after_step=N``): N steps kept, 0 <= N <= S (0: the task alone).

So ``--step K`` is ``--after-step K+1`` and ``--step K --before`` is ``--after-step K``. A
:class:`Position` is a pause resolved against a run of S steps; every phrase of a summary line or
an error names both numbers (:func:`describe`). Errors name what the caller gave: a CLI option
(``--step 3``) or a Python parameter (``step=3``), by :class:`Wording`.

Pure: nothing here reads a journal or a file.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from pvisor.core.errors import UsageError

#: a flag given without a value (``--before``, ``before=True``)
FLAG = object()


class Placeholder(str):
    """A value shown as it is in both wordings (``K``, ``N``), never quoted."""


K, K1, N = Placeholder("K"), Placeholder("K+1"), Placeholder("N")


class Wording(str, enum.Enum):
    """How an error names what its caller gave: ``cli`` (``--after-step 3``, ``--force``) or
    ``python`` (``after_step=3``, ``force=True``)."""

    CLI = "cli"
    PYTHON = "python"

    def option(self, name: str, value: Any = FLAG, *, cli: str | None = None) -> str:
        """``name`` (the Python parameter, ``after_step``) as the caller wrote it, with ``value``
        (:data:`FLAG`: a flag). ``cli``: the option's own name when it is not ``--`` + ``name``
        with dashes (``--into`` for ``environment``)."""
        if self is Wording.CLI:
            flag = cli or "--" + name.replace("_", "-")
            return flag if value is FLAG else f"{flag} {_shown(value)}"
        if value is FLAG:
            return f"{name}=True"
        return f"{name}={value if isinstance(value, Placeholder) else repr(value)}"


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True, slots=True)
class Position:
    """A pause resolved against a run of ``total`` steps: ``kept`` steps (0..total: the view's
    ``through_step``, the journal's ``boundary_step``), ``transition`` (K; None for the task alone
    of a run without a step) and ``before`` (the pause is before transition K, not after it)."""

    kept: int
    transition: int | None
    before: bool
    total: int


def steps(n: int) -> str:
    return f"{n} journal step{'s' if n != 1 else ''}"


def transitions(total: int) -> str:
    """``3 transitions (0..2; journal steps 1..3)``, or what a run without a step holds."""
    if total == 0:
        return "no transition (0 journal steps: only the task alone, after step 0)"
    if total == 1:
        return "1 transition (0; journal step 1)"
    return f"{total} transitions (0..{total - 1}; journal steps 1..{total})"


def describe(pos: Position) -> str:
    """The pause in words, both numbers: ``transition 0 (step 1 of 3 journal steps)``, ``before
    transition 1 (after step 1 of 3 journal steps)``, ``the task alone (after step 0 of 0 journal
    steps)``."""
    of = f"of {steps(pos.total)}"
    if pos.transition is None:
        return f"the task alone (after step 0 {of})"
    if pos.before:
        alone = ", the task alone" if pos.kept == 0 else ""
        return f"before transition {pos.transition} (after step {pos.kept} {of}{alone})"
    return f"transition {pos.transition} (step {pos.kept} {of})"


def where(pos: Position) -> str:
    """:func:`describe` after a verb: ``at transition 0 (...)``, ``before transition 1 (...)``,
    ``at the task alone (...)``."""
    text = describe(pos)
    return text if text.startswith("before ") else "at " + text


def pause_of(kept: int | None, transition: int | None) -> str:
    """A child run's pause from its lineage (``boundary_step``, ``pause_transition``): ``after
    step 2 (transition 1)``, ``after step 1 (before transition 1)``, ``after step 0``."""
    if transition is None:
        return f"after step {kept}"
    return f"after step {kept} ({'before ' if kept == transition else ''}transition {transition})"


def from_after_step(n: int, total: int) -> Position:
    """The position of N steps kept: after transition N-1, or for N = 0 before transition 0
    (the task alone; its transition is None when the run has no step)."""
    if n == 0:
        return Position(0, 0 if total else None, True, total)
    return Position(n, n - 1, False, total)


def resolve_step(
    total: int,
    *,
    step: int | None = None,
    before: bool = False,
    after_step: int | None = None,
    wording: Wording = Wording.CLI,
    at: str = "",
    run: str = "the run",
) -> Position:
    """The position of ``step`` K (with ``before``) or ``after_step`` N in a run of ``total``
    steps; with neither, the last transition (the task alone for a run without a step, ``before``
    then said). Raises UsageError (exit 2), starting with ``at`` and naming ``run``, both numbers
    and the caller's words (:class:`Wording`), for both given, ``before`` with ``after_step``, or
    a value out of range."""
    w = wording
    if step is not None and after_step is not None:
        raise UsageError(
            f"{at}{w.option('step', step)} and {w.option('after_step', after_step)} both choose the pause: "
            f"give one ({w.option('step', K)} is {w.option('after_step', K1)})"
        )
    if after_step is not None:
        if before:
            raise UsageError(
                f"{at}{w.option('before')} is for {w.option('step', K)}; "
                f"{w.option('after_step', after_step)} "
                f"counts the steps kept already ({w.option('step', K)} {w.option('before')} is "
                f"{w.option('after_step', K)})"
            )
        if not isinstance(after_step, int) or not 0 <= after_step <= total:
            raise UsageError(
                f"{at}{w.option('after_step', after_step)}: {run} has {steps(total)} "
                f"(N from 0, the task alone, to {total})"
            )
        return from_after_step(after_step, total)
    if step is None:
        if total == 0:
            return Position(0, None, True, 0)
        return Position(total - 1 if before else total, total - 1, before, total)
    if not isinstance(step, int) or not 0 <= step < total:
        hint = (
            f"; the task alone is {w.option('after_step', 0)}"
            if total == 0
            else f"; {w.option('after_step', total)} is the last step's too"
            if step == total
            else ""
        )
        raise UsageError(
            f"{at}{w.option('step', step)}{' ' + w.option('before') if before else ''}: {run} has "
            f"{transitions(total)}{hint}"
        )
    return Position(step if before else step + 1, step, before, total)


def progress_transition(
    fraction: Any, total: int, *, wording: Wording = Wording.CLI, at: str = "", run: str = "the run"
) -> int:
    """Transition round(F x (T-1)) of a run of T steps (rounded half up: 0.5 of 2 transitions is
    transition 1), F from 0 to 1: a point between transitions, not a measure of the task done.
    Raises UsageError for F out of range or not a number, or a run without a transition."""
    w = wording
    f = fraction
    if (
        f is None
        or isinstance(f, bool)
        or not isinstance(f, (int, float))
        or math.isnan(f)
        or not 0 <= f <= 1
    ):
        raise UsageError(
            f"{at}{w.option('progress', f)}: a fraction from 0 to 1 (transition round(F x (T-1)) of T "
            "transitions, halves up)"
        )
    if total == 0:
        raise UsageError(
            f"{at}{w.option('progress', f)}: {run} has {transitions(0)}; the task alone is "
            f"{w.option('after_step', 0)}"
        )
    return math.floor(f * (total - 1) + 0.5)
