"""Memory and CPU limits of a run's agent through a cgroup of its own (``--sandbox-memory``,
``--sandbox-cpus``; docs/replay.md, "Limits: memory and CPU").

A sandbox stops writes, reads and connections, not a recorded call that allocates without end or
spins. Where the kernel's cgroups are writable, pvisor makes a cgroup for the run,
``pvisor-<run id>``, below its own cgroup (so that every limit pvisor itself runs under still
holds), sets the limits there, puts the agent's process in it before the agent's program starts
(everything the agent starts is born inside), and removes it after the run, once whatever is
left in it is killed.

Two kinds of hierarchy are read (the kernel's cgroup documentation,
Documentation/admin-guide/cgroup-v1/memory.rst, cgroup-v1/cfs-bandwidth and cgroup-v2.rst):

- **cgroup v2** (a unified hierarchy at ``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` beside
  v1): used when pvisor's own cgroup there offers the controllers needed (``cgroup.controllers``)
  and enables them for its children (``cgroup.subtree_control``, which pvisor tries to write:
  systemd's ``Delegate=yes`` does it); files ``memory.max`` (and ``memory.swap.max`` 0),
  ``cpu.max`` (quota and period in µs), ``memory.events`` (``max``, ``oom_kill``),
  ``memory.peak``, ``cpu.stat`` (``nr_throttled``, ``throttled_usec``), ``cgroup.kill``.
- **cgroup v1** (a hierarchy per controller, ``/sys/fs/cgroup/memory`` and
  ``/sys/fs/cgroup/cpu``, the controller named in ``/proc/self/cgroup``): files
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, swap included, where the
  kernel accounts swap), ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``, ``memory.failcnt``,
  ``memory.oom_control`` (``oom_kill``), ``memory.max_usage_in_bytes``, ``cpu.stat``
  (``nr_throttled``, ``throttled_time`` in ns).

v2 is preferred when it has every controller the limits need; else v1; else
:class:`~pvisor.core.errors.UnavailableError` (exit 69) in one line naming the option and why.

Use (the launch side)::

    limits = ResourceLimits(memory=parse_size("2G"), cpus=parse_cpus("1.5"))
    with RunCgroup.create(run_id, limits) as cg:     # UnavailableError (69): no cgroup here
        proc = subprocess.Popen(argv, preexec_fn=cg.enter)   # or cg.add(pid) right after start
        proc.wait()
    report = cg.report            # LimitsReport: what the result says (memory_limit_hit, ...)
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from pvisor.core.errors import UnavailableError, UsageError

# the values are read in core (replay.toml reads them too); named here, where they are used
from pvisor.core.resources import MIN_CPUS as MIN_CPUS
from pvisor.core.resources import MIN_MEMORY as MIN_MEMORY
from pvisor.core.resources import cpu_share, size_bytes

#: where the kernel's cgroup hierarchies are mounted
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: the CFS period pvisor sets (the kernel's default, 100 ms), in µs; a quota is a share of it
CPU_PERIOD_US = 100_000
#: how long :meth:`RunCgroup.close` keeps killing what is left in the cgroup (new forks included)
KILL_DEADLINE_S = 5.0


class LimitsUnavailable(UnavailableError):
    """No cgroup for the run's limits can be made here (exit 69; a replay's result code
    ``limits_unavailable``)."""

    code = "limits_unavailable"


class CgroupVersion(Enum):
    """The kind of hierarchy a run's cgroup is made in."""

    V1 = "v1"
    V2 = "v2"


def parse_size(text: str, option: str = "--sandbox-memory") -> int:
    """Bytes of a size written ``2G``, ``512M``, ``1.5g``, ``64MiB``, ``300k`` or ``1048576``
    (:func:`pvisor.core.resources.size_bytes`). UsageError (exit 2) naming ``option`` for
    anything else, or for less than :data:`MIN_MEMORY`."""
    try:
        return size_bytes(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r}: {exc}") from None


def parse_cpus(text: str, option: str = "--sandbox-cpus") -> float:
    """The CPUs of ``--sandbox-cpus N`` (``0.5``, ``2``; :func:`pvisor.core.resources.cpu_share`):
    the share of one CPU's time per period the agent's processes may use together. UsageError
    (exit 2) naming ``option`` for anything but a number of at least :data:`MIN_CPUS`."""
    try:
        return cpu_share(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r}: {exc}") from None


