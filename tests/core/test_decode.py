"""Decoding trace files and bodies: every form, and bad input that costs only itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp import record, to_otlp_json

from core.spans import genai_run
from plumbline_otel.decode import Unit, decode_request_body, decode_unit, read_trace_file, request_from_json
from plumbline_otel.errors import MalformedRequest
from plumbline_otel.normalise import normalise_request


@pytest.fixture(scope="module")
def request_pb() -> ExportTraceServiceRequest:
    return record(genai_run)


def _spans(path: Path) -> int:
    return sum(len(s.spans) for d in read_trace_file(path) for rs in d.request.resource_spans for s in rs.scope_spans)


def test_json_mapping_equals_the_protobuf_the_sdk_exported(request_pb: ExportTraceServiceRequest) -> None:
    decoded = request_from_json(to_otlp_json(request_pb), "x")
    assert decoded.problems == []
    assert decoded.request == request_pb


def test_every_file_form_is_detected_from_content_not_name(tmp_path: Path, request_pb: ExportTraceServiceRequest) -> None:
    body = request_pb.SerializeToString()
    doc = to_otlp_json(request_pb)
    forms = {
        "a.bin": body,
        "b.data": gzip.compress(body),
        "c.txt": json.dumps(doc, indent=2).encode(),
        "d.log": (json.dumps(doc) + "\n" + json.dumps(doc) + "\n").encode(),
        "e.gz": gzip.compress((json.dumps(doc) + "\n").encode()),
        "f.stream": len(body).to_bytes(4, "big") + body + len(body).to_bytes(4, "big") + body,
    }
    n = len(request_pb.resource_spans[0].scope_spans[0].spans)
    expected = {"a.bin": n, "b.data": n, "c.txt": n, "d.log": 2 * n, "e.gz": n, "f.stream": 2 * n}
    for name, data in forms.items():
        (tmp_path / name).write_bytes(data)
        assert _spans(tmp_path / name) == expected[name], name


def test_json_accepts_snake_case_enum_names_and_numeric_int64() -> None:
    doc = {"resource_spans": [{"scope_spans": [{"spans": [{
        "trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331",
        "kind": "SPAN_KIND_INTERNAL", "start_time_unix_nano": 5, "end_time_unix_nano": "7",
        "status": {"code": "STATUS_CODE_ERROR"},
        "attributes": [{"key": "n", "value": {"intValue": 3}}, {"key": "d", "value": {"doubleValue": "NaN"}}],
    }]}]}]}
    decoded = request_from_json(doc, "x")
    span = decoded.request.resource_spans[0].scope_spans[0].spans[0]
    assert decoded.problems == []
    assert span.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c" and len(span.span_id) == 8
    assert (span.kind, span.status.code, span.end_time_unix_nano) == (1, 2, 7)


def test_malformed_span_id_rejects_that_span_only(request_pb: ExportTraceServiceRequest) -> None:
    doc = to_otlp_json(request_pb)
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[1]["spanId"] = "xyz"
    spans[2]["attributes"].append({"key": "gen_ai.usage.input_tokens", "value": {"intValue": "many"}})
    decoded = request_from_json(doc, "f.json:3")
    kept = decoded.request.resource_spans[0].scope_spans[0].spans
    assert len(kept) == len(spans) - 2
    assert [p.spans for p in decoded.problems] == [1, 1]
    assert "spanId 'xyz' is not a 16-character hex id" in decoded.problems[0].reason
    assert decoded.problems[0].where.startswith("f.json:3 resourceSpans[0].scopeSpans[0].spans[1]")
    assert "gen_ai.usage.input_tokens" in decoded.problems[1].reason


def test_invalid_json_line_is_reported_with_its_line_and_the_rest_kept(tmp_path: Path, request_pb: ExportTraceServiceRequest) -> None:
    line = json.dumps(to_otlp_json(request_pb))
    path = tmp_path / "traces.jsonl"
    path.write_text(line + "\n{not json\n" + line + "\n")
    decoded = list(read_trace_file(path))
    problems = [p for d in decoded for p in d.problems]
    assert len(problems) == 1 and problems[0].where == f"{path}:2" and "invalid JSON" in problems[0].reason
    assert _spans(path) == 2 * len(request_pb.resource_spans[0].scope_spans[0].spans)


def test_invalid_utf8_in_a_json_line_keeps_the_line_and_says_so(tmp_path: Path, request_pb: ExportTraceServiceRequest) -> None:
    line = json.dumps(to_otlp_json(request_pb)).encode().replace(b"Pay invoice", b"Pay \xff\xfe invoice", 1)
    path = tmp_path / "bad-utf8.jsonl"
    path.write_bytes(line + b"\n")
    [decoded] = list(read_trace_file(path))
    assert any("invalid UTF-8" in p.reason for p in decoded.problems)
    assert len(decoded.request.resource_spans[0].scope_spans[0].spans) == len(request_pb.resource_spans[0].scope_spans[0].spans)


def test_truncated_protobuf_keeps_the_complete_spans_before_the_cut(request_pb: ExportTraceServiceRequest) -> None:
    body = request_pb.SerializeToString()
    decoded = decode_request_body(body[: int(len(body) * 0.7)], "application/x-protobuf")
    kept = sum(len(s.spans) for rs in decoded.request.resource_spans for s in rs.scope_spans)
    assert 0 < kept < len(request_pb.resource_spans[0].scope_spans[0].spans)
    assert any("truncated" in p.reason for p in decoded.problems)


def test_invalid_utf8_inside_one_protobuf_span_costs_only_that_span(request_pb: ExportTraceServiceRequest) -> None:
    marked = ExportTraceServiceRequest()
    marked.CopyFrom(request_pb)
    marked.resource_spans[0].scope_spans[0].spans[0].name = "QQQQ-marker"
    body = marked.SerializeToString().replace(b"QQQQ-marker", b"QQQQ-\xff\xferker")
    decoded = decode_request_body(body, "application/x-protobuf")
    kept = decoded.request.resource_spans[0].scope_spans[0].spans
    assert len(kept) == len(request_pb.resource_spans[0].scope_spans[0].spans) - 1
    assert decoded.problems[0].spans == 1 and "spans[0]" in decoded.problems[0].where


def test_garbage_body_is_a_malformed_request() -> None:
    with pytest.raises(MalformedRequest):
        decode_request_body(b"\xff\xff\xff\xff not protobuf", "application/x-protobuf")
    with pytest.raises(MalformedRequest, match="invalid JSON"):
        decode_request_body(b"{nope", "application/json; charset=utf-8")


def test_gzip_bodies_are_inflated_and_capped() -> None:
    from plumbline_otel.decode._request import BodyTooLarge

    body = gzip.compress(b'{"resourceSpans": []}' + b" " * 5000)
    assert decode_request_body(body, "application/json", "gzip").problems == []
    with pytest.raises(BodyTooLarge):
        decode_request_body(body, "application/json", "gzip", limit=1000)


@pytest.mark.parametrize("transport", ["file", "server"])
def test_deeply_nested_json_value_drops_its_attribute_only(request_pb: ExportTraceServiceRequest, transport: str) -> None:
    """A value nested past the limit costs that attribute, named in a problem; its span and neighbours
    stay, whether the JSON is read from a file or re-read by a server's shard from protobuf bytes."""
    value: dict = {"stringValue": "leaf"}
    for _ in range(200):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    doc = to_otlp_json(request_pb)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"].append({"key": "deep", "value": value})
    decoded = request_from_json(doc, "x")
    if transport == "server":  # the receiver queues the request as protobuf bytes; a shard parses them again
        decoded = decode_unit(Unit("protobuf", decoded.protobuf(), "x"))
    records, problems = normalise_request(decoded.request)
    assert len(records) == len(request_pb.resource_spans[0].scope_spans[0].spans)
    [deep] = [r for r in records if r.span_id == span["spanId"]]
    assert "deep" not in deep.attributes and len(deep.attributes) == len(span["attributes"]) - 1
    assert deep.dropped_attributes_count == 1
    assert problems == [] and [p.reason for p in request_from_json(doc, "x").problems] == ["dropped: nested too deeply to read"]
