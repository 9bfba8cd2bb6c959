"""Playback: the responder that serves recorded actions to a live agent, and what it found.

:class:`PlaybackResponder` plugs into the gateway's responder seam
(:mod:`pvisor.gateway.responder`). For each request the agent sends, the online matcher
(:class:`pvisor.adapters.matcher.OnlineMatcher`) says what it is:

- **main-loop request k <= N**: answered with A_k, the recorded action. From a journal the
  recorded response bytes are served as they are when the agent asks for the same stream mode
  and no path rewrite touches the action; otherwise the action is rendered in the protocol
  (streamed when asked). No pacing. A retry of k gets A_k again.
- **request N+1**: its body, which ends at O'_N, is kept as the recorded prefix; the agent is
  answered with the descriptor's synthetic final reply (``synthetic_end``), which ends it. A
  later main-loop request (the agent went on anyway) gets the same reply again.
- **auxiliary**: answered from a recorded auxiliary exchange with the same key, consumed in
  order, else with a minimal valid reply; each is listed.
- **diverged**: the first divergence is kept; the agent is answered with the synthetic final
  reply so that it ends, and the replay's status is ``diverged``.

Absolute paths: the recorded workspace and home in the arguments the descriptor names
(:attr:`~pvisor.adapters.agents.descriptor.AgentDescriptor.path_arguments`) are rewritten to
the new ones before serving (each rewrite listed); the matcher compares modulo the rewrite. A
rewrite never makes a path that leaves the new place once normalised (``OLD_WS/../x`` would
become ``NEW_WS/../x``): such an argument is served as recorded, and the plan made before the
agent starts lists it (:mod:`pvisor.replay.plan`, reason ``rewrite_leaves_workspace``).

What comes after N is three methods, :meth:`~PlaybackResponder.at_boundary`,
:meth:`~PlaybackResponder.beyond` and :meth:`~PlaybackResponder.auxiliary_request`: replay-only
ends the agent; a continuation (:mod:`pvisor.replay.continuation`) overrides them and forwards.
Playback also remembers what it served that a live model would be asked about: the reasoning
keys of each reply, and for Responses the conversation behind each served response id, so that
a request naming one by ``previous_response_id`` is expanded into the whole conversation before
it is matched.

Pure: no file, process or socket; :meth:`PlaybackResponder.respond` never waits, but at request
N+1 with an :attr:`~PlaybackResponder.on_boundary` hook (a handoff's ``--reset-to-pause``), which
runs once the gateway's snapshot of that request was taken. Its findings
are read with :meth:`PlaybackResponder.tool_calls` and the attributes, and laid out as the
result document by :func:`replay_only_result`.
"""

from __future__ import annotations

import asyncio
import enum
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

import orjson
from pvisor.adapters.journal_trajectory import SYNTHETIC_END as FLAG_SYNTHETIC_END
from pvisor.adapters.matcher import Divergence, MatchKind, OnlineMatch, OnlineMatcher, refused_tools
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import IdSource, compact_json
from pvisor.adapters.protocols.replies import minimal_reply, render_reply
from pvisor.core.errors import BadInputError
from pvisor.gateway.responder import (
    Answer,
    IncomingRequest,
    Refuse,
    Serve,
    ServedBy,
    decode_or_refuse,
    serve_reply,
)
from pvisor.journal.model import Action, Conversation, ToolCall, ToolResult
from pvisor.journal.redact import REQUEST_HEADER_ALLOW, redact_exchange_meta

from .plan import stays_below
from .prefix import append_action, request_meta
from .recording import RecordedReply, Recording, aux_key
from .result_parts import match_results
from .result import ToolCallRecord, arguments_record, content_sha256
from .source import finish_at, is_made_up

#: flags playback journals with the exchanges it answers (``exchanges.flags``)
FLAG_DIVERGED = "diverged"
FLAG_RETRY = "retry"
FLAG_AFTER_END = "after_end"
FLAG_AUX_MINIMAL = "auxiliary_minimal"


