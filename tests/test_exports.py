"""``pvisor journal export --format atif|otel|har|rows|parquet|jsonl`` (issue 20) of runs of the
real Qwen Code (Chat Completions) and Claude Code (Anthropic Messages) captured with the
scripted model (the session's shared captures), each document checked against what it claims
to follow: ATIF and HAR against JSON Schemas written from their specs (tests/schemas/), OTLP
JSON by parsing it into opentelemetry-proto's ExportTraceServiceRequest with the protobuf JSON
mapping (unknown fields refused), Parquet by reading it back with pyarrow; and each against the
journal it came from. The commands run in this process (tests/cli_helpers.py): their exit codes
as a process are test_cli.py's."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import jsonschema
import orjson
import pytest
from agent_helpers import SCRIPT_KEY
from cli_helpers import pvisor_main

from pvisor.journal.reader import JournalReader

ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
SCHEMAS = Path(__file__).parent / "schemas"

pytestmark = pytest.mark.slow  # the captures run real agents (once per test session)


def export(journal: Path, *args: str, out: Path | None = None):
    """``pvisor journal export`` in this process (tests/cli_helpers.py), output as bytes."""
    extra = ["-o", str(out)] if out is not None else []
    return pvisor_main(["--journal", str(journal), "journal", "export", *args, *extra], env=ENV)


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


@pytest.fixture(scope="module")
def qwen(captured):
    cap = captured("qwen-code")
    assert cap.proc.returncode == 0, cap.proc.stderr
    return cap


@pytest.fixture(scope="module")
def claude(captured):
    cap = captured("claude-code")
    assert cap.proc.returncode == 0, cap.proc.stderr
    return cap


def steps_of(journal: Path, run: str) -> list[dict]:
    from pvisor.adapters.journal_trajectory import trajectory_from_journal, trajectory_to_json

    with JournalReader(journal) as r:
        return trajectory_to_json(trajectory_from_journal(r, run))["steps"]


@pytest.mark.parametrize("agent", ["qwen", "claude"])
def test_atif_of_a_journal_run_is_valid_and_holds_its_steps(agent, request, tmp_path):
    cap = request.getfixturevalue(agent)
    out = tmp_path / "run.atif.json"
    proc = export(cap.journal, cap.run, "--format", "atif", out=out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_bytes())
    jsonschema.validate(doc, schema("atif-v1.7.schema.json"))
    steps = steps_of(cap.journal, cap.run)
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert [s["extra"]["pvisor_step"] for s in agent_steps] == [s["n"] for s in steps]
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    for atif_step, step in zip(agent_steps, steps):
        calls = atif_step.get("tool_calls", [])
        assert [c["extra"]["arguments_raw"] for c in calls] == [
            c["arguments_raw"] for c in step["action"]["tool_calls"]
        ]
        results = atif_step.get("observation", {}).get("results", [])
        assert [r.get("source_call_id") for r in results] == [
            r["call_id"] for r in step["observation"]["results"]
        ]
    assert doc["agent"]["name"] == cap.agent and doc["agent"]["version"] == cap.report["agent_version"]
    assert doc["session_id"] == cap.report["session_id"] and doc["extra"]["pvisor_run"] == cap.run
    assert doc["final_metrics"]["total_steps"] == len(doc["steps"])
    # the count said is of the ATIF steps the file holds (system, task and user steps too), not
    # of pvisor's steps; --json says the same count
    n = len(doc["steps"])
    assert n > len(steps) and f"wrote {n} steps to".encode() in proc.stderr, (n, proc.stderr)
    again = tmp_path / "again.atif.json"
    again.write_text("old")
    again.chmod(0o644)
    proc = export(cap.journal, cap.run, "--format", "atif", "--json", out=again)
    assert json.loads(proc.stdout)["count"] == n and json.loads(proc.stdout)["unit"] == "steps"
    # the files hold the run's prompts and code: 0600 whatever the umask, a replaced file too
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and stat.S_IMODE(again.stat().st_mode) == 0o600


def otlp_ids_as_base64(doc: dict) -> dict:
    """OTLP/JSON writes trace and span ids as hex, where the standard protobuf JSON mapping has
    base64 for bytes (the one deviation the OTLP specification documents): hex ids of the right
    length are turned into base64 before parsing; anything else is parsed as it is (strictly:
    an unknown field fails)."""
    import base64

    sizes = {"traceId": 16, "spanId": 8, "parentSpanId": 8}
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key, size in sizes.items():
                    if key in span:
                        raw = bytes.fromhex(span[key])
                        assert len(raw) == size, (key, span[key])
                        span[key] = base64.b64encode(raw).decode()
    return doc


def test_otel_is_otlp_json_with_a_span_per_exchange(qwen, tmp_path):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    with JournalReader(qwen.journal) as r:
        exchanges = r.exchanges(qwen.run)
    for content in (False, True):
        out = tmp_path / f"traces-{content}.jsonl"
        proc = export(
            qwen.journal, qwen.run, "--format", "otel", *(["--with-content"] if content else []), out=out
        )
        assert proc.returncode == 0, proc.stderr
        [line] = out.read_bytes().splitlines()
        msg = json_format.Parse(
            orjson.dumps(otlp_ids_as_base64(json.loads(line))), ExportTraceServiceRequest()
        )
        [rs] = msg.resource_spans
        spans = rs.scope_spans[0].spans
        # the root, one per exchange, one per tool run: step 1's call and step 2's batch of three
        assert len(spans) == len(exchanges) + 1 + 4
        root, children, tools = spans[0], spans[1 : len(exchanges) + 1], spans[len(exchanges) + 1 :]
        assert root.name == "invoke_agent qwen-code" and all(
            s.parent_span_id == root.span_id for s in spans[1:]
        )
        assert all(s.name.startswith("execute_tool ") for s in tools)
        assert len({s.trace_id for s in spans}) == 1 and len(root.trace_id) == 16 and len(root.span_id) == 8
        for span, ex in zip(children, exchanges):
            attrs = {a.key: a.value for a in span.attributes}
            assert attrs["pvisor.exchange.id"].string_value == ex.id
            assert attrs["gen_ai.provider.name"].string_value == "openai"
            assert attrs["http.response.status_code"].int_value == ex.status
            assert span.start_time_unix_nano // 1_000_000 == int(ex.started_ms)
            if ex.role == "main":
                assert attrs["gen_ai.operation.name"].string_value == "chat"
                assert attrs["gen_ai.request.model"].string_value == "mock-model"
            assert len(span.events) == (1 if content else 0)
            if content and ex.role == "main":
                got = {a.key: a.value.string_value for a in span.events[0].attributes}
                # the conventions' messages, not the provider's body (tests/test_otel_genai.py)
                with JournalReader(qwen.journal) as r:
                    sent = orjson.loads(r.request_body(ex))["messages"]
                assert [m["role"] for m in orjson.loads(got["gen_ai.input.messages"])] == [
                    m["role"] for m in sent if m["role"] != "system"
                ]


def test_har_is_valid_and_carries_every_exchange_byte_for_byte(claude, tmp_path):
    out = tmp_path / "run.har"
    proc = export(claude.journal, claude.run, "--format", "har", out=out)
    assert proc.returncode == 0, proc.stderr
    har = json.loads(out.read_bytes())
    jsonschema.validate(har, schema("har-1.2.schema.json"))
    from pvisor._version import __version__

    assert har["log"]["creator"] == {"name": "pvisor", "version": __version__}
    with JournalReader(claude.journal) as r:
        exchanges = r.exchanges(claude.run)
        assert [e["_pvisor"]["exchange"] for e in har["log"]["entries"]] == [ex.id for ex in exchanges]
        for entry, ex in zip(har["log"]["entries"], exchanges):
            assert entry["request"]["postData"]["text"].encode() == r.request_body(ex)
            assert entry["response"]["content"]["text"].encode() == r.response_body(ex, raw=True)
            assert entry["request"]["url"].endswith(ex.path + ("?" + ex.query if ex.query else ""))
    text = out.read_text()
    assert SCRIPT_KEY not in text  # the key the agent sent: only its fingerprint is kept
    sent = [h for e in har["log"]["entries"] for h in e["request"]["headers"] if h["name"] == "x-api-key"]
    assert sent and all(h["value"].startswith("[redacted: fingerprint ") for h in sent)
    bare = tmp_path / "bare.har"
    assert export(claude.journal, claude.run, "--format", "har", "--no-bodies", out=bare).returncode == 0
    entries = json.loads(bare.read_bytes())["log"]["entries"]
    assert all(
        "text" not in e["response"]["content"] and e["request"]["postData"]["text"] == "" for e in entries
    )


def test_rows_jsonl_and_parquet_hold_one_row_per_step(qwen, tmp_path):
    import pyarrow.parquet as pq

    steps = steps_of(qwen.journal, qwen.run)
    out = tmp_path / "rows.jsonl"
    proc = export(qwen.journal, qwen.run, "--format", "rows", out=out)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["step"] for r in rows] == [s["n"] for s in steps] and len(rows) >= 2
    with JournalReader(qwen.journal) as r:
        by_id = {e.id: e for e in r.exchanges(qwen.run)}
        for row, step in zip(rows, steps):
            raw = r.request_body(by_id[row["exchange"]])
            assert row["exchange"] == step["exchange"] and row["prefix"] == orjson.loads(raw)
            # the request's messages as the rows' Chat messages: texts of part lists joined
            sent = orjson.loads(raw)["messages"]
            assert [m["role"] for m in row["prompt"]] == [m["role"] for m in sent]
            assert [m["content"] for m in row["prompt"]] == [
                m["content"]
                if isinstance(m["content"], str)
                else "".join(p["text"] for p in m["content"] or [])
                for m in sent
            ]
            assert row["prompt"][-1]["role"] in ("user", "tool")
            assert row["action"] == step["action"] and row["observation"] == step["observation"]
            assert row["digests"]["prefix_sha256"] == hashlib.sha256(raw).hexdigest()
    # step k's prompt is step k-1's prompt, its completion and its observation: one segment
    assert len(rows[1]["prompt"]) > len(rows[0]["prompt"]) + 1 and rows[1]["prompt"][
        : len(rows[0]["prompt"]) + 1
    ] == [*rows[0]["prompt"], rows[0]["completion"]]
    assert [(r["segment"], r["segment_break"]) for r in rows] == [(0, None)] * len(rows)
    pq_out = tmp_path / "rows.parquet"
    proc = export(qwen.journal, qwen.run, "--format", "parquet", out=pq_out)
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(pq_out)
    back = table.to_pylist()
    assert [b["step"] for b in back] == [r["step"] for r in rows]
    assert [b["digests"] for b in back] == [r["digests"] for r in rows]
    assert [json.loads(b["prefix"]) for b in back] == [r["prefix"] for r in rows]
    assert [[m["role"] for m in b["prompt"]] for b in back] == [
        [m["role"] for m in r["prompt"]] for r in rows
    ]
    assert [json.loads(b["action"]) for b in back] == [r["action"] for r in rows]
    bare = tmp_path / "bare.jsonl"
    assert export(qwen.journal, qwen.run, "--format", "rows", "--no-bodies", out=bare).returncode == 0
    assert all(json.loads(line)["prefix"] is None for line in bare.read_bytes().splitlines())


def test_jsonl_writes_each_body_once_and_none_with_no_bodies(claude, tmp_path):
    out = tmp_path / "all.jsonl"
    assert export(claude.journal, claude.run, out=out).returncode == 0
    lines = [json.loads(line) for line in out.read_bytes().splitlines()]
    seen: dict[str, dict] = {}
    for line in (x for x in lines if x["type"] == "exchange"):
        for field, sha in (("request", line["request_body"]), ("response", line["response_body"])):
            value = line[field]
            if sha is None:
                assert value is None
            elif sha in seen:
                assert value == {"ref": sha}
            else:
                seen[sha] = value
                got = value["body"].encode() if "body" in value else None
                assert got is not None and hashlib.sha256(got).hexdigest() == sha
    bare = tmp_path / "bare.jsonl"
    proc = export(claude.journal, claude.run, "--no-bodies", "--json", out=bare)
    assert proc.returncode == 0 and json.loads(proc.stdout)["format"] == "jsonl"
    assert all(x.get("request") is None for x in map(json.loads, bare.read_bytes().splitlines()))


def test_bad_export_options_get_one_line_and_no_file(qwen, tmp_path):
    out = tmp_path / "x"
    for args, said in [
        (["--format", "atif"], "--format atif exports one run: give RUN"),
        (["--format", "rows"], "--format rows exports one run"),
        ([qwen.run, "--format", "har", "--with-content"], "--with-content is for --format otel"),
        ([qwen.run, "--format", "atif", "--no-bodies"], "--no-bodies is for jsonl, har, rows and parquet"),
        (["r-nope", "--format", "otel"], "no run 'r-nope'"),
    ]:
        proc = export(qwen.journal, *args, out=out)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and said in err and err.count("\n") == 1, (args, err)
        assert not out.exists() and not Path(f"{out}.tmp").exists()


def test_a_rows_prefix_digest_is_the_prepared_prefix_of_the_step_before(qwen, tmp_path):
    """docs/exports.md: row k's agent_prefix_sha256 is the sha256 of what replay --prepare-only
    --after-step k-1 writes for the same journal run (its recorded bytes)."""
    out = tmp_path / "rows.jsonl"
    assert export(qwen.journal, qwen.run, "--format", "rows", out=out).returncode == 0
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    prep = tmp_path / "prep"
    proc = pvisor_main(
        ["replay", "--agent", "qwen-code", "--journal", str(qwen.journal), "--run", qwen.run,
         "--after-step", "1", "--prepare-only", "--output", str(prep)],
        env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prepared = hashlib.sha256((prep / "prefix.json").read_bytes()).hexdigest()
    # a captured run went upstream as the agent sent it: the context is the agent's request
    assert prepared == rows[1]["digests"]["prefix_sha256"] == rows[1]["digests"]["agent_prefix_sha256"]
    assert rows[1]["agent_prefix"] is None
