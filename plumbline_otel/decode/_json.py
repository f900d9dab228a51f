"""OTLP JSON (already parsed into Python objects) mapped into the protobuf request by hand, in place.

`google.protobuf.json_format` is about a hundred times slower than the binary path and silently
decodes a 32-hex trace id as base64 into 24 bytes, so the mapping is written out here, following
the OTLP JSON rules: hex ids, integer enums (names accepted), 64-bit integers as strings or
numbers, lowerCamelCase keys (snake_case accepted, as the Collector does), unknown fields ignored.

`parse_json` reads the text so that damage costs only what it touches: invalid UTF-8 is replaced
(and said so), a value nested past the parser's limit is cut (its attribute is dropped), and a
number past a double's range (`1e400`) becomes a marker that costs the span (or the resource's
attributes) it is in, instead of the whole request. Spans whose trace or span id is all zeros are
rejected (OTLP calls them invalid); an all-zero parent id means no parent, as in the Collector.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any, cast

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from plumbline_otel.decode._problems import Decoded
from plumbline_otel.errors import MalformedRequest, Problem

SpanFilter = Callable[[Any], bool]  # given a span's raw JSON trace id: decode this span?
_SPAN_KINDS = {name: value for name, value in Span.SpanKind.items()}
_STATUS_CODES = {name: value for name, value in Status.StatusCode.items()}
_FLOAT_WORDS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Bad(ValueError):
    """A field that cannot be mapped; the message names the field."""


class _TooDeep(_Bad):
    """A value cut by `cap_depth`: it costs its attribute, not its span."""


# What `cap_depth` puts where a value nested past the parser's depth limit was.
TOO_DEEP = "\u0000plumbline: nested too deeply"
# Array and map levels read inside one attribute value. Deeper, the value is dropped here, named:
# normalisation keeps 32 levels at most anyway, and a request carrying it could not be parsed again
# from its protobuf bytes (upb refuses messages nested past 100), so a server's shard would lose the span.
_MAX_VALUE_DEPTH = 30
_MARKER = orjson.dumps(TOO_DEEP)
_OPEN, _CLOSE, _QUOTE, _ESCAPE = frozenset(b"[{"), frozenset(b"]}"), ord('"'), ord("\\")
# What `parse_json` puts where a number past a double's range was: a string no field accepts.
OUT_OF_RANGE = "\u0000plumbline: number out of range"
_OUT_OF_RANGE_JSON = orjson.dumps(OUT_OF_RANGE)
_NUMBER = frozenset(b"+-.0123456789eE")
_MAX_REPAIRS = 64  # numbers out of range replaced in one document before it is refused whole
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def _string_end(text: bytes, i: int) -> int:
    """The index of the quote closing the JSON string that opens at `i`."""
    i += 1
    while i < len(text) and text[i] != _QUOTE:
        i += 2 if text[i] == _ESCAPE else 1
    return i


def _value_end(text: bytes, i: int) -> int:
    """The index just past the array or object that opens at `i`."""
    inner, i = 1, i + 1
    while i < len(text) and inner:
        c = text[i]
        if c == _QUOTE:
            i = _string_end(text, i)
        elif c in _OPEN:
            inner += 1
        elif c in _CLOSE:
            inner -= 1
        i += 1
    return i


def cap_depth(text: bytes, limit: int = 200) -> bytes:
    """`text` with every JSON value that opens past nesting `limit` replaced by the string `TOO_DEEP`.

    orjson (like every JSON parser) refuses a document nested deeper than its limit, which would
    lose a whole request for one runaway attribute; cut there, the attribute alone is dropped.
    """
    out, depth, start, i, n = bytearray(), 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == _QUOTE:
            i = _string_end(text, i)
        elif c in _OPEN:
            depth += 1
            if depth > limit:
                out += text[start:i] + _MARKER
                i = start = _value_end(text, i)
                depth -= 1
                continue
        elif c in _CLOSE:
            depth -= 1
        i += 1
    return bytes(out + text[start:])


def _byte_offset(text: bytes, chars: int) -> int:
    """Where character `chars` of UTF-8 `text` starts (orjson reports positions in characters)."""
    if text.isascii():
        return chars
    return len(text.decode("utf-8")[:chars].encode("utf-8"))


def parse_json(text: bytes, where: str) -> tuple[Any, list[Problem]]:
    """An OTLP JSON document parsed, with the problems repaired on the way; `MalformedRequest` when it is no JSON.

    Invalid UTF-8 is replaced with U+FFFD (one problem says so); values nested past the parser's
    limit are cut (`cap_depth`); each number past a double's range is replaced by `OUT_OF_RANGE`,
    which the mapping rejects with the span (or resource attributes) holding it.
    """
    problems: list[Problem] = []
    repairs = 0
    while True:
        try:
            return orjson.loads(text), problems
        except orjson.JSONDecodeError as exc:
            message = str(exc)
            if "not valid UTF-8" in message and not problems:
                text = text.decode("utf-8", errors="replace").encode("utf-8")
                problems.append(Problem(where, "invalid UTF-8 replaced with U+FFFD"))
            elif "depth limit" in message and repairs < _MAX_REPAIRS:
                text = cap_depth(text)
                repairs = _MAX_REPAIRS  # once is enough: nothing is left deeper than its limit
            elif "number is infinity" in message and repairs < _MAX_REPAIRS:
                start = _byte_offset(text, exc.pos)
                end = start
                while end < len(text) and text[end] in _NUMBER:
                    end += 1
                if end == start:
                    raise MalformedRequest(f"{where}: invalid JSON: {message}") from None
                text = text[:start] + _OUT_OF_RANGE_JSON + text[end:]
                repairs += 1
            else:
                raise MalformedRequest(f"{where}: invalid JSON: {message}") from None


def _get(obj: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    value = obj.get(camel)
    if value is None:
        value = obj.get(snake, default)
    return default if value is None else value


def _id(value: Any, size: int, field: str) -> bytes:
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise _Bad(f"{field} must be a hex string, got {type(value).__name__}")
    if len(value) == 2 * size:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    try:  # protobufjs-style base64 ids are non-compliant but cheap to accept
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == size:
        return raw
    raise _Bad(f"{field} {value[:80]!r} is not a {2 * size}-character hex id")


def _int(value: Any, field: str) -> int:
    if value.__class__ is str and value.isdigit():
        return int(value)
    if isinstance(value, bool):
        raise _Bad(f"{field} must be an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value == OUT_OF_RANGE:
        raise _Bad(f"{field} is a number out of range")
    raise _Bad(f"{field} must be an integer (or a decimal string), got {str(value)[:40]!r}")


INT32, UINT32, INT64, UINT64 = (-(1 << 31), 1 << 31), (0, 1 << 32), (-(1 << 63), 1 << 63), (0, 1 << 64)


def bounded(value: Any, bounds: tuple[int, int], field: str) -> int:
    """`_int` within a protobuf integer type's range (`INT32`, ...): out of it, the span is rejected by name, where
    protobuf's setter would raise mid-span."""
    n = _int(value, field)
    if bounds[0] <= n < bounds[1]:
        return n
    kind = {INT32: "int32", UINT32: "uint32", INT64: "int64", UINT64: "uint64"}[bounds]
    raise _Bad(f"{field} {str(n)[:40]} is out of the range of a protobuf {kind}")


