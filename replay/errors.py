"""Replay errors: the CLI's error classes (:mod:`pvisor.core.errors`) with a stable ``code``
that the result document's ``errors[].code`` carries (docs/result-protocol.md lists them)."""

from __future__ import annotations

from pvisor.core.errors import (
    BadInputError,
    IntegrityError,
    OutputError,
    PvisorError,
    UnavailableError,
    UsageError,
)

#: error code -> what it means (docs/result-protocol.md, "errors")
ERROR_CODES: dict[str, str] = {
    "usage": "the command line makes no sense (exit 2)",
    "unknown_agent": "--agent names no adapter or launch profile (exit 2)",
    "agent_mismatch": "the run was recorded with another agent than --agent (exit 2)",
    "protocol_not_spoken": "--protocol names a protocol the agent does not speak (exit 2)",
    "output_refused": (
        "--output is inside the workspace, not a directory, or not empty without --force (exit 2)"
    ),
    "bad_manifest_line": (
        "a line of --batch MANIFEST is not a JSON object of known keys with values of the right types (the "
        "other lines are prepared; the batch exits 1)"
    ),
    "handoff_refused": (
        "a handoff's translated call is one the next agent's declared tool schema refuses, or the next "
        "agent declared no shell tool (exit 65)"
    ),
    "workspace_diverged": (
        "--strict-workspace: the workspace after a handoff's re-enactment differs from the pause's snapshot "
        "(exit 1, status diverged)"
    ),
    "no_steps": "the source holds no main-loop step (exit 65)",
    "after_step_out_of_range": "--after-step is greater than the number of steps (exit 65)",
    "unknown_episode": "--episode names no episode of the source; the message lists the known ids (exit 65)",
    "observation_not_recorded": "N equals the steps and A_N made tool calls (not the agent's finish action) "
    "whose results the source does not hold (exit 65)",
    "no_reply": "N equals the steps and request N got no usable reply to render A_N from (exit 65)",
    "compaction_not_replayable": (
        "playback from a native file across a compaction (its summary request is not in the file; use the "
        "journal run) (exit 65)"
    ),
    "action_lost": "a step up to N is a gap: its action's line was lost from the native file (exit 65)",
    "damaged_source": "the native file lost or had repaired lines (not JSON, NUL bytes, a mended "
    "chain...), or its cut-off last line may belong to step N; --allow-damaged builds it anyway (exit 65)",
    "response_truncated": "a reply the boundary needs is journaled only in part (its exchange flagged "
    "truncated: past the gateway's --max-response-body or journal budget): playback of steps 1..N, or "
    "prepare-only's A_N at N = the last step (exit 65)",
    "compaction_not_rebuilt": (
        "the agent replaced its history at or before N and the native file does not hold what it sent "
        "instead (exit 65)"
    ),
    "profile_version_mismatch": "--profile-from is a capture of another major version of the agent (exit 65)",
    "profile_unusable": "--profile-from holds no main-loop request of the agent (exit 65)",
    "bad_source": "the source cannot be read (exit 65)",
    "workspace_unreadable": (
        "an entry of --workspace cannot be read, so its digest cannot be computed (exit 65)"
    ),
    "journal_damaged": (
        "the journal (--journal or --profile-from) is damaged: a blob missing, a digest that does not match, "
        "SQLite corruption (exit 3)"
    ),
    "journal_unavailable": (
        "the journal cannot be opened read-only or stays locked past the busy timeout (exit 69)"
    ),
    "workspace_changed": (
        "the workspace digest differs after preparing (prepare-only never writes it; exit 1)"
    ),
    "output_error": "an output file cannot be written (exit 74)",
    "attempt_not_replayable": (
        "a step up to N came from a later attempt (a native resume): playback replays attempt 1 only (exit "
        "65)"
    ),
    "no_task": "the source holds no task (or a first request whose prompt cannot be told for sure) and "
    "--task was not given (exit 65)",
    "task_unusable": "the recorded task cannot start the agent: a NUL character, or longer than one argument "
    "of its command line and the agent reads no task on stdin (exit 65)",
    "no_launch_profile": (
        "pvisor cannot start this agent (OpenHands, SWE-agent): replay-only needs a launch profile (exit 2)"
    ),
    "workspace_refused": (
        "--workspace is missing, or is (or holds, or lies in) the recorded run's own workspace, or is not "
        "empty with --workspace-from (exit 2)"
    ),
    "no_snapshot": (
        "--workspace-from names a run without a start snapshot (recorded without snapshots, or its walk "
        "failed) (exit 65)"
    ),
    "agent_unavailable": (
        "the agent's executable is missing, cannot run, or reports a version outside its profile (exit 69)"
    ),
    "sandbox_unavailable": (
        "--sandbox bwrap where bubblewrap is missing or cannot make its namespaces, or a sandbox that did "
        "not start the agent (exit 69)"
    ),
    "diverged": (
        "the agent's request did not carry what playback served (the task, an action, a tool it calls): see "
        "divergence (exit 1)"
    ),
    "agent_ended_early": "the agent exited before it sent request N+1 (exit 1)",
    "agent_timeout": "the agent did not reach request N+1 within --timeout (exit 124)",
    "interrupted": "a stop signal ended the replay (exit 128 + the signal: 130 for Ctrl-C)",
    "missing_api_key": (
        "a continuation to the agent's public API, and its key is not in the environment (exit 2)"
    ),
    "boundary_prompt_impossible": "--boundary-user-prompt after the last step, whose action made no tool "
    "call or is the agent's finish action: no request N+1 can carry it (exit 2)",
    "upstream_unreachable": (
        "a continuation's live upstream could not be reached (or closed before answering) at its last live "
        "request (exit 69)"
    ),
    "upstream_error": (
        "a continuation's live upstream answered its last live request with an error status (exit 1)"
    ),
    "reasoning_rejected": (
        "the live upstream refused the served replies' reasoning (signatures, encrypted content): see "
        "--reasoning strip (exit 1)"
    ),
}


