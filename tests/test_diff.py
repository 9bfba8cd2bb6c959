"""``pvisor diff A B`` (docs/diff.md): constructed pairs of requests journaled in a real journal
file and compared through the real CLI (a moved block, a changed string, a reordered key, an
Anthropic pair with ``cache_control`` breakpoints, an OpenAI pair in 128-token increments,
recorded usage before the estimate), two runs step by step, a derived run's report section, a
real Claude Code resumed attempt against its first (captured offline with the scripted model),
bad input with its exit code and one line, and docs/diff.md's examples."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from cli_helpers import pvisor_main
from test_gateway_cli import ENV, PVISOR

from pvisor.adapters.request_diff import diff_requests, report_section
from pvisor.journal.model import Attempt, Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: a system prompt past the caches' 1,024-token minimum (about 2,250 tokens by bytes / 4)
SYSTEM = " ".join(f"Rule {i}: keep the workspace tidy and the tests green." for i in range(170))
CC = {"type": "ephemeral"}


def anthropic_body(messages: list, *, system_marker: bool = True, **extra) -> dict:
    system = [{"type": "text", "text": SYSTEM, **({"cache_control": CC} if system_marker else {})}]
    tools = [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}]
    return {
        "model": "claude-x",
        "max_tokens": 1000,
        "system": system,
        "tools": tools,
        "messages": messages,
        **extra,
    }


def conversation(n: int, marker_at: tuple[int, ...] = ()) -> list:
    """``n`` messages: user task, then assistant tool_use and user tool_result in turns; a
    ``cache_control`` marker on the last block of each message index in ``marker_at``."""
    out: list = [{"role": "user", "content": [{"type": "text", "text": "Write a.txt, b.txt and c.txt."}]}]
    for i in range(1, n):
        if i % 2:
            block = {
                "type": "tool_use",
                "id": f"toolu_{i}",
                "name": "Bash",
                "input": {"command": f"touch {i}.txt"},
            }
            out.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {i}."}, block]})
        else:
            out.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": f"toolu_{i - 1}", "content": f"made {i}"}
                    ],
                }
            )
    for i in marker_at:
        out[i]["content"][-1]["cache_control"] = CC
    return out


def write_pair(path: Path, a: bytes, b: bytes, protocol: str = "anthropic", usage_b: dict | None = None):
    """Two exchanges A and B, each its own run, into the journal at ``path``: (id A, id B)."""
    url = {"anthropic": "/v1/messages", "openai-chat": "/v1/chat/completions"}[protocol]
    reply = (
        {"id": "m", "type": "message", "role": "assistant", "model": "claude-x",
         "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
         "usage": usage_b or {"input_tokens": 1, "output_tokens": 1}}
        if protocol == "anthropic"
        else {"id": "c", "object": "chat.completion", "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                           "finish_reason": "stop"}],
              **({"usage": usage_b} if usage_b else {})}
    )  # fmt: skip
    ids = []
    with Journal.open(path) as j:
        for name, body in (("a", a), ("b", b)):
            run = f"pair-{name}-{len(ids)}-{abs(hash((a, b))) % 10**8}"
            j.create_run(Run(id=run, agent="claude-code"))
            ids.append(
                j.record_exchange(
                    run,
                    "POST",
                    url,
                    [],
                    protocol=protocol,
                    status=200,
                    request_body=body,
                    response_body=orjson.dumps(reply),
                )  # fmt: skip
            )
        j.flush()
    return ids


def cli(journal: Path, *args: str):
    return pvisor_main(["--journal", str(journal), "diff", *args], env=ENV, text=True)


def diff_json(journal: Path, a: str, b: str, code: int = 1) -> dict:
    p = cli(journal, a, b, "--json")
    assert p.returncode == code, p.stderr
    return json.loads(p.stdout)


def test_a_changed_string_is_named_by_message_part_and_field(tmp_path):
    j = tmp_path / "j.sqlite"
    a = conversation(5, marker_at=(4,))
    b = copy.deepcopy(a)
    b[2]["content"][0]["content"] = "made nothing"
    body_a, body_b = orjson.dumps(anthropic_body(a)), orjson.dumps(anthropic_body(b))
    xa, xb = write_pair(j, body_a, body_b)
    p = cli(j, xa, xb)
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    first = body_a.index(b"made 2") + len(b"made ")
    assert lines[0] == f"differs: bodies part at byte {first:,} (A {len(body_a):,} bytes, B {len(body_b):,})"
    assert lines[1].startswith("where: message 2 part 0: the tool result differs (expected content: ")
    assert "made 2" in lines[1] and "made nothing" in lines[1]
    doc = diff_json(j, xa, xb)
    s = doc["structure"]
    assert (s["path"], s["message"], s["part"], s["field"]) == ("messages[2].parts[0]", 2, 0, "tool_result")
    assert doc["verdict"] == "differs" and doc["first_byte"] == first and doc["extends"] is False
    # the only breakpoint before the change is the system prompt's: reuse stops there
    assert doc["cache"]["rule"] == "breakpoints" and doc["cache"]["reused_upto"] == "system[0]"
    assert doc["cache"]["first_uncached"] == "messages[0]" and doc["cache"]["estimate"] is True


def test_a_moved_block_is_named_as_moved(tmp_path):
    j = tmp_path / "j.sqlite"
    a = conversation(3)
    b = copy.deepcopy(a)
    b[1]["content"].reverse()  # the tool_use before the text: one block moved
    doc = diff_json(j, *write_pair(j, orjson.dumps(anthropic_body(a)), orjson.dumps(anthropic_body(b))))
    s = doc["structure"]
    assert (s["message"], s["part"], s["field"]) == (1, 0, "tool_call")
    assert s["reason"] == "a block was moved: B's messages[1].parts[0] is A's messages[1].parts[1]"


def test_a_reordered_key_is_bytes_only_with_no_cache_cost(tmp_path):
    j = tmp_path / "j.sqlite"
    a = anthropic_body(conversation(3, marker_at=(2,)))
    b = dict(reversed(list(a.items())))  # the same JSON, keys in another order
    b["messages"][1]["content"][1] = dict(reversed(list(b["messages"][1]["content"][1].items())))
    body_a, body_b = orjson.dumps(a), json.dumps(b, indent=1).encode()
    xa, xb = write_pair(j, body_a, body_b)
    p = cli(j, xa, xb)
    assert p.returncode == 0, p.stderr  # the prompt is the same
    assert p.stdout.splitlines()[0].startswith("bytes_only: bodies part at byte 1 ")
    doc = diff_json(j, xa, xb, code=0)
    assert doc["verdict"] == "bytes_only" and doc["structure"] is None
    cache = doc["cache"]
    assert cache["tokens_after"] == 0 and cache["reusable_bytes"] == cache["prompt_bytes"]
    assert cache["basis"] == "the prompt is unchanged: the difference costs no cache"
    # the same bytes: "same", nothing more to say
    same = diff_json(j, xa, xa, code=0)
    assert same["verdict"] == "same" and same["first_byte"] is None and same["cache"] is None


def test_anthropic_reuse_stops_at_the_last_breakpoint_before_the_difference(tmp_path):
    """Breakpoints on the system prompt and on messages 2 and 4 (as Claude Code places them);
    B changes message 5's text: the cache serves up to message 4's last block, and moving the
    newest marker on (as every next request does) is no change of the prompt."""
    j = tmp_path / "j.sqlite"
    a = conversation(7, marker_at=(2, 4, 6))
    b = copy.deepcopy(a)
    b[5]["content"][0]["text"] = "Step five, said otherwise."
    del b[6]["content"][-1]["cache_control"]
    b[5]["content"][-1]["cache_control"] = CC
    doc = diff_json(j, *write_pair(j, orjson.dumps(anthropic_body(a)), orjson.dumps(anthropic_body(b))))
    assert doc["structure"]["path"] == "messages[5].parts[0]" and doc["structure"]["field"] == "text"
    cache = doc["cache"]
    assert cache["reused_upto"] == "messages[4].parts[0]" and cache["first_uncached"] == "messages[5]"
    assert 0 < cache["reusable_bytes"] < cache["prompt_bytes"]
    assert cache["tokens_reused"] == cache["reusable_bytes"] // 4
    assert cache["tokens_after"] == -(-(cache["prompt_bytes"] - cache["reusable_bytes"]) // 4)
    # with no breakpoint before the difference nothing is reusable
    bare = diff_requests(
        orjson.dumps(anthropic_body(a, system_marker=False)),
        orjson.dumps(anthropic_body([{"role": "user", "content": "other task"}], system_marker=False)),
        "anthropic",
    )
    assert bare.cache["reusable_bytes"] == 0 and bare.cache["first_uncached"] == "model"


def chat_body(user: str) -> dict:
    return {
        "model": "gpt-x",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }


def test_openai_reuses_the_common_prefix_in_128_token_increments(tmp_path):
    j = tmp_path / "j.sqlite"
    a, b = chat_body("Write a.txt."), chat_body("Write b.txt.")
    doc = diff_json(j, *write_pair(j, orjson.dumps(a), orjson.dumps(b), "openai-chat"))
    cache = doc["cache"]
    # the leading system message is the system prompt: the user's is message 0
    assert doc["structure"]["path"] == "messages[0].parts[0]" and cache["rule"] == "increments"
    # the common prefix: model, the system prompt, the role block and the user text up to "a"/"b"
    common = (
        len(orjson.dumps("gpt-x")) + len(orjson.dumps(a["messages"][0])) + len(b'"user"') + len('"Write ')
    )
    assert cache["tokens_reused"] == common // 4 // 128 * 128 and cache["tokens_reused"] >= 1024
    assert cache["reusable_bytes"] == cache["tokens_reused"] * 4 and cache["estimate"] is True
    assert cache["basis"] == "OpenAI Chat Completions: the common prefix in 128-token increments"
    # a prompt under 1,024 tokens is never cached
    short = diff_requests(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}),
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "b"}]}),
        "openai-chat",
    )
    assert short.cache["reusable_bytes"] == 0 and "below the 1,024-token minimum" in short.cache["basis"]


def test_recorded_usage_is_taken_before_the_estimate(tmp_path):
    j = tmp_path / "j.sqlite"
    usage = {"prompt_tokens": 3000, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2048}}
    xa, xb = write_pair(j, orjson.dumps(chat_body("a")), orjson.dumps(chat_body("b")), "openai-chat", usage)
    cache = diff_json(j, xa, xb)["cache"]
    assert (cache["tokens_reused"], cache["tokens_after"], cache["estimate"]) == (2048, 952, False)
    assert cache["basis"] == "B's recorded usage (prompt_tokens_details.cached_tokens)"
    p = cli(j, xa, xb)
    assert p.stdout.splitlines()[-1].endswith(
        "2,048 tokens reused, 952 after (B's recorded usage (prompt_tokens_details.cached_tokens))"
    )


def chat_run(j: Journal, run: str, outputs: list[str], parent: str | None = None) -> None:
    """A Chat Completions run of ``len(outputs)`` shell steps whose results are ``outputs``."""
    tool = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
    j.create_run(
        Run(id=run, agent="mini-swe-agent", parent_run=parent, mode="replay-only" if parent else "capture")
    )
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "count"}]
    for i, out in enumerate(outputs):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": f'{{"command":"echo {i}"}}'},
        }
        reply = {"id": "c", "object": "chat.completion", "model": "m",
                 "choices": [{"index": 0,
                              "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                              "finish_reason": "tool_calls"}]}  # fmt: skip
        j.record_exchange(
            run, "POST", "/v1/chat/completions", [], protocol="openai-chat", status=200,
            request_body=orjson.dumps({"model": "m", "messages": messages, "tools": [tool]}),
            response_body=orjson.dumps(reply),
        )  # fmt: skip
        messages = [
            *messages,
            reply["choices"][0]["message"],
            {"role": "tool", "tool_call_id": f"call_{i}", "content": out},
        ]


def test_two_runs_are_aligned_step_by_step_and_the_first_parting_step_named(tmp_path):
    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        chat_run(w, "parent", ["0", "1", "2", "3"])
        chat_run(w, "child", ["0", "1", "two", "3", "4"], parent="parent")
        w.flush()
    p = cli(j, "parent", "child")
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:4]] == ["step 1", "step 2", "step 3", "step 4"]
    assert all(ln.startswith(f"step {n}: same bytes (") for n, ln in zip((1, 2, 3), lines))
    assert lines[3].startswith("step 4: differs: ")
    assert "message 6 part 0: the tool result differs" in lines[3]
    doc = diff_json(j, "parent", "child")
    parting = doc["steps"][3]
    assert lines[4:] == ["step 5 only in B", f"first parting step: 4 (A {parting['a']}, B {parting['b']})"]
    assert doc["mode"] == "steps" and doc["summary"]["first_parting_step"] == 4
    assert doc["summary"] == {"aligned": 4, "same": 3, "bytes_only": 0, "differs": 1,
                              "only_run_paths": 0, "only_incidental": 0, "only_a": 0, "only_b": 1,
                              "first_parting_step": 4, "first_real_parting_step": 4}  # fmt: skip
    assert doc["only_b"] == [5] and [s["verdict"] for s in doc["steps"]] == [
        "same",
        "same",
        "same",
        "differs",
    ]
    # the report's section of the derived run: the same, compact (no bodies)
    with JournalReader(j) as r:
        section = report_section(r, "child")
        assert report_section(r, "parent") is None
    assert section["against"] == "parent" and section["summary"]["first_parting_step"] == 4
    assert [
        set(s) >= {"step", "a", "b", "verdict", "first_byte", "structure", "cache"} for s in section["steps"]
    ] == [True] * 4
    assert len(orjson.dumps(section)) < 4000


def test_a_long_derived_run_is_compared_cheaply(tmp_path):
    """300 steps whose every request from step 2 on differs from its parent's: given the
    main-loop exchanges the page's trajectories found, the section reads each body once, the
    first REPORT_DETAIL_STEPS differing steps in full and the rest by verdict and bytes (1,000
    steps: docs/diff.md's figure; 300 keep this test within the suite's budget)."""
    from pvisor.adapters.journal_trajectory import trajectory_from_journal
    from pvisor.adapters.request_diff import REPORT_DETAIL_STEPS

    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        chat_run(w, "p", [f"out {i}" for i in range(300)])
        chat_run(w, "c", [f"out {i}" if i % 2 else f"other {i}" for i in range(300)], parent="p")
        w.flush()
    with JournalReader(j) as r:
        hints = {k: [d["exchange"] for d in trajectory_from_journal(r, k).meta["steps"]] for k in ("p", "c")}
        t = time.perf_counter()
        section = report_section(r, "c", hints=hints)
        took = time.perf_counter() - t
    assert section["summary"]["aligned"] == 300 and section["summary"]["first_parting_step"] == 2
    detailed = [s for s in section["steps"] if s["structure"] is not None]
    assert len(detailed) == REPORT_DETAIL_STEPS and detailed[0]["step"] == 2
    later = section["steps"][-1]
    assert (
        later["verdict"] == "differs" and later["cache"] is None and later["note"].startswith("not detailed")
    )
    assert took < 5  # about 0.1 s here; a generous bound for a busy CI box


@pytest.mark.slow
def test_a_claude_code_resumed_attempt_against_the_request_it_extends(resumed):
    cap, proc, _ = resumed("claude-code")
    assert proc.returncode == 0, proc.stderr
    p = pvisor_main(
        ["--journal", str(cap.journal), "diff", f"{cap.run}@1", f"{cap.run}@2", "--json"], env=ENV, text=True
    )
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["mode"] == "extends" and len(doc["steps"]) == 1
    step = doc["steps"][0]
    assert (step["a_step"], step["step"]) == (3, 4)
    assert step["verdict"] == "differs" and step["first_byte"] is not None
    cache = step["cache"]
    assert cache["rule"] == "breakpoints" and cache["estimate"] is True  # the scripted model reports no cache
    assert cache["tokens_after"] > 0 and cache["first_uncached"]
    text = pvisor_main(
        ["--journal", str(cap.journal), "diff", f"{cap.run}@1", f"{cap.run}@2"], env=ENV, text=True
    )
    assert text.returncode == 1 and text.stdout.splitlines()[0].startswith(
        "step 4 against A's step 3: differs: "
    )


def test_bad_input_is_one_line_with_its_exit_code(tmp_path):
    odd = tmp_path / "a:b"
    odd.mkdir()
    j = odd / "j.sqlite"  # a colon in the path: JOURNAL:ID splits at the last colon
    xa, xb = write_pair(j, b"not json {", orjson.dumps(anthropic_body(conversation(1))))
    (tmp_path / "notes.txt").write_text("not a journal\n" * 100)
    with JournalReader(j) as r:
        run_a = r.exchange(xa).run
    cases = [
        ([f"{j}:{xa}", f"{j}:{xb}"], 1, None),
        ([xa, "x-nope"], 2, "pvisor: error: B: no run or exchange x-nope in journal "),
        ([xa, f"{tmp_path}/none.sqlite:{xb}"], 2, "none.sqlite"),
        ([xa, f"{tmp_path}/notes.txt:{xb}"], 65, "(not an SQLite database)"),
        ([xa, f"{tmp_path}:{xb}"], 2, "is a directory"),
        ([xa, f":{xb}"], 2, "the journal before ':' is empty"),
        ([xa, f"{j}:"], 2, "no id: give an exchange or run id"),
        ([xa, "x/1"], 2, "is not an exchange or run id"),
        ([xa, run_a], 2, "A is an exchange and B a run: give two exchanges or two runs"),
        ([run_a, f"{run_a}@0"], 2, "the attempt after '@' must be a number from 1"),
        ([run_a, f"{run_a}@5"], 2, f"B: run {run_a} has no attempt 5"),
    ]
    for args, code, expected in cases:
        p = subprocess.run(
            [*PVISOR, "--journal", str(j), "diff", *args], env=ENV, capture_output=True, text=True
        )
        assert p.returncode == code, (args, p.stderr)
        assert "Traceback" not in p.stderr, (args, p.stderr)
        if expected is not None:
            assert len(p.stderr.splitlines()) == 1 and expected in p.stderr, (args, p.stderr)
    p = cli(j, f"{j}:{xa}", xb)
    assert p.stdout.splitlines()[1] == "note: body A is not JSON: compared as bytes only"
    assert p.stdout.splitlines()[0].startswith("differs: bodies part at byte 0 ")


def test_the_examples_of_docs_diff_run_with_their_exit_codes(tmp_path):
    j = tmp_path / "journal.sqlite"
    a = conversation(3, marker_at=(2,))
    b = copy.deepcopy(a)
    b[2]["content"][0]["content"] = "made nothing"
    xa, xb = write_pair(j, orjson.dumps(anthropic_body(a)), orjson.dumps(anthropic_body(b)))
    with Journal.open(j) as w:
        chat_run(w, "r-docs-parent", ["0", "1", "2"])
        chat_run(w, "r-docs-child", ["0", "one", "2"], parent="r-docs-parent")
        w.start_attempt(Attempt(run="r-docs-parent", n=1))
        w.flush()
    env = {**ENV, "PVISOR_JOURNAL": str(j), "A": xa, "B": xb, "JOURNAL": str(j),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}  # fmt: skip
    blocks = re.findall(r"```console\n(.*?)```", (DOCS / "diff.md").read_text(), flags=re.S)
    commands = [ln[2:] for block in blocks for ln in block.splitlines() if ln.startswith("$ ")]
    assert len(commands) >= 5
    for command in commands:
        m = re.search(r"#\s*exit (\d+)", command)
        proc = subprocess.run(
            ["bash", "-c", command.split("#")[0]], env=env, cwd=tmp_path, capture_output=True, timeout=60
        )
        assert proc.returncode == (int(m.group(1)) if m else 0), (command, proc.stderr.decode())
        assert b"Traceback" not in proc.stderr, command


def anthropic_run(
    w: Journal,
    run: str,
    results: list[str],
    parent: str | None = None,
    end: bool = False,
    session: bool = False,
):
    """A Claude Code-shaped run whose system prompt names its private home (as Claude Code names
    its memory folder), one step per result; ``end``: its last request is a replay's request
    after the boundary (answered by playback's synthetic final reply); ``session``: its
    ``metadata.user_id`` names the run's own session, as Claude Code's does."""
    home = f"/data/runs/{run}/home"
    labels = {"run_dir": f"/data/runs/{run}", "home": home, "workspace": f"/data/{run}-ws"}
    mode = "replay-only" if parent else "capture"
    w.create_run(Run(id=run, agent="claude-code", parent_run=parent, mode=mode, labels=labels))
    roles = {}
    for i, out in enumerate(results):
        msgs = conversation(2 * i + 1)
        for k, m in enumerate(msgs[2::2], 1):
            m["content"][0]["content"] = results[k - 1]
        body = anthropic_body(msgs, **({"metadata": {"user_id": f"user_0_session_{run}"}} if session else {}))
        body["system"].append(
            {"type": "text", "text": f"Your memory is in `{home}/.claude/projects/-ws/memory/`."}
        )
        last = end and i == len(results) - 1
        x = w.record_exchange(
            run, "POST", "/v1/messages", [], protocol="anthropic", status=200,
            request_body=orjson.dumps(body), response_body=b"{}", flags=["synthetic_end"] if last else [],
        )  # fmt: skip
        roles[x] = (1, "auxiliary" if last else "main")
    w.flush()
    w.set_exchange_roles(run, roles)


def test_a_difference_of_the_runs_own_directories_is_told_from_a_real_one(tmp_path):
    """Claude Code names its memory folder inside each run's private home in its system prompt:
    a replay parted from its parent there at every step and the tool result that differed in
    the messages was never named. Each part's first difference is named (``differences``), a
    difference made only of the runs' own directories is ``run_paths`` (``only_run_paths`` when
    it is the only one), and the replay's request after the boundary (answered by the synthetic
    end) is compared with the parent's next step."""
    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        anthropic_run(w, "p", ["made 1", "made 2", "made 3"])
        anthropic_run(w, "c", ["made nothing", "made 2"], parent="p", end=True)
        w.flush()
    doc = diff_json(j, "p", "c")
    one, two = doc["steps"]
    assert one["verdict"] == "differs" and one["only_run_paths"] is True
    assert one["structure"]["path"] == "system[1]" and one["structure"]["run_paths"] is True
    assert "runs' own directories" in one["structure"]["reason"]
    assert one["cache"]["reusable_bytes"] < one["cache"]["prompt_bytes"]  # the bytes still cost cache
    assert (two["step"], two["a_step"], two["after_boundary"], two["only_run_paths"]) == (2, 2, True, False)
    # the real difference first (``structure``), the incidental one after it
    assert [(d["path"], d["reason"], d["kind"], d["incidental"]) for d in two["differences"]][0] == (
        "messages[2].parts[0]",
        "the tool result differs",
        "real",
        False,
    )
    assert two["structure"] == two["differences"][0] and two["only_incidental"] is False
    assert (two["differences"][1]["run_paths"], two["differences"][1]["kind"]) == (True, "run_paths")
    assert one["only_incidental"] is True and one["structure"]["kind"] == "run_paths"
    assert doc["only_a"] == [3]
    summary = doc["summary"]
    assert (summary["only_run_paths"], summary["first_parting_step"], summary["first_real_parting_step"]) == (
        1,
        1,
        2,
    )
    lines = cli(j, "p", "c").stdout.splitlines()
    assert lines[0].startswith("step 1: differs only in the runs' own directories: ")
    # the step leads with its real difference; the runs' own paths come after it, collapsed
    assert lines[1].startswith(
        "step 2 (the request after the boundary): differs: message 2 part 0: the tool result differs "
    )
    assert "; also: the runs' own paths in system[1]; bodies part at byte " in lines[1]
    assert lines[2:] == [
        "step 3 only in A",
        f"first real parting step: 2 (the request after the boundary) (A {two['a']}, B {two['b']}); "
        f"the first parting step, 1 (A {one['a']}, B {one['b']}), differs only in the runs' own directories",
    ]
    with JournalReader(j) as r:
        section = report_section(r, "c")
    assert [(s["step"], s["only_run_paths"], s["after_boundary"]) for s in section["steps"]] == [
        (1, True, False),
        (2, False, True),
    ]


