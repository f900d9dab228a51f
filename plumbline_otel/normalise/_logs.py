"""GenAI log records as rows of the store's `logs` table, keyed by trace and span.

Some distributions put a call's content in log records instead of span attributes (the
`gen_ai.client.inference.operation.details` event, the older per-message events, tool call
decisions), so these rows are what assembly folds into the span with the same trace and span id.
Records whose event name is not `gen_ai.*` are counted and dropped. A row's `log_id` is a hash of
the record's content, so an exporter's retry stores nothing twice, the same as for spans.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from plumbline_otel.normalise._values import Limits, ValueRejected, any_value

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


def _event_name(record: LogRecord, attrs: dict[str, Any]) -> str:
    return record.event_name or str(attrs.get("event.name") or "")


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _value(value: Any) -> Any:
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
