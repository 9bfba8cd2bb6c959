"""The otel export as the OpenTelemetry GenAI conventions' readers expect it (issue 41, item 2):
every ``gen_ai.*`` attribute it writes is one the conventions define (the names of
opentelemetry-semantic-conventions' incubating ``gen_ai_attributes`` module); with
``--with-content`` the input, output and system messages follow the conventions' message schema
(tests/schemas/gen-ai-*.schema.json, written from the conventions' JSON schemas) whatever the
protocol; the usage counts every input token; and each tool the agent ran between two model
calls has its ``execute_tool`` span, from the end of the exchange whose reply made the call to
the start of the next main-loop request, which carries its result.

One journal is written in this process (an Anthropic run with cache reads and writes, a
thinking block, a tool call and its error result); the real agents' runs are the session's
shared captures (tests/conftest.py), exported in this process."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import orjson
import pytest
from agent_helpers import AGENTS

from pvisor.journal.reader import JournalReader

SCHEMAS = Path(__file__).parent / "schemas"
MESSAGE_ATTRIBUTES = {
    "gen_ai.input.messages": "gen-ai-input-messages.schema.json",
    "gen_ai.output.messages": "gen-ai-output-messages.schema.json",
    "gen_ai.system_instructions": "gen-ai-system-instructions.schema.json",
}


def _defined_names() -> set[str]:
    """The attribute names of the conventions' gen_ai namespace, as the package defines them."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes

    return {v for k, v in vars(gen_ai_attributes).items() if k.startswith("GEN_AI_") and isinstance(v, str)}


def _spans(doc: dict) -> list[dict]:
    [rs] = doc["resourceSpans"]
    return rs["scopeSpans"][0]["spans"]


def _attrs(items: list[dict]) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in items}


def _check_conventions(doc: dict, where: str) -> list[dict]:
    """Every gen_ai.* name is the conventions'; every message attribute validates against its
    schema. Returns the spans."""
    defined = _defined_names()
    validators = {
        k: jsonschema.Draft202012Validator(json.loads((SCHEMAS / f).read_text()))
        for k, f in MESSAGE_ATTRIBUTES.items()
    }
    spans = _spans(doc)
    for span in spans:
        items = span["attributes"] + [a for e in span.get("events", []) for a in e["attributes"]]
        for a in items:
            key = a["key"]
            assert not key.startswith("gen_ai.") or key in defined, (where, span["name"], key)
            if key in validators:
                value = json.loads(a["value"]["stringValue"])
                errors = [e.message for e in validators[key].iter_errors(value)]
                assert not errors, (where, span["name"], key, errors[:3])
    return spans


def _anthropic_journal(path: Path, agent: str | None = "claude-code") -> None:
    """A two-request Anthropic run: a reply with thinking and a ``bash`` call (usage with cache
    reads and writes), then the request carrying its error result and a final text reply.
    ``agent`` None: the run as ``pvisor gateway`` alone records it (no agent, no roles)."""
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    first = [{"role": "user", "content": "List the files."}]
    reply1 = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "I should run ls.", "signature": "c2ln"},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
        ],
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 7,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 50,
            "output_tokens": 30,
        },
    }
    second = [
        *first,
        {"role": "assistant", "content": reply1["content"]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ls: denied", "is_error": True}
            ],
        },
    ]
    reply2 = {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "I cannot list them."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 20, "cache_read_input_tokens": 1050, "output_tokens": 9},
    }
    with Journal.open(path) as j:
        j.create_run(Run(id="r-otel", agent=agent))
        for messages, reply in ((first, reply1), (second, reply2)):
            body = {"model": "claude-test", "system": "You are terse.", "tools": tools, "max_tokens": 99}
            j.record_exchange(
                "r-otel",
                "POST",
                "/v1/messages",
                [("content-type", "application/json")],
                protocol="anthropic",
                status=200,
                request_body=orjson.dumps({**body, "messages": messages}),
                response_body=orjson.dumps(reply),
            )


