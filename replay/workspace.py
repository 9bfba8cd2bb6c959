"""The workspace digest of the result protocol (docs/result-protocol.md, ``workspace``).

Definition: one line per entry below the workspace root (the root itself is not an entry),
``relative path NUL mode NUL digest LF`` in bytes, the lines sorted by relative path bytes and
hashed with SHA-256; the digest is that hash as 64 lower-case hex digits.

- relative path: POSIX ``/``-separated, as file-system bytes (``os.fsencode``), no leading ``./``;
- mode: ``st_mode`` of ``lstat`` in octal without prefix (type bits included: ``100644``,
  ``120777``, ``40755``);
- digest: SHA-256 hex of the file's bytes for a regular file, of the link target bytes
  (``os.readlink``, never followed) for a symbolic link, ``-`` for a directory and for anything
  else (FIFO, socket, device: never opened, so a FIFO cannot block the digest).

Reading only: files are opened read-only, symbolic links never followed, nothing written.
Nothing is left out: an entry that cannot be read (a file or a directory without read
permission) raises OSError naming it, and the caller fails with ``workspace_unreadable``.
Standard library only.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, NamedTuple

from pvisor.core.digest import sha256, sha256_hex

if TYPE_CHECKING:
    from pathlib import Path

#: bytes read per ``read`` call while hashing a file (1 MiB)
_CHUNK = 1 << 20


class WorkspaceDigest(NamedTuple):
    """A workspace's digest: ``sha256`` (64 hex), ``entries`` (number of entries hashed),
    ``files`` (regular files among them), ``bytes`` (their total size in bytes). Immutable.
    (A NamedTuple, not a dataclass: a dataclass costs about a millisecond of startup.)"""

    sha256: str
    entries: int
    files: int
    bytes: int


def _file_sha256(path: str) -> tuple[str, int]:
    n = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        h = sha256(os.fstat(fd).st_size)
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest(), n


def workspace_entries(root: Path) -> list[tuple[bytes, int, str]]:
    """The sorted ``(relative path bytes, st_mode, digest)`` entries of ``root`` (see the
    module docstring). Raises OSError when an entry cannot be read."""
    out: list[tuple[bytes, int, str]] = []
    base = os.fspath(root)

    def fail(exc: OSError) -> None:  # a directory that cannot be listed: never skipped silently
        raise exc

    for dirpath, dirnames, filenames in os.walk(base, onerror=fail, followlinks=False):
        rel_dir = os.path.relpath(dirpath, base)
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                digest, _ = _file_sha256(full)
            elif stat.S_ISLNK(st.st_mode):
                digest = sha256_hex(os.fsencode(os.readlink(full)))
            else:
                digest = "-"
            out.append((os.fsencode(rel), st.st_mode, digest))
    out.sort(key=lambda e: e[0])
    return out


def digest_workspace(root: Path) -> WorkspaceDigest:
    """The digest of the tree at ``root`` (a directory). Raises OSError when it cannot be read."""
    files = size = 0
    entries = workspace_entries(root)
    # the size of what is hashed: a few bytes for a small workspace, no reason to load OpenSSL
    h = sha256(sum(len(rel) + len(digest) + 12 for rel, _, digest in entries))
    for rel, mode, digest in entries:
        h.update(rel + b"\0" + format(mode, "o").encode() + b"\0" + digest.encode() + b"\n")
        if stat.S_ISREG(mode):
            files += 1
    for rel, mode, _ in entries:
        if stat.S_ISREG(mode):
            size += os.lstat(os.path.join(os.fsencode(root), rel)).st_size
    return WorkspaceDigest(h.hexdigest(), len(entries), files, size)
