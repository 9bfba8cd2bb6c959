"""The prefix of prepare-only: the request body for inference N+1, from a journal or a native file.

Vocabulary (docs/steps.md, "Steps"): steps are numbered from 1; ``--after-step N`` keeps the
task, A_1, O_1, ..., A_N, O_N and excludes A_(N+1) and all after. The prefix ends exactly at
O_N (at A_N when A_N made no tool call, or when A_N is the last step and the agent's finish
action, :func:`finish_at`: the agent never sent O_N); nothing is appended; a batch (one reply's
parallel tool calls) is never split, because a step is a whole reply.

Two sources:

- **journal** (:func:`journal_prefix`): the run's main chain (:mod:`pvisor.adapters.chains`,
  with the launch profile's tie-break hint) gives main-loop requests 1..S. For N < S the prefix
  is the stored body of request N+1, byte for byte (the body as the agent sent it, its
  ``Content-Encoding`` undone), with that exchange's method, path, query and allow-listed
  headers. For N = S (no request N+1 exists) the prefix is rendered: request N's body with A_N
  appended in the protocol's own shape (``prefix.rendered: true``); allowed only when A_N made
  no tool call or is the agent's finish action (else ``observation_not_recorded``) and got a
  usable reply (else ``no_reply``).
- **native** (:func:`native_prefix`): the canonical trajectory of the agent's own file
  (:func:`pvisor.adapters.native.read_native`) rendered with the protocol module's
  ``render_request``. Parts the file does not store come from a profile (a journal capture
  of the same agent, :func:`pvisor.replay.profile.load_profile`) or are reported absent: see
  :data:`ORIGINS`.

The source is read and checked by :mod:`.source` (the boundary, damage and finish-action
checks); what a protocol requires comes from its module's facts
(:class:`~pvisor.adapters.protocols.contract.WireProtocol`: default targets, entries key, results
role, required params); a file or profile of another protocol passes through the transcoder's
pieces (:mod:`pvisor.adapters.protocols.convert`).

Errors: :class:`~pvisor.replay.errors.ReplayUsageError` (exit 2),
:class:`~pvisor.replay.errors.ReplayBadInput` (exit 65), both with a result-protocol code.
Nothing here writes a file, starts a process or opens a socket.
"""

from __future__ import annotations

import copy
import os
from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.core.errors import PvisorError
from pvisor.journal.model import (
    Action,
    Compaction,
    Conversation,
    Message,
    Observation,
    Step,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)

from pvisor.adapters.jsonio import dumps
from pvisor.adapters.protocols.convert import (
    convert_tools,
    plain,
    plain_action,
    plain_message,
    texts_only,
    without_unsigned_reasoning,
)
from pvisor.core.record import Record

from .episodes import MAIN, Episode, choose, journal_classification, journal_episodes
from .errors import ReplayBadInput, ReplayUsageError, show_path
from .source import (
    Source,
    attach_source,
    check_boundary,
    check_cut_off,
    episode_file,
    check_damage,
    check_gaps,
    check_truncated,
    choose_protocol,
    descriptor,
    finish_at,
    read_native_source,
    step_notes,
    unrecorded_calls,
    unrecorded_error,
    unsent_note,
)

if TYPE_CHECKING:
    from pathlib import Path

    from .journal_runs import JournalRuns
    from .profile import Profile

# --------------------------------------------------------------------------- agents and protocols

#: where a part of the prefix came from (``prefix.origin.*`` of the result)
ORIGINS = ("journal", "trajectory", "profile", "default", "absent", "rendered")

#: headers never written to prefix.request.json: they describe the wire body, not this one
_BODY_HEADERS = frozenset({"content-length", "content-encoding", "transfer-encoding"})


# --------------------------------------------------------------------------- results


class Prefix(Record, record=True):
    """A prepared prefix.

    Fields:
        protocol: wire protocol module name.
        body: the request body bytes (prefix.json).
        request: ``{"method", "path", "query", "headers"}`` (prefix.request.json); headers are
            lower-case name -> value, never a secret.
        rendered: False when ``body`` is a recorded request byte for byte.
        origin: part -> origin (:data:`ORIGINS`): ``messages``, ``task_context``, ``system``,
            ``tools``, ``params``, ``request``.
        exchange: the journal exchange whose body this is (or that was rendered on), or None.
        notes: warnings ``(code, message)`` for the result's ``warnings``.
        compaction: the result's ``prefix.compaction`` (:func:`compaction_record`), or None.
        facts: what the result says of ``body`` when the source knows it already (a journal
            run's recorded request, parsed when the run was classified:
            :func:`~.result_parts.prefix_facts`), or None: the body is parsed again.
    """

    protocol: str
    body: bytes
    request: dict[str, Any]
    rendered: bool
    origin: dict[str, str]
    exchange: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    compaction: dict[str, Any] | None = None
    facts: dict[str, Any] | None = None

    def __init__(
        self,
        protocol: str,
        body: bytes,
        request: dict[str, Any],
        rendered: bool,
        origin: dict[str, str],
        exchange: str | None = None,
        notes: list[tuple[str, str]] | None = None,
        compaction: dict[str, Any] | None = None,
        facts: dict[str, Any] | None = None,
    ) -> None:
        self.protocol = protocol
        self.body = body
        self.request = request
        self.rendered = rendered
        self.origin = origin
        self.exchange = exchange
        self.notes = [] if notes is None else notes
        self.compaction = compaction
        self.facts = facts


