"""Merging journals: ``pvisor journal merge SRC... --into DST`` (docs/journal.md "Merging journals").

Every run of each source (or only the runs named) is copied into the journal ``into`` with what
it needs: its ``runs`` row, attempts, exchanges (and the ``response_parts`` of one still in
flight), snapshots, events, the writers that wrote them, and every blob its rows name (bodies,
snapshot manifests and the files they list, a handoff's ``workspace_snapshot``) with the bases
those blobs are restored from. Rows are copied as stored (bodies stay redacted and encoded as
they are; snapshot manifests are decoded to find the files they list, and every blob new to
``into`` is restored once and its sha256 checked: :mod:`pvisor.journal.merge_checks`), with SQL:
the sources are attached read-only to ``into``'s connection and copied with ``INSERT ... SELECT``.

- Ids are kept: run, exchange and snapshot ids, and ``exchanges.seq`` (a rank within its run).
  ``events.seq`` is renumbered: a source's events are appended after ``into``'s, in their order.
  ``writers.id`` is remapped: each source writer of a copied row becomes a new ``writers`` row
  of ``into`` as it was (pid, host, times), but a lease the source never closed, whose process
  died, comes closed (``dead``) and its exchanges in flight as its reaper writes them
  (``incomplete``, their response parts joined: :mod:`pvisor.journal.merge_reap`), so that the
  run in ``into`` is what merging the source again finds, reaped meanwhile or not.
- Blobs are deduplicated by sha256: one ``into`` holds already, or an earlier source of the same
  merge brings, is not copied again (its content is the same, whatever its encoding).
- A run already in ``into`` (or brought by an earlier source) whose rows are the same (its
  ``runs`` row, attempts, exchanges and snapshots, all columns but ``writer_id``) is skipped: merging
  twice is harmless. One whose rows differ, or an exchange or snapshot id held by another run,
  is a :class:`MergeClash` naming the id and both files, and nothing is merged.
- ``omit_blobs`` (a transfer journal, e.g. a Ray worker's derived runs sent back): blobs of those
  sha256 are left out, though its runs name them (but snapshot manifests:
  :mod:`pvisor.journal.merge_omit`); the result is a journal whose runs reference
  blobs it does not hold (``meta.blobs_left_out``), only for merging into a journal that holds
  them. Merging such a journal into one that lacks one of them fails (exit 3), saying so.
- Lineage is kept as it is (``parent_run``, ``boundary_step``, ``mode``, labels); a parent that
  neither ``into`` nor the merge holds is allowed, and reported (:attr:`MergeReport.missing_parents`).
- Secret fingerprints (``exchanges.secret_fingerprints``) are keyed per journal
  (``meta.fingerprint_key``), and keys are never copied (with the fingerprints, a journal's key
  confirms a guessed credential, and merged journals travel): a copied run keeps those its source
  made, and the ``run.merged`` event written for it names the journal whose key made them
  (``fingerprints``), so that fingerprints are compared only between runs of one key.

Refusals (:class:`~pvisor.core.errors.PvisorError`, nothing written): a source missing, a
directory or not a regular file, a path not UTF-8 (exit 2); a source not a journal or written by
a newer pvisor (65); a source damaged (3: a blob missing, or not restoring to its
sha256); a source a live writer lease holds (69; a lease whose
process is gone does not count, the rule of ``journal rm``; with ``runs``, only a live writer
that wrote one of them); a source that is ``into`` (through any path or link) or given twice
(2); a clash (65); ``into`` locked past the busy timeout (69), its file system full (74). All of
it happens in one transaction of ``into``; a missing ``into`` is built beside it and appears
only when the merge succeeded (a killed merge's temporary files: :mod:`pvisor.journal.merge_files`).
More sources than one SQLite connection attaches
(:data:`MAX_SOURCES`) are merged batch by batch into a staging journal, which is then merged
into ``into`` in that one transaction.

This module imports only the journal package and core (the journal layer's rule).
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import stat
import tempfile
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from sqlite_utils import Database

from pvisor.core.errors import (
    BadInputError,
    IntegrityError,
    OutputError,
    PvisorError,
    UnavailableError,
    UsageError,
)
from .housekeeping import blobs_named_by_rows, live_writers, open_for_writing, started_by
from .merge_checks import failed, verify_new_blobs
from .merge_files import created_at, directory_error, remove, remove_stale, temp_path, uri
from .merge_omit import leave_out, left_out, mark
from .merge_reap import exchanges_of, reap_image, reaped_rows
from .paths import absolute, make_directories, require_utf8
from .producer import now_ms
from .reader import BUSY_TIMEOUT_S, JournalReader
from .schema import MIGRATIONS, apply_migrations

#: sources one merge attaches at most: SQLite's default limit of attached databases
MAX_SOURCES = 10
#: the tables whose rows belong to a run (by ``id`` for runs, else ``run_id``), compared to tell
#: a run already present from a clash
RUN_TABLES = (("runs", "id"), ("attempts", "run_id"), ("exchanges", "run_id"), ("snapshots", "run_id"))
#: columns that differ between two copies of one run without its content differing
NOT_COMPARED = frozenset({"writer_id"})
#: run ids at a time in an ``IN (...)`` list
CHUNK = 500
#: the event written for each copied run
MERGED_EVENT = "run.merged"


class MergeClash(BadInputError):
    """A run, exchange or snapshot id held in two journals with different content (exit 65):
    ``kind`` (``run``, ``exchange``, ``snapshot``), ``ident`` and ``files`` (the two paths, the
    one holding it first). Nothing was merged."""

    def __init__(self, kind: str, ident: str, first: str, second: str, detail: str = ""):
        self.kind = kind
        self.ident = ident
        self.files = (first, second)
        super().__init__(
            f"{kind} {ident} is in both {first} and {second} with different content{detail}: "
            "nothing merged (merge the other runs only, or remove it from one of them)"
        )


@dataclass(slots=True)
class MergeReport:
    """What :func:`merge_journals` copied (or, with ``dry_run``, would copy) into ``into``.

    ``runs``: ids of the runs copied, in the order copied; ``skipped``: runs already present
    with the same content; ``attempts``, ``exchanges``, ``snapshots``, ``events`` (the source
    events copied, besides one ``run.merged`` event per run), ``writers``: rows copied;
    ``blobs_copied`` (bases included) and ``bytes_copied`` (their stored bytes); ``blobs_shared``:
    blobs the copied runs name that ``into`` held already or an earlier source brought, counted
    once per source (of more than :data:`MAX_SOURCES` sources, also those of a run that
    ``into`` turns out to hold already);
    ``missing_parents``: {run: parent run} of copied runs whose parent is in neither;
    ``created``: ``into`` did not exist (with ``dry_run``: would be created); ``sources``: per
    source ``{path, journal_id, runs, skipped}``; ``details``: per run copied or skipped, in that
    order, ``{run, source, copied, agent, mode, parent_run, boundary_step, exchanges, snapshots}``
    (``copied`` false: already present)."""

    into: str
    dry_run: bool = False
    created: bool = False
    runs: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    attempts: int = 0
    exchanges: int = 0
    snapshots: int = 0
    events: int = 0
    writers: int = 0
    blobs_copied: int = 0
    blobs_shared: int = 0
    bytes_copied: int = 0
    #: blobs left out (``omit_blobs``) that it would have copied
    blobs_omitted: int = 0
    missing_parents: dict[str, str] = field(default_factory=dict)
    sources: list[dict] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)
    #: Ctrl-C came after the merge committed: it is complete (what was left was cleanup)
    interrupted: bool = False
    #: the merge's transaction committed into ``into`` (a new ``into`` linked into place)
    committed: bool = False
    #: the signal that interrupted it (SIGINT, SIGTERM, SIGHUP), 0 when none did
    stopped_by: int = 0

    def as_dict(self) -> dict:
        return {
            name: getattr(self, name) for name in self.__slots__ if name not in ("committed", "stopped_by")
        }


class MergeInterrupted(PvisorError):
    """Ctrl-C (or SIGTERM, SIGHUP: a KeyboardInterrupt whose ``signum`` says which) before the
    merge committed: nothing merged, ``into`` as it was (exit 130, 143, 129: 128 + the signal)."""

    exit_code = 130


def stopped(signum: int) -> str:
    """How a merge's message says it was stopped: ``interrupted`` (Ctrl-C), ``stopped by SIGTERM``."""
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


