"""What migration m008_foreign_keys costs on a large journal (docs/benchmarks.md, "Journal
migrations").

SQLite declares a foreign key only in CREATE TABLE, so m008 rebuilds ``attempts``, ``exchanges``
and ``snapshots`` (sqlite-utils ``transform``: copy, drop, rename, indexes recreated). This
builds a journal with the real writer (one run, one exchange with bodies), grows ``exchanges``
to N rows by copying that row under new ids (the rows are metadata: the bodies stay in
``blobs``), takes it back to schema 7 (no foreign keys, no views) and times, on a copy each:

- the migration as a writer applies it at open (``apply_migrations``: m008 and m009);
- the baseline, in the same run: ``VACUUM INTO`` a new file, a copy of the whole journal.

    python bench/migration_bench.py [--rows 100000,1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from sqlite_utils import Database

from pvisor.journal.model import Run
from pvisor.journal.schema import apply_migrations
from pvisor.journal.writer import Journal


def build(path: Path, rows: int) -> None:
    with Journal.open(path) as j:
        j.create_run(Run(id="r-big", agent="codex"))
        j.record_exchange(
            "r-big", "POST", "/v1/responses", [("content-type", "application/json")],
            protocol="openai-responses",
            status=200, request_body=b'{"input": []}' * 20, response_body=b'{"output": []}' * 20,
        )  # fmt: skip
        j.flush()
    conn = sqlite3.connect(path)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(exchanges)") if r[1] not in ("id", "seq")]
    names = ", ".join(cols)
    conn.execute("BEGIN")
    # rows 2..N: the first one's columns under new ids and seqs (a recursive counter)
    conn.execute(
        f"""WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
        INSERT INTO exchanges (id, seq, {names})
        SELECT printf('x-%016x', i), i, {names} FROM n, (SELECT {names} FROM exchanges LIMIT 1)""",
        (rows,),
    )
    conn.execute("COMMIT")
    # back to schema 7: the tables as m001-m007 made them, no views
    for view in ("exchange_bodies", "run_summary"):
        conn.execute(f"DROP VIEW IF EXISTS {view}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name IN ('m008_foreign_keys', 'm009_readable_views')")
    conn.commit()
    db = Database(conn)
    for table in ("attempts", "exchanges", "snapshots"):
        db[table].transform(drop_foreign_keys=[fk.column for fk in db[table].foreign_keys])
    conn.execute("VACUUM")
    conn.close()


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000,1000000")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-migration-bench-"))
    print("| exchanges | journal | m008 + m009 at open | baseline: VACUUM INTO (a copy) |")
    print("|---|---|---|---|")
    try:
        for rows in (int(r) for r in a.rows.split(",")):
            base = tmp / f"j{rows}.sqlite"
            build(base, rows)
            migrate, copy = [], []
            for i in range(a.repeat):
                work = tmp / f"w{rows}-{i}.sqlite"
                shutil.copy(base, work)
                conn = sqlite3.connect(work)
                migrate.append(timed(lambda: apply_migrations(Database(conn))))
                conn.close()
                out = tmp / f"c{rows}-{i}.sqlite"
                conn = sqlite3.connect(base)
                copy.append(timed(lambda: conn.execute("VACUUM INTO ?", (str(out),))))
                conn.close()
                for p in (work, out):
                    os.unlink(p)
            size = base.stat().st_size / 1e6
            print(f"| {rows:,} | {size:.0f} MB | {min(migrate):.2f} s | {min(copy):.2f} s |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