def _enum(value: Any, names: dict[str, int], field: str) -> int:
    if isinstance(value, str) and value in names:
        return names[value]
    return bounded(value, INT32, field)


def _fill_any(out: AnyValue, value: Any, field: str, depth: int = 0) -> None:
    if value == TOO_DEEP:
        raise _TooDeep(f"{field} is nested deeper than the JSON parser allows")
    if depth > _MAX_VALUE_DEPTH:
        raise _TooDeep(f"{field} is nested deeper than {_MAX_VALUE_DEPTH} levels")
    if not isinstance(value, dict):
        raise _Bad(f"{field} must be an AnyValue object")
    if "stringValue" in value or "string_value" in value:
        s = _get(value, "stringValue", "string_value", "")
        if not isinstance(s, str):
            raise _Bad(f"{field}.stringValue must be a string")
        out.string_value = s
    elif "intValue" in value or "int_value" in value:
        out.int_value = bounded(_get(value, "intValue", "int_value"), INT64, field + ".intValue")
    elif "boolValue" in value or "bool_value" in value:
        b = _get(value, "boolValue", "bool_value")
        if not isinstance(b, bool):
            raise _Bad(f"{field}.boolValue must be true or false")
        out.bool_value = b
    elif "doubleValue" in value or "double_value" in value:
        d = _get(value, "doubleValue", "double_value")
        if isinstance(d, str) and d in _FLOAT_WORDS:
            d = _FLOAT_WORDS[d]
        elif d == OUT_OF_RANGE:
            raise _Bad(f"{field}.doubleValue is a number out of the range of a double")
        if isinstance(d, bool) or not isinstance(d, (int, float)):
            raise _Bad(f"{field}.doubleValue must be a number")
        out.double_value = float(d)
    elif "arrayValue" in value or "array_value" in value:
        items = _get(value, "arrayValue", "array_value")
        if items == TOO_DEEP:
            raise _TooDeep(f"{field} is nested deeper than the JSON parser allows")
        out.array_value.SetInParent()  # an empty array is still an array
        values = out.array_value.values
        for item in items.get("values") or []:
            _fill_any(values.add(), item, field + "[]", depth + 1)
    elif "kvlistValue" in value or "kvlist_value" in value:
        pairs = _get(value, "kvlistValue", "kvlist_value")
        if pairs == TOO_DEEP:
            raise _TooDeep(f"{field} is nested deeper than the JSON parser allows")
        out.kvlist_value.SetInParent()
        _fill_attributes(out.kvlist_value.values, pairs.get("values") or [], field, depth=depth + 1)
    elif "bytesValue" in value or "bytes_value" in value:
        try:
            out.bytes_value = base64.b64decode(_get(value, "bytesValue", "bytes_value"))
        except (binascii.Error, ValueError, TypeError) as exc:
            raise _Bad(f"{field}.bytesValue is not base64: {exc}") from None
    # else: {} is an explicit empty value (None in SDK >= 1.45)


