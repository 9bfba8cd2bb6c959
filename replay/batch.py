"""Many prepare-only in one process: ``pvisor replay --prepare-only --batch MANIFEST`` and
:func:`prepare_many` (docs/result-protocol.md "Many prefixes in one process").

An RL or evaluation pipeline prepares thousands of prefixes, often several from one trajectory
(one per boundary). One process per prefix pays the interpreter's start each time; here it is
paid once, a file named by several requests is read and digested once (:class:`SourceReads`),
and each prefix is what a single ``--prepare-only`` with the same arguments writes (the same
three files, the same result document but for its timings: tests/test_replay_batch.py).

The manifest is JSON Lines, one object per prefix (docs/result-protocol.md, the same section):
``{"trajectory": PATH | "run": ID, "agent": NAME, "after_step": N}`` and optional
``journal``, ``protocol``, ``profile_from``, ``session``, ``episode``, ``allow_damaged``,
``workspace`` and ``name`` (the output directory's name); relative paths are taken from the
manifest's directory.
A line that is not such an object fails alone: its outcome is ``failed`` with the code
``bad_manifest_line`` and the line number, and the lines after it are prepared.
"""

from __future__ import annotations

import enum
import os
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

import orjson
from pvisor.adapters.native import read_native
from pvisor.adapters.protocols.base import ParseMemo
from pvisor.core.errors import PvisorError

from .errors import ReplayUsageError, error_code, error_detail, show_path
from .result_parts import ToolCallMemo
from .journal_runs import JournalRuns
from .prefix import Prefix
from .prepare import PrepareOptions, check_inputs_not_outputs, check_options, compute
from .output import (
    check_output,
    create_output,
    remove_made,
    to_be_made,
)
from .result import (
    PREFIX_FILE,
    REQUEST_FILE,
    ResultDocument,
    ResultMode,
    elapsed_ms,
    file_sha256,
    write_failed,
    write_outputs,
)

#: the keys a manifest line may have, and the types their values must be
MANIFEST_KEYS: dict[str, tuple[type, ...]] = {
    "trajectory": (str,),
    "run": (str,),
    "journal": (str,),
    "agent": (str,),
    "after_step": (int,),
    "protocol": (str,),
    "profile_from": (str,),
    "session": (str,),
    "episode": (str,),
    "allow_damaged": (bool,),
    "workspace": (str,),
    "name": (str,),
}
#: a manifest line longer than this is refused before it is parsed (16 MiB)
MAX_LINE_BYTES = 16 * 1024 * 1024
#: the longest path value (PATH_MAX), other string value and output directory name (NAME_MAX)
MAX_PATH_BYTES = 4096
MAX_VALUE_CHARS = 1024
MAX_NAME_BYTES = 255
_PATH_KEYS = frozenset({"trajectory", "journal", "workspace", "profile_from"})


class Status(str, enum.Enum):
    """How one request of a batch ended (its result document's ``status``)."""

    OK = "ok"
    FAILED = "failed"


class BatchOutcome:
    """One request's outcome: ``index`` (1-based: the manifest's line number, or the position
    in the requests given), ``name`` (its output directory's name, or None), ``status``,
    ``result`` (the result document, ``sandbox-playback.result/v3``; None for a manifest line
    that is no request: ``error`` says why), ``prefix`` (the
    :class:`~.prefix.Prefix`: ``body`` bytes and ``request`` dict; None when it failed),
    ``error`` (the :class:`~pvisor.core.errors.PvisorError`, None when it is ok) and
    ``output`` (the directory its files were written to, or None)."""

    __slots__ = ("index", "name", "status", "result", "prefix", "error", "output")

    def __init__(
        self,
        index: int,
        name: str | None,
        status: Status,
        result: dict[str, Any] | None,
        prefix: Prefix | None,
        error: PvisorError | None,
        output: Path | None,
    ) -> None:
        self.index = index
        self.name = name
        self.status = status
        self.result = result
        self.prefix = prefix
        self.error = error
        self.output = output

    def __repr__(self) -> str:
        return f"BatchOutcome(index={self.index}, name={self.name!r}, status={self.status.value!r})"


