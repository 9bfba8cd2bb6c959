"""Pause views: what the agent saw at a pause, for an observer (docs/snapshots.md "Pause views"),
and the handoff of a pause to a new run.

A **pause** is a point between steps, numbered the documents' way (:mod:`.numbering`):
transition K is journal step K+1. Its kind (:class:`PauseKind`) says how it was chosen:

- ``step``: transition K (``step``); without ``before`` the view holds transitions 0..K (steps
  1..K+1) and the workspace after transition K; with ``before`` it holds 0..K-1 and the
  workspace taken before A(K+1) ran (``step=0, before=True``: the task alone). Or
  ``after_step`` N: N steps kept. Neither: the last transition;
- ``progress``: a fraction F in [0, 1] of the run, mapped to transition round(F x (T-1)), halves up, of T
  transitions (a point between transitions, not a measure of how much of the task is done);
- ``before_commitment``: the pause before the transition whose action commits the agent (a
  finish tool, a finish command, ``git commit``: the agent descriptor's :meth:`commitment`),
  so the view ends right before it (with ``before``: one transition earlier still). A run with
  no such action is refused with a hint.

An **observer view** (schema :data:`VIEW_SCHEMA`) keeps the task, the system prompt, the tool
names, every action's visible text, visible reasoning text and tool calls, and every
observation; it leaves out internal state: gateway internals (exchange ids, sequence numbers,
who served a reply, flags), reasoning signatures and encrypted reasoning (counted, never
shown), request headers (credentials), the raw provider objects and non-text parts' payloads
(their kind stays). A view is not an execution checkpoint: its ``workspace`` names the
snapshot a handoff restores (:func:`restore_handoff`), from a journal run recorded with a
workspace; a native file has none.
"""

from __future__ import annotations

import enum
import os
import stat as stat_
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvisor.adapters.agents import descriptor_names, get_descriptor
from pvisor.adapters.native import read_native
from pvisor.core.errors import BadInputError, UsageError, shown
from pvisor.core.progress import task as progress_task
from pvisor.journal.child_runs import drop_child_run, finish_child_run, reserve_child_run
from pvisor.journal.exported import is_export, loaded_export
from pvisor.journal.model import (
    Message,
    OtherPart,
    Reasoning,
    Run,
    RunMode,
    Step,
    TextPart,
    ToolCall,
    ToolResult,
    Trajectory,
    is_run_id,
)
from pvisor.journal.reader import JournalReader, holds_run

from .episodes import MAIN
from .numbering import Position, Wording, describe, progress_transition, resolve_step
from .numbering import steps as journal_steps
from .snapshots import journal_trajectory, restore_snapshot, run_snapshots
from .source import DAMAGE_CODES

VIEW_SCHEMA = "pvisor.view/v2"


class PauseKind(str, enum.Enum):
    """How a pause was chosen (view field ``pause.kind``)."""

    STEP = "step"
    PROGRESS = "progress"
    BEFORE_COMMITMENT = "before_commitment"


