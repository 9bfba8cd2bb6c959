"""Rows a trainer reads as they are (issue 41, item 1; docs/exports.md "rows and parquet"): every
row of a journal run of each protocol and of every native corpus file has its prompt, tools and
completion in Chat Completions form, which pvisor's strict openai-chat validator accepts as one
request; usage by the OpenTelemetry GenAI counts; segments that break where the agent compacted
and nowhere else; Parquet read back by pyarrow and DuckDB equal to the JSON rows; bad input
refused with one line. In process, on the corpus (no agent run): the journal runs are the
corpus requests of the real agents recorded into a journal (tests/corpus_runs.py)."""

from __future__ import annotations

import json

import orjson
import pytest
from cli_helpers import pvisor_main
from corpus_runs import record_corpus_runs
from native_helpers import native_dir, opencode_db_from_dump

from pvisor.adapters.exports.chat_rows import chain_form, chat_request
from pvisor.adapters.exports.rows import iter_rows
from pvisor.adapters.native import read_native
from pvisor.adapters.protocols.validate import validate_request
from pvisor.journal.reader import JournalReader
from pvisor.replay.native_rows import iter_native_rows

#: the native corpus file whose agent compacted its history (Codex ``compacted`` lines) after
#: these steps, and the rows that start a segment for it (step 5 is a gap: the file lost its reply)
COMPACTED = "codex/agent-sessions_schema_coverage.jsonl"
COMPACTED_BREAKS = [
    (5, "compaction"),
    (6, "no_completion"),
    (7, "compaction"),
    (8, "compaction"),
    (9, "compaction"),
]


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("rows") / "j.sqlite"
    record_corpus_runs(corpus, path)
    return path


def _journal_rows(journal) -> dict[str, list[dict]]:
    with JournalReader(journal) as r:
        return {run.id: list(iter_rows(r, run.id, bodies=False)) for run in r.runs()}


def _native_rows(tmp_path) -> dict[str, list[dict]]:
    out = {}
    for p in sorted(native_dir().glob("*/*")):
        if p.name == "PROVENANCE.md":
            continue
        path = opencode_db_from_dump(p, tmp_path / "opencode.db") if p.name.endswith("db-dump.json") else p
        result, notes = read_native(path)
        agent = result.agent or notes[0].split(": ", 1)[1]
        out[f"{p.parent.name}/{p.name}"] = list(iter_native_rows(result, agent))
    return out


def _check_row(where: str, row: dict) -> None:
    """The row's prompt + completion + tools as one Chat request pass the strict validator, and
    the messages hold only the documented keys (no provider marker, no signature)."""
    body = chat_request(row["model"] or "m", row["prompt"], row["tools"], row["completion"])
    assert validate_request("openai-chat", body) == [], (where, row["step"])
    keys = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id"}
    for m in [*row["prompt"], row["completion"]]:
        assert set(m) <= keys, (where, m)
        assert "cache_control" not in orjson.dumps(m).decode() or "cache_control" in (m["content"] or "")
    assert row["completion"]["role"] == "assistant"
    assert all(
        t["type"] == "function" and set(t["function"]) == {"name", "description", "parameters"}
        for t in row["tools"]
    )
    assert all(set(d) == {"name", "kind"} for d in row["tools_dropped"])


def test_the_rows_of_a_journal_run_of_every_protocol_pass_the_strict_chat_validator(corpus_journal):
    runs = _journal_rows(corpus_journal)
    protocols = set()
    for run, rows in runs.items():
        assert rows, run
        for row in rows:
            _check_row(run, row)
            protocols.add(row["protocol"])
            assert row["tools_absent"] is False and row["tools"], (run, row["step"])
            assert row["prompt"][-1]["role"] in ("user", "tool")
        # runs that never compact: one segment each, but OpenCode and Qwen Code send each call
        # back re-serialised (JSON.stringify: compact), another text than the model's spaced JSON
        breaks = {r["segment_break"] for r in rows[1:]}
        reserialise = rows[0]["agent"] in ("opencode", "qwen-code")
        assert breaks == ({"arguments_reserialised"} if reserialise else {None}), run
    assert protocols == {"anthropic", "openai-chat", "openai-responses", "gemini"}
    # Codex's namespace and server tools have no function form: listed, not sent
    codex = next(rows for rows in runs.values() if rows[0]["agent"] == "codex")
    assert {"name": "web_search", "kind": "web_search"} in codex[0]["tools_dropped"]


def test_a_rows_completion_is_the_next_rows_prompt_message(corpus_journal):
    for run, rows in _journal_rows(corpus_journal).items():
        for before, row in zip(rows, rows[1:]):
            n = len(before["prompt"])
            assert row["prompt"][:n] == before["prompt"], (run, row["step"])
            # the completion is the assistant message the agent sent back (arguments compared
            # parsed: OpenCode re-serialises them)
            assert chain_form(row["prompt"][n], parsed=True) == chain_form(
                before["completion"], parsed=True
            ), (
                run,
                row["step"],
            )


