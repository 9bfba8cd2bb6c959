"""Codex CLI (``codex``, npm ``@openai/codex``), verified with 0.171.0.

- Protocol: OpenAI Responses, streamed (``POST /v1/responses``); upstream ``openai``. Codex
  ignores ``OPENAI_BASE_URL`` and rejects ``wire_api="chat"``: it needs a model provider.
- Base URL: a provider ``pvisor`` with ``base_url = "<gateway>/run/<id>/v1"``,
  ``env_key = "OPENAI_API_KEY"``, ``wire_api = "responses"``; against the scripted model no
  retries (``request_max_retries = 0``, ``stream_max_retries = 0``), against a real API Codex's
  own (a retried request is an auxiliary ``retry`` exchange). Private home: in
  ``$CODEX_HOME/config.toml`` (``CODEX_HOME = <home>/.codex``) with ``approval_policy = "never"``,
  ``sandbox_mode = "danger-full-access"`` (Codex's own sandbox needs kernel features containers
  often lack) and the quiet switches:
  ``check_for_update_on_startup = false``, ``[features] plugins = false`` (else it looks up
  outside hosts), ``[analytics] enabled = false``, ``[otel] exporter = "none"``. With
  ``--use-home``: the same provider as ``-c`` overrides, plus ``approval_policy="never"``; the
  user's sandbox setting stays.
- Headless: ``codex exec --skip-git-repo-check --json -- TASK``; resume:
  ``codex exec --skip-git-repo-check --json resume SESSION -- TASK`` (extends the main chain).
- Session id: ``thread_id`` of the ``{"type": "thread.started"}`` line on stdout.
- Native trajectory: ``rollout-*-<session id>.jsonl`` under ``$CODEX_HOME/sessions/``.
"""

from __future__ import annotations

from dataclasses import replace
import os

from typing import TYPE_CHECKING, Any

from pvisor.journal.model import Action, Message, ToolCall, ToolResult

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
    find_file,
    first_value,
    toml_string,
    user_home,
)
from . import effects as fx
from .descriptor import ISO_DATE, ChainHint, action_message, after_separator, rx

if TYPE_CHECKING:
    from pathlib import Path

PROVIDER = "pvisor"

#: Codex adds this key to the items it writes to its rollout; it never sends it
FILE_ONLY_KEY = "internal_chat_message_metadata_passthrough"


def wire_item(item: Any) -> Any:
    """A rollout item as Codex sends it: without its file-only metadata key."""
    if isinstance(item, dict) and FILE_ONLY_KEY in item:
        return {k: v for k, v in item.items() if k != FILE_ONLY_KEY}
    return item


def provider_table(base_url: str, retries: bool = True) -> str:
    """The inline TOML table of the ``pvisor`` model provider (for ``-c model_providers.pvisor=...``).
    Without ``retries``, Codex sends each request once (the scripted model never fails)."""
    no_retries = ", request_max_retries=0, stream_max_retries=0" if not retries else ""
    return (
        f"{{name={toml_string(PROVIDER)}, base_url={toml_string(base_url + '/v1')}, "
        f'env_key="OPENAI_API_KEY", '
        f'wire_api="responses"{no_retries}}}'
    )


def config_toml(base_url: str, model: str | None, retries: bool = True) -> str:
    """``config.toml`` of the private ``CODEX_HOME``; without ``retries`` see :func:`provider_table`."""
    lines = []
    if model:
        lines.append(f"model = {toml_string(model)}")
    lines += [
        f"model_provider = {toml_string(PROVIDER)}",
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "check_for_update_on_startup = false",
        "",
        f"[model_providers.{PROVIDER}]",
        f"name = {toml_string(PROVIDER)}",
        f"base_url = {toml_string(base_url + '/v1')}",
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
        *(["request_max_retries = 0", "stream_max_retries = 0"] if not retries else []),
        "",
        "[features]",
        "plugins = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[otel]",
        'exporter = "none"',
    ]
    return "\n".join(lines) + "\n"


def overrides(base_url: str, model: str | None, retries: bool = True) -> list[str]:
    """``-c`` overrides that point Codex at the gateway without touching its config file."""
    out = [
        "-c",
        f"model_providers.{PROVIDER}={provider_table(base_url, retries)}",
        "-c",
        f"model_provider={toml_string(PROVIDER)}",
    ]
    if model:
        out += ["-c", f"model={toml_string(model)}"]
    return out


