"""The parts of the result document (:class:`~pvisor.replay.result.ResultDocument`) that only
replay-only and continuation write: ``agent_run`` (:class:`AgentRunRecord`, how it ended an
:class:`AgentRunEnd`) and ``playback`` (:class:`PlaybackSummary`); docs/result-protocol.md and
docs/replay.md say what they hold, docs/result-schema.json checks them.

Apart from :mod:`pvisor.replay.result` because ``replay --prepare-only`` loads that module and
never writes these: each class defined there is paid for in prepare-only's start-up
(docs/benchmarks.md). Their ``to_json()`` is :class:`~pvisor.replay.result.ResultPart`'s."""

from __future__ import annotations

import enum
from typing import Any

from pvisor.core.record import Record, record

from .result import ResultPart


class AgentRunEnd(str, enum.Enum):
    """``agent_run.ended_by``: how the replayed agent's run ended."""

    SYNTHETIC_END = "synthetic_end"  #: after pvisor's synthetic final reply, by itself
    AGENT = "agent"  #: by itself, with no synthetic reply served
    STOPPED_AFTER_END = "stopped_after_end"  #: stopped ``end_grace`` seconds after the synthetic reply
    TIMEOUT = "timeout"  #: stopped at ``--timeout``
    INTERRUPTED = "interrupted"  #: stopped by a signal (Ctrl-C)


@record
class AgentRunRecord(ResultPart, Record):
    """``agent_run`` of a replay-only or continuation: the agent's run.

    Fields:
        run: the derived run's id in the journal.
        installed_version, recorded_version: the agent's version now and in the source (None
            when unknown).
        exit_code: the agent's exit status (None when it was not reaped).
        ended_by: :class:`AgentRunEnd`.
        native_trajectory: the native file the replayed agent wrote, or None.
        native_holds_synthetic_end: whether that file ends with pvisor's synthetic final reply.
        stdout, stderr: the files the agent's output went to.
        run_dir: the derived run's directory.
        steps: the steps derived from the run, None when they could not be.
        agent_status: the agent's own account of how it ended (``outcome``, ``detail``,
            ``source``; docs/agents.md), or None.
    """

    run: str
    installed_version: str | None
    recorded_version: str | None
    exit_code: int | None
    ended_by: AgentRunEnd
    native_trajectory: str | None
    native_holds_synthetic_end: bool
    stdout: str
    stderr: str
    run_dir: str
    steps: int | None
    agent_status: dict[str, Any] | None = None

    def __init__(
        self,
        run: str,
        installed_version: str | None,
        recorded_version: str | None,
        exit_code: int | None,
        ended_by: AgentRunEnd,
        native_trajectory: str | None,
        native_holds_synthetic_end: bool,
        stdout: str,
        stderr: str,
        run_dir: str,
        steps: int | None,
        agent_status: dict[str, Any] | None = None,
    ) -> None:
        self.run = run
        self.installed_version = installed_version
        self.recorded_version = recorded_version
        self.exit_code = exit_code
        self.ended_by = ended_by
        self.native_trajectory = native_trajectory
        self.native_holds_synthetic_end = native_holds_synthetic_end
        self.stdout = stdout
        self.stderr = stderr
        self.run_dir = run_dir
        self.steps = steps
        self.agent_status = agent_status


@record
class PlaybackSummary(ResultPart, Record):
    """``playback`` of a replay-only or continuation: what playback served.

    Fields:
        served: one ``{request, exchange, source, recorded_exchange, retry}`` per main-loop
            request answered from the source (:func:`pvisor.replay.playback.playback_record`).
        requests: the main-loop requests the agent sent.
        task_origin: where the agent's task came from (``label``, ``argv``, ``trajectory``,
            ``request``, ``option``; :class:`~pvisor.replay.recording.TaskOrigin`), or None.
        boundary_request_seen: whether the agent sent request N+1.
    """

    served: list[dict[str, Any]]
    requests: int
    task_origin: str | None
    boundary_request_seen: bool

    def __init__(
        self,
        served: list[dict[str, Any]],
        requests: int,
        task_origin: str | None,
        boundary_request_seen: bool,
    ) -> None:
        self.served = served
        self.requests = requests
        self.task_origin = task_origin
        self.boundary_request_seen = boundary_request_seen


__all__ = ["AgentRunEnd", "AgentRunRecord", "PlaybackSummary"]