def _fill_attributes(target: Any, pairs: Any, field: str, dropped: list[str] | None = None, depth: int = 0) -> None:
    """Key/values appended to `target` (a repeated KeyValue field, filled in place: the C parser's
    messages copy whatever is passed to their constructors); with `dropped`, a value cut for depth
    drops its key (listed there), not the caller."""
    if pairs == TOO_DEEP:
        raise _TooDeep(f"{field} is nested deeper than the JSON parser allows")
    if not isinstance(pairs, list):
        raise _Bad(f"{field} must be a list of key/value objects")
    add = target.add
    for kv in pairs:
        if kv == TOO_DEEP:
            raise _TooDeep(f"{field} is nested deeper than the JSON parser allows")
        key = kv.get("key") if isinstance(kv, dict) else None
        if not isinstance(key, str):
            raise _Bad(f"{field} has an entry without a string key")
        value = kv.get("value") or {}
        text = value.get("stringValue") if isinstance(value, dict) else None
        if text is not None and text.__class__ is str:  # the common case, without the dispatch below
            add(key=key).value.string_value = text
            continue
        entry = add(key=key)
        entry.value.SetInParent()  # `{}` is a value too: an explicit empty one
        try:
            _fill_any(entry.value, value, f"{field}[{key}]", depth)
        except _TooDeep:
            del target[-1]
            if dropped is None:
                raise
            dropped.append(key)


