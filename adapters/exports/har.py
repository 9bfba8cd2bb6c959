"""A journal's exchanges as an HTTP Archive (HAR 1.2, W3C Web Performance WG's "HTTP Archive
(HAR) format", 2012; docs/exports.md "har").

``log``: ``version`` "1.2", ``creator`` pvisor, one ``page`` per run (its id, its creation time,
and in ``_pvisor`` its agent and, for a derived run or a handoff's child, its lineage:
:func:`pvisor.journal.model.run_lineage`), ``entries`` in arrival order. An entry:

- ``pageref`` (the run), ``startedDateTime`` (ISO 8601 UTC), ``time`` (ms, the exchange's whole
  duration), ``timings`` (``send`` 0, ``wait`` until the first response byte, ``receive`` the
  rest; ``blocked``/``dns``/``connect``/``ssl`` -1: not recorded);
- ``request``: method, ``url`` (``http://pvisor.invalid/run/RUN`` + path + query: the gateway's
  address is not recorded, the path is what the agent sent), ``httpVersion`` "HTTP/1.1", the
  headers the journal keeps (secret ones never are; their names with ``[redacted]`` values
  from ``secret_fingerprints``), ``queryString`` (as recorded, secret values redacted),
  ``postData`` with the body as text (a body that is not UTF-8 is base64 in ``_pvisor.body_b64``);
- ``response``: status, headers, ``content`` with the bytes as received as text (an event
  stream is its event text), ``encoding`` "base64" for bytes that are not UTF-8;
- ``_pvisor``: exchange id, attempt, seq, protocol, outcome, error, role, chain, served_by,
  capture, flags, bytes received and delivered (custom fields start with ``_``, as HAR allows).

With ``bodies=False`` the texts are left out (sizes stay).
"""

from __future__ import annotations

import base64
import datetime
from typing import Any, BinaryIO
from urllib.parse import parse_qsl

import orjson

from pvisor.adapters.exports.base import ExportFormat, JournalSource, Option, Settings, Source, Written
from pvisor.core import progress
from pvisor.journal.model import run_lineage
from pvisor.journal.reader import JournalReader

BASE_URL = "http://pvisor.invalid"


def _iso(ms: float) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
        timespec="milliseconds"
    )


def _headers(headers: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for name, value in headers.items():
        for v in value if isinstance(value, list) else [value]:
            out.append({"name": name, "value": str(v)})
    return out


def _content(data: bytes | None, bodies: bool) -> tuple[dict[str, Any], int]:
    size = len(data) if data is not None else 0
    if not bodies or data is None:
        return {}, size
    try:
        return {"text": data.decode("utf-8")}, size
    except UnicodeDecodeError:
        return {"text": base64.b64encode(data).decode(), "encoding": "base64"}, size


def entry(reader: JournalReader, ex: Any, bodies: bool = True) -> dict[str, Any]:
    """The HAR entry of exchange ``ex`` (module docstring)."""
    query = ex.query or ""
    url = f"{BASE_URL}/run/{ex.run}{ex.path}" + (f"?{query}" if query else "")
    req_headers = _headers(ex.request_headers) + [
        {"name": name, "value": f"[redacted: fingerprint {fp}]"}
        for name, fp in ex.secret_fingerprints.items()
    ]
    req_body = reader.request_body(ex)
    req_text, req_size = _content(req_body, bodies)
    mime = str(ex.request_headers.get("content-type") or "application/json")
    post: dict[str, Any] = {"mimeType": mime, "text": ""}
    if req_text.get("encoding") == "base64":
        post["_pvisor"] = {"body_b64": req_text["text"]}
    elif "text" in req_text:
        post["text"] = req_text["text"]
    resp_body = reader.response_body(ex, raw=True)
    content, resp_size = _content(resp_body, bodies)
    total_ms = (ex.ended_us or 0) / 1000
    wait_ms = (ex.first_byte_us / 1000) if ex.first_byte_us is not None else total_ms
    return {
        "pageref": ex.run,
        "startedDateTime": _iso(ex.started_ms),
        "time": round(total_ms, 3),
        "request": {
            "method": ex.method,
            "url": url,
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": req_headers,
            "queryString": [{"name": k, "value": v} for k, v in parse_qsl(query, keep_blank_values=True)],
            "postData": post,
            "headersSize": -1,
            "bodySize": req_size,
        },
        "response": {
            "status": ex.status if ex.status is not None else 0,
            "statusText": "",
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": _headers(ex.response_headers),
            "content": {
                "size": resp_size,
                "mimeType": str(ex.response_headers.get("content-type") or "application/octet-stream"),
                **content,
            },
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": ex.bytes_delivered,
        },
        "cache": {},
        "timings": {
            "blocked": -1,
            "dns": -1,
            "connect": -1,
            "ssl": -1,
            "send": 0,
            "wait": round(wait_ms, 3),
            "receive": round(max(total_ms - wait_ms, 0), 3),
        },
        "_pvisor": {
            "exchange": ex.id,
            "attempt": ex.attempt,
            "seq": ex.seq,
            "protocol": ex.protocol,
            "outcome": ex.outcome,
            "error": ex.error,
            "role": ex.role,
            "chain": ex.chain,
            "served_by": ex.served_by,
            "capture": getattr(ex.capture, "value", ex.capture),
            "flags": list(ex.flags),
            "bytes_received": ex.bytes_received,
            "bytes_delivered": ex.bytes_delivered,
        },
    }


def write_har(
    reader: JournalReader, run_id: str | None, out: BinaryIO, *, bodies: bool = True, version: str = "unknown"
) -> int:
    """Write the HAR of run ``run_id`` (or of every run) to ``out``, one entry at a time;
    returns the number of entries. ``version``: pvisor's, for ``log.creator``. UsageError for an
    unknown run."""
    runs = [reader.run(run_id)] if run_id is not None else reader.runs()
    pages = [
        {
            "startedDateTime": _iso(r.created_ms),
            "id": r.id,
            "title": f"{r.agent or 'run'} {r.id}",
            "pageTimings": {},
            "_pvisor": {"agent": r.agent, **(run_lineage(r) or {})},
        }
        for r in runs
    ]
    head = {"version": "1.2", "creator": {"name": "pvisor", "version": version}, "pages": pages}
    out.write(b'{"log": ' + orjson.dumps(head)[:-1] + b', "entries": [')
    n = 0
    exchanges = [ex for r in runs for ex in reader.exchanges(r.id)]
    with progress.task("exporting", len(exchanges), progress.Unit.EXCHANGES) as task:
        for ex in exchanges:
            out.write((b",\n" if n else b"\n") + orjson.dumps(entry(reader, ex, bodies)))
            n += 1
            task.advance()
    out.write(b"\n]}}\n")
    return n


def write(source: JournalSource, out: BinaryIO, settings: Settings) -> Written:
    """:func:`write_har` of ``source`` with the version of pvisor in ``settings``; counts the entries."""
    return Written(
        write_har(source.reader, source.run_id, out, bodies=settings.bodies, version=settings.version)
    )


FORMAT = ExportFormat(
    name="har",
    describe=dict.fromkeys((Source.RUN, Source.RUNS), "HAR 1.2"),
    write=write,
    unit="entries",
    extension="har",
    reads=frozenset({Option.NO_BODIES}),
)
