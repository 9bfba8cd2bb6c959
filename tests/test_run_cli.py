"""``pvisor run`` with a tiny fake agent (a shell script given as --agent-entrypoint under the
claude-code profile): what the agent is given (private home, base URL with the run id, quiet
switches), and every failure: a clear one-line message, the documented exit code, and a
journal that keeps what it had."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

import pytest

from agent_helpers import GATE_SH, PVISOR, children, pvisor, start_together, tree, user_env, wait_gone
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

FAKE_AGENT = r"""#!/bin/bash
# A stand-in for `claude`: answers --version, then behaves as $FAKE_MODE says.
if [ "$1" = "--version" ]; then
  [ "$FAKE_MODE" = "version-hangs" ] && sleep 60
  # two starts at once (agent_helpers.start_together): held here until both have come
  if [ -n "$FAKE_GATE" ]; then set -- "$FAKE_GATE"; GATE_SH_HERE; fi
  echo "${FAKE_VERSION:-2.1.332} (Claude Code)"; exit 0
fi
echo '{"type":"system","subtype":"init","session_id":"fake-session-1"}'
case "$FAKE_MODE" in
  env)  env > "$FAKE_OUT"; pwd >> "$FAKE_OUT"; printf '%s\n' "$@" > "$FAKE_OUT.argv" ;;
  fail) echo "fake agent: something broke" >&2; exit 3 ;;
  count) echo $$ >> "$FAKE_OUT" ;;
  hang) sleep 300 & echo $! > "$FAKE_OUT"; wait ;;
  # a tool started in its own session (as gemini-cli, opencode, mini-swe-agent do): outside the
  # agent's process group, orphaned when the agent ends
  setsid-exit) setsid sleep 300 & echo $! > "$FAKE_OUT" ;;
  setsid-hang) setsid sleep 300 & echo $! > "$FAKE_OUT"; trap '' TERM; while :; do sleep 1; done ;;
  # three streamed requests through the gateway, then another process takes the journal's lock
  lock) body='{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,'
        body+='"messages":[{"role":"user","content":"hi"}]}'
        for i in 1 2 3; do
          curl -s -X POST "$ANTHROPIC_BASE_URL/v1/messages" -H 'content-type: application/json' \
            -H "x-api-key: $ANTHROPIC_API_KEY" -d "$body" > /dev/null
        done
        # exit only once the lock is held: the run's last writes then meet it, however slow
        # the test process is to take it
        touch "$FAKE_OUT.go"; for _ in $(seq 600); do [ -e "$FAKE_OUT.held" ] && break; sleep 0.05; done ;;
  trap-hang) echo $$ > "$FAKE_OUT"; trap 'echo got-term >> "$FAKE_OUT.sig"' TERM
             while :; do sleep 0.1; done ;;
