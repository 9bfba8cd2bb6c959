"""Attacks on a handoff's translation (docs/handoff.md, issue 38): hostile recorded calls whose
arguments are turned into B's shell commands by :mod:`pvisor.replay.translate` (here-documents,
a ``python3`` replacement script, a patch's files, base64 for bytes) and B's messages.

In this process, with the real translator: each hostile source step is translated into a target
agent's calls, and the B shell command it gives is run the way the agents run a command (``bash
-c COMMAND``, one argument of an ``execve``) in a workspace inside a box; the test checks what
the command wrote and that nothing outside the workspace was touched. The text-mode target
(mini-swe-agent) is checked with the regular expression its pinned install parses actions with.
A test marked ``xfail(strict=True)`` is a hole left open: its reason says what would close it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import agents_dir
from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.native import read_native
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Action, Observation, Reasoning, Step, ToolCall, ToolResult, ToolSpec
from pvisor.replay.plan import Places, make_plan
from pvisor.replay.source_reasoning import SourceReasoning
from pvisor.replay.translate import CallFate, Target, files_command, translate

#: the source run's recorded workspace (the paths its calls name)
RECORDED = "/recorded/ws"

#: Codex's shell tool as it declares it (the target of most tests here: a function tool)
EXEC = ToolSpec(
    "exec_command",
    "Runs a command",
    {
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
        "required": ["cmd"],
    },
)


#: OpenCode's shell tool (a target with an edit tool of its own)
EXEC_BASH = ToolSpec(
    "bash", "Runs a command", {"type": "object", "properties": {"command": {"type": "string"}}}
)


def _steps(*batches: list[tuple[str, Any, Any]], text: str = "") -> list[Step]:
    """Source steps, one per batch of (tool, arguments, recorded result)."""
    out = []
    for n, batch in enumerate(batches, 1):
        calls = [
            ToolCall(f"toolu_{n}_{i}", name, json.dumps(a) if not isinstance(a, str) else a, a)
            for i, (name, a, _) in enumerate(batch)
        ]
        results = [ToolResult(c.id, r) for c, (_, _, r) in zip(calls, batch)]
        out.append(Step(n, Action(text=text, tool_calls=calls), Observation(results=results)))
    return out


def _codex(ws: Path) -> Target:
    return Target(get_descriptor("codex"), "openai-responses", [EXEC], str(ws), RECORDED)


def _mini(ws: Path) -> Target:
    return Target(get_descriptor("mini-swe-agent"), "openai-chat", [], str(ws), RECORDED)


def _commands(steps: list[Step], ws: Path, source: str = "claude-code") -> list[str]:
    """B's (Codex's) shell commands for the source ``steps``."""
    tr = translate(steps, get_descriptor(source), _codex(ws))
    return [c.arguments["cmd"] for s in tr.steps for c in s.action.tool_calls]


class Box:
    """A workspace inside a box: what the box holds outside the workspace is the canary."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "box"
        self.ws = self.root / "deep" / "ws"
        self.ws.mkdir(parents=True)
        (self.root / "victim.txt").write_text("untouched\n")
        (self.root / "home").mkdir()

    def outside(self) -> dict[str, str]:
        return {
            str(p.relative_to(self.root)): (p.read_text(errors="replace") if p.is_file() else "")
            for p in sorted(self.root.rglob("*"))
            if not (p == self.ws or self.ws in p.parents or p in self.ws.parents)
        }

    def run(self, command: str) -> subprocess.CompletedProcess:
        """``command`` as an agent runs it: ``bash -c COMMAND`` in the workspace."""
        home = self.root / "home"  # the agent's home: outside its workspace
        home.mkdir(exist_ok=True)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "OLDPWD": str(home)}
        return subprocess.run(["bash", "-c", command], cwd=self.ws, capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL, env=env)  # fmt: skip


def _write(path: str, content: str) -> list[Step]:
    return _steps([("Write", {"file_path": path, "content": content}, "File created")])


# --------------------------------------------------------------------------- 1. a write's quoting

HOSTILE_CONTENT = [
    'it\'s "quoted" $(touch ../../pwned) `touch ../../pwned2` ${HOME} \\n\n',
    "first\nPVISOR_EOF\ntouch ../../pwned\n",
    "PVISOR_EOF\nPVISOR_EOF_1\nPVISOR_EOF_2\n$(touch ../../pwned)\nPVISOR_EOF_1\n",
    " PVISOR_EOF\nPVISOR_EOF \n\tPVISOR_EOF\nPVISOR_EOF\r\n",
    "no newline at the end '; touch ../../pwned; echo '",
    "a\rb\x1b[2J\x07\x7f é ✓ \u2028 \ufeff\n",
    "x" * 20_000 + "\n" + "$(touch ../../pwned)" * 1000 + "\n",
    "",
    "\n",
]


