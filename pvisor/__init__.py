"""pvisor: capture coding-agent model exchanges into an Event Journal, and replay them step-exactly.

The installed packages, from the top floor down (each imports only the floors below it):
this package (the CLI: ``cli``, ``entry``, ``commands``; and :mod:`pvisor.harness`),
``pvisor.session`` (a session's composition, running agents, replay-only and continuation, the
demo, the Python API ``continue_run`` / ``continue_many``), ``pvisor.replay`` (the prefix at a
step, prepare-only, playback), ``pvisor.gateway`` (the capture proxy), ``pvisor.adapters``
(wire protocols, native formats, agent launch profiles) and ``pvisor.journal`` (canonical model
and SQLite store).
Importing ``pvisor`` imports nothing else: the documents' Python names
(:mod:`pvisor.harness`: ``PauseSpec``, ``TrajectoryReplay``, ...) are loaded on first use.
"""

from pvisor._version import __version__

#: the names of :mod:`pvisor.harness`, reached as ``pvisor.NAME`` (loaded on first use, so that
#: the short commands' start-up does not pay for them)
_HARNESS = ("HandoffBranch", "PauseKind", "PauseSpec", "TrajectoryReplay", "View")

__all__ = ["__version__", *_HARNESS]


def __getattr__(name: str) -> object:
    if name in _HARNESS:
        from pvisor import harness

        return getattr(harness, name)
    raise AttributeError(f"module 'pvisor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HARNESS])
