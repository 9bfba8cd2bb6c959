"""Removing from a journal: a run (``pvisor journal rm``) and the space it held (``pvisor journal
vacuum``), docs/journal.md "Removing a run".

A run is removed with everything that names it: its ``runs`` row, attempts, exchanges (and
their ``response_parts``), events and snapshots, and its run directory (``<data dir>/runs/<id>``:
the agent's output, its private home, exports). Bodies are content-addressed and shared: a
blob of the run goes only when no remaining row names it, as a body of an exchange, as a
snapshot's manifest or a file a manifest lists, or as the ``base`` of another blob's prefix
frame (which could not be restored without it). Runs derived from the removed one keep their
rows; their ``parent_run`` then names a run that is gone (reported). A run removed with
``force`` while a gateway still wrote it gets exchanges again without a run row: ``rm`` of
that whole id removes them (and any other row naming it) as it removes a run.

Both refuse while another process holds a live writer lease (the gateway or ``pvisor run``
writing: it keeps lane state and could commit a body whose base was just removed) unless
``force``; a lease whose process is gone does not count (the writer's own reaping rule).
Everything happens in one ``BEGIN IMMEDIATE`` transaction: an interrupted rm removes nothing.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import orjson
from sqlite_utils import Database

from pvisor.core.errors import UnavailableError, UsageError
from pvisor.core.helpers import HELPER_FLAG
from .paths import run_directory
from .producer import now_ms
from .reader import BUSY_TIMEOUT_S, JournalReader
from .schema import apply_migrations
from .writer import DEAD_AFTER_MS, pid_alive, proc_start

#: the blob-valued columns of each table that has any
BLOB_COLUMNS = {
    "exchanges": ("request_body", "response_body", "response_final", "forwarded_body"),
    "snapshots": ("manifest",),
}


@dataclass(slots=True)
class RemoveReport:
    """What :func:`remove_run` removed: ``run``, row counts (``attempts``, ``exchanges``,
    ``events``, ``snapshots``), ``blobs_removed`` and ``blobs_kept`` (of the run's, those
    another run still names), ``bytes_freed`` (stored bytes of the removed blobs),
    ``run_dir`` (removed, or None when there was none), ``orphaned_children`` (derived runs
    whose parent it was)."""

    run: str
    attempts: int = 0
    exchanges: int = 0
    events: int = 0
    snapshots: int = 0
    blobs_removed: int = 0
    blobs_kept: int = 0
    bytes_freed: int = 0
    run_dir: str | None = None
    orphaned_children: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


def live_writers(conn: sqlite3.Connection) -> list[tuple[int, int, str]]:
    """(writer id, pid, host) of every open lease whose process still runs: on this host its pid
    is alive with the same start time, elsewhere its heartbeat is recent."""
    host = socket.gethostname()
    t = now_ms()
    alive = []
    for wid, pid, whost, pstart, heartbeat in conn.execute(
        "SELECT id, pid, host, proc_start, heartbeat_ms FROM writers WHERE closed_ms IS NULL"
    ):
        if whost == host:
            live = pid_alive(pid) and (pstart is None or proc_start(pid) == pstart)
        else:
            live = t - heartbeat <= DEAD_AFTER_MS
        if live:
            alive.append((wid, pid, whost))
    return alive


def open_for_writing(path: Path) -> sqlite3.Connection:
    """A read-write connection to the journal ``path`` (checked as a reader checks it first:
    exists, is a journal, not written by a newer pvisor), its schema migrated to this pvisor's."""
    with JournalReader(path):
        pass
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        apply_migrations(Database(conn))
    except sqlite3.OperationalError as exc:
        conn.close()
        raise UnavailableError(f"cannot open journal {path} for writing: {exc}") from None
    return conn


def journal_bytes(path: Path) -> int:
    """The size in bytes of the journal ``path`` and its WAL together (what vacuum and scrub
    report before and after)."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))


def started_by(pid: int, host: str) -> int:
    """The process the user started for the writer ``pid`` on ``host``: a writer process
    (journal/writer_process.py) is the child of a gateway or ``pvisor run``, which is named
    instead; any other writer (a thread of that process, or one on another host) is itself."""
    if host != socket.gethostname():
        return pid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            parent = int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return pid
    child = any(b"pvisor.journal.writer_child" in a for a in argv) or argv[1:3] == [
        HELPER_FLAG.encode(),
        b"writer",
    ]
    return parent if child and parent > 1 else pid


def _named(pid: int, host: str) -> str:
    user = started_by(pid, host)
    return f"pid {pid} on {host}" if user == pid else f"pid {user} on {host} (its writer process: pid {pid})"


def check_writers(conn: sqlite3.Connection, path: Path, force: bool, what: str) -> None:
    """UnavailableError (exit 69) naming the live writers of the journal ``path`` (pid and host
    of each lease, :func:`live_writers`) and the command ``what`` that refuses to run beside
    them; nothing unless ``force``."""
    if force:
        return
    alive = live_writers(conn)
    if alive:
        who = ", ".join(_named(pid, host) for _, pid, host in alive)
        raise UnavailableError(
            f"journal {path} is being written ({who}): {what} refuses while it runs; stop it first, "
            "or give --force"
        )


def _manifest_files(data: bytes) -> Iterable[str]:
    """The file blobs a snapshot manifest lists (nothing for one that does not parse: then it
    names no blob this module could keep)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ()
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return [e["sha256"] for e in entries or () if isinstance(e, dict) and isinstance(e.get("sha256"), str)]


