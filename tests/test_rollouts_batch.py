"""Rollouts from a manifest (``pvisor replay --batch MANIFEST`` without ``--prepare-only``) with
the real agent CLIs, offline: mini-swe-agent's and Codex's scripted captures are continued,
replayed and handed over after step 1, the live model a scripted model server (``"main_chain":
"any-tools"``: several sessions on one server). Lines that are no rollout, a key in a line, and
an agent that is not installed fail alone; a line's key_file reaches the agent (the live side
receives its key as the request's credential) and nothing pvisor writes. Nothing is mocked."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from agent_helpers import (
    PVISOR,
    capture_scripted,
    entrypoint,
    gated_entrypoint,
    pvisor,
    rollout_live_script,
    script_for,
    user_env,
    wait_gone,
)
from aiohttp import web
from cli_inprocess import pvisor as pvisor_in
from pvisor.gateway.routing import USERINFO_REFUSED
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal
from pvisor.replay.rollout_manifest import RolloutLine, RolloutMode, read_rollouts

pytestmark = pytest.mark.slow

TASK = "Write a.txt, b.txt and c.txt."
#: the key the Codex continuation's key_file holds, and a key pasted into a manifest line
FILE_KEY = "sk-test-Kf9q2Zx7Wm4Lp8Rt"
LINE_KEY = "sk-test-Qa3Vn6Ye1Hs5Jd0U"
#: a key_file value that looks like no secret (a name without KEY, TOKEN..., a value of no key shape)
PLAIN = "corp-internal-PLAINSECRET"
SECRETS_SENT = [FILE_KEY, LINE_KEY]  # no piece of them in any journal, log or result.json (conftest)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A scripted capture of mini-swe-agent and one of Codex (each in its own journal)."""
    root = tmp_path_factory.mktemp("rollout-sources")
    caps = {}
    for agent in ("mini-swe-agent", "codex"):
        (root / agent).mkdir()
        caps[agent] = capture_scripted(agent, root / agent, script_for(agent), TASK)
    return caps


