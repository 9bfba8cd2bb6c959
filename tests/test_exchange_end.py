"""The seam of an exchange's end (journal/exchange_end.py): one :class:`ExchangeEnd`, built by the
relay, goes unchanged through the writer wire (journal/writer_wire.py) to the writer, which
makes the ``exchanges`` row from it; the writer's messages are a :class:`MessageKind` each, and
a kind none of them knows is refused with one error. Built by hand here, driven through the real
wire, a real writer thread and a real writer process, and compared with what a real gateway on
127.0.0.1 port 0 writes for a real request to the scripted model server."""

from __future__ import annotations

import dataclasses
import http.client
import io
import pickle
import sqlite3
import time
from pathlib import Path

import orjson
import pytest

from pvisor.gateway.finalize import FINALIZER
from pvisor.gateway.proxy import DEFAULT_MAX_RESPONSE_BODY
from pvisor.core.errors import UnavailableError
from pvisor.journal.exchange_end import ExchangeEnd
from pvisor.journal.messages import MessageKind, UnknownMessage
from pvisor.journal.exchange_end import Outcome, ServedBy
from pvisor.journal.model import TRUNCATED_FLAG
from pvisor.journal.producer import PendingExchange
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer_process import WriterMode, open_journal
from pvisor.journal.writer_wire import (
    HEAD,
    WireError,
    apply_inflight,
    decode_exchange,
    encode,
    read_message,
)


def _pending(i: int = 1) -> PendingExchange:
    return PendingExchange(
        id=f"x-seam{i:010x}",
        run="r-seam",
        attempt=2,
        method="POST",
        path="/v1/messages",
        query="beta=true",
        headers=[("x-api-key", "sk-seam-secret-0123456789"), ("content-type", "application/json")],
        protocol="anthropic",
        started_ms=1_700_000_000_000.5,
        t0=time.perf_counter(),
        capture="intercept",
    )


def _every_field(pending: PendingExchange, outcome: Outcome = Outcome.UPSTREAM_RESET) -> ExchangeEnd:
    """An end with every field off its default."""
    return ExchangeEnd(
        pending,
        status=529,
        outcome=outcome,
        error="upstream anthropic connection broke after 12 bytes",
        request_body=b'{"model":"m","messages":[]}',
        request_encoding="identity",
        request_bytes=27,
        response_headers=[("content-type", "text/event-stream"), ("x-request-id", "req_1")],
        response_body=b"event: ping\ndata: {}\n\n",
        streamed=True,
        chunk_timings=[1200, 12, 3400, 10],
        headers_us=1000,
        first_byte_us=1200,
        ended_us=3500,
        bytes_received=40,
        bytes_delivered=22,
        served_by=ServedBy.PLAYBACK,
        flags=("synthetic_end", TRUNCATED_FLAG),
        forwarded_body=b'{"model":"other"}',
        max_body=1 << 20,
    )


def _through_the_wire(message: tuple) -> tuple:
    """``message`` encoded into one frame and read back, as a writer process's child reads it."""
    buffers = encode(message)
    stream = io.BytesIO(b"".join(bytes(b) for b in buffers))
    got = read_message(stream)
    assert got is not None and stream.read() == b""
    return got


def test_an_end_built_by_hand_goes_through_the_wire_unchanged_every_field():
    end = _every_field(_pending())
    defaults = ExchangeEnd(_pending())
    for f in dataclasses.fields(ExchangeEnd):
        if f.name != "pending":  # the sample sets every field: a new one must be set here too
            assert getattr(end, f.name) != getattr(defaults, f.name), f.name
    kind, payload, bodies = _through_the_wire((MessageKind.EXCHANGE, end))
    assert kind is MessageKind.EXCHANGE
    assert decode_exchange(payload, bodies, None) == end
    # the response as the relay's chunk list: one body on the wire, the same bytes at the writer
    chunked = _every_field(_pending(2))
    chunked.response_body = [b"event: ping\n", b"data: {}\n\n"]
    got = decode_exchange(*_through_the_wire((MessageKind.EXCHANGE, chunked))[1:], None)
    assert got.response_body == b"event: ping\ndata: {}\n\n"
    assert dataclasses.replace(got, response_body=chunked.response_body) == chunked


def test_an_exchange_handed_over_in_flight_ends_by_its_id_without_its_request_again():
    """The early handover (SENT_IN_FLIGHT): the request went with the ``inflight`` message as it
    was read; the end names the exchange by its id and the child takes the request it holds."""
    sent = _pending(3)
    sent.request_body = b'{"model":"m","messages":[]}'
    kind, payload, bodies = _through_the_wire((MessageKind.INFLIGHT, sent))
    assert kind is MessageKind.INFLIGHT and sent.persisted and sent.request_stored
    child: dict[str, PendingExchange] = {}
    apply_inflight(child, payload, bodies)
    end = _every_field(sent)
    end.request_body = sent.request_body
    _, payload, bodies = _through_the_wire((MessageKind.EXCHANGE, end))
    assert payload[0] == (sent.id,) and sent.request_body not in bodies
    got = decode_exchange(payload, bodies, child[sent.id])
    assert got.pending is child[sent.id] and got.request_body == sent.request_body
    assert dataclasses.replace(got, pending=sent) == end
    with pytest.raises(WireError, match="ended without having been sent in flight"):
        decode_exchange(payload, bodies, None)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_every_outcome_round_trips_through_the_wire_and_the_writer(tmp_path: Path, outcome: Outcome):
    end = _every_field(_pending(), outcome)
    got = decode_exchange(*_through_the_wire((MessageKind.EXCHANGE, end))[1:], None)
    assert got.outcome is outcome and got == end
    for mode in WriterMode:
        path = tmp_path / f"{mode.value}.sqlite"
        with open_journal(path, mode=mode) as journal:
            journal.end_exchange(
                _every_field(journal.begin_exchange("r-seam", "POST", "/v1/messages", []), outcome)
            )
            journal.flush()
        with JournalReader(path) as r:
            [ex] = r.exchanges("r-seam")
        assert ex.outcome == outcome.value and Outcome(ex.outcome) is outcome, mode


