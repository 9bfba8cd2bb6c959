"""What an attempt of ``pvisor run`` captured, read back once its gateway stopped: the run's
exchanges classified by the chain rule (:mod:`pvisor.adapters.chains`) into main-loop and
auxiliary ones, their roles stored, the workspace snapshots bound to steps and the steps
counted (:mod:`pvisor.adapters.journal_trajectory`), written into the attempt's
:class:`~pvisor.session.run_report.RunReport`; and what the start and end snapshots could not hold,
said once. A failure to derive the steps is a warning (``steps_error``), never a lost run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from pvisor.adapters.agents.base import AgentProfile
from pvisor.adapters.chains import classify_run
from pvisor.adapters.journal_trajectory import build_trajectory
from pvisor.adapters.native.assembly import text_of
from pvisor.core.errors import PvisorError
from pvisor.journal.reader import JournalReader
from pvisor.replay.snapshots import bind_steps
from pvisor.session.sandbox import failed_calls

if TYPE_CHECKING:  # a cycle otherwise: run.py imports this module to fill its report
    from pvisor.session.run_report import RunReport

#: ``warn(line)``: one warning line for the user
Warn = Callable[[str], None]


def attempt_steps(classification: Any, attempt: int) -> list[dict[str, Any]]:
    """Per chain of the agent's own loop that ``attempt`` sent requests in: its number, its
    requests (steps) from this attempt, and whether it is the run's main chain. A chain counts
    as the agent's loop when it is the main chain or starts with the main chain's system prompt
    and tools (a resume that regenerated its first context message); title and memory requests
    have other ones and are left out."""
    main = classification.main
    if main is None:
        return []
    out = []
    for chain in classification.chains:
        if chain is not main and (chain.first.system_key, chain.first.tools_key) != (
            main.first.system_key,
            main.first.tools_key,
        ):
            continue
        n = sum(1 for slot in chain.slots if slot.kept.exchange.attempt == attempt)
        if n:
            out.append({"chain": chain.number, "steps": n, "main": chain is main})
    return out


def snapshot_warnings(report: RunReport, start: Any, end: Any, warn: Warn) -> None:
    """Say once what the start and end snapshots could not hold (a file over the size limit):
    the user learns it now, not when restoring. A walk that failed is in the report too (the
    gateway's log said it on stderr when it happened)."""
    seen: list[str] = []
    shown = 0
    for snap in (start, end):
        if snap is None:
            continue
        for line in ([f"failed: {snap.error}"] if snap.error else []) + snap.warnings:
            if line in seen:
                continue
            seen.append(line)
            if line.startswith("failed: "):
                continue
            shown += 1
            if shown <= 5:
                warn(f"workspace snapshot: {line}")
    report.snapshot_warnings = seen
    if shown > 5:
        warn(f"workspace snapshot: {shown - 5} more (pvisor snapshot ls {report.run})")


def stopped_calls(report: RunReport, steps: list[Any]) -> list[dict[str, Any]]:
    """``sandbox.failed_calls`` of the attempt: the calls of its own steps (the last ones of the
    main chain, as many as :func:`attempt_steps` counts there) whose observation says the
    sandbox stopped them (:func:`~pvisor.session.sandbox.failed_calls`); empty without one."""
    mine = next((c["steps"] for c in report.attempt_steps if c["main"]), 0)
    own = steps[len(steps) - mine :] if mine else []
    if not own:
        return []
    return failed_calls(report.sandbox, [s.observation.results for s in own], text_of, first=own[0].n)


def derive_steps(report: RunReport, journal: Any, profile: AgentProfile, warn: Warn) -> None:
    """Classify the run's exchanges with the chain rule, store their roles and count the steps
    (the whole run: every attempt), and list the attempt's calls its sandbox stopped
    (:func:`stopped_calls`). A failure here is a warning: the capture itself is done."""
    try:
        with JournalReader(journal.path) as reader:
            classification = classify_run(reader, report.run, prefer=profile.chain_hint)
            trajectory = build_trajectory(reader, classification)
            attempts = {ex.id: ex.attempt for ex in reader.exchanges(report.run)}
            reader_snapshots = reader.snapshots(report.run)
    except PvisorError as exc:
        report.steps_error = exc.message
    except Exception as exc:  # a bug in deriving steps must not lose the agent's exit code
        report.steps_error = f"{type(exc).__name__}: {exc}"
    else:
        roles = classification.roles()
        journal.set_exchange_roles(report.run, roles)
        snapshots = reader_snapshots
        if snapshots:
            journal.bind_snapshots(report.run, bind_steps(snapshots, trajectory))
        report.snapshots = len(snapshots)
        report.steps = len(trajectory.steps)
        report.tool_calls_per_step = [len(s.action.tool_calls) for s in trajectory.steps]
        report.exchanges = len(roles)
        report.main_exchanges = sum(1 for _, role in roles.values() if role == "main")
        report.auxiliary_exchanges = sum(1 for _, role in roles.values() if role == "auxiliary")
        report.chains = len(classification.chains)
        report.main_chain = classification.main.number if classification.main is not None else None
        report.attempt_chains = sorted(
            {
                chain
                for ex_id, (chain, _) in roles.items()
                if chain is not None and attempts.get(ex_id) == report.attempt
            }
        )
        report.attempt_steps = attempt_steps(classification, report.attempt)
        report.sandbox = dict(report.sandbox, failed_calls=stopped_calls(report, trajectory.steps))
        return
    warn(f"run {report.run}: the steps could not be derived: {report.steps_error}")