def test_a_resume_that_starts_a_new_chain_is_no_step_0(tmp_path):
    """An attempt whose first request starts a new chain (Gemini CLI's resume) was "step 0"."""
    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        anthropic_run(w, "r-new-chain", ["made 1", "made 2"])
        w.start_attempt(Attempt(run="r-new-chain", n=1))
        w.start_attempt(Attempt(run="r-new-chain", n=2))
        x = w.record_exchange(
            "r-new-chain", "POST", "/v1/messages", [], protocol="anthropic", status=200, attempt=2,
            request_body=orjson.dumps(anthropic_body(conversation(1))), response_body=b"{}",
        )  # fmt: skip
        w.flush()
        w.set_exchange_roles("r-new-chain", {x: (2, "auxiliary")})
    doc = diff_json(j, "r-new-chain@1", "r-new-chain@2")
    assert (
        doc["mode"] == "extends"
        and doc["steps"][0]["step"] is None
        and doc["summary"]["first_parting_step"] is None
    )
    lines = cli(j, "r-new-chain@1", "r-new-chain@2").stdout.splitlines()
    assert lines[0].startswith("B's request 1 (a new chain) against A's step 2: differs: ")
    assert lines[-1].startswith("first parting step: B's request 1 (a new chain) (A ")
    assert not any("step 0" in ln for ln in lines)


