"""The journal's versioned schema, applied with sqlite-utils migrations.

Each migration is a function registered on :data:`MIGRATIONS`, applied in order inside a
transaction and recorded in ``_sqlite_migrations`` (sqlite-utils ``migrations.py``). The schema
version is the number of migrations applied; ``PRAGMA user_version`` mirrors it so that plain
``sqlite3`` users see it. ``docs/journal.md`` documents every table and column.
"""

from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

MIGRATION_SET = "pvisor.journal"
MIGRATIONS = Migrations(MIGRATION_SET)

_V1 = [
    """CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE writers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        proc_start TEXT,
        started_ms INTEGER NOT NULL,
        heartbeat_ms INTEGER NOT NULL,
        closed_ms INTEGER,
        closed_how TEXT
    )""",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        ts_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        run_id TEXT,
        exchange_id TEXT,
        writer_id INTEGER,
        data TEXT
    )""",
    "CREATE INDEX events_run ON events(run_id, seq)",
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        agent TEXT,
        agent_version TEXT,
        argv TEXT NOT NULL DEFAULT '[]',
        created_ms INTEGER NOT NULL,
        parent_run TEXT,
        boundary_step INTEGER,
        mode TEXT NOT NULL DEFAULT 'capture',
        labels TEXT NOT NULL DEFAULT '{}'
    )""",
    """CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        n INTEGER NOT NULL,
        started_ms INTEGER NOT NULL,
        ended_ms INTEGER,
        exit_code INTEGER,
        labels TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, n)
    )""",
    """CREATE TABLE blobs (
        sha256 TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        codec TEXT NOT NULL,
        base TEXT,
        data BLOB NOT NULL
    )""",
    """CREATE TABLE exchanges (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        seq INTEGER NOT NULL,
        protocol TEXT,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        query TEXT NOT NULL DEFAULT '',
        request_headers TEXT NOT NULL DEFAULT '{}',
        secret_fingerprints TEXT NOT NULL DEFAULT '{}',
        dropped_headers TEXT NOT NULL DEFAULT '[]',
        request_encoding TEXT,
        request_body TEXT,
        request_bytes INTEGER NOT NULL DEFAULT 0,
        status INTEGER,
        response_headers TEXT NOT NULL DEFAULT '{}',
        response_body TEXT,
        response_final TEXT,
        streamed INTEGER NOT NULL DEFAULT 0,
        chunk_timings BLOB,
        outcome TEXT,
        error TEXT,
        started_ms REAL NOT NULL,
        headers_us INTEGER,
        first_byte_us INTEGER,
        ended_us INTEGER,
        bytes_received INTEGER NOT NULL DEFAULT 0,
        bytes_delivered INTEGER NOT NULL DEFAULT 0,
        chain INTEGER,
        role TEXT,
        writer_id INTEGER,
        lane_pos INTEGER
    )""",
    "CREATE INDEX exchanges_run ON exchanges(run_id, seq)",
    "CREATE INDEX exchanges_writer_open ON exchanges(writer_id) WHERE outcome IS NULL",
]


@MIGRATIONS(name="m001_initial")
def m001_initial(db: Database) -> None:
    """Tables meta, writers, events, runs, attempts, blobs, exchanges."""
    for statement in _V1:
        db.execute(statement)


@MIGRATIONS(name="m002_exchanges_by_arrival")
def m002_exchanges_by_arrival(db: Database) -> None:
    """Index exchanges by (run, started_ms): the writer ranks each new exchange by arrival."""
    db.execute("CREATE INDEX exchanges_run_start ON exchanges(run_id, started_ms)")


@MIGRATIONS(name="m003_served_by")
def m003_served_by(db: Database) -> None:
    """Exchanges say who answered (``served_by``: upstream, scripted, playback, refused; NULL
    for exchanges recorded before this migration) and carry ``flags`` (a JSON list of strings,
    such as ``synthetic_end``)."""
    db.execute("ALTER TABLE exchanges ADD COLUMN served_by TEXT")
    db.execute("ALTER TABLE exchanges ADD COLUMN flags TEXT NOT NULL DEFAULT '[]'")


