"""The run page against hostile and damaged runs (issue 43): a Claude Code run captured through
the real CLI with the scripted model whose action text holds an HTML comment opening and a script
tag, which writes a ``.env`` with a plain password through its Write tool and adds 400 empty
files in one step; copies of its journal with its snapshots' walks failed or a manifest's blob
gone; a run recorded straight into a journal whose usage holds markup where counts belong. Each
page is opened in headless Chromium (tests/test_report.py's) where it matters: it must load
whole, with no console message."""

from __future__ import annotations

import html
import json
import re
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
from agent_helpers import capture_scripted
from cli_helpers import pvisor_main
from test_gateway_cli import ENV

import test_report
from pvisor.adapters.exports.report_document import WITHHELD
from pvisor.adapters.exports.report_workspace import ENTRY_BYTES, UNREAD_REASON, step_files
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

browser = test_report.browser
pytestmark = pytest.mark.slow

#: markup in an action's text: an HTML comment opening then a script tag, a script's end, U+2028
HOSTILE = 'Look: <!--<script> and </script><img src=x onerror="document.body.dataset.xss=1"> \u2028 end'
PASSWORD = "plain-hunter2-battery-staple"
EMPTY_FILES = 400
SCRIPT = {
    "turns": [
        {"text": HOSTILE, "tool_calls": [
            {"tool": "Write", "arguments": {"file_path": ".env", "content": f"DB_PASSWORD={PASSWORD}\n"}},
            {"tool": "@shell", "command": f"mkdir many; seq -f many/f%g.txt {EMPTY_FILES} | xargs touch"},
        ]},
        {"text": "All done."},
    ]
}  # fmt: skip


