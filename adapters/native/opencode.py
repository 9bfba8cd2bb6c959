"""OpenCode sessions into a Trajectory, from any of its three stores:

- the ``opencode export <session>`` JSON: ``{info: Session, messages: [{info: Message, parts: [Part]}]}``;
- the legacy storage tree (``~/.local/share/opencode/storage/``: ``session/<project>/<ses>.json``,
  ``message/<ses>/<msg>.json``, ``part/<msg>/<part>.json``), given as the ``storage`` directory;
- the SQLite ``opencode.db`` of releases >= 1.2 (tables ``session``, ``message``, ``part``; the
  ``data`` columns hold the Message / Part JSON without their ids), opened read-only
  (``mode=ro`` URI), no opencode binary needed.

Format rules (sources: docs/native.md, from anomalyco/opencode
packages/opencode/src/session/message-v2.ts; corpus files ``real-1.18.33_export_*.json``,
``real-1.18.33_opencode-db-dump.json`` (the tables of a real opencode.db as JSON: schema and
rows) and the ``agent-sessions_storage_v2`` tree (shape of 1.3.17)):

- Messages in id order (OpenCode ids ascend with creation time, never wall-clock fields),
  parts in id order: the export is already ordered; the db is read ``order by id``; the tree
  in file-name order (OpenCode names each file ``<id>.json``, so this is id order; the
  hand-built fixture names them ``msg_0001.json``/``001.json`` while its ids do not ascend).
- Session choice in a db or tree holding several: the one named by ``session`` (an OpenCode
  session id as ``opencode session list`` prints it and ``opencode export <sessionID>`` /
  ``opencode run --session <id>`` take it, e.g. ``ses_dda0...``; any session, a subagent's
  too), else the most recently updated one without a parent (subagent sessions have
  ``parentID``). The others are left out (kind ``session``). An id that is not in the store
  raises BadInputError (exit 65) listing the ids it holds, most recently updated first, at
  most :data:`MAX_LISTED`. An export holds one session: ``session`` must be its ``info.id``.
  Callers pass it as ``OpenCodeAdapter.read(path, diag, session=ID)`` (the adapter's
  ``selects_sessions`` is True) or :func:`read_session`; the chosen way is in
  ``meta["session_chosen_by"]`` (``id given``, ``latest root session``, ``the only session``).
- One assistant message can hold several model calls, each bracketed by ``step-start`` /
  ``step-finish`` parts: each bracket is one action (a message without brackets is one).
  ``text`` parts (not ``synthetic``) are the text, ``reasoning`` parts reasoning, ``tool``
  parts the calls: ``{callID, tool, state}`` with ``state.input`` an object; the call and its
  result are the same part: ``state.output`` (``completed``) or ``state.error`` (``error``,
  ``is_error`` True); ``pending``/``running`` means the result never came (``interrupted``).
- User messages: the first is the task (its text parts joined; OpenCode wraps a ``run``
  prompt in literal quotes, kept); later ones are observation messages.
- System prompt and tool definitions are not stored (``Trajectory.system``/``tools`` None);
  nor is the title-generation request OpenCode makes beside the main loop (the title is in
  the session, ``meta["title"]``). Version: the session's ``version`` (export ``info.version``,
  the ``session.version`` column, the session file's ``version``).
- A tool output pruned by compaction (``state.time.compacted``) flags its step ``compacted``:
  the model saw a placeholder after that time, the file keeps the original output.
- A compaction (a user message with a ``compaction`` part, then an assistant message with
  ``summary: true``): the summary is no step; it and :data:`COMPACTION_PROMPT` before it are
  the history of a :class:`~pvisor.journal.model.Compaction` after the step before, the
  messages after it (the synthetic "Continue if you have next steps..." prompt) follow it,
  and with ``tail_start_id`` the steps from that user message on are kept verbatim. The earlier
  messages stay in the export: nothing is deleted.
- The database is opened read-only through a ``file:`` URI with ``mode=ro``; when no ``-wal``
  file is beside it (no writer has uncheckpointed pages) also ``immutable=1``, so that reading
  creates no ``-wal``/``-shm`` files next to the user's database. Tree files that are not
  JSON are skipped with a warning naming the file.
- Refused (BadInputError, exit 65, naming the file and the shapes expected, :data:`EXPECTED`):
  a file that is not one JSON document (empty, JSON Lines, nested too deep) nor a SQLite
  database, a document without ``info`` (with a string ``id``) and a ``messages`` list, a
  message that is not ``{info, parts}``, a store without sessions.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pvisor.adapters.protocols.base import TokenUsage, count_sum, first_int
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

from .assembly import as_dict, as_str, epoch_ms, left_out, object_call
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import WARNING_CODES, Diagnostics, require
from .jsonl import loads_lenient, read_json_document
from .documents import read_document
from .signatures import SQLITE_MAGIC

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile(
    "opencode", 1, 18, "session `version` (export `info.version`)", "1.3.17 (fixture), 1.18.33"
)

#: session ids listed at most when a requested session is not in the store
MAX_LISTED = 10
#: the shapes this adapter reads, named when it refuses a file
EXPECTED = (
    "an OpenCode session: `opencode export` JSON {info: {id, version, ...}, messages: [{info, parts}, ...]}, "
    "a storage/ directory (session/, message/, part/) or an opencode.db"
)

if TYPE_CHECKING:
    import sqlite3


def _num(value: Any) -> float:
    """A sort key from a number field of any type (a wrong type sorts first)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _connect_ro(path: Path) -> "sqlite3.Connection":
    """``path`` opened read-only (rules in the module docstring)."""
    import sqlite3
    from pathlib import Path  # here: detection of an export file or a tree does not need it

    path = Path(path)
    uri = path.resolve().as_uri() + "?mode=ro"
    if not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True)


