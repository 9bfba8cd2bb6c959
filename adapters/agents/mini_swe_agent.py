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

import re
from pathlib import Path

from pvisor.adapters.chains import ChainHint
from pvisor.journal.errors import UsageError

from .base import AgentProfile, EnvSnippet, LaunchContext, LaunchPlan, VersionRange

QUIET_ENV = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "MSWEA_SILENT_STARTUP": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}

TRAJECTORY_NAME = "mini-swe-agent.traj.json"


def model_spec(model: str) -> str:
    """litellm's ``provider/model`` name: ``openai/`` in front of a bare model name."""
    return model if model.startswith("openai/") else "openai/" + model


class MiniSweAgent(AgentProfile):
    name = "mini-swe-agent"
    title = "mini-swe-agent"
    executable = "mini"
    versions = VersionRange((2, 4, 0), (2, 5))
    protocol = "openai-chat"
    upstream = "openai"
    script_model = "mock-model"
    needs_model = True
    resumable = False
    resume_extends_chain = False
    auxiliary_first_prompt = 0
    json_stdout = False
    chain_hint = ChainHint(tools=frozenset({"bash"}))
    key_env = "OPENAI_API_KEY"

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
            raise UsageError("mini-swe-agent has no native resume; --resume works with claude-code, codex, gemini-cli, opencode and qwen-code")
        env = self.base_env(ctx)
        env.update(QUIET_ENV)
        if ctx.home is not None:
            env["MSWEA_GLOBAL_CONFIG_DIR"] = str(ctx.home / ".config" / "mini-swe-agent")
        out = ctx.run_dir / TRAJECTORY_NAME
        argv = [
            ctx.executable,
            "-m", model_spec(ctx.model or self.script_model),
            "-c", "mini.yaml",
            "-c", f"model.model_kwargs.api_base={ctx.base_url}/v1",
            f"--task={task}",  # attached: a task starting with "-" is never an option
            "--yolo", "--exit-immediately",
            "-o", str(out),
        ]
        return LaunchPlan(argv=argv, env=env, native_path=out)

    def snippet(self, base_url: str, run_dir: Path, model: str | None) -> EnvSnippet:
        return EnvSnippet(
            env={"NO_PROXY": "127.0.0.1,localhost,::1"},
            argv=["mini", "-m", model_spec(model or "gpt-5"), "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={base_url}/v1"],
            notes=["litellm reads the key from OPENAI_API_KEY."] + ([] if model else ["Model gpt-5: give pvisor env --model NAME for another."]),
        )


PROFILE = MiniSweAgent()
