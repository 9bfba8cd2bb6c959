"""``pvisor replay --prepare-only``: the prefix from a journal (recorded bytes of request N+1) and
from native files (rendered), the boundary rules, the output directory rules, the errors and the
result document (validated against docs/result-schema.json).

Journals: the requests real agents sent (tests/corpus/requests), recorded into a real journal by
corpus_runs.py. Native files: tests/corpus/native. Expected values come from the journal read
with the journal adapter (JournalReader + the chain rule, tested in test_steps.py) or from the
files' raw JSON, never from the code under test.

The command runs in this process (tests/cli_helpers.py) where a test reads its output, as the
``pvisor`` process where its exit codes are the point (test_cli_summary_result_stdout_and_exit_codes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import orjson
import pytest

from cli_helpers import pvisor_main
from conftest import corpus_dir
from corpus_runs import RUNS, corpus_lines, record_corpus_runs, record_cut_codex_run, record_line
from native_helpers import native_dir
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.protocols import get_protocol
from pvisor.core.errors import BadInputError, UsageError
from pvisor.journal.model import Attempt, Run, ToolResult
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal
from pvisor.gateway.proxy import finalize_response
from pvisor.replay.prepare import PrepareOptions, prepare_only

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
PVISOR = shutil.which("pvisor", path=os.path.dirname(sys.executable))


def validate(result: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(result, SCHEMA, cls=jsonschema.Draft202012Validator)


def pvisor(*args: str, journal: Path | None = None, cwd: Path | None = None, process: bool = False):
    """``pvisor [--journal JOURNAL] ARGS`` in this process (output as bytes); with ``process``,
    the installed script as its own process."""
    pre = ["--journal", str(journal)] if journal is not None else []
    if process:
        return subprocess.run(
            [PVISOR, *pre, *args], capture_output=True, timeout=120, cwd=cwd, stdin=subprocess.DEVNULL
        )
    return pvisor_main([*pre, *args], cwd=cwd)


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay-corpus") / "journal.sqlite"
    return path, record_corpus_runs(corpus_dir(), path)


def main_exchanges(journal: Path, run: str) -> list[str]:
    with JournalReader(journal) as r:
        traj = trajectory_from_journal(r, run)
    return [d["exchange"] for d in traj.meta["steps"]]


def stored_body(journal: Path, exchange: str) -> bytes:
    with JournalReader(journal) as r:
        return r.request_body(r.exchange(exchange))


def read_result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


# =========================================================================== journal source


@pytest.mark.parametrize("run", list(RUNS))
def test_journal_prefix_is_request_n_plus_1_byte_for_byte(corpus_journal, tmp_path, run):
    path, recorded = corpus_journal
    agent = RUNS[run][0]
    exchanges = main_exchanges(path, run)
    by_id = {r.exchange: r for r in recorded[run]}
    for n in range(len(exchanges)):
        out = tmp_path / f"out-{n}"
        outcome = prepare_only(PrepareOptions(agent=agent, after_step=n, output=out, run=run, journal=path))
        body = (out / "prefix.json").read_bytes()
        assert body == stored_body(path, exchanges[n])
        # the journal stores what the agent sent: the corpus line's body, as recorded
        line = by_id[exchanges[n]].line
        assert orjson.loads(body) == line["body"]
        res = read_result(out)
        validate(res)
        assert res == outcome.result
        assert res["status"] == "ok" and res["mode"] == "prepare-only"
        assert res["boundary"] == {
            "after_step": n,
            "steps_total": len(exchanges),
            "next_action_excluded": True,
        }
        p = res["prefix"]
        assert p["rendered"] is False and p["exchange"] == exchanges[n]
        assert set(p["origin"].values()) == {"journal"}
        assert p["ends_with"] == ("task" if n == 0 else "observation")
        req = json.loads((out / "prefix.request.json").read_text())
        assert req["method"] == line["method"] and req["path"] == line["path"]
        secret = {"authorization", "x-api-key", "x-goog-api-key", "cookie"}
        assert not secret & {k.lower() for k in req["headers"]}
        assert "content-length" not in req["headers"]
        assert res["replayed_tool_calls"] == 0 and res["agent_started"] is False and res["live_requests"] == 0
        assert res["boundary_user_prompt_injected"] is False and res["workspace"] is None
        assert res["derived_run"] is None and res["lineage"] is None


def test_journal_tool_calls_hash_the_recorded_arguments_and_results(corpus_journal, tmp_path):
    path, recorded = corpus_journal
    # mini-parallel: A_1 is two parallel calls, their results come in request 2 as role tool messages
    out = tmp_path / "o"
    prepare_only(
        PrepareOptions(agent="mini-swe-agent", after_step=1, output=out, run="mini-parallel", journal=path)
    )
    res = read_result(out)
    body = orjson.loads((out / "prefix.json").read_bytes())
    calls = [c for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    import hashlib

    assert len(res["tool_calls"]) == len(calls) == 2
    for rec, call in zip(res["tool_calls"], calls):
        assert rec["step"] == 1 and rec["call_id"] == call["id"] and rec["name"] == call["function"]["name"]
        assert rec["arguments_sha256"] == hashlib.sha256(call["function"]["arguments"].encode()).hexdigest()
        content = results[call["id"]]
        expected = content if isinstance(content, str) else None
        if expected is not None:
            assert rec["historical_observation_sha256"] == hashlib.sha256(expected.encode()).hexdigest()
        assert rec["replayed_observation_sha256"] is None and rec["equal"] is None


def test_tool_calls_carry_their_arguments_redacted_and_capped(tmp_path):
    """Each call of ``tool_calls`` holds its argument string as the model made it (what
    docs/replay.md tells users to check for absolute paths), key-shaped tokens redacted as in
    every text a result quotes, and at most 2,000 characters (``arguments_truncated``); the
    digest stays the exact string's (issue 40 item 4c)."""
    import hashlib

    key = "sk-ant-" + "k3y" * 12
    long_command = "printf '%s' " + "x" * 3000 + " > /tmp/long.txt"
    args = [
        json.dumps({"command": "cat /etc/hosts"}),
        json.dumps({"command": f"curl -H 'x-api-key: {key}' https://api.example/v1"}),
        json.dumps({"command": long_command}),
    ]
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": a}}
        for i, a in enumerate(args)
    ]
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Look around."},
    ]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    replies = [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "assistant", "content": "Done."},
    ]
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-args", agent="mini-swe-agent"))
        for n, reply in enumerate(replies):
            final = {"id": f"c-{n}", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]}  # fmt: skip
            j.record_exchange(
                "r-args", "POST", "/v1/chat/completions", [("content-type", "application/json")],
                protocol="openai-chat", status=200,
                request_body=orjson.dumps({"model": "m", "messages": messages, "tools": tools}),
                response_body=orjson.dumps(final),
            )  # fmt: skip
            messages = [*messages, reply]
            answered = reply.get("tool_calls", [])
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in answered]
    out = tmp_path / "o"
    prepare_only(PrepareOptions(agent="mini-swe-agent", after_step=1, output=out, run="r-args", journal=path))
    res = read_result(out)
    validate(res)
    got = res["tool_calls"]
    assert [c["arguments_sha256"] for c in got] == [hashlib.sha256(a.encode()).hexdigest() for a in args]
    assert (got[0]["arguments"], got[0]["arguments_truncated"]) == (args[0], False)
    assert got[1]["arguments"] == args[1].replace(key, "<redacted>") and key not in json.dumps(res)
    assert (got[2]["arguments"], got[2]["arguments_truncated"]) == (args[2][:2000], True)