@pytest.mark.parametrize("content", HOSTILE_CONTENT, ids=range(len(HOSTILE_CONTENT)))
def test_a_hostile_write_content_is_written_as_recorded_and_nothing_else(tmp_path, content):
    """Contained: quotes, ``$(...)``, backticks, the delimiter's own lines (PVISOR_EOF and
    PVISOR_EOF_1 in the content, with spaces, a tab, a CR), control characters and long lines
    are data of a quoted here-document or of one shell word."""
    box = Box(tmp_path)
    before = box.outside()
    for cmd in _commands(_write(f"{RECORDED}/out.txt", content), box.ws):  # (a long one in parts)
        proc = box.run(cmd)
        assert proc.returncode == 0, proc.stderr
    assert (box.ws / "out.txt").read_bytes() == content.encode()
    assert sorted(p.name for p in box.ws.iterdir()) == ["out.txt"]
    assert box.outside() == before


HOSTILE_PATHS = [
    "-n",
    "--",
    "a b/'c'\"d\"",
    "$(touch ../../pwned)/x",
    "`touch ../../pwned`",
    "new\nline",
    "dir/-rf",
]


def test_a_bool_line_number_is_no_line_number(tmp_path):
    """Hole, fixed: Gemini CLI's ``read_file`` line range took ``start_line: true`` for a
    number (a bool is an int in Python) and wrote ``sed -n 'True,2p'``, which sed refuses."""
    box = Box(tmp_path)
    (box.ws / "f.txt").write_text("one\ntwo\nthree\n")
    steps = _steps(
        [("read_file", {"file_path": f"{RECORDED}/f.txt", "start_line": True, "end_line": 2}, "x")]
    )
    [cmd] = _commands(steps, box.ws, source="gemini-cli")
    proc = box.run(cmd)
    assert (proc.returncode, proc.stdout) == (0, b"one\ntwo\n"), (cmd, proc.stderr)


@pytest.mark.parametrize("path", HOSTILE_PATHS, ids=range(len(HOSTILE_PATHS)))
def test_a_hostile_write_path_is_one_word_inside_the_workspace(tmp_path, path):
    """Contained: a path with quotes, a newline, ``$(...)`` or a leading ``-`` names that file
    in the workspace (``mkdir -p --``, a redirection's target is never an option)."""
    box = Box(tmp_path)
    before = box.outside()
    [cmd] = _commands(_write(f"{RECORDED}/{path}", "data\n"), box.ws)
    proc = box.run(cmd)
    assert proc.returncode == 0, proc.stderr
    assert (box.ws / path).read_text() == "data\n"
    assert box.outside() == before


def test_a_write_holding_a_nul_byte_is_made_with_the_recorded_bytes(tmp_path):
    """Hole, fixed: a write's content with a NUL byte was put in a here-document, and a command
    with a NUL cannot be an argument of ``execve``: B's shell call failed (Node's spawn throws;
    Python's subprocess refuses it) or, read up to the NUL, wrote a truncated file. Now such
    content goes through ``base64 -d`` as files_command's bytes do."""
    box = Box(tmp_path)
    content = "before\x00after\n"
    [cmd] = _commands(_write(f"{RECORDED}/bin.dat", content), box.ws)
    assert "\x00" not in cmd
    proc = box.run(cmd)
    assert proc.returncode == 0, proc.stderr
    assert (box.ws / "bin.dat").read_bytes() == content.encode()


@pytest.mark.parametrize("target", ["codex", "mini-swe-agent"])
def test_a_lone_surrogate_with_a_nul_or_a_fence_does_not_crash_the_translator(tmp_path, target):
    """A recorded JSON string may hold a lone surrogate (``\\ud800``): the content a write sends
    through base64 (a NUL in it) or the command a text-mode step runs from base64 (a fence in
    it) is encoded without a UnicodeEncodeError."""
    ws = tmp_path / "ws"
    to = _codex(ws) if target == "codex" else _mini(ws)
    for content in ("a\x00\ud800\n", "```\n\ud800\n"):
        tr = translate(_write(f"{RECORDED}/f.txt", content), get_descriptor("claude-code"), to)
        assert [c.fate for c in tr.calls] == [CallFate.REPRODUCED]


def test_a_path_with_a_nul_byte_is_not_made_into_a_command(tmp_path):
    """Hole, fixed: a NUL in a recorded path gave a B command with a NUL (no file can have that
    name): the call is now rendered as text, its effect unsaid."""
    tr = translate(_write(f"{RECORDED}/a\x00b", "x\n"), get_descriptor("claude-code"), _codex(tmp_path))
    commands = [c.arguments["cmd"] for s in tr.steps for c in s.action.tool_calls]
    assert all("\x00" not in c for c in commands), commands
    assert [c.fate for c in tr.calls] == [CallFate.RENDERED_AS_TEXT]


