"""A handoff's parts of a replay with the agent (docs/handoff.md): its responder, the start
state, the lineage, and the handoff report filled into the result once B ran.

- :func:`handoff_responder`: the playback that serves B the source's actions translated into the
  tools B declares (:mod:`pvisor.replay.handoff_playback`).
- :func:`start_snapshot_of`: the journal run whose ``start`` snapshot is restored into B's empty
  workspace (the source's own), or None with one warning when there is none to restore.
- :func:`handoff_lineage`: the child run's lineage (labels ``handoff_from_agent`` and
  ``handoff_to_agent``, the pause's transition, the pause's snapshot digest).
- :func:`check_source_reasoning`: ``--source-reasoning keep`` refused before anything runs
  when B's protocol or model is known already and cannot be served A's reasoning unchanged
  (``result.handoff`` then :func:`refused_report`).
- :func:`fill_handoff`: ``result.handoff``: per source call what became of it and O against O″,
  the steps left out, the reasoning kept, rendered and dropped, the images kept and dropped
  (checked in B's request M+1), the workspace against the pause's snapshot, B's boundary
  request checked by B's strict validator, the lineage.
- :func:`handoff_refusal`: B's translation refused at its request 1 (``handoff_refused``, exit
  65), the error before B's own end.
- :func:`handoff_failure`: the error of a handoff whose translation was refused
  (``handoff_refused``, exit 65) or whose workspace differs under ``strict_workspace``
  (``workspace_diverged``).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import orjson
from pvisor.adapters.agents import get_profile
from pvisor.adapters.protocols.validate import validate_request
from pvisor.core.errors import PvisorError
from pvisor.journal.model import HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL
from pvisor.journal.reader import JournalReader
from pvisor.journal.redact import redact_text
from pvisor.journal.snapshots import Manifest
from pvisor.replay.continuation import LivePolicy
from pvisor.replay.errors import ReplayBadInput, ReplayFailed
from pvisor.replay.handoff_playback import HandoffContinuation, HandoffReplay
from pvisor.replay.playback import PathRewrites
from pvisor.replay.snapshots import restore_snapshot, run_snapshots
from pvisor.replay.source_images import images_in, verify_kept
from pvisor.replay.source_reasoning import ReasoningAccount, SourceReasoning, keep_problem
from pvisor.replay.source import descriptor
from pvisor.replay.translate import UNSAID, CallFate
from pvisor.session.replay_options import ReplayOptions

#: labels of a handoff's child run: the agents it went from and to (named in the journal's model)
FROM_LABEL, TO_LABEL = HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL
#: at most this many differing paths are listed in the report (the count is always whole)
MAX_LISTED = 200


class SourceSnapshots:
    """The source's workspace snapshots, read once for the whole handoff: binding a run's
    snapshots to its steps reads its whole trajectory (:func:`~pvisor.replay.snapshots.
    run_snapshots`), and the start state, the pause's lineage, ``--reset-to-pause``, the step
    changes and the comparison each need them. ``journal``; ``rec``: the source's recording (a
    native file, or a run recorded without a workspace, has none: :meth:`at` says why)."""

    def __init__(self, journal: Path, rec: Any, after_step: int) -> None:
        self.journal, self.rec, self.after_step = journal, rec, after_step
        self._snaps: Any = None
        self._manifests: dict[str, Manifest] = {}
        self._paths: dict[int, set[str]] = {}

    def at(self, n: int) -> Any:
        """The snapshot after ``n`` source steps. PvisorError saying why there is none."""
        if self.rec.kind != "journal" or not self.rec.run:
            raise PvisorError("the source is a native file, which keeps no workspace snapshot")
        if self._snaps is None:
            with JournalReader(self.journal) as reader:
                self._snaps = run_snapshots(reader, self.rec.run)
        return self._snaps.pick(n)

    def manifest(self, snap: Any) -> Manifest:
        found = self._manifests.get(snap.id)
        if found is None:
            with JournalReader(self.journal) as reader:
                found = self._manifests[snap.id] = reader.manifest(snap)
        return found

    def existed(self, step: int, path: str) -> bool | None:
        """Whether ``path`` (relative to the workspace) was in the source's workspace before
        source step ``step`` (its snapshot after ``step`` - 1); None when there is none."""
        try:
            entries = self._paths.get(step - 1)
            if entries is None:
                entries = self._paths[step - 1] = {e.path for e in self.manifest(self.at(step - 1)).entries}
        except PvisorError:
            return None
        return posixpath.normpath(path) in entries

    def pause(self) -> tuple[Any, str | None]:
        """((the snapshot at the pause, its manifest), None), or (None, why there is none)."""
        try:
            snap = self.at(self.after_step)
            return (snap, self.manifest(snap)), None
        except PvisorError as exc:
            return None, exc.message


def handoff_responder(
    opts: ReplayOptions,
    rec: Any,
    d: Any,
    rewrites: PathRewrites,
    workspace: str,
    policy: LivePolicy | None,
    snaps: SourceSnapshots,
) -> Any:
    """B's playback: replay-only (``policy`` None) or continued with the live model."""
    protocol = get_profile(opts.agent).protocol
    source_d = descriptor(rec.agent)
    changes = snapshot_changes(opts, rec, source_d, snaps)
    mode = SourceReasoning(opts.source_reasoning)
    existed = snaps.existed if rec.kind == "journal" and rec.run else None
    if policy is None:
        return HandoffReplay(
            rec, source_d, opts.after_step, d, protocol, rewrites, workspace, changes, mode, existed
        )
    return HandoffContinuation(
        rec, source_d, opts.after_step, d, protocol, rewrites, workspace, policy, changes, mode, existed
    )


