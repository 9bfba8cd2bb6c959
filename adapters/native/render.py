"""Documents made from a native trajectory: the ``pvisor trajectory show --json`` document
(schema :data:`NATIVE_SCHEMA`) and Harbor's Agent Trajectory Interchange Format v1.7.

ATIF rules (source: harbor ``rfcs/0001-trajectory-format.md`` v1.7, summarised in
docs/native.md): root ``schema_version`` ``"ATIF-v1.7"``, ``session_id``, ``trajectory_id``
(a subagent episode's id, with ``extra.episode``, when the document is a subagent's),
``agent{name, version, model_name, tool_definitions?, extra?}`` (the tools in OpenAI's
function-calling schema, the others in ``extra.tools_dropped``: :func:`atif_tools`), ``steps[]``,
``final_metrics``, ``extra``. A step has ``step_id`` (from 1), ``source`` (``system``/``user``/``agent``),
``message``; agent steps add ``model_name``, ``reasoning_content``, ``tool_calls[{tool_call_id,
function_name, arguments (object), extra}]`` and ``observation{results[{source_call_id,
content, extra}]}``: one ATIF agent step per model inference, its observation on the same
step, which is our step (A_i with O_i). ATIF ``arguments`` is an object, so the exact argument
string is kept in the call's ``extra.arguments_raw`` (and ``arguments`` is ``{}`` when it is not
a JSON object). A call with no id (a Gemini reply the agent never sent back) gets
``call-STEP-I`` and ``extra.made_up_id``: ATIF requires one. A result's ``source_call_id`` is
the id it carries when that names a tool call of its step; else (a lost action: its call is not
in the file) the id is in the result's ``extra.call_id``, since Harbor's validator refuses a
``source_call_id`` that names no call of its step. Result content that is not a string is given
as its text, the original in ``extra.content_raw``. Observation messages (a later user prompt)
become user steps. A trajectory with no system prompt, task or step is refused (BadInputError):
ATIF needs at least one step.

Two ways to make each document: :func:`to_json` / :func:`to_atif` return it as a dict (tests,
callers that want the whole value); :func:`write_json` / :func:`write_atif` write the same
document to a binary stream as it is made, one step at a time, for ``pvisor trajectory show
--json`` and ``export``: memory holds one step, not the document (issue 6, "Scale"). The
streamed bytes are exactly ``orjson.dumps(doc, OPT_INDENT_2 | OPT_NON_STR_KEYS) + b"\n"`` of
the dict form (tests/test_native_cli.py checks it on the corpus).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import orjson

from pvisor.adapters.jsonio import dumps
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.core import progress
from pvisor.core.errors import BadInputError
from pvisor.journal.model import (
    Conversation,
    Message,
    Step,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
)
from pvisor.adapters.exports.shared import shared

from .assembly import text_of
from .base import NativeResult

NATIVE_SCHEMA = "pvisor.native-trajectory/v1"
ATIF_VERSION = "ATIF-v1.7"

#: orjson options of every document written (``--json``, ``export``)
JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS


def _call(c: ToolCall) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "kind": c.kind,
        "arguments_raw": c.arguments_raw,
        "arguments": c.arguments,
    }


def _result(r: ToolResult) -> dict[str, Any]:
    interrupted = isinstance(r.raw, dict) and r.raw.get("interrupted") is True
    return {"call_id": r.call_id, "is_error": r.is_error, "content": r.content, "interrupted": interrupted}


def _message(m: Message) -> dict[str, Any]:
    return {"role": m.role, "text": "".join(p.text for p in m.parts if isinstance(p, TextPart))}


# --------------------------------------------------------------------------- streaming


class Items:
    """A field value written item by item: ``items`` is iterated once, while writing, each
    item dumped on its own (a list of them is never made)."""

    __slots__ = ("items",)

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


class Later:
    """A field value computed when the writer reaches it (after the fields before it were
    written: ATIF ``final_metrics`` needs the number of steps written)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def dump_indented(value: Any) -> bytes:
    """``orjson.dumps(value, JSON_OPTIONS)`` (:func:`pvisor.adapters.jsonio.dumps`: a value
    nested deeper than orjson writes is written by the standard library in the same layout).
    Raises BadInputError (exit 65) past the interpreter's recursion limit."""
    try:
        return dumps(value, indent=True)
    except ValueError:
        raise BadInputError("a value nested too deep to write as JSON") from None


