"""``pvisor report --all`` and ``pvisor report RUN`` against hostile journals and careless
folders (issue 43): each case is one that wrote outside the folder, leaked a key, broke a page,
left a folder the next run refused, or ended in a traceback.

Journals are written with the real writer (tests/test_report_all.py's ``chat_run``) and, where
the writer refuses what a foreign journal may hold (an empty run id), edited with sqlite3.
"""

from __future__ import annotations

import os
import re
import resource
import sqlite3
import subprocess
from pathlib import Path

from test_gateway_cli import ENV, PVISOR
from test_report_all import OLD, OLD_MS, chat_run, index_runs, written_journal

from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

#: a key-shaped token (an Anthropic API key's shape); the journal and the pages redact it
KEY = "sk-ant-api03-" + "Q" * 60 + "z" * 30


def run_cli(journal: Path, *args: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PVISOR, "--journal", str(journal), *args], env=ENV, capture_output=True, text=True, cwd=cwd, **kw
    )


def one_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p.stderr


def test_a_link_in_the_folder_is_replaced_by_the_page_never_written_through(tmp_path):
    """A folder an earlier --all wrote, where someone put ``RUN.html -> ~/.bashrc`` and
    ``index.html.tmp -> ~/.profile``: both files outside keep their content, the pages are
    regular files in the folder (before: both were overwritten with the pages' HTML)."""
    journal = written_journal(tmp_path / "j.sqlite")
    out = tmp_path / "site"
    assert run_cli(journal, "report", "--all", "-o", str(out)).returncode == 0
    bashrc, profile = tmp_path / ".bashrc", tmp_path / ".profile"
    bashrc.write_text("export PATH=mine\n")
    profile.write_text("umask 077\n")
    (out / f"{OLD}.html").unlink()
    (out / f"{OLD}.html").symlink_to(bashrc)
    (out / "index.html.tmp").symlink_to(profile)
    p = run_cli(journal, "report", "--all", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert bashrc.read_text() == "export PATH=mine\n" and profile.read_text() == "umask 077\n"
    for name in (f"{OLD}.html", "index.html"):
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    assert index_runs(out / "index.html") == [OLD]
    assert sorted(os.listdir(out)) == sorted([f"{OLD}.html", "index.html"])


def test_a_folder_left_by_a_full_disk_is_written_again(tmp_path):
    """A full disk after the first page (the file size limit between the small page and the
    big one): exit 74 naming the page; the same command afterwards writes the folder (before:
    refused, exit 2, the half-written folder having no index of its own)."""
    with Journal.open(tmp_path / "j.sqlite") as j:
        j.create_run(Run(id=OLD, agent="codex", created_ms=OLD_MS))
        chat_run(j, OLD)
        big = Run(id="r-big000000001", agent="codex", created_ms=OLD_MS + 1000, labels={"n": "x" * 200_000})
        j.create_run(big)
        chat_run(j, "r-big000000001")
        j.flush()
    journal = tmp_path / "j.sqlite"
    probe = tmp_path / "probe"
    assert run_cli(journal, "report", "--all", "-o", str(probe)).returncode == 0
    small, big = (probe / f"{OLD}.html").stat().st_size, (probe / "r-big000000001.html").stat().st_size
    assert small + 4096 < big, (small, big)
    limit = max(small + 4096, 64 * 1024)  # the journal's -shm (32 KiB) is a file this limit counts too
    assert limit < big

    def full() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    out = tmp_path / "site"
    p = run_cli(journal, "report", "--all", "-o", str(out), preexec_fn=full)
    assert p.returncode == 74 and "r-big000000001.html" in one_line(p), p.stderr
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    p = run_cli(journal, "report", "--all", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert index_runs(out / "index.html") == ["r-big000000001", OLD]


def test_no_key_in_a_run_id_reaches_a_page_its_name_or_stdout(tmp_path):
    """A run whose id holds a key: the index, the page (its title among them), the page's file
    name and the paths printed show it redacted (before: the page's <title> held the key)."""
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id=f"r-{KEY}", agent="codex", created_ms=OLD_MS, labels={"task": f"use {KEY}"}))
        chat_run(j, f"r-{KEY}")
        j.flush()
    out = tmp_path / "site"
    p = run_cli(journal, "report", "--all", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert KEY not in p.stdout + p.stderr
    for f in out.iterdir():
        assert KEY not in f.name and KEY not in f.read_text(), f.name
    # one run's page too: named by the hash, not the key
    p = run_cli(journal, "report", "r-sk-ant", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert KEY not in p.stdout and KEY not in (tmp_path / p.stdout.strip()).read_text()
    assert not list(tmp_path.glob("r-sk-*"))


def test_a_label_cannot_end_or_escape_the_pages_data(tmp_path):
    """A label ``<!--<script>`` put the HTML parser in the script's "double escaped" state, in
    which the data's closing tag does not close it: the page's own script became data and the
    page stayed blank. The data block now holds no ``<`` at all (``\\u003c``)."""
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        labels = {"note": "<!--<script>", "b": "</script>"}
        j.create_run(Run(id=OLD, agent="codex", created_ms=OLD_MS, labels=labels))
        chat_run(j, OLD)
        j.flush()
    out = tmp_path / "site"
    assert run_cli(journal, "report", "--all", "-o", str(out)).returncode == 0
    page = (out / f"{OLD}.html").read_text()
    data = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert data is not None and "<" not in data.group(1)
    assert "\\u003c!--\\u003cscript>" in data.group(1)


def test_a_foreign_run_with_an_empty_id_is_written_with_the_others(tmp_path):
    """A run whose id is empty (the writer refuses it; a foreign journal may hold it) made the
    whole --all fail with "an empty run id matches nothing"; it now has its page."""
    journal = written_journal(tmp_path / "j.sqlite")
    with sqlite3.connect(journal) as c:
        c.execute("INSERT INTO runs (id, agent, created_ms) VALUES ('', 'codex', ?)", (OLD_MS + 1000,))
    out = tmp_path / "site"
    p = run_cli(journal, "report", "--all", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert index_runs(out / "index.html") == ["", OLD]
    assert len(list(out.glob("run-*.html"))) == 1


def test_a_parent_id_no_file_may_bear_is_linked_by_its_hash(tmp_path):
    """``pvisor report RUN`` of a run whose parent's id is a path (``../x``): the parent's page
    beside it is named by the id's hash (before: a ValueError traceback, "Invalid name")."""
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id=OLD, agent="codex", created_ms=OLD_MS))
        chat_run(j, OLD)
        j.flush()
    with sqlite3.connect(journal) as c:
        c.execute("INSERT INTO runs (id, agent, created_ms) VALUES ('../x', 'codex', ?)", (OLD_MS - 1000,))
        c.execute("UPDATE runs SET parent_run = '../x' WHERE id = ?", (OLD,))
    out = tmp_path / "pages"
    out.mkdir()
    p = run_cli(journal, "report", OLD, "-o", str(out / "run.html"))
    assert p.returncode == 0, p.stderr
    names = sorted(os.listdir(out))
    assert len(names) == 2 and names[0].startswith("run-") and names[1] == "run.html", names
    assert not (tmp_path / "x.html").exists()


def test_more_bad_input_gets_one_line_and_its_exit_code(tmp_path):
    journal = written_journal(tmp_path / "j.sqlite")
    cases = [
        # a --since whose UTC time is before year 1: a ValueError traceback from the index's line
        (["--since", "0001-01-01T00:00+01:00"], 2, "Invalid value for '--since'"),
        # the journal's -wal file (not there until a reader opens the journal): was 74 "File exists"
        (["-o", f"{journal}-wal"], 2, "which this command reads"),
        # an empty -o was taken for the current directory
        (["-o", ""], 2, "give a DIR"),
    ]
    for args, code, expected in cases:
        p = run_cli(journal, "report", "--all", *args, cwd=tmp_path)
        assert p.returncode == code, (args, p.stderr)
        assert expected in one_line(p), (args, p.stderr)
    assert not (tmp_path / "pvisor-report").exists() and not Path(f"{journal}-wal").is_dir()


def test_a_right_to_left_override_in_an_id_stays_in_its_own_id(tmp_path):
    """Run ids are isolated (``<bdi>``): an id holding U+202E reverses itself only, not the
    next child run named in the same cell."""
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id=OLD, agent="codex", created_ms=OLD_MS))
        j.create_run(Run(id="r-\u202egnp.exe", agent="codex", created_ms=OLD_MS + 1, parent_run=OLD))
        j.create_run(Run(id="r-child0000001", agent="codex", created_ms=OLD_MS + 2, parent_run=OLD))
        j.flush()
    out = tmp_path / "site"
    assert run_cli(journal, "report", "--all", "-o", str(out)).returncode == 0
    index = (out / "index.html").read_text()
    children = re.search(rf'<tr data-run="{OLD}">.*?<td class="children">(.*?)</td>', index).group(1)
    assert children.count("<bdi>") == 2 and "<bdi>r-\u202egnp.exe</bdi>" in children, children
