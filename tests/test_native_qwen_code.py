"""Qwen Code adapter (adapters/native/qwen_code.py) on small files written here: steps built on
demand from the file, records written out of file order, another agent's file refused by shape
(before its version), unknown records warned. (The 200 MB memory bound is measured by
bench/native_bench.py, figures in docs/benchmarks.md.)"""

from __future__ import annotations

import json

import pytest

from native_helpers import native_dir
from pvisor.adapters.native import read_native
from pvisor.adapters.native.assembly import LazySteps
from pvisor.core.errors import BadInputError
from test_native_adapters import _jsonl, _q


def _call(uuid: str, parent: str, call: str, text: str = "") -> dict:
    return _q(
        "assistant",
        uuid,
        parent,
        [
            {"text": text},
            {"functionCall": {"id": call, "name": "run_shell_command", "args": {"command": call}}},
        ],
        model="qwen-x",
    )


def _result(uuid: str, parent: str, call: str, out: str) -> dict:
    return _q(
        "tool_result",
        uuid,
        parent,
        [{"functionResponse": {"id": call, "name": "run_shell_command", "response": {"output": out}}}],
    )


def test_steps_are_built_on_demand_the_same_each_time_and_warn_only_while_reading(tmp_path):
    p = _jsonl(
        tmp_path / "q.jsonl",
        [
            _q("user", "u1", None, [{"text": "go"}]),
            _call("a1", "u1", "c1", "first"),
            _q("system", "s1", "a1", subtype="ui_telemetry", systemPayload={"x": 1}),
            _result("t1", "s1", "c1", "ok"),
            _q("system", "s2", "t1", subtype="chat_compression"),
            _q("user", "u2", "s2", [{"text": "more"}]),
            _call("a2", "u2", "c2"),
        ],
    )
    result, _ = read_native(p, "qwen-code")
    t = result.trajectory
    assert isinstance(t.steps, LazySteps) and len(t.steps) == 2
    assert result.diagnostics.codes() == ["interrupted"] and result.diagnostics.warnings[0].where == "step 2"
    first = list(t.steps)
    assert first == list(t.steps)
    s1, s2 = first
    assert s1.action.text == "first" and [(r.call_id, r.content) for r in s1.observation.results] == [
        ("c1", {"output": "ok"})
    ]
    assert s1.flags == ["compaction"] and [p.text for m in s1.observation.messages for p in m.parts] == [
        "more"
    ]
    assert s2.flags == ["interrupted"] and s2.observation.results[0].raw == {"interrupted": True}
    assert t.task == "go" and t.model == "qwen-x" and t.meta["compactions"] == [{"step": 1, "line": 5}]
    assert result.diagnostics.codes() == ["interrupted"]


def test_records_written_out_of_file_order_keep_every_step(tmp_path):
    # the last record in the file is the first step's: the chain, not the file, says the order
    p = _jsonl(
        tmp_path / "q.jsonl",
        [
            _q("user", "u1", None, [{"text": "go"}]),
            _result("t1", "a1", "c1", "one"),
            _call("a2", "t1", "c2"),
            _result("t2", "a2", "c2", "two"),
            _q("assistant", "a3", "t2", [{"text": "done"}], model="qwen-x"),
            _q("system", "s9", "a3", subtype="ui_telemetry"),
            _call("a1", "u1", "c1"),
        ],
    )
    result, _ = read_native(p, "qwen-code")
    steps = list(result.trajectory.steps)
    assert [[c.id for c in s.action.tool_calls] for s in steps] == [["c1"], ["c2"], []]
    assert [s.action.text for s in steps] == ["", "", "done"]
    assert result.diagnostics.codes() == [] and [lo.reason for lo in result.trajectory.left_out] == [
        "off the main chain (an abandoned branch or rewind)"
    ]