class ReplayUsageError(UsageError):
    """A usage error (exit 2) with a result-protocol ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message}")
        self.code = code


class ReplayBadInput(BadInputError):
    """Bad input data (exit 65) with a result-protocol ``code``; the message starts with it."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        #: the message without the code (``errors[].message`` of the result)
        self.detail = message


class ReplayWorkspaceChanged(PvisorError):
    """The workspace digest changed while preparing (exit 1), code ``workspace_changed``."""

    exit_code = 1
    code = "workspace_changed"

    def __init__(self, message: str):
        super().__init__(f"workspace_changed: {message}")
        self.detail = message


class ReplayFailed(PvisorError):
    """A replay that ran but did not succeed (``diverged``, ``agent_ended_early``,
    ``agent_timeout``, ``interrupted``): ``code`` and the exit code of :data:`ERROR_CODES`."""

    def __init__(self, code: str, message: str, exit_code: int = 1):
        super().__init__(message, exit_code=exit_code)
        self.code = code
        self.detail = message


class ReplayOutputError(OutputError):
    """An output file cannot be written (exit 74), code ``output_error``."""

    code = "output_error"


def error_code(exc: Exception) -> str:
    """The result-protocol code of an error: its ``code``, else by class (``usage``,
    ``bad_source``, ``output_error``)."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    if isinstance(exc, UsageError):
        return "usage"
    if isinstance(exc, OutputError):
        return "output_error"
    if isinstance(exc, IntegrityError):
        return "journal_damaged"
    if isinstance(exc, UnavailableError):
        return "journal_unavailable"
    return "bad_source"


def error_detail(exc: Exception) -> str:
    """``errors[].message`` of the result: the error's message without a leading code."""
    detail = getattr(exc, "detail", None)
    if isinstance(detail, str):
        return detail
    return exc.message if isinstance(exc, PvisorError) else str(exc)


def show_path(path: object) -> str:
    """A path for a message: file-system bytes that are not UTF-8 as ``\\xNN`` escapes, so
    that the message can always be printed and written as JSON."""
    import os

    return os.fsencode(os.fspath(path)).decode("utf-8", "backslashreplace")  # type: ignore[arg-type]
