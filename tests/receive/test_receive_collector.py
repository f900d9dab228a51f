"""A real collector in the middle: SDK → rotel (OTLP in) → rotel's OTLP exporter → plumbline serve → store."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from receive_support import ServeProcess, finished_spans, free_port, span_key, stored_span_keys
from waits import EVENT_DEADLINE_S

from plumbline_otel.api.client import PlumblineClient
from plumbline_otel.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

rotel = pytest.importorskip("rotel", reason="rotel (pip install rotel) ships the collector binary this test runs")


def _rotel(tmp_path: Path, grpc_port: int, http_port: int, exporter_endpoint: str, protocol: str) -> subprocess.Popen[bytes]:
    binary = Path(rotel.__file__).parent / "rotel-agent"
    command = [str(binary), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}", "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
               "--exporter", "otlp", "--otlp-exporter-endpoint", exporter_endpoint, "--otlp-exporter-protocol", protocol,
               "--batch-timeout", "100ms", "--pid-file", str(tmp_path / f"rotel-{protocol}.pid"), "--log-file", str(tmp_path / f"rotel-{protocol}.log")]
    log = open(tmp_path / f"rotel-{protocol}.out", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=log)
    time.sleep(0.5)
    assert process.poll() is None, (tmp_path / f"rotel-{protocol}.out").read_text()
    return process


def _wait_stored(address: str, expected: int, timeout: float = EVENT_DEADLINE_S) -> int:
    deadline = time.monotonic() + timeout
    stored = 0
    with PlumblineClient(address) as client:
        while time.monotonic() < deadline:
            stored = client.health()["spans_stored"]
            if stored >= expected:
                break
            time.sleep(0.2)
    return stored


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_through_rotel_lands_in_plumbline_as_trajectories(tmp_path: Path, protocol: str) -> None:
    with ServeProcess(tmp_path, "--assemble-interval", "0.2") as server:
        target = f"http://{server.grpc_address}" if protocol == "grpc" else f"http://127.0.0.1:{server.http_port}"
        collector_port = free_port()
        collector = _rotel(tmp_path, collector_port, free_port(), target, protocol)
        try:
            spans = finished_spans(4, service=f"via-rotel-{protocol}", prefix=protocol)
            exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{collector_port}", insecure=True, timeout=EVENT_DEADLINE_S)  # retried until rotel listens
            assert exporter.export(spans) == SpanExportResult.SUCCESS
            exporter.shutdown()
            assert _wait_stored(server.grpc_address, len(spans)) == len(spans)
        finally:
            collector.send_signal(signal.SIGTERM)
            collector.wait(EVENT_DEADLINE_S)
        assert server.stop() == 0
    assert {span_key(s) for s in spans} == set(stored_span_keys(server.db))
    with Store(server.db, read_only=True) as store:
        trajectories = list(store.trajectories(service=f"via-rotel-{protocol}"))
    assert sorted(str(t.task_key) for t in trajectories) == [f"{protocol}-{i}" for i in range(4)]
    assert all([s.name for s in t.tool_steps] == ["lookup_invoice"] for t in trajectories)
