"""Examples in the docs are run: shell examples of docs/cli.md, SQL of docs/journal.md, the
`pvisor env`, `pvisor trajectory` and `pvisor replay` examples of the README, its offline
`pvisor run --script` example of each of the six agents with the real agent (its live ones need
a key: they are parsed by the real command), the offline example of docs/agents.md with the
real Claude Code, and docs/handoff.md's with the real Claude Code, Codex and Gemini CLI."""

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
from pvisor.journal.reader import JournalReader
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
            "r-docs00000001",
            "POST",
            "/v1/messages",
            [("content-type", "application/json")],
            protocol="anthropic",
            status=200,
            request_body=b'{"messages": []}',
            response_body=b"event: message_stop\ndata: {}\n\n",
            streamed=True,
        )
        j.flush()
        j.set_exchange_roles("r-docs00000001", {ex: (1, "main")})
    return path, "r-docs00000001", ex


def test_cli_examples_run_with_the_documented_exit_codes(sample_journal, tmp_path: Path):
    path, run_id, ex = sample_journal
    (tmp_path / "notes.txt").write_text("not a journal\n" * 100)
    bindir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ["PATH"],
        "PVISOR_JOURNAL": str(path),
        "RUN": run_id,
        "EXCHANGE": ex,
    }
    commands = [
        line[2:]
        for block in _blocks(DOCS / "cli.md", "console")
        for line in block.splitlines()
        if line.startswith("$ ")
    ]
    assert len(commands) >= 8
    for command in commands:
        m = re.search(r"#\s*exit (\d+)", command)
        expected = int(m.group(1)) if m else 0
        proc = subprocess.run(
            ["bash", "-c", command.split("#")[0]], env=env, cwd=tmp_path, capture_output=True, timeout=60
        )
        assert proc.returncode == expected, (command, proc.stderr.decode())
        assert b"Traceback" not in proc.stderr, command
    assert (tmp_path / "run.jsonl").read_bytes().count(b"\n") == 2


def test_sql_examples_run_on_a_real_journal(sample_journal):
    path, run_id, _ = sample_journal
    queries = _blocks(DOCS / "journal.md", "sql")
    assert len(queries) == 6
    # the first four need nothing but SQLite
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    results = [conn.execute(q).fetchall() for q in queries[:4]]
    assert results[0] == [(run_id, "claude-code", 1)]
    assert results[1] == []
    assert results[2] == [(run_id, 1, 0, 0)]
    assert {row[0] for row in results[3]} <= {"identity", "zstd", "zstd-prefix"}
    # the others read bodies through pvisor journal sql's functions and views
    import json

    bodies = []
    for q in queries[4:]:
        proc = subprocess.run(
            [sys.executable, "-m", "pvisor", "--journal", str(path), "journal", "sql", "--json", q],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONSAFEPATH": "1"},
        )  # fmt: skip
        assert proc.returncode == 0, (q, proc.stderr)
        bodies.append(json.loads(proc.stdout))
    assert bodies[0] == [{"seq": 1, "model": None, "messages": 0}]
    assert bodies[1] == [{"seq": 1, "reply": "event: message_stop\ndata: {}\n\n"}]


def _same_ids(text: str) -> str:
    """``text`` with each exchange id replaced by its order of first appearance (same length)."""
    seen: dict[str, str] = {}
    return re.sub(r"x-[0-9a-f]{16}", lambda m: seen.setdefault(m.group(0), f"x-{len(seen) + 1:016x}"), text)


def test_steps_example_prints_what_the_doc_shows(tmp_path: Path):
    doc = DOCS / "steps.md"
    [code] = _blocks(doc, "python")
    path = tmp_path / "journal.sqlite"
    exec(compile(code, str(doc), "exec"), {"JOURNAL": str(path), "__name__": "docs_example"})
    commands = [
        line[2:] for block in _blocks(doc, "console") for line in block.splitlines() if line.startswith("$ ")
    ]
    outputs = _blocks(doc, "text") + _blocks(doc, "json")
    assert len(commands) == len(outputs) == 2
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"], "JOURNAL": str(path)}
    for command, shown in zip(commands, outputs):
        proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, timeout=60)
        assert proc.returncode == 0, (command, proc.stderr.decode())
        assert _same_ids(proc.stdout.decode()) == _same_ids(shown), command


README = DOCS.parent / "README.md"


