"""OTLP logs requests, protobuf or JSON, over the wire or in files: parsed, never interpreted.

What the GenAI records in them mean to a trajectory is `normalise/_logs.py`'s business.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson
from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from plumbline_otel.decode._request import is_json
from plumbline_otel.errors import MalformedRequest


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


