"""The procure-to-pay system of record: one private, disposable copy per trial.

Opening a DuckDB connection costs about 30 ms on the reference machine, too slow to give every
trial its own database. So each process builds one in-memory DuckDB instance once, loading the
reference tables from `data/*.csv` into a schema `ref`, and each `SystemOfRecord` is a private
schema `trial_<n>` in that instance holding copies of the five write tables, reached through its
own cursor whose search path is `trial_<n>, ref`. Opening one costs about 3 ms.

Isolation: every tool uses unqualified table names, so a trial reads the shared reference data
and its own writes and never another trial's. Reference tables are never written by a tool.

Speed: DuckDB answers a point query in about a millisecond, and a tool makes several. Reference
tables never change after loading, so queries over them go through `reference()`, which
memoises each (query, parameters) answer per process; only the write tables are queried live.

Threads: one `SystemOfRecord` belongs to one trial and is used from one thread at a time (a lock
makes accidental sharing safe, not fast); different trials may run in different threads. After a
fork the child builds its own instance rather than reuse the parent's.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import re
import threading
import weakref
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

DATA_DIR = Path(__file__).resolve().parent / "data"

REFERENCE_TABLES: tuple[str, ...] = (
    "vendors", "payment_terms", "tax_codes", "tolerance_rules", "fx_rates", "approval_matrix",
    "approvers", "settings", "purchase_orders", "po_lines", "goods_receipts", "invoices",
    "invoice_lines",
)
WRITE_TABLES: tuple[str, ...] = ("payments", "exceptions", "approvals", "credit_applications", "audit_log")
ID_PREFIX: dict[str, tuple[str, str]] = {  # table -> (id column, prefix)
    "payments": ("payment_id", "PAY-"),
    "exceptions": ("exception_id", "EXC-"),
    "approvals": ("approval_id", "APR-"),
    "credit_applications": ("application_id", "CRA-"),
    "audit_log": ("entry_id", "AUD-"),
}


_MAX_ANSWERS = 4096
_WRITE_TABLE_WORD = re.compile(r"\b(" + "|".join(WRITE_TABLES) + r")\b", re.IGNORECASE)


class _Template:
    """The process-wide DuckDB instance holding the reference data (schema `ref`)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.counter = itertools.count(1)
        self.answers: dict[tuple[str, tuple[Any, ...]], list[dict[str, Any]]] = {}
        self.con = duckdb.connect(config={"threads": 1})
        self.con.execute("CREATE SCHEMA ref; SET schema = 'ref';")
        self.con.execute((data_dir / "schema.sql").read_text())
        for table in REFERENCE_TABLES + WRITE_TABLES:
            path = data_dir / f"{table}.csv"
            if path.exists():
                self.con.execute(
                    f"INSERT INTO ref.{table} SELECT * FROM read_csv(?, header = true, all_varchar = true)",
                    [str(path)],
                )

    def new_schema(self) -> str:
        name = f"trial_{next(self.counter)}"
        copies = "".join(f"CREATE TABLE {name}.{t} AS FROM ref.{t};" for t in WRITE_TABLES)
        with self.lock:
            self.con.execute(f"CREATE SCHEMA {name};{copies}")
        return name

    def drop_schema(self, name: str) -> None:
        """Drop a trial's schema; also run by garbage collection, so it uses a cursor of its own."""
        if os.getpid() != self.pid:
            return
        with self.lock:
            cursor = self.con.cursor()
            try:
                cursor.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            finally:
                cursor.close()


_TEMPLATES: dict[Path, _Template] = {}
_TEMPLATES_LOCK = threading.Lock()


def _template(data_dir: Path) -> _Template:
    with _TEMPLATES_LOCK:
        tmpl = _TEMPLATES.get(data_dir)
        if tmpl is None or tmpl.pid != os.getpid():
            tmpl = _TEMPLATES[data_dir] = _Template(data_dir)
        return tmpl