class PlaybackStatus(str, enum.Enum):
    """How a playback went (the result's ``status``)."""

    OK = "ok"
    DIVERGED = "diverged"
    FAILED = "failed"


class ServedFrom(str, enum.Enum):
    """Where the bytes of a served action came from."""

    RECORDED = "recorded"  #: the recorded response bytes, as they were
    RENDERED = "rendered"  #: the action rendered in the protocol


class PathRewrites:
    """Recorded absolute paths and the new ones: ``pairs`` of (recorded, new, role), role
    ``workspace`` or ``home`` (longest recorded path first, so a home inside a run directory
    is rewritten before it)."""

    def __init__(self, pairs: list[tuple[str, str, str]]):
        self.pairs = sorted(
            (
                (o.rstrip("/"), n.rstrip("/"), r)
                for o, n, r in pairs
                if o and n and o.rstrip("/") != n.rstrip("/")
            ),
            key=lambda p: -len(p[0]),
        )
        # one pass over the text, longest path first: a new path that extends a recorded one
        # (ws -> ws2) is never rewritten twice
        self._old = _alternation([o for o, _, _ in self.pairs])
        self._to_new = {o: n for o, n, _ in self.pairs}
        both = {o: r for o, _, r in self.pairs} | {n: r for _, n, r in self.pairs}
        self._any = _alternation(list(both))
        self._role = both
        private = sorted({n for _, n, r in self.pairs if r in ("home", "run_dir")}, key=len, reverse=True)
        self._private = (
            re.compile("(" + "|".join(re.escape(p) for p in private) + r")(?:/[^\s`'\")\]]*)?")
            if private
            else None
        )

    def value(self, text: str) -> str | None:
        """The rewritten path when ``text`` is a recorded path or lies below one and the new
        path stays below the new one once normalised (:func:`~pvisor.replay.plan.stays_below`),
        else None (a ``..`` that climbs out of the recorded workspace is not carried into the
        new one)."""
        for old, new, _ in self.pairs:
            if text == old or text.startswith(old + "/"):
                rest = text[len(old) :]
                return new + rest if stays_below(rest) else None
        return None

    def text(self, text: str) -> str:
        """Every recorded path in ``text`` replaced by the new one."""
        if self._old is None:
            return text
        return self._old.sub(lambda m: self._to_new[m.group(0)], text)

    def mask_private(self, text: str) -> str:
        """Paths below a new home or run directory masked whole (``<home>/...``): their names
        are made from the workspace's (Claude Code's project slug, Gemini CLI's project dir)."""
        if self._private is None:
            return text
        return self._private.sub(lambda m: f"<{self._role[m.group(1)]}>/...", text)

    def placeholders(self, text: str) -> str:
        """Recorded and new paths alike replaced by ``<workspace>`` / ``<home>`` /
        ``<run_dir>``, so that an observation of the recording and one of the replay compare
        equal when only they differ."""
        if self._any is None:
            return text
        return self._any.sub(lambda m: f"<{self._role[m.group(0)]}>", text)


def _alternation(paths: list[str]) -> "re.Pattern[str] | None":
    """A pattern matching any of ``paths`` (longest first), or None for none."""
    if not paths:
        return None
    return re.compile("|".join(re.escape(p) for p in sorted(set(paths), key=len, reverse=True)))


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        if isinstance(value.get("text"), str):
            out.append(value["text"])
            return
        for k in sorted(value):
            if k not in ("type", "id", "call_id", "tool_use_id", "cache_control", "name"):
                _strings(value[k], out)


def _calls(action: Action) -> list[ToolCall]:
    return [c for c in action.tool_calls if c.kind != "server"]


@dataclass(slots=True)
class Served:
    """One answer to a main-loop request: ``request`` k, the gateway's ``exchange`` id,
    ``source`` (:class:`ServedFrom`), ``recorded_exchange`` (journal sources), ``retry``;
    ``episode``: the episode whose request k it answered, in a replay of a subagent episode
    (``main`` or the subagent's id; None otherwise)."""

    request: int
    exchange: str
    source: ServedFrom
    recorded_exchange: str | None
    retry: bool = False
    episode: str | None = None


