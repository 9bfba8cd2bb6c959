"""JSON records read from a native file: the streaming JSONL reader with its damage rules and
limits, objects read again by reference, and a single JSON document.

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
    a following line that is a JSON object on its own ends the attempt;
  * a line that is a truncated record with a complete one glued after it (a writer cut off
    mid-line, the next write appended with no newline between) yields the complete one, with a
    warning that a truncated record preceded it (``glued_record``), and the complete records
    before it when there are (written with no newline between: :func:`complete_heads`); the search is bounded
    (:data:`GLUE_BUDGET_FACTOR`, :data:`GLUE_MAX_BYTES`), a line over it reported as not JSON;
  * a line that is a record missing only its end (closed with a few brackets it parses) is a
    record cut off, not a glued one: ``truncated_line`` when it is the last line, else
    ``malformed_line``.
- :class:`LineRef`, :func:`pack_ref`, :func:`unpack_ref` and :class:`JsonlSource`: where an
  object is in the file, and the object read again from there when a step is built.
- :func:`read_json_document`: a single-document JSON file (mini-swe-agent, OpenHands, ...),
  with the same UTF-8 fallback (:func:`loads_lenient`).

Warnings go to a :class:`~pvisor.adapters.native.diagnostics.Diagnostics`; a file that changed
while it was read raises BadInputError (exit 65). Depends on ``pvisor.journal`` only.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Iterator

import orjson

from pvisor.core import progress
from pvisor.core.errors import BadInputError
from pvisor.core.lazyre import LazyPattern
from pvisor.core.record import FrozenRecord, Record

from .diagnostics import WARNING_CODES, Diagnostics, NativeWarning

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
#: a line that is not JSON is tried at most this many times for a complete record glued after
#: a truncated one (:func:`glued_record`) ...
GLUE_MAX_TRIES = 256
#: ... and its candidate parses read at most this many times the line's length in all ...
GLUE_BUDGET_FACTOR = 4
#: ... and never more than this many bytes (8 MiB): a candidate whose rest of the line is longer
#: than what is left of the budget is not parsed, so a long line of nested openings (each ``{"``
#: a candidate whose parse reads to the end) costs a few parses, not one per candidate
GLUE_MAX_BYTES = 8 << 20
#: a line that is not JSON but parses closed with at most this many brackets is a record cut off
#: before its end (:func:`closes_as_record`), never searched for a glued one
CLOSE_MAX_BRACKETS = 8
#: ... when it holds at most this many brackets outside strings (each is walked once)
CLOSE_SCAN_MAX = 1 << 20


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


class _Pending(Record, record=True):
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


class LineRef(FrozenRecord, record=True):
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
    line. The ref lets :meth:`JsonlSource.load` read the object again later. A line that parses
    is read here; a NUL block and an object split by raw newlines go to the steps below."""
    pending: _Pending | None = None  # an object split by raw newlines, being rejoined
    unclosed: int | None = None  # the line of a record cut off before its end, newline kept
    for n, offset, line, ended in _raw_lines(path):
        if line.endswith(b"\r"):
            line = line[:-1]
        if NUL in line:
            offset, line = _skip_nul_block(n, offset, line, diag)
            if pending is not None:
                diag.add(_give_up(pending, n - 1))
                pending = None
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
                diag.add(_give_up(pending, n - 1))
                pending = None
            else:
                ok = False  # a fragment that happens to be JSON ("123", "]"): keep joining
        if ok and unclosed is not None:
            diag.add(_cut_record(unclosed, last=False))
            unclosed = None
        if ok:
            for f in flags:
                diag.warn(f, f"line {n}", WARNING_CODES[f])
            if not isinstance(obj, dict):
                diag.warn("not_an_object", f"line {n}", f"a JSON {type(obj).__name__}, expected an object")
                continue
            yield n, obj, LineRef(offset, len(line))
        elif pending is None:
            if unclosed is not None:  # a line follows the record cut off before its end
                diag.add(_cut_record(unclosed, last=False))
                unclosed = None
            # a record missing only its end (a "}" or a few brackets) is cut off, not glued: its
            # last nested object would otherwise be read as a record
            if ended and closes_as_record(line):
                unclosed = n  # the last line's cut (truncated_line) unless another line follows
                continue
            # a glued line ends with the newline its complete record's writer wrote; a last line
            # cut off without one may end inside the cut record, right after a nested object
            glued = glued_record(line).found if ended else None
            if glued is not None:
                cut, obj = glued
                heads, rest = complete_heads(line[:cut])
                if rest:
                    what = (
                        f"a truncated record ({rest} bytes, not JSON) is followed on the same line by a "
                        "complete one (a writer cut off mid-line, the next write appended); the complete "
                        "one is read, the truncated one skipped"
                    )
                else:
                    what = f"{len(heads) + 1} complete records on one line (no newline between): each is read"
                diag.warn("glued_record", f"line {n}", what)
                for start, end, head in heads:
                    yield n, head, LineRef(offset + start, end - start)
                yield n, obj, LineRef(offset + cut, len(line) - cut)
                continue
            pending = _start_rejoin(n, offset, line, ended, diag)
        else:
            pending, joined = _rejoin(pending, n, offset, line, ended, diag)
            if joined is not None:
                yield joined
    if unclosed is not None:
        diag.add(_cut_record(unclosed, last=True))
    if pending is not None:
        last = pending.first + len(pending.parts) - 1
        if len(pending.parts) == 1:
            diag.warn("malformed_line", f"line {pending.first}", "not JSON; skipped")
        else:
            diag.warn("malformed_line", _where(pending.first, last), "not JSON, not even joined; skipped")


