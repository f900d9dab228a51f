"""The `Store`: the one writer of a DuckDB file, and the assembly of its dirty traces from the rows.

Writes are batched through Arrow (an `INSERT … SELECT` from a table, built by the shard workers),
never row by row. A span is identified by (trace_id, span_id): an exporter's retry changes nothing
(`SpanKeys` recognises it without an index). Each write marks its traces dirty; a trajectory is
stored from its shard's assembly when the span counts agree, and `assemble()` rebuilds the dirty
rest from the rows, so spans may arrive in any order and across any number of requests, and a late
span updates its trajectory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from plumbline_otel.assemble import DEFAULT_TASK_KEYS, LONG_TRACE_SPANS, iter_runs, split_runs, task_key_attributes
from plumbline_otel.assemble import assemble as assemble_run
from plumbline_otel.errors import Problem, StoreError
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import LogRows, fold_logs, log_event_attributes
from plumbline_otel.rows import SPAN_COLUMNS, record_from_row, span_table, trajectory_table
from plumbline_otel.shapes import LOGS, PROBLEMS, SPANS, TRAJECTORIES, VIOLATIONS
from plumbline_otel.store._files import connect, disconnect, reattach
from plumbline_otel.store._keys import SpanKeys, TraceCounts
from plumbline_otel.store._read import Reader
from plumbline_otel.store._schema import VIOLATION_COLUMNS, pending_migrations
from plumbline_otel.store._threads import link_logs, link_spans

DEFAULT_DB = "plumbline.duckdb"
# DuckDB checkpoints (folds its write-ahead log into the file) when the log passes this size, and
# until then keeps the logged rows in memory. Each checkpoint recompresses the unfilled row group
# (up to 122,880 rows); with long text in zstd (`Column.zstd` in shapes.py) that is cheap enough to do every
# ~15,000 spans: at 256 MB the writer's peak memory was ~90 MB higher for the same ingest speed.
_CHECKPOINT_THRESHOLD = "32MB"
# A writer's DuckDB cache (DuckDB's default is 80% of the machine's memory). The log above keeps up
# to its size of appended rows in memory until the checkpoint; past this cap they go to a temporary
# file instead of the process's memory (`plumbline serve` takes `storage.memory_limit_mib`, by default the same).
WRITER_MEMORY_LIMIT_MIB = 256
# DuckDB's memory limit while the writer rebuilds a trace longer than `LONG_TRACE_SPANS` (`Store._write_long_trace`).
LONG_REBUILD_MEMORY_MIB = 96
# Traces (each of at most `LONG_TRACE_SPANS`) read back into records together when rebuilding: each
# read scans the spans table, so fewer, larger reads; ~70 MB of records at most.
_REBUILD_SPANS = 20_000
# The traces a batch's root spans continue by an unattributed link (`assemble.join_linked`): those traces and
# these are assembled together from then on (`Store._linked`).
_TRACE_LINKS_SQL = """INSERT OR IGNORE INTO trace_links SELECT DISTINCT trace_id, link->>'trace_id' FROM (
    SELECT trace_id, unnest(CAST(links AS JSON[])) AS link FROM fresh WHERE links IS NOT NULL AND parent_span_id IS NULL)
    WHERE link->>'link_type' IS NULL AND link->>'trace_id' <> trace_id"""

_INSERTABLE = {shape.name: shape for shape in (SPANS, TRAJECTORIES, LOGS, PROBLEMS, VIOLATIONS)}
_LOG_SCHEMA = LOGS.arrow(json_text=True)  # as `normalise.log_rows` makes them: JSON as text


@dataclass(frozen=True)
class WriteResult:
    """What a batch write did: new rows and rows that were already there."""

    stored: int
    duplicate: int


@dataclass(frozen=True)
class CertificateRow:
    """The columns the store keeps beside a certificate's JSON (the console lists and filters by them).

    The caller reads them from its typed certificate (`report.model.Certificate`): the store sits below report/ and
    does not read a certificate itself.
    """

    spec_hash: str
    study: str | None  # the certificate's filters (provenance.filters)
    agent: str | None
    verdict: str  # the headline's: PASS, FAIL or INCONCLUSIVE
    lower_bound: float  # the headline's


def meta_value(connection: Any, key: str) -> str | None:
    """A setting a store keeps about itself (its `meta` table), e.g. its lake instance name; on any connection to it."""
    row = connection.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


def set_meta(connection: Any, key: str, value: str) -> None:
    """Keep a setting in the store's `meta` table (raises duckdb.Error on a read-only connection)."""
    connection.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])