@MIGRATIONS(name="m004_forwarded_body")
def m004_forwarded_body(db: Database) -> None:
    """Exchanges keep the bytes forwarded upstream when they differ from the agent's
    (``forwarded_body``: a blob sha256, like ``request_body``; NULL when the request went
    upstream as the agent sent it, or not at all). A continuation that injects a boundary
    user prompt or rewrites reasoning forwards other bytes than the agent sent: both are kept."""
    db.execute("ALTER TABLE exchanges ADD COLUMN forwarded_body TEXT")


@MIGRATIONS(name="m005_snapshots")
def m005_snapshots(db: Database) -> None:
    """Workspace snapshots (``snapshots``): one row per checkpoint of a run's workspace, taken at
    the start of the run (``kind`` ``start``), when a candidate main-loop request arrived
    (``request``, ``exchange_id`` names it) and at the end (``end``). ``manifest`` is the blob
    sha256 of its manifest (docs/journal.md "Workspace snapshots"), whose file contents are
    blobs too; ``after_step`` is the step whose tools the workspace has seen (0: before the
    first action), bound when the run is classified (NULL: not bound, or an auxiliary request)."""
    db.execute(
        """CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        kind TEXT NOT NULL,
        exchange_id TEXT,
        driver TEXT NOT NULL,
        manifest TEXT,
        taken_ms REAL NOT NULL,
        walk_us INTEGER,
        hold_us INTEGER,
        entries INTEGER NOT NULL DEFAULT 0,
        files INTEGER NOT NULL DEFAULT 0,
        bytes INTEGER NOT NULL DEFAULT 0,
        read_bytes INTEGER NOT NULL DEFAULT 0,
        warnings TEXT NOT NULL DEFAULT '[]',
        error TEXT,
        after_step INTEGER,
        writer_id INTEGER
    )"""
    )
    db.execute("CREATE INDEX snapshots_run ON snapshots(run_id, taken_ms)")
    db.execute("CREATE INDEX snapshots_exchange ON snapshots(exchange_id)")


@MIGRATIONS(name="m006_response_parts")
def m006_response_parts(db: Database) -> None:
    """What an exchange still in flight has received so far (``response_parts``): appended every
    commit window while the response comes, so that a crash keeps it; removed when the exchange
    is written whole, or joined into its ``response_body`` when it is marked ``incomplete``."""
    db.execute(
        """CREATE TABLE response_parts (
        exchange_id TEXT NOT NULL,
        offset INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (exchange_id, offset)
    ) WITHOUT ROWID"""
    )


@MIGRATIONS(name="m007_capture")
def m007_capture(db: Database) -> None:
    """Exchanges say how the gateway received them (``capture``: ``reverse``, the agent sent it
    to the gateway's URL, or ``intercept``, it went to the model API's own host through the
    forward proxy of intercept mode). Exchanges recorded before were all ``reverse``."""
    db.execute("ALTER TABLE exchanges ADD COLUMN capture TEXT NOT NULL DEFAULT 'reverse'")


#: the references m008 declares, per table: (column, table, column)
FOREIGN_KEYS_M008: dict[str, list[tuple[str, str, str]]] = {
    "attempts": [("run_id", "runs", "id")],
    "exchanges": [
        ("run_id", "runs", "id"),
        ("request_body", "blobs", "sha256"),
        ("response_body", "blobs", "sha256"),
        ("response_final", "blobs", "sha256"),
        ("forwarded_body", "blobs", "sha256"),
    ],
    "snapshots": [
        ("run_id", "runs", "id"),
        ("exchange_id", "exchanges", "id"),
        ("manifest", "blobs", "sha256"),
    ],
}


@MIGRATIONS(name="m008_foreign_keys")
def m008_foreign_keys(db: Database) -> None:
    """Declare the references between runs, attempts, exchanges, snapshots and blobs, for tools
    to follow (Datasette links them). Not enforced: ``PRAGMA foreign_keys`` stays off (a run is
    created with its first exchange, and a body may be committed before the row that names it).
    SQLite declares a foreign key only in ``CREATE TABLE``, so each table is rebuilt (sqlite-utils
    ``transform``: a copy, then a rename; indexes recreated): its rows are metadata, the bodies
    are in ``blobs``, which is not rebuilt (its ``base`` would need a copy of every body;
    docs/benchmarks.md "Journal migrations" has the cost)."""
    for table, keys in FOREIGN_KEYS_M008.items():
        have = {(fk.column, fk.other_table, fk.other_column) for fk in db[table].foreign_keys}
        missing = [k for k in keys if k not in have]
        if missing:
            db[table].transform(add_foreign_keys=missing)