def write_all(out: BinaryIO, data: bytes) -> None:
    """Write all of ``data`` to ``out``. A BufferedWriter given more than its buffer returns
    a short count instead of raising when the pipe's reader has gone (``| head``), and the
    rest would be lost silently: writing the rest raises BrokenPipeError (exit 141)."""
    view = memoryview(data)
    while view:
        n = out.write(view)
        if n is None:  # a raw stream that would block; ours are blocking
            raise BlockingIOError("output would block")
        view = view[n:]


def write_document(out: BinaryIO, fields: Iterable[tuple[str, Any]]) -> None:
    """Write a JSON object to ``out`` field by field, bytes identical to
    ``orjson.dumps(dict(fields), JSON_OPTIONS) + b"\n"``. ``fields`` is iterated lazily; a
    value may be :class:`Items` (a list written item by item) or :class:`Later` (computed
    when reached). Indenting a value nested one level is replacing each ``b"\n"`` of its own
    dump by ``b"\n"`` plus the indent: JSON strings never hold a raw newline."""
    first = True
    for key, value in fields:
        head = (b"{\n  " if first else b",\n  ") + orjson.dumps(key) + b": "
        first = False
        if isinstance(value, Later):
            value = value.make()
        # an export meant to be shared: key-shaped tokens replaced (docs/exports.md "Secrets")
        if not isinstance(value, Items):
            write_all(out, head + dump_indented(shared(value)).replace(b"\n", b"\n  "))
            continue
        n = 0
        for item in value.items:
            item = dump_indented(shared(item)).replace(b"\n", b"\n    ")
            write_all(out, (head + b"[\n    " if n == 0 else b",\n    ") + item)
            n += 1
        write_all(out, head + b"[]" if n == 0 else b"\n  ]")
    write_all(out, b"{}\n" if first else b"\n}\n")


# --------------------------------------------------------------------------- pvisor.native-trajectory/v1


def _json_step(s: Step) -> dict[str, Any]:
    return {
        "n": s.n,
        "flags": s.flags,
        "action": {
            "text": s.action.text,
            "reasoning": [r.text for r in s.action.reasoning],
            "tool_calls": [_call(c) for c in s.action.tool_calls],
            "model": s.action.model,
            "usage": s.action.usage,
            "stop_reason": s.action.stop_reason,
        },
        "observation": {
            "results": [_result(r) for r in s.observation.results],
            "messages": [_message(m) for m in s.observation.messages],
        },
    }


def _each(steps: Iterable[Step]) -> Iterator[Step]:
    """``steps``, each counted as done in the open progress task once the consumer has it."""
    task = progress.current()
    for s in steps:
        yield s
        task.advance()


def _json_fields(result: NativeResult, agent: str) -> Iterator[tuple[str, Any]]:
    t = result.trajectory
    yield "schema", NATIVE_SCHEMA
    yield "agent", agent
    yield "profile", result.profile.name
    yield "source", result.diagnostics.path
    yield "task", t.task
    yield "system", t.system
    yield (
        "tools",
        None
        if t.tools is None
        else [{"name": x.name, "description": x.description, "parameters": x.parameters} for x in t.tools],
    )
    yield "model", t.model
    yield "steps", Items(_json_step(s) for s in _each(t.steps))  # t.steps iterated once
    yield "left_out", Items({"where": lo.where, "kind": lo.kind, "reason": lo.reason} for lo in t.left_out)
    # after the steps: warnings are complete once every step was built
    yield (
        "warnings",
        Items({"code": w.code, "where": w.where, "message": w.message} for w in result.diagnostics.warnings),
    )
    yield "meta", t.meta


def to_json(result: NativeResult, agent: str) -> dict[str, Any]:
    """The ``--json`` document: schema, agent, profile, source, task, system/tools (null when
    not stored), model, steps (action text, reasoning texts, tool calls with exact
    ``arguments_raw``, observation results and messages, flags), left_out, warnings, meta."""
    return {k: list(v.items) if isinstance(v, Items) else v for k, v in _json_fields(result, agent)}


def write_json(result: NativeResult, agent: str, out: BinaryIO) -> None:
    """Write :func:`to_json`'s document to ``out`` (binary), one step at a time."""
    with progress.task("writing steps", len(result.trajectory.steps)):
        write_document(out, _json_fields(result, agent))