def check_source_reasoning(opts: ReplayOptions, rec: Any, snaps: SourceSnapshots, result: Any) -> None:
    """ReplayBadInput ``handoff_refused`` (exit 65) before anything runs when ``--source-reasoning
    keep`` cannot be honoured and that is known already: the next agent speaks one protocol only,
    another than the source's, or is asked for a model (``model``) of another family. (An
    agent that picks its protocol by its model is checked at its request 1: the same refusal.)
    ``result.handoff`` then says why (:func:`refused_report`), as after a refusal at request 1."""
    why = _keep_refused_early(opts, rec)
    if why is not None:
        result.handoff = refused_report(opts, rec, snaps, why)
        raise ReplayBadInput("handoff_refused", f"handoff to {opts.agent}: {why}")


def _keep_refused_early(opts: ReplayOptions, rec: Any) -> str | None:
    """Why :func:`check_source_reasoning` refuses (None: it does not, or not yet)."""
    if SourceReasoning(opts.source_reasoning) is not SourceReasoning.KEEP or rec.agent == opts.agent:
        return None
    d = descriptor(opts.agent)
    protocols = d.protocols
    if len(protocols) != 1 and not (opts.model and d.litellm):
        return None
    protocol = protocols[0] if len(protocols) == 1 else d.default_protocol(opts.model)
    steps = rec.steps[: opts.after_step]
    return keep_problem(steps, rec.protocol, rec.model, protocol, opts.model or rec.model)


def snapshot_changes(
    opts: ReplayOptions, rec: Any, source_d: Any, snaps: SourceSnapshots
) -> Mapping[int, list[tuple[str, bytes | None]]]:
    """Per source step whose calls may change the workspace in ways their arguments do not say
    (:data:`~pvisor.replay.translate.UNSAID`: a subagent, an MCP tool), the files it changed
    from the source run's snapshots before and after it (path, new bytes or None when removed),
    read when the translation asks for a step (only for a call it does not re-run: the bytes of
    every written file are not held); empty for a native source or a run without snapshots."""
    wanted = [
        s.n
        for s in rec.steps[: opts.after_step]
        if any(c.kind == "server" or source_d.effect_of(c.name).effect in UNSAID for c in s.action.tool_calls)
    ]
    if not wanted or rec.kind != "journal" or not rec.run:
        return {}
    return StepChanges(snaps, wanted)


