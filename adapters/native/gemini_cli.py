"""Gemini CLI chat recordings (``~/.gemini/tmp/<project>/chats/session-*.jsonl``, and the older
single-JSON ``session-*.json``) into a Trajectory.

Format rules (sources: docs/native.md, from google-gemini/gemini-cli
packages/core/src/services/chatRecordingService.ts and chatRecordingTypes.ts; corpus files
``real-0.61.0_single-then-resume.jsonl``, ``agent-sessions_*`` fixtures,
``harbor_rfc_gemini-cli-trajectory.json``):

- JSONL: the first line holds the ConversationRecord metadata (``sessionId``, ``projectHash``,
  ``startTime``, ``kind``); then MessageRecord lines (``id``, ``type``, ``content``, ...),
  ``{"$set": {...}}`` metadata updates and ``{"$rewindTo": id}``. A message whose ``id`` was
  seen before **replaces** the earlier one in its place (the loader's ``Map.set``);
  ``$rewindTo`` drops that message and every later one. Order is the map's order, never the
  timestamp. A ``$set.messages`` snapshot that drops messages of the file and holds others is
  Gemini CLI's chat compression (it writes no record of its own): a compaction after the step
  before it, flagged ``compaction``, not rebuilt (:attr:`Compaction.rebuilt` False: a prefix
  after it is refused). ``$set.messages`` (a history snapshot Gemini CLI writes at start and resume) is
  not a message record: its user text before the first message line is the task context,
  the rest is left out. A file with none of these records (metadata, message, ``$set``,
  ``$rewindTo``) is not a session: BadInputError (exit 65) naming the file and first line.
- A repeated ``id`` is an update (Gemini CLI rewrites a message as it streams and as its
  calls finish): no warning. A record equal to the one it replaces (same length, same value)
  is a line written twice: ``duplicate_record``, the copy left out.
- Legacy JSON: the whole ConversationRecord in one document, ``messages[]``; legacy
  messages may have ``type: "model"`` and ``parts``. A document that is not JSON, or not an
  object with a ``messages`` list, is refused (exit 65, naming the shape expected:
  :data:`EXPECTED`).
- A damaged record (a message with an ``id`` but no string ``type`` or a ``type`` but no
  ``id``: a flipped byte in a key; ``$set`` without an object; ``$rewindTo`` without a
  message id; in a legacy document, a message that is not an object or has no string
  ``type``) is skipped with ``malformed_record``; only a file with no well-formed record of
  the session's shape is refused.
- A ``gemini`` (or ``model``) message is an action: ``content`` text, ``thoughts[]``
  summaries as reasoning, ``toolCalls[]`` (``id``, ``name``, ``args`` object) as one batch.
  Results are stored inside each call record (``result[].functionResponse.response``, kept
  exactly as the list of parts); ``status: "error"`` sets ``is_error``. A ``user`` message
  made only of ``functionResponse`` parts repeats results (Gemini CLI >= 0.61 writes both):
  it answers calls without a stored result, and is otherwise left out (one copy used).
  Calls of one message sharing an id: ``duplicate_call_id``; each keeps its stored result,
  and the k-th functionResponse of the id in a copy answers the k-th call of the id.
- ``info``/``error``/``warning`` messages are UI-only: left out. Other user messages after
  an action are observation messages; before the first action the last one is the task.
- System prompt and tool definitions are not stored. No format version is stored: the profile
  is chosen by shape.

Memory (issue 6, "Scale"): a JSONL session is read twice. The first pass streams it and keeps
per message id only where it was read, the :class:`~.jsonl.LineRef` of its latest record and
its shape (type; call ids without a stored result; functionResponse ids): the upserts,
``$rewindTo``, the repeated results, every warning, ``task``, ``model``, ``left_out`` and
``meta`` are decided there. ``traj.steps`` is a :class:`~.assembly.LazySteps` whose steps read
their message's latest record, the functionResponse copies that fill its results and the user
messages after it again. The legacy single JSON is parsed whole (a single document may use
4x its size) and its steps are built at once.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.core.errors import BadInputError
from pvisor.journal.model import (
    Action,
    Compaction,
    Message,
    Reasoning,
    Step,
    TextPart,
    ToolResult,
    Trajectory,
)

from .assembly import LazySteps, as_dict, as_list, as_str, epoch_ms, left_out, object_call
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics, require
from .jsonl import BOM, JsonlSource, LineRef, iter_json_records, read_json_document

if TYPE_CHECKING:
    from pathlib import Path

#: the legacy single-JSON shape, named when a ``.json`` file is refused
EXPECTED = (
    "a Gemini CLI session JSON: an object {sessionId, projectHash, startTime, messages: [{id, type, "
    "content}, ...]}"
)

PROFILE = FormatProfile(
    "gemini-cli",
    0,
    61,
    "by shape (no version stored): JSONL with $set/$rewindTo, or legacy single JSON",
    "0.61.0",
    by_shape=True,
)


def _parts_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content] if content else []
    out = []
    for p in as_list(content):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought"):
            out.append(p["text"])
    return out


#: fields of a ToolCallRecord the trajectory uses (``resultDisplay``, ``description``, ... are UI copies)
_CALL_KEYS = ("id", "name", "args", "result", "status", "agentId")


def _slim(m: dict) -> dict:
    """A MessageRecord without its UI-only fields (``displayContent``, the calls'
    ``resultDisplay`` that repeats the output), as a JSONL step keeps it in ``raw``."""
    m.pop("displayContent", None)
    calls = m.get("toolCalls")
    if isinstance(calls, list):
        m["toolCalls"] = [
            {k: c[k] for k in _CALL_KEYS if k in c} if isinstance(c, dict) else c for c in calls
        ]
    return m


def _function_responses(content: Any) -> list[dict] | None:
    """The functionResponse parts when ``content`` is made of them only, else None."""
    if not isinstance(content, list) or not content:
        return None
    fr = [p.get("functionResponse") for p in content if isinstance(p, dict)]
    if len(fr) != len(content) or not all(isinstance(x, dict) for x in fr):
        return None
    return fr


def _calls(m: dict) -> list:
    """The call records of a ``gemini``/``model`` message: ``toolCalls[]``, or for legacy
    ``model`` messages its ``functionCall`` parts."""
    calls = as_list(m.get("toolCalls"))
    content = m.get("content", m.get("parts"))
    if not calls and isinstance(content, list):
        calls = [
            dict(p["functionCall"])
            for p in content
            if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
        ]
    return calls


#: stands for a functionResponse ``id`` that is neither a string nor null: it answers no call
_NO_ID = object()


def _shape(m: dict) -> tuple[str, Any]:
    """(kind, info) of a MessageRecord, what the first pass keeps of it: for an action
    (``gemini``/``model``), (the calls without a stored result in call order, each as (id, k)
    for the k-th call of that id (0 but where ids repeat), ``model``, the ids two of its calls
    share); for a ``user`` message made of functionResponse parts only, their ids; else None."""
    t = m.get("type")
    if t in ("gemini", "model"):
        seen: dict[str | None, int] = {}
        pending = []
        for c in _calls(m):
            if isinstance(c, dict):
                cid = as_str(c.get("id"))
                k = seen[cid] = seen.get(cid, -1) + 1
                if c.get("result") is None:
                    pending.append((cid, k))
        model = as_str(m.get("model"))
        shared = tuple(i for i, k in seen.items() if k and i is not None)
        return str(t), (tuple(pending), sys.intern(model) if model else model, shared)
    if t == "user":
        fr = _function_responses(m.get("content", m.get("parts")))
        return "user", None if fr is None else tuple(
            f.get("id") if f.get("id") is None or isinstance(f.get("id"), str) else _NO_ID for f in fr
        )
    return str(t), None


class _Msg(NamedTuple):
    """One message of the session as the first pass keeps it: where it was read (``line 4``,
    ``line 4 (replaced by line 9)``), ``src`` (its LineRef, or the record itself in a legacy
    document), and :func:`_shape`'s kind and info."""

    where: str
    src: Any
    kind: str
    info: Any