# --------------------------------------------------------------------------- ATIF v1.7


#: ATIF ``metrics`` of a step from its :class:`TokenUsage`: (ATIF name, TokenUsage field)
_METRICS = (
    ("prompt_tokens", "input_tokens"),
    ("completion_tokens", "output_tokens"),
    ("cached_tokens", "cached_input_tokens"),
)
#: the counts ATIF has no field for, in ``metrics.extra`` under the rows' names
_METRICS_EXTRA = ("cache_creation_input_tokens", "reasoning_tokens")


def atif_metrics(usage: TokenUsage) -> dict[str, Any] | None:
    """The ATIF v1.7 ``metrics`` of a step whose reply's usage reads as ``usage``:
    ``prompt_tokens`` (every input token, cached ones included), ``completion_tokens`` (every
    output token, reasoning included), ``cached_tokens`` (cache reads, a part of
    ``prompt_tokens``), ``extra.cache_creation_input_tokens`` and ``extra.reasoning_tokens``;
    a count the reply did not give is absent; None when it gave none."""
    counts = usage.as_dict()
    metrics: dict[str, Any] = {name: counts[f] for name, f in _METRICS if counts[f] is not None}
    extra = {f: counts[f] for f in _METRICS_EXTRA if counts[f] is not None}
    if extra:
        metrics["extra"] = extra
    return metrics or None


def iso_time(ms: float) -> str:
    """An epoch time in milliseconds as ISO 8601 UTC to the millisecond
    (``2026-12-06T04:01:45.123Z``), ATIF's ``timestamp``."""
    stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Totals:
    """The ``final_metrics`` sums of the agent steps' ``metrics`` written so far."""

    __slots__ = ("sums",)

    def __init__(self) -> None:
        self.sums: dict[str, int] = {}

    def add(self, metrics: dict[str, Any] | None) -> None:
        for k, v in (metrics or {}).items():
            if k == "extra":
                self.add({f"extra.{x}": n for x, n in v.items()})
            else:
                self.sums[k] = self.sums.get(k, 0) + v

    def final(self, steps: int) -> dict[str, Any]:
        """``final_metrics``: ``total_prompt_tokens``, ``total_completion_tokens``,
        ``total_cached_tokens`` (each the sum over the steps that give it; absent when none
        does), ``total_steps``, and ``extra.total_cache_creation_input_tokens`` and
        ``extra.total_reasoning_tokens`` likewise."""
        out: dict[str, Any] = {f"total_{name}": self.sums[name] for name, _ in _METRICS if name in self.sums}
        out["total_steps"] = steps
        extra = {f"total_{f}": self.sums[f"extra.{f}"] for f in _METRICS_EXTRA if f"extra.{f}" in self.sums}
        if extra:
            out["extra"] = extra
        return out


def _atif_agent_step(s: Step, metrics: dict[str, Any] | None) -> dict[str, Any]:
    a = s.action
    step: dict[str, Any] = {"source": "agent", "message": a.text}
    if a.model:
        step["model_name"] = a.model
    reasoning = "\n\n".join(r.text for r in a.reasoning if r.text)
    if reasoning:
        step["reasoning_content"] = reasoning
    if a.tool_calls:
        calls = []
        for i, c in enumerate(a.tool_calls):
            call: dict[str, Any] = {
                "tool_call_id": c.id or f"call-{s.n}-{i + 1}",
                "function_name": c.name,
                "arguments": c.arguments if isinstance(c.arguments, dict) else {},
                "extra": {"arguments_raw": c.arguments_raw, "kind": c.kind},
            }
            if c.id is None:  # ATIF requires an id: none was sent, none answers a result
                call["extra"]["made_up_id"] = True
            calls.append(call)
        step["tool_calls"] = calls
    # Harbor refuses a source_call_id that names no tool call of its step
    ids = {c["tool_call_id"] for c in step.get("tool_calls", ())}
    if s.observation.results:
        results = []
        for r in s.observation.results:
            item: dict[str, Any] = {
                "content": r.content if isinstance(r.content, str) else text_of(r.content)
            }
            extra: dict[str, Any] = {}
            if r.call_id in ids:
                item["source_call_id"] = r.call_id
            elif r.call_id is not None:  # it answers a call this step lacks (a lost action)
                extra["call_id"] = r.call_id
            if not isinstance(r.content, str):
                extra["content_raw"] = r.content
            if r.is_error is not None:
                extra["is_error"] = r.is_error
            if isinstance(r.raw, dict) and r.raw.get("interrupted") is True:
                extra["interrupted"] = True
            if extra:
                item["extra"] = extra
            results.append(item)
        step["observation"] = {"results": results}
    if metrics is not None:
        step["metrics"] = metrics
    extra = {"pvisor_step": s.n}
    if s.flags:
        extra["flags"] = s.flags
    if a.usage is not None:
        extra["usage"] = a.usage
    step["extra"] = extra
    return step


