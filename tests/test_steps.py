"""Main-loop and auxiliary exchanges by the chain rule, and the journal adapter (run -> steps).

First on the requests real agents sent (tests/corpus/requests, recorded into a real journal by
corpus_runs.py): every expected value (arguments, call ids, observation contents) is read from
the corpus lines' raw JSON here, never through the code under test. Then synthetic runs through
the real gateway with the official SDKs (a 529 the SDK retries, cache_control markers moving, a
HEAD probe, a token count, a title request, a dropped action), synthetic journals for the rules
the agents did not exercise (ties, a second chain, tools changing, interrupted and missing
replies, bad bodies), the writer's ``set_exchange_roles``, and ``pvisor journal steps``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from cli_helpers import pvisor_main
from corpus_runs import RUNS, record_corpus_runs, record_line, corpus_lines
from gateway_helpers import http_request
from pvisor.adapters.chains import ChainHint, classify_run
from pvisor.adapters.journal_trajectory import trajectory_from_journal, trajectory_to_json
from pvisor.adapters.protocols import anthropic as A
from pvisor.adapters.protocols import gemini as G
from pvisor.adapters.protocols import openai_chat as C
from pvisor.adapters.protocols import openai_responses as R
from pvisor.adapters.protocols.base import IdSource
from pvisor.gateway.proxy import finalize_response
from pvisor.gateway.scripted_model import ScriptedModel, parse_script
from pvisor.journal.model import Action, Run, ToolCall
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal


def pvisor(*args: str, journal: Path):
    """``pvisor --journal JOURNAL ARGS`` in this process (tests/cli_helpers.py), output as bytes."""
    return pvisor_main(["--journal", str(journal), *args])


def steps_of(path: Path, run: str, **kw):
    with JournalReader(path) as r:
        return trajectory_from_journal(r, run, **kw)


# =========================================================================== corpus runs


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory, corpus):
    """Every corpus run recorded once into one journal: (path, run name -> recorded lines)."""
    path = tmp_path_factory.mktemp("corpus") / "journal.sqlite"
    return path, record_corpus_runs(corpus, path)


def tool_calls_in_reply(line: dict) -> list[tuple[str | None, str, str]]:
    """(call id, name, exact argument text) of every tool call the recorded reply carried,
    read from the corpus line's raw JSON."""
    if "reply" in line:
        reply = line["reply"]
        if "items" in reply:  # Responses output items carry the argument string
            return [
                (i["call_id"], i["name"], i["arguments"])
                for i in reply["items"]
                if i["type"] == "function_call"
            ]
        # Gemini parts carry an object (no id): its compact JSON
        return [
            (None, p["functionCall"]["name"], orjson.dumps(p["functionCall"]["args"]).decode())
            for p in reply["parts"]
            if "functionCall" in p
        ]
    resp = line["response"]
    if "streamed_chunks" in resp:  # Chat Completions deltas: the argument string arrives in pieces
        calls: dict[int, list] = {}
        for chunk in resp["streamed_chunks"]:
            for choice in chunk.get("choices") or []:
                for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                    c = calls.setdefault(tc["index"], [None, "", ""])
                    c[0] = tc.get("id") or c[0]
                    fn = tc.get("function") or {}
                    c[1] += fn.get("name") or ""
                    c[2] += fn.get("arguments") or ""
        return [tuple(calls[i]) for i in sorted(calls)]
    if "choices" in resp:
        return [
            (tc["id"], tc["function"]["name"], tc["function"]["arguments"])
            for tc in resp["choices"][0]["message"].get("tool_calls") or []
        ]
    return [
        (b["id"], b["name"], orjson.dumps(b["input"]).decode())
        for b in resp["content"]
        if b["type"] == "tool_use"
    ]


def results_in_request(line: dict) -> dict[str, object]:
    """call id -> exact result content, from a corpus request body's raw JSON."""
    body = line["body"]
    out: dict[str, object] = {}
    if "input" in body:
        for item in body["input"]:
            if item.get("type") == "function_call_output":
                out[item["call_id"]] = item["output"]
    elif "contents" in body:
        for content in body["contents"]:
            for p in content["parts"]:
                if "functionResponse" in p:
                    out[p["functionResponse"]["id"]] = p["functionResponse"]["response"]
    else:
        for m in body["messages"]:
            if m["role"] == "tool":
                out[m["tool_call_id"]] = m["content"]
            elif isinstance(m.get("content"), list):
                for b in m["content"]:
                    if isinstance(b, dict) and b.get("type") == "tool_result":
                        out[b["tool_use_id"]] = b["content"]
    return out


def last_user_text(line: dict) -> str:
    """The last text block of the last user message of a corpus request body (raw JSON)."""
    body = line["body"]
    if "input" in body:
        users = [i for i in body["input"] if i.get("role") == "user"]
        return [c["text"] for c in users[-1]["content"] if c.get("text")][-1]
    if "contents" in body:
        users = [c for c in body["contents"] if c.get("role") == "user"]
        return [p["text"] for p in users[-1]["parts"] if p.get("text")][-1]
    users = [m for m in body["messages"] if m["role"] == "user"]
    content = users[-1]["content"]
    return content if isinstance(content, str) else [b["text"] for b in content if b.get("text")][-1]


#: run -> (steps, tool calls per step, corpus lines that are auxiliary, chains reported).
#: From what each agent did (corpus_runs.py): Codex and OpenCode resume by extending the chain;
#: Gemini CLI and Qwen Code start a new chain; OpenCode opens each session with a title request,
#: Gemini CLI titles a resumed session, Qwen Code sends its memory-extraction request after the
#: resumed prompt; mini-swe-agent ends with its submit command, whose result is never sent.
EXPECTED = {
    "codex-single": (4, [1, 0, 1, 0], [], 1),
    "codex-parallel": (2, [2, 0], [], 1),
    "gemini-single": (2, [1, 0], [2, 3, 4], 3),
    "gemini-parallel": (2, [2, 0], [], 1),
    "mini-single": (2, [1, 1], [], 1),
    "mini-parallel": (2, [2, 1], [], 1),
    "mini-anthropic": (2, [1, 1], [], 1),
    "opencode-single": (2, [1, 0], [1], 2),
    "opencode-parallel": (2, [2, 0], [4], 2),
    "qwen-single": (2, [1, 0], [4, 5], 3),
    "qwen-parallel": (2, [2, 0], [], 1),
}


def test_every_corpus_run_is_expected():
    assert set(EXPECTED) == set(RUNS)


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_corpus_steps_main_and_auxiliary(corpus_journal, run):
    path, recorded = corpus_journal
    n_steps, calls_per_step, aux_lines, n_chains = EXPECTED[run]
    recs = recorded[run]
    traj = steps_of(path, run)
    assert len(traj.steps) == n_steps
    assert [s.n for s in traj.steps] == list(range(1, n_steps + 1))
    assert [len(s.action.tool_calls) for s in traj.steps] == calls_per_step
    assert len(traj.meta["chains"]) == n_chains
    # exactly the expected exchanges are auxiliary, the others are the steps in arrival order
    assert {lo.where for lo in traj.left_out} == {r.exchange for r in recs if r.index in aux_lines}
    assert [d["exchange"] for d in traj.meta["steps"]] == [
        r.exchange for r in recs if r.index not in aux_lines
    ]
    # no flags, but on the submit command mini-swe-agent ends with (its result is never sent)
    assert all(s.flags == [] for s in traj.steps[:-1])
    assert traj.steps[-1].flags == (["tool_results_not_sent"] if calls_per_step[-1] else [])
    assert traj.steps[-1].observation.results == [] and traj.steps[-1].observation.messages == []
    # the task: the user's prompt, as the agent sent it in the first main-loop request
    first = next(r for r in recs if r.index not in aux_lines)
    assert traj.task == last_user_text(first.line)


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_corpus_tool_calls_and_observations_are_exact(corpus_journal, run):
    path, recorded = corpus_journal
    main = [r for r in recorded[run] if r.index not in EXPECTED[run][2]]
    traj = steps_of(path, run)
    for i, (step, rec) in enumerate(zip(traj.steps, main)):
        # A_i: the reply's calls, ids and exact argument text, in order (a batch is one step)
        assert [(c.id, c.name, c.arguments_raw) for c in step.action.tool_calls] == tool_calls_in_reply(
            rec.line
        )
        if i + 1 == len(main):
            continue
        nxt = main[i + 1].line
        sent = results_in_request(nxt)
        if "contents" in nxt["body"]:
            # Gemini CLI gives the calls ids of its own: the results answer those
            model = [c for c in nxt["body"]["contents"] if c.get("role") == "model"][-1]
            ids = [p["functionCall"]["id"] for p in model["parts"] if "functionCall" in p]
        else:
            ids = [c.id for c in step.action.tool_calls]
        # O_i: the results request i+1 sent, in call order, with their exact content
        assert [r.call_id for r in step.observation.results] == ids
        assert [r.content for r in step.observation.results] == [sent[x] for x in ids]


