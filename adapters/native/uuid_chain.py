"""The uuid chains of Claude Code and Qwen Code session files: each record names the record it
follows (``uuid`` -> ``parentUuid``); the conversation is the chain walked back from its leaf,
never the file order (issue 6, "Order").

- :class:`SessionHeader`: the fields a chained format repeats on its records, the version check
  and the refusal of a file without the format's shape;
- :func:`take_uuid`, :func:`mend_chain`, :func:`chain_depths`, :func:`chain_leaf`,
  :func:`walk_chain`: a record's uuid, a damaged chain mended (``broken_chain`` warnings), the
  depth of each record, the leaf chosen and the walk from the root to it;
- :class:`CompactChain`: the same for a file of many chain lines, kept in arrays (indexes,
  parents, line numbers, kinds) instead of one object a record.

``recs`` maps a uuid to an object with ``parent`` (the uuid it follows, None for a root) and
``line`` (its line number). Warnings go to a
:class:`~pvisor.adapters.native.diagnostics.Diagnostics`; a file without the shape raises
BadInputError (exit 65).
"""

from __future__ import annotations

import sys
from array import array
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pvisor.core.errors import BadInputError
from pvisor.journal.model import Trajectory

from .assembly import left_out
from .diagnostics import require

if TYPE_CHECKING:
    from .base import FormatProfile
    from .diagnostics import Diagnostics

#: :class:`CompactChain`: the parent index of a root, and of a line whose parent is not seen yet
ROOT, UNRESOLVED = -1, -2


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


def mend_chain(recs: dict[str, Any], diag: Diagnostics) -> set[int]:
    """Mend a chain read from a damaged file: a record whose ``parent`` is not None and not in
    ``recs`` (its parent's line was lost or damaged) continues from the chain record before it
    in the file (what a lost line between them most likely was),
    with a ``broken_chain`` warning naming the line and the missing uuid; with no record before
    it, or when that record descends from it (a reversed file), it becomes a root. Real forks
    (a parent that exists) are untouched, so depth and leaf choice see one chain. Returns the
    line numbers of the records whose parent was missing (a gap before each)."""
    broken = [u for u, r in recs.items() if r.parent is not None and r.parent not in recs]
    if not broken:
        return set()
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
                f"parent uuid {missing[own]} is not in the file; continued from line "
                f"{recs[mended[own]].line}, the chain record before it",
            )
        else:
            diag.warn(
                "broken_chain",
                f"line {line}",
                f"parent uuid {missing[own]} is not in the file; the chain starts there",
            )
    return {recs[u].line for u in broken}


