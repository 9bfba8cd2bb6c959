"""Examples in docs/ are run: shell examples of docs/cli.md, SQL of docs/journal.md."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), flags=re.S)


@pytest.fixture
def sample_journal(tmp_path: Path) -> tuple[Path, str, str]:
    path = tmp_path / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-docs00000001", agent="claude-code"))
        ex = j.record_exchange(
            "r-docs00000001", "POST", "/v1/messages", [("content-type", "application/json")], protocol="anthropic",
            status=200, request_body=b'{"messages": []}', response_body=b"event: message_stop\ndata: {}\n\n", streamed=True,
        )
    return path, "r-docs00000001", ex


def test_cli_examples_run_with_the_documented_exit_codes(sample_journal, tmp_path: Path):
    path, run_id, ex = sample_journal
    (tmp_path / "notes.txt").write_text("not a journal\n" * 100)
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"], "PVISOR_JOURNAL": str(path), "RUN": run_id, "EXCHANGE": ex}
    commands = [line[2:] for block in _blocks(DOCS / "cli.md", "console") for line in block.splitlines() if line.startswith("$ ")]
    assert len(commands) >= 8
    for command in commands:
        m = re.search(r"#\s*exit (\d+)", command)
        expected = int(m.group(1)) if m else 0
        proc = subprocess.run(["bash", "-c", command.split("#")[0]], env=env, cwd=tmp_path, capture_output=True, timeout=60)
        assert proc.returncode == expected, (command, proc.stderr.decode())
        assert b"Traceback" not in proc.stderr, command
    assert (tmp_path / "run.jsonl").read_bytes().count(b"\n") == 2


def test_sql_examples_run_on_a_real_journal(sample_journal):
    path, run_id, _ = sample_journal
    queries = _blocks(DOCS / "journal.md", "sql")
    assert len(queries) >= 3
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    results = [conn.execute(q).fetchall() for q in queries]
    assert results[0] == [(run_id, "claude-code", 1)]
    assert results[1] == []
    assert {row[0] for row in results[2]} <= {"identity", "zstd", "zstd-prefix"}