class StepChanges(Mapping):
    """The files each of the ``steps`` of the source changed, from its snapshots around the step
    (``snaps``), read on first access (a step without snapshots around it is missing)."""

    def __init__(self, snaps: SourceSnapshots, steps: list[int]) -> None:
        self.snaps, self.steps = snaps, steps
        self._read: dict[int, list[tuple[str, bytes | None]] | None] = {}

    def __iter__(self) -> Any:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, n: int) -> list[tuple[str, bytes | None]]:
        if n not in self.steps:
            raise KeyError(n)
        if n not in self._read:
            self._read[n] = self._changes(n)
        found = self._read[n]
        if found is None:
            raise KeyError(n)
        return found

    def _changes(self, n: int) -> list[tuple[str, bytes | None]] | None:
        try:
            before = self.snaps.manifest(self.snaps.at(n - 1))
            after = self.snaps.manifest(self.snaps.at(n))
            with JournalReader(self.snaps.journal) as reader:
                files = {e.path: e for e in after.entries}
                changed: list[tuple[str, bytes | None]] = []
                for d in _differences(before, after):
                    e = files.get(d["path"])
                    if d["change"] == "removed":
                        changed.append((d["path"], None))
                    elif e is not None and e.kind.value == "file" and e.sha256:
                        changed.append((d["path"], reader.blob(e.sha256)))
                return changed
        except PvisorError:
            return None  # no snapshot around this step: its calls stay text only


def _is_empty(ws: Path) -> bool:
    try:
        return not any(ws.iterdir())
    except OSError:
        return False


def start_snapshot_of(
    opts: ReplayOptions, rec: Any, ws: Path, warn: Callable[[str], None], snaps: SourceSnapshots
) -> str | None:
    """The journal run whose start snapshot is restored into ``ws`` before B starts: the source
    run's, when it has one and ``ws`` is empty; else None (a native file, a run recorded without
    a workspace, a workspace that holds something: B starts in it as given, with one warning)."""
    if not opts.restore_start:
        return None
    if rec.kind != "journal" or not rec.run:
        warn(
            f"handoff: the source {rec.path} keeps no workspace snapshot; {opts.agent} starts in "
            f"{ws} as it is (give it the source's start state)"
        )
        return None
    if not _is_empty(ws):
        warn(
            f"handoff: --workspace {ws} is not empty: {opts.agent} starts in it as it is, not in run "
            f"{rec.run}'s start snapshot (--no-restore says so and silences this)"
        )
        return None
    try:
        snaps.at(0)
    except PvisorError as exc:
        warn(f"handoff: {exc.message}; {opts.agent} starts in the empty {ws}")
        return None
    return rec.run


def check_reset(opts: ReplayOptions, snaps: SourceSnapshots) -> None:
    """ReplayBadInput ``no_snapshot`` (exit 65) before anything runs when ``reset_to_pause`` is
    asked and the source has no snapshot at the pause to reset to."""
    if not opts.reset_to_pause:
        return
    found, why = snaps.pause()
    if found is None:
        raise ReplayBadInput("no_snapshot", f"--reset-to-pause: {why}: there is no pause state to restore")


