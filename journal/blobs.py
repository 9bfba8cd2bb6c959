"""Content-addressed blob encoding: zstd, alone or against an earlier body as a raw prefix.

Every main-loop request repeats the whole conversation, so storing each body whole makes the
journal grow with the square of the session length. A request body is instead compressed with
the previous body of the same *lane* (same run, method and path) as a zstd raw-content prefix
(RFC 8878 §5, "raw content dictionaries"), so it costs roughly the bytes it adds.

Restore cost is bounded by keyframes. Position ``p`` in a lane (0-based) uses:

- ``p % 1024 == 0``: no reference (a standalone keyframe);
- ``p % 32 == 0``: the body at ``p - 32`` (the previous keyframe), so keyframes stay small;
- otherwise: the body at ``p - 1``.

Restoring any body therefore decompresses at most 31 + 31 + 1 = 63 frames. Each blob row names
its ``base`` (the sha256 of the reference body) and its ``size``; every restore is bounded by
that size (:func:`decode`) and checks the sha256 of the result.

Blob row codecs: ``identity`` (stored as is: short or incompressible), ``zstd`` (standalone
frame), ``zstd-prefix`` (frame compressed with the body ``base`` as a raw prefix).
"""

from __future__ import annotations

import hashlib
import io

try:
    from compression import zstd  # Python >= 3.14
except ImportError:  # pragma: no cover - depends on the Python version
    from backports import zstd

LEVEL = 3
KEYFRAME_EVERY = 32
STANDALONE_EVERY = 1024
_MIN_COMPRESS = 64  # bytes; smaller bodies are stored as they are
_CP = zstd.CompressionParameter
_DP = zstd.DecompressionParameter
#: the largest size a blob row may declare (bytes): SQLite's default limit on one string or blob
#: (SQLITE_MAX_LENGTH), the most ``pvisor_body`` could return; a row declaring more is damage
MAX_SIZE = 1_000_000_000


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def reference_position(pos: int) -> int | None:
    """Lane position whose body is the reference of position ``pos``, or None (keyframe)."""
    if pos % STANDALONE_EVERY == 0:
        return None
    if pos % KEYFRAME_EVERY == 0:
        return pos - KEYFRAME_EVERY
    return pos - 1


def encode(data: bytes, base: bytes | None = None) -> tuple[str, bytes]:
    """Compress ``data``, against ``base`` when given. Returns (codec, stored bytes).

    With a base, the zstd window is widened to cover base and data, and long-distance matching
    is on, so a repeated multi-megabyte prefix is still found.
    """
    if len(data) < _MIN_COMPRESS:
        return "identity", data
    if base:
        window_log = max(10, min(31, (len(base) + len(data)).bit_length()))
        options = {
            _CP.compression_level: LEVEL,
            _CP.window_log: window_log,
            _CP.enable_long_distance_matching: 1,
        }
        packed = zstd.compress(data, options=options, zstd_dict=zstd.ZstdDict(base, is_raw=True).as_prefix)
        codec = "zstd-prefix"
    else:
        packed = zstd.compress(data, level=LEVEL)
        codec = "zstd"
    if len(packed) >= len(data):
        return "identity", data
    return codec, packed


#: bytes of output one decompression step may produce (:func:`decode`)
DECODE_CHUNK = 1 << 20


