"""OTLP/gRPC: TraceService/Export and LogsService/Export over the shared `Intake`, plus health, auth, TLS.

Requests are registered with a bytes deserializer so a damaged protobuf reaches the salvaging
decoder (one bad span costs one span) instead of being refused whole by grpcio. Pushback is
UNAVAILABLE with `google.rpc.RetryInfo` in both places clients look for it: the status details
(`grpc-status-details-bin`, read by Go and the Collector) and the trailing-metadata key
`google.rpc.retryinfo-bin` (the only place the Python exporter reads).

Hostile peers: `_Gate`, the interceptor, runs on grpcio's polling thread before any call holds a
thread. It refuses a call without the bearer token there (UNAUTHENTICATED, without reading its
message), and counts calls by kind — exports, plumbline's API, health checks, health watches —
each under its own cap (past it: RESOURCE_EXHAUSTED + RetryInfo), on a thread pool sized for all
of them, so no kind starves another and health always has threads. Every handler reads its
request itself, under `message_timeout`: a call that sends no message (or not all of it) in time
is cancelled. An export holds nothing in the memory budget (`_budget.py`) until its message has
arrived: grpcio hands a message over only once it is whole, so that is when its bytes are taken
(past the budget: RESOURCE_EXHAUSTED + RetryInfo, the message dropped). An idle call (headers sent,
no message) thus holds no budget, where it used to reserve the largest message for its whole
deadline and four of them locked every exporter out (issue 43). What grpcio holds for messages
still arriving is outside the budget: at most what peers actually sent, HTTP/2 flow control and
`max_recv_bytes` bounding each call, `max_exports` the calls.

Idle calls cannot take the call slots either: an export (or API call) past its kind's cap takes the
slot of the call of that kind that has waited longest for its message, if it has waited at least
`EVICT_AFTER` (that call is cancelled), as an HTTP connection past the caps takes the slot of the
one waiting longest for its request. Keep-alive pings, idle and age limits on connections are
grpcio's own, as the Collector's gRPC server sets them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsPartialSuccess, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTracePartialSuccess, ExportTraceServiceResponse

from plumbline_otel.receive._auth import bearer_ok
from plumbline_otel.receive._budget import Deadlines, MemoryBudget
from plumbline_otel.receive._intake import Intake, Outcome

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_PROTOBUF = "application/x-protobuf"
_RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
_HEALTH = "/grpc.health.v1.Health/"
_UNAUTHENTICATED_OK = (_HEALTH,)
_EXPORTS = (f"/{TRACE_SERVICE}/", f"/{LOGS_SERVICE}/")
_SPARE_THREADS = 16  # for refusals, which run on the pool too (briefly)
_BUDGET_WAIT = 2.0  # longest an export waits for room in the memory budget before pushback
EVICT_AFTER = 1.0  # a call waiting this long for its message gives its slot to a new call past the cap


@dataclass(frozen=True)
class GrpcLimits:
    """Caps and timers of the gRPC server (`receivers.otlp.protocols.grpc.*`); seconds, 0 turns a timer off."""

    max_exports: int = 128  # export calls in flight
    max_api_calls: int = 16  # plumbline API calls in flight
    max_health_checks: int = 16
    max_health_watches: int = 4
    message_timeout: float = 30.0  # a call's request message must be whole within this
    keepalive_time: float = 60.0  # ping a connection quiet for this long...
    keepalive_timeout: float = 20.0  # ... and close it when the ping goes unanswered this long
    max_connection_idle: float = 300.0  # close a connection without calls for this long
    max_connection_age: float = 0.0  # close (GOAWAY) any connection this old
    max_connection_age_grace: float = 30.0  # ... after letting its calls finish for this long
    max_streams_per_connection: int = 100

    def options(self) -> list[tuple[str, int]]:
        """grpcio's channel arguments for these limits."""
        options = [("grpc.max_concurrent_streams", self.max_streams_per_connection), ("grpc.keepalive_permit_without_calls", 1)]
        for key, seconds in (("grpc.keepalive_time_ms", self.keepalive_time), ("grpc.keepalive_timeout_ms", self.keepalive_timeout),
                             ("grpc.max_connection_idle_ms", self.max_connection_idle), ("grpc.max_connection_age_ms", self.max_connection_age),
                             ("grpc.max_connection_age_grace_ms", self.max_connection_age_grace)):
            if seconds > 0:
                options.append((key, int(seconds * 1000)))
        return options


def _kind(method: str) -> str:
    if method.startswith(_HEALTH):
        return "watch" if method.endswith("/Watch") else "health"
    return "export" if method.startswith(_EXPORTS) else "api"


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
    if outcome.status == "exhausted":
        context.abort_with_status(pushback_status(grpc.StatusCode.RESOURCE_EXHAUSTED, outcome.message, retry_after))
    context.abort_with_status(pushback_status(grpc.StatusCode.UNAVAILABLE, outcome.message, retry_after))


