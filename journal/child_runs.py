"""A handoff's child run in the journal: reserved, restored, then started once (docs/snapshots.md
"Pause views and handoff", docs/journal.md "runs").

``TrajectoryReplay.restore_handoff`` creates the child run; ``pvisor run --child-run`` or
``pvisor replay --child-run`` starts it. Any number of them may run at once, in processes of
their own, beside a gateway's writer committing to the same file. So each change here is one
``BEGIN IMMEDIATE`` transaction on a connection of its own: SQLite's write lock on the journal
file orders it against every other writer (of any process), and the rows it reads inside the
transaction cannot change before it commits. Of two processes that reserve one id, or claim one
child run, exactly one finds the row it needs absent and writes it; the other finds it present
and is told so (:class:`Claim`).

- :func:`reserve_child_run`: the run row, labelled ``handoff_restore: in_progress``
  (:data:`RESTORING_LABEL`) while its workspace is restored, unless the journal holds a run of
  that id, a run whose id starts with it or one with which it starts (a prefix lookup of either
  would become ambiguous). :func:`finish_child_run` drops the label once the workspace is
  restored (the run is then ``pending``); :func:`drop_child_run` removes the row when the
  restore failed.
- :func:`claim_child_run`: attempt 1 of a pending child run (restored, no attempt, no exchange),
  written before the agent starts; the writer replaces it with the attempt's full row.
  :func:`release_child_run` removes it again when the start failed before the agent ran, so
  the child run can be started later.
- :func:`add_run_labels`: labels merged into a run's after its writer closed (a replay's
  ``replay_status`` and ``ended_by``, known once its result is filled in).

This module imports nothing of pvisor's but the journal package (the journal package's rule).
"""

from __future__ import annotations

import enum
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from pvisor.core.errors import UnavailableError
from .housekeeping import open_for_writing

# RESTORING_LABEL: the label of a child run whose workspace restore_handoff is still restoring,
# in the model, which the reader's run_status reads without loading this module's writing side
from .model import RESTORING, RESTORING_LABEL, Run, RunMode

#: the label of attempt 1 while the start that claimed it has not started the agent yet
CLAIM_LABEL = "claimed_by_pid"


class Claim(str, enum.Enum):
    """What :func:`claim_child_run` found: ``claimed`` (this start runs the child), or why not:
    ``missing`` (no such run), ``not_child`` (a run of another mode), ``restoring`` (its restore
    has not finished), ``started`` (an attempt or an exchange of it exists: another start won)."""

    CLAIMED = "claimed"
    MISSING = "missing"
    NOT_CHILD = "not_child"
    RESTORING = "restoring"
    STARTED = "started"


@contextmanager
def _immediate(path: str | os.PathLike[str], what: str) -> Iterator[sqlite3.Connection]:
    """A connection to the journal ``path`` inside ``BEGIN IMMEDIATE`` (committed when the block
    ends, rolled back when it raises). UnavailableError when the journal stays locked."""
    conn = open_for_writing(Path(path))
    try:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise UnavailableError(f"journal {path}: {what}: {exc}") from None
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.OperationalError as exc:
        raise UnavailableError(f"journal {path}: {what} could not finish: {exc}") from None
    finally:
        conn.close()


def conflicting_run(conn: sqlite3.Connection, run_id: str) -> str | None:
    """The id of a run that is ``run_id``, starts with it or with which it starts; None when
    there is none."""
    row = conn.execute(
        "SELECT id FROM runs WHERE id = ? OR substr(id, 1, length(?)) = ? OR substr(?, 1, length(id)) = id "
        "ORDER BY id != ?, id LIMIT 1",
        (run_id, run_id, run_id, run_id, run_id),
    ).fetchone()
    return row[0] if row else None


def reserve_child_run(path: str | os.PathLike[str], run: Run) -> str | None:
    """Insert ``run`` (a handoff's child run, mode ``handoff``) labelled as being restored.
    Returns None when it was inserted, else the id of the run in the way (the same id, or one
    that is a prefix of it or of which it is a prefix): nothing is written then."""
    labels = {**run.labels, RESTORING_LABEL: RESTORING}
    with _immediate(path, f"reserve run {run.id}") as conn:
        taken = conflicting_run(conn, run.id)
        if taken is not None:
            return taken
        conn.execute(
            "INSERT INTO runs(id, agent, agent_version, argv, created_ms, parent_run, boundary_step, mode, "
            "labels, pause_transition, workspace_snapshot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.id,
                run.agent,
                run.agent_version,
                orjson.dumps(run.argv).decode(),
                run.created_ms or _now_ms(),
                run.parent_run,
                run.boundary_step,
                RunMode.HANDOFF.value,
                orjson.dumps(labels).decode(),
                run.pause_transition,
                run.workspace_snapshot,
            ),
        )
        _event(conn, "run.created", run.id, {"agent": run.agent, "mode": RunMode.HANDOFF.value})
    return None


