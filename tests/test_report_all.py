"""``pvisor report --all`` (issue 43): a folder of run pages and their index, linked both ways.

The journal holds a real Claude Code run (the session's capture, tests/agent_captures.py, merged
in alone), its replay-only derived run made here, and runs written straight in with the real
writer: a Codex run from 2023, and a run whose id and agent name are HTML. The folder is opened
in headless Chromium as tests/test_report.py drives it: the index lists the runs newest first,
clicking a run opens its page, the derived run's parent link opens the parent's page and the
parent's child link comes back; no console message, no network request, a screenshot of each
page kept. Then the selection (--limit, --since, --agent), a lineage outside it, a second run
into the same folder, and bad input with its exit codes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest
import test_report
from agent_helpers import entrypoint, pvisor, user_env
from cli_helpers import pvisor_main
from test_gateway_cli import ENV, PVISOR
from test_report import open_page

from pvisor.journal.merge import merge_journals
from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

#: headless Chromium, as tests/test_report.py drives it
browser = test_report.browser

OLD = "r-codex00000a"
#: a run id and an agent name as a foreign journal could hold them: HTML, quotes, a script
HOSTILE_ID = "x\"'><img src=x onerror=alert(1)>"
HOSTILE_AGENT = "<script>alert(2)</script>"
OLD_MS = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC


@pytest.fixture(scope="module")
def folder_journal(captured, tmp_path_factory):
    """(journal, captured run, its replay-only derived run): the capture merged alone into a
    journal of this module, the derived run replayed into it, and the two written runs."""
    cap = captured("claude-code")
    assert cap.proc.returncode == 0, cap.proc.stderr
    root = tmp_path_factory.mktemp("report-all")
    journal = root / "j.sqlite"
    merge_journals([cap.journal], journal, runs={cap.run})
    ws = root / "ws"
    ws.mkdir()
    rep = pvisor(
        ["--journal", str(journal), "replay", "--agent", "claude-code",
         "--agent-entrypoint", str(entrypoint("claude-code")), "--run", cap.run, "--after-step", "1",
         "--replay-only", "--workspace", str(ws), "--output", str(root / "out")],
        env=user_env(cap.user_home), cwd=root, timeout=300,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    derived = json.loads((root / "out" / "result.json").read_text())["derived_run"]
    with Journal.open(journal) as j:
        j.create_run(Run(id=OLD, agent="codex", created_ms=OLD_MS))
        chat_run(j, OLD)
        j.create_run(Run(id=HOSTILE_ID, agent=HOSTILE_AGENT, created_ms=OLD_MS + 1000))
        j.flush()
    return journal, cap.run, derived


def chat_run(j: Journal, run: str) -> None:
    """One Chat Completions exchange of ``run``: a reply of text, no tool call."""
    reply = {"id": "c", "object": "chat.completion", "model": "m",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                          "finish_reason": "stop"}]}  # fmt: skip
    j.record_exchange(
        run, "POST", "/v1/chat/completions", [], protocol="openai-chat", status=200,
        request_body=orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        response_body=orjson.dumps(reply),
    )  # fmt: skip


def report_all(journal: Path, *args: str):
    return pvisor_main(["--journal", str(journal), "report", "--all", *args], env=ENV, text=True)


def index_runs(index: Path) -> list[str]:
    """The run ids of the index's rows, in its order (the rows' ``data-run``, unescaped)."""
    import html

    return [html.unescape(r) for r in re.findall(r'<tr data-run="([^"]*)"', index.read_text())]


def newest_first(journal: Path) -> list[str]:
    with JournalReader(journal) as r:
        return [run.id for run in r.runs()][::-1]


@pytest.mark.slow
def test_the_folder_links_the_index_the_pages_and_their_lineage(browser, folder_journal, tmp_path):
    journal, parent, derived = folder_journal
    out = tmp_path / "site"
    p = report_all(journal, "-o", str(out))
    assert p.returncode == 0, p.stderr
    runs = newest_first(journal)
    assert runs[:2] == [derived, parent] and set(runs[2:]) == {OLD, HOSTILE_ID}
    printed = p.stdout.split("\n")[:-1]
    assert printed[-1] == str(out / "index.html") and len(printed) == len(runs) + 1
    assert index_runs(out / "index.html") == runs
    # the hostile id and agent are text: no element made of them, in the file or the page
    raw = (out / "index.html").read_text()
    assert "<img" not in raw and "<script>" not in raw
    open_page(browser, out / "index.html", "report-all-index")
    assert browser.execute_script("return document.querySelectorAll('img, script').length") == 0
    assert HOSTILE_ID in browser.find_element("id", "runs").text
    assert HOSTILE_AGENT in browser.find_element("id", "runs").text
    # at 1280 px the table fits, and no run id wraps (each on one line; the child runs' list wraps)
    assert browser.execute_script("return document.documentElement.scrollWidth <= innerWidth")
    for cell in browser.find_elements("css selector", "td.id, td.parent, td.children"):
        for name in cell.find_elements("css selector", "bdi"):
            assert browser.execute_script("return arguments[0].getClientRects().length", name) == 1, name.text
    # the derived run's row names its parent, linked; the parent's row its child
    row = browser.find_element("css selector", f"tr[data-run='{derived}']")
    assert row.find_element("css selector", "td.parent a").get_attribute("href").endswith(f"/{parent}.html")
    assert "replay-only" in row.text
    up = browser.find_element("css selector", f"tr[data-run='{parent}']")
    assert up.find_element("css selector", "td.children a").text == derived
    # clicking a run opens its page; its parent link the parent's; the child link comes back
    row.find_element("css selector", "td.id a").click()
    assert browser.find_element("css selector", "h1").text.endswith(derived)
    open_page(browser, out / f"{derived}.html", "report-all-derived")
    # its exchanges add up: its steps and the replay's final reply (no auxiliary one), as the
    # index's filter counts them; that reply marked as the replay's end
    totals = {e.get_attribute("data-total"): e.text.split("\n")[-1]
              for e in browser.find_elements("css selector", "#totals [data-total]")}  # fmt: skip
    shown = json.loads(
        pvisor_main(
            ["--journal", str(journal), "journal", "steps", derived, "--json"], env=ENV, text=True
        ).stdout
    )
    steps, aux = len(shown["steps"]), len(shown["auxiliary"])
    ends = len(browser.find_elements("css selector", "#index li.end"))
    assert ends == 1 and totals["auxiliary"] == str(aux)
    parts = f"{steps} step{'s' if steps != 1 else ''}{f', {aux} auxiliary' if aux else ''}"
    assert totals["exchanges"] == f"{steps + aux + 1} ({parts}, 1 ended by the replay)"
    aux_filter = browser.find_element("css selector", "#filters input[data-filter='aux']").find_element(
        "xpath", ".."
    )
    assert aux_filter.text.strip() == f"auxiliary ({aux})"
    browser.find_element("id", "parent-link").click()
    assert browser.find_element("css selector", "h1").text.endswith(parent)
    open_page(browser, out / f"{parent}.html", "report-all-parent")
    browser.find_element("css selector", f"#children a[data-run='{derived}']").click()
    assert browser.find_element("css selector", "h1").text.endswith(derived)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    # each page knows the index (the page script draws the link from index_href)
    for name in (f"{derived}.html", f"{parent}.html"):
        assert '"index_href":"index.html"' in (out / name).read_text()


@pytest.mark.slow
def test_limit_since_and_agent_select_and_a_lineage_outside_is_named_not_linked(folder_journal, tmp_path):
    journal, parent, derived = folder_journal
    p = report_all(journal, "--limit", "1", "-o", str(tmp_path / "one"))
    assert p.returncode == 0, p.stderr
    assert index_runs(tmp_path / "one" / "index.html") == [derived]
    # the parent is outside the selection: named on the derived run's row, not linked, not written
    assert sorted(os.listdir(tmp_path / "one")) == sorted([f"{derived}.html", "index.html"])
    index = (tmp_path / "one" / "index.html").read_text()
    assert (
        f'<td class="parent"><span class="out" title="not in this folder"><bdi>{parent}</bdi></span>' in index
    )
    assert '"parent_href":null' in (tmp_path / "one" / f"{derived}.html").read_text()
    p = report_all(journal, "--since", "2024-01-01", "-o", str(tmp_path / "since"))
    assert index_runs(tmp_path / "since" / "index.html") == [derived, parent], p.stderr
    p = report_all(journal, "--since", "2023-11-14T22:13:20Z", "-o", str(tmp_path / "edge"))
    assert index_runs(tmp_path / "edge" / "index.html") == newest_first(journal), p.stderr
    p = report_all(journal, "--agent", "codex", "-o", str(tmp_path / "codex"))
    assert index_runs(tmp_path / "codex" / "index.html") == [OLD], p.stderr
    assert "1 of 4 runs (--agent codex)" in (tmp_path / "codex" / "index.html").read_text()
    # a selection of none writes nothing and says so
    p = report_all(journal, "--since", "2100-01-01", "-o", str(tmp_path / "none"))
    assert p.returncode == 0 and not (tmp_path / "none").exists()
    assert "nothing written" in p.stderr


def written_journal(path: Path) -> Path:
    with Journal.open(path) as j:
        j.create_run(Run(id=OLD, agent="codex", created_ms=OLD_MS))
        chat_run(j, OLD)
        j.flush()
    return path


def test_a_folder_is_written_again_over_its_own_pages_only(tmp_path):
    journal = written_journal(tmp_path / "j.sqlite")
    out = tmp_path / "site"
    assert report_all(journal, "-o", str(out)).returncode == 0
    (out / "notes.txt").write_text("mine")
    (out / "stale.html").write_text("an older page")
    p = report_all(journal, "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "notes.txt").read_text() == "mine" and (out / "stale.html").exists()
    assert index_runs(out / "index.html") == [OLD]
    # the default folder, in the current directory
    p = pvisor_main(["--journal", str(journal), "report", "--all"], env=ENV, text=True, cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "pvisor-report" / "index.html").is_file(), p.stderr


def test_bad_input_gets_one_line_and_its_exit_code(tmp_path):
    journal = written_journal(tmp_path / "j.sqlite")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "index.html").write_text("someone's page")
    ours = tmp_path / "ours"
    cases = [
        (["report", OLD, "--all"], 2, "give one of them"),
        (["report"], 2, "Missing argument 'RUN'"),
        (["report", "--all", "--no-parent"], 2, "--no-parent"),
        (["report", OLD, "--limit", "3"], 2, "--limit selects runs for --all"),
        (["report", "--all", "--since", "last week"], 2, "Invalid value for '--since'"),
        (["report", "--all", "--agent", "claude"], 2, "Invalid value for '--agent'"),
        (["report", "--all", "--limit", "0"], 2, "Invalid value for '--limit'"),
        (["report", "--all", "-o", str(journal)], 2, "it is a file, not a directory"),
        (["report", "--all", "-o", str(journal / "x")], 2, "is not a directory"),
        (["report", "--all", "-o", str(foreign)], 2, "pvisor report --all did not write it"),
        (["report", "--all", "-o", "/proc/pvisor-report"], 74, "cannot create it"),
    ]
    for args, code, expected in cases:
        p = subprocess.run(
            [*PVISOR, "--journal", str(journal), *args], env=ENV, capture_output=True, text=True
        )
        assert p.returncode == code, (args, p.stderr)
        assert expected in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)
    assert (foreign / "index.html").read_text() == "someone's page"
    # a page that cannot be written (a full disk): tests/test_report_all_attacks.py
    # -o a folder where a page would be the journal itself: refused before anything is written
    assert report_all(journal, "-o", str(ours)).returncode == 0
    (ours / f"{OLD}.html").unlink()
    (ours / f"{OLD}.html").symlink_to(journal)
    p = subprocess.run(
        [*PVISOR, "--journal", str(journal), "report", "--all", "-o", str(ours)],
        env=ENV, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and "which this command reads" in p.stderr, p.stderr
    with JournalReader(journal) as r:
        assert [run.id for run in r.runs()] == [OLD]


def test_the_index_shows_the_outcome_and_totals_the_page_data_gives():
    """A row from page data with ``outcome`` and ``totals`` (report_document.py's) shows the
    verdict, the exit code, tokens, tool calls with the failed ones and wall time; without them
    (a document before they existed), the last attempt's exit code and ``-``."""
    from pvisor.adapters.exports.report_index import index_row, render_index

    doc = {
        "run": {"id": "r-a", "agent": "codex", "mode": "capture", "created_ms": OLD_MS, "steps": 3,
                "parent_run": None},
        "attempts": [{"n": 1, "exit_code": 0}],
        "exchanges": [{}, {}, {}, {}],
        "children": [],
        "outcome": {"verdict": "failed", "exit_code": 0},
        "totals": {"tokens_in": 1200, "tokens_out": 30, "tool_calls": 3, "failed_calls": 1,
                   "wall_ms": 2500.0},
    }  # fmt: skip
    page = render_index([index_row(doc, "r-a.html", None, {})], "1 of 1 runs")
    row = re.search(r'<tr data-run="r-a">.*</tr>', page).group(0)
    assert '<span class="v-failed">failed</span> · exit 0' in row
    assert "1,200 / 30" in row and '3 <span class="bad">(1 failed)</span>' in row and "2.5 s" in row
    assert "2023-11-14 22:13:20" in row and '<td class="n">4</td>' in row
    bare = {k: v for k, v in doc.items() if k not in ("outcome", "totals")}
    row = re.search(r"<tr .*</tr>", render_index([index_row(bare, "r-a.html", None, {})], "")).group(0)
    assert '<td class="outcome">exit 0</td>' in row and row.count('<td class="n">-</td>') == 3
