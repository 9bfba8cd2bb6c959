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
from cli_helpers import pvisor_main
from conftest import corpus_dir

from pvisor.adapters.agents import get_descriptor
from pvisor.core.errors import BadInputError, UsageError
from pvisor.journal.model import ToolCall
from pvisor.replay.views import PauseKind, PauseSpec, TrajectoryReplay, materialize_pauses, restore_handoff

pytestmark = pytest.mark.slow

NATIVE = corpus_dir() / "native"


def view(cap, *args: str, source: str | None = None, process: bool = False):
    """``pvisor view`` of the capture in this process (tests/cli_helpers.py), or with ``process``
    as the installed script's own process: (outcome, document)."""
    argv = ["--journal", str(cap.journal), "view", source or cap.run, *args]
    if process:
        proc = pvisor(argv, env=user_env(cap.user_home), cwd=cap.root)
    else:
        proc = pvisor_main(argv, env=user_env(cap.user_home), cwd=cap.root, text=True)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, (json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout else None)


def test_step_views_of_a_journal_run_hold_the_steps_through_the_pause(captured):
    """--step K is transition K, zero-based (journal step K+1): the documents' numbering. Before
    it, --step 0 showed the task alone, --step K one step less than the documents mean, and
    --step 0 --before was refused."""
    cap = captured("codex")
    # 3 steps, or 4 once the agent tests resumed the session (attempt 2 adds one)
    total = view(cap)[1]["steps_total"]
    assert total in (3, 4)
    for k in range(total):
        _, doc = view(cap, "--step", str(k))
        assert doc["schema"] == "pvisor.view/v2"
        assert (doc["pause"]["kind"], doc["pause"]["transition"], doc["pause"]["before"]) == (
            "step",
            k,
            False,
        )
        assert doc["through_step"] == k + 1  # transition K is journal step K+1
        assert [(s["step"], s["transition"]) for s in doc["steps"]] == [(i + 1, i) for i in range(k + 1)]
        assert doc["workspace"]["after_step"] == k + 1 and doc["workspace"]["manifest"]
        _, before = view(cap, "--step", str(k), "--before")
        assert before["through_step"] == k and before["pause"] == {**doc["pause"], "before": True}
        assert before["steps"] == doc["steps"][:-1]
        assert before["workspace"]["after_step"] == k  # the snapshot taken before A(K+1) ran
        if k == 0:  # the task alone (refused before the documents' numbering)
            assert before["steps"] == [] and before["workspace"]["kind"] == "start"
            # --step K --before is --after-step K
            assert view(cap, "--after-step", "0")[1] == before
    # --step K is --after-step K+1
    assert {**view(cap, "--after-step", str(total))[1], "pause": None} == {**doc, "pause": None}
    _, last = view(cap)
    assert last["through_step"] == total and last["pause"]["transition"] == total - 1  # the last transition
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


def test_progress_maps_a_fraction_to_a_transition(captured):
    """--progress F is transition round(F x (T-1)), halves up: 0 the first transition, 1 the last."""
    cap = captured("codex")
    total = view(cap)[1]["steps_total"]
    for f in (0, 0.01, 0.25, 0.5, 2 / 3, 0.67, 1):
        k = math.floor(f * (total - 1) + 0.5)
        _, doc = view(cap, "--progress", str(f))
        assert (doc["pause"]["kind"], doc["pause"]["progress"], doc["pause"]["transition"]) == (
            "progress",
            f,
            k,
        )
        assert doc["through_step"] == k + 1, f
    assert view(cap, "--progress", "1")[1]["through_step"] == total
    _, doc = view(cap, "--progress", "0.5", "--before")
    k = math.floor(0.5 * (total - 1) + 0.5)
    assert doc["through_step"] == k and doc["workspace"]["after_step"] == k
    _, first = view(cap, "--progress", "0", "--before")  # before transition 0: the task alone
    assert first["through_step"] == 0


def test_before_commitment_stops_before_the_finish_command(captured):
    cap = captured(
        "mini-swe-agent"
    )  # its step 3 (transition 2) submits: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
    _, doc = view(cap, "--before-commitment")
    commitment = doc["pause"]["commitment"]
    assert (commitment["step"], commitment["transition"], commitment["why"]) == (3, 2, "finish command")
    assert doc["through_step"] == 2 and (doc["pause"]["transition"], doc["pause"]["before"]) == (2, True)
    assert doc["workspace"]["after_step"] == 2
    _, before = view(cap, "--before-commitment", "--before")  # one transition earlier still
    assert before["through_step"] == 1 and before["pause"]["transition"] == 1


