"""The result document of a replay with the agent (replay-only and continuation) filled in once
the agent ran (docs/result-protocol.md): the workspace before and after, what playback served,
the tool calls re-run, the derived run and its lineage, the agent's run, the prefix files, and
the error of a replay that did not succeed (:func:`failure`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pvisor.adapters.jsonio import dumps
from pvisor.core.errors import UnavailableError
from pvisor.journal.child_runs import add_run_labels
from pvisor.replay.agent_result import AgentRunEnd, AgentRunRecord, PlaybackSummary
from pvisor.replay.errors import ReplayFailed, show_path
from pvisor.replay.playback import playback_record, recorded_prefix
from pvisor.replay.output import PREFIX_FILE, REQUEST_FILE
from pvisor.replay.result import (
    Lineage,
    ResultDocument,
    WorkspaceRecord,
    prefix_record,
    workspace_digest,
)
from pvisor.session.continuation_result import live_failure
from pvisor.session.handoff_result import compared_calls
from pvisor.session.replay_options import ReplayOptions


#: the derived run's labels that say how its replay ended (docs/journal.md "runs"): the result's
#: ``status`` and its ``agent_run.ended_by``
REPLAY_STATUS_LABEL = "replay_status"
ENDED_BY_LABEL = "ended_by"


def label_status(result: ResultDocument, journal: Path) -> None:
    """Give the derived run (``result.derived_run``; none: nothing to label) the labels
    :data:`REPLAY_STATUS_LABEL` (``result.status``) and :data:`ENDED_BY_LABEL` (how the agent's
    run ended, when the agent ran), so that the journal alone says how the replay ended (the run
    page reads them). A journal that stays locked is the warning ``status_not_labelled``."""
    if result.derived_run is None or result.status is None:
        return
    labels = {REPLAY_STATUS_LABEL: getattr(result.status, "value", str(result.status))}
    ended = getattr(result.agent_run, "ended_by", None)
    if ended is not None:
        labels[ENDED_BY_LABEL] = getattr(ended, "value", str(ended))
    try:
        add_run_labels(journal, result.derived_run, labels)
    except UnavailableError as exc:
        result.warn("status_not_labelled", f"the derived run's status is not in the journal: {exc.message}")


def agent_ended_by(p: Any, report: Any) -> AgentRunEnd:
    """How the agent's run ended (``agent_run.ended_by``): ``p`` the playback responder,
    ``report`` the derived run's :class:`~pvisor.session.run_report.RunReport`."""
    if report.interrupted:
        return AgentRunEnd.INTERRUPTED
    if report.timed_out:
        return AgentRunEnd.TIMEOUT
    if report.stopped_after_end:
        return AgentRunEnd.STOPPED_AFTER_END
    if p.synthetic:
        return AgentRunEnd.SYNTHETIC_END
    return AgentRunEnd.AGENT


def fill_after(
    result: ResultDocument,
    opts: ReplayOptions,
    rec: Any,
    p: Any,
    report: Any,
    ws: Path,
    ws_before: Any,
    out: Path,
    warn: Callable[[str], None],
    restored: dict[str, Any] | None = None,
) -> None:
    """The fields of ``result`` the agent's run gives: the workspace ``ws`` (``ws_before`` its
    digest before the run, ``restored`` what ``--workspace-from`` restored), what the playback
    responder ``p`` served, the tool calls, the derived run of ``report`` and its lineage from
    the recording ``rec``, and the warnings they call for."""
    ws_after = workspace_digest(ws)
    result.workspace = WorkspaceRecord(
        show_path(ws),
        ws_before.sha256,
        ws_after.sha256,
        ws_before.sha256 == ws_after.sha256,
        ws_after.entries,
        restored,
    )
    record = playback_record(p)
    result.path_rewrites = record["path_rewrites"]
    result.auxiliary = record["auxiliary"]
    result.context_differences = record["context_differences"]
    result.tool_differences = record["tool_differences"]
    result.divergence = record["divergence"]
    result.synthetic_end = record["synthetic_end"]
    result.playback = PlaybackSummary(
        record["served"], record["requests"], rec.task_origin, p.boundary is not None
    )
    result.tool_calls = p.tool_calls()
    result.replayed_tool_calls = sum(
        1 for c in result.tool_calls if c.replayed_observation_sha256 is not None
    )
    result.live_requests = 0
    result.derived_run = report.run
    result.lineage = Lineage(
        rec.run,
        opts.after_step,
        result.mode,
        show_path(rec.path),
        restored["manifest"] if restored else None,
    )
    native = str(report.native_path) if report.native_path else None
    result.agent_run = AgentRunRecord(
        report.run,
        report.agent_version,
        rec.agent_version,
        report.agent_exit_code,
        agent_ended_by(p, report),
        native,
        bool(native and p.synthetic),
        str(report.stdout),
        str(report.stderr),
        str(report.run_dir),
        report.steps,
        report.agent_status.to_json() if report.agent_status else None,
    )
    _warn_after(result, opts, rec, p, report, native)