def blobs_named_by_rows(conn: sqlite3.Connection, reader_blob, where: str, args: tuple) -> set[str]:
    """The sha256 hex digests of the blobs named by the exchange and snapshot rows matching
    ``where`` (``run_id = ?`` or its negation, with ``args``), manifests' file blobs included;
    ``reader_blob(sha)`` gives a manifest's bytes (:meth:`JournalReader.blob`). Shared by rm and
    scrub (:mod:`pvisor.journal.scrub`)."""
    named: set[str] = set()
    for table, columns in BLOB_COLUMNS.items():
        for row in conn.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE {where}", args):
            named.update(v for v in row if v)
    for (manifest,) in conn.execute(
        f"SELECT manifest FROM snapshots WHERE manifest IS NOT NULL AND {where}", args
    ):
        named.update(_manifest_files(reader_blob(manifest)))
    return named


#: how many of the runs a prefix starts a refusal names (then "and N more")
NAMED_RUNS = 5


def runs_to_remove(journal: str | os.PathLike, run_id: str, *, prefix: bool = False) -> list[dict]:
    """The runs ``pvisor journal rm`` removes, as :meth:`JournalReader.run_summaries` gives them
    (oldest first): the run whose id is ``run_id``, whole; with ``prefix``, every run whose id
    starts with ``run_id`` (case counts). A unique prefix, which the reading commands take, is not
    enough to remove a run: ``rm r-`` once removed the only run. UsageError (exit 2) when none is
    chosen; one that only starts some ids names them (:data:`NAMED_RUNS` at most) and says to
    give the whole id or ``--prefix``; IntegrityError (exit 3) when a chosen run's id is not a run
    id (:func:`journal.paths.run_directory`: a damaged journal), before any run is removed. Reads
    the journal only."""
    with JournalReader(journal) as reader:
        summaries = reader.run_summaries()
    where = os.fspath(journal)
    starting = [s for s in summaries if s["id"].startswith(run_id)]
    if prefix:
        if not starting:
            raise UsageError(f"no run id starts with {run_id!r} in journal {where}")
        for s in starting:  # a damaged id is reported before any run is removed
            run_directory(journal, s["id"])
        return starting
    exact = [s for s in starting if s["id"] == run_id]
    if exact:
        run_directory(journal, run_id)
        return exact
    left = leftovers(journal, run_id)
    if left:  # rows of a whole id whose run row is gone (module docstring)
        return [
            {
                "id": run_id,
                "agent": None,
                "mode": None,
                "created_ms": None,
                "exchanges": left.get("exchanges", 0),
            }
        ]
    if starting:
        ids = [s["id"] for s in starting]
        named = ", ".join(ids[:NAMED_RUNS]) + (
            f" and {len(ids) - NAMED_RUNS} more" if len(ids) > NAMED_RUNS else ""
        )
        raise UsageError(
            f"no run {run_id!r} in journal {where}; it is the start of {named}: rm takes a whole run id, "
            f"or --prefix to remove every run it starts (--dry-run lists them)"
        )
    raise UsageError(f"no run {run_id!r} in journal {where}")


#: the tables whose rows name a run by ``run_id``
RUN_TABLES = ("attempts", "exchanges", "events", "snapshots")


def leftovers(journal: str | os.PathLike, run_id: str) -> dict[str, int]:
    """The rows that still name the run ``run_id`` (whole id) per table of :data:`RUN_TABLES`,
    those with any: a run removed with ``--force`` while a gateway wrote it gets exchanges again,
    with no run row, which ``pvisor journal rm`` of that id removes. Reads the journal only."""
    with JournalReader(journal) as reader:
        counts = {
            t: reader.conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", (run_id,)).fetchone()[0]
            for t in RUN_TABLES
        }
    return {t: n for t, n in counts.items() if n}


