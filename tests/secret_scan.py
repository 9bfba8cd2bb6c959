"""The check made after every test module that declares the keys it sends (``SECRETS_SENT``):
no 8-byte window of any of them in any journal, WAL, shm, log, result, export or report file that the
module's tests made (issue 17, "Exposure"). conftest.py imports the fixture; so can a test
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
    windows = secret_windows(keys)
    assert windows, f"{request.module.__name__}: SECRETS_SENT holds no key long enough to check"
    found = []
    for made in sorted(set(base.iterdir()) - before):
        for pattern in _OUTPUT_GLOBS:
            for f in made.rglob(pattern):
                if f.is_file():
                    data = f.read_bytes()
                    found += [f"{f}: {w!r}" for w in windows if w in data][:3]
    assert not found, f"{request.module.__name__}: pieces of a key in what pvisor wrote: {found[:10]}"
