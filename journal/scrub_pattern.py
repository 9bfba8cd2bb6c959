"""What ``pvisor journal scrub`` replaces (:mod:`pvisor.journal.scrub`): the :class:`Pattern`
over bytes, a literal text with its JSON-escaped forms or a regular expression, and the
replacement, checked before anything is searched.

A literal text is searched as its UTF-8 bytes and in its JSON-escaped forms (once and twice
escaped, with and without ``\\uXXXX`` escapes: a key inside a tool call's ``arguments`` string);
a regular expression (``--regex``) is matched on the bytes as they are.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterator

from pvisor.core.errors import UsageError

DEFAULT_REPLACEMENT = "[scrubbed]"


#: a literal text shorter than this would match inside ordinary words, digests and base64
MIN_TEXT_CHARS = 4


#: the longest replacement: it may become part of a file name (255 bytes on most file systems)
MAX_REPLACEMENT_BYTES = 64


#: what a replacement may hold: it goes as it is into JSON strings (of every escaping depth),
#: header values, snapshot paths and file names, so nothing any of them reads otherwise (no quote,
#: backslash, slash, control or non-ASCII character)
_SAFE_REPLACEMENT = re.compile(rb"[A-Za-z0-9 _\-\[\]<>*#:=+,.@~%!^()|{}';&$?]+")


def _arg_bytes(value: str | bytes) -> bytes:
    """A command-line argument's own bytes (click hands over the undecodable ones as surrogate
    escapes, ``os.fsencode`` gives them back)."""
    return value if isinstance(value, bytes) else os.fsencode(value)


class Pattern:
    """What scrub replaces, over bytes: a literal ``text`` (with its JSON-escaped forms) or a
    regular expression ``regex`` (Python syntax, matched on the stored bytes), and the
    ``replacement``. Text and regex are taken as the bytes the user gave (str arguments with
    surrogate escapes are turned back into them; a text that is not UTF-8 is searched only as
    bytes). UsageError (exit 2) for an empty or too short text, a regex that does not compile
    or matches the empty string, a replacement that would match again, or one that is empty,
    only dots or holds a character outside ``_SAFE_REPLACEMENT`` (it would change what a JSON
    string, a path or a header means). Errors never repeat the text or the regex: either may
    be the secret."""

    def __init__(
        self,
        text: str | bytes | None = None,
        regex: str | bytes | None = None,
        replacement: str = DEFAULT_REPLACEMENT,
    ):
        if (text is None) == (regex is None):
            raise UsageError("scrub: give the text to remove, or --regex RE (one of them)")
        repl = _arg_bytes(replacement)
        if len(repl) > MAX_REPLACEMENT_BYTES:
            raise UsageError(
                f"scrub: --replacement is {len(repl)} bytes; at most {MAX_REPLACEMENT_BYTES} "
                "(it may become part of a file name, whose length is limited)"
            )
        if not _SAFE_REPLACEMENT.fullmatch(repl) or not repl.strip(b"."):
            raise UsageError(
                "scrub: --replacement must be non-empty printable ASCII, not only dots, without a quote, "
                "backslash or slash (it is written unescaped into JSON strings, paths and file names)"
            )
        self.replacement = repl.decode("ascii")
        self._repl = repl
        if text is not None:
            raw = _arg_bytes(text)
            try:
                decoded: str | None = raw.decode("utf-8")
            except UnicodeDecodeError:
                decoded = None  # not UTF-8: no JSON holds it escaped, so only its bytes are searched
            if (len(decoded) if decoded is not None else len(raw)) < MIN_TEXT_CHARS:
                raise UsageError(
                    f"scrub: the text must have at least {MIN_TEXT_CHARS} characters "
                    "(a shorter one matches inside words, digests and base64); use --regex to insist"
                )
            if raw in repl:
                raise UsageError("scrub: the replacement contains the text it replaces")
            self.describe = f"text of {len(raw)} bytes"
            self._raw = raw
            forms = {raw} | ({f.encode() for f in _escaped_forms(decoded)} if decoded is not None else set())
            # longest first: an escaped form is replaced before a form it contains
            self._forms = sorted(forms, key=len, reverse=True)
            self._regex = None
        else:
            raw = _arg_bytes(regex)
            try:
                compiled = re.compile(raw)
            except re.error as exc:
                # the message names the position, never the pattern (which may be the secret)
                raise UsageError(f"scrub: --regex is not a regular expression: {exc}") from None
            if compiled.search(b""):
                raise UsageError("scrub: --regex matches the empty string")
            if compiled.search(repl):
                raise UsageError("scrub: the replacement matches --regex")
            self.describe = f"regex of {len(raw)} bytes"
            self._forms = []
            self._regex = compiled

    def sub(self, data: bytes) -> tuple[bytes, int]:
        """``data`` with every match replaced, and the number of replacements."""
        if self._regex is not None:
            repl = self._repl
            return self._regex.subn(lambda _m: repl, data)
        n = 0
        for old in self._forms:
            k = data.count(old)
            if k:
                data = data.replace(old, self._repl)
                n += k
        return data, n

    def mask(self, data: bytes) -> tuple[bytes, int]:
        """``data`` with every match overwritten by as many ``*`` as it has bytes (the length
        kept: a binary file's offsets stay valid)."""
        if self._regex is not None:
            return self._regex.subn(lambda m: b"*" * len(m.group(0)), data)
        n = 0
        for old in self._forms:
            k = data.count(old)
            if k:
                data = data.replace(old, b"*" * len(old))
                n += k
        return data, n

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """The (start, end) byte offsets of the matches in ``data``, in order, not overlapping
        (a literal text's raw form only: for decoded strings, where no escaping is left)."""
        if self._regex is not None:
            return [m.span() for m in self._regex.finditer(data)]
        out, start = [], 0
        raw = self._raw
        while True:
            i = data.find(raw, start)
            if i < 0:
                return out
            out.append((i, i + len(raw)))
            start = i + len(raw)

    def hide(self, text: str) -> str:
        """``text`` (a path, a message) with every match replaced: what scrub prints or reports
        never repeats the secret, even in the name of a file that held it."""
        return self.sub_text(text)

    def found(self, data: bytes) -> bool:
        if self._regex is not None:
            return self._regex.search(data) is not None
        return any(old in data for old in self._forms)

    def sub_text(self, value):
        """A cell's value with the replacement: str and bytes alike, anything else as it is."""
        if isinstance(value, str):
            out, n = self.sub(value.encode("utf-8", "surrogatepass"))
            return out.decode("utf-8", "surrogatepass") if n else value
        if isinstance(value, bytes):
            return self.sub(value)[0]
        return value

    def found_text(self, value) -> bool:
        if isinstance(value, str):
            return self.found(value.encode("utf-8", "surrogatepass"))
        if isinstance(value, bytes):
            return self.found(value)
        return False


def _escaped_forms(text: str) -> Iterator[str]:
    """The JSON-escaped forms of ``text``: once and twice, with and without ``\\uXXXX`` for
    non-ASCII, and with ``/`` escaped as ``\\/``. The replacement needs no form of its own: it
    holds nothing JSON escapes (``_SAFE_REPLACEMENT``)."""
    for ascii_only in (False, True):
        t = text
        for _ in range(2):
            t = json.dumps(t, ensure_ascii=ascii_only)[1:-1]
            yield t
            if "/" in t:
                yield t.replace("/", "\\/")
