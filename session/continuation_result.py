"""A continuation's part of the result document (docs/result-protocol.md "Continuation"): every
request forwarded to the live model with what the upstream answered (read back from the
journal), the boundary request, the rewrites and expansions, why the live part ended
(:class:`ContinuationEnd`) and the error of a continuation that went live but did not end well."""

from __future__ import annotations

import enum
from typing import Any

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import error_object
from pvisor.journal.reader import JournalReader
from pvisor.journal.redact import redact_text
from pvisor.replay.errors import ReplayFailed
from pvisor.replay.result import ResultDocument
from pvisor.session.replay_options import ReplayOptions
from pvisor.session.run import without_userinfo


class ContinuationEnd(str, enum.Enum):
    """Why a continuation's live part ended (``continuation.ended_by``)."""

    AGENT = "agent"  #: the agent ended by itself after a live reply
    STEP_BUDGET = "step_budget"  #: --max-steps live steps ran; the synthetic final reply ended it
    UPSTREAM_ERROR = "upstream_error"  #: the last live request failed (refused, unreachable)
    REASONING_REJECTED = "reasoning_rejected"  #: the upstream refused the served reasoning
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    DIVERGED = "diverged"  #: playback diverged before N+1: nothing went live
    NOT_REACHED = "not_reached"  #: the agent never sent request N+1


#: outcomes of an exchange pvisor itself cut short (the gateway stopped, the agent went away)
CUT_OUTCOMES = frozenset({"incomplete", "aborted_by_client", "in_flight"})


def error_message(body: bytes | None) -> str | None:
    """``error.message`` of a provider's JSON error body (all four protocols; an ``error`` that
    is a string as it is), the start of a body that is not JSON, or None."""
    if not body:
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", "replace")
    err = error_object(obj)
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return err if isinstance(err, str) else None


def fill_live(
    result: ResultDocument, opts: ReplayOptions, rec: Any, p: Any, report: Any, upstream: str | None
) -> None:
    """The continuation's fields of the result (docs/result-protocol.md "Continuation"): every
    forwarded request with what the upstream answered (read back from the journal), the
    boundary request, rewrites, expansions, and why it ended. ``p``: the
    :class:`~pvisor.replay.continuation.ContinuationResponder`; ``report``: the derived run's
    :class:`~pvisor.session.run_report.RunReport`."""
    requests = _live_requests(opts, rec, p, report)
    main = [r for r in requests if r["request"] is not None]
    boundary = next((r for r in main if r["request"] == p.n + 1), None)
    last = main[-1] if main else None
    # a request cut short by pvisor stopping the agent (timeout, signal) is not the upstream's failure
    cut = last is not None and last["outcome"] in CUT_OUTCOMES and (report.timed_out or report.interrupted)
    failed_last = last is not None and last["error"] is not None and not cut
    ended = _ended_by(p, report, last if failed_last else None)
    result.live_requests = len(requests)
    result.boundary_user_prompt_injected = bool(p.prompt_injected)
    result.continuation = _continuation(opts, rec, p, upstream, requests, ended, boundary)
    result.continuation["upstream_error"] = (
        {
            "exchange": last["exchange"],
            "request": last["request"],
            "status": last["status"],
            "outcome": last["outcome"],
            "message": last["error"],
        }
        if failed_last and last is not None
        else None
    )
    result.continuation["step_budget_end"] = p.budget_end
    if p.prompt_misses:
        result.warn(
            "boundary_prompt_not_placed",
            f"{len(p.prompt_misses)} later request(s) no longer reach the boundary (the agent rewrote its "
            "history, a compaction?): the boundary user prompt was not placed in them",
        )
    if opts.boundary_prompt is None and boundary is None and ended is ContinuationEnd.AGENT:
        what = f"is the agent's {p.finish}" if p.finish is not None else "made no tool call"
        result.warn(
            "no_live_request",
            f"A_{opts.after_step} {what} and the agent ended after it: nothing went to the live model",
        )


def _live_requests(opts: ReplayOptions, rec: Any, p: Any, report: Any) -> list[dict[str, Any]]:
    """The rows of ``continuation.requests``: each live request with the status, outcome and
    error (redacted, at most 500 characters) the journal holds for its exchange."""
    mod = get_protocol(p.rec.protocol)  # the agent's (a handoff's target speaks its own)
    answered: dict[str, Any] = {}
    bodies: dict[str, bytes | None] = {}
    with JournalReader(opts.journal) as r:
        for ex in r.exchanges(report.run):
            answered[ex.id] = ex
        for lr in p.live:
            ex = answered.get(lr.exchange)
            if ex is not None and (ex.status is None or ex.status >= 400):
                bodies[lr.exchange] = r.response_body(ex)
    requests = []
    for lr in p.live:
        row = lr.to_json()
        ex = answered.get(lr.exchange)
        row["status"] = ex.status if ex is not None else None
        row["outcome"] = ex.outcome if ex is not None else "not_recorded"
        row["error"] = None
        if ex is not None and (ex.status is None or ex.status >= 400):
            message = error_message(bodies.get(lr.exchange)) or ex.error or ex.outcome
            row["error"] = redact_text(message, p.secrets)[:500]
            refusal = mod.reasoning_refusal(ex.status or 0, bodies.get(lr.exchange) or b"")
            row["reasoning_rejected"] = refusal is not None
        requests.append(row)
    return requests


