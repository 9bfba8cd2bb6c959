"""The plan before a replay acts (replay/plan.py): what the served calls name outside the new
workspace, read from actions made the way the real agents write them (Claude Code's Bash, Write
and Read with ``file_path``; Codex's ``exec_command`` with ``cmd`` and ``workdir`` and ``shell``
with an argv list; mini-swe-agent's fenced bash blocks in text mode; Gemini CLI's
``write_file`` and ``run_shell_command`` with ``dir_path``; OpenCode's ``write`` and ``bash``
with ``workdir``; Qwen Code's ``write_file`` and ``run_shell_command`` with ``directory``).
The end-to-end checks through ``pvisor replay`` with a real agent are at the end."""

from __future__ import annotations

import json

import orjson

from pvisor.adapters.agents import get_descriptor
from pvisor.journal.model import Action, ToolCall
from pvisor.replay.plan import Places, PlanReason, make_plan, stays_below

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


def test_stays_below():
    assert stays_below("") and stays_below("/a") and stays_below("/a/../b") and stays_below("/.")
    assert not stays_below("/..") and not stays_below("/../x") and not stays_below("/a/../../x")
