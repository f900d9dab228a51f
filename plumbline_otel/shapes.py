"""Shapes: every stored table's columns, declared once, with a logical type each.

The store's DuckDB DDL and migrations (`store/_schema.py`), the Arrow tables the shard workers
build (`rows.py`) and the lake's Arrow and Iceberg schemas (`lake.py`) are all derived from these
declarations, so a column is added in one place and every representation gains it:

    Column("links", "json", since=9)
        DuckDB   links JSON                     (added by migration 9; `Shape.added_in(9)`)
        Arrow    links: extension<arrow.json>   (the store's Arrow; JSON text sent as Arrow's JSON type)
        lake     links: string                  (Iceberg has no JSON type: the same text as a string)

A store column's `since` is the schema version whose migration added it (version 1 made the
first tables); a file of an older version gains the column through that migration, and a lake
table made by an older plumbline gains it when the lake opens the table (`lake.py`, its schema
evolution). Column order is table order, and part of the file format: a new column goes at the
end (the store adds a column at the end), and a lake table lists its columns in the order it was first
created with. This module is the core: it imports no stage, and pyarrow and pyiceberg only where
their schemas are built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# The logical types a stored column can have. "json" is JSON text (orjson's); "strings" a list of strings.
LogicalType = Literal["string", "json", "int64", "int32", "float64", "bool", "strings"]

_DUCKDB: dict[str, str] = {"string": "VARCHAR", "json": "JSON", "int64": "BIGINT", "int32": "INTEGER", "float64": "DOUBLE",
                           "bool": "BOOLEAN", "strings": "VARCHAR[]"}


@dataclass(frozen=True)
class Column:
    """One stored column: its name, logical type, and how the store keeps it."""

    name: str
    type: LogicalType
    since: int = 1  # the store schema version whose migration added it
    required: bool = False  # NOT NULL in the store
    key: bool = False  # the table's single-column PRIMARY KEY in the store
    zstd: bool = False  # long text: stored with zstd (`store/_schema.py` says why)

    @property
    def duckdb_type(self) -> str:
        """The DuckDB type with its constraint, as the store declares the column (`VARCHAR NOT NULL`)."""
        kind = _DUCKDB[self.type]
        return f"{kind} PRIMARY KEY" if self.key else f"{kind} NOT NULL" if self.required else kind

    def ddl(self, compressed: bool = True) -> str:
        """The column's definition in a table's or an added column's DDL (its zstd compression unless not `compressed`)."""
        text = f"{self.name} {self.duckdb_type}"
        return f"{text} USING COMPRESSION zstd" if compressed and self.zstd else text


@dataclass(frozen=True)
class Shape:
    """A stored table's columns, in table order, and its primary key when it has one of several columns."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        """The column `name` (KeyError when the shape has none)."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def duckdb_types(self, until: int | None = None) -> dict[str, str]:
        """Column name -> DuckDB type (with its constraint), in table order; only those added up to version `until` when given."""
        return {c.name: c.duckdb_type for c in self.columns if until is None or c.since <= until}

    def added_in(self, version: int) -> tuple[Column, ...]:
        """The columns migration `version` added."""
        return tuple(c for c in self.columns if c.since == version)

    def ddl(self, until: int | None = None, compressed: bool = True) -> str:
        """The column definitions of the table's DDL (those added up to version `until` when given), and its primary key."""
        body = ", ".join(c.ddl(compressed) for c in self.columns if until is None or c.since <= until)
        return f"{body}, PRIMARY KEY ({', '.join(self.primary_key)})" if self.primary_key else body

    def pick(self, name: str, *names: str) -> Shape:
        """A shape named `name` of some of these columns, in the order given (a lake table's copy of a store table)."""
        return Shape(name, tuple(self.column(n) for n in names))

    def arrow(self, json_text: bool = False) -> Any:
        """The Arrow schema of the rows the store inserts (every field nullable: the store checks its constraints).

        JSON text goes to DuckDB as Arrow's JSON type: sent as plain strings, every value was parsed
        again on insert to check it (7% of a span write in a profile, 9-11% timed alone), though orjson made it.
        `json_text`: as plain strings (checked on insert; the log records' writer).
        """
        import pyarrow as pa

        return pa.schema([(c.name, _arrow_type(c.type, json_text)) for c in self.columns])


