"""The result document and the output files of every replay mode (prepare-only, replay-only,
continuation, a batch's rows).

The output directory holds three files (docs/replay.md):

- ``prefix.json`` (:data:`PREFIX_FILE`): the request body for inference N+1, exact bytes;
- ``prefix.request.json`` (:data:`REQUEST_FILE`): ``{"method", "path", "query", "headers",
  "recorded_content_encoding"}``;
- ``result.json`` (:data:`RESULT_FILE`): the result document, schema ``sandbox-playback.result/v3``
  (:data:`RESULT_SCHEMA`; docs/result-protocol.md, JSON Schema docs/result-schema.json), a dict
  built by :func:`base_result` (``status: failed``, nothing done yet) and filled by each mode:
  :func:`prefix_record` (``prefix``), :func:`tool_call_records` (``tool_calls``),
  :func:`fill_source`, :func:`fail`; written as :func:`dump_result` gives it.

The output directory: :func:`check_output` refuses one inside the workspace, not a directory, or
not empty without ``force`` (unless a failed replay left it, :func:`failed_before`);
:func:`create_output` makes it (mode 0700), :func:`remove_made` takes away what an interrupted
prepare made. Files are written under temporary names and renamed into place
(:func:`write_temps`, :func:`commit_temps`, :func:`write_file`): an earlier file is replaced,
never written through.

Digests: SHA-256 as 64 lower-case hex digits (:func:`sha256_hex`, :func:`content_sha256`,
:func:`file_sha256`, :func:`workspace_digest`). Times: milliseconds (:func:`elapsed_ms`).

Errors: :class:`~pvisor.replay.errors.ReplayUsageError` ``output_refused``/``bad_path`` (exit 2),
:class:`~pvisor.replay.errors.ReplayBadInput` (exit 65) for an unreadable source or workspace,
:class:`~pvisor.replay.errors.ReplayOutputError` (exit 74) for a file that cannot be written.
"""

from __future__ import annotations

import errno
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import orjson

from pvisor.adapters.jsonio import dumps
from pvisor.journal.digest import file_sha256 as _file_digest, sha256_hex as _sha256_hex
from pvisor.journal.errors import PvisorError
from pvisor.journal.model import Step, ToolCall, ToolResult

from .errors import ReplayBadInput, ReplayOutputError, ReplayUsageError, error_code, error_detail, show_path
from .source import Source, is_made_up

if TYPE_CHECKING:
    from pathlib import Path

    from .prefix import Prefix
    from .workspace import WorkspaceDigest

#: the result document's schema name
RESULT_SCHEMA = "sandbox-playback.result/v3"
#: file names written into the output directory
PREFIX_FILE = "prefix.json"
REQUEST_FILE = "prefix.request.json"
RESULT_FILE = "result.json"
OUTPUT_FILES = (PREFIX_FILE, REQUEST_FILE, RESULT_FILE)


# --------------------------------------------------------------------------- digests


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


# --------------------------------------------------------------------------- the document


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
    from pvisor.adapters.protocols import get_protocol

    breakpoints = get_protocol(protocol).cache_breakpoints(body)
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


def fill_source(result: dict[str, Any], source: Source | None) -> None:
    """What the source told: profile, agent version, run, session, number of steps (also in a
    failed document, when the source was read before the failure)."""
    if source is None:
        return
    result["profile"] = source.profile
    result["agent_version"] = source.agent_version
    result["source"]["run"] = source.run
    result["source"]["session"] = source.session
    result["boundary"]["steps_total"] = len(source.steps)


def fail(result: dict[str, Any], exc: PvisorError, t0: float) -> None:
    """Make ``result`` the failed document of ``exc`` (its code and message, and what the
    source told before the failure) and attach it to the error as ``exc.result``."""
    result["status"] = "failed"
    result["prefix"] = None
    result["tool_calls"] = []
    failed_source = getattr(exc, "source", None)
    fill_source(result, failed_source)
    if failed_source is not None:  # what the source said before the failure (the repairs of a damaged file)
        result["warnings"] = [{"code": c, "message": m} for c, m in failed_source.notes]
    result["errors"].append({"code": error_code(exc), "message": error_detail(exc)})
    result["timings_ms"]["total"] = elapsed_ms(t0, time.perf_counter())
    exc.result = result  # type: ignore[attr-defined]  # for `--result -`


def dump_result(result: dict[str, Any]) -> bytes:
    """result.json's bytes: indented JSON and a final newline (orjson, else the standard
    library: an --after-step past 64 bits still gives a failed document)."""
    return dumps(result, indent=True) + b"\n"


def write_outputs(out: str | os.PathLike, prefix: Prefix, result: dict[str, Any], t0: float) -> None:
    """Write the three files of an ok ``result`` into ``out``: under temporary names, renamed
    into place, result.json last (when it says ok, both prefix files are in place)."""
    timings = result["timings_ms"]
    t = time.perf_counter()
    tmps: list[tuple[str, str]] = []
    try:
        write_temps(
            [
                (os.path.join(out, PREFIX_FILE), prefix.body),
                (os.path.join(out, REQUEST_FILE), dumps(prefix.request, indent=True) + b"\n"),
            ],
            tmps,
        )
        timings["write"] = elapsed_ms(t, time.perf_counter())
        timings["total"] = elapsed_ms(t0, time.perf_counter())
        write_temps([(os.path.join(out, RESULT_FILE), dump_result(result))], tmps)
        commit_temps(tmps)
    except BaseException:
        drop_temps(tmps)  # interrupted (Ctrl-C): no temporary file left beside the outputs
        raise


def write_failed(out: str | os.PathLike, result: dict[str, Any]) -> None:
    """A failed prepare's output: result.json, and no prefix files of an earlier prepare."""
    for name in (PREFIX_FILE, REQUEST_FILE):
        try:
            os.unlink(os.path.join(out, name))
        except OSError:
            pass
    try:
        write_file(os.path.join(out, RESULT_FILE), dump_result(result))
    except ReplayOutputError:
        pass  # the first error is the one to report


# --------------------------------------------------------------------------- the output directory


def elapsed_ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000.0, 3)


def is_inside(child: str, parent: str) -> bool:
    """Whether the resolved path ``child`` is ``parent`` or under it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def resolve_path(path: str | os.PathLike) -> str:
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
    out = resolve_path(output)
    if workspace is not None and is_inside(out, resolve_path(workspace)):
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


# --------------------------------------------------------------------------- writing files


def write_file(path: str, data: bytes) -> None:
    commit_temps(write_temps([(path, data)]))


def drop_temps(tmps: list[tuple[str, str]]) -> None:
    for tmp, _ in tmps:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_temps(
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
            drop_temps(tmps)
            raise ReplayOutputError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None
    return tmps


def commit_temps(tmps: list[tuple[str, str]]) -> None:
    """Rename every temporary file into place (os.replace: an earlier file, or a symbolic link
    in its place, is replaced, never written through); on an error the temporary files left
    are removed and ReplayOutputError is raised."""
    for i, (tmp, path) in enumerate(tmps):
        try:
            os.replace(tmp, path)
        except OSError as exc:
            drop_temps(tmps[i:])
            raise ReplayOutputError(f"cannot write {show_path(path)}: {exc.strerror or exc}") from None
