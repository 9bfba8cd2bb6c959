"""Reading a single-document JSON trajectory (mini-swe-agent, SWE-agent, OpenHands, OpenCode
export, Gemini CLI's legacy JSON) within the issue's memory rule: "single-document JSON
formats may use up to 4x the file size".

A whole ``orjson.loads`` holds the file's bytes and the parser's working copy next to the
parsed value (about 4.3x the file size at 200 MB). :func:`read_document` therefore parses a
large file's big array (``messages``, ``history``, a top-level event list) in batches of
elements from a read-only memory map, and the rest of the document with a placeholder in
the array's place; anything unexpected falls back to the whole parse, which gives the same
value and the same errors. Figures in docs/benchmarks.md.
"""

from __future__ import annotations

import os
import mmap
import re
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from pvisor.core.errors import BadInputError

from .diagnostics import WARNING_CODES, Diagnostics
from .jsonl import loads_lenient, read_json_document

if TYPE_CHECKING:
    from pathlib import Path


def read_document(path: Path, diag: Diagnostics, expected: str, arrays: tuple[str, ...] = ()) -> Any:
    """The single JSON document in ``path`` (:func:`.base.read_json_document`); when it is not
    one, BadInputError (exit 65) naming the file, why, and the ``expected`` shape: an empty
    file, JSON Lines, and nesting too deep for the parser (a RecursionError otherwise) included.
    Shared by the single-document adapters (mini-swe-agent, SWE-agent, OpenHands, OpenCode
    export); its place is base.py.

    A file of :data:`SPLIT_MIN` bytes or more is parsed in pieces (:func:`_read_split`): a
    top-level array, or the arrays under the top-level keys ``arrays``, in batches of elements
    of about :data:`SPLIT_CHUNK` bytes. Same value and warnings as one parse; peak memory is
    the parsed value plus one batch (one parse of the whole file holds the file's bytes and
    orjson's intermediate document, about 2.3x the file size, on top of the value)."""
    size = os.stat(path).st_size
    if size == 0:
        raise BadInputError(f"{path}: the file is empty; expected {expected}")
    if size >= SPLIT_MIN:
        got = _read_split(path, arrays)
        if got is not None:
            value, flags = got
            for f in ("invalid_utf8", "lone_surrogate"):
                if f in flags:
                    diag.warn(f, "document", WARNING_CODES[f])
            return value
    try:
        return read_json_document(path, diag)
    except BadInputError as exc:
        raise BadInputError(f"{exc.message}; expected {expected}") from None
    except RecursionError:
        raise BadInputError(
            f"{path}: not a JSON document (nested too deep to parse); expected {expected}"
        ) from None


#: files at least this big (bytes) are parsed in pieces by :func:`read_document`
SPLIT_MIN = 16 << 20
#: bytes of array elements parsed at once (orjson's transient memory for one piece is about 13x this)
SPLIT_CHUNK = 256 << 10
#: cut points tried for one batch before giving up on splitting (then one whole parse)
_MAX_TRIES = 64
_WS = b" \n\r\t"  # JSON whitespace
_KEY = re.compile(rb'\{\s*"[^"\\]*"')  # an object's opening brace through its first key


class _NoSplit(Exception):
    """The file cannot be split as expected: parse it whole (same result, more memory)."""


