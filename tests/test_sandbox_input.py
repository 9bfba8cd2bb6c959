"""What a new user met with the sandbox (docs/replay.md "The sandbox"), with Codex offline against
the scripted model: a replay says where the agent ran and how many calls the sandbox stopped
(every reason of a call, curl's words included), and why ``--sandbox auto`` ran none; ``pvisor
run`` lists the calls its sandbox stopped too. Bad input: a ``--sandbox-allow`` that would undo
what the sandbox hides, a ``PVISOR_BWRAP`` that is a directory, a sandbox that cannot run or
start (its own error code), sandbox options without a sandbox (one warning), and the
``observation_not_recorded`` line naming ``--allow-unrecorded``."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import jsonschema
import pytest

from agent_helpers import pvisor, user_env
from conftest import corpus_dir
from corpus_runs import record_cut_codex_run
from pvisor.session.sandbox import bwrap_problem
from test_sandbox import SCHEMA, Lab, _fake_bwrap, _one_line, _run_codex

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def bwrap_here():
    """bubblewrap must work on this machine (scripts/test installs it)."""
    problem = bwrap_problem()
    if problem is not None:
        pytest.fail(f"the sandbox tests need bubblewrap: {problem}", pytrace=False)


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A Codex capture in the sandbox of two steps the sandbox stops: a write into a system
    directory and a read of the user's key in one call, curl to a port of this machine in the
    other. Yields (lab, the run's --json report, the canary the write makes without a sandbox)."""
    lab = Lab(tmp_path_factory.mktemp("input"), "codex")
    canary = Path("/var/tmp") / f"pvisor-canary-{uuid.uuid4().hex}"
    commands = [
        f"echo x > {canary}; cat {lab.home}/.ssh/id_rsa; echo done",
        f"curl -sS -m 5 http://127.0.0.1:{_closed_port()}/; echo done",
    ]
    report = lab.capture(commands, "--sandbox", "bwrap")
    assert not canary.exists()
    yield lab, report, canary
    canary.unlink(missing_ok=True)


def _reasons(failed: list[dict]) -> dict[int, list[str]]:
    return {c["step"]: [r["reason"] for r in c["reasons"]] for c in failed}


