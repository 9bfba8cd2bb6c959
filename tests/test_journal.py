"""The Event Journal on a real SQLite file: bodies, storage growth, integrity, crashes, modes."""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import brotli
import orjson
import pytest

from conftest import cannot_run_here
from journal_helpers import anthropic_session_bodies
from pvisor.journal import blobs
from pvisor.core.errors import BadInputError, IntegrityError, UsageError
from pvisor.journal.model import Attempt, Run, pack_timings, unpack_timings
from pvisor.journal.reader import JournalReader
from pvisor.journal.schema import schema_version
from pvisor.journal.writer import Journal

try:
    from compression import zstd
except ImportError:
    from backports import zstd


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return tmp_path / "data" / "journal.sqlite"


def test_bodies_round_trip_byte_for_byte(jpath: Path):
    bodies = [
        b"",
        b"{}",
        '{"text": "caf\u00e9 \u2028 \U0001f600"}'.encode(),
        bytes(range(256)) * 50,  # not UTF-8
        os.urandom(300_000),  # incompressible
        b'{"messages": [' + b'"x",' * 100_000 + b'"y"]}',
    ]
    with Journal.open(jpath) as j:
        ids = [
            j.record_exchange(
                "r-rt",
                "POST",
                "/v1/messages",
                [],
                status=200,
                request_body=b,
                response_body=b[::-1],
                streamed=True,
                chunk_timings=[(5, len(b))],
            )
            for b in bodies
        ]
    with JournalReader(jpath) as r:
        for ex_id, b in zip(ids, bodies):
            ex = r.exchange(ex_id)
            assert r.request_body(ex) == b
            assert r.response_body(ex, raw=True) == b[::-1]
            assert ex.request_body == hashlib.sha256(b).hexdigest()
            assert unpack_timings(ex.chunk_timings) == [(5, len(b))]
        assert [e.seq for e in r.exchanges("r-rt")] == list(range(1, len(bodies) + 1))


def test_storage_of_a_200_step_chain_grows_linearly(jpath: Path, tmp_path: Path):
    bodies = anthropic_session_bodies(200)
    system_and_tools = len(orjson.dumps(orjson.loads(bodies[0])["system"])) + len(
        orjson.dumps(orjson.loads(bodies[0])["tools"])
    )
    assert system_and_tools >= 20_000
    growth = [len(b) - len(a) for a, b in zip(bodies, bodies[1:])]
    assert min(growth) >= 300 and max(growth) <= 2_300

    def stored_after(n: int, path: Path) -> int:
        with Journal.open(path) as j:
            for body in bodies[:n]:
                j.record_exchange("r-long", "POST", "/v1/messages", [], status=200, request_body=body)
        with JournalReader(path) as r:
            restored = [r.request_body(e) for e in r.exchanges("r-long")]
            assert restored == bodies[:n]
            return r.conn.execute("SELECT SUM(length(data)) FROM blobs").fetchone()[0]

    s100 = stored_after(100, tmp_path / "a" / "j.sqlite")
    s200 = stored_after(200, tmp_path / "b" / "j.sqlite")
    final = len(bodies[199])
    print(
        f"\nfinal request {final} bytes; stored 100 steps {s100} bytes, 200 steps {s200} bytes; "
        f"stored/final {s200 / final:.2f}; 200/100 {s200 / s100:.2f}"
    )
    assert s200 <= 2 * final
    assert s200 / s100 < 2.3


def test_restore_depth_is_bounded_by_keyframes(jpath: Path):
    bodies = anthropic_session_bodies(70, system_bytes=2_000, tool_bytes=1_000)
    with Journal.open(jpath) as j:
        for body in bodies:
            j.record_exchange("r-k", "POST", "/v1/messages", [], status=200, request_body=body)
    with JournalReader(jpath) as r:
        rows = {row[0]: (row[1], row[2]) for row in r.conn.execute("SELECT sha256, codec, base FROM blobs")}
        for pos, ex in enumerate(r.exchanges("r-k")):
            depth, sha = 0, ex.request_body
            while rows[sha][0] == "zstd-prefix":
                sha = rows[sha][1]
                depth += 1
            assert depth <= 31 + 31, (pos, depth)
            ref = blobs.reference_position(pos)
            if ref is None:
                assert rows[ex.request_body][0] in ("zstd", "identity")
            else:
                assert rows[ex.request_body][1] == hashlib.sha256(bodies[ref]).hexdigest()