def _console_commands(path: Path) -> list[str]:
    return [
        line[2:] for block in _blocks(path, "console") for line in block.splitlines() if line.startswith("$ ")
    ]


def test_readme_shows_run_and_env_for_every_agent_and_they_parse_or_run(tmp_path: Path):
    """README: per agent a `pvisor run` example (marked `# live API`: it needs a key, so it is
    only parsed by the real command's option parser) and a `pvisor env` example (run)."""
    import shlex

    import click

    from pvisor.adapters.agents import agent_names
    from pvisor.commands.run import run as run_command

    commands = _console_commands(README)
    for agent in agent_names():
        assert any(c.startswith(f"pvisor run --agent {agent} ") for c in commands), agent
        assert any(c.startswith(f"pvisor env --agent {agent} ") for c in commands), agent
    bindir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ["PATH"],
        "PVISOR_JOURNAL": str(tmp_path / "j.sqlite"),
    }
    for command in commands:
        words = shlex.split(command.split("#")[0])
        if words[:2] == ["pvisor", "run"]:
            assert "# live API" in command, (
                f"a README run example that is not marked '# live API' would not run offline: {command}"
            )
            try:
                run_command.make_context("run", words[2:])
            except click.ClickException as exc:
                pytest.fail(f"{command}: {exc.format_message()}")
        elif words[:2] == ["pvisor", "env"]:
            proc = subprocess.run(
                ["bash", "-c", command.split("#")[0]], env=env, cwd=tmp_path, capture_output=True, timeout=60
            )
            assert proc.returncode == 0, (command, proc.stderr.decode())
            # a base URL with the run id; intercept mode's snippet instead names the proxy and the CA
            if "--intercept" in words:
                assert b"HTTPS_PROXY=http://127.0.0.1:8080" in proc.stdout, command
                assert b"NODE_EXTRA_CA_CERTS=" in proc.stdout, command
            else:
                assert b"/run/" in proc.stdout, command
    assert not (tmp_path / "j.sqlite").exists()  # pvisor env never writes


