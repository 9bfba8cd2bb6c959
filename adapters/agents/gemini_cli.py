"""Gemini CLI (``gemini``, npm ``@google/gemini-cli``), verified with 0.61.0.

- Protocol: Gemini, streamed (``POST /v1beta/models/MODEL:streamGenerateContent?alt=sse``);
  upstream ``gemini``.
- Base URL: ``GOOGLE_GEMINI_BASE_URL=<gateway>/run/<id>``; key in ``GEMINI_API_KEY`` (sent as
  ``x-goog-api-key``); ``GEMINI_CLI_TRUST_WORKSPACE=true`` (headless runs are refused in an
  untrusted folder).
- Private home: ``$HOME/.gemini/settings.json``: auth type ``gemini-api-key``, usage statistics,
  telemetry and auto-update off.
- Headless: ``gemini --prompt=TASK --output-format stream-json --yolo -m MODEL`` (without ``--yolo``
  the shell and write tools are left out of the request). Resume:
  ``gemini --resume SESSION --prompt=TASK ...``: the first context message (date, directory
  listing) is regenerated, so the resumed requests start a **new chain** in the same run.
- Session id: ``session_id`` of the ``{"type": "init"}`` line on stdout.
- Native trajectory: ``session-<time>-<first 8 characters of the id>.jsonl`` under
  ``$HOME/.gemini/tmp/``; the file whose first line names the full session id.
"""

from __future__ import annotations

from dataclasses import replace
import os

import orjson

from typing import TYPE_CHECKING, Any

from pvisor.journal.model import Action, Message, Reasoning, ToolCall, ToolResult

from .base import (
    AgentOutcome,
    AgentStatus,
    last_line,
    status,
    AgentProfile,
    EnvSnippet,
    LaunchContext,
    LaunchPlan,
    VersionRange,
    first_value,
    json_text,
    user_home,
)
from . import effects as fx
from .descriptor import ISO_DATE, REFERENCED_FILES, ChainHint, action_message, attached_value, rx

if TYPE_CHECKING:
    from pathlib import Path

#: Gemini CLI's signature on the first functionCall of a model turn whose reply had none
SKIP_SIGNATURE = "skip_thought_signature_validator"


def wire_call_id(call_id: str | None, name: str | None) -> str | None:
    """Gemini CLI stores the call id it made as ``<name>__<id>`` and sends ``<id>``."""
    if call_id and name and call_id.startswith(name + "__"):
        return call_id[len(name) + 2 :]
    return call_id


def place_signatures(body: dict[str, Any]) -> int:
    """In each ``model`` content whose ``functionCall`` parts carry no ``thoughtSignature``,
    the first such part gets :data:`SKIP_SIGNATURE`. Returns the number added."""
    added = 0
    for c in body.get("contents") or []:
        if not isinstance(c, dict) or c.get("role") != "model":
            continue
        calls = [p for p in c.get("parts") or [] if isinstance(p, dict) and "functionCall" in p]
        if calls and not any("thoughtSignature" in p for p in c.get("parts") or [] if isinstance(p, dict)):
            calls[0]["thoughtSignature"] = SKIP_SIGNATURE
            added += 1
    return added


SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


