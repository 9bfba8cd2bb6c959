"""The key of a continuation in a sandbox (docs/replay.md "Keys in a continuation"): the agent
holds a dummy key and the gateway puts the user's key in its place when it forwards, so that no
recorded or live call can read it. mini-swe-agent, captured offline against the scripted model,
is continued after step 1 in the default sandbox against a local scripted model server that
records the keys it receives; step 1 (replayed) and the live step run ``env``."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from agent_helpers import SUBMIT, entrypoint, pvisor, user_env
from test_credentials import RecordingModelServer, assert_nowhere

from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.journal.reader import JournalReader
from pvisor.session.sandbox import bwrap_problem

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
AGENT = "mini-swe-agent"
REAL = "real-user-key-in-a-sandbox-4Tq9Wm2Xc7Lp"
ENV = "env | grep API_KEY"


def test_a_sandboxed_continuation_gives_the_agent_a_dummy_and_the_upstream_the_key(loop_thread, tmp_path):
    """Fails before: with the user's key in the environment and an --upstream, the sandboxed
    agent was given the real key (its ``env`` showed it) and the result had no ``key``."""
    if bwrap_problem() is not None:
        pytest.fail(f"the sandbox tests need bubblewrap: {bwrap_problem()}", pytrace=False)
    home, recorded, ws = tmp_path / "home", tmp_path / "recorded", tmp_path / "ws"
    for d in (home, recorded, ws):
        d.mkdir()
    journal, out = tmp_path / "data" / "journal.sqlite", tmp_path / "out"
    end = {"text": "Done.", "tool_calls": [{"tool": "@shell", "command": SUBMIT}]}
    step = {"text": "My environment.", "tool_calls": [{"tool": "@shell", "command": ENV}]}
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "mock-model", "seed": 5, "turns": [step, end]}))
    proc = pvisor(
        ["--journal", str(journal), "run", "--agent", AGENT, "--agent-entrypoint", str(entrypoint(AGENT)),
         "--script", str(script), "--workspace", str(recorded), "--timeout", "240", "--json", "--", "Look."],
        env=user_env(home), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)["run"]

    # the live model: request 2 (one reply in its history) gets the env call, request 3 the end
    live = {"model": "live-model", "seed": 11, "turns": [{"text": "never served"}, step, end]}
    server = RecordingModelServer(ScriptedModel(parse_script(live, "live script")))
    url = loop_thread.run(server.start())
    try:
        proc = pvisor(
            ["--journal", str(journal), "replay", "--agent", AGENT, "--run", run, "--after-step", "1",
             "--workspace", str(ws), "--output", str(out), "--agent-entrypoint", str(entrypoint(AGENT)),
             "--timeout", "240", "--upstream", url, "--max-steps", "2"],
            env=user_env(home, OPENAI_API_KEY=REAL), cwd=tmp_path, timeout=300,
        )  # fmt: skip
    finally:
        loop_thread.run(server.stop())
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "ok" and result["sandbox"]["mode"] == "bwrap"
    # every request that reached the live model carried the user's key
    assert len(server.keys) >= 2 and all(k.get("authorization") == f"Bearer {REAL}" for k in server.keys)
    # the replayed call (in request N+1, the prefix) and the live one saw the dummy only
    prefix = (out / "prefix.json").read_text()
    assert "OPENAI_API_KEY=pvisor-dummy-key-" in prefix
    with JournalReader(journal) as r:
        bodies = b"".join(r.request_body(e) or b"" for e in r.exchanges(result["derived_run"]))
    assert bodies.decode().count("OPENAI_API_KEY=pvisor-dummy-key-") >= 2
    for path in [p for p in (tmp_path / "data").rglob("*") if p.is_file()] + [out / "result.json"]:
        assert_nowhere(path.read_bytes(), REAL, str(path))
    assert_nowhere((proc.stdout + proc.stderr).encode(), REAL, "pvisor's output")
    assert result["sandbox"]["key"] == "swapped"
