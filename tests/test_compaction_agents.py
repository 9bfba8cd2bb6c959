"""Real agents made to compact under ``pvisor run --script`` (issue 14, item 1): the scripted
model reports token usage that passes each agent's threshold and answers its summary request
(docs/scripted-model.md, "Compaction"). The chain rule keeps every step of the main loop
across the compaction (the summary request is auxiliary, kind ``compaction``), and the native
render after the compaction starts where the agent's own request starts.

Recipes found by running the pinned agents (docs/native.md, "Compaction"):

- Claude Code 2.1.332: ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` turns on auto-compaction for its
  model (threshold: the window less 33000 tokens for claude-sonnet-4-5);
  ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` drops the billing block of its system prompt, whose
  fingerprint changes after a compaction (the scripted model would take the request for
  another conversation). Its summary must be inside ``<summary>`` tags.
- Codex 0.171.0: ``-c model_auto_compact_token_limit=5000`` (a launch argument: given here
  through the Python API's ``agent_args``); it compacts before the request after a reply whose
  usage reaches the limit, with an ordinary ``POST /v1/responses`` whose last input is its
  "CONTEXT CHECKPOINT COMPACTION" prompt.
- OpenCode 1.18.33: a project ``opencode.json`` in the workspace with a small ``limit.context``
  for the model (merged over pvisor's config); it compacts after a step whose usage passes the
  limit less ``limit.output``, asking with the history written out as text
  (``serialized_assistant`` counts its replies), and then sends a "Continue" prompt.
- Qwen Code 0.24.4: compacts at 167000 of its 200000-token window for an unknown model;
  ``QWEN_COMPACT_MAX_RECENT_FILES=0`` keeps it from re-sending files it touched as a message
  of their own. Its summary must hold a ``<state_snapshot>``; it writes an acknowledgement after
  the summary, which is no turn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from agent_captures import _run
from agent_helpers import entrypoint, pvisor, user_env
from pvisor.adapters.chains import classify_run
from pvisor.journal.reader import JournalReader
from pvisor.replay.prepare import PrepareOptions, prepare_only

pytestmark = pytest.mark.slow


def _shell(text: str, command: str, tokens: int) -> dict:
    return {
        "text": text,
        "tool_calls": [{"tool": "@shell", "command": command}],
        "usage": {"input_tokens": tokens, "output_tokens": 10},
    }


CODEX_ARGS = ["-c", "model_auto_compact_token_limit=5000"]

CASES = {
    "codex": (
        {
            "turns": [
                _shell("Listing first.", "echo one > a.txt; ls", 1000),
                _shell("Second look.", "cat a.txt", 8000),
                _shell("Third after compaction.", "echo three", 1200),
                {"text": "All done."},
            ],
            "compaction": {
                "when": ["CONTEXT CHECKPOINT COMPACTION"],
                "summary": "We wrote a.txt and read it.",
                "usage": {"input_tokens": 500, "output_tokens": 50},
            },
        },
        {},
    ),
    "claude-code": (
        {
            "turns": [
                _shell("First.", "ls", 1000),
                _shell("Second.", "echo two", 190000),
                _shell("Third.", "echo three", 3000),
                {"text": "All done."},
            ],
            "compaction": {
                "when": ["Your task is to create a detailed summary of"],
                "summary": "<analysis>scripted</analysis>\n"
                "<summary>We listed the files and echoed two.</summary>",
                "usage": {"input_tokens": 2000, "output_tokens": 50},
            },
        },
        {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "200000", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"},
    ),
    "opencode": (
        {
            "turns": [
                _shell("Listing first.", "echo one > a.txt; ls", 1000),
                _shell("Second look.", "cat a.txt", 12000),
                _shell("Third after compaction.", "echo three", 1200),
                {"text": "All done."},
            ],
            "compaction": {
                "when": ["Output exactly the Markdown structure shown inside <template>"],
                "summary": "We wrote a.txt and read it.",
                "usage": {"input_tokens": 500, "output_tokens": 50},
                "serialized_assistant": "\n\n[Assistant]:",
            },
        },
        {},
    ),
    "qwen-code": (
        {
            "turns": [
                _shell("Turn zero.", "echo zero", 1000),
                _shell("Turn one.", "echo one", 170000),
                _shell("Turn two.", "echo two", 3000),
                {"text": "Turn three: all done."},
            ],
            "compaction": {
                "when": ["produce the <state_snapshot> XML"],
                "summary": "<state_snapshot>\n<primary_request_and_intent>Run echo commands."
                "</primary_request_and_intent>\n</state_snapshot>",
                "usage": {"input_tokens": 2000, "output_tokens": 50},
                "agent_messages": ["Got it. Thanks for the additional context!"],
            },
        },
        {"QWEN_COMPACT_MAX_RECENT_FILES": "0"},
    ),
}


#: the Python API run of an agent with launch arguments (``pvisor run`` takes none)
_API_RUN = """
import json, sys
from pathlib import Path
from pvisor.session.run import RunRequest, run_agent
a = json.loads(sys.argv[1])
req = RunRequest(agent=a["agent"], task="Run the commands.", journal_path=Path(a["journal"]),
                 entrypoint=a["entrypoint"],
                 script=a["script"], workspace=Path(a["workspace"]), timeout=240, agent_args=a["args"])