@dataclass(frozen=True)
class ResourceLimits:
    """What a run's cgroup limits: ``memory`` in bytes (swap included where the kernel accounts
    it), ``cpus`` as a number of CPUs (a CFS quota of ``cpus`` × the period); None: no limit."""

    memory: int | None = None
    cpus: float | None = None

    @property
    def controllers(self) -> tuple[str, ...]:
        """The cgroup controllers these limits need (``memory``, ``cpu``)."""
        return tuple(c for c, v in (("memory", self.memory), ("cpu", self.cpus)) if v is not None)

    def option_of(self, controller: str) -> str:
        """The option that asked for ``controller`` (for errors)."""
        return "--sandbox-memory" if controller == "memory" else "--sandbox-cpus"


@dataclass
class LimitsReport:
    """What a run's cgroup saw, read just before it was removed (what the result says).

    Fields: ``version`` of the hierarchy; ``cgroup`` its path (of the memory controller's, else
    the cpu's, for v1); ``memory_limit`` bytes and ``cpus`` as set (None: not limited);
    ``memory_peak`` the most bytes charged at once (None where the kernel does not say);
    ``memory_limit_hit`` whether the limit was reached (v1 ``memory.failcnt`` or
    ``memory.memsw.failcnt``, v2 ``memory.events`` ``max``: the kernel had to reclaim or refuse;
    or an OOM kill); ``oom_kills`` the processes
    the kernel killed for it (``oom_kill``); ``cpu_throttled`` the periods the quota held the
    processes back (``nr_throttled``) and ``cpu_throttled_us`` for how long in all, µs;
    ``processes_killed`` what was still running in it at the end and was killed."""

    version: CgroupVersion
    cgroup: str
    memory_limit: int | None = None
    cpus: float | None = None
    memory_peak: int | None = None
    memory_limit_hit: bool = False
    oom_kills: int = 0
    cpu_throttled: int = 0
    cpu_throttled_us: int = 0
    processes_killed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version.value,
            "cgroup": self.cgroup,
            "memory_limit": self.memory_limit,
            "cpus": self.cpus,
            "memory_peak": self.memory_peak,
            "memory_limit_hit": self.memory_limit_hit,
            "oom_kills": self.oom_kills,
            "cpu_throttled": self.cpu_throttled,
            "cpu_throttled_us": self.cpu_throttled_us,
            "processes_killed": self.processes_killed,
        }


@dataclass
class CgroupSupport:
    """Where a run's cgroup can be made: ``version`` and, per controller needed, the directory
    (pvisor's own cgroup in that controller's hierarchy) it is made below; or ``version`` None
    and ``reason``, one sentence on why not."""

    version: CgroupVersion | None
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""


