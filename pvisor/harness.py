"""The Python names of the documents pvisor implements ("Replaying and handing off"), as
written: ``from pvisor.harness import PauseSpec, TrajectoryReplay``.

A thin public module: every name is pvisor's own, from :mod:`pvisor.replay.views`
(docs/snapshots.md "Pause views and handoff")::

    replay = TrajectoryReplay.from_event_log("runs/r-3f2a9c0d1e2b")  # a run's directory, an export, a file
    views = replay.materialize_pauses([PauseSpec(id="initial", kind="step", step=0)])
    branch = TrajectoryReplay.restore_handoff(views[0], "ws-child", "child-1")

``step`` is the documents' zero-based transition (journal step K+1); ``after_step`` counts the
steps kept. The handoff's child run is saved in the journal, pending until the next agent's run
is started under its id (``pvisor run --child-run child-1``). The same names are reachable as
``pvisor.PauseSpec`` and ``pvisor.TrajectoryReplay``.
"""

from __future__ import annotations

from pvisor.replay.views import (
    HandoffBranch,
    PauseKind,
    PauseSpec,
    TrajectoryReplay,
    View,
    materialize_pauses,
    restore_handoff,
)

__all__ = [
    "HandoffBranch",
    "PauseKind",
    "PauseSpec",
    "TrajectoryReplay",
    "View",
    "materialize_pauses",
    "restore_handoff",
]