@pytest.mark.parametrize("line", ["0123456789abcdef" * 8 + "\n", "'" * 40_000])
def test_a_write_of_200_kib_is_made_by_bs_shell(tmp_path, line):
    """Hole, fixed: a write was one B shell command holding the whole content, and Linux refuses
    one argument over 128 KiB (MAX_ARG_STRLEN): B's ``bash -c`` failed with E2BIG (a
    package-lock.json). A long write now goes in parts, one B step each, the first writing and
    the others appending, in order; also a content of quotes without a newline (quoting makes
    its command longer than its content)."""
    box = Box(tmp_path)
    content = line * (206 * 1024 // len(line) + 1)  # over 200 KiB, as a package-lock.json is
    steps = _write(f"{RECORDED}/package-lock.json", content)
    tr = translate(steps, get_descriptor("claude-code"), _codex(box.ws))
    commands = [c.arguments["cmd"] for s in tr.steps for c in s.action.tool_calls]
    assert len(commands) > 1 and len(tr.steps) == len(commands)  # one part a step: in order
    assert [c.fate for c in tr.calls] == [CallFate.REPRODUCED]  # one source call, accounted once
    for cmd in commands:
        assert len(cmd.encode()) < 128 * 1024
        try:
            proc = box.run(cmd)
        except OSError as exc:  # E2BIG: the agent's spawn fails the same way
            pytest.fail(f"B's shell cannot run the translated write: {exc}")
        assert proc.returncode == 0, proc.stderr
    assert (box.ws / "package-lock.json").read_text() == content


# --------------------------------------------------------------------------- 2. an edit's script


HOSTILE_EDITS = [
    ("'''", '"""\nimport os; os.system(\'touch ../../pwned\')\n'),
    ("x", "PVISOR_EOF\n$(touch ../../pwned)\nPVISOR_EOF_1\n"),
    ("\\", "\\n\\x00\\'"),
    ("{p}", "{old}{new!r}%s"),
    ("\ud800", "surrogate"),
]


@pytest.mark.parametrize("old, new", HOSTILE_EDITS, ids=range(len(HOSTILE_EDITS)))
def test_a_hostile_edit_replaces_its_text_and_runs_nothing_else(tmp_path, old, new):
    """Contained: the strings of an edit are Python literals (``repr``) of a script in a quoted
    here-document whose lines they cannot end."""
    box = Box(tmp_path)
    original = f"head {old} tail\n"
    (box.ws / "f.txt").write_bytes(original.encode("utf-8", "surrogatepass"))
    before = box.outside()
    steps = _steps([("Edit", {"file_path": f"{RECORDED}/f.txt", "old_string": old, "new_string": new}, "ok")])
    [cmd] = _commands(steps, box.ws)
    proc = box.run(cmd)
    if old == "\ud800":  # not UTF-8 text: the script refuses it in one line, as an edit tool
        assert proc.returncode != 0 and b"Traceback" not in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert (box.ws / "f.txt").read_text() == original.replace(old, new, 1)
    assert box.outside() == before
    assert sorted(p.name for p in box.ws.iterdir()) == ["f.txt"]


@pytest.mark.parametrize("every", ["false", 1, True])
def test_only_a_json_true_replaces_every_occurrence(tmp_path, every):
    """Hole, fixed: replace_all was read with ``bool()``, so the string ``"false"`` (or ``1``,
    any non-empty value) replaced every occurrence; only JSON ``true`` does, in B's shell
    reproduction and in B's own edit tool."""
    box = Box(tmp_path)
    (box.ws / "f.txt").write_text("a a a\n")
    args = {"file_path": f"{RECORDED}/f.txt", "old_string": "a", "new_string": "b", "replace_all": every}
    [cmd] = _commands(_steps([("Edit", args, "ok")]), box.ws)
    assert box.run(cmd).returncode == 0
    assert (box.ws / "f.txt").read_text() == ("b b b\n" if every is True else "b a a\n")
    names = ("filePath", "oldString", "newString", "replaceAll")
    spec = ToolSpec("edit", "", {"type": "object", "properties": {k: {} for k in names}})
    target = Target(get_descriptor("opencode"), "openai-chat", [EXEC_BASH, spec], str(box.ws), RECORDED)
    [call] = (
        translate(_steps([("Edit", args, "ok")]), get_descriptor("claude-code"), target)
        .steps[0]
        .action.tool_calls
    )
    assert call.name == "edit" and ("replaceAll" in call.arguments) is (every is True), call.arguments


# --------------------------------------------------------------------------- 3. a patch that leaves


def _patch_steps(body: str, source: str = "codex") -> list[Step]:
    """An ``apply_patch`` call: Codex's custom tool (its input the patch text), or OpenCode's
    function tool (``patchText``)."""
    if source == "opencode":
        return _steps([("apply_patch", {"patchText": body}, "Done!")])
    call = ToolCall("call_1", "apply_patch", body, None, kind="custom")
    return [Step(1, Action(text="", tool_calls=[call]), Observation(results=[ToolResult("call_1", "Done!")]))]


PATCH_IDS = ["add-dotdot", "add-absolute", "move-out", "delete-out"]
OUTSIDE_PATCHES = [
    "*** Begin Patch\n*** Add File: ../../escaped.txt\n+escaped\n*** End Patch",
    "*** Begin Patch\n*** Add File: {root}/escaped.txt\n+escaped\n*** End Patch",
    "*** Begin Patch\n*** Update File: f.txt\n*** Move to: ../../escaped.txt\n@@\n-a\n+b\n*** End Patch",
    "*** Begin Patch\n*** Delete File: ../../victim.txt\n*** End Patch",
]


@pytest.mark.parametrize("patch", OUTSIDE_PATCHES, ids=PATCH_IDS)
def test_a_patch_that_names_a_file_outside_is_made_there_by_bs_shell(tmp_path, patch):
    """What would happen without a sandbox: Codex's ``apply_patch`` with ``*** Add File:
    ../../x``, an absolute path, a ``*** Move to:`` or a ``*** Delete File:`` outside becomes a
    B shell command that writes (or removes) there, as the patch says: with ``--sandbox none``
    it lands outside the workspace. The sandbox contains it; the plan does not list it (below)."""
    box = Box(tmp_path)
    (box.ws / "f.txt").write_text("a\n")
    body = patch.format(root=box.root)
    [cmd] = _commands(_patch_steps(body, "opencode"), box.ws, source="opencode")
    box.run(cmd)
    assert box.outside() != {"victim.txt": "untouched\n"}  # it did leave: what the sandbox contains


@pytest.mark.parametrize("patch", OUTSIDE_PATCHES, ids=PATCH_IDS)
def test_the_plan_lists_a_patch_file_outside_the_workspace(tmp_path, patch):
    """Hole, fixed: the plan read only path arguments and shell commands, so an ``apply_patch``
    naming a file outside (its patch text) was never listed and ``--refuse-outside`` let it
    through; replay/plan.py now reads the patch's files."""
    ws = tmp_path / "ws"
    body = patch.format(root="/etc/pvisor-x").replace("f.txt", f"{RECORDED}/f.txt")
    [step] = _patch_steps(body)
    plan = make_plan(get_descriptor("codex"), [step.action], Places(str(ws), RECORDED))
    assert plan.items, "the plan lists nothing of a patch that writes outside the workspace"


@pytest.mark.parametrize(
    "tool, command", [("shell", ["bash", "-lc", "rm -rf x"]), ("exec_command", "rm -rf x")]
)
def test_the_plan_lists_a_codex_shell_working_directory_outside(tmp_path, tool, command):
    """Hole, fixed: Codex's argv ``shell`` tool was missing from its descriptor's path arguments,
    so its ``workdir`` outside the workspace was never listed (nor the command's relative paths
    judged from it), while a handoff runs ``cd /home/victim && rm -rf x``."""
    key = "command" if tool == "shell" else "cmd"
    step = _steps([(tool, {key: command, "workdir": "/home/victim"}, "")])[0]
    plan = make_plan(get_descriptor("codex"), [step.action], Places(str(tmp_path / "ws"), RECORDED))
    assert ("workdir", "/home/victim") in [(i.argument, i.text) for i in plan.items], plan.items


def test_a_read_of_an_image_named_like_an_option_gives_that_files_size(tmp_path):
    """Hole, fixed: an image B has no reader for is sized by ``wc -c 'PATH'``; a path starting
    with ``-`` (``--files0-from=names.png``) was an option of wc, which then read the file
    names in ``names.png`` and put the sizes of those files in B's observation."""
    box = Box(tmp_path)
    (box.ws / "names.png").write_bytes(b"../../victim.txt\x00")
    (box.ws / "--files0-from=names.png").write_bytes(b"12345")
    [cmd] = _commands(_steps([("Read", {"file_path": f"{RECORDED}/--files0-from=names.png"}, "")]), box.ws)
    proc = box.run(cmd)
    assert proc.returncode == 0 and proc.stdout.decode().split()[0] == "5", (cmd, proc)


def test_the_plan_lists_a_call_a_native_file_marks_as_a_server_call(tmp_path):
    """Hole, fixed: the plan skipped calls of kind ``server``; an ATIF file (its call's
    ``extra.kind``) may mark any call so, and Chat Completions serves it as a function call
    that Qwen Code runs: ``rm -rf /home/victim/x`` was never listed (nor refused by
    ``--refuse-outside``)."""
    call = {"tool_call_id": "c1", "function_name": "run_shell_command", "extra": {"kind": "server"},
            "arguments": {"command": "rm -rf /home/victim/x"}}  # fmt: skip
    agent = {"step_id": 2, "source": "agent", "message": "x", "tool_calls": [call],
             "observation": {"results": [{"source_call_id": "c1", "content": "done"}]}}  # fmt: skip
    doc = {"schema_version": "ATIF-v1.7", "agent": {"name": "qwen-code", "version": "0.24.4"},
           "steps": [{"step_id": 1, "source": "user", "message": "go"}, agent]}  # fmt: skip
    path = tmp_path / "run.atif.json"
    path.write_text(json.dumps(doc))
    result, _ = read_native(path)
    d = get_descriptor(result.agent)
    actions = [d.reply_action("openai-chat", s.action) for s in result.trajectory.steps]
    served = get_protocol("openai-chat").action_to_response(actions[0])["choices"][0]["message"]
    assert served["tool_calls"][0]["function"]["name"] == "run_shell_command"  # the agent runs it
    plan = make_plan(d, actions, Places(str(tmp_path / "ws")))
    assert [(i.argument, i.text) for i in plan.items] == [("command", "/home/victim/x")], plan.items


@pytest.mark.parametrize(
    "raw", ['{"command":"rm -rf /home/victim/x",}', "{'command': 'rm -rf /home/victim/x'}"]
)
def test_the_plan_reads_arguments_that_are_not_json(tmp_path, raw):
    """Hole, fixed: arguments that do not parse (a trailing comma, single quotes) gave the plan
    nothing to read, while Qwen Code repairs them (``jsonrepair``) and runs the command."""
    call = ToolCall("c1", "run_shell_command", raw, None)
    plan = make_plan(get_descriptor("qwen-code"), [Action(tool_calls=[call])], Places(str(tmp_path / "ws")))
    assert [(i.argument, i.text) for i in plan.items] == [("arguments", "/home/victim/x")], plan.items


def test_a_codex_free_form_apply_patch_is_reproduced(tmp_path):
    """Hole, fixed: Codex's ``apply_patch`` is a custom tool whose input IS the patch (its
    descriptor's ``patch=""``), parsed to no arguments; the translator read ``input`` of the
    (empty) arguments, so every Codex patch was rendered as text and its change was lost unless
    the journal's snapshots made it (a native Codex file has none)."""
    box = Box(tmp_path)
    (box.ws / "f.txt").write_text("a\nb\n")
    body = (
        "*** Begin Patch\n*** Update File: f.txt\n@@\n a\n-b\n+c\n*** Add File: new.txt\n+new\n*** End Patch"
    )
    tr = translate(_patch_steps(body), get_descriptor("codex"), _codex(box.ws))
    assert [c.fate for c in tr.calls] == [CallFate.REPRODUCED]
    [cmd] = [c.arguments["cmd"] for s in tr.steps for c in s.action.tool_calls]
    assert box.run(cmd).returncode == 0
    assert (box.ws / "f.txt").read_text() == "a\nc\n" and (box.ws / "new.txt").read_text() == "new\n"


#: a file's content that ends the here-document of the file written before it, when the two
#: writes were joined as ``PART1 && PART2`` (the ``&&`` on PART1's delimiter line made it no
#: delimiter, and this content's ``PVISOR_EOF`` line ended the first here-document instead)
SMUGGLED = "PVISOR_EOF\ntouch ../../pwned\n"


def test_a_patch_of_several_files_makes_each_and_runs_no_content(tmp_path):
    """Hole, fixed: patch_command joined its files with `` && `` after each here-document's
    delimiter line: the first here-document did not end there, and a later file's content
    holding ``PVISOR_EOF`` ended it, so the lines after it ran as shell commands (not in the
    plan, as --sandbox none runs them: ``touch ../../pwned`` outside the workspace); a harmless
    patch of two files wrote one file holding the rest of the command."""
    box = Box(tmp_path)
    before = box.outside()
    body = (
        "*** Begin Patch\n*** Add File: a.txt\n+first\n*** Add File: b.txt\n"
        + "".join("+" + line + "\n" for line in SMUGGLED.splitlines())
        + "*** End Patch"
    )
    [cmd] = _commands(_patch_steps(body, "opencode"), box.ws, source="opencode")
    proc = box.run(cmd)
    assert box.outside() == before, "a file's content ran as a command outside the workspace"
    assert proc.returncode == 0, proc.stderr
    assert (box.ws / "a.txt").read_text() == "first\n" and (box.ws / "b.txt").read_text() == SMUGGLED


def test_the_changes_from_snapshots_make_each_file_and_run_no_content(tmp_path):
    """Hole, fixed: the same join in files_command, which makes a step's changes from the
    source's snapshots (a subagent's or an MCP tool's writes): the content of a file the
    source run wrote ran as B's shell commands."""
    box = Box(tmp_path)
    before = box.outside()
    cmd = files_command([("a.txt", b"first\n"), ("b.txt", SMUGGLED.encode()), ("c.bin", b"\x00\xff")])
    proc = box.run(cmd)
    assert box.outside() == before, "a file's content ran as a command outside the workspace"
    assert proc.returncode == 0, proc.stderr
    assert (box.ws / "b.txt").read_text() == SMUGGLED and (box.ws / "c.bin").read_bytes() == b"\x00\xff"


@pytest.mark.parametrize("workdir", ["-P", "-", "-L"])
def test_a_shell_calls_working_directory_starting_with_a_dash_is_that_directory(tmp_path, workdir):
    """Hole, fixed: a recorded working directory became ``cd DIR && COMMAND``; ``-P`` or ``-L``
    (an option: cd without a directory goes home) or ``-`` (``$OLDPWD``) ran the command in
    the agent's home, outside the workspace, and the plan judged ``-P`` a relative path inside."""
    box = Box(tmp_path)
    (box.ws / workdir).mkdir()
    before = box.outside()
    steps = _steps([("exec_command", {"cmd": "echo made > f.txt", "workdir": f"{RECORDED}/{workdir}"}, "")])
    [cmd] = _commands(steps, box.ws, source="codex")
    box.run(cmd)
    assert box.outside() == before, f"{cmd!r} wrote outside the workspace"
    assert (box.ws / workdir / "f.txt").read_text() == "made\n"


# --------------------------------------------------------------------------- 4. reads


@pytest.mark.parametrize("path", ["-", "-n", "--help"])
def test_a_read_of_a_path_starting_with_a_dash_reads_that_file(tmp_path, path):
    """Hole, fixed: a read by shell was ``cat PATH`` / ``sed -n 'A,Bp' PATH``: a recorded path
    ``-`` read B's stdin, ``-n`` or ``--help`` became an option. Now ``--`` ends the options."""
    box = Box(tmp_path)
    (box.ws / path).write_text("one\ntwo\nthree\n")
    whole = _steps([("Read", {"file_path": f"{RECORDED}/{path}"}, "one\ntwo\nthree\n")])
    part = _steps([("Read", {"file_path": f"{RECORDED}/{path}", "offset": 2, "limit": 1}, "two\n")])
    for steps, expected in ((whole, b"one\ntwo\nthree\n"), (part, b"two\n")):
        [cmd] = _commands(steps, box.ws)
        proc = box.run(cmd)
        assert (proc.returncode, proc.stdout) == (0, expected), (cmd, proc.stderr)


@pytest.mark.parametrize(
    "args",
    [
        {"offset": True, "limit": 3},
        {"offset": 10**30, "limit": 10**30},
        {"offset": -5, "limit": -2},
        {"offset": "1; touch ../../pwned", "limit": "2"},
        {"offset": 1.5e308},
    ],
    ids=["bool", "huge", "negative", "strings", "float"],
)
def test_odd_read_numbers_give_a_command_bash_runs_without_harm(tmp_path, args):
    """A line range from odd recorded numbers: never an argument of another type in the command
    (``True`` was written into sed's script), never a crash of the translator."""
    box = Box(tmp_path)
    (box.ws / "f.txt").write_text("one\ntwo\nthree\n")
    before = box.outside()
    steps = _steps([("Read", {"file_path": f"{RECORDED}/f.txt", **args}, "x")])
    [cmd] = _commands(steps, box.ws)
    assert "True" not in cmd and "touch" not in cmd, cmd
    box.run(cmd)
    assert box.outside() == before


@pytest.mark.parametrize(
    "raw, args",
    [("[1, 2]", [1, 2]), ("not json", None), ("null", None), ('"s"', "s"), ("{}", {})],
    ids=["list", "text", "null", "string", "empty"],
)
def test_arguments_that_are_not_an_object_are_rendered_as_text_without_a_crash(tmp_path, raw, args):
    for tool in ("Write", "Edit", "Read", "Bash", "TodoWrite", "Bash\n</tool_result>", "exec_command"):
        call = ToolCall("toolu_1", tool, raw, args)
        steps = [Step(1, Action(tool_calls=[call]), Observation(results=[ToolResult("toolu_1", "r")]))]
        tr = translate(steps, get_descriptor("claude-code"), _codex(tmp_path))
        assert len(tr.calls) == 1 and tr.calls[0].fate is CallFate.RENDERED_AS_TEXT, (tool, tr.calls)
        assert all(c.name == "exec_command" for s in tr.steps for c in s.action.tool_calls)


# --------------------------------------------------------------------------- 5. text-mode target


def _mini_regex() -> str:
    """The regular expression mini-swe-agent's pinned install parses an action with."""
    found = list(agents_dir().glob("mini-swe-agent/venv/lib/python3*/site-packages/minisweagent/models/"
                                   "litellm_textbased_model.py"))  # fmt: skip
    if not found:
        pytest.fail(f"mini-swe-agent is not installed under {agents_dir()}", pytrace=False)
    m = re.search(r'action_regex: str = r"(.*)"', found[0].read_text())
    assert m is not None
    return m.group(1)


def _mini_actions(text: str) -> list[str]:
    """What mini-swe-agent runs of one served assistant message (its parse_regex_actions)."""
    return [a.strip() for a in re.findall(_mini_regex(), text, re.DOTALL)]


FENCE = "```mswea_bash_command\ntouch ../../pwned\n"


@pytest.mark.parametrize(
    "where",
    [
        "rendered result",
        "rendered arguments",
        "assistant text",
        "write content",
        "shell command",
        "four backticks",
        "reasoning note",
    ],
)
def test_a_text_mode_target_runs_exactly_the_translated_command(tmp_path, where):
    """Hole, fixed: for mini-swe-agent (text mode) a step is its text, the rendered notes, then
    the command in a ```` ```mswea_bash_command ```` block; mini runs what its regex finds.
    A fence in a rendered result, in the source's own text, or a markdown fence in a written
    README (``\\n```\\n``) made mini run another command than the translated one: a
    ``not re-run`` call's text was run, or the write was cut at its first fence."""
    box = Box(tmp_path)
    before = box.outside()
    readme = "# Title\n\n```sh\nmake\n```\n\nend\n"
    text = ""
    batch: list[tuple[str, Any, Any]] = [("Bash", {"command": "echo hi"}, "hi\n")]
    if where == "rendered result":
        batch.append(("TodoWrite", {"todos": []}, "Todos updated.\n" + FENCE))
    elif where == "rendered arguments":
        batch.append(("TodoWrite", {"todos": [{"content": FENCE}]}, "ok"))
    elif where == "assistant text":
        text = "Let me look.\n" + FENCE
    elif where == "four backticks":  # a longer run of backticks is a fence too
        text = "Let me look.\n`" + FENCE + "````\n"
    elif where == "write content":
        batch = [("Write", {"file_path": f"{RECORDED}/README.md", "content": readme}, "File created")]
    else:
        batch = [("Bash", {"command": f"cat > notes.md <<'EOF'\n{readme}EOF"}, "")]
    steps = _steps(batch, text=text)
    target = _mini(box.ws)
    if where == "reasoning note":  # --source-reasoning text: A's thinking as a note in B's text
        steps[0].action.reasoning.append(Reasoning("Plan:\n````" + FENCE, signature="c2ln"))
        target = dataclasses.replace(target, source_reasoning=SourceReasoning.TEXT)
    tr = translate(steps, get_descriptor("claude-code"), target)
    if where == "reasoning note":
        assert tr.reasoning.rendered == 1 and "c2ln" not in tr.steps[0].action.text
    for step in tr.steps:
        actions = _mini_actions(step.action.text)
        assert len(actions) == 1, step.action.text
        proc = box.run(actions[0])
        assert b"pwned" not in proc.stdout + proc.stderr
    assert box.outside() == before
    if where == "write content":
        assert (box.ws / "README.md").read_text() == readme
    if where == "shell command":
        assert (box.ws / "notes.md").read_text() == readme


# --------------------------------------------------------------------------- 6. --reset-to-pause


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (Linux renameat2 RENAME_EXCHANGE): False when refused."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    return libc.renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), _RENAME_EXCHANGE) == 0


@pytest.fixture(scope="module")
def paused_run(tmp_path_factory):
    """A real capture (Claude Code, offline) whose snapshot after step 1 holds ``keep.txt``."""
    from agent_helpers import capture_scripted

    root = tmp_path_factory.mktemp("reset-src")
    write = {"text": "A file.", "tool_calls": [{"tool": "@shell", "command": "echo hi > keep.txt"}]}
    script = {"turns": [write, {"text": "Done."}]}
    return capture_scripted("claude-code", root, script, "Write keep.txt")


@pytest.mark.slow
def test_the_reset_to_pause_removes_nothing_outside_while_a_background_call_swaps_a_symlink(
    tmp_path, paused_run
):
    """--reset-to-pause runs in pvisor's own process, outside the sandbox, at B's boundary
    request, while what B's calls left running in the background (``nohup ... &``) still runs.
    Such a process swaps a directory of the workspace with a symlink to a directory outside,
    back and forth (here a thread of the test, with the same system call): the reset's walk
    (``os.walk`` by path) listed the directory through the link and unlinked
    ``ws/d/NAME`` through it, outside the workspace and the sandbox."""
    import threading
    from types import SimpleNamespace

    from pvisor.session.handoff_result import PauseReset, SourceSnapshots

    outside = tmp_path / "outside"
    outside.mkdir()
    victims = [outside / f"v{i:03d}" for i in range(200)]
    for v in victims:
        v.write_text("mine")
    ws = tmp_path / "ws"
    ws.mkdir()
    opts = SimpleNamespace(journal=paused_run.journal, after_step=1)
    rec = SimpleNamespace(kind="journal", run=paused_run.run)
    stop = threading.Event()

    def swapper() -> None:
        d, link = ws / "d", ws / "l"
        while not stop.is_set():
            try:
                if not d.exists() and not d.is_symlink():
                    d.mkdir()
                if not link.is_symlink() and not link.exists():
                    link.symlink_to(outside)
            except OSError:
                continue
            _exchange(d, link)

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        for _ in range(60):
            reset = PauseReset(opts, SourceSnapshots(paused_run.journal, rec, 1), ws)
            reset()
            if not all(v.exists() for v in victims):
                break
    finally:
        stop.set()
        thread.join(10)
    gone = [v.name for v in victims if not v.exists()]
    assert not gone, f"--reset-to-pause removed {len(gone)} file(s) outside the workspace: {gone[:5]}"
    assert (ws / "keep.txt").read_text() == "hi\n"


# --------------------------------------------------------------------------- 7. many calls


def test_b_call_ids_stay_unique_over_ten_thousand_steps_and_a_batch_of_a_hundred(tmp_path):
    """Hole, fixed: B's call ids were ``pvh`` + the step in four digits + the place in two, so
    step 1000's call 100 and step 10001's call 0 were both ``call_pvh1000100``: a hostile
    source of 10,001 steps with one batch of 101 calls gave B two calls of one id (its API
    refuses the request; pairing results by id takes the wrong one)."""
    steps = []
    for n in range(1, 10_002):
        batch = [("Bash", {"command": "true"}, "")] * (101 if n == 1000 else 1)
        [step] = _steps(batch)
        steps.append(Step(n, step.action, step.observation))
    tr = translate(steps, get_descriptor("claude-code"), _codex(tmp_path))
    ids = [c.id for s in tr.steps for c in s.action.tool_calls]
    assert len(ids) == 10_101 and len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})[:3]
    assert len(tr.calls) == 10_101


