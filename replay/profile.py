"""A profile (``--profile-from JOURNAL[:RUN]``): a journal capture of the same agent, whose first
main-loop request gives a native render what the agent's own file does not store (system
prompt, tools, request parameters, request target and headers; docs/replay.md).
:func:`load_profile` finds and reads it; :func:`parse_profile_spec` splits the option's value.
Loaded by :mod:`.prefix` only when a render has a profile.

Errors: UsageError (exit 2) for a missing journal or run,
:class:`~pvisor.replay.errors.ReplayUsageError` ``agent_mismatch`` (exit 2),
:class:`~pvisor.replay.errors.ReplayBadInput` ``profile_unusable`` and
``profile_version_mismatch`` (exit 65).
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any

import orjson

from pvisor.adapters.agents.base import parse_version
from pvisor.adapters.chains import classify_run
from pvisor.core.errors import UsageError
from pvisor.core.record import Record
from pvisor.journal.model import Conversation
from pvisor.journal.reader import JournalReader

from .errors import ReplayBadInput, ReplayUsageError
from .prefix import request_meta
from .source import descriptor

if TYPE_CHECKING:
    from pathlib import Path


class Profile(Record, record=True):
    """What a capture of the same agent gives a native render: the first main-loop request's
    ``conversation`` (system prompt, tools, params, model, stream, first user message), its
    ``request`` meta, ``run`` id, ``agent_version`` and ``journal`` path."""

    journal: Path
    run: str
    agent_version: str | None
    conversation: Conversation
    request: dict[str, Any]
    exchange: str
    key_order: list[str] = field(default_factory=list)

    def __init__(
        self,
        journal: Path,
        run: str,
        agent_version: str | None,
        conversation: Conversation,
        request: dict[str, Any],
        exchange: str,
        key_order: list[str] | None = None,
    ) -> None:
        self.journal = journal
        self.run = run
        self.agent_version = agent_version
        self.conversation = conversation
        self.request = request
        self.exchange = exchange
        self.key_order = [] if key_order is None else key_order


def parse_profile_spec(spec: str) -> tuple[Path, str | None]:
    """``JOURNAL[:RUN]`` -> (journal path, run or None). A path that exists as given wins over
    a split at its last colon."""
    from pathlib import Path  # only a --profile-from needs it

    if Path(spec).exists() or ":" not in spec:
        return Path(spec), None
    path, _, run = spec.rpartition(":")
    return Path(path), run or None


def _major(version: str | None) -> int | None:
    parsed = parse_version(version) if version else None
    return parsed[0] if parsed else None


def load_profile(spec: str, agent: str, native_version: str | None) -> tuple[Profile, list[tuple[str, str]]]:
    """The profile ``--profile-from JOURNAL[:RUN]`` names: RUN, else the newest run of
    ``agent`` in the journal that has a main-loop request. Returns (profile, notes).

    Raises UsageError for a missing journal or run, ReplayUsageError ``agent_mismatch``,
    ReplayBadInput ``profile_unusable`` (no main-loop request) and ``profile_version_mismatch``
    (the capture's major version differs from the native file's)."""
    path, run_id = parse_profile_spec(spec)
    if not path.is_file():
        raise UsageError(f"--profile-from {spec}: no journal file {path}")
    notes: list[tuple[str, str]] = []
    hint = descriptor(agent).chain_hint
    with JournalReader(path) as reader:
        if run_id is not None:
            runs = [reader.run(run_id)]
            if runs[0].agent is not None and runs[0].agent != agent:
                raise ReplayUsageError(
                    "agent_mismatch",
                    f"--profile-from {spec}: run {runs[0].id} was recorded with agent {runs[0].agent}, "
                    f"not {agent}",
                )
        else:
            runs = sorted(
                (r for r in reader.runs() if r.agent == agent), key=lambda r: r.created_ms, reverse=True
            )
            if not runs:
                raise ReplayBadInput(
                    "profile_unusable", f"--profile-from {spec}: the journal holds no run of agent {agent}"
                )
        for run in runs:
            main = classify_run(reader, run.id, prefer=hint).main_requests
            if not main:
                continue
            have, want = _major(run.agent_version), _major(native_version)
            if have is not None and want is not None and have != want:
                raise ReplayBadInput(
                    "profile_version_mismatch",
                    f"--profile-from {spec}: run {run.id} is {agent} {run.agent_version}, the native "
                    f"file was written by {native_version} (major {have} != {want})",
                )
            if have is None or want is None:
                notes.append(
                    (
                        "profile_version_unknown",
                        f"profile run {run.id} version {run.agent_version or 'unknown'}, native file "
                        f"version {native_version or 'unknown'}: major not compared",
                    )
                )
            ex = main[0].exchange
            body = reader.request_body(ex) or b"{}"
            order = list(orjson.loads(body)) if body.startswith(b"{") else []
            meta = request_meta(ex.method, ex.path, ex.query, ex.request_headers, None)
            return Profile(path, run.id, run.agent_version, main[0].conversation(), meta, ex.id, order), notes
        raise ReplayBadInput(
            "profile_unusable", f"--profile-from {spec}: no run of {agent} there has a main-loop request"
        )