def test_codex_resume_extends_the_chain_as_attempt_2(corpus_journal):
    path, recorded = corpus_journal
    recs = recorded["codex-single"]
    traj = steps_of(path, "codex-single")
    assert [d["attempt"] for d in traj.meta["steps"]] == [1, 1, 2, 2]
    # O_2 is the second prompt the resumed session appended after A_2
    o2 = traj.steps[1].observation
    assert o2.results == []
    assert [(m.role, [p.text for p in m.parts]) for m in o2.messages] == [
        ("user", [last_user_text(recs[2].line)])
    ]
    assert traj.steps[1].action.text == recs[1].line["reply"]["items"][0]["content"][0]["text"]
    # the developer prompt stays a message, as sent; Codex sends no `instructions` here
    assert traj.system in (None, "")
    assert traj.meta["task_context"] and traj.meta["task_context"][0].startswith("<environment_context>")


def _chain_with(traj, exchange: str) -> dict:
    return next(c for c in traj.meta["chains"] if exchange in c["exchanges"])


def test_gemini_resume_starts_a_second_chain_that_is_reported(corpus_journal):
    path, recorded = corpus_journal
    by_line = {r.index: r.exchange for r in recorded["gemini-single"]}
    traj = steps_of(path, "gemini-single")
    main = _chain_with(traj, by_line[0])
    assert (
        main["role"] == "main" and main["exchanges"] == [by_line[0], by_line[1]] and main["attempts"] == [1]
    )
    resumed = _chain_with(traj, by_line[3])
    assert resumed["role"] == "auxiliary" and resumed["exchanges"] == [by_line[3], by_line[4]]
    assert resumed["requests"] == 2 and resumed["attempts"] == [2]
    assert "regenerated first message" in resumed["breaks"] and resumed["nearest"] == by_line[1]
    title = _chain_with(traj, by_line[2])
    assert title["exchanges"] == [by_line[2]] and title["tools"] == 0 and title["model"] != main["model"]
    assert {lo.kind for lo in traj.left_out} == {"chain"}
    # Gemini CLI's own call ids and skip-signature markers do not break the main chain
    assert traj.steps[0].action.tool_calls[0].id is None


def test_qwen_resume_and_background_request_are_other_chains(corpus_journal):
    path, recorded = corpus_journal
    by_line = {r.index: r.exchange for r in recorded["qwen-single"]}
    traj = steps_of(path, "qwen-single")
    resumed = _chain_with(traj, by_line[4])
    assert resumed["exchanges"] == [by_line[4]] and "regenerated first message" in resumed["breaks"]
    background = _chain_with(traj, by_line[5])
    assert background["exchanges"] == [by_line[5]] and background["tools"] == 6
    assert (
        "under another system prompt and other tools" in background["breaks"]
        and background["nearest"] == by_line[4]
    )
    reasons = {lo.where: lo.reason for lo in traj.left_out}
    assert "6 tools" in reasons[by_line[5]] and "the main chain is chain 1" in reasons[by_line[5]]


@pytest.mark.parametrize("run", ["opencode-single", "opencode-parallel"])
def test_opencode_title_request_is_the_one_auxiliary(corpus_journal, run):
    path, recorded = corpus_journal
    traj = steps_of(path, run)
    [title] = traj.left_out
    assert title.where == recorded[run][0].exchange and title.kind == "chain"
    chain = _chain_with(traj, title.where)
    assert chain["tools"] == 0 and chain["requests"] == 1 and chain["chain"] == 1
    assert traj.meta["main_chain"] == 2
    # OpenCode re-serialises arguments in its echo ({"command": "x"} -> {"command":"x"}): no flag
    assert traj.steps[0].flags == []


def test_recorder_probe_is_not_a_model_request(tmp_path, corpus):
    """Line 0 of the OpenCode file, ``GET /v1/models``, is outside every chain."""
    path = tmp_path / "j.sqlite"
    lines = corpus_lines(corpus, "opencode")
    with Journal.open(path, finalize=finalize_response) as j:
        recs = [record_line(j, "r-probe", 1, lines[i], i) for i in (0, 1, 2, 3)]
    traj = steps_of(path, "r-probe")
    assert len(traj.steps) == 2
    kinds = {lo.where: (lo.kind, lo.reason) for lo in traj.left_out}
    assert kinds[recs[0].exchange] == ("non_protocol", "GET /v1/models is not a model-API request path")
    assert kinds[recs[1].exchange][0] == "chain"
    with JournalReader(path) as r:
        roles = classify_run(r, "r-probe").roles()
    assert roles[recs[0].exchange] == (None, "auxiliary")
    assert roles[recs[1].exchange] == (1, "auxiliary")
    assert [roles[x.exchange] for x in recs[2:]] == [(2, "main"), (2, "main")]


def test_roles_stored_by_the_writer_and_shown(tmp_path, corpus):
    path = tmp_path / "roles.sqlite"
    recorded = record_corpus_runs(corpus, path, ["qwen-single", "opencode-single"])
    with JournalReader(path) as r:
        roles = {run: classify_run(r, run).roles() for run in recorded}
    with Journal.open(path) as j:
        for run, mapping in roles.items():
            j.set_exchange_roles(run, mapping)
        j.set_exchange_roles("qwen-single", {"x-not-there": (1, "main")})
    with JournalReader(path) as r:
        for run, mapping in roles.items():
            assert {e.id: (e.chain, e.role) for e in r.exchanges(run)} == mapping
        events = [e for e in r.events("qwen-single") if e["kind"] == "exchange.roles"]
    assert [e["data"] for e in events] == [
        {"main": 2, "auxiliary": 2, "unknown": 0},
        {"main": 1, "auxiliary": 0, "unknown": 1},
    ]
    proc = pvisor("journal", "show", "qwen-single", journal=path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    header = next(line for line in out.splitlines() if "SEQ" in line)
    assert header.split()[-2:] == ["CHAIN", "ROLE"]
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 ", "4 "))]
    assert [row[-2:] for row in rows] == [
        ["1", "main"],
        ["1", "main"],
        ["2", "auxiliary"],
        ["3", "auxiliary"],
    ]


def test_set_exchange_roles_refuses_bad_values(tmp_path):
    with Journal.open(tmp_path / "j.sqlite") as j:
        for bad, what in (
            ((1, "primary"), "role must be"),
            ((0, "main"), "chain must be"),
            ("main", r"expected \(chain, role\)"),
        ):
            with pytest.raises(ValueError, match=what) as info:
                j.set_exchange_roles("r-1", {"x-1": bad})
            assert "exchange x-1" in str(info.value)


# =========================================================================== through the gateway

SHELL = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
SYSTEM = "You are a careful coding agent."
TASK = "Read a.txt and b.txt and compare them."
SCRIPT = {
    "turns": [
        {"text": "Looking first.", "tool_calls": [{"tool": "@shell", "command": "ls"}]},
        {
            "text": "Both at once.",
            "tool_calls": [
                {"tool": "@shell", "command": "cat a.txt"},
                {"tool": "@shell", "command": "cat b.txt"},
            ],
        },
        {"text": "Done: a and b agree."},
    ]
}


def overloaded_once(stack, script: dict, *, messages: int):
    """An upstream answering from the scripted model, except that the first request whose body
    holds ``messages`` messages gets an Anthropic 529 (``retry-after-ms: 5``)."""
    model = ScriptedModel(parse_script(script, "test script"))
    state = {"failed": False}

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        if (
            request.path == "/v1/messages"
            and not state["failed"]
            and len(orjson.loads(body).get("messages", [])) == messages
        ):
            state["failed"] = True
            return web.Response(
                status=529,
                body=A.error_body(529, "Overloaded", "overloaded_error"),
                headers={"Content-Type": "application/json", "retry-after-ms": "5"},
            )
        reply = model.answer(request.method, request.path, request.query_string, body)
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        if request.method == "HEAD":
            resp.content_length = len(b"".join(reply.chunks))
        await resp.prepare(request)
        for chunk in reply.chunks if request.method != "HEAD" else ():
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    return stack.raw_upstream(handler)


def anthropic_agent(base: str) -> list:
    """A tool loop with the Anthropic SDK as Claude Code runs it: streamed, the cache_control
    marker moved to the newest block on every request, results sent back in call order
    (``cat b.txt`` fails). Returns the final messages the SDK assembled."""
    client = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=2, timeout=30)
    tools = [{"name": "bash", "description": "Run a shell command.", "input_schema": SHELL}]
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    finals = []
    while True:
        for m in messages:
            for block in m["content"]:
                block.pop("cache_control", None)
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        with client.messages.stream(
            model="claude-test", max_tokens=1024, system=SYSTEM, tools=tools, messages=copy.deepcopy(messages)
        ) as s:
            final = s.get_final_message()
        finals.append(final)
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
        )
        calls = [b for b in final.content if b.type == "tool_use"]
        if not calls:
            return finals
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": c.id,
                        "content": f"output of {c.input['command']}",
                        **({"is_error": True} if "b.txt" in c.input["command"] else {}),
                    }
                    for c in calls
                ],
            }
        )


