"""Continuation through the responder seam, in process (replay/continuation.py): the real gateway
on 127.0.0.1 answers with ContinuationResponder and forwards to a real HTTP upstream that keeps
every body it receives; the requests are those real agents sent (tests/corpus/requests,
recorded into a real journal) or made with the official ``openai`` SDK. The six real agents
meet continuation in tests/test_continue_agents.py."""

from __future__ import annotations

import copy

import openai
import orjson
import pytest
from corpus_runs import record_corpus_runs
from gateway_helpers import json_upstream, wait_exchanges
from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import IdSource
from pvisor.journal.model import Action, ToolCall
from pvisor.journal.reader import JournalReader
from pvisor.replay.continuation import ContinuationResponder, LivePolicy, ReasoningPolicy
from pvisor.replay.playback import PathRewrites
from pvisor.replay.recording import journal_recording
from replay_helpers import send_line

PROMPT = "Now say which file you wrote first."


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("continuation") / "j.sqlite"
    return path, record_corpus_runs(corpus, path)


def _live_reply(protocol: str, text: str = "live reply", calls: list[ToolCall] | None = None) -> bytes:
    mod = get_protocol(protocol)
    return orjson.dumps(
        mod.action_to_response(
            Action(text=text, tool_calls=calls or []), model="live-model", ids=IdSource(99)
        )
    )


def _continue(stack, journal, run, agent, n, protocol, policy=None, reply=None):
    policy = policy or LivePolicy()
    rec = journal_recording(journal, run, agent, n, None)
    p = ContinuationResponder(rec, n, get_descriptor(agent), PathRewrites([]), policy)
    up = stack.raw_upstream(json_upstream(reply or _live_reply(protocol)))
    upstream = {
        "openai-responses": "openai",
        "openai-chat": "openai",
        "gemini": "gemini",
        "anthropic": "anthropic",
    }
    gw = stack.gateway({upstream[protocol]: up.url}, responder=p, name=f"cont-{run}-{n}-{id(policy)}")
    return p, gw, up


def test_request_n_plus_1_goes_live_byte_identical_and_is_recorded(stack, corpus_journal):
    journal, lines = corpus_journal
    p, gw, up = _continue(stack, journal, "codex-parallel", "codex", 1, "openai-responses")
    first, second = lines["codex-parallel"][:2]
    assert send_line(gw, first.line)[0] == 200  # A_1 from the recording
    assert up.requests == []
    status, _, body = send_line(gw, second.line)
    assert status == 200 and body == _live_reply("openai-responses")
    [(method, path, _, got)] = up.requests
    assert method == "POST" and path == second.line["path"]
    assert got == orjson.dumps(second.line["body"])  # byte for byte what the agent sent
    assert not p.ended.is_set() and p.boundary is not None and p.live_steps == [2]
    [live] = p.live
    assert live.byte_identical and live.changes == [] and live.sent_sha256 == live.forwarded_sha256
    exs = wait_exchanges(gw, 2)
    assert [e.served_by for e in exs] == ["playback", "upstream"]
    assert exs[1].flags == ("live",) and exs[1].forwarded_body is None


