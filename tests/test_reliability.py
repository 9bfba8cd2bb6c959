"""The reliability figures' harness (bench/reliability.py, docs/reliability.md) in its CI size:
kill -9 rounds of a real gateway under streaming clients, and a load run through one gateway
and through two gateways sharing a journal file. Every promise is checked exchange by exchange
against what the clients sent and received; the full versions (100 rounds, 60 s) are the
documented command whose figures docs/reliability.md gives."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import reliability  # noqa: E402  (bench/, on the path above)

ROUNDS = int(os.environ.get("PVISOR_CRASH_ROUNDS", "10"))


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_kill_9_rounds_lose_nothing_but_the_last_window(writer):
    out = reliability.crash(ROUNDS // 2, clients=6, writer=writer, kill="both", seed=17)
    assert out["problems"] == [], out["problems"]
    assert out["journaled"] > 0 and out["incomplete"] + out["ok"] == out["journaled"]
    assert out["max_lost_age_s"] <= out["window_s"]


@pytest.mark.parametrize("gateways", [1, 2])
def test_load_journals_every_stream_once_byte_exact(gateways):
    out = reliability.load(clients=32, seconds=5.0 if gateways == 1 else 3.0, gateways=gateways)
    assert out["problems"] == [], out["problems"]
    assert out["answered"] > 100 and out["journaled"] == out["answered"] == out["ok"]
    assert out["exit_codes"] == [0] * gateways and all(m > 0 for m in out["peak_rss_mib"])


def test_kill_9_of_pvisor_run_loses_nothing_but_the_last_window():
    """The same promise for `pvisor run` (its gateway in-process, the agent a fake one streaming
    through it): killed with SIGKILL, the agent dies with it, and the journal holds what it
    should."""
    out = reliability.crash(ROUNDS // 2, writer="process", seed=29, target="run")
    assert out["problems"] == [], out["problems"]
    assert out["journaled"] > 0 and out["max_lost_age_s"] <= out["window_s"]