def test_an_anthropic_run_as_the_conventions_spell_it(tmp_path):
    from pvisor.adapters.exports.otel import run_request

    journal = tmp_path / "j.sqlite"
    _anthropic_journal(journal)
    with JournalReader(journal) as r:
        exchanges = r.exchanges("r-otel")
        doc = run_request(r, r.run("r-otel"), with_content=True)
    spans = _check_conventions(doc, "anthropic")
    root, chat1, chat2, tool = spans
    a1 = _attrs(chat1["attributes"])
    # every input token: input_tokens + cache reads + cache writes (Anthropic counts them apart)
    assert a1["gen_ai.usage.input_tokens"] == "1057" and a1["gen_ai.usage.output_tokens"] == "30"
    assert a1["gen_ai.usage.cache_read.input_tokens"] == "1000"
    assert a1["gen_ai.usage.cache_creation.input_tokens"] == "50"
    assert _attrs(chat2["attributes"])["gen_ai.usage.input_tokens"] == "1070"
    content1 = _attrs(chat1["events"][0]["attributes"])
    assert json.loads(content1["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "You are terse."}
    ]
    assert json.loads(content1["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "List the files."}]}
    ]
    assert json.loads(content1["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "I should run ls."},
                {"type": "tool_call", "id": "toolu_1", "name": "bash", "arguments": {"command": "ls"}},
            ],
            "finish_reason": "tool_call",
        }
    ]
    content2 = _attrs(chat2["events"][0]["attributes"])
    # the result, sent in a user message, is the tool's message in the conventions
    assert json.loads(content2["gen_ai.input.messages"])[-1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "toolu_1", "response": "ls: denied"}],
    }
    assert json.loads(content2["gen_ai.output.messages"])[0]["finish_reason"] == "stop"
    # the tool ran from the end of the first exchange to the start of the request carrying its result
    assert (
        tool["name"] == "execute_tool bash" and tool["kind"] == 1 and tool["parentSpanId"] == root["spanId"]
    )
    ex1, ex2 = exchanges
    assert int(tool["startTimeUnixNano"]) == round((ex1.started_ms + (ex1.ended_us or 0) / 1000) * 1e6)
    assert int(tool["endTimeUnixNano"]) == round(ex2.started_ms * 1e6)
    t = _attrs(tool["attributes"])
    assert t["gen_ai.operation.name"] == "execute_tool" and t["gen_ai.tool.name"] == "bash"
    assert t["gen_ai.tool.call.id"] == "toolu_1" and t["gen_ai.tool.type"] == "function"
    assert (
        t["gen_ai.tool.call.arguments"] == '{"command":"ls"}' and t["gen_ai.tool.call.result"] == "ls: denied"
    )
    assert tool["status"]["code"] == 2 and t["error.type"] == "tool_error"  # is_error: True
    # without content, no message and no argument or result
    with JournalReader(journal) as r:
        bare = _spans(run_request(r, r.run("r-otel")))
    assert not any("events" in s for s in bare)
    assert "gen_ai.tool.call.arguments" not in _attrs(bare[-1]["attributes"])


def test_a_run_of_no_known_agent_has_one_name_in_otel_and_atif(tmp_path):
    """A run captured by ``pvisor gateway`` alone names no agent and stores no roles: OTel and
    ATIF give it the same agent name, and its exchange spans have no role or chain."""
    from pvisor.adapters.exports.atif import write_atif
    from pvisor.adapters.exports.base import UNKNOWN_AGENT
    from pvisor.adapters.exports.otel import run_request

    journal = tmp_path / "j.sqlite"
    _anthropic_journal(journal, agent=None)
    out = tmp_path / "run.atif.json"
    with JournalReader(journal) as r, out.open("wb") as f:
        doc = run_request(r, r.run("r-otel"))
        write_atif(r, "r-otel", f)
    root, *exchanges = [s for s in _spans(doc) if not s["name"].startswith("execute_tool")]
    atif = json.loads(out.read_bytes())
    assert atif["agent"]["name"] == UNKNOWN_AGENT == _attrs(root["attributes"])["gen_ai.agent.name"]
    assert root["name"] == f"invoke_agent {UNKNOWN_AGENT}"
    assert len(exchanges) == 2 and not any(
        {"pvisor.exchange.role", "pvisor.exchange.chain"} & set(_attrs(s["attributes"])) for s in exchanges
    )


@pytest.mark.slow  # the captures run real agents (once per test session)
def test_every_agents_run_in_the_conventions_messages_and_tool_spans(captured):
    """Each protocol's requests and replies (the six agents speak the four) give the conventions'
    messages; each run's four tool runs (step 1's call, step 2's batch of three) their spans,
    whose call ids are those of the output's tool calls (the wire ids: Gemini CLI's own where the
    reply gave none) and the next input's responses."""
    from pvisor.adapters.exports.otel import run_request

    for agent in AGENTS:
        cap = captured(agent)
        with JournalReader(cap.journal) as r:
            spans = _check_conventions(run_request(r, r.run(cap.run), with_content=True), agent)
        tools = [s for s in spans if s["name"].startswith("execute_tool ")]
        assert len(tools) == 4, (agent, [s["name"] for s in spans])
        # a model call is the protocol's operation: Gemini's generateContent is generate_content
        calls = [_attrs(s["attributes"]) for s in spans if s["kind"] == 3]
        wanted = "generate_content" if agent == "gemini-cli" else "chat"
        model_calls = [
            a for a in calls if "gen_ai.provider.name" in a and a["gen_ai.operation.name"] != "count_tokens"
        ]
        assert model_calls and all(a["gen_ai.operation.name"] == wanted for a in model_calls), (agent, calls)
        assert any(s["name"] == f"{wanted} {a['gen_ai.request.model']}" for s, a in zip(spans[1:], calls))
        called, answered = set(), set()
        for s in spans:
            for e in s.get("events", []):
                a = _attrs(e["attributes"])
                for m in json.loads(a.get("gen_ai.output.messages") or "[]"):
                    called |= {p["id"] for p in m["parts"] if p["type"] == "tool_call"}
                for m in json.loads(a.get("gen_ai.input.messages") or "[]"):
                    answered |= {p["id"] for p in m["parts"] if p["type"] == "tool_call_response"}
        ids = {_attrs(t["attributes"])["gen_ai.tool.call.id"] for t in tools}
        assert len(ids) == 4 and ids <= answered, (agent, ids, answered)
        # Gemini CLI names the calls itself (the replies give no id): the output's tool calls
        # carry the id it sent them back under, as the execute_tool spans do, never null
        assert ids <= called and None not in called, (agent, ids, called)
        for t in tools:
            assert int(t["startTimeUnixNano"]) <= int(t["endTimeUnixNano"]), agent