def _trace_ids(ids: Iterable[str]) -> pa.Table:
    return pa.table({"trace_id": pa.array(list(ids), pa.string())})


class Store(Reader):
    """The DuckDB store: its one writer, and a `Reader` of it. One writer per file; readers of a served file go through the server."""

    def __init__(self, path: str | Path = DEFAULT_DB, read_only: bool = False, task_keys: Iterable[str] | None = None) -> None:
        self.path, self.read_only, self._closed = str(path), read_only, False
        self.connection = connect(self.path, read_only)
        self._span_keys: SpanKeys | None = None
        self._trace_counts: TraceCounts | None = None
        self.logs_written = False  # set by `write_logs`: a writer that only assembles after span writes checks it
        try:
            if not read_only:
                self.connection.execute(f"SET checkpoint_threshold = '{_CHECKPOINT_THRESHOLD}'")
                self.set_memory_limit(WRITER_MEMORY_LIMIT_MIB)
                self._migrate()
            # A file opened read-only keeps the schema it was written with (older columns may be missing).
            Reader.__init__(self, self.connection)
            self.task_keys = tuple(task_keys) if task_keys else self._stored_task_keys()
        except duckdb.Error as exc:  # a damaged file (cut short, overwritten) opens, then fails on its first read
            self.close()
            raise StoreError(f"cannot read {self.path}: {str(exc).splitlines()[0]} (is the file damaged?)") from None

    def reattach(self) -> None:
        """Detach the file and attach it again, then checkpoint: the way back from an invalidated database.

        DuckDB invalidates a database whose checkpoint failed (a full disk): every statement fails
        until the file is detached and attached again, which replays its write-ahead log (a commit
        DuckDB reported as failed at the checkpoint may have been durable: its retry is recognised,
        since the span keys are read again). The checkpoint that follows needs room on the disk, so
        this raises (leaving the database invalid again) until there is some. Every cursor of the
        store's database, this store's and its readers', works again afterwards. A writer's store only.
        """
        reattach(self.path, self.connection)
        self._span_keys = self._trace_counts = None  # read again from the rows: a commit reported failed may be stored
        self.connection.execute("CHECKPOINT")

    # --- schema -----------------------------------------------------------------------------

    def _migrate(self) -> None:
        for statements in pending_migrations(self.connection, self.path):
            with self._transaction():
                for statement in statements:
                    self.connection.execute(statement)

    def _stored_task_keys(self) -> tuple[str, ...]:
        try:
            kept = meta_value(self.connection, "task_keys")
        except duckdb.Error:
            kept = None
        return tuple(orjson.loads(kept)) if kept else DEFAULT_TASK_KEYS

    def set_task_keys(self, keys: Iterable[str]) -> None:
        """Change which attributes name a run's task; every trajectory is rebuilt on next assembly."""
        keys = tuple(keys)
        if keys == self._stored_task_keys():
            self.task_keys = keys
            return
        self.task_keys = keys
        with self._transaction():
            set_meta(self.connection, "task_keys", orjson.dumps(list(keys)).decode())
            self.connection.execute("INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.connection.execute("BEGIN")
        try:
            yield
        except BaseException:
            with suppress(duckdb.Error):  # an invalidated database refuses the rollback too: its own error is the one to tell
                self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    # --- writes -----------------------------------------------------------------------------

    def write_spans(self, records: list[SpanRecord], problems: Iterable[Problem] = (), source: str = "") -> WriteResult:
        """Commit a batch of span records (and the problems met reading them) in one transaction."""
        return self.write_span_table(span_table(records, time.time_ns()) if records else None, problems, source)

    def write_span_table(self, batch: pa.Table | None, problems: Iterable[Problem] = (), source: str = "") -> WriteResult:
        """Commit a `span_table` (and the problems met reading its spans) in one transaction; marks its traces dirty."""
        problems = list(problems)
        rows = batch.num_rows if batch is not None else 0
        if not rows and not problems:
            return WriteResult(0, 0)
        now = time.time_ns()
        keys, counts = self._keys(), self._counts()
        with self._transaction():
            stored = 0
            if batch is not None and rows:
                hashes, traces = self._hashes("batch_keys", batch)
                fresh = self._unstored(batch) if keys.suspects(hashes) else batch
                stored = fresh.num_rows
                if stored:
                    self.connection.execute("INSERT INTO spans SELECT * FROM fresh")
                    self.connection.execute("INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM fresh")
                    self.connection.execute(_TRACE_LINKS_SQL)
                    self._link_continuations(fresh)
            if problems:
                self.connection.executemany(
                    "INSERT INTO problems VALUES (?, ?, ?, ?, ?)",
                    [(now, source, p.where, p.reason, p.spans) for p in problems],
                )
        if stored:
            if fresh is not batch:
                hashes, traces = self._hashes("fresh_keys", fresh)
            keys.add(hashes)
            counts.add(traces)
        return WriteResult(stored=stored, duplicate=rows - stored)

    def _link_continuations(self, fresh: pa.Table | None = None, logs: pa.Table | None = None) -> None:
        """Key the root model calls a write brought (their span, or their log record) and link each trace to the trace
        whose conversation its request continues (`threads`): an agent loop traced only per model call is one run."""
        def fetch(sql: str) -> list[Any]:
            return list(self.connection.execute(sql).fetchall())

        if fresh is not None:
            link_spans(self.connection.execute, fetch, self._registered, fresh)
        if logs is not None:
            link_logs(self.connection.execute, fetch, self._registered, logs)

    def write_logs(self, rows: LogRows) -> int:
        """Commit GenAI log records in one transaction; returns how many were new.

        The traces they belong to are marked dirty, so `assemble` folds the records in whether they
        came before or after their spans (a trace with no span yet is just let go: its spans mark it again).
        """
        if not rows.kept:
            return 0
        log_batch = pa.table({n: pa.array(v, _LOG_SCHEMA.field(n).type) for n, v in rows.columns.items()})  # noqa: F841
        with self._transaction():
            row = self.connection.execute("INSERT OR IGNORE INTO logs SELECT * FROM log_batch").fetchone()
            self.connection.execute("INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM log_batch WHERE trace_id IS NOT NULL")
            self._link_continuations(logs=log_batch)
        self.logs_written = True
        return int(row[0]) if row else 0

    def write_violations(self, spec_hash: str, checked: list[str], rows: list[tuple[Any, ...]]) -> int:
        """Replace the violations of the `checked` runs under `spec_hash` with `rows` (`VIOLATION_COLUMNS`), in one transaction.

        Replacing, not adding, keeps checking twice a no-op and drops the stale violation of a run
        that was re-assembled from late spans. Returns the rows written.
        """
        columns: list[Any] = list(zip(*rows)) if rows else [[] for _ in VIOLATION_COLUMNS]
        violation_batch = pa.table({name: pa.array(list(column), pa.int32() if name == "step_index" else pa.string())  # noqa: F841
                                    for name, column in zip(VIOLATION_COLUMNS, columns)})
        with self._transaction():
            self.connection.execute("DELETE FROM violations WHERE spec_hash = ? AND trajectory_id IN (SELECT unnest(?))",
                                    [spec_hash, checked])
            self.connection.execute(f"INSERT INTO violations SELECT ?, {', '.join(VIOLATION_COLUMNS)} FROM violation_batch", [spec_hash])
        return len(rows)

    def record_check(self, spec_hash: str, spec_name: str, spec_path: str, checked: list[str], now_ns: int | None = None) -> None:
        """Keep that `checked` runs were judged against the spec (their violations: `write_violations`)."""
        now = time.time_ns() if now_ns is None else now_ns
        with self._transaction():
            if checked:
                self.connection.execute("INSERT OR REPLACE INTO checked_runs SELECT ?, unnest(?), ?", [spec_hash, checked, now])
            self.connection.execute("INSERT OR REPLACE INTO checks SELECT ?, ?, ?, ?, (SELECT count(*) FROM checked_runs WHERE spec_hash = ?)",
                                    [spec_hash, spec_name, spec_path, now, spec_hash])

    def store_certificate(self, row: CertificateRow, certificate_json: str, now_ns: int | None = None) -> int:
        """Keep a certificate for the console: its columns as the caller read them from the typed certificate, and its
        JSON as written (the console reads it back whole); returns how many are kept."""
        with self._transaction():
            self.connection.execute("INSERT INTO certificates VALUES (?, ?, ?, ?, ?, ?, ?)",
                                    [time.time_ns() if now_ns is None else now_ns, row.spec_hash, row.study, row.agent,
                                     row.verdict, row.lower_bound, certificate_json])
        count = self.connection.execute("SELECT count(*) FROM certificates").fetchone()
        return int(count[0]) if count else 0

    def insert_rows(self, table: str, rows: pa.Table) -> int:
        """Add rows (columns matched by name; a declared column they lack is null) to one of the declared tables.

        For a store made of rows read elsewhere (the lake's reader fills an in-memory store). In a table with a key
        column (trajectories, logs) a row whose key is stored already is skipped: a misrouted trace's run comes
        from two instances, and one copy is kept.
        """
        shape = _INSERTABLE.get(table)
        if shape is None:
            raise StoreError(f"insert_rows: {table!r} is not one of the store's tables ({', '.join(sorted(_INSERTABLE))})")
        ignore = "OR IGNORE " if any(c.key for c in shape.columns) else ""
        with self._registered("given_rows", rows):
            self.connection.execute(f"INSERT {ignore}INTO {shape.name} BY NAME SELECT * FROM given_rows")
        return int(rows.num_rows)

    _memory_limit_mib: int | None = None  # as set here; None: DuckDB's default

    def set_memory_limit(self, mib: int) -> None:
        """Cap DuckDB's buffer cache (it defaults to 80% of the machine's memory)."""
        self.connection.execute(f"SET memory_limit = '{int(mib)}MiB'")
        self._memory_limit_mib = int(mib)

    def leave_cores_to(self, workers: int) -> None:
        """DuckDB runs on the cores that `workers` shard processes leave (at least one); with none, on every core.

        Its default, a thread per core, sets its threads against the workers on the same cores for
        statements that are small appends: a 2-worker file ingest spent ~0.4 s more writer CPU per
        100,000 spans, and ran 5-10% slower, than with one thread; `plumbline serve` committed
        17,686 / 17,906 spans/s against 20,192 / 19,722 with one (alternated, 4x2 load).
        """
        if workers:
            self.connection.execute(f"SET threads = {max(1, (os.cpu_count() or 1) - workers)}")
        else:
            self.connection.execute("RESET threads")

    @contextmanager
    def beside_workers(self, workers: int) -> Iterator[None]:
        """`leave_cores_to` for the block: the rebuild after the workers stop, and everything after, runs on every core."""
        if not workers:
            yield
            return
        self.leave_cores_to(workers)
        try:
            yield
        finally:
            self.leave_cores_to(0)

    def _keys(self) -> SpanKeys:
        if self._span_keys is None:
            self._span_keys = SpanKeys(self.connection.execute("SELECT hash(trace_id, span_id) AS k FROM spans").fetchnumpy()["k"])
        return self._span_keys

    def _counts(self) -> TraceCounts:
        if self._trace_counts is None:
            stored = self.connection.execute("SELECT hash(trace_id) AS t, count(*) AS n FROM spans GROUP BY 1").fetchnumpy()
            self._trace_counts = TraceCounts(stored["t"], stored["n"])
        return self._trace_counts

    @contextmanager
    def _registered(self, name: str, table: pa.Table) -> Iterator[None]:
        """`table` readable in SQL as `name` for the block (zero-copy).

        DuckDB refuses to register while a result is unfinished, and a caller that read one row with
        `fetchone()` (a `pending_traces()` asked through `plumbline serve`'s writer thread) leaves one:
        it is run to its end first, rather than failing the next write.
        """
        self.connection.complete()
        self.connection.register(name, table)
        try:
            yield
        finally:
            self.connection.complete()
            self.connection.unregister(name)

    def _hashes(self, name: str, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Each row's span key (`SpanKeys`) and trace hash (`TraceCounts`)."""
        with self._registered(name, table):
            found = self.connection.execute(f"SELECT hash(trace_id, span_id) AS k, hash(trace_id) AS t FROM {name}").fetchnumpy()
        return found["k"], found["t"]

    def _unstored(self, batch: pa.Table) -> pa.Table:
        """The rows of `batch` not stored yet, each span once: a table scan, run only when `SpanKeys` suspects a retry."""
        with self._registered("incoming", batch):
            return self.connection.sql(
                "SELECT * FROM (SELECT DISTINCT ON (trace_id, span_id) * FROM incoming) b "
                "WHERE NOT EXISTS (SELECT 1 FROM spans s WHERE s.trace_id = b.trace_id AND s.span_id = b.span_id)"
            ).to_arrow_table()

    def write_assembled(self, built: pa.Table, counts: dict[str, int]) -> int:
        """Store trajectories assembled outside the store, for the traces whose stored spans are exactly those they were built from.

        A trace with more (or other) stored spans than its builder saw stays dirty and is rebuilt
        from its rows by `assemble`. Returns how many traces were stored (not trajectories: a trace
        holds any number of runs, so only traces say whether some were refused). No statement here
        scans the spans table (the stored counts are `TraceCounts`'), and the trace ids reach SQL
        as a registered Arrow table, not as a list parameter, which cost milliseconds to bind.
        """
        if not counts:
            return 0
        with self._registered("assembled", _trace_ids(counts)):
            found = self.connection.execute("SELECT trace_id, hash(trace_id) AS t FROM assembled").fetchnumpy()
            # log records are folded from the store, and traces joined by links assembled together: such a
            # trace is rebuilt by `assemble`
            with_logs = {t for (t,) in self.connection.execute(
                "SELECT DISTINCT trace_id FROM logs WHERE trace_id IN (SELECT trace_id FROM assembled) UNION "
                "SELECT trace_id FROM trace_links WHERE trace_id IN (SELECT trace_id FROM assembled) UNION "
                "SELECT linked_trace_id FROM trace_links WHERE linked_trace_id IN (SELECT trace_id FROM assembled)").fetchall()}
        stored = dict(zip(found["trace_id"].tolist(), self._counts().get(found["t"])))
        done = [t for t, n in counts.items() if stored[t] == n and t not in with_logs]
        if not done:
            return 0
        keep = built if len(done) == len(counts) else built.filter(pc.is_in(built["trace_id"], value_set=pa.array(done, pa.string())))
        with self._registered("done", _trace_ids(done)), self._registered("keep", keep), self._transaction():
            self.connection.execute("DELETE FROM trajectories WHERE trace_id IN (SELECT trace_id FROM done)")
            self.connection.execute("INSERT INTO trajectories SELECT * FROM keep")
            self.connection.execute("DELETE FROM dirty_traces WHERE trace_id IN (SELECT trace_id FROM done)")
        return len(done)

    # --- assembly ---------------------------------------------------------------------------

    def _records_for(self, trace_ids: list[str], span_ids: list[str] | None = None) -> dict[str, list[SpanRecord]]:
        """The stored records of these traces (of these spans only, when `span_ids` is given), by trace."""
        keys = sorted(task_key_attributes(self.task_keys))  # a span's and its resource's, apart (`task_key_value`)
        key_sql = ", ".join(f"json_extract_string(attributes, ${i + 1})" for i in range(len(keys))) or "NULL"
        resource_sql = ", ".join(f"json_extract_string(resource, ${i + 1})" for i in range(len(keys))) or "NULL"
        columns = [c for c in SPAN_COLUMNS if c not in ("attributes", "resource", "received_ns")]
        only = "" if span_ids is None else " AND span_id IN (SELECT span_id FROM wanted_spans)"
        spans = pa.table({"span_id": pa.array(span_ids or [], pa.string())})  # registered, read only with `only`
        with self._registered("wanted", _trace_ids(trace_ids)), self._registered("wanted_spans", spans):
            rows = self.connection.execute(
                f"SELECT {', '.join(columns)}, [{key_sql}], [{resource_sql}] FROM spans WHERE trace_id IN (SELECT trace_id FROM wanted){only}",
                [f'$."{k}"' for k in keys],
            ).fetchall()
        by_trace: dict[str, list[SpanRecord]] = {}
        for row in rows:
            rec = record_from_row(dict(zip(columns, row[:-2])), keys, row[-2])
            rec.resource = {k: v for k, v in zip(keys, row[-1] or []) if v is not None}
            by_trace.setdefault(rec.trace_id, []).append(rec)
        self._fold_logs(by_trace)
        return by_trace

    def assemble(self, chunk: int = 2000, deadline: float | None = None) -> int:
        """Rebuild the trajectories of every trace that received spans since the last assembly.

        Stored spans are read back into records `_REBUILD_SPANS` at a time; a trace longer than
        `LONG_TRACE_SPANS` is rebuilt run by run (`_long_trace_runs`). Past `deadline` (a
        `time.monotonic()` value) no further chunk starts: what is left stays pending (see
        `pending_traces`) and the next assembly takes it up, so a bounded shutdown never loses
        work, only defers it.
        """
        total = 0
        while deadline is None or time.monotonic() < deadline:
            # A dirty trace with no stored span (log records only, or spans that failed to store) builds
            # nothing and is let go; its spans mark it dirty again when they come.
            found = self.connection.execute("SELECT trace_id, hash(trace_id) AS t FROM dirty_traces LIMIT ?", [chunk]).fetchnumpy()
            dirty: list[str] = found["trace_id"].tolist()
            if not dirty:
                return total
            joined: set[str] = set()
            for group in self._linked(dirty):  # a run spread over traces joined by links: those traces as one
                total += self._write_trajectories([self._rebuilt(group, together=True)], group)
                joined.update(group)
            dirty = [t for t in dirty if t not in joined]
            sizes = dict(zip(dirty, self._counts().get(found["t"])))  # planning only: a collision overcounts
            batch: list[str] = []
            spans = 0
            for trace_id in [t for t in dirty if sizes[t] <= LONG_TRACE_SPANS]:
                if batch and spans + sizes[trace_id] > _REBUILD_SPANS:
                    total += self._write_trajectories([self._rebuilt(batch)], batch)
                    batch, spans = [], 0
                batch.append(trace_id)
                spans += sizes[trace_id]
            if batch:
                total += self._write_trajectories([self._rebuilt(batch)], batch)
            for trace_id in [t for t in dirty if sizes[t] > LONG_TRACE_SPANS]:
                total += self._write_long_trace(trace_id)
        return total

    def _rebuilt(self, trace_ids: list[str], together: bool = False) -> pa.Table:
        """The trajectories of these traces, from their stored spans (and log records); `together`: of their
        records as one set (traces joined by links), not trace by trace."""
        by_trace = self._records_for(trace_ids)
        sets: Iterable[list[SpanRecord]] = [[r for recs in by_trace.values() for r in recs]] if together else by_trace.values()
        runs = (t for recs in sets for t in iter_runs(recs, self.task_keys))
        return trajectory_table(runs, time.time_ns())

    def _linked(self, trace_ids: list[str]) -> list[list[str]]:
        """The groups of two or more traces that `trace_links` joins, transitively, with any of these."""
        parent: dict[str, str] = {}

        def find(t: str) -> str:
            while parent.get(t, t) != t:
                t = parent[t]
            return t

        frontier, seen, joined = set(trace_ids), set(trace_ids), set[str]()
        while frontier:
            with self._registered("frontier", _trace_ids(frontier)):
                pairs = self.connection.execute(
                    "SELECT trace_id, linked_trace_id FROM trace_links WHERE trace_id IN (SELECT trace_id FROM frontier) "
                    "OR linked_trace_id IN (SELECT trace_id FROM frontier)").fetchall()
            frontier = set()
            for a, b in pairs:
                parent[find(a)] = find(b)
                frontier.update(t for t in (a, b) if t not in seen)
                seen.update((a, b))
                joined.update((a, b))
        groups: dict[str, list[str]] = {}
        for t in joined:
            groups.setdefault(find(t), []).append(t)
        return [sorted(g) for g in groups.values() if len(g) > 1]

    def _write_long_trace(self, trace_id: str) -> int:
        """`_long_trace_runs` stored, under a cache of at most `LONG_REBUILD_MEMORY_MIB` while it runs.

        Each batch of runs reads its spans back with a scan of the whole trace, and DuckDB keeps the blocks
        it read cached up to its memory limit: at the writer's 256 MiB a 20,000-span trace's rebuild grew the
        process ~140 MiB (96 MiB: ~85), the peak of that trace's ingest. Should a run too large for the
        smaller cache run out of memory, the rebuild (one transaction, rolled back) runs again at the
        writer's own limit.
        """
        if self._memory_limit_mib is not None and self._memory_limit_mib <= LONG_REBUILD_MEMORY_MIB:
            return self._write_trajectories(self._long_trace_runs(trace_id), [trace_id])
        (limit,) = self.connection.execute("SELECT current_setting('memory_limit')").fetchone() or ("",)
        try:
            self.connection.execute(f"SET memory_limit = '{LONG_REBUILD_MEMORY_MIB}MiB'")
            try:
                return self._write_trajectories(self._long_trace_runs(trace_id), [trace_id])
            finally:
                self.connection.execute("SET memory_limit = ?", [limit])
        except duckdb.Error as exc:
            cause: BaseException | None = exc  # DuckDB's out-of-memory error, or one it caused (an aborted transaction)
            while cause is not None and not isinstance(cause, duckdb.OutOfMemoryException):
                cause = cause.__context__
            if cause is None:
                raise
            return self._write_trajectories(self._long_trace_runs(trace_id), [trace_id])

    def _long_trace_runs(self, trace_id: str) -> Iterator[pa.Table]:
        """A long trace's trajectories, a batch of runs at a time, never holding the whole trace as records.

        The trace is split into runs on the few columns `split_runs` reads; each batch of runs (up
        to `LONG_TRACE_SPANS` spans, or one larger run) is then read in full and assembled exactly as
        `iter_runs` would. A trace that is one run is read whole: one run is one assembly.
        """
        runs = split_runs(self._skeleton(trace_id))
        start = 0
        while start < len(runs):
            end, size = start + 1, len(runs[start][1])
            while end < len(runs) and size + len(runs[end][1]) <= LONG_TRACE_SPANS:
                size += len(runs[end][1])
                end += 1
            batch, start = runs[start:end], end
            wanted = [rec.span_id for _, group in batch for rec in group]
            full = {rec.span_id: rec for rec in self._records_for([trace_id], wanted).get(trace_id, [])}
            built = (assemble_run([full[rec.span_id] for rec in group if rec.span_id in full], self.task_keys, trajectory_id)
                     for trajectory_id, group in batch)
            yield trajectory_table((t for t in built if t is not None), time.time_ns())

    def _skeleton(self, trace_id: str) -> list[SpanRecord]:
        """A long trace's spans as the bare records `split_runs` reads (ids, parent, times, step kind, shapes,
        hand-off), read `LONG_TRACE_SPANS` rows at a time so the query's rows never sit beside the records.

        The records are only split, never changed or assembled, so they share what they can: one empty
        list for every list field and one empty dict for both maps, one list per distinct `shapes`, one
        string per step kind. (A record of its own per field made this the peak of a 20,000-span trace in
        one process: 297-301 MiB for the bench's process, 271-274 with these.)"""
        empty: list[Any] = []
        no_attributes: dict[str, Any] = {}
        shared: dict[Any, Any] = {}
        cursor = self.connection.execute(
            "SELECT span_id, parent_span_id, start_ns, end_ns, step_kind, shapes, handoff_to FROM spans WHERE trace_id = ?", [trace_id])
        skeleton: list[SpanRecord] = []
        while rows := cursor.fetchmany(LONG_TRACE_SPANS):
            for span_id, parent, start_ns, end_ns, kind, shapes, handoff in rows:
                key = tuple(shapes) if shapes else ()
                shared_shapes = shared.setdefault(key, list(key) if key else empty)
                skeleton.append(SpanRecord(
                    trace_id, span_id, parent, "", start_ns, end_ns, step_kind=shared.setdefault(kind, kind), shapes=shared_shapes,
                    handoff_to=handoff, finish_reasons=empty, proposed_calls=empty, tool_results=empty, unknown_keys=empty,
                    evidence=empty, decisions=empty, run_events=empty, links=empty, attributes=no_attributes, resource=no_attributes))
            del rows
        return skeleton

    def _fold_logs(self, by_trace: dict[str, list[SpanRecord]]) -> None:
        """Fold each trace's stored GenAI log records into its span records (in record time order)."""
        with self._registered("wanted", _trace_ids(by_trace)):
            rows = self.connection.execute(
                "SELECT trace_id, span_id, event_name, attributes, body, coalesce(nullif(time_ns, 0), observed_ns) FROM logs "
                "WHERE trace_id IN (SELECT trace_id FROM wanted) AND span_id IS NOT NULL ORDER BY time_ns, observed_ns, log_id").fetchall()
        events: dict[str, dict[str, list[tuple[str, dict[str, Any], int]]]] = {}
        for trace_id, span_id, name, attributes, body, time_ns in rows:
            events.setdefault(trace_id, {}).setdefault(span_id, []).append((name, log_event_attributes(attributes, body), time_ns or 0))
        for trace_id, by_span in events.items():
            by_trace[trace_id] = fold_logs(by_trace[trace_id], by_span)

    def add_trajectories(self, trajectories: Iterable[Trajectory]) -> int:
        """Store trajectories read elsewhere (other stores', servers'): a report's in-memory store of them."""
        return self._write_trajectories([trajectory_table(trajectories, time.time_ns())], [])

    def _write_trajectories(self, tables: Iterable[pa.Table], done: list[str]) -> int:
        """Replace the trajectories of the `done` traces with those in `tables`, in one transaction; returns how many were written."""
        written = 0
        with self._registered("done", _trace_ids(done)), self._transaction():
            self.connection.execute("DELETE FROM trajectories WHERE trace_id IN (SELECT trace_id FROM done)")
            for built in tables:
                if built.num_rows:
                    with self._registered("built", built):
                        self.connection.execute("INSERT INTO trajectories SELECT * FROM built")
                written += built.num_rows
            self.connection.execute("DELETE FROM dirty_traces WHERE trace_id IN (SELECT trace_id FROM done)")
        return written

    def close(self) -> None:
        """Close the file; a closed store cannot be used again (closing it again does nothing)."""
        if not self._closed:
            self._closed = True
            disconnect(self.path, self.connection, self.read_only)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

