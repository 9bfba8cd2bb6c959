"""The rows of a journal: what the writer thread writes for each message a producer sends.

One :class:`Rows` per writer (:class:`~pvisor.journal.writer.Journal`), used by its thread only,
inside the transaction the writer opened: the row writer of each
:class:`~pvisor.journal.messages.MessageKind` (:meth:`Rows.handlers`; ``flush`` and ``close`` are
the writer's own), the exchange's row made from its
:class:`~pvisor.journal.exchange_end.ExchangeEnd` (columns: docs/journal.md), what an exchange
in flight has so far, the blobs (content-addressed, compressed against the previous body of
their lane: :mod:`pvisor.journal.blobs`) and the event rows of the transaction. Secrets are
redacted here, before anything is stored (:mod:`pvisor.journal.redact`): request headers, the
query, an error body that echoes the request's key, an error text.

Rows hold in-memory state tied to what is committed (compression lanes, the runs known to exist,
the last exchange of each run): after a rolled-back transaction the writer calls
:meth:`Rows.reset`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import logging

import orjson

from . import blobs
from .content_encoding import DECODED_ENCODING_HEADER, DecodeError, decode_body, decode_prefix
from .exchange_end import ExchangeEnd
from .messages import MessageKind
from .exchange_end import Outcome
from .model import TRUNCATED_FLAG, UNDECODABLE_FLAG, Attempt, Run, pack_timings
from .producer import PendingExchange, now_ms
from .reassembly import Reassembly
from .redact import (
    REQUEST_HEADER_ALLOW,
    redact_echoed_secrets,
    redact_exchange_meta,
    redact_path,
    redact_text,
    request_secrets,
)
from .snapshots import SnapshotRecord

#: what a compressed error body is decoded to, at most (and never past --max-response-body):
#: errors are a few hundred bytes, while a crafted one decodes to gigabytes from a few KB on the
#: wire, and the writer decodes and cleans it in one call that holds every other commit
MAX_DECODED_ERROR = 8 << 20

log = logging.getLogger("pvisor.journal")


def cut_secret_prefix(body: bytes, secrets: Iterable[str]) -> bytes:
    """``body`` (an error response journaled in part, flag ``truncated``) without the start of
    a credential it ends with (8 characters or more): the cut may fall inside an echoed key,
    which the redaction of whole keys does not find."""
    for value in secrets:
        needle = value.encode("utf-8", "surrogateescape")
        for k in range(min(len(needle) - 1, len(body)), 7, -1):
            if body.endswith(needle[:k]):
                return body[:-k]
    return body


@dataclass(slots=True)
class Lane:
    """Per (run, method, path) delta-compression state: recent body shas by lane position."""

    pos: int = -1
    last: tuple[str, bytes] | None = None  # (sha, body) at pos
    keyframes: dict[int, tuple[str, bytes]] = field(default_factory=dict)


class Rows:
    """The row writers of one journal writer (module docstring). ``path`` names the journal in
    log lines; ``max_decoded``: the bytes a request body is decoded to, at most; streams stored
    are offered to ``reassembly``. ``writer_id`` and ``fingerprint_key`` are the writer's lease
    row and the journal's key of secret fingerprints, set once the writer has them; ``events``
    the event rows of the transaction in progress."""

    def __init__(self, path: Path, max_decoded: int, reassembly: Reassembly):
        self.path = path
        self.max_decoded = max_decoded
        self.reassembly = reassembly
        self.writer_id: int | None = None
        self.fingerprint_key: bytes = b""
        self.events: list[tuple] = []
        self.lanes: dict[tuple[str, str, str], Lane] = {}
        self._known_runs: set[str] = set()
        # run -> (seq, started_ms, id) of its last exchange, this transaction
        self._last_of_run: dict[str, tuple] = {}

    def new_transaction(self) -> None:
        """A transaction begins: other writers may have added exchanges since the last one."""
        self._last_of_run.clear()

    def reset(self) -> None:
        """The transaction was rolled back: its events are gone, and the bodies it wrote, so
        compression lanes start afresh."""
        self.events.clear()
        self.lanes.clear()
        self._known_runs.clear()

    def handlers(self) -> dict[MessageKind, Callable[[sqlite3.Connection, Any], None]]:
        """The row writer of each message kind but ``flush`` and ``close`` (the writer's own)."""
        return {
            MessageKind.RUN: self._write_run,
            MessageKind.RUN_UPDATE: self._update_run,
            MessageKind.ATTEMPT: self._write_attempt,
            MessageKind.ATTEMPT_END: self._end_attempt,
            MessageKind.EXCHANGE_ROLES: self._set_roles,
            MessageKind.INFLIGHT: self._not_here,
            MessageKind.EXCHANGE: self._write_exchange,
            MessageKind.BLOBS: self._write_blobs,
            MessageKind.SNAPSHOT: self._write_snapshot,
            MessageKind.SNAPSHOT_HOLD: self._hold_snapshot,
            MessageKind.SNAPSHOT_BIND: self._bind_snapshots,
        }

    def event(
        self,
        conn: sqlite3.Connection,
        kind: str,
        run: str | None = None,
        exchange: str | None = None,
        data: Any = None,
    ) -> None:
        """Queue an event row for the current transaction (written by :meth:`_flush_events`)."""
        self.events.append(
            (
                now_ms(),
                kind,
                run,
                exchange,
                self.writer_id,
                orjson.dumps(data).decode() if data is not None else None,
            )
        )

    def flush_events(self, conn: sqlite3.Connection) -> None:
        if self.events:
            conn.executemany(
                "INSERT INTO events(ts_ms, kind, run_id, exchange_id, writer_id, data)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                self.events,
            )
            self.events.clear()

    def _ensure_run(self, conn: sqlite3.Connection, run: str) -> None:
        if run in self._known_runs:
            return
        cur = conn.execute("INSERT OR IGNORE INTO runs(id, created_ms) VALUES (?, ?)", (run, now_ms()))
        if cur.rowcount:
            self.event(conn, "run.created", run=run)
        self._known_runs.add(run)

    def _write_run(self, conn: sqlite3.Connection, r: Run) -> None:
        cur = conn.execute(
            "INSERT OR IGNORE INTO runs(id, agent, agent_version, argv, created_ms, parent_run, "
            "boundary_step, mode, labels, pause_transition, workspace_snapshot) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r.id,
                r.agent,
                r.agent_version,
                orjson.dumps(r.argv).decode(),
                r.created_ms,
                r.parent_run,
                r.boundary_step,
                r.mode,
                orjson.dumps(r.labels).decode(),
                r.pause_transition,
                r.workspace_snapshot,
            ),
        )
        if cur.rowcount:
            self.event(conn, "run.created", run=r.id, data={"agent": r.agent, "mode": r.mode})

    def _update_run(self, conn: sqlite3.Connection, payload: tuple[str, dict[str, Any]]) -> None:
        run_id, fields = payload
        self._ensure_run(conn, run_id)
        allowed = {
            "agent", "agent_version", "argv", "parent_run", "boundary_step", "mode", "labels", "environment"
        }  # fmt: skip
        sets, args = [], []
        for k, v in fields.items():
            if k not in allowed:
                raise ValueError(f"unknown run field {k!r}")
            if k == "labels":
                old = conn.execute("SELECT labels FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
                v = {**orjson.loads(old), **v}
            sets.append(f"{k} = ?")
            args.append(orjson.dumps(v).decode() if k in ("argv", "labels", "environment") else v)
        if sets:
            conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?", (*args, run_id))
            self.event(conn, "run.updated", run=run_id, data=sorted(fields))

    def _set_roles(self, conn: sqlite3.Connection, payload: tuple[str, list]) -> None:
        run_id, rows = payload
        changed = 0
        for chain, role, ex_id in rows:
            changed += conn.execute(
                "UPDATE exchanges SET chain = ?, role = ? WHERE id = ? AND run_id = ?",
                (chain, role, ex_id, run_id),
            ).rowcount
        counts = {
            "main": sum(1 for r in rows if r[1] == "main"),
            "auxiliary": sum(1 for r in rows if r[1] == "auxiliary"),
            "unknown": len(rows) - changed,
        }
        if counts["unknown"]:
            log.warning(
                "journal %s: run %s: %d exchange id(s) given roles are not exchanges of the run",
                self.path,
                run_id,
                counts["unknown"],
            )
        self.event(conn, "exchange.roles", run=run_id, data=counts)

    def _write_blobs(self, conn: sqlite3.Connection, payload: list[tuple[str, bytes]]) -> None:
        for sha, data in payload:
            self.put_blob(conn, data, sha=sha)

    def _hold_snapshot(self, conn: sqlite3.Connection, payload: tuple[str, int]) -> None:
        conn.execute("UPDATE snapshots SET hold_us = ? WHERE id = ?", (payload[1], payload[0]))

    def _bind_snapshots(self, conn: sqlite3.Connection, payload: tuple[str, dict[str, int | None]]) -> None:
        run_id, binding = payload
        for snap_id, step in binding.items():
            conn.execute(
                "UPDATE snapshots SET after_step = ? WHERE id = ? AND run_id = ?", (step, snap_id, run_id)
            )
        self.event(conn, "snapshot.bound", run=run_id, data={"snapshots": len(binding)})

    def _write_attempt(self, conn: sqlite3.Connection, a: Attempt) -> None:
        self._ensure_run(conn, a.run)
        conn.execute(
            "INSERT OR REPLACE INTO attempts(run_id, n, started_ms, ended_ms, exit_code, labels)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (a.run, a.n, a.started_ms, a.ended_ms, a.exit_code, orjson.dumps(a.labels).decode()),
        )
        self.event(conn, "attempt.started", run=a.run, data={"attempt": a.n})

    def _end_attempt(self, conn: sqlite3.Connection, payload: tuple) -> None:
        run_id, n, ended, code, labels = payload
        old = conn.execute("SELECT labels FROM attempts WHERE run_id = ? AND n = ?", (run_id, n)).fetchone()
        merged = {**(orjson.loads(old[0]) if old else {}), **labels}
        if old is None:
            self._ensure_run(conn, run_id)
            conn.execute(
                "INSERT INTO attempts(run_id, n, started_ms, ended_ms, exit_code, labels)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, n, ended, ended, code, orjson.dumps(merged).decode()),
            )
        else:
            conn.execute(
                "UPDATE attempts SET ended_ms = ?, exit_code = ?, labels = ? WHERE run_id = ? AND n = ?",
                (ended, code, orjson.dumps(merged).decode(), run_id, n),
            )
        self.event(conn, "attempt.ended", run=run_id, data={"attempt": n, "exit_code": code})

    def _not_here(self, conn: sqlite3.Connection, payload: Any) -> None:
        # a writer process's child applies what an ``inflight`` message says to its own
        # exchanges in flight (writer_wire.apply_inflight); it never reaches a writer thread
        raise ValueError(
            "journal message 'inflight' goes to a writer process's child, not to a writer thread"
        )

    @staticmethod
    def _credentials(p: PendingExchange) -> set[str]:
        """The credentials ``p``'s request carried (:func:`request_secrets`): never stored, and
        redacted from whatever of the exchange repeats them (response headers, the coding)."""
        return request_secrets(p.query, p.headers, p.path)

    def _meta_columns(self, p: PendingExchange) -> tuple:
        red = redact_exchange_meta(p.query, p.headers, self.fingerprint_key, allow=REQUEST_HEADER_ALLOW)
        return (
            red.query,
            orjson.dumps(red.headers).decode(),
            orjson.dumps(red.secrets).decode(),
            orjson.dumps(red.dropped).decode(),
        )

    def _place(self, conn: sqlite3.Connection, p: PendingExchange) -> int:
        """The ``seq`` of ``p`` in its run: its rank by arrival (``started_ms``, then id) among
        the run's exchanges. A row already written keeps its seq; a new one shifts the rows that
        arrived after it, so seq stays dense and in arrival order even when several writers
        (gateways) share a run, or a long exchange finishes after later ones."""
        if p.persisted:  # written in flight earlier: keeps its seq
            row = conn.execute("SELECT seq FROM exchanges WHERE id = ?", (p.id,)).fetchone()
            if row is not None:
                return row[0]
        last = self._last_of_run.get(p.run)  # valid within this transaction only
        if last is None:
            last = conn.execute(
                "SELECT seq, started_ms, id FROM exchanges WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                (p.run,),
            ).fetchone()
        if last is None:
            self._last_of_run[p.run] = (1, p.started_ms, p.id)
            return 1
        if (last[1], last[2]) < (p.started_ms, p.id):
            # the usual case: it arrived after every exchange written so far
            self._last_of_run[p.run] = (last[0] + 1, p.started_ms, p.id)
            return last[0] + 1
        later = conn.execute(
            "SELECT count(*) FROM exchanges"
            " WHERE run_id = ? AND (started_ms > ? OR (started_ms = ? AND id > ?))",
            (p.run, p.started_ms, p.started_ms, p.id),
        ).fetchone()[0]
        seq = last[0] - later + 1
        conn.execute("UPDATE exchanges SET seq = seq + 1 WHERE run_id = ? AND seq >= ?", (p.run, seq))
        self._last_of_run[p.run] = (last[0] + 1, last[1], last[2])
        return seq

    def write_inflight(self, conn: sqlite3.Connection, p: PendingExchange) -> None:
        """Store what exchange ``p`` in flight has that is not stored yet: its row (outcome
        NULL), its request body once read, its response head, the response bytes received
        since the last commit (one ``response_parts`` row)."""
        if not p.persisted:
            self._ensure_run(conn, p.run)
            query, headers, fps, dropped = self._meta_columns(p)
            conn.execute(
                "INSERT OR IGNORE INTO exchanges(id, run_id, attempt, seq, protocol, method, path, query,"
                " request_headers, secret_fingerprints, dropped_headers, started_ms, writer_id, capture,"
                " outcome)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL)",
                (
                    p.id,
                    p.run,
                    p.attempt,
                    self._place(conn, p),
                    p.protocol,
                    p.method,
                    redact_path(p.path),
                    query,
                    headers,
                    fps,
                    dropped,
                    p.started_ms,
                    self.writer_id,
                    p.capture,
                ),
            )
            self.event(conn, "exchange.started", run=p.run, exchange=p.id)
            p.persisted = True
        if p.request_body is not None and not p.request_stored:
            p.request_sha, p.lane_pos, p.request_error = self._request_blob(
                conn, p, p.request_body, p.request_encoding
            )
            conn.execute(
                "UPDATE exchanges SET request_body = ?, request_bytes = ?, request_encoding = ?, lane_pos = ?"
                " WHERE id = ?",
                (
                    p.request_sha,
                    len(p.request_body),
                    redact_text(p.request_encoding, self._credentials(p)) if p.request_encoding else None,
                    p.lane_pos,
                    p.id,
                ),
            )
            p.request_stored = True
        if p.status is not None and not p.head_stored:
            red = redact_exchange_meta(
                "",
                p.response_headers or [],
                self.fingerprint_key,
                allow=None,
                credentials=self._credentials(p),
            )
            conn.execute(
                "UPDATE exchanges SET status = ?, response_headers = ?, streamed = ? WHERE id = ?",
                (p.status, orjson.dumps(red.headers).decode(), 1 if p.streamed else 0, p.id),
            )
            p.head_stored = True
        chunks = p.chunks
        if chunks is not None and len(chunks) > p.parts_taken:
            n = len(chunks)  # the producer may append meanwhile: what is past n waits for the next commit
            data = b"".join(chunks[p.parts_taken : n])
            conn.execute(
                "INSERT OR REPLACE INTO response_parts(exchange_id, offset, data) VALUES (?, ?, ?)",
                (p.id, p.parts_bytes, data),
            )
            p.parts_taken, p.parts_bytes = n, p.parts_bytes + len(data)
        if chunks is not None and (p.parts_bytes or p.delivered != p.delivered_stored):
            delivered = min(p.delivered, p.parts_bytes)
            conn.execute(
                "UPDATE exchanges SET bytes_received = ?, bytes_delivered = ? WHERE id = ?",
                (p.parts_bytes, delivered, p.id),
            )
            p.delivered_stored = p.delivered

    def _request_blob(
        self, conn: sqlite3.Connection, p: PendingExchange, body: bytes, encoding: str | None
    ) -> tuple[str, int | None, str | None]:
        """Store a request body: decoded when ``encoding`` is set, in the lane of its run and
        path. Returns (sha256, lane position, decode error): a body that does not decode is
        stored raw, outside the lane, with the reason."""
        if encoding:
            try:
                body = decode_body(body, encoding, limit=self.max_decoded)
            except DecodeError as exc:
                return self.put_blob(conn, body), None, str(exc)
        sha, pos = self._put_request_body(conn, p, body)
        return sha, pos, None

    def _redacted_error(
        self, body: bytes, headers: dict[str, str], p: PendingExchange, limit: int
    ) -> tuple[bytes, tuple[str, ...]]:
        """An error response ``body`` cleaned of the credentials of ``p``'s request, and the flags
        it adds. A body received with a ``Content-Encoding`` (the SDKs ask for gzip, br, zstd) is
        decoded first, streaming and at most ``limit`` bytes (the exchange's
        ``--max-response-body``) or :data:`MAX_DECODED_ERROR`, and stored decoded: ``headers``
        (the stored response headers, changed in place) then record the coding as
        ``pvisor-decoded-content-encoding`` instead of ``content-encoding``. The decoded start
        is kept when the rest is cut at ``limit`` or
        does not decode (a cut or corrupt stream): flag ``truncated``. A body none of which
        decodes (an unknown coding, a wrong label) is never kept as it came (a key in it would
        be hidden by the coding): the stored body is empty, flag ``undecodable_dropped``."""
        flags: tuple[str, ...] = ()
        encoding = headers.get("content-encoding")
        if encoding and encoding.strip().lower() != "identity":
            headers[DECODED_ENCODING_HEADER] = headers.pop("content-encoding")
            try:
                body, whole = decode_prefix(body, encoding, limit=min(limit, MAX_DECODED_ERROR))
            except DecodeError:
                return b"", (UNDECODABLE_FLAG,)
            if not whole:
                flags = (TRUNCATED_FLAG,)
        elif len(body) > limit:
            body, flags = body[:limit], (TRUNCATED_FLAG,)
        body = redact_echoed_secrets(body, p.query, p.headers, p.path)
        if flags:
            body = cut_secret_prefix(body, request_secrets(p.query, p.headers, p.path))
        return body, flags

    def assemble_parts(self, conn: sqlite3.Connection, writer_id: int) -> None:
        """Join the response parts of ``writer_id``'s exchanges still in flight into their
        ``response_body`` (they are about to be marked ``incomplete``) and remove the parts."""
        ids = [r[0] for r in conn.execute(
            "SELECT DISTINCT p.exchange_id FROM response_parts p JOIN exchanges e ON e.id = p.exchange_id"
            " WHERE e.writer_id = ? AND e.outcome IS NULL", (writer_id,))]  # fmt: skip
        for ex_id in ids:
            parts = conn.execute(
                "SELECT data FROM response_parts WHERE exchange_id = ? ORDER BY offset", (ex_id,)
            )
            data = b"".join(r[0] for r in parts)
            conn.execute(
                "UPDATE exchanges SET response_body = ?, bytes_received = ? WHERE id = ?",
                (self.put_blob(conn, data), len(data), ex_id),
            )
            conn.execute("DELETE FROM response_parts WHERE exchange_id = ?", (ex_id,))

    def put_blob(
        self,
        conn: sqlite3.Connection,
        data: bytes,
        base: tuple[str, bytes] | None = None,
        sha: str | None = None,
    ) -> str:
        sha = sha or blobs.sha256_hex(data)
        if conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)).fetchone() is None:
            if base is not None and base[0] == sha:
                base = None
            codec, stored = blobs.encode(data, base[1] if base else None)
            conn.execute(
                "INSERT INTO blobs(sha256, size, codec, base, data) VALUES (?, ?, ?, ?, ?)",
                (sha, len(data), codec, base[0] if codec == "zstd-prefix" else None, stored),
            )
        return sha

    def _put_request_body(self, conn: sqlite3.Connection, p: PendingExchange, body: bytes) -> tuple[str, int]:
        return self._put_lane_blob(conn, (p.run, p.method, p.path), body)

    def _put_lane_blob(
        self, conn: sqlite3.Connection, key: tuple[str, str, str], body: bytes, sha: str | None = None
    ) -> tuple[str, int]:
        """Store ``body`` compressed against an earlier body of its lane ``key`` (a run's
        requests to one path, or its snapshot manifests; the reference ``blobs.reference_position``
        picks keeps chains short): a body that repeats the last one with a little more costs
        little. ``sha``: the body's sha256 when the caller has it (a snapshot manifest's digest)."""
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane()
        pos = lane.pos + 1
        ref = blobs.reference_position(pos)
        if ref is None:
            base = None
        elif ref == pos - 1:
            base = lane.last
        else:
            base = lane.keyframes.get(ref)
        sha = self.put_blob(conn, body, base, sha=sha)
        lane.pos = pos
        lane.last = (sha, body)
        if pos % blobs.KEYFRAME_EVERY == 0:
            # keep only what the next keyframe references
            lane.keyframes = {pos: (sha, body)}
        return sha, pos

    def _write_snapshot(self, conn: sqlite3.Connection, r: SnapshotRecord) -> None:
        self._ensure_run(conn, r.run)
        manifest = None
        if r.manifest is not None:
            # each manifest repeats the last one but for what changed: stored as a delta
            manifest, _ = self._put_lane_blob(conn, (r.run, "SNAPSHOT", "manifest"), r.manifest, r.digest)
        conn.execute(
            "INSERT OR REPLACE INTO snapshots(id, run_id, attempt, kind, exchange_id, driver, manifest,"
            " taken_ms, walk_us, entries, files, bytes, read_bytes, warnings, error, after_step, writer_id)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                r.id,
                r.run,
                r.attempt,
                r.kind.value,
                r.exchange,
                r.driver,
                manifest,
                r.taken_ms,
                r.walk_us,
                r.entries,
                r.files,
                r.bytes,
                r.read_bytes,
                orjson.dumps(r.warnings).decode(),
                r.error,
                r.after_step,
                self.writer_id,
            ),
        )
        self.event(
            conn,
            "snapshot.taken",
            run=r.run,
            exchange=r.exchange,
            data={"snapshot": r.id, "kind": r.kind.value, "manifest": manifest, "error": r.error},
        )

    def _write_exchange(self, conn: sqlite3.Connection, end: ExchangeEnd) -> None:
        """The ``exchanges`` row of ``end`` (its columns: docs/journal.md), its bodies as blobs.
        ``end`` is read, not changed, but for its response body given as chunks, which becomes
        the joined bytes (held once)."""
        p = end.pending
        self._ensure_run(conn, p.run)
        request_sha, lane_pos, outcome, error = self._store_request(conn, end)
        forwarded_sha = self.put_blob(conn, end.forwarded_body) if end.forwarded_body is not None else None
        received = end.response_size() if end.bytes_received is None else end.bytes_received
        delivered = end.response_size() if end.bytes_delivered is None else end.bytes_delivered
        resp_headers = redact_exchange_meta(
            "", end.response_headers, self.fingerprint_key, allow=None, credentials=self._credentials(p)
        )
        response_sha, flags = self._store_response(conn, end, resp_headers.headers)
        query, headers, fps, dropped = self._meta_columns(p)
        if error:  # an error text may quote the URL or an upstream's echo of the key
            error = redact_text(error, request_secrets(p.query, p.headers, p.path))
        fps_all = orjson.loads(fps)
        fps_all.update({"response:" + k: v for k, v in resp_headers.secrets.items()})
        conn.execute(
            "INSERT OR REPLACE INTO exchanges(id, run_id, attempt, seq, protocol, method, path, query,"
            " request_headers, secret_fingerprints, dropped_headers, request_encoding, request_body,"
            " request_bytes, status, response_headers, response_body, response_final, streamed,"
            " chunk_timings, outcome, error, started_ms, headers_us, first_byte_us, ended_us,"
            " bytes_received, bytes_delivered, writer_id, lane_pos, served_by, flags, forwarded_body,"
            " capture)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                p.id,
                p.run,
                p.attempt,
                self._place(conn, p),
                p.protocol,
                p.method,
                redact_path(p.path),
                query,
                headers,
                orjson.dumps(fps_all).decode(),
                dropped,
                # a key sent as the Content-Encoding value is not stored in clear either
                redact_text(end.request_encoding, self._credentials(p)) if end.request_encoding else None,
                request_sha,
                len(end.request_body or b"") if end.request_bytes is None else end.request_bytes,
                end.status,
                orjson.dumps(resp_headers.headers).decode(),
                response_sha,
                None,
                1 if end.streamed else 0,
                pack_timings(end.chunk_timings) or None,
                outcome.value,
                error,
                p.started_ms,
                end.headers_us,
                end.first_byte_us,
                end.ended_us,
                received,
                delivered,
                self.writer_id,
                lane_pos,
                None if end.served_by is None else end.served_by.value,
                orjson.dumps(list(flags)).decode(),
                forwarded_sha,
                p.capture,
            ),
        )
        if p.parts_taken:
            conn.execute("DELETE FROM response_parts WHERE exchange_id = ?", (p.id,))  # whole now
        self.event(
            conn,
            "exchange.finished",
            run=p.run,
            exchange=p.id,
            data={"outcome": outcome.value, "status": end.status},
        )

    def _store_request(
        self, conn: sqlite3.Connection, end: ExchangeEnd
    ) -> tuple[str | None, int | None, Outcome, str | None]:
        """The request body of ``end`` stored (once: one stored while in flight is not stored
        again): its blob's sha256, its place in the lane, and the exchange's outcome and error
        (``decode_error`` for a body that does not decode from its ``Content-Encoding``)."""
        p = end.pending
        outcome, error = end.outcome, end.error
        if end.request_body is None:
            return None, None, outcome, error
        if p.request_stored and (end.request_body is p.request_body or end.request_body == p.request_body):
            # stored while in flight: the same bytes are not stored (nor their lane moved) twice
            request_sha, lane_pos, decode_error = p.request_sha, p.lane_pos, p.request_error
        else:
            request_sha, lane_pos, decode_error = self._request_blob(
                conn, p, end.request_body, end.request_encoding
            )
        if decode_error is not None:
            if outcome is Outcome.OK:
                outcome = Outcome.DECODE_ERROR
            error = error or f"request body: {decode_error}"
        return request_sha, lane_pos, outcome, error

    def _store_response(
        self, conn: sqlite3.Connection, end: ExchangeEnd, headers: dict[str, str]
    ) -> tuple[str | None, tuple[str, ...]]:
        """The response body of ``end`` stored (its chunks joined into ``end.response_body``;
        an error response cleaned of the request's key, ``headers`` being the redacted response
        headers) and offered for reassembly: its blob's sha256 and the exchange's flags."""
        p = end.pending
        flags = end.flags
        if end.response_body is None:
            return None, flags
        if isinstance(end.response_body, list):
            end.response_body = b"".join(end.response_body)
            p.chunks = None  # the chunks go now: the body is never held twice for long
        body = end.response_body
        if end.status is not None and end.status >= 400 and body:
            # an error may echo the key the request carried ("invalid key sk-..."): never kept
            limit = self.max_decoded if end.max_body is None else min(end.max_body, self.max_decoded)
            body, added = self._redacted_error(body, headers, p, limit)
            if TRUNCATED_FLAG in flags:
                body = cut_secret_prefix(body, request_secrets(p.query, p.headers, p.path))
            flags = (*flags, *(a for a in added if a not in flags))
        response_sha = self.put_blob(conn, body)
        if body and self.reassembly.wants(p.protocol, end.streamed, flags, len(end.response_body)):
            # reassembly holds the GIL for milliseconds: done when the gateway is idle
            self.reassembly.offer(
                p.id,
                p.protocol,
                response_sha,
                headers.get("content-encoding"),  # type: ignore[arg-type]
            )
        return response_sha, flags


__all__ = ["Lane", "MAX_DECODED_ERROR", "Rows", "cut_secret_prefix"]
