"""The store's tables and how an older file becomes this version: every table and every migration is here.

A file carries its schema version in `meta`; `migrate` runs the steps of `MIGRATIONS` past it, each
in its own transaction, when a writer opens the file. A new column or table is a new version:
append a step to `MIGRATIONS` (statements that turn version N-1 into N), raise `SCHEMA_VERSION`,
and say in a comment what it is for and why existing rows need what the step does to them.
"""

from __future__ import annotations

from typing import Any

from plumbline_otel.errors import StoreError
from plumbline_otel.shapes import (
    CERTIFICATES,
    CHECKED_RUNS,
    CHECKS,
    CONVERSATION_KEYS,
    DIRTY_TRACES,
    LOGS,
    META,
    PROBLEMS,
    SPANS,
    TRACE_LINKS,
    TRAJECTORIES,
    VIOLATIONS,
    Shape,
)

SCHEMA_VERSION = 10

# Every table's columns are declared in `shapes.py` (SPANS, TRAJECTORIES, LOGS, PROBLEMS, VIOLATIONS, …); the steps below
# take their columns from there, each as it was when the step was written (the columns added up to its version, zstd
# from version 6 on), so a file made by any version migrates to the same tables a new file gets.

# One row per (spec, run, invariant) that failed: an invariant has one verdict per run and spec.
_VIOLATIONS_TABLE = f"CREATE TABLE IF NOT EXISTS violations ({VIOLATIONS.ddl(5)})"
VIOLATION_COLUMNS = VIOLATIONS.names[1:]  # what a check's batch holds (the spec's hash is the batch's)

# Columns of long text (JSON maps, payloads, documents) are stored with zstd (`Column.zstd`). DuckDB's default for
# strings (a dictionary and FSST per segment, chosen by analysing each one) made the checkpoint,
# where appended rows are compressed, a fifth of a file ingest's time (2.2-2.9 s per 100,000 spans),
# for a file six times larger: zstd took 0.6-0.8 s and 96 MB became 15 (bench/ingest_files.py corpus).


def _rebuilt_table(shape: Shape, until: int) -> list[str]:
    """Statements that re-create `shape`'s table with its columns up to version `until` (in order) and keep its rows."""
    table = shape.name
    return [f"CREATE TABLE {table}_rebuilt ({shape.ddl(until)})", f"INSERT INTO {table}_rebuilt SELECT * FROM {table}",
            f"DROP TABLE {table}", f"ALTER TABLE {table}_rebuilt RENAME TO {table}"]


def _added_columns(shape: Shape, version: int, compressed: bool = True) -> list[str]:
    """The ALTER TABLE statements that add the columns of `shape` declared `since=version`."""
    return [f"ALTER TABLE {shape.name} ADD COLUMN {c.ddl(compressed)}" for c in shape.added_in(version)]


_LOGS_TABLE = f"CREATE TABLE IF NOT EXISTS logs ({LOGS.ddl(4, compressed=False)})"

# The statements that turn a file of the version before into this version, by version.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        f"CREATE TABLE IF NOT EXISTS meta ({META.ddl(1)})",
        f"CREATE TABLE spans ({SPANS.ddl(1, compressed=False)}, PRIMARY KEY (trace_id, span_id))",
        f"CREATE TABLE dirty_traces ({DIRTY_TRACES.ddl(1)})",
        f"CREATE TABLE trajectories ({TRAJECTORIES.ddl(1, compressed=False)})",
        f"CREATE TABLE problems ({PROBLEMS.ddl(1)})",
    ],
    # Spans lose their primary-key index (it halved insert speed); `SpanKeys` (_keys.py) keeps retries idempotent.
    2: [
        "CREATE TABLE spans_v2 AS SELECT * FROM spans",
        "DROP TABLE spans",
        "ALTER TABLE spans_v2 RENAME TO spans",
    ],
    # Framework wrappers and dumps unwrapped per span, for coverage; every trajectory is
    # rebuilt, because a conversation id is no longer a default task key.
    3: [*_added_columns(SPANS, 3),
        "INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans"],
    # GenAI log records (a server before this version made the table itself) are folded into
    # their spans at assembly; cache tokens, finish reasons, hand-offs and each field's evidence per span.
    4: [_LOGS_TABLE,
        *_added_columns(SPANS, 4, compressed=False),
        "INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans"],
    # Violations join the store's own tables (`plumbline check` made the table itself before this version).
    5: [_VIOLATIONS_TABLE],
    # Long text columns stored with zstd (`Column.zstd`); the rows are copied as they are.
    6: [*_rebuilt_table(SPANS, 6), *_rebuilt_table(TRAJECTORIES, 6), *_rebuilt_table(LOGS, 6)],
    # What `check` and `certify` keep for the console beside the violations: which runs were judged under which
    # spec (a run with no violation is "conforming" only if it was judged), each check, and the certificates.
    7: [f"CREATE TABLE IF NOT EXISTS {shape.name} ({shape.ddl(7)})" for shape in (CHECKED_RUNS, CHECKS, CERTIFICATES)],
    # Producer-reported cost (`gen_ai.usage.cost.*`) and guardrail / execution-state events per span; every
    # trajectory is rebuilt so its steps carry them.
    8: [*_added_columns(SPANS, 8),
        "INSERT OR IGNORE INTO dirty_traces SELECT DISTINCT trace_id FROM spans"],
    # Span links (`SpanLink`), and `trace_links`: trace -> the other trace its root span continues (an unattributed
    # link), so a run spread over traces (AutoGen's Swarm) is assembled as one. Links were dropped at decode before
    # this version: stored spans have none, and nothing is rebuilt.
    9: [*_added_columns(SPANS, 9),
        f"CREATE TABLE IF NOT EXISTS trace_links ({TRACE_LINKS.ddl(9)})"],
    # The conversation keys of model calls that are the root of their trace (`threads.py`): an agent loop under only
    # an SDK's zero-code instrumentation exports a trace per model call, and a trace whose request continues another's
    # conversation is linked to it in `trace_links`, so the run's traces are assembled as one (issue 40 item 12).
    # Spans stored before this version are not keyed: their per-call traces stay apart, as they were.
    10: [f"CREATE TABLE IF NOT EXISTS conversation_keys ({CONVERSATION_KEYS.ddl(10)})"],
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
