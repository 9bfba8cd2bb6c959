"""Secret redaction: what of a request or response the journal, a log or an error may keep.

Everything that decides what a secret is lives here: the request-header allow-list
(:data:`REQUEST_HEADER_ALLOW`), the header and query-parameter names that carry a credential
(:func:`is_secret_header`, :func:`is_secret_query_param`), the providers' published key shapes
(:func:`has_key_shape`, :func:`redact_shapes`), the forms an upstream may echo a key in
(:func:`secret_forms`), and the functions every writer path and message uses:
:func:`redact_exchange_meta` (query and headers -> :class:`RedactedMeta`, with 8-hex HMAC
fingerprints), :func:`redact_echoed_secrets` (an error body), :func:`redact_text`,
:func:`redact_path` and :func:`redact_url` (what a log or an error quotes). Secret values never
appear in what these return, in any encoding. docs/journal.md ("Secrets") states the rules.

This module imports nothing of pvisor's but the record base, and nothing outside the standard
library. No short command loads it (the model imports it when a run id is checked), so it is
plain Python: its imports at the top, its patterns compiled at import.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import re
from typing import Any, Iterable

from pvisor.core.record import Record


# urllib.parse (and the ipaddress module it loads: 2 ms of a start) only for text holding a "%":
# the short commands' results quote text through redact_text


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _quote(text: str | bytes, safe: str = "/") -> str:
    from urllib.parse import quote

    return quote(text, safe=safe)


def _quote_plus(text: str | bytes) -> str:
    from urllib.parse import quote_plus

    return quote_plus(text)


#: Request headers kept in the journal verbatim (lower-case names). Anything not allowed and not
#: secret is dropped, its name kept in ``dropped``. Prefixes end with ``-``.
REQUEST_HEADER_ALLOW: frozenset[str] = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-length",
        "accept",
        "accept-encoding",
        "accept-language",
        "user-agent",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "x-goog-api-client",
        "x-app",
        "originator",
        "version",
        "session-id",
        "thread-id",
        "x-session-id",
        "x-session-affinity",
        "x-client-request-id",
        "x-request-id",
        "x-stainless-",
        "x-codex-",
        "anthropic-",
    }
)

# Header names that carry credentials (exact, lower-case) and name fragments that mark one.
_SECRET_HEADER_NAMES = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
        "openai-organization",
        "openai-project",
        "chatgpt-account-id",
    }
)
_SECRET_NAME_FRAGMENTS = (
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "signature",
    "auth",
    "api-key",
    "apikey",
    "api_key",
)
_SECRET_QUERY_NAMES = frozenset(
    {"key", "api_key", "api-key", "apikey", "access_token", "token", "sig", "signature", "code"}
)


@functools.lru_cache(maxsize=4096)
def is_secret_header(name: str) -> bool:
    """True when a header with this name may carry a credential (``Authorization``, ``x-api-key``,
    ``x-goog-api-key``, ``api-key``, ``Proxy-Authorization``, ``Cookie``, ``Set-Cookie``, ``X-Amz-*``
    and any name containing token, secret, password, credential, signature or auth)."""
    n = name.lower()
    if n in _SECRET_HEADER_NAMES or n.startswith("x-amz-"):
        return True
    return any(f in n for f in _SECRET_NAME_FRAGMENTS)


@functools.lru_cache(maxsize=4096)
def is_secret_query_param(name: str) -> bool:
    """True for query parameters that carry credentials: ``key`` (Gemini), ``sig``, ``code``,
    ``X-Amz-*`` (pre-signed URLs) and any name containing key, auth, token, secret, signature,
    password or credential (``api_key``, ``x-goog-api-key``, ``access_token``)."""
    n = name.lower()
    if n in _SECRET_QUERY_NAMES or n.startswith("x-amz-"):
        return True
    return any(f in n for f in ("key", "auth", "token", "secret", "signature", "password", "credential"))


#: key-shaped tokens (the providers' published key formats): Anthropic ``sk-ant-...`` and
#: OpenAI ``sk-...``/``sk-proj-...``, Google API keys ``AIza...`` and OAuth tokens ``ya29....``,
#: GitHub ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``/``github_pat_``, GitLab ``glpat-``,
#: Hugging Face ``hf_``, AWS access key ids ``AKIA``/``ASIA``, Slack ``xox?-``. Masked wherever
#: they appear: in any header value and query parameter, whatever its name, in texts that reach
#: a report or a log, even when pvisor never saw the key under a name that says what it is.
_KEY_SHAPES_SOURCE = (
    r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,}|ya29\.[0-9A-Za-z_\-]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_\-]{20,}|hf_[A-Za-z0-9]{30,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9\-]{10,})"
)
_KEY_SHAPES = re.compile(_KEY_SHAPES_SOURCE)
#: the same shapes over bytes: an error body is cleaned as it was received
_KEY_SHAPES_BYTES = re.compile(_KEY_SHAPES_SOURCE.encode())


def has_key_shape(text: str) -> bool:
    """Whether ``text``, or ``text`` percent-decoded, holds a key-shaped token."""
    return _KEY_SHAPES.search(text) is not None or (
        "%" in text and _KEY_SHAPES.search(_unquote(text)) is not None
    )


def redact_shapes(text: str) -> str:
    """``text`` with every key-shaped token replaced by ``REDACTED``; one hidden by percent
    encoding is found in the decoded text, which is then returned decoded."""
    text = _KEY_SHAPES.sub("REDACTED", text)
    if "%" in text and _KEY_SHAPES.search(_unquote(text)):
        text = _KEY_SHAPES.sub("REDACTED", _unquote(text))
    return text


#: what every key shape begins with, and ``%`` (percent encoding may hide one): a string in
#: which this finds nothing holds no key-shaped token, and is passed over by
#: :func:`redact_document` without the shapes' own, slower, search
_KEY_HINT = re.compile(r"sk-|AIza|ya29\.|gh[pousr]_|github_pat_|glpat-|hf_|AKIA|ASIA|xox[abprs]-|%")
#: the shortest key shape (``sk-`` and 8 characters): a shorter string holds none
_SHORTEST_KEY = 11
#: strings at least this long found clean are remembered (by value, up to _CLEAN_LIMIT characters
#: in all, then forgotten at once): an export of rows repeats each message of a run in every
#: later row's prompt, and hashing a string is some 30 times faster than searching it
_REMEMBER_FROM = 256
_CLEAN_LIMIT = 64 << 20
_clean: dict[str, None] = {}
_clean_chars = [0]


def _redact_string(text: str) -> str:
    if len(text) < _SHORTEST_KEY:
        return text
    long = len(text) >= _REMEMBER_FROM
    if long and text in _clean:
        return text
    if _KEY_HINT.search(text) is not None and has_key_shape(text):
        return redact_shapes(text)
    if long:
        if _clean_chars[0] > _CLEAN_LIMIT:
            _clean.clear()
            _clean_chars[0] = 0
        _clean[text] = None
        _clean_chars[0] += len(text)
    return text


def redact_document(doc: Any) -> Any:
    """``doc`` (a JSON-like value: dicts, lists, tuples, strings, numbers, booleans, None) with
    every string in it, keys too, that holds a key-shaped token passed through
    :func:`redact_shapes` (the token becomes ``REDACTED``). What an export meant to be shared
    writes (docs/exports.md "Secrets"): the journal keeps request bodies as sent, and a key a
    user pasted into a prompt, or a file the agent read, is in them. A value with nothing to
    redact is returned as it is (the same object), a container rebuilt only when something in
    it changed; other values (bytes, numbers) are returned as they are. Cost: one search of
    each string that may hold a key's prefix, a hash of a long one seen before."""
    if isinstance(doc, str):
        return _redact_string(doc)
    if isinstance(doc, dict):
        changed = False
        items = []
        for k, v in doc.items():
            k2 = _redact_string(k) if type(k) is str else k
            v2 = (
                _redact_string(v)
                if type(v) is str
                else redact_document(v)
                if isinstance(v, (dict, list, tuple))
                else v
            )
            changed = changed or k2 is not k or v2 is not v
            items.append((k2, v2))
        return dict(items) if changed else doc
    if isinstance(doc, (list, tuple)):
        new = [redact_document(v) for v in doc]
        if any(a is not b for a, b in zip(new, doc)):
            return new if isinstance(doc, list) else tuple(new)
        return doc
    return doc


