"""OTLP protobuf bodies, with a span-by-span salvage path when the whole message will not parse.

The fast path is one `FromString`. When that fails (a truncated body, invalid UTF-8 in one span's
string, nesting past protobuf's recursion limit), the body is walked at the wire level: resource
and scope envelopes are split by hand and each span is decoded on its own, so one bad span costs
one span, not the request.

Ids are checked as OTLP defines them: a span whose trace id is not 16 bytes or all zeros, whose
span id is not 8 bytes or all zeros, or whose parent id is neither empty nor 8 bytes is rejected
alone (a problem says which); an all-zero parent id means no parent, as in the Collector.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from plumbline_otel.decode._problems import Decoded
from plumbline_otel.errors import Problem

_LEN = 2  # wire type of length-delimited fields
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def _id_problem(span: Span) -> str | None:
    """Why `span`'s ids are invalid in OTLP, or None (an all-zero parent id is cleared: no parent)."""
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return f"trace id {trace_id.hex()[:40]} is invalid ({'all zeros' if trace_id == _ZERO_TRACE else f'{len(trace_id)} bytes, not 16'})"
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return f"span id {span_id.hex()[:40]} is invalid ({'all zeros' if span_id == _ZERO_SPAN else f'{len(span_id)} bytes, not 8'})"
    if parent and len(parent) != 8:
        return f"parent span id {parent.hex()[:40]} is invalid ({len(parent)} bytes, not 8)"
    if parent == _ZERO_SPAN:
        span.parent_span_id = b""
    return None


def _drop_invalid_ids(request: ExportTraceServiceRequest, where: str, problems: list[Problem]) -> bool:
    """Remove the spans whose ids OTLP calls invalid (one problem each); True when `request` changed."""
    changed = False
    for i, resource_spans in enumerate(request.resource_spans):
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            spans = scope_spans.spans
            bad: list[int] = []
            for k, span in enumerate(spans):
                trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
                if len(trace_id) == 16 and len(span_id) == 8 and (len(parent) == 8 or not parent) and trace_id != _ZERO_TRACE \
                        and span_id != _ZERO_SPAN and parent != _ZERO_SPAN:
                    continue  # the common case, checked without a call
                reason = _id_problem(span)
                if reason is not None:
                    bad.append(k)
                    problems.append(Problem(f"{where} resourceSpans[{i}].scopeSpans[{j}].spans[{k}]", reason, spans=1))
                elif parent and not span.parent_span_id:
                    changed = True
            for k in reversed(bad):
                del spans[k]
            changed = changed or bool(bad)
    return changed


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise DecodeError("truncated varint")


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes, bool]]:
    """Yield (field number, wire type, payload, complete) at one message level; the last may be cut short."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == _LEN:
            size, pos = _varint(data, pos)
            yield number, wire, data[pos : pos + size], pos + size <= len(data)
            pos += size
        elif wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")


def _salvage_scope(data: bytes, where: str, problems: list[Problem]) -> ScopeSpans:
    scope_spans = ScopeSpans()
    k = 0
    for number, wire, payload, complete in _fields(data):
        if number == 1 and wire == _LEN and complete:
            scope_spans.scope.CopyFrom(InstrumentationScope.FromString(payload))
        elif number == 2 and wire == _LEN:
            try:
                if not complete:
                    raise DecodeError("the body ends inside this span (truncated)")
                scope_spans.spans.append(Span.FromString(payload))
            except DecodeError as exc:
                problems.append(Problem(f"{where}.spans[{k}]", f"undecodable span: {exc}", spans=1))
            k += 1
    return scope_spans


def _salvage_resource(data: bytes, where: str, problems: list[Problem]) -> ResourceSpans:
    resource_spans = ResourceSpans()
    j = 0
    for number, wire, payload, complete in _fields(data):
        if number == 1 and wire == _LEN and complete:
            try:
                resource_spans.resource.CopyFrom(Resource.FromString(payload))
            except DecodeError as exc:
                problems.append(Problem(f"{where}.resource", f"resource dropped: {exc}"))
        elif number == 2 and wire == _LEN:
            resource_spans.scope_spans.append(_salvage_scope(payload, f"{where}.scopeSpans[{j}]", problems))
            j += 1
    return resource_spans


def _salvage(data: bytes, where: str, first_error: Exception) -> Decoded:
    problems: list[Problem] = []
    request = ExportTraceServiceRequest()
    try:
        for i, (number, wire, payload, _complete) in enumerate(_fields(data)):
            if number == 1 and wire == _LEN:
                request.resource_spans.append(_salvage_resource(payload, f"{where} resourceSpans[{i}]", problems))
    except DecodeError as exc:
        problems.append(Problem(where, f"not an OTLP protobuf request past this point: {exc}"))
    if not problems:  # the walker found nothing wrong, so report what protobuf said
        problems.append(Problem(where, f"protobuf decode failed: {first_error}"))
    _drop_invalid_ids(request, where, problems)
    return Decoded(request, where, problems)


def request_from_protobuf(data: bytes, where: str) -> Decoded:
    """Decode one binary `ExportTraceServiceRequest`, salvaging good spans from a damaged body."""
    try:
        request = ExportTraceServiceRequest.FromString(data)
    except DecodeError as exc:
        return _salvage(data, where, exc)
    problems: list[Problem] = []
    if _drop_invalid_ids(request, where, problems):
        return Decoded(request, where, problems)  # encoded again from what is left
    return Decoded(request, where, raw=data)
