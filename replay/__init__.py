"""Replay: rebuild the request prefix that ends at the observation of step N, and (later) hand
that boundary to a live agent through the gateway (docs/replay.md).

Modules:

- :mod:`.prepare`: ``--prepare-only``: :func:`~.prepare.prepare_only` writes prefix.json,
  prefix.request.json and result.json (schema ``sandbox-playback.result/v3``,
  docs/result-protocol.md); executes nothing, starts nothing, opens no socket.
- :mod:`.result`: the result document, a typed record (:class:`~.result.ResultDocument`, whose
  ``to_json()`` is result.json), and the output files of every mode written whole (result.json,
  prefix.json, prefix.request.json); :mod:`.output`: the output directory (its checks, its
  creation, files renamed into place); :mod:`.agent_result`: the document's parts that only
  replay-only and continuation write (``agent_run``, ``playback``).
- :mod:`.batch`: many prepare-only in one process (``--batch``), :func:`~.batch.prepare_many`;
  :mod:`.ray_data`: the same on a Ray Dataset (the extra ``pvisor-replay[ray]``).
- :mod:`.source`: a source read and checked (a journal run or a native file: its steps, the
  boundary and damage checks every mode makes).
- :mod:`.prefix`: the prefix from a journal run (recorded bytes of request N+1) or from a native
  trajectory (rendered by the protocol module, with parts from a ``--profile-from`` capture,
  which :mod:`.profile` reads).
- :mod:`.workspace`: the workspace digest.
- :mod:`.errors`: errors with result-protocol codes.
- :mod:`.spec`: every replay option declared once (:data:`~.spec.OPTIONS`: name, kind, default,
  help, modes, replay.toml key, Python keyword; the CLI, :mod:`.config` and the Python API read
  it) and :class:`~.spec.ReplaySpec`, whose check finds every problem of an invocation at once.
- :mod:`.config`: ``replay.toml``, read and checked.

The Python API of continuation, :func:`continue_run` and :func:`continue_many` (and their
:class:`Result`), lives in :mod:`pvisor.session` (it runs agents, a layer above this package):
``from pvisor.session import continue_run``. Its old path here, ``from pvisor.replay import
continue_run``, still works for one release with a DeprecationWarning naming the new one; the
module is loaded by name (:func:`importlib.import_module`), so no import goes up a layer.

Nothing is imported here, so that ``import pvisor.replay`` costs nothing.
"""

from typing import Any

#: the names that moved to :mod:`pvisor.session` (deprecated here)
_API = ("continue_run", "continue_many", "Result")
#: the names of this package's own API, by the module that defines them (loaded on first use)
_OWN = {
    "prepare_only": "prepare",
    "PrepareOptions": "prepare",
    "prepare_many": "batch",
    "BatchOutcome": "batch",
    "SourceReads": "batch",
    "prepare_dataset": "ray_data",
}


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib
        import warnings

        warnings.warn(
            f"pvisor.replay.{name} moved: import it from pvisor.session (from pvisor.session import {name})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("pvisor.session.api"), name)
    if name in _OWN:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_OWN[name]}"), name)
    raise AttributeError(f"module 'pvisor.replay' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, *_OWN])
