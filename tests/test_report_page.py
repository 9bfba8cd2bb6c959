"""The run page's overview (issue 43) in headless Chromium, as tests/test_report.py drives it:
the header's outcome and totals, the timeline chart, the step index (jump, search, filters), the
lineage links, on the capture of each of the six agents (the session's ``captured`` runs), a
201-step run built straight into a journal (failed calls, retries, auxiliary exchanges) and a
continuation of a capture whose replayed observations differ. The totals are checked against
what ``pvisor journal show --json`` and ``journal steps --json`` say, never against the page's own
data; every page loads without a console message or a network request; a screenshot of each is
kept under ``$PVISOR_TEST_ARTIFACTS``."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from agent_helpers import AGENTS, TIMED, entrypoint, pvisor, user_env
from cli_helpers import pvisor_main
from test_gateway_cli import ENV

import test_report
from pvisor.adapters.exports.report import render
from pvisor.adapters.exports.report_document import run_document
from pvisor.journal.model import Attempt, Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

#: one headless Chromium for the module (tests/test_report.py's)
browser = test_report.browser
pytestmark = pytest.mark.slow


def cli_json(journal: Path, *args: str):
    p = pvisor_main(["--journal", str(journal), *args, "--json"], env=ENV, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def journal_totals(journal: Path, run: str) -> dict:
    """The run's totals as the journal's own commands give them (``journal show``, ``journal
    steps``): the counts, and the wall time (each attempt from start to end; without attempts,
    the first exchange's start to the last one's end) in ms."""
    show = cli_json(journal, "journal", "show", run)
    traj = cli_json(journal, "journal", "steps", run)
    steps = traj["steps"]
    attempts = [a for a in show["attempts"] if a["ended_ms"] is not None]
    exchanges = show["exchanges"]
    if attempts:
        wall = sum(a["ended_ms"] - a["started_ms"] for a in attempts)
    else:
        ends = [e["started_ms"] + (e["ended_us"] or 0) / 1000 for e in exchanges]
        wall = max(ends) - min(e["started_ms"] for e in exchanges)
    return {
        "steps": len(steps),
        "exchanges": len(exchanges),
        "auxiliary": len(traj["auxiliary"]),
        "retries": sum(len(s["retries"]) for s in steps),
        "tool_calls": sum(len(s["action"]["tool_calls"]) for s in steps),
        "failed_calls": sum(1 for s in steps for r in s["observation"]["results"] if r["is_error"]),
        "wall_ms": wall,
        "traj": traj,
    }


def shown_totals(driver) -> dict[str, str]:
    return {
        e.get_attribute("data-total"): e.find_element("css selector", ".v").text
        for e in driver.find_elements("css selector", "#totals [data-total]")
    }


def check_totals(driver, journal: Path, run: str) -> dict:
    want = journal_totals(journal, run)
    got = shown_totals(driver)
    for key in ("steps", "exchanges", "auxiliary", "retries", "tool_calls", "failed_calls"):
        assert got[key] == f"{want[key]:,}", (key, got[key], want[key])
    wall = float(
        driver.find_element("css selector", "#totals [data-total='wall']").get_attribute("data-value")
    )
    assert abs(wall - want["wall_ms"]) < 1, (wall, want["wall_ms"])
    return want


def in_view(driver, css: str) -> bool:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); if (!e) return false;"
        "const r = e.getBoundingClientRect(); return r.top >= -2 && r.top < innerHeight - 10;",
        css,
    )


def jumps_from_index(driver, steps: list[int]) -> None:
    """Clicking a step's index entry brings its card into view (rendered first if the slices
    had not reached it)."""
    for n in steps:
        driver.find_element("css selector", f"#index a[href='#step-{n}']").click()
        assert in_view(driver, f".row[data-step='{n}']"), n


def timeline_jumps(driver, n: int) -> None:
    """The chart's bar of step ``n`` is a link to its card."""
    driver.execute_script("scrollTo(0, 0)")
    bar = driver.find_element("css selector", f"#chart a[data-step='{n}']")
    driver.execute_script("arguments[0].scrollIntoView({inline: 'center'})", bar)
    bar.find_element("css selector", "rect.hit").click()
    assert in_view(driver, f".row[data-step='{n}']"), n


