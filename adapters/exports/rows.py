"""One row per step of a journal run, for training pipelines (docs/exports.md "rows").

Row of step k (the chain rule's steps, as ``pvisor journal steps`` shows them):

- ``run``, ``step`` (k), ``agent``, ``protocol``, ``model`` (of the reply), ``exchange`` (the id
  of main-loop request k);
- ``lineage``: the run's (:func:`pvisor.journal.model.run_lineage`: mode, parent_run,
  boundary_step, pause_transition, workspace_snapshot, handoff_from_agent, handoff_to_agent),
  None for a run that derives from nothing; a step k up to ``boundary_step`` was served by
  playback (a handoff's: the parent's action translated into this agent's tools), not the model's;
- ``prefix``: the whole context the model answered with action k (a JSON object in the recorded
  protocol; with ``bodies=False``, None): request k's body as the agent sent it, or, for a live
  step that a continuation forwarded rewritten (flags ``boundary_prompt``,
  ``reasoning_stripped``; also a live model or an expanded ``previous_response_id``), the body
  forwarded, which is what the live model got;
- ``agent_prefix``: request k's body as the agent sent it when ``prefix`` is another (the
  forwarded one), else None (with ``bodies=False`` always None);
- the trainer's columns (:func:`pvisor.adapters.exports.chat_rows.trainer_columns`, of the
  request ``prefix`` holds, parsed in its protocol): ``prompt`` (Chat Completions messages),
  ``tools``, ``tools_dropped``, ``tools_absent`` (False: a request states its tools),
  ``completion`` (action k as an assistant message), ``usage`` (OTel GenAI counts) and
  ``usage_raw``, ``segment`` and ``segment_break`` (a step's ``compaction`` flag and a live step's
  ``boundary_prompt`` flag name a break);
- ``action``: ``{text, reasoning, tool_calls, stop_reason, model, usage}`` and ``observation``:
  ``{results, messages}``, in the shapes of ``pvisor.steps/v1`` (docs/steps.md; reasoning
  signatures only as ``signed``/``encrypted`` flags; each call with the id the agent sent it back
  under, which its results carry);
- ``flags`` (the step's), and ``digests``: ``prefix_sha256`` (of the exact bytes of ``prefix``),
  ``agent_prefix_sha256`` (of the agent's request bytes: those a prepared prefix of the journal
  run holds; the same as ``prefix_sha256`` unless a continuation rewrote the request),
  ``action_sha256`` and ``observation_sha256`` (of the compact JSON of ``action`` and
  ``observation`` with sorted keys), so that a row can be matched to a prepared prefix.

JSON Lines writes each row as one object. Parquet (pyarrow, the extra ``pvisor-replay[parquet]``)
has the same columns (:func:`parquet_schema`, :func:`parquet_row`): the objects whose shape
varies by protocol as JSON text, the messages as structs, so that every column has one Arrow type.

The formats ``rows`` and ``parquet`` are declared in :mod:`pvisor.replay.native_rows`, which
makes a native file's rows (the replay layer renders them).
"""

from __future__ import annotations

import hashlib
from typing import Any, BinaryIO, Iterable, Iterator

import orjson

from pvisor.adapters.exports.chat_rows import Segmenter, trainer_columns
from pvisor.adapters.journal_trajectory import LiveContextFlag, trajectory_from_journal, trajectory_to_json
from pvisor.adapters.protocols import get_protocol
from pvisor.core import progress
from pvisor.core.errors import BadInputError, UsageError
from pvisor.journal.model import Conversation, HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL, run_lineage
from pvisor.journal.reader import JournalReader
from pvisor.adapters.exports.shared import shared

