"""The strict request validators (adapters/protocols/validate.py, issue 14 item 4): what the real
agents sent passes, what an API refuses is named with its path, and every render pvisor makes of
every corpus trajectory, into every protocol its agent speaks, is valid or says why not in its
result's warnings."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from conftest import corpus_dir
from pvisor.adapters.native import read_native
from pvisor.adapters.protocols import protocol_for_path
from pvisor.adapters.protocols.validate import validate_request
from pvisor.replay.errors import ReplayBadInput
from pvisor.replay.source import descriptor
from pvisor.replay.prepare import PrepareOptions, prepare_only


def _recorded() -> list[tuple[str, str, int, dict]]:
    out = []
    for f in sorted((corpus_dir() / "requests").glob("*.jsonl")):
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
            r = json.loads(line)
            mod = protocol_for_path(r.get("path") or "")
            if (
                r.get("method") != "POST"
                or mod is None
                or mod.counts_tokens(r["path"])
                or r.get("body") is None
            ):
                continue
            body = r["body"] if isinstance(r["body"], dict) else json.loads(r["body"])
            out.append((f.name, mod.NAME, i + 1, body))
    return out


RECORDED = _recorded()


def test_the_corpus_holds_requests_of_every_protocol():
    assert {p for _, p, _, _ in RECORDED} == {"anthropic", "openai-chat", "openai-responses", "gemini"}


@pytest.mark.parametrize("name, protocol, line, body", RECORDED, ids=[f"{n}:{i}" for n, _, i, _ in RECORDED])
def test_what_real_agents_sent_is_valid(name, protocol, line, body):
    assert validate_request(protocol, body) == []


@pytest.mark.parametrize(
    "protocol, body, path, words",
    [
        (
            "anthropic",
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": {"output": "x"}}],
                    }
                ],
            },
            "body.messages[0].content[0].content",
            "a string or a list of text",
        ),
        (
            "anthropic",
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "id": 1}]}],
            },
            "body.messages[0].content[0]",
            "unknown key 'id'",
        ),
        ("anthropic", {"model": "m", "messages": []}, "body", "missing required key 'max_tokens'"),
        (
            "anthropic",
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}],
            },
            "body.messages[0].content[0]",
            "missing required key 'signature'",
        ),
        (
            "anthropic",
            {"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]},
            "body.messages[0].role",
            "expected one of",
        ),
        (
            "openai-chat",
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "body.messages[0]",
            "missing required key 'tool_call_id'",
        ),
        (
            "openai-chat",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
                        ],
                    }
                ],
            },
            "body.messages[0].tool_calls[0].function.arguments",
            "expected a string",
        ),
        (
            "openai-chat",
            {"model": "m", "messages": [{"role": "user", "content": "x", "parts": []}]},
            "body.messages[0]",
            "unknown key 'parts'",
        ),
        (
            "openai-responses",
            {"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]},
            "body.input[0]",
            "missing required key 'output'",
        ),
        (
            "openai-responses",
            {"model": "m", "input": [{"type": "agent_message", "text": "x"}]},
            "body.input[0]",
            "unknown input item type",
        ),
        (
            "gemini",
            {"contents": [{"role": "user", "parts": [{"text": "a", "functionCall": {"name": "f"}}]}]},
            "body.contents[0].parts[0]",
            "exactly one of",
        ),
        (
            "gemini",
            {
                "contents": [
                    {"role": "model", "parts": [{"functionResponse": {"name": "f", "response": "text"}}]}
                ]
            },
            "body.contents[0].parts[0].functionResponse.response",
            "expected an object",
        ),
        (
            "gemini",
            {"contents": [], "tools": [{"type": "function", "function": {}}]},
            "body.tools[0]",
            "unknown key 'type'",
        ),
    ],
)
def test_what_an_api_refuses_is_named_with_its_path(protocol, body, path, words):
    problems = validate_request(protocol, body)
    assert any(p.path == path and words in p.what for p in problems), problems


def test_gemini_snake_case_fields_are_known():
    body = {
        "contents": [{"role": "user", "parts": [{"text": "a"}]}],
        "system_instruction": {"parts": [{"text": "s"}]},
        "tools": [{"function_declarations": [{"name": "f", "parameters_json_schema": {"type": "object"}}]}],
    }
    assert validate_request("gemini", body) == []


# --------------------------------------------------------------------------- every render of the corpus


def _renders() -> list[tuple[str, Path, str]]:
    out = []
    for d in sorted((corpus_dir() / "native").iterdir()):
        for f in sorted(d.iterdir()):
            if f.name != "PROVENANCE.md" and "db-dump" not in f.name:
                out += [(d.name, f, p) for p in descriptor(d.name).protocols]
    return out


@pytest.mark.parametrize(
    "agent, path, protocol", _renders(), ids=lambda v: v.name if isinstance(v, Path) else v
)
def test_every_render_of_the_corpus_is_valid_or_says_why_not(tmp_path, agent, path, protocol):
    steps = len(read_native(path, agent)[0].trajectory.steps)
    for n in range(steps + 1):
        out = tmp_path / f"o{n}"
        try:
            prepare_only(
                PrepareOptions(
                    agent=agent,
                    after_step=n,
                    output=out,
                    trajectory=path,
                    protocol=protocol,
                    allow_damaged=True,
                )
            )
        except ReplayBadInput:
            continue  # refused with its reason (a result without a prefix)
        problems = validate_request(protocol, orjson.loads((out / "prefix.json").read_bytes()))
        warned = [
            w["message"]
            for w in json.loads((out / "result.json").read_text())["warnings"]
            if w["code"] == "render_refused"
        ]
        # what the API would refuse is never silent: each of the first problems is a warning
        assert all(any(str(p) in m for m in warned) for p in problems[:5]), (problems, warned)
        if path.name.startswith("real-"):
            # the agents' own sessions render valid in every protocol they speak
            assert problems == [], (n, problems)


def test_qwen_code_results_render_into_anthropic_as_text(tmp_path):
    # the defect of the issue: Qwen Code's {"output": TEXT} was written as tool_result.content
    path = corpus_dir() / "native" / "qwen-code" / "real-0.24.4_single.jsonl"
    prepare_only(
        PrepareOptions(
            agent="qwen-code", after_step=1, output=tmp_path, trajectory=path, protocol="anthropic"
        )
    )
    body = orjson.loads((tmp_path / "prefix.json").read_bytes())
    [result] = [
        b
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert isinstance(result["content"], str) and result["content"].startswith(
        "Command: echo hello-from-mock"
    )
    assert validate_request("anthropic", body) == []