def _fill_events(target: Any, items: list[Any]) -> None:
    for e in items:
        event = target.add(
            time_unix_nano=bounded(_get(e, "timeUnixNano", "time_unix_nano", 0), UINT64, "event.timeUnixNano"),
            name=e.get("name", ""),
            dropped_attributes_count=bounded(_get(e, "droppedAttributesCount", "dropped_attributes_count", 0), UINT32, "event.droppedAttributesCount"),
        )
        _fill_attributes(event.attributes, e.get("attributes") or [], f"events[{e.get('name', '')}].attributes")


def _fill_links(target: Any, items: list[Any]) -> None:
    for link in items:
        added = target.add(
            trace_id=_id(_get(link, "traceId", "trace_id"), 16, "link.traceId"),
            span_id=_id(_get(link, "spanId", "span_id"), 8, "link.spanId"),
            trace_state=_get(link, "traceState", "trace_state", ""),
            dropped_attributes_count=bounded(_get(link, "droppedAttributesCount", "dropped_attributes_count", 0), UINT32, "link.droppedAttributesCount"),
            flags=bounded(link.get("flags", 0), UINT32, "link.flags"),
        )
        _fill_attributes(added.attributes, link.get("attributes") or [], "link.attributes")


def _fill_span(span: Span, obj: Any, dropped: list[str]) -> None:
    if not isinstance(obj, dict):
        raise _Bad("span is not a JSON object")
    span.trace_id = _id(_get(obj, "traceId", "trace_id"), 16, "traceId")
    span.span_id = _id(_get(obj, "spanId", "span_id"), 8, "spanId")
    if not span.trace_id or not span.span_id:
        raise _Bad("span has no traceId or spanId")
    if span.trace_id == _ZERO_TRACE or span.span_id == _ZERO_SPAN:
        raise _Bad(f"{'traceId' if span.trace_id == _ZERO_TRACE else 'spanId'} is all zeros (an invalid id in OTLP)")
    status = obj.get("status") or {}
    parent = _id(_get(obj, "parentSpanId", "parent_span_id"), 8, "parentSpanId")
    span.parent_span_id = b"" if parent == _ZERO_SPAN else parent
    span.trace_state = _get(obj, "traceState", "trace_state", "")
    span.flags = bounded(obj.get("flags", 0), UINT32, "flags")
    span.name = obj.get("name", "")
    span.kind = cast("Span.SpanKind.ValueType", _enum(obj.get("kind", 0), _SPAN_KINDS, "kind"))
    span.start_time_unix_nano = bounded(_get(obj, "startTimeUnixNano", "start_time_unix_nano", 0), UINT64, "startTimeUnixNano")
    span.end_time_unix_nano = bounded(_get(obj, "endTimeUnixNano", "end_time_unix_nano", 0), UINT64, "endTimeUnixNano")
    _fill_attributes(span.attributes, obj.get("attributes") or [], "attributes", dropped)
    span.dropped_attributes_count = (
        bounded(_get(obj, "droppedAttributesCount", "dropped_attributes_count", 0), UINT32, "droppedAttributesCount") + len(dropped))
    _fill_events(span.events, obj.get("events") or [])
    span.dropped_events_count = bounded(_get(obj, "droppedEventsCount", "dropped_events_count", 0), UINT32, "droppedEventsCount")
    _fill_links(span.links, obj.get("links") or [])
    span.dropped_links_count = bounded(_get(obj, "droppedLinksCount", "dropped_links_count", 0), UINT32, "droppedLinksCount")
    span.status.SetInParent()
    span.status.code = cast("Status.StatusCode.ValueType", _enum(status.get("code", 0), _STATUS_CODES, "status.code"))
    span.status.message = status.get("message", "")


def _span_label(obj: Any) -> str:
    span_id = obj.get("spanId") or obj.get("span_id") if isinstance(obj, dict) else None
    return f" (spanId {str(span_id)[:40]})" if span_id else ""


