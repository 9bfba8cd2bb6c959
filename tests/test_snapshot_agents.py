"""Workspace snapshots of real agent runs (pinned CLIs under .agents/, the scripted model):
every step of the six agents' session captures restores to what its tools had written; a run
of Codex whose three tool steps write, chmod, link and delete restores identically at each
step (contents, modes, symlinks) and through ``--before``; ``pvisor replay --workspace-from``
gives replay-only the recorded start state. Agents run one at a time, nothing is mocked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from agent_captures import _run
from agent_helpers import AGENTS, FILES, entrypoint, pvisor, user_env

from pvisor.replay.workspace import digest_workspace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
#: the files of the session capture's script after step N (tests/agent_helpers.py)
WRITTEN = {0: {}, 1: {"a.txt": FILES["a.txt"]}, 2: FILES}


def restore(journal: Path, home: Path, cwd: Path, run: str, pause: list[str], into: Path, *extra: str):
    """``pvisor snapshot restore RUN`` at ``pause`` (``["--step", "1"]``, ``["--after-step", "0"]``)."""
    proc = pvisor(
        [
            "--journal",
            str(journal),
            "snapshot",
            "restore",
            run,
            *pause,
            "--into",
            str(into),
            "--json",
            *extra,
        ],
        env=user_env(home),
        cwd=cwd,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def files_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("agent", list(AGENTS))
def test_each_step_of_a_real_capture_restores_what_its_tools_wrote(agent, captured, tmp_path):
    cap = captured(agent)
    assert cap.proc.returncode == 0, cap.proc.stderr
    assert cap.report["snapshots"] >= 3 and cap.report["snapshot_warnings"] == []
    # what the agent's own set-up put there (OpenCode's opencode.json) is part of the start state
    setup = {k: v for k, v in files_of(cap.workspace).items() if k not in FILES}
    for n, written in WRITTEN.items():
        into = tmp_path / f"at-{n}"
        done = restore(cap.journal, cap.user_home, tmp_path, cap.run, ["--after-step", str(n)], into)
        assert done["after_step"] == n and done["kind"] == ("start" if n == 0 else "request")
        assert files_of(into) == {**setup, **written}, (agent, n)
    # transition 0 is journal step 1: after it a.txt is written; before transition 1 too
    after_0 = restore(cap.journal, cap.user_home, tmp_path, cap.run, ["--step", "0"], tmp_path / "after-0")
    assert files_of(tmp_path / "after-0") == {**setup, **WRITTEN[1]} and after_0["after_step"] == 1
    assert after_0["transition"] == 0 and after_0["before"] is False
    before = restore(
        cap.journal, cap.user_home, tmp_path, cap.run, ["--step", "1"], tmp_path / "before-1", "--before"
    )
    assert files_of(tmp_path / "before-1") == {**setup, **WRITTEN[1]} and before["after_step"] == 1


# three tool steps of Codex that change contents, modes, symlinks and directories
STEPS = [
    "printf 'one\\n' > a.txt && chmod 640 a.txt",
    "mkdir -p d && chmod 750 d && printf 'two\\n' > d/b.sh && chmod 755 d/b.sh && ln -s a.txt link",
    "rm a.txt && printf 'three\\n' > c.txt && chmod 600 c.txt && ln -s ../c.txt d/up",
]


def expected_tree(root: Path, n: int) -> Path:
    """The workspace after step ``n`` of :data:`STEPS`, built here with the same modes."""
    root.mkdir()
    (root / "seed.txt").write_text("seed\n")
    os.chmod(root / "seed.txt", 0o644)
    if n >= 1:
        (root / "a.txt").write_text("one\n")
        os.chmod(root / "a.txt", 0o640)
    if n >= 2:
        (root / "d").mkdir()
        (root / "d" / "b.sh").write_text("two\n")
        os.chmod(root / "d" / "b.sh", 0o755)
        os.chmod(root / "d", 0o750)
        os.symlink("a.txt", root / "link")
    if n >= 3:
        (root / "a.txt").unlink()
        (root / "c.txt").write_text("three\n")
        os.chmod(root / "c.txt", 0o600)
        os.symlink("../c.txt", root / "d" / "up")
    return root


@pytest.fixture(scope="module")
def codex_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("snap-codex")
    ws, home, data = root / "workspace", root / "home", root / "data"
    for d in (ws, home, data):
        d.mkdir()
    (ws / "seed.txt").write_text("seed\n")
    os.chmod(ws / "seed.txt", 0o644)
    script = root / "script.json"
    turns = [
        {"text": f"Step {i + 1}.", "tool_calls": [{"tool": "@shell", "command": c}]}
        for i, c in enumerate(STEPS)
    ]
    script.write_text(json.dumps({"model": "mock-model", "seed": 3, "turns": [*turns, {"text": "Done."}]}))
    journal = data / "journal.sqlite"
    proc, report = _run("codex", root, journal, ws, home, script, "Change the files.")
    assert proc.returncode == 0 and report["steps"] == 4, proc.stderr
    return root, journal, ws, home, report


def test_a_real_run_restores_identically_at_every_step_with_modes_and_symlinks(codex_run, tmp_path):
    """After N journal steps three ways: --after-step N, --step N-1 (transition N-1) and --step N
    --before (before transition N)."""
    root, journal, ws, home, report = codex_run
    run = report["run"]
    for n in range(4):
        want = digest_workspace(expected_tree(tmp_path / f"want-{n}", n))
        restore(journal, home, tmp_path, run, ["--after-step", str(n)], tmp_path / f"at-{n}")
        assert digest_workspace(tmp_path / f"at-{n}") == want, n
        before = tmp_path / f"before-{n}"
        restore(journal, home, tmp_path, run, ["--step", str(n)], before, "--before")
        assert digest_workspace(before) == want, n
        if n:
            after = tmp_path / f"after-{n - 1}"
            restore(journal, home, tmp_path, run, ["--step", str(n - 1)], after)
            assert digest_workspace(after) == want, n
    # after the last transition: the workspace as the run left it (the end snapshot)
    last = tmp_path / "after-3"
    assert restore(journal, home, tmp_path, run, ["--step", "3"], last)["kind"] == "end"
    assert digest_workspace(last) == digest_workspace(ws)
    proc = pvisor(
        ["--journal", str(journal), "snapshot", "restore", run, "--step", "4", "--into", str(tmp_path / "x")],
        env=user_env(home),
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and not (tmp_path / "x").exists()
    assert proc.stderr == (
        f"pvisor: error: --step 4: run {run} has 4 transitions (0..3; journal steps 1..4); "
        "--after-step 4 is the last step's too\n"
    )


def test_snapshot_ls_lists_each_step_of_the_run(codex_run, tmp_path):
    root, journal, ws, home, report = codex_run
    proc = pvisor(
        ["--journal", str(journal), "snapshot", "ls", report["run"], "--json"],
        env=user_env(home),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["bound"] is True and doc["steps_total"] == 4
    kinds = [(s["kind"], s["after_step"]) for s in doc["snapshots"]]
    assert kinds == [("start", 0), ("request", 0), ("request", 1), ("request", 2), ("request", 3), ("end", 4)]
    assert all(
        s["error"] is None and s["hold_us"] is not None for s in doc["snapshots"] if s["kind"] == "request"
    )
    table = pvisor(
        ["--journal", str(journal), "snapshot", "ls", report["run"]], env=user_env(home), cwd=tmp_path
    )
    assert table.returncode == 0 and table.stdout.splitlines()[0].startswith(
        f"run {report['run']}: 6 snapshots, 4 transitions (0..3; journal steps 1..4)"
    )


def replay_args(
    journal: Path, run: str, n: int, ws: Path, workspace_from: str, out: Path, *extra: str
) -> list[str]:
    """``pvisor replay --replay-only`` of the Codex run to step ``n`` in ``ws``, from the start
    state of ``workspace_from``."""
    return [
        "replay",
        "--journal",
        str(journal),
        "--agent",
        "codex",
        "--run",
        run,
        "--after-step",
        str(n),
        "--replay-only",
        "--workspace",
        str(ws),
        "--workspace-from",
        workspace_from,
        "--output",
        str(out),
        "--agent-entrypoint",
        str(entrypoint("codex")),
        *extra,
    ]


def test_replay_only_starts_from_the_recorded_start_state(codex_run, tmp_path):
    root, journal, ws, home, report = codex_run
    new_ws, out = tmp_path / "ws2", tmp_path / "out"
    new_ws.mkdir()
    args = replay_args(journal, report["run"], 3, new_ws, report["run"], out, "--timeout", "240")
    proc = pvisor(args, env=user_env(home), cwd=tmp_path, timeout=400)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    restored = result["workspace"]["restored_from"]
    assert restored["run"] == report["run"] and restored["kind"] == "start" and restored["after_step"] == 0
    assert result["lineage"]["workspace_snapshot"] == restored["manifest"]
    # the start state went in before the agent did: without seed.txt, step 1's chmod would still work,
    # but the recorded start state is what the digest before playback shows
    assert (
        result["workspace"]["sha256_before"] == digest_workspace(expected_tree(tmp_path / "want-0", 0)).sha256
    )
    # the three steps re-ran on it: the workspace ends as the recorded run's did
    assert digest_workspace(new_ws) == digest_workspace(ws)
    assert all(c["equal_normalised"] for c in result["tool_calls"])


def test_workspace_from_refuses_a_workspace_that_is_not_empty(codex_run, tmp_path):
    root, journal, ws, home, report = codex_run
    new_ws = tmp_path / "ws-full"
    new_ws.mkdir()
    (new_ws / "mine.txt").write_text("keep me\n")
    args = replay_args(journal, report["run"], 1, new_ws, report["run"], tmp_path / "o")
    proc = pvisor(args, env=user_env(home), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "is not empty: --workspace-from restores the recorded start state into an empty directory"
        in proc.stderr
    )
    assert (new_ws / "mine.txt").read_text() == "keep me\n" and sorted(os.listdir(new_ws)) == ["mine.txt"]


def test_workspace_from_an_unknown_run_is_refused_before_anything_is_written(codex_run, tmp_path):
    root, journal, ws, home, report = codex_run
    new_ws, out = tmp_path / "ws-new", tmp_path / "o"
    new_ws.mkdir()
    args = replay_args(journal, report["run"], 1, new_ws, "r-nope", out)
    proc = pvisor(args, env=user_env(home), cwd=tmp_path)
    assert proc.returncode == 2 and "no run 'r-nope'" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and os.listdir(new_ws) == []


def test_what_a_snapshot_leaves_out_is_said_once_and_restores_without_it(tmp_path):
    """A workspace with a file over the size limit (sparse: nothing is written) and a FIFO: the
    run says so on stderr and in its report, and the restored workspace has neither."""
    ws, home, data = tmp_path / "ws", tmp_path / "home", tmp_path / "data"
    for d in (ws, home, data):
        d.mkdir()
    (ws / "keep.txt").write_text("keep\n")
    with open(ws / "huge.bin", "wb") as f:
        f.truncate(65 * 1024 * 1024)  # 65 MiB, over the 64 MiB limit per file
    os.mkfifo(ws / "pipe")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "Done."}]}))
    proc, report = _run("codex", tmp_path, data / "j.sqlite", ws, home, script, "Nothing to do.")
    assert proc.returncode == 0, proc.stderr
    warnings = report["snapshot_warnings"]
    assert warnings == [
        "huge.bin: 68157440 bytes, over the limit of 67108864 per file: left out",
        "pipe: neither a file, a directory nor a symlink (a socket, a FIFO, a device): left out",
    ]
    for w in warnings:
        assert proc.stderr.count(f"pvisor: warning: workspace snapshot: {w}") == 1
    done = restore(data / "j.sqlite", home, tmp_path, report["run"], ["--after-step", "0"], tmp_path / "at-0")
    assert sorted(os.listdir(tmp_path / "at-0")) == ["keep.txt"] and done["files"] == 1