#: the views of m009 (docs/journal.md "Reading it with SQL"): they call pvisor_json, which
#: pvisor.journal.sql registers (pvisor journal sql, the Datasette plugin); a plain SQLite tool
#: reads every table but these two. Frozen as m009 made them: a change is a new migration (a
#: literal is cut only to keep the source lines within 110 characters).
VIEWS_M009: dict[str, str] = {
    "exchange_bodies": (
        """SELECT e.id, e.run_id, e.attempt, e.seq, e.chain, e.role, e.protocol, e.method,
        e.path, e.status, e.outcome, e.served_by, e.streamed, e.started_ms,
        pvisor_json(e.request_body) AS request,
        CASE WHEN e.response_final IS NOT NULL THEN pvisor_json(e.response_final)
             ELSE pvisor_json(e.response_body, json_extract(e.response_headers, '$."content-encoding"')) END
             AS response,
        pvisor_json(e.response_body, json_extract(e.response_headers, '$."content-encoding"')) """
        """AS response_raw,
        e.request_body, e.response_body, e.response_final
        FROM exchanges e"""
    ),
    "run_summary": """SELECT r.id, r.agent, r.agent_version, r.mode, r.parent_run, r.boundary_step,
        strftime('%Y-%m-%dT%H:%M:%fZ', r.created_ms / 1000.0, 'unixepoch') AS created,
        (SELECT count(*) FROM attempts a WHERE a.run_id = r.id) AS attempts,
        (SELECT count(*) FROM exchanges e WHERE e.run_id = r.id) AS exchanges,
        (SELECT count(*) FROM exchanges e WHERE e.run_id = r.id AND e.role = 'main') AS main_exchanges,
        (SELECT coalesce(sum(e.bytes_received), 0) FROM exchanges e WHERE e.run_id = r.id) AS bytes_received
        FROM runs r""",
}


@MIGRATIONS(name="m009_readable_views")
def m009_readable_views(db: Database) -> None:
    """Views that show bodies as text (``exchange_bodies``, ``run_summary``; they need the
    functions of :mod:`pvisor.journal.sql`: a tool without them can read every table but these)."""
    for name, select in VIEWS_M009.items():
        db.execute(f"CREATE VIEW IF NOT EXISTS {name} AS {select}")


@MIGRATIONS(name="m010_handoff_lineage")
def m010_handoff_lineage(db: Database) -> None:
    """A handoff's child run (mode ``handoff``, created by ``TrajectoryReplay.restore_handoff``)
    keeps its pause beside the count of steps kept (``boundary_step``): ``pause_transition``,
    the pause's transition (zero-based: the documents' numbering; NULL for other runs and for the
    task alone of a run without a step), and ``workspace_snapshot``, the manifest digest of the
    snapshot restored for it (a blob sha256). NULL for runs made before this migration."""
    db.execute("ALTER TABLE runs ADD COLUMN pause_transition INTEGER")
    db.execute("ALTER TABLE runs ADD COLUMN workspace_snapshot TEXT")


@MIGRATIONS(name="m011_start_environment")
def m011_start_environment(db: Database) -> None:
    """Runs keep the environment their agent was started in (``environment``: a JSON document
    ``pvisor.start-environment/v1``, the working directory and the variables recorded by
    ``pvisor run``; docs/journal.md "The start environment"). NULL for a run pvisor did not
    start (``pvisor gateway``) and for runs made before this migration."""
    db.execute("ALTER TABLE runs ADD COLUMN environment TEXT")


#: tables of a pvisor journal; a database with other tables and none of these is not one
JOURNAL_TABLES = ("meta", "writers", "events", "runs", "attempts", "blobs", "exchanges")


def schema_version() -> int:
    """The schema version this pvisor writes: the number of registered migrations."""
    return len(MIGRATIONS._migrations)


def known_migration_names() -> list[str]:
    return [m.name for m in MIGRATIONS._migrations]


def apply_migrations(db: Database) -> int:
    """Apply pending migrations; return the resulting schema version."""
    MIGRATIONS.apply(db)
    version = len(MIGRATIONS.applied(db))
    db.execute(f"PRAGMA user_version = {int(version)}")
    return version
