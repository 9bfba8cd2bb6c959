"""The journal's finalizer of the gateway's streams: a streamed response reassembled into its
final object by its protocol module. Kept apart from :mod:`.proxy` so that a journal writer
process loads only this and the protocol modules (tens of milliseconds), not aiohttp and the
gateway (hundreds): the first reassembly must not hold up the writer's commits."""

from __future__ import annotations

import orjson

from pvisor.adapters.protocols import get_protocol

#: :func:`finalize_response` by name, for :func:`pvisor.journal.writer_process.open_journal`
FINALIZER = "pvisor.gateway.finalize:finalize_response"


def finalize_response(protocol: str | None, streamed: bool, body: bytes) -> bytes | None:
    """Journal finalizer: reassemble a streamed response into its final object (compact JSON),
    using the protocol module. Runs in the journal writer thread. None for non-streamed bodies
    (they are their own final form) and for unknown protocols."""
    if protocol is None or not streamed or not body:
        return None
    result = get_protocol(protocol).reassemble([body])
    if result.final is None:
        return None
    return orjson.dumps(result.final)