def finish_child_run(path: str | os.PathLike[str], run_id: str) -> bool:
    """The workspace of the reserved child run ``run_id`` is restored: drop its
    :data:`RESTORING_LABEL` (it is now ``pending``). False when the run is no longer reserved
    (removed meanwhile by ``pvisor journal rm``)."""
    with _immediate(path, f"finish run {run_id}") as conn:
        labels = _reserved_labels(conn, run_id)
        if labels is None:
            return False
        labels.pop(RESTORING_LABEL, None)
        conn.execute("UPDATE runs SET labels = ? WHERE id = ?", (orjson.dumps(labels).decode(), run_id))
        _event(conn, "run.updated", run_id, ["labels"])
    return True


def drop_child_run(path: str | os.PathLike[str], run_id: str) -> bool:
    """Remove the reserved child run ``run_id`` (its restore failed), with its events; only
    while it is still reserved (never a run that was finished or started). True when removed."""
    with _immediate(path, f"remove run {run_id}") as conn:
        if _reserved_labels(conn, run_id) is None:
            return False
        conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
    return True


def claim_child_run(path: str | os.PathLike[str], run_id: str, started_ms: int | None = None) -> Claim:
    """Claim the pending child run ``run_id`` for the start of this process: insert its attempt 1
    (labelled :data:`CLAIM_LABEL` with this pid) when the run is a restored handoff's child with
    no attempt and no exchange. Returns :attr:`Claim.CLAIMED`, or what stood in the way (nothing
    written)."""
    with _immediate(path, f"claim run {run_id}") as conn:
        row = conn.execute("SELECT mode, labels FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            return Claim.MISSING
        if row[0] != RunMode.HANDOFF.value:
            return Claim.NOT_CHILD
        if (
            conn.execute("SELECT 1 FROM attempts WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
            or conn.execute("SELECT 1 FROM exchanges WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
        ):
            return Claim.STARTED
        if _labels(row[1]).get(RESTORING_LABEL) == RESTORING:
            return Claim.RESTORING
        conn.execute(
            "INSERT INTO attempts(run_id, n, started_ms, labels) VALUES (?, 1, ?, ?)",
            (run_id, started_ms or _now_ms(), orjson.dumps({CLAIM_LABEL: str(os.getpid())}).decode()),
        )
        _event(conn, "run.claimed", run_id, {"attempt": 1, "pid": os.getpid()})
    return Claim.CLAIMED


def release_child_run(path: str | os.PathLike[str], run_id: str) -> bool:
    """Undo :func:`claim_child_run` of this process: remove attempt 1 of ``run_id`` while it is
    still the claim (the writer has not replaced it with the started attempt) and the run has no
    exchange. True when removed."""
    with _immediate(path, f"release run {run_id}") as conn:
        row = conn.execute(
            "SELECT labels, ended_ms FROM attempts WHERE run_id = ? AND n = 1", (run_id,)
        ).fetchone()
        if row is None or row[1] is not None or _labels(row[0]) != {CLAIM_LABEL: str(os.getpid())}:
            return False
        if conn.execute("SELECT 1 FROM exchanges WHERE run_id = ? LIMIT 1", (run_id,)).fetchone():
            return False
        conn.execute("DELETE FROM attempts WHERE run_id = ? AND n = 1", (run_id,))
        _event(conn, "run.released", run_id, {"attempt": 1, "pid": os.getpid()})
    return True


def add_run_labels(path: str | os.PathLike[str], run_id: str, labels: dict[str, str]) -> bool:
    """Merge ``labels`` into the labels of run ``run_id`` (a key given replaces the run's), with
    a ``run.updated`` event. False when the journal holds no such run; UnavailableError when it
    stays locked."""
    with _immediate(path, f"label run {run_id}") as conn:
        row = conn.execute("SELECT labels FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            return False
        merged = {**_labels(row[0]), **labels}
        conn.execute("UPDATE runs SET labels = ? WHERE id = ?", (orjson.dumps(merged).decode(), run_id))
        _event(conn, "run.updated", run_id, ["labels"])
    return True


def _reserved_labels(conn: sqlite3.Connection, run_id: str) -> dict | None:
    """The labels of ``run_id`` while it is a reserved child run (being restored), else None."""
    row = conn.execute("SELECT mode, labels FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None or row[0] != RunMode.HANDOFF.value:
        return None
    labels = _labels(row[1])
    return labels if labels.get(RESTORING_LABEL) == RESTORING else None


def _labels(text: str | None) -> dict:
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(conn: sqlite3.Connection, kind: str, run_id: str, data: object) -> None:
    conn.execute(
        "INSERT INTO events(ts_ms, kind, run_id, exchange_id, writer_id, data) "
        "VALUES (?, ?, ?, NULL, NULL, ?)",
        (_now_ms(), kind, run_id, orjson.dumps(data).decode()),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
