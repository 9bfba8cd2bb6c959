"""A native trajectory file's steps as the document ``pvisor trajectory show --json`` prints
(schema ``pvisor.native-trajectory/v1``, docs/native.md): the format ``json`` of
``pvisor trajectory export``, written by :func:`pvisor.adapters.native.render.write_json` one
step at a time."""

from __future__ import annotations

from typing import BinaryIO

from pvisor.adapters.exports.base import ExportFormat, NativeSource, Settings, Source, Written
from pvisor.adapters.native.render import NATIVE_SCHEMA, write_json


def write(source: NativeSource, out: BinaryIO, settings: Settings) -> Written:
    """Write the document of ``source`` to ``out``; counts the trajectory's steps."""
    write_json(source.result, source.adapter, out)
    return Written(len(source.result.trajectory.steps))


FORMAT = ExportFormat(
    name="json",
    describe={Source.NATIVE: NATIVE_SCHEMA},
    write=write,
    unit="steps",
    extension="json",
)