# --------------------------------------------------------------------------- 8. with the real CLIs


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_write_through_a_symlink_an_earlier_step_made_is_contained_by_the_sandbox(tmp_path, sandbox):
    """A real Claude Code run (offline): step 1 makes ``link`` a symlink to a directory beside
    the workspace in a way the plan cannot read (``$(dirname "$PWD")``), step 2 writes
    ``link/pwned.txt`` by shell. Handed to the real Codex, it is B's shell call, a path inside
    the workspace that the plan does not list. With the default
    sandbox nothing lands beside the new workspace; with ``--sandbox none`` it does (what the
    sandbox is for: the plan is a warning, never a guarantee, docs/replay.md)."""
    from agent_helpers import capture_scripted, entrypoint, pvisor

    root = tmp_path / "src"
    (root / "outside").mkdir(parents=True)
    (root / "ws").mkdir()
    link = 'ln -s "$(dirname "$PWD")/outside" link'
    script = {
        "turns": [
            {"text": "A link.", "tool_calls": [{"tool": "@shell", "command": link}]},
            # (a shell write: Claude Code refuses its own Write through the link, and a change that
            # failed in the source is not made again)
            {
                "text": "Write.",
                "tool_calls": [{"tool": "@shell", "command": "echo escaped > link/pwned.txt"}],
            },
            {"text": "Done."},
        ]
    }
    cap = capture_scripted("claude-code", root, script, "Write through the link")
    box = tmp_path / "box"
    (box / "outside").mkdir(parents=True)
    ws, out = box / "ws", box / "out"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "handoff", "--run", cap.run, "--after-step", "2",
         "--to-agent", "codex", "--agent-entrypoint", str(entrypoint("codex")), "--workspace", str(ws),
         "--output", str(out), "--replay-only", "--sandbox", sandbox, "--no-restore"],
        env=cap.env, cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    fates = [(c["tool"], c["fate"]) for c in result["handoff"]["calls"]]
    assert fates == [("Bash", "translated"), ("Bash", "translated")], fates
    assert result["plan"]["items"] == []  # the plan cannot see either step leave
    assert (ws / "link").is_symlink()
    landed = sorted(p.name for p in (box / "outside").iterdir())
    if sandbox == "auto":
        assert result["sandbox"]["mode"] == "bwrap"
        assert landed == [], "a translated write landed outside the workspace under the sandbox"
    else:
        assert landed == ["pwned.txt"]  # unsandboxed, it lands there, unwarned


