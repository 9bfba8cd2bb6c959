"""Keys the gateway adds when it forwards: the agent holds a dummy key, the gateway the real one.

A run that re-executes recorded tool calls (a continuation towards a live API) must not leave
the user's key where a call can read it (``env``, ``cat /proc/self/environ``): the agent is
given a dummy key instead, and the gateway, configured with :class:`UpstreamCredentials`
(``GatewayConfig.credentials``), puts the real key in its place in every request it forwards to
that upstream. docs/replay.md ("Keys in a continuation") states the rules:

- **Where**: only in the places the upstream's protocol modules declare for a credential
  (``CREDENTIAL_HEADERS``, ``CREDENTIAL_QUERY`` of :mod:`pvisor.adapters.protocols`: Anthropic
  ``x-api-key`` and ``authorization: Bearer``, OpenAI ``authorization: Bearer``, Gemini
  ``x-goog-api-key`` and ``?key=``), and only when the value there equals the dummy exactly
  (a ``Bearer`` scheme aside). The key goes where the dummy was, in the same form.
- **Anything else passes as it came**: a request without the dummy (another key the agent
  found, none at all) is forwarded unchanged, as without a swap: it holds nothing the agent did
  not hold already, and the upstream decides. The dummy elsewhere (a body, another header) is
  not replaced.
- **Never the other way round**: the real key is never put into a response. When the gateway
  swapped it into a request, the upstream's response headers, and its body when the status is
  an error (400 or more: where an upstream echoes the key it refused), have every form of the
  real key (:func:`~pvisor.journal.redact.secret_forms`: as sent, percent-encoded, hex, base64)
  replaced by ``<redacted>`` before the agent or the journal sees them. A reply (2xx) streams
  as it comes: holding bytes back to look for a key would delay its events, and a model's
  reply does not carry the request's key.
- **Never recorded**: the journal records the request the agent sent (with the dummy; its
  credential headers are dropped by the journal's redaction anyway) and the response as the
  agent got it; no message, log line or ``repr`` holds the real key.

Intercept mode's forwards (to the origin the agent addressed) are never swapped: the swap is
bound to the gateway's named upstreams.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterable
from urllib.parse import quote, unquote

from pvisor.adapters.protocols import UPSTREAMS, get_protocol
from pvisor.journal.redact import credential, secret_forms

from .responder import StreamBroken

#: what replaces the real key in a response (the journal's own word for a removed secret)
REDACTED = b"<redacted>"
#: the shortest dummy and real key accepted: a shorter one could be matched by chance
MIN_KEY_LENGTH = 8
_QUERY_SPLIT = re.compile(r"([&;])")


@dataclass(frozen=True, slots=True)
class KeySwap:
    """One key the gateway adds: requests forwarded to ``upstream`` (``anthropic``, ``openai``,
    ``gemini``: a name of :data:`~pvisor.adapters.protocols.UPSTREAMS`) that carry ``dummy`` in
    a credential place get ``real`` there instead. ``real`` is never shown (not in ``repr``)."""

    upstream: str
    dummy: str
    real: str = field(repr=False)


@functools.lru_cache(maxsize=None)
def credential_places(upstream: str) -> tuple[frozenset[str], frozenset[str]]:
    """(header names, query parameter names) where a request to ``upstream`` carries its key:
    the union of what the protocol modules it serves declare (``CREDENTIAL_HEADERS``,
    ``CREDENTIAL_QUERY``). KeyError for an unknown upstream name."""
    protocols = UPSTREAMS[upstream][1]
    headers = frozenset(h.lower() for p in protocols for h in get_protocol(p).CREDENTIAL_HEADERS)
    query = frozenset(q for p in protocols for q in get_protocol(p).CREDENTIAL_QUERY)
    return headers, query


class UpstreamCredentials:
    """The keys a gateway adds when it forwards (``GatewayConfig.credentials``; None: requests
    are forwarded as the agent sent them).

    ``swaps``: one :class:`KeySwap` per upstream (or several with different dummies). Raises
    ValueError, naming the upstream but never a key, for an unknown upstream, a dummy or a key
    shorter than :data:`MIN_KEY_LENGTH` or holding white space or control characters (it goes
    into a header), a dummy equal to its key, or one dummy given twice."""

    __slots__ = ("_swaps", "_needles")

    def __init__(self, swaps: Iterable[KeySwap]):
        self._swaps: dict[str, dict[str, str]] = {}
        self._needles: dict[str, tuple[bytes, ...]] = {}
        for s in swaps:
            if s.upstream not in UPSTREAMS:
                raise ValueError(
                    f"key swap for an unknown upstream {s.upstream!r}; expected {', '.join(UPSTREAMS)}"
                )
            for what, value in (("dummy key", s.dummy), ("key", s.real)):
                if len(value) < MIN_KEY_LENGTH or not value.isprintable() or any(c.isspace() for c in value):
                    raise ValueError(
                        f"the {what} for upstream {s.upstream} must be at least {MIN_KEY_LENGTH} printable "
                        "characters without white space"
                    )
            if s.dummy == s.real:
                raise ValueError(f"the dummy key for upstream {s.upstream} is the key itself")
            if any(s.dummy in by for by in self._swaps.values()):
                raise ValueError(f"the dummy key for upstream {s.upstream} is given twice")
            self._swaps.setdefault(s.upstream, {})[s.dummy] = s.real
            if s.real not in self._needles:
                # longest first: a form that holds a shorter one is replaced whole
                self._needles[s.real] = tuple(sorted(secret_forms(s.real), key=len, reverse=True))

    def __repr__(self) -> str:
        return f"UpstreamCredentials(upstreams={sorted(self._swaps)})"

    @property
    def upstreams(self) -> list[str]:
        """The upstream names a key is added for."""
        return sorted(self._swaps)

    def dummies(self) -> list[str]:
        """The dummy keys (what the agents are given; no secret)."""
        return [d for by in self._swaps.values() for d in by]

    def swap(
        self, upstream: str | None, headers: list[tuple[str, str]], target: str
    ) -> tuple[list[tuple[str, str]], str, str | None]:
        """The request to forward to ``upstream``: ``headers`` (name, value pairs) and
        ``target`` (path and raw query) with the dummy replaced by the real key in the
        credential places (:func:`credential_places`), and the real key swapped in (None when
        nothing was: the inputs are returned as they are)."""
        by_dummy = self._swaps.get(upstream) if upstream is not None else None
        if not by_dummy:
            return headers, target, None
        header_places, query_places = credential_places(upstream)  # type: ignore[arg-type]
        used: str | None = None
        out: list[tuple[str, str]] | None = None
        for i, (name, value) in enumerate(headers):
            if name.lower() not in header_places:
                continue
            given = credential(value)
            real = by_dummy.get(given)
            if real is None:
                continue
            if out is None:
                out = list(headers)
            # the same form: ``Bearer DUMMY`` -> ``Bearer REAL``, ``DUMMY`` -> ``REAL``
            out[i] = (name, value[: value.rfind(given)] + real)
            used = real
        path, q, query = target.partition("?")
        if q and query_places:
            pieces = _QUERY_SPLIT.split(query)
            for i in range(0, len(pieces), 2):
                raw_name, eq, raw_value = pieces[i].partition("=")
                if not eq or unquote(raw_name) not in query_places:
                    continue
                real = by_dummy.get(unquote(raw_value.replace("+", " ")))
                if real is not None:
                    pieces[i] = f"{raw_name}={quote(real, safe='')}"
                    used = real
            target = f"{path}?{''.join(pieces)}"
        return (out if out is not None else headers), target, used

    def scrub_headers(self, headers: list[tuple[str, str]], real: str) -> list[tuple[str, str]]:
        """Response ``headers`` with every form of ``real`` replaced by ``<redacted>``."""
        needles = self._needles[real]
        out = headers
        for i, (name, value) in enumerate(headers):
            raw = value.encode("latin-1", "surrogateescape")
            scrubbed = _replace_all(raw, needles)
            if scrubbed is not raw:
                if out is headers:
                    out = list(headers)
                out[i] = (name, scrubbed.decode("latin-1", "surrogateescape"))
        return out

    def scrub_body(self, chunks: AsyncIterator[bytes], real: str) -> "ScrubbedBody":
        """``chunks`` (a response body's async source) with every form of ``real`` replaced by
        ``<redacted>``, also across chunk boundaries (:class:`ScrubbedBody`)."""
        return ScrubbedBody(chunks, self._needles[real])


def _replace_all(data: bytes, needles: tuple[bytes, ...]) -> bytes:
    """``data`` with each needle replaced by :data:`REDACTED`; ``data`` itself when none is in it."""
    for needle in needles:
        if needle in data:
            data = data.replace(needle, REDACTED)
    return data


class ScrubbedBody:
    """An async source of a body's chunks with every needle replaced by :data:`REDACTED`, even
    one cut in two by a chunk boundary: the last ``longest needle - 1`` bytes of what arrived
    are held back until the next chunk (or the end) shows whether they start a needle. A
    :class:`~pvisor.gateway.responder.StreamBroken` of the source comes after the bytes held
    back; :meth:`aclose` closes the source."""

    def __init__(self, source: AsyncIterator[bytes], needles: tuple[bytes, ...]):
        self._source = source
        self._it = source.__aiter__()
        self._needles = needles
        self._hold = max((len(n) for n in needles), default=1) - 1
        self._tail = b""
        self._ended = False
        self._broken: StreamBroken | None = None

    def __aiter__(self) -> "ScrubbedBody":
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._ended:
                if self._tail:
                    out, self._tail = self._tail, b""
                    return out
                if self._broken is not None:
                    broken, self._broken = self._broken, None
                    raise broken
                raise StopAsyncIteration
            try:
                chunk = await self._it.__anext__()
            except StopAsyncIteration:
                self._ended = True
                continue
            except StreamBroken as exc:
                self._ended, self._broken = True, exc
                continue
            buf = _replace_all(self._tail + chunk, self._needles)
            if len(buf) <= self._hold:
                self._tail = buf
                continue
            cut = len(buf) - self._hold
            self._tail = buf[cut:]
            return buf[:cut]

    async def aclose(self) -> None:
        close = getattr(self._source, "aclose", None)
        if close is not None:
            await close()