def test_sdk_agent_through_gateway_retry_probe_count_and_title(stack):
    up = overloaded_once(stack, SCRIPT, messages=3)  # main-loop request 2 is overloaded once
    gw = stack.gateway(upstreams={"anthropic": up.url})
    status, _, _ = http_request(gw.url, "HEAD", "/")
    assert status == 200
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0, timeout=30)
    client.messages.create(
        model="claude-test",
        max_tokens=64,
        system="Write a five-word title.",
        messages=[{"role": "user", "content": TASK}],
    )
    client.messages.count_tokens(
        model="claude-test", system=SYSTEM, messages=[{"role": "user", "content": TASK}]
    )
    finals = anthropic_agent(gw.url)
    exchanges = stack.exchanges(gw)
    assert [(e.method, e.path, e.status) for e in exchanges] == [
        ("HEAD", "/", 200),
        ("POST", "/v1/messages", 200),
        ("POST", "/v1/messages/count_tokens", 200),
        ("POST", "/v1/messages", 200),
        ("POST", "/v1/messages", 529),
        ("POST", "/v1/messages", 200),
        ("POST", "/v1/messages", 200),
    ]
    probe, title, count, r1, overloaded, r2, r3 = exchanges
    with stack.reader(gw) as r:
        traj = trajectory_from_journal(r, gw.run)
        roles = classify_run(r, gw.run).roles()
        bodies = [orjson.loads(r.request_body(e)) for e in (r1, r2, r3)]
    # the marker really moved: on the task in request 1, on the newest results after
    assert [["cache_control" in b for m in body["messages"] for b in m["content"]] for body in bodies] == [
        [True],
        [False] * 3 + [True],
        [False] * 8 + [True],
    ]
    assert len(traj.steps) == 3 and [d["exchange"] for d in traj.meta["steps"]] == [r1.id, r2.id, r3.id]
    assert (traj.task, traj.system, [t.name for t in traj.tools]) == (TASK, SYSTEM, ["bash"])
    s1, s2, s3 = traj.steps
    # the calls as the model made them: ids, names, exact (compact) arguments; step 2 a batch of two
    for step, final in zip(traj.steps, finals):
        want = [(b.id, b.name, orjson.dumps(b.input).decode()) for b in final.content if b.type == "tool_use"]
        assert [(c.id, c.name, c.arguments_raw) for c in step.action.tool_calls] == want
        assert step.action.text == "".join(b.text for b in final.content if b.type == "text")
        assert (step.action.usage["input_tokens"], step.action.usage["output_tokens"]) == (
            final.usage.input_tokens,
            final.usage.output_tokens,
        )
    assert [len(s.action.tool_calls) for s in traj.steps] == [1, 2, 0]
    assert [(r.content, r.is_error) for r in s2.observation.results] == [
        ("output of cat a.txt", None),
        ("output of cat b.txt", True),
    ]
    assert [r.call_id for r in s2.observation.results] == [c.id for c in s2.action.tool_calls]
    # the 529 and the SDK's identical retry: one step, the retry kept
    assert s1.flags == [] and s2.flags == ["retried"] and s3.flags == []
    assert traj.meta["steps"][1]["retries"] == [overloaded.id]
    left = {lo.where: lo for lo in traj.left_out}
    assert set(left) == {probe.id, title.id, count.id, overloaded.id}
    assert left[probe.id].kind == "non_protocol" and left[count.id].kind == "token_count"
    assert left[title.id].kind == "chain" and left[overloaded.id].kind == "retry"
    assert "status 529" in left[overloaded.id].reason and r2.id in left[overloaded.id].reason
    main_chain = traj.meta["main_chain"]
    assert roles == {
        probe.id: (None, "auxiliary"),
        title.id: (1, "auxiliary"),
        count.id: (None, "auxiliary"),
        r1.id: (main_chain, "main"),
        overloaded.id: (main_chain, "auxiliary"),
        r2.id: (main_chain, "main"),
        r3.id: (main_chain, "main"),
    }
    gw.journal.set_exchange_roles(gw.run, roles)
    with stack.reader(gw) as r:
        assert {e.id: (e.chain, e.role) for e in r.exchanges(gw.run)} == roles


def scripted_replies(stack, actions: list[Action]):
    """A Chat Completions upstream answering the i-th request with ``actions[i]`` (by arrival,
    whatever the conversation), rendered by the protocol module."""
    served = iter(range(len(actions)))

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        i = next(served)
        final = C.action_to_response(actions[i], model="gpt-test", ids=IdSource(i + 1))
        return web.Response(body=orjson.dumps(final), headers={"Content-Type": "application/json"})

    return stack.raw_upstream(handler)


def test_dropped_action_format_error_through_gateway(stack):
    """mini-swe-agent drops a reply without a tool call from its history and says "format
    error" instead: step 1 is flagged, its observation is that message."""
    actions = [
        Action(text="I think the answer is 4."),
        Action(text="", tool_calls=[ToolCall(None, "bash", '{"command": "ls -1"}')]),
        Action(text="Submitting."),
    ]
    up = scripted_replies(stack, actions)
    gw = stack.gateway(upstreams={"openai": up.url})
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "Run a shell command.", "parameters": SHELL},
        }
    ]
    fmt_error = "Format error: every response must hold exactly one bash tool call."
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for _ in actions:
        reply = (
            client.chat.completions.create(model="gpt-test", messages=messages, tools=tools)
            .choices[0]
            .message
        )
        if reply.tool_calls:
            messages.append(reply.model_dump(exclude_none=True))
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": "a.txt\nb.txt\n"} for c in reply.tool_calls
            ]
        elif reply.content != "Submitting.":
            messages.append({"role": "user", "content": fmt_error})
    with stack.reader(gw) as r:
        traj = trajectory_from_journal(r, gw.run)
    s1, s2, s3 = traj.steps
    assert s1.flags == ["action_dropped_by_agent"] and s1.action.text == "I think the answer is 4."
    assert s1.observation.results == [] and [
        (m.role, [p.text for p in m.parts]) for m in s1.observation.messages
    ] == [("user", [fmt_error])]
    assert s2.flags == [] and [(c.name, c.arguments_raw) for c in s2.action.tool_calls] == [
        ("bash", '{"command": "ls -1"}')
    ]
    assert [r.content for r in s2.observation.results] == ["a.txt\nb.txt\n"]
    assert s3.flags == [] and s3.action.text == "Submitting."


# =========================================================================== synthetic journals


