"""Store: one DuckDB file holding span rows (the source of truth) and the trajectories built from them.

Writes are batched through Arrow (an `INSERT … SELECT` from a table, built by the shard workers),
never row by row. A span is identified by (trace_id, span_id): an exporter's retry changes nothing
(`_SpanKeys` recognises it without an index). Each write marks its traces dirty; a trajectory is
stored from its shard's assembly when the span counts agree, and `assemble()` rebuilds the dirty
rest from the rows, so spans may arrive in any order and across any number of requests, and a late
span updates its trajectory. The schema carries a version in `meta` and migrates forward on open.
"""

from __future__ import annotations

import os
import threading
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
from plumbline_otel.decode import Problem
from plumbline_otel.errors import StoreError
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import LogRows, fold_logs, log_event_attributes
from plumbline_otel.rows import (
    SPAN_COLUMNS,
    SPAN_COLUMNS_V1,
    SPAN_COLUMNS_V4,
    SPAN_COLUMNS_V8,
    record_from_row,
    span_table,
    trajectory_from_doc,
    trajectory_table,
)

SCHEMA_VERSION = 8
DEFAULT_DB = "plumbline.duckdb"
# DuckDB checkpoints (folds its write-ahead log into the file) when the log passes this size, and
# until then keeps the logged rows in memory. Each checkpoint recompresses the unfilled row group
# (up to 122,880 rows); with long text in zstd (`_ZSTD_COLUMNS`) that is cheap enough to do every
# ~15,000 spans: at 256 MB the writer's peak memory was ~90 MB higher for the same ingest speed.
_CHECKPOINT_THRESHOLD = "32MB"
# Rows in a row group of a store opened for writing (DuckDB's default is 122,880). A checkpoint
# recompresses the group still being filled, and at the default that was up to 122,880 spans (~190
# MB of rows) each time: checkpoints of 0.06-0.45 s that stalled every commit, in `serve` too. At
# 16,384, writing 100,000 spans took 0.63-0.66 s of CPU instead of 1.04-1.06, the writer's peak
# memory fell from ~535 to ~370 MB and the file from 19 to 12 MB (best of 2 each; 32,768 was no better).
# A transaction that appends a whole row group is written by DuckDB straight into the file, compressed,
# rather than into the write-ahead log and again at the checkpoint: file ingest with workers commits
# whole row groups (`ingest.transaction_spans`). 5,000 spans put 8 MB into the log; 16,384 put 0.1 MB.
ROW_GROUP_SIZE = 16_384
# A writer's DuckDB cache (DuckDB's default is 80% of the machine's memory). The log above keeps up
# to its size of appended rows in memory until the checkpoint; past this cap they go to a temporary
# file instead of the process's memory (`plumbline serve` takes `storage.memory_limit_mib`, by default the same).
WRITER_MEMORY_LIMIT_MIB = 256
# Traces (each of at most `LONG_TRACE_SPANS`) read back into records together when rebuilding: each
# read scans the spans table, so fewer, larger reads; ~70 MB of records at most.
_REBUILD_SPANS = 20_000

_LOG_TYPES = {"time_ns": pa.int64(), "observed_ns": pa.int64(), "severity_number": pa.int32(), "received_ns": pa.int64()}

# One row per (spec, run, invariant) that failed: an invariant has one verdict per run and spec.
_VIOLATIONS_TABLE = """CREATE TABLE IF NOT EXISTS violations (
    spec_hash VARCHAR NOT NULL, invariant_id VARCHAR NOT NULL, trajectory_id VARCHAR NOT NULL, severity VARCHAR NOT NULL,
    task_key VARCHAR, step_index INTEGER, step_name VARCHAR, detail VARCHAR,
    PRIMARY KEY (spec_hash, trajectory_id, invariant_id))"""
VIOLATION_COLUMNS = ("invariant_id", "trajectory_id", "severity", "task_key", "step_index", "step_name", "detail")

