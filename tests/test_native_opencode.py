"""OpenCode sessions (adapters/native/opencode.py): the ``opencode export`` JSON, the legacy
storage tree and the ``opencode.db`` of releases >= 1.2, read read-only with no opencode binary.

The db is rebuilt in the test from ``real-1.18.33_opencode-db-dump.json``, the tables of a real
opencode.db of OpenCode 1.18.33 (``{table: {schema, rows}}``: the CREATE TABLE statement and
every row of ``session``, ``message``, ``part``, ``project``, ``event``; ``data`` columns stored
as JSON objects in the dump, as JSON text in the db). Expected values are read from the raw
JSON here, not through the adapter. Small inputs written by the tests cover the damaged-input
classes and version checks; choosing a session by id (``read_session``, the entry point of a
CLI ``--session ID``) is tested on the rebuilt db, the storage tree and an export."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from native_helpers import (
    assert_refused_naming_file_and_shape,
    assert_steps_match,
    bad_documents,
    native_dir,
    opencode_db,
    opencode_db_from_dump,
    refused,
)
from pvisor.adapters.native import read_native
from pvisor.adapters.native.opencode import read_session
from pvisor.core.errors import BadInputError

OC = native_dir() / "opencode"
DUMP = OC / "real-1.18.33_opencode-db-dump.json"


def _compact(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _raw_steps(messages: list[dict]) -> tuple[str, list[dict]]:
    """(task, steps) from raw ``[{info, parts}]``: each step-start..step-finish bracket of an
    assistant message with text, reasoning or tool parts is a step; later user texts are the
    observation messages of the step before them."""
    task = None
    steps: list[dict] = []
    for m in messages:
        if m["info"]["role"] == "user":
            text = "".join(p["text"] for p in m["parts"] if p["type"] == "text" and not p.get("synthetic"))
            if task is None:
                task = text
            else:
                steps[-1]["messages"].append(text)
            continue
        groups: list[list[dict]] = [[]]
        for p in m["parts"]:
            if p["type"] == "step-start":
                groups.append([])
            else:
                groups[-1].append(p)
        for g in groups:
            if not any(p["type"] in ("text", "reasoning", "tool") for p in g):
                continue
            tools = [p for p in g if p["type"] == "tool"]
            steps.append(
                {
                    "text": "".join(p["text"] for p in g if p["type"] == "text" and not p.get("synthetic")),
                    "calls": [(p["callID"], p["tool"], _compact(p["state"]["input"])) for p in tools],
                    "results": [
                        (
                            p["callID"],
                            p["state"].get("output", p["state"].get("error")),
                            p["state"]["status"] == "error",
                        )
                        for p in tools
                    ],
                    "messages": [],
                }
            )
    return task, steps


def _check(t, task: str, raw: list[dict]) -> None:
    assert t.task == task
    assert_steps_match(t.steps, raw)


# --------------------------------------------------------------------------- export JSON


@pytest.mark.parametrize("name", ["real-1.18.33_export_single.json", "real-1.18.33_export_resume.json"])
def test_export_matches_its_raw_json(name):
    doc = json.loads((OC / name).read_text())
    result, notes = read_native(OC / name)
    assert notes == ["detected format: opencode"]
    t = result.trajectory
    task, raw = _raw_steps(doc["messages"])
    _check(t, task, raw)
    # OpenCode wraps a `run` prompt in literal quotes: kept as stored
    assert t.task.startswith('"') and t.task.endswith('"')
    assert t.system is None and t.tools is None  # not stored by OpenCode
    assert (
        t.meta["agent_version"] == doc["info"]["version"] == "1.18.33"
        and t.meta["session"] == doc["info"]["id"]
    )
    assert t.meta["format"] == "opencode export json" and result.diagnostics.codes() == []
    assert [lo.kind for lo in t.left_out] == [
        p["type"] for m in doc["messages"] for p in m["parts"] if p["type"] == "patch"
    ]


def test_export_parallel_calls_are_one_batch():
    t = read_native(OC / "real-1.18.33_export_single.json")[0].trajectory
    assert [len(s.action.tool_calls) for s in t.steps] == [2, 0]
    assert [r.content for r in t.steps[0].observation.results] == ["PARALLEL_ONE\n", "PARALLEL_TWO\n"]
    assert t.steps[0].action.stop_reason == "tool-calls" and t.model == "mock-model"


# --------------------------------------------------------------------------- opencode.db


def _dump() -> dict:
    return json.loads(DUMP.read_text())


def _messages_of(dump: dict, sid: str) -> list[dict]:
    """The session's ``[{info, parts}]`` from the dump rows, ordered by id as OpenCode does."""
    parts: dict[str, list[dict]] = {}
    for r in sorted(dump["part"]["rows"], key=lambda r: r["id"]):
        if r["session_id"] == sid:
            parts.setdefault(r["message_id"], []).append(r["data"])
    return [
        {"info": r["data"], "parts": parts.get(r["id"], [])}
        for r in sorted(dump["message"]["rows"], key=lambda r: r["id"])
        if r["session_id"] == sid
    ]


