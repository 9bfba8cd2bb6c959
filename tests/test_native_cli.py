"""``pvisor adapters`` and ``pvisor trajectory show|export`` as users run them, on corpus samples
and small files written here: ``pvisor.cli.main(argv)`` in this process where a test reads the
output (tests/cli_helpers.py), a real subprocess of the installed console script where the input
is a stream, a FIFO or a pipe, the process is limited or killed, or its output pipe closes.
Also: the streamed documents equal the whole ones (render.write_* against render.to_*), a
closed pipe is exit 141, the table's column widths, versions that are not X.Y, detection
past a long first line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cli_helpers import pvisor_main
from conftest import cannot_run_here
from native_helpers import native_dir
from pvisor.adapters.native import read_native
from pvisor.adapters.native.render import JSON_OPTIONS, to_atif, to_json, write_atif, write_json

PVISOR = shutil.which("pvisor", path=os.path.dirname(sys.executable))


def run(*args: str, cwd: Path | None = None):
    """``pvisor ARGS`` in this process, its output as text."""
    return pvisor_main(list(args), cwd=cwd, text=True)


CODEX = "codex/real-0.171.0_single-then-resume.jsonl"
OPENCODE = "opencode/real-1.18.33_export_single.json"


def test_adapters_lists_every_adapter_with_its_profile():
    p = run("adapters", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    from pvisor.adapters.native import adapter_names, get_adapter

    assert [r["profile"] for r in rows] == [p.name for n in adapter_names() for p in get_adapter(n).profiles]
    profiles = {r["profile"] for r in rows}
    assert {
        "claude-code@2.1",
        "codex@0.171",
        "gemini-cli@0.61",
        "qwen-code@0.24",
        "mini-swe-agent@1.1",
        "opencode@1.18",
        "openhands@0.58",
    } <= profiles
    assert all(r["version_from"] and r["verified_with"] and r["description"] for r in rows)
    human = run("adapters")
    assert (
        human.returncode == 0
        and "claude-code@2.1" in human.stdout
        and "session_meta.payload.cli_version" in human.stdout
    )


def test_show_is_identical_whether_the_agent_is_given_or_detected():
    f = str(native_dir() / CODEX)
    detected, given = run("trajectory", "show", f), run("trajectory", "show", f, "--agent", "codex")
    assert detected.returncode == given.returncode == 0, detected.stderr
    assert detected.stdout == given.stdout
    assert "detected format: codex" in detected.stderr and given.stderr == ""
    assert (
        "system prompt: stored; tools: absent" in detected.stdout and "exec_command(cmd=" in detected.stdout
    )
    j1, j2 = (
        run("trajectory", "show", f, "--json"),
        run("trajectory", "show", f, "--json", "--agent", "codex"),
    )
    assert j1.stdout == j2.stdout
    doc = json.loads(j1.stdout)
    assert (
        doc["schema"] == "pvisor.native-trajectory/v1"
        and doc["profile"] == "codex@0.171"
        and doc["tools"] is None
    )
    assert [len(s["action"]["tool_calls"]) for s in doc["steps"]] == [1, 0, 1, 0]
    assert (
        doc["steps"][0]["action"]["tool_calls"][0]["arguments_raw"] == '{"cmd": "echo hello > out.txt && ls"}'
    )


def test_export_atif_keeps_the_exact_argument_string_in_extra():
    p = run("trajectory", "export", str(native_dir() / OPENCODE), "--format", "atif")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (
        doc["schema_version"] == "ATIF-v1.7"
        and doc["agent"]["name"] == "opencode"
        and doc["agent"]["version"] == "1.18.33"
    )
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    assert [s["source"] for s in doc["steps"]] == ["user", "agent", "agent"]
    calls = doc["steps"][1]["tool_calls"]
    assert [c["arguments"] for c in calls] == [
        {"command": "echo PARALLEL_ONE > one.txt && cat one.txt"},
        {"command": "echo PARALLEL_TWO > two.txt && cat two.txt"},
    ]
    assert all(json.loads(c["extra"]["arguments_raw"]) == c["arguments"] for c in calls)
    results = doc["steps"][1]["observation"]["results"]
    assert [r["source_call_id"] for r in results] == [c["tool_call_id"] for c in calls]
    assert [r["content"] for r in results] == ["PARALLEL_ONE\n", "PARALLEL_TWO\n"]


def test_export_atif_of_a_text_argument_keeps_it_in_extra_with_empty_arguments():
    f = (
        native_dir()
        / "codex"
        / "claude-code-log_synthetic_rollout-2026-01-02T03-04-05-11111111-1111-4111-8111-111111111111.jsonl"
    )
    doc = json.loads(run("trajectory", "export", str(f), "--format", "atif").stdout)
    [patch] = [
        c for s in doc["steps"] for c in s.get("tool_calls", []) if c["function_name"] == "apply_patch"
    ]
    assert (
        patch["arguments"] == {}
        and patch["extra"]["arguments_raw"].startswith("*** Begin Patch")
        and patch["extra"]["kind"] == "custom"
    )


def test_warnings_go_to_stderr_exit_0_and_strict_makes_them_exit_65(tmp_path):
    src = (native_dir() / CODEX).read_bytes()
    lines = src.split(b"\n")
    damaged = tmp_path / "rollout.jsonl"
    damaged.write_bytes(b"\n".join(lines[:5] + [b"{broken"] + lines[5:]))
    p = run("trajectory", "show", str(damaged))
    assert p.returncode == 0 and f"pvisor: warning: {damaged}: line 6: malformed_line" in p.stderr
    s = run("trajectory", "show", str(damaged), "--strict")
    assert s.returncode == 65 and "--strict" in s.stderr and "Traceback" not in s.stderr
    # a file name with control characters is named escaped: it cannot drive the terminal
    odd = tmp_path / "roll\x1b]0;pwned\x07out.jsonl"
    odd.write_bytes(damaged.read_bytes())
    w = run("trajectory", "show", str(odd))
    assert w.returncode == 0 and "\x1b" not in w.stderr and "\x07" not in w.stderr, w.stderr
    assert f"pvisor: warning: {tmp_path}/roll\\x1b]0;pwned\\x07out.jsonl: line 6: malformed_line" in w.stderr


def test_unknown_major_version_is_exit_65_naming_the_line(tmp_path):
    f = tmp_path / "rollout.jsonl"
    f.write_text(
        json.dumps({"timestamp": "t", "type": "session_meta", "payload": {"id": "x", "cli_version": "1.0.0"}})
        + "\n"
    )
    p = run("trajectory", "show", str(f))
    assert (
        p.returncode == 65
        and p.stderr.strip()
        == f"pvisor: error: {f}: line 1: codex format version 1.0.0 has major 1; "
        "this adapter reads codex@0.171 only"
    )


@pytest.mark.parametrize(
    "args, code, text",
    [
        (["trajectory", "show", "/nonexistent/file.jsonl"], 2, "no such file"),
        (["trajectory", "show", "SAMPLE", "--agent", "aider"], 2, "unknown native adapter 'aider'"),
        (["trajectory", "export", "SAMPLE", "--format", "har"], 2, "'har' is not one of"),
    ],
)
def test_user_errors_are_one_line_without_traceback(args, code, text):
    args = [str(native_dir() / CODEX) if a == "SAMPLE" else a for a in args]
    p = run(*args)
    assert p.returncode == code and text in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1


def test_an_unrecognised_file_is_exit_65(tmp_path):
    f = tmp_path / "notes.json"
    f.write_text('{"hello": 1}')
    p = run("trajectory", "show", str(f))
    assert p.returncode == 65 and "no native adapter recognises this file" in p.stderr
    # a directory is called one (a new user was told "file" for a directory)
    p = run("trajectory", "show", str(tmp_path))
    assert p.returncode == 65 and "no native adapter recognises this directory; give --agent" in p.stderr


# --------------------------------------------------------------------------- streamed output


def _corpus_files() -> list[Path]:
    return sorted(
        p
        for p in native_dir().glob("*/*")
        if p.is_file() and p.name != "PROVENANCE.md" and not p.name.endswith("db-dump.json")
    )


def _read_corpus() -> list[tuple[Path, object]]:
    """(path, (result, adapter)) of every corpus file that is read; samples refused by design
    are test_native_corpus.py's."""
    return [(p, got) for p in _corpus_files() if (got := _readable(p)) is not None]


