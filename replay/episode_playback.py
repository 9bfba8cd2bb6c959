"""Playback of a subagent episode (``pvisor replay --replay-only --episode ID``, docs/replay.md):
the live agent is started with the run's task; the main loop's recorded replies are served up
to the parent step S whose call spawned the subagent; the agent starts its subagent itself, and
the subagent's requests (another chain: its own system prompt and tools) get the subagent's
recorded replies 1..N; its request N+1 is the boundary, kept as the prefix and checked as the
main loop's is; then the replay ends as replay-only does (the synthetic final reply, to the
subagent and to every later main-loop request).

:class:`EpisodePlayback` is the subagent's :class:`~.playback.PlaybackResponder` (its findings:
the boundary, ``tool_calls``, the observations compared, are the subagent's) holding the main
loop's as :attr:`EpisodePlayback.parent`. Which chain a request belongs to: the main loop's
until the parent step was served; then the subagent's when its matcher finds it one of its
requests and the main loop's does not (when both do, as for a subagent's request 1 that
repeats the run's task: the subagent's when it carries the subagent's system prompt or the main
loop sees a retry); the main loop's when only its matcher does; a request both find diverged
is the subagent's when the main loop finds it auxiliary or it carries the subagent's system
prompt; anything else is answered as the main loop answers it (auxiliary requests from the
recording, a divergence of the main loop). A request of a sibling subagent (its user texts
hold the prompt of another subagent call of the main loop) is answered as the main loop
answers it too, never matched against this episode. Both chains' served replies are listed in
``served``, each with its ``episode``; so are the paths rewritten in both chains' actions
(``path_rewrites``).

Pure, as :mod:`.playback`: no file, process or socket.
"""

from __future__ import annotations

from typing import Any

from pvisor.adapters.matcher import MatchKind, OnlineMatch
from pvisor.adapters.spawned import prompts_of
from pvisor.gateway.responder import Answer, IncomingRequest, Refuse
from pvisor.journal.model import Conversation, TextPart

from .episodes import MAIN, subagent_calls
from .playback import PathRewrites, PlaybackResponder, Rewrite
from .recording import Recording

_OWN = (MatchKind.MAIN, MatchKind.RETRY)


class ParentPlayback(PlaybackResponder):
    """The main loop of a subagent episode's replay: served up to the parent step S; every
    main-loop request after S gets the synthetic final reply (``after_end``), never kept as a
    boundary: the boundary is the subagent's."""

    def at_boundary(
        self, request: IncomingRequest, body: bytes, conv: Conversation, k: int, stream: bool
    ) -> Answer:
        return self.beyond(request, body, conv, k, stream)


class EpisodePlayback(PlaybackResponder):
    """Serves subagent recording ``rec`` (its :attr:`~.recording.Recording.parent` the main
    loop's, up to the parent step) through the subagent's step ``after_step`` (module
    docstring). Raises nothing from :meth:`respond`."""

    def __init__(self, rec: Recording, after_step: int, descriptor: Any, rewrites: PathRewrites):
        assert rec.parent is not None and rec.episode is not None and rec.episode.parent_step is not None
        super().__init__(rec, after_step, descriptor, rewrites)
        self.episode_id = rec.episode.id
        self.spawned_at: int = rec.episode.parent_step
        parent = ParentPlayback(rec.parent, self.spawned_at, descriptor, rewrites)
        parent.episode_id = MAIN
        # one list of each for both chains, in the order things happened
        parent.served = self.served
        parent.auxiliary = self.auxiliary
        parent.synthetic = self.synthetic
        parent.differences = self.differences
        self.parent = parent
        self.sibling_prompts = _sibling_prompts(rec, descriptor)

    def rewrites_made(self) -> list[tuple[str | None, Rewrite]]:
        """The main loop's rewrites (steps 1..S), then the subagent's, each with its episode."""
        return [*self.parent.rewrites_made(), *super().rewrites_made()]

    async def respond(self, request: IncomingRequest) -> Answer:
        self.requests += 1
        got = self.parent.matched(request)
        if isinstance(got, Refuse):
            return got
        body, pm = got
        if self.parent.matcher.answered < self.spawned_at:
            return await self._parent(request, body, pm)
        sm = self.matcher.match(request.method, request.path, request.query, body)
        if sm.kind not in _OWN and self._siblings(sm.conversation):
            return await self._parent(request, body, pm)
        if self._subagents(pm, sm):
            return await self.answer(request, body, sm)
        return await self._parent(request, body, pm)

    def _subagents(self, pm: OnlineMatch, sm: OnlineMatch) -> bool:
        """Whether a request the main loop's matcher found ``pm`` and the subagent's ``sm`` is
        the subagent's (module docstring). Both chains claim it when the subagent's request 1
        repeats the run's task (a parent that passes it on): the subagent's when it carries the
        subagent's system prompt, or when the main loop sees only a request it answered before."""
        same = self.matcher.same_system(sm.conversation)
        if sm.kind in _OWN:
            return pm.kind not in _OWN or same or pm.kind is MatchKind.RETRY
        if pm.kind in _OWN:
            return False
        return sm.kind is MatchKind.DIVERGED and (pm.kind is MatchKind.AUXILIARY or same)

    def _siblings(self, conv: Conversation | None) -> bool:
        """Whether ``conv`` is a request of another subagent of the run: its user texts hold the
        prompt of another subagent call of the main loop (parallel subagents: the sibling's
        request 1, or a later one, which holds it too)."""
        if conv is None or not self.sibling_prompts:
            return False
        texts = [
            p.text for m in conv.messages if m.role == "user" for p in m.parts if isinstance(p, TextPart)
        ]
        return any(p in t for t in texts for p in self.sibling_prompts)

    async def _parent(self, request: IncomingRequest, body: bytes, m: OnlineMatch) -> Answer:
        """The main loop's answer; its divergence is the replay's (the status says diverged)."""
        out = await self.parent.answer(request, body, m)
        if self.divergence is None and self.parent.divergence is not None:
            self.divergence, self.diverged_exchange = self.parent.divergence, self.parent.diverged_exchange
        return out


def _sibling_prompts(rec: Recording, descriptor: Any) -> frozenset[str]:
    """The prompts (:func:`~pvisor.adapters.spawned.prompts_of`) of the main loop's
    subagent calls other than the episode's parent call, less the strings that call has too
    (a shared ``subagent_type``): what only another subagent's requests hold. The parent call
    is the one of its id at its step, else (ids the agent made up again) the first there whose
    prompt is in the episode's task."""
    assert rec.parent is not None and rec.episode is not None
    ep = rec.episode
    calls = [
        (n, call.id, set(prompts_of(call.arguments)))
        for n, call in subagent_calls(rec.parent.steps, descriptor)
    ]
    at = [k for k, (n, _, _) in enumerate(calls) if n == ep.parent_step]
    mine = [k for k in at if calls[k][1] == ep.parent_call_id] or [
        k for k in at if any(p in (ep.task or "") for p in calls[k][2])
    ][:1]
    own = {p for k in mine for p in calls[k][2]}
    return frozenset(p for k, c in enumerate(calls) if k not in mine for p in c[2]) - own
