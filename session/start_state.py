"""The recorded start state of a replay with the agent (replay-only and continuation; docs/replay.md
"The recorded start state"): the start snapshot restored into an empty ``--workspace`` by default,
the recorded start environment set for the agent (``--env-from``), and the result's
``start_state`` object, which names the start state as the likely cause when the replay's first
observation differs and the start state was not reproduced."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvisor.core.errors import PvisorError
from pvisor.journal.reader import JournalReader
from pvisor.replay.errors import ReplayUsageError, show_path
from pvisor.replay.playback import PathRewrites
from pvisor.replay.snapshots import run_snapshots
from pvisor.session.replay_options import ReplayOptions
from pvisor.session.start_env import (
    EnvFrom,
    EnvOutcome,
    StartWarning,
    WorkspaceOutcome,
    recorded_cwd,
    replay_variables,
)


@dataclass
class StartState:
    """``start_state`` of the result: ``workspace`` (:class:`WorkspaceOutcome`), ``snapshot_run``
    (the run whose start snapshot was restored, or None), ``environment``
    (:class:`EnvOutcome`), ``environment_why`` (why none was set; None when set), ``variables``
    (the names set, values left to the journal), ``cwd`` (``{recorded, replay}``: the recorded
    working directory, None when unknown, and the replay's), ``likely_cause`` (a sentence, or
    None), ``withheld`` (the files the restored start snapshot withheld as secret: ``{path,
    size, why}`` each, docs/snapshots.md "Secrets")."""

    workspace: WorkspaceOutcome
    snapshot_run: str | None = None
    environment: EnvOutcome = EnvOutcome.NOT_RECORDED
    environment_why: str | None = None
    variables: dict[str, str] = field(default_factory=dict)
    cwd: dict[str, str | None] = field(default_factory=dict)
    likely_cause: str | None = None
    withheld: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "workspace": self.workspace.value,
            "snapshot_run": self.snapshot_run,
            "environment": self.environment.value,
            "environment_why": self.environment_why,
            "variables": sorted(self.variables),
            "cwd": self.cwd,
            "likely_cause": self.likely_cause,
            "withheld": self.withheld,
        }

    def not_reproduced(self, journal: bool) -> list[str]:
        """What of the recorded start state the agent did not start with, one phrase each
        (``journal``: the source is a journal run; a native file keeps no environment)."""
        said = {
            WorkspaceOutcome.KEPT: "the non-empty --workspace was kept as given, not restored from the "
            "recorded start snapshot",
            WorkspaceOutcome.NO_RESTORE: "--no-restore: the recorded start snapshot was not restored",
            WorkspaceOutcome.NO_SNAPSHOT: "the source keeps no start snapshot to restore",
        }
        why = [said[self.workspace]] if self.workspace in said else []
        if self.environment is EnvOutcome.NOT_SET:
            why.append("--env-from none: the recorded environment variables were not set")
        elif self.environment is EnvOutcome.NOT_RECORDED:
            keeps = "the run" if journal else "a native file"
            why.append(f"{keeps} keeps no start environment")
        if self.withheld:
            why.append(f"secret files were withheld from the start snapshot ({_paths(self.withheld)})")
        return why


def env_from(opts: ReplayOptions) -> EnvFrom:
    """``opts.env_from`` as :class:`EnvFrom`; ReplayUsageError for another value (a Python
    caller's: the command line and replay.toml check their choices)."""
    try:
        return EnvFrom(getattr(opts.env_from, "value", opts.env_from))
    except ValueError:
        choices = ", ".join(m.value for m in EnvFrom)
        raise ReplayUsageError("usage", f"env_from={opts.env_from!r}: expected one of {choices}") from None


def _is_empty(ws: Path) -> bool:
    try:
        return not any(ws.iterdir())
    except OSError:
        return False


def start_snapshot(opts: ReplayOptions, rec: Any, ws: Path, result: Any) -> StartState:
    """What the agent starts in: ``--workspace-from``'s run, else the replayed journal run's start
    snapshot when it has one and ``ws`` is empty; a non-empty ``ws`` is kept as given with one
    warning in ``result`` (``workspace_not_restored``) unless ``--no-restore``."""
    if opts.workspace_from is not None:
        return StartState(WorkspaceOutcome.RESTORED, opts.workspace_from)
    if rec.kind != "journal" or not rec.run:
        return StartState(WorkspaceOutcome.NO_SNAPSHOT)
    if opts.no_restore:
        return StartState(WorkspaceOutcome.NO_RESTORE)
    try:
        with JournalReader(opts.journal) as reader:
            run_snapshots(reader, rec.run).pick(0)
    except PvisorError:  # none taken, or its walk failed (no_snapshot's cases)
        return StartState(WorkspaceOutcome.NO_SNAPSHOT)
    if not _is_empty(ws):
        line = (
            f"--workspace {show_path(ws)} is not empty: the agent starts in it as it is, not in run "
            f"{rec.run}'s recorded start state (its start snapshot); --no-restore says so and silences this"
        )
        result.warn(StartWarning.WORKSPACE_NOT_RESTORED, line)  # (the command prints the result's warnings)
        return StartState(WorkspaceOutcome.KEPT)
    return StartState(WorkspaceOutcome.RESTORED, rec.run)


def start_environment(opts: ReplayOptions, rec: Any, ws: Path, state: StartState, result: Any) -> None:
    """Fill ``state`` with the variables the agent is given from the recorded start environment
    (``--env-from recorded``: the journal run's, its recorded workspace named in a value rewritten
    to ``ws``), or why none: ``--env-from none``, a native file, a run that keeps none (a
    ``pvisor gateway`` capture: the warning ``no_recorded_environment`` in ``result``)."""
    doc = None
    if rec.kind == "journal" and rec.run:
        with JournalReader(opts.journal) as reader:
            doc = reader.run_environment(rec.run)
    state.cwd = {"recorded": recorded_cwd(doc, rec.workspace), "replay": str(ws)}
    if env_from(opts) is EnvFrom.NONE:
        state.environment, state.environment_why = EnvOutcome.NOT_SET, "--env-from none"
        return
    if rec.kind != "journal" or not rec.run:
        state.environment_why = "a native file keeps no start environment"
        return
    if doc is None:
        state.environment_why = (
            f"run {rec.run} has no recorded start environment: pvisor did not start its agent (a pvisor "
            "gateway capture) or recorded none (before schema 11)"
        )
        result.warn(
            StartWarning.NO_RECORDED_ENVIRONMENT, f"{state.environment_why}; the agent gets this environment"
        )
        return
    rewrites = PathRewrites([(rec.workspace, str(ws), "workspace")] if rec.workspace else [])
    state.variables = replay_variables(doc, rewrites.text)
    state.environment = EnvOutcome.SET


def likely_cause(state: StartState, result: Any, rec: Any) -> None:
    """When the replay's first compared observation (the first call of steps 1..N with a
    recorded O) differs and the start state was not reproduced: ``state.likely_cause`` says so,
    and so does that call's ``observation_differs`` warning."""
    # (ABSENT or None: nothing to compare it with)
    first = next((c for c in result.tool_calls if isinstance(c.equal_normalised, bool)), None)
    why = state.not_reproduced(rec.kind == "journal")
    if first is None or first.equal_normalised or not why:
        return
    state.likely_cause = (
        f"step {first.step} {first.name}: the first observation differs, and the recorded start state was "
        f"not reproduced ({'; '.join(why)})"
    )
    for w in result.warnings:
        if w.code == "observation_differs" and w.message.startswith(f"step {first.step} {first.name} "):
            w.message += f"; likely cause: the recorded start state was not reproduced ({'; '.join(why)})"
            break


def _paths(withheld: list[dict[str, Any]]) -> str:
    return ", ".join(str(w["path"]) for w in withheld)


def withheld_files(state: StartState, restored: dict[str, Any] | None, result: Any) -> None:
    """The files the restored start snapshot (``restored``: the restore's JSON, None when nothing
    was restored) withheld as secret: named in ``state.withheld`` and in one warning
    ``secret_files_withheld`` that tells the user to supply them."""
    state.withheld = list((restored or {}).get("withheld") or [])
    if state.withheld:
        result.warn(
            StartWarning.SECRET_FILES_WITHHELD,
            f"the start snapshot withheld {len(state.withheld)} secret file(s), not restored: "
            f"{_paths(state.withheld)}; put them into the workspace yourself if the agent needs them",
        )
