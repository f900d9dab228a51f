"""Bad requests get the OTLP answer (400/413/415/405, INVALID_ARGUMENT, partial success) and the server keeps serving."""

from __future__ import annotations

import gzip
import http.client
import json
import os
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from receive_support import ServeProcess, query
from waits import EVENT_DEADLINE_S

pytestmark = pytest.mark.slow

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _request(n_good: int, bad_span_id: bool = False, service: str = "bad-requests") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    attr = resource_spans.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", service
    spans = resource_spans.scope_spans.add().spans
    trace_id = os.urandom(16)
    for i in range(n_good):
        spans.add(trace_id=trace_id, span_id=os.urandom(8), name=f"good {i}", start_time_unix_nano=1, end_time_unix_nano=2)
    if bad_span_id:
        spans.add(trace_id=trace_id, span_id=b"\x01" * 7, name="bad id", start_time_unix_nano=1, end_time_unix_nano=2)
    return request


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("bad")
    process = ServeProcess(tmp, "--max-request-body-size-mib", "1", "--max-recv-msg-size-mib", "1").start()
    yield process
    if process.proc and process.proc.poll() is None:
        process.kill()


def _http(server: ServeProcess, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=EVENT_DEADLINE_S)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _grpc_export(server: ServeProcess, body: bytes) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(server.grpc_address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        export = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString)
        return export(body, timeout=EVENT_DEADLINE_S)


def test_http_undecodable_protobuf_is_400_with_a_status_in_protobuf(server: ServeProcess) -> None:
    status, headers, body = _http(server, "POST", "/v1/traces", b"\xff\xff\xff\xff", {"Content-Type": "application/x-protobuf"})
    assert status == 400 and headers["content-type"] == "application/x-protobuf"
    message = status_pb2.Status.FromString(body)
    assert message.code == 3 and "request" in message.message


def test_http_invalid_json_is_400_with_a_json_status(server: ServeProcess) -> None:
    status, headers, body = _http(server, "POST", "/v1/traces", b"{not json", {"Content-Type": "application/json; charset=utf-8"})
    assert status == 400 and headers["content-type"] == "application/json"
    assert "invalid JSON" in json.loads(body)["message"]


def test_http_partial_success_counts_rejected_spans_and_keeps_the_good_ones(server: ServeProcess) -> None:
    request = _request(2, bad_span_id=True, service="partial-http")
    status, _, body = _http(server, "POST", "/v1/traces", request.SerializeToString(), {"Content-Type": "application/x-protobuf"})
    assert status == 200
    partial = ExportTraceServiceResponse.FromString(body).partial_success
    assert partial.rejected_spans == 1 and "span id" in partial.error_message


