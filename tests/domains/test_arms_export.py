"""Where the arms' traces go: OTLP JSON lines, OTLP/HTTP, OTLP/gRPC; and `plumbline domain run`.

The endpoints are real servers on 127.0.0.1 (stdlib HTTP, grpcio) receiving what the real OTLP
exporters send.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from domains.accounts_payable.run import run_domain
from plumbline_otel.cli.main import cli

HEX32 = set("0123456789abcdef")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests use the simulated model whatever the developer's environment holds."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)


def _requests_from_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _spans(requests: list[Any]) -> list[Any]:
    return [s for r in requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _parse_otlp_json(obj: dict[str, Any]) -> trace_service_pb2.ExportTraceServiceRequest:
    """OTLP JSON (hex ids) -> protobuf, converting ids back to the proto3-JSON base64 form."""
    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId")
                        else fix(v)) for k, v in node.items()}
        return [fix(v) for v in node] if isinstance(node, list) else node
    return json_format.ParseDict(fix(obj), trace_service_pb2.ExportTraceServiceRequest())


def test_otlp_json_lines_file_is_what_a_collector_file_exporter_writes(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    summary = run_domain("plan_execute_retry", "INV-1001,INV-1013", otlp_file=path, fault="check_duplicate:503")
    assert summary.passed == 2
    lines = _requests_from_jsonl(path)
    assert len(lines) >= 2  # flushed after every trial: at least one line per trace
    for obj in lines:
        for rs in obj["resourceSpans"]:
            resource = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            assert resource["service.name"] == {"stringValue": "ap-agent-plan_execute_retry"}
            for span in rs["scopeSpans"][0]["spans"]:
                assert len(span["traceId"]) == 32 and set(span["traceId"]) <= HEX32
                assert len(span["spanId"]) == 16 and set(span["spanId"]) <= HEX32
                assert isinstance(span["kind"], int)
    spans = _spans([_parse_otlp_json(obj) for obj in lines])
    assert {format(int.from_bytes(s.trace_id, "big"), "032x") for s in spans} == {
        r.trace_id for r in summary.results}
    errors = [s for s in spans if s.status.code == 2]
    assert [s.name for s in errors] == ["execute_tool check_duplicate"] * 2


class _OtlpHttpSink(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).received.append(body if self.path == "/v1/traces" else b"")
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class _OtlpGrpcSink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.received: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request, context):  # noqa: N802 - generated name
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def http_sink() -> Iterator[tuple[str, list[bytes]]]:
    _OtlpHttpSink.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpHttpSink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", _OtlpHttpSink.received
    server.shutdown()
    server.server_close()


@pytest.fixture
def grpc_sink() -> Iterator[tuple[str, _OtlpGrpcSink]]:
    sink = _OtlpGrpcSink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", sink
    server.stop(grace=None)


def test_traces_reach_an_otlp_http_endpoint(http_sink) -> None:
    url, received = http_sink
    summary = run_domain("react", "INV-1020", endpoint=url)
    requests = [trace_service_pb2.ExportTraceServiceRequest.FromString(b) for b in received]
    names = [s.name for s in _spans(requests)]
    assert "invoke_agent react" in names and "execute_tool flag_exception" in names
    assert summary.results[0].passed


def test_traces_reach_an_otlp_grpc_endpoint(grpc_sink) -> None:
    url, sink = grpc_sink
    summary = run_domain("plan_execute", "INV-1007", endpoint=url, repeats=2)
    spans = _spans(sink.received)
    roots = [s for s in spans if s.name == "invoke_agent plan_execute"]
    assert len(roots) == 2 and summary.passed == 2
    trial_ids = sorted(next(a.value.string_value for a in s.attributes if a.key == "plumbline.trial.id")
                       for s in roots)
    assert trial_ids == ["ap-plan_execute-seed0/INV-1007/baseline/0/k0", "ap-plan_execute-seed0/INV-1007/baseline/0/k1"]


def test_cli_runs_an_arm_and_prints_outcomes_against_ground_truth(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    traces = tmp_path / "t.jsonl"
    out = CliRunner().invoke(cli, ["domain", "run", "accounts_payable", "--arm", "plan_execute",
                                   "--task", "INV-1001,INV-1007", "--fault", "check_duplicate:503",
                                   "--otlp-file", str(traces), "--results", str(results)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("INV-1001   FAIL  expected pay 2,909.88 GBP (ap_clerk)  observed hold")
    assert "fault fired at step 5" in lines[0]
    assert any(line.startswith("INV-1007   FAIL  expected hold PRICE_VARIANCE") for line in lines)
    assert lines[-1].startswith("plan_execute: 0/2 passed (0.0%); model simulated-ap-policy-v1 (simulated)")
    assert "fault check_duplicate:503:1:1 fired in 2/2 trials" in lines[-1]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["task_id"], r["fault_fired"], r["passed"]) for r in rows] == [
        ("INV-1001", True, False), ("INV-1007", True, False)]
    assert traces.stat().st_size > 0


def test_cli_rejects_bad_faults_and_imperfections() -> None:
    runner = CliRunner()
    bad_fault = runner.invoke(cli, ["domain", "run", "accounts_payable", "--arm", "react", "--task", "INV-1001",
                                    "--fault", "check_duplicate:500"])
    assert bad_fault.exit_code == 2 and "not one of 503, 429, timeout, connection_reset" in bad_fault.output
    bad_task = runner.invoke(cli, ["domain", "run", "accounts_payable", "--arm", "react", "--task", "INV-9999"])
    assert bad_task.exit_code == 2 and "unknown task INV-9999" in bad_task.output
