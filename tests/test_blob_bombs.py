"""Crafted journal blobs (issue 35 item 4): a zstd frame of 98 KB that inflates to 3 GiB, put in
a real journal with sqlite3 in place of a body and of a snapshot's file. Every command that
reads blobs is run as a subprocess under an address-space limit far below what the bomb would
take: each must say one line naming the journal and the blob, exit 3 (integrity error), and
never allocate the bomb (before the fix: a MemoryError traceback each)."""

from __future__ import annotations

import hashlib
import random
import resource
import sqlite3
import subprocess
from pathlib import Path

import pytest
from agent_helpers import PVISOR
from journal_helpers import snapshot

from pvisor.journal.writer import Journal

GIB = 1 << 30
#: the commands' address-space limit: a pvisor command needs about 0.3 GB, the bomb 3 GiB
LIMIT_AS = 1200 << 20
BODY_BYTES = 300_000  # the victims' declared size: a window of 2^20 covers it, the bomb's 2^17 fits


def rle_bomb(total: int) -> bytes:
    """One zstd frame (RFC 8878 §3.1.1) of RLE blocks that decodes to ``total`` zero bytes:
    4 bytes per 128 KiB block (3 GiB in 98 KB), no content size, a 128 KiB window."""
    block = 128 * 1024
    out = bytearray(b"\x28\xb5\x2f\xfd")  # magic number
    out += bytes([0x00, 7 << 3])  # no content size, not single-segment, no checksum; window 2^(10+7)
    n = total // block
    for i in range(n):
        last = 1 if i == n - 1 else 0
        out += ((block << 3) | (1 << 1) | last).to_bytes(3, "little") + b"\x00"  # RLE block of 0x00
    return bytes(out)


def _body(seed: int) -> bytes:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 9))) for _ in range(800)]
    text = " ".join(rng.choice(words) for _ in range(BODY_BYTES // 4))
    return (b'{"text": "' + text.encode() + b'"}')[: BODY_BYTES - 2] + b'"}'


@pytest.fixture(scope="module")
def bombed(tmp_path_factory) -> tuple[Path, str, str, str]:
    """A journal whose request body of run ``r-bomb`` and file ``big.txt`` of run ``r-snap``'s
    start snapshot are 3 GiB bombs with their declared sizes kept; returns (journal, exchange id,
    body sha256, file sha256)."""
    path = tmp_path_factory.mktemp("bomb") / "j.sqlite"
    body, file = _body(1), _body(2)
    with Journal.open(path) as j:
        ex = j.record_exchange("r-bomb", "POST", "/v1/messages", [], status=200, request_body=body)
        snapshot(j, "r-snap", "s-bomb000000000001", {"big.txt": file, "small.txt": b"small\n"})
    body_sha, file_sha = hashlib.sha256(body).hexdigest(), hashlib.sha256(file).hexdigest()
    bomb = rle_bomb(3 * GIB)
    assert len(bomb) < 100_000
    with sqlite3.connect(path) as conn:
        for sha in (body_sha, file_sha):
            size = conn.execute(
                "UPDATE blobs SET codec = 'zstd', base = NULL, data = ? WHERE sha256 = ? RETURNING size",
                (bomb, sha),
            ).fetchone()[0]
            assert size == BODY_BYTES
    conn.close()
    return path, ex, body_sha, file_sha


def _limited(limit: int = LIMIT_AS) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _cli(journal: Path, *args: str, cwd: Path, limit: int = LIMIT_AS) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PVISOR), "--journal", str(journal), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        preexec_fn=lambda: _limited(limit),
    )


def _one_line_exit_3(proc: subprocess.CompletedProcess, journal: Path, sha: str) -> str:
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("pvisor: error: journal ") and str(journal) in line, line
    assert f"blob {sha}" in line and f"more than its declared {BODY_BYTES} bytes" in line, line
    return line


@pytest.mark.parametrize(
    "command",
    [
        ["journal", "body", "EX", "--request"],
        ["journal", "export", "r-bomb", "-o", "out.jsonl"],
        ["journal", "sql", "SELECT length(pvisor_body(request_body)) FROM exchanges"],
        ["journal", "sql", "SELECT length(request) FROM exchange_bodies"],
    ],
)
def test_a_body_that_inflates_past_its_declared_size_is_one_integrity_error(bombed, tmp_path, command):
    journal, ex, body_sha, _ = bombed
    proc = _cli(journal, *[ex if a == "EX" else a for a in command], cwd=tmp_path)
    _one_line_exit_3(proc, journal, body_sha)
    assert not (tmp_path / "out.jsonl").exists()