def _warn_after(
    result: ResultDocument, opts: ReplayOptions, rec: Any, p: Any, report: Any, native: str | None
) -> None:
    """The result's warnings of the agent's run: another agent version, a native file that ends
    with the synthetic reply, observations that differ, steps not derived."""
    # (a handoff's agent is another than the recording's: its version says nothing of it)
    if (
        rec.agent == opts.agent
        and rec.agent_version
        and report.agent_version
        and rec.agent_version != report.agent_version
    ):
        result.warn(
            "agent_version_differs",
            f"the recording was made with {opts.agent} {rec.agent_version}, "
            f"the installed one is {report.agent_version}",
        )
    if native and p.synthetic:
        result.warn(
            "synthetic_end_in_native",
            f"the agent's native trajectory {native} ends with pvisor's synthetic final reply (request "
            f"{p.synthetic[0].request}), not a model's",
        )
    position: dict[int, int] = {}  # the call's place in its step's batch, from 1
    for c in result.tool_calls:
        position[c.step] = position.get(c.step, 0) + 1
        if c.equal_normalised is False:
            # Gemini's function calls carry no id: such a call is named by its place in the batch
            which = c.call_id or f"call {position[c.step]} of the step"
            result.warn("observation_differs", f"step {c.step} {c.name} ({which}): O' differs from O")
    if report.steps_error:
        result.warn("steps_not_derived", report.steps_error)


def observation_counts(result: ResultDocument) -> dict[str, int]:
    """``observations`` of a replay that ran the agent, over the calls of ``result.tool_calls``
    whose observation the agent sends (not ``observation_not_sent``) and that stand for a source
    call (not a handoff's carriers and reads served first: :func:`compared_calls`): ``compared``,
    those with both a recorded and a replayed result (``equal_normalised`` true or false);
    ``equal_normalised``, those of them equal once normalised; ``not_compared``, the others (no
    recorded result: the last step of a run cut short, a call re-run with ``--allow-unrecorded``;
    or none replayed: the agent sent none), never counted as unequal."""
    sent = [
        {"step": c.step, "equal_normalised": c.equal_normalised}
        for c in result.tool_calls
        if not c.observation_not_sent
    ]
    calls = compared_calls(sent, result.handoff if isinstance(result.handoff, dict) else None)
    compared = [c for c in calls if c["equal_normalised"] is not None]
    return {
        "compared": len(compared),
        "equal_normalised": sum(1 for c in compared if c["equal_normalised"]),
        "not_compared": len(calls) - len(compared),
    }


def fill_prefix(
    result: ResultDocument, opts: ReplayOptions, rec: Any, p: Any, out: Path
) -> list[tuple[Path, bytes]]:
    """``result.prefix`` from the request N+1 the playback responder ``p`` kept; returns the
    prefix files to write into ``out`` (``prefix.json``, ``prefix.request.json``; none when the
    agent sent no request N+1)."""
    prefix = recorded_prefix(p)
    if prefix is None:
        return []
    body, meta, exchange, rendered = prefix
    origin = {
        k: ("rendered" if rendered and k == "messages" else "replay")
        for k in ("messages", "task_context", "system", "tools", "params", "request")
    }
    # the recorded compaction the replayed agent compacted again at (journal sources)
    # (p.rec: what playback served, a handoff's translation; p.n its steps)
    comp = next((c for c in reversed(p.rec.compactions) if c.after_step <= p.n), None)
    compaction = comp.record() if comp is not None else None
    result.prefix = prefix_record(
        p.rec.protocol, body, meta, out, p.n, rendered, exchange, origin, compaction
    )
    return [(out / PREFIX_FILE, body), (out / REQUEST_FILE, dumps(meta, indent=True) + b"\n")]


def remove_prefix_files(out: Path) -> None:
    """Remove an earlier replay's prefix files from the output directory ``out``."""
    for name in (PREFIX_FILE, REQUEST_FILE):
        try:
            (out / name).unlink()
        except OSError:
            pass


def fill_restored(result: ResultDocument, ws: Path, restored: dict[str, Any]) -> None:
    """``result.workspace`` of a replay that failed after the start snapshot ``restored`` (the
    ``restored_from`` object) was restored into ``ws``, before the agent ran: the workspace as it
    now is (before = after: nothing ran in it)."""
    now = workspace_digest(ws)
    result.workspace = WorkspaceRecord(show_path(ws), now.sha256, now.sha256, True, now.entries, restored)


def failure(result: ResultDocument, p: Any, report: Any, opts: ReplayOptions) -> ReplayFailed | None:
    """The error of a replay that did not succeed, or None."""
    if p.divergence is not None:
        return ReplayFailed("diverged", f"the replay diverged at {p.divergence.sentence()}")
    if report.interrupted:
        where = "after" if p.boundary is not None else "before"
        return ReplayFailed(
            "interrupted",
            f"interrupted by {report.interrupt_signal or 'a signal'} {where} request {p.n + 1}",
            exit_code=report.exit_code,
        )
    live = result.continuation or None  # ABSENT outside a continuation
    if live is not None and p.boundary is not None:
        return live_failure(live, opts)
    if p.boundary is not None:
        return None
    last = p.latest[0] if p.latest is not None else 0
    if result.prefix is not None:  # A_N made no tool call or finished: the agent ended after it
        return None
    if report.timed_out:
        return ReplayFailed(
            "agent_timeout",
            f"the agent did not reach request {p.n + 1} within --timeout {opts.timeout:g} s "
            f"(its furthest main-loop request was {last})",
            exit_code=124,
        )
    return ReplayFailed(
        "agent_ended_early",
        f"the agent exited (code {report.agent_exit_code}) after main-loop request {last}, before request "
        f"{p.n + 1}{_no_main_loop(p, last)}; see {report.stderr}",
    )


def _no_main_loop(p: Any, last: int) -> str:
    """Why no request of the agent's was taken for the main loop (``last`` 0), from the reason
    playback gave its auxiliary requests (the last one not the main loop), as ``: ...``; empty
    otherwise: the line says what went wrong, not only that the agent ended."""
    if last:
        return ""
    whys = [a.reason for a in getattr(p, "auxiliary", ()) if a.reason.startswith("not the main loop")]
    return f": no request was taken for the main loop ({whys[-1]})" if whys else ""
