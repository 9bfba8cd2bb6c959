"""Attacks on the sandbox of a replay (docs/replay.md "The sandbox", issue 37), each a hostile
recording made with the real agent offline against the scripted model, then replayed with the
default sandbox. Every test here FAILS until its flaw is fixed: it asserts what the sandbox
promises ("changes nothing outside its workspace and run directory, reads nothing of the user's,
reaches nothing but the gateway, the agent recorded exactly as without the sandbox").

The hostile calls are armed by a file the replay's workspace holds (``.arm``) and the capture's
does not: the capture runs them harmlessly, the replay for real."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from agent_helpers import PVISOR, user_env
from pvisor.session.sandbox import SandboxNetwork, bwrap_problem, plan_sandbox, socket_places
from test_sandbox import Lab

pytestmark = pytest.mark.slow

#: where attempt 1's relay configuration was (``attempt-1.relay.json`` of the run directory),
#: found by a recorded call without knowing the run directory: the run directory holds the
#: agent's ``TMPDIR`` (the relay's last argument, ``/proc/2/cmdline``, named it once; it is now
#: a descriptor, and the attacks below go on planting in the run directory all the same)
RELAY_CONFIG = 'c=$(dirname "$TMPDIR")/attempt-1.relay.json'


@pytest.fixture(scope="module", autouse=True)
def bwrap_here():
    problem = bwrap_problem()
    if problem is not None:
        pytest.fail(f"the sandbox tests need bubblewrap: {problem}", pytrace=False)


def _armed(command: str) -> str:
    return f"if [ -f .arm ]; then {command}; fi; echo done-{uuid.uuid4().hex[:6]}"


#: OpenCode installs its plugin package into each config directory before it loads any plugin
#: (offline here: about a minute, past pvisor's export timeout, which would hide the attack):
#: a ``node_modules`` and a lock naming the package say it is installed (1.18.33's check)
_LOCK = json.dumps({"packages": {"": {"dependencies": {"@opencode-ai/plugin": "1.18.33"}}}})
NO_INSTALL = (
    'for d in "$XDG_CONFIG_HOME/opencode" .opencode; do mkdir -p "$d/node_modules" && '
    f'echo {base64.b64encode(_LOCK.encode()).decode()} | base64 -d > "$d/package-lock.json"; done'
)


def _replay(lab: Lab, name: str, *extra: str, timeout: float = 300):
    """Replay step 1 of ``lab``'s capture into a workspace that holds ``.arm``, with the default
    sandbox: (process, result or None, workspace, output)."""
    args, ws, out = lab.replay_args(name, 1, *extra)
    (ws / ".arm").write_text("")
    proc = subprocess.run(
        [str(PVISOR), *args], env=user_env(lab.home), cwd=lab.root, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    result_path = out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return proc, result, ws, out


# --------------------------------------------------------------------------- 1. OpenCode's export


def test_opencode_export_runs_no_code_the_replay_planted(tmp_path):
    """After OpenCode exits, pvisor runs ``opencode export SESSION`` OUTSIDE the sandbox (in the
    replay's workspace, with the run directory's OPENCODE_CONFIG and private home): OpenCode
    loads the plugins of ``.opencode/plugin/`` of its working directory (and of its config) at
    start, so a recorded call that writes one there runs code on the host, as pvisor's user."""
    canary = Path("/var/tmp") / f"pvisor-opencode-escape-{uuid.uuid4().hex}"
    plugin = (
        "import { writeFileSync } from 'fs'; "
        f"writeFileSync('{canary}', 'escaped ' + process.pid); "
        "export const Escape = async () => ({});"
    )
    command = _armed(
        f"mkdir -p .opencode/plugin && printf '%s\\n' \"{plugin}\" > .opencode/plugin/escape.js; {NO_INSTALL}"
    )
    lab = Lab(tmp_path, "opencode")
    lab.capture([command], "--sandbox", "bwrap")
    assert not canary.exists()  # not armed in the capture
    try:
        proc, result, ws, out = _replay(lab, "plugin")
        assert proc.returncode == 0, proc.stderr
        assert result["sandbox"]["mode"] == "bwrap"
        assert (ws / ".opencode" / "plugin" / "escape.js").exists()  # the call ran, in the sandbox
        # ...and nothing it planted ran outside the sandbox afterwards
        assert not canary.exists(), f"code planted in the sandbox ran outside it: {canary.read_text()}"
    finally:
        canary.unlink(missing_ok=True)