def _ended_by(p: Any, report: Any, failed_last: dict[str, Any] | None) -> ContinuationEnd:
    """Why the live part ended; ``failed_last``: the last main-loop request when the upstream
    failed it."""
    if p.divergence is not None:
        return ContinuationEnd.DIVERGED
    if report.interrupted:
        return ContinuationEnd.INTERRUPTED
    if p.budget_end is not None:
        return ContinuationEnd.STEP_BUDGET
    if failed_last is not None and failed_last.get("reasoning_rejected"):
        return ContinuationEnd.REASONING_REJECTED
    if failed_last is not None:
        return ContinuationEnd.UPSTREAM_ERROR
    if report.timed_out:
        return ContinuationEnd.TIMEOUT
    if p.boundary is None and not _no_request_after(p):
        return ContinuationEnd.NOT_REACHED
    return ContinuationEnd.AGENT


def _continuation(
    opts: ReplayOptions,
    rec: Any,
    p: Any,
    upstream: str | None,
    requests: list[dict[str, Any]],
    ended: ContinuationEnd,
    boundary: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``continuation`` object up to ``reasoning_rejected`` (its last two fields,
    ``upstream_error`` and ``step_budget_end``, follow)."""
    ok_steps = {
        r["request"]
        for r in requests
        if r["request"] is not None
        and r["outcome"] == "ok"
        and r["status"] is not None
        and 200 <= r["status"] < 300
    }
    rejected = next((r for r in requests if r["request"] is not None and r.get("reasoning_rejected")), None)
    prompt = opts.boundary_prompt
    return {
        "upstream": without_userinfo(upstream or ""),
        "recorded_model": rec.model,
        "live_model": opts.live_model,
        "max_steps": opts.max_steps,
        "reasoning": opts.reasoning,
        "live_steps": len(ok_steps),
        "ended_by": ended.value,
        "boundary_request": {
            "exchange": boundary["exchange"],
            "sent_sha256": boundary["sent_sha256"],
            "forwarded_sha256": boundary["forwarded_sha256"],
            "byte_identical": boundary["byte_identical"],
            "why": boundary["changes"],
            "status": boundary["status"],
        }
        if boundary is not None
        else None,
        "boundary_user_prompt": {
            "text": prompt,
            "at_entry": p.boundary_at,
            "requests": [r["exchange"] for r in requests if r["prompt_at"] is not None],
            "not_placed": p.prompt_misses,
        }
        if prompt is not None
        else None,
        "requests": requests,
        "reasoning_rewrites": [
            {"exchange": r["exchange"], **w}
            for r in requests
            for w in r["rewrites"]
            if w["of"] == "reasoning"
        ],
        "model_rewrites": [
            {"exchange": r["exchange"], **w} for r in requests for w in r["rewrites"] if w["of"] == "model"
        ],
        "expansions": list(p.expansions),
        "reasoning_rejected": {
            "exchange": rejected["exchange"],
            "request": rejected["request"],
            "message": rejected["error"],
        }
        if rejected is not None
        else None,
    }


def live_failure(live: dict[str, Any], opts: ReplayOptions) -> ReplayFailed | None:
    """The error of a continuation that went live but did not end well, or None."""
    ended = live["ended_by"]
    if ended == ContinuationEnd.REASONING_REJECTED.value:
        rej = live["reasoning_rejected"] or live["upstream_error"]
        return ReplayFailed(
            "reasoning_rejected",
            f"the live upstream {live['upstream']} refused the served reasoning at request "
            f"{rej['request']}: {rej['message']}"
            + (
                " (--reasoning strip rewrites it so that the live API accepts it)"
                if opts.reasoning == "keep"
                else " (even with --reasoning strip: the upstream also refuses what strip leaves)"
            ),
        )
    if ended == ContinuationEnd.UPSTREAM_ERROR.value:
        err = live["upstream_error"]
        unreachable = err["status"] is None or err["outcome"] in ("upstream_unreachable", "upstream_reset")
        what = "could not be reached" if unreachable else f"answered {err['status']}"
        return ReplayFailed(
            "upstream_unreachable" if unreachable else "upstream_error",
            f"the live upstream {live['upstream']} {what} at request {err['request']}: {err['message']}",
            exit_code=69 if unreachable else 1,
        )
    if ended == ContinuationEnd.TIMEOUT.value:
        return ReplayFailed(
            "agent_timeout",
            f"the continuation was still running after --timeout {opts.timeout:g} s (the agent was "
            f"stopped; {live['live_steps']} live step(s) are in the derived run)",
            exit_code=124,
        )
    return None


def _no_request_after(p: Any) -> bool:
    return p.latest is not None and p.latest[0] == p.n
