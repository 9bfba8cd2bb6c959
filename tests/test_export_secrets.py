"""Exports meant to be shared carry no key-shaped token (issue 41 fixes; docs/exports.md
"Secrets"): the journal keeps request bodies as sent, so a key a user pasted into a prompt, one
in a file the agent read (a tool result), in tool arguments or in a tool description reaches
rows, Parquet, ATIF, OTel with content and the report unless their writers replace it; so do
the rows, Parquet, ATIF and JSON of a native file. ``jsonl`` stays an exact copy. The CLI runs
in process against a journal written by the real writer and a real Codex rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from native_helpers import native_dir

from cli_inprocess import pvisor
from pvisor.journal.model import Run
from pvisor.journal.redact import redact_document
from pvisor.journal.writer import Journal

K1 = "sk-ant-api03-" + "A" * 40 + "-" + "B" * 20 + "AA"
K2 = "sk-proj-" + "C" * 48
K3 = "AKIA" + "ABCDEFGHIJKLMNOP"
KEYS = (K1, K2, K3)
CODEX_ROLLOUT = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"


def _reply(msg: dict) -> bytes:
    choice = {"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1}
    return json.dumps(
        {"id": "r", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
    ).encode()


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sec") / "j.sqlite"
    fn = {"name": "bash", "description": "run " + K3, "parameters": {"type": "object", "properties": {}}}
    tools = [{"type": "function", "function": fn}]
    msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "use key " + K1}]
    args = json.dumps({"command": f"curl -H 'x-api-key: {K2}'"})
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": args}}
    a1 = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "OPENAI_API_KEY=" + K2}
    with Journal.open(path) as j:
        j.create_run(Run(id="sec", agent="mini-swe-agent", agent_version="2.4.6"))
        done = {"role": "assistant", "content": "done " + K1}
        for body, reply in (
            ({"model": "m", "messages": msgs, "tools": tools}, _reply(a1)),
            ({"model": "m", "messages": [*msgs, a1, result], "tools": tools}, _reply(done)),
        ):
            j.record_exchange(
                "sec", "POST", "/v1/chat/completions", [("content-type", "application/json")],
                protocol="openai-chat", status=200, request_body=json.dumps(body).encode(),
                response_body=reply,
            )  # fmt: skip
    return path


def _text(path: Path) -> str:
    if path.suffix == ".parquet":
        return json.dumps(pq.read_table(path).to_pylist(), default=str)
    return path.read_text()


@pytest.mark.parametrize(
    "args",
    [
        ("journal", "export", "sec", "--format", "rows", "-o", "x.jsonl"),
        ("journal", "export", "sec", "--format", "rows", "--no-bodies", "-o", "x.jsonl"),
        ("journal", "export", "sec", "--format", "parquet", "--no-bodies", "-o", "x.parquet"),
        ("journal", "export", "sec", "--format", "atif", "-o", "x.json"),
        ("journal", "export", "sec", "--format", "otel", "--with-content", "-o", "x.json"),
        ("report", "sec", "-o", "x.html"),
    ],
    ids=["rows", "rows-no-bodies", "parquet", "atif", "otel", "report"],
)
def test_a_shared_export_of_a_run_holds_no_key(journal, capsysbinary, tmp_path, args):
    out = tmp_path / args[-1]
    code, _, err = pvisor(capsysbinary, "--journal", str(journal), *args[:-1], str(out))
    assert code == 0, err
    text = _text(out)
    assert not [k for k in KEYS if k in text] and "REDACTED" in text


def test_jsonl_stays_an_exact_copy_with_the_bodies_as_stored(journal, capsysbinary):
    code, out, err = pvisor(capsysbinary, "--journal", str(journal), "journal", "export", "sec")
    assert code == 0 and K1 in out.decode(), err


@pytest.mark.parametrize("fmt", ["rows", "parquet", "atif", "json"])
def test_a_native_export_holds_no_key(capsysbinary, tmp_path, fmt):
    native = tmp_path / "rollout.jsonl"
    text = CODEX_ROLLOUT.read_text()
    assert "Please create out.txt" in text and '"output":"Chunk I' in text
    text = text.replace("Please create out.txt", f"Please use {K1} to create out.txt")
    native.write_text(text.replace('"output":"Chunk I', f'"output":"{K2} Chunk I'))
    out = tmp_path / f"x.{fmt}"
    code, _, err = pvisor(capsysbinary, "trajectory", "export", str(native), "--format", fmt, "-o", str(out))
    assert code == 0, err
    got = _text(out.with_suffix(".parquet") if fmt == "parquet" else out)
    assert K1 not in got and K2 not in got and "REDACTED" in got


def test_redact_document_keeps_what_holds_no_key_as_it_is():
    doc = {"a": ["plain text " * 40, 50, None, {"k": "100% sure"}], "b": ("x",)}
    assert redact_document(doc) is doc
    hit = {"a": ["plain " * 60 + K2], K3: 1, "n": 2}
    assert redact_document(hit) == {"a": ["plain " * 60 + "REDACTED"], "REDACTED": 1, "n": 2}
    assert hit["a"][0].endswith(K2)  # the document given is not changed
