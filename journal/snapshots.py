"""Workspace snapshots: a manifest of a directory tree whose file contents are content-addressed
blobs, taken and restored by a driver (issue 15, the structure its capture and restore build on).

A **manifest** lists every entry of the tree in path order: ``path`` (relative, ``/``-separated,
never ``..``, never absolute), ``kind`` (:class:`EntryKind`: ``file``, ``dir``, ``symlink``),
``mode`` (the permission bits, ``stat.S_IMODE``), and for a file its ``size`` and ``sha256``
(the blob holding its bytes), for a symlink its ``target`` (the link text, kept as it is, even
when it points outside the tree). Its :meth:`Manifest.digest` is the sha256 of its canonical
JSON, so two snapshots of an unchanged tree have one digest and cost one manifest; unchanged
files cost nothing (their blob exists already).

A **driver** has two methods (:class:`SnapshotDriver`): ``checkpoint(root, put) -> Manifest``
(``put(bytes) -> sha256`` stores a blob) and ``restore(manifest, get, target, force)`` (``get(sha256)
-> bytes``). :class:`FilesystemDriver` is built in; another (a database, a service's state)
registers under the entry point group :data:`ENTRY_POINT_GROUP` and is found by
:func:`snapshot_driver`.

The filesystem driver honours a ``.pvisorignore`` at the root (gitignore syntax, read with
``pathspec``: the tool that git's own rules were re-implemented in for Python), never follows a
symlink while walking, skips with a warning a file larger than ``max_file_bytes`` and stops
adding files past ``max_total_bytes`` (warnings name each skipped path). Restore writes only
below ``target``: every path is checked before anything is written, directories are made with
``mkdir`` and files opened with ``O_NOFOLLOW | O_EXCL`` relative to their directory, and
symlinks are made last, so that no write goes through a link, whatever the manifest holds.
Files that change while the walk reads them (a tool still running) are read as they are then.
"""

from __future__ import annotations

import bisect
import enum
import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import orjson
import pathspec

from pvisor.core.errors import BadInputError, OutputError, UsageError, shown
from .redact import SecretFileWhy, secret_file, secret_file_name
from .paths import make_directories, not_utf8

#: entry point group of snapshot drivers (``name = "module:Class"``)
ENTRY_POINT_GROUP = "pvisor.snapshot_drivers"
#: the ignore file at a workspace's root (gitignore syntax)
IGNORE_FILE = ".pvisorignore"
#: default limits of a filesystem checkpoint
MAX_FILE_BYTES = 64 << 20
MAX_TOTAL_BYTES = 1 << 30
MAX_ENTRIES = 200_000
#: a file changed this recently (ns) before it was read is read again by the next walk
RACY_NS = 2_000_000_000
MANIFEST_SCHEMA = "pvisor.snapshot-manifest/v1"


class SnapshotKind(str, enum.Enum):
    """When a snapshot was taken (journal column ``snapshots.kind``)."""

    START = "start"  #: at the start of the run, before the agent started (step 0)
    REQUEST = "request"  #: when a candidate main-loop request arrived (the previous step's tools ran)
    END = "end"  #: after the agent ended (the last step's tools ran)


@dataclass(slots=True)
class SnapshotRecord:
    """One snapshot as the journal stores it (a ``snapshots`` row, docs/journal.md).

    Fields: ``id`` (``s-`` + hex, made by the taker); ``run``, ``attempt``; ``kind``;
    ``exchange`` (the request a ``request`` snapshot was taken for); ``driver`` (its name);
    ``manifest`` (the canonical manifest bytes, None when the walk failed) and ``digest`` (their
    sha256); ``taken_ms`` (Unix epoch ms when the walk began); ``walk_us`` (its duration);
    ``entries``, ``files``, ``bytes`` (files' total size), ``read_bytes`` (bytes read from the
    disk: files new or changed since the taker's previous walk); ``warnings`` (the manifest's);
    ``error`` (why the walk failed: the workspace is gone, ...); ``after_step`` (bound later);
    ``hold_us`` (how long the gateway held the first byte of the request's answer for it)."""

    id: str
    run: str
    attempt: int
    kind: SnapshotKind
    driver: str
    taken_ms: float
    exchange: str | None = None
    manifest: bytes | None = None
    digest: str | None = None
    walk_us: int = 0
    entries: int = 0
    files: int = 0
    bytes: int = 0
    read_bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    after_step: int | None = None
    hold_us: int | None = None


