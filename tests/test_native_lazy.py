"""The JSONL adapters hold a trajectory's structure, not its texts (issue 6 "Scale": a 200 MB
file under 150 MB peak RSS, measured by bench/native_bench.py, figures in docs/benchmarks.md).

Shown by behaviour instead of by memory figures: after reading, the result texts are
rewritten in the file (same length); steps built afterwards carry the new texts, so they were
read from the file when the step was built, not kept. A file cut after reading is exit 65
naming it, never a wrong step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pvisor.adapters.native import read_native
from pvisor.adapters.native.assembly import LazySteps
from pvisor.core.errors import BadInputError

OLD, NEW = "result-AAAA-of-the-tool", "result-BBBB-of-the-tool"


def _records(agent: str) -> list[dict]:
    """Three steps of ``agent``'s own shape, each tool result text ``OLD`` + step number."""
    if agent == "claude-code":
        recs = [
            {
                "parentUuid": None,
                "isSidechain": False,
                "type": "user",
                "uuid": "u0",
                "sessionId": "S",
                "version": "2.1.38",
                "message": {"role": "user", "content": "fix it"},
            }
        ]
        for n in range(1, 4):
            common = {"isSidechain": False, "sessionId": "S", "version": "2.1.38"}
            recs += [
                {
                    **common,
                    "parentUuid": f"u{n - 1}",
                    "type": "assistant",
                    "uuid": f"a{n}",
                    "message": {
                        "id": f"m{n}",
                        "role": "assistant",
                        "model": "x",
                        "content": [
                            {"type": "tool_use", "id": f"t{n}", "name": "Bash", "input": {"command": "ls"}}
                        ],
                    },
                },
                {
                    **common,
                    "parentUuid": f"a{n}",
                    "type": "user",
                    "uuid": f"u{n}",
                    "message": {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": f"{OLD}{n}"}],
                    },
                },
            ]
        return recs
    if agent == "codex":
        recs = [
            {"type": "session_meta", "payload": {"id": "s", "cli_version": "0.171.0"}},
            {
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "fix it"}],
                },
            },
        ]
        for n in range(1, 4):
            recs += [
                {
                    "type": "response_item",
                    "payload": {
                        "type": "function_call",
                        "name": "shell",
                        "arguments": "{}",
                        "call_id": f"c{n}",
                    },
                },
                {
                    "type": "response_item",
                    "payload": {"type": "function_call_output", "call_id": f"c{n}", "output": f"{OLD}{n}"},
                },
            ]
        return recs
    if agent == "gemini-cli":
        recs = [
            {"sessionId": "g", "projectHash": "p", "startTime": "t", "lastUpdated": "t", "kind": "main"},
            {"id": "m0", "timestamp": "t", "type": "user", "content": [{"text": "fix it"}]},
        ]
        for n in range(1, 4):
            recs.append(
                {
                    "id": f"m{n}",
                    "timestamp": "t",
                    "type": "gemini",
                    "content": "",
                    "model": "g",
                    "toolCalls": [
                        {
                            "id": f"run__{n}",
                            "name": "run",
                            "args": {},
                            "status": "success",
                            "result": [
                                {
                                    "functionResponse": {
                                        "id": f"run__{n}",
                                        "name": "run",
                                        "response": {"output": f"{OLD}{n}"},
                                    }
                                }
                            ],
                        }
                    ],
                }
            )
        return recs
    if agent == "qwen-code":
        recs = [
            {
                "uuid": "u0",
                "parentUuid": None,
                "sessionId": "Q",
                "version": "0.24.4",
                "type": "user",
                "message": {"role": "user", "parts": [{"text": "fix it"}]},
            }
        ]
        for n in range(1, 4):
            recs += [
                {
                    "uuid": f"a{n}",
                    "parentUuid": f"u{n - 1}",
                    "sessionId": "Q",
                    "version": "0.24.4",
                    "type": "assistant",
                    "model": "q",
                    "message": {
                        "role": "model",
                        "parts": [{"functionCall": {"id": f"c{n}", "name": "run", "args": {}}}],
                    },
                },
                {
                    "uuid": f"u{n}",
                    "parentUuid": f"a{n}",
                    "sessionId": "Q",
                    "version": "0.24.4",
                    "type": "tool_result",
                    "message": {
                        "role": "user",
                        "parts": [
                            {
                                "functionResponse": {
                                    "id": f"c{n}",
                                    "name": "run",
                                    "response": {"output": f"{OLD}{n}"},
                                }
                            }
                        ],
                    },
                },
            ]
        return recs
    raise AssertionError(agent)


AGENTS = ["claude-code", "codex", "gemini-cli", "qwen-code"]


def _result_texts(steps) -> list[str]:
    out = []
    for s in steps:
        for r in s.observation.results:
            out.append(json.dumps(r.content))
    return out


@pytest.mark.parametrize("agent", AGENTS)
def test_steps_are_read_from_the_file_when_built_not_kept(tmp_path: Path, agent: str):
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(agent)))
    result, _ = read_native(path, agent)
    steps = result.trajectory.steps
    assert isinstance(steps, LazySteps) and len(steps) == 3
    before = _result_texts(steps)
    assert all(OLD in t for t in before), before
    path.write_bytes(path.read_bytes().replace(OLD.encode(), NEW.encode()))
    after = _result_texts(steps)
    assert after == [t.replace(OLD, NEW) for t in before]


@pytest.mark.parametrize("agent", AGENTS)
def test_a_file_cut_after_reading_is_exit_65_naming_it(tmp_path: Path, agent: str):
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(agent)))
    result, _ = read_native(path, agent)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(BadInputError) as exc:
        list(result.trajectory.steps)
    assert str(path) in str(exc.value) and "changed while it was read" in str(exc.value)
    assert exc.value.exit_code == 65
