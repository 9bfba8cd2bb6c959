"""ATIF as a source (docs/native.md, "ATIF as a source"; docs/handoff.md, "Sources from elsewhere:
ATIF"): a trajectory in Harbor's Agent Trajectory Interchange Format is read like a native file,
detected by content, its agent mapped to pvisor's where pvisor knows it, its lost parts listed;
bad input is one line and exit 65; and it is handed to real agents.

The files: one ``pvisor journal export --format atif`` of a run captured here (Claude Code with the
scripted model, three shell calls that write files); the two of tests/harbor_atif_write.py,
written by Harbor's own code in its venv at test time (its converter's ATIF-v1.7 of a corpus
mini-swe-agent file, and an ATIF-v1.8 file of terminus-2, an agent pvisor does not know, with an
audio and an image part), which the corpus copies in tests/corpus/native/atif must equal. Nothing
is mocked."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import capture_scripted, entrypoint, pvisor
from cli_helpers import pvisor_main
from harbor_helpers import PIN, REPO
from native_helpers import native_dir

from pvisor.adapters.native import detect, read_native
from pvisor.core.errors import BadInputError

HERE = Path(__file__).resolve().parent
MINI_NATIVE = native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json"

SCRIPT = {
    "turns": [
        {
            "text": "Two files.",
            "tool_calls": [
                {"tool": "@shell", "command": "echo 1 > one.txt"},
                {"tool": "@shell", "command": "mkdir -p d && echo 2 > d/two.txt"},
            ],
        },
        {"text": "A third.", "tool_calls": [{"tool": "@shell", "command": "echo 3 > three.txt"}]},
        {"text": "Done."},
    ]
}
EXPORTED_FILES = {"one.txt": "1\n", "d/two.txt": "2\n", "three.txt": "3\n"}
TERMINUS_FILES = {"hello.txt": "hello\n", "notes/a.md": "a\n", "b.txt": "b\n"}


@pytest.fixture(scope="module")
def harbor_written(tmp_path_factory) -> Path:
    """The directory tests/harbor_atif_write.py filled with Harbor's Python; every file valid
    under Harbor's own validator."""
    env = os.environ.get("PVISOR_HARBOR_PYTHON")
    python = Path(env) if env else REPO / ".venv-harbor" / "bin" / "python"
    if not python.is_file():
        from conftest import cannot_run_here

        cannot_run_here(f"no Python of Harbor's venv at {python} (./scripts/test makes it)")
    out = tmp_path_factory.mktemp("harbor-atif")
    proc = subprocess.run(
        [str(python), str(HERE / "harbor_atif_write.py"), str(MINI_NATIVE), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        # litellm (imported by Harbor's agents) would fetch its model price list from the network
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["harbor"] == PIN and all(e == [] for e in doc["errors"].values()), doc
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, object]:
    """(the ATIF file ``pvisor journal export`` wrote of a scripted Claude Code run, the capture)."""
    root = tmp_path_factory.mktemp("atif-export")
    cap = capture_scripted("claude-code", root, SCRIPT, "Write three files")
    argv = ["--journal", str(cap.journal), "journal", "export", cap.run, "--format", "atif"]
    proc = pvisor(argv, env=cap.env, cwd=root)
    assert proc.returncode == 0, proc.stderr
    path = root / "run.atif.json"
    path.write_text(proc.stdout)
    return path, cap


def _show(path: Path, *args: str) -> tuple[int, dict | None, str]:
    proc = pvisor_main(["trajectory", "show", str(path), "--json", *args], text=True)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 else None, proc.stderr


# --------------------------------------------------------------------------- Harbor's files


def test_the_corpus_copies_are_what_harbor_writes(harbor_written):
    for name in ("harbor-mini-swe-agent.json", "harbor-terminus-2-v1.8.json"):
        assert (native_dir() / "atif" / name).read_text() == (harbor_written / name).read_text(), name


def test_harbors_converter_output_reads_as_the_native_file_it_came_from(harbor_written):
    """ATIF-v1.7 of Harbor's mini-swe-agent converter: detected by content, the agent mapped to
    mini-swe-agent, and the same task, calls (exact arguments) and results as the native file."""
    path = harbor_written / "harbor-mini-swe-agent.json"
    assert detect(path) == ["atif"]
    got, notes = read_native(path)
    native, _ = read_native(MINI_NATIVE)
    assert (
        notes == ["detected format: atif"]
        and got.agent == "mini-swe-agent"
        and got.profile.name == "atif@1.8"
    )
    t, n = got.trajectory, native.trajectory
    assert t.task.strip() == n.task.strip() and t.system.strip() == n.system.strip()
    assert [[(c.id, c.name, c.arguments) for c in s.action.tool_calls] for s in t.steps] == [
        [(c.id, c.name, c.arguments) for c in s.action.tool_calls] for s in n.steps
    ]
    assert [[(r.call_id, r.content) for r in s.observation.results] for s in t.steps] == [
        [(r.call_id, r.content) for r in s.observation.results] for s in n.steps
    ]
    assert got.diagnostics.warnings == [] and t.meta["agent_name"] == "mini-swe-agent"
    # view and --agent: the agent the file says, or atif (the generic descriptor); another is refused
    view = pvisor_main(["view", str(path), "--step", "0"], text=True)
    assert view.returncode == 0 and json.loads(view.stdout)["source"]["agent"] == "mini-swe-agent", (
        view.stderr
    )
    assert read_native(path, "mini-swe-agent")[0].agent == "mini-swe-agent"
    code, _, err = _show(path, "--agent", "codex")
    assert code == 65 and err.strip().splitlines()[-1].endswith(
        "an atif trajectory of agent 'mini-swe-agent', not of codex; "
        "give --agent mini-swe-agent (or --agent atif)"
    )


def test_a_v18_file_of_an_unknown_agent_lists_what_it_lost_and_assumed(harbor_written):
    path = harbor_written / "harbor-terminus-2-v1.8.json"
    code, doc, err = _show(path)
    assert code == 0 and doc["agent"] == "atif" and doc["profile"] == "atif@1.8", err
    assert doc["task"] == "Write hello.txt, then notes/a.md and b.txt."
    assert doc["system"] == "You are an AI assistant solving tasks in a Linux terminal."
    steps = doc["steps"]
    # the copied-context step is no step; the dispatch without inference and the shared output flagged
    assert [s["flags"] for s in steps] == [[], ["shared_observation"], ["deterministic_dispatch"], []]
    assert steps[0]["action"]["reasoning"] == ["Start with the first file."]
    assert steps[0]["action"]["usage"] == {"prompt_tokens": 120, "completion_tokens": 30, "cached_tokens": 20,
                                           "cost_usd": 0.001}  # fmt: skip
    # the image beside the file is read (a base64 block after the text); the batch's one output is
    # the last call's
    first = steps[0]["observation"]["results"][0]["content"]
    assert first[0] == {"type": "text", "text": "$ echo hello > hello.txt\n$ "}
    assert first[1]["type"] == "image" and first[1]["source"]["media_type"] == "image/png"
    assert [(r["call_id"], r["content"] != "") for r in steps[1]["observation"]["results"]] == [
        ("call_1_1", False),
        ("call_1_2", True),
    ]
    assert [(x["kind"], x["where"]) for x in doc["left_out"]] == [
        ("audio", "steps[1] (step_id 2).message[1]"),
        ("agent/copied_context", "steps[4] (step_id 5)"),
    ]
    assert [(w["code"], w["where"]) for w in doc["warnings"]] == [
        ("atif_assumed", "tool bash_command"),
        ("atif_assumed", "tool mark_task_complete"),
    ]
    # exported again, it keeps the name it gives its agent (not pvisor's generic atif)
    again = pvisor_main(["trajectory", "export", str(path), "--format", "atif"], text=True)
    assert again.returncode == 0 and json.loads(again.stdout)["agent"]["name"] == "terminus-2"
    # the corpus copy has no images/ beside it: the image is named lost, never silently dropped
    _, copy, _ = _show(native_dir() / "atif" / "harbor-terminus-2-v1.8.json")
    lost = [x for x in copy["left_out"] if x["kind"] == "image"]
    assert len(lost) == 1 and "images/screen.png not readable beside the file" in lost[0]["reason"]
    assert copy["steps"][0]["observation"]["results"][0]["content"] == "$ echo hello > hello.txt\n$ "


def test_prepare_only_of_harbors_file_is_the_native_files_request_but_what_atif_drops(
    harbor_written, tmp_path
):
    """Prepared in mini-swe-agent's own protocol, the request from Harbor's ATIF equals the one
    from the native file it came from, but for what ATIF does not keep: the exact argument string
    (ATIF holds an object: rendered as compact JSON) and litellm's ``content: null`` beside calls."""
    bodies = []
    for source in (harbor_written / "harbor-mini-swe-agent.json", MINI_NATIVE):
        out = tmp_path / source.name
        argv = ["replay", "--prepare-only", "--agent", "mini-swe-agent", "--trajectory", str(source)]
        proc = pvisor_main([*argv, "--after-step", "1", "--output", str(out)], text=True)
        assert proc.returncode == 0, proc.stderr
        bodies.append(json.loads((out / "prefix.json").read_text()))

    def without_spelling(body: dict) -> dict:
        for m in body["messages"]:
            if m.get("content") is None:
                m.pop("content", None)
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        return body

    atif, native = bodies
    assert atif != native and without_spelling(atif) == without_spelling(native)


def test_prepare_only_renders_an_unknown_agents_file_and_says_what_it_assumed(harbor_written, tmp_path):
    path = harbor_written / "harbor-terminus-2-v1.8.json"
    out = tmp_path / "out"
    argv = ["replay", "--prepare-only", "--agent", "atif", "--trajectory", str(path), "--after-step", "2"]
    proc = pvisor_main([*argv, "--output", str(out)], text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["prefix"]["protocol"] == "openai-chat"
    codes = [w["code"] for w in result["warnings"]]
    assert codes.count("atif_assumed") == 2
    # the result's image (an Anthropic block, as Claude Code's files hold one) has no place in a
    # Chat tool message: named, never silently lost
    assert "render_refused" in codes
    body = json.loads((out / "prefix.json").read_text())
    assert body["model"] == "gpt-test"  # litellm's provider prefix dropped, as the agent sends it
    calls = [c["function"]["arguments"] for m in body["messages"] for c in m.get("tool_calls") or []]
    assert calls[0] == json.dumps(
        {"keystrokes": "echo hello > hello.txt\n", "duration": 0.1}, separators=(",", ":")
    )


# --------------------------------------------------------------------------- pvisor's own export


def test_pvisors_export_reads_back_as_the_runs_agent_with_the_exact_arguments(exported):
    from pvisor.replay.snapshots import journal_trajectory
    from pvisor.journal.reader import JournalReader

    path, cap = exported
    code, doc, err = _show(path)
    assert code == 0 and doc["agent"] == "claude-code" and doc["profile"] == "atif@1.8", err
    with JournalReader(cap.journal) as r:
        traj = journal_trajectory(r, cap.run)
    assert doc["task"] == traj.task == "Write three files"
    assert [[c["arguments_raw"] for c in s["action"]["tool_calls"]] for s in doc["steps"]] == [
        [c.arguments_raw for c in s.action.tool_calls] for s in traj.steps
    ]
    assert [[r["content"] for r in s["observation"]["results"]] for s in doc["steps"]] == [
        [r.content for r in s.observation.results] for s in traj.steps
    ]
    assert len(doc["tools"]) == len(traj.tools) and doc["warnings"] == []


def test_subagents_continuations_and_unknown_fields_are_listed_never_fatal(tmp_path):
    steps = [
        {"step_id": 1, "source": "user", "message": "go", "color": "blue"},
        {"step_id": 2, "source": "agent", "message": "delegating", "llm_call_count": 3, "mood": {"x": 1},
         "tool_calls": [{"tool_call_id": "t1", "function_name": "Task", "arguments": {"prompt": "p"}}],
         "observation": {"results": [{"source_call_id": "t1", "content": "sub says hi",
                                      "subagent_trajectory_ref": [{"trajectory_id": "sub-1"}]}]},
         "metrics": {"prompt_tokens": 5, "logprobs": [-0.1]}},
        {"step_id": 3, "source": "system", "message": "late system note"},
        {"step_id": 4, "source": "user", "message": "and then?"},
    ]  # fmt: skip
    doc = {**_atif(steps, "ATIF-v1.9"), "continued_trajectory_ref": "part2.json", "whatever": [1, 2],
           "subagent_trajectories": [{"trajectory_id": "sub-1", "steps": [{}, {}]}]}  # fmt: skip
    path = tmp_path / "sub.json"
    path.write_text(json.dumps(doc))
    code, got, err = _show(path)
    assert code == 0, err
    [step] = got["steps"]
    assert step["flags"] == ["aggregated_inferences"] and step["action"]["usage"] == {"prompt_tokens": 5}
    assert step["observation"]["results"][0]["content"] == "sub says hi"
    assert [m["text"] for m in step["observation"]["messages"]] == ["and then?"]
    assert [(x["where"], x["kind"]) for x in got["left_out"]] == [
        ("continued_trajectory_ref", "continuation"),
        ("subagent_trajectories[0]", "subagent"),
        ("steps[1] (step_id 2).metrics", "metrics"),
        ("steps[1] (step_id 2).observation.results[0].subagent_trajectory_ref[0]", "subagent"),
        ("steps[2] (step_id 3)", "system"),
    ]
    assert [w["code"] for w in got["warnings"]] == ["unverified_profile", "atif_assumed"]


# --------------------------------------------------------------------------- bad input


def _atif(steps: list, version: str = "ATIF-v1.7") -> dict:
    return {"schema_version": version, "agent": {"name": "terminus-2", "version": "1"}, "steps": steps}


_AGENT = {"step_id": 2, "source": "agent", "message": "x",
          "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "ls"}}],
          "observation": {"results": [{"source_call_id": "c9", "content": "?"}]}}  # fmt: skip


#: two calls of one id in a step (a result cannot say which it answers)
_TWICE = {**_AGENT, "tool_calls": _AGENT["tool_calls"] * 2,
          "observation": {"results": [{"source_call_id": "c1", "content": "?"}] * 2}}  # fmt: skip


@pytest.mark.parametrize(
    "data, said",
    [
        (
            json.dumps(_atif([{"step_id": 1, "source": "user", "message": "hi"}]))[:-30].encode(),
            "not a JSON document",
        ),
        (
            json.dumps(_atif([{"step_id": 1, "source": "user", "message": "hi"}], "ATIF-v2.0")).encode(),
            "schema_version: atif format version 2.0 has major 2; this adapter reads atif@1.8 only",
        ),
        (
            json.dumps(_atif([{"step_id": 1, "source": "user", "message": "hi"}, _AGENT])).encode(),
            "steps[1] (step_id 2).observation.results[0]: source_call_id 'c9' names no tool call of this "
            "step",
        ),
        (
            json.dumps(_atif([{"step_id": 1, "source": "robot", "message": "hi"}])).encode(),
            "steps[0] (step_id 1): source 'robot' is not one of system, user, agent",
        ),
        (json.dumps(_atif([])).encode(), "steps: no steps (a non-empty list is required)"),
        (
            json.dumps(_atif([{"step_id": 1, "source": "user", "message": "hi"}])).encode("utf-16"),
            "not a JSON document",
        ),
        (
            b'{"schema_version": "ATIF-v1.7", "agent": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "not a JSON document",
        ),
        (
            json.dumps(_atif([{"step_id": 1, "source": "user", "message": "hi"}, _TWICE])).encode(),
            "steps[1] (step_id 2).tool_calls[1]: tool_call_id 'c1' names another call of this step",
        ),
    ],
    ids=[
        "truncated",
        "major-2",
        "missing-call-id",
        "bad-source",
        "no-steps",
        "utf-16",
        "nested-deep",
        "twice",
    ],
)
def test_bad_input_is_one_line_and_exit_65(tmp_path, data, said):
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    proc = pvisor_main(["trajectory", "show", str(path), "--agent", "atif"], text=True)
    lines = [x for x in proc.stderr.strip().splitlines() if not x.startswith("pvisor: note:")]
    assert proc.returncode == 65 and len(lines) == 1 and lines[0].startswith(f"pvisor: error: {path}"), (
        proc.stderr
    )
    assert said in lines[0], lines[0]
    if data.startswith(b'{"schema_version": "ATIF-v1'):  # detected by content without --agent, same line
        again = pvisor_main(["trajectory", "show", str(path)], text=True)
        assert again.returncode == 65 and said in again.stderr, again.stderr


def test_invalid_utf8_is_a_warning_and_a_large_file_reads(tmp_path):
    """Bytes that are not UTF-8 in a text read as U+FFFD with the reader's warning (``--strict``:
    exit 65), as in every native file; 20,000 steps read in a few seconds."""
    path = tmp_path / "latin1.json"
    doc = _atif([{"step_id": 1, "source": "user", "message": "caf\u00e9"}])
    path.write_bytes(json.dumps(doc, ensure_ascii=False).encode("latin-1"))
    code, doc, err = _show(path)
    assert code == 0 and doc["task"] == "caf\ufffd" and "invalid_utf8" in err
    assert _show(path, "--strict")[0] == 65
    steps = [{"step_id": 1, "source": "user", "message": "go"}] + [
        {"step_id": i + 2, "source": "agent", "message": f"s{i}",
         "tool_calls": [{"tool_call_id": f"c{i}", "function_name": "bash",
                         "arguments": {"command": "x" * 200}}],
         "observation": {"results": [{"source_call_id": f"c{i}", "content": "y" * 500}]}}
        for i in range(20_000)
    ]  # fmt: skip
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_atif(steps)))
    result, _ = read_native(big)
    assert len(result.trajectory.steps) == 20_000 and result.agent == "atif"