class EntryKind(str, enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a manifest (module docstring)."""

    path: str
    kind: EntryKind
    mode: int
    size: int = 0
    sha256: str | None = None
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind.value, "mode": self.mode}
        if self.kind is EntryKind.FILE:
            out.update(size=self.size, sha256=self.sha256)
        elif self.kind is EntryKind.SYMLINK:
            out["target"] = self.target
        return out


@dataclass(frozen=True, slots=True)
class Withheld:
    """A workspace file a snapshot left out because it holds (or may hold) a secret
    (docs/snapshots.md "Secrets"): ``path``, ``size`` (bytes) and ``why``
    (:class:`~pvisor.journal.redact.SecretFileWhy`). No content and no digest of it: a digest
    would confirm a guessed key."""

    path: str
    size: int
    why: SecretFileWhy

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "why": self.why.value}


@dataclass(slots=True)
class Manifest:
    """A snapshot: ``entries`` in path order and the ``warnings`` of the walk (one sentence each,
    naming the path: a file over the size limit, past the total limit, unreadable) and the files
    ``withheld`` as secret (:class:`Withheld`, path order; in the JSON only when there are some,
    so that a manifest without them is the one an older pvisor wrote, and an older pvisor that
    reads one with them restores the entries and ignores the key)."""

    entries: list[Entry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    withheld: list[Withheld] = field(default_factory=list)
    read_bytes: int = 0  # bytes the walk read from the disk (not part of the manifest)
    # each entry's canonical JSON, as a walk made it (it reuses those of unchanged files); not
    # part of the manifest: encode() is the same bytes with or without it
    encoded_entries: list[bytes] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "schema": MANIFEST_SCHEMA,
            "entries": [e.to_json() for e in self.entries],
            "warnings": list(self.warnings),
        }
        if self.withheld:
            out["withheld"] = [w.to_json() for w in self.withheld]
        return out

    def encode(self) -> bytes:
        """The canonical bytes (keys sorted, compact): what :meth:`digest` hashes."""
        parts = self.encoded_entries
        if parts is None or len(parts) != len(self.entries):
            return orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)
        # the same bytes as above, from the entries' own (keys sorted: entries, schema, warnings)
        return b"".join(
            (
                b'{"entries":[',
                b",".join(parts),
                b'],"schema":',
                orjson.dumps(MANIFEST_SCHEMA),
                b',"warnings":',
                orjson.dumps(list(self.warnings)),
                b',"withheld":'
                + orjson.dumps([w.to_json() for w in self.withheld], option=orjson.OPT_SORT_KEYS)
                if self.withheld
                else b"",
                b"}",
            )
        )

    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind is EntryKind.FILE)

    @classmethod
    def decode(cls, data: bytes, where: str = "manifest") -> Manifest:
        """Read a manifest; BadInputError (exit 65) naming the entry for anything malformed or
        unsafe (:func:`check_path`)."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise BadInputError(f"{where}: not JSON ({exc})") from None
        if (
            not isinstance(doc, dict)
            or doc.get("schema") != MANIFEST_SCHEMA
            or not isinstance(doc.get("entries"), list)
        ):
            raise BadInputError(f"{where}: not a {MANIFEST_SCHEMA} document")
        out = cls(warnings=[w for w in doc.get("warnings") or [] if isinstance(w, str)])
        for i, e in enumerate(doc["entries"]):
            at = f"{where}: entries[{i}]"
            if (
                not isinstance(e, dict)
                or not isinstance(e.get("path"), str)
                or not isinstance(e.get("mode"), int)
            ):
                raise BadInputError(f"{at}: expected an object with a path and a mode")
            if not 0 <= e["mode"] <= 0o7777:  # what stat.S_IMODE records; -1 once restored as 0o1777
                raise BadInputError(f"{at}: mode {e['mode']} is outside 0..0o7777 (stat's permission bits)")
            try:
                kind = EntryKind(e.get("kind"))
            except ValueError:
                raise BadInputError(f"{at}: kind {e.get('kind')!r} is not file, dir or symlink") from None
            check_path(e["path"], at)
            if kind is EntryKind.FILE and not (
                isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
            ):
                raise BadInputError(f"{at}: a file needs its size and sha256")
            if kind is EntryKind.SYMLINK and (not isinstance(e.get("target"), str) or "\0" in e["target"]):
                raise BadInputError(f"{at}: a symlink needs its target (a text without NUL)")
            out.entries.append(
                Entry(
                    e["path"],
                    kind,
                    e["mode"],
                    e.get("size", 0) or 0,
                    e.get("sha256"),
                    e.get("target"),
                )
            )
        out.withheld = _decode_withheld(doc.get("withheld"), where)
        return out


def _decode_withheld(items: Any, where: str) -> list[Withheld]:
    """The ``withheld`` list of a manifest (absent in one written before pvisor withheld secret
    files: none); BadInputError naming the item for a malformed one."""
    out = []
    for i, w in enumerate(items if isinstance(items, list) else []):
        at = f"{where}: withheld[{i}]"
        if not (isinstance(w, dict) and isinstance(w.get("path"), str) and isinstance(w.get("size"), int)):
            raise BadInputError(f"{at}: expected an object with a path and a size")
        try:
            why = SecretFileWhy(w.get("why"))
        except ValueError:
            why = SecretFileWhy.SECRET_NAME  # a reason a later pvisor added: withheld all the same
        out.append(Withheld(check_path(w["path"], at), w["size"], why))
    return out


def withhold_secret_names(manifest: Manifest) -> Manifest:
    """``manifest`` as a restore writes it: a file whose name marks a secret file
    (:func:`~pvisor.journal.redact.secret_file_name`) that a manifest written before snapshots
    withheld them (or a crafted one) still holds is moved to ``withheld`` (``secret_name``), so
    that no restore brings it back. The manifest itself when it holds none."""
    named = [
        e
        for e in manifest.entries
        if e.kind is EntryKind.FILE and secret_file_name(e.path.rpartition("/")[2])
    ]
    if not named:
        return manifest
    withheld = manifest.withheld + [Withheld(e.path, e.size, SecretFileWhy.SECRET_NAME) for e in named]
    return Manifest(
        entries=[e for e in manifest.entries if e not in named],
        warnings=list(manifest.warnings),
        withheld=sorted(withheld, key=lambda w: w.path),
    )


def check_path(path: str, where: str) -> str:
    """``path`` when it is a safe relative path: BadInputError naming ``where`` for an empty or
    absolute path, a ``..``, ``.`` or empty component, a NUL byte or a backslash (a name no
    restore may write). String searches only: a manifest's paths can hold thousands of
    components (parsing each into a path object made a deep manifest quadratic)."""
    wrapped = f"/{path}/"
    if (
        not path
        or "\0" in path
        or "\\" in path
        or path.startswith("/")
        or "//" in wrapped
        or "/./" in wrapped
        or "/../" in wrapped
    ):
        raise BadInputError(
            f"{where}: path {path!r} is not a relative path inside the snapshot (no '..', no absolute path)"
        )
    return path


class SnapshotDriver(Protocol):
    """Takes and restores snapshots (module docstring)."""

    name: str

    def checkpoint(self, root: Path, put: Callable[[bytes], str]) -> Manifest: ...

    def restore(
        self, manifest: Manifest, get: Callable[[str], bytes], target: Path, force: bool = False
    ) -> None: ...


def _ignore_spec(root: Path) -> Any:
    ignore = root / IGNORE_FILE
    if not ignore.is_file():
        return None
    return pathspec.GitIgnoreSpec.from_lines(
        ignore.read_text(encoding="utf-8", errors="replace").splitlines()
    )


@dataclass(slots=True)
class _Walk:
    """The state of one :meth:`FilesystemDriver.checkpoint`: the root's descriptor, the ignore
    rules, the blob store, directories still to list, the manifest being made, its rows
    (path, entry, the entry's canonical JSON), what the next walk may trust unread, and the
    counts that the limits bound."""

    root_fd: int
    spec: Any
    put: Callable[[bytes], str]
    stack: list[str] = field(default_factory=lambda: [""])
    out: Manifest = field(default_factory=Manifest)
    rows: list[tuple[str, Entry, bytes]] = field(default_factory=list)
    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    count: int = 0
    total: int = 0


class FilesystemDriver:
    """The built-in driver: a directory tree (module docstring)."""

    name = "filesystem"

    def __init__(
        self,
        max_file_bytes: int = MAX_FILE_BYTES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        max_entries: int = MAX_ENTRIES,
        racy_ns: int = RACY_NS,
        exclude: frozenset[str] = frozenset(),
    ) -> None:
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.max_entries = max_entries
        self.racy_ns = racy_ns
        self.exclude = exclude  # relative paths never walked (the journal, a run's own files)
        # how restore's errors name the target and the force flag: the command's options, or
        # the Python parameters of the caller (``environment``, ``force=True``)
        self.target_option = "--into"
        self.force_option = "--force"
        # path -> ((inode, size, mtime_ns, ctime_ns), Entry, its JSON) of the previous walk's files
        self._known: dict[str, tuple[Any, ...]] = {}

    def checkpoint(self, root: Path, put: Callable[[bytes], str]) -> Manifest:
        """Walk ``root`` (never following a symlink) and store each file's bytes with ``put``.
        A file whose inode, size, mtime and ctime are those of the previous walk of this
        driver is not read again (its blob is stored already), unless it changed in the last
        ``racy_ns`` before it was read: git's "racily clean" rule, as two writes within one
        clock tick leave one mtime. Raises UsageError when ``root`` is not a directory."""
        root = Path(root)
        if not root.is_dir():
            raise UsageError(f"workspace {root}: not a directory")
        spec = _ignore_spec(root)
        try:
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"workspace {root}: cannot be read ({exc.strerror})") from None
        walk = _Walk(root_fd, spec, put)
        try:
            self._walk(walk)
        finally:
            os.close(root_fd)
        self._known = walk.seen
        walk.rows.sort(key=lambda r: r[0])
        walk.out.entries = [r[1] for r in walk.rows]
        walk.out.encoded_entries = [r[2] for r in walk.rows]
        walk.out.withheld.sort(key=lambda w: w.path)
        return walk.out

    def _walk(self, walk: _Walk) -> None:
        """The walk of :meth:`checkpoint`, one directory at a time, each opened below the root
        with ``O_NOFOLLOW`` component by component: a directory a tool swaps for a symlink
        while the walk runs is left out, never followed out of the workspace."""
        root_fd, out = walk.root_fd, walk.out
        while walk.stack:
            rel_dir = walk.stack.pop()
            try:
                dir_fd = _open_dir_below(root_fd, rel_dir.split("/")) if rel_dir else root_fd
            except OSError as exc:
                out.warnings.append(
                    f"{rel_dir}: not read ({exc.strerror}; did it change while the walk read it?)"
                )
                continue
            try:
                try:
                    with os.scandir(dir_fd) as it:
                        items = sorted(it, key=lambda d: d.name)
                except OSError as exc:
                    out.warnings.append(f"{rel_dir or '.'}: not read ({exc.strerror})")
                    continue
                self._entries(walk, dir_fd, rel_dir, items)
            finally:
                if dir_fd != root_fd:
                    os.close(dir_fd)

    def _entries(self, walk: _Walk, dir_fd: int, rel_dir: str, items: list[Any]) -> None:
        """The entries of one directory (``items``, its ``scandir`` sorted by name) into
        ``walk``."""
        out, rows, spec, exclude, known, seen = (
            walk.out,
            walk.rows,
            walk.spec,
            self.exclude,
            self._known,
            walk.seen,
        )
        subdirs = []
        for d in items:
            rel = f"{rel_dir}/{d.name}" if rel_dir else d.name
            if not _utf8(d.name):
                # a manifest is JSON: a name that is not UTF-8 cannot be written in it
                out.warnings.append(f"{os.fsencode(rel)!r}: the name is not valid UTF-8: left out")
                continue
            try:
                st = d.stat(follow_symlinks=False)
            except OSError as exc:
                out.warnings.append(f"{rel}: not read ({exc.strerror})")
                continue
            st_mode = st.st_mode
            is_dir = stat.S_ISDIR(st_mode)
            if rel in exclude or (spec is not None and spec.match_file(rel + ("/" if is_dir else ""))):
                continue
            if walk.count >= self.max_entries:
                out.warnings.append(
                    f"{rel}: left out, the snapshot would pass its limit of {self.max_entries} entries "
                    "(the rest of the workspace is left out too; list what to skip in .pvisorignore)"
                )
                walk.stack.clear()
                return
            walk.count += 1
            if stat.S_ISREG(st_mode) and secret_file_name(d.name):
                out.withheld.append(Withheld(rel, st.st_size, SecretFileWhy.SECRET_NAME))  # never read
                continue
            if stat.S_ISREG(st_mode):
                size = st.st_size
                if size > self.max_file_bytes:
                    out.warnings.append(
                        f"{rel}: {size} bytes, over the limit of {self.max_file_bytes} per file: left out"
                    )
                    continue
                if walk.total + size > self.max_total_bytes:
                    out.warnings.append(
                        f"{rel}: left out, the snapshot would pass its limit of {self.max_total_bytes} bytes"
                    )
                    continue
                key = (st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
                prev = known.get(rel)
                if prev is not None and prev[0] == key:
                    seen[rel] = prev
                    walk.total += size
                    rows.append((rel, prev[1], prev[2]))
                    continue
                try:
                    data = _read_file_at(dir_fd, d.name)
                except OSError as exc:
                    out.warnings.append(f"{rel}: not read ({exc.strerror})")
                    continue
                size = len(data)
                out.read_bytes += size
                why = secret_file(d.name, data)
                if why is not None:  # never stored; not remembered, so read again by the next walk
                    out.withheld.append(Withheld(rel, size, why))
                    continue
                entry = Entry(rel, EntryKind.FILE, stat.S_IMODE(st_mode), size, walk.put(data))
                encoded = _entry_json(entry)
                if (
                    time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= self.racy_ns
                    and size == st.st_size
                ):
                    seen[rel] = (key, entry, encoded)
                walk.total += size
                rows.append((rel, entry, encoded))
            elif is_dir:
                entry = Entry(rel, EntryKind.DIR, stat.S_IMODE(st_mode))
                rows.append((rel, entry, _entry_json(entry)))
                subdirs.append(rel)
            elif stat.S_ISLNK(st_mode):
                try:
                    link = os.readlink(d.name, dir_fd=dir_fd)
                except OSError as exc:
                    out.warnings.append(f"{rel}: not read ({exc.strerror})")
                    continue
                if not _utf8(link):
                    out.warnings.append(f"{rel}: a symlink whose target is not valid UTF-8: left out")
                    continue
                entry = Entry(rel, EntryKind.SYMLINK, stat.S_IMODE(st_mode), target=link)
                rows.append((rel, entry, _entry_json(entry)))
            else:
                out.warnings.append(
                    f"{rel}: neither a file, a directory nor a symlink (a socket, a FIFO, a device): left out"
                )
        walk.stack.extend(reversed(subdirs))

    def restore(
        self, manifest: Manifest, get: Callable[[str], bytes], target: Path, force: bool = False
    ) -> None:
        """Write ``manifest`` into ``target`` (created when missing). Raises UsageError (exit 2)
        for a target that cannot be made, a non-empty one without ``force``, or with ``force``
        one that holds a directory where the snapshot has a file or the reverse (a symlink of
        the target counts as a file: never followed); BadInputError (exit 65) naming the entry
        for a path that is not safe, an entry below a symlink of the snapshot, or a blob whose
        bytes do not match; OutputError (exit 74) naming the entry when writing fails (disk
        full). Nothing is written before every path was checked."""
        target = Path(target)
        named = self.named(target)
        below_links = _below_links(manifest)
        for i, e in enumerate(manifest.entries):
            check_path(e.path, f"snapshot entry {i}")
            below = below_links.get(e.path)
            if below is not None:
                raise BadInputError(
                    f"snapshot entry {i}: {e.path!r} lies below the symlink {below!r} of the snapshot: "
                    "restoring it would write through the link"
                )
        try:
            make_directories(target)  # 0700, whatever the umask, as every directory pvisor makes
        except FileExistsError as exc:
            if exc.filename != os.path.abspath(target):  # a file on the way to the target
                raise UsageError(f"{named}: cannot create it: {os.strerror(errno.ENOTDIR)}") from None
            raise UsageError(f"{named}: not a directory") from None
        except OSError as exc:
            raise UsageError(f"{named}: cannot create it: {exc.strerror or exc}") from None
        try:
            root_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        except NotADirectoryError:
            raise UsageError(f"{named}: not a directory") from None
        except OSError as exc:
            raise UsageError(f"{named}: cannot be opened ({exc.strerror})") from None
        try:
            # one restore at a time into one directory (of any process): the next one waits,
            # then finds it not empty, as a restore made later would
            fcntl.flock(root_fd, fcntl.LOCK_EX)
            try:
                holds = bool(os.listdir(root_fd))
            except OSError as exc:
                raise UsageError(f"{named}: cannot be read ({exc.strerror})") from None
            if holds and not force:
                raise UsageError(f"{named}: not empty; give {self.force_option} to restore into it anyway")
            if holds:
                conflict = _conflict(root_fd, manifest, named)
                if conflict is not None:
                    raise UsageError(
                        f"{named}: {conflict}; nothing was written (restore into an empty directory)"
                    )
            self._write(manifest, get, named, root_fd, force)
        finally:
            os.close(root_fd)  # and with it the lock

    def named(self, target: Path) -> str:
        """How errors name the target: ``--into DIR``, or a Python caller's ``environment='DIR'``
        (a :attr:`target_option` ending in ``=``)."""
        if self.target_option.endswith("="):
            return f"{self.target_option}{shown(repr(os.fspath(target)))}"
        return f"{self.target_option} {target}"

    def _write(
        self, manifest: Manifest, get: Callable[[str], bytes], named: str, root_fd: int, force: bool
    ) -> None:
        """Write the entries of :meth:`restore` below ``root_fd`` (the target, locked and checked)."""
        current = ""
        # path order: a directory comes before what it holds, and what it holds comes together,
        # so one walker of open descriptors serves each entry with the levels it does not share
        # with the previous one (reopening every level from the root cost entries x depth)
        order = sorted(manifest.entries, key=lambda e: e.path)
        walker = _DirWalker(root_fd)
        try:
            # symlinks last: nothing is written after a link is made
            for e in [e for e in order if e.kind is not EntryKind.SYMLINK] + [
                e for e in order if e.kind is EntryKind.SYMLINK
            ]:
                current = e.path
                parent, _, name = e.path.rpartition("/")
                parent_fd = walker.dir_fd(parent)
                if e.kind is EntryKind.DIR:
                    try:
                        os.mkdir(name, 0o700, dir_fd=parent_fd)
                    except FileExistsError:
                        if not stat.S_ISDIR(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode):
                            raise BadInputError(
                                f"snapshot entry {e.path!r}: the target holds something else there"
                            ) from None
                elif e.kind is EntryKind.FILE:
                    data = get(e.sha256 or "")
                    if hashlib.sha256(data).hexdigest() != e.sha256:
                        raise BadInputError(
                            f"snapshot entry {e.path!r}: its blob does not match sha256 {e.sha256}"
                        )
                    if force:
                        try:
                            os.unlink(name, dir_fd=parent_fd)
                        except FileNotFoundError:
                            pass
                    fd = os.open(
                        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent_fd
                    )
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view) :]
                        os.fchmod(fd, _restored_mode(e.mode))
                    finally:
                        os.close(fd)
                else:
                    if force:
                        try:
                            os.unlink(name, dir_fd=parent_fd)
                        except FileNotFoundError:
                            pass
                    os.symlink(e.target or "", name, dir_fd=parent_fd)
            # directory modes last, deepest first (reverse path order: what a directory holds
            # comes before it): a read-only directory would refuse its own entries
            for e in reversed(order):
                if e.kind is EntryKind.DIR:
                    current = e.path
                    parent, _, name = e.path.rpartition("/")
                    # a directory this restore made (checked above)
                    os.chmod(name, _restored_mode(e.mode), dir_fd=walker.dir_fd(parent))
        except OSError as exc:
            # the disk is full, a permission is missing: what was written so far stays
            raise OutputError(
                f"{named}: cannot write snapshot entry {current!r}: {exc.strerror or exc} "
                "(the directory holds what was restored before it)"
            ) from None
        finally:
            walker.close()