def test_the_rows_of_every_native_corpus_file_pass_and_break_only_at_compactions(tmp_path):
    every = _native_rows(tmp_path)
    assert len(every) >= 30
    for where, rows in every.items():
        for row in rows:
            _check_row(where, row)
            assert row["tools_absent"] is (row["tools"] == []), (where, row["step"])
        for before, row in zip(rows, rows[1:]):
            why = row["segment_break"]
            # Gemini CLI sends no earlier thought back: a step after one with reasoning breaks so
            assert why in (None, "compaction", "reasoning_stripped", "no_completion"), (
                where,
                row["step"],
                why,
            )
            assert (why == "no_completion") is (not {"lost_action", "no_reply"}.isdisjoint(before["flags"]))
            if why == "reasoning_stripped":
                assert before["completion"].get("reasoning_content") and row["agent"] == "gemini-cli"
            assert row["segment"] == before["segment"] + (why is not None)
    assert [
        (r["step"], r["segment_break"]) for r in every[COMPACTED] if r["segment_break"]
    ] == COMPACTED_BREAKS
    assert [r["segment"] for r in every[COMPACTED]] == [0, 0, 0, 0, 1, 2, 3, 4, 5]


def test_usage_follows_the_otel_genai_counts_on_a_claude_code_file_with_cache_reads():
    result, _ = read_native(native_dir() / "claude-code" / "spotter_tool_heavy.jsonl")
    rows = list(iter_native_rows(result, "claude-code"))
    cached = [r for r in rows if r["usage_raw"].get("cache_read_input_tokens")]
    assert cached
    for r in cached:
        raw = r["usage_raw"]
        assert r["usage"] == {
            "input_tokens": raw["input_tokens"]
            + raw["cache_read_input_tokens"]
            + raw["cache_creation_input_tokens"],
            "cached_input_tokens": raw["cache_read_input_tokens"],
            "cache_creation_input_tokens": raw["cache_creation_input_tokens"],
            "output_tokens": raw["output_tokens"],
            "reasoning_tokens": None,
        }


def _counts_something(value) -> bool:
    """A positive integer anywhere in ``value`` (Codex nests its counts)."""
    if isinstance(value, dict):
        return any(_counts_something(v) for v in value.values())
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def test_every_native_files_usage_is_read_in_its_own_shape(tmp_path):
    """Codex, Gemini CLI, OpenCode and mini-swe-agent files keep usage in shapes of their own (not
    their protocol's): each row that has usage has its input and output counted, as ATIF's metrics."""
    counted = set()
    for where, rows in _native_rows(tmp_path).items():
        for row in rows:
            if _counts_something(row["usage_raw"]):
                assert row["usage"]["input_tokens"] and row["usage"]["output_tokens"] is not None, (
                    where,
                    row["step"],
                    row["usage_raw"],
                )
                counted.add(row["agent"])
    assert {"claude-code", "codex", "gemini-cli"} <= counted, counted


def test_reasoning_is_text_in_reasoning_content_never_a_signature(tmp_path):
    result, _ = read_native(native_dir() / "gemini-cli" / "agent-history_gemini_with_tool_error.jsonl")
    rows = list(iter_native_rows(result, "gemini-cli"))
    thoughts = [r for r in rows if r["completion"].get("reasoning_content")]
    assert thoughts
    for r in thoughts:
        assert r["completion"]["reasoning_content"] == "".join(p["text"] for p in r["action"]["reasoning"])
    assert "signature" not in orjson.dumps([r["prompt"] + [r["completion"]] for r in rows]).decode().lower()


def _rows_cli(*args) -> list[dict]:
    proc = pvisor_main(["trajectory", "export", *map(str, args), "--format", "rows"])
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_profile_from_gives_a_native_files_rows_their_tools(corpus_journal):
    sample = native_dir() / "qwen-code" / "real-0.24.4_single.jsonl"
    bare = _rows_cli(sample)
    assert bare and all(r["tools"] == [] and r["tools_absent"] for r in bare)
    filled = _rows_cli(sample, "--profile-from", corpus_journal)
    assert all(len(r["tools"]) >= 10 and r["tools_absent"] is False for r in filled)
    # and the system prompt and leading context the file does not store; the steps are the file's
    assert all(r["prompt"][0]["role"] == "system" for r in filled)
    for f, b in zip(filled, bare):
        assert f["prompt"][len(f["prompt"]) - len(b["prompt"]) + 1 :] == b["prompt"][1:]
        assert f["completion"] == b["completion"]


def _as_json_message(m: dict) -> dict:
    """A Parquet message struct as the JSON row's message (absent keys are nulls there)."""
    return {k: v for k, v in m.items() if v is not None or k == "content"}


