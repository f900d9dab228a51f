"""Test helpers: spans made with the real OpenTelemetry SDK, encoded the way real exporters encode them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import Logger, LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from plumbline_otel.replay import export as replay_export


def record(build: Callable[[Tracer], None], service: str = "test-agent", resource: dict[str, Any] | None = None,
           scope: str = "tests") -> ExportTraceServiceRequest:
    """Run `build` with a real SDK tracer (of instrumentation scope `scope`) and return the spans as an OTLP export request."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service, **(resource or {})}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer(scope))
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans())


def record_with_logs(build: Callable[[Tracer, Logger], None], service: str = "test-agent",
                     scope: str = "tests") -> tuple[ExportTraceServiceRequest, ExportLogsServiceRequest]:
    """`record`, with a real SDK logger too: log records emitted inside a span carry its trace and span id."""
    spans, logs = InMemorySpanExporter(), InMemoryLogRecordExporter()
    resource = Resource.create({"service.name": service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    log_provider = LoggerProvider(resource=resource)
    log_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    build(provider.get_tracer(scope), log_provider.get_logger(scope))  # type: ignore[arg-type]
    provider.shutdown()
    log_provider.shutdown()
    return encode_spans(spans.get_finished_spans()), encode_logs(logs.get_finished_logs())


def to_otlp_json(request: ExportTraceServiceRequest | ExportLogsServiceRequest) -> dict[str, Any]:
    """OTLP JSON as the spec writes it: hex ids, integer enums, 64-bit integers as strings."""
    return replay_export.to_otlp_json(request)
