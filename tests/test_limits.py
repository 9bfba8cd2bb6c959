"""Memory and CPU limits through a cgroup of the run's own (session/limits.py; docs/replay.md
"Limits: memory and CPU").

Real cgroups of this machine (cgroup v1 ``memory`` and ``cpu`` here and in CI; v2 where the
machine offers it), real child processes: one that allocates past its limit is killed by the
kernel and the report says the limit was hit; one that spins under a 0.2-CPU quota is throttled
(the kernel's ``nr_throttled`` counter, polled with a deadline: nothing is timed). A machine
whose cgroups cannot be written fails these tests (never skips them); the refusal where no
cgroup is writable is tried on an empty hierarchy root.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cannot_run_here

from pvisor.core.errors import UnavailableError, UsageError
from pvisor.session.limits import (
    CgroupVersion,
    ResourceLimits,
    RunCgroup,
    detect,
    parse_cpus,
    parse_size,
)

DEADLINE = 30.0
MIB = 1024 * 1024


def make(run: str, limits: ResourceLimits) -> RunCgroup:
    """The run's cgroup on this machine; the test fails (cannot_run_here) where none can be made."""
    support = detect(limits)
    if support.version is None:
        cannot_run_here(f"no writable cgroup for {limits.controllers}: {support.reason}")
    return RunCgroup.create(run, limits)


def wait_for(what: str, check, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"{what} not seen within {deadline:g} s")


def test_sizes_and_cpus_are_parsed_or_refused_in_one_line():
    assert parse_size("2G") == 2 * 1024**3
    assert parse_size("512M") == 512 * MIB
    assert parse_size("1.5g") == int(1.5 * 1024**3)
    assert parse_size("64MiB") == 64 * MIB
    assert parse_size("8192k") == 8 * MIB
    assert parse_size(str(16 * MIB)) == 16 * MIB
    assert parse_cpus("0.5") == 0.5 and parse_cpus("2") == 2.0
    for bad in ("", "2X", "-1G", "G", "1M"):
        with pytest.raises(UsageError) as err:
            parse_size(bad)
        assert (
            err.value.exit_code == 2 and "--sandbox-memory" in str(err.value) and "\n" not in str(err.value)
        )
    for bad in ("0", "0.001", "-1", "nan", "inf", "two"):
        with pytest.raises(UsageError) as err:
            parse_cpus(bad)
        assert err.value.exit_code == 2 and "--sandbox-cpus" in str(err.value)


def test_a_process_past_its_memory_limit_is_killed_and_the_report_says_so():
    limits = ResourceLimits(memory=parse_size("64M"))
    cg = make("t-memory", limits)
    with cg:
        d = cg.dirs["memory"]
        assert d.name == "pvisor-t-memory" and d.is_dir()
        # the run's cgroup is below pvisor's own: the limits pvisor runs under still hold
        own = {
            line.split(":", 2)[1]: line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().split()
        }
        if cg.version is CgroupVersion.V1:
            assert d.parent == Path("/sys/fs/cgroup/memory") / own["memory"].lstrip("/")
        else:
            assert str(d.parent).endswith(own[""].rstrip("/")) and d.parent.is_dir()
        child = subprocess.Popen(
            [sys.executable, "-c", "b = []\nwhile True: b.append(b'x' * (8 << 20))"], preexec_fn=cg.enter
        )
        code = child.wait(timeout=DEADLINE)
    report = cg.report
    assert report is not None
    assert code == -9  # the kernel's OOM killer, not a MemoryError of Python's
    assert report.memory_limit == 64 * MIB and report.memory_limit_hit and report.oom_kills >= 1
    assert report.memory_peak is None or report.memory_peak <= 64 * MIB
    assert not d.exists()
    assert report.to_json()["memory_limit_hit"] is True


def test_a_busy_loop_under_a_fifth_of_a_cpu_is_throttled_and_killed_at_the_end():
    limits = ResourceLimits(cpus=parse_cpus("0.2"))
    cg = make("t-cpu", limits)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=cg.enter)
    try:
        d = cg.dirs["cpu"]
        if cg.version is CgroupVersion.V1:
            assert (d / "cpu.cfs_quota_us").read_text().split() == ["20000"]
        else:
            assert (d / "cpu.max").read_text().split() == ["20000", "100000"]
        assert cg.pids() == [spinner.pid]

        def throttled() -> bool:
            stat = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())
            return int(stat.get("nr_throttled", 0)) >= 3

        wait_for("throttling of the busy loop", throttled)
    finally:
        report = cg.close()
    assert spinner.wait(timeout=DEADLINE) == -9  # left running: killed by close()
    assert report.cpu_throttled >= 3 and report.cpu_throttled_us > 0 and report.processes_killed == 1
    assert not d.exists()


def test_a_process_added_after_its_start_brings_what_it_starts_later():
    cg = make("t-add", ResourceLimits(memory=parse_size("256M")))
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys\nsys.stdin.readline()\n"
            "p = subprocess.Popen(['sleep', '60'])\nprint(p.pid, flush=True)\np.wait()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        cg.add(parent.pid)
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        grandchild = int(parent.stdout.readline())
        assert sorted(cg.pids()) == sorted([parent.pid, grandchild])
    finally:
        report = cg.close()
    assert parent.wait(timeout=DEADLINE) == -9
    assert report.processes_killed == 2 and not report.memory_limit_hit
    assert (
        not Path(f"/proc/{grandchild}").exists()
        or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
    )
    assert cg.close() is report  # idempotent


def test_without_a_writable_cgroup_the_limit_is_refused_with_exit_69(tmp_path):
    limits = ResourceLimits(memory=parse_size("2G"), cpus=1.0)
    with pytest.raises(UnavailableError) as err:
        RunCgroup.create("t-none", limits, root=tmp_path, proc_cgroup="4:memory:/\n1:cpu:/\n0::/\n")
    message = str(err.value)
    assert err.value.exit_code == 69 and "\n" not in message
    assert message.startswith("--sandbox-memory and --sandbox-cpus needs a writable cgroup: ")
    assert "no cgroup v2 hierarchy" in message and "memory controller" in message
    assert list(tmp_path.iterdir()) == []


def test_cgroup_v2_is_preferred_where_it_hands_the_controllers_down(tmp_path):
    """The v2 checks read the hierarchy's own files (``cgroup.controllers``,
    ``cgroup.subtree_control``): a directory tree laid out as the kernel lays out a delegated
    cgroup stands in for one (this machine's v2 hierarchy has no controller to hand down)."""
    own = tmp_path / "user.slice" / "pvisor.scope"
    own.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    limits = ResourceLimits(memory=MIB * 64, cpus=0.5)
    support = detect(limits, root=tmp_path, proc_cgroup="0::/user.slice/pvisor.scope\n")
    assert support.version is CgroupVersion.V2 and support.parents == {"memory": own, "cpu": own}
    assert (own / "cgroup.subtree_control").read_text() == "+memory +cpu"
    (own / "cgroup.controllers").write_text("pids\n")
    refused = detect(limits, root=tmp_path, proc_cgroup="0::/user.slice/pvisor.scope\n")
    assert refused.version is None and "cgroup v2 offers no memory, cpu controller" in refused.reason