class GlueSearch(FrozenRecord, record=True):
    """What :func:`glued_record` found and what it cost: ``found`` (byte offset in the line,
    object) or None, ``tries`` (candidate parses), ``parsed`` (bytes those parses read: a
    parse that failed read up to where it stopped)."""

    found: tuple[int, dict[str, Any]] | None
    tries: int
    parsed: int

    def __init__(self, found: tuple[int, dict[str, Any]] | None, tries: int, parsed: int) -> None:
        _set(self, "found", found)
        _set(self, "tries", tries)
        _set(self, "parsed", parsed)


def glue_budget(length: int) -> int:
    """The bytes :func:`glued_record`'s candidate parses may read on a line of ``length`` bytes:
    :data:`GLUE_BUDGET_FACTOR` times the length, at most :data:`GLUE_MAX_BYTES`."""
    return min(GLUE_BUDGET_FACTOR * length, GLUE_MAX_BYTES)


def glued_record(line: bytes) -> GlueSearch:
    """The complete JSON object that ends ``line`` after a truncated one (a writer cut off
    mid-line, and the next write appended its record with no newline between), as a
    :class:`GlueSearch` (``found``: byte offset in ``line`` and object, None when no such object
    ends the line or the budget ran out first). Candidates are the ``{"`` after the line's
    start, left to right (the first whose rest parses is the outermost object: a nested object's
    rest ends in an unmatched ``}``). A ``{"`` inside a JSON string is escaped (``{\\"``), so
    no string's text is mistaken for a record. The work is bounded: at most
    :data:`GLUE_MAX_TRIES` candidates, and the bytes their parses read stay within
    :func:`glue_budget` (a candidate whose rest is longer than what is left of it is passed over;
    a parse that fails reads up to where it stops), so a line of nested openings whose every
    candidate parses to the end is given up after a few parses (the caller then reports it as
    not JSON). Only a line ended by a newline is tried (the caller's rule): a cut-off last line
    may end right after a nested object of its own."""
    if not line.rstrip().endswith(b"}"):
        return GlueSearch(None, 0, 0)
    budget = glue_budget(len(line))
    at = line.find(b'{"', 1)
    tries = parsed = 0
    while at > 0 and tries < GLUE_MAX_TRIES:
        rest = len(line) - at
        if parsed + rest > budget:  # later candidates have shorter rests
            at = line.find(b'{"', len(line) - (budget - parsed))
            if at <= 0:
                break
            continue
        tries += 1
        try:
            obj, _ = loads_lenient(line[at:])
            parsed += rest
        except ValueError as exc:
            obj = None
            # where the parse stopped (JSONDecodeError.pos); a parse too deep read it all
            parsed += min(rest, getattr(exc, "pos", rest) + 1)
        if isinstance(obj, dict):
            return GlueSearch((at, obj), tries, parsed)
        at = line.find(b'{"', at + 1)
    return GlueSearch(None, tries, parsed)


