"""The six agents pvisor launches and where ``scripts/install-agents`` puts each one's executable
under the agents directory (``--agents-dir``, ``$PVISOR_AGENTS_DIR`` or ``.agents/``), shared by
the benchmarks that run the real CLIs (bench/handoff_bench.py, bench/handoff_matrix.py).
tests/agent_helpers.py keeps the same paths for the test suite."""

from __future__ import annotations

#: the six agents, in the order tables list them
AGENTS = ("claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent")
#: each agent's executable, relative to the agents directory
ENTRYPOINTS = {
    "claude-code": "claude-code/node_modules/.bin/claude",
    "codex": "codex/node_modules/.bin/codex",
    "gemini-cli": "gemini-cli/node_modules/.bin/gemini",
    "opencode": "opencode/node_modules/.bin/opencode",
    "qwen-code": "qwen-code/node_modules/.bin/qwen",
    "mini-swe-agent": "mini-swe-agent/venv/bin/mini",
}
