"""A smoke run of the handoff benchmark's translation table (bench/handoff_bench.py; the
benchmark itself, with its 50-step runs of a real agent, runs outside CI and its figures are in
docs/benchmarks.md, "Handoff"): for the 30 ordered pairs of the six agents, a few translations
each, with the tools the targets declared in their real request 1 (the corpus of requests, and
Claude Code's from the session's capture: its traffic is never committed). Every pair must be
timed, every source call accounted for, and each source run made of tools its agent declared."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import handoff_bench  # noqa: E402  (bench/ is not a package: it is put on the path above)


def test_the_handoff_bench_times_all_thirty_pairs(captured, corpus):
    cap = captured("claude-code")
    assert cap.proc.returncode == 0, cap.proc.stderr
    requests = {
        a: handoff_bench.corpus_request_one(a, corpus / "requests") for a in handoff_bench.CORPUS_FILES
    }
    requests["claude-code"] = handoff_bench.journal_request_one(cap.journal, cap.run, "claude-code")
    requests = {a: requests[a] for a in handoff_bench.AGENTS}

    # each source run is made of the tools its agent declared (else the figure times a run no
    # agent could have made), with a parallel batch of two reads at step 4
    for agent, (protocol, tools) in requests.items():
        steps, calls = handoff_bench.source_steps(agent, protocol, tools)
        declared = {t.name for t in tools}
        names = [c.name for s in steps for c in s.action.tool_calls]
        assert len(names) == calls and set(names) <= declared, (agent, names)
        assert len(steps[3].action.tool_calls) == 2

    table = handoff_bench.translation_table(requests, repeat=3, warmup=1)
    pairs = {(a, b) for a in table for b in table[a]}
    agents = handoff_bench.AGENTS
    assert pairs == {(a, b) for a in agents for b in agents if a != b}
    for a, row in table.items():
        for b, cell in row.items():
            assert cell["ms"]["median"] > 0, (a, b)
            assert sum(cell["fates"].values()) == cell["source_calls"], (a, b, cell)
    md = handoff_bench.markdown(table).splitlines()
    assert len(md) == 2 + 6 and md[2].startswith("| claude-code | — |")