# Columns of long text (JSON maps, payloads, documents) are stored with zstd. DuckDB's default for
# strings (a dictionary and FSST per segment, chosen by analysing each one) made the checkpoint,
# where appended rows are compressed, a fifth of a file ingest's time (2.2-2.9 s per 100,000 spans),
# for a file six times larger: zstd took 0.6-0.8 s and 96 MB became 15 (bench/ingest_files.py corpus).
_ZSTD_COLUMNS = frozenset({"attributes", "resource", "args", "result", "proposed_calls", "tool_results", "context",
                           "decisions", "run_events", "input_text", "output_text", "status_message", "input", "final_output", "doc", "body"})


def _column_sql(name: str, kind: str) -> str:
    return f"{name} {kind} USING COMPRESSION zstd" if name in _ZSTD_COLUMNS else f"{name} {kind}"


def _rebuilt_table(table: str, columns: dict[str, str]) -> list[str]:
    """Statements that re-create `table` with `columns` (in its column order) and keep its rows."""
    body = ", ".join(_column_sql(name, kind) for name, kind in columns.items())
    return [f"CREATE TABLE {table}_rebuilt ({body})", f"INSERT INTO {table}_rebuilt SELECT * FROM {table}",
            f"DROP TABLE {table}", f"ALTER TABLE {table}_rebuilt RENAME TO {table}"]


_TRAJECTORY_COLUMNS = {
    "trajectory_id": "VARCHAR PRIMARY KEY", "trace_id": "VARCHAR", "task_key": "VARCHAR", "task_key_source": "VARCHAR",
    "service": "VARCHAR", "service_version": "VARCHAR", "agent_name": "VARCHAR", "input": "VARCHAR", "final_output": "VARCHAR",
    "conventions": "VARCHAR[]", "start_ns": "BIGINT", "end_ns": "BIGINT", "n_steps": "INTEGER", "n_tool_calls": "INTEGER",
    "doc": "JSON", "assembled_ns": "BIGINT",
}
_LOG_COLUMNS = {
    "log_id": "VARCHAR PRIMARY KEY", "trace_id": "VARCHAR", "span_id": "VARCHAR", "time_ns": "BIGINT", "observed_ns": "BIGINT",
    "event_name": "VARCHAR", "severity_number": "INTEGER", "severity_text": "VARCHAR", "body": "JSON", "attributes": "JSON",
    "service_name": "VARCHAR", "scope_name": "VARCHAR", "resource": "JSON", "received_ns": "BIGINT",
}
_LOGS_TABLE = "CREATE TABLE IF NOT EXISTS logs (" + ", ".join(f"{name} {kind}" for name, kind in _LOG_COLUMNS.items()) + ")"

