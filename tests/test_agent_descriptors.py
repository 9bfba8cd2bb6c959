"""The agent descriptors (adapters/agents/): every agent fact in one place, and no branch on an
agent's name anywhere else. Descriptors are data plus small pure functions, so they are tested
as such here; the real agents meet them in tests/test_replay_agents.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pvisor.adapters.agents import agent_names, descriptor_names, get_descriptor, get_profile
from pvisor.adapters.agents.base import LaunchContext
from pvisor.adapters.agents.descriptor import FINAL_TEXT, RequestTask
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import IdSource
from pvisor.core.errors import UsageError
from pvisor.journal.model import Action, Conversation, Message, OtherPart, TextPart, ToolCall, ToolSpec

REPO = Path(__file__).resolve().parents[1]
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASKS = ["fix it", "--version", "a=b -- c", "line one\nline two", "ünïcode ✓"]


def test_every_agent_has_a_descriptor_and_the_six_a_launch_profile():
    assert descriptor_names() == [
        "claude-code",
        "codex",
        "gemini-cli",
        "qwen-code",
        "opencode",
        "mini-swe-agent",
        "openhands",
        "swe-agent",
        "atif",  # a format row: any agent's run in ATIF (generic: an agent pvisor does not know)
    ]
    for name in descriptor_names():
        d = get_descriptor(name)
        assert d.name == name and d.protocols and d.default_protocol() in d.protocols
        assert d.launchable == (name in agent_names())
    with pytest.raises(UsageError, match="cannot start openhands .no launch profile."):
        get_profile("openhands")


@pytest.mark.parametrize("agent", agent_names())
@pytest.mark.parametrize("task", TASKS)
def test_the_task_comes_back_from_the_command_line_pvisor_run_recorded(tmp_path, agent, task):
    ctx = LaunchContext(
        executable="/x/agent",
        base_url="http://127.0.0.1:1/run/r-1",
        run_dir=tmp_path,
        home=tmp_path / "h",
        workspace=tmp_path / "ws",
    )
    argv = get_profile(agent).plan(ctx, task).argv
    assert get_descriptor(agent).task_from_argv(argv) == task
    assert get_descriptor(agent).task_from_argv(["/x/agent"]) is None


@pytest.mark.parametrize("agent", [a for a in agent_names() if a != "mini-swe-agent"])
def test_the_synthetic_final_reply_makes_no_tool_call(agent):
    d = get_descriptor(agent)
    conv = Conversation(
        protocol=d.default_protocol(), tools=[ToolSpec("bash", parameters={"type": "object"})]
    )
    action = d.final_reply(conv)
    assert action.text == FINAL_TEXT and action.tool_calls == []


def test_mini_swe_agent_ends_on_its_submit_command_not_on_text():
    d = get_descriptor("mini-swe-agent")
    action = d.final_reply(
        Conversation(protocol="openai-chat", tools=[ToolSpec("bash", parameters={"type": "object"})])
    )
    [call] = action.tool_calls
    assert call.name == "bash" and call.arguments == {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
    assert d.is_finish(call)
    # text mode (no tools in the request): the fenced block it parses
    text = d.final_reply(Conversation(protocol="openai-chat")).text
    assert "```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```" in text
    # the reply renders as a valid Chat Completions response
    final = get_protocol("openai-chat").action_to_response(action, model="m", ids=IdSource(1))
    assert final["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"


def _call(name: str, **args: object) -> ToolCall:
    return ToolCall("c1", name, json.dumps(args), dict(args))


@pytest.mark.parametrize(
    "agent,action,why",
    [
        ("mini-swe-agent", Action(tool_calls=[_call("bash", command=SUBMIT)]), "finish command"),
        # text mode: the fenced block is the command
        ("mini-swe-agent", Action(text=f"Done.\n\n```mswea_bash_command\n{SUBMIT}\n```"), "finish command"),
        # 1.x submitted with the diff in the same command line
        (
            "mini-swe-agent",
            Action(tool_calls=[_call("bash", command=SUBMIT + " && git add -A")]),
            "finish command",
        ),
        ("mini-swe-agent", Action(tool_calls=[_call("bash", command="git commit -m x")]), None),
        ("mini-swe-agent", Action(text="no command"), None),
        ("openhands", Action(tool_calls=[_call("finish", message="done")]), "finish tool finish"),
        ("swe-agent", Action(tool_calls=[_call("submit")]), "finish tool submit"),
        # the other agents name no finish action: their end is a reply without a tool call
        ("claude-code", Action(tool_calls=[_call("Bash", command=SUBMIT)]), None),
        ("codex", Action(text="Done."), None),
    ],
)
def test_the_finish_action_is_what_the_descriptor_names(agent, action, why):
    assert get_descriptor(agent).finish_action(action) == why


@pytest.mark.parametrize(
    "agent,a,b",
    [
        (
            "codex",
            "Chunk ID: 934fd0\nWall time: 0.0000 seconds\nProcess exited with code 0\nOutput:\nalpha\n",
            "Chunk ID: 1b2c3d\nWall time: 0.0123 seconds\nProcess exited with code 0\nOutput:\nalpha\n",
        ),
        ("gemini-cli", "Output: alpha\nProcess Group PGID: 20928", "Output: alpha\nProcess Group PGID: 31"),
        (
            "qwen-code",
            "Output: alpha\nExit Code: 0\nProcess Group PGID: 77",
            "Output: alpha\nExit Code: 0\nProcess Group PGID: 78",
        ),
    ],
)
def test_tool_output_decorations_compare_equal_once_normalised_and_the_output_stays(agent, a, b):
    d = get_descriptor(agent)
    assert a != b and d.normalise_output(a) == d.normalise_output(b)
    assert "alpha" in d.normalise_output(a)
    # a different output stays different
    assert d.normalise_output(a) != d.normalise_output(a.replace("alpha", "beta"))


def test_volatile_context_of_real_requests_is_masked(corpus):
    # two Gemini CLI sessions recorded on the same day in two workspaces: message 0 part 0 differs
    rows = [
        json.loads(line)
        for line in (corpus / "requests" / "gemini-cli-0.61.0.jsonl").read_bytes().splitlines()
    ]
    firsts = [
        r["body"]["contents"][0]["parts"][0]["text"]
        for r in rows
        if r["path"].endswith(":streamGenerateContent")
    ]
    d = get_descriptor("gemini-cli")
    masked = {d.mask_volatile(t) for t in firsts}
    assert "<session_context>" in firsts[0] and all("<session_context>" not in m for m in masked)
    changed = firsts[0].replace("November 29, 2026", "December 1, 2026").replace("/ws", "/other-ws")
    assert d.mask_volatile(changed) == d.mask_volatile(firsts[0])
    codex = get_descriptor("codex")
    env = (
        "<environment_context>\n  <cwd>/a</cwd>\n  <current_date>2026-11-29</current_date>\n"
        "</environment_context>"
    )
    assert codex.mask_volatile(env) == codex.mask_volatile(env.replace("/a", "/b").replace("29", "30"))


#: the task of each agent's first session in tests/corpus/requests (its PROVENANCE.md)
CORPUS_TASKS = {
    "codex": "Please create out.txt containing hello, then list files.",
    "gemini-cli": "Please create out.txt containing hello, then list files.",
    "opencode": "Run a shell command that writes mock.txt, then tell me the result.",
    "qwen-code": "Run a shell command that writes mock.txt, then tell me the result.",
    "mini-swe-agent": "Write mock.txt with a shell command, then submit.",
}


@pytest.mark.parametrize("agent", list(CORPUS_TASKS))
def test_the_task_comes_back_from_the_first_request_a_real_agent_sent(corpus, agent):
    """A run captured by the gateway holds only requests: the descriptor reads the task from the
    first main-loop request (the first with tools) past the agent's own context (Codex's
    environment item, Gemini CLI's session context in the same message, Qwen Code's reminders)
    and wrapping (OpenCode's quotes, mini-swe-agent's template)."""
    from corpus_runs import FILES

    for line in (corpus / "requests" / FILES[agent]).read_bytes().splitlines():
        row = json.loads(line)
        if isinstance(row.get("body"), dict) and row["body"].get("tools"):
            break
    mod = get_protocol(get_descriptor(agent).default_protocol(row["body"].get("model")))
    conv = mod.parse_request(json.dumps(row["body"]).encode(), path=row["path"])
    assert get_descriptor(agent).task_from_request(conv) == RequestTask(CORPUS_TASKS[agent], None)


@pytest.mark.parametrize(
    "sent,task",
    [
        # what OpenCode 1.18.33 sent for `opencode run -- TASK` (pvisor run, checked by hand)
        ('"say \\"hi\\" now"', 'say "hi" now'),
        ('"two\nlines here"', "two\nlines here"),
        ('"back\\slash here"', "back\\slash here"),
        ("fix", "fix"),
        ('"quoted"', '"quoted"'),  # no space: OpenCode never quoted it, the quotes are the user's
    ],
)
def test_opencode_quotes_are_undone(sent, task):
    d = get_descriptor("opencode")
    conv = Conversation(protocol="openai-chat", messages=[Message("user", [TextPart(sent)])])
    assert d.task_from_request(conv).task == task
    assert d.task_from_trajectory(sent, {}) == task  # its export stores the same text


REMINDER = "<system-reminder>\nToday's date is 2026-12-04.\n</system-reminder>"
#: what Claude Code 1.x put after the prompt of a first request
TODO_REMINDER = (
    "<system-reminder>\nThis is a reminder that your todo list is currently empty. DO NOT mention this "
    "to the user explicitly because they are not aware of it.\n</system-reminder>"
)
#: Gemini CLI's and Qwen Code's parts after a prompt that names a file with @ (their real requests)
AT_FILE = [
    "\n--- Content from referenced files ---",
    "\nContent from @notes.txt:\n",
    "hello",
    "\n--- End of content ---",
]
IMAGE = OtherPart(
    "image", {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
)


def _first_request(agent: str, parts: list, before: list[Message] = ()) -> Conversation:
    """A first request of ``agent``: the corpus's real one for the agents it holds (its user
    message's parts replaced by ``parts``, strings as text), else ``before`` and one user message."""
    from corpus_runs import FILES

    made = [p if not isinstance(p, str) else TextPart(p) for p in parts]
    if agent not in FILES:
        return Conversation(protocol="anthropic", messages=[*before, Message("user", made)])
    corpus = REPO / "tests" / "corpus"
    for line in (corpus / "requests" / FILES[agent]).read_bytes().splitlines():
        row = json.loads(line)
        if isinstance(row.get("body"), dict) and row["body"].get("tools"):
            break
    mod = get_protocol(get_descriptor(agent).default_protocol(row["body"].get("model")))
    conv = mod.parse_request(json.dumps(row["body"]).encode(), path=row["path"])
    last = max(i for i, m in enumerate(conv.messages) if m.role == "user")
    conv.messages[last] = Message("user", made)
    return conv


