"""The result document and the output files of every replay mode (prepare-only, replay-only,
continuation, a batch's rows).

The output directory holds three files (docs/replay.md):

- ``prefix.json`` (:data:`PREFIX_FILE`): the request body for inference N+1, exact bytes;
- ``prefix.request.json`` (:data:`REQUEST_FILE`): ``{"method", "path", "query", "headers",
  "recorded_content_encoding"}``;
- ``result.json`` (:data:`RESULT_FILE`): the result document, schema ``sandbox-playback.result/v3``
  (:data:`RESULT_SCHEMA`; docs/result-protocol.md, JSON Schema docs/result-schema.json): a
  :class:`ResultDocument`, a typed record of records (:class:`SourceRecord`,
  :class:`BoundaryRecord`, :class:`PrefixRecord`, :class:`ToolCallRecord`,
  :class:`WorkspaceRecord`, :class:`Lineage`, :class:`Timings`, :class:`ResultMessage`; those
  only replay-only and continuation write, ``agent_run`` and ``playback``, in
  :mod:`pvisor.replay.agent_result`; ``mode`` is a :class:`~pvisor.journal.model.RunMode`,
  ``status`` a :class:`ResultStatus`),
  made by :meth:`ResultDocument.start` (``status: failed``, nothing done yet) and filled by each
  mode (:func:`prefix_record`, :func:`~.result_parts.tool_call_records`,
  :meth:`ResultDocument.fill_source`, :meth:`ResultDocument.fail`); :meth:`ResultDocument.to_json`
  gives the dict, field by field in the record's order (a field a mode does not write holds
  :data:`ABSENT` and is left out), written as :func:`dump_result` gives it. An error never
  carries the document: the modes return it beside the error (``PrepareOutcome.error``,
  ``ReplayOnlyOutcome.error``).

The output directory (its checks, its creation, files written under temporary names and renamed
into place) is :mod:`.output`'s; :func:`write_outputs` and :func:`write_failed` write the files
of an ok and a failed replay with it.

Digests: SHA-256 as 64 lower-case hex digits (:func:`sha256_hex`, :func:`content_sha256`,
:func:`file_sha256`, :func:`workspace_digest`). Times: milliseconds (:func:`elapsed_ms`).

Errors: :class:`~pvisor.replay.errors.ReplayBadInput` (exit 65) for an unreadable source or workspace,
:class:`~pvisor.replay.errors.ReplayOutputError` (exit 74) for a file that cannot be written.
"""

from __future__ import annotations

import enum
import os
import time
from typing import TYPE_CHECKING, Any, Sequence


from pvisor.adapters.jsonio import dumps
from pvisor.core import digest
from pvisor.core.digest import sha256_hex
from pvisor.core.errors import PvisorError
from pvisor.journal.model import RunMode
from pvisor.journal.redact import redact_text
from pvisor.core.record import Record

from .errors import ReplayBadInput, ReplayOutputError, error_code, error_detail, show_path
from .output import (
    PREFIX_FILE,
    REQUEST_FILE,
    RESULT_FILE,
    commit_temps,
    drop_temps,
    write_file,
    write_temps,
)

if TYPE_CHECKING:
    from pathlib import Path

    from .agent_result import AgentRunRecord, PlaybackSummary
    from .prefix import Prefix
    from .workspace import WorkspaceDigest

#: the result document's schema name
RESULT_SCHEMA = "sandbox-playback.result/v3"


# --------------------------------------------------------------------------- digests


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
        return digest.file_sha256(path)
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
            f"--workspace {show_path(root)}: cannot read {where}: {exc.strerror or exc}; the workspace "
            "digest cannot be computed",
        ) from None


# --------------------------------------------------------------------------- the document


#: ``mode``: which replay wrote the document, a :class:`~pvisor.journal.model.RunMode` (the
#: journal's modes of runs: ``PREPARE_ONLY``, ``REPLAY_ONLY``, ``CONTINUATION``; already loaded
#: on prepare-only's path, where a new enum class costs about 0.2 ms of start-up)
ResultMode = RunMode


class ResultStatus(str, enum.Enum):
    """``status``: how the replay ended (``errors`` says why when it is not ``ok``)."""

    OK = "ok"
    DIVERGED = "diverged"  #: the agent asked for something else than the recording (``divergence``)
    FAILED = "failed"


