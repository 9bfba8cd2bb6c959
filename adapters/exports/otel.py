"""A journal's runs as OpenTelemetry traces in OTLP JSON (docs/exports.md "otel").

Format: an ``ExportTraceServiceRequest`` in the protobuf JSON mapping of OTLP
(opentelemetry-proto ``collector/trace/v1``; lowerCamelCase field names, 64-bit integers as
decimal strings, ids as hex), one JSON document per line (what an OpenTelemetry collector's
``otlpjson`` file receiver reads; this export writes one line per run). Attributes follow the
OpenTelemetry GenAI semantic conventions (``gen_ai.*``, development status as of v1.37).

Per run, one trace (``traceId``: the first 16 bytes of sha256 of the run id):

- a root span ``invoke_agent {agent}`` (``kind`` INTERNAL), from the first exchange's start to the
  last one's end, with ``gen_ai.operation.name`` ``invoke_agent``, ``gen_ai.agent.name``,
  ``gen_ai.conversation.id`` (the agent's session id, else the run id) and ``pvisor.run.*`` (id,
  mode, agent_version, and the lineage: parent, boundary_step, and for a handoff's child
  pause_transition, workspace_snapshot, handoff_from_agent, handoff_to_agent);
- per exchange a child span ``{operation} {model}`` (``kind`` CLIENT): ``gen_ai.operation.name``
  (``chat`` for a main-loop or auxiliary request of a protocol, ``count_tokens`` for a token
  count, else ``http``), ``gen_ai.provider.name`` (the protocol module's), ``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.response.id``, ``gen_ai.usage.input_tokens`` and
  ``output_tokens`` (what the reply reports), ``http.request.method``, ``url.path``,
  ``http.response.status_code``, ``pvisor.exchange.*`` (id, seq, role, chain, outcome,
  served_by); ``status`` ERROR with the outcome when it did not end ``ok``.
- ``--with-content`` adds to each exchange span the event ``gen_ai.client.inference.operation.details``
  with ``gen_ai.input.messages`` (the request body) and ``gen_ai.output.messages`` (the final
  response), as JSON text: content is left out by default, as the conventions advise.
"""

from __future__ import annotations

import hashlib
from typing import Any, BinaryIO

import orjson

from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol
from pvisor.adapters.protocols.base import token_counts
from pvisor.adapters.exports.base import ExportFormat, JournalSource, Option, Settings, Source, Written
from pvisor.core import progress
from pvisor.core.errors import PvisorError
from pvisor.journal.model import HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL
from pvisor.journal.reader import JournalReader

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
    reader: JournalReader, ex: Any, trace: str, parent: str, with_content: bool
) -> dict[str, Any]:
    mod = get_protocol(ex.protocol) if ex.protocol in PROTOCOL_MODULES else None
    body = reader.request_body(ex) if ex.request_body else None
    final_bytes = reader.response_body(ex) if (ex.response_final or ex.response_body) else None
    request_model = response_model = response_id = None
    tokens: tuple[int | None, int | None] = (None, None)
    final: Any = None
    if mod is not None and body:
        try:
            request_model = mod.parse_request(body, path=ex.path, query=ex.query).model
        except PvisorError:  # a body that does not parse still gets its span
            request_model = None
    if final_bytes:
        try:
            final = orjson.loads(final_bytes)
        except orjson.JSONDecodeError:
            final = None
    if mod is not None and isinstance(final, dict):
        try:
            action = mod.response_to_action(final)
            response_model, tokens = action.model, token_counts(action.usage)
        except PvisorError:  # nor does a reply that does not read as one
            pass
        rid = final.get("id") or final.get("responseId")
        response_id = rid if isinstance(rid, str) else None
    operation = "count_tokens" if "count" in ex.path.lower() and "token" in ex.path.lower() else "chat"
    if mod is None:
        operation = "http"
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
                ("gen_ai.usage.input_tokens", tokens[0]),
                ("gen_ai.usage.output_tokens", tokens[1]),
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
                        ("gen_ai.input.messages", body.decode("utf-8", "replace") if body else None),
                        (
                            "gen_ai.output.messages",
                            final_bytes.decode("utf-8", "replace") if final_bytes else None,
                        ),
                    ]
                ),
            }
        ]
    return span


def run_request(
    reader: JournalReader, run: Any, with_content: bool = False, version: str = "unknown"
) -> dict[str, Any]:
    """The ``ExportTraceServiceRequest`` (as a dict) of one run (module docstring); ``version``:
    pvisor's, for ``service.version`` and the scope."""
    exchanges = reader.exchanges(run.id)
    trace = _id(run.id, 16)
    root = _id("run:" + run.id, 8)
    spans = []
    with progress.task(f"spans of run {run.id}", len(exchanges), progress.Unit.EXCHANGES) as task:
        for ex in exchanges:
            spans.append(_exchange_span(reader, ex, trace, root, with_content))
            task.advance()
    start = min((ex.started_ms for ex in exchanges), default=run.created_ms)
    end = max((ex.started_ms + (ex.ended_us or 0) / 1000 for ex in exchanges), default=start)
    agent = run.agent or "agent"
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
        out.write(orjson.dumps(doc) + b"\n")
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
