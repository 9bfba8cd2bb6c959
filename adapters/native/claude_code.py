"""Claude Code session JSONL (``~/.claude/projects/<cwd-slug>/<session>.jsonl``) into a Trajectory.

Format rules (sources: docs/native.md; the corpus files
``spotter_*.jsonl`` (Claude Code 2.1.38), ``real-2.1.197_single-then-resume.jsonl`` and the
``agent-sessions_schema_coverage.jsonl`` fixture):

- One JSON object per line; conversational lines (``type`` ``user`` / ``assistant`` /
  ``system`` / ``progress`` / ``attachment``) carry ``uuid`` and ``parentUuid``; others
  (:data:`UI_TYPES`: ``queue-operation``, ``last-prompt``, ``file-history-snapshot``,
  ``summary``, ``mode``, titles, ...) carry no uuid and are UI-only: left out. Any other type,
  with or without a uuid, is left out with an ``unknown_record`` warning.
- Required shape: at least one ``user`` or ``assistant`` line with ``uuid``, ``sessionId`` and
  ``message.content`` (an Anthropic message); a file without one (another agent's file, an
  empty file) is refused, exit 65. The version is checked once that shape is seen.
- **Order is the parentUuid chain, never the timestamp or the file order.** A line whose
  ``parentUuid`` is not null but names no line of the file (its parent's line was lost or
  damaged) continues from the chain line before it in the file, with a ``broken_chain``
  warning naming the line and the missing uuid (a root when there is none, or when that line
  descends from it), and the step holding the line (a later line of a reply over several lines
  too) is flagged ``broken_chain``; real forks (a
  parent that exists: rewinds, result forks) are untouched.
  The main chain is walked back from its leaf: among the lines no line names as parent (any
  chain record: a session often ends with ``progress`` or ``system`` lines), the deepest one
  descending from the ``leafUuid`` of the last ``last-prompt``/``summary`` record, else the
  deepest one; ties: the later line. A ``system/compact_boundary`` line has ``parentUuid: null``
  and ``logicalParentUuid``: the walk goes on through it, the boundary is left out
  (``compaction_boundary``), and the ``isCompactSummary`` user line after it (what the agent
  sends in place of the history) is kept as a message of the observation before it, the step
  flagged ``compaction``, and is the history of a :class:`~pvisor.journal.model.Compaction`
  after that step: later requests start with it, followed by the user lines after it. The
  messages the boundary's ``compactMetadata.preservedMessages.uuids`` name (2.1.3xx keeps the
  reply that triggered the compaction and its results verbatim after the summary) are steps
  kept in full (``steps_from``): the walk still reads them before the boundary, through its
  ``logicalParentUuid``. What the agent folds into the kept messages when it sends them (the
  date reminder before the summary, re-read files and listings appended to the kept tool
  result) is not in the file: a difference named in docs/result-protocol.md.
- One API response is split over several ``assistant`` lines (one content block each) sharing
  ``message.id``; tool-result lines fork the chain (each result's parent is the line of its
  ``tool_use``), and Claude Code may run a call before the rest of the response has been
  written, so lines of one ``message.id`` can come before and after a result. An action is
  therefore every block of every ``assistant`` line with that ``message.id``, taken when the
  chain first reaches the id, in chain order (depth in the parentUuid tree; file order breaks
  ties). A repeated uuid replaces the earlier line. Usage and ``stop_reason``: of the last line
  in that chain order that has them (not the file order: a reversed file reads the same).
- A ``user`` line on the chain whose ``tool_result`` blocks answer calls no line holds (the
  assistant line was lost) is a gap step at its place: flag ``lost_action``, no action, those
  results its observation, a ``lost_action`` warning naming the line; later steps keep their
  numbers.
- Results: ``user`` lines with ``tool_result`` blocks, found by ``tool_use_id`` (wherever the
  fork put them), in call order; ``content`` kept exactly, ``is_error`` as stored (False when
  absent). Two calls with one id (``duplicate_call_id`` warned): the k-th call on the chain
  gets the k-th result with that id in the file. A call without a result gets an
  ``interrupted`` result (the warning names the call's line) and the step the flag.
- A ``user``/``assistant`` line without a ``message`` object, or an assistant line whose
  ``content`` is not a list, is left out with a ``malformed_record`` warning (the chain goes
  through it); the file is refused only when no line has the shape above.
- Other user lines on the chain (a later prompt, a resumed prompt, ``isMeta`` injected text)
  are observation messages; before the first action, the last one is the task, the others
  ``meta["task_context"]``.
- ``isSidechain: true`` lines (older versions inline subagents) and API error replies
  (``isApiErrorMessage``) are left out; subagent files ``<session>/subagents/*.jsonl`` are
  listed in ``meta["subagents"]`` and in ``left_out`` (kind ``subagent``), never mixed in; the
  inline subagents in ``meta["sidechains"]``. Each is an episode of its own
  (:mod:`pvisor.replay.episodes`): a subagent's transcript given as the file (every user and
  assistant line a sidechain's) reads its sidechain lines as the loop, and ``sidechain=ID``
  reads the inline lines of that ``agentId`` (the main lines then left out, kind ``main_line``).
- System prompt and tool definitions are not stored: ``system`` and ``tools`` are None.
- Version: ``version`` of the first line with a uuid (the CLI version, e.g. ``2.1.38``).

Memory (issue 6, "Scale"): reading keeps the structure of each line only, compactly (a uuid ->
index dict, parents, line numbers and kinds in arrays; ``message.id``, tool-call and
tool-result ids and a packed :class:`~.jsonl.LineRef` for user and assistant lines only), and
``left_out`` is a :class:`~.assembly.LeftOutLines` (a line number and a shared (kind, reason) per
entry); ``traj.steps`` is a
:class:`~.assembly.LazySteps` whose steps read their blocks and results from the file again when
built. All warnings are given while reading.
"""

