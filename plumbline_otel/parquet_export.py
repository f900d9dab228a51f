"""Parquet out, for the warehouse: runs, steps, violations and certificate cells as a Hive-partitioned dataset.

    OUT/trajectories/date=2026-12-03/service=payer/data_0.parquet
    OUT/steps/…   OUT/violations/…   OUT/certificate_cells/date=…/service=…/cert-<key>-0.parquet

DuckDB writes every file (`COPY … (FORMAT parquet, PARTITION_BY (date, service))`, the store's `Reader.copy_to_parquet`); `date` is the
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

import orjson
import pyarrow as pa

from plumbline_otel.report.model import Certificate
from plumbline_otel.report.render import load_certificate
from plumbline_otel.store import Reader

_DAY_NS = 86_400 * 1_000_000_000
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
# The exported tables, in the order they are written (their queries: `Reader.copy_to_parquet`).
STORE_TABLES = ("trajectories", "steps", "violations")
CERT_TABLE = "certificate_cells"


def window_start(since_ns: int | None) -> int | None:
    """`since` rounded down to its UTC day: partitions are days, so a window is whole days."""
    return None if since_ns is None else since_ns - since_ns % _DAY_NS


def _day(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc).strftime("%Y-%m-%d")


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


def certificate_rows(cert: Certificate, key: str) -> pa.Table:
    """One row per (agent, perturbation) cell of a certificate; the whole cell rides along as JSON.

    The named columns are the ones a warehouse filters and joins by; the rest of a cell (gate bounds, pass^k, …) is
    in `cell`, as the certificate file holds it.
    """
    spec, provenance = cert.spec, cert.provenance
    rows = [
        {"certificate": key, "spec_name": spec.name, "spec_hash": spec.hash, "evidence_sha256": provenance.evidence_sha256,
         "generated_at": provenance.generated_at, "agent": cell.agent, "perturbation": cell.perturbation, "n": cell.n,
         "conforming": cell.conforming, "lower": cell.lower, "upper": cell.upper, "missing": cell.missing,
         "unexposed": cell.unexposed, "cell": orjson.dumps(cell.to_dict()).decode(),
         "date": provenance.generated_at[:10] or None, "service": cell.agent.split("@", 1)[0] or None}
        for cell in cert.cells
    ]
    schema = pa.schema([("certificate", pa.string()), ("spec_name", pa.string()), ("spec_hash", pa.string()),
                        ("evidence_sha256", pa.string()), ("generated_at", pa.string()), ("agent", pa.string()),
                        ("perturbation", pa.string()), ("n", pa.int64()), ("conforming", pa.int64()), ("lower", pa.float64()),
                        ("upper", pa.float64()), ("missing", pa.int64()), ("unexposed", pa.int64()), ("cell", pa.string()),
                        ("date", pa.string()), ("service", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def _read_certificate(path: str | Path) -> tuple[Certificate, str]:
    """The certificate file at `path` as the typed model, and its key (the file's content hash); an unreadable or
    invalid file raises `CertificateError` naming the file and the field."""
    cert = load_certificate(path)
    return cert, hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _export_certificate(store: Reader, cert: Certificate, key: str, staging: Path, out: Path) -> int:
    written = store.copy_to_parquet(certificate_rows(cert, key), None, staging / CERT_TABLE, pattern=f"cert-{key}-{{i}}")
    dest = out / CERT_TABLE
    for old in dest.glob(f"**/cert-{key}-*.parquet"):
        old.unlink()
    for new in (staging / CERT_TABLE).glob("**/*.parquet"):
        target = dest / new.relative_to(staging / CERT_TABLE)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(new), str(target))
    return written


def export_parquet(store: Reader, out: str | Path, since_ns: int | None = None,
                   certificate: str | Path | None = None) -> dict[str, int]:
    """Write the store's runs, steps and violations (and the cells of the certificate file `certificate`) under `out`;
    rows per table.

    The store should be assembled first (`open_assembled`): the export reads trajectories. A certificate file the
    typed model cannot read raises `report.CertificateError` (an `InputError`) naming the file and the field, before
    anything is written.
    """
    cert = None if certificate is None else _read_certificate(certificate)  # refused before any table is replaced
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = window_start(since_ns)
    staging = out / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    written: dict[str, int] = {}
    try:
        for table in STORE_TABLES:
            written[table] = store.copy_to_parquet(table, start, staging / table)
        for table in STORE_TABLES:
            _replace_days(staging / table, out / table, None if start is None else _day(start))
        if cert is not None:
            written[CERT_TABLE] = _export_certificate(store, *cert, staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


__all__ = ["CERT_TABLE", "STORE_TABLES", "certificate_rows", "export_parquet", "window_start"]
