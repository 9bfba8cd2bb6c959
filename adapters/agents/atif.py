"""The generic descriptor of an ATIF trajectory whose agent pvisor does not know (Harbor's
``terminus-2``, ``aider``, ``goose``, ...): the row ``atif`` of the agent table is a format, not
an agent (docs/native.md, "ATIF as a source"). An ATIF file of an agent pvisor knows is read
with that agent's own descriptor (its ``agent.name``, or one of the descriptor's
``atif_names``); this one stands in for the others: ``--agent atif``.

What it assumes, since the file says nothing of the agent's wire or tools beyond their names and
``agent.tool_definitions``: the model was called through a Chat Completions-shaped API (litellm's
three protocols, by the model's provider prefix, as Harbor's own agents do); a tool named like a
shell in the agents Harbor runs (:data:`SHELL_TOOLS`, the argument that holds the command) is a
shell, so a handoff re-runs its calls; every other tool is rendered as text. The ATIF reader
lists each tool of ``agent.tool_definitions`` and of the calls that this table reads as a shell,
and those it does not, as warnings (``atif_assumed``): what was assumed is in the result.

Sources: Harbor 0.26 ``agents/terminus_2/terminus_2.py`` (``bash_command`` with ``keystrokes``,
``mark_task_complete``), ``agents/installed/*.py`` (the function names its converters write:
OpenHands ``execute_bash``, SWE-agent ``bash``, Cline ``execute_command``, Goose
``developer__shell``, Codex ``exec_command``), and the six agents' own shell tools.
"""

from __future__ import annotations

from .descriptor import LitellmAgent
from .effects import ToolEffect, shell

#: tool names that run a shell command in the agents Harbor writes ATIF for -> the argument that
#: holds the command (terminus-2 sends keystrokes to a tmux shell: a command and its newline)
SHELL_TOOLS: dict[str, str] = {
    "bash": "command",
    "Bash": "command",
    "bash_command": "keystrokes",
    "execute_bash": "command",
    "execute_command": "command",
    "exec_command": "cmd",
    "shell": "command",
    "shell_command": "command",
    "run_shell_command": "command",
    "run_command": "command",
    "run_terminal_cmd": "command",
    "terminal": "command",
    "developer__shell": "command",
}


class AtifAgent(LitellmAgent):
    name = "atif"
    title = "an ATIF trajectory's agent (unknown to pvisor)"
    shell_tools = {name: (arg,) for name, arg in SHELL_TOOLS.items()}
    tool_effects: dict[str, ToolEffect] = {name: shell(arg) for name, arg in SHELL_TOOLS.items()}
    finish_tools = ("mark_task_complete", "finish", "submit")


DESCRIPTOR = AtifAgent()