class _Gate(grpc.ServerInterceptor):
    """Token check and per-kind caps before a call holds a thread; every admitted call reads its message under a deadline."""

    def __init__(self, token: str | None, limits: GrpcLimits, deadlines: Deadlines, retry_after: float) -> None:
        self._token = token.encode() if token else None
        self._caps = {"export": limits.max_exports, "api": limits.max_api_calls, "health": limits.max_health_checks,
                      "watch": limits.max_health_watches}
        self.active = dict.fromkeys(self._caps, 0)
        self.refused = {"unauthenticated": 0, "busy": 0, "timed_out": 0}
        self.evicted = 0  # calls cancelled, while waiting for their message, to give their slot to a new call
        self._lock = threading.Lock()
        # Admitted calls by their context: (kind, count the call out); and those waiting for their message, since when.
        self._calls: dict[Any, tuple[str, Callable[[], None]]] = {}
        self._waiting: dict[Any, float] = {}
        self._deadlines, self._message_timeout = deadlines, limits.message_timeout

        def unauthenticated(_requests: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        def busy(_requests: Any, context: grpc.ServicerContext) -> None:
            context.abort_with_status(pushback_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls in flight", retry_after))

        # Request-streaming handlers: grpcio runs them without waiting for a message first.
        self._unauthenticated = grpc.stream_unary_rpc_method_handler(unauthenticated)
        self._busy = grpc.stream_unary_rpc_method_handler(busy)

    @property
    def threads(self) -> int:
        return sum(self._caps.values()) + _SPARE_THREADS

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        kind = _kind(details.method)
        if self._token is not None and not details.method.startswith(_UNAUTHENTICATED_OK) and \
                not bearer_ok(dict(details.invocation_metadata or ()).get("authorization"), self._token):
            self.refused["unauthenticated"] += 1
            return self._unauthenticated
        with self._lock:
            victim = self._victim(kind) if self.active[kind] >= self._caps[kind] else None
            if self.active[kind] >= self._caps[kind] and victim is None:
                self.refused["busy"] += 1
                return self._busy
            self.active[kind] += 1
        if victim is not None:  # outside the lock: its slot goes to this call, it ends at once
            self._evict(victim)
        done = self._once(kind)
        try:
            handler = continuation(details)
        except BaseException:
            done()
            raise
        if handler is None:
            done()
            return None
        return self._guard(handler, kind, done)

    def _once(self, kind: str) -> Callable[[], None]:
        finished = threading.Event()

        def done() -> None:
            with self._lock:
                if not finished.is_set():
                    finished.set()
                    self.active[kind] -= 1

        return done

    def _victim(self, kind: str) -> Any | None:
        """The call of `kind` that has waited longest for its message, if that is at least `EVICT_AFTER` (under the lock)."""
        oldest = time.monotonic() - EVICT_AFTER
        victim = None
        for context, since in self._waiting.items():
            entry = self._calls.get(context)
            if entry is not None and entry[0] == kind and since <= oldest:
                victim, oldest = context, since
        if victim is not None:
            del self._waiting[victim]
        return victim

    def _evict(self, context: Any) -> None:
        """Count the call out (its slot is taken over) and cancel it: its handler's read of the message ends."""
        entry = self._calls.pop(context, None)
        if entry is not None:
            entry[1]()
        self.evicted += 1
        context.cancel()

    def _track(self, context: grpc.ServicerContext, kind: str, done: Callable[[], None]) -> None:
        """Know the call by its context until it ends, when `done` counts it out."""
        def ended() -> None:
            with self._lock:
                self._calls.pop(context, None)
                self._waiting.pop(context, None)
            done()

        with self._lock:
            self._calls[context] = (kind, done)
        if not context.add_callback(ended):
            ended()

    def first_message(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """The call's request message, or the call cancelled when it is not whole within the message timeout."""
        key = object()

        def cancel() -> None:
            self.refused["timed_out"] += 1
            context.cancel()

        if self._message_timeout > 0:
            self._deadlines.arm(key, self._message_timeout, cancel)
        with self._lock:
            if context in self._calls:
                self._waiting[context] = time.monotonic()
        try:
            return next(requests)
        except StopIteration:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        finally:
            self._deadlines.disarm(key)
            with self._lock:
                self._waiting.pop(context, None)

    def _guard(self, handler: grpc.RpcMethodHandler, kind: str, done: Callable[[], None]) -> grpc.RpcMethodHandler:
        """`handler` as a request-streaming handler that counts itself out when the call ends."""
        def track(context: grpc.ServicerContext) -> None:
            self._track(context, kind, done)

        deserialize, serialize = handler.request_deserializer, handler.response_serializer
        if handler.request_streaming:  # reads its own messages (the exports)
            inner: Any = handler.stream_stream or handler.stream_unary

            def streaming(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                track(context)
                return inner(requests, context)

            make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else grpc.stream_unary_rpc_method_handler
            return make(streaming, request_deserializer=deserialize, response_serializer=serialize)
        if handler.response_streaming:
            unary_stream = handler.unary_stream

            def responses(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                track(context)
                return self._responses(unary_stream, requests, context)

            return grpc.stream_stream_rpc_method_handler(responses, request_deserializer=deserialize, response_serializer=serialize)
        unary_unary = handler.unary_unary

        def response(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            track(context)
            return unary_unary(self.first_message(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(response, request_deserializer=deserialize, response_serializer=serialize)

    def _responses(self, unary_stream: Any, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        yield from unary_stream(self.first_message(requests, context), context)


def peer_address(peer: str) -> str:
    """The client's address in grpcio's peer string (`ipv4:127.0.0.1:5000`, `ipv6:%5B::1%5D:5000`), without its port."""
    kind, _, rest = peer.partition(":")
    return unquote(rest).rsplit(":", 1)[0].strip("[]") if kind in ("ipv4", "ipv6") else peer  # unix:… stays whole


def _otlp_handlers(intake: Intake, gate: _Gate, budget: MemoryBudget, limit: int, retry_after: float) -> list[grpc.GenericRpcHandler]:
    def receive(requests: Iterator[bytes], context: grpc.ServicerContext) -> tuple[list[bytes], int]:
        """The request's bytes (in a list the caller empties), and what they hold of the memory budget."""
        # grpcio hands a message over only once it is whole: its bytes are taken from the budget then,
        # so a call that sends nothing holds nothing (issue 43); past the budget the message is dropped.
        data = [gate.first_message(requests, context)]
        size = len(data[0])
        remaining = context.time_remaining()
        wait = _BUDGET_WAIT if remaining is None else max(0.0, min(_BUDGET_WAIT, remaining / 2))
        if not budget.take(size, 0, timeout=wait):
            data.clear()
            context.abort_with_status(pushback_status(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                      "the memory budget for requests in flight is spent", retry_after))
        return data, size

    def export_traces(requests: Iterator[bytes], context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        data, held = receive(requests, context)
        outcome = intake.traces(data.pop(), _PROTOBUF, "", "grpc", limit, held)
        answer: ExportTraceServiceResponse = _answer(outcome, context, retry_after, ExportTraceServiceResponse, lambda o: ExportTraceServiceResponse(
            partial_success=ExportTracePartialSuccess(rejected_spans=o.rejected, error_message=o.message)))
        return answer

    def export_logs(requests: Iterator[bytes], context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        data, held = receive(requests, context)
        outcome = intake.logs(data.pop(), _PROTOBUF, "", "grpc", limit, held)
        logs_answer: ExportLogsServiceResponse = _answer(outcome, context, retry_after, ExportLogsServiceResponse, lambda o: ExportLogsServiceResponse(
            partial_success=ExportLogsPartialSuccess(rejected_log_records=o.rejected, error_message=o.message)))
        return logs_answer

    def handler(fn: Callable[..., Any], response: Any) -> grpc.RpcMethodHandler:
        # Request-streaming on the server (a unary call looks the same on the wire): the handler reads
        # the message itself, after reserving room for it and under the message deadline.
        return grpc.stream_unary_rpc_method_handler(fn, request_deserializer=None, response_serializer=response.SerializeToString)

    return [
        grpc.method_handlers_generic_handler(TRACE_SERVICE, {"Export": handler(export_traces, ExportTraceServiceResponse)}),
        grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": handler(export_logs, ExportLogsServiceResponse)}),
    ]


class GrpcReceiver:
    """A grpcio server with OTLP, health checking and whatever else `extra` registers on it."""

    def __init__(self, intake: Intake, endpoint: str, *, max_recv_bytes: int, max_concurrent: int, retry_after: float,
                 token: str | None = None, tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 extra: Callable[[grpc.Server], None] | None = None, limits: GrpcLimits | None = None,
                 deadlines: Deadlines | None = None, budget: MemoryBudget | None = None) -> None:
        limits = limits or GrpcLimits(max_exports=max_concurrent)
        self.gate = _Gate(token, limits, deadlines or Deadlines("plumbline-grpc-deadlines"), retry_after)
        options = [
            ("grpc.max_receive_message_length", max_recv_bytes),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.so_reuseport", 0),
            *limits.options(),
        ]
        self.server = grpc.server(
            # A thread for every call the gate admits (it caps each kind): every call reaches the
            # budget and the queue at once (and gets pushback there) instead of waiting unseen in
            # the executor's queue, and health checks always find a thread.
            ThreadPoolExecutor(max_workers=self.gate.threads, thread_name_prefix="plumbline-grpc"),
            handlers=_otlp_handlers(intake, self.gate, budget or intake.queue.budget, max_recv_bytes, retry_after),
            interceptors=[self.gate],
            options=options,
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
        self.set_serving(True)

    def set_serving(self, serving: bool) -> None:
        """What health checks answer for every service: NOT_SERVING while the store is unusable."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", TRACE_SERVICE, LOGS_SERVICE, "plumbline.v1.Plumbline"):
            self.health.set(service, status)

    def stop(self, grace: float) -> None:
        """Refuse new calls, let the ones in flight finish (within `grace`), then close."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


__all__ = ["EVICT_AFTER", "GrpcLimits", "GrpcReceiver", "LOGS_SERVICE", "TRACE_SERVICE", "peer_address", "pushback_status"]
