"""The journal writer in a process of its own (pvisor.journal.writer_process, docs/journal.md
"Writing"): it stores what the thread writer stores, keeps the journal's promises when either
side is killed, and reports bad input and a lost child in one line.

Everything here is real: the child is a real interpreter writing a real SQLite file; kills are
real signals.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from gateway_helpers import poll

from pvisor.gateway.proxy import finalize_response
from pvisor.core.errors import BadInputError, UnavailableError, UsageError
from pvisor.journal.model import Attempt, Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal
from pvisor.journal.writer_process import (
    JournalProcess,
    WriterMode,
    open_journal,
    writer_cpus,
    writer_mode,
)

FINALIZER = "pvisor.gateway.finalize:finalize_response"  # what the commands pass (gateway.proxy.FINALIZER)
BIG = os.urandom(3 << 20)  # larger than the pipe: goes through the sender's backlog
SNAP_SHA = hashlib.sha256(b"snapshot file bytes").hexdigest()
KEY = "sk-ant-api03-" + "k" * 40
SECRETS_SENT = [KEY]  # no piece of it in any journal this module wrote (conftest)
STREAM = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def _record_session(j) -> None:
    """The same producer calls for either writer: every message kind the gateway and
    ``pvisor run`` send, bodies small and large, a decode failure, a stream to reassemble."""
    j.create_run(Run(id="r-a", agent="codex", argv=["codex", "exec"], labels={"task": "t"}))
    j.start_attempt(Attempt(run="r-a", n=1))
    j.record_exchange(
        "r-a",
        "POST",
        "/v1/chat/completions",
        [("authorization", f"Bearer {KEY}"), ("user-agent", "t")],
        query="key=" + KEY,
        protocol="openai-chat",
        status=200,
        request_body=b'{"n": 1}',
        response_body=b'{"ok": 1}',
        response_headers=[("content-type", "application/json")],
        chunk_timings=[10, 9],
        served_by="upstream",
    )
    j.record_exchange(
        "r-a",
        "POST",
        "/v1/chat/completions",
        [],
        protocol="openai-chat",
        status=200,
        request_body=gzip.compress(b'{"n": 2}'),
        request_encoding="gzip",
        response_body=BIG,
    )
    j.record_exchange(
        "r-a",
        "POST",
        "/v1/chat/completions",
        [],
        protocol="openai-chat",
        status=200,
        request_body=b"\x1f\x8b not gzip",
        request_encoding="gzip",
        response_body=b"{}",
    )
    j.record_exchange(
        "r-a",
        "POST",
        "/v1/chat/completions",
        [],
        protocol="openai-chat",
        status=200,
        request_body=b'{"stream": true}',
        response_body=STREAM,
        streamed=True,
        chunk_timings=[(5, 100), (9, 80), (12, 14)],
        flags=("synthetic_end",),
        forwarded_body=b'{"f": 1}',
    )
    j.record_exchange(
        "r-a",
        "POST",
        "/v1/chat/completions",
        [],
        protocol="openai-chat",
        status=401,
        request_body=b"{}",
        response_body=b'{"error": "invalid key ' + KEY.encode() + b'"}',
        outcome="ok",
    )
    j.put_blobs([(SNAP_SHA, b"snapshot file bytes")])
    j.update_run("r-a", labels={"session_id": "s-1"}, agent_version="1.2")
    j.flush()
    with JournalReader(j.path) as r:
        ids = [e.id for e in r.exchanges("r-a")]
    j.set_exchange_roles("r-a", {ids[0]: (1, "main"), ids[1]: (None, "auxiliary")})
    j.end_attempt("r-a", 1, 0, {"how": "exited"})
    j.flush()


def _digest(body: bytes | None) -> tuple | None:
    return None if body is None else (len(body), hashlib.sha256(body).hexdigest(), body[:60])


def _content(path: Path) -> dict:
    """What a reader sees, without what differs between two journals by design (ids, times,
    writer ids, the per-journal fingerprint key)."""
    with JournalReader(path) as r:
        run = r.run("r-a")
        out = {
            "run": (
                run.agent,
                run.agent_version,
                run.argv,
                {k: v for k, v in run.labels.items()},
            ),
            "attempts": [(a.n, a.exit_code, a.labels) for a in r.attempts("r-a")],
            "exchanges": [],
        }
        for e in r.exchanges("r-a"):
            out["exchanges"].append(
                (
                    e.seq,
                    e.outcome,
                    e.status,
                    e.error,
                    e.query,
                    e.request_headers,
                    sorted(e.secret_fingerprints),
                    _digest(r.request_body(e)),
                    _digest(r.response_body(e)),
                    e.response_final and r.blob(e.response_final),
                    e.chunk_timings,
                    e.streamed,
                    e.served_by,
                    e.flags,
                    e.forwarded_body and r.blob(e.forwarded_body),
                    e.chain,
                    e.role,
                    e.request_bytes,
                    e.bytes_received,
                )
            )
        out["blob"] = r.blob(SNAP_SHA)
        assert r.verify().ok
    return out


def test_the_process_writer_stores_what_the_thread_writer_stores(tmp_path: Path):
    with Journal.open(tmp_path / "thread.sqlite", finalize=finalize_response) as j:
        _record_session(j)
    with JournalProcess.open(tmp_path / "process.sqlite", finalize=FINALIZER) as j:
        assert j.pid != os.getpid() and j.writer_id is not None and len(j.fingerprint_key) == 32
        _record_session(j)
    a, b = _content(tmp_path / "thread.sqlite"), _content(tmp_path / "process.sqlite")
    assert a == b
    ex = b["exchanges"]
    assert KEY not in repr(b) and len(ex) == 5
    assert ex[2][1] == "decode_error" and ex[1][8][0] == 3 << 20
    assert ex[3][9] is not None and orjson.loads(ex[3][9])["choices"][0]["message"]["content"] == "Hello"
    with JournalReader(tmp_path / "process.sqlite") as r:
        (writer,) = r.conn.execute("SELECT pid, closed_how FROM writers").fetchall()
    assert writer[1] == "closed" and writer[0] != os.getpid()  # the lease is the child's


def test_the_writer_process_reassembles_without_loading_the_gateway(tmp_path: Path):
    """The gateway's finalizer was imported from pvisor.gateway.proxy: its first reassembly made
    the writer process import aiohttp and the gateway, about 0.4 s in which it committed
    nothing (found by bench/reliability.py crash: exchanges finished 0.26 s before a kill of the
    whole group were lost). It now loads only the protocol modules, in a thread of its own."""
    from pvisor.gateway.proxy import FINALIZER as GATEWAY_FINALIZER

    assert GATEWAY_FINALIZER == FINALIZER  # what pvisor gateway, run, replay and demo pass
    with JournalProcess.open(tmp_path / "j.sqlite", finalize=GATEWAY_FINALIZER) as j:
        j.record_exchange(
            "r-s",
            "POST",
            "/v1/chat/completions",
            [],
            protocol="openai-chat",
            status=200,
            request_body=b'{"stream": true}',
            response_body=STREAM,
            streamed=True,
        )
        j.flush()  # reassembled by now
        maps = Path(f"/proc/{j.pid}/maps").read_text()
        modules = Path(f"/proc/{j.pid}/cmdline").read_bytes()
    assert b"writer_child" in modules
    assert "aiohttp" not in maps and "multidict" not in maps and "yarl" not in maps
    with JournalReader(tmp_path / "j.sqlite") as r:
        [ex] = r.exchanges("r-s")
        assert orjson.loads(r.response_body(ex))["choices"][0]["message"]["content"] == "Hello"


def test_an_exchange_in_flight_is_written_in_flight_then_incomplete_at_close(
    tmp_path: Path,
):
    path = tmp_path / "j.sqlite"
    with JournalProcess.open(path) as j:
        p = j.begin_exchange("r-f", "POST", "/v1/messages", [("x-api-key", KEY)])
        poll(lambda: _outcomes(path) == [None], "the exchange in flight on disk")
        j.begin_exchange("r-f", "POST", "/v1/messages", [])  # younger than a commit window at close
        j.finish_exchange(p, status=200, request_body=b"{}", response_body=b"{}")
        j.flush()
        assert _outcomes(path) == ["ok"]
    assert _outcomes(path) == ["ok", "incomplete"]


def test_a_request_without_a_body_is_handed_over_at_once_and_stored(tmp_path: Path):
    """Issue 35, item 6 hands each exchange to the writer process as soon as its request is read,
    on the caller's thread: a GET's empty body, a buffer writev never reports written, made that
    call spin for ever (every GET through a gateway hung). Bounded here by a thread's join."""
    import threading

    path = tmp_path / "j.sqlite"
    j = JournalProcess.open(path)
    p = j.begin_exchange("r-g", "GET", "/v1/models", [])
    t = threading.Thread(target=j.request_read, args=(p, b""), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # it holds the pipe's lock: closing would wait for ever
        os.kill(j.pid, signal.SIGKILL)
        raise AssertionError("request_read of an empty body did not return")
    j.finish_exchange(p, status=200, request_body=b"", response_body=b"{}")
    j.close()
    with JournalReader(path) as r:
        (ex,) = r.exchanges("r-g")
        assert (ex.outcome, ex.request_bytes, r.response_body(ex)) == ("ok", 0, b"{}")


def _outcomes(path: Path) -> list:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT outcome FROM exchanges ORDER BY seq")]


PARENT = textwrap.dedent(
    """
    import os, signal, sys, time
    from pvisor.journal.writer_process import JournalProcess
    j = JournalProcess.open(sys.argv[1])
    print(j.pid, flush=True)
    hanging = j.begin_exchange("r-k", "POST", "/v1/messages", [("x-api-key", "sk-kill")])
    for i in range(200):
        j.record_exchange("r-k", "POST", "/v1/messages", [], status=200, request_body=b'{"n": %d}' % i,
                          response_body=b"x" * 5000)
    time.sleep(0.4)  # the hanging exchange is older than a commit window: sent in flight
    os.kill(os.getpid(), signal.SIGKILL)  # nothing flushed, nothing closed
    """
)


def test_a_kill_9_of_the_gateway_loses_nothing_it_sent(tmp_path: Path):
    path = tmp_path / "j.sqlite"
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.run(
        [sys.executable, str(script), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    child = int(proc.stdout.split()[0])
    poll(
        lambda: not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z",
        "the writer process ends after its gateway died",
        deadline=30,
    )
    with JournalReader(path) as r:
        exs = r.exchanges("r-k")
        assert r.verify().ok
        (writer,) = r.conn.execute("SELECT closed_how FROM writers").fetchall()
    assert sum(1 for e in exs if e.outcome == "ok") == 200  # every exchange written to the pipe
    (hung,) = [e for e in exs if e.outcome != "ok"]
    assert hung.outcome == "incomplete" and hung.seq == 1
    assert writer[0] == "closed"  # the child closed its own lease: nothing for the next writer to reap


def test_a_kill_9_of_the_writer_process_is_seen_and_reaped(tmp_path: Path):
    path = tmp_path / "j.sqlite"
    j = JournalProcess.open(path)
    try:
        p = j.begin_exchange("r-d", "POST", "/v1/messages", [])
        j.record_exchange(
            "r-d",
            "POST",
            "/v1/messages",
            [],
            status=200,
            request_body=b"{}",
            response_body=b"{}",
        )
        j.flush()
        poll(lambda: _outcomes(path) == [None, "ok"], "the exchange in flight on disk")
        os.kill(j.pid, signal.SIGKILL)
        poll(lambda: j.error is not None, "the gateway side sees the writer gone")
        assert f"pid {j.pid}" in j.error and "signal 9" in j.error
        with pytest.raises(UnavailableError, match="writer stopped"):
            j.flush()
        j.finish_exchange(p, status=200)  # a producer call after the loss neither raises nor blocks
    finally:
        j.close()
    with Journal.open(path) as again:
        assert len(again.reaped) == 1
    assert _outcomes(path) == ["incomplete", "ok"]


def test_open_errors_are_the_thread_writers(tmp_path: Path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        JournalProcess.open(tmp_path / "dir")
    (tmp_path / "text.sqlite").write_bytes(b"not a database at all, just text " * 100)
    with pytest.raises(BadInputError, match="not a pvisor journal"):
        JournalProcess.open(tmp_path / "text.sqlite")


def test_a_locked_journal_is_logged_by_the_gateway_and_nothing_is_lost(tmp_path: Path, caplog):
    path = tmp_path / "j.sqlite"
    caplog.set_level(logging.WARNING, logger="pvisor.journal")
    with JournalProcess.open(path, busy_timeout_ms=100) as j:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        j.record_exchange("r-l", "POST", "/v1/messages", [], status=200, request_body=b"{}")
        poll(
            lambda: any("is locked by another process" in r.getMessage() for r in caplog.records),
            "the child's warning, logged in the parent",
        )
        blocker.execute("ROLLBACK")
        blocker.close()
        j.flush()
    assert _outcomes(path) == ["ok"]


def test_mode_and_cpus_from_the_environment():
    assert writer_mode({}) is WriterMode.PROCESS
    assert writer_mode({"PVISOR_JOURNAL_WRITER": "Thread"}) is WriterMode.THREAD
    with pytest.raises(UsageError, match="PVISOR_JOURNAL_WRITER='fast': expected 'process' or 'thread'"):
        writer_mode({"PVISOR_JOURNAL_WRITER": "fast"})
    assert writer_cpus({}) is None
    usable = sorted(os.sched_getaffinity(0))
    assert writer_cpus({"PVISOR_WRITER_CPUS": ",".join(map(str, usable))}) == set(usable)
    assert writer_cpus({"PVISOR_WRITER_CPUS": f"{usable[0]}-{usable[0]}"}) == {usable[0]}
    for bad, message in [
        ("one", "expected CPU numbers"),
        ("0-", "expected CPU numbers"),
        ("3-1", "3-1 names no CPU"),
        ("0-1000000000", "expected CPU numbers"),
        ("0-999999", "this machine has CPUs"),
        (str(os.cpu_count()), "this machine has CPUs"),
    ]:
        with pytest.raises(UsageError, match=f"PVISOR_WRITER_CPUS='{bad}': .*{message}"):
            writer_cpus({"PVISOR_WRITER_CPUS": bad})


def test_the_writer_may_run_on_a_cpu_the_gateway_may_not(tmp_path: Path):
    """A gateway under ``taskset -c 0`` with PVISOR_WRITER_CPUS=1: the writer on CPU 1 (the
    benchmark's pvisor-w1); a check against the gateway's own CPUs refused it."""
    assert os.cpu_count() >= 2, "this test needs two CPUs"
    code = (
        "import os, sys; from pvisor.journal.writer_process import open_journal;"
        "j = open_journal(sys.argv[1]); "
        "print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(j.pid)));"
        "j.close()"
    )
    env = {**os.environ, "PVISOR_WRITER_CPUS": "1", "PYTHONSAFEPATH": "1"}
    proc = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code, str(tmp_path / "j.sqlite")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[0]", "[1]"]


def test_open_journal_puts_the_writer_where_asked(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PVISOR_WRITER_CPUS", "0")
    with open_journal(tmp_path / "p.sqlite", finalize=FINALIZER) as j:
        assert isinstance(j, JournalProcess) and os.sched_getaffinity(j.pid) == {0}
    with open_journal(tmp_path / "t.sqlite", finalize=FINALIZER, mode=WriterMode.THREAD) as j:
        assert isinstance(j, Journal) and j.finalize is not None
    monkeypatch.setenv("PVISOR_WRITER_CPUS", str(os.cpu_count() + 64))
    for mode in WriterMode:  # refused in either mode, before any file is made
        with pytest.raises(UsageError, match="this machine has CPUs"):
            open_journal(tmp_path / "x.sqlite", mode=mode)
    assert not (tmp_path / "x.sqlite").exists()


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "PVISOR_JOURNAL_WRITER=fast",
            "PVISOR_JOURNAL_WRITER='fast': expected 'process' or 'thread'",
        ),
        ("PVISOR_WRITER_CPUS=x", "PVISOR_WRITER_CPUS='x': expected CPU numbers"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(tmp_path: Path, value: str, message: str):
    name, _, setting = value.partition("=")
    env = {**os.environ, name: setting, "PYTHONSAFEPATH": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pvisor",
            "--journal",
            str(tmp_path / "j.sqlite"),
            "gateway",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pvisor: error: {message}"), proc.stderr