@dataclass(slots=True)
class PauseSpec:
    """One pause to materialize: ``id`` (the caller's name for it; None from the CLI), ``kind``,
    ``step`` (transition K, zero-based, for ``step``), ``after_step`` (N steps kept, instead of
    ``step``), ``progress`` (for ``progress``, in [0, 1]) and ``before`` (end before transition
    K, not after it). ``PauseSpec(id="initial", kind="step", step=0)``: the pause after the
    first transition (journal step 1)."""

    id: str | None
    kind: PauseKind
    step: int | None = None
    progress: float | None = None
    before: bool = False
    after_step: int | None = None

    def __post_init__(self) -> None:
        """Refuse (UsageError, naming the parameter as Python writes it) a value of the wrong
        type (a bool is no number here: ``step=True`` is no transition 1) and a parameter of
        another kind of pause, as ``pvisor view`` refuses two pause options."""
        w = Wording.PYTHON
        if self.id is not None and not isinstance(self.id, str):
            raise UsageError(f"{w.option('id', self.id)}: a pause's name is a str (or None)")
        at = _at(self)
        try:
            self.kind = PauseKind(self.kind)
        except ValueError:
            kinds = ", ".join(k.value for k in PauseKind)
            raise UsageError(f"{at}kind {self.kind!r} is not one of {kinds}") from None
        if self.kind is PauseKind.PROGRESS and self.progress is None and self.step is not None:
            self.step, self.progress = None, self.step  # PauseSpec(id, "progress", 0.5)
        for name, what in (("step", "a transition number"), ("after_step", "a count of steps kept")):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"{at}{w.option(name, value)}: {what}, an int (not {type(value).__name__})")
        if self.progress is not None and (
            isinstance(self.progress, bool) or not isinstance(self.progress, (int, float))
        ):
            raise UsageError(
                f"{at}{w.option('progress', self.progress)}: a fraction from 0 to 1, a float (not "
                f"{type(self.progress).__name__})"
            )
        if not isinstance(self.before, bool):
            raise UsageError(f"{at}before={self.before!r}: True or False")
        takes = {
            PauseKind.STEP: ("step", "after_step"),
            PauseKind.PROGRESS: ("progress",),
            PauseKind.BEFORE_COMMITMENT: (),
        }[self.kind]
        for name in ("step", "after_step", "progress"):
            value = getattr(self, name)
            if value is None or name in takes:
                continue
            owner = PauseKind.PROGRESS if name == "progress" else PauseKind.STEP
            given = " or ".join(f"{n}=" for n in takes) if takes else "neither: it finds its transition"
            raise UsageError(
                f"{at}{w.option(name, value)} is for a pause of kind {owner.value}; one of kind "
                f"{self.kind.value} takes {given}"
            )


@dataclass(slots=True)
class View:
    """A materialized pause: ``pause`` (its spec), ``transition`` (K as resolved; None for the
    task alone of a run without a step), ``through`` (the steps the view holds: K+1, or K with
    ``before``; the view's ``through_step``), ``position`` (:class:`~.numbering.Position`),
    ``document`` (the JSON view), and where it came from (``source``, ``journal``, ``run``;
    ``snapshot``: the record of the workspace snapshot after step ``through``, None when there
    is none)."""

    pause: PauseSpec
    transition: int | None
    through: int
    document: dict[str, Any]
    source: dict[str, Any]
    journal: Path | None = None
    run: str | None = None
    snapshot: Any = None
    position: Position | None = None

    def to_json(self) -> dict[str, Any]:
        return self.document

    def describe(self) -> str:
        """The pause in words with both numbers: ``transition 0 (step 1 of 3 journal steps)``."""
        assert self.position is not None
        return describe(self.position)


@dataclass(slots=True)
class HandoffBranch:
    """What :func:`restore_handoff` did, with the documents' lineage fields: the observation
    the agent saw last (``restored_observation``: the view's last step's observation, None for
    the task alone), ``parent_run`` (``parent_episode_id``), ``pause_step`` (the pause's
    transition, zero-based; None for the task alone of a run without a step), ``through_step``
    (the steps the child starts after: the journal's ``boundary_step``), ``snapshot_hash`` (the
    manifest digest restored), ``child_run`` (``child_episode_id``: the pending run created in the
    journal), ``workspace`` (where it was restored: a directory, or the environment given to
    the snapshot's driver), ``journal`` (the journal holding both runs)."""

    restored_observation: dict[str, Any] | None
    parent_run: str | None
    pause_step: int | None
    through_step: int
    snapshot_hash: str
    child_run: str
    workspace: Any
    journal: Path | None = None

    @property
    def parent_episode_id(self) -> str | None:
        """The documents' name of ``parent_run`` (a run's main episode has the run's id)."""
        return self.parent_run

    @property
    def child_episode_id(self) -> str:
        """The documents' name of ``child_run``."""
        return self.child_run

    def to_json(self) -> dict[str, Any]:
        return {
            "restored_observation": self.restored_observation,
            "parent_run": self.parent_run,
            "pause_step": self.pause_step,
            "through_step": self.through_step,
            "snapshot_hash": self.snapshot_hash,
            "child_run": self.child_run,
            "workspace": os.fspath(self.workspace)
            if isinstance(self.workspace, (str, os.PathLike))
            else repr(self.workspace),
            "journal": str(self.journal) if self.journal is not None else None,
        }


