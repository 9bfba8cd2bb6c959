"""Issue 38: a handoff's translation (:mod:`pvisor.replay.translate`) for every ordered pair of
the six launchable agents, in process.

A source run of agent A (a shell call, a file write, an edit, a parallel batch of two reads, a
plan call where A declares one) is built as journal steps with A's own tool and argument names,
checked against the tools A declared in its real request 1. It is translated for agent B with
the tools B declared in ITS real request 1: both requests are read at test time from the
session's captures of the real CLIs (tests/agent_captures.py; Claude Code's traffic is never
committed). Then, per pair:

1. B's request N+1 (request 1, the translated actions and the recorded observations appended)
   passes B's strict validator;
2. every translated call names a tool B declared, and its arguments validate against that
   tool's parameter schema with the ``jsonschema`` library (not translate's own check);
3. every source call is accounted for once, with the fate its effect gives it;
4. B's shell calls, run for real with bash in a fresh workspace, leave the files A's calls left.

Then translate's shell text run for real on harder cases (writes without a final newline or
holding the here-document delimiter, CRLF, quotes, non-ASCII, replace-all edits, patches of
Codex and OpenCode, ranged reads), a source in text mode, and the refusals (a target without a
shell tool, a call B's schema refuses, a change that failed in the source).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from handoff_helpers import LAUNCHABLE, FirstRequest, first_request, request_after
from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.agents.effects import Effect, Role
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.validate import validate_request
from pvisor.journal.model import Action, Message, Observation, Step, TextPart, ToolCall, ToolResult, ToolSpec
from pvisor.replay.translate import (
    TEXT_MODE_TOOL,
    CallFate,
    Target,
    Translation,
    TranslationRefused,
    translate,
)

#: the workspace the source run was recorded in (A's absolute paths lie under it)
RECORDED = "/recorded/ws"

#: what the source run's write puts in src/app.py: quotes, non-ASCII, shell specials, the
#: here-document delimiter translate uses (and its first fallback) as whole lines
APP = (
    "# app \u00fc \u2014 \"double\" 'single' $HOME `tick` \\back %s %%\n"
    "PVISOR_EOF\n"
    "PVISOR_EOF_1\n"
    'greeting = "old"\n'
    "tail = 'kept'\n"
)
EDIT_OLD = 'greeting = "old"'
EDIT_NEW = "greeting = \"new \u2018\u00fc\u2019\" + 'x'"
#: the files the source run leaves (its start state has an empty logs/ directory)
FINAL = {"logs/run.log": "started\n", "src/app.py": APP.replace(EDIT_OLD, EDIT_NEW, 1)}
#: the lines of src/app.py the source run's ranged read (step 6) gives: lines 2..3
RANGED = "".join(FINAL["src/app.py"].splitlines(keepends=True)[1:3])

#: each agent's own tools a handoff routes to, as its captured request 1 declares them (part 2):
#: None where it has none (then B's shell makes the change, or the call stays text)
NATIVE: dict[str, dict[str, str | None]] = {
    "claude-code": {"write": "Write", "edit": "Edit", "read": "Read", "todo": None},  # TodoWrite deferred
    "codex": {"write": None, "edit": None, "read": None, "todo": None},  # goals only; no apply_patch
    "gemini-cli": {"write": "write_file", "edit": "replace", "read": "read_file", "todo": "write_todos"},
    "opencode": {"write": "write", "edit": "edit", "read": "read", "todo": "todowrite"},
    # todo_write is deferred and its request 1 does not name it: not routed
    "qwen-code": {"write": "write_file", "edit": "edit", "read": "read_file", "todo": None},
    "mini-swe-agent": {"write": None, "edit": None, "read": None, "todo": None},
}


def range_args(b: str, first: int, last: int) -> dict[str, int]:
    """Lines ``first``..``last`` (1-based, included) in B's read tool's own terms: Claude Code's
    and OpenCode's offset counts from 1, Qwen Code's from 0; Gemini CLI names both ends."""
    n = last - first + 1
    return {
        "claude-code": {"offset": first, "limit": n},
        "gemini-cli": {"start_line": first, "end_line": last},
        "opencode": {"offset": first, "limit": n},
        "qwen-code": {"offset": first - 1, "limit": n},
    }[b]


RANGE_ARGS = {b: range_args(b, 2, 3) for b in ("claude-code", "gemini-cli", "opencode", "qwen-code")}
#: the agents whose edit and write tools refuse a file not read first (checked with the CLIs)
READ_FIRST = ("claude-code", "qwen-code")


@dataclass(frozen=True)
class Tools:
    """An agent's tools as this test writes its source calls: the shell tool and its command
    (and working-directory) argument, and the write, edit, read and plan tools it has (None:
    done through the shell). Names are checked against the agent's captured request 1."""

    shell: str
    command: str
    workdir: str | None = None
    shell_extra: dict[str, Any] = field(default_factory=dict)
    write: tuple[str, str, str] | None = None  # tool, path argument, content argument
    edit: tuple[str, str, str, str, dict[str, Any]] | None = None  # tool, path, old, new, extra
    read: tuple[str, str] | None = None  # tool, path argument
    plan: tuple[str, dict[str, Any]] | None = None  # a plan (or subagent) call: tool, arguments
    ranged: dict[str, Any] | None = None  # the read tool's arguments for lines 2..3


