"""The six real agent CLIs for tests: where the pinned installs live, the scripted model they
talk to, and how to read the tool calls each agent reports on its own output.

The agents are installed by ``scripts/install-agents`` (``./scripts/test`` runs it) into
``$PVISOR_AGENTS_DIR`` or ``.agents/`` of the checkout. A missing agent fails the tests that
need it, never skips them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PVISOR = Path(sys.executable).with_name("pvisor")

#: what pvisor run gives an agent that talks to the scripted model (pvisor.session.run.SCRIPT_API_KEY)
SCRIPT_KEY = "pvisor-scripted-model-key"


@dataclass(frozen=True)
class AgentSpec:
    """An agent under test: its entry point under the agents dir, the name of its shell tool's
    command argument, the auxiliary exchanges of a first prompt, and how its native resume
    continues (``extends`` the main chain, a ``new_chain``, or None: no resume)."""

    name: str
    entrypoint: str
    arg: str
    auxiliary: int
    resume: str | None


AGENTS: dict[str, AgentSpec] = {
    s.name: s
    for s in (
        AgentSpec("claude-code", "claude-code/node_modules/.bin/claude", "command", 0, "extends"),
        AgentSpec("codex", "codex/node_modules/.bin/codex", "cmd", 0, "extends"),
        AgentSpec("gemini-cli", "gemini-cli/node_modules/.bin/gemini", "command", 0, "new_chain"),
        AgentSpec("opencode", "opencode/node_modules/.bin/opencode", "command", 1, "extends"),
        AgentSpec("qwen-code", "qwen-code/node_modules/.bin/qwen", "command", 0, "new_chain"),
        AgentSpec("mini-swe-agent", "mini-swe-agent/venv/bin/mini", "command", 0, None),
    )
}

#: the shell commands the scripted model asks for: step 1 alone, steps 2's two in parallel
COMMANDS = [
    "echo alpha > a.txt && cat a.txt",
    "echo beta > b.txt && cat b.txt",
    "echo gamma > c.txt && cat c.txt",
]
OUTPUTS = ["alpha", "beta", "gamma"]
#: a call whose output changes from run to run (the time in nanoseconds), third in step 2's batch:
#: a replay re-runs it and must flag its observation unequal
TIMED = "sleep 0.2 && date +%s%N"
FILES = {"a.txt": "alpha\n", "b.txt": "beta\n", "c.txt": "gamma\n"}
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASK = "Write a.txt, b.txt and c.txt."
RESUME_TASK = "Anything else to do?"
FINAL_TEXT = "All three files are written."
RESUMED_TEXT = "Nothing else: the files are there."


def script_for(agent: str) -> dict[str, Any]:
    """The scripted model's turns: one shell call, three parallel ones (two that write files and
    :data:`TIMED`), then the end (text; mini-swe-agent's submit command), then the answer to a
    resumed session's next prompt."""
    end: dict[str, Any] = {"text": FINAL_TEXT}
    if agent == "mini-swe-agent":  # it loops on a reply without a tool call
        end["tool_calls"] = [{"tool": "@shell", "command": SUBMIT}]
    return {
        "model": "mock-model",
        "seed": 7,
        "turns": [
            {"text": "First a file.", "tool_calls": [{"tool": "@shell", "command": COMMANDS[0]}]},
            {
                "text": "Now three at once.",
                "tool_calls": [{"tool": "@shell", "command": c} for c in [*COMMANDS[1:], TIMED]],
            },
            end,
            {"text": RESUMED_TEXT},
        ],
    }


def agents_dir() -> Path:
    env = os.environ.get("PVISOR_AGENTS_DIR")
    return Path(env) if env else REPO / ".agents"


def entrypoint(agent: str) -> Path:
    """The pinned agent's executable; fails the test (never skips) when it is not installed."""
    path = agents_dir() / AGENTS[agent].entrypoint
    if not (path.exists() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{agent} is not installed at {path}: run scripts/install-agents (./scripts/test does), "
            f"or set PVISOR_AGENTS_DIR to where it installed them",
            pytrace=False,
        )
    return path


def user_env(fake_home: Path, **extra: str) -> dict[str, str]:
    """The environment of a pvisor subprocess, with ``fake_home`` as the user's home (so a test
    can check that nothing wrote into it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "PVISOR_"))}
    env.update(
        HOME=str(fake_home),
        XDG_CONFIG_HOME=str(fake_home / ".config"),
        XDG_DATA_HOME=str(fake_home / ".local" / "share"),
        XDG_CACHE_HOME=str(fake_home / ".cache"),
        XDG_STATE_HOME=str(fake_home / ".local" / "state"),
    )
    env.update(extra)
    return env


def pvisor(
    args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the installed ``pvisor`` command; stdin /dev/null, output captured."""
    return subprocess.run(
        [str(PVISOR), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def text_of(content: Any) -> str:
    """A tool result's content as text: a string as is, content blocks' texts joined,
    anything else as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return "\n".join(str(b.get("text", json.dumps(b))) for b in content)
    return json.dumps(content)


def _lines(stdout: bytes):
    for line in stdout.split(b"\n"):
        line = line.strip()
        if line.startswith(b"{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def reported_tool_calls(agent: str, stdout: bytes, native: Path | None) -> list[tuple[str, str]]:
    """(command, output) of each shell call, in call order, as the agent itself reported them:
    its JSON events on stdout, or for mini-swe-agent (no JSON stdout) its ``-o`` trajectory.
    Codex reports the command as it ran it (``/bin/bash -lc '...'``)."""
    calls: dict[str, str] = {}
    outputs: dict[str, str] = {}
    order: list[str] = []

    def call(cid: str, command: str) -> None:
        order.append(cid)
        calls[cid] = command

    if agent in ("claude-code", "qwen-code"):
        for ev in _lines(stdout):
            content = (
                (ev.get("message") or {}).get("content") if ev.get("type") in ("assistant", "user") else None
            )
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_use":
                    call(block["id"], block["input"]["command"])
                elif block.get("type") == "tool_result":
                    outputs[block["tool_use_id"]] = text_of(block.get("content"))
    elif agent == "codex":
        for ev in _lines(stdout):
            item = ev.get("item") or {}
            if ev.get("type") == "item.completed" and item.get("type") == "command_execution":
                call(item["id"], item["command"])
                outputs[item["id"]] = item.get("aggregated_output") or ""
    elif agent == "gemini-cli":
        for ev in _lines(stdout):
            if ev.get("type") == "tool_use":
                call(ev["tool_id"], ev["parameters"]["command"])
            elif ev.get("type") == "tool_result":
                outputs[ev["tool_id"]] = text_of(ev.get("output"))
    elif agent == "opencode":
        for ev in _lines(stdout):
            part = ev.get("part") or {}
            if ev.get("type") == "tool_use":
                call(part["callID"], part["state"]["input"]["command"])
                outputs[part["callID"]] = part["state"].get("output") or ""
    elif agent == "mini-swe-agent":
        assert native is not None
        for m in json.loads(native.read_text())["messages"]:
            for tc in m.get("tool_calls") or []:
                call(tc["id"], json.loads(tc["function"]["arguments"])["command"])
            if m.get("role") == "tool":
                outputs[m["tool_call_id"]] = (m.get("extra") or {}).get("raw_output", m.get("content", ""))
    else:  # pragma: no cover
        raise AssertionError(agent)
    return [(calls[c], outputs.get(c, "")) for c in order]


def holds_output(agent: str, result: str, expected: str) -> bool:
    """Whether a shell result holds the command's output. Qwen Code 0.24.4 sometimes loses the
    output of one of two parallel shell calls that end at once (its own result then says
    ``Output: (empty)`` with exit code 0: seen about once in four runs); the capture is still
    checked against what it reported."""
    if expected in result:
        return True
    return agent == "qwen-code" and "Output: (empty)" in result and "Exit Code: 0" in result


def tree(path: Path) -> list[str]:
    """Relative paths of everything under ``path``, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (every thread's children, from /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def wait_gone(pid: int, seconds: float = 10) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@dataclass(frozen=True)
class ScriptedCapture:
    """A ``pvisor run --script`` of a real agent made by :func:`capture_scripted`: its
    ``journal``, the captured ``run`` id, the agent's ``exe`` and the ``env`` it ran with."""

    journal: Path
    run: str
    exe: str
    env: dict[str, str]


def capture_scripted(agent: str, root: Path, script: dict, task: str) -> ScriptedCapture:
    """Run ``agent`` with the scripted model answering ``script`` in ``root/ws``, with the
    journal ``root/j.sqlite`` and ``root/home`` as the user's home; fails the test unless it
    exits 0."""
    home, ws = root / "home", root / "ws"
    for d in (home, ws):
        d.mkdir(exist_ok=True)
    (root / "s.json").write_text(json.dumps(script))
    journal = root / "j.sqlite"
    exe = str(entrypoint(agent))
    env = user_env(home)
    proc = pvisor(
        ["--journal", str(journal), "run", "--agent", agent, "--agent-entrypoint", exe, "--script",
         str(root / "s.json"), "--workspace", str(ws), "--json", "--", task],
        env=env, cwd=root, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return ScriptedCapture(journal, json.loads(proc.stdout)["run"], exe, env)


#: a shell snippet that holds a process at a gate (``$1``: the gate's path): it says it arrived
#: (``GATE.arrived.PID``), then waits until the gate is open (``GATE.open``; at most 60 s)
GATE_SH = 'touch "$1.arrived.$$"; for _ in $(seq 1200); do [ -e "$1.open" ] && break; sleep 0.05; done'


def gated_entrypoint(real: Path, gate: Path, path: Path) -> Path:
    """An executable at ``path`` that runs ``real`` with its arguments, holding its ``--version``
    (the check every start of an agent makes before the run begins) at ``gate`` (:data:`GATE_SH`,
    :func:`start_together`)."""
    path.write_text(
        f'#!/bin/bash\ngate() {{ {GATE_SH}; }}\n[ "$1" = "--version" ] && gate "{gate}"\nexec "{real}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def start_together(
    commands: list[list[str]], gate: Path, *, env: dict[str, str], cwd: Path, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Start ``commands`` at once and open ``gate`` once every one of them has arrived at it or
    ended: the processes that reach it pass it together (whatever their start-up times), so two
    starts race as two made at the same moment. Returns their results, in order."""
    procs = [
        subprocess.Popen(
            cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for cmd in commands
    ]
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            arrived = len(list(gate.parent.glob(gate.name + ".arrived.*")))
            if arrived + sum(p.poll() is not None for p in procs) >= len(procs):
                break
            time.sleep(0.05)
        gate.with_name(gate.name + ".open").touch()
        out = []
        for cmd, p in zip(commands, procs):
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout.decode(), stderr.decode()))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def rollout_live_script(seed: int) -> dict:
    """The live model of the rollout tests (several rollouts against one server: ``main_chain``
    ``any-tools``): request N+1 = 2 (one reply in its history) gets a shell call, request 3 the
    end, which carries mini-swe-agent's submit command too (every agent ends on it or on the
    text)."""
    end = {"text": "Live done.", "tool_calls": [{"tool": "@shell", "command": SUBMIT}]}
    return {
        "model": "live-model",
        "seed": seed,
        "main_chain": "any-tools",
        "turns": [
            {"text": "never served"},
            {"text": "A live step.", "tool_calls": [{"tool": "@shell", "command": "echo live > live.txt"}]},
            end,
        ],
    }