def complete_heads(head: bytes) -> tuple[list[tuple[int, int, dict[str, Any]]], int]:
    """The complete objects at the start of ``head`` (what precedes a glued record on its line),
    one after another as a writer that left out the newlines wrote them: ([(start byte, end
    byte, object)], the bytes left after them: a truncated record's, 0 when none). One parse
    pass over ``head``; the first bytes that do not start a complete object end it."""
    text = head.decode("utf-8", "surrogateescape")
    decoder = json.JSONDecoder()
    out: list[tuple[int, int, dict[str, Any]]] = []
    pos = byte = 0
    while pos < len(text):
        if text[pos] in " \t\r":
            pos, byte = pos + 1, byte + 1
            continue
        if text[pos] != "{":
            break
        try:
            end = decoder.raw_decode(text, pos)[1]
            end_byte = byte + len(text[pos:end].encode("utf-8", "surrogateescape"))
            obj, _ = loads_lenient(head[byte:end_byte])  # as JsonlSource.load reads it again
        except ValueError:
            break
        out.append((byte, end_byte, obj))
        pos, byte = end, end_byte
    return out, len(head) - byte


_STRING = LazyPattern(rb'"[^"\\]*(?:\\.[^"\\]*)*"', flags=0)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b'[]{}"')
_CLOSER = {ord("{"): b"}", ord("["): b"]"}


def closes_as_record(line: bytes) -> bool:
    """True when ``line``, not JSON, is a JSON object cut off before its end: closed with the at
    most :data:`CLOSE_MAX_BRACKETS` brackets it leaves open (outside strings), it parses as an
    object. Such a line is a record cut off (a writer stopped before its last ``}``), never a
    truncated record with another glued after it, though its last nested object ends the line.
    A line ending inside a string is not closed by brackets: False."""
    if not line.lstrip().startswith(b"{"):
        return False
    brackets = _STRING.sub(b"", line).translate(None, _NOT_BRACKET)
    if b'"' in brackets or len(brackets) > CLOSE_SCAN_MAX:  # a string left open; too many to walk
        return False
    stack: list[int] = []
    for b in brackets:
        if b in _CLOSER:
            stack.append(b)
        elif not stack or _CLOSER[stack.pop()] != bytes((b,)):
            return False
        if len(stack) > 1024:  # deeper than any parser goes: not a record missing its end
            return False
    if not stack or len(stack) > CLOSE_MAX_BRACKETS:
        return False
    try:
        obj, _ = loads_lenient(line + b"".join(_CLOSER[b] for b in reversed(stack)))
    except ValueError:
        return False
    return isinstance(obj, dict)


def _cut_record(n: int, last: bool) -> NativeWarning:
    """The warning of line ``n``, a record cut off before its end with its newline kept:
    ``truncated_line`` when it is the file's last line (the step it may belong to is flagged,
    as for a last line cut without its newline), else ``malformed_line`` (damage in the middle
    of the file)."""
    what = "a record cut off before its end (it parses with its closing brackets added)"
    if last:
        return NativeWarning("truncated_line", f"line {n}", f"the last line is {what}; skipped")
    return NativeWarning("malformed_line", f"line {n}", f"not JSON: {what}; skipped")


