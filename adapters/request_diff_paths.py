"""Each run's own directories in its requests (``pvisor diff``, docs/diff.md "The runs' own
directories").

``pvisor run`` gives every run a private home and a run directory of its own
(``…/runs/r-XXXX/home``), and an agent names them in its prompt: Claude Code's system prompt
names its memory folder inside that home (``…/runs/r-XXXX/home/.claude/projects/-ws/memory/``).
Two runs of one task then part in those bytes at every step, though neither prompt says
anything the other does not. :func:`run_directories` reads the directories a run was given from
the journal; :func:`without_run_paths` puts a placeholder for each in a block's canonical JSON,
so that a difference made only of them is told from a real one (it still costs the prompt
cache: the bytes differ).
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson

#: the run labels that name a directory of the run's own (docs/journal.md, ``runs.labels``),
#: each with its placeholder; ``native_dir`` is the folder of the agent's native trajectory
#: (``native_path``'s), which the agent names after the workspace inside the private home
RUN_DIRECTORY_LABELS = (("run_dir", "{run_dir}"), ("home", "{home}"), ("workspace", "{workspace}"))
NATIVE_DIR = "{native_dir}"

#: what may continue a directory's name (a longer name is another directory: ``ws`` in ``ws2``)
_NAME_GOES_ON = rb"(?![A-Za-z0-9._-])"


class RunPaths:
    """The directories of one run, as (placeholder, path) longest first (a path inside another
    is replaced before it), and the pattern that finds them in canonical JSON."""

    __slots__ = ("dirs", "pattern", "names")

    def __init__(self, dirs: list[tuple[str, str]]) -> None:
        # a directory of one character ("/") would match everywhere: a run's own are deeper
        self.dirs = sorted({(n, p) for n, p in dirs if len(p) > 1}, key=lambda d: -len(d[1]))
        self.names: dict[bytes, bytes] = {}
        alternatives = []
        for name, path in self.dirs:
            written = orjson.dumps(path)[1:-1]  # as a JSON string writes it (escapes, no quotes)
            self.names.setdefault(written, name.encode())
            alternatives.append(re.escape(written))
        self.pattern = (
            re.compile(b"(" + b"|".join(alternatives) + b")" + _NAME_GOES_ON) if alternatives else None
        )

    def __bool__(self) -> bool:
        return self.pattern is not None

    def replace(self, key: bytes) -> bytes:
        """``key`` (a block's canonical JSON) with each of the run's directories a placeholder."""
        if self.pattern is None:
            return key
        return self.pattern.sub(lambda m: self.names[m.group(1)], key)


def run_directories(reader: Any, run_id: str | None) -> RunPaths:
    """The directories run ``run_id`` was given, from its labels (``run_dir``, ``home``,
    ``workspace``, the folder of ``native_path``, its attempts' ``native_path`` too: a resume
    may write elsewhere) and its start environment (``cwd``, ``HOME``); an empty RunPaths for
    a run that names none (a ``pvisor gateway`` capture) or no run."""
    if not run_id or not reader.run_exists(run_id):
        return RunPaths([])
    run = reader.run(run_id)
    labels = run.labels or {}
    dirs = [(name, labels[key]) for key, name in RUN_DIRECTORY_LABELS if labels.get(key)]
    natives = [labels.get("native_path")] + [a.labels.get("native_path") for a in reader.attempts(run.id)]
    dirs += [(NATIVE_DIR, os.path.dirname(p)) for p in natives if isinstance(p, str) and p]
    env = reader.run_environment(run.id) or {}
    if isinstance(env.get("cwd"), str):
        dirs.append(("{workspace}", env["cwd"]))
    home = (env.get("variables") or {}).get("HOME")
    if isinstance(home, str):
        dirs.append(("{home}", home))
    return RunPaths([(n, p) for n, p in dirs if isinstance(p, str)])


__all__ = ("NATIVE_DIR", "RUN_DIRECTORY_LABELS", "RunPaths", "run_directories")
