"""The self-contained build (scripts/build-bundle, docs/install.md), as a user copies it into a
sandbox: the directory copied into an empty one and run with nothing of this environment (no
venv, ``PATH=/usr/bin:/bin``, a fresh ``HOME``). There it prepares a prefix from a native file
(byte-equal to the installed package's), captures a real agent against the scripted model and
replays that run; ``--version --json`` names the build (the executable's digest computed at run
time, the manifest's, the commit), every ``result.json`` names the same, and ``--version
--verify`` finds a changed, a removed and an added file.

The build is ``$PVISOR_BUNDLE`` when set (``./scripts/test`` builds it beside its other installs),
else made here once."""

from __future__ import annotations

import hashlib
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import entrypoint
from native_helpers import native_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ROLLOUT = "codex/real-0.171.0_single-then-resume.jsonl"


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    given = os.environ.get("PVISOR_BUNDLE")
    if given:
        path = Path(given)
        assert (path / "pvisor").is_file(), f"PVISOR_BUNDLE={given}: no pvisor executable there"
        return path
    out = tmp_path_factory.mktemp("bundle") / "pvisor"
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-bundle"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out)
    return out


@pytest.fixture()
def sandbox(build: Path, tmp_path: Path) -> Path:
    """An empty directory holding a copy of the build (``pvisor/``) and a fresh home."""
    shutil.copytree(build, tmp_path / "pvisor", symlinks=True)
    (tmp_path / "home").mkdir()
    return tmp_path


