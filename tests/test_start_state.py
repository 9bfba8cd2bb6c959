"""The recorded start state (issue 40, item 2): ``pvisor run`` records the environment the agent
was started in (its working directory and the user's variables, never a secret), and a replay of
the run starts from the recorded start state: the start snapshot restored into an empty
``--workspace`` by default, the recorded variables set (``--env-from recorded``). Without them
(``--no-restore``, ``--env-from none``) the first observation differs and the result names the
start state as the likely cause; a non-empty ``--workspace`` is kept with one warning.

One real mini-swe-agent capture against the scripted model (its command ``echo $VAR; cat
setup.txt``, started with ``VAR`` set and ``setup.txt`` in the workspace, then a ``pwd``), started
through a wrapper that sets mini's ``environment.cwd`` as a user's config does: its native file
records the directory its commands ran in, which a replay of the file maps to the new workspace.
Replays run without ``VAR`` in their environment. The gateway's captures (no start environment)
are checked in tests/test_env_command.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agent_helpers import entrypoint, pvisor, user_env
from pvisor.journal.reader import JournalReader

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
AGENT = "mini-swe-agent"
TASK = "Look at the set-up."
VALUE = "from-the-start-42"
SETUP = "the set-up file\n"
#: variables that look like secrets, by name or by value: never in the journal
SECRET_VARS = {
    "DEPLOY_PASSWORD": "plain-words-hunter2-deploy",
    "NOTES": "the key is sk-ant-api03-startstate0123456789abcdef",
    "DB_URL": "postgres://admin:pw-startstate-0xfeed@db.internal/app",
}
SECRETS_SENT = [
    "sk-ant-api03-startstate0123456789abcdef",
    "pw-startstate-0xfeed",
    "plain-words-hunter2-deploy",
]
#: variables that load code or aim tools elsewhere: never recorded (harmless to this capture)
UNSAFE_VARS = {"LD_LIBRARY_PATH": "/nonexistent/lib", "NODE_OPTIONS": "--require /nonexistent.js",
               "GIT_DIR": "/nonexistent/.git", "KUBECONFIG": "/nonexistent/kube"}  # fmt: skip
#: credentials a scripted run removes from the agent's environment: listed as removed
REMOVED_VARS = {"ANTHROPIC_API_KEY": "sk-ant-api03-removedbypvisor0123456789", "AWS_REGION": "eu-west-1"}
#: secret files of the workspace: withheld from the start snapshot, never in the journal
ENV_KEY = "sk-ant-api03-dotenvstartstate0123456789abc"
SECRET_FILES = {
    "deploy/.env": f"ANTHROPIC_API_KEY={ENV_KEY}\n",
    "deploy/server.pem": "-----BEGIN PRIVATE KEY-----\n",
}
FIRST = "echo VAR=$VAR; cat setup.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def script() -> dict[str, Any]:
    return {
        "model": "mock-model",
        "seed": 40,
        "turns": [
            {"text": "The set-up.", "tool_calls": [{"tool": "@shell", "command": FIRST}]},
            {"text": "Where am I?", "tool_calls": [{"tool": "@shell", "command": "pwd"}]},
            {"text": "Done.", "tool_calls": [{"tool": "@shell", "command": SUBMIT}]},
        ],
    }  # fmt: skip


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> dict[str, Any]:
    """The capture: ``{root, journal, run, ws, home, native}``."""
    root = tmp_path_factory.mktemp("start")
    home, ws = root / "home", root / "ws"
    home.mkdir()
    ws.mkdir()
    (ws / "setup.txt").write_text(SETUP)
    (ws / "deploy").mkdir()
    for rel, text in SECRET_FILES.items():
        (ws / rel).write_text(text)
    (root / "s.json").write_text(json.dumps(script()))
    # mini's own config names where its commands run (a SWE-bench container's /testbed): its file
    # records it in info.config.environment.cwd
    wrapper = root / "mini"
    wrapper.write_text(f'#!/bin/sh\nexec "{entrypoint(AGENT)}" "$@" -c "environment.cwd=$PWD"\n')
    wrapper.chmod(0o755)
    journal = root / "j.sqlite"
    proc = pvisor(
        ["--journal", str(journal), "run", "--agent", AGENT, "--agent-entrypoint", str(wrapper), "--script",
         str(root / "s.json"), "--workspace", str(ws), "--json", "--", TASK],
        env=user_env(home, VAR=VALUE, **SECRET_VARS, **UNSAFE_VARS, **REMOVED_VARS), cwd=root, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    return {"root": root, "journal": journal, "run": report["run"], "ws": ws, "home": home,
            "native": report["native_trajectory"]}  # fmt: skip


def replay(cap: dict[str, Any], name: str, *extra: str, files: dict[str, str] | None = None, step: int = 2):
    """``pvisor replay --replay-only`` of the capture (``--run``, unless ``extra`` gives the
    source) after ``step`` into a new workspace holding ``files``: (process, result, workspace)."""
    ws, out = cap["root"] / f"ws-{name}", cap["root"] / f"out-{name}"
    ws.mkdir()
    for rel, text in (files or {}).items():
        (ws / rel).write_text(text)
    source = [] if "--trajectory" in extra else ["--run", cap["run"]]
    proc = pvisor(
        ["--journal", str(cap["journal"]), "replay", "--agent", AGENT, *source, "--after-step", str(step),
         "--replay-only", "--workspace", str(ws), "--output", str(out), "--agent-entrypoint",
         str(entrypoint(AGENT)), "--timeout", "240", *extra],
        env=user_env(cap["home"]), cwd=cap["root"], timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return proc, result, ws


def codes(result: dict[str, Any], code: str) -> list[str]:
    return [w["message"] for w in result["warnings"] if w["code"] == code]


def test_the_start_environment_is_recorded_and_no_secret_is(capture):
    with JournalReader(capture["journal"]) as r:
        doc = r.run_environment(capture["run"])
    assert doc is not None and doc["schema"] == "pvisor.start-environment/v1"
    assert doc["cwd"] == str(capture["ws"]) and doc["variables"]["VAR"] == VALUE
    # the machine's and pvisor's own are not the start state a replay sets again
    assert not {"PATH", "HOME", "PWD", "TMPDIR", "OPENAI_API_KEY", "MSWEA_CONFIGURED"} & set(doc["variables"])
    assert {k: doc["left_out"].get(k) for k in SECRET_VARS} == dict.fromkeys(SECRET_VARS, "secret")
    stored = b"".join(p.read_bytes() for p in capture["journal"].parent.glob("j.sqlite*"))
    assert VALUE.encode() in stored
    for value in SECRET_VARS.values():
        assert value.encode() not in stored and value not in json.dumps(doc)
    assert {k: doc["left_out"].get(k) for k in UNSAFE_VARS} == dict.fromkeys(UNSAFE_VARS, "unsafe")
    assert {k: doc["left_out"].get(k) for k in REMOVED_VARS} == dict.fromkeys(REMOVED_VARS, "removed")
    # the workspace's secret files: withheld from the start snapshot, in no encoding in the journal
    assert ENV_KEY.encode() not in stored and b"BEGIN PRIVATE KEY" not in stored


def test_a_replay_into_an_empty_directory_starts_from_the_recorded_start_state(capture):
    proc, result, ws = replay(capture, "empty")
    state = result["start_state"]
    assert state["workspace"] == "restored" and state["snapshot_run"] == capture["run"]
    assert state["environment"] == "set" and "VAR" in state["variables"] and state["likely_cause"] is None
    assert state["cwd"] == {"recorded": str(capture["ws"]), "replay": str(ws)}
    assert result["workspace"]["restored_from"]["run"] == capture["run"]
    assert [c["equal_normalised"] for c in result["tool_calls"]] == [True, True]
    assert not codes(result, "observation_differs") and "observation_differs" not in proc.stderr
    assert (ws / "setup.txt").read_text() == SETUP
    # the secret files were withheld: named, and left to the user
    assert [w["path"] for w in state["withheld"]] == sorted(SECRET_FILES)
    (said,) = codes(result, "secret_files_withheld")
    assert "deploy/.env" in said and "yourself" in said and ENV_KEY not in json.dumps(result)
    assert not (ws / "deploy" / ".env").exists() and not (ws / "deploy" / "server.pem").exists()


def test_without_the_start_state_the_first_observation_differs_and_says_why(capture):
    # --no-restore: the workspace as given, without a warning (it holds something)
    bare = ("--no-restore", "--env-from", "none")
    proc, result, ws = replay(capture, "bare", *bare, files={"other.txt": "x\n"})
    state = result["start_state"]
    assert state["workspace"] == "no_restore" and state["environment"] == "not_set" and not state["variables"]
    assert not codes(result, "workspace_not_restored") and "--no-restore says so" not in proc.stderr
    assert [c["equal_normalised"] for c in result["tool_calls"]] == [False, True]  # pwd: mapped
    cause = state["likely_cause"]
    assert cause.startswith("step 1 bash: the first observation differs")
    assert "--no-restore" in cause and "--env-from none" in cause
    (differs,) = codes(result, "observation_differs")
    assert "likely cause: the recorded start state was not reproduced" in differs
    assert "likely cause" in proc.stderr
    assert not (ws / "setup.txt").exists()


def test_a_non_empty_workspace_is_kept_with_one_warning(capture):
    proc, result, ws = replay(capture, "kept", files={"other.txt": "x\n"}, step=0)
    (line,) = codes(result, "workspace_not_restored")
    assert "is not empty" in line and "--no-restore" in line
    assert proc.stderr.count("--no-restore says so and silences this") == 1
    assert result["start_state"]["workspace"] == "kept" and result["workspace"]["restored_from"] is None
    assert sorted(p.name for p in ws.iterdir()) == ["other.txt"]


def test_mini_swe_agent_s_recorded_cwd_maps_pwd_in_a_replay_of_its_file(capture):
    """The native file: no start snapshot and no environment; its recorded cwd is the recorded
    workspace, so that the replay's ``pwd`` in the new one is no difference."""
    native = json.loads(Path(capture["native"]).read_text())
    assert native["info"]["config"]["environment"]["cwd"] == str(capture["ws"])
    _, result, ws = replay(capture, "native", "--trajectory", capture["native"])
    pwd = result["tool_calls"][1]
    assert pwd["step"] == 2 and pwd["equal_normalised"] is True
    state = result["start_state"]
    assert state["workspace"] == "no_snapshot" and state["environment"] == "not_recorded"
    assert state["cwd"] == {"recorded": str(capture["ws"]), "replay": str(ws)}
    assert result["tool_calls"][0]["equal_normalised"] is False  # no setup.txt, no VAR
    assert "the source keeps no start snapshot" in state["likely_cause"]


def test_a_native_file_replayed_from_the_run_s_workspace_names_the_missing_environment(capture):
    """``--trajectory`` (a native file, which keeps no start environment) with ``--workspace-from``
    the run: setup.txt is there, VAR is not; the likely cause says the environment is missing."""
    _, result, ws = replay(capture, "native-from", "--trajectory", capture["native"], "--workspace-from",
                           capture["run"])  # fmt: skip
    state = result["start_state"]
    assert state["workspace"] == "restored" and state["environment"] == "not_recorded"
    assert (ws / "setup.txt").read_text() == SETUP
    assert result["tool_calls"][0]["equal_normalised"] is False  # VAR= only
    assert "a native file keeps no start environment" in state["likely_cause"]
