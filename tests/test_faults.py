"""Faults a gateway meets, made for real (docs/reliability.md, "Faults"): its journal on a file
system that fills up, or that turns read-only, while it runs; an upstream whose TLS certificate
no one vouches for. In each, the clients get a correct answer or a clear error, the gateway
says what it could not record, and the journal keeps, verifiably, what it recorded."""

from __future__ import annotations

import os
import re
import sqlite3
import ssl
import subprocess
import time

import pytest
from aiohttp import web
from gateway_helpers import http_request, json_upstream
from test_gateway_cli import ENV, PVISOR, run_cli

from pvisor.journal.reader import JournalReader


def _answers(url: str, n: int, size: int) -> list[int]:
    statuses = []
    for i in range(n):
        status, _, body = http_request(url, "POST", f"/v1/messages?i={i}", os.urandom(size).hex().encode())
        statuses.append(status)
        if status == 503:
            assert b"pvisor_journal_unavailable" in body
            break
    return statuses


def _run_until_the_writer_stops(stack, procs, tmp_path, journal, env=None, during=None, answered=None):
    """``answered``: a list the upstream appends to for every request it answers."""
    answer = json_upstream(b'{"id":"msg_1","content":"ok"}')

    async def counting(request):
        resp = await answer(request)
        if answered is not None:
            answered.append(1)
        return resp

    up = stack.raw_upstream(counting)
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
            "r-fault",
        ],
        env=env,
    )
    url = gw.listening()
    first = _answers(url, 3, 1000)
    assert first == [200, 200, 200]
    # committed before the large ones come: a failed transaction loses its whole batch, and the
    # three must not share one with the request that fills the disk
    deadline = time.monotonic() + 10
    while _committed(journal) < 3:
        assert time.monotonic() < deadline, "the first three exchanges were not committed"
        time.sleep(0.02)
    if during is not None:
        during()
    statuses = _answers(url, 400, 20_000)
    code = gw.p.wait(30)
    return first + statuses, code, gw.err.rest()


def _committed(journal) -> int:
    try:
        with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
            return db.execute("SELECT count(*) FROM exchanges WHERE outcome = 'ok'").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_journal_on_a_file_system_that_fills_up(stack, procs, tmp_path, small_fs, writer):
    fs = small_fs("1m")
    journal = fs / "journal.sqlite"
    upstream_answered: list[int] = []
    statuses, code, stderr = _run_until_the_writer_stops(
        stack,
        procs,
        tmp_path,
        journal,
        env={**ENV, "PVISOR_JOURNAL_WRITER": writer},
        answered=upstream_answered,
    )
    assert code == 69 and "Traceback" not in stderr, stderr
    assert "pvisor: error: journal writer stopped: OperationalError: database or disk is full" in stderr
    # every answer before the stop was a real one; once the writer stopped, a clear 503, never an
    # unrecorded 200
    assert set(statuses[:-1]) == {200} and statuses[-1] in (200, 503), statuses
    answered = statuses.count(200)
    verify = run_cli(["--journal", str(journal), "journal", "verify"])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with JournalReader(journal) as r:
        recorded = [e for e in r.exchanges("r-fault") if e.outcome == "ok"]
    assert 3 <= len(recorded) <= answered
    # what it could not record, it said, exactly (issue 35, item 7: it said 10 to 15 too few,
    # missing what waited in the pipe to the writer process and in the writer's queue): the
    # exchanges the upstream answered, less those the journal holds
    assert len(upstream_answered) == answered
    with JournalReader(journal) as r:
        held = len([e for e in r.exchanges("r-fault") if e.outcome is not None])
    lost = len(upstream_answered) - held
    said = re.findall(r"pvisor: warning: (\d+) exchange\(s\) answered but not recorded", stderr)
    assert said == ([str(lost)] if lost else []), (said, stderr)


def test_a_journal_that_cannot_even_be_created_names_the_full_disk(tmp_path, small_fs):
    """A new journal needs a few hundred KB; on a 64 KB file system the open failed with
    "cannot rollback - no transaction is active", hiding the cause (found by the new-user helper)."""
    fs = small_fs("64k")
    for writer in ("process", "thread"):
        p = subprocess.run(
            [*PVISOR, "--journal", str(fs / f"{writer}.sqlite"), "gateway", "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**ENV, "PVISOR_JOURNAL_WRITER": writer},
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 69 and "Traceback" not in p.stderr, p.stderr
        assert "disk is full" in p.stderr and "cannot rollback" not in p.stderr, p.stderr


def test_a_journal_on_a_read_only_file_system(stack, procs, tmp_path, small_fs):
    """A gateway cannot record into it: one line, exit 69, before it listens. Readers still read
    it (journal verify, ls), without writing a byte."""
    fs = small_fs("16m")
    journal = fs / "journal.sqlite"
    up = stack.raw_upstream(json_upstream())
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
            "r-ro",
        ]
    )
    url = gw.listening()
    assert _answers(url, 3, 1000) == [200, 200, 200]
    assert gw.stop() == 0
    p = subprocess.run(["mount", "-o", "remount,ro", str(fs)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    start = run_cli(["--journal", str(journal), "gateway", "--port", "0"])
    assert start.returncode == 69 and "Traceback" not in start.stderr, start.stderr
    assert start.stderr.count("\n") == 1 and start.stderr.startswith(f"pvisor: error: journal {journal}")
    verify = run_cli(["--journal", str(journal), "journal", "verify"])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with JournalReader(journal) as r:
        assert [e.outcome for e in r.exchanges("r-ro")] == ["ok", "ok", "ok"]


def test_an_upstream_certificate_no_one_vouches_for_is_a_502_naming_it(stack, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    p = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def start():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", json_upstream())
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    runner, port = stack.lt.run(start())
    try:
        gw = stack.gateway(upstreams={"anthropic": f"https://127.0.0.1:{port}"})
        status, _, body = http_request(gw.url, "POST", "/v1/messages", b'{"model":"m"}')
        assert status == 502 and b"certificate" in body, body
        status2, _, _ = http_request(gw.url, "POST", "/v1/messages", b'{"model":"m"}')
        assert status2 == 502  # the gateway goes on answering
        [ex, _] = stack.exchanges(gw)
        assert ex.outcome == "upstream_unreachable" and "certificate" in ex.error
    finally:
        stack.lt.run(runner.cleanup())


def test_a_slow_first_byte_waits_and_a_stall_ends_at_the_timeout(stack):
    """The default --stall-timeout (600 s) lets a model think; a shorter one ends a stall with a
    502 naming it, and the gateway goes on answering."""
    import asyncio

    async def slow(request):
        await request.read()
        await asyncio.sleep(0.6 if "slow" in request.query else 5)
        return web.json_response({"ok": True})

    up = stack.raw_upstream(slow)
    gw = stack.gateway({"anthropic": up.url}, stall_timeout=1.5)
    assert http_request(gw.url, "POST", "/v1/messages?slow=1", b"{}")[0] == 200  # 0.6 s of thinking is fine
    status, _, body = http_request(gw.url, "POST", "/v1/messages?stall=1", b"{}", timeout=20)
    assert status == 502 and b"1.5" in body, body
    assert http_request(gw.url, "POST", "/v1/messages?slow=1", b"{}")[0] == 200
    outcomes = [e.outcome for e in stack.exchanges(gw)]
    assert outcomes == ["ok", "upstream_reset", "ok"], outcomes
