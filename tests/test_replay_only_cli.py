"""``pvisor replay --replay-only`` meets bad input and misbehaving agents: one clear line on
stderr, the documented exit code, a ``result.json`` with status ``failed`` (or ``diverged``)
whenever the output directory was accepted, and what was recorded kept. The agent here is a
small shell script that answers ``--version`` like Claude Code and then exits or hangs, so
that no real CLI is needed to misbehave."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from corpus_runs import record_corpus_runs
from replay_helpers import recorded_claude_run
from pvisor.journal.reader import JournalReader

REPO = Path(__file__).resolve().parents[1]
PVISOR = Path(sys.executable).with_name("pvisor")
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())


def fake_agent(tmp: Path, behaviour: str, version: str = "2.1.332") -> Path:
    """An executable that prints ``version`` for ``--version`` and otherwise ``behaviour``s:
    ``exit`` (status 3 at once), ``hang`` (sleeps until killed)."""
    script = tmp / f"fake-claude-{behaviour}-{version}"
    act = {"exit": "echo 'fake agent: giving up' >&2; exit 3", "hang": "exec sleep 600"}[behaviour]
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "{version} (Claude Code)"; exit 0; fi\n{act}\n'
    )
    script.chmod(0o755)
    return script


@functools.cache
def _agents_on_path() -> str:
    """A directory of stand-ins for the agents' commands (``claude``, ``codex``): the replays
    here stop before an agent starts, and each test names its one problem; an agent missing
    from PATH would be a second one, which the command reports along (docs/replay.md)."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="pvisor-agents-"))
    for name in ("claude", "codex"):
        (where / name).write_text("#!/bin/sh\nexit 3\n")
        (where / name).chmod(0o755)
    return str(where)


def _env() -> dict[str, str]:
    # no provider key: a continuation to the public API must find none (and this box must not use one)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PVISOR_") and not k.endswith(("_API_KEY", "_AUTH_TOKEN"))
    }
    env["PATH"] = os.pathsep.join([_agents_on_path(), env.get("PATH", "")])
    return env


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PVISOR), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=_env(),
    )


class Setup:
    """A recorded two-step Claude Code run in ``journal`` (its workspace ``recorded_ws``; with
    ``prompt``, the first user message's content, a gateway capture without a task label) and a
    new workspace ``new_ws``; :meth:`replay` runs ``replay --replay-only`` on it."""

    def __init__(self, tmp: Path, prompt: Any = None):
        self.tmp = tmp
        self.journal = tmp / "data" / "j.sqlite"
        self.journal.parent.mkdir()
        self.recorded_ws = tmp / "recorded-ws"
        self.recorded_ws.mkdir()
        self.run_id = recorded_claude_run(self.journal, self.recorded_ws, prompt=prompt)
        self.new_ws = tmp / "new-ws"
        self.new_ws.mkdir()

    def args(
        self, *extra: str, n: int = 1, out: str = "out", ws: Path | None = None, agent: str = "claude-code"
    ) -> list[str]:
        return [
            "--journal",
            str(self.journal),
            "replay",
            "--agent",
            agent,
            "--replay-only",
            "--run",
            self.run_id,
            "--after-step",
            str(n),
            "--workspace",
            str(ws or self.new_ws),
            "--output",
            str(self.tmp / out),
            *extra,
        ]

    def replay(self, *extra: str, **kw) -> subprocess.CompletedProcess:
        return run(self.args(*extra, **kw), self.tmp)