def test_before_commitment_in_a_run_without_one_is_refused_with_a_hint(captured):
    cap = captured("codex")
    proc, _ = view(cap, "--before-commitment")
    assert proc.returncode == 65
    assert "pause at a step instead (--step K or --progress F" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_native_sources_give_the_same_steps_without_a_workspace(captured):
    cap = captured("codex")
    native = cap.report["native_trajectory"]
    _, from_file = view(cap, "--step", "1", source=native)
    _, from_run = view(cap, "--step", "1")
    assert from_file["source"]["kind"] == "native" and from_file["source"]["agent"] == "codex"
    assert from_file["workspace"] is None and from_file["through_step"] == 2
    calls = [[c["name"] for c in s["action"]["tool_calls"]] for s in from_file["steps"]]
    assert calls == [[c["name"] for c in s["action"]["tool_calls"]] for s in from_run["steps"]]
    _, before = view(cap, "--step", "1", "--before", source=native)
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
    # a copy: the handoff saves its child run, and the capture's journal is shared
    replay = TrajectoryReplay.from_journal(journal_copy(cap, tmp_path), cap.run)
    half = math.floor(0.5 * (replay.steps_total - 1) + 0.5)
    views = materialize_pauses(
        replay,
        [
            PauseSpec("first", PauseKind.STEP, 1),
            PauseSpec("half", "progress", 0.5),
            PauseSpec("before-2", PauseKind.STEP, 2, before=True),
            PauseSpec(id="initial", kind="step", step=0),
            PauseSpec(id="kept", kind="step", after_step=1),
        ],
    )
    assert [(v.pause.id, v.transition, v.through) for v in views] == [
        ("first", 1, 2),
        ("half", half, half + 1),
        ("before-2", 2, 2),
        ("initial", 0, 1),
        ("kept", 0, 1),
    ]
    assert views[0].describe() == f"transition 1 (step 2 of {replay.steps_total} journal steps)"
    assert (
        replay.materialize_pauses([PauseSpec("again", PauseKind.STEP, 1)])[0].to_json()["steps"]
        == (views[0].to_json()["steps"])
    )
    branch = restore_handoff(views[1], tmp_path / "child", "r-child-1")
    assert (branch.parent_run, branch.pause_step, branch.through_step, branch.child_run) == (
        cap.run,
        half,
        half + 1,
        "r-child-1",
    )
    assert branch.snapshot_hash == views[1].to_json()["workspace"]["manifest"]
    restored = {p.name: p.read_text() for p in (tmp_path / "child").iterdir() if p.name in FILES}
    assert restored == FILES  # after step 2 every file is written
    assert branch.restored_observation == views[1].to_json()["steps"][-1]["observation"]
    with pytest.raises(UsageError, match="not empty"):
        restore_handoff(views[1], tmp_path / "child", "r-child-2")


def test_the_python_api_refuses_what_cannot_be_made(captured, tmp_path):
    """Errors of the Python API name its parameters (step=9), not the command's options."""
    cap = captured("codex")
    replay = TrajectoryReplay.from_journal(cap.journal, cap.run)
    t = replay.steps_total
    with pytest.raises(
        UsageError,
        match=rf"pause far: step=9: run {cap.run} has {t} transitions \(0..{t - 1}; journal steps 1..{t}\)$",
    ):
        replay.view(PauseSpec("far", PauseKind.STEP, 9))
    with pytest.raises(UsageError, match=rf"pause end: step={t}: .*; after_step={t} is the last step's too"):
        replay.view(PauseSpec("end", PauseKind.STEP, t))
    with pytest.raises(UsageError, match="pause both: step=1 and after_step=2 both choose the pause"):
        replay.view(PauseSpec("both", PauseKind.STEP, 1, after_step=2))
    with pytest.raises(UsageError, match=r"pause big: progress=1.5: a fraction from 0 to 1"):
        replay.view(PauseSpec("big", PauseKind.PROGRESS, progress=1.5))
    with pytest.raises(UsageError, match="pause none: progress=None: a fraction from 0 to 1"):
        replay.view(PauseSpec("none", PauseKind.PROGRESS))
    with pytest.raises(UsageError, match="kind 'middle' is not one of step, progress, before_commitment"):
        PauseSpec("odd", "middle", 1)
    native = TrajectoryReplay.from_trajectory(cap.report["native_trajectory"], "codex")
    with pytest.raises(
        BadInputError, match=r"holds no workspace \(a native file has no snapshots\): give the journal"
    ):
        restore_handoff(native.view(PauseSpec("n", PauseKind.STEP, 1)), tmp_path / "x", "r-child")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--step", "9"], 2, "--step 9: run r-"),
        (["--step", "9"], 2, "transitions (0.."),
        (["--step", "1", "--after-step", "2"], 2, "--step and --after-step both choose the pause"),
        (
            ["--after-step", "1", "--before"],
            2,
            "--before is for --step K; --after-step 1 counts the steps kept",
        ),
        (["--after-step", "9"], 2, "--after-step 9: run r-"),
        (["--progress", "1.5"], 2, "--progress 1.5: a fraction from 0 to 1"),
        (["--progress", "nan"], 2, "--progress nan: a fraction from 0 to 1"),
        (
            ["--step", "1", "--progress", "0.5"],
            2,
            "give one pause at most: --step and --progress both choose the pause",
        ),
        (["--agent", "codex"], 2, "--agent is for a native FILE"),
        # a directory to make below a file: refused before anything is read
        (
            ["--output", "JOURNAL/runs/v.json"],
            2,
            "cannot write --output JOURNAL/runs/v.json: JOURNAL is not a",
        ),
        (["--progress", "2"], 2, "--progress 2: a fraction from 0 to 1"),
    ],
)
def test_bad_pauses_get_one_line_and_an_exit_code(captured, args, code, message):
    cap = captured("codex")
    proc, _ = view(cap, *[a.replace("JOURNAL", str(cap.journal)) for a in args])
    assert proc.returncode == code, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("pvisor: error: ") and message.replace("JOURNAL", str(cap.journal)) in line, line


