"""SHA-256 for short-lived commands, without loading OpenSSL for a few small inputs.

``import hashlib`` loads OpenSSL's libcrypto: 2.5 ms on the 2-CPU machine of
docs/benchmarks.md, a tenth of what ``replay --prepare-only`` may add to the interpreter's own
start. CPython also builds its own SHA-256 (HACL*, the module ``_sha2`` since 3.12, ``_sha256``
before), which loads in about 0.1 ms but hashes at about 300 MB/s against OpenSSL's 1.7 GB/s.
So: inputs below :data:`SMALL` bytes use the built-in one, unless hashlib is loaded already
(then it costs nothing more); larger ones load hashlib, whose speed then pays for its load.
Both give the same digest: this is only where the bytes are hashed.

This module imports nothing of pvisor's (the journal package's rule).
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

try:  # CPython 3.12 and newer
    from _sha2 import sha256 as _builtin_sha256
except ImportError:  # pragma: no cover - the name of CPython 3.10 and 3.11
    try:
        from _sha256 import sha256 as _builtin_sha256
    except ImportError:  # an interpreter without it: hashlib always
        _builtin_sha256 = None

#: below this many bytes hashing with the built-in SHA-256 is cheaper than loading OpenSSL
#: (2.5 ms of load against 2.9 ns/byte more: about 0.9 MB; a quarter of that keeps a margin)
SMALL = 256 * 1024


class Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


def sha256(size_hint: int) -> Hash:
    """A new SHA-256 object for about ``size_hint`` bytes (a file's size, for a streamed file;
    no default: a caller that gave none hashed a few bytes of a workspace with OpenSSL)."""
    if _builtin_sha256 is not None and size_hint < SMALL and "hashlib" not in sys.modules:
        return _builtin_sha256()
    import hashlib

    return hashlib.sha256()


def sha256_hex(data: bytes | bytearray | memoryview | Any) -> str:
    """SHA-256 of ``data`` as 64 lower-case hex digits."""
    h = sha256(len(data))
    h.update(data)
    return h.hexdigest()


def file_sha256(path: Any) -> str:
    """SHA-256 of the file at ``path`` (str or PathLike), read in 1 MiB pieces, as 64 hex
    digits. Raises OSError."""
    import os

    with open(path, "rb") as fh:
        h = sha256(os.fstat(fh.fileno()).st_size)
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["SMALL", "file_sha256", "sha256", "sha256_hex"]
