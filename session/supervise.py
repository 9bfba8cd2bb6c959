"""The agent's process group, supervised: what pvisor does so that an agent and everything it
started end with the run, also when pvisor itself is killed.

- :func:`become_subreaper`: pvisor adopts the orphans of its descendants (Linux
  ``prctl(PR_SET_CHILD_SUBREAPER)``), so a tool the agent started in a session of its own stays
  below pvisor.
- :func:`process_table` (``/proc/<pid>/stat``: pid -> (parent pid, state letter)) and
  :func:`descendants` (every process below a pid, with its state letter).
- :func:`end_group` (SIGTERM or SIGKILL to a process group) and :func:`stop_group` (SIGTERM,
  SIGKILL after :data:`KILL_GRACE_S` s or at once when hurried).
- :class:`GroupGuard`: a small process that kills the agent's group if pvisor dies first; in a
  bundle it is the ``guard`` helper of :mod:`pvisor.core.helpers`, :func:`guard_main`.
- :func:`end_strays`: every live descendant the agent left, SIGTERM then SIGKILL after
  :data:`STRAY_GRACE_S` s, reaped (:func:`reap_children`); :func:`exit_status` a return code as a
  shell reports it (128 + N after signal N).

Linux for the process table and the subreaper; elsewhere :func:`descendants` is empty and
:func:`become_subreaper` returns False (the process group is still ended).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Collection

from pvisor.core.helpers import helper_argv

#: the signals that stop a run, its agent's process group and a server: SIGHUP too (its terminal
#: closed), or it would die at once, with what it had not committed; the exit code is 128 + the
#: signal's number (``pvisor gateway``: 0 after SIGTERM)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: after SIGTERM, how long the agent's process group gets before SIGKILL (a second Ctrl-C,
#: SIGTERM or SIGHUP cuts it short)
KILL_GRACE_S = 5.0

#: after SIGTERM, how long processes the agent left behind get before SIGKILL
STRAY_GRACE_S = 2.0

#: prctl option that makes a process the reaper of its orphaned descendants (Linux >= 3.4)
PR_SET_CHILD_SUBREAPER = 36


def end_group(pgid: int, *, kill: bool = False) -> None:
    """Signal the process group ``pgid`` (SIGTERM, or SIGKILL with ``kill``); a group that is
    already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL if kill else signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


async def stop_group(
    proc: asyncio.subprocess.Process, hurry: asyncio.Event | None = None, grace: float = KILL_GRACE_S
) -> None:
    """SIGTERM the agent's process group, SIGKILL it after ``grace`` s (:data:`KILL_GRACE_S`; at
    once when ``hurry`` is set meanwhile: a second Ctrl-C)."""
    end_group(proc.pid)
    waiter = asyncio.ensure_future(proc.wait())
    hurried = asyncio.ensure_future(hurry.wait()) if hurry is not None else None
    await asyncio.wait(
        {waiter} | ({hurried} if hurried else set()),
        timeout=grace,
        return_when=asyncio.FIRST_COMPLETED,
    )
    if hurried is not None:
        hurried.cancel()
    if not waiter.done():
        end_group(proc.pid, kill=True)
    await waiter
    end_group(proc.pid, kill=True)  # members that ignored SIGTERM


#: the guard of an agent's process group (:class:`GroupGuard`): it reads its stdin until pvisor
#: writes to it (released) or dies (end of file), and in the second case kills the group
GUARD_SOURCE = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\n"
    "if not os.read(0, 1):\n"
    "    try: os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "    except OSError: pass\n"
)


def guard_main(argv: list[str]) -> None:
    """The guard in a bundle (core/helpers.py): :data:`GUARD_SOURCE` with ``argv`` (the group id)."""
    sys.argv = ["-c", *argv]
    exec(compile(GUARD_SOURCE, "<pvisor guard>", "exec"), {"__name__": "__main__"})


class GroupGuard:
    """A small process that kills the agent's process group if pvisor dies first (a ``kill -9``
    leaves no time to stop anything): :func:`~pvisor.gateway.parent_death.die_with_parent` ends the
    agent itself, the guard also the tools it runs in its group. :meth:`release` once pvisor has
    ended the group itself. Processes the agent moved into sessions of their own are beyond it."""

    def __init__(self, pgid: int) -> None:
        read, self._write = os.pipe()  # the write end is close-on-exec: only pvisor holds it
        try:
            self._proc: subprocess.Popen | None = subprocess.Popen(
                helper_argv("guard", GUARD_SOURCE, [str(pgid)], site=False), stdin=read,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        except OSError:
            self._proc = None
        finally:
            os.close(read)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def release(self) -> None:
        """Let the guard go without killing anything. Idempotent."""
        if self._write < 0:
            return
        try:
            os.write(self._write, b"x")
        except OSError:
            pass
        os.close(self._write)
        self._write = -1
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``):
    a process the agent started in its own session (``setsid``: Gemini CLI, OpenCode and
    mini-swe-agent run tools so) is re-parented to pvisor rather than to pid 1 when its parent
    exits, so that :func:`end_strays` can find and end it. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process, from ``/proc/<pid>/stat`` (Linux;
    empty elsewhere). The command name in parentheses may hold spaces and parentheses, so the
    fields are read after its last ``)``."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 2:
            table[int(entry)] = (int(fields[1]), fields[0].decode("ascii", "replace"))
    return table


def descendants(root: int) -> dict[int, str]:
    """Every descendant of process ``root`` (children, their children, ...): pid -> state
    letter (``Z`` a zombie waiting to be reaped)."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return found


def reap_children(keep: Collection[int] = ()) -> None:
    """Collect the exit status of this process's zombie children (orphans re-parented to it),
    one pid at a time: a ``waitpid(-1)`` could take the status asyncio waits for; ``keep``:
    children whose status someone else waits for (the journal's writer process)."""
    me = os.getpid()
    for pid, state in descendants(me).items():
        if state == "Z" and pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass  # not ours (a zombie grandchild), or reaped meanwhile


async def end_strays(
    grace: float = STRAY_GRACE_S, hurry: asyncio.Event | None = None, keep: Collection[int] = ()
) -> int:
    """End what the agent left running once it exited or was killed: every live descendant of
    this process (with :func:`become_subreaper`, also those that left the agent's session)
    gets SIGTERM, then SIGKILL after ``grace`` seconds (at once when ``hurry`` is set), and is
    reaped. Returns how many processes were ended. ``keep``: pvisor's own children that must
    live on (the journal's writer process, :attr:`JournalProducer.processes`); call it only
    while pvisor itself runs no other child process."""
    me = os.getpid()
    ended: set[int] = set()
    deadline = time.monotonic() + grace
    give_up = deadline + 5.0  # a process SIGKILL cannot end (uninterruptible sleep) must not hang pvisor
    sig = signal.SIGTERM
    while True:
        reap_children(keep)
        live = [pid for pid, state in descendants(me).items() if state != "Z" and pid not in keep]
        if not live or time.monotonic() >= give_up:
            return len(ended)
        if time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
            sig = signal.SIGKILL
        for pid in live:
            if pid not in ended or sig == signal.SIGKILL:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    continue
                ended.add(pid)
        await asyncio.sleep(0.05)


def exit_status(returncode: int | None) -> int | None:
    """A process's exit status the way a shell reports it (killed by signal N: 128 + N)."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode
