"""Memory of large and endless responses (issue 35, item 1; docs/gateway.md "Response size"):
the agent gets every byte, the journal keeps the first ``--max-response-body`` of one exchange
and a bounded total across the exchanges in flight, flagged ``truncated``; the gateway and its
writer stay small whatever an upstream sends.

The endless stream runs the real ``pvisor gateway`` command in a process of its own (the
harness of bench/memory.py, whose long version gives docs/reliability.md's figures); the
others run the gateway in the test's loop thread."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web
from gateway_helpers import Gate, http_request, poll

from pvisor.journal.reader import JournalReader


BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import memory  # noqa: E402  (bench/, on the path above)

MIB = 1024 * 1024


def test_endless_stream_keeps_gateway_and_writer_memory_bounded(tmp_path):
    """An upstream stream that never ends (64 KiB events as fast as they are taken) for 2 s,
    through `pvisor gateway --max-response-body 1MiB`: it took the gateway's RSS to 16 GB and
    ended it with exit 69. Now the client gets every byte, exactly, the gateway's and its
    writer's peak RSS stay under 300 MiB each (prlimit at 6 GiB is only a safety net), a second
    session's exchange meanwhile is recorded whole, and the stream is journaled up to the cap
    and flagged truncated."""
    cap = MIB
    out = memory.measure(1, None, 2.0, cap=cap, as_limit=6 << 30, tmp=tmp_path)
    assert out["exit_code"] == 0, out["stderr"]
    (stream,) = out["streams"]
    assert stream["status"] == 200 and stream["first_wrong_event"] is None
    assert stream["received"] > 20 * cap  # the stream ran far past the cap
    assert out["small"]["status"] == 200 and b"chatcmpl-small" in out["small"]["body"]
    assert out["gateway_mib"] < 300, out
    assert out["writer_mib"] < 300, out
    rows = {e["run"]: e for e in memory.journaled(out["journal"])}
    big, small = rows["r-big"], rows["r-second"]
    assert big["flags"] == ["truncated"] and big["outcome"] == "aborted_by_client"
    assert big["body"] == memory.stream_prefix(cap)
    assert big["received"] >= stream["received"] > len(big["body"])
    assert small["outcome"] == "ok" and small["flags"] == [] and b"chatcmpl-small" in small["body"]


def _big_json(size: int) -> bytes:
    return b'{"id":"big","pad":"' + b"y" * (size - 20) + b'"}'


def test_small_cap_truncates_the_journal_never_the_answer(stack):
    """A 3 MiB JSON answer and a 3 MiB stream through a gateway with a 256 KiB cap: the agent
    gets both whole; the journal holds the first 256 KiB of each, flagged truncated, with the
    sizes the upstream sent; an answer within the cap is stored whole and not flagged."""
    body = _big_json(3 * MIB)
    sse = memory.stream_prefix(3 * MIB)

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        if request.query.get("kind") == "small":
            return web.Response(body=b'{"id":"small"}', content_type="application/json")
        if request.query.get("kind") == "stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(0, len(sse), 100_000):
                await resp.write(sse[i : i + 100_000])
            await resp.write_eof()
            return resp
        return web.Response(body=body, content_type="application/json")

    up = stack.raw_upstream(handler)
    cap = 256 * 1024
    gw = stack.gateway({"openai": up.url}, max_response_body=cap)
    for path, expected in (("/v1/chat/completions", body), ("/v1/chat/completions?kind=stream", sse)):
        status, _, got = http_request(gw.url, "POST", path, b'{"model":"m"}')
        assert status == 200 and got == expected, path
    assert http_request(gw.url, "POST", "/v1/chat/completions?kind=small", b"{}")[2] == b'{"id":"small"}'
    with stack.reader(gw) as r:
        exs = r.exchanges(gw.run)
        bodies = [r.response_body(e, raw=True) for e in exs]
    assert [e.flags for e in exs] == [("truncated",), ("truncated",), ()]
    assert [e.outcome for e in exs] == ["ok", "ok", "ok"]
    assert bodies == [body[:cap], sse[:cap], b'{"id":"small"}']
    assert [e.bytes_received for e in exs] == [len(body), len(sse), 14]


def test_total_budget_truncates_journaling_across_exchanges_in_flight(stack):
    """Three answers of 2 MiB in flight at once (each holds after its first MiB until all three
    have begun), a cap of 768 KiB, a total budget of 1 MiB: the agents get every byte; the
    journal keeps at most 1 MiB of the three together, each flagged truncated. Once they
    ended the budget is free again: a fourth answer is kept up to the cap."""
    half = memory.stream_prefix(MIB)
    rest = memory.stream_prefix(2 * MIB)[MIB:]
    begun = 0
    gate = Gate(stack.lt)

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        nonlocal begun
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(half)
        begun += 1
        if begun == 3:
            gate.set()
        if begun <= 3:
            await gate.wait()
        await resp.write(rest)
        await resp.write_eof()
        return resp

    up = stack.raw_upstream(handler)
    cap = 768 * 1024
    gw = stack.gateway({"openai": up.url}, max_response_body=cap, response_budget=MIB)

    async def three() -> list:
        return await asyncio.gather(
            *(
                asyncio.to_thread(http_request, gw.url, "POST", "/v1/chat/completions", b"{}")
                for _ in range(3)
            )
        )

    answers = stack.lt.run(three())
    assert [(a[0], a[2]) for a in answers] == [(200, half + rest)] * 3
    with stack.reader(gw) as r:
        exs = r.exchanges(gw.run)
        kept = [len(r.response_body(e, raw=True) or b"") for e in exs]
    assert len(exs) == 3 and all(e.flags == ("truncated",) for e in exs)
    assert sum(kept) <= MIB and max(kept) <= cap
    assert all(e.bytes_received == 2 * MIB for e in exs)
    assert poll(lambda: gw.gateway.budget.held == 0, "the budget released")
    assert http_request(gw.url, "POST", "/v1/chat/completions", b"{}")[2] == half + rest
    with stack.reader(gw) as r:
        last = r.exchanges(gw.run)[-1]
        assert r.response_body(last, raw=True) == (half + rest)[:cap] and last.flags == ("truncated",)


# =========================================================================== steps, replay, exports


def _truncated_run(path: Path, cut_line: int) -> tuple[str, list[str]]:
    """The corpus run mini-single (two main-loop requests of mini-swe-agent) with the reply of
    request ``cut_line + 1`` journaled in part, as a gateway with a small cap leaves it."""
    import orjson
    from conftest import corpus_dir
    from corpus_runs import corpus_lines, reply_final

    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal.model import Attempt, Run
    from pvisor.journal.writer import Journal

    lines = corpus_lines(corpus_dir(), "mini-swe-agent")[:2]
    ids = []
    with Journal.open(path, finalize=finalize_response) as journal:
        journal.create_run(Run(id="mini-cut", agent="mini-swe-agent"))
        journal.start_attempt(Attempt(run="mini-cut", n=1))
        for i, line in enumerate(lines):
            _, data, streamed = reply_final(line)
            cut = i == cut_line
            ids.append(
                journal.record_exchange(
                    "mini-cut",
                    line["method"],
                    line["path"],
                    list(line["headers"].items()),
                    protocol="openai-chat",
                    status=200,
                    response_headers=[
                        ("content-type", "text/event-stream" if streamed else "application/json")
                    ],
                    request_body=orjson.dumps(line["body"]),
                    response_body=data[: len(data) // 2] if cut else data,
                    bytes_received=len(data),
                    bytes_delivered=len(data),
                    streamed=streamed,
                    flags=("truncated",) if cut else (),
                )
            )
        journal.end_attempt("mini-cut", 1, 0)
        journal.flush()
    return "mini-cut", ids


def test_truncated_reply_flags_its_step_and_prepare_only_refuses_it(tmp_path):
    """A main-loop reply journaled in part flags its step `response_truncated`; prepare-only of
    the boundary that renders A_N from it (N = the last step) is refused with exit 65 and the
    code `response_truncated` in result.json; the boundary before it (request N+1 as the agent
    sent it) still prepares, with the flag as a warning."""
    import json
    import subprocess

    journal = tmp_path / "j.sqlite"
    run, _ = _truncated_run(journal, cut_line=1)
    env_pvisor = [sys.executable, "-m", "pvisor", "--journal", str(journal)]
    steps = subprocess.run([*env_pvisor, "journal", "steps", run, "--json"], capture_output=True, timeout=60)
    assert steps.returncode == 0, steps.stderr
    flags = [s["flags"] for s in json.loads(steps.stdout)["steps"]]
    assert "response_truncated" in flags[1] and "response_truncated" not in flags[0]
    out = tmp_path / "p2"
    proc = subprocess.run(
        [
            *env_pvisor,
            "replay",
            "--prepare-only",
            "--run",
            run,
            "--agent",
            "mini-swe-agent",
            "--after-step",
            "2",
            "--output",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 65, proc.stderr
    assert b"response_truncated" in proc.stderr and b"step 2" in proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert [e["code"] for e in result["errors"]] == ["response_truncated"]
    ok = tmp_path / "p1"
    proc = subprocess.run(
        [
            *env_pvisor,
            "replay",
            "--prepare-only",
            "--run",
            run,
            "--agent",
            "mini-swe-agent",
            "--after-step",
            "1",
            "--output",
            str(ok),
        ],  # fmt: skip
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "response_truncated" not in json.dumps(json.loads((ok / "result.json").read_text())["warnings"])


def test_playback_refuses_a_boundary_across_a_truncated_reply(tmp_path):
    """Playback serves the recorded replies of steps 1..N: one journaled in part cannot be
    served, so replay (and a continuation) refuses every N from its step on."""
    from pvisor.core.errors import BadInputError
    from pvisor.replay.recording import journal_recording

    journal = tmp_path / "j.sqlite"
    run, _ = _truncated_run(journal, cut_line=0)
    try:
        journal_recording(journal, run, "mini-swe-agent", 1, None)
    except BadInputError as exc:
        assert exc.exit_code == 65 and exc.code == "response_truncated", exc.message
        assert "step 1" in exc.message
    else:
        raise AssertionError("playback across a truncated reply was not refused")
    assert journal_recording(journal, run, "mini-swe-agent", 0, None).steps  # N = 0 needs no reply


def test_exports_and_report_show_the_truncated_flag(tmp_path):
    """The HAR export names the exchange's `truncated` flag, the rows export and the report the
    step's `response_truncated`."""
    import json
    import subprocess

    journal = tmp_path / "j.sqlite"
    run, ids = _truncated_run(journal, cut_line=1)
    pv = [sys.executable, "-m", "pvisor", "--journal", str(journal)]
    har = subprocess.run([*pv, "journal", "export", run, "--format", "har"], capture_output=True, timeout=60)
    assert har.returncode == 0, har.stderr
    entries = json.loads(har.stdout)["log"]["entries"]
    assert [e["_pvisor"]["flags"] for e in entries] == [[], ["truncated"]]
    rows = subprocess.run(
        [*pv, "journal", "export", run, "--format", "rows"], capture_output=True, timeout=60
    )
    assert rows.returncode == 0, rows.stderr
    row_flags = [json.loads(line)["flags"] for line in rows.stdout.splitlines() if line.strip()]
    assert "response_truncated" in row_flags[1]
    page = tmp_path / "r.html"
    rep = subprocess.run([*pv, "report", run, "-o", str(page)], capture_output=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    html = page.read_text()
    assert "response_truncated" in html and '"truncated"' in html


# =========================================================================== reassembly under load


def test_writer_reassembles_streams_under_constant_load(tmp_path):
    """Issue 35, item 15: under constant load (an exchange always in flight, new exchanges
    always arriving) the writer reassembled no stream until it stopped: a backlog of 17,400
    after 40 s and seconds to stop. Now streams get their response_final while the load goes
    on, and the backlog stays bounded."""
    import sqlite3
    import time

    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal.reassembly import FINALIZE_BACKLOG
    from pvisor.journal.writer import Journal

    event = (
        b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\ndata: [DONE]\n\n'
    )
    path = tmp_path / "j.sqlite"
    with Journal.open(path, finalize=finalize_response) as journal:
        held = journal.begin_exchange("r-load", "POST", "/v1/chat/completions", [], protocol="openai-chat")
        first = None
        deadline = time.monotonic() + 5.0
        done = False
        while not done and time.monotonic() < deadline:
            for _ in range(20):  # never idle: a message every few milliseconds
                ex = journal.record_exchange(
                    "r-load",
                    "POST",
                    "/v1/chat/completions",
                    protocol="openai-chat",
                    status=200,
                    response_headers=[("content-type", "text/event-stream")],
                    request_body=b"{}",
                    response_body=event,
                    streamed=True,
                )
                first = first or ex
            time.sleep(0.005)
            with sqlite3.connect(path) as db:
                row = db.execute("SELECT response_final FROM exchanges WHERE id = ?", (first,)).fetchone()
            done = row is not None and row[0] is not None
        assert done, "no stream was reassembled while the load went on"
        assert len(journal.reassembly.queue) <= 2 * FINALIZE_BACKLOG
        assert held.id in journal._inflight  # the load was constant: an exchange in flight throughout
        journal.finish_exchange(held, status=200, request_body=b"{}", response_body=b"{}")


def test_writer_leaves_a_stream_over_the_reassembly_limit_to_readers(tmp_path):
    """Reassembling a stream takes several times its size in the writer (a 200 MiB stream took
    it past 800 MiB): one larger than FINALIZE_MAX_BYTES is stored, not reassembled, and a
    reader reassembles it when asked; a small one still gets its response_final."""
    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal.reader import JournalReader
    from pvisor.journal.reassembly import FINALIZE_MAX_BYTES
    from pvisor.journal.writer import Journal

    def chat_stream(size: int) -> bytes:
        event = (
            b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":'
            b'[{"index":0,"delta":{"content":"' + b"x" * 60_000 + b'"},"finish_reason":null}]}\n\n'
        )
        return event * (size // len(event) + 1) + b"data: [DONE]\n\n"

    path = tmp_path / "j.sqlite"
    big = chat_stream(FINALIZE_MAX_BYTES)
    small = chat_stream(1)
    with Journal.open(path, finalize=finalize_response) as journal:
        ids = [
            journal.record_exchange(
                "r-big",
                "POST",
                "/v1/chat/completions",
                protocol="openai-chat",
                status=200,
                response_headers=[("content-type", "text/event-stream")],
                request_body=b"{}",
                response_body=body,
                streamed=True,
            )
            for body in (big, small)
        ]
        journal.flush()
    with JournalReader(path) as r:
        exs = [r.exchange(i) for i in ids]
        assert exs[0].response_final is None and exs[1].response_final is not None
        assert r.response_body(exs[0], raw=True) == big


def test_writer_bounds_reassembly_by_the_decoded_size(tmp_path):
    """A gzip stream small on the wire (about 50 KB) that decodes to 16 MiB: the writer decoded
    it whole and reassembled it in one call (200 MiB decoded took it to 980 MiB and held
    commits for minutes). Now the decoding stops at FINALIZE_MAX_BYTES and the stream is left
    to readers (stored as it came); a small gzip stream is still reassembled."""
    import gzip

    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal.reader import JournalReader
    from pvisor.journal.reassembly import FINALIZE_MAX_BYTES
    from pvisor.journal.writer import Journal

    event = (
        b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"some words "},"finish_reason":null}]}\n\n'
    )
    big = gzip.compress(event * (16 * MIB // len(event)) + b"data: [DONE]\n\n", mtime=0)
    small = gzip.compress(event * 10 + b"data: [DONE]\n\n", mtime=0)
    assert len(big) < 100_000
    path = tmp_path / "j.sqlite"
    with Journal.open(path, finalize=finalize_response) as journal:
        ids = [
            journal.record_exchange(
                "r-gz",
                "POST",
                "/v1/chat/completions",
                protocol="openai-chat",
                status=200,
                response_headers=[("content-type", "text/event-stream"), ("content-encoding", "gzip")],
                request_body=b"{}",
                response_body=body,
                streamed=True,
            )
            for body in (big, small)
        ]
        journal.flush()
    with JournalReader(path) as r:
        exs = [r.exchange(i) for i in ids]
        assert exs[0].response_final is None and exs[1].response_final is not None
        assert r.response_body(exs[0], raw=True) == big
    assert FINALIZE_MAX_BYTES < 16 * MIB  # the limit is on the decoded size, not the 50 KB


def test_truncated_error_body_keeps_no_start_of_an_echoed_key(stack):
    """An error answer that echoes the request's key, cut by the cap inside the key: the whole
    key is never there to redact, so the start of it that the journal would keep is cut too."""
    key = "sk-ant-api03-" + "k" * 40

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        body = b'{"error":{"message":"invalid x-api-key ' + key.encode() + b'"}}'
        return web.Response(status=401, body=body, content_type="application/json")

    up = stack.raw_upstream(handler)
    cut = len(b'{"error":{"message":"invalid x-api-key ') + 20  # inside the key
    gw = stack.gateway({"anthropic": up.url}, max_response_body=cut)
    status, _, got = http_request(gw.url, "POST", "/v1/messages", b"{}", headers={"x-api-key": key})
    assert status == 401 and key.encode() in got  # the agent gets the answer as it came
    with stack.reader(gw) as r:
        (ex,) = r.exchanges(gw.run)
        stored = r.response_body(ex, raw=True) or b""
    assert ex.flags == ("truncated",)
    # the start of the key is cut, or redacted as a key-shaped token: either way none of it stays
    assert stored.startswith(b'{"error":{"message":"invalid x-api-key ')
    assert b"sk-ant" not in stored and b"kkkk" not in stored


def test_pvisor_run_takes_max_response_body(tmp_path):
    """`pvisor run --max-response-body` reaches the gateway it starts: the real Codex
    CLI, answered by the scripted model with a reply longer than the cap, gets it whole and
    finishes; the journal keeps the first 4 KiB of it, flagged, and the step says so. A size
    past SQLite's blob limit is a usage error naming the option."""
    import json

    from agent_helpers import entrypoint, pvisor, user_env

    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    script = {"model": "mock-model", "turns": [{"text": "Done. " + "long words " * 2000}]}
    (tmp_path / "s.json").write_text(json.dumps(script))
    journal = tmp_path / "j.sqlite"
    base = ["--journal", str(journal), "run", "--agent", "codex", "--agent-entrypoint",
            str(entrypoint("codex")), "--script", str(tmp_path / "s.json"),
            "--workspace", str(ws)]  # fmt: skip
    env = user_env(home)
    too_big = pvisor([*base, "--max-response-body", "1GB", "--", "go"], env=env, cwd=tmp_path, timeout=60)
    assert too_big.returncode == 2 and "--max-response-body" in too_big.stderr
    assert "Traceback" not in too_big.stderr
    proc = pvisor(
        [*base, "--max-response-body", "4KiB", "--json", "--", "go"], env=env, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)["run"]
    with JournalReader(journal) as r:
        main = [e for e in r.exchanges(run) if e.role == "main"]
        assert main and all(e.flags == ("truncated",) for e in main)
        assert all(len(r.response_body(e, raw=True) or b"") == 4096 < e.bytes_received for e in main)
    steps = pvisor(["--journal", str(journal), "journal", "steps", run, "--json"], env=env, cwd=tmp_path)
    assert all("response_truncated" in s["flags"] for s in json.loads(steps.stdout)["steps"])


def test_reassembly_backlog_is_bounded_and_said(tmp_path, monkeypatch, caplog):
    """When the writer cannot keep up, its reassembly queue stops at FINALIZE_QUEUE_MAX (here 5,
    with no reassembly under load): the oldest streams are left to readers, which reassemble
    them on demand, and the close says how many, in the log and in an event."""
    import logging

    from pvisor.adapters.chains import read_final_response
    from pvisor.gateway.proxy import finalize_response
    from pvisor.journal import reassembly as reassembly_module
    from pvisor.journal.writer import Journal

    monkeypatch.setattr(reassembly_module, "FINALIZE_QUEUE_MAX", 5)
    monkeypatch.setattr(reassembly_module, "FINALIZE_EVERY_S", 1e9)
    event = (
        b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\ndata: [DONE]\n\n'
    )
    path = tmp_path / "j.sqlite"
    caplog.set_level(logging.WARNING, logger="pvisor.journal")
    with Journal.open(path, finalize=finalize_response) as journal:
        journal.begin_exchange("r-load", "POST", "/v1/chat/completions", [], protocol="openai-chat")
        ids = [
            journal.record_exchange(
                "r-load",
                "POST",
                "/v1/chat/completions",
                protocol="openai-chat",
                status=200,
                response_headers=[("content-type", "text/event-stream")],
                request_body=b"{}",
                response_body=event,
                streamed=True,
            )  # fmt: skip
            for _ in range(12)
        ]
    assert "7 streamed response(s) were not reassembled" in caplog.text
    with JournalReader(path) as r:
        exs = [r.exchange(i) for i in ids]
        assert [e.response_final is None for e in exs] == [True] * 7 + [False] * 5
        final, _ = read_final_response(r, exs[0])  # a reader reassembles it
        assert final["choices"][0]["message"]["content"] == "hi"
    import sqlite3

    with sqlite3.connect(path) as db:
        data = db.execute("SELECT data FROM events WHERE kind = 'reassembly.skipped'").fetchone()
    assert data is not None and '"streams":7' in data[0]