class ChatSession:
    """A Chat Completions conversation recorded exchange by exchange into a real journal."""

    def __init__(
        self, journal: Journal, run: str, *, system: str = SYSTEM, tools=("bash",), task: str = TASK
    ):
        self.j, self.run, self.system, self.tools = journal, run, system, list(tools)
        self.messages: list[dict] = [{"role": "user", "content": task}]
        self.n = 0

    def body(self) -> bytes:
        tools = [
            {"type": "function", "function": {"name": t, "description": t, "parameters": {"type": "object"}}}
            for t in self.tools
        ]
        return orjson.dumps(
            {
                "model": "gpt-test",
                "messages": [{"role": "system", "content": self.system}, *self.messages],
                "tools": tools,
            }
        )

    def send(
        self,
        *,
        text: str | None = None,
        calls=(),
        status: int = 200,
        outcome: str = "ok",
        echo: bool = True,
        response: bytes | None = None,
        streamed: bool = False,
        attempt: int = 1,
        **recorded,
    ) -> str:
        """Record one request (the conversation so far) and its reply; append the reply to the
        conversation when ``echo``. ``recorded``: more fields for ``record_exchange``."""
        self.n += 1
        msg: dict = {"role": "assistant", "content": text}
        if calls:
            msg["tool_calls"] = [
                {
                    "id": f"call_{self.n}_{k}",
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for k, (name, args) in enumerate(calls)
            ]
        final = {
            "id": f"chatcmpl-{self.n}",
            "object": "chat.completion",
            "model": "gpt-test",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
        }
        if response is None:
            response = orjson.dumps(final) if status < 400 else C.error_body(status, "overloaded")
        ex = self.j.record_exchange(
            self.run,
            "POST",
            "/v1/chat/completions",
            [("content-type", "application/json")],
            protocol="openai-chat",
            attempt=attempt,
            status=status,
            outcome=outcome,
            request_body=self.body(),
            response_body=response,
            streamed=streamed,
            **recorded,
        )
        if echo and status < 400:
            self.messages.append(msg)
        return ex

    def results(self, *contents: str, call_ids: list[str] | None = None) -> None:
        last = [m for m in self.messages if m["role"] == "assistant"][-1]
        ids = call_ids or [c["id"] for c in last.get("tool_calls", [])]
        self.messages += [{"role": "tool", "tool_call_id": i, "content": c} for i, c in zip(ids, contents)]

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


def test_ties_go_to_the_hint_then_more_tools_then_the_earlier_start(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        # run 1: two chains of two requests; A has more tools
        a = ChatSession(j, "r-tools", tools=("bash", "read"), task="task A")
        b = ChatSession(j, "r-tools", tools=("edit",), task="task B")
        for s in (a, b):
            s.send(calls=[("bash", '{"command":"ls"}')])
            s.results("x")
            s.send(text="done")
        # run 2: same tools, other system prompts
        c = ChatSession(j, "r-even", system="You are A.", task="task A")
        d = ChatSession(j, "r-even", system="You are B.", task="task B")
        for s in (c, d):
            s.send(calls=[("bash", '{"command":"ls"}')])
            s.results("x")
            s.send(text="done")
        # run 3: the longer chain wins whatever the hint says
        e = ChatSession(j, "r-long", system="You are A.", task="task A")
        f = ChatSession(j, "r-long", system="You are B.", task="task B")
        for s, turns in ((e, 3), (f, 2)):
            for _ in range(turns - 1):
                s.send(calls=[("bash", '{"command":"ls"}')])
                s.results("x")
            s.send(text="done")
    with JournalReader(path) as r:

        def main_task(run, **kw):
            c = classify_run(r, run, **kw)
            return c.main.first.conversation().messages[0].parts[0].text, [ch.role for ch in c.chains]

        assert main_task("r-tools") == ("task A", ["main", "auxiliary"])  # more tools
        assert main_task("r-tools", prefer=ChainHint(tools=frozenset({"edit"}))) == (
            "task B",
            ["auxiliary", "main"],
        )
        assert main_task("r-tools", prefer=lambda conv: False) == ("task A", ["main", "auxiliary"])
        assert main_task("r-even") == ("task A", ["main", "auxiliary"])  # the earlier start
        assert main_task("r-even", prefer=ChainHint(system_prefix="You are B")) == (
            "task B",
            ["auxiliary", "main"],
        )
        assert main_task("r-long", prefer=ChainHint(system_prefix="You are B")) == (
            "task A",
            ["main", "auxiliary"],
        )


def test_second_chain_in_one_run_is_reported_not_merged(tmp_path):
    """A resumed session whose first message is regenerated (Gemini CLI, Qwen Code)."""
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-resume", task="<context date=1/> fix it")
        first = [s.send(calls=[("bash", '{"command":"make"}')])]
        s.results("ok")
        first.append(s.send(text="fixed"))
        s.messages[0] = {"role": "user", "content": "<context date=2/> fix it"}  # regenerated on resume
        s.say("now test it")
        second = [s.send(calls=[("bash", '{"command":"make test"}')], attempt=2)]
        s.results("passed")
        second.append(s.send(text="tested", attempt=2))
    traj = steps_of(path, "r-resume")
    chains = traj.meta["chains"]
    assert [(c["chain"], c["role"], c["exchanges"], c["attempts"]) for c in chains] == [
        (1, "main", first, [1]),
        (2, "auxiliary", second, [2]),
    ]
    assert "regenerated first message" in chains[1]["breaks"] and chains[1]["nearest"] == first[-1]
    assert chains[1]["common_messages"] == 0
    assert len(traj.steps) == 2 and [lo.where for lo in traj.left_out] == second


def test_tools_or_system_may_change_inside_a_chain_but_not_both(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        for run, change in (("r-tools", "tools"), ("r-system", "system"), ("r-both", "both")):
            s = ChatSession(j, run, tools=("bash",))
            s.send(calls=[("bash", '{"command":"ls"}')])
            s.results("a.txt")
            if change == "tools":
                s.tools = ["bash", "mcp_search"]
            if change == "both":
                s.tools = ["read"]  # as many tools: the tie goes to the earlier chain
            if change in ("system", "both"):
                s.system = "You now extract memories."
            s.send(text="done")
    t = steps_of(path, "r-tools")
    assert len(t.steps) == 2 and t.steps[1].flags == ["tools_changed"]
    assert (t.meta["steps"][1]["tools_added"], t.meta["steps"][1]["tools_removed"]) == (["mcp_search"], [])
    t = steps_of(path, "r-system")
    assert len(t.steps) == 2 and t.steps[1].flags == ["system_changed"]
    t = steps_of(path, "r-both")
    assert len(t.meta["chains"]) == 2 and len(t.steps) == 1
    assert "under another system prompt and other tools" in t.meta["chains"][1]["breaks"]
    # the first step's results then were never sent to the main chain
    assert t.steps[0].flags == ["tool_results_not_sent"]


def test_same_messages_under_other_tools_is_not_a_retry(tmp_path):
    """A title request with the agent's system prompt, no tools and the task: another chain,
    even when it arrives between the main loop's requests."""
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-title")
        first = s.send(calls=[("bash", '{"command":"ls"}')])
        title = ChatSession(j, "r-title", tools=()).send(text="Listing files")
        s.results("a.txt")
        last = s.send(text="done")
    t = steps_of(path, "r-title")
    assert [d["exchange"] for d in t.meta["steps"]] == [first, last] and [s.flags for s in t.steps] == [
        [],
        [],
    ]
    assert [(lo.where, lo.kind) for lo in t.left_out] == [(title, "chain")]
    assert t.meta["chains"][1]["breaks"].startswith(
        f"sends the messages of {first} (chain 1) under other tools"
    )


def test_retry_that_never_succeeds_interrupted_reply_and_missing_results(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path, finalize=finalize_response) as j:
        # two 529s for the same request: the step keeps the last, without a reply
        s = ChatSession(j, "r-fail")
        s.send(calls=[("bash", '{"command":"ls"}')])
        s.results("a.txt")
        busy = [s.send(status=529, outcome="upstream_error"), s.send(status=529, outcome="upstream_error")]
        # a stream the agent abandoned half-way: what arrived is the action
        t = ChatSession(j, "r-cut")
        t.send(calls=[("bash", '{"command":"ls"}')])
        t.results("a.txt")
        half = (
            b'data: {"id":"c","object":"chat.completion.chunk","model":"gpt-test",'
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Half a tho"}}]}\n\n'
        )
        t.send(response=half, streamed=True, outcome="aborted_by_client", echo=False)
        # two calls, one result; then a reply the agent rewrote before sending it back
        u = ChatSession(j, "r-missing")
        u.send(calls=[("bash", '{"command":"ls"}'), ("bash", '{"command":"pwd"}')])
        u.results("a.txt")
        u.send(calls=[("bash", '{"command":"cat a.txt"}')])
        u.messages[-1]["tool_calls"][0]["function"]["arguments"] = '{"command":"cat b.txt"}'
        u.results("B")
        u.send(text="done")
    f = steps_of(path, "r-fail")
    assert f.steps[1].flags == ["no_reply", "retried"] and f.meta["steps"][1]["exchange"] == busy[1]
    assert f.meta["steps"][1]["retries"] == [busy[0]] and "529" in f.meta["steps"][1]["reply_problem"]
    assert f.steps[1].action.tool_calls == [] and f.steps[1].action.text == ""
    c = steps_of(path, "r-cut")
    assert c.steps[1].flags == ["interrupted"] and c.steps[1].action.text == "Half a tho"
    m = steps_of(path, "r-missing")
    assert m.steps[0].flags == ["missing_tool_results"]
    assert m.meta["steps"][0]["missing_results"] == [{"call": 2, "id": "call_1_1", "name": "bash"}]
    assert [r.content for r in m.steps[0].observation.results] == ["a.txt"]
    assert m.steps[1].flags == ["action_changed_by_agent"]
    assert (
        m.steps[1].action.tool_calls[0].arguments_raw == '{"command":"cat a.txt"}'
    )  # the model's, not the agent's


def test_exchanges_outside_every_chain_and_a_run_without_steps(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-empty"))
        run = "r-odd"
        ids = {
            "head": j.record_exchange(run, "HEAD", "/", [], status=200),
            "text": j.record_exchange(
                run,
                "POST",
                "/v1/chat/completions",
                [],
                protocol="openai-chat",
                status=400,
                request_body=b"not json",
            ),
            "shape": j.record_exchange(
                run,
                "POST",
                "/v1/messages",
                [],
                protocol="anthropic",
                status=400,
                request_body=b'{"messages": 5}',
            ),
            "big": j.record_exchange(
                run,
                "POST",
                "/v1/responses",
                [],
                protocol="openai-responses",
                status=413,
                outcome="oversize",
                request_bytes=10**9,
            ),
            "count": j.record_exchange(
                run,
                "POST",
                "/v1beta/models/gemini-2.5-pro:countTokens",
                [],
                protocol="gemini",
                status=200,
                request_body=b'{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}',
                response_body=b'{"totalTokens": 1}',
            ),
            "alien": j.record_exchange(
                run, "POST", "/v2/generate", [], protocol="future-protocol", status=200, request_body=b"{}"
            ),
        }
    traj = steps_of(path, "r-odd")
    assert (
        traj.steps == []
        and traj.meta["main_chain"] is None
        and traj.meta["chains"] == []
        and traj.task is None
    )
    left = {lo.where: (lo.kind, lo.reason) for lo in traj.left_out}
    assert left[ids["head"]] == ("non_protocol", "HEAD / is not a model-API request path")
    assert (
        left[ids["text"]][0] == "unparsable"
        and "Chat Completions" in left[ids["text"]][1]
        and "not valid JSON" in left[ids["text"]][1]
    )
    assert left[ids["shape"]][0] == "unparsable" and "Anthropic" in left[ids["shape"]][1]
    assert left[ids["big"]] == (
        "no_request_body",
        "POST /v1/responses was refused as oversize (status 413): "
        "its body of 1000000000 bytes or more was not stored whole",
    )
    assert left[ids["count"]] == (
        "token_count",
        "POST /v1beta/models/gemini-2.5-pro:countTokens asks for a token count, not a reply",
    )
    assert left[ids["alien"]][0] == "unknown_protocol"
    with JournalReader(path) as r:
        assert set(classify_run(r, "r-odd").roles().values()) == {(None, "auxiliary")}
    assert steps_of(path, "r-empty").steps == []


def test_token_count_paths_of_the_protocol_modules():
    assert A.counts_tokens("/v1/messages/count_tokens") and not A.counts_tokens("/v1/messages")
    assert G.counts_tokens("/v1beta/models/m:countTokens") and G.counts_tokens("/v1/models/m:countTokens")
    assert not G.counts_tokens("/v1beta/models/m:generateContent") and not G.counts_tokens(
        "/v1beta/models/m:streamGenerateContent"
    )
    assert not C.counts_tokens("/v1/chat/completions") and not R.counts_tokens("/v1/responses")


# =========================================================================== pvisor journal steps


def test_journal_steps_human_and_json(corpus_journal):
    path, recorded = corpus_journal
    proc = pvisor("journal", "steps", "opencode-par", journal=path)  # a unique prefix
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    lines = out.splitlines()
    assert lines[0].startswith("run opencode-parallel  agent=opencode protocol=openai-chat model=mock-model")
    assert lines[1] == 'task: "Write two files in parallel using shell commands."'
    assert lines[2] == "main chain 2 of 2: 2 steps"
    assert lines[3].split() == ["STEP", "EXCHANGE", "ACTION", "(TOOL", "CALLS)", "OBSERVATION", "FLAGS"]
    step1 = lines[4]
    assert (
        step1.startswith("1 ")
        and 'bash(command="echo PARALLEL_ONE > one.txt && cat one…); bash(command="echo PARALLEL_TWO' in step1
    )
    assert step1.endswith("2 results, 26 chars  -")
    assert lines[5].startswith("2 ") and "text: 'FINAL" in lines[5]
    title = recorded["opencode-parallel"][0].exchange
    assert lines[6] == "auxiliary: 1"
    assert lines[7].startswith(f"  seq 1  {title}  [chain] chain 1: 1 request, 0 tools")
    proc = pvisor("journal", "steps", "opencode-parallel", "--json", journal=path)
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)
    assert doc == orjson.loads(orjson.dumps(trajectory_to_json(steps_of(path, "opencode-parallel"))))
    assert doc["schema"] == "pvisor.steps/v1" and doc["run"] == "opencode-parallel" and doc["main_chain"] == 2
    assert [len(s["action"]["tool_calls"]) for s in doc["steps"]] == [2, 0]
    assert [a["exchange"] for a in doc["auxiliary"]] == [title]
    assert [r["content"] for r in doc["steps"][0]["observation"]["results"]] == [
        "PARALLEL_ONE\n",
        "PARALLEL_TWO\n",
    ]


def test_journal_steps_unknown_run_and_run_without_steps(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-probe-only"))
        j.record_exchange("r-probe-only", "HEAD", "/", [], status=200)
        j.create_run(Run(id="r-probe-two"))
    proc = pvisor("journal", "steps", "r-nope", journal=path)
    assert proc.returncode == 2 and proc.stderr.decode().startswith(
        "pvisor: error: no run 'r-nope' in journal"
    )
    proc = pvisor("journal", "steps", "r-probe", journal=path)
    assert proc.returncode == 2 and "ambiguous" in proc.stderr.decode()
    proc = pvisor("journal", "steps", "r-probe-only", journal=path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode().splitlines()
    assert out[1] == "no main-loop exchange: 0 steps (1 auxiliary exchange)"
    assert (
        out[2:] == ["auxiliary: 1", out[3]]
        and "[non_protocol] HEAD / is not a model-API request path" in out[3]
    )
    proc = pvisor("journal", "steps", "r-probe-only", "--json", journal=path)
    doc = orjson.loads(proc.stdout)
    assert (doc["steps"], doc["main_chain"], doc["task"], doc["tools"], len(doc["auxiliary"])) == (
        [],
        None,
        None,
        None,
        1,
    )
    for args in (["journal", "steps", "r-nope"], ["journal", "steps", "r-probe-two", "--json"]):
        assert b"Traceback" not in pvisor(*args, journal=path).stderr


# =========================================================================== review fixes


def test_anthropic_server_tool_calls_echoed_back_raise_no_flag(stack):
    """A reply with ``server_tool_use`` and ``web_search_tool_result`` blocks (the provider ran
    the search), echoed back exactly by the SDK: no result is expected from the agent, the echo
    is the action, and a last step with only a server call leaves nothing unsent."""
    search = {
        "type": "server_tool_use",
        "id": "srvtoolu_01",
        "name": "web_search",
        "input": {"query": "pvisor"},
    }
    found = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://example.com/",
                "title": "Example",
                "encrypted_content": "EqQ",
                "page_age": None,
            }
        ],
    }
    bash = {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "ls"}}
    replies = [
        [search, found, {"type": "text", "text": "Searched; now listing."}, bash],
        [
            {**search, "id": "srvtoolu_02"},
            {**found, "tool_use_id": "srvtoolu_02"},
            {"type": "text", "text": "Found it."},
        ],
    ]

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        content = replies[turn]
        final = {
            "id": f"msg_{turn}",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": "tool_use" if content[-1]["type"] == "tool_use" else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5, "server_tool_use": {"web_search_requests": 1}},
        }
        return web.Response(body=orjson.dumps(final), headers={"Content-Type": "application/json"})

    up = stack.raw_upstream(handler)
    gw = stack.gateway(upstreams={"anthropic": up.url})
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0, timeout=30)
    tools = [
        {"name": "bash", "description": "Run a shell command.", "input_schema": SHELL},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ]
    messages: list[dict] = [{"role": "user", "content": TASK}]
    for _ in replies:
        final = client.messages.create(
            model="claude-test", max_tokens=512, system=SYSTEM, tools=tools, messages=messages
        )
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
        )
        calls = [b for b in final.content if b.type == "tool_use"]
        if calls:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": c.id, "content": "a.txt"} for c in calls
                    ],
                }
            )
    stack.exchanges(gw)
    with stack.reader(gw) as r:
        traj = trajectory_from_journal(r, gw.run)
    assert len(traj.steps) == 2
    s1, s2 = traj.steps
    assert [(c.kind, c.name, c.id) for c in s1.action.tool_calls] == [
        ("server", "web_search", "srvtoolu_01"),
        ("function", "bash", "toolu_01"),
    ]
    assert [(r.call_id, r.content) for r in s1.observation.results] == [("toolu_01", "a.txt")]
    assert s1.flags == [] and s2.flags == []
    assert [(c.kind, c.id) for c in s2.action.tool_calls] == [("server", "srvtoolu_02")]