class _Plan:
    """One step as the first pass keeps it: the action message's ``src``, the ids of its calls
    still without a result (``pending``, first pass only), the ``model``, and the ``src`` of
    the functionResponse copies that fill its results and of the user messages after it. Kept
    for every step: empty ones stay the shared ``()``."""

    __slots__ = ("n", "src", "pending", "model", "fills", "messages")

    def __init__(self, n: int, src: Any, pending: tuple, model: str | None) -> None:
        self.n = n
        self.src = src
        self.pending = pending
        self.model = model
        self.fills: tuple = ()
        self.messages: tuple = ()

    def fill(self, ids: tuple) -> bool:
        """As :meth:`GeminiCliAdapter._fill_results` on ids only: drop the pending calls a
        functionResponse answers (the k-th response of an id the k-th call of it); True when
        any was."""
        before = len(self.pending)
        answered = set(_nth(ids))
        self.pending = tuple(p for p in self.pending if p not in answered)
        return len(self.pending) != before


def _nth(ids: Any) -> list[tuple[Any, int]]:
    """``ids`` as (id, k): the k-th time (from 0) that id comes in ``ids``."""
    seen: dict[Any, int] = {}
    out = []
    for i in ids:
        seen[i] = seen.get(i, -1) + 1
        out.append((i, seen[i]))
    return out


