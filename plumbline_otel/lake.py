"""The lake: one Apache Iceberg table set every instance commits to, read by every reader as one store.

Past one machine, each `plumbline serve` instance keeps its own DuckDB file for the hot path (the
Collector's `loadbalancing` exporter routes each trace to one instance) and commits what readers
need into seven Iceberg tables in the namespace `plumbline`, each partitioned by the committing
instance:

    runs        one row per trajectory (the driver's records of a replay study included): the
                store's trajectories table, its `doc` as JSON text
    steps       one row per step of a run (kind, name, span id, call id, error, the step as JSON),
                for engines that read the lake without plumbline
    spans       the span columns the coverage report reads (no payloads)
    logs        GenAI log records: ids, trace, span, service (no bodies)
    problems    input rejected on the way in
    violations  the store's violations (`plumbline check`, the standing check)
    certificate_cells
                every cell of every certificate the instance kept (`plumbline certify`), as JSON,
                with its agent, perturbation, verdict, n and bounds as columns

A catalog URI names the lake: a directory (an embedded SQLite catalog `catalog.db` and the data
files under `data/` in it), `sqlite:///FILE` or `postgresql://…` (SQLAlchemy's; the data files at
`?warehouse=URI`, a directory or object storage), read and written by pyiceberg's SQL catalog.

Committing (`LakeSink.sync`) is a diff, not a log: for each table the instance's rows are grouped
by trace (by instance for `problems` and `violations`), and each group's row count and the sum of
its rows' hashes (`hash(trajectory_id, assembled_ns)` for runs, `hash(span_id)` for spans, …) are
compared between the store and the lake. Groups that differ are replaced: one Iceberg transaction
deletes the instance's rows of those traces and appends the store's. A late span that rebuilds a
run changes its `assembled_ns`, so the run is replaced exactly once; syncing again finds nothing
to do; a sync killed at any point leaves either the old or the new table (Iceberg commits swap one
metadata pointer in the catalog) and the next sync finishes the work. Groups are committed
`BATCH_ROWS` rows at a time (Parquet row-group sized). Several instances commit to one table
concurrently: Iceberg's optimistic commit refuses all but one, and the others reload the table and
redo their transaction (`_commit`), as Iceberg intends.

Reading (`LakeReader`) scans the tables through pyiceberg into Arrow and runs the store's own SQL
over them in an in-memory DuckDB store, so every reader gives exactly the single-store answer. A
trace whose spans reached two instances (misrouted) is named and left out, as across store files.

Other engines read the same tables: Spark and Trino through the same SQL (JDBC) catalog; DuckDB
through its `iceberg` extension where it can reach the catalog, or through Arrow from pyiceberg
(`Lake.scan(...)` then `duckdb.sql("… FROM arrow_table")`), which is what plumbline does.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import duckdb
import pyarrow as pa

from plumbline_otel.errors import ConfigError, StoreError
from plumbline_otel.model import Trajectory
from plumbline_otel.store import Store

NAMESPACE = "plumbline"
# Rows per appended batch: about one Parquet row group of runs (~1-5 KB a doc) per data file.
BATCH_ROWS = 50_000
# Commit attempts before giving up (a sync that gives up is retried whole by the next one).
COMMIT_ATTEMPTS = 30

_S, _I64, _I32, _B, _F64 = pa.string(), pa.int64(), pa.int32(), pa.bool_(), pa.float64()
_LIST = pa.list_(pa.string())
SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema([("instance", _S), ("trajectory_id", _S), ("trace_id", _S), ("task_key", _S), ("task_key_source", _S),
                       ("service", _S), ("service_version", _S), ("agent_name", _S), ("input", _S), ("final_output", _S),
                       ("conventions", _LIST), ("start_ns", _I64), ("end_ns", _I64), ("n_steps", _I32), ("n_tool_calls", _I32),
                       ("doc", _S), ("assembled_ns", _I64)]),
    "steps": pa.schema([("instance", _S), ("trajectory_id", _S), ("trace_id", _S), ("assembled_ns", _I64), ("service", _S),
                        ("task_key", _S), ("step_index", _I32), ("kind", _S), ("name", _S), ("span_id", _S), ("call_id", _S),
                        ("error", _S), ("step", _S)]),
    "spans": pa.schema([("instance", _S), ("trace_id", _S), ("span_id", _S), ("parent_span_id", _S), ("name", _S), ("scope_name", _S),
                        ("start_ns", _I64), ("end_ns", _I64), ("service_name", _S), ("service_version", _S), ("convention", _S),
                        ("step_kind", _S), ("tool_name", _S), ("model", _S), ("args_state", _S), ("content_captured", _B),
                        ("input_tokens", _I64), ("output_tokens", _I64), ("dropped_attributes_count", _I32), ("shapes", _LIST),
                        ("unknown_keys", _LIST), ("status_code", _I32), ("received_ns", _I64)]),
    "logs": pa.schema([("instance", _S), ("log_id", _S), ("trace_id", _S), ("span_id", _S), ("time_ns", _I64), ("observed_ns", _I64),
                       ("event_name", _S), ("severity_number", _I32), ("service_name", _S), ("received_ns", _I64)]),
    "problems": pa.schema([("instance", _S), ("received_ns", _I64), ("source", _S), ("location", _S), ("reason", _S), ("spans", _I32)]),
    "violations": pa.schema([("instance", _S), ("spec_hash", _S), ("invariant_id", _S), ("trajectory_id", _S), ("severity", _S),
                             ("task_key", _S), ("step_index", _I32), ("step_name", _S), ("detail", _S)]),
    # Each cell of every certificate the instance kept (`certify` on its store, or `certify --server`): the cell as JSON
    # beside the columns a dashboard groups and filters by.
    "certificate_cells": pa.schema([("instance", _S), ("stored_ns", _I64), ("spec_hash", _S), ("study", _S), ("agent", _S),
                                    ("perturbation", _S), ("verdict", _S), ("gate_method", _S), ("n", _I64), ("conforming", _I64),
                                    ("tasks", _I64), ("gate_lower", _F64), ("gate_upper", _F64), ("cell", _S)]),
}
TABLES = tuple(SCHEMAS)
# pyiceberg's own retry re-applies a transaction's snapshot to the new table without reading it
# again; `LakeSink._commit` redoes the whole transaction instead (its delete reads the files anew).
_TABLE_PROPERTIES = {"write.parquet.compression-codec": "zstd", "commit.retry.num-retries": "0"}


@dataclass(frozen=True)
class _Kind:
    """How one table is filled from a store and diffed against the lake."""

    rows: str  # SQL over the store: the table's columns (but `instance`), for groups in `changed`
    key: str  # the group key, over the table's columns
    store_fp: str  # SQL over the store: key, n, fp for every group
    lake_fp: str  # SQL over `lake_rows` (this instance's rows in the lake): key, n, fp
    lake_fields: tuple[str, ...]  # columns `lake_fp` reads


def _fp(source: str, key: str, hashed: str) -> str:
    return f"SELECT {key} AS key, count(*) AS n, sum(hash({hashed})::HUGEINT) AS fp FROM {source} GROUP BY 1"


_CHANGED = "{key} IN (SELECT key FROM changed)"
_STEPS_SQL = """
    SELECT t.trajectory_id, t.trace_id, t.assembled_ns, t.service, t.task_key, (x.idx - 1)::INTEGER AS step_index,
           json_extract_string(x.step, '$.kind') AS kind, json_extract_string(x.step, '$.name') AS name,
           json_extract_string(x.step, '$.span_id') AS span_id, json_extract_string(x.step, '$.call_id') AS call_id,
           json_extract_string(x.step, '$.error') AS error, x.step::VARCHAR AS step
    FROM (SELECT *, from_json(json_extract(doc, '$.steps'), '["json"]') AS steps FROM trajectories
          WHERE n_steps > 0 AND trace_id IN (SELECT key FROM changed)) t,
         unnest(t.steps) WITH ORDINALITY AS x(step, idx)"""
_CELLS_SQL = """
    SELECT stored_ns, spec_hash, study, json_extract_string(cell, '$.agent') AS agent,
           json_extract_string(cell, '$.perturbation') AS perturbation, json_extract_string(cell, '$.verdict') AS verdict,
           json_extract_string(cell, '$.gate_method') AS gate_method, json_extract(cell, '$.n')::BIGINT AS n,
           json_extract(cell, '$.conforming')::BIGINT AS conforming, json_extract(cell, '$.tasks')::BIGINT AS tasks,
           json_extract(cell, '$.gate_lower')::DOUBLE AS gate_lower, json_extract(cell, '$.gate_upper')::DOUBLE AS gate_upper,
           cell::VARCHAR AS cell
    FROM (SELECT stored_ns, spec_hash, study, unnest(from_json(json_extract(agent, '$.perturbations'), '["json"]')) AS cell
          FROM (SELECT stored_ns, spec_hash, study, unnest(from_json(json_extract(doc::JSON, '$.agents'), '["json"]')) AS agent
                FROM certificates))"""
_KINDS: dict[str, _Kind] = {
    "runs": _Kind(
        rows="SELECT trajectory_id, trace_id, task_key, task_key_source, service, service_version, agent_name, input, final_output, "
             "conventions, start_ns, end_ns, n_steps, n_tool_calls, doc::VARCHAR AS doc, assembled_ns FROM trajectories WHERE "
             + _CHANGED.format(key="trace_id"),
        key="trace_id",
        store_fp=_fp("trajectories", "trace_id", "trajectory_id, assembled_ns"),
        lake_fp=_fp("lake_rows", "trace_id", "trajectory_id, assembled_ns"),
        lake_fields=("trace_id", "trajectory_id", "assembled_ns")),
    # A run's steps are one group member per run: rows are counted, runs hashed (a run with no steps has none).
    "steps": _Kind(
        rows=_STEPS_SQL, key="trace_id",
        store_fp="SELECT trace_id AS key, sum(n_steps) AS n, sum(hash(trajectory_id, assembled_ns)::HUGEINT) AS fp "
                 "FROM trajectories WHERE n_steps > 0 GROUP BY 1",
        lake_fp="SELECT trace_id AS key, sum(c) AS n, sum(hash(trajectory_id, assembled_ns)::HUGEINT) AS fp FROM "
                "(SELECT trace_id, trajectory_id, assembled_ns, count(*) AS c FROM lake_rows GROUP BY ALL) GROUP BY 1",
        lake_fields=("trace_id", "trajectory_id", "assembled_ns")),
    "spans": _Kind(
        rows="SELECT trace_id, span_id, parent_span_id, name, scope_name, start_ns, end_ns, service_name, service_version, convention, step_kind, "
             "tool_name, model, args_state, content_captured, input_tokens, output_tokens, dropped_attributes_count, shapes, "
             "unknown_keys, status_code, received_ns FROM spans WHERE " + _CHANGED.format(key="trace_id"),
        key="trace_id",
        store_fp=_fp("spans", "trace_id", "span_id"), lake_fp=_fp("lake_rows", "trace_id", "span_id"),
        lake_fields=("trace_id", "span_id")),
    # Log records without a trace are one group, keyed ''.
    "logs": _Kind(
        rows="SELECT log_id, trace_id, span_id, time_ns, observed_ns, event_name, severity_number, service_name, received_ns "
             "FROM logs WHERE " + _CHANGED.format(key="coalesce(trace_id, '')"),
        key="trace_id",
        store_fp=_fp("logs", "coalesce(trace_id, '')", "log_id"), lake_fp=_fp("lake_rows", "coalesce(trace_id, '')", "log_id"),
        lake_fields=("trace_id", "log_id")),
    "problems": _Kind(
        rows="SELECT received_ns, source, location, reason, spans FROM problems WHERE " + _CHANGED.format(key="''"),
        key="",
        store_fp=_fp("problems", "''", "received_ns, source, location, reason, spans"),
        lake_fp=_fp("lake_rows", "''", "received_ns, source, location, reason, spans"),
        lake_fields=("received_ns", "source", "location", "reason", "spans")),
    "violations": _Kind(
        rows="SELECT spec_hash, invariant_id, trajectory_id, severity, task_key, step_index, step_name, detail FROM violations WHERE "
             + _CHANGED.format(key="''"),
        key="",
        store_fp=_fp("violations", "''", "spec_hash, invariant_id, trajectory_id, severity, task_key, step_index, step_name, detail"),
        lake_fp=_fp("lake_rows", "''", "spec_hash, invariant_id, trajectory_id, severity, task_key, step_index, step_name, detail"),
        lake_fields=("spec_hash", "invariant_id", "trajectory_id", "severity", "task_key", "step_index", "step_name", "detail")),
    "certificate_cells": _Kind(
        rows=_CELLS_SQL + " WHERE " + _CHANGED.format(key="''"),
        key="",
        store_fp=f"SELECT '' AS key, count(*) AS n, sum(hash(stored_ns, spec_hash, cell)::HUGEINT) AS fp FROM ({_CELLS_SQL}) GROUP BY 1",
        lake_fp=_fp("lake_rows", "''", "stored_ns, spec_hash, cell"),
        lake_fields=("stored_ns", "spec_hash", "cell")),
}


def parse_lake_uri(uri: str) -> tuple[str, str]:
    """The SQLAlchemy URI of the catalog and the warehouse location (where data files go) of a `--lake` value.

    A directory (or `file://DIR`) is an embedded lake: `DIR/catalog.db` (SQLite) and `DIR/data`.
    `sqlite:///FILE` keeps its data beside the file unless `?warehouse=` says where; a Postgres
    catalog (`postgresql://…`, psycopg) needs `?warehouse=`.
    """
    if "://" not in uri or uri.startswith("file://"):
        root = Path(uri.removeprefix("file://")).resolve()
        return f"sqlite:///{root / 'catalog.db'}", (root / "data").as_uri()
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    warehouse = query.pop("warehouse", None)
    scheme = parts.scheme
    if scheme in ("postgresql", "postgres"):
        scheme = "postgresql+psycopg"
    elif scheme == "sqlite":
        if warehouse is None:
            warehouse = (Path(parts.path).resolve().parent / "data").as_uri()
    elif not scheme.startswith(("postgresql+", "sqlite+")):
        raise ConfigError(f"--lake {uri}: expected a directory, sqlite:///FILE or postgresql://… (a SQL catalog)")
    if warehouse is None:
        raise ConfigError(f"--lake {uri}: say where the data files go: ?warehouse=file:///DIR or s3://BUCKET/PATH")
    if "://" not in warehouse:
        warehouse = Path(warehouse).resolve().as_uri()
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), "")), warehouse


def _identity_spec(schema: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    source = schema.find_field("instance").field_id
    return PartitionSpec(PartitionField(source_id=source, field_id=1000, transform=IdentityTransform(), name="instance"))


class Lake:
    """The table set behind one catalog URI; tables are created on first use (by whichever instance comes first)."""

    def __init__(self, uri: str) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.uri = uri
        catalog_uri, self.warehouse = parse_lake_uri(uri)
        if catalog_uri.startswith("sqlite:///"):
            Path(catalog_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        if self.warehouse.startswith("file://"):
            Path(self.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        try:
            self.catalog = SqlCatalog("plumbline", uri=catalog_uri, warehouse=self.warehouse)
        except Exception as exc:  # noqa: BLE001 - the driver's own error, named
            raise StoreError(f"--lake {uri}: cannot open the catalog: {exc}") from None
        self._tables: dict[str, Any] = {}

    @property
    def label(self) -> str:
        """How the lake is named in messages: its URI without credentials."""
        parts = urlsplit(self.uri)
        if parts.password:
            return urlunsplit((parts.scheme, f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else ""),
                               parts.path, parts.query, ""))
        return self.uri

    def table(self, name: str, create: bool = True) -> Any:
        """The Iceberg table `name` (created, partitioned by instance, when absent and `create`); None when absent."""
        from pyiceberg.exceptions import NoSuchTableError

        if name in self._tables:
            return self._tables[name]
        identifier = f"{NAMESPACE}.{name}"
        try:
            table = self.catalog.load_table(identifier)
        except NoSuchTableError:
            if not create:
                return None
            # Another instance may make either meanwhile: pyiceberg says so, or (Postgres) the catalog's unique key does.
            try:
                self.catalog.create_namespace(NAMESPACE)
            except Exception:  # noqa: BLE001 - NamespaceAlreadyExistsError or the driver's IntegrityError
                if NAMESPACE not in {n[0] for n in self.catalog.list_namespaces()}:
                    raise
            schema = _fresh_schema(SCHEMAS[name])
            try:
                table = self.catalog.create_table(identifier, schema=schema, partition_spec=_identity_spec(schema),
                                                  properties=_TABLE_PROPERTIES)
            except Exception as exc:  # noqa: BLE001 - TableAlreadyExistsError or the driver's IntegrityError
                try:
                    table = self.catalog.load_table(identifier)
                except NoSuchTableError:
                    raise exc from None
        self._tables[name] = table
        return table

    def scan(self, name: str, row_filter: Any = None, fields: Iterable[str] = ()) -> pa.Table:
        """Rows of a table (all, or those matching a pyiceberg expression), as Arrow; empty when the table is absent."""
        from pyiceberg.expressions import AlwaysTrue

        table = self.table(name, create=False)
        wanted = tuple(fields) or tuple(SCHEMAS[name].names)
        if table is None:
            return SCHEMAS[name].empty_table().select(list(wanted))
        table.refresh()
        found = table.scan(row_filter=row_filter if row_filter is not None else AlwaysTrue(), selected_fields=wanted).to_arrow()
        return found.select(list(wanted)).cast(pa.schema([SCHEMAS[name].field(n) for n in wanted]))


def _fresh_schema(arrow: pa.Schema) -> Any:
    """An Iceberg schema of `arrow` with ids 1.. in column order (lists' elements after)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import BooleanType, DoubleType, IntegerType, ListType, LongType, NestedField, StringType

    kinds = {_S: StringType(), _I64: LongType(), _I32: IntegerType(), _B: BooleanType(), _F64: DoubleType()}
    fields, next_id = [], len(arrow) + 1
    for i, f in enumerate(arrow, start=1):
        if f.type == _LIST:
            kind: Any = ListType(element_id=next_id, element_type=StringType(), element_required=False)
            next_id += 1
        else:
            kind = kinds[f.type]
        fields.append(NestedField(field_id=i, name=f.name, field_type=kind, required=False))
    return Schema(*fields)


def default_instance(db_path: str) -> str:
    """An instance's name when none is given: this host and the store file's absolute path (stable across restarts)."""
    return f"{socket.gethostname()}:{os.path.realpath(db_path)}"


@dataclass
class SyncResult:
    """What one sync committed: per table, groups replaced and rows written; commits retried after a conflict."""

    groups: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return any(self.groups.values())

    def as_dict(self) -> dict[str, Any]:
        return {"groups": self.groups, "rows": self.rows, "retries": self.retries, "seconds": round(self.seconds, 3)}


class LakeSink:
    """One instance's commits to the lake. `sync(connection)` makes the lake's rows of this instance equal its store's."""

    def __init__(self, lake: Lake, instance: str, batch_rows: int = BATCH_ROWS,
                 before_commit: Callable[[str], None] | None = None) -> None:
        if not instance:
            raise ConfigError("a lake instance needs a name")
        self.lake, self.instance, self.batch_rows = lake, instance, batch_rows
        self._before_commit = before_commit  # tests: called with the table name before each commit
        self._lake_fp: dict[str, pa.Table] = {}  # what this instance's rows in the lake hash to, per table (dropped on any error)

    def _lake_groups(self, name: str, connection: Any) -> pa.Table:
        if name not in self._lake_fp:
            from pyiceberg.expressions import EqualTo

            with _registered(connection, lake_rows=self.lake.scan(name, EqualTo("instance", self.instance), _KINDS[name].lake_fields)):
                self._lake_fp[name] = connection.sql(_KINDS[name].lake_fp).to_arrow_table()
        return self._lake_fp[name]

    def sync(self, connection: Any) -> SyncResult:
        """Commit what changed in the store behind `connection` (a DuckDB connection or cursor of a store) since the lake last saw it.

        Reads the store in one transaction (a consistent snapshot while a writer goes on). Idempotent:
        a second sync with nothing new commits nothing.
        """
        started = time.monotonic()
        result = SyncResult()
        cursor = connection.cursor()
        try:
            cursor.execute("BEGIN TRANSACTION")
            for name in TABLES:
                try:
                    self._sync_table(name, cursor, result)
                except BaseException:
                    self._lake_fp.pop(name, None)  # read again from the lake next time
                    raise
            cursor.execute("COMMIT")
        finally:
            cursor.close()
        result.seconds = time.monotonic() - started
        return result

    def _sync_table(self, name: str, cursor: Any, result: SyncResult) -> None:
        kind = _KINDS[name]
        lake_fp = self._lake_groups(name, cursor)
        store_fp = cursor.sql(kind.store_fp).to_arrow_table()
        with _registered(cursor, lake_fp=lake_fp, store_fp=store_fp):
            diff = cursor.execute(
            "SELECT coalesce(s.key, l.key) AS key, l.key IS NOT NULL AS in_lake FROM store_fp s FULL JOIN lake_fp l ON s.key = l.key "
                "WHERE s.n IS DISTINCT FROM l.n OR s.fp IS DISTINCT FROM l.fp ORDER BY 1").fetchall()
        result.groups[name], result.rows[name] = len(diff), 0
        if not diff:
            return
        # Batches of groups about `batch_rows` rows each (by the store's counts), each one transaction.
        sizes = dict(zip(store_fp["key"].to_pylist(), store_fp["n"].to_pylist())) if len(diff) > 1 else {}
        batch: list[tuple[str, bool]] = []
        rows = 0
        for key, in_lake in diff:
            batch.append((key, in_lake))
            rows += int(sizes.get(key, 0))
            if rows >= self.batch_rows:
                result.rows[name] += self._commit_groups(name, batch, cursor, result)
                batch, rows = [], 0
        if batch:
            result.rows[name] += self._commit_groups(name, batch, cursor, result)
        # The lake now holds the store's groups: its fingerprint is the store's.
        self._lake_fp[name] = store_fp

    def _commit_groups(self, name: str, groups: list[tuple[str, bool]], cursor: Any, result: SyncResult) -> int:
        from pyiceberg.expressions import And, EqualTo, In, IsNull, Or

        kind = _KINDS[name]
        with _registered(cursor, changed=pa.table({"key": pa.array([k for k, _ in groups], pa.string())})):
            found = cursor.sql(kind.rows).to_arrow_table()
        rows = pa.table({"instance": pa.array([self.instance] * found.num_rows, pa.string()),
                         **{n: found[n] for n in found.column_names}}).cast(SCHEMAS[name])
        stale = [k for k, in_lake in groups if in_lake]
        delete: Any = None
        if stale:
            mine = EqualTo("instance", self.instance)
            if not kind.key:  # the whole instance is one group
                delete = mine
            else:
                keyed = [k for k in stale if k]
                clause: Any = In(kind.key, keyed) if keyed else None
                if "" in stale:  # records of no trace (logs)
                    clause = Or(clause, IsNull(kind.key)) if clause is not None else IsNull(kind.key)
                delete = And(mine, clause)
        self._commit(name, delete, rows, result)
        return int(rows.num_rows)

    def _commit(self, name: str, delete: Any, rows: pa.Table, result: SyncResult) -> None:
        """Delete, then append, in one Iceberg transaction; a commit refused for a concurrent one is redone on the new table."""
        from pyiceberg.exceptions import CommitFailedException

        properties = {"plumbline.instance": self.instance}
        for attempt in range(COMMIT_ATTEMPTS):
            table = self.lake.table(name)
            if attempt:
                table.refresh()
            try:
                with table.transaction() as tx:
                    if delete is not None:
                        tx.delete(delete, snapshot_properties=properties)
                    if rows.num_rows:
                        tx.append(rows, snapshot_properties=properties)
                    if self._before_commit is not None:
                        self._before_commit(name)
                return
            except CommitFailedException:
                result.retries += 1
                time.sleep(random.uniform(0.02, 0.05) * min(2 ** attempt, 20))  # noqa: S311 (jitter, not secrecy)
        raise StoreError(f"lake {self.lake.label}: table {name}: {COMMIT_ATTEMPTS} commits refused for concurrent ones; try again")


@contextmanager
def _registered(connection: Any, **tables: pa.Table) -> Iterator[None]:
    """Arrow tables readable in SQL by these names on `connection` for the block."""
    for name, table in tables.items():
        connection.register(name, table)
    try:
        yield
    finally:
        for name in tables:
            connection.unregister(name)


# --- reading ------------------------------------------------------------------------------------------


class LakeReader:
    """The lake read as one store (for `Sources`)."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake

    def trace_ids_by_instance(self) -> dict[str, list[str]]:
        """Each instance's trace ids (from the spans table): a trace under two instances was misrouted."""
        found = self.lake.scan("spans", fields=("instance", "trace_id"))
        with duckdb.connect() as db, _registered(db, found=found):
            rows = db.execute("SELECT instance, list(DISTINCT trace_id ORDER BY trace_id) FROM found GROUP BY 1 ORDER BY 1").fetchall()
        return {f"{self.lake.label}#{instance}": ids for instance, ids in rows}

    def memory_store(self, tables: Iterable[str] = TABLES, row_filter: dict[str, Any] | None = None) -> Store:
        """An in-memory store holding the lake's rows of `tables` (with an optional pyiceberg filter per table)."""
        store = Store(":memory:")
        try:
            for name in tables:
                if name in ("steps", "certificate_cells"):
                    continue  # steps are in the runs' documents; certificate cells are for engines reading the lake
                target = {"runs": "trajectories"}.get(name, name)
                with _registered(store.connection, lake_rows=self.lake.scan(name, (row_filter or {}).get(name)).drop_columns(["instance"])):
                    # a misrouted trace's run is under two instances: one copy is kept (readers leave it out anyway)
                    ignore = "OR IGNORE " if target in ("trajectories", "logs") else ""  # the tables with a primary key
                    store.connection.execute(f"INSERT {ignore}INTO {target} BY NAME SELECT * FROM lake_rows")
        except BaseException:
            store.close()
            raise
        return store

    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     where: str | None = None) -> Iterator[Trajectory]:
        """The lake's runs in start order (filters pushed into the scan; `where` is SQL over the trajectories table)."""
        from pyiceberg.expressions import AlwaysTrue, And, EqualTo, GreaterThanOrEqual

        condition: Any = AlwaysTrue()
        for column, value in (("service", service), ("task_key", task)):
            if value is not None:
                condition = And(condition, EqualTo(column, value))
        if since_ns is not None:
            condition = And(condition, GreaterThanOrEqual("start_ns", since_ns))
        with self.memory_store(("runs",), {"runs": condition}) as store:
            yield from store.trajectories(service=service, task=task, since_ns=since_ns, where=where)


