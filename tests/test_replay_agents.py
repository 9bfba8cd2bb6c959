"""Replay-only with the six real agents (pinned CLIs under .agents/): the session capture the
agent tests make (step 1 one call, step 2 a batch of three: two write files, one prints the
time) is replayed from the journal at N = 1 and N = 2, and from the agent's native file at
N = 2, each in a fresh workspace through ``pvisor replay --replay-only``; a replay with another
task diverges. Agents run one at a time, nothing is mocked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from agent_helpers import AGENTS, FILES, OUTPUTS, TASK, TIMED, entrypoint, pvisor, text_of, tree, user_env
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
ALL = list(AGENTS)
#: the files steps 1..N write
WRITTEN = {0: [], 1: ["a.txt"], 2: ["a.txt", "b.txt", "c.txt"]}


def _replay(cap, tmp: Path, name: str, source: list[str], n: int, *extra: str):
    ws, out = tmp / f"ws-{name}", tmp / f"out-{name}"
    ws.mkdir()
    # --journal after the subcommand: the derived run goes to the capture's journal
    args = [
        "replay",
        "--journal",
        str(cap.journal),
        "--agent",
        cap.agent,
        *source,
        "--after-step",
        str(n),
        "--replay-only",
        "--workspace",
        str(ws),
        "--output",
        str(out),
        "--agent-entrypoint",
        str(entrypoint(cap.agent)),
        "--timeout",
        "240",
        *extra,
    ]
    proc = pvisor(args, env=user_env(cap.user_home), cwd=tmp, timeout=400)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return proc, result, ws, out


@pytest.fixture(scope="session")
def replayed(captured, tmp_path_factory):
    """``replayed(agent, kind, n)``: (process, result, workspace, output) of one replay-only of the
    agent's capture, kind ``journal`` or ``native``, made once per test session."""
    cache: dict = {}

    def get(agent: str, kind: str, n: int):
        key = (agent, kind, n)
        if key not in cache:
            cap = captured(agent)
            assert cap.proc.returncode == 0, cap.proc.stderr
            source = (
                ["--run", cap.run] if kind == "journal" else ["--trajectory", cap.report["native_trajectory"]]
            )
            cache[key] = (
                cap,
                *_replay(cap, tmp_path_factory.mktemp(f"replay-{agent}-{kind}-{n}"), f"{kind}{n}", source, n),
            )
        return cache[key]

    return get


def _lost_output(agent: str, call: dict, result: dict) -> bool:
    """Qwen Code 0.24.4 sometimes reports ``Output: (empty)`` for a shell call that printed
    (tests/agent_helpers.py ``holds_output``); such a call proves nothing either way."""
    return agent == "qwen-code"


