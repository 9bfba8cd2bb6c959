"""Compaction (issue 14, item 1): the prefix at step N starts from the compaction in effect at N,
as the agent rebuilds its request, and the result names the compaction used.

Native files are made here from real sessions of the corpus with compaction records inserted in
each agent's own format (docs/native.md, "Compaction"); the real captures of agents made to
compact under ``pvisor run`` are in tests/test_compaction_agents.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from conftest import corpus_dir
from pvisor.adapters.native import read_native
from pvisor.replay.prepare import PrepareOptions, prepare_only

CODEX_REAL = corpus_dir() / "native" / "codex" / "real-0.171.0_single-then-resume.jsonl"
SUMMARY = "Summary: out.txt holds hello."


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _prepare(tmp_path: Path, agent: str, source: Path, n: int, **kw) -> tuple[dict, dict]:
    out = tmp_path / f"out-{n}"
    prepare_only(PrepareOptions(agent=agent, after_step=n, output=out, trajectory=source, **kw))
    result = json.loads((out / "result.json").read_text())
    return result, orjson.loads((out / "prefix.json").read_bytes())


# --------------------------------------------------------------------------- Codex


def _codex_compacted(tmp_path: Path) -> tuple[Path, list[dict], dict]:
    """The real rollout with a ``compacted`` record after step 1's output (line 13): its
    replacement history is the developer item, the context item, the task and a summary."""
    recs = _lines(CODEX_REAL)
    items = [recs[i]["payload"] for i in (2, 3, 7)]  # lines 3, 4 and 8
    summary = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": SUMMARY}]}
    history = [*items, summary]
    compacted = {
        "timestamp": recs[12]["timestamp"],
        "type": "compacted",
        "payload": {"message": SUMMARY, "replacement_history": history},
    }
    path = _write(tmp_path / "rollout-compacted.jsonl", [*recs[:13], compacted, *recs[13:]])
    return path, recs, {"history": history}


def _wire(item: dict) -> dict:
    return {k: v for k, v in item.items() if k != "internal_chat_message_metadata_passthrough"}


def test_codex_replacement_history_starts_every_later_prefix(tmp_path):
    path, recs, c = _codex_compacted(tmp_path)
    history = [_wire(i) for i in c["history"]]
    traj = read_native(path, "codex")[0].trajectory
    assert [(x.after_step, x.kind, x.where) for x in traj.compactions] == [(1, "compacted", "line 14")]
    # N = 0 and the steps before the compaction are untouched
    before, body0 = _prepare(tmp_path, "codex", path, 0)
    plain, plain0 = _prepare(tmp_path / "plain", "codex", CODEX_REAL, 0)
    assert body0 == plain0 and before["prefix"]["compaction"] is None
    # N = 1: request 2 is the replacement history alone (step 1's call and output are in it)
    r1, body1 = _prepare(tmp_path, "codex", path, 1)
    assert body1["input"] == history
    assert not any(
        w["code"] == "compaction_render_differs" for w in r1["warnings"]
    )  # Codex sends what its file holds
    assert r1["prefix"]["compaction"] == {
        "after_step": 1,
        "kind": "compacted",
        "where": "line 14",
        "history_messages": 4,
        "summary_sha256": __import__("hashlib").sha256(SUMMARY.encode()).hexdigest(),
    }
    assert any(w["code"] == "compaction" and "step 1" in w["message"] for w in r1["warnings"]), r1["warnings"]
    # N = 3: the history, then A_2 (line 16), O_2 (the next prompt, line 23), A_3 (line 25) and O_3 (line 28)
    _, body3 = _prepare(tmp_path, "codex", path, 3)
    assert body3["input"] == [*history, *[_wire(recs[i]["payload"]) for i in (15, 22, 24, 27)]]
    # without the compaction record the same N keeps the whole history: the record is what changed it
    _, plain3 = _prepare(tmp_path / "plain", "codex", CODEX_REAL, 3)
    assert SUMMARY not in json.dumps(plain3) and len(plain3["input"]) > len(body3["input"]) - len(history) + 1


def test_codex_compacted_without_replacement_history_refuses_later_prefixes(tmp_path):
    recs = _lines(CODEX_REAL)
    compacted = {"timestamp": recs[12]["timestamp"], "type": "compacted", "payload": {"message": SUMMARY}}
    path = _write(tmp_path / "rollout-old.jsonl", [*recs[:13], compacted, *recs[13:]])
    from pvisor.replay.errors import ReplayBadInput

    traj = read_native(path, "codex")[0].trajectory
    assert [(c.after_step, c.rebuilt) for c in traj.compactions] == [
        (1, False)
    ] and "compaction" in traj.steps[0].flags
    # the file does not say what the model saw after it: refused, never a guess
    with pytest.raises(ReplayBadInput) as exc:
        _prepare(tmp_path, "codex", path, 2)
    assert exc.value.message.startswith("compaction_not_rebuilt") and "line 14" in exc.value.message
    result, _ = _prepare(tmp_path, "codex", path, 0)
    assert result["prefix"]["compaction"] is None


# --------------------------------------------------------------------------- Claude Code

CLAUDE_REAL = corpus_dir() / "native" / "claude-code" / "spotter_tool_heavy.jsonl"
CLAUDE_SUMMARY = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:\nPhoenix was started in the background."
)


def _claude_compacted(tmp_path: Path, preserve: bool = False) -> Path:
    """The real session with an auto-compaction after step 1's result (line 11): a
    ``compact_boundary`` (no parent, ``logicalParentUuid`` the result line), the summary user line
    after it, and step 2's first line re-parented onto the summary, as Claude Code writes them."""
    recs = _lines(CLAUDE_REAL)
    result = recs[10]
    assert result["type"] == "user" and result["message"]["content"][0]["type"] == "tool_result"
    common = {k: result[k] for k in ("sessionId", "version", "cwd", "gitBranch", "userType") if k in result}
    boundary = {
        **common,
        "parentUuid": None,
        "logicalParentUuid": result["uuid"],
        "isSidechain": False,
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "isMeta": False,
        "timestamp": result["timestamp"],
        "uuid": "b0000000-0000-4000-8000-000000000001",
        "level": "info",
        "compactMetadata": {"trigger": "auto", "preTokens": 180000},
    }
    summary = {
        **common,
        "parentUuid": boundary["uuid"],
        "isSidechain": False,
        "type": "user",
        "isCompactSummary": True,
        "isVisibleInTranscriptOnly": True,
        "message": {"role": "user", "content": CLAUDE_SUMMARY},
        "uuid": "b0000000-0000-4000-8000-000000000002",
        "timestamp": result["timestamp"],
    }
    if preserve:  # 2.1.3xx keeps the reply that triggered it and its result verbatim after the summary
        boundary["compactMetadata"]["preservedMessages"] = {
            "anchorUuid": summary["uuid"],
            "uuids": [recs[4]["uuid"], result["uuid"]],
        }
    nxt = dict(recs[11], parentUuid=summary["uuid"])
    return _write(tmp_path / "session-compacted.jsonl", [*recs[:11], boundary, summary, nxt, *recs[12:]])


