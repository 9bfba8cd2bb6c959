"""The journal adapter: a captured run read as its trajectory of steps.

The main chain of the run (:mod:`pvisor.adapters.chains`) gives the main-loop requests
1..N (the kept exchange of each slot). Then, per docs/steps.md, "Steps":

- **A_i** is the reply to request i, read from its reassembled final response (the stored
  ``response_final`` of a stream, else the body; reassembled here when a stream was stored
  without it) with the protocol's ``response_to_action``: text, reasoning, tool calls with
  their exact ``arguments_raw`` and call ids, usage, stop reason, model. Parallel calls of one
  reply are one batch, one step. With ``wire_ids`` (``journal steps``, the exports) each call
  carries the id the agent sent it back under in request i+1, which its results answer (Gemini
  CLI makes its own for a reply that gave none); the reply's are then kept in the step's
  ``reply_call_ids``.
- **O_i** is what request i+1 appends after A_i: the messages after request i's own, minus
  the echo of A_i (the leading assistant messages); they come parsed from the classification
  (``Request.tail``), so no body is parsed twice. Tool results go to ``results`` in the order
  the agent sent them (agents send them in call order), with their exact content and
  ``is_error``; any other appended part (a user prompt, mini-swe-agent's "format error"
  message, text an agent adds beside the results) goes to ``messages``, grouped per message.
  Content is taken from the parsed request, never from the normalised form: normalisation only
  decides what compares equal.
- The last step's observation is empty (no request N+1), unless request N+1 is playback's
  synthetic final reply (flag ``synthetic_end``, :data:`SYNTHETIC_END`): such a request gives
  O_N and its reply is never a step (``meta["synthetic_end"]`` lists them).

Step flags (``Step.flags``), each also explained in ``Trajectory.meta["steps"]``:

============================  ===================================================================
``action_dropped_by_agent``   request i+1 does not carry A_i (no assistant message where A_i
                              belongs), although A_i had text or tool calls
``action_changed_by_agent``   request i+1 carries an assistant message there that is not A_i
                              (text or tool calls differ once normalised; reasoning and other
                              blocks, such as server tool results, ignored)
``no_reply``                  request i got no usable reply: an error status, no body, a body
                              that does not read as a response, or one that holds no reply
                              (Chat ``choices`` null or empty; A_i is then empty)
``interrupted``               the exchange did not end normally (``aborted_by_client``,
                              ``upstream_reset``, ``incomplete``, in flight): A_i holds what arrived
``partially_delivered``       the agent got fewer response bytes than the upstream sent
                              (``bytes_delivered < bytes_received``): A_i holds more than it saw
``response_truncated``        the journal holds only the first bytes of reply i (the exchange is
                              flagged ``truncated``: past the gateway's ``--max-response-body`` or
                              journal budget); A_i holds what was kept (:data:`RESPONSE_TRUNCATED`)
``tool_results_not_sent``     A_N made tool calls but no later main-loop request sent results
``missing_tool_results``      request i+1 answers only some of A_i's tool calls (calls the
                              provider runs itself, kind ``server``, expect no result)
``retried``                   request i was sent more than once; the step keeps the exchange whose
                              reply request i+1 carries, else the last that succeeded (the others
                              are auxiliary ``retry`` exchanges, whose reasons name the kept one)
``system_changed``            request i's system prompt differs from request i-1's
``tools_changed``             request i's tools differ from request i-1's
``thinking_signature_empty``  a thinking block of A_i has an empty signature (a scripted model's):
                              the live API refuses it (replay ``--reasoning strip``)
``thinking_signature_missing``    a thinking block of A_i has no signature
``thinking_signature_incomplete`` a thinking block's signature is not complete base64 (cut off, or
                              a placeholder); it is passed on as recorded
``boundary_prompt``           (:class:`LiveContextFlag`) a continuation sent request i to the live
                              model with the boundary user prompt injected
``reasoning_stripped``        (:class:`LiveContextFlag`) a continuation sent request i to the live
                              model with the served replies' reasoning removed (``--reasoning strip``)
============================  ===================================================================

A request that went upstream as other bytes than the agent sent (``Exchange.forwarded_body``: a
continuation's boundary prompt, reasoning, model or ``previous_response_id`` rewrite) keeps its
place in the chain by the agent's own bytes (the agent's next request never holds the boundary
prompt); what the live model got is the step's ``forwarded`` detail: the digests of both bodies
and ``added_user_text``, the user text the forwarded request holds beyond the agent's (the
boundary prompt). The rows and ATIF exports show the forwarded context from it.

Public API: :func:`trajectory_from_journal`, :func:`build_trajectory` and
:func:`trajectory_to_json` (the ``pvisor journal steps --json`` document, docs/steps.md).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from pvisor.adapters.chains import (
    Classification,
    Prefer,
    Request,
    Slot,
    action_message,
    changes_between,
    classify_run,
    read_final_response,
    said,
)
from pvisor.adapters.echoes import echo_aliases, same_said
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import json_type, signature_flags
from pvisor.core import progress
from pvisor.core.errors import BadInputError
from pvisor.journal.model import (
    RESPONSE_TRUNCATED,
    TRUNCATED_FLAG,
    Action,
    Conversation,
    Exchange,
    LeftOut,
    Message,
    Observation,
    OtherPart,
    Reasoning,
    Step,
    TextPart,
    ToolCall,
    ToolResult,
    Trajectory,
)
from pvisor.journal.reader import JournalReader

#: the exchange flag of playback's synthetic final reply (pvisor.replay.playback)
SYNTHETIC_END = "synthetic_end"


class LiveContextFlag(str, enum.Enum):
    """How the request of a live step differed from the agent's: flags a continuation
    (pvisor.replay.continuation) journals on the exchange it forwarded rewritten, and that the
    step then carries, since the live model answered another context than the agent's request."""

    BOUNDARY_PROMPT = "boundary_prompt"  #: the boundary user prompt was injected
    REASONING_STRIPPED = "reasoning_stripped"  #: the served replies' reasoning was removed


