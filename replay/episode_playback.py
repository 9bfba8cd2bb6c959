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
when the main loop's matcher finds it one of its requests (or the subagent was not spawned
yet, the parent step not served); else the subagent's when its matcher does, or when it
diverged from the subagent's chain and is no main-loop request (or carries the subagent's
system prompt); anything else is answered as the main loop answers it (auxiliary requests from
the recording, a divergence of the main loop). Both chains' served replies are listed in
``served``, each with its ``episode``.

Pure, as :mod:`.playback`: no file, process or socket.
"""

from __future__ import annotations

from typing import Any

from pvisor.adapters.matcher import MatchKind, OnlineMatch
from pvisor.gateway.responder import Answer, IncomingRequest, Refuse
from pvisor.journal.model import Conversation

from .episodes import MAIN
from .playback import PathRewrites, PlaybackResponder
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

    async def respond(self, request: IncomingRequest) -> Answer:
        self.requests += 1
        got = self.parent.matched(request)
        if isinstance(got, Refuse):
            return got
        body, pm = got
        if pm.kind in _OWN or self.parent.matcher.answered < self.spawned_at:
            return await self._parent(request, body, pm)
        sm = self.matcher.match(request.method, request.path, request.query, body)
        if sm.kind in _OWN or (
            sm.kind is MatchKind.DIVERGED
            and (pm.kind is MatchKind.AUXILIARY or self.matcher.same_system(sm.conversation))
        ):
            return await self.answer(request, body, sm)
        return await self._parent(request, body, pm)

    async def _parent(self, request: IncomingRequest, body: bytes, m: OnlineMatch) -> Answer:
        """The main loop's answer; its divergence is the replay's (the status says diverged)."""
        out = await self.parent.answer(request, body, m)
        if self.divergence is None and self.parent.divergence is not None:
            self.divergence, self.diverged_exchange = self.parent.divergence, self.parent.diverged_exchange
        return out
