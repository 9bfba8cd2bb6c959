"""The online matcher: which main-loop request of a recording an incoming request is, for playback.

Fed one request at a time (method, path, query, decoded body), :class:`OnlineMatcher` answers an
:class:`OnlineMatch`: the request's :class:`MatchKind` (main-loop request k, a retry of it, an
auxiliary request, or a divergence, described by a :class:`Divergence` in the manner of a VCR.py
miss), and the :class:`Difference` s from the recording that are not fatal. Its rules are in
docs/replay.md, "What playback answers"; the recording's compactions it meets again are
:class:`RecordedCompaction` s, made by :func:`recorded_compactions` from a
:class:`~pvisor.adapters.chains.Classification`. The offline chain rule, which classifies a whole
recorded run, is :mod:`pvisor.adapters.chains`; this module shares its summary recognition
(:func:`~pvisor.adapters.chains.summary_lines`, :func:`~pvisor.adapters.chains.summary_share`)
and its comparison of a reply with its echo (:func:`~pvisor.adapters.chains.said`).
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson

from pvisor.adapters.agents.descriptor import action_message
from pvisor.adapters.chains import (
    Classification,
    message_texts,
    said,
    summary_lines,
    summary_share,
)
from pvisor.adapters.echoes import renamed, same_said
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import ParseMemo
from pvisor.core.errors import BadInputError
from pvisor.journal.model import Action, Conversation, Exchange, Message, TextPart


class MatchKind(str, enum.Enum):
    """What an incoming request is to playback (:class:`OnlineMatcher`)."""

    MAIN = "main"  #: main-loop request k: it carries the served A_1..A_(k-1) and the task
    RETRY = "retry"  #: main-loop request k again (answered before)
    AUXILIARY = "auxiliary"  #: not a main-loop request (a title request, a probe, a memory request)
    DIVERGED = "diverged"  #: a main-loop request that does not carry what was served


@dataclass(slots=True)
class Divergence:
    """Where an incoming main-loop request left the recording, in the manner of a VCR.py miss:
    ``request`` k (1-based, the request it would be), ``message`` and ``part`` indices in the
    incoming request, ``expected`` and ``got`` (short renderings), ``reason`` (one sentence),
    ``nearest``: the recorded request it was matched against (an exchange id, or
    ``trajectory step K``)."""

    request: int
    message: int | None
    part: int | None
    expected: str | None
    got: str | None
    reason: str
    nearest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "message": self.message,
            "part": self.part,
            "expected": self.expected,
            "got": self.got,
            "reason": self.reason,
            "nearest": self.nearest,
        }

    def sentence(self) -> str:
        where = f"request {self.request}"
        if self.message is not None:
            where += f", message {self.message}" + (f" part {self.part}" if self.part is not None else "")
        text = f"{where}: {self.reason}"
        if self.expected is not None or self.got is not None:
            text += f" (expected {self.expected}, got {self.got})"
        if self.nearest:
            text += f"; nearest recorded request: {self.nearest}"
        return text


@dataclass(slots=True)
class Difference:
    """A difference between a replayed request and the recording that is not a divergence:
    ``request`` k, ``part`` (``system``, ``tools``, ``context``, ``compaction``), ``detail`` (one
    sentence)."""

    request: int
    part: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request, "part": self.part, "detail": self.detail}


@dataclass(slots=True)
class OnlineMatch:
    """The matcher's answer for one request: ``kind``; ``request`` k for MAIN, RETRY and
    DIVERGED (None otherwise); ``conversation`` (None when the body did not parse);
    ``reason`` why it is auxiliary; ``divergence``; ``differences`` found in it that were not
    reported for an earlier request; ``stream`` whether it asks for a stream."""

    kind: MatchKind
    request: int | None = None
    conversation: Conversation | None = None
    reason: str | None = None
    divergence: Divergence | None = None
    differences: list[Difference] = field(default_factory=list)
    stream: bool = False
    #: for the agent's summary request met again: the recorded compaction it belongs to
    compaction: "RecordedCompaction | None" = None


def first_difference(expected: Any, got: Any, where: str = "", n: int = 120) -> tuple[str, str]:
    """Where two normalised values (a served call and its echo) first differ, each side shown as
    ``path: value`` in at most ``n`` characters (``name: "Task"`` against ``name: "Agent"``,
    ``arguments.prompt: ...``; a string from a few characters before its first differing one):
    cutting both at the same place would hide a difference past the cut."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got), key=lambda x: (x != "name", str(x))):
            if expected.get(key, _ABSENT) != got.get(key, _ABSENT):
                path = f"{where}.{key}" if where else str(key)
                return first_difference(expected.get(key, _ABSENT), got.get(key, _ABSENT), path, n)
    head = f"{where}: " if where else ""
    if isinstance(expected, str) and isinstance(got, str):
        at = next((i for i, (x, y) in enumerate(zip(expected, got)) if x != y), min(len(expected), len(got)))
        start = max(0, at - 20)
        lead = "..." if start else ""
        return _short(head + lead + expected[start:], n), _short(head + lead + got[start:], n)

    def shown(v: Any) -> str:
        return "(absent)" if v is _ABSENT else _short(v, n)

    return _short(head + shown(expected), n), _short(head + shown(got), n)