#: schema name of :func:`trajectory_to_json`'s document
STEPS_SCHEMA = "pvisor.steps/v1"

#: outcomes of an exchange that ended before its response did
_INTERRUPTED = frozenset({"aborted_by_client", "upstream_reset", "incomplete", "in_flight"})
#: outcomes whose error status the gateway gave itself (no upstream answered)
_GATEWAY_STATUS = frozenset({"upstream_unreachable", "upstream_reset", "oversize"})


def trajectory_from_journal(
    reader: JournalReader,
    run_id: str,
    *,
    prefer: Prefer | None = None,
    on_request_body: Callable[[Exchange, bytes | None], None] | None = None,
    wire_ids: bool = False,
) -> Trajectory:
    """The run ``run_id`` (or a unique prefix) of a journal as a :class:`Trajectory`.

    ``prefer`` is the launch profile's tie-break hint for the main chain (see
    :func:`pvisor.adapters.chains.classify_exchanges`); ``on_request_body`` is handed each
    request body as the classification reads it; ``wire_ids`` as for :func:`build_trajectory`.
    Raises UsageError when no run or several match, IntegrityError when a stored body is
    damaged; never for bodies that do not parse (they are left out, or flagged, with the reason).
    """
    return build_trajectory(
        reader,
        classify_run(reader, run_id, prefer=prefer, on_request_body=on_request_body),
        wire_ids=wire_ids,
    )


@dataclass(slots=True)
class _Reply:
    action: Action
    flags: list[str] = field(default_factory=list)
    problem: str | None = None


def _read_reply(reader: JournalReader, req: Request) -> _Reply:
    ex = req.exchange
    assert req.protocol is not None  # a main-loop request is a candidate: it parsed
    mod = get_protocol(req.protocol)
    reply = _Reply(Action())
    if ex.outcome in _INTERRUPTED:
        reply.flags.append("interrupted")
    if ex.bytes_delivered < ex.bytes_received:
        reply.flags.append("partially_delivered")
    if TRUNCATED_FLAG in ex.flags:
        reply.flags.append(RESPONSE_TRUNCATED)
    if ex.status is not None and ex.status >= 400:
        reply.flags.append("no_reply")
        if ex.outcome in _GATEWAY_STATUS:
            reply.problem = (
                f"the gateway answered status {ex.status} itself, no upstream reply (outcome {ex.outcome}"
                + (f": {ex.error})" if ex.error else ")")
            )
        else:
            reply.problem = f"the upstream answered status {ex.status}"
        return reply
    final, problem = read_final_response(reader, ex)
    if final is None or not isinstance(final, dict):
        reply.flags.append("no_reply")
        reply.problem = problem or f"the response is a JSON {json_type(final)}, expected an object"
        return reply
    try:
        reply.action = mod.response_to_action(final)
    except BadInputError as exc:
        reply.flags.append("no_reply")
        reply.problem = f"the response does not read as a reply: {exc.message}"
        return reply
    missing = getattr(mod, "reply_problem", None)
    problem = missing(final) if missing is not None else None
    if problem is not None:
        reply.flags.append("no_reply")
        reply.problem = problem
    return reply


