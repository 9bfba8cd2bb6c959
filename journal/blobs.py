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
its ``base`` (the sha256 of the reference body); every restore checks the sha256 of the result.

Blob row codecs: ``identity`` (stored as is: short or incompressible), ``zstd`` (standalone
frame), ``zstd-prefix`` (frame compressed with the body ``base`` as a raw prefix).
"""

from __future__ import annotations

import hashlib

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
_DECOMPRESS_OPTIONS = {_DP.window_log_max: 31}


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


def decode(codec: str, stored: bytes, base: bytes | None = None) -> bytes:
    """Undo :func:`encode`. Raises ValueError for an unknown codec or a missing base, and
    ``zstd.ZstdError`` for corrupt data."""
    if codec == "identity":
        return bytes(stored)
    if codec == "zstd":
        return zstd.decompress(stored, options=_DECOMPRESS_OPTIONS)
    if codec == "zstd-prefix":
        if base is None:
            raise ValueError("zstd-prefix blob needs its base body")
        return zstd.decompress(
            stored, zstd_dict=zstd.ZstdDict(base, is_raw=True).as_prefix, options=_DECOMPRESS_OPTIONS
        )
    raise ValueError(f"unknown blob codec {codec!r}")


ZstdError = zstd.ZstdError
