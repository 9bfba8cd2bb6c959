"""prepare-only executes nothing, starts nothing, opens no socket and leaves the workspace
identical (docs/replay.md); and its start-up imports neither asyncio, aiohttp, sqlite_utils
nor jsonschema for a native source.

The no-side-effect tests run prepare-only in this process (the library function, and the click
command with ``standalone_mode=False``) under a ``sys.addaudithook`` hook that raises on socket
creation or connect, ``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.posix_spawn``,
``os.spawn*`` and ``os.fork``, and records every such event even if the code caught the error.
An audit hook cannot be removed, so it acts only while :data:`_GUARD` is armed.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import corpus_dir
from corpus_runs import record_corpus_runs
from fuzz_worker import PROCESS_EVENTS
from native_helpers import native_dir
from pvisor.replay.prepare import PrepareOptions, prepare_only

FORBIDDEN = ("socket.__new__", "socket.connect", "socket.connect_ex", "socket.bind", *PROCESS_EVENTS)

_GUARD = {"armed": False, "seen": []}


def _hook(event: str, args) -> None:
    if _GUARD["armed"] and (
        event in FORBIDDEN or event.startswith("os.exec") or event.startswith("os.spawn")
    ):
        _GUARD["seen"].append(event)
        raise RuntimeError(f"prepare-only caused audit event {event}")


sys.addaudithook(_hook)


@contextmanager
def no_side_effects():
    _GUARD["seen"] = []
    _GUARD["armed"] = True
    try:
        yield _GUARD["seen"]
    finally:
        _GUARD["armed"] = False


def test_the_guard_catches_what_it_must():
    import socket

    with no_side_effects() as seen:
        with pytest.raises(RuntimeError):
            socket.socket()
        with pytest.raises(RuntimeError):
            subprocess.Popen(["true"])
        with pytest.raises(RuntimeError):
            os.system("true")
        with pytest.raises(RuntimeError):
            os.posix_spawn("/bin/true", ["true"], {})
    assert seen == ["socket.__new__", "subprocess.Popen", "os.system", "os.posix_spawn"]


def tree(root: Path) -> dict[str, tuple]:
    """Every entry below ``root``: relative path -> (mode, mtime_ns, content or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                body = p.read_bytes()
            else:
                body = None
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, body)
    return out


def make_workspace(root: Path) -> Path:
    ws = root / "workspace"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "README.md").write_text("pre-existing file\n")
    (ws / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    run = ws / "run.sh"
    run.write_text("#!/bin/sh\necho run\n")
    run.chmod(0o755)
    (ws / "link").symlink_to("src/pkg/mod.py")
    (ws / "dangling").symlink_to("nowhere")
    os.mkfifo(ws / "fifo")  # never opened: a FIFO would block a reader
    return ws


@pytest.mark.parametrize(
    "agent,path",
    [
        ("claude-code", "claude-code/spotter_tool_heavy.jsonl"),
        ("codex", "codex/real-0.171.0_single-then-resume.jsonl"),
        ("gemini-cli", "gemini-cli/real-0.61.0_single-then-resume.jsonl"),
        ("qwen-code", "qwen-code/real-0.24.4_single.jsonl"),
        ("opencode", "opencode/real-1.18.33_export_single.json"),
        ("mini-swe-agent", "mini-swe-agent/real-2.4.6_parallel.traj.json"),
        ("openhands", "openhands/tests_runtime_trajs_basic_gui_mode.json"),
        ("swe-agent", "swe-agent/demo_function_calling_simple.traj"),
    ],
)
def test_native_prepare_only_has_no_side_effects(tmp_path, agent, path):
    ws = make_workspace(tmp_path)
    source = native_dir() / path
    src_before = source.read_bytes()
    before = tree(ws)
    with no_side_effects() as seen:
        outcome = prepare_only(
            PrepareOptions(
                agent=agent, after_step=1, output=tmp_path / "out", trajectory=source, workspace=ws
            )
        )
    assert seen == []
    assert tree(ws) == before
    assert source.read_bytes() == src_before
    w = outcome.result["workspace"]
    assert w["unchanged"] is True and w["sha256_before"] == w["sha256_after"] and w["entries"] == len(before)
    assert outcome.result["agent_started"] is False and outcome.result["replayed_tool_calls"] == 0


def test_journal_prepare_only_through_the_click_command_has_no_side_effects(tmp_path):
    from pvisor.cli import cli

    journal = tmp_path / "j.sqlite"
    record_corpus_runs(corpus_dir(), journal, ["codex-single"])
    journal_before = journal.read_bytes()
    ws = make_workspace(tmp_path)
    before = tree(ws)
    with no_side_effects() as seen:
        cli.main(
            args=[
                "--journal",
                str(journal),
                "replay",
                "--agent",
                "codex",
                "--run",
                "codex-single",
                "--after-step",
                "2",
                "--prepare-only",
                "--output",
                str(tmp_path / "out"),
                "--workspace",
                str(ws),
            ],
            prog_name="pvisor",
            standalone_mode=False,
        )
        # N = S renders: still nothing started
        cli.main(
            args=[
                "--journal",
                str(journal),
                "replay",
                "--agent",
                "codex",
                "--run",
                "codex-single",
                "--after-step",
                "4",
                "--prepare-only",
                "--output",
                str(tmp_path / "out2"),
                "--workspace",
                str(ws),
            ],
            prog_name="pvisor",
            standalone_mode=False,
        )
    assert seen == []
    assert tree(ws) == before
    assert journal.read_bytes() == journal_before


# (a workspace written by someone else while preparing: tests/test_replay_robustness.py
# test_workspace_changed_is_failed_without_prefix_files, on a real /proc directory that changes)


HEAVY = ("asyncio", "aiohttp", "sqlite_utils", "jsonschema")


def imported_modules(stderr: str, *, full: bool = False) -> set[str]:
    """Module names from ``python -X importtime`` output: top-level package names, or with
    ``full`` the dotted names."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            names.add(name if full else name.split(".")[0])
    return names


@pytest.mark.parametrize(
    "agent,path",
    [
        ("codex", "codex/real-0.171.0_single-then-resume.jsonl"),
        ("opencode", "opencode/real-1.18.33_export_single.json"),
        ("claude-code", "claude-code/spotter_tool_heavy.jsonl"),
    ],
)
def test_native_startup_imports_nothing_heavy(tmp_path, agent, path):
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "pvisor",
            "replay",
            "--agent",
            agent,
            "--trajectory",
            str(native_dir() / path),
            "--after-step",
            "1",
            "--prepare-only",
            "--output",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = imported_modules(proc.stderr)
    assert "pvisor" in mods and "orjson" in mods  # the output is what we think it is
    assert not (set(HEAVY) & mods), sorted(set(HEAVY) & mods)
    # without --profile-from a native source needs neither the journal reader nor the chain rule
    assert not (
        {"pvisor.journal.reader", "pvisor.adapters.chains"} & imported_modules(proc.stderr, full=True)
    )


def test_native_startup_with_profile_from_imports_nothing_heavy(tmp_path):
    journal = tmp_path / "j.sqlite"
    record_corpus_runs(corpus_dir(), journal, ["mini-anthropic"])
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "pvisor",
            "replay",
            "--agent",
            "mini-swe-agent",
            "--trajectory",
            str(native_dir() / "mini-swe-agent" / "real-2.4.6_anthropic.traj.json"),
            "--profile-from",
            f"{journal}:mini-anthropic",
            "--after-step",
            "1",
            "--prepare-only",
            "--output",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (set(HEAVY) & imported_modules(proc.stderr))
