"""A journal's runs as OpenTelemetry traces in OTLP JSON (docs/exports.md "otel").

Format: an ``ExportTraceServiceRequest`` in the protobuf JSON mapping of OTLP
(opentelemetry-proto ``collector/trace/v1``; lowerCamelCase field names, 64-bit integers as
decimal strings, ids as hex), one JSON document per line (what an OpenTelemetry collector's
``otlpjson`` file receiver reads; this export writes one line per run). Attributes follow the
OpenTelemetry GenAI semantic conventions (``gen_ai.*``, development status; the names those of
opentelemetry-semantic-conventions 0.66, conventions v1.38 and later).

Per run, one trace (``traceId``: the first 16 bytes of sha256 of the run id):

- a root span ``invoke_agent {agent}`` (``kind`` INTERNAL; the agent as every export names it:
  :func:`~pvisor.adapters.exports.base.agent_name`), from the first exchange's start to the
  last one's end, with ``gen_ai.operation.name`` ``invoke_agent``, ``gen_ai.agent.name``,
  ``gen_ai.conversation.id`` (the agent's session id, else the run id) and ``pvisor.run.*`` (id,
  mode, agent_version, and the lineage: parent, boundary_step, and for a handoff's child
  pause_transition, workspace_snapshot, handoff_from_agent, handoff_to_agent);
- per exchange a child span ``{operation} {model}`` (``kind`` CLIENT): ``gen_ai.operation.name``
  (the protocol module's ``GEN_AI_OPERATION`` for a main-loop or auxiliary request of a
  protocol: ``chat``, Gemini's ``generate_content``; ``count_tokens`` for a token count, else
  ``http``), ``gen_ai.provider.name`` (the protocol module's), ``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.response.id``, the reply's usage by the protocol's
  ``normalised_usage``: ``gen_ai.usage.input_tokens`` (every input token, cache reads and writes
  included), ``gen_ai.usage.output_tokens`` (reasoning included),
  ``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.cache_creation.input_tokens``,
  ``gen_ai.usage.reasoning.output_tokens`` (each where the reply gives it),
  ``http.request.method``, ``url.path``, ``http.response.status_code``, ``pvisor.exchange.*``
  (id, seq, role and chain where the journal stores them, outcome, served_by); ``status``
  ERROR with the outcome when it did not end ``ok``;
- per tool call the agent ran between two main-loop model calls a child span
  ``execute_tool {tool}`` (``kind`` INTERNAL; :func:`tool_spans`): from the end of the exchange
  whose reply made the call to the start of the next main-loop request (the one that carries its
  result; the calls of one reply share that interval: pvisor sees when the results were sent,
  not when each tool ran), with ``gen_ai.operation.name`` ``execute_tool``,
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (the id the agent sent the result under),
  ``gen_ai.tool.type`` ``function``, ``pvisor.step``; ``status`` ERROR and ``error.type``
  ``tool_error`` when the result says it is an error. The steps are the chain rule's
  (docs/steps.md); a call of the last step, whose result no request carried, has none.
- ``--with-content`` adds to each exchange span the event ``gen_ai.client.inference.operation.details``
  with ``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.output.messages``
  in the conventions' message schema (:mod:`pvisor.adapters.exports.genai`, from the protocol's
  ``parse_request`` and ``response_to_action``), as JSON text, and to each ``execute_tool``
  span ``gen_ai.tool.call.arguments`` (the exact argument text) and ``gen_ai.tool.call.result``
  (the result's text, or the JSON of its blocks): content is left out by default, as the
  conventions advise.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, BinaryIO

import orjson

from pvisor.adapters.exports.base import (
    ExportFormat,
    JournalSource,
    Option,
    Settings,
    Source,
    Written,
    agent_name,
)
from pvisor.adapters.exports.genai import (
    input_messages,
    json_text,
    output_messages,
    reply_of,
    system_instructions,
)
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.core import progress
from pvisor.core.errors import PvisorError
from pvisor.journal.model import HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL, Action, Conversation, Trajectory
from pvisor.journal.reader import JournalReader
from pvisor.adapters.exports.shared import shared

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_OK = 1
STATUS_ERROR = 2


def _id(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[: size * 2]


def _attr(key: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


def _attrs(pairs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in (_attr(k, v) for k, v in pairs) if a is not None]


def _nanos(ms: float) -> str:
    return str(int(round(ms * 1_000_000)))


def _exchange_span(
    reader: JournalReader, ex: Any, trace: str, parent: str, with_content: bool, wire: Action | None = None
) -> dict[str, Any]:
    mod = get_protocol(ex.protocol) if ex.protocol in PROTOCOL_MODULES else None
    body = reader.request_body(ex) if ex.request_body else None
    final_bytes = reader.response_body(ex) if (ex.response_final or ex.response_body) else None
    request_model = response_model = response_id = None
    usage = TokenUsage()
    final: Any = None
    conv: Conversation | None = None
    action: Action | None = None
    if mod is not None and body:
        try:
            conv = mod.parse_request(body, path=ex.path, query=ex.query)
            request_model = conv.model
        except PvisorError:  # a body that does not parse still gets its span
            conv = None
    if final_bytes:
        try:
            final = orjson.loads(final_bytes)
        except orjson.JSONDecodeError:
            final = None
    if mod is not None and isinstance(final, dict):
        # nor does a reply that does not read as one
        action, usage = reply_of(mod, final)
        response_model = action.model if action is not None else None
        rid = final.get("id") or final.get("responseId")
        response_id = rid if isinstance(rid, str) else None
    if mod is None:
        operation = "http"
    elif mod.counts_tokens(ex.path):
        operation = "count_tokens"
    else:
        operation = mod.GEN_AI_OPERATION
    end_ms = ex.started_ms + (ex.ended_us or 0) / 1000
    span: dict[str, Any] = {
        "traceId": trace,
        "spanId": _id(ex.id, 8),
        "parentSpanId": parent,
        "name": f"{operation} {request_model}" if request_model else operation,
        "kind": SPAN_KIND_CLIENT,
        "startTimeUnixNano": _nanos(ex.started_ms),
        "endTimeUnixNano": _nanos(end_ms),
        "attributes": _attrs(
            [
                ("gen_ai.operation.name", operation),
                ("gen_ai.provider.name", getattr(mod, "GEN_AI_PROVIDER", None)),
                ("gen_ai.request.model", request_model),
                ("gen_ai.response.model", response_model),
                ("gen_ai.response.id", response_id),
                ("gen_ai.usage.input_tokens", usage.input_tokens),
                ("gen_ai.usage.output_tokens", usage.output_tokens),
                ("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens),
                ("gen_ai.usage.cache_creation.input_tokens", usage.cache_creation_input_tokens),
                ("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens),
                ("http.request.method", ex.method),
                ("url.path", ex.path),
                ("http.response.status_code", ex.status),
                ("pvisor.exchange.id", ex.id),
                ("pvisor.exchange.seq", ex.seq),
                ("pvisor.exchange.role", ex.role),
                ("pvisor.exchange.chain", ex.chain),
                ("pvisor.exchange.outcome", ex.outcome),
                ("pvisor.exchange.served_by", ex.served_by),
                ("pvisor.exchange.streamed", bool(ex.streamed)),
            ]
        ),
        "status": {"code": STATUS_OK}
        if ex.outcome == "ok"
        else {"code": STATUS_ERROR, "message": f"{ex.outcome}" + (f": {ex.error}" if ex.error else "")},
    }
    if with_content:
        span["events"] = [
            {
                "timeUnixNano": _nanos(end_ms),
                "name": "gen_ai.client.inference.operation.details",
                "attributes": _attrs(
                    [
                        ("gen_ai.system_instructions", json_text(system_instructions(conv))),
                        ("gen_ai.input.messages", json_text(input_messages(conv))),
                        ("gen_ai.output.messages", json_text(output_messages(with_wire_ids(action, wire)))),
                    ]
                ),
            }
        ]
    return span


def with_wire_ids(action: Action | None, wire: Action | None) -> Action | None:
    """``action`` (a reply as the provider sent it) with its tool calls' ids those the agent sent
    them back under (``wire``: the step's action of
    :func:`~pvisor.adapters.journal_trajectory.trajectory_from_journal` with ``wire_ids``, whose
    calls are the same, in order): Gemini CLI makes its own ids for a reply that gave none, and
    the ``execute_tool`` span and the next request's ``tool_call_response`` carry that id, so
    the output message's ``tool_call`` must too for a backend to link them. ``action`` as it
    is without ``wire`` or when the calls do not pair up."""
    if action is None or wire is None or len(wire.tool_calls) != len(action.tool_calls):
        return action
    calls = [
        replace(c, id=w.id if w.id is not None else c.id) for c, w in zip(action.tool_calls, wire.tool_calls)
    ]
    return replace(action, tool_calls=calls)


def tool_spans(
    reader: JournalReader,
    run_id: str,
    exchanges: list[Any],
    trace: str,
    parent: str,
    with_content: bool,
    traj: Trajectory | None = None,
) -> list[dict[str, Any]]:
    """The ``execute_tool {name}`` spans of run ``run_id`` (module docstring): per tool call of
    main-loop step i that the agent runs (kind ``function`` or ``custom``; a ``server`` call the
    provider ran inside the reply) and that a next main-loop request i+1 exists for, from the end
    of step i's exchange to the start of request i+1's. Steps by the chain rule
    (:func:`~pvisor.adapters.journal_trajectory.trajectory_from_journal`, the call ids the agent
    sent back; ``traj``: that trajectory when the caller has it); ``status`` ERROR when the
    result says so (``is_error``)."""
    if traj is None:
        traj = trajectory_from_journal(reader, run_id, wire_ids=True)
    by_id = {ex.id: ex for ex in exchanges}
    details = traj.meta.get("steps", [])
    spans: list[dict[str, Any]] = []
    for i, step in enumerate(traj.steps[:-1]):
        made, carried = by_id.get(details[i]["exchange"]), by_id.get(details[i + 1]["exchange"])
        if made is None or carried is None:
            continue
        start_ms = made.started_ms + (made.ended_us or 0) / 1000
        results = {r.call_id: r for r in step.observation.results if r.call_id is not None}
        for j, call in enumerate(c for c in step.action.tool_calls if c.kind != "server"):
            # without ids on either side, results answer the calls in order
            result = results.get(call.id) if call.id is not None else None
            if result is None and not results and j < len(step.observation.results):
                result = step.observation.results[j]
            pairs: list[tuple[str, Any]] = [
                ("gen_ai.operation.name", "execute_tool"),
                ("gen_ai.tool.name", call.name),
                ("gen_ai.tool.call.id", call.id),
                ("gen_ai.tool.type", "function"),
                ("pvisor.step", step.n),
            ]
            if with_content:
                pairs.append(("gen_ai.tool.call.arguments", call.arguments_raw))
                pairs.append(("gen_ai.tool.call.result", json_text(result.content) if result else None))
            failed = result is not None and result.is_error is True
            spans.append(
                {
                    "traceId": trace,
                    "spanId": _id(f"tool:{run_id}:{step.n}:{j}", 8),
                    "parentSpanId": parent,
                    "name": f"execute_tool {call.name}",
                    "kind": SPAN_KIND_INTERNAL,
                    "startTimeUnixNano": _nanos(start_ms),
                    "endTimeUnixNano": _nanos(max(start_ms, carried.started_ms)),
                    "attributes": _attrs(pairs + ([("error.type", "tool_error")] if failed else [])),
                    "status": {"code": STATUS_ERROR, "message": "the tool's result is an error"}
                    if failed
                    else {"code": STATUS_OK},
                }
            )
    return spans


def run_request(
    reader: JournalReader, run: Any, with_content: bool = False, version: str = "unknown"
) -> dict[str, Any]:
    """The ``ExportTraceServiceRequest`` (as a dict) of one run (module docstring); ``version``:
    pvisor's, for ``service.version`` and the scope."""
    exchanges = reader.exchanges(run.id)
    trace = _id(run.id, 16)
    root = _id("run:" + run.id, 8)
    spans = []
    traj = None
    wire: dict[str, Action] = {}  # the kept exchange of each step: its action with the wire ids
    if any(ex.protocol in PROTOCOL_MODULES for ex in exchanges):
        traj = trajectory_from_journal(reader, run.id, wire_ids=True)
        wire = {d["exchange"]: s.action for d, s in zip(traj.meta.get("steps", []), traj.steps)}
    with progress.task(f"spans of run {run.id}", len(exchanges), progress.Unit.EXCHANGES) as task:
        for ex in exchanges:
            spans.append(_exchange_span(reader, ex, trace, root, with_content, wire.get(ex.id)))
            task.advance()
    if traj is not None:
        spans.extend(tool_spans(reader, run.id, exchanges, trace, root, with_content, traj))
    start = min((ex.started_ms for ex in exchanges), default=run.created_ms)
    end = max((ex.started_ms + (ex.ended_us or 0) / 1000 for ex in exchanges), default=start)
    agent = agent_name(run)  # as ATIF names it
    root_span = {
        "traceId": trace,
        "spanId": root,
        "name": f"invoke_agent {agent}",
        "kind": SPAN_KIND_INTERNAL,
        "startTimeUnixNano": _nanos(start),
        "endTimeUnixNano": _nanos(end),
        "attributes": _attrs(
            [
                ("gen_ai.operation.name", "invoke_agent"),
                ("gen_ai.agent.name", agent),
                ("gen_ai.conversation.id", run.labels.get("session_id") or run.id),
                ("pvisor.run.id", run.id),
                ("pvisor.run.mode", getattr(run.mode, "value", run.mode)),
                ("pvisor.run.agent_version", run.agent_version),
                ("pvisor.run.parent", run.parent_run),
                ("pvisor.run.boundary_step", run.boundary_step),
                # a handoff's child run: the pause's transition and snapshot, the two agents
                ("pvisor.run.pause_transition", run.pause_transition),
                ("pvisor.run.workspace_snapshot", run.workspace_snapshot),
                *((f"pvisor.run.{k}", run.labels.get(k)) for k in (HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL)),
            ]
        ),
        "status": {"code": STATUS_OK},
    }
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": _attrs([("service.name", "pvisor"), ("service.version", version)])
                },
                "scopeSpans": [
                    {"scope": {"name": "pvisor", "version": version}, "spans": [root_span, *spans]}
                ],
            }
        ]
    }


def write_otel(
    reader: JournalReader,
    run_id: str | None,
    out: BinaryIO,
    *,
    with_content: bool = False,
    version: str = "unknown",
) -> int:
    """Write one OTLP JSON line per run (``run_id``, or every run); returns the number of spans.
    UsageError for an unknown run."""
    runs = [reader.run(run_id)] if run_id is not None else reader.runs()
    n = 0
    for run in runs:
        doc = run_request(reader, run, with_content, version)
        out.write(orjson.dumps(shared(doc)) + b"\n")  # docs/exports.md "Secrets"
        n += len(doc["resourceSpans"][0]["scopeSpans"][0]["spans"])
    return n


def write(source: JournalSource, out: BinaryIO, settings: Settings) -> Written:
    """:func:`write_otel` of ``source`` with the version of pvisor in ``settings``; counts the spans."""
    return Written(
        write_otel(
            source.reader, source.run_id, out, with_content=settings.with_content, version=settings.version
        )
    )


FORMAT = ExportFormat(
    name="otel",
    describe=dict.fromkeys((Source.RUN, Source.RUNS), "OTLP JSON traces (GenAI conventions)"),
    write=write,
    unit="spans",
    extension="jsonl",
    reads=frozenset({Option.WITH_CONTENT}),
)