#: ``source.kind``: a journal run, or the agent's native file (an OpenCode store too). The
#: values of ``source.kind`` and ``prefix.ends_with`` are the schema's enums; they stay strings
#: here: each enum class is about 0.2 ms of prepare-only's start-up (docs/benchmarks.md)
SOURCE_KINDS = ("journal", "native")
#: ``prefix.ends_with``: ``task`` (N = 0), ``observation`` (O_N), ``action`` (A_N, the agent's
#: finish action), ``nothing``
PREFIX_ENDS = ("task", "observation", "action", "nothing")


class Absent:
    """The value of a field that a mode does not write (:data:`ABSENT`): ``to_json()`` leaves
    its key out, where None writes ``null``. Falsy."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


#: the one :class:`Absent`
ABSENT = Absent()


def json_value(value: Any) -> Any:
    """``value`` as the document holds it: a record's :meth:`~ResultPart.to_json`, an enum's
    value, a list of them item by item; anything else (a JSON value built elsewhere) as it is."""
    if isinstance(value, ResultPart):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value


#: the classes whose values :func:`json_value` gives back as they are, taken as they are
#: without the call (exact classes: an enum derived from str is none of them); a document holds
#: some 15 such values per tool call, and a batch's prefix of 200 steps as many tool calls
_AS_IS = frozenset({str, int, float, bool, type(None), dict})


class ResultPart:
    """The ``to_json()`` of the records of the document: one key per field, in the fields'
    order, its value by :func:`json_value`; a field holding :data:`ABSENT` is left out."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        # the slots are the fields, in order (this class and Record hold none): the Field
        # objects, which prepare-only never needs, stay unmade (core/record.py)
        return {
            name: value if value.__class__ in _AS_IS else json_value(value)
            for name in self.__slots__  # type: ignore[attr-defined]
            if (value := getattr(self, name)) is not ABSENT
        }


class ResultMessage(ResultPart, Record, record=True):
    """One of ``warnings`` or ``errors``.

    Fields:
        code: the stable code (``^[a-z][a-z0-9_]*$``; the error codes: docs/result-protocol.md).
        message: what happened, in one line; never repeats the code.
    """

    code: str
    message: str

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message


class SourceRecord(ResultPart, Record, record=True):
    """``source``: what steps 1..N were read from.

    Fields:
        kind: one of :data:`SOURCE_KINDS`.
        path: the native file, or the journal, as given (:func:`~.errors.show_path`).
        sha256: SHA-256 of the file's bytes (a directory's: the workspace digest of it); None
            for a journal and before the file was read.
        run: the journal run (its full id once read; the prefix given before), or the native
            file's run id when it has one, or None.
        session: the native file's session id, or None.
        episode: the subagent episode read (``--episode``, docs/steps.md): ``{"id", "steps",
            "parent"}``, ``parent`` the call that spawned it (``{"step", "call_id", "tool"}``:
            the main loop's step, the call's id and tool) or None; absent for the main loop.
            A native subagent read from a file of its own (a transcript, session or rollout
            beside ``path``) also has ``file`` (that file, as ``path`` shows the given one)
            and ``sha256`` (of its bytes): ``path`` and ``sha256`` above stay the given file's.
    """

    kind: str
    path: str
    sha256: str | None = None
    run: str | None = None
    session: str | None = None
    episode: Any = ABSENT

    def __init__(
        self,
        kind: str,
        path: str,
        sha256: str | None = None,
        run: str | None = None,
        session: str | None = None,
        episode: Any = ABSENT,
    ) -> None:
        self.kind = kind
        self.path = path
        self.sha256 = sha256
        self.run = run
        self.session = session
        self.episode = episode


class BoundaryRecord(ResultPart, Record, record=True):
    """``boundary``: where the replay stops.

    Fields:
        after_step: N (>= 0), the last step of the prefix.
        steps_total: the source's number of steps, None until it was read.
        next_action_excluded: always True: A_{N+1} is never in the prefix.
    """

    after_step: int
    steps_total: int | None = None
    next_action_excluded: bool = True

    def __init__(
        self, after_step: int, steps_total: int | None = None, next_action_excluded: bool = True
    ) -> None:
        self.after_step = after_step
        self.steps_total = steps_total
        self.next_action_excluded = next_action_excluded


