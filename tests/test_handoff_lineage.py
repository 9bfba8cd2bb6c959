"""A handoff's child run carries its lineage (issue 38): the parent run, the pause (steps kept and
the pause's transition), the digest of the pause's snapshot, the agent it was handed from and
the agent it went to. ``pvisor journal show`` says so, the HTML report names it (and the
parent's page lists its child runs), and every export of a run that holds run-level metadata
carries it in the format's own place: the jsonl run line, ATIF's root ``extra``, the OTel root
span's ``pvisor.run.*`` attributes, the HAR page's ``_pvisor``, the rows' ``lineage`` column.

The child run is written straight into a journal with the real writer (no agent runs): a Qwen
Code parent of two shell steps, handed after step 2 to mini-swe-agent, whose child run holds
the two re-enacted steps and one of its own."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jsonschema
import orjson
import pytest
import test_report
from cli_helpers import pvisor_main
from test_exports import otlp_ids_as_base64, schema

from pvisor.journal.model import Run, RunMode
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
#: headless Chromium, as tests/test_report.py drives it
browser = test_report.browser

PARENT = "r-parent0000a"
CHILD = "r-child00000b"
NATIVE_CHILD = "r-native0000c"
OTHER = "r-replay0000d"
DIGEST = hashlib.sha256(b"the pause's manifest").hexdigest()
LINEAGE = {
    "mode": "handoff",
    "parent_run": PARENT,
    "boundary_step": 2,
    "pause_transition": 1,
    "workspace_snapshot": DIGEST,
    "handoff_from_agent": "qwen-code",
    "handoff_to_agent": "mini-swe-agent",
}


def _chat_run(j: Journal, run: str, tool: str, outputs: list[str]) -> None:
    """A Chat Completions run: one shell call per output, each result that output, then "done"."""
    spec = {"type": "function", "function": {"name": tool, "parameters": {"type": "object"}}}
    messages: list[dict] = [{"role": "user", "content": "count"}]
    for i in range(len(outputs) + 1):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": tool, "arguments": f'{{"command":"echo {i}"}}'},
        }
        message = (
            {"role": "assistant", "content": None, "tool_calls": [call]}
            if i < len(outputs)
            else {"role": "assistant", "content": "done"}
        )
        reply = {
            "id": f"c{i}",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        j.record_exchange(
            run,
            "POST",
            "/v1/chat/completions",
            [],
            protocol="openai-chat",
            status=200,
            request_body=orjson.dumps({"model": "m", "messages": messages, "tools": [spec]}),
            response_body=orjson.dumps(reply),
        )
        if i < len(outputs):
            messages = [
                *messages,
                message,
                {"role": "tool", "tool_call_id": f"call_{i}", "content": outputs[i]},
            ]


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    """The parent, its handoff child, a handoff child from a native file (no parent run in the
    journal) and a plain replay-only run of the parent."""
    path = tmp_path_factory.mktemp("lineage") / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id=PARENT, agent="qwen-code", created_ms=1_000))
        _chat_run(j, PARENT, "run_shell_command", ["0", "1", "2"])
        j.create_run(
            Run(
                id=CHILD,
                agent="mini-swe-agent",
                created_ms=2_000,
                parent_run=PARENT,
                boundary_step=2,
                mode=RunMode.HANDOFF.value,
                labels={"handoff_from_agent": "qwen-code", "handoff_to_agent": "mini-swe-agent"},
                pause_transition=1,
                workspace_snapshot=DIGEST,
            )
        )
        _chat_run(j, CHILD, "bash", ["0", "1", "2"])
        j.create_run(
            Run(
                id=NATIVE_CHILD,
                agent="codex",
                created_ms=3_000,
                boundary_step=0,
                mode=RunMode.HANDOFF.value,
                labels={
                    "source_kind": "native",
                    "source": "/tmp/qwen-session.jsonl",
                    "handoff_from_agent": "qwen-code",
                    "handoff_to_agent": "codex",
                },
            )
        )
        j.create_run(
            Run(
                id=OTHER,
                agent="qwen-code",
                created_ms=4_000,
                parent_run=PARENT,
                boundary_step=1,
                mode=RunMode.REPLAY_ONLY.value,
            )
        )
        _chat_run(j, OTHER, "run_shell_command", ["0"])
        j.flush()
    return path


def cli(journal: Path, *args: str):
    return pvisor_main(["--journal", str(journal), *args], env=ENV, text=True)


def test_the_lineage_labels_are_those_the_handoff_writes():
    """The exports read the labels the handoff files its child run under."""
    from pvisor.journal.model import HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL
    from pvisor.session.handoff_result import FROM_LABEL, TO_LABEL

    assert (HANDOFF_FROM_LABEL, HANDOFF_TO_LABEL) == (FROM_LABEL, TO_LABEL)


def test_journal_show_names_parent_pause_snapshot_and_agents(journal):
    shown = cli(journal, "journal", "show", CHILD)
    assert shown.returncode == 0, shown.stderr
    assert f"  handed off from {PARENT} after step 2 (transition 1), workspace snapshot {DIGEST[:12]}" in (
        shown.stdout
    )
    assert "  handed from agent qwen-code to agent mini-swe-agent\n" in shown.stdout
    # a handoff from a native file names the file, never "None"
    native = cli(journal, "journal", "show", NATIVE_CHILD)
    assert native.returncode == 0, native.stderr
    assert "  handed off from the native file /tmp/qwen-session.jsonl after step 0; pending" in native.stdout
    assert "None" not in native.stdout and "handed from agent qwen-code to agent codex" in native.stdout
    # a parent lists what was derived from it
    parent = cli(journal, "journal", "show", PARENT)
    assert f"  child run {CHILD}: handoff, mini-swe-agent, after step 2 (transition 1)\n" in parent.stdout
    assert f"  child run {OTHER}: replay-only, qwen-code, after step 1\n" in parent.stdout
    ls = json.loads(cli(journal, "journal", "ls", "--json").stdout)
    [row] = [r for r in ls if r["id"] == CHILD]
    assert (row["parent_run"], row["boundary_step"], row["pause_transition"]) == (PARENT, 2, 1)


def test_report_document_holds_the_lineage_and_the_children(journal):
    from pvisor.adapters.exports.report_document import run_document

    with JournalReader(journal) as r:
        child = run_document(r, CHILD)
        parent = run_document(r, PARENT)
    assert child["run"]["lineage"] == LINEAGE
    assert parent["run"]["lineage"] is None
    assert parent["children"] == [
        {
            "id": CHILD,
            "mode": "handoff",
            "agent": "mini-swe-agent",
            "boundary_step": 2,
            "pause_transition": 1,
        },
        {
            "id": OTHER,
            "mode": "replay-only",
            "agent": "qwen-code",
            "boundary_step": 1,
            "pause_transition": None,
        },
    ]


def test_the_report_page_names_the_handoff_and_the_parent_lists_it(browser, journal, tmp_path):
    page = tmp_path / "child.html"
    p = cli(journal, "report", CHILD, "-o", str(page))
    assert p.returncode == 0, p.stderr
    test_report.open_page(browser, page, "report-handoff-child")
    lineage = browser.find_element("id", "parent").text
    assert lineage == (
        f"handed off from {PARENT} at the pause after step 2 (transition 1), "
        f"workspace snapshot {DIGEST[:12]}, qwen-code → mini-swe-agent"
    ), lineage
    assert browser.find_element("id", "parent").get_attribute("title") == f"workspace snapshot {DIGEST}"
    assert browser.find_element("id", "boundary").text == (
        "boundary: the pause after step 2, request 3 ends at the re-enacted observation O″2"
    )
    browser.find_element("id", "parent-link").click()
    assert browser.find_element("css selector", "h1").text.endswith(PARENT)
    children = test_report.texts(browser, "#children li")
    assert children == [
        f"{CHILD} handoff · mini-swe-agent · after step 2 (transition 1)",
        f"{OTHER} replay-only · qwen-code · after step 1",
    ], children
    # the child's page is linked: it was just written; the other child's page was not
    link = browser.find_element("css selector", f"#children a[data-run='{CHILD}']")
    assert link.get_attribute("href").endswith("/child.html")
    assert browser.find_elements("css selector", f"#children a[data-run='{OTHER}']") == []
    link.click()
    assert browser.find_element("css selector", "h1").text.endswith(CHILD)
    # a handoff from a native file: the file, no link
    native = tmp_path / "native.html"
    assert cli(journal, "report", NATIVE_CHILD, "-o", str(native)).returncode == 0
    test_report.open_page(browser, native, "report-handoff-native")
    assert browser.find_element("id", "parent").text == (
        "handed off from the native file /tmp/qwen-session.jsonl at the pause after step 0, qwen-code → codex"
    )
    assert browser.find_elements("id", "parent-link") == []


def export(journal: Path, run: str, fmt: str, out: Path) -> None:
    p = pvisor_main(
        ["--journal", str(journal), "journal", "export", run, "--format", fmt, "-o", str(out)], env=ENV
    )
    assert p.returncode == 0, p.stderr


def test_every_export_with_run_metadata_carries_the_lineage(journal, tmp_path):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    import pyarrow.parquet as pq

    # jsonl: the run line holds every column of runs
    export(journal, CHILD, "jsonl", tmp_path / "run.jsonl")
    first = json.loads((tmp_path / "run.jsonl").read_bytes().splitlines()[0])
    assert first["type"] == "run"
    assert {k: first["labels"].get(k, first.get(k)) for k in LINEAGE} == LINEAGE
    # ATIF: the root extra
    export(journal, CHILD, "atif", tmp_path / "run.atif.json")
    atif = json.loads((tmp_path / "run.atif.json").read_bytes())
    jsonschema.validate(atif, schema("atif-v1.7.schema.json"))
    assert {k: atif["extra"][k] for k in LINEAGE} == LINEAGE
    # OTel: the root span's pvisor.run.* attributes (the parent as pvisor.run.parent, as before)
    export(journal, CHILD, "otel", tmp_path / "traces.jsonl")
    [line] = (tmp_path / "traces.jsonl").read_bytes().splitlines()
    msg = json_format.Parse(orjson.dumps(otlp_ids_as_base64(json.loads(line))), ExportTraceServiceRequest())
    root = msg.resource_spans[0].scope_spans[0].spans[0]
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["pvisor.run.mode"].string_value == "handoff"
    assert attrs["pvisor.run.parent"].string_value == PARENT
    assert attrs["pvisor.run.boundary_step"].int_value == 2
    assert attrs["pvisor.run.pause_transition"].int_value == 1
    assert attrs["pvisor.run.workspace_snapshot"].string_value == DIGEST
    assert attrs["pvisor.run.handoff_from_agent"].string_value == "qwen-code"
    assert attrs["pvisor.run.handoff_to_agent"].string_value == "mini-swe-agent"
    # HAR: the run's page, in a custom field
    export(journal, CHILD, "har", tmp_path / "run.har")
    har = json.loads((tmp_path / "run.har").read_bytes())
    jsonschema.validate(har, schema("har-1.2.schema.json"))
    [page] = har["log"]["pages"]
    assert page["_pvisor"] == {"agent": "mini-swe-agent", **LINEAGE}
    # rows and Parquet: a lineage column on every row (null for a run that derives from nothing)
    export(journal, CHILD, "rows", tmp_path / "rows.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_bytes().splitlines()]
    assert len(rows) == 4 and all(r["lineage"] == LINEAGE for r in rows)
    export(journal, CHILD, "parquet", tmp_path / "rows.parquet")
    assert [b["lineage"] for b in pq.read_table(tmp_path / "rows.parquet").to_pylist()] == [LINEAGE] * 4
    export(journal, PARENT, "rows", tmp_path / "parent.jsonl")
    assert all(
        json.loads(x)["lineage"] is None for x in (tmp_path / "parent.jsonl").read_bytes().splitlines()
    )
    export(journal, PARENT, "parquet", tmp_path / "parent.parquet")
    assert [b["lineage"] for b in pq.read_table(tmp_path / "parent.parquet").to_pylist()] == [None] * 4
