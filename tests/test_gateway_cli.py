"""``pvisor gateway`` as a real process (docs/gateway.md): the ready line and ready file, a clean
stop on SIGTERM that finishes the exchange in flight, flushes and checkpoints the journal, and
one-line errors for bad arguments.

The gateway runs as ``python -m pvisor`` (the installed package); upstreams are either servers in
the test's loop thread (so that a barrier can hold a stream across the signal) or ``pvisor
serve-model`` as a second process. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import selectors
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from gateway_helpers import DEADLINE, Gate, http_request, json_upstream, open_stream, poll

from pvisor.journal.model import unpack_timings
from pvisor.journal.reader import JournalReader

ENV = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1"}
PVISOR = [sys.executable, "-m", "pvisor"]


class LineReader:
    """Lines from a child's pipe, each awaited with a deadline (never a blocking readline)."""

    def __init__(self, pipe) -> None:
        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.buf = b""
        self.lines: list[str] = []
        self.eof = False

    def _fill(self, timeout: float) -> None:
        if self.sel.select(timeout):
            data = os.read(self.fd, 65536)
            if not data:
                self.eof = True
            self.buf += data

    def wait_for(self, pattern: str, deadline: float = DEADLINE) -> re.Match:
        """The first line (from now on) matching ``pattern``."""
        end = time.monotonic() + deadline
        rx = re.compile(pattern)
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                self.lines.append(text)
                m = rx.search(text)
                if m:
                    return m
            left = end - time.monotonic()
            if left <= 0 or self.eof:
                raise AssertionError(
                    f"no line matching {pattern!r} within {deadline} s; got {self.lines!r} {self.buf!r}"
                )
            self._fill(left)

    def rest(self, deadline: float = DEADLINE) -> str:
        """Everything up to EOF (the process has exited)."""
        end = time.monotonic() + deadline
        while not self.eof and time.monotonic() < end:
            self._fill(end - time.monotonic())
        text = "\n".join(self.lines) + "\n" + self.buf.decode("utf-8", "replace")
        self.sel.close()
        return text


def with_rlimit(resource_name: str, limit: int) -> list[str]:
    """A command prefix running ``pvisor`` under a resource limit (``RLIMIT_FSIZE``, ...): a real
    condition such as "the disk is full" for the files the process writes, made on purpose."""
    code = (
        f"import os, resource, sys; resource.setrlimit(resource.{resource_name}, ({limit}, {limit})); "
        "os.execv(sys.executable, [sys.executable, '-m', 'pvisor'] + sys.argv[1:])"
    )
    return [sys.executable, "-c", code]