def no_leaks(driver) -> None:
    """No console message and no request, after all the clicking too."""
    problems = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert problems == [], problems
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0


def open_page(driver, page: Path, shot: str) -> None:
    """tests/test_report.py's ``open_page``, from a blank page (as bench/report_bench.py loads):
    loading a page straight after another one's jumps once returned before its script had run."""
    driver.get("about:blank")
    test_report.open_page(driver, page, shot)


def report(journal: Path, run: str, output: Path) -> None:
    p = test_report.report(journal, run, output)
    assert p.returncode == 0, p.stderr


def test_the_page_of_each_agents_capture_opens_on_its_outcome_and_totals(browser, captured, tmp_path):
    for agent in AGENTS:
        cap = captured(agent)
        page = tmp_path / f"{agent}.html"
        report(cap.journal, cap.run, page)
        open_page(browser, page, f"report-page-{agent}")
        want = check_totals(browser, cap.journal, cap.run)
        # a scripted capture that ended as it should: succeeded, beside its exit code
        verdict = browser.find_element("id", "verdict")
        assert verdict.get_attribute("data-verdict") == "succeeded", (agent, verdict.text)
        assert browser.find_element("id", "exit-code").text == "exit 0"
        # one index entry per exchange; every step's entry jumps to its card, the chart's bars too
        assert len(browser.find_elements("css selector", "#index li.ix")) == want["exchanges"]
        jumps_from_index(browser, range(1, want["steps"] + 1))
        assert len(browser.find_elements("css selector", "#chart a")) == want["steps"]
        timeline_jumps(browser, 1)
        # the shell calls of step 2 read as commands, not JSON
        cmds = [c.text for c in browser.find_elements("css selector", ".row[data-step='2'] .call code.cmd")]
        assert TIMED in cmds, (agent, cmds)
        no_leaks(browser)


KEY = test_report.KEY
#: the 201-step run's failed calls (tool results with is_error; the last step's result is in no
#: request), retried steps, auxiliary exchanges
FAILED = {7, 60, 133, 200}
RETRIED = {50, 150}
AUX_AFTER = {1, 100}


def anthropic_run(path: Path, steps: int) -> str:
    """An Anthropic Messages run of ``steps`` steps (one Bash call each) recorded straight into a
    journal: the results of :data:`FAILED` steps are errors, :data:`RETRIED` steps' requests are
    sent twice (529 first), a ``GET /v1/models`` follows the steps of :data:`AUX_AFTER`."""
    run = f"anthropic{steps}"
    tool = {"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object"}}
    messages: list = [{"role": "user", "content": "count to 201"}]
    with Journal.open(path) as j:
        j.create_run(Run(id=run, agent="claude-code"))
        for n in range(1, steps + 1):
            content = [
                {"type": "text", "text": f"Step {n}."},
                {"type": "tool_use", "id": f"tu_{n}", "name": "Bash", "input": {"command": f"echo {n}"}},
            ]
            usage = {"input_tokens": 10 + n, "output_tokens": 3, "cache_read_input_tokens": 5}
            reply = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "m",
                     "content": content, "stop_reason": "tool_use", "usage": usage}  # fmt: skip
            body = orjson.dumps({"model": "m", "max_tokens": 100, "system": "You count.", "tools": [tool],
                                 "messages": messages})  # fmt: skip
            common = dict(protocol="anthropic", request_body=body)
            if n in RETRIED:
                overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
                j.record_exchange(run, "POST", "/v1/messages", [("x-api-key", KEY)], status=529,
                                  response_body=orjson.dumps(overloaded), **common)  # fmt: skip
            j.record_exchange(run, "POST", "/v1/messages", [("x-api-key", KEY)], status=200,
                              response_body=orjson.dumps(reply), **common)  # fmt: skip
            if n in AUX_AFTER:
                j.record_exchange(run, "GET", "/v1/models", [], status=200, response_body=b'{"data": []}')
            result = {"type": "tool_result", "tool_use_id": f"tu_{n}", "content": f"out {n}"}
            if n in FAILED:
                result |= {"content": f"bash: step {n} failed", "is_error": True}
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": [result]},
            ]
        j.flush()
    return run