esac
exit 0
"""

FAKE_AGENT = FAKE_AGENT.replace("GATE_SH_HERE", GATE_SH)

SCRIPT = {"turns": [{"text": "nothing to do"}]}


@pytest.fixture
def box(tmp_path: Path):
    """A fake agent, a workspace, a user home, a script, and a journal that already holds one run."""
    fake = tmp_path / "fake-claude"
    fake.write_text(FAKE_AGENT)
    fake.chmod(0o755)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "data").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    journal = tmp_path / "data" / "journal.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-before000001", agent="claude-code", labels={"session_id": "old-session"}))
        j.record_exchange(
            "r-before000001",
            "POST",
            "/v1/messages",
            protocol="anthropic",
            status=200,
            request_body=b'{"messages": []}',
            response_body=b"{}",
        )

    class Box:
        root = tmp_path
        agent = fake
        workspace = tmp_path / "workspace"
        home = tmp_path / "home"

        def run(self, *args: str, mode: str = "", env: dict | None = None, timeout: float = 120):
            e = user_env(self.home, FAKE_MODE=mode, FAKE_OUT=str(tmp_path / "fake.out"), **(env or {}))
            return pvisor(["--journal", str(journal), "run", *args], env=e, cwd=tmp_path, timeout=timeout)

        def std(self, *extra: str) -> list[str]:
            return [
                "--agent",
                "claude-code",
                "--agent-entrypoint",
                str(fake),
                "--script",
                str(script),
                "--workspace",
                str(self.workspace),
                *extra,
            ]

    b = Box()
    b.journal = journal
    b.script = script
    return b


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_error_line(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert "Usage:" not in proc.stderr
    assert len(errors) == 1, proc.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])


def test_the_agent_gets_a_private_home_and_a_base_url_with_the_run_id(box):
    proc = box.run(*box.std("--json", "--", "look around"), mode="env")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    run_dir = box.journal.parent / "runs" / rep["run"]
    seen = dict(
        line.split("=", 1) for line in (box.root / "fake.out").read_text().splitlines() if "=" in line
    )
    cwd = (box.root / "fake.out").read_text().splitlines()[-1]
    assert cwd == str(box.workspace) and seen["PWD"] == str(box.workspace)
    assert seen["ANTHROPIC_BASE_URL"] == f"{rep['gateway']}/run/{rep['run']}"
    assert seen["HOME"] == str(run_dir / "home") and seen["XDG_CONFIG_HOME"].startswith(str(run_dir / "home"))
    assert seen["NO_PROXY"] == "127.0.0.1,localhost,::1"
    assert seen["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and seen["DISABLE_AUTOUPDATER"] == "1"
    assert (
        seen["ANTHROPIC_API_KEY"] == "pvisor-scripted-model-key"
    )  # a dummy: the scripted model checks nothing
    assert (
        seen["TMPDIR"] == seen["TMP"] == seen["TEMP"] == str(run_dir / "tmp") and (run_dir / "tmp").is_dir()
    )
    argv = (box.root / "fake.out.argv").read_text().splitlines()
    assert argv[0] == "-p" and argv[-2:] == ["--", "look around"] and "stream-json" in argv
    assert rep["session_id"] == "fake-session-1" and rep["steps"] == 0 and rep["exchanges"] == 0
    assert tree(box.home) == [] and tree(box.workspace) == []
    with JournalReader(box.journal) as r:
        run = r.run(rep["run"])
        assert (
            run.agent == "claude-code"
            and run.agent_version == "2.1.332"
            and run.labels["session_id"] == "fake-session-1"
        )
        assert [(a.n, a.exit_code) for a in r.attempts(run.id)] == [(1, 0)]
        assert r.run("r-before000001").labels == {"session_id": "old-session"}


def test_human_output_names_the_run_steps_and_native_path(box):
    proc = box.run(*box.std("--", "hello"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("run r-") and "steps captured: 0" in out and "session: fake-session-1" in out
    assert "native trajectory: -" in out and "next: pvisor journal steps r-" in out
    # the fake agent never calls the model: exit 0 with no step is called out
    assert "WARNING: the agent exited 0 without a single step" in out
    assert "exited with code 0 but no step was captured" in proc.stderr


def test_agent_exiting_non_zero_passes_its_code_through(box):
    proc = box.run(*box.std("--json", "--", "break"), mode="fail")
    assert proc.returncode == 3, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["exit_code"] == rep["agent_exit_code"] == 3
    # a fake agent that printed no result line: no reason of its own, both its files named
    assert rep["agent_status"]["outcome"] == "unknown"
    assert (
        f"claude-code exited with code 3 (its stdout: {rep['stdout']}; its stderr: {rep['stderr']})"
        in proc.stderr
    )
    assert Path(rep["stderr"]).read_text() == "fake agent: something broke\n"
    with JournalReader(box.journal) as r:
        assert [(a.n, a.exit_code) for a in r.attempts(rep["run"])] == [(1, 3)]
        assert len(r.runs()) == 2  # the run before is still there


def test_agent_hanging_past_the_timeout_is_killed_with_its_process_group(box):
    start = time.monotonic()
    proc = box.run(*box.std("--timeout", "1", "--json", "--", "hang"), mode="hang")
    _one_error_line(proc, 124, "did not finish within 1 s", "process group was killed")
    assert time.monotonic() - start < 60
    rep = json.loads(proc.stdout)
    assert rep["timed_out"] and rep["exit_code"] == 124
    grandchild = int((box.root / "fake.out").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the background `sleep 300` went with the group
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the agent's child {grandchild} survived the timeout")
    with JournalReader(box.journal) as r:
        [att] = r.attempts(rep["run"])
        assert att.labels["timed_out"] == "true" and att.exit_code in (128 + 15, 128 + 9)


def _unchanged(box, proc_fn) -> None:
    before = _digest(box.journal)
    runs_dir = box.journal.parent / "runs"
    proc_fn()
    assert _digest(box.journal) == before, "the journal changed"
    assert not runs_dir.exists(), "a run directory was created"


def test_missing_agent_binary(box):
    def go():
        proc = box.run(
            "--agent",
            "claude-code",
            "--agent-entrypoint",
            str(box.root / "no-such-claude"),
            "--script",
            str(box.script),
            "--",
            "task",
        )
        _one_error_line(proc, 69, "--agent-entrypoint", "no-such-claude", "does not exist")
        # and without an entry point, looked up on a PATH that has no claude
        proc = box.run(
            "--agent",
            "claude-code",
            "--script",
            str(box.script),
            "--",
            "task",
            env={"PATH": str(box.root / "empty")},
        )
        _one_error_line(proc, 69, "'claude' is not on PATH", "--agent-entrypoint")

    _unchanged(box, go)


def test_version_out_of_range_needs_allow_unsupported(box):
    def go():
        proc = box.run(*box.std("--", "task"), env={"FAKE_VERSION": "1.0.9"})
        _one_error_line(
            proc, 69, "Claude Code 1.0.9", "not a supported version", ">=2.1.0, <2.2", "--allow-unsupported"
        )
        proc = box.run(*box.std("--", "task"), env={"FAKE_VERSION": "no version here"})
        _one_error_line(proc, 69, "cannot tell the version", "--allow-unsupported")

    _unchanged(box, go)
    proc = box.run(*box.std("--allow-unsupported", "--json", "--", "task"), env={"FAKE_VERSION": "9.9.9"})
    assert proc.returncode == 0, proc.stderr
    assert "pvisor: warning: Claude Code 9.9.9" in proc.stderr
    assert json.loads(proc.stdout)["agent_version"] == "9.9.9"


def test_version_check_that_hangs_times_out(box):
    start = time.monotonic()
    proc = box.run(*box.std("--", "task"), mode="version-hangs")
    _one_error_line(proc, 69, "did not answer within 10 s")
    assert time.monotonic() - start < 40


def test_port_in_use(box):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]

        def go():
            proc = box.run(*box.std("--port", str(port), "--", "task"))
            _one_error_line(proc, 69, f"cannot listen on 127.0.0.1:{port}", "--port")

        _unchanged(box, go)


def test_unknown_run_to_resume(box):
    def go():
        proc = box.run(*box.std("--resume", "r-nope", "--", "more"))
        _one_error_line(proc, 2, "no run 'r-nope'")

    _unchanged(box, go)


def test_resume_of_a_run_of_another_agent_or_without_a_journal(box):
    with Journal.open(box.journal) as j:
        j.create_run(Run(id="r-codex0000001", agent="codex", labels={"session_id": "s"}))
    before = _digest(box.journal)
    proc = box.run(*box.std("--resume", "r-codex0000001", "--", "more"))
    _one_error_line(proc, 2, "captured with codex", "--agent codex")
    proc = box.run(*box.std("--resume", "r-before000001", "--", "more"))
    _one_error_line(proc, 65, "private home", "is gone")
    assert _digest(box.journal) == before
    proc = pvisor(
        ["--journal", str(box.root / "none.sqlite"), "run", *box.std("--resume", "r-x", "--", "more")],
        env=user_env(box.home),
        cwd=box.root,
    )
    _one_error_line(proc, 2, "does not exist")
    assert not (box.root / "none.sqlite").exists()


def test_resume_records_attempt_two_of_the_same_run(box):
    first = json.loads(box.run(*box.std("--json", "--", "one")).stdout)
    proc = box.run(*box.std("--json", "--resume", first["run"], "--", "two"), mode="env")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["run"] == first["run"] and rep["attempt"] == 2
    argv = (box.root / "fake.out.argv").read_text().splitlines()
    assert argv[:3] == ["--resume", "fake-session-1", "-p"] and argv[-2:] == ["--", "two"]
    with JournalReader(box.journal) as r:
        assert [(a.n, a.exit_code) for a in r.attempts(first["run"])] == [(1, 0), (2, 0)]
    # the human summary of a resume names what this attempt added (the fake agent: nothing)
    proc = box.run(*box.std("--resume", first["run"], "--", "three"))
    assert proc.returncode == 0, proc.stderr
    assert "attempt 3" in proc.stdout and "  this attempt: no step" in proc.stdout


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["--upstream", "http://127.0.0.1:9", "--script", "S", "--", "t"], 2, "not both"),
        (["--script", "S"], 2, "give the task after --"),
        (["--upstream", "ftp://example.com", "--", "t"], 2, "http://"),
        # a key pasted into the base path is not repeated (issue 35, item 8)
        (
            ["--upstream", "https://h/sk-ant-api03-Pth5Gk2Lm8Nq4Rs1Tv7Wx3Yz9Bc6Df?x=1", "--", "t"],
            2,
            "h/REDACTED?x=1",
        ),
        (["--workspace", "W/missing", "--script", "S", "--", "t"], 2, "is not a directory"),
        (["--script", "BAD", "--", "t"], 65, "not valid JSON"),
        (["--agent", "cursor"], 2, "'cursor' is not one of"),
        (["--timeout", "0", "--script", "S", "--", "t"], 2, "seconds"),
        (["--workspace", "W/afile", "--script", "S", "--", "t"], 2, "is a file"),
        (["--bogus", "--", "t"], 2, "No such option '--bogus'"),
    ],
)
def test_bad_options(box, args, code, needle):
    (box.root / "bad.json").write_text("{not json")
    (box.root / "afile").write_text("")
    args = [a.replace("BAD", str(box.root / "bad.json")).replace("W/", str(box.root) + "/") for a in args]
    args = [str(box.script) if a == "S" else a for a in args]
    base = ["--agent-entrypoint", str(box.agent)] + ([] if "--agent" in args else ["--agent", "claude-code"])

    def go():
        proc = box.run(*base, *args)
        _one_error_line(proc, code, needle)

    _unchanged(box, go)


def test_opencode_needs_a_model_with_a_real_upstream(box):
    proc = box.run(
        "--agent",
        "opencode",
        "--agent-entrypoint",
        str(box.agent),
        "--upstream",
        "http://127.0.0.1:9",
        "--",
        "t",
    )
    _one_error_line(proc, 2, "needs a model name", "--model")


@pytest.mark.parametrize(
    "mode, extra, code",
    [
        ("setsid-exit", [], 0),  # the agent exits and leaves a tool in its own session
        ("setsid-hang", ["--timeout", "1"], 124),  # the agent hangs past --timeout (and ignores SIGTERM)
    ],
)
def test_processes_the_agent_started_in_their_own_session_are_ended(box, mode, extra, code):
    proc = box.run(*box.std(*extra, "--json", "--", "start a tool"), mode=mode)
    assert proc.returncode == code, proc.stderr
    rep = json.loads(proc.stdout)
    stray = int((box.root / "fake.out").read_text())
    try:
        assert wait_gone(stray), f"the setsid'd {stray} survived pvisor"
    finally:
        try:
            os.kill(stray, 9)
        except ProcessLookupError:
            pass
    assert rep["stray_processes_killed"] >= 1
    assert "process(es) running" in proc.stderr and "pvisor ended them" in proc.stderr
    with JournalReader(box.journal) as r:
        [att] = r.attempts(rep["run"])
        assert int(att.labels["stray_processes_killed"]) >= 1


def _start_run(box, mode: str, *extra: str):
    """Start ``pvisor run`` in the background; wait until the fake agent wrote its pid."""
    import subprocess

    from agent_helpers import PVISOR

    e = user_env(box.home, FAKE_MODE=mode, FAKE_OUT=str(box.root / "fake.out"))
    proc = subprocess.Popen(
        [str(PVISOR), "--journal", str(box.journal), "run", *box.std(*extra, "--json", "--", "wait")],
        env=e,
        cwd=box.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not ((box.root / "fake.out").exists() and (box.root / "fake.out").read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("sig, code", [("SIGHUP", 129), ("SIGTERM", 143), ("SIGINT", 130)])
def test_stop_signals_stop_the_agent_and_end_the_attempt(box, sig, code):
    import signal as signals

    proc = _start_run(box, "setsid-hang")
    stray = int((box.root / "fake.out").read_text())
    try:
        proc.send_signal(getattr(signals, sig))
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err
        assert "Traceback" not in err
        rep = json.loads(out)
        assert rep["interrupted"] and rep["interrupt_signal"] == sig and rep["exit_code"] == code
        assert wait_gone(stray), "the agent's tool survived"
        with JournalReader(box.journal) as r:
            [att] = r.attempts(rep["run"])
            assert att.labels["interrupted"] == sig and att.ended_ms is not None
    finally:
        try:
            os.kill(stray, 9)
        except ProcessLookupError:
            pass


def test_a_kill_9_of_pvisor_run_takes_the_agent_and_its_tools_with_it(box):
    """Issue 17, defect 7: a `kill -9` of `pvisor run` left the agent running (its supervisor
    gone) and retrying against a gateway that was gone too. The agent gets SIGKILL when pvisor
    dies (PR_SET_PDEATHSIG) and a guard kills its process group: a scan finds none of them."""
    proc = _start_run(box, "hang")
    tool = int((box.root / "fake.out").read_text())  # the agent's `sleep 300`, in its group
    agent = next(c for c in children(proc.pid) if "fake-claude" in Path(f"/proc/{c}/cmdline").read_text())
    others = [c for c in children(proc.pid) if c != agent]  # the journal's writer, the guard
    proc.kill()
    proc.communicate(timeout=30)
    try:
        for pid, what in [
            (agent, "the agent"),
            (tool, "the agent's tool"),
            *((o, "a helper of pvisor") for o in others),
        ]:
            assert wait_gone(pid), f"{what} (pid {pid}) outlived pvisor"
    finally:
        for pid in (agent, tool):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_second_signal_cuts_the_kill_grace_short(box):
    import signal as signals

    proc = _start_run(box, "trap-hang")  # ignores SIGTERM: only SIGKILL ends it, after 5 s grace
    proc.send_signal(signals.SIGINT)
    deadline = time.monotonic() + 10
    while not (box.root / "fake.out.sig").exists():  # the agent got its SIGTERM
        assert time.monotonic() < deadline
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signals.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - start < 3, "the second Ctrl-C did not shorten the 5 s grace"


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGHUP", 129)])
def test_a_signal_during_the_version_check_exits_128_plus_n(box, sig, code):
    import signal as signals
    import subprocess

    from agent_helpers import PVISOR

    before = _digest(box.journal)
    e = user_env(box.home, FAKE_MODE="version-hangs")
    proc = subprocess.Popen(
        [str(PVISOR), "--journal", str(box.journal), "run", *box.std("--", "t")],
        env=e,
        cwd=box.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    proc.send_signal(getattr(signals, sig))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "did not answer" not in err and "Traceback" not in err
    assert _digest(box.journal) == before


def test_offline_runs_remove_every_provider_credential_from_the_agents_environment(box):
    real = {
        "OPENAI_API_KEY": "sk-real-openai",
        "GEMINI_API_KEY": "real-gemini",
        "GOOGLE_API_KEY": "real-google",
        "ANTHROPIC_API_KEY": "sk-ant-real",
        "ANTHROPIC_AUTH_TOKEN": "real-token",
        "AWS_SECRET_ACCESS_KEY": "real-aws",
        "AWS_BEARER_TOKEN_BEDROCK": "real-bedrock",
        "SOMEVENDOR_API_KEY": "real-vendor",
        "UNRELATED": "kept",
    }
    proc = box.run(*box.std("--json", "--", "print the environment"), mode="env", env=real)
    assert proc.returncode == 0, proc.stderr
    dump = (box.root / "fake.out").read_text()
    for name, value in real.items():
        if name != "UNRELATED":
            assert value not in dump, name
    seen = dict(line.split("=", 1) for line in dump.splitlines() if "=" in line)
    assert seen["ANTHROPIC_API_KEY"] == "pvisor-scripted-model-key" and seen["UNRELATED"] == "kept"
    assert "ANTHROPIC_AUTH_TOKEN" not in seen and "OPENAI_API_KEY" not in seen


def test_with_an_upstream_the_users_key_reaches_the_agent(box):
    proc = box.run(
        "--agent",
        "claude-code",
        "--agent-entrypoint",
        str(box.agent),
        "--upstream",
        "http://127.0.0.1:9",
        "--workspace",
        str(box.workspace),
        "--json",
        "--",
        "t",
        mode="env",
        env={"ANTHROPIC_API_KEY": "sk-ant-user"},
    )
    assert proc.returncode == 0, proc.stderr
    seen = dict(
        line.split("=", 1) for line in (box.root / "fake.out").read_text().splitlines() if "=" in line
    )
    assert seen["ANTHROPIC_API_KEY"] == "sk-ant-user"


def test_a_journal_locked_by_another_process_for_seconds_loses_nothing(box):
    """Another process holds the journal's write lock for 8 s (past the 5 s busy timeout) right
    after the agent's exchanges: the run waits, warns, and records everything."""
    import sqlite3
    import threading

    go = box.root / "fake.out.go"
    held = threading.Event()

    def lock():
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        conn = sqlite3.connect(box.journal, timeout=30)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        (box.root / "fake.out.held").touch()
        time.sleep(8)
        conn.rollback()
        conn.close()

    locker = threading.Thread(target=lock)
    locker.start()
    proc = box.run(*box.std("--json", "--", "three requests"), mode="lock")
    locker.join()
    assert held.is_set()
    assert proc.returncode == 0, proc.stderr
    assert "writer stopped" not in proc.stderr and "not recorded" not in proc.stderr
    assert "pvisor: warning: journal" in proc.stderr and "is locked by another process" in proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["exchanges"] == 3
    with JournalReader(box.journal) as r:
        exs = r.exchanges(rep["run"])
        assert len(exs) == 3 and all(r.response_body(e) for e in exs)
        [att] = r.attempts(rep["run"])
        assert att.exit_code == 0 and att.ended_ms is not None


