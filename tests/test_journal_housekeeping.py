"""``pvisor journal sql``, ``rm`` and ``vacuum`` (issue 20) on real journal files written by the
real writer, through the real command.

Bodies are shared between runs (content-addressed) and stored as prefix frames against earlier
bodies of their lane: removing a run must keep every blob another run names and every base such
a blob is restored from, and the other run must read back byte for byte.

The command runs in this process (tests/cli_helpers.py) where a test reads its output; as the
``pvisor`` process where the exit code of the process itself is the point (bad input, Ctrl-C)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from cli_helpers import pvisor_main
from gateway_helpers import poll
from journal_helpers import snapshot

from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

PVISOR = [sys.executable, "-m", "pvisor"]
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}


def cli(journal: Path, *args: str, process: bool = False):
    """``pvisor --journal JOURNAL ARGS`` in this process; with ``process``, as its own process."""
    if process:
        return subprocess.run(
            [*PVISOR, "--journal", str(journal), *args], capture_output=True, text=True, env=ENV, timeout=120
        )
    return pvisor_main(["--journal", str(journal), *args], env=ENV, text=True)


def body(n: int) -> bytes:
    """The n-th request of a conversation: each repeats the one before and adds to it."""
    messages = [{"role": "user", "content": f"message {i} " + "x" * 300} for i in range(n)]
    return orjson.dumps({"model": "m", "messages": messages})


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    """Run ``r-a``: three requests of one lane (prefix frames) and a snapshot; run ``r-b``: one
    request equal to r-a's second (so the blob r-a stored against its first), a snapshot sharing
    a file with r-a's; r-a has a run directory."""
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-a", agent="codex"))
        for n in (1, 2, 3):
            j.record_exchange("r-a", "POST", "/v1/chat/completions", [], protocol="openai-chat", status=200,
                              request_body=body(n), response_body=b'{"choices": []}' + b" " * n)  # fmt: skip
        snapshot(j, "r-a", "s-a000000000000001", {"shared.txt": b"shared " * 40, "only-a.txt": b"a " * 90})
        j.create_run(Run(id="r-b", agent="codex"))
        j.record_exchange("r-b", "POST", "/v1/chat/completions", [], protocol="openai-chat", status=200,
                          request_body=body(2), response_body=b'{"choices": ["b"]}')  # fmt: skip
        snapshot(j, "r-b", "s-b000000000000001", {"shared.txt": b"shared " * 40})
        j.flush()
    run_dir = tmp_path / "runs" / "r-a" / "home"
    run_dir.mkdir(parents=True)
    (run_dir / "session.jsonl").write_text("{}\n")
    return path


def blob_shas(path: Path) -> set[str]:
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT sha256 FROM blobs")}


