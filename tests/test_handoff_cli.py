"""``pvisor handoff`` and ``pvisor.session.handoff`` (docs/handoff.md): bad input, the Python API
and a handoff started from a ``HandoffBranch``.

Bad input is refused before any agent starts (in this process, tests/cli_helpers.py): one line
naming the option and what was expected, its documented exit code, a failed result.json when the
output was accepted and the source is what is wrong, no traceback, and the journal as it was. The
runs: one real Claude Code capture (a batch of two shell calls, then one more) handed to the real
mini-swe-agent, offline, --replay-only. Nothing is mocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import capture_scripted, entrypoint, pvisor
from cli_helpers import pvisor_main

from pvisor.core.errors import PvisorError, UsageError
from pvisor.journal.reader import JournalReader
from pvisor.replay.views import PauseKind, PauseSpec

#: a key-shaped string given as a run id: never echoed
KEY = "sk-ant-api03-" + "Q" * 48

#: a continuation's options, each with a value, and what --replay-only says of them (as pvisor replay)
LIVE_OPTIONS = (
    ("--max-steps", "3"),
    ("--boundary-user-prompt", "hi"),
    ("--live-model", "x"),
    ("--upstream", "http://127.0.0.1:9"),
)
LIVE_ONLY = "is for a continuation (no mode flag); --replay-only sends nothing to a live model"

SCRIPT = {
    "turns": [
        {
            "text": "Two files.",
            "tool_calls": [
                {"tool": "@shell", "command": "echo 1 > one.txt"},
                {"tool": "@shell", "command": "echo 2 > two.txt"},
            ],
        },
        {"text": "A third.", "tool_calls": [{"tool": "@shell", "command": "echo 3 > three.txt"}]},
        {"text": "Done."},
    ]
}


class Source:
    """The capture (journal, run, its native file) and the user's environment for the CLI."""

    def __init__(self, root: Path):
        self.root = root
        cap = capture_scripted("claude-code", root, SCRIPT, "Write three files")
        self.journal, self.run, self.env = cap.journal, cap.run, cap.env
        self.claude = cap.exe
        self.mini = str(entrypoint("mini-swe-agent"))
        [native] = (root / "runs" / self.run / "home" / ".claude" / "projects").glob("*/*.jsonl")
        self.native = native

    def state(self) -> list[tuple]:
        """The journal's runs with their exchange and attempt counts: what nothing may lose."""
        with JournalReader(self.journal) as r:
            return [(run.id, run.mode, len(r.attempts(run.id)), len(r.exchanges(run.id))) for run in r.runs()]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Source:
    return Source(tmp_path_factory.mktemp("handoff-src"))


def _box(tmp_path: Path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws, tmp_path / "out"


def _cli(source: Source, tmp_path: Path, *args: str):
    proc = pvisor_main(
        ["--journal", str(source.journal), "handoff", *args], env=source.env, cwd=tmp_path, text=True
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _one_line(proc, code: int, said: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("pvisor: error: "), proc.stderr
    assert said in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--after-step", "99"],
            "--after-step 99: run {run} has 3 journal steps (N from 0, the task alone, to 3)",
        ),
        (["--step", "99"], "--step 99: run {run} has 3 transitions (0..2; journal steps 1..3)"),
        (["--progress", "2"], "--progress 2: a fraction from 0 to 1"),
        ([], "give the pause: one of --step K [--before], --after-step N, --progress F, --before-commitment"),
        (["--step", "0", "--after-step", "1"], "give one pause: --step and --after-step both choose it"),
        (["--after-step", "1", "--before"], "--before is for --step K"),
        (
            ["--after-step", "1", "--to-agent", "nope"],
            "--to-agent 'nope': the next agent is one pvisor starts",
        ),
        # a continuation's options with --replay-only: refused as pvisor replay refuses them
        *((["--after-step", "1", flag, value], f"{flag} {LIVE_ONLY}") for flag, value in LIVE_OPTIONS),
    ],
)
def test_a_pause_or_target_that_is_wrong_is_one_usage_line_and_writes_nothing(source, tmp_path, args, said):
    """Refused before the output is touched, whatever the source: exit 2, one line."""
    ws, out = _box(tmp_path)
    before = source.state()
    to = [] if "--to-agent" in args else ["--to-agent", "mini-swe-agent"]
    proc = _cli(source, tmp_path, "--run", source.run, *args, *to, "--workspace", str(ws), "--output",
                str(out), "--replay-only", "--agent-entrypoint", source.mini)  # fmt: skip
    _one_line(proc, 2, said.format(run=source.run))
    assert not out.exists() and source.state() == before


