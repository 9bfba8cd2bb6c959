"""``pvisor env``: the snippet for each agent, in bash, fish and JSON; and two real round trips:
the bash snippet pasted into a shell points the pinned Claude Code and Codex CLI, with their
user's own home, at a running ``pvisor gateway`` (in front of ``pvisor serve-model``), and
their sessions land in the journal under the run id of the snippet."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent_helpers import FILES, PVISOR, TASK, entrypoint, pvisor, script_for, user_env
from pvisor.journal.reader import JournalReader

GATEWAY = "http://127.0.0.1:8787"
AGENTS = ["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent"]


def _env(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = user_env(tmp_path)
    env.pop("NO_PROXY", None)  # the snippets add the user's own entries: none here
    env.pop("no_proxy", None)
    return pvisor(
        ["--journal", str(tmp_path / "data" / "journal.sqlite"), "env", *args], env=env, cwd=tmp_path
    )


@pytest.mark.parametrize("agent", AGENTS)
def test_snippets_carry_the_run_id_in_the_base_url(tmp_path, agent):
    bash = _env(tmp_path, "--agent", agent, "--gateway", GATEWAY + "/", "--run", "fix-1")
    assert bash.returncode == 0, bash.stderr
    assert f"{GATEWAY}/run/fix-1" in bash.stdout
    doc = json.loads(
        _env(tmp_path, "--agent", agent, "--gateway", GATEWAY, "--run", "fix-1", "--shell", "json").stdout
    )
    assert doc["agent"] == agent and doc["run"] == "fix-1" and doc["base_url"] == f"{GATEWAY}/run/fix-1"
    assert doc["env"]["NO_PROXY"] == "127.0.0.1,localhost,::1"
    fish = _env(tmp_path, "--agent", agent, "--gateway", GATEWAY, "--run", "fix-1", "--shell", "fish")
    assert (
        fish.returncode == 0
        and "set -gx NO_PROXY 127.0.0.1,localhost,::1" in fish.stdout
        and "export " not in fish.stdout
    )
    # the user's own NO_PROXY entries stay (either spelling), the loopback names are added
    mine = pvisor(
        ["--journal", str(tmp_path / "data" / "journal.sqlite"), "env", "--agent", agent, "--gateway", GATEWAY,
         "--shell", "json"],
        env=user_env(tmp_path, NO_PROXY="corp.example,localhost", no_proxy="lower.example"), cwd=tmp_path,
    )  # fmt: skip
    assert json.loads(mine.stdout)["env"]["NO_PROXY"] == "corp.example,localhost,lower.example,127.0.0.1,::1"
    # bash: every export and here-doc is valid shell; nothing outside the data dir is written
    check = subprocess.run(["bash", "-n"], input=bash.stdout, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    for f in doc["files"]:
        assert f["path"].startswith(str(tmp_path / "data" / "runs" / "fix-1")), f["path"]
    assert not (tmp_path / "data").exists()  # pvisor env writes nothing itself


def test_a_gateway_beyond_this_machine_is_given_with_its_token(tmp_path):
    """The URL a gateway with --allow-remote prints (/t/<token>) is the one path --gateway takes."""
    remote = "http://gpu-box:8787/t/PvTokenForTheTest_0123456789-abc"
    doc = json.loads(
        _env(
            tmp_path, "--agent", "claude-code", "--gateway", remote, "--run", "fix-1", "--shell", "json"
        ).stdout
    )
    assert doc["base_url"] == f"{remote}/run/fix-1"
    p = _env(tmp_path, "--agent", "claude-code", "--gateway", "http://gpu-box:8787/t/short")
    assert p.returncode == 2 and "without a path of your own" in p.stderr


def test_codex_gets_its_provider_as_one_line_overrides(tmp_path):
    doc = json.loads(
        _env(tmp_path, "--agent", "codex", "--gateway", GATEWAY, "--run", "c1", "--shell", "json").stdout
    )
    argv = doc["argv"]
    assert argv[0] == "codex" and argv[1] == "-c" and argv[2].startswith("model_providers.pvisor={")
    assert f'base_url="{GATEWAY}/run/c1/v1"' in argv[2] and 'wire_api="responses"' in argv[2]
    assert argv[3:] == ["-c", 'model_provider="pvisor"']


def test_a_new_run_id_when_none_is_given_and_bad_input(tmp_path):
    a = json.loads(_env(tmp_path, "--agent", "claude-code", "--gateway", GATEWAY, "--shell", "json").stdout)
    b = json.loads(_env(tmp_path, "--agent", "claude-code", "--gateway", GATEWAY, "--shell", "json").stdout)
    assert a["run"].startswith("r-") and a["run"] != b["run"]
    for args, needle in (
        (["--gateway", "ftp://x"], "http://"),
        (["--gateway", GATEWAY + "/run/x"], "without a path"),
        (["--gateway", GATEWAY, "--run", "bad id"], "run id"),
    ):
        proc = _env(tmp_path, "--agent", "claude-code", *args)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _wait_ready(path: Path, proc: subprocess.Popen, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail(f"{path} never appeared")


@pytest.fixture
def live_gateway(tmp_path):
    """``pvisor gateway`` in front of two ``pvisor serve-model`` (Anthropic for Claude Code,
    OpenAI for Codex), as subprocesses; stopped with SIGTERM at the end."""
    procs = []
    urls = {}
    for agent, upstream in (("claude-code", "anthropic"), ("codex", "openai")):
        script = tmp_path / f"{agent}.json"
        script.write_text(json.dumps(script_for(agent)))
        ready = tmp_path / f"{agent}.ready"
        p = subprocess.Popen(
            [str(PVISOR), "serve-model", "--script", str(script), "--port", "0", "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(p)
        urls[upstream] = _wait_ready(ready, p)["url"]
    journal = tmp_path / "data" / "journal.sqlite"
    ready = tmp_path / "gateway.ready"
    gw = subprocess.Popen(
        [
            str(PVISOR),
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--upstream",
            f"anthropic={urls['anthropic']}",
            "--upstream",
            f"openai={urls['openai']}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = _wait_ready(ready, gw)["url"]
    try:
        yield url, journal
    finally:
        for p in [gw, *procs]:
            p.send_signal(signal.SIGTERM)
        for p in [gw, *procs]:
            p.wait(30)


# The user's own agent invocation after the snippet: the snippet's last line calls the agent,
# which a shell function of the same name turns into a headless run of the pinned binary.
WRAPPERS = {
    "claude-code": 'claude() { "$REAL" "$@" -p "$TASK" --output-format stream-json --verbose --allowedTools Bash --model claude-sonnet-4-5; }',
    # the user's own config would say these; here the home is empty and the machine offline
    "codex": (
        'codex() { "$REAL" "$@" -c approval_policy=\'"never"\' -c sandbox_mode=\'"danger-full-access"\' -c features.plugins=false '
        '-c check_for_update_on_startup=false exec --skip-git-repo-check --json "$TASK"; }'
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_bash_snippet_points_the_real_agent_at_the_gateway(tmp_path, live_gateway, agent):
    url, journal = live_gateway
    run_id = f"env-{agent}"
    # Codex's default model (with an empty home) sends its tools as `additional_tools` input items,
    # which the scripted model does not offer its shell tool from: name a model, as a user would
    model = ["--model", "gpt-5-codex"] if agent == "codex" else []
    snippet = _env(tmp_path, "--agent", agent, "--gateway", url, "--run", run_id, *model).stdout
    home = tmp_path / "user-home"
    workspace = tmp_path / f"ws-{agent}"
    home.mkdir()
    workspace.mkdir()
    env = user_env(
        home,
        REAL=str(entrypoint(agent)),
        TASK=TASK,
        ANTHROPIC_API_KEY="dummy-user-key",
        OPENAI_API_KEY="dummy-user-key",
    )
    proc = subprocess.run(
        ["bash", "-c", WRAPPERS[agent] + "\n" + snippet],
        env=env,
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name, content in FILES.items():
        assert (workspace / name).read_text() == content
    deadline = time.monotonic() + 10
    while True:  # the gateway commits within 100 ms; poll with a deadline
        with JournalReader(journal) as r:
            exchanges = r.exchanges(run_id) if any(run.id == run_id for run in r.runs()) else []
        if len(exchanges) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [e.outcome for e in exchanges] == ["ok"] * 3, [(e.path, e.outcome) for e in exchanges]
    assert {e.path for e in exchanges} == {"/v1/messages" if agent == "claude-code" else "/v1/responses"}
    assert b"dummy-user-key" not in b"".join(f.read_bytes() for f in journal.parent.glob("journal.sqlite*"))
