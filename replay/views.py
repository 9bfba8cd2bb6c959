"""Pause views: what the agent saw at a pause, for an observer (docs/snapshots.md "Pause views"),
and the handoff of a pause to a new run.

A **pause** is a point between steps, numbered the documents' way (:mod:`.numbering`):
transition K is journal step K+1. Its kind (:class:`PauseKind`) says how it was chosen:

- ``step``: transition K (``step``); without ``before`` the view holds transitions 0..K (steps
  1..K+1) and the workspace after transition K; with ``before`` it holds 0..K-1 and the
  workspace taken before A(K+1) ran (``step=0, before=True``: the task alone). Or
  ``after_step`` N: N steps kept. Neither: the last transition;
- ``progress``: a fraction F in [0, 1] of the run, mapped to transition round(F x (T-1)) of T
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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvisor.journal.errors import BadInputError, UsageError
from pvisor.journal.progress import task as progress_task
from pvisor.journal.model import (
    Message,
    OtherPart,
    Reasoning,
    Step,
    TextPart,
    ToolCall,
    ToolResult,
    Trajectory,
)

from .numbering import Position, Wording, describe, progress_transition, resolve_step

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
        try:
            self.kind = PauseKind(self.kind)
        except ValueError:
            kinds = ", ".join(k.value for k in PauseKind)
            raise UsageError(f"{_at(self)}kind {self.kind!r} is not one of {kinds}") from None
        if self.kind is PauseKind.PROGRESS and self.progress is None and self.step is not None:
            self.step, self.progress = None, self.step  # PauseSpec(id, "progress", 0.5)


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

    @classmethod
    def from_journal(cls, journal: Any, run: str) -> TrajectoryReplay:
        """Run ``run`` (id or unique prefix) of the journal ``journal`` (its path, or an open
        ``Journal`` or ``JournalReader``). Raises UsageError for an unknown run,
        IntegrityError for a damaged journal."""
        from pvisor.journal.reader import JournalReader

        from .snapshots import journal_trajectory, run_snapshots

        if callable(getattr(journal, "flush", None)):
            journal.flush()  # an open writer: what it queued is committed before it is read
        path = Path(getattr(journal, "path", journal))
        if not path.exists():
            raise UsageError(f"journal {path}: no such file")
        with JournalReader(path) as reader:
            rec = reader.run(run)
            traj = journal_trajectory(reader, rec.id)
            snaps = run_snapshots(reader, rec.id, traj)
        source = {"kind": "journal", "path": str(path), "run": rec.id, "agent": rec.agent}
        return cls(traj, rec.agent, source, journal=path, run=rec.id, snapshots=snaps)

    @classmethod
    def from_trajectory(cls, path: str | os.PathLike[str], agent: str | None = None) -> TrajectoryReplay:
        """The native trajectory file at ``path``, read with the adapter ``agent`` (None: the
        one detected). Raises UsageError or BadInputError as ``pvisor trajectory show`` does."""
        from pvisor.adapters.native import read_native

        result, notes = read_native(Path(path), agent)
        name = agent or notes[0].split(": ", 1)[1]
        source = {
            "kind": "native",
            "path": str(path),
            "run": None,
            "agent": name,
            "profile": result.profile.name,
        }
        return cls(result.trajectory, name, source, warnings=list(result.diagnostics.warnings))

    def materialize_pauses(self, pauses: Iterable[PauseSpec]) -> list[View]:
        """One :class:`View` per pause, in order (:func:`materialize_pauses`)."""
        return materialize_pauses(self, pauses)

    @property
    def steps_total(self) -> int:
        return len(self.trajectory.steps)

    @property
    def label(self) -> str:
        """How errors name the source: ``run r-...`` or the file."""
        return f"run {self.run}" if self.run else f"trajectory {self.source.get('path')}"

    def resolve(self, spec: PauseSpec) -> tuple[Position, dict[str, Any] | None]:
        """(the pause's :class:`~.numbering.Position`, the commitment found or None) for
        ``spec``. Raises UsageError (exit 2) naming the pause, both numbers and the caller's
        words for a step or fraction out of range or values of another kind, BadInputError
        (exit 65) for ``before_commitment`` in a run without a commitment."""
        total = self.steps_total
        w, at = self.wording, _at(spec)
        if spec.kind is not PauseKind.STEP and spec.after_step is not None:
            raise UsageError(
                f"{at}{w.option('after_step', spec.after_step)} is for a pause at a step (kind step)"
            )
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
        if found is None:
            how = (
                "--step K or --progress F"
                if w is Wording.CLI
                else "kind step or progress: PauseKind.STEP, PauseKind.PROGRESS"
            )
            raise BadInputError(
                f"{at}no commitment in {self.label}'s {total} journal step{'s' if total != 1 else ''} "
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
        progress task (:mod:`pvisor.journal.progress`)."""
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
    view: View, workspace: str | os.PathLike[str], child_run_id: str, *, force: bool = False
) -> HandoffBranch:
    """Restore the workspace snapshot of ``view`` into ``workspace`` (empty unless ``force``)
    for the child run ``child_run_id`` that continues after the pause. Raises BadInputError
    (exit 65) when the view has no snapshot (a native file, a run recorded without a
    workspace, a failed walk), UsageError for a target that is not empty."""
    from pvisor.journal.reader import JournalReader

    from .snapshots import restore_snapshot

    if view.snapshot is None or view.journal is None:
        why = (view.document.get("workspace") or {}).get("unavailable") or (
            "a native trajectory holds no workspace snapshot" if view.journal is None else "no snapshot"
        )
        raise BadInputError(f"{_at(view.pause)}no workspace to restore: {why}")
    if not child_run_id or not child_run_id.strip():
        raise UsageError("restore_handoff: give the child run's id")
    with JournalReader(view.journal) as reader:
        done = restore_snapshot(reader, view.snapshot, Path(workspace), force=force)
    steps = view.document["steps"]
    return HandoffBranch(
        restored_observation=steps[-1]["observation"] if steps else None,
        parent_run=view.run,
        pause_step=view.transition,
        through_step=view.through,
        snapshot_hash=done.digest,
        child_run=child_run_id,
        workspace=done.into,
        journal=view.journal,
    )


# --------------------------------------------------------------------------- rendering


def _descriptor(agent: str | None) -> Any:
    from pvisor.adapters.agents import descriptor_names, get_descriptor

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
    }


def _at(spec: PauseSpec) -> str:
    """The start of an error about ``spec``: its id when it has one (the Python API's)."""
    return f"pause {spec.id}: " if spec.id else ""