@dataclass
class TrajectoryReplay:
    """A recorded run loaded once, from which pauses are materialized. Make it with
    :meth:`from_journal`, :meth:`from_trajectory` or :meth:`from_event_log`. ``wording``: how
    errors name what was given (Python parameters by default; the CLI's options for ``pvisor
    view``)."""

    trajectory: Trajectory
    agent: str | None
    source: dict[str, Any]
    journal: Path | None = None
    run: str | None = None
    snapshots: Any = None  # replay.snapshots.RunSnapshots of a journal run
    warnings: list[str] = field(default_factory=list)
    wording: Wording = Wording.PYTHON
    #: the file a native episode's steps were read from when not the given one (a subagent's)
    read_from: str | None = None

    @classmethod
    def from_journal(cls, journal: Any, run: str, episode: str | None = None) -> TrajectoryReplay:
        """Run ``run`` (id or unique prefix) of the journal ``journal`` (its path, or an open
        ``Journal`` or ``JournalReader``); ``episode``: one of its episodes (:mod:`.episodes`:
        a subagent's id; its views hold no workspace, the snapshots being the main loop's).
        Raises UsageError for an unknown run, or an episode of a run that records no agent,
        ReplayBadInput ``unknown_episode``, IntegrityError for a damaged journal."""
        if callable(getattr(journal, "flush", None)):
            journal.flush()  # an open writer: what it queued is committed before it is read
        path = Path(getattr(journal, "path", journal))
        if not path.exists():
            raise UsageError(f"journal {path}: no such file")
        with JournalReader(path) as reader:
            rec = reader.run(run)
            if episode is not None and episode != MAIN:
                if rec.agent not in descriptor_names():
                    raise UsageError(
                        f"episode {episode}: run {rec.id} records no agent to find its subagents by"
                    )
                from .prefix import journal_episode

                _c, traj, chosen = journal_episode(reader, rec.id, rec.agent, episode)
                snaps = None
            else:
                traj = journal_trajectory(reader, rec.id)
                snaps = run_snapshots(reader, rec.id, traj)
                chosen = None
        source = {"kind": "journal", "path": str(path), "run": rec.id, "agent": rec.agent}
        if chosen is not None and chosen.id != MAIN:
            source["episode"] = chosen.summary()
        return cls(traj, rec.agent, source, journal=path, run=rec.id, snapshots=snaps)

    @classmethod
    def from_trajectory(
        cls,
        path: str | os.PathLike[str],
        agent: str | None = None,
        *,
        wording: Wording = Wording.PYTHON,
        episode: str | None = None,
    ) -> TrajectoryReplay:
        """The native trajectory file at ``path``, read with the adapter ``agent`` (None: the
        one detected); ``episode``: one of its episodes (:mod:`.episodes`: a subagent's id).
        Raises UsageError or BadInputError as ``pvisor trajectory show`` does (naming ``agent=``
        rather than ``--agent`` unless ``wording`` is the CLI's), ReplayBadInput
        ``unknown_episode``."""
        try:
            result, notes = read_native(Path(path), agent)
        except (UsageError, BadInputError) as exc:
            if wording is Wording.CLI:
                raise
            exc.args = (exc.message.replace("give --agent", "give agent=NAME"),)
            raise
        name = agent or result.agent or notes[0].split(": ", 1)[1]
        chosen = None
        skipped: list[Any] = []
        if episode is not None and episode != MAIN:
            from .episodes import choose, native_episodes, read_native_episode, skipped_files

            found = native_episodes(Path(path), name, result.trajectory)
            chosen = choose(found, episode, os.fspath(path))
            skipped = skipped_files(found)
            if chosen.id != MAIN:
                result, _notes = read_native_episode(Path(path), name, chosen)
        source = {
            "kind": "native",
            "path": str(path),
            "run": None,
            "agent": name,
            "profile": result.profile.name,
        }
        if chosen is not None and chosen.id != MAIN:
            source["episode"] = chosen.summary()
        return cls(
            result.trajectory,
            name,
            source,
            warnings=[*skipped, *result.diagnostics.warnings],
            wording=wording,
            read_from=chosen.path if chosen is not None and chosen.path != str(path) else None,
        )

    @classmethod
    def from_event_log(
        cls,
        path: str | os.PathLike[str],
        *,
        agent: str | None = None,
        journal: str | os.PathLike[str] | None = None,
    ) -> TrajectoryReplay:
        """The documents' loader: ``path`` is one of (detected in this order)

        - a run's directory as ``pvisor run`` leaves it beside its journal
          (``<data dir>/runs/<run>``): the run is read from that journal (the one of the data
          directory that holds it), whose snapshots its views use;
        - a journal file holding one run;
        - a journal export of one run (``pvisor journal export RUN --format jsonl``): read back
          (:mod:`pvisor.journal.exported`); it holds no workspace snapshot, so its views have
          none unless ``journal`` names the journal that holds the run's snapshots;
        - a native trajectory file (or an OpenCode store), read with the adapter ``agent``
          (None: detected).

        Raises UsageError (exit 2) for a path that does not exist, BadInputError (exit 65) with
        one line naming ``path`` for anything else it cannot read."""
        where = os.fspath(path)
        try:
            mode = os.stat(where).st_mode
        except OSError as exc:
            raise UsageError(f"from_event_log: {where}: {exc.strerror or exc}") from None
        if stat_.S_ISDIR(mode):
            found = _run_directory_journal(Path(where))
            if found is not None:
                return cls.from_journal(found[0], found[1])
        elif stat_.S_ISREG(mode):
            with open(where, "rb") as f:
                head = f.read(16)
            if head == b"SQLite format 3\x00":
                return cls.from_journal(where, _only_run(where))
            if is_export(where):
                with loaded_export(where) as (loaded, run):
                    replay = cls.from_journal(loaded, run)
                replay.source = {"kind": "export", "path": where, "run": run, "agent": replay.agent}
                replay.journal = replay.snapshots = None
                if journal is not None:
                    with JournalReader(journal) as reader:
                        if not reader.run_exists(run):  # the export's own run, never a prefix match
                            raise UsageError(
                                f"from_event_log: journal={os.fspath(journal)!r} holds no run {run} (the "
                                f"run of {where}): give the journal that recorded it"
                            )
                        replay.snapshots = run_snapshots(reader, run, replay.trajectory)
                    replay.journal = Path(journal)
                return replay
        try:
            return cls.from_trajectory(where, agent)
        except (UsageError, BadInputError) as exc:
            raise BadInputError(
                f"from_event_log: {where}: not a run's directory beside its journal (<data dir>/runs/<run>), "
                "a journal, a journal export of one run (pvisor journal export RUN --format jsonl) or a "
                f"native trajectory file: {exc.message}"
            ) from None

    def materialize_pauses(self, pauses: Iterable[PauseSpec]) -> list[View]:
        """One :class:`View` per pause, in order (:func:`materialize_pauses`)."""
        return materialize_pauses(self, pauses)

    @staticmethod
    def restore_handoff(
        view: View, environment: Any, child_episode_id: str, *, force: bool = False
    ) -> HandoffBranch:
        """The documents' name of :func:`restore_handoff`."""
        return restore_handoff(view, environment, child_episode_id, force=force)

    @property
    def steps_total(self) -> int:
        return len(self.trajectory.steps)

    @property
    def label(self) -> str:
        """How errors name the source: ``run r-...`` or the file."""
        where = f"run {self.run}" if self.run else f"trajectory {self.source.get('path')}"
        episode = self.source.get("episode")
        return f"{where} episode {episode['id']}" if episode else where

    def resolve(self, spec: PauseSpec) -> tuple[Position, dict[str, Any] | None]:
        """(the pause's :class:`~.numbering.Position`, the commitment found or None) for
        ``spec``. Raises UsageError (exit 2) naming the pause, both numbers and the caller's
        words for a step or fraction out of range or values of another kind, BadInputError
        (exit 65) for ``before_commitment`` in a run without a commitment."""
        total = self.steps_total
        w, at = self.wording, _at(spec)
        if spec.kind is PauseKind.STEP:
            pos = resolve_step(
                total,
                step=spec.step,
                before=spec.before,
                after_step=spec.after_step,
                wording=w,
                at=at,
                run=self.label,
            )
            return pos, None
        if spec.kind is PauseKind.PROGRESS:
            k = progress_transition(spec.progress, total, wording=w, at=at, run=self.label)
            return Position(k if spec.before else k + 1, k, spec.before, total), None
        found = self.first_commitment()
        if found is None and total == 0:
            alone = w.option("after_step", 0) if w is Wording.CLI else "kind step with after_step=0"
            raise BadInputError(
                f"{at}no commitment in {self.label}: it has no transition (0 journal steps); its one pause "
                f"is the task alone ({alone})"
            )
        if found is None:
            how = (
                "--step K or --progress F"
                if w is Wording.CLI
                else "kind step or progress: PauseKind.STEP, PauseKind.PROGRESS"
            )
            raise BadInputError(
                f"{at}no commitment in {self.label}'s {journal_steps(total)} "
                f"(no finish tool, finish command or git commit): pause at a step instead ({how})"
            )
        k = found["transition"]
        if spec.before:
            if k == 0:
                raise UsageError(
                    f"{at}the first commitment is transition 0's action (journal step 1): the pause "
                    f"before it is the task alone, and {w.option('before')} would need an earlier transition"
                )
            k -= 1
        return Position(k, k, True, total), found

    def first_commitment(self) -> dict[str, Any] | None:
        """The first action part that commits the agent (``step``, ``transition``, ``call_id``,
        ``name``: the tool, or ``text`` for a command in the action's text; ``why``), by the
        agent descriptor; None when there is none or the agent is unknown."""
        d = _descriptor(self.agent)
        if d is None:
            return None
        for step in self.trajectory.steps:
            found = d.action_commitment(step.action)
            if found is not None:
                call_id, name, why = found
                return {
                    "step": step.n,
                    "transition": step.n - 1,
                    "call_id": call_id,
                    "name": name,
                    "why": why,
                }
        return None

    def view(self, spec: PauseSpec) -> View:
        """Materialize ``spec`` (raises as :meth:`resolve`); the steps are rendered as a
        progress task (:mod:`pvisor.core.progress`)."""
        pos, commitment = self.resolve(spec)
        through = pos.kept
        t = self.trajectory
        hidden = {"signatures": 0, "encrypted_reasoning": 0}
        rendered = []
        with progress_task("rendering steps", through) as task:
            for s in t.steps[:through]:
                rendered.append(_step_json(s, hidden))
                task.advance()
        snapshot, workspace = self._workspace(through)
        doc: dict[str, Any] = {
            "schema": VIEW_SCHEMA,
            "pause": {
                "id": spec.id,
                "kind": spec.kind.value,
                "transition": pos.transition,
                "before": pos.before,
                "progress": spec.progress if spec.kind is PauseKind.PROGRESS else None,
                "commitment": commitment,
            },
            "source": self.source,
            "steps_total": self.steps_total,
            "through_step": through,
            "task": t.task,
            "system": t.system,
            "tools": [tool.name for tool in t.tools] if t.tools is not None else None,
            "steps": rendered,
            "compactions": [
                {"after_step": c.after_step, "kind": c.kind, "summary": c.summary}
                for c in t.compactions
                if c.after_step <= through
            ],
            "omitted": hidden,
            "workspace": workspace,
            # the places where the reader mended the native file (a gap bridged, a line lost):
            # what the view holds there may not be what the agent saw
            "repairs": [
                {"code": w.code, "where": w.where, "message": w.message}
                for w in self.warnings
                if getattr(w, "code", None) in DAMAGE_CODES
            ],
        }
        return View(spec, pos.transition, through, doc, self.source, self.journal, self.run, snapshot, pos)

    def _workspace(self, through: int) -> tuple[Any, dict[str, Any] | None]:
        if self.snapshots is None:
            return None, None
        try:
            snap = self.snapshots.pick(through)
        except (UsageError, BadInputError) as exc:
            return None, {
                "snapshot": None,
                "manifest": None,
                "after_step": through,
                "unavailable": exc.message,
            }
        return snap, {
            "snapshot": snap.id,
            "manifest": snap.digest,
            "after_step": snap.after_step,
            "kind": snap.kind.value,
            "files": snap.files,
            "bytes": snap.bytes,
        }


