"""The shapes of an OTLP JSON trace request, for msgspec to parse straight into (`_json_wire`'s fast path).

Typed parsing builds a slotted object per message instead of a dict per object and a string per key,
and a span's attributes, events and links stay raw JSON (`msgspec.Raw`, a slice of the input) until
the shard that owns the span asks for them: a shard parses other shards' spans only as far as their
trace ids. Both spellings of a field are declared (lowerCamelCase, as OTLP/JSON writes it, and
lower_snake, which receivers accept); anything else is ignored, as OTLP asks.

The types admit only what the exact mapping (`_json.request_from_json`) maps the same way: a value
of another type (a null inside an AnyValue, a span that is not an object, ...) fails the parse, and
the document goes the exact way, which names what was wrong. Not compiled: msgspec builds these
classes with its own metaclass.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

Integer = int | float | str  # an int64/uint64/enum: a number or a decimal string (or an enum's name)


class AnyValue(Struct, gc=False):
    """One attribute value: the first of its fields present, in `_json._fill_any`'s order, is the value."""

    stringValue: str | UnsetType = UNSET
    string_value: str | UnsetType = UNSET
    intValue: Integer | UnsetType = UNSET
    int_value: Integer | UnsetType = UNSET
    boolValue: bool | UnsetType = UNSET
    bool_value: bool | UnsetType = UNSET
    doubleValue: float | str | UnsetType = UNSET
    double_value: float | str | UnsetType = UNSET
    arrayValue: ArrayValue | UnsetType = UNSET
    array_value: ArrayValue | UnsetType = UNSET
    kvlistValue: KeyValueList | UnsetType = UNSET
    kvlist_value: KeyValueList | UnsetType = UNSET
    bytesValue: str | UnsetType = UNSET
    bytes_value: str | UnsetType = UNSET


class ArrayValue(Struct, gc=False):
    values: list[AnyValue] | None = None


class KeyValue(Struct, gc=False):
    key: str
    value: AnyValue | None = None


class KeyValueList(Struct, gc=False):
    values: list[KeyValue] | None = None


class Event(Struct, gc=False):
    timeUnixNano: Integer | None = None
    time_unix_nano: Integer | None = None
    name: str = ""
    attributes: list[KeyValue] | None = None
    droppedAttributesCount: Integer | None = None
    dropped_attributes_count: Integer | None = None


class Link(Struct, gc=False):
    traceId: str | None = None
    trace_id: str | None = None
    spanId: str | None = None
    span_id: str | None = None
    traceState: str | None = None
    trace_state: str | None = None
    attributes: list[KeyValue] | None = None
    droppedAttributesCount: Integer | None = None
    dropped_attributes_count: Integer | None = None
    flags: Integer = 0


class Status(Struct, gc=False):
    code: Integer = 0
    message: str = ""


class Span(Struct, gc=False):
    """A span with its attributes, events and links left as raw JSON, parsed only by the shard that owns it."""

    traceId: str | None = None
    trace_id: str | None = None
    spanId: str | None = None
    span_id: str | None = None
    parentSpanId: str | None = None
    parent_span_id: str | None = None
    traceState: str | None = None
    trace_state: str | None = None
    flags: Integer = 0
    name: str = ""
    kind: Integer = 0
    startTimeUnixNano: Integer | None = None
    start_time_unix_nano: Integer | None = None
    endTimeUnixNano: Integer | None = None
    end_time_unix_nano: Integer | None = None
    attributes: Raw | UnsetType = UNSET
    droppedAttributesCount: Integer | None = None
    dropped_attributes_count: Integer | None = None
    events: Raw | UnsetType = UNSET
    droppedEventsCount: Integer | None = None
    dropped_events_count: Integer | None = None
    links: Raw | UnsetType = UNSET
    droppedLinksCount: Integer | None = None
    dropped_links_count: Integer | None = None
    status: Status | None = None


class Scope(Struct, gc=False):
    name: str = ""
    version: str = ""


class ScopeSpans(Struct, gc=False):
    scope: Scope | None = None
    instrumentationLibrary: Scope | None = None
    spans: list[Span] | None = None
    schemaUrl: str | None = None
    schema_url: str | None = None


class Resource(Struct, gc=False):
    attributes: list[KeyValue] | None = None


class ResourceSpans(Struct, gc=False):
    resource: Resource | None = None
    scopeSpans: list[ScopeSpans] | None = None
    scope_spans: list[ScopeSpans] | None = None
    instrumentationLibrarySpans: list[ScopeSpans] | None = None
    schemaUrl: str | None = None
    schema_url: str | None = None


class Request(Struct, gc=False):
    """An export request; a logs request's field (present, whatever its value) sends the document the exact way."""

    resourceSpans: list[ResourceSpans] | None = None
    resource_spans: list[ResourceSpans] | None = None
    resourceLogs: Raw | UnsetType = UNSET
    resource_logs: Raw | UnsetType = UNSET


ParseError = (msgspec.DecodeError, RecursionError)  # what a parse below raises for JSON the exact way must judge (ValidationError is a DecodeError)
request = msgspec.json.Decoder(Request).decode
attributes = msgspec.json.Decoder(list[KeyValue] | None).decode
events = msgspec.json.Decoder(list[Event] | None).decode
links = msgspec.json.Decoder(list[Link] | None).decode