@pytest.fixture
def setup(tmp_path) -> Setup:
    return Setup(tmp_path)


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
    s = setup
    without_workspace = [a for a in s.args() if a not in ("--workspace", str(s.new_ws))]
    cases = [
        (without_workspace, "(--replay-only, continuation) needs --workspace DIR"),
        (s.args(ws=s.tmp / "nope"), "no such directory"),
        (s.args("--trajectory", str(s.journal)), "give exactly one source"),
        (s.args("--prepare-only"), "give one mode"),
        (s.args(out="new-ws/out"), "inside --workspace"),
        (s.args("--run", ""), "--run is empty"),
        (s.args("--model", ""), "--model is empty"),
    ]
    for args, pattern in cases:
        proc = run(args, s.tmp)
        assert proc.returncode == 2, (args, proc.stderr)
        _one_error(proc, pattern)
    assert not (s.tmp / "out").exists() and list(s.new_ws.iterdir()) == []
    # an unknown run is found when the source is read: a failed result says so
    proc = run([a if a != s.run_id else "r-unknown" for a in s.args()], s.tmp)
    assert proc.returncode == 2
    _one_error(proc, "no run 'r-unknown'")
    _failed(s.tmp / "out", "usage")
    # no mode flag: a continuation, whose public upstream needs the user's key
    proc = run([a for a in s.args(out="o") if a != "--replay-only"], s.tmp)
    assert proc.returncode == 2
    _one_error(proc, "which needs ANTHROPIC_API_KEY in the environment")
    assert not (s.tmp / "o").exists()


def test_the_recorded_workspace_is_refused_and_so_is_one_around_or_inside_it(setup):
    s = setup
    outer = s.tmp / "outer"
    (outer / "ws" / "sub").mkdir(parents=True)
    s.run_id = recorded_claude_run(s.journal, outer / "ws", run="r-outer")
    for ws in (outer / "ws", outer / "ws" / "sub", outer):
        proc = s.replay(ws=ws, out=f"out-{ws.name}")
        assert proc.returncode == 2, proc.stderr
        _one_error(proc, "the recorded run's own workspace")
        _failed(s.tmp / f"out-{ws.name}", "workspace_refused")


def test_a_step_out_of_range_and_another_agents_run(setup):
    s = setup
    proc = s.replay(n=3, out="o1")
    assert proc.returncode == 65
    _one_error(proc, "--after-step 3: run r-rec has 2 steps (0 <= N <= 2)")
    assert _failed(s.tmp / "o1", "after_step_out_of_range")["boundary"]["steps_total"] == 2
    proc = s.replay(agent="codex", out="o2")
    assert proc.returncode == 2
    _one_error(proc, "was recorded with agent claude-code, not --agent codex")
    proc = s.replay(agent="openhands", out="o3")
    assert proc.returncode == 2
    _one_error(proc, "pvisor cannot start openhands")


def test_a_missing_or_unverified_agent_binary(setup):
    s = setup
    proc = s.replay("--agent-entrypoint", str(s.tmp / "no-such-claude"), out="o1")
    assert proc.returncode == 69
    _one_error(proc, "does not exist")
    assert _failed(s.tmp / "o1", "agent_unavailable")["agent_started"] is False
    proc = s.replay("--agent-entrypoint", str(fake_agent(s.tmp, "exit", version="1.0.0")), out="o2")
    assert proc.returncode == 69
    _one_error(proc, "is not a supported version")


def test_an_agent_that_exits_before_request_n_plus_1_and_a_retry_in_the_same_output(setup):
    s = setup
    agent = str(fake_agent(s.tmp, "exit"))
    for _ in (1, 2):  # the failed result.json never blocks the retry
        proc = s.replay("--agent-entrypoint", agent)
        assert proc.returncode == 1, proc.stderr
        _one_error(proc, "the agent exited (code 3) after main-loop request 0, before request 2")
        result = _failed(s.tmp / "out", "agent_ended_early")
        assert result["agent_started"] is True and result["agent_run"]["ended_by"] == "agent"
        # the installed agent is not the recorded version: said, not refused
        assert (result["agent_run"]["recorded_version"], result["agent_run"]["installed_version"]) == (
            "2.1.300",
            "2.1.332",
        )
        assert "agent_version_differs" in [w["code"] for w in result["warnings"]]
    # what was recorded is kept: the derived runs, with their attempt and exit code
    with JournalReader(s.journal) as r:
        derived = [x for x in r.runs() if x.mode == "replay-only"]
        assert len(derived) == 2 and all(x.parent_run == s.run_id and x.boundary_step == 1 for x in derived)
        assert r.attempts(derived[0].id)[0].exit_code == 3
    # an output holding a successful result is another matter: refused without --force
    (s.tmp / "out" / "result.json").write_text(json.dumps({"status": "ok"}))
    proc = s.replay("--agent-entrypoint", agent)
    assert proc.returncode == 2 and "is not empty" in proc.stderr