def page_data(journal: Path, run: str, out: Path) -> tuple[dict, str]:
    p = pvisor_main(
        ["--journal", str(journal), "report", run, "-o", str(out), "--no-parent"], env=ENV, text=True
    )
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    m = re.search(r'<script type="application/json" id="pvisor-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1)), page


def steps_of(doc: dict) -> list[dict]:
    return [row["step"] for row in doc["exchanges"] if "step" in row]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """(journal, run) of :data:`SCRIPT` captured with Claude Code."""
    root = tmp_path_factory.mktemp("report-attacks")
    cap = capture_scripted("claude-code", root, SCRIPT, "Set up")
    return cap.journal, cap.run


def test_markup_in_a_text_leaves_the_page_whole(browser, hostile, tmp_path):
    """A text holding ``<!--<script>`` made the HTML parser read the data's script element past
    its end, swallowing the page's script: a blank page. Every ``<`` of the data is escaped."""
    journal, run = hostile
    doc, page = page_data(journal, run, tmp_path / "p.html")
    assert "<!--" not in page.split('id="pvisor-data">')[1].split("</script>")[0]
    test_report.open_page(browser, tmp_path / "p.html", "report-attacks-markup")
    text = browser.find_element("css selector", ".row[data-step='1'] .text.action").get_attribute(
        "textContent"
    )
    assert text == HOSTILE
    assert browser.execute_script("return document.body.dataset.xss") is None


def test_a_write_into_a_secret_file_shows_neither_its_content_nor_its_arguments(browser, hostile, tmp_path):
    """The Write of ``.env`` is its path and a note: the content the snapshots withhold is in
    neither the call's view nor its arguments (the exchange's bodies are the journal's, as
    docs/report.md says)."""
    journal, run = hostile
    doc, _ = page_data(journal, run, tmp_path / "p.html")
    write = next(c for c in steps_of(doc)[0]["calls"] if c["name"] == "Write")
    assert write["view"] == {"path": ".env", "secret": True}
    assert PASSWORD not in write["args"] and json.loads(write["args"])["content"] == WITHHELD
    test_report.open_page(browser, tmp_path / "p.html", "report-attacks-secret-write")
    card = browser.find_element("css selector", ".row[data-step='1'] .call[data-kind='write']")
    assert "looks like a secret" in card.text and PASSWORD not in html.unescape(
        card.get_attribute("innerHTML")
    )


def test_files_without_a_diff_count_against_the_pages_cap(hostile):
    """400 empty files cost no diff line: they were all given whatever the page's budget. Each
    entry now costs its path and :data:`ENTRY_BYTES`: the budget holds, the rest are counted."""
    journal, run = hostile
    budget = 50 * (ENTRY_BYTES + len("many/f100.txt"))
    with JournalReader(journal) as r:
        found = step_files(r, run, trajectory_from_journal(r, run).meta, page_bytes=budget)
    shown = found.files[1]
    assert found.capped and 40 <= len(shown) <= 60, len(shown)
    assert len(shown) + found.more[1] == EMPTY_FILES + 1  # and .env


def test_snapshots_that_cannot_be_read_are_said(hostile, tmp_path):
    """Every walk failed: the page said the files were shown and showed none; it says why now.
    The manifest's blob of the workspace before step 1 gone: step 1 is counted as unread."""
    journal, run = hostile
    failed = tmp_path / "failed.sqlite"
    shutil.copy(journal, failed)
    with sqlite3.connect(failed) as c:
        c.execute("UPDATE snapshots SET manifest = NULL, error = 'walk failed: Permission denied'")
    doc, _ = page_data(failed, run, tmp_path / "failed.html")
    w = doc["workspace"]
    assert not w["shown"] and w["reason"] == f"{UNREAD_REASON}: walk failed: Permission denied"
    damaged = tmp_path / "damaged.sqlite"
    shutil.copy(journal, damaged)
    with sqlite3.connect(damaged) as c:
        c.execute("PRAGMA foreign_keys = OFF")
        # a blob the journal does not hold (deleting the real one loses later manifests too:
        # they are stored as its deltas)
        c.execute(f"UPDATE snapshots SET manifest = '{'0' * 64}' WHERE after_step = 0")
    doc, _ = page_data(damaged, run, tmp_path / "damaged.html")
    assert doc["workspace"]["shown"] and doc["workspace"]["unread"] == 1
    assert [s["files"] for s in steps_of(doc)] == [None, []]


def test_a_usage_that_is_not_a_count_is_not_shown_as_one(browser, tmp_path):
    """A reply whose ``input_tokens`` is markup and ``output_tokens`` a list: the page read the
    raw usage and showed ``tokens in <img ...> / out 1,2``; a step without counts says so."""
    journal = tmp_path / "j.sqlite"
    usage = {"input_tokens": '<img src=x onerror="document.body.dataset.xss=1">', "output_tokens": [1, 2]}
    reply = {"id": "m1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
             "content": [{"type": "text", "text": "hi"}], "usage": usage}  # fmt: skip
    body = orjson.dumps({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    with Journal.open(journal) as j:
        j.create_run(Run(id="usage", agent="claude-code"))
        j.record_exchange("usage", "POST", "/v1/messages", [], status=200, protocol="anthropic",
                          request_body=body, response_body=orjson.dumps(reply))  # fmt: skip
        j.flush()
    page = tmp_path / "usage.html"
    page_data(journal, "usage", page)
    test_report.open_page(browser, page, "report-attacks-usage")
    assert browser.find_elements("css selector", ".row[data-step='1'] .usage") == []
    title = browser.find_element("css selector", "#chart a[data-step='1'] title").get_attribute("textContent")
    assert title.endswith("no token usage reported"), title
    assert browser.execute_script("return document.body.dataset.xss") is None


def test_a_key_across_a_cut_is_not_kept_in_part(tmp_path):
    """A body longer than ``--body-limit`` keeps its head and tail, and a tool result longer
    than the page's text limit its two ends: a key whose tail end began inside a key kept the
    rest of the key, with no prefix left for the redaction to know it by."""
    key = "sk-ant-api03-" + "K7q" * 30
    limit = 8192
    # the request body's tail (its last limit/2 bytes) begins 14 bytes into the key
    text = "x" * 6000 + " " + key + " "
    body = orjson.dumps({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": text}]})
    pad = body.find(key.encode()) + 14 + limit // 2 - len(body)
    body = orjson.dumps(
        {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": text + "y" * pad}]}
    )
    assert len(body) - limit // 2 == body.find(key.encode()) + 14
    # a tool result of 30,000 characters whose kept tail (10,000) begins 20 characters into the key
    result = "r" * (20_000 - 20 - 1) + " " + key + " " + "z" * (10_000 - len(key) - 1 + 20)
    content = [{"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"command": "cat log"}}]
    reply = {"id": "m1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
             "content": content, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    second = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": result}]}
    first = orjson.loads(body)["messages"][0]
    messages = [first, {"role": "assistant", "content": content}, second]
    body2 = orjson.dumps({"model": "m", "max_tokens": 10, "messages": messages})
    end = {**reply, "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id="cut", agent="claude-code"))
        for b, r in ((body, reply), (body2, end)):
            j.record_exchange("cut", "POST", "/v1/messages", [], status=200, protocol="anthropic",
                              request_body=b, response_body=orjson.dumps(r))  # fmt: skip
        j.flush()
    doc, page = page_data(journal, "cut", tmp_path / "cut.html")
    assert steps_of(doc)[0]["results"][0]["text"].count("characters left out") == 1
    assert doc["exchanges"][0]["request"]["cut"]
    assert "K7qK7qK7q" not in page and "REDACTED" in page
