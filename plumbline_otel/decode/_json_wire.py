"""OTLP JSON turned into protobuf wire bytes, which upb then parses in C like any protobuf request: the fast path.

Setting a span's fields one by one through protobuf's Python API cost ~14 µs a span; writing the
wire format here (tags, varints, length prefixes; compiled by mypyc) from the typed parse of
`_json_shapes` and parsing it once in C costs a fraction of that. The rules are `_json`'s, which
stays the reference: whatever this path does not map exactly as `_json.request_from_json` would
(a document with damage to repair, a span or value to reject or cut, a number out of a field's
range, a logs request) makes `wire_request` answer None, and the caller takes the exact way, whose
problems name the file, line and field. A well-formed request is never judged twice; a damaged
one is parsed twice, once here and once by the exact way.
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any, Final

from google.protobuf.message import DecodeError
from msgspec import UnsetType
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel.decode._json import _FLOAT_WORDS, _MAX_VALUE_DEPTH, _SPAN_KINDS, _STATUS_CODES, INT64, UINT32, UINT64, SpanFilter, _Bad, _enum, _id, bounded
from plumbline_otel.decode._json_shapes import (
    AnyValue,
    ArrayValue,
    Event,
    KeyValue,
    KeyValueList,
    Link,
    ParseError,
    ResourceSpans,
    ScopeSpans,
    Span,
    attributes,
    events,
    links,
    request,
)

_ZERO_TRACE: Final = bytes(16)
_ZERO_SPAN: Final = bytes(8)
_MASK64: Final = (1 << 64) - 1
_pack_double: Final = struct.Struct("<d").pack
_pack_fixed64: Final = struct.Struct("<Q").pack
_pack_fixed32: Final = struct.Struct("<I").pack
_pack_header: Final = struct.Struct("BBB").pack  # a tag and a two-byte varint
# Module constants are Final so that compiled code reads them without a lookup in the module's dict
_decode_request: Final = request
_decode_attributes: Final = attributes
_decode_events: Final = events
_decode_links: Final = links
_SHORT: Final = 128  # values below this are one varint byte: their (tag, value) headers are made once, below
_TAGS: Final = (0x0A, 0x10, 0x12, 0x18, 0x1A, 0x20, 0x22, 0x28, 0x2A, 0x30, 0x32, 0x3A, 0x4A, 0x50, 0x5A, 0x60, 0x6A, 0x70, 0x7A)
_HEADERS: Final[list[list[bytes]]] = [[bytes((tag, n)) for n in range(_SHORT)] if tag in _TAGS else [] for tag in range(128)]
_TAG_BYTES: Final = [bytes((tag,)) for tag in range(128)]
_EMPTY_VALUE: Final = b"\x12\x00"  # a KeyValue's value field, an empty AnyValue
_FLAGS_TAG: Final = b"\x85\x01"  # Span.flags: field 16, fixed32
_KEY_FIELDS: Final[dict[str, bytes]] = {}  # an attribute key's field in a KeyValue (tag, length, UTF-8), made once per key
_MAX_KEYS: Final = 4096  # keys past this many are encoded each time they come (a producer of unbounded keys)


class _NotFast(Exception):
    """This document needs the exact mapping (`_json`): a rule this path does not apply, or damage."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _header(tag: int, n: int) -> bytes:
    """A field's tag (one byte) and a varint: a length, or the value of a varint field."""
    if n < _SHORT:
        return _HEADERS[tag][n]
    if n < 0x4000:
        return _pack_header(tag, (n & 0x7F) | 0x80, n >> 7)
    return _TAG_BYTES[tag] + _varint(n)


# The message is written as a list of pieces joined once at the end: a sub-message's header is a
# placeholder until its fields are written and its size is known. Each writer returns the bytes it added.

def _data(out: list[bytes], tag: int, data: bytes) -> int:
    """A length-delimited field (string, bytes or message) whose tag is one byte."""
    head = _header(tag, len(data))
    out.append(head)
    out.append(data)
    return len(head) + len(data)


def _open(out: list[bytes]) -> int:
    out.append(b"")
    return len(out) - 1


