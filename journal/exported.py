"""A journal export read back: the JSON Lines of ``pvisor journal export RUN --format jsonl``
(docs/exports.md "jsonl", written by :meth:`~pvisor.journal.reader.JournalReader.export_jsonl`)
loaded into a journal of its own, so that every reader of a journal reads it as it reads the
journal it came from.

:func:`is_export` tells such a file by its first line; :func:`loaded_export` builds the journal
in a private temporary directory (its schema by the migrations, each body an ``identity`` blob
checked against the sha256 its column names) and removes it on exit. An export holds runs,
attempts, exchanges and their bodies, never workspace snapshots.

This module imports nothing of pvisor's but the journal package (the journal package's rule).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import math
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from sqlite_utils import Database

from pvisor.core.errors import BadInputError, shown
from .exchange_end import OUTCOMES
from .exchange_end import CaptureMode
from .model import RUN_ID_PATTERN, RunMode, pack_timings
from .schema import apply_migrations

#: the columns of each table an export line carries (the reader's names where they differ)
_RUN = (
    "id", "agent", "agent_version", "argv", "created_ms", "parent_run", "boundary_step", "mode", "labels",
    "pause_transition", "workspace_snapshot",
)  # fmt: skip
_ATTEMPT = ("run_id", "n", "started_ms", "ended_ms", "exit_code", "labels")
_EXCHANGE = (
    "id", "run_id", "attempt", "seq", "protocol", "method", "path", "query", "request_headers",
    "secret_fingerprints", "request_encoding", "request_body", "request_bytes", "status",
    "response_headers", "response_body", "response_final", "streamed", "chunk_timings", "outcome",
    "error", "started_ms", "headers_us", "first_byte_us", "ended_us", "bytes_received",
    "bytes_delivered", "chain", "role", "served_by", "flags", "capture",
)  # fmt: skip
# forwarded_body is checked but not loaded: the export holds the agent's bytes, not the forwarded ones
_JSON = {"argv", "labels", "request_headers", "secret_fingerprints", "response_headers", "flags"}
#: the export's body fields, by the column that names their sha256
_BODIES = {"request": "request_body", "response": "response_body", "final": "response_final"}

#: the largest integer an SQLite INTEGER holds
_INT64 = 2**63 - 1
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ID = re.compile(RUN_ID_PATTERN)


class _Kind:
    """One field's type in an export line (docs/exports.md "jsonl", the columns of
    docs/journal.md): ``check(value)`` is True when ``value`` is one; ``said`` is what a
    message says was expected."""

    def __init__(self, said: str, check: Any) -> None:
        self.said = said
        self.check = check


def _int(low: int, value: Any) -> bool:
    return type(value) is int and low <= value <= _INT64


def _number(value: Any) -> bool:
    if type(value) is int:
        return 0 <= value <= _INT64
    return type(value) is float and math.isfinite(value) and value >= 0


def _pair(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and type(value[0]) is int
        and type(value[1]) is int
        and 0 <= value[0] < 2**64
        and 0 <= value[1] < 2**32
    )


def _body_field(value: Any) -> bool:
    if not isinstance(value, dict) or len(value) != 1:
        return False
    key, v = next(iter(value.items()))
    if key == "ref":
        return isinstance(v, str) and _SHA256.fullmatch(v) is not None
    return key in ("body", "body_b64") and isinstance(v, str)


_ID_KIND = _Kind(
    "an id of letters, digits, '.', '_' and '-' (at most 128, starting with a letter or digit)",
    lambda v: isinstance(v, str) and _ID.fullmatch(v) is not None,
)
_STR = _Kind("a string", lambda v: isinstance(v, str))
_SHA = _Kind("a sha256 (64 lower-case hex digits)", lambda v: isinstance(v, str) and _SHA256.fullmatch(v))
_COUNT = _Kind("an integer from 0", lambda v: _int(0, v))
_FROM_1 = _Kind("an integer from 1", lambda v: _int(1, v))
_INTEGER = _Kind("an integer", lambda v: type(v) is int and -_INT64 - 1 <= v <= _INT64)
_TIME = _Kind("a number from 0 (Unix epoch ms)", _number)
_STRINGS = _Kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_LABELS = _Kind(
    "an object of string values",
    lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
)
_BOOL = _Kind("true or false", lambda v: isinstance(v, bool))
_TIMINGS = _Kind(
    "a list of [µs, bytes] pairs of integers from 0",
    lambda v: isinstance(v, list) and all(_pair(x) for x in v),
)
_BODY = _Kind('a body object: {"body": text}, {"body_b64": base64} or {"ref": sha256}', _body_field)


def _one_of(values: Any) -> _Kind:
    names = [v.value if hasattr(v, "value") else v for v in values]
    return _Kind("one of " + ", ".join(names), lambda v: v in names)


#: per line type: field -> (kind, nullable, default when absent or null; _REQUIRED: must be given)
_REQUIRED = object()
_SCHEMA: dict[str, dict[str, tuple[_Kind, bool, Any]]] = {
    "run": {
        "id": (_ID_KIND, False, _REQUIRED),
        "agent": (_STR, True, None),
        "agent_version": (_STR, True, None),
        "argv": (_STRINGS, False, []),
        "created_ms": (_TIME, False, _REQUIRED),
        "parent_run": (_ID_KIND, True, None),
        "boundary_step": (_COUNT, True, None),
        "mode": (_one_of(RunMode), False, _REQUIRED),
        "labels": (_LABELS, False, {}),
        "pause_transition": (_COUNT, True, None),
        "workspace_snapshot": (_SHA, True, None),
    },
    "attempt": {
        "run": (_ID_KIND, False, _REQUIRED),
        "n": (_FROM_1, False, _REQUIRED),
        "started_ms": (_TIME, False, _REQUIRED),
        "ended_ms": (_TIME, True, None),
        "exit_code": (_INTEGER, True, None),
        "labels": (_LABELS, False, {}),
    },
    "exchange": {
        "id": (_ID_KIND, False, _REQUIRED),
        "run": (_ID_KIND, False, _REQUIRED),
        "attempt": (_FROM_1, False, 1),
        "seq": (_COUNT, False, _REQUIRED),
        "protocol": (_STR, True, None),
        "method": (_STR, False, _REQUIRED),
        "path": (_STR, False, _REQUIRED),
        "query": (_STR, False, ""),
        "request_headers": (_LABELS, False, {}),
        "secret_fingerprints": (_LABELS, False, {}),
        "request_encoding": (_STR, True, None),
        "request_body": (_SHA, True, None),
        "request_bytes": (_COUNT, False, 0),
        "status": (_INTEGER, True, None),
        "response_headers": (_LABELS, False, {}),
        "response_body": (_SHA, True, None),
        "response_final": (_SHA, True, None),
        "streamed": (_BOOL, False, False),
        "chunk_timings": (_TIMINGS, False, []),
        "outcome": (_one_of((*OUTCOMES, "in_flight")), True, None),
        "error": (_STR, True, None),
        "started_ms": (_TIME, False, _REQUIRED),
        "headers_us": (_COUNT, True, None),
        "first_byte_us": (_COUNT, True, None),
        "ended_us": (_COUNT, True, None),
        "bytes_received": (_COUNT, False, 0),
        "bytes_delivered": (_COUNT, False, 0),
        "chain": (_COUNT, True, None),
        "role": (_one_of(("main", "auxiliary")), True, None),
        "served_by": (_STR, True, None),
        "flags": (_STRINGS, False, []),
        "forwarded_body": (_SHA, True, None),
        "capture": (_one_of(CaptureMode), False, CaptureMode.REVERSE.value),
        "request": (_BODY, True, None),
        "response": (_BODY, True, None),
        "final": (_BODY, True, None),
    },
}


def _checked(line: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    """The fields of an export line of type ``kind`` (:data:`_SCHEMA`), defaults filled in;
    BadInputError naming ``where`` (the file and line), the field and what was expected for
    the first field that is missing or of another type. Fields the schema does not know are
    left out (a newer pvisor's)."""
    out: dict[str, Any] = {}
    for name, (want, nullable, default) in _SCHEMA[kind].items():
        value = line.get(name)
        if value is None:
            if default is _REQUIRED:
                got = "null" if name in line else "missing"
                raise BadInputError(f"{where}: {kind} field {name!r} is {got}: expected {want.said}")
            if not nullable or default is not None:
                value = default
            out[name] = value
            continue
        if not want.check(value):
            raise BadInputError(
                f"{where}: {kind} field {name!r}: expected {want.said}"
                f"{', or null' if nullable else ''}, not {shown(orjson.dumps(value).decode(), 60)}"
            )
        out[name] = value
    return out


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether the regular file at ``path`` starts with an export's first line: a JSON object
    whose ``type`` is ``run``, with an ``id`` and a ``mode``. A first line over 1 MiB is read
    whole only when it starts as an export's does (``{"type": "run"``): a run's labels can be
    long, a native file's first line longer still."""
    try:
        with open(path, "rb") as f:
            first = f.readline(_FIRST_LINE)
            if len(first) == _FIRST_LINE and not first.endswith(b"\n") and _RUN_START.match(first):
                first += f.readline()
    except OSError:
        return False
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("type") == "run" and "id" in obj and "mode" in obj


#: how much of a file :func:`is_export` reads before it knows whether it starts as an export
_FIRST_LINE = 1 << 20
_RUN_START = re.compile(rb'\s*\{\s*"type"\s*:\s*"run"\s*[,}]')


def _body(line: dict[str, Any], key: str, seen: dict[str, bytes], where: str) -> tuple[str, bytes] | None:
    """(sha256, bytes) of the body ``key`` of an exchange line (checked by :func:`_checked`), or
    None when it has none."""
    sha = line[_BODIES[key]]
    field = line[key]
    if sha is None:
        if field is not None:
            raise BadInputError(
                f"{where}: exchange field {key!r} is a body, but {_BODIES[key]!r} (its sha256) is null"
            )
        return None
    if field is None:
        raise BadInputError(
            f"{where}: exchange {line['id']} has no {key} body (an export made with --no-bodies holds "
            "no requests to read steps from: export it again without --no-bodies)"
        )
    if "ref" in field:
        if field["ref"] not in seen:
            raise BadInputError(
                f"{where}: exchange field {key!r} refers to a body not written before ({field['ref'][:12]})"
            )
        if field["ref"] != sha:
            raise BadInputError(
                f"{where}: exchange field {key!r} refers to body {field['ref'][:12]}, not to "
                f"{_BODIES[key]!r} {sha[:12]}"
            )
        return sha, seen[field["ref"]]
    try:
        data = (
            field["body"].encode("utf-8", "surrogatepass")
            if "body" in field
            else base64.b64decode(field["body_b64"], validate=True)
        )
    except ValueError:
        raise BadInputError(f"{where}: exchange field {key!r}: body_b64 is not base64") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise BadInputError(
            f"{where}: exchange field {key!r}: the body does not match {_BODIES[key]!r} {sha[:12]}"
        )
    seen[sha] = data
    return sha, data


def _row(line: dict[str, Any], columns: tuple[str, ...], renames: dict[str, str]) -> list[Any]:
    out = []
    for col in columns:
        value = line.get(renames.get(col, col))
        if col == "chunk_timings":
            value = pack_timings(value)
        elif col in _JSON:
            value = orjson.dumps(value).decode()
        elif col == "streamed":
            value = int(value)
        out.append(value)
    return out


def _load(path: Path, into: Path) -> str:
    """Write the export at ``path`` into a new journal file ``into``; return its one run's id."""
    db = Database(str(into))
    apply_migrations(db)
    db.close()
    conn = sqlite3.connect(into, isolation_level=None)
    runs: list[str] = []
    seen: dict[str, bytes] = {}
    try:
        conn.execute("BEGIN")
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                where = f"{path} line {n}"
                if not raw.strip():
                    continue
                try:
                    line = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise BadInputError(f"{where}: not JSON ({exc})") from None
                kind = line.get("type") if isinstance(line, dict) else None
                if kind not in _SCHEMA:
                    raise BadInputError(
                        f"{where}: field 'type' is {shown(repr(kind), 40)}: expected run, attempt or exchange"
                    )
                line = _checked(line, kind, where)
                if kind != "run":
                    if not runs:
                        raise BadInputError(f"{where}: an {kind} line before the run line it belongs to")
                    if line["run"] != runs[-1]:
                        raise BadInputError(
                            f"{where}: {kind} field 'run' is {line['run']!r}: expected {runs[-1]!r}, the run "
                            "of the run line before it"
                        )
                try:
                    _insert(conn, kind, line, seen, where)
                except sqlite3.IntegrityError:
                    what = (
                        f"attempt {line['n']} of run {line['run']}"
                        if kind == "attempt"
                        else f"{kind} {line['id']}"
                    )
                    raise BadInputError(f"{where}: {what} is in the export already") from None
                if kind == "run":
                    runs.append(line["id"])
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise BadInputError(f"{path}: not an export pvisor can read back ({exc})") from None
    finally:
        conn.close()
    if len(runs) != 1:
        raise BadInputError(
            f"{path}: an export of {len(runs)} runs ({', '.join(map(str, runs[:3]))}"
            f"{', ...' if len(runs) > 3 else ''}); give the export of one run: pvisor journal export RUN "
            "--format jsonl"
        )
    return str(runs[0])


def _insert(
    conn: sqlite3.Connection, kind: str, line: dict[str, Any], seen: dict[str, bytes], where: str
) -> None:
    """Insert one checked export line (and an exchange's bodies, as blobs)."""
    if kind == "run":
        columns, renames = _RUN, {}
        table = "runs"
    elif kind == "attempt":
        columns, renames, table = _ATTEMPT, {"run_id": "run"}, "attempts"
    else:
        for key in _BODIES:
            found = _body(line, key, seen, where)
            if found is not None:
                conn.execute(
                    "INSERT OR IGNORE INTO blobs(sha256, size, codec, base, data) "
                    "VALUES (?, ?, 'identity', NULL, ?)",
                    (found[0], len(found[1]), found[1]),
                )
        columns, renames, table = _EXCHANGE, {"run_id": "run"}, "exchanges"
    conn.execute(
        f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        _row(line, columns, renames),
    )


@contextlib.contextmanager
def loaded_export(path: str | os.PathLike[str]) -> Iterator[tuple[Path, str]]:
    """(the journal file holding the export at ``path``, its run's id), for the ``with`` block;
    the journal's private directory is removed after it. Raises BadInputError naming the file
    and line for a line that is not an export's (not JSON, an unknown type, a body that is
    missing, refers to nothing or does not match its sha256), an export of several runs or none."""
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-export-"))
    try:
        journal = tmp / "journal.sqlite"
        run = _load(Path(path), journal)
        yield journal, run
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
