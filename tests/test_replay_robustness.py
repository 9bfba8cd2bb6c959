"""prepare-only against what a new user tried (issue 7, tester report /tmp/nu7/report.md, fixed in
H11): sources that sit where the outputs go, missing and damaged journals, unreadable
workspaces, numbers and paths JSON cannot carry, deep nesting, a journal inside the workspace,
another protocol than the profile's, a batch missing one result, a workspace written by someone
else, FIFOs and devices as the source, and the small option checks.

Every case runs the real CLI on real files in ``tmp_path`` (or the real functions on real
files): ``pvisor.cli.main(argv)`` in this process (tests/cli_helpers.py), a subprocess of the
installed script where it runs as another user, writes to /dev/full or takes bytes that are not
UTF-8 on its command line; nothing of pvisor is mocked. Each failed result.json is validated
against docs/result-schema.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest

from cli_helpers import pvisor_main
from conftest import cannot_run_here, corpus_dir
from corpus_runs import RUNS, corpus_lines, record_corpus_runs, record_line
from native_helpers import native_dir
from pvisor.adapters.protocols import get_protocol
from pvisor.gateway.proxy import finalize_response
from pvisor.journal.model import Attempt, Run
from pvisor.journal.writer import Journal
from pvisor.adapters.jsonio import dumps
from pvisor.replay.prefix import native_conversation, render_native
from pvisor.replay.profile import load_profile

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
PVISOR = shutil.which("pvisor", path=os.path.dirname(sys.executable))
CC = native_dir() / "claude-code"
MINI = native_dir() / "mini-swe-agent" / "real-2.4.6_single.traj.json"


def validate(result: dict) -> None:
    jsonschema.validate(result, SCHEMA, cls=jsonschema.Draft202012Validator)


def pvisor(*args, journal=None, cwd=None, env=None, prefix=(), timeout=120):
    """``pvisor [--journal JOURNAL] ARGS`` in this process, output as bytes; with a ``prefix``
    (a command that runs it as another user), the installed script in a subprocess."""
    pre = ["--journal", journal] if journal is not None else []
    if not prefix:
        return pvisor_main([*pre, *args], cwd=cwd, env=env)
    return subprocess.run(
        [*prefix, PVISOR, *pre, *args],
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def one_line_error(proc: subprocess.CompletedProcess, code: int, text: str) -> None:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == code, (proc.returncode, err)
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("pvisor: error:")]
    assert len(errors) == 1 and text in errors[0], err


def prepare(*args, journal=None, cwd=None, **kw) -> subprocess.CompletedProcess:
    return pvisor("replay", *args, "--prepare-only", journal=journal, cwd=cwd, **kw)


@pytest.fixture(scope="module")
def corpus_journal(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay-robust") / "journal.sqlite"
    record_corpus_runs(corpus_dir(), path)
    return path


# =========================================================================== 1: --force and the source


def test_force_never_overwrites_a_source_named_like_an_output(tmp_path, corpus_journal):
    for name in ("result.json", "prefix.json", "prefix.request.json"):
        d = tmp_path / f"xs-{name}"
        d.mkdir()
        src = d / name
        shutil.copyfile(MINI, src)
        before = src.read_bytes()
        proc = prepare(
            "--agent",
            "mini-swe-agent",
            "--trajectory",
            str(src),
            "--after-step",
            "1",
            "--output",
            str(d),
            "--force",
        )
        one_line_error(proc, 2, "a file prepare-only writes")
        assert src.read_bytes() == before and sorted(p.name for p in d.iterdir()) == [name]
    # the journal under an output name, reached through another spelling of the directory
    d = tmp_path / "xj"
    d.mkdir()
    shutil.copyfile(corpus_journal, d / "prefix.json")
    before = (d / "prefix.json").read_bytes()
    proc = prepare(
        "--agent",
        "codex",
        "--run",
        "codex-single",
        "--after-step",
        "1",
        "--output",
        f"{d}/../xj",
        "--force",
        journal=str(d / "prefix.json"),
    )
    one_line_error(proc, 2, "a file prepare-only writes")
    assert (d / "prefix.json").read_bytes() == before and sorted(p.name for p in d.iterdir()) == [
        "prefix.json"
    ]
    # the same file through a hard link
    d = tmp_path / "xh"
    d.mkdir()
    src = tmp_path / "traj.json"
    shutil.copyfile(MINI, src)
    os.link(src, d / "prefix.request.json")
    proc = prepare(
        "--agent",
        "mini-swe-agent",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--output",
        str(d),
        "--force",
    )
    one_line_error(proc, 2, "a file prepare-only writes")
    assert src.read_bytes() == MINI.read_bytes()


def test_force_replaces_earlier_files_only_once_everything_is_computed(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    for name in ("prefix.json", "prefix.request.json", "result.json"):
        (out / name).write_text("earlier\n")
    (out / "keep.txt").write_text("mine\n")
    proc = prepare(
        "--agent",
        "mini-swe-agent",
        "--trajectory",
        str(MINI),
        "--after-step",
        "1",
        "--output",
        str(out),
        "--force",
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "result.json").read_text())
    validate(res)
    assert (out / "prefix.json").read_bytes() != b"earlier\n" and (out / "keep.txt").read_text() == "mine\n"
    assert sorted(p.name for p in out.iterdir()) == [
        "keep.txt",
        "prefix.json",
        "prefix.request.json",
        "result.json",
    ]  # no temporary file left


# =========================================================================== 2: tracebacks -> one-line errors


def test_missing_journal_is_a_usage_error(tmp_path):
    proc = prepare(
        "--agent",
        "claude-code",
        "--run",
        "r-x",
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o"),
        journal=str(tmp_path / "missing.sqlite"),
    )
    one_line_error(proc, 2, "no such journal file")
    env = {**os.environ, "PVISOR_JOURNAL": str(tmp_path / "nojournal.sqlite")}
    proc = prepare(
        "--agent",
        "claude-code",
        "--run",
        "r-x",
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o2"),
        env=env,
    )
    one_line_error(proc, 2, "no such journal file")
    assert (
        not (tmp_path / "o").exists()
        and not (tmp_path / "o2").exists()
        and not (tmp_path / "nojournal.sqlite").exists()
    )


def _as_nobody() -> tuple[str, ...]:
    """A command prefix that drops root (file modes do not stop root), or () when not root."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        cannot_run_here("running as root without setpriv: a mode-000 file is readable")
    return (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.mark.parametrize("locked", ["file", "directory"])
def test_unreadable_workspace_entry_fails_with_workspace_unreadable(locked):
    prefix = _as_nobody()
    base = Path(tempfile.mkdtemp(prefix="pvisor-h11-"))  # not below pytest's root-only tmp dir
    try:
        base.chmod(0o777)
        ws = base / "ws"
        (ws / "locked").mkdir(parents=True)
        (ws / "locked" / "inner").write_text("x\n")
        (ws / "secret").write_text("s\n")
        traj = base / "t.jsonl"
        shutil.copyfile(CC / "spotter_short.jsonl", traj)
        traj.chmod(0o644)
        for p in (ws, ws / "locked"):
            p.chmod(0o755)
        (ws / "secret").chmod(0o644)
        (ws / "locked" / "inner").chmod(0o644)
        target = ws / "secret" if locked == "file" else ws / "locked"
        target.chmod(0)
        proc = prepare(
            "--agent",
            "claude-code",
            "--trajectory",
            str(traj),
            "--after-step",
            "1",
            "--output",
            str(base / "out"),
            "--workspace",
            str(ws),
            prefix=prefix,
        )
        one_line_error(proc, 65, f"workspace_unreadable: --workspace {ws}: cannot read {target}")
        assert sorted(p.name for p in (base / "out").iterdir()) == ["result.json"]
        res = json.loads((base / "out" / "result.json").read_text())
        validate(res)
        assert (
            res["status"] == "failed"
            and res["prefix"] is None
            and [e["code"] for e in res["errors"]] == ["workspace_unreadable"]
        )
    finally:
        for p in (base / "ws" / "secret", base / "ws" / "locked"):
            if p.exists() or p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(base)


def test_after_step_past_64_bits_is_out_of_range_with_a_result(tmp_path):
    n = str(2**64)
    proc = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(CC / "spotter_short.jsonl"),
        "--after-step",
        n,
        "--output",
        str(tmp_path / "o"),
    )
    one_line_error(proc, 65, "after_step_out_of_range")
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    validate(res)
    assert res["boundary"]["after_step"] == 2**64 and res["boundary"]["steps_total"] == 1
    assert res["errors"][0]["code"] == "after_step_out_of_range" and not res["errors"][0][
        "message"
    ].startswith("after_step_out_of_range")
    assert res["profile"] == "claude-code@2.1" or res["profile"] is not None


