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

import os
from pathlib import Path

import orjson

from pvisor.adapters.chains import ChainHint

from .base import AgentProfile, EnvSnippet, LaunchContext, LaunchPlan, VersionRange, first_value, json_text, user_home

SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


class GeminiCli(AgentProfile):
    name = "gemini-cli"
    title = "Gemini CLI"
    executable = "gemini"
    versions = VersionRange((0, 61, 0), (0, 62))
    protocol = "gemini"
    upstream = "gemini"
    script_model = "gemini-2.5-pro"
    resumable = True
    resume_extends_chain = False
    auxiliary_first_prompt = 0
    chain_hint = ChainHint(tools=frozenset({"run_shell_command"}))
    key_env = "GEMINI_API_KEY"
    # Vertex AI would bypass the base URL
    removed_env = ("GOOGLE_GENAI_USE_VERTEXAI",)

    def _gemini_dir(self, ctx: LaunchContext) -> Path:
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
        argv += [f"--prompt={task}", "--output-format", "stream-json", "--yolo"]
        if ctx.model:
            argv += ["-m", ctx.model]
        return LaunchPlan(argv=argv, env=env, files=files)

    def session_id(self, stdout: bytes) -> str | None:
        return first_value(stdout, "session_id", type="init")

    def find_native(self, ctx: LaunchContext, session_id: str | None, plan: LaunchPlan) -> Path | None:
        if not session_id:
            return None
        root = self._gemini_dir(ctx) / "tmp"
        if not root.is_dir():
            return None
        for path in sorted(root.rglob(f"session-*-{session_id[:8]}.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True):
            try:
                with open(path, "rb") as f:
                    first = orjson.loads(f.readline() or b"{}")
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(first, dict) and first.get("sessionId") == session_id:
                return path
        return None

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        env = {"GOOGLE_GEMINI_BASE_URL": base_url, "NO_PROXY": "127.0.0.1,localhost,::1"}
        argv = ["gemini"] + (["-m", model] if model else [])
        return EnvSnippet(env=env, argv=argv, notes=["Gemini CLI reads its key from GEMINI_API_KEY as usual; if GOOGLE_API_KEY is also set it uses that one"
                                                  " instead (unset GOOGLE_API_KEY to use GEMINI_API_KEY)."])


PROFILE = GeminiCli()
