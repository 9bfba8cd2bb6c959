"""Workspace snapshots taken by the gateway (gateway/snapshots.py): a walk when a candidate
main-loop request arrives, the answer's first byte held until it is done, content-addressed
blobs in the journal. Real gateway on 127.0.0.1, real client, real journal; a driver of the
tests' own (the plug-in interface) makes a walk wait on a gate, so ordering is checked without
clocks."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson
from gateway_helpers import DEADLINE, http_request, poll
from pvisor.gateway.responder import Serve, ServedBy
from pvisor.journal.reader import JournalReader
from pvisor.journal.snapshots import EntryKind, FilesystemDriver, SnapshotKind

BODY = b'{"id":"msg_1","type":"message","role":"assistant","content":[]}'


class Answer:
    async def respond(self, request):
        return Serve(200, [("Content-Type", "application/json")], body=BODY, served_by=ServedBy.PLAYBACK)


def old(path: Path) -> None:
    """Date a file two minutes back: older than the racy window, so a later walk may trust it."""
    t = time.time() - 120
    os.utime(path, (t, t), follow_symlinks=False)


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("print('a')\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(ws / "run.sh", 0o755)
    os.symlink("src/a.py", ws / "link")
    for p in (ws / "src" / "a.py", ws / "run.sh"):
        old(p)
    return ws


def snapshots(gw, run=None):
    with JournalReader(gw.journal_path) as r:
        snaps = r.snapshots(run or gw.run)
        return snaps, [r.manifest(s) if s.digest else None for s in snaps]


def test_a_request_gets_a_snapshot_of_the_workspace_bound_to_its_exchange(stack, tmp_path):
    ws = workspace(tmp_path)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    status, _, got = http_request(gw.url, "POST", "/v1/messages", b'{"model":"m","messages":[]}')
    assert (status, got) == (200, BODY)
    stack.drain(gw)
    [snap], [manifest] = snapshots(gw)
    with JournalReader(gw.journal_path) as r:
        [ex] = r.exchanges(gw.run)
        assert r.blob(next(e.sha256 for e in manifest.entries if e.path == "src/a.py")) == b"print('a')\n"
    assert (snap.kind, snap.exchange, snap.driver, snap.error) == (
        SnapshotKind.REQUEST,
        ex.id,
        "filesystem",
        None,
    )
    assert snap.hold_us is not None and snap.hold_us >= 0
    by_path = {e.path: e for e in manifest.entries}
    assert by_path["run.sh"].mode == 0o755 and by_path["link"].kind is EntryKind.SYMLINK
    assert by_path["link"].target == "src/a.py" and by_path["src"].kind is EntryKind.DIR
    assert (snap.files, snap.bytes) == (2, len("print('a')\n") + len("#!/bin/sh\necho hi\n"))


def test_a_token_count_and_a_get_take_no_snapshot(stack, tmp_path):
    gw = stack.gateway({}, responder=Answer(), workspace=workspace(tmp_path))
    http_request(gw.url, "POST", "/v1/messages/count_tokens", b"{}")
    http_request(gw.url, "GET", "/v1/models")
    stack.drain(gw)
    assert snapshots(gw)[0] == []


def test_the_first_byte_of_the_answer_waits_for_the_walk(stack, tmp_path):
    ws = workspace(tmp_path)
    release = threading.Event()
    walked: list[float] = []

    class Slow(FilesystemDriver):
        def checkpoint(self, root, put):
            release.wait(DEADLINE)
            manifest = super().checkpoint(root, put)
            walked.append(time.monotonic())
            return manifest

    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    gw.gateway.snapshots.driver = Slow()
    got: list[tuple[int, float]] = []

    def client():
        status, _, _ = http_request(gw.url, "POST", "/v1/messages", b"{}")
        got.append((status, time.monotonic()))

    t = threading.Thread(target=client)
    t.start()
    # the request arrived and was answered by the responder; the walk is blocked, so is the answer
    poll(lambda: gw.gateway._inflight and True, "the request in flight")
    assert not got
    release.set()
    t.join(DEADLINE)
    assert got and got[0][0] == 200 and walked and got[0][1] >= walked[0]


def test_unchanged_files_are_not_read_again_and_cost_nothing(stack, tmp_path):
    ws = workspace(tmp_path)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    # a file is trusted unread once its change is older than the racy window: none here
    gw.gateway.snapshots.driver = FilesystemDriver(racy_ns=0)
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    stack.drain(gw)
    blobs_before = _count_blobs(gw.journal_path)
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    (ws / "src" / "b.py").write_text("new file\n")
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    stack.drain(gw)
    (first, second, third), manifests = snapshots(gw)
    assert first.read_bytes > 0 and second.read_bytes == 0
    assert second.digest == first.digest  # one manifest for an unchanged tree
    assert _count_blobs(gw.journal_path) == blobs_before + 2  # the new file and the new manifest
    assert third.read_bytes == len("new file\n") and "src/b.py" in {e.path for e in manifests[2].entries}


def test_a_file_changed_within_the_racy_window_is_read_again(stack, tmp_path):
    ws = workspace(tmp_path)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)  # default window: 2 s
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    stack.drain(gw)
    first, second = snapshots(gw)[0]
    assert first.read_bytes == second.read_bytes == first.bytes > 0


def test_a_pvisorignore_and_the_size_limits_are_honoured_with_warnings(stack, tmp_path):
    ws = workspace(tmp_path)
    (ws / ".pvisorignore").write_text("node_modules/\n*.log\n")
    (ws / "node_modules").mkdir()
    (ws / "node_modules" / "big.js").write_text("x" * 1000)
    (ws / "debug.log").write_text("log")
    (ws / "huge.bin").write_bytes(b"\0" * 5000)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    gw.gateway.snapshots.driver = FilesystemDriver(max_file_bytes=4096)
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    stack.drain(gw)
    [snap], [manifest] = snapshots(gw)
    paths = {e.path for e in manifest.entries}
    assert "node_modules" not in paths and "debug.log" not in paths and "huge.bin" not in paths
    assert ".pvisorignore" in paths
    assert any(w.startswith("huge.bin: 5000 bytes, over the limit of 4096") for w in snap.warnings)


def test_a_workspace_deleted_mid_run_is_recorded_and_the_gateway_goes_on(stack, tmp_path):
    ws = workspace(tmp_path)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    import shutil

    shutil.rmtree(ws)
    status, _, got = http_request(gw.url, "POST", "/v1/messages", b"{}")
    assert (status, got) == (200, BODY)
    stack.drain(gw)
    [snap], [manifest] = snapshots(gw)
    assert manifest is None and snap.digest is None
    assert snap.error == f"workspace {ws}: not a directory"


def test_start_and_end_snapshots_of_the_gateways_run(stack, tmp_path):
    ws = workspace(tmp_path)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    start = stack.lt.run(gw.gateway.take_snapshot(SnapshotKind.START))
    (ws / "out.txt").write_text("done\n")
    end = stack.lt.run(gw.gateway.take_snapshot(SnapshotKind.END))
    stack.drain(gw)
    snaps, manifests = snapshots(gw)
    assert [(s.kind, s.id) for s in snaps] == [(SnapshotKind.START, start.id), (SnapshotKind.END, end.id)]
    assert "out.txt" not in {e.path for e in manifests[0].entries}
    assert "out.txt" in {e.path for e in manifests[1].entries}


def test_no_secret_or_workspace_bytes_leak_into_the_events(stack, tmp_path):
    ws = workspace(tmp_path)
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    http_request(gw.url, "POST", "/v1/messages", b"{}", headers={"x-api-key": "sk-snap-secret"})
    stack.drain(gw)
    with JournalReader(gw.journal_path) as r:
        [ev] = [e for e in r.events(gw.run) if e["kind"] == "snapshot.taken"]
    assert ev["data"]["kind"] == "request" and orjson.dumps(ev).find(b"print(") < 0
    assert b"sk-snap-secret" not in gw.journal_path.read_bytes()


def _count_blobs(path: Path) -> int:
    with JournalReader(path) as r:
        return r.conn.execute("SELECT count(*) FROM blobs").fetchone()[0]


def test_a_manifest_that_changed_a_little_is_stored_as_a_delta(stack, tmp_path):
    """Each step's manifest repeats the last one but for what changed: the journal keeps the
    difference (a run's manifests are a lane of their own, like its requests)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(300):
        (ws / f"f{i:03d}.txt").write_text(f"file {i}\n")
    gw = stack.gateway({}, responder=Answer(), workspace=ws)
    gw.gateway.snapshots.driver = FilesystemDriver(racy_ns=0)
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    (ws / "f150.txt").write_text("changed\n")
    http_request(gw.url, "POST", "/v1/messages", b"{}")
    stack.drain(gw)
    first, second = snapshots(gw)[0]
    assert first.digest != second.digest
    with JournalReader(gw.journal_path) as r:
        rows = {
            sha: (size, stored, codec)
            for sha, size, stored, codec in r.conn.execute(
                "SELECT sha256, size, length(data), codec FROM blobs WHERE sha256 IN (?, ?)",
                (first.digest, second.digest),
            )
        }
        assert r.blob(second.digest) == r.manifest(second).encode()  # restores to the exact manifest
    size, stored, codec = rows[second.digest]
    assert codec == "zstd-prefix" and size > 30_000 and stored < 1_000, rows