def test_parquet_rows_read_back_by_pyarrow_and_duckdb_equal_the_json_rows(tmp_path):
    import duckdb
    import pyarrow.parquet as pq

    sample = native_dir() / COMPACTED
    rows = _rows_cli(sample)
    out = tmp_path / "rows.parquet"
    proc = pvisor_main(["trajectory", "export", str(sample), "--format", "parquet"])
    assert proc.returncode == 0, proc.stderr
    out.write_bytes(proc.stdout)
    back = pq.read_table(out).to_pylist()
    duck = duckdb.sql(
        f"SELECT step, prompt, completion, tools, usage, segment, segment_break FROM '{out}' ORDER BY step"
    ).fetchall()
    assert len(back) == len(duck) == len(rows)
    for row, b, d in zip(rows, back, duck):
        for got in (
            b,
            dict(zip(("step", "prompt", "completion", "tools", "usage", "segment", "segment_break"), d)),
        ):
            assert got["step"] == row["step"]
            assert [_as_json_message(m) for m in got["prompt"]] == row["prompt"]
            assert _as_json_message(got["completion"]) == row["completion"]
            assert got["usage"] == row["usage"]
            assert (got["segment"], got["segment_break"]) == (row["segment"], row["segment_break"])
            assert got["tools"] == []
        assert (b["usage_raw"] and json.loads(b["usage_raw"])) == row["usage_raw"] and b[
            "tools_absent"
        ] is True


def test_parquet_tools_read_back_as_chat_tools(corpus_journal, tmp_path):
    from pvisor.adapters.exports.rows import write_parquet
    import pyarrow.parquet as pq

    with JournalReader(corpus_journal) as r:
        run = next(x for x in r.runs() if x.agent == "codex")
        rows = list(iter_rows(r, run.id, bodies=False))
        with (tmp_path / "codex.parquet").open("wb") as f:
            write_parquet(r, run.id, f, bodies=False)
    back = pq.read_table(tmp_path / "codex.parquet").to_pylist()
    for row, b in zip(rows, back):
        tools = [
            {**t, "function": {**t["function"], "parameters": json.loads(t["function"]["parameters"])}}
            for t in b["tools"]
        ]
        assert tools == row["tools"] and b["tools_dropped"] == row["tools_dropped"]


@pytest.mark.parametrize(
    "args, code, line",
    [
        (["NOT_NATIVE"], 65, "no native adapter recognises this file"),
        (["QWEN", "--profile-from", "MISSING"], 2, "--profile-from MISSING: no journal file MISSING"),
        (["QWEN", "--profile-from", "NOT_NATIVE"], 65, "is not a pvisor journal"),
        (
            ["QWEN", "--format", "atif", "--profile-from", "NOT_NATIVE"],
            2,
            "--profile-from is for --format rows and parquet",
        ),
    ],
)
def test_bad_input_is_one_line_and_its_exit_code(tmp_path, args, code, line):
    names = {
        "NOT_NATIVE": str(tmp_path / "notes.txt"),
        "MISSING": str(tmp_path / "none.sqlite"),
        "QWEN": str(native_dir() / "qwen-code" / "real-0.24.4_single.jsonl"),
    }
    (tmp_path / "notes.txt").write_text("hello\n")
    argv = [names.get(a, a) for a in args]
    fmt = [] if "--format" in argv else ["--format", "rows"]
    proc = pvisor_main(["trajectory", "export", argv[0], *fmt, *argv[1:]], text=True)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("pvisor: error:")]
    assert proc.returncode == code and proc.stdout == ""
    assert len(errors) == 1 and line.replace("MISSING", names["MISSING"]) in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # the session's captures of the real agents (shared with tests/test_harbor_atif.py)
def test_the_rows_of_every_real_agents_journal_run_pass_and_stay_one_segment(captured):
    from agent_helpers import AGENTS

    for agent in AGENTS:
        cap = captured(agent)
        with JournalReader(cap.journal) as r:
            rows = list(iter_rows(r, cap.run, bodies=False))
        assert len(rows) >= 2, agent
        for row in rows:
            _check_row(agent, row)
            assert row["tools"] and row["tools_absent"] is False, agent
            assert row["usage"] is None or row["usage"]["input_tokens"] is not None
        assert [(r["segment"], r["segment_break"]) for r in rows] == [(0, None)] * len(rows), agent


def test_a_profile_of_another_agents_run_is_one_line_exit_2(corpus_journal):
    sample = native_dir() / "qwen-code" / "real-0.24.4_single.jsonl"
    spec = f"{corpus_journal}:codex-single"
    proc = pvisor_main(["trajectory", "export", str(sample), "--format", "parquet", "--profile-from", spec])
    errors = [x for x in proc.stderr.decode().splitlines() if x.startswith("pvisor: error:")]
    assert proc.returncode == 2 and proc.stdout == b""  # refused before a Parquet byte
    assert errors == [
        f"pvisor: error: --profile-from {spec}: run codex-single was recorded with agent codex, not qwen-code"
    ]