TOOLS: dict[str, Tools] = {
    "claude-code": Tools(
        "Bash",
        "command",
        shell_extra={"description": "Start the log"},
        write=("Write", "file_path", "content"),
        edit=("Edit", "file_path", "old_string", "new_string", {}),
        read=("Read", "file_path"),
        # Claude Code 2.1 defers TodoWrite (ToolSearch): its request 1 offers a subagent instead
        plan=("Agent", {"description": "Plan the work", "prompt": "List the steps of the task."}),
        ranged={"offset": 2, "limit": 2},
    ),
    "codex": Tools(
        "exec_command", "cmd", workdir="workdir", plan=("create_goal", {"objective": "Write the app"})
    ),
    "gemini-cli": Tools(
        "run_shell_command",
        "command",
        workdir="dir_path",
        shell_extra={"description": "Start the log"},
        write=("write_file", "file_path", "content"),
        edit=("replace", "file_path", "old_string", "new_string", {"instruction": "Greet anew."}),
        read=("read_file", "file_path"),
        plan=(
            "write_todos",
            {
                "todos": [
                    {"description": "Write the app", "status": "in_progress"},
                    {"description": "Ship it", "status": "blocked"},
                ]
            },
        ),
        ranged={"start_line": 2, "end_line": 3},
    ),
    "opencode": Tools(
        "bash",
        "command",
        workdir="workdir",
        write=("write", "filePath", "content"),
        edit=("edit", "filePath", "oldString", "newString", {}),
        read=("read", "filePath"),
        plan=(
            "todowrite",
            {"todos": [{"content": "Write the app", "status": "cancelled", "priority": "high"}]},
        ),
        ranged={"offset": 2, "limit": 2},
    ),
    "qwen-code": Tools(
        "run_shell_command",
        "command",
        workdir="directory",
        shell_extra={"is_background": False},
        write=("write_file", "file_path", "content"),
        edit=("edit", "file_path", "old_string", "new_string", {}),
        read=("read_file", "file_path"),
        plan=("update_goal", {"status": "complete", "reason": "The app is written."}),
        ranged={"offset": 1, "limit": 2},
    ),
    "mini-swe-agent": Tools("bash", "command"),
}


# --------------------------------------------------------------------------- the source run


@dataclass
class SourceCall:
    """One call of the source run and what the test expects of it: ``kind`` (shell, write,
    edit, read, plan), whether A made it with its shell (``by_shell``), its recorded result."""

    step: int
    call: ToolCall
    kind: str
    by_shell: bool
    result: str


def source_run(agent: str, protocol: str) -> tuple[list[Step], list[SourceCall]]:
    """A's run (call ids of A's ``protocol``): 1 shell (in logs/), 2 write src/app.py, 3 edit
    it, 4 read it and logs/run.log in one batch, 5 a plan call (where A has one). A without a
    write, edit or read tool makes it with a shell command, as Codex and mini-swe-agent do."""
    t = TOOLS[agent]
    calls: list[SourceCall] = []
    prefix = get_protocol(protocol).CALL_ID_PREFIX

    def _call(step: int, index: int, name: str, args: dict[str, Any]) -> ToolCall:
        return ToolCall(f"{prefix}src{step}{index}", name, orjson.dumps(args).decode(), args)

    def shell(step: int, index: int, command: str, kind: str, result: str, cwd: str | None = None) -> None:
        args: dict[str, Any] = {t.command: command, **(t.shell_extra if kind == "shell" else {})}
        if cwd is not None:
            args[t.workdir or ""] = cwd
        calls.append(SourceCall(step, _call(step, index, t.shell, args), kind, True, result))

    # 1: a shell call in a directory of the workspace (its working-directory argument where A has one)
    if t.workdir is not None:
        shell(1, 0, "echo started > run.log && pwd", "shell", f"{RECORDED}/logs", cwd=f"{RECORDED}/logs")
    else:
        shell(1, 0, "cd logs && echo started > run.log && pwd", "shell", f"{RECORDED}/logs")
    # 2: write
    if t.write is not None:
        name, path, content = t.write
        args = {path: f"{RECORDED}/src/app.py", content: APP}
        calls.append(SourceCall(2, _call(2, 0, name, args), "write", False, "Wrote src/app.py"))
    else:
        shell(2, 0, f"mkdir -p src && cat > src/app.py <<'APP_END'\n{APP}APP_END", "write", "")
    # 3: edit
    if t.edit is not None:
        name, path, old, new, extra = t.edit
        args = {path: f"{RECORDED}/src/app.py", old: EDIT_OLD, new: EDIT_NEW, **extra}
        calls.append(SourceCall(3, _call(3, 0, name, args), "edit", False, "Edited src/app.py"))
    else:
        script = (
            "import pathlib; p = pathlib.Path('src/app.py'); "
            f"p.write_text(p.read_text().replace({EDIT_OLD!r}, {EDIT_NEW!r}, 1))"
        )
        shell(3, 0, f"python3 - <<'PY'\n{script}\nPY", "edit", "")
    # 4: two reads in one batch
    for i, rel in enumerate(("src/app.py", "logs/run.log")):
        if t.read is not None:
            name, path = t.read
            call = _call(4, i, name, {path: f"{RECORDED}/{rel}"})
            calls.append(SourceCall(4, call, "read", False, FINAL[rel]))
        else:
            shell(4, i, f"cat {rel}", "read", FINAL[rel])
    # 5: a plan call: B's own plan tool of its kind where B declares one, else text in B's message
    if t.plan is not None:
        name, args = t.plan
        calls.append(SourceCall(5, _call(5, 0, name, args), "plan", False, f"PLAN-RESULT of {agent}"))
    # 6: a read of lines 2..3
    if t.read is not None and t.ranged is not None:
        name, path = t.read
        call = _call(6, 0, name, {path: f"{RECORDED}/src/app.py", **t.ranged})
        calls.append(SourceCall(6, call, "ranged", False, RANGED))
    else:
        shell(6, 0, "sed -n '2,3p' src/app.py", "ranged", RANGED)
    steps = []
    for n in sorted({c.step for c in calls}):
        mine = [c for c in calls if c.step == n]
        action = Action(text=f"Step {n} of {agent}.", tool_calls=[c.call for c in mine])
        results = [ToolResult(c.call.id, c.result) for c in mine]
        steps.append(Step(n, action, Observation(results=results)))
    return steps, calls


# --------------------------------------------------------------------------- checks


def schema_problems(spec: ToolSpec, args: Any) -> list[str]:
    """What the ``jsonschema`` library finds wrong in ``args`` for the tool's declared schema."""
    schema = spec.parameters if isinstance(spec.parameters, dict) else {}
    return [
        f"{'/'.join(map(str, e.path)) or '.'}: {e.message}"
        for e in _validator(orjson.dumps(schema)).iter_errors(args)
    ]