def redact_path(path: str) -> str:
    """A request path as the journal and the logs keep it: key-shaped segments ``REDACTED``
    (a key pasted into a base URL)."""
    return redact_shapes(path) if has_key_shape(path) else path


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` (an upstream's error message, say) with every value of ``secrets`` (at least 6
    characters: the credentials the agent sent, :func:`request_secrets`) and every key-shaped
    token replaced by ``<redacted>``: what a result or a log quotes never carries a key, even
    one the upstream echoed back in part."""
    for value in sorted({v for v in secrets if v and len(v) >= 6}, key=len, reverse=True):
        text = text.replace(value, "<redacted>")
    return _KEY_SHAPES.sub("<redacted>", text)


def request_secrets(query: str, headers: Iterable[tuple[str, str]], path: str = "") -> set[str]:
    """The credentials a request carries: secret header values (without a ``Bearer``/``Basic``
    scheme) and secret query values (decoded), as the agent sent them; never stored, used to
    redact what quotes them."""
    values: set[str] = set(_KEY_SHAPES.findall(_unquote(path)))
    for name, value in headers:
        if is_secret_header(name):
            values.add(credential(value))
        values.update(_KEY_SHAPES.findall(_unquote(value) if "%" in value else value))
        values.update(_KEY_SHAPES.findall(_unquote(name) if "%" in name else name))
        values.update(_KEY_SHAPES.findall(name.lower()))  # a header name is stored lower-cased
    for segment in _QUERY_SEPARATOR.split(query) if query else ():
        name, value = _query_pair(segment)
        if value is not None and is_secret_query_param(name):
            values.add(value)
        values.update(_KEY_SHAPES.findall(_unquote(segment)))
    return values


def credential(value: str) -> str:
    """A credential header's value without its scheme word (``Bearer K``, ``Basic K`` -> ``K``):
    the same key sent as ``Authorization: Bearer K`` and as ``x-api-key: K`` is one key."""
    scheme, _, rest = value.partition(" ")
    return rest.strip() if scheme.lower() in ("bearer", "basic", "token") and rest.strip() else value


#: query parameters are separated by ``&``, and by ``;`` (HTML 4's other separator, which some
#: servers still split on): a key after either is a parameter of its own
_QUERY_SEPARATOR = re.compile(r"[&;]")


def _query_pair(segment: str) -> tuple[str, str | None]:
    """(name, value) of one query segment, both decoded; value None without ``=``. A segment
    whose ``=`` is itself percent-encoded (``key%3DAIza...``) splits at the encoded one."""
    raw_name, eq, raw_value = segment.partition("=")
    if not eq:
        decoded = _unquote(segment.replace("+", " "))
        name, eq, value = decoded.partition("=")
        return (name, value) if eq else (decoded, None)
    return _unquote(raw_name.replace("+", " ")), _unquote(raw_value.replace("+", " "))


def redact_echoed_secrets(
    body: bytes, query: str, headers: Iterable[tuple[str, str]], path: str = ""
) -> bytes:
    """``body`` (an error response) with every credential of the request
    (:func:`request_secrets`, 8 characters or more, in each of its :func:`secret_forms`) and
    every key-shaped token (one the request did not carry: another key the upstream quotes)
    replaced by ``<redacted>``: an upstream that echoes the key it refused must not put it into
    the journal. Returns ``body`` itself when it holds none."""
    values = request_secrets(query, headers, path)
    needles = {form for v in values if len(v) >= 8 for form in secret_forms(v)}
    for needle in sorted(needles, key=len, reverse=True):
        if needle in body:
            body = body.replace(needle, b"<redacted>")
    if _KEY_SHAPES_BYTES.search(body) is not None:
        body = _KEY_SHAPES_BYTES.sub(b"<redacted>", body)
    return body


def secret_forms(value: str) -> set[bytes]:
    """The forms an upstream may echo ``value`` (a credential) in: as sent, percent-encoded
    (``quote`` and ``quote_plus``), hex (either case), base64 (standard and URL-safe, with and
    without padding, and the middle of it wherever it falls in a longer base64 text: at each of
    the three byte offsets, without the first and last group, which mix in other bytes) and with
    JSON's escaped ``/``. Forms under 8 bytes are left out (too likely by chance)."""
    raw = value.encode("utf-8", "surrogateescape")
    forms = {raw, _quote(raw, safe="").encode(), _quote_plus(raw).encode(), raw.replace(b"/", b"\\/")}
    forms |= {raw.hex().encode(), raw.hex().upper().encode()}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        b64 = encode(raw)
        forms |= {b64, b64.rstrip(b"=")}
        for offset in (1, 2):  # raw preceded by 1 or 2 other bytes in the encoded text
            forms.add(encode(bytes(offset) + raw)[4:-4])
        forms.add(b64[:-4])  # raw at offset 0 followed by other bytes: its last group mixes them in
    return {f for f in forms if len(f) >= 8}


def fingerprint(value: str | bytes, key: bytes) -> str:
    """First 8 hex digits of HMAC-SHA256(key, value): tells two keys apart without revealing either."""
    if isinstance(value, str):
        return _fingerprint_str(value, key)
    import hmac  # here: it loads OpenSSL, which the commands that never fingerprint do not need

    return hmac.digest(key, value, "sha256")[:4].hex()  # one-shot C HMAC: ~1 µs


@functools.lru_cache(maxsize=256)
def _fingerprint_str(value: str, key: bytes) -> str:
    # an agent sends the same key with every request: its fingerprint is computed once (the
    # cache holds what the request headers held anyway, in this process's memory only)
    import hmac

    return hmac.digest(key, value.encode("utf-8", "surrogateescape"), "sha256")[:4].hex()


@functools.lru_cache(maxsize=4096)
def _header_allowed(name: str, allow: frozenset[str]) -> bool:
    if name in allow:
        return True
    return any(p.endswith("-") and name.startswith(p) for p in allow)


class RedactedMeta(Record, record=True):
    """Result of :func:`redact_exchange_meta`.

    Fields: ``query`` (raw query string with secret values replaced by ``REDACTED``), ``headers``
    (kept headers, lower-case name -> value), ``secrets`` (secret header or ``?name`` -> 8-hex
    fingerprint), ``dropped`` (names of headers neither allowed nor secret).
    """

    query: str
    headers: dict[str, str]
    secrets: dict[str, str]
    dropped: list[str]

    def __init__(
        self,
        query: str,
        headers: dict[str, str],
        secrets: dict[str, str],
        dropped: list[str],
    ) -> None:
        self.query = query
        self.headers = headers
        self.secrets = secrets
        self.dropped = dropped


_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")


def _base64_key(value: str) -> tuple[str, str] | None:
    """The first run of 24 or more base64 characters in ``value`` whose decoding holds a
    key-shaped token, and that token; None when there is none. Header values the allow-list
    keeps are words and versions, so a run that long is rare and decoding it is cheap."""
    for run in _BASE64_RUN.findall(value):
        text = run.rstrip("=")
        try:
            raw = base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            continue
        found = _KEY_SHAPES.search(raw.decode("latin-1"))
        if found is not None:
            return run, found.group(0)
    return None


def redact_exchange_meta(
    query: str,
    headers: Iterable[tuple[str, str]],
    key: bytes,
    *,
    allow: frozenset[str] | None = REQUEST_HEADER_ALLOW,
    credentials: Iterable[str] = (),
) -> RedactedMeta:
    """Remove secrets from a request's (or response's) query string and headers.

    The one redaction function every journal writer path uses.

    Args:
        query: the raw query string without ``?`` (``alt=sse&key=AIza...``).
        headers: (name, value) pairs as received.
        key: per-journal HMAC key for fingerprints (bytes).
        allow: header allow-list (exact lower-case names, or prefixes ending in ``-``); None keeps
            every non-secret header (used for response headers).
        credentials: the request's credentials (:func:`request_secrets`) when ``headers`` are a
            response's: a kept value that repeats one (an upstream's ``X-Echo``) has it
            ``REDACTED``, as a kept request header that repeats one of the request's own secret
            header values (a key that is not key-shaped, in ``User-Agent`` too) has.

    Returns:
        :class:`RedactedMeta`. Secret values never appear in it, in any encoding; a repeated
        header keeps its values joined with ``", "``.
    """
    kept: dict[str, str] = {}
    secrets: dict[str, str] = {}
    dropped: list[str] = []
    headers = list(headers)
    creds = {credential(v) for name, v in headers if is_secret_header(name)} | set(credentials)
    # each credential in the forms a header may repeat it in (as sent, percent-encoded, base64)
    needles = sorted(
        {(f.decode("latin-1"), c) for c in creds if len(c) >= 8 for f in secret_forms(c)},
        key=lambda fc: len(fc[0]),
        reverse=True,
    )
    for name, value in headers:
        n = name.lower()
        # a key used as the name itself: neither kept nor listed by name (the name is stored
        # lower-cased, so a key that is key-shaped only lower-cased counts too)
        shaped = name if has_key_shape(name) else n if has_key_shape(n) else None
        if shaped is not None:
            found = _KEY_SHAPES.search(shaped) or _KEY_SHAPES.search(_unquote(shaped))
            assert found is not None  # has_key_shape said so
            secrets[redact_shapes(shaped).lower()] = fingerprint(found.group(0), key)
        elif is_secret_header(n):
            secrets[n] = fingerprint(credential(value), key)
        elif allow is None or _header_allowed(n, allow):
            encoded = "%" in value and _KEY_SHAPES.search(_unquote(value))
            found = _KEY_SHAPES.search(value) or encoded or None
            if found is not None:  # a key where no name says so (user-agent, anthropic-beta, ...)
                secrets[n] = fingerprint(found.group(0), key)
                value = redact_shapes(value)
            coded = _base64_key(value)
            if coded is not None:  # a key hidden in base64 (a JSON blob in an x-stainless-* value)
                secrets[n] = fingerprint(coded[1], key)
                value = value.replace(coded[0], "REDACTED")
            for form, cred in needles:  # the request's credential, key-shaped or not, repeated
                if form in value:
                    secrets[n] = fingerprint(cred, key)
                    value = value.replace(form, "REDACTED")
            kept[n] = f"{kept[n]}, {value}" if n in kept else value
        elif n not in dropped:
            dropped.append(n)
    if not query:
        return RedactedMeta(query, kept, secrets, dropped)
    out: list[str] = []
    pieces = re.split(r"([&;])", query)  # the separators kept, at odd positions
    for i, segment in enumerate(pieces):
        if i % 2:
            out.append(segment)
            continue
        name, value = _query_pair(segment)
        if value is not None and is_secret_query_param(name):
            secrets["?" + name] = fingerprint(value, key)
            eq = segment.find("=")
            if eq < 0:  # the "=" was percent-encoded: keep the name as it was written
                eq = segment.lower().find("%3d") + 2
            out.append(segment[: eq + 1] + "REDACTED")
            continue
        found = _KEY_SHAPES.search(_unquote(segment))
        if found is not None:  # the key may be the name itself (?sk-ant-..., ?AIza...=1)
            secrets["?" + _KEY_SHAPES.sub("REDACTED", name)] = fingerprint(found.group(0), key)
            segment = _KEY_SHAPES.sub("REDACTED", segment)
            if _KEY_SHAPES.search(_unquote(segment)):  # the key itself percent-encoded
                segment = _quote(_KEY_SHAPES.sub("REDACTED", _unquote(segment)), safe="=")
        out.append(segment)
    return RedactedMeta("".join(out), kept, secrets, dropped)


def redact_url(url: str) -> str:
    """Return ``url`` with every secret query value replaced by ``REDACTED``, for logs and error
    messages (no fingerprint: callers that log have no journal key)."""
    base, q, rest = url.partition("?")
    if not q:
        base, hashmark, fragment = url.partition("#")
        query = ""
    else:
        query, hashmark, fragment = rest.partition("#")
    if fragment:  # a fragment is never sent, but a client may write one into the request line
        fragment = redact_exchange_meta(fragment, (), b"").query
    query = "?" + redact_exchange_meta(query, (), b"").query if q else ""
    return redact_path(base) + query + hashmark + fragment


class SecretFileWhy(str, enum.Enum):
    """Why a snapshot withholds a workspace file (:func:`secret_file`; docs/snapshots.md "Secrets")."""

    #: its name marks a file that holds secrets (:data:`SECRET_FILE_NAMES`, :data:`SECRET_FILE_GLOBS`)
    SECRET_NAME = "secret_name"
    #: a package manager's settings file (``.npmrc``, ``.pypirc``...) that holds a token or password
    TOKEN_IN_CONFIG = "token_in_config"
    #: its bytes hold a key-shaped token (:func:`has_key_shape`'s shapes)
    KEY_SHAPED = "key_shaped"


#: file names (exact, of the file itself) that mark a file holding secrets: dotenv files, netrc
#: and pgpass passwords, git's stored credentials, htpasswd hashes
SECRET_FILE_NAMES = frozenset({".env", ".netrc", "_netrc", ".pgpass", ".git-credentials", ".htpasswd"})
#: name patterns (``fnmatch``, of the file's name) that mark one: other dotenv files, private
#: keys and key stores, ssh private keys (their ``.pub`` public halves are kept), cloud
#: credential files
SECRET_FILE_GLOBS = (
    ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "credentials*.json", "client_secret*.json",
)  # fmt: skip
#: dotenv files made to be shared (placeholders): kept unless their bytes hold a key-shaped token
SECRET_FILE_TEMPLATES = frozenset({".env.example", ".env.sample", ".env.template", ".env.dist"})
#: settings files that are secret only when they hold a token or password (:data:`_CONFIG_TOKEN`)
TOKEN_CONFIG_NAMES = frozenset({".npmrc", ".pypirc", ".yarnrc", ".yarnrc.yml", ".gemrc"})
_CONFIG_TOKEN = re.compile(
    rb"(?im)^\s*[^#;\n]*(?:_authtoken|_auth|_password|password|token|npmauthtoken)\s*[=:]\s*\S"
)


def secret_file_name(name: str) -> bool:
    """Whether a file named ``name`` (its last path component) is withheld from a snapshot by its
    name alone (:data:`SECRET_FILE_NAMES`, :data:`SECRET_FILE_GLOBS`; not a ``.pub`` key nor a
    dotenv template of :data:`SECRET_FILE_TEMPLATES`)."""
    import fnmatch  # here: only a snapshot's walk asks

    if name in SECRET_FILE_NAMES:
        return True
    if name in SECRET_FILE_TEMPLATES or name.endswith(".pub"):
        return False
    return any(fnmatch.fnmatchcase(name, g) for g in SECRET_FILE_GLOBS)


#: the literal starts of the key shapes: a file is searched with the shapes only where one occurs
_KEY_STARTS = (
    b"sk-", b"AIza", b"ya29.", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_", b"glpat-", b"hf_",
    b"AKIA", b"ASIA", b"xox",
)  # fmt: skip


def _bytes_key_shaped(data: bytes) -> bool:
    """Whether ``data`` holds a key-shaped token: the shapes tried only where one of their
    literal starts occurs (found at memory speed; the regex over a whole file ran at ~50 MB/s,
    and a walk reads every new file of the workspace)."""
    for start in _KEY_STARTS:
        i = data.find(start)
        while i >= 0:
            if _KEY_SHAPES_BYTES.match(data, i) is not None:
                return True
            i = data.find(start, i + 1)
    return False


def secret_file(name: str, data: bytes) -> SecretFileWhy | None:
    """Why a workspace file named ``name`` (its last component) holding ``data`` must not be
    stored in a snapshot, or None: its name (:func:`secret_file_name`), a settings file of
    :data:`TOKEN_CONFIG_NAMES` with a token or password line, or a key-shaped token anywhere in
    its bytes (text or not: a key in a SQLite file is the same key; percent-encoded too)."""
    if secret_file_name(name):
        return SecretFileWhy.SECRET_NAME
    if name in TOKEN_CONFIG_NAMES and _CONFIG_TOKEN.search(data):
        return SecretFileWhy.TOKEN_IN_CONFIG
    if _bytes_key_shaped(data):
        return SecretFileWhy.KEY_SHAPED
    # a key percent-encoded (a URL saved in a file): looked for in files up to 1 MiB
    if len(data) <= 1 << 20 and b"%" in data and _KEY_SHAPES.search(_unquote(data.decode("latin-1"))):
        return SecretFileWhy.KEY_SHAPED
    return None


#: a URL with user info (``scheme://user@host``, ``scheme://user:password@host``): a Sentry DSN's
#: public key, a password, a token as user name
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]+@")
#: a JSON Web Token: base64url header and payload (JSON objects: ``eyJ``), a signature
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")


#: a percent-escape (``%2F``) and a run of hex digits long enough to spell a key (20 bytes)
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}){20,}(?![0-9A-Fa-f])")


def secret_value(text: str) -> bool:
    """Whether ``text`` (a variable's value, say) may be a secret whatever it is named: a
    key-shaped token (:func:`has_key_shape`), a URL with user info (a password or not: the
    user part of a Sentry DSN is its key), a JSON Web Token, or base64 whose decoding holds a
    key-shaped token; each also percent-decoded (``https%3A%2F%2Fu%3Apw%40h``) and in a run of
    hex digits (a key's bytes in hex: a commit id decodes to no key and stays)."""
    if _plain_secret(text):
        return True
    if "%" in text and _plain_secret(_PERCENT.sub(lambda m: chr(int(m[1], 16)), text)):
        return True
    return any(_plain_secret(bytes.fromhex(m[0]).decode("latin-1")) for m in _HEX_RUN.finditer(text))


def _plain_secret(text: str) -> bool:
    return (
        has_key_shape(text)
        or _URL_USERINFO.search(text) is not None
        or _JWT.search(text) is not None
        or _base64_key(text) is not None
    )
