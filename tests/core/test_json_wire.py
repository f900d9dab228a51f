"""OTLP JSON's fast path (JSON to protobuf wire bytes, `decode/_json_wire.py`) against the exact mapping and `json_format`.

Every OTLP/JSON rule the fast path implements is checked three ways on the same request: the fast
path's message, the exact mapping's (`_json.request_from_json`, which names what is wrong in damaged
input) and `google.protobuf.json_format`'s (ids given to it as base64, which is what it reads). Damaged
input must leave the fast path (None) so that the exact mapping reports it, unchanged.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp import record, to_otlp_json

from core.spans import genai_run
from plumbline_otel.decode import Unit, decode_request_body, decode_unit
from plumbline_otel.decode._json import parse_json, request_from_json
from plumbline_otel.decode._json_wire import fast_request, wire_request
from plumbline_otel.pipeline._shard import json_shard_of

TRACE, SPAN, PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "00f067aa0ba902b7"
_IDS = {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"}


def _full_span(**extra: Any) -> dict[str, Any]:
    """A span with every field OTLP/JSON gives a span, and every kind of attribute value."""
    return {
        "traceId": TRACE, "spanId": SPAN, "parentSpanId": PARENT, "traceState": "vendor=1", "flags": 257,
        "name": "chat claude", "kind": 3, "startTimeUnixNano": "1790000000000000000", "endTimeUnixNano": "1790000000900000000",
        "attributes": [
            {"key": "s", "value": {"stringValue": "text with \"quotes\", a \\ and ünïcødé ☃"}},
            {"key": "empty", "value": {"stringValue": ""}},
            {"key": "i", "value": {"intValue": "-42"}},
            {"key": "b", "value": {"boolValue": False}},
            {"key": "d", "value": {"doubleValue": 2.5}},
            {"key": "a", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": 7}, {}, {"arrayValue": {}}]}}},
            {"key": "m", "value": {"kvlistValue": {"values": [{"key": "inner", "value": {"boolValue": True}}, {"key": "e", "value": {}}]}}},
            {"key": "raw", "value": {"bytesValue": base64.b64encode(b"\x00\x01\xfe").decode()}},
            {"key": "none", "value": {}},
            {"key": "ключ", "value": {"stringValue": "x" * 200}},
        ],
        "droppedAttributesCount": 2,
        "events": [{"timeUnixNano": "1790000000100000000", "name": "gen_ai.choice", "droppedAttributesCount": 1,
                    "attributes": [{"key": "index", "value": {"intValue": 0}}]}],
        "droppedEventsCount": 3,
        "links": [{"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "traceState": "k=v",
                   "attributes": [{"key": "why", "value": {"stringValue": "follows"}}], "droppedAttributesCount": 4, "flags": 1}],
        "droppedLinksCount": 5,
        "status": {"code": 2, "message": "boom"},
        **extra,
    }


def _request(*spans: dict[str, Any]) -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]},
        "scopeSpans": [{"scope": {"name": "lib", "version": "1.2"}, "spans": list(spans), "schemaUrl": "https://x/1"}],
        "schemaUrl": "https://x/2",
    }]}


def _snake(node: Any) -> Any:
    """The same JSON with every field name in lower_snake (attribute keys are data: left alone)."""
    if isinstance(node, dict):
        return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): _snake(v) for k, v in node.items()}
    return [_snake(v) for v in node] if isinstance(node, list) else node


def _json_format(doc: dict[str, Any]) -> ExportTraceServiceRequest:
    """`json_format`'s reading: it takes ids as base64 (protobuf's JSON for bytes), so the hex ids are given so."""
    def b64(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _IDS and isinstance(v, str) else b64(v) for k, v in node.items()}
        return [b64(v) for v in node] if isinstance(node, list) else node
    return ParseDict(b64(doc), ExportTraceServiceRequest(), ignore_unknown_fields=True)


def _fast(doc: Any, keep: Any = None) -> ExportTraceServiceRequest:
    """The fast path's message, which must be the exact mapping's, with no problem."""
    text = json.dumps(doc, ensure_ascii=False).encode()
    fast = fast_request(text, keep)
    assert fast is not None, "the fast path gave way on a well-formed request"
    exact = request_from_json(parse_json(text, "x")[0], "x", keep)
    assert exact.problems == []
    assert fast == exact.request
    return fast


@pytest.mark.parametrize("spelling", ["lowerCamelCase", "lower_snake"])
def test_every_field_and_value_kind_maps_as_json_format_maps_it(spelling: str) -> None:
    doc = _request(_full_span(), _full_span(spanId="b7ad6b7169203332", kind="SPAN_KIND_CLIENT", status={"code": "STATUS_CODE_OK"}))
    doc = _snake(doc) if spelling == "lower_snake" else doc
    fast = _fast(doc)
    assert fast == _json_format(doc)
    span = fast.resource_spans[0].scope_spans[0].spans[0]
    assert (span.trace_id.hex(), span.flags, span.kind, span.dropped_links_count, span.links[0].flags) == (TRACE, 257, 3, 5, 1)


def test_sixty_four_bit_integers_as_strings_or_numbers_and_enums_as_names_or_numbers() -> None:
    spans = [
        _full_span(startTimeUnixNano=5, endTimeUnixNano="18446744073709551615", kind="SPAN_KIND_SERVER",
                   attributes=[{"key": "max", "value": {"intValue": "9223372036854775807"}},
                               {"key": "min", "value": {"intValue": "-9223372036854775808"}},
                               {"key": "n", "value": {"intValue": 300}}, {"key": "f", "value": {"intValue": 4.0}},
                               {"key": "d", "value": {"doubleValue": 3}}]),
        _full_span(spanId="b7ad6b7169203332", kind=0, status={"code": 1}, flags="1"),
        _full_span(spanId="b7ad6b7169203333", kind=-1, status={"code": 2**31 - 1}),  # open enums: any int32
    ]
    fast = _fast(_request(*spans))
    assert fast == _json_format(_request(*spans))
    values = [kv.value.int_value for kv in fast.resource_spans[0].scope_spans[0].spans[0].attributes[:4]]
    assert values == [2**63 - 1, -(2**63), 300, 4]


def test_unknown_fields_are_ignored_at_every_level() -> None:
    span = _full_span(unknownSpanField={"deep": [1, 2, {"x": None}]})
    span["attributes"][0]["extra"] = 1
    span["events"][0]["what"] = "ever"
    span["status"]["future"] = True
    doc = _request(span)
    doc["resourceSpans"][0]["resource"]["other"] = []
    doc["futureSignal"] = {"a": 1}
    assert _fast(doc) == _json_format(doc)


def test_float_words_and_empty_values_keep_their_presence() -> None:
    words = [{"key": w, "value": {"doubleValue": w}} for w in ("NaN", "Infinity", "-Infinity")]
    doc = _request(_full_span(attributes=[*words, {"key": "z", "value": {"doubleValue": -0.0}}]))
    fast = fast_request(json.dumps(doc).encode())  # NaN is never equal to itself: compared as bytes
    exact = request_from_json(parse_json(json.dumps(doc).encode(), "x")[0], "x").request
    assert fast is not None
    assert fast.SerializeToString(deterministic=True) == exact.SerializeToString(deterministic=True) \
        == _json_format(doc).SerializeToString(deterministic=True)
    empty = _fast(_request(_full_span(attributes=[{"key": "e", "value": {}}, {"key": "s", "value": {"stringValue": ""}}])))
    e, s = empty.resource_spans[0].scope_spans[0].spans[0].attributes
    assert e.HasField("value") and e.value.WhichOneof("value") is None and s.value.WhichOneof("value") == "string_value"


def test_long_values_take_two_and_three_byte_lengths() -> None:
    for size in (127, 128, 16383, 16384, 70000):
        doc = _request(_full_span(attributes=[{"key": "k" * size, "value": {"stringValue": "v" * size}}]))
        assert _fast(doc) == _json_format(doc)


def test_the_collector_conventions_beyond_json_format() -> None:
    """An all-zero parent id is no parent; protobufjs's base64 ids; the legacy instrumentationLibrary names."""
    legacy = {"resourceSpans": [{"instrumentationLibrarySpans": [{
        "instrumentationLibrary": {"name": "old", "version": "0.1"},
        "spans": [_full_span(parentSpanId="0000000000000000", traceId=base64.b64encode(bytes.fromhex(TRACE)).decode())]}]}]}
    fast = _fast(legacy)
    span = fast.resource_spans[0].scope_spans[0].spans[0]
    assert (span.parent_span_id, span.trace_id.hex(), fast.resource_spans[0].scope_spans[0].scope.name) == (b"", TRACE, "old")