def recording_proxy(stack, target: str):
    """A server in front of ``target`` that records each request's headers (``requests``)."""

    async def forward(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.request(request.method, target + request.raw_path, data=body, headers=headers) as r:
                data = await r.read()
                keep = {
                    k: v for k, v in r.headers.items() if k.lower() in ("content-type", "content-encoding")
                }
                return web.Response(body=data, status=r.status, headers=keep)

    return stack.raw_upstream(forward)


def parent_of(pid: int) -> int:
    """The parent process of ``pid`` (/proc)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def start_batch(manifest: Path, rows: Path, tmp_path: Path, **popen) -> subprocess.Popen:
    """``pvisor replay --replay-only --batch MANIFEST --rows ROWS`` started in ``tmp_path`` (its
    own HOME), its output read as text; ``popen``: more of Popen's arguments."""
    return subprocess.Popen(
        [str(PVISOR), "replay", "--replay-only", "--batch", str(manifest), "--rows", str(rows)],
        env=user_env(tmp_path / "home"),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def line(cap, **kw) -> dict:
    return {"run": cap.run, "journal": str(cap.journal), "after_step": 1, **kw}


def test_four_rollouts_two_agents_run_locally_and_bad_lines_fail_alone(sources, stack, tmp_path):
    mini, codex = sources["mini-swe-agent"], sources["codex"]
    live = stack.scripted(rollout_live_script(3))
    proxy = recording_proxy(stack, live)
    keys = tmp_path / "keys.txt"
    keys.write_text(f'# the Codex rollout\'s key\nOPENAI_API_KEY={FILE_KEY}\nMODEL_ACCESS="{PLAIN}"\n')
    exe = {a: str(entrypoint(a)) for a in ("mini-swe-agent", "codex")}
    lines = [
        line(mini, name="cont-mini", upstream=live, max_steps=1, entrypoint=exe["mini-swe-agent"],
             timeout=120),
        line(codex, name="cont-codex", upstream=proxy.url, max_steps=1, entrypoint=exe["codex"],
             key_file=str(keys), timeout=120),
        line(codex, name="replay-codex", mode="replay-only", entrypoint=exe["codex"], timeout=120),
        line(mini, name="handoff", mode="handoff", to_agent="codex", upstream=live, max_steps=1,
             entrypoint=exe["codex"], timeout=120),
        line(codex, name="no-agent", mode="replay-only", entrypoint=str(tmp_path / "missing" / "codex")),
        line(codex, name="pasted", upstream=live, boundary_user_prompt=f"use {LINE_KEY}"),
        line(mini, name="far", after_step=99, upstream=live),  # two problems: the step, the agent not on PATH
    ]  # fmt: skip
    text = "\n".join(json.dumps(x) for x in lines[:4]) + "\n{not json\n"
    text += "\n".join(json.dumps(x) for x in lines[4:]) + "\n"
    manifest, rows = tmp_path / "m.jsonl", tmp_path / "rows.jsonl"
    manifest.write_text(text)
    tmp = tmp_path / "tmp"  # the batch's temporary directories and the default workspaces
    tmp.mkdir()
    proc = pvisor(
        ["replay", "--batch", str(manifest), "--rows", str(rows), "--concurrency", "2"],
        env=user_env(tmp_path / "home", TMPDIR=str(tmp), PATH=os.defpath),
        cwd=tmp_path,
        timeout=400,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [e for e in proc.stderr.splitlines() if e.startswith("pvisor: error:")]
    # the bad line, the missing agent, the pasted key and the two problems: one line each, naming the line
    assert [e.split(": ", 3)[2] for e in errors] == [f"{manifest} line {n}" for n in (5, 6, 7, 8)], errors
    assert "not JSON" in errors[0] and "agent" in errors[1]
    assert "boundary_user_prompt holds a key-shaped token (not shown)" in errors[2]
    # a line's problems in its keys, each a part of its own (before: --after-step, --agent-entrypoint, \x0a)
    assert errors[3].split(": ", 3)[3].startswith("after_step 99: "), errors[3]
    assert "; mini-swe-agent: " in errors[3] and "give entrypoint PATH" in errors[3], errors[3]
    assert "--" not in errors[3] and "\\x0a" not in errors[3], errors[3]
    assert proc.stderr.splitlines()[-1].startswith(f"4 of 8 rollouts ok from {manifest}")
    got = [json.loads(x) for x in rows.read_text().splitlines()]
    assert [r["line"] for r in got] == list(range(1, 9))
    assert got[7]["error"]["message"] == errors[3].split(": ", 3)[3]
    by = {r["name"]: r for r in got if r["name"]}
    ok = ["cont-mini", "cont-codex", "replay-codex", "handoff"]
    # the replays' own files are gone with their temporary directory: no row names one, and in TMPDIR
    # only the workspaces of the rollouts that ran (before: an empty pvisor-rollouts-*, a failed line's)
    assert sorted(p.name.rsplit("-", 1)[0] for p in tmp.iterdir()) == [
        f"pvisor-rollout-{n}" for n in sorted(ok)
    ]
    assert all(r["result"]["prefix"]["path"] is None for r in got[:4]), [r["result"]["prefix"] for r in got]
    assert [by[n]["status"] for n in ok] == ["ok"] * 4, [(n, by[n]["error"]) for n in ok]
    assert [by[n]["mode"] for n in ok] == ["continuation", "continuation", "replay-only", "handoff"]
    assert by["handoff"]["agent"] == "mini-swe-agent" and by["handoff"]["to_agent"] == "codex"
    for n in ("cont-mini", "cont-codex", "handoff"):
        assert by[n]["live_steps"] == 1 and by[n]["ended_by"] == "step_budget", by[n]
        assert (Path(by[n]["workspace"]) / "live.txt").exists()  # the start restored, the live step ran
    for n, cap, mode in [
        ("cont-mini", mini, "continuation"),
        ("cont-codex", codex, "continuation"),
        ("replay-codex", codex, "replay-only"),
        ("handoff", mini, "handoff"),
    ]:
        assert by[n]["result"]["derived_run"] == by[n]["derived_run"]
        with JournalReader(cap.journal) as r:
            run = r.run(by[n]["derived_run"])
        assert (run.mode, run.parent_run, run.boundary_step) == (mode, cap.run, 1)
    assert by["no-agent"]["status"] == "failed" and by["no-agent"]["error"]["code"] == "agent_unavailable"
    assert got[4]["error"]["code"] == "bad_manifest_line" and got[4]["name"] is None
    assert got[6]["error"]["code"] == "bad_manifest_line" and got[6]["name"] is None
    # the key_file's key reached the live side as Codex's credential, and nothing pvisor printed
    assert any(FILE_KEY in h.get("Authorization", "") for _, _, h, _ in proxy.requests), [
        h.get("Authorization") for _, _, h, _ in proxy.requests
    ]
    for key in SECRETS_SENT:
        assert key not in proc.stderr and key not in proc.stdout and key not in rows.read_text()
    # a key_file variable whose name and value look like no secret: the agent's alone, never recorded
    # (before: in the derived run's start environment)
    with JournalReader(codex.journal) as r:
        env = r.run_environment(by["cont-codex"]["derived_run"])
    assert env is not None and env["left_out"]["MODEL_ACCESS"] == "secret", env
    for f in codex.journal.parent.glob(codex.journal.name + "*"):
        assert PLAIN.encode() not in f.read_bytes(), f
    assert PLAIN not in rows.read_text()


def test_output_dirs_prepare_only_line_and_lines_read_without_side_effects(sources, tmp_path):
    codex = sources["codex"]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                line(codex, name="prefix", mode="prepare-only", agent="codex"),
                line(codex, name="gone", entrypoint=str(tmp_path / "missing" / "codex")),
                {**line(codex), "frobnicate": 1},
                {**line(codex, name="k"), LINE_KEY: 1},
                line(codex, name="bad-keys", key_file="keys.txt"),
            ]
        )
        + "\n"
    )
    read = list(read_rollouts(manifest, journal=None, default_mode=RolloutMode.REPLAY_ONLY))
    first = read[0][1]
    assert isinstance(first, RolloutLine) and pickle.loads(pickle.dumps(first)) == first
    assert read[1][1].mode is RolloutMode.REPLAY_ONLY and read[1][1].journal == codex.journal
    assert "unknown key 'frobnicate'" in str(read[2][1]) and LINE_KEY not in str(read[3][1])
    # a key file's line that is no NAME=VALUE pair is named by its number, never shown
    (tmp_path / "keys.txt").write_text(f"OPENAI_API_KEY={LINE_KEY}\n{LINE_KEY}\n")
    out = tmp_path / "out"
    proc = pvisor(
        ["replay", "--replay-only", "--batch", str(manifest), "--output", str(out)],
        env=user_env(tmp_path / "home"),
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in (out / "prefix").iterdir()) == [
        "prefix.json",
        "prefix.request.json",
        "result.json",
    ]
    failed = json.loads((out / "gone" / "result.json").read_text())
    assert failed["mode"] == "replay-only" and failed["errors"][0]["code"] == "agent_unavailable"
    assert proc.stderr.splitlines()[-1].startswith("1 of 5 rollouts ok")
    assert f"m.jsonl line 5: key_file {tmp_path / 'keys.txt'} line 2: expected NAME=VALUE" in proc.stderr
    assert LINE_KEY not in proc.stderr
    # the same as Parquet rows (the result as JSON text)
    import pyarrow.parquet as pq

    rows = tmp_path / "rows.parquet"
    proc = pvisor(
        ["replay", "--replay-only", "--batch", str(manifest), "--rows", str(rows)],
        env=user_env(tmp_path / "home"),
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    got = pq.read_table(rows).to_pylist()
    assert [r["status"] for r in got] == ["ok", "failed", "failed", "failed", "failed"]
    assert [r["error"]["code"] for r in got[1:]] == [
        "agent_unavailable", "bad_manifest_line", "bad_manifest_line", "bad_key_file"
    ]  # fmt: skip
    assert json.loads(got[0]["result"])["mode"] == "prepare-only"


DOCS = Path(__file__).resolve().parents[1] / "docs" / "result-protocol.md"


def test_the_docs_manifest_lines_are_rollouts(tmp_path):
    text = DOCS.read_text()
    section = text[text.index("## Rollouts from a manifest") : text.index("## The other modes")]
    example = section[section.index("```json\n") + 8 :]
    (tmp_path / "m.jsonl").write_text(example[: example.index("```")])
    read = [
        ln
        for _, ln in read_rollouts(tmp_path / "m.jsonl", journal=None, default_mode=RolloutMode.CONTINUATION)
    ]
    assert [ln.mode for ln in read] == [  # type: ignore[union-attr]
        RolloutMode.CONTINUATION, RolloutMode.CONTINUATION, RolloutMode.REPLAY_ONLY, RolloutMode.HANDOFF
    ]  # fmt: skip
    assert read[1].key_file == Path("/etc/pvisor/keys.env") and read[3].to_agent == "codex"  # type: ignore
    # a replay-only handoff takes a replay-only's options: no upstream
    bad = {"run": "r-1", "after_step": 1, "mode": "handoff", "to_agent": "codex", "replay_only": True}
    (tmp_path / "m.jsonl").write_text(json.dumps({**bad, "upstream": "http://127.0.0.1:9"}) + "\n")
    [(_, refused)] = read_rollouts(tmp_path / "m.jsonl", journal=None, default_mode=RolloutMode.CONTINUATION)
    assert "upstream is not for a replay-only handoff line" in str(refused)


def test_a_rollout_whose_process_is_killed_fails_its_row_alone(sources, tmp_path):
    codex, mini, exe = sources["codex"], sources["mini-swe-agent"], str(entrypoint("codex"))
    gate = tmp_path / "gate"
    held = gated_entrypoint(entrypoint("codex"), gate, tmp_path / "codex-held")
    manifest, rows = tmp_path / "m.jsonl", tmp_path / "rows.jsonl"
    manifest.write_text(
        json.dumps(line(codex, name="killed", entrypoint=str(held)))
        + "\n"
        # a handoff that ends the next agent at its request N+1 (as pvisor handoff --replay-only)
        + json.dumps(
            line(mini, name="kept", mode="handoff", to_agent="codex", replay_only=True, entrypoint=exe)
        )
        + "\n"
    )
    proc = start_batch(manifest, rows, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("gate.arrived.*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        [arrived] = tmp_path.glob("gate.arrived.*")
        # the rollout's process is the one that runs the agent's --version check
        worker = parent_of(int(arrived.name.rsplit(".", 1)[1]))
        os.kill(worker, signal.SIGKILL)
        (tmp_path / "gate.open").touch()
        _, err = proc.communicate(timeout=300)
    finally:
        (tmp_path / "gate.open").touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "Traceback" not in err, err
    got = {r["name"]: r for r in map(json.loads, rows.read_text().splitlines())}
    assert got["killed"]["status"] == "failed" and got["killed"]["error"]["code"] == "worker_died"
    assert "killed by signal 9" in got["killed"]["error"]["message"]
    kept = got["kept"]
    assert kept["status"] == "ok" and kept["derived_run"] and kept["live_steps"] == 0, kept["error"]
    assert kept["result"]["mode"] == "handoff" and kept["result"].get("continuation") is None
    assert kept["result"]["handoff"]["to_agent"] == "codex" and kept["to_agent"] == "codex"


def test_ctrl_c_stops_the_running_rollouts_and_the_batch_exits_130(sources, tmp_path):
    codex = sources["codex"]
    gate = tmp_path / "gate"
    held = gated_entrypoint(entrypoint("codex"), gate, tmp_path / "codex-held")
    manifest, rows = tmp_path / "m.jsonl", tmp_path / "rows.jsonl"
    manifest.write_text(
        "".join(json.dumps(line(codex, name=f"r{i}", entrypoint=str(held))) + "\n" for i in (1, 2))
    )
    proc = start_batch(manifest, rows, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("gate.arrived.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = [parent_of(int(p.name.rsplit(".", 1)[1])) for p in tmp_path.glob("gate.arrived.*")]
        proc.send_signal(signal.SIGINT)  # the batch's process alone: it stops its workers itself
        _, err = proc.communicate(timeout=120)
    finally:
        (tmp_path / "gate.open").touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted after 0 of 2 rollouts" in err.splitlines()[-1] and not rows.exists()
    assert all(wait_gone(pid, 30) for pid in workers)


@pytest.mark.parametrize(
    "extra, said",
    [
        ({"after_step": "1"}, "after_step: expected an integer, got a string"),
        ({"after_step": -1}, "after_step: expected a step number >= 0"),
        ({"mode": "sideways"}, "mode: expected one of prepare-only, replay-only, continuation, handoff"),
        ({"mode": "handoff"}, "a handoff line needs to_agent"),
        ({"to_agent": "codex"}, "to_agent is for a handoff line"),
        ({"mode": "replay-only", "max_steps": 2}, "max_steps is not for a replay-only line"),
        ({"trajectory": "t.jsonl"}, "give exactly one of trajectory and run"),
        ({"name": "../up"}, "one directory name, not a path"),
        ({"sandbox": "chroot"}, "sandbox: expected one of auto, bwrap, none"),
        ({"upstream": "ftp://x"}, "upstream: expected an http:// or https:// URL"),
        ({"agent": "nobody"}, "agent: not an agent pvisor knows"),
        ({"name": 3}, "name: expected a string, got an integer"),
        ({"timeout": "soon"}, "timeout: expected a number, got a string"),
        ({"name": ""}, "name is empty"),
    ],
)
def test_a_line_that_is_no_rollout_says_why(tmp_path, extra, said):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"run": "r-1", "after_step": 1, **extra}) + "\n")
    [(n, got)] = read_rollouts(manifest, journal=None, default_mode=RolloutMode.CONTINUATION)
    assert n == 1 and getattr(got, "code", None) == "bad_manifest_line" and said in str(got), got
    assert str(got).startswith(f"{manifest} line 1: ")


def test_two_lines_of_one_name_the_second_fails(tmp_path):
    manifest = tmp_path / "m.jsonl"
    lines = [{"run": "r-1", "after_step": 1, "name": "000002"}, {"run": "r-1", "after_step": 2}]
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))  # line 2's default name is 000002
    got = list(read_rollouts(manifest, journal=None, default_mode=RolloutMode.CONTINUATION))
    assert isinstance(got[0][1], RolloutLine) and "name '000002' is line 1's already" in str(got[1][1])