def _close(out: list[bytes], slot: int, tag: int, size: int) -> int:
    head = _header(tag, size)
    out[slot] = head
    return len(head) + size


def _encoded(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: the exact way rejects it where it is
        raise _NotFast from None


def _text(out: list[bytes], tag: int, text: str) -> int:
    return _data(out, tag, _encoded(text)) if text else 0


def _first(camel: Any, snake: Any) -> Any:
    """`_json._get`: the lowerCamelCase field unless it is absent or null, then the lower_snake one."""
    return camel if camel is not None else snake


def _ranged(value: Any, bounds: tuple[int, int], field: str) -> int:
    """An integer field's value (absent or null: 0); out of its type's range, the exact way names it."""
    return 0 if value is None else bounded(value, bounds, field)


def _number(out: list[bytes], tag: int, n: int) -> int:
    """A varint field; nothing when 0 (proto3 writes no default)."""
    if not n:
        return 0
    head = _header(tag, n)
    out.append(head)
    return len(head)


def _fixed64(out: list[bytes], tag: int, value: Any, field: str) -> int:
    n = _ranged(value, UINT64, field)
    if not n:
        return 0
    out.append(_TAG_BYTES[tag])
    out.append(_pack_fixed64(n))
    return 9


def _kind(value: Any, names: dict[str, int], field: str) -> int:
    """An enum's varint: a negative int32 is written as its 64-bit two's complement, as protobuf writes it."""
    return _enum(value, names, field) & _MASK64


def _any(out: list[bytes], value: AnyValue, depth: int) -> int:
    """An AnyValue's fields (not its own tag and length), in `_json._fill_any`'s order of precedence."""
    if depth > _MAX_VALUE_DEPTH:
        raise _NotFast
    s = value.stringValue
    if isinstance(s, UnsetType):
        s = value.string_value
    if isinstance(s, str):
        return _data(out, 0x0A, _encoded(s))  # written even when empty: a oneof's choice is present
    i = value.intValue
    if isinstance(i, UnsetType):
        i = value.int_value
    if not isinstance(i, UnsetType):
        head = _header(0x18, bounded(i, INT64, "intValue") & _MASK64)  # two's complement, as int64 is written
        out.append(head)
        return len(head)
    b = value.boolValue
    if isinstance(b, UnsetType):
        b = value.bool_value
    if isinstance(b, bool):
        head = _header(0x10, 1 if b else 0)
        out.append(head)
        return 2
    d = value.doubleValue
    if isinstance(d, UnsetType):
        d = value.double_value
    if not isinstance(d, UnsetType):
        if isinstance(d, str):
            if d not in _FLOAT_WORDS:
                raise _NotFast
            d = _FLOAT_WORDS[d]
        out.append(b"\x21")
        out.append(_pack_double(float(d)))
        return 9
    a = value.arrayValue
    if isinstance(a, UnsetType):
        a = value.array_value
    if isinstance(a, ArrayValue):
        slot, size = _open(out), 0
        for item in a.values or ():
            inner = _open(out)
            size += _close(out, inner, 0x0A, _any(out, item, depth + 1))
        return _close(out, slot, 0x2A, size)
    kv = value.kvlistValue
    if isinstance(kv, UnsetType):
        kv = value.kvlist_value
    if isinstance(kv, KeyValueList):
        slot = _open(out)
        return _close(out, slot, 0x32, _attributes(out, 0x0A, kv.values, depth + 1))
    raw = value.bytesValue
    if isinstance(raw, UnsetType):
        raw = value.bytes_value
    if isinstance(raw, str):
        try:
            return _data(out, 0x3A, base64.b64decode(raw))
        except (binascii.Error, ValueError):
            raise _NotFast from None
    return 0  # {} is an explicit empty value


def _attributes(out: list[bytes], tag: int, pairs: list[KeyValue] | None, depth: int = 0) -> int:
    """Key/values as repeated `tag` fields; a string value (most of them) is written without the general dispatch
    (as `_json._fill_attributes` reads it: no depth check)."""
    if pairs is None:
        return 0
    total = 0
    for kv in pairs:
        key = _key_field(kv.key)
        value = kv.value
        if value is None:
            head = _header(tag, len(key) + 2)
            out.append(head)
            out.append(key)
            out.append(_EMPTY_VALUE)
            total += len(head) + len(key) + 2
            continue
        text = value.stringValue
        if isinstance(text, str):
            data = _encoded(text)
            inner = _header(0x0A, len(data))
            outer = _header(0x12, len(inner) + len(data))
            size = len(key) + len(outer) + len(inner) + len(data)
            head = _header(tag, size)
            out.append(head)
            out.append(key)
            out.append(outer)
            out.append(inner)
            out.append(data)
            total += len(head) + size
            continue
        slot = _open(out)
        out.append(key)
        inner_slot = _open(out)
        total += _close(out, slot, tag, len(key) + _close(out, inner_slot, 0x12, _any(out, value, depth)))
    return total


def _key_field(key: str) -> bytes:
    field = _KEY_FIELDS.get(key)
    if field is None:
        data = _encoded(key)
        field = _header(0x0A, len(data)) + data
        if len(_KEY_FIELDS) < _MAX_KEYS:
            _KEY_FIELDS[key] = field
    return field


def _id_bytes(value: str | None, size: int, field: str) -> bytes:
    try:
        return _id(value, size, field)
    except _Bad:
        raise _NotFast from None


def _event(out: list[bytes], event: Event) -> int:
    size = _fixed64(out, 0x09, _first(event.timeUnixNano, event.time_unix_nano), "event.timeUnixNano")
    size += _text(out, 0x12, event.name)
    size += _attributes(out, 0x1A, event.attributes)
    return size + _number(out, 0x20, _ranged(_first(event.droppedAttributesCount, event.dropped_attributes_count), UINT32, "event.droppedAttributesCount"))


def _link(out: list[bytes], link: Link) -> int:
    size = 0
    linked = _id_bytes(_first(link.traceId, link.trace_id), 16, "link.traceId")
    if linked:
        size += _data(out, 0x0A, linked)
    linked = _id_bytes(_first(link.spanId, link.span_id), 8, "link.spanId")
    if linked:
        size += _data(out, 0x12, linked)
    size += _text(out, 0x1A, _first(link.traceState, link.trace_state) or "")
    size += _attributes(out, 0x22, link.attributes)
    size += _number(out, 0x28, _ranged(_first(link.droppedAttributesCount, link.dropped_attributes_count), UINT32, "link.droppedAttributesCount"))
    flags = _ranged(link.flags, UINT32, "link.flags")
    if flags:
        out.append(b"\x35")
        out.append(_pack_fixed32(flags))
        size += 5
    return size


def _span(out: list[bytes], span: Span, trace_id: bytes) -> int:
    """One span's message body (fields in number order), or `_NotFast` where `_json._fill_span` would reject or cut it."""
    span_id = _id_bytes(_first(span.spanId, span.span_id), 8, "spanId")
    if not trace_id or not span_id or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        raise _NotFast
    size = _data(out, 0x0A, trace_id) + _data(out, 0x12, span_id)
    size += _text(out, 0x1A, _first(span.traceState, span.trace_state) or "")
    parent = _id_bytes(_first(span.parentSpanId, span.parent_span_id), 8, "parentSpanId")
    if parent and parent != _ZERO_SPAN:
        size += _data(out, 0x22, parent)
    size += _text(out, 0x2A, span.name)
    size += _number(out, 0x30, _kind(span.kind, _SPAN_KINDS, "kind"))
    size += _fixed64(out, 0x39, _first(span.startTimeUnixNano, span.start_time_unix_nano), "startTimeUnixNano")
    size += _fixed64(out, 0x41, _first(span.endTimeUnixNano, span.end_time_unix_nano), "endTimeUnixNano")
    if not isinstance(span.attributes, UnsetType):
        size += _attributes(out, 0x4A, _decode_attributes(span.attributes))
    size += _number(out, 0x50, _ranged(_first(span.droppedAttributesCount, span.dropped_attributes_count), UINT32, "droppedAttributesCount"))
    if not isinstance(span.events, UnsetType):
        for event in _decode_events(span.events) or ():
            slot = _open(out)
            size += _close(out, slot, 0x5A, _event(out, event))
    size += _number(out, 0x60, _ranged(_first(span.droppedEventsCount, span.dropped_events_count), UINT32, "droppedEventsCount"))
    if not isinstance(span.links, UnsetType):
        for link in _decode_links(span.links) or ():
            slot = _open(out)
            size += _close(out, slot, 0x6A, _link(out, link))
    size += _number(out, 0x70, _ranged(_first(span.droppedLinksCount, span.dropped_links_count), UINT32, "droppedLinksCount"))
    slot, status = _open(out), 0  # present even when empty, as the exact way leaves it
    if span.status is not None:
        status = _text(out, 0x12, span.status.message)
        status += _number(out, 0x18, _kind(span.status.code, _STATUS_CODES, "status.code"))
    size += _close(out, slot, 0x7A, status)
    flags = _ranged(span.flags, UINT32, "flags")
    if flags:
        out.append(_FLAGS_TAG)
        out.append(_pack_fixed32(flags))
        size += 6
    return size


def _scope_spans(out: list[bytes], obj: ScopeSpans, keep: SpanFilter | None) -> int:
    scope = obj.scope
    if scope is None:
        scope = obj.instrumentationLibrary
    elif obj.instrumentationLibrary is not None:  # `{}` would give way to it in the exact way: let that decide
        raise _NotFast
    slot, size = _open(out), 0
    if scope is not None:
        size = _text(out, 0x0A, scope.name) + _text(out, 0x12, scope.version)
    total = _close(out, slot, 0x0A, size)
    for span in obj.spans or ():
        raw_trace = _first(span.traceId, span.trace_id)
        if keep is not None and not keep(raw_trace):
            continue
        slot = _open(out)
        total += _close(out, slot, 0x12, _span(out, span, _id_bytes(raw_trace, 16, "traceId")))
    return total + _text(out, 0x1A, _first(obj.schemaUrl, obj.schema_url) or "")


def _resource_spans(out: list[bytes], obj: ResourceSpans, keep: SpanFilter | None) -> int:
    slot = _open(out)
    total = _close(out, slot, 0x0A, _attributes(out, 0x0A, obj.resource.attributes) if obj.resource is not None else 0)
    scopes = _first(obj.scopeSpans, obj.scope_spans)
    if not scopes:
        scopes = obj.instrumentationLibrarySpans
    for scope in scopes or ():
        slot = _open(out)
        total += _close(out, slot, 0x12, _scope_spans(out, scope, keep))
    return total + _text(out, 0x1A, _first(obj.schemaUrl, obj.schema_url) or "")


def fast_request(text: bytes, keep: SpanFilter | None = None) -> ExportTraceServiceRequest | None:
    """An OTLP JSON trace request decoded the fast way, or None: take the exact way (`_json.parse_json`, `request_from_json`)."""
    wire = wire_request(text, keep)
    if wire is None:
        return None
    decoded = ExportTraceServiceRequest()
    try:
        decoded.ParseFromString(wire)
    except DecodeError:  # nested past upb's limit: the exact way says which span
        return None
    return decoded


def wire_request(text: bytes, keep: SpanFilter | None = None) -> bytes | None:
    """An OTLP JSON trace request as protobuf `ExportTraceServiceRequest` bytes, or None: take the exact way (`_json`).

    `keep`, given a span's raw trace id, says whether to map that span (a shard maps only its own):
    the others are parsed only as far as their trace ids.
    """
    if not text.isascii():
        try:
            text.decode()  # the typed parse does not look inside what it skips; the exact way repairs invalid UTF-8
        except UnicodeDecodeError:
            return None
    try:
        doc = _decode_request(text)
        if not isinstance(doc.resourceLogs, UnsetType) or not isinstance(doc.resource_logs, UnsetType):
            return None
        out: list[bytes] = []
        for group in _first(doc.resourceSpans, doc.resource_spans) or ():
            slot = _open(out)
            _close(out, slot, 0x0A, _resource_spans(out, group, keep))
    except (_NotFast, _Bad, *ParseError):
        return None
    return b"".join(out)
