"""``pvisor journal merge`` and :func:`pvisor.journal.merge.merge_journals` (issue 42 item 3) on
real journal files written by the real writer: bodies shared between journals are copied once,
ids are kept, events renumbered, lineage kept, a clash merges nothing."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from agent_helpers import FILES
from cli_helpers import pvisor_main
from journal_helpers import snapshot

from sqlite_utils import Database

from pvisor.journal.merge import MergeClash, merge_journals
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.schema import MIGRATIONS
from pvisor.journal.writer import Journal

SHARED_FILE = b"shared " * 40
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}


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
        [(manifest,)] = rows(a, "SELECT manifest FROM snapshots WHERE run_id = 'r-a'")
        # a handoff's child run, pending: its workspace is r-a's snapshot
        handed = {"handoff_from_agent": "codex", "handoff_to_agent": "claude-code"}
        j.create_run(Run(id="r-child", agent="claude-code", parent_run="r-a", boundary_step=1, mode="handoff",
                         pause_transition=0, workspace_snapshot=manifest, labels=handed))  # fmt: skip
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
    c = sqlite3.connect(path)
    try:  # closed here, not when collected: a connection left open keeps the journal's -wal
        with c:
            return c.execute(sql, args).fetchall()
    finally:
        c.close()


def bodies(path: Path) -> dict[str, tuple[bytes | None, bytes | None]]:
    """Every exchange's restored request and response, by id."""
    with JournalReader(path) as r:
        return {e.id: (r.request_body(e), r.response_body(e)) for e in r.exchanges()}


def test_two_journals_merge_with_shared_blobs_copied_once_ids_kept_events_renumbered(tmp_path, journals):
    a, b = journals
    dst = tmp_path / "sub" / "all.sqlite"
    rep = merge_journals([a, b], dst)
    assert rep.created and rep.runs == ["r-a", "r-a2", "r-child", "r-b", "r-b2"] and rep.skipped == []
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
    # a handoff's child alone brings the snapshot its workspace is restored from, files and all
    child = tmp_path / "child.sqlite"
    assert merge_journals([a], child, runs={"r-child"}).runs == ["r-child"]
    lineage = "SELECT parent_run, boundary_step, mode, pause_transition, workspace_snapshot, labels FROM runs"
    assert rows(child, lineage) == rows(a, lineage + " WHERE id = 'r-child'")
    with JournalReader(child) as r:
        manifest = orjson.loads(r.blob(r.run("r-child").workspace_snapshot))
        files = {e["path"]: r.blob(e["sha256"]) for e in manifest["entries"]}
        assert files == {"only-a.txt": b"a " * 90, "shared.txt": SHARED_FILE} and r.verify().ok
    last = rows(dst, "SELECT max(seq) FROM events")[0][0]
    again = merge_journals([a, b], dst)
    assert again.skipped == ["r-a2"] and again.runs == ["r-a", "r-child", "r-b", "r-b2"]
    # the new runs' events come after what dst held, in their journals' order, a's before b's
    new = rows(
        dst, "SELECT run_id, kind FROM events WHERE seq > ? AND kind != 'run.merged' ORDER BY seq", last
    )
    src = [r for p in (a, b) for r in rows(p, "SELECT run_id, kind FROM events WHERE run_id IN "
                                              "('r-a', 'r-child', 'r-b', 'r-b2') ORDER BY seq")]  # fmt: skip
    assert new == src and len(new) == again.events
    assert again.missing_parents == {"r-b2": "r-elsewhere"}
    third = merge_journals([b, a], dst)
    assert third.runs == [] and sorted(third.skipped) == ["r-a", "r-a2", "r-b", "r-b2", "r-child"]
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
    with pytest.raises(MergeClash) as info:
        merge_journals([b, a, other], tmp_path / "new" / "dst.sqlite")
    assert info.value.exit_code == 65 and info.value.files == (str(a), str(other))
    assert "run r-a" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "new").exists()  # neither the journal nor the directory made for it


# --------------------------------------------------------------------------- the command


