"""The pvisor command as users run it: a real subprocess of the installed console script."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import pvisor
from conftest import REPO, corpus_dir
from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

PVISOR = shutil.which("pvisor", path=os.path.dirname(sys.executable))


def run(
    *args: str, journal: Path | None = None, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    assert PVISOR, "the pvisor console script is installed with the package"
    argv = [PVISOR, *(["--journal", str(journal)] if journal else []), *args]
    return subprocess.run(argv, capture_output=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=60)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "j" / "journal.sqlite"
    with Journal.open(path) as j:
        j.create_run(
            Run(id="r-cli00000001", agent="codex", agent_version="0.171.0", argv=["codex", "exec", "hi"])
        )
        j.record_exchange(
            "r-cli00000001",
            "POST",
            "/v1/responses",
            [("content-type", "application/json"), ("authorization", "Bearer sk-CLI")],
            protocol="openai-responses",
            status=200,
            request_body=b'{"input": []}',
            response_body=b"event: e\ndata: {}\n\n",
            streamed=True,
            chunk_timings=[(100, 9), (250, 10)],
        )
        j.record_exchange(
            "r-cli00000001",
            "POST",
            "/v1/responses",
            [],
            status=200,
            request_body=b"\xff\xfe binary",
            response_body=b"{}",
        )
        # the agent went away after 7 of the 23 bytes the upstream sent
        j.record_exchange(
            "r-cli00000001",
            "POST",
            "/v1/responses",
            [],
            status=200,
            request_body=b"{}",
            response_body=b"event: e\ndata: {}\n\n...",
            outcome="aborted_by_client",
            bytes_received=23,
            bytes_delivered=7,
        )
    return path


def test_version_names_the_package_constant_the_distribution_and_the_commit():
    proc = run("--version")
    assert proc.returncode == 0
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    line = proc.stdout.decode().strip()
    # this project's name on the index, never the other project's that the documents name
    assert line.startswith(f"pvisor {pvisor.__version__} (pvisor-replay, commit {head.stdout.strip()[:12]}")
    assert re.fullmatch(r"pvisor \S+ \(pvisor-replay, commit [0-9a-f]{12}(-dirty)?\)", line)


def test_help_lists_commands_examples_and_exit_codes():
    proc = run("--help")
    out = proc.stdout.decode()
    assert proc.returncode == 0
    assert "journal" in out and "Examples:" in out and "pvisor journal ls" in out
    assert "124 timeout" in out and "130 interrupted" in out


def _tree(command, path=()):
    """(path of names, command) of ``command`` and every command under it."""
    import click

    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from _tree(command.get_command(ctx, name), (*path, name))


def test_every_command_makes_its_help_and_paths_without_gettext():
    # pvisor/commands/base.py: click's own help option, version option and Path pass their
    # text through gettext, whose first call imports locale (2.4 % of the stack floor)
    import click

    from pvisor.cli import cli
    from pvisor.commands.base import Command, Group, PathParam

    seen = list(_tree(cli))
    assert len(seen) >= 29  # the commands of docs/cli.md, groups included
    for path, command in seen:
        kind = Group if isinstance(command, click.Group) else Command
        assert isinstance(command, kind), (path, type(command))
        for param in command.params:
            assert not isinstance(param.type, click.Path), (path, param.name)
        help_option = command.get_help_option(click.Context(command, info_name="pvisor"))
        assert help_option is not None and help_option.help == "Show this message and exit.", path
    paths = [p for _, c in seen for p in c.params if isinstance(p.type, PathParam)]
    assert len(paths) >= 19, len(paths)


def test_path_options_refuse_what_click_path_refuses(tmp_path: Path):
    # the messages of click.Path, as PathParam gives them
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    cases = [
        (["journal", "export", "--output", "d", "r-x"],
         "Invalid value for '--output' / '-o': File 'd' is a directory"),
        (["serve-model", "--script", "d"], "Invalid value for '--script': File 'd' is a directory"),
        (["run", "--agent", "codex", "--workspace", "f", "--script", "x", "--", "true"],
         "Invalid value for '--workspace': Directory 'f' is a file"),
    ]  # fmt: skip
    for args, message in cases:
        proc = subprocess.run([PVISOR, *args], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_help_and_version_load_no_subcommand(tmp_path: Path):
    for args in (["--help"], ["--version"]):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "pvisor", *args],
            capture_output=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
        assert proc.returncode == 0
        imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line}
        for heavy in (
            "sqlite_utils",
            "sqlite3",
            "pvisor.commands.journal",
            "pvisor.journal.reader",
            "importlib.metadata",
            "asyncio",
        ):
            assert heavy not in imported, (args, heavy)


def test_default_journal_path_follows_xdg_and_env(tmp_path: Path):
    # `journal ls` on a journal that does not exist yet names the path it looked at
    proc = run("journal", "ls", env={"XDG_DATA_HOME": str(tmp_path / "xdg"), "PVISOR_JOURNAL": ""})
    assert proc.returncode == 0
    assert str(tmp_path / "xdg" / "pvisor" / "journal.sqlite") in proc.stderr.decode()
    proc = run("journal", "ls", env={"PVISOR_JOURNAL": str(tmp_path / "env.sqlite")})
    assert str(tmp_path / "env.sqlite") in proc.stderr.decode()


def test_journal_ls_and_show(journal: Path):
    proc = run("journal", "ls", journal=journal)
    assert proc.returncode == 0
    assert "r-cli00000001" in proc.stdout.decode() and "codex" in proc.stdout.decode()
    data = orjson.loads(run("journal", "ls", "--json", journal=journal).stdout)
    assert (
        data[0]["id"] == "r-cli00000001"
        and data[0]["exchanges"] == 3
        and data[0]["outcomes"] == {"ok": 2, "aborted_by_client": 1}
    )
    proc = run("journal", "show", "r-cli", journal=journal)  # a unique prefix is enough
    out = proc.stdout.decode()
    assert proc.returncode == 0 and "POST /v1/responses" in out and "openai-responses" in out
    # the response bytes shown are those the agent got (the upstream may have sent more)
    lines = out.splitlines()
    header, *rows = lines[next(i for i, line in enumerate(lines) if line.startswith("SEQ ")) :]
    columns = header.split()
    assert columns[-5:] == ["REQ_BYTES", "RESP_BYTES_TO_AGENT", "MS", "CHAIN", "ROLE"]
    cut = rows[2].split()
    assert cut[6] == "aborted_by_client" and cut[-5:-3] == ["2", "7"], rows[2]
    assert (
        cut[-2:] == ["-", "-"]
        and rows[3] == "  (roles not stored yet; `pvisor journal steps r-cli00000001` derives them)"
    )
    shown = orjson.loads(run("journal", "show", "r-cli00000001", "--json", journal=journal).stdout)
    assert shown["run"]["argv"] == ["codex", "exec", "hi"]
    assert shown["exchanges"][0]["chunk_timings"] == [[100, 9], [250, 10]]
    assert shown["exchanges"][0]["request_headers"] == {"content-type": "application/json"}


def test_journal_body_restores_bytes(journal: Path):
    shown = orjson.loads(run("journal", "show", "r-cli00000001", "--json", journal=journal).stdout)
    first, second, _ = (e["id"] for e in shown["exchanges"])
    assert run("journal", "body", first, "--request", journal=journal).stdout == b'{"input": []}'
    assert (
        run("journal", "body", first, "--response", "--raw", journal=journal).stdout
        == b"event: e\ndata: {}\n\n"
    )
    assert run("journal", "body", second, "--request", journal=journal).stdout == b"\xff\xfe binary"
    wrapped = orjson.loads(run("journal", "body", second, "--request", "--json", journal=journal).stdout)
    assert "body_b64" in wrapped and wrapped["sha256"]


def test_journal_export_jsonl(journal: Path, tmp_path: Path):
    proc = run("journal", "export", "--format", "jsonl", journal=journal)
    assert proc.returncode == 0
    lines = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert [line["type"] for line in lines] == ["run", "exchange", "exchange", "exchange"]
    assert lines[1]["request"] == {"body": '{"input": []}'}
    assert "body_b64" in lines[2]["request"]
    assert b"sk-CLI" not in proc.stdout
    out = tmp_path / "x.jsonl"
    assert run("journal", "export", "r-cli00000001", "-o", str(out), journal=journal).returncode == 0
    assert out.read_bytes() == proc.stdout
    # "-" is stdout, not a file called "-"
    dash = run("journal", "export", "-o", "-", journal=journal, cwd=tmp_path)
    assert dash.returncode == 0 and dash.stdout == proc.stdout and not (tmp_path / "-").exists()
    # directories that do not exist yet are made, mode 0700 (the documents write runs/FILE)
    deep = tmp_path / "new" / "deeper" / "x.jsonl"
    made = run("journal", "export", "r-cli00000001", "-o", str(deep), journal=journal)
    assert made.returncode == 0, made.stderr
    assert deep.read_bytes() == proc.stdout
    assert [(tmp_path / d).stat().st_mode & 0o777 for d in ("new", "new/deeper")] == [0o700, 0o700]
    # a file that cannot be written: a usage error naming it, before anything is read or made
    bad = run("journal", "export", "-o", str(out / "sub" / "x.jsonl"), journal=journal)
    assert bad.returncode == 2 and bad.stdout == b""
    assert (
        bad.stderr
        == f"pvisor: error: cannot write --output {out}/sub/x.jsonl: {out} is not a directory\n".encode()
    )


def test_exit_codes(journal: Path, tmp_path: Path):
    assert run("journal", "verify", journal=journal).returncode == 0
    assert orjson.loads(run("journal", "verify", "--json", journal=journal).stdout)["ok"] is True
    # unknown run, unknown exchange, missing body choice: usage (2), no traceback
    for args in (
        ["journal", "show", "r-nope"],
        ["journal", "body", "x-nope", "--request"],
        ["journal", "body", "x-"],
        ["journal", "body", "x-", "--request", "--response"],
    ):
        proc = run(*args, journal=journal)
        assert proc.returncode == 2, args
        assert b"Traceback" not in proc.stderr and proc.stderr.startswith(b"pvisor: error: ")
    both = run("journal", "body", "x-", "--request", "--response", journal=journal)
    assert (
        both.stderr == b"pvisor: error: give one of --request, --response and --forwarded\n"
        and both.stdout == b""
    )
    # not a journal: bad input data (65)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite at all " * 64)
    proc = run("journal", "ls", journal=junk)
    assert (
        proc.returncode == 65 and b"not a pvisor journal" in proc.stderr and str(junk).encode() in proc.stderr
    )
    # a corrupted blob: integrity error (3)
    conn = sqlite3.connect(journal)
    conn.execute("UPDATE blobs SET data = X'00' || data WHERE size > 0")
    conn.commit()
    conn.close()
    proc = run("journal", "verify", journal=journal)
    assert proc.returncode == 3 and b"problem:" in proc.stderr
    # click usage errors keep click's code 2
    assert run("journal", "frobnicate", journal=journal).returncode == 2


# --------------------------------------------------------------------------- output errors, --journal, ids


def test_output_that_cannot_be_written(journal: Path):
    """A full disk is exit 74 with one line, a closed pipe (``| head``) a quiet 141; for every
    command, never a traceback."""
    for args in (["journal", "ls"], ["journal", "steps", "r-cli00000001"], ["journal", "export"]):
        with open("/dev/full", "wb") as full:
            proc = subprocess.run(
                [PVISOR, "--journal", str(journal), *args], stdout=full, stderr=subprocess.PIPE, timeout=60
            )
        assert proc.returncode == 74, (args, proc.stderr)
        assert proc.stderr == b"pvisor: error: cannot write output: No space left on device\n", args
        p = subprocess.Popen(
            [PVISOR, "--journal", str(journal), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        p.stdout.close()  # the reader is gone before pvisor writes a byte
        err = p.stderr.read()
        p.stderr.close()
        assert p.wait(timeout=60) == 141, (args, err)
        assert err == b"", args


def test_journal_option_and_ids_that_name_nothing(journal: Path, tmp_path: Path):
    proc = run("--journal", str(tmp_path), "journal", "ls")
    assert (
        proc.returncode == 2
        and proc.stderr
        == f"pvisor: error: --journal {tmp_path} is a directory, expected a journal file\n".encode()
    )
    proc = run("--journal", "", "journal", "ls", env={"PVISOR_JOURNAL": str(journal)})
    assert proc.returncode == 2 and proc.stderr.startswith(b"pvisor: error: --journal is empty")
    for args in (
        ["journal", "steps", ""],
        ["journal", "show", ""],
        ["journal", "body", "", "--request"],
        ["journal", "export", ""],
    ):
        proc = run(*args, journal=journal)
        assert (
            proc.returncode == 2
            and proc.stderr.startswith(b"pvisor: error: an empty ")
            and proc.stdout == b""
        ), args
    for command, metavar in (("steps", "RUN"), ("show", "RUN"), ("export", "[RUN]"), ("body", "EXCHANGE")):
        usage = run("journal", command, "--help").stdout.decode().splitlines()[0]
        assert usage.startswith(f"Usage: pvisor journal {command} [OPTIONS] {metavar}"), usage


#: every command that looks up a run or an exchange of the journal, with ID where it goes
_ID_COMMANDS = {
    "journal show": (["journal", "show", "ID"], "RUN"),
    "journal steps": (["journal", "steps", "ID"], "RUN"),
    "journal rm": (["journal", "rm", "ID"], "RUN"),
    "journal export": (["journal", "export", "ID", "--format", "atif"], "RUN"),
    "journal body": (["journal", "body", "ID", "--request"], "EXCHANGE"),
    "journal scrub": (["journal", "scrub", "secret", "--run", "ID", "--dry-run"], "--run"),
    "journal merge": (
        ["journal", "merge", "{tmp}/j/x.sqlite", "--into", "{tmp}/m.sqlite", "--run", "ID"],
        "--run",
    ),
    "report": (["report", "ID", "-o", "{tmp}/r.html"], "RUN"),
    "snapshot ls": (["snapshot", "ls", "ID"], "RUN"),
    "snapshot restore": (["snapshot", "restore", "ID", "--into", "{tmp}/ws"], "RUN"),
    "replay": (
        "replay --agent codex --run ID --after-step 0 --prepare-only --output {tmp}/out".split(),
        "--run",
    ),
    "replay --workspace-from": (
        "replay --agent codex --run r-cli00000001 --after-step 0 --replay-only --workspace {tmp}/ws "
        "--workspace-from ID".split(),
        "--workspace-from",
    ),
    "run --resume": (["run", "--agent", "codex", "--resume", "ID", "--", "go on"], "--resume"),
}


@pytest.mark.parametrize("command", sorted(_ID_COMMANDS))
def test_an_id_that_is_not_utf8_is_one_line_naming_it(journal: Path, tmp_path: Path, command: str):
    """A run or exchange id given as bytes that are not UTF-8 (Python holds them as lone
    surrogates) is refused in one line naming the argument, its bytes as \\xNN, exit 2, before
    the journal is opened or any file written; it was a UnicodeEncodeError traceback in seven
    commands (issue 35 item 11)."""
    args, named = _ID_COMMANDS[command]
    argv: list[str | bytes] = [b"r-cli\xff" if a == "ID" else a.format(tmp=tmp_path) for a in args]
    before = journal.read_bytes()
    proc = subprocess.run(
        [PVISOR, "--journal", str(journal), *argv], capture_output=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 2, (command, proc.stderr)
    assert (
        proc.stderr
        == f"pvisor: error: {named} r-cli\\xff: not valid UTF-8 (file names and ids must be UTF-8)\n".encode()
    )
    assert proc.stdout == b"" and journal.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j"]  # no page, no directory, no output


def test_ids_of_other_characters_are_one_line_and_a_key_is_not_echoed(journal: Path):
    for given, said in (
        ("r-cli\x1b[31m", "RUN r-cli\\x1b[31m: not a run id (letters, digits, '.', '_' and '-', at most 128"),
        ("a" * 5000, "RUN " + "a" * 40 + "..." + "a" * 20 + " (5000 characters): not a run id"),
        (
            "sk-ant-api03-abcdefghijklmnop",
            "RUN holds a key-shaped token (not shown): a key is never a run id",
        ),
    ):
        proc = run("journal", "show", given, journal=journal)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and err.startswith(f"pvisor: error: {said}"), err
        assert err.count("\n") == 1 and "abcdefghijklmnop" not in err
    proc = run("journal", "body", "x-\n", "--request", journal=journal)
    assert proc.stderr.decode().startswith("pvisor: error: EXCHANGE x-\\n: not an exchange id"), proc.stderr


def test_damage_found_while_reading_names_the_journal_and_the_exchange(journal: Path):
    conn = sqlite3.connect(journal)
    [(sha, ex_id)] = conn.execute("SELECT request_body, id FROM exchanges WHERE seq = 1").fetchall()
    conn.execute("UPDATE blobs SET data = X'00' || data WHERE sha256 = ?", (sha,))
    root, page_size = (
        conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'exchanges'").fetchone()[0],
        conn.execute("PRAGMA page_size").fetchone()[0],
    )
    conn.commit()
    conn.close()
    proc = run("journal", "steps", "r-cli00000001", journal=journal)
    assert proc.returncode == 3
    assert (
        proc.stderr.decode()
        == f"pvisor: error: journal {journal}: exchange {ex_id}: request body: blob {sha} "
        "holds text, not bytes\n"
    )
    # a page of the exchanges table overwritten: SQLite finds it malformed on the query
    with open(journal, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xde\xad\xbe\xef" * 64)
    proc = run("journal", "show", "r-cli00000001", journal=journal)
    assert proc.returncode == 3 and b"Traceback" not in proc.stderr
    assert (
        proc.stderr.decode().startswith(f"pvisor: error: journal {journal}")
        and "malformed" in proc.stderr.decode()
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["journal", "export", "-o", "out.jsonl"], "--output out.jsonl: a relative path, but "),
        (
            ["--journal", "rel.sqlite", "env", "--agent", "codex", "--gateway", "http://127.0.0.1:1"],
            "--journal rel.sqlite: a relative path, but ",
        ),
        (["gateway", "--port", "0", "--log-file", "g.log"], "--log-file g.log: a relative path, but "),
        (["gateway", "--port", "0", "--ready-file", "r.json"], "--ready-file r.json: a relative path, but "),
        (["--journal", "rel.sqlite", "gateway", "--port", "0"], "journal rel.sqlite: a relative path, but "),
        (
            [
                "run",
                "--agent",
                "claude-code",
                "--agent-entrypoint",
                "/bin/true",
                "--script",
                "/nonexistent.json",
                "--",
                "hi",
            ],
            "no --workspace, and the current directory no longer exists",
        ),
        (
            [
                "run",
                "--agent",
                "claude-code",
                "--agent-entrypoint",
                "./claude",
                "--workspace",
                "/tmp",
                "--",
                "hi",
            ],
            "--agent-entrypoint ./claude: a relative path, but ",
        ),
        # found by the new-user helper: "no journal at rel.sqlite yet", "does not exist", "cannot read script"
        (["--journal", "rel.sqlite", "journal", "ls"], "--journal rel.sqlite: a relative path, but "),
        (["--journal", "rel.sqlite", "journal", "verify"], "journal rel.sqlite: a relative path, but "),
        (["serve-model", "--script", "turns.json"], "--script turns.json: a relative path, but "),
    ],
    ids=[
        "export-o",
        "env-journal",
        "log-file",
        "ready-file",
        "gateway-journal",
        "run-workspace",
        "run-entrypoint",
        "ls-journal",
        "verify-journal",
        "serve-model-script",
    ],
)
def test_a_deleted_working_directory_is_one_line_naming_the_path(tmp_path: Path, args, message):
    """Issue 17, defect 6: each of these printed a traceback (os.getcwd's FileNotFoundError)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    # the child starts in the directory, which is removed before pvisor looks at any path
    code = "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); os.execv(sys.argv[2], sys.argv[2:])"
    p = subprocess.run(
        [sys.executable, "-c", code, str(gone), PVISOR, *args],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PVISOR_JOURNAL": str(tmp_path / "j.sqlite")},
        stdin=subprocess.DEVNULL,
    )
    stderr = p.stderr.decode()
    assert p.returncode == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("pvisor: error: ") and message in stderr, stderr
    assert "the current directory no longer exists (was it deleted?)" in stderr


def test_an_export_cut_by_a_full_disk_leaves_no_partial_file(journal: Path, small_fs):
    """A new user found an empty out.jsonl after `journal export -o` failed on a full disk: a
    file that looks like an export of nothing. It is removed, and the error says so."""
    full = small_fs("16k")
    (full / "filler").write_bytes(b"x" * 15_000)  # room for much less than the export
    out = full / "out.jsonl"
    p = run("journal", "export", "-o", str(out), journal=journal)
    stderr = p.stderr.decode()
    assert p.returncode == 74 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"pvisor: error: cannot write --output {out}: No space left on device")
    assert "nothing was written" in stderr and not out.exists()
    assert sorted(p.name for p in full.iterdir()) == ["filler"]  # nor its .tmp