def test_the_source_must_be_one_and_a_native_file_needs_its_agent(source, tmp_path):
    ws, out = _box(tmp_path)
    common = [
        "--after-step",
        "1",
        "--to-agent",
        "mini-swe-agent",
        "--workspace",
        str(ws),
        "--output",
        str(out),
    ]
    given = "give the source: --run ID (a journal run) or --trajectory FILE --agent NAME"
    _one_line(_cli(source, tmp_path, *common), 2, given)
    _one_line(
        _cli(source, tmp_path, "--run", source.run, "--trajectory", str(source.native), *common), 2, given
    )
    _one_line(
        _cli(source, tmp_path, "--trajectory", str(source.native), *common),
        2,
        "--trajectory needs --agent NAME (which agent wrote it?)",
    )
    assert not out.exists()


def test_a_key_shaped_run_id_is_never_echoed(source, tmp_path):
    ws, out = _box(tmp_path)
    proc = _cli(source, tmp_path, "--run", KEY, "--after-step", "1", "--to-agent", "mini-swe-agent",
                "--workspace", str(ws), "--output", str(out))  # fmt: skip
    _one_line(proc, 2, "--run holds a key-shaped token (not shown)")
    assert KEY[:20] not in proc.stderr + proc.stdout and not out.exists()
    with pytest.raises(PvisorError) as exc:
        from pvisor.session import handoff

        handoff(KEY, 1, to_agent="mini-swe-agent", workspace=ws, output=out, journal=source.journal)
    assert KEY[:20] not in exc.value.message and "\n" not in exc.value.message, exc.value.message
    assert (
        exc.value.message == "source holds a key-shaped token (not shown): a key is never a run id or a file"
    )
    with pytest.raises(UsageError) as exc:
        handoff(Path(KEY), 1, agent="claude-code", to_agent="mini-swe-agent", workspace=ws, output=out)
    assert KEY[:20] not in exc.value.message
    for name in ("to_agent", "agent"):
        with pytest.raises(UsageError) as exc:
            handoff(source.run, 1, **{"to_agent": "mini-swe-agent", name: KEY}, workspace=ws, output=out)
        assert exc.value.message.startswith(f"{name} holds a key-shaped token (not shown)"), exc.value.message


@pytest.mark.parametrize(
    "where, named",
    [
        ("--to-agent", "--to-agent holds a key-shaped token (not shown): a key is never an agent name"),
        ("--agent", "--agent holds a key-shaped token (not shown): a key is never an agent name"),
        ("--trajectory", "--trajectory holds a key-shaped token (not shown): a key is never a file"),
        ("--output", "--output holds a key-shaped token (not shown): a key is never a directory"),
    ],
)
def test_a_key_given_for_an_agent_a_file_or_a_directory_is_never_echoed(source, tmp_path, where, named):
    """Before, --to-agent and --agent (also into result.json) and --trajectory were named with
    the key in full."""
    ws, out = _box(tmp_path)
    given = {"--to-agent": "mini-swe-agent", "--output": str(out), where: KEY}
    src = (
        ["--trajectory", KEY, "--agent", "claude-code"] if where == "--trajectory" else ["--run", source.run]
    )
    if where == "--agent":
        src += ["--agent", KEY]
    proc = _cli(source, tmp_path, *src, "--after-step", "1", "--to-agent", given["--to-agent"], "--workspace",
                str(ws), "--output", given["--output"], "--agent-entrypoint", source.mini)  # fmt: skip
    _one_line(proc, 2, named)
    assert KEY[:20] not in proc.stderr + proc.stdout and not out.exists()
    assert not (tmp_path / KEY).exists()


def test_a_missing_journal_is_named_and_not_created(source, tmp_path):
    ws, out = _box(tmp_path)
    gone = tmp_path / "none.sqlite"
    proc = pvisor_main(["--journal", str(gone), "handoff", "--run", source.run, "--after-step", "1",
                        "--to-agent", "mini-swe-agent", "--workspace", str(ws), "--output", str(out)],
                       env=source.env, cwd=tmp_path, text=True)  # fmt: skip
    _one_line(proc, 2, f"journal {gone}: no such file")
    assert not gone.exists() and not out.exists()