def test_a_config_files_continuation_options_are_in_a_failed_results_warnings(setup):
    """replay.toml's continuation options under --replay-only are warned in result.json too
    (``options_ignored``), also when the replay then fails (issue 40 item 5)."""
    s = setup
    cfg = s.tmp / "replay.toml"
    cfg.write_text('live_model = "other-model"\nboundary_user_prompt = "Go on."\n')
    proc = s.replay("--agent-entrypoint", str(fake_agent(s.tmp, "exit")), "--config", str(cfg))
    assert proc.returncode == 1, proc.stderr
    said = f"{cfg}: boundary_user_prompt, live_model are for a continuation; --replay-only ignores them"
    assert f"pvisor: warning: {said}" in proc.stderr.splitlines()
    result = _failed(s.tmp / "out", "agent_ended_early")
    assert {"code": "options_ignored", "message": said} in result["warnings"]


def test_an_agent_that_hangs_is_stopped_at_the_timeout(setup):
    s = setup
    proc = s.replay("--agent-entrypoint", str(fake_agent(s.tmp, "hang")), "--timeout", "2")
    assert proc.returncode == 124, proc.stderr
    _one_error(proc, "did not reach request 2 within --timeout 2 s")
    assert _failed(s.tmp / "out", "agent_timeout")["agent_run"]["ended_by"] == "timeout"