def _check_replay(agent: str, cap, proc, result: dict, ws: Path, out: Path, n: int, kind: str) -> None:
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "ok" and result["mode"] == "replay-only" and result["errors"] == []
    assert (
        result["agent_started"] is True
        and result["live_requests"] == 0
        and result["boundary_user_prompt_injected"] is False
    )
    # the steps' tools really ran again, in the new workspace, and nothing after step N did
    assert tree(ws) == WRITTEN[n], tree(ws)
    for name in WRITTEN[n]:
        assert (ws / name).read_text() == FILES[name]
    assert tree(cap.user_home) == []
    # O against O' for every call of steps 1..N
    calls = result["tool_calls"]
    assert [c["step"] for c in calls] == ([1] if n == 1 else [1, 2, 2, 2])
    assert result["replayed_tool_calls"] == len(calls) and all(
        c["replayed_observation_sha256"] for c in calls
    )
    by_command = {}
    with JournalReader(cap.journal) as r:
        steps = trajectory_from_journal(r, cap.run).steps
    for c, call in zip(calls, [x for s in steps[:n] for x in s.action.tool_calls]):
        by_command[next(iter(call.arguments.values()))] = c
    timed = by_command.get(TIMED)
    for command, c in by_command.items():
        if command == TIMED:
            continue
        assert c["equal_normalised"] or _lost_output(agent, c, result), (command, c)
    if timed is not None:
        assert timed["equal"] is False
        assert timed["equal_normalised"] is False or _lost_output(agent, timed, result), timed
    # each differing call is named by its id, or by its place in the batch where the protocol has none
    differs = [w["message"] for w in result["warnings"] if w["code"] == "observation_differs"]
    for message in differs:
        assert re.fullmatch(r"step \d+ \S+ \((?!None\))[^)]+\): O' differs from O", message), message
    # Gemini's wire calls carry no id (its native file does): named by their place in the batch
    if agent == "gemini-cli" and kind == "journal" and n == 2:
        assert differs and all(re.search(r"\(call \d of the step\)", m) for m in differs), differs
    # the prefix is request N+1 as the agent sent it, ending at O'_N, and the run records it
    prefix = result["prefix"]
    assert prefix["ends_with"] == "observation" and prefix["rendered"] is False and prefix["tools_present"]
    body = (out / "prefix.json").read_bytes()
    derived = result["derived_run"]
    with JournalReader(cap.journal) as r:
        run = r.run(derived)
        assert (run.mode, run.parent_run, run.boundary_step) == (
            "replay-only",
            cap.run if kind == "journal" else None,
            n,
        )
        assert run.labels["task"] and run.labels["source_kind"] == kind
        exs = r.exchanges(derived)
        [end] = [e for e in exs if "synthetic_end" in e.flags]
        assert (
            end.id == prefix["exchange"] == result["synthetic_end"][0]["exchange"]
            and r.request_body(end) == body
        )
        assert all(e.served_by == "playback" for e in exs)
        traj = trajectory_from_journal(r, derived)
    assert len(traj.steps) == n  # the synthetic final reply is never a step
    outputs = [text_of(res.content) for s in traj.steps for res in s.observation.results]
    assert any(OUTPUTS[0] in o for o in outputs) or agent == "qwen-code"
    # the replay's own native trajectory, which holds the synthetic reply, is named
    native = result["agent_run"]["native_trajectory"]
    assert native and Path(native).is_file() and result["agent_run"]["native_holds_synthetic_end"]
    assert result["agent_run"]["ended_by"] in ("synthetic_end", "stopped_after_end")
    assert result["workspace"]["unchanged"] is False
    # (the agent tests may have resumed the run meanwhile: attempt 2 adds a step to it)
    assert re.search(
        rf"replayed {agent} to step {n} of {result['boundary']['steps_total']} as run {derived}", proc.stdout
    )
    assert result["boundary"]["steps_total"] >= 3


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("agent", ALL)
def test_replay_only_from_the_journal(replayed, agent, n):
    cap, proc, result, ws, out = replayed(agent, "journal", n)
    _check_replay(agent, cap, proc, result, ws, out, n, "journal")
    # from the journal, the recorded reply bytes are served as they were
    assert [s["source"] for s in result["playback"]["served"]] == ["recorded"] * n
    assert result["playback"]["task_origin"] == "label"
    assert result["agent_run"]["recorded_version"] == result["agent_run"]["installed_version"]


@pytest.mark.parametrize("agent", ALL)
def test_replay_only_from_the_native_file(replayed, agent):
    cap, proc, result, ws, out = replayed(agent, "native", 2)
    _check_replay(agent, cap, proc, result, ws, out, 2, "native")
    assert [s["source"] for s in result["playback"]["served"]] == ["rendered"] * 2
    assert result["source"]["kind"] == "native" and result["source"]["sha256"]


@pytest.mark.parametrize("agent", ALL)
def test_another_task_diverges_with_one_clear_line(captured, tmp_path, agent):
    cap = captured(agent)
    proc, result, ws, out = _replay(
        cap, tmp_path, "diverge", ["--run", cap.run], 2, "--task", "Something else entirely."
    )
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert (
        len(lines) == 1
        and "the replay diverged at request 1" in lines[0]
        and "the task is not in the request" in lines[0]
    )
    assert result["status"] == "diverged" and [e["code"] for e in result["errors"]] == ["diverged"]
    d = result["divergence"]
    # the recording expects its own task; the agent was given another one
    assert d["request"] == 1 and d["reason"] == "the task is not in the request" and d["expected"] == TASK
    assert "Something else entirely." in d["got"]
    assert tree(ws) == []  # no recorded action was served
    assert result["synthetic_end"][0]["reason"] == "diverged"
