"""The scripted model as a responder: the gateway answers from a script in process, no second
server (``pvisor run --script``). The model keeps its own turn rule
(:class:`~pvisor.gateway.scripted_model.ScriptedModel`, the oracle of the agent tests); this only
carries its :class:`~pvisor.gateway.scripted_model.Reply` across the seam, ``served_by:
scripted``."""

from __future__ import annotations

import asyncio

from pvisor.journal.errors import BadInputError

from .responder import Answer, IncomingRequest, Refuse, Serve, ServedBy, decode_or_refuse
from .scripted_model import Reply, ScriptedModel, error_payload


def serve_reply(reply: Reply, served_by: ServedBy, flags: tuple[str, ...] = ()) -> Serve:
    """A scripted model's :class:`Reply` as a :class:`Serve` answer: one body, or its chunks as
    written; an event stream when its Content-Type says so."""
    headers = list(reply.headers.items())
    streamed = reply.headers.get("Content-Type", "").startswith("text/event-stream")
    if len(reply.chunks) == 1:
        return Serve(
            reply.status, headers, body=reply.chunks[0], streamed=streamed, served_by=served_by, flags=flags
        )
    return Serve(
        reply.status, headers, chunks=list(reply.chunks), streamed=streamed, served_by=served_by, flags=flags
    )


class ScriptedResponder:
    """Answers every request with ``model.answer`` (a body the protocol cannot parse, or a
    script that cannot be applied, is a 400 in the protocol's error shape, as from
    ``pvisor serve-model``)."""

    def __init__(self, model: ScriptedModel):
        self.model = model
        self.requests = 0

    async def respond(self, request: IncomingRequest) -> Answer:
        self.requests += 1
        body = decode_or_refuse(request)
        if isinstance(body, Refuse):
            return body
        try:
            reply = self.model.answer(request.method, request.path, request.query, body)
        except BadInputError as exc:
            payload = error_payload(request.path, 400, exc.message)
            return Serve(
                400, [("Content-Type", "application/json")], body=payload, served_by=ServedBy.SCRIPTED
            )
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        return serve_reply(reply, ServedBy.SCRIPTED)