@pytest.mark.parametrize("run", ["codex-single", "gemini-parallel", "opencode-single", "qwen-parallel"])
def test_journal_n_equal_steps_renders_request_n_plus_a_n(corpus_journal, tmp_path, run):
    path, _ = corpus_journal
    agent = RUNS[run][0]
    exchanges = main_exchanges(path, run)
    n = len(exchanges)
    with JournalReader(path) as r:
        last = trajectory_from_journal(r, run).steps[-1]
    assert not last.action.tool_calls  # the scripts end with text
    out = tmp_path / "o"
    prepare_only(PrepareOptions(agent=agent, after_step=n, output=out, run=run, journal=path))
    res = read_result(out)
    validate(res)
    p = res["prefix"]
    assert p["rendered"] is True and p["ends_with"] == "action" and p["exchange"] == exchanges[-1]
    proto = p["protocol"]
    mod = get_protocol(proto)
    prefix = mod.parse_request((out / "prefix.json").read_bytes())
    before = mod.parse_request(stored_body(path, exchanges[-1]))
    # request N's messages unchanged, then A_N and nothing else
    assert mod.normalise(prefix)["messages"][: len(before.messages)] == mod.normalise(before)["messages"]
    tail = prefix.messages[len(before.messages) :]
    assert tail and all(m.role == "assistant" for m in tail)
    text = "".join(
        getattr(part, "text", "") for m in tail for part in m.parts if type(part).__name__ == "TextPart"
    )
    assert text == last.action.text


@pytest.mark.parametrize("run", ["mini-single", "mini-parallel", "mini-anthropic"])
def test_journal_n_equal_steps_at_the_submit_command_ends_at_a_n(corpus_journal, tmp_path, run):
    """mini-swe-agent's last step is its submit command, which ends its run: no request N+1
    carries O_N, so the prefix is request N with A_N appended and A_N's calls are flagged
    ``observation_not_sent``, as from the native file of the same run."""
    path, _ = corpus_journal
    n = len(main_exchanges(path, run))
    with JournalReader(path) as r:
        last = trajectory_from_journal(r, run).steps[-1]
    commands = [json.loads(c.arguments_raw)["command"] for c in last.action.tool_calls]
    assert commands == ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    out = tmp_path / "o"
    prepare_only(PrepareOptions(agent="mini-swe-agent", after_step=n, output=out, run=run, journal=path))
    res = read_result(out)
    validate(res)
    p = res["prefix"]
    assert p["rendered"] is True and p["ends_with"] == "action" and p["origin"]["messages"] == "rendered"
    mod = get_protocol(p["protocol"])
    prefix = mod.parse_request((out / "prefix.json").read_bytes())
    before = mod.parse_request(stored_body(path, main_exchanges(path, run)[-1]))
    assert mod.normalise(prefix)["messages"][: len(before.messages)] == mod.normalise(before)["messages"]
    [tail] = prefix.messages[len(before.messages) :]
    assert tail.role == "assistant" and [c.name for c in tail.parts if hasattr(c, "arguments")] == ["bash"]
    assert [c["observation_not_sent"] for c in res["tool_calls"]][-1] is True
    assert not any(c["observation_not_sent"] for c in res["tool_calls"] if c["step"] < n)
    assert res["tool_calls"][-1]["historical_observation_sha256"] is None
    assert "observation_not_sent" in [w["code"] for w in res["warnings"]]