def test_the_dump_holds_schema_and_rows_of_a_real_db():
    dump = _dump()
    assert {"session", "message", "part"} <= set(dump)
    for name in ("session", "message", "part"):
        assert dump[name]["schema"].startswith(f"CREATE TABLE `{name}`") and dump[name]["rows"]
    assert {r["version"] for r in dump["session"]["rows"]} == {"1.18.33"}


def test_db_is_read_read_only_and_gives_the_latest_root_session(tmp_path):
    db = opencode_db_from_dump(DUMP, tmp_path / "opencode.db")
    before = db.read_bytes()
    db.chmod(0o444)
    result, notes = read_native(db)
    assert notes == ["detected format: opencode"]
    t = result.trajectory
    dump = _dump()
    roots = [r for r in dump["session"]["rows"] if not r["parent_id"]]
    latest = max(roots, key=lambda r: r["time_updated"])
    assert t.meta["session"] == latest["id"] and t.meta["format"] == "opencode.db (read-only)"
    task, raw = _raw_steps(_messages_of(dump, latest["id"]))
    _check(t, task, raw)
    others = [f"session {r['id']}" for r in dump["session"]["rows"] if r["id"] != latest["id"]]
    assert sorted(lo.where for lo in t.left_out if lo.kind == "session") == sorted(others)
    # nothing written: same bytes, no journal/WAL files created beside it
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opencode.db"]


@pytest.mark.parametrize("export", ["real-1.18.33_export_single.json", "real-1.18.33_export_resume.json"])
def test_db_and_export_of_the_same_session_give_the_same_trajectory(tmp_path, export):
    doc = json.loads((OC / export).read_text())
    db = opencode_db_from_dump(DUMP, tmp_path / "opencode.db")
    con = sqlite3.connect(db)  # keep only that session (the adapter reads the latest one)
    con.execute("delete from session where id != ?", (doc["info"]["id"],))
    con.commit()
    con.close()
    from_db = read_native(db)[0].trajectory
    from_export = read_native(OC / export)[0].trajectory

    def core(t):
        return (
            t.task,
            [
                (
                    s.action.text,
                    [(c.id, c.name, c.arguments_raw) for c in s.action.tool_calls],
                    [(r.call_id, r.content, r.is_error) for r in s.observation.results],
                    [m.parts[0].text for m in s.observation.messages],
                )
                for s in t.steps
            ],
        )

    assert core(from_db) == core(from_export)


