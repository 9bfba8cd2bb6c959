"""Each command loads only what it needs (issue 21), checked by import tracing, never by timing:
the real ``pvisor`` command runs in a child interpreter whose ``atexit`` hook writes
``sys.modules`` (the command's own fast exit runs ``atexit`` first), and the modules it loaded
beyond the stack floor (``import click, orjson``) are compared with what the command needs.
``replay --prepare-only`` of a native file loads its agent's adapter, descriptor and protocol
and no other agent's or protocol's; none of the short commands loads OpenSSL (``hashlib``),
SQLite where it reads no journal, zstd where it reads no body, pathlib (their paths are
strings), asyncio or aiohttp. Where the time goes: docs/benchmarks.md "Replay prepare-only:
fidelity and startup"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from native_helpers import native_dir

from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

#: loaded by no short command below (each test adds what its command must not load either)
NEVER = {
    "hashlib",
    "_hashlib",
    "hmac",
    "asyncio",
    "aiohttp",
    "jsonschema",
    "sqlite_utils",
    "tempfile",
    "shutil",
}
#: pathlib and what it brings (3.6 ms of a start, docs/benchmarks.md): the short commands take
#: their paths as strings
PATHLIB = {"pathlib", "urllib.parse", "ipaddress"}
NEVER |= PATHLIB
#: what click's gettext lookup loads at its first translated string (4.2M instructions, 2.4 % of
#: the floor): pvisor's commands make their help option, version option and path type without it
#: (pvisor/commands/base.py)
NEVER |= {"locale"}
#: what trajectory show loads of pvisor.replay: the episodes of a file, and their errors
EPISODES = {"episodes", "errors"}
#: the zstd bindings the journal's blobs use
ZSTD = {"backports.zstd", "compression.zstd", "_zstd"}


def floor_modules() -> set[str]:
    code = "import click, orjson, sys, json; print(json.dumps(sorted(sys.modules)))"
    return set(
        json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    )


FLOOR = floor_modules()


def loaded(tmp_path: Path, *args: str) -> set[str]:
    """The modules ``pvisor ARGS`` loaded beyond the floor; the command must succeed."""
    dump = tmp_path / "modules.json"
    code = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(dump)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
        "from pvisor.entry import main\n"  # the pvisor command's entry point (pyproject.toml)
        f"sys.argv = ['pvisor', *{list(args)!r}]\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(dump.read_text())) - FLOOR


#: the modules of pvisor.adapters.native that every format module imports (the interface,
#: warnings, the record reader, the trajectory assembly)
SHARED = {"base", "diagnostics", "jsonl", "assembly"}


def chain_of(module: str) -> set[str]:
    """The uuid chains' module for the two formats ordered by one (Claude Code, Qwen Code)."""
    return {"uuid_chain"} if module in ("claude_code", "qwen_code") else set()


def ours(modules: set[str], package: str) -> set[str]:
    """The modules directly in ``package`` (``pvisor.adapters.native`` -> ``codex``, ``base``)."""
    prefix = package + "."
    return {m[len(prefix) :] for m in modules if m.startswith(prefix) and "." not in m[len(prefix) :]}


def test_version_loads_the_cli_alone(tmp_path: Path):
    mods = loaded(tmp_path, "--version")
    assert {m for m in mods if m.startswith("pvisor")} <= {
        "pvisor",
        "pvisor._version",
        "pvisor._build",  # the commit the build recorded (setup.py): one constant
        "pvisor.entry",
        "pvisor.cli",
        "pvisor.commands",
        "pvisor.commands.base",
        "pvisor.core",
        "pvisor.core.errors",
    }, sorted(mods)
    assert not mods & (NEVER | ZSTD | {"sqlite3", "dataclasses"})


def test_journal_ls_reads_rows_without_bodies(tmp_path: Path):
    journal = tmp_path / "j.sqlite"
    with Journal.open(journal) as j:
        j.create_run(Run(id="r-1", agent="codex"))
        j.record_exchange(
            "r-1", "POST", "/v1/responses", [], protocol="openai-responses", status=200, request_body=b"{}"
        )
    mods = loaded(tmp_path, "--journal", str(journal), "journal", "ls")
    assert "sqlite3" in mods and "pvisor.journal.reader" in mods
    assert not mods & (
        NEVER | ZSTD | {"csv", "base64", "pvisor.journal.blobs", "pvisor.adapters", "pvisor.replay"}
    )


def test_trajectory_show_with_agent_loads_that_adapter_only(tmp_path: Path):
    path = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    mods = loaded(tmp_path, "trajectory", "show", str(path), "--agent", "codex")
    # signatures: a file in an interchange format (ATIF) is read by its reader whatever --agent says,
    # so its signature is asked; no other adapter is loaded
    assert ours(mods, "pvisor.adapters.native") <= {*SHARED, "codex", "spool", "render", "signatures"}, (
        sorted(mods)
    )
    assert not ours(mods, "pvisor.adapters.protocols") - {"base"}
    assert not mods & (NEVER | ZSTD | {"sqlite3", "pvisor.journal.reader"})
    # the episodes a file holds (docs/steps.md "Episodes") are listed by replay/episodes.py, alone
    assert ours(mods, "pvisor.replay") <= EPISODES, sorted(ours(mods, "pvisor.replay"))


