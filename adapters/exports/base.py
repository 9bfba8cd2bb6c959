"""What an export format is: the declaration each format module makes, and what its writer is given.

A format module (``adapters/exports/otel.py``, ...) declares one :class:`ExportFormat` as a
module constant and names it in the registry table (:data:`pvisor.adapters.exports.FORMATS`):

- ``name``: the value of ``--format``;
- ``describe``: each :class:`Source` it takes, with the help text ``--format`` shows for it
  (``pvisor journal export`` shows the ``RUN`` one, ``pvisor trajectory export`` the ``NATIVE``
  one); the sources it takes are the keys (:attr:`ExportFormat.accepts`);
- ``reads``: the command-line options (:class:`Option`) whose value it uses; a command refuses one
  given to a format that does not read it;
- ``output``: what it writes (:class:`Output`): a stream (a file or stdout) or files at a path;
  ``binary``: bytes a terminal cannot show (a command refuses stdout when it is a terminal);
  ``extension``: of the files it writes, without the dot (``FILE.parquet``, ``RUN.html``);
- ``unit``: what :attr:`Written.count` counts (``steps``, ``rows``, ``pages``, ...);
- ``extra``: the optional dependency it needs (:class:`Extra`; Parquet needs pyarrow), or None;
- ``write``: the one function that writes: ``write(source, target, settings) -> Written``, with
  ``source`` a :class:`JournalSource` or a :class:`NativeSource` of a kind it accepts,
  ``target`` a binary stream (:attr:`Output.STREAM`) or a :class:`pathlib.Path`
  (:attr:`Output.FILES`), ``settings`` the :class:`Settings` of the command line. It raises
  what :mod:`pvisor.core.errors` defines (an unknown run: UsageError; data the format cannot
  hold: BadInputError) and OSError as the file system gives it; it never writes to the journal.

The model is datasette's ``register_output_renderer`` (a renderer declares its extension, what it
can render and its render callable) and mitmproxy's contentview registry.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

if TYPE_CHECKING:  # for the annotations only: the registry loads no journal or native reader
    from pathlib import Path

    from pvisor.adapters.native.base import NativeResult
    from pvisor.journal.reader import JournalReader


class Source(enum.Enum):
    """What an export is made from."""

    #: one run of a journal (``pvisor journal export RUN``, ``pvisor report RUN``)
    RUN = "run"
    #: every run of a journal (``pvisor journal export`` without RUN)
    RUNS = "runs"
    #: a native trajectory file read by its adapter (``pvisor trajectory export FILE``)
    NATIVE = "native"


class Option(enum.Enum):
    """The command-line options a format may read (the value is the option as typed)."""

    #: leave the bodies out (:attr:`Settings.bodies` False)
    NO_BODIES = "--no-bodies"
    #: add each exchange's request and reply (:attr:`Settings.with_content`)
    WITH_CONTENT = "--with-content"
    #: bytes of each body kept (:attr:`Settings.body_limit`)
    BODY_LIMIT = "--body-limit"
    #: no page of a derived run's parent beside its own (:attr:`Settings.with_parent` False)
    NO_PARENT = "--no-parent"
    #: no files or diffs of the workspace on a page (:attr:`Settings.workspace` False)
    NO_WORKSPACE = "--no-workspace"
    #: a capture whose request gives what a native file does not store (:attr:`Settings.profile_from`)
    PROFILE_FROM = "--profile-from"


class Output(enum.Enum):
    """Where a format writes."""

    #: one binary stream: ``--output FILE`` (written beside and renamed when whole) or stdout
    STREAM = "stream"
    #: files: the path given and, as the format says, others beside it
    FILES = "files"


@dataclass(frozen=True)
class Extra:
    """An optional dependency: the extra of ``pyproject.toml`` (``name``) that installs the
    module ``module`` the format imports."""

    name: str
    module: str


@dataclass(frozen=True)
class Settings:
    """The options of a command line, as a writer reads them (each format reads those of
    :attr:`ExportFormat.reads`; the others keep these defaults)."""

    bodies: bool = True
    with_content: bool = False
    #: bytes; None: the format's own default
    body_limit: int | None = None
    with_parent: bool = True
    #: a report's files changed per step, from the run's snapshots (False: ``--no-workspace``)
    workspace: bool = True
    #: pvisor's, for the documents that name the program that made them (HAR's ``creator``, OTLP's
    #: ``service.version``)
    version: str = "unknown"
    #: ``JOURNAL[:RUN]``: the capture a native file's tools come from, None: none
    profile_from: str | None = None


#: the agent name an export gives a run whose journal names none (a run captured by ``pvisor
#: gateway`` alone): ATIF's ``agent.name`` and OTel's ``gen_ai.agent.name`` alike
UNKNOWN_AGENT = "unknown"


def agent_name(run: Any) -> str:
    """The agent of a journal run (:class:`~pvisor.journal.model.Run`) as every export names it:
    the name the journal stores (``claude-code``), else :data:`UNKNOWN_AGENT`."""
    return run.agent or UNKNOWN_AGENT


@dataclass(frozen=True)
class JournalSource:
    """A journal opened read-only and the run to export (its whole id), or None for every run."""

    reader: JournalReader
    run_id: str | None


@dataclass(frozen=True)
class NativeSource:
    """A native trajectory file as its adapter (``adapter``, by name) read it."""

    result: NativeResult
    adapter: str


@dataclass(frozen=True)
class Written:
    """What a writer wrote: ``count`` things of the format's :attr:`ExportFormat.unit`, and for
    :attr:`Output.FILES` the files, the path it was given first."""

    count: int
    paths: tuple[Path, ...] = ()


ExportSource = Union[JournalSource, NativeSource]
#: ``write(source, target, settings)``: see the module docstring
Writer = Callable[[ExportSource, Any, Settings], Written]


@dataclass(frozen=True)
class ExportFormat:
    """One export format's declaration (module docstring)."""

    name: str
    describe: Mapping[Source, str]
    write: Writer
    unit: str
    extension: str
    reads: frozenset[Option] = frozenset()
    output: Output = Output.STREAM
    binary: bool = False
    extra: Extra | None = None

    @property
    def accepts(self) -> frozenset[Source]:
        """The sources it takes."""
        return frozenset(self.describe)


__all__ = [
    "ExportFormat",
    "ExportSource",
    "Extra",
    "JournalSource",
    "NativeSource",
    "Option",
    "Output",
    "Settings",
    "Source",
    "Writer",
    "Written",
]