def test_verify_catches_a_corrupted_blob(jpath: Path):
    bodies = anthropic_session_bodies(5, system_bytes=3_000, tool_bytes=1_000)
    with Journal.open(jpath) as j:
        for body in bodies:
            j.record_exchange("r-v", "POST", "/v1/messages", [], status=200, request_body=body)
    with JournalReader(jpath) as r:
        assert r.verify().ok
        victim = r.exchanges("r-v")[2].request_body
    conn = sqlite3.connect(jpath)
    data = bytearray(conn.execute("SELECT data FROM blobs WHERE sha256 = ?", (victim,)).fetchone()[0])
    data[len(data) // 2] ^= 0xFF
    conn.execute("UPDATE blobs SET data = ? WHERE sha256 = ?", (bytes(data), victim))
    conn.commit()
    conn.close()
    with JournalReader(jpath) as r:
        rep = r.verify()
        assert not rep.ok
        assert any(victim in p for p in rep.problems), rep.problems


def test_verify_reports_a_missing_blob(jpath: Path):
    with Journal.open(jpath) as j:
        j.record_exchange(
            "r-m", "POST", "/v1/messages", [], status=200, request_body=b'{"a": "' + b"z" * 500 + b'"}'
        )
    conn = sqlite3.connect(jpath)
    conn.execute("DELETE FROM blobs")
    conn.commit()
    conn.close()
    with JournalReader(jpath) as r:
        rep = r.verify()
    assert not rep.ok and any("request_body blob" in p and "missing" in p for p in rep.problems)


KILL_CHILD = textwrap.dedent(
    """
    import sys, time
    from pvisor.journal.writer import Journal
    from pvisor.journal.model import Run
    j = Journal.open(sys.argv[1])
    j.create_run(Run(id="r-kill", agent="test"))
    hanging = [
        j.begin_exchange("r-kill", "POST", "/v1/messages", [("x-api-key", "sk-kill")]) for _ in range(3)
    ]
    for i in range(5):
        j.record_exchange(
            "r-kill", "POST", "/v1/messages", [], status=200,
            request_body=b'{"n": %d}' % i, response_body=b"ok",
        )
    j.flush()
    # the hanging exchanges are older than one commit tick: wait until they are on disk as in flight
    import sqlite3
    while sqlite3.connect(sys.argv[1]).execute(
        "SELECT count(*) FROM exchanges WHERE outcome IS NULL"
    ).fetchone()[0] < 3:
        time.sleep(0.01)
    print("ready", flush=True)
    i = 0
    while True:  # keep writing until killed
        i += 1
        j.record_exchange(
            "r-kill", "POST", "/v1/messages", [], status=200,
            request_body=b'{"loop": %d}' % i, response_body=b"x" * 1000,
        )
        time.sleep(0.001)
    """
)


def test_sigkill_while_writing_leaves_a_journal_that_opens_and_verifies(jpath: Path, tmp_path: Path):
    script = tmp_path / "child.py"
    script.write_text(KILL_CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(jpath)], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "ready"
        time.sleep(0.3)  # let it write a few batches: what we test is a kill in mid-write
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    # the crashed writer's in-flight rows are still open
    with JournalReader(jpath) as r:
        assert r.verify().ok
        assert sum(1 for e in r.exchanges("r-kill") if e.outcome == "in_flight") == 3
    with Journal.open(jpath) as j:
        assert len(j.reaped) == 1
    with JournalReader(jpath) as r:
        exs = r.exchanges("r-kill")
        incomplete = [e for e in exs if e.outcome == "incomplete"]
        assert len(incomplete) == 3
        assert all("ended while the exchange was in flight" in e.error for e in incomplete)
        assert sum(1 for e in exs if e.outcome == "ok") >= 5
        assert r.verify().ok
        kinds = [e["kind"] for e in r.events()]
        assert "writer.reaped" in kinds


def test_a_writer_killed_and_left_a_zombie_is_reaped(jpath: Path, tmp_path: Path):
    """A writer killed while nothing waits for it (its parent died too, in a container whose
    pid 1 reaps no orphans) stays a zombie: its pid still answers kill(pid, 0), but it is dead."""
    script = tmp_path / "child.py"
    script.write_text(KILL_CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(jpath)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)  # and not waited for: a zombie until child.wait()
        deadline = time.monotonic() + 10
        while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed writer never became a zombie"
            time.sleep(0.01)
        with Journal.open(jpath) as j:
            assert len(j.reaped) == 1
    finally:
        child.wait(10)
        child.stdout.close()
    with JournalReader(jpath) as r:
        assert sum(1 for e in r.exchanges("r-kill") if e.outcome == "incomplete") == 3


def test_a_stream_in_flight_is_kept_in_parts_until_it_is_whole(jpath: Path):
    """The thread writer's side of issue 17, defect 2 (the gateway's is in test_gateway_cli):
    the request read and the chunks received are stored while in flight, a commit window at a
    time, and the parts go once the exchange is written whole; verify reports parts left to a
    finished exchange."""
    with Journal.open(jpath) as j:
        p = j.begin_exchange("r-p", "POST", "/v1/messages", [("x-api-key", "sk-parts-secret")])
        j.request_read(p, b'{"stream": true}')
        chunks: list[bytes] = []
        j.response_started(p, 200, [("content-type", "text/event-stream")], chunks, True)
        chunks += [b"data: 1\n\n", b"data: 2\n\n"]

        def parts():
            with sqlite3.connect(jpath) as db:
                rows = db.execute("SELECT data FROM response_parts ORDER BY offset").fetchall()
                return b"".join(r[0] for r in rows) if rows else None

        deadline = time.monotonic() + 10
        while parts() != b"data: 1\n\ndata: 2\n\n":
            assert time.monotonic() < deadline, parts()
            time.sleep(0.02)
        with JournalReader(jpath) as r:
            [ex] = r.exchanges("r-p")
            assert (ex.outcome, ex.status, ex.request_bytes, r.request_body(ex)) == (
                "in_flight",
                200,
                16,
                b'{"stream": true}',
            )
            assert r.verify().ok
        chunks.append(b"data: 3\n\n")
        j.finish_exchange(
            p, status=200, request_body=b'{"stream": true}', response_body=b"".join(chunks), streamed=True
        )
        j.flush()
        assert parts() is None
    with JournalReader(jpath) as r:
        [ex] = r.exchanges("r-p")
        assert ex.outcome == "ok" and r.response_body(ex, raw=True) == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
        lane_pos = r.conn.execute("SELECT lane_pos FROM exchanges WHERE id = ?", (ex.id,)).fetchone()[0]
        assert lane_pos == 0  # the request stored once, its lane moved once
        assert r.conn.execute("SELECT count(*) FROM blobs WHERE size = 16").fetchone()[0] == 1
    with sqlite3.connect(jpath) as db:
        db.execute("INSERT INTO response_parts VALUES (?, 0, x'00')", (ex.id,))
    with JournalReader(jpath) as r:
        assert r.verify().problems == [
            f"response_parts of exchange {ex.id} belong to a finished exchange (ok)"
        ]


def test_a_live_writer_is_not_reaped(jpath: Path):
    with Journal.open(jpath) as first:
        p = first.begin_exchange("r-live", "POST", "/v1/messages", [])
        time.sleep(0.25)
        first.flush()
        with Journal.open(jpath) as second:
            assert second.reaped == []
        first.finish_exchange(p, status=200, request_body=b"{}", response_body=b"{}")
    with JournalReader(jpath) as r:
        assert [e.outcome for e in r.exchanges("r-live")] == ["ok"]


def test_close_marks_unfinished_exchanges_incomplete(jpath: Path):
    with Journal.open(jpath) as j:
        j.begin_exchange("r-c", "POST", "/v1/messages", [])
    with JournalReader(jpath) as r:
        [ex] = r.exchanges("r-c")
        assert ex.outcome == "incomplete"


def test_file_and_directory_modes(jpath: Path):
    with Journal.open(jpath) as j:
        j.record_exchange("r-mode", "POST", "/v1/messages", [], status=200, request_body=b"{}")
        j.flush()
        for suffix in ("", "-wal", "-shm"):
            f = Path(str(jpath) + suffix)
            assert f.exists(), f
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, (f, oct(f.stat().st_mode))
    assert stat.S_IMODE(jpath.parent.stat().st_mode) == 0o700


def test_wal_mode_and_versioned_schema(jpath: Path):
    with Journal.open(jpath):
        pass
    conn = sqlite3.connect(jpath)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema_version() >= 1
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = 'pvisor.journal' ORDER BY id"
        )
    ]
    assert names[0] == "m001_initial"
    conn.close()
    with Journal.open(jpath):  # reopening applies nothing twice
        pass
    conn = sqlite3.connect(jpath)
    assert conn.execute("SELECT count(*) FROM _sqlite_migrations").fetchone()[0] == len(names)


