"""The rows of a native trajectory file (``pvisor trajectory export FILE --format rows|parquet``),
and the two formats' declarations, which take a journal run and a native file.

A native file stores no request: the prompt of row k is the prefix prepare-only renders for
``--after-step k-1`` (:func:`pvisor.replay.prefix.native_conversation` in the agent's protocol,
the descriptor's wire forms, the compaction in effect), read into the rows' Chat messages by
:func:`pvisor.adapters.exports.chat_rows.chat_prompt`; the completion is action k. The tools are
the file's when it stores them, else those of ``--profile-from JOURNAL[:RUN]`` (a capture of the
same agent, :func:`pvisor.replay.profile.load_profile`), else none and ``tools_absent`` true.

A native row has the journal row's columns (docs/exports.md "rows and parquet"): ``run``,
``exchange``, ``lineage``, ``prefix``, ``agent_prefix`` and the prefix digests are null (there is
no journal run nor request bytes); ``action``, ``observation`` and ``flags`` are the steps
document's (``pvisor.steps/v1``), as for a journal run.

In the replay layer, not beside the journal rows (:mod:`pvisor.adapters.exports.rows`): the
render and the profile are the replay layer's.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import orjson

from pvisor.adapters.exports.base import (
    ExportFormat,
    Extra,
    JournalSource,
    NativeSource,
    Option,
    Settings,
    Source,
    Written,
)
from pvisor.adapters.exports.chat_rows import GAP_FLAGS, Segmenter, trainer_columns
from pvisor.adapters.exports.rows import (
    iter_rows,
    need_pyarrow,
    parquet_row,
    parquet_schema,
    write_parquet_rows,
)
from pvisor.adapters.journal_trajectory import trajectory_to_json

from pvisor.adapters.native import get_adapter
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.adapters.protocols.convert import plain_action
from pvisor.journal.model import ToolCall, Trajectory
from pvisor.adapters.exports.shared import shared

from .prefix import native_conversation
from .source import choose_protocol, descriptor


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _step_docs(traj: Trajectory, steps: list[Any]) -> list[dict[str, Any]]:
    """The steps document's action, observation and flags of each step (no exchange: a file's)."""
    details = [{"exchange": None, "seq": None, "attempt": None, "retries": 0} for _ in steps]
    return trajectory_to_json(Trajectory(steps=steps, meta={"steps": details}))["steps"]


def _wire_call_ids(d: Any, protocol: str, action: Any) -> list[str | None]:
    """The ids of the action's calls as the agent sends them back in its next request (the
    descriptor's wire form of the action, as the prompt renders it)."""
    msg = d.wire_action(protocol, action if protocol == d.native_raw_protocol else plain_action(action))
    return [p.id for p in msg.parts if isinstance(p, ToolCall)]


def iter_native_rows(
    result: Any, agent: str, profile_spec: str | None = None, version: str | None = None
) -> Iterator[dict[str, Any]]:
    """The rows of a native file read by its adapter (``result``: a NativeResult; ``agent``: the
    descriptor's name), one per main-loop step (module docstring). ``profile_spec``:
    ``--profile-from``. Raises what :func:`load_profile` raises for a wrong profile (UsageError
    exit 2 for a missing journal or run, ReplayUsageError ``agent_mismatch``, ReplayBadInput
    ``profile_unusable`` exit 65) here, before a row is made: a writer has written nothing yet."""
    traj = result.trajectory
    provider = traj.meta.get("provider")
    proto = choose_protocol(agent, None, traj.model, provider if isinstance(provider, str) else None)
    profile = None
    if profile_spec is not None:
        from .profile import load_profile  # only a --profile-from reads a capture

        profile, _notes = load_profile(profile_spec, agent, version)
    return _rows(traj, agent, proto, profile, get_adapter(result.profile.adapter).normalised_usage)


