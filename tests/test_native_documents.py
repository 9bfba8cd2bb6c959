"""Single-document JSON read in pieces (adapters/native/documents.py): a large file's big
array parsed in batches from a memory map gives exactly the value and warnings of one whole
parse, on every corpus sample of the four single-document formats and on awkward documents
(cut points inside strings and nested objects, repeated keys, bad UTF-8). The size threshold
and batch size are lowered per test so that small files take the piecewise path."""

from __future__ import annotations

from pathlib import Path

import pytest

from native_helpers import native_dir
from pvisor.adapters.native import documents as m
from pvisor.adapters.native.diagnostics import Diagnostics
from pvisor.core.errors import BadInputError


def _whole_and_split(path: Path, arrays: tuple[str, ...], monkeypatch, chunk: int):
    """(value and warnings of one parse, of the piecewise parse with ``chunk``-byte batches)."""

    def read(split_min: int):
        monkeypatch.setattr(m, "SPLIT_MIN", split_min)
        monkeypatch.setattr(m, "SPLIT_CHUNK", chunk)
        diag = Diagnostics(str(path))
        try:
            value = m.read_document(path, diag, "X", arrays)
        except BadInputError as exc:
            return ("refused", exc.message)
        return value, [(w.code, w.where) for w in diag.warnings]

    return read(1 << 62), read(0)


@pytest.mark.parametrize("chunk", [1, 200, 1 << 18])
def test_a_document_read_in_pieces_equals_one_parse(monkeypatch, chunk):
    """Every single-document corpus file (the four adapters' arrays) gives the same value
    and warnings whether parsed whole or in batches of elements (memory: docs/benchmarks.md)."""
    arrays = ("messages", "history", "trajectory")
    files = [
        p
        for d in ("mini-swe-agent", "opencode", "openhands", "swe-agent")
        for p in sorted((native_dir() / d).glob("*"))
        if p.is_file() and p.suffix in (".json", ".traj")
    ]
    assert len(files) > 10
    for p in files:
        whole, split = _whole_and_split(p, arrays, monkeypatch, chunk)
        assert split == whole, p.name


@pytest.mark.parametrize(
    "text",
    [
        # the key nested first: parsed whole
        '{"info": {"messages": [1]}, "messages": [{"role": "a"}, {"role": "b"}]}',
        '{"messages": [{"role": "a"}], "messages": [{"role": "b"}]}',  # the key twice: the later one
        '{"messages": [{"role": "a", "c": "}, {\\"role\\": 1"}, {"role": "b"}, '
        '{"role": "c", "d": [{"role": 2}, {"role": 3}]}], "x": [1]}',
        '[{"role": "a"}, {"role": "b\\ud800"}, {"role": "c"}]',  # lone surrogate: flagged once
        '{"messages": [{"role": "a"}, {"role": "b"}]}\n{"messages": []}',  # JSON Lines: refused as before
        '{"messages": [{"role": "a"}, {"role": "b"]}',  # broken: refused as before
        '{"messages": [1, 2, {"role": "b"}]}',  # elements that are not objects
        '{"messages": []}',
    ],
)
def test_awkward_documents_read_in_pieces_equal_one_parse(tmp_path, monkeypatch, text):
    p = tmp_path / "d.json"
    p.write_text(text)
    whole, split = _whole_and_split(p, ("messages",), monkeypatch, 1)
    assert split == whole


def test_invalid_utf8_read_in_pieces_is_flagged_once(tmp_path, monkeypatch):
    p = tmp_path / "d.json"
    p.write_bytes(b'{"messages": [{"role": "a"}, {"role": "b\xff"}, {"role": "c\xfe"}]}')
    whole, split = _whole_and_split(p, ("messages",), monkeypatch, 1)
    assert split == whole and whole[1] == [("invalid_utf8", "document")]