def _own_cgroups(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
    """(v1 controller -> pvisor's cgroup path, v2 path or None) from ``/proc/self/cgroup``
    (``4:memory:/a/b``, ``2:cpu,cpuacct:/``, ``0::/user.slice``)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if parts[0] == "0" and controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v1, v2


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _v2_support(root: Path, path: str | None, needed: tuple[str, ...]) -> CgroupSupport:
    mount = root if (root / "cgroup.controllers").is_file() else root / "unified"
    if path is None or not (mount / "cgroup.controllers").is_file():
        return CgroupSupport(None, reason="no cgroup v2 hierarchy")
    own = mount / path.lstrip("/")
    if not _writable_dir(own):
        return CgroupSupport(None, reason=f"pvisor's cgroup v2 {own} is not writable")
    offered = _words(own / "cgroup.controllers")
    missing = [c for c in needed if c not in offered]
    if missing:
        return CgroupSupport(None, reason=f"cgroup v2 offers no {', '.join(missing)} controller at {own}")
    enabled = _words(own / "cgroup.subtree_control")
    want = [c for c in needed if c not in enabled]
    if want:
        try:
            # refused (EBUSY) when pvisor's cgroup holds processes and is not the root: v2 lets
            # only a cgroup without processes hand controllers down (a delegated one has them)
            (own / "cgroup.subtree_control").write_text(" ".join("+" + c for c in want))
        except OSError as exc:
            return CgroupSupport(
                None,
                reason=f"cgroup v2 does not enable {', '.join(want)} for the children of {own} "
                f"({os.strerror(exc.errno or 0)}; run pvisor in a delegated cgroup, e.g. systemd-run "
                "--user --scope -p Delegate=yes)",
            )
    return CgroupSupport(CgroupVersion.V2, {c: own for c in needed})


def _v1_support(root: Path, paths: dict[str, str], needed: tuple[str, ...]) -> CgroupSupport:
    parents: dict[str, Path] = {}
    for c in needed:
        mount = root / c
        if c not in paths or not mount.is_dir():
            return CgroupSupport(None, reason=f"no cgroup v1 {c} controller mounted at {mount}")
        own = mount / paths[c].lstrip("/")
        if not _writable_dir(own):
            return CgroupSupport(None, reason=f"pvisor's cgroup v1 {own} is not writable")
        parents[c] = own
    return CgroupSupport(CgroupVersion.V1, parents)


def detect(limits: ResourceLimits, root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> CgroupSupport:
    """Where a cgroup with ``limits`` can be made on this machine: v2 when pvisor's own v2 cgroup
    offers and hands down every controller needed, else v1 when each controller's hierarchy is
    mounted and pvisor's cgroup there writable, else the reason (v2's and v1's). ``root``: where
    the hierarchies are mounted; ``proc_cgroup``: the text of ``/proc/self/cgroup`` (read when
    None). Nothing is made here but, for v2, the controllers enabled for pvisor's children."""
    needed = limits.controllers
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    v1_paths, v2_path = _own_cgroups(proc_cgroup)
    if not needed:
        return CgroupSupport(None, reason="no limit asked for")
    v2 = _v2_support(root, v2_path, needed)
    if v2.version is not None:
        return v2
    v1 = _v1_support(root, v1_paths, needed)
    if v1.version is not None:
        return v1
    return CgroupSupport(None, reason=f"{v2.reason}, and {v1.reason}")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _stat(path: Path) -> dict[str, int]:
    """``key value`` lines (``cpu.stat``, ``memory.events``, ``memory.oom_control``) as a dict."""
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class RunCgroup:
    """A run's cgroup, ``pvisor-<run id>``, made by :meth:`create` with its limits set.

    Put the agent's process in it with :meth:`enter` as the ``preexec_fn`` of its start (the
    child moves itself in before the agent's program runs: nothing it starts escapes) or with
    :meth:`add` right after the start (the sandbox's ``bwrap``, before it starts the agent).
    :meth:`close` (also on leaving a ``with``) kills what is left in it, reads the
    :class:`LimitsReport` (``report``) and removes it; it never raises."""

    def __init__(self, version: CgroupVersion, dirs: dict[str, Path], limits: ResourceLimits):
        self.version = version
        #: controller -> the cgroup's directory (v2: one directory for all)
        self.dirs = dirs
        self.limits = limits
        self.report: LimitsReport | None = None
        self._fds: list[int] = []

    @classmethod
    def create(
        cls, run_id: str, limits: ResourceLimits, root: Path = CGROUP_ROOT, proc_cgroup: str | None = None
    ) -> "RunCgroup":
        """Make ``pvisor-<run_id>`` where :func:`detect` says, with ``limits`` set. Raises
        :class:`LimitsUnavailable` (exit 69), one line naming the option and why, when no cgroup can be
        made or a limit cannot be set (what was made is removed)."""
        support = detect(limits, root, proc_cgroup)
        if support.version is None:
            option = " and ".join(limits.option_of(c) for c in limits.controllers) or "a limit"
            raise LimitsUnavailable(
                f"{option} needs a writable cgroup: {support.reason} (docs/replay.md, "
                '"Limits: memory and CPU")'
            )
        name = f"pvisor-{run_id}"
        dirs: dict[str, Path] = {}
        made: list[Path] = []
        cg = cls(support.version, dirs, limits)
        try:
            for controller, parent in support.parents.items():
                d = parent / name
                if d not in made:
                    d.mkdir()
                    made.append(d)
                dirs[controller] = d
            cg._set_limits()
            cg._fds = [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in made]
        except OSError as exc:
            cg.close()
            why = os.strerror(exc.errno) if exc.errno else type(exc).__name__
            where = exc.filename or (made[-1] if made else next(iter(support.parents.values())))
            raise LimitsUnavailable(f"cannot set up the run's cgroup {where}: {why}") from None
        return cg

    def _set_limits(self) -> None:
        mem, cpus = self.limits.memory, self.limits.cpus
        if self.version is CgroupVersion.V2:
            d = next(iter(self.dirs.values()))
            if mem is not None:
                (d / "memory.max").write_text(str(mem))
                _try_write(d / "memory.swap.max", "0")  # the limit is the memory's: no swap beyond it
            if cpus is not None:
                (d / "cpu.max").write_text(f"{round(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
            return
        if mem is not None:
            d = self.dirs["memory"]
            (d / "memory.limit_in_bytes").write_text(str(mem))
            # swap included where the kernel accounts it (never below limit_in_bytes)
            _try_write(d / "memory.memsw.limit_in_bytes", str(mem))
        if cpus is not None:
            d = self.dirs["cpu"]
            (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(round(cpus * CPU_PERIOD_US)))

    def __enter__(self) -> "RunCgroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def enter(self) -> None:
        """Move the calling process into the cgroup: the ``preexec_fn`` of the agent's start
        (``subprocess.Popen``, ``asyncio.create_subprocess_exec``), run in the child between
        fork and exec. It only writes its pid to descriptors opened by :meth:`create` (nothing
        is allocated or locked there). A failure fails the start (``SubprocessError``)."""
        pid = str(os.getpid()).encode()
        for fd in self._fds:
            os.write(fd, pid)

    def add(self, pid: int) -> None:
        """Move process ``pid`` into the cgroup (its children born after this are inside too).
        OSError when it cannot be moved (the process is gone)."""
        for fd in self._fds:
            os.write(fd, str(pid).encode())

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        seen: set[int] = set()
        for d in set(self.dirs.values()):
            try:
                seen.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(seen)

    def close(self) -> LimitsReport:
        """Kill what is left in the cgroup (SIGKILL, again for what it forked meanwhile, for at
        most :data:`KILL_DEADLINE_S`), read the :class:`LimitsReport`, remove the cgroup and
        close its descriptors. Idempotent; never raises (a cgroup that cannot be removed stays,
        empty, under pvisor's own)."""
        if self.report is not None:
            return self.report
        killed = self._kill_all()
        self.report = self._read_report(killed)
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        for d in set(self.dirs.values()):
            _remove(d)
        return self.report

    def _kill_all(self) -> int:
        killed: set[int] = set()
        d = next(iter(self.dirs.values()), None)
        if d is not None and self.version is CgroupVersion.V2 and (d / "cgroup.kill").exists():
            pids = self.pids()
            if pids and _try_write(d / "cgroup.kill", "1"):
                killed.update(pids)
        deadline = time.monotonic() + KILL_DEADLINE_S
        while True:
            pids = [p for p in self.pids() if p != os.getpid()]
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        return len(killed)

    def _read_report(self, killed: int) -> LimitsReport:
        mem, cpu = self.dirs.get("memory"), self.dirs.get("cpu")
        shown = mem or cpu
        report = LimitsReport(
            self.version,
            str(shown) if shown else "",
            memory_limit=self.limits.memory,
            cpus=self.limits.cpus,
            processes_killed=killed,
        )
        if mem is not None:
            if self.version is CgroupVersion.V2:
                events = _stat(mem / "memory.events")
                report.oom_kills = events.get("oom_kill", 0)
                report.memory_limit_hit = any(events.get(k, 0) for k in ("max", "oom", "oom_kill"))
                report.memory_peak = _number(mem / "memory.peak")
            else:
                report.oom_kills = _stat(mem / "memory.oom_control").get("oom_kill", 0)
                # the charge failed against the limit, or against the limit swap included (the
                # kernel counts one or the other), or the OOM killer acted
                failed = [_number(mem / f) or 0 for f in ("memory.failcnt", "memory.memsw.failcnt")]
                report.memory_limit_hit = any(failed) or report.oom_kills > 0
                report.memory_peak = _number(mem / "memory.max_usage_in_bytes")
        if cpu is not None:
            stat = _stat(cpu / "cpu.stat")
            report.cpu_throttled = stat.get("nr_throttled", 0)
            report.cpu_throttled_us = (
                stat.get("throttled_usec", 0)
                if self.version is CgroupVersion.V2
                else stat.get("throttled_time", 0) // 1000
            )
        return report


def _try_write(path: Path, value: str) -> bool:
    """Write ``value`` to a cgroup file that may not exist here (swap accounting off); whether
    it was written."""
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def _remove(d: Path) -> None:
    """Remove an empty cgroup directory; the kernel may still hold it for a moment after its
    last process died (EBUSY), so it is tried again for up to a second."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return
            time.sleep(0.01)