@pytest.mark.parametrize(
    "module,path",
    [
        ("codex", "codex/real-0.171.0_single-then-resume.jsonl"),
        ("claude_code", "claude-code/spotter_tool_heavy.jsonl"),
        ("opencode", "opencode/real-1.18.33_export_single.json"),
        ("mini_swe_agent", "mini-swe-agent/real-2.4.6_single.traj.json"),
    ],
)
def test_trajectory_show_detected_loads_the_detected_adapter_only(tmp_path: Path, module: str, path: str):
    # detection asks each format's signature (adapters/native/signatures.py), not each adapter
    mods = loaded(tmp_path, "trajectory", "show", str(native_dir() / path))
    assert ours(mods, "pvisor.adapters.native") <= {
        *SHARED,
        *chain_of(module),
        "signatures",
        "documents",
        module,
        "spool",
        "render",
    }, sorted(mods)
    assert module in ours(mods, "pvisor.adapters.native")
    assert not mods & (NEVER | ZSTD | {"sqlite3", "pvisor.journal.reader"}), sorted(mods & (NEVER | ZSTD))
    assert ours(mods, "pvisor.replay") <= EPISODES, sorted(ours(mods, "pvisor.replay"))


@pytest.mark.parametrize(
    "agent,path",
    [
        ("claude-code", "claude-code/spotter_tool_heavy.jsonl"),
        ("codex", "codex/real-0.171.0_single-then-resume.jsonl"),
        ("gemini-cli", "gemini-cli/real-0.61.0_single-then-resume.jsonl"),
        ("qwen-code", "qwen-code/real-0.15.6_single-then-resume.jsonl"),
        ("opencode", "opencode/real-1.18.33_export_single.json"),
        ("mini-swe-agent", "mini-swe-agent/real-2.4.6_single.traj.json"),
    ],
)
def test_prepare_only_loads_one_agent_and_one_protocol(tmp_path: Path, agent: str, path: str):
    source = native_dir() / path
    if not source.exists():  # the corpus names its Qwen Code capture by version
        [source] = sorted((native_dir() / agent).glob("real-*single*"))[:1]
    out, ws = tmp_path / "out", tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "existing.txt").write_bytes(b"a file of the workspace\n")
    # a workspace is digested too: a few small files, no OpenSSL
    mods = loaded(
        tmp_path, "replay", "--agent", agent, "--trajectory", str(source), "--after-step", "1",
        "--prepare-only", "--output", str(out), "--workspace", str(ws),
    )  # fmt: skip
    protocol = orjson.loads((out / "result.json").read_bytes())["prefix"]["protocol"]
    module = agent.replace("-", "_")
    assert ours(mods, "pvisor.adapters.native") <= {
        *SHARED,
        *chain_of(module),
        "spool",
        "documents",
        "signatures",
        module,
    }, sorted(mods)
    assert ours(mods, "pvisor.adapters.agents") <= {"base", "descriptor", "effects", module}, sorted(mods)
    # its protocol and the protocol-neutral modules (the transcoder, convert, renders across
    # protocols and drops reasoning a signed protocol refuses); no other protocol
    assert ours(mods, "pvisor.adapters.protocols") <= {
        "base",
        "sse",
        "validate",
        "convert",
        protocol.replace("-", "_"),
    }
    assert not mods & (NEVER | ZSTD | {"sqlite3", "pvisor.journal.reader", "pvisor.adapters.chains"}), sorted(
        mods & (NEVER | ZSTD | {"sqlite3"})
    )
    # a native render's request carries pvisor's own header only; the result quotes each call's
    # arguments with key-shaped tokens redacted (journal/redact.py), which loads urllib.parse only
    # for text holding a "%" (NEVER above)
    assert "pvisor.journal.redact" in mods


def collector_at_exit(tmp_path: Path, command_module: str, *args: str) -> tuple[int, bool, int]:
    """For ``pvisor ARGS`` started through its entry point: (collections the cyclic collector ran
    before ``command_module`` was loaded, the collector on at the end?, objects frozen out of
    its collections at the end)."""
    dump = tmp_path / "gc.json"
    code = (
        "import atexit, gc, json, sys\n"
        "early = []\n"
        f"gc.callbacks.append(lambda phase, info: phase == 'start' and {command_module!r} not in sys.modules"
        " and early.append(info['generation']))\n"
        f"atexit.register(lambda: open({str(dump)!r}, 'w').write("
        "json.dumps([len(early), gc.isenabled(), gc.get_freeze_count()])))\n"
        "from pvisor.entry import main\n"
        f"sys.argv = ['pvisor', *{list(args)!r}]\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    early, enabled, frozen = json.loads(dump.read_text())
    return early, enabled, frozen


def test_the_entry_point_imports_with_the_collector_off_and_freezes_what_it_made(tmp_path: Path):
    # pvisor/entry.py: no collection while click, orjson and the command's modules are imported
    # (there were 20 in trajectory show before); a command that goes on runs with the collector
    # on, what the imports made frozen out of its collections
    path = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"
    early, enabled, frozen = collector_at_exit(
        tmp_path, "pvisor.commands.trajectory", "trajectory", "show", str(path)
    )
    assert (early, enabled) == (0, True) and frozen > 10_000, (early, enabled, frozen)
    # a fast-exit command keeps it off to the end
    out = tmp_path / "out"
    early, enabled, _ = collector_at_exit(
        tmp_path, "pvisor.commands.replay", "replay", "--agent", "codex", "--trajectory", str(path),
        "--after-step", "1", "--prepare-only", "--output", str(out),
    )  # fmt: skip
    assert (early, enabled) == (0, False) and (out / "prefix.json").is_file()
    # called as a library (argv given), pvisor.cli.main leaves the collector as it found it
    code = (
        "import gc, sys\n"
        "from pvisor.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(gc.isenabled(), gc.get_freeze_count())\n"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split()[-2:] == ["True", "0"], proc.stdout + proc.stderr
