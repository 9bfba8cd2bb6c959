"""Shared fixtures: where the corpus lives, and the explicit switch that refreshes golden files."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

# the real-agent captures, one per agent per session, shared by every module that uses them
from agent_captures import captured, resumed  # noqa: F401  (pytest fixtures)
from harbor_helpers import harbor  # noqa: F401  (a pytest fixture)

REPO = Path(__file__).resolve().parents[1]

# A suite started in the background of a non-interactive shell (`./scripts/test &`) inherits
# SIGINT ignored, and every process it starts would too: the Ctrl-C tests (the batch, merge,
# replay and run commands) would then test nothing but the ignore. A handler of our own is
# reset to the default at exec, so the commands the tests start get Ctrl-C as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def cannot_run_here(reason: str) -> None:
    """A test whose machine lacks what it needs (setpriv, /dev/full, Linux /proc): skipped on a
    developer's machine, failed in CI (``CI`` set), where the machine must have it."""
    if os.environ.get("CI"):
        pytest.fail(f"CI machine cannot run this test: {reason}")
    pytest.skip(reason)


GOLDEN = REPO / "tests" / "golden"


def corpus_dir() -> Path:
    """tests/corpus, or $PVISOR_CORPUS (usable at collection time, for parametrising)."""
    env = os.environ.get("PVISOR_CORPUS")
    return Path(env) if env else REPO / "tests" / "corpus"


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite golden files under tests/golden from the current output instead of comparing",
    )
    parser.addoption(
        "--shuffle-seed",
        type=int,
        default=None,
        metavar="N",
        help="run the collected tests in a random order drawn from seed N (across files): a test that "
        "leans on another's cwd, environment, signal handlers or module state fails in some order",
    )


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle-seed")
    if seed is not None:
        import random

        random.Random(seed).shuffle(items)


def pytest_report_header(config):
    seed = config.getoption("--shuffle-seed")
    return None if seed is None else f"test order shuffled with --shuffle-seed {seed}"


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The test corpus (recorded wire streams, real agents' requests): tests/corpus, copied
    with its provenance, or $PVISOR_CORPUS. Missing corpus is a failure, never a skip."""
    path = corpus_dir()
    assert (path / "wire").is_dir() and (path / "requests").is_dir(), (
        f"corpus not found at {path}; set PVISOR_CORPUS to the shared corpus directory"
    )
    return path


@pytest.fixture(scope="session")
def update_goldens(request) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture
def golden(update_goldens):
    """``golden(relpath, actual_bytes)``: compare with tests/golden/relpath, or write it when
    pytest runs with --update-goldens. A missing golden file fails."""

    def check(relpath: str, actual: bytes) -> None:
        path = GOLDEN / relpath
        if update_goldens:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(actual)
            return
        assert path.exists(), f"golden file {path} missing; run pytest --update-goldens to create it"
        expected = path.read_bytes()
        assert actual == expected, f"output differs from golden file {path}"

    return check


@pytest.fixture(scope="session")
def loop_thread():
    """One asyncio loop in a background thread for the whole session (servers under test)."""
    from harness import LoopThread

    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture
def stack(loop_thread, tmp_path):
    """Start gateways, scripted model servers and raw upstreams; all stopped at teardown."""
    from harness import Stack

    s = Stack(loop_thread, tmp_path)
    yield s
    s.close()


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)``: a new directory on a tmpfs of ``size`` (``"1m"``), mounted for the test
    and unmounted after it: a full file system, for real (root can mount here; elsewhere the
    test cannot run, and fails in CI)."""
    mounted: list[Path] = []

    def make(size: str = "1m") -> Path:
        where = tmp_path / f"small-fs-{len(mounted)}"
        where.mkdir()
        p = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            cannot_run_here(f"cannot mount a tmpfs: {p.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def procs():
    """``procs(args, command=None, env=None)``: a pvisor process with its output read line by
    line (test_gateway_cli.Proc), killed at the end of the test."""
    from test_gateway_cli import Proc

    started: list = []

    def start(args: list[str], command: list[str] | None = None, env: dict[str, str] | None = None):
        started.append(Proc(args, command, env))
        return started[-1]

    yield start
    for p in started:
        p.kill()


# the scan for pieces of keys after every test module that sends some (tests/secret_scan.py)
from secret_scan import no_secret_in_what_pvisor_wrote, secret_windows  # noqa: E402, F401