def test_an_export_that_fails_leaves_the_file_that_was_there(journal: Path, tmp_path: Path):
    """A new user's keep.jsonl was emptied by `journal export r-nope -o keep.jsonl` (exit 2):
    the run is checked first, and an export is written beside the file and renamed when whole."""
    out = tmp_path / "out"
    out.mkdir()
    keep = out / "keep.jsonl"
    keep.write_text("precious\n")
    p = run("journal", "export", "r-nope", "-o", str(keep), journal=journal)
    assert p.returncode == 2 and b"no run 'r-nope'" in p.stderr
    assert keep.read_text() == "precious\n" and sorted(x.name for x in out.iterdir()) == ["keep.jsonl"]
    fresh = out / "fresh.jsonl"
    assert run("journal", "export", "r-nope", "-o", str(fresh), journal=journal).returncode == 2
    assert not fresh.exists()
    ok = run("journal", "export", "-o", str(keep), journal=journal)
    assert ok.returncode == 0 and keep.read_text() != "precious\n"
    assert sorted(x.name for x in out.iterdir()) == ["keep.jsonl"]


def test_an_export_into_a_fifo_a_link_or_a_device_writes_into_it(journal: Path, tmp_path: Path):
    """A new user's `journal export -o /dev/null`, run as root, made /dev/null a regular file: the
    export was renamed over it. A FIFO, a device and a symbolic link's target are written in place
    (core/outfile.py); the node and the link stay what they were."""
    import stat
    import threading

    whole = run("journal", "export", journal=journal).stdout
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    p = run("journal", "export", "-o", str(fifo), journal=journal)
    reader.join(30)
    assert p.returncode == 0, p.stderr
    assert got == [whole] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    # a FIFO no process reads: one line, at once, instead of waiting for ever (the OS refuses: 74)
    p = run("journal", "export", "-o", str(fifo), journal=journal)
    assert p.returncode == 74 and p.stderr.decode().strip() == (
        f"pvisor: error: cannot write --output {fifo}: no process reads this FIFO"
    )
    # a link: its target gets the export, the link stays a link
    (tmp_path / "target.jsonl").write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to("target.jsonl")
    assert run("journal", "export", "-o", str(link), journal=journal).returncode == 0
    assert link.is_symlink() and (tmp_path / "target.jsonl").read_bytes() == whole
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.endswith(".tmp")) == []
    # a character device (a copy of /dev/null's node, where the tests run as root, as CI does)
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    p = run("journal", "export", "-o", str(node), journal=journal)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_a_group_without_its_command_shows_its_help():
    # a new user's trial: `pvisor` alone printed its whole help as one error line of several KB
    for group in ([], ["journal"], ["trajectory"]):
        proc = run(*group)
        helped = run(*group, "--help")
        assert proc.returncode == 2 and proc.stdout == b""
        assert proc.stderr == helped.stdout and proc.stderr.count(b"\n") > 5, proc.stderr[:300]