def test_the_wording_names_its_units_protocols_and_paths(tmp_path, monkeypatch):
    """``B extends A: 2 more blocks after A's N blocks`` (N of what), two protocols named, an
    exchange of a bare gateway capture has no attempt (null), and a journal given relatively is
    shown absolute as the default journal is."""
    j = tmp_path / "j.sqlite"
    xa, xb = write_pair(
        j, orjson.dumps(anthropic_body(conversation(1))), orjson.dumps(anthropic_body(conversation(3)))
    )
    doc = diff_json(j, xa, xb)
    assert doc["structure"]["reason"] == "B extends A: 5 more blocks after A's 5 blocks", doc["structure"]
    assert doc["a"]["attempt"] is None and doc["b"]["attempt"] is None
    monkeypatch.chdir(tmp_path)
    rel = pvisor_main(
        ["--journal", "j.sqlite", "diff", f"j.sqlite:{xa}", xb, "--json"], env=ENV, text=True, cwd=tmp_path
    )
    both = json.loads(rel.stdout)
    assert both["a"]["journal"] == both["b"]["journal"] == str(j)
    with Journal.open(j) as w:
        w.create_run(Run(id="r-chat", agent="codex"))
        x = w.record_exchange(
            "r-chat", "POST", "/v1/responses", [], protocol="openai-responses", status=200,
            request_body=orjson.dumps({"model": "m", "input": "hi"}), response_body=b"{}",
        )  # fmt: skip
        w.flush()
    doc = diff_json(j, xa, x)
    assert doc["note"] == "different protocols (anthropic against openai-responses): compared as JSON"


