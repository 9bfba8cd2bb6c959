"""Each native format's signature: what in a file's start says which agent wrote it, one
function per format, ``(path, head) -> bool``, named after its reader module (the ``module`` of
the agent's row of :data:`pvisor.adapters.agents.AGENTS`); :func:`signature_of` finds it by the
adapter's name. A format whose function is not here has it as ``SIGNATURE`` on its reader module
(a new agent is its modules and one row of the table; moving its signature here keeps its reader
unloaded by detection).

``head`` is the file's start as :func:`pvisor.adapters.native.sniff_head` reads it (``b""`` for
a directory): at least its first 64 KiB, extended to its first 8 complete lines, at most 4 MiB,
so that a JSONL file whose first line is long (a Claude Code ``file-history-snapshot``) still
shows the records after it. A signature looks for keys and markers in ``head`` (the formats and
their sources: docs/native.md); it is cheap and never raises.

Detection asks every signature here and imports only the adapter it names: the adapter modules
(the readers, 0.3-0.6 ms each to import) stay unloaded, where asking each adapter's ``sniff``
loaded all eight (docs/benchmarks.md, "Replay prepare-only: fidelity and startup"). An
adapter's ``sniff`` is its signature (:meth:`pvisor.adapters.native.base.NativeAdapter.sniff`).

This module imports nothing of pvisor's but the agent table, for a SQLite file OpenCode's
adapter, and a reader module that holds its own signature.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import TYPE_CHECKING, Callable

from pvisor.adapters.agents import AGENTS

if TYPE_CHECKING:
    from pathlib import Path

#: the first 16 bytes of every SQLite 3 database (OpenCode's ``opencode.db``)
SQLITE_MAGIC = b"SQLite format 3\x00"


def claude_code(path: Path | str, head: bytes) -> bool:
    """Claude Code's session JSONL: every record carries ``parentUuid``, ``sessionId`` and
    ``isSidechain``."""
    return (
        os.path.isfile(path)
        and b'"parentUuid"' in head
        and b'"sessionId"' in head
        and b'"isSidechain"' in head
    )


def codex(path: Path | str, head: bytes) -> bool:
    """Codex CLI's rollout JSONL: records with a ``payload``, among them ``session_meta`` or
    ``response_item`` ones."""
    return (
        os.path.isfile(path)
        and b'"payload"' in head
        and (b'"session_meta"' in head or b'"response_item"' in head)
    )


def gemini_cli(path: Path | str, head: bytes) -> bool:
    """Gemini CLI's chat recording: ``projectHash`` and ``sessionId`` (a session document or its
    JSONL form), or the JSONL form's ``$set`` / ``$rewindTo`` records."""
    if not os.path.isfile(path):
        return False
    if b'"projectHash"' in head and b'"sessionId"' in head:
        return True
    return b'"$set"' in head or b'"$rewindTo"' in head


def qwen_code(path: Path | str, head: bytes) -> bool:
    """Qwen Code's chat JSONL: ``parentUuid`` records holding Gemini-style ``parts``, without
    the ``isSidechain`` key of Claude Code's records near the start."""
    return (
        os.path.isfile(path)
        and b'"parentUuid"' in head
        and b'"parts"' in head
        and b'"isSidechain"' not in head[:4096]
    )


def mini_swe_agent(path: Path | str, head: bytes) -> bool:
    """mini-swe-agent's ``.traj.json``: ``trajectory_format`` naming it (v2), the
    ``exit_status`` / ``submission`` / ``messages`` of v1 (whose long ``info`` comes first), or
    a bare list of messages holding its bash-command markers."""
    if not os.path.isfile(path):
        return False
    if b'"trajectory_format"' in head and b"mini-swe-agent" in head:
        return True
    if b'"exit_status"' in head and b'"submission"' in head and b'"messages"' in head and b'"role"' in head:
        return True
    return (
        head.lstrip().startswith(b"[")
        and b'"role"' in head
        and (b"mswea_bash_command" in head or b"MINI_SWE_AGENT" in head)
    )


def opencode(path: Path | str, head: bytes) -> bool:
    """OpenCode: a storage tree (a directory with ``session``, ``message`` and ``part``), an
    ``opencode.db`` (SQLite with those tables) or an export (``info``, ``messages``, ``parts``,
    ``sessionID``)."""
    if os.path.isdir(path):
        return all(os.path.isdir(os.path.join(path, d)) for d in ("session", "message", "part"))
    if head.startswith(SQLITE_MAGIC):
        from .opencode import has_store_tables  # a database: its tables say

        return has_store_tables(path)
    return b'"info"' in head and b'"messages"' in head and b'"parts"' in head and b'"sessionID"' in head


def openhands(path: Path | str, head: bytes) -> bool:
    """OpenHands' event list: a JSON array of events with ``source`` and ``action`` or
    ``observation``, and ``cause`` or ``args``."""
    return (
        os.path.isfile(path)
        and head.lstrip().startswith(b"[")
        and b'"source"' in head
        and (b'"action"' in head or b'"observation"' in head)
        and (b'"cause"' in head or b'"args"' in head)
    )


def swe_agent(path: Path | str, head: bytes) -> bool:
    """SWE-agent's ``.traj``: a JSON object with a ``history`` of ``role`` messages marked with
    the agent (``main``, ``primary``) or a ``message_type``."""
    markers = (b'"agent": "main"', b'"agent": "primary"', b'"message_type"')
    return (
        os.path.isfile(path)
        and head.lstrip().startswith(b"{")
        and b'"history"' in head
        and b'"role"' in head
        and any(m in head for m in markers)
    )


#: ATIF's version key, as Harbor's models and pvisor's exporter write it (any major 1 minor)
_ATIF_VERSION = re.compile(rb'"schema_version"\s*:\s*"ATIF-v1\.')


def atif(path: Path | str, head: bytes) -> bool:
    """An ATIF trajectory (Harbor's Agent Trajectory Interchange Format, any agent's run): a JSON
    object whose ``schema_version`` reads ``ATIF-v1.`` in the file's start. By content, never by
    extension; a format row of the agent table (its signature is tried before the agents')."""
    return os.path.isfile(path) and head.lstrip().startswith(b"{") and _ATIF_VERSION.search(head) is not None


#: a format's signature: ``(path, head) -> bool``
Signature = Callable[["Path | str", bytes], bool]


def signature_of(name: str) -> Signature:
    """The signature of native adapter ``name``: the function of this module named after its
    reader module, else that module's ``SIGNATURE``. KeyError for a name with no native reader
    in the agent table."""
    row = next((a for a in AGENTS if a.name == name and a.native), None)
    if row is None:
        raise KeyError(name)
    found = globals().get(row.module)
    if callable(found):
        return found
    return importlib.import_module(f"pvisor.adapters.native.{row.module}").SIGNATURE


__all__ = ["SQLITE_MAGIC", "Signature", "signature_of"]
