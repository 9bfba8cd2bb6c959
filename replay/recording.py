"""What playback serves: a recorded run read into a :class:`Recording`, from a journal run or from
the agent's native trajectory file.

- **journal** (:func:`journal_recording`): the run's main chain (the descriptor's hint) gives
  steps 1..S with their actions, the recorded request of each main-loop request (its parsed
  conversation: system prompt, tools, context) and the recorded response bytes of each kept
  exchange (served as they are when they fit, :class:`RecordedReply`); the auxiliary
  exchanges that are not retries are kept to answer the replay's auxiliary requests
  (:class:`RecordedAux`). The task is the run's ``task`` label (``pvisor run`` records it), else
  the descriptor's reading of the recorded command line, else its reading of the first
  main-loop request's prompt (a run captured by ``pvisor gateway``: no label, no command line),
  else ``--task``; the workspace, home and run directory are its labels. A subagent episode
  (``episode``, docs/steps.md "Episodes") is read from its own chain: its steps, requests and
  replies, its own request 1's task as the task its requests must carry; the agent is still
  given the run's task, and :attr:`Recording.parent` is the main loop's recording up to the
  parent step whose call spawned it (playback serves both: :mod:`.episode_playback`).
- **native** (:func:`native_recording`): the native adapter's trajectory; the first request is
  rendered from it (system prompt and tools only when the file stores them); the workspace is
  the file's ``cwd`` (or ``directory``); actions are served rendered.

Errors: ReplayUsageError (exit 2: ``agent_mismatch``, unknown run), ReplayBadInput (exit 65:
``no_steps``, ``after_step_out_of_range``, ``attempt_not_replayable``, ``no_task``,
``bad_source``, ``unknown_episode``).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvisor.adapters.chains import read_final_response
from pvisor.adapters.matcher import recorded_compactions
from pvisor.adapters.native import detect, read_native
from pvisor.core.errors import BadInputError, PvisorError, UsageError
from pvisor.journal.model import TRUNCATED_FLAG, Conversation, Step
from pvisor.journal.reader import JournalReader

from .errors import ReplayBadInput, ReplayUsageError, show_path
from .episodes import MAIN
from .prefix import journal_episode, native_conversation
from .source import (
    WARNED_FLAGS,
    check_boundary,
    check_cut_off,
    check_damage,
    check_gaps,
    check_truncated,
    choose_protocol,
    descriptor,
    finish_at,
    native_version,
    step_notes,
    unrecorded_calls,
    unrecorded_error,
    unsent_note,
)


class TaskOrigin(str, enum.Enum):
    """Where the task a replay gives the agent came from (the result's ``playback.task_origin``)."""

    LABEL = "label"  #: the run's ``task`` label (``pvisor run`` records it)
    ARGV = "argv"  #: the recorded command line, read by the descriptor (runs from before the label)
    TRAJECTORY = "trajectory"  #: the native file's task
    REQUEST = "request"  #: the prompt of the run's first main-loop request (a `pvisor gateway` capture)
    OPTION = "option"  #: ``--task``


@dataclass(slots=True)
class RecordedReply:
    """The recorded answer to main-loop request k: ``status``, ``headers`` (content type and
    encoding), ``body`` (the bytes as the upstream sent them), ``streamed``, ``exchange`` id."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    streamed: bool
    exchange: str


@dataclass(slots=True)
class RecordedAux:
    """A recorded auxiliary exchange, to answer an auxiliary request of the replay with the same
    key (:func:`aux_key`): ``key``, ``method``, ``path``, ``reply``."""

    key: tuple
    method: str
    path: str
    reply: RecordedReply


@dataclass(slots=True)
class Recording:
    """A recorded run as playback serves it.

    Fields:
        kind: ``journal`` or ``native``; path: the journal or the native file.
        agent, agent_version, protocol, model (as the agent asked for it), run (journal run id).
        task and task_origin (:class:`TaskOrigin`'s value), or None: the
            task the agent is given (``--task`` when given); expected_task: the task the
            recording holds (requests must carry it; ``--task`` only where the source has none);
            no_task_why: why the first request gave none; first_prompt: the user's prompt
            parts of recorded request 1, which live request 1 must repeat (journal sources).
        steps: the trajectory's steps (actions and historical observations).
        requests: recorded main-loop request conversations (journal: every one; native: the
            first, rendered); request_ids: what names request k in messages (exchange ids, or
            ``trajectory step k``).
        replies: per step, the recorded reply (journal) or None (native: rendered).
        attempts: per step, the attempt its request belongs to.
        auxiliary: recorded auxiliary exchanges.
        compactions: the compactions of the main loop
            (:class:`~pvisor.adapters.matcher.RecordedCompaction`; journal sources only).
        workspace, home, run_dir: recorded paths (None when unknown).
        source_sha256: digest of the native file (journal sources: None here).
        profile, session: the format or launch profile; the native session id.
        notes: warnings ``(code, message)``.
    """

    kind: str
    path: Path
    agent: str
    agent_version: str | None
    protocol: str
    model: str | None
    run: str | None
    task: str | None
    task_origin: str | None
    steps: list[Step]
    requests: list[Conversation]
    request_ids: list[str]
    replies: list[RecordedReply | None]
    attempts: list[int]
    auxiliary: list[RecordedAux] = field(default_factory=list)
    workspace: str | None = None
    home: str | None = None
    run_dir: str | None = None
    profile: str | None = None
    session: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    expected_task: str | None = None
    compactions: list[Any] = field(default_factory=list)
    #: why the first request gives no task (the descriptor's sentence), or None
    no_task_why: str | None = None
    #: the user's prompt in recorded request 1 (the descriptor's ``prompt_parts``), which the
    #: live request 1 must repeat when the agent is given the recorded task (journal sources)
    first_prompt: list[Any] | None = None
    #: the calls of steps 1..N without a recorded result, by step
    #: (:func:`~.source.unrecorded_calls`): the agent would re-run them unseen before
    unrecorded: list[Any] = field(default_factory=list)
    #: the subagent episode read (:class:`~.episodes.Episode`; None: the main loop)
    episode: Any = None
    #: a subagent episode's parent: the main loop's recording up to the step whose call spawned it
    parent: "Recording | None" = None

    def unrecorded_error(self, after_step: int) -> ReplayBadInput | None:
        """``observation_not_recorded`` of :attr:`unrecorded` (the line prepare-only gives for
        the same boundary, :func:`~.source.unrecorded_error`), or None."""
        if not self.unrecorded:
            return None
        native = self.kind == "native"
        where = show_path(self.path) if native else f"run {self.run}"
        return unrecorded_error(self.unrecorded, after_step, where, native)

    def nearest(self, k: int) -> str | None:
        """What names recorded main-loop request ``k`` (1-based) in a divergence."""
        if 0 < k <= len(self.request_ids):
            return self.request_ids[k - 1]
        return None


def aux_key(method: str, path: str, conv: Conversation | None) -> tuple:
    """The key an auxiliary request is answered by: method, path and, for a model request, the
    digest of its system prompt and its tool names (a title request, a memory request), never
    its messages (they hold the replay's own observations)."""
    if conv is None:
        return (method.upper(), path)
    system = hashlib.sha256((conv.system or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return (method.upper(), path, system, tuple(sorted(t.name for t in conv.tools)))


def _check_steps(rec: Recording, after_step: int, where: str) -> None:
    """The boundary checks; an error carries the recording read so far (``exc.recording``), so
    that a failed result still tells how many steps the source has."""
    try:
        _check_boundary(rec, after_step, where)
    except PvisorError as exc:
        exc.recording = rec  # type: ignore[attr-defined]
        raise


def _check_boundary(rec: Recording, after_step: int, where: str) -> None:
    check_boundary(after_step, len(rec.steps), where)
    check_truncated(rec.steps, 1, after_step, where)
    late = [i + 1 for i, a in enumerate(rec.attempts[:after_step]) if a > 1]
    if late:
        raise ReplayBadInput(
            "attempt_not_replayable",
            f"--after-step {after_step}: step {late[0]} of {where} came from attempt "
            f"{rec.attempts[late[0] - 1]} (a native resume with a later prompt); playback replays attempt 1 "
            f"only: choose N < {late[0]}",
        )


def journal_recording(
    journal: Path, run_id: str, agent: str, after_step: int, task: str | None, episode: str | None = None
) -> Recording:
    """The recording of journal run ``run_id`` for ``--after-step`` (module docstring); of its
    episode ``episode`` (a subagent's id; None or ``main``: the main loop), with the main loop's
    recording up to the parent step as its :attr:`~Recording.parent`."""
    d = descriptor(agent)
    if not journal.exists():
        raise UsageError(f"--journal {show_path(journal)}: no such journal file")
    with JournalReader(journal) as reader:
        run = reader.run(run_id)
        if run.agent is not None and run.agent != agent:
            raise ReplayUsageError(
                "agent_mismatch", f"run {run.id} was recorded with agent {run.agent}, not --agent {agent}"
            )
        c, traj, chosen = journal_episode(reader, run.id, agent, episode)
        sub = chosen is not None and chosen.id != MAIN
        main = c.main_requests
        where = f"run {run.id} episode {chosen.id}" if sub else f"run {run.id}"
        compactions = recorded_compactions(c, lambda ex: read_final_response(reader, ex)[0])
        steps = list(traj.steps)
        attempts = [q.exchange.attempt for q in main[: len(steps)]]
        rec = Recording(
            kind="journal",
            path=journal,
            agent=agent,
            agent_version=run.agent_version,
            protocol=main[0].protocol if main else d.protocols[0],
            model=run.labels.get("model") or traj.model,
            run=run.id,
            task=None,
            task_origin=None,
            steps=steps,
            requests=[],
            request_ids=[q.id for q in main],
            replies=[],
            attempts=attempts,
            workspace=run.labels.get("workspace"),
            home=run.labels.get("home") if run.labels.get("home") not in (None, "user") else None,
            run_dir=run.labels.get("run_dir"),
            profile=f"{agent} launch profile {d.versions}" if d.launchable else None,
        )
        rec.compactions = [x for x in compactions if x.after_step < after_step]
        if sub:
            rec.episode = chosen
            if chosen.note is not None:
                rec.notes.append(chosen.note)
        _check_steps(rec, after_step, where)
        for q in main[: after_step + 1]:
            rec.requests.append(q.conversation())
        label = run.labels.get("task")
        argv = d.task_from_argv(list(run.argv)) if run.argv else None
        # a run captured by `pvisor gateway` keeps neither: the agent's first request holds it
        first = d.task_from_request(rec.requests[0]) if not (label or argv or sub) and rec.requests else None
        rec.task, rec.task_origin, rec.expected_task = _task(
            label, argv, None, task, first.task if first is not None else None
        )
        if sub:
            # the agent starts with the run's task; the subagent's requests carry its own prompt
            own = d.task_from_request(rec.requests[0]) if rec.requests else None
            rec.expected_task = own.task if own is not None else None
        rec.no_task_why = first.why if first is not None else None
        if rec.requests and rec.task_origin != TaskOrigin.OPTION.value:
            rec.first_prompt = d.prompt_parts(rec.requests[0])
        for q in main[:after_step]:
            rec.replies.append(_reply(reader, q.exchange))
        main_ids = {q.id for q in main}
        retry_ids = {lo.exchange for lo in c.left_out if lo.kind == "retry"}
        by_id = {q.id: q for q in c.requests}
        for ex in reader.exchanges(run.id):
            if (
                ex.id in main_ids
                or ex.id in retry_ids
                or ex.attempt != 1
                or ex.status is None
                or ex.response_body is None
                or TRUNCATED_FLAG in ex.flags  # journaled in part: never served cut
            ):
                continue
            q = by_id.get(ex.id)
            conv = None
            if q is not None and q.left_out is None:
                try:
                    conv = q.conversation()
                except BadInputError:
                    conv = None
            rec.auxiliary.append(
                RecordedAux(aux_key(ex.method, ex.path, conv), ex.method, ex.path, _reply(reader, ex))
            )
    # a replay re-runs the calls: a result the recording lacks is no reason to warn here
    rec.notes.extend(step_notes(steps, after_step, [f for f in WARNED_FLAGS if f != "missing_tool_results"]))
    rec.unrecorded = unrecorded_calls(d, steps, after_step, native=False)
    _note_finish(rec, d, after_step)
    if rec.episode is not None:
        assert rec.episode.parent_step is not None  # a journal episode is one a call spawned
        parent = journal_recording(journal, run_id, agent, rec.episode.parent_step, task)
        rec.parent = parent
        if rec.task is None:
            rec.task, rec.task_origin = parent.task, parent.task_origin
    return rec


def _note_finish(rec: Recording, d: Any, after_step: int) -> None:
    """The warning ``observation_not_sent`` when A_N is the agent's finish action (:func:`finish_at`)."""
    finish = finish_at(d, rec.steps, after_step)
    if finish is not None:
        rec.notes.append(unsent_note(after_step, finish))


def _reply(reader: Any, ex: Any) -> RecordedReply:
    keep = ("content-type", "content-encoding")
    headers = [(k, v) for k, v in ex.response_headers.items() if k.lower() in keep]
    body = reader.response_body(ex, raw=True) or b""
    return RecordedReply(ex.status or 200, headers, body, ex.streamed, ex.id)


def _task(
    label: str | None,
    argv: str | None,
    trajectory: str | None,
    option: str | None,
    request: str | None = None,
) -> tuple[str | None, str | None, str | None]:
    """(task given to the agent, its origin, task the recording holds): the first of the run's
    ``task`` label, the recorded command line, the native file's task and the first request's
    prompt (:class:`TaskOrigin`). ``--task`` is given when present, but a recorded task stays
    the one requests must carry (another task diverges)."""
    found = (
        (label, TaskOrigin.LABEL),
        (argv, TaskOrigin.ARGV),
        (trajectory, TaskOrigin.TRAJECTORY),
        (request, TaskOrigin.REQUEST),
    )
    # a blank task is none: the agent would be given nothing to do
    recorded = next(((v, o.value) for v, o in found if v and v.strip()), (None, None))
    if option:
        return option, TaskOrigin.OPTION.value, recorded[0] or option
    return recorded[0], recorded[1], recorded[0]


def native_recording(
    path: Path,
    agent: str,
    after_step: int,
    task: str | None,
    session: str | None = None,
    allow_damaged: bool = False,
) -> Recording:
    """The recording of a native trajectory file for ``--after-step`` (module docstring)."""
    d = descriptor(agent)
    try:
        result, _notes = read_native(path, agent, session)
    except PvisorError as exc:
        if isinstance(exc, BadInputError):
            raise ReplayBadInput("bad_source", exc.message + _other_agent(path, agent)) from None
        raise
    check_damage(result.diagnostics.warnings, path, allow_damaged)
    traj = result.trajectory
    steps = list(traj.steps)
    where = show_path(path)
    check_cut_off(result.diagnostics.warnings, steps, after_step, path, allow_damaged)
    check_gaps(steps, after_step, path)
    first = next((c for c in traj.compactions if c.after_step <= after_step), None)
    if first is not None:
        raise ReplayBadInput(
            "compaction_not_replayable",
            f"--after-step {after_step}: {where} {first.where}: the agent compacted its history after step "
            f"{first.after_step}, and the native file holds no summary request to answer the replayed "
            f"agent's with: choose N < {first.after_step}, or replay the journal run (--run)",
        )
    protocol = choose_protocol(agent, None, traj.model)
    meta = traj.meta
    workspace = next(
        (meta[k] for k in ("cwd", "directory") if isinstance(meta.get(k), str) and meta[k]), None
    )
    rec = Recording(
        kind="native",
        path=path,
        agent=agent,
        agent_version=native_version(meta),
        protocol=protocol,
        model=d.wire_model(traj.model),
        run=None,
        task=None,
        task_origin=None,
        steps=steps,
        requests=[],
        request_ids=[f"trajectory step {s.n}" for s in steps],
        replies=[None] * len(steps),
        attempts=[1] * len(steps),
        workspace=workspace,
        home=_home_of(path),
        run_dir=str(Path(_home_of(path)).parent) if _home_of(path) else None,
        profile=result.profile.name,
        session=next((meta[k] for k in ("sessionId", "session", "id") if isinstance(meta.get(k), str)), None),
        notes=[(w.code, f"{show_path(path)}: {w}") for w in result.diagnostics.warnings],
    )
    _check_steps(rec, after_step, where)
    rec.unrecorded = unrecorded_calls(d, steps, after_step, native=True)
    for step, missing in rec.unrecorded:
        # re-run only with --allow-unrecorded: a result the file lacks leaves O without O'
        rec.notes.append(
            (
                "observation_not_recorded",
                f"step {step.n}: {where} holds no result for {', '.join(c.name for c in missing)}; "
                "its O' has nothing to be compared with",
            )
        )
    rec.task, rec.task_origin, rec.expected_task = _task(
        None, None, d.task_from_trajectory(traj.task, meta), task
    )
    conv, _origin = native_conversation(
        agent,
        protocol,
        traj.task,
        list(meta.get("task_context") or []),
        traj.system,
        traj.tools,
        traj.model,
        steps,
        0,
        None,
    )
    rec.requests.append(conv)
    _note_finish(rec, d, after_step)
    return rec


def _other_agent(path: Path, agent: str) -> str:
    """``; it reads as a codex file: give --agent codex`` when another adapter recognises it."""
    try:
        found = [a for a in detect(path) if a != agent]
    except (OSError, PvisorError):
        return ""
    return f"; it reads as a {found[0]} file: give --agent {found[0]}" if len(found) == 1 else ""


def _home_of(path: Path) -> str | None:
    """The private home a native file of a ``pvisor run`` lies in (``.../runs/<id>/home/...``)."""
    parts = Path(path).resolve().parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "home" and i >= 2 and parts[i - 2] == "runs":
            return str(Path(*parts[: i + 1]))
    return None
