"""What ``pvisor journal scrub`` did (:mod:`pvisor.journal.scrub`): the :class:`ScrubReport`
each step of a scrub adds its counts and places to, and ``--json`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScrubReport:
    """What :func:`scrub` did. ``matches``: replacements in bodies and cells; ``blobs_changed``:
    blobs whose bytes held the text (each now under a new sha256); ``blobs_reencoded``: blobs
    re-encoded only because their base changed; ``rows_rewritten``: rows that named an old
    sha256; ``cells_changed``: metadata cells that held the text; ``files_changed``: run
    directory files rewritten; ``names_changed``: files and directories renamed (the text was in
    their name), by their new path, and symbolic links whose target held it; ``not_rewritten``:
    ``{path, why}`` of each file that holds the text but was left (a hard link shared with a file
    elsewhere, no permission); ``dry_run``: nothing was changed, the counts are what would be
    (``wal_truncated`` is None then); ``live_writers``: the pids of the writers that held a live
    lease when ``force`` went past them (their next bodies may be stored against blobs the scrub
    replaced); ``bytes_before`` / ``bytes_after``: the journal and its WAL; ``wal_truncated``:
    False when a reader kept the WAL from being emptied; ``problems``: what the verification
    found; ``remaining``: where the text's bytes are still found."""

    pattern: str
    run: str | None = None
    dry_run: bool = False
    matches: int = 0
    blobs_changed: int = 0
    blobs_reencoded: int = 0
    rows_rewritten: int = 0
    cells_changed: int = 0
    run_dirs: list[str] = field(default_factory=list)
    files_changed: list[str] = field(default_factory=list)
    names_changed: list[str] = field(default_factory=list)
    not_rewritten: list[dict] = field(default_factory=list)
    live_writers: list[int] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    wal_truncated: bool | None = True
    problems: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    @property
    def clean(self) -> bool:
        return not self.problems and not self.remaining and self.wal_truncated is not False