def _atif_steps(
    t: Trajectory,
    count: list[int],
    totals: _Totals,
    usage_of: Callable[[Any], TokenUsage],
    times: Sequence[str | None],
    details: Sequence[dict[str, Any]] = (),
) -> Iterator[dict[str, Any]]:
    """ATIF steps numbered from 1 (system, task, then per step its agent step and a user step
    per observation message); ``count[0]`` is the number given so far, ``totals`` the sums of
    their ``metrics`` (``usage_of``: a step's ``Action.usage`` as :class:`TokenUsage`).
    ``times[j]``: step j+1's ``timestamp`` (ISO 8601), else its ``Step.time_ms`` (a native
    file's record time), else none; the system and task steps take step 1's, an observation
    message's user step the next step's in ``times`` (when it was sent), else its own step's.
    ``details``: a journal
    run's step details (``Trajectory.meta["steps"]``), whose ``forwarded`` says what a live step's
    model got instead of the agent's request: the user text it added (the boundary user prompt)
    is a user step before the first agent step whose context held it, and the agent step's
    ``extra.forwarded`` gives the digests of both requests."""

    def numbered(step: dict[str, Any], timestamp: str | None) -> dict[str, Any]:
        count[0] += 1
        return {"step_id": count[0], **({"timestamp": timestamp} if timestamp else {}), **step}

    def time_of(j: int) -> str | None:
        return times[j] if j < len(times) else None

    # the first step's time for the system and task steps before it (a lazy trajectory builds
    # step 1 here and again when iterated: one step, not the file)
    first = time_of(0) or (_step_time(t.steps[0]) if len(t.steps) else None)
    if t.system is not None:
        yield numbered({"source": "system", "message": t.system}, first)
    if t.task is not None:
        yield numbered({"source": "user", "message": t.task}, first)
    added: set[str] = set()
    for j, s in enumerate(_each(t.steps)):  # iterated once
        own = time_of(j) or _step_time(s)
        forwarded = details[j].get("forwarded") if j < len(details) else None
        metrics = atif_metrics(usage_of(s.action.usage))
        totals.add(metrics)
        step = _atif_agent_step(s, metrics)
        if forwarded is not None:
            for text in forwarded["added_user_text"]:
                if text not in added:  # once: every later live request holds it again
                    added.add(text)
                    user = {"source": "user", "message": text, "extra": {"pvisor_added": True}}
                    yield numbered(user, own)
            step["extra"]["forwarded"] = forwarded
        yield numbered(step, own)
        for m in s.observation.messages:
            yield numbered({"source": "user", "message": _message(m)["text"]}, time_of(j + 1) or own)


def _step_time(s: Step) -> str | None:
    return None if s.time_ms is None else iso_time(s.time_ms)


def _atif_fields(
    result: NativeResult, agent: str, count: list[int] | None = None
) -> Iterator[tuple[str, Any]]:
    from . import get_adapter  # the package's registry, which imports this module's users

    t = result.trajectory
    return atif_fields(
        t,
        agent,
        lambda: {
            "pvisor_profile": result.profile.name,
            "source": result.diagnostics.path,
            "left_out": len(t.left_out),
            "warnings": [str(w) for w in result.diagnostics.warnings],
            **({"episode": t.meta["episode"]} if (t.meta or {}).get("episode") else {}),
        },
        result.diagnostics.path,
        get_adapter(result.profile.adapter).normalised_usage,
        count=count,
    )


