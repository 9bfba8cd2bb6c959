"""Undo an HTTP ``Content-Encoding`` (gzip, deflate, br, zstd) with a size bound.

Request bodies are stored decoded (RFC 9110 §8.4 content codings). Decoding is streaming so that
frames without a declared size (zstd as Codex sends it) work, and bounded so that a
decompression bomb stops at ``limit`` bytes instead of exhausting memory.
"""

from __future__ import annotations

import zlib

DEFAULT_LIMIT = 256 * 1024 * 1024  # bytes
#: the stored response header that takes the place of ``content-encoding`` when the journal
#: stores a response body decoded (an error response, cleaned of the request's key once decoded)
DECODED_ENCODING_HEADER = "pvisor-decoded-content-encoding"


class DecodeError(Exception):
    """The body could not be decoded, or decoded past the limit. The message names the coding."""


def _zstd():
    try:
        from compression import zstd  # Python >= 3.14
    except ImportError:
        from backports import zstd
    return zstd


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
    if coding in ("gzip", "x-gzip", "deflate"):
        if coding == "deflate" and data[:1] and (data[0] & 0x0F) != 8:
            wbits = -zlib.MAX_WBITS  # raw deflate, sent by some clients despite RFC 9110
        else:
            wbits = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(data, limit + 1)
            if len(out) > limit:
                raise DecodeError(f"{coding} body decodes to more than {limit} bytes")
            if d.unconsumed_tail:
                raise DecodeError(f"{coding} body decodes to more than {limit} bytes")
            out += d.flush()
        except zlib.error as exc:
            raise DecodeError(f"{coding} body is corrupt: {exc}") from None
        if not d.eof:
            raise DecodeError(f"{coding} body is truncated")
        return out
    if coding == "br":
        import brotli

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
    if coding == "zstd":
        zstd = _zstd()
        d = zstd.ZstdDecompressor()
        try:
            out = d.decompress(data, max_length=limit + 1)
        except zstd.ZstdError as exc:
            raise DecodeError(f"zstd body is corrupt: {exc}") from None
        if len(out) > limit:
            raise DecodeError(f"zstd body decodes to more than {limit} bytes")
        if not d.eof:
            raise DecodeError("zstd body is truncated")
        if d.unused_data:
            # several concatenated frames are legal (RFC 8878 §3.1)
            return out + _decode_one(d.unused_data, "zstd", limit - len(out))
        return out
    raise DecodeError(f"unknown content coding {coding!r}")


def encode_body(data: bytes, encoding: str) -> bytes:
    """Apply ``encoding`` (a Content-Encoding value as :func:`decode_body` reads it, codings in
    order) to ``data``: the inverse of :func:`decode_body`, used where stored bytes must be
    rewritten in the coding they were received in (``pvisor journal scrub``). The bytes differ
    from the sender's (other levels, other encoders); they decode to ``data``. Raises
    DecodeError for a coding it does not know."""
    for coding in [c.strip().lower() for c in encoding.split(",") if c.strip()]:
        if coding in ("identity", ""):
            continue
        if coding in ("gzip", "x-gzip"):
            import gzip

            data = gzip.compress(data, mtime=0)
        elif coding == "deflate":
            data = zlib.compress(data)
        elif coding == "br":
            import brotli

            data = brotli.compress(data)
        elif coding == "zstd":
            data = _zstd().compress(data)
        else:
            raise DecodeError(f"unknown content coding {coding!r}")
    return data