def materialize_pauses(replay: TrajectoryReplay, pauses: Iterable[PauseSpec]) -> list[View]:
    """One :class:`View` per pause, in order, from a source loaded once. Raises as
    :meth:`TrajectoryReplay.resolve` at the first pause that cannot be made (naming it)."""
    return [replay.view(p) for p in pauses]


def restore_handoff(
    view: View, environment: Any, child_episode_id: str, *, force: bool = False
) -> HandoffBranch:
    """Hand the pause of ``view`` off to a new run: restore its workspace snapshot into
    ``environment`` and create the child run ``child_episode_id`` in the view's journal.

    ``environment`` is a workspace directory (a path; empty unless ``force``) for the
    filesystem driver, or what the snapshot's own driver restores into (a driver registered
    under ``pvisor.snapshot_drivers``, by the name the snapshot records). The child run is
    created **pending** (mode ``handoff``, no attempt) with its lineage: ``parent_run``,
    ``boundary_step`` (the steps kept), ``pause_transition`` and ``workspace_snapshot`` (the
    manifest digest restored). The next agent's run is filed under it when started with that id
    (``pvisor run --child-run ID``, ``pvisor replay --child-run ID``,
    ``continue_run(..., child_run=ID)``), once.

    The child id is taken in the journal (one transaction) before anything is restored, and the
    run stays ``restoring`` until its workspace is: of calls made at once with one id exactly one
    goes on; restores into one directory take turns (the next finds it not empty). A restore that
    fails removes the child run it had taken.

    Raises BadInputError (exit 65) when the view has no snapshot to restore (a journal export,
    a native file, a run recorded without a workspace, a failed walk), naming what to give;
    UsageError (exit 2), naming the Python parameters, for a child id that is not a run id, is
    taken (a run of that id, or one of which it is a prefix or which is a prefix of it: a prefix
    lookup would name both), an environment that is not a directory path (None, empty, not str or
    ``os.PathLike``, a NUL, a name too long) or not empty without ``force=True``."""
    at = _at(view.pause)
    if view.snapshot is None or view.journal is None:
        raise BadInputError(f"{at}restore_handoff: {_no_workspace(view)}")
    child = _child_id(child_episode_id)
    into = _environment(environment, view.snapshot.driver)
    where = os.path.abspath(into) if isinstance(into, str) else repr(into)
    taken = reserve_child_run(
        view.journal,
        Run(
            id=child,
            mode=RunMode.HANDOFF.value,
            parent_run=view.run,
            boundary_step=view.through,
            pause_transition=view.transition,
            workspace_snapshot=view.snapshot.digest,
            labels={
                "workspace": where,
                "pause": view.describe(),
                "snapshot_driver": view.snapshot.driver,
                **({"pause_id": view.pause.id} if view.pause.id else {}),
            },
        ),
    )
    if taken is not None:
        how = (
            "already"
            if taken == child
            else f"({taken} {'starts with' if taken.startswith(child) else 'is the start of'} it: a prefix "
            "lookup would name both)"
        )
        raise UsageError(
            f"restore_handoff: child_episode_id={child!r}: journal {view.journal} has a run {taken} {how}; "
            "give a new id for the child run"
        )
    try:
        with JournalReader(view.journal) as reader:
            done = restore_snapshot(
                reader,
                view.snapshot,
                into,
                force=force,
                target_option="restore_handoff: environment=",
                force_option="force=True",
            )
    except BaseException:
        drop_child_run(view.journal, child)  # nothing of this call stays claimed as the child
        raise
    finish_child_run(view.journal, child)
    steps = view.document["steps"]
    return HandoffBranch(
        restored_observation=steps[-1]["observation"] if steps else None,
        parent_run=view.run,
        pause_step=view.transition,
        through_step=view.through,
        snapshot_hash=done.digest,
        child_run=child,
        workspace=done.into,
        journal=view.journal,
    )