def test_journal_n_equal_steps_after_a_tool_call_is_observation_not_recorded(tmp_path):
    """A run cut short after A_1's tool call (codex's first request alone): no request holds
    O_1, and a shell call is no finish action."""
    path = tmp_path / "cut.sqlite"
    record_cut_codex_run(path, corpus_dir())
    out = tmp_path / "o"
    with pytest.raises(BadInputError) as exc:
        prepare_only(PrepareOptions(agent="codex", after_step=1, output=out, run="codex-cut", journal=path))
    assert exc.value.exit_code == 65 and exc.value.message.startswith("observation_not_recorded")
    res = read_result(out)
    validate(res)
    assert res["status"] == "failed" and res["prefix"] is None and res["boundary"]["steps_total"] == 1
    assert [e["code"] for e in res["errors"]] == ["observation_not_recorded"]
    assert sorted(p.name for p in out.iterdir()) == ["result.json"]


def test_journal_boundary_and_agent_errors(corpus_journal, tmp_path):
    path, _ = corpus_journal
    steps = len(main_exchanges(path, "codex-single"))
    with pytest.raises(BadInputError) as exc:
        prepare_only(
            PrepareOptions(
                agent="codex", after_step=steps + 1, output=tmp_path / "a", run="codex-single", journal=path
            )
        )
    assert "after_step_out_of_range" in exc.value.message and f"has {steps} steps" in exc.value.message
    with pytest.raises(UsageError) as exc:
        prepare_only(
            PrepareOptions(
                agent="gemini-cli", after_step=0, output=tmp_path / "b", run="codex-single", journal=path
            )
        )
    assert "recorded with agent codex" in exc.value.message
    with pytest.raises(UsageError) as exc:
        prepare_only(
            PrepareOptions(
                agent="nope", after_step=0, output=tmp_path / "c", run="codex-single", journal=path
            )
        )
    assert "unknown agent 'nope'" in exc.value.message
    with pytest.raises(UsageError):
        prepare_only(
            PrepareOptions(
                agent="codex", after_step=0, output=tmp_path / "d", run="no-such-run", journal=path
            )
        )
    with pytest.raises(UsageError) as exc:
        prepare_only(
            PrepareOptions(
                agent="codex",
                after_step=0,
                output=tmp_path / "e",
                run="codex-single",
                journal=path,
                protocol="openai-chat",
            )
        )
    assert "recorded in openai-responses" in exc.value.message


def test_journal_run_without_steps_is_no_steps(tmp_path):
    path = tmp_path / "j.sqlite"
    lines = corpus_lines(corpus_dir(), "opencode")
    with Journal.open(path, finalize=finalize_response) as j:
        j.create_run(Run(id="probe-only", agent="opencode"))
        j.start_attempt(Attempt(run="probe-only", n=1))
        record_line(j, "probe-only", 1, lines[0], 0)  # the recorder's GET /v1/models: no model request
        j.end_attempt("probe-only", 1, 0)
        j.flush()
    with pytest.raises(BadInputError) as exc:
        prepare_only(
            PrepareOptions(
                agent="opencode", after_step=0, output=tmp_path / "o", run="probe-only", journal=path
            )
        )
    assert exc.value.message.startswith("no_steps")


# =========================================================================== native source


def native_files() -> list[tuple[str, Path]]:
    out = []
    for d in sorted(native_dir().iterdir()):
        for f in sorted(d.iterdir()):
            if f.name != "PROVENANCE.md" and "db-dump" not in f.name:
                out.append((d.name, f))
    return out