@pytest.mark.parametrize(
    "where, needle",
    [
        ("task", "the task 'caf\\xe9'"),
        ("model", "--model 'm\\xff'"),
        ("workspace", "--workspace"),
        ("journal", "--journal"),
    ],
)
def test_arguments_that_are_not_utf8_are_refused_up_front(box, where, needle):
    import subprocess

    from agent_helpers import PVISOR

    bad = os.fsdecode(b"caf\xe9") if where == "task" else os.fsdecode(b"m\xff")
    journal = str(box.journal)
    args = box.std()
    if where == "model":
        args += ["--model", bad]
    elif where == "workspace":
        args[args.index("--workspace") + 1] = str(box.root) + "/" + os.fsdecode(b"w\xff")
    elif where == "journal":
        journal = str(box.root) + "/" + os.fsdecode(b"j\xff.sqlite")
    argv = [
        os.fsencode(a)
        for a in [str(PVISOR), "--journal", journal, "run", *args, "--", bad if where == "task" else "t"]
    ]
    before = _digest(box.journal)
    proc = subprocess.run(
        argv, env=user_env(box.home), cwd=box.root, capture_output=True, stdin=subprocess.DEVNULL, timeout=60
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("pvisor: error:")]
    assert needle in line and "not valid UTF-8" in line, line
    assert _digest(box.journal) == before and not (box.journal.parent / "runs").exists()


