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
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from .errors import BadInputError
from .model import pack_timings

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
_JSON = {"argv", "labels", "request_headers", "secret_fingerprints", "response_headers", "flags"}
#: the export's body fields, by the column that names their sha256
_BODIES = {"request": "request_body", "response": "response_body", "final": "response_final"}


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether the regular file at ``path`` starts with an export's first line: a JSON object
    whose ``type`` is ``run``. Reads at most that line (1 MiB)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
    except OSError:
        return False
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("type") == "run" and "id" in obj and "mode" in obj


def _body(line: dict[str, Any], key: str, seen: dict[str, bytes], where: str) -> tuple[str, bytes] | None:
    """(sha256, bytes) of the body ``key`` of an exchange line, or None when it has none."""
    sha = line.get(_BODIES[key])
    field = line.get(key)
    if sha is None:
        return None
    if field is None:
        raise BadInputError(
            f"{where}: exchange {line.get('id')} has no {key} body (an export made with --no-bodies holds "
            "no requests to read steps from: export it again without --no-bodies)"
        )
    if not isinstance(field, dict):
        raise BadInputError(f"{where}: exchange {line.get('id')}: {key} is not a body object")
    if "ref" in field:
        if field["ref"] not in seen:
            raise BadInputError(
                f"{where}: exchange {line.get('id')}: {key} refers to a body not written before"
            )
        return sha, seen[field["ref"]]
    try:
        data = (
            field["body"].encode("utf-8", "surrogatepass")
            if "body" in field
            else base64.b64decode(field["body_b64"], validate=True)
        )
    except (KeyError, AttributeError, ValueError, TypeError):
        raise BadInputError(f"{where}: exchange {line.get('id')}: {key} is not a body object") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise BadInputError(
            f"{where}: exchange {line.get('id')}: the {key} body does not match its sha256 {sha[:12]}"
        )
    seen[sha] = data
    return sha, data


def _row(line: dict[str, Any], columns: tuple[str, ...], renames: dict[str, str]) -> list[Any]:
    out = []
    for col in columns:
        value = line.get(renames.get(col, col))
        if col == "chunk_timings":
            value = pack_timings(value or [])
        elif col in _JSON:
            value = orjson.dumps(
                value if value is not None else ([] if col in ("argv", "flags") else {})
            ).decode()
        elif col == "streamed":
            value = int(bool(value))
        out.append(value)
    return out


def _load(path: Path, into: Path) -> str:
    """Write the export at ``path`` into a new journal file ``into``; return its one run's id."""
    from sqlite_utils import Database

    from .schema import apply_migrations

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
                if kind == "run":
                    runs.append(line.get("id"))
                    conn.execute(
                        f"INSERT INTO runs({', '.join(_RUN)}) VALUES ({', '.join('?' * len(_RUN))})",
                        _row(line, _RUN, {}),
                    )
                elif kind == "attempt":
                    conn.execute(
                        f"INSERT INTO attempts({', '.join(_ATTEMPT)}) "
                        f"VALUES ({', '.join('?' * len(_ATTEMPT))})",
                        _row(line, _ATTEMPT, {"run_id": "run"}),
                    )
                elif kind == "exchange":
                    for key in _BODIES:
                        found = _body(line, key, seen, where)
                        if found is not None:
                            conn.execute(
                                "INSERT OR IGNORE INTO blobs(sha256, size, codec, base, data) "
                                "VALUES (?, ?, 'identity', NULL, ?)",
                                (found[0], len(found[1]), found[1]),
                            )
                    conn.execute(
                        f"INSERT INTO exchanges({', '.join(_EXCHANGE)}) "
                        f"VALUES ({', '.join('?' * len(_EXCHANGE))})",
                        _row(line, _EXCHANGE, {"run_id": "run"}),
                    )
                else:
                    raise BadInputError(f"{where}: type {kind!r} is not run, attempt or exchange")
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