#: the longest file name (one path component) the file systems pvisor runs on allow, in bytes
NAME_MAX = 255


def _child_id(child: Any) -> str:
    """``child_episode_id`` when it is a run id (UsageError naming it otherwise, a long one
    shortened)."""
    if not is_run_id(child):
        raise UsageError(
            f"restore_handoff: child_episode_id={shown(repr(child))}: a run id of letters, digits, '.', '_' "
            "and '-' (at most 128), starting with a letter or digit"
        )
    return child


def _environment(environment: Any, driver: str) -> Any:
    """``environment`` as the snapshot's driver restores into it: for the filesystem driver a
    directory path (str), checked here so that every mistake is one UsageError naming
    ``environment=``; another driver's environment as given (not None)."""
    named = f"restore_handoff: environment={shown(repr(environment))}"
    if environment is None:
        raise UsageError(f"{named}: give the directory to restore the workspace into")
    if driver != "filesystem":
        return environment
    path = environment
    if isinstance(environment, os.PathLike) and not isinstance(environment, (bytes, bytearray)):
        path = os.fspath(environment)
    if not isinstance(path, str):
        raise UsageError(
            f"{named}: a directory path as str or pathlib.Path, not {type(path).__name__} (the "
            "filesystem driver restores into a directory)"
        )
    if not path:
        raise UsageError(f"{named}: empty; give a directory path ('.' for the current directory)")
    if "\x00" in path:
        raise UsageError(f"{named}: a path cannot hold a NUL character")
    for part in path.split("/"):
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise UsageError(
                f"{named}: the name {shown(repr(part), 40)} has {size} bytes, more than a file name may "
                f"({NAME_MAX})"
            )
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # made by the restore (or refused by it: a file on the way is not a directory)
    except OSError as exc:
        raise UsageError(f"{named}: {exc.strerror or exc}") from None
    return path