def _read_split(path: Path, arrays: tuple[str, ...]) -> tuple[Any, set[str]] | None:
    """``path`` parsed in pieces, as ``(value, flags)`` (flags as :func:`.base.loads_lenient`
    gives them, for the whole file); None when it does not split (not JSON, no such array,
    elements that are not objects...): the caller parses it whole, which also words the error.

    How: the file is mapped read-only (``mmap``). An array is read in batches: a batch ends
    before an occurrence of the bytes that open its first element (``{"info"``, say) preceded
    by ``}`` and ``,``; ``[`` + batch + ``]`` parsing as JSON proves the cut is between two
    elements of this array (a cut inside a string or a nested value leaves it unbalanced), else
    the next occurrence is tried. The last batch ends at a ``]`` that parses the same way. The
    rest of the document (a top-level object's other members) is parsed with a placeholder
    string in each array's place, and the placeholder must come back as the value of its key.
    Pages already parsed are dropped from the mapping (``MADV_DONTNEED``): they do not add to
    the resident size."""
    flags: set[str] = set()

    def load(data: bytes) -> Any:
        value, fl = loads_lenient(data)  # ValueError when not JSON
        flags.update(fl)
        return value

    try:
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        head = mm[:4096]
        start = len(head) - len(head.lstrip(_WS))
        if mm[start : start + 1] == b"[":
            end = mm.rfind(b"]")
            if end < 0 or mm[end + 1 :].strip(_WS):
                return None
            return _read_array(mm, start, load, last=end)[0], flags
        if mm[start : start + 1] != b"{" or not arrays:
            return None
        found = []
        for key in arrays:
            m = re.compile(rb'"' + re.escape(key.encode()) + rb'"\s*:\s*\[').search(mm, start)
            if m is not None:
                found.append((m.end() - 1, key))
        spans: list[tuple[int, int, str, list[Any]]] = []
        pos = start
        for open_at, key in sorted(found):  # in the file's order
            if open_at < pos:
                return None
            items, pos = _read_array(mm, open_at, load)
            spans.append((open_at, pos, key, items))
        if not spans:
            return None
        marks = [f"\x00pvisor split {uuid.uuid4().hex} {i}" for i in range(len(spans))]
        skeleton = bytearray()
        prev = 0
        for (a, b, _k, _v), mark in zip(spans, marks):
            skeleton += mm[prev:a]
            skeleton += orjson.dumps(mark)
            prev = b
        skeleton += mm[prev:]
        value = load(bytes(skeleton))
        del skeleton
        if not isinstance(value, dict):
            return None
        for (_a, _b, key, items), mark in zip(spans, marks):
            if value.get(key) != mark:
                return None  # a nested key of that name, or the key twice
            value[key] = items
        return value, flags
    except (_NoSplit, ValueError, RecursionError):
        return None
    finally:
        mm.close()


def _read_array(
    mm: mmap.mmap, open_at: int, load: Callable[[bytes], Any], last: int | None = None
) -> tuple[list[Any], int]:
    """``(elements, end)``: the elements of the JSON array whose ``[`` is at byte ``open_at`` of
    ``mm``, parsed in batches (rules in :func:`_read_split`), and the byte after its ``]``;
    ``last``: the byte of that ``]`` when known. Raises _NoSplit or ValueError."""
    items: list[Any] = []
    pos = open_at + 1
    while pos < len(mm) and mm[pos] in _WS:
        pos += 1
    if mm[pos : pos + 1] == b"]":
        return items, pos + 1
    m = _KEY.match(mm, pos)
    if m is None:
        raise _NoSplit  # elements that are not objects
    needle = m.group()
    dropped = 0
    gap = SPLIT_CHUNK  # then 0: the last elements one batch each, so the last batch is one element
    while True:
        q = mm.find(needle, pos + max(gap, 1))
        done = False
        for _ in range(_MAX_TRIES):
            if q < 0 or (last is not None and q > last):
                break
            cut = q - 1
            while cut > pos and mm[cut] in _WS:
                cut -= 1
            if mm[cut] == 0x2C:  # ","
                cut -= 1
                while cut > pos and mm[cut] in _WS:
                    cut -= 1
                if mm[cut] == 0x7D:  # "}"
                    try:
                        items.extend(load(b"[" + mm[pos : cut + 1] + b"]"))
                    except ValueError:
                        pass
                    else:
                        pos = q
                        done = True
                        break
            q = mm.find(needle, q + 1)
        else:
            if gap:
                raise _NoSplit  # too many false cut points
        if not done:
            if gap:
                gap = 0
                continue
            break
        if pos - dropped > (16 << 20) and hasattr(mmap, "MADV_DONTNEED"):  # parsed pages: out of the RSS
            upto = (pos - (1 << 20)) // mmap.PAGESIZE * mmap.PAGESIZE
            mm.madvise(mmap.MADV_DONTNEED, 0, upto)
            dropped = upto
    # the last batch: up to the `]` that closes the array
    j = pos if last is None else last
    for _ in range(_MAX_TRIES):
        j = mm.find(b"]", j) if last is None else j
        if j < 0:
            break
        try:
            items.extend(load(b"[" + mm[pos : j + 1]))
        except ValueError:
            if last is not None:
                raise
            j += 1
            continue
        return items, j + 1
    raise _NoSplit
