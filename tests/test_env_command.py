"""``pvisor env``: the snippet for each agent, in bash, fish and JSON; and real round trips: the
bash snippet pasted into a shell points each of the six pinned agent CLIs, with their user's own
home, at a running ``pvisor gateway`` (in front of ``pvisor serve-model``); their sessions land
in the journal under the run id of the snippet, and replay without ``--task``."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from agent_helpers import FILES, PVISOR, TASK, entrypoint, pvisor, script_for, user_env
from cli_helpers import pvisor_main
from pvisor.adapters.agents import get_descriptor
from pvisor.journal.reader import JournalReader

GATEWAY = "http://127.0.0.1:8787"
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "result-schema.json").read_text())
AGENTS = ["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent"]


def _env(tmp_path: Path, *args: str):
    """``pvisor env ARGS`` in this process (tests/cli_helpers.py), output as text."""
    env = user_env(tmp_path)
    env.pop("NO_PROXY", None)  # the snippets add the user's own entries: none here
    env.pop("no_proxy", None)
    return pvisor_main(
        ["--journal", str(tmp_path / "data" / "journal.sqlite"), "env", *args],
        env=env,
        cwd=tmp_path,
        text=True,
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
    mine = pvisor_main(
        ["--journal", str(tmp_path / "data" / "journal.sqlite"), "env", "--agent", agent,
         "--gateway", GATEWAY, "--shell", "json"],
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


@dataclass
class EnvCapture:
    """A session captured as a user captures one: ``pvisor gateway`` running, the snippet of
    ``pvisor env`` pasted into a shell, the agent started there headless. ``proc`` is that shell;
    ``journal``, ``run`` (the snippet's run id), ``workspace`` and ``home`` (the user's) are where
    the session went."""

    agent: str
    root: Path
    journal: Path
    run: str
    workspace: Path
    home: Path
    proc: subprocess.CompletedProcess


# The user's own agent invocation after the snippet: the snippet's last line calls the agent,
# which a shell function of the same name turns into a headless run of the pinned binary, with
# what the user's own config would say (here the home is empty and the machine offline).
WRAPPERS = {
    "claude-code": (
        'claude() { "$REAL" "$@" -p "$TASK" --output-format stream-json --verbose --allowedTools Bash '
        "--model claude-sonnet-4-5; }"
    ),
    "codex": (
        'codex() { "$REAL" "$@" -c approval_policy=\'"never"\' -c sandbox_mode=\'"danger-full-access"\' '
        "-c features.plugins=false -c check_for_update_on_startup=false exec --skip-git-repo-check "
        '--json "$TASK"; }'
    ),
    "gemini-cli": 'gemini() { "$REAL" "$@" -p "$TASK" --output-format stream-json --yolo; }',
    "opencode": 'opencode() { "$REAL" "$@" run "$TASK"; }',
    "qwen-code": 'qwen() { "$REAL" "$@" --yolo --output-format stream-json -p "$TASK"; }',
    "mini-swe-agent": 'mini() { "$REAL" "$@" -t "$TASK" --yolo --exit-immediately -o "$HOME/t.json"; }',
}
#: the model each agent is pointed at (``pvisor env --model``): Codex's default model (with an
#: empty home) sends its tools as `additional_tools` input items, which the scripted model does
#: not offer its shell tool from; Gemini CLI and Qwen Code need one named
MODELS = {"codex": "gpt-5-codex", "gemini-cli": "gemini-2.5-pro", "qwen-code": "mock-model"}


def _user_config(agent: str, home: Path) -> dict[str, str]:
    """What the user's own set-up gives ``agent`` (files in ``home``; returned: environment)."""
    if agent == "gemini-cli":
        from pvisor.adapters.agents.gemini_cli import SETTINGS

        (home / ".gemini").mkdir()
        (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
        return {"GEMINI_API_KEY": "dummy-user-key", "GEMINI_CLI_TRUST_WORKSPACE": "true"}
    if agent == "qwen-code":
        from pvisor.adapters.agents.qwen_code import SETTINGS

        (home / ".qwen").mkdir()
        (home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS))
        return {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
    if agent == "mini-swe-agent":
        from pvisor.adapters.agents.mini_swe_agent import QUIET_ENV

        return {**QUIET_ENV, "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".config" / "mini-swe-agent")}
    return {}


def _start(args: list[str], ready: Path) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(
        [str(PVISOR), *args, "--port", "0", "--ready-file", str(ready)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return p, _wait_ready(ready, p)["url"]


def capture_through_env(root: Path, agent: str, script: dict) -> EnvCapture:
    """``pvisor gateway`` in front of ``pvisor serve-model --script``, both subprocesses, the
    snippet of ``pvisor env`` pasted into bash, ``agent`` run there in ``root/ws-AGENT`` with the
    user's home ``root/user-home``; the gateway is stopped (SIGTERM) once the agent exited."""
    (root / "script.json").write_text(json.dumps(script))
    scripted, model_url = _start(["serve-model", "--script", str(root / "script.json")], root / "model.ready")
    journal = root / "data" / "journal.sqlite"
    upstreams = [
        a for name in ("anthropic", "openai", "gemini") for a in ("--upstream", f"{name}={model_url}")
    ]
    procs = [scripted]
    try:
        gw, url = _start(["--journal", str(journal), "gateway", *upstreams], root / "gateway.ready")
        procs.insert(0, gw)
        run_id = f"env-{agent}"
        extra = ["--model", MODELS[agent]] if agent in MODELS else []
        snippet = _env(root, "--agent", agent, "--gateway", url, "--run", run_id, *extra)
        assert snippet.returncode == 0, snippet.stderr
        home, workspace = root / "user-home", root / f"ws-{agent}"
        home.mkdir()
        workspace.mkdir()
        env = user_env(
            home,
            REAL=str(entrypoint(agent)),
            TASK=TASK,
            ANTHROPIC_API_KEY="dummy-user-key",
            OPENAI_API_KEY="dummy-user-key",
            **_user_config(agent, home),
        )
        proc = subprocess.run(
            ["bash", "-c", WRAPPERS[agent] + "\n" + snippet.stdout],
            env=env,
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
    return EnvCapture(agent, root, journal, run_id, workspace, home, proc)


def short_script(agent: str) -> dict:
    """The agent tests' script (tests/agent_helpers.py) without its batch: one shell call that
    writes a.txt, then the end (mini-swe-agent: its submit command)."""
    script = script_for(agent)
    script["turns"] = [script["turns"][0], script["turns"][2]]
    return script


@pytest.fixture(scope="module")
def env_capture(tmp_path_factory):
    """``env_capture(agent)``: the agent's session captured through ``pvisor gateway`` and
    ``pvisor env`` (:func:`capture_through_env`, :func:`short_script`), made once per module and
    shared by its tests."""
    cache: dict[str, EnvCapture] = {}

    def get(agent: str) -> EnvCapture:
        if agent not in cache:
            cache[agent] = capture_through_env(
                tmp_path_factory.mktemp(f"env-{agent}"), agent, short_script(agent)
            )
        return cache[agent]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_bash_snippet_points_the_real_agent_at_the_gateway(env_capture, agent):
    cap = env_capture(agent)
    proc, journal, run_id, workspace = cap.proc, cap.journal, cap.run, cap.workspace
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (workspace / "a.txt").read_text() == FILES["a.txt"]
    with JournalReader(journal) as r:
        exchanges = r.exchanges(run_id)
    assert [e.outcome for e in exchanges] == ["ok"] * 2, [(e.path, e.outcome) for e in exchanges]
    assert {e.path for e in exchanges} == {"/v1/messages" if agent == "claude-code" else "/v1/responses"}
    assert b"dummy-user-key" not in b"".join(f.read_bytes() for f in journal.parent.glob("journal.sqlite*"))


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS)
def test_a_session_captured_through_the_gateway_replays_without_task(env_capture, agent, tmp_path):
    """A run the gateway captured holds no task label and no command line: replay-only reads
    the task from its first request through the agent's descriptor (Gemini CLI's context in the
    same message, OpenCode's quotes, mini-swe-agent's template) and starts the agent with the
    very task it was given, without --task."""
    cap = env_capture(agent)
    assert cap.proc.returncode == 0, cap.proc.stdout[-2000:] + cap.proc.stderr[-2000:]
    with JournalReader(cap.journal) as r:
        recorded = r.run(cap.run)
    assert "task" not in recorded.labels and not recorded.argv  # nothing but the requests hold it
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", agent, "--run", cap.run, "--after-step", "1",
         "--replay-only", "--workspace", str(ws), "--output", str(out), "--agent-entrypoint",
         str(entrypoint(agent)), "--timeout", "240"],
        env=user_env(cap.home), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "ok" and result["playback"]["task_origin"] == "request"
    assert "; the task read from its first request;" in proc.stdout, proc.stdout
    # the agent was started with the original task, and its request 1 carried it
    with JournalReader(cap.journal) as r:
        derived = r.run(result["derived_run"])
    assert derived.labels["task"] == TASK
    assert get_descriptor(agent).task_from_argv(list(derived.argv)) == TASK
    assert result["divergence"] is None and (ws / "a.txt").read_text() == FILES["a.txt"]
    # pvisor did not start the agent: the run keeps no start environment, and the result says so
    state = result["start_state"]
    assert state["environment"] == "not_recorded" and "pvisor gateway" in state["environment_why"]
    (said,) = [w["message"] for w in result["warnings"] if w["code"] == "no_recorded_environment"]
    assert said.startswith(f"run {cap.run} has no recorded start environment") and said in proc.stderr


def copy_capture(cap: EnvCapture, journal: Path, edit) -> str:
    """The run of ``cap`` recorded again into ``journal`` as the gateway recorded it (the same
    run fields, exchanges and reply bytes), each request body passed through ``edit(body)``
    first (the body as JSON, changed in place). Returns the run id."""
    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal.model import Attempt, Run
    from pvisor.journal.writer import Journal

    with JournalReader(cap.journal) as r:
        run = r.run(cap.run)
        exchanges = [(ex, r.request_body(ex), r.response_body(ex, raw=True)) for ex in r.exchanges(cap.run)]
    with Journal.open(journal, finalize=finalize_response) as j:
        j.create_run(
            Run(id=run.id, agent=run.agent, agent_version=run.agent_version, labels=dict(run.labels))
        )
        j.start_attempt(Attempt(run=run.id, n=1))
        for ex, request, response in exchanges:
            body = json.loads(request)
            edit(body)
            j.record_exchange(
                run.id,
                ex.method,
                ex.path,
                list(ex.request_headers.items()),
                query=ex.query,
                attempt=1,
                protocol=ex.protocol,
                status=ex.status,
                request_body=json.dumps(body).encode(),
                response_body=response,
                streamed=ex.streamed,
                response_headers=list(ex.response_headers.items()),
            )
        j.end_attempt(run.id, 1, 0)
        j.flush()
    return run.id


def _replay_only(
    cap: EnvCapture, journal: Path, run: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess, Path]:
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(journal), "replay", "--agent", cap.agent, "--run", run, "--after-step", "1",
         "--replay-only", "--workspace", str(ws), "--output", str(out), "--agent-entrypoint",
         str(entrypoint(cap.agent)), "--timeout", "240"],
        env=user_env(cap.home), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    return proc, out


#: what Claude Code 1.x put after the prompt in its first user message
TODO_REMINDER = (
    "<system-reminder>\nThis is a reminder that your todo list is currently empty. DO NOT mention this "
    "to the user explicitly because they are not aware of it.\n</system-reminder>"
)


@pytest.mark.slow
def test_a_reminder_after_the_prompt_is_never_the_task(env_capture, tmp_path):
    """A Claude Code capture whose first user message holds a reminder after the prompt (the
    request of the real Claude Code capture with the reminder of 1.x added after it): replay
    without --task starts the agent with the prompt, and its request 1 repeats the recorded
    prompt. Before: the reminder was the task (the last text), the derived run's label and
    command line held it, status ok."""
    cap = env_capture("claude-code")
    assert cap.proc.returncode == 0, cap.proc.stdout[-2000:] + cap.proc.stderr[-2000:]

    def remind_after_the_prompt(body: dict) -> None:
        content = body["messages"][0]["content"]
        at = next(i for i, b in enumerate(content) if b.get("type") == "text" and b["text"] == TASK)
        content.insert(at + 1, {"type": "text", "text": TODO_REMINDER})

    journal = tmp_path / "copy" / "journal.sqlite"
    journal.parent.mkdir()
    run = copy_capture(cap, journal, remind_after_the_prompt)
    proc, out = _replay_only(cap, journal, run, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["playback"]["task_origin"] == "request"
    with JournalReader(journal) as r:
        derived = r.run(result["derived_run"])
    assert (
        derived.labels["task"] == TASK
        and get_descriptor("claude-code").task_from_argv(list(derived.argv)) == TASK
    )


@pytest.mark.slow
def test_a_task_too_long_for_the_command_line_goes_to_codex_on_stdin(env_capture, tmp_path):
    """A first request whose prompt is more than one argument of a command line holds (140,000
    bytes): Codex reads its task on stdin when given `-` (its --help says so), and replay gives
    it there. Before: cannot start .../codex: Argument list too long, agent_unavailable (69)."""
    cap = env_capture("codex")
    assert cap.proc.returncode == 0, cap.proc.stdout[-2000:] + cap.proc.stderr[-2000:]
    big = (TASK + " ") * (140_000 // (len(TASK) + 1)) + "Then stop."

    def long_prompt(body: dict) -> None:
        for item in body["input"]:
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("text") == TASK:
                    part["text"] = big

    journal = tmp_path / "copy" / "journal.sqlite"
    journal.parent.mkdir()
    run = copy_capture(cap, journal, long_prompt)
    proc, out = _replay_only(cap, journal, run, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["divergence"] is None
    with JournalReader(journal) as r:
        derived = r.run(result["derived_run"])
    assert derived.labels["task"] == big and derived.argv[-2:] == ["--", "-"]
