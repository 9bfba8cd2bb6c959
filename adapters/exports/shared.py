"""What an export meant to be shared writes: every key-shaped token of a document replaced by
``REDACTED`` by the journal's rules (:mod:`pvisor.journal.redact`, docs/journal.md "Secrets";
docs/exports.md "Secrets"). The journal keeps request bodies exactly as sent, so a key a user
pasted into a prompt, one in a file the agent read, in tool arguments or a tool description is
in them; the rows, Parquet, ATIF, OTel and report writers pass each document through
:func:`shared` right before serialising it (``jsonl`` and ``har``, exact copies meant to be read
back, do not). Digests in a document are computed before, over the journal's exact bytes."""

from __future__ import annotations

from typing import Any

from pvisor.journal.redact import redact_document


def shared(doc: Any) -> Any:
    """``doc`` (a JSON-like value) with every string holding a key-shaped token redacted
    (:func:`~pvisor.journal.redact.redact_document`); ``doc`` itself when none does."""
    return redact_document(doc)


__all__ = ["shared"]