@functools.lru_cache(maxsize=None)
def _validator(schema_json: bytes) -> Any:
    """A validator of the schema's own draft (2020-12 when it names none), the schema checked."""
    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


@pytest.fixture(scope="module")
def requests(captured) -> dict[str, FirstRequest]:
    """Each agent's request 1, read from the session's capture of the real CLI."""
    out = {}
    for agent in LAUNCHABLE:
        cap = captured(agent)
        assert cap.proc.returncode == 0, f"{agent}: {cap.proc.stderr}"
        out[agent] = first_request(cap)
    return out


def target(requests: dict[str, FirstRequest], agent: str, workspace: Path, **tools: Any) -> Target:
    req = requests[agent]
    return Target(
        get_descriptor(agent),
        req.protocol,
        tools.get("tools", req.tools),
        str(workspace),
        RECORDED,
        exists=tools.get("exists"),
    )


#: the environment B's shell commands run in here: this interpreter's ``python3`` first on PATH
#: (a reproduced edit runs ``python3``; a version manager's shim in front would cost 0.1 s a call)
SHELL_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_each(cwd: Path, commands: list[tuple[str, str]]) -> tuple[list[int], str]:
    """Each ``(directory, command)`` in a subshell of one bash started in ``cwd`` (``cd`` to the
    directory first when it is not ""), one after another: (each one's exit status, stderr).
    One process for all keeps the test fast; each subshell starts afresh in ``cwd``."""
    script = "\n".join(
        f"(\n{'cd ' + shlex.quote(d) + ' || exit 99' if d else ':'}\n{cmd}\n) >/dev/null\necho $?"
        for d, cmd in commands
    )
    proc = subprocess.run(
        ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120, env=SHELL_ENV
    )
    return [int(line) for line in proc.stdout.split()], proc.stderr


def run_shell_calls(translation: Translation, b: str, workspace: Path) -> None:
    """B's calls in order: its shell calls each in a fresh subshell in ``workspace`` (B's shell
    starts there), its own write and edit tools' calls made as the tools make them (the whole
    content; the old text, once unless told every time, which must be there), reads and plans
    changing nothing: the re-enactment of the history, minus the model. Every path B's own tools
    name is absolute and in the workspace; a read names a file there, or one an earlier call of
    B's own tool makes (a read served before a write of a file that may exist)."""
    shell, d = TOOLS[b].shell, get_descriptor(b)
    commands: list[tuple[str, str]] = []

    def flush() -> None:
        status, stderr = run_each(workspace, commands)
        assert status == [0] * len(commands), (status, stderr)
        commands.clear()

    later_written = {
        orjson.loads(c.arguments_raw)[d.effect_of(c.name).arg(Role.PATH)]
        for s in translation.steps
        for c in s.action.tool_calls
        if d.effect_of(c.name).effect is Effect.WRITE
    }
    for step in translation.steps:
        for call in step.action.tool_calls:
            args = orjson.loads(call.arguments_raw)
            fx = d.effect_of(call.name)
            if call.name == shell:
                commands.append(("", args[TOOLS[b].command]))
                continue
            flush()
            if fx.effect is Effect.PLAN:
                continue
            path = Path(args[fx.arg(Role.PATH)])
            assert path.is_absolute() and path.is_relative_to(workspace), (step.n, path)
            if fx.effect is Effect.READ:
                assert path.is_file() or str(path) in later_written, (step.n, path)
            elif fx.effect is Effect.WRITE:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(args[fx.arg(Role.CONTENT)].encode())
            else:
                assert fx.effect is Effect.EDIT, (step.n, call.name)
                text, old, new = path.read_bytes().decode(), args[fx.arg(Role.OLD)], args[fx.arg(Role.NEW)]
                every = bool(args.get(fx.arg(Role.ALL) or "", False))
                assert old in text and (every or text.count(old) == 1), (step.n, old)
                path.write_bytes((text.replace(old, new) if every else text.replace(old, new, 1)).encode())
    flush()


def files_of(workspace: Path) -> dict[str, str]:
    return {
        p.relative_to(workspace).as_posix(): p.read_bytes().decode("utf-8")
        for p in sorted(workspace.rglob("*"))
        if p.is_file()
    }


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("agent", LAUNCHABLE)
def test_the_source_calls_are_ones_the_agent_declares(requests, agent):
    # the source runs are honest: A's tools and argument names as A's real request 1 offers them
    steps, calls = source_run(agent, requests[agent].protocol)
    assert {c.kind for c in calls} >= {"shell", "write", "edit", "read"}
    for c in calls:
        spec = requests[agent].tool(c.call.name)
        assert spec is not None, (
            f"{agent} declares no {c.call.name}: {[t.name for t in requests[agent].tools]}"
        )
        assert schema_problems(spec, c.call.arguments) == [], (agent, c.call.name)
    assert [len(s.action.tool_calls) for s in steps if s.n == 4] == [2]  # the reads are one batch


