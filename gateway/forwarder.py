"""The upstream forwarder: the responder that sends a request to a model API and answers with
what comes back, chunk by chunk.

It owns the aiohttp client session (no pool limit, no total timeout: long thinking streams are
cut only by ``stall_timeout`` seconds without a byte; no automatic decompression, no cookie jar)
and turns everything aiohttp says into plain data: a :class:`~pvisor.gateway.responder.Serve`
whose ``chunks`` is an async source of the upstream's bytes (raising
:class:`~pvisor.gateway.responder.StreamBroken` when the upstream connection breaks or stalls),
or a :class:`~pvisor.gateway.responder.Refuse` with a 502 when no answer came at all. Messages
never hold the URL (a ``key=`` may be in it) nor the address.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from typing import AsyncIterator

import aiohttp
from yarl import URL

from pvisor.journal.exchange_end import Outcome

from .credentials import UpstreamCredentials
from .responder import Answer, Forward, IncomingRequest, Refuse, Serve, ServedBy, StreamBroken
from .routing import INTERCEPT_HEADER, RUN_HEADER

SOCK_CONNECT_TIMEOUT_S = 30.0

# RFC 9110 §7.6.1 hop-by-hop fields, plus Host (aiohttp sets the upstream's) and Content-Length
# (recomputed from the body we send).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "expect",
    }
)
REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", RUN_HEADER.lower(), INTERCEPT_HEADER.lower()}
_SKIP_AUTO = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_UPSTREAM_READ_ERRORS = (
    aiohttp.ClientPayloadError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    asyncio.TimeoutError,
    aiohttp.ClientConnectionError,
)


def forwardable(
    headers: list[tuple[str, str]] | tuple[tuple[str, str], ...], drop: frozenset[str]
) -> list[tuple[str, str]]:
    """``headers`` without those in ``drop``, those a ``Connection`` header names, and ``Proxy-*``."""
    # one pass, one lower() per header; the fields a Connection header names (rare) are taken
    # out afterwards
    kept: list[tuple[str, str]] = []
    kept_lower: list[str] = []
    named: set[str] | None = None
    for k, v in headers:
        kl = k.lower()
        if kl == "connection":
            named = (named or set()) | {t.strip().lower() for t in v.split(",") if t.strip()}
        if kl in drop or kl.startswith("proxy-"):
            continue
        kept.append((k, v))
        kept_lower.append(kl)
    if named:
        return [kv for kv, kl in zip(kept, kept_lower) if kl not in named]
    return kept


class _UpstreamBody:
    """The upstream response body as an async source of chunks. Ends the upstream response when
    done: released for reuse after a complete body, closed (connection dropped) when the reader
    stops early (:meth:`aclose`: the agent went away, the gateway stops)."""

    def __init__(self, resp: aiohttp.ClientResponse, upstream: str, stall_timeout: float, head: bool):
        self._resp = resp
        self._it = resp.content.iter_any().__aiter__()
        self._upstream = upstream
        self._stall = stall_timeout
        self._received = 0
        self._done = head

    def __aiter__(self) -> "_UpstreamBody":
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            self._resp.release()
            raise StopAsyncIteration
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            self._done = True
            self._resp.release()
            raise
        except _UPSTREAM_READ_ERRORS as exc:
            self._done = True
            self._resp.close()
            if isinstance(exc, asyncio.TimeoutError):
                raise StreamBroken(
                    Outcome.UPSTREAM_RESET,
                    f"upstream {self._upstream} sent nothing for {self._stall:g} s "
                    f"(received {self._received} bytes)",
                ) from None
            raise StreamBroken(
                Outcome.UPSTREAM_RESET,
                f"upstream {self._upstream} connection broke after {self._received} bytes: {reason(exc)}",
            ) from None
        except BaseException:
            self._done = True
            self._resp.close()
            raise
        self._received += len(chunk)
        return chunk

    async def aclose(self) -> None:
        """Stop reading: the upstream connection is closed (it cannot be reused mid-body)."""
        if not self._done:
            self._done = True
            self._resp.close()
        else:
            self._resp.release()


class UpstreamForwarder:
    """Forwards to the upstreams of a :class:`~pvisor.gateway.routing.Router`.

    ``await start()`` opens the client session, ``await close()`` closes it. :meth:`respond`
    forwards any request unchanged (it is a responder); :meth:`forward` carries out a
    :class:`Forward` answer of another responder. With ``credentials``
    (:class:`~pvisor.gateway.credentials.UpstreamCredentials`) the agent's dummy key is replaced
    by the real one in what goes to a named upstream, and the real key removed from what comes
    back (:mod:`.credentials`)."""

    def __init__(
        self, upstreams: dict[str, str], stall_timeout: float, credentials: UpstreamCredentials | None = None
    ):
        self.upstreams = upstreams
        self.stall_timeout = stall_timeout
        self.credentials = credentials
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=SOCK_CONNECT_TIMEOUT_S, sock_read=self.stall_timeout
            ),
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO,
            cookie_jar=aiohttp.DummyCookieJar(),  # never carry one agent's cookies to another
        )

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def respond(self, request: IncomingRequest) -> Answer:
        return await self.forward(request, Forward())

    async def forward(self, request: IncomingRequest, fwd: Forward) -> Serve | Refuse:
        """Send ``request`` (with ``fwd.body`` instead of its body when given) to its upstream
        (``fwd.upstream`` when given). Returns the upstream's answer as a streaming
        :class:`Serve`, or a :class:`Refuse`: 404 ``pvisor_no_route`` when no upstream serves
        the path, 502 when none could be reached or it closed before answering."""
        name = fwd.upstream or request.upstream
        base = request.base if fwd.upstream is None else None
        if base is not None:  # intercept mode: the origin the agent addressed, or its --redirect
            u = URL(base)
            name = f"{u.host}:{u.port}" if u.explicit_port else (u.host or "?")
        elif name is None or name not in self.upstreams:
            msg = (
                f"no upstream for {request.method} {request.path}: give --upstream NAME=URL, "
                "or use a /anthropic/, /openai/ or /gemini/ prefix"
            )
            return Refuse(404, "pvisor_no_route", msg, Outcome.UPSTREAM_UNREACHABLE)
        headers = forwardable(request.headers, REQUEST_DROP)
        body = request.body if fwd.body is None else fwd.body
        if fwd.body is not None:
            # a body of the responder's own is sent as it is: not in the agent's Content-Encoding
            headers = [(k, v) for k, v in headers if k.lower() != "content-encoding"]
        target = fwd.target or request.target
        real: str | None = None
        if self.credentials is not None and base is None:
            headers, target, real = self.credentials.swap(name, headers, target)
        url = URL((base or self.upstreams[name]) + target, encoded=True)
        send_body = body if (body or request.method not in ("GET", "HEAD", "OPTIONS")) else None
        assert self._session is not None, "UpstreamForwarder.start() was not awaited"
        try:
            resp = await self._session.request(
                request.method, url, headers=headers, data=send_body, allow_redirects=False
            )
        except aiohttp.ClientConnectorError as exc:
            return _failed(Outcome.UPSTREAM_UNREACHABLE, f"cannot connect to upstream {name}: {reason(exc)}")
        except aiohttp.ConnectionTimeoutError:  # before TimeoutError: a connect timeout is no stall
            return _failed(
                Outcome.UPSTREAM_UNREACHABLE,
                f"cannot connect to upstream {name}: no connection within {SOCK_CONNECT_TIMEOUT_S:g} s",
            )
        except (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            aiohttp.ClientPayloadError,
            aiohttp.ClientResponseError,
        ) as exc:
            return _failed(
                Outcome.UPSTREAM_RESET,
                f"upstream {name} closed the connection before answering: {reason(exc)}",
            )
        except asyncio.TimeoutError:
            return _failed(
                Outcome.UPSTREAM_RESET, f"upstream {name} sent no response within {self.stall_timeout:g} s"
            )
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers]
        streamed = resp.headers.get("Content-Type", "").startswith("text/event-stream")
        chunks: AsyncIterator[bytes] = _UpstreamBody(
            resp, name, self.stall_timeout, head=request.method == "HEAD"
        )
        if real is not None:
            # the key swapped in never goes back to the agent. An error is where an upstream
            # echoes a key; a reply (2xx) is left as it streams: holding bytes back would delay it
            assert self.credentials is not None
            raw = self.credentials.scrub_headers(raw, real)
            if resp.status >= 400:
                chunks = self.credentials.scrub_body(chunks, real)
        return Serve(
            resp.status,
            raw,
            chunks=chunks,
            streamed=streamed,
            served_by=ServedBy.UPSTREAM,
            flags=fwd.flags,
            reason=resp.reason,
        )


def _failed(outcome: Outcome, message: str) -> Refuse:
    """A 502 of the gateway's own: its error kind and ``x-pvisor-error`` are the outcome's value."""
    return Refuse(502, outcome.value, message, outcome, headers=[("x-pvisor-error", outcome.value)])


def os_error_reason(err: OSError) -> str:
    """``Connection refused`` for an OSError. Its own text is not used: asyncio's says
    ``Connect call failed ('10.0.0.1', 443)`` and aiohappyeyeballs joins several such. A TLS
    failure is named as one (its errno would read "Operation not permitted")."""
    if isinstance(err, ssl.SSLError):
        why = err.reason or type(err).__name__
        if isinstance(err, ssl.SSLCertVerificationError):
            return f"TLS certificate verification failed ({err.verify_message or why})"
        hint = (
            " (does the upstream speak plain HTTP? then give an http:// URL)"
            if why in _PLAIN_HTTP_REASONS
            else ""
        )
        return f"TLS handshake failed: {why}{hint}"
    if isinstance(err, socket.gaierror):
        return err.strerror or type(err).__name__  # "Name or service not known": no host in it
    if err.errno:
        return os.strerror(err.errno)
    return type(err).__name__


#: what OpenSSL says when the server answered a TLS ClientHello in plain HTTP
_PLAIN_HTTP_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)


def reason(exc: BaseException) -> str:
    """A short reason for an aiohttp error, without the URL (which may carry a ``key=``) or the
    address."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return os_error_reason(exc.os_error)
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno:
        return os_error_reason(exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{type(exc).__name__} {exc.status}"
    return type(exc).__name__
