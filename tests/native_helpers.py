"""Helpers of the native adapter tests: the corpus folder, rebuilding an opencode.db from its
JSON dump (``{table: {schema, rows}}``, rows' ``data`` objects stored as JSON text) or writing
a minimal one, reading a corpus sample with detection, and a refused read's message."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import corpus_dir
from pvisor.adapters.native import read_native
from pvisor.adapters.native.base import NativeResult
from pvisor.core.errors import BadInputError


def native_dir() -> Path:
    return corpus_dir() / "native"


def opencode_db_from_dump(dump: Path, out: Path) -> Path:
    """Write the SQLite database described by ``dump`` to ``out`` and return ``out``."""
    tables = json.loads(dump.read_text())
    db = sqlite3.connect(out)
    try:
        for name, t in tables.items():
            db.execute(t["schema"])
            for row in t["rows"]:
                cols = list(row)
                vals = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values()]
                db.execute(
                    f"insert into `{name}` ({', '.join('`%s`' % c for c in cols)}) "
                    f"values ({', '.join('?' for _ in cols)})",
                    vals,
                )
        db.commit()
    finally:
        db.close()
    return out


def read_sample(path: Path, agent: str) -> tuple[Any, NativeResult]:
    """(the raw JSON of sample ``path``, read here without the adapter; the adapter's result
    with the format detected), asserting that detection named ``agent``."""
    raw = json.loads(path.read_text())
    result, notes = read_native(path)
    assert notes == [f"detected format: {agent}"]
    return raw, result


def refused(path: Path, agent: str | None = None) -> str:
    """The message of the BadInputError (exit 65) reading ``path`` (with ``agent``, else
    detected) raises; fails the test when it reads."""
    with pytest.raises(BadInputError) as exc:
        read_native(path, agent)
    assert exc.value.exit_code == 65
    return exc.value.message


#: the columns of opencode.db's ``session``, ``message`` and ``part`` tables the adapter reads
#: (the real tables have more: see the corpus dump)
_OPENCODE_TABLES = (
    "\n"
    "    create table session (id text primary key, parent_id text, version text, directory text, "
    "title text, time_updated integer);\n"
    "    create table message (id text primary key, session_id text, data text);\n"
    "    create table part (id text primary key, message_id text, session_id text, data text);\n"
)


def opencode_db(out: Path, sessions: list[tuple], messages: list[tuple], parts: list[tuple]) -> Path:
    """A minimal opencode.db at ``out``: ``sessions`` rows ``(id, parent_id, version,
    directory, title, time_updated)``, ``messages`` rows ``(id, session_id, data)``, ``parts``
    rows ``(id, message_id, session_id, data)``. A ``data`` dict is stored as JSON text; a str
    or bytes as given (bytes cast to TEXT, so invalid UTF-8 can be stored)."""

    def data(v: Any) -> Any:
        return json.dumps(v) if isinstance(v, dict) else v

    db = sqlite3.connect(out)
    try:
        db.executescript(_OPENCODE_TABLES)
        db.executemany("insert into session values (?, ?, ?, ?, ?, ?)", sessions)
        db.executemany(
            "insert into message values (?, ?, cast(? as text))", [(*r[:-1], data(r[-1])) for r in messages]
        )
        db.executemany(
            "insert into part values (?, ?, ?, cast(? as text))", [(*r[:-1], data(r[-1])) for r in parts]
        )
        db.commit()
    finally:
        db.close()
    return out


def bad_documents(*specific: tuple[bytes, str]) -> list[tuple[bytes, str]]:
    """``(file content, what the refusal says)`` cases for a single-document adapter: the ones
    every such adapter shares (an empty file, JSON Lines, nesting too deep for the parser)
    followed by the adapter's own ``specific`` ones."""
    return [
        (b"", "the file is empty"),
        (b'{"a": 1}\n{"a": 2}\n', "not a JSON document (Extra data"),
        (b"[" * 100_000 + b"]" * 100_000, "not a JSON document (nested too deep to parse)"),
        *specific,
    ]


def assert_refused_naming_file_and_shape(
    path: Path, content: bytes, agent: str, says: str, expected: str
) -> None:
    """Write ``content`` to ``path`` and assert that reading it with ``--agent`` ``agent`` is
    refused (exit 65) with a message that starts with the path, holds ``says`` and ends with
    ``; expected <expected>...`` (the shape the adapter reads)."""
    path.write_bytes(content)
    message = refused(path, agent)
    assert message.startswith(f"{path}: ") and says in message and f"; expected {expected}" in message


def assert_steps_match(steps: Any, raw: list[dict]) -> None:
    """Assert that the trajectory ``steps`` are the ``raw`` ones a test computed from the file
    itself: each ``{text, calls: [(id, name, arguments_raw)], results: [(call_id, content,
    is_error)], messages: [first part's text]}``, in order."""
    assert len(steps) == len(raw)
    for s, r in zip(steps, raw):
        assert s.action.text == r["text"]
        assert [(c.id, c.name, c.arguments_raw) for c in s.action.tool_calls] == r["calls"]
        assert [(x.call_id, x.content, x.is_error) for x in s.observation.results] == r["results"]
        assert [m.parts[0].text for m in s.observation.messages] == r["messages"]
