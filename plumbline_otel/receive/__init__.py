"""Receive: plumbline as an OTLP exporter target (gRPC :4317, HTTP :4318), durable and bounded.

    collector / SDK exporter ──► transport (_grpc, _http) ──► Intake (decode, content rules,
    normalise) ──► WriteQueue (one writer thread, bounded) ──► Store (one transaction per batch)

A request is answered success only after the transaction holding its spans committed; retries are
idempotent through the store's (trace_id, span_id) key; a full queue answers with OTLP pushback
(UNAVAILABLE + RetryInfo, HTTP 503 + Retry-After). `Server(config).run()` is `plumbline serve`.
"""

from plumbline_otel.content import ContentFilter
from plumbline_otel.receive._intake import Intake, Outcome
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.receive._server import Server
from plumbline_otel.receive._writer import Overloaded, WriteQueue

__all__ = ["ContentFilter", "Intake", "Metrics", "Outcome", "Overloaded", "Server", "WriteQueue"]