@dataclass(frozen=True)
class LakeShape:
    """A lake table: the committing `instance`, the columns, and the `hour` of the rows (both partition columns)."""

    name: str
    columns: tuple[Column, ...]

    @property
    def all_columns(self) -> tuple[Column, ...]:
        return (_INSTANCE, *self.columns, _HOUR)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.all_columns)

    @property
    def row_names(self) -> tuple[str, ...]:
        """The columns a sync reads from the store (all but `instance`)."""
        return tuple(c.name for c in (*self.columns, _HOUR))

    def arrow(self) -> Any:
        """The Arrow schema of the table's rows (JSON as plain strings: Iceberg has no JSON type)."""
        import pyarrow as pa

        return pa.schema([(c.name, _arrow_type(c.type, json_text=True)) for c in self.all_columns])

    def iceberg(self) -> Any:
        """The Iceberg schema of a new table: field ids 1.. in column order, then lists' element ids; every field optional."""
        from pyiceberg.schema import Schema
        from pyiceberg.types import NestedField

        fields, next_id = [], len(self.all_columns) + 1
        for i, c in enumerate(self.all_columns, start=1):
            kind, next_id = iceberg_type(c.type, next_id)
            fields.append(NestedField(field_id=i, name=c.name, field_type=kind, required=False))
        return Schema(*fields)


def _arrow_type(kind: LogicalType, json_text: bool) -> Any:
    import pyarrow as pa

    if kind == "json":
        return pa.string() if json_text else pa.json_(pa.string())
    return {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64(), "bool": pa.bool_(),
            "strings": pa.list_(pa.string())}[kind]


def iceberg_type(kind: LogicalType, next_id: int) -> tuple[Any, int]:
    """The Iceberg type of a logical type, and the next free field id (a list's element takes `next_id`)."""
    from pyiceberg.types import BooleanType, DoubleType, IntegerType, ListType, LongType, StringType

    if kind == "strings":
        return ListType(element_id=next_id, element_type=StringType(), element_required=False), next_id + 1
    simple = {"string": StringType(), "json": StringType(), "int64": LongType(), "int32": IntegerType(), "float64": DoubleType(),
              "bool": BooleanType()}
    return simple[kind], next_id


def _columns(spec: str, since: int = 1, zstd: frozenset[str] = frozenset()) -> tuple[Column, ...]:
    """Columns from `name:type` pairs (a `!` after the type: NOT NULL; `*`: the primary key)."""
    out = []
    for item in spec.split():
        name, kind = item.split(":")
        flags = kind.lstrip("abcdefghijklmnopqrstuvwxyz0123456789")
        kind = kind[: len(kind) - len(flags)]
        out.append(Column(name, kind, since, required="!" in flags, key="*" in flags, zstd=name in zstd))  # type: ignore[arg-type]
    return tuple(out)


# Columns of long text (JSON maps, payloads, documents) are stored with zstd (from version 6: `store/_schema.py`).
_ZSTD = frozenset({"attributes", "resource", "args", "result", "proposed_calls", "tool_results", "context", "decisions",
                   "run_events", "input_text", "output_text", "status_message", "input", "final_output", "doc", "body"})

# One row per received span: the store's source of truth (docs/architecture.md, "Span row").
SPANS = Shape("spans", (
    *_columns("""trace_id:string! span_id:string! parent_span_id:string name:string start_ns:int64 end_ns:int64 kind:int32
                 status_code:int32 status_message:string service_name:string service_version:string scope_name:string
                 convention:string step_kind:string tool_name:string call_id:string args:json args_state:string result:json
                 error:string model:string provider:string response_id:string input_tokens:int64 output_tokens:int64
                 agent_name:string input_text:string output_text:string content_captured:bool proposed_calls:json
                 tool_results:json unknown_keys:strings dropped_attributes_count:int32 context:json attributes:json
                 resource:json received_ns:int64""", 1, _ZSTD),
    *_columns("shapes:strings", 3),  # framework wrappers and dumps unwrapped per span
    *_columns("""cache_read_tokens:int64 cache_write_tokens:int64 finish_reasons:strings handoff_to:string evidence:strings
                 decisions:json""", 4, _ZSTD),
    *_columns("cost_amount:float64 cost_currency:string cost_source:string run_events:json", 8, _ZSTD),
    *_columns("links:json", 9, _ZSTD),
))

# One row per assembled run (and per driver's record): its document (`doc`) and the columns readers filter by.
TRAJECTORIES = Shape("trajectories", _columns(
    """trajectory_id:string* trace_id:string task_key:string task_key_source:string service:string service_version:string
       agent_name:string input:string final_output:string conventions:strings start_ns:int64 end_ns:int64 n_steps:int32
       n_tool_calls:int32 doc:json assembled_ns:int64""", 1, _ZSTD))

