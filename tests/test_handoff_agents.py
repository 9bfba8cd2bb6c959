"""Handoff with the six real agents (pinned CLIs under .agents/), offline against the scripted
model: a chained cycle of six handoffs, Claude Code -> Codex -> Gemini CLI -> OpenCode -> Qwen
Code -> mini-swe-agent -> Claude Code, each child run the next source, each at the pause after
step 3, replay-only (``pvisor handoff --replay-only``). The first source is a ``pvisor run
--script`` of Claude Code: a shell call, a Write, a parallel batch of two Reads (steps 1..3,
re-run by every hop), then an Edit of the note and a TodoWrite (after the pause: no hop re-runs
them), then the end. Each hop's agent re-runs the history with its own tools; its request N+1
ends at its own observation in its own protocol, its workspace is compared with the pause's
snapshot, every source call is accounted for, and its run is filed under its parent. One more
hop (the mini-swe-agent child to Claude Code) continues with the live model, a scripted model
behind a capture gateway of the test's own. Agents run one at a time, nothing is mocked."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from agent_helpers import ScriptedCapture, capture_scripted, entrypoint, pvisor, tree, user_env
from pvisor.adapters.agents.effects import Effect
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import ToolCall, ToolResult
from pvisor.journal.reader import JournalReader
from pvisor.replay.continuation import Change
from pvisor.replay.source import descriptor
from pvisor.replay.translate import CallFate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
#: the cycle: each agent hands over to the next; the last hop closes it at Claude Code again
CYCLE = ["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent", "claude-code"]
#: the protocol each agent speaks to the scripted model (mini-swe-agent with --model mock-model)
PROTOCOL = {
    "claude-code": "anthropic",
    "codex": "openai-responses",
    "gemini-cli": "gemini",
    "opencode": "openai-chat",
    "qwen-code": "openai-chat",
    "mini-swe-agent": "openai-chat",
}
PAUSE = 3
TASK = "Write a note, read it back, then edit it."
#: the workspace at the pause (after step 3: the shell's file and the note as written)
AT_PAUSE = {"a.txt": "alpha\n", "notes.txt": "one\ntwo\n"}
#: keys the agents read from the environment when they talk to a live upstream (never a real one)
KEYS = {"ANTHROPIC_API_KEY": "sk-ant-test-live-0101"}
SECRETS_SENT = list(KEYS.values())  # no piece of them in any journal, log or result.json (conftest)
LIVE_TEXT = "Live: the note is read back."


def source_script(ws: Path) -> dict[str, Any]:
    """Claude Code's turns: a shell call, a Write, two Reads at once (the pause comes after
    them), an Edit of the note (Claude Code edits only what it read), a plan, the end."""
    note, a = str(ws / "notes.txt"), str(ws / "a.txt")
    shell = {"tool": "@shell", "command": "echo alpha > a.txt && cat a.txt"}
    write = {"tool": "Write", "arguments": {"file_path": note, "content": "one\ntwo\n"}}
    edit = {"tool": "Edit", "arguments": {"file_path": note, "old_string": "two", "new_string": "three"}}
    todo = {"content": "Check the note", "status": "completed", "activeForm": "Checking the note"}
    return {
        "model": "mock-model",
        "seed": 38,
        "turns": [
            {"text": "First the shell.", "tool_calls": [shell]},
            {"text": "Now a note.", "tool_calls": [write]},
            {
                "text": "Read both back.",
                "tool_calls": [
                    {"tool": "Read", "arguments": {"file_path": note}},
                    {"tool": "Read", "arguments": {"file_path": a}},
                ],
            },
            {"text": "Edit the note.", "tool_calls": [edit]},
            # Claude Code 2.1 declares no TodoWrite: the call is recorded with its error result
            {"text": "Plan the rest.", "tool_calls": [{"tool": "TodoWrite", "arguments": {"todos": [todo]}}]},
            {"text": "The note is written and edited."},
        ],
    }


@dataclass
class Hop:
    """One handoff of the chain: from ``source_agent``'s run ``parent`` to ``agent``."""

    index: int
    source_agent: str
    agent: str
    parent: str
    proc: Any
    result: dict[str, Any] | None
    ws: Path
    out: Path
    seconds: float