def _malformed(traj: Trajectory, diag: Diagnostics, where: str, what: str) -> None:
    diag.warn("malformed_record", where, f"{what}; skipped")
    left_out(traj, where, "malformed", what)


def _update_meta(meta: dict[str, Any], upd: dict) -> None:
    """``meta.update(upd)`` without ``messages``; objects and arrays (dropped from the final
    meta) are stored as an empty list, so a large one is not held while reading."""
    for k, v in upd.items():
        if k != "messages":
            meta[k] = [] if isinstance(v, (dict, list)) and k != "task_context" else v


def _jsonl_inside(path: Path, probe: int = 1 << 20) -> bool:
    """Whether a ``.json`` file holds a JSONL session (a recording saved or renamed ``*.json``):
    its first line is a whole JSON object and more follows. A legacy document is one value
    (pretty-printed, its first line a lone ``{``, or all on one line)."""
    with open(path, "rb") as fh:
        data = fh.read(probe)
        first, nl, rest = data.removeprefix(BOM).partition(b"\n")
        if not nl:
            return False  # one line within the probe (or longer): one document
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            return False
        return isinstance(obj, dict) and bool(rest.strip() or fh.read(1))


#: the fields of a legacy document kept in ``meta``, in this order
_DOCUMENT_FIELDS = ("sessionId", "projectHash", "startTime", "lastUpdated", "kind", "summary")


