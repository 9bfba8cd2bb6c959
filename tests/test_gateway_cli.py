"""``pvisor gateway`` as a real process (docs/gateway.md): the ready line and ready file, a clean
stop on SIGTERM that finishes the exchange in flight, flushes and checkpoints the journal, and
one-line errors for bad arguments.

The gateway runs as ``python -m pvisor`` (the installed package); upstreams are either servers in
the test's loop thread (so that a barrier can hold a stream across the signal) or ``pvisor
serve-model`` as a second process. Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from gateway_helpers import DEADLINE, Gate, http_request, open_stream

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
                raise AssertionError(f"no line matching {pattern!r} within {deadline} s; got {self.lines!r} {self.buf!r}")
            self._fill(left)

    def rest(self, deadline: float = DEADLINE) -> str:
        """Everything up to EOF (the process has exited)."""
        end = time.monotonic() + deadline
        while not self.eof and time.monotonic() < end:
            self._fill(end - time.monotonic())
        text = "\n".join(self.lines) + "\n" + self.buf.decode("utf-8", "replace")
        self.sel.close()
        return text


class Proc:
    """A pvisor child process with its stdout/stderr read line by line."""

    def __init__(self, args: list[str]) -> None:
        self.p = subprocess.Popen(PVISOR + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=ENV, start_new_session=True)
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


@pytest.fixture
def procs():
    started: list[Proc] = []

    def start(args: list[str]) -> Proc:
        p = Proc(args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def run_cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(PVISOR + args, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=ENV, timeout=timeout)


def assert_wal_checkpointed(journal: Path) -> None:
    wal = Path(str(journal) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, f"WAL not checkpointed: {wal.stat().st_size} bytes"


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
    gw = procs(["--journal", str(journal), "gateway", "--port", "0", "--upstream", f"anthropic={up.url}",
                "--log-file", str(log), "--ready-file", str(ready), "--run", "r-cli-test"])
    url = gw.listening()
    info = json.loads(ready.read_text())
    assert info == {"url": url, "run": "r-cli-test", "pid": gw.p.pid, "journal": str(journal)}

    assert http_request(url, "POST", "/v1/messages", b'{"n":1}')[::2] == (200, b'{"id":"msg_0"}')
    conn, resp = open_stream(url, "POST", "/v1/messages?beta=true", b'{"hold":true,"stream":true}')
    try:
        assert resp.read(len(CHUNK1)) == CHUNK1  # the exchange is in flight
        gw.p.send_signal(sig)
        gw.err.wait_for(r"^stopping: waiting for exchanges in flight")
        release.set()
        assert resp.read() == CHUNK2
        # the gateway closed its listening socket before this exchange could end: no new connection
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=DEADLINE).close()
    finally:
        release.set()
        conn.close()
    assert gw.p.wait(DEADLINE + 15) == 0
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


def test_gateway_in_front_of_serve_model_processes(procs, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"main_chain": "first", "turns": [{"text": "Hello from the script."}, {"text": "Second."}]}))
    model = procs(["serve-model", "--script", str(script), "--port", "0"])
    model_url = model.listening()
    journal = tmp_path / "journal.sqlite"
    gw = procs(["--journal", str(journal), "gateway", "--port", "0", "--upstream", f"anthropic={model_url}"])
    url = gw.listening()

    request = {"model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    direct = http_request(model_url, "POST", "/v1/messages", orjson.dumps(request), {"Content-Type": "application/json"})
    via = http_request(url, "POST", "/v1/messages", orjson.dumps(request), {"Content-Type": "application/json"})
    assert via[0] == direct[0] == 200 and via[2] == direct[2]
    assert orjson.loads(via[2])["content"][0]["text"] == "Hello from the script."
    streamed = http_request(url, "POST", "/v1/messages", orjson.dumps({**request, "stream": True}), {"Content-Type": "application/json"})
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


# --------------------------------------------------------------------------- bad arguments


def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--upstream", "bogus=http://127.0.0.1:1"], 2, r"^Error: Invalid value for '?--upstream'?: 'bogus=http://127\.0\.0\.1:1'.*anthropic, openai, gemini"),
        (["--upstream", "bogus=x"], 2, r"^Error: Invalid value for '?--upstream'?: 'bogus=x'"),
        (["--upstream", "anthropic=ftp://host"], 2, r"^Error: Invalid value for '?--upstream'?.*http:// or https://"),
        (["--upstream", "anthropic=http://a", "--upstream", "anthropic=http://b"], 2, r"given twice"),
        (["--max-body", "lots"], 2, r"'lots' is not a size"),
        (["--port", "70000"], 2, r"Invalid value for '--port'"),
        (["--stall-timeout", "0"], 2, r"Invalid value for '--stall-timeout'"),
        (["--run", "bad id!"], 2, r"^pvisor: error: run id 'bad id!'"),
        (["--port", "{busy}"], 69, r"^pvisor: error: cannot listen on 127\.0\.0\.1:\d+: Address already in use$"),
    ],
)
def test_bad_arguments_give_one_line_error_and_exit_code(tmp_path, args, code, message):
    busy = busy_port()
    try:
        args = [a.replace("{busy}", str(busy.getsockname()[1])) for a in args]
        result = run_cli(["--journal", str(tmp_path / "journal.sqlite"), "gateway", *args])
    finally:
        busy.close()
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith(("Error:", "pvisor: error:"))]
    assert len(errors) == 1, result.stderr
    assert re.search(message, errors[0]), errors[0]
