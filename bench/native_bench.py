"""Native adapter benchmark: parse throughput (MB/s) and peak RSS per adapter, on generated
large files, each measurement in a fresh subprocess (so one adapter's memory never counts for
another).

    .venv/bin/python bench/native_bench.py                 # default sizes, prints Markdown tables
    .venv/bin/python bench/native_bench.py --mb 200 --only claude-code,codex
    .venv/bin/python bench/native_bench.py --rounds 3      # median of 3 runs per adapter
    .venv/bin/python bench/native_bench.py --no-cli        # the library measurement only

Two measurements per file:

1. library: a child runs ``read_native`` then builds every step (iterates
   ``trajectory.steps`` once: the JSONL adapters' ``LazySteps`` read each step's texts back
   from the file then); times of both, and the child's peak RSS (``VmHWM``: ``ru_maxrss``
   would start from this process's RSS, which holds generated documents) in total and minus
   its RSS before reading (interpreter and imports);
2. CLI: ``pvisor trajectory export FILE --format atif --agent NAME > /dev/null`` as a user
   runs it (the console script next to this interpreter), wall time including interpreter
   start, and its peak RSS from ``os.wait4``, run from a small fresh interpreter so the
   figure does not start from this process's RSS.

Generated files repeat a realistic step (a task, then per step: an action with text and a
tool call, a tool result of ~2 KB) in each format's own shape, until the target size; the
``claude-code-progress`` row (read with ``claude-code``) adds 20 small ``progress`` lines per
step, as Claude Code 2.1 writes with hooks, and uuid-shaped ids: many lines, few bytes. JSONL
formats (Claude Code, Codex, Gemini CLI, Qwen Code) stream; single-document JSON formats
(mini-swe-agent, OpenCode export, OpenHands) are parsed whole.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT = "x" * 1800 + "\nexit 0\n"
TEXT = "I will look at the failing test and run it again to see the error."


def _claude(n: int) -> dict:
    parent = f"r{n - 1}" if n else None
    mid = f"msg_{n:08d}"
    return [
        {
            "parentUuid": parent,
            "isSidechain": False,
            "type": "assistant",
            "uuid": f"a{n}",
            "sessionId": "S",
            "version": "2.1.38",
            "cwd": "/w",
            "timestamp": "2026-01-01T00:00:00Z",
            "message": {
                "id": mid,
                "role": "assistant",
                "model": "claude-x",
                "content": [{"type": "text", "text": TEXT}],
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
        },
        {
            "parentUuid": f"a{n}",
            "isSidechain": False,
            "type": "assistant",
            "uuid": f"b{n}",
            "sessionId": "S",
            "version": "2.1.38",
            "cwd": "/w",
            "timestamp": "2026-01-01T00:00:00Z",
            "message": {
                "id": mid,
                "role": "assistant",
                "model": "claude-x",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{n}",
                        "name": "Bash",
                        "input": {"command": f"pytest -x tests/t{n}.py"},
                    }
                ],
            },
        },
        {
            "parentUuid": f"b{n}",
            "isSidechain": False,
            "type": "user",
            "uuid": f"r{n}",
            "sessionId": "S",
            "version": "2.1.38",
            "cwd": "/w",
            "timestamp": "2026-01-01T00:00:00Z",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": RESULT}],
            },
            "toolUseResult": {"stdout": RESULT, "stderr": "", "interrupted": False},
        },
    ]


def _uuid(tag: str, n: int, k: int = 0) -> str:
    """A uuid-shaped id (36 characters, as Claude Code writes them) for line ``tag`` ``k`` of step ``n``."""
    return (
        f"{'abrp'.index(tag) + 0xA0000000:08x}-{k:04x}-4{n >> 32 & 0xFFF:03x}-8000-{n & 0xFFFFFFFFFFFF:012x}"
    )


def _claude_progress(n: int) -> list[dict]:
    """A step as Claude Code 2.1 writes it with hooks: the action's two lines, 20 small
    ``progress`` lines in the chain between the call and its result (hook and tool progress),
    then the result; ids uuid-shaped (memory grows with lines, not bytes: 518k lines at 200 MB)."""
    a, b, r = _claude(n)
    ids = {"a": _uuid("a", n), "b": _uuid("b", n), "r": _uuid("r", n)}
    a = {**a, "uuid": ids["a"], "parentUuid": _uuid("r", n - 1) if n else "r-1"}
    b = {**b, "uuid": ids["b"], "parentUuid": ids["a"]}
    out = [a, b]
    parent = ids["b"]
    for k in range(20):
        u = _uuid("p", n, k)
        out.append(
            {
                "parentUuid": parent,
                "isSidechain": False,
                "type": "progress",
                "uuid": u,
                "sessionId": "S",
                "version": "2.1.38",
                "cwd": "/w",
                "data": {"type": "hook_progress", "hookEvent": "PostToolUse"},
                "timestamp": "2026-01-01T00:00:00Z",
            }
        )
        parent = u
    out.append({**r, "uuid": ids["r"], "parentUuid": parent})
    return out


def _claude_head() -> list[dict]:
    return [
        {
            "parentUuid": None,
            "isSidechain": False,
            "type": "user",
            "uuid": "r-1",
            "sessionId": "S",
            "version": "2.1.38",
            "cwd": "/w",
            "message": {"role": "user", "content": "fix the tests"},
        }
    ]


def _codex(n: int) -> list[dict]:
    return [
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": TEXT}],
            },
        },
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "function_call",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"pytest t{n}.py"}),
                "call_id": f"call_{n}",
            },
        },
        {
            "timestamp": "t",
            "type": "event_msg",
            "payload": {"type": "token_count", "info": {"last_token_usage": {"total_tokens": 120}}},
        },
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {"type": "function_call_output", "call_id": f"call_{n}", "output": RESULT},
        },
        {
            "timestamp": "t",
            "type": "event_msg",
            "payload": {"type": "exec_command_end", "call_id": f"call_{n}", "stdout": RESULT},
        },
    ]


def _codex_head() -> list[dict]:
    return [
        {
            "timestamp": "t",
            "type": "session_meta",
            "payload": {"id": "T", "cli_version": "0.171.0", "base_instructions": {"text": "SYS"}},
        },
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "fix the tests"}],
            },
        },
    ]


def _gemini(n: int) -> list[dict]:
    call = {
        "id": f"run_shell_command__{n}",
        "name": "run_shell_command",
        "args": {"command": f"pytest t{n}.py"},
        "status": "success",
        "result": [
            {
                "functionResponse": {
                    "id": f"run_shell_command__{n}",
                    "name": "run_shell_command",
                    "response": {"output": RESULT},
                }
            }
        ],
    }
    return [
        {"id": f"g{n}", "type": "gemini", "content": TEXT, "model": "gemini-x"},
        {"id": f"g{n}", "type": "gemini", "content": TEXT, "model": "gemini-x", "toolCalls": [call]},
        {"$set": {"lastUpdated": "t"}},
    ]


def _gemini_head() -> list[dict]:
    return [
        {"sessionId": "G", "projectHash": "h", "startTime": "t", "kind": "main"},
        {"id": "u0", "type": "user", "content": [{"text": "fix the tests"}]},
    ]


def _qwen(n: int) -> list[dict]:
    base = {"sessionId": "Q", "timestamp": "t", "cwd": "/w", "version": "0.24.4"}
    return [
        {
            **base,
            "uuid": f"a{n}",
            "parentUuid": f"t{n - 1}",
            "type": "assistant",
            "model": "qwen-x",
            "message": {
                "role": "model",
                "parts": [
                    {"text": TEXT},
                    {
                        "functionCall": {
                            "id": f"c{n}",
                            "name": "run_shell_command",
                            "args": {"command": f"pytest t{n}.py"},
                        }
                    },
                ],
            },
        },
        {
            **base,
            "uuid": f"s{n}",
            "parentUuid": f"a{n}",
            "type": "system",
            "subtype": "ui_telemetry",
            "systemPayload": {"x": 1},
        },
        {
            **base,
            "uuid": f"t{n}",
            "parentUuid": f"s{n}",
            "type": "tool_result",
            "message": {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "id": f"c{n}",
                            "name": "run_shell_command",
                            "response": {"output": RESULT},
                        }
                    }
                ],
            },
        },
    ]


def _qwen_head() -> list[dict]:
    return [
        {
            "sessionId": "Q",
            "timestamp": "t",
            "cwd": "/w",
            "version": "0.24.4",
            "uuid": "t-1",
            "parentUuid": None,
            "type": "user",
            "message": {"role": "user", "parts": [{"text": "fix the tests"}]},
        }
    ]


JSONL = {
    "claude-code": (_claude_head, _claude),
    "claude-code-progress": (_claude_head, _claude_progress),
    "codex": (_codex_head, _codex),
    "gemini-cli": (_gemini_head, _gemini),
    "qwen-code": (_qwen_head, _qwen),
}


def _write_jsonl(path: Path, head, step, size: int) -> None:
    with open(path, "w") as fh:
        written = 0
        for r in head():
            fh.write(json.dumps(r) + "\n")
        n = 0
        while written < size:
            chunk = "".join(json.dumps(r) + "\n" for r in step(n))
            fh.write(chunk)
            written += len(chunk)
            n += 1


def _write_doc(path: Path, agent: str, size: int) -> None:
    steps = max(1, size // (len(RESULT) + 400))
    if agent == "mini-swe-agent":
        msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "fix the tests"}]
        for n in range(steps):
            msgs.append(
                {
                    "role": "assistant",
                    "content": TEXT,
                    "tool_calls": [
                        {
                            "id": f"c{n}",
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": json.dumps({"command": f"pytest t{n}.py"}),
                            },
                        }
                    ],
                }
            )
            msgs.append(
                {"role": "tool", "tool_call_id": f"c{n}", "content": RESULT, "extra": {"returncode": 0}}
            )
        doc = {"info": {"mini_version": "2.4.6"}, "messages": msgs, "trajectory_format": "mini-swe-agent-1.1"}
    elif agent == "opencode":
        msgs = [
            {
                "info": {"id": "msg_0000000", "sessionID": "ses_1", "role": "user"},
                "parts": [{"id": "p", "type": "text", "text": "fix the tests"}],
            }
        ]
        for n in range(steps):
            msgs.append(
                {
                    "info": {
                        "id": f"msg_{n + 1:07d}",
                        "sessionID": "ses_1",
                        "role": "assistant",
                        "modelID": "m",
                    },
                    "parts": [
                        {"id": f"p{n}a", "type": "step-start"},
                        {"id": f"p{n}b", "type": "text", "text": TEXT},
                        {
                            "id": f"p{n}c",
                            "type": "tool",
                            "callID": f"c{n}",
                            "tool": "bash",
                            "state": {
                                "status": "completed",
                                "input": {"command": f"pytest t{n}.py"},
                                "output": RESULT,
                            },
                        },
                        {"id": f"p{n}d", "type": "step-finish", "reason": "tool-calls"},
                    ],
                }
            )
        doc = {"info": {"id": "ses_1", "version": "1.18.33", "projectID": "global"}, "messages": msgs}
    else:  # openhands
        doc = [{"id": 0, "source": "user", "action": "message", "args": {"content": "fix the tests"}}]
        for n in range(steps):
            resp = {
                "id": f"r{n}",
                "model": "m",
                "choices": [
                    {
                        "message": {
                            "content": TEXT,
                            "tool_calls": [
                                {
                                    "id": f"t{n}",
                                    "function": {
                                        "name": "execute_bash",
                                        "arguments": json.dumps({"command": f"pytest t{n}.py"}),
                                    },
                                }
                            ],
                        }
                    }
                ],
            }
            doc.append(
                {
                    "id": 2 * n + 1,
                    "source": "agent",
                    "action": "run",
                    "args": {"command": f"pytest t{n}.py"},
                    "cause": None,
                    "tool_call_metadata": {
                        "function_name": "execute_bash",
                        "tool_call_id": f"t{n}",
                        "model_response": resp,
                        "total_calls_in_response": 1,
                    },
                }
            )
            doc.append(
                {
                    "id": 2 * n + 2,
                    "source": "agent",
                    "observation": "run",
                    "content": RESULT,
                    "cause": 2 * n + 1,
                    "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": f"t{n}"},
                }
            )
    path.write_text(json.dumps(doc))


#: bench rows that read with another adapter's name
ADAPTER = {"claude-code-progress": "claude-code"}
#: how a row is named in the tables
LABEL = {"claude-code-progress": "claude-code (with progress lines)"}

SIZES_MB = {
    "claude-code": 50,
    "claude-code-progress": 50,
    "codex": 50,
    "gemini-cli": 50,
    "qwen-code": 50,
    "mini-swe-agent": 20,
    "opencode": 20,
    "openhands": 20,
}
SUFFIX = {"mini-swe-agent": ".traj.json", "opencode": ".json", "openhands": ".json", "gemini-cli": ".jsonl"}

CHILD = r"""
import gc, json, resource, sys, time
from pathlib import Path
from pvisor.adapters.native import read_native
def rss_kb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
def hwm_kb():
    # the peak of this process's own memory map (reset by exec), unlike ru_maxrss, which
    # starts from the RSS of the parent that forked it (this benchmark's, hundreds of MB)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0