@dataclass
class Chain:
    cap: ScriptedCapture
    root: Path
    hops: list[Hop] = field(default_factory=list)


def hand_over(
    cap: ScriptedCapture, root: Path, parent: str, agent: str, name: str, *extra: str, env: dict | None = None
) -> tuple[Any, dict[str, Any] | None, Path, Path, float]:
    """``pvisor handoff`` of run ``parent`` (in the capture's journal) to ``agent`` after step
    :data:`PAUSE` in a new empty workspace: (process, result or None, workspace, output, seconds)."""
    ws, out = root / f"ws-{name}", root / f"out-{name}"
    ws.mkdir()
    args = [
        "--journal", str(cap.journal), "handoff", "--run", parent, "--after-step", str(PAUSE),
        "--to-agent", agent, "--agent-entrypoint", str(entrypoint(agent)), "--workspace", str(ws),
        "--output", str(out), "--timeout", "240",
        *(["--model", "mock-model"] if agent == "mini-swe-agent" else []),
        *extra,
    ]  # fmt: skip
    started = time.monotonic()
    proc = pvisor(args, env=env or cap.env, cwd=root, timeout=400)
    seconds = time.monotonic() - started
    assert "Traceback" not in proc.stderr, proc.stderr
    path = out / "result.json"
    result = json.loads(path.read_text()) if path.exists() else None
    return proc, result, ws, out, seconds


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Chain:
    """The source capture and the six replay-only hops, made once (stops at a hop that failed)."""
    root = tmp_path_factory.mktemp("handoff-chain")
    cap = capture_scripted("claude-code", root, source_script(root / "ws"), TASK)
    made = Chain(cap, root)
    parent = cap.run
    for i, (a, b) in enumerate(zip(CYCLE, CYCLE[1:]), 1):
        proc, result, ws, out, seconds = hand_over(cap, root, parent, b, f"hop{i}", "--replay-only")
        made.hops.append(Hop(i, a, b, parent, proc, result, ws, out, seconds))
        if proc.returncode != 0 or result is None or not result.get("derived_run"):
            break
        parent = result["derived_run"]
    return made


def _hop(chain: Chain, i: int) -> Hop:
    if len(chain.hops) < i:
        last = chain.hops[-1]
        pytest.fail(
            f"hop {i} was not reached: hop {last.index} ({last.source_agent} -> {last.agent}) failed "
            f"(exit {last.proc.returncode}): {last.proc.stderr.strip()[-2000:]}",
            pytrace=False,
        )
    return chain.hops[i - 1]


def source_calls(journal: Path, run: str, n: int) -> list[tuple[int, str | None, str]]:
    """(step, call id, tool) of every call of steps 1..n of ``run``, as the journal reads them."""
    with JournalReader(journal) as r:
        steps = trajectory_from_journal(r, run).steps[:n]
    return [(s.n, c.id, c.name) for s in steps for c in s.action.tool_calls]


def boundary_conversation(out: Path, protocol: str):
    """B's request N+1 (``out/prefix.json``), parsed in its protocol."""
    return get_protocol(protocol).parse_request((out / "prefix.json").read_bytes())


def check_ends_at_own_observation(conv, agent: str) -> list[ToolCall]:
    """Request N+1 ends at B's observation of its last action: after the last assistant message
    (which carries B's calls) come only the tool results of those calls; every call of
    the history names a tool B declared in this same request. Returns the history's calls."""
    last = max(k for k, m in enumerate(conv.messages) if m.role == "assistant")
    calls = [p for p in conv.messages[last].parts if isinstance(p, ToolCall)]
    assert calls, f"{agent}'s last action in request N+1 carries no call of its own"
    after = [p for m in conv.messages[last + 1 :] for p in m.parts]
    assert after and all(isinstance(p, ToolResult) for p in after), [type(p).__name__ for p in after]
    # one result per call (Claude Code lists parallel results in the order they finished)
    assert sorted(p.call_id for p in after) == sorted(c.id for c in calls)
    declared = {t.name for t in conv.tools}
    history = [p for m in conv.messages if m.role == "assistant" for p in m.parts if isinstance(p, ToolCall)]
    undeclared = sorted({c.name for c in history} - declared)
    assert not undeclared, f"{agent} was served calls of tools it did not declare: {undeclared}"
    return history