PAIRS = [(a, b) for a in LAUNCHABLE for b in LAUNCHABLE]


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_a_run_of_a_translates_into_b(requests, tmp_path, a, b):
    steps, calls = source_run(a, requests[a].protocol)
    workspace = tmp_path / "ws"
    (workspace / "logs").mkdir(parents=True)
    req = requests[b]
    declared = {t.name: t for t in req.tools}
    shell, read = TOOLS[b].shell, TOOLS[b].read[0] if TOOLS[b].read else None
    assert shell in declared and (read is None or read in declared), sorted(declared)

    tr = translate(steps, get_descriptor(a), target(requests, b, workspace, exists=os.path.lexists))

    # 1. B's request N+1 ends at the translated history and passes B's strict validator
    body = request_after(req.protocol, req.body, tr.steps)
    assert validate_request(req.protocol, body) == []
    conv = get_protocol(req.protocol).parse_request(orjson.dumps(body), path=req.path)
    sent = [c.id for m in conv.messages for c in m.parts if isinstance(c, ToolCall)]
    assert sent == [c.id for s in tr.steps for c in s.action.tool_calls]

    # 2. every translated call is a tool B declared, with arguments its schema accepts
    ids = []
    for step in tr.steps:
        assert step.action.tool_calls, f"B's step {step.n} carries no call: a reply without one ends B"
        for call in step.action.tool_calls:
            assert call.name in declared, (step.n, call.name)
            assert call.arguments == orjson.loads(call.arguments_raw)
            assert schema_problems(declared[call.name], call.arguments) == [], (step.n, call.name)
            assert call.id.startswith(get_protocol(req.protocol).CALL_ID_PREFIX)
            ids.append(call.id)
        assert [r.call_id for r in step.observation.results] == [c.id for c in step.action.tool_calls]
    assert len(ids) == len(set(ids))

    # 3. every source call accounted for once, by its effect
    accounts = {c.call_id: c for c in tr.calls}
    assert len(tr.calls) == len(calls) and set(accounts) == {c.call.id for c in calls}
    assert tr.skipped == [] and tr.shell_tool == shell and tr.read_tool == read
    mine = NATIVE[b]
    for c in calls:
        acc = accounts[c.call.id]
        assert (acc.step, acc.tool) == (c.step, c.call.name)
        if c.kind == "plan":
            want_plan = plan_route(a, b)
            if want_plan is None:
                assert acc.fate is CallFate.RENDERED_AS_TEXT and acc.target_tool is None
                assert c.result in tr.steps[acc.target_step - 1].action.text  # attributed as B's own words
                if a == "claude-code":  # its plan-like call is a subagent: not re-enacted
                    assert "subagent's own steps" in acc.reason
                continue
            assert (acc.fate, acc.target_tool) == (CallFate.TRANSLATED, want_plan) and acc.reason.startswith(
                "native"
            )
        elif c.kind in ("write", "edit") and not c.by_shell:
            # B's own tool of the same kind where it declares one, else a shell call making it
            ok = mine[c.kind] is not None
            want = (CallFate.TRANSLATED, mine[c.kind]) if ok else (CallFate.REPRODUCED, shell)
            assert (acc.fate, acc.target_tool) == want, (c.kind, acc)
        elif c.kind in ("read", "ranged") and not c.by_shell and read is not None:
            assert (acc.fate, acc.target_tool) == (CallFate.TRANSLATED, read) and acc.reason.startswith(
                "native"
            )
        else:
            assert (acc.fate, acc.target_tool) == (CallFate.TRANSLATED, shell), (c.kind, acc)
        carried = tr.steps[acc.target_step - 1]
        assert carried.action.tool_calls[acc.target_index].name == acc.target_tool
        assert carried.observation.results[acc.target_index].content == c.result  # O paired with its call
        if c.kind == "ranged" and not c.by_shell and read is not None:
            args = orjson.loads(carried.action.tool_calls[acc.target_index].arguments_raw)
            assert {k: v for k, v in args.items() if k in RANGE_ARGS[b]} == RANGE_ARGS[b], args
    reads = [accounts[c.call.id] for c in calls if c.kind == "read"]
    assert [(r.target_step, r.target_index) for r in reads] == [
        (reads[0].target_step, 0),
        (reads[0].target_step, 1),
    ]
    # a read served first where B's write or edit tool wants one: step 1's shell may have made
    # src/app.py, so B reads it before its Write (the edit after B's own write needs none)
    natively = b in READ_FIRST and any(c.kind == "write" and not c.by_shell for c in calls)
    assert [(r["source_step"], r["path"]) for r in tr.inserted_reads] == (
        [(2, "src/app.py")] if natively else []
    )
    for r in tr.inserted_reads:
        assert (
            r["target_step"] + 1 == accounts[[c for c in calls if c.kind == "write"][0].call.id].target_step
        )
        assert tr.step_map[2] == [r["target_step"], r["target_step"] + 1]

    # 4. B's calls, run for real (its own tools' as they make them), leave what A's calls left
    run_shell_calls(tr, b, workspace)
    assert files_of(workspace) == FINAL


def plan_route(a: str, b: str) -> str | None:
    """The tool of B that A's plan call goes to: a todo list to B's todo tool, a goal to B's
    goal tool of the same name; None: rendered as text."""
    name = TOOLS[a].plan[0] if TOOLS[a].plan else None
    if a == b:  # the same tool (Claude Code's is a subagent: never re-enacted)
        return None if a == "claude-code" else name
    if name in ("write_todos", "todowrite"):
        return NATIVE[b]["todo"]
    if name == "update_goal" and b == "codex":  # Codex declares an update_goal too
        return "update_goal"
    return None


# --------------------------------------------------------------------------- shell text

#: whole-file contents a reproduced write must leave byte for byte
WRITES = [
    "no newline at the end \u00fc",
    "ends with the delimiter\nPVISOR_EOF",
    "PVISOR_EOF\nPVISOR_EOF_1\nPVISOR_EOF_2\n",
    "",
    "\n",
    "crlf\r\nlines\r\n",
    "-n starts like an option\n",
    "100% %s \\n 'single' \"double\" $(echo no) `echo no` \\\n",
    "\u2603 snow \u4e2d\u6587 \U0001f600 no newline",
]
#: (file before, old, new, every occurrence): what a reproduced edit must leave
EDITS = [
    ("a x b x c x\n", "x", "\u00fc", True),
    ("a x b x c x", "x", "'y'", False),
    ('one "q" \\ two\nthree\n', '"q" \\ two\nth', "", False),
    ("PVISOR_EOF\nkeep\n", "PVISOR_EOF\n", "PVISOR_EOF_1\nPVISOR_EOF\n", False),
]
WRITERS = [a for a in LAUNCHABLE if TOOLS[a].write is not None]


def _shell_of(tr: Translation, b: str) -> list[str]:
    return [orjson.loads(c.arguments_raw)[TOOLS[b].command] for s in tr.steps for c in s.action.tool_calls]


