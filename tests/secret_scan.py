"""The check made after every test module that declares the keys it sends (``SECRETS_SENT``):
no 8-byte window of any of them, nor the key whole percent-encoded or in base64, in any journal
(its bodies restored and decoded too), WAL, shm, log, result, export or report file that the
module's tests made (issue 17, "Exposure"; issue 35, item 2). conftest.py imports the fixture; so can a test
session of its own (tests/test_secret_scan.py checks that the scan finds a leak)."""

from __future__ import annotations

import pytest

#: public prefixes of key formats: a window inside one says nothing about a key
_KEY_PREFIXES = ("sk-ant-api03-", "sk-ant-oat01-", "sk-ant-", "sk-proj-", "sk-", "AIza", "Bearer ")
#: what pvisor writes: journals and their WAL and shm files, log files, results, exports
_OUTPUT_GLOBS = (
    "*.sqlite",
    "*.sqlite-wal",
    "*.sqlite-shm",
    "*.log",
    "result.json",
    "export*",
    "*.export.jsonl",
    "*.html",
)


def secret_windows(keys) -> set[bytes]:
    """Every 8-byte window of each key's distinctive part (without its public prefix)."""
    out: set[bytes] = set()
    for key in keys:
        body = key
        for prefix in _KEY_PREFIXES:
            if body.startswith(prefix):
                body = body[len(prefix) :]
                break
        raw = body.encode()
        out |= {raw[i : i + 8] for i in range(len(raw) - 7)}
    return out


def secret_forms(keys) -> set[bytes]:
    """Each key whole in the other forms a leak takes: percent-encoded (``quote``, ``quote_plus``)
    and base64 (standard and URL-safe, without padding)."""
    import base64
    from urllib.parse import quote, quote_plus

    out: set[bytes] = set()
    for key in keys:
        raw = key.encode()
        out |= {quote(key, safe="").encode(), quote_plus(key).encode()}
        out |= {base64.b64encode(raw).rstrip(b"="), base64.urlsafe_b64encode(raw).rstrip(b"=")}
    return out - {k.encode() for k in keys}


def journal_bodies(path) -> bytes:
    """Every body the journal ``path`` stores, restored from its blobs (stored zstd-compressed, a
    body cannot be seen in the file's bytes), a response body decoded as its stored headers say
    (what a reader gets); b"" for a file that is no journal."""
    from pvisor.journal.content_encoding import decode_body
    from pvisor.journal.reader import JournalReader

    out: list[bytes] = []
    try:
        with JournalReader(path) as r:
            codings = {
                ex.response_body: ex.response_headers["content-encoding"]
                for ex in r.exchanges()
                if ex.response_body and "content-encoding" in ex.response_headers
            }
            for (sha,) in r.conn.execute("SELECT sha256 FROM blobs").fetchall():
                data = r.blob(sha)
                if sha in codings:
                    try:
                        data = decode_body(data, codings[sha])
                    except Exception:
                        pass  # kept as it is: scanned as stored
                out.append(data)
    except Exception:
        pass  # not a journal (or a damaged one a test made): its bytes are scanned as they are
    return b"\0".join(out)


@pytest.fixture(scope="module", autouse=True)
def no_secret_in_what_pvisor_wrote(request, tmp_path_factory):
    """After a test module that declares the keys it sends (``SECRETS_SENT``): no 8-byte window
    of any of them in any journal, WAL, shm, log, result or export file its tests made."""
    keys = getattr(request.module, "SECRETS_SENT", None)
    if not keys:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    windows = secret_windows(keys) | secret_forms(keys)
    assert windows, f"{request.module.__name__}: SECRETS_SENT holds no key long enough to check"
    found = []
    for made in sorted(set(base.iterdir()) - before):
        for pattern in _OUTPUT_GLOBS:
            for f in made.rglob(pattern):
                if f.is_file():
                    data = f.read_bytes()
                    if f.suffix == ".sqlite":
                        data += b"\0" + journal_bodies(f)
                    found += [f"{f}: {w!r}" for w in windows if w in data][:3]
    assert not found, f"{request.module.__name__}: pieces of a key in what pvisor wrote: {found[:10]}"
