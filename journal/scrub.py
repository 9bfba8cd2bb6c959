"""Removing a leaked string from a journal for good (``pvisor journal scrub``), docs/journal.md
"Scrubbing a leaked secret".

A key that reached a tool's output is in every later request body of the run (each repeats the
conversation), in the stored response, in the workspace files a snapshot kept, and in the run
directory (agent output, private home). Bodies are content-addressed and stored as zstd frames
against an earlier body (:mod:`pvisor.journal.blobs`), so replacing the text is not an
``UPDATE``:

1. Every blob is restored, parents before children (the forest of ``base`` references, file
   blobs before the snapshot manifests that list them). A blob whose bytes hold the text gets
   the replacement and so a new sha256; a blob whose base changed is re-encoded against the new
   base (its own bytes may be unchanged): every frame compressed against a changed body, up to
   the next keyframe, is rewritten. A response received with a ``Content-Encoding`` is searched
   decoded and stored again in its coding. A manifest names the new sha256 and size of each
   changed file.
2. Every row naming an old sha256 (``exchanges``' body columns, ``snapshots.manifest``,
   ``runs.workspace_snapshot``, the ``snapshot.taken`` event) is rewritten, and every text cell of
   the metadata tables (headers, labels, argv, errors, events, in-flight ``response_parts``) gets
   the replacement; identifiers and digests are left.
3. After the commit, with ``secure_delete`` on: a WAL checkpoint with truncation, ``VACUUM``
   (temporary store in memory) and a second truncating checkpoint, so that no free page, WAL
   frame or temporary file keeps the old bytes.
4. The run directories: each file holding the text gets it replaced (a text file by the
   replacement, a binary one, such as an agent's own SQLite database, by as many ``*`` as the
   text has bytes, so that its structure stays).
5. The journal is verified (:meth:`JournalReader.verify`) and the journal file, its WAL and the
   run directories are searched again for the text's bytes: what remains is reported.

A literal text is searched as its UTF-8 bytes and in its JSON-escaped forms (once and twice
escaped, with and without ``\\uXXXX`` escapes: a key inside a tool call's ``arguments`` string);
a regular expression (``--regex``) is matched on the bytes as they are. With ``run`` only the
blobs and rows of that run are searched; a body it shares with another run is changed for both
(one blob). Like rm, scrub refuses while a live writer holds the lease (it keeps lane state that
names the old blobs) unless ``force``. Steps 1 and 2 are one transaction: an interrupted scrub
changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from pvisor.core import progress

from . import blobs
from .content_encoding import DecodeError, decode_body, encode_body
from pvisor.core.errors import IntegrityError, PvisorError, UnavailableError, UsageError
from .housekeeping import check_writers, open_for_writing, journal_bytes, live_writers, started_by
from .paths import run_directory, runs_directory
from .reader import JournalReader

DEFAULT_REPLACEMENT = "[scrubbed]"
#: a literal text shorter than this would match inside ordinary words, digests and base64
MIN_TEXT_CHARS = 4
#: the longest replacement: it may become part of a file name (255 bytes on most file systems)
MAX_REPLACEMENT_BYTES = 64
#: columns that hold identifiers or digests: never text-replaced (the body columns are remapped)
_IDENTIFIER_COLUMNS = frozenset(
    {"id", "run_id", "exchange_id", "parent_run", "sha256", "base", "manifest", "workspace_snapshot"}
    | {"request_body", "response_body", "response_final", "forwarded_body"}
    | {"chunk_timings", "secret_fingerprints"}  # packed numbers; digests of secrets
)
#: tables whose text cells are scrubbed, with the condition that picks a run's rows
_TEXT_TABLES = {
    "runs": "id = :run",
    "attempts": "run_id = :run",
    "exchanges": "run_id = :run",
    "events": "run_id = :run",
    "snapshots": "run_id = :run",
    "response_parts": "exchange_id IN (SELECT id FROM exchanges WHERE run_id = :run)",
    "writers": None,  # belongs to no run: scrubbed only without --run
}
_BODY_COLUMNS = ("request_body", "response_body", "response_final", "forwarded_body")


#: what a replacement may hold: it goes as it is into JSON strings (of every escaping depth),
#: header values, snapshot paths and file names, so nothing any of them reads otherwise (no quote,
#: backslash, slash, control or non-ASCII character)
_SAFE_REPLACEMENT = re.compile(rb"[A-Za-z0-9 _\-\[\]<>*#:=+,.@~%!^()|{}';&$?]+")


def _arg_bytes(value: str | bytes) -> bytes:
    """A command-line argument's own bytes (click hands over the undecodable ones as surrogate
    escapes, ``os.fsencode`` gives them back)."""
    return value if isinstance(value, bytes) else os.fsencode(value)


class Pattern:
    """What scrub replaces, over bytes: a literal ``text`` (with its JSON-escaped forms) or a
    regular expression ``regex`` (Python syntax, matched on the stored bytes), and the
    ``replacement``. Text and regex are taken as the bytes the user gave (str arguments with
    surrogate escapes are turned back into them; a text that is not UTF-8 is searched only as
    bytes). UsageError (exit 2) for an empty or too short text, a regex that does not compile
    or matches the empty string, a replacement that would match again, or one that is empty,
    only dots or holds a character outside ``_SAFE_REPLACEMENT`` (it would change what a JSON
    string, a path or a header means). Errors never repeat the text or the regex: either may
    be the secret."""

    def __init__(
        self,
        text: str | bytes | None = None,
        regex: str | bytes | None = None,
        replacement: str = DEFAULT_REPLACEMENT,
    ):
        if (text is None) == (regex is None):
            raise UsageError("scrub: give the text to remove, or --regex RE (one of them)")
        repl = _arg_bytes(replacement)
        if len(repl) > MAX_REPLACEMENT_BYTES:
            raise UsageError(
                f"scrub: --replacement is {len(repl)} bytes; at most {MAX_REPLACEMENT_BYTES} "
                "(it may become part of a file name, whose length is limited)"
            )
        if not _SAFE_REPLACEMENT.fullmatch(repl) or not repl.strip(b"."):
            raise UsageError(
                "scrub: --replacement must be non-empty printable ASCII, not only dots, without a quote, "
                "backslash or slash (it is written unescaped into JSON strings, paths and file names)"
            )
        self.replacement = repl.decode("ascii")
        self._repl = repl
        if text is not None:
            raw = _arg_bytes(text)
            try:
                decoded: str | None = raw.decode("utf-8")
            except UnicodeDecodeError:
                decoded = None  # not UTF-8: no JSON holds it escaped, so only its bytes are searched
            if (len(decoded) if decoded is not None else len(raw)) < MIN_TEXT_CHARS:
                raise UsageError(
                    f"scrub: the text must have at least {MIN_TEXT_CHARS} characters "
                    "(a shorter one matches inside words, digests and base64); use --regex to insist"
                )
            if raw in repl:
                raise UsageError("scrub: the replacement contains the text it replaces")
            self.describe = f"text of {len(raw)} bytes"
            self._raw = raw
            forms = {raw} | ({f.encode() for f in _escaped_forms(decoded)} if decoded is not None else set())
            # longest first: an escaped form is replaced before a form it contains
            self._forms = sorted(forms, key=len, reverse=True)
            self._regex = None
        else:
            raw = _arg_bytes(regex)
            try:
                compiled = re.compile(raw)
            except re.error as exc:
                # the message names the position, never the pattern (which may be the secret)
                raise UsageError(f"scrub: --regex is not a regular expression: {exc}") from None
            if compiled.search(b""):
                raise UsageError("scrub: --regex matches the empty string")
            if compiled.search(repl):
                raise UsageError("scrub: the replacement matches --regex")
            self.describe = f"regex of {len(raw)} bytes"
            self._forms = []
            self._regex = compiled

    def sub(self, data: bytes) -> tuple[bytes, int]:
        """``data`` with every match replaced, and the number of replacements."""
        if self._regex is not None:
            repl = self._repl
            return self._regex.subn(lambda _m: repl, data)
        n = 0
        for old in self._forms:
            k = data.count(old)
            if k:
                data = data.replace(old, self._repl)
                n += k
        return data, n

    def mask(self, data: bytes) -> tuple[bytes, int]:
        """``data`` with every match overwritten by as many ``*`` as it has bytes (the length
        kept: a binary file's offsets stay valid)."""
        if self._regex is not None:
            return self._regex.subn(lambda m: b"*" * len(m.group(0)), data)
        n = 0
        for old in self._forms:
            k = data.count(old)
            if k:
                data = data.replace(old, b"*" * len(old))
                n += k
        return data, n

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """The (start, end) byte offsets of the matches in ``data``, in order, not overlapping
        (a literal text's raw form only: for decoded strings, where no escaping is left)."""
        if self._regex is not None:
            return [m.span() for m in self._regex.finditer(data)]
        out, start = [], 0
        raw = self._raw
        while True:
            i = data.find(raw, start)
            if i < 0:
                return out
            out.append((i, i + len(raw)))
            start = i + len(raw)

    def hide(self, text: str) -> str:
        """``text`` (a path, a message) with every match replaced: what scrub prints or reports
        never repeats the secret, even in the name of a file that held it."""
        return self.sub_text(text)

    def found(self, data: bytes) -> bool:
        if self._regex is not None:
            return self._regex.search(data) is not None
        return any(old in data for old in self._forms)

    def sub_text(self, value):
        """A cell's value with the replacement: str and bytes alike, anything else as it is."""
        if isinstance(value, str):
            out, n = self.sub(value.encode("utf-8", "surrogatepass"))
            return out.decode("utf-8", "surrogatepass") if n else value
        if isinstance(value, bytes):
            return self.sub(value)[0]
        return value

    def found_text(self, value) -> bool:
        if isinstance(value, str):
            return self.found(value.encode("utf-8", "surrogatepass"))
        if isinstance(value, bytes):
            return self.found(value)
        return False


def _escaped_forms(text: str) -> Iterator[str]:
    """The JSON-escaped forms of ``text``: once and twice, with and without ``\\uXXXX`` for
    non-ASCII, and with ``/`` escaped as ``\\/``. The replacement needs no form of its own: it
    holds nothing JSON escapes (``_SAFE_REPLACEMENT``)."""
    for ascii_only in (False, True):
        t = text
        for _ in range(2):
            t = json.dumps(t, ensure_ascii=ascii_only)[1:-1]
            yield t
            if "/" in t:
                yield t.replace("/", "\\/")


@dataclass(slots=True)
class ScrubReport:
    """What :func:`scrub` did. ``matches``: replacements in bodies and cells; ``blobs_changed``:
    blobs whose bytes held the text (each now under a new sha256); ``blobs_reencoded``: blobs
    re-encoded only because their base changed; ``rows_rewritten``: rows that named an old
    sha256; ``cells_changed``: metadata cells that held the text; ``files_changed``: run
    directory files rewritten; ``names_changed``: files and directories renamed (the text was in
    their name), by their new path, and symbolic links whose target held it; ``not_rewritten``:
    ``{path, why}`` of each file that holds the text but was left (a hard link shared with a file
    elsewhere, no permission); ``dry_run``: nothing was changed, the counts are what would be
    (``wal_truncated`` is None then); ``live_writers``: the pids of the writers that held a live
    lease when ``force`` went past them (their next bodies may be stored against blobs the scrub
    replaced); ``bytes_before`` / ``bytes_after``: the journal and its WAL; ``wal_truncated``:
    False when a reader kept the WAL from being emptied; ``problems``: what the verification
    found; ``remaining``: where the text's bytes are still found."""

    pattern: str
    run: str | None = None
    dry_run: bool = False
    matches: int = 0
    blobs_changed: int = 0
    blobs_reencoded: int = 0
    rows_rewritten: int = 0
    cells_changed: int = 0
    run_dirs: list[str] = field(default_factory=list)
    files_changed: list[str] = field(default_factory=list)
    names_changed: list[str] = field(default_factory=list)
    not_rewritten: list[dict] = field(default_factory=list)
    live_writers: list[int] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    wal_truncated: bool | None = True
    problems: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    @property
    def clean(self) -> bool:
        return not self.problems and not self.remaining and self.wal_truncated is not False


def scrub(
    journal: str | os.PathLike,
    pattern: Pattern,
    *,
    run_id: str | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> ScrubReport:
    """Replace ``pattern`` in the journal and its run directories (module docstring). ``run_id``
    (an id or unique prefix) limits it to one run; ``dry_run`` does all of it in a transaction
    that is rolled back, touches no file, and reports what would change (``files_changed``: the
    files that hold the text). Returns the report; the caller decides what a problem or a
    remaining match means (the CLI exits 3). Raises UsageError for an unknown run, and when a
    replacement would leave a body or cell that was JSON no longer JSON (a regex matching part
    of an escape sequence): nothing changed then; UnavailableError (exit 69) while a live writer
    holds the journal (without ``force``), when it stays locked, or when it cannot be written;
    IntegrityError (nothing changed) when a blob cannot be restored."""
    path = Path(journal)
    run = None
    if run_id is not None:
        with JournalReader(path) as reader:
            run = reader.run(run_id).id
    # a crafted run id (IntegrityError) is refused here, before anything changes
    dirs = [run_directory(path, run)] if run else sorted(runs_directory(path).glob("*"))
    report = ScrubReport(pattern.describe, run, dry_run=dry_run)
    report.bytes_before = journal_bytes(path)
    conn = open_for_writing(path)
    try:
        if force:
            report.live_writers = [started_by(pid, host) for _, pid, host in live_writers(conn)]
        check_writers(conn, path, force, "scrub")
        _refuse_identifiers(conn, path, pattern, run)
        failures: list[BaseException] = []  # what a function called by SQLite raised (Ctrl-C)
        try:
            # overwrite what rows and pages leave behind, from the first change on
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("BEGIN IMMEDIATE")
            try:
                with JournalReader(path) as reader:
                    mapping, sizes = _scrub_blobs(conn, reader, pattern, run, report)
                _rewrite_rows(conn, mapping, sizes, report)
                _scrub_cells(conn, pattern, run, report, failures)
                conn.execute("ROLLBACK" if dry_run else "COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if failures:  # a Ctrl-C inside SQLite's call of our function: what it was, not SQLite's word
                raise failures[0] from None
            raise UnavailableError(_not_written(path, exc)) from None
        except KeyboardInterrupt:
            raise ScrubInterrupted(
                f"journal {path}: scrub interrupted before its commit: it changed nothing"
            ) from None
        if dry_run:
            report.bytes_after = report.bytes_before
            report.wal_truncated = None
        else:
            try:
                first = _checkpoint(conn)
                conn.execute("VACUUM")
                report.wal_truncated = _checkpoint(conn) and first
            except sqlite3.OperationalError as exc:
                raise UnavailableError(
                    f"journal {path}: the text is replaced, but its old pages could not be cleared ({exc}): "
                    "run pvisor journal vacuum when no other process has the journal open"
                ) from None
            except KeyboardInterrupt:
                raise ScrubInterrupted(_after_commit(path, "the old pages were not cleared yet")) from None
    finally:
        conn.close()
    report.run_dirs = [str(d) for d in dirs if d.is_dir() and not d.is_symlink()]
    if dry_run:
        for d in report.run_dirs:
            for p, _, where in _found_in_tree(Path(d), pattern):
                (report.names_changed if where in ("name", "target") else report.files_changed).append(p)
        _hide(report, pattern)
        return report
    report.bytes_after = journal_bytes(path)
    try:
        for d in report.run_dirs:
            _scrub_tree(Path(d), pattern, report)
        with JournalReader(path) as reader:
            report.problems = reader.verify().problems
        report.remaining = _remaining(path, run, [Path(d) for d in report.run_dirs], pattern, report)
    except KeyboardInterrupt:
        raise ScrubInterrupted(
            _after_commit(path, "the run directories and the check after were not done")
        ) from None
    _hide(report, pattern)
    return report


class ScrubInterrupted(PvisorError):
    """Ctrl-C during a scrub: exit 130, and a message that says whether the journal changed."""

    exit_code = 130


def _after_commit(path: Path, what: str) -> str:
    return (
        f"journal {path}: scrub interrupted after its commit: the journal's bodies and rows are scrubbed, "
        f"but {what}; "
        "run the same scrub again to finish (it is safe to repeat)"
    )


def _hide(report: ScrubReport, pattern: Pattern) -> None:
    """Every path and place of the report with the text replaced (a file's name may hold it)."""
    for name in ("run_dirs", "files_changed", "names_changed", "remaining", "problems"):
        setattr(report, name, [pattern.hide(v) for v in getattr(report, name)])
    for left in report.not_rewritten:
        left["path"] = pattern.hide(left["path"])
        left["why"] = pattern.hide(left["why"])


def _refuse_identifiers(conn: sqlite3.Connection, path: Path, pattern: Pattern, run: str | None) -> None:
    """UsageError (nothing changed) when a run or exchange id holds the text: ids are never
    rewritten, and the labels and paths derived from them would be (the run directory keeps
    its name), so removing the run comes first."""
    conn.create_function("pvisor_scrub_found", 1, pattern.found_text, deterministic=True)
    for table, what in (("runs", "run"), ("exchanges", "exchange"), ("attempts", "attempt of run")):
        col = "id" if table != "attempts" else "run_id"
        where = "pvisor_scrub_found(" + col + ")" + (" AND " + _TEXT_TABLES[table] if run is not None else "")
        row = conn.execute(f"SELECT {col} FROM {table} WHERE {where} LIMIT 1", {"run": run}).fetchone()
        if row is not None:
            raise UsageError(
                f"journal {path}: scrub changed nothing: the text is in the id of {what} "
                f"{pattern.hide(row[0])}, "
                "and ids are never rewritten: pvisor journal rm that run first, then scrub"
            )


def _not_written(path: Path, exc: sqlite3.OperationalError) -> str:
    """The one line for an SQLite error while the transaction ran (nothing changed)."""
    text = str(exc)
    if "readonly" in text or "unable to open" in text:
        return (
            f"journal {path}: scrub changed nothing: the journal or its directory {path.parent} is not "
            f"writable ({text})"
        )
    if "locked" in text or "busy" in text:
        return (
            f"journal {path}: scrub changed nothing: another process kept it locked past the timeout ({text})"
        )
    return f"journal {path}: scrub could not finish (nothing changed): {text}"


def _checkpoint(conn: sqlite3.Connection) -> bool:
    """A truncating WAL checkpoint; False when a reader kept it from finishing."""
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return busy == 0


# --------------------------------------------------------------------------- blobs


def _scrub_blobs(
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
    codings = _codings(conn)
    streamed = _streamed(conn)
    targets = _run_blobs(conn, reader, run) if run else None
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


def _json_broken(old: bytes, new: bytes) -> bool:
    """Whether replacing turned JSON into something that is not: a whole document, or one of
    the JSON lines of a stream (a regex that matched into an escape such as ``\\n`` leaves
    ``\\[scrubbed]``)."""
    if _parses(new):  # the usual case, and one parse: the old bytes are parsed only when it fails
        return False
    if _parses(old):
        return True
    return _json_lines(new) < _json_lines(old)


def _still_json(conn: sqlite3.Connection, sha: str, old: bytes, new: bytes) -> None:
    """UsageError (the transaction is rolled back: nothing changed) when the replacement broke
    the JSON of blob ``sha``, naming the exchange or snapshot that holds it."""
    if _json_broken(old, new):
        raise UsageError(
            f"scrub changed nothing: the replacement would leave {_blob_place(conn, sha)} no longer valid "
            "JSON (the regex matches part of an escape sequence or of the JSON around the text); "
            "match the text as stored, or give the literal text instead of --regex"
        )


def _blob_place(conn: sqlite3.Connection, sha: str) -> str:
    """Where blob ``sha`` is used, for a message: an exchange's body or a snapshot."""
    for col in _BODY_COLUMNS:
        if not _has_column(conn, "exchanges", col):
            continue
        row = conn.execute(f"SELECT id, run_id FROM exchanges WHERE {col} = ? LIMIT 1", (sha,)).fetchone()
        if row is not None:
            return f"the {col.replace('_', ' ')} of exchange {row[0]} (run {row[1]}, blob {sha[:12]})"
    row = conn.execute("SELECT id, run_id FROM snapshots WHERE manifest = ? LIMIT 1", (sha,)).fetchone()
    if row is not None:
        return f"the manifest of snapshot {row[0]} (run {row[1]}, blob {sha[:12]})"
    return f"blob {sha[:12]} (a file of a workspace snapshot, or a manifest)"


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


def _streamed(conn: sqlite3.Connection) -> set[str]:
    """The response bodies received as a stream (server-sent events)."""
    return {
        sha
        for (sha,) in conn.execute(
            "SELECT DISTINCT response_body FROM exchanges WHERE streamed = 1 AND response_body IS NOT NULL"
        )
    }


def _codings(conn: sqlite3.Connection) -> dict[str, str]:
    """{sha256: Content-Encoding} of the response bodies stored in a content coding."""
    codings = {}
    for sha, coding in conn.execute(
        "SELECT DISTINCT response_body, lower(trim(json_extract(response_headers, '$.\"content-encoding\"')))"
        " FROM exchanges WHERE response_body IS NOT NULL AND json_valid(response_headers)"
    ):
        if coding and coding != "identity":
            codings[sha] = coding
    return codings


def _run_blobs(conn: sqlite3.Connection, reader: JournalReader, run: str) -> set[str]:
    """The blobs the rows of ``run`` name: bodies, manifests and the files manifests list."""
    from .housekeeping import blobs_named_by_rows

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


# --------------------------------------------------------------------------- rows


#: the size columns of an exchange and the body whose stored size each is, when it is
_SIZE_COLUMNS = (
    ("request_bytes", "request_body"),
    ("bytes_received", "response_body"),
    ("bytes_delivered", "response_body"),
)


def _rewrite_rows(
    conn: sqlite3.Connection, mapping: dict[str, str], sizes: dict[str, int], report: ScrubReport
) -> None:
    """Step 2, digests: every row that names an old sha256 names the new one, and a size column
    that gave the old body's size gives the new one's (one that differed, a body cut at a cap or
    delivered otherwise than received, keeps its figure: the replacement is not what went over
    the wire either way). ``chunk_timings`` keep the offsets of the chunks as they arrived."""
    if not mapping:
        return
    conn.execute(
        "CREATE TEMP TABLE scrub_map(old TEXT PRIMARY KEY, new TEXT NOT NULL, old_size INTEGER, "
        "new_size INTEGER)"
    )
    try:
        conn.executemany(
            "INSERT INTO scrub_map VALUES (?, ?, ?, ?)",
            [(old, new, sizes[old], sizes[new]) for old, new in mapping.items()],
        )
        for size_col, body_col in _SIZE_COLUMNS:
            if _has_column(conn, "exchanges", size_col):
                conn.execute(
                    f"UPDATE exchanges SET {size_col} = "
                    f"(SELECT new_size FROM scrub_map WHERE old = {body_col})"
                    f" WHERE {size_col} = (SELECT old_size FROM scrub_map WHERE old = {body_col})"
                )
        refs = [("exchanges", c) for c in _BODY_COLUMNS if _has_column(conn, "exchanges", c)]
        refs.append(("snapshots", "manifest"))
        if _has_column(conn, "runs", "workspace_snapshot"):  # a handoff's child names the manifest restored
            refs.append(("runs", "workspace_snapshot"))
        for table, col in refs:
            report.rows_rewritten += conn.execute(
                f"UPDATE {table} SET {col} = (SELECT new FROM scrub_map WHERE old = {col})"
                f" WHERE {col} IN (SELECT old FROM scrub_map)"
            ).rowcount
        # the snapshot.taken event names its manifest too
        report.rows_rewritten += conn.execute(
            "UPDATE events SET data = json_set(data, '$.manifest',"
            " (SELECT new FROM scrub_map WHERE old = json_extract(data, '$.manifest')))"
            " WHERE kind = 'snapshot.taken' AND json_valid(data)"
            " AND json_extract(data, '$.manifest') IN (SELECT old FROM scrub_map)"
        ).rowcount
    finally:
        conn.execute("DROP TABLE temp.scrub_map")


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    return column in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _scrub_cells(
    conn: sqlite3.Connection,
    pattern: Pattern,
    run: str | None,
    report: ScrubReport,
    failures: list[BaseException] | None = None,
) -> None:
    """Step 2, metadata: the text replaced in every cell but identifiers and digests. UsageError
    (the caller rolls back) when a cell that was JSON (headers, labels, argv, an event's data)
    would no longer parse."""
    broken: list[str] = []
    where_now = ""

    def found(value):
        try:
            return pattern.found_text(value)
        except BaseException as exc:  # SQLite reports only that the function failed: keep what it was
            if failures is not None:
                failures.append(exc)
            raise

    def sub_cell(value):
        try:
            return _sub_cell(value)
        except BaseException as exc:
            if failures is not None:
                failures.append(exc)
            raise

    def _sub_cell(value):
        new = pattern.sub_text(value)
        if new is not value and isinstance(value, (str, bytes)):
            old_b = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
            new_b = new.encode("utf-8", "surrogatepass") if isinstance(new, str) else new
            if _json_broken(old_b, new_b):
                broken.append(where_now)
                return value
        return new

    conn.create_function("pvisor_scrub", 1, sub_cell)
    conn.create_function("pvisor_scrub_found", 1, found, deterministic=True)
    for table, col, where_run in _text_cells(conn, run):
        where_now = f"{table}.{col}"
        where = f"pvisor_scrub_found({col})" + (f" AND {where_run}" if run is not None else "")
        report.cells_changed += conn.execute(
            f"UPDATE {table} SET {col} = pvisor_scrub({col}) WHERE {where}", {"run": run}
        ).rowcount
        if broken:
            raise UsageError(
                f"scrub changed nothing: the replacement would leave a cell of {broken[0]} no longer valid "
                "JSON (the regex matches part of an escape sequence or of the JSON around the text); "
                "match the text as stored, or give the literal text instead of --regex"
            )


def _text_cells(conn: sqlite3.Connection, run: str | None) -> list[tuple[str, str, str | None]]:
    """(table, column, condition picking the run's rows) of every column scrub searches."""
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = []
    for table, where_run in _TEXT_TABLES.items():
        if table not in present or (run is not None and where_run is None):
            continue
        for r in conn.execute(f"PRAGMA table_info({table})"):
            if r[1] not in _IDENTIFIER_COLUMNS and r[2].upper() in ("TEXT", "BLOB", ""):
                out.append((table, r[1], where_run))
    return out


# --------------------------------------------------------------------------- files


def _scrub_tree(root: Path, pattern: Pattern, report: ScrubReport) -> None:
    """Step 4: rewrite in place each regular file under ``root`` that holds the text, then
    rename each file and directory whose name holds it (deepest first, so that a renamed
    directory's own entries were handled under their old path). No symlink is followed; a file
    with more than one hard link is left (rewriting it in place would change the file it shares
    its blocks with, maybe outside the data directory), as is one that cannot be written: each
    goes into ``report.not_rewritten`` with why, and the journal's part stays done."""
    for dirpath, dirs, names in os.walk(root, topdown=False):
        for name in names:
            p = Path(dirpath, name)
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                _relink(p, pattern, report)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                data = p.read_bytes()
            except OSError as exc:
                if pattern.found(os.fsencode(name)):
                    continue  # its name is handled below
                _left(report, p, f"cannot be read: {exc.strerror}")
                continue
            if not pattern.found(data):
                continue
            if st.st_nlink > 1:
                _left(
                    report,
                    p,
                    f"not rewritten: it has {st.st_nlink} hard links, and another may be outside the data "
                    "directory; remove the link and scrub again",
                )
                continue
            try:
                data.decode("utf-8")
                new, _ = pattern.sub(data)
            except UnicodeDecodeError:
                new, _ = pattern.mask(data)
            try:
                # in place: the same blocks are overwritten rather than a new file written beside
                with open(p, "r+b") as f:
                    f.write(new)
                    f.truncate()
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                _left(report, p, f"not rewritten: {exc.strerror}")
                continue
            report.files_changed.append(str(p))
        for name in dirs:
            if os.path.islink(os.path.join(dirpath, name)):  # a link to a directory: not walked into
                _relink(Path(dirpath, name), pattern, report)
        for name in [*names, *dirs]:
            raw = os.fsencode(name)
            if not pattern.found(raw):
                continue
            new_name = os.fsdecode(pattern.sub(raw)[0])
            old_p, new_p = Path(dirpath, name), Path(dirpath, new_name)
            if os.path.lexists(new_p):
                _left(report, old_p, "not renamed: the new name exists beside it")
                continue
            try:
                os.rename(old_p, new_p)
            except OSError as exc:
                _left(report, old_p, f"not renamed: {exc.strerror}")
                continue
            report.names_changed.append(str(new_p))


def _relink(link: Path, pattern: Pattern, report: ScrubReport) -> None:
    """A symbolic link whose target holds the text points to the target with the replacement
    (a new link renamed over it: a link cannot be rewritten in place)."""
    try:
        target = os.readlink(link)
    except OSError:
        return
    raw = os.fsencode(target)
    if not pattern.found(raw):
        return
    tmp = link.with_name(f".{link.name}.scrub-{os.getpid()}")
    try:
        os.symlink(os.fsdecode(pattern.sub(raw)[0]), tmp)
        os.replace(tmp, link)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _left(report, link, f"link not rewritten: {exc.strerror}")
        return
    report.names_changed.append(str(link))


def _left(report: ScrubReport, path: Path, why: str) -> None:
    report.not_rewritten.append({"path": str(path), "why": why})


def _found_in_tree(root: Path, pattern: Pattern) -> list[tuple[str, str, str]]:
    """(path, note, where) of what under ``root`` holds the text: ``where`` is ``content`` (a
    regular file's bytes), ``name`` (a file's or directory's name) or ``target`` (a symbolic
    link's target; no link is followed); the note is empty or says that a file cannot be read."""
    out = []
    for dirpath, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            p = Path(dirpath, name)
            try:
                st = p.lstat()
                if pattern.found(os.fsencode(name)):
                    out.append((str(p), "", "name"))
                elif stat.S_ISLNK(st.st_mode):
                    if pattern.found(os.fsencode(os.readlink(p))):
                        out.append((str(p), "", "target"))
                elif stat.S_ISREG(st.st_mode) and pattern.found(p.read_bytes()):
                    out.append((str(p), "", "content"))
            except OSError as exc:
                out.append((str(p), f" (cannot be read: {exc.strerror})", "content"))
    return out


def _remaining(
    path: Path, run: str | None, dirs: list[Path], pattern: Pattern, report: ScrubReport
) -> list[str]:
    """Step 5: where the text is still found: a blob (restored, and decoded from its content
    coding), a metadata cell, an identifier (never rewritten), the journal file or its WAL as
    bytes (not for one run: other runs may hold the text), a file or name of the run
    directories (with why it was left, when it was)."""
    out = []
    with JournalReader(path) as reader:
        conn = reader.conn
        conn.create_function("pvisor_scrub_found", 1, pattern.found_text, deterministic=True)
        codings = _codings(conn)
        streamed = _streamed(conn)
        wanted = _run_blobs(conn, reader, run) if run else None
        # in the order they were stored: a lane's next body is one frame from the one restored last
        for (sha,) in conn.execute("SELECT sha256 FROM blobs ORDER BY rowid").fetchall():
            if wanted is not None and sha not in wanted:
                continue
            try:
                data = reader.blob(sha)
            except IntegrityError:
                continue  # the verification names it
            if sha in codings:
                with contextlib.suppress(DecodeError):  # one that does not decode was searched raw
                    data = decode_body(data, codings[sha])
            if pattern.found(data):
                out.append(_blob_place(conn, sha))
            elif sha in streamed and scrub_split(data, pattern)[1]:
                out.append(f"{_blob_place(conn, sha)}, split between the stream's events")
        for table, col, where_run in _text_cells(conn, run):
            where = f"pvisor_scrub_found({col})" + (f" AND {where_run}" if run is not None else "")
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}", {"run": run}).fetchone()[0]
            if n:
                out.append(f"{table}.{col} ({n} rows)")
        for table, col, where_run in _identifier_cells(conn, run):
            where = f"pvisor_scrub_found({col})" + (f" AND {where_run}" if run is not None else "")
            ids = [
                r[0] for r in conn.execute(f"SELECT {col} FROM {table} WHERE {where} LIMIT 3", {"run": run})
            ]
            if ids:
                out.append(
                    f"{table}.{col} of {len(ids)}{'+' if len(ids) == 3 else ''} row(s): an identifier, never "
                    "rewritten (pvisor journal rm removes its run)"
                )
    if run is None:
        for p in (path, Path(f"{path}-wal")):
            with contextlib.suppress(OSError):
                if p.is_file() and pattern.found(p.read_bytes()):
                    out.append(str(p))
    why = {left["path"]: left["why"] for left in report.not_rewritten}
    for d in dirs:
        for p, note, _ in _found_in_tree(d, pattern):
            out.append(f"{p} ({why[p]})" if p in why else f"{p}{note}")
    return out


def _identifier_cells(conn: sqlite3.Connection, run: str | None) -> list[tuple[str, str, str | None]]:
    """(table, column, condition) of the identifier columns of the tables scrub searches."""
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = []
    for table, where_run in _TEXT_TABLES.items():
        if table not in present or (run is not None and where_run is None):
            continue
        for r in conn.execute(f"PRAGMA table_info({table})"):
            if r[1] in ("id", "run_id", "exchange_id", "parent_run"):
                out.append((table, r[1], where_run))
    return out


__all__ = ["DEFAULT_REPLACEMENT", "Pattern", "ScrubReport", "scrub"]