def codex_run(w: Journal, run: str, outputs: list[str], parent: str | None = None) -> None:
    """A Codex-shaped run (OpenAI Responses) of one ``exec_command`` step per output: each run
    makes its own item ids (``msg_…``, ``fc_…``, ``fco_…``), session (``prompt_cache_key``,
    ``client_metadata``), chunk ids and wall times, and names its workspace in its
    ``<environment_context>``, as Codex does; the call ids are the model's (the same)."""
    ws = f"/data/{run}-ws"
    labels = {"run_dir": f"/data/runs/{run}", "home": f"/data/runs/{run}/home", "workspace": ws}
    mode = "replay-only" if parent else "capture"
    w.create_run(Run(id=run, agent="codex", parent_run=parent, mode=mode, labels=labels))
    tool = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}
    items = [
        {"type": "message", "id": f"msg_{run}_0", "role": "developer",
         "content": [{"type": "input_text", "text": SYSTEM}]},
        {"type": "message", "id": f"msg_{run}_1", "role": "user",
         "content": [{"type": "input_text", "text": f"<environment_context>\n  <cwd>{ws}</cwd>\n"
                                                    "</environment_context>"}]},
        {"type": "message", "id": f"msg_{run}_2", "role": "user",
         "content": [{"type": "input_text", "text": "Make three files."}]},
    ]  # fmt: skip
    roles = {}
    for i, out in enumerate([None, *outputs]):
        if out is not None:
            items = [
                *items,
                {"type": "function_call", "id": f"fc_{run}_{i}", "call_id": f"call_{i}",
                 "name": "exec_command", "arguments": f'{{"cmd":"touch {i}.txt"}}'},
                {"type": "function_call_output", "id": f"fco_{run}_{i}", "call_id": f"call_{i}",
                 "output": f"Chunk ID: {abs(hash((run, i))) % 10**6:06x}\nWall time: 0.00{len(run)}{i} "
                           f"seconds\nProcess exited with code 0\nOutput:\n{out}\n"},
            ]  # fmt: skip
        body = {"model": "gpt-5-codex", "instructions": "You are Codex.", "input": items, "tools": [tool],
                "stream": True, "prompt_cache_key": f"session-{run}",
                "client_metadata": {"session_id": f"session-{run}", "turn_id": f"t-{run}-{i}"}}  # fmt: skip
        x = w.record_exchange(
            run, "POST", "/v1/responses", [], protocol="openai-responses", status=200,
            request_body=orjson.dumps(body), response_body=b"{}",
        )  # fmt: skip
        roles[x] = (1, "main")
    w.flush()
    w.set_exchange_roles(run, roles)