def run(
    sandbox: Path, *args: str, timeout: float = 300, path: str = "/usr/bin:/bin"
) -> subprocess.CompletedProcess:
    env = {"PATH": path, "HOME": str(sandbox / "home")}
    return subprocess.run(
        [str(sandbox / "pvisor" / "pvisor"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=sandbox,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def head_commit() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def test_version_json_names_the_build(sandbox: Path):
    proc = run(sandbox, "--version", "--json")
    assert proc.returncode == 0, proc.stderr
    ident = json.loads(proc.stdout)
    exe, manifest = sandbox / "pvisor" / "pvisor", sandbox / "pvisor" / "pvisor-manifest.json"
    assert ident["kind"] == "bundle" and ident["version"]
    assert ident["executable"] == str(exe) and ident["executable_sha256"] == sha256(exe)
    assert ident["manifest"] == str(manifest) and ident["manifest_sha256"] == sha256(manifest)
    listed = json.loads(manifest.read_text())
    assert listed["files"]["pvisor"] == sha256(exe)
    assert ident["commit"] == listed["commit"] and ident["commit"].split("-")[0] == head_commit()
    plain = run(sandbox, "--version")
    head, _, dirty = ident["commit"].partition("-")
    shown = head[:12] + (f"-{dirty}" if dirty else "")
    assert plain.returncode == 0
    assert plain.stdout.strip() == f"pvisor {ident['version']} (pvisor-replay, commit {shown})"


def test_prepare_only_in_the_sandbox_equals_the_installed_package(sandbox: Path, tmp_path: Path):
    source = native_dir() / ROLLOUT
    (sandbox / "empty").mkdir()  # nothing to run on PATH: no python, no shell
    proc = run(sandbox, "replay", "--agent", "codex", "--trajectory", str(source), "--after-step", "1",
               "--prepare-only", "--output", "out", path=str(sandbox / "empty"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from pvisor.replay import PrepareOptions, prepare_only

    here = prepare_only(
        PrepareOptions(agent="codex", after_step=1, output=tmp_path / "here", trajectory=source)
    )
    out = sandbox / "out"
    assert (out / "prefix.json").read_bytes() == here.prefix_path.read_bytes()
    assert (out / "prefix.request.json").read_bytes() == (
        tmp_path / "here" / "prefix.request.json"
    ).read_bytes()
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok"
    exe, manifest = sandbox / "pvisor" / "pvisor", sandbox / "pvisor" / "pvisor-manifest.json"
    assert result["pvisor"] == {
        "distribution": "pvisor-replay",
        "version": here.result["pvisor"]["version"],
        "kind": "bundle",
        "commit": json.loads(manifest.read_text())["commit"],
        "executable_sha256": sha256(exe),
        "manifest_sha256": sha256(manifest),
    }
    assert here.result["pvisor"]["kind"] == "python" and here.result["pvisor"]["manifest_sha256"] is None
    assert here.result["pvisor"]["commit"].split("-")[0] == head_commit()


#: a native file of each agent whose adapter, descriptor and wire protocol the build must hold
SOURCES = {
    "claude-code": "claude-code/spotter_tool_heavy.jsonl",
    "codex": ROLLOUT,
    "gemini-cli": "gemini-cli/real-0.61.0_single-then-resume.jsonl",
    "qwen-code": "qwen-code/real-*single*",
    "opencode": "opencode/real-1.18.33_export_single.json",
    "mini-swe-agent": "mini-swe-agent/real-2.4.6_single.traj.json",
}


def test_every_adapter_and_protocol_is_in_the_build(sandbox: Path, tmp_path: Path):
    from pvisor.replay import PrepareOptions, prepare_only

    protocols = set()
    for agent, pattern in SOURCES.items():
        [source] = sorted(native_dir().glob(pattern))[:1]
        proc = run(sandbox, "replay", "--agent", agent, "--trajectory", str(source), "--after-step", "1",
                   "--prepare-only", "--output", f"out-{agent}")  # fmt: skip
        assert proc.returncode == 0, (agent, proc.stderr)
        here = prepare_only(
            PrepareOptions(agent=agent, after_step=1, output=tmp_path / agent, trajectory=source)
        )
        assert (sandbox / f"out-{agent}" / "prefix.json").read_bytes() == here.prefix_path.read_bytes(), agent
        protocols.add(here.result["prefix"]["protocol"])
    assert protocols == {"anthropic", "openai-responses", "openai-chat", "gemini"}
    # detection asks every adapter, none may be missing from the build
    proc = run(sandbox, "trajectory", "show", str(native_dir() / ROLLOUT))
    assert proc.returncode == 0 and "detected format: codex" in proc.stderr, proc.stderr


def test_capture_and_replay_a_real_agent_in_the_sandbox(sandbox: Path):
    script = {
        "model": "mock-model",
        "seed": 7,
        "turns": [
            {"text": "First a file.", "tool_calls": [{"tool": "@shell", "command": "echo alpha > a.txt"}]},
            {"text": "Done."},
        ],
    }
    (sandbox / "s.json").write_text(json.dumps(script))
    (sandbox / "ws").mkdir()
    codex = str(entrypoint("codex"))
    proc = run(sandbox, "--journal", "j.sqlite", "run", "--agent", "codex", "--agent-entrypoint", codex,
               "--script", "s.json", "--workspace", "ws", "--json", "--", "write a.txt")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    captured = json.loads(proc.stdout)
    assert captured["exchanges"] == 2 and (sandbox / "ws" / "a.txt").read_text() == "alpha\n"
    (sandbox / "ws2").mkdir()
    proc = run(sandbox, "--journal", "j.sqlite", "replay", "--agent", "codex", "--run", captured["run"],
               "--after-step", "1", "--replay-only", "--workspace", "ws2", "--output", "out",
               "--agent-entrypoint", codex)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((sandbox / "out" / "result.json").read_text())
    assert result["status"] == "ok" and result["replayed_tool_calls"] == 1
    assert result["pvisor"]["kind"] == "bundle"
    assert result["pvisor"]["executable_sha256"] == sha256(sandbox / "pvisor" / "pvisor")
    assert (sandbox / "ws2" / "a.txt").read_text() == "alpha\n"
    # the replay ran in bwrap under the bundle's relay helper, the bundle bound back read-only
    # (it lies in /tmp, which the sandbox replaces)
    assert result["sandbox"]["mode"] == "bwrap"
    assert os.path.realpath(sandbox / "pvisor") in result["sandbox"]["read_only_bound_back"]
    # the journal the bundle wrote (through its writer process) reads back with the installed package
    from pvisor.journal.reader import JournalReader

    with JournalReader(sandbox / "j.sqlite") as reader:
        assert {r.id for r in reader.runs()} >= {captured["run"]}


def test_verify_finds_a_changed_a_removed_and_an_added_file(sandbox: Path):
    proc = run(sandbox, "--version", "--verify")
    assert proc.returncode == 0 and "matches its manifest" in proc.stdout, proc.stderr
    internal = sandbox / "pvisor" / "_internal"
    changed = next(p for p in sorted(internal.rglob("*.so*")) if p.is_file() and not p.is_symlink())
    removed = next(p for p in sorted(internal.rglob("*.py*")) if p.is_file())
    with open(changed, "ab") as fh:
        fh.write(b"\0")
    removed.unlink()
    (internal / "added.pth").write_text("import os\n")
    proc = run(sandbox, "--version", "--verify", "--json")
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is False
    rel = lambda p: p.relative_to(sandbox / "pvisor").as_posix()  # noqa: E731
    assert any(line.startswith(f"{rel(changed)}: changed") for line in report["problems"])
    assert any(line.startswith(f"{rel(removed)}: missing") for line in report["problems"])
    assert any(line.startswith("_internal/added.pth: not in") for line in report["problems"])
    assert len(report["problems"]) == 3
    assert (
        proc.stderr.splitlines()[-1].startswith("pvisor: error: the build at ") and "3 file(s)" in proc.stderr
    )


def test_a_pip_install_names_itself_and_its_commit_without_manifest(tmp_path: Path):
    installed = str(Path(sys.executable).with_name("pvisor"))
    proc = subprocess.run([installed, "--version", "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ident = json.loads(proc.stdout)
    assert ident["kind"] == "python" and ident["distribution"] == "pvisor-replay"
    assert ident["commit"].split("-")[0] == head_commit()  # what setup.py recorded as it built
    assert ident["manifest"] is None and ident["manifest_sha256"] is None
    assert ident["executable_sha256"] == sha256(Path(ident["executable"]))  # the interpreter, read now


def test_verify_outside_a_bundle_is_a_usage_error(tmp_path: Path):
    installed = str(Path(sys.executable).with_name("pvisor"))
    proc = subprocess.run([installed, "--version", "--verify"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "pvisor: error: not a bundle: --verify checks a build of scripts/build-bundle against its manifest"
    )


def test_the_copy_example_of_docs_install_md(build: Path, tmp_path: Path):
    """docs/install.md "Copy it into a sandbox", as written, with ``/opt`` in a temporary directory
    and ``dist`` the directory the build is in (the build itself is the fixture's, the same
    command)."""
    text = (REPO / "docs" / "install.md").read_text()
    [block] = re.findall(r"## Copy it into a sandbox.*?```console\n(.*?)```", text, flags=re.S)
    commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    assert len(commands) == 3
    opt = tmp_path / "opt"
    out = None
    for command in commands:
        shell = command.replace("/opt", str(opt)).replace("-C dist ", f"-C {build.parent} ")
        proc = subprocess.run(shell, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr)
        out = proc.stdout
    assert out is not None and f"every file of {opt / 'pvisor'} matches its manifest" in out
    assert build.name == "pvisor"


def test_bad_input_to_the_build_is_one_line(sandbox: Path):
    def one_line(proc, code: int, start: str) -> None:
        assert proc.returncode == code, proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(start), proc.stderr

    one_line(run(sandbox, "--pvisor-helper"), 2, "pvisor: error: --pvisor-helper: expected a helper name")
    one_line(
        run(sandbox, "--pvisor-helper", "nope"), 2, "pvisor: error: --pvisor-helper 'nope': not a helper"
    )
    one_line(
        run(sandbox, "--pvisor-helper", "writer", "1"),
        2,
        "pvisor: error: --pvisor-helper writer: 1 argument(s), expected 6",
    )
    one_line(
        run(sandbox, "--pvisor-helper", "writer", "a", "b", "c", "d", "e", "f"),
        2,
        "pvisor: error: --pvisor-helper writer: expected two pipe descriptors",
    )
    # the guard kills the group it is given when its stdin ends: never from a person's command line
    # (stdin is /dev/null here, not the pipe pvisor gives it), never group 1 or its own
    for group in ("abc", "0", "1", str(os.getpgrp()), "999999"):
        one_line(
            run(sandbox, "--pvisor-helper", "guard", group),
            2,
            "pvisor: error: --pvisor-helper guard: expected",
        )
    # the relay runs only with the descriptor of the configuration pvisor writes
    one_line(
        run(sandbox, "--pvisor-helper", "relay", "nope.json"),
        2,
        "pvisor: error: --pvisor-helper relay: expected the descriptor of the relay's configuration",
    )
    from pvisor.core.helpers import helper_refusal

    assert (
        helper_refusal("guard", ["1"]) is not None
        and helper_refusal("guard", [str(os.getpgrp())]) is not None
    )
    one_line(
        run(sandbox, "--version", "--json", "extra"),
        2,
        "pvisor: error: --version takes only --json and --verify",
    )
    proc = run(sandbox, "--json", "--version")  # in any order
    assert proc.returncode == 0 and json.loads(proc.stdout)["kind"] == "bundle"
    (sandbox / "pvisor" / "pvisor-manifest.json").write_text("{not json")
    one_line(run(sandbox, "--version", "--verify"), 3, "pvisor: error: ")
    assert "pvisor-manifest.json: not JSON" in run(sandbox, "--version", "--verify").stderr
    # the identity still prints: the manifest's digest, and the commit the package's build recorded
    proc = run(sandbox, "--version", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["commit"].split("-")[0] == head_commit()


def test_build_bundle_refuses_an_output_it_would_destroy(tmp_path: Path):
    """scripts/build-bundle replaces an earlier bundle only: a directory of other files, a
    file, the root or an empty value is refused before the build, one line, exit 2, nothing
    removed (it once replaced whatever --output held)."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.txt").write_text("keep")
    (tmp_path / "file").write_text("keep")
    script = str(REPO / "scripts" / "build-bundle")
    for output, says in [
        ("mine", "holds files and is not a bundle"),
        ("file", "exists and is not a directory"),
        ("file/sub", "cannot create it in"),
        ("/", "not the root"),
        ("", "--output needs a directory"),
    ]:
        proc = subprocess.run(
            [script, "--output", output], capture_output=True, text=True, cwd=tmp_path, timeout=60
        )
        assert proc.returncode == 2, (output, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and says in proc.stderr, (output, proc.stderr)
    assert (tmp_path / "mine" / "data.txt").read_text() == "keep" and (
        tmp_path / "file"
    ).read_text() == "keep"
    proc = subprocess.run([script, "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown argument --bogus" in proc.stderr
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert (
        proc.returncode == 0
        and proc.stdout.startswith("Build the pvisor command")
        and "set -e" not in proc.stdout
    )
