"""The store's tables and how an older file becomes this version: every table and every migration is here.

A file carries its schema version in `meta`; `migrate` runs the steps of `MIGRATIONS` past it, each
in its own transaction, when a writer opens the file. A new column or table is a new version:
append a step to `MIGRATIONS` (statements that turn version N-1 into N), raise `SCHEMA_VERSION`,
and say in a comment what it is for and why existing rows need what the step does to them.
"""

from __future__ import annotations

from typing import Any

from plumbline_otel.errors import StoreError
from plumbline_otel.rows import SPAN_COLUMNS, SPAN_COLUMNS_V1, SPAN_COLUMNS_V4, SPAN_COLUMNS_V8, SPAN_COLUMNS_V9

SCHEMA_VERSION = 9

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

# The statements that turn a file of the version before into this version, by version.
MIGRATIONS: dict[int, list[str]] = {
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
    # Spans lose their primary-key index (it halved insert speed); `SpanKeys` (_keys.py) keeps retries idempotent.
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
    6: [*_rebuilt_table("spans", {k: v for k, v in SPAN_COLUMNS.items() if k not in SPAN_COLUMNS_V8 and k not in SPAN_COLUMNS_V9}),
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
    # Span links (`SpanLink`), and `trace_links`: trace -> the other trace its root span continues (an unattributed
    # link), so a run spread over traces (AutoGen's Swarm) is assembled as one. Links were dropped at decode before
    # this version: stored spans have none, and nothing is rebuilt.
    9: [*(f"ALTER TABLE spans ADD COLUMN {_column_sql(name, kind)}" for name, kind in SPAN_COLUMNS_V9.items()),
        "CREATE TABLE IF NOT EXISTS trace_links (trace_id VARCHAR NOT NULL, linked_trace_id VARCHAR NOT NULL, "
        "PRIMARY KEY (trace_id, linked_trace_id))"],
}


def schema_version(connection: Any) -> int:
    """The schema version a store's connection holds (0 for an empty file)."""
    exists = connection.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'").fetchone()
    if not exists or not exists[0]:
        return 0
    row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def pending_migrations(connection: Any, path: str) -> list[list[str]]:
    """The steps (each one transaction's statements) that bring the file to `SCHEMA_VERSION`; a newer file is refused."""
    version = schema_version(connection)
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {version}; this plumbline reads up to {SCHEMA_VERSION}: upgrade plumbline")
    return [[*MIGRATIONS[target], f"INSERT OR REPLACE INTO meta VALUES ('schema_version', '{target}')"]
            for target in range(version + 1, SCHEMA_VERSION + 1)]