class CompactChain:
    """The chain lines of one file, compactly (issue 6, "Scale": a 200 MB session with progress
    lines has some 500k of them): line ``i`` (in order of first appearance) is ``ids[uuid]``;
    ``parent[i]`` its parent's index (``ROOT``; ``UNRESOLVED`` while the parent has not been
    seen: ``pending`` holds its uuid), ``line[i]`` its line number, ``kind[i]`` a kind (low three
    bits) and flags. Only user lines with text (``text_ref``) and assistant lines (``msg_id``)
    keep more. ``key`` is the form a uuid is kept under (Claude Code's: a canonical uuid as its
    128-bit int); ``talk``: the kinds that make a conversation (:meth:`depths` counts them).
    Used by Claude Code, whose sessions are the largest."""

    def __init__(self, key: Callable[[str], int | str], talk: tuple[int, ...]) -> None:
        self.key = key
        self.talk = talk
        self.ids: dict[int | str, int] = {}  # key(uuid) -> index
        self.parent = array("i")
        self.line = array("i")
        self.kind = bytearray()
        self.pending: dict[int, str] = {}
        self.text_ref: dict[int, int] = {}
        self.msg_id: dict[int, str] = {}
        #: indexes of the lines whose parent is not in the file (set by :meth:`mend`): a gap
        #: before each, bridged or a new root
        self.bridged: frozenset[int] = frozenset()

    def add(self, uuid: str, parent: str | None, n: int, kind: int) -> tuple[int, bool]:
        """Index of the line with ``uuid`` at line ``n`` and whether the uuid was seen before
        (a repeated uuid replaces the earlier line, keeping its index)."""
        uuid_key = self.key(uuid)
        i = self.ids.get(uuid_key)
        again = i is not None
        if i is None:
            i = self.ids[uuid_key] = len(self.line)
            self.parent.append(ROOT)
            self.line.append(n)
            self.kind.append(kind)
        else:
            self.line[i], self.kind[i] = n, kind
            self.pending.pop(i, None)
            self.text_ref.pop(i, None)
            self.msg_id.pop(i, None)
        j = self.ids.get(self.key(parent)) if parent is not None else ROOT
        if j is None:
            self.parent[i] = UNRESOLVED
            self.pending[i] = parent
        else:
            self.parent[i] = j
        return i, again

    def mend(self, diag: Diagnostics) -> None:
        """Parents seen after their children resolved; a parent not in the file (its line lost
        or damaged): the line continues from the chain line before it in the file, with a
        ``broken_chain`` warning naming the line and the missing uuid (a root when there is none
        before it or that one descends from it: a reversed file)."""
        broken: list[int] = []
        for i, uuid in self.pending.items():
            j = self.ids.get(self.key(uuid))
            if j is None:
                broken.append(i)
            else:
                self.parent[i] = j
        if not broken:
            self.pending = {}
            return
        self.bridged = frozenset(broken)
        line, parent = self.line, self.parent
        by_line = sorted(range(len(line)), key=line.__getitem__)
        wanted = set(broken)
        pos = {i: k for k, i in enumerate(by_line) if i in wanted}
        mended: dict[int, int] = {}  # line index -> the line before it that it now follows
        for i in broken:
            prev = by_line[pos[i] - 1] if pos[i] > 0 else -1
            parent[i] = prev
            if prev >= 0:
                mended[i] = prev
        # a mended line whose new parent descends from it (a reversed file) closes a cycle:
        # it becomes a root instead (one linear pass; only a cycle through a mended line is new)
        state = bytearray(len(line))  # 0 not seen, 1 on the trail, 2 done
        for start in list(mended):
            trail: list[int] = []
            cur = start
            while cur >= 0 and state[cur] == 0:
                state[cur] = 1
                trail.append(cur)
                cur = parent[cur]
            if cur >= 0 and state[cur] == 1:
                for u in trail[trail.index(cur) :]:
                    if u in mended:
                        parent[u] = ROOT
                        del mended[u]
                        break
            for u in trail:
                state[u] = 2
        for i in sorted(broken, key=line.__getitem__):
            missing = self.pending[i]
            if i in mended:
                diag.warn(
                    "broken_chain",
                    f"line {line[i]}",
                    f"parent uuid {missing} is not in the file; continued from line {line[mended[i]]}, "
                    "the chain line before it",
                )
            else:
                diag.warn(
                    "broken_chain",
                    f"line {line[i]}",
                    f"parent uuid {missing} is not in the file; the chain starts there",
                )
        self.pending = {}

    def depths(self) -> tuple[array, array]:
        """Per line, its depth (1 for a root, parent's + 1; a cycle counts from where it closes)
        and how many user and assistant lines its chain holds, itself included: the
        conversation's depth, which ``progress`` and ``system`` lines do not add to. One pass."""
        parent, kind, talk_kinds = self.parent, self.kind, self.talk
        depth = array("i", bytes(4 * len(parent)))
        talk = array("i", bytes(4 * len(parent)))
        for i in range(len(parent)):
            if depth[i]:
                continue
            trail = array("i")  # one long chain is most of the file: 4 bytes a line, not an int object
            cur = i
            while cur >= 0 and depth[cur] == 0:
                depth[cur] = -1  # on the trail
                trail.append(cur)
                cur = parent[cur]
            known = cur >= 0 and depth[cur] > 0
            d = depth[cur] if known else 0
            t = talk[cur] if known else 0
            for u in reversed(trail):
                d += 1
                depth[u] = d
                if kind[u] & 7 in talk_kinds:
                    t += 1
                talk[u] = t
        return depth, talk

    def leaf(self, depth: array, hint: str | None, talk: array | None = None) -> int:
        """The main chain's leaf, among the lines no line names as parent (any chain line: a
        session often ends with ``progress``, ``system/turn_duration`` or hook lines after its
        last reply): among those that descend from the ``leafUuid`` of the last
        ``last-prompt``/``summary`` record (the session may go on past that record), else among
        all, the one whose chain holds the most user and assistant lines (``talk``: a branch of
        a subagent's ``progress`` lines, however deep, holds none), then the deepest, then the
        later line of the file. -1 when there is no line."""
        parent, line = self.parent, self.line
        n = len(parent)
        has_child = bytearray(n)
        for j in parent:
            if j >= 0:
                has_child[j] = 1
        below: bytearray | None = None  # 0 unknown, 1 descends from the hint, 2 not, 3 on the trail
        h = self.ids.get(self.key(hint)) if hint is not None else None
        if h is not None:
            below = bytearray(n)
            below[h] = 1
        best, leaf = (-1, -1), -1
        for i in range(n):
            if has_child[i]:
                continue
            if below is not None:
                trail = array("i")
                cur = i
                while cur >= 0 and below[cur] == 0:
                    below[cur] = 3
                    trail.append(cur)
                    cur = parent[cur]
                hit = 1 if cur >= 0 and below[cur] == 1 else 2
                for u in trail:
                    below[u] = hit
                if hit != 1:
                    continue
            key = (talk[i] if talk is not None else 0, depth[i], line[i])
            if key > best:
                best, leaf = key, i
        return leaf

    def walk(self, leaf: int) -> array:
        """The lines from the root to ``leaf``; a cycle ends the walk silently."""
        out = array("i")
        seen = bytearray(len(self.parent))
        cur = leaf
        while cur >= 0 and not seen[cur]:
            seen[cur] = 1
            out.append(cur)
            cur = self.parent[cur]
        out.reverse()
        return out