@dataclass(slots=True)
class Rewrite:
    """A path rewritten in a served action: ``step``, ``call_id``, ``tool``, ``argument``,
    ``recorded``, ``replayed``."""

    step: int
    call_id: str | None
    tool: str
    argument: str
    recorded: str
    replayed: str


@dataclass(slots=True)
class AuxAnswer:
    """An auxiliary request and its answer: ``exchange``, ``method``, ``path``, ``reason``
    (why it is auxiliary), ``answered_from`` (a recorded exchange id, or ``minimal``)."""

    exchange: str
    method: str
    path: str
    reason: str
    answered_from: str


@dataclass(slots=True)
class SyntheticEnd:
    """The synthetic final reply served: ``exchange``, ``request`` k, ``text``, ``tool_calls``
    (names), ``reason`` (``boundary``, ``diverged``, ``after_end``)."""

    exchange: str
    request: int
    text: str
    tool_calls: list[str]
    reason: str


@dataclass(slots=True)
class Boundary:
    """Request N+1 as the agent sent it: the decoded ``body``, its ``meta``
    (prefix.request.json), the ``exchange`` id, its parsed ``conversation``."""

    body: bytes
    meta: dict[str, Any]
    exchange: str
    conversation: Conversation


class PlaybackResponder:
    """Serves recording ``rec`` up to step ``after_step`` (module docstring).

    ``rewrites``: recorded -> new paths; ``descriptor``: the agent's. ``ended`` is set once the
    agent has been given its synthetic final reply (the orchestration then expects it to exit).
    Raises nothing from :meth:`respond`: a body it cannot decode is a 400 refusal.
    """

    def __init__(self, rec: Recording, after_step: int, descriptor: Any, rewrites: PathRewrites):
        self.descriptor = descriptor
        self.rewrites = rewrites
        self.mod = get_protocol(rec.protocol)
        self.load(rec, after_step)
        self.ended = asyncio.Event()
        self.served: list[Served] = []
        #: the episode whose chain this responder serves, named in :attr:`served` (a replay of a
        #: subagent episode: :mod:`.episode_playback`), or None
        self.episode_id: str | None = None
        self.auxiliary: list[AuxAnswer] = []
        self.differences: list[Any] = []
        self.divergence: Divergence | None = None
        self.diverged_exchange: str | None = None
        self.boundary: Boundary | None = None
        self.synthetic: list[SyntheticEnd] = []
        #: (k, conversation, request, decoded body) of the furthest main-loop request seen
        self.latest: tuple[int, Conversation, IncomingRequest, bytes] | None = None
        self.requests = 0
        #: reasoning keys of every reply playback served (``reasoning_keys`` of the protocol
        #: module): what a live model would refuse as another model's or a script's
        self.served_reasoning: set[str] = set()
        #: Responses: response id of a served reply -> the whole conversation up to its output,
        #: so that a request pointing at it by ``previous_response_id`` can be expanded
        self.served_history: dict[str, list] = {}
        self.expansions: list[dict[str, Any]] = []
        #: exchange id -> the expanded body (sent instead of the agent's when forwarded)
        self.expanded_bodies: dict[str, bytes] = {}
        #: told k for each main-loop request k (the command line's progress: requests up to N + 1)
        self.on_request: Callable[[int], None] | None = None
        #: called once when request N+1 came, before it is answered or forwarded (a handoff's
        #: ``--reset-to-pause``: the pause's snapshot restored into the workspace), or None
        self.on_boundary: Callable[[], None] | None = None
        #: O'_k: the tool results request k+1 sent after its last reply, as first sent
        self._observed: dict[int, list[ToolResult]] = {}

    def load(self, rec: Recording, after_step: int) -> None:
        """Serve ``rec`` up to ``after_step`` from now on (the constructor's, and a handoff's once
        it has translated the source into the tools the agent declared in its request 1): the
        actions as served, the finish action, the online matcher."""
        self.rec = rec
        self.n = after_step
        self.rewritten: list[Rewrite] = []
        #: why O_N is never sent (A_N, the recording's last step, is the agent's finish action:
        #: the agent ends after it, as after an A_N without a tool call), or None
        self.finish = finish_at(self.descriptor, rec.steps, after_step)
        self.actions: list[Action] = [
            self._rewrite(i + 1, self.descriptor.reply_action(rec.protocol, s.action))
            for i, s in enumerate(rec.steps[:after_step])
        ]
        self.matcher = OnlineMatcher(
            rec.protocol,
            self.actions,
            task=rec.expected_task,
            prompt=rec.first_prompt,
            recorded=rec.requests,
            descriptor=self.descriptor,
            rewrite=self.rewrites.text,
            nearest=rec.nearest,
            mask=self.rewrites.mask_private,
            dropped=[s.n for s in rec.steps[:after_step] if "action_dropped_by_agent" in s.flags],
            compactions=rec.compactions,
            refused_tools=refused_tools(rec.steps[:after_step]),
        )
        self._aux_pool: dict[tuple, list] = {}
        for a in rec.auxiliary:
            self._aux_pool.setdefault(a.key, []).append(a)

    # ------------------------------------------------------------------ serving

    def _rewrite(self, step: int, action: Action) -> Action:
        names = self.descriptor.path_arguments
        if not self.rewrites.pairs or not names:
            return action
        calls = []
        changed = False
        for c in action.tool_calls:
            args = c.arguments
            keys = names.get(c.name, ())
            if isinstance(args, dict) and any(
                isinstance(args.get(k), str) and self.rewrites.value(args[k]) for k in keys
            ):
                new_args = dict(args)
                for k in keys:
                    v = args.get(k)
                    nv = self.rewrites.value(v) if isinstance(v, str) else None
                    if nv is not None:
                        new_args[k] = nv
                        self.rewritten.append(Rewrite(step, c.id, c.name, k, v, nv))
                c = replace(c, arguments_raw=compact_json(new_args), arguments=new_args, raw=None)
                changed = True
            calls.append(c)
        if not changed:
            return action
        return replace(action, tool_calls=calls, raw=None)

    def _expanded(self, request: IncomingRequest, body: bytes) -> bytes:
        """``body``, or when it points by ``previous_response_id`` at a reply playback served
        (server-side state no live model holds), the whole conversation it stands for."""
        expand = getattr(self.mod, "expand_previous_response", None)
        if expand is None or not self.served_history or b"previous_response_id" not in body:
            return body
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(obj, dict):
            return body
        new, record = expand(obj, self.served_history)
        if record is None:
            return body
        out = orjson.dumps(new)
        self.expansions.append({"exchange": request.exchange, **record})
        self.expanded_bodies[request.exchange] = out
        return out

    def _note_served(self, body: bytes, final: Any) -> None:
        """Remember what a served reply (its final response object) holds that a live model
        would be asked about later: its reasoning keys, and (Responses) the conversation of
        ``body`` (the request it answers, decoded and expanded) up to it."""
        if not isinstance(final, dict):
            return
        keys = getattr(self.mod, "reasoning_keys", None)
        if keys is not None:
            self.served_reasoning |= keys(final)
        items = getattr(self.mod, "conversation_items", None)
        rid = final.get("id")
        if items is not None and isinstance(rid, str):
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError:
                return
            if isinstance(obj, dict):
                self.served_history[rid] = items(obj, final)

    def _final_of(self, body: bytes, streamed: bool) -> Any:
        """The final response object of served bytes (reassembled when streamed), or None."""
        try:
            return self.mod.reassemble([body]).final if streamed else orjson.loads(body)
        except Exception:  # recorded bytes that do not read: nothing to remember about them
            return None

    def _summary_reply(self, exchange: str) -> RecordedReply | None:
        """The recorded reply of summary exchange ``exchange`` (taken out of the auxiliary pool:
        it answers one request)."""
        for pool in self._aux_pool.values():
            for i, aux in enumerate(pool):
                if aux.reply.exchange == exchange:
                    return pool.pop(i).reply
        return None

    def rewrites_made(self) -> list[tuple[str | None, Rewrite]]:
        """(episode, rewrite) of every path rewritten in the served actions, ``episode`` its
        :attr:`episode_id` (a subagent episode's replay lists its parent's too)."""
        return [(self.episode_id, r) for r in self.rewritten]

    def _rewritten_step(self, k: int) -> bool:
        return any(r.step == k for r in self.rewritten)

    async def respond(self, request: IncomingRequest) -> Answer:
        self.requests += 1
        got = self.matched(request)
        if isinstance(got, Refuse):
            return got
        return await self.answer(request, *got)

    def matched(self, request: IncomingRequest) -> "Refuse | tuple[bytes, OnlineMatch]":
        """(decoded body, the online matcher's answer) of ``request``, or the 400 refusal of a
        body that does not decode."""
        body = decode_or_refuse(request)
        if isinstance(body, Refuse):
            return body
        body = self._expanded(request, body)
        return body, self.matcher.match(request.method, request.path, request.query, body)

    async def answer(self, request: IncomingRequest, body: bytes, m: OnlineMatch) -> Answer:
        """The answer to ``request`` that the matcher found to be ``m`` (module docstring)."""
        if m.kind is MatchKind.AUXILIARY and m.compaction is not None:
            step = m.compaction.after_step
            if m.conversation is not None and step not in self._observed:
                # an agent that leaves the last results out of what it sends after the summary
                # (Codex) sends them in its summary request only
                results = _results_after_last_reply(m.conversation)
                if results:
                    self._observed[step] = results
            summary = self._summary_reply(m.compaction.exchange)
            if summary is not None and summary.streamed == m.stream:
                # the agent compacts again where it did: its summary request carries O', the
                # recorded summary is served so that the requests after it carry the recorded one
                self.auxiliary.append(
                    AuxAnswer(
                        request.exchange,
                        request.method,
                        request.path,
                        m.reason or "summary",
                        summary.exchange,
                    )
                )
                return Serve(
                    summary.status,
                    list(summary.headers),
                    body=summary.body,
                    streamed=summary.streamed,
                    served_by=ServedBy.PLAYBACK,
                )
        if m.kind is MatchKind.AUXILIARY:
            return self.auxiliary_request(request, body, m.conversation, m.reason or "auxiliary")
        conv = m.conversation
        assert conv is not None and m.request is not None
        k = m.request
        if self.on_request is not None:
            self.on_request(k)
        if m.kind is MatchKind.DIVERGED:
            if self.divergence is None:
                self.divergence, self.diverged_exchange = m.divergence, request.exchange
            return self._end(request, conv, k, m.stream, "diverged", (FLAG_DIVERGED, FLAG_SYNTHETIC_END))
        self.differences.extend(m.differences)
        if self.latest is None or k >= self.latest[0]:
            self.latest = (k, conv, request, body)
        if k >= 2 and k - 1 not in self._observed:
            self._observed[k - 1] = _results_after_last_reply(conv)
        if k <= self.n:
            self.matcher.answered_up_to(k)
            return self._serve(request, body, conv, k, m.stream, retry=m.kind is MatchKind.RETRY)
        if k == self.n + 1 and self.boundary is None:
            self.boundary = Boundary(body, _meta(request), request.exchange, conv)
            if self.on_boundary is not None:
                if request.workspace_read is not None:
                    # the snapshot of request N+1 reads what the replay left, before it is changed
                    await asyncio.shield(request.workspace_read)
                self.on_boundary()
            return self.at_boundary(request, body, conv, k, m.stream)
        return self.beyond(request, body, conv, k, m.stream)

    # ------------------------------------------------------------------ what comes after N
    # (replay-only ends the agent; a continuation overrides these three and forwards)

    def at_boundary(
        self, request: IncomingRequest, body: bytes, conv: Conversation, k: int, stream: bool
    ) -> Answer:
        """Request N+1 (kept as :attr:`boundary` already): replay-only ends the agent."""
        return self._end(request, conv, k, stream, "boundary", (FLAG_SYNTHETIC_END,))

    def beyond(
        self, request: IncomingRequest, body: bytes, conv: Conversation, k: int, stream: bool
    ) -> Answer:
        """A main-loop request after N+1 (or a retry of it): the synthetic final reply again."""
        return self._end(request, conv, k, stream, "after_end", (FLAG_SYNTHETIC_END, FLAG_AFTER_END))

    def auxiliary_request(
        self, request: IncomingRequest, body: bytes, conv: Conversation | None, reason: str
    ) -> Answer:
        """An auxiliary request: answered from the recording (or a minimal reply)."""
        return self._auxiliary(request, body, conv, reason)

    def _serve(
        self, request: IncomingRequest, body: bytes, conv: Conversation, k: int, stream: bool, retry: bool
    ) -> Serve:
        recorded: RecordedReply | None = self.rec.replies[k - 1] if k - 1 < len(self.rec.replies) else None
        flags = (FLAG_RETRY,) if retry else ()
        if (
            recorded is not None
            and recorded.streamed == stream
            and not self._rewritten_step(k)
            and 200 <= recorded.status < 300
        ):
            self.served.append(
                Served(k, request.exchange, ServedFrom.RECORDED, recorded.exchange, retry, self.episode_id)
            )
            self._note_served(body, self._final_of(recorded.body, recorded.streamed))
            return Serve(
                recorded.status,
                list(recorded.headers),
                body=recorded.body,
                streamed=recorded.streamed,
                served_by=ServedBy.PLAYBACK,
                flags=flags,
            )
        model = conv.model or self.rec.model or "model"
        final = self.mod.action_to_response(self.actions[k - 1], model=model, ids=IdSource(k))
        reply = render_reply(self.mod, self.actions[k - 1], model=model, stream=stream, seed=k, final=final)
        self._note_served(body, final)
        self.served.append(
            Served(
                k,
                request.exchange,
                ServedFrom.RENDERED,
                recorded.exchange if recorded else None,
                retry,
                self.episode_id,
            )
        )
        return serve_reply(reply, ServedBy.PLAYBACK, flags)

    def end_agent(
        self, request: IncomingRequest, conv: Conversation, k: int, stream: bool, reason: str
    ) -> Serve:
        """The descriptor's synthetic final reply to ``request`` (main-loop request ``k``), which
        ends the agent, listed with ``reason`` (a handoff whose translation was refused)."""
        return self._end(request, conv, k, stream, reason, (FLAG_SYNTHETIC_END,))

    def _end(
        self,
        request: IncomingRequest,
        conv: Conversation,
        k: int,
        stream: bool,
        reason: str,
        flags: tuple[str, ...],
    ) -> Serve:
        """The descriptor's synthetic final reply (it ends the agent), journaled with ``flags``."""
        action = self.descriptor.final_reply(conv)
        self.matcher.serve(k, action)
        self.synthetic.append(
            SyntheticEnd(request.exchange, k, action.text, [c.name for c in action.tool_calls], reason)
        )
        reply = render_reply(
            self.mod, action, model=conv.model or self.rec.model or "model", stream=stream, seed=1000 + k
        )
        self.ended.set()
        return serve_reply(reply, ServedBy.PLAYBACK, flags)

    def _auxiliary(
        self, request: IncomingRequest, body: bytes, conv: Conversation | None, reason: str
    ) -> Answer:
        key = aux_key(request.method, request.path, conv)
        pool = self._aux_pool.get(key) or []
        stream = conv.stream if conv is not None else False
        while pool:
            rec = pool.pop(0)
            if rec.reply.streamed == stream:
                self.auxiliary.append(
                    AuxAnswer(request.exchange, request.method, request.path, reason, rec.reply.exchange)
                )
                return Serve(
                    rec.reply.status,
                    list(rec.reply.headers),
                    body=rec.reply.body,
                    streamed=rec.reply.streamed,
                    served_by=ServedBy.PLAYBACK,
                )
        try:
            reply = minimal_reply(
                request.method, request.path, request.query, body, model=self.rec.model or "model"
            )
        except BadInputError as exc:
            self.auxiliary.append(
                AuxAnswer(request.exchange, request.method, request.path, reason, "refused")
            )
            return Refuse(400, "invalid_request_error", exc.message)
        self.auxiliary.append(AuxAnswer(request.exchange, request.method, request.path, reason, "minimal"))
        return serve_reply(reply, ServedBy.PLAYBACK, (FLAG_AUX_MINIMAL,))

    # ------------------------------------------------------------------ findings

    @property
    def status(self) -> PlaybackStatus:
        return PlaybackStatus.DIVERGED if self.divergence is not None else PlaybackStatus.OK

    def replayed_observations(self) -> list[list[ToolResult]]:
        """O'_1..O'_N as far as the agent sent them (from the furthest main-loop request: the
        tool results after each served reply, in the order sent; an observation that request no
        longer holds, the agent having compacted its history, from the first request that sent
        it); shorter when it stopped early."""
        if self.latest is None:
            return []
        if self.matcher.compactions:
            top = max(self._observed, default=0)
            return [self._observed.get(i, []) for i in range(1, min(top, self.n) + 1)]
        conv = self.latest[1]
        out: list[list[ToolResult]] = []
        current: list[ToolResult] | None = None
        for msg in conv.messages:
            if msg.role == "assistant":
                if current is None or current:
                    current = []
                    out.append(current)
                continue
            if current is not None:
                current.extend(p for p in msg.parts if isinstance(p, ToolResult))
        return out[: self.n]

    def normalised(self, content: Any, source: Any = None) -> str:
        """An observation's text, its decorations normalised (by ``source``'s descriptor first,
        when given: a handoff's recorded O is the source agent's) and its paths placeholders."""
        parts: list[str] = []
        _strings(content, parts)
        text = "\n".join(parts)
        if source is not None:
            text = source.normalise_output(text)
        return self.rewrites.placeholders(self.descriptor.normalise_output(text))

    def normalised_replayed(self, content: Any) -> str:
        """A replayed observation's content normalised for comparison with the recording's."""
        return self.normalised(content)

    def normalised_recorded(self, content: Any) -> str:
        """A recorded observation's content normalised for comparison with the replay's (a
        handoff normalises it with the source agent's descriptor)."""
        return self.normalised(content)

    def tool_calls(self) -> list[ToolCallRecord]:
        """``tool_calls`` of the result: per tool call of steps 1..N, its historical and
        replayed observation digests, ``equal`` (the same content) and ``equal_normalised``
        (the same once the descriptor's decorations are normalised and the recorded and new
        paths made placeholders)."""
        replayed = self.replayed_observations()
        out: list[dict[str, Any]] = []
        names = {c.id: c.name for s in self.rec.steps for c in s.action.tool_calls if c.id is not None}
        native = self.rec.kind == "native"
        for i, step in enumerate(self.rec.steps[: self.n]):
            calls = _calls(step.action)
            # the finish action's O_N was never sent (a native file may hold what the agent wrote)
            not_sent = self.finish is not None and i == self.n - 1
            # a native file may store a result otherwise than the agent sent it: compare what it sent
            results = (
                []
                if not_sent
                else [
                    self.descriptor.wire_result(self.rec.protocol, r, names) for r in step.observation.results
                ]
                if native
                else list(step.observation.results)
            )
            hist = [None if r is not None and is_made_up(r) else r for r in match_results(calls, results)]
            served_calls = _calls(self.actions[i])
            rep = match_results(served_calls, replayed[i]) if i < len(replayed) else [None] * len(calls)
            # a native file may store its own form of an id (Gemini CLI's <name>__<id>): the
            # agent's wire form, as prepare-only names it
            ids = [c.id for c in calls]
            if native:
                wire = [
                    p.id
                    for p in self.descriptor.wire_action(self.rec.protocol, step.action).parts
                    if isinstance(p, ToolCall) and p.kind != "server"
                ]
                ids = wire if len(wire) == len(calls) else ids
            for c, h, r, cid in zip(calls, hist, rep, ids):
                hs = content_sha256(h.content) if h is not None else None
                rs = content_sha256(r.content) if r is not None else None
                out.append(
                    ToolCallRecord(
                        step.n,
                        cid,
                        c.name,
                        c.kind,
                        *arguments_record(c.arguments_raw),
                        hs,
                        rs,
                        (hs == rs) if hs is not None and rs is not None else None,
                        (self.normalised_recorded(h.content) == self.normalised_replayed(r.content))
                        if h is not None and r is not None
                        else None,
                        r.call_id if r is not None else None,
                        not_sent,
                    )
                )
        return out