@pytest.mark.parametrize("a", WRITERS)
def test_a_reproduced_write_or_edit_leaves_the_file_the_tool_left(requests, tmp_path, a):
    # translate's shell text, run for real: a here-document or printf for a write, a python3
    # replacement for an edit (the content of each case ends up byte for byte)
    b = "mini-swe-agent"  # its only tool is bash: every write and edit goes through it
    t = TOOLS[a]
    wname, wpath, wcontent = t.write
    ename, epath, eold, enew, extra = t.edit
    all_arg = get_descriptor(a).effect_of(ename).arg(Role.ALL)
    rel = "dir with space/it's \u00fc.txt"

    def command(call: ToolCall) -> str:
        tr = translate([Step(1, Action(tool_calls=[call]))], get_descriptor(a), target(requests, b, tmp_path))
        assert [c.fate for c in tr.calls] == [CallFate.REPRODUCED]
        (cmd,) = _shell_of(tr, b)
        return cmd

    cases: list[tuple[str, str, str, str]] = []  # directory, command, file, content it must hold
    for i, content in enumerate(WRITES):
        (tmp_path / f"w{i}").mkdir()
        call = ToolCall("w1", wname, "", {wpath: f"{RECORDED}/{rel}", wcontent: content})
        cases.append((f"w{i}", command(call), rel, content))
    for i, (before, old, new, every) in enumerate(EDITS):
        if every and all_arg is None:
            continue
        (tmp_path / f"e{i}").mkdir()
        (tmp_path / f"e{i}" / "f.txt").write_bytes(before.encode())
        args = {epath: f"{RECORDED}/f.txt", eold: old, enew: new, **extra}
        if all_arg is not None:
            args[all_arg] = every
        want = before.replace(old, new) if every else before.replace(old, new, 1)
        cases.append((f"e{i}", command(ToolCall("e1", ename, "", args)), "f.txt", want))
    # an edit with no old text creates the file with the new text (each of the four agents'
    # edit tools does so for a file that does not exist)
    args = {epath: f"{RECORDED}/made/by edit.txt", eold: "", enew: "cr\u00e9\u00e9\n", **extra}
    cases.append(("", command(ToolCall("e1", ename, "", args)), "made/by edit.txt", "cr\u00e9\u00e9\n"))
    # an edit whose text is not in the file fails, as the edit tool does, and changes nothing
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "f.txt").write_text("nothing to see\n")
    args = {epath: f"{RECORDED}/f.txt", eold: "absent", enew: "x", **extra}
    cases.append(("missing", command(ToolCall("e1", ename, "", args)), "f.txt", "nothing to see\n"))

    status, stderr = run_each(tmp_path, [(d, cmd) for d, cmd, _, _ in cases])
    assert status[:-1] == [0] * (len(cases) - 1) and status[-1] != 0, (status, stderr)
    assert stderr.strip().endswith("f.txt: the text to replace is not in the file"), stderr
    for d, cmd, name, want in cases:
        assert (tmp_path / d / name).read_bytes() == want.encode(), (a, d, cmd)


READERS = [a for a in LAUNCHABLE if TOOLS[a].read is not None]


@pytest.mark.parametrize("a", READERS)
def test_a_line_range_becomes_b_s_ranged_read_or_a_shell_read_of_the_lines(requests, tmp_path, a):
    # B's read tools count lines each their own way: lines 2..4 of A's numbering (Qwen Code's
    # offset is 0-based, Claude Code's and OpenCode's 1-based, Gemini CLI's start and end lines)
    # become B's read tool's range where B declares one, else a shell read of the same lines
    name, path = TOOLS[a].read
    fx = get_descriptor(a).effect_of(name)
    if fx.arg(Role.START) is not None:
        args = {fx.arg(Role.START): 2, fx.arg(Role.END): 4}
    else:
        args = {fx.arg(Role.OFFSET): 2 - (1 - fx.offset_base), fx.arg(Role.LIMIT): 3}
    (tmp_path / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 8)))
    for b in LAUNCHABLE:
        call = ToolCall("r1", name, "", {path: f"{RECORDED}/f.txt", **args})
        tr = translate([Step(1, Action(tool_calls=[call]))], get_descriptor(a), target(requests, b, tmp_path))
        (acc,) = tr.calls
        if NATIVE[b]["read"] is not None:
            assert (acc.fate, acc.target_tool) == (CallFate.TRANSLATED, NATIVE[b]["read"])
            (got,) = tr.steps[0].action.tool_calls
            assert orjson.loads(got.arguments_raw) == {
                TOOLS[b].read[1]: str(tmp_path / "f.txt"),
                **range_args(b, 2, 4),
            }
            continue
        assert (acc.fate, acc.target_tool) == (CallFate.TRANSLATED, TOOLS[b].shell)
        (cmd,) = _shell_of(tr, b)
        proc = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, capture_output=True, timeout=60, text=True, env=SHELL_ENV
        )
        assert proc.stdout == "line 2\nline 3\nline 4\n", (a, b, cmd)


# --------------------------------------------------------------------------- bad input


def test_a_read_from_a_line_to_the_end_is_b_s_read_where_its_tool_can_say_so(requests, tmp_path):
    # Claude Code's Read from line 2 without a limit: Qwen Code's read_file takes an offset only
    # with a limit, so its shell reads the lines; the others' read tools say it themselves
    (tmp_path / "f.txt").write_text("one\ntwo\nthree\n")
    call = ToolCall("r1", "Read", "", {"file_path": f"{RECORDED}/f.txt", "offset": 2})
    want = {"claude-code": {"offset": 2}, "gemini-cli": {"start_line": 2}, "opencode": {"offset": 2}}
    for b in ("claude-code", "gemini-cli", "opencode", "qwen-code"):
        tr = translate(
            [Step(1, Action(tool_calls=[call]))], get_descriptor("claude-code"), target(requests, b, tmp_path)
        )
        (got,) = tr.steps[0].action.tool_calls
        if b in want:
            assert (got.name, orjson.loads(got.arguments_raw)) == (
                NATIVE[b]["read"],
                {TOOLS[b].read[1]: str(tmp_path / "f.txt"), **want[b]},
            )
        else:
            assert (got.name, _shell_of(tr, b)) == (TOOLS[b].shell, ["sed -n '2,$p' f.txt"])


