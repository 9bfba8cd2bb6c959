"""Playback of a handoff: agent B is served agent A's actions, translated into B's own tools.

B's tools are known only once B sends its request 1 (never assumed: docs/handoff.md). Until
then a :class:`HandoffReplay` (or :class:`HandoffContinuation`) answers what comes as auxiliary
requests; at the first request that offers one of B's shell tools (or, for an agent in text mode,
carries the task), it translates the source's steps 1..N (:func:`~pvisor.replay.translate.
translate`) against the tools that request declares, and from then on serves the translation as
playback serves any recording (:meth:`~pvisor.replay.playback.PlaybackResponder.load`): B's
requests 1..M get the translated actions, request M+1 ends at O″ and is the boundary (the
synthetic end of replay-only, or the live model of a continuation, with thinking turned off
where the protocol needs it). A translation B's schema refuses ends B at once with the
synthetic final reply; :attr:`HandoffPlayback.refused` holds why.

Pure like its bases but for one look at B's workspace when B's request 1 comes: whether the
files the history writes exist there yet (no process or socket).
"""

from __future__ import annotations

import os
from dataclasses import replace
from collections.abc import Callable, Mapping
from typing import Any

from pvisor.adapters.agents.effects import Effect
from pvisor.adapters.protocols import get_protocol
from pvisor.gateway.responder import Answer, IncomingRequest, Refuse, decode_or_refuse
from pvisor.journal.model import Conversation, TextPart

from .continuation import ContinuationResponder, LivePolicy
from .playback import PathRewrites, PlaybackResponder
from .recording import Recording
from .source_images import account_images
from .source_reasoning import SourceReasoning, keep_problem, signed_throughout
from .translate import Target, Translation, TranslationRefused, translate

#: the ``kind`` of the recording a handoff serves (the translation; never read from a file)
HANDOFF_KIND = "handoff"


def pending_recording(source: Recording, protocol: str, agent: str) -> Recording:
    """What B is served before its request 1: nothing (``source``'s task and model, B's
    ``protocol``)."""
    return replace(
        source,
        kind=HANDOFF_KIND,
        agent=agent,
        protocol=protocol,
        steps=[],
        requests=[],
        request_ids=[],
        replies=[],
        attempts=[],
        auxiliary=[],
        compactions=[],
        first_prompt=None,
        unrecorded=[],
        expected_task=source.task,
    )


