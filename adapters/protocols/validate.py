"""Strict request validators, one per wire protocol: does a request body have a shape the API
accepts? Every nested list is walked and every object's keys are checked against the API
reference; an unknown key, a value of the wrong type or an unknown block type is a problem.

The SDKs' request types do not do this (their TypedDict params are not checked at run time and
a lazy pydantic adapter lets an object through where the API takes a string or a list of
blocks, which is how a Qwen Code render into Anthropic once wrote ``tool_result.content`` as
an object), so pvisor checks its own renders with these, and the handoff between agents reuses
them.

Sources (the request bodies as documented, read 2026-12): Anthropic "Messages - Create"
(docs.anthropic.com/en/api/messages) with its content block types; OpenAI "Chat Completions -
Create" (platform.openai.com/docs/api-reference/chat/create) and "Responses - Create"
(platform.openai.com/docs/api-reference/responses/create) with their input item types; Gemini
``generateContent`` (ai.google.dev/api/generate-content) with ``Content``, ``Part`` and
``Tool``. Gemini accepts every field in camelCase and snake_case (proto JSON), both are known.
Fields the real agents send beyond a reference (Codex's ``client_metadata``, Claude Code's
``context_management``, Chat ``reasoning_content`` echoed by DeepSeek-style clients) are listed
where they occur, each with the agent that sends it; everything else is refused.

Public API: :func:`validate_request` ``(protocol, body) -> list[Problem]`` (empty: valid).
"""

from __future__ import annotations

from typing import Any, Callable
from pvisor.core.record import FrozenRecord, record

_set = object.__setattr__  # how a FrozenRecord sets its fields in __init__

# --------------------------------------------------------------------------- the schema language


@record
class Problem(FrozenRecord):
    """One thing the API would refuse: ``path`` (``messages[3].content[0].content``) and ``what``."""

    path: str
    what: str

    def __init__(self, path: str, what: str) -> None:
        _set(self, "path", path)
        _set(self, "what", what)

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


Check = Callable[[Any, str, list[Problem]], None]


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(v), type(v).__name__)


def scalar(*types: type, name: str) -> Check:
    def check(v: Any, path: str, out: list[Problem]) -> None:
        if isinstance(v, bool) and bool not in types:
            out.append(Problem(path, f"expected {name}, got boolean"))
        elif not isinstance(v, types):
            out.append(Problem(path, f"expected {name}, got {_type_name(v)}"))

    return check


STR = scalar(str, name="a string")
BOOL = scalar(bool, name="a boolean")
INT = scalar(int, name="an integer")
NUM = scalar(int, float, name="a number")


def ANY(v: Any, path: str, out: list[Problem]) -> None:  # noqa: N802  (a schema constant)
    """Any JSON value (a JSON Schema, a tool's input, metadata the API passes through)."""


def OBJECT(v: Any, path: str, out: list[Problem]) -> None:  # noqa: N802
    """Any JSON object (its keys are the caller's: tool arguments, a parameter schema)."""
    if not isinstance(v, dict):
        out.append(Problem(path, f"expected an object, got {_type_name(v)}"))


def enum(*values: Any) -> Check:
    def check(v: Any, path: str, out: list[Problem]) -> None:
        if v not in values:
            out.append(Problem(path, f"expected one of {', '.join(repr(x) for x in values)}, got {v!r}"))

    return check


def nullable(inner: Check) -> Check:
    def check(v: Any, path: str, out: list[Problem]) -> None:
        if v is not None:
            inner(v, path, out)

    return check