def _no_workspace(view: View) -> str:
    """Why ``view`` has no workspace to restore, and what to give instead."""
    src = view.source
    kind = src.get("kind")
    if kind == "export" and view.journal is None:
        return (
            f"the view of export {src.get('path')} holds no workspace (an export has no snapshots): give the "
            f"journal that holds run {src.get('run')}'s snapshots: TrajectoryReplay.from_event_log("
            f"{src.get('path')!r}, journal=PATH) or TrajectoryReplay.from_journal(PATH, {src.get('run')!r})"
        )
    if kind == "native":
        return (
            f"the view of native trajectory {src.get('path')} holds no workspace (a native file has no "
            "snapshots): give the journal that holds the run's snapshots: "
            "TrajectoryReplay.from_journal(PATH, "
            "RUN) of the run pvisor recorded, or TrajectoryReplay.from_event_log('<data dir>/runs/RUN')"
        )
    why = (view.document.get("workspace") or {}).get("unavailable") or "no snapshot"
    if view.journal is not None:
        return f"no workspace to restore in journal {view.journal}: {why}"
    return f"no workspace to restore: {why}"


def _run_directory_journal(directory: Path) -> tuple[Path, str] | None:
    """(the journal, the run id) of a run's directory as ``pvisor run`` leaves it
    (``<data dir>/runs/<run>``, or a symlink to one): the data directory's journal that holds the
    run, the default name first; None when ``directory`` is not one. Only regular files that are
    journals are looked into, without leaving anything beside them
    (:func:`~pvisor.journal.reader.holds_run`). BadInputError when it looks like one and no
    journal beside it holds the run."""
    given = Path(os.path.abspath(directory))
    found = next(
        (d for d in (given, Path(os.path.realpath(directory))) if d.parent.name == "runs" and d.name),
        None,
    )
    if found is None:
        return None
    run, data = found.name, found.parent.parent
    try:
        names = sorted(data.iterdir(), key=lambda p: (p.name != "journal.sqlite", p.name))
    except OSError:
        return None
    for candidate in names:
        if holds_run(candidate, run):
            return candidate, run
    raise BadInputError(
        f"from_event_log: {directory}: a run's directory, but no journal in {data} holds run {run}: give "
        f"the journal: TrajectoryReplay.from_journal(PATH, {run!r})"
    )


