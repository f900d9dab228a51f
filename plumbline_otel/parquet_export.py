"""Parquet out, for the warehouse: runs, steps, violations and certificate cells as a Hive-partitioned dataset.

    OUT/trajectories/date=2026-12-03/service=payer/data_0.parquet
    OUT/steps/…   OUT/violations/…   OUT/certificate_cells/date=…/service=…/cert-<key>-0.parquet

DuckDB writes every file (`COPY … (FORMAT parquet, PARTITION_BY (date, service))`); `date` is the
UTC day a run started (a certificate's: the day it was generated) and `service` the agent's
service.name, so DuckDB, Spark, Trino or pyarrow read the directory as one table per folder.

Re-exporting never duplicates a row. A window is whole UTC days (`since` is rounded down to its
day): each table is written to a staging folder first, then every `date=` partition of the
window is removed and the staged ones moved in, so the days an export covers hold exactly what
the store holds for them; days before the window are left alone. Without `since` the window is
everything. Certificate cells are keyed by the certificate file's content hash instead: exporting
the same certificate again replaces its files, another certificate adds its own.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from plumbline_otel.store import Store

_DAY_NS = 86_400 * 1_000_000_000
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_DATE = "strftime(make_timestamp(t.start_ns // 1000), '%Y-%m-%d') AS date"

_TRAJECTORIES = f"""
SELECT t.trajectory_id AS run, t.trace_id, t.task_key, t.task_key_source, t.service_version, t.agent_name,
       t.input, t.final_output, t.conventions, make_timestamp(t.start_ns // 1000) AS start_time, t.start_ns, t.end_ns,
       t.n_steps, t.n_tool_calls, nullif((t.doc->'context')::VARCHAR, 'null') AS context, {_DATE}, t.service
FROM trajectories t WHERE {{window}}"""

_STEPS = f"""
WITH s AS (
    SELECT t.trajectory_id, t.trace_id, t.service, t.start_ns,
           unnest(json_extract(t.doc, '$.steps[*]')) AS step,
           generate_subscripts(json_extract(t.doc, '$.steps[*]'), 1) - 1 AS step_index
    FROM trajectories t WHERE {{window}})
SELECT t.trajectory_id AS run, t.step_index AS "index", t.step->>'kind' AS kind, t.step->>'name' AS name,
       nullif((t.step->'args')::VARCHAR, 'null') AS arguments, t.step->>'result' AS result, t.step->>'error' AS error,
       t.step->>'source' AS source, t.step->>'call_id' AS call_id, t.trace_id, t.step->>'span_id' AS span_id,
       (t.step->>'start_ns')::BIGINT AS step_start_ns, {_DATE}, t.service
FROM s t"""

_VIOLATIONS = f"""
SELECT v.trajectory_id AS run, v.spec_hash, v.invariant_id, v.severity, v.task_key, v.step_index, v.step_name, v.detail,
       t.trace_id, {_DATE}, t.service
FROM violations v JOIN trajectories t USING (trajectory_id) WHERE {{window}}"""

# exported table -> (its query, the store table it needs: a store never checked has no violations)
STORE_TABLES = {"trajectories": (_TRAJECTORIES, "trajectories"), "steps": (_STEPS, "trajectories"),
                "violations": (_VIOLATIONS, "violations")}
CERT_TABLE = "certificate_cells"


def window_start(since_ns: int | None) -> int | None:
    """`since` rounded down to its UTC day: partitions are days, so a window is whole days."""
    return None if since_ns is None else since_ns - since_ns % _DAY_NS


def _day(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc).strftime("%Y-%m-%d")


def _has_table(store: Store, name: str) -> bool:
    row = store.connection.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()
    return bool(row and row[0])


def _copy(store: Store, query: str, target: Path, pattern: str | None = None) -> int:
    """One COPY to a partitioned folder; returns the rows written."""
    options = "FORMAT parquet, PARTITION_BY (date, service)" + (f", FILENAME_PATTERN '{pattern}'" if pattern else "")
    path = str(target).replace("'", "''")
    row = store.connection.execute(f"COPY ({query}) TO '{path}' ({options})").fetchone()
    return int(row[0]) if row else 0


def _replace_days(staged: Path, dest: Path, first_day: str | None) -> None:
    """Remove the window's day partitions from `dest` (all of them when `first_day` is None), move the staged ones in."""
    if first_day is None:
        shutil.rmtree(dest, ignore_errors=True)
    elif dest.is_dir():
        for part in dest.iterdir():
            match = _DATE_DIR.match(part.name)
            if match and match.group(1) >= first_day:
                shutil.rmtree(part)
    dest.mkdir(parents=True, exist_ok=True)
    if staged.is_dir():
        for part in staged.iterdir():
            shutil.move(str(part), str(dest / part.name))


def certificate_rows(cert: dict[str, Any], key: str) -> pa.Table:
    """One row per (agent, perturbation) cell of a certificate; the whole cell rides along as JSON.

    The named columns are the ones every certificate version has; fields later versions add
    (gate bounds, pass^k, …) are in `cell`, so an older reader never drops them.
    """
    provenance = cert.get("provenance", {})
    spec = cert.get("spec", {})
    generated = str(provenance.get("generated_at") or "")
    rows = [
        {"certificate": key, "spec_name": spec.get("name"), "spec_hash": spec.get("hash"),
         "evidence_sha256": provenance.get("evidence_sha256"), "generated_at": generated,
         "agent": cell.get("agent"), "perturbation": cell.get("perturbation"), "n": cell.get("n"),
         "conforming": cell.get("conforming"), "lower": cell.get("lower"), "upper": cell.get("upper"),
         "missing": cell.get("missing"), "unexposed": cell.get("unexposed"),
         "cell": orjson.dumps(cell).decode(), "date": generated[:10] or None,
         "service": str(cell.get("agent") or "").split("@", 1)[0] or None}
        for agent in cert.get("agents", []) for cell in agent.get("perturbations", [])
    ]
    schema = pa.schema([("certificate", pa.string()), ("spec_name", pa.string()), ("spec_hash", pa.string()),
                        ("evidence_sha256", pa.string()), ("generated_at", pa.string()), ("agent", pa.string()),
                        ("perturbation", pa.string()), ("n", pa.int64()), ("conforming", pa.int64()), ("lower", pa.float64()),
                        ("upper", pa.float64()), ("missing", pa.int64()), ("unexposed", pa.int64()), ("cell", pa.string()),
                        ("date", pa.string()), ("service", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def _export_certificate(store: Store, cert_bytes: bytes, staging: Path, out: Path) -> int:
    key = hashlib.sha256(cert_bytes).hexdigest()[:16]
    store.connection.register("_pl_certificate_cells", certificate_rows(orjson.loads(cert_bytes), key))
    try:
        written = _copy(store, "SELECT * FROM _pl_certificate_cells", staging / CERT_TABLE, pattern=f"cert-{key}-{{i}}")
    finally:
        store.connection.unregister("_pl_certificate_cells")
    dest = out / CERT_TABLE
    for old in dest.glob(f"**/cert-{key}-*.parquet"):
        old.unlink()
    for new in (staging / CERT_TABLE).glob("**/*.parquet"):
        target = dest / new.relative_to(staging / CERT_TABLE)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(new), str(target))
    return written


def export_parquet(store: Store, out: str | Path, since_ns: int | None = None, certificate: bytes | None = None) -> dict[str, int]:
    """Write the store's runs, steps and violations (and a certificate's cells) under `out`; rows per table.

    The store should be assembled first (`open_assembled`): the export reads trajectories.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = window_start(since_ns)
    window = "TRUE" if start is None else f"t.start_ns >= {int(start)}"
    staging = out / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    written: dict[str, int] = {}
    try:
        for table, (query, source) in STORE_TABLES.items():
            if not _has_table(store, source):
                written[table] = 0
                continue
            written[table] = _copy(store, query.format(window=window), staging / table)
        for table in STORE_TABLES:
            _replace_days(staging / table, out / table, None if start is None else _day(start))
        if certificate is not None:
            written[CERT_TABLE] = _export_certificate(store, certificate, staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


__all__ = ["CERT_TABLE", "STORE_TABLES", "certificate_rows", "export_parquet", "window_start"]
