"""Incremental Server-Sent Events decoding and encoding, on bytes, and the protocol-neutral
pieces every protocol's stream reassembly reads events with (:func:`events`, :class:`BareJson`).
The protocol modules import it where they read or write a stream, so that a command that only
renders requests (``replay --prepare-only``) never loads it.

Rules (WHATWG HTML "Server-sent events", as the official SDKs apply them, e.g.
anthropic-sdk-python ``_streaming.py`` ``SSEDecoder``):

- an event ends at a blank line; line ends are ``\\r\\n``, ``\\n`` or ``\\r``, so events are
  separated by ``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``;
- ``data:`` lines of one event are joined with ``\\n``; one space after the colon is dropped;
- lines starting with ``:`` are comments;
- an event pending when the stream ends is still delivered (:meth:`SSEDecoder.flush`): real
  Anthropic streams end without a final blank line;
- a line that is not a field (no colon, or an unknown field name) is kept as a *stray* line:
  Gemini streams may carry bare JSON error lines (python-genai ``_api_client.py``).

Splitting happens on bytes, so a multi-byte UTF-8 character split across chunks is decoded
whole; invalid UTF-8 is replaced with U+FFFD.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(slots=True)
class SSEEvent:
    """One decoded event: ``event`` name (None when absent), joined ``data``, ``id``, and any
    ``stray`` lines (non-SSE lines seen while this event was open, in order)."""

    event: str | None = None
    data: str = ""
    id: str | None = None
    has_data: bool = False
    stray: list[str] = field(default_factory=list)


class SSEDecoder:
    """Feed raw bytes in any chunking; get complete events. Split-invariant by construction."""

    __slots__ = ("_buf", "_event", "_pending_cr")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._event = SSEEvent()
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode as many complete lines of ``chunk`` (appended to what came before) as possible."""
        out: list[SSEEvent] = []
        buf = self._buf
        buf += chunk
        start = 0
        if self._pending_cr and buf:
            # the previous chunk ended with \r: a \n here belongs to the same line end
            if buf[0] == 0x0A:
                start = 1
            self._pending_cr = False
        n = len(buf)
        for m in _EOL.finditer(buf, start):
            self._line(bytes(buf[start : m.start()]), out)
            start = m.end()
            if start == n and buf[n - 1] == 0x0D:
                self._pending_cr = True
        del buf[:start]
        return out

    def flush(self) -> list[SSEEvent]:
        """End of stream: deliver the last line and a pending event even without a blank line."""
        out: list[SSEEvent] = []
        if self._buf:
            line = bytes(self._buf)
            self._buf.clear()
            self._line(line, out)
        self._pending_cr = False
        ev = self._event
        if ev.has_data or ev.event is not None or ev.stray:
            out.append(ev)
        self._event = SSEEvent()
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        ev = self._event
        if not raw:
            if ev.has_data or ev.event is not None or ev.stray:
                out.append(ev)
            self._event = SSEEvent()
            return
        line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            return
        name, colon, value = line.partition(":")
        if not colon:
            ev.stray.append(line)
            return
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            ev.data = f"{ev.data}\n{value}" if ev.has_data else value
            ev.has_data = True
        elif name == "event":
            ev.event = value
        elif name == "id":
            ev.id = value
        elif name == "retry":
            pass
        else:
            ev.stray.append(line)


def decode_all(chunks) -> list[SSEEvent]:
    """Decode an iterable of byte chunks completely (including the pending event at the end)."""
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out.extend(dec.feed(chunk))
    out.extend(dec.flush())
    return out


def events(chunks: Iterable[bytes] | bytes) -> Iterator[SSEEvent]:
    """Every event of a byte stream (one bytes object, or byte chunks split anywhere) as it
    completes, the event pending at the end included (:meth:`SSEDecoder.flush`)."""
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = [bytes(chunks)]
    dec = SSEDecoder()
    for chunk in chunks:
        yield from dec.feed(bytes(chunk))
    yield from dec.flush()


class BareJson:
    """Whole JSON objects from text outside SSE ``data:`` lines: python-genai brace-counts such
    lines (``_api_client.py``) to read error objects, possibly spread over several lines. The
    ``[``, ``,`` and ``]`` between objects are skipped, so a stream framed as a JSON array
    (``[{…},\n{…}]``, Gemini's ``streamGenerateContent`` without ``alt=sse``) is read the same
    way."""

    __slots__ = ("buf", "depth", "in_str", "esc")

    def __init__(self) -> None:
        self.buf: list[str] = []
        self.depth = 0
        self.in_str = False
        self.esc = False

    def feed(self, text: str) -> tuple[list[str], str]:
        """Objects completed by ``text``, and any stray non-JSON text found between objects."""
        done: list[str] = []
        junk: list[str] = []
        for ch in text:
            if self.depth == 0:
                if ch == "{":
                    self.depth = 1
                    self.buf = ["{"]
                elif ch not in " \t\r\n[],":
                    junk.append(ch)
                continue
            self.buf.append(ch)
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif ch == "\\":
                    self.esc = True
                elif ch == '"':
                    self.in_str = False
            elif ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    done.append("".join(self.buf))
                    self.buf = []
        return done, "".join(junk)


def encode_event(data: bytes, event: str | None = None, *, eol: bytes = b"\n") -> bytes:
    """Frame one event: optional ``event:`` line, one ``data:`` line, blank line. ``data`` must not
    contain line breaks (compact JSON never does)."""
    if event is None:
        return b"data: " + data + eol + eol
    return b"event: " + event.encode() + eol + b"data: " + data + eol + eol
