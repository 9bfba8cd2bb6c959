"""mini-swe-agent (``mini``, PyPI ``mini-swe-agent``), verified with 2.4.6 (litellm 1.110.2).

- Protocol: OpenAI Chat Completions, not streamed, through litellm (``-m openai/MODEL``);
  upstream ``openai``.
- Base URL: ``-c model.model_kwargs.api_base=<gateway>/run/<id>/v1`` after ``-c mini.yaml`` (a
  ``-c`` replaces the default config file, so the default is named again).
- Environment: ``MSWEA_CONFIGURED=true`` (no first-run wizard), ``MSWEA_COST_TRACKING=ignore_errors``
  (else it stops on a model without a price), ``MSWEA_SILENT_STARTUP=1``,
  ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no download of litellm's price list), and in the
  private home ``MSWEA_GLOBAL_CONFIG_DIR=<home>/.config/mini-swe-agent``.
- Headless: ``mini -m openai/MODEL -c mini.yaml -c model.model_kwargs.api_base=URL --task=TASK
  --yolo --exit-immediately -o <run dir>/mini-swe-agent.traj.json``. It finishes with the
  shell command ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``; a reply without a tool call
  becomes a "format error" user message.
- No native resume, no session id, no JSON on stdout: the native trajectory is the ``-o`` file.
- Version: there is no ``--version``; ``mini --help`` prints "This is mini-swe-agent version X"
  first (unless ``MSWEA_SILENT_STARTUP`` is set).
"""

from __future__ import annotations

from dataclasses import replace
import re
from typing import TYPE_CHECKING, Any

import orjson

from pvisor.core.errors import UsageError
from pvisor.journal.model import Action, Conversation, Message, ToolCall, ToolResult

from . import agent_names, get_profile
from .base import (
    AgentOutcome,
    AgentProfile,
    AgentStatus,
    EnvSnippet,
    LaunchContext,
    LaunchPlan,
    VersionRange,
    status,
)
from . import effects as fx
from .descriptor import (
    FINAL_TEXT,
    ChainHint,
    LitellmAgent,
    action_message,
    attached_value,
    RequestTask,
    litellm_message,
    rx,
)

if TYPE_CHECKING:
    from pathlib import Path

QUIET_ENV = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "MSWEA_SILENT_STARTUP": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}

TRAJECTORY_NAME = "mini-swe-agent.traj.json"

#: the shell command that ends mini-swe-agent's loop (a reply without one is a format error)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

#: the start of ``agent.instance_template`` of its default config ``mini.yaml`` (2.4), to the
#: text after the task and a variable standing for the rest: what a first request holds around
#: the task of a run started with that config
DEFAULT_INSTANCE_TEMPLATE = (
    "Please solve this issue: {{task}}\n\nYou can execute bash commands and edit files to implement the "
    "necessary changes.\n\n## Recommended Workflow\n\n{{rest}}"
)

#: mini-swe-agent's shell tool in tool-calling mode, and its argument
SHELL_TOOL, SHELL_ARG = "bash", "command"


def model_spec(model: str) -> str:
    """litellm's ``provider/model`` name: ``openai/`` in front of a bare model name."""
    return model if model.startswith("openai/") else "openai/" + model


