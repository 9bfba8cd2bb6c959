"""Shared reading machinery of the native trajectory adapters.

A **native adapter** reads the file an agent writes itself (Claude Code's session JSONL, a
Codex rollout, ...) into the canonical :class:`~pvisor.journal.model.Trajectory`. This module
holds what they share:

- :class:`Diagnostics` and :class:`NativeWarning`: warnings ``(code, where, message)``,
  printed on stderr by the CLI; ``--strict`` turns any warning into exit 65.
- :func:`iter_json_records`: the streaming JSONL reader. Rules (issue 6, "Damaged input"):

  * the file is read in binary, in chunks (memory bounded by the longest line, not the file);
    lines are split on ``b"\\n"`` only (never ``str.splitlines``, which also splits on U+2028,
    U+0085 and other characters that occur inside JSON strings); a ``\\r`` before the
    ``\\n`` is dropped;
  * each line is parsed with orjson; orjson rejects lone-surrogate escapes (``"\\ud800"``) and
    invalid UTF-8, so such a line is parsed again with the standard library: lone surrogates
    and invalid bytes become U+FFFD and the line is flagged (``lone_surrogate``,
    ``invalid_utf8``);
  * a truncated last line, a block of NUL bytes (a file preallocated or cut by a crash), or a
    malformed line in the middle is skipped with a warning naming the line, and reading goes
    on (``truncated_line``, ``nul_block``, ``malformed_line``); text after a NUL block on the
    same line is read if it parses;
  * an object split by raw newlines (a writer that did not escape a newline inside a string)
    is rejoined from the following lines, at most :data:`REJOIN_MAX_LINES` lines and
    :data:`REJOIN_MAX_BYTES` bytes, the raw newlines kept as newlines (``rejoined_lines``);
    a following line that is a JSON object on its own ends the attempt.
- :func:`read_json_document`: a single-document JSON file (mini-swe-agent, OpenHands, ...),
  with the same UTF-8 fallback.
- :class:`FormatProfile`: the pinned version of a native format (``claude-code@2.1``) and where
  its version is read; :meth:`FormatProfile.check` warns ``unverified_profile`` for a newer
  minor and raises :class:`~pvisor.journal.errors.BadInputError` (exit 65) naming the line for
  an unknown major.
- :class:`NativeAdapter`: the interface every adapter module implements, and
  :func:`require` for a missing required record shape (exit 65 naming the line).

Depends on ``pvisor.journal`` only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, overload

import orjson

from pvisor.adapters.jsonio import dumps
from pvisor.journal import progress
from pvisor.journal.errors import BadInputError
from pvisor.journal.model import LeftOut, Step, ToolCall, ToolResult, Trajectory
from pvisor.journal.record import FrozenRecord, Record, record
from pvisor.journal.lazyre import LazyPattern

if TYPE_CHECKING:
    from pathlib import Path

_set = object.__setattr__  # how a FrozenRecord sets its fields in __init__

NUL = b"\x00"
#: the UTF-8 byte order mark, skipped at the start of a file
BOM = b"\xef\xbb\xbf"
#: bytes read per chunk by :func:`iter_json_records`
CHUNK_BYTES = 1 << 20
#: a JSON object split by raw newlines is rejoined over at most this many lines ...
REJOIN_MAX_LINES = 1000
#: ... and at most this many bytes (1 MiB)
REJOIN_MAX_BYTES = 1 << 20

#: warnings of one code kept by :class:`Diagnostics`; the rest are counted in one more
MAX_WARNINGS_PER_CODE = 100

#: warning codes and what they mean (docs/native.md lists them too)
WARNING_CODES: dict[str, str] = {
    "truncated_line": "the last line ends without a newline and does not parse (the writer was cut off); skipped",
    "nul_block": "a block of NUL bytes (a crash or a preallocated file); skipped",
    "malformed_line": "a line that is not JSON; skipped",
    "not_an_object": "a line that is JSON but not an object; skipped",
    "rejoined_lines": "an object split by raw newlines, read by joining the lines",
    "invalid_utf8": "invalid UTF-8 bytes, read as U+FFFD",
    "lone_surrogate": "lone UTF-16 surrogate escapes, read as U+FFFD",
    "unverified_profile": "the file's format version is newer than the verified profile (same major)",
    "no_version": "the file does not say its format version; read with the pinned profile",
    "unreadable_version": 'the file\'s format version does not read as X.Y ("banana"); read by shape with the pinned profile',
    "interrupted": "a tool call whose result never came; the step ends with an interrupted observation",
    "duplicate_record": "a record repeated (same id); the later one is used",
    "unknown_record": "a record type the profile does not know; left out",
    "broken_chain": "a record whose parent is missing (a lost or damaged line): it continues from the chain record before it in the file, or, with none, the chain restarts there",
    "malformed_record": "a record that is JSON but lacks a field its type requires; skipped",
    "duplicate_call_id": "two tool calls share an id; results paired in order of appearance",
    "lost_action": "a tool result answers a call no line holds (the action's line was lost): a gap step stands at its place",
}


@record
class NativeWarning(FrozenRecord):
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


@record
class Diagnostics(Record):
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
            f"{more} more {w.code} warning{'s' if more > 1 else ''} not listed (the first {MAX_WARNINGS_PER_CODE} are)",
        )
        at = self._more_at.get(w.code)
        if at is None:
            self._more_at[w.code] = len(self.warnings)
            self.warnings.append(note)
        else:
            self.warnings[at] = note

    def codes(self) -> list[str]:
        return [w.code for w in self.warnings]


# --------------------------------------------------------------------------- UTF-8 fallback

_SURROGATE = LazyPattern("[\ud800-\udfff]")


def _scrub(obj: Any) -> Any:
    """``obj`` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(obj, str):
        return _SURROGATE.sub("\ufffd", obj) if _SURROGATE.search(obj) else obj
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    if isinstance(obj, dict):
        return {_scrub(k): _scrub(v) for k, v in obj.items()}
    return obj