base = rss_kb()
t0 = time.perf_counter()
result, _ = read_native(Path(sys.argv[1]), sys.argv[2])
t1 = time.perf_counter()
built = 0
for step in result.trajectory.steps:  # every step made, one at a time
    built += 1
t2 = time.perf_counter()
peak = hwm_kb()
lazy = type(result.trajectory.steps).__name__ == "LazySteps"
print(json.dumps({"seconds": t2 - t0, "read_seconds": t1 - t0, "build_seconds": t2 - t1, "steps": built,
                  "lazy": lazy, "peak_kb": peak, "base_kb": base,
                  "warnings": len(result.diagnostics.warnings)}))
"""


def measure(path: Path, agent: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), agent], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


PVISOR = Path(sys.executable).parent / "pvisor"


#: runs the CLI and reports its wall time and rusage; a fresh small interpreter, because a
#: child's ru_maxrss starts from the RSS of the process that forked it (exec keeps the larger)
CLI_WRAPPER = r"""
import json, os, subprocess, sys, time
t0 = time.perf_counter()
with open(os.devnull, "wb") as null:
    p = subprocess.Popen(sys.argv[1:], stdout=null, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
dt = time.perf_counter() - t0
code = os.waitstatus_to_exitcode(status)
print(json.dumps({"seconds": dt, "peak_kb": usage.ru_maxrss, "code": code,
                  "err": err.decode(errors="replace")[-500:]}))
"""


def measure_cli(path: Path, agent: str) -> dict:
    """``pvisor trajectory export PATH --format atif --agent AGENT > /dev/null``: wall seconds
    and peak RSS in KiB of that process (``os.wait4`` in :data:`CLI_WRAPPER`)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CLI_WRAPPER,
            str(PVISOR),
            "trajectory",
            "export",
            str(path),
            "--format",
            "atif",
            "--agent",
            agent,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout)
    if got["code"] != 0:
        raise SystemExit(f"{agent}: pvisor exited {got['code']}: {got['err']}")
    return {"seconds": got["seconds"], "peak_kb": got["peak_kb"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--mb",
        type=int,
        default=None,
        help="size of every generated file in MB (default: 50 for JSONL, 20 for JSON documents)",
    )
    ap.add_argument("--only", default=None, help="comma-separated adapters")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-cli", action="store_true", help="skip the `pvisor trajectory export` measurement")
    args = ap.parse_args()
    agents = args.only.split(",") if args.only else list(SIZES_MB)
    rows = []
    cli_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for agent in agents:
            size = (args.mb or SIZES_MB[agent]) * 1_000_000
            path = Path(tmp) / f"{agent}{SUFFIX.get(agent, '.jsonl')}"
            if agent in JSONL:
                _write_jsonl(path, *JSONL[agent], size)
            else:
                _write_doc(path, agent, size)
            mb = path.stat().st_size / 1e6
            reader = ADAPTER.get(agent, agent)
            runs = [measure(path, reader) for _ in range(args.rounds)]
            secs = statistics.median(r["seconds"] for r in runs)
            read = statistics.median(r["read_seconds"] for r in runs)
            r0 = runs[0]
            rows.append(
                (
                    LABEL.get(agent, agent),
                    mb,
                    r0["steps"],
                    "yes" if r0["lazy"] else "no",
                    read,
                    secs,
                    mb / secs,
                    max(r["peak_kb"] for r in runs) / 1024,
                    (max(r["peak_kb"] for r in runs) - r0["base_kb"]) / 1024,
                )
            )
            print(
                f"{agent}: {mb:.1f} MB, {r0['steps']} steps, read {read:.2f} s, "
                f"read+build {secs:.2f} s, {mb / secs:.1f} MB/s, "
                f"peak RSS {r0['peak_kb'] / 1024:.0f} MB",
                file=sys.stderr,
            )
            if not args.no_cli:
                cruns = [measure_cli(path, reader) for _ in range(args.rounds)]
                csecs = statistics.median(r["seconds"] for r in cruns)
                cpeak = max(r["peak_kb"] for r in cruns) / 1024
                cli_rows.append((LABEL.get(agent, agent), mb, csecs, mb / csecs, cpeak))
                print(
                    f"{agent}: pvisor trajectory export --format atif: {csecs:.2f} s, "
                    f"peak RSS {cpeak:.0f} MB",
                    file=sys.stderr,
                )
            path.unlink()
    print(
        "| adapter | file MB | steps | lazy steps | read s | read + build s | MB/s | peak RSS MB "
        "| of which reading MB |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for agent, mb, steps, lazy, read, secs, rate, peak, delta in rows:
        print(
            f"| {agent} | {mb:.1f} | {steps} | {lazy} | {read:.2f} | {secs:.2f} | {rate:.1f} | {peak:.0f} "
            f"| {delta:.0f} |"
        )
    if cli_rows:
        print("\n`pvisor trajectory export FILE --format atif > /dev/null`:\n")
        print("| adapter | file MB | seconds | MB/s | peak RSS MB |")
        print("|---|---:|---:|---:|---:|")
        for agent, mb, secs, rate, peak in cli_rows:
            print(f"| {agent} | {mb:.1f} | {secs:.2f} | {rate:.1f} | {peak:.0f} |")
    print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
