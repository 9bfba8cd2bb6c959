"""Sessions: the application layer between the CLI (``pvisor``) and :mod:`pvisor.replay`.

A session is one life of the capture gateway with what surrounds it: the journal, the answer
source (the upstream, the scripted model, replay's playback), intercept mode's mitmdump, the
stop signals and the workspace snapshots; and, for the commands that start an agent, the
agent's process group. Modules:

- :mod:`.session`: :class:`~.session.Session`, the one composition of journal, gateway (built
  with its journal), optional mitmdump, responder, signals and snapshots, with one start and one
  stop order; ``pvisor gateway``, ``pvisor run`` and ``pvisor demo`` run in one.
- :mod:`.supervise`: the agent's process group: subreaper, process table, descendants,
  :class:`~.supervise.GroupGuard` (the bundle's ``guard`` helper), the group's stop, the
  strays an agent leaves, exit statuses and reaping.
- :mod:`.run`: ``pvisor run``, one attempt of a real agent CLI (:func:`~.run.run_agent`).
- :mod:`.launch`: the agent of a run started: its executable and version check, its files and
  environment, its process launched and waited for, its native trajectory exported or found.
- :mod:`.children`: a handoff's child run: checked, claimed once in the journal, given back.
- :mod:`.steps`: what an attempt captured, read back: exchanges classified, steps counted.
- :mod:`.replay`: the modes of ``pvisor replay`` that start an agent: replay-only and
  continuation.
- :mod:`.api`: the Python API of continuation, :func:`continue_run` and :func:`continue_many`
  (and their :class:`Result`): ``from pvisor.session import continue_run, continue_many``.
- :mod:`.handover`: ``pvisor handoff`` and its Python API, :func:`handoff` (``from pvisor.session
  import handoff``): the next agent takes over a run at a pause, or from a ``HandoffBranch``.
  (Not named ``handoff``: a submodule of that name would shadow the function on this package
  once imported.)
- :mod:`.rollouts`: rollouts from a manifest (``pvisor replay --batch`` without
  ``--prepare-only``): :func:`~.rollouts.run_rollout` (one, from its arguments alone) and
  :func:`~.rollouts.run_rollouts` (many on this machine, a process each).
- :mod:`.demo`: ``pvisor demo``, the capture path offline with a built-in agent loop.

Nothing is imported here, so that ``import pvisor.session`` costs nothing: the API's names are
loaded on first use.
"""

import importlib
from typing import Any

#: the Python API, by the module that defines it (loaded on first use: the guard helper process
#: imports pvisor.session.supervise, which must not load the API with it)
_API = {
    "continue_run": "api",
    "continue_many": "api",
    "Result": "api",
    "handoff": "handover",
    "run_rollout": "rollouts",
    "run_rollouts": "rollouts",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
    raise AttributeError(f"module 'pvisor.session' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