def test_rm_of_one_of_two_runs_sharing_blobs_leaves_the_other_byte_exact(two_runs: Path):
    with JournalReader(two_runs) as r:
        [b_ex] = r.exchanges("r-b")
        before = (r.request_body(b_ex), r.response_body(b_ex))
        a_exchanges = r.exchanges("r-a")
        first_a, last_a = a_exchanges[0].request_body, a_exchanges[2].request_body
        with sqlite3.connect(two_runs) as c:
            codec, base = c.execute(
                "SELECT codec, base FROM blobs WHERE sha256 = ?", (b_ex.request_body,)
            ).fetchone()
    # r-b's body is r-a's second, stored as a prefix frame against r-a's first
    assert (codec, base) == ("zstd-prefix", first_a)
    proc = cli(two_runs, "journal", "rm", "r-a", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert (rep["run"], rep["attempts"], rep["exchanges"], rep["snapshots"]) == ("r-a", 0, 3, 1)
    assert rep["run_dir"] == str(two_runs.parent / "runs" / "r-a")
    assert not (two_runs.parent / "runs" / "r-a").exists()
    left = blob_shas(two_runs)
    assert b_ex.request_body in left and first_a in left  # named by r-b, and its base
    assert last_a not in left  # r-a's own
    assert hashlib.sha256(b"a " * 90).hexdigest() not in left
    assert hashlib.sha256(b"shared " * 40).hexdigest() in left  # r-b's snapshot lists it
    assert rep["blobs_removed"] >= 4 and rep["bytes_freed"] > 0
    with JournalReader(two_runs) as r:
        assert [run.id for run in r.runs()] == ["r-b"]
        [b_ex] = r.exchanges("r-b")
        assert (r.request_body(b_ex), r.response_body(b_ex)) == before
        report = r.verify()
        assert report.ok, report.problems
    assert cli(two_runs, "journal", "verify").returncode == 0
    restored = two_runs.parent / "restored"
    proc = cli(two_runs, "snapshot", "restore", "r-b", "--after-step", "0", "--into", str(restored))
    assert proc.returncode == 0, proc.stderr
    assert (restored / "shared.txt").read_bytes() == b"shared " * 40
    human = cli(two_runs, "journal", "rm", "r-b")
    assert human.returncode == 0 and human.stdout.startswith("removed run r-b: 0 attempts, 1 exchange, ")
    assert blob_shas(two_runs) == set()  # nothing names anything now


def test_rm_refuses_while_a_writer_holds_the_journal_unless_forced(two_runs: Path):
    with Journal.open(two_runs) as j:  # this process's lease is live
        j.flush()
        proc = cli(two_runs, "journal", "rm", "r-a")
        assert proc.returncode == 69
        assert f"pid {os.getpid()}" in proc.stderr and "--force" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        vac = cli(two_runs, "journal", "vacuum")
        assert vac.returncode == 69 and "--force" in vac.stderr
        forced = cli(two_runs, "journal", "rm", "r-a", "--force")
        assert forced.returncode == 0, forced.stderr
    with JournalReader(two_runs) as r:
        assert [run.id for run in r.runs()] == ["r-b"] and r.verify().ok


def test_vacuum_gives_the_space_of_a_removed_run_back(tmp_path: Path):
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        for run in ("r-big", "r-small"):
            j.create_run(Run(id=run))
        for i in range(40):  # incompressible bodies: their pages are what vacuum frees
            j.record_exchange("r-big", "POST", f"/v1/x{i}", [], status=200, request_body=os.urandom(40_000))
        j.record_exchange("r-small", "POST", "/v1/y", [], status=200, request_body=b"small " * 30)
        j.flush()
    assert cli(path, "journal", "rm", "r-big").returncode == 0
    proc = cli(path, "journal", "vacuum", "--json")
    assert proc.returncode == 0, proc.stderr
    sizes = json.loads(proc.stdout)
    assert sizes["before"] > 1_500_000 and sizes["after"] < 200_000, sizes
    assert not os.path.exists(f"{path}-wal") or os.path.getsize(f"{path}-wal") == 0
    assert cli(path, "journal", "verify").returncode == 0


def test_rm_takes_a_whole_id_or_a_prefix_with_prefix_and_dry_run_removes_nothing(
    two_runs: Path, tmp_path: Path
):
    """``rm r-`` removed the only run of a journal, ``rm r-1`` one not meant (issue 35 item 12):
    a unique prefix, which the reading commands take, no longer removes anything; ``--prefix``
    removes every run it starts, each listed, and ``--dry-run`` lists them and removes nothing."""
    one = tmp_path / "one.sqlite"
    with Journal.open(one) as j:
        j.create_run(Run(id="r-only", agent="codex"))
        j.flush()
    for journal, given in ((one, "r-"), (one, "r-onl"), (two_runs, "r")):
        proc = cli(journal, "journal", "rm", given)
        assert proc.returncode == 2 and "rm takes a whole run id, or --prefix" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    with JournalReader(one) as r:
        assert [run.id for run in r.runs()] == ["r-only"]
    dry = cli(two_runs, "journal", "rm", "r-", "--prefix", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()] == [
        "would remove run r-a",
        "would remove run r-b",
    ]
    assert "3 exchanges" in dry.stdout and dry.stderr == "nothing removed (--dry-run): 2 runs would go\n"
    listed = json.loads(cli(two_runs, "journal", "rm", "r-b", "--dry-run", "--json").stdout)
    assert [(s["id"], s["exchanges"]) for s in listed] == [("r-b", 1)]
    with JournalReader(two_runs) as r:
        assert [run.id for run in r.runs()] == ["r-a", "r-b"]  # a dry run removes nothing
    assert (two_runs.parent / "runs" / "r-a").is_dir()
    nothing = cli(two_runs, "journal", "rm", "r-z", "--prefix")
    assert nothing.returncode == 2 and "no run id starts with 'r-z'" in nothing.stderr
    gone = cli(two_runs, "journal", "rm", "r-", "--prefix", "--json")
    assert gone.returncode == 0, gone.stderr
    assert [(rep["run"], rep["exchanges"]) for rep in json.loads(gone.stdout)] == [("r-a", 3), ("r-b", 1)]
    with JournalReader(two_runs) as r:
        assert r.runs() == [] and r.verify().ok
    assert blob_shas(two_runs) == set()


def test_rm_and_vacuum_bad_input_get_one_line(two_runs: Path, tmp_path: Path):
    """The exit codes of the ``pvisor`` process itself."""
    for args, code, said in [
        (["journal", "rm", "r-nope"], 2, "no run 'r-nope'"),
        (["journal", "rm", "r-"], 2, "it is the start of r-a, r-b: rm takes a whole run id, or --prefix"),
        (["journal", "rm", ""], 2, "empty"),
    ]:
        proc = cli(two_runs, *args, process=True)
        assert proc.returncode == code and said in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    notes = tmp_path / "notes.txt"
    notes.write_text("not a journal\n")
    for args in (["journal", "rm", "r-a"], ["journal", "vacuum"]):
        proc = cli(notes, *args, process=True)
        assert proc.returncode == 65 and "not a pvisor journal" in proc.stderr, proc.stderr
        assert notes.read_text() == "not a journal\n"
    missing = cli(tmp_path / "none.sqlite", "journal", "vacuum", process=True)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not (tmp_path / "none.sqlite").exists()


# --------------------------------------------------------------------------- journal sql


def test_sql_reads_bodies_through_the_functions_and_views(two_runs: Path):
    with JournalReader(two_runs) as r:
        exchanges = r.exchanges("r-a")
        want = [r.request_body(e).decode() for e in exchanges]
    proc = cli(two_runs, "journal", "sql", "--json",
               "SELECT seq, request, json_array_length(request, '$.messages') AS n FROM exchange_bodies "
               "WHERE run_id = 'r-a' ORDER BY seq")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [row["request"] for row in rows] == want and [row["n"] for row in rows] == [1, 2, 3]
    summary = json.loads(
        cli(two_runs, "journal", "sql", "--json", "SELECT * FROM run_summary ORDER BY id").stdout
    )
    assert [(s["id"], s["exchanges"], s["attempts"]) for s in summary] == [("r-a", 3, 0), ("r-b", 1, 0)]
    # bytes: pvisor_body gives them; binary ones are base64 in JSON and CSV, "<N bytes>" in the table
    binary = "SELECT pvisor_body(sha256) AS b FROM blobs WHERE sha256 = '{}'"
    with Journal.open(two_runs) as j:
        j.record_exchange("r-b", "POST", "/v1/bin", [], status=200, request_body=b"\xff\xfe" * 50)
        j.flush()
    sha = hashlib.sha256(b"\xff\xfe" * 50).hexdigest()
    [row] = json.loads(cli(two_runs, "journal", "sql", "--json", binary.format(sha)).stdout)
    assert base64.b64decode(row["b"]["encoded"]) == b"\xff\xfe" * 50 and row["b"]["$base64"] is True
    csv = cli(two_runs, "journal", "sql", "--csv", binary.format(sha)).stdout.splitlines()
    assert csv[0] == "b" and base64.b64decode(csv[1].removeprefix("base64:")) == b"\xff\xfe" * 50
    table = cli(two_runs, "journal", "sql", binary.format(sha))
    assert table.stdout.splitlines() == ["b", "<100 bytes>"] and table.stderr == "1 row\n"
    text = cli(
        two_runs,
        "journal",
        "sql",
        "SELECT pvisor_json(request_body) IS NULL AS binary FROM exchanges WHERE path = '/v1/bin'",
    )
    assert text.stdout.splitlines()[1] == "1"


def test_sql_refuses_writes_and_names_bad_queries_and_damage(two_runs: Path):
    for query, said in [
        ("DELETE FROM runs", "only reads the journal"),
        ("SELEC 1", 'near "SELEC": syntax error'),
        ("SELECT 1; SELECT 2", "one statement at a time"),
        ("   ", "the query is empty"),
        ("SELECT * FROM nope", "no such table: nope"),
    ]:
        proc = cli(two_runs, "journal", "sql", query)
        assert proc.returncode == 2 and said in proc.stderr, (query, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert cli(two_runs, "journal", "sql", "--json", "--csv", "SELECT 1").returncode == 2
    with JournalReader(two_runs) as r:
        [b_ex] = r.exchanges("r-b")
    with sqlite3.connect(two_runs) as c:
        c.execute("UPDATE blobs SET data = x'00ff' WHERE sha256 = ?", (b_ex.response_body,))
    proc = cli(two_runs, "journal", "sql", "SELECT response FROM exchange_bodies WHERE run_id = 'r-b'")
    assert proc.returncode == 3 and b_ex.response_body in proc.stderr, proc.stderr
    with JournalReader(two_runs) as r:
        assert [run.id for run in r.runs()] == ["r-a", "r-b"]  # read only: nothing else changed


def test_sql_is_read_only_for_attach_vacuum_into_and_pragmas_that_set(two_runs: Path):
    """``journal sql``, documented read-only, ran ``VACUUM INTO`` and ``ATTACH`` (each writes a
    file) with exit 0, and said "disk I/O error" for ``PRAGMA journal_mode=DELETE`` (issue 35
    item 13): every statement that would write a file or change state is refused before it runs,
    in one line naming it, exit 2; pragmas that read still answer."""
    folder = two_runs.parent
    assert cli(two_runs, "journal", "sql", "SELECT 1").returncode == 0  # a reader's -wal and -shm
    before = sorted(p.name for p in folder.iterdir())
    journal_bytes = two_runs.read_bytes()
    for query, refused in [
        (f"VACUUM INTO '{folder / 'copy.sqlite'}'", "VACUUM"),
        (f"ATTACH '{folder / 'other.sqlite'}' AS other", "ATTACH"),
        ("PRAGMA journal_mode=DELETE", "PRAGMA journal_mode=DELETE"),
        ("PRAGMA wal_checkpoint(TRUNCATE)", "PRAGMA wal_checkpoint=TRUNCATE"),
        ("CREATE TEMP TABLE t AS SELECT * FROM runs", "CREATE"),
        ("BEGIN EXCLUSIVE", "BEGIN"),
    ]:
        proc = cli(two_runs, "journal", "sql", query)
        assert proc.returncode == 2, (query, proc.stderr)
        assert proc.stderr.startswith(
            f"pvisor: error: journal sql only reads the journal: {refused} is refused"
        )
        assert proc.stderr.count("\n") == 1 and proc.stdout == "", (query, proc.stderr)
    assert sorted(p.name for p in folder.iterdir()) == before  # no copy, no attached file
    assert two_runs.read_bytes() == journal_bytes
    for query, first in [
        ("PRAGMA journal_mode", ["wal"]),
        ("PRAGMA table_info(runs)", [0, "id"]),
        ("SELECT name FROM pragma_table_info('runs') WHERE cid = 0", ["id"]),
    ]:
        proc = cli(two_runs, "journal", "sql", "--json", query)
        assert proc.returncode == 0, (query, proc.stderr)
        assert list(json.loads(proc.stdout)[0].values())[: len(first)] == first, proc.stdout


def test_rm_and_scrub_refuse_a_run_id_that_climbs_out_of_runs(tmp_path: Path):
    """A crafted run row ``r/../../victim`` (``runs/r`` exists) made ``rm --prefix r`` rmtree
    ``<data dir>/victim`` (issue 35, attack F3): the id is not a run id, so rm and scrub say so in
    one line, exit 3, and change nothing, in the journal or on disk."""
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r-real").mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "file").write_text("precious")
    both, crafted_only = tmp_path / "journal.sqlite", tmp_path / "other.sqlite"
    for path, real in ((both, "r-real"), (crafted_only, "x-real")):
        with Journal.open(path) as j:
            j.record_exchange(real, "POST", "/v1/messages", [], status=200, request_body=b"{}")
        with sqlite3.connect(path) as conn:
            conn.execute("INSERT INTO runs(id, created_ms) VALUES ('r/../../victim', 1)")
        conn.close()
    for path, args in (
        (both, ["rm", "--prefix", "r"]),
        (both, ["rm", "--prefix", "r", "--dry-run"]),
        (crafted_only, ["scrub", "precious", "--run", "r"]),
    ):
        proc = cli(path, "journal", *args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "run 'r/../../victim' has an id that is not a run id" in proc.stderr, (args, proc.stderr)
        assert (tmp_path / "victim" / "file").read_text() == "precious"
        assert (tmp_path / "runs" / "r-real").is_dir()
    for path, real in ((both, "r-real"), (crafted_only, "x-real")):
        with JournalReader(path) as reader:
            assert {s["id"] for s in reader.run_summaries()} == {real, "r/../../victim"}


def test_sql_refuses_functions_that_change_state_or_hand_out_pointers(two_runs: Path):
    """``SELECT fts3_tokenizer('simple', x'41...')`` exited 0 and replaced the connection's
    tokenizer pointer, and the one-argument form printed a native pointer (issue 35 attacks):
    the authorizer refuses such a function before the statement runs, in one line, exit 2."""
    for query, function in [
        ("SELECT hex(fts3_tokenizer('simple'))", "fts3_tokenizer"),
        ("SELECT hex(FTS3_TOKENIZER('simple', x'4141414141414141'))", "fts3_tokenizer"),
        ("SELECT load_extension('/nonexistent')", "load_extension"),
        ("SELECT fts5(NULL)", "fts5"),
    ]:
        proc = cli(two_runs, "journal", "sql", query)
        assert proc.returncode == 2, (query, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(
            f"pvisor: error: journal sql only reads the journal: the function {function}() is refused"
        ), (query, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stdout == "", (query, proc.stderr)
    assert cli(two_runs, "journal", "sql", "SELECT hex(randomblob(4)), upper('x')").returncode == 0


def test_sql_with_a_byte_that_is_not_utf8_gets_one_line_naming_it(two_runs: Path):
    """A query from the shell with a byte that is not UTF-8 (``$'SELECT \\'\\xff\\''``, or one in
    a comment) once ended in a UnicodeEncodeError traceback, exit 1."""
    for query, byte in ((b"SELECT '\xff'", "\\xff"), (b"SELECT 1 -- caf\xe9", "\\xe9")):
        proc = pvisor_main(["--journal", str(two_runs), "journal", "sql", query], env=ENV)
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "Traceback" not in err and err.count("\n") == 1
        assert f"byte {byte} at character" in err and "not UTF-8" in err


def test_ctrl_c_stops_a_long_sql_query_with_exit_130(two_runs: Path):
    """SIGINT once left an endless recursive query running (only SIGKILL stopped it): SQLite's
    loop never returned to Python for the default handler to raise KeyboardInterrupt."""
    query = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"
    proc = subprocess.Popen(
        [*PVISOR, "--journal", str(two_runs), "journal", "sql", query],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    try:

        def querying() -> bool:
            # the journal is open: the query runs (or is about to; a SIGINT before it also ends it)
            fds = Path(f"/proc/{proc.pid}/fd")
            try:
                return any(os.readlink(fd).endswith("journal.sqlite") for fd in fds.iterdir())
            except OSError:
                return False

        poll(querying, "journal sql opened the journal")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # a generous deadline: it stops within ms
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.decode().strip() == "pvisor: aborted" and out == b""


def test_verify_names_a_missing_file_blob_of_a_snapshot_manifest(two_runs: Path, tmp_path: Path):
    """A blob that a snapshot's manifest lists (a file of the workspace) is a reference: verify
    once said ok without it, and snapshot restore failed later with 'blob ... is missing'."""
    gone = hashlib.sha256(b"a " * 90).hexdigest()  # only-a.txt of r-a's snapshot
    with sqlite3.connect(two_runs) as c:
        assert c.execute("DELETE FROM blobs WHERE sha256 = ?", (gone,)).rowcount == 1
    c.close()
    proc = cli(two_runs, "journal", "verify")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"run r-a: snapshot s-a000000000000001: file 'only-a.txt': blob {gone} is missing" in (
        proc.stdout + proc.stderr
    )
    restore = cli(two_runs, "snapshot", "restore", "r-a", "--after-step", "0", "--into", str(tmp_path / "r"))
    assert restore.returncode == 3 and "is missing" in restore.stderr  # what verify now says first


def test_ids_are_looked_up_with_their_case(tmp_path: Path):
    """LIKE ignores the case of ASCII letters: ``show SNAPRUN`` once showed ``snaprun``, and
    ``show case-`` listed ``Case-A`` among the runs it starts."""
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        for rid in ("Case-A", "case-a", "case-ab"):
            j.create_run(Run(id=rid, agent="codex"))
        ex = j.record_exchange("case-ab", "POST", "/v1/chat/completions", [], protocol="openai-chat",
                               status=200, request_body=b"{}", response_body=b"{}")  # fmt: skip
        j.flush()
    shown = cli(path, "journal", "show", "Case-A", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["run"]["id"] == "Case-A", shown.stderr
    # a whole id first, though case-ab starts with it
    exact = cli(path, "journal", "show", "case-a", "--json")
    assert exact.returncode == 0 and json.loads(exact.stdout)["run"]["id"] == "case-a", exact.stderr
    prefix = cli(path, "journal", "show", "Case-", "--json")
    assert prefix.returncode == 0 and json.loads(prefix.stdout)["run"]["id"] == "Case-A", prefix.stderr
    for wrong in ("CASE-A", "CASE-"):
        proc = cli(path, "journal", "show", wrong)
        assert proc.returncode == 2 and f"no run {wrong!r}" in proc.stderr, proc.stderr
    ambiguous = cli(path, "journal", "show", "case-")
    assert ambiguous.returncode == 2 and "case-a, case-ab" in ambiguous.stderr
    assert "Case-A" not in ambiguous.stderr
    assert cli(path, "journal", "body", ex.upper(), "--response").returncode == 2
    assert cli(path, "journal", "body", ex, "--response").stdout == "{}"


def test_rm_of_a_run_a_gateway_wrote_on_after_a_forced_rm_removes_its_exchanges(stack):
    """``rm --force`` while a gateway writes the run: the gateway journals the next exchange of
    the run whose row is gone; verify then reported it for ever and rm said 'no run'. rm of that
    whole id now removes those rows, and the journal verifies again."""
    from gateway_helpers import http_request
    from test_gateway_snapshots import Answer

    gw = stack.gateway({}, responder=Answer())
    assert http_request(gw.url, "POST", "/v1/messages", b'{"model":"m","messages":[]}')[0] == 200
    stack.drain(gw)
    forced = cli(gw.journal_path, "journal", "rm", gw.run, "--force")
    assert forced.returncode == 0, forced.stderr
    assert http_request(gw.url, "POST", "/v1/messages", b'{"model":"m","messages":[1]}')[0] == 200
    stack.drain(gw)
    with sqlite3.connect(gw.journal_path) as c:  # a run its id starts: never taken for it
        c.execute("INSERT INTO runs(id, created_ms) VALUES (?, 1)", (gw.run + "x",))
    c.close()
    stale = cli(gw.journal_path, "journal", "verify")
    assert stale.returncode == 3 and "its run is missing" in stale.stdout + stale.stderr
    dry = cli(gw.journal_path, "journal", "rm", gw.run, "--dry-run")
    assert dry.returncode == 0 and f"would remove run {gw.run}: " in dry.stdout, dry.stderr
    again = cli(gw.journal_path, "journal", "rm", gw.run, "--force", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["exchanges"] == 1
    assert cli(gw.journal_path, "journal", "verify").returncode == 0
    with JournalReader(gw.journal_path) as r:
        assert [run.id for run in r.runs()] == [gw.run + "x"]