def decode(codec: str, stored: bytes, base: bytes | None = None, *, size: int) -> bytes:
    """Undo :func:`encode` for a blob whose row declares ``size`` bytes (``blobs.size``).

    The declared size bounds the decoding, so a crafted frame (98 KB of zstd inflating to
    3 GiB) is refused without exhausting memory. Each frame's output length is known before
    any output is kept: from its header (RFC 8878 §3.1.1.1.4 Frame_Content_Size, which
    :func:`encode` always writes), and a header that disagrees with the row is damage before
    anything is decoded; or, for a frame without one, by decoding it once in
    :data:`DECODE_CHUNK` steps that are counted and dropped, stopping past ``size``. Only then is
    the result allocated, once, at its exact length, and decoded into: the process holds at
    most ``size`` bytes plus one chunk, and no second copy. A frame's window may be no larger
    than :func:`encode` can have used for that size. The caller still checks the result's
    length and sha256.

    Raises :class:`SizeError` (a ValueError) for a declared size outside 0..:data:`MAX_SIZE`,
    a frame header that disagrees with it, data that decodes past it, or a MemoryError while
    decoding (the blob is then damage, never a traceback); ValueError for an unknown codec or
    a missing base; ``zstd.ZstdError`` for corrupt or truncated data.
    """
    if not 0 <= size <= MAX_SIZE:
        raise SizeError(f"it declares {size} bytes, outside 0..{MAX_SIZE} (the largest body a journal holds)")
    if codec == "identity":
        return bytes(stored)
    if codec == "zstd":
        prefix = None
    elif codec == "zstd-prefix":
        if base is None:
            raise ValueError("zstd-prefix blob needs its base body")
        prefix = zstd.ZstdDict(base, is_raw=True).as_prefix
    else:
        raise ValueError(f"unknown blob codec {codec!r}")
    # encode() shrinks zstd's window to the input (and a frame against a base to base + data):
    # a frame header asking for more is refused before its window is allocated
    window_log = max(10, min(31, (len(base or b"") + size).bit_length() + 1))
    options = {_DP.window_log_max: window_log}
    try:
        frames = _frame_lengths(bytes(stored), size, prefix, options)
        out = io.BytesIO(bytes(sum(n for _, n in frames)))  # its only reference: written in place
        for frame, length in frames:
            d = zstd.ZstdDecompressor(zstd_dict=prefix, options=options)
            for chunk in _chunks(d, frame):
                out.write(chunk)
            if not d.eof or out.tell() > len(out.getbuffer()):  # pragma: no cover - zstd checks it
                raise zstd.ZstdError("its zstd frame is truncated")
        return out.getvalue()  # the buffer itself, not a copy: the BytesIO held the only reference
    except MemoryError:
        raise SizeError(
            f"decoding it ({size} bytes declared) ran out of the memory this process may use"
        ) from None


def _frame_lengths(stored: bytes, size: int, prefix, options) -> list[tuple[bytes, int]]:
    """The frames of ``stored`` (one, as :func:`encode` writes; concatenated frames decode as
    ``zstd.decompress`` does) with the length each decodes to, their sum at most ``size``.
    SizeError when a header or a counting pass says more, or a single frame's header says
    other than ``size``; ZstdError for a truncated or corrupt frame."""
    found: list[tuple[bytes, int]] = []
    left = size
    rest = stored
    while True:
        frame_size = zstd.get_frame_size(rest)
        frame, rest = rest[:frame_size], rest[frame_size:]
        declared = zstd.get_frame_info(frame).decompressed_size
        if declared is not None:
            if declared > left or (not found and not rest and declared != size):
                raise SizeError(f"its zstd frame declares {declared} bytes, its row {size}")
            length = declared
        else:
            d = zstd.ZstdDecompressor(zstd_dict=prefix, options=options)
            length = 0
            for chunk in _chunks(d, frame):
                length += len(chunk)
                if length > left:
                    raise SizeError(f"it decodes to more than its declared {size} bytes")
            if not d.eof:
                raise zstd.ZstdError("its zstd frame is truncated")
        found.append((frame, length))
        left -= length
        if not rest:
            return found


def _chunks(d, frame: bytes):
    """The output of decompressor ``d`` fed ``frame``, :data:`DECODE_CHUNK` bytes at most a step."""
    chunk = d.decompress(frame, max_length=DECODE_CHUNK)
    while True:
        if chunk:
            yield chunk
        if d.eof or d.needs_input:
            return
        chunk = d.decompress(b"", max_length=DECODE_CHUNK)


class SizeError(ValueError):
    """A blob's row declares an impossible size, or its data decodes to more than it declares
    (a crafted or damaged frame): :func:`decode` stops there."""


ZstdError = zstd.ZstdError
