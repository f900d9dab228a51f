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

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from plumbline_otel.errors import ConfigError, StoreError
from plumbline_otel.model import Trajectory
from plumbline_otel.shapes import LAKE_SHAPES, iceberg_type
from plumbline_otel.store import RunFilter, Store, meta_value, set_meta

NAMESPACE = "plumbline"
# Rows per appended batch: about one Parquet row group of runs (~1-5 KB a doc) per data file.
BATCH_ROWS = 50_000
# Whole-transaction attempts (a refusal pyiceberg cannot rebase: maintenance rewrote this instance's files meanwhile).
COMMIT_ATTEMPTS = 30
# Rows are partitioned by instance and by the hour of their run (span, record): a late span rewrites files of its hour only.
HOUR_NS = 3_600_000_000_000

# Each table's columns are declared in `shapes.py` (LAKE_SHAPES: the store's columns the lake copies, and its own tables'),
# from which its Arrow schema here and its Iceberg schema (`Lake.table`, which also evolves an older table's) come.
SCHEMAS: dict[str, pa.Schema] = {name: shape.arrow() for name, shape in LAKE_SHAPES.items() if name != "syncs"}
TABLES = tuple(SCHEMAS)
# The watermark: one row per complete sync of an instance, naming the snapshot of each table that holds that sync.
SYNCS = "syncs"
SYNCS_SCHEMA = LAKE_SHAPES[SYNCS].arrow()
_ALL_SCHEMAS = {**SCHEMAS, SYNCS: SYNCS_SCHEMA}
# pyiceberg rebases a refused commit on the new table (its data files reused, its manifests rewritten) after checking that
# the concurrent commits touched none of the rows it deletes (another instance's commits never do: they are in another
# partition); plumbline's commits merge manifests per instance (`_producers`), not pyiceberg's way across the table (off
# here for other writers too); the metadata files of old table versions are deleted on commit (a few kept).
_TABLE_PROPERTIES = {"write.parquet.compression-codec": "zstd", "commit.retry.num-retries": "40", "commit.retry.min-wait-ms": "20",
                     "commit.retry.max-wait-ms": "2000", "commit.retry.total-timeout-ms": "600000", "commit.manifest-merge.enabled": "false",
                     "commit.manifest.min-count-to-merge": "16", "write.metadata.delete-after-commit.enabled": "true",
                     "write.metadata.previous-versions-max": "8", "write.target-file-size-bytes": str(128 * 1024 * 1024)}
# Between maintenances a table's metadata file lists every snapshot kept, and every commit reads and rewrites it (pyiceberg
# honours previous-versions-max for the metadata log and deletes older metadata files, but not the snapshot list): a commit
# keeps the newest SNAPSHOTS_KEPT and those younger than SNAPSHOT_AGE_S, and expires older ones no reader needs
# (`_trim_history`) once TRIM_SLACK more have accumulated (settings: PLUMBLINE_LAKE_SNAPSHOTS, PLUMBLINE_LAKE_SNAPSHOT_AGE).
SNAPSHOTS_KEPT = 64
SNAPSHOT_AGE_S = 10.0
TRIM_SLACK = 16


@dataclass(frozen=True)
class _Kind:
    """How one table is filled from a store and diffed against the lake (groups: a trace's rows, an hour's problems, …)."""

    rows: str  # SQL over the store: the table's columns (but `instance`), for groups in `changed`
    key: str  # the lake column a group key is a value of ('' for none: the group is the whole hour)
    store_fp: str  # SQL over the store: key, n, fp, hours (the hours its rows are in) for every group
    lake_fp: str  # SQL over `lake_rows` (this instance's rows in the lake): key, n, fp, hours
    lake_fields: tuple[str, ...]  # columns `lake_fp` reads
    key_type: type = str  # the key column's type in the lake


def _hour(ns: str) -> str:
    return f"(coalesce({ns}, 0) // {HOUR_NS})::INTEGER"


def _fp(source: str, key: str, hashed: str, hour: str = "hour") -> str:
    return (f"SELECT {key} AS key, count(*) AS n, sum(hash({hashed})::HUGEINT) AS fp, list(DISTINCT {hour}) AS hours "
            f"FROM {source} GROUP BY 1")


_CHANGED = "{key} IN (SELECT key FROM changed)"


def _columns(name: str, **computed: str) -> str:
    """The columns of lake table `name` (but `instance`) as a sync selects them from the store: by name, or as `computed` says."""
    return ", ".join(f"{computed[c]} AS {c}" if c in computed else c for c in LAKE_SHAPES[name].row_names)


_LOG_TIME = "coalesce(nullif(time_ns, 0), nullif(observed_ns, 0), received_ns)"
_STEPS_SQL = f"""
    SELECT t.trajectory_id, t.trace_id, t.assembled_ns, t.service, t.task_key, (x.idx - 1)::INTEGER AS step_index,
           json_extract_string(x.step, '$.kind') AS kind, json_extract_string(x.step, '$.name') AS name,
           json_extract_string(x.step, '$.span_id') AS span_id, json_extract_string(x.step, '$.call_id') AS call_id,
           json_extract_string(x.step, '$.error') AS error, x.step::VARCHAR AS step, {_hour('t.start_ns')} AS hour
    FROM (SELECT *, from_json(json_extract(doc, '$.steps'), '["json"]') AS steps FROM trajectories
          WHERE n_steps > 0 AND trace_id IN (SELECT key FROM changed)) t,
         unnest(t.steps) WITH ORDINALITY AS x(step, idx)"""
_CELLS_SQL = f"""
    SELECT stored_ns, spec_hash, study, json_extract_string(cell, '$.agent') AS agent,
           json_extract_string(cell, '$.perturbation') AS perturbation, json_extract_string(cell, '$.verdict') AS verdict,
           json_extract_string(cell, '$.gate_method') AS gate_method, json_extract(cell, '$.n')::BIGINT AS n,
           json_extract(cell, '$.conforming')::BIGINT AS conforming, json_extract(cell, '$.tasks')::BIGINT AS tasks,
           json_extract(cell, '$.gate_lower')::DOUBLE AS gate_lower, json_extract(cell, '$.gate_upper')::DOUBLE AS gate_upper,
           cell::VARCHAR AS cell, {_hour('stored_ns')} AS hour
    FROM (SELECT stored_ns, spec_hash, study, unnest(from_json(json_extract(agent, '$.perturbations'), '["json"]')) AS cell
          FROM (SELECT stored_ns, spec_hash, study, unnest(from_json(json_extract(doc::JSON, '$.agents'), '["json"]')) AS agent
                FROM certificates))"""
# A violation lives in the hour of its run (a violation of a run the store no longer holds, in hour 0).
_VIOLATIONS_SQL = f"""
    SELECT v.spec_hash, v.invariant_id, v.trajectory_id, v.severity, v.task_key, v.step_index, v.step_name, v.detail,
           {_hour('t.start_ns')} AS hour
    FROM violations v LEFT JOIN (SELECT trajectory_id, start_ns FROM trajectories) t USING (trajectory_id)"""
