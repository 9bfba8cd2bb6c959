"""Each agent's shell answer around a command's output (``AgentDescriptor.shell_output``), as the
pinned agents sent it under a handoff (seen in their requests), so that a handoff compares O of
one agent with O″ of another: the command's output alone."""

from __future__ import annotations

import pytest

from pvisor.adapters.agents import get_descriptor

CASES = [
    (
        "codex",
        "Chunk ID: <id>\nWall time: <t> seconds\nProcess exited with code 0\nOriginal token count: 2\n"
        "Output:\none\ntwo\n",
        "one\ntwo",
    ),
    (
        "gemini-cli",
        "<untrusted_context>\nOutput: alpha\nProcess Group PGID: <pgid>\n</untrusted_context>",
        "alpha",
    ),
    (
        "gemini-cli",
        "<untrusted_context>\nOutput: (empty)\nProcess Group PGID: <pgid>\n</untrusted_context>",
        "",
    ),
    (
        "qwen-code",
        "Command: cat notes.txt\nDirectory: (root)\nOutput: one\ntwo\nError: (none)\nExit Code: 0\n"
        "Signal: (none)\nProcess Group PGID: (none)",
        "one\ntwo",
    ),
    ("qwen-code", "Command: true\nDirectory: (root)\nOutput: (empty)\nError: (none)\nExit Code: 0", ""),
    ("mini-swe-agent", '{\n  "returncode": 0,\n  "output": "alpha\\n"\n}', "alpha\n"),
    ("opencode", "(no output)", ""),
    ("claude-code", "(Bash completed with no output)", ""),
]


@pytest.mark.parametrize(("agent", "answer", "output"), CASES)
def test_shell_output_is_the_commands_output_alone(agent, answer, output):
    assert get_descriptor(agent).shell_output(answer) == output


@pytest.mark.parametrize(
    "agent", ["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent"]
)
def test_an_answer_of_another_shape_is_left_as_it_is(agent):
    text = "Output: not a shell answer of this agent\nsomething else"
    assert get_descriptor(agent).shell_output(text) == text