def _rows(
    traj: Trajectory, agent: str, proto: str, profile: Any, normalise_usage: Callable[[Any], TokenUsage]
) -> Iterator[dict[str, Any]]:
    steps = list(traj.steps)
    docs = _step_docs(traj, steps)
    d = descriptor(agent)
    segments = Segmenter()
    context = list(traj.meta.get("task_context") or [])
    for k, (step, doc) in enumerate(zip(steps, docs), start=1):
        compaction = traj.compaction_at(k - 1)
        conv = None
        tools_absent = True
        if compaction is None or compaction.rebuilt:  # else the file does not hold what was sent
            conv, origin = native_conversation(
                agent, proto, traj.task, context, traj.system, traj.tools, traj.model, steps, k - 1,
                profile, None, compaction,
            )  # fmt: skip
            tools_absent = origin.get("tools") == "absent"
        trainer = trainer_columns(
            conv,
            step.action,
            proto,
            segments,
            compacted=compaction is not None and compaction.after_step == k - 1,
            tools_absent=tools_absent,
            gap=not GAP_FLAGS.isdisjoint(doc["flags"]),
            call_ids=_wire_call_ids(d, proto, step.action),
            normalise_usage=normalise_usage,
        )
        yield {
            "run": None,
            "step": step.n,
            "agent": agent,
            "protocol": proto,
            "model": step.action.model or traj.model,
            "exchange": None,
            "lineage": None,
            "prefix": None,
            "agent_prefix": None,
            **trainer,
            "action": doc["action"],
            "observation": doc["observation"],
            "flags": doc["flags"],
            "digests": {
                "prefix_sha256": None,
                "agent_prefix_sha256": None,
                "action_sha256": _digest(doc["action"]),
                "observation_sha256": _digest(doc["observation"]),
            },
        }


def _version(result: Any) -> str | None:
    from .source import native_version

    return native_version(result.trajectory.meta)


def warn(message: str) -> None:
    """One ``pvisor: warning:`` line on stderr (what an export writer found in the rows)."""
    sys.stderr.write(f"pvisor: warning: {' '.join(message.split())}\n")


class _Unoffered:
    """Passes rows through, gathering their ``tools_unoffered`` names for one warning."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def through(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for row in rows:
            self.names.update(dict.fromkeys(row["tools_unoffered"]))
            yield row

    def warn(self) -> None:
        if self.names:
            warn(
                f"completions call tools that the rows' tools do not offer: {', '.join(self.names)} "
                "(column tools_unoffered; a --profile-from capture of another agent version offers "
                "other tools)"
            )


def _rows_of(source: JournalSource | NativeSource, settings: Settings) -> Iterator[dict[str, Any]]:
    if isinstance(source, NativeSource):
        return iter_native_rows(source.result, source.adapter, settings.profile_from, _version(source.result))
    return iter_rows(source.reader, source.run_id, bodies=settings.bodies, warn=warn)


def write_rows(source: JournalSource | NativeSource, out: BinaryIO, settings: Settings) -> Written:
    """JSON Lines rows of a journal run (:func:`pvisor.adapters.exports.rows.iter_rows`) or of
    a native file (:func:`iter_native_rows`); counts the rows. One warning on stderr names the
    tools the completions call that the rows' tools do not offer."""
    unoffered = _Unoffered()
    n = 0
    for row in unoffered.through(_rows_of(source, settings)):
        out.write(orjson.dumps(shared(row)) + b"\n")  # docs/exports.md "Secrets"
        n += 1
    unoffered.warn()
    return Written(n)


def write_rows_parquet(source: JournalSource | NativeSource, out: BinaryIO, settings: Settings) -> Written:
    """The same rows as Parquet; UsageError (exit 2) naming the extra without pyarrow. The same
    warning as :func:`write_rows`."""
    need_pyarrow()
    unoffered = _Unoffered()
    rows = unoffered.through(_rows_of(source, settings))
    n = write_parquet_rows(out, parquet_schema(), (parquet_row(shared(r)) for r in rows))
    unoffered.warn()
    return Written(n)


ROWS = ExportFormat(
    name="rows",
    describe={
        Source.RUN: "one JSON row per step of RUN",
        Source.NATIVE: "one JSON row per main-loop step (training rows)",
    },
    write=write_rows,
    unit="rows",
    extension="jsonl",
    reads=frozenset({Option.NO_BODIES, Option.PROFILE_FROM}),
)
PARQUET = ExportFormat(
    name="parquet",
    describe={Source.RUN: "the same rows as Parquet (pyarrow)", Source.NATIVE: "the same rows as Parquet"},
    write=write_rows_parquet,
    unit="rows",
    extension="parquet",
    reads=frozenset({Option.NO_BODIES, Option.PROFILE_FROM}),
    binary=True,
    extra=Extra(name="parquet", module="pyarrow"),
)
