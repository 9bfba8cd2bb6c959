"""Journal runs read and classified once per batch (:class:`JournalRuns`), as a batch reads a
native file once (:class:`~.batch.SourceReads`).

A prepare of a journal run reads every exchange of the run and classifies them into chains
(:func:`~pvisor.adapters.chains.classify_run`) before it takes one request body: for a 200-step
run that is almost all of its time (docs/benchmarks.md, "Batch preparation"). The lines of a
batch that name one run with the same options share that work: a :class:`JournalRuns` keeps
each journal open and each run's :class:`~.prefix.ClassifiedRun`, keyed by the journal (its
path as the line gives it: the results name it so), the run's full id, the agent (its chain
hint and its subagent tools) and the episode. Nothing else a line gives changes the
classification: ``protocol`` is only checked against the recorded one, and ``profile_from``
and ``session`` are refused for a run. The boundary, that check and the request body stay
each line's own.

A journal may be written while a batch reads it (a live run, a gateway capturing). A single
prepare-only reads what the journal holds when it reads it, finished or not; a cached run
gives the same, because a journal's runs are dropped as soon as anything was committed to it
since they were read: SQLite's ``PRAGMA data_version`` on the open connection changes on every
commit of another connection (https://sqlite.org/pragma.html#pragma_data_version), asked
before each line. A journal file replaced or moved (another inode under its path), or
overwritten in place (``cp`` keeps the inode, and a connection in WAL mode sees no commit: its
size or modification time changed), is opened again. A run whose reading or classification fails
is not kept: the next line that names it reads it again (and fails alike); a line that fails
after (its boundary past the end, another protocol) leaves the classified run to the others.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .prefix import ClassifiedRun, classify_journal_run

if TYPE_CHECKING:
    from pvisor.journal.reader import JournalReader


class _Open:
    """One journal kept open: its reader, the file's ``(st_dev, st_ino, st_size, st_mtime_ns)``
    when it was opened, and the connection's ``data_version`` when its runs were last known
    current."""

    __slots__ = ("reader", "identity", "version")

    def __init__(self, reader: "JournalReader", identity: tuple[int, ...], version: int) -> None:
        self.reader = reader
        self.identity = identity
        self.version = version


def _data_version(reader: "JournalReader") -> int:
    return reader.conn.execute("PRAGMA data_version").fetchone()[0]


class JournalRuns:
    """The journals and classified runs the prepares of one batch share (module docstring).

    ``max_journals``: journals kept open at once (the least recently used is closed first; each
    open reader keeps up to 64 MB of the bodies it restored, so that a line's request body,
    restored while the run was classified, is not restored again);
    ``max_runs``: classified runs kept (each holds the run's steps and its chains' requests:
    about 1 MB per 100 steps of bench/batch_bench.py's run, measured with tracemalloc).
    ``runs_classified`` counts the runs read and classified (what a batch of one run's boundaries
    pays once; the tests and bench/batch_bench.py read it). :meth:`close` closes the journals."""

    def __init__(self, max_journals: int = 4, max_runs: int = 16) -> None:
        self.max_journals = max_journals
        self.max_runs = max_runs
        self.runs_classified = 0
        self._journals: dict[str, _Open] = {}
        self._runs: dict[tuple, ClassifiedRun] = {}

    def reader(self, journal: str | os.PathLike) -> "JournalReader":
        """The open :class:`~pvisor.journal.reader.JournalReader` of ``journal`` (as the path is
        given: its ``path`` is what results name), opened on first use. The runs read from it
        are dropped when the journal changed since (a commit, another file under the path).
        Raises what opening it raises (UsageError, BadInputError, UnavailableError)."""
        from pvisor.journal.reader import JournalReader

        path = os.fspath(journal)
        st = os.stat(path)  # FileNotFoundError: the caller checked it exists, so a race: its error
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        held = self._journals.pop(path, None)
        # another file, or this one rewritten under the open connection (a checkpoint of a live
        # writer changes them too: the journal is opened again, as a single prepare would)
        if held is not None and held.identity != identity:
            self._drop(path, held)
            held = None
        if held is None:
            reader = JournalReader(path)
            try:
                held = _Open(reader, identity, _data_version(reader))
            except BaseException:
                reader.close()
                raise
            while len(self._journals) >= self.max_journals:
                oldest = next(iter(self._journals))
                self._drop(oldest, self._journals.pop(oldest))
        else:
            version = _data_version(held.reader)
            if version != held.version:  # written since: what was read from it may be out of date
                self._forget(path)
                held.version = version
        self._journals[path] = held  # last: the most recently used
        return held.reader

    def classified(
        self, reader: "JournalReader", run_id: str, agent: str, episode: str | None
    ) -> ClassifiedRun:
        """Run ``run_id`` (its full id) of the journal ``reader`` reads (one :meth:`reader`
        gave), classified for ``agent`` and ``episode``: read once, then kept until the journal
        changes. Raises what :func:`~.prefix.classify_journal_run` raises (nothing is kept)."""
        key = (reader.path, run_id, agent, episode)
        hit = self._runs.pop(key, None)
        if hit is None:
            hit = classify_journal_run(reader, run_id, agent, episode)
            self.runs_classified += 1
            while len(self._runs) >= self.max_runs:
                self._runs.pop(next(iter(self._runs)))
        self._runs[key] = hit  # last: the most recently used
        return hit

    def close(self) -> None:
        """Close every journal kept open and forget the runs."""
        for path, held in list(self._journals.items()):
            self._drop(path, held)
        self._journals.clear()

    def _drop(self, path: str, held: _Open) -> None:
        self._forget(path)
        held.reader.close()

    def _forget(self, path: str) -> None:
        for key in [k for k in self._runs if k[0] == path]:
            del self._runs[key]


__all__ = ["JournalRuns"]
