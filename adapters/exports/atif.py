"""A journal run as Harbor ATIF v1.7 (docs/exports.md "atif"): the run's steps by the chain rule
(pvisor journal steps), its system prompt the first request's (:func:`leading_system` where the
request sends none apart: Codex's ``developer`` messages), written as
:func:`pvisor.adapters.native.render.atif_fields` writes a native file's, with the run and its
lineage (a handoff's child: the pause's transition and snapshot, the from and to agents) in the
root ``extra``. A live step of a continuation whose request
went upstream rewritten shows what the live model got: the boundary user prompt as a user step
before it, its flags, and ``extra.forwarded`` (the digests of the forwarded bytes and of the
agent's own, which the journal keeps: ``pvisor journal body EXCHANGE --request``).

The format ``atif`` (:data:`FORMAT`) writes this for a journal run and
:func:`pvisor.adapters.native.render.write_atif`'s document for a native file."""

from __future__ import annotations

from typing import BinaryIO, Sequence

from pvisor.adapters.exports.base import (
    ExportFormat,
    JournalSource,
    NativeSource,
    Settings,
    Source,
    Written,
    agent_name,
)
from pvisor.adapters.exports.chat_rows import chat_prompt
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.native import render
from pvisor.adapters.native.render import atif_fields, iso_time, write_document
from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.core import progress
from pvisor.core.errors import PvisorError
from pvisor.journal.model import LINEAGE_KEYS, Exchange, run_lineage
from pvisor.journal.reader import JournalReader


def write_atif(reader: JournalReader, run_id: str, out: BinaryIO) -> int:
    """Write the ATIF document of run ``run_id`` to ``out``; returns the number of ATIF steps
    (``final_metrics.total_steps``: the system, task and user steps beside the agent steps).
    ``session_id`` is the agent's session id when it was recorded, else the run id; the agent's
    version is the run's. Raises UsageError for an unknown run, BadInputError (exit 65) for a run
    with no main-loop exchange (ATIF needs a step), before a byte is written."""
    run = reader.run(run_id)
    traj = trajectory_from_journal(reader, run.id, wire_ids=True)
    traj.meta = {
        **traj.meta,
        "session": run.labels.get("session_id") or run.id,
        "agent_version": run.agent_version,
    }

    def extra() -> dict:
        return {
            "pvisor_run": run.id,
            "mode": getattr(run.mode, "value", run.mode),
            "parent_run": run.parent_run,
            "boundary_step": run.boundary_step,
            # a handoff's child: the pause's transition and snapshot, the agents (else null)
            **dict.fromkeys(LINEAGE_KEYS[3:]),
            **(run_lineage(run) or {}),
            "protocol": traj.meta.get("protocol"),
            "left_out": len(traj.left_out),
        }

    details = traj.meta.get("steps", ())
    protocol = traj.meta.get("protocol")
    if traj.system is None and details and protocol in PROTOCOL_MODULES:
        traj.system = leading_system(reader, reader.exchange(details[0]["exchange"]), protocol)
    usage_of = get_protocol(protocol).normalised_usage if protocol in PROTOCOL_MODULES else _no_usage
    count = [0]
    with progress.task("writing steps", len(traj.steps)):
        write_document(
            out,
            atif_fields(
                traj,
                agent_name(run),
                extra,
                f"run {run.id}",
                usage_of,
                step_times(reader, run.id, details),
                details,
                protocol if protocol in PROTOCOL_MODULES else None,
                count,
            ),
        )
    return count[0]


def leading_system(reader: JournalReader, ex: Exchange, protocol: str) -> str | None:
    """The system prompt of a request that sends none apart (``ex``: the first main-loop
    exchange): the texts of the ``system`` messages its prompt starts with, as the rows read it
    (:func:`~pvisor.adapters.exports.chat_rows.chat_prompt`: a ``developer`` message is
    ``system``), joined with a blank line; None when it starts otherwise. Codex 0.171 sends no
    Responses ``instructions``: its base prompt is the ``developer`` messages at the start of
    ``input``, where ``pvisor trajectory export`` of its rollout file finds it as the system
    prompt too."""
    body = reader.request_body(ex)
    if not body:
        return None
    try:
        conv = get_protocol(protocol).parse_request(body, path=ex.path, query=ex.query)
    except PvisorError:  # the chain rule read it; a body that no longer parses gives none
        return None
    texts = []
    for m in chat_prompt(conv)[0]:
        if m["role"] != "system":
            break
        if m["content"]:
            texts.append(m["content"])
    return "\n\n".join(texts) if texts else None


def _no_usage(usage: object) -> TokenUsage:
    return TokenUsage()


def step_times(reader: JournalReader, run_id: str, details: Sequence[dict]) -> list[str]:
    """Each step's ATIF ``timestamp``: when the gateway received the request of the step's kept
    exchange (``Exchange.started_ms``, its ``details`` entry's ``exchange``), ISO 8601 UTC. The
    request is when the model was asked for the step's reply: its time orders the steps as the
    run went, and a user step of an observation takes the time of the request that carried it
    (the next step's)."""
    started = {ex.id: ex.started_ms for ex in reader.exchanges(run_id)}
    return [iso_time(started[d["exchange"]]) for d in details]


def write(source: JournalSource | NativeSource, out: BinaryIO, settings: Settings) -> Written:
    """The ATIF of a journal run (:func:`write_atif`) or of a native file
    (:func:`pvisor.adapters.native.render.write_atif`); counts the ATIF steps the document
    holds (``final_metrics.total_steps``), not the trajectory's agent steps alone."""
    if isinstance(source, NativeSource):
        return Written(render.write_atif(source.result, source.adapter, out))
    return Written(write_atif(source.reader, source.run_id, out))


FORMAT = ExportFormat(
    name="atif",
    describe={Source.RUN: "ATIF v1.7 of RUN's steps", Source.NATIVE: "Harbor ATIF v1.7"},
    write=write,
    unit="steps",
    extension="atif.json",
)
