"""Rollouts on Ray (issue 42): :func:`pvisor.session.ray_rollouts.rollouts_on_ray` and ``pvisor
replay --batch MANIFEST --ray ADDRESS`` on a local Ray the test starts (two CPUs, no dashboard),
with the real agent CLIs offline: the session's scripted captures of mini-swe-agent and Codex
(tests/agent_captures.py) copied into a journal of the test's own (the caller's), continued,
replayed and handed over after step 1 against a scripted live model (``"main_chain":
"any-tools"``: several sessions on one server). Each worker runs in a private temporary root of
its own with the source run sent through Ray's object store; its derived runs come back merged
into the caller's journal. A worker killed mid-rollout fails its row alone and is not run again;
a line whose agent is missing fails alone. Nothing is mocked."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from agent_helpers import entrypoint, rollout_live_script
from aiohttp import web
from pvisor.journal.merge import merge_journals
from pvisor.journal.reader import JournalReader
from pvisor.replay.rollout_manifest import RolloutLine, RolloutMode, read_rollouts

pytestmark = pytest.mark.slow

#: a key planted in the driver's environment, and the one a line's key_file holds
ENV_KEY = "sk-test-Dr1v3rEnv9Lq2Wz7Xc"
FILE_KEY = "sk-test-K3yF1le4Mn8Bv6Tr"
SECRETS_SENT = [ENV_KEY, FILE_KEY]  # no piece of them in any journal, log or result.json (conftest)
#: how the killed line's worker is found: its private root's name (session/ray_rollouts.py)
ROOT_PREFIX = "pvisor-ray-"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray of two CPUs for the module: its GCS address. Its workers inherit this
    environment, with :data:`ENV_KEY` planted as OPENAI_API_KEY; the current directory is a
    temporary one (Ray puts the driver's directory first on its workers' path: the checkout's
    pvisor/ would shadow the install). HOME stays: Ray keeps its auth token under it, read once
    per process, and a second Ray of this process (tests/test_replay_ray.py) would read another."""
    import ray

    root = tmp_path_factory.mktemp("ray")
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(OPENAI_API_KEY=ENV_KEY, PYTHONSAFEPATH="1")
    os.chdir(root)
    try:
        # address "local": a new Ray, never one this machine runs already (ray start)
        ctx = ray.init(
            address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False
        )
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def caller_journal(tmp: Path, *caps) -> Path:
    """A journal of the test's own holding the captures' runs alone: the session's journals are
    shared, and other modules' replays of the same runs are in them (their derived runs counted
    as this test's made the stop test fail in the full suite: 4 continuations where it made 2)."""
    journal = tmp / "caller" / "journal.sqlite"
    journal.parent.mkdir()
    merge_journals([c.journal for c in caps], journal, runs={c.run for c in caps})
    return journal


def manifest_lines(path: Path, lines: list[dict], journal: Path) -> list[RolloutLine]:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = list(read_rollouts(path, journal=journal, default_mode=RolloutMode.CONTINUATION))
    assert all(isinstance(x, RolloutLine) for _, x in got), got
    return [x for _, x in got]