def test_a_snapshot_file_that_inflates_is_refused_by_restore(bombed, tmp_path):
    journal, _, _, file_sha = bombed
    into = tmp_path / "into"
    proc = _cli(
        journal, "snapshot", "restore", "r-snap", "--after-step", "0", "--into", str(into), cwd=tmp_path
    )
    _one_line_exit_3(proc, journal, file_sha)
    assert not (into / "big.txt").exists()


def test_verify_names_both_bombs_and_exits_3(bombed, tmp_path):
    journal, _, body_sha, file_sha = bombed
    proc = _cli(journal, "journal", "verify", cwd=tmp_path)
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    out = proc.stdout + proc.stderr
    for sha in (body_sha, file_sha):
        [line] = [ln for ln in out.splitlines() if sha in ln]
        assert f"more than its declared {BODY_BYTES} bytes" in line, line


def test_a_declared_size_past_any_journals_is_refused_before_decoding(tmp_path):
    """A row that declares the bomb's own size (its sha256 may even match) is damage too: no
    body of a journal is larger than SQLite's limit of one blob."""
    path = tmp_path / "j.sqlite"
    body = _body(3)
    with Journal.open(path) as j:
        ex = j.record_exchange("r-big", "POST", "/v1/messages", [], status=200, request_body=body)
    sha = hashlib.sha256(body).hexdigest()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE blobs SET codec = 'zstd', base = NULL, data = ?, size = ? WHERE sha256 = ?",
            (rle_bomb(3 * GIB), 3 * GIB, sha),
        )
    conn.close()
    proc = _cli(path, "journal", "body", ex, "--request", cwd=tmp_path)
    assert "Traceback" not in proc.stderr and proc.returncode == 3, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert str(path) in line and f"blob {sha}" in line and f"declares {3 * GIB} bytes" in line, line


def test_replay_workspace_from_a_bombed_snapshot_is_journal_damaged(bombed, tmp_path):
    journal, _, _, file_sha = bombed
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    native = Path(__file__).parent / "corpus" / "native" / "claude-code" / "spotter_short.jsonl"
    proc = _cli(
        journal,
        *("replay", "--trajectory", str(native), "--agent", "claude-code", "--after-step", "1"),
        *("--replay-only", "--workspace", str(ws), "--workspace-from", "r-snap", "--output", str(out)),
        cwd=tmp_path,
    )
    _one_line_exit_3(proc, journal, file_sha)
    assert not (ws / "big.txt").exists()


def _bomb_with_content_size(total: int) -> bytes:
    """:func:`rle_bomb` whose frame header declares its content size (Frame_Content_Size, 8 bytes)."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xC0, 7 << 3]) + total.to_bytes(8, "little") + rle_bomb(total)[6:]


@pytest.mark.parametrize("command", [["journal", "body", "EX", "--request"], ["journal", "verify"]])
@pytest.mark.parametrize("declares_size", [False, True], ids=["no-content-size", "content-size"])
def test_a_row_declaring_nearly_a_gigabyte_is_one_integrity_error_under_the_limit(
    tmp_path, command, declares_size
):
    """The row declares 999,999,999 bytes (under MAX_SIZE), the frame inflates to 3 GiB (or its
    header says ~1 GB, which a limit of 700 MiB cannot hold): one line, exit 3, no MemoryError
    (before the fix: a traceback, after allocating ~2 GB)."""
    path = tmp_path / "j.sqlite"
    body = _body(4)
    with Journal.open(path) as j:
        ex = j.record_exchange("r-lie", "POST", "/v1/messages", [], status=200, request_body=body)
    sha = hashlib.sha256(body).hexdigest()
    size = (999_999_999 // (128 * 1024)) * 128 * 1024 if declares_size else 999_999_999
    data = _bomb_with_content_size(size) if declares_size else rle_bomb(3 * GIB)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE blobs SET codec = 'zstd', base = NULL, data = ?, size = ? WHERE sha256 = ?",
            (data, size, sha),
        )
    conn.close()
    limit = (700 << 20) if declares_size else LIMIT_AS
    proc = _cli(path, *[ex if a == "EX" else a for a in command], cwd=tmp_path, limit=limit)
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    [line] = [ln for ln in (proc.stdout + proc.stderr).splitlines() if f"blob {sha}" in ln]
    want = "ran out of the memory" if declares_size else f"more than its declared {size} bytes"
    assert want in line, line


def test_a_frame_header_that_disagrees_with_the_row_is_refused_before_decoding():
    from pvisor.journal import blobs

    codec, stored = blobs.encode(b"a" * 1000)
    assert codec == "zstd"
    for size in (999, 1001):
        with pytest.raises(blobs.SizeError, match=f"its zstd frame declares 1000 bytes, its row {size}"):
            blobs.decode(codec, stored, size=size)
    assert blobs.decode(codec, stored, size=1000) == b"a" * 1000
