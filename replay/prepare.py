"""prepare-only: write the prefix that ends at O_N and the result document, executing nothing.

:func:`prepare_only` is what ``pvisor replay --prepare-only`` calls. It reads the source (a
journal run or a native trajectory file), builds the prefix (:mod:`pvisor.replay.prefix`),
digests the workspace before and after, and writes three files into the output directory
(:mod:`pvisor.replay.result` writes them and builds the result document):

- ``prefix.json``: the request body for inference N+1, exact bytes;
- ``prefix.request.json``: ``{"method", "path", "query", "headers", "recorded_content_encoding"}``;
- ``result.json``: the result document, schema ``sandbox-playback.result/v3``
  (docs/result-protocol.md, JSON Schema docs/result-schema.json).

Guarantees (docs/replay.md): no process is started, no socket opened, nothing in the
workspace written; the output directory is refused inside the workspace and, unless
``force``, when it is not empty. A failure after the output directory was accepted still
writes ``result.json`` (``status: "failed"``, ``errors``) and no prefix files: :func:`prepare`
returns it with the error beside it, :func:`prepare_only` raises the error.

Imports: the standard library, orjson and pvisor's own modules, lazily: a native source
never imports asyncio, aiohttp, sqlite_utils or jsonschema (tests/test_replay_side_effects.py).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pvisor.core.errors import PvisorError, UsageError
from pvisor.journal.model import ToolCall

from .errors import (
    ReplayUsageError,
    ReplayWorkspaceChanged,
    show_path,
)
from .prefix import Prefix
from .output import (
    OUTPUT_FILES,
    check_output,
    create_output,
    is_inside,
    resolve_path,
    same_file,
)
from .result import (
    PREFIX_FILE,
    REQUEST_FILE,
    RESULT_FILE,
    ResultDocument,
    ResultMode,
    ResultStatus,
    WorkspaceRecord,
    elapsed_ms,
    file_sha256,
    notes_messages,
    prefix_record,
    workspace_digest,
    write_failed,
    write_outputs,
)
from .result_parts import tool_call_records
from .source import Source, descriptor, finish_at
from .spec import collect, in_order, problems_error, raise_problems

if TYPE_CHECKING:
    from pathlib import Path

    from .batch import SourceReads


class PrepareOptions:
    """The arguments of one prepare-only.

    Fields: ``agent`` (adapter name); ``after_step`` N (int >= 0); ``output`` directory;
    exactly one of ``trajectory`` (native file or directory) and ``run`` (journal run id or
    unique prefix, read from ``journal``); ``workspace`` (directory digested before and after,
    or None); ``protocol`` (wire protocol for a native render, or None for the agent's
    default); ``profile_from`` (``JOURNAL[:RUN]``, native sources only); ``force`` (accept a
    non-empty output directory); ``session`` (one session of an OpenCode store); ``allow_damaged``
    (build the prefix of a damaged native file, each repair a warning; refused by default);
    ``option_notes`` (``(code, message)`` warnings the caller found in the options, first in
    result.json's ``warnings``: ``pvisor replay --config``'s replay.toml keys the mode ignores);
    ``episode`` (the source's episode whose steps are read: a subagent's id, docs/steps.md; None:
    the main loop)."""

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
        "option_notes",
        "episode",
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
        option_notes: Sequence[tuple[str, str]] = (),
        episode: str | None = None,
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
        self.option_notes = tuple(option_notes)
        self.episode = episode

    def __repr__(self) -> str:
        return "PrepareOptions(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)


class PrepareOutcome:
    """What :func:`prepare_only` did: the ``result`` document (dict: ``record.to_json()``), its
    ``record`` (:class:`~.result.ResultDocument`), the ``error`` that stopped it (a
    :class:`~pvisor.core.errors.PvisorError` with its code and exit code; None when it is
    ok) and the paths written (``output``, ``prefix_path``, ``result_path``:
    :class:`~pathlib.Path` objects, made when asked for; the command itself never imports
    pathlib, docs/benchmarks.md)."""

    __slots__ = ("result", "record", "error", "_paths")

    def __init__(
        self,
        result: dict[str, Any],
        output: str | os.PathLike,
        prefix_path: str | os.PathLike,
        result_path: str | os.PathLike,
        record: ResultDocument | None = None,
        error: PvisorError | None = None,
    ) -> None:
        self.result = result
        self.record = record
        self.error = error
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
        return (
            f"PrepareOutcome(output={self.output!r}, prefix_path={self.prefix_path!r}, "
            f"result_path={self.result_path!r})"
        )

    def summary(self) -> str:
        """One line for people: what was prepared, from what, where."""
        r = self.result
        p, b = r["prefix"], r["boundary"]
        src = r["source"]
        what = f"run {src['run']}" if src["kind"] == "journal" else src["path"]
        if src.get("episode"):  # a subagent's own steps
            what += f" episode {src['episode']['id']}"
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
        from .profile import parse_profile_spec

        inputs.append(("--profile-from", parse_profile_spec(opts.profile_from)[0]))
    for opt, path in inputs:
        resolved = resolve_path(path)
        for name in OUTPUT_FILES:
            target = os.path.join(out, name)
            if resolved == target or same_file(path, target):
                raise ReplayUsageError(
                    "output_refused",
                    f"{opt} {show_path(path)} is {show_path(target)}, a file prepare-only writes: choose "
                    "another --output",
                )


# --------------------------------------------------------------------------- the operation


def check_utf8_option(opt: str, value: Any) -> None:
    from pvisor.journal.paths import require_utf8

    require_utf8(opt, value if value is None or isinstance(value, (str, os.PathLike)) else str(value))


def _inside_path(child: str | os.PathLike, parent: str | os.PathLike) -> bool:
    return is_inside(resolve_path(child), resolve_path(parent))


def check_options(opts: PrepareOptions) -> None:
    """UsageError (exit 2) for options that make no sense, before anything is read or written:
    the first of :func:`option_problems` (a batch reports one error per line)."""
    problems, _ = option_problems(opts)
    if problems:
        raise problems[0]


def option_problems(opts: PrepareOptions) -> tuple[list[PvisorError], bool]:
    """Every problem of ``opts`` found before anything is read or written (UsageError, exit 2,
    one each, in the order they were always checked), and whether the source can be read (its
    options passed: :func:`prepare_only` then reads it to find the source's problems too)."""
    problems: list[PvisorError] = []
    source_ok = collect(problems, descriptor, opts.agent)  # ReplayUsageError unknown_agent
    if (opts.trajectory is None) == (opts.run is None):
        source_ok = False
        problems.append(
            UsageError(
                "give exactly one source: --trajectory PATH (a native file) or --run ID (a journal run)"
            )
        )
    for opt, value in (
        ("--output", opts.output),
        ("--trajectory", opts.trajectory),
        ("--run", opts.run),
        ("--journal", opts.journal),
        ("--workspace", opts.workspace),
        ("--profile-from", opts.profile_from),
        ("--session", opts.session),
        ("--episode", opts.episode),
    ):
        if not collect(problems, check_utf8_option, opt, value) and opt not in ("--output", "--workspace"):
            source_ok = False
    if opts.run is not None and opts.profile_from is not None:
        problems.append(
            UsageError(
                "--profile-from fills a native render; a journal run (--run) holds its own system prompt and "
                "tools"
            )
        )
    if opts.run is not None and opts.session is not None:
        problems.append(
            UsageError(
                "--session picks a session of an OpenCode store (--trajectory); a journal run (--run) is one "
                "run"
            )
        )
    if opts.run is not None and opts.journal is None:
        source_ok = False
        problems.append(UsageError("--run needs a journal: give the global --journal PATH"))
    if opts.after_step < 0:
        source_ok = False
        problems.append(
            ReplayUsageError(
                "usage", f"--after-step {opts.after_step}: N counts steps from 0 (the task alone)"
            )
        )
    workspace_ok = opts.workspace is not None
    if opts.workspace is not None:
        if not os.path.exists(opts.workspace):
            workspace_ok = False
            problems.append(UsageError(f"--workspace {show_path(opts.workspace)}: no such directory"))
        elif not os.path.isdir(opts.workspace):
            workspace_ok = False
            problems.append(UsageError(f"--workspace {show_path(opts.workspace)}: not a directory"))
    if opts.trajectory is not None:
        from pvisor.adapters.native import check_source_file

        if not collect(
            problems, check_source_file, opts.trajectory, f"--trajectory {show_path(opts.trajectory)}"
        ):
            source_ok = False
    journal_ok = True
    if opts.journal is not None:
        if not os.path.exists(opts.journal):
            journal_ok = False
            problems.append(UsageError(f"--journal {show_path(opts.journal)}: no such journal file"))
        elif os.path.isdir(opts.journal):
            journal_ok = False
            problems.append(
                UsageError(f"--journal {show_path(opts.journal)} is a directory, expected a journal file")
            )
    if opts.run is not None and not journal_ok:
        source_ok = False
    if workspace_ok and journal_ok:
        assert opts.workspace is not None
        # opening an SQLite journal read-only still creates its -wal/-shm files beside it
        # (WAL mode): a journal inside the workspace would be a write into it
        journals = [("--journal", opts.journal)] if opts.journal is not None else []
        if opts.profile_from is not None:
            from .profile import parse_profile_spec

            journals.append(("--profile-from", parse_profile_spec(opts.profile_from)[0]))
        for opt, path in journals:
            if path is not None and _inside_path(path, opts.workspace):
                source_ok = False  # reading it would write its -wal/-shm files into the workspace
                problems.append(
                    UsageError(
                        f"{opt} {show_path(path)} is inside --workspace {show_path(opts.workspace)}: "
                        "opening the journal creates its -wal/-shm files beside it and prepare-only "
                        "never writes the "
                        "workspace; copy the journal out of the workspace"
                    )
                )
    return problems, source_ok


def _base_result(opts: PrepareOptions) -> ResultDocument:
    result = ResultDocument.start(
        ResultMode.PREPARE_ONLY, opts.agent, opts.trajectory, opts.journal, opts.run, opts.after_step
    )
    result.warnings = notes_messages(opts.option_notes)
    return result


def _fail(result: ResultDocument, opts: PrepareOptions, exc: PvisorError, t0: float) -> None:
    """``result.fail(exc, t0)``, the options' own warnings kept first (a failure puts the
    source's notes in place of the warnings)."""
    result.fail(exc, t0)
    own = [(c, m) for c, m in opts.option_notes]
    rest = [w for w in result.warnings if (w.code, w.message) not in own]
    result.warnings = [*notes_messages(own), *rest]


def prepare_only(opts: PrepareOptions, problems: Sequence[PvisorError] = ()) -> PrepareOutcome:
    """Prepare the prefix of ``opts`` and write the three output files (module docstring).

    Returns a :class:`PrepareOutcome`. Raises UsageError (exit 2) for arguments that make no
    sense (before anything is written), ReplayBadInput (exit 65) for a source that cannot give
    the prefix, ReplayWorkspaceChanged (exit 1), IntegrityError (exit 3) for a damaged journal,
    ReplayOutputError (exit 74) when a file cannot be written; after the output directory was
    accepted, a failure first writes result.json with ``status: "failed"`` (no prefix files):
    :func:`prepare` returns that document with the error.

    Every problem found before the source is read (``problems``: those the caller found in
    the options already, :meth:`~pvisor.replay.spec.ReplaySpec.check`) is raised at once
    (:func:`~pvisor.replay.spec.raise_problems`), with the source's own problem when the source
    could be read: then, when the output directory was accepted, result.json lists them all in
    ``errors``.

    Order: the options and the output directory are checked (a source or journal that is one
    of the output files is refused), everything is read and computed in memory, and only then
    are the three files written, under temporary names renamed into place: an earlier
    prefix or result in the directory is replaced last, never removed before the source is read."""
    outcome = prepare(opts, problems)
    if outcome.error is not None:
        raise outcome.error
    return outcome


def prepare(opts: PrepareOptions, problems: Sequence[PvisorError] = ()) -> PrepareOutcome:
    """:func:`prepare_only`, returning the failed document with its ``error`` instead of
    raising once the output directory was accepted (what ``--result -`` prints): also the
    document that lists every problem found before the source was read with the source's own
    (the error then the one problem, or :class:`~pvisor.replay.spec.ReplayProblems`). Raises
    what is refused before: the options, the output directory."""
    t0 = time.perf_counter()
    problems = list(problems)
    found, source_ok = option_problems(opts)
    problems += found
    out: str | None = None
    try:
        out = check_output(opts.output, opts.workspace, opts.force)
        check_inputs_not_outputs(opts, out)
    except PvisorError as exc:
        problems.append(exc)
        out, source_ok = None, False  # a journal is read only when what it could write beside it is checked
    if problems:
        return _refuse(opts, problems, out, source_ok, t0)
    assert out is not None
    result = _base_result(opts)
    create_output(out, opts.output)
    paths = (out, os.path.join(out, PREFIX_FILE), os.path.join(out, RESULT_FILE))
    try:
        prefix = compute(opts, result, (paths[1], os.path.join(out, REQUEST_FILE)), t0)
        document = write_outputs(out, prefix, result, t0)
    except PvisorError as exc:
        _fail(result, opts, exc, t0)
        return PrepareOutcome(write_failed(out, result), *paths, result, exc)
    return PrepareOutcome(document, *paths, result)


def _refuse(
    opts: PrepareOptions, problems: list[PvisorError], out: str | None, source_ok: bool, t0: float
) -> PrepareOutcome:
    """``problems`` with the source's own problem, when the source can be read (``source_ok``)
    and holds one: raised (:func:`~pvisor.replay.spec.raise_problems`) unless the output
    directory ``out`` was accepted (else None) and the source had a problem; then a failed
    result.json in it lists them all in ``errors``, returned as the outcome with the error. A
    usage error alone writes nothing, as ever."""
    if not source_ok:
        raise_problems(problems)
    result = _base_result(opts)
    shown = ("", "") if out is None else (os.path.join(out, PREFIX_FILE), os.path.join(out, REQUEST_FILE))
    try:
        compute_source(opts, result, shown, t0)
    except PvisorError as exc:
        _fail(result, opts, exc, t0)
        problems.append(exc)
    else:
        raise_problems(problems)
    error = problems_error(problems)
    assert error is not None
    if out is None:
        raise error
    result.errors = []
    for problem in in_order(problems):
        result.add_error(problem)
    create_output(out, opts.output)
    paths = (out, os.path.join(out, PREFIX_FILE), os.path.join(out, RESULT_FILE))
    return PrepareOutcome(write_failed(out, result), *paths, result, error)


def compute_source(
    opts: PrepareOptions, result: ResultDocument, shown: tuple[Path | str, Path | str], t0: float
) -> Prefix:
    """The source read and the prefix built, in memory (no workspace digest): what
    :func:`compute` finds wrong with the source."""
    prefix, source = _build(opts)
    _fill(result, opts, prefix, source, shown)
    return prefix


def compute(
    opts: PrepareOptions,
    result: ResultDocument,
    shown: tuple[Path | str, Path | str],
    t0: float,
    reads: "SourceReads | None" = None,
) -> Prefix:
    """Everything of a prepare-only but the writing: the workspace digested before and after,
    the source digested and read, the prefix built, ``result`` filled (``status: ok``).
    ``shown``: what the result names as the prefix and request files; ``reads``: parsed sources
    and digests shared between the prepares of a batch (:mod:`.batch`), or None. Raises what
    :func:`prepare_only` raises (the result is not marked failed:
    :meth:`~.result.ResultDocument.fail` does that)."""
    timings = result.timings_ms
    ws_before = None
    if opts.workspace is not None:
        t = time.perf_counter()
        ws_before = workspace_digest(opts.workspace)
        timings.workspace_before = elapsed_ms(t, time.perf_counter())
    t = time.perf_counter()
    source_path = opts.trajectory if opts.trajectory is not None else opts.journal
    assert source_path is not None
    result.source.sha256 = reads.sha256(source_path) if reads is not None else file_sha256(source_path)
    timings.source_digest = elapsed_ms(t, time.perf_counter())
    t = time.perf_counter()
    prefix, source = _build(opts, reads)
    timings.prefix = elapsed_ms(t, time.perf_counter())
    _fill(result, opts, prefix, source, shown, reads)
    if opts.workspace is not None:
        t = time.perf_counter()
        ws_after = workspace_digest(opts.workspace)
        timings.workspace_after = elapsed_ms(t, time.perf_counter())
        assert ws_before is not None
        result.workspace = WorkspaceRecord(
            show_path(resolve_path(opts.workspace)),
            ws_before.sha256,
            ws_after.sha256,
            ws_before.sha256 == ws_after.sha256,
            ws_after.entries,
        )
        if not result.workspace.unchanged:
            raise ReplayWorkspaceChanged(
                f"the workspace digest changed while preparing ({ws_before.sha256[:12]} -> "
                f"{ws_after.sha256[:12]}); "
                "prepare-only only reads it, so another process wrote it meanwhile: prepare again when "
                "it is idle"
            )
    result.status = ResultStatus.OK
    return prefix


def _build(opts: PrepareOptions, reads: "SourceReads | None" = None) -> tuple[Prefix, Source]:
    from . import prefix as P

    if opts.run is not None:
        assert opts.journal is not None
        source, prefix, _meta = P.journal_prefix(
            opts.journal,
            opts.run,
            opts.agent,
            opts.after_step,
            opts.protocol,
            opts.episode,
            reads.runs if reads is not None else None,
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
        opts.episode,
    )
    return prefix, source


def _fill(
    result: ResultDocument,
    opts: PrepareOptions,
    prefix: Prefix,
    source: Source,
    shown: tuple[Path | str, Path | str],
    reads: "SourceReads | None" = None,
) -> None:
    """``result`` filled from the prefix and its source; ``reads``: a batch's, whose memos give
    each step's tool-call records once for all its prefixes (and the prefix's ``facts`` what a
    journal run's classification knew of its body: neither is computed again)."""
    result.fill_source(source)
    result.prefix = prefix_record(
        prefix.protocol,
        prefix.body,
        prefix.request,
        shown,
        opts.after_step,
        prefix.rendered,
        prefix.exchange,
        prefix.origin,
        prefix.compaction,
        prefix.facts,
        reads.parses(source.steps, prefix.protocol) if reads is not None and prefix.facts is None else None,
    )
    native = source.kind == "native"

    def wire() -> Callable[[Any], list[str | None]] | None:
        return _wire_ids(opts.agent, prefix.protocol) if native else None

    # a native file's call ids are the agent's wire form of them, which depends on the agent
    # and the protocol; a journal run's are those it sent
    key = (opts.agent, prefix.protocol) if native else None
    memo = reads.tool_calls(source.steps, key, wire) if reads is not None else None
    unsent = finish_at(descriptor(opts.agent), source.steps, opts.after_step) is not None
    result.tool_calls = tool_call_records(
        source.steps, opts.after_step, memo.wire if memo is not None else wire(), unsent, memo
    )
    result.warnings = notes_messages([*opts.option_notes, *source.notes, *prefix.notes])


def _wire_ids(agent: str, protocol: str) -> Callable[[Any], list[str | None]]:
    """The call ids of an action as the agent sends them in ``protocol`` (its descriptor's wire
    form of the action: the ids its native file stores may differ)."""
    d = descriptor(agent)

    def ids(action: Any) -> list[str | None]:
        wire = [p.id for p in d.wire_action(protocol, action).parts if isinstance(p, ToolCall)]
        return wire if len(wire) == len(action.tool_calls) else [c.id for c in action.tool_calls]

    return ids
