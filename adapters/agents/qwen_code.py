"""Qwen Code (``qwen``, npm ``@qwen-code/qwen-code``), verified with 0.24.4.

- Protocol: OpenAI Chat Completions, streamed; upstream ``openai``.
- Base URL: ``OPENAI_BASE_URL=<gateway>/run/<id>/v1``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``, and
  ``--auth-type openai``.
- Private home: ``$HOME/.qwen/settings.json`` with usage statistics, telemetry and auto-update
  off; ``QWEN_CODE_SUPPRESS_YOLO_WARNING=1``.
- Headless: ``qwen --auth-type openai --yolo --output-format stream-json --prompt=TASK``; resume:
  ``qwen --resume SESSION ...``: the first context message is regenerated, so the resumed
  requests start a **new chain** in the same run; from a session's second prompt on Qwen Code
  also sends a background "memory extraction" request (the conversation under another system
  prompt and six tools: another chain, auxiliary); on a first prompt it was seen only when the
  first reply made no tool call (docs/agents.md).
- Session id: ``session_id`` of the ``{"type": "system", "subtype": "init"}`` line on stdout.
- Native trajectory: ``<session id>.jsonl`` under ``$HOME/.qwen/projects/`` (searched by name).
"""

from __future__ import annotations

from dataclasses import replace
import os
import posixpath
import re
import shlex

from pvisor.journal.model import Message, TextPart, ToolResult

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
    json_text,
    user_home,
)
from . import effects as fx
from .descriptor import ISO_DATE, REFERENCED_FILES, SYSTEM_REMINDERS, ChainHint, attached_value, rx
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "disableAutoUpdate": True},
}


#: a leading ``NAME=value``: 0.24.4 then runs the command without its in-place ``sed`` check
_ENV_FIRST = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*=")
#: a ``sed`` flag word it takes for in-place and extended-regex flags (``-i``, ``-Ei``, ``-ri``)
_SED_FLAGS = re.compile(r"-[Er]*i?")
#: the shells whose ``-c SCRIPT`` wrapper it strips before the check
_WRAPPERS = frozenset({"sh", "bash", "zsh"})
#: an ``s/PATTERN/REPLACEMENT/FLAGS`` expression it simulates (flags ``g`` and one count)
_SUBSTITUTION = re.compile(r"s/(?:\\.|[^/\\])+/(?:\\.|[^/\\])*/g*(?:[1-9][0-9]*)?g*")
#: a shell variable or command substitution in the expression: not simulated, not checked
_VARIABLE = re.compile(r"`|\$(?:[A-Za-z_][A-Za-z0-9_]*|\{|\(|\d|[#?@$!*])")


def sed_in_place_file(command: str, wrapped: bool = False) -> str | None:
    """The file a ``run_shell_command`` of Qwen Code 0.24.4 edits as its own edit tool would, so
    refused unless the session read it (``has not been read in this session``), as the command
    names it; None when the check does not apply or ``command`` does not parse (:mod:`shlex`).

    Its rule (``parseSedEditCommand`` and ``getSedEditInfo`` of its bundle): after one
    ``sh|bash|zsh [-flags] -c SCRIPT`` wrapper, and with no leading ``NAME=value``, the command
    is ``sed`` and words only (no ``;``, ``&&``, ``|``, redirection), with an in-place flag
    (``-i``, ``-i ''``, ``--in-place``, ``-Ei``/``-ri``), at most ``-E``/``-r``, one expression
    (``-e E``, ``--expression=E`` or the first operand) ``s/P/R/F`` (``F``: ``g``, a count)
    without ``$NAME``, ``$(``, backquotes or a line break, and one file operand not starting
    with ``~`` and without ``$``. Only ``sed``: ``perl -i`` and other in-place editors, several
    files or a script file are run unchecked. (It also drops commands whose pattern JavaScript
    cannot compile alike: those are counted here, a read more than needed.)"""
    if _ENV_FIRST.match(command):
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote
        return None
    if any(w and set(w) <= set("();<>|&") for w in words) or not words:
        return None
    if not wrapped and posixpath.basename(words[0]) in _WRAPPERS and len(words) >= 3:
        if all(w.startswith("-") for w in words[1:-1]) and words[-2].endswith("c"):
            return sed_in_place_file(words[-1], wrapped=True)
        return None
    if words[0] != "sed":
        return None
    in_place, expression, operands, i = False, None, [], 1
    while i < len(words):
        w = words[i]
        if len(w) > 2 and _SED_FLAGS.fullmatch(w):
            in_place = in_place or w.endswith("i")
        elif w in ("-i", "--in-place", "--in-place="):
            in_place = True
            if w == "-i" and i + 1 < len(words) and words[i + 1] == "":
                i += 1
        elif w.startswith(("-i", "--in-place=")):  # a backup suffix: not simulated
            return None
        elif w in ("-e", "--expression"):
            if expression is not None or i + 1 >= len(words):
                return None
            expression, i = words[i + 1], i + 1
        elif w.startswith("--expression="):
            if expression is not None:
                return None
            expression = w.split("=", 1)[1]
        elif w in ("-E", "-r", "--regexp-extended"):
            pass
        elif w.startswith("-"):
            return None
        elif expression is None:
            expression = w
        else:
            operands.append(w)
        i += 1
    if not in_place or expression is None or len(operands) != 1:
        return None
    path = operands[0]
    if not path or path.startswith("~") or "$" in path or "\n" in expression or "\r" in expression:
        return None
    if _VARIABLE.search(expression) or not _SUBSTITUTION.fullmatch(expression):
        return None
    return path