#: rows gathered per Parquet row group
PARQUET_BATCH = 256


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _conversation(protocol: str, raw: bytes, path: str, query: str) -> Conversation | None:
    """The request the model answered, parsed; None when its body cannot be read (a damaged or
    cut-off capture: the row's prompt is then empty)."""
    try:
        return get_protocol(protocol).parse_request(raw, path=path, query=query)
    except BadInputError:
        return None


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def iter_rows(reader: JournalReader, run_id: str, *, bodies: bool = True) -> Iterator[dict[str, Any]]:
    """The rows of run ``run_id`` (module docstring), one step at a time. UsageError for an
    unknown run; IntegrityError for a damaged body."""
    run = reader.run(run_id)
    lineage = run_lineage(run)
    traj = trajectory_from_journal(reader, run.id, wire_ids=True)
    doc = trajectory_to_json(traj)
    by_id = {e.id: e for e in reader.exchanges(run.id)}
    segments = Segmenter()
    previous_flags: list[str] | None = None
    with progress.task(f"rows of run {run.id}", len(doc["steps"])) as task:
        for i, step in enumerate(doc["steps"]):
            ex = by_id[step["exchange"]]
            sent = reader.request_body(ex) or b""
            # a live step's context is what the live model got: the bytes forwarded when a
            # continuation rewrote the request (the agent's stay in agent_prefix)
            forwarded = reader.forwarded_body(ex) if ex.forwarded_body is not None else None
            raw = forwarded if forwarded is not None else sent
            prefix_sha = hashlib.sha256(raw).hexdigest()
            prefix: Any = None
            agent_prefix: Any = None
            if bodies:
                prefix = _json(raw)
                agent_prefix = _json(sent) if forwarded is not None else None
            trainer = trainer_columns(
                _conversation(ex.protocol or doc["protocol"], raw, ex.path, ex.query),
                traj.steps[i].action,
                ex.protocol or doc["protocol"],
                segments,
                compacted=previous_flags is not None and "compaction" in previous_flags,
                boundary=LiveContextFlag.BOUNDARY_PROMPT.value in step["flags"],
            )
            previous_flags = step["flags"]
            yield {
                "run": run.id,
                "step": step["n"],
                "agent": run.agent,
                "protocol": doc["protocol"],
                "model": step["action"]["model"] or traj.model,
                "exchange": ex.id,
                "lineage": lineage,
                "prefix": prefix,
                "agent_prefix": agent_prefix,
                **trainer,
                "action": step["action"],
                "observation": step["observation"],
                "flags": step["flags"],
                "digests": {
                    "prefix_sha256": prefix_sha,
                    "agent_prefix_sha256": hashlib.sha256(sent).hexdigest()
                    if forwarded is not None
                    else prefix_sha,
                    "action_sha256": _digest(step["action"]),
                    "observation_sha256": _digest(step["observation"]),
                },
            }
            task.advance()


def write_jsonl(reader: JournalReader, run_id: str, out: BinaryIO, *, bodies: bool = True) -> int:
    """Write the rows as JSON Lines; returns how many."""
    n = 0
    for row in iter_rows(reader, run_id, bodies=bodies):
        out.write(orjson.dumps(shared(row)) + b"\n")  # docs/exports.md "Secrets"
        n += 1
    return n


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _parquet_message(m: dict[str, Any]) -> dict[str, Any]:
    """A rows message as its Parquet struct: ``tool_calls`` JSON text (null when none)."""
    return {
        "role": m["role"],
        "content": m.get("content"),
        "reasoning_content": m.get("reasoning_content"),
        "tool_call_id": m.get("tool_call_id"),
        "tool_calls": _json_text(m.get("tool_calls")),
    }


