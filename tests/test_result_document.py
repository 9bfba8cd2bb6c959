"""The result document as a record (replay/result.py :class:`ResultDocument`), entered through
the seam: every mode's document is built by the record of a real run (prepare-only of a native
file, ok and refused; replay-only of a recorded run that an agent leaves early; with the real
Codex CLI a replay-only that is ok, one that diverges, and a continuation against a scripted live
model), validates against docs/result-schema.json, and its ``to_json()`` is the result.json the
run wrote, byte for byte, and the document the ``pvisor`` command writes for the same run. Every
field of the record is in the schema, and a field added to the record without it fails here. No
error carries the document: it is returned beside the error."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from agent_helpers import entrypoint, user_env
from native_helpers import native_dir
from replay_helpers import recorded_claude_run

from pvisor.core.errors import PvisorError
from pvisor.replay.prepare import PrepareOptions, prepare, prepare_only
from pvisor.replay.result import (
    ABSENT,
    RESULT_FILE,
    ResultDocument,
    ResultMode,
    ResultPart,
    ResultStatus,
    dump_result,
)
from pvisor.session.replay import ReplayOptions, continue_replay, replay_only

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
PVISOR = Path(sys.executable).with_name("pvisor")
CODEX = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"


# --------------------------------------------------------------------------- the record against the schema


def _object_node(node: dict) -> dict | None:
    """The object schema of ``node`` (a ``oneOf`` of null and an object: the object's)."""
    if node.get("type") == "object" or "properties" in node:
        return node
    for branch in node.get("oneOf", []):
        if branch.get("type") == "object":
            return branch
    return None


def _record_of(hint: str) -> type | None:
    """The record class a field's annotation names (``list[ToolCallRecord]``, ``X | None``)."""
    import pvisor.replay.agent_result
    import pvisor.replay.result

    for name in re.findall(r"[A-Za-z_]+", hint):
        for module in (pvisor.replay.result, pvisor.replay.agent_result):
            cls = getattr(module, name, None)
            if isinstance(cls, type) and issubclass(cls, ResultPart) and dataclasses.is_dataclass(cls):
                return cls
    return None


def missing_from_schema(cls: type, node: dict, where: str = "") -> list[str]:
    """The fields of record ``cls`` (and of the records it holds) that the schema ``node`` has
    no property for, as dotted paths."""
    missing = []
    props = node.get("properties", {})
    for f in dataclasses.fields(cls):
        path = f"{where}{f.name}"
        if f.name not in props:
            missing.append(path)
            continue
        inner = _record_of(f.type if isinstance(f.type, str) else repr(f.type))
        if inner is None:
            continue
        sub = props[f.name]
        sub = sub.get("items", sub) if sub.get("type") == "array" else sub
        if "$ref" in sub:
            sub = SCHEMA["$defs"][sub["$ref"].rsplit("/", 1)[1]]
        obj = _object_node(sub)
        assert obj is not None, f"{path}: the schema has no object for {inner.__name__}"
        missing += missing_from_schema(inner, obj, f"{path}.")
    return missing


def test_every_field_of_the_record_is_in_the_schema():
    assert missing_from_schema(ResultDocument, SCHEMA) == []


def _extended(doc: ResultDocument) -> Any:
    """``doc`` as a record with one more field, ``handoff_note``, that the schema lacks."""
    fields = [(f.name, f.type, dataclasses.field(default=None)) for f in dataclasses.fields(ResultDocument)]
    Extended = dataclasses.make_dataclass(
        "Extended", [*fields, ("handoff_note", "str", dataclasses.field(default="a note"))],
        bases=(ResultPart,), slots=True,
    )  # fmt: skip
    return Extended(**{f.name: getattr(doc, f.name) for f in dataclasses.fields(ResultDocument)})


def test_a_field_added_to_the_record_without_the_schema_fails(tmp_path):
    outcome = prepare(PrepareOptions(agent="codex", after_step=1, output=tmp_path / "o", trajectory=CODEX))
    assert outcome.error is None and outcome.record is not None
    jsonschema.validate(outcome.record.to_json(), SCHEMA)
    bigger = _extended(outcome.record)
    assert missing_from_schema(type(bigger), SCHEMA) == ["handoff_note"]
    assert bigger.to_json()["handoff_note"] == "a note"
    with pytest.raises(jsonschema.ValidationError, match="handoff_note"):
        jsonschema.validate(bigger.to_json(), SCHEMA)


def test_a_field_a_mode_does_not_write_is_left_out_and_none_is_null(tmp_path):
    doc = ResultDocument.start(ResultMode.PREPARE_ONLY, "codex", CODEX, None, None, 1)
    shown = doc.to_json()
    assert "continuation" not in shown and "playback" not in shown and shown["timings_ms"] == {}
    assert "sandbox" not in shown
    assert shown["status"] == "failed" and shown["source"]["kind"] == "native" and shown["prefix"] is None
    assert doc.playback is ABSENT
    live = ResultDocument.start(ResultMode.CONTINUATION, "codex", None, tmp_path / "j", "r-1", 1).to_json()
    assert live["continuation"] is None and live["playback"] is None and live["path_rewrites"] == []
    assert live["sandbox"] is None
    assert list(live)[-14:] == [
        "path_rewrites", "auxiliary", "context_differences", "tool_differences", "divergence",
        "synthetic_end", "agent_run", "playback", "continuation", "sandbox", "plan", "unrecorded",
        "observations", "start_state",
    ]  # fmt: skip
    assert live["plan"] is None and live["unrecorded"] == [] and "plan" not in shown
    assert live["observations"] is None and "observations" not in shown
    assert live["start_state"] is None and "start_state" not in shown


# --------------------------------------------------------------------------- the modes, through the record


def _written(out: Path, record: ResultDocument) -> dict:
    """``record`` validated, and its ``to_json()`` checked against ``out``/result.json's bytes."""
    assert isinstance(record, ResultDocument)
    document = record.to_json()
    jsonschema.validate(document, SCHEMA)
    assert dump_result(document) == (out / RESULT_FILE).read_bytes()
    return document


def _stable(doc: dict, *dirs: Path) -> str:
    """``doc`` without what differs between two runs of the same replay: its timings, its
    directories (named ``dirs`` in order), run, exchange and session ids, digests that hold them."""
    doc = dict(doc, timings_ms=None)
    text = orjson.dumps(doc).decode()
    for i, d in enumerate(dirs):
        text = text.replace(str(d.resolve()), f"DIR{i}").replace(str(d), f"DIR{i}")
    text = re.sub(r"\br-[0-9a-f]{12}\b", "RUN", text)  # derived run ids
    text = re.sub(r"\bx-[0-9a-f]{16}\b", "X", text)  # exchange ids
    return re.sub(r'"(sha256|sha256_before|sha256_after|[a-z_]*_sha256)":"[0-9a-f]{64}"', r'"\1":"H"', text)


def _shape(value: Any) -> Any:
    """The keys of ``value`` in their order, all the way down, with each value's JSON type: what
    two runs of a real agent share (the time it printed, its file's name and ids differ)."""
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", *sorted({repr(_shape(v)) for v in value})]
    return type(value).__name__


def _same_run(a: dict, b: dict) -> None:
    """Two documents of the same replay of a real agent: the same keys in the same order, the
    same mode, status, error codes, boundary, prefix shape and tool calls."""
    assert _shape(a) == _shape(b)
    for doc in (a, b):
        doc["tool_calls"] = [{**c, "call_id": None} for c in doc["tool_calls"]]
    for key in ("mode", "status", "boundary", "replayed_tool_calls", "agent_started", "live_requests"):
        assert a[key] == b[key], key
    assert [e["code"] for e in a["errors"]] == [e["code"] for e in b["errors"]]
    assert (a["prefix"] or {}).get("ends_with") == (b["prefix"] or {}).get("ends_with")
    assert [(c["step"], c["name"]) for c in a["tool_calls"]] == [
        (c["step"], c["name"]) for c in b["tool_calls"]
    ]


def _cli_result(args: list[str], out: Path, cwd: Path, env: dict | None = None) -> tuple[int, dict, dict]:
    """``pvisor ARGS --output OUT --result -``: (exit code, result.json, the document on stdout)."""
    proc = subprocess.run(
        [str(PVISOR), *args, "--output", str(out), "--result", "-"],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=400, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    written = json.loads((out / RESULT_FILE).read_text())
    assert json.loads(proc.stdout) == written
    return proc.returncode, written, json.loads(proc.stdout)


def test_prepare_only_ok_and_refused_through_the_record(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    for n, code in ((2, None), (99, "after_step_out_of_range")):
        api, cli = tmp_path / f"api-{n}", tmp_path / f"cli-{n}"
        outcome = prepare(
            PrepareOptions(agent="codex", after_step=n, output=api, trajectory=CODEX, workspace=ws)
        )
        document = _written(api, outcome.record)
        assert outcome.result == document
        rc, written, _ = _cli_result(
            ["replay", "--prepare-only", "--agent", "codex", "--trajectory", str(CODEX),
             "--after-step", str(n), "--workspace", str(ws)], cli, tmp_path,
        )  # fmt: skip
        assert _stable(written, cli) == _stable(document, api)
        if code is None:
            assert outcome.error is None and rc == 0 and outcome.record.status is ResultStatus.OK
            assert document["prefix"]["ends_with"] == "observation" and document["workspace"]["unchanged"]
            continue
        # refused: the document is returned beside the error, which carries its code, never it
        assert rc == 65 and outcome.record.status is ResultStatus.FAILED and document["prefix"] is None
        assert [e["code"] for e in document["errors"]] == [code]
        assert isinstance(outcome.error, PvisorError) and outcome.error.exit_code == 65
        assert outcome.error.code == code and not hasattr(outcome.error, "result")
        with pytest.raises(PvisorError) as raised:
            prepare_only(
                PrepareOptions(agent="codex", after_step=n, output=api, trajectory=CODEX, workspace=ws)
            )
        assert raised.value.code == code and not hasattr(raised.value, "result")


def test_every_problem_of_a_prepare_only_in_the_returned_record(tmp_path):
    """Several problems found before the source is read (a caller's, a missing workspace, a step
    past the source's): ``prepare()`` returns the record listing them all, in the order usage
    then source, beside one error that says each on a line of its own (exit 2, the first's) and
    carries no document; ``--result -`` prints the same document."""
    from pvisor.core.errors import UsageError
    from pvisor.replay.spec import ReplayProblems

    out, cli = tmp_path / "out", tmp_path / "cli"
    opts = PrepareOptions(
        agent="codex", after_step=99, output=out, trajectory=CODEX, workspace=tmp_path / "nope"
    )
    outcome = prepare(opts, [UsageError("--a-caller's-option: wrong")])
    document = _written(out, outcome.record)
    assert outcome.result == document and outcome.record.status is ResultStatus.FAILED
    assert [e["code"] for e in document["errors"]] == ["usage", "usage", "after_step_out_of_range"]
    assert isinstance(outcome.error, ReplayProblems) and outcome.error.exit_code == 2
    assert len(outcome.error.lines()) == 3 and not hasattr(outcome.error, "result")
    rc, written, _ = _cli_result(
        ["replay", "--prepare-only", "--agent", "codex", "--trajectory", str(CODEX),
         "--after-step", "99", "--workspace", str(tmp_path / "nope")], cli, tmp_path,
    )  # fmt: skip
    assert rc == 2 and [e["code"] for e in written["errors"]] == ["usage", "after_step_out_of_range"]


def _early_agent(tmp: Path) -> Path:
    """An executable that answers ``--version`` like Claude Code and otherwise exits at once."""
    script = tmp / "early-claude"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "2.1.332 (Claude Code)"; exit 0; fi\nexit 3\n'
    )
    script.chmod(0o755)
    return script


def test_a_failed_replay_only_through_the_record(tmp_path):
    journal = tmp_path / "data" / "j.sqlite"
    journal.parent.mkdir()
    recorded = tmp_path / "recorded-ws"
    recorded.mkdir()
    run = recorded_claude_run(journal, recorded)
    agent = _early_agent(tmp_path)
    ws_api, ws_cli = tmp_path / "ws-api", tmp_path / "ws-cli"
    ws_api.mkdir()
    ws_cli.mkdir()
    api, cli = tmp_path / "api", tmp_path / "cli"
    opts = ReplayOptions(
        agent="claude-code", after_step=1, output=api, workspace=ws_api, journal=journal, run=run,
        entrypoint=str(agent), timeout=60,
    )  # fmt: skip
    outcome = replay_only(opts, lambda _m: None)
    document = _written(api, outcome.record)
    assert outcome.result == document and outcome.record.mode is ResultMode.REPLAY_ONLY
    assert document["status"] == "failed" and [e["code"] for e in document["errors"]] == ["agent_ended_early"]
    assert outcome.error is not None and outcome.error.code == "agent_ended_early"
    assert outcome.error.exit_code == 1 and not hasattr(outcome.error, "result")
    rc, written, _ = _cli_result(
        ["--journal", str(journal), "replay", "--replay-only", "--agent", "claude-code", "--run", run,
         "--after-step", "1", "--workspace", str(ws_cli), "--agent-entrypoint", str(agent),
         "--timeout", "60"],
        cli, tmp_path,
    )  # fmt: skip
    assert rc == 1
    assert _stable(written, cli, ws_cli) == _stable(document, api, ws_api)


# --------------------------------------------------------------------------- with the real Codex CLI


def _codex_options(cap, tmp: Path, name: str, n: int, **kw: Any) -> ReplayOptions:
    ws, out = tmp / f"ws-{name}", tmp / f"out-{name}"
    ws.mkdir()
    return ReplayOptions(
        agent="codex", after_step=n, output=out, workspace=ws, journal=cap.journal, run=cap.run,
        entrypoint=str(entrypoint("codex")), timeout=240, **kw,
    )  # fmt: skip


def _codex_cli(cap, tmp: Path, name: str, n: int, *extra: str, env: dict | None = None):
    ws, out = tmp / f"ws-{name}", tmp / f"out-{name}"
    ws.mkdir()
    args = [
        "replay", "--journal", str(cap.journal), "--agent", "codex", "--run", cap.run,
        "--after-step", str(n), "--workspace", str(ws), "--agent-entrypoint", str(entrypoint("codex")),
        "--timeout", "240", *extra,
    ]  # fmt: skip
    rc, written, _ = _cli_result(args, out, tmp, env or user_env(cap.user_home))
    return rc, written, ws, out


@pytest.mark.slow
def test_replay_only_ok_and_diverged_with_codex_through_the_record(captured, tmp_path, monkeypatch):
    cap = captured("codex")
    assert cap.proc.returncode == 0, cap.proc.stderr
    monkeypatch.setenv("HOME", str(cap.user_home))  # as the command's runs: nothing in the user's home
    for name, extra, status in (
        ("ok", {}, "ok"),
        ("other", {"task": "Something else entirely."}, "diverged"),
    ):
        opts = _codex_options(cap, tmp_path, f"api-{name}", 2, **extra)
        outcome = replay_only(opts, lambda _m: None)
        document = _written(opts.output, outcome.record)
        assert document["status"] == status and outcome.result == document
        assert document["lineage"]["mode"] == "replay-only" and document["agent_started"] is True
        if status == "ok":
            assert outcome.error is None and document["prefix"]["ends_with"] == "observation"
            assert document["replayed_tool_calls"] == len(document["tool_calls"]) == 4
            flags = []
        else:
            assert outcome.error.code == "diverged" and outcome.error.exit_code == 1
            assert not hasattr(outcome.error, "result") and document["divergence"]["request"] == 1
            flags = ["--task", extra["task"]]
        rc, written, ws, out = _codex_cli(cap, tmp_path, f"cli-{name}", 2, "--replay-only", *flags)
        assert rc == (0 if status == "ok" else 1)
        _same_run(written, document)


@pytest.mark.slow
def test_a_continuation_with_codex_through_the_record(captured, stack, tmp_path, monkeypatch):
    cap = captured("codex")
    assert cap.proc.returncode == 0, cap.proc.stderr
    script = {
        "model": "live-model",
        "seed": 11,
        "main_chain": "tools",
        "turns": [{"text": "never served"}, {"text": "Live done."}],
    }
    url = stack.scripted(script)
    monkeypatch.setenv("HOME", str(cap.user_home))
    opts = _codex_options(cap, tmp_path, "api", 1, upstream=url, max_steps=1)
    outcome = continue_replay(opts, lambda _m: None)
    document = _written(opts.output, outcome.record)
    assert outcome.error is None and outcome.record.mode is ResultMode.CONTINUATION
    assert document["status"] == "ok" and document["continuation"]["live_steps"] >= 1
    assert document["live_requests"] == len(document["continuation"]["requests"]) >= 1
    assert list(document)[-6:] == [
        "continuation", "sandbox", "plan", "unrecorded", "observations", "start_state",
    ]  # fmt: skip
    url = stack.scripted(script)  # a fresh script for the command's run
    rc, written, ws, out = _codex_cli(cap, tmp_path, "cli", 1, "--upstream", url, "--max-steps", "1")
    assert rc == 0
    _same_run(written, document)
    assert written["continuation"]["ended_by"] == document["continuation"]["ended_by"]