class PauseReset:
    """``--reset-to-pause``: at B's boundary request, the workspace ``ws`` made the source's
    snapshot at the pause: every entry the snapshot does not hold removed (never followed
    through a symlink), then the snapshot restored over it. :meth:`record` says what it did."""

    def __init__(self, opts: ReplayOptions, snaps: SourceSnapshots, ws: Path) -> None:
        self.opts, self.snaps, self.ws = opts, snaps, ws
        self.done = False
        self.removed: list[str] = []
        self.error: str | None = None

    def __call__(self) -> None:
        try:
            found, why = self.snaps.pause()
            if found is None:
                raise PvisorError(why or "no snapshot at the pause")
            snap, manifest = found
            keep = {e.path: e.kind.value for e in manifest.entries}
            # by descriptor, never by path: what B's calls left running still runs, and a
            # directory it swaps for a symlink to a place outside must not be walked or
            # removed through (os.fwalk opens each level O_NOFOLLOW and checks it is the
            # directory it listed); deepest first, so a directory is empty when it goes
            for top, dirs, files, top_fd in os.fwalk(self.ws, topdown=False, follow_symlinks=False):
                for name in files + dirs:
                    rel = os.path.relpath(os.path.join(top, name), self.ws)
                    is_dir = stat.S_ISDIR(os.stat(name, dir_fd=top_fd, follow_symlinks=False).st_mode)
                    want = keep.get(rel)
                    if want is None or (want == "dir") != is_dir:
                        if is_dir:
                            os.rmdir(name, dir_fd=top_fd)
                        else:
                            os.unlink(name, dir_fd=top_fd)
                        self.removed.append(rel)
            with JournalReader(self.opts.journal) as reader:
                restore_snapshot(reader, snap, self.ws, force=True, target_option="--workspace")
            self.done = True
        except (PvisorError, OSError) as exc:
            self.error = getattr(exc, "message", None) or str(exc)

    def record(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "removed": sorted(redact_text(p) for p in self.removed),
            "error": redact_text(self.error) if self.error is not None else None,
        }


def handoff_lineage(opts: ReplayOptions, rec: Any, snaps: SourceSnapshots) -> dict[str, Any]:
    """The child run's lineage: ``labels`` (from and to agent), ``pause_transition`` (the
    transition the pause follows: N - 1; None at N = 0) and ``workspace_snapshot`` (the digest
    of the source's snapshot at the pause, None without one)."""
    found, _ = snaps.pause()
    return {
        "labels": {FROM_LABEL: rec.agent, TO_LABEL: opts.agent},
        "pause_transition": opts.after_step - 1 if opts.after_step > 0 else None,
        "workspace_snapshot": found[0].digest if found else None,
    }


def _differences(pause: Manifest, now: Manifest) -> list[dict[str, str]]:
    """Paths whose entry differs between two manifests: ``added`` (only in B's), ``removed``
    (only in the pause's), ``changed`` (kind, mode, content or target)."""
    a = {e.path: e for e in pause.entries}
    b = {e.path: e for e in now.entries}
    out: list[dict[str, str]] = []
    for path in sorted(set(a) | set(b)):
        x, y = a.get(path), b.get(path)
        if x is None:
            out.append({"path": path, "change": "added"})
        elif y is None:
            out.append({"path": path, "change": "removed"})
        elif (x.kind, x.sha256, x.target, x.mode) != (y.kind, y.sha256, y.target, y.mode):
            out.append({"path": path, "change": "changed"})
    return out


def uncompared(opts: ReplayOptions, pause_snapshot: str | None, why: str | None) -> dict[str, Any]:
    """``result.handoff.workspace`` before (or without) a comparison: the pause's snapshot
    digest (None: none) and ``why`` it is not compared (None once it is)."""
    return {
        "compared": False,
        "pause_snapshot": pause_snapshot,
        "reenacted_snapshot": None,
        "equal": None,
        "differences": [],
        "differences_total": 0,
        "why_not_compared": why,
        "strict": opts.strict_workspace,
        "reset_to_pause": None,
    }


def _workspace(opts: ReplayOptions, snaps: SourceSnapshots, p: Any, report: Any) -> dict[str, Any]:
    """The workspace after re-enactment (B's snapshot when request M+1 came) against the
    source's snapshot at the pause."""
    found, why = snaps.pause()
    record = uncompared(opts, found[0].digest if found else None, why)
    if found is None:
        return record
    try:
        with JournalReader(opts.journal) as reader:
            snap = run_snapshots(reader, report.run).pick(p.n)
            mine = reader.manifest(snap)
    except PvisorError as exc:
        record["why_not_compared"] = f"the re-enacted workspace has no snapshot at step {p.n}: {exc.message}"
        return record
    # the names a report and a log show: key-shaped tokens masked (a recorded call names the
    # files; journal/redact.py: what reaches a report or a log never carries a key shape)
    diffs = [dict(d, path=redact_text(d["path"])) for d in _differences(found[1], mine)]
    record.update(
        compared=True,
        reenacted_snapshot=snap.digest,
        equal=not diffs,
        differences=diffs[:MAX_LISTED],
        differences_total=len(diffs),
        why_not_compared=None,
    )
    return record


