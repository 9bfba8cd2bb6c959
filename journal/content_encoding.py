"""Undo an HTTP ``Content-Encoding`` (gzip, deflate, br, zstd) with a size bound.

Request bodies are stored decoded (RFC 9110 §8.4 content codings). Decoding is streaming so that
frames without a declared size (zstd as Codex sends it) work, and bounded so that a
decompression bomb stops at ``limit`` bytes instead of exhausting memory.
"""

from __future__ import annotations

import functools
import gzip
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import brotli

try:
    from compression import zstd  # Python >= 3.14
except ImportError:
    from backports import zstd

DEFAULT_LIMIT = 256 * 1024 * 1024  # bytes
#: the stored response header that takes the place of ``content-encoding`` when the journal
#: stores a response body decoded (an error response, cleaned of the request's key once decoded)
DECODED_ENCODING_HEADER = "pvisor-decoded-content-encoding"


class DecodeError(Exception):
    """The body could not be decoded, or decoded past the limit. The message names the coding."""


@dataclass(frozen=True, slots=True)
class _StreamCodec:
    """A coding whose decoder is a zlib-like object (``decompress(data, max_length=)``, ``eof``,
    ``unused_data``): gzip, deflate and zstd. ``new(data)`` gives the decoder of the member or
    frame ``data`` starts with; ``error`` is what it raises on corrupt input; ``more(rest)``
    says whether the bytes after a finished member are a further member of the body (for
    :func:`decode_prefix`); ``frames``: :func:`decode_body` decodes every frame, not only the
    first member."""

    new: Callable[[bytes], Any]
    error: type[Exception]
    more: Callable[[bytes], bool]
    frames: bool = False


def _zlib_wbits(coding: str, data: bytes) -> int:
    if coding == "deflate" and data[:1] and (data[0] & 0x0F) != 8:
        return -zlib.MAX_WBITS  # raw deflate, sent by some clients despite RFC 9110
    return 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS


def _zlib_codec(coding: str) -> _StreamCodec:
    return _StreamCodec(
        new=lambda data: zlib.decompressobj(_zlib_wbits(coding, data)),
        error=zlib.error,
        # a further gzip member is decoded; anything else is not the body
        more=lambda rest: coding != "deflate" and rest[:2] == b"\x1f\x8b",
    )


_STREAM_CODECS = {
    "gzip": _zlib_codec("gzip"),
    "x-gzip": _zlib_codec("x-gzip"),
    "deflate": _zlib_codec("deflate"),
    # several concatenated frames are legal (RFC 8878 §3.1)
    "zstd": _StreamCodec(
        new=lambda _data: zstd.ZstdDecompressor(), error=zstd.ZstdError, more=bool, frames=True
    ),
}
#: each coding's encoder (:func:`encode_body`)
_ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "x-gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd.compress,
}


def decode_body(data: bytes, encoding: str, *, limit: int = DEFAULT_LIMIT) -> bytes:
    """Decode ``data`` per ``encoding`` (a Content-Encoding header value, possibly a list such as
    ``"gzip, br"``, applied in order, so decoded in reverse). ``identity`` and "" return ``data``.

    Raises DecodeError for an unknown coding, corrupt data, a truncated stream, or output over
    ``limit`` bytes.
    """
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        data = _decode_one(data, coding, limit)
    return data


def _decode_one(data: bytes, coding: str, limit: int) -> bytes:
    if coding in ("identity", ""):
        return data
    codec = _STREAM_CODECS.get(coding)
    if codec is not None:
        return _decode_stream(data, coding, codec, limit)
    if coding == "br":
        d = brotli.Decompressor()
        try:
            out = d.process(data, output_buffer_limit=limit + 1)
        except TypeError:  # brotli < 1.2 has no output limit
            out = d.process(data)
        except brotli.error as exc:
            raise DecodeError(f"br body is corrupt: {exc}") from None
        if len(out) > limit:
            raise DecodeError(f"br body decodes to more than {limit} bytes")
        if not d.is_finished():
            raise DecodeError("br body is truncated")
        return out
    raise DecodeError(f"unknown content coding {coding!r}")


def _decode_stream(data: bytes, coding: str, codec: _StreamCodec, limit: int) -> bytes:
    """Decode the first member of a gzip or deflate body, or every frame of a zstd one."""
    d = codec.new(data)
    try:
        out = d.decompress(data, max_length=limit + 1)
        # zlib keeps input it did not decode for the lack of output room as unconsumed_tail
        if len(out) > limit or getattr(d, "unconsumed_tail", b""):
            raise DecodeError(f"{coding} body decodes to more than {limit} bytes")
        if hasattr(d, "flush"):  # zlib's decoder; zstd's gives all it has in decompress
            out += d.flush()
    except codec.error as exc:
        raise DecodeError(f"{coding} body is corrupt: {exc}") from None
    if not d.eof:
        raise DecodeError(f"{coding} body is truncated")
    if codec.frames and d.unused_data:
        return out + _decode_stream(d.unused_data, coding, codec, limit - len(out))
    return out