def test_events_are_append_only_with_increasing_sequence(jpath: Path):
    with Journal.open(jpath) as j:
        j.create_run(Run(id="r-ev", agent="codex", argv=["codex", "exec"]))
        j.start_attempt(Attempt(run="r-ev", n=1))
        j.record_exchange("r-ev", "POST", "/v1/responses", [], status=200, request_body=b"{}")
        j.end_attempt("r-ev", 1, 0, {"session_id": "abc"})
    with JournalReader(jpath) as r:
        events = r.events("r-ev")
        assert [e["kind"] for e in events] == [
            "run.created",
            "attempt.started",
            "exchange.finished",
            "attempt.ended",
        ]
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        [att] = r.attempts("r-ev")
        assert att.exit_code == 0 and att.labels == {"session_id": "abc"} and att.ended_ms >= att.started_ms
        assert r.run("r-ev").argv == ["codex", "exec"]


def test_sequence_continues_across_writers(jpath: Path):
    for _ in range(2):
        with Journal.open(jpath) as j:
            for _ in range(3):
                j.record_exchange("r-seq", "POST", "/v1/messages", [], status=200, request_body=b"{}")
    with JournalReader(jpath) as r:
        assert [e.seq for e in r.exchanges("r-seq")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_encoded_request_bodies_are_stored_decoded(jpath: Path, coding: str):
    body = anthropic_session_bodies(3, system_bytes=4_000, tool_bytes=1_000)[-1]
    encoded = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "br": brotli.compress,
        "zstd": lambda b: zstd.compress(b, level=3),
    }[coding](body)
    with Journal.open(jpath) as j:
        ex_id = j.record_exchange(
            "r-enc",
            "POST",
            "/v1/messages",
            [("Content-Encoding", coding)],
            status=200,
            request_body=encoded,
            request_encoding=coding,
        )
    with JournalReader(jpath) as r:
        ex = r.exchange(ex_id)
        assert ex.outcome == "ok"
        assert ex.request_encoding == coding
        assert ex.request_bytes == len(encoded)
        assert r.request_body(ex) == body