print(json.dumps(run_agent(req, warn=lambda m: print(m, file=sys.stderr)).to_json()))
"""


def _capture(tmp_path: Path, agent: str) -> tuple[Path, dict]:
    script, env = CASES[agent]
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir(parents=True)
    home.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(script))
    journal = tmp_path / "data" / "journal.sqlite"
    if agent == "opencode":
        # a project config, merged over the one pvisor gives it: a small context limit
        (ws / "opencode.json").write_text(
            json.dumps(
                {
                    "provider": {
                        "pvisor": {"models": {"mock-model": {"limit": {"context": 10000, "output": 1000}}}}
                    }
                }
            )
        )
    if agent != "codex":
        return journal, _run(
            agent, tmp_path, journal, ws, home, tmp_path / "script.json", "Run the commands.", env=env
        )[1]
    # Codex compacts only with a launch argument, which pvisor run takes none of: the Python API
    spec = {
        "agent": agent,
        "journal": str(journal),
        "entrypoint": str(entrypoint(agent)),
        "script": str(tmp_path / "script.json"),
        "workspace": str(ws),
        "args": CODEX_ARGS,
    }
    journal.parent.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", _API_RUN, json.dumps(spec)],
        env=user_env(home, **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return journal, json.loads(proc.stdout)


@pytest.mark.parametrize("agent", sorted(CASES))
def test_the_main_loop_goes_on_across_a_real_compaction(tmp_path, agent):
    journal, report = _capture(tmp_path, agent)
    turns = len(CASES[agent][0]["turns"])
    with JournalReader(journal) as reader:
        c = classify_run(reader, report["run"])
        summaries = [lo for lo in c.left_out if lo.kind == "compaction"]
        # every scripted turn is a step: the requests after the compaction continue the main chain
        assert len(c.main.slots) == turns, [(lo.seq, lo.kind, lo.reason) for lo in c.left_out]
        assert len(summaries) == 1, c.left_out
        [after] = [i for i, s in enumerate(c.main.slots) if s.compaction is not None]
        assert c.main.slots[after].compaction.id == summaries[0].exchange
        recorded = [reader.request_body(s.kept.exchange) for s in c.main.slots]
    assert report["steps"] == turns
    # the rows start a new segment where the agent compacted, and nowhere else (docs/exports.md
    # "Segments"): the first step after it answered the history the agent compacted to
    from pvisor.adapters.exports.rows import iter_rows

    with JournalReader(journal) as reader:
        rows = list(iter_rows(reader, report["run"], bodies=False))
    breaks = [(r["step"], r["segment_break"]) for r in rows if r["segment_break"]]
    if agent == "qwen-code":
        # Qwen Code sends the summary alone once, then with its skills reminder put back before
        # it: the second request after the compaction changes the first again
        assert breaks == [(after + 1, "compaction"), (after + 2, "prefix_changed")], breaks
    else:
        assert breaks == [(after + 1, "compaction")], breaks
        assert [r["segment"] for r in rows] == [int(r["step"] > after) for r in rows]
    # the step before the compaction keeps its results and says so
    r = tmp_path / "prefix-journal"
    prepare_only(PrepareOptions(agent=agent, after_step=after, output=r, run=report["run"], journal=journal))
    result = json.loads((r / "result.json").read_text())
    assert (r / "prefix.json").read_bytes() == recorded[after]
    assert any(w["code"] == "compaction" and f"step {after}" in w["message"] for w in result["warnings"]), (
        result["warnings"]
    )
    # the result names the compaction the journal prefix starts from (the summary exchange)
    named = {k: result["prefix"]["compaction"][k] for k in ("after_step", "kind", "where")}
    assert named == {
        "after_step": after,
        "kind": "summary_request",
        "where": f"exchange {summaries[0].exchange}",
    }


def _texts(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        b.get("text") or (b.get("content") if isinstance(b.get("content"), str) else "")
        for b in content
        if isinstance(b, dict)
    )


def test_claude_code_native_render_after_a_real_compaction_starts_at_its_summary(tmp_path):
    journal, report = _capture(tmp_path, "claude-code")
    native = Path(report["native_trajectory"])
    with JournalReader(journal) as reader:
        c = classify_run(reader, report["run"])
        after = next(i for i, s in enumerate(c.main.slots) if s.compaction is not None)
        sent = orjson.loads(reader.request_body(c.main.slots[after].kept.exchange))
    out = tmp_path / "native"
    prepare_only(PrepareOptions(agent="claude-code", after_step=after, output=out, trajectory=native))
    result = json.loads((out / "result.json").read_text())
    body = orjson.loads((out / "prefix.json").read_bytes())
    assert result["prefix"]["compaction"]["after_step"] == after
    # the summary the agent sent (its date reminder before it is no line of the file), then
    # the reply it kept and its result, as sent (the agent appends reminders to the result)
    assert [m["role"] for m in body["messages"]] == [m["role"] for m in sent["messages"]]
    assert _texts(body["messages"][0]["content"]) in _texts(sent["messages"][0]["content"])
    assert "We listed the files and echoed two." in _texts(body["messages"][0]["content"])
    strip = lambda blocks: [  # noqa: E731
        {k: v for k, v in b.items() if k != "cache_control"} for b in blocks
    ]
    assert strip(body["messages"][1]["content"]) == strip(sent["messages"][1]["content"])

    def ids(m):
        return [
            b.get("tool_use_id")
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]  # noqa: E731

    assert ids(body["messages"][2]) == ids(sent["messages"][2])


@pytest.mark.parametrize("agent", ["codex", "opencode", "qwen-code"])
def test_native_render_after_a_real_compaction_is_the_request_the_agent_sent(tmp_path, agent):
    # Codex: the replacement history behind its base instructions; Qwen Code: the compressed
    # history. Compared at the first request after the compaction and the one after it
    # (Qwen Code puts its start-up reminders back from the second on: compared from message 1)
    journal, report = _capture(tmp_path, agent)
    native = Path(report["native_trajectory"])
    with JournalReader(journal) as reader:
        c = classify_run(reader, report["run"])
        after = next(i for i, s in enumerate(c.main.slots) if s.compaction is not None)
        sent = [orjson.loads(reader.request_body(s.kept.exchange)) for s in c.main.slots]
    key = "input" if agent == "codex" else "messages"
    for n in (after, after + 1):
        out = tmp_path / f"native-{n}"
        prepare_only(
            PrepareOptions(
                agent=agent,
                after_step=n,
                output=out,
                trajectory=native,
                profile_from=f"{journal}:{report['run']}",
            )
        )
        body = orjson.loads((out / "prefix.json").read_bytes())
        assert json.loads((out / "result.json").read_text())["prefix"]["compaction"]["after_step"] == after
        if agent == "qwen-code" and n > after:
            assert body[key][2:] == sent[n][key][2:]
            assert (
                body[key][1]["content"][-1] == sent[n][key][1]["content"][-1]
            )  # the summary, after the reminders
        else:
            assert body[key] == sent[n][key], n


@pytest.mark.parametrize("agent", sorted(CASES))
def test_replay_only_across_a_real_compaction(tmp_path, agent):
    """The replayed agent compacts again where it did (the served replies carry the recorded
    usage): its summary request is answered with the recorded summary, the requests after it
    carry that summary, and playback goes on to N without a divergence."""
    journal, report = _capture(tmp_path / "capture", agent)
    script, env = CASES[agent]
    n = len(script["turns"]) - 1  # after the last step with a tool call: past the compaction
    ws = tmp_path / "replay-ws"
    ws.mkdir()
    if agent == "opencode":
        (ws / "opencode.json").write_text((tmp_path / "capture" / "ws" / "opencode.json").read_text())
    args = [
        "--journal",
        str(journal),
        "replay",
        "--agent",
        agent,
        "--run",
        report["run"],
        "--after-step",
        str(n),
        "--replay-only",
        "--workspace",
        str(ws),
        "--output",
        str(tmp_path / "out"),
        "--agent-entrypoint",
        str(entrypoint(agent)),
    ]
    if agent == "codex":
        (tmp_path / "replay.toml").write_text(
            '[agents.codex]\narguments = ["-c", "model_auto_compact_token_limit=5000"]\n'
        )
        args += ["--config", str(tmp_path / "replay.toml")]
    proc = pvisor(args, env=user_env(tmp_path / "capture" / "home", **env), cwd=tmp_path, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert (result["status"], result["divergence"]) == ("ok", None), (result["errors"], proc.stderr)
    with JournalReader(journal) as reader:
        summary = next(
            lo.exchange for lo in classify_run(reader, report["run"]).left_out if lo.kind == "compaction"
        )
    assert any(
        "summary request" in a["reason"] and a["answered_from"] == summary for a in result["auxiliary"]
    ), result["auxiliary"]
    calls = [t for t in result["tool_calls"] if t["step"] <= n]
    # every observation the agent sent, paired with its own step (its history no longer holds the
    # early ones); OpenCode sends the results of the step before the compaction only as text
    # inside its summary request, so that one is not seen
    unseen = {2} if agent == "opencode" else set()
    assert result["replayed_tool_calls"] == len(calls) - len(unseen) and len(calls) == n
    assert all((t["replayed_call_id"] is not None) == (t["step"] not in unseen) for t in calls), calls


def test_replay_across_a_compaction_says_what_it_cannot_do(tmp_path):
    """From the native file (which holds no summary request) playback across the compaction is
    refused before any agent starts; from the journal, an agent that does not compact again (run
    without the settings it compacted with) is told in the result, not taken for a match."""
    journal, report = _capture(tmp_path / "capture", "claude-code")
    ws = tmp_path / "ws"
    ws.mkdir()
    common = [
        "--agent",
        "claude-code",
        "--after-step",
        "3",
        "--replay-only",
        "--workspace",
        str(ws),
        "--agent-entrypoint",
        str(entrypoint("claude-code")),
    ]
    env = user_env(tmp_path / "capture" / "home")  # without CLAUDE_CODE_AUTO_COMPACT_WINDOW
    native = pvisor(
        [
            "--journal",
            str(journal),
            "replay",
            *common,
            "--trajectory",
            report["native_trajectory"],
            "--output",
            str(tmp_path / "n"),
        ],
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert (
        native.returncode == 65 and "compaction_not_replayable" in native.stderr and "--run" in native.stderr
    ), native.stderr
    assert json.loads((tmp_path / "n" / "result.json").read_text())["derived_run"] is None
    proc = pvisor(
        [
            "--journal",
            str(journal),
            "replay",
            *common,
            "--run",
            report["run"],
            "--output",
            str(tmp_path / "j"),
            # the recorded start environment holds the variable the agent compacted with: not set
            "--env-from",
            "none",
        ],
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    result = json.loads((tmp_path / "j" / "result.json").read_text())
    missed = [d for d in result["context_differences"] if d["part"] == "compaction"]
    assert missed and "did not" in missed[0]["detail"], (result["context_differences"], proc.stderr)