class Codex(AgentProfile):
    name = "codex"
    title = "Codex CLI"
    shell_tools = {"exec_command": ("cmd",), "shell": ("command",)}
    versions = VersionRange((0, 170, 0), (0, 180))
    protocol = "openai-responses"
    protocols = ("openai-responses",)
    native_raw_protocol = "openai-responses"
    upstream = "openai"
    script_model = "gpt-5-codex"
    resumable = True
    resume_extends_chain = True
    auxiliary_first_prompt = 0
    chain_hint = ChainHint(tools=frozenset({"exec_command"}))
    key_env = "OPENAI_API_KEY"
    # `codex exec -` reads the prompt on stdin (its --help: "If not provided as an argument (or
    # if `-` is used), instructions are read from stdin"), sent as read: a task too long for
    # the command line goes there
    task_stdin = "-"
    # its own variable, and the store of its TLS stack where that reads the system's
    ca_env = {"CODEX_CA_CERTIFICATE": "cert", "SSL_CERT_FILE": "bundle"}
    intercept_verified = True  # tests/test_intercept.py runs it through the proxy
    intercept_notes = (
        "Codex's built-in OpenAI provider talks WebSocket first, which pvisor refuses (426, recorded): "
        "the -c overrides below give it a provider of its own for the same host, which Codex speaks "
        "HTTP to (wire_api responses).",
    )
    volatile_context = (
        "the <environment_context> item (cwd, date, timezone, workspace roots)",
        "the skills item, whose paths are under CODEX_HOME",
    )
    volatile_patterns = (rx(r"<environment_context>[\s\S]*?</environment_context>"), ISO_DATE)
    # the user items before the prompt's: its environment, AGENTS.md (older: user_instructions)
    prompt_wrappers = (
        rx(r"\s*<(environment_context|user_instructions|startup_context)>[\s\S]*</\1>\s*"),
        rx(r"# AGENTS\.md instructions for [^\n]*\n\n<INSTRUCTIONS>[\s\S]*</INSTRUCTIONS>\s*"),
    )
    prompt_markers = ("<environment_context>",)
    # the cache key is the session id; client_metadata names the session, turn and window
    run_params = ("prompt_cache_key", "client_metadata")
    # exec_command output starts with a chunk id and the wall time of the command
    output_decorations = (
        (rx(r"Chunk ID: [0-9A-Za-z]+"), "Chunk ID: <id>"),
        (rx(r"Wall time: [0-9.]+ seconds"), "Wall time: <t> seconds"),
    )
    shell_output_pattern = rx(
        r"Chunk ID: [^\n]*\nWall time: [^\n]*\n(?:Process (?:exited with code|running with session ID) "
        r"[^\n]*\n)?(?:Original token count: [^\n]*\n)?Output:\n?(?P<out>[\s\S]*)"
    )
    # exec_command's header (its `shell` tool's: ``Exit code: N``); its results carry no is_error
    shell_exit_pattern = rx(
        r"\A(?:Chunk ID: [^\n]*\n)?(?:Wall time: [^\n]*\n)?(?:Process exited with code|Exit code:) "
        r"(?P<code>-?\d+)"
    )
    path_arguments = {"exec_command": ("workdir",), "shell": ("workdir",), "view_image": ("path",)}
    read_tools = frozenset({"view_image"})
    image_readers = {"view_image": "path"}
    image_only_readers = frozenset({"view_image"})
    tool_effects = {
        "view_image": fx.read("path"),
        "exec_command": fx.shell("cmd", workdir="workdir"),
        "shell": fx.shell("command", workdir="workdir"),
        "apply_patch": fx.ToolEffect(fx.Effect.PATCH, patch=""),
        # update_plan: the pinned 0.171.0 does not declare it through pvisor's provider (goals only)
        "update_plan": fx.todos("plan", fx.TodoShape("step", "status")),
        **fx.goals("create_goal", "update_goal", "get_goal"),
        **fx.kinds(
            fx.Effect.SUBAGENT,
            "multi_agent_v1",
            "spawn_agent",
            "send_input",
            "wait_agent",
            "resume_agent",
            "close_agent",
        ),
        **fx.kinds(fx.Effect.WEB, "web_search"),
    }

    def wire_action(self, protocol: str, action: Action) -> Message:
        """The rollout's items of the reply (``action.raw``) without the file-only key, so item
        ids and ``status`` go out as Codex sends them."""
        msg = action_message(action)
        if protocol != "openai-responses":
            return msg
        raw = (
            action.raw
            if isinstance(action.raw, list)
            else [action.raw]
            if isinstance(action.raw, dict)
            else None
        )
        parts = []
        for p in msg.parts:
            if isinstance(p, ToolCall) and isinstance(p.raw, dict):
                p = replace(p, raw=wire_item(p.raw))
            parts.append(p)
        return Message("assistant", parts, raw=[wire_item(i) for i in raw] if raw else None)

    def wire_result(self, protocol: str, result: ToolResult, names: dict[str, str]) -> ToolResult:
        if protocol == "openai-responses" and isinstance(result.raw, dict) and FILE_ONLY_KEY in result.raw:
            return replace(result, raw=wire_item(result.raw))
        return result

    def wire_message(self, protocol: str, msg: Message) -> Message:
        if protocol == "openai-responses" and msg.raw is not None:
            raw = [wire_item(i) for i in msg.raw] if isinstance(msg.raw, list) else wire_item(msg.raw)
            return Message(msg.role, msg.parts, raw=raw)
        return msg

    def compaction_keeps_lead(self, protocol: str) -> int:
        """Its ``replacement_history`` starts after the base instructions it sends first (a
        developer item, 0.171): that one message stays in front of the history."""
        return 1 if protocol == "openai-responses" else 0

    def task_from_argv(self, argv: list[str]) -> str | None:
        task = after_separator(argv)
        return None if task == self.task_stdin else task  # given on stdin: the run's label holds it

    def _codex_home(self, ctx: LaunchContext) -> Path:
        from pathlib import Path  # launching only: prepare-only loads no pathlib

        if ctx.home is not None:
            return ctx.home / ".codex"
        return Path(os.environ.get("CODEX_HOME") or user_home() / ".codex")

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        env = self.base_env(ctx)
        files: dict[Path, str] = {}
        argv = [ctx.executable, "exec", "--skip-git-repo-check", "--json"]
        if ctx.home is not None:
            codex_home = self._codex_home(ctx)
            env["CODEX_HOME"] = str(codex_home)
            files[codex_home / "config.toml"] = config_toml(
                ctx.base_url, ctx.model, retries=ctx.api_key is None
            )
        else:
            argv += overrides(ctx.base_url, ctx.model, retries=ctx.api_key is None) + [
                "-c",
                'approval_policy="never"',
            ]
        if session_id is not None:
            argv += ["resume", session_id]
        stdin = self.task_on_stdin(task)
        argv += ["--", self.task_stdin if stdin else task]  # a task starting with "-" is never an option
        return LaunchPlan(argv=argv, env=env, files=files, stdin=task.encode() if stdin else None)

    def session_id(self, stdout: bytes) -> str | None:
        return first_value(stdout, "thread_id", type="thread.started")

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        """The last turn event of ``codex exec --json``: ``turn.completed``, or ``turn.failed``
        with ``error.message`` (the upstream's error body, as Codex quotes it)."""
        line = last_line(stdout, ("turn.completed", "turn.failed"))
        if line is None:
            return status(AgentOutcome.UNKNOWN, None, "no turn.completed or turn.failed line on its stdout")
        if line["type"] == "turn.completed":
            return status(AgentOutcome.SUCCEEDED, None, "the turn.completed line of its stdout")
        error = line.get("error")
        reason = error.get("message") if isinstance(error, dict) else error
        return status(AgentOutcome.FAILED, reason, "the turn.failed line of its stdout")

    def find_native(self, ctx: LaunchContext, session_id: str | None, plan: LaunchPlan) -> Path | None:
        if not session_id:
            return None
        return find_file([self._codex_home(ctx) / "sessions"], f"rollout-*-{session_id}.jsonl")

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        return EnvSnippet(
            env={"NO_PROXY": "127.0.0.1,localhost,::1"},
            argv=["codex"] + overrides(base_url, model),
            notes=[
                "Codex ignores OPENAI_BASE_URL: the -c overrides add a model provider for this session only.",
                "It sends OPENAI_API_KEY as usual; the gateway passes it on and never records it.",
            ],
        )


PROFILE = DESCRIPTOR = Codex()