def cli(*args, cwd: Path | None = None):
    """``pvisor ARGS`` in this process (tests/cli_helpers.py), text output."""
    return pvisor_main([*args], cwd=cwd, env=ENV, text=True)


def files_of(directory: Path, start: str = "") -> dict[str, bytes]:
    """The files of ``directory`` whose names start with ``start`` (a journal and its -wal), by
    name: what a command that writes nothing leaves as it was (a reader of a source may leave an
    empty -wal and a -shm beside it, as every reader does)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.is_file()
        and p.name.startswith(start)
        and not p.name.endswith("-shm")
        and not (p.name.endswith("-wal") and p.stat().st_size == 0)
    }


def one_error(proc, code: int, *names: str) -> str:
    """The one ``pvisor: error:`` line of ``proc``, which exited ``code`` and names ``names``."""
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("pvisor: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in names:
        assert n in proc.stderr, (n, proc.stderr)
    return proc.stderr


def test_a_clash_with_the_journal_merged_into_is_one_line_naming_both_and_changes_nothing(tmp_path, journals):
    a, b = journals
    dst = tmp_path / "dst.sqlite"
    with Journal.open(dst) as j:  # r-b with other content than b's
        j.create_run(Run(id="r-b", agent="claude-code"))
        record(j, "r-b", 5)
        j.flush()
    before = files_of(tmp_path, "dst")
    err = one_error(
        cli("journal", "merge", str(a), str(b), "--into", str(dst)), 65, "run r-b", str(b), str(dst)
    )
    assert "nothing merged" in err
    assert files_of(tmp_path, "dst") == before
    # an exchange id held by another run is a clash too
    [(xid,)] = rows(b, "SELECT id FROM exchanges WHERE run_id = 'r-b'")
    with sqlite3.connect(dst) as c:
        c.execute("UPDATE exchanges SET id = ? WHERE run_id = 'r-b'", (xid,))
        c.execute("UPDATE runs SET id = 'r-other' WHERE id = 'r-b'")
        c.execute("UPDATE exchanges SET run_id = 'r-other'")
    proc = cli("journal", "merge", str(b), "--into", str(dst), "--run", "r-b")
    one_error(proc, 65, f"exchange {xid}", "run r-other", str(b), str(dst))


def test_refusals_newer_schema_itself_twice_and_bad_files_each_one_line_and_no_destination(
    tmp_path, journals
):
    a, _ = journals
    dst = tmp_path / "out" / "dst.sqlite"
    newer = tmp_path / "newer.sqlite"
    newer.write_bytes(a.read_bytes())
    with sqlite3.connect(newer) as c:
        c.execute("INSERT INTO _sqlite_migrations(migration_set, name, applied_at) "
                  "VALUES ('pvisor.journal', 'm999_future', '2030-01-01')")  # fmt: skip
    one_error(cli("journal", "merge", str(newer), "--into", str(dst)), 65, str(newer), "newer pvisor")
    # a journal into itself: the same path, through a symbolic link, or given twice
    link = tmp_path / "link.sqlite"
    link.symlink_to(a)
    before = files_of(tmp_path, "a.sqlite")
    one_error(cli("journal", "merge", str(a), "--into", str(a)), 2, str(a), "itself")
    one_error(cli("journal", "merge", str(link), "--into", str(a)), 2, str(link), "itself")
    one_error(cli("journal", "merge", str(a), str(link), "--into", str(dst)), 2, str(link), "twice")
    assert files_of(tmp_path, "a.sqlite") == before
    # bad files: missing, a directory, not SQLite, cut short, a name that is not UTF-8
    (tmp_path / "notes.txt").write_text("not a journal\n" * 400)
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(a.read_bytes()[: a.stat().st_size // 2])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # SQLite would wait on it for ever
    nope, notes = str(tmp_path / "nope.sqlite"), str(tmp_path / "notes.txt")
    cases = [  # (source, into, exit code, what the line says)
        (nope, str(dst), 2, [f"journal {nope} does not exist"]),
        (str(tmp_path), str(dst), 2, [f"journal {tmp_path} is a directory, expected a journal file"]),
        (notes, str(dst), 65, [f"{notes} is not a pvisor journal (not an SQLite database)"]),
        (str(cut), str(dst), 3, [f"journal {cut} is damaged"]),
        (str(fifo), str(dst), 2, [f"journal {fifo} is not a regular file"]),
        (str(a), str(tmp_path), 2, [f"--into {tmp_path} is a directory, expected a journal file"]),
        (str(a), f"{notes}/x.sqlite", 2, [f"--into {notes}/x.sqlite: {notes} is a file, not a directory"]),
        (
            str(a),
            os.fsdecode(bytes(tmp_path) + b"/\xff.sqlite"),
            2,
            [f"--into {tmp_path}/\\xff.sqlite: not valid UTF-8"],
        ),
        (
            os.fsdecode(bytes(tmp_path) + b"/\xff.sqlite"),
            str(dst),
            2,
            [f"journal {tmp_path}/\\xff.sqlite: not valid UTF-8"],
        ),
    ]
    for src, into, code, what in cases:
        err = one_error(cli("journal", "merge", src, "--into", into), code, *what)
        assert not dst.exists() and not dst.parent.exists(), err
    assert not list(tmp_path.glob("*.merge-*"))
    # a source is left as it was: SQLite's read-only open of a damaged one made its -wal and -shm
    assert [*tmp_path.glob("cut.sqlite-*"), *tmp_path.glob("a.sqlite-*")] == [], list(tmp_path.iterdir())


def test_a_live_writer_on_a_source_is_refused_and_a_dead_lease_does_not_count(tmp_path, journals):
    a, b = journals
    dst = tmp_path / "dst.sqlite"
    with Journal.open(a) as j:  # this process holds a's lease, and captures r-new into a
        j.create_run(Run(id="r-new", agent="codex"))
        record(j, "r-new", 1)
        j.flush()
        err = one_error(cli("journal", "merge", str(b), str(a), "--into", str(dst)), 69, str(a))
        assert f"pid {os.getpid()}" in err and "being written" in err
        err = one_error(cli("journal", "merge", str(a), "--into", str(dst), "--run", "r-new"), 69, str(a))
        assert "it writes run r-new" in err
        assert not dst.exists()
        # the runs it does not write are whole: they may be merged while it captures r-new
        assert merge_journals([a], dst, runs={"r-a", "r-a2"}).runs == ["r-a", "r-a2"]
        dst.unlink()
    # a lease left open by a process that is gone: a's writer died with an exchange in flight
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    dead_pid = gone.pid
    with sqlite3.connect(a) as c:
        wid = c.execute("INSERT INTO writers(pid, host, started_ms, heartbeat_ms) VALUES (?, ?, 1, 1)",
                        (dead_pid, socket.gethostname())).lastrowid  # fmt: skip
        c.execute("UPDATE exchanges SET outcome = NULL, writer_id = ? WHERE run_id = 'r-a2'", (wid,))
    proc = cli("journal", "merge", str(a), "--into", str(dst), "--json")
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout)["runs"] == ["r-a", "r-a2", "r-child", "r-new"]
    # the exchange comes as the reaper writes it, the lease closed: dst's next writer reaps nothing
    assert rows(dst, "SELECT outcome FROM exchanges WHERE run_id = 'r-a2'") == [("incomplete",)]
    with Journal.open(dst) as j:
        assert j.reaped == []


KILLED_WRITER = """
import sqlite3, sys, time
from pvisor.journal.writer import Journal
from pvisor.journal.model import Run
j = Journal.open(sys.argv[1])
j.create_run(Run(id="r-k", agent="codex"))
j.record_exchange("r-k", "POST", "/v1/messages", [], status=200, request_body=b"{}", response_body=b"ok")
p = j.begin_exchange("r-k", "POST", "/v1/messages", [])
j.request_read(p, b'{"stream": true}')
chunks = []
j.response_started(p, 200, [("content-type", "text/event-stream")], chunks, True)
chunks += [b"data: 1\\n\\n", b"data: 2\\n\\n"]
while sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM response_parts").fetchone()[0] < 1:
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_run_of_a_killed_writer_comes_reaped_and_merging_it_again_is_harmless(tmp_path):
    """A source whose writer was SIGKILLed with a stream in flight: the run comes as a writer of
    DST would reap it (outcome incomplete, its parts joined, the lease closed), so DST's next
    writer reaps nothing and merging the source again, reaped meanwhile or not, skips the run
    (it was a clash once DST's writer had reaped its copy)."""
    src, dst, other = tmp_path / "src.sqlite", tmp_path / "dst.sqlite", tmp_path / "o.sqlite"
    script = tmp_path / "child.py"
    script.write_text(KILLED_WRITER)
    child = subprocess.Popen(
        [sys.executable, str(script), str(src)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(10)
        child.stdout.close()
    with Journal.open(other) as j:
        j.create_run(Run(id="r-o", agent="codex"))
        record(j, "r-o", 1)
    assert merge_journals([src], dst).runs == ["r-k"]
    query = "SELECT outcome, error, bytes_received FROM exchanges WHERE run_id = 'r-k' ORDER BY seq"
    copied = rows(dst, query)
    assert copied[1][0] == "incomplete" and "ended while the exchange was in flight" in copied[1][1], copied
    assert rows(dst, "SELECT count(*) FROM response_parts") == [(0,)]
    assert rows(dst, "SELECT count(*) FROM writers WHERE closed_ms IS NULL") == [(0,)]
    with Journal.open(dst) as j:
        assert j.reaped == []
    with JournalReader(dst) as r:
        ex = r.exchanges("r-k")[1]
        assert r.response_body(ex) == b"data: 1\n\ndata: 2\n\n"
        assert r.verify().ok
    again = merge_journals([src, other], dst)  # not reaped yet: the same run
    assert (again.skipped, again.runs) == (["r-k"], ["r-o"])
    with Journal.open(src) as j:  # src's own writer reaps it as the merge did
        assert len(j.reaped) == 1
    assert rows(src, query) == copied
    assert merge_journals([src], dst).skipped == ["r-k"]


def test_a_blob_that_does_not_decode_is_refused_as_a_missing_one_is(tmp_path, journals):
    """A body blob whose stored bytes no longer decode (journal verify: cannot be decoded) was
    merged with exit 0, and DST then failed verify: it is exit 3 naming the blob and the source."""
    a, _ = journals
    dst = tmp_path / "out" / "dst.sqlite"
    [(sha,)] = rows(a, "SELECT sha256 FROM blobs WHERE codec = 'zstd-prefix' ORDER BY rowid LIMIT 1")
    with sqlite3.connect(a) as c:
        c.execute("UPDATE blobs SET data = x'00112233' WHERE sha256 = ?", (sha,))
    err = one_error(
        cli("journal", "merge", str(a), "--into", str(dst)), 3, str(a), f"blob {sha}", "cannot be decoded"
    )
    assert "nothing merged" in err and not dst.exists()


def test_dry_run_lists_what_would_come_and_writes_nothing(tmp_path, journals):
    a, b = journals
    dst = tmp_path / "new" / "dst.sqlite"
    proc = cli("journal", "merge", str(a), str(b), "--into", str(dst), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"would copy run r-a from {a}: agent codex, mode capture, 3 exchanges, 1 snapshot"
    )
    assert f"would copy run r-b2 from {b}: agent codex, mode replay-only (from r-elsewhere@2)" in proc.stdout
    assert (
        "nothing merged (--dry-run)" in proc.stderr
        and "(would be created): 5 runs, 6 exchanges" in proc.stderr
    )
    assert not dst.parent.exists()
    assert merge_journals([a], dst, runs={"r-a"}).runs == ["r-a"]
    before = files_of(dst.parent, "dst")
    proc = cli("journal", "merge", str(a), str(b), "--into", str(dst), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = orjson.loads(proc.stdout)
    assert rep["dry_run"] and not rep["created"]
    assert (rep["runs"], rep["skipped"]) == (["r-a2", "r-child", "r-b", "r-b2"], ["r-a"])
    # r-b's request body and shared file are r-a's, in dst already
    assert rep["blobs_shared"] >= 2 and rep["blobs_copied"] > 0 and rep["bytes_copied"] > 0
    assert files_of(dst.parent, "dst") == before
    real = merge_journals([a, b], dst)
    assert (real.runs, real.blobs_copied, real.blobs_shared) == (
        rep["runs"],
        rep["blobs_copied"],
        rep["blobs_shared"],
    )


def test_a_real_run_reads_back_from_the_merged_journal_as_from_its_own(tmp_path, captured, journals):
    """A codex run captured by pvisor run (its snapshots, its steps), merged with another journal:
    show, steps and verify say the same of it in both, replay prepares the same prefix bytes from
    both, and its workspace restores from the merged journal."""
    cap = captured("codex")
    src = cap.journal
    dst = tmp_path / "merged.sqlite"
    proc = cli("journal", "merge", str(journals[0]), str(src), "--into", str(dst))
    assert proc.returncode == 0, proc.stderr
    for what in (["journal", "show", cap.run, "--json"], ["journal", "steps", cap.run, "--json"]):
        got = [cli("--journal", str(j), *what) for j in (src, dst)]
        assert got[0].returncode == got[1].returncode == 0 and got[0].stdout == got[1].stdout, what
    assert cli("--journal", str(dst), "journal", "verify").returncode == 0
    prefixes = []
    for j in (src, dst):
        out = tmp_path / f"prefix-{j.stem}"
        p = cli("--journal", str(j), "replay", "--agent", "codex", "--run", cap.run, "--after-step", "1",
                "--prepare-only", "--output", str(out), cwd=tmp_path)  # fmt: skip
        assert p.returncode == 0, p.stderr
        prefixes.append((out / "prefix.json").read_bytes())
    assert prefixes[0] == prefixes[1]
    restored = tmp_path / "restored"
    p = cli(
        "--journal", str(dst), "snapshot", "restore", cap.run, "--after-step", "2", "--into", str(restored)
    )
    assert p.returncode == 0, p.stderr
    assert {f: (restored / f).read_text() for f in ("a.txt", "b.txt", "c.txt")} == FILES


def test_a_source_of_an_older_schema_is_read_as_it_is_its_missing_columns_defaulted(tmp_path, journals):
    """A journal of schema 4 (before snapshots, response parts, capture): merged as it is, never
    migrated (a source is only read); DST's columns it lacks take their defaults."""
    old = tmp_path / "old.sqlite"
    conn = sqlite3.connect(old, isolation_level=None)
    MIGRATIONS.apply(Database(conn), stop_before="m005_snapshots")
    data = b'{"model": "m", "messages": []}'
    sha = hashlib.sha256(data).hexdigest()
    conn.execute("INSERT INTO meta VALUES ('journal_id', 'j-old'), ('fingerprint_key', 'aa')")
    wid = conn.execute(
        "INSERT INTO writers(pid, host, started_ms, heartbeat_ms, closed_ms, closed_how) "
        "VALUES (1, 'elsewhere', 5, 6, 7, 'closed')"
    ).lastrowid
    conn.execute("INSERT INTO runs(id, created_ms) VALUES ('r-old', 5)")
    conn.execute("INSERT INTO blobs VALUES (?, ?, 'identity', NULL, ?)", (sha, len(data), data))
    conn.execute(
        "INSERT INTO exchanges(id, run_id, seq, method, path, request_body, started_ms, outcome, writer_id) "
        "VALUES ('x-0000000000000001', 'r-old', 1, 'POST', '/v1/messages', ?, 5, 'ok', ?)",
        (sha, wid),
    )
    conn.execute(
        "INSERT INTO events(ts_ms, kind, run_id, writer_id) VALUES (5, 'run.created', 'r-old', ?)", (wid,)
    )
    conn.close()
    before = old.read_bytes()
    dst = tmp_path / "dst.sqlite"
    rep = merge_journals([old, journals[0]], dst)
    assert rep.runs == ["r-old", "r-a", "r-a2", "r-child"] and old.read_bytes() == before
    assert rows(dst, "SELECT capture, served_by, flags FROM exchanges WHERE run_id = 'r-old'") == [
        ("reverse", None, "[]")
    ]
    assert rows(dst, "SELECT w.host, w.closed_how FROM exchanges e JOIN writers w ON w.id = e.writer_id "
                "WHERE e.run_id = 'r-old'") == [("elsewhere", "closed")]  # fmt: skip
    with JournalReader(dst) as r:
        [ex] = r.exchanges("r-old")
        assert r.request_body(ex) == data and r.verify().ok


def test_more_sources_than_sqlite_attaches_merge_through_a_staging_journal(tmp_path, journals):
    """12 sources (SQLite attaches 10 databases at most): merged in one transaction on DST all
    the same; a clash between the 2nd and the 12th names those two files, not the staging
    journal; a run the same in two of them is copied once; a dry run leaves nothing beside DST."""
    srcs = []
    for i in range(12):
        path = tmp_path / f"w{i:02d}.sqlite"
        with Journal.open(path) as j:
            j.create_run(Run(id=f"r-w{i:02d}", agent="codex", created_ms=1000 + i))
            record(j, f"r-w{i:02d}", 2, b'{"choices": ["w"]}')  # one body in all of them
            j.flush()
        srcs.append(path)
    (tmp_path / "out").mkdir()
    dst = tmp_path / "out" / "all.sqlite"
    assert merge_journals([journals[0]], dst, runs={"r-a"}).runs == ["r-a"]
    before = files_of(dst.parent)
    rep = merge_journals(srcs, dst, dry_run=True)
    assert rep.runs == [f"r-w{i:02d}" for i in range(12)] and files_of(dst.parent) == before
    assert [d["source"] for d in rep.details] == [str(p) for p in srcs]
    rep = merge_journals([*srcs, journals[0]], dst)
    assert rep.runs == [*(f"r-w{i:02d}" for i in range(12)), "r-a2", "r-child"] and rep.skipped == ["r-a"]
    # the body all twelve send is r-a's second request: dst had it, nothing of it copied again
    assert rep.blobs_copied == 2 and rep.blobs_shared >= 13  # the answer all twelve got, r-a2's
    shared = hashlib.sha256(body(2)).hexdigest()
    assert rows(dst, "SELECT count(*) FROM blobs WHERE sha256 = ?", shared) == [(1,)]
    events = "SELECT count(*) FROM events WHERE run_id IS NOT NULL AND run_id != 'r-a'"
    assert rep.events == sum(rows(p, events)[0][0] for p in [*srcs, journals[0]])  # run.merged aside
    assert len(rows(dst, "SELECT 1 FROM events WHERE kind = 'run.merged'")) == 15
    assert [s["path"] for s in rep.sources] == [*map(str, srcs), str(journals[0])]
    assert not [p for p in dst.parent.iterdir() if "merge" in p.name]
    with JournalReader(dst) as r:
        assert r.verify().ok
    # a clash between the 2nd and the 12th source: one line naming them
    with Journal.open(srcs[11]) as j:
        j.create_run(Run(id="r-w01", agent="codex"))
        record(j, "r-w01", 9)
        j.flush()
    other = tmp_path / "other.sqlite"
    with pytest.raises(MergeClash) as info:
        merge_journals(srcs, other)
    assert info.value.files == (str(srcs[1]), str(srcs[11])) and not other.exists()
    assert not [p for p in tmp_path.iterdir() if "merge" in p.name]


def test_a_full_file_system_is_exit_74_and_leaves_no_journal_behind(tmp_path, small_fs):
    src = tmp_path / "big.sqlite"
    with Journal.open(src) as j:
        j.create_run(Run(id="r-big", agent="codex"))
        j.record_exchange("r-big", "POST", "/v1/x", [], status=200, request_body=os.urandom(600_000))
        j.flush()
    full = small_fs("400k")
    dst = full / "dst.sqlite"
    proc = cli("journal", "merge", str(src), "--into", str(dst))
    one_error(proc, 74, f"journal {dst}: no room on its file system")
    assert list(full.iterdir()) == []


def ctrl_c_at(function: str, nth: int = 1, sig: int = signal.SIGINT):
    """A real signal ``sig`` (SIGINT: Ctrl-C) sent to this process when
    ``pvisor.journal.merge.<function>`` is entered (resumed, for a generator) the ``nth`` time:
    at that point of the merge (the handler raises KeyboardInterrupt there)."""
    calls = []

    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_name == function and "merge" in frame.f_code.co_filename:
            calls.append(1)
            if len(calls) == nth:
                sys.settrace(None)
                os.kill(os.getpid(), sig)
        return None

    return trace


@pytest.mark.parametrize(
    "at, code, said",
    [
        ("_copy", 130, "journal merge {how} before its commit: nothing merged; {dst} {was}"),
        ("_to_wal", 0, "journal merge {how} after its commit: the merge into {dst} is complete"),
    ],
)
@pytest.mark.parametrize(
    "new, sig",
    [(True, signal.SIGINT), (False, signal.SIGINT), (True, signal.SIGTERM), (False, signal.SIGHUP)],
)
def test_ctrl_c_says_whether_the_merge_committed(tmp_path, journals, at, code, said, new, sig):
    """Before: ``pvisor: aborted`` (exit 130) whether or not the runs were merged; SIGTERM and
    SIGHUP killed it and left the new DST's temporary journal beside it: they are handled as
    Ctrl-C is (exit 143, 129 before the commit)."""
    a, _ = journals
    how = "interrupted" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
    code = 128 + sig if code == 130 else code
    dst = tmp_path / "dst.sqlite"
    if not new:
        with Journal.open(dst) as j:
            j.create_run(Run(id="r-there", agent="codex"))
    nth = 1
    if at == "_to_wal" and not new:  # a DST there has no link, no WAL switch: the sources' cleanup, last
        at, nth = "_as_found", 2
    before = files_of(tmp_path, "dst")
    sys.settrace(ctrl_c_at(at, nth, sig))
    try:
        proc = cli("journal", "merge", str(a), "--into", str(dst))
    finally:
        sys.settrace(None)
    assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
    was = "does not exist (not created)" if new else "is as it was"
    assert proc.stderr.splitlines()[-1].endswith(said.format(how=how, dst=dst, was=was)), proc.stderr
    assert not list(tmp_path.glob(".dst.sqlite.merge-*"))
    runs = rows(dst, "SELECT id FROM runs ORDER BY id") if dst.exists() else []
    if code != 0:
        assert (files_of(tmp_path, "dst") == before) and ("aborted" not in proc.stderr)
    else:
        assert proc.stdout.startswith("copied run r-a ") and ("r-a",) in runs, proc.stdout


def test_a_killed_merges_temporary_journals_are_removed_by_the_next_merge_into_that_dst(tmp_path, journals):
    """SIGKILL during a merge into a new DST left ``.DST.merge-PID-HEX`` (and its ``-journal``)
    beside it for good (417 MB for the attacker): the next merge into DST removes those of this
    host whose process is gone; a live merge's, another host's and other files stay."""
    a, _ = journals
    dst = tmp_path / "dst.sqlite"
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
    dead, me = f"{host}-{gone.pid}", f"{host}-{os.getpid()}"
    stale = [f".dst.sqlite.merge-{dead}-0123abcd", f".dst.sqlite.merge-{dead}-0123abcd-journal",
             f".pvisor-merge-{dead}-89abcdef.sqlite", f".dst.sqlite.merge-{dead}-4567cdef-wal"]  # fmt: skip
    kept = [f".dst.sqlite.merge-{me}-0123abcd", f".dst.sqlite.merge-elsewhere-{gone.pid}-0123abcd",
            f".other.sqlite.merge-{dead}-0123abcd", f".dst.sqlite.merge-{gone.pid}-0123abcd"]  # fmt: skip
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x" * 100)
    assert merge_journals([a], dst).runs
    left = {p.name for p in tmp_path.glob(".*")}
    assert left == set(kept), left


def test_into_a_dangling_link_creates_its_target_or_says_it_is_one(tmp_path, journals):
    """``--into`` a symbolic link to nothing yet failed 'journal dang.sqlite does not exist' (exit
    2) although DST is created when missing: the link's target is created (the link kept); a
    link whose target's directory does not exist is refused in one line saying what it is."""
    a, _ = journals
    link, target = tmp_path / "dang.sqlite", tmp_path / "real" / "merged.sqlite"
    link.symlink_to(target)
    err = one_error(
        cli("journal", "merge", str(a), "--into", str(link)), 2, str(link), "dangling symbolic link"
    )
    assert str(target) in err and not target.parent.exists()
    target.parent.mkdir()
    proc = cli("journal", "merge", str(a), "--into", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert ("r-a",) in rows(target, "SELECT id FROM runs") and "(created)" in proc.stdout
    assert merge_journals([a], link).skipped  # merging again through the link: all there
    assert sorted(p.name for p in target.parent.iterdir()) == ["merged.sqlite"]


def test_omit_blobs_leaves_out_what_the_destination_holds_and_merging_it_elsewhere_says_so(
    tmp_path, journals
):
    """A transfer journal (a Ray worker's derived runs sent back): ``omit_blobs`` leaves out the
    blobs its source journal held, though the derived runs name them (their requests repeat the
    source's, their snapshots list its files); merged into a journal that holds them, the runs
    read back whole; into one that does not, it fails saying why, and nothing is merged."""
    a = journals[0]
    with Journal.open(a) as j:  # r-a2 (derived from r-a): a snapshot sharing r-a's files, and a new one
        snapshot(j, "r-a2", "s-a200000000000001", {"shared.txt": SHARED_FILE, "new.txt": b"new " * 50})
        # and one of the workspace r-a's snapshot holds: its manifest is r-a's, kept (merging reads it)
        snapshot(j, "r-a2", "s-a200000000000002", {"shared.txt": SHARED_FILE, "only-a.txt": b"a " * 90})
        j.flush()
    source = tmp_path / "source.sqlite"  # what the driver sent: r-a with what it needs
    merge_journals([a], source, runs={"r-a"})
    held = {sha for (sha,) in rows(source, "SELECT sha256 FROM blobs")}
    whole, back = tmp_path / "whole.sqlite", tmp_path / "back.sqlite"
    merge_journals([a], whole, runs={"r-a2"})
    rep = merge_journals([a], back, runs={"r-a2"}, omit_blobs=held)
    kept = {sha for (sha,) in rows(back, "SELECT sha256 FROM blobs")}
    manifests = {m for (m,) in rows(a, "SELECT manifest FROM snapshots WHERE run_id = 'r-a2'")}
    assert rep.blobs_omitted > 0 and kept & held == manifests & held != set() and kept
    assert sum(n for (n,) in rows(back, "SELECT length(data) FROM blobs")) < sum(
        n for (n,) in rows(whole, "SELECT length(data) FROM blobs")
    )
    assert rows(back, "SELECT value FROM meta WHERE key = 'blobs_left_out'") == [("1",)]
    elsewhere = tmp_path / "elsewhere.sqlite"
    with pytest.raises(Exception, match="leaves out blobs its runs name") as raised:
        merge_journals([back], elsewhere)
    assert raised.value.exit_code == 3 and not elsewhere.exists()
    got = merge_journals([back], source)
    assert got.runs == ["r-a2"]
    theirs = {e for (e,) in rows(a, "SELECT id FROM exchanges WHERE run_id = 'r-a2'")}
    want = {k: v for k, v in bodies(a).items() if k in theirs}
    assert {k: v for k, v in bodies(source).items() if k in want} == want
    with JournalReader(source) as r:
        files = [
            {e["path"]: r.blob(e["sha256"]) for e in orjson.loads(r.blob(snap.digest))["entries"]}
            for snap in r.snapshots("r-a2")
        ]
    assert files == [
        {"shared.txt": SHARED_FILE, "new.txt": b"new " * 50},
        {"shared.txt": SHARED_FILE, "only-a.txt": b"a " * 90},
    ]