def test_a_faithful_codex_replay_differs_only_incidentally(tmp_path):
    """A faithful Codex replay was called a real parting at its first tool result: its item ids
    (``fco_…``) and its output's ``Chunk ID:`` and ``Wall time:`` are Codex's own in every run,
    which the replay itself ignores. Each such difference is incidental (``agent_ids``,
    ``decorations``, ``run_paths``), every step ``only_incidental``, no step a real parting; a
    changed output still is one, led with in the text form."""
    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        codex_run(w, "cx-capture", ["made 1", "made 2"])
        codex_run(w, "cx-replay", ["made 1", "made 2"], parent="cx-capture")
        codex_run(w, "cx-other", ["made 1", "made nothing"], parent="cx-capture")
    doc = diff_json(j, "cx-capture", "cx-replay")
    assert [s["verdict"] for s in doc["steps"]] == ["differs"] * 3
    assert all(s["only_incidental"] for s in doc["steps"]), doc["steps"]
    kinds = {(d["path"], d["kind"]) for s in doc["steps"] for d in s["differences"]}
    assert {
        ("messages[1].parts[0]", "run_paths"),  # the workspace in <environment_context>
        ("messages[4].parts[0]", "decorations"),  # fco_ id, Chunk ID:, Wall time:
        ("params.prompt_cache_key", "agent_ids"),
        ("params.client_metadata", "agent_ids"),
    } <= kinds, kinds
    assert all(d["incidental"] for s in doc["steps"] for d in s["differences"])
    assert all(s["cache"]["reusable_bytes"] < s["cache"]["prompt_bytes"] for s in doc["steps"][1:])
    summary = doc["summary"]
    assert (
        summary["only_incidental"],
        summary["first_parting_step"],
        summary["first_real_parting_step"],
    ) == (
        3,
        1,
        None,
    )
    lines = cli(j, "cx-capture", "cx-replay").stdout.splitlines()
    assert lines[1].startswith("step 2: differs only incidentally: the runs' own paths in message 1; ")
    assert "expected" not in lines[1]  # collapsed: no expected/got
    assert lines[-1].startswith("no real parting: every step that parts differs only incidentally; ")
    other = diff_json(j, "cx-capture", "cx-other")
    assert other["summary"]["first_real_parting_step"] == 3
    third = other["steps"][2]
    assert (third["structure"]["path"], third["structure"]["kind"], third["only_incidental"]) == (
        "messages[6].parts[0]",
        "real",
        False,
    )
    text = cli(j, "cx-capture", "cx-other").stdout.splitlines()
    assert text[2].startswith("step 3: differs: message 6 part 0: the tool result differs (expected ")
    assert text[-1].startswith("first real parting step: 3 (A ")