def test_another_agents_adapter_names_atif_when_given_one(harbor_written):
    with pytest.raises(
        BadInputError, match="a Harbor ATIF trajectory .ATIF-v1.7., not an OpenHands event list"
    ):
        from pvisor.adapters.native import get_adapter
        from pvisor.adapters.native.diagnostics import Diagnostics

        path = harbor_written / "harbor-mini-swe-agent.json"
        get_adapter("openhands").read(path, Diagnostics(str(path)))


# --------------------------------------------------------------------------- handoffs


def _handoff(path: Path, agent: str | None, to: str, after: int, root: Path, env: dict) -> dict:
    """``pvisor handoff --trajectory PATH [--agent AGENT] ... --replay-only`` (None: no --agent)."""
    ws, out = root / f"ws-{to}", root / f"out-{to}"
    ws.mkdir()
    argv = ["--journal", str(root / "h.sqlite"), "handoff", "--trajectory", str(path),
            *(["--agent", agent] if agent else []),
            "--after-step", str(after), "--to-agent", to, "--workspace", str(ws), "--output", str(out),
            "--replay-only", "--agent-entrypoint", str(entrypoint(to))]  # fmt: skip
    proc = pvisor(argv, env=env, cwd=root)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    files = {str(p.relative_to(ws)): p.read_text() for p in ws.rglob("*") if p.is_file()}
    return {"result": json.loads((out / "result.json").read_text()), "files": files}


