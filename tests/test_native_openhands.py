"""OpenHands V0 event-list trajectories (adapters/native/openhands.py).

Every corpus sample is read and compared with values taken from its raw events here (not
through the adapter). ``harbor_rfc_openhands_trajectory.json`` is an OpenHands event list
(0.58.0, with the system event), the input of Harbor's converter, not ATIF: it is read; an
ATIF document is refused. ``recall`` events stay left out, saying why (the message the model
saw is rendered from templates, not stored). Small inputs written by the tests cover parallel
calls, a call whose observation never came, versions, huge numbers, the damaged-input classes
and bad input a new user might give (an empty file or list, another agent's message list,
JSON Lines, deep nesting): refused naming the file and the shape expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from native_helpers import (
    assert_refused_naming_file_and_shape,
    bad_documents,
    native_dir,
    read_sample,
    refused,
)
from pvisor.adapters.native import read_native
from pvisor.core.errors import BadInputError

OH = native_dir() / "openhands"


def _raw_steps(events: list[dict]) -> tuple[str | None, list[dict]]:
    """(task, steps) from raw events: the agent actions of one ``model_response.id`` are one
    step (an agent ``message`` without tool metadata a step of its own); arguments from the
    response's ``tool_calls``; observations by ``tool_call_metadata.tool_call_id``."""
    task = None
    steps: list[dict] = []
    by_resp: dict[str, dict] = {}
    by_call: dict[str, dict] = {}
    for e in events:
        tcm = e.get("tool_call_metadata")
        if e.get("source") == "user" and e.get("action") == "message":
            if task is None and not steps:
                task = e["args"]["content"]
            else:
                steps[-1]["messages"].append(e["args"]["content"])
        elif e.get("source") == "agent" and e.get("action") not in (None, "system"):
            if not tcm:
                if e["action"] == "message":
                    steps.append({"text": e["args"]["content"], "calls": [], "results": [], "messages": []})
                continue
            resp = tcm["model_response"]
            step = by_resp.get(resp["id"])
            if step is None:
                msg = resp["choices"][0]["message"]
                step = {"text": msg.get("content") or "", "calls": [], "results": [], "messages": []}
                by_resp[resp["id"]] = step
                steps.append(step)
            [tc] = [
                tc for tc in resp["choices"][0]["message"]["tool_calls"] if tc["id"] == tcm["tool_call_id"]
            ]
            step["calls"].append((tc["id"], tcm["function_name"], tc["function"]["arguments"]))
            by_call[tc["id"]] = step
        elif e.get("observation") and tcm and tcm.get("tool_call_id") in by_call:
            by_call[tcm["tool_call_id"]]["results"].append((tcm["tool_call_id"], e["content"]))
    return task, steps


@pytest.mark.parametrize("name", sorted(p.name for p in OH.glob("*.json")))
def test_corpus_sample_matches_its_raw_events(name):
    events, result = read_sample(OH / name, "openhands")
    t = result.trajectory
    task, raw = _raw_steps(events)
    assert t.task == task and len(t.steps) == len(raw)
    for s, r in zip(t.steps, raw):
        assert s.action.text == r["text"]
        assert [(c.id, c.name, c.arguments_raw) for c in s.action.tool_calls] == r["calls"]
        assert [(x.call_id, x.content) for x in s.observation.results] == r["results"]
        assert all(x.is_error is None for x in s.observation.results)  # no error observation in the corpus
        assert [m.parts[0].text for m in s.observation.messages] == r["messages"]
        assert s.flags == []
    # the finish call expects no observation
    assert all(
        not s.observation.results for s in t.steps if [c.name for c in s.action.tool_calls] == ["finish"]
    )
    assert result.diagnostics.codes() == []
    # every event is either read or left out
    read_ids = {
        e["id"]
        for e in events
        if e.get("action") == "system"
        or (e.get("source") == "user" and e.get("action") == "message")
        or (
            e.get("source") == "agent"
            and e.get("action")
            and (e.get("tool_call_metadata") or e["action"] == "message")
        )
        or (e.get("observation") and (e.get("tool_call_metadata") or {}).get("tool_call_id"))
    }
    assert sorted(int(lo.where.split()[1]) for lo in t.left_out) == sorted(
        e["id"] for e in events if e["id"] not in read_ids
    )


