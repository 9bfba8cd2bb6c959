"""Codex with no model configured (issue 14, item 5): with its default model Codex 0.171 sends no
``tools`` field but one ``additional_tools`` input item holding every tool in namespaces, and its
only top-level tool is ``exec``, a free-form (custom) tool that runs JavaScript whose nested
``tools.exec_command`` runs a shell command. The Responses module reads the item as the
client's own input and offers its tools; the chain rule and the scripted model read them, so
the run is captured step by step.

The run goes through ``pvisor run --upstream`` to a ``pvisor serve-model`` (``--script`` would
give Codex pvisor's script model name, with which Codex sends a ``tools`` field).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import orjson
import pytest

from agent_helpers import PVISOR, entrypoint, pvisor, user_env
from pvisor.adapters.chains import classify_run
from pvisor.adapters.journal_trajectory import build_trajectory
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow

SCRIPT = {
    "main_chain": "tools",
    "turns": [
        {
            "text": "Running code.",
            "tool_calls": [
                {
                    "tool": "exec",
                    "command": "const r = await tools.exec_command("
                    "{cmd: 'echo alpha > a.txt && cat a.txt'}); text(r);",
                }
            ],
        },
        {"text": "Done."},
    ],
}


def test_codex_with_its_default_model_is_captured_step_by_step(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SCRIPT))
    ready = tmp_path / "ready.json"
    server = subprocess.Popen(
        [
            str(PVISOR),
            "serve-model",
            "--script",
            str(tmp_path / "s.json"),
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.05)
        url = orjson.loads(ready.read_bytes())["url"]
        ws, home = tmp_path / "ws", tmp_path / "home"
        ws.mkdir()
        home.mkdir()
        journal = tmp_path / "data" / "journal.sqlite"
        proc = pvisor(
            [
                "--journal",
                str(journal),
                "run",
                "--agent",
                "codex",
                "--agent-entrypoint",
                str(entrypoint("codex")),
                "--upstream",
                url,
                "--workspace",
                str(ws),
                "--timeout",
                "200",
                "--json",
                "--",
                "make a.txt",
            ],
            env=user_env(home, OPENAI_API_KEY="sk-test-not-a-real-key"),
            cwd=tmp_path,
            timeout=260,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        report = json.loads(proc.stdout)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        server.stderr.close()
    assert (ws / "a.txt").read_text() == "alpha\n"  # the nested exec_command ran
    assert report["exit_code"] == 0 and report["steps"] == 2
    with JournalReader(journal) as reader:
        c = classify_run(reader, report["run"])
        first = c.main_requests[0]
        body = orjson.loads(reader.request_body(first.exchange))
        assert (
            "tools" not in body and body["input"][0]["type"] == "additional_tools"
        )  # the shape this test is about
        assert "exec" in first.tool_names
        traj = build_trajectory(reader, c)
    step = traj.steps[0]
    assert [(call.name, call.kind) for call in step.action.tool_calls] == [("exec", "custom")]
    assert len(step.observation.results) == 1 and "alpha" in json.dumps(step.observation.results[0].content)
    assert traj.steps[1].action.text == "Done."
    conv = get_protocol("openai-responses").parse_request(body)
    assert conv.messages[0].role == "developer"
