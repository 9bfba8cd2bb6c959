"""The interface of a native trajectory adapter.

A **native adapter** reads the file an agent writes itself (Claude Code's session JSONL, a
Codex rollout, ...) into the canonical :class:`~pvisor.journal.model.Trajectory`. This module
holds what every adapter module implements and returns:

- :class:`NativeAdapter`: the interface of a module's ``ADAPTER``;
- :class:`FormatProfile`: the pinned version of a native format (``claude-code@2.1``) and where
  its version is read; :meth:`FormatProfile.check` warns ``unverified_profile`` for a newer
  minor and raises :class:`~pvisor.core.errors.BadInputError` (exit 65) naming the line for
  an unknown major;
- :class:`NativeResult`: the trajectory, its profile and the warnings, and
  :func:`flag_cut_off`, which :func:`~pvisor.adapters.native.read_native` applies to every
  result.

What adapters share besides lives in modules of one job each: :mod:`.diagnostics` (warnings),
:mod:`.jsonl` (the JSON-lines record reader and its limits), :mod:`.assembly` (steps, tool
calls, results, left-out records) and :mod:`.uuid_chain` (the uuid chains of Claude Code and
Qwen Code).

Depends on ``pvisor.journal`` and, for the usage counts, ``pvisor.adapters.protocols``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pvisor.adapters.protocols import get_protocol
from pvisor.adapters.protocols.base import TokenUsage
from pvisor.core.errors import BadInputError
from pvisor.core.lazyre import LazyPattern
from pvisor.journal.model import Trajectory
from pvisor.core.record import FrozenRecord, Record

from .assembly import LazySteps
from .diagnostics import Diagnostics

if TYPE_CHECKING:
    from pathlib import Path

_set = object.__setattr__  # how a FrozenRecord sets its fields in __init__

_VERSION = LazyPattern(r"^\s*v?(\d+)\.(\d+)")


class FormatProfile(FrozenRecord, record=True):
    """A pinned native format version.

    Fields:
        adapter: the adapter name (``claude-code``).
        major, minor: the verified version (``2``, ``1`` for ``claude-code@2.1``).
        version_from: where the version is read, for ``pvisor adapters`` and docs
            (``"version of each line"``, ``"by shape"``).
        verified_with: the agent versions whose files this profile was checked against.
        by_shape: True when the format carries no version: :meth:`check` is not called.
    """

    adapter: str
    major: int
    minor: int
    version_from: str
    verified_with: str = ""
    by_shape: bool = False

    def __init__(
        self,
        adapter: str,
        major: int,
        minor: int,
        version_from: str,
        verified_with: str = "",
        by_shape: bool = False,
    ) -> None:
        _set(self, "adapter", adapter)
        _set(self, "major", major)
        _set(self, "minor", minor)
        _set(self, "version_from", version_from)
        _set(self, "verified_with", verified_with)
        _set(self, "by_shape", by_shape)

    @property
    def name(self) -> str:
        return f"{self.adapter}@{self.major}.{self.minor}"

    def check(self, version: Any, where: str, diag: Diagnostics) -> None:
        """Check the file's own ``version`` string read at ``where`` (``"line 3"``): same major
        and minor at most ours is fine; a newer minor warns ``unverified_profile``; None warns
        ``no_version``; a version that does not read as ``X.Y`` (``"banana"``, a fixture's
        ``"[trimmed for fixture]"``) warns ``unreadable_version`` and the file is read by shape
        with this profile (it says nothing about the format, so it is no reason to refuse);
        another major raises BadInputError (exit 65) naming the file and ``where``. Versions
        are shown clipped to 40 characters; a number of more than 9 digits is no version we
        know (and ``int()`` refuses over 4,300 digits): as a major it is another major, as a
        minor a newer one."""
        if version is None:
            diag.warn("no_version", where, f"no format version found; read as {self.name}")
            return

        def clip(text: str) -> str:
            return text if len(text) <= 40 else text[:39] + "…"

        m = _VERSION.match(str(version))
        if m is None:
            diag.warn(
                "unreadable_version",
                where,
                f"format version {clip(str(version))!r} does not read as X.Y; read by shape as {self.name}",
            )
            return
        major, minor = m.group(1), m.group(2)
        if len(major) > 9 or int(major) != self.major:
            raise BadInputError(
                f"{diag.path}: {where}: {self.adapter} format version {clip(str(version))} has major "
                f"{clip(str(int(major)) if len(major) <= 9 else major)}; "
                f"this adapter reads {self.name} only"
            )
        if len(minor) > 9 or int(minor) > self.minor:
            diag.warn(
                "unverified_profile",
                where,
                f"{self.adapter} {clip(str(version))} is newer than the verified profile {self.name}; "
                "read with it",
            )


# --------------------------------------------------------------------------- adapters


class NativeResult(Record, record=True):
    """What an adapter returns: the trajectory, the profile it was read with, the warnings, and
    ``agent``: the agent whose run it is (a descriptor's name). An agent's own adapter leaves it
    None and :func:`~pvisor.adapters.native.read_native` sets its own name; a format's reader
    (ATIF) names the agent the file says, or the format's generic descriptor."""

    trajectory: Trajectory
    profile: FormatProfile
    diagnostics: Diagnostics
    agent: str | None = None

    def __init__(
        self,
        trajectory: Trajectory,
        profile: FormatProfile,
        diagnostics: Diagnostics,
        agent: str | None = None,
    ) -> None:
        self.trajectory = trajectory
        self.profile = profile
        self.diagnostics = diagnostics
        self.agent = agent


#: the flag of the step a cut-off last line may belong to (:func:`flag_cut_off`)
CUT_OFF_FLAG = "truncated_line"


def flag_cut_off(result: NativeResult) -> int | None:
    """Flag the last step ``truncated_line`` when the file's last line was cut off (the reader's
    ``truncated_line`` warning), and return its number (None: no cut, or no step). The line
    came after every record read, so it may hold more of the last step: the rest of its action
    (Claude Code writes one reply over several lines, the text on one and each tool call on the
    next; Codex one item per line), or its observation. The steps before it are whole. Shared by
    every JSONL format: :func:`~pvisor.adapters.native.read_native` calls it."""
    steps = result.trajectory.steps
    if "truncated_line" not in result.diagnostics.counts or not len(steps):
        return None
    if isinstance(steps, LazySteps):
        result.trajectory.steps = steps.flagging(len(steps) - 1, CUT_OFF_FLAG)
    elif CUT_OFF_FLAG not in steps[-1].flags:
        steps[-1].flags.append(CUT_OFF_FLAG)
    return len(steps)


class NativeAdapter:
    """Interface of a native adapter module's ``ADAPTER``.

    Attributes: ``name`` (``--agent`` name), ``profiles`` (the format profiles, first the
    default), ``description`` (one line for ``pvisor adapters``).
    """

    name: str = ""
    description: str = ""
    profiles: tuple[FormatProfile, ...] = ()
    #: True when a directory can be read (OpenCode's storage tree); else a directory is refused
    reads_directories: bool = False
    #: True when one file holds several sessions and ``read`` takes ``session=ID`` (OpenCode)
    selects_sessions: bool = False
    #: True when ``read`` takes ``sidechain=AGENT_ID``: the inline subagent of a main file (Claude Code)
    reads_sidechains: bool = False
    #: the wire protocol whose usage object the format keeps as a reply's usage (Claude Code's
    #: assistant records hold Anthropic's ``usage``), read by :meth:`normalised_usage`; None when
    #: the format keeps a shape of its own (the adapter overrides the method) or none
    usage_protocol: str | None = None

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """A step's ``Action.usage`` as this format keeps it, as the OpenTelemetry GenAI counts
        (:class:`~pvisor.adapters.protocols.base.TokenUsage`: input with cached reads and cache
        writes, output with reasoning); every count None when the format keeps no usage or the
        step has none. By default the :attr:`usage_protocol`'s reading."""
        if self.usage_protocol is None or not isinstance(usage, dict):
            return TokenUsage()
        return get_protocol(self.usage_protocol).normalised_usage(usage)

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when ``path`` looks like this adapter's format: its signature in
        :mod:`pvisor.adapters.native.signatures` (``head``: the file's start, ``b""`` for a
        directory; what :func:`pvisor.adapters.native.sniff_head` reads). Never raises."""
        from .signatures import signature_of

        return signature_of(self.name)(path, head)

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """Read ``path`` into a trajectory. Raises BadInputError (exit 65) for an unknown
        major version or a missing required shape, naming the file and line."""
        raise NotImplementedError

    def subagent_files(self, path: Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
        """The subagent sessions of the session ``path`` read with ``meta``, each
        ``{"path", "agent_id"}``: by default what the reader listed in ``meta["subagents"]``
        (files it finds beside the session while reading). An adapter whose subagents only name
        their parent overrides it (Codex); only episode listings call it."""
        found = meta.get("subagents")
        return list(found) if isinstance(found, list) else []
