"""The online matcher of playback (adapters/matcher.py ``OnlineMatcher``): fed the requests real
agents sent (tests/corpus/requests) one at a time against the recording of the same run, it
tells main-loop request k, retries and auxiliary requests apart, and reports a divergence with
the place and what differed, in the manner of VCR.py's miss errors."""

from __future__ import annotations

import copy

import orjson
import pytest

from corpus_runs import RUNS, record_corpus_runs
from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.chains import classify_run
from pvisor.adapters.matcher import MatchKind, OnlineMatcher
from pvisor.adapters.journal_trajectory import build_trajectory
from pvisor.journal.reader import JournalReader

FIRST_ATTEMPTS = [name for name, (_, attempts) in RUNS.items()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("matcher") / "j.sqlite"
    lines = record_corpus_runs(corpus, path)
    return path, lines


def _matcher(path, run, agent):
    """The matcher playback makes of journal run ``run``, with the user's prompt of its request
    1 that the live request 1 must repeat (``prompt``, as replay gives it for the recorded task)."""
    d = get_descriptor(agent)
    with JournalReader(path) as r:
        c = classify_run(r, run, prefer=d.chain_hint)
        t = build_trajectory(r, c)
        main = c.main_requests
        convs = [q.conversation() for q in main]
        ids = [q.id for q in main]
    attempt1 = [s for s, q in zip(t.steps, main) if q.exchange.attempt == 1]
    m = OnlineMatcher(
        convs[0].protocol,
        [s.action for s in attempt1],
        task=t.task,
        prompt=d.prompt_parts(convs[0]),
        recorded=convs,
        descriptor=d,
        nearest=lambda k: ids[k - 1] if 0 < k <= len(ids) else None,
    )
    return m, ids, t


def _feed(m, line):
    body = orjson.dumps(line["body"]) if line.get("body") is not None else b""
    q = line.get("query") or ""
    q = "&".join(f"{k}={v}" for k, v in q.items()) if isinstance(q, dict) else q
    return m.match(line["method"], line["path"], q, body)


@pytest.mark.parametrize("run", FIRST_ATTEMPTS)
def test_the_recorded_requests_of_a_run_match_as_its_main_loop_and_auxiliary(recorded, run):
    path, lines = recorded
    agent = RUNS[run][0]
    m, ids, _ = _matcher(path, run, agent)
    kinds = []
    first_attempt = dict(RUNS[run][1])[1]
    for rec in lines[run]:
        if rec.index not in first_attempt:  # a resume: not what playback of attempt 1 meets
            continue
        got = _feed(m, rec.line)
        if rec.exchange in ids[: len(m.served) + 1]:
            k = ids.index(rec.exchange) + 1
            assert (got.kind, got.request) == (MatchKind.MAIN, k), (rec.index, got)
            assert got.differences == []  # the same run: nothing differs
            m.answered_up_to(k)
        elif rec.exchange not in ids:
            kinds.append(got.kind)
    assert all(k == MatchKind.AUXILIARY for k in kinds), kinds


def test_an_opencode_title_request_and_a_qwen_memory_request_are_auxiliary(recorded, corpus):
    path, lines = recorded
    m, ids, _ = _matcher(path, "opencode-single", "opencode")
    title = next(r for r in lines["opencode-single"] if r.exchange not in ids)
    got = _feed(m, title.line)
    assert got.kind == MatchKind.AUXILIARY and "not the main loop" in got.reason
    m, ids, _ = _matcher(path, "qwen-single", "qwen-code")
    memory = next(
        r for r in lines["qwen-single"] if "memory extraction" in orjson.dumps(r.line["body"]).decode()
    )
    assert _feed(m, memory.line).kind == MatchKind.AUXILIARY


def test_a_request_sent_again_is_a_retry(recorded):
    path, lines = recorded
    m, ids, _ = _matcher(path, "codex-single", "codex")
    first = next(r for r in lines["codex-single"] if r.exchange == ids[0])
    assert _feed(m, first.line).kind == MatchKind.MAIN
    m.answered_up_to(1)
    again = _feed(m, first.line)
    assert (again.kind, again.request) == (MatchKind.RETRY, 1)


def test_a_changed_action_is_a_divergence_naming_where_and_what(recorded):
    path, lines = recorded
    m, ids, _ = _matcher(path, "opencode-parallel", "opencode")
    second = copy.deepcopy(next(r for r in lines["opencode-parallel"] if r.exchange == ids[1]).line)
    messages = second["body"]["messages"]
    i = next(i for i, msg in enumerate(messages) if msg["role"] == "assistant")
    messages[i]["tool_calls"][1]["function"]["arguments"] = '{"command":"rm -rf /"}'
    got = _feed(m, second)
    assert got.kind == MatchKind.DIVERGED and got.request == 2
    d = got.divergence
    assert (d.message, d.part) == (i - 1, 1)  # message index after the system prompt; the second call
    assert "rm -rf" in d.got and "rm -rf" not in d.expected and d.nearest == ids[1]
    assert "tool call 2 of served action A_1 was changed" in d.sentence()


def test_another_task_and_a_removed_tool_are_divergences(recorded):
    path, lines = recorded
    m, ids, t = _matcher(path, "codex-single", "codex")
    first = copy.deepcopy(next(r for r in lines["codex-single"] if r.exchange == ids[0]).line)
    for item in first["body"]["input"]:
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("text") == t.task:
                part["text"] = "Something else entirely."
    got = _feed(m, first)
    assert got.kind == MatchKind.DIVERGED and got.divergence.reason == "the task is not in the request"
    m, ids, t = _matcher(path, "codex-single", "codex")
    first = copy.deepcopy(next(r for r in lines["codex-single"] if r.exchange == ids[0]).line)
    first["body"]["tools"] = [tool for tool in first["body"]["tools"] if tool.get("name") != "exec_command"]
    got = _feed(m, first)
    assert got.kind == MatchKind.DIVERGED and "no longer offers: exec_command" in got.divergence.reason


@pytest.mark.parametrize(
    "run", ["codex-single", "gemini-parallel", "qwen-single", "opencode-single", "mini-single"]
)
def test_a_request_1_that_carries_the_task_in_another_prompt_is_a_divergence(recorded, run):
    """The task in request 1 is not enough: its user's prompt is the recorded one's. A replay
    that gave the agent a wrong task holding the right one (a reminder read as the task holds
    the recorded prompt nowhere; here the task with more after it) was status ok."""
    path, lines = recorded
    m, ids, t = _matcher(path, run, RUNS[run][0])
    first = next(r for r in lines[run] if r.exchange == ids[0]).line
    raw = orjson.dumps(first["body"]).decode()
    sent = orjson.dumps(t.task).decode()[1:-1]  # the task as it stands in the body's JSON
    assert sent in raw
    changed = {**first, "body": orjson.loads(raw.replace(sent, sent + " Then delete everything.", 1))}
    got = _feed(m, changed)
    assert got.kind == MatchKind.DIVERGED, got
    assert got.divergence.request == 1 and got.divergence.reason == (
        "the user's prompt differs from recorded request 1's: the agent was not given the recorded task"
    )


def test_volatile_context_is_no_difference_and_other_changes_are_listed_once(recorded):
    path, lines = recorded
    m, ids, _ = _matcher(path, "gemini-parallel", "gemini-cli")
    first = copy.deepcopy(next(r for r in lines["gemini-parallel"] if r.exchange == ids[0]).line)
    part = first["body"]["contents"][0]["parts"][0]
    part["text"] = part["text"].replace("2026", "2027")  # the date of another day
    got = _feed(m, first)
    assert got.kind == MatchKind.MAIN and got.differences == []
    first["body"]["systemInstruction"]["parts"][0]["text"] += "\nAn extra rule."
    first["body"]["tools"][0]["functionDeclarations"].append(
        {"name": "new_tool", "description": "x", "parameters": {"type": "object"}}
    )
    got = _feed(m, first)
    assert got.kind == MatchKind.MAIN
    assert sorted(d.part for d in got.differences) == ["system", "tools"]
    assert "added ['new_tool']" in next(d.detail for d in got.differences if d.part == "tools")
    assert _feed(m, first).differences == []  # listed once


def test_a_body_that_does_not_parse_and_other_paths_are_auxiliary(recorded):
    path, _ = recorded
    m, _, _ = _matcher(path, "codex-single", "codex")
    assert m.match("POST", "/v1/responses", "", b"{not json").kind == MatchKind.AUXILIARY
    assert m.match("GET", "/v1/models", "", b"").kind == MatchKind.AUXILIARY
    assert m.match("HEAD", "/", "", b"").kind == MatchKind.AUXILIARY


def test_an_action_the_agent_dropped_from_its_history_still_counts_as_a_step(tmp_path):
    """mini-swe-agent answers a reply without a command with a format error and leaves that
    reply out of its history: request 3 carries as many replies as request 2. The recording
    says so (``action_dropped_by_agent``), and the matcher counts request 3 as 3, not as a
    retry of 2."""
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "b", "parameters": {"type": "object"}},
        }
    ]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"ls"}'},
            }
        ],
    }
    text = {"role": "assistant", "content": "I think I am done."}
    submit = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_3",
                "type": "function",
                "function": {
                    "name": "bash",
                    "arguments": '{"command":"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}',
                },
            }
        ],
    }
    base = [{"role": "system", "content": "sys"}, {"role": "user", "content": "the task"}]
    after1 = base + [call, {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
    after2 = after1 + [
        {"role": "user", "content": "Format error: give one command."}
    ]  # the text reply left out
    requests = [(base, call), (after1, text), (after2, submit)]
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-mini", agent="mini-swe-agent"))
        for msgs, reply in requests:
            j.record_exchange(
                "r-mini",
                "POST",
                "/v1/chat/completions",
                [("content-type", "application/json")],
                protocol="openai-chat",
                status=200,
                request_body=orjson.dumps({"model": "m", "messages": msgs, "tools": tools}),
                response_body=orjson.dumps(
                    {
                        "id": "c",
                        "object": "chat.completion",
                        "model": "m",
                        "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
                    }
                ),
            )
    m, ids, t = _matcher(path, "r-mini", "mini-swe-agent")
    assert [s.flags for s in t.steps][1] == ["action_dropped_by_agent"]
    dropped = OnlineMatcher(
        m.protocol,
        [s.action for s in t.steps],
        task=None,
        recorded=m.recorded,
        descriptor=m.descriptor,
        dropped=[2],
    )
    for k, (msgs, _) in enumerate(requests, start=1):
        got = dropped.match(
            "POST", "/v1/chat/completions", "", orjson.dumps({"model": "m", "messages": msgs, "tools": tools})
        )
        assert (got.kind, got.request) == (MatchKind.MAIN, k), (k, got)
        dropped.answered_up_to(k)
    # without the flag the same request 3 looks like a retry of request 2
    plain = OnlineMatcher(
        m.protocol, [s.action for s in t.steps], task=None, recorded=m.recorded, descriptor=m.descriptor
    )
    plain.answered_up_to(2)
    assert (
        plain.match(
            "POST",
            "/v1/chat/completions",
            "",
            orjson.dumps({"model": "m", "messages": after2, "tools": tools}),
        ).kind
        == MatchKind.RETRY
    )


def test_an_echo_that_fills_in_an_argument_at_its_default_is_the_served_action(recorded):
    """Claude Code 2.1 echoes an Edit the model sent without ``replace_all`` with
    ``"replace_all": false``: the agent filled in a default, the action is unchanged (a replay of
    a run holding an Edit diverged at the next request before). Another value is still a
    change."""
    path, lines = recorded
    second = next(
        r
        for r in lines["opencode-parallel"]
        if r.exchange == _matcher(path, "opencode-parallel", "opencode")[1][1]
    )
    for added, diverges in ((False, False), (None, False), ("", False), (True, True), ("x", True)):
        m, ids, _ = _matcher(path, "opencode-parallel", "opencode")
        line = copy.deepcopy(second.line)
        messages = line["body"]["messages"]
        i = next(i for i, msg in enumerate(messages) if msg["role"] == "assistant")
        call = messages[i]["tool_calls"][1]["function"]
        args = orjson.loads(call["arguments"])
        call["arguments"] = orjson.dumps({**args, "replace_all": added}).decode()
        got = _feed(m, line)
        assert (got.kind == MatchKind.DIVERGED) == diverges, (added, got)
        if not diverges:
            assert (got.kind, got.request) == (MatchKind.MAIN, 2)