_MIGRATIONS: dict[int, list[str]] = {
    1: [
        "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        "CREATE TABLE spans ("
        + ", ".join(f"{name} {kind}" for name, kind in SPAN_COLUMNS_V1.items())
        + ", PRIMARY KEY (trace_id, span_id))",
        "CREATE TABLE dirty_traces (trace_id VARCHAR PRIMARY KEY)",
        "CREATE TABLE trajectories (" + ", ".join(f"{name} {kind}" for name, kind in _TRAJECTORY_COLUMNS.items()) + ")",
        """CREATE TABLE problems (
            received_ns BIGINT, source VARCHAR, location VARCHAR, reason VARCHAR, spans INTEGER)""",
    ],
    # Spans lose their primary-key index (it halved insert speed); `_SpanKeys` keeps retries idempotent.
    2: [
        "CREATE TABLE spans_v2 AS SELECT * FROM spans",
        "DROP TABLE spans",
        "ALTER TABLE spans_v2 RENAME TO spans",
    ],
    # Framework wrappers and dumps unwrapped per span, for coverage; every trajectory is
    # rebuilt, because a conversation id is no longer a default task key.
    3: ["ALTER TABLE spans ADD COLUMN shapes VARCHAR[]",
        "INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans"],
    # GenAI log records (a server before this version made the table itself) are folded into
    # their spans at assembly; cache tokens, finish reasons, hand-offs and each field's evidence per span.
    4: [_LOGS_TABLE,
        *(f"ALTER TABLE spans ADD COLUMN {name} {kind}" for name, kind in SPAN_COLUMNS_V4.items()),
        "INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans"],
    # Violations join the store's own tables (`plumbline check` made the table itself before this version).
    5: [_VIOLATIONS_TABLE],
    # Long text columns stored with zstd (`_ZSTD_COLUMNS`); the rows are copied as they are.
    6: [*_rebuilt_table("spans", {k: v for k, v in SPAN_COLUMNS.items() if k not in SPAN_COLUMNS_V8}),
        *_rebuilt_table("trajectories", _TRAJECTORY_COLUMNS),
        *_rebuilt_table("logs", _LOG_COLUMNS)],
    # What `check` and `certify` keep for the console beside the violations: which runs were judged under which
    # spec (a run with no violation is "conforming" only if it was judged), each check, and the certificates.
    7: ["CREATE TABLE IF NOT EXISTS checked_runs (spec_hash VARCHAR NOT NULL, trajectory_id VARCHAR NOT NULL, checked_ns BIGINT, "
        "PRIMARY KEY (spec_hash, trajectory_id))",
        "CREATE TABLE IF NOT EXISTS checks (spec_hash VARCHAR PRIMARY KEY, spec_name VARCHAR, spec_path VARCHAR, checked_ns BIGINT, "
        "runs BIGINT)",
        "CREATE TABLE IF NOT EXISTS certificates (stored_ns BIGINT, spec_hash VARCHAR, study VARCHAR, agent VARCHAR, verdict VARCHAR, "
        "lower_bound DOUBLE, doc VARCHAR)"],
    # Producer-reported cost (`gen_ai.usage.cost.*`) and guardrail / execution-state events per span; every
    # trajectory is rebuilt so its steps carry them.
    8: [*(f"ALTER TABLE spans ADD COLUMN {_column_sql(name, kind)}" for name, kind in SPAN_COLUMNS_V8.items()),
        "INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans"],
}


class _SpanKeys:
    """The 64-bit hashes of every stored (trace_id, span_id), so a retried span is recognised without an index.

    A primary-key index on two strings halves DuckDB's insert rate; this costs 8 bytes a stored
    span instead. The keys are DuckDB's own `hash(trace_id, span_id)`, read from the table when the
    first write comes (so they never go stale across versions), kept as a sorted array plus a set of
    recent keys. A hit is only a suspicion (two spans can share a hash): the writer confirms it
    against the rows before it skips anything.
    """

    def __init__(self, stored: np.ndarray) -> None:
        self.base = np.sort(stored)
        self.recent: set[int] = set()

    def suspects(self, keys: np.ndarray) -> bool:
        """True when some key was seen before, or occurs twice in `keys`."""
        if len(np.unique(keys)) < len(keys):
            return True
        if len(self.base):
            at = np.searchsorted(self.base, keys).clip(max=len(self.base) - 1)
            if bool((self.base[at] == keys).any()):
                return True
        return bool(self.recent) and not self.recent.isdisjoint(keys.tolist())

    def add(self, keys: np.ndarray) -> None:
        """Remember newly stored keys; the recent set is folded into the sorted array as it grows."""
        self.recent.update(keys.tolist())
        if len(self.recent) > max(1 << 18, len(self.base) // 4):
            self.base = np.union1d(self.base, np.fromiter(self.recent, np.uint64, len(self.recent)))
            self.recent = set()


class _TraceCounts:
    """How many spans the store holds of each trace, by DuckDB's 64-bit `hash(trace_id)`.

    Storing a shard's trajectories asks "are these all of the trace's stored spans?" for every
    assembled batch; answered by a scan of the spans table, that grew with the store (~45 ms a batch
    at 3M spans, several a second in `plumbline serve`). Kept like `_SpanKeys`: sorted arrays read
    from the table when the first write comes, plus the counts added since (16 bytes a trace). Two
    traces whose hashes collide share one count, larger than either trace's own, so neither ever
    matches a shard's count and both are rebuilt from their rows: a collision costs time, never a
    wrong trajectory.
    """

    def __init__(self, hashes: np.ndarray, counts: np.ndarray) -> None:
        order = np.argsort(hashes)
        self.hashes, self.counts = hashes[order], counts[order].astype(np.int64)
        self.recent: dict[int, int] = {}

    def get(self, keys: np.ndarray) -> list[int]:
        """The stored span count of each trace hash in `keys`."""
        if len(self.hashes):
            at = np.searchsorted(self.hashes, keys).clip(max=len(self.hashes) - 1)
            base = np.where(self.hashes[at] == keys, self.counts[at], 0).tolist()
        else:
            base = [0] * len(keys)
        return [n + self.recent.get(k, 0) for n, k in zip(base, keys.tolist())]

    def add(self, keys: np.ndarray) -> None:
        """Count newly stored spans (one trace hash each); the recent counts are folded into the arrays as they grow."""
        for key, n in zip(*(a.tolist() for a in np.unique(keys, return_counts=True))):
            self.recent[key] = self.recent.get(key, 0) + n
        if len(self.recent) > max(1 << 16, len(self.hashes) // 4):
            hashes = np.concatenate([self.hashes, np.fromiter(self.recent, np.uint64, len(self.recent))])
            counts = np.concatenate([self.counts, np.fromiter(self.recent.values(), np.int64, len(self.recent))])
            order = np.argsort(hashes, kind="stable")
            self.hashes, first = np.unique(hashes[order], return_index=True)
            self.counts = np.add.reduceat(counts[order], first)
            self.recent = {}


@dataclass(frozen=True)
class WriteResult:
    """What a batch write did: new rows and rows that were already there."""

    stored: int
    duplicate: int


def _trace_ids(ids: Iterable[str]) -> pa.Table:
    return pa.table({"trace_id": pa.array(list(ids), pa.string())})


def schema_version(connection: Any) -> int:
    """The schema version a store's connection holds (0 for an empty file)."""
    exists = connection.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'").fetchone()
    if not exists or not exists[0]:
        return 0
    row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


_LOCK_HINT = (
    "the database {path} is held by another process (probably `plumbline serve`); "
    "use --server HOST:PORT to ask the running server, or stop it first"
)


class StoreLocked(StoreError):
    """Another process holds the file (a writer: `plumbline serve`, `ingest`; or a reader)."""


# A file open for writing in this process: the connection that attached it, and how many stores use it.
_attached: dict[str, tuple[Any, int]] = {}
_spares: dict[str, Any] = {}  # ... and its cursor on the spare database (`_connect`)
_SPARE = "plumbline_spare"
_attached_lock = threading.Lock()


def _attaches(path: str, read_only: bool) -> bool:
    """Whether a store of `path` is a writer's attached file (`_connect`); in-memory stores are DuckDB's own, one each."""
    return not read_only and bool(path) and not path.startswith(":memory:")


def _connect(path: str, read_only: bool) -> Any:
    """A connection to the store's file: a writer's is a cursor of a database that attached it with `ROW_GROUP_SIZE`.

    The row group size is an option of ATTACH, not kept in the file, so a writer attaches the file
    to an in-memory database, makes it the default and detaches the in-memory one: every cursor
    then opens on the store, as with `duckdb.connect(path)`. An empty in-memory database `spare`
    is attached beside it, and one cursor kept on it (`_spares`): the one cursor that can still
    detach the file and attach it again when DuckDB has invalidated it (`Store.reattach`; a cursor
    on the store cannot even change databases then). Stores of one file in one process share that database (as `duckdb.connect` shares one per
    path), each through its own cursor, and the last to close detaches it. DuckDB would spill to
    `.tmp` in the working directory for an in-memory database; the store's spills stay beside its file.
    """
    if not _attaches(path, read_only):
        return duckdb.connect(path, read_only=read_only)
    key = os.path.realpath(path)
    with _attached_lock:
        if key in _attached:
            database, users = _attached[key]
            _attached[key] = (database, users + 1)
            return database.cursor()
        database = duckdb.connect()
        quoted = path.replace("'", "''")
        try:
            database.execute(_ATTACH.format(path=quoted))
            database.execute("USE store")
            database.execute("DETACH memory")
            database.execute(f"SET temp_directory = '{quoted}.tmp'")
            database.execute(f"ATTACH ':memory:' AS {_SPARE}")
            spare = database.cursor()
            spare.execute(f"USE {_SPARE}")
        except BaseException:
            database.close()
            raise
        _attached[key] = (database, 1)
        _spares[key] = spare
        return database.cursor()


_ATTACH = f"ATTACH '{{path}}' AS store (ROW_GROUP_SIZE {ROW_GROUP_SIZE})"


def invalidated(exc: BaseException) -> bool:
    """Whether DuckDB has invalidated the store's database with this error: a checkpoint failed (a full disk).

    Every statement fails from then on, until the file is detached and attached again (`Store.reattach`).
    """
    text = str(exc)
    return isinstance(exc, duckdb.FatalException) or (isinstance(exc, duckdb.Error) and ("invalidated" in text or "reattach" in text))


def _disconnect(path: str, connection: Any, read_only: bool) -> None:
    """Close a store's connection; the last writer's of a file detaches it (and DuckDB checkpoints it)."""
    connection.close()
    if not _attaches(path, read_only):
        return
    key = os.path.realpath(path)
    with _attached_lock:
        database, users = _attached[key]
        if users > 1:
            _attached[key] = (database, users - 1)
        else:
            del _attached[key]
            _spares.pop(key).close()
            database.close()


class Store:
    """The DuckDB store. One writer per file; readers of a served file go through the server."""

    def __init__(self, path: str | Path = DEFAULT_DB, read_only: bool = False, task_keys: Iterable[str] | None = None) -> None:
        self.path, self.read_only, self._closed = str(path), read_only, False
        try:
            self.connection = _connect(self.path, read_only)
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreLocked(_LOCK_HINT.format(path=self.path)) from None
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        self._span_keys: _SpanKeys | None = None
        self._trace_counts: _TraceCounts | None = None
        self.logs_written = False  # set by `write_logs`: a writer that only assembles after span writes checks it
        try:
            if not read_only:
                self.connection.execute(f"SET checkpoint_threshold = '{_CHECKPOINT_THRESHOLD}'")
                self.set_memory_limit(WRITER_MEMORY_LIMIT_MIB)
                self._migrate()
            # A file opened read-only keeps the schema it was written with (older columns may be missing).
            self.schema_version = self._version()
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
        if not _attaches(self.path, self.read_only):
            raise StoreError("only a store open for writing can be attached again")
        with suppress(duckdb.Error):  # a result left open holds the old database: the file could not be attached again
            self.connection.complete()
        with _attached_lock:  # the other cursors' statements fail meanwhile, as they did before
            spare = _spares[os.path.realpath(self.path)]
            spare.execute("DETACH DATABASE IF EXISTS store")
            spare.execute(_ATTACH.format(path=self.path.replace("'", "''")))
            # detaching the default made `spare` the default for new cursors: detached and attached again, store is
            for statement in ("USE store", f"DETACH {_SPARE}", f"ATTACH ':memory:' AS {_SPARE}", f"USE {_SPARE}"):
                spare.execute(statement)
        self._span_keys = self._trace_counts = None  # read again from the rows: a commit reported failed may be stored
        self.connection.execute("CHECKPOINT")

    # --- schema -----------------------------------------------------------------------------

    def _version(self) -> int:
        return schema_version(self.connection)

    def _migrate(self) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}; this plumbline reads up to {SCHEMA_VERSION}: upgrade plumbline")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._transaction():
                for statement in _MIGRATIONS[target]:
                    self.connection.execute(statement)
                self.connection.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(target)])

    def _stored_task_keys(self) -> tuple[str, ...]:
        try:
            row = self.connection.execute("SELECT value FROM meta WHERE key = 'task_keys'").fetchone()
        except duckdb.Error:
            row = None
        return tuple(orjson.loads(row[0])) if row else DEFAULT_TASK_KEYS

    def set_task_keys(self, keys: Iterable[str]) -> None:
        """Change which attributes name a run's task; every trajectory is rebuilt on next assembly."""
        keys = tuple(keys)
        if keys == self._stored_task_keys():
            self.task_keys = keys
            return
        self.task_keys = keys
        with self._transaction():
            self.connection.execute("INSERT OR REPLACE INTO meta VALUES ('task_keys', ?)", [orjson.dumps(list(keys)).decode()])
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

    def write_logs(self, rows: LogRows) -> int:
        """Commit GenAI log records in one transaction; returns how many were new.

        The traces they belong to are marked dirty, so `assemble` folds the records in whether they
        came before or after their spans (a trace with no span yet is just let go: its spans mark it again).
        """
        if not rows.kept:
            return 0
        log_batch = pa.table({n: pa.array(v, _LOG_TYPES.get(n, pa.string())) for n, v in rows.columns.items()})  # noqa: F841
        with self._transaction():
            row = self.connection.execute("INSERT OR IGNORE INTO logs SELECT * FROM log_batch").fetchone()
            self.connection.execute("INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM log_batch WHERE trace_id IS NOT NULL")
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

    def store_certificate(self, cert: dict[str, Any], now_ns: int | None = None) -> int:
        """Keep a certificate for the console; returns how many are kept."""
        filters = cert.get("provenance", {}).get("filters", {})
        head = cert["headline"]
        with self._transaction():
            self.connection.execute("INSERT INTO certificates VALUES (?, ?, ?, ?, ?, ?, ?)",
                                    [time.time_ns() if now_ns is None else now_ns, cert["spec"]["hash"], filters.get("study"),
                                     filters.get("agent"), head.get("verdict"), head["lower_bound"], orjson.dumps(cert).decode()])
        row = self.connection.execute("SELECT count(*) FROM certificates").fetchone()
        return int(row[0]) if row else 0

    def stored_violations(self, spec_hash: str, run_ids: list[str]) -> set[tuple[str, str]]:
        """(trajectory_id, invariant_id) of the stored violations of these runs under `spec_hash`."""
        rows = self.connection.execute(
            "SELECT trajectory_id, invariant_id FROM violations WHERE spec_hash = ? AND trajectory_id IN (SELECT unnest(?))",
            [spec_hash, run_ids]).fetchall()
        return {(r[0], r[1]) for r in rows}

    def set_memory_limit(self, mib: int) -> None:
        """Cap DuckDB's buffer cache (it defaults to 80% of the machine's memory)."""
        self.connection.execute(f"SET memory_limit = '{int(mib)}MiB'")

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

    def _keys(self) -> _SpanKeys:
        if self._span_keys is None:
            self._span_keys = _SpanKeys(self.connection.execute("SELECT hash(trace_id, span_id) AS k FROM spans").fetchnumpy()["k"])
        return self._span_keys

    def _counts(self) -> _TraceCounts:
        if self._trace_counts is None:
            stored = self.connection.execute("SELECT hash(trace_id) AS t, count(*) AS n FROM spans GROUP BY 1").fetchnumpy()
            self._trace_counts = _TraceCounts(stored["t"], stored["n"])
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
        """Each row's span key (`_SpanKeys`) and trace hash (`_TraceCounts`)."""
        with self._registered(name, table):
            found = self.connection.execute(f"SELECT hash(trace_id, span_id) AS k, hash(trace_id) AS t FROM {name}").fetchnumpy()
        return found["k"], found["t"]

    def _unstored(self, batch: pa.Table) -> pa.Table:
        """The rows of `batch` not stored yet, each span once: a table scan, run only when `_SpanKeys` suspects a retry."""
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
        scans the spans table (the stored counts are `_TraceCounts`'), and the trace ids reach SQL
        as a registered Arrow table, not as a list parameter, which cost milliseconds to bind.
        """
        if not counts:
            return 0
        with self._registered("assembled", _trace_ids(counts)):
            found = self.connection.execute("SELECT trace_id, hash(trace_id) AS t FROM assembled").fetchnumpy()
            # log records are folded from the store: a trace that has some is rebuilt by `assemble`
            with_logs = {t for (t,) in self.connection.execute(
                "SELECT DISTINCT trace_id FROM logs WHERE trace_id IN (SELECT trace_id FROM assembled)").fetchall()}
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
                total += self._write_trajectories(self._long_trace_runs(trace_id), [trace_id])
        return total

    def _rebuilt(self, trace_ids: list[str]) -> pa.Table:
        """The trajectories of these traces, from their stored spans (and log records)."""
        by_trace = self._records_for(trace_ids)
        runs = (t for recs in by_trace.values() for t in iter_runs(recs, self.task_keys))
        return trajectory_table(runs, time.time_ns())

    def _long_trace_runs(self, trace_id: str) -> Iterator[pa.Table]:
        """A long trace's trajectories, a batch of runs at a time, never holding the whole trace as records.

        The trace is split into runs on the few columns `split_runs` reads; each batch of runs (up
        to `LONG_TRACE_SPANS` spans, or one larger run) is then read in full and assembled exactly as
        `iter_runs` would. A trace that is one run is read whole: one run is one assembly.
        """
        rows = self.connection.execute(
            "SELECT span_id, parent_span_id, start_ns, step_kind, shapes, handoff_to FROM spans WHERE trace_id = ?",
            [trace_id]).fetchall()
        skeleton = [SpanRecord(trace_id, span_id, parent, "", start_ns, start_ns, step_kind=kind, shapes=shapes or [], handoff_to=handoff)
                    for span_id, parent, start_ns, kind, shapes, handoff in rows]
        del rows
        runs = split_runs(skeleton)
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

    def trajectories_built_since(self, ns: int) -> int:
        """How many stored trajectories were built at or after `ns` (a wall-clock time in ns)."""
        row = self.connection.execute("SELECT count(*) FROM trajectories WHERE assembled_ns >= ?", [ns]).fetchone()
        return int(row[0]) if row else 0

    def pending_traces(self) -> int:
        """Traces whose spans arrived after their trajectory was last built (or that have none yet).

        Readers that cannot assemble (a read-only file) report this count, because the
        trajectories table does not reflect those traces' spans.
        """
        row = self.connection.execute("SELECT count(*) FROM dirty_traces").fetchone()
        return int(row[0]) if row else 0

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

    # --- reads ------------------------------------------------------------------------------


    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     where: str | None = None) -> Iterator[Trajectory]:
        """Stored trajectories in start order; `where` is an extra SQL filter over the trajectories table."""
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        for column, value in (("service", service), ("task_key", task)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if since_ns is not None:
            clauses.append("start_ns >= ?")
            params.append(since_ns)
        if where:
            clauses.append(f"({where})")
        cursor = self.connection.cursor()
        cursor.execute(f"SELECT doc FROM trajectories WHERE {' AND '.join(clauses)} ORDER BY start_ns, trajectory_id", params)
        while rows := cursor.fetchmany(1000):
            for (doc,) in rows:
                yield trajectory_from_doc(orjson.loads(doc))

    def close(self) -> None:
        """Close the file; a closed store cannot be used again (closing it again does nothing)."""
        if not self._closed:
            self._closed = True
            _disconnect(self.path, self.connection, self.read_only)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def open_assembled(path: str | Path) -> tuple[Store, int]:
    """The store for a reader, with every stored span in a trajectory when that is possible.

    A reader that can write assembles what is pending first, so it gives the same answer as
    `check` or a server would. When another reader holds the file, or the file (or its folder,
    where DuckDB keeps its write-ahead log) is not writable, it opens read-only and returns how
    many traces are pending (their spans are not in the trajectories it will see), for the caller
    to say so. A file a writer holds raises `StoreLocked`; a missing file raises `StoreError` (a
    reader never creates a store).
    """
    file = Path(path)
    if not file.exists():
        return Store(path, read_only=True), 0  # raises "cannot open" naming the path
    try:
        store = Store(path)
    except StoreError as exc:
        writable = os.access(file, os.W_OK) and os.access(file.parent, os.W_OK)
        if not isinstance(exc, StoreLocked) and writable:
            raise
        store = Store(path, read_only=True)
        return store, store.pending_traces()
    try:
        store.assemble()
    except BaseException:
        store.close()
        raise
    return store, 0


def pending_note(pending: int) -> str:
    """The sentence a read-only reader prints beside figures that exclude pending traces."""
    return (f"note: {pending} trace{'s' if pending != 1 else ''} not yet assembled into trajectories "
            f"{'are' if pending != 1 else 'is'} excluded from these figures (the store is open read-only: another "
            "process holds it, or it is not writable); run again when it is free, or ask a server with --server")
