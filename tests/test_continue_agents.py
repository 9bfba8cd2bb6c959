"""Continuation with the six real agents (pinned CLIs under .agents/): the session capture of the
agent tests (step 1 one shell call, step 2 a batch of three) is continued after step 1 in a
fresh workspace by ``pvisor replay`` without a mode flag. The live model is a scripted model
server behind a pvisor capture gateway of the test's own, whose journal holds every body that
reached the live side exactly as it arrived. Nothing is mocked; agents run one at a time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema
import orjson
import pytest
from agent_captures import _run
from agent_helpers import AGENTS, SUBMIT, entrypoint, pvisor, tree, user_env
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
ALL = list(AGENTS)
PROMPT = "Before you go on, list the files you wrote."
LIVE_COMMAND = "echo live > live.txt && cat live.txt"
#: keys the agents read from the environment when they talk to a live upstream (never a real one)
KEYS = {
    "ANTHROPIC_API_KEY": "sk-ant-test-live-0001",
    "OPENAI_API_KEY": "sk-test-live-0002",
    "GEMINI_API_KEY": "test-live-0003",
}
SECRETS_SENT = list(KEYS.values())  # no piece of them in any journal, log or result.json (conftest)


def live_script(agent: str, *before: dict, main_chain: str = "tools") -> dict:
    """The live model's turns: request 2 (one reply in its history) gets a shell call, request
    3 the end (mini-swe-agent: its submit command). Turn 0 is never asked for: request 1 is
    served by playback. ``before``: error turns answering request 2 first."""
    end: dict = {"text": "Live done."}
    if agent == "mini-swe-agent":
        end["tool_calls"] = [{"tool": "@shell", "command": SUBMIT}]
    return {
        "model": "live-model",
        "seed": 11,
        "main_chain": main_chain,
        "turns": [
            {"text": "never served"},
            *before,
            {"text": "A live step.", "tool_calls": [{"tool": "@shell", "command": LIVE_COMMAND}]},
            end,
        ],
    }


def live_side(stack, agent: str, *before: dict, main_chain: str = "tools"):
    """A scripted model behind a capture gateway: returns the gateway (its URL is the
    continuation's --upstream; its journal holds what reached the live side)."""
    url = stack.scripted(live_script(agent, *before, main_chain=main_chain))
    return stack.gateway({"anthropic": url, "openai": url, "gemini": url}, name=f"live-{agent}")


def continue_capture(
    cap, tmp: Path, live_url: str, *extra: str, n: int = 1, name: str = "c", timeout: int = 240
):
    """``pvisor replay`` (a continuation) of ``cap`` (``journal``, ``agent``, ``run``,
    ``user_home``) after step ``n`` against ``live_url``: (process, result, workspace, output)."""
    ws, out = tmp / f"ws-{name}", tmp / f"out-{name}"
    ws.mkdir()
    args = [
        "replay",
        "--journal",
        str(cap.journal),
        "--agent",
        cap.agent,
        "--run",
        cap.run,
        "--after-step",
        str(n),
        "--workspace",
        str(ws),
        "--output",
        str(out),
        "--agent-entrypoint",
        str(entrypoint(cap.agent)),
        "--timeout",
        str(timeout),
        "--upstream",
        live_url,
        *extra,
    ]
    proc = pvisor(args, env=user_env(cap.user_home, **KEYS), cwd=tmp, timeout=400)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return proc, result, ws, out


def received(gw) -> list[bytes]:
    """The model-request bodies the live side received, in arrival order."""
    gw.journal.flush()
    with JournalReader(gw.journal_path) as r:
        return [r.request_body(e) or b"" for e in r.exchanges(gw.run) if e.method == "POST" and e.protocol]


def _entry_holding(protocol: str, body: bytes, text: str) -> list[int]:
    entries = get_protocol(protocol).entries(orjson.loads(body))
    return [i for i, e in enumerate(entries) if text in orjson.dumps(e).decode()]


def _check_common(cap, proc, result, ws, out):
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "ok" and result["mode"] == "continuation" and result["errors"] == []
    assert result["agent_started"] and result["boundary"]["after_step"] == 1
    assert "a.txt" in tree(ws) and "live.txt" in tree(ws)  # step 1 re-run, then the live step ran
    assert tree(cap.user_home) == []
    with JournalReader(cap.journal) as r:
        run = r.run(result["derived_run"])
        assert (run.mode, run.parent_run, run.boundary_step) == ("continuation", cap.run, 1)
        exs = {e.id: e for e in r.exchanges(run.id)}
    live = result["continuation"]
    boundary = exs[live["boundary_request"]["exchange"]]
    assert boundary.served_by == "upstream" and "live" in boundary.flags
    assert result["prefix"]["ends_with"] == "observation" and result["prefix"]["exchange"] == boundary.id
    return live, exs


@pytest.mark.parametrize("agent", ALL)
def test_request_n_plus_1_reaches_the_live_model_byte_identical_and_the_budget_ends_the_agent(
    captured, stack, tmp_path, agent
):
    cap = captured(agent)
    gw = live_side(stack, agent)
    proc, result, ws, out = continue_capture(cap, tmp_path, gw.url, "--max-steps", "1")
    live, exs = _check_common(cap, proc, result, ws, out)
    prefix = (out / "prefix.json").read_bytes()
    bodies = received(gw)
    # the first live request is what the agent sent at N+1, byte for byte, ending at O'_1
    assert prefix in bodies, "request N+1 did not reach the live side as the agent sent it"
    b = live["boundary_request"]
    assert b["byte_identical"] and b["why"] == []
    assert b["sent_sha256"] == b["forwarded_sha256"] == hashlib.sha256(prefix).hexdigest()
    assert exs[b["exchange"]].forwarded_body is None
    assert result["boundary_user_prompt_injected"] is False and PROMPT.encode() not in b"".join(bodies)
    # one live step, then the synthetic final reply ended the agent
    assert live["ended_by"] == "step_budget" and live["live_steps"] == 1 and live["step_budget_end"] == 3
    assert [e["reason"] for e in result["synthetic_end"]] == ["step_budget"]
    assert not any(b"live.txt" in x for x in bodies)  # request N+2 never went live
    assert result["live_requests"] >= 1 and "ended by step_budget" in proc.stdout


@pytest.mark.parametrize("agent", ALL)
def test_the_boundary_prompt_is_sent_once_after_o_prime_1_and_again_in_request_n_plus_2(
    captured, stack, tmp_path, agent
):
    cap = captured(agent)
    gw = live_side(stack, agent)
    proc, result, ws, out = continue_capture(cap, tmp_path, gw.url, "--boundary-user-prompt", PROMPT)
    live, exs = _check_common(cap, proc, result, ws, out)
    protocol = result["prefix"]["protocol"]
    prefix = (out / "prefix.json").read_bytes()
    at = len(get_protocol(protocol).entries(orjson.loads(prefix)))
    assert PROMPT.encode() not in prefix  # the agent's own request N+1 never holds it
    carrying = [x for x in received(gw) if PROMPT.encode() in x]
    assert len(carrying) >= 2, "request N+1 and N+2 both carry the prompt"
    for body in carrying[:2]:
        # once, right after O'_1: in the last entry of the prefix, or the one after it
        assert body.count(PROMPT.encode()) == 1
        assert _entry_holding(protocol, body, PROMPT) in ([at - 1], [at])
    assert b"live.txt" in carrying[1]  # request N+2 holds the live step, and the prompt still
    assert result["boundary_user_prompt_injected"] is True
    b = live["boundary_request"]
    assert not b["byte_identical"] and b["why"] == ["boundary_prompt"]
    with JournalReader(cap.journal) as r:
        ex = exs[b["exchange"]]
        assert r.request_body(ex) == prefix and r.forwarded_body(ex) == carrying[0]
    assert live["ended_by"] == "agent" and live["live_steps"] == 2
    assert (
        len(live["boundary_user_prompt"]["requests"]) >= 2
        and live["boundary_user_prompt"]["not_placed"] == []
    )


def test_continue_many_gives_three_derived_runs_from_one_boundary(captured, stack, tmp_path):
    from pvisor.session import continue_many

    cap = captured("claude-code")
    gw = live_side(stack, "claude-code", main_chain="any-tools")  # three sessions, one server
    workspaces = []

    def workspace(i: int) -> Path:
        ws = tmp_path / f"rollout-ws-{i}"
        ws.mkdir()
        workspaces.append(ws)
        return ws

    import os

    saved = dict(os.environ)
    os.environ.update(user_env(cap.user_home, **KEYS))  # the workers inherit the environment
    try:
        results = continue_many(
            cap.run,
            1,
            3,
            workspace,
            gw.url,
            journal=cap.journal,
            output_root=tmp_path / "rollouts",
            entrypoint=str(entrypoint("claude-code")),
            max_steps=1,
            timeout=240,
            concurrency=3,
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert [r.status for r in results] == ["ok"] * 3, [r.error for r in results]
    assert len({r.derived_run for r in results}) == 3
    assert [r.ended_by for r in results] == ["step_budget"] * 3 and [r.live_steps for r in results] == [1] * 3
    with JournalReader(cap.journal) as reader:
        assert all(reader.run(r.derived_run).parent_run == cap.run for r in results)
    # the same prefix: the same messages once each rollout's own workspace path is set aside
    shapes = []
    for r, ws in zip(results, workspaces):
        body = r.prefix.read_text().replace(str(ws), "<ws>")
        shapes.append(json.loads(body)["messages"])
    assert shapes[0] == shapes[1] == shapes[2]
    assert all("live.txt" in tree(ws) for ws in workspaces)


REFUSAL = "messages.1.content.0: Invalid `signature` in `thinking` block (key sk-ant-test-live-0001)"


def _one_error(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _fresh_capture(agent: str, root: Path):
    """A capture of its own (the session's may have been resumed by other tests, adding a step
    from attempt 2): (journal, run id, user home)."""
    from agent_helpers import TASK, script_for

    ws, home, data = root / "cap-ws", root / "cap-home", root / "cap-data"
    for d in (ws, home, data):
        d.mkdir()
    script = root / "script.json"
    script.write_text(json.dumps(script_for(agent)))
    journal = data / "journal.sqlite"
    proc, report = _run(agent, root, journal, ws, home, script, TASK)
    assert proc.returncode == 0, proc.stderr
    return journal, report["run"], home


def test_bad_input_gets_one_clear_line_and_a_documented_exit_code(stack, tmp_path):
    from types import SimpleNamespace

    journal, run_id, home = _fresh_capture("claude-code", tmp_path)
    cap = SimpleNamespace(journal=journal, agent="claude-code", run=run_id, user_home=home)
    base = [
        "replay",
        "--journal",
        str(cap.journal),
        "--agent",
        "claude-code",
        "--run",
        cap.run,
        "--agent-entrypoint",
        str(entrypoint("claude-code")),
    ]
    ws = tmp_path / "ws"
    ws.mkdir()
    env = user_env(cap.user_home, **KEYS)

    def run(*args: str, out: str, environ=env):
        return pvisor(
            [*base, "--workspace", str(ws), "--output", str(tmp_path / out), *args], env=environ, cwd=tmp_path
        )

    proc = run("--after-step", "1", "--max-steps", "0", "--upstream", "http://127.0.0.1:9", out="o1")
    assert proc.returncode == 2 and "at least one live step" in _one_error(proc)
    no_key = {k: v for k, v in env.items() if k not in KEYS}
    proc = run("--after-step", "1", out="o2", environ=no_key)
    assert proc.returncode == 2 and "needs ANTHROPIC_API_KEY in the environment" in _one_error(proc)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    # step 3 is the last and A_3 made no tool call: no request N+1 can carry a prompt
    proc = run(
        "--after-step", "3", "--boundary-user-prompt", "more", "--upstream", "http://127.0.0.1:9", out="o3"
    )
    assert proc.returncode == 2 and "it is the last step and A_3 made no tool call" in _one_error(proc)
    doc = json.loads((tmp_path / "o3" / "result.json").read_text())
    assert doc["agent_started"] is False and doc["errors"][0]["code"] == "boundary_prompt_impossible"
    assert tree(ws) == []
    # the upstream is down at N+1: the prefix is still recorded, exit 69
    proc = run("--after-step", "1", "--upstream", "http://127.0.0.1:9", "--timeout", "20", out="o4")
    line = _one_error(proc)
    assert proc.returncode == 69 and "could not be reached at request 2" in line
    doc = json.loads((tmp_path / "o4" / "result.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["status"] == "failed" and doc["errors"][0]["code"] == "upstream_unreachable"
    assert (tmp_path / "o4" / "prefix.json").read_bytes() and doc["continuation"]["upstream_error"][
        "request"
    ] == 2


def test_a_refused_reasoning_is_reported_without_the_key(captured, stack, tmp_path):
    cap = captured("claude-code")
    refusal = {
        "error": {
            "status": 400,
            "body": {"type": "error", "error": {"type": "invalid_request_error", "message": REFUSAL}},
        }
    }
    gw = live_side(stack, "claude-code", refusal)
    proc, _, _, out = continue_capture(cap, tmp_path, gw.url, name="r", timeout=120)
    line = _one_error(proc)
    assert (
        proc.returncode == 1
        and "refused the served reasoning at request 2" in line
        and "--reasoning strip" in line
    )
    text = (out / "result.json").read_text()
    doc = json.loads(text)
    assert doc["status"] == "failed" and doc["errors"][0]["code"] == "reasoning_rejected"
    assert "Invalid `signature` in `thinking` block" in doc["continuation"]["reasoning_rejected"]["message"]
    # the key the agent sent, echoed by the upstream, is in no report
    assert KEYS["ANTHROPIC_API_KEY"] not in text + proc.stderr + proc.stdout


def test_reasoning_strip_on_a_capture_with_signed_thinking(stack, tmp_path):
    """Claude Code captured against a script whose replies think: its requests carry the
    scripted model's thinking blocks (an empty signature the live API refuses)."""
    from agent_helpers import COMMANDS

    root = tmp_path
    ws, home, data = root / "ws", root / "home", root / "data"
    for d in (ws, home, data):
        d.mkdir()
    script = root / "thinking.json"
    script.write_text(
        json.dumps(
            {
                "model": "mock-model",
                "turns": [
                    {
                        "text": "First a file.",
                        "reasoning": "I should write a.txt.",
                        "tool_calls": [{"tool": "@shell", "command": COMMANDS[0]}],
                    },
                    {"text": "Done.", "reasoning": "All written."},
                ],
            }
        )
    )
    journal = data / "journal.sqlite"
    proc, report = _run("claude-code", root, journal, ws, home, script, "Write a.txt.")
    assert proc.returncode == 0, proc.stderr
    run_id = report["run"]
    gw = live_side(stack, "claude-code")
    from types import SimpleNamespace

    cap = SimpleNamespace(journal=journal, agent="claude-code", run=run_id, user_home=home)
    proc, doc, _, out = continue_capture(
        cap, root, gw.url, "--reasoning", "strip", "--max-steps", "1", name="s"
    )
    assert proc.returncode == 0, proc.stderr
    sent = json.loads((out / "prefix.json").read_text())
    served = [
        b
        for m in sent["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "thinking"
    ]
    assert served, "the agent sends the served thinking back"
    forwarded = json.loads(received(gw)[0])
    assert [
        b
        for m in forwarded["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == "thinking"
    ] == []
    live = doc["continuation"]
    assert (
        live["boundary_request"]["why"] == ["reasoning_stripped"]
        and not live["boundary_request"]["byte_identical"]
    )
    # the recording's thinking carries the scripted model's empty signature: the result says so
    assert "step 1: thinking signature empty" in [w["message"] for w in doc["warnings"]]
    kinds = [w["kind"] for w in live["reasoning_rewrites"]]
    assert "thinking_dropped" in kinds
    assert ("thinking" in sent) == ("thinking_off" in kinds) and "thinking" not in forwarded


def test_an_upstream_refusing_request_n_plus_1_fails_with_its_message(captured, stack, tmp_path):
    cap = captured("claude-code")
    # every request refused (Claude Code retries a 400 and alters its request before it gives up)
    from gateway_helpers import json_upstream

    payload = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "live-model-x is not available"},
    }
    up = stack.raw_upstream(json_upstream(orjson.dumps(payload), status=400))
    proc, _, _, out = continue_capture(
        cap, tmp_path, up.url, "--live-model", "live-model-x", name="e", timeout=120
    )
    line = _one_error(proc)
    assert proc.returncode == 1 and "answered 400 at request 2: live-model-x is not available" in line
    doc = json.loads((out / "result.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    live = doc["continuation"]
    assert doc["status"] == "failed" and doc["errors"][0]["code"] == "upstream_error"
    assert live["ended_by"] == "upstream_error" and live["upstream_error"]["status"] == 400
    # the prefix is still recorded, and the model asked for is the live one, listed
    assert (out / "prefix.json").is_file() and json.loads(up.requests[0][3])["model"] == "live-model-x"
    assert live["model_rewrites"][0]["to"] == "live-model-x" and live["boundary_request"]["why"] == [
        "live_model"
    ]


def test_a_timeout_while_the_live_model_thinks_is_a_timeout_not_an_upstream_error(captured, stack, tmp_path):
    cap = captured("claude-code")
    url = stack.scripted(
        {"model": "live-model", "turns": [{"text": "never served"}, {"text": "slow", "delay_ms": 120000}]}
    )
    gw = stack.gateway({"anthropic": url}, name="live-slow")
    proc, _, _, out = continue_capture(cap, tmp_path, gw.url, name="t", timeout=8)
    assert proc.returncode == 124 and "still running after --timeout 8 s" in _one_error(proc)
    doc = json.loads((out / "result.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    live = doc["continuation"]
    assert doc["errors"][0]["code"] == "agent_timeout" and doc["agent_run"]["ended_by"] == "timeout"
    # the request cut short is listed, but is no live step and no upstream error
    assert live["ended_by"] == "timeout" and live["live_steps"] == 0 and live["upstream_error"] is None
    assert live["requests"][0]["request"] == 2 and live["requests"][0]["outcome"] != "ok"
