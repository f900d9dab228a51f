"""Evaluation results out as `gen_ai.evaluation.result` log events, received by a real OTLP receiver (plumbline serve)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from receive_support import ServeProcess, agent_run, query
from waits import EVENT_DEADLINE_S, wait_for

from plumbline_otel import __version__
from plumbline_otel.cli.main import cli
from plumbline_otel.report import load_certificate

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SPEC = """
version: 1
name: payments
invariants:
  - id: MUST-PAY
    severity: critical
    must_call: schedule_payment
  - id: NO-DELETE
    severity: critical
    must_not_call: delete_invoice
"""
LOOKUP = ("lookup_invoice", {"invoice_id": "INV-1"}, {"status": "open"})
PAY = ("schedule_payment", {"amount": 12.5}, {"ok": True})
DELETE = ("delete_invoice", {"invoice_id": "INV-1"}, {"ok": True})
RUNS: dict[str, list[tuple[str, dict[str, Any], Any]]] = {"paid-0": [LOOKUP, PAY], "paid-1": [LOOKUP, PAY], "unpaid": [LOOKUP], "deleted": [LOOKUP, PAY, DELETE]}


def _store_with_runs(tmp_path: Path) -> Path:
    """Four runs of one agent made by the real SDK and ingested as an OTLP file: two conform, two do not."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "payer", "service.version": "2.1"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for task, tools in RUNS.items():
        agent_run(provider.get_tracer("tests"), task, tools)
    provider.shutdown()
    traces = tmp_path / "runs.pb"
    traces.write_bytes(encode_spans(memory.get_finished_spans()).SerializeToString())
    db = tmp_path / "runs.duckdb"
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(traces)])
    assert result.exit_code == 0, result.output
    return db


def _events(db: Path) -> list[dict[str, Any]]:
    rows = query(db, "SELECT event_name, trace_id, span_id, severity_text, service_name, scope_name, attributes FROM logs")
    return [{"event_name": r[0], "trace_id": r[1], "span_id": r[2], "severity": r[3], "service": r[4], "scope": r[5],
             **json.loads(r[6])} for r in rows]


def test_certify_emit_sends_every_cell_and_run_as_evaluation_events_linked_to_their_traces(tmp_path: Path) -> None:
    store = _store_with_runs(tmp_path)
    spec, cert_path = tmp_path / "spec.yaml", tmp_path / "cert.json"
    spec.write_text(SPEC)
    runs = {task: (trace, doc) for trace, task, doc in query(store, "SELECT trace_id, task_key, doc FROM trajectories")}
    with ServeProcess(tmp_path) as collector:
        for url in (f"grpc://{collector.grpc_address}", f"{collector.http_url}"):
            result = CliRunner().invoke(cli, ["certify", "--db", str(store), "--spec", str(spec), "--out", str(cert_path),
                                              "--format", "none", "--emit", url])
            assert result.exit_code == 0, result.output
            assert f"sent 5 gen_ai.evaluation.result events to {url}" in result.stderr
        assert collector.stop() == 0
    cert = load_certificate(cert_path)
    cell = cert.agents[0].perturbations[0]
    events = _events(collector.db)
    assert len(events) == 10  # (1 cell + 4 runs) by gRPC and again by HTTP
    common = {"event_name": "gen_ai.evaluation.result", "severity": "INFO", "service": "plumbline",
              "scope": "plumbline_otel.evaluation_events", "plumbline.evaluator.name": "plumbline",
              "gen_ai.evaluation.evaluator.id": "plumbline", "gen_ai.evaluation.evaluator.version": __version__,
              "gen_ai.evaluation.evaluator.type": "deterministic",
              "plumbline.evaluator.version": __version__, "plumbline.spec.name": "payments", "plumbline.spec.hash": cert.spec.hash,
              "plumbline.evidence.sha256": cert.provenance.evidence_sha256, "plumbline.cell.agent": "payer@2.1",
              "plumbline.cell.perturbation": "baseline", "plumbline.cell.n": 4, "plumbline.cell.conforming": 2,
              "plumbline.bound.lower": cell.gate_lower, "plumbline.bound.confidence": 0.95,
              "plumbline.target": 0.95}
    for event in events:
        assert {k: event.get(k) for k in common} == common
    cells = [e for e in events if e["gen_ai.evaluation.name"] == "plumbline.certificate.lower_bound"]
    assert len(cells) == 2
    for event in cells:
        assert event["gen_ai.evaluation.score.value"] == pytest.approx(common["plumbline.bound.lower"])
        assert event["gen_ai.evaluation.score.label"] == "fail"
        assert event["gen_ai.evaluation.explanation"].startswith("payer@2.1 under baseline: 2 of 4 runs hold every critical invariant")
        assert event["trace_id"] is None and event["span_id"] is None
        assert event["gen_ai.evaluation.score.ci.lower"] == pytest.approx(common["plumbline.bound.lower"])
        assert event["gen_ai.evaluation.score.ci.level"] == 0.95 and event["gen_ai.evaluation.score.ci.upper"] >= common["plumbline.bound.lower"]
    by_task: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["gen_ai.evaluation.name"] == "plumbline.critical_conformance":
            by_task.setdefault(event["plumbline.task.key"], []).append(event)
    assert sorted(by_task) == sorted(RUNS) and all(len(v) == 2 for v in by_task.values())
    for task, (trace_id, _doc) in runs.items():
        for event in by_task[task]:
            assert event["trace_id"] == trace_id and event["plumbline.run.id"] == trace_id
            passed = task.startswith("paid")
            assert (event["gen_ai.evaluation.score.value"], event["gen_ai.evaluation.score.label"]) == ((1.0, "pass") if passed else (0.0, "fail"))
    deleted_step = json.loads(runs["deleted"][1])["steps"][2]
    assert deleted_step["name"] == "delete_invoice"
    assert {e["span_id"] for e in by_task["deleted"]} == {deleted_step["span_id"]}  # linked to the step it blames
    assert all(e["gen_ai.evaluation.explanation"].startswith("violates NO-DELETE") for e in by_task["deleted"])
    assert {e["span_id"] for e in by_task["unpaid"]} == {None}  # "never called" blames no step: the trace alone
    assert all(e["gen_ai.evaluation.explanation"].startswith("violates MUST-PAY") for e in by_task["unpaid"])
    assert {e["span_id"] for e in by_task["paid-0"]} == {None}
    assert by_task["paid-0"][0]["gen_ai.evaluation.explanation"] == "holds every critical invariant of payments"