class PrefixRecord(ResultPart, Record, record=True):
    """``prefix``: the request body for inference N+1 (built by :func:`prefix_record`).

    Fields:
        protocol: the wire protocol module's name.
        path, request_path: where prefix.json and prefix.request.json were written (a batch's
            rows: ``FILE#LINE/prefix`` and ``FILE#LINE/request``).
        sha256, bytes: SHA-256 and length of the body's bytes.
        message_count, ends_with (one of :data:`PREFIX_ENDS`), system_present, tools_present, model,
            stream: the body read back with its protocol (:func:`~.result_parts.describe_prefix`).
        rendered: False when the body is a recorded request byte for byte.
        exchange: the journal exchange whose body it is (or that was rendered on), or None.
        origin: part (``messages``, ``task_context``, ``system``, ``tools``, ``params``,
            ``request``) -> where it came from (``journal``, ``trajectory``, ``profile``,
            ``default``, ``absent``, ``rendered``, ``replay``).
        cache_breakpoints: Anthropic ``cache_control`` markers in the body; None for the others.
        compaction: the compaction the prefix starts from (``after_step``, ``kind``, ``where``,
            ``history_messages``, ``summary_sha256``), or None.
    """

    protocol: str
    path: str
    request_path: str
    sha256: str
    bytes: int
    message_count: int
    ends_with: str
    system_present: bool
    tools_present: bool
    model: str | None
    stream: bool
    rendered: bool
    exchange: str | None
    origin: dict[str, str]
    cache_breakpoints: int | None
    compaction: dict[str, Any] | None = None

    def __init__(
        self,
        protocol: str,
        path: str,
        request_path: str,
        sha256: str,
        bytes: int,
        message_count: int,
        ends_with: str,
        system_present: bool,
        tools_present: bool,
        model: str | None,
        stream: bool,
        rendered: bool,
        exchange: str | None,
        origin: dict[str, str],
        cache_breakpoints: int | None,
        compaction: dict[str, Any] | None = None,
    ) -> None:
        self.protocol = protocol
        self.path = path
        self.request_path = request_path
        self.sha256 = sha256
        self.bytes = bytes
        self.message_count = message_count
        self.ends_with = ends_with
        self.system_present = system_present
        self.tools_present = tools_present
        self.model = model
        self.stream = stream
        self.rendered = rendered
        self.exchange = exchange
        self.origin = origin
        self.cache_breakpoints = cache_breakpoints
        self.compaction = compaction


#: the most characters of a call's argument string ``tool_calls[].arguments`` shows: a command
#: is whole (where its absolute paths are), a file a call writes is cut (its digest stays whole)
ARGUMENTS_SHOWN = 2000


