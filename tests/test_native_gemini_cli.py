"""Gemini CLI session adapter (adapters/native/gemini_cli.py) on small sessions written here:
a file of another agent refused, exact repeats warned while updates by id are not, upserts,
rewinds and repeated results replayed when steps are built from the file on demand, and
memory bounded on a large session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from native_helpers import refused
from pvisor.adapters.native import read_native
from pvisor.adapters.native.assembly import LazySteps
from pvisor.adapters.native.gemini_cli import EXPECTED
from test_native_codex import assert_mutated_samples_build

META = {"sessionId": "G", "projectHash": "h", "startTime": "t", "kind": "main"}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _call(cid: str, output: str | None = None, status: str = "success") -> dict:
    c = {
        "id": cid,
        "name": "run_shell_command",
        "args": {"command": "ls"},
        "status": status,
        "resultDisplay": "UI copy",
        "description": "d",
    }
    if output is not None:
        c["result"] = [
            {"functionResponse": {"id": cid, "name": "run_shell_command", "response": {"output": output}}}
        ]
    return c


def test_a_codex_rollout_given_as_gemini_cli_is_refused_naming_the_file_and_line(tmp_path):
    p = _write(
        tmp_path / "rollout.jsonl",
        [
            {"timestamp": "t", "type": "session_meta", "payload": {"id": "T", "cli_version": "0.171.0"}},
            {
                "timestamp": "t",
                "type": "response_item",
                "payload": {"type": "message", "role": "user", "content": []},
            },
        ],
    )
    assert refused(p, "gemini-cli") == (
        f"{p}: line 1: required record shape missing: no Gemini CLI session record (metadata with "
        "sessionId/projectHash, a message with id/type, $set or $rewindTo) in the file"
    )


def test_a_claude_code_session_given_as_gemini_cli_is_refused(tmp_path):
    p = _write(
        tmp_path / "session.jsonl",
        [
            {
                "parentUuid": None,
                "type": "user",
                "uuid": "u1",
                "sessionId": "S",
                "message": {"role": "user", "content": "hi"},
            }
        ],
    )
    assert refused(p, "gemini-cli").startswith(
        f"{p}: line 1: required record shape missing: no Gemini CLI session record"
    )


@pytest.mark.parametrize("content", [b"", b"\n", b"[1, 2]\n"])
def test_an_empty_file_given_as_gemini_cli_is_refused_naming_the_file(tmp_path, content):
    p = tmp_path / "session-x.jsonl"
    p.write_bytes(content)
    assert refused(p, "gemini-cli").startswith(
        f"{p}: required record shape missing: no Gemini CLI session record"
    )


@pytest.mark.parametrize(
    "agent,name",
    [
        ("mini-swe-agent", "real-2.4.6_single.traj.json"),
        ("opencode", "real-1.18.33_export_single.json"),
        (None, None),
    ],
)
def test_another_agents_document_given_as_gemini_cli_is_refused(tmp_path, agent, name):
    # a new user's trial: any JSON object with a `messages` list read as 0 steps, exit 0
    from conftest import corpus_dir

    if agent is None:
        p = tmp_path / "other.json"
        p.write_text('{"messages": [{"foo": 1}]}')
    else:
        p = corpus_dir() / "native" / agent / name
    assert refused(p, "gemini-cli") == (
        f"{p}: document: no Gemini CLI message (an object with a string `type`) in `messages`; "
        f"expected {EXPECTED}"
    )


def test_a_session_with_only_its_metadata_line_is_read_with_no_steps(tmp_path):
    result, _ = read_native(_write(tmp_path / "session-x.jsonl", [META]), "gemini-cli")
    assert len(result.trajectory.steps) == 0 and result.trajectory.meta["sessionId"] == "G"


def test_an_exact_repeat_warns_duplicate_record_and_an_update_by_id_does_not(tmp_path):
    p = _write(
        tmp_path / "session-x.jsonl",
        [
            META,
            {"id": "u1", "type": "user", "content": [{"text": "list files"}]},
            {"id": "u1", "type": "user", "content": [{"text": "list files"}]},  # written twice: a copy
            {"id": "g1", "type": "gemini", "content": "", "model": "gemini-x"},
            {
                "id": "g1",
                "type": "gemini",
                "content": "",
                "model": "gemini-x",
                "toolCalls": [_call("c1", "a.txt")],
            },  # an update
        ],
    )
    result, _ = read_native(p, "gemini-cli")
    t = result.trajectory
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_record", "line 3")]
    assert "message u1 repeats its record at line 2 exactly" in result.diagnostics.warnings[0].message
    assert t.task == "list files" and [lo.kind for lo in t.left_out] == ["duplicate"]
    [s] = t.steps
    assert [(r.call_id, r.content[0]["functionResponse"]["response"]) for r in s.observation.results] == [
        ("c1", {"output": "a.txt"})
    ]


def test_steps_built_on_demand_replay_upserts_rewinds_and_repeated_results(tmp_path):
    p = _write(
        tmp_path / "session-x.jsonl",
        [
            META,
            {
                "$set": {
                    "messages": [{"id": "ctx", "type": "user", "content": [{"text": "<session_context>"}]}]
                }
            },
            {"id": "u1", "type": "user", "content": [{"text": "go"}]},
            {
                "id": "g1",
                "type": "gemini",
                "content": "first",
                "model": "gemini-x",
                "toolCalls": [_call("c1"), _call("c2")],
            },
            # results written as a user message of functionResponse parts: c1 only
            {
                "id": "u2",
                "type": "user",
                "content": [
                    {
                        "functionResponse": {
                            "id": "c1",
                            "name": "run_shell_command",
                            "response": {"output": "one"},
                        }
                    }
                ],
            },
            {"id": "g2", "type": "gemini", "content": "doomed", "model": "gemini-x"},
            {"$rewindTo": "g2"},
            {"id": "u3", "type": "user", "content": "and now?"},
            {"id": "g3", "type": "gemini", "content": "draft", "model": "gemini-y"},
            {"id": "g3", "type": "gemini", "content": "final", "model": "gemini-y", "displayContent": "UI"},
            {"$set": {"lastUpdated": "t2", "directories": ["/w"]}},
        ],
    )
    result, _ = read_native(p, "gemini-cli")
    t = result.trajectory
    assert isinstance(t.steps, LazySteps)
    assert t.task == "go" and t.model == "gemini-x" and t.meta["task_context"] == ["<session_context>"]
    assert t.meta["lastUpdated"] == "t2" and "directories" not in t.meta
    s1, s2 = t.steps
    assert [s.action.text for s in (s1, s2)] == ["first", "final"]
    assert [(r.call_id, r.content) for r in s1.observation.results] == [
        (
            "c1",
            [{"functionResponse": {"id": "c1", "name": "run_shell_command", "response": {"output": "one"}}}],
        ),
        ("c2", ""),
    ]
    assert s1.flags == ["interrupted"] and [m.parts[0].text for m in s1.observation.messages] == ["and now?"]
    # UI-only fields are not kept in the raw records
    assert "displayContent" not in s2.action.raw and "resultDisplay" not in s1.action.tool_calls[0].raw
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("interrupted", "step 1")]
    assert "tool call c2 has no result" in result.diagnostics.warnings[0].message
    assert [lo.kind for lo in t.left_out] == ["$set/messages", "rewound"]
    assert list(t.steps) == list(t.steps)  # built again, the same


def test_mutated_sessions_build_every_step(tmp_path):
    assert_mutated_samples_build("gemini-cli", tmp_path)


def test_a_damaged_message_record_is_skipped_with_a_warning_and_the_rest_read(tmp_path):
    # a byte flip in a key: "type" read as "typ\ufffd" (tester finding, as for Codex's "payload")
    p = _write(
        tmp_path / "session-x.jsonl",
        [
            META,
            {"id": "u1", "type": "user", "content": [{"text": "go"}]},
            {"id": "g1", "typ\ufffd": "gemini", "content": "lost", "model": "gemini-x"},
            {"$set": "oops"},
            {"$rewindTo": None},
            {"i\ufffd": "g2", "type": "gemini", "content": "lost too"},
            {
                "id": "g3",
                "type": "gemini",
                "content": "kept",
                "model": "gemini-x",
                "toolCalls": [_call("c1", "a.txt")],
            },
        ],
    )
    result, _ = read_native(p, "gemini-cli")
    t = result.trajectory
    assert t.task == "go" and [s.action.text for s in t.steps] == ["kept"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("malformed_record", f"line {n}") for n in (3, 4, 5, 6)
    ]
    assert [w.message for w in result.diagnostics.warnings] == [
        "a message record without a string `type`; skipped",
        "$set without an object; skipped",
        "$rewindTo without a message id; skipped",
        "a message record without an `id`; skipped",
    ]
    assert [lo.where for lo in t.left_out if lo.kind == "malformed"] == [
        "line 3",
        "line 4",
        "line 5",
        "line 6",
    ]


def test_a_file_of_damaged_records_only_is_refused(tmp_path):
    p = _write(
        tmp_path / "session-x.jsonl", [{"id": "g1", "typ\ufffd": "gemini", "content": "x"}, {"$set": None}]
    )
    assert refused(p, "gemini-cli") == (
        f"{p}: line 1: required record shape missing: no Gemini CLI session record (metadata with "
        "sessionId/projectHash, a message with id/type, $set or $rewindTo) in the file"
    )


def _legacy(path: Path, messages: list) -> Path:
    path.write_text(json.dumps({**META, "messages": messages}, indent=2))
    return path


def test_a_damaged_message_in_a_legacy_document_is_skipped_with_a_warning(tmp_path):
    p = _legacy(
        tmp_path / "session-x.json",
        [
            {"id": "1", "type": "user", "content": "go"},
            "not a message",
            {"id": "2", "typ\ufffd": "gemini", "content": "lost"},
            {"id": "3", "type": "gemini", "content": "kept", "toolCalls": [_call("c1", "a.txt")]},
        ],
    )
    result, _ = read_native(p, "gemini-cli")
    t = result.trajectory
    assert (
        t.meta["format"] == "gemini-cli legacy session json"
        and t.task == "go"
        and [s.action.text for s in t.steps] == ["kept"]
    )
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("malformed_record", "message 2"),
        ("malformed_record", "message 3"),
    ]


def test_a_legacy_document_not_of_the_shape_is_refused_naming_the_shape_expected(tmp_path):
    p = tmp_path / "session-x.json"
    p.write_text(json.dumps({**META, "messages": {"id": "1"}}))
    assert (
        refused(p, "gemini-cli")
        == f"{p}: document: not a Gemini CLI session JSON: no `messages` list; expected {EXPECTED}"
    )


def test_a_truncated_legacy_document_is_refused_naming_the_shape_expected(tmp_path):
    p = _legacy(tmp_path / "session-x.json", [{"id": "1", "type": "user", "content": "go"}])
    p.write_bytes(p.read_bytes()[:-20])
    msg = refused(p, "gemini-cli")
    assert msg.startswith(f"{p}: not a JSON document (") and msg.endswith(f"; expected {EXPECTED}")


def test_a_legacy_document_starting_with_a_bom_is_read_as_one_document(tmp_path):
    p = _legacy(
        tmp_path / "session-x.json",
        [{"id": "1", "type": "user", "content": "go"}, {"id": "2", "type": "gemini", "content": "done"}],
    )
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    result, _ = read_native(p, "gemini-cli")
    t = result.trajectory
    assert (
        t.meta["format"] == "gemini-cli legacy session json"
        and t.task == "go"
        and [s.action.text for s in t.steps] == ["done"]
    )


def test_two_calls_of_one_message_sharing_an_id_keep_their_own_results(tmp_path):
    a, b = _call("c1", "a.txt"), _call("c1", "b.txt")
    b["args"] = {"command": "ls b"}
    p = _write(
        tmp_path / "session-x.jsonl",
        [
            META,
            {"id": "u1", "type": "user", "content": "go"},
            {"id": "g1", "type": "gemini", "content": "", "toolCalls": [a, b]},
        ],
    )
    result, _ = read_native(p, "gemini-cli")
    [s] = result.trajectory.steps
    assert [c.arguments for c in s.action.tool_calls] == [{"command": "ls"}, {"command": "ls b"}]
    assert [r.content[0]["functionResponse"]["response"]["output"] for r in s.observation.results] == [
        "a.txt",
        "b.txt",
    ]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("duplicate_call_id", "line 3")
    ] and s.flags == []


def test_functionresponse_copies_for_calls_sharing_an_id_fill_them_in_order(tmp_path):
    def fr(out: str) -> dict:
        return {"functionResponse": {"id": "c1", "name": "run_shell_command", "response": {"output": out}}}

    p = _write(
        tmp_path / "session-x.jsonl",
        [
            META,
            {"id": "u1", "type": "user", "content": "go"},
            {"id": "g1", "type": "gemini", "content": "", "toolCalls": [_call("c1"), _call("c1")]},
            {"id": "u2", "type": "user", "content": [fr("first"), fr("second")]},
        ],
    )
    result, _ = read_native(p, "gemini-cli")
    [s] = result.trajectory.steps
    assert [r.content[0]["functionResponse"]["response"]["output"] for r in s.observation.results] == [
        "first",
        "second",
    ]
    assert s.flags == [] and result.diagnostics.codes() == ["duplicate_call_id"]


def test_a_jsonl_session_saved_as_json_is_read_as_the_jsonl_it_is(tmp_path):
    """(issue 14, item 6) A recording renamed ``*.json`` was refused as a broken legacy document."""
    import shutil

    from pvisor.adapters.native import read_native

    src = (
        Path(__file__).resolve().parent
        / "corpus"
        / "native"
        / "gemini-cli"
        / "real-0.61.0_single-then-resume.jsonl"
    )
    renamed = tmp_path / "session-2026.json"
    shutil.copyfile(src, renamed)
    want, _ = read_native(src, "gemini-cli")
    got, _ = read_native(renamed, "gemini-cli")

    def shape(r):
        return [
            (s.n, s.action.text, [c.arguments_raw for c in s.action.tool_calls]) for s in r.trajectory.steps
        ]  # noqa: E731

    assert shape(got) == shape(want) and len(shape(want)) > 0
    assert got.trajectory.meta["format"] == "gemini-cli session jsonl"
    # the same without --agent: detected
    auto, _ = read_native(renamed)
    assert shape(auto) == shape(want)


def test_the_results_call_ids_are_the_ones_the_prefix_carries(tmp_path):
    """(issue 14, item 6) Gemini CLI's file stores ``<name>__<id>``; the agent sends ``<id>``, and
    so does the prefix: the result names the same id."""
    from pvisor.replay.prepare import PrepareOptions, prepare_only

    src = (
        Path(__file__).resolve().parent
        / "corpus"
        / "native"
        / "gemini-cli"
        / "real-0.61.0_single-then-resume.jsonl"
    )
    outcome = prepare_only(
        PrepareOptions(agent="gemini-cli", after_step=1, output=tmp_path / "out", trajectory=src)
    )
    body = json.loads((tmp_path / "out" / "prefix.json").read_text())
    sent = [p["functionCall"]["id"] for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    res, _ = read_native(src, "gemini-cli")
    stored = [c.id for c in res.trajectory.steps[0].action.tool_calls]
    assert stored != sent and all(
        s.endswith("__" + w) for s, w in zip(stored, sent)
    )  # the file's form differs
    assert [c["call_id"] for c in outcome.result["tool_calls"]] == sent