def test_jsonio_falls_back_to_the_standard_library():
    deep: object = "x"
    for _ in range(600):
        deep = [deep]
    assert json.loads(dumps({"n": 2**64, "d": deep})) == {"n": 2**64, "d": deep}
    assert (
        dumps({"b": 1, "a": "é"})
        == json.dumps({"b": 1, "a": "é"}, separators=(",", ":"), ensure_ascii=False).encode()
    )
    assert dumps({"b": [2**70], "a": 1}, sort_keys=True) == b'{"a":1,"b":[1180591620717411303424]}'


@pytest.mark.parametrize("option", ["--trajectory", "--output", "--workspace", "--journal"])
def test_non_utf8_paths_are_usage_errors_and_write_nothing(tmp_path, option, corpus_journal):
    bad = os.fsencode(str(tmp_path)) + b"/bad\xffname"
    if option == "--trajectory":
        shutil.copyfile(CC / "spotter_short.jsonl", os.fsdecode(bad))
    if option == "--workspace":
        os.mkdir(bad)
    if option == "--journal":
        shutil.copyfile(corpus_journal, os.fsdecode(bad))
    out = tmp_path / "out"
    args: dict[str, bytes | str] = {"--trajectory": str(CC / "spotter_short.jsonl"), "--output": str(out)}
    if option == "--journal":
        args = {"--run": "codex-single", "--output": str(out)}
        argv = [PVISOR, "--journal", bad, "replay", "--agent", "codex"]
    else:
        args[option] = bad
        argv = [PVISOR, "replay", "--agent", "claude-code"]
    for k, v in args.items():
        argv += [k, v]
    proc = subprocess.run(
        [*argv, "--after-step", "1", "--prepare-only"],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    one_line_error(proc, 2, "not valid UTF-8")
    assert "\\xff" in proc.stderr.decode()
    leftovers = [p for p in tmp_path.iterdir() if os.fsencode(p) != bad]
    assert leftovers == [], leftovers  # no output directory, no prefix files, no journal sidecars


def _cc_with_deep_input(path: Path, depth: int) -> None:
    lines = (CC / "spotter_short.jsonl").read_text().splitlines()
    out = []
    done = False
    for line in lines:
        d = json.loads(line)
        for b in (d.get("message") or {}).get("content") or []:
            if not done and isinstance(b, dict) and b.get("type") == "tool_use":
                deep: object = {"leaf": 1}
                for _ in range(depth):
                    deep = {"k": deep}
                b["input"] = deep
                done = True
        out.append(json.dumps(d))
    assert done
    path.write_text("\n".join(out) + "\n")


def test_deeply_nested_tool_input_is_bad_source_not_a_traceback(tmp_path):
    src = tmp_path / "deep.jsonl"
    _cc_with_deep_input(src, 600)
    proc = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o"),
    )
    assert "Traceback" not in proc.stderr.decode()
    if proc.returncode == 0:  # a renderer that copes: then the body must be the input
        assert json.loads((tmp_path / "o" / "prefix.json").read_bytes())
    else:
        one_line_error(proc, 65, "bad_source")
        res = json.loads((tmp_path / "o" / "result.json").read_text())
        validate(res)
        assert res["boundary"]["steps_total"] == 1 and not (tmp_path / "o" / "prefix.json").exists()
    assert (
        prepare(
            "--agent",
            "claude-code",
            "--trajectory",
            str(src),
            "--after-step",
            "0",
            "--output",
            str(tmp_path / "o0"),
        ).returncode
        == 0
    )


