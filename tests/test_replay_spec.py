"""``ReplaySpec`` (pvisor/replay/spec.py): every replay option declared once, and one check that
finds every problem of an invocation before anything runs.

Through the seam, as mitmproxy's test_serverplayback.py does: the click command of ``pvisor
replay``, replay.toml's keys and ``continue_run``'s keywords are each compared with the table;
an invocation with three mistakes that each used to stop the command on its own (a round each)
reports all three at once, with the exit code of the first in the order usage (2), source (65),
environment (69), and a result.json whose ``errors`` lists them all."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import jsonschema
import pytest

from native_helpers import native_dir
from replay_helpers import recorded_claude_run
from pvisor.core.errors import BadInputError, UnavailableError, UsageError

REPO = Path(__file__).resolve().parents[1]
PVISOR = Path(sys.executable).with_name("pvisor")
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())


def test_every_option_of_pvisor_replay_comes_from_the_spec_and_back():
    from pvisor.commands.replay import replay
    from pvisor.replay.spec import CLI_OPTIONS

    params = {p.name: p for p in replay.params if p.name != "help"}
    assert list(params) == [o.name for o in CLI_OPTIONS]  # the same options, in the order of --help
    for o in CLI_OPTIONS:
        p = params[o.name]
        assert isinstance(p, click.Option) and p.opts == [o.flag], o
        if o.shared is None:  # the shared flags' help is their decorator's (pvisor run has them too)
            assert p.help == o.help, o
            assert p.metavar == o.metavar, o
            assert p.is_flag == (o.kind == "flag"), o
        if o.choices:
            assert list(p.type.choices) == list(o.choices), o


def test_every_replay_toml_key_is_a_spec_option():
    from pvisor.replay.config import OPTION_KEYS
    from pvisor.replay.spec import BY_NAME, OPTIONS, TOML_OPTIONS

    assert OPTION_KEYS == tuple(o.toml for o in TOML_OPTIONS)
    assert OPTION_KEYS[:2] == ("agent", "run")  # the documented order, which messages list
    assert all(BY_NAME[o.name].toml in OPTION_KEYS for o in OPTIONS if o.toml is not None)


def test_the_python_api_takes_the_spec_api_names_and_the_records_its_fields():
    from pvisor.replay.prepare import PrepareOptions
    from pvisor.replay.spec import API_NAMES, BY_NAME
    from pvisor.session import continue_many, continue_run
    from pvisor.session.replay import ReplayOptions

    assert set(inspect.signature(continue_run).parameters) == set(API_NAMES)
    many = inspect.signature(continue_many).parameters
    assert {"source", "after_step", "upstream"} <= set(many) and "options" in many
    # the typed records are made from the spec: every field an option (or the record's own)
    assert set(PrepareOptions.__slots__) - {"option_notes"} <= set(BY_NAME)
    # and a handoff's own (pvisor handoff's options, not pvisor replay's)
    own = {
        "end_grace",
        "child_option",
        "source_agent",
        "strict_workspace",
        "restore_start",
        "reset_to_pause",
        "source_reasoning",
        "option_notes",  # the options' own warnings, found by the caller
        "private_env",  # a rollout's key_file variables (session/rollouts.py), never an option
    }
    assert {f.name for f in dataclasses.fields(ReplayOptions)} - own <= set(BY_NAME)


def test_the_spec_check_lists_every_option_problem():
    from pvisor.replay.spec import ReplayMode, ReplayProblems, ReplaySpec, in_order

    spec = ReplaySpec(
        {
            "agent": None,
            "after_step": 1,
            "output": None,
            "upstream": "http://127.0.0.1:1",
            "replay_only": True,
        },
        given={"upstream", "replay_only", "after_step"},
        mode=ReplayMode.REPLAY_ONLY,
    )
    assert [p.message for p in spec.check()] == [
        "missing option --agent (on the command line, or in --config)",
        "missing option --output (on the command line, or in --config)",
        "--upstream is for a continuation (no mode flag); --replay-only sends nothing to a live model",
    ]
    # the order of the exit codes: usage before source before environment, whatever the order found
    found = [UnavailableError("agent"), BadInputError("source"), UsageError("usage")]
    assert [p.message for p in in_order(found)] == ["usage", "source", "agent"]
    assert ReplayProblems(found).exit_code == 2
    assert ReplayProblems(found[:2]).exit_code == 65


def _env() -> dict[str, str]:
    # no provider key: a continuation to the public API finds none
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PVISOR_") and not k.endswith(("_API_KEY", "_AUTH_TOKEN"))
    }


def test_three_mistakes_are_reported_in_one_round(tmp_path: Path):
    """The documents' continuation with three mistakes, each of which used to stop the command
    alone: no key for the public API (usage, 2), a step past the run's two (source, 65), an
    agent executable that does not exist (environment, 69)."""
    journal = tmp_path / "j.sqlite"
    recorded = tmp_path / "recorded-ws"
    recorded.mkdir()
    run = recorded_claude_run(journal, recorded)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(PVISOR), "--journal", str(journal), "replay", "--agent", "claude-code", "--run", run,
         "--after-step", "3", "--workspace", str(ws), "--output", str(out),
         "--agent-entrypoint", str(tmp_path / "no-such-claude"), "--max-steps", "2"],
        capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pvisor: error:")]
    assert len(errors) == 3, proc.stderr
    assert "which needs ANTHROPIC_API_KEY in the environment" in errors[0]
    assert "after_step_out_of_range: --after-step 3: run r-rec has 2 steps (0 <= N <= 2)" in errors[1]
    assert f"--agent-entrypoint {tmp_path / 'no-such-claude'} does not exist" in errors[2]
    assert proc.returncode == 2  # the first's: usage before source before environment
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "failed" and result["agent_started"] is False
    assert [e["code"] for e in result["errors"]] == [
        "missing_api_key",
        "after_step_out_of_range",
        "agent_unavailable",
    ]
    assert result["boundary"]["steps_total"] == 2  # what the source told is kept
    assert not (out / "prefix.json").exists() and list(ws.iterdir()) == []


def test_prepare_only_reports_a_bad_workspace_and_a_step_out_of_range_at_once(tmp_path: Path, capsys):
    from pvisor.cli import main

    source = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "--prepare-only", "--agent", "codex", "--trajectory", str(source),
              "--after-step", "99", "--workspace", str(tmp_path / "nope"), "--output", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("pvisor: error:")]
    assert errors[0] == f"pvisor: error: --workspace {tmp_path / 'nope'}: no such directory", err
    assert errors[1].startswith("pvisor: error: after_step_out_of_range: --after-step 99"), err
    assert len(errors) == 2 and exit_.value.code == 2
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert [e["code"] for e in result["errors"]] == ["usage", "after_step_out_of_range"]


def test_continue_run_returns_every_problem_in_its_result(tmp_path: Path, monkeypatch):
    from pvisor.session import continue_run

    for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    journal = tmp_path / "j.sqlite"
    recorded = tmp_path / "recorded-ws"
    recorded.mkdir()
    run = recorded_claude_run(journal, recorded)
    ws = tmp_path / "ws"
    ws.mkdir()
    result = continue_run(
        run, 3, ws, journal=journal, output=tmp_path / "out", entrypoint=str(tmp_path / "no-such-claude")
    )
    assert result.exit_code == 2 and result.status == "failed"
    assert [e["code"] for e in result.document["errors"]] == [
        "missing_api_key",
        "after_step_out_of_range",
        "agent_unavailable",
    ]
    assert result.error is not None and len(result.error.splitlines()) == 3


def test_the_documented_command_with_three_mistakes_prints_the_documented_lines(tmp_path: Path):
    """docs/replay.md "Errors and exit codes": its example, run as written (RUN the recorded
    run, the journal from PVISOR_JOURNAL), prints its three lines and exits 2."""
    import re

    section = (REPO / "docs" / "replay.md").read_text().split("### Errors and exit codes", 1)[1]
    command = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0]
    printed = re.findall(r"```text\n(.*?)```", section, flags=re.S)[0]
    journal = tmp_path / "j.sqlite"
    (tmp_path / "recorded-ws").mkdir()
    run = recorded_claude_run(journal, tmp_path / "recorded-ws")
    (tmp_path / "ws").mkdir()
    env = {
        **_env(),
        "PATH": f"{PVISOR.parent}{os.pathsep}{os.environ['PATH']}",
        "PVISOR_JOURNAL": str(journal),
    }
    proc = subprocess.run(
        ["sh", "-c", command.replace("RUN", run)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    expected = printed.replace("RUN", run).replace("/path/to/", f"{tmp_path}/")
    assert proc.stderr == expected and proc.returncode == 2, proc.stderr
    codes = [e["code"] for e in json.loads((tmp_path / "out" / "result.json").read_text())["errors"]]
    assert codes == ["missing_api_key", "after_step_out_of_range", "agent_unavailable"]
