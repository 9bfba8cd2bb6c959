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


def _replay(cap, tmp: Path, name: str, source: list[str], n: int, *extra: str, mode: str = "--replay-only"):
    """``pvisor replay`` of ``cap`` after step ``n`` (``mode`` ``--replay-only``, or "" for a
    continuation): (process, result, workspace, output)."""
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
        *([mode] if mode else []),
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
        # (a native file keeps no start state: the likely cause follows)
        assert re.fullmatch(
            r"step \d+ \S+ \((?!None\))[^)]+\): O' differs from O(; likely cause: .+)?", message
        ), message
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


def _prepare(cap, tmp: Path, name: str, source: list[str], n: int, *extra: str) -> tuple[dict, bytes]:
    """prepare-only of ``cap`` at step ``n``: (result, prefix bytes)."""
    out = tmp / f"prep-{name}"
    proc = pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", cap.agent, *source, "--after-step", str(n),
         "--prepare-only", "--output", str(out), *extra],
        env=user_env(cap.user_home), cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return result, (out / "prefix.json").read_bytes()


def _check_finish(result: dict, n: int) -> None:
    """A result whose last step N is mini-swe-agent's submit command: the prefix ends at A_N
    and the calls of A_N are flagged ``observation_not_sent``, with no historical observation."""
    prefix = result["prefix"]
    assert prefix["ends_with"] == "action" and prefix["rendered"] is True and prefix["tools_present"]
    calls = result["tool_calls"]
    assert [c["step"] for c in calls] == [1, 2, 2, 2, n]
    assert [c["observation_not_sent"] for c in calls] == [False] * 4 + [True]
    assert calls[-1]["historical_observation_sha256"] is None
    assert all(c["historical_observation_sha256"] for c in calls[:-1])
    assert [w for w in result["warnings"] if w["code"] == "observation_not_sent"] == [
        {
            "code": "observation_not_sent",
            "message": f"step {n}: A_{n} is the agent's finish command, which ended its run: "
            f"O_{n} was never sent to the model, and the prefix ends at A_{n}",
        }
    ]


def test_a_replay_to_the_submit_command_ends_with_the_agent(replayed, tmp_path):
    """mini-swe-agent's last step is its submit command, after which it sends no request N+1:
    the replay to it is ok, ended by the agent with its own status, and its prefix is request N
    with A_N appended, what prepare-only gives from the journal and from the native file."""
    cap, proc, result, ws, out = replayed("mini-swe-agent", "journal", 3)
    n = result["boundary"]["steps_total"]
    assert n == 3
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "ok" and result["errors"] == []
    run = result["agent_run"]
    assert run["ended_by"] == "agent" and run["agent_status"] == {
        "outcome": "succeeded",
        "detail": "Submitted",
        "source": "info.exit_status of its trajectory",
    }
    assert result["synthetic_end"] == [] and result["playback"]["boundary_request_seen"] is False
    assert [s["request"] for s in result["playback"]["served"]] == [1, 2, 3]
    _check_finish(result, n)
    assert result["prefix"]["origin"]["messages"] == "rendered"
    assert result["replayed_tool_calls"] == 4 and all(
        c["equal_normalised"] is not None for c in result["tool_calls"][:4]
    )
    assert tree(ws) == WRITTEN[2]  # steps 1 and 2 re-run; the submit command runs nothing
    assert "ending with the action" in proc.stdout and "the agent ended by agent" in proc.stdout
    assert re.search(r"4 tool call\(s\) re-run, \d of 4 observation\(s\) equal", proc.stdout)
    body = (out / "prefix.json").read_bytes()
    # prepare-only at the same step: from the journal and from the native file (with the
    # capture's system prompt and tools) the same request, ending at the same A_N as the
    # replay's (whose O'_2 differs: the timed call); from the derived run the replay's bytes
    prepared, from_journal = _prepare(cap, tmp_path, "journal", ["--run", cap.run], n)
    _check_finish(prepared, n)
    native = cap.report["native_trajectory"]
    prepared_native, from_native = _prepare(
        cap, tmp_path, "native", ["--trajectory", native], n, "--profile-from", f"{cap.journal}:{cap.run}"
    )
    _check_finish(prepared_native, n)
    assert json.loads(from_native) == json.loads(from_journal)
    assert prepared_native["tool_calls"] == prepared["tool_calls"]
    assert json.loads(body)["messages"][-1] == json.loads(from_journal)["messages"][-1]
    _, again = _prepare(cap, tmp_path, "derived", ["--run", result["derived_run"]], n)
    assert again == body


def test_a_continuation_from_the_submit_command_has_no_live_request(captured, tmp_path):
    """From the native file: after the submit command nothing goes live (the upstream is never
    reached, and would refuse: nothing listens there), and a boundary prompt is refused at once."""
    cap = captured("mini-swe-agent")
    native = ["--trajectory", cap.report["native_trajectory"]]
    dead = ["--upstream", "http://127.0.0.1:9"]
    ws, out = tmp_path / "ws-prompt", tmp_path / "out-prompt"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", cap.agent, *native, "--after-step", "3",
         "--workspace", str(ws), "--output", str(out), "--agent-entrypoint", str(entrypoint(cap.agent)),
         *dead, "--boundary-user-prompt", "One more thing."],
        env=user_env(cap.user_home), cwd=tmp_path,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert proc.returncode == 2 and lines == [
        "pvisor: error: --boundary-user-prompt after step 3: it is the last step and A_3 is the agent's "
        "finish command, which ends its run, so the agent sends no request N+1 to carry the prompt; "
        "a prompt can follow an earlier step (N < 3)"
    ], proc.stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["errors"][0]["code"] == "boundary_prompt_impossible" and doc["agent_started"] is False
    assert tree(ws) == []
    proc, result, ws, out = _replay(cap, tmp_path, "live", native, 3, *dead, mode="")
    assert proc.returncode == 0, proc.stderr
    assert result["mode"] == "continuation"
    assert result["status"] == "ok" and result["errors"] == [] and result["live_requests"] == 0
    assert (
        result["continuation"]["ended_by"] == "agent" and result["continuation"]["boundary_request"] is None
    )
    assert result["agent_run"]["ended_by"] == "agent"
    assert result["agent_run"]["agent_status"]["detail"] == "Submitted"
    _check_finish(result, 3)
    assert "no_live_request" in [w["code"] for w in result["warnings"]]
    assert tree(ws) == WRITTEN[2]
