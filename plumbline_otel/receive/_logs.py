"""OTLP logs: GenAI events (`gen_ai.*` event names) kept in a `logs` table keyed by trace and span.

Older GenAI instrumentations put message content in log events rather than span attributes, so
these rows are what a later join onto `spans` (on trace_id, span_id) reads. Other log records are
counted and dropped. A record's `log_id` is a hash of its content, so an exporter's retry stores
nothing twice, the same as for spans.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from plumbline_otel.decode import is_json
from plumbline_otel.errors import MalformedRequest
from plumbline_otel.normalise import Limits
from plumbline_otel.normalise import ValueRejected, any_value
from plumbline_otel.store import Store

_CREATE = """CREATE TABLE IF NOT EXISTS logs (
    log_id VARCHAR PRIMARY KEY, trace_id VARCHAR, span_id VARCHAR, time_ns BIGINT, observed_ns BIGINT,
    event_name VARCHAR, severity_number INTEGER, severity_text VARCHAR, body JSON, attributes JSON,
    service_name VARCHAR, scope_name VARCHAR, resource JSON, received_ns BIGINT)"""
_COLUMNS = ("log_id", "trace_id", "span_id", "time_ns", "observed_ns", "event_name", "severity_number", "severity_text",
            "body", "attributes", "service_name", "scope_name", "resource", "received_ns")
_TYPES = {"time_ns": pa.int64(), "observed_ns": pa.int64(), "severity_number": pa.int32(), "received_ns": pa.int64()}
_LIMITS = Limits()


@dataclass(frozen=True)
class LogRows:
    """The gen_ai.* records of one request as table columns, and how many records it held."""

    columns: dict[str, list[Any]]
    received: int

    @property
    def kept(self) -> int:
        return len(self.columns["log_id"])


def create_logs_table(store: Store) -> None:
    """Create the table if this store has none (run on the writer thread at start-up)."""
    store.connection.execute(_CREATE)


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


def decode_logs(data: bytes, content_type: str) -> ExportLogsServiceRequest:
    """An uncompressed logs body (protobuf or OTLP JSON); `MalformedRequest` when it will not parse."""
    request = ExportLogsServiceRequest()
    try:
        if is_json(content_type):
            ParseDict(_hex_to_b64(orjson.loads(data)), request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(data)
    except (orjson.JSONDecodeError, ParseError, DecodeError, binascii.Error, TypeError, ValueError) as exc:
        raise MalformedRequest(f"logs request: cannot decode: {exc}") from None
    return request


def _event_name(record: LogRecord, attrs: dict[str, Any]) -> str:
    return record.event_name or str(attrs.get("event.name") or "")


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _value(value: Any) -> Any:
    try:
        return any_value(value, _LIMITS)
    except (ValueRejected, RecursionError) as exc:
        return {"plumbline.dropped": str(exc)}


def _attrs(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def log_rows(request: ExportLogsServiceRequest) -> LogRows:
    """The request's gen_ai.* records, ready for `write_logs`."""
    cols: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
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
                for name_, value in row.items():
                    cols[name_].append(value)
    return LogRows(cols, received)


def write_logs(store: Store, rows: LogRows) -> int:
    """Commit the rows in one transaction; return how many were new."""
    if not rows.kept:
        return 0
    log_batch = pa.table({n: pa.array(v, _TYPES.get(n, pa.string())) for n, v in rows.columns.items()})  # noqa: F841
    connection = store.connection
    connection.execute("BEGIN")
    try:
        row = connection.execute("INSERT OR IGNORE INTO logs SELECT * FROM log_batch").fetchone()
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return int(row[0]) if row else 0


__all__ = ["LogRows", "create_logs_table", "decode_logs", "log_rows", "write_logs"]
