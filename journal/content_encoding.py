"""Undo an HTTP ``Content-Encoding`` (gzip, deflate, br, zstd) with a size bound.

Request bodies are stored decoded (RFC 9110 §8.4 content codings). Decoding is streaming so that
frames without a declared size (zstd as Codex sends it) work, and bounded so that a
decompression bomb stops at ``limit`` bytes instead of exhausting memory.
"""

from __future__ import annotations

import functools
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


#: input bytes given to a decoder per call by :func:`decode_prefix`: a corrupt or cut stream
#: keeps what its pieces before the fault decoded
_PIECE = 64 * 1024
#: input bytes per call to a brotli decoder that cannot bound its output (brotli < 1.2)
_BROTLI_SMALL_PIECE = 64


@functools.cache
def _brotli_bounds_output() -> bool:
    """Whether this brotli's ``Decompressor.process`` takes ``output_buffer_limit`` (1.2 on)."""
    import brotli

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
    out = bytearray()
    failed = False
    rest = data
    if coding in ("gzip", "x-gzip", "deflate"):
        while True:
            if coding == "deflate" and rest[:1] and (rest[0] & 0x0F) != 8:
                wbits = -zlib.MAX_WBITS
            else:
                wbits = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
            d = zlib.decompressobj(wbits)
            after = b""
            try:
                for i in range(0, len(rest), _PIECE):
                    out += d.decompress(rest[i : i + _PIECE], limit + 1 - len(out))
                    if len(out) > limit:
                        return bytes(out[:limit]), False
                    if d.eof:
                        after = rest[i + _PIECE :]
                        break
            except zlib.error:
                failed = True
                break
            if not d.eof:
                return _nothing_or(out, coding, failed=False)
            rest = d.unused_data + after
            if not (coding != "deflate" and rest[:2] == b"\x1f\x8b"):
                break  # a further gzip member is decoded; anything else is not the body
        return _nothing_or(out, coding, failed=failed, whole=not failed and not rest)
    if coding == "br":
        import brotli

        d = brotli.Decompressor()
        bounded = _brotli_bounds_output()
        # brotli 1.1 (which mitmproxy pins) cannot bound one call's output: small pieces of
        # input then keep what one call may produce small, and the limit is checked after each
        piece = _PIECE if bounded else _BROTLI_SMALL_PIECE
        try:
            for i in range(0, len(data), piece):
                chunk = data[i : i + piece]
                out += (
                    d.process(chunk, output_buffer_limit=limit + 1 - len(out))
                    if bounded
                    else d.process(chunk)
                )
                if len(out) > limit:
                    return bytes(out[:limit]), False
        except brotli.error:
            failed = True
        return _nothing_or(out, coding, failed=failed, whole=not failed and d.is_finished())
    if coding == "zstd":
        zstd = _zstd()
        while True:
            d = zstd.ZstdDecompressor()
            after = b""
            try:
                for i in range(0, len(rest), _PIECE):
                    out += d.decompress(rest[i : i + _PIECE], max_length=limit + 1 - len(out))
                    if len(out) > limit:
                        return bytes(out[:limit]), False
                    if d.eof:
                        after = rest[i + _PIECE :]
                        break
            except zstd.ZstdError:
                failed = True
                break
            if not d.eof:
                return _nothing_or(out, coding, failed=False)
            rest = d.unused_data + after
            if not rest:
                break
        return _nothing_or(out, coding, failed=failed, whole=not failed)
    raise DecodeError(f"unknown content coding {coding!r}")


def _nothing_or(out: bytearray, coding: str, *, failed: bool, whole: bool = False) -> tuple[bytes, bool]:
    """``(out, whole)``, or DecodeError when the decoder failed before any output."""
    if failed and not out:
        raise DecodeError(f"{coding} body does not decode")
    return bytes(out), whole
