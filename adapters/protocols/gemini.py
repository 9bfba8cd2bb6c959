"""Google Gemini API (``/v1beta/models/{model}:{method}`` and ``/v1/models/{model}:{method}``),
the protocol Gemini CLI speaks with an API key.

Implements the wire-protocol module contract of :mod:`pvisor.adapters.protocols.base`.
Sources: python-genai ``_api_client.py`` (SSE and bare-JSON stream
lines, ``{"error": ...}`` objects), ``types.py`` (Content, Part, FunctionCall, FunctionResponse,
GenerateContentResponse), gemini-cli ``code_assist/converter.ts`` (the ``{"response": ...,
"traceId": ...}`` envelope), vercel/ai stream fixtures (chunk shapes, ``thoughtSignature`` on the
last text part or on the ``functionCall`` part), and the Gemini CLI 0.61 requests in
``corpus/requests/gemini-cli-0.61.0.jsonl``.

How a request body maps to the canonical :class:`~pvisor.journal.model.Conversation`:

- ``model`` comes from the path (``parse_request(body, path=...)``); a body ``model`` field (Code
  Assist) stays in ``params``. ``stream`` is True for ``:streamGenerateContent``.
- ``systemInstruction`` -> ``system_raw`` exactly; ``system`` = its text parts joined with a blank line.
- ``tools[]``: each ``functionDeclarations[]`` entry -> ToolSpec (``parameters`` =
  ``parametersJsonSchema`` or ``parameters``); any other tool kind (``googleSearch``,
  ``codeExecution``, ...) -> ToolSpec named after its key with the ``{key: value}`` object as
  ``raw`` and no parameters.
- ``contents[]`` -> one Message each; role ``model`` -> ``assistant``, ``user`` stays ``user``
  (also for contents of ``functionResponse`` parts: that is the role Gemini gives them).
- Parts: ``text`` -> TextPart; ``text`` with ``thought: true`` -> Reasoning (signature =
  ``thoughtSignature``); ``functionCall`` -> ToolCall (``id`` = the optional ``id``,
  ``arguments_raw`` = compact JSON of ``args``); ``functionResponse`` -> ToolResult (``name``,
  ``call_id`` = the optional ``id``, ``content`` = the ``response`` object); a part carrying only
  a ``thoughtSignature`` -> Reasoning with empty text; anything else -> OtherPart. A
  ``thoughtSignature`` on a text or ``functionCall`` part stays in that part's ``raw``.
- Every other top-level field (``generationConfig``, ``toolConfig``, ``safetySettings``, ...)
  -> ``params``, as sent.
- The API reads every field in camelCase or snake_case (``system_instruction``,
  ``function_declarations``, ``parameters_json_schema``, ``function_call``, ``inline_data``,
  ``thought_signature``, ...; python-genai sends ``parameters_json_schema`` as the user gave
  it). Both spellings are read alike; ``raw`` keeps what was sent, the kind of an OtherPart and
  the name of a non-function tool are the camelCase name (``inlineData``, ``googleSearch``).

Rendering (:func:`render_request`) works from canonical fields alone and uses ``raw`` only while
it still says what the canonical fields say (a content whose raw re-parses to the same parts is
emitted verbatim; otherwise each part overlays its canonical fields onto a copy of its raw part,
keeping extras such as ``thoughtSignature``). What it renders is camelCase, also from a
snake_case ``raw``.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Iterable


from pvisor.adapters.protocols.base import (
    as_list,
    check_insert,
    compact_json,
    count_sum,
    dig,
    dumps,
    field_state,
    first_int,
    IdSource,
    json_type,
    loads_json,
    loads_object,
    no_cache_breakpoints,
    no_cache_markers,
    no_converted_tool_raw,
    normalise_conversation,
    parse_arguments,
    ParseMemo,
    read_entries,
    Reassembled,
    refusal_message,
    request_parser,
    same_parts,
    short,
    strip_volatile,
    TokenUsage,
)
from pvisor.journal.model import (
    Action,
    Conversation,
    Message,
    OtherPart,
    Part,
    Reasoning,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)

NAME = "gemini"
#: ``gen_ai.provider.name`` of the OpenTelemetry GenAI semantic conventions (exports: otel)
GEN_AI_PROVIDER = "gcp.gemini"
#: ``gen_ai.operation.name`` of a model call (the conventions' value for ``generateContent``)
GEN_AI_OPERATION = "generate_content"
#: the prefix of a tool call id this protocol's replies carry (a handoff names its calls with it)
CALL_ID_PREFIX = ""
#: Exact request paths served, ``{model}`` being one path segment (``gemini-2.5-pro``).
PATHS: tuple[str, ...] = tuple(
    f"/{version}/models/{{model}}:{method}"
    for version in ("v1beta", "v1")
    for method in ("generateContent", "streamGenerateContent", "countTokens")
)
#: the wire-protocol facts (:class:`~pvisor.adapters.protocols.contract.WireProtocol` says what each
#: means)
TITLE = "Gemini"
#: the model is a path segment (:data:`MODEL_IN_PATH`): ``{model}`` takes it
DEFAULT_TARGET = ("POST", "/v1beta/models/{model}:streamGenerateContent", "alt=sse")
UNSTREAMED_TARGET = ("POST", "/v1beta/models/{model}:generateContent", "")
MODEL_IN_PATH = True
ENTRIES_KEY = "contents"
RESULTS_ROLE = "user"
#: a tool turn takes ``inlineData`` parts (a handoff keeps an image B's re-run reads); thought
#: signatures sit on the model's own parts (no ``STANDALONE_REASONING``)
TOOL_RESULT_IMAGES = True
TOOL_SCHEMA_REQUIRED = False  # no ``parameters``: the function takes none
REQUIRED_PARAMS: dict[str, Any] = {}
SIGNED_REASONING = False
converted_tool_raw = no_converted_tool_raw
cache_breakpoints = no_cache_breakpoints
CACHE_MARKERS = False
#: how the prompt cache reuses an earlier request's prompt (``pvisor diff``,
#: :mod:`pvisor.adapters.request_diff`): implicit caching, on by default for Gemini 2.5 and
#: later, reuses a common prefix of a recent request past a minimum of 1,024 to 4,096 tokens by
#: model (https://ai.google.dev/gemini-api/docs/caching); its granularity is not documented, so
#: pvisor's figure is always an estimate of the common prefix past the lowest minimum; the
#: cached count is the reply's ``usageMetadata.cachedContentTokenCount``
PROMPT_CACHE: dict[str, Any] = {
    "rule": "prefix",
    "marker": None,
    "min_tokens": 1024,
    "increment_tokens": None,
    "usage_field": "cachedContentTokenCount",
    "source": "https://ai.google.dev/gemini-api/docs/caching",
}
#: where a request carries its credential: the ``x-goog-api-key`` header (python-genai
#: ``_api_client.py``, Gemini CLI) or the ``?key=`` query parameter (the REST reference's
#: examples)
CREDENTIAL_HEADERS: tuple[str, ...] = ("x-goog-api-key",)
CREDENTIAL_QUERY: tuple[str, ...] = ("key",)
place_cache_markers = no_cache_markers

_PATH_RE = re.compile(r"^/(v1beta|v1)/models/([^/:]+):(generateContent|streamGenerateContent|countTokens)$")

#: The thoughtSignature Gemini CLI puts on a functionCall part whose reply had none (docs/agents.md).
SKIP_SIGNATURE = "skip_thought_signature_validator"

# keys of a part that describe it rather than carry its data
_PART_META = frozenset({"thought", "thoughtSignature", "partMetadata", "videoMetadata", "mediaResolution"})
_PLAIN_TEXT_KEYS = frozenset({"text", "thought", "thoughtSignature"})
_FINISH_REASONS = frozenset(
    {
        "FINISH_REASON_UNSPECIFIED",
        "STOP",
        "MAX_TOKENS",
        "SAFETY",
        "RECITATION",
        "LANGUAGE",
        "OTHER",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "MALFORMED_FUNCTION_CALL",
        "IMAGE_SAFETY",
        "UNEXPECTED_TOOL_CALL",
    }
)
#: characters per text piece when :func:`render_stream` splits a text part over chunks
_PIECE = 200


# --------------------------------------------------------------------------- paths


def parse_path(path: str) -> tuple[str, str] | None:
    """``(model, method)`` of a Gemini path (no query string), or None when it is not one."""
    m = _PATH_RE.match(path)
    return (m.group(2), m.group(3)) if m else None


def matches(path: str) -> bool:
    """True for ``/v1beta|v1/models/{model}:generateContent|streamGenerateContent|countTokens``."""
    return _PATH_RE.match(path) is not None


def counts_tokens(path: str) -> bool:
    """True for ``:countTokens``: a request that carries a conversation but asks for a token
    count, not a reply (the chain rule leaves it out of every chain)."""
    parsed = parse_path(path)
    return parsed is not None and parsed[1] == "countTokens"


def wants_stream(path: str, query: Any, body: Any) -> bool:
    """True for ``:streamGenerateContent``: it streams whether or not ``alt=sse`` is given
    (without it the reply is a JSON array sent in pieces; the Gemini API's streaming reference)."""
    parsed = parse_path(path)
    return parsed is not None and parsed[1] == "streamGenerateContent"


# --------------------------------------------------------------------------- request parsing


@functools.lru_cache(maxsize=256)
def _camel(key: str) -> str:
    """``function_call`` -> ``functionCall``: the camelCase spelling of a field name (the API
    reads both; camelCase names pass unchanged)."""
    if "_" not in key:
        return key
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


@functools.lru_cache(maxsize=256)
def _snake(key: str) -> str:
    """``functionCall`` -> ``function_call``."""
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _field(d: dict, name: str) -> Any:
    """``d[name]`` for a camelCase ``name``, else its snake_case spelling; None when neither."""
    value = d.get(name)
    return d.get(_snake(name)) if value is None else value


def _camel_keys(d: dict) -> dict:
    """``d`` with its keys in camelCase (the same object when they are already)."""
    return {_camel(k): v for k, v in d.items()} if any("_" in k for k in d) else d


def _part(p: Any) -> Part:
    """The canonical part of one Gemini ``Part`` object (mapping: module docstring)."""
    if not isinstance(p, dict):
        return OtherPart("invalid_part", raw=p)
    sig = _field(p, "thoughtSignature")
    sig = sig if isinstance(sig, str) else None
    if isinstance(p.get("text"), str):
        if p.get("thought") is True:
            return Reasoning(p["text"], sig, None, raw=p)
        return TextPart(p["text"], raw=p)
    fc = _field(p, "functionCall")
    if isinstance(fc, dict):
        args = fc.get("args", {})
        fid = fc.get("id") if isinstance(fc.get("id"), str) else None
        return ToolCall(fid, str(fc.get("name", "")), compact_json(args), args, "function", raw=p)
    fr = _field(p, "functionResponse")
    if isinstance(fr, dict):
        fid = fr.get("id") if isinstance(fr.get("id"), str) else None
        name = fr.get("name") if isinstance(fr.get("name"), str) else None
        return ToolResult(fid, fr.get("response"), None, name, raw=p)
    data_keys = [k for k in p if _camel(k) not in _PART_META]
    if not data_keys and sig is not None:
        return Reasoning("", sig, None, raw=p)
    return OtherPart(_camel(data_keys[0]) if data_keys else "empty", raw=p)


def _message(c: Any) -> Message:
    if not isinstance(c, dict):
        return Message("user", [OtherPart("invalid_content", raw=c)], raw=c)
    role = c.get("role")
    mrole = "assistant" if role == "model" else role if isinstance(role, str) else "user"
    return Message(mrole, [_part(p) for p in as_list(c.get("parts"))], raw=c)


def _system_text(value: Any) -> str | None:
    """Text of a ``systemInstruction`` (a Content, a list of parts, or a string)."""
    if isinstance(value, str):
        return value
    parts = value.get("parts") if isinstance(value, dict) else value
    if not isinstance(parts, list):
        return None
    return "\n\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def _tool_specs(tools: list) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for tool in tools:
        if not isinstance(tool, dict):
            specs.append(ToolSpec("", None, None, raw=tool))
            continue
        for key, value in tool.items():
            if _camel(key) == "functionDeclarations" and isinstance(value, list):
                for decl in value:
                    if isinstance(decl, dict):
                        params = next(
                            (
                                decl[k]
                                for k in ("parametersJsonSchema", "parameters_json_schema", "parameters")
                                if k in decl
                            ),
                            None,
                        )
                        desc = decl.get("description") if isinstance(decl.get("description"), str) else None
                        specs.append(ToolSpec(str(decl.get("name", "")), desc, params, raw=decl))
                    else:
                        specs.append(ToolSpec("", None, None, raw=decl))
            else:
                specs.append(ToolSpec(_camel(key), None, None, raw={key: value}))
    return specs


@request_parser("Gemini")
def parse_request(
    body: Any, *, path: str = "", query: Any = "", memo: ParseMemo | None = None
) -> Conversation:
    """Read a Gemini request body (bytes, str or parsed dict) into a Conversation.

    ``path`` gives the model and whether a stream is asked for. Mapping: module docstring.
    ``memo``: a :class:`~pvisor.adapters.protocols.base.ParseMemo` shared by the requests of one
    session (a content read before is not read again). Raises BadInputError when the body is not
    a JSON object."""
    obj = loads_object(body, "Gemini request body")
    conv = Conversation(protocol=NAME)
    parsed = parse_path(path)
    if parsed is not None:
        conv.model = parsed[0]
        conv.stream = parsed[1] == "streamGenerateContent"
    elif isinstance(obj.get("model"), str):
        conv.model = obj["model"]
    for key, value in obj.items():
        name = _camel(key)
        if name == "contents" and isinstance(value, list) and value:
            conv.messages = read_entries(memo, value, lambda c, i: _message(c))
        elif name == "systemInstruction" and value is not None and _system_text(value) is not None:
            conv.system_raw = value
            conv.system = _system_text(value)
        elif name == "tools" and isinstance(value, list) and value:
            conv.tools = _tool_specs(value)
        else:
            conv.params[key] = value
    return conv


# --------------------------------------------------------------------------- normalise


def _is_declaration(t: ToolSpec) -> bool:
    """A function declaration (raw with a ``name``, or no raw); other tool kinds and malformed
    entries keep their raw object."""
    return t.raw is None or (isinstance(t.raw, dict) and "name" in t.raw)


def _comparable_parts(parts: list) -> list:
    """Parts as the chain rule sees them: reasoning without text (a bare thoughtSignature, which
    Gemini CLI adds or drops at will) left out, and a functionResponse repeated with the same
    call id, name and response in one content (Gemini CLI after a resume) kept once."""
    out: list = []
    seen: list[ToolResult] = []
    for p in parts:
        if isinstance(p, Reasoning) and not p.text:
            continue
        if isinstance(p, ToolResult) and p.call_id is not None:
            if any(s.call_id == p.call_id and s.name == p.name and s.content == p.content for s in seen):
                continue
            seen.append(p)
        out.append(p)
    return out


def normalise(conv: Conversation) -> dict:
    """The chain rule's comparison form for Gemini (base ``normalise_conversation`` with
    ``keep_call_ids=False``: Gemini CLI invents ``functionCall.id`` such as
    ``run_shell_command_<ms>_0``).

    Agent habits it absorbs (docs/agents.md): the ``thoughtSignature`` Gemini CLI adds
    (``skip_thought_signature_validator``) or drops after a resume compares equal to any other
    signature or none (signatures are never compared, and a part that is only a signature
    compares as absent); two identical ``functionResponse`` parts for one call id count once.
    Tools that are not function declarations compare by their whole object."""
    msgs = [Message(m.role, _comparable_parts(m.parts)) for m in conv.messages]
    view = Conversation(protocol=conv.protocol, system=conv.system, tools=conv.tools, messages=msgs)
    out = normalise_conversation(view, keep_call_ids=False)
    for spec, norm in zip(conv.tools, out["tools"]):
        if not _is_declaration(spec):
            norm["parameters"] = strip_volatile(spec.raw)
    return out


# --------------------------------------------------------------------------- render request


def _args_object(tc: ToolCall) -> dict:
    """``functionCall.args`` must be an object: the parsed arguments, else ``{"input": raw}``."""
    args = tc.arguments if tc.arguments is not None else parse_arguments(tc.arguments_raw)
    return args if isinstance(args, dict) else {"input": tc.arguments_raw if args is None else args}


def _render_part(p: Part, names: dict) -> Any:
    # a Gemini part never has "type": raw from another protocol (Anthropic, OpenAI blocks) is not reused
    raw = _camel_keys(p.raw) if isinstance(p.raw, dict) and "type" not in p.raw else None
    if isinstance(p, TextPart):
        d = (
            dict(raw)
            if raw is not None and isinstance(raw.get("text"), str) and raw.get("thought") is not True
            else {}
        )
        d["text"] = p.text
        return d
    if isinstance(p, Reasoning):
        if raw is None:
            d = {"text": p.text, "thought": True}
        else:
            d = dict(raw)
            if "text" in d or p.text:
                d["text"] = p.text
                d["thought"] = True
        if p.signature is not None:
            d["thoughtSignature"] = p.signature
        else:
            d.pop("thoughtSignature", None)
        return d
    if isinstance(p, ToolCall):
        d = dict(raw) if raw is not None and isinstance(raw.get("functionCall"), dict) else {}
        old = d.get("functionCall")
        old = _camel_keys(old) if old is not None else None
        args = _args_object(p)
        if old is None:
            fc: dict[str, Any] = {}
            if p.id is not None:
                fc["id"] = p.id
            fc["args"] = args
            fc["name"] = p.name
        else:
            fc = dict(old)
            fc["name"] = p.name
            if "args" in fc or args:
                fc["args"] = args
            if p.id is not None:
                fc["id"] = p.id
            else:
                fc.pop("id", None)
        d["functionCall"] = fc
        return d
    if isinstance(p, ToolResult):
        d = dict(raw) if raw is not None and isinstance(raw.get("functionResponse"), dict) else {}
        old = d.get("functionResponse")
        old = _camel_keys(old) if old is not None else None
        fr: dict[str, Any] = dict(old) if old is not None else {}
        fr["name"] = p.name if p.name is not None else names.get(p.call_id, "")
        if p.content is not None or "response" in fr or old is None:
            fr["response"] = p.content if isinstance(p.content, dict) else {"output": p.content}
        if p.call_id is not None:
            fr["id"] = p.call_id
        else:
            fr.pop("id", None)
        d["functionResponse"] = fr
        return d
    if isinstance(p, OtherPart):
        return p.raw if p.raw is not None else {}
    raise TypeError(f"not a canonical part: {p!r}")


def _render_content(msg: Message, names: dict) -> Any:
    raw = msg.raw if isinstance(msg.raw, dict) else None
    if msg.raw is not None:
        again = _message(msg.raw)
        if again.role == msg.role and same_parts(again.parts, msg.parts):
            return msg.raw
    role = "model" if msg.role == "assistant" else "user"
    c: dict[str, Any] = {"parts": [_render_part(p, names) for p in msg.parts]}
    # a Content is only parts and role; keep a role the original Gemini content left out
    if not (raw is not None and "parts" in raw and "role" not in raw and role == "user"):
        c["role"] = role
    return c


_DECLARATION_KEYS = frozenset(
    {
        "name",
        "description",
        "parameters",
        "parametersJsonSchema",
        "response",
        "responseJsonSchema",
        "behavior",
    }
)


def _render_declaration(t: ToolSpec) -> dict:
    # raw is reused only when it is a FunctionDeclaration (not another protocol's tool definition)
    raw = _camel_keys(t.raw) if isinstance(t.raw, dict) else None
    reuse = raw is not None and raw.keys() <= _DECLARATION_KEYS
    d: dict[str, Any] = dict(raw) if reuse else {}
    d["name"] = t.name
    if t.description is not None:
        d["description"] = t.description
    elif d.get("description") is not None:
        del d["description"]
    key = "parameters" if "parameters" in d and "parametersJsonSchema" not in d else "parametersJsonSchema"
    if t.parameters is not None:
        d[key] = t.parameters
    else:
        d.pop(key, None)
    return d


def _render_tools(tools: list[ToolSpec]) -> list:
    """Consecutive function declarations share one Tool object; other kinds are Tool objects of
    their own (how Gemini CLI sends them: one Tool with all declarations)."""
    out: list = []
    decls: list | None = None
    for t in tools:
        if _is_declaration(t):
            if decls is None:
                decls = []
                out.append({"functionDeclarations": decls})
            decls.append(_render_declaration(t))
        else:
            decls = None
            out.append(_camel_keys(t.raw) if isinstance(t.raw, dict) else t.raw)
    return out


def render_request(conv: Conversation) -> bytes:
    """A Conversation as a Gemini request body (compact JSON bytes; the model goes in the path).

    Key order: ``contents``, ``systemInstruction``, ``tools``, then ``params`` in their order
    (Gemini CLI 0.61's order, so an unchanged Gemini CLI body renders byte-identical).
    ``systemInstruction`` is ``system_raw`` while its text equals ``system``, else
    ``{"parts":[{"text": system}],"role":"user"}``. Function declarations are rendered with
    ``parametersJsonSchema`` (JSON Schema, as Gemini CLI sends them) unless their raw used
    ``parameters``. A functionResponse without a name takes the name of the call it answers."""
    names = {
        p.id: p.name for m in conv.messages for p in m.parts if isinstance(p, ToolCall) and p.id is not None
    }
    out: dict[str, Any] = {}
    if conv.messages:
        out["contents"] = [_render_content(m, names) for m in conv.messages]
    if isinstance(conv.system_raw, dict) and _system_text(conv.system_raw) == conv.system:
        out["systemInstruction"] = conv.system_raw
    elif conv.system:
        out["systemInstruction"] = {"parts": [{"text": conv.system}], "role": "user"}
    if conv.tools:
        out["tools"] = _render_tools(conv.tools)
    for k, v in conv.params.items():
        if k not in out:
            out[k] = v
    return dumps(out)


# --------------------------------------------------------------------------- reassembly


def _mergeable(prev: Any, part: Any) -> bool:
    """Whether a streamed text part continues the previous one: both plain text of the same kind
    (thought or not), and the previous part not yet closed by a ``thoughtSignature``."""
    return (
        isinstance(prev, dict)
        and isinstance(part, dict)
        and prev.keys() <= _PLAIN_TEXT_KEYS
        and part.keys() <= _PLAIN_TEXT_KEYS
        and isinstance(prev.get("text"), str)
        and isinstance(part.get("text"), str)
        and bool(prev.get("thought")) == bool(part.get("thought"))
        and "thoughtSignature" not in prev
    )


class _Merger:
    """State of one Gemini stream being reassembled (rules: :func:`reassemble`)."""

    def __init__(self) -> None:
        self.top: dict[str, Any] = {}
        self.cands: dict[int, dict] = {}
        self.complete = False
        self.error: Any = None
        self.problems: list[str] = []
        self.events = 0

    def payload(self, text: str, where: str) -> None:
        self.events += 1
        try:
            obj = loads_json(text)
        except ValueError:
            self.problems.append(f"{where} {self.events}: not JSON: {short(text)!r}")
            return
        if isinstance(obj, list):  # one data line holding an array of responses
            for o in obj:
                self.chunk(o, where)
            return
        self.chunk(obj, where)

    def chunk(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            self.problems.append(f"{where} {self.events}: a JSON {json_type(obj)}, expected an object")
            return
        if "error" in obj and "candidates" not in obj:
            if self.error is None:
                self.error = obj
            else:
                self.problems.append(f"another error object: {short(obj.get('error'))}")
            return
        if isinstance(obj.get("response"), dict) and "candidates" not in obj and "usageMetadata" not in obj:
            obj = obj["response"]  # Code Assist envelope {"response": {...}, "traceId": ...}
        for key, value in obj.items():
            if key == "candidates":
                self.top.setdefault("candidates", None)
                if isinstance(value, list):
                    for pos, cand in enumerate(value):
                        self.candidate(pos, cand)
                else:
                    self.problems.append(f"candidates is a JSON {json_type(value)}, expected an array")
            else:
                self.top[key] = value  # usageMetadata is cumulative: the last one wins
                if key == "promptFeedback" and isinstance(value, dict) and value.get("blockReason"):
                    self.complete = True

    def candidate(self, pos: int, cand: Any) -> None:
        if not isinstance(cand, dict):
            self.problems.append(f"candidate {pos} is not an object")
            return
        idx = cand.get("index")
        idx = idx if isinstance(idx, int) and not isinstance(idx, bool) else pos
        st = self.cands.setdefault(idx, {})
        for key, value in cand.items():
            if key == "content" and isinstance(value, dict):
                content = st.get("content")
                if not isinstance(content, dict):
                    content = st["content"] = {}
                for ck, cv in value.items():
                    if ck == "parts" and isinstance(cv, list):
                        parts = content.get("parts")
                        if not isinstance(parts, list):
                            parts = content["parts"] = []
                        for j, part in enumerate(cv):
                            # only a chunk's first part can continue the previous chunk's last part
                            if j == 0 and parts and _mergeable(parts[-1], part):
                                merged = dict(parts[-1])
                                merged["text"] = parts[-1]["text"] + part["text"]
                                merged.update((k, v) for k, v in part.items() if k != "text")
                                parts[-1] = merged
                            else:
                                parts.append(part)
                    else:
                        content[ck] = cv
            else:
                st[key] = value
                if key == "finishReason" and value:
                    self.complete = True

    def result(self) -> Reassembled:
        final: dict | None = None
        if self.top or self.cands:
            final = {}
            for key, value in self.top.items():
                final[key] = [self.cands[i] for i in sorted(self.cands)] if key == "candidates" else value
        return Reassembled(
            final=final, complete=self.complete, events=self.events, error=self.error, problems=self.problems
        )


def reassemble(chunks: Iterable[bytes]) -> Reassembled:
    """A raw Gemini stream (byte chunks, any split) into the final GenerateContentResponse.

    Accepted framings: SSE ``data: <GenerateContentResponse>`` events (``alt=sse``, any line
    ends); bare JSON objects outside ``data:`` lines, brace-balanced and possibly over several
    lines (python-genai; an ``{"error": ...}`` object becomes ``Reassembled.error``); the JSON
    array of ``streamGenerateContent`` without ``alt=sse``; the Code Assist envelope
    ``{"response": {...}, "traceId": ...}`` (``.response`` is unwrapped, ``traceId`` dropped).

    Merge rules (google-genai's streamed response handling): per candidate ``index`` (list position
    when absent), parts are appended in order; the first part of a chunk is concatenated onto the
    previous chunk's last part when both are plain text of the same kind (thought or not) and the
    previous one carries no ``thoughtSignature`` (so a signature stays on the text part that carried it);
    ``functionCall`` parts arrive whole; other candidate fields (``finishReason``,
    ``safetyRatings``, ...) and top-level fields (``usageMetadata``, cumulative; ``modelVersion``,
    ``responseId``) are assigned, the last value winning. There is no terminal event: ``complete``
    means a candidate had a ``finishReason`` (or the prompt was blocked). Never raises on bad
    data: unparsable payloads and stray text become ``problems``."""
    # the stream code is off the request-only path (replay --prepare-only): sse loads here
    from pvisor.adapters.protocols.sse import BareJson, events

    merger = _Merger()
    bare = BareJson()
    for ev in events(chunks):
        for line in ev.stray:
            objs, junk = bare.feed(line + "\n")
            if junk.strip():
                merger.problems.append(f"non-JSON text outside data lines ignored: {short(line)!r}")
            for text in objs:
                merger.payload(text, "bare JSON")
        if ev.has_data:
            merger.payload(ev.data, "event")
    if bare.depth:
        merger.problems.append(
            f"unterminated JSON at the end of the stream ({len(''.join(bare.buf))} characters)"
        )
    return merger.result()


# --------------------------------------------------------------------------- render stream


def _pieces(part: Any) -> list:
    """A plain text part split into pieces that :func:`reassemble` joins back (signature on the
    last piece); any other part as one piece."""
    if not (isinstance(part, dict) and part.keys() <= _PLAIN_TEXT_KEYS and isinstance(part.get("text"), str)):
        return [part]
    text = part["text"]
    if len(text) < 2:
        return [part]
    n = max(2, math.ceil(len(text) / _PIECE))
    size = math.ceil(len(text) / n)
    extra = {"thought": part["thought"]} if "thought" in part else {}
    pieces = [{"text": text[i : i + size], **extra} for i in range(0, len(text), size)]
    if "thoughtSignature" in part:
        pieces[-1]["thoughtSignature"] = part["thoughtSignature"]
    return pieces


def _chunk_parts(parts: list) -> list[list]:
    """Parts grouped into chunks: each piece starts a new chunk unless it begins a new part that
    would wrongly continue the previous one, in which case it shares the previous chunk."""
    groups: list[list] = []
    for part in parts:
        for k, piece in enumerate(_pieces(part)):
            if groups and k == 0 and _mergeable(groups[-1][-1], piece):
                groups[-1].append(piece)
            else:
                groups.append([piece])
    return groups


def stream_chunks(final: dict) -> list[dict]:
    """The GenerateContentResponse chunks :func:`render_stream` sends for ``final``: per
    candidate, text split into pieces and other parts one per chunk; candidate fields such as
    ``finishReason`` on its last chunk; top-level fields (``usageMetadata``, ``modelVersion``,
    ``responseId``) on every chunk. Candidates without a unique ``index`` go out as one chunk."""
    cands = final.get("candidates")
    top = {k: v for k, v in final.items() if k != "candidates"}
    if (
        not isinstance(cands, list)
        or not cands
        or not all(isinstance(c, dict) and isinstance(c.get("index"), int) for c in cands)
        or len({c["index"] for c in cands}) != len(cands)
    ):
        return [final]
    chunks: list[dict] = []
    for cand in cands:
        content = cand.get("content")
        rest = {k: v for k, v in cand.items() if k not in ("content", "index")}
        if not (isinstance(content, dict) and isinstance(content.get("parts"), list) and content["parts"]):
            chunks.append({"candidates": [cand], **top})
            continue
        cextra = {k: v for k, v in content.items() if k != "parts"}
        groups = _chunk_parts(content["parts"])
        for gi, group in enumerate(groups):
            c: dict[str, Any] = {"content": {"parts": group, **cextra}}
            if gi == len(groups) - 1:
                c.update(rest)
            c["index"] = cand["index"]
            chunks.append({"candidates": [c], **top})
    return chunks


def render_stream(final: dict, *, eol: bytes = b"\r\n") -> bytes:
    """A final GenerateContentResponse as an ``alt=sse`` stream: ``data: <chunk>`` events
    (:func:`stream_chunks`) ended by a blank line (``eol`` twice; CRLF by default, the framing
    the corpus uses). :func:`reassemble` of the result gives ``final`` back."""
    from pvisor.adapters.protocols.sse import encode_event  # off the request-only path

    return b"".join(encode_event(dumps(c), eol=eol) for c in stream_chunks(final))


# --------------------------------------------------------------------------- actions


def _unwrap(final: Any) -> Any:
    if isinstance(final, dict) and isinstance(final.get("response"), dict) and "candidates" not in final:
        return final["response"]
    return final


def response_to_action(final: dict) -> Action:
    """Read a GenerateContentResponse (or a Code Assist envelope) as an Action, from the
    candidate with the lowest index: ``text`` = non-thought text parts concatenated;
    ``reasoning`` = thought parts (text, ``thoughtSignature``), plus an empty-text Reasoning for a
    signature carried by a plain text part (so it can be echoed); ``tool_calls`` = functionCall
    parts in order (``arguments_raw`` = compact JSON of ``args``; the part, with any signature, in
    ``raw``); ``usage`` = ``usageMetadata``; ``stop_reason`` = ``finishReason``; ``model`` =
    ``modelVersion``; ``raw`` = ``final``."""
    action = Action(raw=final)
    obj = _unwrap(final)
    if not isinstance(obj, dict):
        return action
    cands = [c for c in as_list(obj.get("candidates")) if isinstance(c, dict)]
    if cands:
        cand = min(cands, key=lambda c: c.get("index") if isinstance(c.get("index"), int) else 0)
        content = cand.get("content") if isinstance(cand.get("content"), dict) else {}
        texts: list[str] = []
        for raw_part in as_list(content.get("parts")):
            p = _part(raw_part)
            if isinstance(p, TextPart):
                texts.append(p.text)
                sig = _field(raw_part, "thoughtSignature")
                if isinstance(sig, str):
                    action.reasoning.append(Reasoning("", sig, None, raw=raw_part))
            elif isinstance(p, Reasoning):
                action.reasoning.append(p)
            elif isinstance(p, ToolCall):
                action.tool_calls.append(p)
        action.text = "".join(texts)
        fr = cand.get("finishReason")
        action.stop_reason = fr if isinstance(fr, str) else None
    usage = obj.get("usageMetadata")
    action.usage = usage if isinstance(usage, dict) else None
    mv = obj.get("modelVersion")
    action.model = mv if isinstance(mv, str) else None
    return action


def gemini_usage(usage: Any) -> dict | None:
    """A usage object in the ``usageMetadata`` shape: a Gemini one as is; Anthropic, Chat
    Completions and Responses usages converted (``candidatesTokenCount`` excludes reasoning
    tokens, which go to ``thoughtsTokenCount``); None for anything else."""
    if not isinstance(usage, dict):
        return None
    if usage.keys() & {"promptTokenCount", "candidatesTokenCount", "totalTokenCount"}:
        return usage
    inp = first_int(usage.get("input_tokens"), usage.get("prompt_tokens"))
    out = first_int(usage.get("output_tokens"), usage.get("completion_tokens"))
    if inp is None and out is None:
        return None
    inp, out = inp or 0, out or 0
    reasoning = (
        first_int(
            dig(usage, "output_tokens_details", "reasoning_tokens"),
            dig(usage, "completion_tokens_details", "reasoning_tokens"),
        )
        or 0
    )
    cached = first_int(
        usage.get("cache_read_input_tokens"),
        dig(usage, "input_tokens_details", "cached_tokens"),
        dig(usage, "prompt_tokens_details", "cached_tokens"),
    )
    total = first_int(usage.get("total_tokens"))
    d: dict[str, Any] = {
        "promptTokenCount": inp,
        "candidatesTokenCount": max(out - reasoning, 0),
        "totalTokenCount": total if total is not None else inp + out,
    }
    if reasoning:
        d["thoughtsTokenCount"] = reasoning
    if cached:
        d["cachedContentTokenCount"] = cached
    return d


def _finish_reason(stop: str | None) -> str:
    if stop in _FINISH_REASONS:
        return stop  # type: ignore[return-value]
    if stop in ("max_tokens", "length", "incomplete", "max_output_tokens"):
        return "MAX_TOKENS"
    return "STOP"


def action_to_response(action: Action, *, model: str | None, ids: IdSource) -> dict:
    """An Action as a GenerateContentResponse (one candidate, index 0, role ``model``).

    Parts in order: one ``{"text", "thought": true, "thoughtSignature"?}`` per Reasoning with
    text; the text (if any); one ``functionCall`` part per tool call (``args`` = the parsed
    arguments, ``{"input": arguments_raw}`` when they are not an object; ``id`` only when the call
    has one; the ``thoughtSignature`` of its raw Gemini part, if any). A Reasoning with only a
    signature puts it on the last text part, else on the first functionCall part without one,
    else on an empty text part. ``finishReason`` = the stop reason when it is a Gemini value,
    ``MAX_TOKENS`` for a cut reply, else ``STOP``; ``usageMetadata`` = :func:`gemini_usage`;
    ``modelVersion`` = ``model``; ``responseId`` from ``ids``."""
    parts: list[dict] = []
    loose: list[str] = []
    for r in action.reasoning:
        if r.text:
            part: dict[str, Any] = {"text": r.text, "thought": True}
            if r.signature is not None:
                part["thoughtSignature"] = r.signature
            parts.append(part)
        elif r.signature is not None:
            loose.append(r.signature)
    text_part = None
    if action.text:
        text_part = {"text": action.text}
        parts.append(text_part)
    calls: list[dict] = []
    for tc in action.tool_calls:
        if tc.kind == "server":
            continue
        fc: dict[str, Any] = {"name": tc.name, "args": _args_object(tc)}
        if tc.id is not None:
            fc["id"] = tc.id
        part = {"functionCall": fc}
        sig = tc.raw.get("thoughtSignature") if isinstance(tc.raw, dict) else None
        if isinstance(sig, str):
            part["thoughtSignature"] = sig
        calls.append(part)
    parts.extend(calls)
    for sig in loose:
        target = text_part if text_part is not None and "thoughtSignature" not in text_part else None
        if target is None:
            target = next((c for c in calls if "thoughtSignature" not in c), None)
        if target is None:
            parts.append({"text": "", "thoughtSignature": sig})
        else:
            target["thoughtSignature"] = sig
    resp: dict[str, Any] = {
        "candidates": [
            {
                "content": {"parts": parts, "role": "model"},
                "finishReason": _finish_reason(action.stop_reason),
                "index": 0,
            }
        ]
    }
    usage = gemini_usage(action.usage)
    if usage is not None:
        resp["usageMetadata"] = usage
    resp["modelVersion"] = model if model is not None else (action.model or "")
    resp["responseId"] = ids.next("")
    return resp


def reply_problem(final: Any) -> str | None:
    """Why a GenerateContentResponse (or a Code Assist envelope) carries no reply at all: no
    candidate (a blocked prompt says its ``promptFeedback.blockReason``). None when it has one."""
    obj = _unwrap(final)
    if not isinstance(obj, dict):
        return f"the response is a JSON {json_type(obj)}, expected an object"
    cands = obj.get("candidates")
    if isinstance(cands, list) and any(isinstance(c, dict) for c in cands):
        return None
    block = dig(obj, "promptFeedback", "blockReason")
    if isinstance(block, str):
        return f"the response holds no reply: the prompt was blocked ({block})"
    return f"the response holds no reply: {field_state(obj, 'candidates')}"


def error_body(status: int, message: str, kind: str = "INVALID_ARGUMENT") -> bytes:
    """The Google API error shape ``{"error":{"code": status,"message": ...,"status": kind}}``
    (``kind`` a canonical status name such as ``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``)."""
    if not kind.isupper():
        # pvisor's own kinds (upstream_unreachable, pvisor_no_route) go in the message; the
        # status field keeps a canonical name (google.rpc.Code) for the HTTP status
        message = f"{kind}: {message}"
        kind = _STATUS_NAMES.get(status, "UNKNOWN" if status < 500 else "INTERNAL")
    return dumps({"error": {"code": status, "message": message, "status": kind}})


_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    426: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


# --------------------------------------------------------------------------- rewrites

#: Phrases of the API's 400 ``INVALID_ARGUMENT`` messages saying that the thought signatures a
#: request carries were refused, matched case-insensitively. Where each was seen, quoted from
#: the API's error body in public issue threads:
_REFUSALS = re.compile(
    "|".join(
        (
            # "Function call is missing a thought_signature in functionCall parts. This is required
            # for tools to work correctly, ...": lbjlaq/Antigravity-Manager#139,
            # lbjlaq/Antigravity-Manager#3229, manthanabc/paws#103, csells/dartantic#86
            r"missing a thought_signature",
            # "Corrupted thought signature." (a signature another model or account made):
            # google-gemini/gemini-cli#13467, charmbracelet/crush#1698, openclaw/openclaw#23771
            r"corrupted thought signature",
            # Vertex AI: "Unable to submit request because Thought signature is not valid.":
            # decolua/9router#301
            r"thought signature is not valid",
        )
    ),
    re.IGNORECASE,
)


def entries(obj: dict) -> list:
    """The conversation of a parsed Gemini request body: its ``contents`` list (a new list of the
    body's own Content objects); [] when it is missing or not a list."""
    contents = obj.get("contents")
    return list(contents) if isinstance(contents, list) else []


def _is_user(content: Any) -> bool:
    """A Content of role ``user``; a Content without a role counts as one, as :func:`parse_request`
    reads it (the API's default for a request content)."""
    return isinstance(content, dict) and content.get("role") in (None, "user")


def insert_user_text(obj: dict, at: int, text: str) -> dict:
    """A copy of a parsed Gemini request body with a user turn holding ``text`` right after the
    first ``at`` contents (``0 <= at <= len(entries(obj))``).

    When content ``at - 1`` is a ``user`` content (also one holding ``functionResponse`` parts,
    the role Gemini CLI gives them), ``{"text": text}`` is appended to its ``parts``; otherwise
    ``{"role": "user", "parts": [{"text": text}]}`` is inserted at index ``at``. Raises
    ValueError for ``at`` out of range or an empty ``text``."""
    contents = entries(obj)
    check_insert(at, len(contents), text)
    prev = contents[at - 1] if at > 0 else None
    if _is_user(prev):
        parts = prev.get("parts")
        parts = parts if isinstance(parts, list) else []
        contents[at - 1] = {**prev, "parts": [*parts, {"text": text}]}
    else:
        contents.insert(at, {"role": "user", "parts": [{"text": text}]})
    return {**obj, "contents": contents}


def _signature_key(part: Any) -> str | None:
    """The key holding a part's thought signature (``thoughtSignature``, or the snake_case
    ``thought_signature`` the API also reads) when it holds a string, else None."""
    if isinstance(part, dict):
        for key in ("thoughtSignature", "thought_signature"):
            if isinstance(part.get(key), str):
                return key
    return None


def reasoning_keys(final: dict) -> set[str]:
    """The reasoning keys of a final GenerateContentResponse (or a Code Assist envelope):
    ``"sig:" + thoughtSignature`` of every part of every candidate that carries one (on a thought
    part, a ``functionCall`` part or the last text part). :data:`SKIP_SIGNATURE` is no
    signature and gives no key. Empty for anything but a dict."""
    obj = _unwrap(final)
    if not isinstance(obj, dict):
        return set()
    keys: set[str] = set()
    for cand in as_list(obj.get("candidates")):
        content = cand.get("content") if isinstance(cand, dict) else None
        for part in as_list(content.get("parts")) if isinstance(content, dict) else []:
            key = _signature_key(part)
            if key is not None and part[key] != SKIP_SIGNATURE:
                keys.add("sig:" + part[key])
    return keys


#: the ``detail`` of each kind of :func:`strip_reasoning` rewrite, ``{}`` being the number of parts
_STRIP_DETAILS = {
    "thought_signature_replaced": "thought signature of {} functionCall part(s) replaced by "
    + SKIP_SIGNATURE,
    "thought_dropped": "dropped {} thought part(s) the live upstream did not produce",
    "thought_signature_removed": "removed the thought signature the live upstream did not produce "
    "from {} part(s)",
}


def strip_reasoning(obj: dict, served: set[str], path: str) -> tuple[dict, str, list[dict]]:
    """Take out of a parsed Gemini request body the thought signatures the live model would
    refuse ("Corrupted thought signature."): those of parts whose key ``"sig:" +
    thoughtSignature`` is in ``served``, the keys of replies the live upstream did not produce.

    - a ``functionCall`` part keeps its place with the signature replaced by
      :data:`SKIP_SIGNATURE`, the placeholder Gemini CLI itself sends for a call without one
      (a call of the current turn without any signature is refused: "Function call is missing
      a thought_signature"); kind ``thought_signature_replaced``;
    - a thought part (``"thought": true``) or a part that is only a signature (no data, or an
      empty text) is dropped; kind ``thought_dropped``;
    - another part (the text part a signature rode on) keeps its data without the signature;
      kind ``thought_signature_removed``;
    - a content that would be left without any part keeps its parts as they are (the API
      refuses a content without parts); kind ``thought_kept``.

    Returns ``(body, path, rewrites)``: the body unchanged (the same object) when nothing
    matched, else a copy; ``path`` as given. One rewrite per content (``entry`` = its index)
    and kind, in content order."""
    contents = entries(obj)
    rewrites: list[dict] = []
    changed = False
    for i, content in enumerate(contents):
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list):
            continue
        kept: list = []
        counts = {"thought_signature_replaced": 0, "thought_dropped": 0, "thought_signature_removed": 0}
        for part in parts:
            key = _signature_key(part)
            if key is None or part[key] == SKIP_SIGNATURE or "sig:" + part[key] not in served:
                kept.append(part)
                continue
            read = _part(part)
            if isinstance(read, ToolCall):
                kept.append({**part, key: SKIP_SIGNATURE})
                counts["thought_signature_replaced"] += 1
            elif isinstance(read, Reasoning) or (isinstance(read, TextPart) and not read.text):
                counts["thought_dropped"] += 1
            else:
                kept.append({k: v for k, v in part.items() if k != key})
                counts["thought_signature_removed"] += 1
        n = sum(counts.values())
        if not n:
            continue
        if not kept:
            rewrites.append(
                {
                    "entry": i,
                    "kind": "thought_kept",
                    "detail": f"{n} part(s) with a thought signature the live upstream did not produce kept: "
                    "without them the content would have no part, which the API refuses",
                }
            )
            continue
        contents[i] = {**content, "parts": kept}
        changed = True
        rewrites += [
            {"entry": i, "kind": kind, "detail": _STRIP_DETAILS[kind].format(c)}
            for kind, c in counts.items()
            if c
        ]
    if not changed:
        return obj, path, rewrites
    return {**obj, "contents": contents}, path, rewrites


def with_model(obj: dict, path: str, model: str) -> tuple[dict, str, dict | None]:
    """A Gemini request asking for ``model``: the model is a path segment
    (``/v1beta/models/{model}:generateContent`` or ``:streamGenerateContent``, also ``/v1`` and
    ``:countTokens``, see :data:`PATHS`), so the path changes, keeping its version, method and
    any ``?query``; the body is returned as it is (a Gemini API body names no model). Returns
    ``(obj, new path, {"from": old, "to": model})``, or ``(obj, path, None)`` when the path
    already names ``model``. Raises ValueError for a path that is not a Gemini model path, or a
    model that is not a non-empty path segment (no ``/``, ``:``, ``?``)."""
    bare, sep, query = path.partition("?")
    m = _PATH_RE.match(bare)
    if m is None:
        raise ValueError(f"not a Gemini model path: {path!r}")
    if not isinstance(model, str) or not model or any(c in model for c in "/:?#"):
        raise ValueError(f"not a Gemini model name (one path segment): {model!r}")
    old = m.group(2)
    if old == model:
        return obj, path, None
    return obj, f"/{m.group(1)}/models/{model}:{m.group(3)}{sep}{query}", {"from": old, "to": model}


def reasoning_refusal(status: int, body: bytes) -> str | None:
    """When an error response (status 400..499, the Google shape of :func:`error_body`, also as
    the first element of a JSON array, the way ``streamGenerateContent`` answers) says that
    thought signatures of the request were refused (missing, corrupted, not valid; phrases and
    sources at ``_REFUSALS``), the API's message (at most 500 characters); else None."""
    return refusal_message(status, body, _REFUSALS)


def offered_tools(conv: Conversation) -> list[ToolSpec]:
    """The tools the request offers the model: its tool definitions as parsed."""
    return list(conv.tools)


def tool_kind(spec: ToolSpec) -> str:
    """How a call of the tool is written: always ``function`` in this protocol."""
    return "function"


def path_for_model(path: str, model: str) -> str:
    """A recorded Gemini path (no query) asking for ``model``: the segment after the last
    ``/models/`` up to ``:`` replaced (``/v1beta/models/M:streamGenerateContent``); ``path``
    unchanged when ``model`` is empty or the path has no ``/models/NAME:VERB`` tail."""
    if not model:
        return path
    head, sep, tail = path.rpartition("/models/")
    verb = tail.partition(":")[2]
    return f"{head}/models/{model}:{verb}" if sep and verb else path


# --------------------------------------------------------------------------- replies
# facts adapters/protocols/replies.py answers with

#: the field of a token-count response's count (None: the protocol has none):
#: Gemini's ``:countTokens`` answers ``{"totalTokens": N}``
TOKEN_COUNT_FIELD: str | None = "totalTokens"


def normalised_usage(usage: Any) -> TokenUsage:
    """:class:`TokenUsage` of a ``usageMetadata``: ``promptTokenCount`` includes the cached
    tokens (``cachedContentTokenCount``); the input adds ``toolUsePromptTokenCount``; thoughts
    (``thoughtsTokenCount``) are reported apart from ``candidatesTokenCount``, so the output is
    their sum and the reasoning the thoughts."""
    if not isinstance(usage, dict):
        return TokenUsage()
    thoughts = first_int(usage.get("thoughtsTokenCount"))
    return TokenUsage(
        input_tokens=count_sum(usage.get("promptTokenCount"), usage.get("toolUsePromptTokenCount")),
        cached_input_tokens=first_int(usage.get("cachedContentTokenCount")),
        output_tokens=count_sum(usage.get("candidatesTokenCount"), thoughts),
        reasoning_tokens=thoughts,
    )