class Hanging:
    """A live upstream that holds every request until :meth:`release` (then 503): the killed
    rollout is mid-rollout while it waits. ``requests``: what arrived (a retry would ask again)."""

    def __init__(self, stack) -> None:
        self.released = threading.Event()
        self.up = stack.raw_upstream(self.hang)
        self.url = self.up.url

    async def hang(self, request):
        for _ in range(2400):
            if self.released.is_set():
                break
            await asyncio.sleep(0.1)
        return web.Response(status=503, text="released")

    @property
    def requests(self) -> list:
        return self.up.requests

    def release(self) -> None:
        self.released.set()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def worker_running(index: int) -> tuple[int, Path] | None:
    """(pid, private root) of the Ray worker (``ray::...``) whose rollout of line ``index`` is
    running: an ancestor of a process whose current directory or an open file lies in its
    private root."""
    mark = f"/{ROOT_PREFIX}{index}-"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            paths = [os.readlink(entry / "cwd")] + [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        inside = [p for p in paths if mark in p]
        if not inside:
            continue
        head, _, rest = inside[0].partition(mark)
        root = Path(head + mark + rest.split("/", 1)[0])
        pid = int(entry.name)
        try:
            while pid > 1:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"):
                    return pid, root
                pid = _ppid(pid)
        except OSError:
            continue
    return None


def kill_when_live(index: int, live: Hanging, killed: list) -> None:
    """SIGKILL line ``index``'s worker once its request N+1 reached the live side (mid-rollout);
    ``killed`` gets (pid, its private root)."""
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not killed:
        if live.requests:
            found = worker_running(index)
            if found is not None:
                os.kill(found[0], signal.SIGKILL)
                killed.append(found)
                return
        time.sleep(0.2)


def test_a_batch_on_ray_merges_every_derived_run_and_fails_a_killed_worker_alone(
    captured, stack, ray_cluster, tmp_path
):
    from pvisor.session.ray_rollouts import remove_dead_roots, rollouts_on_ray

    address = ray_cluster
    mini, codex = captured("mini-swe-agent"), captured("codex")
    journal = caller_journal(tmp_path, mini, codex)
    live = stack.scripted(rollout_live_script(5))
    hanging = Hanging(stack)
    exe = {a: str(entrypoint(a)) for a in ("mini-swe-agent", "codex")}
    keys = tmp_path / "keys.txt"
    keys.write_text(f"OPENAI_API_KEY={FILE_KEY}\n")
    # mini-swe-agent's own trajectory file of the capture: a native source, sent as its bytes
    native = tmp_path / "native" / "mini-swe-agent.traj.json"
    native.parent.mkdir()
    native.write_bytes((Path(mini.report["run_dir"]) / native.name).read_bytes())
    lines = manifest_lines(
        tmp_path / "m.jsonl",
        [
            {
                "run": mini.run,
                "after_step": 1,
                "name": "killed",
                "upstream": hanging.url,
                "max_steps": 1,
                "entrypoint": exe["mini-swe-agent"],
                "timeout": 300,
            },
            {
                "run": mini.run,
                "after_step": 1,
                "name": "cont-mini",
                "upstream": live,
                "max_steps": 1,
                "entrypoint": exe["mini-swe-agent"],
                "timeout": 240,
            },
            {
                "run": codex.run,
                "after_step": 1,
                "name": "cont-codex",
                "upstream": live,
                "max_steps": 1,
                "entrypoint": exe["codex"],
                "key_file": str(keys),
                "timeout": 240,
            },
            {
                "run": codex.run,
                "after_step": 1,
                "name": "replay-codex",
                "mode": "replay-only",
                "entrypoint": exe["codex"],
                "timeout": 240,
            },
            {
                "run": mini.run,
                "after_step": 1,
                "name": "handoff",
                "mode": "handoff",
                "to_agent": "codex",
                "upstream": live,
                "max_steps": 1,
                "entrypoint": exe["codex"],
                "timeout": 240,
            },
            {  # a run the journal does not hold: the row a local rollout has for it
                "run": "r-000000000000",
                "agent": "codex",
                "after_step": 1,
                "name": "no-run",
                "mode": "replay-only",
            },
            {
                "run": codex.run,
                "after_step": 1,
                "name": "no-agent",
                "mode": "replay-only",
                "entrypoint": str(tmp_path / "missing" / "codex"),
            },
            {
                "trajectory": str(native),
                "agent": "mini-swe-agent",
                "after_step": 1,
                "name": "native",
                "mode": "replay-only",
                "entrypoint": exe["mini-swe-agent"],
                "timeout": 240,
            },
        ],
        journal,
    )
    with JournalReader(journal) as r:
        before = {run.id for run in r.runs()}
    killed: list[tuple[int, Path]] = []
    killer = threading.Thread(target=kill_when_live, args=(1, hanging, killed), daemon=True)
    killer.start()
    out = tmp_path / "out"
    try:
        rows = list(rollouts_on_ray(address, lines, journal=journal, output_root=out))
    finally:
        hanging.release()
        killer.join(5)
        swept = remove_dead_roots(Path(tempfile.gettempdir()))
        for _, root in killed:  # what the killed worker could not remove (a later task may have)
            assert not root.exists() or root in swept, root
            shutil.rmtree(root, ignore_errors=True)
    by = {row.name: row for row in rows}
    assert sorted(row.line for row in rows) == [1, 2, 3, 4, 5, 6, 7, 8]
    ok = ["cont-mini", "cont-codex", "replay-codex", "handoff", "native"]
    assert [by[n].status for n in ok] == ["ok"] * 5, [(n, by[n].error_code, by[n].error_message) for n in ok]
    # the killed worker: its row alone failed, with what Ray said, and it never asked again
    assert killed, "the killed line's worker was never found running"
    k = by["killed"]
    assert k.status == "failed" and k.error_code == "worker_died", (k.error_code, k.error_message)
    assert "\n" not in k.error_message and "died" in k.error_message
    assert len(hanging.requests) == 1, "the killed rollout ran again"
    assert by["no-agent"].status == "failed" and by["no-agent"].error_code == "agent_unavailable"
    no_run = by["no-run"]
    assert (no_run.status, no_run.error_code) == ("failed", "usage"), no_run
    assert "r-000000000000" in no_run.error_message and "merged" not in no_run.error_message
    # every derived run is in the caller's journal with its lineage; nothing of the killed line
    with JournalReader(journal) as r:
        new = {run.id: run for run in r.runs()}
    for n, cap, mode in [
        ("cont-mini", mini, "continuation"),
        ("cont-codex", codex, "continuation"),
        ("replay-codex", codex, "replay-only"),
        ("handoff", mini, "handoff"),
    ]:
        run = new[by[n].derived_run]
        assert (run.mode, run.parent_run, run.boundary_step) == (mode, cap.run, 1), n
        assert json.loads((out / n / "result.json").read_text())["derived_run"] == by[n].derived_run
        assert (out / n / "prefix.json").is_file()
    run = new[by["native"].derived_run]  # a native source's run: no parent in any journal
    assert run.mode == "replay-only" and run.parent_run is None
    assert by["native"].result["source"]["kind"] == "native"
    added = {i: run for i, run in new.items() if i not in before}
    assert {by[n].derived_run for n in ok} <= set(added)
    assert [i for i, run in added.items() if run.parent_run == mini.run and run.mode == "continuation"] == [
        by["cont-mini"].derived_run
    ]
    # each worker read a journal of its own, in a private root of its own, gone since
    sources = [Path(by[n].result["source"]["path"]) for n in ok]
    assert len(set(sources)) == 5 and journal not in sources and native not in sources
    for n, src in zip(ok, sources):
        root = src.parent.parent if n == "native" else src.parent  # the file: ROOT/source/NAME
        assert root.name.startswith(f"{ROOT_PREFIX}{by[n].line}-") and not root.exists()
        assert not str(src).startswith(str(tmp_path))
    for n in ("cont-mini", "cont-codex", "handoff"):
        assert by[n].live_steps == 1 and by[n].ended_by == "step_budget", by[n]
    for key in SECRETS_SENT:
        assert key not in json.dumps([row.as_dict() for row in rows])


def test_a_task_carries_no_key_and_no_path_of_the_callers(captured, tmp_path, monkeypatch):
    """What a task is given (:func:`~pvisor.session.ray_rollouts.source_of`, sent by
    :func:`rollouts_on_ray` as it is): the line without the caller's paths, the source run as
    bytes; no key of the driver's environment nor of the line's key_file, no runtime_env."""
    from pvisor.session.ray_rollouts import TASK_OPTIONS, source_of
    from ray import cloudpickle

    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    mini = captured("mini-swe-agent")
    journal = caller_journal(tmp_path, mini)
    keys = tmp_path / "keys.txt"
    keys.write_text(f"OPENAI_API_KEY={FILE_KEY}\n")
    (line,) = manifest_lines(
        tmp_path / "m.jsonl",
        [{"run": mini.run, "after_step": 1, "upstream": "http://127.0.0.1:9", "key_file": str(keys)}],
        journal,
    )
    (tmp_path / "work").mkdir()
    spec, blob, native = source_of(line, journal, tmp_path / "work")
    sent = cloudpickle.dumps(spec) + pickle.dumps(TASK_OPTIONS)
    assert blob is not None and native is None and spec.source_runs == (mini.run,)
    for key in SECRETS_SENT:
        assert key.encode() not in sent and key.encode() not in blob
    assert str(journal).encode() not in sent and str(journal.parent).encode() not in sent
    assert spec.line.journal is None and spec.line.key_file == keys  # read on the worker
    assert set(TASK_OPTIONS) == {"num_cpus", "max_retries", "retry_exceptions"}
    assert TASK_OPTIONS["max_retries"] == 0 and TASK_OPTIONS["retry_exceptions"] is False
    with JournalReader(mini.journal) as a:
        assert [r.id for r in a.runs() if r.id == mini.run]
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(blob)
    with JournalReader(copy) as r:
        assert [run.id for run in r.runs()] == [mini.run] and r.snapshots(mini.run)


def test_the_batch_command_runs_rollouts_on_a_ray_it_joins(captured, ray_cluster, tmp_path):
    address = ray_cluster
    mini = captured("mini-swe-agent")
    journal = caller_journal(tmp_path, mini)
    manifest = tmp_path / "m.jsonl"
    # line 1 names its journal: its run is read and its derived run merged there, as a local
    # rollout's; line 2 reads the batch's --journal
    batch_journal = tmp_path / "batch.sqlite"
    merge_journals([journal], batch_journal)
    manifest.write_text(
        json.dumps({"run": mini.run, "journal": str(journal), "after_step": 1, "name": "again",
                    "mode": "replay-only", "entrypoint": str(entrypoint("mini-swe-agent")), "timeout": 240})
        + "\n" + json.dumps({"run": mini.run, "after_step": 1, "name": "gone", "mode": "replay-only",
                              "entrypoint": str(tmp_path / "missing" / "mini")}) + "\n"
    )  # fmt: skip
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("pvisor")), "--journal", str(batch_journal), "replay", "--batch",
         str(manifest), "--ray", address, "--output", str(out)],
        capture_output=True, text=True, timeout=400, cwd=tmp_path, env=dict(os.environ),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [e for e in proc.stderr.splitlines() if e.startswith("pvisor: error:")]
    assert len(errors) == 1 and "line 2" in errors[0], proc.stderr
    assert "1 of 2 rollouts ok" in proc.stderr.splitlines()[-1], proc.stderr
    doc = json.loads((out / "again" / "result.json").read_text())
    assert doc["status"] == "ok" and doc["mode"] == "replay-only"
    with JournalReader(journal) as r:
        run = r.run(doc["derived_run"])
    assert (run.parent_run, run.mode) == (mini.run, "replay-only")
    with JournalReader(batch_journal) as r:
        assert not r.run_exists(doc["derived_run"])


