"""The Datasette plugin (issue 20) in a real Datasette process on 127.0.0.1 (port 0), read over
HTTP: a journal's bodies are readable through the views, the foreign keys link exchanges to runs
and blobs, the canned queries open one exchange, and a database that is not a journal is left
alone."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_journal_housekeeping import two_runs  # noqa: F401  (the fixture: two runs sharing bodies)

from pvisor.journal.reader import JournalReader

DATASETTE = Path(sys.executable).with_name("datasette")


@pytest.fixture
def datasette(two_runs: Path, tmp_path: Path):  # noqa: F811
    """``datasette serve journal.sqlite other.sqlite --port 0``: yields its base URL."""
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        c.execute("INSERT INTO notes (text) VALUES ('hello')")
    assert DATASETTE.exists(), "datasette is part of the test extra (and of pvisor-replay[datasette])"
    proc = subprocess.Popen(
        [str(DATASETTE), "serve", str(two_runs), str(other), "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        lines = []
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
        assert url, "datasette did not start: " + "".join(lines)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_datasette_shows_bodies_as_text_and_links_the_tables(datasette: str, two_runs: Path):  # noqa: F811
    with JournalReader(two_runs) as r:
        exchanges = r.exchanges("r-a")
        want = {e.id: r.request_body(e).decode() for e in exchanges}
    status, rows = get(f"{datasette}/journal/exchange_bodies.json?_shape=array&run_id=r-a&_sort=seq")
    assert status == 200, rows
    assert {row["id"]: row["request"] for row in rows} == want
    assert all(json.loads(row["response"]) == {"choices": []} for row in rows)
    # the foreign keys: Datasette labels run_id and the body columns as links to their rows
    status, page = get(f"{datasette}/journal/exchanges.json?_shape=objects&_labels=on&run_id=r-b")
    assert status == 200, page
    [row] = page["rows"]
    assert row["run_id"] == {"value": "r-b", "label": "r-b"}
    assert isinstance(row["request_body"], dict) and row["request_body"]["value"] == exchanges[1].request_body
    # the canned query of one exchange
    first = exchanges[0].id
    status, rows = get(f"{datasette}/journal/exchange.json?_shape=array&exchange={first}")
    assert status == 200 and [r["request"] for r in rows] == [want[first]]
    status, summary = get(f"{datasette}/journal/run_summary.json?_shape=array&_sort=id")
    assert [(s["id"], s["exchanges"]) for s in summary] == [("r-a", 3), ("r-b", 1)]


def test_a_database_that_is_not_a_journal_is_left_alone(datasette: str):
    status, page = get(f"{datasette}/other.json?sql=select+text+from+notes&_shape=array")
    assert status == 200 and page == [{"text": "hello"}]
    status, page = get(f"{datasette}/other.json?sql=select+pvisor_json(null)")
    assert status == 400 and "no such function: pvisor_json" in json.dumps(page)
    status, canned = get(f"{datasette}/other.json")
    assert status == 200 and "exchange" not in json.dumps(canned.get("queries", []))