def _echo(appended: list[Message]) -> list[Message]:
    """The leading assistant messages of what a request appends: its echo of the last reply."""
    echo: list[Message] = []
    for m in appended:
        if m.role != "assistant":
            break
        echo.append(m)
    return echo


def _has_content(action: Action) -> bool:
    return bool(action.text) or bool(action.tool_calls)


def _observation(
    protocol: str, appended: list[Message], action: Action, aliases: dict[str, str] | None = None
) -> tuple[Observation, list[str], dict[str, Any], list[str | None]]:
    """O_i from the messages request i+1 appends to request i (``appended``), with the flags
    and details of how it carries A_i, and the ids the agent sent A_i's calls back under (one
    per call: the reply's own where the agent echoed none); ``aliases``: the agent's
    ``echo_aliases`` (a call echoed under its alias is no change)."""
    mod = get_protocol(protocol)
    echo = _echo(appended)
    flags: list[str] = []
    details: dict[str, Any] = {}
    if _has_content(action):
        if not echo:
            flags.append("action_dropped_by_agent")
        elif not same_said(said(mod, [action_message(action)]), said(mod, echo), aliases):
            flags.append("action_changed_by_agent")
    obs = Observation()
    wire: list[str | None] = [c.id for c in action.tool_calls]
    for m in appended[len(echo) :]:
        others = []
        for p in m.parts:
            if isinstance(p, ToolResult):
                obs.results.append(p)
            else:
                others.append(p)
        if others or not m.parts:
            obs.messages.append(Message(m.role, others, raw=m.raw) if len(others) != len(m.parts) else m)
    if action.tool_calls and "action_dropped_by_agent" not in flags:
        # the ids the agent itself gave the calls (Gemini CLI makes its own) answer the results
        echoed = [p for m in echo for p in m.parts if isinstance(p, ToolCall)]
        ids = (
            [c.id for c in echoed]
            if len(echoed) == len(action.tool_calls)
            else [c.id for c in action.tool_calls]
        )
        wire = [e if e is not None else c.id for e, c in zip(ids, action.tool_calls)]
        answered = {r.call_id for r in obs.results if r.call_id is not None}
        # a call is answered by a result carrying its id; without ids on either side, results
        # answer the calls in order
        # calls the provider runs itself (kind "server": web search, code execution) expect none
        missing = [
            i
            for i, cid in enumerate(ids)
            if action.tool_calls[i].kind != "server"
            and not (cid in answered if cid is not None and answered else i < len(obs.results))
        ]
        if missing:
            flags.append("missing_tool_results")
            details["missing_results"] = [
                {"call": i + 1, "id": action.tool_calls[i].id, "name": action.tool_calls[i].name}
                for i in missing
            ]
    return obs, flags, details, wire


def _compacted_observation(
    nxt: Request, summary: Request, req: Request, action: Action
) -> tuple[Observation, list[str]]:
    """O_i when request i+1 is the first after a compaction (it sends the summary of
    ``summary`` in place of the history): the results answering A_i's calls, from request
    i+1 when the agent kept them verbatim after the summary (Claude Code, Qwen Code), else
    from the summary request, which holds the history with them (Codex); flags
    ``missing_tool_results`` when neither does."""
    want = [c.id for c in action.tool_calls if c.kind != "server"]
    obs = Observation()
    for source in (nxt.messages_from(0), summary.messages_from(len(req.messages))):
        found = {
            p.call_id: p for m in source for p in m.parts if isinstance(p, ToolResult) and p.call_id in want
        }
        if want and all(cid in found for cid in want):
            obs.results = [found[cid] for cid in want]
            return obs, []
    return obs, (["missing_tool_results"] if want else [])