def test_claude_code_file_is_refused_by_shape_not_by_version(tmp_path):
    p = _jsonl(
        tmp_path / "claude.jsonl",
        [
            {
                "parentUuid": None,
                "isSidechain": False,
                "type": "user",
                "uuid": "u1",
                "sessionId": "S",
                "version": "2.1.38",
                "message": {"role": "user", "content": "hi"},
            },
            {
                "parentUuid": "u1",
                "isSidechain": False,
                "type": "assistant",
                "uuid": "a1",
                "sessionId": "S",
                "version": "2.1.38",
                "message": {"id": "m1", "role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            },
        ],
    )
    with pytest.raises(BadInputError) as exc:
        read_native(p, "qwen-code")
    msg = exc.value.message
    assert (
        exc.value.exit_code == 65
        and str(p) in msg
        and "line 1" in msg
        and "no Qwen Code chat record" in msg
        and "major" not in msg
    ), msg


@pytest.mark.parametrize(
    "text",
    ["", '{"timestamp": "t", "type": "session_meta", "payload": {"id": "T", "cli_version": "0.171.0"}}\n'],
)
def test_an_empty_file_or_a_codex_rollout_is_refused(tmp_path, text):
    p = tmp_path / "x.jsonl"
    p.write_text(text)
    with pytest.raises(BadInputError) as exc:
        read_native(p, "qwen-code")
    assert (
        exc.value.exit_code == 65
        and str(p) in exc.value.message
        and "no Qwen Code chat record" in exc.value.message
    )


def test_unknown_records_are_warned_with_or_without_uuid(tmp_path):
    p = _jsonl(
        tmp_path / "q.jsonl",
        [
            {"type": "mystery", "sessionId": "Q"},
            _q("user", "u1", None, [{"text": "go"}]),
            _q("hologram", "h1", "u1"),
            _q("assistant", "a1", "h1", [{"text": "ok"}], model="qwen-x"),
        ],
    )
    result, _ = read_native(p, "qwen-code")
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("unknown_record", "line 1"),
        ("unknown_record", "line 3"),
    ]
    assert [s.action.text for s in result.trajectory.steps] == ["ok"]


# --------------------------------------------------------------------------- tester findings (H7)


def _three_steps() -> list[dict]:
    return [
        _q("user", "u1", None, [{"text": "go"}]),
        _call("a1", "u1", "c1"),
        _q("system", "s1", "a1", subtype="ui_telemetry"),
        _result("t1", "s1", "c1", "one"),
        _call("a2", "t1", "c2"),
        _q("system", "s2", "a2", subtype="ui_telemetry"),
        _result("t2", "s2", "c2", "two"),
        _q("assistant", "a3", "t2", [{"text": "done"}], model="qwen-x"),
    ]


def test_a_lost_middle_record_keeps_every_step_with_a_broken_chain_warning(tmp_path):
    # finding 1: deleting one ui_telemetry record gave 1 step of 3, no warning
    recs = [r for r in _three_steps() if r["uuid"] != "s2"]
    result, _ = read_native(_jsonl(tmp_path / "q.jsonl", recs), "qwen-code")
    assert [s.action.text for s in result.trajectory.steps] == ["", "", "done"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("broken_chain", "line 6")]
    assert (
        "s2" in result.diagnostics.warnings[0].message
        and "continued from line 5" in result.diagnostics.warnings[0].message
    )
    assert not [lo for lo in result.trajectory.left_out if "off the main chain" in lo.reason]


def test_an_abandoned_branch_whose_parent_exists_is_still_left_out(tmp_path):
    recs = _three_steps()
    recs.insert(2, _call("x1", "u1", "cx", "abandoned"))
    result, _ = read_native(_jsonl(tmp_path / "q.jsonl", recs), "qwen-code")
    assert len(result.trajectory.steps) == 3 and result.diagnostics.codes() == []
    assert [
        (lo.where, lo.reason) for lo in result.trajectory.left_out if "off the main chain" in lo.reason
    ] == [("line 3", "off the main chain (an abandoned branch or rewind)")]


def test_duplicate_call_ids_are_warned_and_results_paired_in_order(tmp_path):
    # finding 4: two calls with one id in a response; the first result was lost
    recs = [
        _q("user", "u1", None, [{"text": "go"}]),
        _q(
            "assistant",
            "a1",
            "u1",
            [
                {"functionCall": {"id": "d", "name": "run_shell_command", "args": {"command": "one"}}},
                {"functionCall": {"id": "d", "name": "run_shell_command", "args": {"command": "two"}}},
            ],
            model="qwen-x",
        ),
        _result("t1", "a1", "d", "first"),
        _result("t2", "t1", "d", "second"),
    ]
    result, _ = read_native(_jsonl(tmp_path / "q.jsonl", recs), "qwen-code")
    (step,) = result.trajectory.steps
    assert [r.content for r in step.observation.results] == [
        {"output": "first"},
        {"output": "second"},
    ] and step.flags == []
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_call_id", "line 2")]


def test_a_malformed_record_among_good_ones_is_skipped_with_a_warning(tmp_path):
    # finding 5: one record without a `message` was fatal for the whole file
    recs = _three_steps()
    del recs[4]["message"]  # a2
    result, _ = read_native(_jsonl(tmp_path / "q.jsonl", recs), "qwen-code")
    # the lost reply is a gap at its step (issue 14, damaged files): its result answers no call
    steps = list(result.trajectory.steps)
    assert [s.action.text for s in steps] == ["", "", "done"] and steps[1].flags == ["lost_action"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("malformed_record", "line 5"),
        ("lost_action", "line 7"),
    ]
    assert ("line 5", "malformed") in [(lo.where, lo.kind) for lo in result.trajectory.left_out]


def test_a_lost_record_in_a_reversed_file_makes_no_cycle(tmp_path):
    recs = [r for r in _three_steps() if r["uuid"] != "s2"][::-1]
    result, _ = read_native(_jsonl(tmp_path / "q.jsonl", recs), "qwen-code")
    # t2 cannot follow a3 (its own child): it starts a chain of 2; the deeper one (a1, a2) is read
    assert [s.action.text for s in result.trajectory.steps] == ["", ""]
    (w,) = [w for w in result.diagnostics.warnings if w.code == "broken_chain"]
    assert w.code == "broken_chain" and "s2" in w.message and "the chain starts there" in w.message


def test_the_step_that_takes_a_record_whose_parent_is_lost_is_flagged_broken_chain(tmp_path):
    """The real 0.24.4 run (tests/corpus/native/qwen-code, PROVENANCE.md) with line 7 lost: the
    assistant record after it (step 2's action, now line 7) names a parent the file no longer
    holds, and the reader bridges it to line 6. The warning named the line, but no step said
    where the gap is; a view's ``damage`` shows the step's flag."""
    lines = (native_dir() / "qwen-code" / "real-0.24.4_single.jsonl").read_text().splitlines(keepends=True)
    assert json.loads(lines[7])["type"] == "assistant"
    p = tmp_path / "lost7.jsonl"
    p.write_text("".join(lines[:6] + lines[7:]))
    result, _ = read_native(p, "qwen-code")
    assert [s.flags for s in result.trajectory.steps] == [[], ["broken_chain"], []]
    [w] = [w for w in result.diagnostics.warnings if w.code == "broken_chain"]
    assert w.where == "line 7"