def encode_body(data: bytes, encoding: str) -> bytes:
    """Apply ``encoding`` (a Content-Encoding value as :func:`decode_body` reads it, codings in
    order) to ``data``: the inverse of :func:`decode_body`, used where stored bytes must be
    rewritten in the coding they were received in (``pvisor journal scrub``). The bytes differ
    from the sender's (other levels, other encoders); they decode to ``data``. Raises
    DecodeError for a coding it does not know."""
    for coding in [c.strip().lower() for c in encoding.split(",") if c.strip()]:
        if coding in ("identity", ""):
            continue
        encoder = _ENCODERS.get(coding)
        if encoder is None:
            raise DecodeError(f"unknown content coding {coding!r}")
        data = encoder(data)
    return data


#: input bytes given to a decoder per call by :func:`decode_prefix`: a corrupt or cut stream
#: keeps what its pieces before the fault decoded
_PIECE = 64 * 1024
#: input bytes per call to a brotli decoder that cannot bound its output (brotli < 1.2)
_BROTLI_SMALL_PIECE = 64


@functools.cache
def _brotli_bounds_output() -> bool:
    """Whether this brotli's ``Decompressor.process`` takes ``output_buffer_limit`` (1.2 on)."""
    try:
        brotli.Decompressor().process(b"", output_buffer_limit=1)
    except TypeError:
        return False
    return True


def decode_prefix(data: bytes, encoding: str, *, limit: int) -> tuple[bytes, bool]:
    """The decoded start of ``data`` per ``encoding`` (as :func:`decode_body` reads it), at most
    ``limit`` bytes, and whether it is the whole body: False when the output was cut at
    ``limit`` or the rest of ``data`` did not decode (truncated, corrupt, trailing bytes that
    are no further member or frame). Streaming and bounded: memory stays near ``limit`` plus
    one input piece whatever the body decodes to.

    Raises DecodeError when nothing of ``data`` decodes: an unknown coding, or a decoder that
    fails before its first output byte (a ``br`` label on gzip bytes)."""
    whole = True
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding in ("identity", ""):
            continue
        data, stage_whole = _prefix_one(data, coding, limit)
        whole = whole and stage_whole
    if len(data) > limit:
        return data[:limit], False
    return data, whole


def _prefix_one(data: bytes, coding: str, limit: int) -> tuple[bytes, bool]:
    codec = _STREAM_CODECS.get(coding)
    if codec is not None:
        return _prefix_stream(data, coding, codec, limit)
    if coding == "br":
        return _prefix_brotli(data, limit)
    raise DecodeError(f"unknown content coding {coding!r}")


def _prefix_stream(data: bytes, coding: str, codec: _StreamCodec, limit: int) -> tuple[bytes, bool]:
    """:func:`_prefix_one` of gzip, deflate and zstd: member after member (frame after frame),
    each fed in pieces of ``_PIECE`` bytes."""
    out = bytearray()
    failed = False
    rest = data
    while True:
        d = codec.new(rest)
        after = b""
        try:
            for i in range(0, len(rest), _PIECE):
                out += d.decompress(rest[i : i + _PIECE], max_length=limit + 1 - len(out))
                if len(out) > limit:
                    return bytes(out[:limit]), False
                if d.eof:
                    after = rest[i + _PIECE :]
                    break
        except codec.error:
            failed = True
            break
        if not d.eof:
            return _nothing_or(out, coding, failed=False)
        rest = d.unused_data + after
        if not codec.more(rest):
            break
    return _nothing_or(out, coding, failed=failed, whole=not failed and not rest)


def _prefix_brotli(data: bytes, limit: int) -> tuple[bytes, bool]:
    out = bytearray()
    failed = False
    d = brotli.Decompressor()
    bounded = _brotli_bounds_output()
    # brotli 1.1 (which mitmproxy pins) cannot bound one call's output: small pieces of
    # input then keep what one call may produce small, and the limit is checked after each
    piece = _PIECE if bounded else _BROTLI_SMALL_PIECE
    try:
        for i in range(0, len(data), piece):
            chunk = data[i : i + piece]
            out += d.process(chunk, output_buffer_limit=limit + 1 - len(out)) if bounded else d.process(chunk)
            if len(out) > limit:
                return bytes(out[:limit]), False
    except brotli.error:
        failed = True
    return _nothing_or(out, "br", failed=failed, whole=not failed and d.is_finished())


def _nothing_or(out: bytearray, coding: str, *, failed: bool, whole: bool = False) -> tuple[bytes, bool]:
    """``(out, whole)``, or DecodeError when the decoder failed before any output."""
    if failed and not out:
        raise DecodeError(f"{coding} body does not decode")
    return bytes(out), whole
