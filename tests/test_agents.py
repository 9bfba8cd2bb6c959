"""The six real agent CLIs (pinned in tests/agents/, installed under .agents/) run by
``pvisor run --script`` against the real gateway, the real scripted model server and a real
journal: one capture per agent per test session, reused by every test, and one native resume
each for the agents that have one. Agents run one at a time; nothing is mocked.

The scripted model asks for a shell command that writes a file, then for three parallel shell
commands (one batch: two write files, one prints the time), then ends (text; mini-swe-agent: its
submit command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_helpers import (
    AGENTS,
    COMMANDS,
    FILES,
    FINAL_TEXT,
    OUTPUTS,
    RESUME_TASK,
    RESUMED_TEXT,
    SCRIPT_KEY,
    SUBMIT,
    TASK,
    TIMED,
    entrypoint,
    holds_output,
    pvisor,
    reported_tool_calls,
    text_of,
    tree,
    user_env,
)
from agent_captures import _run  # the captured/resumed fixtures come from conftest.py
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow

ALL = list(AGENTS)
RESUMABLE = [a for a, s in AGENTS.items() if s.resume]


@pytest.mark.parametrize("agent", ALL)
def test_capture_runs_the_agents_tools_in_the_workspace(captured, agent):
    cap = captured(agent)
    assert cap.proc.returncode == 0, cap.proc.stderr
    rep = cap.report
    assert (
        rep["agent"] == agent
        and rep["attempt"] == 1
        and rep["exit_code"] == 0
        and rep["agent_exit_code"] == 0
    )
    # its own account of the run, read where the agent gives it (descriptor: final_status)
    assert rep["agent_status"]["outcome"] == "succeeded", rep["agent_status"]
    assert not rep["timed_out"] and rep["steps_error"] is None
    # the tools really ran, in the workspace
    for name, content in FILES.items():
        assert (cap.workspace / name).read_text() == content, name
    # pvisor wrote nothing into the workspace or the user's home: config, sessions and output
    # live in the run directory under the journal's data dir
    extra = [p for p in tree(cap.workspace) if p not in FILES]
    assert extra == [], f"{agent} left {extra} in the workspace"
    assert tree(cap.user_home) == [], f"something wrote into the user's home: {tree(cap.user_home)}"
    run_dir = Path(rep["run_dir"])
    assert run_dir == cap.journal.parent / "runs" / cap.run
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("agent", ALL)
def test_journal_holds_three_main_loop_steps_and_the_expected_auxiliary_exchanges(captured, agent):
    cap = captured(agent)
    spec = AGENTS[agent]
    rep = cap.report
    calls_per_step = [1, 3, 1] if agent == "mini-swe-agent" else [1, 3, 0]
    assert rep["steps"] == 3 and rep["tool_calls_per_step"] == calls_per_step, rep
    assert rep["auxiliary_exchanges"] == spec.auxiliary and rep["main_exchanges"] == 3, rep
    with JournalReader(cap.journal) as r:
        run = r.run(cap.run)
        assert run.agent == agent and run.mode == "capture"
        assert run.agent_version and run.agent_version in rep["agent_version"]
        assert (
            run.argv and run.argv[0] == str(entrypoint(agent)) and any(a.endswith(TASK) for a in run.argv)
        )  # "--prompt=TASK" for some
        assert run.labels["workspace"] == str(cap.workspace)
        assert run.labels["upstream"] == "script:" + str(cap.script)
        [attempt] = r.attempts(run.id)
        assert attempt.n == 1 and attempt.exit_code == 0 and attempt.ended_ms is not None
        exchanges = r.exchanges(run.id)
        # the roles pvisor run stored: every exchange is main or auxiliary, as the chain rule said
        roles = [e.role for e in exchanges]
        assert roles.count("main") == 3 and roles.count("auxiliary") == spec.auxiliary, [
            (e.method, e.path, e.role) for e in exchanges
        ]
        assert all(e.attempt == 1 for e in exchanges)
        assert all(e.outcome == "ok" for e in exchanges), [(e.path, e.outcome, e.error) for e in exchanges]
        main_chains = {e.chain for e in exchanges if e.role == "main"}
        assert len(main_chains) == 1
        traj = trajectory_from_journal(r, run.id)
    assert len(traj.steps) == 3
    assert [len(s.action.tool_calls) for s in traj.steps] == calls_per_step
    assert len(traj.steps[1].action.tool_calls) == 3  # one batch of three parallel calls
    assert [s.n for s in traj.steps] == [1, 2, 3]
    assert traj.task is not None and TASK in traj.task
    assert FINAL_TEXT in traj.steps[2].action.text
    assert not any("action_dropped_by_agent" in s.flags for s in traj.steps), [s.flags for s in traj.steps]


@pytest.mark.parametrize("agent", ALL)
def test_tool_calls_and_results_match_the_script_and_the_agents_own_report(captured, agent):
    cap = captured(agent)
    arg = AGENTS[agent].arg
    with JournalReader(cap.journal) as r:
        traj = trajectory_from_journal(r, cap.run)
    calls = [c for s in traj.steps for c in s.action.tool_calls]
    results = [res for s in traj.steps for res in s.observation.results]
    expected_commands = COMMANDS + [TIMED] + ([SUBMIT] if agent == "mini-swe-agent" else [])
    # arguments equal the script's once parsed: exactly the shell tool's command argument
    assert [c.arguments for c in calls] == [{arg: cmd} for cmd in expected_commands]
    assert all(json.loads(c.arguments_raw) == c.arguments for c in calls)
    assert all(c.id for c in calls) or agent == "gemini-cli"  # Gemini replies carry no call ids
    # the observations hold the commands' output (mini-swe-agent never sends its submit's result)
    assert len(results) == 4, [text_of(x.content) for x in results]
    for res, out in zip(results, OUTPUTS):
        assert holds_output(agent, text_of(res.content), out), (out, res.content)
    # ... and agree with what the agent itself printed (JSON stdout; mini-swe-agent's -o file)
    native = Path(cap.report["native_trajectory"]) if cap.report["native_trajectory"] else None
    reported = reported_tool_calls(agent, cap.stdout_of(1), native)
    assert len(reported) == len(expected_commands), reported
    # matched by command, not by position: agents report parallel calls in completion order
    for i, expected in enumerate(expected_commands):
        [(command, output)] = [
            (c, o) for c, o in reported if expected in c
        ]  # Codex reports `/bin/bash -lc '<cmd>'`
        if i < len(OUTPUTS):
            assert holds_output(agent, output, OUTPUTS[i]), (command, output)
            assert output.strip() in text_of(results[i].content), (output, results[i].content)


@pytest.mark.parametrize("agent", ALL)
def test_session_id_and_native_trajectory_are_found_without_rebuilding_a_cwd_slug(captured, agent):
    cap = captured(agent)
    rep = cap.report
    native = Path(rep["native_trajectory"])
    assert native.is_file() and native.stat().st_size > 0
    run_dir = Path(rep["run_dir"])
    assert run_dir in native.parents  # in the private home or the run directory
    with JournalReader(cap.journal) as r:
        run = r.run(cap.run)
        [attempt] = r.attempts(run.id)
    assert run.labels["native_path"] == str(native) == attempt.labels["native_path"]
    if agent == "mini-swe-agent":
        assert rep["session_id"] is None and native.name == "mini-swe-agent.traj.json"
        return
    sid = rep["session_id"]
    assert sid and run.labels["session_id"] == sid == attempt.labels["session_id"]
    if agent == "gemini-cli":
        assert (
            native.name.endswith(f"-{sid[:8]}.jsonl")
            and json.loads(native.read_bytes().split(b"\n")[0])["sessionId"] == sid
        )
    elif agent == "opencode":
        assert native == run_dir / f"opencode-session-{sid}.json"
        assert json.loads(native.read_text())["info"]["id"] == sid
    else:
        assert sid in native.name


def test_no_key_reaches_the_journals_or_the_reports(captured):
    for agent in ALL:
        cap = captured(agent)
        for f in cap.journal.parent.glob("journal.sqlite*"):
            assert SCRIPT_KEY.encode() not in f.read_bytes(), f
        assert SCRIPT_KEY not in cap.proc.stdout and SCRIPT_KEY not in cap.proc.stderr


@pytest.mark.parametrize("agent", RESUMABLE)
def test_native_resume_is_the_next_attempt_of_the_run(resumed, agent):
    cap, proc, rep = resumed(agent)
    assert proc.returncode == 0, proc.stderr
    assert rep["run"] == cap.run and rep["attempt"] == 2 and rep["session_id"] == cap.report["session_id"]
    with JournalReader(cap.journal) as r:
        attempts = r.attempts(cap.run)
        exchanges = r.exchanges(cap.run)
        traj = trajectory_from_journal(r, cap.run)
    assert [(a.n, a.exit_code) for a in attempts] == [(1, 0), (2, 0)]
    assert any(a.endswith(RESUME_TASK) for a in json.loads(attempts[1].labels["argv"]))
    second = [e for e in exchanges if e.attempt == 2]
    assert second, "the resumed session sent nothing through the gateway"
    main_chain = {e.chain for e in exchanges if e.role == "main"}
    assert len(main_chain) == 1
    [main] = main_chain
    answered = [e for e in second if e.chain is not None]
    if AGENTS[agent].resume == "extends":
        # Claude Code, Codex and OpenCode send the old conversation and extend the main chain
        assert rep["steps"] == 4 and len(traj.steps) == 4
        assert traj.steps[3].action.text == RESUMED_TEXT
        assert [e.role for e in second if e.chain == main] == ["main"]
        assert rep["attempt_chains"] == [main]
        assert rep["attempt_steps"] == [{"chain": main, "steps": 1, "main": True}]
    else:
        # Gemini CLI and Qwen Code regenerate their first context message: a new chain in the
        # same run, auxiliary to the main chain of the first attempt
        assert rep["steps"] == 3 and len(traj.steps) == 3
        assert answered and all(e.chain != main and e.role == "auxiliary" for e in answered)
        assert main not in rep["attempt_chains"]
        # ... whose step the report names: "this attempt: chain 2, 1 step"
        [new] = rep["attempt_steps"]
        assert new["chain"] != main and not new["main"] and new["steps"] == 1
        assert new["chain"] in rep["attempt_chains"]


def test_mini_swe_agent_has_no_resume(captured):
    cap = captured("mini-swe-agent")
    proc = pvisor(
        [
            "--journal",
            str(cap.journal),
            "run",
            "--agent",
            "mini-swe-agent",
            "--agent-entrypoint",
            str(entrypoint("mini-swe-agent")),
            "--script",
            str(cap.script),
            "--resume",
            cap.run,
            "--",
            RESUME_TASK,
        ],
        env=user_env(cap.user_home),
        cwd=cap.root,
    )
    assert proc.returncode == 2 and "mini-swe-agent has no native resume" in proc.stderr, proc.stderr
    with JournalReader(cap.journal) as r:
        assert [a.n for a in r.attempts(cap.run)] == [1]


@pytest.mark.parametrize(
    "agent", ["claude-code", "gemini-cli"]
)  # "--" before the positional prompt; --prompt=TASK
def test_a_task_starting_with_a_dash_is_the_prompt_not_an_option(tmp_path, agent):
    """A task such as "--version" reaches the model as the prompt (Claude Code used to print
    its version and exit 0 with no step)."""
    workspace, home, data = tmp_path / "ws", tmp_path / "home", tmp_path / "data"
    for d in (workspace, home, data):
        d.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": FINAL_TEXT}]}))
    journal = data / "journal.sqlite"
    proc, report = _run(agent, tmp_path, journal, workspace, home, script, "--version")
    assert proc.returncode == 0, proc.stderr
    assert report["steps"] == 1, report
    with JournalReader(journal) as r:
        main = [ex for ex in r.exchanges(report["run"]) if ex.role == "main"]
        assert b'"--version"' in (r.request_body(main[0]) or b"")


@pytest.mark.parametrize("agent", ALL)
def test_every_request_the_agent_sent_passes_the_strict_validator(captured, agent):
    # issue 14 item 4: the validator is no stricter than the APIs the real agents talk to
    # (Claude Code's requests, which the corpus may not keep, are checked here as captured)
    import orjson

    from pvisor.adapters.protocols import get_protocol
    from pvisor.adapters.protocols.validate import validate_request

    cap = captured(agent)
    checked = 0
    with JournalReader(cap.journal) as r:
        for ex in r.exchanges(cap.run):
            if ex.protocol is None or ex.method != "POST" or get_protocol(ex.protocol).counts_tokens(ex.path):
                continue
            body = r.request_body(ex)
            assert validate_request(ex.protocol, orjson.loads(body)) == [], ex.id
            checked += 1
    assert checked >= 3