def _only_run(journal: str) -> str:
    """The id of the one run of the journal file ``journal``; BadInputError when it holds
    several or none."""
    with JournalReader(journal) as reader:
        runs = [r.id for r in reader.runs()]
    if len(runs) != 1:
        raise BadInputError(
            f"from_event_log: {journal}: a journal of {len(runs)} runs; give the run: "
            f"TrajectoryReplay.from_journal({journal!r}, RUN)"
        )
    return runs[0]


# --------------------------------------------------------------------------- rendering


def _descriptor(agent: str | None) -> Any:
    return get_descriptor(agent) if agent in descriptor_names() else None


def _reasoning(r: Reasoning, hidden: dict[str, int]) -> str | None:
    hidden["signatures"] += 1 if r.signature else 0
    hidden["encrypted_reasoning"] += 1 if r.encrypted else 0
    return r.text or None


def _call(c: ToolCall) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "arguments": c.arguments if c.arguments is not None else c.arguments_raw,
    }


def _content(content: Any) -> Any:
    """A tool result's content without provider payloads: text stays, other blocks keep their type."""
    if isinstance(content, list):
        out = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                out.append({"type": "text", "text": block["text"]})
            elif isinstance(block, dict):
                out.append({"type": str(block.get("type", "block"))})
            else:
                out.append(block if isinstance(block, str) else {"type": "block"})
        return out
    return content


