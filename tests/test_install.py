"""Installing this project as docs/install.md says, with no package index: the wheelhouse that
``scripts/wheelhouse`` builds (scripts/test builds it into dist/wheelhouse, or
``$PVISOR_WHEELHOUSE``) installs into a fresh virtual environment with ``--no-index``, and the
``pvisor`` it installs names this project and its commit and prepares a prefix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import REPO
from native_helpers import native_dir

ROLLOUT = "codex/real-0.171.0_single-then-resume.jsonl"


def head_commit() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    given = os.environ.get("PVISOR_WHEELHOUSE")
    path = Path(given) if given else REPO / "dist" / "wheelhouse"
    assert path.is_dir() and list(path.glob("pvisor_replay-*.whl")), (
        f"no wheelhouse of pvisor-replay at {path}: ./scripts/test builds it (scripts/wheelhouse DIR), "
        "or set PVISOR_WHEELHOUSE"
    )
    return path


def test_the_wheelhouse_installs_without_the_index_and_names_this_project(wheelhouse: Path, tmp_path: Path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # the machine's pip config may name extra indexes and find-links: --no-index overrides them all
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
         "--find-links", str(wheelhouse), "pvisor-replay"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pvisor = env_dir / "bin" / "pvisor"
    version = subprocess.run([str(pvisor), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"pvisor 0.1.0 (pvisor-replay, commit {head_commit()[:12]}"), (
        version.stdout
    )
    ident = json.loads(
        subprocess.run(
            [str(pvisor), "--version", "--json"], capture_output=True, text=True, cwd=tmp_path
        ).stdout
    )
    assert ident["distribution"] == "pvisor-replay" and ident["kind"] == "python"
    assert ident["executable"] == str(py)  # this venv's pvisor, not the test environment's

    out = tmp_path / "out"
    proc = subprocess.run(
        [str(pvisor), "replay", "--agent", "codex", "--trajectory", str(native_dir() / ROLLOUT),
         "--after-step", "1", "--prepare-only", "--output", str(out)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["pvisor"]["distribution"] == "pvisor-replay"
    assert result["pvisor"]["commit"].split("-")[0] == head_commit()

    # the same prefix as the test environment's pvisor writes
    from pvisor.replay import PrepareOptions, prepare_only

    here = prepare_only(
        PrepareOptions(
            agent="codex", after_step=1, output=tmp_path / "here", trajectory=native_dir() / ROLLOUT
        )
    )
    assert (out / "prefix.json").read_bytes() == here.prefix_path.read_bytes()
    assert sys.executable != str(py)


def test_wheelhouse_script_refuses_a_missing_directory_argument():
    proc = subprocess.run([str(REPO / "scripts" / "wheelhouse")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == "usage: scripts/wheelhouse DIR [EXTRA ...]"


def _fake_installed_agent(dest: Path, script: str) -> dict[str, str]:
    """A gemini-cli under ``dest`` whose pins are those of tests/agents (so nothing installs) and
    whose ``gemini --version`` is ``script``; the environment that points install-agents there."""
    stamp = subprocess.run(
        ["bash", "-c", "cat tests/agents/gemini-cli/* | sha256sum | cut -c1-16"],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout.strip()  # fmt: skip
    agent = dest / "gemini-cli"
    (agent / "node_modules" / ".bin").mkdir(parents=True)
    (agent / ".pinned").write_text(stamp + "\n")
    exe = agent / "node_modules" / ".bin" / "gemini"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return {**os.environ, "PVISOR_AGENTS_DIR": str(dest)}


def test_install_agents_tries_a_failed_version_check_again(tmp_path: Path):
    # the first start prints nothing and fails, as a CLI starved by a loaded machine did; the next answers
    calls = tmp_path / "calls"
    env = _fake_installed_agent(
        tmp_path / "agents",
        f'echo x >> {calls}\n[ "$(wc -l < {calls})" -ge 2 ] && echo 0.61.0 && exit 0\nexit 1\n',
    )
    proc = subprocess.run(
        [str(REPO / "scripts" / "install-agents"), "gemini-cli"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "gemini-cli 0.61.0"
    assert "gemini-cli: version check 1 of 3: exit status 1, printed ''" in proc.stderr
    assert calls.read_text().count("x") == 2


def test_install_agents_says_a_version_check_timed_out(tmp_path: Path):
    env = _fake_installed_agent(tmp_path / "agents", "sleep 30\n")
    env.update(PVISOR_AGENT_VERSION_TIMEOUT="1", PVISOR_AGENT_VERSION_TRIES="2")
    proc = subprocess.run(
        [str(REPO / "scripts" / "install-agents"), "gemini-cli"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1
    assert "gemini-cli: version check 2 of 2: timed out after 1 s, printed ''" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "gemini-cli: installed, but its version check failed 2 times (last: timed out after 1 s, "
        "printed ''), not the pinned 0.61.0"
    )


def _build_wheel(tmp_path: Path, commit: str) -> subprocess.CompletedProcess:
    """``pip wheel`` of this checkout (no dependencies) with ``$PVISOR_SOURCE_COMMIT=commit``."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", str(REPO),
         "-w", str(tmp_path / "wheels")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PVISOR_SOURCE_COMMIT": commit},
    )  # fmt: skip


def test_a_source_commit_that_is_no_commit_id_fails_the_build_in_one_line(tmp_path: Path):
    """setup.py puts $PVISOR_SOURCE_COMMIT into --version: a newline in it made two lines. It
    takes 7 to 40 hex digits with -dirty optional, and fails the build otherwise (docs/install.md)."""
    proc = _build_wheel(tmp_path, "abc1234\npvisor 9.9.9")
    assert proc.returncode != 0 and not list((tmp_path / "wheels").glob("*.whl"))
    lines = [ln.strip() for ln in proc.stderr.splitlines() if "PVISOR_SOURCE_COMMIT" in ln]
    assert lines == [
        "error: PVISOR_SOURCE_COMMIT='abc1234\\npvisor 9.9.9' is not a commit id: give 7 to 40 lowercase hex "
        "digits, -dirty optional (git rev-parse HEAD), or unset it to read the checkout's HEAD"
    ], proc.stderr
    # an abbreviated id with -dirty is one
    proc = _build_wheel(tmp_path, "abc1234-dirty")
    assert proc.returncode == 0, proc.stderr
    import zipfile

    (wheel,) = (tmp_path / "wheels").glob("pvisor_replay-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert "COMMIT = 'abc1234-dirty'\n" in z.read("pvisor/_build.py").decode()