def _conflict(root_fd: int, manifest: Manifest, option: str) -> str | None:
    """What in the target ``root_fd`` (a directory that holds files: a forced restore) stands
    where the manifest needs something a restore cannot replace, or None: a directory where a
    file or a symlink goes, a file or a symlink where a directory goes or lies on the way (a
    symlink of the target is never followed: it is looked at with ``lstat``, below directories
    already found to be real ones). Each path and each of its directories is looked at once,
    relative to its directory's descriptor (no path is too long, whatever the depth)."""
    kinds: dict[str, str] = {"": "dir"}
    walker = _DirWalker(root_fd)

    def look(up: str, rel: str) -> str:
        try:
            mode = os.stat(rel.rpartition("/")[2], dir_fd=walker.dir_fd(up), follow_symlinks=False).st_mode
        except FileNotFoundError:
            return "absent"
        except OSError as exc:  # no permission to look: nothing may be written there either
            raise UsageError(f"{option}: {rel!r} cannot be examined ({exc.strerror})") from None
        return "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "file"

    try:
        for e in sorted(manifest.entries, key=lambda e: e.path):
            parent = e.path.rpartition("/")[0]
            chain = []  # the directories of the entry not looked at yet, innermost first
            p = parent
            while p not in kinds:
                chain.append(p)
                p = p.rpartition("/")[0]
            for q in reversed(chain):
                up = q.rpartition("/")[0]
                k = "absent" if kinds[up] == "absent" else look(up, q)  # nothing exists below it
                kinds[q] = k
                if k not in ("dir", "absent"):
                    return f"the target holds a {k} at {q!r}, where the snapshot has a directory"
            k = kinds[parent]
            if k == "absent":
                continue
            if k != "dir":
                return f"the target holds a {k} at {parent!r}, where the snapshot has a directory"
            k = kinds.get(e.path) or look(parent, e.path)
            kinds[e.path] = k
            if e.kind is EntryKind.DIR and k in ("file", "link"):
                return f"the target holds a {k} at {e.path!r}, where the snapshot has a directory"
            if e.kind is not EntryKind.DIR and k == "dir":
                return f"the target holds a directory at {e.path!r}, where the snapshot has a {e.kind.value}"
        return None
    finally:
        walker.close()