def request_meta(
    method: str, path: str, query: str, headers: dict[str, str], encoding: str | None = None
) -> dict[str, Any]:
    """The prefix.request.json object: method, path, query (secrets already ``REDACTED`` by the
    journal), headers without those that describe the wire body (:data:`_BODY_HEADERS`), and
    ``recorded_content_encoding`` (the encoding the agent sent the body with, undone here)."""
    from pvisor.journal.redact import is_secret_header

    kept = {
        k: v for k, v in sorted(headers.items()) if k.lower() not in _BODY_HEADERS and not is_secret_header(k)
    }
    return {
        "method": method,
        "path": path,
        "query": query,
        "headers": kept,
        "recorded_content_encoding": encoding,
    }


# --------------------------------------------------------------------------- journal


def append_action(protocol: str, body: bytes, action: Action) -> bytes:
    """Request ``body`` with ``action`` appended as the assistant turn, in the body's own
    shape: the entries the protocol module renders for the action's message are appended to
    the body's entry list (every other byte of meaning kept; serialisation compact)."""
    from pvisor.adapters.chains import action_message

    mod = get_protocol(protocol)
    obj = orjson.loads(body)
    rendered = orjson.loads(
        mod.render_request(Conversation(protocol=protocol, messages=[action_message(action)]))
    )
    key = mod.ENTRIES_KEY
    entries = obj.get(key)
    if isinstance(entries, str):  # a Responses input given as one string
        entries = [{"role": "user", "content": [{"type": "input_text", "text": entries}]}]
    if not isinstance(entries, list):
        entries = []
    obj[key] = entries + list(rendered.get(key) or [])
    return dumps(obj)


def journal_prefix(
    journal: Path,
    run_id: str,
    agent: str,
    after_step: int,
    protocol: str | None,
    episode: str | None = None,
    runs: "JournalRuns | None" = None,
) -> tuple[Source, Prefix, dict[str, Any]]:
    """The prefix for ``--run``: (source, prefix, trajectory meta). See the module docstring.
    ``episode``: the run's episode whose steps are read (:mod:`.episodes`; None: the main one).
    ``runs``: the open journals and classified runs a batch shares (:mod:`.journal_runs`), or
    None to open the journal and classify the run here.

    Raises ReplayUsageError (``agent_mismatch``, ``protocol_not_spoken``, unknown run),
    ReplayBadInput (``no_steps``, ``after_step_out_of_range``, ``observation_not_recorded``,
    ``no_reply``), IntegrityError for a damaged journal."""
    from contextlib import nullcontext

    from pvisor.core.errors import UsageError
    from pvisor.journal.reader import JournalReader

    if not os.path.exists(journal):
        raise UsageError(f"--journal {show_path(journal)}: no such journal file")
    # a batch's reader stays open for its next lines: the batch closes it
    with JournalReader(journal) if runs is None else nullcontext(runs.reader(journal)) as reader:
        run = reader.run(run_id)
        if run.agent is not None and run.agent != agent:
            raise ReplayUsageError(
                "agent_mismatch", f"run {run.id} was recorded with agent {run.agent}, not --agent {agent}"
            )
        seen: list[Source] = []
        try:
            if runs is None:
                classified = classify_journal_run(reader, run.id, agent, episode)
            else:
                classified = runs.classified(reader, run.id, agent, episode)
            return _journal_prefix(reader, run, agent, after_step, protocol, seen, classified)
        except PvisorError as exc:
            attach_source(exc, seen)
            raise


