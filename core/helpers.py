"""How pvisor starts the small Python processes of its own: the journal's writer
(:mod:`.writer_process`), the guard of an agent's process group (``pvisor.session.supervise``)
and the relay inside an agent's sandbox (``pvisor.session.relay``).

Installed with pip, a helper is this interpreter running a piece of code, isolated from the
environment and the working directory (``sys.executable -I -c CODE ARGS``). In a build of
``scripts/build-bundle`` (PyInstaller, docs/install.md) there is no interpreter to give code to:
``sys.executable`` is the build's ``pvisor`` executable, so a helper is that executable with a
hidden first argument, :data:`HELPER_FLAG`, and the helper's name, which the build's entry point
(``pvisor/__main__.py``) hands to :func:`run_frozen_helper` before the command line is parsed.

This module imports nothing of pvisor's.
"""

from __future__ import annotations

import sys
from typing import Callable, NoReturn

#: the first argument of a helper process in a bundle (never a pvisor command or option)
HELPER_FLAG = "--pvisor-helper"


def frozen() -> bool:
    """Whether this process is a bundle's executable (PyInstaller sets ``sys.frozen``)."""
    return bool(getattr(sys, "frozen", False))


def helper_argv(name: str, code: str, args: list[str], *, site: bool = True) -> list[str]:
    """The command line of helper ``name`` (a key of :data:`HELPERS`) given ``args`` (strings):
    ``[python, -I, (-S,) -c, code, *args]`` where pvisor runs on an interpreter (``site``:
    False adds ``-S``, no site-packages), ``[pvisor, --pvisor-helper, name, *args]`` in a
    bundle, where ``code`` is not used: the helper's function gets ``args`` as they are."""
    if name not in HELPERS:
        raise ValueError(f"unknown helper {name!r}")
    if frozen():
        return [sys.executable, HELPER_FLAG, name, *args]
    return [sys.executable, "-I", *([] if site else ["-S"]), "-c", code, *args]


def _fifo(fd: int) -> bool:
    import os
    import stat

    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _guard_refusal(args: list[str]) -> str | None:
    """The guard kills the process group it is given when its stdin ends: it runs only with a
    group id above 1 that is not its own (``killpg(1)`` would signal every process) and a pipe
    on stdin, as pvisor starts it."""
    import os

    pgid = args[0]
    if not pgid.isdigit() or int(pgid) <= 1 or int(pgid) == os.getpgrp() or not _fifo(0):
        return "expected a process group id above 1, not this process's own, and a pipe on stdin"
    return None


def _writer_refusal(args: list[str]) -> str | None:
    """The writer runs only with its two pipes and its numbers."""
    read_fd, reply_fd, _path, _finalize, max_decoded, busy_ms = args
    if not all(a.isdigit() for a in (read_fd, reply_fd, max_decoded, busy_ms)):
        return "expected two pipe descriptors, the journal, a finalizer and two numbers"
    if not (_fifo(int(read_fd)) and _fifo(int(reply_fd))):
        return f"descriptors {read_fd} and {reply_fd} are not open pipes"
    return None


def _relay_refusal(args: list[str]) -> str | None:
    """The relay runs only with the descriptor of its configuration, an unlinked file pvisor
    writes (JSON)."""
    import os
    import stat

    try:
        ok = args[0].isdigit() and stat.S_ISREG(os.fstat(int(args[0])).st_mode)
    except OSError:
        ok = False
    if not ok:
        return "expected the descriptor of the relay's configuration (a file pvisor writes)"
    return None


#: helper name -> ("module:function" the frozen entry point calls with the helper's arguments,
#: how many arguments pvisor gives it, why other arguments are refused)
HELPERS: dict[str, tuple[str, int, Callable[[list[str]], str | None]]] = {
    "writer": ("pvisor.journal.writer_child:main", 6, _writer_refusal),
    "guard": ("pvisor.session.supervise:guard_main", 1, _guard_refusal),
    "relay": ("pvisor.session.relay:main", 1, _relay_refusal),
}


def helper_refusal(name: str, args: list[str]) -> str | None:
    """Why ``args`` are not what pvisor gives helper ``name`` (as many as it gives), or None."""
    return HELPERS[name][2](args)


def run_frozen_helper(argv: list[str]) -> NoReturn:
    """Run the helper that ``argv`` (``sys.argv[1:]`` of a bundle: ``--pvisor-helper NAME
    ARGS...``) names, and exit 0 when it returns; exit 2 with one line on stderr for a missing or
    unknown name, or arguments other than those pvisor gives it (only pvisor starts helpers)."""
    import importlib

    def refuse(why: str) -> NoReturn:
        sys.stderr.write(f"pvisor: error: {why} (a helper process that pvisor starts itself)\n")
        sys.exit(2)

    if len(argv) < 2:
        refuse(f"{HELPER_FLAG}: expected a helper name ({', '.join(HELPERS)})")
    name = argv[1]
    if name not in HELPERS:
        refuse(f"{HELPER_FLAG} {name!r}: not a helper of this build ({', '.join(HELPERS)})")
    target, count, refusal = HELPERS[name]
    args = argv[2:]
    if len(args) != count:
        refuse(f"{HELPER_FLAG} {name}: {len(args)} argument(s), expected {count}")
    why = refusal(args)
    if why is not None:
        refuse(f"{HELPER_FLAG} {name}: {why}")
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(args)
    sys.exit(0)


__all__ = ["HELPERS", "HELPER_FLAG", "frozen", "helper_argv", "run_frozen_helper"]
