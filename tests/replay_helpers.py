"""A small recorded Claude Code run for the replay tests: written straight into a real journal,
so that playback and the replay CLI can be tried without a capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

TOOLS = [{"name": "Write", "description": "w", "input_schema": {"type": "object"}}]
TASK = "write it"


def recorded_claude_run(
    journal: Path,
    workspace: str | Path,
    run: str = "r-rec",
    version: str = "2.1.300",
    prompt: Any = None,
    file_path: str | None = None,
) -> str:
    """A two-step Claude Code run recorded in ``journal`` (labels ``workspace`` and ``task``):
    A_1 writes ``<workspace>/src/a.py`` by its absolute path (the Write tool), A_2 is text. Both
    replies are streamed; request 2 carries A_1 and its result ``ok``. With ``prompt`` (the
    first user message's content) the run is one ``pvisor gateway`` captured: no task label.
    ``file_path``: the path A_1 writes instead."""
    mod = get_protocol("anthropic")
    call = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "Write",
        "input": {"file_path": file_path or f"{workspace}/src/a.py", "content": "x"},
    }
    first = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "stop_reason": "tool_use",
        "content": [call],
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    last = {**first, "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}
    msgs: list[dict] = [{"role": "user", "content": TASK if prompt is None else prompt}]
    labels = {"workspace": str(workspace)} | ({"task": TASK} if prompt is None else {})
    with Journal.open(journal) as j:
        j.create_run(Run(id=run, agent="claude-code", agent_version=version, labels=labels))
        for reply in (first, last):
            body = {"model": "claude-x", "system": "s", "tools": TOOLS, "messages": msgs, "stream": True}
            j.record_exchange(
                run,
                "POST",
                "/v1/messages",
                [("content-type", "application/json")],
                protocol="anthropic",
                status=200,
                request_body=orjson.dumps(body),
                response_body=mod.render_stream(reply),
                streamed=True,
                response_headers=[("content-type", "text/event-stream")],
            )
            msgs = msgs + [
                {"role": "assistant", "content": reply["content"]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
                },
            ]
    return run


def send_line(gw, line: dict, body: Any = None):
    """Send a corpus request line (method, path, query, body; ``body`` instead of the line's
    when given) to the running gateway ``gw``; returns (status, headers, body) as
    :func:`gateway_helpers.http_request` does."""
    from gateway_helpers import http_request

    data = orjson.dumps(body if body is not None else line["body"])
    q = line.get("query") or ""
    q = "&".join(f"{k}={v}" for k, v in q.items()) if isinstance(q, dict) else q
    return http_request(
        gw.url,
        line["method"],
        line["path"] + (f"?{q}" if q else ""),
        data,
        headers={"Content-Type": "application/json"},
    )