def test_anthropic_function_call_still_needs_its_result():
    """The exemption is for server calls only: a function call answered by nothing is flagged."""
    from pvisor.adapters.journal_trajectory import _observation
    from pvisor.journal.model import Message, TextPart

    action = A.response_to_action(
        {
            "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
            ]
        }
    )
    echo = A.parse_request(
        {"messages": [{"role": "assistant", "content": [b for b in action.raw["content"]]}]}
    ).messages
    obs, flags, details, _ = _observation("anthropic", [*echo, Message("user", [TextPart("go on")])], action)
    assert flags == ["missing_tool_results"] and details["missing_results"] == [
        {"call": 2, "id": "toolu_1", "name": "bash"}
    ]


def test_the_same_messages_in_other_protocols_are_not_retries(tmp_path):
    """``user: "hi"`` as Anthropic, Gemini and Chat Completions: three requests, three chains."""
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        ids = [
            j.record_exchange(
                "r-proto",
                "POST",
                "/v1/messages",
                [],
                protocol="anthropic",
                status=200,
                request_body=b'{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}',
                response_body=orjson.dumps(
                    A.action_to_response(Action(text="hello"), model="m", ids=IdSource(1))
                ),
            ),
            j.record_exchange(
                "r-proto",
                "POST",
                "/v1beta/models/m:generateContent",
                [],
                protocol="gemini",
                status=200,
                request_body=b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}',
                response_body=orjson.dumps(
                    G.action_to_response(Action(text="hello"), model="m", ids=IdSource(2))
                ),
            ),
            j.record_exchange(
                "r-proto",
                "POST",
                "/v1/chat/completions",
                [],
                protocol="openai-chat",
                status=200,
                request_body=b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
                response_body=orjson.dumps(
                    C.action_to_response(Action(text="hello"), model="m", ids=IdSource(3))
                ),
            ),
        ]
    traj = steps_of(path, "r-proto")
    assert [c["exchanges"] for c in traj.meta["chains"]] == [[x] for x in ids]
    assert [c["protocol"] for c in traj.meta["chains"]] == ["anthropic", "gemini", "openai-chat"]
    assert {lo.kind for lo in traj.left_out} == {"chain"}
    assert "another protocol (gemini against anthropic)" in traj.meta["chains"][1]["breaks"]


