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
  ``tools_unoffered`` (tools the completion calls that ``tools`` lacks),
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
varies by protocol as JSON text (and each tool's ``parameters``), the messages, their calls and
the tools as structs, so that every column has one Arrow type.

The formats ``rows`` and ``parquet`` are declared in :mod:`pvisor.replay.native_rows`, which
makes a native file's rows (the replay layer renders them).
"""

from __future__ import annotations

import hashlib
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import orjson

from pvisor.adapters.exports.chat_rows import GAP_FLAGS, Segmenter, trainer_columns
from pvisor.adapters.chains import Classification, Request, classify_run
from pvisor.adapters.journal_trajectory import LiveContextFlag, build_trajectory, trajectory_to_json
from pvisor.adapters.protocols import get_protocol
from pvisor.core import progress
from pvisor.core.errors import BadInputError, UsageError
from pvisor.journal.model import Conversation, HANDOFF_FROM_LABEL, Message, HANDOFF_TO_LABEL, run_lineage
from pvisor.journal.reader import JournalReader
from pvisor.adapters.exports.shared import shared

#: rows gathered per Parquet row group, at most
PARQUET_BATCH = 256
#: text gathered per Parquet row group, at most (about: :func:`_text_size`): a long run's rows
#: each hold the whole prompt, so 256 of them can be gigabytes in memory
PARQUET_BATCH_BYTES = 16 * 2**20


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


#: the flag of a row whose prompt is partial: part of the context lives on the server and the
#: journal does not hold it (docs/exports.md "rows and parquet")
PROMPT_INCOMPLETE = "prompt_incomplete"


def _requests(c: Classification) -> dict[str, Request]:
    """The chain rule's request of each exchange of the main chain, by exchange id."""
    return {r.id: r for s in (c.main.slots if c.main is not None else []) for r in s.requests}


def _server_held(protocol: str, conv: Conversation) -> bool:
    # a protocol module that can leave part of the prefix on the server says so (Responses)
    held = getattr(get_protocol(protocol), "server_held_prefix", None)
    return held is not None and held(conv) is not None


def _expand(
    conv: Conversation, req: Request | None, expanded: dict[str, list[Message]], partial: set[str]
) -> tuple[Conversation, bool]:
    """``(conversation, complete)`` of a request whose prefix is partly on the server: the chain
    rule's expansion (docs/steps.md: the messages of the request whose response
    ``previous_response_id`` names, that response's reply, then the body's own), from
    ``expanded`` (exchange id to the whole messages of the row before) when it holds the base,
    else parsed again; ``complete`` False when the chain rule found no such response in the run
    (or the server holds items by reference: the conversation is the body's alone) or when the
    base's own prompt was partial (``partial``: exchange ids of such rows)."""
    if req is None or req.base is None or not conv.params.get("previous_response_id"):
        return conv, False
    base = expanded.get(req.base.id)
    if base is None:
        base = req.base.conversation().messages
    conv.messages = [*base, *req.base_reply, *conv.messages]
    conv.params = {k: v for k, v in conv.params.items() if k != "previous_response_id"}
    return conv, req.base.id not in partial and not _server_held(conv.protocol, conv)


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


#: exchanges named in the warning of unreadable requests (the rest counted)
UNREADABLE_SHOWN = 5


def _unreadable(run: str, c: Classification) -> str | None:
    """The warning for the requests the chain rule left out because their bodies do not parse
    (a lone UTF-16 surrogate escape, which Node writes for a cut emoji; a cut-off body): the
    rows cannot hold those steps nor any after them in that chain. None when there is none."""
    bad = [lo for lo in c.left_out if lo.kind == "unparsable"]
    if not bad:
        return None
    shown = ", ".join(lo.exchange for lo in bad[:UNREADABLE_SHOWN])
    more = f" and {len(bad) - UNREADABLE_SHOWN} more" if len(bad) > UNREADABLE_SHOWN else ""
    return (
        f"run {run}: {len(bad)} request(s) left out of the rows, their bodies do not parse: "
        f"{shown}{more} (first: {bad[0].reason}; see pvisor journal steps {run})"
    )


def iter_rows(
    reader: JournalReader, run_id: str, *, bodies: bool = True, warn: Callable[[str], None] | None = None
) -> Iterator[dict[str, Any]]:
    """The rows of run ``run_id`` (module docstring), one step at a time. UsageError for an
    unknown run; IntegrityError for a damaged body. ``warn`` is handed one sentence, before the
    first row, when requests are left out because their bodies do not parse."""
    run = reader.run(run_id)
    lineage = run_lineage(run)
    classified = classify_run(reader, run.id)
    unreadable = _unreadable(run.id, classified)
    if unreadable is not None and warn is not None:
        warn(unreadable)
    traj = build_trajectory(reader, classified, wire_ids=True)
    doc = trajectory_to_json(traj)
    by_id = {e.id: e for e in reader.exchanges(run.id)}
    requests = _requests(classified)
    expanded: dict[str, list[Message]] = {}
    partial: set[str] = set()
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
            conv = _conversation(ex.protocol or doc["protocol"], raw, ex.path, ex.query)
            flags = step["flags"]
            if conv is not None and _server_held(conv.protocol, conv):
                conv, complete = _expand(conv, requests.get(ex.id), expanded, partial)
                if not complete:
                    flags = [*flags, PROMPT_INCOMPLETE]
                    partial.add(ex.id)
            # the base of a chained request is nearly always the step before: only its messages
            # are kept (every step's would grow with the square of the run's length)
            expanded = {ex.id: conv.messages} if conv is not None else {}
            trainer = trainer_columns(
                conv,
                traj.steps[i].action,
                ex.protocol or doc["protocol"],
                segments,
                compacted=previous_flags is not None and "compaction" in previous_flags,
                boundary=LiveContextFlag.BOUNDARY_PROMPT.value in step["flags"],
                gap=not GAP_FLAGS.isdisjoint(step["flags"]),
                incomplete=PROMPT_INCOMPLETE in flags,
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
                "flags": flags,
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
    """A rows message as its Parquet struct: ``tool_calls`` the list of call structs (``{id,
    type, function: {name, arguments}}``, ``arguments`` a string; null when none), as a chat
    template loops over them."""
    return {
        "role": m["role"],
        "content": m.get("content"),
        "reasoning_content": m.get("reasoning_content"),
        "tool_call_id": m.get("tool_call_id"),
        "tool_calls": m.get("tool_calls"),
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
            "type": t["type"],
            "function": {**t["function"], "parameters": _json_text(t["function"]["parameters"])},
        }
        for t in row["tools"]
    ]
    return flat


def parquet_schema() -> Any:
    """The Arrow schema of the rows (docs/exports.md "rows and parquet"): one type a column."""
    import pyarrow as pa  # the optional parquet extra

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning_content", pa.string()),
            ("tool_call_id", pa.string()),
            ("tool_calls", pa.list_(call)),
        ]
    )
    # parameters as JSON text: the schemas differ from tool to tool, no one struct holds them
    tool_function = pa.struct(
        [("name", pa.string()), ("description", pa.string()), ("parameters", pa.string())]
    )
    tool = pa.struct([("type", pa.string()), ("function", tool_function)])
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
            ("tools_unoffered", pa.list_(pa.string())),
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
    """Write the rows as Parquet (row groups of :data:`PARQUET_BATCH` rows or
    :data:`PARQUET_BATCH_BYTES` of text); returns how many.
    UsageError (exit 2) naming the extra when pyarrow is not installed."""
    need_pyarrow()
    return write_parquet_rows(
        out,
        parquet_schema(),
        (parquet_row(shared(r)) for r in iter_rows(reader, run_id, bodies=bodies)),
    )


def _text_size(value: Any) -> int:
    """About how many bytes ``value`` (a Parquet row or part of one) holds: its strings'
    lengths, 8 for any other scalar."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    return 8


def write_parquet_rows(
    out: BinaryIO,
    schema: Any,
    rows: Iterable[dict[str, Any]],
    batch_size: int = PARQUET_BATCH,
    batch_bytes: int = PARQUET_BATCH_BYTES,
) -> int:
    """Write ``rows`` (dicts of ``schema``'s columns) to ``out`` as Parquet, in row groups of
    ``batch_size`` rows or fewer: a group is written once its rows hold ``batch_bytes`` of text
    (:func:`_text_size`; a row larger than that is a group of its own). A file of no rows still
    has the schema. Returns how many. Needs pyarrow (the caller names the extra when it is
    missing)."""
    import pyarrow as pa  # the optional parquet extra
    import pyarrow.parquet as pq  # the optional parquet extra

    n = 0
    size = 0
    batch: list[dict[str, Any]] = []
    with pq.ParquetWriter(out, schema) as writer:
        for row in rows:
            batch.append(row)
            n += 1
            size += _text_size(row)
            if len(batch) == batch_size or size >= batch_bytes:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch, size = [], 0
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return n