def loads_lenient(data: bytes, *, strict: bool = True) -> tuple[Any, list[str]]:
    """Parse JSON bytes; returns (value, flags) where flags may hold ``invalid_utf8`` and
    ``lone_surrogate``. orjson first; on failure the standard library, which accepts lone
    surrogate escapes, on the bytes decoded with ``errors="replace"``. ``strict=False`` also
    accepts raw control characters (newlines) inside strings. Raises ValueError when the
    bytes are not JSON either way, or nest deeper than the parsers go (orjson stops at 1024
    levels, the standard library at the recursion limit)."""
    if strict:
        try:
            return orjson.loads(data), []
        except orjson.JSONDecodeError:
            pass
    flags: list[str] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
        flags.append("invalid_utf8")
    try:
        value = json.loads(text, strict=strict)  # ValueError when not JSON
    except RecursionError:
        raise ValueError("nested too deep to parse") from None
    if _SURROGATE_ESCAPE.search(text):
        scrubbed = _scrub(value)
        if scrubbed != value:
            flags.append("lone_surrogate")
        value = scrubbed
    return value, flags


_SURROGATE_ESCAPE = LazyPattern(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


# --------------------------------------------------------------------------- JSONL


@record
class _Pending(Record):
    first: int
    parts: list[bytes]
    size: int
    offset: int = 0

    def __init__(self, first: int, parts: list[bytes], size: int, offset: int = 0) -> None:
        self.first = first
        self.parts = parts
        self.size = size
        self.offset = offset


def _where(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def _raw_lines(path: Path) -> Iterator[tuple[int, int, bytes, bool]]:
    """(line number from 1, byte offset of the line, bytes without the newline, ended by a
    newline) for each line, reading ``CHUNK_BYTES`` at a time. A UTF-8 byte order mark at the
    start of the file (Windows editors write one) is not part of the first line. A line longer
    than a chunk is kept as pieces until its end and joined once: its cost is linear in its
    length (gluing each chunk to the rest was quadratic: 35 s for a 300 MB line)."""
    n = 0
    pending: list[bytes] = []  # the pieces of a line whose end has not been read yet
    line_start = 0  # file offset of the line being read
    pos = 0  # file offset of chunk[0]
    first = True
    task = progress.current()  # "reading FILE", when read_native opened it
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(CHUNK_BYTES)
            if not chunk:
                break
            task.advance(len(chunk))
            start = 0
            if first:
                first = False
                if chunk.startswith(BOM):
                    start = line_start = len(BOM)
            while True:
                end = chunk.find(b"\n", start)
                if end < 0:
                    if start < len(chunk):
                        pending.append(chunk[start:])
                    break
                if pending:
                    pending.append(chunk[start:end])
                    line = b"".join(pending)
                    pending = []
                else:
                    line = chunk[start:end]
                n += 1
                yield n, line_start, line, True
                start = end + 1
                line_start = pos + start
            pos += len(chunk)
    if pending:
        yield n + 1, line_start, b"".join(pending), False


@record
class LineRef(FrozenRecord):
    """Where one object of a JSONL file is: ``offset`` and ``length`` in bytes of the text
    that was parsed (a line without its ``\\r\\n``, the part after a NUL block, or, when
    ``joined``, the span of lines an object split by raw newlines was rejoined from).
    :meth:`JsonlSource.load` parses it again: adapters keep refs, not contents, so a trajectory
    of a 200 MB file holds its structure only and each step's texts are read when the step is
    built (issue 6, "Scale")."""

    offset: int
    length: int
    joined: bool = False

    def __init__(self, offset: int, length: int, joined: bool = False) -> None:
        _set(self, "offset", offset)
        _set(self, "length", length)
        _set(self, "joined", joined)


def iter_json_records(path: Path, diag: Diagnostics) -> Iterator[tuple[int, dict[str, Any], LineRef]]:
    """(line number, object, :class:`LineRef`) for every JSON object line of the JSONL file
    ``path``, damaged lines skipped or repaired with a warning in ``diag`` (rules in the module
    docstring). Blank lines are ignored silently. A rejoined object is numbered by its first
    line. The ref lets :meth:`JsonlSource.load` read the object again later."""
    pending: _Pending | None = None

    def give_up(p: _Pending, last: int) -> NativeWarning:
        return NativeWarning(
            "malformed_line",
            f"line {p.first}",
            "not JSON"
            + (f" (nor with the {last - p.first} lines after it joined)" if last > p.first else ""),
        )

    for n, offset, line, ended in _raw_lines(path):
        if line.endswith(b"\r"):
            line = line[:-1]
        if NUL in line:
            cut = line.rindex(NUL) + 1
            after = line[cut:].strip()
            offset += cut + len(line[cut:]) - len(line[cut:].lstrip())
            nuls = line.count(NUL)
            diag.warn(
                "nul_block",
                f"line {n}",
                f"{nuls} NUL bytes skipped" + ("; the text after them is read" if after else ""),
            )
            if pending is not None:
                diag.add(give_up(pending, n - 1))
                pending = None
            line = after
        if not line.strip():
            if pending is not None:  # a blank line inside a split object is part of it
                pending.parts.append(line)
                pending.size += len(line) + 1
            continue
        try:
            obj, flags = loads_lenient(line)
            ok = True
        except ValueError:
            ok = False
        if ok and pending is not None:
            if isinstance(obj, dict):
                # a complete object on its own line ends a rejoin attempt
                diag.add(give_up(pending, n - 1))
                pending = None
            else:
                ok = False  # a fragment that happens to be JSON ("123", "]"): keep joining
        if ok:
            for f in flags:
                diag.warn(f, f"line {n}", WARNING_CODES[f])
            if not isinstance(obj, dict):
                diag.warn("not_an_object", f"line {n}", f"a JSON {type(obj).__name__}, expected an object")
                continue
            yield n, obj, LineRef(offset, len(line))
            continue
        if pending is None:
            if not ended:
                diag.warn(
                    "truncated_line", f"line {n}", "the last line is cut off (no newline, not JSON); skipped"
                )
                continue
            if not line.lstrip().startswith(b"{"):
                diag.warn("malformed_line", f"line {n}", "not JSON; skipped")
                continue
            pending = _Pending(n, [line], len(line), offset)
            continue
        pending.parts.append(line)
        pending.size += len(line) + 1
        if pending.size > REJOIN_MAX_BYTES or len(pending.parts) > REJOIN_MAX_LINES:
            diag.warn(
                "malformed_line",
                _where(pending.first, n),
                f"not JSON; a rejoin went past {REJOIN_MAX_LINES} lines or {REJOIN_MAX_BYTES} bytes; skipped",
            )
            pending = None
            continue
        try:
            obj, flags = loads_lenient(b"\n".join(pending.parts), strict=False)
        except ValueError:
            if not ended:
                diag.warn(
                    "truncated_line", _where(pending.first, n), "cut off at the end of the file; skipped"
                )
                pending = None
            continue
        if isinstance(obj, dict):
            diag.warn(
                "rejoined_lines", _where(pending.first, n), "an object split by raw newlines, read joined"
            )
            for f in flags:
                diag.warn(f, f"line {pending.first}", WARNING_CODES[f])
            first, start = pending.first, pending.offset
            pending = None
            yield first, obj, LineRef(start, offset + len(line) - start, joined=True)
    if pending is not None:
        last = pending.first + len(pending.parts) - 1
        if len(pending.parts) == 1:
            diag.warn("malformed_line", f"line {pending.first}", "not JSON; skipped")
        else:
            diag.warn("malformed_line", _where(pending.first, last), "not JSON, not even joined; skipped")


class JsonlSource:
    """Reads objects of one JSONL file again by :class:`LineRef` (``os.pread`` on one file
    descriptor, opened on first use, closed by :meth:`close` or when collected).

    :meth:`load` returns the object as :func:`iter_json_records` parsed it (same UTF-8
    fallback; its warnings were given then). Raises BadInputError (exit 65) naming the file
    when the bytes no longer parse as an object: the file changed after it was read.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def load(self, ref: LineRef) -> dict[str, Any]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, ref.length, ref.offset)
        try:
            if ref.joined:
                parts = [p[:-1] if p.endswith(b"\r") else p for p in data.split(b"\n")]
                obj, _ = loads_lenient(b"\n".join(parts), strict=False)
            else:
                obj, _ = loads_lenient(data)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise BadInputError(
                f"{self.path}: the file changed while it was read (bytes {ref.offset}-{ref.offset + ref.length} no longer hold a JSON object)"
            )
        return obj

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


class LazySteps(Sequence[Step]):
    """The steps of a trajectory, built on demand: ``plans[i]`` is whatever the adapter
    recorded about step ``i + 1`` while reading (line refs, call ids), ``build(plan)`` makes
    the :class:`~pvisor.journal.model.Step`, reading its texts through a :class:`JsonlSource`.
    Nothing is cached: iterating twice builds twice; memory holds the plans and one step.
    Warnings are the adapter's job while reading (``build`` must not add any), so ``--strict``
    and the warnings printed before the steps are complete."""

    def __init__(self, plans: list[Any], build: Callable[[Any], Step]) -> None:
        self._plans = plans
        self._build = build

    def __len__(self) -> int:
        return len(self._plans)

    @overload
    def __getitem__(self, i: int) -> Step: ...
    @overload
    def __getitem__(self, i: slice) -> list[Step]: ...
    def __getitem__(self, i: int | slice) -> Step | list[Step]:
        if isinstance(i, slice):
            return [self._build(p) for p in self._plans[i]]
        return self._build(self._plans[i])

    def __iter__(self) -> Iterator[Step]:
        for p in self._plans:
            yield self._build(p)

    def flagging(self, index: int, flag: str) -> "LazySteps":
        """These steps, the one at ``index`` built with ``flag`` added to its flags."""
        plan = self._plans[index]
        build = self._build

        def flagged(p: Any) -> Step:
            step = build(p)
            if p is plan and flag not in step.flags:
                step.flags.append(flag)
            return step

        return LazySteps(self._plans, flagged)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, LazySteps)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"LazySteps({len(self._plans)} steps)"


def read_json_document(path: Path, diag: Diagnostics) -> Any:
    """The single JSON document in ``path`` (UTF-8 fallback as for lines). Raises
    BadInputError (exit 65) naming the file when it is not JSON."""
    with open(path, "rb") as fh:
        data = fh.read()
    progress.current().advance(len(data))
    if data.startswith(BOM):
        data = data[len(BOM) :]
    try:
        value, flags = loads_lenient(data)
    except ValueError as exc:
        raise BadInputError(f"{path}: not a JSON document ({exc})") from None
    for f in flags:
        diag.warn(f, "document", WARNING_CODES[f])
    return value


# --------------------------------------------------------------------------- profiles

_VERSION = LazyPattern(r"^\s*v?(\d+)\.(\d+)")


@record
class FormatProfile(FrozenRecord):
    """A pinned native format version.

    Fields:
        adapter: the adapter name (``claude-code``).
        major, minor: the verified version (``2``, ``1`` for ``claude-code@2.1``).
        version_from: where the version is read, for ``pvisor adapters`` and docs
            (``"version of each line"``, ``"by shape"``).
        verified_with: the agent versions whose files this profile was checked against.
        by_shape: True when the format carries no version: :meth:`check` is not called.
    """

    adapter: str
    major: int
    minor: int
    version_from: str
    verified_with: str = ""
    by_shape: bool = False

    def __init__(
        self,
        adapter: str,
        major: int,
        minor: int,
        version_from: str,
        verified_with: str = "",
        by_shape: bool = False,
    ) -> None:
        _set(self, "adapter", adapter)
        _set(self, "major", major)
        _set(self, "minor", minor)
        _set(self, "version_from", version_from)
        _set(self, "verified_with", verified_with)
        _set(self, "by_shape", by_shape)

    @property
    def name(self) -> str:
        return f"{self.adapter}@{self.major}.{self.minor}"

    def check(self, version: Any, where: str, diag: Diagnostics) -> None:
        """Check the file's own ``version`` string read at ``where`` (``"line 3"``): same major
        and minor at most ours is fine; a newer minor warns ``unverified_profile``; None warns
        ``no_version``; a version that does not read as ``X.Y`` (``"banana"``, a fixture's
        ``"[trimmed for fixture]"``) warns ``unreadable_version`` and the file is read by shape
        with this profile (it says nothing about the format, so it is no reason to refuse);
        another major raises BadInputError (exit 65) naming the file and ``where``. Versions
        are shown clipped to 40 characters; a number of more than 9 digits is no version we
        know (and ``int()`` refuses over 4,300 digits): as a major it is another major, as a
        minor a newer one."""
        if version is None:
            diag.warn("no_version", where, f"no format version found; read as {self.name}")
            return

        def clip(text: str) -> str:
            return text if len(text) <= 40 else text[:39] + "…"

        m = _VERSION.match(str(version))
        if m is None:
            diag.warn(
                "unreadable_version",
                where,
                f"format version {clip(str(version))!r} does not read as X.Y; read by shape as {self.name}",
            )
            return
        major, minor = m.group(1), m.group(2)
        if len(major) > 9 or int(major) != self.major:
            raise BadInputError(
                f"{diag.path}: {where}: {self.adapter} format version {clip(str(version))} has major {clip(str(int(major)) if len(major) <= 9 else major)}; "
                f"this adapter reads {self.name} only"
            )
        if len(minor) > 9 or int(minor) > self.minor:
            diag.warn(
                "unverified_profile",
                where,
                f"{self.adapter} {clip(str(version))} is newer than the verified profile {self.name}; read with it",
            )


def require(cond: Any, diag: Diagnostics, where: str, what: str) -> None:
    """Raise BadInputError (exit 65) ``<file>: <where>: <what>`` unless ``cond``: a required
    record shape is missing."""
    if not cond:
        raise BadInputError(f"{diag.path}: {where}: {what}")


# --------------------------------------------------------------------------- adapters


@record
class NativeResult(Record):
    """What an adapter returns: the trajectory, the profile it was read with, and the warnings."""

    trajectory: Trajectory
    profile: FormatProfile
    diagnostics: Diagnostics

    def __init__(self, trajectory: Trajectory, profile: FormatProfile, diagnostics: Diagnostics) -> None:
        self.trajectory = trajectory
        self.profile = profile
        self.diagnostics = diagnostics


#: the flag of the step a cut-off last line may belong to (:func:`flag_cut_off`)
CUT_OFF_FLAG = "truncated_line"


def flag_cut_off(result: NativeResult) -> int | None:
    """Flag the last step ``truncated_line`` when the file's last line was cut off (the reader's
    ``truncated_line`` warning), and return its number (None: no cut, or no step). The line
    came after every record read, so it may hold more of the last step: the rest of its action
    (Claude Code writes one reply over several lines, the text on one and each tool call on the
    next; Codex one item per line), or its observation. The steps before it are whole. Shared by
    every JSONL format: :func:`~pvisor.adapters.native.read_native` calls it."""
    steps = result.trajectory.steps
    if "truncated_line" not in result.diagnostics.counts or not len(steps):
        return None
    if isinstance(steps, LazySteps):
        result.trajectory.steps = steps.flagging(len(steps) - 1, CUT_OFF_FLAG)
    elif CUT_OFF_FLAG not in steps[-1].flags:
        steps[-1].flags.append(CUT_OFF_FLAG)
    return len(steps)


class NativeAdapter:
    """Interface of a native adapter module's ``ADAPTER``.

    Attributes: ``name`` (``--agent`` name), ``profiles`` (the format profiles, first the
    default), ``description`` (one line for ``pvisor adapters``).
    """

    name: str = ""
    description: str = ""
    profiles: tuple[FormatProfile, ...] = ()
    #: True when a directory can be read (OpenCode's storage tree); else a directory is refused
    reads_directories: bool = False
    #: True when one file holds several sessions and ``read`` takes ``session=ID`` (OpenCode)
    selects_sessions: bool = False

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when ``path`` looks like this adapter's format: its signature in
        :mod:`pvisor.adapters.native.signatures` (``head``: the file's start, ``b""`` for a
        directory; what :func:`pvisor.adapters.native.sniff_head` reads). Never raises."""
        from .signatures import signature_of

        return signature_of(self.name)(path, head)

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """Read ``path`` into a trajectory. Raises BadInputError (exit 65) for an unknown
        major version or a missing required shape, naming the file and line."""
        raise NotImplementedError


# --------------------------------------------------------------------------- helpers


def compact_json(obj: Any) -> str:
    """``obj`` as compact JSON text, keys in their order, non-ASCII kept: how an argument
    object (Anthropic ``input``, Gemini ``args``) becomes ``ToolCall.arguments_raw``, the same
    way the wire-protocol modules serialise it (:func:`pvisor.adapters.jsonio.dumps`: an
    object nested deeper than orjson writes is written by the standard library the same
    way). Raises BadInputError (exit 65) past the interpreter's recursion limit."""
    try:
        return dumps(obj).decode()
    except ValueError:
        raise BadInputError("a value nested too deep to write as JSON") from None


def object_call(call_id: str | None, name: str, args: Any, raw: Any = None) -> ToolCall:
    """A ToolCall whose arguments the format stores as an object."""
    return ToolCall(
        id=call_id,
        name=name,
        arguments_raw=compact_json(args if args is not None else {}),
        arguments=args if args is not None else {},
        raw=raw,
    )


def string_call(
    call_id: str | None, name: str, arguments: str, raw: Any = None, kind: str = "function"
) -> ToolCall:
    """A ToolCall whose arguments the format stores as a JSON string (kept exactly)."""
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError:
        parsed = None
    raw_text = arguments if isinstance(arguments, str) else compact_json(arguments)
    return ToolCall(id=call_id, name=name, arguments_raw=raw_text, arguments=parsed, kind=kind, raw=raw)


def order_results(step: Step, diag: Diagnostics, *, no_result: frozenset[str] = frozenset()) -> None:
    """Put ``step``'s results in the order of its tool calls (matched by call id); a call
    without a result gets an empty one marked ``{"interrupted": True}``, the step the flag
    ``interrupted`` and ``diag`` an ``interrupted`` warning. Calls the provider runs itself
    (kind ``server``) and calls named in ``no_result`` (OpenHands ``finish``) expect none.
    Results that answer no call are kept, after."""
    by_id = {r.call_id: r for r in step.observation.results}
    ordered = []
    for call in step.action.tool_calls:
        r = by_id.pop(call.id, None)
        if r is None:
            if call.kind == "server" or call.name in no_result:
                continue
            r = ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
            if "interrupted" not in step.flags:
                step.flags.append("interrupted")
            diag.warn(
                "interrupted",
                f"step {step.n}",
                f"tool call {call.id} ({call.name}) has no result in the file",
            )
        ordered.append(r)
    step.observation.results = ordered + list(by_id.values())


def left_out(traj: Trajectory, where: str, kind: str, reason: str) -> None:
    traj.left_out.append(LeftOut(where, kind, reason))


def as_dict(value: Any) -> dict:
    """``value`` when it is a JSON object, else ``{}``: a field of the wrong type reads as absent."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    """``value`` when it is a JSON array, else ``[]``."""
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    """``value`` when it is a string, else None (ids, names and parents of the wrong type)."""
    return value if isinstance(value, str) else None


def text_of(content: Any) -> str:
    """Text of a result or message content: a string as is; a list of blocks/parts: their
    ``text`` fields joined (Anthropic ``text`` blocks, Responses ``input_text``/``output_text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, str):
                out.append(b)
            elif isinstance(b, dict) and isinstance(b.get("text"), str):
                out.append(b["text"])
        return "".join(out)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return compact_json(content)


# --------------------------------------------------------------------------- uuid chains (Claude Code, Qwen Code)


def chain_depths(recs: dict[str, Any]) -> dict[str, int]:
    """Depth of every record of a ``uuid`` -> ``parentUuid`` chain: 1 for a root or a record
    whose parent is not in ``recs``, parent's depth + 1 otherwise; a cycle counts from where it
    closes. ``recs`` maps uuid to an object whose ``parent`` is the uuid it follows (None for a
    root). Iterative and memoised: every record is walked once."""
    depth: dict[str, int] = {}
    for uuid in recs:
        trail: list[str] = []
        on_trail: set[str] = set()
        cur: str | None = uuid
        while cur is not None and cur in recs and cur not in depth and cur not in on_trail:
            trail.append(cur)
            on_trail.add(cur)
            cur = recs[cur].parent
        d = depth.get(cur, 0) if cur is not None else 0
        for u in reversed(trail):
            d += 1
            depth[u] = d
    return depth


def chain_leaf(
    recs: dict[str, Any], depth: dict[str, int], candidates: Iterable[str], has_child: Callable[[str], bool]
) -> str | None:
    """The leaf a chain is walked back from: among ``candidates`` that ``has_child`` says
    nothing follows, the deepest (``depth`` from :func:`chain_depths`); ties: the later line
    (``recs[uuid].line``). Format rule (issue 6, "Order"): records out of time or file order,
    repeated, or replacing an earlier one by id are ordered by the format's own chain, file order
    only breaks ties. None when there is no candidate."""
    best: tuple[int, int] | None = None
    leaf = None
    for uuid in candidates:
        if has_child(uuid):
            continue
        key = (depth.get(uuid, 0), recs[uuid].line)
        if best is None or key > best:
            best, leaf = key, uuid
    return leaf


def walk_chain(recs: dict[str, Any], leaf: str | None, diag: Diagnostics) -> list[Any]:
    """The records from the root to ``leaf`` following ``parent`` links; a parent missing from
    ``recs`` ends the walk there with a ``broken_chain`` warning (the chain starts after it); a
    cycle ends it silently."""
    out: list[Any] = []
    seen: set[str] = set()
    cur = leaf
    while cur is not None and cur not in seen:
        seen.add(cur)
        rec = recs.get(cur)
        if rec is None:
            diag.warn(
                "broken_chain", "chain", f"parent uuid {cur} is not in the file; the chain starts after it"
            )
            break
        out.append(rec)
        cur = rec.parent
    out.reverse()
    return out


class SessionHeader:
    """What a chained JSONL format (Claude Code, Qwen Code) repeats on its records, and whether
    the file has the format's shape at all.

    The first ``version`` found goes into ``meta["agent_version"]``, the first string value of
    each of ``keys`` (``sessionId``, ``cwd``, ...) into ``meta[key]``, in the order first seen.
    The version is checked with ``profile`` when the first record of the format's own shape is
    seen (so another agent's file is refused for its shape, not for its version), or at
    :meth:`finish`, which refuses a file without such a record: ``shape`` says what was looked
    for (``"no Claude Code session line (...) in the file"``)."""

    def __init__(
        self, profile: FormatProfile, meta: dict[str, Any], keys: tuple[str, ...], shape: str
    ) -> None:
        self.profile, self.meta, self.keys, self.shape = profile, meta, keys, shape
        self.version: Any = None
        self.where: str | None = None
        self.first: tuple[int, Any] | None = None  # line and type of the first record
        self.shaped = False
        self.checked = False

    def see(
        self, obj: dict[str, Any], n: int, diag: Diagnostics, *, shaped: bool, version_here: bool = True
    ) -> None:
        """Take the fields of the object at line ``n`` (the version only when ``version_here``);
        ``shaped``: the object has the format's shape. Raises BadInputError (exit 65) for a
        version of another major."""
        if self.first is None:
            self.first = (n, obj.get("type"))
        if self.where is None and version_here and "version" in obj:
            self.version, self.where = obj.get("version"), f"line {n}"
            self.meta["agent_version"] = self.version
        for k in self.keys:
            if k not in self.meta and isinstance(obj.get(k), str):
                self.meta[k] = obj[k]
        if shaped and not self.shaped:
            self.shaped = True
            self.check(diag)

    def check(self, diag: Diagnostics) -> None:
        """:meth:`FormatProfile.check` on the version seen (or ``no_version``), once."""
        if not self.checked:
            self.checked = True
            self.profile.check(self.version if self.where is not None else None, self.where or "file", diag)

    def finish(self, diag: Diagnostics) -> None:
        """At the end of the file: BadInputError (exit 65) ``<file>: line <first>: <shape>``
        when no record had the shape (the type of the first record said; an empty file says
        so), else the version check if not done yet."""
        if self.first is None:
            raise BadInputError(f"{diag.path}: {self.shape} (no JSON object in it)")
        else:
            require(
                self.shaped,
                diag,
                f"line {self.first[0]}",
                f"{self.shape}; the first record is type {self.first[1]!r}",
            )
        self.check(diag)


def take_uuid(
    obj: dict[str, Any], n: int, recs: dict[str, Any], traj: Trajectory, diag: Diagnostics, noun: str
) -> str | None:
    """The uuid of the chain record ``obj`` at line ``n`` (a string), interned: a large file
    names each uuid twice (own and as a parent). None for an ``isSidechain`` record (a
    subagent's), left out. A uuid already in ``recs`` warns ``duplicate_record`` (the later
    ``noun``, "line" or "record", is used)."""
    if obj.get("isSidechain"):
        left_out(traj, f"line {n}", "sidechain", f"subagent (sidechain) {noun}, not the main loop")
        return None
    uuid = sys.intern(obj["uuid"])
    if uuid in recs:
        diag.warn(
            "duplicate_record",
            f"line {n}",
            f"uuid {uuid} repeated (first at line {recs[uuid].line}); the later {noun} is used",
        )
    return uuid


def interned(s: str | None) -> str | None:
    """``s`` interned (ids, names and types repeated over a large file kept once); None as is."""
    return sys.intern(s) if s else s


def pack_ref(ref: LineRef) -> int:
    """``ref`` as one int (offset, length below 2**32, joined flag), for adapters that keep a
    ref per record of a large file: a third of the memory of a LineRef object. :func:`unpack_ref`
    gives it back."""
    return (ref.offset << 33) | (ref.length << 1) | ref.joined


def unpack_ref(key: int) -> LineRef:
    """The :class:`LineRef` that :func:`pack_ref` packed into ``key``."""
    return LineRef(key >> 33, (key >> 1) & 0xFFFFFFFF, bool(key & 1))


def mend_chain(recs: dict[str, Any], diag: Diagnostics) -> None:
    """Mend a chain read from a damaged file: a record whose ``parent`` is not None and not in
    ``recs`` (its parent's line was lost or damaged) continues from the chain record before it
    in the file (what a lost line between them most likely was),
    with a ``broken_chain`` warning naming the line and the missing uuid; with no record before
    it, or when that record descends from it (a reversed file), it becomes a root. Real forks
    (a parent that exists) are untouched, so depth and leaf choice see one chain."""
    broken = [u for u, r in recs.items() if r.parent is not None and r.parent not in recs]
    if not broken:
        return
    by_line = sorted(recs, key=lambda u: recs[u].line)
    pos = {u: i for i, u in enumerate(by_line)}
    missing = {u: recs[u].parent for u in broken}
    mended: dict[str, str] = {}
    for own in broken:
        prev = by_line[pos[own] - 1] if pos[own] > 0 else None
        recs[own].parent = prev
        if prev is not None:
            mended[own] = prev
    # a new parent that descends from the record (a reversed file) closes a cycle: the record
    # becomes a root instead (one linear pass; only a cycle through a mended record is new)
    state: dict[str, int] = {}  # 1 on the trail, 2 done
    for start in list(mended):
        trail: list[str] = []
        cur: str | None = start
        while cur is not None and cur in recs and cur not in state:
            state[cur] = 1
            trail.append(cur)
            cur = recs[cur].parent
        if cur is not None and state.get(cur) == 1:
            for u in trail[trail.index(cur) :]:
                if u in mended:
                    recs[u].parent = None
                    del mended[u]
                    break
        for u in trail:
            state[u] = 2
    for own in sorted(broken, key=lambda u: recs[u].line):
        line = recs[own].line
        if own in mended:
            diag.warn(
                "broken_chain",
                f"line {line}",
                f"parent uuid {missing[own]} is not in the file; continued from line {recs[mended[own]].line}, the chain record before it",
            )
        else:
            diag.warn(
                "broken_chain",
                f"line {line}",
                f"parent uuid {missing[own]} is not in the file; the chain starts there",
            )


class LeftOutLines(Sequence[LeftOut]):
    """A trajectory's ``left_out`` for a file with a left-out record on most lines (Claude Code
    ``progress`` lines): each entry kept as a line number (or the index of a ``where`` string)
    and the index of its (kind, reason) pair, 8 bytes an entry instead of a LeftOut object of
    three strings; :class:`~pvisor.journal.model.LeftOut` objects are made when read. Reads as
    the list of LeftOut(where, kind, reason) it stands for (``len``, index, iteration, ``==``
    with a list); :meth:`append` takes a LeftOut, :meth:`add` a line number."""

    def __init__(self) -> None:
        from array import array

        self._where = array("q")  # line number, or -(index into _wheres) - 1
        self._pair = array("I")
        self._pairs: list[tuple[str, str]] = []
        self._pair_ix: dict[tuple[str, str], int] = {}
        self._wheres: list[str] = []

    def _code(self, kind: str, reason: str) -> int:
        key = (kind, reason)
        i = self._pair_ix.get(key)
        if i is None:
            i = self._pair_ix[key] = len(self._pairs)
            self._pairs.append(key)
        return i

    def add(self, line: int, kind: str, reason: str) -> None:
        """Left out: the record at line ``line`` (where ``"line <line>"``)."""
        self._where.append(line)
        self._pair.append(self._code(kind, reason))

    def append(self, lo: LeftOut) -> None:
        w = lo.where
        if w.startswith("line ") and w[5:].isdigit() and not w[5:].startswith("0"):
            self._where.append(int(w[5:]))
        else:
            self._where.append(-len(self._wheres) - 1)
            self._wheres.append(w)
        self._pair.append(self._code(lo.kind, lo.reason))

    def _get(self, i: int) -> LeftOut:
        w = self._where[i]
        kind, reason = self._pairs[self._pair[i]]
        return LeftOut(f"line {w}" if w >= 0 else self._wheres[-w - 1], kind, reason)

    def __len__(self) -> int:
        return len(self._where)

    @overload
    def __getitem__(self, i: int) -> LeftOut: ...
    @overload
    def __getitem__(self, i: slice) -> list[LeftOut]: ...
    def __getitem__(self, i: int | slice) -> LeftOut | list[LeftOut]:
        if isinstance(i, slice):
            return [self._get(j) for j in range(len(self._where))[i]]
        return self._get(range(len(self._where))[i])

    def __iter__(self) -> Iterator[LeftOut]:
        for i in range(len(self._where)):
            yield self._get(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, LeftOutLines)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"LeftOutLines({len(self)} records)"