@dataclass(slots=True)
class _Source:
    """One attached source: its ``path`` as given, schema ``alias`` (``s0``, ``s1``...), the
    reader that restores its manifests, and its plan."""

    path: str
    alias: str
    reader: JournalReader
    journal_id: str | None = None
    copy: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    writers: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Pass:
    """One merge into one journal: ``dst`` (how messages name it), the runs ``wanted`` (None:
    all), the ``report`` it fills; for a merge of more sources than one pass attaches
    (:func:`_merge_many`), ``via`` (run id -> the SRC it came from, for the runs of the staging
    journal, so that messages name that SRC) and ``staged`` (the schema that is the staging
    journal: ``main`` while batches are merged into it, ``s0`` when it is merged), ``mark``
    (write a ``run.merged`` event per run: not when the staging journal's are copied) and
    ``whole`` (a run of ``wanted`` in no source is an error: not for one batch of many)."""

    dst: str
    wanted: set[str] | None
    report: MergeReport
    via: dict[str, str] = field(default_factory=dict)
    staged: str | None = None
    mark: bool = True
    whole: bool = True
    omit: frozenset[str] = frozenset()

    def file(self, schema: str, sources: list[_Source], run: str) -> str:
        """The file that holds ``run`` in ``schema`` (``main``, or a source's alias)."""
        if schema == self.staged and run in self.via:
            return self.via[run]
        return self.dst if schema == "main" else next(s.path for s in sources if s.alias == schema)


def merge_journals(
    sources: Sequence[str | os.PathLike],
    into: str | os.PathLike,
    *,
    runs: Collection[str] | None = None,
    dry_run: bool = False,
    omit_blobs: Collection[str] = (),
) -> MergeReport:
    """Copy the runs of ``sources`` (all, or those whose id is in ``runs``) into the journal
    ``into`` (created with the schema when missing), in one transaction (module docstring).
    With ``dry_run`` nothing is written (not even a missing ``into``): the report says what
    would come. ``omit_blobs``: sha256 of blobs left out (module docstring). Raises UsageError
    (exit 2: no source, a source missing, a directory or not a regular file, a source that is
    ``into`` or given twice, a run of ``runs`` in no source, a path not UTF-8), BadInputError
    (65: not a journal, a newer schema), MergeClash (65), IntegrityError (3: a source damaged,
    or leaving out a blob ``into`` lacks), UnavailableError (69: a live writer on a source,
    ``into`` locked)."""
    srcs = [os.fspath(s) for s in sources]
    dst = os.fspath(into)
    _check_arguments(srcs, dst)
    wanted = None if runs is None else {runs} if isinstance(runs, str) else set(runs)
    # a dangling symbolic link is a missing DST, created at its target (journal/merge_files.py)
    report = MergeReport(into=dst, dry_run=dry_run, created=not os.path.exists(created_at(dst)))
    if not dry_run:
        remove_stale(created_at(dst))  # a killed merge's temporary journals
    try:
        with _as_found(srcs), _readers(srcs) as readers:
            for path, reader in zip(srcs, readers):
                _refuse_live_writers(reader, path, wanted)
            whole = _Pass(dst, wanted, report, omit=frozenset(omit_blobs))
            (_merge_many if len(srcs) > MAX_SOURCES else _merge_into)(readers, srcs, whole)
    except sqlite3.DatabaseError as exc:  # outside the merge's transaction (a lease, a migration)
        raise failed(exc, srcs, dst) from None
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)  # the CLI's SIGTERM and SIGHUP come as one
        report.stopped_by = signum
        linked = report.created and not report.dry_run and os.path.exists(dst)  # just after the link
        if not (report.committed or linked):  # rolled back, or the new DST removed by the finally blocks
            was = "does not exist (not created)" if report.created else "is as it was"
            raise MergeInterrupted(
                f"journal merge {stopped(signum)} before its commit: nothing merged; {dst} {was}",
                exit_code=128 + signum,
            ) from None
        report.interrupted = True  # the runs are in DST: only the sources' cleanup was cut short
    return report


