"""Store: one DuckDB file holding span rows (the source of truth) and the trajectories built from them.

Writes are batched through Arrow (`INSERT OR IGNORE … SELECT` from a table), never row by row. A
span is keyed by (trace_id, span_id), so an exporter's retry changes nothing. Each write marks its
traces dirty; `assemble()` rebuilds exactly those trajectories, so spans may arrive in any order
and across any number of requests, and a late span updates its trajectory. The schema carries a
version in `meta` and migrates forward on open.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import duckdb
import orjson
import pyarrow as pa

from plumbline_otel.assemble import DEFAULT_TASK_KEYS, assemble
from plumbline_otel.decode import Problem
from plumbline_otel.errors import StoreError
from plumbline_otel.model import SpanRecord, Step, ToolCallRef, ToolResultRef, Trajectory

SCHEMA_VERSION = 1
DEFAULT_DB = "plumbline.duckdb"

# Column name -> DuckDB type, in table order. JSON columns hold orjson text.
_SPAN_COLUMNS: dict[str, str] = {
    "trace_id": "VARCHAR NOT NULL",
    "span_id": "VARCHAR NOT NULL",
    "parent_span_id": "VARCHAR",
    "name": "VARCHAR",
    "start_ns": "BIGINT",
    "end_ns": "BIGINT",
    "kind": "INTEGER",
    "status_code": "INTEGER",
    "status_message": "VARCHAR",
    "service_name": "VARCHAR",
    "service_version": "VARCHAR",
    "scope_name": "VARCHAR",
    "convention": "VARCHAR",
    "step_kind": "VARCHAR",
    "tool_name": "VARCHAR",
    "call_id": "VARCHAR",
    "args": "JSON",
    "args_state": "VARCHAR",
    "result": "JSON",
    "error": "VARCHAR",
    "model": "VARCHAR",
    "provider": "VARCHAR",
    "response_id": "VARCHAR",
    "input_tokens": "BIGINT",
    "output_tokens": "BIGINT",
    "agent_name": "VARCHAR",
    "input_text": "VARCHAR",
    "output_text": "VARCHAR",
    "content_captured": "BOOLEAN",
    "proposed_calls": "JSON",
    "tool_results": "JSON",
    "unknown_keys": "VARCHAR[]",
    "dropped_attributes_count": "INTEGER",
    "context": "JSON",
    "attributes": "JSON",
    "resource": "JSON",
    "received_ns": "BIGINT",
}
_ARROW_TYPES = {"BIGINT": pa.int64(), "INTEGER": pa.int32(), "BOOLEAN": pa.bool_(), "VARCHAR[]": pa.list_(pa.string())}
_JSON_FIELDS = ("args", "result", "attributes", "resource")
_CONTEXT_PREFIX = "plumbline."

_MIGRATIONS: dict[int, list[str]] = {
    1: [
        "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        "CREATE TABLE spans ("
        + ", ".join(f"{name} {kind}" for name, kind in _SPAN_COLUMNS.items())
        + ", PRIMARY KEY (trace_id, span_id))",
        "CREATE TABLE dirty_traces (trace_id VARCHAR PRIMARY KEY)",
        """CREATE TABLE trajectories (
            trajectory_id VARCHAR PRIMARY KEY, trace_id VARCHAR, task_key VARCHAR, task_key_source VARCHAR,
            service VARCHAR, service_version VARCHAR, agent_name VARCHAR, input VARCHAR, final_output VARCHAR,
            conventions VARCHAR[], start_ns BIGINT, end_ns BIGINT, n_steps INTEGER, n_tool_calls INTEGER,
            doc JSON, assembled_ns BIGINT)""",
        """CREATE TABLE problems (
            received_ns BIGINT, source VARCHAR, location VARCHAR, reason VARCHAR, spans INTEGER)""",
    ],
}


@dataclass(frozen=True)
class WriteResult:
    """What a batch write did: new rows and rows that were already there."""

    stored: int
    duplicate: int


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _context(rec: SpanRecord) -> str | None:
    ctx = {k: v for k, v in rec.resource.items() if k.startswith(_CONTEXT_PREFIX)}
    ctx.update({k: v for k, v in rec.attributes.items() if k.startswith(_CONTEXT_PREFIX)})
    return _json(ctx) if ctx else None


_ROW_FIELDS = tuple(c for c in _SPAN_COLUMNS if c not in ("proposed_calls", "tool_results", "context", "resource", "received_ns"))
_SCHEMA = pa.schema([(n, _ARROW_TYPES.get(t.split()[0], pa.string())) for n, t in _SPAN_COLUMNS.items()])
_JSON_INDEXES = tuple(_ROW_FIELDS.index(name) for name in _JSON_FIELDS if name in _ROW_FIELDS)
_ORDER = [*_ROW_FIELDS, "proposed_calls", "tool_results", "context", "resource"]


def _row(rec: SpanRecord, resources: dict[int, str | None]) -> list[Any]:
    values = rec.__dict__
    row = [values[name] for name in _ROW_FIELDS]
    for index in _JSON_INDEXES:
        if row[index] is not None:
            row[index] = _json(row[index])
    row.append(_json([c.__dict__ for c in rec.proposed_calls]) if rec.proposed_calls else None)
    row.append(_json([r.__dict__ for r in rec.tool_results]) if rec.tool_results else None)
    row.append(_context(rec))
    key = id(rec.resource)  # the spans of one ResourceSpans share one dict: encode it once
    if key not in resources:
        resources[key] = _json(rec.resource)
    row.append(resources[key])
    return row


def _columns(records: list[SpanRecord], now: int) -> pa.Table:
    """Span records as one Arrow table, built column-wise (the per-span Python work is the cost here)."""
    resources: dict[int, str | None] = {}
    rows = [_row(rec, resources) for rec in records]
    columns = dict(zip(_ORDER, map(list, zip(*rows)))) if rows else {name: [] for name in _ORDER}
    columns["received_ns"] = [now] * len(records)
    return pa.table({name: columns[name] for name in _SPAN_COLUMNS}, schema=_SCHEMA)


_LOCK_HINT = (
    "the database {path} is held by another process (probably `plumbline serve`); "
    "use --server HOST:PORT to ask the running server, or stop it first"
)


class StoreLocked(StoreError):
    """Another process holds the file (a writer: `plumbline serve`, `ingest`; or a reader)."""


class Store:
    """The DuckDB store. One writer per file; readers of a served file go through the server."""

    def __init__(self, path: str | Path = DEFAULT_DB, read_only: bool = False, task_keys: Iterable[str] | None = None) -> None:
        self.path = str(path)
        try:
            self.connection = duckdb.connect(self.path, read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreLocked(_LOCK_HINT.format(path=self.path)) from None
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        if not read_only:
            self._migrate()
        self.task_keys = tuple(task_keys) if task_keys else self._stored_task_keys()

    # --- schema -----------------------------------------------------------------------------

    def _version(self) -> int:
        exists = self.connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'"
        ).fetchone()
        if not exists or not exists[0]:
            return 0
        row = self.connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}; this plumbline reads up to {SCHEMA_VERSION}: upgrade plumbline")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self.connection.execute("BEGIN")
            for statement in _MIGRATIONS[target]:
                self.connection.execute(statement)
            self.connection.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(target)])
            self.connection.execute("COMMIT")

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
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    # --- writes -----------------------------------------------------------------------------

    def write_spans(self, records: list[SpanRecord], problems: Iterable[Problem] = (), source: str = "") -> WriteResult:
        """Commit a batch of span records (and the problems met reading them) in one transaction."""
        problems = list(problems)
        if not records and not problems:
            return WriteResult(0, 0)
        now = time.time_ns()
        batch = _columns(records, now)  # noqa: F841 - read by name in the SQL below
        with self._transaction():
            stored = 0
            if records:
                row = self.connection.execute("INSERT OR IGNORE INTO spans SELECT * FROM batch").fetchone()
                stored = int(row[0]) if row else 0
                self.connection.execute("INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM batch")
            if problems:
                self.connection.executemany(
                    "INSERT INTO problems VALUES (?, ?, ?, ?, ?)",
                    [(now, source, p.where, p.reason, p.spans) for p in problems],
                )
        return WriteResult(stored=stored, duplicate=len(records) - stored)

    # --- assembly ---------------------------------------------------------------------------

    def _records_for(self, trace_ids: list[str]) -> dict[str, list[SpanRecord]]:
        keys = list(self.task_keys)
        key_sql = ", ".join(
            f"coalesce(json_extract_string(attributes, ${i + 2}), json_extract_string(resource, ${i + 2}))"
            for i in range(len(keys))
        ) or "NULL"
        columns = [c for c in _SPAN_COLUMNS if c not in ("attributes", "resource", "received_ns")]
        rows = self.connection.execute(
            f"SELECT {', '.join(columns)}, [{key_sql}] FROM spans WHERE trace_id IN (SELECT unnest($1))",
            [trace_ids, *[f'$."{k}"' for k in keys]],
        ).fetchall()
        by_trace: dict[str, list[SpanRecord]] = {}
        for row in rows:
            rec = _record(dict(zip(columns, row[:-1])), keys, row[-1])
            by_trace.setdefault(rec.trace_id, []).append(rec)
        return by_trace

    def assemble(self, recent: dict[str, list[SpanRecord]] | None = None, chunk: int = 2000,
                 deadline: float | None = None) -> int:
        """Rebuild the trajectories of every trace that received spans since the last assembly.

        `recent` may hold the records just written, by trace: a trace whose stored spans are
        exactly those (nothing arrived for it earlier) is assembled from memory, not read back.
        Past `deadline` (a `time.monotonic()` value) no further chunk starts: what is left stays
        pending (see `pending_traces`) and the next assembly takes it up, so a bounded shutdown
        never loses work, only defers it.
        """
        recent = recent or {}
        total = 0
        while deadline is None or time.monotonic() < deadline:
            rows = self.connection.execute(
                "SELECT d.trace_id, count(s.span_id) FROM (SELECT trace_id FROM dirty_traces LIMIT ?) d "
                "JOIN spans s USING (trace_id) GROUP BY 1", [chunk]).fetchall()
            if not rows:
                self.connection.execute("DELETE FROM dirty_traces")  # traces whose spans all failed to store
                return total
            dirty = [trace_id for trace_id, _ in rows]
            in_memory = {t: _unique(recent[t]) for t, n in rows if t in recent and len(_unique(recent[t])) == n}
            by_trace = self._records_for([t for t in dirty if t not in in_memory]) if len(in_memory) < len(dirty) else {}
            by_trace.update(in_memory)
            trajectories = [assemble(recs, self.task_keys) for recs in by_trace.values()]
            self._write_trajectories(trajectories, dirty)
            total += len(trajectories)
        return total

    def pending_traces(self) -> int:
        """Traces whose spans arrived after their trajectory was last built (or that have none yet).

        Readers that cannot assemble (a read-only file) report this count, because the
        trajectories table does not reflect those traces' spans.
        """
        row = self.connection.execute("SELECT count(*) FROM dirty_traces").fetchone()
        return int(row[0]) if row else 0

    def _write_trajectories(self, trajectories: list[Trajectory], done: list[str]) -> None:
        now = time.time_ns()
        built = pa.table({  # noqa: F841 - read by name in the SQL below
            "trajectory_id": [t.trajectory_id for t in trajectories],
            "trace_id": [t.trace_id for t in trajectories],
            "task_key": [t.task_key for t in trajectories],
            "task_key_source": [t.task_key_source for t in trajectories],
            "service": [t.service for t in trajectories],
            "service_version": [t.service_version for t in trajectories],
            "agent_name": [t.agent_name for t in trajectories],
            "input": [t.input for t in trajectories],
            "final_output": [t.final_output for t in trajectories],
            "conventions": [list(t.conventions) for t in trajectories],
            "start_ns": pa.array([t.start_ns for t in trajectories], pa.int64()),
            "end_ns": pa.array([t.end_ns for t in trajectories], pa.int64()),
            "n_steps": pa.array([len(t.steps) for t in trajectories], pa.int32()),
            "n_tool_calls": pa.array([len(t.tool_steps) for t in trajectories], pa.int32()),
            "doc": [_json(_doc(t)) for t in trajectories],
            "assembled_ns": pa.array([now] * len(trajectories), pa.int64()),
        })
        with self._transaction():
            self.connection.execute("DELETE FROM trajectories WHERE trace_id IN (SELECT unnest(?))", [done])
            if trajectories:
                self.connection.execute("INSERT INTO trajectories SELECT * FROM built")
            self.connection.execute("DELETE FROM dirty_traces WHERE trace_id IN (SELECT unnest(?))", [done])

    # --- reads ------------------------------------------------------------------------------

    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     where: str | None = None) -> Iterator[Trajectory]:
        """Stored trajectories in start order; `where` is an extra SQL filter over the trajectories table."""
        clauses, params = ["TRUE"], []
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
        """Close the file; a closed store cannot be used again."""
        self.connection.close()

    def __enter__(self) -> "Store":
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


def _unique(records: list[SpanRecord]) -> list[SpanRecord]:
    """The first copy of each span, as the store keeps it (later copies were ignored)."""
    seen: dict[str, SpanRecord] = {}
    for rec in records:
        seen.setdefault(rec.span_id, rec)
    return list(seen.values()) if len(seen) < len(records) else records


def _record(row: dict[str, Any], keys: list[str], key_values: list[Any]) -> SpanRecord:
    for name in ("args", "result"):
        row[name] = orjson.loads(row[name]) if row[name] is not None else None
    row["proposed_calls"] = [ToolCallRef(**c) for c in orjson.loads(row["proposed_calls"])] if row["proposed_calls"] else []
    row["tool_results"] = [ToolResultRef(**r) for r in orjson.loads(row["tool_results"])] if row["tool_results"] else []
    row["unknown_keys"] = row["unknown_keys"] or []
    context_json = row.pop("context")
    context = orjson.loads(context_json) if context_json else {}
    attributes = {k: v for k, v in zip(keys, key_values or []) if v is not None}
    attributes.update(context)
    return SpanRecord(**row, attributes=attributes)


def _doc(t: Trajectory) -> dict[str, Any]:
    doc = t.export()
    doc["steps"] = [
        {**s.export(), "span_id": s.span_id, "start_ns": s.start_ns, "model": s.model,
         "input_tokens": s.input_tokens, "output_tokens": s.output_tokens}
        for s in t.steps
    ]
    return doc


def trajectory_from_doc(doc: dict[str, Any]) -> Trajectory:
    """A trajectory from its stored (or exported) JSON document."""
    steps = tuple(Step(**{k: v for k, v in s.items() if k in Step.__dataclass_fields__}) for s in doc["steps"])
    fields = {k: v for k, v in doc.items() if k in Trajectory.__dataclass_fields__ and k != "steps"}
    fields["conventions"] = tuple(fields.get("conventions") or ())
    return Trajectory(**fields, steps=steps)