def responses_session_upstream(stack, actions: list[Action]):
    """A Responses upstream that keeps state as the real API does: each response gets an id of
    its own; request i is answered with ``actions[i]``, whatever it holds."""
    served = iter(range(len(actions)))

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        i = next(served)
        final = R.action_to_response(actions[i], model="gpt-test", ids=IdSource(100 + i))
        return web.Response(body=orjson.dumps(final), headers={"Content-Type": "application/json"})

    return stack.raw_upstream(handler)


def test_responses_previous_response_id_session_is_followed(stack):
    """Each request carries only its new items and names the response it continues: the chain
    follows the response ids, the steps and their observations are the session's."""
    actions = [
        Action(text="Looking.", tool_calls=[ToolCall("call_a", "shell", '{"command":"ls"}')]),
        Action(
            text="Both.",
            tool_calls=[
                ToolCall("call_b", "shell", '{"command":"cat a"}'),
                ToolCall("call_c", "shell", '{"command":"cat b"}'),
            ],
        ),
        Action(text="Done."),
    ]
    up = responses_session_upstream(stack, actions)
    gw = stack.gateway(upstreams={"openai": up.url})
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
    tools = [
        {"type": "function", "name": "shell", "description": "Run a shell command.", "parameters": SHELL}
    ]
    response = client.responses.create(model="gpt-test", instructions=SYSTEM, input=TASK, tools=tools)
    previous = [response.id]
    while True:
        calls = [o for o in response.output if o.type == "function_call"]
        if not calls:
            break
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"out of {c.arguments}"}
            for c in calls
        ]
        response = client.responses.create(
            model="gpt-test",
            instructions=SYSTEM,
            tools=tools,
            previous_response_id=response.id,
            input=outputs,
        )
        previous.append(response.id)
    exchanges = stack.exchanges(gw)
    assert len(exchanges) == 3 and len(set(previous)) == 3
    with stack.reader(gw) as r:
        traj = trajectory_from_journal(r, gw.run)
    assert len(traj.meta["chains"]) == 1 and traj.left_out == []
    assert [s.flags for s in traj.steps] == [[], [], []]
    assert traj.task == TASK and traj.system == SYSTEM
    assert [[c.id for c in s.action.tool_calls] for s in traj.steps] == [["call_a"], ["call_b", "call_c"], []]
    assert [[(r.call_id, r.content) for r in s.observation.results] for s in traj.steps] == [
        [("call_a", 'out of {"command":"ls"}')],
        [("call_b", 'out of {"command":"cat a"}'), ("call_c", 'out of {"command":"cat b"}')],
        [],
    ]
    details = traj.meta["steps"]
    assert "previous_response_id" not in details[0]
    assert [(d["previous_response_id"], d["previous_exchange"]) for d in details[1:]] == [
        (previous[0], exchanges[0].id),
        (previous[1], exchanges[1].id),
    ]


def test_previous_response_id_of_no_exchange_of_the_run_is_reported(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:

        def post(body: dict, action: Action, seed: int) -> str:
            return j.record_exchange(
                "r-prev",
                "POST",
                "/v1/responses",
                [],
                protocol="openai-responses",
                status=200,
                request_body=orjson.dumps(body),
                response_body=orjson.dumps(
                    R.action_to_response(action, model="gpt-test", ids=IdSource(seed))
                ),
            )

        first = post({"model": "gpt-test", "input": "hi"}, Action(text="hello"), 1)
        orphan = post(
            {"model": "gpt-test", "previous_response_id": "resp_from_yesterday", "input": "and now?"},
            Action(text="now"),
            2,
        )
    traj = steps_of(path, "r-prev")
    assert [c["exchanges"] for c in traj.meta["chains"]] == [[first], [orphan]]
    assert traj.meta["chains"][1]["breaks"].startswith(
        "its previous_response_id resp_from_yesterday names no response of this run"
    )


def test_partially_delivered_reply_is_flagged(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        # the gateway's counts: the agent went away after 40 of the 180 bytes the upstream sent
        ChatSession(j, "r-part").send(
            calls=[("bash", '{"command":"rm -rf build"}')],
            outcome="aborted_by_client",
            bytes_received=180,
            bytes_delivered=40,
        )
    traj = steps_of(path, "r-part")
    assert traj.steps[0].flags == ["interrupted", "partially_delivered", "tool_results_not_sent"]
    assert (traj.meta["steps"][0]["bytes_received"], traj.meta["steps"][0]["bytes_delivered"]) == (180, 40)
    proc = pvisor("journal", "steps", "r-part", journal=path)
    assert "interrupted,partially_delivered,tool_results_not_sent" in proc.stdout.decode()


@pytest.mark.parametrize("choices", [None, []])
def test_a_200_reply_without_choices_is_no_reply(tmp_path, choices):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-none")
        s.send(
            response=orjson.dumps({"id": "c", "object": "chat.completion", "choices": choices}), echo=False
        )
    traj = steps_of(path, "r-none")
    assert traj.steps[0].flags == ["no_reply"]
    assert (
        traj.meta["steps"][0]["reply_problem"]
        == f"the response holds no reply: 'choices' is {'null' if choices is None else 'an empty array'}"
    )
    out = pvisor("journal", "steps", "r-none", journal=path).stdout.decode()
    assert "(no reply)" in out and "no_reply" in out


def test_oversize_head_and_gateway_502_through_the_gateway(stack):
    """What the gateway itself answers: a body over --max-body (only its start is stored), a
    HEAD on a model path, and a 502 when no upstream answers."""
    up = stack.raw_upstream(lambda request: _ok_chat(request))
    gw = stack.gateway(upstreams={"openai": up.url, "anthropic": up.url}, max_body=2000)
    big = orjson.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "x" * 5000}]})
    status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions", big)
    assert status == 413
    status, _, _ = http_request(gw.url, "HEAD", "/v1/messages")
    from gateway_helpers import dead_url

    dead = stack.gateway(upstreams={"openai": dead_url()}, name="dead")
    status, _, _ = http_request(
        dead.url,
        "POST",
        "/v1/chat/completions",
        orjson.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}),
    )
    assert status == 502
    over, head = stack.exchanges(gw)
    assert (over.outcome, head.method) == ("oversize", "HEAD")
    with stack.reader(gw) as r:
        traj = trajectory_from_journal(r, gw.run)
    kinds = {lo.where: (lo.kind, lo.reason) for lo in traj.left_out}
    assert kinds[over.id] == (
        "no_request_body",
        "POST /v1/chat/completions was refused as oversize (status 413): "
        f"its body of {over.request_bytes} bytes or more was not stored whole",
    )
    assert kinds[head.id] == (
        "non_protocol",
        "HEAD /v1/messages asks for no reply: model-API requests are POST",
    )
    stack.exchanges(dead)
    with stack.reader(dead) as r:
        traj = trajectory_from_journal(r, dead.run)
    assert traj.steps[0].flags == ["no_reply"]
    problem = traj.meta["steps"][0]["reply_problem"]
    assert (
        problem.startswith(
            "the gateway answered status 502 itself, no upstream reply (outcome upstream_unreachable: "
        )
        and "cannot connect" in problem
    )


