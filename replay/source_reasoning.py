"""What becomes of agent A's reasoning in a handoff (``--source-reasoning drop|text|keep``;
docs/handoff.md "Reasoning").

Each source action's reasoning items (:class:`~pvisor.journal.model.Reasoning`: visible ``text``,
a ``signature`` or ``encrypted`` content) are, by :class:`SourceReasoning`:

- ``drop`` (the default): left out, counted (``provider_bound``: signed or encrypted, which only
  A's provider may be sent; ``plain``: text alone);
- ``text``: their visible text (plain reasoning, the summary or thinking text a provider-bound
  item kept) written into B's own message as a labelled note, :data:`NOTE_LABEL`; never a
  signature or encrypted content. An item with no text (a bare signature, encrypted reasoning
  without a summary) is dropped and counted;
- ``keep``: served unchanged in B's action (``Action.reasoning``), only where B speaks A's
  protocol with a model of A's family and the protocol carries reasoning items on their own
  (:func:`keep_problem`: Anthropic thinking blocks, Responses reasoning items; Gemini's thought
  signatures sit on A's own call parts, which B's calls replace). Else the handoff is refused
  (``handoff_refused``, exit 65) with the reason.

:func:`reasoning_of` is what the translation (:mod:`pvisor.replay.translate`) calls per source
action. Pure: no file, process or socket.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Action, Reasoning, Step


class SourceReasoning(str, enum.Enum):
    """``--source-reasoning``: what becomes of A's reasoning in the history served to B."""

    DROP = "drop"  #: left out, counted
    TEXT = "text"  #: its visible text as a labelled note in B's message; no signature, no ciphertext
    KEEP = "keep"  #: served unchanged (same protocol and model family only; else refused)


#: the note ``text`` writes into B's message, one per source action with reasoning text; the
#: items' texts are joined by a blank line
NOTE_LABEL = "(My reasoning at this step: {text})"


@dataclass
class ReasoningAccount:
    """The report's ``handoff.reasoning``: ``mode``, items ``kept`` (served unchanged),
    ``rendered`` (written as a note), ``dropped`` (``provider_bound``, ``plain``)."""

    mode: SourceReasoning = SourceReasoning.DROP
    kept: int = 0
    rendered: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {"provider_bound": 0, "plain": 0})

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "kept": self.kept,
            "rendered": self.rendered,
            "dropped": dict(self.dropped),
        }


def is_bound(r: Reasoning) -> bool:
    """Whether ``r`` is bound to A's provider (a signature or encrypted content)."""
    return bool(r.signature or r.encrypted)


def reasoning_of(
    action: Action, account: ReasoningAccount, served: bool = True
) -> tuple[list[Reasoning], str]:
    """What B's action carries of ``action``'s reasoning under ``account.mode``: (the items it
    keeps, the note for its text, "" for none); ``account`` counts each item. ``served``: False
    for an action left out (a step without a call): all of its reasoning is dropped."""
    kept: list[Reasoning] = []
    said: list[str] = []
    for r in action.reasoning:
        key = "provider_bound" if is_bound(r) else "plain"
        if not served:
            account.dropped[key] += 1
        elif account.mode is SourceReasoning.KEEP:
            kept.append(r)
            account.kept += 1
        elif account.mode is SourceReasoning.TEXT and r.text.strip():
            said.append(r.text.strip())
            account.rendered += 1
        else:
            account.dropped[key] += 1
    note = NOTE_LABEL.format(text="\n\n".join(said)) if said else ""
    return kept, note


def with_note(note: str, text: str) -> str:
    """B's message text: the reasoning ``note`` first (reasoning comes before what it led to)."""
    return "\n\n".join(x for x in (note, text.strip()) if x)


#: a model name's date or version tail: ``-20250929``, ``-2025-09-29``, ``-latest``, ``@...``
_TAIL = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|-latest|@[\w.-]+)$")


def model_family(model: str | None) -> str | None:
    """A model's family as signatures are bound to it: the name without a provider prefix
    (``anthropic/``, ``models/``) or a date tail (``claude-sonnet-4-5-20250929`` ->
    ``claude-sonnet-4-5``); None for none."""
    if not model:
        return None
    name = model.rsplit("/", 1)[-1].lower()
    while True:
        shorter = _TAIL.sub("", name)
        if shorter == name:
            return name
        name = shorter


def keep_problem(
    steps: Sequence[Step], source_protocol: str, source_model: str | None, protocol: str, model: str | None
) -> str | None:
    """Why ``steps``' reasoning cannot be served unchanged to B speaking ``protocol`` with
    ``model`` (None: it can): another protocol, another model family, or a protocol whose
    reasoning is not carried by items of its own (its module's ``STANDALONE_REASONING``)."""
    items = [(s, r) for s in steps for r in s.action.reasoning]
    if not items:
        return None
    first = items[0][0].n
    if protocol != source_protocol:
        return (
            f"--source-reasoning keep: step {first}'s reasoning was made over {source_protocol} and the "
            f"next agent speaks {protocol}: no other provider may be sent it (use text or drop)"
        )
    if any(is_bound(r) for _, r in items) and not getattr(
        get_protocol(protocol), "STANDALONE_REASONING", False
    ):
        return (
            f"--source-reasoning keep: {protocol}'s signatures sit on the source's own call parts, which "
            "the next agent's calls replace: they cannot be served unchanged (use text or drop)"
        )
    mine = model_family(model)
    for s, _ in items:
        theirs = model_family(s.action.model or source_model)
        if theirs is not None and mine is not None and theirs != mine:
            return (
                f"--source-reasoning keep: step {s.n}'s reasoning is of model {theirs} and the next agent "
                f"asks for {mine}: signatures are bound to the model family (use text or drop)"
            )
    return None


def signed_throughout(steps: Sequence[Step]) -> bool:
    """Whether every one of B's ``steps`` carries a kept provider-bound reasoning item: then a
    live request with thinking on can be sent B's history as it is (no ``reasoning_off``)."""
    return bool(steps) and all(any(is_bound(r) for r in s.action.reasoning) for s in steps)