def test_db_with_a_live_wal_is_read_with_its_uncheckpointed_rows(tmp_path):
    db_path = opencode_db_from_dump(DUMP, tmp_path / "opencode.db")
    writer = sqlite3.connect(db_path)
    try:
        writer.execute("pragma journal_mode=wal")
        writer.execute("pragma wal_autocheckpoint=0")
        sid = "ses_zzzz_newest"
        writer.execute(
            "insert into session "
            "(id, project_id, slug, directory, title, version, time_created, time_updated) "
            "values (?, 'global', 's', '/w', 't', '1.18.33', 1, 9999999999999)",
            (sid,),
        )
        writer.execute(
            "insert into message (id, session_id, time_created, time_updated, data) "
            "values ('msg_z1', ?, 1, 1, ?)",
            (sid, json.dumps({"role": "user"})),
        )
        writer.execute(
            "insert into part (id, message_id, session_id, time_created, time_updated, data) "
            "values ('prt_z1', 'msg_z1', ?, 1, 1, ?)",
            (sid, json.dumps({"type": "text", "text": "from the wal"})),
        )
        writer.commit()
        assert (tmp_path / "opencode.db-wal").stat().st_size > 0
        t = read_native(db_path)[0].trajectory
        assert t.meta["session"] == sid and t.task == "from the wal" and t.steps == []
    finally:
        writer.close()


_SESSION = ("ses_1", None, "1.18.33", "/w", "t", 1)


def test_db_row_whose_data_is_not_json_is_skipped_with_a_warning(tmp_path):
    db = opencode_db(
        tmp_path / "opencode.db",
        [_SESSION],
        [("msg_1", "ses_1", {"role": "user"}), ("msg_2", "ses_1", {"role": "assistant", "modelID": "m"})],
        [
            ("prt_1", "msg_1", "ses_1", {"type": "text", "text": "task"}),
            ("prt_2", "msg_2", "ses_1", '{"type": "text", "te'),
            ("prt_3", "msg_2", "ses_1", {"type": "text", "text": "answer"}),
        ],
    )
    result = read_native(db)[0]
    assert [s.action.text for s in result.trajectory.steps] == ["answer"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("malformed_line", "part prt_2")]


# --------------------------------------------------------------------------- storage tree


def test_storage_tree_fixture():
    root = OC / "agent-sessions_storage_v2"
    result, notes = read_native(root)
    assert notes == ["detected format: opencode"]
    t = result.trajectory
    sess = json.loads((root / "session" / "proj_test" / "ses_s_stage0_large.json").read_text())
    tool = json.loads((root / "part" / "m_assistant_large_1" / "001.json").read_text())
    assert t.meta["session"] == sess["id"] and t.meta["agent_version"] == sess["version"] == "1.3.17"
    assert t.task == json.loads((root / "part" / "m_user_large_1" / "001.json").read_text())["text"]
    first, second = t.steps
    [call] = first.action.tool_calls
    assert (call.id, call.name, call.arguments_raw) == (
        tool["callID"],
        tool["tool"],
        _compact(tool["state"]["input"]),
    )
    assert [(r.content, r.is_error) for r in first.observation.results] == [(tool["state"]["output"], False)]
    assert [r.text for r in first.action.reasoning] == ["Investigating failing command."]
    assert first.flags == ["error"] and t.meta["errors"][0]["error"]["name"] == "MessageAbortedError"
    assert [m.parts[0].text for m in first.observation.messages] == ["Step 2"]
    assert second.action.text == "Ok"
    kinds = {lo.where: lo.kind for lo in t.left_out}
    assert kinds == {
        "session s_stage0_small": "session",
        "part p_text_large_1": "text",
        "part p_file_large_1": "file",
        "part p_compaction_large_1": "compaction",
        "part p_patch_large_1": "patch",
    }


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    for d in ("session/proj", "message/ses_1", "part/msg_1", "part/msg_2"):
        (root / d).mkdir(parents=True)
    (root / "session/proj/ses_1.json").write_text(
        json.dumps({"id": "ses_1", "version": "1.18.33", "time": {"updated": 1}})
    )
    (root / "message/ses_1/msg_1.json").write_text(json.dumps({"id": "msg_1", "role": "user"}))
    (root / "message/ses_1/msg_2.json").write_text(
        json.dumps({"id": "msg_2", "role": "assistant", "modelID": "m"})
    )
    (root / "part/msg_1/prt_1.json").write_text(json.dumps({"id": "prt_1", "type": "text", "text": "task"}))
    (root / "part/msg_2/prt_2.json").write_text(json.dumps({"id": "prt_2", "type": "text", "text": "answer"}))
    return root