def _result(r: ToolResult, names: dict[str, str] | None = None) -> dict[str, Any]:
    # a protocol that does not repeat the tool's name with its result: the call's name
    name = r.name if r.name is not None else (names or {}).get(r.call_id or "")
    return {"call_id": r.call_id, "name": name, "is_error": r.is_error, "output": _content(r.content)}


def _message(m: Message, hidden: dict[str, int]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart):
            parts.append({"type": "text", "text": p.text})
        elif isinstance(p, Reasoning):
            text = _reasoning(p, hidden)
            if text:
                parts.append({"type": "reasoning", "text": text})
        elif isinstance(p, ToolCall):
            parts.append({"type": "tool_call", **_call(p)})
        elif isinstance(p, ToolResult):
            parts.append({"type": "tool_result", **_result(p)})
        elif isinstance(p, OtherPart):
            parts.append({"type": p.kind})
    return {"role": m.role, "parts": parts}


#: step flags that say the source may hold a step incompletely, shown in a view (``damage``):
#: the native file's cut-off last line may belong to it, its action's line was lost, or a line
#: before one of its lines was lost and the chain bridged there (Claude Code)
DAMAGE_FLAGS = ("truncated_line", "lost_action", "broken_chain")


def _step_json(step: Step, hidden: dict[str, int]) -> dict[str, Any]:
    a, o = step.action, step.observation
    reasoning = [t for t in (_reasoning(r, hidden) for r in a.reasoning) if t]
    names = {c.id: c.name for c in a.tool_calls if c.id}
    return {
        "step": step.n,
        "transition": step.n - 1,
        "action": {"text": a.text, "reasoning": reasoning, "tool_calls": [_call(c) for c in a.tool_calls]},
        "observation": {
            "results": [_result(r, names) for r in o.results],
            "messages": [_message(m, hidden) for m in o.messages],
        },
        "damage": [f for f in step.flags if f in DAMAGE_FLAGS],
    }


def _at(spec: PauseSpec) -> str:
    """The start of an error about ``spec``: its id when it has one (the Python API's)."""
    return f"pause {spec.id}: " if spec.id else ""