class SourceReads:
    """What the prepares of one batch share: each native file read (parsed by its adapter) and
    digested once, and each journal run read and classified once (:attr:`runs`, a
    :class:`~.journal_runs.JournalRuns`: its journals stay open until :meth:`close`). A file is
    known by its resolved path, device, inode, size and modification time, so that one
    rewritten between two requests is read again; a journal's runs are read again once anything
    was committed to it. Holds the parsed sources until it is dropped (a batch keeps at most
    :attr:`max_sources` of them, the least recently used going first), and what the prefixes of
    at most :attr:`max_memos` sources' steps share: their tool-call records (:meth:`tool_calls`)
    and the messages of their bodies read back (:meth:`parses`; each message once, with its
    JSON: about the size of the source's longest prefix). A memo keeps its source's steps
    until it is dropped, also after the source's own cache let them go."""

    def __init__(self, max_sources: int = 64, max_memos: int = 16) -> None:
        self.max_sources = max_sources
        self.max_memos = max_memos
        self._native: dict[tuple, Any] = {}
        self._digests: dict[tuple, str] = {}
        self._memos: dict[tuple, tuple[Sequence[Any], Any]] = {}
        self.runs = JournalRuns()

    def close(self) -> None:
        """Close the journals the batch keeps open (:meth:`JournalRuns.close`)."""
        self.runs.close()

    @staticmethod
    def _key(path: Path) -> tuple:
        st = os.stat(path)
        return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def sha256(self, path: Path) -> str:
        """:func:`~.result.file_sha256` of ``path``, once per file."""
        try:
            key = self._key(path)
        except OSError:
            return file_sha256(path)  # it names the error
        digest = self._digests.get(key)
        if digest is None:
            digest = self._digests[key] = file_sha256(path)
        return digest

    def tool_calls(
        self,
        steps: Sequence[Any],
        key: Hashable,
        wire: Callable[[], Callable[[Any], list[str | None]] | None],
    ) -> ToolCallMemo | None:
        """The :class:`~.result_parts.ToolCallMemo` of ``steps`` (a source's steps, the very
        object: a journal run's classified once, a native file's read once) and the call ids'
        wire form ``key`` (None: the ids the steps hold; for a native file the agent and the
        protocol), made with ``wire()`` on first use. None for steps built for one prefix alone
        (an adapter that builds its steps lazily: nothing to share)."""
        return self._memo(steps, ("tool_calls", key), lambda: ToolCallMemo(steps, wire()))

    def parses(self, steps: Sequence[Any], protocol: str) -> ParseMemo | None:
        """The :class:`~pvisor.adapters.protocols.base.ParseMemo` with which the prefixes of
        the source of ``steps`` (as for :meth:`tool_calls`) in ``protocol`` are read back
        (:func:`~.result_parts.describe_prefix`): one body repeats another's messages."""
        return self._memo(steps, ("parses", protocol), ParseMemo)

    def _memo(self, steps: Sequence[Any], key: Hashable, make: Callable[[], Any]) -> Any:
        if not isinstance(steps, list):
            return None
        memo_key = (id(steps), key)
        held = self._memos.pop(memo_key, None)
        if held is None or held[0] is not steps:
            # the steps are held with the memo, so another object never takes their id meanwhile
            held = (steps, make())
            while len(self._memos) >= self.max_memos:
                self._memos.pop(next(iter(self._memos)))
        self._memos[memo_key] = held  # last: the most recently used
        return held[1]

    def native(self, path: Path, agent: str, session: str | None) -> Any:
        """``read_native(path, agent, session)``, once per file, agent and session."""
        try:
            key = (*self._key(path), agent, session)
        except OSError:
            return read_native(path, agent, session)  # it names the error
        hit = self._native.pop(key, None)
        if hit is None:
            hit = read_native(path, agent, session)
            while len(self._native) >= self.max_sources:
                self._native.pop(next(iter(self._native)))
        self._native[key] = hit  # last: the most recently used
        return hit