def test_a_damaged_tree_file_is_skipped_naming_it(tmp_path):
    root = _tree(tmp_path)
    (root / "part/msg_2/prt_3.json").write_bytes(b'{"id": "prt_3", "type": "text", "te')  # cut off
    result = read_native(root)[0]
    assert [s.action.text for s in result.trajectory.steps] == ["answer"]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("malformed_line", "part/msg_2/prt_3.json")
    ]


# --------------------------------------------------------------------------- damaged input / versions


def _export(tmp_path: Path, version="1.18.33", output="A", status="completed") -> Path:
    p = tmp_path / "export.json"
    state = {"status": status, "input": {"command": "cat f"}}
    if status == "completed":
        state["output"] = output
    p.write_text(
        json.dumps(
            {
                "info": {"id": "ses_1", "version": version},
                "messages": [
                    {
                        "info": {"id": "msg_1", "sessionID": "ses_1", "role": "user"},
                        "parts": [{"id": "p1", "type": "text", "text": '"task"'}],
                    },
                    {
                        "info": {"id": "msg_2", "sessionID": "ses_1", "role": "assistant", "modelID": "m"},
                        "parts": [
                            {"id": "p2", "type": "step-start"},
                            {"id": "p3", "type": "tool", "callID": "c1", "tool": "bash", "state": state},
                            {"id": "p4", "type": "step-finish", "reason": "tool-calls"},
                        ],
                    },
                ],
            }
        )
    )
    return p


def test_truncated_export_is_refused_naming_the_file(tmp_path):
    p = _export(tmp_path)
    p.write_bytes(p.read_bytes()[:-40])
    with pytest.raises(BadInputError) as exc:
        read_native(p, "opencode")
    assert (
        str(p) in exc.value.message
        and "not a JSON document" in exc.value.message
        and exc.value.exit_code == 65
    )


def test_invalid_utf8_in_a_tool_output_becomes_replacement_characters(tmp_path):
    p = _export(tmp_path, output="A\udcffB")
    p.write_bytes(p.read_bytes().replace(b"A\\udcffB", b"A\xffB"))
    result = read_native(p)[0]
    assert result.trajectory.steps[0].observation.results[0].content == "A\ufffdB"
    assert result.diagnostics.codes() == ["invalid_utf8"]


def test_a_running_tool_part_is_an_interrupted_observation(tmp_path):
    result = read_native(_export(tmp_path, status="running"))[0]
    [s] = result.trajectory.steps
    assert s.flags == ["interrupted"] and [(r.call_id, r.content) for r in s.observation.results] == [
        ("c1", "")
    ]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("interrupted", "part p3")]


def test_wrong_format_given_with_agent_is_refused():
    mini = native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json"
    message = refused(mini, "opencode")
    assert (
        str(mini) in message
        and "info: not an OpenCode export" in message
        and "expected an OpenCode session" in message
    )
    assert "document: not an OpenCode export" in refused(
        native_dir() / "openhands" / "tests_runtime_trajs_basic.json", "opencode"
    )


def test_unknown_major_version_is_refused_naming_the_session(tmp_path):
    with pytest.raises(BadInputError) as exc:
        read_native(_export(tmp_path, version="2.0.1"))
    assert (
        "session ses_1" in exc.value.message and "major 2" in exc.value.message and exc.value.exit_code == 65
    )


def test_newer_minor_version_is_read_with_a_warning(tmp_path):
    result = read_native(_export(tmp_path, version="1.19.0"))[0]
    assert len(result.trajectory.steps) == 1
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [
        ("unverified_profile", "session ses_1")
    ]


def test_invalid_utf8_in_a_db_data_column_becomes_replacement_characters(tmp_path):
    state = json.dumps(
        {
            "type": "tool",
            "callID": "c1",
            "tool": "bash",
            "state": {"status": "completed", "input": {}, "output": "A@B"},
        }
    ).encode()
    db = opencode_db(
        tmp_path / "opencode.db",
        [_SESSION],
        [("msg_1", "ses_1", {"role": "user"}), ("msg_2", "ses_1", {"role": "assistant"})],
        [
            ("prt_1", "msg_1", "ses_1", {"type": "text", "text": "task"}),
            ("prt_2", "msg_2", "ses_1", state.replace(b"A@B", b"A\xffB")),
        ],
    )
    result = read_native(db)[0]
    assert result.trajectory.steps[0].observation.results[0].content == "A\ufffdB"
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("invalid_utf8", "part prt_2")]