def test_a_shard_maps_only_its_own_spans() -> None:
    spans = [_full_span(traceId=f"{i:032x}", spanId=f"{i:016x}") for i in range(1, 9)]
    owned = []
    for me in (0, 1):
        fast = _fast(_request(*spans), lambda raw, me=me: json_shard_of(raw, 2) == me)
        owned.append({s.trace_id.hex() for s in fast.resource_spans[0].scope_spans[0].spans})
    assert owned[0] | owned[1] == {f"{i:032x}" for i in range(1, 9)} and not owned[0] & owned[1] and owned[0] and owned[1]


def test_a_recorded_sdk_request_maps_as_the_sdk_exported_it() -> None:
    request_pb = record(genai_run)
    assert _fast(to_otlp_json(request_pb)) == request_pb


def _damaged() -> list[tuple[str, bytes]]:
    good = _request(_full_span())

    def edit(change: Any) -> bytes:
        doc = copy.deepcopy(good)
        change(doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0])
        return json.dumps(doc).encode()

    def nest(depth: int) -> dict[str, Any]:
        value: dict[str, Any] = {"stringValue": "leaf"}
        for _ in range(depth):
            value = {"arrayValue": {"values": [value]}}
        return value

    text = json.dumps(good).encode()
    return [
        ("bad span id", edit(lambda s: s.update(spanId="xyz"))),
        ("all-zero trace id", edit(lambda s: s.update(traceId="0" * 32))),
        ("no span id", edit(lambda s: s.pop("spanId"))),
        ("an integer that is not one", edit(lambda s: s["attributes"].append({"key": "n", "value": {"intValue": "many"}}))),
        ("a null inside a value (read as empty)", edit(lambda s: s["attributes"].append({"key": "n", "value": {"stringValue": None}}))),
        ("a negative status code", edit(lambda s: s.update(status={"code": -2**31 - 1}))),
        ("a time past uint64", edit(lambda s: s.update(startTimeUnixNano=str(2**64)))),
        ("a boolean kind", edit(lambda s: s.update(kind=True))),
        ("a span that is no object", edit(lambda s: s.clear())),
        ("nested past 30 levels", edit(lambda s: s["attributes"].append({"key": "deep", "value": nest(31)}))),
        ("a number out of range", text.replace(b'"doubleValue": 2.5', b'"doubleValue": 1e400')),
        ("invalid UTF-8", text.replace(b"chat claude", b"chat \xff claude")),
        ("a lone surrogate", text.replace(b"chat claude", b"chat \\ud800 claude")),
        ("not JSON", text[:-3]),
        ("a logs request", json.dumps({"resourceLogs": []}).encode()),
        ("a JSON array", b"[1, 2]"),
    ]