#: a key one side of :func:`first_difference` lacks
_ABSENT = object()


def _short(value: Any, n: int = 120) -> str:
    text = (
        value
        if isinstance(value, str)
        else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode(errors="replace")
    )
    return text if len(text) <= n else text[: n - 3] + "..."


def _groups(messages: list[Message]) -> list[tuple[int, list[Message]]]:
    """Runs of consecutive assistant messages (one reply may be several items, Responses), each
    with the index of its first message."""
    out: list[tuple[int, list[Message]]] = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        if out and out[-1][0] + len(out[-1][1]) == i:
            out[-1][1].append(m)
        else:
            out.append((i, [m]))
    return out


def _user_texts(messages: list[Message]) -> list[str]:
    """The text parts of the user messages before the first assistant message."""
    out = []
    for m in messages:
        if m.role == "assistant":
            break
        if m.role == "user":
            out += [p.text for p in m.parts if isinstance(p, TextPart) and p.text]
    return out


def _collapse(text: str) -> str:
    return " ".join(text.split())


@dataclass(slots=True)
class RecordedCompaction:
    """A compaction of the recording, as playback meets it again: after step ``after_step``
    the agent asked for a summary with a request whose last user text was ``prompt`` (volatile
    parts masked), and request ``after_step + 1`` carried the reply, recognised by its
    ``summary_lines`` (:func:`summary_lines`), with ``kept`` (what the replies it kept after the
    summary say, :func:`said`) before the later steps' replies. Made by
    :func:`recorded_compactions` from a classification."""

    after_step: int
    prompt: str
    summary_lines: list[str]
    kept: list[tuple[str, list[Any]]]
    exchange: str = ""  #: the recorded summary exchange, whose reply playback serves again
    history_messages: int = 0  #: messages of request ``after_step + 1``, the first that carries the summary
    summary_sha256: str | None = None  #: of the summary reply's text

    def record(self) -> dict[str, Any]:
        """The result's ``prefix.compaction`` for a prefix or replay from the journal run."""
        return {
            "after_step": self.after_step,
            "kind": "summary_request",
            "where": f"exchange {self.exchange}",
            "history_messages": self.history_messages,
            "summary_sha256": self.summary_sha256,
        }


def _last_user_text(messages: list[Message]) -> str:
    last = next((m for m in reversed(messages) if m.role == "user"), None)
    return "".join(p.text for p in last.parts if isinstance(p, TextPart)) if last is not None else ""