@pytest.mark.parametrize("agent,path", native_files(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_native_sample_prepares_at_every_boundary(tmp_path, agent, path):
    from pvisor.adapters.native import read_native

    traj = read_native(path, agent)[0].trajectory
    steps = list(traj.steps)
    if not steps:
        with pytest.raises(BadInputError) as exc:
            prepare_only(PrepareOptions(agent=agent, after_step=0, output=tmp_path / "o", trajectory=path))
        assert exc.value.message.startswith("no_steps")
        return
    # a damaged sample (a fixture with lost lines or a mended chain) is refused by default and
    # built with --allow-damaged, each repair a warning
    from pvisor.replay.source import DAMAGE_CODES

    damaged = [w for w in read_native(path, agent)[0].diagnostics.warnings if w.code in DAMAGE_CODES]
    if damaged:
        with pytest.raises(BadInputError) as refused:
            prepare_only(
                PrepareOptions(
                    agent=agent, after_step=len(steps), output=tmp_path / "refused", trajectory=path
                )
            )
        assert (
            refused.value.message.startswith("damaged_source") and damaged[0].where in refused.value.message
        )
    for n in range(len(steps) + 1):
        out = tmp_path / f"o{n}"
        try:
            prepare_only(
                PrepareOptions(agent=agent, after_step=n, output=out, trajectory=path, allow_damaged=True)
            )
        except BadInputError as exc:
            validate(read_result(out))
            if exc.message.startswith("action_lost"):  # a gap step (a lost action line) at or before N
                assert any("lost_action" in s.flags for s in steps[:n]), exc.message
                continue
            # else only a last observation the file does not hold may refuse
            assert exc.message.startswith("observation_not_recorded"), exc.message
            assert n > 0 and steps[n - 1].action.tool_calls
            continue
        res = read_result(out)
        validate(res)
        p = res["prefix"]
        assert p["rendered"] is True and p["origin"]["messages"] == "trajectory"
        assert res["boundary"]["steps_total"] == len(steps)
        assert len(res["tool_calls"]) == sum(len(s.action.tool_calls) for s in steps[:n])
        mod = get_protocol(p["protocol"])
        conv = mod.parse_request((out / "prefix.json").read_bytes())
        assert p["message_count"] == len(conv.messages)
        compaction = traj.compaction_at(n)
        assert (p["compaction"] or {}).get("where") == (compaction.where if compaction is not None else None)
        if compaction is not None and compaction.after_step == n:
            pass  # request N+1 is the history the agent compacted to: A_N's results are in it
        elif any(c["observation_not_sent"] for c in res["tool_calls"]):
            # A_N, the last step, is the agent's finish action (mini-swe-agent's submit command,
            # OpenHands' finish tool): it ended the run, O_N was never sent and is not in the prefix
            assert n == len(steps) and p["ends_with"] == "action" and conv.messages[-1].role == "assistant"
            assert [c["step"] for c in res["tool_calls"] if c["observation_not_sent"]] == [n] * len(
                steps[n - 1].action.tool_calls
            )
        elif n > 0 and any(c.kind != "server" for c in steps[n - 1].action.tool_calls):
            # ends exactly at O_N: the last message holds the results of A_N's batch, in call order
            last = conv.messages[-1] if not steps[n - 1].observation.messages else None
            if last is not None:
                got = [
                    x
                    for m in conv.messages[-len(steps[n - 1].observation.results) :]
                    for x in m.parts
                    if isinstance(x, ToolResult)
                ]
                assert len(got) >= 1
                assert p["ends_with"] == "observation"
        # A(N+1) excluded: no call of a later step appears in the prefix
        earlier = {c.id for s in steps[:n] for c in s.action.tool_calls if c.id}
        later = {c.id for s in steps[n:] for c in s.action.tool_calls if c.id} - earlier
        present = {x.id for m in conv.messages for x in m.parts if type(x).__name__ == "ToolCall" and x.id}
        assert not (later & present)


def test_native_anthropic_cache_control_like_claude_code(tmp_path):
    path = native_dir() / "claude-code" / "spotter_tool_heavy.jsonl"
    out = tmp_path / "o"
    prepare_only(PrepareOptions(agent="claude-code", after_step=3, output=out, trajectory=path))
    body = orjson.loads((out / "prefix.json").read_bytes())
    marks = [
        (i, j)
        for i, m in enumerate(body["messages"])
        if isinstance(m["content"], list)
        for j, b in enumerate(m["content"])
        if "cache_control" in b
    ]
    last_user = max(i for i, m in enumerate(body["messages"]) if m["role"] == "user")
    assert marks == [(last_user, len(body["messages"][last_user]["content"]) - 1)]
    assert body["messages"][last_user]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    res = read_result(out)
    assert res["prefix"]["cache_breakpoints"] == 1
    assert res["prefix"]["origin"]["system"] == "absent" and res["prefix"]["system_present"] is False
    req = json.loads((out / "prefix.request.json").read_text())
    assert (req["method"], req["path"], req["query"]) == ("POST", "/v1/messages", "beta=true")
    assert res["prefix"]["origin"]["request"] == "default"


def test_native_gemini_cli_signs_the_first_function_call_of_a_turn(tmp_path):
    path = native_dir() / "gemini-cli" / "real-0.61.0_single-then-resume.jsonl"
    out = tmp_path / "o"
    prepare_only(PrepareOptions(agent="gemini-cli", after_step=1, output=out, trajectory=path))
    body = orjson.loads((out / "prefix.json").read_bytes())
    model_turns = [c for c in body["contents"] if c.get("role") == "model"]
    assert model_turns
    for c in model_turns:
        calls = [p for p in c["parts"] if "functionCall" in p]
        assert calls[0].get("thoughtSignature") == "skip_thought_signature_validator"
        assert all("thoughtSignature" not in p for p in calls[1:])
    req = json.loads((out / "prefix.request.json").read_text())
    assert req["path"] == "/v1beta/models/gemini-2.5-pro:streamGenerateContent" and req["query"] == "alt=sse"


def test_native_protocol_choice(tmp_path):
    mini = native_dir() / "mini-swe-agent"
    # litellm's provider prefix picks the protocol: anthropic/... speaks Anthropic Messages
    prepare_only(
        PrepareOptions(
            agent="mini-swe-agent",
            after_step=1,
            output=tmp_path / "a",
            trajectory=mini / "real-2.4.6_anthropic.traj.json",
        )
    )
    res = read_result(tmp_path / "a")
    assert res["prefix"]["protocol"] == "anthropic" and res["prefix"]["model"] == "claude-mock"
    prepare_only(
        PrepareOptions(
            agent="mini-swe-agent",
            after_step=1,
            output=tmp_path / "b",
            trajectory=mini / "real-2.4.6_single.traj.json",
        )
    )
    res = read_result(tmp_path / "b")
    assert res["prefix"]["protocol"] == "openai-chat" and res["prefix"]["stream"] is False
    assert res["prefix"]["origin"]["system"] == "trajectory" and res["prefix"]["system_present"] is True
    # Qwen Code speaks several: --protocol picks one
    qwen = native_dir() / "qwen-code" / "real-0.24.4_single.jsonl"
    for proto in ("openai-chat", "anthropic", "gemini"):
        prepare_only(
            PrepareOptions(
                agent="qwen-code", after_step=1, output=tmp_path / proto, trajectory=qwen, protocol=proto
            )
        )
        res = read_result(tmp_path / proto)
        validate(res)
        assert res["prefix"]["protocol"] == proto and res["prefix"]["ends_with"] == "observation"
    with pytest.raises(UsageError) as exc:
        prepare_only(
            PrepareOptions(
                agent="claude-code",
                after_step=0,
                output=tmp_path / "c",
                trajectory=native_dir() / "claude-code" / "spotter_short.jsonl",
                protocol="openai-chat",
            )
        )
    assert "claude-code speaks anthropic" in exc.value.message


def _profile_journal(path: Path, version: str) -> str:
    """A journal holding the corpus's mini-swe-agent Anthropic run, recorded as ``version``."""
    lines = corpus_lines(corpus_dir(), "mini-swe-agent")
    with Journal.open(path, finalize=finalize_response) as j:
        j.create_run(Run(id="mini-anthropic", agent="mini-swe-agent", agent_version=version))
        j.start_attempt(Attempt(run="mini-anthropic", n=1))
        for i in RUNS["mini-anthropic"][1][0][1]:
            record_line(j, "mini-anthropic", 1, lines[i], i)
        j.end_attempt("mini-anthropic", 1, 0)
        j.flush()
    return "mini-anthropic"


def test_native_profile_from_fills_params_and_request_and_matches_the_capture(tmp_path):
    journal = tmp_path / "j.sqlite"
    run = _profile_journal(journal, "2.4.6")
    native = native_dir() / "mini-swe-agent" / "real-2.4.6_anthropic.traj.json"
    out = tmp_path / "o"
    prepare_only(
        PrepareOptions(
            agent="mini-swe-agent",
            after_step=0,
            output=out,
            trajectory=native,
            profile_from=f"{journal}:{run}",
        )
    )
    res = read_result(out)
    validate(res)
    o = res["prefix"]["origin"]
    assert (
        o["system"] == "trajectory"
        and o["params"] == "profile"
        and o["request"] == "profile"
        and o["tools"] == "profile"
    )
    # N = 0 of that very run: the render equals the recorded request 1 byte for byte
    first = main_exchanges(journal, run)[0]
    assert (out / "prefix.json").read_bytes() == stored_body(journal, first)
    # N = 1: equal after the chain rule's normalisation (docs/result-protocol.md lists what differs)
    out1 = tmp_path / "o1"
    filled = prepare_only(
        PrepareOptions(
            agent="mini-swe-agent", after_step=1, output=out1, trajectory=native, profile_from=str(journal)
        )
    )
    assert "without" not in filled.summary() and "--profile-from" not in filled.summary()
    mod = get_protocol("anthropic")
    second = main_exchanges(journal, run)[1]
    assert mod.normalise(mod.parse_request((out1 / "prefix.json").read_bytes())) == mod.normalise(
        mod.parse_request(stored_body(journal, second))
    )


def test_native_profile_from_refuses_another_major_version(tmp_path):
    journal = tmp_path / "j.sqlite"
    run = _profile_journal(journal, "3.0.1")
    native = native_dir() / "mini-swe-agent" / "real-2.4.6_anthropic.traj.json"
    out = tmp_path / "o"
    with pytest.raises(BadInputError) as exc:
        prepare_only(
            PrepareOptions(
                agent="mini-swe-agent",
                after_step=1,
                output=out,
                trajectory=native,
                profile_from=f"{journal}:{run}",
            )
        )
    assert exc.value.message.startswith("profile_version_mismatch") and "3.0.1" in exc.value.message
    assert read_result(out)["errors"][0]["code"] == "profile_version_mismatch"
    with pytest.raises(UsageError):
        prepare_only(
            PrepareOptions(
                agent="mini-swe-agent",
                after_step=1,
                output=tmp_path / "p",
                trajectory=native,
                profile_from=str(tmp_path / "missing.sqlite"),
            )
        )


# =========================================================================== output directory


def test_output_directory_rules(tmp_path):
    native = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    for bad in (ws, ws / "sub", ws / "new" / "deeper"):
        with pytest.raises(UsageError) as exc:
            prepare_only(
                PrepareOptions(agent="codex", after_step=1, output=bad, trajectory=native, workspace=ws)
            )
        assert "inside --workspace" in exc.value.message
    assert not (ws / "new").exists()
    out = tmp_path / "out"
    out.mkdir()
    (out / "other.txt").write_text("x")
    with pytest.raises(UsageError) as exc:
        prepare_only(PrepareOptions(agent="codex", after_step=1, output=out, trajectory=native))
    assert "not empty" in exc.value.message and "--force" in exc.value.message
    prepare_only(PrepareOptions(agent="codex", after_step=1, output=out, trajectory=native, force=True))
    assert sorted(p.name for p in out.iterdir()) == [
        "other.txt",
        "prefix.json",
        "prefix.request.json",
        "result.json",
    ]
    # --force after a failure leaves no stale prefix of the earlier prepare
    with pytest.raises(BadInputError):
        prepare_only(PrepareOptions(agent="codex", after_step=99, output=out, trajectory=native, force=True))
    assert sorted(p.name for p in out.iterdir()) == ["other.txt", "result.json"]
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(UsageError):
        prepare_only(PrepareOptions(agent="codex", after_step=1, output=f, trajectory=native))


def test_output_below_a_file_is_a_usage_error(tmp_path):
    # the directories an --output lacks are made; one of them being a file is exit 2, as
    # docs/cli.md says, not a failed write (exit 74)
    native = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    (tmp_path / "afile").write_text("x")
    for given in ("afile/out", "afile/deeper/out"):
        p = pvisor("replay", "--agent", "codex", "--trajectory", str(native), "--after-step", "1",
                   "--prepare-only", "--output", given, cwd=tmp_path)  # fmt: skip
        assert p.returncode == 2, p.stderr
        assert p.stderr.decode().strip() == (
            f"pvisor: error: --output {given}: {tmp_path / 'afile'} is not a directory"
        )
    assert (tmp_path / "afile").read_text() == "x"


# =========================================================================== the command


def test_cli_summary_says_a_render_has_no_system_prompt_or_tools_and_names_profile_from(tmp_path):
    native = native_dir() / "gemini-cli" / "real-0.61.0_single-then-resume.jsonl"
    out = tmp_path / "g"
    p = pvisor("replay", "--agent", "gemini-cli", "--trajectory", str(native), "--after-step", "1",
               "--prepare-only", "--output", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    [line] = p.stdout.decode().splitlines()
    assert line.endswith(
        ", rendered, without system prompt and tools (the native file holds none; --profile-from "
        "JOURNAL[:RUN] fills them from a capture of this agent)"
    ), line
    prefix = read_result(out)["prefix"]
    assert prefix["system_present"] is False and prefix["tools_present"] is False


def test_cli_summary_escapes_control_characters_of_the_output_path(tmp_path):
    """The summary line printed ``--output`` with its control characters raw: a directory named
    with ESC sequences could clear or retitle the terminal (issue 35 item 14). They are escaped as
    every message escapes them; the files go where asked, under the real name."""
    native = native_dir() / "gemini-cli" / "real-0.61.0_single-then-resume.jsonl"
    out = tmp_path / "out\x1b[2J\x1b]0;pwned\x07\nnext"
    for extra in ((), ("--result", "-")):
        p = pvisor("replay", "--agent", "gemini-cli", "--trajectory", str(native), "--after-step", "1",
                   "--prepare-only", "--output", str(out), "--force", *extra)  # fmt: skip
        assert p.returncode == 0, p.stderr
        summary = p.stderr if extra else p.stdout
        assert b"\x1b" not in summary and b"\x07" not in summary, summary
        [line] = summary.decode().splitlines()[-1:]
        assert line.startswith(f"prepared {tmp_path}/out\\x1b[2J\\x1b]0;pwned\\x07\\nnext/prefix.json: "), (
            line
        )
        assert summary.count(b"\n") == 1, summary
    assert read_result(out)["status"] == "ok"


def test_cli_summary_result_stdout_and_exit_codes(corpus_journal, tmp_path):
    """The ``pvisor`` process itself: its output and its exit codes."""
    path, _ = corpus_journal
    native = native_dir() / "qwen-code" / "real-0.24.4_single.jsonl"
    out = tmp_path / "a"
    p = pvisor(
        "replay",
        "--agent",
        "qwen-code",
        "--trajectory",
        str(native),
        "--after-step",
        "1",
        "--prepare-only",
        "--output",
        str(out),
        process=True,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith(f"prepared {out}/prefix.json: qwen-code")
        and "after step 1 of 3" in lines[0]
    )
    # the task alone: one message, said in the singular
    p = pvisor(
        "replay", "--agent", "qwen-code", "--trajectory", str(native), "--after-step", "0", "--prepare-only",
        "--output", str(tmp_path / "zero"), process=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert ", 1 message ending with the task, rendered" in p.stdout.decode()
    out = tmp_path / "b"
    p = pvisor(
        "replay",
        "--agent",
        "codex",
        "--run",
        "codex-single",
        "--after-step",
        "2",
        "--prepare-only",
        "--output",
        str(out),
        "--result",
        "-",
        journal=path,
        process=True,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == read_result(out)
    assert p.stderr.decode().startswith("prepared ")
    cases = [
        (["--agent", "codex", "--run", "codex-single", "--after-step", "99"], 65, "after_step_out_of_range"),
        (
            ["--agent", "mini-swe-agent", "--run", "mini-single", "--after-step", "3"],
            65,
            "after_step_out_of_range",
        ),
        (["--agent", "codex", "--run", "codex-single", "--after-step", "-1"], 2, "-1"),
        (["--agent", "nope", "--run", "codex-single", "--after-step", "0"], 2, "unknown agent"),
        (["--agent", "codex", "--after-step", "0"], 2, "exactly one source"),
        (
            ["--agent", "codex", "--run", "codex-single", "--trajectory", str(native), "--after-step", "0"],
            2,
            "exactly one source",
        ),
        (
            [
                "--agent",
                "qwen-code",
                "--trajectory",
                str(native_dir() / "qwen-code" / "agent-sessions_system_telemetry.jsonl"),
                "--after-step",
                "0",
            ],
            65,
            "no_steps",
        ),
    ]
    for i, (args, code, text) in enumerate(cases):
        p = pvisor(
            "replay", *args, "--prepare-only", "--output", str(tmp_path / f"e{i}"), journal=path, process=True
        )
        err = p.stderr.decode()
        assert p.returncode == code, (args, err)
        assert text in err and "Traceback" not in err
        assert err.startswith("pvisor: error: ")
    # --result - on a failure: stdout is the failed document, still one JSON value
    out = tmp_path / "failed"
    p = pvisor(
        "replay",
        "--agent",
        "mini-swe-agent",
        "--run",
        "mini-single",
        "--after-step",
        "3",
        "--prepare-only",
        "--output",
        str(out),
        "--result",
        "-",
        journal=path,
        process=True,
    )
    assert p.returncode == 65
    doc = json.loads(p.stdout)
    validate(doc)
    assert (
        doc == read_result(out)
        and doc["status"] == "failed"
        and doc["errors"][0]["code"] == "after_step_out_of_range"
    )
    p = pvisor(
        "replay",
        "--agent",
        "codex",
        "--run",
        "codex-single",
        "--after-step",
        "0",
        "--output",
        str(tmp_path / "x"),
        journal=path,
        process=True,
    )
    # no mode flag is a continuation, which needs a workspace to run the agent in
    assert p.returncode == 2 and b"needs --workspace DIR" in p.stderr


def test_cli_in_process_with_standalone_mode_false(corpus_journal, tmp_path):
    from pvisor.cli import cli

    path, _ = corpus_journal
    out = tmp_path / "o"
    cli.main(
        args=[
            "--journal",
            str(path),
            "replay",
            "--agent",
            "gemini-cli",
            "--run",
            "gemini-single",
            "--after-step",
            "1",
            "--prepare-only",
            "--output",
            str(out),
        ],
        prog_name="pvisor",
        standalone_mode=False,
    )
    validate(read_result(out))


def test_a_config_files_continuation_options_are_ignored_with_a_warning_in_prepare_only(
    corpus_journal, tmp_path
):
    path, _ = corpus_journal
    cfg = tmp_path / "replay.toml"
    cfg.write_text(
        'agent = "codex"\nrun = "codex-single"\nafter_step = 1\nmode = "prepare-only"\n'
        'upstream = "http://127.0.0.1:9"\nmax_steps = 3\n'
    )
    p = pvisor("replay", "--config", str(cfg), "--output", str(tmp_path / "out"), journal=path)
    assert p.returncode == 0, p.stderr
    said = f"{cfg}: upstream, max_steps are for a continuation; --prepare-only ignores them"
    assert p.stderr.decode().count(said) == 1, p.stderr  # once, though the result holds it too
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["mode"] == "prepare-only"
    # in result.json too (issue 40 item 5), first, and also in a failed one
    assert result["warnings"][0] == {"code": "options_ignored", "message": said}
    cfg.write_text(cfg.read_text().replace("after_step = 1", "after_step = 99"))
    p = pvisor("replay", "--config", str(cfg), "--output", str(tmp_path / "out-failed"), journal=path)
    assert p.returncode == 65, p.stderr
    result = json.loads((tmp_path / "out-failed" / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["warnings"][0] == {"code": "options_ignored", "message": said}


def test_a_config_files_start_state_options_are_ignored_with_a_warning_in_prepare_only(
    corpus_journal, tmp_path
):
    """no_restore and env_from are replay-only's and a continuation's: replay.toml's under
    --prepare-only are warned about as the continuation's keys are (on the command line they are
    usage errors); at their defaults (replay.toml's template) they change nothing and are not."""
    path, _ = corpus_journal
    cfg = tmp_path / "replay.toml"
    head = 'agent = "codex"\nrun = "codex-single"\nafter_step = 1\nmode = "prepare-only"\n'
    cfg.write_text(head + 'no_restore = true\nenv_from = "none"\nmax_steps = 3\n')
    p = pvisor("replay", "--config", str(cfg), "--output", str(tmp_path / "out"), journal=path)
    assert p.returncode == 0, p.stderr
    said = (
        f"{cfg}: max_steps are for a continuation; no_restore, env_from are for replay-only and a "
        "continuation; --prepare-only ignores them"
    )
    assert p.stderr.decode().count(said) == 1, p.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["warnings"][0] == {"code": "options_ignored", "message": said}
    cfg.write_text(head + 'no_restore = false\nenv_from = "recorded"\n')
    p = pvisor("replay", "--config", str(cfg), "--output", str(tmp_path / "out-default"), journal=path)
    assert p.returncode == 0 and b"ignores them" not in p.stderr, p.stderr
    result = json.loads((tmp_path / "out-default" / "result.json").read_text())
    assert not [w for w in result["warnings"] if w["code"] == "options_ignored"]


def test_step_flags_of_a_native_source_reach_the_results_warnings(tmp_path):
    """A native file's step flags are warned about as a journal run's are (here Codex steps
    after a compaction): the prefix of such a step is not what the agent sent, and says so."""
    from pvisor.replay.prepare import PrepareOptions, prepare_only

    src = (
        Path(__file__).resolve().parent
        / "corpus"
        / "native"
        / "codex"
        / "agent-sessions_schema_coverage.jsonl"
    )
    out = tmp_path / "out"
    # (the fixture's trimmed ids leave an output that answers no call: a gap at step 5, so the
    # damaged file is read with allow_damaged and N stays below the gap)
    outcome = prepare_only(
        PrepareOptions(agent="codex", after_step=4, output=out, trajectory=src, allow_damaged=True)
    )
    warned = [w["message"] for w in outcome.result["warnings"] if w["code"] == "compaction"]
    assert warned == ["step 4: compaction"]
    # below the compaction, no such warning
    early = prepare_only(
        PrepareOptions(
            agent="codex", after_step=3, output=tmp_path / "early", trajectory=src, allow_damaged=True
        )
    )
    assert not [w for w in early.result["warnings"] if w["code"] == "compaction"]


def test_a_source_warning_names_the_file(tmp_path):
    # a warning of the reader is FILE: WHERE: CODE: ..., on stderr and in result.json, as
    # pvisor trajectory show and pvisor view print it
    source = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    cut = tmp_path / "cut.jsonl"
    data = source.read_bytes()
    cut.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 40])  # the last line cut off
    out = tmp_path / "out"
    p = pvisor("replay", "--agent", "codex", "--trajectory", "cut.jsonl", "--after-step", "1",
               "--prepare-only", "--output", str(out), cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    warned = [line for line in p.stderr.decode().splitlines() if line.startswith("pvisor: warning: ")]
    assert warned and all(line.startswith("pvisor: warning: cut.jsonl: line ") for line in warned), warned
    result = read_result(out)
    assert [w["message"] for w in result["warnings"] if w["code"] == "truncated_line"] == [
        line.removeprefix("pvisor: warning: ") for line in warned if "truncated_line" in line
    ]


def test_a_submit_the_reader_flags_is_observation_not_sent_in_the_result_warnings(tmp_path):
    """mini-swe-agent submits when a command's first output line is its marker, so ``cd /tmp &&
    echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` ends the run too (the real 2.4.6 run,
    tests/corpus/native/mini-swe-agent, with its submit command so written). The reader flags
    the step ``submitted`` and ``observation_not_sent``, but the result at N = 2 had neither
    the warning nor the calls' flag, and its prefix held the padded result the model never saw.
    Now result.json's ``warnings`` say ``observation_not_sent`` and the prefix ends at A_2."""
    doc = json.loads((native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json").read_text())
    submit = doc["messages"][4]
    cmd = "cd /tmp && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    submit["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": cmd})
    submit["extra"]["actions"][0]["command"] = cmd
    src = tmp_path / "cd.traj.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "o"
    prepare_only(PrepareOptions(agent="mini-swe-agent", after_step=2, output=out, trajectory=src))
    res = read_result(out)
    validate(res)
    assert "observation_not_sent" in [w["code"] for w in res["warnings"]]
    assert [c["observation_not_sent"] for c in res["tool_calls"]] == [False, True]
    assert res["prefix"]["ends_with"] == "action"