def test_harbor_rfc_file_is_openhands_with_system_prompt_tools_and_version():
    events = json.loads((OH / "harbor_rfc_openhands_trajectory.json").read_text())
    assert isinstance(events, list) and "schema_version" not in json.dumps(events[0])[:200]
    result = read_native(OH / "harbor_rfc_openhands_trajectory.json")[0]
    t = result.trajectory
    system = events[0]["args"]
    assert events[0]["action"] == "system"
    assert t.system == system["content"]
    assert [x.name for x in t.tools] == [d["function"]["name"] for d in system["tools"]]
    assert [x.parameters for x in t.tools] == [d["function"]["parameters"] for d in system["tools"]]
    assert (
        t.meta["agent_version"] == system["openhands_version"] == "0.58.0"
        and result.profile.name == "openhands@0.58"
    )
    assert t.model == events[4]["tool_call_metadata"]["model_response"]["model"]
    assert {(lo.where, lo.kind) for lo in t.left_out} == {
        ("event 2", "user/recall"),
        ("event 4", "observation/recall"),
    }


def test_recall_events_are_left_out_saying_the_message_the_model_saw_is_not_stored():
    """The workspace-context recall (event 4) did reach the model, as a user message rendered
    from OpenHands' prompt templates; the file holds its inputs (extras), not that text, and its
    ``content`` is a UI note: so no message is invented, and the left-out entry says why."""
    events = json.loads((OH / "harbor_rfc_openhands_trajectory.json").read_text())
    recall = next(e for e in events if e.get("observation") == "recall")
    assert (
        recall["content"] == "Added workspace context"
        and recall["extras"]["recall_type"] == "workspace_context"
    )
    t = read_native(OH / "harbor_rfc_openhands_trajectory.json")[0].trajectory
    reasons = {lo.kind: lo.reason for lo in t.left_out}
    assert (
        "prompt templates" in reasons["observation/recall"] and "not stored" in reasons["observation/recall"]
    )
    assert "never sent to the model" in reasons["user/recall"]
    seen = [m.parts[0].text for s in t.steps for m in s.observation.messages] + t.meta["task_context"]
    assert recall["content"] not in seen


def test_replay_test_files_have_no_version_and_are_read_by_shape():
    result = read_native(OH / "tests_runtime_trajs_basic.json")[0]
    assert (
        result.trajectory.meta["agent_version"] is None
        and result.trajectory.system is None
        and result.trajectory.tools is None
    )
    assert result.diagnostics.warnings == []


# --------------------------------------------------------------------------- small inputs


def _resp(rid: str, calls: list[tuple[str, str]], content="two calls") -> dict:
    return {
        "id": rid,
        "model": "gpt-x",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": content,
                    "tool_calls": [
                        {
                            "id": cid,
                            "type": "function",
                            "function": {"name": "execute_bash", "arguments": args},
                        }
                        for cid, args in calls
                    ],
                },
            }
        ],
    }


def _events(tmp_path: Path, events: list[dict], version="0.58.0") -> Path:
    head = [
        {
            "id": 0,
            "source": "agent",
            "action": "system",
            "args": {"content": "SYS", "tools": [], "openhands_version": version},
        },
        {"id": 1, "source": "user", "action": "message", "args": {"content": "TASK"}},
    ]
    p = tmp_path / "traj.json"
    p.write_text(json.dumps(head + events))
    return p


def _act(eid: int, resp: dict, cid: str, n: int) -> dict:
    return {
        "id": eid,
        "source": "agent",
        "action": "run",
        "args": {"command": "x"},
        "tool_call_metadata": {
            "function_name": "execute_bash",
            "tool_call_id": cid,
            "model_response": resp,
            "total_calls_in_response": n,
        },
    }


def _obs(eid: int, cause: int, cid: str, content: str, kind="run") -> dict:
    return {
        "id": eid,
        "source": "agent",
        "observation": kind,
        "content": content,
        "cause": cause,
        "extras": {},
        "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": cid},
    }


def test_parallel_calls_results_in_call_order_and_error_observation(tmp_path):
    resp = _resp("r1", [("t1", '{"command":  "a"}'), ("t2", '{"command": "b"}')])
    p = _events(
        tmp_path,
        [
            _act(2, resp, "t1", 2),
            _act(3, resp, "t2", 2),
            _obs(4, 3, "t2", "B failed", kind="error"),
            _obs(5, 2, "t1", "A"),
        ],
    )
    t = read_native(p)[0].trajectory
    [s] = t.steps
    assert [c.arguments_raw for c in s.action.tool_calls] == ['{"command":  "a"}', '{"command": "b"}']
    assert [(r.call_id, r.content, r.is_error) for r in s.observation.results] == [
        ("t1", "A", None),
        ("t2", "B failed", True),
    ]


def test_a_call_whose_observation_never_came_is_interrupted(tmp_path):
    p = _events(tmp_path, [_act(2, _resp("r1", [("t1", "{}")]), "t1", 1)])
    result = read_native(p)[0]
    [s] = result.trajectory.steps
    assert s.flags == ["interrupted"] and [(r.call_id, r.content) for r in s.observation.results] == [
        ("t1", "")
    ]
    assert result.diagnostics.codes() == ["interrupted"]


