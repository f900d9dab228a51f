"""A full disk under `plumbline serve` (issue 30 item 5): DuckDB invalidates the database when a checkpoint
cannot be written. The server must say so (health, metrics), push back without a flood of log, attach
the file again once there is room, and lose nothing it acknowledged.

The disk is a small tmpfs mounted for the test (root only: skipped elsewhere), grown once it is full.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from receive_support import ServeProcess, query
from waits import EVENT_DEADLINE_S

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _request(spans: int) -> tuple[bytes, list[tuple[str, str]]]:
    """`spans` spans of one trace, ~6 KB each and barely compressible, and their keys."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = "disk"
    scope = resource_spans.scope_spans.add()
    trace_id = os.urandom(16)
    keys = []
    for i in range(spans):
        span_id = os.urandom(8)
        span = scope.spans.add(trace_id=trace_id, span_id=span_id, name=f"step {i}", start_time_unix_nano=1 + i, end_time_unix_nano=2 + i)
        span.attributes.add(key="gen_ai.input.messages").value.string_value = os.urandom(3000).hex()
        keys.append((trace_id.hex(), span_id.hex()))
    return request.SerializeToString(), keys


def _post(port: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=EVENT_DEADLINE_S)  # an answer, however slow
    try:
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=EVENT_DEADLINE_S)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _grpc_health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=EVENT_DEADLINE_S)
        return int(answer.status)


def test_a_full_disk_is_reported_backed_off_and_recovered_from_without_losing_an_acknowledged_span(small_disk: Path) -> None:
    server = ServeProcess(small_disk.parent, "--workers", "0", db=small_disk / "plumbline.duckdb")
    server.log_path = small_disk.parent / "serve.log"  # off the full disk
    with server.start():
        acknowledged: list[tuple[str, str]] = []
        refused = None
        for _ in range(150):  # 40 MiB fills after ~50 requests of 100 spans (the checkpoint cannot be written)
            body, keys = _request(100)
            status, _, answer = _post(server.http_port, body)
            if status != 200:
                refused = (body, keys, status, answer)
                break
            acknowledged.extend(keys)
        assert refused is not None, "the disk never filled"
        assert refused[2] == 503

        # the store is unusable: health and metrics say so, clients are pushed back, the log stays quiet
        time.sleep(0.5)
        status, health = _get(server.http_port, "/healthz")
        assert status == 503 and "store unusable" in health
        metrics = _get(server.http_port, "/metrics")[1]
        assert re.search(r"^plumbline_store_usable 0", metrics, re.M)
        assert re.search(r"^plumbline_store_invalidated_total 1", metrics, re.M)
        assert _grpc_health(server.grpc_address) == health_pb2.HealthCheckResponse.NOT_SERVING
        status, headers, answer = _post(server.http_port, _request(5)[0])
        assert status == 503 and "retry-after" in headers and b"unusable" in answer
        assert str(small_disk).encode() not in answer and str(small_disk).encode() not in refused[3], "a client was told where the store is"
        logged = server.log_path.stat().st_size
        time.sleep(3)
        assert server.log_path.stat().st_size - logged < 8_000, "the writer logs in a loop while the store is unusable"

        # room again: the store is attached again (at the backoff's next try: 1, 2, 4, 8 ... s) and serves; the wait
        # ends when health says so, its deadline only bounds a hang
        subprocess.run(["mount", "-o", "remount,size=400m", str(small_disk)], check=True)
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while _get(server.http_port, "/healthz")[0] != 200:
            assert time.monotonic() < deadline, f"the store was not attached again once there was room:\n{server.output()[-2000:]}"
            time.sleep(0.5)
        assert _grpc_health(server.grpc_address) == health_pb2.HealthCheckResponse.SERVING
        assert _post(server.http_port, refused[0])[0] == 200  # the refused request, retried
        acknowledged.extend(refused[1])
        body, keys = _request(100)
        assert _post(server.http_port, body)[0] == 200
        acknowledged.extend(keys)
        metrics = _get(server.http_port, "/metrics")[1]
        assert re.search(r"^plumbline_store_usable 1", metrics, re.M)
        assert re.search(r"^plumbline_store_reattached_total 1", metrics, re.M)
        assert server.stop() == 0

    stored = query(server.db, "SELECT trace_id, span_id FROM spans")
    assert len(stored) == len(set(stored)), "a span was stored twice (the retry of a commit reported failed but durable)"
    assert set(acknowledged) <= set(stored), f"{len(set(acknowledged) - set(stored))} acknowledged spans were lost"
    assert "Traceback" not in server.output().split("the store is usable again")[-1]
