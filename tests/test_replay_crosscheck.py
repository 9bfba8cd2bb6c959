"""prepare-only cross-check on real captures (issue 7's pass/fail rule for native sources): for
each of the six real agents captured through the gateway (the session captures of
tests/agent_captures.py: the pinned CLI run by ``pvisor run --script``; slow), and for the real
captures kept in the corpus whose session's native file is kept too (fast), for every N from 0
to the number of steps where prepare is defined, the prefix rendered from the agent's own
native file with ``--profile-from`` that run's journal equals the journal's request N+1:

- after the chain rule's normalisation (the protocol module's ``normalise``, which is
  :func:`pvisor.adapters.protocols.base.normalise_conversation` plus the protocol's own
  rules), which is the issue's criterion; and, stricter,
- as bytes once both bodies went through the agent's **named transforms** below, each of them
  a difference the native file cannot remove, listed by the same name in
  docs/result-protocol.md ("Native render vs. the recorded request"). Every other difference
  fails.

N equal to the number of steps has no recorded request N+1: there the native render is compared
(normalised) with the journal's own prepare-only prefix, rendered from request N and A_N (A_N
made no tool call, or is mini-swe-agent's submit command, whose observation the agent never sent:
both end at A_N).

Anthropic ``cache_control`` markers are compared as they are (where, how many, at most four),
and the journal's own prefix for N < steps is the recorded request byte for byte."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest

from agent_helpers import AGENTS
from conftest import corpus_dir
from corpus_runs import RUNS, record_corpus_runs
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.protocols import get_protocol
from pvisor.journal.reader import JournalReader
from pvisor.replay.prepare import PrepareOptions, prepare_only

_REMINDER = re.compile(r"\n\n<system-reminder>\n<total_tokens>[^<]*</total_tokens>\n</system-reminder>$")


def _strip_tool_result_reminders(body: dict) -> dict:
    """Claude Code appends ``<system-reminder><total_tokens>...`` to some tool results when it
    sends them; its session file stores the result without it."""
    for m in body.get("messages") or []:
        if isinstance(m.get("content"), list):
            for b in m["content"]:
                if (
                    isinstance(b, dict)
                    and b.get("type") == "tool_result"
                    and isinstance(b.get("content"), str)
                ):
                    b["content"] = _REMINDER.sub("", b["content"])
    return body


#: the fields of Codex's ``client_metadata`` that describe the turn
_CODEX_TURN_FIELDS = ("turn_id", "root_turn_id", "x-codex-turn-metadata")


def _codex_client_metadata(body: dict) -> dict:
    """Codex writes ``client_metadata`` in another key order on every request (a hash map's
    order), and its per-turn fields change with each user turn (a resumed session's prompt):
    the profile's are those of its first request."""
    meta = body.get("client_metadata")
    if isinstance(meta, dict):
        body["client_metadata"] = {k: v for k, v in sorted(meta.items()) if k not in _CODEX_TURN_FIELDS}
    return body


#: name -> transform applied to both parsed bodies before comparing; the names are those of the
#: docs table, and each agent may use only its own
TRANSFORMS: dict[str, Callable[[dict], dict]] = {
    "claude-code/tool-result-system-reminder": _strip_tool_result_reminders,
    "codex/client-metadata": _codex_client_metadata,
}

#: agent -> the named transforms it is allowed (docs/result-protocol.md)
ALLOWED: dict[str, tuple[str, ...]] = {
    "claude-code": ("claude-code/tool-result-system-reminder",),
    "codex": ("codex/client-metadata",),
    "gemini-cli": (),
    "opencode": (),
    "qwen-code": (),
    "mini-swe-agent": (),
}

DOCS = Path(__file__).resolve().parents[1] / "docs" / "result-protocol.md"


def _transformed(agent: str, body: bytes) -> bytes:
    obj = orjson.loads(body)
    for name in ALLOWED[agent]:
        obj = TRANSFORMS[name](obj)
    return orjson.dumps(obj)


def _normalised(protocol: str, body: bytes) -> Any:
    mod = get_protocol(protocol)
    return mod.normalise(mod.parse_request(body))


def _markers(body: dict) -> list[str]:
    system = body.get("system")
    out = (
        [f"system[{i}]" for i, b in enumerate(system) if "cache_control" in b]
        if isinstance(system, list)
        else []
    )
    out += [f"tools[{i}]" for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    for i, m in enumerate(body.get("messages") or []):
        if isinstance(m.get("content"), list):
            out += [
                f"messages[{i}][{j}]"
                for j, b in enumerate(m["content"])
                if isinstance(b, dict) and "cache_control" in b
            ]
    return out


def crosscheck(
    agent: str,
    journal: Path,
    run: str,
    native: Path,
    tmp: Path,
    resumed_new_chain: bool = False,
    last_n: int | None = None,
) -> list[int]:
    """Check every N (module docstring); returns the Ns compared with a journal prefix.
    ``resumed_new_chain``: the run holds a native resume that started a new chain, so the
    native file has more steps than the journal's main chain (compared up to the latter's).
    ``last_n``: compare N up to this only (the requests of a run's first attempt)."""
    with JournalReader(journal) as r:
        traj = trajectory_from_journal(r, run)
        exchanges = [d["exchange"] for d in traj.meta["steps"]]
        bodies = [r.request_body(r.exchange(x)) for x in exchanges]
    steps = len(exchanges)
    compared = []
    for n in range(steps + 1):
        if last_n is not None and n > last_n:
            break
        out = tmp / f"{run}-native-{n}"
        nat = prepare_only(
            PrepareOptions(
                agent=agent, after_step=n, output=out, trajectory=native, profile_from=f"{journal}:{run}"
            )
        )
        assert nat.result["status"] == "ok", nat.result["errors"]
        native_steps = nat.result["boundary"]["steps_total"]
        if native_steps != steps and last_n is None:
            # Gemini CLI and Qwen Code start a new chain on resume (docs/agents.md): the journal's main
            # chain stops where the file goes on with the resumed prompt
            assert native_steps > steps and resumed_new_chain, (
                f"{agent}: the native file has {native_steps} steps, the journal {steps}"
            )
            if n == steps:
                break
        got = nat.prefix_path.read_bytes()
        protocol = nat.result["prefix"]["protocol"]
        if n < steps:
            want = bodies[n]
            # the journal's own prefix is the recorded request itself
            jout = tmp / f"{run}-journal-{n}"
            jres = prepare_only(
                PrepareOptions(agent=agent, after_step=n, output=jout, run=run, journal=journal)
            )
            assert jres.prefix_path.read_bytes() == want, (agent, n)
            exact = True
        else:
            jres = prepare_only(
                PrepareOptions(
                    agent=agent, after_step=n, output=tmp / f"{run}-journal-{n}", run=run, journal=journal
                )
            )
            want = jres.prefix_path.read_bytes()
            exact = False  # rendered by us from request N and A_N, not sent by the agent
        compared.append(n)
        if protocol == "anthropic":
            g, w = orjson.loads(got), orjson.loads(want)
            assert _markers(g) == _markers(w), (agent, n)
            assert len(_markers(g)) <= 4
        g, w = _transformed(agent, got), _transformed(agent, want)
        assert _normalised(protocol, g) == _normalised(protocol, w), (agent, n)
        if exact:
            assert g == w, (agent, n)
    return compared


#: the recorded corpus runs (tests/corpus/requests, corpus_runs.py) whose session's native file
#: is in tests/corpus/native: run -> (native file, the run holds a resume that starts a new
#: chain). OpenCode's corpus sessions have no native export, Claude Code's no stored requests.
CORPUS_PAIRS: dict[str, tuple[str, bool]] = {
    "codex-single": ("real-0.171.0_single-then-resume.jsonl", False),
    "gemini-single": ("real-0.61.0_single-then-resume.jsonl", True),
    "qwen-single": ("real-0.24.4_single.jsonl", True),
    "mini-single": ("real-2.4.6_single.traj.json", False),
    "mini-parallel": ("real-2.4.6_parallel.traj.json", False),
    "mini-anthropic": ("real-2.4.6_anthropic.traj.json", False),
}


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory):
    path = tmp_path_factory.mktemp("crosscheck-corpus") / "journal.sqlite"
    record_corpus_runs(corpus_dir(), path)
    return path


@pytest.mark.parametrize("run", list(CORPUS_PAIRS))
def test_native_prefix_with_profile_equals_the_corpus_request(corpus_journal, run, tmp_path):
    """The same check on the real captures kept in the corpus (request files and the same
    sessions' native files)."""
    agent = RUNS[run][0]
    name, new_chain = CORPUS_PAIRS[run]
    compared = crosscheck(
        agent,
        corpus_journal,
        run,
        corpus_dir() / "native" / agent / name,
        tmp_path,
        resumed_new_chain=new_chain,
    )
    assert compared[:2] == [0, 1]
    if agent == "mini-swe-agent":  # N = steps too: its last step is the submit command
        assert compared == [0, 1, 2]


def test_every_allowed_difference_is_documented():
    text = DOCS.read_text()
    for agent, names in ALLOWED.items():
        for name in names:
            assert name.startswith(agent + "/") and name in TRANSFORMS
            assert f"`{name}`" in text, f"{name} is not in {DOCS.name}'s table"
    assert set(ALLOWED) == set(AGENTS)


@pytest.mark.slow
@pytest.mark.parametrize("agent", list(AGENTS))
def test_native_prefix_with_profile_equals_the_recorded_request(captured, agent, tmp_path):
    cap = captured(agent)
    assert cap.proc.returncode == 0, cap.proc.stderr
    native = Path(cap.report["native_trajectory"])
    with JournalReader(cap.journal) as r:
        attempts = len(r.attempts(cap.run))
    # test_agents.py may have resumed this session (a second attempt, more steps in the file
    # and the journal, or a new chain): the first attempt's three requests are compared then
    compared = crosscheck(agent, cap.journal, cap.run, native, tmp_path, last_n=2 if attempts > 1 else None)
    assert compared[:3] == [0, 1, 2], "the scripted run has three main-loop requests"