class QwenCode(AgentProfile):
    name = "qwen-code"
    title = "Qwen Code"
    shell_tools = {"run_shell_command": ("command",)}
    atif_names = ("qwen-coder",)  # Harbor's AgentName; its converter writes qwen-code
    versions = VersionRange((0, 24, 0), (0, 25))
    protocol = "openai-chat"
    protocols = ("openai-chat", "anthropic", "gemini")  # --auth-type openai|anthropic|gemini
    native_raw_protocol = "gemini"
    upstream = "openai"
    script_model = "mock-model"
    needs_model = True
    resumable = True
    resume_extends_chain = False
    auxiliary_first_prompt = 0
    ca_env = {"NODE_EXTRA_CA_CERTS": "cert"}  # Node adds it to its built-in CAs
    intercept_verified = True  # tests/test_intercept.py runs it through the proxy
    chain_hint = ChainHint(tools=frozenset({"run_shell_command"}))
    key_env = "OPENAI_API_KEY"
    task_option = "--prompt="
    volatile_context = (
        "<system-reminder> user blocks (date, temporary paths)",
        "home paths in the system prompt",
    )
    volatile_patterns = (rx(r"<system-reminder>[\s\S]*?</system-reminder>"), ISO_DATE)
    # beside the prompt: its reminders and a UserPromptSubmit hook's context (its system prompt
    # names the tag) in parts of their own, and after it the files the prompt names with @
    prompt_wrappers = (
        SYSTEM_REMINDERS,
        rx(r"\s*<qwen:user-prompt-submit-context>[\s\S]*</qwen:user-prompt-submit-context>\s*"),
    )
    prompt_blocks = (REFERENCED_FILES,)
    prompt_markers = ("<system-reminder>", "<qwen:user-prompt-submit-context>")
    output_decorations = ((rx(r"Process Group PGID: \d+"), "Process Group PGID: <pgid>"),)
    shell_output_pattern = rx(
        r"Command: [\s\S]*?\nDirectory: [^\n]*\nOutput: (?P<out>[\s\S]*?)\nError: [\s\S]*"
    )
    empty_outputs = ("(empty)",)
    # run_shell_command's line after the output and its error (``Exit Code: (none)`` for a signal)
    shell_exit_pattern = rx(r"(?m)^Exit Code: (?P<code>-?\d+)$")
    path_arguments = {
        "read_file": ("file_path",),
        "write_file": ("file_path",),
        "edit": ("file_path",),
        "notebook_edit": ("notebook_path",),
        "glob": ("path",),
        "grep_search": ("path",),
        "run_shell_command": ("directory",),
    }
    read_tools = frozenset({"read_file", "glob", "grep_search"})
    image_readers = {"read_file": "file_path"}
    #: edit and write_file (and an in-place ``sed`` through its shell) refuse an existing file
    #: not read in the session, or one whose mtime or size changed since (checked with 0.24.4)
    reads_before_change = True
    tool_effects = {
        "run_shell_command": fx.shell("command", workdir="directory", description="description"),
        # offset counts from 0 and is taken only with a limit (its schema says so)
        "read_file": fx.read("file_path", "offset", "limit", needs_limit=True),
        "write_file": fx.write("file_path", "content"),
        "edit": fx.edit("file_path", "old_string", "new_string", "replace_all"),
        **fx.kinds(fx.Effect.LIST, "glob", "grep_search", "list_directory"),
        # todo_write is a deferred tool of 0.24.4, reached through tool_search/tool_call; its
        # request 1 neither declares it nor names it (no deferred-tools reminder), so a handoff
        # routes no todo list to it: a plan kind without a shape
        **fx.kinds(fx.Effect.PLAN, "todo_write"),
        **fx.goals("update_goal", "get_goal"),
        **fx.kinds(fx.Effect.SUBAGENT, "agent", "task"),
        **fx.kinds(fx.Effect.WEB, "web_fetch", "web_search"),
    }

    def shell_reads_first(self, command: str) -> tuple[str, ...]:
        # 0.24.4 runs an in-place sed as its edit tool, after the same prior-read check
        path = sed_in_place_file(command)
        return (path,) if path is not None else ()

    def compaction_differences(self, protocol: str) -> str | None:
        # seen in the requests 0.24.4 sent after compressing under pvisor run
        return (
            "from the second request after the compression on, Qwen Code puts its start-up reminders "
            "(skills, environment, "
            "deferred tools) back in front of the summary; no record of its file holds them"
        )

    def wire_message(self, protocol: str, msg: Message) -> Message:
        """A user message of texts read from no wire shape (a compressed history) goes out as
        Qwen Code sends user text in Chat Completions: a list of text blocks, not a string."""
        if (
            protocol == "openai-chat"
            and msg.role == "user"
            and msg.raw is None
            and msg.parts
            and all(isinstance(p, TextPart) and p.raw is None for p in msg.parts)
        ):
            return Message(
                "user", [TextPart(p.text, raw={"type": "text", "text": p.text}) for p in msg.parts]
            )  # type: ignore[union-attr]
        return msg

    def wire_result(self, protocol: str, result: ToolResult, names: dict[str, str]) -> ToolResult:
        """Its file stores ``{"output": TEXT}``; it sends one text block ``[{"type":"text","text":TEXT}]``."""
        c = result.content
        if isinstance(c, dict) and list(c) == ["output"] and isinstance(c["output"], str):
            if protocol == "openai-chat":
                return replace(result, content=[{"type": "text", "text": c["output"]}])
            if protocol == "anthropic":  # a tool_result's content is a string or a list of blocks
                return replace(result, content=c["output"], raw=None)
        return result

    def task_from_argv(self, argv: list[str]) -> str | None:
        return attached_value(argv, "--prompt")

    def _qwen_dir(self, ctx: LaunchContext) -> Path:
        from pathlib import Path  # launching only: prepare-only loads no pathlib

        if ctx.home is not None:
            return ctx.home / ".qwen"
        return Path(os.environ["QWEN_HOME"]) if os.environ.get("QWEN_HOME") else user_home() / ".qwen"

    def plan(self, ctx: LaunchContext, task: str, session_id: str | None = None) -> LaunchPlan:
        env = self.base_env(ctx)
        env["OPENAI_BASE_URL"] = ctx.base_url + "/v1"
        env["OPENAI_MODEL"] = ctx.model or self.script_model
        env["QWEN_CODE_SUPPRESS_YOLO_WARNING"] = "1"
        files: dict[Path, str] = {}
        if ctx.home is not None:
            env["QWEN_HOME"] = None
            files[ctx.home / ".qwen" / "settings.json"] = json_text(SETTINGS)
        argv = [ctx.executable]
        if session_id is not None:
            argv += ["--resume", session_id]
        # --prompt=TASK (attached): its positional prompt does not take "--" (0.24.4 then reads stdin)
        argv += [
            "--auth-type",
            "openai",
            "--yolo",
            "--output-format",
            "stream-json",
            self.task_argument(task),
        ]
        return LaunchPlan(argv=argv, env=env, files=files)

    def session_id(self, stdout: bytes) -> str | None:
        return first_value(stdout, "session_id", type="system", subtype="init")

    def final_status(self, stdout: bytes, native: Path | None) -> AgentStatus:
        # Claude Code's stream-json shape: subtype error_during_execution, error.message
        return stream_json_result(stdout)

    def find_native(self, ctx: LaunchContext, session_id: str | None, plan: LaunchPlan) -> Path | None:
        if not session_id:
            return None
        return find_file([self._qwen_dir(ctx) / "projects"], f"{session_id}.jsonl")

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        env = {"OPENAI_BASE_URL": base_url + "/v1", "NO_PROXY": "127.0.0.1,localhost,::1"}
        if model:
            env["OPENAI_MODEL"] = model
        return EnvSnippet(
            env=env,
            argv=["qwen", "--auth-type", "openai"],
            notes=["Qwen Code reads its key from OPENAI_API_KEY."],
        )


PROFILE = DESCRIPTOR = QwenCode()
