"""The scan of tests/secret_scan.py fails a module whose outputs hold a piece of a key it sent,
and passes one whose outputs do not (a scan that cannot fail would prove nothing)."""

from __future__ import annotations

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