PASSWORD_URL = "http://user:s3cretpassw0rd@127.0.0.1:1"  # the gateway's forwarder cannot send it


def test_an_upstream_url_with_a_password_fails_its_line_never_shown(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"run": "r-1", "after_step": 1, "upstream": PASSWORD_URL}) + "\n")
    [(_, got)] = read_rollouts(manifest, journal=None, default_mode=RolloutMode.CONTINUATION)
    assert getattr(got, "code", None) == "bad_manifest_line", got
    assert "upstream: the URL holds user info" in str(got) and "s3cret" not in str(got)


REPLAYED = ["--run", "r-0123456789ab", "--after-step", "1", "--output", "o"]


@pytest.mark.parametrize(
    "command",
    [["replay", *REPLAYED], ["handoff", "--to-agent", "mini-swe-agent", *REPLAYED], ["run"]],
)
def test_a_single_replay_refuses_an_upstream_with_user_info_in_one_line(
    capsysbinary, monkeypatch, tmp_path, command
):
    """Before: accepted, and every live request was the gateway's internal ValueError (aiohttp
    combines no Authorization header with a URL's user info), blamed on the model."""
    monkeypatch.chdir(tmp_path)
    with Journal.open(tmp_path / "j.sqlite"):
        pass
    code, _, err = pvisor_in(
        capsysbinary, "--journal", "j.sqlite", *command, "--agent", "codex", "--upstream", PASSWORD_URL,
        "--workspace", "ws", *(["--", "a task"] if command == ["run"] else []),
    )  # fmt: skip
    said = [e for e in err.splitlines() if "--upstream" in e]
    assert code == 2 and said == [f"pvisor: error: --upstream http://127.0.0.1:1: {USERINFO_REFUSED}"], err
    assert "s3cret" not in err


