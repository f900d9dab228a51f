"""OTLP/gRPC: TraceService/Export and LogsService/Export over the shared `Intake`, plus health, auth, TLS.

Requests are registered with a bytes deserializer so a damaged protobuf reaches the salvaging
decoder (one bad span costs one span) instead of being refused whole by grpcio. Pushback is
UNAVAILABLE with `google.rpc.RetryInfo` in both places clients look for it: the status details
(`grpc-status-details-bin`, read by Go and the Collector) and the trailing-metadata key
`google.rpc.retryinfo-bin` (the only place the Python exporter reads).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsPartialSuccess, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTracePartialSuccess, ExportTraceServiceResponse

from plumbline_otel.receive._auth import bearer_ok
from plumbline_otel.receive._intake import Intake, Outcome

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_PROTOBUF = "application/x-protobuf"
_RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
_UNAUTHENTICATED_OK = ("/grpc.health.v1.Health/",)


def pushback_status(code: grpc.StatusCode, message: str, retry_after: float) -> grpc.Status:
    """A status carrying RetryInfo in its details and in the `google.rpc.retryinfo-bin` trailer."""
    seconds = int(retry_after)
    info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=seconds, nanos=int((retry_after - seconds) * 1e9)))
    detail = AnyProto()
    detail.Pack(info)
    status = rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[detail]))
    return status._replace(trailing_metadata=(*status.trailing_metadata, (_RETRY_INFO_KEY, info.SerializeToString())))


def _answer(outcome: Outcome, context: grpc.ServicerContext, retry_after: float, success: Callable[[], Any], partial: Callable[[Outcome], Any]) -> Any:
    """The one place an `Outcome` becomes a gRPC answer."""
    if outcome.status == "ok":
        return success()
    if outcome.status == "partial":
        return partial(outcome)
    if outcome.status == "invalid":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, outcome.message)
    if outcome.status == "too_large":
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, outcome.message)
    context.abort_with_status(pushback_status(grpc.StatusCode.UNAVAILABLE, outcome.message, retry_after))


class _BearerAuth(grpc.ServerInterceptor):
    """Every method but health checking needs `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

        def deny(_request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(_UNAUTHENTICATED_OK):
            return continuation(details)
        if bearer_ok(dict(details.invocation_metadata).get("authorization"), self._token):
            return continuation(details)
        return self._deny_stream if details.method.endswith("/ListTrajectories") else self._deny


def _otlp_handlers(intake: Intake, limit: int, retry_after: float) -> list[grpc.GenericRpcHandler]:
    def export_traces(data: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        outcome = intake.traces(data, _PROTOBUF, "", "grpc", limit)
        answer: ExportTraceServiceResponse = _answer(outcome, context, retry_after, ExportTraceServiceResponse, lambda o: ExportTraceServiceResponse(
            partial_success=ExportTracePartialSuccess(rejected_spans=o.rejected, error_message=o.message)))
        return answer

    def export_logs(data: bytes, context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        outcome = intake.logs(data, _PROTOBUF, "", "grpc", limit)
        logs_answer: ExportLogsServiceResponse = _answer(outcome, context, retry_after, ExportLogsServiceResponse, lambda o: ExportLogsServiceResponse(
            partial_success=ExportLogsPartialSuccess(rejected_log_records=o.rejected, error_message=o.message)))
        return logs_answer

    def handler(fn: Callable[..., Any], response: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=None, response_serializer=response.SerializeToString)

    return [
        grpc.method_handlers_generic_handler(TRACE_SERVICE, {"Export": handler(export_traces, ExportTraceServiceResponse)}),
        grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": handler(export_logs, ExportLogsServiceResponse)}),
    ]


class GrpcReceiver:
    """A grpcio server with OTLP, health checking and whatever else `extra` registers on it."""

    def __init__(self, intake: Intake, endpoint: str, *, max_recv_bytes: int, max_concurrent: int, retry_after: float,
                 token: str | None = None, tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 extra: Callable[[grpc.Server], None] | None = None) -> None:
        options = [
            ("grpc.max_receive_message_length", max_recv_bytes),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.so_reuseport", 0),
        ]
        self.server = grpc.server(
            # One thread per admitted call: every call reaches the queue's admission check at once
            # (and gets pushback there) instead of waiting unseen in the executor's queue.
            ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="plumbline-grpc"),
            handlers=_otlp_handlers(intake, max_recv_bytes, retry_after),
            interceptors=[_BearerAuth(token)] if token else None,
            options=options,
            maximum_concurrent_rpcs=max_concurrent,
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if extra:
            extra(self.server)
        if tls_cert_file and tls_key_file:
            credentials = grpc.ssl_server_credentials([(Path(tls_key_file).read_bytes(), Path(tls_cert_file).read_bytes())])
            self.port = self.server.add_secure_port(endpoint, credentials)
        else:
            self.port = self.server.add_insecure_port(endpoint)
        self.endpoint = endpoint

    def start(self) -> None:
        self.server.start()
        for service in ("", TRACE_SERVICE, LOGS_SERVICE, "plumbline.v1.Plumbline"):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float) -> None:
        """Refuse new calls, let the ones in flight finish (within `grace`), then close."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


__all__ = ["GrpcReceiver", "LOGS_SERVICE", "TRACE_SERVICE", "pushback_status"]
