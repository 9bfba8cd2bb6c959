"""Claude Code (``claude``, npm ``@anthropic-ai/claude-code``), verified with 2.1.332.

- Protocol: Anthropic Messages, streamed (``POST /v1/messages?beta=true``); upstream ``anthropic``.
- Base URL: ``ANTHROPIC_BASE_URL=<gateway>/run/<id>`` (no ``/v1``: the agent adds it).
- Headless: ``claude -p --output-format stream-json --verbose --allowedTools ... -- TASK`` (``-p``
  is a flag, the prompt positional: after ``--`` a task such as ``--version`` is no option).
  ``--allowedTools`` rather than ``--dangerously-skip-permissions``, which Claude Code refuses
  as root unless ``IS_SANDBOX=1`` (never set by default).
- Resume: ``claude --resume SESSION -p ... -- TASK`` in the same workspace and home; the resumed
  requests repeat the old conversation (with ``cache_control`` moved) and extend the main chain.
- Session id: ``session_id`` of the ``{"type": "system", "subtype": "init"}`` line on stdout.
- Native trajectory: ``<session id>.jsonl`` under ``$HOME/.claude/projects/`` (searched by that
  name; its folder is a cwd slug that pvisor never rebuilds).
- Quiet: ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (with 2.1.332 this also stops the
  ``HEAD /api/hello`` reachability probe, so a first prompt sends no auxiliary exchange),
  ``DISABLE_TELEMETRY``, ``DISABLE_AUTOUPDATER``, ``DISABLE_ERROR_REPORTING``.
"""

from __future__ import annotations

import os

from .base import (
    AgentStatus,
    stream_json_result,
    AgentProfile,
    EnvSnippet,
    LaunchContext,
    LaunchPlan,
    VersionRange,
    find_file,
    first_value,
    user_home,
)
from . import effects as fx
from .descriptor import ISO_DATE, SYSTEM_REMINDERS, ChainHint, after_separator, rx
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}

#: tools allowed without a permission prompt (headless runs cannot answer one)
ALLOWED_TOOLS = "Bash,Edit,Write,NotebookEdit"


