"""Files pvisor makes and reads back in a directory someone else may write (core/outfile.py:
``create_private``, ``read_back``, ``read_regular``): a run directory where a sandboxed agent
left links, FIFOs and directories (tests/test_sandbox_attacks.py does it with a real agent)."""

from __future__ import annotations

import os
import stat

import pytest

from pvisor.core.outfile import create_private, read_back, read_regular


def test_create_private_replaces_a_link_a_fifo_and_a_file_and_refuses_a_directory(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "link").symlink_to(victim)
    os.mkfifo(run / "fifo")
    (run / "file").write_text("old")
    for name in ("link", "fifo", "file", "new"):
        with create_private(run / name) as f:
            f.write(b"mine")
        st = os.lstat(run / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, name
        assert (run / name).read_bytes() == b"mine"
    assert victim.read_text() == "precious\n"
    (run / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        create_private(run / "dir")


def test_create_private_beneath_follows_no_link_on_the_way(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    (run / "home").mkdir(parents=True)
    (run / "home" / ".codex").symlink_to(outside)  # a directory of the private home swapped
    with pytest.raises(OSError):
        create_private(run / "home" / ".codex" / "config.toml", run)
    assert list(outside.iterdir()) == []
    with create_private(run / "home" / "new" / "deep" / "f", run) as f:  # missing ones made, 0700
        f.write(b"x")
    assert stat.S_IMODE(os.stat(run / "home" / "new").st_mode) == 0o700


def test_what_was_written_is_read_back_whatever_lies_at_the_path_now(tmp_path):
    path = tmp_path / "attempt-1.stdout"
    with create_private(path) as f:
        f.write(b"line\n" * 3)
        f.flush()
        path.rename(tmp_path / "gone")
        os.mkfifo(path)  # a read of the path would block for ever
        assert read_back(f, 1 << 20) == (b"line\n" * 3, False)
        assert read_back(f, 4) == (b"line", True)


def test_read_regular_reads_only_a_regular_file_bounded(tmp_path):
    (tmp_path / "f").write_bytes(b"abcdef")
    assert read_regular(tmp_path / "f", 4) == (b"abcd", True)
    assert read_regular(tmp_path / "f", 6) == (b"abcdef", False)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dir").mkdir()
    for name in ("fifo", "zero", "dir"):
        with pytest.raises(OSError):
            read_regular(tmp_path / name, 1 << 20)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 10)
