"""A smoke run of the gateway benchmark's coding-agent scenarios (bench/scenarios.py; the
benchmark itself runs outside CI: ``bench/gateway --suite agents``): each scenario for about a
second, two sessions, through a real pvisor gateway to the benchmark's own upstream
(bench/upstream.py, a real aiohttp server in a process of its own). It must complete without a
failed request, and the journal must hold every exchange the client got an answer to."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import scenarios  # noqa: E402  (bench/ is not a package: it is put on the path above)


@pytest.fixture(scope="module")
def upstream():
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "upstream.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening "), line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("scenario", scenarios.SCENARIOS)
def test_each_scenario_completes_and_every_exchange_is_journaled(stack, upstream, scenario):
    gw = stack.gateway({"openai": upstream})
    out = asyncio.run(scenarios.run(gw.url, scenario, 2, seconds=1.0, warmup=0.2))
    assert out["errors"] == 0 and out["requests"] > 0 and out["sent"] >= out["requests"]
    exchanges = stack.exchanges(gw)
    assert len(exchanges) == out["sent"]
    assert all(ex.status == 200 and ex.outcome == "ok" for ex in exchanges)
    if scenario == "stream":
        assert all(ex.streamed for ex in exchanges) and out["gaps_ms"]  # passed on in pieces, not buffered
    if scenario == "toolloop":
        # request k repeats request k-1 and adds a step: the journal stores the difference
        with stack.reader(gw) as r:
            stored = r.conn.execute("SELECT sum(length(data)) FROM blobs").fetchone()[0]
            sent = sum(ex.request_bytes for ex in exchanges)
        assert stored < sent / 5, (stored, sent)


def test_writer_cost_floor_writes_the_rows_the_journal_writes(tmp_path):
    """bench/writer_cost.py compares the journal writer with a floor of plain SQLite statements:
    the floor only means something if it stores what the writer stores (same exchanges, same
    bodies by digest, one event each)."""
    import writer_cost  # bench/, on the path above

    writer_cost.journal_run(tmp_path / "j.sqlite", 40, unique=True)
    cpu = writer_cost.floor_run(tmp_path / "f.sqlite", 40, unique=True)
    assert cpu >= 0
    query = (
        "SELECT count(*), count(DISTINCT response_body), group_concat(DISTINCT request_body),"
        " sum(status = 200 AND outcome = 'ok') FROM exchanges"
    )
    blob_q = "SELECT count(*), sum(size) FROM blobs"
    event_q = "SELECT count(*) FROM events WHERE kind = 'exchange.finished'"
    got = {}
    for name in ("j", "f"):
        conn = sqlite3.connect(tmp_path / f"{name}.sqlite")
        got[name] = [conn.execute(q).fetchone() for q in (query, blob_q, event_q)]
        conn.close()
    assert got["j"] == got["f"]
    assert got["j"][0][:2] == (40, 40)