_VIOLATION_HASH = "spec_hash, invariant_id, trajectory_id, severity, task_key, step_index, step_name, detail"
_PROBLEM_HASH = "received_ns, source, location, reason, spans"
_KINDS: dict[str, _Kind] = {
    "runs": _Kind(
        rows=f"SELECT {_columns('runs', doc='doc::VARCHAR', hour=_hour('start_ns'))} FROM trajectories WHERE "
             + _CHANGED.format(key="trace_id"),
        key="trace_id",
        store_fp=_fp("trajectories", "trace_id", "trajectory_id, assembled_ns", _hour("start_ns")),
        lake_fp=_fp("lake_rows", "trace_id", "trajectory_id, assembled_ns"),
        lake_fields=("trace_id", "trajectory_id", "assembled_ns", "hour")),
    # A run's steps are one group member per run: rows are counted, runs hashed (a run with no steps has none).
    "steps": _Kind(
        rows=_STEPS_SQL, key="trace_id",
        store_fp="SELECT trace_id AS key, sum(n_steps) AS n, sum(hash(trajectory_id, assembled_ns)::HUGEINT) AS fp, "
                 f"list(DISTINCT {_hour('start_ns')}) AS hours FROM trajectories WHERE n_steps > 0 GROUP BY 1",
        lake_fp="SELECT trace_id AS key, sum(c) AS n, sum(hash(trajectory_id, assembled_ns)::HUGEINT) AS fp, list(DISTINCT hour) AS hours "
                "FROM (SELECT trace_id, trajectory_id, assembled_ns, hour, count(*) AS c FROM lake_rows GROUP BY ALL) GROUP BY 1",
        lake_fields=("trace_id", "trajectory_id", "assembled_ns", "hour")),
    "spans": _Kind(
        rows=f"SELECT {_columns('spans', hour=_hour('start_ns'))} FROM spans WHERE " + _CHANGED.format(key="trace_id"),
        key="trace_id",
        store_fp=_fp("spans", "trace_id", "span_id", _hour("start_ns")), lake_fp=_fp("lake_rows", "trace_id", "span_id"),
        lake_fields=("trace_id", "span_id", "hour")),
    # Log records without a trace are one group, keyed ''.
    "logs": _Kind(
        rows=f"SELECT {_columns('logs', hour=_hour(_LOG_TIME))} FROM logs WHERE " + _CHANGED.format(key="coalesce(trace_id, '')"),
        key="trace_id",
        store_fp=_fp("logs", "coalesce(trace_id, '')", "log_id", _hour(_LOG_TIME)),
        lake_fp=_fp("lake_rows", "coalesce(trace_id, '')", "log_id"),
        lake_fields=("trace_id", "log_id", "hour")),
    # Problems are grouped by the hour they were received in: a new one replaces its hour's, not the instance's.
    "problems": _Kind(
        rows=f"SELECT {_columns('problems', hour=_hour('received_ns'))} FROM problems "
             f"WHERE " + _CHANGED.format(key=f"{_hour('received_ns')}::VARCHAR"),
        key="",
        store_fp=_fp("problems", f"{_hour('received_ns')}::VARCHAR", _PROBLEM_HASH, _hour("received_ns")),
        lake_fp=_fp("lake_rows", "hour::VARCHAR", _PROBLEM_HASH),
        lake_fields=("received_ns", "source", "location", "reason", "spans", "hour")),
    # Violations are grouped by run: checking new runs adds their groups, and replaces no other run's.
    "violations": _Kind(
        rows=f"SELECT * FROM ({_VIOLATIONS_SQL}) WHERE " + _CHANGED.format(key="trajectory_id"),
        key="trajectory_id",
        store_fp=_fp(f"({_VIOLATIONS_SQL})", "trajectory_id", _VIOLATION_HASH),
        lake_fp=_fp("lake_rows", "trajectory_id", _VIOLATION_HASH),
        lake_fields=(*_VIOLATION_HASH.split(", "), "hour")),
    # A certificate's cells are one group (keyed by when it was stored).
    "certificate_cells": _Kind(
        rows=f"SELECT * FROM ({_CELLS_SQL}) WHERE " + _CHANGED.format(key="stored_ns::VARCHAR"),
        key="stored_ns",
        store_fp=_fp(f"({_CELLS_SQL})", "stored_ns::VARCHAR", "stored_ns, spec_hash, cell"),
        lake_fp=_fp("lake_rows", "stored_ns::VARCHAR", "stored_ns, spec_hash, cell"),
        lake_fields=("stored_ns", "spec_hash", "cell", "hour"), key_type=int),
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
    query.pop("catalog", None)  # the catalog's name (`catalog_of`), not the database's
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


def _partition_spec(schema: Any) -> Any:
    """Identity partitions on the committing instance and the hour of the rows (an integer column, readable by any engine)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    return PartitionSpec(
        PartitionField(source_id=schema.find_field("instance").field_id, field_id=1000, transform=IdentityTransform(), name="instance"),
        PartitionField(source_id=schema.find_field("hour").field_id, field_id=1001, transform=IdentityTransform(), name="hour"))


class _RetryCount(logging.Filter):
    """Counts pyiceberg's rebased commits per thread (it logs one warning per retry) and keeps them out of the log."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if "Commit failed due to a concurrent update" in record.getMessage():
            self.local.count = getattr(self.local, "count", 0) + 1
            return False
        return True

    def take(self) -> int:
        count = int(getattr(self.local, "count", 0))
        self.local.count = 0
        return count


_RETRIES = _RetryCount()
logging.getLogger("pyiceberg.table").addFilter(_RETRIES)


class Lake:
    """The table set behind one catalog URI; tables are created on first use (by whichever instance comes first).

    `catalog_name` is the name engines give the catalog (Spark's `spark.sql.catalog.<name>`, DuckDB's ATTACH … AS <name>);
    pyiceberg's SQL catalog keeps it in every row of its `iceberg_tables`, so every engine must use the same one
    (PLUMBLINE_LAKE_CATALOG or ?catalog=NAME in the URI; default `plumbline`).
    """

    def __init__(self, uri: str, catalog_name: str | None = None) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.uri = uri
        catalog_uri, self.warehouse = parse_lake_uri(uri)
        self.catalog_name = catalog_name or catalog_of(uri)
        if catalog_uri.startswith("sqlite:///"):
            Path(catalog_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        if self.warehouse.startswith("file://"):
            Path(self.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        try:
            self.catalog = SqlCatalog(self.catalog_name, uri=catalog_uri, warehouse=self.warehouse)
        except Exception as exc:  # noqa: BLE001 - the driver's own error, named
            raise StoreError(f"--lake {uri}: cannot open the catalog: {exc}") from None
        self._tables: dict[str, Any] = {}
        # Snapshot history a commit keeps (`_trim_history`): the newest `snapshots_kept` of each table, and any younger than
        # `snapshot_age_s`; older ones, when not a reader's, are expired right after a commit (their files left to `maintain`).
        self.snapshots_kept = int(os.environ.get("PLUMBLINE_LAKE_SNAPSHOTS", str(SNAPSHOTS_KEPT)))
        self.snapshot_age_s = float(os.environ.get("PLUMBLINE_LAKE_SNAPSHOT_AGE", str(SNAPSHOT_AGE_S)))
        self._upgraded: set[str] = set()

    @property
    def label(self) -> str:
        """How the lake is named in messages: its URI without credentials."""
        parts = urlsplit(self.uri)
        if parts.password:
            return urlunsplit((parts.scheme, f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else ""),
                               parts.path, parts.query, ""))
        return self.uri

    def table(self, name: str, create: bool = True) -> Any:
        """The Iceberg table `name` (created, partitioned by instance and hour, when absent and `create`); None when absent."""
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
            schema = LAKE_SHAPES[name].iceberg()
            try:
                table = self.catalog.create_table(identifier, schema=schema, partition_spec=_partition_spec(schema),
                                                  properties=_TABLE_PROPERTIES)
            except Exception as exc:  # noqa: BLE001 - TableAlreadyExistsError or the driver's IntegrityError
                try:
                    table = self.catalog.load_table(identifier)
                except NoSuchTableError:
                    raise exc from None
        if "hour" not in {f.name for f in table.schema().fields}:
            raise StoreError(f"lake {self.label}: table {identifier} predates partitioning by hour (plumbline_otel/lake.py); "
                             "sync each instance into a new lake (a sync is a diff: it rebuilds the instance's rows)")
        table = _evolved(table, name)
        self._tables[name] = table
        return table

    def scan(self, name: str, row_filter: Any = None, fields: Iterable[str] = (), snapshot_id: int | None = None) -> pa.Table:
        """Rows of a table (all, or those matching a pyiceberg expression; as of a snapshot), as Arrow; empty when the table is absent."""
        from pyiceberg.expressions import AlwaysTrue

        schema = _ALL_SCHEMAS[name]
        table = self.table(name, create=False)
        wanted = tuple(fields) or tuple(schema.names)
        if table is None:
            return schema.empty_table().select(list(wanted))
        if snapshot_id is None:
            table.refresh()
        found = table.scan(row_filter=row_filter if row_filter is not None else AlwaysTrue(), selected_fields=wanted,
                           snapshot_id=snapshot_id).to_arrow()
        return found.select(list(wanted)).cast(pa.schema([schema.field(n) for n in wanted]))


def catalog_of(uri: str) -> str:
    """The catalog's name: `?catalog=NAME` in the lake URI, else PLUMBLINE_LAKE_CATALOG, else `plumbline`."""
    query = dict(parse_qsl(urlsplit(uri).query)) if "://" in uri else {}
    return query.get("catalog") or os.environ.get("PLUMBLINE_LAKE_CATALOG") or "plumbline"


def _evolved(table: Any, name: str) -> Any:
    """`table` with every column its declaration (`shapes.LAKE_SHAPES`) has and it lacks: a table an older plumbline made.

    Iceberg's schema evolution: each new column is added (optional, at the end, with a fresh field id) in one
    schema update, and rows written before it read it as null; no data file is rewritten. Whoever opens the
    table first adds them (a writer or a reader); two at once are told apart by the catalog's commit check,
    and the loser finds the columns there when it reloads.
    """
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(COMMIT_ATTEMPTS):
        have = {f.name for f in table.schema().fields}
        missing = [c for c in LAKE_SHAPES[name].all_columns if c.name not in have]
        if not missing:
            return table
        try:
            with table.update_schema() as update:
                for column in missing:
                    update.add_column(column.name, iceberg_type(column.type, 0)[0])  # a list's element id is reassigned
        except CommitFailedException:
            time.sleep(random.uniform(0.02, 0.05) * min(2 ** attempt, 20))  # noqa: S311 (jitter, not secrecy)
        table.refresh()
    raise StoreError(f"table {NAMESPACE}.{name}: {COMMIT_ATTEMPTS} schema updates refused for concurrent ones; try again")


INSTANCE_KEY = "lake.instance"  # the store's `meta` row that keeps its name in the lake


def stored_instance(connection: Any) -> str | None:
    """The name this store committed to a lake under, kept in its own `meta` table (None before its first sync)."""
    return meta_value(connection, INSTANCE_KEY)


def resolve_instance(connection: Any, given: str | None, lake: Lake | None = None) -> str:
    """This store's name in the lake: the one kept in the store, so a moved file or a new host is the same instance.

    A store that never synced takes `given` (PLUMBLINE_LAKE_INSTANCE, --instance) or a new name
    (host and a random suffix) and keeps it. A `given` name other than the kept one is refused
    (`plumbline lake rename` moves an instance's rows to a new name). A store whose runs the lake
    already holds under another instance, and none under this name, is refused too: committing it
    would put every run under two instances, and readers would leave them all out as misrouted.
    """
    import uuid

    stored = stored_instance(connection)
    if stored is not None:
        if given and given != stored:
            raise ConfigError(f"this store committed to the lake as instance {stored!r} (kept in the store); it is given {given!r}. "
                              f"Drop the name (or give {stored!r}), or rename it everywhere first: "
                              f"plumbline lake rename --lake URI --from {stored} --to {given} --db FILE")
        return stored
    name = given or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    if lake is not None:
        _refuse_a_second_name(connection, lake, name)
    try:
        set_meta(connection, INSTANCE_KEY, name)
    except duckdb.Error:
        if not given:  # a read-only store cannot keep a name: a new one at every sync would be a new instance each time
            raise ConfigError("this store is read-only and has no lake instance name yet: give one (--instance NAME)") from None
    return name


def _refuse_a_second_name(connection: Any, lake: Lake, name: str) -> None:
    from pyiceberg.expressions import EqualTo, In

    sample = [r[0] for r in connection.execute("SELECT DISTINCT trace_id FROM trajectories ORDER BY hash(trace_id) LIMIT 200").fetchall()]
    if not sample or lake.table("runs", create=False) is None:
        return
    found = lake.scan("runs", In("trace_id", sample), ("instance", "trace_id"))
    if lake.scan("runs", EqualTo("instance", name), ("trace_id",)).num_rows:
        return
    owners: dict[str, set[str]] = {}
    for instance, trace in zip(found["instance"].to_pylist(), found["trace_id"].to_pylist()):
        owners.setdefault(instance, set()).add(trace)
    for instance, traces in sorted(owners.items(), key=lambda kv: -len(kv[1])):
        if instance != name and 2 * len(traces) >= len(sample):
            raise ConfigError(f"lake {lake.label}: {len(traces)} of {len(sample)} sampled runs of this store are already in the lake "
                              f"under instance {instance!r}; committing them as {name!r} would count every run twice (readers would "
                              f"leave them out as misrouted). This store was committed as {instance!r} before (a moved file, a new "
                              f"host, or a changed PLUMBLINE_LAKE_INSTANCE?): give --instance {instance} (PLUMBLINE_LAKE_INSTANCE) and "
                              f"it is kept in the store from then on, or rename: plumbline lake rename --from {instance} --to {name}")


@dataclass
class SyncResult:
    """What one sync committed: per table, groups replaced and rows written; commits rebased or redone after a conflict."""

    instance: str = ""
    groups: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    seconds: float = 0.0
    started_ns: int = 0  # the store as of this moment is what the lake holds after the sync
    commits: int = 0  # Iceberg snapshots committed (one per table changed and batch, and the watermark)
    files_added: int = 0  # data files the commits added (new rows, and the rewrites of files that held a deleted row)
    files_removed: int = 0  # data files the commits replaced: only files of this instance's partitions that held a deleted row
    expired: int = 0  # old snapshots the commits expired from their tables' metadata (`_trim_history`)

    @property
    def changed(self) -> bool:
        return any(self.groups.values())

    def as_dict(self) -> dict[str, Any]:
        return {"groups": self.groups, "rows": self.rows, "retries": self.retries, "seconds": round(self.seconds, 3), "commits": self.commits,
                "files_added": self.files_added, "files_removed": self.files_removed, "expired": self.expired}


class LakeSink:
    """One instance's commits to the lake. `sync(connection)` makes the lake's rows of this instance equal its store's.

    `instance` is the name asked for (None: the one kept in the store, or a new one); the name used is
    resolved against the store at the first sync (`resolve_instance`).
    """

    def __init__(self, lake: Lake, instance: str | None = None, batch_rows: int = BATCH_ROWS,
                 before_commit: Callable[[str], None] | None = None) -> None:
        self.lake, self.given, self.batch_rows = lake, instance or None, batch_rows
        self.instance = instance or ""
        self._resolved = False
        self._before_commit = before_commit  # tests: called with the table name before each commit
        self._lake_fp: dict[str, pa.Table] = {}  # what this instance's rows in the lake hash to, per table (dropped on any error)
        self._marks: dict[str, int | None] = {}  # per table, a snapshot holding this instance's rows as the lake fingerprint says
        self._written: dict[str, int | None] | None = None  # the marks of the last watermark written

    def _lake_groups(self, name: str, connection: Any) -> pa.Table:
        if name not in self._lake_fp:
            from pyiceberg.expressions import EqualTo

            table = self.lake.table(name, create=False)
            snapshot = None
            if table is not None:
                if name not in self.lake._upgraded:
                    _upgrade(self.lake, name, table)  # a table an older plumbline made: brought up to date once
                table.refresh()
                current = table.current_snapshot()
                snapshot = current.snapshot_id if current is not None else None
            rows = (self.lake.scan(name, EqualTo("instance", self.instance), _KINDS[name].lake_fields, snapshot_id=snapshot)
                    if snapshot is not None else SCHEMAS[name].empty_table().select(list(_KINDS[name].lake_fields)))
            with _registered(connection, lake_rows=rows):
                self._lake_fp[name] = connection.sql(_KINDS[name].lake_fp).to_arrow_table()
            self._marks[name] = snapshot
        return self._lake_fp[name]

    def sync(self, connection: Any) -> SyncResult:
        """Commit what changed in the store behind `connection` (a DuckDB connection or cursor of a store) since the lake last saw it.

        Reads the store in one transaction (a consistent snapshot while a writer goes on). Idempotent:
        a second sync with nothing new commits nothing. When every table is committed, a watermark row
        (`syncs`) names the snapshot of each table that holds this sync: readers read the instance as of
        it, so a sync killed between tables is never half seen.
        """
        started = time.monotonic()
        result = SyncResult(started_ns=time.time_ns())
        _RETRIES.take()
        cursor = connection.cursor()
        try:
            if not self._resolved:
                self.instance = resolve_instance(cursor, self.given, self.lake)
                self._resolved = True
            result.instance = self.instance
            cursor.execute("BEGIN TRANSACTION")
            for name in TABLES:
                try:
                    self._sync_table(name, cursor, result)
                except BaseException:
                    self._lake_fp.pop(name, None)  # read again from the lake next time
                    self._marks.pop(name, None)
                    raise
            if self._written is None:
                self._written = self._last_watermark()
            if self._marks != self._written:
                self._write_watermark(result)
            cursor.execute("COMMIT")
        finally:
            cursor.close()
            result.retries += _RETRIES.take()
        result.seconds = time.monotonic() - started
        return result

    def _last_watermark(self) -> dict[str, int | None] | None:
        from pyiceberg.expressions import EqualTo

        found = self.lake.scan(SYNCS, EqualTo("instance", self.instance), ("sync_ns", "snapshots"))
        if not found.num_rows:
            return None
        latest = max(zip(found["sync_ns"].to_pylist(), found["snapshots"].to_pylist()))
        return {k: v for k, v in json.loads(latest[1]).items()}

    def _write_watermark(self, result: SyncResult) -> None:
        """Append this sync's watermark: appends never conflict, so a refused one is rebased by pyiceberg."""
        now = time.time_ns()
        rows = pa.table({"instance": [self.instance], "sync_ns": [now], "snapshots": [json.dumps(self._marks, sort_keys=True)],
                         "rows": [sum(result.rows.values())], "hour": [now // HOUR_NS]}).cast(SYNCS_SCHEMA)
        self._commit(SYNCS, None, rows, result)
        self._written = dict(self._marks)

    def _sync_table(self, name: str, cursor: Any, result: SyncResult) -> None:
        kind = _KINDS[name]
        lake_fp = self._lake_groups(name, cursor)
        store_fp = cursor.sql(kind.store_fp).to_arrow_table()
        with _registered(cursor, lake_fp=lake_fp, store_fp=store_fp):
            diff = cursor.execute(
                "SELECT coalesce(s.key, l.key) AS key, coalesce(l.hours, []) AS hours FROM store_fp s FULL JOIN lake_fp l ON s.key = l.key "
                "WHERE s.n IS DISTINCT FROM l.n OR s.fp IS DISTINCT FROM l.fp ORDER BY 1").fetchall()
        result.groups[name], result.rows[name] = len(diff), 0
        if not diff:
            return
        # Batches of groups about `batch_rows` rows each (by the store's counts), each one transaction.
        sizes = dict(zip(store_fp["key"].to_pylist(), store_fp["n"].to_pylist())) if len(diff) > 1 else {}
        batch: list[tuple[str, list[int]]] = []
        rows = 0
        for key, hours in diff:
            batch.append((key, [int(h) for h in hours]))
            rows += int(sizes.get(key, 0))
            if rows >= self.batch_rows:
                result.rows[name] += self._commit_groups(name, batch, cursor, result)
                batch, rows = [], 0
        if batch:
            result.rows[name] += self._commit_groups(name, batch, cursor, result)
        # The lake now holds the store's groups: its fingerprint is the store's.
        self._lake_fp[name] = store_fp

    def _commit_groups(self, name: str, groups: list[tuple[str, list[int]]], cursor: Any, result: SyncResult) -> int:
        from pyiceberg.expressions import And, EqualTo, In, IsNull, Or

        kind = _KINDS[name]
        with _registered(cursor, changed=pa.table({"key": pa.array([k for k, _ in groups], pa.string())})):
            found = cursor.sql(kind.rows).to_arrow_table()
        rows = pa.table({"instance": pa.array([self.instance] * found.num_rows, pa.string()),
                         **{n: found[n] for n in found.column_names}}).cast(SCHEMAS[name])
        stale = [(k, hours) for k, hours in groups if hours]
        delete: Any = None
        if stale:
            # The hours the lake holds these groups in: files of other hours are not even read.
            hours = sorted({h for _, hs in stale for h in hs})
            delete = And(EqualTo("instance", self.instance), In("hour", hours) if len(hours) > 1 else EqualTo("hour", hours[0]))
            if kind.key:
                keyed = [kind.key_type(k) for k, _ in stale if k]
                clause: Any = In(kind.key, keyed) if keyed else None
                if any(not k for k, _ in stale):  # records of no trace (logs)
                    clause = Or(clause, IsNull(kind.key)) if clause is not None else IsNull(kind.key)
                delete = And(delete, clause)
        self._commit(name, delete, rows, result)
        return int(rows.num_rows)

    def _commit(self, name: str, delete: Any, rows: pa.Table, result: SyncResult) -> None:
        """Delete, then append, as one Iceberg snapshot touching this instance's partitions and manifests only (`_stage`).

        With a Postgres catalog, commits to one table take turns under a per-table advisory lock
        (`_commit_lock`) rather than refuse each other and back off: a commit that deletes holds it
        from reading the table to the catalog's compare-and-swap; an append-only one writes its data
        files first and holds it for the rebase on the newest table (its data files kept, its
        manifests rewritten) and the catalog update. One refused for a conflict (maintenance compacted
        these files meanwhile), or refused past pyiceberg's own retries (a writer that takes no lock),
        is redone whole on a refreshed table after a fully jittered backoff.
        """
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        properties = {"plumbline.instance": self.instance}
        for attempt in range(COMMIT_ATTEMPTS):
            table = self.lake.table(name)
            try:
                # A commit that deletes takes the table's lock before it reads the table: no commit lands between the table it
                # reads and its own, so pyiceberg has none to check it against (that check reads every manifest the commits in
                # between added: it grew with instances and with the wait). An append-only one is written first and rebased.
                if name not in self.lake._upgraded:
                    _upgrade(self.lake, name, table)
                with _commit_lock(self.lake, name) if delete is not None else nullcontext(False) as early:
                    # Always from the table as it is now: the copy kept since this instance's last commit is an interval old, and
                    # a commit based on it is refused whenever any other instance committed since (nearly always, with many).
                    table.refresh()
                    tx = _transaction(table)
                    staged = _stage(tx, table, delete, rows, properties, self.instance)
                    if staged is not None:
                        if self._before_commit is not None:
                            self._before_commit(name)
                        # commits to one table take turns here instead of refusing each other
                        with nullcontext(True) if early else _commit_lock(self.lake, name) as locked:
                            if locked and not early:
                                _rebase(tx, table)
                            tx.commit_transaction()
                if staged is not None:
                    snapshot = table.metadata.snapshot_by_id(staged)
                    summary = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary is not None else {}
                    result.files_added += int(summary.get("added-data-files", 0))
                    result.files_removed += int(summary.get("deleted-data-files", 0))
                    result.commits += 1
                current = table.current_snapshot()
                self._marks[name] = current.snapshot_id if current is not None else None
                if staged is not None:
                    result.expired += _trim_history(self.lake, name, table)
                return
            except (CommitFailedException, ValidationException):
                result.retries += 1
                time.sleep(random.uniform(0.0, min(0.05 * 2 ** attempt, 5.0)))  # noqa: S311 (full jitter, not secrecy)
        raise StoreError(f"lake {self.lake.label}: table {name}: {COMMIT_ATTEMPTS} commits refused for concurrent ones; try again")


@contextmanager
def _commit_lock(lake: Lake, name: str) -> Iterator[bool]:
    """With a Postgres catalog, a session advisory lock per table held while a commit is made (other catalogs: none).

    Iceberg's commit is optimistic: of the commits to one table under way at once, one wins and the
    others are refused, sleep, rebase and try again, and under load (many instances, or a busy host
    that stretches each commit) they are refused again, which is what made a sync's p95 minutes
    (docs/operating.md, sizing). Holding this lock from the rebase to the catalog's update makes
    them take turns instead. The lock is the database's: a committer that dies releases it with
    its connection; engines that do not take it still commit optimistically, as before.
    """
    import zlib

    engine = getattr(lake.catalog, "engine", None)
    if engine is None or engine.dialect.name != "postgresql":
        yield False
        return
    from sqlalchemy import text

    key = zlib.crc32(f"plumbline-lake-commit/{lake.catalog_name}/{NAMESPACE}.{name}".encode())
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        try:
            yield True
        finally:
            try:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                connection.commit()
            except Exception:  # noqa: BLE001 - a connection that may still hold the lock is not put back in the pool
                connection.invalidate()


def _transaction(table: Any) -> Any:
    """A pyiceberg transaction on `table` that computes its metadata once per change, not at every look.

    pyiceberg's `Transaction.table_metadata` applies the staged updates to the table's metadata and
    deep-copies the result each time it is read, and a commit reads it a score of times: each copy
    holds every snapshot the table keeps, so a commit cost grew with the snapshots made since the
    last maintenance (0.06 s of CPU after 5 commits, 0.9 s after 150, on this machine). The metadata
    models are never changed in place (pyiceberg makes new ones), so one copy per (metadata, updates)
    is kept and given out.
    """
    if "transaction" not in _PRODUCERS:
        from pyiceberg.table import Transaction
        from pyiceberg.table.update import update_table_metadata

        class _Transaction(Transaction):  # type: ignore[misc]  # pyiceberg is untyped for mypy here (pyproject)
            _memo: tuple[Any, Any, Any] | None = None

            @property
            def table_metadata(self) -> Any:
                memo = self._memo
                if memo is None or memo[0] is not self._table.metadata or memo[1] is not self._updates:
                    memo = (self._table.metadata, self._updates, update_table_metadata(self._table.metadata, self._updates))
                    self._memo = memo
                return memo[2]

        _PRODUCERS["transaction"] = _Transaction
    return _PRODUCERS["transaction"](table)


def _rebase(tx: Any, table: Any) -> None:
    """Rebase a staged transaction on the table as it is now (under the commit lock), as pyiceberg does after a refusal.

    Its data files are kept; its manifests are rebuilt on the newest snapshot after pyiceberg checks that the
    commits since touched none of its rows (a ValidationException when they did, and the commit is redone).
    """
    before = table.metadata.current_snapshot_id
    table.refresh()
    if table.metadata.current_snapshot_id != before and tx._snapshot_producers:
        tx._rebuild_snapshot_updates()


def _latest_watermarks(lake: Lake) -> dict[str, dict[str, int | None]]:
    """Each instance's latest watermark: the snapshot of each table that holds its last complete sync."""
    found = lake.scan(SYNCS, fields=("instance", "sync_ns", "snapshots")) if lake.table(SYNCS, create=False) is not None else None
    latest: dict[str, tuple[int, str]] = {}
    if found is not None:
        for instance, at, text in zip(found["instance"].to_pylist(), found["sync_ns"].to_pylist(), found["snapshots"].to_pylist()):
            if instance not in latest or at > latest[instance][0]:
                latest[instance] = (at, text)
    return {instance: json.loads(text) for instance, (_, text) in latest.items()}


def _trim_history(lake: Lake, name: str, table: Any) -> int:
    """Expire a table's old snapshots right after a commit, so its metadata file (read and rewritten by every commit) stays bounded.

    Runs once TRIM_SLACK snapshots more than `lake.snapshots_kept` have accumulated (so its cost, a read of the
    watermarks, is spread over that many commits), under the table's commit lock. Kept: the newest
    `snapshots_kept`, any younger than `lake.snapshot_age_s`, the current one, and what readers need (each
    instance's watermark snapshot and its commits after it, as `maintain` keeps; the watermarks table's own
    history is not read by anyone). Only the snapshots leave the metadata: no file is deleted here. A file only
    expired snapshots held is deleted by `lake maintain` (as an orphan, past its grace), the existing safe path.
    A refused expiry is left to the next commit. Returns how many snapshots were expired.
    """
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    kept = lake.snapshots_kept
    if kept <= 0 or len(table.metadata.snapshots) <= kept + TRIM_SLACK:
        return 0
    marks = _latest_watermarks(lake) if name != SYNCS else {}
    try:
        with _commit_lock(lake, name):
            table.refresh()
            snapshots = sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
            current = table.metadata.current_snapshot_id
            young_ms = int((time.time() - lake.snapshot_age_s) * 1000)
            keep = _protected(table, name, marks) if name != SYNCS else set()
            old = [s.snapshot_id for s in snapshots[:-kept] if s.snapshot_id != current and s.snapshot_id not in keep
                   and s.timestamp_ms < young_ms]
            if not old:
                return 0
            table.maintenance.expire_snapshots().by_ids(old).commit()
            return len(old)
    except (CommitFailedException, ValidationException):
        return 0


def _upgrade(lake: Lake, name: str, table: Any) -> None:
    """A table an older plumbline made: its properties brought up to `_TABLE_PROPERTIES` and its manifests regrouped per instance, once.

    Such a table has pyiceberg's manifest merge on (`commit.manifest-merge.enabled=true`), so its manifests
    mix instances and every commit of every instance read and rewrote them. The properties it lacks are set
    (those an operator set are left as they are) and merge is turned off; then one snapshot that adds and
    removes nothing rewrites each manifest holding several instances' files as one manifest per instance
    (`_regroup`), after which each instance's commits read and merge their own only. Under the table's commit
    lock, and checked again after it is taken: of instances opening the table at once, one does it.
    """
    lake._upgraded.add(name)
    wanted = {k: v for k, v in _TABLE_PROPERTIES.items() if k not in table.properties}
    if table.properties.get("commit.manifest-merge.enabled", "false").lower() != "false":
        wanted["commit.manifest-merge.enabled"] = "false"
    if not wanted and not _mixed_manifests(table):
        return
    with _commit_lock(lake, name):
        table.refresh()
        wanted = {k: v for k, v in _TABLE_PROPERTIES.items() if k not in table.properties}
        if table.properties.get("commit.manifest-merge.enabled", "false").lower() != "false":
            wanted["commit.manifest-merge.enabled"] = "false"
        if wanted:
            with table.transaction() as tx:
                tx.set_properties(wanted)
            table.refresh()
        if _mixed_manifests(table):
            _regroup(table)
            table.refresh()


def _owner(manifest: Any) -> str | None:
    """The instance all of a manifest's files are of (the `instance` partition field's bounds in the manifest list); None: several."""
    parts = manifest.partitions or []
    if not parts or parts[0].lower_bound is None or parts[0].lower_bound != parts[0].upper_bound:
        return None
    return bytes(parts[0].lower_bound).decode("utf-8", "replace")


def _mixed_manifests(table: Any) -> int:
    from pyiceberg.manifest import ManifestContent

    current = table.current_snapshot()
    if current is None:
        return 0
    return sum(1 for m in current.manifests(table.io) if m.content == ManifestContent.DATA and m.existing_files_count is not None
               and (m.added_files_count or 0) + (m.existing_files_count or 0) > 0 and _owner(m) is None)


def _regroup(table: Any) -> None:
    """Commit one snapshot (no file added or removed) whose manifests each hold one instance's files."""
    from pyiceberg.manifest import ManifestContent
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _MergeAppendFiles

    def split(self: Any, manifests: list[Any]) -> list[Any]:
        out: list[Any] = []
        for manifest in manifests:
            if manifest.content != ManifestContent.DATA or _owner(manifest) is not None:
                out.append(manifest)
                continue
            by_instance: dict[Any, list[Any]] = {}
            for entry in self.fetch_manifest_entry(manifest=manifest, discard_deleted=True):
                by_instance.setdefault(entry.data_file.partition[0], []).append(entry)
            for entries in by_instance.values():
                with self.new_manifest_writer(spec=self.spec(manifest.partition_spec_id)) as writer:
                    for entry in entries:
                        writer.existing(entry)
                out.append(writer.to_manifest_file())
        return out

    producer_cls = type("_Regroup", (_MergeAppendFiles,), {"_process_manifests": split})
    with _transaction(table) as tx:
        with producer_cls(operation=Operation.APPEND, transaction=tx, io=table.io,
                          snapshot_properties={"plumbline.maintenance": "regroup-manifests"}):
            pass


# Between maintenances each instance's data manifests are merged into one once it has this many (its commits add one each):
# a table holds about this many manifests per instance, and a commit reads and rewrites its own instance's only.
MANIFESTS_PER_INSTANCE = 4
_PRODUCERS: dict[str, Any] = {}


def _producers() -> tuple[Any, Any]:
    """pyiceberg's append and overwrite snapshot producers, merging manifests per instance instead of across the table.

    pyiceberg's own merge (commit.manifest-merge.enabled) packs every instance's manifests into one, so
    every later commit of every instance reads it and a delete rewrites it: a commit would cost what the
    whole table holds. Here a manifest belongs to the instance its partitions are all of (the
    `instance` field's bounds in the manifest list), and only the committing instance's are merged.
    """
    if "append" not in _PRODUCERS:
        from pyiceberg.manifest import ManifestContent
        from pyiceberg.table.update.snapshot import _ManifestMergeManager, _MergeAppendFiles, _OverwriteFiles

        owner = _owner

        def per_instance(self: Any, manifests: list[Any]) -> list[Any]:
            data = [m for m in manifests if m.content == ManifestContent.DATA]
            rest = [m for m in manifests if m.content != ManifestContent.DATA]
            mine = [m for m in data if owner(m) == self.plumbline_instance]
            if len(mine) < MANIFESTS_PER_INSTANCE or len({m.partition_spec_id for m in mine}) != 1:
                return manifests
            merger = _ManifestMergeManager(target_size_bytes=0, min_count_to_merge=0, merge_enabled=True, snapshot_producer=self)
            merged = merger._create_manifest(mine[0].partition_spec_id, mine)
            return [merged, *(m for m in data if owner(m) != self.plumbline_instance), *rest]

        _PRODUCERS["append"] = type("_InstanceAppend", (_MergeAppendFiles,), {"_process_manifests": per_instance})
        _PRODUCERS["overwrite"] = type("_InstanceOverwrite", (_OverwriteFiles,), {"_process_manifests": per_instance})
    return _PRODUCERS["append"], _PRODUCERS["overwrite"]


# A commit's new rows are one small file per partition; once the partition it appends to holds this many files smaller than
# SMALL_FILE_BYTES, the commit rewrites them as one (its own partition's small files only): an hour still receiving commits
# keeps a few files, not one per commit, so what a later commit reads grows with what it changes, not with the hour's commits.
SMALL_FILES_PER_PARTITION = 8
SMALL_FILE_BYTES = 16 * 1024 * 1024


def _stage(tx: Any, table: Any, delete: Any, rows: pa.Table, properties: dict[str, str], instance: str) -> int | None:
    """Stage in `tx` one snapshot that deletes the rows matching `delete` and appends `rows`; its id (None: nothing to do).

    Copy-on-write, as pyiceberg's delete, but as one snapshot rather than up to three (a delete, an
    overwrite of the files it rewrote, an append): the files of the instance's partitions that hold a
    deleted row are read, and rewritten without it (dropped when nothing is left); files without one
    are not read (pruned by partition and column bounds) nor rewritten. The small files of the
    partitions `rows` go to are merged once there are SMALL_FILES_PER_PARTITION of them. The
    snapshot's manifests are merged per instance (`_producers`).
    """
    import itertools

    from pyiceberg.expressions import AlwaysTrue, And, EqualTo, In
    from pyiceberg.expressions.visitors import bind
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files, _expression_to_complementary_pyarrow
    from pyiceberg.table.snapshots import Operation

    append_cls, overwrite_cls = _producers()
    metadata, io = tx.table_metadata, table.io
    counter = itertools.count(0)

    def read(tasks: list[Any]) -> pa.Table:
        return ArrowScan(table_metadata=metadata, io=io, projected_schema=metadata.schema(), row_filter=AlwaysTrue()).to_table(tasks=tasks)

    rewritten: list[tuple[Any, pa.Table | None]] = []
    if delete is not None and metadata.current_snapshot() is not None:
        keep = _expression_to_complementary_pyarrow(bind(metadata.schema(), delete, True), metadata.schema())
        for task in tx._scan(row_filter=delete).plan_files():
            found = read([task])
            kept = found.filter(keep)
            if len(kept) != len(found):
                rewritten.append((task.file, kept if len(kept) else None))
    merged: list[Any] = []  # small files of the partitions `rows` go to, rewritten as one
    landing: Any = None
    if rows.num_rows and instance and "hour" in rows.column_names and metadata.current_snapshot() is not None:
        hours = [h for h in pc.unique(rows["hour"]).to_pylist() if h is not None]
        if hours:
            landing = And(EqualTo("instance", instance), In("hour", hours) if len(hours) > 1 else EqualTo("hour", hours[0]))
            gone = {f.file_path for f, _ in rewritten}
            small: dict[Any, list[Any]] = {}
            for task in tx._scan(row_filter=landing).plan_files():
                if task.file.file_size_in_bytes < SMALL_FILE_BYTES and task.file.file_path not in gone:
                    small.setdefault(task.file.partition, []).append(task)
            merged = [t for tasks in small.values() if len(tasks) + 1 >= SMALL_FILES_PER_PARTITION for t in tasks]
    if not rewritten and not merged and not rows.num_rows:
        return None
    producer = (overwrite_cls(operation=Operation.OVERWRITE, transaction=tx, io=io, snapshot_properties=properties) if rewritten or merged
                else append_cls(operation=Operation.APPEND, transaction=tx, io=io, snapshot_properties=properties))
    producer.plumbline_instance = instance
    with producer:
        # the conflict check (a concurrent commit that added or removed rows here): this instance's partitions only
        if rewritten:
            producer.delete_by_predicate(delete)
        if merged:
            producer.delete_by_predicate(landing)
        writes = [kept for _, kept in rewritten if kept is not None]
        for old, _ in rewritten:
            producer.delete_data_file(old)
        if merged:
            writes.append(read(merged))
            for task in merged:
                producer.delete_data_file(task.file)
        if rows.num_rows:
            writes.append(rows)
        for part in writes:
            for data_file in _dataframe_to_data_files(table_metadata=metadata, df=part, io=io, write_uuid=producer.commit_uuid, counter=counter):
                producer.append_data_file(data_file)
    return int(producer.snapshot_id)


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


def watermarks(lake: Lake) -> dict[str, dict[str, int | None]] | None:
    """Each instance's last complete sync: the snapshot of each table that holds it (None: a lake without watermarks)."""
    if lake.table(SYNCS, create=False) is None:
        return None
    found = lake.scan(SYNCS, fields=("instance", "sync_ns", "snapshots"))
    latest: dict[str, tuple[int, str]] = {}
    for instance, at, marks in zip(found["instance"].to_pylist(), found["sync_ns"].to_pylist(), found["snapshots"].to_pylist()):
        if instance not in latest or at > latest[instance][0]:
            latest[instance] = (at, marks)
    return {instance: json.loads(marks) for instance, (_, marks) in latest.items()}


class LakeReader:
    """The lake read as one store (for `Sources`): each instance as of its last complete sync.

    An instance's rows are read from the current snapshot of a table unless the instance committed
    to that table after its last watermark (a sync under way, or killed between tables): then they
    are read as of the watermark's snapshot. An instance that never completed a sync is not read.
    """

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._marks: dict[str, dict[str, int | None]] | None = None
        self._loaded = False
        self.unsynced: list[str] = []  # instances with rows but no complete sync (left out)

    def marks(self) -> dict[str, dict[str, int | None]] | None:
        if not self._loaded:
            self._marks, self._loaded = watermarks(self.lake), True
        return self._marks

    def scan(self, name: str, row_filter: Any = None, fields: Iterable[str] = ()) -> pa.Table:
        """`Lake.scan` of the instances' synced rows (the `instance` column among `fields` when fields are given)."""
        from pyiceberg.expressions import And, EqualTo

        wanted = tuple(fields) or tuple(SCHEMAS[name].names)
        columns = wanted if "instance" in wanted else ("instance", *wanted)
        table = self.lake.table(name, create=False)
        marks = self.marks()
        if table is None or marks is None:
            return self.lake.scan(name, row_filter, columns).select(list(wanted))
        table.refresh()
        current = table.current_snapshot()
        if current is None:
            return self.lake.scan(name, row_filter, columns).select(list(wanted))
        by_id = {s.snapshot_id: s for s in table.snapshots()}
        late = _last_commits(table)  # instance -> the sequence number of its last commit to this table
        behind: dict[str, int | None] = {}
        for instance, mine in marks.items():
            mark = mine.get(name)
            seen = by_id.get(mark) if mark is not None else None
            if mark is not None and seen is None:
                logging.getLogger("plumbline.lake").warning("lake %s: %s's watermark snapshot of %s is expired; read as current",
                                                            self.lake.label, instance, name)
                continue
            if late.get(instance, -1) > ((seen.sequence_number or 0) if seen is not None else -1):
                behind[instance] = mark
        found = self.lake.scan(name, row_filter, columns, snapshot_id=current.snapshot_id)
        keep = pa.array(sorted(set(marks) - set(behind)), pa.string())
        parts = [found.filter(pc.is_in(found["instance"], value_set=keep))]
        for instance, mark in sorted(behind.items()):
            if mark is not None:
                mine = EqualTo("instance", instance)
                parts.append(self.lake.scan(name, And(row_filter, mine) if row_filter is not None else mine, columns, snapshot_id=mark))
        self.unsynced = sorted(set(found["instance"].unique().to_pylist()) - set(marks))
        return pa.concat_tables(parts).select(list(wanted))

    def trace_ids_by_instance(self) -> dict[str, list[str]]:
        """Each instance's trace ids (from the spans table): a trace under two instances was misrouted."""
        found = self.scan("spans", fields=("instance", "trace_id"))
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
                # a misrouted trace's run is under two instances: one copy is kept (readers leave it out anyway)
                store.insert_rows(target, self.scan(name, (row_filter or {}).get(name)).drop_columns(["instance", "hour"]))
        except BaseException:
            store.close()
            raise
        return store

    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     where: str | None = None, runs: RunFilter | None = None) -> Iterator[Trajectory]:
        """The lake's runs in start order, of `runs` when given (filters on columns pushed into the scan; `where` is SQL
        over the trajectories table, `Reader.trajectories`')."""
        from pyiceberg.expressions import AlwaysTrue, And, EqualTo, GreaterThanOrEqual, In

        condition: Any = AlwaysTrue()
        trace = runs.trace_id if runs is not None else None
        for column, value in (("service", service), ("task_key", task), ("trace_id", trace)):
            if value is not None:
                condition = And(condition, EqualTo(column, value))
        if since_ns is not None:
            condition = And(condition, GreaterThanOrEqual("start_ns", since_ns))
        if runs is not None and runs.run_ids is not None:
            condition = And(condition, In("trajectory_id", list(runs.run_ids)))
        with self.memory_store(("runs",), {"runs": condition}) as store:
            yield from store.trajectories(service=service, task=task, since_ns=since_ns, where=where, runs=runs)


# --- maintenance -----------------------------------------------------------------------------------


def maintain(lake: Lake, older_than_s: float = 3600.0, compact: bool = True, tables: Iterable[str] = (*TABLES, SYNCS),
             settle_s: float = 3600.0, orphan_grace_s: float = 3600.0) -> dict[str, Any]:
    """Compact settled partitions, expire old snapshots, and delete the files no live snapshot needs; say what was freed.

    Compaction rewrites each (instance, hour) partition of more than one file whose hour
    began `settle_s` ago as one file sorted by its group key (so a late change to an old run reads and
    rewrites one small file, found by its key's bounds), in one transaction per partition, redone
    when the instance commits to that partition meanwhile; the hours still receiving late spans keep
    their small files, so a late span rewrites little. The watermarks' older rows go too.

    A table an older plumbline made (pyiceberg's manifest merge on) gets the current table properties and its
    manifests regrouped one per instance first (`_upgrade`; a sync does it too, at its first commit to the table).
    Commits expire old snapshots themselves (`_trim_history`); the files only those held are deleted here, as orphans.
    Expiring keeps the current snapshot, each instance's watermark snapshot and whatever an
    instance committed after it (readers need them to read an unfinished sync as of the watermark).
    Then files are deleted: those only expired snapshots referenced (no commit can need them: a
    commit starts from the current snapshot), and files no snapshot ever referenced (a killed
    commit's) once older than `orphan_grace_s` (younger ones may belong to a commit under way).
    """
    out: dict[str, Any] = {}
    before: dict[str, int] = {}
    compacted: dict[str, int] = {}
    for name in tables:
        table = lake.table(name, create=False)
        if table is not None and name not in lake._upgraded:
            _upgrade(lake, name, table)  # a table an older plumbline made: merge off, manifests regrouped per instance
        if table is not None and name != SYNCS:
            table.refresh()
            before[name] = _data_files(table)
            compacted[name] = _compact(table, name, settle_s) if compact else 0
    marks = _advance_watermarks(lake)
    for name in tables:
        table = lake.table(name, create=False)
        if table is None:
            continue
        table.refresh()
        if name == SYNCS:
            before[name] = _data_files(table)
            compacted[name] = _prune_watermarks(table) if compact else 0
            table.refresh()
        files_before = before[name]
        reachable_before = _reachable(table)
        current = table.current_snapshot()
        cutoff_ms = int((time.time() - older_than_s) * 1000)
        keep = _protected(table, name, marks)
        old = [s.snapshot_id for s in table.snapshots() if s.timestamp_ms < cutoff_ms and s.snapshot_id not in keep
               and (current is None or s.snapshot_id != current.snapshot_id)]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        table.refresh()
        reachable_after = _reachable(table)
        freed = _delete(table, sorted(reachable_before - reachable_after))
        orphans = _delete(table, _orphans(table, reachable_before | reachable_after, orphan_grace_s))
        out[name] = {"data_files_before": files_before, "data_files_after": _data_files(table), "partitions_compacted": compacted[name],
                     "snapshots_expired": len(old), "snapshots": len(table.snapshots()),
                     "files_deleted": freed[0], "bytes_freed": freed[1], "orphan_files_deleted": orphans[0], "orphan_bytes_freed": orphans[1]}
    out["total"] = {"files_deleted": sum(t["files_deleted"] + t["orphan_files_deleted"] for t in out.values()),
                    "bytes_freed": sum(t["bytes_freed"] + t["orphan_bytes_freed"] for t in out.values())}
    return out


def _advance_watermarks(lake: Lake) -> dict[str, dict[str, int | None]]:
    """Move each instance's watermark of a table it has not committed to since up to the table's current snapshot.

    Its rows there are the same (compaction keeps rows), so readers see nothing change, and the older
    snapshots (with the files compaction replaced) can be expired. The new row is dated just after the
    instance's own latest, so a sync of the instance finishing meanwhile supersedes it.
    """
    found = lake.scan(SYNCS, fields=("instance", "sync_ns", "snapshots")) if lake.table(SYNCS, create=False) is not None else None
    if found is None or not found.num_rows:
        return {}
    latest: dict[str, tuple[int, dict[str, int | None]]] = {}
    for instance, at, text in zip(found["instance"].to_pylist(), found["sync_ns"].to_pylist(), found["snapshots"].to_pylist()):
        if instance not in latest or at > latest[instance][0]:
            latest[instance] = (at, json.loads(text))
    moved = {instance: dict(mine) for instance, (_, mine) in latest.items()}
    for name in TABLES:
        table = lake.table(name, create=False)
        if table is None:
            continue
        table.refresh()
        current = table.current_snapshot()
        if current is None:
            continue
        seq = {s.snapshot_id: s.sequence_number or 0 for s in table.snapshots()}
        last = _last_commits(table)
        for instance, mine in moved.items():
            mark = mine.get(name)
            if mark is not None and mark not in seq:
                continue
            if last.get(instance, -1) <= (seq[mark] if mark is not None else -1):
                mine[name] = current.snapshot_id
    rows = [(i, latest[i][0] + 1, json.dumps(m, sort_keys=True)) for i, m in sorted(moved.items()) if m != latest[i][1]]
    if rows:
        now = time.time_ns()
        table = pa.table({"instance": [r[0] for r in rows], "sync_ns": [r[1] for r in rows], "snapshots": [r[2] for r in rows],
                          "rows": [0] * len(rows), "hour": [now // HOUR_NS] * len(rows)}).cast(SYNCS_SCHEMA)
        lake.table(SYNCS).append(table, snapshot_properties={"plumbline.maintenance": "watermarks"})
    return moved


def _last_commits(table: Any) -> dict[str, int]:
    """Each instance's last commit to a table, as a sequence number."""
    last: dict[str, int] = {}
    for snap in table.snapshots():
        who = (snap.summary.additional_properties if snap.summary is not None else {}).get("plumbline.instance")
        if who:
            last[who] = max(last.get(who, -1), snap.sequence_number or 0)
    return last


def _compact(table: Any, name: str, settle_s: float) -> int:
    from pyiceberg.exceptions import CommitFailedException, ValidationException
    from pyiceberg.expressions import And, EqualTo

    if table.current_snapshot() is None:
        return 0
    files = table.inspect.files().select(["partition"]).to_pylist()
    counts: dict[tuple[str, int], int] = {}
    for f in files:
        part = (f["partition"]["instance"], f["partition"]["hour"])
        counts[part] = counts.get(part, 0) + 1
    settled_ns = time.time_ns() - int(settle_s * 1e9)  # an hour that began before this gets no late spans any more
    key = _KINDS[name].key or "received_ns" if name in _KINDS else "instance"
    done = 0
    for (instance, hour), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] if kv[0][1] is not None else -1)):
        if n < 2 or hour is None or hour * HOUR_NS > settled_ns:
            continue
        where = And(EqualTo("instance", instance), EqualTo("hour", hour))
        for attempt in range(COMMIT_ATTEMPTS):
            table.refresh()
            rows = table.scan(row_filter=where).to_arrow().cast(SCHEMAS[name]).sort_by(key)
            try:
                with _transaction(table) as tx:  # one snapshot, its manifests merged per instance, as a sync's commit
                    _stage(tx, table, where, rows, {"plumbline.maintenance": "compact"}, instance)
                done += 1
                break
            except (CommitFailedException, ValidationException):
                time.sleep(random.uniform(0.02, 0.05) * min(2 ** attempt, 20))  # noqa: S311
    return done


def _prune_watermarks(table: Any) -> int:
    """Keep each instance's latest watermark row only (readers take the latest; older ones are history)."""
    from pyiceberg.expressions import And, EqualTo, LessThan

    if table.current_snapshot() is None:
        return 0
    found = table.scan(selected_fields=("instance", "sync_ns")).to_arrow()
    latest: dict[str, int] = {}
    for instance, at in zip(found["instance"].to_pylist(), found["sync_ns"].to_pylist()):
        latest[instance] = max(latest.get(instance, at), at)
    pruned = 0
    for instance, at in sorted(latest.items()):
        if sum(1 for i in found["instance"].to_pylist() if i == instance) > 1:
            table.delete(And(EqualTo("instance", instance), LessThan("sync_ns", at)), snapshot_properties={"plumbline.maintenance": "prune"})
            pruned += 1
    return pruned


def _protected(table: Any, name: str, marks: dict[str, dict[str, int | None]]) -> set[int]:
    """Snapshots readers need: each instance's watermark of this table and every commit it made after it."""
    keep = {m for mine in marks.values() if (m := mine.get(name)) is not None}
    seq = {s.snapshot_id: s.sequence_number or 0 for s in table.snapshots()}
    for snap in table.snapshots():
        who = (snap.summary.additional_properties if snap.summary is not None else {}).get("plumbline.instance")
        if not who or who not in marks:
            continue
        mark = marks[who].get(name)
        if mark is None or (snap.sequence_number or 0) > seq.get(mark, -1):
            keep.add(snap.snapshot_id)
    return keep


def _path(uri: str) -> str:
    """A file's location as the filesystem names it (scheme dropped: /dir/file, bucket/key)."""
    parts = urlsplit(uri)
    return f"{parts.netloc}{parts.path}" if parts.scheme else uri


def _reachable(table: Any) -> set[str]:
    """Every file the table's live metadata references: metadata files, manifest lists, manifests, data and delete files."""
    io = table.io
    found = {_path(table.metadata_location)} | {_path(e.metadata_file) for e in table.metadata.metadata_log}
    manifests: dict[str, Any] = {}
    for snap in table.snapshots():
        found.add(_path(snap.manifest_list))
        for manifest in snap.manifests(io):
            manifests.setdefault(manifest.manifest_path, manifest)
    for path, manifest in manifests.items():
        found.add(_path(path))
        found.update(_path(e.data_file.file_path) for e in manifest.fetch_manifest_entry(io, discard_deleted=True))
    return found


def _orphans(table: Any, referenced: set[str], grace_s: float) -> list[str]:
    """Files under the table's location that no metadata references and that are older than the grace."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(table.location())
    try:
        listed = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError:
        return []
    cutoff = time.time() - grace_s
    current_mtime = None
    for info in listed:
        if info.path == _path(table.metadata_location):
            current_mtime = info.mtime.timestamp() if info.mtime else None
    out = []
    for info in listed:
        if info.type != fs.FileType.File or info.path in referenced:
            continue
        age_ok = info.mtime is not None and info.mtime.timestamp() < cutoff
        # A table version's metadata file older than the current one's can never be committed (its base is not current).
        stale_metadata = (info.path.endswith(".metadata.json") and current_mtime is not None and info.mtime is not None
                          and info.mtime.timestamp() < current_mtime)
        if age_ok or stale_metadata:
            out.append(info.path)
    return out


def _delete(table: Any, paths: list[str]) -> tuple[int, int]:
    """Delete files (of this table's location only); how many and how many bytes."""
    from pyarrow import fs

    if not paths:
        return 0, 0
    filesystem, root = fs.FileSystem.from_uri(table.location())
    count = size = 0
    for path in paths:
        if not path.startswith(root.rstrip("/") + "/"):
            continue  # never a file outside the table's own location
        try:
            info = filesystem.get_file_info(path)
            filesystem.delete_file(path)
        except (FileNotFoundError, OSError):
            continue
        count, size = count + 1, size + int(info.size or 0)
    return count, size


def _data_files(table: Any) -> int:
    return int(table.inspect.files().num_rows) if table.current_snapshot() is not None else 0


# --- serving: a thread that syncs a served store --------------------------------------------------------


class LakeSync:
    """Commits a served store to the lake every `interval` seconds, from a cursor of its own (ingest never waits on it).

    Configured by the environment of `plumbline serve` (`from_env`): PLUMBLINE_LAKE (the catalog URI),
    PLUMBLINE_LAKE_INSTANCE (the instance's name; by default the one kept in the store, or a new one
    kept there at the first sync), PLUMBLINE_LAKE_INTERVAL (seconds, default 10), PLUMBLINE_LAKE_CATALOG
    (the catalog's name, default `plumbline`), PLUMBLINE_LAKE_SNAPSHOTS and PLUMBLINE_LAKE_SNAPSHOT_AGE (the
    snapshot history a commit keeps, read by `Lake`: `_trim_history`). A failed sync is logged and retried at the next tick;
    `stop` syncs once more, so what the store holds at shutdown is in the lake. Its state is on
    /metrics (`render_metrics`).
    """

    def __init__(self, sink: LakeSink, cursor: Callable[[], Any], interval: float = 10.0) -> None:
        self.sink, self._cursor_factory, self.interval = sink, cursor, interval
        self._cursor: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.last: SyncResult | None = None
        self.failures = 0
        self.retries = 0
        self.syncs = 0
        self.rows_committed = 0
        self.last_error = ""
        self.started_ns = time.time_ns()
        self.synced_as_of_ns = 0  # the store as of this moment is in the lake (the start of the last complete sync)
        self.last_commit_ns = 0  # when the last complete sync finished

    @classmethod
    def from_env(cls, queue: Any, db_path: str, environ: dict[str, str] | None = None) -> LakeSync | None:
        """The sync configured for `plumbline serve`, or None when PLUMBLINE_LAKE is unset."""
        env = os.environ if environ is None else environ
        uri = env.get("PLUMBLINE_LAKE")
        if not uri:
            return None
        sink = LakeSink(Lake(uri, env.get("PLUMBLINE_LAKE_CATALOG")), env.get("PLUMBLINE_LAKE_INSTANCE") or None)
        return cls(sink, lambda: queue.call(lambda store: store.connection.cursor()), float(env.get("PLUMBLINE_LAKE_INTERVAL", "10")))

    def sync_once(self) -> SyncResult | None:
        with self._lock:
            try:
                if self._cursor is None:
                    self._cursor = self._cursor_factory()
                result = self.sink.sync(self._cursor)
            except Exception as exc:  # noqa: BLE001 - logged and counted; the next tick tries again on a fresh cursor
                self.failures += 1
                self.last_error = str(exc)[:500]
                logging.getLogger("plumbline.lake").warning("lake sync failed (retried in %.0f s): %s", self.interval, exc)
                self._cursor = None
                return None
            self.last, self.syncs = result, self.syncs + 1
            self.retries += result.retries
            self.rows_committed += sum(result.rows.values())
            self.synced_as_of_ns, self.last_commit_ns = result.started_ns, time.time_ns()
            return result

    def lag_rows(self) -> int:
        """Spans the store received after the moment the lake holds it as of (all of them before a first complete sync)."""
        cursor = self._cursor_factory()
        try:
            row = cursor.execute("SELECT count(*) FROM spans WHERE received_ns > ?", [self.synced_as_of_ns]).fetchone()
            return int(row[0]) if row else 0
        finally:
            cursor.close()

    def render_metrics(self) -> str:
        """The lake's state in the Prometheus text format, appended to /metrics by the server."""
        now = time.time_ns()
        try:
            lag_rows: float = self.lag_rows()
        except Exception:  # noqa: BLE001 - a store being closed: no figure rather than no page
            lag_rows = float("nan")
        as_of = self.synced_as_of_ns or self.started_ns
        metrics = [
            ("plumbline_lake_syncs_total", "counter", "Complete lake syncs (every table committed, watermark written).", self.syncs),
            ("plumbline_lake_sync_failures_total", "counter", "Lake syncs that failed (retried at the next interval).", self.failures),
            ("plumbline_lake_commit_retries_total", "counter",
             "Lake commits refused for a concurrent one and rebased or redone.", self.retries),
            ("plumbline_lake_rows_committed_total", "counter", "Rows written to the lake's tables.", self.rows_committed),
            ("plumbline_lake_last_commit_timestamp_seconds", "gauge",
             "When the last complete lake sync finished (Unix seconds; 0: none yet).", self.last_commit_ns / 1e9),
            ("plumbline_lake_lag_seconds", "gauge",
             "Age of the store state the lake holds for this instance (since startup when no sync completed).", (now - as_of) / 1e9),
            ("plumbline_lake_lag_rows", "gauge", "Spans received since the store state the lake holds for this instance.", lag_rows),
            ("plumbline_lake_last_sync_seconds", "gauge", "Duration of the last complete lake sync.",
             self.last.seconds if self.last is not None else 0.0),
        ]
        lines = []
        for name, kind, text, value in metrics:
            shown = "NaN" if value != value else (str(int(value)) if float(value).is_integer() else repr(float(value)))
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f'{name}{{instance="{_escape(self.sink.instance)}"}} {shown}']
        return "\n".join(lines) + "\n"

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def rename(lake: Lake, old: str, new: str) -> dict[str, int]:
    """Move an instance's rows to a new name, table by table, and write its watermark under the new name.

    Run it with the instance stopped (its store's kept name is changed by the caller); readers meanwhile
    see the instance under one name or the other per table, never both under one.
    """
    from pyiceberg.expressions import EqualTo

    if old == new:
        raise ConfigError("rename: the old and new names are the same")
    moved: dict[str, int] = {}
    sink = LakeSink(lake, new)
    result = SyncResult()
    if lake.scan("runs", EqualTo("instance", new), ("trace_id",)).num_rows:
        raise ConfigError(f"lake {lake.label}: instance {new!r} already has runs; pick a name no instance uses")
    for name in TABLES:
        rows = lake.scan(name, EqualTo("instance", old))
        moved[name] = int(rows.num_rows)
        rows = rows.set_column(0, "instance", pa.array([new] * rows.num_rows, pa.string()))
        if rows.num_rows:
            sink._commit(name, EqualTo("instance", old), rows, result)  # one transaction: delete under the old name, append under the new
        else:
            table = lake.table(name)
            table.refresh()
            current = table.current_snapshot()
            sink._marks[name] = current.snapshot_id if current is not None else None
    sink._write_watermark(result)
    lake.table(SYNCS).delete(EqualTo("instance", old))
    return moved


__all__ = ["BATCH_ROWS", "INSTANCE_KEY", "NAMESPACE", "SCHEMAS", "SYNCS", "TABLES", "Lake", "LakeReader", "LakeSink", "LakeSync", "SyncResult",
           "catalog_of", "maintain", "parse_lake_uri", "rename", "resolve_instance", "stored_instance", "watermarks"]
