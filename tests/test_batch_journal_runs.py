"""A batch over journal runs reads each run once (issue 41; replay/journal_runs.py): the lines of
one run with the same options share its classification, each prefix is still what a single
prepare-only writes, lines of other options (agent, episode) get their own, and a journal
written between two lines is read again, as a single prepare reads a run still being written.
What a line adds is not O(steps) of Python work either: each step's tool-call records are made
once for all the lines of a source (replay/result_parts.py ``ToolCallMemo``), and a recorded
prefix is described from what the classification read of it, not parsed again.

The work is counted, never timed: the runs classified (``JournalRuns.runs_classified``), the
SQL statements the batch's journal connection ran (SQLite's trace callback) and the tool-call
records made (``ToolCallMemo.made``)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import orjson

from pvisor.journal.model import Run
from pvisor.journal.writer import Journal
from pvisor.replay.batch import SourceReads, Status, prepare_many
from pvisor.replay.output import OUTPUT_FILES
from pvisor.replay.prepare import PrepareOptions, prepare

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import batch_bench  # noqa: E402  (bench/ is not a package: it is put on the path above)


def comparable(out: Path) -> dict[str, object]:
    """The three files of ``out`` with the result's timings dropped and its output paths made
    relative (the batch's and the single prepare's directories differ)."""
    files = {name: (out / name).read_bytes() for name in OUTPUT_FILES}
    result = orjson.loads(files["result.json"])
    result.pop("timings_ms")
    text = orjson.dumps(result).decode().replace(str(out.resolve()), "OUT").replace(str(out), "OUT")
    return {
        "prefix.json": files["prefix.json"],
        "prefix.request.json": files["prefix.request.json"],
        "result": text,
    }


def single(opts: PrepareOptions) -> dict[str, object]:
    """What one prepare-only writes for ``opts`` (its files, comparable)."""
    outcome = prepare(opts)
    assert outcome.error is None, outcome.error
    return comparable(opts.output)


def test_fifty_boundaries_of_one_journal_run_read_it_once_and_each_is_its_single_prepare(tmp_path: Path):
    # and make the records of its tool calls once
    journal = tmp_path / "j.sqlite"
    run = batch_bench.chat_run(journal, tmp_path / "run.traj.json", 60)
    bounds = random.Random(41).sample(range(1, 60), 48) + [0, 60]  # 60: the last, rendered
    random.Random(7).shuffle(bounds)
    reads = SourceReads()
    statements: list[str] = []
    reads.runs.reader(journal).conn.set_trace_callback(statements.append)  # the batch's own connection
    opts = [
        PrepareOptions("mini-swe-agent", n, tmp_path / "batch" / str(i), run=run, journal=journal)
        for i, n in enumerate(bounds)
    ]
    per_line = []
    for outcome in prepare_many(opts, reads=reads):
        assert outcome.status is Status.OK, outcome.error
        per_line.append(len(statements) - sum(per_line))
    steps = reads.runs.classified(reads.runs.reader(journal), run, "mini-swe-agent", None).trajectory.steps
    memo = reads.tool_calls(steps, None, lambda: None)
    assert memo is not None and memo.made == 59  # one record per call of the 59 actions, for 50 lines
    reads.close()
    # one prepare's work is the first line's (the run read and classified); the 49 others
    # together read less than it again: the batch costs at most twice one prepare
    assert sum(per_line[1:]) <= per_line[0], per_line
    assert max(per_line[1:]) * 10 <= per_line[0], per_line
    assert reads.runs.runs_classified == 1
    for i, n in enumerate(bounds):
        alone = PrepareOptions("mini-swe-agent", n, tmp_path / "single" / str(i), run=run, journal=journal)
        assert comparable(tmp_path / "batch" / str(i)) == single(alone), n


def _reply(mid: str, content: list) -> bytes:
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return json.dumps(
        {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": content,
            "stop_reason": stop,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }  # fmt: skip
    ).encode()


def _subagent_run(journal: Path) -> str:
    """A Claude Code run whose main loop's step 1 is a Task call (id ``toolu_spawn``) and whose
    subagent (its own system prompt) makes a Bash call then answers; the main loop then answers."""
    tools = [{"name": n, "description": n, "input_schema": {"type": "object"}} for n in ("Bash", "Task")]
    task = {"description": "sub", "prompt": "Count the files.", "subagent_type": "general-purpose"}
    spawn = {"type": "tool_use", "id": "toolu_spawn", "name": "Task", "input": task}
    bash = {"type": "tool_use", "id": "toolu_sh", "name": "Bash", "input": {"command": "ls | wc -l"}}

    def result(call_id: str, text: str) -> dict:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}

    main1 = [{"role": "user", "content": "Ask a subagent to count the files."}]
    sub1 = [{"role": "user", "content": "Count the files."}]
    sub2 = [*sub1, {"role": "assistant", "content": [bash]}, result("toolu_sh", "3\n")]
    main2 = [*main1, {"role": "assistant", "content": [spawn]}, result("toolu_spawn", "3 files")]
    sent = [
        ("main", main1, _reply("msg_1", [spawn])),
        ("sub", sub1, _reply("msg_2", [bash])),
        ("sub", sub2, _reply("msg_3", [{"type": "text", "text": "3 files"}])),
        ("main", main2, _reply("msg_4", [{"type": "text", "text": "There are 3 files."}])),
    ]
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-sub", agent="claude-code", agent_version="2.1.300"))
        for who, msgs, reply in sent:
            system = "You are the main agent." if who == "main" else "You are a subagent."
            body = {"model": "claude-x", "system": system, "tools": tools, "messages": msgs}
            json_type = [("content-type", "application/json")]
            j.record_exchange("r-sub", "POST", "/v1/messages", json_type, protocol="anthropic", status=200,
                              request_body=json.dumps(body).encode(), response_body=reply,
                              response_headers=json_type)  # fmt: skip
    return "r-sub"


def test_lines_of_one_run_with_other_options_are_never_given_another_lines_classification(tmp_path: Path):
    journal = tmp_path / "j.sqlite"
    sub_run = _subagent_run(journal)
    # a run that records no agent: --agent is taken on trust, and each agent's chain hint is its own
    anon = batch_bench.chat_run(journal, tmp_path / "anon.traj.json", 6, run="r-anon", agent=None)
    lines = [
        ("claude-code", sub_run, 1, None),
        ("claude-code", sub_run, 1, "toolu_spawn"),
        ("claude-code", sub_run, 1, "main"),
        ("mini-swe-agent", anon, 3, None),
        ("qwen-code", anon, 3, None),
    ] * 2
    reads = SourceReads()
    opts = [
        PrepareOptions(agent, n, tmp_path / "batch" / str(i), run=run, journal=journal, episode=episode)
        for i, (agent, run, n, episode) in enumerate(lines)
    ]
    outcomes = list(prepare_many(opts, reads=reads))
    reads.close()
    assert all(o.status is Status.OK for o in outcomes), [o.error for o in outcomes]
    assert reads.runs.runs_classified == 5  # each of the five options once, its second line shared
    for i, o in enumerate(opts):
        alone = PrepareOptions(o.agent, o.after_step, tmp_path / "single" / str(i), run=o.run,
                               journal=journal, episode=o.episode)  # fmt: skip
        assert comparable(tmp_path / "batch" / str(i)) == single(alone), lines[i]
    main, sub = (orjson.loads(outcomes[i].prefix.body) for i in (0, 1))
    assert main["system"] == "You are the main agent." and sub["system"] == "You are a subagent."
    for i, agent in ((3, "mini-swe-agent"), (4, "qwen-code"), (8, "mini-swe-agent"), (9, "qwen-code")):
        said = [w["message"] for w in outcomes[i].result["warnings"]]
        assert f"run r-anon records no agent: --agent {agent} is taken as given" in said, (i, said)


def test_a_run_written_between_two_lines_is_read_again_as_a_single_prepare_reads_it(tmp_path: Path):
    journal = tmp_path / "j.sqlite"
    full = tmp_path / "full.sqlite"
    batch_bench.chat_run(full, tmp_path / "run.traj.json", 8, run="live")
    from pvisor.journal.reader import JournalReader

    with JournalReader(full) as r:
        exchanges = [(ex, r.request_body(ex), r.response_body(ex)) for ex in r.exchanges("live")]
    reads = SourceReads()

    def line(n: int, name: str):
        opts = PrepareOptions("mini-swe-agent", n, tmp_path / name, run="live", journal=journal)
        [outcome] = prepare_many([opts], reads=reads)
        return opts, outcome

    with Journal.open(journal) as j:  # the agent still running: its writer open across the lines
        j.create_run(Run(id="live", agent="mini-swe-agent", agent_version="2.4.6"))

        def write(upto: int) -> None:
            for ex, req, resp in exchanges[:upto]:
                j.record_exchange("live", ex.method, ex.path, list(ex.request_headers.items()),
                                  protocol=ex.protocol, status=ex.status, request_body=req,
                                  response_body=resp)  # fmt: skip
            j.flush()

        write(4)
        _, first = line(2, "a")
        assert first.status is Status.OK and first.result["boundary"]["steps_total"] == 4
        # step 4 made a call whose observation request 5 would carry: not recorded yet
        _, early = line(4, "b")
        assert (
            early.status is Status.FAILED and early.result["errors"][0]["code"] == "observation_not_recorded"
        )
        del exchanges[:4]
        write(2)  # requests 5 and 6 arrive
        opts, late = line(4, "c")
        assert late.status is Status.OK, late.error
        assert late.result["boundary"]["steps_total"] == 6
        assert comparable(tmp_path / "c") == single(
            PrepareOptions("mini-swe-agent", 4, tmp_path / "single", run="live", journal=journal)
        )
        # the run was read for line a, shared by line b (nothing committed between), read again
        # for line c: the commit of requests 5 and 6 came between
        assert reads.runs.runs_classified == 2
        line(5, "d")
        assert reads.runs.runs_classified == 2  # nothing committed since: the run is shared
    reads.close()


def test_a_ray_worker_reads_a_run_once_for_all_the_batches_it_is_given(tmp_path: Path):
    # the Preparer actor of replay/ray_data.py, called as Ray calls it (a dict of columns per
    # batch), here in this process: Ray itself is not needed to count what it reads
    from pvisor.replay.ray_data import Preparer

    journal = tmp_path / "j.sqlite"
    run = batch_bench.chat_run(journal, tmp_path / "run.traj.json", 12)
    worker = Preparer()
    rows: dict[str, list] = {"prefix": [], "status": []}
    for bounds in ((3, 7, 12), (1, 7)):
        batch = {
            "run": [run] * len(bounds),
            "journal": [str(journal)] * len(bounds),
            "agent": ["mini-swe-agent"] * len(bounds),
            "after_step": list(bounds),
        }
        out = worker(batch)
        rows["prefix"] += out["prefix"]
        rows["status"] += out["status"]
    assert rows["status"] == ["ok"] * 5
    assert worker.reads.runs.runs_classified == 1
    nowhere: Any = None  # no output directory: the outcome holds the prefix
    alone = [
        o.prefix.body.decode()
        for n in (3, 7, 12, 1, 7)
        for o in prepare_many([PrepareOptions("mini-swe-agent", n, nowhere, run=run, journal=journal)])
    ]
    assert rows["prefix"] == alone


def test_a_journal_replaced_under_its_path_between_two_lines_is_opened_again(tmp_path: Path):
    import os

    journal, other = tmp_path / "j.sqlite", tmp_path / "other.sqlite"
    batch_bench.chat_run(journal, tmp_path / "a.traj.json", 4, run="r")
    batch_bench.chat_run(other, tmp_path / "b.traj.json", 6, run="r")  # the same run id, longer
    reads = SourceReads()
    opts = PrepareOptions("mini-swe-agent", 2, tmp_path / "a", run="r", journal=journal)
    [before] = prepare_many([opts], reads=reads)
    assert before.result["boundary"]["steps_total"] == 4
    os.replace(other, journal)  # no commit to the file the batch holds open: another file
    [after] = prepare_many(
        [PrepareOptions("mini-swe-agent", 5, tmp_path / "b", run="r", journal=journal)], reads=reads
    )
    reads.close()
    assert after.status is Status.OK, after.error
    assert after.result["boundary"]["steps_total"] == 6
    assert reads.runs.runs_classified == 2
    assert comparable(tmp_path / "b") == single(
        PrepareOptions("mini-swe-agent", 5, tmp_path / "single", run="r", journal=journal)
    )


def test_a_journal_overwritten_in_place_between_two_lines_is_opened_again(tmp_path: Path):
    # cp keeps the inode, and the connection the batch holds sees no commit: the file's size and
    # time tell (a stale run served as the new one is a wrong prefix with exit 0)
    import shutil

    journal, other = tmp_path / "j.sqlite", tmp_path / "other.sqlite"
    batch_bench.chat_run(journal, tmp_path / "a.traj.json", 4, run="r")
    batch_bench.chat_run(other, tmp_path / "b.traj.json", 6, run="r")  # the same run id, longer
    inode = journal.stat().st_ino
    reads = SourceReads()
    [before] = prepare_many(
        [PrepareOptions("mini-swe-agent", 2, tmp_path / "a", run="r", journal=journal)], reads=reads
    )
    assert before.result["boundary"]["steps_total"] == 4
    with open(other, "rb") as src, open(journal, "r+b") as dst:
        shutil.copyfileobj(src, dst)
        dst.truncate()
    assert journal.stat().st_ino == inode
    [after] = prepare_many(
        [PrepareOptions("mini-swe-agent", 5, tmp_path / "b", run="r", journal=journal)], reads=reads
    )
    reads.close()
    assert after.status is Status.OK, after.error
    assert after.result["boundary"]["steps_total"] == 6
    assert comparable(tmp_path / "b") == single(
        PrepareOptions("mini-swe-agent", 5, tmp_path / "single", run="r", journal=journal)
    )


def test_what_a_runs_classification_knows_of_each_request_is_what_parsing_it_again_says(tmp_path: Path):
    # a recorded prefix is described from these facts: each must be what the result said when
    # it parsed the body again (every protocol, retries, resumed and auxiliary requests)
    from corpus_runs import RUNS, record_corpus_runs

    from pvisor.adapters.protocols import get_protocol
    from pvisor.journal.reader import JournalReader
    from pvisor.replay.prefix import classify_journal_run
    from pvisor.replay.result_parts import prefix_facts

    from conftest import corpus_dir

    journal = tmp_path / "j.sqlite"
    record_corpus_runs(corpus_dir(), journal)
    _subagent_run(journal)
    seen: dict[str, int] = {}
    with JournalReader(journal) as reader:
        for run, agent in [*((r, a) for r, (a, _) in RUNS.items()), ("r-sub", "claude-code")]:
            classified = classify_journal_run(reader, run, agent, None)
            main = {r.id for r in classified.classification.main_requests}
            assert main <= set(classified.facts), run
            for request in classified.classification.requests:
                if request.id not in classified.facts:
                    continue
                ex = request.exchange
                conv = get_protocol(request.protocol).parse_request(
                    reader.request_body(ex), path=ex.path, query=ex.query
                )
                assert classified.facts[request.id] == prefix_facts(conv), (run, request.id)
                seen[request.protocol] = seen.get(request.protocol, 0) + 1
    assert set(seen) == {"anthropic", "gemini", "openai-chat", "openai-responses"}, seen


def test_a_tool_call_memo_gives_each_boundary_what_the_steps_give_without_it():
    # every native sample of the corpus (parallel calls, errors, results matched by position),
    # its boundaries in a random order, A_N's observation sent and not: the same records, and
    # each step's made once but the unsent ones, which are made for their boundary
    from pvisor.adapters.native import read_native
    from pvisor.core.errors import BadInputError
    from pvisor.replay.result import ResultPart
    from pvisor.replay.result_parts import ToolCallMemo, tool_call_records

    from native_helpers import native_dir

    files = [(d.name, f) for d in sorted(native_dir().iterdir()) if d.is_dir() for f in sorted(d.iterdir())]
    calls_seen = 0
    for agent, path in files:
        if path.name == "PROVENANCE.md" or agent == "atif":
            continue
        try:
            steps = list(read_native(path, agent)[0].trajectory.steps)
        except BadInputError:  # a sample that is read another way (an OpenCode database's dump)
            continue
        for wire in (None, lambda action: [f"wire-{c.id}" for c in action.tool_calls]):
            memo = ToolCallMemo(steps, wire)
            bounds = [(n, unsent) for n in range(len(steps) + 1) for unsent in (False, True)]
            random.Random(len(steps)).shuffle(bounds)
            unsent_made = 0
            for n, unsent in bounds:
                got = tool_call_records(steps, n, wire, unsent, memo)
                want = tool_call_records(steps, n, wire, unsent)
                written = orjson.dumps([r.to_json() for r in got])  # keys in order
                assert written == orjson.dumps([r.to_json() for r in want]), (path.name, n, unsent)
                # the written-out to_json of a record is the loop over its fields
                assert written == orjson.dumps([ResultPart.to_json(r) for r in got])
                unsent_made += len(steps[n - 1].action.tool_calls) if unsent and n > 0 else 0
            calls = sum(len(s.action.tool_calls) for s in steps)
            assert memo.made == calls + unsent_made, path.name
            calls_seen += calls
    assert calls_seen > 50
    # a record of replay-only too (its fields that prepare-only leaves out), in the same order
    from pvisor.replay.result import ToolCallRecord

    record = ToolCallRecord(3, "c", "bash", "function", "a" * 64, "{}", False, "b" * 64, "b" * 64, True,
                            equal_normalised=True, replayed_call_id="c2")  # fmt: skip
    assert orjson.dumps(record.to_json()) == orjson.dumps(ResultPart.to_json(record))
    assert record.to_json()["replayed_call_id"] == "c2"
