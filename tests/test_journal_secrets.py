"""Secrets never reach the journal files or an export, in any encoding."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from urllib.parse import quote, quote_plus

import orjson
from secret_scan import secret_windows

from pvisor.journal.redact import fingerprint, redact_exchange_meta, redact_url
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

# distinctive fake secrets, one per form
SECRET_HEADERS = {
    "Authorization": "Bearer sk-proj-PVSECRETAUTH0001/+=",
    "x-api-key": "sk-ant-PVSECRETXAPIKEY0002",
    "x-goog-api-key": "AIzaPVSECRETGOOG0003",
    "api-key": "PVSECRETAZURE0004",
    "Proxy-Authorization": "Basic PVSECRETPROXY0005",
    "Cookie": "session=PVSECRETCOOKIE0006; other=1",
    "X-Amz-Security-Token": "PVSECRETAMZTOKEN0007",
    "X-Amz-Date": "PVSECRETAMZDATE0008",
    "x-session-token": "PVSECRETSESSIONTOKEN0009",
}
SECRET_RESPONSE_HEADERS = {"Set-Cookie": "__cf_bm=PVSECRETSETCOOKIE0010; path=/; HttpOnly"}
SECRET_QUERY = {
    "key": "AIzaPVSECRETQUERYKEY0011/+",
    "X-Amz-Signature": "PVSECRETAMZSIG0012",
    "X-Amz-Credential": "PVSECRETAMZCRED0013/20260101/us-east-1",
    "access_token": "PVSECRETACCESSTOKEN0014",
}


def _forms(value: str) -> set[bytes]:
    raw = value.encode()
    forms = {
        raw,
        quote(value, safe="").encode(),
        quote_plus(value).encode(),
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw),
    }
    # the distinctive core, without scheme words such as "Bearer "
    core = value.split(" ", 1)[-1].split("=", 1)[-1].split(";", 1)[0]
    forms |= {core.encode(), base64.b64encode(core.encode()), quote(core, safe="").encode()}
    return {f for f in forms if len(f) >= 8}


def _all_forms() -> set[bytes]:
    out: set[bytes] = set()
    for v in [*SECRET_HEADERS.values(), *SECRET_RESPONSE_HEADERS.values(), *SECRET_QUERY.values()]:
        out |= _forms(v)
    return out


def _query() -> str:
    return "alt=sse&" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in SECRET_QUERY.items())


def _assert_clean(blob: bytes, where: str) -> None:
    for form in _all_forms():
        assert form not in blob, f"secret form {form!r} found in {where}"


def test_no_secret_in_sqlite_wal_shm_or_export(tmp_path: Path):
    jpath = tmp_path / "j" / "journal.sqlite"
    headers = [
        *SECRET_HEADERS.items(),
        ("Content-Type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ]
    with Journal.open(jpath) as j:
        for protocol, path in (
            ("anthropic", "/v1/messages"),
            ("openai-chat", "/v1/chat/completions"),
            ("openai-responses", "/v1/responses"),
            ("gemini", "/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
        ):
            j.record_exchange(
                "r-secret",
                "POST",
                path,
                headers,
                query=_query(),
                protocol=protocol,
                status=200,
                request_body=b'{"messages": []}',
                response_body=b"data: {}\n\n",
                streamed=True,
                response_headers=[*SECRET_RESPONSE_HEADERS.items(), ("request-id", "req_1")],
            )
        # an exchange still in flight at a commit tick is written from its headers too
        pending = j.begin_exchange("r-secret", "POST", "/v1/messages", headers, query=_query())
        j.flush()
        import time

        time.sleep(0.3)
        j.flush()
        for suffix in ("", "-wal", "-shm"):
            f = Path(str(jpath) + suffix)
            _assert_clean(f.read_bytes(), f.name)
        j.finish_exchange(pending, status=200, request_body=b"{}")
    for f in jpath.parent.iterdir():
        _assert_clean(f.read_bytes(), f.name)
    with JournalReader(jpath) as r:
        out = io.BytesIO()
        r.export_jsonl(out)
        _assert_clean(out.getvalue(), "export")
        ex = r.exchanges("r-secret")[0]
        # the redaction kept what replay needs and fingerprints to tell keys apart
        assert ex.request_headers == {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        assert ex.query.startswith("alt=sse&key=REDACTED&")
        assert set(ex.secret_fingerprints) >= {
            "authorization",
            "x-api-key",
            "x-goog-api-key",
            "api-key",
            "cookie",
            "?key",
            "response:set-cookie",
        }
        assert all(len(v) == 8 for v in ex.secret_fingerprints.values())
        assert ex.response_headers == {"request-id": "req_1"}


def test_fingerprints_tell_keys_apart_without_revealing_them():
    key = b"k" * 32
    a = redact_exchange_meta("", [("x-api-key", "sk-one")], key).secrets["x-api-key"]
    b = redact_exchange_meta("", [("x-api-key", "sk-two")], key).secrets["x-api-key"]
    assert a != b and a == fingerprint("sk-one", key)
    assert redact_exchange_meta("", [("x-api-key", "sk-one")], b"other").secrets["x-api-key"] != a


def test_redact_url_for_logs():
    url = "http://h/v1beta/models/m:streamGenerateContent?alt=sse&key=AIzaSECRET&x=1#frag"
    assert redact_url(url) == "http://h/v1beta/models/m:streamGenerateContent?alt=sse&key=REDACTED&x=1#frag"
    assert redact_url("http://h/v1/messages") == "http://h/v1/messages"


def test_an_error_response_that_echoes_the_key_is_stored_without_it(tmp_path: Path):
    key = "sk-ant-api03-ECHOED-secret-value-0123456789"
    echoed = (
        b'{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key: '
        + key.encode()
        + b'"}}'
    )
    ok_body = b'{"content":[{"type":"text","text":"the word ' + key.encode() + b'"}]}'
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        bad = j.record_exchange(
            "r1", "POST", "/v1/messages", [("x-api-key", key)], status=401, response_body=echoed
        )
        bearer = j.record_exchange(
            "r1",
            "POST",
            "/v1/chat/completions",
            [("Authorization", "Bearer " + key)],
            status=400,
            response_body=echoed,
        )
        query = j.record_exchange(
            "r1",
            "POST",
            "/v1beta/models/m:generateContent",
            [],
            query="key=" + key,
            status=400,
            response_body=echoed,
        )
        fine = j.record_exchange(
            "r1", "POST", "/v1/messages", [("x-api-key", key)], status=200, response_body=ok_body
        )
    with JournalReader(path) as r:
        for ex_id in (bad, bearer, query):
            body = r.response_body(r.exchange(ex_id), raw=True)
            assert key.encode() not in body and b"invalid x-api-key: <redacted>" in body
        # a success is kept as received
        assert r.response_body(r.exchange(fine), raw=True) == ok_body


# keys in the providers' formats, each with a distinctive body: no 8-byte window of the body may
# reach any file pvisor writes
SHAPED = {
    "semicolon": "AIza" + "SyPvSemiQ8r3Kx7Vm2Zt5Lw9Nc4",
    "encoded_eq": "AIza" + "SyPvEncdT6h1Jq8Bx3Rm7Wk2Fy5",
    "ua": "sk-ant-api03-" + "PvUserAgentKeyQ1w2E3r4T5y6U7i8O9p0AsDf",
    "bearer": "sk-proj-" + "PvSameKeyTwoHeadersZ9x8C7v6B5n4M3",
}
SECRETS_SENT = [  # checked after the module too, in every journal, log and export it made (conftest)
    *SECRET_HEADERS.values(),
    *SECRET_RESPONSE_HEADERS.values(),
    *SECRET_QUERY.values(),
    *SHAPED.values(),
]


def test_keys_in_less_common_places_never_reach_the_journal_the_log_or_an_export(stack, tmp_path: Path):
    """Issue 17, defect 4: a key after a ``;`` separator, behind a percent-encoded ``=``, inside an
    allow-listed header (user-agent, anthropic-beta, x-session-id) was stored in clear. Keys are
    now also found by their shape; the same key as ``Authorization: Bearer K`` and as
    ``x-api-key: K`` has one fingerprint. Checked through a real gateway: journal, WAL, export
    and log file, every 8-byte window of each key."""
    from gateway_helpers import http_request, json_upstream

    up = stack.raw_upstream(json_upstream(b'{"id":"msg_1"}'))
    log = tmp_path / "gw.log"
    gw = stack.gateway({"anthropic": up.url}, log_file=log)
    ua = SHAPED["ua"]
    requests = [
        (f"/v1/messages?beta=true;key={SHAPED['semicolon']}", {}),
        (f"/v1/messages?beta=true&key%3D{SHAPED['encoded_eq']}", {}),
        (
            "/v1/messages",
            {
                "User-Agent": f"claude-cli/2.1 ({ua})",
                "anthropic-beta": f"tools-2024,{ua}",
                "x-session-id": ua,
            },
        ),
        ("/v1/messages", {"Authorization": f"Bearer {SHAPED['bearer']}"}),
        ("/v1/messages", {"x-api-key": SHAPED["bearer"]}),
    ]
    for target, headers in requests:
        assert http_request(gw.url, "POST", target, b'{"model":"m"}', headers=headers)[0] == 200
    stack.drain(gw)
    with stack.reader(gw) as r:
        exs = r.exchanges(gw.run)
        out = io.BytesIO()
        r.export_jsonl(out)
    assert [e.query for e in exs[:2]] == ["beta=true;key=REDACTED", "beta=true&key%3DREDACTED"]
    assert exs[2].request_headers["user-agent"] == "claude-cli/2.1 (REDACTED)"
    assert exs[2].request_headers["x-session-id"] == "REDACTED"
    assert set(exs[2].secret_fingerprints) >= {"user-agent", "anthropic-beta", "x-session-id"}
    assert exs[3].secret_fingerprints["authorization"] == exs[4].secret_fingerprints["x-api-key"]
    stack.lt.run(gw.gateway.stop())  # the log file closed
    files = {f.name: f.read_bytes() for f in gw.journal_path.parent.iterdir()}  # with -wal and -shm
    gw.journal.close()  # the WAL checkpointed: what it held is in the file, scanned too
    files["checkpointed"] = gw.journal_path.read_bytes()
    files["export"], files["log"] = out.getvalue(), log.read_bytes()
    for where, data in files.items():
        for window in secret_windows(SHAPED.values()):
            assert window not in data, f"{window!r} of a key found in {where}"


MORE = {
    "bare": "sk-ant-api03-" + "Zq4Lr8Tv2Wx6Yb1Nc5Md9Kf3Hg7Js0Pa",  # a query parameter that is only the key
    "as_name": "AIza" + "SyNameQ2w7E4r9T1y6U3i8O5p0Aas",  # the key as a parameter's name
    "in_path": "sk-ant-api03-" + "Pth5Gk2Lm8Nq4Rs1Tv7Wx3Yz9Bc6Df",  # pasted into the base URL
    "run_path": "sk-ant-api03-" + "Run4Hj8Kl2Mn6Pq0Rs3Tu7Vw1Xy5Za",  # as a /run/<id>
    "run_header": "AIza" + "SyRunHdr3k8L1m6N4p9Q2r7S5t0Uvw",  # as X-Pvisor-Run
    "fragment": "AIza" + "SyFrag7h2J5k9L3m6N1p8Q4r0S2tuv",  # in a fragment of the request line
    "encoded_ua": "sk-ant-api03-" + "Enc9Ab3Cd7Ef1Gh5Ij2Kl6Mn0Op4Qr",  # percent-encoded in a header
}
SECRETS_SENT += list(MORE.values())


def test_keys_as_names_in_paths_run_ids_fragments_and_encoded_headers(stack, tmp_path: Path):
    """Found by the new-user helper after the first round of issue 17, defect 4: each of these
    reached the journal or the log file."""
    from gateway_helpers import http_request, json_upstream

    up = stack.raw_upstream(json_upstream(b'{"id":"msg_1"}'))
    log = tmp_path / "gw.log"
    gw = stack.gateway({"anthropic": up.url}, log_file=log)
    encoded = quote(f"x {MORE['encoded_ua']}", safe="")
    requests = [
        (f"/v1/messages?{MORE['bare']}", {}),
        (f"/v1/messages?{MORE['as_name']}=1", {}),
        (f"/v1/messages/{MORE['in_path']}", {}),  # forwarded to the only upstream; journaled redacted
        (f"/run/{MORE['run_path']}/v1/messages", {}),
        ("/v1/messages", {"X-Pvisor-Run": MORE["run_header"]}),
        (f"/v1/messages?x=1#key={MORE['fragment']}", {}),
        ("/v1/messages", {"User-Agent": encoded}),
    ]
    statuses = [
        http_request(gw.url, "POST", target, b'{"model":"m"}', headers=h)[0] for target, h in requests
    ]
    assert statuses == [200, 200, 200, 400, 400, 200, 200], statuses  # a key is never a run id
    stack.drain(gw)
    with stack.reader(gw) as r:
        exs = r.exchanges(gw.run)
        out = io.BytesIO()
        r.export_jsonl(out)
        runs = [run.id for run in r.runs()]
    assert runs == [gw.run]
    assert exs[2].path == "/v1/messages/REDACTED" and exs[0].query == "REDACTED"
    assert all(not any(k in fp for k in MORE.values()) for e in exs for fp in e.secret_fingerprints)
    # with two upstreams the same path has no route: the gateway's own 404 names the path
    log2 = tmp_path / "gw2.log"
    gw2 = stack.gateway({"anthropic": up.url, "openai": up.url}, name="gw2", log_file=log2)
    status, _, body = http_request(gw2.url, "POST", f"/v1/messages/{MORE['in_path']}", b"{}")
    assert status == 404 and b"pvisor_no_route" in body
    [ex404] = stack.exchanges(gw2)
    assert ex404.path == "/v1/messages/REDACTED" and MORE["in_path"] not in (ex404.error or "")
    stack.lt.run(gw.gateway.stop())
    stack.lt.run(gw2.gateway.stop())
    files = {f.name: f.read_bytes() for f in gw.journal_path.parent.iterdir()}
    files |= {"2:" + f.name: f.read_bytes() for f in gw2.journal_path.parent.iterdir()}
    files["export"], files["log"], files["log2"] = out.getvalue(), log.read_bytes(), log2.read_bytes()
    windows = secret_windows(MORE.values())
    for where, data in files.items():
        leaked = [w for w in windows if w in data]
        assert not leaked, f"{leaked[:3]} of a key found in {where}"


def test_an_error_that_echoes_the_key_encoded_is_stored_without_it(tmp_path: Path):
    """Issue 35, item 2: an upstream may quote the key percent-encoded, in base64 or with JSON's
    escaped ``/``; each form of it is cleaned from the error before it is stored."""
    key = "sk-ant-api03-" + "EncEcho3Lr8Tv2Wx6Yb1Nc5Md9/Kf3Hg7+Js0="
    forms = [
        quote(key, safe=""),
        quote_plus(key),
        base64.b64encode(key.encode()).decode(),
        base64.urlsafe_b64encode(key.encode()).decode().rstrip("="),
        key.replace("/", "\\/"),
    ]
    echoed = ('{"error":{"message":"bad key: ' + " | ".join(forms) + '"}}').encode()
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        ex_id = j.record_exchange(
            "r1", "POST", "/v1/messages", [("x-api-key", key)], status=401, response_body=echoed
        )
    with JournalReader(path) as r:
        body = r.response_body(r.exchange(ex_id), raw=True)
    assert body == b'{"error":{"message":"bad key: ' + b" | ".join([b"<redacted>"] * 5) + b'"}}'
    for form in _forms(key):
        assert form not in body


ROUND2 = {
    # issue 35, item 3: the three placements of the hostile user's 80 that were stored
    "header_name": "sk-ant-api03-" + "HdrName6Lr8Tv2Wx6Yb1Nc5Md9Kf3Hg7",  # a key used as a header name
    "fragment": "PVSECRETFRAGMENTKEY0015xyz",  # `#key=...`, a secret of no known shape, no query
    "fragment_q": "PVSECRETFRAGQUERYKEY0016xyz",  # `?x=1#access_token=...`
    "userinfo": "PVSECRETUSERINFO0017pass",  # `user:secret@` in an absolute-form request line
}
SECRETS_SENT += list(ROUND2.values())


def test_keys_as_header_names_in_fragments_and_in_the_user_info_of_the_request_line(stack, tmp_path: Path):
    """Issue 35, item 3: each of these reached the journal or the log file."""
    from gateway_helpers import http_request, parse_response, raw_response

    up = stack.raw_upstream(json_upstream_ok())
    log = tmp_path / "gw.log"
    gw = stack.gateway({"anthropic": up.url}, log_file=log)
    statuses = [
        http_request(gw.url, "POST", "/v1/messages", b"{}", headers={ROUND2["header_name"]: "1"})[0],
        http_request(gw.url, "POST", f"/v1/messages#key={ROUND2['fragment']}", b"{}")[0],
        http_request(gw.url, "POST", f"/v1/messages?x=1#access_token={ROUND2['fragment_q']}", b"{}")[0],
    ]
    host = gw.url.removeprefix("http://")
    raw = (
        f"POST http://user:{ROUND2['userinfo']}@{host}/v1/messages HTTP/1.1\r\nHost: {host}\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()
    statuses.append(parse_response(raw_response(gw.url, raw))[0])
    assert statuses == [200, 200, 200, 200], statuses
    stack.drain(gw)
    with stack.reader(gw) as r:
        exs = r.exchanges(gw.run)
        out = io.BytesIO()
        r.export_jsonl(out)
    assert len(exs) == 4 and all(e.path == "/v1/messages" for e in exs), [e.path for e in exs]
    assert "redacted" in exs[0].secret_fingerprints  # the key that was a header name, told apart
    assert [e.query for e in exs] == ["", "", "x=1", ""]
    # the upstream got no secret either: a fragment and a user info are not parts of a request target
    assert [path for _, path, _, _ in up.requests] == ["/v1/messages", "/v1/messages", "/v1/messages?x=1"] + [
        "/v1/messages"
    ]
    stack.lt.run(gw.gateway.stop())
    files = {f.name: f.read_bytes() for f in gw.journal_path.parent.iterdir()}
    gw.journal.close()
    files["checkpointed"] = gw.journal_path.read_bytes()
    files["export"], files["log"] = out.getvalue(), log.read_bytes()
    for where, data in files.items():
        leaked = [w for w in secret_windows(ROUND2.values()) if w in data]
        assert not leaked, f"{leaked[:3]} of a key found in {where}"


def json_upstream_ok():
    from gateway_helpers import json_upstream

    return json_upstream(b'{"id":"msg_1"}')


def test_an_error_that_quotes_a_key_the_request_did_not_carry_is_stored_without_it(tmp_path: Path):
    """Found by the scan that restores the journal's bodies (issue 35, item 2): an error quoting
    a key-shaped token the request did not send (no credential header) kept it."""
    other = "AIza" + "SyOtherKeyQ2w7E4r9T1y6U3i8O5p0Aqz"
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        ex_id = j.record_exchange(
            "r1",
            "POST",
            "/v1/messages",
            [],
            status=403,
            response_body=b'{"error":"key ' + other.encode() + b'"}',
        )
    with JournalReader(path) as r:
        assert r.response_body(r.exchange(ex_id), raw=True) == b'{"error":"key <redacted>"}'


ROUND3 = {
    "encoding": "sk-ant-api03-" + "EncHdr4Kx8Vb2Nq6Lm0Pz3Rt7Wy1",  # sent as the Content-Encoding value
    "plain": "PlainCred7Qx2Vn5Lk8Hz1",  # not key-shaped: known only as the request's credential
    "lower": "sk-ant-api03-" + "lowername5kx8vb2nq6lm0pz3rt7wy",  # all lower case, sent upper-cased
}
SECRETS_SENT += list(ROUND3.values())


def test_a_request_credential_repeated_anywhere_in_the_headers_is_not_stored(tmp_path: Path):
    """Issue 35, the tester's F6 and smaller gaps: a key sent as the request's Content-Encoding
    was stored in clear in ``request_encoding``; a credential that is not key-shaped, sent in
    ``x-api-key`` or ``Authorization`` and repeated in ``User-Agent`` or ``anthropic-beta``, or
    echoed in a response header, was stored; an all-lower-case key sent as an upper-cased
    header NAME was stored lower-cased. None of them is in any file of the journal now."""
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        ids = [
            j.record_exchange(
                "r1",
                "POST",
                "/v1/messages",
                [("x-api-key", "unrelated-key-0000")],
                status=200,
                request_body=b"{}",
                request_encoding=ROUND3["encoding"],
                response_body=b"{}",
            ),
            j.record_exchange(
                "r1",
                "POST",
                "/v1/messages",
                [
                    ("Authorization", "Bearer " + ROUND3["plain"]),
                    ("User-Agent", "agent/1 " + ROUND3["plain"]),
                    ("anthropic-beta", ROUND3["plain"]),
                ],
                status=200,
                response_headers=[("X-Echo", "you sent " + ROUND3["plain"])],
                response_body=b"{}",
            ),
            j.record_exchange(
                "r1",
                "POST",
                "/v1/messages",
                [(ROUND3["lower"].upper(), "1")],
                status=200,
                response_body=b"{}",
            ),
        ]
    with JournalReader(path) as r:
        exs = [r.exchange(i) for i in ids]
    assert exs[0].request_encoding == "<redacted>"
    assert exs[1].request_headers["user-agent"] == "agent/1 REDACTED"
    assert exs[1].response_headers["x-echo"] == "you sent REDACTED"
    files = {f.name: f.read_bytes() for f in path.parent.iterdir()}
    windows = secret_windows(ROUND3.values())
    for where, data in files.items():
        for form in (w for v in ROUND3.values() for w in (*_forms(v), *_forms(v.upper()))):
            assert form not in data.lower() and form.lower() not in data.lower(), f"{form!r} in {where}"
        assert not [w for w in windows if w in data], where


ROUND4 = {
    "hex": "HexCred5Wq8Zt2Lm6Nb",  # not key-shaped: echoed hex-encoded in an error body
    "b64": "sk-ant-api03-" + "B64Meta6Qw9Er2Ty5Ui8Op1As4Df7",  # sent only base64'd inside a header
}
SECRETS_SENT += list(ROUND4.values())


def test_a_credential_echoed_hex_and_a_key_base64_inside_a_header_are_not_stored(tmp_path: Path):
    """Issue 35, the second attack round: an error that echoes the request's credential
    hex-encoded, or base64'd at any offset inside a longer text, was stored with it; a key-shaped
    key sent only base64'd inside a JSON blob of an allow-listed header (``x-stainless-meta``)
    was stored. Neither is in any file of the journal now."""
    echo = ('{"hint":"%s","blob":"%s"}' % (
        ROUND4["hex"].encode().hex(),
        base64.b64encode(b'{"k":"' + ROUND4["hex"].encode() + b'"}').decode(),
    )).encode()  # fmt: skip
    meta = base64.b64encode(b'{"lang":"py","k":"' + ROUND4["b64"].encode() + b'"}').decode()
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        ids = [
            j.record_exchange(
                "r1",
                "POST",
                "/v1/messages",
                [("x-api-key", ROUND4["hex"])],
                status=401,
                request_body=b"{}",
                response_body=echo,
            ),
            j.record_exchange(
                "r1",
                "POST",
                "/v1/messages",
                [("x-api-key", "unrelated-key-1111"), ("x-stainless-meta", meta)],
                status=200,
                request_body=b"{}",
                response_body=b"{}",
            ),
        ]
    with JournalReader(path) as r:
        exs = [r.exchange(i) for i in ids]
        stored = r.response_body(exs[0], raw=True) or b""
    assert stored.startswith(b'{"hint":"') and ROUND4["hex"].encode().hex().encode() not in stored
    assert exs[1].request_headers["x-stainless-meta"] == "REDACTED"
    files = {f.name: f.read_bytes() for f in path.parent.iterdir()}
    for where, data in [*files.items(), ("the stored body", stored)]:
        for value in ROUND4.values():
            raw = value.encode()
            assert raw.hex().encode() not in data.lower(), f"hex of {value} in {where}"
            assert base64.b64encode(raw)[:12] not in data, where
        assert b'{"k":"' + ROUND4["hex"].encode() not in data
    # what is left of the base64 around the cut decodes to a byte or two of the key at most
    assert orjson.loads(stored) == {"hint": "<redacted>", "blob": "eyJrIjoi<redacted>YiJ9"}
