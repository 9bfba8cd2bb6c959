"""Pause views (``pvisor view``, replay/views.py): every pause kind, with and without
``--before``, from a journal run (the real Codex and mini-swe-agent captures of the agent
tests) and from native files (the captures' own and corpus samples); the Python API and its
handoff; bad input. Nothing is mocked: real agents, real journals, the real CLI."""

from __future__ import annotations

import json
import math
import os
import pty
import subprocess
from dataclasses import replace

import pytest
from agent_helpers import FILES, PVISOR, SCRIPT_KEY, pvisor, user_env
from conftest import corpus_dir

from pvisor.adapters.agents import get_descriptor
from pvisor.journal.errors import BadInputError, UsageError
from pvisor.journal.model import ToolCall
from pvisor.replay.views import PauseKind, PauseSpec, TrajectoryReplay, materialize_pauses, restore_handoff

pytestmark = pytest.mark.slow

NATIVE = corpus_dir() / "native"


def view(cap, *args: str, source: str | None = None):
    proc = pvisor(
        ["--journal", str(cap.journal), "view", source or cap.run, *args],
        env=user_env(cap.user_home),
        cwd=cap.root,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, (json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout else None)


def test_step_views_of_a_journal_run_hold_the_steps_through_the_pause(captured):
    cap = captured("codex")
    # 3 steps, or 4 once the agent tests resumed the session (attempt 2 adds one)
    total = view(cap)[1]["steps_total"]
    assert total in (3, 4)
    for k in range(total + 1):
        _, doc = view(cap, "--step", str(k))
        assert (doc["pause"]["kind"], doc["pause"]["step"], doc["through_step"]) == ("step", k, k)
        assert [s["step"] for s in doc["steps"]] == list(range(1, k + 1))
        assert doc["workspace"]["after_step"] == k and doc["workspace"]["manifest"]
        if k:
            _, before = view(cap, "--step", str(k), "--before")
            assert before["through_step"] == k - 1 and before["pause"]["before"] is True
            assert before["steps"] == doc["steps"][:-1]
            assert before["workspace"]["after_step"] == k - 1  # the snapshot taken before A_K
    _, last = view(cap)
    assert last["through_step"] == total  # no pause option: the last step
    step1 = last["steps"][0]
    assert step1["action"]["tool_calls"][0]["arguments"]["cmd"].startswith("echo alpha > a.txt")
    assert "alpha" in step1["observation"]["results"][0]["output"]
    assert last["task"] == "Write a.txt, b.txt and c.txt."
    assert last["pause"]["id"] is None  # the command names no pause


def keys_of(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_of(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_of(v)}
    return set()


def test_a_view_leaves_out_internal_state(captured):
    cap = captured("claude-code")
    _, doc = view(cap)
    internal = {
        "exchange",
        "seq",
        "served_by",
        "flags",
        "signature",
        "encrypted",
        "raw",
        "headers",
        "retries",
    }
    assert not keys_of(doc) & internal, keys_of(doc) & internal
    text = json.dumps(doc)
    assert SCRIPT_KEY not in text, (
        "the agent's key is in the view"
    )  # (the text is not shown: a Claude Code prompt)
    assert set(doc["omitted"]) == {"signatures", "encrypted_reasoning"}
    # Anthropic does not repeat the tool's name with its result: the view takes the call's
    assert doc["steps"][0]["observation"]["results"][0]["name"] == "Bash"
    assert doc["source"] == {
        "kind": "journal",
        "path": str(cap.journal),
        "run": cap.run,
        "agent": "claude-code",
    }


def test_progress_maps_a_fraction_to_a_step(captured):
    cap = captured("codex")
    total = view(cap)[1]["steps_total"]
    for f in (0, 0.01, 0.25, 0.5, 2 / 3, 0.67, 1):
        k = math.ceil(f * total)
        _, doc = view(cap, "--progress", str(f))
        assert (doc["pause"]["kind"], doc["pause"]["progress"], doc["through_step"]) == ("progress", f, k), f
    _, doc = view(cap, "--progress", "0.5", "--before")
    assert (
        doc["through_step"] == math.ceil(0.5 * total) - 1
        and doc["workspace"]["after_step"] == doc["through_step"]
    )


def test_before_commitment_stops_before_the_finish_command(captured):
    cap = captured("mini-swe-agent")  # its step 3 submits: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
    _, doc = view(cap, "--before-commitment")
    assert doc["pause"]["commitment"]["step"] == 3 and doc["pause"]["commitment"]["why"] == "finish command"
    assert doc["through_step"] == 2 and doc["pause"]["step"] == 2
    assert doc["workspace"]["after_step"] == 2
    _, before = view(cap, "--before-commitment", "--before")
    assert before["through_step"] == 1


def test_before_commitment_in_a_run_without_one_is_refused_with_a_hint(captured):
    cap = captured("codex")
    proc, _ = view(cap, "--before-commitment")
    assert proc.returncode == 65
    assert "pause at a step instead (--step K or --progress F" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_native_sources_give_the_same_steps_without_a_workspace(captured):
    cap = captured("codex")
    native = cap.report["native_trajectory"]
    _, from_file = view(cap, "--step", "2", source=native)
    _, from_run = view(cap, "--step", "2")
    assert from_file["source"]["kind"] == "native" and from_file["source"]["agent"] == "codex"
    assert from_file["workspace"] is None
    calls = [[c["name"] for c in s["action"]["tool_calls"]] for s in from_file["steps"]]
    assert calls == [[c["name"] for c in s["action"]["tool_calls"]] for s in from_run["steps"]]
    _, before = view(cap, "--step", "2", "--before", source=native)
    assert before["steps"] == from_file["steps"][:1]


@pytest.mark.parametrize(
    "path,agent,step,tool",
    [
        ("swe-agent/demo_function_calling_simple.traj", "swe-agent", 5, "submit"),
        ("openhands/tests_runtime_trajs_basic.json", "openhands", 2, "finish"),
        # mini-swe-agent in text mode: the submit command in the action's fenced block
        ("mini-swe-agent/real-2.4.6_textbased.traj.json", "mini-swe-agent", 2, "text"),
        # 1.x: "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
        ("mini-swe-agent/v1_gemini-3-pro_django__django-16255.traj.json", "mini-swe-agent", 17, "text"),
    ],
)
def test_before_commitment_of_corpus_files_stops_before_the_finish_tool(path, agent, step, tool, tmp_path):
    proc = subprocess.run(
        [str(PVISOR), "view", str(NATIVE / path), "--before-commitment", "--agent", agent],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["pause"]["commitment"]["name"] == tool and doc["pause"]["commitment"]["step"] == step
    assert doc["through_step"] == step - 1 and len(doc["steps"]) == step - 1


def test_the_python_api_materializes_pauses_and_hands_one_off(captured, tmp_path):
    cap = captured("codex")
    replay = TrajectoryReplay.from_journal(cap.journal, cap.run)
    views = materialize_pauses(
        replay,
        [
            PauseSpec("first", PauseKind.STEP, 1),
            PauseSpec("half", "progress", 0.5),
            PauseSpec("before-2", PauseKind.STEP, 2, before=True),
        ],
    )
    assert [(v.pause.id, v.through) for v in views] == [("first", 1), ("half", 2), ("before-2", 1)]
    assert (
        replay.materialize_pauses([PauseSpec("again", PauseKind.STEP, 1)])[0].to_json()["steps"]
        == (views[0].to_json()["steps"])
    )
    branch = restore_handoff(views[1], tmp_path / "child", "r-child-1")
    assert (branch.parent_run, branch.pause_step, branch.child_run) == (cap.run, 2, "r-child-1")
    assert branch.snapshot_hash == views[1].to_json()["workspace"]["manifest"]
    restored = {p.name: p.read_text() for p in (tmp_path / "child").iterdir() if p.name in FILES}
    assert restored == FILES  # after step 2 every file is written
    assert branch.restored_observation == views[1].to_json()["steps"][-1]["observation"]
    with pytest.raises(UsageError, match="not empty"):
        restore_handoff(views[1], tmp_path / "child", "r-child-2")


def test_the_python_api_refuses_what_cannot_be_made(captured, tmp_path):
    cap = captured("codex")
    replay = TrajectoryReplay.from_journal(cap.journal, cap.run)
    with pytest.raises(UsageError, match=r"pause far: --step 9: the run has \d steps \(0 <= K <= \d\)"):
        replay.view(PauseSpec("far", PauseKind.STEP, 9))
    with pytest.raises(UsageError, match="pause zero: --step 0 --before"):
        replay.view(PauseSpec("zero", PauseKind.STEP, 0, before=True))
    with pytest.raises(UsageError, match="a fraction from 0 to 1"):
        replay.view(PauseSpec("big", PauseKind.PROGRESS, progress=1.5))
    with pytest.raises(UsageError, match="pause none: --progress None: a fraction from 0 to 1"):
        replay.view(PauseSpec("none", PauseKind.PROGRESS))
    with pytest.raises(UsageError, match="kind 'middle' is not one of step, progress, before_commitment"):
        PauseSpec("odd", "middle", 1)
    native = TrajectoryReplay.from_trajectory(cap.report["native_trajectory"], "codex")
    with pytest.raises(BadInputError, match="a native trajectory holds no workspace snapshot"):
        restore_handoff(native.view(PauseSpec("n", PauseKind.STEP, 1)), tmp_path / "x", "r-child")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--step", "9"], 2, "--step 9: the run has "),
        (["--step", "0", "--before"], 2, "--before needs a step in 1.."),
        (["--progress", "1.5"], 2, "--progress 1.5: a fraction from 0 to 1"),
        (["--progress", "nan"], 2, "--progress nan: a fraction from 0 to 1"),
        (
            ["--step", "1", "--progress", "0.5"],
            2,
            "give one pause at most: --step and --progress both choose a step",
        ),
        (["--agent", "codex"], 2, "--agent is for a native FILE"),
        (["--output", "/nonexistent-dir/v.json"], 2, "cannot write --output /nonexistent-dir/v.json"),
        (["--progress", "2"], 2, "--progress 2: a fraction from 0 to 1"),
    ],
)
def test_bad_pauses_get_one_line_and_an_exit_code(captured, args, code, message):
    cap = captured("codex")
    proc, _ = view(cap, *args)
    assert proc.returncode == code, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("pvisor: error: ") and message in line, line


def test_a_fifo_is_refused_not_waited_on(captured, tmp_path):
    cap = captured("codex")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc, _ = view(cap, source=str(fifo))  # pvisor() has a timeout: a hang fails the test
    assert proc.returncode == 2 and f"{fifo}: not a regular file" in proc.stderr


def test_an_unknown_run_and_a_run_without_snapshots(captured, tmp_path):
    cap = captured("codex")
    proc, _ = view(cap, source="r-nope")
    assert proc.returncode == 2 and "no run 'r-nope'" in proc.stderr
    # a run recorded with --no-snapshots (in a journal of its own: the capture's is shared)
    ws, journal = tmp_path / "ws", tmp_path / "j.sqlite"
    ws.mkdir()
    from agent_captures import _run

    _, report = _run(
        "codex", tmp_path, journal, ws, cap.user_home, cap.script, "Write a.txt.", "--no-snapshots"
    )
    assert report["snapshots"] == 0
    own = replace(cap, journal=journal)
    _, doc = view(own, "--step", "1", source=report["run"])
    assert (
        doc["workspace"]["snapshot"] is None
        and "has no workspace snapshot" in doc["workspace"]["unavailable"]
    )
    restore = pvisor(
        [
            "--journal",
            str(journal),
            "snapshot",
            "restore",
            report["run"],
            "--step",
            "1",
            "--into",
            str(tmp_path / "r"),
        ],
        env=user_env(cap.user_home),
        cwd=tmp_path,
    )
    assert restore.returncode == 65 and "has no workspace snapshot" in restore.stderr
    assert not (tmp_path / "r").exists()


def test_a_view_written_to_a_file_and_the_progress_bar_on_a_terminal(captured, tmp_path):
    cap = captured("codex")
    out = tmp_path / "v.json"
    proc, _ = view(cap, "--step", "2", "--output", str(out))
    assert proc.returncode == 0 and proc.stdout == ""
    assert json.loads(out.read_text())["through_step"] == 2
    assert f"through step 2 (step 2) written to {out}" in proc.stderr

    def on_terminal(*extra: str) -> str:
        master, slave = pty.openpty()
        try:
            p = subprocess.run(
                [str(PVISOR), "--journal", str(cap.journal), "view", cap.run, *extra],
                stdout=subprocess.PIPE,
                stderr=slave,
                env=user_env(cap.user_home),
                cwd=tmp_path,
                timeout=60,
            )
            os.close(slave)
            slave = -1
            chunks = []
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal's other end is closed: all was read
                    break
                if not data:
                    break
                chunks.append(data)
            assert p.returncode == 0
            return b"".join(chunks).decode(errors="replace")
        finally:
            os.close(master)
            if slave != -1:
                os.close(slave)

    shown = on_terminal()
    assert f"reading run {cap.run}" in shown and "steps" in shown and "100%" in shown
    assert on_terminal("--no-progress") == ""


def test_commitments_by_descriptor():
    codex, mini = get_descriptor("codex"), get_descriptor("mini-swe-agent")

    def call(name, **arguments):
        return ToolCall("c1", name, json.dumps(arguments), arguments)

    assert codex.commitment(call("exec_command", cmd="git add -A && git commit -m 'fix'")) == "git commit"
    assert (
        codex.commitment(call("shell", command=["bash", "-lc", "git -C repo commit -am x"])) == "git commit"
    )
    assert codex.commitment(call("exec_command", cmd="git commit-tree HEAD^{tree}")) is None
    assert codex.commitment(call("exec_command", cmd="git log --grep commit")) is None
    claude = get_descriptor("claude-code")
    assert claude.commitment(call("Bash", command="cd repo && git commit -m fix")) == "git commit"
    # not a shell call, or git commit only mentioned: no commitment
    assert claude.commitment(call("Grep", pattern="git commit")) is None
    assert claude.commitment(call("Write", file_path="NOTES.md", content="then git commit -am x")) is None
    assert claude.commitment(call("Bash", command='echo "do not git commit yet"')) is None
    assert (
        mini.commitment(call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"))
        == "finish command"
    )
    assert get_descriptor("swe-agent").commitment(call("submit")) == "finish tool submit"
    assert get_descriptor("openhands").commitment(call("finish", message="done")) == "finish tool finish"


def test_a_name_that_is_not_utf8_is_one_line_not_a_traceback(tmp_path):
    # a new user's trial: orjson could not write the view of cc\xffcopy.jsonl (TypeError, exit 1)
    src = NATIVE / "claude-code" / "spotter_short.jsonl"
    odd = os.fsdecode(bytes(tmp_path) + b"/cc\xffcopy.jsonl")
    with open(odd, "wb") as f:
        f.write(src.read_bytes())
    for args, option in (
        ([odd, "--step", "1"], "RUN|FILE"),
        ([str(src), "--step", "1", "--output", os.fsdecode(bytes(tmp_path) + b"/v\xff.json")], "--output"),
    ):
        proc = subprocess.run([str(PVISOR), "view", *args], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"pvisor: error: {option} ") and "\\xff" in line, line
        assert line.endswith("not valid UTF-8 (file names and ids must be UTF-8)"), line