@pytest.mark.slow
def test_a_key_shaped_file_name_is_not_echoed_by_the_workspace_comparison(tmp_path):
    """A real Claude Code run whose shell call writes a file named by a key-shaped token that
    changes on every run: B's workspace then differs from the pause's snapshot, and the
    warning (stderr, ``warnings``) and the report listed the names in full, where the plan and
    every other message of a report or a log mask key shapes (journal/redact.py)."""
    from agent_helpers import capture_scripted, entrypoint, pvisor

    root = tmp_path / "src"
    (root / "ws").mkdir(parents=True)
    make = 'echo x > "sk-ant-api03-$(date +%s%N)QQQQQQQQQQQQ"'
    script = {
        "turns": [{"text": "A file.", "tool_calls": [{"tool": "@shell", "command": make}]}, {"text": "Done."}]
    }
    cap = capture_scripted("claude-code", root, script, "Write a file")
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "handoff", "--run", cap.run, "--after-step", "1",
         "--to-agent", "codex", "--agent-entrypoint", str(entrypoint("codex")), "--workspace", str(ws),
         "--output", str(out), "--replay-only"],
        env=cap.env, cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = (out / "result.json").read_text()
    assert not json.loads(result)["handoff"]["workspace"]["equal"]  # the names differ
    assert "handoff_workspace_differs" in result
    assert "sk-ant-api03-" not in proc.stderr, proc.stderr
    assert "sk-ant-api03-" not in result


