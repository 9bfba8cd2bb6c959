"""The requests real agents sent (tests/corpus/requests/*.jsonl) recorded into a real journal as
runs, with the replies the scripted server gave rendered the way a model API sends them.

Each corpus file holds several sessions of one agent (see its PROVENANCE.md); ``RUNS`` says which
lines make up which run and attempt, from the files' own notes (``mode``, timestamps) and what
agents.md says each agent did:

- Codex: a single call and its native resume (attempt 2 extends the chain), then a new session
  with two parallel calls.
- Gemini CLI: the same, plus the session-title ``:generateContent`` sent when the session was
  resumed (attempt 2), whose resumed requests start a new chain.
- mini-swe-agent: single and parallel calls over Chat Completions, one over Anthropic Messages.
- OpenCode: two sessions, each opened by a title request without tools. Line 0 is the recorder's
  own ``GET /v1/models`` (curl), not OpenCode's: it is recorded only where asked for.
- Qwen Code: a single call and its resume (a new chain) with the memory-extraction background
  request, and a session with two parallel calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.gateway.proxy import finalize_response
from pvisor.journal.model import Attempt, Run
from pvisor.journal.writer import Journal

FILES = {
    "codex": "codex-0.171.0.jsonl",
    "gemini-cli": "gemini-cli-0.61.0.jsonl",
    "mini-swe-agent": "mini-swe-agent-2.4.6.jsonl",
    "opencode": "opencode-1.18.33.jsonl",
    "qwen-code": "qwen-code-0.24.4.jsonl",
}

#: run name -> (agent, [(attempt, [line numbers of the file, 0-based])])
RUNS: dict[str, tuple[str, list[tuple[int, list[int]]]]] = {
    "codex-single": ("codex", [(1, [0, 1]), (2, [2, 3])]),
    "codex-parallel": ("codex", [(1, [4, 5])]),
    "gemini-single": ("gemini-cli", [(1, [0, 1]), (2, [2, 3, 4])]),
    "gemini-parallel": ("gemini-cli", [(1, [5, 6])]),
    "mini-single": ("mini-swe-agent", [(1, [0, 1])]),
    "mini-parallel": ("mini-swe-agent", [(1, [2, 3])]),
    "mini-anthropic": ("mini-swe-agent", [(1, [4, 5])]),
    "opencode-single": ("opencode", [(1, [1, 2, 3])]),
    "opencode-parallel": ("opencode", [(1, [4, 5, 6])]),
    "qwen-single": ("qwen-code", [(1, [0, 1]), (2, [4, 5])]),
    "qwen-parallel": ("qwen-code", [(1, [2, 3])]),
}


def corpus_lines(corpus: Path, agent: str) -> list[dict]:
    raw = (corpus / "requests" / FILES[agent]).read_bytes()
    return [orjson.loads(line) for line in raw.split(b"\n") if line.strip()]


@dataclass
class Recorded:
    """One corpus line as recorded: its exchange id, its line number in the file (0-based),
    the line, and the response object the agent got (the final object a non-streamed request
    returns)."""

    exchange: str
    index: int
    line: dict
    final: Any


def reply_final(line: dict) -> tuple[Any, bytes, bool]:
    """(final response object, response bytes as the server sent them, streamed) of a line."""
    path = line["path"]
    body = line["body"]
    mod = protocol_for_path(path)
    if "reply" in line:  # Codex and Gemini CLI lines: the scripted server's reply items/parts
        reply = line["reply"]
        if mod is not None and mod.NAME == "openai-responses":
            final = {
                "id": f"resp_{line['n']:04d}",
                "object": "response",
                "created_at": 0,
                "status": "completed",
                "model": body.get("model"),
                "output": reply["items"],
                "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
            }
        else:
            final = {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": reply["parts"]},
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": 100,
                    "candidatesTokenCount": 20,
                    "totalTokenCount": 120,
                },
                "modelVersion": path.split("/models/")[1].split(":")[0],
            }
        streamed = mod.wants_stream(path, _query(line), body)
        return final, (mod.render_stream(final) if streamed else orjson.dumps(final)), streamed
    response = line["response"]
    if isinstance(response, dict) and "streamed_chunks" in response:
        chunks = response["streamed_chunks"]
        data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        return get_protocol("openai-chat").reassemble([data]).final, data, True
    return response, orjson.dumps(response), False


def _query(line: dict) -> str:
    q = line.get("query") or ""
    return urlencode(q) if isinstance(q, dict) else q


def record_line(journal: Journal, run: str, attempt: int, line: dict, index: int = -1) -> Recorded:
    final, data, streamed = reply_final(line)
    mod = protocol_for_path(line["path"])
    body = line.get("body")
    ex = journal.record_exchange(
        run,
        line["method"],
        line["path"],
        list(line["headers"].items()),
        query=_query(line),
        attempt=attempt,
        protocol=mod.NAME if mod is not None else None,
        status=200,
        response_headers=[("content-type", "text/event-stream" if streamed else "application/json")],
        request_body=orjson.dumps(body) if body is not None else None,
        response_body=data,
        streamed=streamed,
    )
    return Recorded(ex, index, line, final)


def record_corpus_runs(corpus: Path, path: Path, names: list[str] | None = None) -> dict[str, list[Recorded]]:
    """Record the corpus runs ``names`` (default all of :data:`RUNS`) into the journal at
    ``path``; return run name -> its recorded lines in arrival order. The run id is the name."""
    out: dict[str, list[Recorded]] = {}
    with Journal.open(path, finalize=finalize_response) as journal:
        for name in names or list(RUNS):
            agent, attempts = RUNS[name]
            lines = corpus_lines(corpus, agent)
            journal.create_run(Run(id=name, agent=agent))
            out[name] = []
            for n, numbers in attempts:
                journal.start_attempt(Attempt(run=name, n=n))
                for i in sorted(numbers, key=lambda i: lines[i]["ts"]):
                    out[name].append(record_line(journal, name, n, lines[i], i))
                journal.end_attempt(name, n, 0)
        journal.flush()
    return out


def record_cut_codex_run(path: Path, corpus: Path, run: str = "codex-cut") -> str:
    """A journal at ``path`` holding one Codex run cut short after A_1's tool call (the first
    request of the corpus's Codex capture alone, ``corpus``: its directory): no request holds
    O_1, so its boundary has a tool call without a recorded result. Returns the run's id."""
    line = corpus_lines(corpus, "codex")[0]
    with Journal.open(path, finalize=finalize_response) as journal:
        journal.create_run(Run(id=run, agent="codex"))
        journal.start_attempt(Attempt(run=run, n=1))
        record_line(journal, run, 1, line, 0)
        journal.end_attempt(run, 1, 0)
        journal.flush()
    return run
