"""The transcoder through its API (adapters/protocols/convert.py, issue 36): a Chat Completions
conversation with parallel tool calls rendered as Anthropic and back keeps its system prompt,
tools, texts, tool calls and results; what cannot pass (reasoning without an Anthropic
signature, another protocol's parameters, a provider's built-in tool) is named in ``dropped``,
what passed in another shape in ``rewritten``. Both renders are requests the APIs accept
(:func:`~pvisor.adapters.protocols.validate.validate_request`)."""

from __future__ import annotations

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.convert import (
    PARAM_DEFAULTED,
    PARAM_NOT_CONVERTED,
    REASONING_NOT_CONVERTED,
    RESULTS_ROLE_CHANGED,
    SYSTEM_RESHAPED,
    TOOL_NOT_CONVERTED,
    convert,
    render,
)
from pvisor.adapters.protocols.validate import validate_request
from pvisor.journal.model import Reasoning, TextPart, ToolCall, ToolResult

#: a Chat Completions request: system prompt, two tools, a task, a reply with reasoning and two
#: parallel tool calls, their two results
CHAT_BODY = {
    "model": "gpt-test",
    "temperature": 0.2,
    "messages": [
        {"role": "system", "content": "You are a careful coder."},
        {"role": "user", "content": "List the files and read README."},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "Two calls at once.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "README"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "README\nsrc"},
        {"role": "tool", "tool_call_id": "call_b", "content": "# Project"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "read", "description": "Read a file."}},
    ],
}


def _shape(conv):
    """What a conversation says, protocol-neutrally: the system text, tools (name, description,
    parameters or None), and per message its role, texts, tool calls and results."""
    messages = []
    for m in conv.messages:
        messages.append(
            (
                m.role if not any(isinstance(p, ToolResult) for p in m.parts) else "results",
                [p.text for p in m.parts if isinstance(p, TextPart)],
                [(p.id, p.name, p.arguments) for p in m.parts if isinstance(p, ToolCall)],
                [(p.call_id, p.content) for p in m.parts if isinstance(p, ToolResult)],
            )
        )
    tools = [(t.name, t.description, t.parameters) for t in conv.tools]
    return conv.system, tools, messages


def test_a_chat_conversation_rendered_as_anthropic_and_back():
    chat = get_protocol("openai-chat")
    anthropic = get_protocol("anthropic")
    source = chat.parse_request(orjson.dumps(CHAT_BODY))

    body, there = render(source, "anthropic")
    obj = orjson.loads(body)
    assert validate_request("anthropic", obj) == []
    # the two results of the one action are one user message, as Anthropic wants them
    assert [m["role"] for m in obj["messages"]] == ["user", "assistant", "user"]
    assert [b["type"] for b in obj["messages"][2]["content"]] == ["tool_result", "tool_result"]
    assert [t["input_schema"] for t in obj["tools"]] == [
        {"type": "object", "properties": {"command": {"type": "string"}}},
        {"type": "object", "properties": {}},  # required by Anthropic: the empty schema
    ]
    assert obj["max_tokens"] == 32000 and "temperature" not in obj
    # what could not pass: the reasoning (no Anthropic signature), Chat's temperature
    assert [(c.kind, c.where) for c in there.dropped] == [
        (PARAM_NOT_CONVERTED, "params.temperature"),
        (REASONING_NOT_CONVERTED, "messages[1]"),
    ]
    assert "Anthropic signature" in there.dropped[1].detail
    assert [(c.kind, c.where) for c in there.rewritten] == [
        (SYSTEM_RESHAPED, "system"),
        (PARAM_DEFAULTED, "params.max_tokens"),
        (RESULTS_ROLE_CHANGED, "messages[2]"),
        (RESULTS_ROLE_CHANGED, "messages[3]"),
    ]

    parsed = anthropic.parse_request(body)
    back_body, back = render(parsed, "openai-chat")
    back_obj = orjson.loads(back_body)
    assert validate_request("openai-chat", back_obj) == []
    assert [m["role"] for m in back_obj["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    assert [(c.kind, c.where) for c in back.dropped] == [(PARAM_NOT_CONVERTED, "params.max_tokens")]
    # everything but the dropped reasoning came back
    system, tools, messages = _shape(chat.parse_request(back_body))
    want_system, want_tools, want_messages = _shape(source)
    assert system == want_system
    # a function without parameters came back with the empty schema Anthropic required: the same
    assert tools == [want_tools[0], ("read", "Read a file.", {"type": "object", "properties": {}})]
    assert messages == want_messages
    assert not any(isinstance(p, Reasoning) for m in chat.parse_request(back_body).messages for p in m.parts)
    # the source conversation is not changed by the conversion
    assert _shape(source) == (want_system, want_tools, want_messages)
    assert any(isinstance(p, Reasoning) for p in source.messages[1].parts)


def test_a_built_in_tool_has_no_equivalent_and_is_named():
    anthropic = get_protocol("anthropic")
    conv = anthropic.parse_request(
        orjson.dumps(
            {
                "model": "claude-test",
                "max_tokens": 1000,
                "tools": [
                    {"name": "bash", "input_schema": {"type": "object", "properties": {}}},
                    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                ],
                "messages": [{"role": "user", "content": "go"}],
            }
        )
    )
    converted = convert(conv, "openai-responses")
    assert [t.name for t in converted.conversation.tools] == ["bash"]
    assert [(c.kind, c.where) for c in converted.dropped] == [
        (TOOL_NOT_CONVERTED, "tools[1]"),
        (PARAM_NOT_CONVERTED, "params.max_tokens"),
    ]
    assert converted.dropped[0].detail == (
        "tool web_search (web_search_20250305) of anthropic has no openai-responses equivalent: left out"
    )
    # Responses' strict defaults to true, Chat's and a converted tool's to false: kept false
    body = orjson.loads(get_protocol("openai-responses").render_request(converted.conversation))
    assert body["tools"][0]["strict"] is False


def test_a_conversation_of_the_same_protocol_passes_unchanged():
    chat = get_protocol("openai-chat")
    source = chat.parse_request(orjson.dumps(CHAT_BODY))
    converted = convert(source, "openai-chat")
    assert converted.dropped == [] and converted.rewritten == []
    assert converted.conversation == source and converted.conversation is not source