def _readable(path: Path):
    """(result, adapter) of a corpus file, or None for a sample refused by design."""
    from pvisor.core.errors import BadInputError

    try:
        result, notes = read_native(path)
    except BadInputError:
        return None
    return result, notes[0].split(": ", 1)[1]


@pytest.mark.parametrize(
    "path, got", _read_corpus(), ids=lambda v: f"{v.parent.name}/{v.name}" if isinstance(v, Path) else ""
)
def test_streamed_documents_are_the_documents_byte_for_byte(path, got):
    import io

    from pvisor.core.errors import BadInputError

    result, agent = got
    for whole, stream in ((to_json, write_json), (to_atif, write_atif)):
        out = io.BytesIO()
        if whole is to_atif and _no_step(result):
            # ATIF needs a step: both forms refuse, the stream before writing a byte
            for make in (lambda: whole(result, agent), lambda: stream(result, agent, out)):
                with pytest.raises(BadInputError, match="no step to export as ATIF"):
                    make()
            assert out.getvalue() == b""
            continue
        stream(result, agent, out)
        assert out.getvalue() == orjson.dumps(whole(result, agent), option=JSON_OPTIONS) + b"\n"


def _no_step(result) -> bool:
    t = result.trajectory
    return t.system is None and t.task is None and not t.steps


