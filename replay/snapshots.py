"""Workspace snapshots of a journal run bound to steps, picked for a step and restored
(docs/replay.md "Workspace snapshots").

The gateway takes a snapshot when a candidate main-loop request arrives (``request``), and
``pvisor run`` one before the agent starts (``start``) and one after it ended (``end``). Main-loop
request i arrives once the tools of A_(i-1) have run, so its snapshot shows the workspace
**after step i-1**, which is also **before A_i**. Binding (:func:`bind_steps`) gives each
snapshot that step number, ``after_step``:

- ``start`` of attempt a: the number of steps whose request belongs to attempts before a (0
  for the first attempt: the start state);
- ``request`` of main-loop request i (the step's kept exchange or one of its retries): i-1;
  of playback's synthetic final request (request N+1 of a replay): N; of an auxiliary request:
  None (it stays in the journal, bound to no step);
- ``end`` of attempt a: the number of steps whose request belongs to attempts 1..a.

``pvisor run`` stores the binding when it classifies the run (for SQL readers); reading a run
here computes it from the journal as the run is now, the same way, so that a run never
classified (a ``pvisor gateway`` run) or snapshots recorded after the binding are bound too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvisor.adapters.agents import descriptor_names, get_descriptor
from pvisor.adapters.chains import classify_run
from pvisor.adapters.journal_trajectory import build_trajectory
from pvisor.core.errors import BadInputError, UsageError
from pvisor.journal.model import Trajectory
from pvisor.journal.reader import JournalReader
from pvisor.journal.snapshots import (
    FilesystemDriver,
    Manifest,
    SnapshotKind,
    SnapshotRecord,
    snapshot_driver,
    withhold_secret_names,
)

#: the journal event that says a run's snapshots were bound
BOUND_EVENT = "snapshot.bound"


def bind_steps(snapshots: list[SnapshotRecord], trajectory: Trajectory) -> dict[str, int | None]:
    """Snapshot id -> ``after_step`` (module docstring) for ``trajectory``, a journal run's
    (its ``meta["steps"]`` and ``meta["synthetic_end"]`` name the exchanges)."""
    steps = trajectory.meta.get("steps") or []
    before: dict[str, int] = {}  # exchange id -> step whose action answered it
    for detail in steps:
        before[detail["exchange"]] = detail["n"]
        for retry in detail.get("retries") or ():
            before.setdefault(retry, detail["n"])
    total = len(steps)
    for ex_id in trajectory.meta.get("synthetic_end") or ():
        before.setdefault(ex_id, total + 1)
    out: dict[str, int | None] = {}
    for snap in snapshots:
        if snap.kind is SnapshotKind.START:
            out[snap.id] = sum(1 for d in steps if (d.get("attempt") or 1) < snap.attempt)
        elif snap.kind is SnapshotKind.END:
            out[snap.id] = sum(1 for d in steps if (d.get("attempt") or 1) <= snap.attempt)
        else:
            n = before.get(snap.exchange or "")
            out[snap.id] = None if n is None else n - 1
    return out


def journal_trajectory(reader: JournalReader, run_id: str) -> Trajectory:
    """The run's trajectory, its main chain found with its agent's hint when the agent is known."""
    run = reader.run(run_id)
    hint = get_descriptor(run.agent).chain_hint if run.agent in descriptor_names() else None
    return build_trajectory(reader, classify_run(reader, run.id, prefer=hint))


@dataclass(slots=True)
class RunSnapshots:
    """A run's snapshots with ``after_step`` set (stored or computed), in the order taken;
    ``steps_total`` its number of steps; ``bound`` whether the binding was stored."""

    run: str
    snapshots: list[SnapshotRecord]
    steps_total: int
    bound: bool

    def pick(self, after: int) -> SnapshotRecord:
        """The snapshot of the workspace after ``after`` steps (0..steps: after transition
        ``after - 1``, before transition ``after``; :mod:`.numbering`). Preference: after step 0
        the ``start`` snapshot, else the request's; after a later step the request's (the next
        request's walk), else the ``end`` snapshot. Raises UsageError (exit 2) for a count out
        of range, BadInputError (exit 65) for a run without snapshots or without one there."""
        total = self.steps_total
        if not 0 <= after <= total:
            raise UsageError(f"run {self.run} has {_steps(total)}: no step {after} to restore after")
        if not self.snapshots:
            raise BadInputError(
                f"run {self.run} has no workspace snapshot (it was recorded without a workspace, "
                "with --no-snapshots, or by a pvisor older than snapshots)"
            )
        order = (
            (SnapshotKind.START, SnapshotKind.REQUEST)
            if after == 0
            else (SnapshotKind.REQUEST, SnapshotKind.END)
        )
        failed = None
        for kind in order:
            found = [s for s in self.snapshots if s.kind is kind and s.after_step == after]
            usable = [s for s in found if s.digest is not None]
            if usable:
                return usable[-1]
            failed = failed or (found[-1] if found else None)
        what = (
            f"after step {after} of {_steps(total)} ("
            + (f"after transition {after - 1}, " if after else "")
            + (f"before transition {after})" if after < total else "the end)")
        )
        if failed is not None:
            raise BadInputError(f"run {self.run}: the snapshot {what} failed: {failed.error}")
        raise BadInputError(f"run {self.run} has no workspace snapshot {what}")


def run_snapshots(reader: JournalReader, run_id: str, trajectory: Trajectory | None = None) -> RunSnapshots:
    """The snapshots of run ``run_id`` (id or unique prefix; UsageError when none matches);
    ``trajectory``: the run's, when the caller has read it already."""
    run = reader.run(run_id)
    snaps = reader.snapshots(run.id)
    bound = reader.has_event(run.id, BOUND_EVENT) if snaps else False
    if trajectory is None:
        trajectory = journal_trajectory(reader, run.id)
    # computed each time from the run as it is now (the stored binding is for SQL readers): a
    # snapshot recorded after the run was bound (a later attempt whose steps were not derived)
    # is bound too
    binding = bind_steps(snaps, trajectory)
    for s in snaps:
        s.after_step = binding.get(s.id)
    return RunSnapshots(run.id, snaps, len(trajectory.steps), bound)


@dataclass(slots=True)
class Restored:
    """A restored snapshot: ``snapshot`` (its record), ``manifest`` digest, ``into`` (the
    target: a directory, or what another driver restored into), ``entries``, ``files``,
    ``bytes`` written, ``withheld`` (the files the snapshot withheld as secret and the restore
    did not write: ``{path, size, why}`` each, docs/snapshots.md "Secrets")."""

    snapshot: SnapshotRecord
    digest: str
    into: Any
    entries: int
    files: int
    bytes: int
    withheld: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        s = self.snapshot
        return {
            "run": s.run,
            "snapshot": s.id,
            "kind": s.kind.value,
            "after_step": s.after_step,
            "manifest": self.digest,
            "into": str(self.into),
            "entries": self.entries,
            "files": self.files,
            "bytes": self.bytes,
            "withheld": self.withheld,
        }


def restore_snapshot(
    reader: JournalReader,
    snap: SnapshotRecord,
    into: Any,
    *,
    force: bool = False,
    target_option: str = "--into",
    force_option: str = "--force",
) -> Restored:
    """Write snapshot ``snap`` into ``into`` with its driver (module ``journal.snapshots``:
    nothing is written outside ``into``): a directory (a path) for the filesystem driver, or
    what another driver restores into. Raises UsageError for a target that is not empty
    without ``force``, BadInputError or IntegrityError naming the snapshot for a manifest or
    blob that is unsafe or damaged. ``target_option`` and ``force_option``: how the errors name
    the target and the flag (the command's ``--into`` and ``--force``, or a Python caller's
    ``environment`` and ``force=True``)."""
    manifest: Manifest = reader.manifest(snap)
    if snap.driver == FilesystemDriver.name:
        # an older journal's (or a crafted) snapshot that holds a secret file: never written back
        manifest = withhold_secret_names(manifest)
    driver = snapshot_driver(snap.driver)
    if hasattr(driver, "target_option"):
        driver.target_option, driver.force_option = target_option, force_option  # type: ignore[attr-defined]
    if isinstance(into, (str, os.PathLike)):
        into = Path(os.path.abspath(into))
    driver.restore(manifest, reader.blob, into, force=force)
    files = [e for e in manifest.entries if e.kind.value == "file"]
    return Restored(
        snap,
        snap.digest or "",
        into,
        len(manifest.entries),
        len(files),
        sum(e.size for e in files),
        [w.to_json() for w in manifest.withheld],
    )


def _steps(n: int) -> str:
    return f"{n} journal step{'s' if n != 1 else ''}"