def _give_up(p: _Pending, last: int) -> NativeWarning:
    """The ``malformed_line`` warning of a rejoin attempt that ended at line ``last``."""
    return NativeWarning(
        "malformed_line",
        f"line {p.first}",
        "not JSON" + (f" (nor with the {last - p.first} lines after it joined)" if last > p.first else ""),
    )


def _skip_nul_block(n: int, offset: int, line: bytes, diag: Diagnostics) -> tuple[int, bytes]:
    """The text after the last NUL byte of line ``n`` (stripped) and its file offset, with a
    ``nul_block`` warning."""
    cut = line.rindex(NUL) + 1
    after = line[cut:].strip()
    offset += cut + len(line[cut:]) - len(line[cut:].lstrip())
    nuls = line.count(NUL)
    diag.warn(
        "nul_block",
        f"line {n}",
        f"{nuls} NUL bytes skipped" + ("; the text after them is read" if after else ""),
    )
    return offset, after


def _start_rejoin(n: int, offset: int, line: bytes, ended: bool, diag: Diagnostics) -> _Pending | None:
    """A line that does not parse, no rejoin under way: the start of an object split by raw
    newlines when it opens one, else skipped with a warning (``truncated_line`` for a last line
    without a newline, ``malformed_line``)."""
    if not ended:
        diag.warn("truncated_line", f"line {n}", "the last line is cut off (no newline, not JSON); skipped")
        return None
    if not line.lstrip().startswith(b"{"):
        diag.warn("malformed_line", f"line {n}", "not JSON; skipped")
        return None
    return _Pending(n, [line], len(line), offset)


def _rejoin(
    p: _Pending, n: int, offset: int, line: bytes, ended: bool, diag: Diagnostics
) -> tuple[_Pending | None, tuple[int, dict[str, Any], LineRef] | None]:
    """Line ``n`` (at ``offset``) added to the rejoin ``p``: (the rejoin still under way or
    None, the object read when the lines joined parse as one). Past :data:`REJOIN_MAX_LINES`
    lines or :data:`REJOIN_MAX_BYTES` bytes, or cut off at the end of the file, the attempt is
    given up with a warning."""
    p.parts.append(line)
    p.size += len(line) + 1
    if p.size > REJOIN_MAX_BYTES or len(p.parts) > REJOIN_MAX_LINES:
        diag.warn(
            "malformed_line",
            _where(p.first, n),
            f"not JSON; a rejoin went past {REJOIN_MAX_LINES} lines or {REJOIN_MAX_BYTES} bytes; skipped",
        )
        return None, None
    try:
        obj, flags = loads_lenient(b"\n".join(p.parts), strict=False)
    except ValueError:
        if not ended:
            diag.warn("truncated_line", _where(p.first, n), "cut off at the end of the file; skipped")
            return None, None
        return p, None
    if not isinstance(obj, dict):
        return p, None
    diag.warn("rejoined_lines", _where(p.first, n), "an object split by raw newlines, read joined")
    for f in flags:
        diag.warn(f, f"line {p.first}", WARNING_CODES[f])
    return None, (p.first, obj, LineRef(p.offset, offset + len(line) - p.offset, joined=True))


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
                f"{self.path}: the file changed while it was read (bytes "
                f"{ref.offset}-{ref.offset + ref.length} no longer hold a JSON object)"
            )
        return obj

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


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


def pack_ref(ref: LineRef) -> int:
    """``ref`` as one int (offset, length below 2**32, joined flag), for adapters that keep a
    ref per record of a large file: a third of the memory of a LineRef object. :func:`unpack_ref`
    gives it back."""
    return (ref.offset << 33) | (ref.length << 1) | ref.joined


def unpack_ref(key: int) -> LineRef:
    """The :class:`LineRef` that :func:`pack_ref` packed into ``key``."""
    return LineRef(key >> 33, (key >> 1) & 0xFFFFFFFF, bool(key & 1))
