"""Subagents as episodes of their own (docs/steps.md, "Episodes"): a Claude Code session's
subagent transcript beside it (``<session>/subagents/agent-<id>.jsonl``), its inline sidechain
lines, and the subagent chain of a journal run are each listed with the call that spawned them
and prepared at their own steps (``--episode ID``); an unknown id is one line naming the known
ones, exit 65 (as an ``--after-step`` past the last step).

The native files are written the way Claude Code 2.1 writes them (every line of a subagent's
transcript ``isSidechain: true`` with its ``agentId``, its first user line the Task call's
prompt); the journal run is a real capture made here: Claude Code's Task tool against the
scripted model (the subagent's own request, under another system prompt, gets the script's
``aux_reply``: a one-step episode), never committed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema
from agent_helpers import capture_scripted, pvisor, user_env

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "result-schema.json").read_text())

SID = "11111111-2222-3333-4444-555555555555"
PROMPT = "List the files in the workspace and report their names."


def _line(**kw) -> str:
    base = {"userType": "external", "cwd": "/w", "sessionId": SID, "version": "2.1.197", "gitBranch": ""}
    return json.dumps({**base, **kw})


def _assistant(uuid, parent, mid, content, side=False, agent=None):
    extra = {"agentId": agent} if agent else {}
    return _line(
        type="assistant", uuid=uuid, parentUuid=parent, isSidechain=side, requestId=f"req_{mid}", **extra,
        message={"id": mid, "type": "message", "role": "assistant", "model": "claude-x", "content": content,
                 "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1}},
    )  # fmt: skip


def _user(uuid, parent, content, side=False, agent=None, **more):
    extra = {"agentId": agent} if agent else {}
    return _line(
        type="user", uuid=uuid, parentUuid=parent, isSidechain=side, **extra, **more,
        message={"role": "user", "content": content},
    )  # fmt: skip


def _main_lines() -> list[str]:
    task = {"description": "list files", "prompt": PROMPT, "subagent_type": "general-purpose"}
    return [
        _user("u1", None, "Do the thing"),
        _assistant("a1", "u1", "msg_1",
                   [{"type": "tool_use", "id": "toolu_task1", "name": "Task", "input": task}]),
        _user("u2", "a1", [{"type": "tool_result", "tool_use_id": "toolu_task1", "content": "a.txt b.txt"}],
              toolUseResult={"agentId": "abc123"}),
        _assistant("a2", "u2", "msg_2", [{"type": "text", "text": "Done."}]),
    ]  # fmt: skip


def _sub_lines(agent: str = "abc123") -> list[str]:
    bash = {"command": "ls", "description": "l"}
    call = {"type": "tool_use", "id": "toolu_ls", "name": "Bash", "input": bash}
    return [
        _user("s1", None, PROMPT, side=True, agent=agent),
        _assistant("s2", "s1", "msg_3", [call], side=True, agent=agent),
        _user("s3", "s2", [{"type": "tool_result", "tool_use_id": "toolu_ls", "content": "a.txt\nb.txt"}],
              side=True, agent=agent),
        _assistant("s4", "s3", "msg_4", [{"type": "text", "text": "a.txt b.txt"}], side=True, agent=agent),
    ]  # fmt: skip


def _session_with_file(root: Path) -> Path:
    main = root / f"{SID}.jsonl"
    main.write_text("\n".join(_main_lines()) + "\n")
    (root / SID / "subagents").mkdir(parents=True)
    (root / SID / "subagents" / "agent-abc123.jsonl").write_text("\n".join(_sub_lines()) + "\n")
    return main


def _run(args, root: Path):
    return pvisor(args, env=user_env(root / "home"), cwd=root)


def test_subagent_file_beside_a_session_is_an_episode_listed_with_its_parent_call(tmp_path: Path) -> None:
    main = _session_with_file(tmp_path)
    shown = _run(["trajectory", "show", str(main)], tmp_path)
    assert shown.returncode == 0, shown.stderr
    listed = "episodes: main (2 steps); agent-abc123 (2 steps, spawned by step 1 call toolu_task1 Task)"
    assert listed in shown.stdout
    doc = json.loads(_run(["trajectory", "show", str(main), "--json"], tmp_path).stdout)
    assert doc["meta"]["episodes"] == [
        {"id": "main", "steps": 2, "parent": None},
        {"id": "agent-abc123", "steps": 2, "parent": {"step": 1, "call_id": "toolu_task1", "tool": "Task"}},
    ]
    sub = _run(["trajectory", "show", str(main), "--episode", "agent-abc123"], tmp_path)
    assert '1     Bash(command="ls"' in sub.stdout and f"task: {PROMPT}" in sub.stdout
    atif = _run(
        ["trajectory", "export", str(main), "--format", "atif", "--episode", "agent-abc123"], tmp_path
    )
    assert atif.returncode == 0, atif.stderr
    assert PROMPT in json.dumps(json.loads(atif.stdout)["steps"][0])
    view = _run(["view", str(main), "--episode", "agent-abc123", "--after-step", "1"], tmp_path)
    assert view.returncode == 0, view.stderr
    doc = json.loads(view.stdout)
    assert doc["source"]["episode"]["parent"] == {"step": 1, "call_id": "toolu_task1", "tool": "Task"}
    assert (doc["task"], doc["steps_total"], doc["through_step"]) == (PROMPT, 2, 1)
    # the subagent's own transcript read alone: its sidechain lines are its loop (0 steps before)
    alone = _run(["trajectory", "show", str(tmp_path / SID / "subagents" / "agent-abc123.jsonl")], tmp_path)
    assert "2     text: 'a.txt b.txt'" in alone.stdout


def test_prepare_only_at_a_native_subagents_own_step_names_its_parent_call(tmp_path: Path) -> None:
    main = _session_with_file(tmp_path)
    out = tmp_path / "out"
    args = ["replay", "--agent", "claude-code", "--trajectory", str(main), "--prepare-only", "--output",
            str(out)]  # fmt: skip
    done = _run([*args, "--after-step", "1", "--episode", "agent-abc123"], tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    sub_file = tmp_path / SID / "subagents" / "agent-abc123.jsonl"
    assert result["source"]["episode"] == {
        "id": "agent-abc123",
        "steps": 2,
        "parent": {"step": 1, "call_id": "toolu_task1", "tool": "Task"},
        # the file the steps were read from, beside the given one (source.path, source.sha256)
        "file": str(sub_file),
        "sha256": hashlib.sha256(sub_file.read_bytes()).hexdigest(),
    }
    assert (result["source"]["path"], result["source"]["sha256"]) == (
        str(main),
        hashlib.sha256(main.read_bytes()).hexdigest(),
    )
    assert result["boundary"]["steps_total"] == 2
    body = json.loads((out / "prefix.json").read_text())
    assert body["messages"][0]["content"] == PROMPT
    assert body["messages"][-1]["content"][0]["content"] == "a.txt\nb.txt"
    # a batch line takes it too, and a batch refuses it on the command line
    line = {
        "trajectory": str(main),
        "agent": "claude-code",
        "after_step": 1,
        "episode": "agent-abc123",
        "name": "b",
    }
    (tmp_path / "m.jsonl").write_text(json.dumps(line) + "\n")
    manifest = ["--batch", str(tmp_path / "m.jsonl"), "--output", str(tmp_path / "bo")]
    batch = _run(["replay", "--prepare-only", *manifest], tmp_path)
    assert batch.returncode == 0, batch.stderr
    got = json.loads((tmp_path / "bo" / "b" / "result.json").read_text())["source"]["episode"]
    assert got == result["source"]["episode"]
    refused = _run(["replay", "--prepare-only", *manifest, "--episode", "agent-abc123"], tmp_path)
    assert refused.returncode == 2 and "--episode comes from each line of --batch" in refused.stderr
    # the main loop stays the default, without an episode field
    main_out = tmp_path / "main"
    done = _run([*args[:-1], str(main_out), "--after-step", "1"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "episode" not in json.loads((main_out / "result.json").read_text())["source"]
    bad = _run([*args[:-1], str(tmp_path / "bad"), "--after-step", "1", "--episode", "agent-nope"], tmp_path)
    assert bad.returncode == 65
    errors = [line for line in bad.stderr.splitlines() if "error" in line]
    assert errors == [
        f"pvisor: error: unknown_episode: --episode agent-nope: {main} has no such episode "
        "(episodes: main, agent-abc123)"
    ]


def test_inline_sidechain_lines_are_an_episode_of_their_own(tmp_path: Path) -> None:
    # older Claude Code versions write the subagent's lines into the session file itself
    main = tmp_path / f"{SID}.jsonl"
    lines = _main_lines()
    main.write_text("\n".join([*lines[:2], *_sub_lines("def456"), *lines[2:]]) + "\n")
    doc = json.loads(_run(["trajectory", "show", str(main), "--json"], tmp_path).stdout)
    assert [e["id"] for e in doc["meta"]["episodes"]] == ["main", "agent-def456"]
    assert doc["meta"]["episodes"][1]["parent"] == {"step": 1, "call_id": "toolu_task1", "tool": "Task"}
    assert len(doc["steps"]) == 2  # the main loop keeps its own steps only
    out = tmp_path / "out"
    done = _run(
        ["replay", "--agent", "claude-code", "--trajectory", str(main), "--prepare-only", "--output",
         str(out), "--after-step", "1", "--episode", "agent-def456"], tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "prefix.json").read_text())["messages"][0]["content"] == PROMPT


def test_a_real_task_subagent_is_prepared_at_its_own_step_from_journal_and_file(tmp_path: Path) -> None:
    prompt = "Count the files in the workspace and answer with the number only."
    script = {
        "turns": [
            {"text": "Delegating.", "tool_calls": [{"tool": "Task", "arguments": {
                "description": "count files", "prompt": prompt, "subagent_type": "general-purpose"}}]},
            {"text": "Done."},
        ]
    }  # fmt: skip
    cap = capture_scripted("claude-code", tmp_path, script, "Count the files with a subagent")
    base = ["--journal", str(cap.journal), "replay", "--agent", "claude-code", "--run", cap.run,
            "--prepare-only"]  # fmt: skip
    listed = pvisor([*base, "--output", str(tmp_path / "x"), "--after-step", "1", "--episode", "nope"],
                    env=cap.env, cwd=tmp_path)  # fmt: skip
    assert listed.returncode == 65
    ids = listed.stderr.rsplit("(episodes: ", 1)[1].split(")")[0].split(", ")
    assert ids[0] == "main" and len(ids) == 2, listed.stderr
    sub = ids[1]
    for n in (0, 1):
        out = tmp_path / f"j{n}"
        done = pvisor([*base, "--output", str(out), "--after-step", str(n), "--episode", sub], env=cap.env,
                      cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        result = json.loads((out / "result.json").read_text())
        episode = result["source"]["episode"]
        assert episode["id"] == sub and episode["steps"] == 1
        assert episode["parent"] == {"step": 1, "call_id": sub, "tool": "Task"}
        body = json.loads((out / "prefix.json").read_text())
        # the subagent's own request: its own system prompt, its prompt as the task
        assert prompt in json.dumps(body["messages"][0]) and "Done." not in json.dumps(body["messages"])
    view = pvisor(["--journal", str(cap.journal), "view", cap.run, "--episode", sub, "--after-step", "1"],
                  env=cap.env, cwd=tmp_path)  # fmt: skip
    assert view.returncode == 0, view.stderr
    doc = json.loads(view.stdout)
    assert (doc["task"], doc["steps_total"], doc["source"]["episode"]["id"]) == (prompt, 1, sub)
    # the same run read twice gives the same id
    again = pvisor([*base, "--output", str(tmp_path / "y"), "--after-step", "1", "--episode", "nope"],
                   env=cap.env, cwd=tmp_path)  # fmt: skip
    assert again.stderr == listed.stderr.replace(str(tmp_path / "x"), str(tmp_path / "y"))
    # the subagent's transcript Claude Code wrote beside its session: the same episode, natively
    native = next((tmp_path / "runs").glob("*/home/.claude/projects/*/*.jsonl"))
    doc = json.loads(pvisor(["trajectory", "show", str(native), "--json"], env=cap.env, cwd=tmp_path).stdout)
    (listed_native,) = doc["meta"]["episodes"][1:]
    assert listed_native["id"].startswith("agent-") and listed_native["parent"]["call_id"] == sub
    out = tmp_path / "n1"
    done = pvisor(
        ["replay", "--agent", "claude-code", "--trajectory", str(native), "--prepare-only", "--output",
         str(out), "--after-step", "1", "--episode", listed_native["id"]], env=cap.env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "result.json").read_text())["source"]["episode"]["parent"]["call_id"] == sub


def test_a_real_gemini_cli_subagent_is_prepared_at_its_own_step_from_journal_and_file(tmp_path: Path) -> None:
    # Gemini CLI 0.61 runs invoke_agent's subagent under another system prompt (the scripted
    # model's aux_reply answers it) and records it in chats/<session>/<subagent session>.jsonl
    prompt = "Investigate the workspace and report which files it holds, by name."
    call = {"tool": "invoke_agent", "arguments": {"agent_name": "codebase_investigator", "prompt": prompt}}
    script = {"turns": [{"text": "Delegating.", "tool_calls": [call]}, {"text": "Done."}]}
    cap = capture_scripted("gemini-cli", tmp_path, script, "Investigate with a subagent")
    base = [
        "--journal",
        str(cap.journal),
        "replay",
        "--agent",
        "gemini-cli",
        "--prepare-only",
        "--after-step",
        "1",
    ]
    listed = pvisor([*base, "--run", cap.run, "--output", str(tmp_path / "x"), "--episode", "nope"],
                    env=cap.env, cwd=tmp_path)  # fmt: skip
    ids = listed.stderr.rsplit("(episodes: ", 1)[1].split(")")[0].split(", ")
    assert ids[0] == "main" and len(ids) == 2, listed.stderr
    out = tmp_path / "j1"
    done = pvisor(
        [*base, "--run", cap.run, "--output", str(out), "--episode", ids[1]], env=cap.env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    episode = json.loads((out / "result.json").read_text())["source"]["episode"]
    assert episode["parent"] == {"step": 1, "call_id": ids[1], "tool": "invoke_agent"}
    # the subagent's own request: the prompt inside Gemini CLI's investigator template
    assert prompt in json.dumps(json.loads((out / "prefix.json").read_text())["contents"][0])
    native = next((tmp_path / "runs").glob("*/home/.gemini/tmp/*/chats/session-*.jsonl"))
    (sub_file,) = native.parent.glob("*/*.jsonl")
    doc = json.loads(pvisor(["trajectory", "show", str(native), "--json"], env=cap.env, cwd=tmp_path).stdout)
    (sub,) = doc["meta"]["episodes"][1:]
    # the parent call by the id the agent sent it back under, as the journal names it (the file
    # stores invoke_agent__<id>)
    assert (sub["id"], sub["parent"]) == (
        sub_file.stem,
        {"step": 1, "call_id": ids[1], "tool": "invoke_agent"},
    )
    out = tmp_path / "n1"
    done = pvisor([*base, "--trajectory", str(native), "--output", str(out), "--episode", sub["id"]],
                  env=cap.env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "result.json").read_text())["source"]["episode"]["id"] == sub_file.stem


def _rollout(path: Path, sid: str, source, items: list[dict]) -> None:
    head = {"id": sid, "timestamp": "2026-11-29T06:32:48.500Z", "cwd": "/w", "originator": "codex_exec",
            "cli_version": "0.171.0", "source": source, "model_provider": "mock",
            "base_instructions": {"text": "You are Codex."}}  # fmt: skip
    lines = [{"timestamp": "2026-11-29T06:32:48.500Z", "type": "session_meta", "payload": head}]
    lines += [{"timestamp": "2026-11-29T06:32:49.000Z", "type": "response_item", "payload": p} for p in items]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _codex_turn(task: str, call_id: str, name: str, args: dict, output: str, answer: str) -> list[dict]:
    return [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]},
        {"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": call_id},
        {"type": "function_call_output", "call_id": call_id, "output": output},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
    ]


def test_a_codex_subagent_rollout_naming_its_parent_thread_is_an_episode(tmp_path: Path) -> None:
    # the pinned Codex does not run spawn_agent against pvisor's provider ("unsupported call"), so
    # the rollouts are written as Codex writes a thread_spawn subagent: its own rollout in the same
    # day directory, whose session_meta.source names the parent thread
    parent, child = "01a22601-9872-7a13-a89d-cd953ff98ca9", "01a22601-aaaa-7a13-a89d-cd953ff98ca9"
    main = tmp_path / f"rollout-2026-11-29T06-32-48-{parent}.jsonl"
    spawned = json.dumps({"agent_id": child, "nickname": "Curie"})
    _rollout(main, parent, "exec", _codex_turn("Do it with a subagent", "call_spawn", "spawn_agent",
                                               {"message": PROMPT}, spawned, "Done."))  # fmt: skip
    source = {"subagent": {"thread_spawn": {"parent_thread_id": parent, "depth": 1}}}
    turn = _codex_turn(PROMPT, "call_ls", "exec_command", {"cmd": "ls"}, "a.txt\nb.txt", "a.txt b.txt")
    _rollout(tmp_path / f"rollout-2026-11-29T06-33-00-{child}.jsonl", child, source, turn)
    doc = json.loads(_run(["trajectory", "show", str(main), "--json"], tmp_path).stdout)
    assert doc["meta"]["episodes"][1] == {
        "id": child,
        "steps": 2,
        "parent": {"step": 1, "call_id": "call_spawn", "tool": "spawn_agent"},
    }
    out = tmp_path / "out"
    done = _run(
        ["replay", "--agent", "codex", "--trajectory", str(main), "--prepare-only", "--output", str(out),
         "--after-step", "1", "--episode", child], tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    body = json.loads((out / "prefix.json").read_text())
    assert body["input"][0]["content"][0]["text"] == PROMPT
    assert body["input"][-1] == {
        "type": "function_call_output",
        "call_id": "call_ls",
        "output": "a.txt\nb.txt",
    }


def test_a_real_subagent_is_replayed_at_its_own_step_with_the_agent(tmp_path: Path) -> None:
    # the subagent runs a shell call at its step 1 (the scripted model's subagent_turns); the
    # replay serves the main loop's step 1 (the Agent call), the agent starts its subagent, the
    # subagent gets its recorded step 1 and its request 2 is the boundary
    prompt = "Write sub.txt with the shell and show it, then report."
    command = "echo sub-step-1 > sub.txt; cat sub.txt"
    script = {
        "turns": [
            {"text": "Delegating.", "tool_calls": [{"tool": "Agent", "arguments": {
                "description": "write sub.txt", "prompt": prompt, "subagent_type": "general-purpose"}}]},
            {"text": "Done."},
        ],
        "subagent_turns": [{"tool_calls": [{"tool": "@shell", "command": command}]}, {"text": "Wrote it."}],
    }  # fmt: skip
    cap = capture_scripted("claude-code", tmp_path, script, "Write sub.txt with a subagent")
    assert (tmp_path / "ws" / "sub.txt").read_text() == "sub-step-1\n"
    base = ["--journal", str(cap.journal), "replay", "--agent", "claude-code", "--run", cap.run]
    steps = json.loads(
        pvisor(["--journal", str(cap.journal), "journal", "steps", cap.run, "--json"], env=cap.env,
               cwd=tmp_path).stdout
    )  # fmt: skip
    (spawn,) = steps["steps"][0]["action"]["tool_calls"]
    sub = spawn["id"]  # a journal subagent's id: its parent call's
    (sub_chain,) = [c for c in steps["chains"] if c["role"] != "main"]
    ws, out = tmp_path / "ws2", tmp_path / "r1"
    ws.mkdir()
    agent = ["--agent-entrypoint", cap.exe, "--workspace", str(ws), "--replay-only"]
    done = pvisor([*base, *agent, "--after-step", "1", "--episode", sub, "--output", str(out)], env=cap.env,
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "ok" and result["divergence"] is None
    # the summary line names the episode replayed
    assert f"to step 1 of 2 of episode {sub} as run" in done.stdout + done.stderr
    assert result["source"]["episode"] == {
        "id": sub,
        "steps": 2,
        "parent": {"step": 1, "call_id": sub, "tool": "Agent"},
    }
    assert (result["boundary"]["after_step"], result["boundary"]["steps_total"]) == (1, 2)
    # the subagent's action served unchanged, its observation O'_1 equal to O_1
    (call,) = result["tool_calls"]
    assert (call["step"], call["name"], json.loads(call["arguments"])) == (1, "Bash", {"command": command})
    assert call["equal"] is True and call["historical_observation_sha256"] is not None
    assert (ws / "sub.txt").read_text() == "sub-step-1\n"
    # both chains' recorded replies served: the main loop's step 1, then the subagent's
    served = [
        (s["episode"], s["request"], s["source"], s["recorded_exchange"])
        for s in result["playback"]["served"]
    ]
    assert served == [
        ("main", 1, "recorded", steps["steps"][0]["exchange"]),
        (sub, 1, "recorded", sub_chain["exchanges"][0]),
    ]
    # the boundary is the subagent's request 2, ending at its new observation; every main-loop
    # request after the parent step gets the synthetic end
    assert [e["reason"] for e in result["synthetic_end"]].count("boundary") == 1
    body = json.loads((out / "prefix.json").read_text())
    assert prompt in json.dumps(body["messages"][0]) and "Delegating." not in json.dumps(body["messages"])
    last = body["messages"][-1]["content"][0]
    assert last["type"] == "tool_result" and last["content"].startswith("sub-step-1\n")
    # bad input: N past the subagent's steps, a continuation, a native file
    late = pvisor([*base, *agent, "--after-step", "3", "--episode", sub, "--output", str(tmp_path / "r3")],
                  env=cap.env, cwd=tmp_path)  # fmt: skip
    assert late.returncode == 65
    assert [line for line in late.stderr.splitlines() if "error" in line] == [
        f"pvisor: error: after_step_out_of_range: --after-step 3: run {cap.run} episode {sub} has 2 steps "
        "(0 <= N <= 2)"
    ]
    live = [a for a in agent if a != "--replay-only"]
    cont = pvisor([*base, *live, "--after-step", "1", "--episode", sub, "--output", str(tmp_path / "c"),
                   "--upstream", "http://127.0.0.1:9"], env=cap.env, cwd=tmp_path)  # fmt: skip
    assert (
        cont.returncode == 2
        and "--episode is for --prepare-only and --replay-only; a continuation" in cont.stderr
    )


def _reply(mid: str, content: list) -> dict:
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return {"id": mid, "type": "message", "role": "assistant", "model": "claude-x", "content": content,
            "stop_reason": stop, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip


def _subagent_run(journal: Path, task: str, prompt: str) -> list[dict]:
    """A Claude Code run written into ``journal`` (run ``r-sub``): the main loop's step 1 a Task
    call with ``prompt``, its subagent (another system prompt, the same tools) a Bash call then
    text, the main loop's step 2 text; the main loop's step 1 also reads a recorded absolute
    path. Returns the request bodies in the order sent."""
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    tools = [
        {"name": n, "description": n, "input_schema": {"type": "object"}} for n in ("Bash", "Task", "Read")
    ]
    args = {"description": "sub", "prompt": prompt, "subagent_type": "general-purpose"}
    spawn = {"type": "tool_use", "id": "toolu_spawn", "name": "Task", "input": args}
    bash = {"type": "tool_use", "id": "toolu_sh", "name": "Bash", "input": {"command": "echo hi"}}

    def result(call_id: str, text: str) -> dict:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}

    main1 = [{"role": "user", "content": task}]
    sub1 = [{"role": "user", "content": prompt}]
    sub2 = [*sub1, {"role": "assistant", "content": [bash]}, result("toolu_sh", "hi\n")]
    # beside the Task call, a Read of a recorded absolute path (rewritten when served)
    read = {"type": "tool_use", "id": "toolu_rd", "name": "Read", "input": {"file_path": "/old/ws/notes.txt"}}
    both = {
        "role": "user",
        "content": [*result("toolu_spawn", "hi")["content"], *result("toolu_rd", "n")["content"]],
    }
    main2 = [*main1, {"role": "assistant", "content": [spawn, read]}, both]
    sent = [
        ("main", main1, _reply("msg_1", [spawn, read])),
        ("sub", sub1, _reply("msg_2", [bash])),
        ("sub", sub2, _reply("msg_3", [{"type": "text", "text": "hi"}])),
        ("main", main2, _reply("msg_4", [{"type": "text", "text": "Done."}])),
    ]  # fmt: skip
    bodies = []
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-sub", agent="claude-code", agent_version="2.1.300", labels={"task": task}))
        for who, msgs, reply in sent:
            system = "You are the main agent." if who == "main" else "You are a subagent."
            body = {"model": "claude-x", "system": system, "tools": tools, "messages": msgs}
            bodies.append(body)
            j.record_exchange("r-sub", "POST", "/v1/messages", [("content-type", "application/json")],
                              protocol="anthropic", status=200, request_body=json.dumps(body).encode(),
                              response_body=json.dumps(reply).encode(),
                              response_headers=[("content-type", "application/json")])  # fmt: skip
    return bodies


def test_a_subagents_request_that_repeats_the_task_is_the_subagents_own(stack, tmp_path: Path) -> None:
    # the subagent's prompt is the run's task and its tools are the main loop's: the main loop's
    # matcher takes its request 1 for a retry of its own request 1; playback gives it the
    # subagent's recorded step 1 (its own system prompt), and its request 2 is the boundary
    from gateway_helpers import http_request
    from pvisor.adapters.agents import get_descriptor
    from pvisor.replay.episode_playback import EpisodePlayback
    from pvisor.replay.playback import PathRewrites, PlaybackStatus, playback_record
    from pvisor.replay.recording import journal_recording

    task = "Say hi from a subagent."
    journal = tmp_path / "j.sqlite"
    bodies = _subagent_run(journal, task, task)  # the parent passes the task on as it is
    rec = journal_recording(journal, "r-sub", "claude-code", 1, None, episode="toolu_spawn")
    assert (rec.episode.parent_step, len(rec.steps), rec.task) == (1, 2, task)
    p = EpisodePlayback(
        rec, 1, get_descriptor("claude-code"), PathRewrites([("/old/ws", "/new/ws", "workspace")])
    )
    gw = stack.gateway({}, responder=p, offline=True, name="pb-episode")
    answers = []
    for body in bodies[:3]:
        status, _, data = http_request(gw.url, "POST", "/v1/messages", json.dumps(body).encode(),
                                       headers={"Content-Type": "application/json"})  # fmt: skip
        assert status == 200, data
        answers.append(json.loads(data)["content"])
    assert answers[0][0]["name"] == "Task" and answers[1][0]["input"] == {"command": "echo hi"}
    assert p.status is PlaybackStatus.OK and p.boundary is not None
    assert json.loads(p.boundary.body)["messages"][-1]["content"][0]["content"] == "hi\n"
    served = [(s["episode"], s["request"]) for s in playback_record(p)["served"]]
    assert served == [("main", 1), ("toolu_spawn", 1)]
    assert answers[0][1]["input"] == {"file_path": "/new/ws/notes.txt"}
    assert playback_record(p)["path_rewrites"] == [
        {"step": 1, "call_id": "toolu_rd", "tool": "Read", "argument": "file_path",
         "recorded": "/old/ws/notes.txt", "replayed": "/new/ws/notes.txt", "episode": "main"}
    ]  # fmt: skip


def _prepare(main: Path, root: Path, out: str, episode: str, after: int = 1, *more: str):
    args = ["replay", "--agent", "claude-code", "--trajectory", str(main), "--prepare-only", "--output",
            str(root / out), "--after-step", str(after), "--episode", episode, *more]  # fmt: skip
    return _run(args, root)


def test_an_unreadable_subagent_file_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    main = _session_with_file(tmp_path)
    empty = tmp_path / SID / "subagents" / "agent-empty.jsonl"
    empty.write_text("")
    shown = _run(["trajectory", "show", str(main)], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "episodes: main (2 steps); agent-abc123 (2 steps" in shown.stdout
    assert "agent-empty" not in shown.stdout
    [warned] = [line for line in shown.stderr.splitlines() if "subagent_skipped" in line]
    assert f"episode agent-empty: subagent_skipped: not read: {empty}: no Claude Code session line" in warned
    sibling = _prepare(main, tmp_path, "ok", "agent-abc123")
    assert sibling.returncode == 0, sibling.stderr
    assert "subagent_skipped" in sibling.stderr
    own = _prepare(main, tmp_path, "bad", "agent-empty")
    assert own.returncode == 65 and f"bad_source: {empty}: no Claude Code session line" in own.stderr
    view = _run(["view", str(main), "--episode", "agent-abc123", "--after-step", "1"], tmp_path)
    assert view.returncode == 0, view.stderr
    strict = _run(["trajectory", "show", str(main), "--strict"], tmp_path)
    assert strict.returncode == 65 and "1 subagent file(s) not read and --strict" in strict.stderr


def test_a_damaged_subagent_file_is_named_and_refused_as_the_main_one_is(tmp_path: Path) -> None:
    main = _session_with_file(tmp_path)
    sub = tmp_path / SID / "subagents" / "agent-cut.jsonl"
    lines = _sub_lines("cut")
    # its tool result's line cut off mid-record, the next line written after it
    sub.write_text("\n".join([*lines[:2], lines[2][:60], lines[3]]) + "\n")
    done = _prepare(main, tmp_path, "o", "agent-cut")
    assert done.returncode == 65
    assert f"damaged_source: {sub} line 3: malformed_line" in done.stderr
    assert f"{main} line" not in done.stderr
    view = _run(["view", str(main), "--episode", "agent-cut"], tmp_path)
    assert view.returncode == 65 and f"damaged_source: {sub} line 3" in view.stderr
    assert f"warning: {sub}: line 3: malformed_line" in view.stderr
    strict = _run(["trajectory", "show", str(main), "--episode", "agent-cut", "--strict"], tmp_path)
    assert strict.returncode == 65 and "warning(s) and --strict" in strict.stderr
    # a cut-off last line: the boundary at its step is refused naming the subagent's file
    sub.write_text("\n".join(lines) + "\n" + lines[1][:40])
    cut = _prepare(main, tmp_path, "o2", "agent-cut", 2)
    assert cut.returncode == 65 and f"damaged_source: --after-step 2: {sub} line 5 is cut off" in cut.stderr
    strict = _run(["trajectory", "show", str(main), "--episode", "agent-cut", "--strict"], tmp_path)
    assert strict.returncode == 65 and "truncated_line" in strict.stderr


def test_only_regular_files_in_the_sessions_own_subagents_directory_are_read(tmp_path: Path) -> None:
    import os

    main = _session_with_file(tmp_path)
    subs = tmp_path / SID / "subagents"
    os.mkfifo(subs / "agent-fifo.jsonl")  # opened, it would block the read
    (subs / "agent-passwd.jsonl").symlink_to("/etc/passwd")
    shown = _run(["trajectory", "show", str(main)], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "agent-fifo" not in shown.stdout and "agent-passwd" not in shown.stdout
    warned = [line for line in shown.stderr.splitlines() if "subagent_skipped" in line]
    assert len(warned) == 2
    assert f"{subs / 'agent-fifo.jsonl'}: subagent_skipped: not a regular file" in warned[0]
    assert f"{subs / 'agent-passwd.jsonl'}: subagent_skipped: not a regular file" in warned[1]
    done = _prepare(main, tmp_path, "o", "agent-abc123")
    assert done.returncode == 0, done.stderr
    # a linked subagents directory is not the session's own
    other = tmp_path / "elsewhere"
    other.mkdir()
    (subs / "agent-fifo.jsonl").unlink()
    (subs / "agent-passwd.jsonl").unlink()
    subs.rename(other / "subagents")
    subs.symlink_to(other / "subagents")
    linked = _run(["trajectory", "show", str(main)], tmp_path)
    assert linked.returncode == 0, linked.stderr
    assert "episodes:" not in linked.stdout
    assert f"{subs}: subagent_skipped: a link" in linked.stderr


def test_inline_sidechains_without_an_agent_id_are_one_episode_per_chain(tmp_path: Path) -> None:
    main = tmp_path / f"{SID}.jsonl"
    second = "Count the lines of a.txt and report the number."
    task2 = {"description": "count", "prompt": second, "subagent_type": "general-purpose"}
    call2 = {"type": "tool_use", "id": "toolu_task2", "name": "Task", "input": task2}
    lines = _main_lines()
    wc = {"type": "tool_use", "id": "toolu_wc", "name": "Bash", "input": {"command": "wc -l a.txt"}}
    other = [  # the second subagent's chain, from its own root (parentUuid null), no agentId
        _user("t1", None, second, side=True),
        _assistant("t2", "t1", "msg_t2", [wc], side=True),
        _user("t3", "t2", [{"type": "tool_result", "tool_use_id": "toolu_wc", "content": "1"}], side=True),
        _assistant("t4", "t3", "msg_t4", [{"type": "text", "text": "1"}], side=True),
    ]
    main.write_text(
        "\n".join([
            *lines[:2], *_sub_lines(""), lines[2],
            _assistant("a3", "u2", "msg_5", [call2]), *other,
            _user("u3", "a3", [{"type": "tool_result", "tool_use_id": "toolu_task2", "content": "1"}]),
            _assistant("a4", "u3", "msg_6", [{"type": "text", "text": "Done."}]),
        ]) + "\n"
    )  # fmt: skip
    doc = json.loads(_run(["trajectory", "show", str(main), "--json"], tmp_path).stdout)
    assert doc["meta"]["episodes"][1:] == [
        {"id": "sidechain-1", "steps": 2, "parent": {"step": 1, "call_id": "toolu_task1", "tool": "Task"}},
        {"id": "sidechain-2", "steps": 2, "parent": {"step": 2, "call_id": "toolu_task2", "tool": "Task"}},
    ]
    done = _prepare(main, tmp_path, "o", "sidechain-2")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "o" / "prefix.json").read_text())["messages"][0]["content"] == second


def test_episode_messages_name_the_episode_and_shorten_the_id(tmp_path: Path) -> None:
    main = _session_with_file(tmp_path)
    past = _prepare(main, tmp_path, "o", "agent-abc123", 5)
    assert past.returncode == 65
    assert f"{main} episode agent-abc123 has 2 steps" in past.stderr
    view = _run(["view", str(main), "--episode", "agent-abc123", "--after-step", "5"], tmp_path)
    assert view.returncode != 0 and "episode agent-abc123 has 2 journal steps" in view.stderr
    long = _prepare(main, tmp_path, "o2", "x" * 10000)
    assert long.returncode == 65 and "(10000 characters)" in long.stderr and "x" * 200 not in long.stderr
    empty = _prepare(main, tmp_path, "o3", "")
    assert empty.returncode == 2 and "--episode: give an episode id" in empty.stderr


def test_summaries_and_exports_name_the_subagent_episode(tmp_path: Path) -> None:
    main = _session_with_file(tmp_path)
    done = _prepare(main, tmp_path, "o", "agent-abc123")
    assert done.returncode == 0, done.stderr
    assert f"from {main} episode agent-abc123, after step 1 of 2" in done.stdout
    out = tmp_path / "v.json"
    view = _run(["view", str(main), "--episode", "agent-abc123", "--output", str(out)], tmp_path)
    assert view.returncode == 0 and f"view of {main} episode agent-abc123 " in view.stderr
    parent = {"step": 1, "call_id": "toolu_task1", "tool": "Task"}
    export = ["trajectory", "export", str(main), "--episode", "agent-abc123", "--format"]
    doc = json.loads(_run([*export, "json"], tmp_path).stdout)
    assert doc["meta"]["episode"] == {"id": "agent-abc123", "steps": 2, "parent": parent}
    atif = json.loads(_run([*export, "atif"], tmp_path).stdout)
    assert atif["trajectory_id"] == "agent-abc123" and atif["extra"]["episode"]["parent"] == parent


def test_a_gemini_cli_subagent_longer_than_its_parent_is_an_episode_not_the_main_loop(tmp_path: Path) -> None:
    # the subagent's chain (3 requests) is longer than the main loop's (2): the longest chain is
    # the subagent's, which is no main loop (its task is a subagent call's prompt)
    prompt = "Run the two shell commands you are given, then report what they printed."
    call = {"tool": "invoke_agent", "arguments": {"agent_name": "generalist", "prompt": prompt}}
    script = {
        "turns": [{"text": "Delegating.", "tool_calls": [call]}, {"text": "Done."}],
        "subagent_turns": [
            {"tool_calls": [{"tool": "@shell", "command": "echo one"}]},
            {"tool_calls": [{"tool": "@shell", "command": "echo two"}]},
            {"text": "Both ran."},
        ],
    }
    cap = capture_scripted("gemini-cli", tmp_path, script, "Run two commands with a subagent")
    steps = json.loads(
        pvisor(["--journal", str(cap.journal), "journal", "steps", cap.run, "--json"], env=cap.env,
               cwd=tmp_path).stdout
    )  # fmt: skip
    assert steps["task"] == "Run two commands with a subagent"
    assert [c["name"] for c in steps["steps"][0]["action"]["tool_calls"]] == ["invoke_agent"]
    base = ["--journal", str(cap.journal), "replay", "--agent", "gemini-cli", "--run", cap.run,
            "--prepare-only"]  # fmt: skip
    listed = pvisor([*base, "--output", str(tmp_path / "x"), "--after-step", "1", "--episode", "nope"],
                    env=cap.env, cwd=tmp_path)  # fmt: skip
    ids = listed.stderr.rsplit("(episodes: ", 1)[1].split(")")[0].split(", ")
    assert ids[0] == "main" and len(ids) == 2, listed.stderr
    out = tmp_path / "s3"
    done = pvisor([*base, "--output", str(out), "--after-step", "3", "--episode", ids[1]], env=cap.env,
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    episode = json.loads((out / "result.json").read_text())["source"]["episode"]
    # its three turns, then the request Gemini CLI sends a subagent that ended without
    # complete_task: longer than the main loop's two
    assert (episode["steps"], episode["parent"]["tool"], len(steps["steps"])) == (4, "invoke_agent", 2)
    # replayed at its own step 1 by Gemini CLI: its shell call served unchanged and run again, O'_1 = O_1
    ws, replayed = tmp_path / "ws2", tmp_path / "r1"
    ws.mkdir()
    run = pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", "gemini-cli", "--run", cap.run, "--replay-only",
         "--agent-entrypoint", cap.exe, "--workspace", str(ws), "--after-step", "1", "--episode", ids[1],
         "--output", str(replayed)], env=cap.env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((replayed / "result.json").read_text())
    assert (result["status"], result["divergence"], result["source"]["episode"]["id"]) == ("ok", None, ids[1])
    (shell,) = result["tool_calls"]
    assert shell["step"] == 1 and shell["equal_normalised"] is True, shell
    assert [s["episode"] for s in result["playback"]["served"]] == ["main", ids[1]]


def test_either_of_two_parallel_subagents_is_replayed_at_its_own_step(tmp_path: Path) -> None:
    # two Agent calls in one reply: both subagents run at once, so the sibling's requests reach
    # the replay of either one; they are answered from the recording, never taken as its own
    prompts = ["Write one.txt with the shell, then report.", "Write two.txt with the shell, then report."]
    calls = [{"tool": "Agent", "arguments": {"description": f"write {n}", "prompt": p,
              "subagent_type": "general-purpose"}} for n, p in zip(("one", "two"), prompts)]  # fmt: skip
    script = {
        "turns": [{"text": "Delegating.", "tool_calls": calls}, {"text": "Done."}],
        "subagent_turns": [
            {"tool_calls": [{"tool": "@shell", "command": "echo sub > sub.txt"}]},
            {"text": "ok"},
        ],
    }
    cap = capture_scripted("claude-code", tmp_path, script, "Write two files with two subagents")
    steps = json.loads(
        pvisor(["--journal", str(cap.journal), "journal", "steps", cap.run, "--json"], env=cap.env,
               cwd=tmp_path).stdout
    )  # fmt: skip
    ids = [c["id"] for c in steps["steps"][0]["action"]["tool_calls"]]
    assert len(ids) == 2
    for k, sub in enumerate(ids):
        ws, out = tmp_path / f"ws{k}", tmp_path / f"r{k}"
        ws.mkdir()
        done = pvisor(
            ["--journal", str(cap.journal), "replay", "--agent", "claude-code", "--run", cap.run,
             "--agent-entrypoint", cap.exe, "--workspace", str(ws), "--replay-only", "--after-step", "1",
             "--episode", sub, "--output", str(out)], env=cap.env, cwd=tmp_path,
        )  # fmt: skip
        result = json.loads((out / "result.json").read_text())
        assert (result["status"], result["divergence"]) == ("ok", None), (sub, done.stderr)
        body = json.loads((out / "prefix.json").read_text())
        assert prompts[k] in json.dumps(body["messages"][0]) and prompts[1 - k] not in json.dumps(body)


def test_a_task_call_echoed_as_agent_is_no_change_of_the_action(tmp_path: Path) -> None:
    # Claude Code 2.1.332 runs a Task call (its legacy name; older versions' runs and scripts use
    # it) and sends it back as Agent: the descriptor's echo alias, no action_changed_by_agent,
    # and a replay-only past it does not diverge at request 2
    prompt = "Count the files in the workspace and answer with the number only."
    script = {
        "turns": [
            {"text": "Delegating.", "tool_calls": [{"tool": "Task", "arguments": {
                "description": "count files", "prompt": prompt, "subagent_type": "general-purpose"}}]},
            {"text": "Done."},
        ]
    }  # fmt: skip
    cap = capture_scripted("claude-code", tmp_path, script, "Count the files with a subagent")
    steps = json.loads(
        pvisor(["--journal", str(cap.journal), "journal", "steps", cap.run, "--json"], env=cap.env,
               cwd=tmp_path).stdout
    )  # fmt: skip
    assert [c["name"] for c in steps["steps"][0]["action"]["tool_calls"]] == ["Task"]
    assert "action_changed_by_agent" not in steps["steps"][0]["flags"]
    ws, out = tmp_path / "ws2", tmp_path / "r1"
    ws.mkdir()
    pvisor(
        ["--journal", str(cap.journal), "replay", "--agent", "claude-code", "--run", cap.run,
         "--agent-entrypoint", cap.exe, "--workspace", str(ws), "--replay-only", "--after-step", "1",
         "--output", str(out)], env=cap.env, cwd=tmp_path,
    )  # fmt: skip
    result = json.loads((out / "result.json").read_text())
    assert (result["status"], result["divergence"]) == ("ok", None)


def test_a_changed_tool_call_is_shown_where_it_first_differs() -> None:
    from pvisor.adapters.matcher import first_difference

    long = "x" * 200
    call = {"type": "tool_call", "name": "Task", "arguments": {"prompt": long}, "id": "a"}
    assert first_difference(call, {**call, "name": "Other"}) == ("name: Task", "name: Other")
    assert first_difference(call, {**call, "arguments": {"prompt": long + "!"}}) == (
        "arguments.prompt: ..." + "x" * 20,
        "arguments.prompt: ..." + "x" * 20 + "!",
    )


def test_parallel_subagents_with_the_same_prompt_are_said_to_be_indistinct(tmp_path: Path) -> None:
    # two Agent calls with one prompt: the subagents send the same requests, which the chain
    # rule reads as retries; the result says their episodes cannot be told apart
    prompt = "Write same.txt with the shell, then report."
    calls = [{"tool": "Agent", "arguments": {"description": f"write {n}", "prompt": prompt,
              "subagent_type": "general-purpose"}} for n in ("a", "b")]  # fmt: skip
    script = {
        "turns": [{"text": "Delegating.", "tool_calls": calls}, {"text": "Done."}],
        "subagent_turns": [
            {"tool_calls": [{"tool": "@shell", "command": "echo s > same.txt"}]},
            {"text": "ok"},
        ],
    }
    cap = capture_scripted("claude-code", tmp_path, script, "Write one file with two subagents")
    base = ["--journal", str(cap.journal), "replay", "--agent", "claude-code", "--run", cap.run,
            "--prepare-only", "--after-step", "1"]  # fmt: skip
    listed = pvisor([*base, "--output", str(tmp_path / "x"), "--episode", "nope"], env=cap.env, cwd=tmp_path)
    ids = listed.stderr.rsplit("(episodes: ", 1)[1].split(")")[0].split(", ")[1:]
    assert ids, listed.stderr
    for k, sub in enumerate(ids):
        out = tmp_path / f"p{k}"
        done = pvisor([*base, "--output", str(out), "--episode", sub], env=cap.env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        codes = [w["code"] for w in json.loads((out / "result.json").read_text())["warnings"]]
        assert "subagents_indistinct" in codes, codes