class SystemOfRecord:
    """One trial's view of the system of record: shared reference data, private write tables.

    Query helpers return rows as dicts with DuckDB's Python types (Decimal for money, date for
    dates). `writes()` returns the trial's write tables in a JSON-serialisable form.
    """

    def __init__(self, template: _Template) -> None:
        self._template = template
        self.schema = template.new_schema()
        self._lock = threading.RLock()
        self._cur = template.con.cursor()
        self._cur.execute(f"SET search_path = '{self.schema},ref'")
        self._seq = itertools.count(1)
        self._closed = False
        self._finalizer = weakref.finalize(self, template.drop_schema, self.schema)

    # -- reading ---------------------------------------------------------------------------
    def reference(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows of a query over reference tables only, memoised per process (copies, safe to change)."""
        self._check_open()
        key = (sql, tuple(params))
        answer = self._template.answers.get(key)
        if answer is None:
            if _WRITE_TABLE_WORD.search(sql):
                raise ValueError(f"reference() is for reference tables only; query write tables with rows(): {sql}")
            answer = self.rows(sql, params)
            if len(self._template.answers) >= _MAX_ANSWERS:  # ids come from agents: bound the memo
                self._template.answers.clear()
            self._template.answers[key] = answer
        return [dict(r) for r in answer]

    def reference_row(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any] | None:
        """The first row of a reference query, or None."""
        found = self.reference(sql, params)
        return found[0] if found else None

    def rows(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """All rows of a query, as dicts."""
        with self._lock:
            self._check_open()
            result = self._cur.execute(sql, list(params))
            names = [d[0] for d in result.description]
            return [dict(zip(names, row)) for row in result.fetchall()]

    def row(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any] | None:
        """The first row of a query, or None."""
        found = self.rows(sql, params)
        return found[0] if found else None

    def scalar(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> Any:
        """The first column of the first row, or None."""
        found = self.row(sql, params)
        return next(iter(found.values())) if found else None

    def setting(self, key: str) -> str:
        """A value from the settings table (base currency, tolerances)."""
        found = self.reference_row("SELECT value FROM settings WHERE key = ?", [key])
        value = found["value"] if found else None
        if value is None:
            raise KeyError(f"setting {key!r} missing from the system of record")
        return str(value)

    # -- writing ---------------------------------------------------------------------------
    def insert(self, table: str, values: dict[str, Any]) -> dict[str, Any]:
        """Insert one row into a write table, assigning its id and write sequence number."""
        if table not in WRITE_TABLES:
            raise ValueError(f"{table!r} is not a write table")
        id_column, prefix = ID_PREFIX[table]
        with self._lock:
            self._check_open()
            count = self.scalar(f"SELECT count(*) FROM {table} WHERE seq > 0")
            row = {id_column: f"{prefix}{5001 + int(count)}", **values, "seq": next(self._seq)}
            columns = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            self._cur.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", list(row.values()))
            return row

    def writes(self, include_history: bool = False) -> dict[str, list[dict[str, Any]]]:
        """The trial's writes per write table, in write order, JSON-serialisable."""
        where = "" if include_history else "WHERE seq > 0"
        return {
            t: [to_json(r) for r in self.rows(f"SELECT * FROM {t} {where} ORDER BY seq, 1")]
            for t in WRITE_TABLES
        }

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Drop this trial's schema. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cur.close()
            self._finalizer()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this system of record has been closed")

    def __enter__(self) -> SystemOfRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SystemOfRecord(schema={self.schema!r}, closed={self._closed})"


def open_system_of_record(data_dir: Path | str | None = None) -> SystemOfRecord:
    """A fresh system of record for one trial: reference data plus empty write tables.

    The reference data is loaded from `data_dir` (default: this package's `data/`) once per
    process; later calls copy only the write tables, a few milliseconds each. Close it (or use
    it as a context manager) to free the copy; garbage collection frees it otherwise.
    """
    path = Path(data_dir).resolve() if data_dir is not None else DATA_DIR
    return SystemOfRecord(_template(path))


def to_json(value: Any) -> Any:
    """Decimal to float (money has two places, so float is exact enough), dates to ISO strings."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value
