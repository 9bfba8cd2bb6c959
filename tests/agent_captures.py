"""Session-scoped captures of the real agent CLIs, shared by tests/test_agents.py and
tests/test_native_crosscheck.py through conftest.py: one ``pvisor run --script`` per agent per
test session (and one native resume each), so every test reads the same run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from agent_helpers import RESUME_TASK, TASK, entrypoint, pvisor, script_for, user_env

#: a generous budget per agent run (OpenCode's cold start alone takes seconds on a busy box)
AGENT_TIMEOUT_S = 240


@dataclass
class Capture:
    """One ``pvisor run`` of an agent: its files, the process result and the ``--json`` report."""

    agent: str
    root: Path
    journal: Path
    workspace: Path
    user_home: Path
    script: Path
    proc: Any
    report: dict[str, Any]

    @property
    def run(self) -> str:
        return self.report["run"]

    def stdout_of(self, attempt: int = 1) -> bytes:
        return (Path(self.report["run_dir"]) / f"attempt-{attempt}.stdout").read_bytes()


def _run(
    agent: str,
    root: Path,
    journal: Path,
    workspace: Path,
    home: Path,
    script: Path,
    task: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> tuple[Any, dict]:
    """``pvisor run --script`` of ``agent`` (``extra`` options before the task, ``env`` more
    variables for the agent): (process, the ``--json`` report)."""
    args = [
        "--journal",
        str(journal),
        "run",
        "--agent",
        agent,
        "--agent-entrypoint",
        str(entrypoint(agent)),
        "--script",
        str(script),
        "--workspace",
        str(workspace),
        "--timeout",
        str(AGENT_TIMEOUT_S),
        "--json",
        *extra,
        "--",
        task,
    ]
    proc = pvisor(args, env=user_env(home, **(env or {})), cwd=root, timeout=AGENT_TIMEOUT_S + 60)
    assert "Traceback" not in proc.stderr, proc.stderr
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"pvisor run --agent {agent} printed no JSON report (exit {proc.returncode}):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return proc, report


@pytest.fixture(scope="session")
def captured(tmp_path_factory) -> Callable[[str], Capture]:
    """``captured(agent)``: the agent's capture, made on first use and reused for the session."""
    cache: dict[str, Capture] = {}

    def get(agent: str) -> Capture:
        if agent not in cache:
            root = tmp_path_factory.mktemp(f"run-{agent}")
            workspace, home, data = root / "workspace", root / "user-home", root / "data"
            for d in (workspace, home, data):
                d.mkdir()
            script = root / "script.json"
            script.write_text(json.dumps(script_for(agent)))
            journal = data / "journal.sqlite"
            proc, report = _run(agent, root, journal, workspace, home, script, TASK)
            cache[agent] = Capture(agent, root, journal, workspace, home, script, proc, report)
        return cache[agent]

    return get


@pytest.fixture(scope="session")
def resumed(captured) -> Callable[[str], tuple[Capture, Any, dict]]:
    """``resumed(agent)``: (capture, process, report) of ``--resume`` of the capture, made once."""
    cache: dict[str, tuple] = {}

    def get(agent: str):
        if agent not in cache:
            cap = captured(agent)
            assert cap.proc.returncode == 0, cap.proc.stderr
            proc, report = _run(
                agent,
                cap.root,
                cap.journal,
                cap.workspace,
                cap.user_home,
                cap.script,
                RESUME_TASK,
                "--resume",
                cap.run,
            )
            cache[agent] = (cap, proc, report)
        return cache[agent]

    return get
