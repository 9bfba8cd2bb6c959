"""Which build of pvisor is running: what ``pvisor --version --json`` prints and every
``result.json`` names (its ``pvisor`` object; docs/install.md, docs/result-protocol.md).

Two kinds. ``python``: the package installed with pip, run by an interpreter (``sys.executable``
is that interpreter; the commit its build recorded, no manifest). ``bundle``: a directory made by
``scripts/build-bundle`` (PyInstaller, one directory), whose executable ``pvisor`` has beside
it :data:`MANIFEST_NAME`, a JSON document written when it was built::

    {"schema": "pvisor.bundle-manifest/v1", "version": "0.1.0", "commit": "<40 hex>[-dirty]",
     "python": "3.11.7", "platform": "linux-x86_64", "executable": "pvisor",
     "files": {"pvisor": "<sha256>", "_internal/libpython3.11.so.1.0": "<sha256>", ...}}

``files`` holds every file of the directory but the manifest, by its path relative to it
(``/``-separated). :func:`identity` digests the executable when asked (SHA-256 of its bytes,
read at run time from ``sys.executable``) and the manifest; :func:`verify` digests every file
and names each one changed, missing or added.

This module imports nothing of pvisor's but :mod:`.digest` and :mod:`.helpers` (the version is the
caller's to give).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .digest import file_sha256, sha256_hex
from .helpers import frozen

#: the manifest's file name, beside the bundle's executable
MANIFEST_NAME = "pvisor-manifest.json"
MANIFEST_SCHEMA = "pvisor.bundle-manifest/v1"


class ArtifactError(Exception):
    """A manifest that cannot be read or does not have the documented shape (the message names
    the file and what was expected)."""


def manifest_path() -> str | None:
    """The manifest beside the bundle's executable, or None outside a bundle."""
    if not frozen():
        return None
    return os.path.join(os.path.dirname(os.path.realpath(sys.executable)), MANIFEST_NAME)


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest at ``path``, checked for its shape. Raises ArtifactError naming the file."""
    import orjson

    try:
        with open(path, "rb") as fh:
            doc = orjson.loads(fh.read())
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read the build's manifest: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not JSON ({exc}); expected the build's manifest") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != MANIFEST_SCHEMA
        or not isinstance(files, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ):
        raise ArtifactError(f"{path}: expected a {MANIFEST_SCHEMA} document with a files object of digests")
    return doc


def identity(
    version: str, *, distribution: str, commit: str | None, digest_executable: bool = True
) -> dict[str, Any]:
    """What names this build, as a JSON object:

    - ``distribution``: the project's distribution name; ``version``: the package version
      (both from ``pvisor._version``, given by the caller); ``kind``: ``bundle`` or ``python``;
    - ``commit``: the source commit (``-dirty`` when the tree had uncommitted changes): a
      bundle's from its manifest, else ``commit`` (what the package's build recorded, None when
      it recorded none);
    - ``executable``: ``sys.executable`` (the bundle's ``pvisor``, or the interpreter);
      ``executable_sha256``: SHA-256 of its bytes now (None when ``digest_executable`` is
      False or it cannot be read);
    - ``manifest``: the manifest's path and ``manifest_sha256`` the SHA-256 of its bytes now
      (both None outside a bundle, the digest None when it cannot be read).

    Never raises: what cannot be read is None (``pvisor --version --verify`` says why)."""
    exe = sys.executable
    out: dict[str, Any] = {
        "distribution": distribution,
        "version": version,
        "kind": "bundle" if frozen() else "python",
        "commit": commit,
        "executable": exe,
        "executable_sha256": None,
        "manifest": manifest_path(),
        "manifest_sha256": None,
    }
    if digest_executable and exe:
        try:
            out["executable_sha256"] = file_sha256(exe)
        except OSError:
            pass
    if out["manifest"] is not None:
        try:
            out["manifest_sha256"] = file_sha256(out["manifest"])
            commit = read_manifest(out["manifest"]).get("commit")
            out["commit"] = commit if isinstance(commit, str) else None
        except (OSError, ArtifactError):
            pass
    return out


def build_files(root: str, skip: tuple[str, ...] = (MANIFEST_NAME,)) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (symbolic links by their target
    text, prefixed ``symlink:``), ``/``-separated, sorted; ``skip``: names at the top left out.
    Raises OSError."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if rel in skip:
                continue
            if os.path.islink(full):
                found[rel] = "symlink:" + sha256_hex(os.fsencode(os.readlink(full)))
            else:
                found[rel] = file_sha256(full)
    return dict(sorted(found.items()))


def verify(path: str | None = None) -> list[str]:
    """Compare the build's files with its manifest (``path``, default the one beside the
    executable). Returns one sentence per difference (a file changed, missing or not listed);
    [] when they agree. Raises ArtifactError outside a bundle or for a bad manifest."""
    path = path or manifest_path()
    if path is None:
        raise ArtifactError(
            "not a bundle: --verify checks a build of scripts/build-bundle against its manifest"
        )
    want = read_manifest(path)["files"]
    root = os.path.dirname(path)
    try:
        have = build_files(root)
    except OSError as exc:
        raise ArtifactError(f"{root}: cannot read the build: {exc.strerror or exc}") from None
    problems = []
    for rel, digest in want.items():
        if rel not in have:
            problems.append(f"{rel}: missing (listed in {MANIFEST_NAME})")
        elif have[rel] != digest:
            problems.append(
                f"{rel}: changed (sha256 {have[rel][:16]}..., the manifest says {digest[:16]}...)"
            )
    for rel in have:
        if rel not in want:
            problems.append(f"{rel}: not in {MANIFEST_NAME} (added after the build)")
    return problems


_RECORDS: dict[str, dict[str, Any]] = {}


def result_record(version: str, *, distribution: str, commit: str | None) -> dict[str, Any]:
    """The ``pvisor`` object of a result document (a new dict each call): :func:`identity`
    without the paths (``distribution``, ``version``, ``kind``, ``commit``, ``executable_sha256``,
    ``manifest_sha256``), computed once per process (a batch's thousand results digest the
    executable once). ``executable_sha256`` is a bundle's only: of a pip install it would be
    the interpreter's, which says nothing of pvisor's code and costs a prepare the time of
    reading it (``pvisor --version --json`` gives it)."""
    rec = _RECORDS.get(version)
    if rec is None:
        ident = identity(version, distribution=distribution, commit=commit, digest_executable=frozen())
        rec = _RECORDS[version] = {
            k: ident[k]
            for k in ("distribution", "version", "kind", "commit", "executable_sha256", "manifest_sha256")
        }
    return dict(rec)


__all__ = [
    "ArtifactError",
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA",
    "build_files",
    "file_sha256",
    "frozen",
    "identity",
    "manifest_path",
    "read_manifest",
    "result_record",
    "verify",
]
