"""Codex rollout adapter (adapters/native/codex.py) on small rollouts written here: a file of
another agent refused, duplicated lines, a late call output, file order kept, and memory
bounded on a large rollout (steps built from the file on demand)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from native_helpers import native_dir, refused
from pvisor.adapters.native import read_native
from pvisor.adapters.native.assembly import LazySteps
from pvisor.core.errors import BadInputError
from test_native_robustness import _mutate  # the mutations of the read-only robustness test

HEAD = [
    {
        "timestamp": "2026-01-01T00:00:05Z",
        "type": "session_meta",
        "payload": {"id": "T", "cli_version": "0.171.0"},
    },
    {
        "timestamp": "2026-01-01T00:00:05Z",
        "type": "response_item",
        "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "do it"}]},
    },
]


def _rl(kind: str, payload: dict, ts: str = "2026-01-01T00:00:05Z") -> dict:
    return {"timestamp": ts, "type": kind, "payload": payload}


def _call(cid: str, cmd: str) -> dict:
    return _rl(
        "response_item",
        {
            "type": "function_call",
            "name": "exec_command",
            "arguments": json.dumps({"cmd": cmd}),
            "call_id": cid,
        },
    )


def _out(cid: str, text: str) -> dict:
    return _rl("response_item", {"type": "function_call_output", "call_id": cid, "output": text})


def _say(text: str) -> dict:
    return _rl(
        "response_item",
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
    )


USAGE = _rl("event_msg", {"type": "token_count", "info": {"last_token_usage": {"total_tokens": 5}}})


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_claude_code_session_given_as_codex_is_refused_naming_the_file_and_line(tmp_path):
    p = _write(
        tmp_path / "session.jsonl",
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
                "message": {"id": "m", "role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            },
        ],
    )
    assert refused(p, "codex") == (
        f"{p}: line 1: required record shape missing: "
        "no Codex rollout record (type session_meta/response_item) "
        "in the file; the first record has type 'user'"
    )


@pytest.mark.parametrize("content", [b"", b"\n\n", b"{not json\n"])
def test_an_empty_file_given_as_codex_is_refused_naming_the_file(tmp_path, content):
    p = tmp_path / "empty.jsonl"
    p.write_bytes(content)
    assert (
        refused(p, "codex")
        == f"{p}: required record shape missing: no Codex rollout record (type session_meta/response_item) "
        "in the file (no JSON object in it)"
    )


def test_a_rollout_with_only_its_session_meta_is_read_with_no_steps(tmp_path):
    result, _ = read_native(_write(tmp_path / "rollout.jsonl", HEAD[:1]), "codex")
    assert len(result.trajectory.steps) == 0 and result.diagnostics.codes() == []


def test_duplicated_lines_are_read_once_with_a_duplicate_record_warning(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD
        + [
            _say("Listing."),
            _say("Listing."),  # the same assistant message line twice
            _call("c1", "ls"),
            _call("c1", "ls"),
            USAGE,
            _out("c1", "a.txt"),
            _out("c1", "a.txt"),
            _say("done"),
            USAGE,
        ],
    )
    result, _ = read_native(p, "codex")
    t = result.trajectory
    assert [s.action.text for s in t.steps] == ["Listing.", "done"]
    [s1, _s2] = t.steps
    assert [c.id for c in s1.action.tool_calls] == ["c1"] and [
        (r.call_id, r.content) for r in s1.observation.results
    ] == [("c1", "a.txt")]
    assert s1.flags == []
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("duplicate_record", "line 4"),
        ("duplicate_record", "line 6"),
        ("duplicate_record", "line 9"),
    ]
    assert "function_call c1 repeats an earlier line exactly" in result.diagnostics.warnings[1].message
    assert [lo.where for lo in t.left_out if lo.kind == "duplicate"] == ["line 4", "line 6", "line 9"]


def test_a_response_written_twice_is_read_once(tmp_path):
    block = [
        _rl("response_item", {"type": "reasoning", "summary": [], "encrypted_content": "ENC"}),
        _say("Checking."),
        _call("c1", "ls"),
    ]
    result, _ = read_native(
        _write(tmp_path / "rollout.jsonl", HEAD + block + block + [USAGE, _out("c1", "a")]), "codex"
    )
    [s] = result.trajectory.steps
    assert (
        s.action.text == "Checking."
        and len(s.action.reasoning) == 1
        and [c.id for c in s.action.tool_calls] == ["c1"]
    )
    assert result.diagnostics.codes() == ["duplicate_record"] * 3 and s.flags == []


def test_a_repeated_call_id_with_other_content_is_not_a_duplicate(tmp_path):
    # two distinct calls that happen to share an id (ids trimmed in a fixture): both kept
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD + [_call("c1", "ls"), USAGE, _out("c1", "a"), _call("c1", "pwd"), USAGE, _out("c1", "/w")],
    )
    result, _ = read_native(p, "codex")
    steps = result.trajectory.steps
    assert [[c.arguments for c in s.action.tool_calls] for s in steps] == [[{"cmd": "ls"}], [{"cmd": "pwd"}]]
    assert [[r.content for r in s.observation.results] for s in steps] == [["a"], ["/w"]]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_call_id", "line 6")]


def test_two_calls_sharing_an_id_in_one_action_each_get_their_output_in_order(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD + [_call("c1", "ls"), _call("c1", "pwd"), USAGE, _out("c1", "a.txt"), _out("c1", "/w")],
    )
    result, _ = read_native(p, "codex")
    [s] = result.trajectory.steps
    assert [c.arguments for c in s.action.tool_calls] == [{"cmd": "ls"}, {"cmd": "pwd"}]
    assert [(r.call_id, r.content) for r in s.observation.results] == [
        ("c1", "a.txt"),
        ("c1", "/w"),
    ] and s.flags == []
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_call_id", "line 4")]
    assert "shares its id with the call at line 3" in result.diagnostics.warnings[0].message


def test_two_calls_sharing_an_id_with_equal_outputs_both_get_one(tmp_path):
    # the second output equals the first but answers the second call: not a line written twice
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD
        + [_call("c1", "touch a"), USAGE, _out("c1", "ok"), _call("c1", "touch b"), USAGE, _out("c1", "ok")],
    )
    result, _ = read_native(p, "codex")
    steps = result.trajectory.steps
    assert [[(r.call_id, r.content) for r in s.observation.results] for s in steps] == [
        [("c1", "ok")],
        [("c1", "ok")],
    ]
    assert [s.flags for s in steps] == [[], []] and result.diagnostics.codes() == ["duplicate_call_id"]


def test_outputs_of_calls_sharing_an_id_across_actions_pair_in_order_of_appearance(tmp_path):
    # both calls made before either output (the first output late): the first output answers the first call
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD
        + [
            _call("c1", "sleep 5"),
            USAGE,
            _say("meanwhile"),
            _call("c1", "ls"),
            USAGE,
            _out("c1", "slept"),
            _out("c1", "a.txt"),
        ],
    )
    result, _ = read_native(p, "codex")
    s1, s2 = result.trajectory.steps
    assert [(r.call_id, r.content) for r in s1.observation.results] == [("c1", "slept")]
    assert [(r.call_id, r.content) for r in s2.observation.results] == [("c1", "a.txt")]
    assert s1.flags == s2.flags == [] and result.diagnostics.codes() == ["duplicate_call_id"]


def test_a_second_output_for_an_answered_call_is_kept_with_a_warning(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl", HEAD + [_call("c1", "ls"), USAGE, _out("c1", "a"), _out("c1", "b")]
    )
    result, _ = read_native(p, "codex")
    [s] = result.trajectory.steps
    assert [(r.call_id, r.content) for r in s.observation.results] == [
        ("c1", "a"),
        ("c1", "b"),
    ] and s.flags == []
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_call_id", "line 6")]


def test_a_damaged_record_is_skipped_with_a_warning_and_the_rest_read(tmp_path):
    # a byte flip turned the key "payload" into "paylo\ufffdd" on one line (the tester's file, line 16)
    damaged = _call("c2", "pwd")
    damaged["paylo\ufffdd"] = damaged.pop("payload")
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD + [_call("c1", "ls"), USAGE, _out("c1", "a"), damaged, USAGE, _say("done"), USAGE],
    )
    result, _ = read_native(p, "codex")
    t = result.trajectory
    assert [s.action.text for s in t.steps] == ["", "done"] and [
        (r.call_id, r.content) for r in t.steps[0].observation.results
    ] == [("c1", "a")]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("malformed_record", "line 6")]
    assert "response_item without a typed payload" in result.diagnostics.warnings[0].message
    assert [lo.where for lo in t.left_out if lo.kind == "malformed"] == ["line 6"]


def test_a_damaged_session_meta_is_skipped_and_the_version_reads_as_missing(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl",
        [{"timestamp": "t", "type": "session_meta", "paylod": {"cli_version": "0.171.0"}}]
        + HEAD[1:]
        + [_say("hi"), USAGE],
    )
    result, _ = read_native(p, "codex")
    assert [s.action.text for s in result.trajectory.steps] == ["hi"] and result.trajectory.task == "do it"
    assert result.diagnostics.codes() == ["malformed_record", "no_version"]


def test_a_file_of_damaged_records_only_is_refused(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl",
        [{"timestamp": "t", "type": "response_item", "paylod": {"type": "message"}}] * 2,
    )
    assert refused(p, "codex") == (
        f"{p}: line 1: required record shape missing: "
        "no Codex rollout record (type session_meta/response_item) "
        "in the file; the first record has type 'response_item'"
    )


def test_a_rollout_starting_with_a_bom_keeps_its_session_meta(tmp_path):
    head = [
        {**HEAD[0], "payload": {**HEAD[0]["payload"], "base_instructions": {"text": "You are Codex."}}}
    ] + HEAD[1:]
    p = tmp_path / "rollout.jsonl"
    p.write_bytes(
        b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in head + [_say("hi"), USAGE]).encode()
    )
    result, _ = read_native(p, "codex")
    t = result.trajectory
    assert t.meta["cli_version"] == "0.171.0" and t.meta["id"] == "T" and t.system == "You are Codex."
    assert [s.action.text for s in t.steps] == ["hi"] and result.diagnostics.codes() == []


def test_a_late_output_belongs_to_the_step_whose_action_made_the_call(tmp_path):
    # c1's output is written after the next action's lines (the schema-coverage fixture, line 21)
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD
        + [
            _call("c1", "sleep 5"),
            _call("c2", "ls"),
            USAGE,
            _out("c2", "a.txt"),
            _say("waiting"),
            _call("c3", "pwd"),
            USAGE,
            _out("c1", "slept"),
            _out("c3", "/w"),
        ],
    )
    result, _ = read_native(p, "codex")
    s1, s2 = result.trajectory.steps
    assert [(r.call_id, r.content) for r in s1.observation.results] == [("c1", "slept"), ("c2", "a.txt")]
    assert [(r.call_id, r.content) for r in s2.observation.results] == [("c3", "/w")]
    assert s1.flags == s2.flags == [] and result.diagnostics.codes() == []


def test_an_output_for_no_call_is_a_gap_step_where_the_lost_action_was(tmp_path):
    # issue 14, damaged files: the line of the call was lost; the later steps keep their numbers
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD + [_call("c1", "ls"), USAGE, _out("c1", "a"), _out("zz", "stray"), _say("after"), USAGE],
    )
    result, _ = read_native(p, "codex")
    s1, gap, s3 = result.trajectory.steps
    assert [r.call_id for r in s1.observation.results] == ["c1"]
    assert (gap.n, gap.flags, gap.action.tool_calls, [r.call_id for r in gap.observation.results]) == (
        2,
        ["lost_action"],
        [],
        ["zz"],
    )
    assert (s3.n, s3.action.text) == (3, "after")
    [w] = [w for w in result.diagnostics.warnings if w.code == "lost_action"]
    assert w.where == f"line {len(HEAD) + 4}" and "step 2" in w.message


def test_file_order_is_kept_when_timestamps_go_backwards(tmp_path):
    # Codex stores no chain: the file position is the ordinal; timestamps never reorder, no warning
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD
        + [
            {**_say("first"), "timestamp": "2026-01-01T00:00:09Z"},
            USAGE,
            _rl(
                "response_item",
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
                ts="2026-01-01T00:00:01Z",
            ),
            {**_say("second"), "timestamp": "2026-01-01T00:00:00Z"},
            USAGE,
        ],
    )
    result, _ = read_native(p, "codex")
    assert [s.action.text for s in result.trajectory.steps] == ["first", "second"]
    assert result.diagnostics.codes() == []


def test_steps_are_built_from_the_file_on_demand_and_equal_each_time(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl",
        HEAD
        + [
            _say("x"),
            _call("c1", "ls"),
            USAGE,
            _out("c1", "a"),
            _rl(
                "response_item",
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]},
            ),
            _call("c2", "pwd"),
            USAGE,
        ],
    )
    result, _ = read_native(p, "codex")
    steps = result.trajectory.steps
    assert isinstance(steps, LazySteps) and list(steps) == list(steps) and steps[1] == list(steps)[1]
    assert steps[0].action.usage == {"total_tokens": 5} and [
        m.parts[0].text for m in steps[0].observation.messages
    ] == ["more"]
    # the warning is given while reading, once, however often the steps are built
    assert steps[1].flags == ["interrupted"] and result.diagnostics.codes() == ["interrupted"]


def assert_mutated_samples_build(agent: str, tmp_path: Path) -> None:
    """Corpus samples of ``agent`` with values of the wrong type (fixed seed): each is read or
    refused (BadInputError), and every step of what is read builds (steps are built after
    reading, so a crash there would escape tests that only read)."""
    rng = random.Random(f"pvisor-build-{agent}")
    built = 0
    for f in sorted((native_dir() / agent).glob("*.jsonl")):
        lines = [json.loads(line) for line in f.read_bytes().split(b"\n") if line.strip()]
        for trial in range(12):
            g = tmp_path / f"{trial}-{f.name}"
            g.write_text("".join(json.dumps(_mutate(x, rng)) + "\n" for x in lines))
            try:
                result, _ = read_native(g, agent)
            except BadInputError:
                continue
            built += sum(1 for _ in result.trajectory.steps)
    assert built > 0


def test_mutated_rollouts_build_every_step(tmp_path):
    assert_mutated_samples_build("codex", tmp_path)


#: a real Codex 0.171.0 session (tests/corpus/native/codex, PROVENANCE.md): step 1's
#: exec_command call, its item_completed event (line 12) and its function_call_output (line 13)
REAL = "real-0.171.0_single-then-resume.jsonl"
CALL_ID = "call_27da53b96e05470b"


def _real_lines() -> list[dict]:
    return [json.loads(x) for x in (native_dir() / "codex" / REAL).read_text().splitlines() if x.strip()]


def _as_exec_command_end(line: dict) -> dict:
    """Line 12's item_completed event rewritten as the exec_command_end event older builds write
    (the 0.146.0 schema-coverage fixture's shape, line 56), with the recorded values."""
    item = line["payload"]["item"]
    keep = ("command", "cwd", "parsed_cmd", "aggregated_output", "exit_code", "duration", "status")
    payload = {"type": "exec_command_end", "call_id": item["id"], **{k: item[k] for k in keep}}
    return {**line, "payload": payload}


@pytest.mark.parametrize("event", ["item_completed", "exec_command_end"])
def test_a_call_whose_output_is_only_in_its_end_event_completed_with_that_output(event, tmp_path):
    lines = _real_lines()
    assert lines[12]["payload"]["call_id"] == CALL_ID  # line 13: the function_call_output, lost
    del lines[12]
    if event == "exec_command_end":
        lines[11] = _as_exec_command_end(lines[11])
    p = tmp_path / REAL
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result, _ = read_native(p, "codex")
    step = result.trajectory.steps[0]
    assert "interrupted" not in step.flags
    [r] = step.observation.results
    assert (r.call_id, r.content) == (CALL_ID, "out.txt\n")
    [w] = [w for w in result.diagnostics.warnings if w.code == "output_from_event"]
    assert w.where == "line 12" and CALL_ID in w.message and "sha256 " in w.message
    assert "interrupted" not in result.diagnostics.codes()
    assert "line 12" not in [x.where for x in result.trajectory.left_out]  # read, not left out


def test_an_end_event_whose_output_disagrees_with_the_output_item_is_warned_with_both_digests(tmp_path):
    import hashlib

    lines = _real_lines()
    lines[11]["payload"]["item"]["aggregated_output"] = "other.txt\n"
    p = tmp_path / REAL
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result, _ = read_native(p, "codex")
    [r] = result.trajectory.steps[0].observation.results
    assert r.content == lines[12]["payload"]["output"]  # the model-visible one is kept
    [w] = [w for w in result.diagnostics.warnings if w.code == "output_differs"]
    digests = [hashlib.sha256(t.encode()).hexdigest() for t in ("other.txt\n", r.content)]
    assert w.where == "line 12" and all(d in w.message for d in digests)


def test_an_end_event_within_its_output_item_is_silent():
    result, _ = read_native(native_dir() / "codex" / REAL, "codex")
    assert not {"output_differs", "output_from_event"} & set(result.diagnostics.codes())


@pytest.mark.parametrize("damage", ["deleted", "cut_and_glued"])
def test_a_lost_call_of_step_1_is_a_gap_step_1_and_the_later_steps_keep_their_numbers(tmp_path, damage):
    # the real 0.171.0 session: line 10 is step 1's function_call, line 11 the record after it
    name = "real-0.171.0_single-then-resume.jsonl"
    lines = (native_dir() / "codex" / name).read_bytes().split(b"\n")
    assert b'"type":"function_call"' in lines[9]
    whole, _ = read_native(native_dir() / "codex" / name, "codex")
    if damage == "deleted":
        lines[9:10] = []
    else:  # cut mid-line, the next write appended with no newline between
        lines[9:11] = [lines[9][: len(lines[9]) // 2] + lines[10]]
    p = tmp_path / name
    p.write_bytes(b"\n".join(lines))
    result, _ = read_native(p, "codex")
    steps, before = result.trajectory.steps, whole.trajectory.steps
    assert len(steps) == len(before) == 4
    gap = steps[0]
    assert (gap.n, gap.flags, gap.action.tool_calls) == (1, ["lost_action"], [])
    assert [r.call_id for r in gap.observation.results] == [r.call_id for r in before[0].observation.results]
    assert [(s.n, s.action.text, s.action.tool_calls) for s in steps[1:]] == [
        (s.n, s.action.text, s.action.tool_calls) for s in before[1:]
    ]
    [w] = [w for w in result.diagnostics.warnings if w.code == "lost_action"]
    assert "step 1 was lost" in w.message
    assert "a call output before any action" not in str(result.trajectory.left_out)
