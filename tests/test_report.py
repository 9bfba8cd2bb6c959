"""``pvisor report`` (issue 19): a run as one self-contained HTML page, checked in a real browser:
headless Chromium from Debian's packages, driven by Selenium through Debian's chromedriver
(``.ci/run`` installs both with apt; Playwright's own browser download cannot work here).

The pages of a real Claude Code run (captured through ``pvisor run --script``) and of its
replay-only derived run load without a console error or a network request; the steps, their
tool calls, the auxiliary exchanges, the boundary and the link to the parent are where they
should be; opening an exchange shows its body; O against O' is shown per step. A screenshot of
each page is kept under ``$PVISOR_TEST_ARTIFACTS`` (default ``.test-artifacts/`` in the
checkout). A run of many steps renders in slices as the page is scrolled.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from agent_helpers import capture_scripted, pvisor
from cli_helpers import pvisor_main
from conftest import REPO, cannot_run_here
from test_gateway_cli import ENV, PVISOR

from pvisor.journal.model import Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal

CHROMIUM = os.environ.get("PVISOR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PVISOR_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("PVISOR_TEST_ARTIFACTS", REPO / ".test-artifacts"))
KEY = "sk-ant-api03-Rp4Tz8LmQ2vX7nKw1NbH5cJd9FsG3aEu6oYq0ZxVe"
SECRETS_SENT = [KEY]


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (``--no-sandbox``: the tests run as root), with its console log kept."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        cannot_run_here(
            f"no {CHROMIUM} or {CHROMEDRIVER}: apt-get install chromium chromium-driver (.ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
    ):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def open_page(driver, page: Path, shot: str):
    """Load ``page``; fail on any console message of level WARNING or above; keep a screenshot."""
    from selenium.webdriver.support.ui import WebDriverWait

    uri = page.resolve().as_uri()
    driver.get(uri)
    # get() returns at the load event, yet twice (under load, a page opened right after another
    # page's jumps) the flag was unset then: wait for this page's script to say it is done (a page
    # whose script fails never sets it, and the wait fails after 30 s)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script(
            "return document.URL.split('#')[0] === arguments[0] && document.body "
            "&& document.body.dataset.ready === '1'",
            uri,
        )
    )
    problems = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert problems == [], problems
    # self-contained: nothing fetched besides the page itself
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{shot}.png"))


def texts(driver, css: str) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", css)]


def open_body(driver, details):
    """Open an exchange's body block and return its ``pre``: the page builds it on the block's
    ``toggle`` event, which the HTML standard fires from a task queued after the click, so the
    click can return before it exists (Chromium 150 returned first in CI). Waits at most 10 s."""
    from selenium.webdriver.support.ui import WebDriverWait

    details.find_element("css selector", "summary").click()
    return WebDriverWait(driver, 10).until(lambda _: details.find_elements("css selector", "pre"))[0]


@pytest.fixture(scope="module")
def claude_runs(tmp_path_factory):
    """A Claude Code run captured with the scripted model (one shell call, then the end), and
    its replay-only to step 1: (journal, captured run id, derived run id)."""
    root = tmp_path_factory.mktemp("report-runs")
    ws2 = root / "ws2"
    ws2.mkdir()
    script = {
        "turns": [
            {"text": "Writing it.",
             "tool_calls": [{"tool": "@shell", "command": "echo hello > hello.txt && cat hello.txt"}]},
            {"text": "hello.txt is written."},
        ]
    }  # fmt: skip
    cap = capture_scripted("claude-code", root, script, "Write hello.txt")
    journal, captured, exe, env = cap.journal, cap.run, cap.exe, cap.env
    rep = pvisor(
        ["--journal", str(journal), "replay", "--agent", "claude-code", "--agent-entrypoint", exe,
         "--run", captured, "--after-step", "1", "--replay-only", "--workspace", str(ws2),
         "--output", str(root / "out")],
        env=env, cwd=root, timeout=300,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    derived = json.loads((root / "out" / "result.json").read_text())["derived_run"]
    return journal, captured, derived


def report(journal: Path, run: str, output: Path, *extra: str):
    """``pvisor report`` in this process (tests/cli_helpers.py); test_bad_input_gets_one_line runs
    the pvisor process for its exit codes."""
    return pvisor_main(
        ["--journal", str(journal), "report", run, "-o", str(output), *extra], env=ENV, text=True
    )


@pytest.mark.slow
def test_the_page_of_a_captured_claude_code_run(browser, claude_runs, tmp_path):
    journal, run, _ = claude_runs
    p = report(journal, run, tmp_path / "run.html", "--body-limit", "1MiB")  # Claude Code's bodies whole
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(tmp_path / "run.html")
    open_page(browser, tmp_path / "run.html", "report-captured")
    with JournalReader(journal) as r:
        exchanges = r.exchanges(run)
    main = [e for e in exchanges if e.role == "main"]
    assert len(texts(browser, ".row.main")) == len(main) == 2
    assert len(texts(browser, ".row.aux")) == len(exchanges) - 2  # Claude Code's settings requests, greyed
    assert texts(browser, ".step-n") == ["step 1", "step 2"]
    [call] = browser.find_elements("css selector", ".row.main .call")
    assert call.text.startswith("Bash(") and "echo hello > hello.txt" in call.text
    assert "Write hello.txt" in browser.find_element("id", "task").text
    assert browser.find_elements("id", "boundary") == []  # a capture has none
    # opening an exchange's request shows its body (the task is in it)
    first = browser.find_elements("css selector", ".row.main details.request")[0]
    assert "Write hello.txt" in open_body(browser, first).text
    observation = browser.find_elements("css selector", ".row.main details.observation")[0]
    observation.find_element("css selector", "summary").click()
    assert "hello" in observation.find_element("css selector", "pre").text


@pytest.mark.slow
def test_the_page_of_a_replay_marks_the_boundary_compares_o_and_links_the_parent(
    browser, claude_runs, tmp_path
):
    journal, parent, derived = claude_runs
    p = report(journal, derived, tmp_path / "replay.html")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(tmp_path / "replay.html"), str(tmp_path / f"{parent}.html")]
    open_page(browser, tmp_path / "replay.html", "report-replay")
    # the boundary comes right after step 1, before the request that ends at O'1
    rows = browser.find_elements("css selector", "#timeline > div")
    kinds = [
        r.get_attribute("id") if r.get_attribute("id") == "boundary" else r.get_attribute("class")
        for r in rows
    ]
    at = kinds.index("boundary")
    assert "step 1" in rows[at - 1].text and at == len(rows) - 2
    assert "synthetic_end" in rows[at + 1].text  # playback's final reply: no step
    compare = browser.find_element("css selector", "details.compare[data-step='1']")
    compare.find_element("css selector", "summary").click()
    assert "equal" in compare.text and "Bash: O′ equals O" in compare.text
    link = browser.find_element("id", "parent-link")
    assert link.get_attribute("href").endswith(f"/{parent}.html")
    link.click()
    assert browser.find_element("css selector", "h1").text.endswith(parent)
    assert [e["level"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def long_run(path: Path, steps: int) -> str:
    """A Chat Completions run of ``steps`` steps (one shell call each), recorded straight into a
    journal, with a key in its headers that the page must not show."""
    run = f"long{steps}"
    tool = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "count"}]
    with Journal.open(path) as j:
        j.create_run(Run(id=run, agent="mini-swe-agent"))
        for i in range(steps):
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "bash", "arguments": f'{{"command":"echo {i}"}}'},
            }
            reply = {"id": "c", "object": "chat.completion", "model": "m",
                     "usage": {"prompt_tokens": 10 + i, "completion_tokens": 3},
                     "choices": [{"index": 0,
                                  "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                                  "finish_reason": "tool_calls"}]}  # fmt: skip
            j.record_exchange(
                run, "POST", "/v1/chat/completions", [("authorization", f"Bearer {KEY}")],
                protocol="openai-chat", status=200,
                request_body=orjson.dumps({"model": "m", "messages": messages, "tools": [tool]}),
                response_body=orjson.dumps(reply),
            )  # fmt: skip
            messages = [*messages, {"role": "assistant", **reply["choices"][0]["message"]},
                        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"out {i}"}]  # fmt: skip
        j.flush()
    return run


def test_a_long_run_renders_in_slices_as_it_is_scrolled(browser, tmp_path):
    """450 steps: the page shows the first 200 at once and the rest as the reader scrolls; the
    token usage is shown; bodies beyond --body-limit are cut with the command that shows them
    whole; the key of the headers is nowhere in the page."""
    journal = tmp_path / "j.sqlite"
    run = long_run(journal, 450)
    p = report(journal, run, tmp_path / "long.html", "--body-limit", "2KiB")
    assert p.returncode == 0, p.stderr
    assert KEY[14:30].encode() not in (tmp_path / "long.html").read_bytes()
    open_page(browser, tmp_path / "long.html", "report-long")
    assert len(browser.find_elements("css selector", ".row.main")) == 200
    assert "tokens in 10 / out 3" in browser.find_elements("css selector", ".usage")[0].text
    for _ in range(10):
        browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
        if len(browser.find_elements("css selector", ".row.main")) == 450:
            break
        time.sleep(0.2)
    assert len(browser.find_elements("css selector", ".row.main")) == 450
    assert texts(browser, ".step-n")[-1] == "step 450"
    last = browser.find_elements("css selector", ".row.main details.request")[-1]
    body = open_body(browser, last).text
    assert "bytes left out: pvisor journal body" in body and "--request" in body


def test_bad_input_gets_one_line(tmp_path):
    journal = tmp_path / "j.sqlite"
    long_run(journal, 2)
    cases = [
        (["report", "nope"], 2, "nope"),
        (["report", "long2", "-o", str(journal / "x.html")], 2, f"{journal} is not a directory"),
        (["report", "long2", "-o", str(tmp_path)], 2, "is a directory"),
        (["report", "long2", "--body-limit", "12"], 2, "--body-limit"),
        # "-" was taken for a file named "-" (exit 0); the page and its parent's are files
        (["report", "long2", "-o", "-"], 2, "give a FILE"),
        (["report", "--all", "-o", "-"], 2, "give a DIR"),
    ]
    for args, code, expected in cases:
        p = subprocess.run(
            [*PVISOR, "--journal", str(journal), *args], env=ENV, capture_output=True, text=True, cwd=tmp_path
        )
        assert p.returncode == code, (args, p.stderr)
        assert expected in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "-").exists()
    with sqlite3.connect(journal) as conn:  # nothing was written into the journal
        assert conn.execute("select count(*) from runs").fetchone() == (1,)
    # -o into directories that do not exist yet: made (mode 0700), as by every -o
    p = subprocess.run(
        [*PVISOR, "--journal", str(journal), "report", "long2", "-o", str(tmp_path / "new" / "r.html")],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and (tmp_path / "new" / "r.html").is_file(), p.stderr
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


def _two_step_run(j, run: str, outputs: list[str]) -> None:
    """A Qwen Code Chat Completions run of two shell calls whose results are ``outputs``."""
    tool = {"type": "function", "function": {"name": "run_shell_command", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "count"}]
    for i in range(3):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "run_shell_command", "arguments": f'{{"command":"echo {i}"}}'},
        }
        message = (
            {"role": "assistant", "content": None, "tool_calls": [call]}
            if i < 2
            else {"role": "assistant", "content": "done"}
        )
        reply = {
            "id": "c",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if i < 2 else "stop"}],
        }
        j.record_exchange(
            run,
            "POST",
            "/v1/chat/completions",
            [],
            protocol="openai-chat",
            status=200,
            request_body=orjson.dumps({"model": "m", "messages": messages, "tools": [tool]}),
            response_body=orjson.dumps(reply),
        )
        if i < 2:
            messages = [
                *messages,
                message,
                {"role": "tool", "tool_call_id": f"call_{i}", "content": outputs[i]},
            ]
    # fmt: skip


def test_o_against_o_prime_is_equal_once_the_agents_decorations_are_normalised(tmp_path):
    """Qwen Code's "Process Group PGID:" differs between two runs of the same command: the page
    says equal once normalised (as result.json compares), and still shows the bytes' diff; a
    real difference in the output stays a difference."""
    from pvisor.adapters.exports.report_document import run_document

    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="parent", agent="qwen-code"))
        _two_step_run(
            j, "parent", ["Output: 0\nProcess Group PGID: 101", "Output: 1\nProcess Group PGID: 102"]
        )
        j.create_run(
            Run(id="child", agent="qwen-code", parent_run="parent", boundary_step=2, mode="replay-only")
        )
        _two_step_run(
            j, "child", ["Output: 0\nProcess Group PGID: 901", "Output: one\nProcess Group PGID: 902"]
        )
        j.flush()
    with JournalReader(path) as r:
        doc = run_document(r, "child")
    first, second = (c["calls"][0] for c in doc["comparison"])
    assert first["diff"] is not None and first["same_normalised"] is True
    assert second["diff"] is not None and second["same_normalised"] is False
