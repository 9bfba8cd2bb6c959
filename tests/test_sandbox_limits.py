"""Memory and CPU limits of a replay's agent (``--sandbox-memory``, ``--sandbox-cpus``;
docs/replay.md "Limits: memory and CPU"), with mini-swe-agent offline against the scripted
model: a recorded call that allocates 1 GiB is replayed in the default sandbox under a memory
limit (the kernel kills it, the agent goes on, the result's ``sandbox.limits`` says the limit
was hit) and without one (it succeeds); bad values are one line and exit 2; where no cgroup can
be written (pvisor itself in a bubblewrap sandbox, whose ``/sys`` is read-only) exit 69 and
nothing recorded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from agent_helpers import PVISOR, SUBMIT, agents_dir, entrypoint, pvisor, user_env
from conftest import cannot_run_here

from pvisor.session.limits import ResourceLimits, detect
from pvisor.session.sandbox import bwrap_problem

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
AGENT = "mini-swe-agent"
#: the recorded call: 1 GiB touched (bytearray zeroes it), then its exit status
ALLOCATE = 'python3 -c "b = bytearray(1024 * 1024 * 1024)"; echo status=$?'
#: the limit: above what mini-swe-agent itself needs (about 250 MB with its page cache), so that
#: the call, the largest process when the limit is reached, is the one the kernel kills
LIMIT = "640M"


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """A capture of mini-swe-agent whose step 1 is :data:`ALLOCATE` (no limit: status=0)."""
    if detect(ResourceLimits(memory=64 * 1024 * 1024)).version is None:
        cannot_run_here("no writable cgroup with a memory controller here")
    root = tmp_path_factory.mktemp("limits")
    home, ws = root / "home", root / "recorded"
    home.mkdir()
    ws.mkdir()
    script = root / "script.json"
    turns = [
        {"text": "Step 1.", "tool_calls": [{"tool": "@shell", "command": ALLOCATE}]},
        {"text": "Done.", "tool_calls": [{"tool": "@shell", "command": SUBMIT}]},
    ]
    script.write_text(json.dumps({"model": "mock-model", "seed": 5, "turns": turns}))
    journal = root / "data" / "journal.sqlite"
    proc = pvisor(
        ["--journal", str(journal), "run", "--agent", AGENT, "--agent-entrypoint", str(entrypoint(AGENT)),
         "--script", str(script), "--workspace", str(ws), "--timeout", "240", "--json", "--", "Check."],
        env=user_env(home), cwd=root, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sandbox"]["limits"] is None and report["sandbox"]["key"] == "dummy"
    return root, journal, report["run"]


def replay(capture, name: str, *extra: str):
    root, journal, run = capture
    ws, out = root / f"ws-{name}", root / f"out-{name}"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(journal), "replay", "--agent", AGENT, "--run", run, "--after-step", "1",
         "--replay-only", "--workspace", str(ws), "--output", str(out), "--agent-entrypoint",
         str(entrypoint(AGENT)), "--timeout", "240", *extra],
        env=user_env(root / "home"), cwd=root, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, out


def test_a_recorded_call_past_the_memory_limit_is_killed_and_the_result_says_so(capture):
    """Fails before the limits were wired: --sandbox-memory was no option (exit 2)."""
    if bwrap_problem() is not None:
        pytest.fail(f"the sandbox tests need bubblewrap: {bwrap_problem()}", pytrace=False)
    proc, out = replay(capture, "limited", "--sandbox-memory", LIMIT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    limits = result["sandbox"]["limits"]
    assert result["sandbox"]["mode"] == "bwrap"  # bwrap, the relay and the agent in the cgroup
    assert limits["memory_limit"] == 640 * 1024 * 1024 and limits["cpus"] is None
    assert limits["memory_limit_hit"] is True and limits["oom_kills"] >= 1
    assert limits["version"] in ("v1", "v2") and "pvisor-" in limits["cgroup"]
    assert not Path(limits["cgroup"]).exists()  # removed after the run
    # the call was killed (SIGKILL: 137), the agent went on to request 2
    assert result["agent_run"]["ended_by"] == "synthetic_end"
    prefix = (out / "prefix.json").read_text()
    assert "status=137" in prefix and "status=0" not in prefix

    proc, out = replay(capture, "free")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["sandbox"]["limits"] is None
    assert "status=0" in (out / "prefix.json").read_text()
    assert all(c["equal_normalised"] for c in result["tool_calls"])


def test_bad_limit_values_are_one_line_and_exit_2(capture, tmp_path):
    """Fails before: the options were unknown (click's own "No such option", also exit 2)."""
    for args, option, expected in [
        (("--sandbox-memory", "lots"), "--sandbox-memory 'lots'", "expected a size such as 512M"),
        (("--sandbox-memory", "1M"), "--sandbox-memory '1M'", "at least 4M"),
        (("--sandbox-cpus", "0"), "--sandbox-cpus '0'", "expected a number of CPUs of at least 0.01"),
    ]:
        proc, out = replay(capture, f"bad-{args[1]}", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and option in lines[0] and expected in lines[0], proc.stderr
        assert not out.exists()
    home = tmp_path / "home"
    home.mkdir()
    proc = pvisor(
        ["--journal", str(tmp_path / "data" / "j.sqlite"), "run", "--agent", AGENT, "--sandbox-cpus", "two",
         "--", "Check."],
        env=user_env(home), cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "pvisor: error: --sandbox-cpus 'two': expected a number of CPUs of at least 0.01, such as 0.5 or 2"
    ]
    assert not (tmp_path / "data").exists()


def boxed(tmp_path: Path, bound: Path, *args: str) -> subprocess.CompletedProcess:
    """pvisor ``args`` in a bubblewrap sandbox of the test's (a user namespace: /sys/fs/cgroup
    is not writable there), ``bound`` writable."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or bwrap_problem() is not None:
        pytest.fail(f"this test needs bubblewrap: {bwrap_problem()}", pytrace=False)
    # pvisor's venv, the agents and the checkout bound back where they lie under /tmp (a checkout
    # there, as a CI's may be)
    back = [str(p) for p in (Path(sys.prefix), agents_dir(), REPO) if Path("/tmp") in p.resolve().parents]
    return subprocess.run(
        [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
         *[a for p in back for a in ("--ro-bind", p, p)],
         "--bind", str(bound), str(bound), "--unshare-user", "--unshare-pid", "--die-with-parent",
         str(PVISOR), *args],
        env=user_env(tmp_path / "home"), cwd=bound, timeout=120, capture_output=True, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_without_a_writable_cgroup_a_limit_is_exit_69_and_nothing_is_recorded(capture, tmp_path):
    """pvisor run, and a replay, where no cgroup can be written: one line naming the option,
    exit 69, no journal made (the replay: result.json ``limits_unavailable``, no derived run).
    Fails before: the option was unknown (exit 2)."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "Done."}]}))
    journal = tmp_path / "data" / "journal.sqlite"
    proc = boxed(
        tmp_path, tmp_path, "--journal", str(journal), "run", "--agent", AGENT, "--agent-entrypoint",
        str(entrypoint(AGENT)), "--script", str(script), "--workspace", str(ws), "--sandbox-memory", "1G",
        "--", "Check.",
    )  # fmt: skip
    assert proc.returncode == 69, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--sandbox-memory needs a writable cgroup" in lines[0], proc.stderr
    assert not journal.exists()

    root, recorded_journal, run = capture
    ws, out = root / "ws-no-cgroup", root / "out-no-cgroup"
    ws.mkdir()
    proc = boxed(
        tmp_path, root, "--journal", str(recorded_journal), "replay", "--agent", AGENT, "--run", run,
        "--after-step", "1", "--replay-only", "--workspace", str(ws), "--output", str(out),
        "--agent-entrypoint", str(entrypoint(AGENT)), "--sandbox", "none", "--sandbox-cpus", "1",
    )  # fmt: skip
    assert proc.returncode == 69, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--sandbox-cpus needs a writable cgroup" in lines[0], proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert [e["code"] for e in result["errors"]] == ["limits_unavailable"]
    assert result["derived_run"] is None and not result["agent_started"]