from __future__ import annotations

import os
import re
from array import array
from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable

from pvisor.journal.model import (
    Action,
    Compaction,
    LeftOut,
    Message,
    Reasoning,
    Step,
    TextPart,
    ToolResult,
    Trajectory,
)
from pvisor.core.record import Record
from pvisor.adapters.protocols.base import signature_flags

from .assembly import LazySteps, LeftOutLines, as_dict, as_str, epoch_ms, interned, object_call
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics
from .jsonl import JsonlSource, LineRef, iter_json_records, pack_ref, unpack_ref
from .uuid_chain import CompactChain, SessionHeader

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile("claude-code", 2, 1, "`version` of the first conversational line", "2.1.38, 2.1.197")

#: conversational line types that sit in the uuid chain but are not model input
_CHAIN_UI = {"progress", "attachment", "system"}

#: record types without a uuid that Claude Code writes for its UI and bookkeeping (session
#: list, titles, file history, queued prompts, links, request logs, costs); left out silently.
#: Sources: docs/native.md, the agent-sessions schema-coverage fixture in
#: the corpus, and files written by Claude Code 2.1.332 in the cross-check (``api-request*``,
#: ``tools-used``, ``cost-state``).
UI_TYPES = frozenset(
    {
        "queue-operation",
        "last-prompt",
        "file-history-snapshot",
        "summary",
        "mode",
        "permission-mode",
        "custom-title",
        "ai-title",
        "tag",
        "agent-name",
        "worktree-state",
        "pr-link",
        "frame-link",
        "started",
        "result",
        "relocated",
        "bridge-session",
        "atis-latch",
        "api-request",
        "api-request-shape",
        "api-request-blob",
        "tools-used",
        "cost-state",
    }
)

_SHAPE = (
    "no Claude Code session line (a user or assistant record with uuid, sessionId and message.content) in "
    "the file"
)

# kinds of chain lines (low bits) and flags of user lines
_UI, _USER, _ASSISTANT, _BOUNDARY = 0, 1, 2, 3
_META, _SUMMARY = 8, 16
_TALK = (_USER, _ASSISTANT)  # the kinds that make a conversation (its depth picks the leaf)

_UI_NO_UUID = "UI-only record (no uuid: not part of the conversation chain)"
_UI_CHAIN = "UI-only record in the chain"


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _key(uuid: str) -> int | str:
    """The key a line's uuid is kept under: a canonical lowercase uuid as its 128-bit int (a
    48-byte object instead of an 88-byte string: a 200 MB session has some 500k lines), any
    other id as the string (never equal to an int key)."""
    return int(uuid.replace("-", ""), 16) if len(uuid) == 36 and _UUID.fullmatch(uuid) else uuid


class _Line(Record, record=True):
    """One assistant line of a message: chain index, packed line ref, line number, its
    ``tool_use`` blocks' (id, name), whether it has ``usage``, its ``stop_reason``."""

    index: int
    ref: int
    n: int
    calls: tuple[tuple[str | None, str], ...]
    usage: bool
    stop_reason: Any

    def __init__(
        self,
        index: int,
        ref: int,
        n: int,
        calls: tuple[tuple[str | None, str], ...],
        usage: bool,
        stop_reason: Any,
    ) -> None:
        self.index = index
        self.ref = ref
        self.n = n
        self.calls = calls
        self.usage = usage
        self.stop_reason = stop_reason


class _Msg(Record, record=True):
    """Every assistant line of one ``message.id``; a repeated uuid replaces the earlier line and
    keeps its position. A list, not a dict: a message has a few lines and a file many messages."""

    first_line: int
    lines: list[_Line] = field(default_factory=list)
    model: str | None = None

    def __init__(self, first_line: int, lines: list[_Line] | None = None, model: str | None = None) -> None:
        self.first_line = first_line
        self.lines = [] if lines is None else lines
        self.model = model