def _carried(
    reader: JournalReader, c: Classification, slot: Slot, kept: Request, nxt: Request
) -> tuple[Request, _Reply | None]:
    """The exchange of ``slot`` whose reply the next main-loop request ``nxt`` carries, and that
    reply when it had to be read: the kept one unless another exchange of the slot that
    succeeded answered what ``nxt`` echoes (a request answered X then, retried, Y, the agent
    going on with X). The slot then keeps that exchange (``c.keep``: its role becomes main, and
    the auxiliary ``retry`` entries name it)."""
    others = [r for r in slot.requests if r is not kept and r.succeeded]
    if not others or kept.protocol is None:
        return kept, None
    mod = get_protocol(kept.protocol)
    echo = _echo(nxt.messages_from(len(kept.messages)))
    if not echo:
        return kept, None
    carried = said(mod, echo)
    reply = _read_reply(reader, kept)
    if said(mod, [action_message(reply.action)]) == carried:
        return kept, reply
    for r in reversed(others):
        other = _read_reply(reader, r)
        if said(mod, [action_message(other.action)]) == carried:
            c.keep(slot, r)
            return r, other
    return kept, reply


def request_task(conv: Conversation) -> tuple[str | None, list[str]]:
    """(task, context): the last non-empty text part of the last user message of the first
    main-loop request (agents put their own context blocks before the user's prompt), and the
    other text parts of that request's user messages, in order."""
    texts: list[tuple[int, int, str]] = []
    for i, m in enumerate(conv.messages):
        if m.role != "user":
            continue
        for j, p in enumerate(m.parts):
            if isinstance(p, TextPart) and p.text:
                texts.append((i, j, p.text))
    if not texts:
        return None, []
    return texts[-1][2], [t for _, _, t in texts[:-1]]


def build_trajectory(
    reader: JournalReader, classification: Classification, *, wire_ids: bool = False
) -> Trajectory:
    """The trajectory of a classified run (see the module docstring for every rule).

    ``wire_ids``: each tool call of A_i carries the id the agent sent it back under in request
    i+1 (the id its results answer), where that differs from the reply's own: Gemini CLI makes
    its own ids for a reply that gave none (``journal steps`` and the exports: a call and its
    results share one id). The reply's ids are then in the step's ``reply_call_ids``. Without
    it (playback, which renders the actions to the agent again) the actions are the replies as
    the model sent them.

    ``Trajectory.meta`` holds: ``run``, ``agent``, ``protocol``, ``main_chain`` (number or
    None), ``task_context`` (list of str), ``chains`` (``Chain.summary()`` of every chain),
    ``steps`` (per step: ``n``, ``exchange``, ``seq``, ``attempt``, ``retries`` ids, ``status``,
    ``outcome`` and, when they apply, ``reply_problem``, ``missing_results``, ``tools_added``,
    ``tools_removed``, ``bytes_received`` and ``bytes_delivered``, ``previous_response_id`` and
    ``previous_exchange``, ``reply_call_ids``, ``forwarded``: :func:`forwarded_context`),
    ``auxiliary`` (per left-out exchange: ``exchange``, ``seq``,
    ``kind``, ``reason``, ``chain``).
    """
    c = classification
    run = reader.run(c.run) if c.run else None
    main = c.main_requests
    traj = Trajectory()
    meta: dict[str, Any] = {
        "run": c.run,
        "agent": run.agent if run is not None else None,
        "protocol": None,
        "main_chain": c.main.number if c.main is not None else None,
        "task_context": [],
        "chains": [ch.summary() for ch in c.chains],
        "steps": [],
    }
    traj.meta = meta
    if main:
        _build_steps(reader, traj, c, wire_ids)
    # after the steps: a step may keep another exchange of its slot than the classification did
    traj.left_out = [LeftOut(lo.exchange, lo.kind, lo.reason) for lo in c.left_out]
    meta["auxiliary"] = [
        {"exchange": lo.exchange, "seq": lo.seq, "kind": lo.kind, "reason": lo.reason, "chain": lo.chain}
        for lo in c.left_out
    ]
    return traj