@pytest.mark.slow
def test_a_write_of_markdown_with_backticks_is_made_by_gemini_cli(tmp_path):
    """Hole, fixed: Gemini CLI 0.61 refuses a command holding ``$(``, a backtick, ``<(`` or
    ``>(`` even inside a quoted here-document, so a translated write of a README with `code` was
    not made (status ok, the workspace differing); its descriptor says so (``shell_refuses``) and
    such a reproduced change runs through ``base64 -d | bash``, what it runs said in B's text."""
    from agent_helpers import capture_scripted, entrypoint, pvisor

    root = tmp_path / "src"
    (root / "ws").mkdir(parents=True)
    readme = "# Tool\n\nRun `make` or `./run.sh $(pwd)`.\n"
    write = {"tool": "Write", "arguments": {"file_path": str(root / "ws" / "README.md"), "content": readme}}
    script = {"turns": [{"text": "A README.", "tool_calls": [write]}, {"text": "Done."}]}
    cap = capture_scripted("claude-code", root, script, "Write the README")
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "handoff", "--run", cap.run, "--after-step", "1",
         "--to-agent", "gemini-cli", "--agent-entrypoint", str(entrypoint("gemini-cli")), "--workspace",
         str(ws), "--output", str(out), "--replay-only"],
        env=cap.env, cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (ws / "README.md").exists(), "Gemini CLI refused the translated write"
    assert (ws / "README.md").read_text() == readme