def has_store_tables(path: Path | str) -> bool:
    """True when the SQLite file ``path`` holds the ``session``, ``message`` and ``part`` tables
    of an ``opencode.db`` (the OpenCode signature asks, :mod:`.signatures`); never raises."""
    import sqlite3  # here: only a database store needs it, an export file does not

    try:
        db = _connect_ro(path)
        try:
            names = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        finally:
            db.close()
        return {"session", "message", "part"} <= names
    except sqlite3.Error:
        return False


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(len(SQLITE_MAGIC))


def read_session(path: Path, session: str | None = None, diag: Diagnostics | None = None) -> NativeResult:
    """Read OpenCode store ``path`` (export JSON, storage tree or opencode.db) choosing the
    session with id ``session`` (None: the latest root session). The entry point for a CLI
    ``--session ID`` option; raises BadInputError (exit 65) naming the file and listing the
    available ids when ``session`` is not there."""
    return ADAPTER.read(path, diag or Diagnostics(str(path)), session=session)


#: what OpenCode sends for a ``compaction`` part (1.18.33: the user turn before the summary in
#: every request after a compaction, seen in the requests it sent under ``pvisor run``)
COMPACTION_PROMPT = "What did we do so far?"


def _brackets(parts: list, where: str, diag: Diagnostics) -> list[list[dict]]:
    """An assistant message's parts grouped by model call: each ``step-start`` opens a group,
    each ``step-finish`` closes one; parts outside one make a group of their own. BadInputError
    (exit 65) for a part that is not an object."""
    brackets: list[list[dict]] = []
    cur: list[dict] | None = None
    for j, p in enumerate(parts):
        require(isinstance(p, dict), diag, f"{where} part {j}", "a part that is not a JSON object")
        t = p.get("type")
        if t == "step-start":
            cur = []
            brackets.append(cur)
            continue
        if cur is None:
            cur = []
            brackets.append(cur)
        cur.append(p)
        if t == "step-finish":
            cur = None
    return brackets