def check_hop(chain: Chain, hop: Hop) -> None:
    a, b, result = hop.source_agent, hop.agent, hop.result
    assert hop.proc.returncode == 0, hop.proc.stderr
    assert result is not None
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "ok" and result["mode"] == "handoff" and result["errors"] == []
    assert result["agent"] == b and result["live_requests"] == 0
    h = result["handoff"]
    assert (h["from_agent"], h["to_agent"], h["translated"]) == (a, b, a != b)
    assert h["pause"] == {"after_step": PAUSE, "transition": PAUSE - 1}
    assert h["refused"] is None and h["not_reenactable"] == []
    # B's request N+1: its own protocol, valid for its strict validator, ending at its own O''_N
    protocol = PROTOCOL[b]
    assert protocol in descriptor(b).protocols
    br = h["boundary_request"]
    assert br["valid"] and br["problems"] == [] and br["protocol"] == protocol, br
    assert result["prefix"]["protocol"] == protocol and result["prefix"]["ends_with"] == "observation"
    conv = boundary_conversation(hop.out, protocol)
    history = check_ends_at_own_observation(conv, b)
    d = descriptor(b)
    assert len(history) == len(h["calls"]) and all(
        d.effect_of(c.name).effect in (Effect.SHELL, Effect.READ) for c in history
    ), [c.name for c in history]
    # every source call of steps 1..3 is accounted for, each carried by a tool B declared
    expected = source_calls(chain.cap.journal, hop.parent, PAUSE)
    assert [(c["step"], c["call_id"], c["tool"]) for c in h["calls"]] == expected
    declared = set(h["target_tools"])
    for c in h["calls"]:
        assert c["fate"] in (CallFate.TRANSLATED.value, CallFate.REPRODUCED.value), c
        assert c["target_tool"] in declared and c["target_call_id"] in {x.id for x in history}, c
    if a == "claude-code":  # Bash, Write, Read, Read: the write is made by B's shell
        assert [c["fate"] for c in h["calls"]] == ["translated", "reproduced", "translated", "translated"]
    # B re-ran them: the workspace is the pause's snapshot (or the differences are listed)
    ws = h["workspace"]
    assert ws["compared"] and ws["pause_snapshot"] and ws["reenacted_snapshot"]
    if ws["equal"]:
        assert ws["differences"] == [] and ws["pause_snapshot"] == ws["reenacted_snapshot"]
        assert tree(hop.ws) == sorted(AT_PAUSE) and all(
            (hop.ws / p).read_text() == t for p, t in AT_PAUSE.items()
        )
    else:
        assert ws["differences"] and ws["differences_total"] == len(ws["differences"]), ws
        assert any(w["code"] == "handoff_workspace_differs" for w in result["warnings"])
    # the lineage, in the report and in the journal
    lin = h["lineage"]
    assert (lin["parent_run"], lin["child_run"], lin["from_agent"], lin["to_agent"]) == (
        hop.parent,
        result["derived_run"],
        a,
        b,
    )
    assert (lin["pause_after_step"], lin["pause_transition"]) == (PAUSE, PAUSE - 1)
    assert lin["workspace_snapshot"] == ws["pause_snapshot"]


HOPS = [f"{i}-{a}-to-{b}" for i, (a, b) in enumerate(zip(CYCLE, CYCLE[1:]), 1)]


@pytest.mark.parametrize("hop", HOPS)
def test_each_hop_re_runs_the_history_as_its_own_and_ends_at_its_own_observation(chain, hop):
    check_hop(chain, _hop(chain, int(hop.split("-", 1)[0])))