# =========================================================================== 3: journal inside the workspace


def test_journal_inside_the_workspace_is_refused_and_nothing_is_created(tmp_path, corpus_journal):
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copyfile(corpus_journal, ws / "j.sqlite")
    (ws / "code.py").write_text("x\n")
    proc = prepare(
        "--agent",
        "codex",
        "--run",
        "codex-single",
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o"),
        "--workspace",
        str(ws),
        journal=str(ws / "j.sqlite"),
    )
    one_line_error(proc, 2, "is inside --workspace")
    assert sorted(p.name for p in ws.iterdir()) == ["code.py", "j.sqlite"] and not (tmp_path / "o").exists()
    # also as --profile-from
    proc = prepare(
        "--agent",
        "mini-swe-agent",
        "--trajectory",
        str(MINI),
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o"),
        "--workspace",
        str(ws),
        "--profile-from",
        f"{ws / 'j.sqlite'}:mini-single",
    )
    one_line_error(proc, 2, "is inside --workspace")
    assert sorted(p.name for p in ws.iterdir()) == ["code.py", "j.sqlite"]


# ================================================================== 4: --protocol other than the profile's


QWEN = native_dir() / "qwen-code" / "real-0.24.4_single.jsonl"


@pytest.mark.parametrize("protocol", ["gemini", "anthropic"])
def test_profile_of_another_protocol_is_converted_through_the_canonical_model(
    tmp_path, corpus_journal, protocol
):
    out = tmp_path / "o"
    proc = prepare(
        "--agent",
        "qwen-code",
        "--trajectory",
        str(QWEN),
        "--after-step",
        "1",
        "--output",
        str(out),
        "--protocol",
        protocol,
        "--profile-from",
        f"{corpus_journal}:qwen-single",
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "result.json").read_text())
    validate(res)
    body = (out / "prefix.json").read_bytes()
    conv = get_protocol(protocol).parse_request(
        body, path=json.loads((out / "prefix.request.json").read_text())["path"]
    )
    assert res["prefix"]["origin"]["tools"] == "profile" and res["prefix"]["origin"]["system"] == "profile"
    profile, _ = load_profile(f"{corpus_journal}:qwen-single", "qwen-code", None)
    # the same tools (name, description, JSON Schema) and system text, in the target's shape
    empty = {"type": "object", "properties": {}}  # a Chat function without parameters takes none
    want = [
        (t.name, t.description, t.parameters if t.parameters is not None or protocol == "gemini" else empty)
        for t in profile.conversation.tools
    ]
    assert [(t.name, t.description, t.parameters) for t in conv.tools] == want
    assert conv.tools and conv.system == profile.conversation.system
    obj = json.loads(body)
    if protocol == "gemini":
        from google.genai import types

        assert list(obj["tools"][0]) == ["functionDeclarations"] and len(obj["tools"]) == 1
        tools = [types.Tool.model_validate(t) for t in obj["tools"]]
        assert len(tools[0].function_declarations or []) == len(conv.tools)
        assert (
            isinstance(obj["systemInstruction"], dict)
            and types.Content.model_validate(obj["systemInstruction"]).parts
        )
    else:
        from anthropic.types import ToolParam
        from pydantic import TypeAdapter

        assert all(set(t) <= {"name", "description", "input_schema"} for t in obj["tools"])
        TypeAdapter(list[ToolParam]).validate_python(obj["tools"])
        assert isinstance(obj["system"], (str, list)) and "function" not in json.dumps(obj["tools"][0])[:20]