def _calls(p: Any, result: Any) -> list[dict[str, Any]]:
    """Per source call: its account (translated, reproduced, ...) with O against O″ of the B call
    that carries it (from the result's ``tool_calls``, B's)."""
    by_step: dict[int, list[Any]] = {}
    for c in result.tool_calls:
        by_step.setdefault(c.step, []).append(c)
    out = []
    for acc in p.translation.calls:
        row = acc.to_json()
        b = None
        if acc.target_step is not None and acc.target_index is not None:
            calls = by_step.get(acc.target_step, [])
            b = calls[acc.target_index] if acc.target_index < len(calls) else None
        # the id B's call carried in B's own requests (an agent that makes its own ids, Gemini
        # CLI, answers the served id with its own: ``replayed_call_id``)
        row["target_call_id"] = (
            None if b is None else b.replayed_call_id if isinstance(b.replayed_call_id, str) else b.call_id
        )
        row["observation"] = (
            {
                "recorded_sha256": b.historical_observation_sha256,
                "reenacted_sha256": b.replayed_observation_sha256,
                "equal": b.equal,
                "equal_normalised": b.equal_normalised if b.equal_normalised is not None else None,
            }
            if b is not None and acc.fate is not CallFate.RENDERED_AS_TEXT
            else None
        )
        out.append(row)
    return out


def _same_agent_calls(rec: Any, opts: ReplayOptions, result: Any) -> list[dict[str, Any]]:
    """Per call of a handoff to the same agent: served as recorded (no translation)."""
    out = []
    for c in result.tool_calls:
        out.append(
            {
                "step": c.step,
                "call_id": c.call_id,
                "tool": c.name,
                "effect": descriptor(rec.agent).effect_of(c.name).effect.value,
                "fate": CallFate.TRANSLATED.value,
                "target_step": c.step,
                "target_tool": c.name,
                "target_index": None,
                "reason": "the same agent: served as recorded",
                "target_call_id": c.replayed_call_id if isinstance(c.replayed_call_id, str) else c.call_id,
                "observation": {
                    "recorded_sha256": c.historical_observation_sha256,
                    "reenacted_sha256": c.replayed_observation_sha256,
                    "equal": c.equal,
                    "equal_normalised": c.equal_normalised if c.equal_normalised is not None else None,
                },
            }
        )
    return out


def _boundary_request(p: Any) -> dict[str, Any] | None:
    """B's request M+1: its sha256 and what B's strict validator says of it."""
    if p.boundary is None:
        return None
    body = p.boundary.body
    try:
        problems = [str(x) for x in validate_request(p.rec.protocol, orjson.loads(body))]
    except (orjson.JSONDecodeError, KeyError) as exc:
        problems = [f"not a request body of {p.rec.protocol}: {exc}"]
    return {
        "exchange": p.boundary.exchange,
        "sha256": hashlib.sha256(body).hexdigest(),
        "bytes": len(body),
        "protocol": p.rec.protocol,
        "valid": not problems,
        "problems": problems,
    }


