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


def test_kill_9_of_the_gateway_alone_keeps_every_request_the_upstream_saw():
    """Issue 35, item 6: a kill -9 of the gateway alone lost streams whose answers had flowed to
    their clients for up to 0.168 s (the writer process heard of an exchange in flight only at
    0.1 s of age). 32 clients stream through a `pvisor gateway` whose pid (not its writer
    process) is killed while answers flow: every request the upstream received is journaled,
    and the journal verifies."""
    out = reliability.crash(2, clients=32, writer="process", kill="gateway", seed=41)
    assert out["problems"] == [], out["problems"]
    assert out["upstream_saw"] > 32 and out["journaled"] >= out["upstream_saw"]


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


PLAYBACK_ROUNDS = int(os.environ.get("PVISOR_PLAYBACK_KILLS", "2"))


@pytest.mark.parametrize(
    "delay",
    [0.8 * i / max(1, PLAYBACK_ROUNDS - 1) for i in range(PLAYBACK_ROUNDS)],
    ids=lambda d: f"{d:.2f}s",
)
def test_kill_9_of_a_playback_takes_the_agent_and_keeps_what_was_served(captured, tmp_path, delay):
    """The same promise for playback (`pvisor replay --replay-only`, its gateway serving the
    recorded steps to the real Codex CLI): killed with SIGKILL ``delay`` seconds after it has
    served a step (``PVISOR_PLAYBACK_KILLS`` rounds from 0 to 0.8 s; 2 in CI), the
    agent dies with it, and once the dead writer is reaped the journal verifies, holds no
    exchange in flight, and every exchange of the derived run has its request."""
    import shutil
    import signal
    import sqlite3
    import subprocess
    import time

    from agent_helpers import PVISOR, children, entrypoint, user_env, wait_gone

    from pvisor.journal.reader import JournalReader

    cap = captured("codex")
    assert cap.proc.returncode == 0, cap.proc.stderr
    journal = tmp_path / "journal.sqlite"
    for suffix in ("", "-wal"):  # a copy: the capture's own journal is shared by other tests
        if Path(str(cap.journal) + suffix).exists():
            shutil.copy(str(cap.journal) + suffix, str(journal) + suffix)
    ws = tmp_path / "ws"
    ws.mkdir()
    args = [
        str(PVISOR),
        "replay",
        "--journal",
        str(journal),
        "--agent",
        "codex",
        "--run",
        cap.run,
        "--after-step",
        "2",
        "--replay-only",
        "--workspace",
        str(ws),
        "--output",
        str(tmp_path / "out"),
        "--agent-entrypoint",
        str(entrypoint("codex")),
        "--timeout",
        "240",
    ]
    proc = subprocess.Popen(
        args,
        env=user_env(cap.user_home),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )

    def served() -> int:
        try:
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
                return db.execute(
                    "SELECT count(*) FROM exchanges e JOIN runs r ON r.id = e.run_id"
                    " WHERE r.mode = 'replay-only' AND e.outcome IS NOT NULL"
                ).fetchone()[0]
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 120
    while served() < 1:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    time.sleep(delay)
    agents = [
        c for c in children(proc.pid) if "codex" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")
    ]
    proc.kill()
    proc.wait(30)
    proc.stderr.close()
    try:
        for pid in agents:
            assert wait_gone(pid), f"the agent (pid {pid}) outlived pvisor replay"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its session is left
        except ProcessLookupError:
            pass
    reliability.reap(journal)
    with JournalReader(journal) as r:
        assert r.verify().ok
        derived = [run for run in r.runs() if run.mode == "replay-only"]
        assert len(derived) == 1
        exs = r.exchanges(derived[0].id)
        assert exs and all(e.outcome != "in_flight" for e in exs)
        assert all(r.request_body(e) is not None for e in exs), [(e.seq, e.outcome) for e in exs]
        assert any(e.served_by == "playback" and e.outcome == "ok" for e in exs)