def remove_run(journal: str | os.PathLike, run_id: str, *, force: bool = False) -> RemoveReport:
    """Remove the run ``run_id`` (or a unique prefix) from the journal and its run directory
    (module docstring); an id with rows but no run row (:func:`leftovers`) has them removed.
    Raises UsageError for an unknown or ambiguous run, UnavailableError (exit 69) while a live
    writer holds the journal (without ``force``) or when it stays locked, IntegrityError when a
    manifest it must read is damaged."""
    path = Path(journal)
    with JournalReader(path) as reader:
        whole = reader.conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone()
        if whole is None and leftovers(path, run_id):
            run = run_id  # rows of a run whose row is gone (module docstring), before any prefix
        else:
            run = reader.run(run_id).id  # UsageError names the run and the journal
    run_dir = run_directory(path, run)  # IntegrityError for a crafted id, before anything changes
    conn = open_for_writing(path)
    try:
        check_writers(conn, path, force, f"rm {run}")
        with JournalReader(path) as reader:  # restores manifests (they are blobs too)
            conn.execute("BEGIN IMMEDIATE")
            try:
                report = _remove(conn, reader.blob, run)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    except sqlite3.OperationalError as exc:
        raise UnavailableError(f"journal {path}: rm {run} could not finish: {exc}") from None
    finally:
        conn.close()
    if run_dir.is_dir() or run_dir.is_symlink():
        if run_dir.is_symlink():
            run_dir.unlink()
        else:
            shutil.rmtree(run_dir)
        report.run_dir = str(run_dir)
    return report


def _remove(conn: sqlite3.Connection, blob, run: str) -> RemoveReport:
    report = RemoveReport(run)
    # the run's blobs, with the bases they are restored from
    theirs = blobs_named_by_rows(conn, blob, "run_id = ?", (run,))
    base_of = dict(conn.execute("SELECT sha256, base FROM blobs WHERE base IS NOT NULL"))
    todo = list(theirs)
    while todo:
        b = base_of.get(todo.pop())
        if b is not None and b not in theirs:
            theirs.add(b)
            todo.append(b)
    # what must stay: named by another run, or the base (at any depth) of a blob that stays
    keep = blobs_named_by_rows(conn, blob, "run_id IS NOT ?", (run,)) & theirs
    staying = set(keep) | {s for s in base_of if s not in theirs}
    todo = list(staying)
    while todo:
        b = base_of.get(todo.pop())
        if b is not None and b in theirs and b not in keep:
            keep.add(b)
            todo.append(b)
    gone = theirs - keep
    report.blobs_kept = len(keep)
    ids = [r[0] for r in conn.execute("SELECT id FROM exchanges WHERE run_id = ?", (run,))]
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        conn.execute(f"DELETE FROM response_parts WHERE exchange_id IN ({','.join('?' * len(chunk))})", chunk)
    report.exchanges = conn.execute("DELETE FROM exchanges WHERE run_id = ?", (run,)).rowcount
    report.attempts = conn.execute("DELETE FROM attempts WHERE run_id = ?", (run,)).rowcount
    report.events = conn.execute("DELETE FROM events WHERE run_id = ?", (run,)).rowcount
    report.snapshots = conn.execute("DELETE FROM snapshots WHERE run_id = ?", (run,)).rowcount
    conn.execute("DELETE FROM runs WHERE id = ?", (run,))
    listed = sorted(gone)
    for i in range(0, len(listed), 500):
        chunk = listed[i : i + 500]
        marks = ",".join("?" * len(chunk))
        report.bytes_freed += conn.execute(
            f"SELECT coalesce(sum(length(data)), 0) FROM blobs WHERE sha256 IN ({marks})", chunk
        ).fetchone()[0]
        report.blobs_removed += conn.execute(f"DELETE FROM blobs WHERE sha256 IN ({marks})", chunk).rowcount
    report.orphaned_children = [
        r[0] for r in conn.execute("SELECT id FROM runs WHERE parent_run = ?", (run,))
    ]
    return report


def vacuum(journal: str | os.PathLike, *, force: bool = False) -> tuple[int, int]:
    """Checkpoint the WAL into the file (truncating it) and ``VACUUM``: the pages that removed
    rows left free go back to the file system. Returns (bytes before, bytes after), the journal
    and its WAL together. Refuses while a live writer holds the journal (without ``force``):
    VACUUM needs it to itself."""
    path = Path(journal)
    conn = open_for_writing(path)
    try:
        check_writers(conn, path, force, "vacuum")
        before = journal_bytes(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError as exc:
        raise UnavailableError(f"journal {path}: vacuum could not finish: {exc}") from None
    finally:
        conn.close()
    return before, journal_bytes(path)


__all__ = ["RemoveReport", "leftovers", "live_writers", "remove_run", "vacuum"]