class _Reading:
    """The first pass over a session: the messages by id in the loader's order (``messages``: a
    repeated id keeps its place), the history rewrites (``rewrites``: the ``$set`` line and the
    last message key before it), the metadata, what was left out. :meth:`scan` reads a JSONL
    recording record by record, :meth:`document` a legacy JSON document."""

    def __init__(self) -> None:
        self.traj = Trajectory()
        self.rewrites: list[tuple[int, str]] = []
        self.snapshot_ids: set[str] = set()  # ids of the messages of earlier $set snapshots
        self.meta: dict[str, Any] = {"task_context": []}
        # id -> _Msg, insertion order kept (the loader's Map: a repeated id keeps its place)
        self.messages: dict[str, _Msg] = {}
        self.session = False  # a record of the session's shape was seen

    def document(self, path: Path, diag: Diagnostics) -> None:
        """A legacy single-document session, its message records kept as parsed (a single
        document may be held whole: issue 6, "Scale"). BadInputError (exit 65) for a document that
        is no Gemini CLI session."""
        traj, meta, messages = self.traj, self.meta, self.messages
        try:
            doc = read_json_document(path, diag)
        except BadInputError as exc:
            raise BadInputError(f"{exc.message}; expected {EXPECTED}") from None
        except RecursionError:
            raise BadInputError(
                f"{path}: not a JSON document (nested too deep to parse); expected {EXPECTED}"
            ) from None
        require(
            isinstance(doc, dict) and isinstance(doc.get("messages"), list),
            diag,
            "document",
            f"not a Gemini CLI session JSON: no `messages` list; expected {EXPECTED}",
        )
        meta["format"] = "gemini-cli legacy session json"
        meta.update({k: doc[k] for k in _DOCUMENT_FIELDS if k in doc})
        for i, m in enumerate(doc["messages"]):
            if not isinstance(m, dict) or not isinstance(m.get("type"), str):
                what = (
                    f"a JSON {type(m).__name__}, not a message object"
                    if not isinstance(m, dict)
                    else "a message without a string `type`"
                )
                _malformed(traj, diag, f"message {i + 1}", what)
                continue
            messages[str(m.get("id", f"#{i}"))] = _Msg(f"message {i + 1}", m, *_shape(m))
        # another agent's document with a `messages` list (mini-swe-agent's, an OpenCode
        # export) holds no Gemini CLI message: refused, never an empty trajectory
        require(
            bool(messages) or (not doc["messages"] and "sessionId" in doc),
            diag,
            "document",
            f"no Gemini CLI message (an object with a string `type`) in `messages`; expected {EXPECTED}",
        )

    def scan(self, path: Path, source: JsonlSource, diag: Diagnostics) -> None:
        """A JSONL recording, each record handled by its shape: ``$rewindTo``, ``$set``, a message,
        the session's metadata, else unknown. BadInputError (exit 65) naming the first line when
        no record has a session's shape."""
        self.meta["format"] = "gemini-cli session jsonl"
        first: int | None = None  # the first record's line, for the missing-shape error
        for n, obj, ref in iter_json_records(path, diag):
            if first is None:
                first = n
            if "$rewindTo" in obj:
                self.rewind(n, obj, diag)
            elif "$set" in obj:
                self.set(n, obj, diag)
            elif "type" in obj or "id" in obj:
                self.message(n, obj, ref, source, diag)
            elif "sessionId" in obj and "projectHash" in obj:
                self.session = True
                _update_meta(self.meta, obj)
            else:
                diag.warn(
                    "unknown_record",
                    f"line {n}",
                    "a record that is neither a message, $set, $rewindTo nor metadata",
                )
                left_out(self.traj, f"line {n}", "unknown", "record type unknown to the profile")
        if not self.session:
            what = (
                "required record shape missing: no Gemini CLI session record (metadata with "
                "sessionId/projectHash, a message with id/type, $set or $rewindTo) in the file"
            )
            raise BadInputError(
                f"{diag.path}: {what} (no JSON object in it)"
                if first is None
                else f"{diag.path}: line {first}: {what}"
            )

    def rewind(self, n: int, obj: dict, diag: Diagnostics) -> None:
        """``$rewindTo``: that message and every later one dropped (left out)."""
        if not isinstance(obj["$rewindTo"], (str, int)) or isinstance(obj["$rewindTo"], bool):
            _malformed(self.traj, diag, f"line {n}", "$rewindTo without a message id")
            return
        self.session = True
        messages = self.messages
        target = str(obj["$rewindTo"])
        if target in messages:
            keys = list(messages)
            for k in keys[keys.index(target) :]:
                left_out(self.traj, messages.pop(k).where, "rewound", f"dropped by $rewindTo at line {n}")
        else:
            diag.warn(
                "broken_chain",
                f"line {n}",
                f"$rewindTo names message {target}, which is not in the file",
            )

    def set(self, n: int, obj: dict, diag: Diagnostics) -> None:
        """``$set``: a metadata update; its ``messages`` snapshot is the task context before the
        first message, a history rewrite (chat compression) when it drops messages of the file
        and brings new ones, and is left out."""
        if not isinstance(obj["$set"], dict):
            _malformed(self.traj, diag, f"line {n}", "$set without an object")
            return
        self.session = True
        messages, meta = self.messages, self.meta
        upd = obj["$set"]
        snap = upd.get("messages")
        if isinstance(snap, list):
            ids = {str(m.get("id")) for m in snap if isinstance(m, dict)}
            new = {
                i
                for i in ids
                if i not in messages
                and i not in self.snapshot_ids
                and i.removesuffix("_response") not in messages
            }
            if messages and new and any(k not in ids for k in messages):
                # messages of the file are gone from the snapshot and messages never seen
                # came (a resume writes known ids, its initial context first): the history
                # was rewritten, Gemini CLI's chat compression, which leaves no other trace
                self.rewrites.append((n, next(reversed(messages))))
            self.snapshot_ids |= ids
            if not messages and not meta["task_context"]:
                for m in snap:
                    if isinstance(m, dict) and m.get("type") == "user":
                        meta["task_context"].extend(_parts_text(m.get("content")))
            left_out(
                self.traj,
                f"line {n}",
                "$set/messages",
                "history snapshot written at start or resume, not a message record",
            )
        _update_meta(meta, upd)

    def message(self, n: int, obj: dict, ref: LineRef, source: JsonlSource, diag: Diagnostics) -> None:
        """A message record: kept by its id; a repeated id replaces the earlier record in its
        place, an exact repeat is left out."""
        if not ("id" in obj and isinstance(obj.get("type"), str)):
            _malformed(
                self.traj,
                diag,
                f"line {n}",
                "a message record without an `id`"
                if "id" not in obj
                else "a message record without a string `type`",
            )
            return
        self.session = True
        messages = self.messages
        key = str(obj["id"])
        old = messages.get(key)
        if (
            old is not None
            and not old.src.joined
            and old.src.length == ref.length
            and source.load(old.src) == obj
        ):
            # an exact repeat, not an update: the copy changes nothing
            diag.warn(
                "duplicate_record",
                f"line {n}",
                f"message {key} repeats its record at {old.where} exactly; one copy kept",
            )
            left_out(self.traj, f"line {n}", "duplicate", f"an exact copy of message {key}")
        elif old is not None:
            messages[key] = _Msg(old.where + f" (replaced by line {n})", ref, *_shape(obj))
        else:
            messages[key] = _Msg(f"line {n}", ref, *_shape(obj))


