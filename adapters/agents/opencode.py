"""OpenCode (``opencode``, npm ``opencode-ai``), verified with 1.18.33.

- Protocol: OpenAI Chat Completions, streamed (``POST /v1/chat/completions``) through the
  ``@ai-sdk/openai-compatible`` provider; upstream ``openai``.
- Base URL: a provider ``pvisor`` with ``options.baseURL = "<gateway>/run/<id>/v1"`` and its key
  from ``OPENAI_API_KEY``, in a config file ``<run dir>/opencode.json`` named by
  ``OPENCODE_CONFIG`` (never an ``opencode.json`` in the workspace, where the recipe of
  docs/agents.md puts it: OpenCode merges ``OPENCODE_CONFIG`` over the global config, verified with
  1.18.33). It sets ``model`` and ``small_model`` to the provider's one model (``tool_call``
  on), ``autoupdate: false``, ``share: "disabled"`` and lets bash and edit run without asking.
  Quiet: ``OPENCODE_DISABLE_MODELS_FETCH``, ``OPENCODE_DISABLE_AUTOUPDATE``,
  ``OPENCODE_DISABLE_LSP_DOWNLOAD``, ``OPENCODE_DISABLE_SHARE``. Its data (the ``opencode.db``
  SQLite session store) lives under ``$XDG_DATA_HOME/opencode`` of the private home.
- Headless: ``opencode run --format json -- TASK`` (the JSON events carry ``sessionID``); resume:
  ``opencode run --session SESSION --format json -- TASK`` (extends the main chain).
- Auxiliary exchanges: a title request (no tools, another system prompt) on a session's first
  prompt, racing the main loop: one per first prompt.
- Native trajectory: none on disk in a readable form; ``opencode export SESSION`` (its data
  directory the run's; no plugin, a fresh config, a fresh working directory, in the agent's
  sandbox when it had one: :meth:`OpenCode.export_plan`) prints the session as JSON, saved as
  ``<run dir>/opencode-session-<id>.json``.
"""

from __future__ import annotations


from pvisor.journal.model import Conversation, Message, TextPart

from .base import (
    AgentOutcome,
    AgentStatus,
    last_line,
    status,
    AgentProfile,
    EnvSnippet,
    ExportPlan,
    LaunchContext,
    LaunchPlan,
    VersionRange,
    first_value,
    json_text,
    private_home_env,
)
from . import effects as fx
from .descriptor import ISO_DATE, ChainHint, RequestTask, after_separator, rx
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

PROVIDER = "pvisor"

QUIET_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}

#: what ``opencode export`` runs with beside :data:`QUIET_ENV`: no external plugin (those of its
#: configuration and of ``.opencode/plugin/`` directories: ``--pure``), no configuration of the
#: project (``opencode.json`` and ``.opencode/`` found up from its directory), none of the
#: built-in plugins (provider logins); read from the 1.18.33 binary's flags
EXPORT_ENV = {
    "OPENCODE_PURE": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    **QUIET_ENV,
}


#: a double quote not escaped by a backslash (inside a quoted argument OpenCode escapes them)
UNESCAPED_QUOTE = rx(r'(?<!\\)"')


def unquote_prompt(text: str) -> str:
    """The prompt as ``opencode run`` was given it, from the text it sends and stores: each
    argument holding a space goes in double quotes with its own double quotes escaped
    (``say "hi" now`` -> ``"say \\"hi\\" now"``; backslashes and newlines as they are), the
    arguments joined by spaces (verified with 1.18.33). A text not so quoted is returned as it is."""
    if len(text) >= 2 and text[0] == text[-1] == '"' and " " in text:
        return text[1:-1].replace('\\"', '"')
    return text