def test_compaction_summary_and_compacted_outputs_are_flagged(tmp_path):
    p = tmp_path / "export.json"
    tool = {
        "id": "p2",
        "type": "tool",
        "callID": "c1",
        "tool": "bash",
        "state": {
            "status": "completed",
            "input": {"command": "ls"},
            "output": "big",
            "time": {"start": 1, "end": 2, "compacted": 3},
        },
    }
    p.write_text(
        json.dumps(
            {
                "info": {"id": "ses_1", "version": "1.18.33"},
                "messages": [
                    {
                        "info": {"id": "msg_1", "role": "user"},
                        "parts": [{"id": "p1", "type": "text", "text": "task"}],
                    },
                    {
                        "info": {"id": "msg_2", "role": "assistant"},
                        "parts": [
                            {"id": "p1a", "type": "step-start"},
                            tool,
                            {"id": "p3", "type": "step-finish"},
                        ],
                    },
                    {
                        "info": {"id": "msg_3", "role": "user"},
                        "parts": [{"id": "p4", "type": "compaction", "auto": True}],
                    },
                    {
                        "info": {"id": "msg_4", "role": "assistant", "summary": True},
                        "parts": [{"id": "p5", "type": "text", "text": "SUMMARY"}],
                    },
                ],
            }
        )
    )
    t = read_native(p, "opencode")[0].trajectory
    # the summary is no step: it is the history of the compaction after step 1 (issue 14 item 1)
    assert [s.flags for s in t.steps] == [["compacted", "compaction"]]
    [c] = t.compactions
    assert (c.after_step, c.where, c.summary) == (1, "message msg_3", "SUMMARY")
    assert [(m.role, m.parts[0].text) for m in c.history] == [
        ("user", "What did we do so far?"),
        ("assistant", "SUMMARY"),
    ]
    assert {("message msg_3", "compaction"), ("message msg_4", "compaction_summary")} <= {
        (lo.where, lo.kind) for lo in t.left_out
    }


# --------------------------------------------------------------------------- choosing a session


def test_a_session_given_by_id_is_read_from_the_db_and_the_others_are_left_out(tmp_path):
    db = opencode_db_from_dump(DUMP, tmp_path / "opencode.db")
    dump = _dump()
    rows = sorted(dump["session"]["rows"], key=lambda r: r["time_updated"])
    oldest = rows[0]["id"]  # not the one read by default
    result = read_session(db, oldest)
    t = result.trajectory
    assert t.meta["session"] == oldest and t.meta["session_chosen_by"] == "id given"
    task, raw = _raw_steps(_messages_of(dump, oldest))
    _check(t, task, raw)
    assert sorted(lo.where for lo in t.left_out if lo.kind == "session") == sorted(
        f"session {r['id']}" for r in rows[1:]
    )


def test_a_session_given_by_id_is_read_from_the_storage_tree():
    root = OC / "agent-sessions_storage_v2"
    t = read_session(root, "s_stage0_small").trajectory
    [user_part] = [json.loads(f.read_text()) for f in (root / "part" / "m_user_small").glob("*.json")]
    assert (
        t.meta["session"] == "s_stage0_small"
        and t.meta["directory"] == "/tmp/repo"
        and t.task == user_part["text"]
    )
    assert [lo.where for lo in t.left_out if lo.kind == "session"] == ["session s_stage0_large"]


def test_an_unknown_session_id_is_refused_listing_the_ids_most_recent_first(tmp_path):
    db = opencode_db_from_dump(DUMP, tmp_path / "opencode.db")
    rows = sorted(_dump()["session"]["rows"], key=lambda r: r["time_updated"], reverse=True)
    with pytest.raises(BadInputError) as exc:
        read_session(db, "ses_nope")
    assert exc.value.exit_code == 65
    assert (
        exc.value.message
        == f"{db}: no OpenCode session 'ses_nope' in this store; it holds, most recent first: "
        f"{', '.join(r['id'] for r in rows)}"
    )


