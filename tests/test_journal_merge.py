"""``pvisor journal merge`` and :func:`pvisor.journal.merge.merge_journals` (issue 42 item 3) on
real journal files written by the real writer: bodies shared between journals are copied once,
ids are kept, events renumbered, lineage kept, a clash merges nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import orjson
import pytest
from journal_helpers import snapshot

from pvisor.journal.merge import MergeClash, merge_journals
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

SHARED_FILE = b"shared " * 40


def body(n: int) -> bytes:
    """The n-th request of a conversation: each repeats the one before and adds to it."""
    messages = [{"role": "user", "content": f"message {i} " + "x" * 300} for i in range(n)]
    return orjson.dumps({"model": "m", "messages": messages})


def record(j: Journal, run: str, n: int, answer: bytes = b'{"choices": []}') -> None:
    j.record_exchange(run, "POST", "/v1/chat/completions", [], protocol="openai-chat", status=200,
                      request_body=body(n), response_body=answer)  # fmt: skip


@pytest.fixture
def journals(tmp_path: Path) -> tuple[Path, Path]:
    """Journal A: run ``r-a`` (three requests of one lane: prefix frames; a snapshot) and
    ``r-a2`` derived from it; journal B: run ``r-b``, whose request is r-a's second and whose
    snapshot shares a file with r-a's, and ``r-b2`` derived from a run B does not hold."""
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with Journal.open(a) as j:
        j.create_run(Run(id="r-a", agent="codex"))
        for n in (1, 2, 3):
            record(j, "r-a", n, b'{"choices": []}' + b" " * n)
        snapshot(j, "r-a", "s-a000000000000001", {"shared.txt": SHARED_FILE, "only-a.txt": b"a " * 90})
        j.create_run(Run(id="r-a2", agent="codex", parent_run="r-a", boundary_step=1, mode="continuation",
                         labels={"k": "v"}))  # fmt: skip
        record(j, "r-a2", 1)
        j.flush()
    with Journal.open(b) as j:
        j.create_run(Run(id="r-b", agent="claude-code"))
        record(j, "r-b", 2, b'{"choices": ["b"]}')
        snapshot(j, "r-b", "s-b000000000000001", {"shared.txt": SHARED_FILE})
        j.create_run(Run(id="r-b2", agent="codex", parent_run="r-elsewhere", boundary_step=2,
                         mode="replay-only"))  # fmt: skip
        record(j, "r-b2", 4)
        j.flush()
    return a, b


def rows(path: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(path) as c:
        return c.execute(sql, args).fetchall()


def bodies(path: Path) -> dict[str, tuple[bytes | None, bytes | None]]:
    """Every exchange's restored request and response, by id."""
    with JournalReader(path) as r:
        return {e.id: (r.request_body(e), r.response_body(e)) for e in r.exchanges()}


def test_two_journals_merge_with_shared_blobs_copied_once_ids_kept_events_renumbered(tmp_path, journals):
    a, b = journals
    dst = tmp_path / "sub" / "all.sqlite"
    rep = merge_journals([a, b], dst)
    assert rep.created and rep.runs == ["r-a", "r-a2", "r-b", "r-b2"] and rep.skipped == []
    assert (rep.exchanges, rep.snapshots) == (6, 2)
    # r-b's request is r-a's second and its snapshot lists r-a's shared file: each stored once
    shared = {hashlib.sha256(body(2)).hexdigest(), hashlib.sha256(SHARED_FILE).hexdigest()}
    assert shared <= {r[0] for r in rows(dst, "SELECT sha256 FROM blobs")}
    assert rep.blobs_shared >= 2
    src_blobs = {r[0] for p in (a, b) for r in rows(p, "SELECT sha256 FROM blobs")}
    assert rep.blobs_copied == len(src_blobs) == rows(dst, "SELECT count(*) FROM blobs")[0][0]
    # ids and per-run exchange order kept, every body byte for byte
    assert bodies(dst) == {**bodies(a), **bodies(b)}
    for src in (a, b):
        assert set(rows(src, "SELECT id, run_id, seq FROM exchanges")) <= set(
            rows(dst, "SELECT id, run_id, seq FROM exchanges")
        )
    # lineage as it was; a parent in neither journal is reported
    assert rows(dst, "SELECT parent_run, boundary_step, mode, labels FROM runs WHERE id = 'r-a2'") == [
        ("r-a", 1, "continuation", '{"k":"v"}')
    ]
    assert rep.missing_parents == {"r-b2": "r-elsewhere"}
    # events: one sequence, a's then b's in their order, each run's merge recorded
    seqs = [r[0] for r in rows(dst, "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))
    kinds_a = [r[0] for r in rows(a, "SELECT kind FROM events WHERE run_id IS NOT NULL ORDER BY seq")]
    kinds_dst = [r[0] for r in rows(dst, "SELECT kind FROM events WHERE kind != 'run.merged' ORDER BY seq")]
    assert kinds_dst[: len(kinds_a)] == kinds_a
    merged = rows(dst, "SELECT run_id, data FROM events WHERE kind = 'run.merged'")
    a_id = rows(a, "SELECT value FROM meta WHERE key = 'journal_id'")[0][0]
    assert orjson.loads(dict(merged)["r-a"]) == {"from_journal": a_id, "fingerprints": a_id}
    # writers remapped: every exchange names a writers row of dst
    assert not rows(dst, "SELECT id FROM exchanges WHERE writer_id NOT IN (SELECT id FROM writers)")
    dst_key = rows(dst, "SELECT value FROM meta WHERE key = 'fingerprint_key'")[0][0]
    assert dst_key != rows(a, "SELECT value FROM meta WHERE key = 'fingerprint_key'")[0][0]
    with JournalReader(dst) as r:
        assert r.verify().ok


def test_merging_again_skips_what_is_there_and_a_runs_filter_brings_one_run(tmp_path, journals):
    a, b = journals
    dst = tmp_path / "one.sqlite"
    rep = merge_journals([a], dst, runs={"r-a2"})
    assert rep.runs == ["r-a2"] and rep.missing_parents == {"r-a2": "r-a"}
    assert [r[0] for r in rows(dst, "SELECT id FROM runs")] == ["r-a2"]
    again = merge_journals([a, b], dst)
    assert again.skipped == ["r-a2"] and again.runs == ["r-a", "r-b", "r-b2"]
    assert again.missing_parents == {"r-b2": "r-elsewhere"}
    third = merge_journals([b, a], dst)
    assert third.runs == [] and sorted(third.skipped) == ["r-a", "r-a2", "r-b", "r-b2"]
    assert third.blobs_copied == 0 and third.events == 0
    with JournalReader(dst) as r:
        assert r.verify().ok


def test_a_run_in_two_journals_with_different_content_is_one_clash_and_nothing_is_merged(tmp_path, journals):
    a, b = journals
    other = tmp_path / "other.sqlite"
    with Journal.open(other) as j:
        j.create_run(Run(id="r-a", agent="codex"))
        record(j, "r-a", 7)
        j.flush()
    dst = tmp_path / "dst.sqlite"
    with pytest.raises(MergeClash) as info:
        merge_journals([b, a, other], dst)
    assert info.value.exit_code == 65 and info.value.files == (str(a), str(other))
    assert "run r-a" in str(info.value) and "\n" not in str(info.value)
    assert not dst.exists()
