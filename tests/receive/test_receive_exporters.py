"""Real OTLP exporters (SDK over gRPC and HTTP, OTLP JSON, logs) into `plumbline serve`, then the store."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp import to_otlp_json
from receive_support import ServeProcess, finished_spans, query, span_key
from waits import EVENT_DEADLINE_S

from plumbline_otel.api.client import PlumblineClient
from plumbline_otel.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _logs_request(service: str, trace_id: bytes, span_id: bytes) -> logs_service_pb2.ExportLogsServiceRequest:
    request = logs_service_pb2.ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    attr = resource_logs.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", service
    scope_logs = resource_logs.scope_logs.add()
    event = scope_logs.log_records.add(trace_id=trace_id, span_id=span_id, time_unix_nano=1, event_name="gen_ai.user.message")
    event.body.kvlist_value.values.add(key="content").value.string_value = "Pay INV-7"
    scope_logs.log_records.add(time_unix_nano=2, event_name="http.request").body.string_value = "not ours"
    return request


def _post(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=EVENT_DEADLINE_S) as response:
        return response.status, response.read()


@dataclass
class Scenario:
    db: Path
    exit_code: int
    sent: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """One server; every exporter sends to it; the API is read while it serves; then SIGTERM."""
    tmp = tmp_path_factory.mktemp("exporters")
    server = ServeProcess(tmp, "--assemble-interval", "0.2").start()
    out = Scenario(db=server.db, exit_code=-1)
    try:
        spans = finished_spans(3, service="agent-grpc", prefix="grpc")
        exporter = GrpcSpanExporter(endpoint=f"http://{server.grpc_address}", insecure=True, compression=grpc.Compression.Gzip,
                                    timeout=EVENT_DEADLINE_S)  # the 10 s default dropped spans under load
        out.results["grpc"] = exporter.export(spans)
        exporter.shutdown()
        out.sent["agent-grpc"] = [span_key(s) for s in spans]

        spans = finished_spans(3, service="agent-http", prefix="http")
        http_exporter = HttpSpanExporter(endpoint=f"{server.http_url}/v1/traces", compression=Compression.Gzip, timeout=EVENT_DEADLINE_S)
        out.results["http"] = http_exporter.export(spans)
        http_exporter.shutdown()
        out.sent["agent-http"] = [span_key(s) for s in spans]

        spans = finished_spans(2, service="agent-json", prefix="json")
        body = json.dumps(to_otlp_json(encode_spans(spans))).encode()
        out.results["json"] = _post(f"{server.http_url}/v1/traces", body, "application/json")
        out.sent["agent-json"] = [span_key(s) for s in spans]

        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = logs_service_pb2_grpc.LogsServiceStub(channel)
            out.results["logs_grpc"] = stub.Export(_logs_request("agent-grpc", b"\x01" * 16, b"\x02" * 8), timeout=EVENT_DEADLINE_S)
        logs_json = to_otlp_json(_logs_request("agent-http", b"\x03" * 16, b"\x04" * 8))
        out.results["logs_http"] = _post(f"{server.http_url}/v1/logs", json.dumps(logs_json).encode(), "application/json")

        with PlumblineClient(server.grpc_address) as client:
            out.results["api_trajectories"] = list(client.trajectories(service="agent-grpc"))
            out.results["api_limited"] = list(client.trajectories(limit=2))
            out.results["api_coverage"] = client.coverage()
            out.results["api_health"] = client.health()
        with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=EVENT_DEADLINE_S) as response:
            out.results["metrics"] = response.read().decode()
    finally:
        out.exit_code = server.stop()
    return out


def test_sigterm_drains_and_exits_zero(scenario: Scenario) -> None:
    assert scenario.exit_code == 0


def test_sdk_grpc_exporter_with_gzip_stores_every_span(scenario: Scenario) -> None:
    assert scenario.results["grpc"] == SpanExportResult.SUCCESS
    assert set(scenario.sent["agent-grpc"]) <= set(query(scenario.db, "SELECT trace_id, span_id FROM spans"))


def test_sdk_http_protobuf_exporter_with_gzip_stores_every_span(scenario: Scenario) -> None:
    assert scenario.results["http"] == SpanExportResult.SUCCESS
    assert set(scenario.sent["agent-http"]) <= set(query(scenario.db, "SELECT trace_id, span_id FROM spans"))


def test_otlp_json_post_answers_empty_json_object_and_stores_spans(scenario: Scenario) -> None:
    assert scenario.results["json"] == (200, b"{}")
    assert set(scenario.sent["agent-json"]) <= set(query(scenario.db, "SELECT trace_id, span_id FROM spans"))


def test_every_run_becomes_a_trajectory_with_its_tool_step(scenario: Scenario) -> None:
    with Store(scenario.db, read_only=True) as store:
        by_service: dict[str, list[Any]] = {}
        for trajectory in store.trajectories():
            by_service.setdefault(str(trajectory.service), []).append(trajectory)
    assert {k: len(v) for k, v in by_service.items()} == {"agent-grpc": 3, "agent-http": 3, "agent-json": 2}
    for trajectories in by_service.values():
        for t in trajectories:
            assert [(s.name, s.args) for s in t.tool_steps] == [("lookup_invoice", {"invoice_id": "INV-1"})]
    assert sorted(t.task_key for t in by_service["agent-json"]) == ["json-0", "json-1"]


def test_gen_ai_log_events_are_stored_keyed_by_trace_and_span(scenario: Scenario) -> None:
    assert not scenario.results["logs_grpc"].HasField("partial_success")
    assert scenario.results["logs_http"] == (200, b"{}")
    rows = query(scenario.db, "SELECT service_name, trace_id, span_id, event_name, body FROM logs ORDER BY service_name")
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("agent-grpc", "01" * 16, "02" * 8, "gen_ai.user.message"),
        ("agent-http", "03" * 16, "04" * 8, "gen_ai.user.message"),
    ]
    assert json.loads(rows[0][4]) == {"content": "Pay INV-7"}


def test_api_reads_trajectories_and_coverage_while_serving(scenario: Scenario) -> None:
    docs = scenario.results["api_trajectories"]
    assert sorted(d["task_key"] for d in docs) == ["grpc-0", "grpc-1", "grpc-2"]
    assert {"trajectory_id", "trace_id", "task_key", "service", "input", "final_output", "conventions", "steps"} <= set(docs[0])
    assert len(scenario.results["api_limited"]) == 2
    assert "overall" in scenario.results["api_coverage"]
    health = scenario.results["api_health"]
    assert health["status"] == "SERVING" and health["spans_stored"] == 16


def test_metrics_count_spans_and_requests_in_prometheus_text(scenario: Scenario) -> None:
    metrics = scenario.results["metrics"]
    assert "plumbline_spans_received_total 16" in metrics
    assert "plumbline_spans_stored_total 16" in metrics
    assert "plumbline_log_records_stored_total 2" in metrics
    assert 'plumbline_requests_total{outcome="ok",signal="traces",transport="grpc"} 1' in metrics
    assert "# TYPE plumbline_request_duration_seconds histogram" in metrics
    assert "plumbline_queue_spans 0" in metrics
