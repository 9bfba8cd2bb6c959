"""Continuation: playback up to step N, then the live model (``pvisor replay`` without a mode flag).

:class:`ContinuationResponder` is a :class:`~pvisor.replay.playback.PlaybackResponder` that,
instead of ending the agent at request N+1, forwards it to the live upstream, and every
request after it (docs/replay.md "Continuation"):

- **request N+1** (its body, ending at O'_N, is the recorded prefix) is forwarded as the agent
  sent it, byte for byte, unless a rewrite below applies;
- **the boundary user prompt** (``--boundary-user-prompt``), when given, is placed once right
  after O'_N: at request N+1, and again at the same place in every later main-loop request,
  since the agent's own history never holds it (``insert_user_text`` of the protocol module);
- **reasoning** (``--reasoning strip``): thinking blocks, reasoning items and thought
  signatures of the replies playback served are removed or replaced per protocol
  (``strip_reasoning``), because the live API checks them against its own model and account;
  ``keep`` forwards them and the result reports a refusal (``reasoning_rejected``);
- **another model** (``--live-model``) is asked for in main-loop requests (``with_model``);
- **server-side state**: a request whose ``previous_response_id`` names a reply playback served
  was expanded into the whole conversation before matching (the base class); that body is
  what goes upstream;
- **the step budget** (``--max-steps K``): main-loop requests N+1..N+K go to the live model;
  request N+K+1 gets the descriptor's synthetic final reply, which ends the agent;
- **auxiliary requests** after N+1 are forwarded as they are (reasoning stripped when asked).

Each forwarded request is listed as a :class:`LiveRequest` (what the agent sent, what was
forwarded, and why they differ); what the upstream answered is read from the journal after the
run. Pure like its base: no file, process or socket; :meth:`respond` never waits.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from pvisor.adapters.journal_trajectory import SYNTHETIC_END as FLAG_SYNTHETIC_END
from pvisor.adapters.journal_trajectory import LiveContextFlag
from pvisor.gateway.responder import Answer, Forward, IncomingRequest
from pvisor.journal.model import Conversation
from pvisor.journal.redact import request_secrets

from .playback import PathRewrites, PlaybackResponder
from .recording import Recording

#: flags a continuation journals with the exchanges it forwards or ends (a request forwarded
#: rewritten also gets the LiveContextFlag of each rewrite, which its step then carries)
FLAG_LIVE = "live"
FLAG_STEP_BUDGET = "step_budget"


class ReasoningPolicy(str, enum.Enum):
    """``--reasoning``: what a continuation does with the reasoning of served replies."""

    KEEP = "keep"  #: forward it as the agent sends it; a refusal is reported
    STRIP = "strip"  #: rewrite it per protocol so that the live API accepts the request


class Change(str, enum.Enum):
    """Why a forwarded request differs from the bytes the agent sent."""

    EXPANDED = "previous_response_expanded"
    BOUNDARY_PROMPT = LiveContextFlag.BOUNDARY_PROMPT.value
    REASONING = LiveContextFlag.REASONING_STRIPPED.value
    MODEL = "live_model"


@dataclass(frozen=True)
class LivePolicy:
    """What a continuation does after N: ``max_steps`` (None: no budget; else at least 1),
    ``boundary_prompt`` (None: none), ``reasoning``, ``live_model`` (None: as the agent asks),
    ``reasoning_off``."""

    max_steps: int | None = None
    boundary_prompt: str | None = None
    reasoning: ReasoningPolicy = ReasoningPolicy.KEEP
    live_model: str | None = None
    #: turn the model's reasoning off in live main-loop requests (the protocol module's
    #: ``reasoning_off``): a handoff serves no reasoning, which a request with thinking on needs
    reasoning_off: bool = False


@dataclass(slots=True)
class LiveRequest:
    """One request forwarded to the live upstream.

    Fields: ``exchange`` id; ``request`` k (main-loop) or None (auxiliary); ``retry`` (k was
    forwarded before); ``sent_sha256`` of the body the agent sent (its Content-Encoding undone:
    the journal's ``request_body``); ``forwarded_sha256`` of the bytes forwarded (the agent's
    own bytes on the wire when nothing changed); ``byte_identical``; ``changes``
    (:class:`Change` values); ``rewrites`` (one dict each: ``of`` ``reasoning`` or ``model``, the protocol's
    ``kind`` and what changed);
    ``prompt_at`` (the entry index the boundary prompt went to, or None)."""

    exchange: str
    request: int | None
    retry: bool
    sent_sha256: str
    forwarded_sha256: str
    byte_identical: bool
    changes: list[str] = field(default_factory=list)
    rewrites: list[dict[str, Any]] = field(default_factory=list)
    prompt_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "exchange": self.exchange,
            "request": self.request,
            "role": "main" if self.request is not None else "auxiliary",
            "retry": self.retry,
            "sent_sha256": self.sent_sha256,
            "forwarded_sha256": self.forwarded_sha256,
            "byte_identical": self.byte_identical,
            "changes": list(self.changes),
            "rewrites": list(self.rewrites),
            "prompt_at": self.prompt_at,
        }


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ContinuationResponder(PlaybackResponder):
    """Serves ``rec`` through step ``after_step``, then forwards to the live upstream under
    ``policy`` (module docstring). Findings: :attr:`live` (every forwarded request),
    :attr:`live_steps` (main-loop requests k > N forwarded), :attr:`prompt_injected`,
    :attr:`prompt_misses` (later requests whose history no longer reaches the boundary),
    :attr:`budget_end` (the request the step budget ended)."""

    def __init__(
        self, rec: Recording, after_step: int, descriptor: Any, rewrites: PathRewrites, policy: LivePolicy
    ):
        super().__init__(rec, after_step, descriptor, rewrites)
        self.policy = policy
        self.live: list[LiveRequest] = []
        self.live_steps: list[int] = []
        self.boundary_at: int | None = None
        self.prompt_injected = False
        self.prompt_misses: list[dict[str, Any]] = []
        self.budget_end: int | None = None
        #: credentials the agent sent (kept in memory only: an upstream error quoted in the
        #: result is redacted with them)
        self.secrets: set[str] = set()

    # ------------------------------------------------------------------ after N

    def at_boundary(
        self, request: IncomingRequest, body: bytes, conv: Conversation, k: int, stream: bool
    ) -> Answer:
        self.matcher.go_live(self.n)
        try:
            obj = orjson.loads(body)
            self.boundary_at = len(self.mod.entries(obj)) if isinstance(obj, dict) else None
        except orjson.JSONDecodeError:
            self.boundary_at = None
        return self._forward(request, body, k)

    def beyond(
        self, request: IncomingRequest, body: bytes, conv: Conversation, k: int, stream: bool
    ) -> Answer:
        budget = self.policy.max_steps
        if budget is not None and k > self.n + budget:
            if self.budget_end is None:
                self.budget_end = k
            return self._end(request, conv, k, stream, "step_budget", (FLAG_SYNTHETIC_END, FLAG_STEP_BUDGET))
        return self._forward(request, body, k)

    def auxiliary_request(
        self, request: IncomingRequest, body: bytes, conv: Conversation | None, reason: str
    ) -> Answer:
        if self.boundary is None:
            return super().auxiliary_request(request, body, conv, reason)
        return self._forward(request, body, None)

    # ------------------------------------------------------------------ forwarding

    def _forward(self, request: IncomingRequest, body: bytes, k: int | None) -> Forward:
        """Forward ``request`` (``body``: decoded, expanded when it pointed at served state),
        rewritten as the policy asks; list it."""
        sent = request.decoded_body() if request.encoding else request.body
        self.secrets |= request_secrets(request.query, request.headers)
        changes: list[str] = []
        rewrites: list[dict[str, Any]] = []
        prompt_at: int | None = None
        expanded = request.exchange in self.expanded_bodies
        if expanded:
            changes.append(Change.EXPANDED.value)
        target: str | None = None
        obj: Any = None
        edited = False
        wants = (
            (k is not None and self.policy.boundary_prompt is not None)
            or (self.policy.reasoning is ReasoningPolicy.STRIP and bool(self.served_reasoning))
            or (k is not None and self.policy.live_model is not None)
            or (k is not None and self.policy.reasoning_off)
        )
        if wants:
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError:
                obj = None  # not JSON: nothing to rewrite, forwarded as it came
        if isinstance(obj, dict):
            try:
                obj, edited, target, prompt_at = self._rewrite_body(obj, request, k, changes, rewrites)
            except ValueError as exc:  # a body the protocol module cannot rewrite: sent as it came
                rewrites[:] = [{"of": "rewrite", "kind": "not_rewritten", "detail": str(exc)[:200]}]
                changes[:] = [c for c in changes if c == Change.EXPANDED.value]
                edited, target, prompt_at = False, None, None
                if k == self.n + 1:
                    self.prompt_injected = False
        if edited:
            out: bytes | None = orjson.dumps(obj)
        elif expanded:
            out = body
        else:
            out = None  # the agent's own bytes, Content-Encoding and all
        sent_sha = _sha(sent)
        wire = out if out is not None else request.body
        # the same bytes (forwarded as they came, no Content-Encoding): hashed once
        forwarded_sha = sent_sha if wire is sent or wire == sent else _sha(wire)
        retry = k is not None and k in self.live_steps
        if k is not None and not retry:
            self.live_steps.append(k)
        self.live.append(
            LiveRequest(
                exchange=request.exchange,
                request=k,
                retry=retry,
                sent_sha256=sent_sha,
                forwarded_sha256=forwarded_sha,
                byte_identical=out is None or out == sent,
                changes=changes,
                rewrites=rewrites,
                prompt_at=prompt_at,
            )
        )
        # the step of this request carries these: the live model got another context
        flags = (FLAG_LIVE, *(f.value for f in LiveContextFlag if f.value in changes))
        return Forward(body=out, target=target, flags=flags)

    def _rewrite_body(
        self, obj: dict[str, Any], request: IncomingRequest, k: int | None, changes: list[str], rewrites: list
    ) -> tuple[dict[str, Any], bool, str | None, int | None]:
        """The policy's rewrites of a parsed body: (body, edited, target, prompt_at); ``changes``
        and ``rewrites`` are appended to. ValueError from a protocol module passes through."""
        edited = False
        target: str | None = None
        prompt_at: int | None = None
        if k is not None and self.policy.boundary_prompt is not None:
            at = self.boundary_at
            count = len(self.mod.entries(obj))
            if at is not None and count >= at:
                obj = self.mod.insert_user_text(obj, at, self.policy.boundary_prompt)
                changes.append(Change.BOUNDARY_PROMPT.value)
                prompt_at = at
                edited = True
                if k == self.n + 1:
                    self.prompt_injected = True
            else:
                self.prompt_misses.append({"exchange": request.exchange, "request": k, "entries": count})
        if self.policy.reasoning is ReasoningPolicy.STRIP and self.served_reasoning:
            obj, _, found = self.mod.strip_reasoning(obj, self.served_reasoning, request.path)
            if found:
                changes.append(Change.REASONING.value)
                rewrites += [{"of": "reasoning", **r} for r in found]
                edited = True
        off = getattr(self.mod, "reasoning_off", None) if self.policy.reasoning_off else None
        if k is not None and off is not None:
            obj, found = off(obj, "the handed-over history holds no signed thinking of this model")
            if found:
                changes.append(Change.REASONING.value)
                rewrites += [{"of": "reasoning", **r} for r in found]
                edited = True
        if k is not None and self.policy.live_model is not None:
            obj, path, change = self.mod.with_model(obj, request.path, self.policy.live_model)
            if change is not None:
                changes.append(Change.MODEL.value)
                rewrites.append({"of": "model", "kind": "live_model", **change})
                edited = True
                if path != request.path:
                    target = path + ("?" + request.query if request.query else "")
        return obj, edited, target, prompt_at