class ClaudeCode(AgentProfile):
    name = "claude-code"
    title = "Claude Code"
    shell_tools = {"Bash": ("command",)}
    versions = VersionRange((2, 1, 0), (2, 2))
    protocol = "anthropic"
    protocols = ("anthropic",)
    native_raw_protocol = "anthropic"
    request_query = "beta=true"
    upstream = "anthropic"
    script_model = "claude-sonnet-4-5"
    resumable = True
    resume_extends_chain = True
    auxiliary_first_prompt = 0
    chain_hint = ChainHint(tools=frozenset({"Bash"}))
    key_env = "ANTHROPIC_API_KEY"
    # metadata.user_id names the session (a new one in every run)
    run_params = ("metadata.user_id",)
    volatile_context = (
        "the <env> block of the system prompt (working directory, platform, date) and its git status",
        "the x-anthropic-billing-header block leading the system prompt sent to api.anthropic.com",
    )
    volatile_patterns = (
        rx(r"<env>[\s\S]*?</env>"),
        rx(r"gitStatus:[\s\S]*?(?=\n\n|$)"),
        rx(r"x-anthropic-billing-header: [^\n]*"),
        ISO_DATE,
    )
    # its context beside the prompt: reminders in parts of their own, before it and after it
    prompt_wrappers = (SYSTEM_REMINDERS,)
    prompt_markers = ("<system-reminder>",)
    # the last tool result of a request carries a reminder the native file does not hold
    output_decorations = ((rx(r"\s*<system-reminder>[\s\S]*?</system-reminder>\s*"), ""),)
    empty_outputs = ("(Bash completed with no output)",)
    path_arguments = {
        "Read": ("file_path",),
        "Write": ("file_path",),
        "Edit": ("file_path",),
        "MultiEdit": ("file_path",),
        "NotebookEdit": ("notebook_path",),
        "Glob": ("path",),
        "Grep": ("path",),
    }
    read_tools = frozenset({"Read", "Glob", "Grep"})
    image_readers = {"Read": "file_path"}
    #: Edit and Write refuse an existing file not read whole in the session ("File has not been
    #: read yet"), or one whose content changed since (checked with the pinned 2.1 CLI)
    reads_before_change = True
    tool_effects = {
        "Bash": fx.shell("command", description="description"),
        "Read": fx.read("file_path", "offset", "limit", offset_base=1),
        "Write": fx.write("file_path", "content"),
        "Edit": fx.edit("file_path", "old_string", "new_string", "replace_all"),
        **fx.kinds(fx.Effect.LIST, "Glob", "Grep", "LS"),
        # TodoWrite: Claude Code 2.1 defers it (ToolSearch), so its request 1 rarely offers it
        "TodoWrite": fx.todos("todos", fx.TodoShape("content", "status", active="activeForm")),
        **fx.kinds(fx.Effect.PLAN, "ExitPlanMode"),
        **fx.kinds(fx.Effect.SUBAGENT, "Task", "Agent"),
        **fx.kinds(fx.Effect.WEB, "WebFetch", "WebSearch"),
    }
    # 2.1.332 runs a call of the legacy name Task and sends it back as Agent (the runs of older
    # versions, and scripts, call Task): no change of the action
    echo_aliases = {"Task": "Agent"}
    # these send requests to Bedrock or Vertex around the gateway, or move the config dir;
    # an auth token would be sent instead of the key we give the scripted model
    removed_env = (
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_USE_VERTEX",
        "ANTHROPIC_BEDROCK_BASE_URL",
        "ANTHROPIC_VERTEX_BASE_URL",
    )
    ca_env = {"NODE_EXTRA_CA_CERTS": "cert"}  # Node adds it to its built-in CAs
    intercept_verified = True  # tests/test_intercept.py runs it through the proxy
    intercept_unset_env = ("ANTHROPIC_BASE_URL",)  # it goes to api.anthropic.com by itself

    def compaction_differences(self, protocol: str) -> str | None:
        # seen in the requests 2.1.332 sent after compacting under pvisor run
        return (
            "Claude Code sends a date reminder before the summary and appends the files it read again "
            "and its tool listings "
            "to the kept tool result: those are attachment lines of its file, not in the prefix"
        )

    def base_env(self, ctx: LaunchContext) -> dict[str, str | None]:
        env = super().base_env(ctx)
        if ctx.home is not None:
            env["CLAUDE_CONFIG_DIR"] = None  # the private $HOME/.claude
        if ctx.api_key is not None:
            env["ANTHROPIC_AUTH_TOKEN"] = None
        return env

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        env = self.base_env(ctx)
        env["ANTHROPIC_BASE_URL"] = ctx.base_url
        env.update(QUIET_ENV)
        argv = [ctx.executable]
        if session_id is not None:
            argv += ["--resume", session_id]
        argv += ["-p", "--output-format", "stream-json", "--verbose", "--allowedTools", ALLOWED_TOOLS]
        if ctx.model:
            argv += ["--model", ctx.model]
        argv += ["--", task]  # -p is a flag and the prompt positional: after --, "-v ..." is never an option
        return LaunchPlan(argv=argv, env=env)

    def task_from_argv(self, argv: list[str]) -> str | None:
        return after_separator(argv)

    def session_id(self, stdout: bytes) -> str | None:
        return first_value(stdout, "session_id", type="system", subtype="init")

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        # the last stream-json result line: is_error true with the reason in ``result``
        # (a live run without a key: "Not logged in · Please run /login", exit 1, stderr empty)
        return stream_json_result(stdout)

    def find_native(self, ctx: LaunchContext, session_id: str | None, plan: LaunchPlan) -> Path | None:
        from pathlib import Path  # launching only: prepare-only loads no pathlib

        if not session_id:
            return None
        home = ctx.home if ctx.home is not None else user_home()
        roots = [home / ".claude" / "projects"]
        if ctx.home is None and os.environ.get("CLAUDE_CONFIG_DIR"):  # --use-home with a moved config dir
            roots.insert(0, Path(os.environ["CLAUDE_CONFIG_DIR"]) / "projects")
        return find_file(roots, f"{session_id}.jsonl")

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        env = {"ANTHROPIC_BASE_URL": base_url, **QUIET_ENV, "NO_PROXY": "127.0.0.1,localhost,::1"}
        argv = ["claude"] + (["--model", model] if model else [])
        return EnvSnippet(
            env=env,
            argv=argv,
            notes=["Claude Code reads its key from ANTHROPIC_API_KEY (or your login) as usual."],
        )


PROFILE = DESCRIPTOR = ClaudeCode()