def test_a_replay_says_where_it_ran_and_what_the_sandbox_stopped(lab):
    lab, report, canary = lab
    # pvisor run lists the calls its sandbox stopped, as a replay does (it reported none)
    run_failed = report["sandbox"]["failed_calls"]
    assert _reasons(run_failed) == {1: ["read_only", "hidden"], 2: ["network"]}, run_failed
    assert report["sandbox"]["fallback"] is None
    # the default sandbox, a path inside the hidden home allowed: it alone is visible and writable
    allowed = lab.home / "allowed-dir"
    allowed.mkdir()
    proc, result, ws, out = lab.replay("boxed", 2, "--sandbox-allow", str(allowed))
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "ok" and str(allowed) in result["sandbox"]["writable"]
    failed = result["sandbox"]["failed_calls"]
    # every reason of a call, each with its line; curl's "Couldn't connect to server" is network
    assert _reasons(failed) == {1: ["read_only", "hidden"], 2: ["network"]}, failed
    first, second = failed
    assert (first["reason"], first["evidence"]) == (
        first["reasons"][0]["reason"],
        first["reasons"][0]["evidence"],
    )
    assert "Read-only file system" in first["reasons"][0]["evidence"]
    assert str(lab.home) in first["reasons"][1]["evidence"]
    assert "Couldn't connect to server" in second["evidence"]
    assert result["sandbox"]["fallback"] is None and not canary.exists()
    # the console says where the agent ran and how many calls the sandbox stopped
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("replayed codex to step 2 of 3"), proc.stdout
    assert lines[1:] == [
        "sandbox: bwrap (network gateway); 2 call(s) stopped by it (result.json sandbox.failed_calls)"
    ]
    # --sandbox auto without bwrap: no sandbox, said with why; the sandbox options given are one warning
    missing = str(lab.root / "no-bwrap")
    args, ws, out = lab.replay_args(
        "bare", 2, "--sandbox-network", "host", "--sandbox-allow", str(lab.outside)
    )
    proc = pvisor(args, env=user_env(lab.home, PVISOR_BWRAP=missing), cwd=lab.root, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    fallback = f"PVISOR_BWRAP={missing}: no such executable"
    assert result["sandbox"]["mode"] == "none" and result["sandbox"]["fallback"] == fallback
    assert result["sandbox"]["failed_calls"] == [] and canary.exists()
    canary.unlink()
    unused = [line for line in proc.stderr.splitlines() if "no effect without a sandbox" in line]
    assert unused == [
        "pvisor: warning: --sandbox-network host and --sandbox-allow have no effect without a sandbox: the "
        "agent runs as your own process, with your files and your network"
    ], proc.stderr
    assert proc.stdout.splitlines()[1:] == [f"sandbox: none (no sandbox: the calls ran as you; {fallback})"]


def _replay_refused(lab: Lab, name: str, code: int, text: str, *extra: str, env: dict | None = None) -> dict:
    """A replay refused with one line and exit ``code`` before the agent ran: its result.json."""
    args, ws, out = lab.replay_args(name, 2, *extra)
    proc = pvisor(args, env=user_env(lab.home, **(env or {})), cwd=lab.root, timeout=120)
    _one_line(proc, code, text)
    assert not [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("sandbox:")]
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "failed" and result["agent_run"] is None and list(ws.iterdir()) == []
    return result


def test_bad_sandbox_input_of_a_replay_is_one_line(lab):
    lab = lab[0]
    # --sandbox-allow / (it made every call fail, status ok), or a path holding what is hidden
    result = _replay_refused(
        lab, "allow-root", 2, "--sandbox-allow /: the whole file system", "--sandbox-allow", "/"
    )
    assert [e["code"] for e in result["errors"]] == ["usage"]
    for name, path, what in [
        ("allow-recorded", lab.recorded.parent, f"it holds {lab.recorded}, what the recorded run used"),
        ("allow-home", lab.home, f"it holds {lab.home}, your home"),
        ("allow-data", lab.data, f"it holds {lab.data}, the pvisor data directory"),
        # the machine's /tmp (other runs' gateway sockets), processes and devices
        ("allow-tmp", Path("/tmp"), "it holds /tmp, which would be the machine's own"),
        ("allow-proc", Path("/proc"), "/proc would be the machine's own (the machine's processes)"),
        ("allow-dev", Path("/dev/shm"), "/dev would be the machine's own (the machine's devices)"),
    ]:
        _replay_refused(lab, name, 2, f"--sandbox-allow {path}: {what}", "--sandbox-allow", str(path))
    # a directory as PVISOR_BWRAP; a sandbox that does not start: their own code, not journal_unavailable
    says = "--sandbox bwrap: PVISOR_BWRAP=/etc: not an executable file"
    result = _replay_refused(lab, "bwrap-dir", 69, says, "--sandbox", "bwrap", env={"PVISOR_BWRAP": "/etc"})
    assert [e["code"] for e in result["errors"]] == ["sandbox_unavailable"]
    failing = str(_fake_bwrap(lab.root, trial_ok=True))
    args, ws, out = lab.replay_args("bwrap-fails", 2, "--sandbox", "bwrap")
    proc = pvisor(args, env=user_env(lab.home, PVISOR_BWRAP=failing), cwd=lab.root, timeout=120)
    _one_line(proc, 69, "the sandbox did not start the agent")
    result = json.loads((out / "result.json").read_text())
    assert [e["code"] for e in result["errors"]] == ["sandbox_unavailable"]


def test_sandbox_options_without_a_sandbox_are_one_warning_in_a_run(tmp_path):
    (tmp_path / "home").mkdir()
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    proc = _run_codex(tmp_path, "--sandbox", "none", "--sandbox-allow", str(allowed), "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "no effect without a sandbox" in line]
    assert warnings == [
        "pvisor: warning: --sandbox-allow has no effect without a sandbox: the agent runs as your own "
        "process, with your files and your network"
    ], proc.stderr
    assert json.loads(proc.stdout)["sandbox"]["fallback"] is None


def test_the_observation_not_recorded_line_names_allow_unrecorded(tmp_path):
    """The one line prepare-only, replay-only and continuation give says how the modes that run
    the agent re-run such calls."""
    path = tmp_path / "cut.sqlite"
    record_cut_codex_run(path, corpus_dir())
    proc = pvisor(
        ["--journal", str(path), "replay", "--agent", "codex", "--run", "codex-cut", "--after-step", "1",
         "--prepare-only", "--output", str(tmp_path / "out")],
        env=user_env(tmp_path), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    _one_line(proc, 65, "observation_not_recorded")
    assert proc.stderr.rstrip().endswith("; replay-only and continuation re-run them with --allow-unrecorded")
