"""The plan before a replay acts (replay/plan.py): what the served calls name outside the new
workspace, read from actions made the way the real agents write them (Claude Code's Bash, Write
and Read with ``file_path``; Codex's ``exec_command`` with ``cmd`` and ``workdir`` and ``shell``
with an argv list; mini-swe-agent's fenced bash blocks in text mode; Gemini CLI's
``write_file`` and ``run_shell_command`` with ``dir_path``; OpenCode's ``write`` and ``bash``
with ``workdir``; Qwen Code's ``write_file`` and ``run_shell_command`` with ``directory``).
The end-to-end checks through ``pvisor replay`` with a real agent are at the end."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import jsonschema
import orjson
import pytest

from agent_helpers import PVISOR, capture_scripted, entrypoint, pvisor, user_env
from pvisor.adapters.agents import get_descriptor
from pvisor.journal.model import Action, ToolCall
from pvisor.journal.reader import JournalReader
from pvisor.replay.plan import HEADING, Places, PlanReason, make_plan, stays_below

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "result-schema.json").read_text())

WS = "/work/new-ws"
OLD = "/rec/ws"
PLACES = Places(WS, OLD, "/data/runs/r-old/home", "/data/runs/r-old")


def call(name: str, i: int = 1, **args) -> ToolCall:
    return ToolCall(f"call_{i}", name, orjson.dumps(args).decode(), args)


def found(agent: str, *actions: Action, places: Places = PLACES) -> list[tuple]:
    """(step, call id, tool, argument, text, reason) of each plan item."""
    plan = make_plan(get_descriptor(agent), list(actions), places)
    return [(i.step, i.call_id, i.tool, i.argument, i.text, i.reason.value) for i in plan.items]


def one(agent: str, tool: str, **args) -> list[tuple]:
    """The plan items of one action with one call of ``tool``."""
    return found(agent, Action(tool_calls=[call(tool, **args)]))


# --------------------------------------------------------------------------- path arguments


def test_claude_code_path_arguments_absolute_recorded_and_rewrite_leaving():
    steps = [
        Action(tool_calls=[call("Write", 1, file_path="/home/u/.bashrc", content="x")]),
        Action(tool_calls=[call("Write", 2, file_path=f"{OLD}/src/a.py", content="x")]),  # rewritten
        Action(tool_calls=[call("Edit", 3, file_path=f"{OLD}/../x", old_string="a", new_string="b")]),
        Action(tool_calls=[call("Read", 4, file_path="/etc/passwd"), call("Write", 5, file_path="/etc/x")]),
        Action(tool_calls=[call("Read", 6, file_path="/data/runs/r-old/home/.claude.json")]),  # rewritten
        Action(tool_calls=[call("Write", 7, file_path=f"{WS}/ok.py"), call("Write", 8, file_path="/tmp/t")]),
    ]
    assert found("claude-code", *steps) == [
        (1, "call_1", "Write", "file_path", "/home/u/.bashrc", "absolute_path"),
        (3, "call_3", "Edit", "file_path", f"{OLD}/../x", "rewrite_leaves_workspace"),
        (4, "call_5", "Write", "file_path", "/etc/x", "absolute_path"),
    ]


def test_gemini_cli_write_file_opencode_write_and_qwen_code_write_file():
    assert one("gemini-cli", "write_file", file_path="/srv/x", content="") == [
        (1, "call_1", "write_file", "file_path", "/srv/x", "absolute_path")
    ]
    assert one("gemini-cli", "read_file", file_path="/usr/share/dict/words") == []
    assert one("opencode", "write", filePath="../x.txt", content="") == [
        (1, "call_1", "write", "filePath", "../x.txt", "parent_directory")
    ]
    assert one("opencode", "write", filePath="sub/../x.txt") == []
    assert one("qwen-code", "write_file", file_path="~/.ssh/authorized_keys") == [
        (1, "call_1", "write_file", "file_path", "~/.ssh/authorized_keys", "home")
    ]


# --------------------------------------------------------------------------- shell commands


def test_claude_code_bash_commands():
    bash = [
        "cd .. && echo x > escaped.txt",
        "cat ../secret",
        "ls ~/.ssh",
        f"rm -rf {OLD}/build",
        "echo hi > /etc/motd",
        "cat /etc/hosts /usr/share/x >/dev/null 2>&1",
        "echo ok | tee /etc/x >> /dev/stderr",
        "git -C /srv/repo status",
        "cat /data/runs/r-old/home/.bash_history",
        "mkdir -p sub && cd sub && cat ../a.txt",
        "echo x > /tmp/y; cat /proc/self/status; echo $HOME/x > /dev/null",
        "cd /etc && echo x > hosts.new",
    ]
    actions = [Action(tool_calls=[call("Bash", i, command=c)]) for i, c in enumerate(bash, 1)]
    assert found("claude-code", *actions) == [
        (1, "call_1", "Bash", "command", "..", "parent_directory"),
        (1, "call_1", "Bash", "command", "escaped.txt", "parent_directory"),
        (2, "call_2", "Bash", "command", "../secret", "parent_directory"),
        (3, "call_3", "Bash", "command", "~/.ssh", "home"),
        (4, "call_4", "Bash", "command", f"{OLD}/build", "recorded_workspace"),
        (5, "call_5", "Bash", "command", "/etc/motd", "absolute_path"),
        (7, "call_7", "Bash", "command", "/etc/x", "absolute_path"),
        (8, "call_8", "Bash", "command", "/srv/repo", "absolute_path"),
        (9, "call_9", "Bash", "command", "/data/runs/r-old/home/.bash_history", "recorded_home"),
        (11, "call_11", "Bash", "command", "$HOME/x", "home"),
        (12, "call_12", "Bash", "command", "hosts.new", "absolute_path"),
    ]


def test_what_the_plan_cannot_see_is_not_listed():
    """Paths a command builds or a program opens itself: the documented limits."""
    unseen = [
        "p=/x; echo > $p/y",
        'python3 -c \'open("/x", "w")\'',
        "cat > notes.txt <<'EOF'\n/etc/not/a/word/of/the/shell\n../neither\nEOF",
        "echo '# not a comment' /ok && echo # ../a comment",
    ]
    actions = [Action(tool_calls=[call("Bash", i, command=c)]) for i, c in enumerate(unseen, 1)]
    assert found("claude-code", *actions) == [(4, "call_4", "Bash", "command", "/ok", "absolute_path")]


def test_codex_exec_command_workdir_and_shell_argv():
    steps = [
        Action(tool_calls=[call("exec_command", cmd="cat ../x", workdir=OLD)]),  # rewritten: WS/../x
        Action(tool_calls=[call("exec_command", cmd="echo y > z", workdir="/etc")]),
        Action(tool_calls=[call("exec_command", cmd="ls", workdir=f"{OLD}/..")]),
        Action(tool_calls=[call("shell", command=["bash", "-lc", "cd .. && touch x"])]),
        Action(tool_calls=[call("shell", command=["cp", "a.txt", "/opt/a.txt"])]),
        Action(tool_calls=[call("shell", command=["cat", "/etc/hosts"])]),
    ]
    assert found("codex", *steps) == [
        (1, "call_1", "exec_command", "cmd", "../x", "parent_directory"),
        (2, "call_1", "exec_command", "cmd", "z", "absolute_path"),
        (3, "call_1", "exec_command", "workdir", f"{OLD}/..", "rewrite_leaves_workspace"),
        (4, "call_1", "shell", "command", "..", "parent_directory"),
        (4, "call_1", "shell", "command", "x", "parent_directory"),
        (5, "call_1", "shell", "command", "/opt/a.txt", "absolute_path"),
    ]


def test_gemini_opencode_and_qwen_shell_tools_with_their_working_directory():
    assert one("gemini-cli", "run_shell_command", command="ls", dir_path="/srv") == [
        (1, "call_1", "run_shell_command", "dir_path", "/srv", "absolute_path")
    ]
    assert one("opencode", "bash", command="rm x", workdir="sub") == []
    assert one("opencode", "bash", command="rm x", workdir="/var/lib") == [
        (1, "call_1", "bash", "workdir", "/var/lib", "absolute_path"),
        (1, "call_1", "bash", "command", "x", "absolute_path"),
    ]
    assert one("qwen-code", "run_shell_command", command="echo > ../q") == [
        (1, "call_1", "run_shell_command", "command", "../q", "parent_directory")
    ]


def test_mini_swe_agent_text_mode_bash_blocks():
    text = "THOUGHT: look around.\n\n```mswea_bash_command\ncd .. && cat /root/.netrc\n```"
    assert found("mini-swe-agent", Action(text=text)) == [
        (1, None, "text", "command", "..", "parent_directory"),
        (1, None, "text", "command", "/root/.netrc", "absolute_path"),
    ]
    # mini-swe-agent 2 with tool calls: its bash tool
    assert one("mini-swe-agent", "bash", command="cat ~/.ssh/id_rsa") == [
        (1, "call_1", "bash", "command", "~/.ssh/id_rsa", "home")
    ]


# --------------------------------------------------------------------------- the plan's shape


def test_lines_heading_json_and_an_empty_plan():
    plan = make_plan(
        get_descriptor("claude-code"),
        [Action(tool_calls=[call("Bash", command="echo x > /srv/\x1b[2Jx")])],
        PLACES,
    )
    lines = plan.lines()
    assert len(lines) == 2 and "a warning, never a guarantee" in lines[0] and "/dev/null" in lines[0]
    assert lines[1] == "step 1, call call_1 (Bash command): /srv/\\x1b[2Jx: absolute_path"
    odd = make_plan(
        get_descriptor("claude-code"),
        [Action(tool_calls=[ToolCall("id\x1b[2J", "Bash", "{}", {"command": "ls /srv"})])],
        PLACES,
    )
    assert odd.lines()[1] == "step 1, call id\\x1b[2J (Bash command): /srv: absolute_path"
    doc = plan.to_json()
    assert doc["steps"] == 1 and doc["items"][0]["reason"] == PlanReason.ABSOLUTE_PATH.value
    assert "/tmp/*" in doc["ignored"] and "/etc/*" in doc["ignored_reads"]
    json.dumps(doc)
    empty = make_plan(get_descriptor("claude-code"), [Action(text="no call")], PLACES)
    assert empty.lines() == [] and empty.to_json()["items"] == []


def test_a_key_in_a_named_path_is_redacted_and_a_long_text_cut():
    key = "sk-ant-api03-" + "A" * 40
    plan = make_plan(
        get_descriptor("claude-code"),
        [Action(tool_calls=[call("Bash", command=f"echo > /srv/{key} /srv/{'y' * 400}")])],
        PLACES,
    )
    shown = [i.text for i in plan.items]
    assert key not in "".join(shown) and "/srv/<redacted>" in shown
    assert [len(t) for t in shown if t.startswith("/srv/y")] == [160] and shown[0].endswith("…")


def test_the_two_options_are_for_a_replay_with_the_agent():
    from pvisor.replay.spec import BY_NAME, OPTIONS, ReplayMode, ReplaySpec

    names = [o.name for o in OPTIONS]
    assert names[names.index("allow_damaged") + 1 : names.index("allow_damaged") + 3] == [
        "refuse_outside",
        "allow_unrecorded",
    ]
    for name, flag, starts in (
        ("refuse_outside", "--refuse-outside", "runs nothing"),
        ("allow_unrecorded", "--allow-unrecorded", "re-runs no call"),
    ):
        o = BY_NAME[name]
        assert (o.flag, o.toml, o.api, o.default) == (flag, name, name, False)
        values = {"agent": "codex", "after_step": 1, "output": "o", "prepare_only": True, name: True}
        [problem] = ReplaySpec(values, {name}, ReplayMode.PREPARE_ONLY).check()
        assert problem.exit_code == 2
        assert problem.message == f"{flag} is for --replay-only and continuation; --prepare-only {starts}"


def test_stays_below():
    assert stays_below("") and stays_below("/a") and stays_below("/a/../b") and stays_below("/.")
    assert not stays_below("/..") and not stays_below("/../x") and not stays_below("/a/../../x")


def test_the_documented_heading_is_the_one_printed():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "replay.md").read_text()
    [line] = [x for x in doc.splitlines() if x.startswith("pvisor: warning: the plan")]
    assert line == f"pvisor: warning: {HEADING.format(count=2)}"


# =========================================================================== through pvisor replay
# Claude Code, offline against the scripted model: a capture whose calls write outside its
# workspace (into a directory outside /tmp, which the plan ignores), replayed with --replay-only.


def _wrapper(real: Path, where: Path, stderr: Path) -> Path:
    """An entry point that runs ``real``; when it starts the agent (not ``--version``), it first
    copies what pvisor wrote on stderr so far (``stderr``) to ``where/stderr-at-start``."""
    path = where / "claude-wrapped"
    path.write_text(
        f'#!/bin/bash\nif [ "$1" != "--version" ] && [ ! -e "{where}/stderr-at-start" ]; then\n'
        f'  cp "{stderr}" "{where}/stderr-at-start"\nfi\nexec "{real}" "$@"\n'
    )
    path.chmod(0o755)
    return path


class Hostile:
    """A captured Claude Code run (scripted model) whose steps name places outside its workspace:
    step 1 writes ``OUT/canary.txt`` by absolute path with Bash and ``WS/../escaped-write.txt``
    with Write (the rewrite would make it ``NEW_WS/../...``), step 2 ``cd .. && echo > escaped.txt``;
    step 3 ends. ``out`` lies outside /tmp; what the capture wrote there is removed."""

    def __init__(self, root: Path, out: Path):
        self.root, self.out = root, out
        ws = (root / "ws").resolve()
        self.escaped = [out / "canary.txt", ws.parent / "escaped-write.txt", ws.parent / "escaped.txt"]
        script = {
            "model": "claude-sonnet-4-5",
            "seed": 3,
            "turns": [
                {
                    "text": "Two writes.",
                    "tool_calls": [
                        {"tool": "@shell", "command": f"echo one > {out}/canary.txt"},
                        {
                            "tool": "Write",
                            "arguments": {"file_path": f"{ws}/../escaped-write.txt", "content": "w"},
                        },
                    ],
                },
                {
                    "text": "Up.",
                    "tool_calls": [{"tool": "@shell", "command": "cd .. && echo two > escaped.txt"}],
                },
                {"text": "Done."},
            ],
        }
        self.cap = capture_scripted("claude-code", root, script, "Write the files.")
        for p in self.escaped:
            p.unlink(missing_ok=True)

    def replay(self, name: str, *extra: str) -> tuple[int, str, dict, Path]:
        """``pvisor replay --replay-only`` after step 2 in a new workspace: (exit code, stderr,
        result, the directory of the wrapper's copy of stderr)."""
        box = self.root / name
        box.mkdir()
        ws, out, stderr = box / "ws", box / "out", box / "stderr"
        ws.mkdir()
        exe = _wrapper(Path(self.cap.exe), box, stderr)
        with stderr.open("w") as err:
            proc = subprocess.run(
                [str(PVISOR), "--journal", str(self.cap.journal), "replay", "--agent", "claude-code",
                 "--run", self.cap.run, "--after-step", "2", "--replay-only", "--workspace", str(ws),
                 "--output", str(out), "--agent-entrypoint", str(exe), "--timeout", "240", *extra],
                env=self.cap.env, cwd=box, stdout=subprocess.PIPE, stderr=err, text=True, timeout=400,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        text = stderr.read_text()
        assert "Traceback" not in text, text
        result = json.loads((out / "result.json").read_text())
        jsonschema.validate(result, SCHEMA)
        return proc.returncode, text, result, box

    def runs(self) -> list[str]:
        with JournalReader(self.cap.journal) as r:
            return [run.id for run in r.runs()]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    out = Path(tempfile.mkdtemp(prefix="pvisor-plan-outside-", dir="/var/tmp"))
    try:
        yield Hostile(tmp_path_factory.mktemp("hostile"), out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


EXPECTED = [
    ("Bash", "command", "{out}/canary.txt", "absolute_path"),
    ("Write", "file_path", "{ws}/../escaped-write.txt", "rewrite_leaves_workspace"),
    ("Bash", "command", "..", "parent_directory"),
    ("Bash", "command", "escaped.txt", "parent_directory"),
]


def _expected(h: Hostile) -> list[tuple]:
    ws = str((h.root / "ws").resolve())
    return [(t, a, x.format(out=h.out, ws=ws), r) for t, a, x, r in EXPECTED]


@pytest.mark.slow
def test_the_plan_is_printed_before_the_agent_starts_and_is_in_the_result(hostile):
    # without a sandbox (the plan is what warns then): the calls land where they name
    rc, stderr, result, box = hostile.replay("warned", "--sandbox", "none")
    assert rc == 0, stderr
    items = result["plan"]["items"]
    assert [(i["tool"], i["argument"], i["text"], i["reason"]) for i in items] == _expected(hostile)
    assert [i["step"] for i in items] == [1, 1, 2, 2] and all(i["call_id"] for i in items)
    lines = [f"pvisor: warning: {HEADING.format(count=4)}"] + [
        f"pvisor: warning: step {i['step']}, call {i['call_id']} ({i['tool']} {i['argument']}): "
        f"{i['text']}: {i['reason']}"
        for i in items
    ]
    # on stderr before the agent started: the wrapper copied stderr as it started the agent
    assert (box / "stderr-at-start").read_text().splitlines()[: len(lines)] == lines
    assert stderr.splitlines()[: len(lines)] == lines
    # a warning: the calls ran (the Write was served as recorded, not rewritten into NEW_WS/..)
    assert result["status"] == "ok" and result["agent_started"] is True
    assert not any(r["argument"] == "file_path" for r in result["path_rewrites"])
    assert (hostile.out / "canary.txt").read_text() == "one\n"
    for p in hostile.escaped:
        p.unlink(missing_ok=True)


@pytest.mark.slow
def test_refuse_outside_exits_2_before_anything_runs(hostile):
    before = hostile.runs()
    rc, stderr, result, box = hostile.replay("refused", "--refuse-outside")
    assert rc == 2
    [error] = [x for x in stderr.splitlines() if x.startswith("pvisor: error:")]
    first = result["plan"]["items"][0]
    assert (
        "--refuse-outside: the plan lists 4 place(s)" in error
        and f"step 1, call {first['call_id']} (Bash command): {hostile.out}/canary.txt: absolute_path"
        in error
    )
    assert result["status"] == "failed" and [e["code"] for e in result["errors"]] == ["outside_workspace"]
    assert result["agent_started"] is False and result["derived_run"] is None
    assert len(result["plan"]["items"]) == 4
    # the agent never started, no run was made, nothing was written
    assert not (box / "stderr-at-start").exists() and hostile.runs() == before
    assert not any(p.exists() for p in hostile.escaped) and list((box / "ws").iterdir()) == []


# --------------------------------------------------------------------------- an interrupted batch


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A Claude Code run stopped (SIGTERM) while the tool of its only step ran: the journal holds
    A_1's call and no request 2 with its result."""
    root = tmp_path_factory.mktemp("interrupted")
    home, ws = root / "home", root / "ws"
    home.mkdir()
    ws.mkdir()
    hold = "touch started && while [ ! -e go ]; do sleep 0.05; done && echo released"
    script = {
        "model": "claude-sonnet-4-5",
        "turns": [{"text": "Wait.", "tool_calls": [{"tool": "@shell", "command": hold}]}, {"text": "Done."}],
    }  # noqa: E501
    (root / "s.json").write_text(json.dumps(script))
    journal, exe, env = root / "j.sqlite", str(entrypoint("claude-code")), user_env(home)
    proc = subprocess.Popen(
        [str(PVISOR), "--journal", str(journal), "run", "--agent", "claude-code", "--agent-entrypoint", exe,
         "--script", str(root / "s.json"), "--workspace", str(ws), "--json", "--", "Wait for it."],
        env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (ws / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    with JournalReader(journal) as r:
        [run] = r.runs()
    return root, journal, run.id, exe, env


def _replay_interrupted(
    interrupted, name: str, *extra: str
) -> tuple[subprocess.CompletedProcess, dict, Path]:
    root, journal, run, exe, env = interrupted
    ws, out = root / f"ws-{name}", root / f"out-{name}"
    ws.mkdir()
    (ws / "go").touch()  # the held command ends at once where it is re-run
    proc = pvisor(
        ["--journal", str(journal), "replay", "--agent", "claude-code", "--run", run, "--after-step", "1",
         *extra, "--workspace", str(ws), "--output", str(out), "--agent-entrypoint", exe, "--timeout", "240"],
        env=env, cwd=root, timeout=400,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    return proc, result, ws


@pytest.mark.slow
def test_an_unrecorded_boundary_is_refused_as_prepare_only_refuses_it_unless_allowed(interrupted):
    root, journal, run, exe, env = interrupted
    prepared = pvisor(
        ["--journal", str(journal), "replay", "--agent", "claude-code", "--run", run, "--after-step", "1",
         "--prepare-only", "--output", str(root / "out-prepare")],
        env=env, cwd=root, timeout=120,
    )  # fmt: skip
    assert prepared.returncode == 65 and prepared.stderr.count("\n") == 1, prepared.stderr
    assert prepared.stderr.startswith("pvisor: error: observation_not_recorded")
    refused, result, ws = _replay_interrupted(interrupted, "refused", "--replay-only")
    assert refused.returncode == 65 and refused.stderr == prepared.stderr  # the same line
    assert [e["code"] for e in result["errors"]] == ["observation_not_recorded"]
    assert result["agent_started"] is False and not (ws / "started").exists()
    [call] = result["unrecorded"]
    assert call["step"] == 1 and call["tool"] == "Bash" and call["call_id"]
    # with --allow-unrecorded the agent re-runs the call; the result names it
    allowed, result, ws = _replay_interrupted(interrupted, "allowed", "--replay-only", "--allow-unrecorded")
    assert allowed.returncode == 0, allowed.stderr
    assert result["status"] == "ok" and result["unrecorded"] == [call] and (ws / "started").exists()
    assert result["tool_calls"][0]["historical_observation_sha256"] is None
    # the call's arguments, as served (issue 40 item 4c)
    assert json.loads(result["tool_calls"][0]["arguments"])["command"].startswith("touch started && while")
    # no recorded O to compare O' with: counted apart, never as unequal (issue 40 item 4b)
    assert result["tool_calls"][0]["equal_normalised"] is None
    assert result["observations"] == {"compared": 0, "equal_normalised": 0, "not_compared": 1}
    assert (
        "1 tool call(s) re-run, 0 of 0 observation(s) equal once normalised, 1 not compared "
        "(no recorded or no replayed result);" in allowed.stdout
    ), allowed.stdout


@pytest.mark.slow
def test_a_config_files_continuation_options_under_replay_only_are_warned_in_the_result(interrupted):
    """replay.toml's continuation options under --replay-only: dropped with one warning line on
    stderr, and the same warning in result.json, code ``options_ignored`` (issue 40 item 5)."""
    root = interrupted[0]
    cfg = root / "replay.toml"
    cfg.write_text('upstream = "http://127.0.0.1:9"\nmax_steps = 3\nreasoning = "strip"\n')
    proc, result, _ = _replay_interrupted(
        interrupted, "config", "--replay-only", "--allow-unrecorded", "--config", str(cfg)
    )
    assert proc.returncode == 0, proc.stderr
    said = f"{cfg}: upstream, max_steps, reasoning are for a continuation; --replay-only ignores them"
    assert proc.stderr.count(said) == 1, proc.stderr  # once, though the result holds it too
    assert [w for w in result["warnings"] if w["code"] == "options_ignored"] == [
        {"code": "options_ignored", "message": said}
    ]
