"""Store: one DuckDB file holding span rows (the source of truth) and the trajectories built from them.

    _schema.py   the tables, `SCHEMA_VERSION` and every migration (a new column or table goes here)
    _files.py    opening the file (a writer's through ATTACH), sharing it in a process, the lock, reattaching
    _keys.py     what the writer keeps in memory about stored spans (retries, span counts per trace)
    _store.py    `Store`: every write, and the assembly of dirty traces from the rows
    _read.py     `Reader`: every query readers run (a `Store` is one; `Reader(cursor)` reads through a cursor),
                 with _read_coverage.py, the coverage figures

A writer's writes are batched through Arrow, never row by row; an exporter's retry changes nothing;
spans may arrive in any order and across any number of requests, and a late span updates its
trajectory (`_store.py` says how). The schema migrates forward when a writer opens the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from plumbline_otel.errors import StoreError
from plumbline_otel.store._files import ROW_GROUP_SIZE, StoreLocked, invalidated
from plumbline_otel.store._read import (
    FIXTURE_PREFIX,
    PAGE_SIZE,
    SORTS,
    STATUSES,
    CheckRow,
    DiffCandidate,
    InvariantMark,
    Page,
    Reader,
    RunFilter,
    RunFilters,
    RunRow,
    RunViolation,
    TaskRun,
    TimelineSpan,
    Totals,
    Usage,
    ViolationSummary,
)
from plumbline_otel.store._schema import SCHEMA_VERSION, VIOLATION_COLUMNS, schema_version
from plumbline_otel.store._store import (
    DEFAULT_DB,
    WRITER_MEMORY_LIMIT_MIB,
    CertificateRow,
    Store,
    WriteResult,
    meta_value,
    set_meta,
)

__all__ = [
    "DEFAULT_DB",
    "FIXTURE_PREFIX",
    "PAGE_SIZE",
    "ROW_GROUP_SIZE",
    "SCHEMA_VERSION",
    "SORTS",
    "STATUSES",
    "VIOLATION_COLUMNS",
    "WRITER_MEMORY_LIMIT_MIB",
    "CertificateRow",
    "CheckRow",
    "DiffCandidate",
    "InvariantMark",
    "Page",
    "Reader",
    "RunFilter",
    "RunFilters",
    "RunRow",
    "RunViolation",
    "Store",
    "StoreLocked",
    "TaskRun",
    "TimelineSpan",
    "Totals",
    "Usage",
    "ViolationSummary",
    "WriteResult",
    "invalidated",
    "meta_value",
    "set_meta",
    "open_assembled",
    "pending_note",
    "schema_version",
]


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
