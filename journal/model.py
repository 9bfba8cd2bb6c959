"""The canonical model: runs, exchanges, conversations and trajectories.

Vocabulary follows the design reference: a **run** is one agent execution, an **attempt** one
try of it, an **exchange** one HTTP request/response between agent and model API. A
**trajectory** is the run read as steps: step *i* is action A_i (the i-th main-loop model
reply) with observation O_i (the tool results, or other user input, that the next main-loop
request appends after A_i).

Conversations (what a request body says) are protocol-neutral: the wire-protocol modules in
``pvisor.adapters.protocols`` parse bodies into :class:`Conversation` and render them back.
Every part keeps ``raw``, the provider's JSON object as it appeared, so nothing is lost.

Secret redaction (the header allow-list, secret names, key shapes and the forms a key is
echoed in) is :mod:`pvisor.journal.redact`; a run id is checked here with its key-shape test.

This module imports nothing of pvisor's but the journal's record base, lazy patterns and
redaction, and nothing outside the standard library.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any, Iterable, Literal, Sequence, Union
from pvisor.core.record import Record
from pvisor.core.lazyre import LazyPattern


# --------------------------------------------------------------------------- literals


ExchangeRole = Literal["main", "auxiliary"]

#: what a run id may be: letters, digits, ``.``, ``_`` and ``-``, at most 128, starting with a
#: letter or digit (a URL path segment of the gateway, a directory name under ``runs/``)
RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


#: the label (and its value) of a handoff's child run whose workspace ``restore_handoff`` is still
#: restoring (journal/child_runs.py sets it; the reader lists such a run ``restoring``)
RESTORING_LABEL = "handoff_restore"
RESTORING = "in_progress"
#: the labels of a handoff's child run naming the agent it was handed from and the agent it went to
#: (session/handoff_result.py files the child run under them)
HANDOFF_FROM_LABEL = "handoff_from_agent"
HANDOFF_TO_LABEL = "handoff_to_agent"
#: the keys of :func:`run_lineage`, in its order
LINEAGE_KEYS = (
    "mode",
    "parent_run",
    "boundary_step",
    "pause_transition",
    "workspace_snapshot",
    HANDOFF_FROM_LABEL,
    HANDOFF_TO_LABEL,
)


class RunMode(str, enum.Enum):
    """How a run came to be (``runs.mode``)."""

    CAPTURE = "capture"  #: recorded through the gateway (``pvisor run``, ``pvisor gateway``)
    IMPORT = "import"  #: read from elsewhere into the journal
    PREPARE_ONLY = "prepare-only"
    REPLAY_ONLY = "replay-only"  #: derived by replay: recorded actions served, tools re-run
    CONTINUATION = "continuation"  #: derived by replay, then the live model
    HANDOFF = "handoff"  #: a handoff's child run: created pending at a pause, then started once


#: the exchange flag of a response journaled only in part (``exchanges.flags``; docs/gateway.md,
#: "Response size"): past ``--max-response-body`` or the gateway's journal budget the agent
#: still got every byte, the journal keeps the first ones; ``bytes_received`` counts them all
TRUNCATED_FLAG = "truncated"
#: the exchange flag of an error response whose body did not decode at all (an unknown
#: ``Content-Encoding``, a coding label on other bytes): it is stored empty, never as it came,
#: since a key the upstream echoed in it would be hidden from redaction by the coding
UNDECODABLE_FLAG = "undecodable_dropped"
#: the step flag of a main-loop reply whose exchange is flagged :data:`TRUNCATED_FLAG`
#: (docs/steps.md): playback cannot serve it, nor prepare-only render A_N from it
RESPONSE_TRUNCATED = "response_truncated"

MessageRole = Literal["system", "developer", "user", "assistant", "tool"]

# --------------------------------------------------------------------------- runs and exchanges


class Run(Record, record=True):
    """One agent execution: captured, imported, or derived by replay.

    Fields:
        id: run id, a short string unique in the journal (``r-`` + 12 hex by default).
        agent: adapter name such as ``claude-code``, or None when unknown (bare gateway capture).
        agent_version: the agent's own version string, or None.
        argv: the command line that started the agent ([] when pvisor did not start it).
        created_ms: creation time, Unix epoch milliseconds.
        parent_run: for a derived run, the run it was replayed from; else None.
        boundary_step: for a derived run, the step N it continues after (steps kept); else None.
        mode: ``capture`` | ``import`` | ``prepare-only`` | ``replay-only`` | ``continuation`` |
            ``handoff``.
        labels: free-form string labels (session id, native trajectory path, workspace, ...).
        pause_transition: for a handoff's child run, the pause's transition (zero-based, the
            documents' numbering: ``boundary_step`` is K+1 after it, K before it); else None.
        workspace_snapshot: for a handoff's child run, the manifest digest of the workspace
            snapshot restored for it; else None.
    """

    id: str
    agent: str | None = None
    agent_version: str | None = None
    argv: list[str] = field(default_factory=list)
    created_ms: int = 0
    parent_run: str | None = None
    boundary_step: int | None = None
    mode: str = "capture"
    labels: dict[str, str] = field(default_factory=dict)
    pause_transition: int | None = None
    workspace_snapshot: str | None = None

    def __init__(
        self,
        id: str,
        agent: str | None = None,
        agent_version: str | None = None,
        argv: list[str] | None = None,
        created_ms: int = 0,
        parent_run: str | None = None,
        boundary_step: int | None = None,
        mode: str = "capture",
        labels: dict[str, str] | None = None,
        pause_transition: int | None = None,
        workspace_snapshot: str | None = None,
    ) -> None:
        self.id = id
        self.agent = agent
        self.agent_version = agent_version
        self.argv = [] if argv is None else argv
        self.created_ms = created_ms
        self.parent_run = parent_run
        self.boundary_step = boundary_step
        self.mode = mode
        self.labels = {} if labels is None else labels
        self.pause_transition = pause_transition
        self.workspace_snapshot = workspace_snapshot


def run_lineage(run: Run) -> dict[str, Any] | None:
    """The lineage of a derived run or a handoff's child run, as the exports and the report
    carry it (docs/exports.md): ``mode``, ``parent_run`` (None when it derives from a native
    file: its labels ``source_kind`` and ``source`` name that), ``boundary_step`` (steps kept),
    ``pause_transition`` (a handoff's: zero-based, None otherwise), ``workspace_snapshot`` (the
    manifest digest of the pause's snapshot, or None), ``handoff_from_agent`` and
    ``handoff_to_agent`` (a handoff's labels, else None). None for a run that derives from
    nothing (a capture, an import)."""
    mode = getattr(run.mode, "value", run.mode)
    if run.parent_run is None and run.boundary_step is None and mode != RunMode.HANDOFF.value:
        return None
    return {
        "mode": mode,
        "parent_run": run.parent_run,
        "boundary_step": run.boundary_step,
        "pause_transition": run.pause_transition,
        "workspace_snapshot": run.workspace_snapshot,
        HANDOFF_FROM_LABEL: run.labels.get(HANDOFF_FROM_LABEL),
        HANDOFF_TO_LABEL: run.labels.get(HANDOFF_TO_LABEL),
    }


class Attempt(Record, record=True):
    """One try of a run (attempt 1 is the first; a native resume is attempt 2, ...).

    Fields: run id; ``n`` (1-based); ``started_ms``/``ended_ms`` Unix epoch ms (ended None while
    running); ``exit_code`` of the agent process or None; ``labels`` (session id, native path).
    """

    run: str
    n: int = 1
    started_ms: int = 0
    ended_ms: int | None = None
    exit_code: int | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def __init__(
        self,
        run: str,
        n: int = 1,
        started_ms: int = 0,
        ended_ms: int | None = None,
        exit_code: int | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.run = run
        self.n = n
        self.started_ms = started_ms
        self.ended_ms = ended_ms
        self.exit_code = exit_code
        self.labels = {} if labels is None else labels


class Exchange(Record, record=True):
    """One recorded HTTP request/response between an agent and a model API.

    Fields:
        id: exchange id (``x-`` + 16 hex), unique in the journal.
        run, attempt: the run and attempt it belongs to.
        seq: order of arrival within the run (1-based).
        protocol: wire protocol module name (``anthropic``, ``openai-chat``, ``openai-responses``,
            ``gemini``) or None when the path matched none.
        method, path: HTTP method and path without the query string.
        query: the query string with secret values replaced (see :func:`redact_exchange_meta`).
        request_headers: allow-listed request headers, name lower-cased -> value.
        secret_fingerprints: secret header/query names -> 8-hex keyed fingerprint of the value.
        request_encoding: the request's ``Content-Encoding`` (undone before storage) or None.
        request_body: sha256 hex of the stored request body (decoded), or None (no body).
        request_bytes: length of the request body as received on the wire, in bytes (after
            ``journal scrub`` changed the body, its new stored length when it was the stored one).
        status: upstream HTTP status passed to the agent, or pvisor's own (502, 404, 413, 426).
        response_headers: response headers without secrets (``set-cookie`` removed).
        response_body: sha256 hex of the response bytes exactly as received, or None.
        response_final: sha256 hex of the reassembled final response (streams), or None.
        streamed: whether the response was an event stream.
        chunk_timings: packed ``<QI`` pairs (microseconds since ``started_ms``, chunk length in bytes).
        outcome: one of :data:`~pvisor.journal.exchange_end.OUTCOMES`.
        error: a short description of a failure (never contains a secret), or None.
        started_ms: Unix epoch ms when the request arrived.
        headers_us, first_byte_us, ended_us: microseconds after ``started_ms`` when the upstream
            response headers arrived, the first body byte arrived, and the exchange ended.
        bytes_received, bytes_delivered: response bytes read from upstream and written to the agent.
        chain: chain number within the run assigned by the chain rule, or None until derived.
        role: ``main`` or ``auxiliary`` by the chain rule, or None until derived.
        served_by: who produced the response: ``upstream``, ``scripted``, ``playback`` or
            ``refused`` (the gateway itself); None when recorded before schema 3.
        flags: strings such as ``synthetic_end`` (playback's reply that ended the agent).
        forwarded_body: sha256 of the bytes forwarded upstream when they differ from the
            request body (a continuation's boundary prompt, reasoning or model rewrite), else
            None (since schema 4).
        capture: how the gateway received it: ``reverse`` (at the gateway's own URL) or
            ``intercept`` (at the model API's host, through intercept mode's forward proxy;
            since schema 7) (:class:`~pvisor.journal.exchange_end.CaptureMode`).
    """

    id: str
    run: str
    attempt: int = 1
    seq: int = 0
    protocol: str | None = None
    method: str = "POST"
    path: str = "/"
    query: str = ""
    request_headers: dict[str, str] = field(default_factory=dict)
    secret_fingerprints: dict[str, str] = field(default_factory=dict)
    request_encoding: str | None = None
    request_body: str | None = None
    request_bytes: int = 0
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: str | None = None
    response_final: str | None = None
    streamed: bool = False
    chunk_timings: bytes = b""
    outcome: str = "ok"
    error: str | None = None
    started_ms: float = 0.0
    headers_us: int | None = None
    first_byte_us: int | None = None
    ended_us: int | None = None
    bytes_received: int = 0
    bytes_delivered: int = 0
    chain: int | None = None
    role: str | None = None
    served_by: str | None = None
    flags: tuple[str, ...] = ()
    forwarded_body: str | None = None
    capture: str = "reverse"

    def __init__(
        self,
        id: str,
        run: str,
        attempt: int = 1,
        seq: int = 0,
        protocol: str | None = None,
        method: str = "POST",
        path: str = "/",
        query: str = "",
        request_headers: dict[str, str] | None = None,
        secret_fingerprints: dict[str, str] | None = None,
        request_encoding: str | None = None,
        request_body: str | None = None,
        request_bytes: int = 0,
        status: int | None = None,
        response_headers: dict[str, str] | None = None,
        response_body: str | None = None,
        response_final: str | None = None,
        streamed: bool = False,
        chunk_timings: bytes = b"",
        outcome: str = "ok",
        error: str | None = None,
        started_ms: float = 0.0,
        headers_us: int | None = None,
        first_byte_us: int | None = None,
        ended_us: int | None = None,
        bytes_received: int = 0,
        bytes_delivered: int = 0,
        chain: int | None = None,
        role: str | None = None,
        served_by: str | None = None,
        flags: tuple[str, ...] = (),
        forwarded_body: str | None = None,
        capture: str = "reverse",
    ) -> None:
        self.id = id
        self.run = run
        self.attempt = attempt
        self.seq = seq
        self.protocol = protocol
        self.method = method
        self.path = path
        self.query = query
        self.request_headers = {} if request_headers is None else request_headers
        self.secret_fingerprints = {} if secret_fingerprints is None else secret_fingerprints
        self.request_encoding = request_encoding
        self.request_body = request_body
        self.request_bytes = request_bytes
        self.status = status
        self.response_headers = {} if response_headers is None else response_headers
        self.response_body = response_body
        self.response_final = response_final
        self.streamed = streamed
        self.chunk_timings = chunk_timings
        self.outcome = outcome
        self.error = error
        self.started_ms = started_ms
        self.headers_us = headers_us
        self.first_byte_us = first_byte_us
        self.ended_us = ended_us
        self.bytes_received = bytes_received
        self.bytes_delivered = bytes_delivered
        self.chain = chain
        self.role = role
        self.served_by = served_by
        self.flags = flags
        self.forwarded_body = forwarded_body
        self.capture = capture


def pack_timings(timings: Iterable[Sequence[int]] | bytes) -> bytes:
    """Pack (microseconds since exchange start, chunk length in bytes) pairs, or a flat list
    ``[t0, n0, t1, n1, ...]``, as little-endian ``<QI`` records, 12 bytes per chunk: the
    ``Exchange.chunk_timings`` format. Bytes pass as already packed."""
    if isinstance(timings, (bytes, bytearray)):
        return bytes(timings)
    import struct  # here: of the commands only capture and the journal's readers pack timings

    items = timings if isinstance(timings, list) else list(timings)
    if not items:
        return b""
    if not isinstance(items[0], (tuple, list)):  # flat [t0, n0, t1, n1, ...]: one pack call
        flat = items if all(type(v) is int for v in items) else [int(v) for v in items]
        return struct.pack("<" + "QI" * (len(flat) // 2), *flat[: len(flat) // 2 * 2])
    return b"".join(struct.pack("<QI", int(t), int(n)) for t, n in items)


def unpack_timings(packed: bytes | None) -> list[tuple[int, int]]:
    """Inverse of :func:`pack_timings`: [(µs since start, chunk length in bytes), ...]."""
    if not packed:
        return []
    import struct

    return [struct.unpack_from("<QI", packed, i) for i in range(0, len(packed) - len(packed) % 12, 12)]


# --------------------------------------------------------------------------- conversations


class TextPart(Record, record=True):
    """Plain text in a message. ``raw`` is the provider block (e.g. with ``cache_control``)."""

    text: str
    raw: Any = None

    def __init__(self, text: str, raw: Any = None) -> None:
        self.text = text
        self.raw = raw


class Reasoning(Record, record=True):
    """Model reasoning: visible ``text`` (thinking, summary), an opaque ``signature``
    (Anthropic ``signature``, Gemini ``thoughtSignature``) and ``encrypted`` content
    (Responses ``encrypted_content``, Anthropic ``redacted_thinking.data``). Echoed verbatim on replay."""

    text: str = ""
    signature: str | None = None
    encrypted: str | None = None
    raw: Any = None

    def __init__(
        self,
        text: str = "",
        signature: str | None = None,
        encrypted: str | None = None,
        raw: Any = None,
    ) -> None:
        self.text = text
        self.signature = signature
        self.encrypted = encrypted
        self.raw = raw


class ToolCall(Record, record=True):
    """A tool call made by the model.

    Fields:
        id: the call id (``toolu_...``, ``call_...``; Gemini's optional ``id``), or None.
        name: the tool name.
        arguments_raw: the arguments exactly as the protocol carries them: the JSON string of
            Chat Completions and Responses ``arguments``, the Responses ``custom_tool_call.input``
            text, or for protocols that carry an object (Anthropic ``input``, Gemini ``args``)
            its compact JSON serialisation.
        arguments: the parsed arguments (usually a dict); None when ``arguments_raw`` is not JSON.
        kind: ``function`` | ``custom`` (free-form input) | ``server`` (run by the provider).
        raw: the provider's block/item as it appeared.
    """

    id: str | None
    name: str
    arguments_raw: str
    arguments: Any = None
    kind: str = "function"
    raw: Any = None

    def __init__(
        self,
        id: str | None,
        name: str,
        arguments_raw: str,
        arguments: Any = None,
        kind: str = "function",
        raw: Any = None,
    ) -> None:
        self.id = id
        self.name = name
        self.arguments_raw = arguments_raw
        self.arguments = arguments
        self.kind = kind
        self.raw = raw


class ToolResult(Record, record=True):
    """The result of a tool call, as the agent sent it back.

    Fields:
        call_id: the id of the call it answers (None where the protocol has none).
        content: the exact result: a string, or the provider's list of content blocks.
        is_error: True/False where the protocol has a flag (Anthropic ``is_error``), else None.
        name: the tool name where the protocol repeats it (Gemini ``functionResponse.name``).
        raw: the provider's block/item/message as it appeared.
    """

    call_id: str | None
    content: Any
    is_error: bool | None = None
    name: str | None = None
    raw: Any = None

    def __init__(
        self,
        call_id: str | None,
        content: Any,
        is_error: bool | None = None,
        name: str | None = None,
        raw: Any = None,
    ) -> None:
        self.call_id = call_id
        self.content = content
        self.is_error = is_error
        self.name = name
        self.raw = raw


class OtherPart(Record, record=True):
    """A part the canonical model does not interpret (images, documents, unknown types); kept as ``raw``."""

    kind: str
    raw: Any = None

    def __init__(self, kind: str, raw: Any = None) -> None:
        self.kind = kind
        self.raw = raw


Part = Union[TextPart, Reasoning, ToolCall, ToolResult, OtherPart]


class Message(Record, record=True):
    """One conversation message: ``role`` and its ``parts`` in order; ``raw`` the provider object."""

    role: str
    parts: list[Part] = field(default_factory=list)
    raw: Any = None

    def __init__(self, role: str, parts: list[Part] | None = None, raw: Any = None) -> None:
        self.role = role
        self.parts = [] if parts is None else parts
        self.raw = raw


class ToolSpec(Record, record=True):
    """A tool definition as sent: ``name``, ``description``, JSON-Schema ``parameters``, ``raw``."""

    name: str
    description: str | None = None
    parameters: Any = None
    raw: Any = None

    def __init__(
        self,
        name: str,
        description: str | None = None,
        parameters: Any = None,
        raw: Any = None,
    ) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters
        self.raw = raw


class Conversation(Record, record=True):
    """A model request read protocol-neutrally.

    Fields:
        protocol: the wire protocol module name it was parsed with.
        model: the model name (from the body, or the path for Gemini), or None.
        system: the system prompt text (blocks joined with ``"\\n\\n"``), or None.
        system_raw: the system prompt exactly as sent (Anthropic ``system``, Gemini
            ``systemInstruction``, Responses ``instructions``, the leading Chat system messages).
        tools: tool definitions in order.
        messages: the conversation after the system prompt.
        stream: whether a streamed response was asked for.
        params: every other top-level body field, in body order (temperature, max_tokens, ...).
    """

    protocol: str
    model: str | None = None
    system: str | None = None
    system_raw: Any = None
    tools: list[ToolSpec] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    stream: bool = False
    params: dict[str, Any] = field(default_factory=dict)

    def __init__(
        self,
        protocol: str,
        model: str | None = None,
        system: str | None = None,
        system_raw: Any = None,
        tools: list[ToolSpec] | None = None,
        messages: list[Message] | None = None,
        stream: bool = False,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.protocol = protocol
        self.model = model
        self.system = system
        self.system_raw = system_raw
        self.tools = [] if tools is None else tools
        self.messages = [] if messages is None else messages
        self.stream = stream
        self.params = {} if params is None else params


# --------------------------------------------------------------------------- trajectories


class Action(Record, record=True):
    """A_i: one model reply of the main loop.

    Fields: ``text`` (visible text, blocks joined); ``reasoning``; ``tool_calls`` in order (one
    reply's parallel calls form one batch); ``usage`` (provider usage object, assigned from the
    final event, never summed); ``stop_reason``; ``model``; ``raw`` (the final response object).
    """

    text: str = ""
    reasoning: list[Reasoning] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    model: str | None = None
    raw: Any = None

    def __init__(
        self,
        text: str = "",
        reasoning: list[Reasoning] | None = None,
        tool_calls: list[ToolCall] | None = None,
        usage: dict[str, Any] | None = None,
        stop_reason: str | None = None,
        model: str | None = None,
        raw: Any = None,
    ) -> None:
        self.text = text
        self.reasoning = [] if reasoning is None else reasoning
        self.tool_calls = [] if tool_calls is None else tool_calls
        self.usage = usage
        self.stop_reason = stop_reason
        self.model = model
        self.raw = raw


class Observation(Record, record=True):
    """O_i: what the next main-loop request appends after A_i.

    ``results`` are tool results in call order; ``messages`` holds any other appended input
    (a format-error message, a user prompt). Empty when A_i made no tool call and nothing followed.
    """

    results: list[ToolResult] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def __init__(
        self,
        results: list[ToolResult] | None = None,
        messages: list[Message] | None = None,
    ) -> None:
        self.results = [] if results is None else results
        self.messages = [] if messages is None else messages


class Step(Record, record=True):
    """Step ``n`` (1-based) = action A_n with observation O_n; ``flags`` such as
    ``action_dropped_by_agent``; ``time_ms``: when the source says the reply was written, Unix
    epoch milliseconds (a native file's record of the reply, where its format has a time), else
    None (a journal run's times are its exchanges')."""

    n: int
    action: Action
    observation: Observation = field(default_factory=Observation)
    flags: list[str] = field(default_factory=list)
    time_ms: float | None = None

    def __init__(
        self,
        n: int,
        action: Action,
        observation: Observation | None = None,
        flags: list[str] | None = None,
        time_ms: float | None = None,
    ) -> None:
        self.n = n
        self.action = action
        self.observation = Observation() if observation is None else observation
        self.flags = [] if flags is None else flags
        self.time_ms = time_ms


class LeftOut(Record, record=True):
    """A record not taken into the trajectory: ``where`` (line number or id), ``kind``, ``reason``."""

    where: str
    kind: str
    reason: str

    def __init__(self, where: str, kind: str, reason: str) -> None:
        self.where = where
        self.kind = kind
        self.reason = reason


class Compaction(Record, record=True):
    """The agent replaced its history by a summary (compaction, compression) after step
    ``after_step``: from request ``after_step + 1`` on it sends ``history`` in place of the task,
    its context and steps 1..after_step (results of step ``after_step`` included), then the
    observation messages of step ``after_step`` from index ``messages_from`` on (what it
    appended after the compaction: a later prompt), then the later steps as usual. An agent
    that keeps its latest steps verbatim after the summary (Claude Code) gives ``steps_from``:
    steps ``steps_from``..``after_step`` are sent after ``history`` in full (actions and
    results), not replaced.

    Fields: ``after_step`` (>= 0; 0: before the first action); ``history`` (messages in the order
    sent; ``raw`` in the agent's wire shape where the source stores it); ``kind`` (the record it
    was read from, such as ``compact_boundary``, ``compacted``, ``chat_compression``,
    ``compaction``); ``where``
    (``line 12``, a part id); ``summary`` (the summary text, when the record holds it);
    ``messages_from``; ``steps_from`` (None: ``after_step + 1``, nothing kept);
    ``kept_messages_from``: with ``steps_from``, the index of the first observation message of
    step ``steps_from - 1`` that is kept too (the prompt the kept steps answer), or None;
    ``rebuilt``: False when the source records that the agent replaced its history but not with
    what (``history`` is then empty): a prefix after it cannot be made.
    """

    after_step: int
    history: list[Message]
    kind: str
    where: str
    summary: str | None = None
    messages_from: int = 0
    steps_from: int | None = None
    kept_messages_from: int | None = None
    rebuilt: bool = True

    def __init__(
        self,
        after_step: int,
        history: list[Message],
        kind: str,
        where: str,
        summary: str | None = None,
        messages_from: int = 0,
        steps_from: int | None = None,
        kept_messages_from: int | None = None,
        rebuilt: bool = True,
    ) -> None:
        self.after_step = after_step
        self.history = history
        self.kind = kind
        self.where = where
        self.summary = summary
        self.messages_from = messages_from
        self.steps_from = steps_from
        self.kept_messages_from = kept_messages_from
        self.rebuilt = rebuilt

    @property
    def first_kept(self) -> int:
        """The first step sent after the history in full."""
        return self.steps_from if self.steps_from is not None else self.after_step + 1


class Trajectory(Record, record=True):
    """A run read as steps.

    Fields: ``task`` (the first user input); ``steps``; ``system`` prompt text and ``tools`` as
    sent (None when the source does not store them); ``model``; ``left_out`` records; ``meta``;
    ``compactions`` in step order (:class:`Compaction`: where the agent replaced its history).
    """

    task: str | None = None
    steps: list[Step] = field(default_factory=list)
    system: str | None = None
    tools: list[ToolSpec] | None = None
    model: str | None = None
    left_out: list[LeftOut] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    compactions: list[Compaction] = field(default_factory=list)

    def __init__(
        self,
        task: str | None = None,
        steps: list[Step] | None = None,
        system: str | None = None,
        tools: list[ToolSpec] | None = None,
        model: str | None = None,
        left_out: list[LeftOut] | None = None,
        meta: dict[str, Any] | None = None,
        compactions: list[Compaction] | None = None,
    ) -> None:
        self.task = task
        self.steps = [] if steps is None else steps
        self.system = system
        self.tools = tools
        self.model = model
        self.left_out = [] if left_out is None else left_out
        self.meta = {} if meta is None else meta
        self.compactions = [] if compactions is None else compactions

    def compaction_at(self, after_step: int) -> Compaction | None:
        """The compaction in effect at the request after step ``after_step``: the last one
        whose ``after_step`` is at most it, or None."""
        found = None
        for c in self.compactions:
            if c.after_step <= after_step:
                found = c
        return found


# --------------------------------------------------------------------------- run ids

_RUN_ID = LazyPattern(RUN_ID_PATTERN)


def is_run_id(value: object) -> bool:
    """Whether ``value`` is a str of :data:`RUN_ID_PATTERN` that holds no key-shaped token (a key
    is never a run id: it would be stored, exported and logged as one)."""
    if not isinstance(value, str) or _RUN_ID.fullmatch(value) is None:
        return False
    # loaded here: the model is on every short command's path, the key shapes only on this one's
    from .redact import has_key_shape

    return not has_key_shape(value)
