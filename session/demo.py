"""``pvisor demo``: the whole capture path, offline, in about a second.

A scripted model server stands in for the model API, the capture gateway sits in front of it,
and a minimal built-in agent loop talks to the gateway in the Anthropic Messages protocol: it
asks for a step, runs the shell command the model asked for (really, in a scratch workspace),
sends the result back, and stops when the model answers without a tool call. The exchanges
land in the journal like any agent's.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import aiohttp
import orjson

from pvisor.adapters.protocols import anthropic
from pvisor.gateway.proxy import GatewayConfig
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_server import ScriptedModelServer
from pvisor.session.session import Session, SessionConfig

DEMO_SCRIPT = {
    "model": "demo-model",
    "seed": 42,
    "turns": [
        {
            "text": "I'll create the file and show it.",
            "tool_calls": [
                {"tool": "@shell", "command": "echo 'hello from pvisor' > hello.txt && cat hello.txt"}
            ],
        },
        {"text": "Done: hello.txt says hello."},
    ],
}

DEMO_TASK = "Create hello.txt containing a greeting, then show it."

BASH_TOOL = {
    "name": "bash",
    "description": "Run a shell command in the workspace and return its output.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
    },
}

MAX_STEPS = 5


@dataclass
class DemoResult:
    """What the demo did: the run id, the gateway URL, the number of steps, the workspace."""

    run: str
    gateway_url: str
    steps: int
    workspace: Path


def _run_tool(command: str, workspace: Path) -> tuple[str, bool]:
    proc = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    return proc.stdout + proc.stderr, proc.returncode != 0


async def _agent_loop(url: str, workspace: Path, say: Callable[[str], None]) -> int:
    """The built-in agent: Anthropic Messages, streamed, one shell tool."""
    messages: list[dict] = [{"role": "user", "content": DEMO_TASK}]
    headers = {
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
        "x-api-key": "demo-key-not-a-secret",
    }
    steps = 0
    async with aiohttp.ClientSession() as http:
        while steps < MAX_STEPS:
            body = {
                "model": "demo-model",
                "max_tokens": 1024,
                "system": "You are a careful coding agent.",
                "tools": [BASH_TOOL],
                "messages": messages,
                "stream": True,
            }
            async with http.post(url + "/v1/messages", data=orjson.dumps(body), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"model request failed with HTTP {resp.status}: {raw[:200]!r}")
            final = anthropic.reassemble([raw]).final
            action = anthropic.response_to_action(final)
            steps += 1
            say(f"step {steps}: model says {action.text!r}")
            messages.append({"role": "assistant", "content": final["content"]})
            if not action.tool_calls:
                break
            results = []
            for call in action.tool_calls:
                command = call.arguments["command"]
                output, failed = _run_tool(command, workspace)
                say(f"        ran {command!r} -> {output.strip()!r}")
                results.append(
                    {"type": "tool_result", "tool_use_id": call.id, "content": output, "is_error": failed}
                )
            messages.append({"role": "user", "content": results})
    return steps


async def run_demo(
    journal_path: Path, say: Callable[[str], None] = print, workspace: Path | None = None
) -> DemoResult:
    """Run the demo against the journal at ``journal_path``; ``say`` receives progress lines."""
    model = ScriptedModel(parse_script(DEMO_SCRIPT, "demo script"))
    server = ScriptedModelServer(model)
    upstream = await server.start()
    # the address, the journal, the gateway (no signals: Ctrl-C ends the demo as any program)
    session = Session(SessionConfig(journal_path, GatewayConfig(port=0, upstreams={"anthropic": upstream})))
    try:
        url = await session.start()
        gateway, journal = session.gateway, session.journal
        assert gateway is not None and journal is not None
        journal.update_run(gateway.run, agent="pvisor-demo", argv=["pvisor", "demo"])
        say(f"scripted model at {upstream}; gateway at {url}; run {gateway.run}")
        with tempfile.TemporaryDirectory(prefix="pvisor-demo-") as tmp:
            ws = workspace or Path(tmp)
            steps = await _agent_loop(url, ws, say)
    finally:
        await session.stop()  # the gateway, then the journal
        await server.stop()  # the upstream last: an exchange in flight still reaches it
    return DemoResult(run=gateway.run, gateway_url=url, steps=steps, workspace=ws)


def main(journal_path: Path, say: Callable[[str], None] = print) -> DemoResult:
    return asyncio.run(run_demo(journal_path, say))