def config(base_url: str, model: str) -> dict:
    """The OpenCode config that routes its one model through the gateway."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": base_url + "/v1", "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {model: {"name": model, "tool_call": True}},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow", "edit": "allow"},
    }


class OpenCode(AgentProfile):
    name = "opencode"
    title = "OpenCode"
    versions = VersionRange((1, 18, 0), (1, 19))
    protocol = "openai-chat"
    protocols = ("openai-chat", "anthropic", "openai-responses", "gemini")  # AI SDK providers
    # the built-in providers' AI SDK packages (opencode packages/opencode/src/provider/provider.ts:
    # @ai-sdk/anthropic, @ai-sdk/openai through its Responses model, @ai-sdk/google); a
    # provider of a config file (pvisor's own, or any other id) is @ai-sdk/openai-compatible
    # unless it says otherwise, which the export does not record: Chat Completions
    provider_protocols = {
        "anthropic": "anthropic",
        "openai": "openai-responses",
        "google": "gemini",
        "google-vertex": "gemini",
        PROVIDER: "openai-chat",
    }
    upstream = "openai"
    script_model = "mock-model"
    needs_model = True
    resumable = True
    resume_extends_chain = True
    auxiliary_first_prompt = 1
    chain_hint = ChainHint(tools=frozenset({"bash"}))
    key_env = "OPENAI_API_KEY"
    # an inline config would override ours
    removed_env = ("OPENCODE_CONFIG_CONTENT",)
    ca_env = {"NODE_EXTRA_CA_CERTS": "cert"}  # Bun reads Node's variable
    intercept_verified = True  # tests/test_intercept.py runs it through the proxy
    volatile_context = ("the <env> block of the system prompt (working directory, git repo, platform, date)",)
    volatile_patterns = (rx(r"<env>[\s\S]*?</env>"), rx(r"Today's date: [^\n]*"), ISO_DATE)
    empty_outputs = ("(no output)",)
    path_arguments = {
        "read": ("filePath",),
        "write": ("filePath",),
        "edit": ("filePath",),
        "glob": ("path",),
        "grep": ("path",),
        "bash": ("workdir",),
    }
    read_tools = frozenset({"read", "glob", "grep"})
    image_readers = {"read": "filePath"}
    #: (no ``reads_before_change``: 1.18.33 edits and overwrites a file it has not read, checked
    #: with the pinned CLI, though its edit tool's description says otherwise)
    tool_effects = {
        "bash": fx.shell("command", workdir="workdir", description="description"),
        "read": fx.read("filePath", "offset", "limit", offset_base=1),
        "write": fx.write("filePath", "content"),
        "edit": fx.edit("filePath", "oldString", "newString", "replaceAll"),
        "apply_patch": fx.ToolEffect(fx.Effect.PATCH, patch="patchText"),
        **fx.kinds(fx.Effect.LIST, "glob", "grep", "list"),
        "todowrite": fx.todos(
            "todos",
            fx.TodoShape(
                "content",
                "status",
                statuses=("pending", "in_progress", "completed", "cancelled"),
                fill=(("priority", "medium"),),
            ),
        ),
        **fx.kinds(fx.Effect.PLAN, "todoread"),
        **fx.kinds(fx.Effect.SUBAGENT, "task"),
        **fx.kinds(fx.Effect.WEB, "webfetch", "websearch"),
    }

    def wire_message(self, protocol: str, msg: Message) -> Message:
        """A user message of text parts goes out in Chat Completions as OpenCode sends it: one
        text as a string (the parts' own fields, ``synthetic``, ``metadata``, are the export's,
        never sent)."""
        if (
            protocol == "openai-chat"
            and msg.role == "user"
            and msg.parts
            and all(isinstance(p, TextPart) for p in msg.parts)
        ):
            return Message("user", [TextPart(p.text) for p in msg.parts])  # type: ignore[union-attr]
        return msg

    def task_from_argv(self, argv: list[str]) -> str | None:
        return after_separator(argv)

    def task_from_trajectory(self, task: str | None, meta: dict) -> str | None:
        """Its session stores the prompt as it sends it: quoted (:func:`unquote_prompt`)."""
        return unquote_prompt(task) if isinstance(task, str) else task

    def task_from_request(self, conv: Conversation) -> RequestTask:
        """The prompt unquoted (:func:`unquote_prompt`). A text with a space that is not one
        quoted argument came from several arguments of ``opencode run``, which one task
        argument would send quoted: None with why."""
        read = self.read_prompt(conv)
        if read.task is None:
            return read
        text = read.task
        one_quoted = len(text) >= 2 and text[0] == text[-1] == '"' and not UNESCAPED_QUOTE.search(text[1:-1])
        if " " in text and not one_quoted:
            return RequestTask(
                None,
                "its prompt reads as several arguments of opencode run (words joined by spaces, not one "
                "quoted argument), which one task argument would send quoted",
            )
        return super().task_from_request(conv)

    def _env(self, ctx: LaunchContext) -> dict[str, str | None]:
        env = self.base_env(ctx)
        env["OPENCODE_CONFIG"] = str(ctx.run_dir / "opencode.json")
        if ctx.home is not None:
            env["OPENCODE_CONFIG_DIR"] = None
        env.update(QUIET_ENV)
        return env

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        model = ctx.model or self.script_model
        files = {ctx.run_dir / "opencode.json": json_text(config(ctx.base_url, model))}
        argv = [ctx.executable, "run"]
        if session_id is not None:
            argv += ["--session", session_id]
        argv += ["--format", "json", "--", task]  # a task starting with "-" is never read as an option
        return LaunchPlan(argv=argv, env=self._env(ctx), files=files)

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        """The last of its ``error`` and ``step_finish`` events on stdout: an error (``APIError``
        with ``data.message``) fails the run; a step that finished with reason ``stop`` ends
        it well; one that finished for tool calls and was never followed says nothing."""
        line = last_line(stdout, ("error", "step_finish"))
        if line is None:
            return status(AgentOutcome.UNKNOWN, None, "no step_finish or error line on its stdout")
        if line["type"] == "error":
            error = line.get("error")
            data = error.get("data") if isinstance(error, dict) else None
            reason = (data.get("message") if isinstance(data, dict) else None) or (
                error.get("name") if isinstance(error, dict) else error
            )
            return status(AgentOutcome.FAILED, reason, "the error line of its stdout")
        part = line.get("part")
        why = part.get("reason") if isinstance(part, dict) else None
        if why == "stop":
            return status(AgentOutcome.SUCCEEDED, None, "the last step_finish line of its stdout")
        return status(AgentOutcome.UNKNOWN, f"its last step finished with reason {why}", "its stdout")

    def session_id(self, stdout: bytes) -> str | None:
        return first_value(stdout, "sessionID")

    def export_plan(self, ctx: LaunchContext, session_id: str | None, scratch: Path) -> ExportPlan | None:
        """``opencode export SESSION``, given the least it needs: it finds the session by its
        id in the data directory (``$XDG_DATA_HOME/opencode/opencode.db``), from any working
        directory (verified with 1.18.33). OpenCode loads plugins at start, from its
        configuration (``plugin``), from ``.opencode/plugin/`` of its working directory and of
        the config directories, and with them runs what the agent's calls could have written:
        so no external plugin (:data:`EXPORT_ENV`: ``OPENCODE_PURE``, what ``--pure`` sets), no
        project configuration, a fresh configuration in ``scratch`` (the run's, pvisor's own)
        instead of the run directory's, and with a private home only its data directory kept:
        ``HOME`` and the other XDG directories in ``scratch``."""
        if not session_id:
            return None
        path = scratch / "opencode.json"
        env: dict[str, str | None] = {
            "OPENCODE_CONFIG": str(path),
            "OPENCODE_CONFIG_DIR": None,
            "OPENCODE_CONFIG_CONTENT": None,
            **EXPORT_ENV,
        }
        fresh = private_home_env(scratch)
        if ctx.home is not None:
            fresh["XDG_DATA_HOME"] = private_home_env(ctx.home)["XDG_DATA_HOME"]
        else:  # the user's own home (--use-home): it and its data directory as the agent had them
            del fresh["HOME"], fresh["XDG_DATA_HOME"]
        env.update(fresh)
        return ExportPlan(
            argv=[ctx.executable, "export", session_id],
            output=ctx.run_dir / f"opencode-session-{session_id}.json",
            env=env,
            files={path: json_text(config(ctx.base_url, ctx.model or self.script_model))},
        )

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        path = run_dir / "opencode.json"
        return EnvSnippet(
            env={"OPENCODE_CONFIG": str(path), **QUIET_ENV, "NO_PROXY": "127.0.0.1,localhost,::1"},
            files={path: json_text(config(base_url, model or "gpt-5"))},
            argv=["opencode"],
            notes=[
                "OPENCODE_CONFIG adds a provider 'pvisor' over your own config; "
                "the key comes from OPENAI_API_KEY."
            ]
            + ([] if model else ["Model gpt-5: give pvisor env --model NAME for another."]),
        )


PROFILE = DESCRIPTOR = OpenCode()