def _entry_json(entry: Entry) -> bytes:
    return orjson.dumps(entry.to_json(), option=orjson.OPT_SORT_KEYS)


def _utf8(name: str) -> bool:
    """Whether a file-system name decoded by Python (undecodable bytes as surrogates) is UTF-8."""
    return not_utf8(name) is None


def _open_dir_below(root_fd: int, parts: list[str]) -> int:
    """A descriptor of the directory ``parts`` below ``root_fd``, each level opened with
    ``O_NOFOLLOW``; OSError (ELOOP, ENOTDIR) when a level is a symlink or no directory now."""
    fd = root_fd
    for part in parts:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            if fd != root_fd:
                os.close(fd)
        fd = nxt
    return fd


def _read_file_at(dir_fd: int, name: str) -> bytes:
    """The bytes of the regular file ``name`` of ``dir_fd``, opened without following a symlink
    and without blocking (a file replaced by a link or a FIFO between the walk's stat and this
    read is refused, never read through or waited on)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "no regular file any more (it changed while the walk read it)")
        parts = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
    finally:
        os.close(fd)


def _restored_mode(mode: int) -> int:
    """The permission bits a restore gives an entry of ``mode`` (``0o777`` at most): never
    setuid, setgid or sticky (on a file or a directory): a crafted snapshot restored by root
    must not make a program that runs as root, a directory whose files take a group of its
    choosing, nor a world-writable sticky directory."""
    return mode & 0o777


def _below_links(manifest: Manifest) -> dict[str, str]:
    """Path -> symlink of the snapshot it lies below (the outermost one), for every entry below
    one of the snapshot's symlinks. In sorted order the paths below ``L`` are one run (those
    from ``L/`` to ``L0``), found by bisection: a cost of entries x log(entries), not of
    entries x depth x path length, as looking up every parent of every entry was."""
    paths = sorted({e.path for e in manifest.entries})
    links = sorted(e.path for e in manifest.entries if e.kind is EntryKind.SYMLINK)
    out: dict[str, str] = {}
    for link in links:
        if link in out:
            continue  # below an outer link: its run is inside the outer one's
        lo = bisect.bisect_left(paths, link + "/")
        hi = bisect.bisect_left(paths, link + "0", lo)  # "0" follows "/"
        for p in paths[lo:hi]:
            out[p] = link
    return out


class _DirWalker:
    """Descriptors of the directories below ``root_fd`` that a restore writes into, each level
    opened with ``O_NOFOLLOW`` (a symlink on the way is a BadInputError naming it).

    The levels down to the last directory asked for stay open, the innermost :data:`_KEEP` of
    them, so that entries in path order open only the levels they do not share with the one
    before, and never more than ``_KEEP`` descriptors are held. Climbing back to a level closed
    to keep that bound opens ``..`` of the level below it, and it must be the very directory
    opened on the way down (same device and inode: one moved meanwhile is refused). A tree of
    n entries thus costs O(n) opens whatever its depth (reopening every level from the root
    for each entry cost entries x depth)."""

    _KEEP = 64

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        # (relative path, descriptor or None once closed, (st_dev, st_ino)), outermost first
        self.levels: list[tuple[str, int | None, tuple[int, int]]] = []
        self.open = 0

    def dir_fd(self, rel: str) -> int:
        """A descriptor of the directory ``rel`` ("" is the root); valid until the next call."""
        levels = self.levels
        keep = len(levels)  # the levels that hold ``rel``
        while keep and not (rel == levels[keep - 1][0] or rel.startswith(levels[keep - 1][0] + "/")):
            keep -= 1
        if keep and levels[keep - 1][1] is None:
            while len(levels) > keep:
                self._pop()  # climbing back to a level closed to stay within _KEEP
        else:
            for _, fd, _ in levels[keep:]:
                if fd is not None:
                    os.close(fd)
                    self.open -= 1
            del levels[keep:]
        here, fd = (levels[-1][0], levels[-1][1]) if levels else ("", self.root_fd)
        assert fd is not None  # the innermost level is always open
        rest = rel[len(here) + 1 :] if here else rel
        if rest:
            for part in rest.split("/"):
                here = f"{here}/{part}" if here else part
                try:
                    fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    raise BadInputError(
                        f"snapshot entry directory {here!r}: cannot be entered without following a link "
                        f"({exc.strerror})"
                    ) from None
                st = os.fstat(fd)
                levels.append((here, fd, (st.st_dev, st.st_ino)))
                self.open += 1
                self._trim()
        return fd

    def close(self) -> None:
        for _, fd, _ in self.levels:
            if fd is not None:
                os.close(fd)
        self.levels.clear()
        self.open = 0

    def _pop(self) -> None:
        """Leave the innermost level; open its parent level again (``..``) if it was closed."""
        _, fd, _ = self.levels.pop()
        assert fd is not None
        try:
            if self.levels and self.levels[-1][1] is None:
                rel, _, ident = self.levels[-1]
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                st = os.fstat(up)
                if (st.st_dev, st.st_ino) != ident:
                    os.close(up)
                    raise BadInputError(
                        f"snapshot entry directory {rel!r}: moved while the restore wrote below it"
                    )
                self.levels[-1] = (rel, up, ident)
                self.open += 1
        finally:
            os.close(fd)
            self.open -= 1

    def _trim(self) -> None:
        """Close the outermost open levels while more than _KEEP are open (the open ones are
        always the innermost)."""
        i = len(self.levels) - self.open
        while self.open > self._KEEP:
            rel, fd, ident = self.levels[i]
            assert fd is not None
            os.close(fd)
            self.levels[i] = (rel, None, ident)
            self.open -= 1
            i += 1


def snapshot_driver(name: str = "filesystem") -> SnapshotDriver:
    """The driver registered under ``name``: the built-in :class:`FilesystemDriver`, else an
    entry point of :data:`ENTRY_POINT_GROUP`. Raises UsageError naming the known drivers."""
    if name == FilesystemDriver.name:
        return FilesystemDriver()
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        raise UsageError(
            f"no snapshot driver {name!r}; known: {', '.join(sorted({FilesystemDriver.name, *found}))}"
        )
    return found[name].load()()