@pytest.mark.parametrize(
    "agent,parts,before",
    [
        # Claude Code: reminders before the prompt and after it (the todo reminder of 1.x)
        ("claude-code", [REMINDER, "Write a.txt.", TODO_REMINDER], []),
        ("claude-code", [REMINDER, "Write a.txt.", REMINDER + "\n"], []),
        # Claude Code 2.1 with @notes.txt: the file read as reminders, one in a message of its own
        ("claude-code", [REMINDER, "Write a.txt."], [Message("user", [TextPart(REMINDER)])]),
        ("qwen-code", [REMINDER, "Write a.txt.", *AT_FILE, REMINDER], []),
        (
            "qwen-code",
            ["<qwen:user-prompt-submit-context>\nmore\n</qwen:user-prompt-submit-context>", "Write a.txt."],
            [],
        ),
        (
            "gemini-cli",
            ["<session_context>\nThis is the Gemini CLI.\n</session_context>", "Write a.txt.", *AT_FILE],
            [],
        ),
        # Codex with an AGENTS.md: its instructions beside the environment, before the prompt's item
        (
            "codex",
            [
                "# AGENTS.md instructions for /ws\n\n<INSTRUCTIONS>\nBe terse.\n\n</INSTRUCTIONS>",
                "Write a.txt.",
            ],
            [],
        ),
    ],
)
def test_the_prompt_is_told_from_the_agents_own_context_wherever_it_sits(agent, parts, before):
    """The task a first request gives is the user's prompt, whatever the agent put after it (the
    last text was taken: a reminder, the end of a referenced file's content)."""
    assert get_descriptor(agent).task_from_request(_first_request(agent, parts, before)) == RequestTask(
        "Write a.txt.",
        None,
    )


