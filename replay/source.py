"""A replay's source, read and checked: what a journal run or a native trajectory file gives a
replay before any prefix is built, and the checks every mode makes of it.

- :class:`Source`: what was read (kind, path, run, agent version, profile, the steps, session,
  warnings); :func:`read_native_source` reads a native file into one.
- The agent (:func:`descriptor`) and the protocol (:func:`choose_protocol`) of a replay.
- Boundary checks of ``--after-step N`` (docs/steps.md, "Steps"): :func:`check_boundary`,
  :func:`check_truncated`, :func:`check_gaps`; damaged native files: :func:`check_damage`,
  :func:`check_cut_off` (``--allow-damaged``).
- What steps 1..N say: :func:`step_notes` (warnings of flagged steps), :func:`finish_at` (A_N is
  the agent's finish action, O_N never sent), :func:`pending_calls`, :func:`answering` and
  :func:`is_made_up` (tool calls without a recorded result), :func:`unrecorded_calls` and
  :func:`unrecorded_error` (a boundary whose calls have no recorded result).

Used by prepare-only (:mod:`.prefix`, :mod:`.prepare`), the recordings of replay-only and
continuation (:mod:`.recording`, :mod:`.playback`) and batches (:mod:`.batch`).

Errors: :class:`~pvisor.replay.errors.ReplayUsageError` (exit 2),
:class:`~pvisor.replay.errors.ReplayBadInput` (exit 65), both with a result-protocol code.
Nothing here writes a file, starts a process or opens a socket.
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from pvisor.journal.model import RESPONSE_TRUNCATED, Step, ToolCall, ToolResult
from pvisor.core.record import Record

from .errors import ReplayBadInput, ReplayUsageError, show_path

if TYPE_CHECKING:
    from pathlib import Path


def descriptor(agent: str) -> Any:
    """The agent's descriptor (:mod:`pvisor.adapters.agents`): every agent fact lives there.
    Raises ReplayUsageError ``unknown_agent``."""
    from pvisor.adapters.agents import descriptor_names, get_descriptor

    if agent not in descriptor_names():
        raise ReplayUsageError(
            "unknown_agent",
            f"unknown agent {show_path(agent)!r}; expected one of {', '.join(descriptor_names())}",
        )
    return get_descriptor(agent)


def default_protocol(agent: str, model: str | None = None) -> str:
    """The protocol an agent speaks by default (its descriptor's; for a litellm agent the one its
    model's provider prefix names: ``anthropic/claude-...`` -> ``anthropic``)."""
    return descriptor(agent).default_protocol(model)


def choose_protocol(agent: str, wanted: str | None, model: str | None, provider: str | None = None) -> str:
    """``wanted`` when the agent speaks it, else the default (of the ``provider`` the native
    file names, when the descriptor knows it); ReplayUsageError ``protocol_not_spoken`` for a
    protocol the agent does not speak."""
    d = descriptor(agent)
    if wanted is None:
        return d.default_protocol(model, provider)
    if not d.speaks(wanted):
        raise ReplayUsageError(
            "protocol_not_spoken", f"--protocol {wanted}: {agent} speaks {', '.join(d.protocols)}"
        )
    return wanted


class Source(Record, record=True):
    """What was read: ``kind`` (``journal`` | ``native``), ``path``, ``run`` (journal run id or
    None), ``agent_version`` (str or None), ``profile`` (format profile or launch profile name),
    ``steps`` (Sequence[Step], possibly lazy), ``session`` (native session id or None),
    ``notes`` (warnings ``(code, message)``), ``episode`` (the
    :class:`~.episodes.Episode` read when ``--episode`` was given, else None: the main loop)."""

    kind: str
    path: Path
    run: str | None
    agent_version: str | None
    profile: str | None
    steps: Sequence[Step]
    session: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    episode: Any = None

    def __init__(
        self,
        kind: str,
        path: Path,
        run: str | None,
        agent_version: str | None,
        profile: str | None,
        steps: Sequence[Step],
        session: str | None = None,
        notes: list[tuple[str, str]] | None = None,
        episode: Any = None,
    ) -> None:
        self.kind = kind
        self.path = path
        self.run = run
        self.agent_version = agent_version
        self.profile = profile
        self.steps = steps
        self.session = session
        self.notes = [] if notes is None else notes
        self.episode = episode


def native_version(meta: dict[str, Any]) -> str | None:
    """The agent version a native trajectory's ``meta`` records (``agent_version``,
    ``cli_version``, ``mini_version``, ``version``), or None."""
    for key in ("agent_version", "cli_version", "mini_version", "version"):
        v = meta.get(key)
        if isinstance(v, str) and v:
            return v
    return None


class BuiltSteps(Sequence[Step]):
    """The steps of one native source as one prefix uses them: each built once, when first
    read (an adapter's ``LazySteps`` builds a step from the file at every read, and the
    boundary checks, the render and the result each read steps 1..N). Holds the steps it
    built, which the prefix holds anyway; a new one for each prefix, so a batch that prepares
    many boundaries of one file keeps no steps between them."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self._steps = steps
        self._built: dict[int, Step] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._steps)))]
        if i < 0:
            i += len(self._steps)
        step = self._built.get(i)
        if step is None:
            step = self._built[i] = self._steps[i]
        return step

    def __iter__(self) -> Iterator[Step]:
        for i in range(len(self._steps)):
            yield self[i]


def read_native_source(
    path: Path, agent: str, session: str | None = None, read: Any = None, episode: str | None = None
) -> tuple[Source, Any, Sequence[Any]]:
    """Read the native file ``path`` with the ``agent`` adapter into a :class:`Source` (steps
    built once, :class:`BuiltSteps`; the reader's warnings as notes). ``read``: what reads the
    file, ``read_native``'s signature (a batch passes one that reads each file once).
    ``episode``: the file's episode read (:mod:`.episodes`: a subagent's steps; None: the main
    loop). Returns (source, canonical trajectory, the reader's warnings). Raises UsageError
    (unknown adapter, missing file), ReplayBadInput ``bad_source`` for a file the adapter cannot
    read, ``unknown_episode``."""
    from pvisor.adapters.native import read_native
    from pvisor.core.errors import BadInputError

    chosen = None
    skipped: list[Any] = []
    try:
        result, _notes = (read or read_native)(path, agent, session)
        if episode is not None:
            from .episodes import MAIN, choose, native_episodes, read_native_episode, skipped_files

            found = native_episodes(path, agent, result.trajectory, read)
            chosen = choose(found, episode, show_path(path))
            skipped = skipped_files(found)
            if chosen.id != MAIN:
                result, _notes = read_native_episode(path, agent, chosen, read)
    except ReplayBadInput:
        raise
    except BadInputError as exc:
        raise ReplayBadInput("bad_source", exc.message) from None
    traj = result.trajectory
    # the file the steps were read from: a subagent's own, or the given one
    read_from = episode_file(path, chosen)
    steps = traj.steps if isinstance(traj.steps, list) else BuiltSteps(traj.steps)
    source = Source(
        kind="native",
        path=path,
        run=None,
        agent_version=native_version(traj.meta),
        profile=result.profile.name,
        steps=steps,
        session=next(
            (traj.meta[k] for k in ("sessionId", "session", "id") if isinstance(traj.meta.get(k), str)), None
        ),
        notes=[
            *[(w.code, f"{show_path(path)}: {w}") for w in skipped],
            *[(w.code, f"{show_path(read_from)}: {w}") for w in result.diagnostics.warnings],
        ],
        episode=chosen,
    )
    return source, traj, result.diagnostics.warnings


def episode_file(path: Path, episode: Any) -> Path:
    """The file an episode's steps are read from: a subagent's own file, else ``path``."""
    if episode is None or not episode.path:
        return path
    import pathlib  # a subagent's file only: a main loop's prefix does not load pathlib

    return pathlib.Path(episode.path)


def attach_source(exc: Exception, seen: list[Source]) -> None:
    """Give the error the Source read before it (``exc.source``): a failed result still says
    how many steps the source has, its version, session and profile."""
    if seen and getattr(exc, "source", None) is None:
        exc.source = seen[0]  # type: ignore[attr-defined]


#: step flags of steps 1..N that the result warns about (docs/steps.md)
WARNED_FLAGS = (
    "action_dropped_by_agent",
    "action_changed_by_agent",
    "missing_tool_results",
    "interrupted",
    "partially_delivered",
    "response_truncated",
    "no_reply",
    "thinking_signature_empty",
    "thinking_signature_missing",
    "thinking_signature_incomplete",
    "compaction",
)


def step_notes(
    steps: Sequence[Step], after_step: int, flags: Sequence[str] = WARNED_FLAGS
) -> list[tuple[str, str]]:
    """A warning ``(flag, "step K: ...")`` per flag of ``flags`` that steps 1..N carry."""
    return [
        (f, f"step {s.n}: {f.replace('_', ' ')}") for s in steps[:after_step] for f in s.flags if f in flags
    ]


def check_boundary(after_step: int, steps_total: int, where: str) -> None:
    """ReplayBadInput ``no_steps`` when the source has no step, ``after_step_out_of_range``
    when ``after_step`` > ``steps_total``; ReplayUsageError for a negative ``after_step``."""
    if after_step < 0:
        raise ReplayUsageError("usage", f"--after-step {after_step}: N counts steps from 0 (the task alone)")
    if steps_total == 0:
        raise ReplayBadInput("no_steps", f"{where} holds no main-loop step: nothing to prepare")
    if after_step > steps_total:
        raise ReplayBadInput(
            "after_step_out_of_range",
            f"--after-step {after_step}: {where} has {steps_total} step{'s' if steps_total != 1 else ''} "
            f"(0 <= N <= {steps_total})",
        )


def check_truncated(steps: Sequence[Step], first: int, after_step: int, where: str) -> None:
    """ReplayBadInput ``response_truncated`` when a step from ``first`` to ``after_step`` (1-based)
    is flagged ``response_truncated``: the journal holds only the first bytes of its reply, so
    it can neither be served (playback needs the replies of steps 1..N) nor rendered (prepare-only
    needs A_N at N = the last step). Never guessed: the agent got more than the journal kept."""
    cut = next((s for s in steps[first - 1 : after_step] if RESPONSE_TRUNCATED in s.flags), None)
    if cut is None:
        return
    raise ReplayBadInput(
        "response_truncated",
        f"--after-step {after_step}: the reply of step {cut.n} of {where} is journaled only in part "
        "(its exchange is flagged truncated: larger than the gateway's --max-response-body, "
        "or past its journal budget); "
        f"choose N < {cut.n}",
    )


def finish_at(d: Any, steps: Sequence[Step], after_step: int) -> str | None:
    """Why O_N was never sent, or None: A_N, the source's last step, is the agent's finish
    action (its descriptor's :meth:`~pvisor.adapters.agents.descriptor.AgentDescriptor.finish_action`:
    mini-swe-agent's submit command, SWE-agent's ``submit`` tool), which ended the run before
    any request carried its observation. The prefix then ends at A_N, as after an A_N without a
    tool call; a native file may still hold an O_N the agent wrote (mini-swe-agent's "action was
    not executed"), which no prefix holds. A step the native reader flagged ``submitted`` (it ran
    the agent's submit command, as the agent itself recognises it: mini-swe-agent submits on the
    first line of a command's output, so ``cd repo && echo COMPLETE_...`` too) is a finish
    command even when the descriptor's narrower match misses it."""
    if after_step <= 0 or after_step != len(steps):
        return None
    step = steps[after_step - 1]
    return d.finish_action(step.action) or ("finish command" if "submitted" in step.flags else None)


def unsent_note(after_step: int, why: str) -> tuple[str, str]:
    """The warning ``observation_not_sent`` of a prefix that ends at A_N, the finish action."""
    return (
        "observation_not_sent",
        f"step {after_step}: A_{after_step} is the agent's {why}, which ended its run: "
        f"O_{after_step} was never sent to the model, and the prefix ends at A_{after_step}",
    )


def answering(step: Step) -> list[ToolResult | None]:
    """The result answering each tool call of ``step`` (by call id), or None."""
    by_id = {r.call_id: r for r in step.observation.results if r.call_id is not None}
    return [by_id.get(c.id) if c.id is not None else None for c in step.action.tool_calls]


def pending_calls(step: Step) -> list[ToolCall]:
    """The tool calls of ``step`` the agent runs (kind other than ``server``) that its
    observation does not answer (by call id, else by position)."""
    calls = [c for c in step.action.tool_calls if c.kind != "server"]
    results = step.observation.results
    ids = {r.call_id for r in results if r.call_id is not None}
    out = []
    for i, c in enumerate(calls):
        if c.id is not None and c.id in ids:
            continue
        if i < len(results) and (
            results[i].call_id is None or results[i].call_id not in {x.id for x in calls}
        ):
            continue
        out.append(c)
    return out


def is_made_up(result: ToolResult) -> bool:
    """True for the empty result the native reader puts in for a call the file holds no result
    for (``raw == {"interrupted": True}``, adapters/native/base.py ``order_results``)."""
    return result.raw == {"interrupted": True}


def unrecorded_calls(
    d: Any, steps: Sequence[Step], after_step: int, native: bool
) -> list[tuple[Step, list[ToolCall]]]:
    """The tool calls of steps 1..N whose results the source does not hold (an interrupted
    batch: the run was stopped while its tools ran), by step. A native file: every call of
    A_1..A_N that its observation does not answer (:func:`pending_calls`) or answers with the
    reader's placeholder (:func:`is_made_up`), but the calls of A_N when it is the agent's
    finish action (:func:`finish_at`: never sent). A journal: the calls of A_N when N is the last
    step, A_N is not the finish action and no request N+1 holds their results (a replay's
    request N+1, answered by playback's synthetic final reply, holds them: it is no step); a
    request N+1 holds O_N as the agent sent it. Calls the provider runs (kind ``server``) never count.
    Prepare-only refuses such a boundary, and replay-only and continuation refuse it unless
    ``--allow-unrecorded`` (:func:`unrecorded_error`)."""
    finish = finish_at(d, steps, after_step)
    if not native:
        if after_step == 0 or after_step != len(steps) or finish is not None:
            return []
        step = steps[after_step - 1]
        # a replay's run: its request N+1 got playback's synthetic final reply, so it is no step,
        # and it still holds O_N (adapters/journal_trajectory.py)
        calls = pending_calls(step)
        return [(step, calls)] if calls else []
    found = []
    for step in steps[: after_step - 1 if finish is not None else after_step]:
        missing = pending_calls(step)
        missing += [
            c
            for c, r in zip(step.action.tool_calls, answering(step))
            if r is not None and is_made_up(r) and c not in missing
        ]
        if missing:
            found.append((step, missing))
    return found


#: the end of the ``observation_not_recorded`` line, true in every mode: prepare-only has no
#: result to put there, the modes that run the agent can let it run the calls again
RERUN_HINT = "; replay-only and continuation re-run them with --allow-unrecorded"


def unrecorded_error(
    found: Sequence[tuple[Step, list[ToolCall]]], after_step: int, where: str, native: bool
) -> ReplayBadInput:
    """ReplayBadInput ``observation_not_recorded`` (exit 65) for the first step of ``found``
    (:func:`unrecorded_calls`), ``where``: the native file (:func:`~.errors.show_path`) or
    ``run ID``. The same line in every mode."""
    step, missing = found[0]
    if not native:
        return ReplayBadInput(
            "observation_not_recorded",
            f"--after-step {after_step}: A_{after_step} made {len(step.action.tool_calls)} tool call(s) "
            f"and {where} has no request {after_step + 1} holding their results; choose N < "
            f"{after_step}, or N = {after_step} from the agent's native file{RERUN_HINT}",
        )
    choose = f"choose N < {step.n}" if step.n > 1 else "only N = 0 is possible"
    return ReplayBadInput(
        "observation_not_recorded",
        f"--after-step {after_step}: {where} holds no result for {len(missing)} tool "
        f"call(s) of A_{step.n} ({', '.join(c.name for c in missing)}); {choose}{RERUN_HINT}",
    )


#: native reader warnings that say the file lost or had repaired what the agent wrote: a line
#: that is not JSON or not an object, NUL bytes, an object rejoined over raw newlines, a truncated
#: record a complete one was glued onto, a Codex output read from its UI event (the text the model
#: was sent may differ), a record lacking a field its type needs, a chain mended
#: past a missing parent. (A truncated last line is not among them: the writer was cut off after
#: the last complete record, which loses no step before the last; :func:`check_cut_off` refuses
#: a boundary that includes the last.)
DAMAGE_CODES = frozenset(
    {
        "malformed_line",
        "not_an_object",
        "nul_block",
        "rejoined_lines",
        "glued_record",
        "output_from_event",
        "malformed_record",
        "broken_chain",
        "lost_action",
    }
)


#: what a refused prefix (``check_damage``) and a refused view (``for_view``) say after the place:
#: the refusal is of the whole file, whatever the step or N (a lost line is not tied to a step)
_ACROSS = {
    False: (
        "a file the reader had to repair is refused at any N (a prefix from it may not be what the "
        "agent sent): --allow-damaged builds it and lists each repair"
    ),
    True: (
        "a file the reader had to repair is refused at any step (a view of it may not be what the "
        "agent saw): --allow-damaged writes it with each repair in its `repairs`"
    ),
}


def check_damage(warnings: Sequence[Any], path: Path, allow: bool, *, for_view: bool = False) -> None:
    """ReplayBadInput ``damaged_source`` naming the first damaged place and what was lost or
    repaired, unless ``allow`` (``--allow-damaged``: the prefix is built, each repair stays a
    warning of the result). A prefix across damage may not be what the agent sent: refused, never
    guessed. ``warnings``: the native reader's
    (:class:`~pvisor.adapters.native.diagnostics.NativeWarning`). ``for_view``: the refusal of
    ``pvisor view``, in its words (a view marks each repair in its ``repairs``)."""
    damage = [w for w in warnings if w.code in DAMAGE_CODES]
    if not damage or allow:
        return
    w = damage[0]
    more = f" (and {len(damage) - 1} more repair(s))" if len(damage) > 1 else ""
    raise ReplayBadInput(
        "damaged_source",
        f"{show_path(path)} {w.where}: {w.code}: {w.message}{more}; {_ACROSS[for_view]}",
    )


def check_cut_off(
    warnings: Sequence[Any], steps: Sequence[Step], after_step: int, path: Path, allow: bool
) -> None:
    """ReplayBadInput ``damaged_source`` when steps 1..N reach the step the file's cut-off last
    line may belong to (the reader flags it ``truncated_line``, the last step S: the line may
    hold the rest of A_S or O_S, and the prefix would silently end at what was read of them),
    unless ``allow`` (``--allow-damaged``). A boundary before S is whole: fine."""
    from pvisor.adapters.native.base import CUT_OFF_FLAG

    s = len(steps)
    if allow or not s or after_step != s or CUT_OFF_FLAG not in steps[s - 1].flags:
        return
    cut = next((w for w in warnings if w.code == "truncated_line"), None)
    where = cut.where if cut is not None else "its last line"
    raise ReplayBadInput(
        "damaged_source",
        f"--after-step {after_step}: {show_path(path)} {where} is cut off (not a whole record) and may "
        f"belong to step {s}, "
        f"whose action or observation would then be incomplete; choose N < {s}, or --allow-damaged",
    )


def check_gaps(steps: Sequence[Step], after_step: int, path: Path) -> None:
    """ReplayBadInput ``action_lost`` when a step up to N is a gap (flag ``lost_action``: its
    action's line was lost, the reader's ``lost_action`` warning names where): what the agent
    sent there is unknown, so no prefix or playback crosses it."""
    for step in steps[:after_step]:
        if "lost_action" in step.flags:
            raise ReplayBadInput(
                "action_lost",
                f"--after-step {after_step}: {show_path(path)} lost the action of step {step.n} (a "
                "result answers a call no line "
                f"holds: the lost_action warning names the line); choose N < {step.n}",
            )