class _Messages:
    """The messages of the chosen session read in order (:meth:`message` dispatches by role):
    each model call of an assistant message a step, user messages the task or observation
    messages, a compaction's anchor and summary a :class:`Compaction`."""

    def __init__(self, traj: Trajectory, meta: dict[str, Any], diag: Diagnostics) -> None:
        self.traj, self.meta, self.diag = traj, meta, diag
        self.steps: list[Step] = []
        self.first_step_after: dict[str, int] = {}  # user message id -> the step after it
        # user message id -> its index among the observation messages of its step
        self.message_at: dict[str, int] = {}
        self.kept_from: int | None = None
        self.pending: tuple[str, int | None] | None = (
            None  # a compaction anchor: (its message id, first kept step)
        )

    def message(self, i: int, m: Any) -> None:
        """``messages[i]``: BadInputError (exit 65) unless it is ``{info, parts}``; then by role."""
        require(
            isinstance(m, dict) and isinstance(m.get("info"), dict) and isinstance(m.get("parts"), list),
            self.diag,
            f"messages[{i}]",
            f"not an OpenCode message: not {{info, parts}}; expected {EXPECTED}",
        )
        info = m.get("info") or {}
        parts = m.get("parts") or []
        where = f"message {info.get('id')}"
        role = info.get("role")
        if role == "user" and any(isinstance(p, dict) and p.get("type") == "compaction" for p in parts):
            self.anchor(info, parts, where)
        elif role == "user":
            self.user(m, info, parts)
        elif role != "assistant":
            left_out(self.traj, where, str(role), "message role unknown to the profile")
        else:
            self.assistant(info, parts, where)

    def anchor(self, info: dict, parts: list, where: str) -> None:
        """The anchor of a compaction: sent as COMPACTION_PROMPT, then the summary reply."""
        part = next(p for p in parts if isinstance(p, dict) and p.get("type") == "compaction")
        tail = as_str(part.get("tail_start_id"))
        self.pending = (str(info.get("id")), self.first_step_after.get(tail) if tail else None)
        self.kept_from = self.message_at.get(tail) if tail else None
        left_out(
            self.traj,
            where,
            "compaction",
            "the compaction request's anchor (sent as its prompt before the summary)",
        )

    def user(self, m: dict, info: dict, parts: list) -> None:
        """A user message: the task (its synthetic texts the task's context) before the first
        step, else an observation message of the last step; parts that are not text left out."""
        traj, steps, meta = self.traj, self.steps, self.meta
        self.first_step_after[str(info.get("id"))] = len(steps) + 1
        self.message_at[str(info.get("id"))] = len(steps[-1].observation.messages) if steps else 0
        text = "".join(
            as_str(p.get("text")) or ""
            for p in parts
            if isinstance(p, dict) and p.get("type") == "text" and not p.get("synthetic")
        )
        msg = Message(
            "user",
            [
                TextPart(as_str(p.get("text")) or "", raw=p)
                for p in parts
                if isinstance(p, dict) and p.get("type") == "text"
            ],
            raw=m,
        )
        for p in parts:
            if not isinstance(p, dict) or p.get("type") != "text":
                left_out(
                    traj,
                    f"part {p.get('id') if isinstance(p, dict) else '?'}",
                    str(p.get("type") if isinstance(p, dict) else "part"),
                    "a user part that is not text (file, agent, subtask...)",
                )
        if not steps and traj.task is None:
            traj.task = text
            synthetic = [tp.text for tp in msg.parts if isinstance(tp.raw, dict) and tp.raw.get("synthetic")]
            meta["task_context"].extend(synthetic)
        elif steps:
            steps[-1].observation.messages.append(msg)
        else:
            meta["task_context"].append(text)

    def assistant(self, info: dict, parts: list, where: str) -> None:
        """An assistant message: a step per model call with output (other parts left out); a
        compaction summary after an anchor is the compaction's history, no step."""
        traj, steps, meta, diag = self.traj, self.steps, self.meta, self.diag
        model = as_str(info.get("modelID")) or as_str(as_dict(info.get("model")).get("modelID"))
        traj.model = traj.model or model
        provider = as_str(info.get("providerID")) or as_str(as_dict(info.get("model")).get("providerID"))
        if provider is not None:
            meta.setdefault("provider", provider)  # the first assistant message's: what the render speaks
        brackets = _brackets(parts, where, diag)
        if info.get("summary") is True:
            meta.setdefault("compaction_summaries", []).append(info.get("id"))
            if self.pending is not None and steps:
                self.summary(brackets, where)
                return
        for group in brackets:
            if not any(p.get("type") in ("text", "reasoning", "tool") for p in group):
                for p in group:  # a bracket with no model output, or parts after step-finish (patch)
                    if p.get("type") not in ("step-start", "step-finish"):
                        left_out(
                            traj,
                            f"part {p.get('id')}",
                            str(p.get("type")),
                            "part outside a model call (patch, snapshot, file...)",
                        )
                continue
            steps.append(OpenCodeAdapter._step(len(steps) + 1, group, model, info, diag, traj))
            if info.get("summary") is True:
                steps[-1].flags.append(
                    "compaction"
                )  # a compaction summary (the model was asked to summarise)
        if isinstance(info.get("error"), dict) and steps:
            steps[-1].flags.append("error")
            meta.setdefault("errors", []).append({"step": steps[-1].n, "error": info["error"]})

    def summary(self, brackets: list[list[dict]], where: str) -> None:
        """The model's summary after a compaction's anchor: the compaction after the last step
        (its history the prompt and the summary), the step flagged."""
        steps, pending = self.steps, self.pending
        assert pending is not None
        summary = "".join(
            as_str(p.get("text")) or "" for group in brackets for p in group if p.get("type") == "text"
        )
        history = [
            Message("user", [TextPart(COMPACTION_PROMPT)]),
            Message("assistant", [TextPart(summary)]),
        ]
        self.traj.compactions.append(
            Compaction(
                len(steps),
                history,
                "compaction",
                f"message {pending[0]}",
                summary,
                len(steps[-1].observation.messages),
                pending[1],
                self.kept_from if pending[1] is not None else None,
            )
        )
        steps[-1].flags.append("compaction")
        left_out(
            self.traj,
            where,
            "compaction_summary",
            "the model's summary of the conversation (the compaction's history), not a main-loop step",
        )
        self.pending = None