def test_env_refuses_a_model_that_is_not_utf8(box):
    import subprocess

    from agent_helpers import PVISOR

    proc = subprocess.run(
        [
            os.fsencode(str(PVISOR)),
            b"env",
            b"--agent",
            b"codex",
            b"--gateway",
            b"http://127.0.0.1:8787",
            b"--model",
            b"m\xff",
            b"--shell",
            b"json",
        ],
        env=user_env(box.home),
        cwd=box.root,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"--model 'm\\xff' is not valid UTF-8" in proc.stderr and proc.stdout == b""


def test_an_empty_resume_is_refused(box):
    def go():
        proc = box.run(*box.std("--resume", "", "--", "more"))
        _one_error_line(proc, 2, "--resume is empty")

    _unchanged(box, go)


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["env", "--agent", "codex", "--gateway", "http://127.0.0.1:8787", "--shell", "zsh"],
            "Invalid value for '--shell': 'zsh' is not one of",
        ),
        (["run"], "Missing option '--agent'"),
        (["journal", "ls", "--bogus"], "No such option '--bogus'"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_clicks_usage_errors_are_one_line_with_a_hint(box, args, needle):
    proc = pvisor(["--journal", str(box.journal), *args], env=user_env(box.home), cwd=box.root, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Usage:" not in proc.stderr, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("pvisor: error: ") and needle in line and line.endswith("--help')"), line


def test_a_bare_entrypoint_name_is_looked_up_on_path(box):
    bindir = box.root / "bin"
    bindir.mkdir()
    (bindir / "my-claude").symlink_to(box.agent)
    path = f"{bindir}:{os.environ['PATH']}"
    proc = box.run(
        "--agent",
        "claude-code",
        "--agent-entrypoint",
        "my-claude",
        "--script",
        str(box.script),
        "--workspace",
        str(box.workspace),
        "--json",
        "--",
        "t",
        env={"PATH": path},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["argv"][0] == str(bindir / "my-claude")
    proc = box.run(
        "--agent",
        "claude-code",
        "--agent-entrypoint",
        "no-such-claude",
        "--script",
        str(box.script),
        "--",
        "t",
        env={"PATH": path},
    )
    _one_error_line(proc, 69, "--agent-entrypoint no-such-claude: not on PATH")


def test_a_missing_or_yaml_script_is_named(box):
    def go():
        proc = box.run(*box.std("--", "t")[:-2], "--script", str(box.root / "nope.json"), "--", "t")
        _one_error_line(proc, 2, "--script", "nope.json: no such file")
        (box.root / "turns.yaml").write_text("turns: []\n")
        proc = box.run(
            "--agent",
            "claude-code",
            "--agent-entrypoint",
            str(box.agent),
            "--script",
            str(box.root / "turns.yaml"),
            "--",
            "t",
        )
        _one_error_line(proc, 65, "YAML is not supported", "JSON (.json) or TOML (.toml)")

    _unchanged(box, go)


def test_journal_show_quotes_the_argv(box):
    proc = box.run(*box.std("--json", "--", "a task with spaces; and $(no) expansion"))
    rep = json.loads(proc.stdout)
    show = pvisor(
        ["--journal", str(box.journal), "journal", "show", rep["run"]],
        env=user_env(box.home),
        cwd=box.root,
        timeout=60,
    )
    assert show.returncode == 0, show.stderr
    [line] = [line for line in show.stdout.splitlines() if line.strip().startswith("argv:")]
    assert line.strip().endswith("-- 'a task with spaces; and $(no) expansion'"), line


# --------------------------------------------------------------------------- a handoff's child run


def _pending_child(box, child: str = "child-1") -> None:
    """A handoff's child run ``child`` in the box's journal, pending (as restore_handoff leaves it)."""
    with Journal.open(box.journal) as j:
        j.create_run(Run(id=child, mode="handoff", parent_run="r-before000001", boundary_step=0))


def test_two_starts_of_one_child_run_at_once_run_it_once(box):
    """Two `pvisor run --child-run child-1` made at the same moment (both past the checks, held
    at the agent's version check until both are there): the journal gives the child run to one
    of them; the other is refused as a start made later is (exit 2), before its agent starts.
    One attempt, one agent, the winner's output files."""
    _pending_child(box)
    gate = box.root / "gate"
    env = user_env(box.home, FAKE_MODE="count", FAKE_OUT=str(box.root / "ran"), FAKE_GATE=str(gate))
    cmd = [str(PVISOR), "--journal", str(box.journal), "run", *box.std("--child-run", "child-1", "--", "go")]
    procs = start_together([cmd, cmd], gate, env=env, cwd=box.root, timeout=120)
    assert len(list(box.root.glob("gate.arrived.*"))) == 2  # both were past the checks at once
    assert sorted(p.returncode for p in procs) == [0, 2], [(p.returncode, p.stderr) for p in procs]
    [loser] = [p for p in procs if p.returncode == 2]
    _one_error_line(
        loser, 2, "--child-run child-1: the handoff's child run child-1 was started already (attempt 1"
    )
    assert len((box.root / "ran").read_text().splitlines()) == 1  # one agent ran
    with JournalReader(box.journal) as r:
        [attempt] = r.attempts("child-1")
        assert attempt.exit_code == 0 and r.run_status(r.run("child-1")) == "ended"
        assert "claimed_by_pid" not in attempt.labels and attempt.labels["stdout"].endswith(
            "attempt-1.stdout"
        )
    later = box.run(*box.std("--child-run", "child-1", "--", "go"))
    _one_error_line(later, 2, loser.stderr.split(" (attempt 1")[0].removeprefix("pvisor: error: "))


def test_a_child_run_start_that_fails_before_the_agent_gives_it_back(box):
    """A start that fails before its agent runs (the gateway's port is taken, exit 69) leaves the
    child run pending: started again, it runs."""
    _pending_child(box)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = box.run(*box.std("--child-run", "child-1", "--port", str(port), "--", "go"), mode="count")
    _one_error_line(proc, 69, f"cannot listen on 127.0.0.1:{port}")
    with JournalReader(box.journal) as r:
        assert r.attempts("child-1") == [] and r.run_status(r.run("child-1")) == "pending"
    again = box.run(*box.std("--child-run", "child-1", "--", "go"), mode="count")
    assert again.returncode == 0, again.stderr
    assert len((box.root / "fake.out").read_text().splitlines()) == 1


def test_a_huge_child_run_id_is_shown_shortened(box):
    """A child run id of 120 KB on the command line (the most one argument can hold), or of
    200 KB given to the Python API (a file pasted by mistake), is named in one short line."""
    from pvisor.core.errors import UsageError
    from pvisor.session import continue_run

    proc = box.run(*box.std("--child-run", "a" * 120_000, "--", "go"))
    _one_error_line(proc, 2, "--child-run aaaa", "(120000 characters): not a run id")
    assert len(proc.stderr) < 400, len(proc.stderr)
    with pytest.raises(UsageError) as exc:
        continue_run(
            "r-before000001",
            0,
            box.workspace,
            "http://127.0.0.1:9",
            agent="claude-code",
            journal=box.journal,
            child_run="b" * 200_000,
        )
    said = exc.value.message
    assert said.startswith("child_run='bbbb") and "(200002 characters): not a run id" in said, said[:300]
    assert len(said) < 400 and "\n" not in said