@pytest.mark.parametrize("to", ["mini-swe-agent", "opencode"])
def test_pvisors_export_is_handed_to_a_real_agent(exported, tmp_path, to):
    path, cap = exported
    got = _handoff(path, "claude-code" if to == "opencode" else None, to, 2, tmp_path, cap.env)
    assert got["result"]["status"] == "ok" and got["result"]["mode"] == "handoff"
    assert got["result"]["handoff"]["from_agent"] == "claude-code"  # without --agent: the file's
    assert {k: v for k, v in got["files"].items() if k in EXPORTED_FILES} == EXPORTED_FILES


def test_the_python_api_hands_an_atif_file_over_without_agent(exported, tmp_path):
    """``pvisor.session.handoff(Path(atif), ...)`` without ``agent=``: the file's agent, as the
    command line defaults ``--agent`` (claude-code here, named by the export)."""
    path, cap = exported
    (tmp_path / "ws").mkdir()
    code = (
        "import json, sys\nfrom pathlib import Path\nfrom pvisor.session import handoff\n"
        f"r = handoff(Path({str(path)!r}), 2, to_agent='mini-swe-agent', workspace={str(tmp_path / 'ws')!r}, "
        f"output={str(tmp_path / 'out')!r}, journal={str(tmp_path / 'h.sqlite')!r}, replay_only=True, "
        f"entrypoint={str(entrypoint('mini-swe-agent'))!r})\n"
        "print(json.dumps([r.status, r.document['handoff']['from_agent']]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=cap.env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == ["ok", "claude-code"]


@pytest.mark.parametrize("to", ["mini-swe-agent", "opencode"])
def test_harbors_v18_file_of_an_unknown_agent_is_handed_to_a_real_agent(
    harbor_written, exported, tmp_path, to
):
    """terminus-2's ``bash_command`` calls are re-run as the target's shell (the generic descriptor's
    assumption, in the result's warnings); ``mark_task_complete`` is rendered as text. Without
    ``--agent`` the file's agent is the one it names (here ``atif``: one pvisor does not know)."""
    _, cap = exported
    agent = None if to == "mini-swe-agent" else "atif"
    got = _handoff(harbor_written / "harbor-terminus-2-v1.8.json", agent, to, 4, tmp_path, cap.env)
    result = got["result"]
    assert result["status"] == "ok" and result["agent"] == to and result["handoff"]["from_agent"] == "atif"
    assert {k: v for k, v in got["files"].items() if k in TERMINUS_FILES} == TERMINUS_FILES
    assert any(w["code"] == "atif_assumed" and "bash_command" in w["message"] for w in result["warnings"])


# --------------------------------------------------------------------------- hostile image paths


def _with_image(path: str) -> dict:
    part = {"type": "image", "source": {"media_type": "image/png", "path": path}}
    content = [{"type": "text", "text": "o"}, part]
    steps = [
        {"step_id": 1, "source": "user", "message": "go"},
        {"step_id": 2, "source": "agent", "message": "x",
         "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "ls"}}],
         "observation": {"results": [{"source_call_id": "c1", "content": content}]}},
    ]  # fmt: skip
    return _atif(steps, "ATIF-v1.8")


def test_an_image_path_outside_the_files_directory_is_never_read(tmp_path):
    """A hostile file's image part names a secret by an absolute path, a ``..`` out of
    ``images/``, a symbolic link out of it, or a device that never ends (``/dev/zero``): each
    is left out naming the path, and no byte of the file outside is read into the trajectory."""
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\nTOP-SECRET-BYTES")
    d = tmp_path / "run"
    (d / "images").mkdir(parents=True)
    (d / "images" / "link.png").symlink_to(secret)
    (d / "images" / "ok.png").write_bytes(b"\x89PNG\r\n\x1a\nfine")
    hostile = [str(secret), "images/../../secret.png", "images/link.png", "/dev/zero", "images", "a\x00.png"]
    for i, name in enumerate([*hostile, "images/ok.png"]):
        path = d / f"t{i}.json"
        path.write_text(json.dumps(_with_image(name)))
        result, _ = read_native(path)
        content = result.trajectory.steps[0].observation.results[0].content
        lost = [x for x in result.trajectory.left_out if x.kind == "image"]
        if name == "images/ok.png":
            assert content[1]["source"]["data"] == base64.b64encode(b"\x89PNG\r\n\x1a\nfine").decode()
            continue
        assert content == "o", name  # the text alone: no image block
        assert len(lost) == 1 and ("not read" in lost[0].reason or "NUL" in lost[0].reason), (name, lost)


def test_a_file_whose_bytes_are_no_image_of_its_media_type_is_left_out(tmp_path):
    """A text named ``images/text.png`` (``image/png``) is not sent as an image (a provider
    refuses the request that holds it): left out, naming the path; a real PNG is read."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "text.png").write_bytes(b"not an image at all\n")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_with_image("images/text.png")))
    result, _ = read_native(path)
    assert result.trajectory.steps[0].observation.results[0].content == "o"
    [lost] = [x for x in result.trajectory.left_out if x.kind == "image"]
    assert lost.reason == "image images/text.png: its bytes are not those of image/png"


def test_the_images_of_one_file_are_read_up_to_a_total(tmp_path, monkeypatch):
    """A small file naming one image many times would hold a copy of its base64 per part (a
    thousand parts of a 20 MiB image: 27 GB): past MAX_IMAGES_BYTES in all, the others are
    left out, named (the limit made small here: the real one is 256 MiB)."""
    from pvisor.adapters.native import atif

    png = b"\x89PNG\r\n\x1a\n" + b"x" * 92
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(png)
    monkeypatch.setattr(atif, "MAX_IMAGES_BYTES", 250)
    doc = _with_image("images/a.png")
    parts = doc["steps"][1]["observation"]["results"][0]["content"]
    parts += [parts[1]] * 4  # five parts naming the image: two fit in 250 bytes
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    result, _ = read_native(path)
    content = result.trajectory.steps[0].observation.results[0].content
    assert [p["type"] for p in content] == ["text", "image", "image"]
    lost = [x.reason for x in result.trajectory.left_out if x.kind == "image"]
    assert lost == ["image images/a.png: the file's images would pass 250 bytes in all"] * 3
