"""The JSON a scrub must keep (:mod:`pvisor.journal.scrub`): whether a replacement broke a body
or cell that was JSON (a whole document, or one line of a stream), and :func:`scrub_split`, the
text removed where a streamed reply split it between its server-sent events."""

from __future__ import annotations

from typing import Any

import orjson

from .scrub_pattern import Pattern


def _parses(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def _json_lines(data: bytes) -> int:
    """How many lines of ``data`` are JSON documents, after an SSE ``data:`` field name (a
    stream's events, a JSON Lines file)."""
    n = 0
    for line in data.splitlines():
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if line[:1] in (b"{", b"[") and _parses(line):
            n += 1
    return n


def json_broken(old: bytes, new: bytes) -> bool:
    """Whether replacing turned JSON into something that is not: a whole document, or one of
    the JSON lines of a stream (a regex that matched into an escape such as ``\\n`` leaves
    ``\\[scrubbed]``)."""
    if _parses(new):  # the usual case, and one parse: the old bytes are parsed only when it fails
        return False
    if _parses(old):
        return True
    return _json_lines(new) < _json_lines(old)


def _string_leaves(value: Any, path: tuple, out: list) -> None:
    """(path, container, key) of every string in ``value``, in document order."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                out.append((path + (k,), value, k))
            elif isinstance(v, (dict, list)):
                _string_leaves(v, path + (k,), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, str):
                out.append((path + (i,), value, i))
            elif isinstance(v, (dict, list)):
                _string_leaves(v, path + (i,), out)


def scrub_split(data: bytes, pattern: Pattern) -> tuple[bytes, int]:
    """A streamed reply (server-sent events) with the text removed where the stream split it
    between events: each ``data:`` line's JSON is read, the strings at one JSON path (a text
    delta, a tool call's argument fragments) are joined in stream order, and every match in
    the joined text that spans more than one event is replaced: the first event's part of it
    by the replacement, the others' parts by nothing. The events changed are written again as
    compact JSON (the others keep their bytes). Returns the body and the number of matches.
    A match within one event was replaced as bytes already (:meth:`Pattern.sub`)."""
    if b"data:" not in data:
        return data, 0
    lines = data.splitlines(keepends=True)
    events: dict[int, Any] = {}
    groups: dict[tuple, list] = {}
    for i, line in enumerate(lines):
        if not line.startswith(b"data:"):
            continue
        try:
            obj = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, (dict, list)):
            continue
        leaves: list = []
        _string_leaves(obj, (), leaves)
        if leaves:
            events[i] = obj
        for path, container, key in leaves:
            groups.setdefault(path, []).append((i, container, key))
    changed: set[int] = set()
    n = 0
    repl = pattern.replacement
    for parts in groups.values():
        if len(parts) < 2:
            continue
        pieces = [c[k].encode("utf-8", "surrogatepass") for _, c, k in parts]
        joined = b"".join(pieces)
        spans = pattern.spans(joined)
        if not spans:
            continue
        bounds, pos = [], 0
        for piece in pieces:
            bounds.append((pos, pos + len(piece)))
            pos += len(piece)
        cut: list[list[tuple[int, int, bool]]] = [[] for _ in pieces]  # per piece: (from, to, first)
        for start, end in spans:
            covered = [j for j, (a, b) in enumerate(bounds) if a < end and b > start]
            if len(covered) < 2:
                continue  # within one event: replaced as bytes already
            n += 1
            for k, j in enumerate(covered):
                a, b = bounds[j]
                cut[j].append((max(start, a) - a, min(end, b) - a, k == 0))
        for j, cuts in enumerate(cut):
            if not cuts:
                continue
            piece = pieces[j]
            for frm, to, first in sorted(cuts, reverse=True):
                piece = piece[:frm] + (repl.encode() if first else b"") + piece[to:]
            line_no, container, key = parts[j]
            # a cut inside a multi-byte character drops its remains (a regex on bytes can do that)
            container[key] = piece.decode("utf-8", "ignore")
            changed.add(line_no)
    if not changed:
        return data, 0
    for i in changed:
        line = lines[i]
        ending = line[len(line.rstrip(b"\r\n")) :]
        sep = b" " if line.startswith(b"data: ") else b""
        lines[i] = b"data:" + sep + orjson.dumps(events[i]) + ending
    return b"".join(lines), n