def recorded_compactions(
    c: Classification, final_response: Callable[[Exchange], Any]
) -> list[RecordedCompaction]:
    """The compactions of the main chain of ``c`` (slots whose ``compaction`` is set), for
    :class:`OnlineMatcher`; ``final_response`` gives an exchange's final response object."""
    out: list[RecordedCompaction] = []
    if c.main is None:
        return out
    for i, slot in enumerate(c.main.slots):
        summary = slot.compaction
        if summary is None or summary.protocol is None:
            continue
        mod = get_protocol(summary.protocol)
        try:
            action = mod.response_to_action(final_response(summary.exchange))
            prompt = _last_user_text(summary.conversation().messages)
            kept = [said(mod, msgs) for _, msgs in _groups(slot.kept.conversation().messages)]
        except (BadInputError, TypeError, AttributeError):
            continue
        digest = (
            hashlib.sha256(action.text.encode("utf-8", "surrogatepass")).hexdigest() if action.text else None
        )
        out.append(
            RecordedCompaction(
                i, prompt, summary_lines(action.text), kept, summary.id, len(slot.kept.messages), digest
            )
        )
    return out


def refused_tools(steps: Iterable[Any]) -> set[str]:
    """The tools of ``steps`` (recorded steps: ``action.tool_calls``, ``observation.results``)
    whose every call was answered with an error result (``is_error``): the recorded agent may
    not have offered them (Claude Code answers "No such tool available"), so a request that
    does not offer them may still be the main loop."""
    called: dict[str, bool] = {}
    for s in steps:
        errors = {r.call_id: r.is_error for r in s.observation.results}
        for c in s.action.tool_calls:
            if c.kind != "server":
                called[c.name] = called.get(c.name, True) and errors.get(c.id) is True
    return {name for name, refused in called.items() if refused}