def test_the_output_is_refused_inside_the_workspace_and_when_not_empty(source, tmp_path):
    ws, out = _box(tmp_path)
    common = ["--run", source.run, "--after-step", "1", "--to-agent", "mini-swe-agent", "--workspace",
              str(ws), "--agent-entrypoint", source.mini, "--replay-only"]  # fmt: skip
    _one_line(_cli(source, tmp_path, *common, "--output", str(ws / "out")), 2, "is inside --workspace")
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    _one_line(_cli(source, tmp_path, *common, "--output", str(out)), 2, "is not empty; give --force")
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and not any(ws.iterdir())


def _failed(out: Path, code: str) -> dict:
    result = json.loads((out / "result.json").read_text())
    assert (result["status"], result["mode"]) == ("failed", "handoff")
    assert [e["code"] for e in result["errors"]] == [code], result["errors"]
    return result


def test_a_target_not_installed_is_exit_69_with_a_failed_result(source, tmp_path):
    ws, out = _box(tmp_path)
    before = source.state()
    bad = tmp_path / "no-such-mini"
    proc = _cli(source, tmp_path, "--run", source.run, "--after-step", "1", "--to-agent", "mini-swe-agent",
                "--workspace", str(ws), "--output", str(out), "--replay-only", "--agent-entrypoint",
                str(bad))  # fmt: skip
    _one_line(proc, 69, f"--agent-entrypoint {bad} does not exist (expected the mini-swe-agent executable")
    _failed(out, "agent_unavailable")
    assert source.state() == before and not any(ws.iterdir())


def test_a_source_agent_that_is_not_the_runs_is_refused_with_a_failed_result(source, tmp_path):
    ws, out = _box(tmp_path)
    proc = _cli(source, tmp_path, "--run", source.run, "--agent", "codex", "--after-step", "1", "--to-agent",
                "mini-swe-agent", "--workspace", str(ws), "--output", str(out), "--replay-only",
                "--agent-entrypoint", source.mini)  # fmt: skip
    _one_line(proc, 2, f"run {source.run} was recorded with agent claude-code, not --agent codex")
    _failed(out, "agent_mismatch")


def test_a_native_file_of_another_agent_is_the_replays_source_error_with_a_failed_result(source, tmp_path):
    """Before, the pause was resolved on the file first: exit 65 without a result, and without
    the read's hint of the agent it reads as."""
    ws, out = _box(tmp_path)
    for pause in (["--after-step", "1"], ["--progress", "0.5"]):
        proc = _cli(source, tmp_path, "--trajectory", str(source.native), "--agent", "codex", *pause,
                    "--to-agent", "mini-swe-agent", "--workspace", str(ws), "--output", str(out), "--force",
                    "--replay-only", "--agent-entrypoint", source.mini)  # fmt: skip
        _one_line(proc, 65, "it reads as a claude-code file: give --agent claude-code")
        _failed(out, "bad_source")
    assert not any(ws.iterdir())