def test_profile_of_chat_completions_rendered_as_responses(corpus_journal):
    """The same conversion for OpenAI Responses (the CLI path of an OpenCode file; OpenCode's
    corpus sessions have no native file, so the profile and render functions are called on a
    Qwen Code capture): flat function tools and a string ``instructions``."""
    from openai.types.responses import ToolParam
    from pydantic import TypeAdapter

    profile, _ = load_profile(f"{corpus_journal}:qwen-single", "qwen-code", None)
    assert profile.conversation.protocol == "openai-chat" and profile.conversation.tools
    notes: list = []
    conv, origin = native_conversation(
        "opencode", "openai-responses", "do it", [], None, None, "gpt-x", [], 0, profile, notes
    )
    body, _ = render_native("opencode", conv)
    obj = json.loads(body)
    assert isinstance(obj["instructions"], str) and origin["tools"] == "profile"
    assert all(t["type"] == "function" and "name" in t and "function" not in t for t in obj["tools"])
    TypeAdapter(list[ToolParam]).validate_python(obj["tools"])
    assert get_protocol("openai-responses").parse_request(body).tools


# =========================================================================== 5: a batch missing one result


def test_a_parallel_batch_missing_a_result_is_observation_not_recorded_below_the_last_step(tmp_path):
    lines = (CC / "spotter_tool_heavy.jsonl").read_text().splitlines(keepends=True)
    # lines 28 and 29 are one reply's two tool_use blocks (step 3), 31 and 32 their results
    assert '"tool_result"' in lines[32] and '"tool_use"' in lines[29]
    src = tmp_path / "drop2nd.jsonl"
    src.write_text("".join(lines[:32] + lines[33:]))
    # the lost line leaves a record whose parent is gone: refused by default (issue 14, damaged files)
    refused = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "2",
        "--output",
        str(tmp_path / "r2"),
    )
    one_line_error(refused, 65, "damaged_source")
    assert "line 33" in refused.stderr.decode() and "--allow-damaged" in refused.stderr.decode()
    ok = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "2",
        "--output",
        str(tmp_path / "o2"),
        "--allow-damaged",
    )
    assert ok.returncode == 0, ok.stderr
    assert any(
        w["code"] == "broken_chain"
        for w in json.loads((tmp_path / "o2" / "result.json").read_text())["warnings"]
    )
    steps_total = json.loads((tmp_path / "o2" / "result.json").read_text())["boundary"]["steps_total"]
    assert steps_total > 3
    for n in (3, 4):  # N = the step itself and any N after it, below the last step
        out = tmp_path / f"o{n}"
        proc = prepare(
            "--agent",
            "claude-code",
            "--trajectory",
            str(src),
            "--after-step",
            str(n),
            "--output",
            str(out),
            "--allow-damaged",
        )
        one_line_error(proc, 65, "observation_not_recorded")
        assert "A_3" in proc.stderr.decode() and "choose N < 3" in proc.stderr.decode()
        res = json.loads((out / "result.json").read_text())
        validate(res)
        assert (
            res["prefix"] is None
            and not (out / "prefix.json").exists()
            and res["boundary"]["steps_total"] == steps_total
        )


# =========================================================================== 6: workspace_changed


def test_workspace_changed_is_failed_without_prefix_files(tmp_path):
    if not Path("/proc/sys/kernel/random/uuid").exists():
        cannot_run_here("needs Linux /proc (uuid changes on every read)")
    out = tmp_path / "w3"
    out.mkdir()
    (out / "prefix.json").write_text("earlier\n")  # an earlier prepare's file does not survive a failed one
    proc = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(CC / "spotter_short.jsonl"),
        "--after-step",
        "1",
        "--output",
        str(out),
        "--workspace",
        "/proc/sys/kernel/random",
        "--force",
    )
    one_line_error(proc, 1, "workspace_changed")
    assert b"prepared" not in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["result.json"]
    res = json.loads((out / "result.json").read_text())
    validate(res)
    assert res["status"] == "failed" and res["prefix"] is None and res["tool_calls"] == []
    assert (
        res["workspace"]["unchanged"] is False
        and res["workspace"]["sha256_before"] != res["workspace"]["sha256_after"]
    )
    assert [e["code"] for e in res["errors"]] == ["workspace_changed"] and res["boundary"]["steps_total"] == 1


# =========================================================================== 7: FIFOs and devices


