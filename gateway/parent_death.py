"""A child process that dies with pvisor: the ``preexec_fn`` of every process pvisor starts and
supervises (the agent, its version check, mitmdump in intercept mode), so that a ``kill -9`` of
pvisor leaves none of them running against a gateway that is gone. Standard library only: the
agent's launcher imports it before anything heavy."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable


#: prctl option: the signal a process gets when its parent (the thread that forked it) dies
PR_SET_PDEATHSIG = 1
_LIBC_PRCTL = None


def _prctl():
    """libc's ``prctl``, looked up once in the parent: a child between fork and exec must not
    load a library (it may run while another thread held the loader's lock)."""
    global _LIBC_PRCTL
    if _LIBC_PRCTL is None and sys.platform.startswith("linux"):
        try:
            _LIBC_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _LIBC_PRCTL = False
    return _LIBC_PRCTL or None


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the child get SIGKILL when pvisor dies, even by ``kill -9``
    (Linux ``prctl(PR_SET_PDEATHSIG)``): an agent whose supervisor is gone must not go on
    retrying against a gateway that is gone too. None where unsupported. The child checks that
    its parent is still the one that forked it (it may have died before the prctl)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)

    return arm
