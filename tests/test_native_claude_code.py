"""Claude Code adapter (adapters/native/claude_code.py) on small files written here: steps built
on demand from the file (the same step every time, warnings all given while reading), another
agent's file refused, a response's calls in chain order, unknown records warned, lost lines
mended, progress lines kept compactly. (The 200 MB memory bound is measured by
bench/native_bench.py, figures in docs/benchmarks.md.)"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from pvisor.adapters.native import read_native
from pvisor.adapters.native.assembly import LazySteps, LeftOutLines
from pvisor.core.errors import BadInputError
from pvisor.journal.model import LeftOut
from test_native_adapters import _jsonl


def _cc(kind: str, uuid: str, parent: str | None, **kw) -> dict:
    rec = {
        "parentUuid": parent,
        "isSidechain": False,
        "cwd": "/w",
        "sessionId": "S",
        "version": "2.1.38",
        "type": kind,
        "uuid": uuid,
    }
    rec.update(kw)
    return rec


def _asst(uuid: str, parent: str, mid: str, block: dict) -> dict:
    return _cc(
        "assistant",
        uuid,
        parent,
        message={
            "id": mid,
            "role": "assistant",
            "model": "claude-x",
            "content": [block],
            "usage": {"output_tokens": 1},
        },
    )


def _call(uuid: str, parent: str, mid: str, call: str) -> dict:
    return _asst(
        uuid, parent, mid, {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": call}}
    )


def _result(uuid: str, parent: str, call: str, text: str) -> dict:
    return _cc(
        "user",
        uuid,
        parent,
        message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": text}]},
    )


def _user(uuid: str, parent: str | None, text: str, **kw) -> dict:
    return _cc("user", uuid, parent, message={"role": "user", "content": text}, **kw)


def _session(tmp_path: Path) -> Path:
    return _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "fix the bug"),
            _asst("a1", "u1", "m1", {"type": "text", "text": "Looking."}),
            _call("a2", "a1", "m1", "ls"),
            _call("a3", "a2", "m1", "never-answered"),
            _result("r1", "a3", "ls", "x.py"),
            _user("u2", "r1", "also add a test"),
            _asst("a4", "u2", "m2", {"type": "text", "text": "Done."}),
        ],
    )


def test_steps_are_built_from_the_file_on_demand_the_same_each_time_and_warn_only_while_reading(tmp_path):
    result, _ = read_native(_session(tmp_path), "claude-code")
    t = result.trajectory
    assert isinstance(t.steps, LazySteps) and len(t.steps) == 2
    assert result.diagnostics.codes() == ["interrupted"]
    first = list(t.steps)
    assert first == list(t.steps) and t.steps[0] == first[0] and t.steps[-1:] == first[-1:]
    s1, s2 = first
    assert s1.action.text == "Looking." and [c.id for c in s1.action.tool_calls] == ["ls", "never-answered"]
    assert [(r.call_id, r.content) for r in s1.observation.results] == [
        ("ls", "x.py"),
        ("never-answered", ""),
    ]
    assert s1.flags == ["interrupted"] and s1.action.usage == {"output_tokens": 1}
    assert [p.text for m in s1.observation.messages for p in m.parts] == ["also add a test"]
    assert s2.action.text == "Done." and t.task == "fix the bug" and t.model == "claude-x"
    # building the steps again gives no second warning
    assert result.diagnostics.codes() == ["interrupted"]


def test_calls_of_one_response_follow_the_chain_not_the_file_order(tmp_path):
    # the response's second line (call B, parent a1) is written before its first (call A)
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "go"),
            _call("a2", "a1", "m1", "B"),
            _call("a1", "u1", "m1", "A"),
            _result("r2", "a2", "B", "b"),
            _result("r1", "r2", "A", "a"),
        ],
    )
    result, _ = read_native(p, "claude-code")
    (step,) = result.trajectory.steps
    assert [c.id for c in step.action.tool_calls] == ["A", "B"]
    assert [r.call_id for r in step.observation.results] == ["A", "B"] and result.diagnostics.codes() == []


@pytest.mark.parametrize(
    "name,records",
    [
        (
            "codex rollout",
            [
                {"timestamp": "t", "type": "session_meta", "payload": {"id": "T", "cli_version": "0.171.0"}},
                {
                    "timestamp": "t",
                    "type": "response_item",
                    "payload": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}],
                    },
                },
            ],
        ),
        (
            "gemini cli",
            [
                {"sessionId": "G", "projectHash": "h", "startTime": "t", "kind": "main"},
                {"id": "u0", "type": "user", "content": [{"text": "hi"}]},
            ],
        ),
        (
            "qwen code",
            [
                {
                    "uuid": "q1",
                    "parentUuid": None,
                    "sessionId": "Q",
                    "type": "user",
                    "version": "0.24.4",
                    "message": {"role": "user", "parts": [{"text": "hi"}]},
                }
            ],
        ),
    ],
)
def test_another_agents_file_is_refused_naming_the_file_and_line(tmp_path, name, records):
    p = _jsonl(tmp_path / "other.jsonl", records)
    with pytest.raises(BadInputError) as exc:
        read_native(p, "claude-code")
    msg = exc.value.message
    assert (
        exc.value.exit_code == 65
        and str(p) in msg
        and "line 1" in msg
        and "no Claude Code session line" in msg
    ), msg
    assert "major" not in msg


def test_an_empty_file_is_refused(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    with pytest.raises(BadInputError) as exc:
        read_native(p, "claude-code")
    assert (
        exc.value.exit_code == 65
        and str(p) in exc.value.message
        and "no Claude Code session line" in exc.value.message
    )


def test_record_types_without_uuid_are_warned_unless_the_profile_knows_them(tmp_path):
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            {"type": "queue-operation", "operation": "enqueue", "sessionId": "S"},
            {"type": "file-history-snapshot", "messageId": "x", "snapshot": {}},
            {"type": "cost-state", "sessionId": "S", "totalCostUSD": 0},
            {"type": "brand-new-thing", "sessionId": "S"},
            _user("u1", None, "go"),
            _asst("a1", "u1", "m1", {"type": "text", "text": "ok"}),
            {"type": "last-prompt", "lastPrompt": "go", "leafUuid": "a1", "sessionId": "S"},
        ],
    )
    result, _ = read_native(p, "claude-code")
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("unknown_record", "line 4")]
    assert "brand-new-thing" in result.diagnostics.warnings[0].message
    assert [(lo.where, lo.kind) for lo in result.trajectory.left_out] == [
        ("line 1", "queue-operation"),
        ("line 2", "file-history-snapshot"),
        ("line 3", "cost-state"),
        ("line 4", "brand-new-thing"),
        ("line 7", "last-prompt"),
    ]
    assert len(result.trajectory.steps) == 1


# --------------------------------------------------------------------------- tester findings (H7)


def _four_steps(
    tmp_path: Path, *, lost: str | None = None, cut: str | None = None, parent_of: dict | None = None
) -> Path:
    """Four steps, a ``system`` line in the chain after the first result; ``lost`` drops the
    line with that uuid, ``cut`` cuts it to 30 bytes (not JSON), ``parent_of`` re-parents."""
    recs = [
        _user("u1", None, "go"),
        _call("a1", "u1", "m1", "c1"),
        _result("r1", "a1", "c1", "one"),
        _cc("system", "s1", "r1", subtype="turn_duration"),
        _call("a2", "s1", "m2", "c2"),
        _result("r2", "a2", "c2", "two"),
        _call("a3", "r2", "m3", "c3"),
        _result("r3", "a3", "c3", "three"),
        _asst("a4", "r3", "m4", {"type": "text", "text": "done"}),
    ]
    for r in recs:
        if parent_of and r["uuid"] in parent_of:
            r["parentUuid"] = parent_of[r["uuid"]]
    p = tmp_path / "s.jsonl"
    lines = [json.dumps(r) for r in recs if r["uuid"] != lost]
    lines = [ln[:30] if cut and f'"uuid": "{cut}"' in ln else ln for ln in lines]
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("damage", [{"cut": "s1"}, {"lost": "s1"}, {"parent_of": {"a2": "gone"}}])
def test_a_lost_or_damaged_middle_line_keeps_every_step_with_a_broken_chain_warning(tmp_path, damage):
    # finding 1: the deepest-leaf rule picked the older half of the split chain (2 steps of 4)
    result, _ = read_native(_four_steps(tmp_path, **damage), "claude-code")
    assert [s.action.text or s.action.tool_calls[0].id for s in result.trajectory.steps] == [
        "c1",
        "c2",
        "c3",
        "done",
    ]
    broken = [w for w in result.diagnostics.warnings if w.code == "broken_chain"]
    missing = "gone" if "parent_of" in damage else "s1"
    assert [(w.where, missing in w.message, "continued from line" in w.message) for w in broken] == [
        ("line 5" if "cut" in damage or "parent_of" in damage else "line 4", True, True)
    ]
    assert not [lo for lo in result.trajectory.left_out if lo.kind == "branch"]


def test_a_rewound_branch_whose_parent_exists_is_still_left_out(tmp_path):
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "go"),
            _asst("x1", "u1", "mx", {"type": "text", "text": "abandoned"}),
            _asst("a1", "u1", "m1", {"type": "text", "text": "kept"}),
            _user("u2", "a1", "more"),
            _asst("a2", "u2", "m2", {"type": "text", "text": "end"}),
        ],
    )
    result, _ = read_native(p, "claude-code")
    assert [s.action.text for s in result.trajectory.steps] == [
        "kept",
        "end",
    ] and result.diagnostics.codes() == []
    assert [(lo.where, lo.kind) for lo in result.trajectory.left_out] == [("line 2", "branch")]


def test_a_message_split_over_lines_takes_usage_from_its_last_line_in_chain_order_also_reversed(tmp_path):
    # finding 3: a reversed file (`tac`) took usage and stop_reason from the last line in file order
    def line(uuid, parent, block, out, stop):
        return _cc(
            "assistant",
            uuid,
            parent,
            message={
                "id": "m1",
                "role": "assistant",
                "content": [block],
                "usage": {"output_tokens": out},
                "stop_reason": stop,
            },
        )

    recs = [
        _user("u1", None, "go"),
        line("a1", "u1", {"type": "text", "text": "x"}, 1, None),
        line("a2", "a1", {"type": "text", "text": "y"}, 7, "end_turn"),
    ]
    for order in (recs, recs[::-1]):
        result, _ = read_native(_jsonl(tmp_path / "s.jsonl", order), "claude-code")
        (step,) = result.trajectory.steps
        assert (step.action.text, step.action.usage, step.action.stop_reason) == (
            "xy",
            {"output_tokens": 7},
            "end_turn",
        )


def test_duplicate_call_ids_are_warned_and_results_paired_in_order(tmp_path):
    # finding 4: both calls got the first result, the second result disappeared silently
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "go"),
            _call("a1", "u1", "m1", "dup"),
            _result("r1", "a1", "dup", "first"),
            _call("a2", "r1", "m2", "dup"),
            _result("r2", "a2", "dup", "second"),
        ],
    )
    result, _ = read_native(p, "claude-code")
    assert [[r.content for r in s.observation.results] for s in result.trajectory.steps] == [
        ["first"],
        ["second"],
    ]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_call_id", "line 4")]
    assert (
        "dup" in result.diagnostics.warnings[0].message
        and "base" not in result.diagnostics.warnings[0].message
    )


def test_a_malformed_record_among_good_ones_is_skipped_with_a_warning(tmp_path):
    # finding 5: one assistant line whose content is not a list was fatal for the whole file
    p = _jsonl(
        tmp_path / "s.jsonl",
        [
            _user("u1", None, "go"),
            _cc("assistant", "a1", "u1", message={"id": "m1", "role": "assistant", "content": "not a list"}),
            _asst("a2", "a1", "m2", {"type": "text", "text": "ok"}),
        ],
    )
    result, _ = read_native(p, "claude-code")
    assert [s.action.text for s in result.trajectory.steps] == ["ok"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("malformed_record", "line 2")]
    assert ("line 2", "assistant") in [(lo.where, lo.kind) for lo in result.trajectory.left_out]


def test_a_qwen_file_with_a_malformed_looking_line_is_refused_for_its_shape(tmp_path):
    # finding 5: the per-record message hid the "no Claude Code session line" one
    p = _jsonl(
        tmp_path / "q.jsonl",
        [
            {
                "uuid": "q1",
                "parentUuid": None,
                "sessionId": "Q",
                "type": "user",
                "version": "0.24.4",
                "message": {"role": "user", "parts": [{"text": "hi"}]},
            },
            {
                "uuid": "q2",
                "parentUuid": "q1",
                "sessionId": "Q",
                "type": "assistant",
                "version": "0.24.4",
                "message": {"role": "model", "parts": [{"text": "x"}]},
            },
        ],
    )
    with pytest.raises(BadInputError) as exc:
        read_native(p, "claude-code")
    assert exc.value.exit_code == 65 and "no Claude Code session line" in exc.value.message


def test_interrupted_names_the_line_of_the_unanswered_call(tmp_path):
    # finding 6: the warning named the message's first line, not the call's
    result, _ = read_native(_session(tmp_path), "claude-code")
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("interrupted", "line 4")]


def test_progress_lines_are_kept_compactly_and_left_out_reads_as_the_list(tmp_path):
    # finding 2: memory grew with lines (progress lines), not bytes; left_out is compact but
    # still the list of LeftOut(where, kind, reason)
    def uid(n: int) -> str:
        return f"{n:08x}-0000-4000-8000-000000000000"

    recs = [_user(uid(0), None, "go")]
    steps, per = 300, 100
    for s in range(steps):
        recs.append(_call(uid(1 + s * (per + 2)), recs[-1]["uuid"], f"m{s}", f"c{s}"))
        for k in range(per):
            recs.append(
                _cc("progress", uid(2 + s * (per + 2) + k), recs[-1]["uuid"], data={"type": "hook_progress"})
            )
        recs.append(_result(uid(2 + s * (per + 2) + per), recs[-1]["uuid"], f"c{s}", "ok"))
    p = _jsonl(tmp_path / "s.jsonl", recs)
    tracemalloc.start()
    try:
        result, _ = read_native(p, "claude-code")
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    t = result.trajectory
    assert len(t.steps) == steps and result.diagnostics.codes() == []
    assert isinstance(t.left_out, LeftOutLines) and len(t.left_out) == steps * per
    assert t.left_out[0] == LeftOut("line 3", "progress/hook_progress", "UI-only record in the chain")
    assert list(t.left_out) == t.left_out and t.left_out[-1:] == [
        LeftOut(f"line {len(recs) - 1}", "progress/hook_progress", "UI-only record in the chain")
    ]
    # was some 500 bytes a line (a record object, a LeftOut of three strings, uuid strings)
    assert kept / len(recs) < 220, kept / len(recs)


def test_a_lost_line_in_a_reversed_file_makes_no_cycle(tmp_path):
    # mending to the line before would make a2 follow its own child r2: a2 starts the chain instead
    p = _four_steps(tmp_path, lost="s1")
    p.write_text("\n".join(reversed(p.read_text().splitlines())) + "\n")
    result, _ = read_native(p, "claude-code")
    assert [s.action.text or s.action.tool_calls[0].id for s in result.trajectory.steps] == [
        "c2",
        "c3",
        "done",
    ]
    (w,) = [w for w in result.diagnostics.warnings if w.code == "broken_chain"]
    assert "s1" in w.message and "the chain starts there" in w.message


REAL = Path(__file__).resolve().parent / "corpus" / "native" / "claude-code" / "spotter_tool_heavy.jsonl"


def _with_signature(tmp_path: Path, name: str, change) -> tuple[Path, str]:
    """The real session with its thinking block's signature changed by ``change(block)``;
    returns (file, the original signature)."""
    lines = [json.loads(line) for line in REAL.read_text().splitlines() if line.strip()]
    original = None
    for rec in lines:
        content = (rec.get("message") or {}).get("content")
        for b in content if isinstance(content, list) else []:
            if isinstance(b, dict) and b.get("type") == "thinking":
                original = b["signature"]
                change(b)
    assert original, "the session has a signed thinking block"
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    return path, original


@pytest.mark.parametrize(
    "name,change,flag,sent",
    [
        ("empty", lambda b: b.update(signature=""), "thinking_signature_empty", ""),
        ("cut", lambda b: b.update(signature=b["signature"][:-5]), "thinking_signature_incomplete", "cut"),
        ("missing", lambda b: b.pop("signature"), "thinking_signature_missing", None),
        ("intact", lambda b: None, None, "intact"),
    ],
)
def test_thinking_signatures_are_passed_on_as_recorded_and_flagged_when_the_api_would_refuse_them(
    tmp_path, name, change, flag, sent
):
    from pvisor.replay.prepare import PrepareOptions, prepare_only

    path, original = _with_signature(tmp_path, name, change)
    res, _ = read_native(path, "claude-code")
    [step] = [s for s in res.trajectory.steps if s.action.reasoning]
    flags = [f for f in step.flags if f.startswith("thinking_signature")]
    assert flags == ([flag] if flag else [])
    out = tmp_path / f"out-{name}"
    outcome = prepare_only(
        PrepareOptions(agent="claude-code", after_step=step.n, output=out, trajectory=path)
    )
    warned = [w for w in outcome.result["warnings"] if w["code"].startswith("thinking_signature")]
    assert warned == ([{"code": flag, "message": f"step {step.n}: {flag.replace('_', ' ')}"}] if flag else [])
    body = json.loads((out / "prefix.json").read_text())
    [block] = [
        b
        for m in body["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "thinking"
    ]
    # never changed without a mark: the signature goes out as the file holds it
    expected = {"": "", "cut": original[:-5], None: None, "intact": original}[sent]
    assert block.get("signature") == expected and ("signature" in block) == (expected is not None)


def _real_records() -> list[dict]:
    return [json.loads(line) for line in REAL.read_text().splitlines() if line.strip()]


def _write(tmp_path: Path, name: str, records: list[dict]) -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _shape(path: Path) -> tuple[list, list[str]]:
    res, _ = read_native(path, "claude-code")
    steps = [(s.n, [c.id for c in s.action.tool_calls]) for s in res.trajectory.steps]
    return steps, [w.code for w in res.diagnostics.warnings]


def test_a_deeper_branch_of_subagent_progress_records_never_wins_the_leaf(tmp_path):
    # no last-prompt record to point at the leaf: the chain alone decides
    records = [r for r in _real_records() if r.get("type") not in ("last-prompt", "summary")]
    steps, warnings = _shape(_write(tmp_path, "plain", records))
    first_reply = next(r for r in records if r.get("type") == "assistant")
    parent, extra = first_reply["uuid"], []
    for k in range(300):  # a subagent's progress, not marked isSidechain, far deeper than the main thread
        uuid = f"00000000-0000-4000-8000-{k:012d}"
        extra.append(
            {
                "type": "progress",
                "uuid": uuid,
                "parentUuid": parent,
                "sessionId": first_reply["sessionId"],
                "data": {"type": "agent_progress", "message": {"type": "assistant"}},
                "isSidechain": False,
            }
        )
        parent = uuid
    got, got_warnings = _shape(_write(tmp_path, "deep-progress", records + extra))
    assert len(steps) > 1 and got == steps  # the main thread's steps, all of them
    assert got_warnings == warnings


def test_two_conversation_branches_the_longer_is_the_session_and_the_choice_is_said(tmp_path):
    records = [r for r in _real_records() if r.get("type") not in ("last-prompt", "summary")]
    steps, _ = _shape(_write(tmp_path, "plain", records))
    first_reply = next(r for r in records if r.get("type") == "assistant")
    base = {
        "sessionId": first_reply["sessionId"],
        "version": first_reply.get("version"),
        "cwd": first_reply.get("cwd"),
    }
    # a rewound prompt: another question after the first reply, answered, then abandoned
    rewind = [
        {
            **base,
            "type": "user",
            "uuid": "00000000-0000-4000-9000-000000000001",
            "parentUuid": first_reply["uuid"],
            "message": {"role": "user", "content": "Actually, do something else."},
        },
        {
            **base,
            "type": "assistant",
            "uuid": "00000000-0000-4000-9000-000000000002",
            "parentUuid": "00000000-0000-4000-9000-000000000001",
            "message": {
                "id": "msg_rewound",
                "role": "assistant",
                "model": first_reply["message"].get("model"),
                "content": [{"type": "text", "text": "Sure."}],
                "stop_reason": "end_turn",
            },
        },
    ]
    path = _write(tmp_path, "rewound", records + rewind)
    got, _ = _shape(path)
    assert got == steps
    res, _ = read_native(path, "claude-code")
    [lo] = [lo for lo in res.trajectory.left_out if lo.kind == "branch"]
    assert lo.where == f"line {len(records) + 2}" and "msg_rewound" in lo.reason
    assert "the session is the chain ending at line" in lo.reason


def test_a_lost_line_inside_a_reply_over_several_lines_flags_the_step_of_that_reply(tmp_path):
    # spotter_short.jsonl: step 1's reply (message msg_01MKH1...) is written over lines 5-8 and
    # 10; without line 7 (one of its parts) line 8 names a parent the file no longer holds and is
    # bridged to line 6. Line 8 is a later line of the same reply, so its step is step 1
    lines = (REAL.parent / "spotter_short.jsonl").read_text().splitlines(keepends=True)
    mid = json.loads(lines[6])["message"]["id"]
    assert [json.loads(ln).get("message", {}).get("id") for ln in lines[4:8]] == [mid] * 4
    p = tmp_path / "lost7.jsonl"
    p.write_text("".join(lines[:6] + lines[7:]))
    result, _ = read_native(p, "claude-code")
    assert [(w.code, w.where) for w in result.diagnostics.warnings if w.code == "broken_chain"] == [
        ("broken_chain", "line 7")  # the bridged line (line 8 before) as the damaged file numbers it
    ]
    [step] = result.trajectory.steps
    assert "broken_chain" in step.flags
