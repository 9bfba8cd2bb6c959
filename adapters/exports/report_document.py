"""The data of a run's page (``pvisor report``, docs/report.md): :func:`run_document`.

A JSON-able dict the page's script draws: the run (agent, mode, task, labels, attempts, its
lineage), its child runs, every exchange in arrival order (a main-loop one with its step: the
action's text, tool calls, the observation, flags, retries, timings, usage; an auxiliary one with
the chain rule's reason), each body cut to ``body_limit`` bytes (head and tail), and for a
derived run the parent's observation O against the replay's O' per tool call.
"""

from __future__ import annotations

import difflib
import time
from typing import Any

import orjson

from pvisor.adapters.agents import descriptor_names, get_descriptor
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.core import progress
from pvisor.core.errors import PvisorError
from pvisor.journal.model import run_lineage
from pvisor.journal.reader import JournalReader

#: bytes of a body a page shows by default: its head and its tail (``--body-limit``)
DEFAULT_BODY_LIMIT = 8 * 1024
#: characters of a tool result or text shown before it is folded
_TEXT_LIMIT = 20_000


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(orjson.dumps(block).decode())
        return "\n".join(parts)
    return orjson.dumps(content).decode() if content is not None else ""


def _clip_text(text: str, limit: int = _TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n… {len(text) - limit:,} characters left out …\n" + text[-limit // 2 :]


def _body(data: bytes | None, limit: int, exchange: str, which: str) -> dict[str, Any] | None:
    """A body for the page: text (invalid UTF-8 replaced), cut to ``limit`` bytes: half from its
    head, half from its tail (protocols put the conversation at either end: Anthropic's
    ``messages`` come first, Chat Completions' last message last)."""
    if data is None:
        return None
    size = len(data)
    if size > limit:
        head = limit // 2
        cut = (
            data[:head].decode("utf-8", "replace")
            + f"\n\n… {size - limit:,} bytes left out: pvisor journal body {exchange} --{which} …\n\n"
            + data[size - (limit - head) :].decode("utf-8", "replace")
        )
        return {"size": size, "text": cut, "cut": True}
    return {"size": size, "text": data.decode("utf-8", "replace"), "cut": False}


def _call(c: Any) -> dict[str, Any]:
    args = c.arguments if c.arguments is not None else c.arguments_raw
    return {
        "id": c.id,
        "name": c.name,
        "args": _clip_text(args if isinstance(args, str) else orjson.dumps(args).decode(), 4000),
    }


def _diff(before: str, after: str) -> list[list[str]] | None:
    """None when equal, else the unified diff as [kind, line] pairs (kind ``-``, ``+``, `` ``)."""
    if before == after:
        return None
    lines = []
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), "O", "O′", lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = line[:1] if line[:1] in "-+@" else " "
        lines.append([kind, line[1:] if kind != "@" else line])
        if len(lines) >= 400:
            lines.append(["@", "… the diff goes on"])
            break
    return lines


class _Read:
    """A run as read for pages: its trajectory and each exchange's request body as the page
    shows it (cut while the classification reads it: a second pass over the bodies of a long
    run cost a sixth of the time)."""

    __slots__ = ("bodies", "traj")

    def __init__(self, reader: JournalReader, run_id: str, body_limit: int) -> None:
        self.bodies: dict[str, dict[str, Any] | None] = {}

        def keep(ex: Any, body: bytes | None) -> None:
            if ex.id not in self.bodies:
                self.bodies[ex.id] = _body(body, body_limit, ex.id, "request")

        self.traj = trajectory_from_journal(reader, run_id, on_request_body=keep)


def _read(reader: JournalReader, run_id: str, parsed: dict[str, Any], body_limit: int) -> _Read:
    """``run_id`` read once per page set (a replay's page and its parent's both need the
    parent's)."""
    if run_id not in parsed:
        parsed[run_id] = _Read(reader, run_id, body_limit)
    return parsed[run_id]


