"""``pvisor journal scrub`` (issue 20) on real journal files written by the real writer, and on
a copy of a real Qwen Code capture, through the real command.

A leaked key sits in every request after the tool output that showed it (each repeats the
conversation), and those bodies are zstd frames against the previous one: after the scrub no
byte of the key may be in the journal file, its WAL or the run directories, every body must read
back as it was with the key replaced, the bodies that never held it keep their sha256, and the
journal verifies.

The command runs in this process (tests/cli_helpers.py) where a test reads its output; as the
``pvisor`` process where the exit code of the process itself is the point (bad input, damage)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from cli_helpers import pvisor_main
from journal_helpers import snapshot

from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

PVISOR = [sys.executable, "-m", "pvisor"]
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
SECRET = "sk-live-7Qw9Zx3Lm2Pv8Rt5Yb"
#: a password with non-ASCII letters, as Python's json.dumps writes it (\u00e4)
UMLAUT = "pässwörd-31337"
SCRUBBED = "[scrubbed]"
LANE = "/v1/chat/completions"
LEAK_AT = 5  # the tool output of request 5 shows the key; every later request repeats it
REQUESTS = 40  # past the keyframe at lane position 32


def cli(journal: Path, *args: str | bytes, stdin: str | None = None, process: bool = False):
    """The real command, in this process (with ``process``: as its own process); an argument
    given as bytes reaches it as those bytes (not UTF-8 maybe)."""
    if process:
        return subprocess.run(
            [*PVISOR, "--journal", str(journal), *args],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            env=ENV,
            timeout=300,
            input=stdin,
        )
    return pvisor_main(
        ["--journal", str(journal), *args], env=ENV, input=stdin, text=True, errors="surrogateescape"
    )


def request(n: int, secret: str = SECRET) -> bytes:
    """The n-th request of a conversation (each repeats the one before); from LEAK_AT on it holds
    a tool output with the key, and the model's tool call naming it in its JSON arguments."""
    messages = [{"role": "user", "content": f"message {i} " + "x" * 200} for i in range(n)]
    if n > LEAK_AT:
        messages.insert(LEAK_AT, {"role": "tool", "content": f"OPENAI_API_KEY={secret}\n"})
        args = json.dumps({"command": f"curl -H 'Authorization: Bearer {secret}' https://x"})
        messages.insert(LEAK_AT, {"role": "assistant", "tool_calls": [{"function": {"arguments": args}}]})
    return orjson.dumps({"model": "m", "messages": messages})


def in_bytes(path: Path, text: str) -> bool:
    return text.encode() in path.read_bytes()


def everywhere(data_dir: Path, text: str) -> list[str]:
    """Every file under ``data_dir`` (the journal, its WAL, the run directories) holding ``text``
    as bytes."""
    return [str(p) for p in sorted(data_dir.rglob("*")) if p.is_file() and in_bytes(p, text)]


