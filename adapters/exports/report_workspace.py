"""The files each step of a run changed, from the run's workspace snapshots, for its page
(``pvisor report``, docs/report.md "Files"): :func:`step_files`.

A snapshot is taken when each main-loop request arrives (the workspace after the previous
step's tools ran) and when the agent ended (docs/snapshots.md), so step N's changes are the
snapshot after step N against the one after step N-1. Which step a snapshot follows is its
``after_step`` as the run's end bound it; a run whose binding was not stored is bound here the
same way: a ``request`` snapshot follows the step before the one whose request (or retry) it was
taken for, ``start`` the steps of earlier attempts, ``end`` the steps up to its attempt's last.
Of several snapshots after one step, the first is the state its tools left.

Per step, each path whose content, kind or link target changed: ``{"path", "change"
("added", "removed", "changed"), "binary", "secret", "diff", "more"}``:

- a text file's ``diff``: its unified diff, [kind, line] pairs (``-``, ``+``, `` ``, ``@``),
  at most :data:`DIFF_LINES` of them, ``more`` the lines left out (an added file is all ``+``);
- a binary file (a NUL byte, or not UTF-8), a symlink, a file over :data:`MAX_FILE_BYTES`:
  named only (``diff`` None);
- a file a snapshot withheld as secret (its name, or a key in its content: the manifest's
  ``withheld``, :func:`~pvisor.journal.redact.secret_file`), or one whose stored content the
  journal's redaction would withhold now: ``secret`` true, named only, never any content.

The page's files are capped: once :data:`PAGE_BYTES` bytes of diff lines and entries (each its
path and :data:`ENTRY_BYTES`) are given, later files are left out, counted in their step's
``files_more`` (and ``capped`` is true). Paths come in path order per step. This module reads
the journal only (it imports no replay code: the layers of pyproject.toml's import contracts).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from pvisor.core.errors import PvisorError
from pvisor.journal.reader import JournalReader
from pvisor.journal.redact import secret_file
from pvisor.journal.snapshots import EntryKind, Manifest, SnapshotKind, withhold_secret_names

#: lines of one file's diff shown
DIFF_LINES = 200
#: bytes of diff lines and entries one page shows in all (the files past it: ``files_more``)
PAGE_BYTES = 1 << 20
#: a file larger than this (either side) is named only: reading it would cost more than it shows
MAX_FILE_BYTES = 1 << 20
#: ``workspace.reason`` when the files are left out on purpose
NO_WORKSPACE_REASON = "--no-workspace"
#: ``workspace.reason`` of a run without a snapshot (``--no-snapshots``, a gateway capture)
NO_SNAPSHOTS_REASON = "no snapshots"
#: ``workspace.reason`` of a run whose snapshots no step's files could be read from (each walk
#: failed, the manifests are damaged), followed by the first error
UNREAD_REASON = "no snapshot could be read"
#: bytes one file's entry costs the page's budget besides its path and its diff (its fields)
ENTRY_BYTES = 96


@dataclass
class StepFiles:
    """What :func:`step_files` found: ``files`` per step number (only the steps whose before and
    after snapshots both exist), ``more`` the files the page's cap left out per step,
    ``capped`` whether any were, ``reason`` why no step has files (None when they are shown)."""

    files: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    more: dict[int, int] = field(default_factory=dict)
    capped: bool = False
    reason: str | None = None
    #: steps left without files because the snapshot before or after them has no readable
    #: manifest (its walk failed, or the journal is damaged)
    unread: int = 0


def diff_lines(before: str, after: str, limit: int) -> tuple[list[list[str]], int]:
    """The unified diff (2 lines of context) of ``before`` against ``after`` as ``[kind,
    line]`` pairs (kind ``-``, ``+``, `` `` or ``@`` for a hunk's head, whose line is the
    ``@@ ... @@`` itself), at most ``limit`` of them: ``(pairs, lines left out)``; when any are
    left out the last pair is ``["@", "… the diff goes on"]``."""
    pairs: list[list[str]] = []
    more = 0
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), "a", "b", lineterm="", n=2):
        if line.startswith(("---", "+++")) and not pairs:
            continue
        if len(pairs) >= limit:
            more += 1
            continue
        kind = line[:1] if line[:1] in "-+@" else " "
        pairs.append([kind, line[1:] if kind != "@" else line])
    if more:
        pairs.append(["@", "… the diff goes on"])
    return pairs, more


def bound_steps(snapshots: list[Any], meta: dict[str, Any]) -> dict[int, Any]:
    """Step N -> the first snapshot (with a manifest) after step N (module docstring); ``meta``
    a journal trajectory's (``steps``: each ``{"n", "exchange", "retries", "attempt"}``,
    ``synthetic_end``: exchange ids)."""
    steps = meta.get("steps") or []
    before: dict[str, int] = {}
    for d in steps:
        before[d["exchange"]] = d["n"]
        for retry in d.get("retries") or ():
            before.setdefault(retry, d["n"])
    for ex_id in meta.get("synthetic_end") or ():
        before.setdefault(ex_id, len(steps) + 1)
    out: dict[int, Any] = {}
    for snap in snapshots:
        after = snap.after_step
        if after is None:
            if snap.kind is SnapshotKind.START:
                after = sum(1 for d in steps if (d.get("attempt") or 1) < snap.attempt)
            elif snap.kind is SnapshotKind.END:
                after = sum(1 for d in steps if (d.get("attempt") or 1) <= snap.attempt)
            elif snap.exchange in before:
                after = before[snap.exchange] - 1
        if after is not None and snap.digest is not None and after not in out:
            out[after] = snap
    return out


def step_files(
    reader: JournalReader, run_id: str, meta: dict[str, Any], page_bytes: int = PAGE_BYTES
) -> StepFiles:
    """The files each step of ``run_id`` changed (module docstring; ``meta``: the run's journal
    trajectory's, as :func:`bound_steps` reads it), at most ``page_bytes`` bytes of diff lines
    and entries in all. A snapshot whose manifest cannot be read leaves its two steps without files (their
    ``files`` None, counted in ``unread``); when no step has files, ``reason`` says why
    (:data:`UNREAD_REASON` and the first error)."""
    found = StepFiles()
    snaps = reader.snapshots(run_id)
    if not snaps:
        found.reason = NO_SNAPSHOTS_REASON
        return found
    after = bound_steps(snaps, meta)
    manifests: dict[str, Manifest | None] = {}
    errors: list[str] = [s.error or "the walk failed" for s in snaps if s.digest is None]

    def manifest(snap: Any) -> Manifest | None:
        if snap.id not in manifests:
            try:
                manifests[snap.id] = withhold_secret_names(reader.manifest(snap))
            except PvisorError as exc:  # a damaged or missing manifest: those steps show no files
                manifests[snap.id] = None
                errors.append(exc.message)
        return manifests[snap.id]

    budget = [page_bytes]
    steps = meta.get("steps") or []
    for d in steps:
        n = d["n"]
        if n - 1 not in after or n not in after:
            continue
        a, b = manifest(after[n - 1]), manifest(after[n])
        if a is None or b is None:
            found.unread += 1
            continue
        files, more = _changes(reader, a, b, budget)
        found.files[n] = files
        if more:
            found.more[n] = more
            found.capped = True
    if steps and not found.files and errors:
        # snapshots, but none a step's files could be read from: say why rather than nothing
        found.reason = f"{UNREAD_REASON}: {errors[0]}"
    return found


def _index(m: Manifest) -> tuple[dict[str, Any], set[str]]:
    """A manifest's files and symlinks by path, and the paths it withheld as secret."""
    return (
        {e.path: e for e in m.entries if e.kind is not EntryKind.DIR},
        {w.path for w in m.withheld},
    )


def _changes(reader: JournalReader, a: Manifest, b: Manifest, budget: list[int]) -> tuple[list[dict], int]:
    """The files changed from ``a`` to ``b`` (path order), and how many the page's remaining
    ``budget`` (bytes, a one-item list spent here) left out."""
    entries_a, secret_a = _index(a)
    entries_b, secret_b = _index(b)
    out: list[dict[str, Any]] = []
    more = 0
    for path in sorted(entries_a.keys() | entries_b.keys() | secret_a | secret_b):
        was = entries_a.get(path) or (path if path in secret_a else None)
        now = entries_b.get(path) or (path if path in secret_b else None)
        secret = path in secret_a or path in secret_b
        if not secret and _same(was, now):
            continue
        if secret and was is not None and now is not None and path in secret_a and path in secret_b:
            # withheld on both sides: no digest is kept, so whether it changed is unknown
            # unless its size did (never its content): named as changed only then
            if _withheld_size(a, path) == _withheld_size(b, path):
                continue
        if budget[0] <= 0:
            more += 1
            continue
        change = "added" if was is None else "removed" if now is None else "changed"
        item = {"path": path, "change": change, "binary": False, "secret": secret, "diff": None, "more": 0}
        # an entry costs the page without a diff too: 100,000 empty or binary files are 10 MB
        budget[0] -= len(path) + ENTRY_BYTES
        if not secret:
            _fill_diff(reader, item, was, now, budget)
        out.append(item)
    return out, more


def _withheld_size(m: Manifest, path: str) -> int | None:
    return next((w.size for w in m.withheld if w.path == path), None)


def _same(was: Any, now: Any) -> bool:
    if was is None or now is None:
        return was is now
    return (was.kind, was.sha256, was.target) == (now.kind, now.sha256, now.target)


def _text(reader: JournalReader, entry: Any, item: dict[str, Any]) -> str | None:
    """The content of file ``entry`` as text ("" for none); None when it is not shown: a
    symlink or a file too large (named only), binary (``item["binary"]`` set) or secret by
    the journal's redaction (``item["secret"]`` set)."""
    if entry is None:
        return ""
    if entry.kind is not EntryKind.FILE or entry.size > MAX_FILE_BYTES or entry.sha256 is None:
        return None
    try:
        data = reader.blob(entry.sha256)
    except PvisorError:  # a blob gone from the journal: named only
        return None
    if secret_file(entry.path.rpartition("/")[2], data) is not None:
        item["secret"] = True
        return None
    if b"\0" in data[:8192]:
        item["binary"] = True
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        item["binary"] = True
        return None


def _fill_diff(reader: JournalReader, item: dict[str, Any], was: Any, now: Any, budget: list[int]) -> None:
    """``item``'s ``diff`` and ``more`` (module docstring), spending ``budget``."""
    before, after = _text(reader, was, item), _text(reader, now, item)
    if before is None or after is None:
        if item["secret"]:
            item["binary"] = False
        return
    pairs, more = diff_lines(before, after, DIFF_LINES)
    item["diff"], item["more"] = pairs, more
    budget[0] -= sum(len(line) + 4 for _, line in pairs)