def _build_steps(reader: JournalReader, traj: Trajectory, c: Classification, wire_ids: bool) -> None:
    """The steps of ``traj`` from the main chain of ``c`` (which has at least one request;
    ``wire_ids``: :func:`build_trajectory`)."""
    meta = traj.meta
    main = c.main_requests
    # request 1 is parsed again for its system prompt, tools and task; the observations come
    # from the messages each request appended, kept by the classification
    first = main[0].conversation()
    traj.system = first.system
    traj.tools = list(first.tools)
    traj.model = first.model
    traj.task, meta["task_context"] = request_task(first)
    meta["protocol"] = first.protocol
    assert c.main is not None
    # playback's synthetic final reply (request N+1 of a replay) is never a step: its request
    # still gives O_N
    steps = len(main)
    while steps > 0 and SYNTHETIC_END in main[steps - 1].exchange.flags:
        steps -= 1
    meta["synthetic_end"] = [q.id for q in main[steps:]]
    with progress.task(f"steps of run {c.run or '-'}", steps) as task:
        for i, (slot, req) in enumerate(zip(c.main.slots[:steps], main[:steps])):
            _build_step(reader, traj, c, main, i, slot, req, wire_ids)
            task.advance()


def _build_step(
    reader: JournalReader,
    traj: Trajectory,
    classified: Classification,
    main: list[Request],
    i: int,
    slot: Slot,
    req: Request,
    wire_ids: bool = False,
) -> None:
    """Step ``i + 1`` of ``traj`` (and its ``meta["steps"]`` entry) from main-loop request
    ``req`` of the main chain of ``classified`` and the request after it (``wire_ids``:
    :func:`build_trajectory`)."""
    meta = traj.meta
    chain = classified.main
    assert chain is not None
    reply = None
    if i + 1 < len(main):
        req, reply = _carried(reader, classified, slot, req, main[i + 1])
    if reply is None:
        reply = _read_reply(reader, req)
    flags = list(reply.flags)
    ex = req.exchange
    detail: dict[str, Any] = {
        "n": i + 1,
        "exchange": ex.id,
        "seq": ex.seq,
        "attempt": ex.attempt,
        "retries": [r.id for r in slot.retries],
        "status": ex.status,
        "outcome": ex.outcome,
    }
    if slot.retries:
        flags.append("retried")
    if reply.problem:
        detail["reply_problem"] = reply.problem
    if "partially_delivered" in flags:
        detail["bytes_received"] = ex.bytes_received
        detail["bytes_delivered"] = ex.bytes_delivered
    if req.previous_response_id is not None:
        detail["previous_response_id"] = req.previous_response_id
        detail["previous_exchange"] = req.base.id if req.base is not None else None
    if i > 0:
        changed = changes_between(main[i - 1], req)
        flags.extend(k for k in ("system_changed", "tools_changed") if changed.get(k))
        if changed.get("tools_changed"):
            detail["tools_added"] = changed["tools_added"]
            detail["tools_removed"] = changed["tools_removed"]
    if i + 1 < len(main) and chain.slots[i + 1].compaction is not None:
        summary = chain.slots[i + 1].compaction
        obs, more = _compacted_observation(main[i + 1], summary, req, reply.action)
        flags.extend(["compaction", *more])
        detail["compaction"] = summary.id
    elif i + 1 < len(main):
        nxt = main[i + 1]
        assert nxt.protocol is not None
        obs, more, extra, wire = _observation(
            nxt.protocol, nxt.messages_from(len(req.messages)), reply.action, echo_aliases(meta.get("agent"))
        )
        flags.extend(more)
        detail.update(extra)
        calls = reply.action.tool_calls
        if wire_ids and any(w != c.id for w, c in zip(wire, calls)):
            detail["reply_call_ids"] = [c.id for c in calls]
            reply.action = replace(reply.action, tool_calls=[replace(c, id=w) for w, c in zip(wire, calls)])
    else:
        obs = Observation()
        if any(c.kind != "server" for c in reply.action.tool_calls):
            flags.append("tool_results_not_sent")
    flags.extend(signature_flags(reply.action.reasoning))
    flags.extend(f.value for f in LiveContextFlag if f.value in ex.flags)
    if ex.forwarded_body is not None:
        detail["forwarded"] = forwarded_context(reader, req)
    traj.steps.append(Step(n=i + 1, action=reply.action, observation=obs, flags=flags))
    meta["steps"].append(detail)


