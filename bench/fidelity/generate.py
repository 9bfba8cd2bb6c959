"""Synthetic native trajectories for the fidelity benchmark, and their manifest.

Each trajectory holds a task and two steps, each step one model reply with a tool batch (1 to
3 parallel calls in the first, one call in the second) and its results, written in the
agent's own file format (shapes as in docs/native.md, tests/corpus/native/ and
bench/native_bench.py). Commands and outputs are varied per trajectory (quotes, backslashes,
non-ASCII, newlines, ``${VAR}``) and carry random tokens, so the checker can find them, and
the second step's tokens (call ids, command, text, output) are unique to it, so the checker
can tell whether any of A2 leaked into the prefix.

The manifest (``manifest.json``) is what the checker trusts: per trajectory the agent, the
file and its sha256, the first batch's calls (id, name, exact arguments: the string for formats
that store a string, the object (key order kept) for those that store an object) and their
exact outputs, and the second step's tokens. Standard library only; pvisor is never imported.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

AGENTS = (
    "claude-code",
    "codex",
    "gemini-cli",
    "qwen-code",
    "opencode",
    "mini-swe-agent",
    "openhands",
    "swe-agent",
)
SUFFIX = {
    "claude-code": ".jsonl",
    "codex": ".jsonl",
    "gemini-cli": ".jsonl",
    "qwen-code": ".jsonl",
    "opencode": ".json",
    "mini-swe-agent": ".traj.json",
    "openhands": ".json",
    "swe-agent": ".traj",
}
#: formats that store a call's arguments as a JSON string (kept exactly), not an object
STRING_ARGS = frozenset({"codex", "mini-swe-agent", "openhands", "swe-agent"})

_ODD = [
    'it\'s "quoted"',
    "back\\slash",
    "tab\there",
    "ünïcödé ✓ 日本",
    "${HOME} $((1+1))",
    "a\nb",
    "<tag>&amp;",
    "emoji 🚀",
]


def _tok(rng: random.Random, prefix: str) -> str:
    return f"{prefix}{rng.getrandbits(64):016x}"


def _command(rng: random.Random, tag: str) -> str:
    return f"grep -rn '{tag}' src/ && echo {json.dumps(rng.choice(_ODD))} | wc -c"


def _output(rng: random.Random, tag: str) -> str:
    lines = [f"src/m{k}.py:{rng.randint(1, 999)}: {tag} {rng.choice(_ODD)}" for k in range(rng.randint(1, 6))]
    return "\n".join(lines) + "\n" + "x" * rng.randint(0, 400) + "\nexit 0\n"


def plan(rng: random.Random, agent: str, i: int) -> dict:
    """The content of trajectory ``i``: task, two steps; tokens random."""
    n1 = 1 + i % 3
    step1 = []
    for k in range(n1):
        tag = _tok(rng, "B1T")
        cmd = _command(rng, tag)
        step1.append(
            {
                "id": _tok(rng, "call_b1_"),
                "name": "bash",
                "command": cmd,
                "output": _output(rng, tag),
                "workdir": f"/w/{k}",
            }
        )
    tag2 = _tok(rng, "B2T")
    step2 = {
        "id": _tok(rng, "call_b2_"),
        "name": "bash",
        "command": _command(rng, tag2),
        "output": _output(rng, tag2),
        "text": f"Now the second step {_tok(rng, 'B2X')}.",
        "workdir": "/w/9",
    }
    return {
        "task": f"Fix the failing test {i} ({rng.choice(_ODD)}) {_tok(rng, 'TASK')}",
        "text1": f"I will search first {_tok(rng, 'B1X')}.",
        "step1": step1,
        "step2": step2,
    }


def _args_obj(call: dict) -> dict:
    return {"command": call["command"], "workdir": call["workdir"]}


def _args_str(call: dict, i: int) -> str:
    # exact strings differ from compact json.dumps on purpose (spacing, escaping): the prefix must keep them
    obj = _args_obj(call)
    return json.dumps(obj, ensure_ascii=bool(i % 2), separators=(", ", ": ") if i % 3 else (",", ":"))


# --- writers: (plan, i) -> file text -------------------------------------------------------


def _claude(p: dict, i: int) -> str:
    base = {
        "isSidechain": False,
        "sessionId": f"sess-{i}",
        "version": "2.1.38",
        "cwd": "/w",
        "userType": "external",
        "timestamp": "2026-01-01T00:00:00Z",
    }
    lines = [
        {
            **base,
            "parentUuid": None,
            "type": "user",
            "uuid": "u0",
            "message": {"role": "user", "content": p["task"]},
        }
    ]
    parent = "u0"
    for s, (text, calls) in enumerate(
        [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])], start=1
    ):
        mid = f"msg_{s}_{i}"
        lines.append(
            {
                **base,
                "parentUuid": parent,
                "type": "assistant",
                "uuid": f"a{s}t",
                "message": {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": None,
                    "usage": {"input_tokens": 10, "output_tokens": 5},
                },
            }
        )
        parent = f"a{s}t"
        for k, c in enumerate(calls):
            lines.append(
                {
                    **base,
                    "parentUuid": parent,
                    "type": "assistant",
                    "uuid": f"a{s}c{k}",
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-sonnet-4-5",
                        "content": [
                            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": _args_obj(c)}
                        ],
                        "stop_reason": None,
                        "usage": {"input_tokens": 10, "output_tokens": 5},
                    },
                }
            )
            parent = f"a{s}c{k}"
        for k, c in enumerate(calls):
            lines.append(
                {
                    **base,
                    "parentUuid": parent,
                    "type": "user",
                    "uuid": f"r{s}c{k}",
                    "message": {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": c["id"],
                                "content": c["output"],
                                "is_error": False,
                            }
                        ],
                    },
                    "toolUseResult": {"stdout": c["output"], "stderr": "", "interrupted": False},
                }
            )
            parent = f"r{s}c{k}"
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)


def _codex(p: dict, i: int) -> str:
    lines = [
        {
            "timestamp": "t",
            "type": "session_meta",
            "payload": {
                "id": f"T{i}",
                "cwd": "/w",
                "cli_version": "0.171.0",
                "originator": "codex_cli_rs",
                "base_instructions": {"text": "You are Codex."},
            },
        },
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": p["task"]}],
            },
        },
    ]
    for text, calls in [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])]:
        lines.append(
            {
                "timestamp": "t",
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                },
            }
        )
        for c in calls:
            lines.append(
                {
                    "timestamp": "t",
                    "type": "response_item",
                    "payload": {
                        "type": "function_call",
                        "name": "exec_command",
                        "arguments": c["args_raw"],
                        "call_id": c["id"],
                    },
                }
            )
        lines.append(
            {
                "timestamp": "t",
                "type": "event_msg",
                "payload": {"type": "token_count", "info": {"last_token_usage": {"total_tokens": 120}}},
            }
        )
        for c in calls:
            lines.append(
                {
                    "timestamp": "t",
                    "type": "response_item",
                    "payload": {"type": "function_call_output", "call_id": c["id"], "output": c["output"]},
                }
            )
            lines.append(
                {
                    "timestamp": "t",
                    "type": "event_msg",
                    "payload": {
                        "type": "exec_command_end",
                        "call_id": c["id"],
                        "stdout": c["output"],
                        "exit_code": 0,
                    },
                }
            )
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)


def _gemini(p: dict, i: int) -> str:
    lines = [
        {
            "sessionId": f"G{i}",
            "projectHash": "h",
            "startTime": "2026-01-01T00:00:00Z",
            "lastUpdated": "2026-01-01T00:00:00Z",
            "kind": "main",
        },
        {"id": "u0", "timestamp": "2026-01-01T00:00:00Z", "type": "user", "content": [{"text": p["task"]}]},
    ]
    for s, (text, calls) in enumerate(
        [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])], start=1
    ):
        tcs = [
            {
                "id": c["id"],
                "name": "run_shell_command",
                "args": _args_obj(c),
                "status": "success",
                "timestamp": "2026-01-01T00:00:00Z",
                "result": [
                    {
                        "functionResponse": {
                            "id": c["id"],
                            "name": "run_shell_command",
                            "response": {"output": c["output"]},
                        }
                    }
                ],
            }
            for c in calls
        ]
        lines.append(
            {
                "id": f"g{s}",
                "timestamp": "2026-01-01T00:00:00Z",
                "type": "gemini",
                "content": text,
                "model": "gemini-2.5-pro",
            }
        )
        lines.append(
            {
                "id": f"g{s}",
                "timestamp": "2026-01-01T00:00:00Z",
                "type": "gemini",
                "content": text,
                "model": "gemini-2.5-pro",
                "toolCalls": tcs,
            }
        )
        lines.append({"$set": {"lastUpdated": "2026-01-01T00:00:01Z"}})
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)


def _qwen(p: dict, i: int) -> str:
    base = {"sessionId": f"Q{i}", "timestamp": "2026-01-01T00:00:00Z", "cwd": "/w", "version": "0.24.4"}
    lines = [
        {
            **base,
            "uuid": "u0",
            "parentUuid": None,
            "type": "user",
            "message": {"role": "user", "parts": [{"text": p["task"]}]},
        }
    ]
    parent = "u0"
    for s, (text, calls) in enumerate(
        [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])], start=1
    ):
        parts = [{"text": text}] + [
            {"functionCall": {"id": c["id"], "name": "run_shell_command", "args": _args_obj(c)}}
            for c in calls
        ]
        lines.append(
            {
                **base,
                "uuid": f"a{s}",
                "parentUuid": parent,
                "type": "assistant",
                "model": "qwen3-coder-plus",
                "message": {"role": "model", "parts": parts},
            }
        )
        lines.append(
            {
                **base,
                "uuid": f"s{s}",
                "parentUuid": f"a{s}",
                "type": "system",
                "subtype": "ui_telemetry",
                "systemPayload": {"x": 1},
            }
        )
        parent = f"s{s}"
        for k, c in enumerate(calls):
            lines.append(
                {
                    **base,
                    "uuid": f"t{s}{k}",
                    "parentUuid": parent,
                    "type": "tool_result",
                    "message": {
                        "role": "user",
                        "parts": [
                            {
                                "functionResponse": {
                                    "id": c["id"],
                                    "name": "run_shell_command",
                                    "response": {"output": c["output"]},
                                }
                            }
                        ],
                    },
                }
            )
            parent = f"t{s}{k}"
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)


def _opencode(p: dict, i: int) -> str:
    sid = f"ses_{i:04d}"
    msgs = [
        {
            "info": {"id": "msg_0000000", "sessionID": sid, "role": "user", "time": {"created": 1}},
            "parts": [{"id": "p0", "type": "text", "text": p["task"]}],
        }
    ]
    for s, (text, calls) in enumerate(
        [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])], start=1
    ):
        parts = [{"id": f"p{s}a", "type": "step-start"}, {"id": f"p{s}b", "type": "text", "text": text}]
        for k, c in enumerate(calls):
            parts.append(
                {
                    "id": f"p{s}c{k}",
                    "type": "tool",
                    "callID": c["id"],
                    "tool": "bash",
                    "state": {
                        "status": "completed",
                        "input": _args_obj(c),
                        "output": c["output"],
                        "title": "bash",
                        "metadata": {},
                    },
                }
            )
        parts.append({"id": f"p{s}d", "type": "step-finish", "reason": "tool-calls"})
        msgs.append(
            {
                "info": {
                    "id": f"msg_{s:07d}",
                    "sessionID": sid,
                    "role": "assistant",
                    "modelID": "gpt-5",
                    "providerID": "openai",
                    "time": {"created": 1 + s},
                },
                "parts": parts,
            }
        )
    return json.dumps(
        {"info": {"id": sid, "version": "1.18.33", "projectID": "global", "title": "t"}, "messages": msgs},
        ensure_ascii=False,
    )


def _mini(p: dict, i: int) -> str:
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": p["task"]},
    ]
    for text, calls in [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])]:
        msgs.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": "bash", "arguments": c["args_raw"]},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            msgs.append(
                {"role": "tool", "tool_call_id": c["id"], "content": c["output"], "extra": {"returncode": 0}}
            )
    doc = {
        "info": {"mini_version": "2.4.6", "config": {"model": {"model_name": "openai/gpt-5"}}},
        "messages": msgs,
        "trajectory_format": "mini-swe-agent-1.1",
    }
    return json.dumps(doc, ensure_ascii=False)


def _openhands(p: dict, i: int) -> str:
    doc = [
        {
            "id": 0,
            "source": "agent",
            "action": "system",
            "args": {"content": "You are OpenHands agent.", "tools": [], "openhands_version": "0.58.0"},
        },
        {"id": 1, "source": "user", "action": "message", "args": {"content": p["task"]}},
    ]
    eid = 2
    for s, (text, calls) in enumerate(
        [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])], start=1
    ):
        resp = {
            "id": f"resp{s}_{i}",
            "model": "gpt-5",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "tool_calls": [
                            {
                                "id": c["id"],
                                "type": "function",
                                "function": {"name": "execute_bash", "arguments": c["args_raw"]},
                            }
                            for c in calls
                        ],
                    }
                }
            ],
        }
        ids = []
        for c in calls:
            doc.append(
                {
                    "id": eid,
                    "source": "agent",
                    "action": "run",
                    "args": {"command": c["command"]},
                    "cause": None,
                    "tool_call_metadata": {
                        "function_name": "execute_bash",
                        "tool_call_id": c["id"],
                        "model_response": resp,
                        "total_calls_in_response": len(calls),
                    },
                }
            )
            ids.append(eid)
            eid += 1
        for c, cause in zip(calls, ids):
            doc.append(
                {
                    "id": eid,
                    "source": "agent",
                    "observation": "run",
                    "content": c["output"],
                    "cause": cause,
                    "extras": {"exit_code": 0},
                    "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": c["id"]},
                }
            )
            eid += 1
    return json.dumps(doc, ensure_ascii=False)


def _swe(p: dict, i: int) -> str:
    hist = [
        {"role": "system", "content": "SYSTEM", "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": p["task"], "agent": "main", "message_type": "observation"},
    ]
    for text, calls in [(p["text1"], p["step1"]), (p["step2"]["text"], [p["step2"]])]:
        hist.append(
            {
                "role": "assistant",
                "content": text,
                "agent": "main",
                "message_type": "action",
                "thought": text,
                "action": calls[0]["command"],
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": "bash", "arguments": c["args_raw"]},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            hist.append(
                {
                    "role": "tool",
                    "content": c["output"],
                    "agent": "main",
                    "message_type": "observation",
                    "tool_call_ids": [c["id"]],
                }
            )
    return json.dumps(
        {"trajectory": [], "history": hist, "info": {"swe_agent_version": "1.1.0"}, "environment": "main"},
        ensure_ascii=False,
    )


WRITERS = {
    "claude-code": _claude,
    "codex": _codex,
    "gemini-cli": _gemini,
    "qwen-code": _qwen,
    "opencode": _opencode,
    "mini-swe-agent": _mini,
    "openhands": _openhands,
    "swe-agent": _swe,
}


def generate(out: Path, agents, per_agent: int, seed: int) -> dict:
    """Write ``per_agent`` trajectories per agent into ``out`` and return the manifest (also
    written to ``out/manifest.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    items = []
    for agent in agents:
        rng = random.Random(f"{seed}:{agent}")
        for i in range(per_agent):
            p = plan(rng, agent, i)
            for c in p["step1"] + [p["step2"]]:
                c["args_raw"] = _args_str(c, i)
            path = out / f"{agent}-{i:02d}{SUFFIX[agent]}"
            data = WRITERS[agent](p, i).encode()
            path.write_bytes(data)
            s2 = p["step2"]
            items.append(
                {
                    "agent": agent,
                    "index": i,
                    "file": str(path),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "task": p["task"],
                    "batch1": [
                        {
                            "id": c["id"],
                            "arguments_raw": c["args_raw"] if agent in STRING_ARGS else None,
                            "arguments": _args_obj(c),
                            "output": c["output"],
                        }
                        for c in p["step1"]
                    ],
                    # every string of A2 and O2 that must not reach the prefix
                    "step2_tokens": [
                        s2["id"],
                        s2["command"],
                        s2["text"],
                        s2["output"],
                        s2["command"].split("'")[1],
                    ],
                }
            )
    manifest = {"seed": seed, "per_agent": per_agent, "items": items}
    (out / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1))
    return manifest
