"""Normalisation per span: each convention's fields, failures, and values that break limits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
from opentelemetry.trace import Status, StatusCode, Tracer
from otlp import record

from plumbline_otel.model import SpanRecord
from plumbline_otel.normalise import Limits, normalise_request


def _one(attrs: dict[str, Any], name: str = "span", error: bool = False, events: Sequence[tuple[str, dict[str, Any]]] = ()) -> SpanRecord:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span(name, attributes=attrs) as span:
            for event_name, event_attrs in events:
                span.add_event(event_name, event_attrs)
            if error:
                span.set_status(Status(StatusCode.ERROR, "failed"))

    records, problems = normalise_request(record(build))
    assert problems == []
    return records[0]


def test_genai_tool_span_reads_name_call_id_arguments_and_result() -> None:
    rec = _one({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_invoice", "gen_ai.tool.call.id": "c1",
                "gen_ai.tool.call.arguments": '{"invoice_id": "INV-1"}', "gen_ai.tool.call.result": '{"amount": 12.5}'})
    assert (rec.convention, rec.step_kind, rec.tool_name, rec.call_id) == ("genai", "tool_call", "get_invoice", "c1")
    assert rec.args == {"invoice_id": "INV-1"} and rec.args_state == "structured"
    assert rec.result == {"amount": 12.5} and rec.error is None


def test_structured_anyvalue_arguments_are_read_like_json_strings() -> None:
    args = AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="invoice_id", value=AnyValue(string_value="INV-1")),
                                                       KeyValue(key="amount", value=AnyValue(double_value=4820.0))]))
    request = record(lambda t: t.start_span("execute_tool pay", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay"}).end())
    request.resource_spans[0].scope_spans[0].spans[0].attributes.append(KeyValue(key="gen_ai.tool.call.arguments", value=args))
    [rec], _ = normalise_request(request)
    assert rec.args == {"invoice_id": "INV-1", "amount": 4820.0} and rec.args_state == "structured"


def test_openinference_tool_arguments_come_from_input_value_not_the_schema() -> None:
    schema = json.dumps({"type": "object", "properties": {"invoice_id": {"type": "string"}}})
    rec = _one({"openinference.span.kind": "TOOL", "tool.name": "get_invoice", "tool.parameters": schema,
                "input.value": '{"invoice_id": "INV-7"}', "input.mime_type": "application/json", "output.value": "ok"})
    assert (rec.convention, rec.tool_name, rec.args, rec.result) == ("openinference", "get_invoice", {"invoice_id": "INV-7"}, "ok")
    # producers that put the actual arguments in tool.parameters are read too
    rec = _one({"openinference.span.kind": "TOOL", "tool.name": "t", "tool.parameters": '{"invoice_id": "INV-8"}'})
    assert rec.args == {"invoice_id": "INV-8"}


def test_openinference_llm_span_flattened_tool_calls_in_both_places() -> None:
    prefix = "llm.output_messages.0.message"
    rec = _one({"openinference.span.kind": "LLM", "llm.model_name": "gpt-x", "llm.token_count.prompt": 9, "llm.token_count.completion": 3,
                f"{prefix}.role": "assistant",
                f"{prefix}.tool_calls.0.tool_call.id": "a", f"{prefix}.tool_calls.0.tool_call.function.name": "f",
                f"{prefix}.tool_calls.0.tool_call.function.arguments": '{"x": 1}',
                f"{prefix}.tool_calls.1.tool_call.id": "b", f"{prefix}.tool_calls.1.tool_call.function.name": "g",
                f"{prefix}.tool_calls.1.tool_call.function.arguments": '{"y": 2}',
                "llm.output_messages.1.message.contents.0.tool_call.function.name": "h",
                "llm.output_messages.1.message.contents.0.tool_call.function.arguments": '{"z": 3}',
                "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "hello",
                "llm.input_messages.1.message.role": "tool", "llm.input_messages.1.message.tool_call_id": "prev",
                "llm.input_messages.1.message.content": '{"ok": true}'})
    assert [(c.name, c.args, c.call_id) for c in rec.proposed_calls] == [("f", {"x": 1}, "a"), ("g", {"y": 2}, "b"), ("h", {"z": 3}, None)]
    assert [(r.call_id, r.result) for r in rec.tool_results] == [("prev", {"ok": True})]
    assert (rec.model, rec.input_tokens, rec.output_tokens, rec.input_text) == ("gpt-x", 9, 3, "hello")


def test_older_genai_indexed_attributes_and_span_events() -> None:
    rec = _one({"gen_ai.system": "OpenAI", "llm.request.type": "chat", "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hi",
                "gen_ai.completion.0.tool_calls.0.name": "lookup", "gen_ai.completion.0.tool_calls.0.arguments": '{"q": "a"}',
                "gen_ai.completion.0.tool_calls.0.id": "t1", "gen_ai.usage.prompt_tokens": 4})
    assert (rec.convention, rec.provider, rec.input_tokens) == ("genai_legacy", "openai", 4)
    assert [(c.name, c.args, c.call_id) for c in rec.proposed_calls] == [("lookup", {"q": "a"}, "t1")]
    rec = _one({"gen_ai.operation.name": "chat"}, events=[
        ("gen_ai.user.message", {"content": "book it"}),
        ("gen_ai.choice", {"message": json.dumps({"role": "assistant", "tool_calls": [{"id": "k", "function": {"name": "book", "arguments": "{\"d\": 1}"}}]})}),
    ])
    assert rec.input_text == "book it" and [(c.name, c.args) for c in rec.proposed_calls] == [("book", {"d": 1})]


def test_traceloop_tool_entity_kwargs_are_the_arguments() -> None:
    rec = _one({"traceloop.span.kind": "tool", "traceloop.entity.name": "get_weather",
                "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"city": "Paris"}}), "traceloop.entity.output": '"rainy"'})
    assert (rec.convention, rec.step_kind, rec.tool_name, rec.args, rec.result) == ("traceloop", "tool_call", "get_weather", {"city": "Paris"}, "rainy")


def test_redacted_arguments_are_hidden_not_values() -> None:
    rec = _one({"openinference.span.kind": "TOOL", "tool.name": "t", "input.value": "__REDACTED__"})
    assert rec.args is None and rec.args_state == "redacted"


def test_every_failure_signal_marks_the_step_failed() -> None:
    base = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
    assert _one(base, error=True).error == "failed"
    assert _one({**base, "error.type": "TimeoutError"}).error == "TimeoutError"
    assert _one(base, events=[("exception", {"exception.type": "ValueError", "exception.message": "bad id"})]).error == "ValueError: bad id"
    assert _one({**base, "gen_ai.tool.call.result": '{"is_error": true, "content": "x"}'}).error == "error result"
    assert _one(base).error is None


def test_unknown_spans_are_kept_and_unrecognised_genai_keys_listed() -> None:
    plain = _one({"http.method": "GET"})
    assert (plain.convention, plain.step_kind, plain.attributes) == ("unknown", "other", {"http.method": "GET"})
    rec = _one({"gen_ai.operation.name": "chat", "gen_ai.token.type": "input", "gen_ai.request.model": "m"})
    assert rec.unknown_keys == ["gen_ai.token.type"]


def test_a_value_past_a_limit_is_dropped_from_its_span_which_is_kept() -> None:
    big = "x" * 2000
    deep = AnyValue(string_value="leaf")
    for _ in range(20):
        deep = AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=deep)]))
    request = record(lambda t: t.start_span("execute_tool t", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.result": big}).end())
    request.resource_spans[0].scope_spans[0].spans[0].attributes.append(KeyValue(key="deep", value=deep))
    request = ExportTraceServiceRequest.FromString(request.SerializeToString())
    [rec], problems = normalise_request(request, Limits(max_value_bytes=1000, max_depth=10))
    assert rec.tool_name == "t" and rec.result is None and rec.dropped_attributes_count == 2
    assert sorted(p.where.split()[-1] for p in problems) == ["'deep'", "'gen_ai.tool.call.result'"]
    assert any("exceeds" in p.reason for p in problems) and any("nested deeper" in p.reason for p in problems)


def test_flattened_keys_unflatten_in_index_order_across_gaps_and_keep_mixed_levels_as_maps() -> None:
    from plumbline_otel.normalise._values import unflatten

    attrs = {"m.10.message.role": "tool", "m.2.message.role": "user", "m.2.message.tool_calls.1.id": "b",
             "m.2.message.tool_calls.0.id": "a", "m.x.0": "named", "m.x.1": "and", "m.3": "indexed", "other": 1}
    # index 10 after 3 after 2 (not by text), a gap kept as order only; "x" beside indexes stays a map
    assert unflatten(attrs, "m") == {10: {"message": {"role": "tool"}}, 2: {"message": {"role": "user", "tool_calls": [{"id": "a"}, {"id": "b"}]}},
                                     "x": ["named", "and"], 3: "indexed"}
    del attrs["m.x.0"], attrs["m.x.1"]
    assert unflatten(attrs, "m") == [{"message": {"role": "user", "tool_calls": [{"id": "a"}, {"id": "b"}]}}, "indexed", {"message": {"role": "tool"}}]
    assert unflatten(attrs, "absent") == []


def test_flattened_keys_below_a_plain_value_are_not_read_and_below_a_map_value_go_into_it() -> None:
    from plumbline_otel.normalise._values import unflatten

    # `m.0` is text, so `m.0.role` has nowhere to go; `m.1` is a map (an AnyValue kvlist), so `m.1.role` joins it
    attrs = {"m.0": "text", "m.0.role": "user", "m.1": {"content": "hi"}, "m.1.role": "assistant", "m.": "empty path"}
    assert unflatten(attrs, "m") == ["text", {"content": "hi", "role": "assistant"}]
    assert unflatten({"m.1.a": 1, "m.1.a.b": 2, "m.0": 0}, "m") == [0, {"a": 1}]  # `m.1.a` is a plain value: `m.1.a.b` is not read


def test_unknown_keys_are_the_kept_keys_of_namespaces_we_read_sorted_and_events_are_read_by_index() -> None:
    big = "x" * 2000
    request = record(lambda t: t.start_span("chat m", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.zeta": "z", "llm.alpha": 1, "gen_ai.request.model": "m", "vendor.key": "v",
        "gen_ai.too.big": big}).end())
    span = request.resource_spans[0].scope_spans[0].spans[0]
    event = span.events.add(name="gen_ai.guardrail.result", time_unix_nano=7)
    event.attributes.append(KeyValue(key="gen_ai.guardrail.outcome", value=AnyValue(string_value="deny")))
    [rec], problems = normalise_request(ExportTraceServiceRequest.FromString(request.SerializeToString()), Limits(max_value_bytes=1000))
    assert rec.unknown_keys == ["gen_ai.zeta", "llm.alpha"]  # the dropped one is no key of the span's; vendor.key is no namespace of ours
    assert [p.where for p in problems] == [f"span {rec.span_id} attribute 'gen_ai.too.big'"]
    assert [(e.name, e.attributes, e.time_ns) for e in rec.run_events] == [("gen_ai.guardrail.result", {"gen_ai.guardrail.outcome": "deny"}, 7)]
    plain = record(lambda t: t.start_span("plain", attributes={"http.method": "GET"}).end())
    [rec], _ = normalise_request(plain)
    assert rec.unknown_keys == [] and rec.run_events == []
