"""Who may use a gateway that listens beyond this machine (docs/gateway.md, "Listening beyond
this machine").

A gateway on a loopback address trusts every caller: only this machine can reach it. One on
any other address (``--host 0.0.0.0``) needs ``--allow-remote`` and a token, because whoever
reaches it could spend the upstream keys it forwards and write into the journal. The token
travels in the base URL's path, ``/t/<token>``, before any ``/run/<id>``: not every agent can
send a custom header, every one can be given a base URL. The prefix is removed before the
request is routed, so it is never forwarded, journaled or logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from urllib.parse import unquote

#: what a token may hold (it goes into a URL path as it is), and its least length
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,256}")
_PREFIX = "/t/"


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the gateway on this machine: ``localhost`` or a
    loopback address (127.0.0.0/8, ::1). Any other name counts as remote (it may resolve to
    an address others reach)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_url(address: str, port: int, scheme: str = "http") -> str:
    """The URL of a server listening on ``address`` (as the socket names it) and ``port``: an
    IPv6 address in brackets, as URLs write it (RFC 3986, 3.2.2): ``http://[::1]:8787``,
    ``http://127.0.0.1:8787``. The one way pvisor's servers (gateway, intercept proxy,
    scripted model) say where they listen."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{scheme}://{host}:{port}"


def new_token() -> str:
    """A fresh token: 32 URL-safe characters (192 bits)."""
    return secrets.token_urlsafe(24)


def check_token(token: str) -> str:
    """``token`` when usable; ValueError saying what is wrong (never repeating the token)."""
    if not TOKEN_PATTERN.fullmatch(token):
        raise ValueError("a token is 16 to 256 letters, digits, '_' or '-'")
    return token


class TokenGate:
    """Checks and removes the ``/t/<token>`` prefix of a raw request path."""

    def __init__(self, token: str) -> None:
        self._token = check_token(token).encode()

    def strip(self, raw_path: str) -> str | None:
        """``raw_path`` without its valid token prefix (``/t/T/v1/messages?x`` -> ``/v1/messages?x``)
        and without every other ``/t/<token>`` pair of segments (a base URL given twice, around a
        mount prefix or a run prefix), or None when the token is missing or wrong (compared in
        constant time) or appears elsewhere (in the query, in a segment of its own)."""
        if not raw_path.startswith(_PREFIX):
            return None
        rest = raw_path[len(_PREFIX) :]
        end = len(rest)
        for sep in ("/", "?"):
            i = rest.find(sep)
            if i != -1 and i < end:
                end = i
        if not hmac.compare_digest(rest[:end].encode("utf-8", "surrogateescape"), self._token):
            return None
        tail = rest[end:]
        tail = tail if tail.startswith("/") else "/" + tail
        # a base URL given twice (/t/T/t/T/v1/..., /t/T/anthropic/t/T/v1/...): the token must not
        # go on into the path, upstream, the journal or the log
        path, sep, query = tail.partition("?")
        segments = path.split("/")
        kept: list[str] = []
        i = 0
        while i < len(segments):
            if segments[i] == "t" and i + 1 < len(segments) and self._is_token(segments[i + 1]):
                i += 2
                continue
            kept.append(segments[i])
            i += 1
        tail = ("/".join(kept) or "/") + sep + query
        if not tail.startswith("/"):
            tail = "/" + tail
        token = self._token.decode()
        if token in tail or token in unquote(tail):
            return None  # the token anywhere else (a query, a segment of its own): refused, not passed on
        return tail

    def _is_token(self, segment: str) -> bool:
        return hmac.compare_digest(segment.encode("utf-8", "surrogateescape"), self._token)


class InterceptGate:
    """Checks the ``X-Pvisor-Intercept: <token> <origin>`` header intercept mode's addon adds
    (:mod:`.intercept_addon`): only a request the gateway's own mitmdump handed over names an
    origin to forward to, and only one of ``origins``."""

    def __init__(self, token: str, origins: set[str] | dict[str, str]) -> None:
        self._token = check_token(token).encode()
        self._origins = set(origins)

    def origin(self, mark: str) -> str | None:
        """The origin ``mark`` names, or None when its token is wrong (compared in constant time)
        or its origin is not intercepted."""
        token, _, origin = mark.partition(" ")
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), self._token):
            return None
        return origin if origin in self._origins else None