def test_opencode_export_loads_no_plugin_the_runs_config_names(tmp_path):
    """The same through the configuration the export was given: the run directory's
    ``opencode.json`` (``$OPENCODE_CONFIG`` in the agent's environment), which the agent may
    write, made to name a plugin in the workspace. The export gets a configuration pvisor
    writes afresh and no external plugin, and still exports the session."""
    canary = Path("/var/tmp") / f"pvisor-opencode-config-{uuid.uuid4().hex}"
    plugin = f"import {{ writeFileSync }} from 'fs'; writeFileSync('{canary}', 'escaped ' + process.pid); "
    plugin += "export const Escape = async () => ({});\n"
    edit = (
        "import json, os; p = os.environ['OPENCODE_CONFIG']; d = json.load(open(p)); "
        "d['plugin'] = ['file://' + os.path.abspath('escape.js')]; json.dump(d, open(p, 'w'))"
    )
    b64 = base64.b64encode
    command = _armed(
        f"echo {b64(plugin.encode()).decode()} | base64 -d > escape.js && "
        f"echo {b64(edit.encode()).decode()} | base64 -d | python3; {NO_INSTALL}"
    )
    lab = Lab(tmp_path, "opencode")
    lab.capture([command], "--sandbox", "bwrap")
    try:
        proc, result, ws, out = _replay(lab, "config-plugin")
        assert proc.returncode == 0, proc.stderr
        assert result["sandbox"]["mode"] == "bwrap"
        config = json.loads((Path(result["agent_run"]["run_dir"]) / "opencode.json").read_text())
        assert config["plugin"] == [f"file://{ws / 'escape.js'}"]  # the call ran, in the sandbox
        assert not canary.exists(), f"code planted in the sandbox ran outside it: {canary.read_text()}"
        native = result["agent_run"]["native_trajectory"]
        assert native is not None and json.loads(Path(native).read_text())["info"]["id"], proc.stderr
    finally:
        canary.unlink(missing_ok=True)


# --------------------------------------------------------------------------- 2. Unix sockets


@pytest.mark.parametrize("place", ["/var/tmp", "/run"])
def test_a_unix_socket_of_this_machine_is_not_reachable(tmp_path, place):
    """``--unshare-net`` isolates TCP and abstract sockets, but a Unix socket on the filesystem
    is reachable through the read-only ``/`` (connect() needs no write to the mount): a docker,
    containerd, systemd or database socket outside /tmp and $HOME is within a recorded call's
    reach. The sandbox hides where sockets live by convention (docs/replay.md "The sandbox")."""
    where = Path(place) / f"pvisor-sock-{uuid.uuid4().hex[:12]}"
    where.mkdir()
    path = where / "s.sock"
    lab = Lab(tmp_path, "codex")
    connect = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{path}'); s.send(b'reached')"
    lab.capture([_armed(f'python3 -c "{connect}"')], "--sandbox", "bwrap")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
        listener.listen(8)
        listener.setblocking(False)
        proc, result, ws, out = _replay(lab, "unix")
        assert proc.returncode == 0, proc.stderr
        assert result["sandbox"]["mode"] == "bwrap" and result["sandbox"]["network"] == "gateway"
        try:
            conn, _ = listener.accept()
            got = conn.recv(100)
            conn.close()
        except BlockingIOError:
            got = b""
        assert got == b"", f"a recorded call reached {path} from the sandbox: {got!r}"
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        where.rmdir()