def run_document(
    reader: JournalReader,
    run_id: str,
    body_limit: int = DEFAULT_BODY_LIMIT,
    parsed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The page's data for ``run_id``: ``{"run", "attempts", "exchanges", "children",
    "comparison", "generated"}`` (what they show: docs/report.md); ``run.lineage`` is
    :func:`pvisor.journal.model.run_lineage`'s (None for a run that derives from nothing),
    ``children`` the runs whose ``parent_run`` is it, in creation order, each ``{id, mode,
    agent, boundary_step, pause_transition}``. ``parsed``: runs already read, by run id (filled
    in). Raises UsageError for an unknown run, as the reader does."""
    parsed = {} if parsed is None else parsed
    run = reader.run(run_id)
    read = _read(reader, run.id, parsed, body_limit)
    traj = read.traj
    exchanges = reader.exchanges(run.id)
    first_ms = min((e.started_ms for e in exchanges), default=run.created_ms)
    step_of = {d["exchange"]: s for s, d in zip(traj.steps, traj.meta.get("steps", []))}
    details = {d["exchange"]: d for d in traj.meta.get("steps", [])}
    aux = {a["exchange"]: a for a in traj.meta.get("auxiliary", [])}
    rows = []
    with progress.task(f"page of run {run.id}", len(exchanges), progress.Unit.EXCHANGES) as task:
        for e in exchanges:
            rows.append(_row(reader, e, first_ms, body_limit, read, step_of.get(e.id), details, aux))
            task.advance()
    doc: dict[str, Any] = {
        "run": {
            "id": run.id,
            "agent": run.agent,
            "agent_version": run.agent_version,
            "mode": getattr(run.mode, "value", run.mode),
            "created_ms": run.created_ms,
            "parent_run": run.parent_run,
            "boundary_step": run.boundary_step,
            "pause_transition": run.pause_transition,
            "lineage": run_lineage(run),
            "labels": run.labels,
            "task": traj.task,
            "model": traj.model,
            "protocol": traj.meta.get("protocol"),
            "steps": len(traj.steps),
        },
        "attempts": [
            {"n": a.n, "started_ms": a.started_ms, "ended_ms": a.ended_ms, "exit_code": a.exit_code}
            for a in reader.attempts(run.id)
        ],
        "exchanges": rows,
        # the runs derived from it or handed off from it (one read of the runs table)
        "children": [
            {
                "id": c.id,
                "mode": getattr(c.mode, "value", c.mode),
                "agent": c.agent,
                "boundary_step": c.boundary_step,
                "pause_transition": c.pause_transition,
            }
            for c in reader.runs()
            if c.parent_run == run.id
        ],
        "comparison": [],
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    # a handoff's child run that no replay started (pvisor run --child-run) re-ran none of the
    # parent's steps: there is no O against O' to show
    replayed = run.mode != "handoff" or run.labels.get("started_as") in ("replay-only", "continuation")
    if run.parent_run and replayed:
        doc["comparison"] = _comparison(reader, run.parent_run, traj, run.boundary_step, parsed, body_limit)
    return doc


def _row(
    reader: JournalReader,
    e: Any,
    first_ms: float,
    body_limit: int,
    read: _Read,
    step: Any,
    details: dict[str, Any],
    aux: dict[str, Any],
) -> dict[str, Any]:
    """The page's row of exchange ``e`` (``step``: its step, None for an auxiliary one)."""
    row: dict[str, Any] = {
        "id": e.id,
        "seq": e.seq,
        "attempt": e.attempt,
        "method": e.method,
        "path": e.path + ("?" + e.query if e.query else ""),
        "status": e.status,
        "outcome": e.outcome,
        "served_by": e.served_by,
        "capture": e.capture,
        "flags": list(e.flags),
        "streamed": e.streamed,
        "at_ms": round(e.started_ms - first_ms, 1),
        "ms": round(e.ended_us / 1000, 1) if e.ended_us is not None else None,
        "first_byte_ms": round(e.first_byte_us / 1000, 1) if e.first_byte_us is not None else None,
        # cut as the classification read it; read again only if it was not (none is missed today)
        "request": read.bodies[e.id]
        if e.id in read.bodies
        else _body(reader.request_body(e) if e.request_body else None, body_limit, e.id, "request"),
        "response": _body(
            reader.blob(e.response_final or e.response_body)
            if (e.response_final or e.response_body)
            else None,
            body_limit,
            e.id,
            "response",
        ),
    }
    if step is not None:
        a, o = step.action, step.observation
        d = details[e.id]
        row["step"] = {
            "n": step.n,
            "text": _clip_text(a.text or ""),
            "reasoning": bool(a.reasoning),
            "calls": [_call(c) for c in a.tool_calls],
            "results": [
                {"call_id": r.call_id, "error": r.is_error, "text": _clip_text(_text_of(r.content))}
                for r in o.results
            ],
            "messages": [
                _clip_text(" ".join(getattr(p, "text", None) or "" for p in m.parts)) for m in o.messages
            ],
            "usage": a.usage,
            "flags": list(step.flags),
            "retries": d.get("retries", []),
        }
    elif e.id in aux:
        row["aux"] = {"kind": aux[e.id]["kind"], "reason": aux[e.id]["reason"]}
    else:
        row["aux"] = {"kind": "synthetic_end" if "synthetic_end" in e.flags else "other", "reason": ""}
    return row


def _comparison(
    reader: JournalReader,
    parent: str,
    traj: Any,
    boundary: int | None,
    parsed: dict[str, Any],
    body_limit: int,
) -> list[dict[str, Any]]:
    """Per step up to the boundary and per tool call: the parent's observation O against the
    derived run's O', equal or with their diff. A parent that is not in this journal (a replay
    from a native file) gives nothing to compare."""
    try:
        parent_traj = _read(reader, parent, parsed, body_limit).traj
    except PvisorError:  # the parent is a native file, or unreadable: nothing to compare
        return []
    normalise = _normaliser(traj.meta.get("agent"))
    out = []
    last = boundary if boundary is not None else len(traj.steps)
    for n in range(1, min(last, len(traj.steps), len(parent_traj.steps)) + 1):
        was, now = parent_traj.steps[n - 1], traj.steps[n - 1]
        calls = []
        for i, call in enumerate(was.action.tool_calls):
            o = _text_of(was.observation.results[i].content) if i < len(was.observation.results) else ""
            o2 = _text_of(now.observation.results[i].content) if i < len(now.observation.results) else ""
            diff = _diff(o, o2)
            calls.append(
                {
                    "name": call.name,
                    "O": _clip_text(o, 8000),
                    "O2": _clip_text(o2, 8000),
                    "diff": diff,
                    # as result.json's replayed_tool_calls compare them: the agent's own
                    # decorations (Codex's "Wall time:", Gemini CLI's PGID) do not count
                    "same_normalised": diff is None or normalise(o) == normalise(o2),
                }
            )
        out.append({"n": n, "calls": calls})
    return out


def _normaliser(agent: str | None) -> Any:
    """The agent's tool-output normalisation (its descriptor's decorations), or the identity
    for an agent pvisor has no descriptor of."""
    if agent in descriptor_names():
        return get_descriptor(agent).normalise_output
    return lambda text: text