async def _ok_chat(request: web.BaseRequest) -> web.StreamResponse:
    await request.read()
    final = C.action_to_response(Action(text="ok"), model="gpt-test", ids=IdSource(1))
    return web.Response(body=orjson.dumps(final), headers={"Content-Type": "application/json"})


def test_human_output_wording_controls_and_counts(tmp_path):
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-words", task="fix it\x07 now\x1b[2J")
        s.send(calls=[("bash", '{"command":"ls"}')])
        s.results("x")
        s.send(calls=[("bash", '{"command":"a"}'), ("bash", '{"command":"b"}')])
        s.messages += [
            {"role": "tool", "tool_call_id": f"call_2_{k}", "content": [{"type": "text", "text": "out"}]}
            for k in range(2)
        ]
        s.send(calls=[("bash", orjson.dumps({"command": f"echo {k} {'y' * 30}"}).decode()) for k in range(6)])
        s.results(*["z"] * 6)
        s.send(text="done")
        # Anthropic results that are errors
        call = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "x"}}
        first = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "go"}]}
        reply = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [call, {**call, "id": "toolu_2"}],
            "stop_reason": "tool_use",
            "usage": {},
        }
        second = {
            **first,
            "messages": [
                *first["messages"],
                {"role": "assistant", "content": reply["content"]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": f"toolu_{k}",
                            "content": "no",
                            "is_error": True,
                        }
                        for k in (1, 2)
                    ],
                },
            ],
        }
        for body, answer in (
            (first, reply),
            (second, {**reply, "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}),
        ):
            j.record_exchange(
                "r-errors",
                "POST",
                "/v1/messages",
                [],
                protocol="anthropic",
                status=200,
                request_body=orjson.dumps(body),
                response_body=orjson.dumps(answer),
            )
    out = pvisor("journal", "steps", "r-words", journal=path).stdout.decode()
    lines = out.splitlines()
    assert lines[1] == "task: fix it\\x07 now\\x1b[2J"
    assert "\x07" not in out and "\x1b" not in out
    rows = {line.split()[0]: " ".join(line.split()) for line in lines[4:8]}
    assert rows["1"].endswith("1 result, 1 char -")
    assert rows["2"].endswith("2 results, 6 chars -")  # the text of the blocks, not their JSON
    assert 'bash(command="echo 0 yyyy' in rows["3"] and rows["3"].endswith("… +4 more 6 results, 6 chars -")
    out = pvisor("journal", "steps", "r-errors", journal=path).stdout.decode()
    assert "2 results (2 errors), 4 chars" in out


def test_signed_is_false_for_an_empty_signature(tmp_path):
    path = tmp_path / "j.sqlite"

    def thinking(sig):
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "stop_reason": "end_turn",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": sig},
                {"type": "text", "text": "ok"},
            ],
            "usage": {},
        }

    with Journal.open(path) as j:
        for run, sig in (("r-empty-sig", ""), ("r-sig", "EqQBCkgIAR")):
            j.record_exchange(
                run,
                "POST",
                "/v1/messages",
                [],
                protocol="anthropic",
                status=200,
                request_body=b'{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}',
                response_body=orjson.dumps(thinking(sig)),
            )
    docs = {run: trajectory_to_json(steps_of(path, run)) for run in ("r-empty-sig", "r-sig")}
    assert docs["r-empty-sig"]["steps"][0]["action"]["reasoning"][0]["signed"] is False
    assert docs["r-sig"]["steps"][0]["action"]["reasoning"][0]["signed"] is True


def test_gemini_sdk_with_parameters_json_schema_through_gateway_and_scripted_model(stack):
    """google-genai sends ``parameters_json_schema`` as the user gave it (snake_case): the
    scripted model finds the shell tool's argument in it, and the steps show the schema."""
    from google import genai
    from google.genai import types

    url = stack.scripted(
        {
            "turns": [
                {"text": "Listing.", "tool_calls": [{"tool": "@shell", "command": "ls"}]},
                {"text": "Done."},
            ]
        }
    )
    gw = stack.gateway(upstreams={"gemini": url})
    schema = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    client = genai.Client(
        api_key="gemini-test", http_options=types.HttpOptions(base_url=gw.url, timeout=30_000)
    )
    decl = types.FunctionDeclaration(
        name="run_shell_command", description="Run a shell command.", parameters_json_schema=schema
    )
    config = types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[types.Tool(function_declarations=[decl])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    contents = [types.Content(role="user", parts=[types.Part(text=TASK)])]
    calls = []
    for _ in range(2):
        parts = (
            client.models.generate_content(model="gemini-test", contents=contents, config=config)
            .candidates[0]
            .content.parts
        )
        contents.append(types.Content(role="model", parts=parts))
        fcs = [p.function_call for p in parts if p.function_call]
        calls += [(f.name, dict(f.args)) for f in fcs]
        if fcs:
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                name=f.name, response={"output": "a.txt"}
                            )
                        )
                        for f in fcs
                    ],
                )
            )
    assert calls == [("run_shell_command", {"cmd": "ls"})]
    exchanges = stack.exchanges(gw)
    with stack.reader(gw) as r:
        assert b'"parameters_json_schema"' in r.request_body(exchanges[0])
        doc = trajectory_to_json(trajectory_from_journal(r, gw.run))
    assert doc["system"] == SYSTEM and doc["tools"] == [
        {"name": "run_shell_command", "description": "Run a shell command.", "parameters": schema}
    ]
    assert [[c["arguments"] for c in s["action"]["tool_calls"]] for s in doc["steps"]] == [
        [{"cmd": "ls"}],
        [],
    ]
    assert [s["flags"] for s in doc["steps"]] == [[], []]


def test_reading_each_body_once_gives_what_reading_each_alone_gives(corpus_journal, tmp_path):
    """The classification reads each body once (a memo per protocol, a kept tail per request):
    on every request of the agents' runs (Codex's grouped Responses items included), its keys
    and kept messages equal those of the body parsed on its own."""
    from pvisor.adapters.chains import _key
    from pvisor.adapters.protocols import get_protocol

    path, recorded = corpus_journal
    checked = 0
    with JournalReader(path) as r:
        for run in recorded:
            for req in classify_run(r, run).requests:
                if req.left_out is not None:
                    continue
                mod = get_protocol(req.protocol)
                alone = mod.parse_request(
                    r.request_body(req.exchange), path=req.exchange.path, query=req.exchange.query
                )
                norm = mod.normalise(alone)
                assert req.messages == [_key(m) for m in norm["messages"]], (run, req.id)
                assert (req.system_key, req.tools_key) == (_key(norm["system"]), _key(norm["tools"]))
                assert req.tail == alone.messages[req.tail_from :]
                checked += 1
    assert checked >= 30