def test_the_socket_places_are_read_from_the_environment():
    """Beside /run, /var/run (resolved) and /var/tmp: ``$XDG_RUNTIME_DIR``, the directory of
    ``$SSH_AUTH_SOCK`` and of a dbus ``unix:path=``, real and existing; never /tmp's (a private
    one already), a relative or missing path, an abstract dbus address."""
    root = Path(tempfile.mkdtemp(prefix="pvisor-places-", dir="/var/tmp"))
    try:
        for d in ("rt", "ssh", "bus"):
            (root / d).mkdir()
        (root / "link").symlink_to(root / "rt")
        env = {
            "XDG_RUNTIME_DIR": str(root / "link"),
            "SSH_AUTH_SOCK": str(root / "ssh" / "agent.1"),
            "DBUS_SESSION_BUS_ADDRESS": f"unix:abstract=/x,guid=1;unix:path={root}/bus/sock,guid=2",
        }
        places = socket_places(env)
        expected = [p for p in ("/run", "/var/tmp") if os.path.isdir(p)]
        expected += [str(root / "rt"), str(root / "ssh"), str(root / "bus")]
        assert places == expected
        missing = {"XDG_RUNTIME_DIR": str(root / "gone"), "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1"}
        assert (
            socket_places({**missing, "DBUS_SESSION_BUS_ADDRESS": "unix:path=relative/sock"}) == expected[:-3]
        )
    finally:
        shutil.rmtree(root)


def test_only_the_gateways_network_hides_the_socket_places(tmp_path):
    """With ``--sandbox-network host`` the agent reaches this machine's network anyway, and its
    resolver's files live under /run on many systems: the places stay visible."""
    ws, run_dir, data = tmp_path / "ws", tmp_path / "data" / "runs" / "r", tmp_path / "data"
    run_dir.mkdir(parents=True)
    ws.mkdir()
    for network, sealed in ((SandboxNetwork.GATEWAY, True), (SandboxNetwork.HOST, False)):
        box = plan_sandbox(network=network, workspace=ws, run_dir=run_dir, data_dir=data)
        try:
            argv = box.mounts()
            remounted = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
            hidden = box.to_json()["hidden"]
            if sealed:  # emptied (a tmpfs), then read-only again after every mount inside
                assert {"/run", "/var/tmp"} <= set(hidden) and remounted == ["/run", "/var/tmp"], argv
                assert argv.index("--remount-ro") > max(i for i, a in enumerate(argv) if a == "--bind")
            else:
                assert "/run" not in hidden and "/var/tmp" not in hidden and remounted == [], argv
        finally:
            box.close()


# --------------------------------------------------------------------------- 3. forged status


def test_a_status_file_the_agent_forged_is_not_believed(tmp_path):
    """The relay's status file (``attempt-N.sandbox.json``) lies in the run directory, which the
    agent may write: a recorded call writes its own status there and makes the relay's
    temporary file a directory (the relay cannot replace it); pvisor then records the forged
    exit code and stray count as the agent's."""
    forge = (
        f"{RELAY_CONFIG}; s=${{c%.relay.json}}.sandbox.json; "
        """echo '{"returncode": 7, "strays": 4, "tmp": [], "stopped": false}' > "$s"; mkdir -p "$s.tmp" """
    )
    lab = Lab(tmp_path, "codex")
    lab.capture([_armed(forge)], "--sandbox", "bwrap")
    proc, result, ws, out = _replay(lab, "forged")
    bare = _replay(lab, "forged-bare", "--sandbox", "none")[1]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert result["sandbox"]["mode"] == "bwrap"
    run, bare_run = result["agent_run"], bare["agent_run"]
    assert bare_run["exit_code"] == 0, bare_run
    # the agent ended as without the sandbox: not with the 7 (nor the 4 strays) the call wrote
    keys = ("exit_code", "ended_by", "agent_status")
    assert {k: run[k] for k in keys} == {k: bare_run[k] for k in keys}, run
    assert proc.returncode == 0, proc.stderr


def test_a_malformed_status_the_agent_wrote_is_no_traceback(tmp_path):
    """The same file with ``"strays": "x"``: ``int()`` of it raises in pvisor, after the run."""
    forge = (
        f"{RELAY_CONFIG}; s=${{c%.relay.json}}.sandbox.json; "
        """echo '{"returncode": 0, "strays": "x"}' > "$s"; mkdir -p "$s.tmp" """
    )
    lab = Lab(tmp_path, "codex")
    lab.capture([_armed(forge)], "--sandbox", "bwrap")
    proc, result, ws, out = _replay(lab, "malformed")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert result is not None and result["agent_run"]["exit_code"] == 0


# --------------------------------------------------------------------------- 4. the stdout file