def test_fifo_and_device_as_trajectory_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    for src in (str(fifo), "/dev/zero", "/dev/null"):
        proc = prepare(
            "--agent",
            "claude-code",
            "--trajectory",
            src,
            "--after-step",
            "1",
            "--output",
            str(tmp_path / "o"),
            timeout=30,
        )
        one_line_error(proc, 2, "not a regular file")
    assert not (tmp_path / "o").exists()


# =========================================================================== 8: small checks


def test_empty_paths_session_with_run_and_odd_step_numbers_are_usage_errors(tmp_path, corpus_journal):
    src = str(CC / "spotter_short.jsonl")
    one_line_error(
        prepare(
            "--agent", "claude-code", "--trajectory", src, "--after-step", "1", "--output", "", cwd=tmp_path
        ),
        2,
        '--output ""',
    )
    one_line_error(
        prepare(
            "--agent",
            "claude-code",
            "--trajectory",
            src,
            "--after-step",
            "1",
            "--output",
            "o",
            "--workspace",
            "",
            cwd=tmp_path,
        ),
        2,
        '--workspace ""',
    )
    one_line_error(
        prepare(
            "--agent", "claude-code", "--trajectory", "", "--after-step", "1", "--output", "o", cwd=tmp_path
        ),
        2,
        '--trajectory ""',
    )
    for n in (" 1", "\uff11", "1_0", "+1"):
        one_line_error(
            prepare(
                "--agent",
                "claude-code",
                "--trajectory",
                src,
                "--after-step",
                n,
                "--output",
                "o",
                cwd=tmp_path,
            ),
            2,
            "not a step number",
        )
    one_line_error(
        prepare(
            "--agent",
            "codex",
            "--run",
            "codex-single",
            "--session",
            "abc",
            "--after-step",
            "1",
            "--output",
            "o",
            journal=str(corpus_journal),
            cwd=tmp_path,
        ),
        2,
        "--session",
    )
    (tmp_path / "afile").write_text("x")
    one_line_error(
        prepare(
            "--agent",
            "claude-code",
            "--trajectory",
            src,
            "--after-step",
            "1",
            "--output",
            "o",
            "--workspace",
            "afile",
            cwd=tmp_path,
        ),
        2,
        "not a directory",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_failed_result_keeps_what_the_source_said(tmp_path):
    proc = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(CC / "spotter_short.jsonl"),
        "--after-step",
        "5",
        "--output",
        str(tmp_path / "o"),
    )
    one_line_error(proc, 65, "after_step_out_of_range: --after-step 5")
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    validate(res)
    assert res["boundary"]["steps_total"] == 1 and res["profile"] == "claude-code@2.1"
    assert res["errors"][0]["message"].startswith(
        "--after-step 5"
    )  # the code is in errors[].code, not repeated


def _damage_a_body_blob(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        sha, data = conn.execute("SELECT sha256, data FROM blobs ORDER BY size DESC LIMIT 1").fetchone()
        flipped = bytes(data[:-1]) + bytes([data[-1] ^ 0xFF])
        conn.execute("UPDATE blobs SET data = ? WHERE sha256 = ?", (flipped, sha))
        conn.commit()
    finally:
        conn.close()


def test_damaged_journal_is_exit_3_and_journal_damaged(tmp_path, corpus_journal):
    j = tmp_path / "jd.sqlite"
    shutil.copyfile(corpus_journal, j)
    _damage_a_body_blob(j)
    codes = set()
    for run in RUNS:
        out = tmp_path / f"o-{run}"
        proc = prepare(
            "--agent", RUNS[run][0], "--run", run, "--after-step", "1", "--output", str(out), journal=str(j)
        )
        assert "Traceback" not in proc.stderr.decode()
        if proc.returncode == 3:
            res = json.loads((out / "result.json").read_text())
            validate(res)
            codes.add(res["errors"][0]["code"])
    assert codes == {"journal_damaged"}


def test_run_without_a_recorded_agent(tmp_path):
    """A gateway session of another client (no agent recorded): --agent is taken with a warning,
    but an agent that does not speak the recorded protocol is refused."""
    j = tmp_path / "gw.sqlite"
    lines = corpus_lines(corpus_dir(), "mini-swe-agent")
    with Journal.open(j, finalize=finalize_response) as w:
        w.create_run(Run(id="sec1", agent=None, agent_version=None))
        w.start_attempt(Attempt(run="sec1", n=1))
        for i in RUNS["mini-anthropic"][1][0][1]:
            record_line(w, "sec1", 1, lines[i], i)
        w.end_attempt("sec1", 1, 0)
        w.flush()
    proc = prepare(
        "--agent",
        "codex",
        "--run",
        "sec1",
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "c"),
        journal=str(j),
    )
    one_line_error(proc, 2, "records no agent")
    proc = prepare(
        "--agent",
        "claude-code",
        "--run",
        "sec1",
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "a"),
        journal=str(j),
    )
    assert proc.returncode == 0, proc.stderr
    assert "records no agent" in proc.stderr.decode()
    res = json.loads((tmp_path / "a" / "result.json").read_text())
    validate(res)
    assert [w["code"] for w in res["warnings"]] == ["agent_unrecorded"]


