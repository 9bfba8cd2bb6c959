"""The Event Journal: the canonical model and its SQLite store (docs/journal.md).

- The model: :mod:`.model` (runs, attempts, exchanges, conversations, trajectories, the
  outcome and mode enums), :mod:`.exchange_end` (one exchange's end as the gateway hands it
  over), :mod:`.redact` (secret redaction before anything is stored).
- Writing: :mod:`.producer` (what a gateway calls: :class:`~.producer.JournalProducer`),
  :mod:`.writer` (:class:`~.writer.Journal`, the thread that owns the connection and commits),
  :mod:`.rows` (the rows of each message), :mod:`.messages` (the message kinds),
  :mod:`.reassembly` (streams reassembled after commits), :mod:`.writer_process`,
  :mod:`.writer_child` and :mod:`.writer_wire` (the writer in a process of its own).
- Reading: :mod:`.reader`, :mod:`.sql` (SQL with readable bodies, read-only),
  :mod:`.exported` (a JSON Lines export read back), :mod:`.datasette_plugin`.
- Storage: :mod:`.schema` (versioned migrations), :mod:`.paths`, :mod:`.blobs`
  (content-addressed zstd), :mod:`.content_encoding`, :mod:`.snapshots` (workspace
  snapshots and their drivers), :mod:`.child_runs` (a handoff's child run).
- Removal: :mod:`.housekeeping` (``journal rm``, ``vacuum``), :mod:`.scrub` (``journal scrub``:
  the order of its steps) with :mod:`.scrub_pattern`, :mod:`.scrub_blobs`, :mod:`.scrub_rows`,
  :mod:`.scrub_files`, :mod:`.scrub_json` and :mod:`.scrub_report`.
- What every floor shares (errors, records, lazy regexes, progress, helper processes, build
  identity, digests, output files) lives below the store, in :mod:`pvisor.core`.

Imports nothing of pvisor's above it; below it only :mod:`pvisor.core`.
"""