@contextmanager
def _as_found(srcs: list[str]) -> Iterator[None]:
    """The sources left as they were: SQLite's read-only open of a WAL journal creates its
    ``-wal`` and ``-shm`` beside it when they are missing, and leaves them (a damaged source
    too). Those this merge created are removed once every connection is closed, when the
    ``-wal`` is still empty: nothing wrote to it, so nothing is lost (a writer that came
    meanwhile would have written to it, and then both stay). A ``-wal`` there before is left
    alone, with its ``-shm``: its writer's."""
    created = [(f"{p}-wal", f"{p}-shm") for p in srcs if not os.path.lexists(f"{p}-wal")]
    try:
        yield
    finally:
        for wal, shm in created:
            try:
                if os.path.lexists(wal) and os.path.getsize(wal) != 0:
                    continue
                for leftover in (wal, shm):
                    if os.path.lexists(leftover):
                        os.unlink(leftover)
            except OSError:
                pass  # a source on read-only media, or gone: nothing of ours is there


def _merge_into(readers: list[JournalReader], srcs: list[str], p: _Pass) -> None:
    """One pass of ``srcs`` into ``p.dst``: a new journal built beside it, or the one there."""
    if p.report.created and not p.report.dry_run:
        _merge_into_new(readers, srcs, p)
    else:
        with _destination(p.dst, p.report.dry_run, p.report.created) as conn:
            _merge(conn, readers, srcs, p)


# --------------------------------------------------------------------------- checks


def _check_arguments(srcs: list[str], dst: str) -> None:
    if not srcs:
        raise UsageError("journal merge: give at least one source journal")
    require_utf8("--into", dst)
    for s in srcs:
        require_utf8("journal", s)
    absolute(dst, f"--into {dst}")
    if os.path.isdir(dst):
        raise UsageError(f"--into {dst} is a directory, expected a journal file")
    _regular(dst, f"--into {dst}")
    seen: list[tuple[str, tuple[int, int]]] = []
    for s in srcs:
        absolute(s, f"journal {s}")
        try:
            st = os.stat(s)
        except OSError:
            continue  # the reader says what is wrong with it
        if not stat.S_ISDIR(st.st_mode):
            _regular(s, f"journal {s}")
        ident = (st.st_dev, st.st_ino)
        if os.path.exists(dst) and os.path.samefile(s, dst):
            raise UsageError(
                f"journal {s} is --into {dst} itself (the same file): a journal is not merged into itself"
            )
        for other, oid in seen:
            if oid == ident:
                raise UsageError(f"journal {s} is given twice (as {other} too): give each source once")
        seen.append((s, ident))


