"""Ways out of a journal (``pvisor journal export RUN --format F``), one module per format, each
documented field by field in docs/exports.md with the spec it follows:

- :mod:`.atif`: Harbor's Agent Trajectory Interchange Format v1.7 of a run's steps;
- :mod:`.otel`: OTLP JSON traces following the OpenTelemetry GenAI semantic conventions;
- :mod:`.har`: HTTP Archive 1.2 of a run's exchanges;
- :mod:`.rows`: one row per step for training pipelines, JSON Lines or Parquet.

Each writes to a binary stream and reads the journal through a :class:`JournalReader`; none
writes to the journal. The journal holds no secret, so no export can.
"""

from __future__ import annotations

import enum


class ExportFormat(str, enum.Enum):
    """The formats of ``pvisor journal export --format``."""

    JSONL = "jsonl"
    ATIF = "atif"
    OTEL = "otel"
    HAR = "har"
    ROWS = "rows"
    PARQUET = "parquet"

    @property
    def per_run(self) -> bool:
        """The format describes one run (RUN is required)."""
        return self in (ExportFormat.ATIF, ExportFormat.ROWS, ExportFormat.PARQUET)