class _Gap(Record, record=True):
    """Step ``n`` whose action's line was lost: the results of line ``line`` (packed ``ref``)
    answer calls ``ids`` that no line of the file holds."""

    n: int
    line: int
    ref: int
    ids: tuple[str, ...]
    after: list[tuple[int, bool]] | None = None

    def __init__(
        self,
        n: int,
        line: int,
        ref: int,
        ids: tuple[str, ...],
        after: list[tuple[int, bool]] | None = None,
    ) -> None:
        self.n = n
        self.line = line
        self.ref = ref
        self.ids = ids
        self.after = after


class _Plan(Record, record=True):
    """What step ``n`` is made of: its message, its lines in chain order, the result found for
    each of its ``tool_use`` calls (a packed ref, ``(ref, k)`` for the k-th block with that id
    in the line, or None: interrupted), usage line and stop reason (the last in chain order),
    and the user lines appended after it (observation messages: (ref, is compact summary));
    ``bridged``: a line of it follows a lost line (its parent is not in the file)."""

    n: int
    msg: _Msg
    lines: list[int]
    results: list[Any]
    usage_ref: int | None
    stop_reason: Any
    after: list[tuple[int, bool]] | None = None
    bridged: bool = False

    def __init__(
        self,
        n: int,
        msg: _Msg,
        lines: list[int],
        results: list[Any],
        usage_ref: int | None,
        stop_reason: Any,
        after: list[tuple[int, bool]] | None = None,
        bridged: bool = False,
    ) -> None:
        self.n = n
        self.msg = msg
        self.lines = lines
        self.results = results
        self.usage_ref = usage_ref
        self.stop_reason = stop_reason
        self.after = after
        self.bridged = bridged

    @property
    def interrupted(self) -> bool:
        return any(r is None for r in self.results)


def _user_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content] if content else []
    out = []
    for b in content if isinstance(content, list) else ():
        if isinstance(b, dict) and b.get("type") == "text" and b.get("text"):
            out.append(b["text"])
    return out


def _without_results(content: Any) -> Any:
    """A user line's content without its ``tool_result`` blocks (kept once, by id, as results)."""
    if isinstance(content, list):
        return [
            b
            for b in content
            if not (
                isinstance(b, dict)
                and b.get("type") == "tool_result"
                and isinstance(b.get("tool_use_id"), str)
            )
        ]
    return content


def _observation_message(content: Any) -> Message:
    """A user line after an action as an observation message: its texts, ``raw`` its content
    without tool results (those are the step's results)."""
    content = _without_results(content)
    return Message("user", [TextPart(t) for t in _user_text(content)], raw=content)


def _content(obj: dict) -> Any:
    message = obj.get("message")
    return message.get("content") if isinstance(message, dict) else None