def test_a_fifo_is_refused_not_waited_on(captured, tmp_path):
    cap = captured("codex")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc, _ = view(cap, source=str(fifo), process=True)  # pvisor() has a timeout: a hang fails the test
    assert proc.returncode == 2 and f"{fifo}: not a regular file" in proc.stderr


def test_an_unknown_run_and_a_run_without_snapshots(captured, tmp_path):
    cap = captured("codex")
    proc, _ = view(cap, source="r-nope")
    assert proc.returncode == 2 and "no run 'r-nope'" in proc.stderr
    # a path that does not exist is named as a file, never looked up as a run id only
    proc, _ = view(cap, source="./missing/traj.jsonl")
    assert (proc.returncode, proc.stderr) == (
        2,
        "pvisor: error: RUN|FILE ./missing/traj.jsonl: no such file\n",
    )
    proc, _ = view(cap, source="native.jsnol")
    assert proc.returncode == 2 and proc.stderr.strip().endswith("; and no file native.jsnol here"), (
        proc.stderr
    )
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
    total = view(cap)[1]["steps_total"]
    # the documents' own line: --output into a directory that does not exist yet
    out = tmp_path / "runs" / "local-pause.json"
    proc, _ = view(cap, "--step", "0", "--output", str(out))
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert json.loads(out.read_text())["through_step"] == 1
    assert (tmp_path / "runs").stat().st_mode & 0o777 == 0o700
    assert proc.stderr == (
        f"view of run {cap.run} at transition 0 (step 1 of {total} journal steps) written to {out}\n"
    )
    proc, _ = view(cap, "--step", "1", "--before", "--output", str(out))
    assert (
        f"view of run {cap.run} before transition 1 (after step 1 of {total} journal steps) written to {out}"
        in proc.stderr
    )

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


# --------------------------------------------------------------------------- the documents' names


def journal_copy(cap, tmp_path):
    """A copy of the capture's journal (the capture is shared by the session's tests)."""
    import sqlite3

    copy = tmp_path / "data" / "journal.sqlite"
    copy.parent.mkdir()
    with sqlite3.connect(cap.journal) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    return copy


