"""prepare-only: write the prefix that ends at O_N and the result document, executing nothing.

:func:`prepare_only` is what ``pvisor replay --prepare-only`` calls. It reads the source (a
journal run or a native trajectory file), builds the prefix (:mod:`pvisor.replay.prefix`),
digests the workspace before and after, and writes three files into the output directory:

- ``prefix.json``: the request body for inference N+1, exact bytes;
- ``prefix.request.json``: ``{"method", "path", "query", "headers", "recorded_content_encoding"}``;
- ``result.json``: the result document, schema ``sandbox-playback.result/v3``
  (docs/result-protocol.md, JSON Schema docs/result-schema.json).

Guarantees (docs/replay.md): no process is started, no socket opened, nothing in the
workspace written; the output directory is refused inside the workspace and, unless
``force``, when it is not empty. A failure after the output directory was accepted still
writes ``result.json`` (``status: "failed"``, ``errors``) and no prefix files, then raises.

Imports: the standard library, orjson and pvisor's own modules, lazily: a native source
never imports asyncio, aiohttp, sqlite_utils or jsonschema (tests/test_replay_side_effects.py).
"""

from __future__ import annotations

import errno
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import orjson

from pvisor.journal.digest import file_sha256 as _file_digest, sha256_hex as _sha256_hex
from pvisor.journal.errors import PvisorError, UsageError
from pvisor.journal.model import Step, ToolCall, ToolResult

from .errors import (
    ReplayBadInput,
    ReplayOutputError,
    ReplayUsageError,
    ReplayWorkspaceChanged,
    error_code,
    error_detail,
    show_path,
)
from pvisor.adapters.jsonio import dumps
from .prefix import Prefix
from .source import Source, descriptor, finish_at, is_made_up

if TYPE_CHECKING:
    from pathlib import Path

    from .batch import SourceReads
    from .workspace import WorkspaceDigest

#: the result document's schema name
RESULT_SCHEMA = "sandbox-playback.result/v3"
#: file names written into the output directory
PREFIX_FILE = "prefix.json"
REQUEST_FILE = "prefix.request.json"
RESULT_FILE = "result.json"
OUTPUT_FILES = (PREFIX_FILE, REQUEST_FILE, RESULT_FILE)


class PrepareOptions:
    """The arguments of one prepare-only.

    Fields: ``agent`` (adapter name); ``after_step`` N (int >= 0); ``output`` directory;
    exactly one of ``trajectory`` (native file or directory) and ``run`` (journal run id or
    unique prefix, read from ``journal``); ``workspace`` (directory digested before and after,
    or None); ``protocol`` (wire protocol for a native render, or None for the agent's
    default); ``profile_from`` (``JOURNAL[:RUN]``, native sources only); ``force`` (accept a
    non-empty output directory); ``session`` (one session of an OpenCode store); ``allow_damaged``
    (build the prefix of a damaged native file, each repair a warning; refused by default)."""

    # a plain class with slots, not a dataclass: each dataclass costs about a millisecond of
    # startup (its methods are generated with exec), which the CLI pays on every run
    __slots__ = (
        "agent",
        "after_step",
        "output",
        "trajectory",
        "run",
        "journal",
        "workspace",
        "protocol",
        "profile_from",
        "force",
        "session",
        "allow_damaged",
    )

    def __init__(
        self,
        agent: str,
        after_step: int,
        output: Path,
        trajectory: Path | None = None,
        run: str | None = None,
        journal: Path | None = None,
        workspace: Path | None = None,
        protocol: str | None = None,
        profile_from: str | None = None,
        force: bool = False,
        session: str | None = None,
        allow_damaged: bool = False,
    ) -> None:
        self.agent = agent
        self.after_step = after_step
        self.output = output
        self.trajectory = trajectory
        self.run = run
        self.journal = journal
        self.workspace = workspace
        self.protocol = protocol
        self.profile_from = profile_from
        self.force = force
        self.session = session
        self.allow_damaged = allow_damaged

    def __repr__(self) -> str:
        return "PrepareOptions(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)


