"""What one ``pvisor run`` did: :class:`RunReport`, made by :mod:`pvisor.session.run` and read
by ``pvisor run``'s report and ``--json`` (docs/cli.md), replay-only and continuation
(:mod:`pvisor.session.replay`) and the steps' derivation (:mod:`pvisor.session.steps`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvisor.adapters.agents.base import AgentOutcome, AgentStatus
from pvisor.session.sandbox import no_sandbox

#: what ``pvisor run`` exits with when the agent exited 0 but its own final status says it
#: failed (mini-swe-agent's ``RepeatedFormatError``): a failure is never reported as a success
EXIT_AGENT_FAILED = 1


@dataclass
class RunReport:
    """What one ``pvisor run`` did. ``exit_code`` is what the command exits with: the agent's
    own code, 124 after ``--timeout``, 128 + the signal's number after a stop signal (130 Ctrl-C,
    129 SIGHUP, 143 SIGTERM; ``interrupt_signal`` names it). ``stray_processes_killed``: how
    many processes the agent left running (in its group or escaped into their own session)
    pvisor ended after it. ``steps`` and the counts after it are None when the steps could not
    be derived (``steps_error`` says why). ``attempt_steps``: the main-loop chains this attempt
    sent requests in, ``{"chain": N, "steps": K, "main": bool}`` each, K its requests of this
    attempt (after a Gemini CLI or Qwen Code resume, a new chain that ``steps`` does not
    count, the main chain being the first attempt's)."""

    run: str
    attempt: int
    agent: str
    agent_version: str | None
    exit_code: int
    agent_exit_code: int | None
    timed_out: bool
    interrupted: bool
    workspace: Path
    run_dir: Path
    stdout: Path
    stderr: Path
    gateway: str
    argv: list[str]
    session_id: str | None = None
    native_path: Path | None = None
    steps: int | None = None
    tool_calls_per_step: list[int] = field(default_factory=list)
    exchanges: int | None = None
    main_exchanges: int | None = None
    auxiliary_exchanges: int | None = None
    chains: int | None = None
    main_chain: int | None = None
    attempt_chains: list[int] = field(default_factory=list)
    attempt_steps: list[dict[str, Any]] = field(default_factory=list)
    steps_error: str | None = None
    stray_processes_killed: int = 0
    interrupt_signal: str | None = None
    stopped_after_end: bool = False
    snapshots: int = 0
    snapshot_warnings: list[str] = field(default_factory=list)
    intercept_proxy: str | None = None
    #: the agent's own account of how it ended (:meth:`AgentProfile.final_status`)
    agent_status: AgentStatus | None = None
    #: what the sandbox allowed (:meth:`~pvisor.session.sandbox.Sandbox.to_json`), or ``{"mode": "none"}``
    sandbox: dict[str, Any] = field(default_factory=no_sandbox)

    @property
    def failed_by_own_account(self) -> bool:
        """The agent exited 0 but says it failed: the run exits :data:`EXIT_AGENT_FAILED`."""
        return (
            self.agent_exit_code == 0
            and not (self.timed_out or self.interrupted)
            and self.agent_status is not None
            and self.agent_status.outcome is AgentOutcome.FAILED
        )

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (docs/cli.md)."""
        return {
            "run": self.run,
            "attempt": self.attempt,
            "agent": self.agent,
            "agent_version": self.agent_version,
            "exit_code": self.exit_code,
            "agent_exit_code": self.agent_exit_code,
            "agent_status": self.agent_status.to_json() if self.agent_status else None,
            "timed_out": self.timed_out,
            "interrupted": self.interrupted,
            "interrupt_signal": self.interrupt_signal,
            "stray_processes_killed": self.stray_processes_killed,
            "stopped_after_end": self.stopped_after_end,
            "steps": self.steps,
            "tool_calls_per_step": self.tool_calls_per_step,
            "exchanges": self.exchanges,
            "main_exchanges": self.main_exchanges,
            "auxiliary_exchanges": self.auxiliary_exchanges,
            "chains": self.chains,
            "main_chain": self.main_chain,
            "attempt_chains": self.attempt_chains,
            "attempt_steps": self.attempt_steps,
            "steps_error": self.steps_error,
            "snapshots": self.snapshots,
            "snapshot_warnings": self.snapshot_warnings,
            "session_id": self.session_id,
            "native_trajectory": str(self.native_path) if self.native_path else None,
            "workspace": str(self.workspace),
            "run_dir": str(self.run_dir),
            "stdout": str(self.stdout),
            "stderr": str(self.stderr),
            "gateway": self.gateway,
            "intercept_proxy": self.intercept_proxy,
            "argv": self.argv,
            "sandbox": self.sandbox,
        }


# --------------------------------------------------------------------------- checks
