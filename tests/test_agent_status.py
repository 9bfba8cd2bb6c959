"""Each agent's own account of how its run ended (issue 19): read by its launch profile
(``final_status``) from its JSON stdout or its native trajectory, shown in ``pvisor run``'s
summary and ``--json`` (``agent_status``), kept in the attempt's labels; an agent that exits 0
but says it failed makes ``pvisor run`` exit 1, and one that exits non-zero with its reason on
stdout has that reason named on stderr. The real agents run against the scripted model (an
error it answers, or text where mini-swe-agent wants a command); Claude Code runs live without
a key, which it reports on stdout only. The readers get bad output too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_captures import _run
from agent_helpers import entrypoint, pvisor, user_env

from pvisor.adapters.agents import get_profile
from pvisor.adapters.agents.base import STATUS_DETAIL_CHARS, AgentOutcome, CREDENTIAL_ENV
from pvisor.journal.reader import JournalReader

ERROR_SCRIPT = {
    "turns": [
        {
            "error": {"status": 400,
                      "body": {"error": {"message": "bad request from script",
                                         "type": "invalid_request_error"}}},
            "repeat": 40,
        },
        {"text": "never"},
    ]
}  # fmt: skip


def _setup(tmp_path: Path, script: dict) -> tuple[Path, Path, Path, Path]:
    ws, home, data = tmp_path / "ws", tmp_path / "home", tmp_path / "data"
    for d in (ws, home, data):
        d.mkdir()
    (tmp_path / "s.json").write_text(json.dumps(script))
    return ws, home, data / "journal.sqlite", tmp_path / "s.json"


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["codex", "gemini-cli", "opencode", "qwen-code"])
def test_an_agent_that_fails_says_why_and_pvisor_names_it(tmp_path: Path, agent: str):
    """The model answers 400: each agent exits non-zero and says why on its stdout; the summary,
    ``--json`` and the attempt's labels carry it, and stderr names the reason."""
    ws, home, journal, script = _setup(tmp_path, ERROR_SCRIPT)
    proc, report = _run(agent, tmp_path, journal, ws, home, script, "write a.txt")
    assert report["agent_exit_code"] not in (0, None), report
    assert report["exit_code"] == report["agent_exit_code"]
    own = report["agent_status"]
    assert own["outcome"] == "failed" and "bad request from script" in own["detail"], own
    assert "stdout" in own["source"]
    assert f"exited with code {report['agent_exit_code']}: " in proc.stderr
    assert "bad request from script" in proc.stderr, proc.stderr
    with JournalReader(journal) as r:
        (attempt,) = r.attempts(report["run"])
    assert attempt.labels["agent_outcome"] == "failed" and "bad request" in attempt.labels["agent_detail"]