def _regular(path: str, named: str) -> None:
    """UsageError (exit 2) when ``path`` exists and is not a regular file (SQLite would block on
    a FIFO, or read a device)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise UsageError(
            f"{named} is not a regular file (a FIFO, a socket or a device), expected a journal file"
        )


@contextmanager
def _readers(paths: list[str]) -> Iterator[list[JournalReader]]:
    """A reader of each source (its checks: exists, a journal, not newer), closed at the end."""
    readers: list[JournalReader] = []
    try:
        for p in paths:
            readers.append(JournalReader(p))
        yield readers
    finally:
        for r in readers:
            r.close()


def _refuse_live_writers(reader: JournalReader, path: str, wanted: set[str] | None) -> None:
    """UnavailableError (exit 69) when a live writer lease holds the source ``path``: its rows
    may be half written (an exchange in flight), and its next commit would not come along. With
    ``wanted`` (the runs merged), only a live writer that wrote one of them refuses: a gateway
    capturing another run into the source leaves those runs whole."""
    alive = live_writers(reader.conn)
    busy: set[str] = set()
    if wanted is not None:
        writing = []
        for w in alive:
            theirs = _wrote(reader.conn, w[0]) & wanted
            if theirs:
                writing.append(w)
                busy |= theirs
        alive = writing
    if alive:
        who = ", ".join(f"pid {started_by(pid, host)} on {host}" for _, pid, host in alive)
        if wanted is None:
            why = "merge reads a source only when no writer holds it; stop that writer first"
        else:
            why = (
                f"it writes run {', '.join(sorted(busy))}, and merge reads a run only when no live writer "
                "wrote it; stop that writer first, or merge the other runs"
            )
        raise UnavailableError(f"journal {path} is being written ({who}): {why}")


def _wrote(conn: sqlite3.Connection, writer: int) -> set[str]:
    """The ids of the runs whose rows the writer ``writer`` wrote (exchanges, snapshots, events)."""
    tables = [t for t in ("exchanges", "snapshots", "events") if _has_table(conn, "main", t)]
    union = " UNION ".join(f"SELECT run_id FROM {t} WHERE writer_id = ?" for t in tables)
    return {r[0] for r in conn.execute(union, (writer,) * len(tables)) if r[0] is not None}


# --------------------------------------------------------------------------- destination


def _connect(uri: str) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    conn.execute("PRAGMA foreign_keys = OFF")
    return conn


@contextmanager
def _destination(dst: str, dry_run: bool, missing: bool) -> Iterator[sqlite3.Connection]:
    """A connection to the journal ``dst`` that exists (migrated to this pvisor's schema; read-only
    with ``dry_run``), or with ``dry_run`` and ``missing`` an empty journal in memory."""
    if missing:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        apply_migrations(Database(conn))
    elif dry_run:
        with JournalReader(dst):  # its checks: a journal, not newer
            pass
        conn = _connect(uri(dst, "ro"))
    else:
        with JournalReader(dst) as reader:  # its checks: a journal, not newer
            pending = MIGRATIONS.pending(Database(reader.conn))
        if pending:
            open_for_writing(Path(dst)).close()  # migrated to this pvisor's schema
        conn = _connect(uri(dst, None))
    try:
        yield conn
    finally:
        conn.close()


def _new_journal(path: str) -> sqlite3.Connection:
    """A new journal at ``path`` (mode 0600): this pvisor's schema and its own ``meta`` (a fresh
    fingerprint key and journal id, as the writer makes them). In SQLite's rollback-journal mode
    while it is built: what a commit wrote is in the file itself, which is linked whole."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    conn = _connect(uri(path, None))
    apply_migrations(Database(conn))
    conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?)",
        [
            ("fingerprint_key", secrets.token_hex(32)),
            ("journal_id", "j-" + secrets.token_hex(8)),
            ("created_ms", str(now_ms())),
        ],
    )
    return conn