def test_continue_many_on_ray_gives_k_derived_runs_in_the_callers_journal(
    captured, stack, ray_cluster, tmp_path
):
    from pvisor.core.errors import UsageError
    from pvisor.session import continue_many

    address = ray_cluster
    mini = captured("mini-swe-agent")
    journal = caller_journal(tmp_path, mini)
    live = stack.scripted(rollout_live_script(5))
    common = dict(journal=journal, entrypoint=str(entrypoint("mini-swe-agent")), max_steps=1, timeout=240)
    # as the command line refuses --ray "" and --concurrency with --ray, naming ray=, not --ray
    with pytest.raises(UsageError, match=r"^ray='': give an address \(local, auto") as raised:
        continue_many(mini.run, 1, 2, None, live, ray="", **common)
    assert raised.value.exit_code == 2
    with pytest.raises(UsageError, match="^concurrency= is for rollouts here: with ray="):
        continue_many(mini.run, 1, 2, None, live, ray=address, concurrency=4, **common)
    with pytest.raises(UsageError, match="environment= with ray="):
        continue_many(
            mini.run, 1, 2, None, live, ray=address, environment={"OPENAI_API_KEY": ENV_KEY}, **common
        )
    results = continue_many(mini.run, 1, 2, None, live, ray=address, output_root=tmp_path / "out", **common)
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert [r.output for r in results] == [tmp_path / "out" / f"rollout-{i}" for i in range(2)]
    assert all(r.ended_by == "step_budget" and r.live_steps == 1 and r.prefix.is_file() for r in results)
    assert len({r.derived_run for r in results}) == 2
    with JournalReader(journal) as r:
        assert all(r.run(x.derived_run).parent_run == mini.run for x in results)