class _Reading:
    """The first pass over a session file: each record handled by its kind (:meth:`scan`
    dispatches), the chain lines kept compactly in ``chain``, the assistant lines by
    ``message.id`` in ``msgs``, the lines holding tool results by call id in ``results``
    (a packed ref; with more than one result for the id, a list of (ref, k): the k-th block with
    the id in that line, in file order), and what was left out in ``lo``."""

    def __init__(self, sidechain: str | None = None) -> None:
        #: which lines are the loop: False the main lines (sidechain lines left out), True the
        #: sidechain lines of ``sidechain``
        self.side = sidechain is not None
        #: the subagent read (``agentId`` of its sidechain lines; ``*``: every sidechain line)
        self.sidechain = sidechain
        #: inline subagents of a main file: agentId (or ``#K`` for the K-th chain, in file order,
        #: of lines that carry none) -> lines
        self.sidechains: dict[str, int] = {}
        #: sidechain lines without an agentId: uuid -> K, their chain root's number (a line
        #: whose parent is not one of them starts chain K+1: each subagent's starts at null)
        self.roots: dict[str, int] = {}
        self.root_count = 0
        self.traj = Trajectory()
        self.lo = self.traj.left_out = LeftOutLines()
        self.chain = CompactChain(_key, _TALK)
        self.msgs: dict[str, _Msg] = {}
        self.preserved: dict[
            int, list[int | str]
        ] = {}  # compact_boundary line -> keys of the messages it kept
        self.result_lines: dict[
            int, tuple[int, tuple[str, ...]]
        ] = {}  # chain index -> (ref, its tool_result ids)
        self.results: dict[str, Any] = {}
        self.leaf_hint: str | None = None  # leafUuid of the last last-prompt / summary record
        self.meta: dict[str, Any] = {
            "format": "claude-code session jsonl",
            "task_context": [],
            "subagents": [],
            "compactions": [],
        }
        self.header = SessionHeader(PROFILE, self.meta, ("sessionId", "cwd", "gitBranch"), _SHAPE)

    def scan(self, path: Path, diag: Diagnostics) -> None:
        """Read every record of ``path``: the header's fields and version, then the record by its
        kind; BadInputError (exit 65) when no line has the format's shape."""
        header, chain, lo = self.header, self.chain, self.lo
        # the handlers of the conversational kinds, by ``type`` (a local: bound methods kept on
        # self would make a cycle that holds the file's structure until a collection)
        talk: dict[str, Callable[..., None]] = {"user": self.user, "assistant": self.assistant}
        for n, obj, line_ref in iter_json_records(path, diag):
            kind = as_str(obj.get("type")) or repr(obj.get("type"))
            uuid = obj.get("uuid")
            message = obj.get("message")
            header.see(
                obj,
                n,
                diag,
                version_here=uuid is not None,
                shaped=kind in ("user", "assistant")
                and isinstance(uuid, str)
                and isinstance(obj.get("sessionId"), str)
                and isinstance(message, dict)
                and "content" in message,
            )
            if not isinstance(uuid, str):
                self.no_uuid(n, obj, kind, diag)
                continue
            side = bool(obj.get("isSidechain"))
            agent = self.side_key(obj, uuid) if side else None
            if side != self.side or (side and self.sidechain != "*" and agent != self.sidechain):
                if agent is not None:
                    self.sidechains[agent] = self.sidechains.get(agent, 0) + 1
                    lo.add(n, "sidechain", "subagent (sidechain) line, not the main loop")
                else:
                    lo.add(n, "main_line", "a line of the main loop, not of this subagent")
                continue
            if _key(uuid) in chain.ids:
                diag.warn(
                    "duplicate_record",
                    f"line {n}",
                    f"uuid {uuid} repeated (first at line {chain.line[chain.ids[_key(uuid)]]}); the "
                    "later line is used",
                )
            parent = as_str(obj.get("parentUuid"))
            handler = talk.get(kind)
            if handler is not None:
                handler(n, obj, uuid, parent, message, line_ref, diag)
            elif kind == "system" and obj.get("subtype") == "compact_boundary":
                self.boundary(n, obj, uuid, parent)
            else:
                # any other line with a uuid: in the chain, left out (``unknown_record`` unless
                # one of the UI kinds that sit in the chain). Read here, without a call: with
                # hooks, ``progress`` lines are most lines of a session
                chain.add(uuid, parent, n, _UI)
                if kind not in _CHAIN_UI:
                    diag.warn("unknown_record", f"line {n}", f"record type {kind!r} left out")
                data = obj.get("data")
                sub = obj.get("subtype") or (data.get("type") if isinstance(data, dict) else None) or ""
                lo.add(
                    n,
                    interned(f"{kind}/{sub}".rstrip("/")),
                    _UI_CHAIN if kind in _CHAIN_UI else "record type unknown to the profile",
                )
        header.finish(diag)

    def side_key(self, obj: dict, uuid: str) -> str:
        """The inline subagent the sidechain line ``obj`` is of: its ``agentId``, or ``#K`` for a
        line without one, K its chain's number in file order (two subagents inlined without
        ids are two chains, each from its own root)."""
        agent = as_str(obj.get("agentId"))
        if agent:
            return agent
        k = self.roots.get(as_str(obj.get("parentUuid")) or "")
        if k is None:
            self.root_count += 1
            k = self.root_count
        self.roots[uuid] = k
        return f"#{k}"

    def no_uuid(self, n: int, obj: dict, kind: str, diag: Diagnostics) -> None:
        """A record without a uuid: UI-only (left out), or of a type unknown to the profile
        (``unknown_record``); a ``leafUuid`` on it is the leaf hint."""
        if isinstance(obj.get("leafUuid"), str):
            self.leaf_hint = obj["leafUuid"]
        if kind in UI_TYPES:
            self.lo.add(n, interned(kind), _UI_NO_UUID)
        else:
            diag.warn("unknown_record", f"line {n}", f"record type {kind!r} (no uuid) left out")
            self.lo.add(n, str(kind), "record type unknown to the profile (no uuid)")

    def malformed(
        self, n: int, kind: str, uuid: str, parent: str | None, message: Any, diag: Diagnostics
    ) -> None:
        """A user or assistant line without a ``message`` object or an assistant line whose
        ``content`` is not a list: a ``malformed_record`` warning, the line left out (the chain
        goes through it). The handlers call it on that shape only (a call a line costs)."""
        bad = (
            f"{'an' if kind == 'assistant' else 'a'} {kind} line without a `message` object"
            if not isinstance(message, dict)
            else "an assistant message whose `content` is not a list"
        )
        diag.warn("malformed_record", f"line {n}", f"{bad}; left out")
        self.chain.add(uuid, parent, n, _UI)
        self.lo.add(n, kind, "malformed record (" + bad + ")")

    def assistant(
        self,
        n: int,
        obj: dict,
        uuid: str,
        parent: str | None,
        message: Any,
        line_ref: LineRef,
        diag: Diagnostics,
    ) -> None:
        """An assistant line: one content block of the response ``message.id``, kept with that
        message (a repeated uuid replaces the earlier line in place); an API error written as a
        reply is left out."""
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):  # no message object, or content not a list
            self.malformed(n, "assistant", uuid, parent, message, diag)
            return
        ref = pack_ref(line_ref)
        chain = self.chain
        if obj.get("isApiErrorMessage"):
            self.lo.add(
                n,
                "api_error",
                "an API error written as a reply by Claude Code, not a model reply",
            )
            chain.add(uuid, parent, n, _UI)
            return
        i, _ = chain.add(uuid, parent, n, _ASSISTANT)
        mid = interned(as_str(message.get("id")) or f"line-{n}")
        chain.msg_id[i] = mid
        m = self.msgs.get(mid)
        if m is None:
            m = self.msgs[mid] = _Msg(n)
        calls = tuple(
            (interned(as_str(b.get("id"))), interned(as_str(b.get("name")) or ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        )
        stop = message.get("stop_reason")
        new = _Line(
            i,
            ref,
            n,
            calls,
            message.get("usage") is not None,
            interned(stop) if isinstance(stop, str) else stop,
        )
        for k, old in enumerate(m.lines):
            if old.index == i:
                new.n = old.n
                m.lines[k] = new
                break
        else:
            m.lines.append(new)
        model = as_str(message.get("model"))
        if model:
            m.model = interned(model)

    def user(
        self,
        n: int,
        obj: dict,
        uuid: str,
        parent: str | None,
        message: Any,
        line_ref: LineRef,
        diag: Diagnostics,
    ) -> None:
        """A user line: a prompt, injected text (``isMeta``), a compaction summary, and/or tool
        results, each result kept by its call id (a repeated line's results are the ones
        already kept)."""
        if not isinstance(message, dict):
            self.malformed(n, "user", uuid, parent, message, diag)
            return
        content = message.get("content")
        ref = pack_ref(line_ref)
        flags = _USER | (_META if obj.get("isMeta") else 0) | (_SUMMARY if obj.get("isCompactSummary") else 0)
        i, again = self.chain.add(uuid, parent, n, flags)
        if _user_text(content):
            self.chain.text_ref[i] = ref
        if not isinstance(content, list):
            return
        results = self.results
        seen_here: dict[str, int] = {}
        ids_here = [
            b["tool_use_id"]
            for b in content
            if isinstance(b, dict)
            and b.get("type") == "tool_result"
            and isinstance(b.get("tool_use_id"), str)
        ]
        if ids_here:
            self.result_lines[i] = (ref, tuple(ids_here))
        for b in content:
            if (
                isinstance(b, dict)
                and b.get("type") == "tool_result"
                and isinstance(b.get("tool_use_id"), str)
            ):
                cid = b["tool_use_id"]
                k = seen_here[cid] = seen_here.get(cid, -1) + 1
                have = results.get(cid)
                if have is None:
                    results[interned(cid)] = ref if k == 0 else [(ref, k)]
                elif not again:  # a repeated line's results are the ones already kept
                    if not isinstance(have, list):
                        have = results[cid] = [(have, 0)]
                    have.append((ref, k))

    def boundary(self, n: int, obj: dict, uuid: str, parent: str | None) -> None:
        """A ``system/compact_boundary`` line: in the chain through its ``logicalParentUuid``,
        the messages it kept verbatim noted, left out itself."""
        logical = as_str(obj.get("logicalParentUuid"))
        self.chain.add(uuid, parent or logical, n, _BOUNDARY)
        kept = as_dict(as_dict(obj.get("compactMetadata")).get("preservedMessages")).get("uuids")
        if isinstance(kept, list):
            self.preserved[n] = [_key(u) for u in kept if isinstance(u, str)]
        self.lo.add(n, "compaction_boundary", "compaction boundary; the summary after it is kept, flagged")


class _Walk:
    """The second pass: the main chain from its root to its leaf made into step plans (an
    action per ``message.id``, a gap step per lost action), the task, the observation messages
    after each action and the compactions."""

    def __init__(self, r: _Reading, depth: array, load: Callable[[int], dict], diag: Diagnostics) -> None:
        self.r, self.depth, self.load, self.diag = r, depth, load, diag
        self.plans: list[_Plan] = []
        self.used_msgs: set[str] = set()
        self.plan_of: dict[str, _Plan] = {}  # message id -> the plan of its step
        self.taken: dict[str, int] = {}  # call id -> results paired so far
        self.first_call: dict[str, int] = {}  # call id -> line of its first call on the chain
        self.pending_context: list[str] = []
        self.boundary_line: int | None = None  # the compact_boundary line the walk passed last
        # results of calls no line holds: the line of that action was lost (a gap step)
        self.called = {cid for m in r.msgs.values() for ln in m.lines for cid, _ in ln.calls}

    def walk(self, path_ix: array) -> None:
        chain, result_lines = self.r.chain, self.r.result_lines
        for i in path_ix:
            k = chain.kind[i]
            if i in result_lines:  # a line with tool results: a gap step when they answer no call
                self.gap(i)
            if k == _BOUNDARY:
                self.boundary_line = chain.line[i]
            if k == _ASSISTANT:
                mid = chain.msg_id[i]
                if mid in self.used_msgs:
                    if i in chain.bridged:  # a later line of a reply over several lines: its step
                        self.plan_of[mid].bridged = True
                    continue
                self.used_msgs.add(mid)
                self.plan_of[mid] = self.plan(len(self.plans) + 1, self.r.msgs[mid])
                self.plans.append(self.plan_of[mid])
            elif k & 7 == _USER and i in chain.text_ref:
                self.user(i, k, chain.text_ref[i])
            if i in chain.bridged and self.plans and isinstance(self.plans[-1], _Plan):
                # a line lost before this one (its parent is not in the file): the step that
                # holds it, an assistant line's own or the one a user line is observation of
                self.plans[-1].bridged = True
        self.r.meta["task_context"] = self.pending_context

    def plan(self, n: int, m: _Msg) -> _Plan:
        """Step ``n``'s plan: the message's lines in chain order (depth in the parentUuid tree,
        file order breaking ties), usage and stop reason of the last line in that order that has
        them, and for each call its result: the k-th result with the call's id for the k-th call
        with it on the chain (``duplicate_call_id`` warned); ``interrupted`` warned, naming the
        call's line, for each call without one."""
        depth, results, taken, first_call, diag = (
            self.depth,
            self.r.results,
            self.taken,
            self.first_call,
            self.diag,
        )
        lines = sorted(m.lines, key=lambda ln: (depth[ln.index], ln.n))
        usage_ref = stop_reason = None
        found: list[Any] = []
        for ln in lines:
            if ln.usage:
                usage_ref = ln.ref
            if ln.stop_reason is not None:
                stop_reason = ln.stop_reason
            for cid, name in ln.calls:
                key = cid or ""
                k = taken.get(key, 0)
                taken[key] = k + 1
                if k:
                    diag.warn(
                        "duplicate_call_id",
                        f"line {ln.n}",
                        f"tool call id {cid} ({name}) used before (line {first_call[key]}); results "
                        "paired in order of appearance",
                    )
                else:
                    first_call[key] = ln.n
                have = results.get(key)
                res = (
                    have
                    if k == 0 and not isinstance(have, list)
                    else (have[k] if isinstance(have, list) and k < len(have) else None)
                )
                if res is None:
                    diag.warn(
                        "interrupted", f"line {ln.n}", f"tool call {cid} ({name}) has no result in the file"
                    )
                found.append(res)
        return _Plan(n, m, [ln.ref for ln in lines], found, usage_ref, stop_reason)

    def gap(self, i: int) -> None:
        """A gap step before chain line ``i`` when its tool results answer calls no line holds
        (``lost_action`` warned)."""
        r = self.r
        orphans = [cid for cid in r.result_lines[i][1] if cid not in self.called]
        if not orphans:
            return
        line = r.chain.line[i]
        gap = _Gap(len(self.plans) + 1, line, r.result_lines[i][0], tuple(orphans))
        self.plans.append(gap)  # type: ignore[arg-type]
        self.called.update(orphans)  # one gap per lost action
        self.diag.warn(
            "lost_action",
            f"line {line}",
            f"tool result(s) {', '.join(orphans)} answer a call no line of the file "
            f"holds: the action of step {gap.n} was lost; a gap step stands at its place",
        )

    def user(self, i: int, k: int, ref: int) -> None:
        """A user line with text on the chain: before the first action the task (the last
        prompt) or its context; after it an observation message of the last step, a compaction
        when it is the summary."""
        traj, plans = self.r.traj, self.plans
        if not plans:
            texts = _user_text(_content(self.load(ref)))
            if k & _META:
                self.pending_context.extend(texts)
            else:
                if traj.task is not None:
                    self.pending_context.append(traj.task)
                traj.task = texts[-1]
                self.pending_context.extend(texts[:-1])
            return
        last = plans[-1]
        if last.after is None:
            last.after = []
        last.after.append((ref, bool(k & _SUMMARY)))
        if k & _SUMMARY:
            self.compaction(i, ref, last)

    def compaction(self, i: int, ref: int, last: _Plan) -> None:
        """The compaction summary at chain line ``i`` after step ``last``: what the agent sends
        in place of the history before it (the observation messages after it follow it), and
        the steps it kept verbatim (``compactMetadata.preservedMessages``)."""
        r, boundary_line = self.r, self.boundary_line
        line = r.chain.line[i]
        r.meta["compactions"].append({"step": last.n, "line": line})
        summary = _observation_message(_content(self.load(ref)))
        text = "".join(p.text for p in summary.parts if isinstance(p, TextPart))
        where = f"line {boundary_line}" if boundary_line is not None else f"line {line}"
        c = Compaction(last.n, [summary], "compact_boundary", where, text, len(last.after))
        keep = (
            {r.chain.ids.get(u) for u in r.preserved.get(boundary_line, ())}
            if boundary_line is not None
            else set()
        )
        kept_steps = [
            p.n for p in self.plans if isinstance(p, _Plan) and any(ln.index in keep for ln in p.msg.lines)
        ]
        if kept_steps:
            c.steps_from = min(kept_steps)
        r.traj.compactions.append(c)


def _left_out_branches(r: _Reading, used_msgs: set[str], chosen: str) -> None:
    """Assistant messages the chain never reached (a rewound branch), left out saying which
    chain is the session."""
    for mid, m in r.msgs.items():
        if mid not in used_msgs:
            r.lo.add(
                m.first_line,
                "branch",
                f"assistant message {mid} is off the main chain (rewound or abandoned branch; {chosen})",
            )


def _is_subagent_transcript(path: Path) -> bool:
    """Whether ``path`` is a subagent's own transcript: it has user or assistant lines, every one
    a sidechain's. Reads up to the first main line (a session's first lines), so a whole file
    only when it is one (short); lines that are not JSON are skipped here (the scan says so)."""
    import orjson

    seen = False
    with open(path, "rb") as f:
        for raw in f:
            if b'"user"' not in raw and b'"assistant"' not in raw:
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("type") in ("user", "assistant"):
                if not obj.get("isSidechain"):
                    return False
                seen = True
    return seen


def _list_subagents(path: Path, meta: dict[str, Any], lo: LeftOutLines, diag: Diagnostics) -> None:
    """The subagent transcripts ``<session>/subagents/*.jsonl`` beside ``path``: listed in
    ``meta["subagents"]`` and left out, never mixed in. Only regular files directly in the
    session's own ``subagents`` directory (neither linked) are listed, by ``lstat``, never opened
    here: a FIFO would block, a link could name any file. Each other entry is a
    ``subagent_skipped`` warning naming it."""
    import stat

    sub_dir = os.path.join(os.path.splitext(path)[0], "subagents")  # Path.with_suffix("")
    try:
        mode = os.lstat(sub_dir).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        if stat.S_ISLNK(mode):
            diag.warn("subagent_skipped", sub_dir, "a link, not the session's own directory; not read")
        return
    try:
        names = sorted(os.listdir(sub_dir))
    except OSError as exc:
        diag.warn("subagent_skipped", sub_dir, f"cannot list it: {exc.strerror or exc}")
        return
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        f = os.path.join(sub_dir, name)
        try:
            regular = stat.S_ISREG(os.lstat(f).st_mode)
        except OSError:
            continue
        if not regular:
            diag.warn(
                "subagent_skipped", f, "not a regular file (a link, FIFO, device or directory); not read"
            )
            continue
        agent_id = name[: -len(".jsonl")].removeprefix("agent-")
        meta["subagents"].append({"path": f, "agent_id": agent_id})
        lo.append(
            LeftOut(f, "subagent", f"subagent transcript {agent_id}, linked in meta.subagents, not mixed in")
        )


class ClaudeCodeAdapter(NativeAdapter):
    name = "claude-code"
    description = "Claude Code session JSONL (~/.claude/projects/<cwd-slug>/<session>.jsonl)"
    profiles = (PROFILE,)

    reads_sidechains = True
    #: an assistant record's ``message.usage`` is the Messages API's
    usage_protocol = "anthropic"

    def read(self, path: Path, diag: Diagnostics, sidechain: str | None = None) -> NativeResult:
        """The records read by kind (:class:`_Reading`), the chain mended and its leaf chosen, the
        main chain walked into step plans (:class:`_Walk`), what is off it or beside the file left
        out; steps built lazily from the plans. The loop read is the main one, or a subagent's:
        a file without a user or assistant line off the sidechains is a subagent's transcript
        (``<session>/subagents/agent-<id>.jsonl``, :func:`_is_subagent_transcript`), read with
        its sidechain lines as the loop; ``sidechain`` reads the inline subagent of a main file
        whose lines carry that ``agentId`` (``#K``: the K-th chain of lines without one; ``*``: every
        sidechain line). ``meta["sidechain"]``:
        whether the loop read is a subagent's; ``meta["sidechains"]``: the inline subagents left
        out, ``[{"agent_id", "lines"}]`` (agent_id ``#K`` for the K-th chain of lines without one)."""
        if sidechain is None and _is_subagent_transcript(path):
            sidechain = "*"
        r = _Reading(sidechain)
        r.scan(path, diag)
        chain, traj, meta = r.chain, r.traj, r.meta
        chain.mend(diag)
        depth, talk = chain.depths()
        leaf = chain.leaf(depth, r.leaf_hint, talk)
        # why this leaf: said where a branch is left out (a rewind, an edited prompt)
        chosen = (
            f"the session is the chain ending at line {chain.line[leaf]}, {talk[leaf]} user and "
            "assistant lines"
            if leaf >= 0
            else ""
        )
        path_ix = chain.walk(leaf)
        source = JsonlSource(path)
        load = lambda ref: source.load(unpack_ref(ref))  # noqa: E731
        w = _Walk(r, depth, load, diag)
        w.walk(path_ix)
        plans = w.plans
        _left_out_branches(r, w.used_msgs, chosen)
        meta["sidechain"] = r.side
        meta["sidechains"] = [] if r.side else [{"agent_id": a, "lines": k} for a, k in r.sidechains.items()]
        if not r.side:
            _list_subagents(path, meta, r.lo, diag)
        del chain, depth, path_ix, w
        traj.steps = LazySteps(plans, lambda plan: self._step(plan, load))
        traj.model = next(
            (
                p.msg.model
                for p in plans
                if isinstance(p, _Plan) and p.msg.model and p.msg.model != "<synthetic>"
            ),
            None,
        )
        traj.meta = meta
        return NativeResult(traj, PROFILE, diag)

    @staticmethod
    def _step(plan: _Plan | _Gap, load: Callable[[int], dict]) -> Step:
        if isinstance(plan, _Gap):
            step = Step(n=plan.n, action=Action(), flags=["lost_action"])
            for b in _content(load(plan.ref)):
                if (
                    isinstance(b, dict)
                    and b.get("type") == "tool_result"
                    and b.get("tool_use_id") in plan.ids
                ):
                    step.observation.results.append(
                        ToolResult(
                            b["tool_use_id"], b.get("content"), is_error=bool(b.get("is_error", False)), raw=b
                        )
                    )
            for ref, _summary in plan.after or ():
                step.observation.messages.append(_observation_message(_content(load(ref))))
            return step
        m = plan.msg
        blocks: list[dict] = []
        time_ms = None
        for ref in plan.lines:
            line = load(ref)
            if time_ms is None:  # the reply's first line: when Claude Code began writing it
                time_ms = epoch_ms(line.get("timestamp"))
            blocks.extend(b for b in _content(line) if isinstance(b, dict))
        usage = load(plan.usage_ref)["message"]["usage"] if plan.usage_ref is not None else None
        action = Action(usage=usage, stop_reason=plan.stop_reason, model=m.model, raw=blocks)
        texts: list[str] = []
        for b in blocks:
            t = b.get("type")
            if t == "text":
                texts.append(as_str(b.get("text")) or "")
            elif t == "thinking":
                # an empty signature stays empty (as recorded, and as the agent sends it back): flagged below
                action.reasoning.append(
                    Reasoning(
                        text=as_str(b.get("thinking")) or "", signature=as_str(b.get("signature")), raw=b
                    )
                )
            elif t == "redacted_thinking":
                action.reasoning.append(Reasoning(encrypted=as_str(b.get("data")), raw=b))
            elif t in ("tool_use", "server_tool_use"):
                call = object_call(as_str(b.get("id")), as_str(b.get("name")) or "", b.get("input"), raw=b)
                if t == "server_tool_use":
                    call.kind = "server"
                action.tool_calls.append(call)
        action.text = "".join(texts)
        step = Step(n=plan.n, action=action, flags=signature_flags(action.reasoning), time_ms=time_ms)
        if plan.bridged:
            step.flags.append("broken_chain")
        if plan.interrupted:
            step.flags.append("interrupted")
        found = iter(plan.results)
        for call in action.tool_calls:
            if call.kind == "server":
                continue
            res = next(found, None)
            if res is None:
                step.observation.results.append(
                    ToolResult(call.id, "", is_error=None, name=call.name, raw={"interrupted": True})
                )
                continue
            ref, k = res if isinstance(res, tuple) else (res, 0)
            cid = call.id or ""
            block = [
                b
                for b in _content(load(ref))
                if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") == cid
            ][k]
            step.observation.results.append(
                ToolResult(
                    call.id, block.get("content"), is_error=bool(block.get("is_error", False)), raw=block
                )
            )
        for ref, summary in plan.after or ():
            step.observation.messages.append(_observation_message(_content(load(ref))))
            if summary:
                step.flags.append("compaction")
        return step


ADAPTER = ClaudeCodeAdapter()