def _plans(
    traj: Trajectory,
    messages: dict[str, _Msg],
    context: list[str],
    get: Callable[[Any], dict],
    diag: Diagnostics,
) -> tuple[list[_Plan], dict[str, int]]:
    """The messages in order made into step plans: a model message is an action, the
    functionResponse copies and user messages after it its observation; before the first action
    the last user message is the task, the others its ``context``. Returns the plans and, per
    message key, the number of steps up to it."""
    plans: list[_Plan] = []
    step_after: dict[str, int] = {}  # message key -> the number of steps up to it
    for key, msg in messages.items():
        step_after[key] = len(plans) + (1 if msg.kind in ("gemini", "model") else 0)
        if msg.kind in ("gemini", "model"):
            plans.append(_Plan(len(plans) + 1, msg.src, msg.info[0], msg.info[1]))
            for cid in msg.info[2]:
                diag.warn(
                    "duplicate_call_id",
                    msg.where,
                    f"calls of the message share the id {cid}; each keeps its stored result, "
                    "functionResponse copies paired in order of appearance",
                )
            continue
        if msg.kind != "user":
            left_out(traj, msg.where, msg.kind, "UI-only message (info, error, warning)")
            continue
        if msg.info is not None:  # functionResponse parts only
            if plans and plans[-1].fill(msg.info):
                plans[-1].fills += (msg.src,)
                continue
            left_out(
                traj,
                msg.where,
                "functionResponse_copy",
                "repeats the results stored in the calls; one copy used",
            )
            continue
        if not plans:
            m = get(msg.src)
            texts = _parts_text(m.get("content", m.get("parts")))
            if traj.task is not None:
                context.append(traj.task)
            traj.task = texts[-1] if texts else ""
            context.extend(texts[:-1])
            continue
        plans[-1].messages += (msg.src,)
    return plans, step_after