def _to_wal(path: str) -> None:
    """Switch the journal ``path`` to WAL mode, as every journal is (the writer does it too, at its
    first open: a failure here is left to it)."""
    try:
        conn = sqlite3.connect(uri(path, None), uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
    except sqlite3.Error:
        pass


def _merge_into_new(readers: list[JournalReader], srcs: list[str], p: _Pass) -> None:
    """Merge into a journal built beside ``dst`` under a temporary name, linked as ``dst`` once
    it is complete: a failed merge leaves nothing, and a file made meanwhile at ``dst`` is not
    overwritten (UnavailableError)."""
    dst, at = p.dst, created_at(p.dst)
    parent = os.path.dirname(os.path.abspath(at))
    try:
        made = make_directories(parent)
    except OSError as exc:
        raise directory_error(dst, parent, exc) from None
    tmp = temp_path(parent, os.path.basename(at))
    done = False
    try:
        try:
            conn = _new_journal(tmp)
        except OSError as exc:
            raise UnavailableError(f"cannot create journal {dst}: {exc.strerror}") from None
        try:
            _merge(conn, readers, srcs, p)
        finally:
            conn.close()
        try:
            os.link(tmp, at)
        except FileExistsError:
            raise UnavailableError(
                f"--into {dst}: the file appeared while the merge ran; nothing merged"
            ) from None
        except OSError:
            try:
                os.replace(tmp, at)  # a file system without hard links
            except OSError as exc:
                raise OutputError(f"cannot create journal {dst}: {exc.strerror}; nothing merged") from None
        done = p.report.committed = True
        _to_wal(dst)
    finally:
        remove(tmp)
        for d in reversed(made if not done else []):  # a failed merge leaves no directory either
            try:
                os.rmdir(d)
            except OSError:
                break


def _merge_many(readers: list[JournalReader], srcs: list[str], p: _Pass) -> None:
    """More sources than one connection attaches (:data:`MAX_SOURCES`): each batch of them is
    merged into a staging journal (beside DST; with a dry run, in the temporary directory), then
    the staging journal into DST in one pass, which is the one transaction on DST. Messages name
    the SRC each run came from (``via``); the report is the final pass's, with the batches'
    sources, details and runs found the same in two SRCs."""
    dry = p.report.dry_run
    where = tempfile.gettempdir() if dry else os.path.dirname(os.path.abspath(p.dst))
    if not dry:
        try:
            make_directories(where)
        except OSError as exc:
            raise directory_error(p.dst, where, exc) from None
    staging = temp_path(where, "")
    batches: list[MergeReport] = []
    try:
        try:
            _new_journal(staging).close()
        except OSError as exc:
            raise UnavailableError(f"cannot create a staging journal in {where}: {exc.strerror}") from None
        for i in range(0, len(srcs), MAX_SOURCES):
            part = _Pass(staging, p.wanted, MergeReport(into=staging), via=p.via, staged="main", whole=False)
            conn = _connect(uri(staging, None))
            try:
                _merge(conn, readers[i : i + MAX_SOURCES], srcs[i : i + MAX_SOURCES], part)
            finally:
                conn.close()
            p.via.update((d["run"], d["source"]) for d in part.report.details if d["copied"])
            batches.append(part.report)
        found = {r for b in batches for r in (*b.runs, *b.skipped)}
        if p.wanted is not None and p.wanted - found:
            missing = ", ".join(sorted(p.wanted - found))
            raise UsageError(f"no run {missing} in {', '.join(srcs)}: nothing merged")
        final = _Pass(p.dst, None, p.report, via=p.via, staged="s0", mark=False, omit=p.omit)
        with JournalReader(staging) as reader:
            _merge_into([reader], [staging], final)
    finally:
        remove(staging)
    _report_many(p.report, batches)


def _report_many(report: MergeReport, batches: list[MergeReport]) -> None:
    """The report of :func:`_merge_many`: the final pass's counts (what DST gets), the events of
    the sources without the staging journal's ``run.merged`` ones, runs skipped in a batch (the
    same in two SRCs) or in DST, and the sources and details of the batches."""
    there = set(report.skipped)
    report.events -= len(report.runs)  # the run.merged events the batches wrote are not the sources'
    report.skipped = [r for b in batches for r in b.skipped] + report.skipped
    report.blobs_shared += sum(b.blobs_shared for b in batches)
    report.sources = [
        {
            **s,
            "runs": [r for r in s["runs"] if r not in there],
            "skipped": s["skipped"] + [r for r in s["runs"] if r in there],
        }
        for b in batches
        for s in b.sources
    ]
    report.details = [
        {**d, "copied": d["copied"] and d["run"] not in there} for b in batches for d in b.details
    ]


# --------------------------------------------------------------------------- the merge


def _merge(conn: sqlite3.Connection, readers: list[JournalReader], srcs: list[str], p: _Pass) -> None:
    """Attach the sources, plan each in turn against ``dst`` and the sources before it, then
    (unless a dry run) copy, all in one transaction."""
    dst, report = p.dst, p.report
    sources = [_Source(path, f"s{i}", reader) for i, (path, reader) in enumerate(zip(srcs, readers))]
    try:
        for s in sources:
            conn.execute(f"ATTACH DATABASE ? AS {s.alias}", (uri(s.path, "ro"),))
            row = conn.execute(f"SELECT value FROM {s.alias}.meta WHERE key = 'journal_id'").fetchone()
            s.journal_id = row[0] if row else None
        conn.execute("BEGIN" if report.dry_run else "BEGIN IMMEDIATE")
        try:
            _plan_all(conn, sources, p)
            if not report.dry_run:
                for s in sources:
                    _copy(conn, s, p.mark)
                if report.blobs_omitted:  # its runs name blobs it does not hold (module docstring)
                    mark(conn)
                conn.execute("COMMIT")
                # into the journal there; a new one's counts once it is linked into place
                report.committed = not report.created
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except sqlite3.DatabaseError as exc:
        raise failed(exc, srcs, dst) from None


def _columns(conn: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def _common(conn: sqlite3.Connection, a: str, b: str, table: str) -> list[str]:
    """The columns of ``table`` that the schemas ``a`` and ``b`` both have (an older journal has
    fewer: a column it lacks takes its default in the copy), in ``b``'s order."""
    have = set(_columns(conn, a, table))
    return [c for c in _columns(conn, b, table) if c in have]


def _plan_all(conn: sqlite3.Connection, sources: list[_Source], p: _Pass) -> None:
    """Decide what each source brings (runs to copy or skip, writers, blobs) and fill ``report``;
    MergeClash or IntegrityError before anything is written."""
    wanted, report = p.wanted, p.report
    conn.execute("CREATE TEMP TABLE merge_planned_blobs (sha TEXT PRIMARY KEY)")
    origin: dict[str, str] = {}  # run id -> the schema that holds it first (main, s0, s1...)
    for (rid,) in conn.execute("SELECT id FROM main.runs"):
        origin[rid] = "main"
    found: set[str] = set()
    for s in sources:
        reap_image(conn, s.alias, s.reader)
    for s in sources:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {s.alias}.runs ORDER BY created_ms, rowid")]
        if wanted is not None:
            ids = [i for i in ids if i in wanted]
        found.update(ids)
        for rid in ids:
            first = origin.get(rid)
            if first is None:
                s.copy.append(rid)
                origin[rid] = s.alias
            elif _same_run(conn, s.alias, first, rid):
                s.skip.append(rid)
            else:
                raise MergeClash("run", rid, p.file(first, sources, rid), p.file(s.alias, sources, rid))
        conn.execute(f"CREATE TEMP TABLE merge_runs_{s.alias} (id TEXT PRIMARY KEY)")
        conn.executemany(f"INSERT INTO temp.merge_runs_{s.alias} VALUES (?)", [(r,) for r in s.copy])
        earlier = ["main", *(o.alias for o in sources[: sources.index(s)])]
        _id_clashes(conn, s, earlier, sources, p)
        _plan_blobs(conn, s, p)
        if p.staged != "s0":  # the staging journal's blobs were checked as each batch came in
            verify_new_blobs(conn, f"merge_blobs_{s.alias}", s.alias, s.reader, p.file(s.alias, sources, ""))
        _count(conn, s, report)
        report.runs.extend(s.copy)
        report.skipped.extend(s.skip)
        report.sources.append({"path": s.path, "journal_id": s.journal_id, "runs": s.copy, "skipped": s.skip})
        report.details.extend(_details(conn, s))
    if p.whole and wanted is not None and wanted - found:
        missing = ", ".join(sorted(wanted - found))
        raise UsageError(f"no run {missing} in {', '.join(s.path for s in sources)}: nothing merged")
    for s in sources:
        for rid, parent in conn.execute(
            f"SELECT id, parent_run FROM {s.alias}.runs"
            f" WHERE id IN (SELECT id FROM temp.merge_runs_{s.alias}) AND parent_run IS NOT NULL"
        ):
            if parent not in origin:
                report.missing_parents[rid] = parent


def _details(conn: sqlite3.Connection, s: _Source) -> list[dict]:
    """:attr:`MergeReport.details` of the runs of ``s``, copied then skipped."""
    snaps = (
        f"(SELECT count(*) FROM {s.alias}.snapshots x WHERE x.run_id = r.id)"
        if _has_table(conn, s.alias, "snapshots")
        else "0"
    )
    out = []
    for ids, copied in ((s.copy, True), (s.skip, False)):
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i : i + CHUNK]
            rows = conn.execute(
                f"SELECT r.id, r.agent, r.mode, r.parent_run, r.boundary_step,"
                f" (SELECT count(*) FROM {s.alias}.exchanges x WHERE x.run_id = r.id), {snaps}"
                f" FROM {s.alias}.runs r WHERE r.id IN ({','.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            by_id = {r[0]: r for r in rows}
            for rid in chunk:
                r = by_id[rid]
                out.append(
                    {"run": rid, "source": s.path, "copied": copied, "agent": r[1], "mode": r[2],
                     "parent_run": r[3], "boundary_step": r[4], "exchanges": r[5], "snapshots": r[6]}
                )  # fmt: skip
    return out


def _has_table(conn: sqlite3.Connection, schema: str, table: str) -> bool:
    return (
        conn.execute(
            f"SELECT 1 FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        is not None
    )


def _same_run(conn: sqlite3.Connection, a: str, b: str, rid: str) -> bool:
    """Whether the run ``rid`` has the same rows in the schemas ``a`` and ``b`` (:data:`RUN_TABLES`,
    every column both have but :data:`NOT_COMPARED`)."""
    for table, key in RUN_TABLES:
        if not (_has_table(conn, a, table) and _has_table(conn, b, table)):
            for schema in (a, b):
                if (
                    _has_table(conn, schema, table)
                    and conn.execute(
                        f"SELECT 1 FROM {schema}.{table} WHERE {key} = ? LIMIT 1", (rid,)
                    ).fetchone()
                ):
                    return False
            continue
        cols = ", ".join(c for c in _common(conn, a, b, table) if c not in NOT_COMPARED)
        rows = {x: exchanges_of(conn, x) if table == "exchanges" else f"{x}.{table}" for x in (a, b)}
        for x, y in ((a, b), (b, a)):
            differ = conn.execute(
                f"SELECT 1 FROM (SELECT {cols} FROM {rows[x]} WHERE {key} = ? "
                f"EXCEPT SELECT {cols} FROM {rows[y]} WHERE {key} = ?) LIMIT 1",
                (rid, rid),
            ).fetchone()
            if differ:
                return False
    return True


def _id_clashes(
    conn: sqlite3.Connection, s: _Source, earlier: list[str], sources: list[_Source], p: _Pass
) -> None:
    """MergeClash when an exchange or snapshot of a run ``s`` copies has an id that ``dst`` or an
    earlier source holds (for another run: the run itself is new)."""
    for table, kind in (("exchanges", "exchange"), ("snapshots", "snapshot")):
        if not _has_table(conn, s.alias, table):
            continue
        for e in earlier:
            if not _has_table(conn, e, table):
                continue
            limit = "" if e == "main" else f" AND d.run_id IN (SELECT id FROM temp.merge_runs_{e})"
            row = conn.execute(
                f"SELECT x.id, x.run_id, d.run_id FROM {s.alias}.{table} x JOIN {e}.{table} d ON d.id = x.id"
                f" WHERE x.run_id IN (SELECT id FROM temp.merge_runs_{s.alias}){limit} LIMIT 1"
            ).fetchone()
            if row:
                there, here = p.file(e, sources, row[2]), p.file(s.alias, sources, row[1])
                raise MergeClash(kind, row[0], there, here, f" (run {row[2]} there, run {row[1]} here)")


def _named_blobs(conn: sqlite3.Connection, s: _Source) -> set[str]:
    """The blobs the runs ``s`` copies name (module docstring), read from the source."""
    named: set[str] = set()
    r = s.reader
    has_ws = "workspace_snapshot" in _columns(conn, s.alias, "runs")
    for i in range(0, len(s.copy), CHUNK):
        chunk = s.copy[i : i + CHUNK]
        where = f"run_id IN ({','.join('?' * len(chunk))})"
        named |= _source_blobs(r, where, tuple(chunk))
        if has_ws:
            for (sha,) in r.conn.execute(
                f"SELECT workspace_snapshot FROM runs WHERE workspace_snapshot IS NOT NULL AND id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            ):
                # a handoff's restored snapshot is another run's: brought when the source has it
                if r.conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)).fetchone():
                    named.add(sha)
                    named.update(_manifest_files(r.blob(sha)))
    return named


def _source_blobs(reader: JournalReader, where: str, args: tuple) -> set[str]:
    """:func:`~pvisor.journal.housekeeping.blobs_named_by_rows` of the source, on a journal older
    than the snapshots table too."""
    if not _has_table(reader.conn, "main", "snapshots"):
        named: set[str] = set()
        cols = [c for c in ("request_body", "response_body", "response_final", "forwarded_body")
                if c in _columns(reader.conn, "main", "exchanges")]  # fmt: skip
        for row in reader.conn.execute(f"SELECT {', '.join(cols)} FROM exchanges WHERE {where}", args):
            named.update(v for v in row if v)
        return named
    return blobs_named_by_rows(reader.conn, reader.blob, where, args)


def _manifest_files(data: bytes) -> list[str]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return []
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return [e["sha256"] for e in entries or () if isinstance(e, dict) and isinstance(e.get("sha256"), str)]


def _in(x: str, table: str, column: str) -> str:
    """SQL: whether the value ``x`` (a qualified column of the outer query) is in ``table.column``,
    one index lookup per value (``x IN (SELECT ...)`` may scan the whole table instead: DST's
    blobs, however many)."""
    return f"EXISTS (SELECT 1 FROM {table} q WHERE q.{column} = {x})"


def _present(x: str) -> str:
    """SQL: whether the blob ``x`` is in ``main`` or brought by an earlier source."""
    return f"({_in(x, 'main.blobs', 'sha256')} OR {_in(x, 'temp.merge_planned_blobs', 'sha')})"


def _plan_blobs(conn: sqlite3.Connection, s: _Source, p: _Pass) -> None:
    """Which blobs ``s`` brings (``temp.merge_blobs_<alias>``): those its runs name, with their
    bases, that neither ``main`` nor an earlier source holds, nor ``p.omit`` leaves out.
    IntegrityError for a blob named and held by none, a base missing, or a blob whose size
    differs from ``main``'s."""
    a, report = s.alias, p.report
    named = _named_blobs(conn, s)
    conn.execute(f"CREATE TEMP TABLE merge_named_{a} (sha TEXT PRIMARY KEY)")
    conn.executemany(f"INSERT INTO temp.merge_named_{a} VALUES (?)", [(x,) for x in named])
    row = conn.execute(
        f"SELECT n.sha FROM temp.merge_named_{a} n WHERE NOT {_in('n.sha', f'{a}.blobs', 'sha256')}"
        f" AND NOT {_present('n.sha')} LIMIT 1"
    ).fetchone()
    if row and left_out(conn, a):
        raise IntegrityError(
            f"journal {s.path} leaves out blobs its runs name, for a journal that holds them, and "
            f"{p.dst} does not hold blob {row[0]}: merge it into the journal its runs came from; "
            "nothing merged"
        )
    if row:
        raise IntegrityError(
            f"journal {s.path} is damaged: its runs name blob {row[0]}, which it does not hold "
            f"(pvisor --journal {s.path} journal verify); nothing merged"
        )
    row = conn.execute(
        f"SELECT n.sha, b.size, d.size FROM temp.merge_named_{a} n JOIN {a}.blobs b ON b.sha256 = n.sha"
        " JOIN main.blobs d ON d.sha256 = n.sha WHERE b.size != d.size LIMIT 1"
    ).fetchone()
    if row:
        raise IntegrityError(
            f"blob {row[0]} is {row[1]} bytes in journal {s.path} and {row[2]} bytes in the journal merged "
            "into: one of them is damaged; nothing merged"
        )
    conn.execute(f"CREATE TEMP TABLE merge_blobs_{a} (sha TEXT PRIMARY KEY)")
    # the named blobs and, through every blob that must come, its base (a frame is restored
    # from its base): a blob main holds brings nothing, its own bases are main's already
    conn.execute(
        f"""INSERT INTO temp.merge_blobs_{a}
        WITH RECURSIVE need(sha) AS (
            SELECT sha FROM temp.merge_named_{a}
            UNION
            SELECT b.base FROM need n JOIN {a}.blobs b ON b.sha256 = n.sha
            WHERE b.base IS NOT NULL AND NOT {_present("n.sha")}
        )
        SELECT need.sha FROM need WHERE {_in("need.sha", f"{a}.blobs", "sha256")}
        AND NOT {_present("need.sha")}"""
    )
    row = conn.execute(
        f"SELECT b.sha256, b.base FROM temp.merge_blobs_{a} m JOIN {a}.blobs b ON b.sha256 = m.sha"
        f" WHERE b.base IS NOT NULL AND NOT {_in('b.base', f'temp.merge_blobs_{a}', 'sha')}"
        f" AND NOT {_present('b.base')} LIMIT 1"
    ).fetchone()
    if row:
        raise IntegrityError(
            f"journal {s.path} is damaged: blob {row[0]} is stored against base {row[1]}, which it does "
            "not hold; nothing merged"
        )
    if p.omit:  # after the base check: a blob it keeps may be stored against one left out
        report.blobs_omitted += leave_out(conn, a, p.omit)
    copied, stored = conn.execute(
        f"SELECT count(*), coalesce(sum(length(b.data)), 0) FROM temp.merge_blobs_{a} m"
        f" JOIN {a}.blobs b ON b.sha256 = m.sha"
    ).fetchone()
    report.blobs_copied += copied
    report.bytes_copied += stored
    report.blobs_shared += conn.execute(
        f"SELECT count(*) FROM temp.merge_named_{a} n WHERE {_present('n.sha')}"
    ).fetchone()[0]
    conn.execute(f"INSERT OR IGNORE INTO temp.merge_planned_blobs SELECT sha FROM temp.merge_blobs_{a}")


def _by_run(s: _Source, table: str) -> str:
    return f"{s.alias}.{table} WHERE run_id IN (SELECT id FROM temp.merge_runs_{s.alias})"


def _count(conn: sqlite3.Connection, s: _Source, report: MergeReport) -> None:
    """Add the rows ``s`` brings to ``report``; note the writers they name."""
    counts = {}
    for table in ("attempts", "exchanges", "snapshots", "events"):
        if _has_table(conn, s.alias, table):
            counts[table] = conn.execute(f"SELECT count(*) FROM {_by_run(s, table)}").fetchone()[0]
    report.attempts += counts.get("attempts", 0)
    report.exchanges += counts.get("exchanges", 0)
    report.snapshots += counts.get("snapshots", 0)
    report.events += counts.get("events", 0)
    named = [
        f"SELECT writer_id FROM {_by_run(s, t)}"
        for t in ("exchanges", "snapshots", "events")
        if _has_table(conn, s.alias, t) and "writer_id" in _columns(conn, s.alias, t)
    ]
    s.writers = [
        r[0]
        for r in conn.execute(
            f"SELECT id FROM {s.alias}.writers WHERE id IN ({' UNION '.join(named)}) ORDER BY id"
        )
    ]
    report.writers += len(s.writers)


def _copy(conn: sqlite3.Connection, s: _Source, mark: bool) -> None:
    """Copy what :func:`_plan_all` chose of ``s`` into ``main`` (inside the transaction)."""
    a = s.alias
    conn.execute(f"CREATE TEMP TABLE merge_writers_{a} (old INTEGER PRIMARY KEY, new INTEGER)")
    wcols = [c for c in _common(conn, a, "main", "writers") if c != "id"]
    for old in s.writers:
        cur = conn.execute(
            f"INSERT INTO main.writers ({', '.join(wcols)})"
            f" SELECT {', '.join(wcols)} FROM {a}.writers WHERE id = ?",
            (old,),
        )
        conn.execute(f"INSERT INTO temp.merge_writers_{a} VALUES (?, ?)", (old, cur.lastrowid))
    # a lease left open is a dead one (a live writer of a copied run refuses the merge): closed
    # as its reaper closes it, so that no writer of DST takes it for live or reaps it again
    conn.execute(
        "UPDATE main.writers SET closed_ms = ?, closed_how = 'dead' WHERE closed_ms IS NULL"
        f" AND id IN (SELECT new FROM temp.merge_writers_{a})",
        (now_ms(),),
    )
    cols = ", ".join(_common(conn, a, "main", "blobs"))
    conn.execute(
        f"INSERT OR IGNORE INTO main.blobs ({cols}) SELECT {cols} FROM {a}.blobs"
        f" WHERE sha256 IN (SELECT sha FROM temp.merge_blobs_{a})"
    )
    reaped = reaped_rows(conn, a)
    if reaped:  # the responses its reaper joins from their parts
        conn.execute(
            "INSERT OR IGNORE INTO main.blobs (sha256, size, codec, base, data)"
            f" SELECT sha256, size, codec, base, data FROM temp.merge_reaped_blobs_{a}"
        )
    cols = ", ".join(_common(conn, a, "main", "runs"))
    conn.execute(
        f"INSERT INTO main.runs ({cols}) SELECT {cols} FROM {a}.runs"
        f" WHERE id IN (SELECT id FROM temp.merge_runs_{a}) ORDER BY rowid"
    )
    remap = f"(SELECT w.new FROM temp.merge_writers_{a} w WHERE w.old = writer_id)"
    for table in ("attempts", "exchanges", "snapshots"):
        if not _has_table(conn, a, table):
            continue
        names = _common(conn, a, "main", table)
        picked = ", ".join(remap if c == "writer_id" else c for c in names)
        rows = _by_run(s, table)
        if table == "exchanges" and reaped:  # in its source's order (the view has no rowid)
            rows = (
                f"{exchanges_of(conn, a)} x WHERE run_id IN (SELECT id FROM temp.merge_runs_{a})"
                f" ORDER BY (SELECT o.rowid FROM {a}.exchanges o WHERE o.id = x.id)"
            )
        else:
            rows += " ORDER BY rowid"
        conn.execute(f"INSERT INTO main.{table} ({', '.join(names)}) SELECT {picked} FROM {rows}")
    if _has_table(conn, a, "response_parts"):
        joined = f" AND exchange_id NOT IN (SELECT id FROM temp.merge_reaped_{a})" if reaped else ""
        conn.execute(
            "INSERT INTO main.response_parts (exchange_id, offset, data) SELECT exchange_id, offset, data"
            f" FROM {a}.response_parts WHERE exchange_id IN (SELECT id FROM {_by_run(s, 'exchanges')})"
            + joined
        )
    conn.execute(
        f"INSERT INTO main.events (ts_ms, kind, run_id, exchange_id, writer_id, data)"
        f" SELECT ts_ms, kind, run_id, exchange_id, {remap}, data FROM {_by_run(s, 'events')} ORDER BY seq"
    )
    t = now_ms()
    for rid in s.copy if mark else ():
        conn.execute(
            "INSERT INTO main.events (ts_ms, kind, run_id, exchange_id, writer_id, data)"
            " VALUES (?, ?, ?, NULL, NULL, ?)",
            (t, MERGED_EVENT, rid, orjson.dumps(_merged_data(conn, s, rid)).decode()),
        )


def _merged_data(conn: sqlite3.Connection, s: _Source, rid: str) -> dict:
    """The data of the ``run.merged`` event of ``rid``: ``from_journal`` (the source's journal
    id) and ``fingerprints`` (the journal whose key made its secret fingerprints: the source's,
    or the one the source's own ``run.merged`` event names)."""
    keyed = s.journal_id
    row = conn.execute(
        f"SELECT data FROM {s.alias}.events WHERE run_id = ? AND kind = ? ORDER BY seq DESC LIMIT 1",
        (rid, MERGED_EVENT),
    ).fetchone()
    if row:
        try:
            keyed = orjson.loads(row[0]).get("fingerprints", keyed)
        except (orjson.JSONDecodeError, AttributeError):
            pass
    return {"from_journal": s.journal_id, "fingerprints": keyed}


__all__ = ["MAX_SOURCES", "MergeClash", "MergeInterrupted", "MergeReport", "merge_journals", "stopped"]