# GenAI log records (folded into their spans at assembly).
LOGS = Shape("logs", _columns(
    """log_id:string* trace_id:string span_id:string time_ns:int64 observed_ns:int64 event_name:string severity_number:int32
       severity_text:string body:json attributes:json service_name:string scope_name:string resource:json received_ns:int64""",
    4, _ZSTD))

# Input rejected on the way in.
PROBLEMS = Shape("problems", _columns("received_ns:int64 source:string location:string reason:string spans:int32"))

# One row per (spec, run, invariant) that failed: an invariant has one verdict per run and spec.
VIOLATIONS = Shape("violations", _columns(
    """spec_hash:string! invariant_id:string! trajectory_id:string! severity:string! task_key:string step_index:int32
       step_name:string detail:string""", 5), primary_key=("spec_hash", "trajectory_id", "invariant_id"))

# The store's own bookkeeping (`store/_schema.py` says what each is for): settings, traces to assemble again, what
# `check` and `certify` keep for the console, links between traces, and model calls' conversation keys (`threads.py`).
META = Shape("meta", _columns("key:string* value:string"))
DIRTY_TRACES = Shape("dirty_traces", _columns("trace_id:string*"))
CHECKED_RUNS = Shape("checked_runs", _columns("spec_hash:string! trajectory_id:string! checked_ns:int64", 7),
                     primary_key=("spec_hash", "trajectory_id"))
CHECKS = Shape("checks", _columns("spec_hash:string* spec_name:string spec_path:string checked_ns:int64 runs:int64", 7))
CERTIFICATES = Shape("certificates", _columns(
    "stored_ns:int64 spec_hash:string study:string agent:string verdict:string lower_bound:float64 doc:string", 7))
TRACE_LINKS = Shape("trace_links", _columns("trace_id:string! linked_trace_id:string!", 9), primary_key=("trace_id", "linked_trace_id"))
CONVERSATION_KEYS = Shape("conversation_keys", _columns(
    """trace_id:string! span_id:string! start_ns:int64 end_ns:int64 continues:string continues_loose:string after:string
       after_loose:string""", 10), primary_key=("trace_id", "span_id"))

_INSTANCE, _HOUR = Column("instance", "string"), Column("hour", "int32")


def _lake(shape: Shape, *names: str) -> LakeShape:
    return LakeShape(shape.name, shape.pick(shape.name, *names).columns if names else shape.columns)


# The lake's tables (`lake.py`): copies of the store's tables (the columns readers of the lake need), and three of its own.
LAKE_SHAPES: dict[str, LakeShape] = {
    "runs": LakeShape("runs", TRAJECTORIES.columns),
    "steps": LakeShape("steps", (*TRAJECTORIES.pick("steps", "trajectory_id", "trace_id", "assembled_ns", "service", "task_key").columns,
                                 *_columns("step_index:int32 kind:string name:string span_id:string call_id:string error:string step:string"))),
    "spans": _lake(SPANS, "trace_id", "span_id", "parent_span_id", "name", "scope_name", "start_ns", "end_ns", "service_name",
                   "service_version", "convention", "step_kind", "tool_name", "model", "args_state", "content_captured", "input_tokens",
                   "output_tokens", "dropped_attributes_count", "shapes", "unknown_keys", "status_code", "received_ns"),
    "logs": _lake(LOGS, "log_id", "trace_id", "span_id", "time_ns", "observed_ns", "event_name", "severity_number", "service_name",
                  "received_ns"),
    "problems": _lake(PROBLEMS),
    "violations": _lake(VIOLATIONS),
    # Each cell of every certificate an instance kept: the cell as JSON beside the columns a dashboard groups and filters by.
    "certificate_cells": LakeShape("certificate_cells", _columns(
        """stored_ns:int64 spec_hash:string study:string agent:string perturbation:string verdict:string gate_method:string n:int64
           conforming:int64 tasks:int64 gate_lower:float64 gate_upper:float64 cell:string""")),
    # The watermark: one row per complete sync of an instance, naming the snapshot of each table that holds that sync.
    "syncs": LakeShape("syncs", _columns("sync_ns:int64 snapshots:string rows:int64")),
}


__all__ = ["CERTIFICATES", "CHECKED_RUNS", "CHECKS", "CONVERSATION_KEYS", "DIRTY_TRACES", "LAKE_SHAPES", "LOGS", "META", "PROBLEMS",
           "SPANS", "TRACE_LINKS", "TRAJECTORIES", "VIOLATIONS", "Column", "LakeShape", "LogicalType", "Shape", "iceberg_type"]