@pytest.fixture
def leaked(tmp_path: Path) -> Path:
    """Run ``r-leak``: 40 requests of one lane, the key in those after LEAK_AT, a gzip-encoded
    response quoting it, an error and a label naming it, a snapshot of a workspace whose settings
    file holds it, a run directory with a text file and an SQLite file holding it. Run ``r-other``:
    one request equal to r-leak's 8th (the same blob), one of its own with the key, and a body
    with the non-ASCII password JSON-escaped."""
    data = tmp_path / "data"
    path = data / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-leak", agent="qwen-code", labels={"note": f"leaked {SECRET} here"}))
        for n in range(1, REQUESTS + 1):
            reply = orjson.dumps({"choices": [{"message": {"content": f"saw {SECRET}" if n == 7 else "ok"}}]})
            coded = n in (7, 8)
            j.record_exchange(
                "r-leak", "POST", LANE, [], protocol="openai-chat", status=200, request_body=request(n),
                response_body=gzip.compress(reply) if coded else reply,
                response_headers=[("content-encoding", "gzip")] if coded else [],
                error=f"upstream said: bad key {SECRET}" if n == 9 else None,
            )  # fmt: skip
        # compaction: the key is no longer in the next request; its frame against the last body
        # (which held it) is re-encoded although its own bytes stay
        compacted = request(REQUESTS).replace(SECRET.encode(), b"") + b" "
        # an incompressible reply is stored as it is: its old bytes are what free pages would keep
        j.record_exchange("r-leak", "POST", LANE, [], protocol="openai-chat", status=200,
                          request_body=compacted,
                          response_body=os.urandom(3000) + SECRET.encode())  # fmt: skip
        snapshot(
            j,
            "r-leak",
            "s-leak00000000001",
            {"settings.cfg": f"KEY={SECRET}\n".encode(), "main.py": b"print(1)\n" * 9},
        )
        j.create_run(Run(id="r-other", agent="qwen-code"))
        for body in (request(8), request(LEAK_AT + 2, secret="other-" + SECRET)):
            j.record_exchange("r-other", "POST", LANE, [], protocol="openai-chat", status=200,
                              request_body=body, response_body=b'{"choices": []}')  # fmt: skip
        j.record_exchange(
            "r-other", "POST", "/v1/other", [], protocol="openai-chat", status=200,
            request_body=json.dumps({"note": f"password {UMLAUT}" + " y" * 40}).encode(),
        )  # fmt: skip
        j.flush()
    run_dir = data / "runs" / "r-leak"
    (run_dir / "home").mkdir(parents=True)
    (run_dir / "agent-output.jsonl").write_text(json.dumps({"text": f"key is {SECRET}"}) + "\n")
    with sqlite3.connect(run_dir / "home" / "state.db") as c:  # an agent's own database
        c.execute("CREATE TABLE t(v TEXT)")
        c.executemany("INSERT INTO t VALUES (?)", [(f"row {i} {SECRET}",) for i in range(50)])
    return path


def bodies(path: Path) -> dict[tuple[str, int], tuple[str, bytes, bytes | None]]:
    """{(run, seq): (request sha256, request body, response decoded)} of every exchange."""
    out = {}
    with JournalReader(path) as r:
        for run in r.runs():
            for ex in r.exchanges(run.id):
                resp = r.response_body(ex, raw=True)
                if resp is not None and ex.response_headers.get("content-encoding") == "gzip":
                    resp = gzip.decompress(resp)
                out[(run.id, ex.seq)] = (ex.request_body, r.request_body(ex), resp)
    return out


def size_mismatches(path: Path) -> list[tuple[str, int]]:
    """The exchanges whose request_bytes or bytes_received is not the size of the stored body
    (the response as stored: in its content coding)."""
    out = []
    with JournalReader(path) as r:
        for run in r.runs():
            for e in r.exchanges(run.id):
                resp = r.response_body(e, raw=True) or b""
                if (e.request_bytes, e.bytes_received) != (len(r.request_body(e)), len(resp)):
                    out.append((e.run, e.seq))
    return out


def content(path: Path) -> str:
    """A digest of every row of the journal (the file's bytes move when a WAL is checkpointed)."""
    c = sqlite3.connect(path)
    try:
        return hashlib.sha256("\n".join(c.iterdump()).encode()).hexdigest()
    finally:
        c.close()


