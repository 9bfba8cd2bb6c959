"""The contract every wire-protocol module satisfies, structurally: :class:`WireProtocol` (its
facts as constants, its functions) and :data:`WIRE_PROTOCOL_MEMBERS`, the names a module must
have (docs/layout.md, "Extension points"; tests/test_protocol_registry.py checks every module of
``PROTOCOL_MODULES`` against it).

A module of its own, not a part of :mod:`.base`: nothing at run time reads the contract (a
protocol module is found by name in ``PROTOCOL_MODULES``), and a runtime-checkable
``typing.Protocol`` with some forty members costs 0.4 million instructions to make, which
every ``replay --prepare-only`` would pay for :mod:`.base` (bench/startup_bench.py).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

from pvisor.journal.model import Action, Conversation, ToolSpec

from .base import Reassembled, TokenUsage


@runtime_checkable
class WireProtocol(Protocol):
    """What every wire-protocol module exposes (the contract; a module satisfies it
    structurally). Request bodies are bytes or a parsed JSON object (``orjson.loads``); final
    response objects are the provider's own shape, the one a non-streamed request returns.

    Facts (constants):

    - ``NAME``: the protocol name stored in the journal (``anthropic``, ``openai-chat``,
      ``openai-responses``, ``gemini``); ``TITLE``: its name in sentences (``Anthropic``).
    - ``GEN_AI_PROVIDER``: ``gen_ai.provider.name`` of the OpenTelemetry GenAI conventions;
      ``GEN_AI_OPERATION`` their ``gen_ai.operation.name`` of a model call (``chat``, Gemini's
      ``generate_content``).
    - ``CALL_ID_PREFIX``: the prefix of the tool call ids its replies carry (``toolu_``).
    - ``PATHS``: the exact paths it serves, as documented patterns.
    - ``DEFAULT_TARGET``: ``(method, path, query)`` of a streamed request when nothing recorded
      says it (a native render without a profile); ``UNSTREAMED_TARGET`` the same for a request
      that asks for no stream. A path holding ``{model}`` takes the model (``MODEL_IN_PATH``).
    - ``MODEL_IN_PATH``: the request names its model in the path, not in the body (Gemini).
    - ``ENTRIES_KEY``: the body key holding the conversation entries (``messages``,
      ``input``, ``contents``).
    - ``RESULTS_ROLE``: the role of the message carrying tool results (``user``, ``tool``).
    - ``TOOL_SCHEMA_REQUIRED``: a function tool must carry a parameter schema (an empty object
      schema is written for one that takes none).
    - ``REQUIRED_PARAMS``: body parameters the API requires that a conversation need not say,
      with the value a render without a profile sends (Anthropic ``max_tokens``).
    - ``SIGNED_REASONING``: a reasoning block is accepted only with its own signature (or
      encrypted content) from this provider: reasoning of another protocol cannot be sent.
    - ``CACHE_MARKERS``: its clients put prompt-cache markers into a request body (Anthropic
      ``cache_control``), placed by ``place_cache_markers``.
    - ``PROMPT_CACHE``: how the provider's prompt cache reuses an earlier request's prompt, with
      its source (:mod:`pvisor.adapters.request_diff`, ``pvisor diff``): ``rule``
      (``breakpoints``: up to a cache marker of A before the first change that a marker of B
      reaches within ``lookback_blocks`` content blocks; ``increments``: the
      common prefix in ``increment_tokens``; ``prefix``: the common prefix, undocumented further),
      ``marker`` (the block key of a breakpoint, or None), ``min_tokens``, ``increment_tokens``,
      ``lookback_blocks`` (the ``breakpoints`` rule's: how far back a breakpoint finds an entry),
      ``messages_invalidated_by`` (top-level parameters whose change drops the messages' cache,
      tools and system kept), ``messages_invalidated_by_blocks`` (block types likewise),
      ``usage_field`` (where a reply reports its cached tokens) and ``source`` (the documentation).
    - ``TOKEN_COUNT_FIELD``: the field of a token-count response (``input_tokens``,
      ``totalTokens``), None for a protocol without one
      (:func:`pvisor.adapters.protocols.replies.token_count_reply`).
    - ``CREDENTIAL_HEADERS``: the lower-case names of the headers a request carries its key in
      (``x-api-key``, ``authorization`` with a ``Bearer`` scheme, ``x-goog-api-key``);
      ``CREDENTIAL_QUERY`` the query parameters (Gemini ``key``): where the gateway puts the
      real key in place of the agent's dummy (:mod:`pvisor.gateway.credentials`).
    """

    NAME: str
    TITLE: str
    GEN_AI_PROVIDER: str
    GEN_AI_OPERATION: str
    CALL_ID_PREFIX: str
    PATHS: tuple[str, ...]
    DEFAULT_TARGET: tuple[str, str, str]
    UNSTREAMED_TARGET: tuple[str, str, str]
    MODEL_IN_PATH: bool
    ENTRIES_KEY: str
    RESULTS_ROLE: str
    TOOL_SCHEMA_REQUIRED: bool
    REQUIRED_PARAMS: Mapping[str, Any]
    SIGNED_REASONING: bool
    CACHE_MARKERS: bool
    PROMPT_CACHE: Mapping[str, Any]
    TOKEN_COUNT_FIELD: str | None
    CREDENTIAL_HEADERS: tuple[str, ...]
    CREDENTIAL_QUERY: tuple[str, ...]

    def matches(self, path: str) -> bool:
        """Whether a request path (no query string) is one of ``PATHS``."""

    def wants_stream(self, path: str, query: Any, body: Any) -> bool:
        """Whether the request asks for an event stream."""

    def counts_tokens(self, path: str) -> bool:
        """Whether the path asks for a token count rather than a reply (Anthropic
        ``/v1/messages/count_tokens``, Gemini ``:countTokens``): such requests carry a
        conversation but are never main-loop requests."""

    def parse_request(self, body: Any, *, path: str = "", query: str = "", memo: Any = None) -> Conversation:
        """A request body (bytes or a parsed dict) as the canonical :class:`Conversation`.
        Raises :class:`~pvisor.core.errors.BadInputError`, naming the protocol, for a body
        that is not a JSON object or whose shape it cannot read; never any other exception
        (every module wraps it with :func:`request_parser`)."""

    def normalise(self, conv: Conversation) -> dict:
        """The comparison form of the chain rule (:func:`normalise_conversation`)."""

    def reassemble(self, chunks: Iterable[bytes]) -> Reassembled:
        """A raw streamed response (byte chunks, any split) as the final response object."""

    def render_stream(self, final: dict) -> bytes:
        """A final response object as the provider's event stream."""

    def response_to_action(self, final: dict) -> Action:
        """A final response object read as an action."""

    def action_to_response(self, action: Action, *, model: str | None = None, ids: Any = None) -> dict:
        """An action as a final response object (``ids``: an :class:`IdSource`)."""

    def render_request(self, conv: Conversation) -> bytes:
        """A conversation as a request body (compact JSON)."""

    def error_body(self, status: int, message: str, kind: Any = None) -> bytes:
        """The provider's JSON error shape."""

    def reply_problem(self, final: Any) -> str | None:
        """Why a final response object (status 2xx) carries no reply at all (Chat ``choices``
        null or empty, no Anthropic ``content``, no Responses ``output``, no Gemini candidate),
        else None. An empty reply (``content: []``) is a reply."""

    def entries(self, obj: dict) -> list:
        """The conversation list of a parsed body (Anthropic and Chat ``messages``, Responses
        ``input``, a string input as one user message item, Gemini ``contents``); [] when
        missing. Rewrites below are pure: the input is never changed, what changes is copied
        (shallow copies along the changed path) and returned."""

    def insert_user_text(self, obj: dict, at: int, text: str) -> dict:
        """The body with a user turn holding ``text`` right after the first ``at`` entries, in
        the form the live API accepts (appended to a user entry ``at - 1`` where the protocol
        merges turns). ValueError for ``at`` out of range or no text."""

    def strip_reasoning(self, obj: dict, served: set[str], path: str) -> tuple[dict, str, list[dict]]:
        """The body without the reasoning of replies the live upstream did not produce,
        ``served`` holding their :meth:`reasoning_keys` (a signed block another model, account
        or script made is refused by the live model). Returns ``(obj, path, rewrites)``, each
        rewrite ``{"entry": index in entries or None, "kind": str, "detail": one sentence}``."""

    def reasoning_keys(self, final: dict) -> set[str]:
        """The keys of a final response object's reasoning (``sig:``, ``data:``, ``id:``,
        ``enc:`` + the opaque value), which :meth:`strip_reasoning` finds again."""

    def with_model(self, obj: dict, path: str, model: str) -> tuple[dict, str, dict | None]:
        """The request asking for ``model`` (in the body, or the Gemini path); rewrite
        ``{"from": old, "to": model}``, None when it already does."""

    def path_for_model(self, path: str, model: str) -> str:
        """A recorded request path (no query) asking for ``model`` where the path names it
        (``MODEL_IN_PATH``); ``path`` unchanged otherwise or when it names no model."""

    def reasoning_refusal(self, status: int, body: bytes) -> str | None:
        """The provider's message (at most :data:`REFUSAL_MAX` characters) when a 4xx JSON
        error response says reasoning or a signature was refused."""

    def offered_tools(self, conv: Conversation) -> list[ToolSpec]:
        """The tools a request offers the model."""

    def tool_kind(self, spec: ToolSpec) -> str:
        """What kind of tool a definition is (a function the agent runs, or the provider's)."""

    def converted_tool_raw(self, tool: ToolSpec) -> dict | None:
        """The ``raw`` definition a function tool of another protocol gets when rendered in
        this one (``tool.raw`` is the other protocol's), for what the canonical fields cannot
        carry (Responses ``strict``); None when the canonical fields say everything."""

    def cache_breakpoints(self, body: bytes) -> int | None:
        """The number of prompt-cache breakpoints in a request body (a JSON object; Anthropic
        ``cache_control`` blocks), or None for a protocol without them (the body unread)."""

    def place_cache_markers(self, body: dict[str, Any]) -> int | None:
        """Put prompt-cache markers into a parsed request body (in place) the way the protocol's
        recorded clients do; the number the body then holds, or None for a protocol without
        them (the body unchanged)."""

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """A reply's usage object (its own field names) as :class:`TokenUsage`: the OpenTelemetry
        GenAI counts, every input token in ``input_tokens``; all None for no usage."""


#: the members of :class:`WireProtocol`, constants and functions (what a module must have)
WIRE_PROTOCOL_MEMBERS: tuple[str, ...] = tuple(
    sorted(
        {*WireProtocol.__annotations__}
        | {k for k, v in vars(WireProtocol).items() if callable(v) and not k.startswith("_")}
    )
)
