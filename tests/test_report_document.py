"""The data of a run's page (issue 43): ``outcome``, ``totals``, each step's reasoning, tool
calls by kind and the files it changed, the system prompt once, ``--no-workspace``; read from
the page ``pvisor report`` writes (its JSON data), of real runs captured through the real CLI
with the scripted model: Claude Code writing, reading, editing and running a failing shell
command that leaves a ``.env``, a binary file and a long file behind, a replay-only of it, and
mini-swe-agent exiting 0 after failing by its own account. The totals are checked against
``pvisor journal show --json`` and ``pvisor journal steps --json``."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import pytest
from agent_helpers import capture_scripted, entrypoint, pvisor, user_env
from cli_helpers import pvisor_main
from test_gateway_cli import ENV

from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.exports.report_workspace import DIFF_LINES, step_files
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.journal.reader import JournalReader

#: a key and a password the agent writes into .env without either appearing in its command
#: (base64 in the command): the page must name .env and show neither
KEY = "sk-proj-Zq8Xw2Lm4Nv6Bp0Rt7Yc3Kd5Hf9Js1GaUe"
PASSWORD = "plain-hunter2-correct-horse"
ENV_TEXT = f"OPENAI_API_KEY={KEY}\nDB_PASSWORD={PASSWORD}\n"
USAGE = {"input_tokens": 120, "output_tokens": 9}
SCRIPT = {
    "turns": [
        {"text": "Writing notes.", "reasoning": "I should write the notes first.", "usage": USAGE,
         "tool_calls": [{"tool": "Write",
                         "arguments": {"file_path": "notes.txt", "content": "alpha\nbeta\ngamma\n"}}]},
        {"text": "Reading.", "usage": USAGE,
         "tool_calls": [{"tool": "Read", "arguments": {"file_path": "notes.txt"}}]},
        {"text": "Editing.", "reasoning": "Beta becomes BETA.", "usage": USAGE,
         "tool_calls": [{"tool": "Edit", "arguments": {"file_path": "notes.txt", "old_string": "beta",
                                                       "new_string": "BETA"}}]},
        {"text": "Files.", "usage": USAGE,
         "tool_calls": [{"tool": "@shell", "command":
                         f"echo {base64.b64encode(ENV_TEXT.encode()).decode()} | base64 -d > .env; "
                         "printf 'PNG\\0\\1\\2' > blob.bin; seq 1 600 > big.txt; false"}]},
        {"text": "All done.", "usage": USAGE},
    ]
}  # fmt: skip


def page_data(journal: Path, run: str, out: Path, *extra: str) -> tuple[dict, str]:
    """``pvisor report RUN`` (this process): the page's data (its JSON) and the page's text."""
    p = pvisor_main(["--journal", str(journal), "report", run, "-o", str(out), *extra], env=ENV, text=True)
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    m = re.search(r'<script type="application/json" id="pvisor-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1).replace("<\\/", "</")), page


def cli_json(journal: Path, *args: str) -> dict:
    p = pvisor_main(["--journal", str(journal), *args], env=ENV, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def claude(tmp_path_factory):
    """The Claude Code run of :data:`SCRIPT` and its replay-only to step 1: (journal, run,
    derived run, the run's page data, the page's text)."""
    root = tmp_path_factory.mktemp("report-doc")
    cap = capture_scripted("claude-code", root, SCRIPT, "Write notes")
    (root / "ws2").mkdir()
    rep = pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", "claude-code", "--agent-entrypoint", cap.exe,
         "--run", cap.run, "--after-step", "1", "--replay-only", "--workspace", str(root / "ws2"),
         "--output", str(root / "out")],
        env=cap.env, cwd=root, timeout=300,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    derived = json.loads((root / "out" / "result.json").read_text())["derived_run"]
    doc, page = page_data(cap.journal, cap.run, root / "run.html")
    return cap.journal, cap.run, derived, doc, page


def steps_of(doc: dict) -> list[dict]:
    return [row["step"] for row in doc["exchanges"] if "step" in row]


def test_totals_equal_the_journals(claude):
    """Counts, tokens and times of the page equal those of ``journal show --json`` and ``journal
    steps --json``: exchanges, auxiliary, steps, retries, tool calls, failed calls, tokens, the
    time in flight, each step's time in the model and in its tools."""
    journal, run, _, doc, _ = claude
    shown = cli_json(journal, "journal", "show", run, "--json")
    steps = cli_json(journal, "journal", "steps", run, "--json")
    t = doc["totals"]
    assert t["exchanges"] == len(shown["exchanges"])
    assert t["auxiliary"] == len(steps["auxiliary"])
    assert t["steps"] == len(steps["steps"]) == 5
    assert t["retries"] == sum(len(s["retries"]) for s in steps["steps"])
    assert t["tool_calls"] == sum(len(s["action"]["tool_calls"]) for s in steps["steps"]) == 4
    failed = [
        r for s in steps["steps"] if s["observation"] for r in s["observation"]["results"] if r["is_error"]
    ]
    assert t["failed_calls"] == len(failed) == 1
    # every main-loop reply reported USAGE (Anthropic: no cache fields, so no cached count)
    assert t["tokens_in"] == sum(s["action"]["usage"]["input_tokens"] for s in steps["steps"]) == 5 * 120
    assert t["tokens_out"] == sum(s["action"]["usage"]["output_tokens"] for s in steps["steps"]) == 5 * 9
    assert t["tokens_cached"] is None
    by_id = {e["id"]: e for e in shown["exchanges"]}
    spans = sorted((e["started_ms"], e["started_ms"] + e["ended_us"] / 1000) for e in shown["exchanges"])
    assert all(a2 >= b1 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # one at a time: a plain sum
    assert t["model_ms"] == pytest.approx(sum(b - a for a, b in spans), abs=0.2)
    page_steps = steps_of(doc)
    tool_sum = 0.0
    for i, (mine, s) in enumerate(zip(page_steps, steps["steps"])):
        e = by_id[s["exchange"]]
        assert mine["model_ms"] == pytest.approx(e["ended_us"] / 1000, abs=0.1)
        assert mine["tokens"] == {"in": 120, "out": 9, "cached": None}
        if i + 1 < len(steps["steps"]):
            nxt = by_id[steps["steps"][i + 1]["exchange"]]
            gap = nxt["started_ms"] - (e["started_ms"] + e["ended_us"] / 1000)
            assert mine["tool_ms"] == pytest.approx(gap, abs=0.1)
            tool_sum += gap
        else:
            assert mine["tool_ms"] is None  # nothing follows the last step
    assert t["tool_ms"] == pytest.approx(tool_sum, abs=0.3)
    (attempt,) = shown["attempts"]
    assert t["wall_ms"] == pytest.approx(attempt["ended_ms"] - attempt["started_ms"], abs=0.1)
    assert doc["outcome"] == {
        "verdict": "succeeded",
        "exit_code": 0,
        "agent_status": {"outcome": "succeeded", "detail": None},
        "replay_status": None,
        "interrupted": None,
        "timed_out": False,
        "run_status": "ended",
    }


def test_reasoning_texts_and_tool_calls_by_kind(claude):
    """The reasoning is its text alone; each call has its kind from Claude Code's descriptor,
    its view (a write's file, a read's path, an edit's diff, a shell command) and whether it
    failed (the shell's ``false``)."""
    _, _, _, doc, _ = claude
    s = steps_of(doc)
    assert [x["reasoning"] for x in s] == [
        ["I should write the notes first."],
        [],
        ["Beta becomes BETA."],
        [],
        [],
    ]
    calls = [c for x in s for c in x["calls"]]
    assert [(c["name"], c["kind"], c["failed"]) for c in calls] == [
        ("Write", "write", False),
        ("Read", "read", False),
        ("Edit", "edit", False),
        ("Bash", "shell", True),
    ]
    assert calls[0]["view"] == {"path": "notes.txt", "content": "alpha\nbeta\ngamma\n"}
    assert calls[1]["view"] == {"path": "notes.txt"}
    assert calls[2]["view"] == {
        "path": "notes.txt",
        "diff": [["@", "@@ -1 +1 @@"], ["-", "beta"], ["+", "BETA"]],
    }
    assert calls[3]["view"]["command"].endswith("seq 1 600 > big.txt; false")
    assert doc["system"]["text"] and "Claude" in doc["system"]["text"]
    names = [t["name"] for t in doc["system"]["tools"]]
    assert {"Bash", "Edit", "Read", "Write"} <= set(names)
    bash = next(t for t in doc["system"]["tools"] if t["name"] == "Bash")
    assert json.loads(bash["parameters"])["properties"]["command"]["type"] == "string"


def test_files_each_step_changed(claude):
    """From the snapshots: step 1 added notes.txt, step 2 changed nothing, step 3 changed a line;
    step 4 added .env (named, secret, no content: neither the key nor the password anywhere in
    the page), blob.bin (binary, named only) and big.txt (its diff cut with a "more" count)."""
    _, _, _, doc, page = claude
    s = steps_of(doc)
    assert doc["workspace"] == {"shown": True, "reason": None, "capped": False, "unread": 0}
    assert s[0]["files"] == [
        {"path": "notes.txt", "change": "added", "binary": False, "secret": False,
         "diff": [["@", "@@ -0,0 +1,3 @@"], ["+", "alpha"], ["+", "beta"], ["+", "gamma"]], "more": 0}
    ]  # fmt: skip
    assert s[1]["files"] == []
    [edit] = s[2]["files"]
    assert edit["change"] == "changed" and ["-", "beta"] in edit["diff"] and ["+", "BETA"] in edit["diff"]
    env, big, blob = s[3]["files"]  # path order
    assert env == {
        "path": ".env",
        "change": "added",
        "binary": False,
        "secret": True,
        "diff": None,
        "more": 0,
    }
    assert blob == {
        "path": "blob.bin",
        "change": "added",
        "binary": True,
        "secret": False,
        "diff": None,
        "more": 0,
    }
    assert big["path"] == "big.txt" and big["change"] == "added" and not big["binary"]
    assert len(big["diff"]) == DIFF_LINES + 1 and big["diff"][-1][0] == "@"  # the cut, said
    assert big["more"] == 601 - DIFF_LINES  # the hunk head and 600 lines, DIFF_LINES shown
    assert all(x["files_more"] == 0 for x in s)
    text = html.unescape(page)
    assert KEY not in text and PASSWORD not in text and KEY[:20] not in text


def test_the_pages_cap_leaves_files_out_and_says_so(claude):
    """With a page budget smaller than big.txt's diff, the files after it are counted as left
    out (the step's ``more``) and the result says capped."""
    journal, run, _, _, _ = claude
    with JournalReader(journal) as r:
        meta = trajectory_from_journal(r, run).meta
        found = step_files(r, run, meta, page_bytes=40)
    assert found.capped and found.reason is None
    assert [f["path"] for f in found.files[1]] == ["notes.txt"]  # spends the budget
    assert found.files[3] == [] and found.more == {3: 1, 4: 3}


def test_no_workspace_leaves_the_files_out(claude, tmp_path):
    journal, run, _, _, _ = claude
    doc, page = page_data(journal, run, tmp_path / "plain.html", "--no-workspace")
    assert doc["workspace"] == {"shown": False, "reason": "--no-workspace", "capped": False, "unread": 0}
    assert all(x["files"] is None and x["files_more"] == 0 for x in steps_of(doc))
    assert '"blob.bin"' not in page and "@@ -0,0 +1,600 @@" not in page
    assert doc["totals"]["steps"] == 5  # the rest as before


def test_a_replay_keeps_its_status_as_a_label(claude, tmp_path):
    """The replay-only's derived run carries ``replay_status`` (the result's ``status``) and
    ``ended_by``; its page shows them."""
    journal, _, derived, _, _ = claude
    with JournalReader(journal) as r:
        labels = r.run(derived).labels
    assert labels["replay_status"] == "ok" and labels["ended_by"] in ("synthetic_end", "agent")
    doc, _ = page_data(journal, derived, tmp_path / "replay.html", "--no-parent")
    assert doc["outcome"]["replay_status"] == "ok" and doc["outcome"]["verdict"] == "succeeded"


def test_an_agent_exiting_0_that_failed_by_its_own_account_failed(tmp_path):
    """mini-swe-agent gets text where it wants a command, gives up (RepeatedFormatError) and
    exits 0: the page's verdict is failed, beside exit code 0 and its own account."""
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir(), home.mkdir()
    (tmp_path / "s.json").write_text(json.dumps({"turns": [{"text": "I will only talk.", "repeat": 40}]}))
    journal = tmp_path / "j.sqlite"
    proc = pvisor(
        ["--journal", str(journal), "run", "--agent", "mini-swe-agent", "--agent-entrypoint",
         str(entrypoint("mini-swe-agent")), "--script", str(tmp_path / "s.json"), "--workspace", str(ws),
         "--json", "--", "write a.txt"],
        env=user_env(home), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["agent_exit_code"] == 0, proc.stderr
    doc, _ = page_data(journal, report["run"], tmp_path / "p.html")
    o = doc["outcome"]
    assert (o["verdict"], o["exit_code"]) == ("failed", 0)
    assert o["agent_status"] == {"outcome": "failed", "detail": "RepeatedFormatError"}


#: what each agent's shell tool answers for ``cat does-not-exist.txt`` (exit 1), as recorded runs
#: and the agents' sources word it: the code it states
SHELL_ANSWERS = {
    "codex": "Chunk ID: bd56f8\nWall time: 0.0000 seconds\nProcess exited with code 1\nOriginal token "
    "count: 13\nOutput:\ncat: does-not-exist.txt: No such file or directory\n",
    "gemini-cli": "Output: cat: does-not-exist.txt: No such file or directory\nExit Code: 1\n"
    "Process Group PGID: 4242",
    "qwen-code": "Command: cat does-not-exist.txt\nDirectory: (root)\nOutput: Exit Code: 0\nError: (none)\n"
    "Exit Code: 1\nSignal: (none)\nProcess Group PGID: 4242",
    "mini-swe-agent": '{\n  "returncode": 1,\n  "output": "cat: does-not-exist.txt: No such file"\n}',
}


def test_a_shell_call_whose_output_states_a_non_zero_code_failed(tmp_path):
    """Codex's results carry no is_error: its ``cat does-not-exist.txt`` (a real capture) is a
    failed call by the exit code its output states, as Claude Code's is by is_error; each
    agent's words for the code are its descriptor's (the last statement counts: a command's
    own output saying ``Exit Code: 0`` does not)."""
    for agent, text in SHELL_ANSWERS.items():
        assert get_descriptor(agent).shell_exit_code(text) == 1, agent
    assert get_descriptor("opencode").shell_exit_code("Exit Code: 1") is None
    missing = {"tool": "@shell", "command": "cat does-not-exist.txt"}
    script = {"turns": [{"text": "Look.", "tool_calls": [missing]}, {"text": "Done."}]}
    cap = capture_scripted("codex", tmp_path, script, "read it")
    doc, _ = page_data(cap.journal, cap.run, tmp_path / "p.html")
    [call] = steps_of(doc)[0]["calls"]
    assert (call["kind"], call["failed"]) == ("shell", True)
    assert doc["totals"]["failed_calls"] == 1