def test_undecodable_or_oversize_body_keeps_raw_bytes(jpath: Path):
    garbage = b"\x28\xb5\x2f\xfd" + os.urandom(100)  # a zstd magic number, then noise
    bomb = zstd.compress(b"\0" * 2_000_000)
    with Journal.open(jpath, max_decoded=1_000_000) as j:
        bad = j.record_exchange(
            "r-bad", "POST", "/v1/responses", [], status=200, request_body=garbage, request_encoding="zstd"
        )
        big = j.record_exchange(
            "r-bad", "POST", "/v1/responses", [], status=200, request_body=bomb, request_encoding="zstd"
        )
    with JournalReader(jpath) as r:
        for ex_id, raw, what in ((bad, garbage, "corrupt"), (big, bomb, "more than 1000000 bytes")):
            ex = r.exchange(ex_id)
            assert ex.outcome == "decode_error"
            assert what in ex.error
            assert r.request_body(ex) == raw
        assert r.verify().ok


def test_reader_never_writes(jpath: Path):
    with Journal.open(jpath) as j:
        j.record_exchange("r-ro", "POST", "/v1/messages", [], status=200, request_body=b"{}")
    before = {p.name: p.read_bytes() for p in jpath.parent.iterdir()}
    with JournalReader(jpath) as r:
        r.verify()
        r.exchanges()
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            r.conn.execute("INSERT INTO meta(key, value) VALUES ('x', 'y')")
    after = {p.name: p.read_bytes() for p in jpath.parent.iterdir() if p.name in before}
    assert after == before


