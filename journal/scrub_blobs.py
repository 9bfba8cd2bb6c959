"""Step 1 of a scrub (:mod:`pvisor.journal.scrub`), the blobs: every blob restored, parents
before children, the text replaced in its bytes (decoded from its content coding, joined across
a stream's events, a snapshot manifest's paths and digests rewritten), and every frame stored
against a changed body re-encoded against the new one (:func:`scrub_blobs`). Also which
response bodies are streamed or stored in a content coding, and which blobs a run's rows name,
for the search after the commit."""

from __future__ import annotations

import sqlite3
from typing import Callable, Iterator

import orjson

from pvisor.core import progress
from pvisor.core.errors import IntegrityError, UsageError

from . import blobs
from .content_encoding import DecodeError, decode_body, encode_body
from .housekeeping import blobs_named_by_rows
from .reader import JournalReader
from .scrub_json import json_broken, scrub_split
from .scrub_pattern import Pattern
from .scrub_report import ScrubReport
from .scrub_rows import blob_place


def scrub_blobs(
    conn: sqlite3.Connection, reader: JournalReader, pattern: Pattern, run: str | None, report: ScrubReport
) -> tuple[dict[str, str], dict[str, int]]:
    """Step 1 of the module docstring. Returns {old sha256: new sha256} of the changed blobs
    and the sizes in bytes of the old and new blobs of that mapping."""
    children: dict[str | None, list[str]] = {}
    base_of: dict[str, str] = {}
    for sha, base in conn.execute("SELECT sha256, base FROM blobs"):
        children.setdefault(base, []).append(sha)
        if base is not None:
            base_of[sha] = base
    manifests = {m for (m,) in conn.execute("SELECT manifest FROM snapshots WHERE manifest IS NOT NULL")}
    todo = list(manifests)
    while todo:  # a manifest's base is an earlier manifest of its lane
        b = base_of.get(todo.pop())
        if b is not None and b not in manifests:
            manifests.add(b)
            todo.append(b)
    codings = body_codings(conn)
    streamed = streamed_bodies(conn)
    targets = run_blobs(conn, reader, run) if run else None
    total = sum(len(v) for v in children.values())
    mapping: dict[str, str] = {}
    sizes: dict[str, int] = {}
    done = 0

    def replaced(sha: str, data: bytes) -> tuple[bytes, int]:
        new, n = pattern.sub(data)
        if sha in streamed:  # a text the stream split between events
            new, k = scrub_split(new, pattern)
            n += k
        if n:
            _still_json(conn, sha, data, new)
        return new, n

    def transform(sha: str, data: bytes) -> bytes:
        if targets is not None and sha not in targets:
            return data
        if sha in manifests:
            return _scrub_manifest(data, pattern, mapping, sizes, report)
        coding = codings.get(sha)
        if coding:
            try:
                plain = decode_body(data, coding)
            except DecodeError:
                plain = None  # stored as received although it does not decode: searched as it is
            if plain is not None:
                new, n = replaced(sha, plain)
                if not n:
                    return data
                report.matches += n
                return encode_body(new, coding)
        new, n = replaced(sha, data)
        report.matches += n
        return new

    roots = children.get(None, [])
    collisions: set[str] = set()
    with progress.task("scrubbing blobs", total, progress.Unit.BLOBS) as task:
        # file blobs (and everything else) before the manifests that list them
        for phase in (False, True):
            for root in roots:
                if (root in manifests) != phase:
                    continue
                done += _walk(conn, root, children, transform, mapping, sizes, collisions, report)
                task.reach(done)
    if done != total:
        # a blob under a missing base: it cannot be read, so it cannot be searched
        seen = total - done
        raise IntegrityError(
            f"journal {reader.path}: {seen} blob(s) have a missing base and cannot be read; "
            "scrub changed nothing (pvisor journal verify names them; pvisor journal rm their run)"
        )
    return mapping, sizes


def _still_json(conn: sqlite3.Connection, sha: str, old: bytes, new: bytes) -> None:
    """UsageError (the transaction is rolled back: nothing changed) when the replacement broke
    the JSON of blob ``sha``, naming the exchange or snapshot that holds it."""
    if json_broken(old, new):
        raise UsageError(
            f"scrub changed nothing: the replacement would leave {blob_place(conn, sha)} no longer valid "
            "JSON (the regex matches part of an escape sequence or of the JSON around the text); "
            "match the text as stored, or give the literal text instead of --regex"
        )


def streamed_bodies(conn: sqlite3.Connection) -> set[str]:
    """The response bodies received as a stream (server-sent events)."""
    return {
        sha
        for (sha,) in conn.execute(
            "SELECT DISTINCT response_body FROM exchanges WHERE streamed = 1 AND response_body IS NOT NULL"
        )
    }


def body_codings(conn: sqlite3.Connection) -> dict[str, str]:
    """{sha256: Content-Encoding} of the response bodies stored in a content coding."""
    codings = {}
    for sha, coding in conn.execute(
        "SELECT DISTINCT response_body, lower(trim(json_extract(response_headers, '$.\"content-encoding\"')))"
        " FROM exchanges WHERE response_body IS NOT NULL AND json_valid(response_headers)"
    ):
        if coding and coding != "identity":
            codings[sha] = coding
    return codings


def run_blobs(conn: sqlite3.Connection, reader: JournalReader, run: str) -> set[str]:
    """The blobs the rows of ``run`` name: bodies, manifests and the files manifests list."""
    return blobs_named_by_rows(conn, reader.blob, "run_id = ?", (run,))