def test_what_ray_raises_is_a_code_and_one_line(ray_cluster):
    import ray
    from pvisor.session.ray_rollouts import RayFailure, in_our_words, ray_failure

    def boom():
        raise ValueError("no such thing\n  at its second line")

    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(ray.remote(max_retries=0)(boom).remote())
    assert ray_failure(raised.value) == (RayFailure.TASK_FAILED, "ValueError: no such thing")
    e = ray.exceptions
    assert ray_failure(e.WorkerCrashedError())[0] is RayFailure.WORKER_DIED
    assert ray_failure(e.ObjectLostError("ab" * 14, "", ""))[0] is RayFailure.OBJECT_LOST
    assert ray_failure(e.TaskCancelledError())[0] is RayFailure.CANCELLED
    failure, message = ray_failure(e.GetTimeoutError("x" * 1000))
    assert failure is RayFailure.RAY_UNAVAILABLE and len(message) == 300 and "\n" not in message
    # Ray's advice (its own --address flag) in pvisor's words: --ray ADDRESS, ray=ADDRESS in Python
    said = ConnectionError(
        "Could not find any running Ray instance. Please specify the one to connect to by setting "
        "`--address` flag or `RAY_ADDRESS` environment variable.\nmore"
    )
    assert in_our_words(said) == (
        "Could not find any running Ray instance. Please specify the one to connect to by giving "
        "--ray ADDRESS (or setting RAY_ADDRESS)."
    )
    assert "giving ray=ADDRESS (or setting RAY_ADDRESS)" in in_our_words(said, "ray='auto'")