def codecs(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as c:
        return dict(c.execute("SELECT codec, count(*) FROM blobs GROUP BY codec"))


def test_after_scrub_no_byte_of_the_key_is_left_and_every_body_reads_back(leaked: Path):
    data = leaked.parent
    # a handoff's child run names the manifest restored for it (runs.workspace_snapshot)
    with sqlite3.connect(leaked) as c:
        [(manifest,)] = c.execute("SELECT manifest FROM snapshots WHERE run_id = 'r-leak'").fetchall()
    with Journal.open(leaked) as j:
        j.create_run(
            Run(
                id="r-child",
                mode="handoff",
                parent_run="r-leak",
                boundary_step=0,
                workspace_snapshot=manifest,
            )
        )
    before = bodies(leaked)
    frames_before = codecs(leaked)
    assert size_mismatches(leaked) == []
    # the key is there as bytes to begin with (a label, the run directory, uncompressed bodies)
    assert str(leaked) in everywhere(data, SECRET) and len(everywhere(data, SECRET)) >= 3
    proc = cli(leaked, "journal", "scrub", SECRET, "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert everywhere(data, SECRET) == []
    assert rep["remaining"] == [] and rep["problems"] == [] and rep["wal_truncated"]
    assert SECRET not in proc.stdout + proc.stderr  # the report never repeats it
    assert not os.path.exists(f"{leaked}-wal") or os.path.getsize(f"{leaked}-wal") == 0
    # every later request of the lane held it: each is a new blob; the shared one counts once
    leaking = [k for k, (_, body, _) in before.items() if SECRET.encode() in body]
    assert len(leaking) == REQUESTS - LEAK_AT + 2  # r-leak's after LEAK_AT, r-other's two
    assert rep["blobs_changed"] >= len(leaking) - 1 + 3  # + the gzip and raw replies, the settings file
    assert rep["blobs_reencoded"] >= 1  # the compacted request
    after = bodies(leaked)
    assert after.keys() == before.keys()
    # the size columns give the stored bodies' sizes, before as after (HAR's bodySize, show's columns)
    assert size_mismatches(leaked) == []
    for key, (sha, body, resp) in before.items():
        new_sha, new_body, new_resp = after[key]
        assert new_body == body.replace(SECRET.encode(), SCRUBBED.encode()), key
        assert new_resp == (resp.replace(SECRET.encode(), SCRUBBED.encode()) if resp is not None else None)
        # a body that never held the key keeps its digest; one that did gets its new one
        assert (new_sha == sha) == (SECRET.encode() not in body), key
        assert new_sha == hashlib.sha256(new_body).hexdigest()
    # the frames are still frames (re-encoded against the new bases, not stored whole)
    assert codecs(leaked) == frames_before
    with JournalReader(leaked) as r:
        assert r.verify().ok
        run = r.run("r-leak")
        assert run.labels["note"] == f"leaked {SCRUBBED} here"
        # the writer had redacted the key in the error already (its shape is known)
        assert [e.error for e in r.exchanges("r-leak") if e.error] == ["upstream said: bad key <redacted>"]
    assert cli(leaked, "journal", "verify").returncode == 0
    # the snapshot's manifest names the scrubbed settings file, and restores it; its event names it
    with JournalReader(leaked) as r:
        [snap] = r.conn.execute("SELECT manifest FROM snapshots WHERE run_id = 'r-leak'").fetchall()
        [taken] = [e for e in r.events("r-leak") if e["kind"] == "snapshot.taken"]
        assert taken["data"]["manifest"] == snap[0]
        assert snap[0] != manifest and r.run("r-child").workspace_snapshot == snap[0]  # remapped too
        env = next(e for e in orjson.loads(r.blob(snap[0]))["entries"] if e["path"] == "settings.cfg")
        assert (
            env["size"] == len(f"KEY={SCRUBBED}\n") and r.blob(env["sha256"]) == f"KEY={SCRUBBED}\n".encode()
        )
    restored = data.parent / "restored"
    proc = cli(leaked, "snapshot", "restore", "r-leak", "--after-step", "0", "--into", str(restored))
    assert proc.returncode == 0, proc.stderr
    assert (restored / "settings.cfg").read_text() == f"KEY={SCRUBBED}\n"
    assert (restored / "main.py").read_bytes() == b"print(1)\n" * 9
    # the run directory: the text file gets the replacement, the database as many * (it still opens)
    run_dir = data / "runs" / "r-leak"
    assert json.loads((run_dir / "agent-output.jsonl").read_text()) == {"text": f"key is {SCRUBBED}"}
    with sqlite3.connect(run_dir / "home" / "state.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert c.execute("SELECT v FROM t LIMIT 1").fetchone() == ("row 0 " + "*" * len(SECRET),)
    # a second scrub finds nothing and changes nothing
    again = cli(leaked, "journal", "scrub", SECRET, "--json")
    assert again.returncode == 0, again.stderr
    rep2 = json.loads(again.stdout)
    assert (rep2["matches"], rep2["blobs_changed"], rep2["cells_changed"], rep2["files_changed"]) == (
        0,
        0,
        0,
        [],
    )
    assert bodies(leaked) == after


def test_a_json_escaped_form_is_scrubbed_too_and_stdin_keeps_the_text_off_the_command_line(leaked: Path):
    escaped = json.dumps(UMLAUT)[1:-1]  # p\u00e4ssw\u00f6rd-31337
    assert escaped != UMLAUT and escaped in everywhere_text(leaked)
    proc = cli(leaked, "journal", "scrub", "-", "--replacement", "<gone>", stdin=UMLAUT + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("scrubbed text of 16 bytes: 1 match in bodies, 1 blob changed"), proc.stdout
    with JournalReader(leaked) as r:
        [ex] = [e for e in r.exchanges("r-other") if e.path == "/v1/other"]
        assert json.loads(r.request_body(ex)) == {"note": "password <gone>" + " y" * 40}
    assert escaped not in everywhere_text(leaked)


def everywhere_text(path: Path) -> str:
    """Every request body of the journal, restored, as one text."""
    return "".join(body.decode() for _, body, _ in bodies(path).values())


def test_scrub_of_one_run_changes_its_rows_and_what_it_shares_and_leaves_the_others(leaked: Path):
    before = bodies(leaked)
    proc = cli(leaked, "journal", "scrub", SECRET, "--run", "r-oth", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["run"] == "r-other" and rep["remaining"] == [] and rep["run_dirs"] == []
    after = bodies(leaked)
    for key, (sha, body, resp) in before.items():
        run, seq = key
        # r-other's bodies; r-leak's 8th request is the same blob as r-other's first: changed for both
        shared = key == ("r-leak", 8)
        want = body.replace(SECRET.encode(), SCRUBBED.encode()) if run == "r-other" or shared else body
        assert after[key][1] == want, key
    # r-leak's own rows and run directory keep it
    with JournalReader(leaked) as r:
        assert SECRET in r.run("r-leak").labels["note"] and r.verify().ok
    assert in_bytes(leaked.parent / "runs" / "r-leak" / "agent-output.jsonl", SECRET)


def test_scrub_refuses_while_a_writer_holds_the_journal_unless_forced(leaked: Path):
    with Journal.open(leaked) as j:  # this process's lease is live
        j.flush()
        proc = cli(leaked, "journal", "scrub", SECRET)
        assert proc.returncode == 69 and f"pid {os.getpid()}" in proc.stderr and "--force" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert SECRET in bodies(leaked)[("r-leak", 20)][1].decode()  # nothing changed
        forced = cli(leaked, "journal", "scrub", SECRET, "--force")
        assert forced.returncode == 0, forced.stderr
    assert everywhere(leaked.parent, SECRET) == []


def test_scrub_names_the_gateway_the_user_started_not_its_writer_process(leaked: Path, procs):
    """Issue 35, item 8: beside a running `pvisor gateway` (its journal written by a process of
    its own) scrub refused naming the writer process's pid, which the user never started."""
    gw = procs(
        ["--journal", str(leaked), "gateway", "--port", "0"], env={**ENV, "PVISOR_JOURNAL_WRITER": "process"}
    )
    gw.listening()
    proc = cli(leaked, "journal", "scrub", SECRET)
    assert proc.returncode == 69 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"pid {gw.p.pid} on " in proc.stderr and "(its writer process: pid " in proc.stderr, proc.stderr
    assert gw.stop() == 0


def test_scrub_bad_input_gets_one_line_and_changes_nothing(leaked: Path, tmp_path: Path):
    """The usage errors in this process; a file that is no journal and a damaged blob as the
    ``pvisor`` process, whose exit codes they are."""
    digest = content(leaked)
    for args, code, said in [
        (["journal", "scrub"], 2, "give the text to remove, or --regex"),
        (["journal", "scrub", SECRET, "--regex", "x+"], 2, "one of them"),
        (["journal", "scrub", "abc"], 2, "at least 4 characters"),
        (["journal", "scrub", "--regex", "sk-("], 2, "is not a regular expression"),
        (["journal", "scrub", "--regex", "x*"], 2, "matches the empty string"),
        (["journal", "scrub", SECRET, "--replacement", f"<{SECRET}>"], 2, "contains the text"),
        (["journal", "scrub", "--regex", "scr.bbed"], 2, "matches --regex"),
        (["journal", "scrub", SECRET, "--run", "r-nope"], 2, "no run 'r-nope'"),
        # a replacement goes unescaped into JSON strings, paths and names: one they would read
        # otherwise is refused (a quote ended the string; a slash made a directory of a file name)
        *[
            (["journal", "scrub", SECRET, "--replacement", bad], 2, "--replacement must be")
            for bad in ['x"y', "x\\y", "x/y", "..", "", "a\nb", "für"]
        ],
        (["journal", "scrub", SECRET, "--replacement", "x" * 65], 2, "at most 64"),
    ]:
        proc = cli(leaked, *args)
        assert proc.returncode == code and said in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert content(leaked) == digest, args
    notes = tmp_path / "notes.txt"
    notes.write_text(f"not a journal {SECRET}\n")
    proc = cli(notes, "journal", "scrub", SECRET, process=True)
    assert proc.returncode == 65 and "not a pvisor journal" in proc.stderr, proc.stderr
    assert notes.read_text() == f"not a journal {SECRET}\n"
    # a damaged blob: scrub cannot read it, so it changes nothing and says so
    with sqlite3.connect(leaked) as c:
        c.execute("UPDATE blobs SET data = x'00112233' WHERE codec = 'zstd-prefix' "
                  "AND rowid = (SELECT max(rowid) FROM blobs WHERE codec = 'zstd-prefix')")  # fmt: skip
    digest = content(leaked)
    proc = cli(leaked, "journal", "scrub", SECRET, process=True)
    assert (
        proc.returncode == 3 and "cannot be decoded" in proc.stderr and "scrub changed nothing" in proc.stderr
    )
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert content(leaked) == digest


def test_a_regex_scrubs_every_key_of_a_shape(leaked: Path):
    proc = cli(leaked, "journal", "scrub", "--regex", r"sk-live-[A-Za-z0-9]{16,}", "--json")
    assert proc.returncode == 0, proc.stderr
    assert everywhere(leaked.parent, "sk-live-") == []
    with JournalReader(leaked) as r:
        [ex, *_] = [e for e in r.exchanges("r-other")]
        assert b"other-" + SCRUBBED.encode() in r.request_body(r.exchanges("r-other")[1])
        assert r.verify().ok and ex is not None


def test_a_regex_that_would_break_json_changes_nothing_and_says_where(leaked: Path):
    """The key's tool output ends in ``\\n"}``: a regex from the escape's ``n`` on would leave
    ``\\[scrubbed]`` (no JSON escape) in 37 bodies; one matching only in the run's label JSON
    would break that cell. Both are refused before the commit."""
    digest = content(leaked)
    for regex, where in [(r'n"\}', "request body of exchange"), (r're"\}', "runs.labels")]:
        proc = cli(leaked, "journal", "scrub", "--regex", regex)
        assert proc.returncode == 2, (regex, proc.stdout, proc.stderr)
        assert "scrub changed nothing" in proc.stderr and "no longer valid JSON" in proc.stderr
        assert where in proc.stderr and proc.stderr.count("\n") == 1 and regex not in proc.stderr
        assert content(leaked) == digest
    # --dry-run of the literal key: the counts, and nothing changed (journal nor files)
    proc = cli(leaked, "journal", "scrub", SECRET, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["dry_run"] and rep["matches"] > REQUESTS and rep["blobs_changed"] > REQUESTS - LEAK_AT
    run_dir = leaked.parent / "runs" / "r-leak"
    assert sorted(rep["files_changed"]) == [
        str(run_dir / "agent-output.jsonl"),
        str(run_dir / "home" / "state.db"),
    ]
    assert content(leaked) == digest and in_bytes(run_dir / "agent-output.jsonl", SECRET)


def test_arguments_that_are_not_utf8_are_searched_as_their_bytes(leaked: Path):
    run_dir = leaked.parent / "runs" / "r-leak"
    latin1 = "clé-secrète-42".encode("latin-1")  # not UTF-8
    (run_dir / "legacy.txt").write_bytes(b"old config: " + latin1 + b"\n")
    proc = cli(leaked, "journal", "scrub", latin1)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"scrubbed text of {len(latin1)} bytes")
    # the file is not UTF-8 either: masked, its length kept
    assert (run_dir / "legacy.txt").read_bytes() == b"old config: " + b"*" * len(latin1) + b"\n"
    (run_dir / "legacy.txt").write_bytes(b"again " + latin1)
    regex = cli(leaked, "journal", "scrub", "--regex", b"cl\xe9-[a-z\xe8]+-42")
    assert regex.returncode == 0, regex.stderr
    assert (run_dir / "legacy.txt").read_bytes() == b"again " + b"*" * len(latin1)
    bad = cli(leaked, "journal", "scrub", SECRET, "--replacement", b"\xff\xfe")
    assert bad.returncode == 2 and "--replacement must be" in bad.stderr and bad.stderr.count("\n") == 1


def test_names_links_and_hard_links_that_hold_the_text(leaked: Path, tmp_path: Path):
    """A file and a directory named after the key are renamed and a symbolic link whose target
    holds it points to the scrubbed target; a file hard-linked from outside the data directory
    is left (rewriting it in place would change the outside one) and named: exit 3, the rest
    done. No line or report repeats the key, not even in a path."""
    run_dir = leaked.parent / "runs" / "r-leak"
    (run_dir / f"{SECRET}-cache").mkdir()
    (run_dir / f"{SECRET}-cache" / f"notes-{SECRET}.txt").write_text("plain\n")
    os.symlink(f"/nonexistent/{SECRET}/x", run_dir / "plainlink")
    outside = tmp_path / "outside.env"
    outside.write_text(f"KEY={SECRET}\n")
    os.link(outside, run_dir / "linked.env")
    dry = cli(leaked, "journal", "scrub", SECRET, "--dry-run", "--json")
    assert dry.returncode == 0 and SECRET not in dry.stdout + dry.stderr
    names = json.loads(dry.stdout)["names_changed"]
    assert sorted(names) == sorted(
        [str(run_dir / f"{SCRUBBED}-cache"), str(run_dir / f"{SCRUBBED}-cache" / f"notes-{SCRUBBED}.txt"),
         str(run_dir / "plainlink")]
    ) and (run_dir / f"{SECRET}-cache").is_dir()  # fmt: skip
    proc = cli(leaked, "journal", "scrub", SECRET, "--json")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert SECRET not in proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    assert (run_dir / f"{SCRUBBED}-cache" / f"notes-{SCRUBBED}.txt").read_text() == "plain\n"
    assert len(rep["names_changed"]) == 3 and not any(SECRET in p for p in os.listdir(run_dir))
    assert os.readlink(run_dir / "plainlink") == f"/nonexistent/{SCRUBBED}/x"
    assert outside.read_text() == f"KEY={SECRET}\n"  # untouched
    assert [left["path"] for left in rep["not_rewritten"]] == [str(run_dir / "linked.env")]
    assert "hard links" in rep["not_rewritten"][0]["why"]
    assert rep["problems"] == [] and rep["remaining"] == [
        f"{run_dir / 'linked.env'} ({rep['not_rewritten'][0]['why']})"
    ]
    text = cli(leaked, "journal", "scrub", SECRET)  # the lines a person reads
    assert text.returncode == 3 and "Traceback" not in text.stderr and SECRET not in text.stderr
    lines = text.stderr.splitlines()
    assert all(line.startswith("pvisor: error: ") for line in lines), lines
    assert any("linked.env (not rewritten: it has 2 hard links" in line for line in lines)
    assert lines[-1].startswith(
        "pvisor: error: the journal is scrubbed, but 1 file of the run directories was"
    )
    with JournalReader(leaked) as r:  # the journal's part is done and verifies
        assert r.verify().ok and SECRET not in r.run("r-leak").labels["note"]


def test_a_text_in_an_id_is_refused_before_anything_changes(leaked: Path):
    """Ids are never rewritten, and the labels and run directory paths derived from a run's id
    would be: scrub refuses at once (nothing changed), naming the run without the text."""
    with Journal.open(leaked) as j:
        j.create_run(Run(id=f"r-{SECRET}", agent="codex"))
    digest = content(leaked)
    proc = cli(leaked, "journal", "scrub", SECRET)
    assert (
        proc.returncode == 2
        and "scrub changed nothing: the text is in the id of run r-[scrubbed]" in proc.stderr
    )
    assert SECRET not in proc.stderr and proc.stderr.count("\n") == 1
    assert content(leaked) == digest


def test_a_key_split_between_stream_events_is_scrubbed(leaked: Path):
    """A streamed reply carries the model's text in pieces: the key may be split between two
    events. The joined text of every delta path is searched, and the events that held its
    pieces are written again without them."""
    head, tail = SECRET[:9], SECRET[9:]
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "your key is "}}]},
        {"choices": [{"index": 0, "delta": {"content": f"{head}"}}]},
        {"choices": [{"index": 0, "delta": {"content": f"{tail}, keep it"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": "echo '}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": head}}]}}]},
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": tail + '"}'}}]}}
            ]
        },
    ]
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    with Journal.open(leaked) as j:
        ex = j.record_exchange("r-other", "POST", LANE, [], protocol="openai-chat", status=200,
                               request_body=b'{"stream": true}', response_body=body,
                               streamed=True)  # fmt: skip
    assert SECRET.encode() not in body  # never whole in the raw bytes
    proc = cli(leaked, "journal", "scrub", SECRET, "--json")
    assert proc.returncode == 0, proc.stderr
    with JournalReader(leaked) as r:
        [e] = [x for x in r.exchanges("r-other") if x.id == ex]
        raw = r.response_body(e, raw=True)
    got = [orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]
    text = "".join(g["choices"][0]["delta"].get("content") or "" for g in got)
    args = "".join(
        t["function"]["arguments"] for g in got for t in g["choices"][0]["delta"].get("tool_calls") or []
    )
    assert text == f"your key is {SCRUBBED}, keep it" and args == f'{{"cmd": "echo {SCRUBBED}"}}'
    assert head.encode() not in raw and raw.endswith(b"data: [DONE]\n\n")


def test_stdin_and_a_text_found_nowhere(leaked: Path):
    empty = cli(leaked, "journal", "scrub", "-", stdin="")
    assert empty.returncode == 2 and "stdin was empty" in empty.stderr
    regex = cli(leaked, "journal", "scrub", "--regex", "-", stdin="sk-live-[A-Za-z0-9]{16,}\n")
    assert regex.returncode == 0, regex.stderr
    assert everywhere(leaked.parent, "sk-live-") == []
    nowhere = cli(leaked, "journal", "scrub", "not-in-this-journal")
    assert nowhere.returncode == 0 and "nothing held the text" in nowhere.stderr


def test_an_open_reader_that_keeps_the_wal_gives_69_and_vacuum_finishes_later(leaked: Path):
    reader = sqlite3.connect(leaked)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM blobs").fetchone()  # a read transaction holds the WAL
        proc = cli(leaked, "journal", "scrub", SECRET)
        assert proc.returncode == 69, (proc.stdout, proc.stderr)
        assert "the checkpoint could not finish" in proc.stderr and "pvisor journal vacuum" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        reader.close()
    assert cli(leaked, "journal", "vacuum").returncode == 0
    assert everywhere(leaked.parent, SECRET) == []


@pytest.mark.slow
def test_scrub_of_a_real_qwen_code_capture_leaves_no_byte_and_prepare_only_still_works(
    captured, tmp_path: Path
):
    """The captured run's observations and workspace files hold ``gamma`` (c.txt): after the scrub
    of a copy, no file of the data directory (journal, WAL, the run directory with Qwen Code's
    private home and its own session files) holds it, and replay --prepare-only rebuilds the
    prefix with the replacement."""
    cap = captured("qwen-code")
    assert cap.proc.returncode == 0, cap.proc.stderr
    data = tmp_path / "data"
    shutil.copytree(cap.journal.parent, data, symlinks=True)
    journal = data / "journal.sqlite"
    prep = tmp_path / "prep-before"
    args = ["replay", "--agent", "qwen-code", "--journal", str(journal), "--run", cap.run,
            "--after-step", "2", "--prepare-only"]  # fmt: skip
    assert cli(journal, *args, "--output", str(prep)).returncode == 0
    assert "gamma" in (prep / "prefix.json").read_text()
    assert everywhere(data, "gamma"), "the run directory holds the agent's own session"
    proc = cli(journal, "journal", "scrub", "gamma", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["blobs_changed"] > 0 and rep["files_changed"] and rep["remaining"] == []
    assert everywhere(data, "gamma") == []
    prep = tmp_path / "prep-after"
    proc = cli(journal, *args, "--output", str(prep))
    assert proc.returncode == 0, proc.stderr
    prefix = (prep / "prefix.json").read_text()
    assert "gamma" not in prefix and SCRUBBED in prefix
    assert cli(journal, "journal", "verify").returncode == 0