def _fill_scope_spans(out: ScopeSpans, obj: dict[str, Any], path: str, problems: list[Problem], keep: SpanFilter | None) -> None:
    scope = obj.get("scope") or obj.get("instrumentationLibrary") or {}
    out.scope.SetInParent()
    out.scope.name, out.scope.version = scope.get("name", ""), scope.get("version", "")
    out.schema_url = _get(obj, "schemaUrl", "schema_url", "")
    spans = out.spans
    for k, raw in enumerate(obj.get("spans") or []):
        if keep is not None and not keep(_get(raw, "traceId", "trace_id") if isinstance(raw, dict) else None):
            continue
        dropped: list[str] = []
        try:
            _fill_span(spans.add(), raw, dropped)
            problems.extend(Problem(f"{path}.spans[{k}]{_span_label(raw)} attribute {key!r}", "dropped: nested too deeply to read")
                            for key in dropped)
        except _Bad as exc:
            del spans[-1]
            problems.append(Problem(f"{path}.spans[{k}]{_span_label(raw)}", str(exc), spans=1))
        # each clause names its exception apart: compiled, one name is one variable of the first clause's type
        except (DecodeError, RecursionError) as deep:  # protobuf's own nesting limit, met while building
            del spans[-1]
            problems.append(Problem(f"{path}.spans[{k}]{_span_label(raw)}", f"value nested too deeply: {deep}", spans=1))
        except (TypeError, AttributeError, ValueError) as wrong:  # a field of another JSON type than OTLP's, met by a setter
            del spans[-1]
            problems.append(Problem(f"{path}.spans[{k}]{_span_label(raw)}", f"a field has the wrong JSON type: {wrong}", spans=1))


def _fill_resource_spans(out: ResourceSpans, obj: dict[str, Any], path: str, problems: list[Problem], keep: SpanFilter | None) -> None:
    resource = obj.get("resource") or {}
    try:
        _fill_attributes(out.resource.attributes, resource.get("attributes") or [], f"{path}.resource.attributes")
    except _Bad as exc:
        problems.append(Problem(path, f"resource attributes dropped: {exc}"))
        del out.resource.attributes[:]
    out.resource.SetInParent()
    scopes = _get(obj, "scopeSpans", "scope_spans") or obj.get("instrumentationLibrarySpans") or []
    for j, s in enumerate(scopes):
        _fill_scope_spans(out.scope_spans.add(), s, f"{path}.scopeSpans[{j}]", problems, keep)
    out.schema_url = _get(obj, "schemaUrl", "schema_url", "")


def request_from_json(doc: Any, where: str, keep: SpanFilter | None = None) -> Decoded:
    """Map one parsed OTLP JSON `ExportTraceServiceRequest` into protobuf; bad spans become problems.

    `keep` (given a span's raw trace id) skips spans another shard owns, before any mapping.
    """
    if not isinstance(doc, dict):
        return Decoded(ExportTraceServiceRequest(), where, [Problem(where, "not an OTLP JSON object")])
    problems: list[Problem] = []
    groups = _get(doc, "resourceSpans", "resource_spans") or []
    if not isinstance(groups, list):
        return Decoded(ExportTraceServiceRequest(), where, [Problem(where, "resourceSpans is not a list")])
    request = ExportTraceServiceRequest()
    for i, rs in enumerate(groups):
        if isinstance(rs, dict):
            mark = len(problems)
            try:
                _fill_resource_spans(request.resource_spans.add(), rs, f"{where} resourceSpans[{i}]", problems, keep)
            except (TypeError, AttributeError, ValueError) as exc:  # its envelope (resource, scope) of another JSON type
                del request.resource_spans[-1], problems[mark:]
                problems.append(Problem(f"{where} resourceSpans[{i}]", f"dropped: a field has the wrong JSON type: {exc}", spans=_raw_spans(rs)))
    return Decoded(request, where, problems)


def _raw_spans(group: dict[str, Any]) -> int:
    """How many spans a resourceSpans object holds, read as leniently as it must be when it could not be mapped."""
    scopes = _get(group, "scopeSpans", "scope_spans") or group.get("instrumentationLibrarySpans") or []
    if not isinstance(scopes, list):
        return 0
    return sum(len(s["spans"]) for s in scopes if isinstance(s, dict) and isinstance(s.get("spans"), list))