def test_reader_errors_are_clear(tmp_path: Path):
    with pytest.raises(UsageError, match="does not exist"):
        JournalReader(tmp_path / "nope.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(BadInputError, match="not a pvisor journal"):
        JournalReader(junk)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.commit()
    with pytest.raises(BadInputError, match="not a pvisor journal"):
        JournalReader(other)
    with pytest.raises(BadInputError, match="not a pvisor journal"):
        Journal.open(junk)


def test_finalizer_output_is_stored_as_the_final_response(jpath: Path):
    seen = []

    def finalize(protocol, streamed, body):
        seen.append((protocol, streamed, body))
        return b'{"final": true}'

    with Journal.open(jpath, finalize=finalize) as j:
        ex_id = j.record_exchange(
            "r-f",
            "POST",
            "/v1/messages",
            [],
            protocol="anthropic",
            status=200,
            request_body=b"{}",
            response_body=gzip.compress(b"event: x\ndata: {}\n\n"),
            response_headers=[("Content-Encoding", "gzip")],
            streamed=True,
        )
    assert seen == [("anthropic", True, b"event: x\ndata: {}\n\n")]
    with JournalReader(jpath) as r:
        ex = r.exchange(ex_id)
        assert r.response_body(ex) == b'{"final": true}'
        assert gzip.decompress(r.response_body(ex, raw=True)) == b"event: x\ndata: {}\n\n"


class _Signal(logging.Handler):
    """Sets an event when a record whose message contains ``needle`` is logged."""

    def __init__(self, needle: str):
        super().__init__()
        self.needle = needle
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.seen.set()


def test_a_locked_journal_keeps_exchanges_in_memory_and_retries(jpath: Path):
    with Journal.open(jpath):
        pass
    locked = _Signal("is locked by another process")
    released = _Signal("is writable again")
    logger = logging.getLogger("pvisor.journal")
    logger.addHandler(locked)
    logger.addHandler(released)
    other = sqlite3.connect(jpath, isolation_level=None)
    try:
        with Journal.open(jpath, busy_timeout_ms=50) as j:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            ids = [
                j.record_exchange(
                    "r-lock", "POST", "/v1/messages", [], status=200, request_body=b'{"n": %d}' % i
                )
                for i in range(3)
            ]
            assert locked.seen.wait(10), "the writer should report the lock"
            assert j.error is None
            other.execute("COMMIT")
            j.flush()
            assert released.seen.is_set()
    finally:
        logger.removeHandler(locked)
        logger.removeHandler(released)
        other.close()
    with JournalReader(jpath) as r:
        exs = r.exchanges("r-lock")
        assert [e.id for e in exs] == ids
        assert [r.request_body(e) for e in exs] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
        assert r.verify().ok


def test_two_writers_on_one_run_give_dense_seq_in_arrival_order(jpath: Path):
    with Journal.open(jpath) as a, Journal.open(jpath) as b:
        # arrival order a1, b1, a2, b2, a3; finishing order reversed, commits interleaved
        pending = []
        for j in (a, b, a, b, a):
            pending.append((j, j.begin_exchange("r-two", "POST", "/v1/messages", [])))
            time.sleep(0.002)  # distinct arrival times on a coarse clock
        for j, p in reversed(pending):
            j.finish_exchange(p, status=200, request_body=b"{}")
            j.flush()
    with JournalReader(jpath) as r:
        exs = r.exchanges("r-two")
    assert [e.id for e in exs] == [p.id for _, p in pending]
    assert [e.seq for e in exs] == [1, 2, 3, 4, 5]


def test_the_writer_refuses_a_database_that_is_not_a_journal(tmp_path: Path):
    other = tmp_path / "app.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    with pytest.raises(BadInputError, match="not a pvisor journal"):
        Journal.open(other)
    assert other.read_bytes() == before


def test_a_journal_from_a_newer_pvisor_is_refused(jpath: Path):
    with Journal.open(jpath):
        pass
    conn = sqlite3.connect(jpath)
    conn.execute(
        "INSERT INTO _sqlite_migrations(migration_set, name, applied_at) "
        "VALUES ('pvisor.journal', 'm999_future', 'x')"
    )
    conn.commit()
    conn.close()
    with pytest.raises(BadInputError, match="newer pvisor"):
        Journal.open(jpath)


def test_damaged_columns_and_schema_are_integrity_errors(jpath: Path, tmp_path: Path):
    with Journal.open(jpath) as j:
        ex_id = j.record_exchange(
            "r-dmg",
            "POST",
            "/v1/messages",
            [("content-type", "application/json")],
            status=200,
            request_body=b"{}",
        )
    conn = sqlite3.connect(jpath)
    conn.execute("UPDATE exchanges SET request_headers = '{not json' WHERE id = ?", (ex_id,))
    conn.commit()
    conn.close()
    with JournalReader(jpath) as r:
        with pytest.raises(
            IntegrityError, match=f"exchanges {ex_id}: column request_headers is not valid JSON"
        ):
            r.exchanges("r-dmg")
        rep = r.verify()
        assert any("request_headers is not valid JSON" in p for p in rep.problems)
    conn = sqlite3.connect(jpath)
    for view in ("exchange_bodies", "run_summary"):  # they name the column: SQLite would refuse the drop
        conn.execute(f"DROP VIEW {view}")
    conn.execute("ALTER TABLE exchanges DROP COLUMN role")
    conn.commit()
    conn.close()
    with pytest.raises(IntegrityError, match="table exchanges lacks column"):
        JournalReader(jpath)
    conn = sqlite3.connect(jpath)
    conn.execute("DROP TABLE events")
    conn.commit()
    conn.close()
    with pytest.raises(IntegrityError, match="events"):
        JournalReader(jpath)


def test_a_directory_or_unwritable_path_is_a_clear_error(tmp_path: Path):
    with pytest.raises(UsageError, match="is a directory"):
        Journal.open(tmp_path)
    half = tmp_path / "half.sqlite"
    with Journal.open(half) as j:
        j.record_exchange("r-h", "POST", "/v1/messages", [], status=200, request_body=os.urandom(200_000))
    data = half.read_bytes()
    half.write_bytes(data[: len(data) // 2])
    # a truncated journal is damage (exit 3), never "not a journal" (65) nor a traceback
    pvisor = os.path.join(os.path.dirname(sys.executable), "pvisor")
    proc = subprocess.run(
        [pvisor, "--journal", str(half), "journal", "verify"], capture_output=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    assert b"Traceback" not in proc.stderr


def test_reassembly_left_undone_is_picked_up_by_the_next_writer(jpath: Path):
    calls = []

    def finalize(protocol, streamed, body):
        calls.append(protocol)
        return b'{"reassembled": "%s"}' % body.strip()

    with Journal.open(jpath) as j:  # a writer without a reassembler (or one that died first)
        ex_id = j.record_exchange(
            "r-late",
            "POST",
            "/v1/messages",
            [],
            protocol="anthropic",
            status=200,
            request_body=b"{}",
            response_body=b"data: x\n\n",
            streamed=True,
        )
    with JournalReader(jpath) as r:
        assert r.exchange(ex_id).response_final is None
    with Journal.open(jpath, finalize=finalize) as j:
        j.flush()
    assert calls == ["anthropic"]
    with JournalReader(jpath) as r:
        assert r.response_body(r.exchange(ex_id)) == b'{"reassembled": "data: x"}'


# --------------------------------------------------------------------------- readers: locks, media, versions

PVISOR_SCRIPT = os.path.join(os.path.dirname(sys.executable), "pvisor")


def test_a_locked_rollback_journal_is_unavailable_never_read_without_its_lock(jpath: Path):
    """A journal in rollback mode (no -wal) whose writer holds its lock: the reader waits the
    busy timeout, then exits 69; it never reads the file as immutable (uncommitted pages)."""
    with Journal.open(jpath) as j:
        j.create_run(Run(id="r-committed"))
    conn = sqlite3.connect(jpath, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    assert not Path(str(jpath) + "-wal").exists()
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute(
        "INSERT INTO runs(id, agent, argv, created_ms, mode, labels) "
        "VALUES ('r-uncommitted', NULL, '[]', 0, 'capture', '{}')"
    )
    try:
        proc = subprocess.run(
            [PVISOR_SCRIPT, "--journal", str(jpath), "journal", "ls"], capture_output=True, timeout=60
        )
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert proc.returncode == 69, proc.stderr
    assert proc.stdout == b""
    assert proc.stderr.decode().startswith(
        f"pvisor: error: journal {jpath} is locked by another process (still busy after 5 s)"
    )


def test_a_journal_on_a_read_only_directory_is_read(tmp_path: Path):
    """Where no -shm file can be created (read-only media, a directory one may not write), a
    journal whose WAL was checkpointed is read as immutable."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        # CI runs as root on Debian, where util-linux ships setpriv: there this must run
        cannot_run_here(
            "running as root without setpriv (util-linux): a read-only directory cannot be simulated"
        )
    import tempfile

    # a directory of its own under /tmp: the pytest base directory is 0700, closed to nobody
    base = Path(tempfile.mkdtemp(prefix="pvisor-ro-", dir="/tmp"))
    try:
        ro = base / "ro"
        ro.mkdir()
        src = tmp_path / "j.sqlite"
        with Journal.open(src) as j:
            j.create_run(Run(id="r-on-media"))
        (ro / "j.sqlite").write_bytes(src.read_bytes())
        (ro / "j.sqlite").chmod(0o644)
        ro.chmod(0o555)
        base.chmod(0o755)
        argv = [PVISOR_SCRIPT, "--journal", str(ro / "j.sqlite"), "journal", "ls"]
        if os.geteuid() == 0:  # root writes anywhere: read as nobody
            argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        proc = subprocess.run(argv, capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert b"r-on-media" in proc.stdout
        assert sorted(p.name for p in ro.iterdir()) == ["j.sqlite"]
    finally:
        (base / "ro").chmod(0o755)
        shutil.rmtree(base)


def test_readers_refuse_a_journal_from_a_newer_pvisor(jpath: Path):
    with Journal.open(jpath) as j:
        j.create_run(Run(id="r-old"))
    conn = sqlite3.connect(jpath)
    conn.execute(
        "INSERT INTO _sqlite_migrations(migration_set, name, applied_at) "
        "VALUES ('pvisor.journal', 'm999_future', 'x')"
    )
    conn.commit()
    conn.close()
    with pytest.raises(
        BadInputError, match=r"written by a newer pvisor \(schema m999_future\); upgrade pvisor to read it"
    ):
        JournalReader(jpath)
    proc = subprocess.run(
        [PVISOR_SCRIPT, "--journal", str(jpath), "journal", "ls"], capture_output=True, timeout=60
    )
    assert proc.returncode == 65 and b"newer pvisor" in proc.stderr and str(jpath).encode() in proc.stderr


def test_the_reader_knows_the_migrations_the_schema_registers():
    from pvisor.journal import reader, schema

    assert list(reader.KNOWN_MIGRATIONS) == schema.known_migration_names()
    assert reader.MIGRATION_SET == schema.MIGRATION_SET


def test_an_empty_id_matches_nothing(jpath: Path):
    with Journal.open(jpath) as j:
        j.create_run(Run(id="r-only"))
        j.record_exchange("r-only", "POST", "/v1/messages", [], status=200, request_body=b"{}")
    with JournalReader(jpath) as r:
        for get in (r.run, r.exchange):
            with pytest.raises(UsageError, match="empty"):
                get("")
        with pytest.raises(UsageError, match="empty run id"):
            r.export_jsonl(open(os.devnull, "wb"), "")


def test_a_damaged_body_names_its_exchange(jpath: Path):
    with Journal.open(jpath) as j:
        ex_id = j.record_exchange(
            "r-dmg",
            "POST",
            "/v1/messages",
            [],
            status=200,
            request_body=b'{"messages": []}',
            response_body=b"{}",
        )
    with JournalReader(jpath) as r:
        sha = r.exchange(ex_id).request_body
    conn = sqlite3.connect(jpath)
    conn.execute("UPDATE blobs SET data = X'00' || data WHERE sha256 = ?", (sha,))
    conn.commit()
    conn.close()
    with JournalReader(jpath) as r:
        with pytest.raises(
            IntegrityError,
            match=f"journal .*: exchange {ex_id}: request body: blob {sha} holds text, not bytes",
        ):
            r.request_body(r.exchange(ex_id))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300])
def test_chunk_timings_pack_alike_from_pairs_flat_lists_and_iterators(n):
    """The relay hands the writer a flat [µs, length, ...] list; importers give pairs: one
    format on disk whatever the shape, and it reads back as the pairs (extreme values too)."""
    import random

    rnd = random.Random(n)
    pairs = [(rnd.randrange(2**63), rnd.randrange(2**32)) for _ in range(n)]
    if n:
        pairs[0] = (2**63 - 1, 2**32 - 1)
    flat = [v for pair in pairs for v in pair]
    packed = pack_timings(flat)
    assert (
        packed == pack_timings(pairs) == pack_timings(iter(pairs)) == pack_timings([list(p) for p in pairs])
    )
    assert len(packed) == 12 * n and unpack_timings(packed) == pairs
    assert pack_timings(flat + [5]) == packed  # an odd last value has no pair: left out, as before