def test_a_damaged_native_file_is_refused_with_a_failed_result(source, tmp_path):
    ws, out = _box(tmp_path)
    lines = source.native.read_text().splitlines()
    lines[len(lines) // 2] = lines[len(lines) // 2][:40]  # a record cut short in the middle
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    proc = _cli(source, tmp_path, "--trajectory", str(damaged), "--agent", "claude-code", "--after-step", "2",
                "--to-agent", "mini-swe-agent", "--workspace", str(ws), "--output", str(out), "--replay-only",
                "--agent-entrypoint", source.mini)  # fmt: skip
    _one_line(proc, 65, f"damaged.jsonl line {len(lines) // 2 + 1}: malformed_line")
    _failed(out, "damaged_source")
    assert not any(ws.iterdir())


def test_the_python_api_refuses_bad_arguments_in_one_line(source, tmp_path):
    from pvisor.session import handoff

    ws, out = _box(tmp_path)
    kw = {"to_agent": "mini-swe-agent", "workspace": ws, "output": out, "journal": source.journal}
    for args, extra, said in (
        ((source.run, 99), {}, f"after_step=99: run {source.run} has 3 journal steps"),
        ((source.run, PauseSpec("p", PauseKind.PROGRESS, progress=2.0)), {}, "progress=2"),
        ((source.run, "2"), {}, "pause='2': give a PauseSpec"),
        ((source.run, None), {}, "pause= is needed"),
        ((source.run, 1), {"to_agent": "nope"}, "--to-agent 'nope'"),
        ((42, 1), {}, "source 42: give a journal run id (str)"),
        ((source.native, 1), {}, "agent= is needed with a native trajectory"),
    ):
        with pytest.raises(UsageError) as exc:
            handoff(*args, **{**kw, **extra})
        assert said in exc.value.message and "\n" not in exc.value.message, exc.value.message
        assert exc.value.exit_code == 2
    assert not out.exists()


def _api_script(source: Source, root: Path, child: str) -> dict:
    """In a process of its own (the agent's stop signals are handled in its main thread): a
    handoff of the run after step 2 to mini-swe-agent with ``handoff(run, 2, ...)``, then
    ``restore_handoff`` of the same pause as ``child`` and ``handoff(branch, ...)``; returns
    what each gave."""
    code = f"""
import json, sys
from pathlib import Path
from pvisor.core.errors import UsageError
from pvisor.replay.views import PauseKind, PauseSpec, TrajectoryReplay
from pvisor.session import handoff

root, journal, run = Path({str(root)!r}), Path({str(source.journal)!r}), {source.run!r}
kw = dict(to_agent="mini-swe-agent", replay_only=True, entrypoint={source.mini!r}, timeout=240)
for d in ("ws-run", "ws-b"):
    (root / d).mkdir()
r = handoff(run, 2, workspace=root / "ws-run", output=root / "out-run", journal=journal, **kw)
said = {{}}
pause = PauseSpec("p", PauseKind.STEP, step=1)
[view] = TrajectoryReplay.from_journal(journal, run).materialize_pauses([pause])
branch = TrajectoryReplay.restore_handoff(view, root / "ws-branch", {child!r})
for name, extra in (
    ("same", dict(workspace=root / "ws-branch")),
    ("inside", dict(workspace=root / "ws-branch" / "sub")),
    ("pause", dict(workspace=root / "ws-b", pause=1)),
    ("journal", dict(workspace=root / "ws-b", journal=root / "other.sqlite")),
):
    try:
        handoff(branch, **extra, **kw)
    except UsageError as exc:
        said[name] = exc.message
# a start that fails before the agent runs gives the child run back: it starts later
gone = dict(kw, entrypoint=str(root / "nope"))
bad = handoff(branch, workspace=root / "ws-b", output=root / "out-bad", **gone)
b = handoff(branch, workspace=root / "ws-b", output=root / "out-b", **kw)
try:
    handoff(branch, workspace=root / "ws-b", output=root / "out-again", **kw)
except UsageError as exc:
    said["again"] = exc.message
print(json.dumps(dict(
    run=[r.status, r.derived_run, r.error, r.document["mode"]],
    bad=[bad.status, bad.exit_code, bad.derived_run],
    branch=[b.status, b.derived_run, b.error, b.document["handoff"]["lineage"]],
    said=said,
    files=sorted(p.name for p in (root / "ws-b").iterdir()),
)))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=source.env, cwd=root, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_api_hands_over_a_run_and_a_handoff_branch_files_it_under_its_child_run(source, tmp_path):
    """``handoff(run, 2, ...)`` returns a Result (status ok, its derived run, mode handoff);
    ``handoff(branch, ...)`` re-enacts the history in a new workspace and files B's run under the
    branch's pending child run, with the lineage of both; the branch's own directory (the pause's
    state), a pause or a journal that is not the branch's are refused in one line.
    `journal ls` shows the child under its parent. Before, ``from pvisor.session import handoff``
    gave no function and a branch was no source."""
    child = "child-handoff-1"
    got = _api_script(source, tmp_path, child)
    status, derived, error, mode = got["run"]
    assert (status, error, mode) == ("ok", None, "handoff") and derived.startswith("r-")
    status, derived, error, lineage = got["branch"]
    assert (status, derived, error) == ("ok", child, None), got
    assert lineage["parent_run"] == source.run and lineage["pause_after_step"] == 2
    assert (lineage["from_agent"], lineage["to_agent"]) == ("claude-code", "mini-swe-agent")
    assert got["files"] == ["one.txt", "three.txt", "two.txt"]  # re-run from the start state
    assert got["bad"] == ["failed", 69, None]
    said = got["said"]
    assert said["again"].startswith(
        f"child_run='{child}': the handoff's child run {child} was started already"
    )
    assert "is, holds or lies in the HandoffBranch's restored directory" in said["same"]
    assert "is, holds or lies in the HandoffBranch's restored directory" in said["inside"]
    assert "pause=1 keeps 1 step(s); the HandoffBranch's child run" in said["pause"]
    assert "journal=" in said["journal"] and "leave journal= out" in said["journal"]
    with JournalReader(source.journal) as r:
        run = r.run(child)
        assert (run.mode, run.parent_run, run.boundary_step, run.pause_transition) == (
            "handoff",
            source.run,
            2,
            1,
        )
        assert run.labels["handoff_from_agent"] == "claude-code"
        assert run.labels["handoff_to_agent"] == "mini-swe-agent" and run.agent == "mini-swe-agent"
        assert run.labels["started_as"] == "handoff" and len(r.attempts(child)) == 1
        other = r.run(got["run"][1])
        assert (other.mode, other.parent_run, other.boundary_step) == ("handoff", source.run, 2)
        assert other.labels["handoff_from_agent"] == "claude-code"
    ls = pvisor(["--journal", str(source.journal), "journal", "ls", "--json"], env=source.env, cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    listed = {x["id"]: x for x in json.loads(ls.stdout)}
    assert listed[child]["parent_run"] == source.run and listed[child]["mode"] == "handoff"


@pytest.mark.slow
def test_the_command_hands_over_and_journal_ls_shows_the_lineage(source, tmp_path):
    ws, out = _box(tmp_path)
    proc = pvisor(["--journal", str(source.journal), "handoff", "--run", source.run, "--step", "0",
                   "--to-agent", "mini-swe-agent", "--workspace", str(ws), "--output", str(out),
                   "--replay-only", "--agent-entrypoint", source.mini, "--timeout", "240"],
                  env=source.env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["mode"] == "handoff"
    h = result["handoff"]
    assert (h["from_agent"], h["to_agent"], h["pause"]) == (
        "claude-code",
        "mini-swe-agent",
        {"after_step": 1, "transition": 0},
    )
    assert [c["fate"] for c in h["calls"]] == ["translated", "translated"]
    derived = result["derived_run"]
    assert f"handed over to mini-swe-agent after step 1 of 3 as run {derived}" in proc.stdout
    assert sorted(p.name for p in ws.iterdir()) == ["one.txt", "two.txt"]
    ls = pvisor(["--journal", str(source.journal), "journal", "ls"], env=source.env, cwd=tmp_path)
    [line] = [x for x in ls.stdout.splitlines() if x.startswith(derived + " ")]
    assert "handoff" in line.split() and f"{source.run}@1" in line.split(), ls.stdout
    show = pvisor(
        ["--journal", str(source.journal), "journal", "show", derived], env=source.env, cwd=tmp_path
    )
    assert "handoff_from_agent" in show.stdout and "handoff_to_agent" in show.stdout, show.stdout
    assert os.path.exists(out / "prefix.json")


@pytest.mark.slow
def test_a_branch_whose_handoff_re_runs_fewer_steps_compares_its_own_boundary(source, tmp_path):
    """The pause after step 3 (the last: "Done.", no call): B re-runs M = 2 steps for N = 3.
    The child run's workspace is compared at B's boundary (request M+1), where it equals the
    pause's snapshot; before, session/replay.py's _check_child_boundary looked at B's step N,
    which B never had, and warned handoff_workspace_differs ("unreadable")."""
    code = f"""
import json
from pathlib import Path
from pvisor.replay.views import PauseKind, PauseSpec, TrajectoryReplay
from pvisor.session import handoff

root, journal = Path({str(tmp_path)!r}), Path({str(source.journal)!r})
[view] = TrajectoryReplay.from_journal(journal, {source.run!r}).materialize_pauses(
    [PauseSpec("last", PauseKind.STEP, step=2)]
)
branch = TrajectoryReplay.restore_handoff(view, root / "ws-branch", "child-last")
(root / "ws").mkdir()
r = handoff(branch, to_agent="mini-swe-agent", workspace=root / "ws", output=root / "out", replay_only=True,
            entrypoint={source.mini!r}, timeout=240)
h, warned = r.document["handoff"], [w["code"] for w in r.document["warnings"]]
print(json.dumps([r.status, h["target_steps"], h["workspace"]["equal"], warned]))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=source.env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    status, steps, equal, warned = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (status, steps, equal) == ("ok", 2, True)
    assert "handoff_workspace_differs" not in warned, warned