def test_a_target_that_declared_no_shell_tool_is_refused_in_one_line(requests, tmp_path):
    steps, _ = source_run("claude-code", requests["claude-code"].protocol)
    tools = [t for t in requests["gemini-cli"].tools if t.name != "run_shell_command"]
    assert any(t.name == "read_file" for t in tools)  # a read tool alone cannot carry the history
    with pytest.raises(TranslationRefused) as exc:
        translate(steps, get_descriptor("claude-code"), target(requests, "gemini-cli", tmp_path, tools=tools))
    msg = str(exc.value)
    assert "\n" not in msg and exc.value.exit_code == 65
    assert msg.startswith("gemini-cli declared no shell tool in its request 1") and "read_file" in msg


@pytest.mark.parametrize("b", ["claude-code", "opencode"])
def test_a_call_the_target_schema_refuses_is_refused_naming_the_source_step_and_tool(requests, tmp_path, b):
    # B's shell tool as declared, but with a required integer argument a translation cannot
    # make up: the translated call of source step 2 (B's step 1: step 1 has no call) is refused
    shell = TOOLS[b].shell
    tools = []
    for t in requests[b].tools:
        if t.name == shell:
            params = orjson.loads(orjson.dumps(t.parameters))
            params["properties"]["priority"] = {"type": "integer"}
            params["required"] = [*params.get("required", []), "priority"]
            t = ToolSpec(t.name, t.description, params, t.raw)
        tools.append(t)
    a = "qwen-code"
    steps, _ = source_run(a, requests[a].protocol)
    steps = [
        Step(1, Action(text="Let me look around first.")),
        *(Step(s.n + 1, s.action, s.observation) for s in steps),
    ]
    with pytest.raises(TranslationRefused) as exc:
        translate(steps, get_descriptor(a), target(requests, b, tmp_path, tools=tools))
    msg = str(exc.value)
    assert "\n" not in msg and exc.value.exit_code == 65
    assert (
        msg.startswith(f"step 2: {b}'s {shell} refuses the translated call (its step 1): ")
        and "'priority'" in msg
    )


