"""The sandbox of a replay's agent (docs/replay.md "The sandbox"), with the real agents offline
against the scripted model: a recording whose calls write outside the workspace (by absolute
path, after ``cd ..``, into the recorded workspace through a variable, from Python), read the
user's ``~/.ssh`` and the pvisor data directory and connect to a port on this machine is
replayed with the default sandbox (nothing lands, nothing is read, no connection arrives) and
with ``--sandbox none`` (everything does: the test would catch a sandbox that does nothing).
The six agents give the same observation inside and outside; a timeout, Ctrl-C and a kill -9 of
pvisor end the sandboxed agent as without a sandbox. Bad input: one line, exit 2 or 69."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import jsonschema
import pytest

from agent_helpers import AGENTS, PVISOR, SUBMIT, entrypoint, pvisor, tree, user_env
from pvisor.journal.reader import JournalReader
from pvisor.replay.spec import BY_NAME
from pvisor.session.sandbox import SandboxMode, SandboxNetwork, bwrap_problem

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
SSH_CANARY = "ssh-canary-" + uuid.uuid4().hex
OTHER_RUN_CANARY = "other-run-canary-" + uuid.uuid4().hex
#: the three agents the hostile recording is replayed with
HOSTILE = ["claude-code", "codex", "mini-swe-agent"]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(scope="module", autouse=True)
def bwrap_here():
    """bubblewrap must work on this machine (scripts/test installs it): a test of the sandbox
    that cannot run it fails."""
    problem = bwrap_problem()
    if problem is not None:
        pytest.fail(f"the sandbox tests need bubblewrap: {problem}", pytrace=False)


def _script(commands: list[str], agent: str) -> dict:
    """One step per command (a shell call), then the end (mini-swe-agent: its submit command)."""
    end: dict = {"text": "Done."}
    if agent == "mini-swe-agent":
        end["tool_calls"] = [{"tool": "@shell", "command": SUBMIT}]
    turns = [
        {"text": f"Step {i + 1}.", "tool_calls": [{"tool": "@shell", "command": c}]}
        for i, c in enumerate(commands)
    ]
    return {"model": "mock-model", "seed": 5, "turns": [*turns, end]}


class Lab:
    """A capture of ``agent`` (in ``root``: the user's home with a key, the data directory with
    the journal and another run's file, the recorded workspace, a directory outside) and the
    replays made of it."""

    def __init__(self, root: Path, agent: str):
        self.root, self.agent = root, agent
        self.home = root / "user-home"
        self.data = root / "data"
        self.recorded = root / "recorded" / "workspace"
        self.outside = root / "outside"
        for d in (self.home / ".ssh", self.data / "runs" / "r-other", self.recorded, self.outside):
            d.mkdir(parents=True)
        (self.home / ".ssh" / "id_rsa").write_text(SSH_CANARY + "\n")
        (self.data / "runs" / "r-other" / "notes.txt").write_text(OTHER_RUN_CANARY + "\n")
        self.journal = self.data / "journal.sqlite"
        self.run = ""

    def capture(self, commands: list[str], *extra: str) -> dict:
        script = self.root / "script.json"
        script.write_text(json.dumps(_script(commands, self.agent)))
        proc = pvisor(
            ["--journal", str(self.journal), "run", "--agent", self.agent, "--agent-entrypoint",
             str(entrypoint(self.agent)), "--script", str(script), "--workspace", str(self.recorded),
             "--timeout", "240", "--json", *extra, "--", "Check the machine."],
            env=user_env(self.home), cwd=self.root, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        self.run = report["run"]
        return report

    def replay_args(self, name: str, n: int, *extra: str, ws_name: str = "") -> tuple[list[str], Path, Path]:
        ws, out = self.root / f"ws-{ws_name or name}", self.root / f"out-{name}"
        ws.mkdir()
        args = [
            "--journal", str(self.journal), "replay", "--agent", self.agent, "--run", self.run,
            "--after-step", str(n), "--replay-only", "--workspace", str(ws), "--output", str(out),
            "--agent-entrypoint", str(entrypoint(self.agent)), "--timeout", "240", *extra,
        ]  # fmt: skip
        return args, ws, out

    def replay(
        self, name: str, n: int, *extra: str, ws_name: str = ""
    ) -> tuple[subprocess.CompletedProcess, dict, Path, Path]:
        args, ws, out = self.replay_args(name, n, *extra, ws_name=ws_name)
        proc = pvisor(args, env=user_env(self.home), cwd=self.root, timeout=300)
        assert "Traceback" not in proc.stderr, proc.stderr
        result = json.loads((out / "result.json").read_text())
        jsonschema.validate(result, SCHEMA)
        return proc, result, ws, out


# --------------------------------------------------------------------------- hostile calls


class Hostile:
    """What the hostile recording names: canary paths and the port that listens."""

    def __init__(self, lab: Lab, port: int, system_canary: Path):
        self.lab = lab
        self.listener: socket.socket | None = None
        self.port = port
        self.system = system_canary
        rec_parent = lab.recorded.parent
        self.commands = [
            # by absolute path; after cd ..; into the recorded workspace through a variable (the
            # path rewrite cannot see it); from Python; into a system directory
            f"echo x > {lab.outside}/abs.txt; cd .. && echo x > up.txt; p={rec_parent}; "
            f"echo x > $p/workspace/intruder.txt; "
            f'python3 -c \'open("{lab.outside}/py.txt", "w").write("x")\'; '
            f"echo x > {system_canary}; echo written",
            # the user's key (after an unmount of what hides it: root in the sandbox holds no
            # capability), another run's file, the journal itself, a port on this machine
            f"grep CapEff /proc/self/status; umount {lab.home} 2>/dev/null; cat {lab.home}/.ssh/id_rsa; "
            f"cat {lab.data}/runs/r-other/notes.txt; head -c 15 {lab.journal}; "
            f"echo; python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 3)'; "
            "echo read",
        ]

    def written(self, ws: Path) -> list[str]:
        """The canaries that exist on the disk after a replay in ``ws``."""
        lab = self.lab
        paths = [lab.outside / "abs.txt", ws.parent / "up.txt", lab.recorded / "intruder.txt",
                 lab.outside / "py.txt", self.system]  # fmt: skip
        return [str(p) for p in paths if p.exists()]

    def clean(self, ws: Path) -> None:
        lab = self.lab
        for p in [lab.outside / "abs.txt", ws.parent / "up.txt", lab.recorded / "intruder.txt",
                  lab.outside / "py.txt", self.system]:  # fmt: skip
            p.unlink(missing_ok=True)


def _accepted(listener: socket.socket) -> int:
    """How many connections reached ``listener`` (waiting in its backlog)."""
    listener.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """``hostile(agent)``: (Hostile, listener, the replay with the default sandbox, the replay with
    ``--sandbox none``), made once per agent: the capture itself runs in the sandbox."""
    cache: dict = {}
    listeners: list[socket.socket] = []
    systems: list[Path] = []

    def get(agent: str):
        if agent not in cache:
            lab = Lab(tmp_path_factory.mktemp(f"hostile-{agent}"), agent)
            listener = socket.create_server(("127.0.0.1", 0))
            listeners.append(listener)
            system = Path("/var/tmp") / f"pvisor-canary-{uuid.uuid4().hex}"
            systems.append(system)
            h = Hostile(lab, listener.getsockname()[1], system)
            h.listener = listener
            report = lab.capture(h.commands, "--sandbox", "bwrap")
            # pvisor run records the sandbox it ran the capture in
            assert report["sandbox"]["mode"] == "bwrap" and report["sandbox"]["network"] == "gateway"
            with JournalReader(lab.journal) as r:
                assert r.run(report["run"]).labels["sandbox"] == "bwrap, network gateway"
            # (its own workspace is where the capture writes: intruder.txt is its own file there)
            assert h.written(lab.recorded) == [str(lab.recorded / "intruder.txt")]
            assert _accepted(listener) == 0
            (lab.recorded / "intruder.txt").unlink()
            boxed = lab.replay("boxed", 2)
            boxed_written, boxed_connections = h.written(boxed[2]), _accepted(listener)
            bare = lab.replay("bare", 2, "--sandbox", "none")
            bare_written, bare_connections = h.written(bare[2]), _accepted(listener)
            h.clean(bare[2])
            cache[agent] = (h, boxed, boxed_written, boxed_connections, bare, bare_written, bare_connections)
        return cache[agent]

    yield get
    for listener in listeners:
        listener.close()
    for p in systems:
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("agent", HOSTILE)
def test_the_hostile_calls_change_nothing_outside_and_read_nothing(hostile, agent):
    h, boxed, written, connections, bare, bare_written, bare_connections = hostile(agent)
    proc, result, ws, out = boxed
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "ok" and result["replayed_tool_calls"] == 2
    # nothing written outside the workspace, no connection, nothing of the user's read
    assert written == [] and connections == 0
    prefix = (out / "prefix.json").read_text()
    assert "written" in prefix and "read" in prefix  # the calls ran to their end
    for canary in (SSH_CANARY, OTHER_RUN_CANARY, "SQLite format 3"):
        assert canary not in prefix
    # root in the sandbox holds no capability: no mount that hides or protects can be undone
    assert re.search(r"CapEff:[\\t]*0{16}\b", prefix), re.findall(r"CapEff:[\\t]*\w+", prefix)
    sandbox = result["sandbox"]
    assert sandbox["mode"] == "bwrap" and sandbox["network"] == "gateway"
    assert sandbox["writable"] == [str(ws), str(Path(result["agent_run"]["run_dir"]))]
    assert {str(h.lab.home), str(h.lab.data), str(h.lab.recorded), "/tmp"} <= set(sandbox["hidden"])
    # what landed in the private /tmp (the workspace's parent is there: `cd ..`) is listed
    assert f"{ws.parent}/up.txt" in sandbox["tmp_writes"], sandbox["tmp_writes"]
    reasons = {c["reason"] for c in sandbox["failed_calls"]}
    assert "read_only" in reasons and "hidden" in reasons, sandbox["failed_calls"]
    assert all(c["step"] in (1, 2) for c in sandbox["failed_calls"])
    # without the sandbox the same calls do land: the canaries catch a sandbox that does nothing
    proc, result, ws, out = bare
    assert proc.returncode == 0, proc.stderr
    assert len(bare_written) == 5 and bare_connections == 1, bare_written
    prefix = (out / "prefix.json").read_text()
    assert SSH_CANARY in prefix and OTHER_RUN_CANARY in prefix and "SQLite format 3" in prefix
    assert result["sandbox"]["mode"] == "none" and result["sandbox"]["failed_calls"] == []


def test_the_host_network_reaches_this_machine_and_the_files_stay_contained(hostile):
    """``--sandbox-network host``: no network namespace (the connection arrives), the same
    filesystem rules (nothing written outside, nothing of the user's read)."""
    h = hostile("codex")[0]
    proc, result, ws, out = h.lab.replay("host-net", 2, "--sandbox-network", "host")
    assert proc.returncode == 0, proc.stderr
    assert result["sandbox"]["mode"] == "bwrap" and result["sandbox"]["network"] == "host"
    assert h.written(ws) == [] and _accepted(h.listener) == 1
    assert SSH_CANARY not in (out / "prefix.json").read_text()


def test_intercept_mode_in_the_sandbox(tmp_path):
    """``pvisor run --intercept --sandbox bwrap``: mitmdump's port relayed like the gateway's,
    pvisor's CA (in the hidden home) bound back read-only, the run captured as without."""
    mitmdump = os.environ.get("PVISOR_MITMDUMP", "")
    if not os.access(mitmdump, os.X_OK):
        pytest.fail("$PVISOR_MITMDUMP names no mitmdump (./scripts/test sets it)", pytrace=False)
    lab = Lab(tmp_path, "claude-code")
    report = lab.capture(["echo alpha > a.txt && cat a.txt"], "--sandbox", "bwrap", "--intercept",
                         "--mitmdump", mitmdump)  # fmt: skip
    assert report["steps"] == 2 and report["intercept_proxy"] and (lab.recorded / "a.txt").exists()
    # (pvisor's interpreter is bound back too where it lies under /tmp, as in a checkout there)
    [ca] = [p for p in report["sandbox"]["read_only_bound_back"] if p.endswith(".pem")]
    assert ca.startswith(str(lab.home)) and ca.endswith(".pem")


# --------------------------------------------------------------------------- the six agents


#: Qwen Code 0.24.4 now and then reads a shell call's output as `Output: (empty)` (docs/replay.md,
#: "known source of noise"), in the sandbox and out of it alike
QWEN_LOST_OUTPUT = "Output: (empty)"


def _replay_with_output(lab: Lab, mode: str) -> tuple[subprocess.CompletedProcess, dict, Path, Path]:
    """Replay-only after step 1 in ``mode``; for Qwen Code once more (at most three tries) while its
    new observation is the lost-output one, so that the comparison is of what the command printed."""
    for attempt in range(3):
        name = mode if attempt == 0 else f"{mode}-{attempt}"
        proc, result, ws, out = lab.replay(name, 1, "--sandbox", mode, ws_name="same")
        prefix = (out / "prefix.json").read_text()
        if (
            lab.agent != "qwen-code"
            or QWEN_LOST_OUTPUT not in json.loads(prefix)["messages"][-1]["content"][0]["text"]
        ):
            break
        ws.rename(ws.with_name(f"ws-lost-{name}"))
    return proc, result, ws, out


@pytest.mark.parametrize("agent", list(AGENTS))
def test_the_same_observation_inside_and_outside_the_sandbox(captured, tmp_path, agent):
    """Replay-only after step 1 of the session capture, once in bwrap and once without: the
    same request N+1 (its messages) ending at the same O'_1, the same step served."""
    cap = captured(agent)
    assert cap.proc.returncode == 0, cap.proc.stderr
    lab = Lab(tmp_path, agent)
    lab.journal, lab.run, lab.home = cap.journal, cap.run, cap.user_home
    results, prefixes = {}, {}
    for mode in ("bwrap", "none"):
        # in the same workspace path (moved away in between): the agents put it in their prompts
        proc, result, ws, out = _replay_with_output(lab, mode)
        assert proc.returncode == 0, proc.stderr
        assert result["status"] == "ok" and result["sandbox"]["mode"] == mode
        assert tree(ws) == ["a.txt"]
        ws.rename(ws.with_name(f"ws-{mode}"))
        results[mode] = result
        run_dir = result["agent_run"]["run_dir"]
        text = (
            (out / "prefix.json").read_text().replace(run_dir, "RUN_DIR").replace(Path(run_dir).name, "RUN")
        )
        prefixes[mode] = UUID.sub("UUID", text)  # session and message ids are the run's own
    boxed, bare = results["bwrap"], results["none"]
    # the same request N+1, ending at the same O'_1: byte for byte where the agent puts nothing of
    # its own run in it (the others: a device id, a process group id, a chunk id, a timestamp)
    if agent in ("opencode", "mini-swe-agent"):
        assert prefixes["bwrap"] == prefixes["none"]
    keys = ("protocol", "message_count", "ends_with", "system_present", "tools_present", "model", "stream")
    assert {k: boxed["prefix"][k] for k in keys} == {k: bare["prefix"][k] for k in keys}
    assert [c["equal_normalised"] for c in boxed["tool_calls"]] == [
        c["equal_normalised"] for c in bare["tool_calls"]
    ]
    assert boxed["tool_calls"][0]["equal_normalised"] or agent == "qwen-code"
    assert boxed["agent_run"]["ended_by"] == bare["agent_run"]["ended_by"]
    assert boxed["agent_run"]["agent_status"] == bare["agent_run"]["agent_status"]


# --------------------------------------------------------------------------- supervision


#: a tool call that hangs in the replay (where the workspace holds .hang), with a process of its
#: own session (setsid) the agent never waits for
HANG = "if [ -f .hang ]; then setsid sleep 6131 & sleep 6132; fi; echo fine"


def _ours(marker: str) -> list[int]:
    """The live processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z" and "pytest" not in cmd:
            found.append(int(entry))
    return found


def _wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def hanging(tmp_path_factory):
    """A codex capture whose step 1 runs :data:`HANG` (quickly: no .hang in its workspace)."""
    lab = Lab(tmp_path_factory.mktemp("hang"), "codex")
    lab.capture([HANG])
    return lab


def _start(lab: Lab, name: str, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    args, ws, out = lab.replay_args(name, 1, *extra)
    (ws / ".hang").write_text("")
    proc = subprocess.Popen(
        [str(PVISOR), *args], env=user_env(lab.home), cwd=lab.root, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, ws, out


def _ended(out: Path) -> dict:
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return result


@pytest.mark.parametrize("how", ["timeout", "interrupted"])
def test_a_timeout_and_ctrl_c_end_the_sandboxed_agent_as_without(hanging, how):
    runs = {}
    for mode in ("bwrap", "none"):
        extra = ["--timeout", "5"] if how == "timeout" else []
        proc, ws, out = _start(hanging, f"{how}-{mode}", "--sandbox", mode, *extra)
        _wait_for(lambda: _ours("sleep 6132"), "the hanging tool call")
        if how == "interrupted":
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        assert proc.returncode == (124 if how == "timeout" else 130), err
        result = _ended(out)
        assert result["sandbox"]["mode"] == mode
        runs[mode] = result["agent_run"]
        assert _ours("sleep 613") == []  # the tool and the one in its own session ended
    boxed, bare = runs["bwrap"], runs["none"]
    assert boxed["ended_by"] == bare["ended_by"] == how
    assert boxed["exit_code"] == bare["exit_code"]
    assert boxed["agent_status"] == bare["agent_status"]
    # the agent's native session was written out as without the sandbox
    for run in (boxed, bare):
        assert run["native_trajectory"] and Path(run["native_trajectory"]).stat().st_size > 0
    boxed_lines = Path(boxed["native_trajectory"]).read_text().count("\n")
    bare_lines = Path(bare["native_trajectory"]).read_text().count("\n")
    assert boxed_lines == bare_lines


def test_a_kill_9_of_pvisor_ends_everything_in_the_sandbox(hanging):
    """Also the tool the agent moved into a session of its own (``setsid``), which a kill -9 of
    pvisor leaves running without the sandbox (docs/cli.md)."""
    for mode, left in (("bwrap", False), ("none", True)):
        proc, ws, out = _start(hanging, f"kill-{mode}", "--sandbox", mode)
        _wait_for(lambda: _ours("sleep 6131") and _ours("sleep 6132"), "the hanging tool calls")
        proc.kill()
        proc.communicate(timeout=60)
        if left:
            # without the sandbox the setsid tool outlives pvisor: that is the gap the sandbox closes
            # (pvisor is gone: nothing of it can end the tool any more)
            survivors = _ours("sleep 613")
            assert _ours("sleep 6131")
            for pid in survivors:
                os.kill(pid, signal.SIGKILL)
        else:
            _wait_for(lambda: not _ours("sleep 613"), "every process of the sandbox to end", timeout=30)
            assert not [p for p in _ours(str(ws))]


# --------------------------------------------------------------------------- bad input


def _fake_bwrap(tmp: Path, trial_ok: bool) -> Path:
    """A stand-in for bwrap: its trial answers ``trial_ok``; a real start fails as bwrap does
    when it cannot bind a mount."""
    path = tmp / ("fake-bwrap-ok" if trial_ok else "fake-bwrap-refused")
    refuse = "echo 'bwrap: No permissions to create new namespace' >&2; exit 1"
    trial = "exit 0" if trial_ok else refuse
    lines = [
        "#!/bin/sh",
        "for last; do :; done",
        'if [ "$last" = true ]; then ' + trial + "; fi",
        'echo "bwrap: Can\'t bind mount /oldroot/x on /newroot/x: Permission denied" >&2',
        "exit 1",
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def _one_line(proc, code: int, text: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert proc.returncode == code and len(errors) == 1 and text in errors[0], proc.stderr


def _run_codex(tmp: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    script = tmp / "script.json"
    script.write_text(json.dumps(_script(["echo hi > hi.txt"], "codex")))
    return pvisor(
        ["--journal", str(tmp / "data" / "j.sqlite"), "run", "--agent", "codex", "--agent-entrypoint",
         str(entrypoint("codex")), "--script", str(script), "--workspace", str(ws), *extra, "--", "Say hi."],
        env=user_env(tmp / "home", **(env or {})), cwd=tmp, timeout=120,
    )  # fmt: skip


def test_bad_sandbox_input_is_one_line_and_runs_nothing(tmp_path):
    (tmp_path / "home").mkdir()
    missing = str(tmp_path / "no-bwrap")
    # bwrap missing, user namespaces refused: exit 69, nothing run
    proc = _run_codex(tmp_path, "--sandbox", "bwrap", env={"PVISOR_BWRAP": missing})
    _one_line(proc, 69, f"--sandbox bwrap: PVISOR_BWRAP={missing}: no such executable")
    refused = str(_fake_bwrap(tmp_path, trial_ok=False))
    proc = _run_codex(tmp_path, "--sandbox", "bwrap", env={"PVISOR_BWRAP": refused})
    _one_line(
        proc, 69, "cannot make its namespaces here (exit 1: bwrap: No permissions to create new namespace"
    )
    assert tree(tmp_path / "ws") == [] and not (tmp_path / "data" / "j.sqlite").exists()
    # auto without bwrap: one warning that names --sandbox none and PVISOR_SANDBOX, then no sandbox
    proc = _run_codex(tmp_path, "--sandbox", "auto", "--json", env={"PVISOR_BWRAP": missing})
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "no sandbox" in line]
    assert len(warnings) == 1 and "--sandbox none" in warnings[0] and "PVISOR_SANDBOX=none" in warnings[0]
    assert json.loads(proc.stdout)["sandbox"]["mode"] == "none"
    # --use-home in a sandbox without --sandbox-allow; a --sandbox-allow that is not there
    proc = _run_codex(tmp_path, "--sandbox", "bwrap", "--use-home")
    _one_line(proc, 2, "--use-home in a sandbox")
    proc = _run_codex(tmp_path, "--sandbox", "bwrap", "--sandbox-allow", str(tmp_path / "nope"))
    _one_line(proc, 2, f"--sandbox-allow {tmp_path / 'nope'}: no such file or directory")
    proc = _run_codex(tmp_path, env={"PVISOR_SANDBOX": "maybe"})
    _one_line(proc, 2, "PVISOR_SANDBOX='maybe': expected one of auto, bwrap, none")
    # a sandbox that cannot start (bwrap cannot bind a mount): exit 69, the agent never ran
    (tmp_path / "ws" / "hi.txt").unlink(missing_ok=True)
    failing = str(_fake_bwrap(tmp_path, trial_ok=True))
    proc = _run_codex(tmp_path, "--sandbox", "bwrap", env={"PVISOR_BWRAP": failing})
    _one_line(proc, 69, "the sandbox did not start the agent: bwrap: Can't bind mount")
    assert tree(tmp_path / "ws") == []
    with JournalReader(tmp_path / "data" / "j.sqlite") as r:
        [attempt] = [a for run in r.runs() for a in r.attempts(run.id) if "error" in a.labels]
        assert "the sandbox did not start" in attempt.labels["error"]


def test_the_modes_and_networks_are_the_options_choices():
    assert BY_NAME["sandbox"].choices == tuple(m.value for m in SandboxMode)
    assert BY_NAME["sandbox_network"].choices == tuple(n.value for n in SandboxNetwork)
    # prepare-only runs no agent: the sandbox options are refused there
    proc = subprocess.run(
        [str(PVISOR), "replay", "--agent", "codex", "--trajectory", "x", "--after-step", "1",
         "--prepare-only", "--output", "o", "--sandbox", "bwrap"], capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "--sandbox is for --replay-only and continuation" in proc.stderr


def test_the_relay_ends_other_processes_only_in_a_pid_namespace_of_its_own():
    """The relay ends "every other process" only where they are the agent's: as bwrap's child
    in a PID namespace of its own; run by hand on the machine it ends none."""
    from pvisor.session import relay

    assert relay.own_pid_namespace() is False
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(relay.__file__)!r}); "
        "import relay; print(relay.own_pid_namespace())"
    )
    inside = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
         "--die-with-parent", sys.executable, "-I", "-S", "-c", code],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert inside.stdout.strip() == "True", inside.stderr


# --------------------------------------------------------------------------- the relay's status

#: a status line the agent would like pvisor to believe
FORGED = '{"returncode": 7, "strays": 4, "tmp": [], "stopped": false}'


def _armed_replay(tmp_path: Path, command: str, name: str) -> tuple[Lab, subprocess.CompletedProcess, dict]:
    """Codex recorded running ``command`` unarmed, replayed armed (``.arm`` in the workspace)
    with the default sandbox: the lab, pvisor's process, result.json."""
    lab = Lab(tmp_path, "codex")
    lab.capture([f"if [ -f .arm ]; then {command}; fi; echo done-{name}"], "--sandbox", "bwrap")
    args, ws, out = lab.replay_args(name, 1)
    (ws / ".arm").write_text("")
    proc = pvisor(args, env=user_env(lab.home), cwd=lab.root, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return lab, proc, result


def test_the_agent_can_neither_inherit_nor_open_the_relays_status_pipe(tmp_path):
    """The relay's status pipe: the agent does not inherit it (a write to every descriptor of the
    recorded call's shell), nor open it through ``/proc/RELAY/fd`` (the relay is undumpable: the
    same user without a capability is refused): the agent's status is its own."""
    write_all = f"for f in /proc/$$/fd/* /proc/2/fd/*; do echo '{FORGED}' > $f; done 2>/dev/null; true"
    _, proc, result = _armed_replay(tmp_path, write_all, "pipe")
    assert proc.returncode == 0, proc.stderr
    run = result["agent_run"]
    assert result["sandbox"]["mode"] == "bwrap" and run["exit_code"] == 0, run
    assert "said no status" not in proc.stderr, proc.stderr


def test_a_relay_killed_from_inside_leaves_no_traceback_and_an_ended_attempt(tmp_path):
    """A recorded call can still SIGKILL the relay (the same user; docs/replay.md "What it does
    not stop"): the sandbox ends with it, pvisor says the relay gave no status, records bwrap's
    exit code, and ends the attempt in the journal."""
    lab, proc, result = _armed_replay(tmp_path, "kill -9 2", "killed")
    said = [ln for ln in proc.stderr.splitlines() if "the sandbox's relay said no status" in ln]
    assert len(said) == 1, proc.stderr
    run = result["agent_run"]
    assert run is not None and run["exit_code"] not in (None, 0), run
    with JournalReader(lab.journal) as r:
        attempts = r.attempts(run["run"])
    assert [a.ended_ms is not None for a in attempts] == [True], attempts
    assert attempts[0].exit_code == run["exit_code"]


def test_a_status_line_of_another_shape_is_no_status():
    """What the status pipe carries is type-checked field by field: anything else is no status."""
    from pvisor.session.sandbox import parse_status

    good = {"returncode": -15, "strays": 2, "tmp": ["/tmp/x"], "stopped": True}
    assert parse_status(json.dumps(good)) == good
    for bad in [
        "", "not json", "[]", "null", '{"returncode": 0}',
        '{"returncode": 0, "strays": "x", "tmp": [], "stopped": false}',
        '{"returncode": true, "strays": 0, "tmp": [], "stopped": false}',
        '{"returncode": 0, "strays": -1, "tmp": [], "stopped": false}',
        '{"returncode": 0, "strays": 0, "tmp": [1], "stopped": false}',
        '{"returncode": 0, "strays": 0, "tmp": [], "stopped": 0}',
        '{"returncode": 1.5, "strays": 0, "tmp": [], "stopped": false}',
    ]:  # fmt: skip
        assert parse_status(bad) is None, bad