class GeminiCli(AgentProfile):
    name = "gemini-cli"
    title = "Gemini CLI"
    shell_tools = {"run_shell_command": ("command",)}
    versions = VersionRange((0, 61, 0), (0, 62))
    protocol = "gemini"
    protocols = ("gemini",)
    native_raw_protocol = "gemini"
    upstream = "gemini"
    script_model = "gemini-2.5-pro"
    resumable = True
    resume_extends_chain = False
    auxiliary_first_prompt = 0
    chain_hint = ChainHint(tools=frozenset({"run_shell_command"}))
    key_env = "GEMINI_API_KEY"
    task_option = "--prompt="
    # Vertex AI would bypass the base URL
    removed_env = ("GOOGLE_GENAI_USE_VERTEXAI",)
    ca_env = {"NODE_EXTRA_CA_CERTS": "cert"}  # Node adds it to its built-in CAs
    intercept_verified = True  # tests/test_intercept.py runs it through the proxy
    intercept_unset_env = ("GOOGLE_GEMINI_BASE_URL",)  # its default is the public Gemini host
    volatile_context = (
        "the <session_context> part of message 0 (date, temporary directory under the private home, "
        "workspace path, directory listing), before the task in the same message",
    )
    volatile_patterns = (rx(r"<session_context>[\s\S]*?</session_context>"), ISO_DATE)
    # beside the prompt: the session context part before it, the files it names with @ after it
    prompt_wrappers = (rx(r"\s*<session_context>[\s\S]*</session_context>\s*"),)
    prompt_blocks = (REFERENCED_FILES,)
    prompt_markers = ("<session_context>",)
    output_decorations = (
        (rx(r"Process Group PGID: \d+"), "Process Group PGID: <pgid>"),
        (rx(r"Background PIDs: [^\n]*"), "Background PIDs: <pids>"),
    )
    shell_output_pattern = rx(
        r"(?:<untrusted_context>\s*)?Output: (?P<out>[\s\S]*?)\n(?:Process Group PGID: [^\n]*)"
        r"(?:\n[\s\S]*?)?(?:\s*</untrusted_context>)?"
    )
    empty_outputs = ("(empty)",)
    # run_shell_command's line after the output and its error, only for a non-zero code
    shell_exit_pattern = rx(r"(?m)^Exit Code: (?P<code>-?\d+)$")
    # 0.61.0 refuses a command holding $(, a backtick, <( or >( ("Command injection detected"),
    # quoted or not (seen under pvisor handoff: a translated write of a README with `code`)
    shell_refuses = rx(r"\$\(|`|<\(|>\(")
    path_arguments = {
        "read_file": ("file_path",),
        "write_file": ("file_path",),
        "replace": ("file_path",),
        "run_shell_command": ("dir_path",),
        "list_directory": ("dir_path",),
        "glob": ("dir_path",),
        "grep_search": ("dir_path",),
    }
    read_tools = frozenset({"read_file", "list_directory", "glob", "grep_search"})
    image_readers = {"read_file": "file_path"}
    tool_effects = {
        "run_shell_command": fx.shell("command", workdir="dir_path", description="description"),
        "read_file": fx.ToolEffect(fx.Effect.READ, path="file_path", start="start_line", end="end_line"),
        "write_file": fx.write("file_path", "content"),
        "replace": fx.edit("file_path", "old_string", "new_string", "allow_multiple", "instruction"),
        **fx.kinds(fx.Effect.LIST, "list_directory", "glob", "grep_search", "search_file_content"),
        "write_todos": fx.todos("todos", fx.TodoShape("description", "status", statuses=fx.TODO_STATUSES)),
        **fx.kinds(fx.Effect.PLAN, "enter_plan_mode", "update_topic"),
        **fx.kinds(fx.Effect.SUBAGENT, "invoke_agent"),
        **fx.kinds(fx.Effect.WEB, "web_fetch", "google_web_search"),
    }

    def wire_action(self, protocol: str, action: Action) -> Message:
        """Call ids without the ``<name>__`` prefix its file gives them."""
        msg = action_message(action)
        if protocol != "gemini":
            return msg
        # a thought summary of its record's ``thoughts`` (subject, description) is shown, never sent
        parts = [
            replace(p, id=wire_call_id(p.id, p.name)) if isinstance(p, ToolCall) else p
            for p in msg.parts
            if not (isinstance(p, Reasoning) and isinstance(p.raw, dict) and "text" not in p.raw)
        ]
        return Message("assistant", parts)

    def wire_result(self, protocol: str, result: ToolResult, names: dict[str, str]) -> ToolResult:
        """Its file stores the ``functionResponse`` parts it sent: one such part's ``response``
        object is the result; the call id loses its ``<name>__`` prefix."""
        if protocol != "gemini":
            return result
        name = result.name or names.get(result.call_id or "")
        content, rname = result.content, result.name
        if (
            isinstance(content, list)
            and len(content) == 1
            and isinstance(content[0], dict)
            and isinstance(content[0].get("functionResponse"), dict)
        ):
            inner = content[0]["functionResponse"]
            if isinstance(inner.get("response"), dict):
                content = inner["response"]
                rname = rname or inner.get("name")
        # raw dropped: the file's toolCall record is not a Gemini part
        return ToolResult(wire_call_id(result.call_id, name), content, result.is_error, rname, None)

    body_shapes = {"gemini": place_signatures}

    def task_from_argv(self, argv: list[str]) -> str | None:
        return attached_value(argv, "--prompt")

    def reply_action(self, protocol: str, action: Action) -> Action:
        """The model sends function calls without ids; the ids of its file are its own."""
        if protocol != "gemini" or not any(c.id for c in action.tool_calls):
            return action
        return replace(
            action, tool_calls=[replace(c, id=None, raw=None) for c in action.tool_calls], raw=None
        )

    def _gemini_dir(self, ctx: LaunchContext) -> Path:
        from pathlib import Path  # launching only: prepare-only loads no pathlib

        if ctx.home is not None:
            return ctx.home / ".gemini"
        cli_home = os.environ.get("GEMINI_CLI_HOME")
        return Path(cli_home) / ".gemini" if cli_home else user_home() / ".gemini"

    def base_env(self, ctx: LaunchContext) -> dict[str, str | None]:
        env = super().base_env(ctx)
        if ctx.home is not None:
            env["GEMINI_CLI_HOME"] = None
        if ctx.api_key is not None:
            env["GOOGLE_API_KEY"] = None  # it would take precedence over the key we give
        return env

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        env = self.base_env(ctx)
        env["GOOGLE_GEMINI_BASE_URL"] = ctx.base_url
        env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
        files: dict[Path, str] = {}
        if ctx.home is not None:
            files[ctx.home / ".gemini" / "settings.json"] = json_text(SETTINGS)
        argv = [ctx.executable]
        if session_id is not None:
            argv += ["--resume", session_id]
        # --prompt=TASK: the value is attached, so a task starting with "-" is never an option
        argv += [self.task_argument(task), "--output-format", "stream-json", "--yolo"]
        if ctx.model:
            argv += ["-m", ctx.model]
        return LaunchPlan(argv=argv, env=env, files=files)

    def session_id(self, stdout: bytes) -> str | None:
        return first_value(stdout, "session_id", type="init")

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        """The last ``{"type": "result"}`` line: ``status`` ``success`` or ``error`` with
        ``error.message`` (``[API Error: ...]``)."""
        line = last_line(stdout, ("result",))
        if line is None:
            return status(AgentOutcome.UNKNOWN, None, "no result line on its stdout")
        source = "the result line of its stdout"
        if line.get("status") == "success":
            return status(AgentOutcome.SUCCEEDED, None, source)
        error = line.get("error")
        reason = error.get("message") if isinstance(error, dict) else error
        return status(AgentOutcome.FAILED, reason or f"status {line.get('status')}", source)

    def find_native(self, ctx: LaunchContext, session_id: str | None, plan: LaunchPlan) -> Path | None:
        if not session_id:
            return None
        root = self._gemini_dir(ctx) / "tmp"
        if not root.is_dir():
            return None
        for path in sorted(
            root.rglob(f"session-*-{session_id[:8]}.jsonl"), key=lambda p: p.lstat().st_mtime, reverse=True
        ):
            from pvisor.core.outfile import read_regular

            try:
                # a regular file only, through no link, and a bounded read: a FIFO or a link to
                # /dev/zero planted here by a sandboxed agent would hang pvisor or fill its memory
                head, _ = read_regular(path, 1 << 20)
                first = orjson.loads(head.split(b"\n", 1)[0] or b"{}")
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(first, dict) and first.get("sessionId") == session_id:
                return path
        return None

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        env = {"GOOGLE_GEMINI_BASE_URL": base_url, "NO_PROXY": "127.0.0.1,localhost,::1"}
        argv = ["gemini"] + (["-m", model] if model else [])
        return EnvSnippet(
            env=env,
            argv=argv,
            notes=[
                "Gemini CLI reads its key from GEMINI_API_KEY as usual; if GOOGLE_API_KEY is also set "
                "it uses that one"
                " instead (unset GOOGLE_API_KEY to use GEMINI_API_KEY)."
            ],
        )


PROFILE = DESCRIPTOR = GeminiCli()