def _results_after_last_reply(conv: Conversation) -> list[ToolResult]:
    """The tool results of the messages after the last assistant message of a request."""
    last = max((i for i, m in enumerate(conv.messages) if m.role == "assistant"), default=-1)
    return [p for m in conv.messages[last + 1 :] for p in m.parts if isinstance(p, ToolResult)]


def _meta(request: IncomingRequest) -> dict[str, Any]:
    """prefix.request.json of a request: method, path, query and headers as the journal keeps
    them (secrets left out)."""
    red = redact_exchange_meta(request.query, request.headers, b"pvisor-prefix", allow=REQUEST_HEADER_ALLOW)
    return request_meta(request.method, request.path, red.query, red.headers, request.encoding)


# --------------------------------------------------------------------------- the result


def recorded_prefix(p: PlaybackResponder) -> tuple[bytes, dict[str, Any], str, bool] | None:
    """(body, request meta, exchange id, rendered) of the prefix the replay recorded: request
    N+1 as the agent sent it, byte for byte (its Content-Encoding undone); when none came
    because A_N made no tool call, or is the agent's finish action (:attr:`PlaybackResponder.finish`),
    and the agent ended by itself, request N with A_N appended (rendered, as prepare-only does
    at N = steps); None when the agent got no further."""
    if p.boundary is not None:
        return p.boundary.body, p.boundary.meta, p.boundary.exchange, False
    if (
        p.latest is not None
        and p.latest[0] == p.n
        and p.n > 0
        and (p.finish is not None or not _calls(p.actions[p.n - 1]))
    ):
        _, _, request, body = p.latest
        meta = _meta(request)
        meta["recorded_content_encoding"] = None  # rendered: not the bytes the agent sent
        return append_action(p.rec.protocol, body, p.actions[p.n - 1]), meta, request.exchange, True
    return None


