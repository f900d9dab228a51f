"""`plumbline export --format parquet`: the store's counts come back through DuckDB and pyarrow; re-exports never duplicate."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as ds
from click.testing import CliRunner
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from plumbline_otel.cli.main import cli

SPEC = """
version: 1
name: export
invariants:
  - id: MUST-PAY
    severity: critical
    must_call: schedule_payment
"""
TABLES = ("trajectories", "steps", "violations", "certificate_cells")


def _ns(day: str, second: int) -> int:
    return int(datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp() + second) * 1_000_000_000


def _trace_file(path: Path, service: str, day: str, runs: int, prefix: str) -> Path:
    """`runs` agent runs started on `day` (odd ones pay, even ones do not), made by the real SDK, as an OTLP protobuf file."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.export")
    for i in range(runs):
        start = _ns(day, 3600 + 60 * i)
        root = tracer.start_span("invoke_agent payer", start_time=start, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": f"{prefix}-{i}"})
        tools = [("lookup_invoice", {"invoice_id": f"INV-{i}"}), *([("schedule_payment", {"amount": 10.5 * i})] if i % 2 else [])]
        for k, (name, args) in enumerate(tools):
            step = tracer.start_span(f"execute_tool {name}", context=trace.set_span_in_context(root), start_time=start + (k + 1) * 1000,
                                     attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                                 "gen_ai.tool.call.id": f"call_{k}", "gen_ai.tool.call.arguments": json.dumps(args),
                                                 "gen_ai.tool.call.result": json.dumps({"ok": True})})
            step.end(end_time=start + (k + 1) * 1000 + 500)
        root.end(end_time=start + 10_000)
    provider.shutdown()
    path.write_bytes(encode_spans(memory.get_finished_spans()).SerializeToString())
    return path


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code in (0, 3), result.output
    return result.stdout


def _store_counts(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        one = lambda sql: con.execute(sql).fetchall()[0][0]  # noqa: E731
        return {"trajectories": one("SELECT count(*) FROM trajectories"), "steps": one("SELECT sum(n_steps) FROM trajectories"),
                "violations": one("SELECT count(*) FROM violations")}


def _read_duckdb(out: Path, table: str, what: str = "count(*)", rest: str = "") -> Any:
    """The README's query: another engine reading the dataset by its folder."""
    with duckdb.connect() as con:
        return con.execute(f"SELECT {what} FROM read_parquet('{out}/{table}/**/*.parquet', hive_partitioning = true) {rest}").fetchall()


def _read_pyarrow(out: Path, table: str) -> int:
    return ds.dataset(out / table, format="parquet", partitioning="hive").count_rows()


def test_export_round_trips_through_duckdb_and_pyarrow_and_a_window_rerun_replaces_its_days(tmp_path: Path) -> None:
    db, out, spec, cert = tmp_path / "store.duckdb", tmp_path / "lake", tmp_path / "spec.yaml", tmp_path / "cert.json"
    spec.write_text(SPEC)
    _invoke("ingest", "--db", str(db), str(_trace_file(tmp_path / "a.pb", "payer", "2026-11-30", 4, "a")),
            str(_trace_file(tmp_path / "b.pb", "payer", "2026-12-01", 3, "b")),
            str(_trace_file(tmp_path / "c.pb", "team/payer v2", "2026-12-01", 2, "c")))
    _invoke("check", "--db", str(db), "--spec", str(spec))
    _invoke("certify", "--db", str(db), "--spec", str(spec), "--out", str(cert), "--format", "none")
    store = _store_counts(db)
    assert store == {"trajectories": 9, "steps": 13, "violations": 5}  # 9 runs, 13 tool calls; 5 never paid
    cells = sum(len(a["perturbations"]) for a in json.loads(cert.read_text())["agents"])

    printed = _invoke("export", "--format", "parquet", "--out", str(out), "--db", str(db), "--cert", str(cert))
    expected = {**store, "certificate_cells": cells}
    assert printed.splitlines() == [f"{table}: {expected[table]} rows" for table in TABLES]
    for table in TABLES:
        assert _read_duckdb(out, table)[0][0] == _read_pyarrow(out, table) == expected[table], table
    assert sorted(p.relative_to(out / "trajectories").as_posix() for p in (out / "trajectories").glob("*/*")) == [
        "date=2026-11-30/service=payer", "date=2026-12-01/service=payer", "date=2026-12-01/service=team%2Fpayer%20v2"]
    assert _read_duckdb(out, "trajectories", "service, count(*)", "GROUP BY service ORDER BY service") == [("payer", 7), ("team/payer v2", 2)]
    steps = _read_duckdb(out, "steps", "run, index, kind, name, arguments, result, error, source", "ORDER BY step_start_ns")
    assert steps[0][1:] == (0, "tool_call", "lookup_invoice", '{"invoice_id":"INV-0"}', '{"ok":true}', None, "tool_span")
    assert json.loads(steps[2][4]) == {"amount": 10.5} and steps[2][1] == 1  # run 1: lookup, then pay
    untouched = {p: p.stat().st_mtime_ns for p in (out / "trajectories" / "date=2026-11-30").rglob("*.parquet")}

    _invoke("ingest", "--db", str(db), str(_trace_file(tmp_path / "d.pb", "payer", "2026-12-01", 1, "late")))
    _invoke("export", "--out", str(out), "--db", str(db), "--since", "2026-12-01T12:00Z", "--cert", str(cert))
    assert _read_duckdb(out, "trajectories")[0][0] == _read_pyarrow(out, "trajectories") == store["trajectories"] + 1
    assert _read_duckdb(out, "steps")[0][0] == store["steps"] + 1
    assert _read_duckdb(out, "violations")[0][0] == store["violations"]  # the late run was never checked
    assert _read_pyarrow(out, "certificate_cells") == cells  # the same certificate replaces its own files
    assert {p: p.stat().st_mtime_ns for p in (out / "trajectories" / "date=2026-11-30").rglob("*.parquet")} == untouched
    assert not list(out.glob(".staging-*"))

    _invoke("export", "--out", str(out), "--db", str(db))  # the whole store again: still no duplicate
    assert _read_duckdb(out, "trajectories", "count(*), count(DISTINCT run)")[0] == (10, 10)
