"""The process that runs fuzzing examples (tests/test_fuzz.py): one example at a time, each as
a user would meet it, under a memory limit, so that a crash, a hang or a runaway allocation of
one example is seen as that example's failure, never as the test process's.

Protocol (stdin -> the result pipe given as argv[1]): a frame is ``<I`` length + JSON
``{"target", "args", "size"}`` then ``size`` bytes of input; the answer is one JSON line
``{"outcome": "ok" | "crash", "exit": code, "detail": text}``. Targets:

- ``cli``: ``args`` is a pvisor command line in which ``{input}`` is the input written to a file
  (its name ``args[0]``, the rest the argv) and ``{out}`` a fresh directory; it runs in this
  process as ``pvisor.cli.main(argv)``. Its exit code must be a documented one; a traceback
  (any exception escaping ``main``) is a crash, and so is a process it starts (an audit hook
  sees every one: the fuzzed commands only read). After it, nothing may exist outside ``{out}``
  but the input itself (and SQLite's own ``-wal``/``-shm`` files beside a journal).
- ``reassemble``: ``args`` is a protocol name; the input is a recorded stream, reassembled.
- ``parse``: ``args`` is ``[protocol, path]``; the input is a request body (JSON), parsed.
For ``reassemble`` and ``parse`` only a :class:`pvisor.core.errors.PvisorError` may escape.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import traceback
from pathlib import Path

#: exit codes of docs/cli.md
DOCUMENTED = {0, 1, 2, 3, 65, 69, 74}
MEMORY_LIMIT = 2 << 30  # bytes of address space


def _read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


#: audit events of a new process (PEP 578): none may happen while a command only reads
#: (tests/test_replay_side_effects.py forbids them too)
PROCESS_EVENTS = (
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
)
_PROCESS_EVENTS = frozenset(PROCESS_EVENTS)
_spawned: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event in _PROCESS_EVENTS:
        _spawned.append(f"{event} {args[0] if args else ''}")


def run_cli(args: list[str], data: bytes) -> dict:
    from pvisor.cli import main

    with tempfile.TemporaryDirectory(prefix="pvisor-fuzz-") as tmp:
        root = Path(tmp)
        src = root / "in" / args[0]
        src.parent.mkdir()
        src.write_bytes(data)
        out = root / "out"
        out.mkdir()
        argv = [a.replace("{input}", str(src)).replace("{out}", str(out)) for a in args[1:]]
        before = _files(root)
        _spawned.clear()
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - what the fuzzing looks for
            return {"outcome": "crash", "exit": None, "detail": traceback.format_exc(limit=8)}
        # SQLite's own -wal, -shm and -journal files beside a journal are not output
        sqlite_side = f"in/{args[0]}-"
        stray = sorted(
            f for f in _files(root) - before if not (f.startswith("out/") or f.startswith(sqlite_side))
        )
        if stray:
            return {"outcome": "crash", "exit": code, "detail": f"wrote outside its output: {stray}"}
        if _spawned:  # these commands read: a crafted file must never make them run anything
            return {"outcome": "crash", "exit": code, "detail": f"started a process: {_spawned[:3]}"}
        if code not in DOCUMENTED:
            return {"outcome": "crash", "exit": code, "detail": f"exit code {code} is not documented"}
        shutil.rmtree(out, ignore_errors=True)
        return {"outcome": "ok", "exit": code, "detail": ""}


def run_library(target: str, args: list[str], data: bytes) -> dict:
    from pvisor.adapters.protocols import get_protocol
    from pvisor.core.errors import PvisorError

    try:
        if target == "reassemble":
            get_protocol(args[0]).reassemble([data])
        else:
            get_protocol(args[0]).parse_request(json.loads(data), path=args[1])
    except PvisorError as exc:
        return {"outcome": "ok", "exit": None, "detail": type(exc).__name__}
    except BaseException:  # noqa: BLE001
        return {"outcome": "crash", "exit": None, "detail": traceback.format_exc(limit=8)}
    return {"outcome": "ok", "exit": None, "detail": ""}


def main() -> None:
    results = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    sys.addaudithook(_audit)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what the commands print is not the point
    os.dup2(devnull, 2)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    while True:
        try:
            (n,) = struct.unpack("<I", _read_exact(4))
        except EOFError:
            return
        head = json.loads(_read_exact(n))
        data = _read_exact(head["size"])
        if head["target"] == "cli":
            result = run_cli(head["args"], data)
        else:
            result = run_library(head["target"], head["args"], data)
        os.write(results, (json.dumps(result) + "\n").encode())


if __name__ == "__main__":
    main()