def parquet_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row (:func:`iter_rows`, or a native file's) as the columns of :func:`parquet_schema`:
    the objects whose shape varies by protocol as JSON text, the messages as structs."""
    flat = dict(row)
    for key in ("prefix", "agent_prefix", "action", "observation", "flags", "usage_raw"):
        flat[key] = _json_text(row.get(key))
    flat["prompt"] = [_parquet_message(m) for m in row["prompt"]]
    flat["completion"] = _parquet_message(row["completion"])
    flat["tools"] = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "parameters": _json_text(t["function"]["parameters"]),
        }
        for t in row["tools"]
    ]
    return flat


def parquet_schema() -> Any:
    """The Arrow schema of the rows (docs/exports.md "rows and parquet"): one type a column."""
    import pyarrow as pa  # the optional parquet extra

    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning_content", pa.string()),
            ("tool_call_id", pa.string()),
            ("tool_calls", pa.string()),
        ]
    )
    tool = pa.struct([("name", pa.string()), ("description", pa.string()), ("parameters", pa.string())])
    usage = pa.struct(
        [
            ("input_tokens", pa.int64()),
            ("cached_input_tokens", pa.int64()),
            ("cache_creation_input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),
        ]
    )
    return pa.schema(
        [
            ("run", pa.string()),
            ("step", pa.int64()),
            ("agent", pa.string()),
            ("protocol", pa.string()),
            ("model", pa.string()),
            ("exchange", pa.string()),
            (
                "lineage",
                pa.struct(
                    [
                        ("mode", pa.string()),
                        ("parent_run", pa.string()),
                        ("boundary_step", pa.int64()),
                        ("pause_transition", pa.int64()),
                        ("workspace_snapshot", pa.string()),
                        (HANDOFF_FROM_LABEL, pa.string()),
                        (HANDOFF_TO_LABEL, pa.string()),
                    ]
                ),
            ),
            ("prefix", pa.string()),
            ("agent_prefix", pa.string()),
            ("prompt", pa.list_(message)),
            ("tools", pa.list_(tool)),
            ("tools_dropped", pa.list_(pa.struct([("name", pa.string()), ("kind", pa.string())]))),
            ("tools_absent", pa.bool_()),
            ("completion", message),
            ("usage", usage),
            ("usage_raw", pa.string()),
            ("segment", pa.int64()),
            ("segment_break", pa.string()),
            ("action", pa.string()),
            ("observation", pa.string()),
            ("flags", pa.string()),
            (
                "digests",
                pa.struct(
                    [
                        ("prefix_sha256", pa.string()),
                        ("agent_prefix_sha256", pa.string()),
                        ("action_sha256", pa.string()),
                        ("observation_sha256", pa.string()),
                    ]
                ),
            ),
        ]
    )


def need_pyarrow() -> None:
    """UsageError (exit 2) naming the extra when pyarrow is not installed."""
    try:
        import pyarrow  # noqa: F401  (write_parquet_rows uses it)
    except ImportError:
        raise UsageError(
            "--format parquet needs pyarrow: pip install '.[parquet]' in a clone of pvisor "
            "(or --format rows for JSON Lines)"
        ) from None


def write_parquet(reader: JournalReader, run_id: str, out: BinaryIO, *, bodies: bool = True) -> int:
    """Write the rows as Parquet (row groups of :data:`PARQUET_BATCH`); returns how many.
    UsageError (exit 2) naming the extra when pyarrow is not installed."""
    need_pyarrow()
    return write_parquet_rows(
        out,
        parquet_schema(),
        (parquet_row(shared(r)) for r in iter_rows(reader, run_id, bodies=bodies)),
    )


def write_parquet_rows(
    out: BinaryIO, schema: Any, rows: Iterable[dict[str, Any]], batch_size: int = PARQUET_BATCH
) -> int:
    """Write ``rows`` (dicts of ``schema``'s columns) to ``out`` as Parquet, in row groups of
    ``batch_size``; a file of no rows still has the schema. Returns how many. Needs pyarrow
    (the caller names the extra when it is missing)."""
    import pyarrow as pa  # the optional parquet extra
    import pyarrow.parquet as pq  # the optional parquet extra

    n = 0
    batch: list[dict[str, Any]] = []
    with pq.ParquetWriter(out, schema) as writer:
        for row in rows:
            batch.append(row)
            n += 1
            if len(batch) == batch_size:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return n