class ClassifiedRun:
    """A journal run read and classified for one agent and episode, what every prefix of it
    starts from: ``classification`` (its main chain the episode's chain), ``trajectory`` (its
    steps and meta), ``episode`` (the :class:`~.episodes.Episode` chosen; None for the main loop
    by default), ``facts`` (exchange id -> :func:`~.result_parts.prefix_facts` of each request the
    chain rule parsed: what a prefix that is that request's body says of it, without parsing it
    again) and, read when first asked for, its compactions (:meth:`compactions`). The
    prefixes of a batch share one (:mod:`.journal_runs`): nothing here is changed by a prefix."""

    __slots__ = ("classification", "trajectory", "episode", "facts", "_compactions")

    def __init__(
        self,
        classification: Any,
        trajectory: Any,
        episode: Episode | None,
        facts: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.classification = classification
        self.trajectory = trajectory
        self.episode = episode
        self.facts = {} if facts is None else facts
        self._compactions: list[Any] | None = None

    def compactions(self, reader: Any) -> list[Any]:
        """The main chain's recorded compactions in order
        (:func:`~pvisor.adapters.matcher.recorded_compactions`), their summaries' responses read
        from ``reader`` once; [] for a chain that compacted nothing (no response is read)."""
        if self._compactions is None:
            from pvisor.adapters.chains import read_final_response
            from pvisor.adapters.matcher import recorded_compactions

            c = self.classification
            if c.main is None or not any(slot.compaction is not None for slot in c.main.slots):
                self._compactions = []
            else:
                self._compactions = list(
                    recorded_compactions(c, lambda ex: read_final_response(reader, ex)[0])
                )
        return self._compactions


def classify_journal_run(reader: Any, run_id: str, agent: str, episode: str | None) -> ClassifiedRun:
    """The :class:`ClassifiedRun` of run ``run_id`` (a full id) for ``agent``'s chain hint and
    ``episode`` (:func:`journal_episode`, whose errors it raises)."""
    from .result_parts import prefix_facts

    facts: dict[str, dict[str, Any]] = {}

    def parsed(request: Any, conv: Conversation) -> None:
        facts[request.id] = prefix_facts(conv)

    return ClassifiedRun(*journal_episode(reader, run_id, agent, episode, parsed), facts)


def _journal_prefix(
    reader: Any,
    run: Any,
    agent: str,
    after_step: int,
    protocol: str | None,
    seen: list[Source],
    classified: ClassifiedRun,
) -> tuple[Source, Prefix, dict[str, Any]]:
    d = descriptor(agent)
    launch = d if d.launchable else None
    classification, traj, chosen = classified.classification, classified.trajectory, classified.episode
    main = classification.main_requests
    source = Source(
        kind="journal",
        path=reader.path,
        run=run.id,
        agent_version=run.agent_version,
        profile=f"{agent} launch profile {launch.versions}" if launch is not None else None,
        steps=traj.steps,
        episode=chosen,
    )
    seen.append(source)
    where = f"run {run.id}" if chosen is None or chosen.id == MAIN else f"run {run.id} episode {chosen.id}"
    check_boundary(after_step, len(traj.steps), where)
    recorded = main[0].protocol
    if protocol is not None and protocol != recorded:
        raise ReplayUsageError(
            "protocol_not_spoken", f"--protocol {protocol}: run {run.id} was recorded in {recorded}"
        )
    if run.agent is None:
        # a run recorded without an agent (a gateway session of another client): --agent
        # is taken on trust, but it must at least speak the recorded protocol
        if not d.speaks(recorded):
            raise ReplayUsageError(
                "protocol_not_spoken",
                f"run {run.id} records no agent and was sent in {recorded}, which {agent} does not speak "
                f"({', '.join(d.protocols)})",
            )
        source.notes.append(
            ("agent_unrecorded", f"run {run.id} records no agent: --agent {agent} is taken as given")
        )
    source.notes.extend(_step_notes(traj, after_step, chosen))
    compaction = _journal_compaction(reader, classified, after_step)
    if after_step < len(main):
        req = main[after_step]
        ex = req.exchange
        body = reader.request_body(ex)
        if body is None:  # a candidate always has a body; kept for safety
            raise ReplayBadInput(
                "bad_source", f"exchange {ex.id} (main-loop request {after_step + 1}) has no stored body"
            )
        prefix = Prefix(
            protocol=req.protocol or recorded or "",
            body=body,
            request=request_meta(ex.method, ex.path, ex.query, ex.request_headers, ex.request_encoding),
            rendered=False,
            origin={
                k: "journal" for k in ("messages", "task_context", "system", "tools", "params", "request")
            },
            exchange=ex.id,
            compaction=compaction,
            facts=classified.facts.get(ex.id),
        )
        return source, prefix, traj.meta
    # N = S: render request N + A_N
    step = traj.steps[after_step - 1]
    check_truncated(traj.steps, after_step, after_step, f"run {run.id}")
    if "no_reply" in step.flags:
        raise ReplayBadInput(
            "no_reply",
            f"--after-step {after_step}: request {after_step} got no usable reply, so A_{after_step} "
            "cannot be rendered",
        )
    finish = finish_at(d, traj.steps, after_step)
    if finish is not None:
        source.notes.append(unsent_note(after_step, finish))
    unrecorded = unrecorded_calls(d, traj.steps, after_step, native=False)
    if unrecorded:
        raise unrecorded_error(unrecorded, after_step, f"run {run.id}", native=False)
    req = main[after_step - 1]
    ex = req.exchange
    body = reader.request_body(ex) or b"{}"
    prefix = Prefix(
        protocol=req.protocol or "",
        body=append_action(req.protocol or "", body, step.action),
        request=request_meta(ex.method, ex.path, ex.query, ex.request_headers, None),
        rendered=True,
        origin={
            "messages": "rendered",
            "task_context": "journal",
            "system": "journal",
            "tools": "journal",
            "params": "journal",
            "request": "journal",
        },
        exchange=ex.id,
        compaction=compaction,
    )
    return source, prefix, traj.meta


def _step_notes(traj: Any, after_step: int, chosen: Episode | None) -> list[tuple[str, str]]:
    """The warnings of steps 1..N, then the episode's own (``subagents_indistinct``)."""
    return [*step_notes(traj.steps, after_step), *([chosen.note] if chosen and chosen.note else [])]


def journal_episode(
    reader: Any,
    run_id: str,
    agent: str,
    episode: str | None,
    parsed: Callable[[Any, Conversation], None] | None = None,
) -> tuple[Any, Any, Episode | None]:
    """(classification, trajectory, episode) of the run's episode ``episode`` (None: the main
    one, no episode read): the classification's main chain is that episode's chain.
    ``parsed``: handed each request the chain rule parsed with its conversation
    (:func:`~pvisor.adapters.chains.classify_run`'s ``on_conversation``).
    ReplayBadInput ``unknown_episode`` for an id the run does not have."""
    from pvisor.adapters.chains import classify_run
    from pvisor.adapters.journal_trajectory import build_trajectory

    classification = classify_run(reader, run_id, prefer=descriptor(agent).chain_hint, on_conversation=parsed)
    traj = build_trajectory(reader, classification)
    if episode is None:
        return classification, traj, None
    # the parent calls by the ids the agent sent them back under (Gemini CLI makes its own for a
    # reply that gave none): the ids its native file holds too
    wired = build_trajectory(reader, classification, wire_ids=True).steps
    chosen = choose(journal_episodes(classification, wired, agent), episode, f"run {classification.run}")
    if chosen.id == MAIN:
        return classification, traj, chosen
    classification = journal_classification(classification, chosen)
    return classification, build_trajectory(reader, classification), chosen


def _journal_compaction(reader: Any, classified: ClassifiedRun, after_step: int) -> dict[str, Any] | None:
    """``prefix.compaction`` of a journal prefix: the last compaction of the main chain at or
    before N (a slot whose request carries a summary, docs/steps.md;
    :meth:`~pvisor.adapters.matcher.RecordedCompaction.record`), or None."""
    found = [c for c in classified.compactions(reader) if c.after_step <= after_step]
    return found[-1].record() if found else None


# --------------------------------------------------------------------------- native


def _task_message(
    protocol: str, task: str | None, context: list[str], profile_first: Message | None
) -> tuple[Message | None, str]:
    """The first user message and the origin of its context parts."""
    parts: list[Any] = []
    origin = "trajectory" if context else "absent"
    if not context and profile_first is not None:
        lead = [p for p in profile_first.parts if isinstance(p, TextPart)][:-1]
        if lead:
            parts.extend(copy.deepcopy(lead))
            origin = "profile"
    parts.extend(TextPart(t) for t in context)
    if task is not None:
        parts.append(TextPart(task))
    if not parts:
        return None, origin
    return Message("user", parts), origin


def _message_text(m: Message) -> list[str] | None:
    """The texts of a message made only of text parts, else None."""
    if not m.parts or not all(isinstance(p, TextPart) for p in m.parts):
        return None
    return [p.text for p in m.parts]


def _leading_messages(profile: Conversation, pieces: list[str]) -> list[Message] | None:
    """The task's context as the agent sends it when it sends several messages before its
    first reply (Codex: developer instructions, skills, environment context, each an item with
    its own role and id): the profile's leading text-only messages (before its first assistant
    message), when there are several and their text parts are as many as ``pieces`` (the
    file's texts, in order). Each message keeps the profile's role and, when its texts are the
    file's, its raw item (its id); otherwise it carries the file's texts alone. None when the
    profile's shape does not fit."""
    lead: list[Message] = []
    for m in profile.messages:
        if m.role == "assistant":
            break
        if _message_text(m) is None:
            return None
        lead.append(m)
    if len(lead) < 2 or sum(len(m.parts) for m in lead) != len(pieces):
        return None
    out, i = [], 0
    for m in lead:
        texts = pieces[i : i + len(m.parts)]
        i += len(m.parts)
        same = texts == _message_text(m)
        out.append(Message(m.role, [TextPart(t) for t in texts], raw=copy.deepcopy(m.raw) if same else None))
    return out


def native_conversation(
    agent: str,
    protocol: str,
    traj_task: str | None,
    traj_context: list[str],
    system: str | None,
    tools: list[ToolSpec] | None,
    model: str | None,
    steps: Sequence[Step],
    after_step: int,
    profile: Profile | None,
    notes: list[tuple[str, str]] | None = None,
    compaction: Compaction | None = None,
    last_observation: bool = True,
) -> tuple[Conversation, dict[str, str]]:
    """The conversation of the prefix and the origin of each part (module docstring); warnings
    ``(code, message)`` are appended to ``notes``. ``compaction``: the one in effect at
    ``after_step`` (:meth:`Trajectory.compaction_at`), whose history replaces the task and the
    steps up to its own. ``last_observation`` False: O_N is left out, the conversation ends at
    A_N (the agent's finish action, :func:`finish_at`: it never sent O_N).

    In steps: the leading messages and the system prompt (:func:`_native_lead`), the tools
    (:func:`_native_tools`), the request parameters (:func:`_native_params`), the opening
    messages (:func:`_native_opening`), steps 1..N (:func:`_native_steps`), and the reasoning a
    signed protocol would refuse left out."""
    d = descriptor(agent)
    mod = get_protocol(protocol)
    origin: dict[str, str] = {"messages": "trajectory"}
    pconv = profile.conversation if profile is not None else None
    conv = Conversation(protocol=protocol)
    lead = _native_lead(conv, origin, protocol, pconv, system, traj_context, traj_task, notes)
    _native_tools(conv, origin, protocol, d, pconv, tools, notes)
    _native_params(conv, origin, protocol, d, mod, pconv, model, notes)
    # the native file's own objects (``raw``) go to the descriptor's wire forms only when they
    # are of this protocol: in another, only the canonical fields mean anything
    native = protocol == d.native_raw_protocol
    names: dict[str, str] = {}  # call id -> tool name, of the calls so far

    def wire_message(m: Message) -> Message:
        return d.wire_message(protocol, m if native else plain_message(m))

    def wire_action(a: Action) -> Message:
        return d.wire_action(protocol, a if native else plain_action(a))

    def wire_result(r: ToolResult) -> ToolResult:
        return d.wire_result(protocol, r if native else plain(r), names)

    wire = (wire_message, wire_action, wire_result)
    _native_opening(conv, origin, protocol, d, lead, pconv, traj_task, traj_context, compaction, wire, names)
    _native_steps(conv, mod.RESULTS_ROLE, steps, after_step, compaction, last_observation, wire, names)
    conv.messages, dropped = without_unsigned_reasoning(protocol, conv.messages)
    if dropped and notes is not None:
        notes.append(
            (
                dropped[0].kind,
                f"{len(dropped)} reasoning block(s) of the native file have no {mod.TITLE} signature: "
                "left out",
            )
        )
    return conv, origin


def _native_lead(
    conv: Conversation,
    origin: dict[str, str],
    protocol: str,
    pconv: Conversation | None,
    system: str | None,
    traj_context: list[str],
    traj_task: str | None,
    notes: list[tuple[str, str]] | None,
) -> list[Message] | None:
    """:func:`native_conversation`'s first step: the profile's leading messages when it speaks
    ``protocol`` (returned, None otherwise) and the system prompt (``conv.system`` or the first
    leading message), with ``origin["system"]``."""
    same_protocol = pconv is not None and pconv.protocol == protocol
    lead = None
    system_in_messages = False
    if same_protocol and pconv is not None:
        # an agent that sends its system prompt as the first of several leading messages
        # (Codex: a developer item, no ``instructions``)
        first = pconv.messages[0] if pconv.messages else None
        as_message = (
            system is not None
            and pconv.system is None
            and first is not None
            and first.role in ("developer", "system")
        )
        pieces = (
            ([system] if as_message and system is not None else [])
            + list(traj_context)
            + ([traj_task] if traj_task is not None else [])
        )
        lead = _leading_messages(pconv, pieces)
        system_in_messages = lead is not None and as_message
    if system_in_messages and lead is not None and pconv is not None:
        origin["system"] = "trajectory"
        if lead[0].raw is None:
            # Codex 0.171 stores its whole base instructions (session_meta) but sends them
            # adjusted to the session (sections of tools it does not offer left out): the file
            # does not hold what was sent, the profile does
            lead[0] = copy.deepcopy(pconv.messages[0])
            origin["system"] = "profile"
            if notes is not None:
                notes.append(
                    (
                        "system_from_profile",
                        "the native file's system prompt differs from the one the agent sent in the "
                        "profile run; the profile's is used",
                    )
                )
    elif system is not None:
        conv.system, origin["system"] = system, "trajectory"
        if same_protocol and pconv is not None and pconv.system == system:
            conv.system_raw = copy.deepcopy(pconv.system_raw)  # the agent's own shape of the same text
    elif pconv is not None and pconv.system is not None:
        # the profile's system prompt exactly as sent when it speaks this protocol; else its
        # text, which the target protocol's render_request lays out in its own shape
        raw = copy.deepcopy(pconv.system_raw) if same_protocol else None
        conv.system, conv.system_raw, origin["system"] = pconv.system, raw, "profile"
    else:
        origin["system"] = "absent"
    return lead


def _native_tools(
    conv: Conversation,
    origin: dict[str, str],
    protocol: str,
    d: Any,
    pconv: Conversation | None,
    tools: list[ToolSpec] | None,
    notes: list[tuple[str, str]] | None,
) -> None:
    """:func:`native_conversation`'s tools: the file's (plain when they are of another protocol),
    else the profile's (converted to ``protocol``, what is dropped noted), with ``origin["tools"]``."""
    if tools is not None:
        conv.tools, origin["tools"] = list(tools), "trajectory"
        if (
            protocol != d.native_raw_protocol
        ):  # the file's own tool objects are no definition of this protocol
            conv.tools = [plain(t) for t in conv.tools]
    elif pconv is not None and pconv.tools:
        if pconv.protocol == protocol:
            conv.tools = copy.deepcopy(pconv.tools)
        else:
            conv.tools, dropped = convert_tools(pconv.protocol, protocol, pconv.tools)
            if notes is not None:
                notes.extend((c.kind, f"profile {c.detail}") for c in dropped)
        origin["tools"] = "profile" if conv.tools else "absent"
    else:
        origin["tools"] = "absent"


def _native_params(
    conv: Conversation,
    origin: dict[str, str],
    protocol: str,
    d: Any,
    mod: Any,
    pconv: Conversation | None,
    model: str | None,
    notes: list[tuple[str, str]] | None,
) -> None:
    """:func:`native_conversation`'s request parameters, stream flag and model: the profile's
    when it speaks ``protocol``, else the agent's defaults and what the API requires, with
    ``origin["params"]``."""
    if pconv is not None and pconv.protocol == protocol:
        conv.params, conv.stream, conv.model = copy.deepcopy(pconv.params), pconv.stream, pconv.model
        origin["params"] = "profile"
        if model is not None and d.wire_model(model) != pconv.model:
            conv.model = d.wire_model(model)
        return
    conv.model = d.wire_model(model)
    conv.stream = d.streams
    origin["params"] = "default"
    # what the API requires that the file does not say (no profile of this protocol)
    conv.params.update(mod.REQUIRED_PARAMS)
    if conv.model is None and not mod.MODEL_IN_PATH:  # a model in the path: native_request
        conv.model = MODEL_NOT_RECORDED
        if notes is not None:
            notes.append(
                (
                    "model_not_recorded",
                    f"the native file names no model: the prefix asks for {MODEL_NOT_RECORDED!r}; "
                    "give --profile-from, or set the model before sending it",
                )
            )


def _native_opening(
    conv: Conversation,
    origin: dict[str, str],
    protocol: str,
    d: Any,
    lead: list[Message] | None,
    pconv: Conversation | None,
    traj_task: str | None,
    traj_context: list[str],
    compaction: Compaction | None,
    wire: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
    names: dict[str, str],
) -> None:
    """:func:`native_conversation`'s opening messages, with ``origin["task_context"]``: the
    history a compaction replaced them with, else the leading messages, else the task message.
    ``wire``: the conversation's (message, action, result) wire forms; ``names`` gets the calls
    of the compacted history."""
    wire_message, _, wire_result = wire
    if compaction is not None:
        # the agent sends the history it compacted to in place of the task and the steps before
        # it (docs/native.md, "Compaction"); the leading messages it keeps are the descriptor's
        keep = d.compaction_keeps_lead(protocol)
        if keep and lead is not None:
            conv.messages.extend(lead[:keep])
        role = get_protocol(protocol).RESULTS_ROLE
        for m in compaction.history:
            names.update((p.id, p.name) for p in m.parts if isinstance(p, ToolCall) and p.id is not None)
            if m.parts and all(isinstance(p, ToolResult) for p in m.parts):
                # results of no protocol (a history read from another shape): as the agent sends
                # its results
                m = Message(role, [wire_result(p) for p in m.parts])  # type: ignore[arg-type]
            conv.messages.append(wire_message(m))
        origin["task_context"] = "trajectory"
    elif lead is not None:
        conv.messages.extend(lead)
        origin["task_context"] = "trajectory" if traj_context else "absent"
    else:
        profile_first = None
        if pconv is not None:
            profile_first = next((m for m in pconv.messages if m.role == "user"), None)
            if profile_first is not None and pconv.protocol != protocol:
                profile_first = texts_only(profile_first)  # texts only, not another protocol's blocks
        first, origin["task_context"] = _task_message(protocol, traj_task, traj_context, profile_first)
        if first is not None:
            conv.messages.append(first)


def _native_steps(
    conv: Conversation,
    role: str,
    steps: Sequence[Step],
    after_step: int,
    compaction: Compaction | None,
    last_observation: bool,
    wire: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
    names: dict[str, str],
) -> None:
    """:func:`native_conversation`'s steps 1..N: each action and its results (``role``: the
    protocol's role of results) and the messages of its observation, from the first step a
    compaction kept; O_N left out unless ``last_observation``. ``names`` gets each call."""
    wire_message, wire_action, wire_result = wire
    kept = compaction.first_kept if compaction is not None else 1
    for i in range(after_step):
        step = steps[i]
        names.update((c.id, c.name) for c in step.action.tool_calls if c.id is not None)
        obs = step.observation
        if i == after_step - 1 and not last_observation:
            obs = Observation()
        if (
            compaction is not None
            and compaction.kept_messages_from is not None
            and step.n == kept - 1
            and step.n != compaction.after_step
        ):
            # the prompt the kept steps answer
            conv.messages.extend(wire_message(m) for m in obs.messages[compaction.kept_messages_from :])
        if step.n >= kept:  # steps before it are in the history the agent compacted to
            msg = wire_action(step.action)
            if msg.parts:
                conv.messages.append(msg)
            if obs.results:
                conv.messages.append(Message(role, [wire_result(r) for r in obs.results]))
        if compaction is not None and step.n == compaction.after_step:
            # what the agent appended after the compaction (a prompt given after it)
            conv.messages.extend(wire_message(m) for m in obs.messages[compaction.messages_from :])
        elif step.n >= kept:
            conv.messages.extend(wire_message(m) for m in obs.messages)


#: the model of a render whose source names none (APIs require a model)
MODEL_NOT_RECORDED = "model-not-recorded"


def render_native(
    agent: str, conv: Conversation, key_order: list[str] | None = None
) -> tuple[bytes, int | None]:
    """The request body of ``conv`` as ``agent`` sends it: ``render_request`` of its protocol,
    then the agent's markers (Anthropic ``cache_control``, Gemini CLI signatures), then the
    top-level keys in ``key_order`` (the profile's body order; keys it lacks keep theirs, after
    it). Returns (body bytes, number of Anthropic cache breakpoints or None)."""
    mod = get_protocol(conv.protocol)
    try:
        body = mod.render_request(conv)
    except (TypeError, RecursionError) as exc:  # orjson: "Recursion limit reached" (nesting past 255)
        raise ReplayBadInput(
            "bad_source", f"the prefix cannot be rendered as {conv.protocol} JSON: {exc}"
        ) from None
    obj = None
    n = None
    d = descriptor(agent)
    if d.has_markers(conv.protocol):
        obj = orjson.loads(body)
        n = d.place_markers(conv.protocol, obj)
    if key_order:
        obj = obj if obj is not None else orjson.loads(body)
        rank = {k: i for i, k in enumerate(key_order)}
        keys = sorted(obj, key=lambda k: (rank.get(k, len(rank)), list(obj).index(k)))
        obj = {k: obj[k] for k in keys}
    return (dumps(obj) if obj is not None else body), n


def native_request(
    agent: str, protocol: str, model: str | None, stream: bool, profile: Profile | None
) -> tuple[dict[str, Any], str]:
    """prefix.request.json for a native render: the profile's request target and headers when
    it is of ``protocol``, else the protocol's default target. Returns (meta, origin)."""
    mod = get_protocol(protocol)
    if profile is not None and profile.conversation.protocol == protocol:
        meta = dict(profile.request)
        if model:
            meta["path"] = mod.path_for_model(meta["path"], model)
        return meta, "profile"
    method, path, query = mod.DEFAULT_TARGET if stream else mod.UNSTREAMED_TARGET
    if mod.MODEL_IN_PATH:
        path = path.format(model=model or "MODEL")
    query = descriptor(agent).request_query or query
    # pvisor's own header, nothing to redact (request_meta would load journal/redact.py for it)
    meta = {
        "method": method,
        "path": path,
        "query": query,
        "headers": {"content-type": "application/json"},
        "recorded_content_encoding": None,
    }
    return meta, "default"


def native_prefix(
    path: Path,
    agent: str,
    after_step: int,
    protocol: str | None,
    profile_spec: str | None,
    session: str | None = None,
    allow_damaged: bool = False,
    read: Any = None,
    episode: str | None = None,
) -> tuple[Source, Prefix]:
    """The prefix for ``--trajectory``: the native file read with the ``agent`` adapter and
    rendered (module docstring). ``read``: what reads the file, ``read_native``'s signature
    (a batch passes one that reads each file once). Raises UsageError (unknown adapter, missing file, bad
    ``--protocol``), ReplayBadInput (unreadable file ``bad_source``, ``no_steps``,
    ``after_step_out_of_range``, ``observation_not_recorded``, profile errors)."""
    source, traj, warnings = read_native_source(path, agent, session, read, episode)
    steps = source.steps
    try:
        read_from = episode_file(path, source.episode)  # the lines damaged are in that file
        check_damage(warnings, read_from, allow_damaged)
        check_cut_off(warnings, steps, after_step, read_from, allow_damaged)
        return _native_prefix(
            path, agent, after_step, protocol, profile_spec, traj, source.agent_version, source
        )
    except PvisorError as exc:
        attach_source(exc, [source])
        raise


def _native_prefix(
    path: Path,
    agent: str,
    after_step: int,
    protocol: str | None,
    profile_spec: str | None,
    traj: Any,
    version: str | None,
    source: Source,
) -> tuple[Source, Prefix]:
    steps = source.steps  # the steps native_prefix built once for this prefix
    ep = source.episode
    named = f" episode {ep.id}" if ep is not None and ep.id != MAIN else ""
    check_boundary(after_step, len(steps), show_path(path) + named)
    # the flags of steps 1..N, as for a journal source (those the reader already warned about
    # under the same code are not said twice)
    said = {code for code, _ in source.notes}
    source.notes.extend(n for n in step_notes(steps, after_step) if n[0] not in said)
    check_gaps(steps, after_step, episode_file(path, ep))
    finish = finish_at(descriptor(agent), steps, after_step)
    if finish is not None:
        source.notes.append(unsent_note(after_step, finish))
    # every call of A_1..A_N must have its recorded result: the prefix holds the results the
    # agent sent, and a result the file does not hold would be made up (the reader's empty
    # placeholder). Same rule at N = steps and below, but for the finish action's: never sent.
    unrecorded = unrecorded_calls(descriptor(agent), steps, after_step, native=True)
    if unrecorded:
        raise unrecorded_error(unrecorded, after_step, show_path(path), native=True)
    provider = traj.meta.get("provider")
    proto = choose_protocol(agent, protocol, traj.model, provider if isinstance(provider, str) else None)
    profile = None
    if profile_spec is not None:
        from .profile import load_profile  # here: only a --profile-from reads a capture

        profile, notes = load_profile(profile_spec, agent, version)
        source.notes.extend(notes)
    compaction = traj.compaction_at(after_step)
    if compaction is not None and not compaction.rebuilt:
        raise ReplayBadInput(
            "compaction_not_rebuilt",
            f"--after-step {after_step}: {show_path(path)} {compaction.where}: the agent replaced its "
            f"history after step {compaction.after_step} "
            f"({compaction.kind}) and the file does not hold what it sent instead; choose N < "
            f"{compaction.after_step}, or a journal run",
        )
    conv, origin = native_conversation(
        agent,
        proto,
        traj.task,
        list(traj.meta.get("task_context") or []),
        traj.system,
        traj.tools,
        traj.model,
        steps,
        after_step,
        profile,
        source.notes,
        compaction,
        last_observation=finish is None,
    )
    differs = descriptor(agent).compaction_differences(proto) if compaction is not None else None
    if differs is not None:
        source.notes.append(
            (
                "compaction_render_differs",
                f"the prefix starts from the compaction at {compaction.where}; {differs}",
            )
        )
    same_protocol = profile is not None and profile.conversation.protocol == proto
    body, _ = render_native(agent, conv, profile.key_order if same_protocol and profile is not None else None)
    source.notes.extend(render_problems(proto, body))
    request, origin["request"] = native_request(agent, proto, conv.model, conv.stream, profile)
    return source, Prefix(
        protocol=proto,
        body=body,
        request=request,
        rendered=True,
        origin=origin,
        exchange=profile.exchange if profile else None,
        compaction=compaction_record(compaction),
    )


#: problems of one render named in the result's warnings (the rest counted)
RENDER_PROBLEMS_SHOWN = 5


def render_problems(protocol: str, body: bytes) -> list[tuple[str, str]]:
    """Warnings ``render_refused`` for what the API of ``protocol`` would refuse in a rendered
    body (:func:`pvisor.adapters.protocols.validate.validate_request`): the first
    :data:`RENDER_PROBLEMS_SHOWN`, then their count. A render is never changed to hide one."""
    from pvisor.adapters.protocols.validate import validate_request

    problems = validate_request(protocol, orjson.loads(body))
    out = [
        ("render_refused", f"the {protocol} API would refuse prefix.json: {p}")
        for p in problems[:RENDER_PROBLEMS_SHOWN]
    ]
    if len(problems) > RENDER_PROBLEMS_SHOWN:
        out.append(
            (
                "render_refused",
                f"... and {len(problems) - RENDER_PROBLEMS_SHOWN} more problem(s) of the same render",
            )
        )
    return out


def compaction_record(c: Compaction | None) -> dict[str, Any] | None:
    """The result's ``prefix.compaction``: ``{after_step, kind, where, history_messages,
    summary_sha256}`` of the compaction the prefix starts from, or None."""
    if c is None:
        return None
    from pvisor.core.digest import sha256_hex

    summary = sha256_hex(c.summary.encode("utf-8", "surrogatepass")) if c.summary is not None else None
    return {
        "after_step": c.after_step,
        "kind": c.kind,
        "where": c.where,
        "history_messages": len(c.history),
        "summary_sha256": summary,
    }