def read_manifest(path: Path) -> Iterator[tuple[int, Mapping[str, Any] | PvisorError]]:
    """(line number, the line's object or the error that says why it is not one) for each
    non-blank line of the JSON Lines file ``path``. Raises ReplayUsageError when the file
    cannot be opened."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ReplayUsageError("usage", f"--batch {show_path(path)}: {exc.strerror or exc}") from None
    with fh:
        n = 0
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            n += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                # the rest of the line is skipped: it is one request however long
                while line and not line.endswith(b"\n"):
                    line = fh.readline(MAX_LINE_BYTES)
                yield n, _bad(path, n, f"longer than {MAX_LINE_BYTES} bytes")
                continue
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield n, _bad(path, n, f"not JSON ({exc})")
                continue
            if not isinstance(obj, dict):
                yield n, _bad(path, n, f"a JSON {type(obj).__name__}, expected an object")
                continue
            yield n, obj


def _bad(path: Path | None, n: int, what: str) -> ReplayUsageError:
    where = f"{show_path(path)} line {n}" if path is not None else f"request {n}"
    return ReplayUsageError("bad_manifest_line", f"{where}: {what}")


def request_from(
    obj: Mapping[str, Any],
    n: int,
    *,
    manifest: Path | None = None,
    journal: Path | None = None,
    output: Path | None = None,
) -> PrepareOptions:
    """The :class:`PrepareOptions` of manifest line ``n`` (module docstring): relative paths
    from the manifest's directory, ``journal`` the default journal of a ``run`` line, the
    output directory ``output/<name>`` (``name`` from the line, else the line number with
    six digits) or None. Raises ReplayUsageError ``bad_manifest_line`` naming the line."""
    for key, value in obj.items():
        types = MANIFEST_KEYS.get(key)
        if types is None:
            raise _bad(manifest, n, f"unknown key {key!r}; expected some of {', '.join(MANIFEST_KEYS)}")
        if value is not None and (
            not isinstance(value, types) or (types == (int,) and isinstance(value, bool))
        ):
            raise _bad(
                manifest, n, f"{key}: expected {' or '.join(t.__name__ for t in types)}, got {value!r:.60}"
            )
    for key, value in obj.items():
        if isinstance(value, str):
            limit = MAX_PATH_BYTES if key in _PATH_KEYS else MAX_VALUE_CHARS
            if len(value.encode("utf-8", "surrogatepass")) > limit:
                raise _bad(manifest, n, f"{key}: {len(value)} characters, at most {limit} bytes")
            if "\0" in value or (
                key not in _PATH_KEYS and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
            ):
                raise _bad(manifest, n, f"{key}: holds a control character")
    if isinstance(obj.get("after_step"), float):  # orjson reads an integer past 64 bits as a float
        raise _bad(manifest, n, "after_step: expected a step number of at most 64 bits")
    for key in ("agent", "after_step"):
        if obj.get(key) is None:
            raise _bad(manifest, n, f"no {key}")
    if (obj.get("trajectory") is None) == (obj.get("run") is None):
        raise _bad(manifest, n, "give exactly one of trajectory and run")
    base = manifest.parent if manifest is not None else Path()

    def path(key: str) -> Path | None:
        value = obj.get(key)
        if value is None:
            return None
        p = Path(value)
        return p if p.is_absolute() else base / p

    name = obj.get("name") or f"{n:06d}"
    if output is not None and (name in (".", "..") or "/" in name or "\\" in name):
        raise _bad(manifest, n, f"name {name!r}: one directory name, not a path")
    if output is not None and len(os.fsencode(name)) > MAX_NAME_BYTES:
        raise _bad(
            manifest,
            n,
            f"name: {len(os.fsencode(name))} bytes, a directory name has at most {MAX_NAME_BYTES}",
        )
    return PrepareOptions(
        agent=obj["agent"],
        after_step=obj["after_step"],
        output=output / name if output is not None else None,  # type: ignore[arg-type]
        trajectory=path("trajectory"),
        run=obj.get("run"),
        journal=path("journal") or (journal if obj.get("run") is not None else None),
        workspace=path("workspace"),
        protocol=obj.get("protocol"),
        profile_from=obj.get("profile_from"),
        session=obj.get("session"),
        allow_damaged=bool(obj.get("allow_damaged")),
        episode=obj.get("episode"),
    )


def prepare_many(
    requests: Iterable[PrepareOptions | Mapping[str, Any] | PvisorError],
    *,
    reads: SourceReads | None = None,
    row_label: str | None = None,
) -> Iterator[BatchOutcome]:
    """Prepare each request in one process, in order, and yield its :class:`BatchOutcome`.

    A request is a :class:`PrepareOptions` (with an ``output`` directory the three files are
    written there, as :func:`~.prepare.prepare_only` writes them, ``force`` included; with
    ``output=None`` nothing is written and the outcome holds the prefix), a mapping of a
    manifest line (:func:`request_from`, paths from the current directory, no output), or a
    PvisorError that stands for a line already known to be bad (:func:`read_manifest`). A
    request's own failure never stops the others: it is a ``failed`` outcome with its result
    document. ``reads`` shares parsed sources (a new :class:`SourceReads` when None);
    ``row_label``: without an output directory, what the result names as the prefix's place
    (``ROWS#N`` with N the index; ``(memory)`` when None). A request may also be an ``(index,
    request)`` pair, to number it (a manifest's line numbers); a request of a wrong type or
    holding one is a ``failed`` outcome with the code ``usage``; ``reads`` made here is closed
    when the requests are done (or the iterator is dropped)."""
    own = reads is None
    reads = SourceReads() if reads is None else reads
    try:
        for index, request in enumerate(requests, 1):
            if isinstance(request, tuple):  # (index, request) from the CLI: the manifest's line numbers
                index, request = request
            yield _one(index, request, reads, row_label)
    finally:
        if own:
            reads.close()


def _one(index: int, request: Any, reads: SourceReads, row_label: str | None) -> BatchOutcome:
    t0 = time.perf_counter()
    opts: PrepareOptions | None = None
    out: Path | None = None
    result: ResultDocument | None = None
    made: list[str] = []  # the output directories this request made, until its files are written
    try:
        if isinstance(request, PvisorError):
            raise request
        if isinstance(request, Mapping):
            opts = request_from(request, index)
        elif isinstance(request, PrepareOptions):
            opts = request
        else:
            raise ReplayUsageError(
                "usage",
                f"request {index}: a {type(request).__name__}, expected PrepareOptions or a manifest line's "
                "dict",
            )
        _check_types(opts, index)
        result = ResultDocument.start(
            ResultMode.PREPARE_ONLY, opts.agent, opts.trajectory, opts.journal, opts.run, opts.after_step
        )
        check_options(opts)
        if opts.output is not None:
            target = Path(check_output(opts.output, opts.workspace, opts.force))
            check_inputs_not_outputs(opts, target)
            made = to_be_made(target)
            create_output(target, opts.output)
            # only now: a failure before must not remove files of a directory it was refused
            # (the prefix files there may be this request's own source)
            out = target
            shown: tuple[Path | str, Path | str] = (out / PREFIX_FILE, out / REQUEST_FILE)
        else:
            label = f"{row_label}#{index}" if row_label is not None else "(memory)"
            shown = (f"{label}/prefix", f"{label}/request")
        prefix = compute(opts, result, shown, t0, reads)
        if out is not None:
            document = write_outputs(out, prefix, result, t0)
            made = []
        else:
            result.timings_ms.total = elapsed_ms(t0, time.perf_counter())
            document = result.to_json()
        return BatchOutcome(index, _name(opts), Status.OK, document, prefix, None, out)
    except (PvisorError, OSError, ValueError) as exc:
        if not isinstance(exc, PvisorError):
            # a path the system refuses (a name too long, a NUL byte): this request's failure
            what = getattr(exc, "strerror", None) or str(exc)
            exc = ReplayUsageError("usage", f"request {index}: {what}")
        if result is None:  # no request, so no result document
            return BatchOutcome(index, None, Status.FAILED, None, None, exc, None)
        result.fail(exc, t0)
        document = write_failed(out, result) if out is not None else result.to_json()
        return BatchOutcome(index, _name(opts), Status.FAILED, document, None, exc, out)
    except BaseException:
        # interrupted (Ctrl-C): the request in progress leaves no directory of its own, empty or
        # half written; the finished requests' outputs stay
        remove_made(made)
        raise


def _check_types(opts: PrepareOptions, index: int) -> None:
    """ReplayUsageError naming the field when a PrepareOptions of the API holds a wrong type
    (a manifest line's are checked by :func:`request_from`)."""
    checks = [
        ("agent", opts.agent, (str,)),
        ("run", opts.run, (str, type(None))),
        ("protocol", opts.protocol, (str, type(None))),
        ("profile_from", opts.profile_from, (str, type(None))),
        ("session", opts.session, (str, type(None))),
        ("episode", opts.episode, (str, type(None))),
    ]
    checks += [
        (k, getattr(opts, k), (Path, type(None))) for k in ("output", "trajectory", "journal", "workspace")
    ]
    for name, value, types in checks:
        if not isinstance(value, types):
            want = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise ReplayUsageError(
                "usage", f"request {index}: {name}: expected {want}, got {type(value).__name__}"
            )
    if not isinstance(opts.after_step, int) or isinstance(opts.after_step, bool):
        raise ReplayUsageError(
            "usage", f"request {index}: after_step: expected int, got {type(opts.after_step).__name__}"
        )


#: the columns of an outcome's row as text (:func:`text_row`): Parquet's and Ray's
TEXT_COLUMNS = (
    "line",
    "name",
    "status",
    "agent",
    "after_step",
    "prefix_sha256",
    "prefix",
    "request",
    "result",
    "error_code",
    "error_message",
)


#: the fields a row starts with, the same in every form of it (docs/result-protocol.md, --rows)
ROW_HEAD = ("line", "name", "status", "agent", "after_step", "prefix_sha256")


def row_head(outcome: BatchOutcome) -> dict[str, Any]:
    """The :data:`ROW_HEAD` fields of ``outcome``'s row (None where it has no result)."""
    r = outcome.result
    return {
        "line": outcome.index,
        "name": outcome.name,
        "status": outcome.status.value,
        "agent": r["agent"] if r is not None else None,
        "after_step": r["boundary"]["after_step"] if r is not None else None,
        "prefix_sha256": r["prefix"]["sha256"] if r is not None and r["prefix"] is not None else None,
    }


def text_row(outcome: BatchOutcome) -> dict[str, Any]:
    """The row of ``outcome`` (docs/result-protocol.md, the ``--rows`` fields) with the prefix,
    request and result as JSON text and the error as its code and message: what a column store
    holds. JSON is UTF-8 (RFC 8259) and every protocol encoder writes it so; body bytes that are
    not (none seen) become U+FFFD here, where the JSON Lines rows keep them as they are."""
    r, p, exc = outcome.result, outcome.prefix, outcome.error
    return {
        **row_head(outcome),
        "prefix": p.body.decode("utf-8", "replace") if p is not None else None,
        "request": orjson.dumps(p.request).decode() if p is not None else None,
        "result": orjson.dumps(r).decode() if r is not None else None,
        "error_code": error_code(exc) if exc is not None else None,
        "error_message": error_detail(exc) if exc is not None else None,
    }


def _name(opts: PrepareOptions | None) -> str | None:
    return opts.output.name if opts is not None and opts.output is not None else None


__all__ = [
    "BatchOutcome",
    "MANIFEST_KEYS",
    "ROW_HEAD",
    "SourceReads",
    "Status",
    "TEXT_COLUMNS",
    "prepare_many",
    "read_manifest",
    "request_from",
    "row_head",
    "text_row",
]