def _user_texts(conv: Conversation) -> list[str]:
    return [p.text for m in conv.messages if m.role == "user" for p in m.parts if isinstance(p, TextPart)]


def forwarded_context(reader: JournalReader, req: Request) -> dict[str, Any]:
    """What the live model got for main-loop request ``req`` when a continuation forwarded other
    bytes than the agent sent (``Exchange.forwarded_body`` set): ``{sha256, agent_sha256,
    added_user_text}``, the sha256 of the bytes forwarded and of the agent's own (its
    ``request_body``, ``pvisor journal body EXCHANGE --request``), and the user text parts the
    forwarded request holds beyond the agent's conversation, in order (the boundary user prompt:
    a reasoning, model or ``previous_response_id`` rewrite adds none). A forwarded body that does
    not parse adds none. IntegrityError for a damaged body."""
    ex = req.exchange
    added: list[str] = []
    body = reader.forwarded_body(ex)
    assert req.protocol is not None  # a main-loop request is a candidate: it parsed
    try:
        sent = get_protocol(req.protocol).parse_request(body, path=ex.path, query=ex.query)
        have = Counter(_user_texts(req.conversation()))
    except BadInputError:
        sent = None
    if sent is not None:
        for text in _user_texts(sent):
            if have[text] > 0:
                have[text] -= 1
            else:
                added.append(text)
    return {"sha256": ex.forwarded_body, "agent_sha256": ex.request_body, "added_user_text": added}


# --------------------------------------------------------------------------- JSON


def _part_json(p: Any) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text}
    if isinstance(p, Reasoning):
        return {
            "type": "reasoning",
            "text": p.text,
            "signed": bool(p.signature),
            "encrypted": bool(p.encrypted),
        }
    if isinstance(p, ToolCall):
        return {"type": "tool_call", **_call_json(p)}
    if isinstance(p, ToolResult):
        return {"type": "tool_result", **_result_json(p)}
    if isinstance(p, OtherPart):
        return {"type": p.kind, "raw": p.raw}
    raise TypeError(f"not a canonical part: {p!r}")  # pragma: no cover - a programming error


def _call_json(c: ToolCall) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "kind": c.kind,
        "arguments_raw": c.arguments_raw,
        "arguments": c.arguments,
    }


def _result_json(r: ToolResult) -> dict[str, Any]:
    return {"call_id": r.call_id, "name": r.name, "is_error": r.is_error, "content": r.content}


def trajectory_to_json(traj: Trajectory) -> dict[str, Any]:
    """The ``pvisor journal steps --json`` document (schema ``pvisor.steps/v1``), documented
    field by field in docs/steps.md. Observer view: reasoning signatures and encrypted
    reasoning appear only as ``signed``/``encrypted`` booleans."""
    meta = traj.meta
    details = meta.get("steps", [])
    steps = []
    for step, d in zip(traj.steps, details):
        a, o = step.action, step.observation
        steps.append(
            {
                "n": step.n,
                "exchange": d["exchange"],
                "seq": d["seq"],
                "attempt": d["attempt"],
                "retries": d["retries"],
                "flags": step.flags,
                "details": {
                    k: v for k, v in d.items() if k not in ("n", "exchange", "seq", "attempt", "retries")
                },
                "action": {
                    "text": a.text,
                    "reasoning": [_part_json(r) for r in a.reasoning],
                    "tool_calls": [_call_json(c) for c in a.tool_calls],
                    "stop_reason": a.stop_reason,
                    "model": a.model,
                    "usage": a.usage,
                },
                "observation": {
                    "results": [_result_json(r) for r in o.results],
                    "messages": [
                        {"role": m.role, "parts": [_part_json(p) for p in m.parts]} for m in o.messages
                    ],
                },
            }
        )
    return {
        "schema": STEPS_SCHEMA,
        "run": meta.get("run"),
        "agent": meta.get("agent"),
        "protocol": meta.get("protocol"),
        "model": traj.model,
        "main_chain": meta.get("main_chain"),
        "task": traj.task,
        "task_context": meta.get("task_context", []),
        "system": traj.system,
        "tools": None
        if traj.tools is None
        else [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in traj.tools],
        "steps": steps,
        "chains": meta.get("chains", []),
        "auxiliary": meta.get("auxiliary", []),
    }