@pytest.mark.parametrize(
    "path, got",
    [(p, g) for p, g in _read_corpus() if p.suffix == ".jsonl"],
    ids=lambda v: f"{v.parent.name}/{v.name}" if isinstance(v, Path) else "",
)
def test_show_json_and_export_write_the_whole_document(path, got):
    result, agent = got
    show = run("trajectory", "show", str(path), "--json")
    atif = run("trajectory", "export", str(path), "--format", "atif")
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    # show adds the episodes of a file with subagents (tests/test_episodes.py checks them)
    episodes = shown["meta"].pop("episodes", None)
    assert episodes is None or len(episodes) > 1 and episodes[0]["id"] == "main"
    assert shown == json.loads(orjson.dumps(to_json(result, agent)))
    if _no_step(result):  # tests/test_harbor_atif.py checks the one line
        assert atif.returncode == 65 and atif.stdout == ""
        return
    assert atif.returncode == 0, atif.stderr
    assert json.loads(atif.stdout) == json.loads(orjson.dumps(to_atif(result, agent)))


def _claude_session(path: Path, steps: int, *, result: str = "ok\n", first_line: dict | None = None) -> Path:
    """A Claude Code session of ``steps`` steps (text + one Bash call, its result), in the
    shape of bench/native_bench.py; ``first_line`` goes before it."""
    common = {
        "isSidechain": False,
        "sessionId": "S",
        "version": "2.1.38",
        "cwd": "/w",
        "timestamp": "2026-01-01T00:00:00Z",
    }
    lines = [] if first_line is None else [first_line]
    lines.append(
        {
            **common,
            "parentUuid": None,
            "type": "user",
            "uuid": "r-1",
            "message": {"role": "user", "content": "fix the tests"},
        }
    )
    for n in range(steps):
        lines.append(
            {
                **common,
                "parentUuid": f"r{n - 1}",
                "type": "assistant",
                "uuid": f"a{n}",
                "message": {
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [
                        {"type": "text", "text": "running it"},
                        {
                            "type": "tool_use",
                            "id": f"toolu_{n}",
                            "name": "Bash",
                            "input": {"command": f"pytest t{n}.py"},
                        },
                    ],
                },
            }
        )
        lines.append(
            {
                **common,
                "parentUuid": f"a{n}",
                "type": "user",
                "uuid": f"r{n}",
                "message": {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": result}],
                },
            }
        )
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