def arguments_record(raw: str) -> tuple[str, str, bool]:
    """``arguments_sha256``, ``arguments`` and ``arguments_truncated`` of a call's exact argument
    string ``raw``: the digest of its UTF-8 bytes; the string with key-shaped tokens redacted
    (:func:`~pvisor.journal.redact.redact_text`, as every text a result quotes) and a lone
    surrogate (no JSON text holds one) as U+FFFD, cut to its first :data:`ARGUMENTS_SHOWN`
    characters when longer; whether it was cut."""
    shown = redact_text(raw.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    return (
        sha256_hex(raw.encode("utf-8", "surrogatepass")),
        shown[:ARGUMENTS_SHOWN],
        len(shown) > ARGUMENTS_SHOWN,
    )


class ToolCallRecord(ResultPart, Record, record=True):
    """One of ``tool_calls``: a tool call of steps 1..N, in order.

    Fields:
        step: the step's number (from 1).
        call_id: the call id as the agent sends it (None when the protocol has none).
        name: the tool's name.
        kind: ``function``, ``custom`` or ``server``.
        arguments_sha256: SHA-256 of the exact argument string (UTF-8).
        arguments: that string as shown (:func:`arguments_record`): key-shaped tokens redacted,
            at most :data:`ARGUMENTS_SHOWN` characters.
        arguments_truncated: whether ``arguments`` was cut to :data:`ARGUMENTS_SHOWN`.
        historical_observation_sha256: digest of the recorded result's content
            (:func:`content_sha256`), None when no result answers the call or O_N was never sent.
        replayed_observation_sha256: the same of the replayed result; None in prepare-only.
        equal: whether both digests are equal; None unless both are there.
        equal_normalised: replay-only: equal once the agent's output decorations are normalised
            and the recorded and new paths made placeholders; :data:`ABSENT` in prepare-only.
        replayed_call_id: replay-only: the call id the replayed result answers; ABSENT in
            prepare-only.
        observation_not_sent: True for the calls of A_N when A_N is the agent's finish action.
    """

    step: int
    call_id: str | None
    name: str
    kind: str
    arguments_sha256: str
    arguments: str
    arguments_truncated: bool
    historical_observation_sha256: str | None = None
    replayed_observation_sha256: str | None = None
    equal: bool | None = None
    equal_normalised: bool | None | Absent = ABSENT
    replayed_call_id: str | None | Absent = ABSENT
    observation_not_sent: bool = False

    def __init__(
        self,
        step: int,
        call_id: str | None,
        name: str,
        kind: str,
        arguments_sha256: str,
        arguments: str,
        arguments_truncated: bool,
        historical_observation_sha256: str | None = None,
        replayed_observation_sha256: str | None = None,
        equal: bool | None = None,
        equal_normalised: bool | None | Absent = ABSENT,
        replayed_call_id: str | None | Absent = ABSENT,
        observation_not_sent: bool = False,
    ) -> None:
        self.step = step
        self.call_id = call_id
        self.name = name
        self.kind = kind
        self.arguments_sha256 = arguments_sha256
        self.arguments = arguments
        self.arguments_truncated = arguments_truncated
        self.historical_observation_sha256 = historical_observation_sha256
        self.replayed_observation_sha256 = replayed_observation_sha256
        self.equal = equal
        self.equal_normalised = equal_normalised
        self.replayed_call_id = replayed_call_id
        self.observation_not_sent = observation_not_sent

    def to_json(self) -> dict[str, Any]:
        """:meth:`ResultPart.to_json`, written out: a document holds one record per tool call of
        steps 1..N, each of plain values, and a batch makes thousands of documents (what the
        loop over the fields costs is most of a journal prefix's own time, docs/benchmarks.md);
        tests/test_batch_journal_runs.py compares it with the loop."""
        out = {
            "step": self.step,
            "call_id": self.call_id,
            "name": self.name,
            "kind": self.kind,
            "arguments_sha256": self.arguments_sha256,
            "arguments": self.arguments,
            "arguments_truncated": self.arguments_truncated,
            "historical_observation_sha256": self.historical_observation_sha256,
            "replayed_observation_sha256": self.replayed_observation_sha256,
            "equal": self.equal,
        }
        if self.equal_normalised is not ABSENT:
            out["equal_normalised"] = self.equal_normalised
        if self.replayed_call_id is not ABSENT:
            out["replayed_call_id"] = self.replayed_call_id
        out["observation_not_sent"] = self.observation_not_sent
        return out


class WorkspaceRecord(ResultPart, Record, record=True):
    """``workspace``: the workspace digested before and after (docs/result-protocol.md
    "Workspace digest").

    Fields:
        path: the workspace, resolved.
        sha256_before, sha256_after: its digests before reading the source (replay: before the
            agent started, after a restore) and after the prefix was built (the agent ended).
        unchanged: whether both digests are equal.
        entries: the entries hashed after.
        restored_from: replay-only and continuation: what ``--workspace-from`` restored (the
            snapshot's ``run``, ``snapshot``, ``kind``, ``after_step``, ``manifest``, ``into``,
            ``entries``, ``files``, ``bytes``), or None; :data:`ABSENT` in prepare-only.
    """

    path: str
    sha256_before: str
    sha256_after: str
    unchanged: bool
    entries: int
    restored_from: dict[str, Any] | None | Absent = ABSENT

    def __init__(
        self,
        path: str,
        sha256_before: str,
        sha256_after: str,
        unchanged: bool,
        entries: int,
        restored_from: dict[str, Any] | None | Absent = ABSENT,
    ) -> None:
        self.path = path
        self.sha256_before = sha256_before
        self.sha256_after = sha256_after
        self.unchanged = unchanged
        self.entries = entries
        self.restored_from = restored_from


class Lineage(ResultPart, Record, record=True):
    """``lineage`` of the derived run of a replay-only or continuation.

    Fields:
        parent_run: the replayed run (None for a native file without one).
        boundary_step: N.
        mode: the document's :class:`ResultMode`.
        source: the source's path, as given.
        workspace_snapshot: the manifest digest ``--workspace-from`` restored (a handoff's child
            run: the snapshot the handoff restored), else None.
    """

    parent_run: str | None
    boundary_step: int
    mode: ResultMode
    source: str
    workspace_snapshot: str | None = None

    def __init__(
        self,
        parent_run: str | None,
        boundary_step: int,
        mode: ResultMode,
        source: str,
        workspace_snapshot: str | None = None,
    ) -> None:
        self.parent_run = parent_run
        self.boundary_step = boundary_step
        self.mode = mode
        self.source = source
        self.workspace_snapshot = workspace_snapshot


class Timings(ResultPart, Record, record=True):
    """``timings_ms``: milliseconds (:func:`elapsed_ms`), each written once reached (a field
    not reached is :data:`ABSENT`), in the order the modes reach them.

    Fields:
        workspace_restore: ``--workspace-from``'s restore.
        workspace_before: the workspace digested before.
        source_digest: the source's bytes digested.
        prefix: reading the source and building the prefix.
        workspace_after: the workspace digested after (prepare-only).
        agent: the agent's run (replay-only, continuation).
        write: writing the prefix files.
        total: the whole operation.
    """

    workspace_restore: float | Absent = ABSENT
    workspace_before: float | Absent = ABSENT
    source_digest: float | Absent = ABSENT
    prefix: float | Absent = ABSENT
    workspace_after: float | Absent = ABSENT
    agent: float | Absent = ABSENT
    write: float | Absent = ABSENT
    total: float | Absent = ABSENT

    def __init__(
        self,
        workspace_restore: float | Absent = ABSENT,
        workspace_before: float | Absent = ABSENT,
        source_digest: float | Absent = ABSENT,
        prefix: float | Absent = ABSENT,
        workspace_after: float | Absent = ABSENT,
        agent: float | Absent = ABSENT,
        write: float | Absent = ABSENT,
        total: float | Absent = ABSENT,
    ) -> None:
        self.workspace_restore = workspace_restore
        self.workspace_before = workspace_before
        self.source_digest = source_digest
        self.prefix = prefix
        self.workspace_after = workspace_after
        self.agent = agent
        self.write = write
        self.total = total


class ResultDocument(ResultPart, Record, record=True):
    """The result document, ``result.json`` (schema ``sandbox-playback.result/v3``,
    docs/result-protocol.md; JSON Schema docs/result-schema.json): :meth:`start` makes one with
    nothing done yet (``status: failed``), each mode fills it, :meth:`to_json` gives the dict
    written (:func:`dump_result`). Named apart from :class:`pvisor.session.Result`, the Python
    API's outcome of a continuation, whose ``document`` is this record's ``to_json()``.

    Fields (in the document's order):
        schema: :data:`RESULT_SCHEMA`.
        pvisor: the build that wrote it (:func:`pvisor.core.artifact.result_record`).
        mode: :class:`ResultMode`.
        status: :class:`ResultStatus`.
        agent: the adapter (``--agent``).
        profile: the launch profile the source was recorded with, or None.
        agent_version: the recorded agent's version, or None.
        source: :class:`SourceRecord`.
        boundary: :class:`BoundaryRecord`.
        prefix: :class:`PrefixRecord`, None when there is none (every failure of prepare-only).
        tool_calls: :class:`ToolCallRecord` per tool call of steps 1..N.
        replayed_tool_calls: the calls re-run (0 in prepare-only).
        agent_started: whether the agent was started (False in prepare-only).
        live_requests: requests sent to a live model (a continuation's).
        boundary_user_prompt_injected: whether the boundary user prompt went out with N+1.
        workspace: :class:`WorkspaceRecord`, None without a workspace.
        derived_run: the run the replay made in the journal, or None.
        lineage: :class:`Lineage` of the derived run, or None.
        timings_ms: :class:`Timings`.
        warnings: :class:`ResultMessage` per warning.
        errors: :class:`ResultMessage` per error; empty when ``status`` is ``ok``.
        path_rewrites, auxiliary, context_differences, tool_differences, divergence,
            synthetic_end: replay-only and continuation: what playback did
            (:func:`pvisor.replay.playback.playback_record`); :data:`ABSENT` in prepare-only.
        agent_run: replay-only and continuation:
            :class:`~pvisor.replay.agent_result.AgentRunRecord`, None until the agent ended.
        playback: replay-only and continuation:
            :class:`~pvisor.replay.agent_result.PlaybackSummary`, None until the agent ended.
        continuation: a continuation's live part (docs/replay.md "What a continuation adds to
            result.json"), None until it ended; ABSENT in the other modes.
        sandbox: replay-only and continuation: what the agent's sandbox allowed (docs/replay.md
            "The sandbox": mode, network, writable, hidden, read_only_bound_back, failed_calls,
            tmp_writes), None until the agent ran; ABSENT in prepare-only.
        plan: replay-only and continuation: what the served calls name outside the new
            workspace, made before the agent starts (:meth:`pvisor.replay.plan.Plan.to_json`:
            ``{steps, items, ignored, ignored_reads}``), None until the source was read.
        unrecorded: replay-only and continuation: ``{step, call_id, tool}`` per call of steps
            1..N without a recorded result (re-run with ``--allow-unrecorded``, else refused).
        handoff: a handoff's report (docs/handoff.md "The handoff report"): what became of
            each source call, the workspace against the pause's snapshot, the lineage; None
            until the agent ran.
        observations: replay-only, continuation and handoff: ``{compared, equal_normalised,
            not_compared}``, counts of the calls of ``tool_calls`` whose O' is compared with O
            (:func:`pvisor.session.replay_result.observation_counts`); None until the agent ran.
        start_state: replay-only and continuation: the recorded start state the agent started
            from (:meth:`pvisor.session.start_state.StartState.to_json`), None until the source
            was read (and in a handoff); ABSENT in prepare-only.
    """

    schema: str
    pvisor: dict[str, Any]
    mode: ResultMode
    status: ResultStatus
    agent: str
    profile: str | None
    agent_version: str | None
    source: SourceRecord
    boundary: BoundaryRecord
    prefix: PrefixRecord | None
    tool_calls: list[ToolCallRecord]
    replayed_tool_calls: int
    agent_started: bool
    live_requests: int
    boundary_user_prompt_injected: bool
    workspace: WorkspaceRecord | None
    derived_run: str | None
    lineage: Lineage | None
    timings_ms: Timings
    warnings: list[ResultMessage]
    errors: list[ResultMessage]
    path_rewrites: list[dict[str, Any]] | Absent = ABSENT
    auxiliary: list[dict[str, Any]] | Absent = ABSENT
    context_differences: list[dict[str, Any]] | Absent = ABSENT
    tool_differences: list[dict[str, Any]] | Absent = ABSENT
    divergence: dict[str, Any] | None | Absent = ABSENT
    synthetic_end: list[dict[str, Any]] | Absent = ABSENT
    agent_run: AgentRunRecord | None | Absent = ABSENT
    playback: PlaybackSummary | None | Absent = ABSENT
    continuation: dict[str, Any] | None | Absent = ABSENT
    sandbox: dict[str, Any] | None | Absent = ABSENT
    plan: dict[str, Any] | None | Absent = ABSENT
    unrecorded: list[dict[str, Any]] | Absent = ABSENT
    handoff: dict[str, Any] | None | Absent = ABSENT
    observations: dict[str, int] | None | Absent = ABSENT
    start_state: dict[str, Any] | None | Absent = ABSENT

    def __init__(
        self,
        schema: str,
        pvisor: dict[str, Any],
        mode: ResultMode,
        status: ResultStatus,
        agent: str,
        profile: str | None,
        agent_version: str | None,
        source: SourceRecord,
        boundary: BoundaryRecord,
        prefix: PrefixRecord | None,
        tool_calls: list[ToolCallRecord],
        replayed_tool_calls: int,
        agent_started: bool,
        live_requests: int,
        boundary_user_prompt_injected: bool,
        workspace: WorkspaceRecord | None,
        derived_run: str | None,
        lineage: Lineage | None,
        timings_ms: Timings,
        warnings: list[ResultMessage],
        errors: list[ResultMessage],
        path_rewrites: list[dict[str, Any]] | Absent = ABSENT,
        auxiliary: list[dict[str, Any]] | Absent = ABSENT,
        context_differences: list[dict[str, Any]] | Absent = ABSENT,
        tool_differences: list[dict[str, Any]] | Absent = ABSENT,
        divergence: dict[str, Any] | None | Absent = ABSENT,
        synthetic_end: list[dict[str, Any]] | Absent = ABSENT,
        agent_run: AgentRunRecord | None | Absent = ABSENT,
        playback: PlaybackSummary | None | Absent = ABSENT,
        continuation: dict[str, Any] | None | Absent = ABSENT,
        sandbox: dict[str, Any] | None | Absent = ABSENT,
        plan: dict[str, Any] | None | Absent = ABSENT,
        unrecorded: list[dict[str, Any]] | Absent = ABSENT,
        handoff: dict[str, Any] | None | Absent = ABSENT,
        observations: dict[str, int] | None | Absent = ABSENT,
        start_state: dict[str, Any] | None | Absent = ABSENT,
    ) -> None:
        self.schema = schema
        self.pvisor = pvisor
        self.mode = mode
        self.status = status
        self.agent = agent
        self.profile = profile
        self.agent_version = agent_version
        self.source = source
        self.boundary = boundary
        self.prefix = prefix
        self.tool_calls = tool_calls
        self.replayed_tool_calls = replayed_tool_calls
        self.agent_started = agent_started
        self.live_requests = live_requests
        self.boundary_user_prompt_injected = boundary_user_prompt_injected
        self.workspace = workspace
        self.derived_run = derived_run
        self.lineage = lineage
        self.timings_ms = timings_ms
        self.warnings = warnings
        self.errors = errors
        self.path_rewrites = path_rewrites
        self.auxiliary = auxiliary
        self.context_differences = context_differences
        self.tool_differences = tool_differences
        self.divergence = divergence
        self.synthetic_end = synthetic_end
        self.agent_run = agent_run
        self.playback = playback
        self.continuation = continuation
        self.sandbox = sandbox
        self.plan = plan
        self.unrecorded = unrecorded
        self.handoff = handoff
        self.observations = observations
        self.start_state = start_state

    @classmethod
    def start(
        cls,
        mode: ResultMode,
        agent: str,
        trajectory: str | os.PathLike | None,
        journal: str | os.PathLike | None,
        run: str | None,
        after_step: int,
    ) -> ResultDocument:
        """A document of ``mode`` with nothing done yet (``status: failed``): the source a
        native file (``trajectory``) or ``journal``'s ``run``; a replay's playback fields empty,
        a continuation's ``continuation`` None."""
        from pvisor._version import DISTRIBUTION, __version__, source_commit
        from pvisor.core.artifact import result_record

        doc = cls(
            RESULT_SCHEMA,
            result_record(__version__, distribution=DISTRIBUTION, commit=source_commit()),
            mode,
            ResultStatus.FAILED,
            agent,
            None,
            None,
            SourceRecord(
                "native" if trajectory is not None else "journal",
                show_path(trajectory if trajectory is not None else journal),
                run=run,
            ),
            BoundaryRecord(after_step),
            None,
            [],
            0,
            False,
            0,
            False,
            None,
            None,
            None,
            Timings(),
            [],
            [],
        )
        if mode is not ResultMode.PREPARE_ONLY:
            doc.path_rewrites, doc.auxiliary, doc.synthetic_end = [], [], []
            doc.context_differences, doc.tool_differences = [], []
            doc.divergence = doc.agent_run = doc.playback = doc.sandbox = None
            if mode is ResultMode.CONTINUATION:
                doc.continuation = None
            doc.plan, doc.unrecorded, doc.observations, doc.start_state = None, [], None, None
            if mode is ResultMode.HANDOFF:
                doc.handoff = None
        return doc

    def fill_source(self, source: Any) -> None:
        """What the source told (a :class:`~.source.Source` or a replay's
        :class:`~.recording.Recording`: ``profile``, ``agent_version``, ``run``, ``session``,
        ``steps``); also in a failed document, when the source was read before the failure.
        None: nothing."""
        if source is None:
            return
        self.profile = source.profile
        self.agent_version = source.agent_version
        self.source.run = source.run
        self.source.session = source.session
        episode = getattr(source, "episode", None)
        if episode is not None and episode.id != "main":
            self.source.episode = episode.summary()
            own = getattr(episode, "path", None)
            if own is not None and getattr(episode, "sidechain", None) is None:
                # the steps came from the subagent's own file: name it and its digest
                self.source.episode["file"] = show_path(own)
                self.source.episode["sha256"] = file_sha256(own)
        self.boundary.steps_total = len(source.steps)

    def warn(self, code: str, message: str) -> None:
        """One more of ``warnings``."""
        self.warnings.append(ResultMessage(code, message))

    def add_error(self, exc: Exception) -> None:
        """One more of ``errors``: ``exc``'s code (:func:`~.errors.error_code`) and message
        (:func:`~.errors.error_detail`)."""
        self.errors.append(ResultMessage(error_code(exc), error_detail(exc)))

    def fail(self, exc: PvisorError, t0: float) -> None:
        """Make this the failed document of ``exc`` (prepare-only, a batch's request): its code
        and message, no prefix and no tool calls, what the source told before the failure (the
        error's ``source``, with the repairs of a damaged file as warnings), the total time
        since ``t0`` (``time.perf_counter()``)."""
        self.status = ResultStatus.FAILED
        self.prefix = None
        self.tool_calls = []
        failed_source = getattr(exc, "source", None)
        self.fill_source(failed_source)
        if (
            failed_source is not None
        ):  # what the source said before the failure (the repairs of a damaged file)
            self.warnings = [ResultMessage(c, m) for c, m in failed_source.notes]
        self.add_error(exc)
        self.timings_ms.total = elapsed_ms(t0, time.perf_counter())


def notes_messages(notes: Sequence[tuple[str, str]]) -> list[ResultMessage]:
    """``(code, message)`` pairs (a source's, a prefix's notes) as ``warnings``."""
    return [ResultMessage(c, m) for c, m in notes]


# --------------------------------------------------------------------------- its parts


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
    facts: dict[str, Any] | None = None,
    memo: Any = None,
) -> PrefixRecord:
    """The result's ``prefix`` record for ``body`` written to ``out``/prefix.json (or to the
    two places ``out`` names: the prefix and request files, or a batch's row);
    ``compaction``: the compaction the prefix starts from (``prefix.compaction``), or None;
    ``facts``: what is known of the body already (:func:`~.result_parts.prefix_facts`), or None
    to parse it (with ``memo``, :func:`~.result_parts.describe_prefix`'s)."""
    shown = (
        out if isinstance(out, tuple) else (os.path.join(out, PREFIX_FILE), os.path.join(out, REQUEST_FILE))
    )
    from .result_parts import describe_prefix  # here: result_parts imports this module

    desc = describe_prefix(protocol, body, request["path"], request["query"], after_step, facts, memo)
    from pvisor.adapters.protocols import get_protocol

    breakpoints = get_protocol(protocol).cache_breakpoints(body)
    return PrefixRecord(
        protocol,
        shown[0] if isinstance(shown[0], str) else show_path(shown[0]),
        shown[1] if isinstance(shown[1], str) else show_path(shown[1]),
        sha256_hex(body),
        len(body),
        desc["message_count"],
        desc["ends_with"],
        desc["system_present"],
        desc["tools_present"],
        desc["model"],
        desc["stream"],
        rendered,
        exchange,
        origin,
        breakpoints,
        compaction,
    )