def test_result_to_stdout_with_stderr_unwritable_is_not_exit_1(tmp_path):
    if not Path("/dev/full").exists():
        cannot_run_here("needs /dev/full")
    out = tmp_path / "o"
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [
                PVISOR,
                "replay",
                "--agent",
                "claude-code",
                "--trajectory",
                str(CC / "spotter_short.jsonl"),
                "--after-step",
                "1",
                "--prepare-only",
                "--output",
                str(out),
                "--result",
                "-",
            ],
            stdout=subprocess.PIPE,
            stderr=full,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 0, (
        proc.returncode
    )  # the files and stdout are complete; lost stderr lines are no error
    assert (
        json.loads(proc.stdout)["status"] == "ok"
        and (out / "result.json").exists()
        and (out / "prefix.json").exists()
    )


# --------------------------------------------------------------------------- second new-user pass


def test_a_symlink_loop_as_output_is_a_usage_error(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    src = CC / "spotter_short.jsonl"
    for out in (tmp_path / "loop", tmp_path / "loop" / "sub"):
        p = prepare(
            "--agent", "claude-code", "--trajectory", str(src), "--after-step", "1", "--output", str(out)
        )
        one_line_error(p, 2, "cannot be resolved (a symlink loop)")


def test_a_step_number_of_thousands_of_digits(tmp_path):
    src = CC / "spotter_short.jsonl"
    p = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "0" * 5000 + "1",
        "--output",
        str(tmp_path / "a"),
    )
    assert p.returncode == 0, p.stderr  # leading zeros aside, N = 1
    p = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "9" * 4500,
        "--output",
        str(tmp_path / "b"),
    )
    one_line_error(p, 2, "a step number of 4500 digits (at most 4000)")


def test_a_fifo_or_device_as_journal_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "journal.fifo"
    os.mkfifo(fifo)
    for journal in (str(fifo), "/dev/zero"):
        p = prepare(
            "--agent",
            "codex",
            "--run",
            "codex-single",
            "--after-step",
            "1",
            "--output",
            str(tmp_path / "o"),
            journal=journal,
            timeout=30,
        )
        one_line_error(p, 2, f"--journal {journal} is not a regular file")
    assert not (tmp_path / "o").exists()


def test_many_bad_lines_give_capped_warnings(tmp_path):
    src = tmp_path / "junk-tail.jsonl"
    src.write_bytes((CC / "spotter_short.jsonl").read_bytes() + b'{"a":1}\n' * 5000)
    p = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o"),
    )
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    unknown = [
        w for w in result["warnings"] if "unknown_record" in w["code"] or "unknown_record" in w["message"]
    ]
    assert 100 <= len(unknown) <= 101, len(unknown)
    assert any("4900 more unknown_record warnings not listed" in w["message"] for w in result["warnings"])


def test_a_damaged_native_file_is_refused_by_playback_before_any_agent_starts(tmp_path):
    # issue 14, damaged files: replay-only reads the same file the same way as prepare-only
    lines = (CC / "spotter_tool_heavy.jsonl").read_text().splitlines(keepends=True)
    src = tmp_path / "lost-line.jsonl"
    src.write_text("".join(lines[:32] + ["{not json\n"] + lines[33:]))
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = pvisor(
        "replay",
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--replay-only",
        "--workspace",
        str(ws),
        "--output",
        str(tmp_path / "out"),
        "--agent-entrypoint",
        "/bin/false",
    )
    one_line_error(proc, 65, "damaged_source")
    err = proc.stderr.decode()
    assert "line 33" in err and "malformed_line" in err
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    validate(res)
    assert (
        res["status"] == "failed"
        and res["errors"][0]["code"] == "damaged_source"
        and res["derived_run"] is None
    )


def test_a_view_of_a_file_with_a_broken_chain_is_refused_as_a_prefix_is_and_marks_the_gap(tmp_path):
    """spotter_short.jsonl with its line 5 lost: the next record (now line 5) names as parentUuid
    a record the file no longer holds, and the reader bridges it to line 4. prepare-only refuses
    it (damaged_source, exit 65); `pvisor view` did not: it wrote the bridged view, exit 0, with
    nothing in it saying where. Now it refuses the same way, and with --allow-damaged the view's
    `repairs` names the gap."""
    lines = (CC / "spotter_short.jsonl").read_text().splitlines(keepends=True)
    src = tmp_path / "broken.jsonl"
    src.write_text("".join(lines[:4] + lines[5:]))
    refused_prefix = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "p"),
    )
    one_line_error(refused_prefix, 65, "damaged_source")
    refused = pvisor("view", str(src))
    one_line_error(refused, 65, "damaged_source: ")
    error = [x for x in refused.stderr.decode().splitlines() if x.startswith("pvisor: error:")][0]
    assert "broken.jsonl line 5: broken_chain:" in error and "--allow-damaged" in error
    assert refused.stdout == b""
    ok = pvisor("view", str(src), "--allow-damaged")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    [gap] = doc["repairs"]
    assert (gap["code"], gap["where"]) == ("broken_chain", "line 5") and "continued from line 4" in gap[
        "message"
    ]
    assert [s["damage"] for s in doc["steps"]] == [["broken_chain"]]
    whole = pvisor("view", str(CC / "spotter_short.jsonl"))
    assert whole.returncode == 0 and json.loads(whole.stdout)["repairs"] == []
    # a lost line inside a later step's reply: the mark stands on that step, not the first
    lines = (CC / "spotter_tool_heavy.jsonl").read_text().splitlines(keepends=True)
    assert '"type":"assistant"' in lines[26] and '"thinking"' in lines[27]  # step 3's text, thinking
    src = tmp_path / "lost27.jsonl"
    src.write_text("".join(lines[:26] + lines[27:]))
    ok = pvisor("view", str(src), "--allow-damaged")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert [s["damage"] for s in doc["steps"]] == [[], [], ["broken_chain"], []]
    assert [(r["code"], r["where"]) for r in doc["repairs"]] == [("broken_chain", "line 27")]


