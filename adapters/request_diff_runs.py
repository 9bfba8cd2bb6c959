"""The runs' side of ``pvisor diff`` (docs/diff.md): which requests of a run are its steps
(:func:`main_steps`), the request after a replay's boundary (:func:`synthetic_end`), an
attempt's first request (:func:`first_request`), and B's recorded usage
(:func:`response_usage`). The comparison is :mod:`pvisor.adapters.request_diff`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pvisor.adapters.protocols import get_protocol
from pvisor.core.errors import BadInputError
from pvisor.journal.model import Exchange


#: the flag of playback's synthetic final reply: its request is never a step
_SYNTHETIC_END = "synthetic_end"


@dataclass(slots=True)
class Side:
    """One side of a run comparison: a journal's ``reader``, the ``run`` (its whole id) and
    ``attempt`` (None: every attempt), its main-loop exchanges as (step n, exchange), and the
    request playback's synthetic final reply answered (``end``: a derived run's request after
    its boundary, never a step of its own), or None."""

    reader: Any
    run: str
    attempt: int | None
    steps: list[tuple[int, Exchange]]
    end: Exchange | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "journal": self.reader.path,
            "run": self.run,
            "attempt": self.attempt,
            "steps": len(self.steps),
        }


def main_steps(
    reader: Any, run_id: str, attempt: int | None = None, hint: list[str] | None = None
) -> list[tuple[int, Exchange]]:
    """The run's main-loop exchanges as (step n, exchange), step 1 first; with ``attempt`` only
    those that attempt sent (still numbered in the whole run). The roles the chain rule stored
    (``pvisor run`` stores them) are taken when every exchange has one, else the run is
    classified (:func:`~pvisor.adapters.chains.classify_run`). Playback's synthetic final
    request is never a step. ``hint``: the main-loop exchange ids in step order where the caller
    has them (a trajectory read already: ``meta["steps"][i]["exchange"]``). UsageError for an
    unknown run (the reader's)."""
    run = reader.run(run_id)
    exchanges = reader.exchanges(run.id)
    if hint is not None:
        by_id = {e.id: e for e in exchanges}
        main = [by_id[x] for x in hint if x in by_id]
    elif exchanges and all(e.role is not None for e in exchanges):
        main = [e for e in exchanges if e.role == "main"]
    else:
        from pvisor.adapters.chains import classify_run  # here: only a run without stored roles

        main = [r.exchange for r in classify_run(reader, run.id).main_requests]
    while main and _SYNTHETIC_END in main[-1].flags:
        main.pop()
    return [(n, e) for n, e in enumerate(main, 1) if attempt is None or e.attempt == attempt]


def synthetic_end(reader: Any, run_id: str, attempt: int | None = None) -> Exchange | None:
    """The run's last request answered by playback's synthetic final reply (flag
    ``synthetic_end``: a replay's request after its boundary, where the replayed observation
    first shows), or None."""
    ends = [
        e
        for e in reader.exchanges(run_id)
        if _SYNTHETIC_END in e.flags and (attempt is None or e.attempt == attempt)
    ]
    return ends[-1] if ends else None


def first_request(reader: Any, run_id: str, attempt: int) -> Exchange | None:
    """The first request of ``attempt`` that carries a conversation (a POST of a protocol, not
    a token count), for an attempt with no main-loop step of its own (Gemini CLI's resume starts
    a new chain)."""
    for e in reader.exchanges(run_id):
        if e.attempt == attempt and e.protocol and e.request_body and e.method == "POST":
            if not get_protocol(e.protocol).counts_tokens(e.path):
                return e
    return None


def response_usage(reader: Any, ex: Exchange) -> Any:
    """The usage object of an exchange's reply in its protocol's own shape, or None (no reply,
    a reply that does not read)."""
    if not ex.protocol or not (ex.response_final or ex.response_body):
        return None
    from pvisor.adapters.chains import read_final_response

    try:
        final, _ = read_final_response(reader, ex)
        if not isinstance(final, dict):
            return None
        return get_protocol(ex.protocol).response_to_action(final).usage
    except (BadInputError, ValueError, TypeError, KeyError):
        return None


__all__ = ("Side", "first_request", "main_steps", "response_usage", "synthetic_end")