@pytest.mark.parametrize("why,text", _damaged(), ids=[why for why, _ in _damaged()])
def test_damage_leaves_the_fast_path_and_is_reported_as_before(why: str, text: bytes) -> None:
    assert wire_request(text) is None, why
    decoded = decode_unit(Unit("json", text, "f.jsonl:3"))
    try:
        doc, repaired = parse_json(text, "f.jsonl:3")
    except Exception as exc:  # noqa: BLE001 - the unit's problem is the parse error's text
        assert [p.reason for p in decoded.problems] == [str(exc).removeprefix("f.jsonl:3: ")]
        return
    if isinstance(doc, dict) and "resourceLogs" in doc:
        assert decoded.logs is not None
        return
    exact = request_from_json(doc, "f.jsonl:3")
    assert decoded.request == exact.request
    assert [str(p) for p in decoded.problems] == [str(p) for p in exact.problems + repaired]
    assert all(p.where.startswith("f.jsonl:3") for p in decoded.problems) and (decoded.problems or "read as empty" in why)


def test_an_otlp_http_json_body_takes_the_fast_path_and_its_damage_the_exact_one() -> None:
    doc = _request(_full_span())
    body = json.dumps(doc).encode()
    assert decode_request_body(body, "application/json; charset=utf-8").request == _json_format(doc)
    bad = _request(_full_span(), _full_span(spanId="xyz"))
    decoded = decode_request_body(json.dumps(bad).encode(), "application/json")
    assert len(decoded.request.resource_spans[0].scope_spans[0].spans) == 1
    assert [p.where for p in decoded.problems] == ["request resourceSpans[0].scopeSpans[0].spans[1] (spanId xyz)"]


@pytest.mark.parametrize("change,where", [
    (lambda s: s.update(name=5), "f.jsonl:3 resourceSpans[0].scopeSpans[0].spans[0] (spanId b7ad6b7169203331)"),
    (lambda s: s.update(events=[{"name": ["x"]}]), "f.jsonl:3 resourceSpans[0].scopeSpans[0].spans[0] (spanId b7ad6b7169203331)"),
    (lambda s: s.update(status="OK"), "f.jsonl:3 resourceSpans[0].scopeSpans[0].spans[0] (spanId b7ad6b7169203331)"),
])
def test_a_field_of_another_json_type_costs_its_span_by_name(change: Any, where: str) -> None:
    doc = _request(_full_span(), _full_span(spanId="b7ad6b7169203332"))
    change(doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0])
    text = json.dumps(doc).encode()
    assert wire_request(text) is None
    decoded = decode_unit(Unit("json", text, "f.jsonl:3"))
    assert [s.span_id.hex() for s in decoded.request.resource_spans[0].scope_spans[0].spans] == ["b7ad6b7169203332"]
    assert [(p.where, p.spans) for p in decoded.problems] == [(where, 1)] and "wrong JSON type" in decoded.problems[0].reason


def test_an_envelope_of_another_json_type_costs_its_group_and_counts_its_spans() -> None:
    doc = _request(_full_span(), _full_span(spanId="b7ad6b7169203332"))
    doc["resourceSpans"].append(copy.deepcopy(doc["resourceSpans"][0]))
    doc["resourceSpans"][0]["scopeSpans"][0]["scope"] = {"name": 7}
    decoded = decode_unit(Unit("json", json.dumps(doc).encode(), "f.jsonl:3"))
    assert len(decoded.request.resource_spans) == 1 and len(decoded.request.resource_spans[0].scope_spans[0].spans) == 2
    assert [(p.where, p.spans) for p in decoded.problems] == [("f.jsonl:3 resourceSpans[0]", 2)]