def test_the_documents_names_import_as_written_and_lazily():
    """`from pvisor.harness import PauseSpec, TrajectoryReplay` and `from pvisor import ...`
    are pvisor's own classes; `import pvisor` loads none of them until one is used."""
    code = (
        "import sys, pvisor\n"
        "assert 'pvisor.harness' not in sys.modules and 'pvisor.replay.views' not in sys.modules\n"
        "from pvisor import PauseSpec, TrajectoryReplay\n"
        "from pvisor.harness import PauseSpec as P, TrajectoryReplay as T, HandoffBranch, restore_handoff\n"
        "from pvisor.replay import views\n"
        "assert (P, T) == (PauseSpec, TrajectoryReplay) == (views.PauseSpec, views.TrajectoryReplay)\n"
        "spec = PauseSpec(id='initial', kind='step', step=0)\n"
        "assert (spec.kind, spec.step, spec.before) == (views.PauseKind.STEP, 0, False)\n"
        "assert callable(TrajectoryReplay.from_event_log) and callable(TrajectoryReplay.restore_handoff)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


def test_from_event_log_reads_a_run_directory_an_export_and_a_native_file(captured, tmp_path):
    cap = captured("codex")
    initial = [PauseSpec(id="initial", kind="step", step=0)]
    # (b) the run's directory beside its journal: that journal, with its snapshots
    from_dir = TrajectoryReplay.from_event_log(cap.report["run_dir"])
    assert from_dir.source["kind"] == "journal" and from_dir.journal == cap.journal
    [at_dir] = from_dir.materialize_pauses(initial)
    assert at_dir.to_json()["workspace"]["after_step"] == 1 and at_dir.snapshot is not None
    # (a) a journal export of the run: the same steps, no workspace
    export = tmp_path / "out" / "run.jsonl"
    proc = pvisor(
        ["--journal", str(cap.journal), "journal", "export", cap.run, "--format", "jsonl", "-o", str(export)],
        env=user_env(cap.user_home),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    from_export = TrajectoryReplay.from_event_log(export)
    assert from_export.source == {"kind": "export", "path": str(export), "run": cap.run, "agent": "codex"}
    [at_export] = from_export.materialize_pauses(initial)
    assert (
        at_export.to_json()["steps"] == at_dir.to_json()["steps"] and at_export.to_json()["workspace"] is None
    )
    with pytest.raises(BadInputError) as exc:
        TrajectoryReplay.restore_handoff(at_export, tmp_path / "ws", "child-x")
    assert "\n" not in exc.value.message and exc.value.message.startswith("pause initial: restore_handoff: ")
    assert f"give the journal that holds run {cap.run}'s snapshots" in exc.value.message
    assert f"TrajectoryReplay.from_event_log({str(export)!r}, journal=PATH)" in exc.value.message
    assert not (tmp_path / "ws").exists()
    # ... unless the journal that holds the run's snapshots is given
    with_journal = TrajectoryReplay.from_event_log(export, journal=cap.journal)
    assert with_journal.view(initial[0]).to_json()["workspace"] == at_dir.to_json()["workspace"]
    # pvisor view reads the export as from_event_log does
    proc, doc = view(cap, "--step", "0", source=str(export))
    assert proc.returncode == 0, proc.stderr
    assert doc["source"]["kind"] == "export" and doc["steps"] == at_export.to_json()["steps"]
    # (c) a native trajectory file: no workspace either
    native = TrajectoryReplay.from_event_log(cap.report["native_trajectory"])
    at_native = native.view(initial[0]).to_json()
    assert native.source["kind"] == "native" and at_native["through_step"] == 1
    names = [[c["name"] for c in st["action"]["tool_calls"]] for st in at_native["steps"]]
    assert names == [[c["name"] for c in st["action"]["tool_calls"]] for st in at_dir.to_json()["steps"]]
    with pytest.raises(BadInputError, match="a native file has no snapshots"):
        TrajectoryReplay.restore_handoff(native.view(initial[0]), tmp_path / "ws", "child-x")


def test_from_event_log_refuses_what_it_cannot_read_in_one_line(captured, tmp_path):
    cap = captured("codex")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a trajectory\n")
    two = tmp_path / "two.jsonl"
    for run in ("r-one", "r-two"):
        with open(two, "a") as f:
            f.write(
                json.dumps(
                    {"type": "run", "id": run, "mode": "capture", "created_ms": 1, "argv": [], "labels": {}}
                )
                + "\n"
            )
    bare = tmp_path / "bare.jsonl"
    proc = pvisor(
        ["--journal", str(cap.journal), "journal", "export", cap.run, "--no-bodies", "-o", str(bare)],
        env=user_env(cap.user_home),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    gone = tmp_path / "data" / "runs" / "r-gone"
    gone.mkdir(parents=True)
    cases = [
        (notes, BadInputError, f"from_event_log: {notes}: not a run's directory beside its journal"),
        (two, BadInputError, f"{two}: an export of 2 runs (r-one, r-two); give the export of one run"),
        (bare, BadInputError, "an export made with --no-bodies holds no requests to read steps from"),
        (gone, BadInputError, f"from_event_log: {gone}: a run's directory, but no journal in"),
        (tmp_path / "nope", UsageError, f"from_event_log: {tmp_path / 'nope'}: No such file or directory"),
    ]
    for path, error, said in cases:
        with pytest.raises(error) as exc:
            TrajectoryReplay.from_event_log(path)
        assert said in exc.value.message and "\n" not in exc.value.message, exc.value.message
        assert "--agent" not in exc.value.message  # a Python caller is told agent=, not the option


def test_restore_handoff_saves_a_pending_child_run_once(captured, tmp_path):
    """The child run is created in the journal with its lineage (parent, boundary_step = steps
    kept, the pause's transition, the snapshot's digest), listed pending; errors name the Python
    parameters; `pvisor run --child-run` refuses what is no pending child run."""
    from pvisor.journal.reader import JournalReader

    cap = captured("codex")
    journal = journal_copy(cap, tmp_path)
    replay = TrajectoryReplay.from_journal(journal, cap.run)
    [view] = replay.materialize_pauses([PauseSpec(id="second", kind="step", step=1)])
    branch = TrajectoryReplay.restore_handoff(view, tmp_path / "ws-child", "child-a")
    assert (branch.parent_episode_id, branch.pause_step, branch.through_step, branch.child_episode_id) == (
        cap.run,
        1,
        2,
        "child-a",
    )
    assert branch.journal == journal and sorted(os.listdir(tmp_path / "ws-child")) >= sorted(FILES)
    with JournalReader(journal) as r:
        child = r.run("child-a")
        assert (child.mode, child.parent_run, child.boundary_step, child.pause_transition) == (
            "handoff",
            cap.run,
            2,
            1,
        )
        assert child.workspace_snapshot == branch.snapshot_hash == view.to_json()["workspace"]["manifest"]
        assert child.labels["workspace"] == str(tmp_path / "ws-child") and r.run_status(child) == "pending"
    env = user_env(cap.user_home)
    ls = pvisor(["--journal", str(journal), "journal", "ls"], env=env, cwd=tmp_path)
    [line] = [x for x in ls.stdout.splitlines() if x.startswith("child-a ")]
    assert line.split()[1:5] == ["-", "handoff", "pending", f"{cap.run}@2"], ls.stdout
    listed = json.loads(
        pvisor(["--journal", str(journal), "journal", "ls", "--json"], env=env, cwd=tmp_path).stdout
    )
    [entry] = [x for x in listed if x["id"] == "child-a"]
    assert (entry["parent_run"], entry["boundary_step"], entry["pause_transition"]) == (cap.run, 2, 1)
    assert entry["workspace_snapshot"] == branch.snapshot_hash
    show = pvisor(["--journal", str(journal), "journal", "show", "child-a"], env=env, cwd=tmp_path)
    assert (
        f"  handed off from {cap.run} after step 2 (transition 1), workspace snapshot "
        f"{branch.snapshot_hash[:12]}; pending"
    ) in show.stdout
    # refusals, each one line naming the Python parameters; nothing made
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args, said in (
        ((tmp_path / "ws-2", "child-a"), "child_episode_id='child-a': journal "),
        ((tmp_path / "ws-2", "../x"), "child_episode_id='../x': a run id of letters"),
        (
            (tmp_path / "full", "child-b"),
            f"environment={str(tmp_path / 'full')!r}: not empty; give force=True",
        ),
    ):
        with pytest.raises(UsageError) as exc:
            TrajectoryReplay.restore_handoff(view, *args)
        assert said in exc.value.message and "--" not in exc.value.message, exc.value.message
    assert not (tmp_path / "ws-2").exists()
    with JournalReader(journal) as r:
        assert not r.run_exists("child-b") and not r.run_exists("../x")
    # pvisor run --child-run: only a pending child run of a handoff, checked before the agent starts
    for child_id, extra, said in (
        ("nope", [], "--child-run nope: no run nope in journal"),
        (cap.run, [], f"--child-run {cap.run}: run {cap.run} is a capture run, not a handoff's child run"),
        (
            "child-a",
            ["--resume", cap.run],
            "--child-run starts a handoff's child run, --resume continues a run",
        ),
    ):
        proc = pvisor(
            [
                "--journal",
                str(journal),
                "run",
                "--agent",
                "codex",
                "--child-run",
                child_id,
                *extra,
                "--",
                "go",
            ],
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 2, proc.stderr
        [err] = proc.stderr.splitlines()
        assert err.startswith("pvisor: error: ") and said in err, err


def test_a_replay_is_filed_under_the_handoffs_child_run_once(captured, tmp_path):
    """`pvisor replay --child-run`: the derived run is the pending child run (its lineage kept,
    result.json's lineage the journal's), the replay must match it, and it starts once: of two
    replays started at the same moment one is refused (exit 2) as a start made later is,
    before it makes its output."""
    from agent_helpers import PVISOR, entrypoint, gated_entrypoint, start_together

    from pvisor.journal.reader import JournalReader
    from pvisor.session import continue_run
    from pvisor.replay.snapshots import run_snapshots

    cap = captured("codex")
    journal = journal_copy(cap, tmp_path)
    replay = TrajectoryReplay.from_journal(journal, cap.run)
    [view] = replay.materialize_pauses([PauseSpec(id="b", kind="step", step=1, before=True)])
    TrajectoryReplay.restore_handoff(view, tmp_path / "ws-child", "child-r")
    gate = tmp_path / "gate"
    gated = gated_entrypoint(entrypoint("codex"), gate, tmp_path / "codex-gated")

    # without a sandbox: the gated entry point's gate files, in tmp_path, are outside the workspace
    def replay_args(n: int, name: str, exe=entrypoint("codex")) -> list[str]:
        ws = tmp_path / f"ws-{name}"
        ws.mkdir()
        return [str(PVISOR), "replay", "--journal", str(journal), "--agent", "codex", "--run", cap.run,
                "--after-step", str(n), "--replay-only", "--workspace", str(ws), "--workspace-from", cap.run,
                "--output", str(tmp_path / f"out-{name}"), "--agent-entrypoint", str(exe), "--child-run",
                "child-r", "--timeout", "240", "--sandbox", "none"]  # fmt: skip

    env = user_env(cap.user_home)
    other = pvisor(replay_args(2, "other")[1:], env=env, cwd=tmp_path, timeout=400)
    assert (
        other.returncode == 2
        and (
            "--child-run child-r: the handoff's child run continues after step 1 (before transition 1); this "
            "replay is --after-step 2"
        )
        in other.stderr
    ), other.stderr
    # two at once, both past their checks (held at the agent's version check until both came)
    procs = start_together(
        [replay_args(1, "first", gated), replay_args(1, "second", gated)],
        gate,
        env=env,
        cwd=tmp_path,
        timeout=400,
    )
    assert sorted(p.returncode for p in procs) == [0, 2], [(p.returncode, p.stderr) for p in procs]
    won, lost = ("first", "second") if procs[0].returncode == 0 else ("second", "first")
    refused = procs[["first", "second"].index(lost)]
    assert not (tmp_path / f"out-{lost}").exists()  # refused before it made its output
    result = json.loads((tmp_path / f"out-{won}" / "result.json").read_text())
    assert result["derived_run"] == "child-r" and result["status"] == "ok"
    assert "handoff_workspace_differs" not in {w["code"] for w in result["warnings"]}, result["warnings"]
    with JournalReader(journal) as r:
        child = r.run("child-r")
        assert (child.mode, child.parent_run, child.boundary_step, child.pause_transition) == (
            "handoff",
            cap.run,
            1,
            1,
        )
        assert child.labels["started_as"] == "replay-only" and r.run_status(child) == "ended"
        assert len(r.attempts("child-r")) == 1
        start = run_snapshots(r, cap.run).pick(0).digest
    # result.json says the lineage the journal keeps; what --workspace-from restored stays apart
    assert result["lineage"]["workspace_snapshot"] == child.workspace_snapshot
    assert result["workspace"]["restored_from"]["manifest"] == start
    again = pvisor(replay_args(1, "again")[1:], env=env, cwd=tmp_path, timeout=400)
    assert again.returncode == 2 and "the handoff's child run child-r was started already" in again.stderr
    assert refused.stderr == again.stderr
    # the Python API names its parameter
    (tmp_path / "ws-py").mkdir()
    with pytest.raises(
        UsageError, match=r"^child_run='child-r': the handoff's child run child-r was started"
    ):
        continue_run(
            cap.run, 1, tmp_path / "ws-py", "http://127.0.0.1:9", journal=journal, child_run="child-r"
        )


# --------------------------------------------------------------------------- hand-made sources

#: one exchange of a claude-code run: the task, and an action that ends it (one step)
REQUEST = json.dumps({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
RESPONSE = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "done"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
)


def small_journal(path, run: str = "r-abc", **labels: str):
    """A journal at ``path`` holding one claude-code run ``run`` of one step, no snapshot."""
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    path.parent.mkdir(parents=True, exist_ok=True)
    with Journal.open(path) as j:
        j.create_run(Run(id=run, agent="claude-code", labels={"task": "hi", **labels}))
        j.record_exchange(
            run,
            "POST",
            "/v1/messages",
            protocol="anthropic",
            status=200,
            request_body=REQUEST.encode(),
            response_body=RESPONSE.encode(),
        )
    return path


def export_lines(journal, run: str = "r-abc") -> list[dict]:
    import io

    from pvisor.journal.reader import JournalReader

    with JournalReader(journal) as r:
        out = io.BytesIO()
        r.export_jsonl(out, run)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def write_lines(path, lines: list[dict]):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_hand_made_export_is_checked_line_by_line(tmp_path):
    """Each line of an export is checked against the export's schema (docs/exports.md "jsonl",
    the columns of docs/journal.md) as it is loaded: a field of the wrong type, an id that is
    no run id, an exchange of another run are one BadInputError naming the file, the line, the
    field and what was expected (never a TypeError or ValueError); a run line over 1 MiB is an
    export still."""
    lines = export_lines(small_journal(tmp_path / "data" / "journal.sqlite"))
    assert [x["type"] for x in lines] == ["run", "exchange"]
    ok = TrajectoryReplay.from_event_log(write_lines(tmp_path / "ok.jsonl", lines))
    assert ok.steps_total == 1 and ok.source["kind"] == "export"
    sha = "0" * 64
    cases = [
        (2, {"request_body": 5},
         "exchange field 'request_body': expected a sha256 (64 lower-case hex digits), or null, not 5"),
        (2, {"request": {"ref": [1, 2]}}, "exchange field 'request': expected a body object"),
        (2, {"request": {"ref": sha}},
         f"exchange field 'request' refers to a body not written before ({sha[:12]})"),
        (2, {"chunk_timings": "abc"}, "field 'chunk_timings': expected a list of [µs, bytes] pairs"),
        (2, {"chunk_timings": [[1, "x"]]}, "field 'chunk_timings': expected a list of [µs, bytes] pairs"),
        (2, {"flags": 7}, "exchange field 'flags': expected a list of strings, not 7"),
        (2, {"status": "abc"}, "exchange field 'status': expected an integer, or null, not \"abc\""),
        (2, {"seq": "abc"}, "exchange field 'seq': expected an integer from 0, not \"abc\""),
        (2, {"seq": None}, "exchange field 'seq' is null: expected an integer from 0"),
        (2, {"id": 5}, "exchange field 'id': expected an id of letters, digits"),
        (2, {"id": "../../x"}, "exchange field 'id': expected an id of letters, digits"),
        (2, {"run": "r-other"}, "field 'run' is 'r-other': expected 'r-abc', the run of the run line"),
        (1, {"id": "../evil"}, "run field 'id': expected an id of letters, digits"),
        (1, {"mode": "abc"}, "run field 'mode': expected one of capture, import"),
        (1, {"boundary_step": True}, "field 'boundary_step': expected an integer from 0, or null, not true"),
        (1, {"labels": {"task": 5}}, "run field 'labels': expected an object of string values"),
    ]  # fmt: skip
    for n, change, said in cases:
        bad = [dict(x) for x in lines]
        bad[n - 1].update(change)
        path = write_lines(tmp_path / "bad.jsonl", bad)
        with pytest.raises(BadInputError) as exc:
            TrajectoryReplay.from_event_log(path)
        message = exc.value.message
        assert message.startswith(f"{path} line {n}: ") and said in message, (change, message)
        assert "\n" not in message and len(message) < 400
    # a long task (its label) makes a first line over 1 MiB: still the export it is
    long = [dict(x) for x in lines]
    long[0]["labels"] = {"task": "t" * (2 << 20)}
    replay = TrajectoryReplay.from_event_log(write_lines(tmp_path / "long.jsonl", long))
    assert replay.source["kind"] == "export" and replay.steps_total == 1


def test_an_exports_journal_must_hold_its_run_exactly(tmp_path):
    """from_event_log(export, journal=J): J must hold the export's run under its own id (a run
    whose id merely starts with it is another run); a J that holds it without a snapshot is
    said as such, without telling the caller to give journal= again."""
    export = write_lines(tmp_path / "e.jsonl", export_lines(small_journal(tmp_path / "a" / "journal.sqlite")))
    other = small_journal(tmp_path / "b" / "journal.sqlite", run="r-abc0")
    with pytest.raises(UsageError) as exc:
        TrajectoryReplay.from_event_log(export, journal=other)
    assert exc.value.message == (
        f"from_event_log: journal={str(other)!r} holds no run r-abc (the run of {export}): give the journal "
        "that recorded it"
    )
    same = TrajectoryReplay.from_event_log(export, journal=tmp_path / "a" / "journal.sqlite")
    [view] = same.materialize_pauses([PauseSpec(id="p", kind="step", step=0)])
    with pytest.raises(BadInputError) as exc:
        TrajectoryReplay.restore_handoff(view, tmp_path / "ws", "child-1")
    message = exc.value.message
    assert message.startswith(
        f"pause p: restore_handoff: no workspace to restore in journal {tmp_path / 'a' / 'journal.sqlite'}: "
        "run r-abc has no workspace snapshot"
    ), message
    assert "journal=" not in message and not (tmp_path / "ws").exists()


def test_a_run_directory_reads_its_own_journal_only(tmp_path):
    """from_event_log of ``<data dir>/runs/<run>`` looks only into regular files that are
    journals, leaves no -wal or -shm beside the ones that do not hold the run, never waits on a
    FIFO there, and follows a symlink to a run directory."""
    data = tmp_path / "data"
    small_journal(data / "z-mine.sqlite")
    small_journal(data / "a-other.sqlite", run="r-other")
    (data / "notes.txt").write_text("SQLite format 3 is not this\n")
    (data / "runs" / "r-abc").mkdir(parents=True)
    assert not (data / "a-other.sqlite-wal").exists() and not (data / "a-other.sqlite-shm").exists()

    def load(path):
        code = (
            "import sys\nfrom pvisor.harness import TrajectoryReplay\n"
            "r = TrajectoryReplay.from_event_log(sys.argv[1])\nprint(r.journal, r.run)\n"
        )
        proc = subprocess.run(
            [os.sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert load(data / "runs" / "r-abc") == [str(data / "z-mine.sqlite"), "r-abc"]
    assert not (data / "a-other.sqlite-wal").exists() and not (data / "a-other.sqlite-shm").exists()
    os.mkfifo(data / "a-fifo")
    (tmp_path / "link").symlink_to(data / "runs" / "r-abc")
    assert load(tmp_path / "link") == [str(data / "z-mine.sqlite"), "r-abc"]


def test_pause_specs_refuse_booleans_and_parameters_of_another_kind():
    """PauseSpec refuses at once what `pvisor view` refuses as options: a bool for a number
    (step=True is no transition 1), a parameter of another kind of pause; each one line naming
    the parameter as Python writes it."""
    for kwargs, said in (
        ({"kind": "step", "after_step": True},
         "pause p: after_step=True: a count of steps kept, an int (not bool)"),
        ({"kind": "step", "step": True}, "pause p: step=True: a transition number, an int (not bool)"),
        ({"kind": "step", "step": 1.0}, "pause p: step=1.0: a transition number, an int (not float)"),
        ({"kind": "progress", "progress": True},
         "pause p: progress=True: a fraction from 0 to 1, a float (not bool)"),
        ({"kind": "step", "step": 0, "before": "yes"}, "pause p: before='yes': True or False"),
        (
            {"kind": "step", "step": 0, "progress": 0.5},
            "pause p: progress=0.5 is for a pause of kind progress; one of kind step takes step= or "
            "after_step=",
        ),
        (
            {"kind": "before_commitment", "step": 1},
            "pause p: step=1 is for a pause of kind step; one of kind before_commitment takes neither: it "
            "finds its transition",
        ),
        (
            {"kind": "progress", "progress": 0.5, "after_step": 2},
            "pause p: after_step=2 is for a pause of kind step; one of kind progress takes progress=",
        ),
    ):  # fmt: skip
        with pytest.raises(UsageError) as exc:
            PauseSpec(id="p", **kwargs)
        assert exc.value.message == said
    with pytest.raises(UsageError, match=r"^id=5: a pause's name is a str"):
        PauseSpec(id=5, kind="step")
    assert PauseSpec("p", "progress", 0.5).progress == 0.5  # the documents' positional form


def test_a_journal_export_is_viewed_with_episode_main_and_says_its_subagents_are_not_read(tmp_path):
    export = write_lines(tmp_path / "e.jsonl", export_lines(small_journal(tmp_path / "a" / "journal.sqlite")))
    env = user_env(tmp_path / "home")
    main = pvisor(["view", str(export), "--episode", "main"], env=env, cwd=tmp_path)
    assert main.returncode == 0, main.stderr
    assert "is a journal export: its main loop is read, its subagents are not" in main.stderr
    sub = pvisor(["view", str(export), "--episode", "toolu_x"], env=env, cwd=tmp_path)
    assert sub.returncode == 2 and "subagents are not read (only its main loop, --episode main)" in sub.stderr
