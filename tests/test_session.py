"""The seam of :class:`pvisor.session.session.Session`: built against a scripted model server on
127.0.0.1 port 0 and a real journal file, driven with real requests, stopped; what the journal
holds afterwards shows the parts and their order (docs/cli.md: a failure while starting leaves
the journal as it was; docs/intercept.md: the gateway lets the exchanges in flight finish before
anything behind it stops)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from pvisor.commands.serve import gateway, session_config
from pvisor.gateway.intercept import InterceptConfig
from pvisor.gateway.proxy import GatewayConfig
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.gateway.scripted_server import ScriptedModelServer
from pvisor.journal.reader import JournalReader
from pvisor.journal.snapshots import SnapshotKind
from pvisor.journal.writer import Journal
from pvisor.session.session import PARTS, Session, SessionConfig, StopSignals

HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "k-test"}
BODY = orjson.dumps(
    {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}], "stream": False}
)


async def _scripted(turns: list[dict]) -> tuple[ScriptedModelServer, str]:
    server = ScriptedModelServer(
        ScriptedModel(parse_script({"model": "m", "main_chain": "first", "turns": turns}, "test script"))
    )
    return server, await server.start()


async def _ask(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/messages", data=BODY, headers=HEADERS) as resp:
            return resp.status, orjson.loads(await resp.read())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_an_exchange_through_a_session_is_in_the_journal_once_it_stopped(tmp_path: Path):
    server, upstream = await _scripted([{"text": "hi there"}])
    journal_path = tmp_path / "journal.sqlite"
    session = Session(SessionConfig(journal_path, GatewayConfig(port=0, upstreams={"anthropic": upstream})))
    try:
        url = await session.start()
        assert session.started == ["listen", "journal", "gateway"]  # no signals, no mitmdump
        assert url.startswith("http://127.0.0.1:") and session.gateway.url == url
        status, reply = await _ask(url)
        assert status == 200 and reply["content"][0]["text"] == "hi there"
        run = session.gateway.run
    finally:
        assert await session.stop() == 0
        await server.stop()
    with JournalReader(journal_path) as r:
        [ex] = r.exchanges(run)
        assert (ex.protocol, ex.path, ex.status, ex.outcome) == ("anthropic", "/v1/messages", 200, "ok")
        assert orjson.loads(r.response_body(ex))["content"][0]["text"] == "hi there"
    assert await session.stop() == 0  # idempotent: every part stopped once


async def test_the_gateway_options_make_one_record_the_session_reads(tmp_path: Path):
    """`pvisor gateway`'s options made into one SessionConfig (commands/serve.py session_config,
    as the command builds it) and a Session started with it on 127.0.0.1 port 0: the session
    listens where the record says, serves its upstream, files the exchange and the workspace
    snapshot under the record's run, and its gateway reads the record's settings."""
    server, upstream = await _scripted([{"text": "from the record"}])
    journal_path = tmp_path / "journal.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    args = ["--host", "127.0.0.1", "--port", "0", "--upstream", f"anthropic={upstream}", "--run", "r-config",
            "--shutdown-grace", "7", "--max-body", "1MiB", "--workspace", str(ws)]  # fmt: skip
    config = session_config(gateway.make_context("gateway", args, obj={"journal": str(journal_path)}))
    assert config.journal == str(journal_path) and config.intercept is None and config.journal_wait is None
    g = config.gateway
    assert (g.host, g.port, g.run, g.shutdown_grace, g.max_body) == ("127.0.0.1", 0, "r-config", 7.0, 1 << 20)
    assert g.upstreams == {"anthropic": upstream} and g.workspace == ws and g.token is None
    assert g.snapshot_exclude == (journal_path,)
    session = Session(config)
    try:
        url = await session.start()
        assert session.gateway.config is g and session.gateway.run == "r-config"
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        status, reply = await _ask(url)
        assert status == 200 and reply["content"][0]["text"] == "from the record"
        snap = await session.take_snapshot(SnapshotKind.END)
        assert snap is not None and (snap.run, snap.files) == ("r-config", 1)
    finally:
        await session.stop()
        await server.stop()
    with JournalReader(journal_path) as r:
        [ex] = r.exchanges("r-config")
        assert (ex.status, ex.outcome) == (200, "ok")
        # the workspace of the record: snapshotted at the model request, and at the END asked for
        snaps = r.snapshots("r-config")
        assert [s.kind for s in snaps] == [SnapshotKind.REQUEST, SnapshotKind.END] and snaps[1].id == snap.id


def test_a_record_with_intercept_makes_its_gateway_serve_mitmdump_only(tmp_path: Path):
    """Intercept mode in the record: the gateway it holds takes only mitmdump's requests (a token
    for the addon, the origins it may name), set when the record is built, for every command."""
    intercept = InterceptConfig(
        redirects={"api.anthropic.com:443": ("https://api.anthropic.com", "http://x")}
    )
    config = SessionConfig(tmp_path / "journal.sqlite", GatewayConfig(port=0), intercept)
    g = config.gateway
    assert g.intercept_only and g.intercept_token and config.intercept is intercept
    assert g.intercept_origins["https://api.anthropic.com"] == "http://x"


async def test_stop_lets_the_exchange_in_flight_finish_before_the_journal_closes(tmp_path: Path):
    """stop() while the model is still answering: the gateway stops accepting and waits for the
    exchange (it drains first), then the journal closes with it recorded whole; a journal closed
    first would have lost it or marked it incomplete."""
    server, upstream = await _scripted([{"text": "slow but sure", "delay_ms": 800}])
    journal_path = tmp_path / "journal.sqlite"
    session = Session(
        SessionConfig(
            journal_path, GatewayConfig(port=0, upstreams={"anthropic": upstream}, shutdown_grace=30)
        )
    )
    try:
        url = await session.start()
        asking = asyncio.ensure_future(_ask(url))
        deadline = time.monotonic() + 30
        while session.gateway.in_flight == 0:
            assert time.monotonic() < deadline, "the request never reached the gateway"
            await asyncio.sleep(0.01)
        assert await session.stop() == 0  # nothing had to be cancelled
        assert session.journal.error is None
        status, reply = await asking
        assert status == 200 and reply["content"][0]["text"] == "slow but sure"
        run = session.gateway.run
    finally:
        await session.stop()
        await server.stop()
    with JournalReader(journal_path) as r:
        [ex] = r.exchanges(run)
        assert (ex.status, ex.outcome) == (200, "ok")
        assert orjson.loads(r.response_body(ex))["content"][0]["text"] == "slow but sure"


@pytest.mark.parametrize("existing", [False, True])
async def test_a_taken_port_fails_the_start_before_the_journal_is_opened(tmp_path: Path, existing: bool):
    journal_path = tmp_path / "journal.sqlite"
    if existing:
        with Journal.open(journal_path):
            pass
        before = _digest(journal_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        session = Session(
            SessionConfig(journal_path, GatewayConfig(port=taken.getsockname()[1], upstreams={}))
        )
        with pytest.raises(OSError) as exc:
            await session.start()
    assert exc.value.errno == errno.EADDRINUSE
    assert session.started == [] and session.journal is None and session.gateway is None
    if existing:
        assert _digest(journal_path) == before
    else:
        assert not journal_path.exists()
    assert sorted(os.listdir(tmp_path)) == (["journal.sqlite"] if existing else [])


async def test_a_failure_after_the_journal_opened_closes_it_and_the_address(tmp_path: Path):
    """The gateway cannot start (its log file is a directory): what started before it, the
    journal and the bound address, is closed before the error comes out."""
    journal_path = tmp_path / "journal.sqlite"
    (tmp_path / "log").mkdir()
    config = GatewayConfig(port=0, upstreams={}, log_file=tmp_path / "log")
    session = Session(SessionConfig(journal_path, config))
    with pytest.raises(OSError) as exc:
        await session.start()
    assert exc.value.filename is not None
    assert session.started == ["listen", "journal"]
    with pytest.raises(Exception):  # closed: nothing more is written
        session.journal.flush(1)
    with JournalReader(journal_path) as r:  # a journal closed cleanly, holding nothing
        assert r.runs() == []


async def test_stop_signals_are_handled_while_the_session_lives_and_removed_last(tmp_path: Path):
    server, upstream = await _scripted([{"text": "hi"}])
    signals = StopSignals()
    config = SessionConfig(
        tmp_path / "journal.sqlite", GatewayConfig(port=0, upstreams={"anthropic": upstream})
    )
    session = Session(config, signals=signals)
    repeats = []
    signals.on_repeat = lambda: repeats.append(signals.hurry.is_set())
    try:
        await session.start()
        assert session.started == list(PARTS[:4])
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the loop: the test process lives on
        assert await asyncio.wait_for(signals.wait(), 30) == signal.SIGTERM
        assert not signals.hurry.is_set() and signals.exit_code == 143
        os.kill(os.getpid(), signal.SIGHUP)  # a second one hurries
        await asyncio.wait_for(signals.hurry.wait(), 30)
        assert repeats == [True] and signals.signum == signal.SIGTERM
    finally:
        await session.stop()
        await server.stop()
    loop = asyncio.get_running_loop()
    assert not loop.remove_signal_handler(signal.SIGTERM)  # removed by stop()
    with JournalReader(tmp_path / "journal.sqlite") as r:
        assert r.runs() == []  # nothing was asked: no empty run


def test_pvisor_gateway_on_a_taken_port_leaves_no_journal(tmp_path: Path):
    """`pvisor gateway --port BUSY`: exit 69 with one line, and the journal it names is not
    created (the address is bound before the journal is opened, as for `pvisor run`)."""
    from agent_helpers import PVISOR

    journal = tmp_path / "journal.sqlite"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [str(PVISOR), "--journal", str(journal), "gateway", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 69, proc.stderr
    assert proc.stderr.strip() == f"pvisor: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert not journal.exists() and os.listdir(tmp_path) == []
