"""The scan of tests/secret_scan.py fails a module whose outputs hold a piece of a key it sent,
and passes one whose outputs do not (a scan that cannot fail would prove nothing)."""

from __future__ import annotations

import base64

pytest_plugins = ["pytester"]

MODULE = """
import sqlite3

SECRETS_SENT = ["sk-ant-api03-Q7vX2mPz9LkR4tYw8NbC3hJd6FsG1aEu5oIq0ZxWc"]


def test_writes_a_journal(tmp_path):
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:
        db.execute("CREATE TABLE t (v TEXT)")
        db.execute("INSERT INTO t VALUES (?)", ({value!r},))
"""


def _run(pytester, value: str):
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest("from secret_scan import no_secret_in_what_pvisor_wrote  # noqa: F401")
    pytester.makepyfile(test_inner=MODULE.format(value=value))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider")


def test_a_piece_of_a_key_in_a_journal_fails_the_module(pytester):
    result = _run(pytester, "header x-api-key: ...Pz9LkR4t...")  # 8 bytes of the key's body
    result.assert_outcomes(passed=1, errors=1)
    assert "pieces of a key in what pvisor wrote" in result.stdout.str()


def test_a_redacted_journal_passes(pytester):
    _run(pytester, "x-api-key: REDACTED (fingerprint 1a2b3c4d)").assert_outcomes(passed=1)


COMPRESSED = """
import gzip

from pvisor.journal.writer import Journal

SECRETS_SENT = ["sk-ant-api03-Q7vX2mPz9LkR4tYw8NbC3hJd6FsG1aEu5oIq0ZxWc"]


def test_writes_a_journal(tmp_path):
    with Journal.open(tmp_path / "journal.sqlite") as j:
        j.record_exchange(
            "r1", "POST", "/v1/messages", [], status=200,
            response_headers=[("Content-Encoding", "gzip")],
            response_body=gzip.compress({value!r}.encode()),
        )
"""


def test_a_key_inside_a_compressed_body_or_in_base64_fails_the_module(pytester):
    """Issue 35, item 2: a body is stored zstd-compressed and may be gzip-compressed as received:
    the scan restores and decodes the journal's bodies, and looks for the key in base64 too."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest("from secret_scan import no_secret_in_what_pvisor_wrote  # noqa: F401")
    key = "sk-ant-api03-Q7vX2mPz9LkR4tYw8NbC3hJd6FsG1aEu5oIq0ZxWc"
    for value in (f"invalid key {key}", "in base64 " + base64.b64encode(key.encode()).decode()):
        pytester.makepyfile(test_inner=COMPRESSED.format(value=value))
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
        result.assert_outcomes(passed=1, errors=1)
        assert "pieces of a key in what pvisor wrote" in result.stdout.str()