def test_a_201_step_run_every_step_in_two_clicks_filters_and_search(browser, tmp_path):
    journal = tmp_path / "j.sqlite"
    run = anthropic_run(journal, 201)
    page = tmp_path / "long.html"
    report(journal, run, page)
    open_page(browser, page, "report-page-201")
    want = check_totals(browser, journal, run)
    assert want["steps"] == 201 and want["failed_calls"] == len(FAILED) and want["retries"] == len(RETRIED)
    # the tokens of every reply that reported usage, input with its cache reads (journal steps)
    usages = [s["action"]["usage"] for s in want["traj"]["steps"]]
    tokens_in = sum(u["input_tokens"] + u["cache_read_input_tokens"] for u in usages)
    tokens_out = sum(u["output_tokens"] for u in usages)
    cached = sum(u["cache_read_input_tokens"] for u in usages)
    assert shown_totals(browser)["tokens"] == f"{tokens_in:,} / {tokens_out:,} / {cached:,}"
    # the slices: 200 exchanges rendered at first; a jump to the last step renders up to it
    assert len(browser.find_elements("css selector", ".row")) == 200
    sample = [*range(1, 202, 20), 199, 200, 201, 3]
    jumps_from_index(browser, sample)
    timeline_jumps(browser, 150)
    timeline_jumps(browser, 201)
    # the failed calls' marks: on the index entry, the call and its result
    marked = {int(a.get_attribute("href").split("-")[-1]) for a in browser.find_elements(
        "css selector", "#index li.step a:has(.mk.failed)")}  # fmt: skip
    assert marked == FAILED
    card = browser.find_element("css selector", ".row[data-step='60']")
    assert card.find_element("css selector", ".call.failed .fail").text == "✗ failed"
    assert "bash: step 60 failed" in card.find_element("css selector", "pre.failed").get_attribute(
        "textContent"
    )

    def visible_steps() -> set[int]:
        return {int(li.get_attribute("data-step"))
                for li in browser.find_elements("css selector", "#index li.step:not(.hidden)")}  # fmt: skip

    def visible_cards() -> set[int]:
        return {int(r.get_attribute("data-step"))
                for r in browser.find_elements("css selector", ".row.main:not(.hidden)")}  # fmt: skip

    def toggle(name: str) -> None:
        browser.execute_script("scrollTo(0, 0)")
        browser.find_element("css selector", f"#filters input[data-filter='{name}']").click()

    toggle("failed")
    assert visible_steps() == FAILED and visible_cards() <= FAILED
    toggle("retry")  # filters add up: failed or retried
    assert visible_steps() == FAILED | RETRIED
    toggle("failed")
    toggle("retry")
    assert len(visible_steps()) == 201 and len(visible_cards()) == len(
        browser.find_elements("css selector", ".row.main")
    )
    toggle("aux")
    assert (
        visible_steps() == set()
        and len(browser.find_elements("css selector", "#index li.aux:not(.hidden)")) == want["auxiliary"]
    )  # as the totals count them (the 529s retried and the GET /v1/models)
    toggle("aux")
    # search: the text of observations (and actions)
    search = browser.find_element("id", "search")
    search.send_keys("step 133 failed")
    browser.implicitly_wait(0)
    for _ in range(50):
        if visible_steps() == {133}:
            break
        browser.execute_script("return new Promise(r => setTimeout(r, 50))")
    assert visible_steps() == {133}
    search.clear()
    search.send_keys("echo 177")
    for _ in range(50):
        if visible_steps() == {177}:
            break
        browser.execute_script("return new Promise(r => setTimeout(r, 50))")
    assert visible_steps() == {177}
    browser.find_element("css selector", "#index a[href='#step-177']").click()
    assert in_view(browser, ".row[data-step='177']")
    browser.save_screenshot(str(test_report.ARTIFACTS / "report-page-201-search.png"))
    assert KEY[14:30].encode() not in page.read_bytes()
    no_leaks(browser)