def test_the_boundary_prompt_is_placed_once_after_o_n_in_every_later_request(stack, corpus_journal):
    journal, lines = corpus_journal
    p, gw, up = _continue(
        stack, journal, "codex-parallel", "codex", 1, "openai-responses", LivePolicy(boundary_prompt=PROMPT)
    )
    first, second = lines["codex-parallel"][:2]
    send_line(gw, first.line)
    send_line(gw, second.line)
    sent = second.line["body"]
    at = len(sent["input"])
    forwarded = orjson.loads(up.requests[0][3])
    assert forwarded["input"][:at] == sent["input"] and forwarded["input"][at + 1 :] == []
    assert forwarded["input"][at]["role"] == "user"
    assert forwarded["input"][at]["content"][0]["text"] == PROMPT
    assert p.prompt_injected and p.live[0].prompt_at == at and not p.live[0].byte_identical
    # request N+2: the agent's history holds the live reply but not the prompt; it is put back
    later = copy.deepcopy(sent)
    later["input"] += [
        {"type": "function_call", "call_id": "call_live", "name": "shell", "arguments": '{"command":["ls"]}'},
        {"type": "function_call_output", "call_id": "call_live", "output": "a.txt"},
    ]
    send_line(gw, second.line, later)
    again = orjson.loads(up.requests[1][3])
    assert [
        i.get("content", [{}])[0].get("text") if i.get("role") == "user" else None for i in again["input"]
    ].count(PROMPT) == 1
    assert (
        again["input"][at]["content"][0]["text"] == PROMPT and again["input"][at + 1 :] == later["input"][at:]
    )
    assert p.live_steps == [2, 3]
    exs = wait_exchanges(gw, 3)
    with JournalReader(gw.journal_path) as r:
        # the journal keeps both: what the agent sent and what went upstream
        assert r.request_body(exs[1]) == orjson.dumps(sent)
        assert r.forwarded_body(exs[1]) == up.requests[0][3]
    assert exs[1].flags == ("live", "boundary_prompt")
    # and the CLI shows them
    import subprocess
    import sys
    from pathlib import Path

    cli = str(Path(sys.executable).with_name("pvisor"))
    shown = subprocess.run(
        [cli, "--journal", str(gw.journal_path), "journal", "body", exs[1].id, "--forwarded"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0 and shown.stdout == up.requests[0][3]
    first = subprocess.run(
        [cli, "--journal", str(gw.journal_path), "journal", "body", exs[0].id, "--forwarded"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert first.returncode == 2 and b"has no forwarded body" in first.stderr


def test_the_step_budget_ends_the_agent_with_its_final_reply(stack, corpus_journal):
    journal, lines = corpus_journal
    p, gw, up = _continue(
        stack, journal, "codex-parallel", "codex", 1, "openai-responses", LivePolicy(max_steps=1)
    )
    first, second = lines["codex-parallel"][:2]
    send_line(gw, first.line)
    send_line(gw, second.line)
    assert not p.ended.is_set()
    later = copy.deepcopy(second.line["body"])
    later["input"] += [
        {"type": "function_call", "call_id": "call_live", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_live", "output": "x"},
    ]
    status, _, body = send_line(gw, second.line, later)
    final = get_protocol("openai-responses").reassemble([body]).final
    assert status == 200 and "pvisor: the replay ends here." in orjson.dumps(final).decode()
    assert p.ended.is_set() and p.budget_end == 3 and len(up.requests) == 1
    assert wait_exchanges(gw, 3)[2].flags == ("synthetic_end", "step_budget")


def test_auxiliary_requests_after_the_boundary_go_live(stack, corpus_journal):
    journal, lines = corpus_journal
    p, gw, up = _continue(stack, journal, "opencode-single", "opencode", 0, "openai-chat")
    title = next(r for r in lines["opencode-single"] if r.line["body"].get("tools") in (None, []))
    main = [r for r in lines["opencode-single"] if r.line["body"].get("tools")]
    send_line(gw, title.line)  # before the boundary: from the recording
    assert up.requests == []
    send_line(gw, main[0].line)  # N = 0: request 1 is the boundary
    send_line(gw, title.line)  # after it: live
    assert len(up.requests) == 2 and [lr.request for lr in p.live] == [1, None]


def test_another_model_is_asked_for_and_listed(stack, corpus_journal):
    journal, lines = corpus_journal
    p, gw, up = _continue(
        stack, journal, "codex-parallel", "codex", 1, "openai-responses", LivePolicy(live_model="gpt-live")
    )
    first, second = lines["codex-parallel"][:2]
    send_line(gw, first.line)
    send_line(gw, second.line)
    assert orjson.loads(up.requests[0][3])["model"] == "gpt-live"
    assert p.live[0].rewrites == [
        {"of": "model", "kind": "live_model", "from": second.line["body"]["model"], "to": "gpt-live"}
    ]


def _reasoning_run(journal_path, lines):
    """A Codex run whose reply 1 carries an encrypted reasoning item (as OpenAI sends with
    ``store: false``), sent back by the client in request 2; made from the corpus run's first
    request with the protocol module's own renderer."""
    from corpus_runs import record_line
    from pvisor.journal.model import Attempt, Reasoning, Run
    from pvisor.journal.writer import Journal

    mod = get_protocol("openai-responses")
    first = {k: v for k, v in lines["codex-parallel"][0].line.items() if k != "reply"}
    call = ToolCall(id="call_r1", name="exec_command", arguments_raw='{"cmd":"ls"}', arguments={"cmd": "ls"})
    action = Action(
        text="", reasoning=[Reasoning(text="plan", encrypted="gAAAA-other-org")], tool_calls=[call]
    )
    final = mod.action_to_response(action, model="gpt-5-codex", ids=IdSource(5))
    second = {**first["body"], "input": mod.conversation_items(first["body"], final)}
    second["input"] = second["input"] + [
        {"type": "function_call_output", "call_id": "call_r1", "output": "a.txt"}
    ]
    with Journal.open(journal_path) as j:
        j.create_run(Run(id="codex-reasoning", agent="codex"))
        j.start_attempt(Attempt(run="codex-reasoning", n=1))
        one = {**first, "response": final}
        one["body"] = {**first["body"], "stream": False}
        record_line(j, "codex-reasoning", 1, one)
        two = {
            **first,
            "body": {**second, "stream": False},
            "response": orjson.loads(_live_reply("openai-responses")),
        }
        record_line(j, "codex-reasoning", 1, two)
        j.end_attempt("codex-reasoning", 1, 0)
    return one, two


def test_served_reasoning_is_stripped_when_asked(stack, tmp_path, corpus_journal):
    _, lines = corpus_journal
    journal = tmp_path / "reasoning.sqlite"
    one, two = _reasoning_run(journal, lines)
    keep, gw_keep, up_keep = _continue(stack, journal, "codex-reasoning", "codex", 1, "openai-responses")
    strip, gw_strip, up_strip = _continue(
        stack,
        journal,
        "codex-reasoning",
        "codex",
        1,
        "openai-responses",
        LivePolicy(reasoning=ReasoningPolicy.STRIP),
    )
    for p, gw in ((keep, gw_keep), (strip, gw_strip)):
        assert send_line(gw, one)[0] == 200
        assert send_line(gw, two)[0] == 200
        assert p.divergence is None and p.live, (p.divergence, p.auxiliary, p.served)
    served = [i for i in two["body"]["input"] if i.get("type") == "reasoning"]
    assert served and served[0]["encrypted_content"] == "gAAAA-other-org"
    kept = orjson.loads(up_keep.requests[0][3])["input"]
    stripped = orjson.loads(up_strip.requests[0][3])["input"]
    assert up_keep.requests[0][3] == orjson.dumps(two["body"])  # keep: as the agent sent it
    assert [i for i in kept if i.get("type") == "reasoning"] == served
    assert [i for i in stripped if i.get("type") == "reasoning"] == []
    assert stripped == [i for i in kept if i.get("type") != "reasoning"]
    assert strip.live[0].changes == ["reasoning_stripped"] and keep.live[0].changes == []
    assert {w["of"] for w in strip.live[0].rewrites} == {"reasoning"}
    assert [w["kind"] for w in strip.live[0].rewrites] == ["reasoning_item_dropped"]


def test_previous_response_id_of_a_served_reply_is_expanded_before_forwarding(stack, corpus_journal):
    """No pinned agent sends ``previous_response_id``; the official SDK does."""
    journal, lines = corpus_journal
    p, gw, up = _continue(stack, journal, "codex-parallel", "codex", 1, "openai-responses")
    first, second = lines["codex-parallel"][:2]
    b1 = dict(first.line["body"])
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test-key-for-expansion", max_retries=0)
    known = ("model", "input", "tools", "instructions", "stream")
    extra = {k: v for k, v in b1.items() if k not in known}
    r1 = client.responses.create(
        model=b1["model"],
        input=b1["input"],
        tools=b1["tools"],
        instructions=b1.get("instructions"),
        extra_body=extra,
    )
    assert r1.id and [s.request for s in p.served] == [1]
    new_items = second.line["body"]["input"][len(b1["input"]) :]
    outputs = [i for i in new_items if i.get("type", "").endswith("_output")]
    r2 = client.responses.create(
        model=b1["model"],
        previous_response_id=r1.id,
        input=outputs,
        tools=b1["tools"],
        instructions=b1.get("instructions"),
        extra_body=extra,
    )
    assert r2.output_text == "live reply"
    [(_, _, _, got)] = up.requests
    forwarded = orjson.loads(got)
    assert "previous_response_id" not in forwarded
    assert (
        forwarded["input"][: len(b1["input"])] == b1["input"]
        and forwarded["input"][-len(outputs) :] == outputs
    )
    assert len(forwarded["input"]) > len(b1["input"]) + len(outputs)  # A_1's output items in between
    assert p.expansions and p.expansions[0]["previous_response_id"] == r1.id
    assert p.live[0].changes == ["previous_response_expanded"] and p.live[0].request == 2


def _cli(journal, *args: str):
    import subprocess
    import sys
    from pathlib import Path

    cli = str(Path(sys.executable).with_name("pvisor"))
    return subprocess.run(
        [cli, "--journal", str(journal), *args, "--no-progress"],
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_steps_rows_and_atif_of_live_steps_show_what_the_live_model_got(
    stack, tmp_path, corpus_journal, harbor
):
    """A continuation after step 1 of a Codex run whose reply 1 carries encrypted reasoning,
    with a boundary prompt and ``--reasoning strip``, against the scripted model: requests 2 and
    3 reach the live model with the prompt injected and the reasoning removed. ``journal
    steps``, the rows and the ATIF of the derived run show that context, flag the steps, and
    keep the agent's own bytes (issue 34, item 7)."""
    import hashlib
    import json

    _, lines = corpus_journal
    journal = tmp_path / "reasoning.sqlite"
    one, two = _reasoning_run(journal, lines)
    rec = journal_recording(journal, "codex-reasoning", "codex", 1, None)
    policy = LivePolicy(boundary_prompt=PROMPT, reasoning=ReasoningPolicy.STRIP)
    p = ContinuationResponder(rec, 1, get_descriptor("codex"), PathRewrites([]), policy)
    live = stack.scripted(
        {
            "model": "live-model",
            "turns": [{"text": "never served"}, {"text": "A live step."}, {"text": "Done."}],
        }
    )
    gw = stack.gateway({"openai": live}, responder=p, name="cont-context")
    assert send_line(gw, one)[0] == 200  # A_1 from the recording
    status, _, reply = send_line(gw, two)  # request 2, the boundary: live
    assert status == 200 and p.live[0].changes == ["boundary_prompt", "reasoning_stripped"]
    mod = get_protocol("openai-responses")
    three = {
        **two["body"],
        "input": mod.conversation_items(two["body"], orjson.loads(reply))
        + [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}],
    }
    assert send_line(gw, two, three)[0] == 200  # request 3: live again, the prompt put back
    exs = stack.exchanges(gw)
    assert [e.served_by for e in exs] == ["playback", "upstream", "upstream"]
    with JournalReader(gw.journal_path) as r:
        sent = [r.request_body(e) for e in exs]
        forwarded = [r.forwarded_body(e) if e.forwarded_body else None for e in exs]
    assert forwarded[0] is None and PROMPT.encode() in forwarded[1] and PROMPT.encode() in forwarded[2]
    assert all(PROMPT.encode() not in b for b in sent)  # the agent never sent it
    both = ["boundary_prompt", "reasoning_stripped"]

    # journal steps: the live steps are flagged and say what the model got
    proc = _cli(gw.journal_path, "journal", "steps", gw.run, "--json")
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(proc.stdout)["steps"]
    assert [s["exchange"] for s in steps] == [e.id for e in exs]
    assert [[f for f in s["flags"] if f in both] for s in steps] == [[], both, both]
    assert "forwarded" not in steps[0]["details"]
    for s, e, f in zip(steps[1:], exs[1:], forwarded[1:]):
        assert s["details"]["forwarded"] == {
            "sha256": hashlib.sha256(f).hexdigest(),
            "agent_sha256": e.request_body,
            "added_user_text": [PROMPT],
        }
    human = _cli(gw.journal_path, "journal", "steps", gw.run)
    assert human.returncode == 0 and human.stdout.decode().count(f"it added {PROMPT!r}") == 2
    assert f"pvisor journal body {exs[1].id} --forwarded" in human.stdout.decode()

    # rows: the context of a live step is the forwarded request; the agent's stays beside it
    out = tmp_path / "rows.jsonl"
    assert (
        _cli(gw.journal_path, "journal", "export", gw.run, "--format", "rows", "-o", str(out)).returncode == 0
    )
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert rows[0]["prefix"] == orjson.loads(sent[0]) and rows[0]["agent_prefix"] is None
    for row, s, f in zip(rows[1:], sent[1:], forwarded[1:]):
        assert row["prefix"] == orjson.loads(f) and row["agent_prefix"] == orjson.loads(s)
        assert [i for i in row["prefix"]["input"] if i.get("type") == "reasoning"] == []
        assert row["digests"]["prefix_sha256"] == hashlib.sha256(f).hexdigest()
        assert row["digests"]["agent_prefix_sha256"] == hashlib.sha256(s).hexdigest()
        assert [x for x in row["flags"] if x in both] == both
    assert rows[0]["digests"]["agent_prefix_sha256"] == rows[0]["digests"]["prefix_sha256"]
    # the live model got reply 1 without its reasoning ("plan") and with the boundary prompt: a
    # new segment from step 2 (docs/exports.md "Segments"), the boundary named first
    assert rows[0]["completion"]["reasoning_content"] == "plan"
    assert [(r["segment"], r["segment_break"]) for r in rows] == [
        (0, None),
        (1, "boundary_prompt"),
        (1, None),
    ]
    assert "reasoning_content" not in rows[1]["prompt"][4]

    # ATIF: the boundary prompt is a user step, once, between step 1 and the first live step
    atif = tmp_path / "run.atif.json"
    assert (
        _cli(gw.journal_path, "journal", "export", gw.run, "--format", "atif", "-o", str(atif)).returncode
        == 0
    )
    doc = json.loads(atif.read_bytes())
    kinds = [(s["source"], s["extra"].get("pvisor_step") if s.get("extra") else None) for s in doc["steps"]]
    at = kinds.index(("agent", 2))
    assert doc["steps"][at - 1]["source"] == "user" and doc["steps"][at - 1]["message"] == PROMPT
    assert [s["message"] for s in doc["steps"] if s["source"] == "user"].count(PROMPT) == 1
    live_steps = [s for s in doc["steps"] if s["source"] == "agent"][1:]
    assert [[f for f in s["extra"]["flags"] if f in both] for s in live_steps] == [both, both]
    assert [s["extra"]["forwarded"]["agent_sha256"] for s in live_steps] == [e.request_body for e in exs[1:]]
    assert harbor([atif]) == {str(atif): []}