def dump_result(result: dict[str, Any]) -> bytes:
    """result.json's bytes: indented JSON and a final newline (orjson, else the standard
    library: an --after-step past 64 bits still gives a failed document)."""
    return dumps(result, indent=True) + b"\n"


def write_outputs(
    out: str | os.PathLike, prefix: Prefix, result: ResultDocument, t0: float
) -> dict[str, Any]:
    """Write the three files of an ok ``result`` into ``out``: under temporary names, renamed
    into place, result.json last (when it says ok, both prefix files are in place). Returns
    the document written (``result.to_json()``)."""
    timings = result.timings_ms
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
        timings.write = elapsed_ms(t, time.perf_counter())
        timings.total = elapsed_ms(t0, time.perf_counter())
        document = result.to_json()
        write_temps([(os.path.join(out, RESULT_FILE), dump_result(document))], tmps)
        commit_temps(tmps)
    except BaseException:
        drop_temps(tmps)  # interrupted (Ctrl-C): no temporary file left beside the outputs
        raise
    return document


def write_failed(out: str | os.PathLike, result: ResultDocument) -> dict[str, Any]:
    """A failed prepare's output: result.json, and no prefix files of an earlier prepare.
    Returns the document (``result.to_json()``), also when it could not be written."""
    for name in (PREFIX_FILE, REQUEST_FILE):
        try:
            os.unlink(os.path.join(out, name))
        except OSError:
            pass
    document = result.to_json()
    try:
        write_file(os.path.join(out, RESULT_FILE), dump_result(document))
    except ReplayOutputError:
        pass  # the first error is the one to report
    return document


def elapsed_ms(t0: float, t1: float) -> float:
    """Milliseconds from ``t0`` to ``t1`` (``time.perf_counter()`` values), to the microsecond."""
    return round((t1 - t0) * 1000.0, 3)