def test_a_refusal_of_a_repaired_file_says_it_covers_the_whole_file_not_a_view_across_it(tmp_path):
    """spotter_tool_heavy.jsonl without line 27: the repair is on step 3. A view at transition 0
    (step 1) and a prefix at N = 1 stop before it, yet are refused: the whole file is. The
    message said "a view across it" / "a prefix across it", which a pause before the repair is
    not; it now says a file the reader had to repair is refused (same code and exit status)."""
    lines = (CC / "spotter_tool_heavy.jsonl").read_text().splitlines(keepends=True)
    src = tmp_path / "lost27.jsonl"
    src.write_text("".join(lines[:26] + lines[27:]))
    view = pvisor("view", str(src), "--step", "0")
    pause = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "p"),
    )
    for proc, what in ((view, "at any step"), (pause, "at any N")):
        one_line_error(proc, 65, "damaged_source: ")
        error = [x for x in proc.stderr.decode().splitlines() if x.startswith("pvisor: error:")][0]
        assert "line 27: broken_chain:" in error and "across it" not in error
        assert f"a file the reader had to repair is refused {what}" in error and "--allow-damaged" in error


def test_a_cut_off_last_line_may_belong_to_the_last_step_which_no_boundary_includes(tmp_path):
    """Claude Code writes one reply over several lines: step 2's text on line 12, its Bash call
    on line 13. Cut in the middle of line 13, step 2 read as a text-only answer. The step is
    flagged (trajectory show, a view) and a boundary that includes it is damaged_source naming
    the file, the line and the step; N = 1 stays fine, --allow-damaged builds it. Before: exit
    0 at N = 2 (prepare-only, replay-only) with only a truncated_line warning."""
    lines = (CC / "spotter_tool_heavy.jsonl").read_bytes().split(b"\n")
    assert b'"tool_use"' in lines[12] and b'"text"' in lines[11]
    src = tmp_path / "cut.jsonl"
    src.write_bytes(b"\n".join(lines[:12]) + b"\n" + lines[12][: len(lines[12]) // 2])
    show = pvisor("trajectory", "show", "--agent", "claude-code", "--json", str(src))
    assert show.returncode == 0, show.stderr
    doc = json.loads(show.stdout)
    assert [s["flags"] for s in doc["steps"]] == [[], ["truncated_line"]]
    assert doc["steps"][1]["action"]["tool_calls"] == []  # what the cut left of A_2
    view = pvisor("view", str(src), "--agent", "claude-code")
    assert [s["damage"] for s in json.loads(view.stdout)["steps"]] == [[], ["truncated_line"]]
    ws = tmp_path / "ws"
    ws.mkdir()
    for mode in (
        ["--prepare-only"],
        ["--replay-only", "--workspace", str(ws), "--agent-entrypoint", "/bin/false"],
    ):
        out = tmp_path / f"out{len(mode)}"
        proc = pvisor("replay", "--agent", "claude-code", "--trajectory", str(src), "--after-step", "2",
                      *mode, "--output", str(out))  # fmt: skip
        one_line_error(
            proc,
            65,
            f"damaged_source: --after-step 2: {src} line 13 is cut off (not a whole record) and may belong "
            "to step 2, whose action or observation would then be incomplete; "
            "choose N < 2, or --allow-damaged",
        )
        res = json.loads((out / "result.json").read_text())
        validate(res)
        assert res["status"] == "failed" and [e["code"] for e in res["errors"]] == ["damaged_source"]
        assert res["derived_run"] is None and not (out / "prefix.json").exists()
    before = prepare("--agent", "claude-code", "--trajectory", str(src), "--after-step", "1",
                     "--output", str(tmp_path / "before"))  # fmt: skip
    assert before.returncode == 0, before.stderr
    allowed = prepare("--agent", "claude-code", "--trajectory", str(src), "--after-step", "2",
                      "--allow-damaged", "--output", str(tmp_path / "allowed"))  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    codes = [w["code"] for w in json.loads((tmp_path / "allowed" / "result.json").read_text())["warnings"]]
    assert "truncated_line" in codes


def test_a_lost_action_line_is_a_gap_at_its_step_never_a_renumbering(tmp_path):
    # issue 14, damaged files: the real Codex rollout without the line of step 3's call (line 25)
    lines = (
        (corpus_dir() / "native" / "codex" / "real-0.171.0_single-then-resume.jsonl")
        .read_text()
        .splitlines(keepends=True)
    )
    assert '"function_call"' in lines[24] and '"function_call_output"' in lines[27]
    src = tmp_path / "rollout-lost.jsonl"
    src.write_text("".join(lines[:24] + lines[25:]))
    # refused by default (the reader had to mark a gap), naming the line of the orphan output
    refused = prepare(
        "--agent", "codex", "--trajectory", str(src), "--after-step", "1", "--output", str(tmp_path / "r")
    )
    one_line_error(refused, 65, "damaged_source")
    assert "lost_action" in refused.stderr.decode() and "line 27" in refused.stderr.decode()
    ok = prepare(
        "--agent",
        "codex",
        "--trajectory",
        str(src),
        "--after-step",
        "2",
        "--output",
        str(tmp_path / "o2"),
        "--allow-damaged",
    )
    assert ok.returncode == 0, ok.stderr
    res = json.loads((tmp_path / "o2" / "result.json").read_text())
    validate(res)
    assert res["boundary"]["steps_total"] == 4 and any(
        w["code"] == "lost_action" for w in res["warnings"]
    )  # counted, not dropped
    for n in (3, 4):  # at the gap and after it
        out = tmp_path / f"o{n}"
        proc = prepare(
            "--agent",
            "codex",
            "--trajectory",
            str(src),
            "--after-step",
            str(n),
            "--output",
            str(out),
            "--allow-damaged",
        )
        one_line_error(proc, 65, "action_lost")
        assert "step 3" in proc.stderr.decode() and "choose N < 3" in proc.stderr.decode()
        failed = json.loads((out / "result.json").read_text())
        # the failed result still lists the repair that explains it
        assert failed["boundary"]["steps_total"] == 4 and any(
            w["code"] == "lost_action" for w in failed["warnings"]
        )


def test_a_lost_claude_code_reply_line_is_a_gap_at_its_step(tmp_path):
    # line 5 is step 1's whole reply (one tool_use); its result (line 11) then answers no call
    lines = (CC / "spotter_tool_heavy.jsonl").read_text().splitlines(keepends=True)
    assert '"tool_use"' in lines[4] and '"tool_result"' in lines[10]
    src = tmp_path / "lost-reply.jsonl"
    src.write_text("".join(lines[:4] + lines[5:]))
    from pvisor.adapters.native import read_native

    plain = read_native(CC / "spotter_tool_heavy.jsonl", "claude-code")[0].trajectory
    result = read_native(src, "claude-code")[0]
    steps = list(result.trajectory.steps)
    assert len(steps) == len(plain.steps)  # counted, never renumbered
    assert steps[0].flags == ["lost_action"] and steps[0].action.tool_calls == []
    assert [r.content for r in steps[0].observation.results] == [
        r.content for r in plain.steps[0].observation.results
    ]
    assert [s.action.text for s in steps[1:]] == [s.action.text for s in plain.steps[1:]]
    assert any(w.code == "lost_action" and w.where == "line 10" for w in result.diagnostics.warnings)
    proc = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "2",
        "--output",
        str(tmp_path / "o"),
        "--allow-damaged",
    )
    one_line_error(proc, 65, "action_lost")
    assert "step 1" in proc.stderr.decode()
    ok = prepare(
        "--agent",
        "claude-code",
        "--trajectory",
        str(src),
        "--after-step",
        "0",
        "--output",
        str(tmp_path / "o0"),
        "--allow-damaged",
    )
    assert ok.returncode == 0, ok.stderr


def test_a_lost_qwen_code_assistant_record_is_a_gap_at_its_step(tmp_path):
    # line 4 is step 1's reply (a functionCall); its tool_result (line 6) then answers no call
    path = corpus_dir() / "native" / "qwen-code" / "real-0.24.4_single.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert '"functionCall"' in lines[3] and '"functionResponse"' in lines[5]
    src = tmp_path / "lost.jsonl"
    src.write_text("".join(lines[:3] + lines[4:]))
    from pvisor.adapters.native import read_native

    plain = list(read_native(path, "qwen-code")[0].trajectory.steps)
    result = read_native(src, "qwen-code")[0]
    steps = list(result.trajectory.steps)
    assert (
        len(steps) == len(plain)
        and steps[0].flags == ["lost_action"]
        and len(steps[0].observation.results) == 1
    )
    assert [s.action.text for s in steps[1:]] == [s.action.text for s in plain[1:]]
    assert any(w.code == "lost_action" for w in result.diagnostics.warnings)
    proc = prepare(
        "--agent",
        "qwen-code",
        "--trajectory",
        str(src),
        "--after-step",
        "1",
        "--output",
        str(tmp_path / "o"),
        "--allow-damaged",
    )
    one_line_error(proc, 65, "action_lost")
