"""The start environment's rules (pvisor/session/start_env.py, docs/journal.md "The start
environment"): what ``pvisor run`` records of the agent's environment and what a replay sets
again. The real capture and replays are tests/test_start_state.py."""

from __future__ import annotations

from pathlib import Path

from pvisor.session.start_env import SCHEMA, recorded_cwd, recorded_environment, replay_variables

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


#: variables that load code or aim tools at a machine's files, repository or cluster
UNSAFE = {
    "LD_PRELOAD": "/tmp/evil.so",
    "LD_LIBRARY_PATH": "/opt/lib",
    "DYLD_INSERT_LIBRARIES": "/tmp/evil.dylib",
    "PYTHONPATH": "/tmp/evil",
    "PYTHONHOME": "/opt/py",
    "PYTHONSTARTUP": "/tmp/evil.py",
    "NODE_OPTIONS": "--require /tmp/evil.js",
    "NODE_PATH": "/tmp/node",
    "VIRTUAL_ENV": "/old/venv",
    "CONDA_PREFIX": "/opt/conda",
    "GIT_DIR": "/elsewhere/.git",
    "GIT_WORK_TREE": "/elsewhere",
    "GIT_SSH_COMMAND": "sh -c evil",
    "BASH_ENV": "/tmp/evil.sh",
    "ENV": "/tmp/evil.sh",
    "BASH_FUNC_ls%%": "() { evil; }",
    "DOCKER_HOST": "tcp://10.0.0.1:2375",
    "KUBECONFIG": "/home/me/.kube/prod",
    "npm_config_script_shell": "/tmp/evil",
}


def test_code_loading_and_machine_bound_variables_are_never_recorded_nor_set():
    base = {**UNSAFE, "VAR": "v"}
    doc = recorded_environment(base, dict(base), Path("/old/ws"))
    assert doc["variables"] == {"VAR": "v"}
    assert doc["left_out"] == dict.fromkeys(UNSAFE, "unsafe")
    # a hostile recording that holds them anyway: none is set
    assert replay_variables({"variables": {**UNSAFE, "VAR": "v"}}, str) == {"VAR": "v"}


def test_variables_that_route_requests_are_never_set_whatever_their_ending():
    routes = {
        "OPENAI_API_BASE": "http://elsewhere:8000/v1",
        "OPENAI_BASE": "http://elsewhere",
        "AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com",
        "OLLAMA_HOST": "10.0.0.2:11434",
        "ANTHROPIC_API_URL": "http://elsewhere",
        "https_proxy": "http://proxy:3128",
    }
    assert replay_variables({"variables": {**routes, "VAR": "v"}}, str) == {"VAR": "v"}


def test_secrets_that_are_no_key_shape_are_left_out_by_name():
    import base64

    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtZSIsImlhdCI6MX0.c2lnbmF0dXJlLWJ5dGVz"
    coded = base64.b64encode(b"sk-ant-api03-coded0123456789abcdef").decode()
    secrets = {
        "GH_PAT": "plainpat123",
        "SENTRY_DSN": "https://0123abcd@o123.ingest.sentry.io/42",
        "UPLOAD_TARGET": "https://deploy-user@files.example.org/up",
        "ID_FOR_CI": jwt,
        "BLOB": coded,
    }
    base = {**secrets, "VAR": "v"}
    doc = recorded_environment(base, dict(base), Path("/old/ws"))
    assert doc["variables"] == {"VAR": "v"} and doc["left_out"] == dict.fromkeys(secrets, "secret")
    assert replay_variables({"variables": base}, str) == {"VAR": "v"}


def test_left_out_lists_the_credentials_pvisor_removed_and_names_that_are_not_utf8():
    base = {
        "ANTHROPIC_API_KEY": "sk-ant-api03-removed0123456789",
        "AWS_PROFILE": "prod",
        "AWS_REGION": "eu-west-1",
        "VAR": "v",
        "B\udce9D": "x",
    }
    # the scripted run's agent gets a dummy key and no AWS settings
    env = {"ANTHROPIC_API_KEY": "dummy", "VAR": "v", "B\udce9D": "x"}
    doc = recorded_environment(base, env, Path("/old/ws"))
    assert doc["variables"] == {"VAR": "v"}
    assert doc["left_out"] == {
        "ANTHROPIC_API_KEY": "removed",
        "AWS_PROFILE": "removed",
        "AWS_REGION": "removed",
        "B\\xe9D": "not_utf8",
    }


def test_a_workspace_that_is_a_file_is_said_to_be_no_directory(tmp_path: Path):
    from cli_helpers import pvisor_main

    afile = tmp_path / "afile"
    afile.write_text("x\n")
    proc = pvisor_main(
        ["--journal", str(tmp_path / "j.sqlite"), "replay", "--agent", "mini-swe-agent", "--run", "r-1",
         "--after-step", "0", "--replay-only", "--workspace", str(afile), "--output", str(tmp_path / "out")],
        cwd=tmp_path, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and f"--workspace {afile}: not a directory" in proc.stderr, proc.stderr
    assert "no such directory" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_hostile_recording_s_variables_that_cannot_be_set_or_are_too_long_are_not_set():
    # a crafted runs.environment: names the OS refuses (empty, with '=' or NUL), a value with NUL, a
    # value past MAX_VALUE_BYTES (a 200 kB value once took the secret search ~50 s, and execve
    # refuses one past 128 kB)
    hostile = {"": "e", "A=B": "x", "N\x00": "y", "V": "a\x00b", "BIG": "x" * 200_000, "OK": "1"}
    assert replay_variables({"variables": hostile}, str) == {"OK": "1"}


def test_a_recorded_environment_that_is_no_object_sets_nothing():
    for doc in (["VAR"], "VAR=1", 42, {"variables": ["VAR"]}):
        assert replay_variables(doc, str) == {}


def test_a_crafted_recorded_cwd_that_is_no_path_is_reported_as_none():
    # result.json's start_state.cwd.recorded is a string or null (docs/result-schema.json)
    assert recorded_cwd({"cwd": "/old/ws"}, "/x") == "/old/ws"
    for bad in ({"a": 1}, ["/w"], 7, "/w\x00x", "/" + "w" * 10_000):
        assert recorded_cwd({"cwd": bad}, "/x") is None
    assert recorded_cwd(["not an object"], "/x") is None
    assert recorded_cwd(None, "/x") == "/x"


def test_a_secret_percent_encoded_or_in_hex_is_left_out():
    key = "sk-ant-api03-startstate0123456789abcdef"
    encoded = {
        "REDIRECT": "https%3A%2F%2Fadmin%3Apw-encoded-0xfeed%40db.internal%2Fapp",
        "QUERY": "next=%73k-ant-api03-startstate0123456789abcdef",
        "BLOB": key.encode().hex(),
    }
    base = {**encoded, "COMMIT": "0123456789abcdef0123456789abcdef01234567", "VAR": "a%20b"}
    doc = recorded_environment(base, dict(base), Path("/old/ws"))
    assert doc["variables"] == {"COMMIT": base["COMMIT"], "VAR": "a%20b"}
    assert doc["left_out"] == dict.fromkeys(encoded, "secret")