def test_two_claude_code_requests_lead_with_their_real_difference(tmp_path):
    """A Claude Code replay's request against its parent's named the system prompt's home path
    first, then the workspace, then ``metadata.user_id``, the changed tool result in the middle
    and, for two exchanges, on no line at all: each real difference has its ``where:`` line,
    first; the incidental ones one ``also:`` line, without expected and got."""
    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        anthropic_run(w, "cc-p", ["made 1", "made 2", "made 3"], session=True)
        anthropic_run(w, "cc-c", ["made 1", "made nothing", "made 3"], parent="cc-p", session=True)
    doc = diff_json(j, "cc-p", "cc-c")
    second = doc["steps"][2]
    assert second["structure"]["path"] == "messages[4].parts[0]" and second["structure"]["kind"] == "real"
    assert [d["kind"] for d in second["differences"]] == ["real", "run_paths", "agent_ids"]
    assert second["differences"][2]["path"] == "params.metadata.user_id"
    assert doc["steps"][0]["only_incidental"] is True and doc["summary"]["first_real_parting_step"] == 3
    lines = cli(j, "cc-p", "cc-c").stdout.splitlines()
    assert lines[0].startswith(
        "step 1: differs only incidentally: the runs' own paths in system[1]; metadata.user_id; "
    )
    assert lines[2].startswith("step 3: differs: message 4 part 0: the tool result differs (expected ")
    assert "; also: the runs' own paths in system[1]; metadata.user_id; bodies part at byte " in lines[2]
    p = cli(j, second["a"], second["b"])
    assert p.returncode == 1, p.stderr
    out = p.stdout.splitlines()
    assert out[1].startswith("where: message 4 part 0: the tool result differs (expected content: ")
    assert out[2] == "also: the runs' own paths in system[1]; metadata.user_id"
    assert out[3].startswith("cache: ")
