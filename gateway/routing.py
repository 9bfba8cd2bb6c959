"""Where a request goes: which run it belongs to, which upstream and protocol serve it.

Rules (docs/gateway.md):

1. ``/__pvisor/health`` answers locally.
2. A leading ``/run/<id>/`` selects the run and is removed; so does the ``X-Pvisor-Run`` header
   (the prefix wins). Neither is forwarded. A path starting with ``/run/`` whose next segment
   is not a valid run id (``/run//x``, ``/run/bad%20id/...``, one shaped like an API key), or
   such a header, is answered 400 ``pvisor_bad_run_id``.
3. A leading mount prefix ``/<upstream>/`` (``/anthropic/``, ``/openai/``, ``/gemini/``) picks
   that upstream and is removed.
4. Otherwise a path that a protocol module serves exactly (``/v1/messages``,
   ``/v1/chat/completions``, ``/v1/responses``, ``/v1beta/models/{m}:{method}``, ...) goes to
   the upstream of that protocol.
5. Any other path (Claude Code's ``HEAD /``, ``GET /v1/models``) goes to the only upstream given
   with ``--upstream`` when exactly one was given; else the gateway answers a recorded 404
   ``pvisor_no_route``.

Before all of these, a path with a ``.`` or ``..`` segment is answered 400 ``pvisor_bad_path``
(:func:`climbs`: once percent-decoded, segments split on ``/`` and ``\\``, ``;`` parameters
dropped; or with a NUL): resolved by the upstream, it could climb out of a mount prefix or the
``--upstream`` base path.

In intercept mode (docs/intercept.md) a request the mitmproxy addon hands over names the origin
the agent addressed (``https://api.anthropic.com``): it goes to that origin, or to the address
``--redirect`` gives it, whatever its path; rules 1 and 2 still apply, rule 3 does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote

from yarl import URL

from pvisor.adapters.protocols import UPSTREAMS, get_protocol
from pvisor.journal.model import is_run_id

HEALTH_PATH = "/__pvisor/health"
RUN_HEADER = "X-Pvisor-Run"
#: the header intercept mode's addon adds: ``<token> <origin>`` (stripped, never recorded)
INTERCEPT_HEADER = "X-Pvisor-Intercept"
_RUN_PREFIX = re.compile(r"^/run/([^/?]*)")
#: the scheme and authority of an absolute-form request target (RFC 9112 §3.2.2)
_ABSOLUTE_FORM = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")


def origin_form(raw_target: str) -> str:
    """The request target as the gateway routes, forwards and records it: an absolute-form target
    (``http://user:secret@host/v1/messages``, RFC 9112 §3.2.2) reduced to its path and query, its
    authority (user info included) never kept, and a fragment removed (never part of a request
    target, RFC 9112 §3.2, but a client may write one into the request line: ``#key=...``)."""
    m = _ABSOLUTE_FORM.match(raw_target)
    if m:
        raw_target = raw_target[m.end() :]
        if not raw_target.startswith("/"):
            raw_target = "/" + raw_target
    return raw_target.partition("#")[0]


def check_upstream_url(url: str) -> str:
    """``url`` when it is usable as an upstream base URL: http or https, a host, a port in
    1..65535 if one is given, no query or fragment. Raises ValueError saying what is wrong; the
    message never repeats the URL (its user info may hold a password)."""
    if any(c.isspace() for c in url):
        raise ValueError("the URL contains white space")
    try:
        u = URL(url)  # yarl checks that an explicit port is a number in 0..65535
    except (ValueError, TypeError) as exc:
        text = str(exc).lower()
        reason = (
            "its port must be in 1..65535"
            if "out of range" in text
            else "its port is not a number"
            if "port" in text
            else "it is not a URL"
        )
        raise ValueError(f"the URL is not usable: {reason}") from None
    if u.scheme not in ("http", "https"):
        raise ValueError("the URL must start with http:// or https://")
    if not u.host:
        raise ValueError("the URL has no host")
    if u.explicit_port == 0:
        raise ValueError("the URL is not usable: its port must be in 1..65535")
    if u.raw_query_string or "?" in url:
        raise ValueError("the URL must not have a query (?...)")
    if u.raw_fragment or "#" in url:
        raise ValueError("the URL must not have a fragment (#...)")
    return url


#: why a replay refuses an upstream URL with user info (:func:`has_userinfo`); never the URL itself
USERINFO_REFUSED = (
    "the URL holds user info (user:password@, not shown), which the live model's requests cannot "
    "carry beside the agent's own key: give the URL without it, the key in the agent's environment"
)


def has_userinfo(url: str) -> bool:
    """Whether ``url`` holds user info (``user@`` or ``user:password@`` before its host). The
    forwarder sends the agent's own credential header, which aiohttp refuses to combine with a
    URL's user info (a ValueError on every request), so the replay commands refuse it up front."""
    try:
        u = URL(url)
    except (ValueError, TypeError):
        return False
    return u.raw_user is not None or u.raw_password is not None


#: what separates a path's segments for some server on the way: ``/``, and ``\`` (IIS, Windows)
_SEGMENT_SEPARATOR = re.compile(r"[/\\]")


def climbs(raw_target: str) -> bool:
    """Whether the path of ``raw_target`` (raw, with its query) could climb out of a mount prefix
    or of an ``--upstream`` base path once a server resolves it (``/t/T/../../v1/messages``).

    The path is percent-decoded once (as a server does: ``..%2f..%2fx`` is ``../../x``), split
    on ``/`` and on ``\\`` (which Windows servers take as one), and each segment's ``;``
    parameters dropped (``..;/``, RFC 3986 §3.3, which Java servers strip): it climbs when a
    segment is ``.`` or ``..`` (RFC 3986 §5.2.4 dot segments) or the path holds a NUL (``..%00``,
    which a C server cuts at). A segment of ``%252e%252e`` stays ``%2e%2e`` after the one decoding
    and is no dot segment."""
    path = unquote(raw_target.partition("?")[0])
    if "\0" in path:
        return True
    return any(segment.partition(";")[0] in (".", "..") for segment in _SEGMENT_SEPARATOR.split(path))


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved request.

    Fields:
        kind: ``upstream`` (forward it), ``health`` (answer locally), ``no_route`` (404),
            ``bad_run`` (400: an ``X-Pvisor-Run`` header or a ``/run/<id>/`` prefix whose id is
            not a valid run id) or ``bad_path`` (400: a ``.`` or ``..`` segment or a NUL, :func:`climbs`).
        run: the run id the exchange belongs to.
        upstream: upstream name, or None.
        target: the raw path and query to append to the upstream base URL, prefixes removed.
        path: ``target`` without the query string (what the journal stores as ``path``).
        query: the raw query string, without ``?``.
        protocol: the protocol module name serving ``path``, or None.
        base: the base URL to forward to instead of the upstream's (intercept mode: the origin
            the agent addressed, or its ``--redirect`` address), or None.
    """

    kind: str
    run: str
    upstream: str | None
    target: str
    path: str
    query: str
    protocol: str | None
    base: str | None = None


class Router:
    """Resolve raw request paths. ``upstreams``: name -> base URL for every upstream (defaults
    filled in); ``explicit``: the names the user gave with ``--upstream``; ``run``: the
    gateway's own run id; ``origins``: intercept mode's origin -> base URL (the origin itself,
    or its ``--redirect`` address), None when the gateway does not serve intercept mode."""

    def __init__(
        self, upstreams: dict[str, str], explicit: set[str], run: str, origins: dict[str, str] | None = None
    ):
        unknown = set(upstreams) - set(UPSTREAMS)
        if unknown:
            raise ValueError(
                f"unknown upstream name(s): {', '.join(sorted(unknown))}; expected {', '.join(UPSTREAMS)}"
            )
        for name, url in upstreams.items():
            try:
                check_upstream_url(url)
            except ValueError as exc:
                raise ValueError(f"upstream {name}: {exc}") from None
        self.upstreams = {name: url.rstrip("/") for name, url in upstreams.items()}
        self.origins = {o: url.rstrip("/") for o, url in (origins or {}).items()}
        self.explicit = set(explicit)
        self.run = run
        self.fallback = next(iter(self.explicit)) if len(self.explicit) == 1 else None
        self._matchers: list[tuple[str, str, Callable[[str], bool]]] = []
        self._wants_stream: dict[str, Callable] = {}
        self._counts_tokens: dict[str, Callable[[str], bool]] = {}
        self._protocol_cache: dict[str, tuple[str | None, str | None]] = {}
        self._route_cache: dict[tuple[str, str | None, str | None], Route] = {}
        for name, (_, protocols) in UPSTREAMS.items():
            for proto in protocols:
                self._matchers.append((proto, name, get_protocol(proto).matches))
                self._wants_stream[proto] = get_protocol(proto).wants_stream
                self._counts_tokens[proto] = get_protocol(proto).counts_tokens

    def path_streams(self, route: Route) -> bool:
        """Whether the route's protocol streams by path alone (Gemini ``:streamGenerateContent``
        answers a JSON array without ``alt=sse``); the others say so in the body."""
        return route.protocol is not None and self._wants_stream[route.protocol](route.path, route.query, {})

    def is_candidate(self, route: Route) -> bool:
        """Whether a request on ``route`` may be a main-loop request: a protocol path that asks
        for a reply (not a token count). The chain rule decides later; every candidate gets a
        workspace snapshot."""
        return route.protocol is not None and not self._counts_tokens[route.protocol](route.path)

    def protocol_of(self, path: str) -> tuple[str | None, str | None]:
        """(protocol name, upstream name) of an exact protocol path, or (None, None). An agent
        sends a handful of paths all run long: each is matched once (at most 1,024 kept)."""
        hit = self._protocol_cache.get(path)
        if hit is not None:
            return hit
        found: tuple[str | None, str | None] = (None, None)
        for proto, upstream, matches in self._matchers:
            if matches(path):
                found = (proto, upstream)
                break
        if len(self._protocol_cache) >= 1024:
            self._protocol_cache.clear()
        self._protocol_cache[path] = found
        return found

    def resolve(self, raw_path: str, run_header: str | None = None, origin: str | None = None) -> Route:
        """Resolve ``raw_path`` (path and query exactly as received, still percent-encoded).
        ``origin``: the origin an intercepted request was addressed to (one of ``origins``).
        An agent repeats a handful of targets all run long, and a Route is immutable: each
        (target, run header, origin) is resolved once (at most 1,024 kept)."""
        key = (raw_path, run_header, origin)
        route = self._route_cache.get(key)
        if route is None:
            route = self._resolve(raw_path, run_header, origin)
            if len(self._route_cache) >= 1024:
                self._route_cache.clear()
            self._route_cache[key] = route
        return route

    def _resolve(self, raw_path: str, run_header: str | None, origin: str | None) -> Route:
        run = self.run
        if climbs(raw_path):
            path, _, query = raw_path.partition("?")
            return Route("bad_path", run, None, raw_path, path, query, None)
        bad_run = False
        if run_header is not None:
            if is_run_id(run_header):
                run = run_header
            else:
                bad_run = True
        target = raw_path
        m = _RUN_PREFIX.match(target)
        if m:
            # a key is never a run id: it would be stored, exported and logged as one
            if is_run_id(m.group(1)):
                run = m.group(1)
                bad_run = False  # the prefix wins over the header
            else:
                run, bad_run = self.run, True  # recorded under the gateway's own run
            target = target[m.end() :]
            if not target.startswith("/"):
                target = "/" + target
        path, _, query = target.partition("?")
        if path == HEALTH_PATH:
            return Route("health", run, None, target, path, query, None)
        if bad_run:
            return Route("bad_run", run, None, target, path, query, self.protocol_of(path)[0])
        if origin is not None:
            protocol, proto_upstream = self.protocol_of(path)
            return Route("upstream", run, proto_upstream, target, path, query, protocol, self.origins[origin])
        upstream = None
        first = path.split("/", 2)[1] if path.startswith("/") else ""
        if first in self.upstreams and (path == "/" + first or path.startswith("/" + first + "/")):
            upstream = first
            target = target[len(first) + 1 :] or "/"
            if target.startswith("?"):
                target = "/" + target
            path, _, query = target.partition("?")
        protocol, proto_upstream = self.protocol_of(path)
        if upstream is None:
            upstream = proto_upstream or self.fallback
        if upstream is None:
            return Route("no_route", run, None, target, path, query, protocol)
        return Route("upstream", run, upstream, target, path, query, protocol)
