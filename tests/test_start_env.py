"""The start environment's rules (pvisor/session/start_env.py, docs/journal.md "The start
environment"): what ``pvisor run`` records of the agent's environment and what a replay sets
again. The real capture and replays are tests/test_start_state.py."""

from __future__ import annotations

from pathlib import Path

from pvisor.session.start_env import SCHEMA, recorded_environment, replay_variables

#: the user's environment as pvisor got it
USER = {
    "VAR": "from-the-start",
    "LANG": "C.UTF-8",
    "PROJECT_DIR": "/old/ws/src",
    "PATH": "/usr/bin",
    "HOME": "/home/me",
    "SHLVL": "2",
    "TERM": "xterm-256color",
    "SSH_AUTH_SOCK": "/tmp/ssh-1/agent",
    "XDG_CONFIG_HOME": "/home/me/.config",
    "PVISOR_JOURNAL": "/data/j.sqlite",
    "OPENAI_API_KEY": "sk-proj-abcdefghijklmnop0123",
    "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "DB_PASS": "plainpassword",
    "SSH_KEY_PATH": "/home/me/.ssh/id",
    "NOTE": "use sk-ant-api03-abcdefghij0123456789 here",
    "DATABASE_URL": "postgres://admin:pw@db/app",
    "PUBLIC_URL": "https://example.org/app",
    "HUGE": "x" * 9000,
    "BAD": "caf\udce9",
}


def test_the_user_s_variables_are_recorded_and_nothing_that_may_be_a_secret():
    # what pvisor set or changed for the run: never recorded (its launch sets them again)
    env = {**USER, "HOME": "/runs/r-1/home", "OPENAI_BASE_URL": "http://127.0.0.1:1/r", "PWD": "/old/ws"}
    doc = recorded_environment(USER, env, Path("/old/ws"))
    assert doc["schema"] == SCHEMA and doc["cwd"] == "/old/ws"
    assert doc["variables"] == {
        "LANG": "C.UTF-8",
        "PROJECT_DIR": "/old/ws/src",
        "PUBLIC_URL": "https://example.org/app",
        "VAR": "from-the-start",
    }
    assert doc["left_out"] == {
        "BAD": "not_utf8",
        "DATABASE_URL": "secret",
        "DB_PASS": "secret",
        "GITHUB_TOKEN": "secret",
        "HUGE": "too_long",
        "NOTE": "secret",
        "OPENAI_API_KEY": "credential",
    }  # (SSH_KEY_PATH: the session's, left out unnamed)


def test_a_replay_sets_the_recorded_variables_with_the_new_workspace_and_never_a_secret():
    doc = {
        "variables": {
            "VAR": "v",
            "PROJECT_DIR": "/old/ws/src",
            "HTTPS_PROXY": "http://proxy:3128",
            "ANTHROPIC_BASE_URL": "http://elsewhere",
            "PATH": "/old/bin",
            # recorded by an older rule: read as a secret now, never set
            "X_AUTH": "abc",
        }
    }
    got = replay_variables(doc, lambda text: text.replace("/old/ws", "/new/ws"))
    assert got == {"VAR": "v", "PROJECT_DIR": "/new/ws/src"}
    assert replay_variables(None, str) == {}


def test_no_restore_with_workspace_from_and_a_bad_env_from_are_usage_errors(tmp_path: Path):
    from cli_helpers import pvisor_main

    ws = tmp_path / "ws"
    ws.mkdir()
    common = ["replay", "--agent", "mini-swe-agent", "--run", "r-1", "--after-step", "0", "--replay-only",
              "--workspace", str(ws), "--output", str(tmp_path / "out")]  # fmt: skip
    journal = ["--journal", str(tmp_path / "j.sqlite")]
    both = pvisor_main(
        [*journal, *common, "--no-restore", "--workspace-from", "r-1"], cwd=tmp_path, text=True
    )
    assert both.returncode == 2 and "--no-restore starts in --workspace as it is" in both.stderr, both.stderr
    bad = pvisor_main([*common, "--env-from", "all"], cwd=tmp_path, text=True)
    assert bad.returncode == 2 and "'all' is not one of 'recorded', 'none'" in bad.stderr, bad.stderr
    assert "Traceback" not in both.stderr + bad.stderr