class Proc:
    """A pvisor child process with its stdout/stderr read line by line."""

    def __init__(
        self, args: list[str], command: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.p = subprocess.Popen(
            (command or PVISOR) + args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or ENV,
            start_new_session=True,
        )
        self.out = LineReader(self.p.stdout)
        self.err = LineReader(self.p.stderr)

    def listening(self) -> str:
        return self.out.wait_for(r"^listening (http://127\.0\.0\.1:\d+)$", deadline=30).group(1)

    def stop(self) -> int:
        """SIGTERM, then the exit code (deadline)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        return self.p.wait(DEADLINE + 15)

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(DEADLINE)
        for s in (self.p.stdout, self.p.stderr):
            s.close()


def run_cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        PVISOR + args, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=ENV, timeout=timeout
    )


def assert_wal_checkpointed(journal: Path) -> None:
    wal = Path(str(journal) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, f"WAL not checkpointed: {wal.stat().st_size} bytes"


@pytest.mark.parametrize(
    "writer,killed",
    [("thread", "gateway"), ("process", "gateway"), ("process", "group")],
    ids=["thread-writer", "writer-process", "writer-process-killed-too"],
)
def test_a_kill_9_keeps_the_request_and_the_response_so_far_of_an_exchange_in_flight(
    stack, procs, tmp_path, corpus, writer, killed
):
    """Issue 17, defect 2: a stream that had run for a while, killed with its gateway, left a row
    with no request body and request_bytes 0. Within a commit window of being read, the request
    is on disk, and so is every response byte received a commit window ago; after the kill
    the exchange is ``incomplete`` with both (joined by the writer process at its end, or by
    the next writer that reaps the dead one)."""
    stream = (corpus / "wire" / "anthropic" / "basic_response.sse").read_bytes()
    cut = stream.index(b"event: content_block_delta")
    parts = [stream[:cut], stream[cut : cut + 200]]
    release = Gate(stack.lt)

    async def handler(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in parts:
            await resp.write(part)
            await asyncio.sleep(0.2)
        await release.wait(60)  # the rest never comes: the gateway is killed first
        return resp

    up = stack.raw_upstream(handler)
    journal = tmp_path / "journal.sqlite"
    env = {**ENV, "PVISOR_JOURNAL_WRITER": writer}
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-kill",
        ],
        env=env,
    )
    url = gw.listening()
    body = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 1151}]})
    assert len(body) == 1220
    conn, resp = open_stream(url, "POST", "/v1/messages", body)
    try:
        got = resp.read(len(parts[0]) + len(parts[1]))
        assert got == parts[0] + parts[1]

        def on_disk():
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
                row = db.execute(
                    "SELECT e.id, e.request_bytes, (SELECT sum(length(data)) FROM response_parts p"
                    " WHERE p.exchange_id = e.id), e.bytes_delivered FROM exchanges e"
                ).fetchone()
            done = row is not None and row[1] == len(body) and row[2] == len(got) == row[3]
            return row if done else None

        ex_id = poll(on_disk, "the request and the response so far in the journal", deadline=5)[0]
        if killed == "group":
            os.killpg(gw.p.pid, signal.SIGKILL)
        else:
            os.kill(gw.p.pid, signal.SIGKILL)
        gw.p.wait(DEADLINE)
    finally:
        release.set()
        conn.close()
    if writer == "process" and killed == "gateway":
        # the writer process reads the pipe to its end, then closes the lease itself
        def closed():
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
                return db.execute("SELECT closed_how FROM writers").fetchone()[0] == "closed"

        poll(closed, "the writer process closing its lease", deadline=30)
    else:
        from pvisor.journal.writer import Journal

        def reaped():
            Journal.open(journal).close()  # the next writer reaps the dead one, once it is dead
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
                return (
                    db.execute("SELECT outcome FROM exchanges WHERE id = ?", (ex_id,)).fetchone()[0]
                    is not None
                )

        poll(reaped, "the dead writer reaped", deadline=10, interval=0.2)
    with JournalReader(journal) as r:
        ex = r.exchange(ex_id)
        assert (ex.outcome, ex.status, ex.streamed, ex.request_bytes) == ("incomplete", 200, True, len(body))
        assert r.request_body(ex) == body
        assert r.response_body(ex, raw=True) == parts[0] + parts[1]
        assert ex.bytes_received == len(got)
        assert ex.bytes_delivered == len(got)  # the client had them all (a new user saw 0)
        assert r.conn.execute("SELECT count(*) FROM response_parts").fetchone()[0] == 0
    verify = run_cli(["--journal", str(journal), "journal", "verify"])
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_log_file_on_a_full_file_system_never_stops_recording_or_the_stop(
    stack, procs, tmp_path, small_fs, writer
):
    """Issue 17, defect 3: a --log-file on a full file system printed a traceback per line, then
    crashed at stop (exit 1; with the thread writer the lease stayed open and the WAL was never
    checkpointed). Lines that cannot be written are dropped with one warning; every exchange is
    journaled; the stop is clean; once there is room again, the file says how many were lost."""
    up = stack.raw_upstream(json_upstream(b'{"id":"msg_1"}'))
    full = small_fs("64k")
    (full / "filler").write_bytes(b"x" * 60_000)
    journal = tmp_path / "journal.sqlite"
    log = full / "gw.log"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--log-file",
            str(log),
            "--run",
            "r-full",
        ],
        env={**ENV, "PVISOR_JOURNAL_WRITER": writer},
    )
    url = gw.listening()
    for i in range(60):  # far more lines than the file system holds
        assert http_request(url, "POST", "/v1/messages", b'{"n":%d}' % i)[0] == 200
    gw.err.wait_for(
        r"^pvisor: warning: --log-file .*gw\.log: cannot write: No space left on device; lines are dropped"
    )
    (full / "filler").unlink()  # room again: the next line says how many were lost
    assert http_request(url, "POST", "/v1/messages", b'{"n":"last"}')[0] == 200
    assert gw.stop() == 0
    stderr = gw.err.rest()
    assert "Traceback" not in stderr and "Logging error" not in stderr, stderr
    assert stderr.count("--log-file") == 1, stderr  # one warning, not one per line
    assert_wal_checkpointed(journal)
    with JournalReader(journal) as r:
        assert len(r.exchanges("r-full")) == 61
        assert [tuple(w) for w in r.conn.execute("SELECT closed_how FROM writers")] == [("closed",)]
    text = log.read_text()
    lost = [int(n) for n in re.findall(r" (\d+) log line\(s\) lost: the file could not be written\n", text)]
    assert lost, text
    assert text.rstrip().endswith("stopped") and " r-full x-" in text
    # a line is on disk or counted lost, never both (buffered lines came back later as "lost")
    assert text.count(" r-full x-") + sum(lost) == 61, (text.count(" r-full x-"), lost)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600  # like the journal: it names runs and paths


@pytest.mark.parametrize("given", [True, False], ids=["--token", "generated"])
def test_a_gateway_beyond_this_machine_needs_its_token_which_is_never_forwarded_or_stored(
    stack, procs, tmp_path, given
):
    """Issue 17, defect 5: --host 0.0.0.0 opened an unauthenticated relay. With --allow-remote,
    every request needs /t/<token> in its path: without it, 401, nothing forwarded, nothing
    journaled; with it, the prefix is removed before routing, so the upstream, the journal and
    the log file never see the token."""
    up = stack.raw_upstream(json_upstream(b'{"id":"msg_1"}'))
    journal, log, ready = tmp_path / "journal.sqlite", tmp_path / "gw.log", tmp_path / "ready.json"
    token = "PvTokenForTheTest_0123456789-abc"
    args = [
        "--journal",
        str(journal),
        "gateway",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--allow-remote",
        "--upstream",
        f"anthropic={up.url}",
        "--log-file",
        str(log),
        "--ready-file",
        str(ready),
    ]
    gw = procs(args + (["--token", token] if given else []))
    m = gw.out.wait_for(r"^listening http://0\.0\.0\.0:(\d+)/t/([A-Za-z0-9_-]+)$", deadline=30)
    port, printed = m.group(1), m.group(2)
    if given:
        assert printed == token
    else:
        token = printed
        assert len(token) == 32
    assert json.loads(ready.read_text())["url"] == f"http://0.0.0.0:{port}/t/{token}"
    gw.err.wait_for(r"requests need the token in their path")
    url = f"http://127.0.0.1:{port}"
    for path in (
        "/v1/messages",
        "/t/wrong-token-0123456789/v1/messages",
        f"/t/{token}x/v1/messages",
        "/__pvisor/health",
        f"/run/r-1/t/{token}/v1/messages",
    ):
        status, _, body = http_request(url, "POST", path, b'{"n":0}')
        assert status == 401 and b"pvisor_unauthorized" in body, (path, status)
    assert up.requests == []  # nothing was forwarded
    assert http_request(url, "POST", f"/t/{token}/v1/messages?beta=true", b'{"n":1}')[0] == 200
    assert http_request(url, "POST", f"/t/{token}/run/r-remote/v1/messages", b'{"n":2}')[0] == 200
    # a base URL given twice: the token goes no further than the first time
    assert http_request(url, "POST", f"/t/{token}/t/{token}/run/r-remote/v1/messages", b'{"n":3}')[0] == 200
    assert [r[1] for r in up.requests] == ["/v1/messages?beta=true", "/v1/messages", "/v1/messages"]
    assert gw.stop() == 0
    with JournalReader(journal) as r:
        rows = [(e.run, e.path, e.query) for e in r.exchanges()]
    assert sorted(rows)[-1] == ("r-remote", "/v1/messages", "") and len(rows) == 3  # the 401s: not journaled
    for f in [*tmp_path.iterdir()]:
        if f.is_file() and f.name != "ready.json":
            assert token.encode() not in f.read_bytes(), f.name
    assert "refused POST from 127.0.0.1: no valid gateway token" in log.read_text()


def test_the_token_stays_private_and_a_path_that_climbs_is_refused(stack, procs, tmp_path):
    """Issue 35, item 8: under umask 000 the ready file (it holds the token) is 0600; the token
    given by --token-file is not on the command line (ps); a client that repeats /t/TOKEN around
    a mount prefix or a run prefix gets it removed, one that puts it elsewhere a 401; a path
    with a dot segment is answered 400 pvisor_bad_path, recorded, not forwarded (it reached the
    upstream as /base/../../v1/messages, out of the --upstream base path)."""
    up = stack.raw_upstream(json_upstream(b'{"id":"msg_1"}'))
    journal, log, ready = tmp_path / "journal.sqlite", tmp_path / "gw.log", tmp_path / "ready.json"
    token = "PvTokenFileForTheTest_0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    args = ["--journal", str(journal), "gateway", "--port", "0", "--token-file", str(token_file)]
    args += ["--upstream", f"anthropic={up.url}/base", "--log-file", str(log), "--ready-file", str(ready)]
    gw = procs(args, command=["sh", "-c", 'umask 000; exec "$@"', "sh", *PVISOR])
    m = gw.out.wait_for(r"^listening http://127\.0\.0\.1:(\d+)/t/(\S+)$", deadline=30)
    assert m.group(2) == token
    assert stat.S_IMODE(ready.stat().st_mode) == 0o600
    assert token.encode() not in Path(f"/proc/{gw.p.pid}/cmdline").read_bytes()
    url = f"http://127.0.0.1:{m.group(1)}"
    for path in (
        f"/t/{token}/anthropic/t/{token}/v1/messages",
        f"/t/{token}/run/r-twice/t/{token}/v1/messages",
    ):
        assert http_request(url, "POST", path, b"{}")[0] == 200, path
    for path in (f"/t/{token}/v1/messages?t={token}", f"/t/{token}/v1/{token}/messages"):
        status, _, body = http_request(url, "POST", path, b"{}")
        assert status == 401 and b"pvisor_unauthorized" in body, path
    climbing = [
        f"/t/{token}/../../v1/messages",
        f"/t/{token}/anthropic/%2E%2e/%2e%2e/v1/messages",
        f"/t/{token}/v1/./messages",
        # the attacks on the first fix: slashes, backslashes, parameters and NULs that a server
        # decodes or cuts at (the upstream saw /base/../../x)
        *(
            f"/t/{token}/anthropic/{climb}"
            for climb in (
                "..%2f..%2fx", "%2e%2e%2f%2e%2e%2fx", ".%2e%2f.%2e%2fx", "%2F..%2F..%2Fx", "x/..%2F..%2F..",
                "..%5c..%5cx", "..\\..\\x", "..;/..;/x", "..%00/x", ".%00./x",
            )
        ),
        f"/t/{token}/anthropic\\..\\..\\x",
    ]  # fmt: skip
    for path in climbing:
        status, _, body = http_request(url, "POST", path, b"{}")
        assert status == 400 and b"pvisor_bad_path" in body, (path, status)
    assert [r[1] for r in up.requests] == ["/base/v1/messages", "/base/v1/messages"]
    assert gw.stop() == 0
    with JournalReader(journal) as r:
        exs = r.exchanges()
    assert sorted(e.status for e in exs) == [200, 200] + [400] * len(climbing)
    assert all(
        e.served_by == "refused" and "pvisor_bad_path" in (e.error or "") for e in exs if e.status == 400
    )
    for f in tmp_path.iterdir():
        if f.is_file() and f.name not in ("ready.json", "token"):
            assert token.encode() not in f.read_bytes(), f.name


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_finishes_the_exchange_in_flight(stack, procs, tmp_path, corpus, sig):
    stream = (corpus / "wire" / "anthropic" / "basic_response.sse").read_bytes()
    cut = stream.index(b"event: content_block_delta")
    CHUNK1, CHUNK2 = stream[:cut], stream[cut:]
    release = Gate(stack.lt)

    async def handler(request):
        body = await request.read()
        if b"hold" not in body:
            return web.Response(body=b'{"id":"msg_0"}', headers={"Content-Type": "application/json"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNK1)
        await release.wait()  # released once the gateway has received SIGTERM
        await resp.write(CHUNK2)
        await resp.write_eof()
        return resp

    up = stack.raw_upstream(handler)
    journal, log, ready = tmp_path / "j" / "journal.sqlite", tmp_path / "gw.log", tmp_path / "ready.json"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--log-file",
            str(log),
            "--ready-file",
            str(ready),
            "--run",
            "r-cli-test",
        ]
    )
    url = gw.listening()
    info = json.loads(ready.read_text())
    assert info == {"url": url, "run": "r-cli-test", "pid": gw.p.pid, "journal": str(journal)}

    assert http_request(url, "POST", "/v1/messages", b'{"n":1}')[::2] == (200, b'{"id":"msg_0"}')
    conn, resp = open_stream(url, "POST", "/v1/messages?beta=true", b'{"hold":true,"stream":true}')
    try:
        assert resp.read(len(CHUNK1)) == CHUNK1  # the exchange is in flight
        gw.p.send_signal(sig)
        gw.err.wait_for(r"^stopping: waiting for 1 exchange\(s\) in flight")
        release.set()
        assert resp.read() == CHUNK2
        # the gateway closed its listening socket before this exchange could end: no new connection
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=DEADLINE).close()
    finally:
        release.set()
        conn.close()
    # Ctrl-C reports an interruption (130, as a shell does); SIGTERM is a service stop (0)
    assert gw.p.wait(DEADLINE + 15) == (130 if sig == signal.SIGINT else 0)
    stderr = gw.err.rest()
    assert "Traceback" not in stderr, stderr
    assert_wal_checkpointed(journal)

    verify = run_cli(["--journal", str(journal), "journal", "verify"])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with JournalReader(journal) as r:
        exs = r.exchanges("r-cli-test")
        assert [(e.seq, e.outcome, e.status) for e in exs] == [(1, "ok", 200), (2, "ok", 200)]
        assert r.response_body(exs[1], raw=True) == CHUNK1 + CHUNK2
        assert [n for _, n in unpack_timings(exs[1].chunk_timings)] == [len(CHUNK1), len(CHUNK2)]
        assert exs[1].query == "beta=true" and exs[1].streamed
        final = orjson.loads(r.response_body(exs[1]))  # reassembled by the finalizer
        assert final["type"] == "message" and final["content"][0]["type"] == "text"
    lines = log.read_text().splitlines()
    assert len([line for line in lines if " r-cli-test x-" in line]) == 2
    assert any(line.endswith(f"listening {url} run=r-cli-test") for line in lines)


def stalled_upstream(stack, corpus):
    """An upstream that sends the first part of a stream and then nothing until the test ends.
    Returns (upstream, the part it sends, the gate that releases it at teardown)."""
    stream = (corpus / "wire" / "anthropic" / "basic_response.sse").read_bytes()
    part = stream[: stream.index(b"event: content_block_delta")]
    release = Gate(stack.lt)

    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(part)
        try:
            await release.wait(DEADLINE * 6)
        except TimeoutError:
            pass
        return resp

    return stack.raw_upstream(handler), part, release


def assert_cancelled_in_flight(journal: Path, run: str, part: bytes) -> None:
    """The run holds one exchange, recorded ``incomplete`` with the bytes moved before the
    gateway cancelled it; the journal verifies."""
    verify = run_cli(["--journal", str(journal), "journal", "verify"])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with JournalReader(journal) as r:
        (ex,) = r.exchanges(run)
        assert (ex.outcome, ex.status, ex.streamed) == ("incomplete", 200, True), ex.error
        assert "in flight" in ex.error
        assert (ex.bytes_received, ex.bytes_delivered) == (len(part), len(part))
        assert r.response_body(ex, raw=True) == part
        assert r.request_body(ex) == b'{"stream":true}'


def test_grace_period_ends_then_the_stalled_exchange_is_cancelled_and_recorded(
    stack, procs, tmp_path, corpus
):
    up, part, release = stalled_upstream(stack, corpus)
    journal = tmp_path / "journal.sqlite"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-stall",
            "--shutdown-grace",
            "0.5",
        ]
    )
    url = gw.listening()
    conn, resp = open_stream(url, "POST", "/v1/messages", b'{"stream":true}')
    try:
        assert resp.read(len(part)) == part  # in flight, and the upstream holds the rest
        gw.p.send_signal(signal.SIGINT)
        gw.err.wait_for(
            r"^stopping: waiting for 1 exchange\(s\) in flight "
            r"\(up to 0\.5 s; a second signal cancels them now\)"
        )
        # the end of the grace period is said too (a new user saw the gateway go quiet)
        gw.err.wait_for(r"^stopped: cancelled 1 exchange\(s\) still in flight \(recorded incomplete\)$")
        assert gw.p.wait(DEADLINE + 15) == 130
    finally:
        release.set()
        conn.close()
    stderr = gw.err.rest()
    assert "Traceback" not in stderr, stderr
    assert_wal_checkpointed(journal)
    assert_cancelled_in_flight(journal, "r-stall", part)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["SIGINT", "SIGTERM"])
def test_second_signal_cancels_the_exchanges_in_flight_at_once(stack, procs, tmp_path, corpus, sig, code):
    """With a grace period far past the test's deadline, only the second signal can end the
    wait: the process exits within the deadline only if it does."""
    up, part, release = stalled_upstream(stack, corpus)
    journal = tmp_path / "journal.sqlite"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-twice",
            "--shutdown-grace",
            "3600",
        ]
    )
    url = gw.listening()
    conn, resp = open_stream(url, "POST", "/v1/messages", b'{"stream":true}')
    try:
        assert resp.read(len(part)) == part
        gw.p.send_signal(sig)
        gw.err.wait_for(r"^stopping: waiting for 1 exchange\(s\) in flight")
        gw.p.send_signal(sig)
        gw.err.wait_for(r"^stopping now: cancelling the exchanges in flight")
        assert gw.p.wait(DEADLINE + 15) == code
    finally:
        release.set()
        conn.close()
    assert "Traceback" not in gw.err.rest()
    assert_wal_checkpointed(journal)
    assert_cancelled_in_flight(journal, "r-twice", part)


def test_journal_writer_failure_stops_the_gateway_with_exit_69(stack, procs, tmp_path):
    """A real write failure: the gateway runs with a 1 MiB limit on the size of the files it
    writes (RLIMIT_FSIZE, what a full disk looks like to SQLite: "disk I/O error"). The first
    exchange fits; the second one's 2 MiB response cannot be written, the journal writer stops,
    and the watchdog stops the gateway instead of letting it answer without recording."""
    big = os.urandom(2 * 1024 * 1024)  # incompressible

    async def handler(request):
        return web.Response(
            body=big if "big" in request.query else b'{"ok":true}',
            headers={"Content-Type": "application/json"},
        )

    up = stack.raw_upstream(handler)
    journal = tmp_path / "journal.sqlite"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-full",
        ],
        command=with_rlimit("RLIMIT_FSIZE", 1024 * 1024),
    )
    url = gw.listening()
    assert http_request(url, "POST", "/v1/messages", b'{"n":1}')[::2] == (200, b'{"ok":true}')
    wait_recorded(journal, "r-full", 1)
    assert http_request(url, "POST", "/v1/messages?big=1", b'{"n":2}')[::2] == (
        200,
        big,
    )  # answered, not recordable
    gw.err.wait_for(r"^pvisor: error: journal writer stopped: \w+Error: ", deadline=DEADLINE + 5)
    assert gw.p.wait(DEADLINE + 15) == 69
    stderr = gw.err.rest()
    assert "Traceback" not in stderr, stderr
    with pytest.raises(ConnectionRefusedError):  # it stopped answering
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=DEADLINE).close()
    # what was committed before the failure is intact
    verify = run_cli(["--journal", str(journal), "journal", "verify"])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with JournalReader(journal) as r:
        (ex,) = r.exchanges("r-full")
        assert ex.outcome == "ok" and r.request_body(ex) == b'{"n":1}'


def wait_recorded(journal: Path, run: str, n: int) -> None:
    """Poll the journal (read-only) until ``run`` holds ``n`` finished exchanges (deadline)."""
    end = time.monotonic() + DEADLINE
    while True:
        try:
            with JournalReader(journal) as r:
                exs = [e for e in r.exchanges(run) if e.outcome != "in_flight"]
            if len(exs) >= n:
                return
        except Exception:  # the run does not exist yet
            pass
        assert time.monotonic() < end, f"{n} exchange(s) of {run} not recorded within {DEADLINE} s"
        threading.Event().wait(0.05)


def test_journal_lock_warnings_are_shown_and_nothing_is_lost(stack, procs, tmp_path):
    """Another process holds the journal's write lock: the gateway says so on stderr (one line),
    keeps the exchange in memory, and commits it once the lock is released."""
    up = stack.raw_upstream(json_upstream(b'{"ok":true}'))
    journal = tmp_path / "journal.sqlite"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-locked",
        ]
    )
    url = gw.listening()
    other = sqlite3.connect(journal, isolation_level=None, timeout=DEADLINE)
    try:
        other.execute("BEGIN IMMEDIATE")  # the write lock, held until ROLLBACK
        assert http_request(url, "POST", "/v1/messages", b'{"during":"lock"}')[0] == 200
        gw.err.wait_for(
            r"^pvisor: warning: journal \S+ is locked by another process; "
            r"\d+ message\(s\) wait in memory, retrying$",
            deadline=DEADLINE + 10,
        )
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    gw.err.wait_for(r"^pvisor: warning: journal \S+ is writable again", deadline=DEADLINE + 10)
    assert gw.stop() == 0
    assert "Traceback" not in gw.err.rest()
    with JournalReader(journal) as r:
        (ex,) = r.exchanges("r-locked")
        assert ex.outcome == "ok" and r.request_body(ex) == b'{"during":"lock"}'


def test_client_misbehaviour_is_recorded_and_logged_in_one_line(stack, procs, tmp_path):
    """A client that leaves while sending its body, and one that sends ``Content-Length: abc``:
    no traceback on the terminal; the first is recorded, aiohttp's complaint about the second is
    one line in the log file."""
    up = stack.raw_upstream(json_upstream(b'{"ok":true}'))
    journal, log = tmp_path / "journal.sqlite", tmp_path / "gw.log"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-rude",
            "--log-file",
            str(log),
        ]
    )
    url = gw.listening()
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=DEADLINE) as s:
        s.sendall(b'POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"partial":')
    wait_recorded(journal, "r-rude", 1)
    with socket.create_connection((host, port), timeout=DEADLINE) as s:
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.") and b" 400 " in head.split(b"\r\n")[0]
    assert http_request(url, "POST", "/v1/messages", b'{"after":1}')[0] == 200
    assert gw.stop() == 0
    stderr = gw.err.rest()
    assert "Traceback" not in stderr and "Error handling request" not in stderr, stderr
    text = log.read_text()
    assert "Traceback" not in text
    [line] = [ln for ln in text.splitlines() if "aiohttp.server:" in ln]
    assert line.endswith("(BadHttpMessage)"), line
    with JournalReader(journal) as r:
        first, after = r.exchanges("r-rude")
        assert first.outcome == "aborted_by_client" and "went away while sending" in first.error
        assert b'{"partial":'.startswith(r.request_body(first) or b"")
        assert after.outcome == "ok"


def test_a_stop_with_nothing_in_flight_says_so_briefly(procs, tmp_path):
    """A new user saw "waiting for exchanges in flight (... Ctrl-C again ...)" after a SIGTERM
    with nothing in flight."""
    gw = procs(["--journal", str(tmp_path / "j.sqlite"), "gateway", "--port", "0"])
    gw.listening()
    assert gw.stop() == 0
    lines = [line for line in gw.err.rest().splitlines() if line.startswith("stop")]
    assert lines == ["stopping"], lines


def test_a_gateway_that_records_nothing_leaves_no_run(procs, tmp_path):
    journal = tmp_path / "journal.sqlite"
    gw = procs(["--journal", str(journal), "gateway", "--port", "0", "--run", "r-idle"])
    gw.listening()
    assert gw.stop() == 0
    listing = run_cli(["--journal", str(journal), "journal", "ls", "--json"])
    assert listing.returncode == 0 and json.loads(listing.stdout) == []


def test_gateway_help_names_the_ready_file_fields():
    out = run_cli(["gateway", "--help"]).stdout
    assert '{"url", "run", "pid", "journal"}' in " ".join(out.split())
    assert "--shutdown-grace" in out and "130" in out


@pytest.mark.parametrize("loop, runs_on", [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")])
def test_gateway_in_front_of_serve_model_processes(procs, tmp_path, loop, runs_on):
    """Both event loops (uvloop from the extra pvisor-replay[uvloop], in the test extra too:
    ``auto`` picks it), the journal written by a process of its own."""
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {"main_chain": "first", "turns": [{"text": "Hello from the script."}, {"text": "Second."}]}
        )
    )
    model = procs(["serve-model", "--script", str(script), "--port", "0"])
    model_url = model.listening()
    journal = tmp_path / "journal.sqlite"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={model_url}",
            "--event-loop",
            loop,
        ]
    )
    url = gw.listening()
    gw.err.wait_for(
        rf"^run r-\w+; journal {re.escape(str(journal))}; writer process \d+; event loop {runs_on}$"
    )

    request = {"model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    direct = http_request(
        model_url, "POST", "/v1/messages", orjson.dumps(request), {"Content-Type": "application/json"}
    )
    via = http_request(
        url, "POST", "/v1/messages", orjson.dumps(request), {"Content-Type": "application/json"}
    )
    assert via[0] == direct[0] == 200 and via[2] == direct[2]
    assert orjson.loads(via[2])["content"][0]["text"] == "Hello from the script."
    streamed = http_request(
        url,
        "POST",
        "/v1/messages",
        orjson.dumps({**request, "stream": True}),
        {"Content-Type": "application/json"},
    )
    assert streamed[0] == 200 and b"event: message_stop" in streamed[2]

    assert gw.stop() == 0
    assert model.stop() == 0
    assert_wal_checkpointed(journal)
    with JournalReader(journal) as r:
        (run,) = r.runs()
        exs = r.exchanges(run.id)
        assert [(e.outcome, e.streamed) for e in exs] == [("ok", False), ("ok", True)]
        assert r.response_body(exs[0]) == via[2]
        assert r.response_body(exs[1], raw=True) == streamed[2]
        final = orjson.loads(r.response_body(exs[1]))
        assert final["content"][0]["text"] == "Hello from the script."


def test_a_closed_terminal_stops_the_gateway_cleanly_and_loses_nothing(stack, procs, tmp_path):
    """SIGHUP to the whole process group (a terminal that closed) right after the last answer:
    the gateway stops as on Ctrl-C (exit 129) and its writer process, which ignores it, commits
    every exchange; before, both died at once with the last batch."""

    async def handler(request):
        return web.Response(body=b'{"ok":true}', headers={"Content-Type": "application/json"})

    up = stack.raw_upstream(handler)
    journal = tmp_path / "journal.sqlite"
    gw = procs(
        [
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"anthropic={up.url}",
            "--run",
            "r-hup",
        ]
    )
    url = gw.listening()
    for i in range(5):
        assert http_request(url, "POST", "/v1/messages", b'{"n":%d}' % i)[0] == 200
    os.killpg(gw.p.pid, signal.SIGHUP)
    assert gw.p.wait(DEADLINE + 15) == 129
    assert_wal_checkpointed(journal)
    with JournalReader(journal) as r:
        assert [e.outcome for e in r.exchanges("r-hup")] == ["ok"] * 5
        (closed,) = r.conn.execute("SELECT closed_how FROM writers").fetchall()
    assert closed[0] == "closed"


def test_a_ready_file_that_is_a_fifo_or_device_is_written_in_place(procs, tmp_path):
    """--ready-file on a FIFO (a supervisor reading it) or a device is written in place; it was
    replaced by a regular file, which for a root user's --ready-file /dev/null broke /dev/null.
    A FIFO nobody reads is one error line, not a hang."""
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    gw = procs(["--journal", str(tmp_path / "j.sqlite"), "gateway", "--port", "0", "--ready-file", str(fifo)])
    url = gw.listening()
    reader.join(DEADLINE)
    assert orjson.loads(got[0])["url"] == url
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO
    assert gw.stop() == 0
    lonely = tmp_path / "nobody.fifo"
    os.mkfifo(lonely)
    result = run_cli(
        ["--journal", str(tmp_path / "k.sqlite"), "gateway", "--port", "0", "--ready-file", str(lonely)]
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"pvisor: error: cannot write --ready-file {lonely}: no process has the FIFO open for reading"
    )
    assert stat.S_ISFIFO(os.stat(lonely).st_mode)


def test_event_loop_uvloop_without_uvloop_is_a_usage_error(tmp_path):
    """uvloop not importable (as without the extra): asked for, one line and exit 2; auto falls
    back to asyncio's loop and serves."""
    no_uvloop = [
        sys.executable,
        "-c",
        "import sys; sys.modules['uvloop'] = None; from pvisor.cli import main; main()",
    ]
    journal = tmp_path / "journal.sqlite"
    result = subprocess.run(
        no_uvloop + ["--journal", str(journal), "gateway", "--port", "0", "--event-loop", "uvloop"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "pvisor: error: --event-loop uvloop: uvloop is not installed "
        "(pip install '.[uvloop]' in a clone of pvisor; docs/install.md)"
    )
    assert not journal.exists()  # refused before anything started
    gw = Proc(
        ["--journal", str(journal), "gateway", "--port", "0", "--event-loop", "auto"], command=no_uvloop
    )
    try:
        url = gw.listening()
        assert http_request(url, "GET", "/__pvisor/health")[0] == 200
        assert gw.stop() == 0
    finally:
        gw.kill()


# --------------------------------------------------------------------------- bad arguments


def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(
    "args,code,message",
    [
        (
            ["--upstream", "bogus=http://127.0.0.1:1"],
            2,
            r"^pvisor: error: Invalid value for '?--upstream'?: 'bogus=http://127\.0\.0\.1:1'"
            r".*anthropic, openai, gemini",
        ),
        (["--upstream", "bogus=x"], 2, r"^pvisor: error: Invalid value for '?--upstream'?: 'bogus=x'"),
        (
            ["--upstream", "anthropic=ftp://host"],
            2,
            r"^pvisor: error: Invalid value for '?--upstream'?.*http:// or https://",
        ),
        (["--upstream", "anthropic=http://a", "--upstream", "anthropic=http://b"], 2, r"given twice"),
        (["--max-body", "lots"], 2, r"Invalid value for '--max-body': 'lots' is not a size"),
        (
            ["--host", "0.0.0.0"],
            2,
            r"^pvisor: error: --host 0\.0\.0\.0 listens beyond this machine: .*add --allow-remote",
        ),
        (["--host", "::"], 2, r"^pvisor: error: --host :: listens beyond this machine"),
        (
            ["--host", "0.0.0.0", "--allow-remote", "--token", "not a token, too"],
            2,
            r"^pvisor: error: --token \(or \$PVISOR_GATEWAY_TOKEN\): "
            r"a token is 16 to 256 letters, digits, '_' or '-'$",
        ),
        (["--max-body", "0"], 2, r"Invalid value for '--max-body': '0' is too small \(at least 1 B\)"),
        (["--port", "70000"], 2, r"Invalid value for '--port'"),
        (["--stall-timeout", "0"], 2, r"Invalid value for '--stall-timeout'"),
        (["--run", "bad id!"], 2, r"^pvisor: error: --run bad id!: not a run id \(letters, digits"),
        (
            ["--port", "{busy}"],
            69,
            r"^pvisor: error: cannot listen on 127\.0\.0\.1:\d+: Address already in use$",
        ),
        (
            ["--upstream", "gemini=http://h:99999"],
            2,
            r"--upstream'?: gemini=http://h:99999: .*port must be in 1\.\.65535",
        ),
        (
            ["--upstream", "openai=http://user:hunter2@h:0"],
            2,
            r"--upstream'?: openai=http://\*\*\*@h:0: .*port must be in 1\.\.65535",
        ),
        (
            ["--upstream", "openai=https://user:hunter2@h/v1?x=1"],
            2,
            r"openai=https://\*\*\*@h/v1\?x=1: the URL must not have a query",
        ),
        (["--upstream", "bogus=http://user:hunter2@h"], 2, r"'bogus=http://\*\*\*@h'"),
        (  # a key pasted into the base path is not repeated either (issue 35, item 8)
            ["--upstream", "anthropic=https://h/sk-ant-api03-Pth5Gk2Lm8Nq4Rs1Tv7Wx3Yz9Bc6Df?x=1"],
            2,
            r"anthropic=https://h/REDACTED\?x=1: the URL must not have a query",
        ),
        (
            ["--token-file", "{tmp}/missing"],
            2,
            r"^pvisor: error: cannot read --token-file .*/missing: No such file",
        ),
        (
            ["--token-file", "{tmp}/journal.sqlite", "--token", "PvTokenForTheTest_0123456789-abc"],
            2,
            r"^pvisor: error: give the token with --token or with --token-file, not both$",
        ),
        (["--upstream", "anthropic=http://h:port"], 2, r"port is not a number"),
        (["--upstream", "anthropic=http:///v1"], 2, r"the URL has no host"),
        (
            ["--stall-timeout", "nan"],
            2,
            r"Invalid value for '--stall-timeout': 'nan' is not a finite number of seconds",
        ),
        (
            ["--stall-timeout", "inf"],
            2,
            r"Invalid value for '--stall-timeout': 'inf' is not a finite number of seconds",
        ),
        (["--shutdown-grace", "-1"], 2, r"Invalid value for '--shutdown-grace'"),
        (
            ["--stall-timeout", "1e12"],
            2,
            r"Invalid value for '--stall-timeout': '1e12' is more than 2147483 seconds",
        ),
        (
            ["--host", ""],
            2,
            r"^pvisor: error: --host: an empty address; "
            r"give 127\.0\.0\.1, or an address with --allow-remote$",
        ),
        (
            ["--allow-remote", "--host", "0.0.0.0", "--token", "short"],
            2,
            r"^pvisor: error: --token \(or \$PVISOR_GATEWAY_TOKEN\): a token is 16 to 256",
        ),
        (
            ["--log-file", "/nonexistent-pvisor-dir/g.log"],
            2,
            r"^pvisor: error: cannot write --log-file /nonexistent-pvisor-dir/g\.log: "
            r"directory /nonexistent-pvisor-dir does not exist$",
        ),
        (
            ["--ready-file", "/nonexistent-pvisor-dir/r.json"],
            2,
            r"^pvisor: error: cannot write --ready-file /nonexistent-pvisor-dir/r\.json: "
            r"directory /nonexistent-pvisor-dir does not exist$",
        ),
        (["--log-file", "{tmp}"], 2, r"--log-file"),
    ],
)
def test_bad_arguments_give_one_line_error_and_exit_code(tmp_path, args, code, message):
    busy = busy_port()
    journal = tmp_path / "journal.sqlite"
    try:
        args = [a.replace("{busy}", str(busy.getsockname()[1])).replace("{tmp}", str(tmp_path)) for a in args]
        result = run_cli(["--journal", str(journal), "gateway", *args])
    finally:
        busy.close()
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert len(errors) == 1, result.stderr
    assert re.search(message, errors[0]), errors[0]
    assert "hunter2" not in result.stderr  # a URL's password is never repeated
    # whatever was started before the failure was closed: no unclosed session, no writer lease left
    assert "Unclosed" not in result.stderr, result.stderr
    if journal.exists():
        conn = sqlite3.connect(journal)
        try:
            assert conn.execute("SELECT count(*) FROM writers WHERE closed_ms IS NULL").fetchone()[0] == 0
        finally:
            conn.close()