@pytest.mark.parametrize(
    "args", [["show", "--json"], ["export", "--format", "atif"], ["export", "--format", "json"], ["show"]]
)
def test_a_pipe_closed_early_is_exit_141(tmp_path, args):
    # output of several MB, far past the pipe's buffer: a write must meet the closed pipe
    f = _claude_session(tmp_path / "s.jsonl", 1500, result="x" * 2000)
    p = subprocess.Popen(
        [PVISOR, "trajectory", args[0], str(f), *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert len(p.stdout.read(100)) == 100
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "error" not in err


def test_a_full_disk_is_exit_74(tmp_path):
    if not Path("/dev/full").exists():
        cannot_run_here("needs /dev/full")
    f = _claude_session(tmp_path / "s.jsonl", 20)
    with open("/dev/full", "wb") as full:
        p = subprocess.run(
            [PVISOR, "trajectory", "export", str(f), "--format", "atif"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert p.returncode == 74 and "cannot write output" in p.stderr and "Traceback" not in p.stderr


# --------------------------------------------------------------------------- the table


def _table_rows(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("STEP"))
    return lines[start:-1]  # header and rows; the last line is "left out: ..."


def test_observation_cells_are_clipped_like_action_cells(tmp_path):
    f = _claude_session(tmp_path / "s.jsonl", 2)
    lines = f.read_bytes().split(b"\n")
    # a long user prompt after the last result: the observation of step 2
    prompt = {
        "parentUuid": "r1",
        "isSidechain": False,
        "sessionId": "S",
        "version": "2.1.38",
        "cwd": "/w",
        "type": "user",
        "uuid": "p1",
        "message": {"role": "user", "content": "now also " + "very long request " * 40},
    }
    extra = {
        "parentUuid": "p1",
        "isSidechain": False,
        "sessionId": "S",
        "version": "2.1.38",
        "cwd": "/w",
        "type": "assistant",
        "uuid": "a9",
        "message": {
            "id": "msg_9",
            "role": "assistant",
            "model": "claude-x",
            "content": [{"type": "text", "text": "done"}],
        },
    }
    f.write_bytes(b"\n".join(lines[:-1] + [orjson.dumps(prompt), orjson.dumps(extra), b""]))
    p = run("trajectory", "show", str(f))
    assert p.returncode == 0, p.stderr
    header, *rows = _table_rows(p.stdout)
    obs, flags = header.index("OBSERVATION"), header.index("FLAGS")
    assert flags - obs <= 60 + 2
    assert any("…" in r[obs:flags] for r in rows), p.stdout
    assert all(len(r) <= flags + len("interrupted,compaction") for r in rows)


def test_a_long_table_streams_at_fixed_column_widths(tmp_path):
    from pvisor.commands.trajectory import ACTION_WIDTH, OBSERVATION_WIDTH, TABLE_BUFFER_ROWS

    f = _claude_session(tmp_path / "s.jsonl", TABLE_BUFFER_ROWS + 5)
    p = run("trajectory", "show", str(f))
    assert p.returncode == 0, p.stderr
    header, *rows = _table_rows(p.stdout)
    assert len(rows) == TABLE_BUFFER_ROWS + 5
    step_w = len(str(TABLE_BUFFER_ROWS + 5))
    assert header.index("ACTION") == step_w + 2
    assert header.index("OBSERVATION") == step_w + 2 + ACTION_WIDTH + 2
    assert header.index("FLAGS") == step_w + 2 + ACTION_WIDTH + 2 + OBSERVATION_WIDTH + 2
    # every row, buffered or streamed, has its cells at the header's columns
    for r in (rows[0], rows[TABLE_BUFFER_ROWS - 1], rows[-1]):
        assert (
            r[header.index("OBSERVATION") - 2 : header.index("OBSERVATION")] == "  "
            and r[header.index("FLAGS") :] == "-"
        ), r
    assert rows[-1].startswith(f"{TABLE_BUFFER_ROWS + 5}  Bash(command=")
    # a short table keeps columns as wide as their content
    short = run("trajectory", "show", str(_claude_session(tmp_path / "t.jsonl", 3)))
    header, *rows = _table_rows(short.stdout)
    assert header.index("ACTION") == len("STEP") + 2 and header.index("OBSERVATION") < ACTION_WIDTH


# --------------------------------------------------------------------------- versions, detection


def test_a_version_that_is_not_x_y_is_read_by_shape_with_a_warning(tmp_path):
    src = (native_dir() / CODEX).read_bytes().split(b"\n")
    meta = orjson.loads(src[0])
    assert meta["type"] == "session_meta"
    meta["payload"]["cli_version"] = "banana"
    f = tmp_path / "rollout.jsonl"
    f.write_bytes(b"\n".join([orjson.dumps(meta), *src[1:]]))
    p = run("trajectory", "show", str(f), "--json")
    assert p.returncode == 0, p.stderr
    assert (
        f"pvisor: warning: {f}: line 1: unreadable_version: format version 'banana' does not read as X.Y; "
        "read by shape as codex@0.171" in p.stderr
    )
    doc = json.loads(p.stdout)
    assert [len(s["action"]["tool_calls"]) for s in doc["steps"]] == [1, 0, 1, 0]
    assert [w["code"] for w in doc["warnings"]] == ["unreadable_version"]
    strict = run("trajectory", "show", str(f), "--strict")
    assert strict.returncode == 65 and "Traceback" not in strict.stderr


def test_a_first_line_of_200_kib_does_not_hide_the_format(tmp_path):
    lines = (native_dir() / "claude-code" / "spotter_short.jsonl").read_bytes().split(b"\n")
    snapshot = orjson.loads(lines[0])
    assert snapshot["type"] == "file-history-snapshot"
    snapshot["snapshot"]["trackedFileBackups"] = {
        f"/src/file{i}.py": {"backupFileName": "b" * 180, "version": 1} for i in range(1000)
    }
    first = orjson.dumps(snapshot)
    assert len(first) > 200 * 1024
    f = tmp_path / "session.jsonl"
    f.write_bytes(b"\n".join([first, *lines[1:]]))
    detected, given = (
        run("trajectory", "show", str(f)),
        run("trajectory", "show", str(f), "--agent", "claude-code"),
    )
    assert detected.returncode == 0, detected.stderr
    assert "detected format: claude-code" in detected.stderr and detected.stdout == given.stdout
    # past 4 MiB before the 2nd line, detection gives up (exit 65 asks for --agent)
    snapshot["snapshot"]["trackedFileBackups"] = {"/big": "x" * (4 * 1024 * 1024 + 10)}
    f.write_bytes(b"\n".join([orjson.dumps(snapshot), *lines[1:]]))
    far = run("trajectory", "show", str(f))
    assert far.returncode == 65 and "give --agent" in far.stderr
    assert run("trajectory", "show", str(f), "--agent", "claude-code").returncode == 0


# --------------------------------------------------------------------------- --session


def test_session_option_reads_that_session_of_an_opencode_store():
    root = native_dir() / "opencode" / "agent-sessions_storage_v2"
    default = json.loads(run("trajectory", "show", str(root), "--json").stdout)
    chosen = run("trajectory", "show", str(root), "--session", "s_stage0_small", "--json")
    assert chosen.returncode == 0, chosen.stderr
    doc = json.loads(chosen.stdout)
    assert doc["meta"]["session"] == "s_stage0_small" != default["meta"]["session"]
    assert doc["meta"]["session_chosen_by"] == "id given"
    atif = run("trajectory", "export", str(root), "--format", "atif", "--session", "s_stage0_small")
    assert atif.returncode == 0 and json.loads(atif.stdout)["session_id"] == "s_stage0_small"


def test_session_option_with_an_unknown_id_is_exit_65_listing_the_ids():
    root = native_dir() / "opencode" / "agent-sessions_storage_v2"
    p = run("trajectory", "show", str(root), "--session", "ses_nope")
    assert p.returncode == 65 and "ses_nope" in p.stderr and "s_stage0_small" in p.stderr
    assert "Traceback" not in p.stderr


def test_session_option_on_a_one_session_file_is_a_usage_error():
    p = run("trajectory", "show", str(native_dir() / CODEX), "--session", "x")
    assert (
        p.returncode == 2
        and p.stderr.strip()
        == "pvisor: error: --session applies to stores of several sessions (opencode), not to a codex file"
    )


# --------------------------------------------------------------------------- input that is not a regular file


CLAUDE = "claude-code/spotter_tool_heavy.jsonl"


def test_stdin_and_a_pipe_read_like_the_file():
    src = native_dir() / CLAUDE
    want = run("trajectory", "show", str(src), "--json")
    assert want.returncode == 0
    from_stdin = subprocess.run(
        [PVISOR, "trajectory", "show", "-", "--json"], stdin=open(src, "rb"), capture_output=True, text=True
    )
    assert from_stdin.returncode == 0, from_stdin.stderr
    piped = subprocess.run(
        ["bash", "-c", '"$0" trajectory show <(cat "$1") --agent claude-code --json', PVISOR, str(src)],
        capture_output=True,
        text=True,
    )
    assert piped.returncode == 0, piped.stderr
    for got in (from_stdin, piped):
        a, b = json.loads(got.stdout), json.loads(want.stdout)
        assert a["source"] != b["source"]  # named as given: "-" or /dev/fd/N
        a.pop("source"), b.pop("source")
        assert a == b


def _bounded(args, tmp_path, **kw) -> subprocess.CompletedProcess:
    """The installed script as its own process: ``pvisor trajectory ARGS`` with TMPDIR of its
    own, never allowed to write more than 64 MiB to any file (RLIMIT_FSIZE: a pvisor that copies
    an endless stream dies of SIGXFSZ instead of filling the disk, and the test fails)."""
    import resource

    assert PVISOR, "the pvisor console script is installed with the package"
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))

    return subprocess.run(
        [PVISOR, "trajectory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp)},
        preexec_fn=limit,
        **kw,
    )


def test_a_device_is_refused_without_reading_it(tmp_path):
    p = _bounded(["show", "/dev/zero"], tmp_path)
    assert (p.returncode, p.stderr) == (
        2,
        "pvisor: error: /dev/zero: is a character device, not a trajectory file; "
        "give a file, or pipe one through -\n",
    )
    p = _bounded(["show", "-"], tmp_path, stdin=open("/dev/zero", "rb"))
    assert p.returncode == 2 and p.stderr.startswith(
        "pvisor: error: -: standard input is a character device,"
    )
    assert list((tmp_path / "tmpdir").iterdir()) == []


def test_an_endless_stream_stops_at_the_input_limit_and_leaves_nothing_behind(tmp_path):
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        p = _bounded(["show", "-", "--max-input", "2MiB"], tmp_path, stdin=yes.stdout)
    finally:
        yes.kill()
        yes.wait()
    assert (p.returncode, p.stderr) == (
        65,
        "pvisor: error: -: the stream gave more than 2 MiB (--max-input); "
        "raise --max-input, or give the trajectory as a file\n",
    )
    assert list((tmp_path / "tmpdir").iterdir()) == []  # the partial copy is gone
    # the default bound is 1 GiB: below it a trajectory on stdin reads as before
    src = native_dir() / CLAUDE
    p = _bounded(["show", "-", "--max-input", str(src.stat().st_size)], tmp_path, stdin=open(src, "rb"))
    assert p.returncode == 0, p.stderr


def test_a_fifo_nobody_writes_and_a_stalled_pipe_end_after_the_input_timeout(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    p = _bounded(["show", str(fifo), "--input-timeout", "0.5"], tmp_path)
    assert (p.returncode, p.stderr) == (
        2,
        f"pvisor: error: {fifo}: no data for 0.5 s (is a process writing to it?); "
        "--input-timeout S waits longer\n",
    )
    stalled = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
    try:
        p = _bounded(
            ["export", "-", "--format", "atif", "--input-timeout", "0.5"], tmp_path, stdin=stalled.stdout
        )
    finally:
        stalled.kill()
        stalled.wait()
    assert p.returncode == 2 and p.stderr.startswith("pvisor: error: -: no data for 0.5 s"), p.stderr
    # a FIFO that is written reads like the file
    src = native_dir() / CLAUDE
    writer = subprocess.Popen(["sh", "-c", 'sleep 0.3; cat "$0" > "$1"', str(src), str(fifo)])
    p = _bounded(["show", str(fifo), "--agent", "claude-code", "--input-timeout", "20"], tmp_path)
    writer.wait(10)
    assert p.returncode == 0 and "task: start phoenix in background" in p.stdout, p.stderr


def test_a_full_temporary_directory_names_the_input(tmp_path, small_fs):
    full = small_fs("64k")
    src = tmp_path / "long.jsonl"
    src.write_bytes((native_dir() / CLAUDE).read_bytes() * 4)  # more than the file system holds
    p = subprocess.run(
        [PVISOR, "trajectory", "show", "-"],
        stdin=open(src, "rb"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(full)},
    )
    assert (p.returncode, p.stderr) == (
        74,
        f"pvisor: error: -: cannot copy the stream to a temporary file in {full}: No space left on device "
        "(set TMPDIR to a directory with room, or give the trajectory as a file)\n",
    )
    assert list(full.iterdir()) == []


def test_bad_stream_limits_are_usage_errors_naming_the_option():
    p = run("trajectory", "show", "-", "--max-input", "lots")
    assert p.returncode == 2 and "Invalid value for '--max-input': 'lots' is not a size" in p.stderr
    p = run("trajectory", "export", "-", "--format", "json", "--input-timeout", "inf")
    assert (
        p.returncode == 2 and "Invalid value for '--input-timeout': 'inf' is not a finite number" in p.stderr
    )
    # a finite but huge wait overflowed poll(): a traceback (found by the new-user helper)
    p = run("trajectory", "show", "-", "--input-timeout", "1e308")
    assert (
        p.returncode == 2
        and "'1e308' is more than 2147483 seconds" in p.stderr
        and "Traceback" not in p.stderr
    )


def test_unopenable_paths_are_usage_errors_naming_why(tmp_path):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    p = run("trajectory", "show", str(tmp_path / "loop1"))
    assert (
        p.returncode == 2
        and p.stderr.strip()
        == f"pvisor: error: {tmp_path / 'loop1'}: cannot open: Too many levels of symbolic links"
    )
    p = run("trajectory", "show", "")
    assert p.returncode == 2 and p.stderr.strip() == "pvisor: error: no file given (an empty path)"


def test_an_error_naming_a_file_with_a_newline_stays_one_line(tmp_path):
    f = tmp_path / "a\nb.jsonl"
    f.write_text("not a session\n")
    p = run("trajectory", "show", str(f))
    assert p.returncode == 65
    assert p.stderr.count("\n") == 1 and "a\\nb.jsonl" in p.stderr


def test_closed_stdout_is_exit_74_not_a_traceback():
    p = subprocess.run(["bash", "-c", '"$0" adapters >&-', PVISOR], capture_output=True, text=True)
    assert p.returncode == 74
    assert p.stderr == "pvisor: error: cannot write output: stdout is closed\n"


def test_the_table_escapes_bidi_overrides_and_line_separators(tmp_path):
    recs = [
        {
            "parentUuid": None,
            "isSidechain": False,
            "type": "user",
            "uuid": "u0",
            "sessionId": "S",
            "version": "2.1.38",
            "message": {"role": "user", "content": "fix \u202egnp.exe"},
        },
        {
            "parentUuid": "u0",
            "isSidechain": False,
            "type": "assistant",
            "uuid": "a1",
            "sessionId": "S",
            "version": "2.1.38",
            "message": {
                "id": "m1",
                "role": "assistant",
                "model": "x",
                "content": [{"type": "text", "text": "done\u2028next"}],
            },
        },
    ]
    f = tmp_path / "s.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    p = run("trajectory", "show", str(f))
    assert p.returncode == 0, p.stderr
    assert "\u202e" not in p.stdout and "\u2028" not in p.stdout
    assert "fix \\u202egnp.exe" in p.stdout


def test_arguments_nested_deeper_than_orjson_writes_are_shown_and_exported(tmp_path):
    deep: object = "x"
    for _ in range(600):
        deep = {"a": deep}
    recs = [
        {
            "parentUuid": None,
            "isSidechain": False,
            "type": "user",
            "uuid": "u0",
            "sessionId": "S",
            "version": "2.1.38",
            "message": {"role": "user", "content": "go"},
        },
        {
            "parentUuid": "u0",
            "isSidechain": False,
            "type": "assistant",
            "uuid": "a1",
            "sessionId": "S",
            "version": "2.1.38",
            "message": {
                "id": "m1",
                "role": "assistant",
                "model": "x",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": deep}],
            },
        },
        {
            "parentUuid": "a1",
            "isSidechain": False,
            "type": "user",
            "uuid": "u1",
            "sessionId": "S",
            "version": "2.1.38",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
            },
        },
    ]
    f = tmp_path / "deep.jsonl"
    import sys as _sys

    limit = _sys.getrecursionlimit()
    _sys.setrecursionlimit(5000)  # the test's own json.dumps of 600 levels
    try:
        f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    finally:
        _sys.setrecursionlimit(limit)
    for args in (["show", str(f), "--json"], ["export", str(f), "--format", "atif"], ["show", str(f)]):
        p = run("trajectory", *args)
        assert p.returncode == 0, p.stderr
        assert "Traceback" not in p.stderr
    doc = json.loads(run("trajectory", "show", str(f), "--json").stdout)
    raw = doc["steps"][0]["action"]["tool_calls"][0]["arguments_raw"]
    assert raw.startswith('{"a":{"a":') and raw.count("{") == 600


def test_paths_are_named_as_a_path_would_name_them(tmp_path: Path):
    """The short commands take their paths as strings (docs/benchmarks.md): ``j.sqlite/``,
    ``./t.jsonl`` and ``out/`` still mean and are named as ``j.sqlite``, ``t.jsonl`` and ``out``
    (a trailing slash once made an existing journal "no journal yet", exit 0, and a file with
    one unreadable; a result named ``./t.jsonl`` as typed)."""
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal

    with Journal.open(tmp_path / "j.sqlite") as j:
        j.create_run(Run(id="r-slash0000001", agent="codex"))
    p = run("--journal", "j.sqlite/", "journal", "ls", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert [r["id"] for r in json.loads(p.stdout)] == ["r-slash0000001"]
    shutil.copy(native_dir() / CODEX, tmp_path / "t.jsonl")
    p = run("trajectory", "show", "t.jsonl/", "--agent", "codex", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = run("replay", "--agent", "codex", "--trajectory", ".//t.jsonl", "--after-step", "1", "--prepare-only",
            "--output", "out/", cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["source"]["path"] == "t.jsonl"
    assert result["prefix"]["path"] == str((tmp_path / "out" / "prefix.json").resolve())
    assert p.stdout.startswith("prepared ") and " from t.jsonl," in p.stdout