def test_http_json_partial_success_is_camel_case_with_string_count(server: ServeProcess) -> None:
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "partial-json"}}]},
                              "scopeSpans": [{"spans": [
                                  {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "good", "startTimeUnixNano": "1", "endTimeUnixNano": "2"},
                                  {"traceId": "zz", "spanId": "ef" * 8, "name": "bad trace id"}]}]}]}
    status, _, body = _http(server, "POST", "/v1/traces", json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert status == 200
    partial = json.loads(body)["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and partial["errorMessage"]


def test_http_truncated_protobuf_keeps_the_spans_before_the_cut(server: ServeProcess) -> None:
    data = _request(3, service="truncated").SerializeToString()
    status, _, body = _http(server, "POST", "/v1/traces", data[:-10], {"Content-Type": "application/x-protobuf"})
    assert status == 200
    assert ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 1


def test_http_unknown_content_type_is_415(server: ServeProcess) -> None:
    status, _, body = _http(server, "POST", "/v1/traces", b"hello", {"Content-Type": "text/plain"})
    assert status == 415 and "Content-Type" in json.loads(body)["message"]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_http_non_post_on_an_export_path_is_405(server: ServeProcess, method: str) -> None:
    status, headers, _ = _http(server, method, "/v1/traces")
    assert status == 405 and headers["allow"] == "POST"


def test_http_unknown_path_is_404(server: ServeProcess) -> None:
    status, _, _ = _http(server, "POST", "/v2/traces", b"", {"Content-Type": "application/x-protobuf"})
    assert status == 404


def test_http_body_over_the_limit_is_413(server: ServeProcess) -> None:
    status, _, _ = _http(server, "POST", "/v1/traces", b"\0" * (2 << 20), {"Content-Type": "application/x-protobuf"})
    assert status == 413


def test_http_gzip_bomb_is_413_after_decompression(server: ServeProcess) -> None:
    bomb = gzip.compress(b"\0" * (8 << 20))
    assert len(bomb) < 1 << 20
    status, _, _ = _http(server, "POST", "/v1/traces", bomb, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    assert status == 413


def test_http_unknown_content_encoding_is_400(server: ServeProcess) -> None:
    status, _, body = _http(server, "POST", "/v1/traces", b"x", {"Content-Type": "application/x-protobuf", "Content-Encoding": "br"})
    assert status == 400 and b"Content-Encoding" in body


def test_http_empty_request_is_success(server: ServeProcess) -> None:
    status, _, body = _http(server, "POST", "/v1/traces", b"", {"Content-Type": "application/x-protobuf"})
    assert status == 200 and body == b""


def test_grpc_undecodable_request_is_invalid_argument(server: ServeProcess) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _grpc_export(server, b"\xff\xff\xff\xff")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and caught.value.details()


def test_grpc_partial_success_counts_rejected_spans(server: ServeProcess) -> None:
    response = _grpc_export(server, _request(2, bad_span_id=True, service="partial-grpc").SerializeToString())
    assert response.partial_success.rejected_spans == 1 and response.partial_success.error_message


def test_grpc_message_over_the_limit_is_resource_exhausted(server: ServeProcess) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _grpc_export(server, b"\n" + b"\0" * (2 << 20))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_http_json_damage_costs_only_what_it_touches(server: ServeProcess) -> None:
    """A number past a double's range costs its span, invalid UTF-8 a replaced character: the request
    is a partial success, not a 400 (issue 30 item 8)."""
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "damaged-json"}}]},
                              "scopeSpans": [{"spans": [
                                  {"traceId": "ab" * 16, "spanId": "c1" * 8, "name": "good NAME", "startTimeUnixNano": "1", "endTimeUnixNano": "2"},
                                  {"traceId": "ab" * 16, "spanId": "c2" * 8, "name": "huge", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
                                   "attributes": [{"key": "ratio", "value": {"doubleValue": 0.5}}]},
                                  {"traceId": "00" * 16, "spanId": "c3" * 8, "name": "zero trace id"}]}]}]}
    body = json.dumps(doc).encode().replace(b'"doubleValue": 0.5', b'"doubleValue": 1e400').replace(b"NAME", b"\xff")
    status, _, answer = _http(server, "POST", "/v1/traces", body, {"Content-Type": "application/json"})
    assert status == 200, answer
    partial = json.loads(answer)["partialSuccess"]
    assert partial["rejectedSpans"] == "2"
    assert "out of the range" in partial["errorMessage"] and "all zeros" in partial["errorMessage"] and "UTF-8" in partial["errorMessage"]


def test_server_is_still_healthy_after_every_bad_request_and_kept_the_good_spans(server: ServeProcess) -> None:
    status, _, body = _http(server, "GET", "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert server.stop() == 0
    counts = dict(query(server.db, "SELECT service_name, count(*) FROM spans GROUP BY 1"))
    assert counts == {"partial-http": 2, "partial-json": 1, "truncated": 2, "partial-grpc": 2, "damaged-json": 1}
    assert query(server.db, "SELECT name FROM spans WHERE service_name = 'damaged-json'") == [("good \ufffd",)]
    assert query(server.db, "SELECT count(*) FROM problems WHERE spans > 0")[0][0] >= 4