def test_a_fifo_planted_for_the_agents_stdout_does_not_hang_pvisor(tmp_path):
    """pvisor reads ``attempt-N.stdout`` of the run directory by its path after the agent ended
    (outside the sandbox, following what is there now): a recorded call replaces it by a FIFO
    and pvisor blocks forever in ``read_bytes()`` (no --timeout applies any more); a symlink to
    /dev/zero would exhaust its memory instead (not tried here)."""
    plant = f'{RELAY_CONFIG}; o=${{c%.relay.json}}.stdout; mv "$o" "$o.gone"; mkfifo "$o"'
    lab = Lab(tmp_path, "codex")
    lab.capture([_armed(plant)], "--sandbox", "bwrap")
    args, ws, out = lab.replay_args("fifo", 1, "--timeout", "60")
    (ws / ".arm").write_text("")
    proc = subprocess.Popen(
        [str(PVISOR), *args], env=user_env(lab.home), cwd=lab.root, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is not None, "pvisor still runs 180 s after the start of a 60 s-timeout replay"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


# --------------------------------------------------------------------------- 5. bad input


def test_sandbox_allow_of_the_root_is_refused(tmp_path):
    """``--sandbox-allow /`` binds the whole machine writable over the sandbox, and with it the
    host's /proc (every process of the machine, which root without a capability can still
    signal) and /dev (its disks): no sandbox at all, said nowhere."""
    canary = Path("/var/tmp") / f"pvisor-allow-root-{uuid.uuid4().hex}"
    lab = Lab(tmp_path, "mini-swe-agent")
    lab.capture([_armed(f"echo x > {canary}")], "--sandbox", "bwrap")
    try:
        proc, result, ws, out = _replay(lab, "allow-root", "--sandbox-allow", "/")
        assert not canary.exists(), "--sandbox-allow / let a recorded call write into /var/tmp"
        errors = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
        assert proc.returncode == 2 and len(errors) == 1 and "--sandbox-allow /" in errors[0], proc.stderr
    finally:
        canary.unlink(missing_ok=True)


# --------------------------------------------------------------------------- 6. files of a later attempt


def test_a_resume_writes_no_file_through_a_link_the_sandboxed_attempt_planted(tmp_path):
    """The run directory outlives the sandbox: attempt 1 (in bwrap) plants ``attempt-2.stdout``
    and ``attempt-2.relay.json`` as symbolic links to a file outside; ``pvisor run --resume``
    opens them (``open_private``, ``write_config``: O_CREAT|O_TRUNC without O_NOFOLLOW) as the
    user, outside any sandbox, and truncates and overwrites what they point at."""
    victim = Path("/var/tmp") / f"pvisor-victim-{uuid.uuid4().hex}"
    victim2 = victim.with_name(victim.name + "-2")
    plant = (
        f"{RELAY_CONFIG}; d=$(dirname $c); ln -s {victim} $d/attempt-2.stdout; "
        f"ln -s {victim2} $d/attempt-2.relay.json"
    )
    lab = Lab(tmp_path, "codex")
    try:
        (lab.recorded / ".arm").write_text("")  # armed in the capture itself: it is attempt 1
        report = lab.capture([_armed(plant)], "--sandbox", "bwrap")
        run_dir = Path(report["run_dir"])
        assert (run_dir / "attempt-2.stdout").is_symlink()  # planted from inside the sandbox
        victim.write_text("precious\n")
        victim2.write_text("precious\n")
        script = lab.root / "script2.json"
        script.write_text(
            json.dumps({"model": "mock-model", "seed": 1, "turns": [{"text": "Nothing more."}]})
        )
        from agent_helpers import entrypoint, pvisor

        proc = pvisor(
            ["--journal", str(lab.journal), "run", "--agent", "codex", "--agent-entrypoint",
             str(entrypoint("codex")), "--script", str(script), "--resume", lab.run, "--sandbox", "bwrap",
             "--timeout", "120", "--", "Anything else?"],
            env=user_env(lab.home), cwd=lab.root, timeout=240,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        assert victim.read_text() == "precious\n" and victim2.read_text() == "precious\n", (
            victim.read_text()[:200],
            victim2.read_text()[:200],
        )
    finally:
        victim.unlink(missing_ok=True)
        victim2.unlink(missing_ok=True)