def test_certify_emit_to_a_dead_endpoint_says_how_many_events_were_lost(tmp_path: Path) -> None:
    from receive_support import free_port

    store = _store_with_runs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["certify", "--db", str(store), "--spec", str(spec), "--out", str(tmp_path / "c.json"),
                                      "--format", "none", "--emit", url])
    assert result.exit_code == 1
    assert f"{url}: 5 of 5 evaluation events were not accepted" in str(result.exception)
    assert (tmp_path / "c.json").exists()  # the certificate itself is written first


def _metric(server: ServeProcess, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=EVENT_DEADLINE_S) as response:
        lines = response.read().decode().splitlines()
    return next((float(line.split()[-1]) for line in lines if line.startswith(name + " ")), -1.0)


def _serve_checking(tmp_path: Path, spec: Path, collector: ServeProcess) -> ServeProcess:
    return ServeProcess(tmp_path, "--check-spec", str(spec), "--check-interval", "0.2", "--emit", f"grpc://{collector.grpc_address}",
                        db=tmp_path / "served.duckdb").start()


def test_serve_with_a_standing_check_emits_each_new_violation_once_linked_to_its_run(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    collector = ServeProcess(tmp_path / "first").start()
    server = _serve_checking(tmp_path, spec, collector)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "payer"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for task, tools in RUNS.items():
        agent_run(provider.get_tracer("tests"), task, tools)
    provider.shutdown()
    # Waits are for events (the export's answer, a metric), their deadlines only bound a hang: the exporter's
    # 10 s default dropped spans under load.
    exporter = OTLPSpanExporter(endpoint=server.grpc_address, insecure=True, timeout=EVENT_DEADLINE_S)
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    exporter.shutdown()
    wait_for(lambda: _metric(server, "plumbline_violations_found_total") >= 2, "two violations found")
    assert _metric(server, "plumbline_violations_found_total") == 2
    assert server.stop() == 0  # flushes the emitter
    assert collector.stop() == 0
    runs = {task: (trace, json.loads(doc)) for trace, task, doc in query(server.db, "SELECT trace_id, task_key, doc FROM trajectories")}
    assert sorted(query(server.db, "SELECT task_key, invariant_id FROM violations")) == [("deleted", "NO-DELETE"), ("unpaid", "MUST-PAY")]
    events = {e["plumbline.task.key"]: e for e in _events(collector.db)}
    assert sorted(events) == ["deleted", "unpaid"]
    spec_hash = query(server.db, "SELECT DISTINCT spec_hash FROM violations")[0][0]
    for task, invariant in (("deleted", "NO-DELETE"), ("unpaid", "MUST-PAY")):
        event, (trace_id, _doc) = events[task], runs[task]
        assert {k: event[k] for k in ("event_name", "gen_ai.evaluation.name", "gen_ai.evaluation.score.value", "gen_ai.evaluation.score.label",
                                      "plumbline.invariant.id", "plumbline.invariant.severity", "plumbline.spec.name", "plumbline.spec.hash",
                                      "plumbline.run.id", "plumbline.cell.agent", "plumbline.cell.perturbation", "plumbline.evaluator.name",
                                      "plumbline.evaluator.version", "trace_id")} == {
            "event_name": "gen_ai.evaluation.result", "gen_ai.evaluation.name": "plumbline.invariant", "gen_ai.evaluation.score.value": 0.0,
            "gen_ai.evaluation.score.label": "fail", "plumbline.invariant.id": invariant, "plumbline.invariant.severity": "critical",
            "plumbline.spec.name": "payments", "plumbline.spec.hash": spec_hash, "plumbline.run.id": trace_id, "plumbline.cell.agent": "payer",
            "plumbline.cell.perturbation": "baseline", "plumbline.evaluator.name": "plumbline", "plumbline.evaluator.version": __version__,
            "trace_id": trace_id}
        assert event["gen_ai.evaluation.explanation"].startswith(f"violates {invariant} (critical): ")
    assert events["deleted"]["span_id"] == runs["deleted"][1]["steps"][2]["span_id"]
    assert events["unpaid"]["span_id"] is None

    second = ServeProcess(tmp_path / "second").start()  # a restart re-reads every run and finds nothing new to send
    again = _serve_checking(tmp_path, spec, second)
    wait_for(lambda: _metric(again, "plumbline_runs_checked_total") >= 4, "the four runs checked again")
    assert _metric(again, "plumbline_runs_checked_total") == 4
    assert _metric(again, "plumbline_violations_found_total") == 0
    assert again.stop() == 0 and second.stop() == 0
    assert query(second.db, "SELECT count(*) FROM logs")[0][0] == 0
