"""Bearer token and TLS on both transports, and content dropped or hashed before it is stored."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from receive_support import TOKEN, ServeProcess, finished_spans, query, self_signed_cert
from waits import EVENT_DEADLINE_S

from plumbline_otel.api.client import PlumblineClient
from plumbline_otel.errors import StoreError

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SECRET = "INV-SECRET-4820"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Path]]:
    tmp = tmp_path_factory.mktemp("secure")
    cert, key = self_signed_cert(tmp)
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "plumbline.yaml").write_text(f"""
auth:
  bearer_token_file: {tmp / 'token'}
tls:
  cert_file: {cert}
  key_file: {key}
content:
  drop: ["gen_ai.input.messages", "gen_ai.output.messages"]
  hash: ["gen_ai.tool.call.arguments", "gen_ai.tool.call.result"]
""")
    process = ServeProcess(tmp, "--config", str(tmp / "plumbline.yaml"), "--tls-cert", str(cert), "--tls-key", str(key)).start()
    yield process, cert
    if process.proc and process.proc.poll() is None:
        process.kill()


def _spans(prefix: str) -> list:
    spans = finished_spans(1, service=f"secure-{prefix}", prefix=prefix)
    for span in spans:  # put the secret where the content rules must catch it
        if "gen_ai.tool.call.arguments" in (span.attributes or {}):
            span._attributes = {**(span.attributes or {}), "gen_ai.tool.call.arguments": json.dumps({"invoice_id": SECRET})}
        if "gen_ai.input.messages" in (span.attributes or {}):
            span._attributes = {**(span.attributes or {}), "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": SECRET}]}])}
    return spans


def test_grpc_exporter_with_tls_and_token_succeeds(secure: tuple[ServeProcess, Path]) -> None:
    server, cert = secure
    credentials = grpc.ssl_channel_credentials(cert.read_bytes())
    exporter = GrpcSpanExporter(endpoint=f"https://{server.grpc_address}", credentials=credentials, headers={"authorization": f"Bearer {TOKEN}"},
                                 timeout=EVENT_DEADLINE_S)  # the 10 s default dropped spans under load
    assert exporter.export(_spans("grpc")) == SpanExportResult.SUCCESS
    exporter.shutdown()


def test_grpc_exporter_without_token_is_refused(secure: tuple[ServeProcess, Path]) -> None:
    server, cert = secure
    with grpc.secure_channel(server.grpc_address, grpc.ssl_channel_credentials(cert.read_bytes())) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as caught:
            export(b"", timeout=EVENT_DEADLINE_S, metadata=(("authorization", "Bearer wrong"),))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_grpc_health_answers_without_a_token(secure: tuple[ServeProcess, Path]) -> None:
    server, cert = secure
    with grpc.secure_channel(server.grpc_address, grpc.ssl_channel_credentials(cert.read_bytes())) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=EVENT_DEADLINE_S)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_http_exporter_with_tls_and_token_succeeds(secure: tuple[ServeProcess, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    server, cert = secure
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests lets these override the exporter's certificate_file
        monkeypatch.delenv(name, raising=False)
    exporter = HttpSpanExporter(endpoint=f"{server.http_url}/v1/traces", certificate_file=str(cert), headers={"Authorization": f"Bearer {TOKEN}"},
                                timeout=EVENT_DEADLINE_S)
    assert exporter.export(_spans("http")) == SpanExportResult.SUCCESS
    exporter.shutdown()


def test_http_without_token_is_401(secure: tuple[ServeProcess, Path]) -> None:
    server, cert = secure
    connection = http.client.HTTPSConnection("127.0.0.1", server.http_port, timeout=EVENT_DEADLINE_S, context=ssl.create_default_context(cafile=str(cert)))
    connection.request("POST", "/v1/traces", body=b"", headers={"Content-Type": "application/x-protobuf"})
    response = connection.getresponse()
    assert response.status == 401 and response.getheader("WWW-Authenticate") == "Bearer"
    connection.close()


def test_a_lower_case_bearer_scheme_is_accepted_on_both_transports(secure: tuple[ServeProcess, Path]) -> None:
    server, cert = secure
    with grpc.secure_channel(server.grpc_address, grpc.ssl_channel_credentials(cert.read_bytes())) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        export(b"", timeout=EVENT_DEADLINE_S, metadata=(("authorization", f"bearer {TOKEN}"),))  # an empty request: nothing stored
    connection = http.client.HTTPSConnection("127.0.0.1", server.http_port, timeout=EVENT_DEADLINE_S, context=ssl.create_default_context(cafile=str(cert)))
    connection.request("POST", "/v1/traces", body=b"", headers={"Content-Type": "application/x-protobuf", "Authorization": f"BEARER {TOKEN}"})
    assert connection.getresponse().status == 200
    connection.close()


def test_plain_http_to_the_tls_port_gets_no_answer(secure: tuple[ServeProcess, Path]) -> None:
    server, _ = secure
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=EVENT_DEADLINE_S)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        connection.request("POST", "/v1/traces", body=b"", headers={"Content-Type": "application/x-protobuf"})
        connection.getresponse().read()
    connection.close()


def test_api_client_needs_the_token_too(secure: tuple[ServeProcess, Path]) -> None:
    server, cert = secure
    with PlumblineClient(server.grpc_address, token=TOKEN, ca_file=str(cert)) as client:
        assert client.health()["status"] == "SERVING"
    with PlumblineClient(server.grpc_address, token="wrong", ca_file=str(cert)) as client:
        with pytest.raises(StoreError, match="UNAUTHENTICATED"):
            client.health()


def test_content_rules_drop_and_hash_before_anything_is_stored(secure: tuple[ServeProcess, Path]) -> None:
    server, _ = secure
    assert server.stop() == 0
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == 4
    leaked = query(server.db, "SELECT count(*) FROM spans s WHERE CAST(s AS VARCHAR) LIKE ?", [f"%{SECRET}%"])[0][0]
    assert leaked == 0
    args = query(server.db, "SELECT DISTINCT args_state, json_extract_string(attributes, '$.\"gen_ai.tool.call.arguments\"') FROM spans WHERE step_kind = 'tool_call'")
    assert len(args) == 1 and args[0][1].startswith("sha256:")
    inputs = query(server.db, "SELECT json_extract_string(attributes, '$.\"gen_ai.input.messages\"') FROM spans WHERE step_kind = 'agent'")
    assert {row[0] for row in inputs} == {"__REDACTED__"}


@pytest.mark.parametrize(("header", "ok"), [("Bearer s3cret", True), ("bearer s3cret", True), ("bEaReR  s3cret ", True),
                                            ("Bearer S3CRET", False), ("Basic s3cret", False), ("s3cret", False), (None, False), ("Bearer", False)])
def test_the_bearer_scheme_is_case_insensitive_and_the_token_is_not(header: str | None, ok: bool) -> None:
    from plumbline_otel.receive._auth import bearer_ok

    assert bearer_ok(header, b"s3cret") is ok