def fill_handoff(
    result: Any,
    opts: ReplayOptions,
    rec: Any,
    p: Any,
    report: Any,
    snaps: SourceSnapshots,
    reset: PauseReset | None = None,
) -> None:
    """``result.handoff`` (docs/handoff.md "The handoff report") once B ran; a workspace that
    differs from the pause's snapshot is a warning of the result (``handoff_workspace_differs``)."""
    same = rec.agent == opts.agent
    tr = None if same else getattr(p, "translation", None)
    refused = None if same else getattr(p, "refused", None)
    workspace = _workspace(opts, snaps, p, report)
    if reset is not None:
        # what the reset overwrote: the differences compared (B's workspace when request M+1 came)
        workspace["reset_to_pause"] = reset.record()
        if reset.error is not None:
            result.warn("reset_to_pause_failed", f"--reset-to-pause failed: {reset.error}")
    # (said once, as a warning of the result: the command prints them after the run; an agent
    # that never reached its boundary left nothing to compare)
    if workspace["compared"] and not workspace["equal"] and p.boundary is not None:
        listed = ", ".join(f"{d['path']} ({d['change']})" for d in workspace["differences"][:5])
        more = workspace["differences_total"] - min(5, workspace["differences_total"])
        said = (
            f"handoff: {opts.agent}'s workspace after re-enactment differs from the pause's snapshot in "
            f"{workspace['differences_total']} path(s): {listed}" + (f" and {more} more" if more else "")
        )
        result.warn("handoff_workspace_differs", said)
    request_one = getattr(p, "request_one", None)
    result.handoff = _report(opts, rec, workspace, report.run)
    result.handoff.update(
        {
            "target_steps": p.n if (same or tr is not None) else None,
            "target_tools": sorted(t.name for t in p.mod.offered_tools(request_one)) if request_one else None,
            "shell_tool": tr.shell_tool if tr is not None else None,
            "read_tool": tr.read_tool if tr is not None else None,
            "step_map": [
                {"source_step": s, "target_steps": t} for s, t in sorted((tr.step_map if tr else {}).items())
            ],
            "calls": _calls(p, result)
            if tr is not None
            else _same_agent_calls(rec, opts, result)
            if same
            else [],
            "not_reenactable": list(tr.skipped) if tr is not None else [],
            "carriers": list(tr.carriers) if tr is not None else [],
            "from_snapshots": [dict(f, paths=[redact_text(x) for x in f["paths"]]) for f in tr.from_snapshots]
            if tr is not None
            else [],
            "inserted_reads": [dict(r, path=redact_text(r["path"])) for r in tr.inserted_reads]
            if tr is not None
            else [],
            "reasoning_dropped": dict(tr.reasoning_dropped)
            if tr is not None
            else {"provider_bound": 0, "plain": 0},
            "reasoning": _reasoning(opts, rec, tr, same),
            "images": verify_kept(
                tr.images if tr is not None else _same_agent_images(rec, opts) if same else {},
                p.boundary.body if p.boundary else None,
            ),
            "refused": refused.message if refused is not None else None,
            "boundary_request": _boundary_request(p),
        }
    )


def _reasoning(opts: ReplayOptions, rec: Any, tr: Any, same: bool) -> dict[str, Any]:
    """``handoff.reasoning``: the translation's account; to the same agent every item of steps
    1..N is served as recorded (kept), whatever the mode."""
    if tr is not None:
        return tr.reasoning.to_json()
    account = ReasoningAccount(SourceReasoning(opts.source_reasoning))
    if same:
        account.kept = sum(len(s.action.reasoning) for s in rec.steps[: opts.after_step])
    return account.to_json()


def _same_agent_images(rec: Any, opts: ReplayOptions) -> dict[str, Any]:
    """``handoff.images`` before the check, to the same agent: every image of the tool results of
    steps 1..N, re-run by the same call (served as recorded); its observation messages are
    served as playback serves them."""
    kept = []
    for s in rec.steps[: opts.after_step]:
        names = {c.id: c.name for c in s.action.tool_calls}
        for r in s.observation.results:
            for img in images_in(r.content):
                row = {"step": s.n, "call_id": r.call_id, **img.to_json()}
                kept.append({**row, "target_step": s.n, "target_tool": names.get(r.call_id), "unless": None})
    return {"kept": kept, "dropped": []}