def _no_markers(obj):
    if isinstance(obj, dict):
        return {k: _no_markers(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [_no_markers(v) for v in obj]
    return obj


def test_claude_code_prefix_after_a_compaction_starts_at_the_summary(tmp_path):
    path = _claude_compacted(tmp_path)
    traj = read_native(path, "claude-code")[0].trajectory
    assert [(c.after_step, c.kind, c.where, c.summary) for c in traj.compactions] == [
        (1, "compact_boundary", "line 12", CLAUDE_SUMMARY)
    ]
    assert "compaction" in traj.steps[0].flags and len(traj.steps) == len(
        read_native(CLAUDE_REAL, "claude-code")[0].trajectory.steps
    )
    r1, body1 = _prepare(tmp_path, "claude-code", path, 1)
    assert [(m["role"], _no_markers(m["content"])) for m in body1["messages"]] in (
        [("user", CLAUDE_SUMMARY)],
        [("user", [{"type": "text", "text": CLAUDE_SUMMARY}])],
    )
    assert r1["prefix"]["compaction"]["where"] == "line 12" and r1["prefix"]["ends_with"] == "observation"
    # what Claude Code sends beyond its file after a compaction is said, not hidden
    assert any(
        w["code"] == "compaction_render_differs" and "date reminder" in w["message"] for w in r1["warnings"]
    ), r1["warnings"]
    # N = 2: the summary, then A_2 and O_2 exactly as without the compaction
    _, body2 = _prepare(tmp_path, "claude-code", path, 2)
    _, plain2 = _prepare(tmp_path / "plain", "claude-code", CLAUDE_REAL, 2)
    assert _no_markers(body2["messages"][1:]) == _no_markers(plain2["messages"][3:])
    assert _no_markers(body2["messages"][0]["content"]) in (
        CLAUDE_SUMMARY,
        [{"type": "text", "text": CLAUDE_SUMMARY}],
    )
    assert "start phoenix" not in json.dumps(body2["messages"])
    # N = 0 is untouched
    _, body0 = _prepare(tmp_path, "claude-code", path, 0)
    _, plain0 = _prepare(tmp_path / "plain", "claude-code", CLAUDE_REAL, 0)
    assert body0 == plain0


def test_claude_code_messages_kept_verbatim_follow_the_summary(tmp_path):
    path = _claude_compacted(tmp_path, preserve=True)
    [c] = read_native(path, "claude-code")[0].trajectory.compactions
    assert (c.after_step, c.steps_from) == (1, 1)
    _, body1 = _prepare(tmp_path, "claude-code", path, 1)
    _, plain1 = _prepare(tmp_path / "plain", "claude-code", CLAUDE_REAL, 1)
    # the summary, then A_1 and O_1 as the plain render sends them after the task
    assert _no_markers(body1["messages"][0]["content"]) in (
        CLAUDE_SUMMARY,
        [{"type": "text", "text": CLAUDE_SUMMARY}],
    )
    assert _no_markers(body1["messages"][1:]) == _no_markers(plain1["messages"][1:])


def test_codex_reply_to_its_summary_request_is_no_step(tmp_path):
    # Codex writes the model's summary as an ordinary assistant item just before `compacted`
    recs = _lines(CODEX_REAL)
    reply = {
        "timestamp": recs[12]["timestamp"],
        "type": "response_item",
        "payload": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": SUMMARY}],
        },
    }
    usage = recs[10]  # a token_usage_record ends the reply
    path, _, c = _codex_compacted(tmp_path)
    compacted = _lines(path)[13]
    path = _write(
        tmp_path / "rollout-with-reply.jsonl",
        [
            *recs[:13],
            reply,
            usage,
            dict(compacted, payload=dict(compacted["payload"], message="Prefix text:\n" + SUMMARY)),
            *recs[13:],
        ],
    )
    traj = read_native(path, "codex")[0].trajectory
    plain = read_native(CODEX_REAL, "codex")[0].trajectory
    assert len(traj.steps) == len(plain.steps) and [s.action.text for s in traj.steps] == [
        s.action.text for s in plain.steps
    ]
    assert any(lo.kind == "compaction_summary" for lo in traj.left_out)
    assert traj.compactions[0].after_step == 1
    # a lone assistant message whose text the record does not end with stays a step
    other = _write(
        tmp_path / "rollout-other.jsonl",
        [
            *recs[:13],
            reply,
            usage,
            dict(compacted, payload=dict(compacted["payload"], message="else")),
            *recs[13:],
        ],
    )
    assert len(read_native(other, "codex")[0].trajectory.steps) == len(plain.steps) + 1


# --------------------------------------------------------------------------- Qwen Code

QWEN_REAL = corpus_dir() / "native" / "qwen-code" / "real-0.24.4_single.jsonl"
QWEN_SUMMARY = (
    "<state_snapshot>Created the file.</state_snapshot>\n\nResume the prior task using the summary above."
)


def test_qwen_code_compressed_history_starts_the_later_prefixes(tmp_path):
    recs = _lines(QWEN_REAL)
    call = recs[3]["message"]["parts"][0]["functionCall"]
    result = recs[5]["message"]["parts"][0]
    history = [
        {"role": "user", "parts": [{"text": QWEN_SUMMARY}]},
        {
            "role": "model",
            "parts": [{"text": "Got it. Thanks for the additional context!"}, {"functionCall": call}],
        },
        {"role": "user", "parts": [result]},
    ]
    record = {
        "uuid": "c0000000-0000-4000-8000-000000000001",
        "parentUuid": recs[6]["uuid"],
        "sessionId": recs[6].get("sessionId"),
        "timestamp": recs[6]["timestamp"],
        "type": "system",
        "subtype": "chat_compression",
        "version": recs[6].get("version"),
        "systemPayload": {"info": {"compressionStatus": 1}, "compressedHistory": history},
    }
    nxt = dict(recs[7], parentUuid=record["uuid"])
    path = _write(tmp_path / "chat.jsonl", [*recs[:7], record, nxt, *recs[8:]])
    traj = read_native(path, "qwen-code")[0].trajectory
    [c] = traj.compactions
    assert (c.after_step, c.kind, c.where, c.summary) == (1, "chat_compression", "line 8", QWEN_SUMMARY)
    r1, body1 = _prepare(tmp_path, "qwen-code", path, 1)
    msgs = [m for m in body1["messages"] if m["role"] != "system"]
    assert msgs[0] == {"role": "user", "content": [{"type": "text", "text": QWEN_SUMMARY}]}
    assert (
        msgs[1]["role"] == "assistant" and msgs[1]["content"] == "Got it. Thanks for the additional context!"
    )
    assert (
        [t["id"] for t in msgs[1]["tool_calls"]] == [call["id"]]
        and msgs[2]["role"] == "tool"
        and msgs[2]["tool_call_id"] == call["id"]
    )
    assert r1["prefix"]["compaction"]["kind"] == "chat_compression"
    assert any(
        w["code"] == "compaction_render_differs" and "start-up reminders" in w["message"]
        for w in r1["warnings"]
    )
    # N = 2: then A_2 (the final answer) and O_2 (the next prompt), as without the compaction
    _, body2 = _prepare(tmp_path, "qwen-code", path, 2)
    _, plain2 = _prepare(tmp_path / "plain", "qwen-code", QWEN_REAL, 2)
    assert (
        body2["messages"][-2:] == plain2["messages"][-2:]
        and len(body2["messages"]) == len(body1["messages"]) + 2
    )


# ----------------------------------------------------------------- compactions a file does not rebuild

GEMINI_REAL = corpus_dir() / "native" / "gemini-cli" / "real-0.61.0_single-then-resume.jsonl"


def test_gemini_cli_history_rewrite_is_a_compaction_a_prefix_after_it_refuses(tmp_path):
    from pvisor.replay.errors import ReplayBadInput

    recs = _lines(GEMINI_REAL)
    plain = read_native(GEMINI_REAL, "gemini-cli")[0].trajectory
    # a resume's snapshots (its initial context, then the known history) are no compaction
    assert plain.compactions == [] and not any("compaction" in s.flags for s in plain.steps)
    # chat compression: the list rewritten to the context, a summary and an acknowledgement (new ids)
    snapshot = {
        "$set": {
            "messages": [
                recs[1]["$set"]["messages"][0],
                {
                    "id": "s-summary",
                    "type": "user",
                    "content": [{"text": "<state_snapshot>done</state_snapshot>"}],
                },
                {
                    "id": "s-ack",
                    "type": "gemini",
                    "content": [{"text": "Got it. Thanks for the additional context!"}],
                },
            ],
            "lastUpdated": "2026-12-01T00:00:00Z",
        }
    }
    path = _write(tmp_path / "session.jsonl", [*recs[:11], snapshot, *recs[11:]])
    traj = read_native(path, "gemini-cli")[0].trajectory
    [c] = traj.compactions
    steps_before = sum(1 for r in recs[:11] if r.get("type") == "gemini" and r.get("id")) and c.after_step
    assert (c.kind, c.where, c.rebuilt) == ("$set/messages", "line 12", False) and "compaction" in traj.steps[
        c.after_step - 1
    ].flags
    _prepare(tmp_path, "gemini-cli", path, c.after_step - 1)  # before it: fine
    with pytest.raises(ReplayBadInput) as exc:
        _prepare(tmp_path, "gemini-cli", path, c.after_step)
    assert (
        exc.value.message.startswith("compaction_not_rebuilt")
        and "line 12" in exc.value.message
        and steps_before
    )
    out = json.loads((tmp_path / f"out-{c.after_step}" / "result.json").read_text())
    assert out["status"] == "failed" and out["errors"][0]["code"] == "compaction_not_rebuilt"