def test_the_list_of_available_ids_stops_at_ten(tmp_path):
    sessions = [(f"ses_{i:02d}", None, "1.18.33", "/w", "t", i) for i in range(12)]
    db = opencode_db(tmp_path / "opencode.db", sessions, [], [])
    message = refused_session(db, "ses_x")
    assert message.endswith(": " + ", ".join(f"ses_{i:02d}" for i in range(11, 1, -1)) + " (and 2 more)")


def test_an_export_is_read_when_the_id_is_its_own_and_refused_otherwise():
    export = OC / "real-1.18.33_export_single.json"
    sid = json.loads(export.read_text())["info"]["id"]
    assert read_session(export, sid).trajectory.meta["session"] == sid
    assert (
        refused_session(export, "ses_other")
        == f"{export}: no OpenCode session 'ses_other' in this export; it holds session {sid}"
    )


def refused_session(path: Path, session: str) -> str:
    with pytest.raises(BadInputError) as exc:
        read_session(path, session)
    assert exc.value.exit_code == 65
    return exc.value.message


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "says"),
    bad_documents(
        (b"[]", "document: not an OpenCode export: no `info` and `messages`"),
        (
            b'{"info": {"title": "x"}, "messages": []}',
            "info: not an OpenCode export: the session `info` has no `id`",
        ),
    ),
)
def test_bad_input_is_refused_naming_the_file_and_the_shape_expected(tmp_path, content, says):
    assert_refused_naming_file_and_shape(
        tmp_path / "bad.json", content, "opencode", says, "an OpenCode session: `opencode export` JSON"
    )


def test_a_sqlite_file_of_another_program_and_an_empty_directory_are_refused(tmp_path):
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("create table foo (x)")
    con.commit()
    con.close()
    message = refused(other, "opencode")
    assert message.startswith(
        f"{other}: not a readable OpenCode database: no such table: session; expected an OpenCode session"
    )
    (tmp_path / "empty").mkdir()
    assert refused(tmp_path / "empty", "opencode").startswith(
        f"{tmp_path / 'empty'}: no OpenCode session in this store; expected"
    )


@pytest.mark.parametrize(
    "provider, protocol",
    [
        ("anthropic", "anthropic"),
        ("openai", "openai-responses"),
        ("google", "gemini"),
        ("mock", "openai-chat"),
        ("pvisor", "openai-chat"),
    ],
)
def test_the_render_speaks_the_protocol_of_the_provider_the_export_names(tmp_path, provider, protocol):
    # issue 14 item 6: an export recorded against an Anthropic provider rendered as Chat
    # Completions; a provider of a config file (the corpus's "mock") is OpenAI-compatible
    from pvisor.replay.prepare import PrepareOptions, prepare_only

    doc = json.loads((native_dir() / "opencode" / "real-1.18.33_export_single.json").read_text())
    for m in doc["messages"]:
        if "providerID" in m["info"]:
            m["info"]["providerID"] = provider
        if isinstance(m["info"].get("model"), dict):
            m["info"]["model"]["providerID"] = provider
    src = tmp_path / "export.json"
    src.write_text(json.dumps(doc))
    assert read_native(src, "opencode")[0].trajectory.meta["provider"] == provider
    prepare_only(PrepareOptions(agent="opencode", after_step=1, output=tmp_path / "out", trajectory=src))
    assert json.loads((tmp_path / "out" / "result.json").read_text())["prefix"]["protocol"] == protocol
    # --protocol still wins
    prepare_only(
        PrepareOptions(
            agent="opencode", after_step=1, output=tmp_path / "chat", trajectory=src, protocol="openai-chat"
        )
    )
    assert json.loads((tmp_path / "chat" / "result.json").read_text())["prefix"]["protocol"] == "openai-chat"