class OnlineMatcher:
    """Tells, one incoming request at a time, which main-loop request of a recording it is.

    The recording is what playback serves: ``served`` (A_1..A_N as served, path rewrites
    applied), the ``task`` (None: not checked) and ``recorded`` main-loop conversations (request
    k's, when the source has them; index 0 at least gives the system prompt, tools and context
    of the run). ``descriptor`` gives the agent's volatile context; ``rewrite`` maps recorded
    paths (workspace, home) to the new ones in texts; ``mask`` masks what else is volatile in a
    text once rewritten (paths below the new private home, whose names hold the workspace's);
    ``nearest`` names recorded request k for messages; ``dropped`` the steps whose action the
    agent left out of its history in the recording (``action_dropped_by_agent``: mini-swe-agent
    drops a reply it answers with a format error), so that request k carries the others only.
    Rules (docs/replay.md "What playback answers"):

    - not a POST to a model-API path, a token count, or a body that does not parse: auxiliary;
    - a main-loop candidate has the recording's tool names, or its system prompt modulo
      volatile context, or at least 80 % of its tool names; anything else is auxiliary;
    - the candidate's replies (runs of assistant messages) must be the served actions in order,
      once normalised (text and tool calls; reasoning, signatures and client ids ignored): k is
      their number plus one (plus the dropped steps before k: among the requests with as many
      replies, the one whose recorded request has as many messages, else the next one not yet
      answered). A reply that differs, or more replies than were served, is a
      divergence; so is a task missing from the user text before the first reply, and a tool
      the next served action calls that the request no longer offers;
    - k answered before is a retry;
    - system prompt, tools and context that differ modulo volatile context are listed
      (:class:`Difference`), once each, never fatal;
    - across a compaction of the recording (``compactions``): a request whose last user text
      is the recorded summary request's is that request again, auxiliary (playback answers it
      with the recorded summary); a request carrying the recorded summary is request
      ``after_step + 1`` plus its replies after the ones the agent kept, which must say what
      the recorded ones said; the task is not looked for (the summary replaced it).

    :meth:`serve` registers what was served at k beyond the recording (the synthetic end);
    after :meth:`go_live` (a continuation handed request N+1 to the live model) replies past
    step N are the live model's and are not checked.
    """

    def __init__(
        self,
        protocol: str,
        served: list[Action],
        *,
        task: str | None,
        recorded: list[Conversation],
        descriptor: Any,
        prompt: list[Any] | None = None,
        rewrite: Callable[[str], str] | None = None,
        nearest: Callable[[int], str | None] | None = None,
        mask: Callable[[str], str] | None = None,
        dropped: Iterable[int] = (),
        compactions: Iterable[RecordedCompaction] = (),
        refused_tools: Iterable[str] = (),
    ):
        self.protocol = protocol
        self.compactions = list(compactions)
        self.mod = get_protocol(protocol)
        self.served: dict[int, Action] = {i + 1: a for i, a in enumerate(served)}
        self.task = task
        self.prompt = prompt
        self.recorded = recorded
        self.descriptor = descriptor
        self.rewrite = rewrite or (lambda s: s)
        self.mask = mask or (lambda s: s)
        self.dropped = set(dropped)
        self.nearest = nearest or (lambda k: None)
        self.answered = 0
        #: replies of steps past this one are the live model's (None: every reply is served)
        self.live_after: int | None = None
        self._reported: set[tuple[str, str]] = set()
        first = recorded[0] if recorded else None
        self._tools = {t.name for t in self.mod.offered_tools(first)} if first is not None else set()
        self._system = self._masked(first.system) if first is not None and first.system is not None else None
        # a recording without tool definitions (a native file that stores none) learns them from
        # the first request that offers every tool the served actions call and carries the task
        self._learn = not self._tools
        # the tools a request must offer to be learned as the main loop: those called, but for
        # ``refused_tools`` (every recorded call of them answered an error: the recorded agent
        # may not have offered them either, as Claude Code under `pvisor run` has no TodoWrite)
        called = {c.name for a in served for c in a.tool_calls if c.kind != "server"}
        self._called = called - set(refused_tools)
        self._said = {k: said(self.mod, [action_message(a)]) for k, a in self.served.items()}
        # each request repeats the conversation: a memo reads only the messages not seen before,
        # and what a run of those messages says is kept by their identity
        self._memo = ParseMemo()
        self._said_of: dict[tuple[int, ...], tuple[str, list[Any]]] = {}
        self._prompts: dict[str, list[RecordedCompaction]] = {}
        for c in self.compactions:
            if c.prompt:
                self._prompts.setdefault(self._masked(c.prompt), []).append(c)

    def _said_group(self, msgs: list[Message]) -> tuple[str, list[Any]]:
        if not all(self._memo.holds(m) for m in msgs):
            return said(self.mod, msgs)
        key = tuple(id(m) for m in msgs)
        hit = self._said_of.get(key)
        if hit is None:
            hit = self._said_of[key] = said(self.mod, msgs)
        return hit

    def _masked(self, text: str | None, recorded: bool = True) -> str:
        text = text or ""
        if recorded:
            text = self.rewrite(text)
        return self.descriptor.mask_volatile(self.mask(text))

    def serve(self, k: int, action: Action) -> None:
        """Playback served ``action`` at main-loop request ``k`` (beyond the recording)."""
        self.served[k] = action
        self._said[k] = said(self.mod, [action_message(action)])

    def same_system(self, conv: Conversation | None) -> bool:
        """Whether ``conv`` (a request as the agent sent it) has the recording's system prompt,
        modulo volatile context: whose chain a request that diverged from two belongs to."""
        if conv is None or self._system is None:
            return False
        return self._masked(conv.system, recorded=False) == self._system

    def answered_up_to(self, k: int) -> None:
        self.answered = max(self.answered, k)

    def go_live(self, n: int) -> None:
        """From now on the replies after step ``n`` come from the live model: a request that
        carries them is main-loop request (their number + 1), never a divergence."""
        self.live_after = n

    def match(self, method: str, path: str, query: str, body: bytes) -> OnlineMatch:
        """The :class:`OnlineMatch` of one request (``body`` decoded)."""
        if self.mod.counts_tokens(path):
            return OnlineMatch(MatchKind.AUXILIARY, reason=f"{method} {path} asks for a token count")
        if method.upper() != "POST" or not self.mod.matches(path):
            return OnlineMatch(
                MatchKind.AUXILIARY, reason=f"{method} {path} is not a {self.protocol} model request"
            )
        try:
            conv = self.mod.parse_request(body, path=path, query=query, memo=self._memo)
        except BadInputError as exc:
            return OnlineMatch(
                MatchKind.AUXILIARY, reason=f"the body does not read as a request: {exc.message}"
            )
        stream = conv.stream
        names = {t.name for t in self.mod.offered_tools(conv)}
        if self._prompts:
            # the recorded compactions still ahead: the one after the step answered last first
            ahead = [
                c
                for c in self._prompts.get(self._masked(_last_user_text(conv.messages), recorded=False), ())
                if c.after_step >= self.answered
            ]
            if ahead:
                again = min(ahead, key=lambda c: c.after_step)
                return OnlineMatch(
                    MatchKind.AUXILIARY,
                    conversation=conv,
                    stream=stream,
                    compaction=again,
                    reason=(
                        "the agent's summary request (it compacts its context, "
                        f"as recorded after step {again.after_step})"
                    ),
                )
        if self._learn:
            why = self._not_learned(conv, names)
            if why is not None:
                return OnlineMatch(
                    MatchKind.AUXILIARY, conversation=conv, stream=stream, reason=f"not the main loop: {why}"
                )
            self._learn = False
            self._tools = names
            self._system = self._masked(conv.system, recorded=False)
        same_system = self._system is not None and self._masked(conv.system, recorded=False) == self._system
        union = names | self._tools
        close_tools = bool(union) and len(names & self._tools) / len(union) >= 0.8
        if not (names == self._tools or same_system or close_tools):
            why = "other tools" if names != self._tools else "another system prompt"
            return OnlineMatch(
                MatchKind.AUXILIARY,
                conversation=conv,
                stream=stream,
                reason=f"not the main loop: {why} ({len(names)} tools against {len(self._tools)})",
            )
        groups = _groups(conv.messages)
        comp = self._carried(conv) if self.compactions else None
        if comp is not None:
            kept, later = groups[: len(comp.kept)], groups[len(comp.kept) :]
            k = comp.after_step + 1 + len(later)
            out = OnlineMatch(MatchKind.MAIN, request=k, conversation=conv, stream=stream)
            divergence = (
                self._check_kept(kept, comp, k)
                or self._check_replies(later, conv, k, start=comp.after_step + 1)
                or self._check_tools(names, k)
            )
        else:
            k = self._request_number(len(groups), len(conv.messages))
            out = OnlineMatch(MatchKind.MAIN, request=k, conversation=conv, stream=stream)
            divergence = (
                self._check_replies(groups, conv, k)
                or self._check_task(conv, k)
                or self._check_prompt(conv, k)
                or self._check_tools(names, k)
            )
        if divergence is not None:
            out.kind, out.divergence = MatchKind.DIVERGED, divergence
            return out
        out.differences = self._differences(conv, names, same_system, k)
        if comp is None:
            missed = next((c for c in self.compactions if c.after_step + 1 == k), None)
            if missed is not None and ("compaction", str(missed.after_step)) not in self._reported:
                self._reported.add(("compaction", str(missed.after_step)))
                out.differences.append(
                    Difference(
                        k,
                        "compaction",
                        f"the recording compacted its history after step {missed.after_step} and "
                        "the replayed agent did not: give it the environment and arguments it compacted with "
                        "(the prefix holds the whole history instead)",
                    )
                )
        if k <= self.answered:
            out.kind = MatchKind.RETRY
        return out

    def _echoed(self, k: int, start: int = 1) -> list[int]:
        """The steps from ``start`` to before request ``k`` whose actions its history carries."""
        return [i for i in range(start, k) if i not in self.dropped]

    def _carried(self, conv: Conversation) -> RecordedCompaction | None:
        """The recorded compaction whose summary the request carries: at least half its lines,
        as the chain rule finds it; of several, the one with the most of its lines (two
        summaries may share lines), the later on a tie. None when none."""
        text = message_texts(conv.messages)
        best: tuple[float, int] | None = None
        found = None
        for i, c in enumerate(self.compactions):
            share = summary_share(c.summary_lines, text)
            if share >= 0.5 and (best is None or (share, i) > best):
                best, found = (share, i), c
        return found

    def _check_kept(
        self, groups: list[tuple[int, list[Message]]], comp: RecordedCompaction, k: int
    ) -> Divergence | None:
        """The replies the agent kept after the summary say what the recorded ones said."""
        for n, (at, msgs) in enumerate(groups):
            expected = comp.kept[n]
            got = self._said_group(msgs)
            if got != expected:
                return Divergence(
                    k,
                    at,
                    None,
                    _short(expected[0] or "a reply"),
                    _short(got[0] or "a reply"),
                    f"reply {n + 1} kept after the summary of the compaction after step {comp.after_step} "
                    "was changed",
                    self.nearest(k),
                )
        return None

    def _request_number(self, replies: int, messages: int) -> int:
        """Which request k carries ``replies`` runs of assistant messages (module rules)."""
        if not self.dropped:
            return replies + 1
        top = max(self.served, default=0) + 2
        candidates = [k for k in range(1, top + 1) if len(self._echoed(k)) == replies]
        if not candidates:
            return replies + 1 + len(self.dropped)
        if len(candidates) == 1:
            return candidates[0]
        same = [
            k
            for k in candidates
            if k - 1 < len(self.recorded) and len(self.recorded[k - 1].messages) == messages
        ]
        if len(same) == 1:
            return same[0]
        ahead = [k for k in candidates if k > self.answered]
        return ahead[0] if ahead else candidates[-1]

    def _check_replies(
        self, groups: list[tuple[int, list[Message]]], conv: Conversation, k: int, start: int = 1
    ) -> Divergence | None:
        order = self._echoed(k, start)
        for n, (at, msgs) in enumerate(groups):
            i = order[n] if n < len(order) else max(order, default=start - 1) + n - len(order) + 1
            if self.live_after is not None and i > self.live_after:
                continue  # the live model's reply: nothing to compare it with
            expected = self._said.get(i) if n < len(order) else None
            if expected is None:
                return Divergence(
                    k,
                    at,
                    None,
                    "no reply here",
                    _short(said(self.mod, msgs)[0] or "a reply"),
                    f"the request carries {len(groups)} replies, but only {len(self.served)} were served",
                    self.nearest(i),
                )
            got = self._said_group(msgs)
            aliases = getattr(self.descriptor, "echo_aliases", None) or {}
            if same_said(expected, got, aliases):
                continue
            expected = renamed(expected, aliases)
            if got[0] != expected[0]:
                return Divergence(
                    k,
                    at,
                    0,
                    _short(expected[0]),
                    _short(got[0]),
                    f"the text of served action A_{i} was changed",
                    self.nearest(k),
                )
            for j, (e, g) in enumerate(zip(expected[1], got[1])):
                if e != g:
                    shown_e, shown_g = first_difference(e, g)
                    return Divergence(
                        k,
                        at,
                        j,
                        shown_e,
                        shown_g,
                        f"tool call {j + 1} of served action A_{i} was changed",
                        self.nearest(k),
                    )
            return Divergence(
                k,
                at,
                None,
                f"{len(expected[1])} tool call(s)",
                f"{len(got[1])}",
                f"served action A_{i} comes back with another number of tool calls",
                self.nearest(k),
            )
        return None

    def _check_task(self, conv: Conversation, k: int) -> Divergence | None:
        if not self.task:
            return None
        texts = _user_texts(conv.messages)
        # as given, with its white space collapsed, or JSON-escaped (OpenCode quotes the prompt)
        escaped = json.dumps(self.task, ensure_ascii=False)[1:-1]
        if any(self.task in t or escaped in t for t in texts) or _collapse(self.task) in _collapse(
            " ".join(texts)
        ):
            return None
        # the agent's own context comes first: the last text is where its prompt stands
        return Divergence(
            k,
            0,
            None,
            _short(self.task),
            _short(texts[-1]) if texts else "no user text",
            "the task is not in the request",
            self.nearest(k),
        )

    def _check_prompt(self, conv: Conversation, k: int) -> Divergence | None:
        """Request 1 repeats the user's prompt of recorded request 1 (``prompt``: the agent's
        own context left out, :meth:`AgentDescriptor.prompt_parts`): the task given is the
        recorded one, not only a text the request holds. Texts are equal as sent, or with
        their volatile parts masked (mini-swe-agent's system information) and the recorded
        paths rewritten; other parts (images) by their raw form."""
        if k != 1 or self.prompt is None:
            return None
        got = self.descriptor.prompt_parts(conv)

        def same(e: Any, g: Any) -> bool:
            if isinstance(e, TextPart) and isinstance(g, TextPart):
                return e.text == g.text or self._masked(e.text) == self._masked(g.text, recorded=False)
            return type(e) is type(g) and getattr(e, "raw", None) == getattr(g, "raw", None)

        if len(got) == len(self.prompt) and all(same(e, g) for e, g in zip(self.prompt, got)):
            return None

        def shown(parts: list[Any]) -> str:
            texts = [
                p.text if isinstance(p, TextPart) else f"<{getattr(p, 'kind', type(p).__name__)}>"
                for p in parts
            ]
            return _short(" | ".join(texts)) if texts else "no prompt"

        return Divergence(
            k,
            None,
            None,
            shown(self.prompt),
            shown(got),
            "the user's prompt differs from recorded request 1's: the agent was not given the recorded task",
            self.nearest(k),
        )

    def _not_learned(self, conv: Conversation, names: set[str]) -> str | None:
        """Why ``conv`` (offering ``names``) is not the main loop's request 1 of a recording
        without tool definitions, or None: it offers every tool the actions call (but those
        refused in the recording) and carries the task."""
        unoffered = sorted(self._called - names)
        if unoffered:
            return f"it does not offer the tools the recorded actions call ({', '.join(unoffered)})"
        if not names:
            return "it offers no tools"
        if self._check_task(conv, 1) is not None:
            return "it lacks the task"
        return None

    def _check_tools(self, names: set[str], k: int) -> Divergence | None:
        """A divergence when served action A_k calls a tool the request (offering ``names``) no
        longer offers: one the recorded request k offered (or, where that one declares none,
        recorded request 1, or the request learned as the main loop). A tool not offered then
        either is no divergence: the agent answers it now as it did then."""
        action = self.served.get(k)
        if action is None or not names and not self._tools:
            return None
        then = self._tools
        if 0 < k <= len(self.recorded):
            then = {t.name for t in self.mod.offered_tools(self.recorded[k - 1])} or self._tools
        missing = [
            c.name for c in action.tool_calls if c.kind != "server" and c.name not in names and c.name in then
        ]
        if missing:
            return Divergence(
                k,
                None,
                None,
                ", ".join(missing),
                "not offered",
                f"served action A_{k} calls tool(s) the agent no longer offers: {', '.join(missing)}",
                self.nearest(k),
            )
        return None

    def _differences(
        self, conv: Conversation, names: set[str], same_system: bool, k: int
    ) -> list[Difference]:
        out: list[Difference] = []

        def note(part: str, key: str, detail: str) -> None:
            if (part, key) not in self._reported:
                self._reported.add((part, key))
                out.append(Difference(k, part, detail))

        if not same_system and self._system is not None:
            note("system", "", "the system prompt differs from the recorded one beyond its volatile context")
        added, removed = sorted(names - self._tools), sorted(self._tools - names)
        if added or removed:
            note("tools", f"{added}{removed}", f"tools added {added}, removed {removed}")
        recorded = self.recorded[min(k, len(self.recorded)) - 1] if self.recorded else None
        if recorded is not None:
            want = [self._masked(t) for t in _user_texts(recorded.messages)]
            got = [self._masked(t, recorded=False) for t in _user_texts(conv.messages)]
            if want != got:
                i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                note(
                    "context",
                    str(i),
                    f"the context before the first reply differs at text part {i} beyond its volatile parts",
                )
        return out