def test_the_note_of_a_journal_not_there_yet_escapes_control_characters(tmp_path: Path):
    # a new user's trial: an ESC in --journal reached the terminal raw from this note
    proc = run("--journal", "a\x1b[31mred", "journal", "ls", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == b"no journal at a\\x1b[31mred yet: nothing captured\n"


def test_every_output_option_makes_the_directories_that_do_not_exist_yet(journal: Path, tmp_path: Path):
    """--output/-o of every command that has one (journal export, report, view, replay, replay
    --batch) writes below directories that do not exist yet, made with mode 0700: the documents
    write `pvisor view RUN --step 0 --output runs/local-pause.json`. Before, each but replay was a
    usage error, and replay made them with the umask's mode."""
    native = next((corpus_dir() / "native" / "codex").glob("real-*.jsonl"))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(orjson.dumps({"trajectory": str(native), "agent": "codex", "after_step": 1}).decode())
    commands = {
        "export": ["journal", "export", "r-cli00000001", "-o", "{}/x.jsonl"],
        "report": ["report", "r-cli00000001", "-o", "{}/r.html", "--no-parent"],
        "view": ["view", "r-cli00000001", "--output", "{}/v.json"],
        "replay": ["replay", "--agent", "codex", "--trajectory", str(native), "--after-step", "1",
                   "--prepare-only", "--output", "{}/out"],
        "batch": ["replay", "--prepare-only", "--batch", str(manifest), "--output", "{}/out"],
    }  # fmt: skip
    for name, args in commands.items():
        base = tmp_path / name / "runs"
        proc = run(*[a.replace("{}", str(base)) for a in args], journal=journal, cwd=tmp_path)
        assert proc.returncode == 0, (name, proc.stderr)
        assert "Traceback" not in proc.stderr.decode()
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o700, name
        assert base.stat().st_mode & 0o777 == 0o700 and any(base.iterdir()), name


# ------------------------------------------------------------------ a new user's defects (issue 35 follow-up)

_KEY = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789ABCDEF"


def _with_start_snapshot(journal: Path, files: int = 1) -> str:
    """Give r-cli00000001 a start snapshot of ``files`` small files (f0, f1, ...); its run id."""
    import hashlib

    from pvisor.journal.snapshots import SnapshotKind, SnapshotRecord

    data = b"x\n"
    sha = hashlib.sha256(data).hexdigest()
    entries = [
        {"path": f"f{i}", "kind": "file", "mode": 0o644, "size": len(data), "sha256": sha}
        for i in range(files)
    ]
    manifest = orjson.dumps({"schema": "pvisor.snapshot-manifest/v1", "entries": entries, "warnings": []})
    with Journal.open(journal) as j:
        j.put_blobs([(sha, data)])
        j.record_snapshot(
            SnapshotRecord(
                id="s-cli0000000000001",
                run="r-cli00000001",
                attempt=1,
                kind=SnapshotKind.START,
                driver="filesystem",
                taken_ms=1.0,
                manifest=manifest,
                digest=hashlib.sha256(manifest).hexdigest(),
            )
        )
    return "r-cli00000001"


def test_a_key_given_where_a_run_or_file_goes_is_never_echoed(journal: Path, tmp_path: Path):
    """``view KEY`` said 'no run ... and no file KEY here' and ``trajectory show KEY`` 'KEY: no
    such file', echoing a key pasted by mistake; both now refuse it as the id lookups do (one
    line, exit 2, not shown), by params.py refuse_key_shaped, the check JournalId makes."""
    for args, said in (
        (["view", _KEY], "RUN|FILE holds a key-shaped token (not shown): a key is never a run id or a file"),
        (["view", f"x/{_KEY}"], "RUN|FILE holds a key-shaped token (not shown)"),
        (["trajectory", "show", _KEY], "FILE holds a key-shaped token (not shown): a key is never a file"),
        (["trajectory", "show", f"x/{_KEY}"], "FILE holds a key-shaped token (not shown)"),
    ):
        proc = run(*args, journal=journal, cwd=tmp_path)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and err.startswith(f"pvisor: error: {said}"), (args, err)
        assert "abcdefghijklmnop" not in err + proc.stdout.decode() and err.count("\n") == 1


def test_env_and_gateway_refuse_a_run_id_the_gateway_would_refuse(tmp_path: Path):
    """``env --run KEY`` exited 0 and printed the key in ANTHROPIC_BASE_URL, where the gateway
    refuses such a run id (routing.py's is_run_id); env and gateway --run now check it as
    JournalId does: exit 2, one line, the key not shown; an id not UTF-8 shown as \\xNN."""
    env = ["env", "--agent", "claude-code", "--gateway", "http://127.0.0.1:8787", "--run"]
    for args, said in (
        ([*env, _KEY], "--run holds a key-shaped token (not shown): a key is never a run id"),
        (["gateway", "--run", _KEY], "--run holds a key-shaped token (not shown): a key is never a run id"),
        ([*env, ""], "--run is empty: give a run id (letters, digits"),
        ([*env, "a b"], "--run a b: not a run id (letters, digits"),
    ):
        proc = run(*args, journal=tmp_path / "j.sqlite", cwd=tmp_path)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and err.startswith(f"pvisor: error: {said}"), (args, err)
        assert "abcdefghijklmnop" not in err + proc.stdout.decode() and err.count("\n") == 1
    proc = subprocess.run(
        [PVISOR, "--journal", str(tmp_path / "j.sqlite"), "gateway", "--run", b"r\xff"],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert proc.stderr == b"pvisor: error: --run r\\xff: not valid UTF-8 (file names and ids must be UTF-8)\n"
    assert not (tmp_path / "j.sqlite").exists()


def test_a_byte_that_is_not_utf8_is_shown_as_xnn_in_messages(tmp_path: Path):
    """Messages showed a byte that is not UTF-8 as Python's surrogate ``\\udcff`` where
    docs/cli.md promises ``\\xNN``: one_line (pvisor/commands/base.py) renders it as the byte."""
    for argv, said in (
        (
            [b"--journal", b"\xff.sqlite", b"journal", b"ls"],
            b"no journal at \\xff.sqlite yet: nothing captured\n",
        ),
        (
            [b"gateway", b"--max-response-body", b"1\xff"],
            b"pvisor: error: Invalid value for '--max-response-body': '1\\xff' is not a size such as 64MiB",
        ),
        ([b"gateway", b"--host", b"h\xff"], b"pvisor: error: --host h\\xff listens beyond this machine"),
    ):
        proc = subprocess.run(
            [PVISOR, *argv], capture_output=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL
        )
        assert proc.stderr.startswith(said) and b"udc" not in proc.stderr, (argv, proc.stderr)
        assert proc.stderr.count(b"\n") == 1


def test_every_path_a_command_wrote_is_printed_with_control_characters_escaped(journal: Path, tmp_path: Path):
    """view --output, snapshot restore --into, journal export -o and report -o printed the path
    they wrote raw (ESC, BEL reached the terminal) or, through a pipe, with click's ANSI
    stripping ('\\x1b[2J' dropped: not the file's name); now as replay --output does, escaped."""
    _with_start_snapshot(journal)
    odd = "\x1b]0;pwned\x07\x1b[2J"
    shown = "\\x1b]0;pwned\\x07\\x1b[2J"
    for args, line in (
        (["view", "r-cli00000001", "--output", f"vw{odd}.json"], f" written to vw{shown}.json\n"),
        (["journal", "export", "r-cli00000001", "-o", f"ex{odd}.jsonl"], f" to ex{shown}.jsonl\n"),
        (["report", "r-cli00000001", "--no-parent", "-o", f"rp{odd}.html"], f"rp{shown}.html\n"),
        (
            ["snapshot", "restore", "r-cli00000001", "--after-step", "0", "--into", f"rs{odd}d"],
            f"/rs{shown}d: ",
        ),
    ):
        proc = run(*args, journal=journal, cwd=tmp_path)
        out = proc.stdout.decode() + proc.stderr.decode()
        assert proc.returncode == 0, (args, out)
        assert line in out and "\x1b" not in out and "\x07" not in out, (args, out)
    assert {p.name for p in tmp_path.iterdir()} >= {
        f"vw{odd}.json",
        f"ex{odd}.jsonl",
        f"rp{odd}.html",
        f"rs{odd}d",
    }
    # a native file's name too, where the line names the file viewed
    native = tmp_path / f"nv{odd}.jsonl"
    shutil.copyfile(next((corpus_dir() / "native" / "codex").glob("real-*.jsonl")), native)
    proc = run("view", native.name, "--output", "nv.json", cwd=tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and f"view of nv{shown}.jsonl " in err and "\x1b" not in err, err


def test_an_empty_into_is_refused_not_the_working_directory(journal: Path, tmp_path: Path):
    """``snapshot restore RUN --into ""`` restored into the working directory (Path("") is
    "."): now exit 2 naming --into, as ``--journal ""``, and nothing is written."""
    _with_start_snapshot(journal)
    proc = run(
        "snapshot",
        "restore",
        "r-cli00000001",
        "--after-step",
        "0",
        "--into",
        "",
        journal=journal,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr == b"pvisor: error: --into is empty: give the directory to restore into\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j"]


def test_a_truncated_response_is_marked_in_show_and_body(tmp_path: Path):
    """A response journaled only in part (flag ``truncated``, --max-response-body) was listed
    ``ok`` by ``journal show`` and printed by ``journal body --response`` with nothing said:
    show's OUTCOME says ``ok (truncated)``, body prints one note on stderr, exit 0."""
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-cut", agent="codex"))
        cut = j.record_exchange(
            "r-cut", "POST", "/v1/responses", [], status=200, request_body=b"{}",
            response_body=b"0123456789", bytes_received=40, bytes_delivered=40, flags=("truncated",),
        )  # fmt: skip
        whole = j.record_exchange("r-cut", "POST", "/v1/responses", [], status=200, response_body=b"{}")
    proc = run("journal", "show", "r-cut", journal=journal)
    rows = [line.split() for line in proc.stdout.decode().splitlines() if line.startswith(("1 ", "2 "))]
    assert proc.returncode == 0 and [r[6:8] for r in rows] == [["ok", "(truncated)"], ["ok", "-"]], rows
    for raw in ([], ["--raw"]):
        proc = run("journal", "body", cut, "--response", *raw, journal=journal)
        assert proc.returncode == 0 and proc.stdout == b"0123456789"
        assert (
            proc.stderr
            == (
                f"pvisor: note: the response of exchange {cut} was journaled only in part: "
                "the first 10 bytes of 40 received (--max-response-body)\n"
            ).encode()
        )
    proc = run("journal", "body", whole, "--response", journal=journal)
    assert proc.returncode == 0 and proc.stdout == b"{}" and proc.stderr == b""


def test_rm_of_an_empty_id_asks_for_what_rm_takes(journal: Path):
    """``journal rm ''`` said 'give a run id or a unique prefix of one', which rm refuses: it
    asks for the whole id, or the start of ids with --prefix."""
    proc = run("journal", "rm", "", journal=journal)
    assert proc.returncode == 2
    assert proc.stderr == (
        b"pvisor: error: an empty run id matches nothing: give a run's whole id, or the start of run ids "
        b"with --prefix (pvisor journal ls lists them)\n"
    )


def test_the_gateway_token_from_the_environment_and_a_file_is_refused(tmp_path: Path):
    """$PVISOR_GATEWAY_TOKEN and --token-file together: the file won silently; now refused as
    --token with --token-file is (exit 2, one line, neither token shown)."""
    token_file = tmp_path / "token"
    token_file.write_text("f" * 32 + "\n")
    proc = run(
        "gateway", "--token-file", str(token_file), journal=tmp_path / "j.sqlite",
        env={"PVISOR_GATEWAY_TOKEN": "e" * 32},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == b""
    assert (
        proc.stderr
        == b"pvisor: error: give the token with $PVISOR_GATEWAY_TOKEN or with --token-file, not both\n"
    )
    assert not (tmp_path / "j.sqlite").exists()