def test_ctrl_c_stops_the_agent_and_leaves_a_failed_result(setup):
    s = setup
    proc = subprocess.Popen(
        [str(PVISOR), *s.args("--agent-entrypoint", str(fake_agent(s.tmp, "hang")))],
        cwd=s.tmp,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the agent runs once its attempt is in the journal
        with JournalReader(s.journal) as r:
            if any(x.mode == "replay-only" for x in r.runs()):
                break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted by SIGINT" in err
    assert _failed(s.tmp / "out", "interrupted")["agent_run"]["ended_by"] == "interrupted"


def _corpus_replay(
    tmp_path: Path, corpus: Path, run_name: str, agent: str, n: int, *extra: str
) -> subprocess.CompletedProcess:
    journal = tmp_path / "j.sqlite"
    record_corpus_runs(corpus, journal, [run_name])
    ws = tmp_path / "ws"
    ws.mkdir()
    return run(
        [
            "--journal",
            str(journal),
            "replay",
            "--agent",
            agent,
            "--replay-only",
            "--run",
            run_name,
            "--after-step",
            str(n),
            "--workspace",
            str(ws),
            "--output",
            str(tmp_path / "out"),
            *extra,
        ],
        tmp_path,
    )


def test_a_run_past_attempt_1_is_refused(tmp_path, corpus):
    # attempt 2 of codex-single (a native resume) extends the chain: steps 3 and 4
    proc = _corpus_replay(tmp_path, corpus, "codex-single", "codex", 3, "--task", "t")
    assert proc.returncode == 65
    _one_error(proc, "step 3 of run codex-single came from attempt 2")
    _failed(tmp_path / "out", "attempt_not_replayable")


def test_no_task_anywhere_asks_for_task(tmp_path, corpus):
    """A gateway capture (no task label, no command line) whose requests hold no user text
    either: codex-parallel's requests without their user items."""
    from corpus_runs import RUNS, corpus_lines, record_line
    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal.model import Attempt, Run
    from pvisor.journal.writer import Journal

    journal, lines = tmp_path / "j.sqlite", corpus_lines(corpus, "codex")
    with Journal.open(journal, finalize=finalize_response) as j:
        j.create_run(Run(id="codex-no-prompt", agent="codex"))
        j.start_attempt(Attempt(run="codex-no-prompt", n=1))
        for i in RUNS["codex-parallel"][1][0][1]:
            line = {**lines[i]}
            line["body"] = {
                **line["body"],
                "input": [item for item in line["body"]["input"] if item.get("role") != "user"],
            }
            record_line(j, "codex-no-prompt", 1, line, i)
        j.end_attempt("codex-no-prompt", 1, 0)
        j.flush()
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = run(
        ["--journal", str(journal), "replay", "--agent", "codex", "--replay-only", "--run", "codex-no-prompt",
         "--after-step", "1", "--workspace", str(ws), "--output", str(tmp_path / "out")],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 65
    _one_error(proc, "no task label, no command line, and no prompt in its first request")
    _failed(tmp_path / "out", "no_task")


REMINDER = "<system-reminder>\nToday's date is 2026-12-04.\n</system-reminder>"
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


@pytest.mark.parametrize(
    "prompt,code,needle",
    [
        # Claude Code's user message of a gateway capture: its reminder, then the prompt
        (
            "say hi\x00 now",
            "task_unusable",
            "the task (read from the run's first request) holds a NUL character (character 7)",
        ),
        (
            "x" * 140_000,
            "task_unusable",
            "the task (read from the run's first request) is 140000 bytes, more than the 131071 that Claude "
            "Code can be given on its command line",
        ),
        (
            " \n\t ",
            "no_task",
            "its first request gives no task for sure (its prompt is blank): give --task TEXT",
        ),
        (
            [IMAGE, "Describe the picture."],
            "no_task",
            "(its user message holds a part that is no text (image) beside the prompt, which a task on the "
            "command line cannot carry): give --task TEXT",
        ),
    ],
    ids=["nul", "over-128KiB", "blank", "image"],
)
def test_a_first_request_whose_prompt_cannot_start_the_agent_is_one_line_and_no_run(
    tmp_path, prompt, code, needle
):
    """A gateway capture's first request gives a task no agent can be started with (a NUL, more
    than one argument holds), none (blank), or not the whole prompt (an image beside it): exit
    65 with one line and a result; no derived run is left behind. Before: a traceback (ValueError:
    embedded null byte) with the derived run left open, agent_unavailable (Argument list too
    long), the usage line of pvisor run (give the task after --), the image dropped silently."""
    parts = [prompt] if isinstance(prompt, str) else prompt
    content = [{"type": "text", "text": REMINDER}] + [
        {"type": "text", "text": p} if isinstance(p, str) else p for p in parts
    ]
    s = Setup(tmp_path, prompt=content)
    proc = s.replay("--agent-entrypoint", str(fake_agent(tmp_path, "exit")))
    assert proc.returncode == 65, proc.stderr
    line = _one_error(proc, needle)
    assert line.startswith(f"pvisor: error: {code}: {s.journal}") and len(line) < 600, line
    _failed(tmp_path / "out", code)
    with JournalReader(s.journal) as r:
        assert [run.id for run in r.runs()] == [s.run_id]  # no derived run, open or ended


def test_a_failed_prepare_never_blocks_its_retry_either(setup):
    s = setup
    out = s.tmp / "out"
    args = [
        "--journal",
        str(s.journal),
        "replay",
        "--agent",
        "claude-code",
        "--run",
        s.run_id,
        "--prepare-only",
        "--output",
        str(out),
    ]
    assert run([*args, "--after-step", "9"], s.tmp).returncode == 65
    _failed(out, "after_step_out_of_range")
    proc = run([*args, "--after-step", "1"], s.tmp)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "result.json").read_text())["status"] == "ok" and (out / "prefix.json").exists()
    # an output holding other files is still refused
    (out / "notes.txt").write_text("mine")
    (out / "result.json").write_text(json.dumps({"status": "failed"}))
    proc = run([*args, "--after-step", "1"], s.tmp)
    assert proc.returncode == 2 and "is not empty" in proc.stderr
