"""OTLP logs: GenAI events (`gen_ai.*` event names) read into rows keyed by trace and span.

Some distributions put a call's content in log records instead of span attributes (the
`gen_ai.client.inference.operation.details` event, the older per-message events, tool call
decisions), so these rows are what assembly folds into the span with the same trace and span id.
Other log records are counted and dropped. A record's `log_id` is a hash of its content, so an
exporter's retry stores nothing twice, the same as for spans.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from plumbline_otel.decode._request import is_json
from plumbline_otel.errors import MalformedRequest

LOG_COLUMNS = ("log_id", "trace_id", "span_id", "time_ns", "observed_ns", "event_name", "severity_number", "severity_text",
               "body", "attributes", "service_name", "scope_name", "resource", "received_ns")
_MAX_VALUE_BYTES = 16 << 20
_MAX_DEPTH = 32


@dataclass(frozen=True)
class LogRows:
    """The gen_ai.* records of one request as table columns, and how many records it held."""

    columns: dict[str, list[Any]]
    received: int

    @property
    def kept(self) -> int:
        return len(self.columns["log_id"])


def is_logs_document(doc: Any) -> bool:
    """An OTLP JSON logs request (what a collector's file exporter writes for the logs signal)."""
    return isinstance(doc, dict) and ("resourceLogs" in doc or "resource_logs" in doc)


def _hex_to_b64(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in ("traceId", "spanId", "trace_id", "span_id") and isinstance(value, str) and value:
                try:
                    value = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    pass  # already base64 (protobufjs style) or invalid: ParseDict decides
            out[key] = _hex_to_b64(value)
        return out
    if isinstance(node, list):
        return [_hex_to_b64(v) for v in node]
    return node


def logs_from_json(doc: Any) -> ExportLogsServiceRequest:
    """A parsed OTLP JSON logs document as protobuf; `MalformedRequest` when it does not fit."""
    request = ExportLogsServiceRequest()
    try:
        ParseDict(_hex_to_b64(doc), request, ignore_unknown_fields=True)
    except (ParseError, binascii.Error, TypeError, ValueError) as exc:
        raise MalformedRequest(f"logs request: cannot decode: {exc}") from None
    return request


def logs_from_protobuf(data: bytes) -> ExportLogsServiceRequest | None:
    """A protobuf body as a logs request, when it is one: it parses and its records carry trace ids or event names.

    Only asked about a body that held no span as a trace request, so a trace request is never taken for logs.
    """
    try:
        request = ExportLogsServiceRequest.FromString(data)
    except DecodeError:
        return None
    records = [r for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    if records and all(len(r.trace_id) in (0, 16) and len(r.span_id) in (0, 8) for r in records) \
            and any(r.event_name or len(r.trace_id) == 16 for r in records):
        found: ExportLogsServiceRequest = request
        return found
    return None


def decode_logs(data: bytes, content_type: str) -> ExportLogsServiceRequest:
    """An uncompressed logs body (protobuf or OTLP JSON); `MalformedRequest` when it will not parse."""
    if is_json(content_type):
        try:
            return logs_from_json(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise MalformedRequest(f"logs request: cannot decode: {exc}") from None
    request = ExportLogsServiceRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as exc:
        raise MalformedRequest(f"logs request: cannot decode: {exc}") from None
    return request


def _event_name(record: LogRecord, attrs: dict[str, Any]) -> str:
    return record.event_name or str(attrs.get("event.name") or "")


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _value(value: Any) -> Any:
    from plumbline_otel.normalise._values import Limits, ValueRejected, any_value  # normalise imports decode

    try:
        return any_value(value, Limits(_MAX_VALUE_BYTES, _MAX_DEPTH))
    except (ValueRejected, RecursionError) as exc:
        return {"plumbline.dropped": str(exc)}


def _attrs(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def log_rows(request: ExportLogsServiceRequest) -> LogRows:
    """The request's gen_ai.* records, ready for `Store.write_logs`."""
    cols: dict[str, list[Any]] = {name: [] for name in LOG_COLUMNS}
    received, now = 0, time.time_ns()
    for resource_logs in request.resource_logs:
        resource = _attrs(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                received += 1
                attrs = _attrs(record.attributes)
                name = _event_name(record, attrs)
                if not name.startswith("gen_ai."):
                    continue
                row = {
                    "log_id": hashlib.sha256(resource_logs.resource.SerializeToString(deterministic=True)
                                             + record.SerializeToString(deterministic=True)).hexdigest()[:32],
                    "trace_id": record.trace_id.hex() or None, "span_id": record.span_id.hex() or None,
                    "time_ns": record.time_unix_nano, "observed_ns": record.observed_time_unix_nano,
                    "event_name": name, "severity_number": record.severity_number, "severity_text": record.severity_text,
                    "body": _json(_value(record.body)), "attributes": _json(attrs),
                    "service_name": resource.get("service.name"), "scope_name": scope_logs.scope.name,
                    "resource": _json(resource), "received_ns": now,
                }
                for column, value in row.items():
                    cols[column].append(value)
    return LogRows(cols, received)