def _list_subagents(path: Path, meta: dict[str, Any], traj: Trajectory) -> None:
    """The subagent sessions of a main session: ``chats/<sessionId>/<subagent sessionId>.jsonl``
    beside the file (Gemini CLI writes a subagent's recording there, ``kind: subagent``), listed
    in ``meta["subagents"]`` (``[{"path", "agent_id"}]``, the key only when there is one) and in
    ``left_out`` (kind ``subagent``), never mixed in: each is an episode of its own."""
    session = meta.get("sessionId")
    if not isinstance(session, str) or meta.get("kind") == "subagent" or os.sep in session:
        return
    sub_dir = os.path.join(os.path.dirname(os.path.abspath(path)), session)
    if not os.path.isdir(sub_dir):
        return
    found = sorted(f for f in os.listdir(sub_dir) if f.endswith(".jsonl"))
    if found:
        meta["subagents"] = []
    for name in found:
        agent_id = name.removesuffix(".jsonl")
        meta["subagents"].append({"path": os.path.join(sub_dir, name), "agent_id": agent_id})
        left_out(traj, os.path.join(sub_dir, name), "subagent", f"subagent session {agent_id}, not mixed in")


class GeminiCliAdapter(NativeAdapter):
    name = "gemini-cli"
    description = "Gemini CLI chat recording (~/.gemini/tmp/<project>/chats/session-*.jsonl, legacy .json)"
    profiles = (PROFILE,)

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """A gemini message's ``tokens`` (``{input, output, cached, thoughts, tool, total}``):
        Gemini's ``usageMetadata`` renamed (``promptTokenCount``, ``candidatesTokenCount``,
        ``cachedContentTokenCount``, ``thoughtsTokenCount``, ``toolUsePromptTokenCount``), read
        as the gemini protocol reads it: the input adds the tool-use prompt, the output the
        thoughts."""
        if not isinstance(usage, dict):
            return TokenUsage()
        names = {
            "input": "promptTokenCount",
            "output": "candidatesTokenCount",
            "cached": "cachedContentTokenCount",
            "thoughts": "thoughtsTokenCount",
            "tool": "toolUsePromptTokenCount",
            "total": "totalTokenCount",
        }
        return get_protocol("gemini").normalised_usage({names[k]: v for k, v in usage.items() if k in names})

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """The records read (:class:`_Reading`: a JSONL recording, or a legacy document), the
        messages made into step plans (:func:`_plans`), the history rewrites made compactions;
        a recording's steps built lazily."""
        r = _Reading()
        traj = r.traj
        flagged: set[int] = set()
        with open(path, "rb") as fh:
            head = fh.read(64).removeprefix(BOM).lstrip()[:1]
        if head == b"{" and os.path.splitext(path)[1] == ".json" and not _jsonl_inside(path):
            r.document(path, diag)
            get: Callable[[Any], dict] = lambda m: m  # noqa: E731
            legacy = True
        else:
            source = JsonlSource(path)
            get = lambda ref: _slim(source.load(ref))  # noqa: E731
            legacy = False
            r.scan(path, source, diag)
        meta = {k: v for k, v in r.meta.items() if not isinstance(v, (dict, list)) or k == "task_context"}
        plans, step_after = _plans(traj, r.messages, meta["task_context"], get, diag)
        for n, last in r.rewrites:
            k = step_after.get(last, 0)
            if k:
                traj.compactions.append(Compaction(k, [], "$set/messages", f"line {n}", rebuilt=False))
                flagged.add(k)
        for p in plans:
            if p.pending:
                diag.warn(
                    "interrupted", f"step {p.n}", f"tool call {p.pending[0][0]} has no result in the file"
                )
            p.pending = ()  # only the first pass needs them
        steps = LazySteps(plans, lambda p: self._build(p, get, flagged))
        traj.steps = list(steps) if legacy else steps
        traj.model = next((p.model for p in plans if p.model), None)
        traj.meta = meta
        _list_subagents(path, meta, traj)
        return NativeResult(traj, PROFILE, diag)

    def _build(  # type: ignore[assignment]
        self, plan: _Plan, get: Callable[[Any], dict], compacted: set[int] = frozenset()
    ) -> Step:
        """Step ``plan.n`` from its message record (and the functionResponse copies and user
        messages that follow it), read again through ``get``; flagged ``compaction`` when its
        number is in ``compacted``."""
        step = self._step(plan.n, get(plan.src))
        if plan.n in compacted:
            step.flags.append("compaction")
        for src in plan.fills:
            m = get(src)
            self._fill_results(step, _function_responses(m.get("content", m.get("parts"))) or [])
        for src in plan.messages:
            m = get(src)
            step.observation.messages.append(
                Message("user", [TextPart(x) for x in _parts_text(m.get("content", m.get("parts")))], raw=m)
            )
        for r in step.observation.results:
            if isinstance(r.raw, dict) and r.raw.get("interrupted"):
                step.flags.append("interrupted")
                break
        return step

    @staticmethod
    def _fill_results(step: Step, fr: list[dict]) -> bool:
        """Put functionResponses into the step's results that have none (the k-th response of
        an id into the k-th result of that id); True when any was filled."""
        filled = False
        for f, (fid, k) in zip(fr, _nth(f.get("id") for f in fr)):
            same = [r for r in step.observation.results if r.call_id == fid]
            r = same[k] if k < len(same) else None
            if r is not None and isinstance(r.raw, dict) and r.raw.get("interrupted"):
                r.content = [{"functionResponse": f}]
                r.is_error = "error" in as_dict(f.get("response"))
                r.raw = f
                filled = True
        return filled

    @staticmethod
    def _step(n: int, m: dict) -> Step:
        content = m.get("content", m.get("parts"))
        action = Action(
            text="".join(_parts_text(content)), model=as_str(m.get("model")), usage=m.get("tokens"), raw=m
        )
        for th in as_list(m.get("thoughts")):
            if isinstance(th, dict):
                text = "\n".join(
                    x for x in (th.get("subject"), th.get("description")) if isinstance(x, str) and x
                )
                action.reasoning.append(Reasoning(text=text, raw=th))
        if isinstance(content, list):
            for p in content:
                if isinstance(p, dict) and p.get("thought") and isinstance(p.get("text"), str):
                    action.reasoning.append(
                        Reasoning(text=p["text"], signature=as_str(p.get("thoughtSignature")), raw=p)
                    )
        step = Step(n=n, action=action, time_ms=epoch_ms(m.get("timestamp")))  # the message's own time
        for c in _calls(m):
            if not isinstance(c, dict):
                continue
            call = object_call(as_str(c.get("id")), as_str(c.get("name")) or "", c.get("args"), raw=c)
            action.tool_calls.append(call)
            result = c.get("result")
            if result is None:
                step.observation.results.append(
                    ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
                )
                continue
            step.observation.results.append(
                ToolResult(call.id, result, is_error=c.get("status") == "error", name=call.name, raw=c)
            )
        return step


ADAPTER = GeminiCliAdapter()
