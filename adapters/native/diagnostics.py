"""Warnings of a native read, and the error for a missing record shape.

- :class:`NativeWarning`: one warning ``(code, where, message)``, printed on stderr by the CLI
  as ``where: code: message``; ``--strict`` turns any warning into exit 65.
- :class:`Diagnostics`: the warnings of one file, at most :data:`MAX_WARNINGS_PER_CODE` of a
  code (the rest counted in one more).
- :data:`WARNING_CODES`: every code and what it means (docs/native.md lists them too).
- :func:`require`: BadInputError (exit 65) naming the file and line when a required record
  shape is missing.

Depends on ``pvisor.journal`` only.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pvisor.core.errors import BadInputError
from pvisor.core.record import FrozenRecord, Record

_set = object.__setattr__  # how a FrozenRecord sets its fields in __init__

#: warnings of one code kept by :class:`Diagnostics`; the rest are counted in one more
MAX_WARNINGS_PER_CODE = 100

#: warning codes and what they mean (docs/native.md lists them too)
WARNING_CODES: dict[str, str] = {
    "truncated_line": (
        "the last line ends without a newline and does not parse, or is a record missing its closing "
        "brackets (the writer was cut off); skipped"
    ),
    "nul_block": "a block of NUL bytes (a crash or a preallocated file); skipped",
    "malformed_line": "a line that is not JSON; skipped",
    "not_an_object": "a line that is JSON but not an object; skipped",
    "rejoined_lines": "an object split by raw newlines, read by joining the lines",
    "glued_record": (
        "a complete record glued onto a truncated one on the same line (a writer cut off mid-line, the next "
        "write appended): the complete one is read, the truncated one skipped"
    ),
    "invalid_utf8": "invalid UTF-8 bytes, read as U+FFFD",
    "lone_surrogate": "lone UTF-16 surrogate escapes, read as U+FFFD",
    "unverified_profile": "the file's format version is newer than the verified profile (same major)",
    "no_version": "the file does not say its format version; read with the pinned profile",
    "unreadable_version": (
        'the file\'s format version does not read as X.Y ("banana"); read by shape with the pinned profile'
    ),
    "interrupted": "a tool call whose result never came; the step ends with an interrupted observation",
    "output_from_event": (
        "a Codex call with no function_call_output line whose end event (exec_command_end, item_completed) "
        "carries its output: the event's output is its result, not an interrupted observation"
    ),
    "output_differs": (
        "a Codex call whose end event's output is not within its function_call_output's: the "
        "function_call_output (what the model was sent) is used; both digests named"
    ),
    "duplicate_record": "a record repeated (same id); the later one is used",
    "unknown_record": "a record type the profile does not know; left out",
    "broken_chain": (
        "a record whose parent is missing (a lost or damaged line): it continues from the chain record "
        "before it in the file, or, with none, the chain restarts there"
    ),
    "malformed_record": "a record that is JSON but lacks a field its type requires; skipped",
    "duplicate_call_id": "two tool calls share an id; results paired in order of appearance",
    "atif_assumed": (
        "an ATIF file of an agent pvisor does not know: what the generic descriptor assumes of a tool "
        "(a shell, or rendered as text in a handoff)"
    ),
    "subagent_skipped": (
        "an entry beside the session that is not a readable subagent file (not a regular file, a "
        "link, a directory linked in, or a file the reader refuses): skipped, the other episodes are read"
    ),
    "lost_action": (
        "a tool result answers a call no line holds (the action's line was lost): a gap step stands at its "
        "place"
    ),
}


class NativeWarning(FrozenRecord, record=True):
    """One warning: ``code`` (a key of :data:`WARNING_CODES`), ``where`` (``"line 12"``,
    ``"lines 4-6"``, ``"message m1"``) and a one-line ``message``."""

    code: str
    where: str
    message: str

    def __init__(self, code: str, where: str, message: str) -> None:
        _set(self, "code", code)
        _set(self, "where", where)
        _set(self, "message", message)

    def __str__(self) -> str:
        return f"{self.where}: {self.code}: {self.message}"


class Diagnostics(Record, record=True):
    """Warnings collected while reading one file (``path`` names it in messages).

    At most :data:`MAX_WARNINGS_PER_CODE` warnings of one code are kept; past that one
    warning ``where="file"`` counts the rest (``"4999900 more malformed_line warnings not
    listed"``), so a file of millions of bad lines costs no more memory or output than a
    short one (a new user's 50 MB of junk lines made 6 million warnings, 4 GB)."""

    path: str = "-"
    warnings: list[NativeWarning] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    _more_at: dict[str, int] = field(default_factory=dict)

    def __init__(
        self,
        path: str = "-",
        warnings: list[NativeWarning] | None = None,
        counts: dict[str, int] | None = None,
        _more_at: dict[str, int] | None = None,
    ) -> None:
        self.path = path
        self.warnings = [] if warnings is None else warnings
        self.counts = {} if counts is None else counts
        self._more_at = {} if _more_at is None else _more_at

    def warn(self, code: str, where: str, message: str) -> None:
        self.add(NativeWarning(code, where, message))

    def add(self, w: NativeWarning) -> None:
        n = self.counts[w.code] = self.counts.get(w.code, 0) + 1
        if n <= MAX_WARNINGS_PER_CODE:
            self.warnings.append(w)
            return
        more = n - MAX_WARNINGS_PER_CODE
        note = NativeWarning(
            w.code,
            "file",
            f"{more} more {w.code} warning{'s' if more > 1 else ''} not listed (the first "
            f"{MAX_WARNINGS_PER_CODE} are)",
        )
        at = self._more_at.get(w.code)
        if at is None:
            self._more_at[w.code] = len(self.warnings)
            self.warnings.append(note)
        else:
            self.warnings[at] = note

    def codes(self) -> list[str]:
        return [w.code for w in self.warnings]


def require(cond: Any, diag: Diagnostics, where: str, what: str) -> None:
    """Raise BadInputError (exit 65) ``<file>: <where>: <what>`` unless ``cond``: a required
    record shape is missing."""
    if not cond:
        raise BadInputError(f"{diag.path}: {where}: {what}")