def test_a_continuation_marks_its_divergences_and_links_its_parent_both_ways(browser, captured, tmp_path):
    """mini-swe-agent's capture continued from its journal after step 3 (its submit command: no
    live request; the upstream would refuse): step 2's timed command gives another output, the
    divergence filter shows it; the parent's page and the child's link each other."""
    cap = captured("mini-swe-agent")
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    proc = pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", cap.agent, "--run", cap.run, "--after-step", "3",
         "--workspace", str(ws), "--output", str(out), "--agent-entrypoint", str(entrypoint(cap.agent)),
         "--upstream", "http://127.0.0.1:9", "--timeout", "240"],
        env=user_env(cap.user_home), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    child = result["derived_run"]
    assert result["mode"] == "continuation"
    # step 2's timed command (step 3's observation, after the submit command, is in no request)
    assert 2 in {c["step"] for c in result["tool_calls"] if not c["equal_normalised"]}
    page = tmp_path / "child.html"
    report(cap.journal, child, page)
    open_page(browser, page, "report-page-continuation")
    check_totals(browser, cap.journal, child)
    assert browser.find_element("id", "parent").text.startswith("continued from ")
    # the divergence filter: the steps whose O' differs (and any whose request parts from the
    # parent's), each marked in the index; the others hidden until the filter is off
    browser.find_element("css selector", "#filters input[data-filter='divergent']").click()
    shown = browser.find_elements("css selector", "#index li.step:not(.hidden)")
    steps = {int(li.get_attribute("data-step")) for li in shown}
    assert 2 in steps
    assert all(li.find_elements("css selector", ".mk.divergent") for li in shown)
    hidden = browser.find_elements("css selector", "#index li.step.hidden")
    assert hidden and not any(li.find_elements("css selector", ".mk.divergent") for li in hidden)
    card = browser.find_element("css selector", ".row[data-step='2']")
    assert card.is_displayed() and "O′ differs" in card.text
    browser.find_element("css selector", "#filters input[data-filter='divergent']").click()
    assert browser.find_elements("css selector", "#index li.hidden") == []
    browser.save_screenshot(str(test_report.ARTIFACTS / "report-page-continuation-divergent.png"))
    no_leaks(browser)
    # the lineage: to the parent's page, and back through its child runs
    browser.find_element("id", "parent-link").click()
    assert browser.find_element("css selector", "h1").text.endswith(cap.run)
    browser.find_element("css selector", f"#children a[data-run='{child}']").click()
    assert browser.find_element("css selector", "h1").text.endswith(child)
    no_leaks(browser)


#: a replay-only run's agent name ending in a right-to-left override (a foreign journal's)
RLO_AGENT = "claude-code\u202e"
#: what pvisor run was given, and the first user message the agent made of it
GIVEN = "Write hello.txt"
RENDERED = "<task>Write hello.txt</task>\nFollow the template: think, then run one command."
RESUMED = "now add a test for it"


