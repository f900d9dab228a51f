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


# --- damage costs what it touches, over HTTP as in a file (issue 30 item 8) -----------------------


def _json_with_one_marked_span(request_pb: ExportTraceServiceRequest) -> tuple[bytes, int]:
    """The request as OTLP JSON with its second span's name "QQQQ-marker"; and its span count."""
    marked = ExportTraceServiceRequest()
    marked.CopyFrom(request_pb)
    spans = marked.resource_spans[0].scope_spans[0].spans
    spans[1].name = "QQQQ-marker"
    spans[1].attributes.add(key="x.ratio").value.double_value = 0.5
    return json.dumps(to_otlp_json(marked)).encode(), len(spans)


def _kept(decoded: object) -> list[str]:
    return [s.name for rs in decoded.request.resource_spans for ss in rs.scope_spans for s in ss.spans]  # type: ignore[attr-defined]


@pytest.mark.parametrize("number", [b"1e400", b"-1e999", b"1E+400"])
def test_a_number_out_of_range_costs_its_span_over_http_and_in_a_file(tmp_path: Path, request_pb: ExportTraceServiceRequest,
                                                                       number: bytes) -> None:
    # It used to reject the whole request (HTTP 400) and the whole file line.
    body, count = _json_with_one_marked_span(request_pb)
    body = body.replace(b'"doubleValue": 0.5', b'"doubleValue": ' + number, 1)
    assert number in body
    decoded = decode_request_body(body, "application/json")
    assert len(_kept(decoded)) == count - 1 and "QQQQ-marker" not in _kept(decoded)
    [problem] = decoded.problems
    assert problem.spans == 1 and "spans[1]" in problem.where and "out of the range" in problem.reason
    path = tmp_path / "big-number.jsonl"
    path.write_bytes(body + b"\n" + body + b"\n")
    assert _spans(path) == 2 * (count - 1)


def test_a_number_out_of_range_after_multibyte_text_is_found_where_it_is(request_pb: ExportTraceServiceRequest) -> None:
    body, count = _json_with_one_marked_span(request_pb)
    body = body.replace(b"QQQQ-marker", "QQQQ-\u00e9\u00e9\u2603".encode(), 1).replace(b'"doubleValue": 0.5', b'"doubleValue": 1e400', 1)
    decoded = decode_request_body(body, "application/json")
    assert len(_kept(decoded)) == count - 1


def test_an_out_of_range_time_costs_its_span() -> None:
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "good", "startTimeUnixNano": "1", "endTimeUnixNano": "2"},
        {"traceId": "ab" * 16, "spanId": "ce" * 8, "name": "bad", "startTimeUnixNano": 0, "endTimeUnixNano": "2"}]}]}]}
    body = json.dumps(doc).encode().replace(b'"startTimeUnixNano": 0', b'"startTimeUnixNano": 9e999')
    decoded = decode_request_body(body, "application/json")
    assert _kept(decoded) == ["good"]
    assert "startTimeUnixNano is a number out of range" in decoded.problems[0].reason


def test_invalid_utf8_over_http_keeps_the_request_and_says_so(request_pb: ExportTraceServiceRequest) -> None:
    # It used to be a 400 for the whole request while the file path kept the spans.
    body, count = _json_with_one_marked_span(request_pb)
    decoded = decode_request_body(body.replace(b"QQQQ-marker", b"QQQQ-\xff\xferker"), "application/json")
    assert len(_kept(decoded)) == count and "QQQQ-\ufffd\ufffdrker" in _kept(decoded)
    assert [p.reason for p in decoded.problems] == ["invalid UTF-8 replaced with U+FFFD"]


def test_json_nested_past_the_parser_limit_over_http_costs_one_attribute(request_pb: ExportTraceServiceRequest) -> None:
    body, count = _json_with_one_marked_span(request_pb)
    deep = b'{"kvlistValue": {"values": [{"key": "k", "value": ' * 600 + b"{}" + b"}]}}" * 600
    body = body.replace(b'{"doubleValue": 0.5}', deep, 1)
    decoded = decode_request_body(body, "application/json")
    assert len(_kept(decoded)) == count
    assert any("x.ratio" in p.where and "nested too deeply" in p.reason for p in decoded.problems)


def _one_span_request(trace_id: bytes, span_id: bytes, parent: bytes = b"") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="good", start_time_unix_nano=1, end_time_unix_nano=2)
    spans.add(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name="odd", start_time_unix_nano=1, end_time_unix_nano=2)
    return request


@pytest.mark.parametrize(("trace_id", "span_id", "parent", "why"), [
    (bytes(16), b"\x03" * 8, b"", "trace id 000000"),
    (b"\x01" * 16, bytes(8), b"", "span id 000000"),
    (b"\x01" * 16, b"\x03" * 8, b"\x04\x05\x06", "parent span id 040506 is invalid (3 bytes, not 8)"),
    (b"\x01" * 15, b"\x03" * 8, b"", "15 bytes, not 16"),
])
def test_invalid_ids_cost_their_span_in_protobuf_and_json(trace_id: bytes, span_id: bytes, parent: bytes, why: str) -> None:
    # All-zero ids and a 3-byte parent id used to be accepted silently.
    request = _one_span_request(trace_id, span_id, parent)
    decoded = decode_request_body(request.SerializeToString(), "application/x-protobuf")
    assert _kept(decoded) == ["good"] and decoded.raw is None
    [problem] = decoded.problems
    assert problem.spans == 1 and "spans[1]" in problem.where and why in problem.reason
    decoded = decode_request_body(json.dumps(to_otlp_json(request)).encode(), "application/json")
    assert _kept(decoded) == ["good"]
    assert decoded.problems[0].spans == 1 and "spans[1]" in decoded.problems[0].where


def test_an_all_zero_parent_id_means_no_parent() -> None:
    request = _one_span_request(b"\x01" * 16, b"\x03" * 8, bytes(8))
    for decoded in (decode_request_body(request.SerializeToString(), "application/x-protobuf"),
                    decode_request_body(json.dumps(to_otlp_json(request)).encode(), "application/json")):
        assert decoded.problems == [] and _kept(decoded) == ["good", "odd"]
        assert decoded.request.resource_spans[0].scope_spans[0].spans[1].parent_span_id == b""