class MiniSweAgent(AgentProfile, LitellmAgent):
    name = "mini-swe-agent"
    title = "mini-swe-agent"
    versions = VersionRange((2, 4, 0), (2, 5))
    protocol = "openai-chat"
    native_raw_protocol = "openai-chat"  # litellm's message dicts, in Chat Completions' shape
    upstream = "openai"
    finish_commands = (SUBMIT,)
    tool_effects = {"bash": fx.shell("command")}
    # text mode: one fenced block per action (mswea_bash_command since 2.0, bash before)
    text_command = re.compile(r"```(?:mswea_bash_command|bash)[ \t]*\n(.*?)\n?```", re.S)
    script_model = "mock-model"
    needs_model = True
    resumable = False
    resume_extends_chain = False
    auxiliary_first_prompt = 0
    json_stdout = False
    chain_hint = ChainHint(tools=frozenset({"bash"}))
    key_env = "OPENAI_API_KEY"
    task_option = "--task="
    volatile_context = ("the <system_information> block of its instance template (uname of the machine)",)
    volatile_patterns = (rx(r"<system_information>[\s\S]*?</system_information>"),)
    # its observation templates open on the code: 1.x ``<returncode>1</returncode>``, 2.x a JSON
    # object ``{"returncode": 1, "output": ...}``
    shell_exit_pattern = rx(r"\A\s*(?:<returncode>|\{\s*\"returncode\":\s*)(?P<code>-?\d+)")
    # litellm's httpx reads SSL_CERT_FILE; requests-based helpers read REQUESTS_CA_BUNDLE
    ca_env = {"SSL_CERT_FILE": "bundle", "REQUESTS_CA_BUNDLE": "bundle"}
    intercept_verified = True  # tests/test_intercept.py runs it through the proxy

    def shell_output(self, text: str) -> str:
        """Its observation is a JSON object (``{"returncode": 0, "output": "..."}``, its 2.x
        observation template): the ``output``."""
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        out = obj.get("output") if isinstance(obj, dict) else None
        return out if isinstance(out, str) else text

    def wire_action(self, protocol: str, action: Action) -> Message:
        """Chat Completions: the file's message dict without ``extra`` and the null keys
        litellm leaves out."""
        msg = action_message(action)
        if protocol == "openai-chat" and isinstance(action.raw, dict):
            return Message("assistant", msg.parts, raw=litellm_message(action.raw))
        return msg

    def wire_result(self, protocol: str, result: ToolResult, names: dict[str, str]) -> ToolResult:
        if protocol == "openai-chat" and isinstance(result.raw, dict) and "extra" in result.raw:
            return replace(result, raw=litellm_message(result.raw))
        return result

    def wire_message(self, protocol: str, msg: Message) -> Message:
        """An observation message (a format error) as sent: without ``extra``."""
        if protocol == "openai-chat" and isinstance(msg.raw, dict) and "extra" in msg.raw:
            return Message(msg.role, msg.parts, raw=litellm_message(msg.raw))
        return msg

    def final_reply(self, conv: Conversation) -> Action:
        """Its submit command: mini-swe-agent answers a reply without a command with a format
        error and loops. A tool call of its shell tool in tool-calling mode (the request has
        tools), else the fenced block of text mode."""
        tool = next((t for t in conv.tools if t.name == SHELL_TOOL), None)
        if tool is None and conv.tools:
            tool = conv.tools[0]
        if tool is not None:
            args = {SHELL_ARG: SUBMIT}
            return Action(
                text=FINAL_TEXT, tool_calls=[ToolCall(None, tool.name, orjson.dumps(args).decode(), args)]
            )
        return Action(text=f"{FINAL_TEXT}\n\n```mswea_bash_command\n{SUBMIT}\n```")

    def task_from_argv(self, argv: list[str]) -> str | None:
        return attached_value(argv, "--task")

    def task_from_trajectory(self, task: str | None, meta: dict[str, Any]) -> str | None:
        """Its file stores the task rendered into ``instance_template`` (``Please solve this
        issue: {{task}} ...``): the task is what stands where ``{{task}}`` does. The text is
        returned as it is when the template cannot be undone (other markup before the task)."""
        template = meta.get("instance_template")
        if not isinstance(task, str) or not isinstance(template, str) or template.count("{{task}}") != 1:
            return task
        head, tail = template.split("{{task}}")
        if "{{" in head or "{%" in head or not task.startswith(head):
            return task
        cut = min((i for i in (tail.find("{{"), tail.find("{%")) if i >= 0), default=len(tail))
        literal = tail[:cut]
        rest = task[len(head) :]
        end = rest.find(literal) if literal else len(rest)
        return rest[:end] if end >= 0 else task

    def task_from_request(self, conv: Conversation) -> RequestTask:
        """Its first request holds the task rendered into ``instance_template``: the template
        of its default config is undone (:data:`DEFAULT_INSTANCE_TEMPLATE`). A run with a config
        of another template cannot be undone for sure: None with why (``--task`` is asked)."""
        read = self.read_prompt(conv)
        if read.task is None:
            return read
        task = self.task_from_trajectory(read.task, {"instance_template": DEFAULT_INSTANCE_TEMPLATE})
        if task == read.task:
            return RequestTask(
                None,
                "its prompt is not the instance_template of mini-swe-agent's default config "
                "(Please solve this issue: TASK ...): where the task stands in it cannot be told",
            )
        return RequestTask(task) if task and task.strip() else RequestTask(None, "its prompt is blank")

    def version_argv(self, executable: str) -> list[str]:
        return [executable, "--help"]

    def read_version(self, output: str) -> str | None:
        m = re.search(r"mini-swe-agent\s+version\s+(\d+\.\d+(?:\.\d+)?)", output)
        return m.group(1) if m else None

    def version_env(self, home: Path | None) -> dict[str, str | None]:
        env = super().version_env(home)
        env["MSWEA_SILENT_STARTUP"] = None  # the banner carries the version
        if home is not None:
            env["MSWEA_GLOBAL_CONFIG_DIR"] = str(home / ".config" / "mini-swe-agent")
        return env

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        if session_id is not None:
            resumable = [n for n in agent_names() if get_profile(n).resumable]
            raise UsageError(
                "mini-swe-agent has no native resume; --resume works with "
                f"{', '.join(resumable[:-1])} and {resumable[-1]}"
            )
        env = self.base_env(ctx)
        env.update(QUIET_ENV)
        if ctx.home is not None:
            env["MSWEA_GLOBAL_CONFIG_DIR"] = str(ctx.home / ".config" / "mini-swe-agent")
        out = ctx.run_dir / TRAJECTORY_NAME
        argv = [
            ctx.executable,
            "-m",
            model_spec(ctx.model or self.script_model),
            "-c",
            "mini.yaml",
            "-c",
            f"model.model_kwargs.api_base={ctx.base_url}/v1",
            self.task_argument(task),  # attached: a task starting with "-" is never an option
            "--yolo",
            "--exit-immediately",
            "-o",
            str(out),
        ]
        return LaunchPlan(argv=argv, env=env, native_path=out)

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        """``info.exit_status`` of its ``-o`` trajectory: ``Submitted`` when it ran its submit
        command; anything else (``RepeatedFormatError``, ``LimitsExceeded``, an exception's
        name) is a failure, though it exits 0."""
        if native is None:
            return status(AgentOutcome.UNKNOWN, None, "it saved no trajectory")
        source = "info.exit_status of its trajectory"
        try:
            info = orjson.loads(native.read_bytes()).get("info")
        except (OSError, ValueError, AttributeError):
            return status(AgentOutcome.UNKNOWN, None, f"its trajectory {native.name} does not read as JSON")
        exit_status = info.get("exit_status") if isinstance(info, dict) else None
        if not isinstance(exit_status, str) or not exit_status:
            return status(AgentOutcome.UNKNOWN, None, "its trajectory has no info.exit_status")
        outcome = AgentOutcome.SUCCEEDED if exit_status == "Submitted" else AgentOutcome.FAILED
        return status(outcome, exit_status, source)

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        return EnvSnippet(
            env={"NO_PROXY": "127.0.0.1,localhost,::1"},
            argv=[
                "mini",
                "-m",
                model_spec(model or "gpt-5"),
                "-c",
                "mini.yaml",
                "-c",
                f"model.model_kwargs.api_base={base_url}/v1",
            ],
            notes=["litellm reads the key from OPENAI_API_KEY."]
            + ([] if model else ["Model gpt-5: give pvisor env --model NAME for another."]),
        )


PROFILE = DESCRIPTOR = MiniSweAgent()
