"""A smoke run of the gateway benchmark's coding-agent scenarios (bench/scenarios.py; the
benchmark itself runs outside CI: ``bench/gateway --suite agents``): each scenario for about a
second, two sessions, through a real pvisor gateway to the benchmark's own upstream
(bench/upstream.py, a real aiohttp server in a process of its own). It must complete without a
failed request, and the journal must hold every exchange the client got an answer to."""

from __future__ import annotations

import asyncio
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