@pytest.mark.parametrize(
    "agent,parts,why",
    [
        ("claude-code", [REMINDER, "Describe this.", IMAGE], "a part that is no text (image)"),
        ("claude-code", [REMINDER, IMAGE, "Describe this."], "a part that is no text (image)"),
        ("claude-code", [REMINDER, "Write a.txt.", "Then b.txt."], "2 texts beside the agent's own context"),
        ("claude-code", [REMINDER, " \n\t"], "its prompt is blank"),
        ("claude-code", [REMINDER + "\nWrite a.txt."], "its prompt holds <system-reminder>"),
        ("gemini-cli", ["<session_context>\nx\n</session_context>", "  "], "its prompt is blank"),
        # OpenCode: several arguments of opencode run, which one task argument would quote
        ("opencode", ["Write a.txt please"], "several arguments of opencode run"),
        # mini-swe-agent with a config of another template
        (
            "mini-swe-agent",
            ["Solve: Write a.txt."],
            "not the instance_template of mini-swe-agent's default config",
        ),
    ],
)
def test_a_prompt_that_cannot_be_told_for_sure_gives_no_task_and_why(agent, parts, why):
    """Rather than a guess (the image left out, one of two texts, a blank task), no task and why:
    replay then asks for --task (no_task)."""
    got = get_descriptor(agent).task_from_request(_first_request(agent, parts))
    assert got.task is None and why in got.why, got


_AGENT_NAMES = frozenset(descriptor_names())
#: where agent names may be compared: the descriptors themselves, and the native adapters (one
#: module per agent's own format, picked by a registry)
_ALLOWED = ("adapters/agents/", "adapters/native/")


def _branches_on_agent(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                consts = (
                    [side]
                    if isinstance(side, ast.Constant)
                    else list(side.elts)
                    if isinstance(side, (ast.Tuple, ast.List, ast.Set))
                    else []
                )
                if any(isinstance(c, ast.Constant) and c.value in _AGENT_NAMES for c in consts):
                    lines.append(node.lineno)
    return lines


def test_no_branch_on_an_agents_name_outside_the_descriptors():
    found = []
    for folder in ("adapters", "gateway", "replay", "journal", "pvisor"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(_ALLOWED):
                continue
            found += [f"{rel}:{n}" for n in _branches_on_agent(ast.parse(path.read_text()))]
    assert found == [], f"agent facts belong in adapters/agents/: {found}"


def test_the_branch_finder_finds_a_branch():
    assert _branches_on_agent(
        ast.parse('if agent == "codex":\n    pass\nif a in ("x", "gemini-cli"): pass')
    ) == [1, 3]
