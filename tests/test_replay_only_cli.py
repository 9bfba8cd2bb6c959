"""``pvisor replay --replay-only`` meets bad input and misbehaving agents: one clear line on
stderr, the documented exit code, a ``result.json`` with status ``failed`` (or ``diverged``)
whenever the output directory was accepted, and what was recorded kept. The agent here is a
small shell script that answers ``--version`` like Claude Code and then exits, hangs or waits
for a signal, so that no real CLI is needed to misbehave."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import orjson
import pytest

from corpus_runs import record_corpus_runs
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

REPO = Path(__file__).resolve().parents[1]
PVISOR = Path(sys.executable).with_name("pvisor")
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
TOOLS = [{"name": "Write", "description": "w", "input_schema": {"type": "object"}}]


def recorded_run(journal: Path, workspace: Path, run: str = "r-rec", agent: str = "claude-code") -> str:
    """A two-step Claude Code run (a Write call, then text) recorded in ``journal``."""
    mod = get_protocol("anthropic")
    first = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "stop_reason": "tool_use",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "Write",
                "input": {"file_path": f"{workspace}/a", "content": "x"},
            }
        ],
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    msgs = [{"role": "user", "content": "write it"}]
    with Journal.open(journal) as j:
        j.create_run(
            Run(
                id=run,
                agent=agent,
                agent_version="2.1.300",
                labels={"workspace": str(workspace), "task": "write it"},
            )
        )
        for reply in (
            first,
            {**first, "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
        ):
            body = {"model": "claude-x", "system": "s", "tools": TOOLS, "messages": msgs, "stream": True}
            j.record_exchange(
                run,
                "POST",
                "/v1/messages",
                [("content-type", "application/json")],
                protocol="anthropic",
                status=200,
                request_body=orjson.dumps(body),
                response_body=mod.render_stream(reply),
                streamed=True,
            )
            msgs = msgs + [
                {"role": "assistant", "content": reply["content"]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
                },
            ]
    return run


def fake_agent(tmp: Path, behaviour: str, version: str = "2.1.332") -> Path:
    """An executable that prints ``version`` for ``--version`` and otherwise ``behaviour``s:
    ``exit`` (status 3 at once), ``hang`` (sleeps until killed)."""
    script = tmp / f"fake-claude-{behaviour}"
    act = {"exit": "echo 'fake agent: giving up' >&2; exit 3", "hang": "exec sleep 600"}[behaviour]
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "{version} (Claude Code)"; exit 0; fi\n{act}\n'
    )
    script.chmod(0o755)
    return script


def run(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVISOR_")}
    return subprocess.run(
        [str(PVISOR), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
        **kw,
    )


@pytest.fixture
def setup(tmp_path):
    journal = tmp_path / "data" / "j.sqlite"
    journal.parent.mkdir()
    recorded_ws = tmp_path / "recorded-ws"
    recorded_ws.mkdir()
    run_id = recorded_run(journal, recorded_ws)
    new_ws = tmp_path / "new-ws"
    new_ws.mkdir()
    return tmp_path, journal, run_id, recorded_ws, new_ws


def _replay(tmp, journal, *args):
    return run(
        ["--journal", str(journal), "replay", "--agent", "claude-code", "--replay-only", *args], cwd=tmp
    )


def _one_error(proc, pattern: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert len(errors) == 1 and pattern in errors[0], proc.stderr
    return errors[0]


def _failed(out: Path, code: str) -> dict:
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "failed" and [e["code"] for e in result["errors"]] == [code], result["errors"]
    assert not (out / "prefix.json").exists()
    return result


def test_usage_errors_write_nothing(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    out = tmp / "out"
    cases = [
        (["--run", run_id, "--after-step", "1", "--output", str(out)], "--replay-only needs --workspace DIR"),
        (
            ["--run", run_id, "--after-step", "1", "--workspace", str(tmp / "nope"), "--output", str(out)],
            "no such directory",
        ),
        (
            [
                "--run",
                run_id,
                "--trajectory",
                str(journal),
                "--after-step",
                "1",
                "--workspace",
                str(new_ws),
                "--output",
                str(out),
            ],
            "give exactly one source",
        ),
        (
            [
                "--run",
                run_id,
                "--after-step",
                "1",
                "--workspace",
                str(new_ws),
                "--output",
                str(out),
                "--prepare-only",
            ],
            "give one mode",
        ),
        (
            [
                "--run",
                run_id,
                "--after-step",
                "1",
                "--workspace",
                str(new_ws),
                "--output",
                str(new_ws / "out"),
            ],
            "inside --workspace",
        ),
    ]
    for args, pattern in cases:
        proc = _replay(tmp, journal, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        _one_error(proc, pattern)
    assert not out.exists() and list(new_ws.iterdir()) == []
    # an unknown run is found when the source is read: a failed result says so
    proc = _replay(
        tmp,
        journal,
        "--run",
        "r-unknown",
        "--after-step",
        "1",
        "--workspace",
        str(new_ws),
        "--output",
        str(out),
    )
    assert proc.returncode == 2
    _one_error(proc, "no run 'r-unknown'")
    _failed(out, "usage")
    # no mode at all
    proc = run(
        [
            "--journal",
            str(journal),
            "replay",
            "--agent",
            "claude-code",
            "--run",
            run_id,
            "--after-step",
            "1",
            "--output",
            str(tmp / "o"),
        ],
        tmp,
    )
    assert proc.returncode == 2 and "give one mode" in proc.stderr


def test_the_recorded_workspace_is_refused_and_so_is_one_around_or_inside_it(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    outer = tmp / "outer"
    (outer / "ws" / "sub").mkdir(parents=True)
    run_id = recorded_run(journal, outer / "ws", run="r-outer")
    for ws in (outer / "ws", outer / "ws" / "sub", outer):
        out = tmp / f"out-{ws.name}"
        proc = _replay(
            tmp, journal, "--run", run_id, "--after-step", "1", "--workspace", str(ws), "--output", str(out)
        )
        assert proc.returncode == 2, proc.stderr
        _one_error(proc, "the recorded run's own workspace")
        _failed(out, "workspace_refused")


def test_a_step_out_of_range_and_another_agents_run(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    proc = _replay(
        tmp,
        journal,
        "--run",
        run_id,
        "--after-step",
        "3",
        "--workspace",
        str(new_ws),
        "--output",
        str(tmp / "o1"),
    )
    assert proc.returncode == 65
    _one_error(proc, "--after-step 3: run r-rec has 2 steps (0 <= N <= 2)")
    assert _failed(tmp / "o1", "after_step_out_of_range")["boundary"]["steps_total"] == 2
    proc = run(
        [
            "--journal",
            str(journal),
            "replay",
            "--agent",
            "codex",
            "--replay-only",
            "--run",
            run_id,
            "--after-step",
            "1",
            "--workspace",
            str(new_ws),
            "--output",
            str(tmp / "o2"),
        ],
        tmp,
    )
    assert proc.returncode == 2
    _one_error(proc, "was recorded with agent claude-code, not --agent codex")
    proc = run(
        [
            "--journal",
            str(journal),
            "replay",
            "--agent",
            "openhands",
            "--replay-only",
            "--run",
            run_id,
            "--after-step",
            "1",
            "--workspace",
            str(new_ws),
            "--output",
            str(tmp / "o3"),
        ],
        tmp,
    )
    assert proc.returncode == 2
    _one_error(proc, "pvisor cannot start openhands")


def test_a_missing_or_unverified_agent_binary(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    proc = _replay(
        tmp,
        journal,
        "--run",
        run_id,
        "--after-step",
        "1",
        "--workspace",
        str(new_ws),
        "--output",
        str(tmp / "o1"),
        "--agent-entrypoint",
        str(tmp / "no-such-claude"),
    )
    assert proc.returncode == 69
    _one_error(proc, "does not exist")
    assert _failed(tmp / "o1", "agent_unavailable")["agent_started"] is False
    old = fake_agent(tmp, "exit", version="1.0.0")
    proc = _replay(
        tmp,
        journal,
        "--run",
        run_id,
        "--after-step",
        "1",
        "--workspace",
        str(new_ws),
        "--output",
        str(tmp / "o2"),
        "--agent-entrypoint",
        str(old),
    )
    assert proc.returncode == 69
    _one_error(proc, "is not a supported version")


def test_an_agent_that_exits_before_request_n_plus_1_and_a_retry_in_the_same_output(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    out = tmp / "out"
    agent = fake_agent(tmp, "exit")
    for attempt in (1, 2):  # the failed result.json never blocks the retry
        proc = _replay(
            tmp,
            journal,
            "--run",
            run_id,
            "--after-step",
            "1",
            "--workspace",
            str(new_ws),
            "--output",
            str(out),
            "--agent-entrypoint",
            str(agent),
        )
        assert proc.returncode == 1, proc.stderr
        _one_error(proc, "the agent exited (code 3) after main-loop request 0, before request 2")
        result = _failed(out, "agent_ended_early")
        assert result["agent_started"] is True and result["agent_run"]["ended_by"] == "agent"
        # the installed agent is not the recorded version: said, not refused
        assert (result["agent_run"]["recorded_version"], result["agent_run"]["installed_version"]) == ("2.1.300", "2.1.332")
        assert "agent_version_differs" in [w["code"] for w in result["warnings"]]
    # what was recorded is kept: the derived run, with its attempt and exit code
    with JournalReader(journal) as r:
        derived = [x for x in r.runs() if x.mode == "replay-only"]
        assert len(derived) == 2 and all(x.parent_run == run_id and x.boundary_step == 1 for x in derived)
        assert r.attempts(derived[0].id)[0].exit_code == 3
    # a successful result is another matter: an output holding it is refused without --force
    (out / "result.json").write_text(json.dumps({"status": "ok"}))
    proc = _replay(
        tmp,
        journal,
        "--run",
        run_id,
        "--after-step",
        "1",
        "--workspace",
        str(new_ws),
        "--output",
        str(out),
        "--agent-entrypoint",
        str(agent),
    )
    assert proc.returncode == 2 and "is not empty" in proc.stderr


def test_an_agent_that_hangs_is_stopped_at_the_timeout(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    proc = _replay(
        tmp,
        journal,
        "--run",
        run_id,
        "--after-step",
        "1",
        "--workspace",
        str(new_ws),
        "--output",
        str(tmp / "out"),
        "--agent-entrypoint",
        str(fake_agent(tmp, "hang")),
        "--timeout",
        "2",
    )
    assert proc.returncode == 124, proc.stderr
    _one_error(proc, "did not reach request 2 within --timeout 2 s")
    assert _failed(tmp / "out", "agent_timeout")["agent_run"]["ended_by"] == "timeout"


def test_ctrl_c_stops_the_agent_and_leaves_a_failed_result(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVISOR_")}
    proc = subprocess.Popen(
        [
            str(PVISOR),
            "--journal",
            str(journal),
            "replay",
            "--agent",
            "claude-code",
            "--replay-only",
            "--run",
            run_id,
            "--after-step",
            "1",
            "--workspace",
            str(new_ws),
            "--output",
            str(tmp / "out"),
            "--agent-entrypoint",
            str(fake_agent(tmp, "hang")),
        ],
        cwd=tmp,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the agent runs once its attempt is in the journal
        with JournalReader(journal) as r:
            if any(x.mode == "replay-only" for x in r.runs()):
                break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted by SIGINT" in err
    assert _failed(tmp / "out", "interrupted")["agent_run"]["ended_by"] == "interrupted"


def test_a_run_past_attempt_1_is_refused(tmp_path, corpus):
    journal = tmp_path / "j.sqlite"
    record_corpus_runs(
        corpus, journal, ["codex-single"]
    )  # attempt 2 (a native resume) extends the chain: steps 3 and 4
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = run(
        [
            "--journal",
            str(journal),
            "replay",
            "--agent",
            "codex",
            "--replay-only",
            "--run",
            "codex-single",
            "--after-step",
            "3",
            "--workspace",
            str(ws),
            "--output",
            str(tmp_path / "out"),
            "--task",
            "t",
        ],
        tmp_path,
    )
    assert proc.returncode == 65
    _one_error(proc, "step 3 of run codex-single came from attempt 2")
    _failed(tmp_path / "out", "attempt_not_replayable")


def test_no_task_anywhere_asks_for_task(tmp_path, corpus):
    journal = tmp_path / "j.sqlite"
    record_corpus_runs(
        corpus, journal, ["codex-parallel"]
    )  # recorded by no pvisor run: no task label, no argv
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = run(
        [
            "--journal",
            str(journal),
            "replay",
            "--agent",
            "codex",
            "--replay-only",
            "--run",
            "codex-parallel",
            "--after-step",
            "1",
            "--workspace",
            str(ws),
            "--output",
            str(tmp_path / "out"),
        ],
        tmp_path,
    )
    assert proc.returncode == 65
    _one_error(proc, "give --task TEXT")
    _failed(tmp_path / "out", "no_task")


def test_a_failed_prepare_never_blocks_its_retry_either(setup):
    tmp, journal, run_id, recorded_ws, new_ws = setup
    out = tmp / "out"
    args = ["--journal", str(journal), "replay", "--agent", "claude-code", "--run", run_id, "--prepare-only", "--output", str(out)]
    assert run([*args, "--after-step", "9"], tmp).returncode == 65
    _failed(out, "after_step_out_of_range")
    proc = run([*args, "--after-step", "1"], tmp)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "result.json").read_text())["status"] == "ok" and (out / "prefix.json").exists()
    # an output holding other files is still refused
    (out / "notes.txt").write_text("mine")
    (out / "result.json").write_text(json.dumps({"status": "failed"}))
    proc = run([*args, "--after-step", "1"], tmp)
    assert proc.returncode == 2 and "is not empty" in proc.stderr
