"""Batch preparation on Ray (verl and SkyRL run on it): :func:`prepare_dataset` maps a Ray
Dataset of requests to a Dataset of rows, and ``pvisor replay --prepare-only --batch MANIFEST
--rows FILE --ray ADDRESS`` runs a manifest that way (docs/result-protocol.md "On Ray").
Needs the extra ``pvisor-replay[ray]`` (``ray[data,client]``).

A request row has the keys of a manifest line (:data:`~.batch.MANIFEST_KEYS`; a missing or
null one is absent), paths absolute or relative to ``base``, and optionally ``line`` (its
number, else its position in its batch is not meaningful: give ``line`` to tell rows apart).
Each output row is the row of ``--rows`` (:func:`pvisor.commands.batch.row`), with ``prefix``,
``request`` and ``result`` as JSON text and ``error`` split into ``error_code`` and
``error_message``. Each Ray worker is one :class:`Preparer` actor that keeps one
:class:`~.batch.SourceReads` for all the batches it is given, so a trajectory named by many
requests is read once per worker, and a journal run read and classified once per worker
(:mod:`.journal_runs`; its journal stays open for the actor's life).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


from pvisor.core.errors import PvisorError

from .batch import TEXT_COLUMNS, SourceReads, prepare_many, request_from, text_row

#: the columns of a prepared row, in order
COLUMNS = TEXT_COLUMNS


class Preparer:
    """The ``map_batches`` callable: a batch of request rows (pyarrow or a dict of columns) to
    a dict of output columns. ``base``: the directory relative paths are read from."""

    #: set on the subclass :func:`prepare_dataset` makes (no constructor arguments: Ray would
    #: keep them in its object store for the actors' restarts)
    base: str | None = None
    journal: str | None = None
    row_label: str = "ray"

    def __init__(self) -> None:
        self.reads = SourceReads()

    def __call__(self, batch: Any) -> dict[str, list]:
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else _rows_of_columns(batch)
        requests: list[tuple[int, Any]] = []
        names: dict[int, str | None] = {}
        # request_from takes relative paths from the manifest's directory: here, base's
        manifest = Path(self.base) / "manifest" if self.base is not None else None
        journal = Path(self.journal) if self.journal is not None else None
        for i, raw in enumerate(rows, 1):
            obj = {k: v for k, v in raw.items() if v is not None and k != "line"}
            n = int(raw.get("line") or i)
            names[n] = obj.get("name")
            try:
                requests.append((n, request_from(obj, n, manifest=manifest, journal=journal)))
            except PvisorError as exc:  # a bad row is its own failed row, as a bad manifest line
                requests.append((n, exc))
        out: dict[str, list] = {c: [] for c in COLUMNS}
        for o in prepare_many(requests, reads=self.reads, row_label=self.row_label):
            o.name = names.get(o.index)
            row = text_row(o)
            for c in COLUMNS:
                out[c].append(row[c])
        return out


def _rows_of_columns(batch: dict[str, Any]) -> list[dict[str, Any]]:
    keys = list(batch)
    n = len(batch[keys[0]]) if keys else 0
    return [{k: _plain(batch[k][i]) for k in keys} for i in range(n)]


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def prepare_dataset(
    ds: Any,
    *,
    base: str | Path | None = None,
    journal: str | Path | None = None,
    batch_size: int = 256,
    concurrency: int = 2,
    row_label: str = "ray",
) -> Any:
    """The Ray Dataset of prepared rows (module docstring) of ``ds``, a Dataset of request
    rows: ``ds.map_batches`` with :class:`Preparer` actors (``concurrency`` of them, each
    preparing ``batch_size`` requests at a time and reusing its parsed sources). Lazy, as
    Ray Data is: nothing runs until the result is consumed (``write_parquet``, ``iter_rows``,
    ``take_all``). ``row_label``: what each result names as its prefix's place
    (``LABEL#LINE/prefix``)."""
    import ray.data  # an optional extra (pvisor-replay[ray]), not installed by default

    settings = {
        "base": str(base) if base is not None else None,
        "journal": str(journal) if journal is not None else None,
        "row_label": row_label,
    }
    return ds.map_batches(
        type("Preparer", (Preparer,), settings),
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=concurrency),
    )


__all__ = ["COLUMNS", "Preparer", "prepare_dataset"]