def array(item: Check) -> Check:
    def check(v: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(v, list):
            out.append(Problem(path, f"expected an array, got {_type_name(v)}"))
            return
        for i, x in enumerate(v):
            item(x, f"{path}[{i}]", out)

    return check


def one_of(*checks: Check, name: str) -> Check:
    """The first check that finds nothing wins; else the problems of the check whose JSON type
    matches (so that a wrong nested field is named), else one problem naming ``name``."""

    def check(v: Any, path: str, out: list[Problem]) -> None:
        tries = []
        for c in checks:
            found: list[Problem] = []
            c(v, path, found)
            if not found:
                return
            tries.append(found)
        deeper = [t for t in tries if all(p.path != path or "expected" not in p.what for p in t)]
        out.extend(deeper[0] if deeper else [Problem(path, f"expected {name}, got {_type_name(v)}")])

    return check


def obj(
    required: dict[str, Check] | None = None,
    optional: dict[str, Check] | None = None,
    *,
    open_keys: bool = False,
) -> Check:
    """An object with ``required`` and ``optional`` keys; any other key is a problem unless
    ``open_keys`` (an object whose further keys the API passes through or does not document)."""
    req = required or {}
    opt = optional or {}

    def check(v: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(v, dict):
            out.append(Problem(path, f"expected an object, got {_type_name(v)}"))
            return
        for k, c in req.items():
            if k not in v:
                out.append(Problem(path, f"missing required key {k!r}"))
            else:
                c(v[k], f"{path}.{k}", out)
        for k, x in v.items():
            if k in req:
                continue
            c = opt.get(k)
            if c is not None:
                c(x, f"{path}.{k}", out)
            elif not open_keys:
                out.append(Problem(path, f"unknown key {k!r}"))

    return check


def tagged(
    key: str, variants: dict[str, Check], *, default: Check | None = None, name: str = "block"
) -> Check:
    """An object told apart by ``key`` (``type``): the variant's check, ``default`` when the key
    is absent, a problem for an unknown value."""

    def check(v: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(v, dict):
            out.append(Problem(path, f"expected a {name} object, got {_type_name(v)}"))
            return
        t = v.get(key)
        if t is None and default is not None:
            default(v, path, out)
            return
        c = variants.get(t) if isinstance(t, str) else None
        if c is None:
            out.append(
                Problem(path, f"unknown {name} {key} {t!r}; expected one of {', '.join(sorted(variants))}")
            )
            return
        c(v, path, out)

    return check


def prefixed(key: str, prefixes: dict[str, Check], fallback: Check) -> Check:
    """Like :func:`tagged` for dated type names (Anthropic server tools ``web_search_20250305``):
    the check of the first prefix the value starts with, else ``fallback``."""

    def check(v: Any, path: str, out: list[Problem]) -> None:
        t = v.get(key) if isinstance(v, dict) else None
        for p, c in prefixes.items():
            if isinstance(t, str) and t.startswith(p):
                c(v, path, out)
                return
        fallback(v, path, out)

    return check


# --------------------------------------------------------------------------- Anthropic Messages

_A_CACHE = obj({"type": enum("ephemeral")}, {"ttl": enum("5m", "1h")})
_A_CITATIONS = nullable(array(OBJECT))
_A_TEXT = obj({"type": STR, "text": STR}, {"cache_control": nullable(_A_CACHE), "citations": _A_CITATIONS})
_A_SOURCE = tagged(
    "type",
    {
        "base64": obj({"type": STR, "media_type": STR, "data": STR}),
        "url": obj({"type": STR, "url": STR}),
        "text": obj({"type": STR, "media_type": STR, "data": STR}),
        "file": obj({"type": STR, "file_id": STR}),
        "content": obj({"type": STR, "content": ANY}),
    },
    name="source",
)
_A_IMAGE = obj({"type": STR, "source": _A_SOURCE}, {"cache_control": nullable(_A_CACHE)})
_A_DOCUMENT = obj(
    {"type": STR, "source": _A_SOURCE},
    {"cache_control": nullable(_A_CACHE), "citations": ANY, "context": nullable(STR), "title": nullable(STR)},
)
_A_SEARCH_RESULT = obj(
    {"type": STR, "source": STR, "title": STR, "content": array(_A_TEXT)},
    {"cache_control": nullable(_A_CACHE), "citations": ANY},
)
#: what a tool_result's ``content`` may hold: a string, or a list of these blocks
_A_RESULT_BLOCK = tagged(
    "type", {"text": _A_TEXT, "image": _A_IMAGE, "document": _A_DOCUMENT, "search_result": _A_SEARCH_RESULT}
)
# ``caller``: who made the call (programmatic tool calling: ``direct`` or a code execution tool)
_A_CALLER = obj({"type": STR}, {"tool_id": STR})
_A_TOOL_USE = obj(
    {"type": STR, "id": STR, "name": STR, "input": OBJECT},
    {"cache_control": nullable(_A_CACHE), "caller": _A_CALLER},
)
_A_BLOCK = tagged(
    "type",
    {
        "text": _A_TEXT,
        "image": _A_IMAGE,
        "document": _A_DOCUMENT,
        "search_result": _A_SEARCH_RESULT,
        "tool_use": _A_TOOL_USE,
        "tool_result": obj(
            {"type": STR, "tool_use_id": STR},
            {
                "content": one_of(
                    STR,
                    array(_A_RESULT_BLOCK),
                    name="a string or a list of text, image, document or search_result blocks",
                ),
                "is_error": BOOL,
                "cache_control": nullable(_A_CACHE),
            },
        ),
        "thinking": obj({"type": STR, "thinking": STR, "signature": STR}),
        "redacted_thinking": obj({"type": STR, "data": STR}),
        "server_tool_use": obj(
            {"type": STR, "id": STR, "name": STR, "input": OBJECT},
            {"cache_control": nullable(_A_CACHE), "caller": _A_CALLER},
        ),
        # results of tools the API runs itself: their content is the API's own, passed back as given
        "web_search_tool_result": obj(
            {"type": STR, "tool_use_id": STR, "content": ANY}, {"cache_control": nullable(_A_CACHE)}
        ),
        "web_fetch_tool_result": obj(
            {"type": STR, "tool_use_id": STR, "content": ANY}, {"cache_control": nullable(_A_CACHE)}
        ),
        "code_execution_tool_result": obj(
            {"type": STR, "tool_use_id": STR, "content": ANY}, {"cache_control": nullable(_A_CACHE)}
        ),
        "bash_code_execution_tool_result": obj(
            {"type": STR, "tool_use_id": STR, "content": ANY}, {"cache_control": nullable(_A_CACHE)}
        ),
        "text_editor_code_execution_tool_result": obj(
            {"type": STR, "tool_use_id": STR, "content": ANY}, {"cache_control": nullable(_A_CACHE)}
        ),
        "mcp_tool_use": obj(
            {"type": STR, "id": STR, "name": STR, "server_name": STR, "input": OBJECT},
            {"cache_control": nullable(_A_CACHE)},
        ),
        "mcp_tool_result": obj(
            {"type": STR, "tool_use_id": STR},
            {"content": ANY, "is_error": BOOL, "cache_control": nullable(_A_CACHE)},
        ),
        "container_upload": obj({"type": STR, "file_id": STR}, {"cache_control": nullable(_A_CACHE)}),
    },
)
_A_MESSAGE = obj(
    {
        "role": enum("user", "assistant"),
        "content": one_of(STR, array(_A_BLOCK), name="a string or a list of content blocks"),
    }
)
# defer_loading, allowed_callers, input_examples: the advanced tool use options (tool search,
# programmatic calling); strict: structured tool inputs. Claude Code 2.1 sends defer_loading
_A_CUSTOM_TOOL = obj(
    {"name": STR, "input_schema": OBJECT},
    {
        "type": enum("custom"),
        "description": STR,
        "cache_control": nullable(_A_CACHE),
        "defer_loading": BOOL,
        "allowed_callers": array(STR),
        "input_examples": array(OBJECT),
        "strict": BOOL,
    },
)
# server tools (web_search_20250305, bash_20250124, ...): name and type, their options as documented per tool
_A_TOOL = prefixed(
    "type",
    {"custom": _A_CUSTOM_TOOL},
    one_of(_A_CUSTOM_TOOL, obj({"type": STR, "name": STR}, open_keys=True), name="a tool definition"),
)

ANTHROPIC = obj(
    {"model": STR, "messages": array(_A_MESSAGE), "max_tokens": INT},
    {
        "system": one_of(STR, array(_A_TEXT), name="a string or a list of text blocks"),
        "tools": array(_A_TOOL),
        "tool_choice": obj(
            {"type": enum("auto", "any", "tool", "none")}, {"name": STR, "disable_parallel_tool_use": BOOL}
        ),
        "stream": BOOL,
        "temperature": NUM,
        "top_p": NUM,
        "top_k": INT,
        "stop_sequences": array(STR),
        "metadata": obj(optional={"user_id": nullable(STR)}),
        # display: whether thinking is returned summarised or omitted (Claude Code 2.1 sends it)
        "thinking": tagged(
            "type",
            {
                "enabled": obj({"type": STR, "budget_tokens": INT}, {"display": STR}),
                "disabled": obj({"type": STR}),
                "adaptive": obj({"type": STR}, open_keys=True),
            },
            name="thinking",
        ),
        "service_tier": enum("auto", "standard_only"),
        "container": nullable(ANY),
        "mcp_servers": array(OBJECT),
        # Claude Code 2.1 (beta): context editing and output options
        "context_management": OBJECT,
        "output_config": OBJECT,
        "output_format": nullable(OBJECT),
    },
)

# --------------------------------------------------------------------------- OpenAI Chat Completions

_C_CACHE = obj(
    {"type": enum("ephemeral")}, {"ttl": STR}
)  # prompt caching of Anthropic-compatible servers (litellm, OpenRouter)
_C_TEXT = obj({"type": STR, "text": STR}, {"cache_control": _C_CACHE})
_C_PART = tagged(
    "type",
    {
        "text": _C_TEXT,
        "image_url": obj(
            {"type": STR, "image_url": obj({"url": STR}, {"detail": enum("auto", "low", "high")})},
            {"cache_control": _C_CACHE},
        ),
        "input_audio": obj({"type": STR, "input_audio": obj({"data": STR, "format": STR})}),
        "file": obj({"type": STR, "file": obj(optional={"file_data": STR, "file_id": STR, "filename": STR})}),
    },
    name="content part",
)
_C_TEXTS = one_of(STR, array(_C_TEXT), name="a string or a list of text parts")
_C_CALL = obj(
    {"id": STR, "type": enum("function"), "function": obj({"name": STR, "arguments": STR})}, {"index": INT}
)
_C_INSTRUCTIONS = obj({"role": STR, "content": _C_TEXTS}, {"name": STR})  # a system or developer message
_C_MESSAGE = tagged(
    "role",
    {
        "system": _C_INSTRUCTIONS,
        "developer": _C_INSTRUCTIONS,
        "user": obj(
            {"role": STR, "content": one_of(STR, array(_C_PART), name="a string or a list of content parts")},
            {"name": STR},
        ),
        "assistant": obj(
            {"role": STR},
            {
                "content": nullable(
                    one_of(
                        STR,
                        array(
                            tagged("type", {"text": _C_TEXT, "refusal": obj({"type": STR, "refusal": STR})})
                        ),
                        name="a string or a list of text and refusal parts",
                    )
                ),
                "name": STR,
                "tool_calls": array(_C_CALL),
                "refusal": nullable(STR),
                "audio": nullable(obj({"id": STR})),
                "function_call": nullable(obj({"name": STR, "arguments": STR})),
                # reasoning echoed back by clients of reasoning models (DeepSeek, Qwen, vLLM servers)
                "reasoning_content": nullable(STR),
            },
        ),
        "tool": obj({"role": STR, "tool_call_id": STR, "content": _C_TEXTS}),
        "function": obj({"role": STR, "name": STR, "content": nullable(STR)}),
    },
    name="message",
)
_C_TOOL = tagged(
    "type",
    {
        "function": obj(
            {
                "type": STR,
                "function": obj(
                    {"name": STR}, {"description": STR, "parameters": OBJECT, "strict": nullable(BOOL)}
                ),
            }
        ),
        "custom": obj({"type": STR, "custom": obj({"name": STR}, {"description": STR, "format": OBJECT})}),
    },
    name="tool",
)

OPENAI_CHAT = obj(
    {"model": STR, "messages": array(_C_MESSAGE)},
    {
        "tools": array(_C_TOOL),
        "tool_choice": one_of(enum("none", "auto", "required"), OBJECT, name="a tool choice"),
        "parallel_tool_calls": BOOL,
        "stream": nullable(BOOL),
        "stream_options": nullable(obj(optional={"include_usage": BOOL, "include_obfuscation": BOOL})),
        "temperature": nullable(NUM),
        "top_p": nullable(NUM),
        "n": nullable(INT),
        "seed": nullable(INT),
        "max_tokens": nullable(INT),
        "max_completion_tokens": nullable(INT),
        "stop": nullable(one_of(STR, array(STR), name="a string or a list of strings")),
        "presence_penalty": nullable(NUM),
        "frequency_penalty": nullable(NUM),
        "logit_bias": nullable(OBJECT),
        "logprobs": nullable(BOOL),
        "top_logprobs": nullable(INT),
        "response_format": OBJECT,
        "reasoning_effort": nullable(STR),
        "verbosity": nullable(STR),
        "metadata": nullable(OBJECT),
        "store": nullable(BOOL),
        "user": STR,
        "safety_identifier": STR,
        "prompt_cache_key": STR,
        "modalities": nullable(array(STR)),
        "audio": nullable(OBJECT),
        "prediction": nullable(OBJECT),
        "service_tier": nullable(STR),
        "web_search_options": OBJECT,
        "functions": array(OBJECT),
        "function_call": ANY,
    },
)

# --------------------------------------------------------------------------- OpenAI Responses

_R_IN_CONTENT = tagged(
    "type",
    {
        "input_text": obj({"type": STR, "text": STR}),
        "input_image": obj(
            {"type": STR},
            {"image_url": nullable(STR), "file_id": nullable(STR), "detail": enum("auto", "low", "high")},
        ),
        "input_file": obj(
            {"type": STR}, {"file_data": STR, "file_id": nullable(STR), "file_url": STR, "filename": STR}
        ),
        "input_audio": obj({"type": STR, "input_audio": OBJECT}),
    },
    name="input content",
)
_R_OUT_CONTENT = tagged(
    "type",
    {
        "output_text": obj(
            {"type": STR, "text": STR}, {"annotations": array(OBJECT), "logprobs": array(OBJECT)}
        ),
        "refusal": obj({"type": STR, "refusal": STR}),
    },
    name="output content",
)
_R_ITEM_COMMON = {"id": nullable(STR), "status": nullable(enum("in_progress", "completed", "incomplete"))}
#: a user, system or developer message: the same shape for the three roles
_R_INPUT_MESSAGE = obj(
    {"role": STR, "content": one_of(STR, array(_R_IN_CONTENT), name="a string or a list of input content")},
    {"type": enum("message"), **_R_ITEM_COMMON},
)
_R_MESSAGE = tagged(
    "role",
    {
        "user": _R_INPUT_MESSAGE,
        "system": _R_INPUT_MESSAGE,
        "developer": _R_INPUT_MESSAGE,
        "assistant": obj(
            {
                "role": STR,
                "content": one_of(STR, array(_R_OUT_CONTENT), name="a string or a list of output content"),
            },
            {"type": enum("message"), **_R_ITEM_COMMON, "phase": nullable(STR)},
        ),
    },
    name="message",
)
_R_OUTPUT = one_of(STR, array(OBJECT), name="a string or a list of output content")
_R_ITEM = tagged(
    "type",
    {
        "message": _R_MESSAGE,
        "function_call": obj(
            {"type": STR, "call_id": STR, "name": STR, "arguments": STR}, {**_R_ITEM_COMMON, "namespace": STR}
        ),
        "function_call_output": obj({"type": STR, "call_id": STR, "output": _R_OUTPUT}, _R_ITEM_COMMON),
        "custom_tool_call": obj(
            {"type": STR, "call_id": STR, "name": STR, "input": STR}, {**_R_ITEM_COMMON, "namespace": STR}
        ),
        "custom_tool_call_output": obj({"type": STR, "call_id": STR, "output": _R_OUTPUT}, _R_ITEM_COMMON),
        "reasoning": obj(
            {"type": STR, "summary": array(obj({"type": enum("summary_text"), "text": STR}))},
            {**_R_ITEM_COMMON, "content": nullable(array(OBJECT)), "encrypted_content": nullable(STR)},
        ),
        "local_shell_call": obj({"type": STR, "call_id": STR, "action": OBJECT}, _R_ITEM_COMMON),
        "local_shell_call_output": obj({"type": STR, "output": STR}, _R_ITEM_COMMON),
        "item_reference": obj({"type": STR, "id": STR}),
        "compaction": obj({"type": STR, "encrypted_content": STR}, {"id": nullable(STR)}),
        # provider-run calls passed back as they came (their fields are the API's own)
        **{
            t: obj({"type": STR}, open_keys=True)
            for t in (
                "web_search_call",
                "file_search_call",
                "computer_call",
                "computer_call_output",
                "code_interpreter_call",
                "image_generation_call",
                "mcp_call",
                "mcp_list_tools",
                "mcp_approval_request",
                "mcp_approval_response",
                "tool_search_call",
                "tool_search_call_output",
            )
        },
        # Codex 0.171 with its default model: every tool in one input item, grouped in namespaces
        "additional_tools": obj(
            {"type": STR, "role": enum("developer"), "tools": array(OBJECT)}, {"id": nullable(STR)}
        ),
    },
    default=_R_MESSAGE,
    name="input item",
)
_R_TOOL = tagged(
    "type",
    {
        "function": obj(
            {"type": STR, "name": STR},
            {"description": nullable(STR), "parameters": nullable(OBJECT), "strict": nullable(BOOL)},
        ),
        "custom": obj({"type": STR, "name": STR}, {"description": STR, "format": OBJECT}),
        "namespace": obj({"type": STR, "name": STR, "tools": array(OBJECT)}, {"description": STR}),
        **{
            t: obj({"type": STR}, open_keys=True)
            for t in (
                "web_search",
                "web_search_preview",
                "file_search",
                "computer_use_preview",
                "mcp",
                "code_interpreter",
                "image_generation",
                "local_shell",
                "tool_search",
            )
        },
    },
    name="tool",
)

OPENAI_RESPONSES = obj(
    {"model": STR},
    {
        "input": one_of(STR, array(_R_ITEM), name="a string or a list of input items"),
        "instructions": nullable(one_of(STR, array(_R_ITEM), name="a string or a list of input items")),
        "tools": array(_R_TOOL),
        "tool_choice": one_of(enum("none", "auto", "required"), OBJECT, name="a tool choice"),
        "parallel_tool_calls": nullable(BOOL),
        "stream": nullable(BOOL),
        "stream_options": nullable(OBJECT),
        "store": nullable(BOOL),
        "include": nullable(array(STR)),
        "previous_response_id": nullable(STR),
        "conversation": ANY,
        "reasoning": nullable(
            obj(
                optional={
                    "effort": nullable(STR),
                    "summary": nullable(STR),
                    "generate_summary": nullable(STR),
                }
            )
        ),
        "text": nullable(obj(optional={"format": OBJECT, "verbosity": nullable(STR)})),
        "max_output_tokens": nullable(INT),
        "max_tool_calls": nullable(INT),
        "temperature": nullable(NUM),
        "top_p": nullable(NUM),
        "top_logprobs": nullable(INT),
        "truncation": nullable(enum("auto", "disabled")),
        "metadata": nullable(OBJECT),
        "user": STR,
        "safety_identifier": STR,
        "service_tier": nullable(STR),
        "prompt_cache_key": STR,
        "prompt_cache_retention": nullable(STR),
        "background": nullable(BOOL),
        "prompt": nullable(OBJECT),
        # Codex 0.171: the turn's metadata, sent to every provider
        "client_metadata": OBJECT,
    },
)

# --------------------------------------------------------------------------- Gemini generateContent


def _both(**fields: Check) -> dict[str, Check]:
    """Each field under its camelCase name and its snake_case one (proto JSON accepts both)."""
    out: dict[str, Check] = {}
    for k, c in fields.items():
        out[k] = c
        snake = "".join("_" + ch.lower() if ch.isupper() else ch for ch in k)
        out[snake] = c
    return out


_G_BLOB = obj(_both(mimeType=STR, data=STR))
_G_PART_FIELDS = _both(
    text=STR,
    inlineData=_G_BLOB,
    fileData=obj(_both(fileUri=STR), _both(mimeType=STR)),
    functionCall=obj({"name": STR}, {"args": OBJECT, "id": STR}),
    functionResponse=obj(
        {"name": STR, "response": OBJECT},
        {"id": STR, "willContinue": BOOL, "will_continue": BOOL, "scheduling": STR, "parts": array(OBJECT)},
    ),
    executableCode=obj({"language": STR, "code": STR}),
    codeExecutionResult=obj({"outcome": STR}, {"output": STR}),
)


def _g_part(v: Any, path: str, out: list[Problem]) -> None:
    obj(
        optional={
            **_G_PART_FIELDS,
            **_both(
                thought=BOOL,
                thoughtSignature=STR,
                videoMetadata=OBJECT,
                partMetadata=OBJECT,
                mediaResolution=OBJECT,
            ),
        }
    )(v, path, out)
    if isinstance(v, dict):
        data = [k for k in v if k in _G_PART_FIELDS]
        if len(data) != 1:
            out.append(
                Problem(
                    path,
                    "a part holds exactly one of text, inlineData, fileData, functionCall, "
                    "functionResponse, executableCode, codeExecutionResult; "
                    f"it holds {len(data) or 'none'}",
                )
            )


_G_CONTENT = obj({"parts": array(_g_part)}, {"role": enum("user", "model")})
_G_TOOL = obj(
    optional=_both(
        functionDeclarations=array(
            obj(
                {"name": STR},
                {
                    "description": STR,
                    "parameters": OBJECT,
                    "parametersJsonSchema": OBJECT,
                    "parameters_json_schema": OBJECT,
                    "response": OBJECT,
                    "responseJsonSchema": OBJECT,
                    "response_json_schema": OBJECT,
                    "behavior": STR,
                },
            )
        ),
        googleSearch=OBJECT,
        googleSearchRetrieval=OBJECT,
        codeExecution=OBJECT,
        urlContext=OBJECT,
        retrieval=OBJECT,
        computerUse=OBJECT,
        fileSearch=OBJECT,
        googleMaps=OBJECT,
    )
)

GEMINI = obj(
    {"contents": array(_G_CONTENT)},
    _both(
        systemInstruction=_G_CONTENT,
        tools=array(_G_TOOL),
        toolConfig=OBJECT,
        generationConfig=OBJECT,
        safetySettings=array(OBJECT),
        cachedContent=STR,
        labels=OBJECT,
        model=STR,
    ),
)

SCHEMAS: dict[str, Check] = {
    "anthropic": ANTHROPIC,
    "openai-chat": OPENAI_CHAT,
    "openai-responses": OPENAI_RESPONSES,
    "gemini": GEMINI,
}


def _chat_calls_answered(body: Any, out: list[Problem]) -> None:
    """Chat Completions refuses "An assistant message with 'tool_calls' must be followed by tool
    messages responding to each 'tool_call_id'": each call of an assistant message needs a tool
    message of its id among the tool messages right after it, before the next user, assistant
    or system turn. A trailing assistant message has no next turn: it is the reply a request and
    its answer are checked with (a training row's completion), not judged."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) and m.get("role") == "assistant" else None
        if not isinstance(calls, list):
            continue
        after = messages[i + 1 :]
        if not after:
            return
        answered = set()
        for n in after:
            if not isinstance(n, dict) or n.get("role") != "tool":
                break
            answered.add(n.get("tool_call_id"))
        for j, c in enumerate(calls):
            cid = c.get("id") if isinstance(c, dict) else None
            if cid not in answered:
                out.append(
                    Problem(
                        f"body.messages[{i}].tool_calls[{j}]",
                        f"no tool message answers tool_call_id {cid!r} before the next turn",
                    )
                )


def validate_request(protocol: str, body: Any) -> list[Problem]:
    """The problems the API of ``protocol`` would refuse ``body`` (a parsed JSON request body)
    for, in document order; empty when it is valid. Chat Completions also needs each assistant
    call answered (:func:`_chat_calls_answered`). Raises KeyError for an unknown protocol."""
    out: list[Problem] = []
    SCHEMAS[protocol](body, "body", out)
    if protocol == "openai-chat":
        _chat_calls_answered(body, out)
    return out