def test_each_child_is_filed_under_its_parent_and_the_cycle_closes(chain):
    last = _hop(chain, len(CYCLE) - 1)
    assert last.proc.returncode == 0
    with JournalReader(chain.cap.journal) as r:
        for hop in chain.hops:
            run = r.run(hop.result["derived_run"])
            assert (run.agent, run.mode, run.parent_run, run.boundary_step, run.pause_transition) == (
                hop.agent,
                "handoff",
                hop.parent,
                PAUSE,
                PAUSE - 1,
            )
            assert run.labels["handoff_from_agent"] == hop.source_agent
            assert run.labels["handoff_to_agent"] == hop.agent
            assert run.workspace_snapshot == hop.result["handoff"]["lineage"]["workspace_snapshot"]
    # journal ls shows each child with its parent and the steps kept
    proc = pvisor(
        ["--journal", str(chain.cap.journal), "journal", "ls", "--json"], env=chain.cap.env, cwd=chain.root
    )
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    rows = {x["id"]: x for x in (listed["runs"] if isinstance(listed, dict) else listed)}
    for hop in chain.hops:
        row = rows[hop.result["derived_run"]]
        assert row["mode"] == "handoff" and row["parent_run"] == hop.parent and row["agent"] == hop.agent, row
    print("hop seconds:", {h.index: round(h.seconds, 1) for h in chain.hops})


def live_script() -> dict[str, Any]:
    """The live model's turns: request N+1 holds three assistant messages, so turn 3 answers it
    (turns 0..2 are never asked for: playback serves requests 1..3); the answer ends Claude Code."""
    return {
        "model": "live-model",
        "seed": 12,
        "turns": [{"text": "never served"}] * PAUSE + [{"text": LIVE_TEXT}],
    }


def test_a_hop_continued_with_the_live_model_sends_request_n_plus_1_upstream(chain, stack):
    source = _hop(chain, len(CYCLE) - 2)  # the mini-swe-agent child
    assert source.proc.returncode == 0 and source.result is not None
    url = stack.scripted(live_script())
    gw = stack.gateway({"anthropic": url, "openai": url, "gemini": url}, name="live-handoff")
    env = user_env(Path(chain.cap.env["HOME"]), **KEYS)
    proc, result, ws, out, _ = hand_over(
        chain.cap,
        chain.root,
        source.result["derived_run"],
        "claude-code",
        "live",
        "--upstream",
        gw.url,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "ok" and result["mode"] == "handoff" and result["errors"] == []
    h, live = result["handoff"], result["continuation"]
    assert h["boundary_request"]["valid"] and h["boundary_request"]["protocol"] == "anthropic"
    check_ends_at_own_observation(boundary_conversation(out, "anthropic"), "claude-code")
    assert h["workspace"]["compared"] and h["workspace"]["equal"], h["workspace"]
    # request N+1 went to the live model, as Claude Code sent it (thinking turned off if it asked)
    b = live["boundary_request"]
    assert b is not None and b["status"] == 200
    prefix = (out / "prefix.json").read_bytes()
    assert b["sent_sha256"] == h["boundary_request"]["sha256"]
    gw.journal.flush()
    with JournalReader(gw.journal_path) as r:
        posts = [e for e in r.exchanges(gw.run) if e.method == "POST" and e.protocol]
        bodies = [r.request_body(e) or b"" for e in posts]
        assert posts and LIVE_TEXT.encode() in (r.response_body(posts[0]) or b"")
    assert bodies and b["forwarded_sha256"] == hashlib.sha256(bodies[0]).hexdigest()
    sent, forwarded = orjson.loads(prefix), orjson.loads(bodies[0])
    assert forwarded["messages"] == sent["messages"] and forwarded["tools"] == sent["tools"]
    if (sent.get("thinking") or {}).get("type") in ("enabled", "adaptive"):
        # no signed thinking in a handed-over history: thinking is turned off for the live model
        assert b["why"] == [Change.REASONING.value] and not b["byte_identical"]
        assert "thinking" not in forwarded
        rewrites = [x for q in live["requests"] if q["exchange"] == b["exchange"] for x in q["rewrites"]]
        assert [x["kind"] for x in rewrites] == ["thinking_off"], rewrites
    else:
        assert b["why"] == [] and b["byte_identical"] and bodies[0] == prefix
    assert live["ended_by"] == "agent" and live["live_steps"] == 1 and result["live_requests"] >= 1
    with JournalReader(chain.cap.journal) as r:
        run = r.run(result["derived_run"])
        assert (run.mode, run.parent_run) == ("handoff", source.result["derived_run"])
        ex = {e.id: e for e in r.exchanges(run.id)}[b["exchange"]]
        assert ex.served_by == "upstream" and "live" in ex.flags
    assert tree(ws) == sorted(AT_PAUSE)