def test_an_address_that_takes_no_connection_is_exit_69_and_concurrency_is_refused(tmp_path):
    manifest = tmp_path / "m.jsonl"
    # lines that fail before Ray is needed never start (nor join) one: each its row, exit 1
    manifest.write_text(json.dumps({"run": "r-0123456789ab", "after_step": 1, "mode": "replay-only"}) + "\n")
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("pvisor")), "--journal", str(tmp_path / "j.sqlite"), "replay",
         "--batch", str(manifest), "--ray", "127.0.0.1:9", "--rows", str(tmp_path / "failed.jsonl")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1 and "cannot connect" not in proc.stderr, proc.stderr
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("pvisor")), "replay", "--batch", str(manifest), "--ray", "local"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "pvisor: error: --batch needs one of --output OUT (a directory per line) or --rows FILE"
    ]
    assert json.loads((tmp_path / "failed.jsonl").read_text())["error"]["code"] == "usage"
    native = tmp_path / "t.traj.json"
    native.write_text("{}")
    manifest.write_text(
        json.dumps(
            {"trajectory": str(native), "agent": "mini-swe-agent", "after_step": 1, "mode": "replay-only"}
        )
        + "\n"
    )
    for address in ("127.0.0.1:9", "ray://127.0.0.1:9"):  # Ray itself would retry it for minutes
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("pvisor")), "--journal", str(tmp_path / "j.sqlite"), "replay",
             "--batch", str(manifest), "--ray", address, "--rows", str(tmp_path / "rows.jsonl")],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == 69, proc.stderr
        assert proc.stderr.splitlines() == [
            f"pvisor: error: --ray {address}: cannot connect to Ray: 127.0.0.1:9 takes no connection: "
            "Connection refused"
        ]
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("pvisor")), "replay", "--batch", str(manifest), "--ray", "local",
         "--concurrency", "2", "--rows", str(tmp_path / "rows.jsonl")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "pvisor: error: --concurrency is for rollouts here: on --ray each rollout takes one CPU of the "
        "cluster"
    ]


def test_continue_many_on_ray_refuses_a_key_in_its_values_before_anything_is_sent(tmp_path):
    """A key-shaped value or a URL with user info in continue_many(ray=)'s keywords is refused
    (UsageError, the value never shown) as a manifest line's is, before Ray is asked anything:
    the address takes no connection, which would be UnavailableError had anything been sent."""
    from pvisor.core.errors import UsageError
    from pvisor.session import continue_many

    common = dict(journal=tmp_path / "j.sqlite", ray="127.0.0.1:9")
    cases = [
        ({"upstream": "https://user:hunter2@127.0.0.1:9/"}, "upstream: the URL holds user info"),
        ({"upstream": f"https://user:{ENV_KEY}@127.0.0.1:9/"}, "upstream holds a key-shaped token"),
        ({"upstream": "http://127.0.0.1:9", "boundary_user_prompt": f"use {FILE_KEY} please"},
         "boundary_user_prompt holds a key-shaped token"),
        ({"upstream": "http://127.0.0.1:9", "key_file": tmp_path / FILE_KEY}, "key_file holds a key-shaped"),
    ]  # fmt: skip
    for given, said in cases:
        with pytest.raises(UsageError) as raised:
            continue_many("r-0123456789ab", 1, 2, None, **given, **common)
        assert raised.value.message.startswith(f"continue_many with ray=: {said}"), raised.value.message
        assert not [x for x in (ENV_KEY, FILE_KEY, "hunter2") if x in raised.value.message]
    with pytest.raises(UsageError, match="workspace_factory holds a key-shaped"):
        continue_many("r-0123456789ab", 1, 1, lambda i: tmp_path / FILE_KEY, "http://127.0.0.1:9", **common)