def compared_calls(calls: list[dict[str, Any]], handoff: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``calls`` (the result's ``tool_calls``: B's, in order per step) without those of a
    handoff that carry no source call's observation: the carriers (``true``, the only call of
    its step) and the reads served first (``inserted_reads``: their B step and place). These
    have no recorded result to compare (docs/handoff.md "The report")."""
    if not handoff:
        return list(calls)
    skip = {(n, 0) for n in handoff.get("carriers") or ()}
    skip |= {(r["target_step"], r["target_index"]) for r in handoff.get("inserted_reads") or ()}
    out: list[dict[str, Any]] = []
    place: dict[int, int] = {}
    for c in calls:
        i = place[c["step"]] = place.get(c["step"], -1) + 1
        if (c["step"], i) not in skip:
            out.append(c)
    return out


def handoff_refusal(result: Any, opts: ReplayOptions) -> PvisorError | None:
    """``handoff_refused`` (exit 65, the reason named) when B's translation was refused at its
    request 1, else None. It comes before the agent's own end: B ended by the refusal (at once,
    after request 0), which is no ``agent_ended_early`` of its own (docs/handoff.md)."""
    h = result.handoff
    if isinstance(h, dict) and h.get("refused"):
        return ReplayBadInput("handoff_refused", f"handoff to {opts.agent}: {h['refused']}")
    return None


def refused_report(opts: ReplayOptions, rec: Any, snaps: SourceSnapshots, why: str) -> dict[str, Any]:
    """``result.handoff`` of a handoff refused before anything ran (``why``: the refusal, without
    the "handoff to B:" its error line adds): who, which pause, nothing translated or re-run."""
    found, _ = snaps.pause()
    digest = found[0].digest if found else None
    workspace = uncompared(opts, digest, "the handoff was refused before the next agent ran")
    return {**_report(opts, rec, workspace, None), "refused": why}


def _report(
    opts: ReplayOptions, rec: Any, workspace: dict[str, Any], child_run: str | None
) -> dict[str, Any]:
    """``result.handoff`` with nothing translated, re-run or checked (every field in its
    documented order): who, which pause, ``workspace``, the lineage to ``child_run``."""
    transition = opts.after_step - 1 if opts.after_step > 0 else None
    return {
        "from_agent": rec.agent,
        "to_agent": opts.agent,
        "translated": rec.agent != opts.agent,
        "pause": {"after_step": opts.after_step, "transition": transition},
        "target_steps": None,
        "target_tools": None,
        "shell_tool": None,
        "read_tool": None,
        "step_map": [],
        "calls": [],
        "not_reenactable": [],
        "carriers": [],
        "from_snapshots": [],
        "inserted_reads": [],
        "reasoning_dropped": {"provider_bound": 0, "plain": 0},
        "reasoning": ReasoningAccount(SourceReasoning(opts.source_reasoning)).to_json(),
        "images": verify_kept({}, None),
        "refused": None,
        "workspace": workspace,
        "boundary_request": None,
        "lineage": {
            "parent_run": rec.run,
            "child_run": child_run,
            "pause_after_step": opts.after_step,
            "pause_transition": transition,
            "workspace_snapshot": workspace["pause_snapshot"],
            "from_agent": rec.agent,
            "to_agent": opts.agent,
        },
    }


def handoff_failure(result: Any, opts: ReplayOptions) -> PvisorError | None:
    """The error of a handoff that ran: its translation refused (exit 65: :func:`handoff_refusal`),
    or its workspace different from the pause's snapshot with ``strict_workspace``; None otherwise."""
    h = result.handoff
    if not isinstance(h, dict):
        return None
    refused = handoff_refusal(result, opts)
    if refused is not None:
        return refused
    ws = h.get("workspace") or {}
    if opts.strict_workspace and ws.get("compared") and not ws.get("equal"):
        return ReplayFailed(
            "workspace_diverged",
            f"--strict-workspace: {opts.agent}'s workspace after re-enactment differs from the pause's "
            f"snapshot in {ws['differences_total']} path(s), the first {ws['differences'][0]['path']}",
        )
    return None