def test_the_rows_table_gives_the_ended_by_values_the_tool_writes():
    """Before: ``agent_exit``, which no result holds (the agent's end is ``agent``)."""
    from pvisor.replay.agent_result import AgentRunEnd
    from pvisor.session.continuation_result import ContinuationEnd

    doc = (Path(__file__).parents[1] / "docs" / "result-protocol.md").read_text()
    [row] = [r for r in doc.splitlines() if r.startswith("| `ended_by` |")]
    said = set(re.findall(r"`([a-z_]+)`", row.split("|")[2]))
    assert said == {e.value for e in ContinuationEnd} | {e.value for e in AgentRunEnd}, row


def test_a_rows_message_names_the_line_keys_not_the_flags():
    from pvisor.replay.rollout_manifest import in_line_keys

    said = in_line_keys(
        "run r-1 was recorded with agent mini-swe-agent, not --agent codex; give --agent-entrypoint PATH, "
        "--to-agent, --max-steps 2 or --boundary-user-prompt; --output and --force stay"
    )
    assert said == (
        "run r-1 was recorded with agent mini-swe-agent, not agent codex; give entrypoint PATH, "
        "to_agent, max_steps 2 or boundary_user_prompt; --output and --force stay"
    )


def _bad_manifest(tmp_path: Path, **kw) -> Path:
    """A manifest whose one line is no rollout (nothing runs; its row is written)."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"run": "r-1", "after_step": 1, "mode": "sideways", **kw}) + "\n")
    return manifest


@pytest.mark.parametrize("prepare_only", [False, True])
def test_rows_naming_a_file_the_batch_reads_is_refused_and_the_file_kept(
    capsysbinary, monkeypatch, tmp_path, prepare_only
):
    """Before: ``--rows JOURNAL --force`` renamed the rows over the journal in use."""
    monkeypatch.chdir(tmp_path)
    with Journal.open(tmp_path / "j.sqlite"):
        pass
    (tmp_path / "keys.env").write_text("A=b\n")
    os.link(tmp_path / "keys.env", tmp_path / "keys-link.env")
    os.symlink("j.sqlite", tmp_path / "j-link")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"run": "r-1", "after_step": 1, "key_file": "keys.env"}) + "\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    mode = ["--prepare-only"] if prepare_only else []
    for rows in ("j.sqlite", "j.sqlite-wal", "j-link", *([] if prepare_only else ["keys-link.env"])):
        code, _, err = pvisor_in(
            capsysbinary, "--journal", "j.sqlite", "replay", *mode, "--batch", "m.jsonl", "--rows", rows,
            "--force",
        )  # fmt: skip
        assert code == 2 and len(err.splitlines()) == 1 and "which this command reads" in err, (rows, err)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    if prepare_only:
        return
    # an --output whose line directory holds the journal in use
    (tmp_path / "out" / "000001").mkdir(parents=True)
    with Journal.open(tmp_path / "out" / "000001" / "j.sqlite"):
        pass
    code, _, err = pvisor_in(
        capsysbinary, "--journal", "out/000001/j.sqlite", "replay", "--batch", "m.jsonl", "--output", "out",
        "--force",
    )  # fmt: skip
    assert code == 2 and "line 1's directory 000001 holds out/000001/j.sqlite" in err, err


@pytest.mark.parametrize("prepare_only", [False, True])
def test_rows_through_a_symlink_write_its_target_and_into_a_fifo_in_place(
    capsysbinary, monkeypatch, tmp_path, prepare_only
):
    """Before: the rows were renamed over the link (and, as root, over /dev/stdout)."""

    monkeypatch.chdir(tmp_path)
    _bad_manifest(tmp_path)
    (tmp_path / "target.jsonl").write_text("before\n")
    os.symlink("target.jsonl", tmp_path / "rows.jsonl")
    mode = ["--prepare-only"] if prepare_only else []
    code, _, err = pvisor_in(
        capsysbinary, "--journal", "j.sqlite", "replay", *mode, "--batch", "m.jsonl", "--rows", "rows.jsonl",
        "--force",
    )  # fmt: skip
    assert code == 1 and (tmp_path / "rows.jsonl").is_symlink(), err
    [row] = map(json.loads, (tmp_path / "target.jsonl").read_text().splitlines())
    assert row["error"]["code"] == "bad_manifest_line"
    os.mkfifo(tmp_path / "fifo")
    reader = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)  # open first: the writer never waits
    try:  # no --force: nothing is replaced
        code, _, err = pvisor_in(
            capsysbinary, "--journal", "j.sqlite", "replay", *mode, "--batch", "m.jsonl", "--rows", "fifo"
        )
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert code == 1 and (tmp_path / "fifo").is_fifo(), err
    assert json.loads(got)["error"]["code"] == "bad_manifest_line"


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid`` (/proc)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_sigterm_or_sigkill_to_the_batch_stops_its_workers_and_their_agents(sources, tmp_path, sig):
    """Before: the batch ended at once, its workers ran their agents on and wrote derived runs
    later, then printed BrokenPipeError tracebacks."""
    codex = sources["codex"]
    # the agent started for the rollout (unsandboxed: its pid in a file here) waits
    agent = tmp_path / "codex-sleeps"
    agent.write_text(
        f'#!/bin/bash\ncase "$1" in --version|--help) exec "{entrypoint("codex")}" "$@";; esac\n'
        f'echo $$ > "{tmp_path}/agent.$$"\nexec sleep 300\n'
    )
    agent.chmod(0o755)
    manifest, rows = tmp_path / "m.jsonl", tmp_path / "rows.jsonl"
    rollout = {"entrypoint": str(agent), "sandbox": "none"}
    manifest.write_text("".join(json.dumps(line(codex, name=f"r{i}", **rollout)) + "\n" for i in (1, 2)))
    proc = start_batch(manifest, rows, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("agent.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        agents = [int(p.name.split(".")[1]) for p in tmp_path.glob("agent.*")]
        workers = children_of(proc.pid)
        assert len(agents) == 2 and len(workers) >= 2, (agents, workers)
        proc.send_signal(sig)  # the batch's process alone, as `kill PID` does
        _, err = proc.communicate(timeout=120)  # its stderr: the workers' too, until they end
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err, err
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, err
        assert "interrupted by SIGTERM after 0 of 2 rollouts" in err.splitlines()[-1] and not rows.exists()
    assert all(wait_gone(pid, 30) for pid in workers + agents), [
        Path(f"/proc/{p}/cmdline").read_text() for p in workers + agents if not wait_gone(p, 0)
    ]


def test_a_key_file_that_is_a_fifo_huge_or_nul_separated_fails_at_once_never_shown(tmp_path):
    """Before: a FIFO blocked for ever (the line's timeout came later), /dev/zero was read
    until memory ran out (then internal_error with an empty message), and a NUL-separated file
    (/proc/self/environ) became one variable, the agent's start failing on 'embedded null byte'."""
    import threading

    from pvisor.session.rollouts import MAX_KEY_FILE_BYTES, read_key_file

    os.mkfifo(tmp_path / "fifo")
    huge = tmp_path / "huge.env"
    with open(huge, "wb") as f:
        f.truncate(MAX_KEY_FILE_BYTES + 1)  # sparse: nothing written
    (tmp_path / "nul.env").write_bytes(b"# keys\nA=b\nOPENAI_API_KEY=" + FILE_KEY.encode() + b"\0HOME=/x\n")
    said = {}

    def read(name: str) -> None:
        try:
            read_key_file(tmp_path / name)
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            said[name] = (getattr(exc, "code", None), str(exc))

    for name in ("fifo", "huge.env", "nul.env"):
        t = threading.Thread(target=read, args=(name,), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"{name}: still reading"
    assert said["fifo"] == ("bad_key_file", f"key_file {tmp_path / 'fifo'}: not a regular file")
    assert said["huge.env"] == ("bad_key_file", f"key_file {huge}: larger than 1048576 bytes")
    assert said["nul.env"] == (
        "bad_key_file",
        f"key_file {tmp_path / 'nul.env'} line 3: holds a NUL byte (not shown)",
    )


def test_ctrl_c_while_the_workers_start_prints_no_traceback(sources, tmp_path):
    """Before: a Ctrl-C (SIGINT to the terminal's process group) in a worker's start-up printed
    'Process pvisor-rollout-1: Traceback ... KeyboardInterrupt'."""
    codex = sources["codex"]
    manifest, rows = tmp_path / "m.jsonl", tmp_path / "rows.jsonl"
    manifest.write_text(
        "".join(
            json.dumps(line(codex, name=f"r{i}", entrypoint=str(entrypoint("codex")))) + "\n" for i in (1, 2)
        )
    )
    proc = start_batch(manifest, rows, tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(workers := children_of(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)  # the batch and its workers, as a terminal's Ctrl-C
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert all(wait_gone(pid, 30) for pid in workers)


def test_lines_sharing_a_workspace_or_working_in_an_output_directory_fail_naming_the_first(
    capsysbinary, monkeypatch, tmp_path
):
    """Before: two lines of one workspace ran at once in it (both ok, each seeing the other's
    files), and a workspace could be another line's OUT/<name>."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    os.symlink("ws", tmp_path / "ws-link")
    manifest = tmp_path / "m.jsonl"
    lines = [
        {"run": "r-1", "after_step": 1, "name": "a", "workspace": "ws"},
        {"run": "r-1", "after_step": 1, "name": "b", "workspace": "ws-link"},  # the same, through a link
        {"run": "r-1", "after_step": 1, "name": "c", "workspace": "ws/sub"},
        {"run": "r-1", "after_step": 1, "name": "d", "workspace": "."},
        {"run": "r-1", "after_step": 1, "name": "e", "workspace": "other"},
    ]
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = [str(x) for _, x in read_rollouts(manifest, journal=None, default_mode=RolloutMode.CONTINUATION)]
    assert got[1] == f"{manifest} line 2: workspace {tmp_path / 'ws-link'} is line 1's workspace"
    assert got[2].endswith(
        f"workspace {tmp_path / 'ws' / 'sub'} is inside line 1's workspace ({tmp_path / 'ws'})"
    )
    assert got[3].endswith(f"workspace {tmp_path} holds line 1's workspace ({tmp_path / 'ws'})"), got[3]
    assert "line 5" not in got[4]
    # a workspace in another line's OUT/<name>: that line fails, nothing runs (line 1 a prepare-only)
    manifest.write_text(
        json.dumps({"run": "r-1", "after_step": 1, "name": "a", "mode": "prepare-only", "agent": "codex"})
        + "\n"
        + json.dumps({"run": "r-1", "after_step": 1, "name": "b", "workspace": "out/a"})
        + "\n"
    )
    code, _, err = pvisor_in(
        capsysbinary, "--journal", "j.sqlite", "replay", "--batch", "m.jsonl", "--output", "out"
    )
    assert code == 1 and f"line 2: workspace {tmp_path / 'out' / 'a'} is line 1's output directory" in err, (
        err
    )


def sleeping_agent(tmp_path: Path, real: Path) -> Path:
    """An entrypoint that answers the version checks as ``real`` and, started for the rollout,
    writes its pid to ``tmp_path/agent.PID`` and sleeps (run it with sandbox none)."""
    agent = tmp_path / "sleeping-agent"
    agent.write_text(
        f'#!/bin/bash\ncase "$1" in --version|--help) exec "{real}" "$@";; esac\n'
        f'echo $$ > "{tmp_path}/agent.$$"\nexec sleep 300\n'
    )
    agent.chmod(0o755)
    return agent


def test_a_worker_killed_after_its_run_began_names_its_workspace_and_derived_run(sources, tmp_path):
    """Before: the worker_died row had derived_run and workspace null, though the journal held
    the rollout's (open) run and its pvisor-rollout-<name>-* directory stayed."""
    codex = sources["codex"]
    agent = sleeping_agent(tmp_path, entrypoint("codex"))
    manifest, rows = tmp_path / "m.jsonl", tmp_path / "rows.jsonl"
    manifest.write_text(json.dumps(line(codex, name="dies", entrypoint=str(agent), sandbox="none")) + "\n")
    proc = start_batch(manifest, rows, tmp_path)
    pid = None
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("agent.*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        [started] = tmp_path.glob("agent.*")
        pid = int(started.name.split(".")[1])
        os.kill(parent_of(pid), signal.SIGKILL)  # the worker
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1 and "Traceback" not in err, err
    [row] = map(json.loads, rows.read_text().splitlines())
    assert row["error"]["code"] == "worker_died" and Path(row["workspace"]).is_dir(), row
    with JournalReader(codex.journal) as r:
        run = r.run(row["derived_run"])
    assert run.parent_run == codex.run and run.labels["workspace"] == row["workspace"]


@pytest.mark.parametrize("k", ["0", "65", str(10**9)])
def test_a_concurrency_out_of_range_is_refused_before_anything_runs(capsysbinary, monkeypatch, tmp_path, k):
    """Before: --concurrency 1000000000 was accepted, without a cap."""
    monkeypatch.chdir(tmp_path)
    _bad_manifest(tmp_path)
    code, _, err = pvisor_in(
        capsysbinary, "--journal", "j.sqlite", "replay", "--batch", "m.jsonl", "--rows", "r.jsonl",
        "--concurrency", k,
    )  # fmt: skip
    assert code == 2 and err == f"pvisor: error: --concurrency {k}: expected 1 to 64 rollouts at once\n", err
    assert not (tmp_path / "r.jsonl").exists()


#: a caller of continue_many (spawn imports it again in each worker: the work under __main__)
CALLER = """
import sys
from pathlib import Path
from pvisor.session import continue_many

def workspace(i):
    ws = Path(sys.argv[1]) / f"ws{i}"
    ws.mkdir()
    return ws

if __name__ == "__main__":
    try:
        continue_many(sys.argv[2], 1, int(sys.argv[5]), workspace, "http://127.0.0.1:9",
                      journal=sys.argv[3], entrypoint=sys.argv[4], sandbox="none", timeout=300,
                      concurrency=2)
    except KeyboardInterrupt:
        sys.exit(130)
"""


@pytest.mark.parametrize("group", [False, True], ids=["sigterm-to-the-caller", "ctrl-c-to-the-group"])
def test_sigterm_to_a_continue_many_caller_stops_its_workers_and_their_agents(sources, tmp_path, group):
    """continue_many here (a process pool): before, a caller ended by SIGTERM left its workers
    and their agents running (300 s here); now each worker gets SIGTERM when its caller ends
    and stops its agent as a replay does, quietly. A Ctrl-C (SIGINT to the process group) with
    a third rollout queued: before, the caller waited for it to run to its end (300 s); now it
    never begins, and no worker prints a traceback."""
    codex = sources["codex"]
    agent = tmp_path / "codex-sleeps"  # as in the batch's SIGTERM test: its pid in a file here
    agent.write_text(
        f'#!/bin/bash\ncase "$1" in --version|--help) exec "{entrypoint("codex")}" "$@";; esac\n'
        f'echo $$ > "{tmp_path}/agent.$$"\nexec sleep 300\n'
    )
    agent.chmod(0o755)
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    python = str(Path(str(PVISOR)).with_name("python"))
    proc = subprocess.Popen(
        [
            python,
            str(script),
            str(tmp_path),
            codex.run,
            str(codex.journal),
            str(agent),
            "3" if group else "2",
        ],
        env=user_env(tmp_path / "home"),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("agent.*"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        agents = [int(p.name.split(".")[1]) for p in tmp_path.glob("agent.*")]
        workers = children_of(proc.pid)
        assert len(agents) == 2 and len(workers) >= 2, (agents, workers, proc.poll())
        if group:
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)  # its stderr: the workers' too, until they end
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err, err
    assert proc.returncode == (130 if group else -signal.SIGTERM), err
    assert len(list(tmp_path.glob("agent.*"))) == 2  # the queued rollout never began
    assert all(wait_gone(pid, 30) for pid in workers + agents), [
        Path(f"/proc/{p}/cmdline").read_text() for p in workers + agents if not wait_gone(p, 0)
    ]