def test_an_unknown_message_kind_is_refused_with_one_clear_error(tmp_path: Path):
    # by the producer's encoder (a programming error)
    with pytest.raises(
        UnknownMessage, match=r"^unknown journal message kind 'bogus' \(the writer knows: run, "
    ):
        encode(("bogus", None))
    # by the child reading a frame another program wrote
    meta = pickle.dumps(("bogus", None), protocol=5)
    with pytest.raises(WireError, match=r"^unknown journal message kind 'bogus' \(the writer knows: run, "):
        read_message(io.BytesIO(HEAD.pack(len(meta), 0) + meta))
    # a writer process that gets one stops with that line (what came before it is committed)
    path = tmp_path / "j.sqlite"
    journal = open_journal(path, mode=WriterMode.PROCESS)
    try:
        journal.record_exchange("r-seam", "GET", "/v1/models", status=200)
        journal.flush()
        with journal._lock:  # a frame no producer call makes, written as the sender writes frames
            journal._append_locked([HEAD.pack(len(meta), 0), meta])
        with pytest.raises(UnavailableError) as err:
            journal.flush()
        assert "journal message not understood: unknown journal message kind 'bogus'" in str(err.value)
    finally:
        journal.close()
    with JournalReader(path) as r:
        assert [e.path for e in r.exchanges("r-seam")] == ["/v1/models"]


# ------------------------------------------------------------------ the row, as the gateway writes it

#: columns that differ between two recordings of the same exchange: its id, times and writer
_OWN = {"id", "started_ms", "headers_us", "first_byte_us", "ended_us", "chunk_timings", "writer_id"}


def _row(path: Path) -> dict:
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        [row] = db.execute("SELECT * FROM exchanges").fetchall()
        return {k: row[k] for k in row.keys() if k not in _OWN}


def _raw_post(url: str, path: str, headers: list[tuple[str, str]], body: bytes) -> tuple[int, bytes]:
    """POST with exactly these headers (http.client adds none)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers:
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("mode", list(WriterMode), ids=lambda m: m.value)
def test_a_writer_given_an_end_writes_the_row_the_gateway_writes(stack, tmp_path: Path, mode: WriterMode):
    upstream = stack.scripted({"turns": [{"text": "hello from the script"}]})
    gw = stack.gateway({"openai": upstream}, run="r-seam")
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    headers = [
        ("Host", gw.url.removeprefix("http://")),
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-seam-secret-0123456789abcdef"),
        ("Content-Length", str(len(body))),
    ]
    status, got = _raw_post(gw.url, "/openai/v1/chat/completions", headers, body)
    assert status == 200 and got.endswith(b"data: [DONE]\n\n")
    stack.drain(gw)
    real = _row(gw.journal_path)
    assert real["response_final"] is not None and real["served_by"] == "upstream"

    # the same exchange, its end built by hand as the relay builds it, to another writer
    path = tmp_path / "by-hand.sqlite"
    with open_journal(path, finalize=FINALIZER, mode=mode) as journal:
        pending = journal.begin_exchange(
            "r-seam", "POST", "/v1/chat/completions", headers, protocol="openai-chat", capture="reverse"
        )
        journal.request_read(pending, body)
        half = len(got) // 2
        journal.end_exchange(
            ExchangeEnd(
                pending,
                status=200,
                outcome=Outcome.OK,
                request_body=body,
                # the upstream's headers as the row shows them (none is secret: kept as they came)
                response_headers=list(orjson.loads(real["response_headers"]).items()),
                response_body=[got[:half], got[half:]],
                streamed=True,
                chunk_timings=[900, half, 1500, len(got) - half],
                headers_us=800,
                first_byte_us=900,
                ended_us=1600,
                bytes_received=len(got),
                bytes_delivered=len(got),
                served_by=ServedBy.UPSTREAM,
                max_body=DEFAULT_MAX_RESPONSE_BODY,
            )
        )
        journal.flush()
    mine = _row(path)
    # a secret's fingerprint is keyed by its journal (meta.fingerprint_key): the same names, each
    # journal its own value
    fps = orjson.loads(mine.pop("secret_fingerprints")), orjson.loads(real.pop("secret_fingerprints"))
    assert list(fps[0]) == list(fps[1]) == ["authorization"]
    assert mine == real
    with JournalReader(path) as mine, JournalReader(gw.journal_path) as theirs:
        [a], [b] = mine.exchanges("r-seam"), theirs.exchanges("r-seam")
        assert mine.response_body(a, raw=True) == theirs.response_body(b, raw=True) == got
        assert mine.request_body(a) == theirs.request_body(b) == body
    assert b"sk-seam-secret" not in path.read_bytes()
