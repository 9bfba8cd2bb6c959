"""Ways out of a journal or a native trajectory file: the registry of export formats.

One module per format, each declaring its :class:`~.base.ExportFormat` (what it takes, the
options it reads, what it writes, the extra it needs, its writer; :mod:`.base` says how), each
documented field by field in docs/exports.md (the report in docs/report.md) with the spec it
follows:

- :mod:`.jsonl`: runs, attempts and exchanges with their bodies, JSON Lines;
- :mod:`.atif`: Harbor's Agent Trajectory Interchange Format v1.7 of a run's steps or of a
  native file's;
- :mod:`.otel`: OTLP JSON traces following the OpenTelemetry GenAI semantic conventions;
- :mod:`.har`: HTTP Archive 1.2 of a run's exchanges;
- :mod:`.rows`: one row per step for training pipelines, JSON Lines (``rows``) or Parquet
  (``parquet``), its trainer's columns by :mod:`.chat_rows`; the two formats are declared in
  :mod:`pvisor.replay.native_rows`, since a native file's rows are rendered by the replay layer;
- :mod:`.native_json`: a native file's trajectory as ``pvisor.native-trajectory/v1``;
- :mod:`.report`: a run as one self-contained HTML page (``pvisor report``).

:data:`FORMATS` is the registry table: a new format is one module and one line there. The
commands look a format up by name (:func:`get_format`) and offer the formats of a source
(:func:`formats`): they never branch on a format's name. A format module is imported when it is
looked up, so a command that writes one format loads that one. :func:`register` adds a format
at run time (another package's, or a test's).

Each writer reads the journal through a :class:`JournalReader` (or a native file's adapter
result); none writes to the journal. The journal holds no secret, so no export can.
"""

from __future__ import annotations

import importlib

from pvisor.adapters.exports.base import ExportFormat, Output, Source

#: format name -> "module:attribute" of its ExportFormat, in the order ``--format`` lists them
FORMATS: dict[str, str] = {
    "jsonl": "pvisor.adapters.exports.jsonl:FORMAT",
    "atif": "pvisor.adapters.exports.atif:FORMAT",
    "otel": "pvisor.adapters.exports.otel:FORMAT",
    "har": "pvisor.adapters.exports.har:FORMAT",
    "rows": "pvisor.replay.native_rows:ROWS",
    "parquet": "pvisor.replay.native_rows:PARQUET",
    "json": "pvisor.adapters.exports.native_json:FORMAT",
    "report": "pvisor.adapters.exports.report:FORMAT",
}

#: formats added by :func:`register`, by name (after the table's in listings)
_registered: dict[str, ExportFormat] = {}


def format_names() -> list[str]:
    """Every registered format's name: the table's in its order, then those registered."""
    return [*FORMATS, *(n for n in _registered if n not in FORMATS)]


def get_format(name: str) -> ExportFormat:
    """The format called ``name``, its module imported. KeyError when none is registered
    under that name; LookupError when the module's declaration is of another name."""
    if name in _registered:
        return _registered[name]
    module, _, attribute = FORMATS[name].partition(":")
    fmt = getattr(importlib.import_module(module), attribute)
    if fmt.name != name:
        raise LookupError(f"{FORMATS[name]} declares format {fmt.name!r}, registered as {name!r}")
    return fmt


def find_format(name: str) -> ExportFormat | None:
    """:func:`get_format`, or None when no format is called ``name``."""
    return get_format(name) if name in _registered or name in FORMATS else None


def formats(source: Source | None = None, output: Output | None = None) -> list[ExportFormat]:
    """The registered formats (in :func:`format_names`' order) that take ``source`` and write
    ``output`` (either None: any). Imports every format module."""
    found = [get_format(n) for n in format_names()]
    return [
        f for f in found if (source is None or source in f.accepts) and (output is None or f.output is output)
    ]


def register(fmt: ExportFormat) -> None:
    """Offer ``fmt`` beside the table's formats (it replaces one of the same name)."""
    _registered[fmt.name] = fmt


def unregister(name: str) -> None:
    """Take back a format :func:`register` added (nothing when there is none)."""
    _registered.pop(name, None)


__all__ = ["FORMATS", "find_format", "format_names", "formats", "get_format", "register", "unregister"]
