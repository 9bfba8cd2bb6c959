"""Wire-protocol modules, one per API: Anthropic Messages, OpenAI Chat Completions, OpenAI
Responses, Gemini; the registry :data:`PROTOCOL_MODULES` names them. Each module satisfies
:class:`~pvisor.adapters.protocols.contract.WireProtocol` (its facts as constants, its functions);
:func:`get_protocol` returns it typed so. A new protocol is one module plus one line here.
:mod:`.convert` renders a conversation of one protocol in another (the transcoder).

Modules are imported on first use, so that a command pays only for the protocols it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from pvisor.adapters.protocols.contract import WireProtocol

#: protocol name (as stored in the journal) -> module path
PROTOCOL_MODULES: dict[str, str] = {
    "anthropic": "pvisor.adapters.protocols.anthropic",
    "openai-chat": "pvisor.adapters.protocols.openai_chat",
    "openai-responses": "pvisor.adapters.protocols.openai_responses",
    "gemini": "pvisor.adapters.protocols.gemini",
}


#: upstream name (``--upstream NAME=URL``, mount prefix ``/NAME/``) -> (default base URL, protocols it serves)
UPSTREAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "anthropic": ("https://api.anthropic.com", ("anthropic",)),
    "openai": ("https://api.openai.com", ("openai-chat", "openai-responses")),
    "gemini": ("https://generativelanguage.googleapis.com", ("gemini",)),
}


def upstream_of(protocol: str) -> str:
    """The upstream name serving ``protocol`` (``openai-chat`` -> ``openai``)."""
    for name, (_, protocols) in UPSTREAMS.items():
        if protocol in protocols:
            return name
    raise KeyError(protocol)


def get_protocol(name: str) -> WireProtocol:
    """The protocol module called ``name`` (a :class:`~.contract.WireProtocol`, structurally).
    Raises KeyError for an unknown name."""
    return cast("WireProtocol", importlib.import_module(PROTOCOL_MODULES[name]))


def protocol_for_path(path: str) -> WireProtocol | None:
    """The protocol module whose exact paths include ``path`` (no query string), or None."""
    for name in PROTOCOL_MODULES:
        mod = get_protocol(name)
        if mod.matches(path):
            return mod
    return None