def ended_replay(path: Path) -> str:
    """A replay-only run recorded straight into a journal: step 1 in attempt 1 (exit 0), step 2
    in attempt 2 (a resume, ``RESUMED`` in its command line) then the replay's synthetic final
    reply, the agent stopped at ``--timeout`` (SIGTERM: exit 143); a system prompt long enough
    that each request is cut at a 1 KiB body limit. No tool time measured (one step an attempt)."""
    run, parent = "r-5ca1ab1e0001", "r-5ca1ab1e0000"
    tool = {"name": "Bash", "description": "Run a shell command. " * 80, "input_schema": {"type": "object"}}
    messages: list = [{"role": "user", "content": RENDERED}]
    with Journal.open(path) as j:
        j.create_run(Run(id=parent, agent=RLO_AGENT))
        j.create_run(Run(id=run, agent=RLO_AGENT, agent_version="2.0", mode="replay-only", parent_run=parent,
                         boundary_step=1, labels={"task": GIVEN}))  # fmt: skip
        for n, argv in ((1, ["claude", "-p", GIVEN]), (2, ["claude", "--resume", "s1", "-p", RESUMED])):
            j.start_attempt(Attempt(run=run, n=n, labels={"argv": json.dumps(argv)}))
            call = {"type": "tool_use", "id": f"tu_{n}", "name": "Bash", "input": {"command": f"echo {n}"}}
            content = [{"type": "text", "text": f"Step {n}."}, call]
            reply = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "m",
                     "content": content, "stop_reason": "tool_use",
                     "usage": {"input_tokens": 10, "output_tokens": 3}}  # fmt: skip
            request = {"model": "m", "max_tokens": 100, "system": "S", "tools": [tool], "messages": messages}
            j.record_exchange(run, "POST", "/v1/messages", [], attempt=n, protocol="anthropic",
                              status=200, request_body=orjson.dumps(request),
                              response_body=orjson.dumps(reply))  # fmt: skip
            result = {"type": "tool_result", "tool_use_id": f"tu_{n}", "content": f"out {n}"}
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": [result]},
            ]
        end = {"id": "end", "type": "message", "role": "assistant", "model": "m",
               "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}  # fmt: skip
        request = {"model": "m", "max_tokens": 100, "system": "S", "tools": [tool], "messages": messages}
        j.record_exchange(run, "POST", "/v1/messages", [], attempt=2, protocol="anthropic",
                          status=200, request_body=orjson.dumps(request),
                          response_body=orjson.dumps(end), flags=["synthetic_end"])  # fmt: skip
        j.end_attempt(run, 1, 0)
        j.end_attempt(run, 2, 143, {"timed_out": "true"})
        j.flush()
    return run


#: the request diff the diff command gives each step (adapters/request_diff.py's report_section):
#: step 1 differs only in the runs' own home paths (an older diff: only_run_paths, no kinds),
#: step 2 in the agent's ids first, then two real sections; the request after the boundary (the
#: replay's synthetic end, found by after_boundary) in a real one
RUN_PATHS = {
    "path": "system",
    "reason": "/tmp/a/runs/r-aaaa/home/.claude against /tmp/a/runs/r-bbbb/home/.claude",
}
IDS = {"path": "metadata.user_id", "reason": "session id", "kind": "agent_ids", "incidental": True}
TWO = [
    {"path": "tools[0].description", "reason": "text differs", "kind": "real", "incidental": False},
    {"message": 2, "part": 0, "reason": "tool result", "kind": "real", "incidental": False},
]
AFTER = {"message": 4, "part": 0, "reason": "the replayed observation", "kind": "real", "incidental": False}
SUMMARY = {
    "aligned": 3,
    "same": 0,
    "bytes_only": 0,
    "differs": 3,
    "only_run_paths": 1,
    "only_incidental": 1,
    "first_parting_step": 1,
    "first_real_parting_step": 2,
}
DIFF = {"against": "r-5ca1ab1e0000", "summary": SUMMARY,
        "steps": [{"step": 1, "a": "x1", "b": "y1", "verdict": "differs", "first_byte": 40,
                   "only_run_paths": True, "differences": [RUN_PATHS], "structure": RUN_PATHS},
                  {"step": 2, "a": "x2", "b": "y2", "verdict": "differs", "first_byte": 50,
                   "only_run_paths": False, "only_incidental": False, "differences": [IDS, *TWO],
                   "structure": TWO[0]},
                  {"step": 3, "a": "x3", "b": "y3", "after_boundary": True, "verdict": "differs",
                   "first_byte": 60, "only_incidental": False, "differences": [AFTER],
                   "structure": AFTER}]}  # fmt: skip


def test_a_replay_ended_by_pvisor_adds_up_says_why_and_isolates_its_names(browser, tmp_path):
    """One page, each thing a new user met: the exchanges add up (2 steps, 1 ended by the replay;
    no auxiliary one, and the index's filter agrees), the agent's exit 143 said to be pvisor's
    stop, no tool time read "-", a whole body indented and a cut one as it is, the header's
    names isolated (a right-to-left override in the agent's name turns nothing else), a step
    whose request differs only in the runs' own paths marked quietly and not a divergence, every
    difference listed, the task as pvisor run was given it with the agent's message folded
    below, a resumed attempt's command."""
    journal = tmp_path / "j.sqlite"
    run = ended_replay(journal)
    with JournalReader(journal) as r:
        doc = run_document(r, run, body_limit=1024)
    doc["diff"] = DIFF
    page = tmp_path / "ended.html"
    page.write_text(render(doc))
    open_page(browser, page, "report-page-ended-replay")
    totals = browser.find_element("css selector", "#totals [data-total='exchanges']")
    assert totals.text.split("\n")[-1] == "3 (2 steps, 1 ended by the replay)"
    assert shown_totals(browser)["auxiliary"] == "0"
    assert (
        browser.find_element("css selector", "#filters input[data-filter='aux']")
        .find_element("xpath", "..")
        .text.strip()
        == "auxiliary (0)"
    )
    end = browser.find_element("css selector", "#index li.end")
    assert end.text.startswith("·") and "ended by the replay" in end.text and "∎" in end.text
    row = browser.find_element("css selector", ".row.end")
    assert "ended by the replay: its reply to the request after the boundary (step 1)" in row.text
    # the agent's exit code, and who stopped it
    assert (
        browser.find_element("id", "exit-code").text == "exit 143 (the agent's, stopped by pvisor: timed out)"
    )
    assert shown_totals(browser)["model-tool"].endswith(" / -")
    # bodies: the response whole, so indented; the request cut, as it is
    request, response = browser.find_elements("css selector", ".row[data-step='1'] details.body")
    for d in (request, response):
        browser.execute_script("arguments[0].open = true", d)
    reply = response.find_element("css selector", "pre").get_attribute("textContent")
    assert reply == json.dumps(json.loads(reply), indent=2) and "\n  " in reply
    sent = request.find_element("css selector", "pre").get_attribute("textContent")
    assert "bytes left out" in sent and sent.startswith('{"model":"m"')
    # the header: each name its own isolated run of text
    h1 = browser.find_element("css selector", "h1")
    assert [b.text for b in h1.find_elements("css selector", "bdi")] == [RLO_AGENT, "2.0", run]
    assert browser.execute_script(
        "return [...document.querySelectorAll('h1 bdi')]"
        ".every(b => getComputedStyle(b).unicodeBidi === 'isolate')"
    )
    requests_against_the_parents(browser)
    # the task as given, the agent's rendering folded, the resumed attempt's command
    assert browser.find_element("id", "task-given").text == f"task: {GIVEN}"
    folded = browser.find_element("id", "task-rendered")
    assert folded.tag_name == "details" and RENDERED in folded.get_attribute("textContent")
    assert RESUMED in browser.find_element("css selector", ".attempt-task[data-attempt='2']").text
    where_attempt_2_starts(browser)
    # no tool time: no ratio bar that would read as empty; a few steps' bars as wide as allowed
    assert not browser.find_elements("css selector", "#totals [data-total='model-tool'] .share")
    bars = browser.find_elements("css selector", "#chart rect.m")
    assert len(bars) == 2 and all(int(b.get_attribute("width")) == 96 for b in bars)
    no_leaks(browser)


def requests_against_the_parents(browser) -> None:
    """Step 1 differs only in the runs' own paths: a quiet mark (a symbol, its meaning in its
    tooltip, the entry's text whole), not a divergence, a one-line note on its card; step 2's
    real differences lead (the table's first, its card's), the agent's ids one folded clause;
    the request after the boundary's diff on the synthetic end's card and its table row so
    labelled; the summary's first step that really parts first, in words."""
    step1 = browser.find_element("css selector", "#index li[data-step='1']")
    mark = step1.find_element("css selector", ".mk.paths")
    assert mark.text == "≃" and "only in the runs' own paths" in mark.get_attribute("title")
    assert not step1.find_elements("css selector", ".mk.divergent")
    what = step1.find_element("css selector", ".ix-what")
    assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", what)
    assert (
        browser.find_element("css selector", "#filters input[data-filter='divergent']")
        .find_element("xpath", "..")
        .text.strip()
        == "divergences (2)"
    )
    pill = browser.find_element("css selector", ".row[data-step='1'] .pill[title]")
    assert pill.text == "request: only the runs' own paths" and "bad" not in pill.get_attribute("class")
    note = browser.find_element("css selector", ".row[data-step='1'] .reqdiff")
    assert "quiet" in note.get_attribute("class") and "\n" not in note.text
    assert "not a divergence" in note.text
    assert browser.find_element("css selector", "table.rd tr[data-step='1']").get_attribute(
        "data-verdict"
    ) == ("only_incidental")
    card2 = browser.find_element("css selector", ".row[data-step='2'] .reqdiff")
    lines = card2.text.split("\n")
    assert lines[1] == "tools[0].description: text differs", lines
    assert card2.find_element("css selector", ".rd-incidental summary").text == "also the agent's ids"
    row2 = browser.find_element("css selector", "table.rd tr[data-step='2']")
    where = row2.find_element("css selector", ".rd-where")
    assert where.text.split("\n")[0] == "tools[0].description: text differs", where.text
    folded = row2.find_element("css selector", ".rd-more")
    assert folded.text == "1 more difference" and "message 2 part 0" in folded.get_attribute("textContent")
    assert row2.find_element("css selector", ".rd-incidental").text == "also the agent's ids"
    end = browser.find_element("css selector", ".row.end .reqdiff")
    assert "message 4 part 0: the replayed observation" in end.text
    after = browser.find_element("css selector", "table.rd tr[data-after-boundary]")
    assert "(the request after the boundary)" in after.text
    summary = browser.find_element("id", "diff-summary").find_elements("css selector", "span")
    assert summary[0].text == "first step that really parts: 2"


def where_attempt_2_starts(browser) -> None:
    """The resumed attempt's first exchange: a divider in the index (its command), a line in
    the chart before its bar, a divider above its card; the divider's link jumps there."""
    divider = browser.find_element("css selector", "#index li.attempt-divider")
    assert divider.text.startswith("attempt 2: ") and RESUMED in divider.text
    following = divider.find_element("xpath", "following-sibling::li[1]")
    assert following.get_attribute("data-step") == "2"
    line = browser.find_element("css selector", "#chart g.attempt[data-attempt='2']")
    assert RESUMED in line.find_element("css selector", "title").get_attribute("textContent")
    start = browser.find_element("css selector", ".attempt-start[data-attempt='2']")
    card = start.find_element("xpath", "following-sibling::div[1]")
    assert card.get_attribute("data-step") == "2" and RESUMED in start.text
    divider.find_element("css selector", "a").click()
    assert in_view(browser, ".attempt-start[data-attempt='2']")