def test_reading_once_when_a_request_continues_the_last_item_group(tmp_path):
    """Responses input items group into messages: a request whose new items continue the last
    group of the previous one (an assistant message, then a call appended to it) must not keep
    the earlier grouping. Same check as above, on bodies built for it, in all four protocols."""
    from pvisor.adapters.chains import _key
    from pvisor.adapters.protocols import get_protocol

    def msg(role, text):
        return {
            "type": "message",
            "role": role,
            "content": [{"type": "input_text" if role != "assistant" else "output_text", "text": text}],
        }

    def call(n):
        return {
            "type": "function_call",
            "call_id": f"call_{n}",
            "name": "shell",
            "arguments": f'{{"command":"c{n}"}}',
        }

    def out(n):
        return {"type": "function_call_output", "call_id": f"call_{n}", "output": f"o{n}"}

    items = [msg("developer", "be brief"), msg("user", "task")]
    bodies = []
    for n in range(6):
        items = items + [msg("assistant", f"step {n}")]
        bodies.append(("/v1/responses", "openai-responses", {"model": "m", "input": items}))
        items = items + [call(n)]  # continues the assistant group of the request before
        bodies.append(("/v1/responses", "openai-responses", {"model": "m", "input": items}))
        items = items + [out(n), out(n + 100)]
        bodies.append(("/v1/responses", "openai-responses", {"model": "m", "input": items}))
    contents, messages = (
        [{"role": "user", "parts": [{"text": "task"}]}],
        [{"role": "user", "content": "task"}],
    )
    for n in range(6):
        contents = contents + [
            {"role": "model", "parts": [{"functionCall": {"name": "s", "args": {"n": n}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "s", "response": {"o": n}}}]},
        ]
        bodies.append(("/v1beta/models/m:generateContent", "gemini", {"contents": contents}))
        messages = messages + [
            {"role": "assistant", "content": f"a{n}"},
            {"role": "user", "content": f"u{n}"},
        ]
        bodies.append(("/v1/messages", "anthropic", {"model": "m", "max_tokens": 9, "messages": messages}))
        bodies.append(
            (
                "/v1/chat/completions",
                "openai-chat",
                {"model": "m", "messages": [{"role": "system", "content": "s"}, *messages]},
            )
        )
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        for p, proto, body in bodies:
            j.record_exchange(
                "r-groups", "POST", p, [], protocol=proto, status=200, request_body=orjson.dumps(body)
            )
    with JournalReader(path) as r:
        c = classify_run(r, "r-groups")
        for req in c.requests:
            mod = get_protocol(req.protocol)
            alone = mod.parse_request(r.request_body(req.exchange), path=req.exchange.path)
            assert req.messages == [_key(m) for m in mod.normalise(alone)["messages"]], req.id
            assert req.tail == alone.messages[req.tail_from :], req.id
    assert len(c.requests) == len(bodies) and all(req.left_out is None for req in c.requests)


def test_the_action_of_a_retried_step_is_the_reply_the_next_request_carries(tmp_path):
    """Request 1 sent twice, answered X then Y (both 200), the agent continuing with X (the
    second answer came too late, or a stream was retried after the agent had used the first):
    A_1 is X, the reply request 2 carries, and its exchange is the step's (and the main one)."""
    from pvisor.adapters.journal_trajectory import build_trajectory

    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-xy")
        x = s.send(calls=[("bash", '{"command":"echo X"}')], echo=False)  # the agent keeps this reply
        y = s.send(calls=[("bash", '{"command":"echo Y"}')], echo=False)  # the retry's, unused
        s.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1_0",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command":"echo X"}'},
                    }
                ],
            }
        )
        s.results("X")
        s.send(text="done")
    with JournalReader(path) as r:
        c = classify_run(r, "r-xy")
        t = build_trajectory(r, c)
        roles = c.roles()
    assert len(t.steps) == 2
    assert t.steps[0].action.tool_calls[0].arguments == {"command": "echo X"}
    assert t.meta["steps"][0]["exchange"] == x and t.meta["steps"][0]["retries"] == [y]
    assert "action_changed_by_agent" not in t.steps[0].flags and "retried" in t.steps[0].flags
    assert roles[x][1] == "main" and roles[y][1] == "auxiliary"


# =========================================================================== compaction (issue 14 item 1)

SUMMARY_TEXT = "We listed the files and read a.txt, which holds alpha."


def test_a_request_carrying_a_summary_continues_the_chain_it_summarises(tmp_path):
    """The agent asks for a summary with its own system prompt and tools (Codex, Qwen Code: the
    request extends the chain), then sends the summary in place of the history."""
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-compact")
        steps = [s.send(calls=[("bash", '{"command":"ls"}')])]
        s.results("a.txt")
        steps.append(s.send(calls=[("bash", '{"command":"cat a.txt"}')]))
        s.results("alpha")
        s.say("Summarise the conversation so far.")
        summary = s.send(text=SUMMARY_TEXT, echo=False)
        s.messages = [{"role": "user", "content": f"The conversation so far, summarised:\n{SUMMARY_TEXT}"}]
        steps.append(s.send(text="done"))
    with JournalReader(path) as r:
        c = classify_run(r, "r-compact")
        assert [sl.kept.id for sl in c.main.slots] == steps and c.main.slots[2].compaction.id == summary
        assert [(lo.exchange, lo.kind) for lo in c.left_out] == [(summary, "compaction")]
        # the roles journal show stores say the same chain as journal steps
        assert c.roles()[summary] == (c.main.number, "auxiliary")
    traj = steps_of(path, "r-compact")
    # the step before takes its results from the summary request, which holds them
    assert "compaction" in traj.steps[1].flags and [x.content for x in traj.steps[1].observation.results] == [
        "alpha"
    ]
    assert traj.meta["steps"][1]["compaction"] == summary


def test_another_conversation_quoting_the_last_reply_is_no_compaction(tmp_path):
    """A memory request under another system prompt and other tools holds the chain's last reply:
    it stays a chain of its own, and the chain keeps its last step."""
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        s = ChatSession(j, "r-memory")
        steps = [s.send(calls=[("bash", '{"command":"ls"}')])]
        s.results("a.txt")
        steps.append(s.send(text=SUMMARY_TEXT))
        memory = ChatSession(
            j,
            "r-memory",
            system="Extract memories.",
            tools=("save_memory",),
            task=f"The conversation:\nuser: {TASK}\nassistant: {SUMMARY_TEXT}",
        )
        other = memory.send(text="nothing to save")
    with JournalReader(path) as r:
        c = classify_run(r, "r-memory")
        assert [sl.kept.id for sl in c.main.slots] == steps
        assert [(lo.exchange, lo.kind) for lo in c.left_out] == [(other, "chain")]


def test_journal_steps_names_the_kept_and_the_discarded_retry_through_gateway(stack):
    """Request 1 sent twice through the gateway with the official SDK, the upstream answering
    X then Y, the agent continuing with X: the step keeps X's exchange and Y's is the discarded
    retry, in the text output, the --json and the auxiliary ``retry`` reason (issue 40 item 4a)."""
    actions = [
        Action(text="", tool_calls=[ToolCall(None, "bash", '{"command": "echo X"}')]),
        Action(text="", tool_calls=[ToolCall(None, "bash", '{"command": "echo Y"}')]),
        Action(text="Done."),
    ]
    up = scripted_replies(stack, actions)
    gw = stack.gateway(upstreams={"openai": up.url})
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "Run a shell command.", "parameters": SHELL},
        }
    ]
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    first = client.chat.completions.create(model="gpt-test", messages=messages, tools=tools).choices[0]
    again = client.chat.completions.create(model="gpt-test", messages=messages, tools=tools).choices[0]
    assert again.message.tool_calls[0].function.arguments == '{"command": "echo Y"}'
    messages.append(first.message.model_dump(exclude_none=True))  # the agent goes on with X
    messages.append({"role": "tool", "tool_call_id": first.message.tool_calls[0].id, "content": "X\n"})
    client.chat.completions.create(model="gpt-test", messages=messages, tools=tools)
    x, y, last = (e.id for e in stack.exchanges(gw))
    proc = pvisor("journal", "steps", gw.run, journal=gw.journal_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    step1 = next(ln for ln in lines if ln.startswith("1 "))
    assert x in step1 and "echo X" in step1 and "retried" in step1
    assert lines[-2:] == [
        "auxiliary: 1",
        f"  seq 2  {y}  [retry] the same request as {x} (status 200); the step keeps {x} (status 200), "
        "whose reply the next request carries",
    ]
    proc = pvisor("journal", "steps", gw.run, "--json", journal=gw.journal_path)
    doc = orjson.loads(proc.stdout)
    assert [(s["exchange"], s["retries"]) for s in doc["steps"]] == [(x, [y]), (last, [])]
    assert [(a["exchange"], a["kind"]) for a in doc["auxiliary"]] == [(y, "retry")]
    assert f"the step keeps {x}" in doc["auxiliary"][0]["reason"]
    from pvisor.adapters.journal_trajectory import build_trajectory

    with stack.reader(gw) as r:
        c = classify_run(r, gw.run)
        build_trajectory(r, c)
    # the roles `pvisor run` stores and the classification's own list say the same
    assert (c.roles()[x][1], c.roles()[y][1]) == ("main", "auxiliary")
    assert [(lo.exchange, lo.kind) for lo in c.left_out] == [(y, "retry")]