def playback_record(p: PlaybackResponder) -> dict[str, Any]:
    """The playback fields of a replay-only result (docs/result-protocol.md): ``served``,
    ``path_rewrites``, ``auxiliary``, ``context_differences``, ``tool_differences``,
    ``divergence``, ``synthetic_end``, ``requests``."""
    return {
        "served": [
            {
                "request": s.request,
                "exchange": s.exchange,
                "source": s.source.value,
                "recorded_exchange": s.recorded_exchange,
                "retry": s.retry,
                **({"episode": s.episode} if s.episode is not None else {}),
            }
            for s in p.served
        ],
        "path_rewrites": [
            {
                "step": r.step,
                "call_id": r.call_id,
                "tool": r.tool,
                "argument": r.argument,
                "recorded": r.recorded,
                "replayed": r.replayed,
                **({"episode": episode} if episode is not None else {}),
            }
            for episode, r in p.rewrites_made()
        ],
        "auxiliary": [
            {
                "exchange": a.exchange,
                "method": a.method,
                "path": a.path,
                "reason": a.reason,
                "answered_from": a.answered_from,
            }
            for a in p.auxiliary
        ],
        "context_differences": [d.to_json() for d in p.differences if d.part != "tools"],
        "tool_differences": [d.to_json() for d in p.differences if d.part == "tools"],
        "divergence": {**p.divergence.to_json(), "exchange": p.diverged_exchange}
        if p.divergence is not None
        else None,
        "synthetic_end": [
            {
                "exchange": e.exchange,
                "request": e.request,
                "text": e.text,
                "tool_calls": e.tool_calls,
                "reason": e.reason,
            }
            for e in p.synthetic
        ],
        "requests": p.requests,
    }
