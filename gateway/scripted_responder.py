"""The scripted model as a responder: the gateway answers from a script in process, no second
server (``pvisor run --script``). The model keeps its own turn rule
(:class:`~pvisor.gateway.scripted_model.ScriptedModel`, the oracle of the agent tests); this only
carries its :class:`~pvisor.adapters.protocols.replies.Reply` across the seam
(:func:`~pvisor.gateway.responder.serve_reply`), ``served_by: scripted``."""

from __future__ import annotations

import asyncio

from pvisor.core.errors import BadInputError

from pvisor.adapters.protocols.replies import error_payload

from .responder import Answer, IncomingRequest, Refuse, Serve, ServedBy, decode_or_refuse, serve_reply
from .scripted_model import ScriptedModel


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