class PrepareOutcome:
    """What :func:`prepare_only` did: the ``result`` document (dict) and the paths written
    (``output``, ``prefix_path``, ``result_path``: :class:`~pathlib.Path` objects, made when
    asked for; the command itself never imports pathlib, docs/benchmarks.md)."""

    __slots__ = ("result", "_paths")

    def __init__(
        self,
        result: dict[str, Any],
        output: str | os.PathLike,
        prefix_path: str | os.PathLike,
        result_path: str | os.PathLike,
    ) -> None:
        self.result = result
        self._paths = (os.fspath(output), os.fspath(prefix_path), os.fspath(result_path))

    @property
    def output(self) -> Path:
        from pathlib import Path

        return Path(self._paths[0])

    @property
    def prefix_path(self) -> Path:
        from pathlib import Path

        return Path(self._paths[1])

    @property
    def result_path(self) -> Path:
        from pathlib import Path

        return Path(self._paths[2])

    def __repr__(self) -> str:
        return f"PrepareOutcome(output={self.output!r}, prefix_path={self.prefix_path!r}, result_path={self.result_path!r})"

    def summary(self) -> str:
        """One line for people: what was prepared, from what, where."""
        r = self.result
        p, b = r["prefix"], r["boundary"]
        src = r["source"]
        what = f"run {src['run']}" if src["kind"] == "journal" else src["path"]
        flag = ", rendered" if p["rendered"] else ", recorded bytes"
        ws = ""
        if r["workspace"] is not None:
            ws = ", workspace unchanged" if r["workspace"]["unchanged"] else ", WORKSPACE CHANGED"
        origin = p.get("origin") or {}
        absent = [shown for part, shown in (("system", "system prompt"), ("tools", "tools"))
                  if origin.get(part) == "absent"]  # fmt: skip
        if p["rendered"] and absent:
            # a native file stores neither: say so where people look, and how to fill them
            flag += f", without {' and '.join(absent)} " + (
                "(not in the --profile-from capture either)"
                if "profile" in origin.values()
                else "(the native file holds none; --profile-from JOURNAL[:RUN] fills them from a capture "
                "of this agent)"
            )
        count = p["message_count"]
        return (
            f"prepared {self._paths[1]}: {r['agent']} from {what}, after step {b['after_step']} of "
            f"{b['steps_total']}, {p['protocol']}, {p['bytes']} bytes, {count} "
            f"message{'' if count == 1 else 's'} "
            f"ending with the {p['ends_with']}{flag}{ws}"
        )


# --------------------------------------------------------------------------- helpers


def sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` as 64 lower-case hex digits."""
    return _sha256_hex(data)


def content_sha256(content: Any) -> str:
    """The digest of a tool result's content: SHA-256 of its UTF-8 bytes when it is a string,
    else of its JSON (orjson, keys sorted, compact)."""
    if isinstance(content, str):
        return sha256_hex(content.encode("utf-8", "surrogatepass"))
    return sha256_hex(dumps(content, sort_keys=True))


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB pieces); of a directory (OpenCode's storage
    tree), the workspace digest of it."""
    try:
        if os.path.isdir(path):
            from .workspace import digest_workspace  # here: only a directory source needs it

            return digest_workspace(path).sha256
        return _file_digest(path)
    except OSError as exc:
        raise ReplayBadInput(
            "bad_source", f"cannot read {show_path(exc.filename or path)}: {exc.strerror or exc}"
        ) from None


def workspace_digest(root: Path) -> "WorkspaceDigest":
    """:func:`digest_workspace`, or ReplayBadInput ``workspace_unreadable`` naming the entry
    that cannot be read (nothing is left out of the digest silently)."""
    from .workspace import digest_workspace  # here: prepare-only of a file has no workspace

    try:
        return digest_workspace(root)
    except OSError as exc:
        where = show_path(exc.filename) if exc.filename else show_path(root)
        raise ReplayBadInput(
            "workspace_unreadable",
            f"--workspace {show_path(root)}: cannot read {where}: {exc.strerror or exc}; the workspace digest cannot be computed",
        ) from None


def match_results(calls: list[ToolCall], results: list[ToolResult]) -> list[ToolResult | None]:
    """The result answering each call: the one with its call id, else the one at its
    position when that one answers no other call (Gemini CLI gives its own ids)."""
    by_id = {r.call_id: r for r in results if r.call_id is not None}
    call_ids = {c.id for c in calls if c.id is not None}
    out: list[ToolResult | None] = []
    for i, c in enumerate(calls):
        if c.id is not None and c.id in by_id:
            out.append(by_id[c.id])
        elif i < len(results) and (results[i].call_id is None or results[i].call_id not in call_ids):
            out.append(results[i])
        else:
            out.append(None)
    return out


def tool_call_records(
    steps: Sequence[Step],
    after_step: int,
    wire: Callable[[Any], list[str | None]] | None = None,
    unsent: bool = False,
) -> list[dict[str, Any]]:
    """``tool_calls`` of the result: one record per tool call of steps 1..N, in order.
    ``wire(action)``: the call ids as the agent sends them (a native file may store its own
    form: Gemini CLI's ``<name>__<id>``), so that ``call_id`` names the id the prefix carries.
    ``unsent``: O_N was never sent (A_N is the agent's finish action, :func:`~.source.finish_at`):
    the calls of A_N are flagged ``observation_not_sent`` and have no historical observation."""
    out: list[dict[str, Any]] = []
    for i in range(after_step):
        step = steps[i]
        calls = list(step.action.tool_calls)
        ids = wire(step.action) if wire is not None else [c.id for c in calls]
        not_sent = unsent and i == after_step - 1
        results = [] if not_sent else list(step.observation.results)
        for c, r, cid in zip(calls, match_results(calls, results), ids):
            out.append(
                {
                    "step": step.n,
                    "call_id": cid,
                    "name": c.name,
                    "kind": c.kind,
                    "arguments_sha256": sha256_hex(c.arguments_raw.encode("utf-8", "surrogatepass")),
                    "historical_observation_sha256": content_sha256(r.content)
                    if r is not None and not is_made_up(r)
                    else None,
                    "replayed_observation_sha256": None,
                    "equal": None,
                    "observation_not_sent": not_sent,
                }
            )
    return out


def describe_prefix(protocol: str, body: bytes, path: str, query: str, after_step: int) -> dict[str, Any]:
    """``message_count``, ``ends_with``, ``system_present`` and ``tools_present`` of a prefix
    body, read back with the protocol module (the body must parse: a rendered one always does,
    a recorded one parsed when the chain rule read it)."""
    from pvisor.adapters.protocols import get_protocol

    conv = get_protocol(protocol).parse_request(body, path=path, query=query)
    last = conv.messages[-1] if conv.messages else None
    if last is None:
        ends = "nothing"
    elif last.role == "assistant":
        ends = "action"
    elif any(isinstance(p, ToolResult) for p in last.parts):
        ends = "observation"
    elif after_step == 0:
        ends = "task"
    else:
        ends = "observation"
    return {
        "message_count": len(conv.messages),
        "ends_with": ends,
        "system_present": bool(conv.system),
        "tools_present": bool(conv.tools),
        "model": conv.model,
        "stream": conv.stream,
    }


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000.0, 3)


def _inside(child: str, parent: str) -> bool:
    """Whether the resolved path ``child`` is ``parent`` or under it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _resolve(path: str | os.PathLike) -> str:
    """``Path(path).resolve()`` as a string: ``os.path.realpath``, and a symlink loop (which
    realpath leaves as it is, and ``resolve`` finds by a ``stat``) is ReplayUsageError
    ``bad_path`` naming the path, as is a path the system refuses."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as exc:
        raise ReplayUsageError("bad_path", f"{show_path(path)}: cannot be resolved ({_why(exc)})") from None
    try:
        os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReplayUsageError(
                "bad_path", f"{show_path(path)}: cannot be resolved (a symlink loop)"
            ) from None
    except ValueError as exc:
        raise ReplayUsageError("bad_path", f"{show_path(path)}: cannot be resolved ({_why(exc)})") from None
    return real


def _why(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or "a symlink loop"


def check_output(
    output: str | os.PathLike,
    workspace: str | os.PathLike | None,
    force: bool,
    why: str = "prepare-only never writes the workspace",
) -> str:
    """The resolved output directory (a str), or ReplayUsageError ``output_refused`` when it is
    (or is inside) the workspace, is not a directory or lies below a file, or is not empty
    without ``force``."""
    out = _resolve(output)
    if workspace is not None and _inside(out, _resolve(workspace)):
        raise ReplayUsageError(
            "output_refused", f"--output {output} is inside --workspace {workspace}: {why}"
        )
    if not os.path.exists(out):
        # the directories that do not exist yet are made (create_output): one of its parents
        # that is a file is a usage error here, not a failed write later
        there = os.path.dirname(out)
        while there and not os.path.lexists(there) and os.path.dirname(there) != there:
            there = os.path.dirname(there)
        if os.path.lexists(there) and not os.path.isdir(there):
            raise ReplayUsageError(
                "output_refused", f"--output {output}: {show_path(there)} is not a directory"
            )
    elif not os.path.isdir(out):
        raise ReplayUsageError("output_refused", f"--output {output} exists and is not a directory")
    elif not force and os.listdir(out) and not failed_before(out):
        raise ReplayUsageError(
            "output_refused", f"--output {output} is not empty; give --force to write into it"
        )
    return out


def failed_before(out: str | os.PathLike) -> bool:
    """Whether ``out`` holds only what a replay that did not succeed left (its files, a
    ``result.json`` whose status is not ``ok``): a failed replay never blocks its retry."""
    try:
        names = set(os.listdir(out))
        if RESULT_FILE not in names or not names <= set(OUTPUT_FILES):
            return False
        with open(os.path.join(out, RESULT_FILE), "rb") as fh:
            status = orjson.loads(fh.read()).get("status")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(status, str) and status != "ok"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are one file (a hard link, a symlink); False when either cannot
    be looked at (missing, a path the system refuses)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_inputs_not_outputs(opts: "PrepareOptions", out: str | os.PathLike) -> None:
    """ReplayUsageError ``output_refused`` when the source file, the journal or the
    ``--profile-from`` journal is one of the files prepare-only writes into ``out`` (the same
    resolved path, or the same file through a hard link): writing would destroy it."""
    inputs: list[tuple[str, str | os.PathLike]] = []
    if opts.trajectory is not None:
        inputs.append(("--trajectory", opts.trajectory))
    if opts.journal is not None:
        inputs.append(("--journal", opts.journal))
    if opts.profile_from is not None:
        from .prefix import parse_profile_spec

        inputs.append(("--profile-from", parse_profile_spec(opts.profile_from)[0]))
    for opt, path in inputs:
        resolved = _resolve(path)
        for name in OUTPUT_FILES:
            target = os.path.join(out, name)
            if resolved == target or same_file(path, target):
                raise ReplayUsageError(
                    "output_refused",
                    f"{opt} {show_path(path)} is {show_path(target)}, a file prepare-only writes: choose another --output",
                )


def _write(path: str, data: bytes) -> None:
    _commit(_write_temps([(path, data)]))


def _drop(tmps: list[tuple[str, str]]) -> None:
    for tmp, _ in tmps:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _write_temps(
    files: list[tuple[str, bytes]], tmps: list[tuple[str, str]] | None = None
) -> list[tuple[str, str]]:
    """Write each ``(path, data)`` under a temporary name beside ``path``; returns (and
    appends to ``tmps``) the ``(temporary, path)`` pairs. On an error every temporary file of
    ``tmps`` is removed and ReplayOutputError is raised."""
    tmps = [] if tmps is None else tmps
    for path, data in files:
        where, name = os.path.split(path)
        tmp = os.path.join(where, f".{name}.tmp-{os.getpid()}")
        tmps.append((tmp, path))
        try:
            from pvisor.journal.outfile import open_private

            with open_private(tmp) as fh:
                fh.write(data)
        except OSError as exc:
            _drop(tmps)
            raise ReplayOutputError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None
    return tmps


def _commit(tmps: list[tuple[str, str]]) -> None:
    """Rename every temporary file into place (os.replace: an earlier file, or a symbolic link
    in its place, is replaced, never written through); on an error the temporary files left
    are removed and ReplayOutputError is raised."""
    for i, (tmp, path) in enumerate(tmps):
        try:
            os.replace(tmp, path)
        except OSError as exc:
            _drop(tmps[i:])
            raise ReplayOutputError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None


def dump_result(result: dict[str, Any]) -> bytes:
    """result.json's bytes: indented JSON and a final newline (orjson, else the standard
    library: an --after-step past 64 bits still gives a failed document)."""
    return dumps(result, indent=True) + b"\n"


# --------------------------------------------------------------------------- the operation


def _utf8(opt: str, value: Any) -> None:
    from pvisor.journal.paths import require_utf8

    require_utf8(opt, value if value is None or isinstance(value, (str, os.PathLike)) else str(value))


def _inside_path(child: str | os.PathLike, parent: str | os.PathLike) -> bool:
    return _inside(_resolve(child), _resolve(parent))


def check_options(opts: PrepareOptions) -> None:
    """UsageError (exit 2) for options that make no sense, before anything is read or written."""
    descriptor(opts.agent)  # ReplayUsageError unknown_agent
    if (opts.trajectory is None) == (opts.run is None):
        raise UsageError(
            "give exactly one source: --trajectory PATH (a native file) or --run ID (a journal run)"
        )
    for opt, value in (
        ("--output", opts.output),
        ("--trajectory", opts.trajectory),
        ("--run", opts.run),
        ("--journal", opts.journal),
        ("--workspace", opts.workspace),
        ("--profile-from", opts.profile_from),
        ("--session", opts.session),
    ):
        _utf8(opt, value)
    if opts.run is not None and opts.profile_from is not None:
        raise UsageError(
            "--profile-from fills a native render; a journal run (--run) holds its own system prompt and tools"
        )
    if opts.run is not None and opts.session is not None:
        raise UsageError(
            "--session picks a session of an OpenCode store (--trajectory); a journal run (--run) is one run"
        )
    if opts.run is not None and opts.journal is None:
        raise UsageError("--run needs a journal: give the global --journal PATH")
    if opts.after_step < 0:
        raise ReplayUsageError(
            "usage", f"--after-step {opts.after_step}: N counts steps from 0 (the task alone)"
        )
    if opts.workspace is not None:
        if not os.path.exists(opts.workspace):
            raise UsageError(f"--workspace {show_path(opts.workspace)}: no such directory")
        if not os.path.isdir(opts.workspace):
            raise UsageError(f"--workspace {show_path(opts.workspace)}: not a directory")
    if opts.trajectory is not None:
        from pvisor.adapters.native import check_source_file

        check_source_file(opts.trajectory, f"--trajectory {show_path(opts.trajectory)}")
    if opts.journal is not None:
        if not os.path.exists(opts.journal):
            raise UsageError(f"--journal {show_path(opts.journal)}: no such journal file")
        if os.path.isdir(opts.journal):
            raise UsageError(f"--journal {show_path(opts.journal)} is a directory, expected a journal file")
    if opts.workspace is not None:
        # opening an SQLite journal read-only still creates its -wal/-shm files beside it
        # (WAL mode): a journal inside the workspace would be a write into it
        journals = [("--journal", opts.journal)] if opts.journal is not None else []
        if opts.profile_from is not None:
            from .prefix import parse_profile_spec

            journals.append(("--profile-from", parse_profile_spec(opts.profile_from)[0]))
        for opt, path in journals:
            if path is not None and _inside_path(path, opts.workspace):
                raise UsageError(
                    f"{opt} {show_path(path)} is inside --workspace {show_path(opts.workspace)}: opening the journal creates its -wal/-shm "
                    "files beside it and prepare-only never writes the workspace; copy the journal out of the workspace"
                )


def _base_result(opts: PrepareOptions) -> dict[str, Any]:
    return base_result("prepare-only", opts.agent, opts.trajectory, opts.journal, opts.run, opts.after_step)


def base_result(
    mode: str, agent: str, trajectory: Path | None, journal: Path | None, run: str | None, after_step: int
) -> dict[str, Any]:
    """A result document with nothing done yet (``status: failed``), for ``mode``."""
    from pvisor._version import DISTRIBUTION, __version__, source_commit
    from pvisor.journal.artifact import result_record

    return {
        "schema": RESULT_SCHEMA,
        "pvisor": result_record(__version__, distribution=DISTRIBUTION, commit=source_commit()),
        "mode": mode,
        "status": "failed",
        "agent": agent,
        "profile": None,
        "agent_version": None,
        "source": {
            "kind": "native" if trajectory is not None else "journal",
            "path": show_path(trajectory if trajectory is not None else journal),
            "sha256": None,
            "run": run,
            "session": None,
        },
        "boundary": {"after_step": after_step, "steps_total": None, "next_action_excluded": True},
        "prefix": None,
        "tool_calls": [],
        "replayed_tool_calls": 0,
        "agent_started": False,
        "live_requests": 0,
        "boundary_user_prompt_injected": False,
        "workspace": None,
        "derived_run": None,
        "lineage": None,
        "timings_ms": {},
        "warnings": [],
        "errors": [],
    }


def prepare_only(opts: PrepareOptions) -> PrepareOutcome:
    """Prepare the prefix of ``opts`` and write the three output files (module docstring).

    Returns a :class:`PrepareOutcome`. Raises UsageError (exit 2) for arguments that make no
    sense (before anything is written), ReplayBadInput (exit 65) for a source that cannot give
    the prefix, ReplayWorkspaceChanged (exit 1), IntegrityError (exit 3) for a damaged journal,
    ReplayOutputError (exit 74) when a file cannot be written; after the output directory was
    accepted, a failure first writes result.json with ``status: "failed"`` (no prefix files)
    and sets the error's ``result`` attribute to that document.

    Order: the options and the output directory are checked (a source or journal that is one
    of the output files is refused), everything is read and computed in memory, and only then
    are the three files written, under temporary names renamed into place: an earlier
    prefix or result in the directory is replaced last, never removed before the source is read."""
    t0 = time.perf_counter()
    check_options(opts)
    out = check_output(opts.output, opts.workspace, opts.force)
    check_inputs_not_outputs(opts, out)
    result = _base_result(opts)
    create_output(out, opts.output)
    try:
        prefix = compute(opts, result, (os.path.join(out, PREFIX_FILE), os.path.join(out, REQUEST_FILE)), t0)
        write_outputs(out, prefix, result, t0)
    except PvisorError as exc:
        fail(result, exc, t0)
        write_failed(out, result)
        raise
    return PrepareOutcome(result, out, os.path.join(out, PREFIX_FILE), os.path.join(out, RESULT_FILE))


def create_output(out: str | os.PathLike, given: str | os.PathLike) -> None:
    """Create the output directory ``out`` and its missing parents (mode 0700,
    :func:`~pvisor.journal.paths.make_directories`); ReplayOutputError (exit 74) naming
    ``given``, the ``--output`` as the user gave it, when it cannot be."""
    from pvisor.journal.paths import make_directories

    try:
        make_directories(out)
    except OSError as exc:
        raise ReplayOutputError(f"cannot create --output {show_path(given)}: {exc.strerror or exc}") from None


def to_be_made(out: str | os.PathLike) -> list[str]:
    """The directories of ``out`` (itself and its parents) that do not exist yet, outermost
    first: what :func:`create_output` is about to make, and what :func:`remove_made` takes away
    when the prepare is interrupted, even in the middle of making them."""
    missing: list[str] = []
    here = os.path.abspath(out)
    while not os.path.isdir(here) and os.path.dirname(here) != here:
        missing.append(here)
        here = os.path.dirname(here)
    return missing[::-1]


def remove_made(made: list[str]) -> None:
    """Remove the directories of :func:`to_be_made` (``made``) that exist, with what they hold:
    a prepare interrupted (Ctrl-C) before its files were written leaves no empty or partial
    output directory. A directory that was there before is not in ``made`` and stays."""
    if made:
        import shutil

        shutil.rmtree(made[0], ignore_errors=True)


def compute(
    opts: PrepareOptions,
    result: dict[str, Any],
    shown: tuple[Path | str, Path | str],
    t0: float,
    reads: "SourceReads | None" = None,
) -> Prefix:
    """Everything of a prepare-only but the writing: the workspace digested before and after,
    the source digested and read, the prefix built, ``result`` filled (``status: ok``).
    ``shown``: what the result names as the prefix and request files; ``reads``: parsed sources
    and digests shared between the prepares of a batch (:mod:`.batch`), or None. Raises what
    :func:`prepare_only` raises (the result is not marked failed: :func:`fail` does that)."""
    timings = result["timings_ms"]
    ws_before = None
    if opts.workspace is not None:
        t = time.perf_counter()
        ws_before = workspace_digest(opts.workspace)
        timings["workspace_before"] = _ms(t, time.perf_counter())
    t = time.perf_counter()
    source_path = opts.trajectory if opts.trajectory is not None else opts.journal
    assert source_path is not None
    result["source"]["sha256"] = reads.sha256(source_path) if reads is not None else file_sha256(source_path)
    timings["source_digest"] = _ms(t, time.perf_counter())
    t = time.perf_counter()
    prefix, source = _build(opts, reads)
    timings["prefix"] = _ms(t, time.perf_counter())
    _fill(result, opts, prefix, source, shown)
    if opts.workspace is not None:
        t = time.perf_counter()
        ws_after = workspace_digest(opts.workspace)
        timings["workspace_after"] = _ms(t, time.perf_counter())
        assert ws_before is not None
        result["workspace"] = {
            "path": show_path(_resolve(opts.workspace)),
            "sha256_before": ws_before.sha256,
            "sha256_after": ws_after.sha256,
            "unchanged": ws_before.sha256 == ws_after.sha256,
            "entries": ws_after.entries,
        }
        if not result["workspace"]["unchanged"]:
            raise ReplayWorkspaceChanged(
                f"the workspace digest changed while preparing ({ws_before.sha256[:12]} -> {ws_after.sha256[:12]}); "
                "prepare-only only reads it, so another process wrote it meanwhile: prepare again when it is idle"
            )
    result["status"] = "ok"
    return prefix


def write_outputs(out: str | os.PathLike, prefix: Prefix, result: dict[str, Any], t0: float) -> None:
    """Write the three files of an ok ``result`` into ``out``: under temporary names, renamed
    into place, result.json last (when it says ok, both prefix files are in place)."""
    timings = result["timings_ms"]
    t = time.perf_counter()
    tmps: list[tuple[str, str]] = []
    try:
        _write_temps(
            [
                (os.path.join(out, PREFIX_FILE), prefix.body),
                (os.path.join(out, REQUEST_FILE), dumps(prefix.request, indent=True) + b"\n"),
            ],
            tmps,
        )
        timings["write"] = _ms(t, time.perf_counter())
        timings["total"] = _ms(t0, time.perf_counter())
        _write_temps([(os.path.join(out, RESULT_FILE), dump_result(result))], tmps)
        _commit(tmps)
    except BaseException:
        _drop(tmps)  # interrupted (Ctrl-C): no temporary file left beside the outputs
        raise


def fail(result: dict[str, Any], exc: PvisorError, t0: float) -> None:
    """Make ``result`` the failed document of ``exc`` (its code and message, and what the
    source told before the failure) and attach it to the error as ``exc.result``."""
    result["status"] = "failed"
    result["prefix"] = None
    result["tool_calls"] = []
    failed_source = getattr(exc, "source", None)
    _fill_source(result, failed_source)
    if failed_source is not None:  # what the source said before the failure (the repairs of a damaged file)
        result["warnings"] = [{"code": c, "message": m} for c, m in failed_source.notes]
    result["errors"].append({"code": error_code(exc), "message": error_detail(exc)})
    result["timings_ms"]["total"] = _ms(t0, time.perf_counter())
    exc.result = result  # type: ignore[attr-defined]  # for `--result -`


def write_failed(out: str | os.PathLike, result: dict[str, Any]) -> None:
    """A failed prepare's output: result.json, and no prefix files of an earlier prepare."""
    for name in (PREFIX_FILE, REQUEST_FILE):
        try:
            os.unlink(os.path.join(out, name))
        except OSError:
            pass
    try:
        _write(os.path.join(out, RESULT_FILE), dump_result(result))
    except ReplayOutputError:
        pass  # the first error is the one to report


def _build(opts: PrepareOptions, reads: "SourceReads | None" = None) -> tuple[Prefix, Source]:
    from . import prefix as P

    if opts.run is not None:
        assert opts.journal is not None
        source, prefix, _meta = P.journal_prefix(
            opts.journal, opts.run, opts.agent, opts.after_step, opts.protocol
        )
        return prefix, source
    assert opts.trajectory is not None
    source, prefix = P.native_prefix(
        opts.trajectory,
        opts.agent,
        opts.after_step,
        opts.protocol,
        opts.profile_from,
        opts.session,
        opts.allow_damaged,
        reads.native if reads is not None else None,
    )
    return prefix, source


def _fill_source(result: dict[str, Any], source: Source | None) -> None:
    """What the source told: profile, agent version, run, session, number of steps (also in a
    failed document, when the source was read before the failure)."""
    if source is None:
        return
    result["profile"] = source.profile
    result["agent_version"] = source.agent_version
    result["source"]["run"] = source.run
    result["source"]["session"] = source.session
    result["boundary"]["steps_total"] = len(source.steps)


def _fill(
    result: dict[str, Any],
    opts: PrepareOptions,
    prefix: Prefix,
    source: Source,
    shown: tuple[Path | str, Path | str],
) -> None:
    _fill_source(result, source)
    result["prefix"] = prefix_record(
        prefix.protocol,
        prefix.body,
        prefix.request,
        shown,
        opts.after_step,
        prefix.rendered,
        prefix.exchange,
        prefix.origin,
        prefix.compaction,
    )
    wire = _wire_ids(opts.agent, prefix.protocol) if source.kind == "native" else None
    unsent = finish_at(descriptor(opts.agent), source.steps, opts.after_step) is not None
    result["tool_calls"] = tool_call_records(source.steps, opts.after_step, wire, unsent)
    result["warnings"] = [{"code": c, "message": m} for c, m in [*source.notes, *prefix.notes]]


def _wire_ids(agent: str, protocol: str) -> Callable[[Any], list[str | None]]:
    """The call ids of an action as the agent sends them in ``protocol`` (its descriptor's wire
    form of the action: the ids its native file stores may differ)."""
    d = descriptor(agent)

    def ids(action: Any) -> list[str | None]:
        wire = [p.id for p in d.wire_action(protocol, action).parts if isinstance(p, ToolCall)]
        return wire if len(wire) == len(action.tool_calls) else [c.id for c in action.tool_calls]

    return ids


def prefix_record(
    protocol: str,
    body: bytes,
    request: dict[str, Any],
    out: str | os.PathLike | tuple[str | os.PathLike, str | os.PathLike],
    after_step: int,
    rendered: bool,
    exchange: str | None,
    origin: dict[str, str],
    compaction: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result's ``prefix`` object for ``body`` written to ``out``/prefix.json (or to the
    two places ``out`` names: the prefix and request files, or a batch's row);
    ``compaction``: the compaction the prefix starts from (``prefix.compaction``), or None."""
    shown = (
        out if isinstance(out, tuple) else (os.path.join(out, PREFIX_FILE), os.path.join(out, REQUEST_FILE))
    )
    desc = describe_prefix(protocol, body, request["path"], request["query"], after_step)
    breakpoints = None
    if protocol == "anthropic":
        obj = orjson.loads(body)
        breakpoints = sum(
            1
            for part in (
                obj.get("system"),
                obj.get("tools"),
                *[m.get("content") for m in obj.get("messages") or [] if isinstance(m, dict)],
            )
            if isinstance(part, list)
            for b in part
            if isinstance(b, dict) and "cache_control" in b
        )
    return {
        "protocol": protocol,
        "path": shown[0] if isinstance(shown[0], str) else show_path(shown[0]),
        "request_path": shown[1] if isinstance(shown[1], str) else show_path(shown[1]),
        "sha256": sha256_hex(body),
        "bytes": len(body),
        "message_count": desc["message_count"],
        "ends_with": desc["ends_with"],
        "system_present": desc["system_present"],
        "tools_present": desc["tools_present"],
        "model": desc["model"],
        "stream": desc["stream"],
        "rendered": rendered,
        "exchange": exchange,
        "origin": origin,
        "cache_breakpoints": breakpoints,
        "compaction": compaction,
    }