@pytest.mark.slow
def test_readme_offline_example_of_every_agent_runs_the_real_agent(tmp_path: Path):
    """README: per agent a `pvisor run --script examples/...` example marked `# offline`, run as
    written from a directory holding the checkout's examples/, with the pinned agent first on
    PATH: it writes hello.txt in two steps and the agent says it succeeded."""
    from agent_helpers import entrypoint

    from pvisor.adapters.agents import agent_names

    offline = [c for c in _console_commands(README) if c.rstrip().endswith("# offline")]
    bindir = os.path.dirname(sys.executable)
    for agent in agent_names():
        [command] = [c for c in offline if f"pvisor run --agent {agent} " in c]
        root = tmp_path / agent
        shutil.copytree(DOCS.parent / "examples", root / "examples")
        env = {
            **os.environ,
            "PATH": os.pathsep.join([str(entrypoint(agent).parent), bindir, os.environ["PATH"]]),
            "PVISOR_JOURNAL": str(root / "data" / "j.sqlite"),
            "HOME": str(root / "home"),
        }
        proc = subprocess.run(
            ["bash", "-c", command.split("#")[0]], env=env, cwd=root, capture_output=True, text=True,
            timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == 0, (agent, proc.stdout + proc.stderr)
        assert (root / f"ws-{agent}" / "hello.txt").read_text() == "hello\n", agent
        assert "steps captured: 2 (tool calls per step: 1, " in proc.stdout, (agent, proc.stdout)
        assert "agent: exit code 0; by its own account: succeeded" in proc.stdout, (agent, proc.stdout)


def test_agents_offline_example_runs_the_real_claude_code(tmp_path: Path):
    """docs/agents.md "Try it offline": the script and the command, run as written with the
    pinned Claude Code first on PATH."""
    from agent_helpers import entrypoint

    [script] = _blocks(DOCS / "agents.md", "json")
    (tmp_path / "turns.json").write_text(script)
    claude = entrypoint("claude-code")
    bindir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(claude.parent), bindir, os.environ["PATH"]]),
        "PVISOR_JOURNAL": str(tmp_path / "data" / "j.sqlite"),
        "HOME": str(tmp_path / "home"),
    }
    [command] = _console_commands(DOCS / "agents.md")
    proc = subprocess.run(
        ["bash", "-c", command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ws" / "hello.txt").read_text() == "hello\n"
    assert "steps captured: 2 (tool calls per step: 1, 0)" in proc.stdout, proc.stdout


def test_replay_only_example_runs_the_real_claude_code(tmp_path: Path):
    """docs/replay.md "Try it offline": record with the scripted model, replay to step 2 from the
    journal and to step 1 from the native file, as written, with the pinned Claude Code first on
    PATH; the line the doc quotes is what the replay prints."""
    import json

    from agent_helpers import entrypoint

    script = _blocks(DOCS / "replay.md", "json")[0]
    (tmp_path / "turns.json").write_text(script)
    claude = entrypoint("claude-code")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(claude.parent), os.path.dirname(sys.executable), os.environ["PATH"]]),
        "PVISOR_JOURNAL": str(tmp_path / "data" / "j.sqlite"),
        "HOME": str(tmp_path / "home"),
    }
    commands = _console_commands(DOCS / "replay.md")[:5]  # replay-only's (continuation's: below)
    proc = subprocess.run(
        ["bash", "-ec", "\n".join(commands)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ws2" / "hello.txt").read_text() == "hello\n" and (
        tmp_path / "ws3" / "hello.txt"
    ).read_text() == "hello\n"
    assert re.search(
        r"replayed claude-code to step 2 of 3 as run r-[0-9a-f]+: 2 tool call\(s\) re-run, "
        r"1 of 2 observation\(s\) equal once normalised; prefix \S*out/prefix.json "
        r"\(\d+ bytes, ending with the observation\); the agent ended by synthetic_end",
        proc.stdout,
    ), proc.stdout
    for out in ("out", "out-native"):
        assert json.loads((tmp_path / out / "result.json").read_text())["status"] == "ok"
    # the README shows the same replay (it needs the recording made above: run here)
    readme = [
        line[2:]
        for block in _blocks(DOCS.parent / "README.md", "console")
        for line in block.splitlines()
        if line.startswith("$ ") and "--replay-only" in line and "pvisor replay " in line
    ]
    assert readme == [commands[2]]


def test_snapshots_example_runs_the_real_claude_code(tmp_path: Path):
    """docs/snapshots.md "Try it offline", as written, with the pinned Claude Code first on PATH:
    what it says of the snapshots, the restored directories, the view and the replay holds."""
    import json

    from agent_helpers import entrypoint

    from pvisor.replay.workspace import digest_workspace

    [script] = _blocks(DOCS / "snapshots.md", "json")
    (tmp_path / "steps.json").write_text(script)
    claude = entrypoint("claude-code")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(claude.parent), os.path.dirname(sys.executable), os.environ["PATH"]]),
        "PVISOR_JOURNAL": str(tmp_path / "data" / "j.sqlite"),
        "HOME": str(tmp_path / "home"),
    }
    commands = _console_commands(DOCS / "snapshots.md")
    assert len(commands) == 10
    # "Pause views and handoff": the documents' view line, their Python as written, then the
    # child run listed and started, in the doc's order, in the same shell
    [documents, own] = _blocks(DOCS / "snapshots.md", "python")
    assert "from pvisor.harness import PauseSpec, TrajectoryReplay" in documents
    script = [*commands[:8], f"python3 - <<'EOF'\n{documents}EOF", *commands[8:]]
    proc = subprocess.run(
        ["bash", "-ec", "\n".join(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "run r-" in proc.stdout and ": 5 snapshots, 3 transitions (0..2; journal steps 1..3)" in proc.stdout
    )
    for d in ("after-0", "before-1"):
        assert sorted(p.name for p in (tmp_path / d).iterdir()) == ["a.txt", "seed.txt"]
        assert (tmp_path / d / "a.txt").read_text() == "one\n" and (
            tmp_path / d / "a.txt"
        ).stat().st_mode & 0o777 == 0o640
    view = json.loads((tmp_path / "pause.json").read_text())
    assert view["through_step"] == 1 and view["workspace"]["after_step"] == 1
    assert (view["pause"]["transition"], view["pause"]["before"]) == (1, True)
    # the documents' own line: transition 0, into a directory made for it
    local = json.loads((tmp_path / "runs" / "local-pause.json").read_text())
    assert (local["pause"]["transition"], local["through_step"]) == (0, 1)
    assert local["steps"] == view["steps"] and (tmp_path / "runs").stat().st_mode & 0o777 == 0o700
    assert "at transition 0 (step 1 of 3 journal steps) written to runs/local-pause.json" in proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok" and result["workspace"]["restored_from"]["kind"] == "start"
    seed_only = tmp_path / "seed-only"
    seed_only.mkdir()
    (seed_only / "seed.txt").write_text("seed\n")
    assert result["workspace"]["sha256_before"] == digest_workspace(seed_only).sha256
    assert digest_workspace(tmp_path / "ws2") == digest_workspace(
        tmp_path / "ws"
    )  # the replay ends as the run did
    # the README shows two of these commands
    readme = [c for c in _console_commands(README) if c.startswith(("pvisor snapshot", "pvisor view"))]
    assert len(readme) == 2 and set(readme) <= set(commands)
    # the handoff: the pause after transition 0 restored into ws-child, child-1 pending, then run
    run = json.loads((tmp_path / "run.json").read_text())["run"]
    digest = re.search(r"^0 1 ([0-9a-f]{12}) child-1$", proc.stdout, flags=re.M)
    assert digest, proc.stdout
    assert re.search(r"^child-1 +- +handoff +pending ", proc.stdout, flags=re.M), proc.stdout
    child = json.loads((tmp_path / "child.json").read_text())
    assert child["run"] == "child-1" and child["workspace"] == str(tmp_path / "ws-child"), child
    assert child["steps"] == 3 and "differs from the snapshot" not in proc.stderr
    ls = subprocess.run(["pvisor", "journal", "ls", "--json"], env=env, capture_output=True, text=True)
    [row] = [r for r in json.loads(ls.stdout) if r["id"] == "child-1"]
    assert (row["mode"], row["status"], row["parent_run"], row["boundary_step"], row["pause_transition"]) == (
        "handoff",
        "ended",
        run,
        1,
        0,
    )
    with JournalReader(tmp_path / "data" / "j.sqlite") as reader:
        assert reader.run("child-1").workspace_snapshot.startswith(digest.group(1))
    # the next agent re-ran none of the parent's steps: its page shows no O against O'
    page = subprocess.run(
        ["pvisor", "report", "child-1", "-o", "pages/child.html", "--no-parent"],
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert page.returncode == 0 and '"comparison":[]' in (tmp_path / "pages" / "child.html").read_text()
    # a second start under the same id is refused, before anything runs
    again = subprocess.run(
        ["bash", "-c", commands[-1]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 2 and again.stderr.startswith(
        "pvisor: error: --child-run child-1: the handoff's child run child-1 was started already (attempt 1 "
    ), again.stderr
    # a workspace that is not the restored snapshot any more: one warning line, and the run goes on
    other = (
        "from pvisor.harness import PauseSpec, TrajectoryReplay\n"
        f"replay = TrajectoryReplay.from_event_log({str(tmp_path / 'data' / 'runs' / run)!r})\n"
        "[view] = replay.materialize_pauses([PauseSpec(id='p', kind='step', after_step=0)])\n"
        "TrajectoryReplay.restore_handoff(view, 'ws-other', 'child-2')\n"
    )
    subprocess.run([sys.executable, "-c", other], cwd=tmp_path, env=env, check=True, timeout=120)
    (tmp_path / "ws-other" / "stray.txt").write_text("not in the snapshot\n")
    # the warning comes before the agent starts: an agent that exits at once is enough here
    quick = tmp_path / "quick-claude"
    pin = json.loads((DOCS.parent / "tests" / "agents" / "claude-code" / "package.json").read_text())
    version = pin["dependencies"]["@anthropic-ai/claude-code"]
    quick.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "{version} (Claude Code)"; fi\nexit 0\n'
    )
    quick.chmod(0o755)
    moved = subprocess.run(
        [
            "pvisor",
            "run",
            "--agent",
            "claude-code",
            "--agent-entrypoint",
            str(quick),
            "--script",
            "steps.json",
            "--child-run",
            "child-2",
            "--",
            "Edit the files",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert moved.returncode == 0, moved.stderr
    [warning] = [line for line in moved.stderr.splitlines() if "differs" in line]
    assert warning.startswith(
        f"pvisor: warning: workspace {tmp_path / 'ws-other'} differs from the snapshot the handoff "
        "restored for "
        "child run child-2 (manifest "
    ), warning
    # pvisor's own Python API example, on this run
    code = own.replace('"journal.sqlite"', repr(str(tmp_path / "data" / "j.sqlite"))).replace(
        "r-3f2a9c0d1e2b", run
    )
    api = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert api.returncode == 0, api.stderr
    pause_step, through_step, snapshot_hash, _ = api.stdout.split(" ", 3)
    # progress 0.5 of 3 transitions: transition round(0.5 x 2) = 1, journal step 2
    assert (pause_step, through_step) == ("1", "2") and len(snapshot_hash) == 64
    assert sorted(p.name for p in (tmp_path / "ws-half").iterdir()) == ["a.txt", "link", "seed.txt"]


def test_continuation_example_runs_the_real_claude_code(tmp_path: Path):
    """docs/replay.md "Continuation / Try it offline": the recording of the replay-only example,
    then a second scripted model as the live one, as written, with no key in the environment."""
    import json

    from agent_helpers import entrypoint

    turns, live = _blocks(DOCS / "replay.md", "json")[:2]
    (tmp_path / "turns.json").write_text(turns)
    (tmp_path / "live.json").write_text(live)
    claude = entrypoint("claude-code")
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_AUTH_TOKEN"))}
    env.update(
        PATH=os.pathsep.join([str(claude.parent), os.path.dirname(sys.executable), os.environ["PATH"]]),
        PVISOR_JOURNAL=str(tmp_path / "data" / "j.sqlite"),
        HOME=str(tmp_path / "home"),
    )
    commands = _console_commands(DOCS / "replay.md")
    assert len(commands) == 9
    proc = subprocess.run(
        ["bash", "-ec", "\n".join(commands[:2] + commands[5:])],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ws4" / "hello.txt").read_text() == "hello\n" and (
        tmp_path / "ws4" / "live.txt"
    ).read_text() == "live\n"
    assert re.search(
        r"continued claude-code after step 1 of 3 as run r-[0-9a-f]+: 1 tool call\(s\) re-run, "
        r"1 of 1 observation\(s\) equal once normalised; prefix \S*out-live/prefix.json "
        r"\(\d+ bytes, ending with the observation\); request N\+1 "
        r"forwarded with boundary_prompt; 2 live step\(s\) from http://127.0.0.1:\d+; ended by agent",
        proc.stdout,
    ), proc.stdout
    doc = json.loads((tmp_path / "out-live" / "result.json").read_text())
    assert doc["status"] == "ok" and doc["boundary_user_prompt_injected"] is True
    # the README shows the same continuation
    readme = [
        line[2:]
        for block in _blocks(DOCS.parent / "README.md", "console")
        for line in block.splitlines()
        if line.startswith("$ ") and "out-live" in line
    ]
    assert readme == [commands[7]]


def test_replay_config_example_reads_and_python_api_example_binds(tmp_path: Path):
    """docs/replay.md's replay.toml is read by the loader as written, and the Python API example
    calls the functions with parameters they take."""
    import ast
    import inspect

    from pvisor import session
    from pvisor.replay.config import load_config

    [toml] = _blocks(DOCS / "replay.md", "toml")
    (tmp_path / "replay.toml").write_text(toml)
    cfg = load_config(tmp_path / "replay.toml")
    assert cfg.option("after_step", None) == 2 and cfg.option("max_steps", None) == 5
    assert cfg.option("workspace", None) == str(tmp_path / "ws-live")
    assert cfg.settings("claude-code").environment == {"MAX_THINKING_TOKENS": "1024"}
    assert cfg.settings("codex").model == "gpt-5-codex" and cfg.settings("qwen-code").arguments == []
    [code] = _blocks(DOCS / "replay.md", "python")
    tree = ast.parse(code)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("continue_run", "continue_many")
    ]
    assert len(calls) == 2
    for call in calls:
        fn = getattr(session, call.func.id)
        inspect.signature(fn).bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords})
    result_attrs = {"status", "derived_run", "live_steps", "ended_by", "prefix"}
    assert result_attrs <= set(dir(session.Result))


def test_readme_native_and_replay_examples_run_from_a_checkout(tmp_path: Path):
    """The README's `trajectory` and `replay` examples, run from a copy of the paths they name
    (tests/corpus/native/...), each with exit 0, writing what they say."""
    readme = DOCS.parent / "README.md"
    commands = [
        line[2:]
        for block in _blocks(readme, "console")
        for line in block.splitlines()
        if (line.startswith("$ pvisor trajectory") or line.startswith("$ pvisor replay"))
        and "--replay-only" not in line
    ]
    assert len(commands) == 4
    corpus = tmp_path / "tests" / "corpus"
    shutil.copytree(DOCS.parent / "tests" / "corpus" / "native", corpus / "native")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True, timeout=60)
        assert proc.returncode == 0, (command, proc.stderr.decode())
    assert b'"schema_version": "ATIF-v1.7"' in (tmp_path / "run.atif.json").read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "prefix.json",
        "prefix.request.json",
        "result.json",
    ]


def test_handoff_example_runs_the_real_claude_code_codex_and_gemini_cli(tmp_path: Path):
    """docs/handoff.md "Try it offline", as written, with the pinned Claude Code, Codex and Gemini
    CLI first on PATH: Claude Code's run handed to Codex after transition 4 prints the line the
    doc quotes, Codex's workspace ends as the pause's snapshot, every call is accounted for as
    the doc says, the child is filed under its parent; then the doc's Python hands the same run
    to Gemini CLI and prints what the doc says. The README's handoff line is one of the doc's."""
    import json

    from agent_helpers import entrypoint

    doc = DOCS / "handoff.md"
    [script] = _blocks(doc, "json")
    (tmp_path / "steps.json").write_text(script)
    bins = [str(entrypoint(a).parent) for a in ("claude-code", "codex", "gemini-cli")]
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_AUTH_TOKEN"))}
    env.update(
        PATH=os.pathsep.join([*bins, os.path.dirname(sys.executable), os.environ["PATH"]]),
        PVISOR_JOURNAL=str(tmp_path / "data" / "j.sqlite"),
        HOME=str(tmp_path / "home"),
    )
    commands = _console_commands(doc)
    assert len(commands) == 4
    proc = subprocess.run(
        ["bash", "-ec", "\n".join(commands)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [shown] = _blocks(doc, "text")
    pattern = re.escape(shown.strip()).replace(re.escape("r-..."), "r-[0-9a-f]+")
    pattern = pattern.replace(re.escape("prefix out-handoff/"), r"prefix \S*out-handoff/").replace(
        re.escape("..."), r"\d+"
    )
    assert re.search(pattern, proc.stdout), proc.stdout
    files = {p.name: p.read_text() for p in (tmp_path / "ws-handoff").iterdir()}
    assert files == {"hello.txt": "hello\n", "notes.txt": "one\nthree\n", "seed.txt": "seed\n"}
    doc_result = json.loads((tmp_path / "out-handoff" / "result.json").read_text())
    h = doc_result["handoff"]
    assert (doc_result["mode"], doc_result["status"], h["pause"]) == (
        "handoff",
        "ok",
        {"after_step": 5, "transition": 4},
    )
    assert [(c["step"], c["tool"], c["fate"], c["target_tool"]) for c in h["calls"]] == [
        (1, "Bash", "translated", "exec_command"),
        (2, "Write", "reproduced", "exec_command"),
        (3, "Edit", "reproduced", "exec_command"),
        (4, "Read", "translated", "exec_command"),
        (4, "Read", "translated", "exec_command"),
        (5, "TodoWrite", "rendered_as_text", None),
    ]
    assert h["carriers"] == [5] and h["read_tool"] is None and h["workspace"]["equal"] is True
    assert h["boundary_request"]["valid"] is True
    run = json.loads((tmp_path / "run.json").read_text())["run"]
    child = doc_result["derived_run"]
    assert re.search(rf"^{child} +codex +handoff +ended +{run}@5 ", proc.stdout, flags=re.M), proc.stdout
    # the doc's Python: the same run handed to Gemini CLI, whose reads become its read_file
    [code] = _blocks(doc, "python")
    api = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400
    )
    assert api.returncode == 0, api.stdout + api.stderr
    assert api.stdout.splitlines() == [
        "ok run_shell_command read_file",
        "1 Bash translated run_shell_command",
        "2 Write translated write_file",
        "3 Edit translated replace",
        "4 Read translated read_file",
        "4 Read translated read_file",
        "5 TodoWrite rendered_as_text None",
    ]
    # the README shows the same handoff
    readme = [c for c in _console_commands(README) if "pvisor handoff " in c]
    assert readme == [commands[2]]