# --- maintenance -----------------------------------------------------------------------------------


def maintain(lake: Lake, older_than_s: float = 3600.0, compact: bool = True, tables: Iterable[str] = TABLES) -> dict[str, Any]:
    """Compact each instance's data files into few large ones, then expire old snapshots.

    Compaction rewrites one instance's partition in one transaction (an overwrite of that partition
    with its own rows, so the rows are the same and readers see no change), retried like any commit
    when an instance commits meanwhile. Expiring snapshots older than `older_than_s` (keeping the
    current one) lets their data files go: readers past that age of time travel lose it.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.expressions import EqualTo

    out: dict[str, Any] = {}
    for name in tables:
        table = lake.table(name, create=False)
        if table is None:
            continue
        table.refresh()
        files_before = _data_files(table)
        if compact:
            instances = sorted(set(lake.scan(name, fields=("instance",))["instance"].to_pylist()))
            for instance in instances:
                for attempt in range(COMMIT_ATTEMPTS):
                    table.refresh()
                    mine = EqualTo("instance", instance)
                    rows = table.scan(row_filter=mine).to_arrow().cast(SCHEMAS[name])
                    try:
                        table.overwrite(rows, overwrite_filter=mine, snapshot_properties={"plumbline.maintenance": "compact"})
                        break
                    except CommitFailedException:
                        time.sleep(random.uniform(0.02, 0.05) * min(2 ** attempt, 20))  # noqa: S311
        table.refresh()
        cutoff_ms = int((time.time() - older_than_s) * 1000)
        current = table.current_snapshot()
        expired = 0
        old = [s.snapshot_id for s in table.snapshots() if s.timestamp_ms < cutoff_ms and (current is None or s.snapshot_id != current.snapshot_id)]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
            expired = len(old)
        table.refresh()
        out[name] = {"data_files_before": files_before, "data_files_after": _data_files(table), "snapshots_expired": expired,
                     "snapshots": len(table.snapshots())}
    return out


def _data_files(table: Any) -> int:
    return int(table.inspect.files().num_rows) if table.current_snapshot() is not None else 0


# --- serving: a thread that syncs a served store --------------------------------------------------------


class LakeSync:
    """Commits a served store to the lake every `interval` seconds, from a cursor of its own (ingest never waits on it).

    Configured by the environment of `plumbline serve` (`from_env`): PLUMBLINE_LAKE (the catalog URI),
    PLUMBLINE_LAKE_INSTANCE (default: host and store path), PLUMBLINE_LAKE_INTERVAL (seconds, default 10).
    A failed sync is logged and retried at the next tick; `stop` syncs once more, so what the store
    holds at shutdown is in the lake.
    """

    def __init__(self, sink: LakeSink, cursor: Callable[[], Any], interval: float = 10.0) -> None:
        self.sink, self._cursor_factory, self.interval = sink, cursor, interval
        self._cursor: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: SyncResult | None = None
        self.failures = 0

    @classmethod
    def from_env(cls, queue: Any, db_path: str, environ: dict[str, str] | None = None) -> LakeSync | None:
        """The sync configured for `plumbline serve`, or None when PLUMBLINE_LAKE is unset."""
        env = os.environ if environ is None else environ
        uri = env.get("PLUMBLINE_LAKE")
        if not uri:
            return None
        sink = LakeSink(Lake(uri), env.get("PLUMBLINE_LAKE_INSTANCE") or default_instance(db_path))
        return cls(sink, lambda: queue.call(lambda store: store.connection.cursor()), float(env.get("PLUMBLINE_LAKE_INTERVAL", "10")))

    def sync_once(self) -> SyncResult | None:
        try:
            if self._cursor is None:
                self._cursor = self._cursor_factory()
            self.last = self.sink.sync(self._cursor)
            return self.last
        except Exception as exc:  # noqa: BLE001 - logged; the next tick tries again on a fresh cursor
            import logging

            self.failures += 1
            logging.getLogger("plumbline.lake").warning("lake sync failed (retried in %.0f s): %s", self.interval, exc)
            self._cursor = None
            return None

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.sync_once()

        self._thread = threading.Thread(target=loop, name="plumbline-lake", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the ticks and sync once more (call before the store closes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync_once()
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None


__all__ = ["BATCH_ROWS", "NAMESPACE", "SCHEMAS", "TABLES", "Lake", "LakeReader", "LakeSink", "LakeSync", "SyncResult",
           "default_instance", "maintain", "parse_lake_uri"]
