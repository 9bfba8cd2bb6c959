"""A journal's runs, attempts and exchanges with their bodies as JSON Lines (docs/exports.md
"jsonl"): :meth:`pvisor.journal.reader.JournalReader.export_jsonl` writes it, one object per
line; ``--no-bodies`` leaves the bodies out (their sha256 stay)."""

from __future__ import annotations

from typing import BinaryIO

from pvisor.adapters.exports.base import ExportFormat, JournalSource, Option, Settings, Source, Written


def write(source: JournalSource, out: BinaryIO, settings: Settings) -> Written:
    """Write run ``source.run_id`` (or every run) to ``out``; counts the lines. UsageError for an
    unknown run."""
    return Written(source.reader.export_jsonl(out, source.run_id, bodies=settings.bodies))


FORMAT = ExportFormat(
    name="jsonl",
    describe=dict.fromkeys((Source.RUN, Source.RUNS), "runs, attempts, exchanges with bodies"),
    write=write,
    unit="lines",
    extension="jsonl",
    reads=frozenset({Option.NO_BODIES}),
)