class HandoffPlayback:
    """What both handoff responders add to playback (a mixin before the playback class):
    ``source`` (A's recording), ``source_descriptor``, ``source_n`` (the pause: A's steps kept),
    ``workspace`` (B's, absolute). After B's request 1: ``translation`` (None before, or when
    refused), ``refused`` (the :class:`~pvisor.replay.translate.TranslationRefused`, or None),
    ``request_one`` (B's request 1, parsed)."""

    source: Recording
    source_descriptor: Any
    source_n: int
    workspace: str
    source_reasoning: SourceReasoning
    translation: Translation | None
    refused: TranslationRefused | None
    request_one: Conversation | None

    def setup_handoff(
        self,
        source: Recording,
        source_descriptor: Any,
        source_n: int,
        workspace: str,
        changes: Mapping[int, list[tuple[str, bytes | None]]] | None = None,
        source_reasoning: SourceReasoning = SourceReasoning.DROP,
        existed: Callable[[int, str], bool | None] | None = None,
    ) -> None:
        self.source = source
        self.source_reasoning = source_reasoning
        self.existed = existed
        self.source_descriptor = source_descriptor
        self.source_n = source_n
        self.workspace = workspace
        self.changes = changes or {}
        self.translation = None
        self.refused = None
        self.request_one = None

    def _is_request_one(self, conv: Conversation) -> bool:
        """Whether ``conv`` is B's main-loop request 1: it offers one of B's shell tools, or (an
        agent in text mode, no tools) it carries the task."""
        return self._is_request_one_of(self.mod, conv)  # type: ignore[attr-defined]

    def _is_request_one_of(self, mod: Any, conv: Conversation) -> bool:
        d = self.descriptor  # type: ignore[attr-defined]
        tools = mod.offered_tools(conv)
        if any(d.effect_of(t.name).effect is Effect.SHELL for t in tools):
            return True
        if tools or d.text_command is None or not self.source.task:
            return False
        texts = [
            p.text for m in conv.messages if m.role == "user" for p in m.parts if isinstance(p, TextPart)
        ]
        return any(self.source.task in t for t in texts)

    def _translate(self, conv: Conversation) -> None:
        d = self.descriptor  # type: ignore[attr-defined]
        tools = self.mod.offered_tools(conv)  # type: ignore[attr-defined]
        protocol = self.rec.protocol  # type: ignore[attr-defined]
        # whether a file is in B's workspace as B starts (a write of a new file needs no read
        # first, docs/handoff.md): B ran none of the history yet, so the workspace is its start
        exists = os.path.lexists
        target = Target(
            d,
            protocol,
            tools,
            self.workspace,
            self.source.workspace,
            self.changes,
            exists,
            self.existed,
            source_reasoning=self.source_reasoning,
        )
        self.request_one = conv
        steps = self.source.steps[: self.source_n]
        try:
            if self.source_reasoning is SourceReasoning.KEEP:
                # B's protocol and model are known only now (an agent may pick them by its model)
                why = keep_problem(steps, self.source.protocol, self.source.model, protocol, conv.model)
                if why is not None:
                    raise TranslationRefused(why)
            tr = translate(steps, self.source_descriptor, target)
            tr.images = account_images(steps, tr.calls, d, protocol)
        except TranslationRefused as exc:
            self.refused = exc
            return
        except Exception as exc:  # noqa: BLE001 - a bug must end the agent, not the gateway's answer
            self.refused = TranslationRefused(
                f"the translation of the source failed ({type(exc).__name__}: {exc}); this is a bug of "
                "pvisor's handoff: please report it with the source"
            )
            return
        self.translation = tr
        m = len(tr.steps)
        rec = replace(
            self.rec,  # type: ignore[attr-defined]
            steps=tr.steps,
            requests=[conv],
            request_ids=[f"handoff step {k}" for k in range(1, m + 1)],
            replies=[None] * m,
            attempts=[1] * m,
            model=conv.model or self.source.model,
        )
        self.load(rec, m)  # type: ignore[attr-defined]

    async def respond(self, request: IncomingRequest) -> Answer:
        if self.translation is None and self.refused is None:
            body = decode_or_refuse(request)
            if isinstance(body, Refuse):
                return body
            conv = self._conversation(request, body)
            if conv is None or not self._is_request_one(conv):
                self.requests += 1  # type: ignore[attr-defined]
                return self.auxiliary_request(request, body, conv, "before request 1")  # type: ignore[attr-defined]
            self._translate(conv)
            if self.refused is not None:
                self.requests += 1  # type: ignore[attr-defined]
                return self.end_agent(request, conv, 1, conv.stream, "handoff_refused")  # type: ignore[attr-defined]
        elif self.refused is not None:
            body = decode_or_refuse(request)
            if isinstance(body, Refuse):
                return body
            conv = self._conversation(request, body)
            self.requests += 1  # type: ignore[attr-defined]
            if conv is None:
                return self.auxiliary_request(request, body, None, "after the refusal")  # type: ignore[attr-defined]
            return self.end_agent(request, conv, 1, conv.stream, "handoff_refused")  # type: ignore[attr-defined]
        return await super().respond(request)  # type: ignore[misc]

    def normalised_recorded(self, content: Any) -> str:
        """O normalised by the source agent's descriptor (its own decorations, then what its
        shell wraps around a command's output), so that it compares with O″ of another agent."""
        text = self.normalised(content, self.source_descriptor)  # type: ignore[attr-defined]
        return self.source_descriptor.shell_output(text).strip()

    def normalised_replayed(self, content: Any) -> str:
        """O″ normalised by B's descriptor, without what B's shell wraps around the output."""
        return self.descriptor.shell_output(self.normalised(content)).strip()  # type: ignore[attr-defined]

    def _conversation(self, request: IncomingRequest, body: bytes) -> Conversation | None:
        """``body`` parsed as a model request of the protocol B speaks, or None (another path, a
        token count, a body that does not parse). Before B's request 1 the protocol is the one
        of B's protocols whose paths the request's is (an agent that picks its protocol by its
        model, mini-swe-agent, or by its provider, OpenCode, is told by what it sends)."""
        if request.method.upper() != "POST":
            return None
        mod = self.mod  # type: ignore[attr-defined]
        if self.translation is None and not mod.matches(request.path):
            for name in self.descriptor.protocols:  # type: ignore[attr-defined]
                other = get_protocol(name)
                if other.matches(request.path):
                    mod = other
                    break
        if not mod.matches(request.path) or mod.counts_tokens(request.path):
            return None
        try:
            conv = mod.parse_request(body)
        except Exception:  # a body the protocol cannot read: auxiliary, as the matcher has it
            return None
        if mod is not self.mod and self._is_request_one_of(mod, conv):  # type: ignore[attr-defined]
            self.mod = mod
            self.rec = replace(self.rec, protocol=mod.NAME)  # type: ignore[attr-defined]
        return conv


class HandoffReplay(HandoffPlayback, PlaybackResponder):
    """Replay-only of a handoff: B re-runs the translated history and ends at request M+1."""

    def __init__(
        self,
        source: Recording,
        source_descriptor: Any,
        source_n: int,
        descriptor: Any,
        protocol: str,
        rewrites: PathRewrites,
        workspace: str,
        changes: Mapping[int, list[tuple[str, bytes | None]]] | None = None,
        source_reasoning: SourceReasoning = SourceReasoning.DROP,
        existed: Callable[[int, str], bool | None] | None = None,
    ) -> None:
        PlaybackResponder.__init__(
            self, pending_recording(source, protocol, descriptor.name), 0, descriptor, rewrites
        )
        self.setup_handoff(source, source_descriptor, source_n, workspace, changes, source_reasoning, existed)


class HandoffContinuation(HandoffPlayback, ContinuationResponder):
    """A handoff continued with the live model from B's request M+1 (thinking turned off where B's
    protocol would need the signed thinking of replies no live model produced; left on when
    ``--source-reasoning keep`` kept signed thinking on every served reply)."""

    def __init__(
        self,
        source: Recording,
        source_descriptor: Any,
        source_n: int,
        descriptor: Any,
        protocol: str,
        rewrites: PathRewrites,
        workspace: str,
        policy: LivePolicy,
        changes: Mapping[int, list[tuple[str, bytes | None]]] | None = None,
        source_reasoning: SourceReasoning = SourceReasoning.DROP,
        existed: Callable[[int, str], bool | None] | None = None,
    ) -> None:
        ContinuationResponder.__init__(
            self,
            pending_recording(source, protocol, descriptor.name),
            0,
            descriptor,
            rewrites,
            replace(policy, reasoning_off=True),
        )
        self.setup_handoff(source, source_descriptor, source_n, workspace, changes, source_reasoning, existed)

    def _translate(self, conv: Conversation) -> None:
        super()._translate(conv)
        tr = self.translation
        if tr is not None and self.source_reasoning is SourceReasoning.KEEP and signed_throughout(tr.steps):
            # every served reply starts with A's signed thinking, kept: thinking can stay on
            self.policy = replace(self.policy, reasoning_off=False)