def test_atif_document_is_refused_as_not_openhands(tmp_path):
    """The OpenHands adapter itself refuses an ATIF document naming it; ``read_native`` with
    ``--agent openhands`` reads it with the ATIF reader (a format read whatever agent wrote it,
    tests/test_native_atif.py), which refuses this one for its empty ``steps``."""
    from pvisor.adapters.native import get_adapter
    from pvisor.adapters.native.diagnostics import Diagnostics

    p = tmp_path / "atif.json"
    p.write_text(
        json.dumps(
            {"schema_version": "ATIF-v1.7", "agent": {"name": "openhands", "version": "0.58.0"}, "steps": []}
        )
    )
    with pytest.raises(BadInputError) as exc:
        get_adapter("openhands").read(p, Diagnostics(str(p)))
    assert "Harbor ATIF" in exc.value.message and str(p) in exc.value.message and exc.value.exit_code == 65
    assert "--agent atif" in exc.value.message
    with pytest.raises(BadInputError) as exc:
        read_native(p, "openhands")
    assert exc.value.message == f"{p}: steps: no steps (a non-empty list is required)"


def test_wrong_format_given_with_agent_is_refused():
    mini = native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json"
    message = refused(mini, "openhands")
    assert (
        str(mini) in message
        and "not a JSON list of events" in message
        and "expected an OpenHands V0 event list" in message
    )
    # a bare list of chat messages (mini-swe-agent's upstream test data) is a list, but not of events
    bare = native_dir() / "mini-swe-agent" / "upstream_test_data_local.traj.json"
    assert "event 0: not an OpenHands event: no `action` or `observation`" in refused(bare, "openhands")


@pytest.mark.parametrize(
    ("content", "says"),
    bad_documents(
        (b"[]", "document: no events (an empty list)"),
        (b"[{}]", "event 0: not an OpenHands event"),
        (b"[1, 2]", "events[0]: an event that is not a JSON object"),
        (b'{"messages": []}', "not a JSON list of events"),
    ),
)
def test_bad_input_is_refused_naming_the_file_and_the_shape_expected(tmp_path, content, says):
    assert_refused_naming_file_and_shape(
        tmp_path / "bad.json", content, "openhands", says, "an OpenHands V0 event list: a JSON array"
    )


def test_huge_numbers_are_read(tmp_path):
    p = _events(
        tmp_path,
        [
            {"id": 10**30, "source": "agent", "action": "message", "args": {"content": "hi"}},
            {"id": 1e300, "source": "agent", "action": "message", "args": {"content": "later"}},
        ],
    )
    result = read_native(p)[0]
    assert [s.action.text for s in result.trajectory.steps] == ["hi", "later"]  # event-id order kept


def test_unknown_major_version_is_refused_naming_the_event(tmp_path):
    with pytest.raises(BadInputError) as exc:
        read_native(_events(tmp_path, [], version="1.0.0"))
    assert "event 0" in exc.value.message and "major 1" in exc.value.message and exc.value.exit_code == 65


def test_newer_minor_version_is_read_with_a_warning(tmp_path):
    result = read_native(_events(tmp_path, [], version="0.62.0"))[0]
    assert result.trajectory.task == "TASK"
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("unverified_profile", "event 0")]


def test_truncated_file_is_refused_naming_it(tmp_path):
    src = (OH / "tests_runtime_trajs_basic.json").read_bytes()
    p = tmp_path / "cut.json"
    p.write_bytes(src[: len(src) - 100])
    with pytest.raises(BadInputError) as exc:
        read_native(p, "openhands")
    assert str(p) in exc.value.message and "not a JSON document" in exc.value.message


def test_invalid_utf8_in_an_observation_becomes_replacement_characters(tmp_path):
    p = _events(tmp_path, [_act(2, _resp("r1", [("t1", "{}")]), "t1", 1), _obs(3, 2, "t1", "A\udcffB")])
    p.write_bytes(p.read_bytes().replace(b"A\\udcffB", b"A\xc3B"))
    result = read_native(p)[0]
    assert result.trajectory.steps[0].observation.results[0].content == "A\ufffdB"
    assert result.diagnostics.codes() == ["invalid_utf8"]


def test_events_are_read_in_id_order_and_a_repeated_id_keeps_the_later_event(tmp_path):
    resp = _resp("r1", [("t1", "{}")])
    p = _events(tmp_path, [_obs(3, 2, "t1", "old"), _act(2, resp, "t1", 1), _obs(3, 2, "t1", "new")])
    result = read_native(p)[0]
    [s] = result.trajectory.steps
    assert [(r.call_id, r.content) for r in s.observation.results] == [("t1", "new")]
    assert [(w.code, w.where) for w in result.diagnostics.warnings] == [("duplicate_record", "event 3")]