@pytest.mark.parametrize("b", ["codex", "gemini-cli"])
def test_a_write_that_failed_in_the_source_is_not_reproduced(requests, tmp_path, b):
    # Claude Code refuses a Write to a file it has not read (is_error): A's workspace kept the
    # file, so B must not write it; B reads A's attempt and its error as its own earlier words
    (tmp_path / "keep.txt").write_text("the original\n")
    error = "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>"
    write = ToolCall("toolu_w", "Write", "", {"file_path": f"{RECORDED}/keep.txt", "content": "clobbered\n"})
    steps = [
        Step(
            1,
            Action(text="Overwrite it.", tool_calls=[write]),
            Observation([ToolResult("toolu_w", error, True)]),
        )
    ]
    tr = translate(steps, get_descriptor("claude-code"), target(requests, b, tmp_path))
    (acc,) = tr.calls
    assert (acc.fate, acc.target_tool) == (CallFate.RENDERED_AS_TEXT, None)
    assert "failed" in acc.reason and error in tr.steps[0].action.text
    assert tr.carriers == [1]
    run_shell_calls(tr, b, tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "the original\n"
    assert (
        validate_request(
            requests[b].protocol, request_after(requests[b].protocol, requests[b].body, tr.steps)
        )
        == []
    )


#: a Codex-style patch: a file added in a new directory, one updated (a hunk with context and a
#: ``@@`` header) and moved, one deleted
PATCH = """*** Begin Patch
*** Add File: pkg/new file.py
+print("n\u00e9w")
+x = 'q'
*** Update File: app.py
*** Move to: pkg/app.py
@@ def main():
     a = 1
-    b = 2
+    b = "\u00fc"
     c = 3
*** Delete File: old.txt
*** Update File: lines.txt
@@
-b = 2
+b = 3
@@
-drop me
*** End Patch"""
PATCHED = {
    "pkg/new file.py": "print(\"n\u00e9w\")\nx = 'q'\n",
    "pkg/app.py": 'def main():\n    a = 1\n    b = "\u00fc"\n    c = 3\n',
    # a hunk's lines are whole lines (b = 20 is not b = 2), and a removed line goes with its newline
    "lines.txt": "b = 20\nb = 3\nlast line",
}


@pytest.mark.parametrize(
    ("a", "call"),
    [
        # Codex's apply_patch is a free-form (custom) tool: the patch is the call's whole input
        ("codex", ToolCall("call_p", "apply_patch", PATCH, None, "custom")),
        ("opencode", ToolCall("call_p", "apply_patch", "", {"patchText": PATCH})),
    ],
    ids=["codex", "opencode"],
)
def test_a_patch_is_reproduced_by_shell(requests, tmp_path, a, call):
    # neither capture offers apply_patch (Codex and OpenCode declare it for some models only):
    # the call is as their descriptors and the tools they send for those models describe it
    (tmp_path / "app.py").write_text("def main():\n    a = 1\n    b = 2\n    c = 3\n")
    (tmp_path / "old.txt").write_text("gone\n")
    (tmp_path / "lines.txt").write_text("b = 20\nb = 2\ndrop me\nlast line")
    steps = [Step(1, Action(tool_calls=[call]), Observation([ToolResult("call_p", "Done!")]))]
    for b in LAUNCHABLE:
        ws = tmp_path / b
        ws.mkdir()
        for name in ("app.py", "old.txt", "lines.txt"):
            (ws / name).write_bytes((tmp_path / name).read_bytes())
        tr = translate(steps, get_descriptor(a), target(requests, b, ws))
        (acc,) = tr.calls
        assert (acc.fate, acc.target_tool, acc.effect) == (CallFate.REPRODUCED, TOOLS[b].shell, "patch"), acc
        run_shell_calls(tr, b, ws)
        assert files_of(ws) == PATCHED, b


def test_a_source_in_text_mode_hands_its_command_output_as_the_result(requests, tmp_path):
    # mini-swe-agent in text mode (older profiles, its native files) gives its command in a
    # fenced block and gets the output back as a user message: that message is the result of
    # the command B re-runs, and the block is not left in B's text (a text-mode B would find
    # two blocks there, a format error)
    output = "<returncode>0</returncode>\n<output>\nhi\n</output>"
    action = Action(text="THOUGHT: say hi\n\n```mswea_bash_command\necho hi\n```")
    obs = Observation(messages=[Message("user", [TextPart(output)])])
    for b in LAUNCHABLE:
        tr = translate(
            [Step(1, action, obs)], get_descriptor("mini-swe-agent"), target(requests, b, tmp_path)
        )
        (acc,) = tr.calls
        assert (acc.fate, acc.target_tool) == (CallFate.TRANSLATED, TOOLS[b].shell)
        (step,) = tr.steps
        assert [r.content for r in step.observation.results] == [output] and tr.skipped == []
        assert step.action.text == "THOUGHT: say hi"
        assert orjson.loads(step.action.tool_calls[0].arguments_raw)[TOOLS[b].command] == "echo hi"
        body = request_after(requests[b].protocol, requests[b].body, tr.steps)
        assert validate_request(requests[b].protocol, body) == [], b
    # a text-mode B (mini-swe-agent's request without tools): its text holds one block, the
    # command's (the translation used to stop on an assertion there)
    tools: list[ToolSpec] = []
    tr = translate(
        [Step(1, action, obs)],
        get_descriptor("mini-swe-agent"),
        target(requests, "mini-swe-agent", tmp_path, tools=tools),
    )
    (step,) = tr.steps
    assert step.action.text == "THOUGHT: say hi\n\n```mswea_bash_command\necho hi\n```"
    assert step.action.tool_calls == [] and [c.target_tool for c in tr.calls] == [TEXT_MODE_TOOL]


@pytest.mark.parametrize("b", ["claude-code", "qwen-code", "opencode", "gemini-cli"])
def test_a_change_of_a_file_b_has_not_read_is_served_a_read_first_where_b_wants_one(requests, tmp_path, b):
    # Claude Code and Qwen Code refuse to edit or overwrite an existing file their session has not
    # read whole, or one changed since (checked with the pinned CLIs; OpenCode 1.18.33 and Gemini
    # CLI do not): a read of B's own is served as a step of its own before the change, when the
    # file exists or may (a shell ran), and not again after B's own edit or a whole read
    (tmp_path / "old.txt").write_text("one\n")
    old = f"{RECORDED}/old.txt"

    def edit(a: str, z: str) -> tuple[str, dict[str, Any]]:
        return ("Edit", {"file_path": old, "old_string": a, "new_string": z})

    plan: list[list[tuple[str, dict[str, Any]]]] = [
        [edit("one", "two")],  # 1: never read: read first
        [("Write", {"file_path": f"{RECORDED}/new.txt", "content": "new\n"})],  # 2: not there: no read
        [edit("two", "three")],  # 3: B's own edit left it: no read
        [("Bash", {"command": "touch old.txt", "description": "Touch it"})],  # 4: may change any file
        [edit("three", "four")],  # 5: read again
        [("Bash", {"command": "true", "description": "Nothing"}), edit("four", "five")],  # 6: by shell
        [("Read", {"file_path": old})],  # 7: a whole read
        [edit("five", "six")],  # 8: no read
        [("Write", {"file_path": f"{RECORDED}/new2.txt", "content": "2\n"})],  # 9: a shell may have made it
    ]
    steps = [
        Step(
            n,
            Action(
                text=f"Step {n}.",
                tool_calls=[ToolCall(f"t{n}{i}", name, "", args) for i, (name, args) in enumerate(calls)],
            ),
            Observation([ToolResult(f"t{n}{i}", "ok") for i in range(len(calls))]),
        )
        for n, calls in enumerate(plan, 1)
    ]
    tr = translate(
        steps, get_descriptor("claude-code"), target(requests, b, tmp_path, exists=os.path.lexists)
    )
    fates = {c.call_id: (c.fate, c.target_tool) for c in tr.calls}
    native = (CallFate.TRANSLATED, NATIVE[b]["edit"])
    if b in READ_FIRST:
        assert [(r["source_step"], r["path"], r["target_tool"]) for r in tr.inserted_reads] == [
            (1, "old.txt", NATIVE[b]["read"]),
            (5, "old.txt", NATIVE[b]["read"]),
            (9, "new2.txt", NATIVE[b]["read"]),
        ]
        assert (tr.step_map[1], tr.step_map[5], tr.step_map[9]) == ([1, 2], [6, 7], [11, 12])
        read = tr.steps[0].action.tool_calls[0]
        assert orjson.loads(read.arguments_raw) == {TOOLS[b].read[1]: str(tmp_path / "old.txt")}
        # a shell call earlier in the same step could change the file after a read: B's shell edits
        assert fates["t61"] == (CallFate.REPRODUCED, TOOLS[b].shell)
        assert "may change it" in next(c.reason for c in tr.calls if c.call_id == "t61")
        assert "read the file first" in next(c.reason for c in tr.calls if c.call_id == "t10")
    else:
        assert tr.inserted_reads == [] and len(tr.steps) == len(plan)
        assert fates["t61"] == native
    assert [fates[k] for k in ("t10", "t30", "t50", "t80")] == [native] * 4
    assert fates["t20"] == fates["t90"] == (CallFate.TRANSLATED, NATIVE[b]["write"])
    declared = {t.name: t for t in requests[b].tools}
    for step in tr.steps:
        for call in step.action.tool_calls:
            assert schema_problems(declared[call.name], call.arguments) == [], (step.n, call.name)
    body = request_after(requests[b].protocol, requests[b].body, tr.steps)
    assert validate_request(requests[b].protocol, body) == []
    run_shell_calls(tr, b, tmp_path)
    assert files_of(tmp_path) == {"old.txt": "six\n", "new.txt": "new\n", "new2.txt": "2\n"}
    # with the source's snapshots saying new2.txt was not there before step 9 (B re-enacted the
    # steps before it), its write needs no read even after a shell call
    (tmp_path / "new2.txt").unlink()
    (tmp_path / "old.txt").write_text("one\n")
    (tmp_path / "new.txt").unlink()
    known = target(requests, b, tmp_path, exists=os.path.lexists)
    known = dataclasses.replace(
        known, existed=lambda step, rel: rel == "old.txt" or (rel == "new.txt" and step > 2)
    )
    tr = translate(steps, get_descriptor("claude-code"), known)
    want = [(1, "old.txt"), (5, "old.txt")] if b in READ_FIRST else []
    assert [(r["source_step"], r["path"]) for r in tr.inserted_reads] == want


def test_a_todo_list_goes_to_b_s_todo_tool_unless_it_failed_or_b_has_only_goals(requests, tmp_path):
    # Gemini CLI's todo list into OpenCode's todowrite (statuses mapped into OpenCode's, its
    # required priority filled), not into Codex, whose plan tools are goals; one that failed in
    # the source is not re-run anywhere
    todos = {"todos": [{"description": "Ship it", "status": "blocked"}]}
    call = ToolCall("w1", "write_todos", "", todos)

    def one(b: str, error: bool) -> tuple[Any, Translation]:
        obs = Observation([ToolResult("w1", "no" if error else "ok", error or None)])
        tr = translate(
            [Step(1, Action(tool_calls=[call]), obs)],
            get_descriptor("gemini-cli"),
            target(requests, b, tmp_path),
        )
        return tr.calls[0], tr

    acc, tr = one("opencode", False)
    assert (acc.fate, acc.target_tool, acc.reason) == (CallFate.TRANSLATED, "todowrite", "native todo list")
    (got,) = tr.steps[0].action.tool_calls
    assert orjson.loads(got.arguments_raw) == {
        "todos": [{"content": "Ship it (blocked)", "status": "pending", "priority": "medium"}]
    }
    acc, _ = one("codex", False)
    assert acc.fate is CallFate.RENDERED_AS_TEXT and acc.reason.startswith("a todo list is not a goal")
    acc, _ = one("opencode", True)
    assert acc.fate is CallFate.RENDERED_AS_TEXT and "failed in the source" in acc.reason


@pytest.mark.parametrize("b", ["qwen-code", "opencode", "gemini-cli"])
def test_a_source_s_in_place_sed_of_a_file_b_has_not_read_is_served_a_read_first_where_b_wants_one(
    requests, tmp_path, b
):
    # Qwen Code 0.24.4's shell runs an in-place `sed -i 's/P/R/' FILE` as its edit tool, refused
    # for a file the session has not read ("has not been read in this session"); OpenCode and
    # Gemini CLI run it as it is. Not for a file read whole and unchanged since, nor for a
    # command that does not parse
    (tmp_path / "notes.txt").write_text("a\n")
    (tmp_path / "other.txt").write_text("a\n")
    (tmp_path / "third.txt").write_text("a\n")
    plan: list[list[tuple[str, dict[str, Any]]]] = [
        [("Bash", {"command": "sed -i 's/a/b/' notes.txt", "description": "Edit"})],  # 1: read first
        [("Read", {"file_path": f"{RECORDED}/other.txt"})],  # 2: a whole read
        [("Bash", {"command": "sed -i 's/a/c/' other.txt", "description": "Edit"})],  # 3: fresh: none
        [("Bash", {"command": "sed -i 's/a/b notes.txt", "description": "Unclosed"})],  # 4: no parse
        # 5: a file named in the recorded workspace, which playback makes B's: read first
        [("Bash", {"command": f"sed -i 's/a/d/' {RECORDED}/third.txt", "description": "Edit"})],
    ]
    steps = [
        Step(
            n,
            Action(
                text=f"Step {n}.",
                tool_calls=[ToolCall(f"t{n}{i}", name, "", args) for i, (name, args) in enumerate(calls)],
            ),
            Observation([ToolResult(f"t{n}{i}", "ok") for i in range(len(calls))]),
        )
        for n, calls in enumerate(plan, 1)
    ]
    tr = translate(
        steps, get_descriptor("claude-code"), target(requests, b, tmp_path, exists=os.path.lexists)
    )
    if b == "qwen-code":
        assert [(r["source_step"], r["call_id"], r["path"], r["target_tool"]) for r in tr.inserted_reads] == [
            (1, "t10", "notes.txt", NATIVE[b]["read"]),
            (5, "t50", "third.txt", NATIVE[b]["read"]),
        ]
        assert tr.step_map[1] == [1, 2] and len(tr.steps) == len(plan) + 2
        read = tr.steps[0].action.tool_calls[0]
        assert orjson.loads(read.arguments_raw) == {TOOLS[b].read[1]: str(tmp_path / "notes.txt")}
        assert "read first" in next(c.reason or "" for c in tr.calls if c.call_id == "t10")
    else:
        assert tr.inserted_reads == [] and len(tr.steps) == len(plan)
    body = request_after(requests[b].protocol, requests[b].body, tr.steps)
    assert validate_request(requests[b].protocol, body) == []


@pytest.mark.parametrize(
    ("command", "file"),
    [
        ("sed -i 's/a/b/' notes.txt", "notes.txt"),
        ("sed -i '' -e 's/a/b/g' /ws/n.txt", "/ws/n.txt"),
        ("bash -lc \"sed -Ei 's/a+/b/' n.txt\"", "n.txt"),
        ("sed -i.bak 's/a/b/' n.txt", None),  # a backup suffix: run unchecked
        ("sed -i 's/a/b/' n.txt && cat n.txt", None),  # not words only
        ("perl -pi -e 's/a/b/' n.txt", None),  # only sed is checked
        ("sed -i '1d' n.txt", None),  # not a substitution
        ("sed -i 's/a/b/' n.txt m.txt", None),  # two files
        ("sed -i 's/a/b n.txt", None),  # does not parse
    ],
)
def test_qwen_code_checks_a_prior_read_only_for_an_in_place_sed_substitution_of_one_file(command, file):
    assert get_descriptor("qwen-code").shell_reads_first(command) == ((file,) if file else ())
    assert get_descriptor("opencode").shell_reads_first(command) == ()