def _walk(
    conn: sqlite3.Connection,
    root: str,
    children: dict[str | None, list[str]],
    transform: Callable[[str, bytes], bytes],
    mapping: dict[str, str],
    sizes: dict[str, int],
    collisions: set[str],
    report: ScrubReport,
) -> int:
    """Restore and rewrite the blob ``root`` and every blob below it (depth first: a frame is
    decoded with its parent's old bytes, re-encoded against the parent's new ones). Holds the
    bytes of one path of the tree (a lane's chain, at most 63 frames). Returns the blobs seen."""
    seen = 0
    # frame: (old sha, old bytes, new sha, new bytes, iterator over children)
    stack: list[tuple[str, bytes, str, bytes, Iterator[str]]] = []
    pending: Iterator[str] = iter((root,))
    while True:
        sha = next(pending, None)
        if sha is None:
            if not stack:
                return seen
            stack.pop()
            if not stack:
                return seen
            pending = stack[-1][4]
            continue
        parent = stack[-1] if stack else None
        row = conn.execute(
            "SELECT codec, data, typeof(data), size FROM blobs WHERE sha256 = ?", (sha,)
        ).fetchone()
        codec, stored, dtype, size = row
        try:
            if dtype != "blob":
                raise ValueError(f"it holds {dtype}, not bytes")
            old = blobs.decode(
                codec, stored, parent[1] if parent and codec == "zstd-prefix" else None, size=size
            )
        except (ValueError, blobs.ZstdError) as exc:
            raise IntegrityError(f"blob {sha} cannot be decoded ({exc}); scrub changed nothing") from None
        if blobs.sha256_hex(old) != sha:
            raise IntegrityError(f"blob {sha} restores to other bytes; scrub changed nothing")
        seen += 1
        new = transform(sha, old)
        new_sha = blobs.sha256_hex(new) if new != old else sha
        rebased = parent is not None and parent[2] != parent[0]
        if new_sha != sha:
            report.blobs_changed += 1
            mapping[sha] = new_sha
            sizes[sha], sizes[new_sha] = len(old), len(new)
            conn.execute("DELETE FROM blobs WHERE sha256 = ?", (sha,))
            if conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (new_sha,)).fetchone() is None:
                _store(conn, new_sha, new, parent if codec == "zstd-prefix" else None, collisions)
            else:
                collisions.add(new_sha)  # two bodies that differed only by the text
        elif rebased and codec == "zstd-prefix":
            report.blobs_reencoded += 1
            conn.execute("DELETE FROM blobs WHERE sha256 = ?", (sha,))
            _store(conn, sha, new, parent, collisions)
        stack.append((sha, old, new_sha, new, iter(children.get(sha, ()))))
        pending = stack[-1][4]


def _store(conn: sqlite3.Connection, sha: str, data: bytes, parent, collisions: set[str]) -> None:
    """Insert the blob ``sha`` of ``data``, against the parent's new bytes when it was a frame
    against the parent. Without ``collisions`` (changed blobs whose new bytes were stored
    already) the new references follow the old tree and cannot loop; with them the chain is
    checked, and a frame that would close a loop is stored standalone."""
    base = (parent[2], parent[3]) if parent is not None and parent[2] != sha else None
    if base is not None and collisions and _reaches(conn, base[0], sha):
        base = None
    codec, packed = blobs.encode(data, base[1] if base else None)
    conn.execute(
        "INSERT INTO blobs(sha256, size, codec, base, data) VALUES (?, ?, ?, ?, ?)",
        (sha, len(data), codec, base[0] if codec == "zstd-prefix" else None, packed),
    )


def _reaches(conn: sqlite3.Connection, start: str, target: str) -> bool:
    """Whether the base chain from ``start`` (as stored now) reaches ``target``."""
    cur: str | None = start
    for _ in range(blobs.STANDALONE_EVERY + 2):
        if cur is None:
            return False
        if cur == target:
            return True
        row = conn.execute("SELECT base FROM blobs WHERE sha256 = ?", (cur,)).fetchone()
        cur = row[0] if row else None
    return True


def _scrub_manifest(
    data: bytes, pattern: Pattern, mapping: dict[str, str], sizes: dict[str, int], report: ScrubReport
) -> bytes:
    """A snapshot manifest with its changed files' new sha256 and size and the text replaced in
    its paths, link targets and warnings (never inside a digest). The canonical form of
    :meth:`Manifest.encode` (keys sorted, compact), so its sha256 is still its digest. One that
    does not parse is searched as bytes."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        new, n = pattern.sub(data)
        report.matches += n
        return new
    changed = False

    def text(value):
        nonlocal changed
        if isinstance(value, str):
            new, n = pattern.sub(value.encode("utf-8", "surrogatepass"))
            if n:
                report.matches += n
                changed = True
                return new.decode("utf-8", "surrogatepass")
        return value

    for entry in doc["entries"]:
        if not isinstance(entry, dict):
            continue
        sha = entry.get("sha256")
        if isinstance(sha, str) and sha in mapping:
            entry["sha256"] = mapping[sha]
            entry["size"] = sizes[mapping[sha]]
            changed = True
        for key in ("path", "target"):
            if key in entry:
                entry[key] = text(entry[key])
    if isinstance(doc.get("warnings"), list):
        doc["warnings"] = [text(w) for w in doc["warnings"]]
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) if changed else data
