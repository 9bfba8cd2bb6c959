"""The gateway's workspace snapshots: the workspace checkpointed when a candidate main-loop
request arrives, at the start of a run and at its end (docs/gateway.md "Workspace snapshots").

A walk runs in a thread of its own (one at a time, so that two walks never compete for the
disk), never on the event loop. The gateway starts it when a request's head arrives, forwards
the request at once, and holds the first byte of the answer until the walk is done: a tool the
answer asks for cannot run before the workspace was read, and the model's thinking time hides
the walk. Requests that arrive while a walk is queued and not started share the next walk (it
starts after all of them arrived, so it sees what each of them would). File contents go to the
journal as content-addressed blobs through the writer's queue (:meth:`Journal.put_blobs`), the
manifest and one ``snapshots`` row per request with :meth:`Journal.record_snapshot`.

Tools still running in the background while a walk reads the workspace (a server, a watcher)
can change files during it: each file is read as it is when the walk reaches it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pvisor.core.errors import PvisorError
from pvisor.journal.snapshots import (
    EntryKind,
    FilesystemDriver,
    SnapshotDriver,
    SnapshotKind,
    SnapshotRecord,
    snapshot_driver,
)
from pvisor.journal.writer import Journal

#: blob bytes gathered before they are handed to the writer as one message
_BLOB_BATCH_BYTES = 8 << 20
_BLOB_BATCH_COUNT = 512

log = logging.getLogger("pvisor.gateway")


def excluded_below(root: Path, paths: Iterable[Path]) -> frozenset[str]:
    """The paths of ``paths`` that lie below ``root``, relative to it (a journal file brings
    its ``-wal`` and ``-shm``): what a walk of ``root`` must never read."""
    out: set[str] = set()
    real_root = Path(os.path.realpath(root))
    for p in paths:
        try:
            # resolved: a symlinked spelling of the journal's path is the journal too
            rel = Path(os.path.realpath(p)).relative_to(real_root).as_posix()
        except ValueError:
            continue
        if rel != ".":
            out.update((rel, rel + "-wal", rel + "-shm", rel + "-journal"))
    return frozenset(out)


def new_snapshot_id() -> str:
    """``s-`` + 16 random hex digits."""
    return "s-" + secrets.token_hex(8)


@dataclass(slots=True)
class _Want:
    """One snapshot asked for: the row the walk records."""

    id: str
    run: str
    attempt: int
    kind: SnapshotKind
    exchange: str | None


@dataclass(slots=True)
class _Job:
    wants: list[_Want] = field(default_factory=list)
    started: bool = False
    future: asyncio.Future | None = None


@dataclass(slots=True)
class PendingSnapshot:
    """A snapshot being taken: ``id`` (its row), ``done`` (resolves to its record when the
    walk is over; never raises)."""

    id: str
    done: asyncio.Future


class WorkspaceSnapshots:
    """Takes the snapshots of the workspace ``root`` with ``driver`` (default: the filesystem
    driver) into the journal ``journal()`` returns (the gateway's, set once it is open)."""

    def __init__(
        self,
        root: Path,
        journal: Callable[[], Journal | None],
        driver: SnapshotDriver | None = None,
        exclude: Iterable[Path] = (),
    ):
        self.root = Path(os.path.abspath(root))
        self.driver = driver if driver is not None else snapshot_driver()
        if isinstance(self.driver, FilesystemDriver):
            self.driver.exclude = excluded_below(self.root, exclude)
        self._journal = journal
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pvisor-snapshot")
        self._queued: _Job | None = None  # the job queued and not started: later requests join it
        self._sent: set[str] = set()  # blobs handed to the writer by this taker
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def take(
        self, run: str, attempt: int, kind: SnapshotKind, exchange: str | None = None
    ) -> PendingSnapshot:
        """Start (or join) a walk on the running loop; returns at once."""
        loop = asyncio.get_running_loop()
        want = _Want(new_snapshot_id(), run, attempt, kind, exchange)
        with self._lock:  # the walk's thread marks the job started under the same lock
            job = self._queued
            if job is None or job.started:
                job = _Job()
                self._queued = job
                job.future = loop.run_in_executor(self._executor, self._walk, job)
            job.wants.append(want)
        assert job.future is not None
        return PendingSnapshot(want.id, job.future)

    def held(self, snapshot_id: str, hold_us: int) -> None:
        """Record how long an answer's first byte waited for snapshot ``snapshot_id``."""
        journal = self._journal()
        if journal is not None:
            journal.set_snapshot_hold(snapshot_id, hold_us)

    async def close(self) -> None:
        """Wait for the walks asked for so far, then stop the thread (idempotent)."""
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)

    # ------------------------------------------------------------------ the walk (its thread)

    def _walk(self, job: _Job) -> list[SnapshotRecord]:
        with self._lock:
            job.started = True  # from here on a new request needs a walk of its own
            wants = list(job.wants)
        journal = self._journal()
        taken_ms = time.time() * 1000.0
        t0 = time.perf_counter()
        batch: list[tuple[str, bytes]] = []
        size = 0

        def send() -> None:
            nonlocal batch, size
            if batch and journal is not None:
                journal.put_blobs(batch)
            batch, size = [], 0

        def put(data: bytes) -> str:
            nonlocal size
            sha = hashlib.sha256(data).hexdigest()
            if sha not in self._sent:
                self._sent.add(sha)
                batch.append((sha, data))
                size += len(data)
                if size >= _BLOB_BATCH_BYTES or len(batch) >= _BLOB_BATCH_COUNT:
                    send()
            return sha

        manifest = None
        error = None
        try:
            manifest = self.driver.checkpoint(self.root, put)
        except PvisorError as exc:
            error = exc.message
        except OSError as exc:
            error = f"workspace {self.root}: {exc.strerror or exc}"
        except Exception as exc:  # noqa: BLE001
            # a driver bug must not stop the gateway; the row says what failed
            error = f"snapshot driver {self.driver.name} failed: {type(exc).__name__}: {exc}"[:300]
        send()
        if error is not None and error not in self._warned:
            self._warned.add(error)
            log.warning("workspace snapshot failed: %s", error)
        records = []
        encoded = manifest.encode() if manifest is not None else None
        digest = hashlib.sha256(encoded).hexdigest() if encoded is not None else None
        files = size = 0
        for e in manifest.entries if manifest is not None else ():
            if e.kind is EntryKind.FILE:
                files += 1
                size += e.size
        walk_us = int((time.perf_counter() - t0) * 1e6)  # what the answer waits for: the encoding too
        for want in wants:
            rec = SnapshotRecord(
                id=want.id,
                run=want.run,
                attempt=want.attempt,
                kind=want.kind,
                driver=self.driver.name,
                taken_ms=taken_ms,
                exchange=want.exchange,
                manifest=encoded,
                digest=digest,
                walk_us=walk_us,
                entries=len(manifest.entries) if manifest else 0,
                files=files,
                bytes=size,
                read_bytes=manifest.read_bytes if manifest else 0,
                warnings=list(manifest.warnings) if manifest else [],
                error=error,
            )
            records.append(rec)
            if journal is not None:
                journal.record_snapshot(rec)
        return records