@pytest.mark.slow
def test_mini_swe_agent_failing_while_exiting_0_is_no_success(tmp_path: Path):
    """Text where it wants a command: mini-swe-agent gives up with RepeatedFormatError in its
    trajectory's info.exit_status and exits 0; pvisor run exits 1 and says so, in the summary
    as in --json."""
    ws, home, journal, script = _setup(tmp_path, {"turns": [{"text": "I will only talk.", "repeat": 40}]})
    proc, report = _run("mini-swe-agent", tmp_path, journal, ws, home, script, "write a.txt")
    assert report["agent_exit_code"] == 0 and report["exit_code"] == 1 and proc.returncode == 1
    assert report["agent_status"] == {
        "outcome": "failed",
        "detail": "RepeatedFormatError",
        "source": "info.exit_status of its trajectory",
    }
    assert "mini-swe-agent exited 0 but failed by its own account: RepeatedFormatError" in proc.stderr
    assert report["native_trajectory"] in proc.stderr
    human = pvisor(
        ["--journal", str(journal), "run", "--agent", "mini-swe-agent", "--agent-entrypoint",
         str(entrypoint("mini-swe-agent")), "--script", str(script), "--workspace", str(ws),
         "--", "write a.txt"],
        env=user_env(home), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert human.returncode == 1
    assert "agent: exit code 0; by its own account: failed (RepeatedFormatError)" in human.stdout


@pytest.mark.slow
def test_claude_code_without_a_key_names_its_reason_not_an_empty_stderr(tmp_path: Path):
    """A live run with no key and no login: Claude Code prints "Not logged in" in its result
    line on stdout, exits 1 and writes nothing to stderr; pvisor's error line quotes the reason
    and points at stdout. Nothing is sent anywhere (it does not try without a login)."""
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir(), home.mkdir()
    env = {k: v for k, v in user_env(home).items() if k not in CREDENTIAL_ENV}
    proc = pvisor(
        ["--journal", str(tmp_path / "j.sqlite"), "run", "--agent", "claude-code", "--agent-entrypoint",
         str(entrypoint("claude-code")), "--model", "claude-sonnet-4-5", "--workspace", str(ws),
         "--timeout", "120", "--json", "--", "write a.txt"],
        env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["agent_exit_code"] == 1
    assert Path(report["stderr"]).read_bytes() == b""  # what the user was pointed at before
    own = report["agent_status"]
    assert own["outcome"] == "failed" and own["detail"].startswith("Not logged in"), own
    assert (
        f"claude-code exited with code 1: {own['detail']} (the result line of its stdout: {report['stdout']}"
        in (proc.stderr)
    )


# --------------------------------------------------------------------------- the readers, on bad output


@pytest.mark.parametrize("agent", ["claude-code", "qwen-code", "gemini-cli", "codex", "opencode"])
@pytest.mark.parametrize(
    "stdout",
    [b"", b"\xff\xfe not utf-8\n", b'{"type": "result", "is_err', b"x" * 2_000_000, b"[1, 2]\n", b"null\n"],
    ids=["empty", "non-utf8", "truncated", "huge-line", "array", "null"],
)
def test_output_that_says_nothing_is_unknown_never_an_error(agent: str, stdout: bytes):
    own = get_profile(agent).final_status(stdout, None)
    assert own.outcome is AgentOutcome.UNKNOWN and own.detail is None and own.source


def test_a_reason_is_one_short_line_without_keys_or_escape_sequences():
    key = "sk-ant-api03-" + "Q" * 40
    line = {"type": "result", "is_error": True, "result": f"bad key {key}\n\x1b[31mred\x1b[0m " + "y" * 900}
    own = get_profile("claude-code").final_status(json.dumps(line).encode() + b"\n", None)
    assert own.outcome is AgentOutcome.FAILED
    assert key not in own.detail and "\x1b" not in own.detail and "\n" not in own.detail
    assert (
        own.detail.startswith("bad key <redacted> [31mred [0m y") and len(own.detail) == STATUS_DETAIL_CHARS
    )
    # a failure with no reason given still fails
    bare = get_profile("qwen-code").final_status(b'{"type":"result","is_error":true}\n', None)
    assert bare.outcome is AgentOutcome.FAILED and bare.detail is None


def test_the_last_word_counts(tmp_path: Path):
    """A Codex turn that failed after one that completed failed; an OpenCode run whose last
    step finished for tool calls says nothing; mini-swe-agent's missing or broken trajectory."""
    codex = get_profile("codex")
    done, failed = b'{"type":"turn.completed"}\n', b'{"type":"turn.failed","error":{"message":"boom"}}\n'
    assert codex.final_status(done + failed, None).outcome is AgentOutcome.FAILED
    assert codex.final_status(failed + done, None).outcome is AgentOutcome.SUCCEEDED
    opencode = get_profile("opencode")
    step = b'{"type":"step_finish","part":{"reason":"tool-calls"}}\n'
    assert opencode.final_status(step, None).outcome is AgentOutcome.UNKNOWN
    mini = get_profile("mini-swe-agent")
    assert mini.final_status(b"", None).source == "it saved no trajectory"
    bad = tmp_path / "t.json"
    bad.write_bytes(b"\xff{")
    assert mini.final_status(b"", bad).outcome is AgentOutcome.UNKNOWN
    bad.write_text('{"info": {"exit_status": "LimitsExceeded"}}')
    assert (mini.final_status(b"", bad).outcome, mini.final_status(b"", bad).detail) == (
        AgentOutcome.FAILED,
        "LimitsExceeded",
    )
    assert get_profile("claude-code").final_status(b"", None).source == "no result line on its stdout"


@pytest.mark.slow
def test_the_run_summary_names_its_paths_escaped(tmp_path: Path):
    """`pvisor run`'s summary printed the workspace and the agent's output files raw: a workspace
    named with ESC and BEL drove the terminal (issue 35's new-user round). The same run as the
    test above (no key: Claude Code ends at once), its paths now escaped."""
    ws, home = tmp_path / "w\x1b]0;pwned\x07s", tmp_path / "home"
    ws.mkdir(), home.mkdir()
    env = {k: v for k, v in user_env(home).items() if k not in CREDENTIAL_ENV}
    proc = pvisor(
        ["--journal", str(tmp_path / "j.sqlite"), "run", "--agent", "claude-code", "--agent-entrypoint",
         str(entrypoint("claude-code")), "--model", "claude-sonnet-4-5", "--workspace", str(ws),
         "--timeout", "120", "--", "write a.txt"],
        env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout, proc.stdout
    assert f"  workspace: {tmp_path}/w\\x1b]0;pwned\\x07s\n" in proc.stdout, proc.stdout
    assert "  agent output: " in proc.stdout