def _row_of(line: RolloutLine, derived: str):
    from pvisor.session.rollouts import RolloutRow

    return RolloutRow(line=line.index, name=line.name, mode=line.mode.value, status="ok", derived_run=derived,
                      result={"derived_run": derived, "warnings": []})  # fmt: skip


def test_a_derived_run_the_journal_cannot_take_is_kept_and_a_missing_parent_is_a_warning(
    ray_cluster, tmp_path
):
    """What the driver does with a finished task (``collect_row``, a TaskResult through the object
    store): the output files are written first, whatever the merge does; a merge that fails
    (the caller's journal replaced by a non-journal mid-batch) keeps the derived runs in
    ``JOURNAL.line-<N>.derived.sqlite`` beside the journal, and the row's message
    names it with the command that finishes the merge, which does; a caller's journal deleted
    mid-batch takes the run with a warning that its parent is not there."""
    import ray
    from pvisor.journal.model import Run
    from pvisor.journal.writer import Journal
    from pvisor.session.ray_rollouts import TaskResult, collect_row

    journal, derived = tmp_path / "caller.sqlite", tmp_path / "derived.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-source000001", agent="codex"))
    with Journal.open(derived) as j:
        j.create_run(Run(id="r-derived00001", agent="codex", parent_run="r-source000001", boundary_step=1,
                         mode="continuation"))  # fmt: skip
        j.record_exchange("r-derived00001", "POST", "/v1/chat/completions", [], protocol="openai-chat",
                          status=200, request_body=b'{"model": "m"}', response_body=b"{}")  # fmt: skip
    merge_journals([derived], tmp_path / "whole.sqlite")  # the bytes a worker sends: one file, no -wal
    data = (tmp_path / "whole.sqlite").read_bytes()
    line = RolloutLine(index=1, name="one", mode=RolloutMode.CONTINUATION, agent="codex", to_agent=None,
                       run="r-source000001", trajectory=None, journal=None, after_step=1)  # fmt: skip
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    sent = TaskResult(_row_of(line, "r-derived00001"), {"result.json": b"{}"}, data, ("r-derived00001",), "w")
    saved = journal.read_bytes()
    journal.write_bytes(b"not a journal")  # replaced mid-batch
    row = collect_row(ray, ray.put(sent), line, journal, out, work)
    kept = tmp_path / "caller.sqlite.line-1.derived.sqlite"
    assert row.status == "failed" and (out / "one" / "result.json").read_bytes() == b"{}"
    assert kept.is_file() and f"pvisor journal merge {kept} --into {journal}" in row.error_message, row
    journal.write_bytes(saved)
    done = subprocess.run([str(Path(sys.executable).with_name("pvisor")), "journal", "merge", str(kept),
                           "--into", str(journal)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with JournalReader(journal) as r:
        assert r.run("r-derived00001").parent_run == "r-source000001"
    journal.write_bytes(b"not a journal")
    row = collect_row(ray, ray.put(sent), line, journal, None, work)  # that name taken: another beside it
    (again,) = set(tmp_path.glob("caller.sqlite.line-1.derived-*.sqlite"))
    assert f"pvisor journal merge {again} --into {journal}" in row.error_message
    journal.unlink()  # deleted mid-batch: a new journal takes the run, whose parent is not there
    row = collect_row(ray, ray.put(sent), line, journal, out, work)
    assert row.status == "ok" and [w["code"] for w in row.result["warnings"]] == ["parent_not_in_journal"]
    assert "r-source000001" in row.result["warnings"][0]["message"]


def test_sources_are_put_as_their_lines_turn_comes_and_rows_come_as_tasks_end(
    captured, ray_cluster, tmp_path
):
    """At most twice the cluster's CPUs (4 here) are submitted at a time: line 5's journal is
    made only once the first row came back, and its line reads it then (every source put
    before any task was waited on found none). Each line fails on its worker, at once: no agent."""
    from pvisor.session.ray_rollouts import rollouts_on_ray, window_of

    import ray

    assert window_of(ray) == 4
    mini = captured("mini-swe-agent")
    journal = caller_journal(tmp_path, mini)
    later = tmp_path / "later.sqlite"
    gone = str(tmp_path / "missing" / "mini")
    lines = manifest_lines(
        tmp_path / "m.jsonl",
        [{"run": mini.run, "after_step": 1, "mode": "replay-only", "name": f"l{i}", "entrypoint": gone,
          **({"journal": str(later)} if i == 5 else {})} for i in range(1, 6)],
        journal,
    )  # fmt: skip
    rows = []
    for row in rollouts_on_ray(ray_cluster, lines, journal=journal, output_root=None):
        if not rows:
            shutil.copyfile(journal, later)
        rows.append(row)
    assert sorted(r.line for r in rows) == [1, 2, 3, 4, 5]
    assert {r.error_code for r in rows} == {"agent_unavailable"}, [(r.line, r.error_message) for r in rows]


def _roots() -> set[str]:
    """The workers' private roots in this machine's temporary directory (a local Ray's workers),
    named as this pvisor names them (line, token, pid: another checkout's tests may run too)."""
    import re

    named = re.compile(ROOT_PREFIX + r"\d+-[0-9a-f]{8}-[0-9a-f]{8}-\d+-")
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*") if named.match(p.name)}


def test_a_stopped_batch_on_ray_keeps_its_interrupted_runs_and_leaves_no_root(
    captured, stack, ray_cluster, tmp_path
):
    """Ctrl-C (SIGINT to the driver), then SIGTERM: the two running rollouts (of the fixture's
    two CPUs) are stopped as a replay is (the agent ended, the derived run ended interrupted)
    and their runs merged into the caller's journal, the third (queued) cancelled; the
    workers' private roots removed; exit 130 / 143 with one line (no Ray stack dump) naming the
    runs kept."""
    mini = captured("mini-swe-agent")
    journal = caller_journal(tmp_path, mini)
    hanging = Hanging(stack)
    manifest = tmp_path / "m.jsonl"
    line = {"run": mini.run, "after_step": 1, "upstream": hanging.url, "max_steps": 1,
            "entrypoint": str(entrypoint("mini-swe-agent")), "timeout": 300}  # fmt: skip
    before = _roots()
    seen = 0  # requests N+1 that reached the live side, so far
    try:
        # SIGINT: two running and one queued; SIGTERM: one running
        for sig, count, running in ((signal.SIGINT, 3, 2), (signal.SIGTERM, 1, 1)):
            manifest.write_text(
                "".join(json.dumps({**line, "name": f"held-{i}"}) + "\n" for i in range(count))
            )
            seen += running
            argv = [
                str(Path(sys.executable).with_name("pvisor")),
                "--journal",
                str(journal),
                "replay",
                "--batch",
                str(manifest),
                "--ray",
                ray_cluster,
                "--rows",
                str(tmp_path / "rows.jsonl"),
            ]
            pipe = subprocess.PIPE
            proc = subprocess.Popen(
                argv, stdout=pipe, stderr=pipe, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 200
            while len(hanging.requests) < seen and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert len(hanging.requests) == seen, proc.communicate(timeout=60)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 128 + sig, err
            lines = err.splitlines()
            assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err, err
            with JournalReader(journal) as r:
                derived = [x for x in r.runs() if x.parent_run == mini.run and x.mode == "continuation"]
                assert len(derived) == seen, [x.id for x in r.runs()]
                attempts = [r.attempts(x.id)[-1] for x in derived[-running:]]
            assert all(x.id in lines[0] for x in derived[-running:]) and "kept" in lines[0], lines[0]
            assert "not brought back" not in lines[0], lines[0]
            for attempt in attempts:
                assert attempt.ended_ms is not None and attempt.labels.get("interrupted") == "SIGINT", attempt
            assert _roots() <= before, _roots() - before
            assert not (tmp_path / "rows.jsonl").exists()
    finally:
        hanging.release()