class OpenCodeAdapter(NativeAdapter):
    name = "opencode"
    reads_directories = True
    #: ``read`` takes ``session=`` (an OpenCode session id); other adapters do not
    selects_sessions = True
    description = "OpenCode session: `opencode export` JSON, legacy storage/ tree, or opencode.db (read-only)"
    profiles = (PROFILE,)

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """An assistant message's ``tokens`` (``{input, output, reasoning, cache{read, write}}``,
        OpenCode's session ``getUsage``): ``input`` counts only what was neither read from nor
        written to the cache and ``output`` leaves the reasoning out, so the input is their sum
        with ``cache.read`` and ``cache.write`` and the output adds ``reasoning``."""
        if not isinstance(usage, dict):
            return TokenUsage()
        cache = as_dict(usage.get("cache"))
        read, written = first_int(cache.get("read")), first_int(cache.get("write"))
        reasoning = first_int(usage.get("reasoning"))
        return TokenUsage(
            input_tokens=count_sum(usage.get("input"), read, written),
            cached_input_tokens=read,
            cache_creation_input_tokens=written,
            output_tokens=count_sum(usage.get("output"), reasoning),
            reasoning_tokens=reasoning,
        )

    def read(self, path: Path, diag: Diagnostics, session: str | None = None) -> NativeResult:
        """Read ``path``; ``session``: the id of the session to read (rules in the module
        docstring). Raises BadInputError (65) for a file that is none of the three stores, an
        unknown major version, or a ``session`` the store does not hold. The session is chosen
        in its store (:meth:`_open`), its messages read in order (:class:`_Messages`)."""
        traj = Trajectory()
        chosen, messages, others, fmt = self._open(path, diag, session)
        for sid in others:
            left_out(
                traj,
                f"session {sid}",
                "session",
                "another session in the store (a subagent's, or an older one)",
            )
        PROFILE.check(chosen.get("version"), f"session {chosen.get('id')}", diag)
        meta: dict[str, Any] = {
            "format": fmt,
            "task_context": [],
            "session": chosen.get("id"),
            "agent_version": chosen.get("version"),
            "directory": chosen.get("directory"),
            "title": chosen.get("title"),
            "session_chosen_by": "id given"
            if session is not None
            else ("the only session" if fmt == "opencode export json" else "latest root session"),
        }
        reading = _Messages(traj, meta, diag)
        for i, m in enumerate(messages):
            reading.message(i, m)
        traj.steps = reading.steps
        traj.meta = meta
        return NativeResult(traj, PROFILE, diag)

    def _open(self, path: Path, diag: Diagnostics, session: str | None) -> tuple[dict, list, list[str], str]:
        """(the chosen session's info, its messages, the ids of the store's other sessions, the
        store's format name) of a storage tree, an ``opencode.db`` or an export."""
        if os.path.isdir(path):
            from pathlib import Path  # a store (a tree, a database) is walked as Paths; an export is not

            chosen, messages, others = self._from_tree(Path(path), diag, session)
            return chosen, messages, others, "opencode storage tree"
        if _head(path) == SQLITE_MAGIC:
            from pathlib import Path

            chosen, messages, others = self._from_db(Path(path), diag, session)
            return chosen, messages, others, "opencode.db (read-only)"
        doc = read_document(path, diag, EXPECTED, arrays=("messages",))
        require(
            isinstance(doc, dict)
            and isinstance(doc.get("info"), dict)
            and isinstance(doc.get("messages"), list),
            diag,
            "document",
            f"not an OpenCode export: no `info` and `messages`; expected {EXPECTED}",
        )
        require(
            isinstance(doc["info"].get("id"), str),
            diag,
            "info",
            f"not an OpenCode export: the session `info` has no `id`; expected {EXPECTED}",
        )
        chosen = doc["info"]
        if session is not None and session != chosen["id"]:
            raise BadInputError(
                f"{diag.path}: no OpenCode session {session!r} in this export; it holds session "
                f"{chosen['id']}"
            )
        return chosen, doc["messages"], [], "opencode export json"

    @staticmethod
    def _step(
        n: int, parts: list[dict], model: str | None, info: dict, diag: Diagnostics, traj: Trajectory
    ) -> Step:
        action = Action(model=model, raw=parts)
        # when the model call began: its first part's time.start (one message may hold several
        # calls), else the message's time.created (epoch milliseconds)
        starts = [as_dict(p.get("time")).get("start") for p in parts]
        created = as_dict(info.get("time")).get("created")
        step = Step(n=n, action=action, time_ms=epoch_ms(next((t for t in starts if t is not None), created)))
        texts = []
        for p in parts:
            t = p.get("type")
            if t == "text" and not p.get("synthetic"):
                texts.append(as_str(p.get("text")) or "")
            elif t == "reasoning":
                action.reasoning.append(Reasoning(text=as_str(p.get("text")) or "", raw=p))
            elif t == "tool":
                state = as_dict(p.get("state"))
                call = object_call(
                    as_str(p.get("callID")), as_str(p.get("tool")) or "", state.get("input"), raw=p
                )
                action.tool_calls.append(call)
                status = state.get("status")
                if as_dict(state.get("time")).get("compacted") and "compacted" not in step.flags:
                    step.flags.append("compacted")
                if status == "completed":
                    step.observation.results.append(
                        ToolResult(call.id, state.get("output"), is_error=False, name=call.name, raw=p)
                    )
                elif status == "error":
                    step.observation.results.append(
                        ToolResult(call.id, state.get("error"), is_error=True, name=call.name, raw=p)
                    )
                else:
                    step.observation.results.append(
                        ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
                    )
                    if "interrupted" not in step.flags:
                        step.flags.append("interrupted")
                    diag.warn(
                        "interrupted",
                        f"part {p.get('id')}",
                        f"tool call {call.id} ({call.name}) is {status}: its result never came",
                    )
            elif t == "step-finish":
                action.usage = p.get("tokens")
                action.stop_reason = p.get("reason")
            elif t not in ("step-start",):
                left_out(
                    traj,
                    f"part {p.get('id')}",
                    str(t),
                    "part not read into the trajectory (file, patch, snapshot, compaction, synthetic "
                    "text...)",
                )
        action.text = "".join(texts)
        return step

    # ------------------------------------------------------------------ stores

    @staticmethod
    def _pick(sessions: list[dict], diag: Diagnostics, wanted: str | None) -> tuple[dict, list[str]]:
        """(the chosen session, the ids of the others); rules in the module docstring."""
        if not sessions:
            raise BadInputError(f"{diag.path}: no OpenCode session in this store; expected {EXPECTED}")
        # most recently updated first; the id breaks ties so the choice does not depend on row order
        recent = sorted(
            sessions,
            key=lambda s: (_num(as_dict(s.get("time")).get("updated")), str(s.get("id") or "")),
            reverse=True,
        )
        if wanted is not None:
            chosen = next((s for s in recent if s.get("id") == wanted), None)
            if chosen is None:
                ids = [str(s.get("id")) for s in recent]
                more = f" (and {len(ids) - MAX_LISTED} more)" if len(ids) > MAX_LISTED else ""
                raise BadInputError(
                    f"{diag.path}: no OpenCode session {wanted!r} in this store; it holds, most recent "
                    "first: "
                    f"{', '.join(ids[:MAX_LISTED])}{more}"
                )
        else:
            chosen = next((s for s in recent if not s.get("parentID")), recent[0])
        return chosen, [s.get("id") for s in sessions if s is not chosen]

    def _from_tree(
        self, root: Path, diag: Diagnostics, wanted: str | None
    ) -> tuple[dict, list[dict], list[str]]:
        sessions = [
            s
            for s in (self._tree_file(f, root, diag) for f in sorted((root / "session").glob("*/*.json")))
            if s is not None
        ]
        session, others = self._pick(sessions, diag, wanted)
        messages = []
        for f in sorted((root / "message" / str(session["id"])).glob("*.json")):
            info = self._tree_file(f, root, diag)
            if info is None:
                continue
            parts = [
                self._tree_file(pf, root, diag)
                for pf in sorted((root / "part" / str(info.get("id"))).glob("*.json"))
            ]
            messages.append({"info": info, "parts": [p for p in parts if p is not None]})
        return session, messages, others

    def _from_db(
        self, path: Path, diag: Diagnostics, wanted: str | None
    ) -> tuple[dict, list[dict], list[str]]:
        import sqlite3

        try:
            db = _connect_ro(path)
        except sqlite3.Error as exc:
            raise BadInputError(
                f"{path}: cannot open as OpenCode database: {exc}; expected {EXPECTED}"
            ) from None
        try:
            db.row_factory = sqlite3.Row
            sessions = []
            for r in db.execute("select * from session"):
                row = dict(r)
                sessions.append(
                    {
                        "id": row.get("id"),
                        "version": row.get("version"),
                        "parentID": row.get("parent_id"),
                        "directory": row.get("directory"),
                        "title": row.get("title"),
                        "time": {"updated": row.get("time_updated") or 0},
                    }
                )
            session, others = self._pick(sessions, diag, wanted)
            parts_by_msg: dict[str, list[dict]] = {}
            for r in db.execute(
                "select id, message_id, cast(data as blob) as data from part where session_id = ? order "
                "by id",
                (session["id"],),
            ):
                data = self._json(r["data"], diag, f"part {r['id']}")
                data.setdefault("id", r["id"])
                parts_by_msg.setdefault(r["message_id"], []).append(data)
            messages = []
            for r in db.execute(
                "select id, cast(data as blob) as data from message where session_id = ? order by id",
                (session["id"],),
            ):
                info = self._json(r["data"], diag, f"message {r['id']}")
                info.setdefault("id", r["id"])
                messages.append({"info": info, "parts": parts_by_msg.get(r["id"], [])})
        except sqlite3.Error as exc:
            raise BadInputError(
                f"{path}: not a readable OpenCode database: {exc}; expected {EXPECTED}"
            ) from None
        finally:
            db.close()
        return session, messages, others

    @staticmethod
    def _tree_file(f: Path, root: Path, diag: Diagnostics) -> dict | None:
        """The JSON object in tree file ``f``, or None (with a warning naming it) when it is
        not one: one damaged file does not lose the session."""
        rel = f.relative_to(root).as_posix()
        sub = Diagnostics(str(f))
        try:
            value = read_json_document(f, sub)
            for w in sub.warnings:  # "document" -> the file's path in the tree
                diag.warn(w.code, rel, w.message)
        except BadInputError:
            diag.warn("malformed_line", rel, "not JSON; file skipped")
            return None
        if not isinstance(value, dict):
            diag.warn("not_an_object", rel, "not a JSON object; file skipped")
            return None
        return value

    @staticmethod
    def _json(data: bytes, diag: Diagnostics, where: str) -> dict:
        """A ``data`` column (read as bytes: a TEXT value with invalid UTF-8 would make sqlite3
        raise) as a JSON object, with the reader's UTF-8 fallback; {} with a warning when it is
        not JSON."""
        try:
            v, flags = loads_lenient(bytes(data or b""))
        except ValueError:
            diag.warn("malformed_line", where, "the `data` column is not JSON; skipped")
            return {}
        for f in flags:
            diag.warn(f, where, WARNING_CODES[f])
        if not isinstance(v, dict):
            diag.warn("not_an_object", where, "the `data` column is not a JSON object; skipped")
            return {}
        return v


ADAPTER = OpenCodeAdapter()