def atif_fields(
    t: Trajectory,
    agent: str,
    extra: Callable[[], dict[str, Any]],
    source: str,
    usage_of: Callable[[Any], TokenUsage],
    times: Sequence[str | None] = (),
    details: Sequence[dict[str, Any]] = (),
    protocol: str | None = None,
    count: list[int] | None = None,
) -> Iterator[tuple[str, Any]]:
    """The fields of the ATIF v1.7 document of ``t`` (module docstring), in order, for
    :func:`write_document`; ``extra()`` gives the root ``extra`` once every step was written (a
    native file's profile and warnings; a journal run's id: pvisor.adapters.exports);
    ``usage_of``: a step's ``Action.usage`` as :class:`TokenUsage` (the native adapter's or the
    protocol's ``normalised_usage``), for ``metrics`` and ``final_metrics``; ``times``: each
    step's ``timestamp``; ``details``: a journal run's step details (:func:`_atif_steps`);
    ``protocol``: the wire protocol ``t.tools`` were sent in (a journal run's), None for a
    native file's tools (read as Chat tools: :func:`atif_tools`); ``count``: a one-item list
    that holds the number of ATIF steps written so far (``final_metrics.total_steps`` once the
    steps are written), for a caller that reports it.

    Raises BadInputError (exit 65) naming ``source`` (the file, or ``run ID``), before the first
    field, when ``t`` has no system prompt, task or step: ATIF requires at least one step
    (Harbor's validator refuses an empty ``steps``), and a step made up would say what did not
    happen."""
    if t.system is None and t.task is None and not t.steps:
        raise BadInputError(
            f"{source}: no step to export as ATIF: it holds no system prompt, task or action, "
            "and an ATIF trajectory needs at least one step"
        )
    meta = t.meta or {}
    count = count if count is not None else [0]
    agent_info: dict[str, Any] = {
        # an ATIF source keeps the name it gives its agent (terminus-2, not pvisor's generic atif)
        "name": str(meta.get("agent_name") or agent),
        "version": str(meta.get("agent_version") or meta.get("cli_version") or "unknown"),
        "model_name": t.model,
    }
    if t.tools is not None:
        agent_info["tool_definitions"], dropped = atif_tools(t.tools, protocol)
        if dropped:
            agent_info["extra"] = {"tools_dropped": dropped}
    yield "schema_version", ATIF_VERSION
    yield "session_id", str(meta.get("sessionId") or meta.get("session") or meta.get("id") or "")
    episode = meta.get("episode")
    if isinstance(episode, dict):  # a subagent's own steps: the document is that episode's
        yield "trajectory_id", str(episode.get("id"))
    yield "agent", agent_info
    totals = _Totals()
    yield "steps", Items(_atif_steps(t, count, totals, usage_of, times, details))
    yield "final_metrics", Later(lambda: totals.final(count[0]))
    yield "extra", Later(extra)


def atif_tools(tools: Iterable[ToolSpec], protocol: str | None = None) -> tuple[list[dict], list[dict]]:
    """``(tool_definitions, tools_dropped)``: the function tools in OpenAI's function-calling
    schema, ``{type: "function", function: {name, description, parameters}}``, as ATIF's
    ``agent.tool_definitions`` asks (Harbor's RFC: "Each element follows OpenAI's function
    calling schema"), made by the rows' path (:func:`pvisor.adapters.exports.chat_rows.
    chat_prompt`: the transcoder to ``openai-chat``) from the tools as ``protocol`` sent them
    (None: a native file's, whose definitions carry no protocol's shape but their ``type``);
    ``[{name, kind}]`` of the tools that are not functions (server tools, namespaces, freeform
    tools), which have no such schema."""
    # the exports package imports this module: imported when called
    from pvisor.adapters.exports.chat_rows import CHAT, chat_prompt

    conv = Conversation(protocol=protocol or CHAT, tools=list(tools))
    _prompt, defs, dropped = chat_prompt(conv)
    return defs, dropped


def to_atif(result: NativeResult, agent: str) -> dict[str, Any]:
    """The trajectory as an ATIF v1.7 document (rules in the module docstring)."""
    doc: dict[str, Any] = {}
    for k, v in _atif_fields(result, agent):
        doc[k] = list(v.items) if isinstance(v, Items) else v.make() if isinstance(v, Later) else v
    return doc


def write_atif(result: NativeResult, agent: str, out: BinaryIO) -> int:
    """Write :func:`to_atif`'s document to ``out`` (binary), one step at a time; returns the
    number of ATIF steps (``final_metrics.total_steps``: the system, task and user steps too)."""
    count = [0]
    with progress.task("writing steps", len(result.trajectory.steps)):
        write_document(out, _atif_fields(result, agent, count))
    return count[0]
