"""A generated corpus of realistic agent traces (half OTel GenAI, half OpenInference; ~1 KB spans
with JSON arguments and results), shared by the ingest benchmarks and the pipeline tests."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

SPANS_PER_REQUEST = 1000


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


_ZERO_STANDIN = 1 << 127  # trace 0's id: the corpus numbers traces from 0, and an all-zero trace id is invalid OTLP


def _span(trace: int, n: int, parent: int | None, name: str, attrs: dict[str, object]) -> Span:
    start = 1_790_000_000_000_000_000 + trace * 10_000_000 + n * 1_000_000
    return Span(trace_id=(trace or _ZERO_STANDIN).to_bytes(16, "big"), span_id=(trace * 16 + n + 1).to_bytes(8, "big"),
                parent_span_id=(trace * 16 + parent + 1).to_bytes(8, "big") if parent is not None else b"",
                name=name, kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start, end_time_unix_nano=start + 900_000,
                attributes=[_kv(k, v) for k, v in attrs.items()])


def _genai_trace(trace: int) -> list[Span]:
    invoice = f"INV-{trace:06d}"
    args = json.dumps({"invoice_id": invoice, "amount": 4820.0 + trace % 97, "currency": "EUR", "memo": "net 30, early-payment discount 2% within 10 days; remit to the account on file and quote the PO number and the invoice number on the remittance advice"})
    result = json.dumps({"status": "ok", "invoice_id": invoice, "payment_id": f"PAY-{trace}", "scheduled_for": "2026-12-05", "ledger": {"account": "2100", "cost_center": "CC-17"},
                         "lines": [{"sku": f"SKU-{i}", "qty": i + 1, "unit_price": 12.5 * (i + 1), "tax_code": "VAT20"} for i in range(6)],
                         "note": "Matched against PO-7781 and goods receipt GR-5521; within tolerance on every line."})
    spans = [_span(trace, 0, None, "invoke_agent payer", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer", "gen_ai.conversation.id": invoice,
                                                          "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"Please pay {invoice}"}]}])})]
    for i, tool in enumerate(("get_invoice", "three_way_match", "schedule_payment")):
        call = f"call_{trace}_{i}"
        spans.append(_span(trace, 1 + 2 * i, 0, "chat claude", {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-haiku-4-5",
            "gen_ai.usage.input_tokens": 900 + i, "gen_ai.usage.output_tokens": 40 + i, "gen_ai.response.id": f"msg_{trace}_{i}",
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": call, "name": tool, "arguments": json.loads(args)}]}])}))
        spans.append(_span(trace, 2 + 2 * i, 0, f"execute_tool {tool}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.id": call,
            "gen_ai.tool.call.arguments": args, "gen_ai.tool.call.result": result}))
    return spans


def _openinference_trace(trace: int) -> list[Span]:
    order = f"ORD-{trace:06d}"
    args = json.dumps({"order_id": order, "amount": 129.99, "reason": "damaged in transit: the outer carton was crushed and two of the six units arrived cracked", "notify_customer": True, "channel": "email"})
    result = json.dumps({"refund_id": f"RF-{trace}", "order_id": order, "status": "issued", "amount": 129.99, "eta_days": 5, "note": "card ending 4242",
                         "history": [{"event": e, "at": f"2026-11-2{i}T10:00:00Z", "by": "agent"} for i, e in enumerate(("opened", "verified", "approved", "issued", "notified"))],
                         "policy": "Refunds up to 200.00 need no approval when the order is under 30 days old."})
    spans = [_span(trace, 0, None, "agent", {"openinference.span.kind": "AGENT", "input.value": f"Refund order {order}", "session.id": order})]
    for i, tool in enumerate(("get_order", "issue_refund", "send_email")):
        prefix = "llm.output_messages.0.message.tool_calls.0.tool_call"
        spans.append(_span(trace, 1 + 2 * i, 0, "ChatCompletion", {
            "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini", "llm.token_count.prompt": 800, "llm.token_count.completion": 30,
            "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": f"Refund order {order}",
            f"{prefix}.id": f"call_{trace}_{i}", f"{prefix}.function.name": tool, f"{prefix}.function.arguments": args}))
        spans.append(_span(trace, 2 + 2 * i, 0, tool, {
            "openinference.span.kind": "TOOL", "tool.name": tool, "input.value": args, "input.mime_type": "application/json",
            "output.value": result, "output.mime_type": "application/json"}))
    return spans


def build_requests(total_spans: int, spans_per_request: int = SPANS_PER_REQUEST, first_trace: int = 0) -> Iterator[ExportTraceServiceRequest]:
    """Export requests of about `spans_per_request` spans until `total_spans` are made."""
    trace, made, batch = first_trace, 0, []
    while made < total_spans:
        spans = (_genai_trace if trace % 2 == 0 else _openinference_trace)(trace)
        batch.extend(spans)
        made += len(spans)
        trace += 1
        if len(batch) >= spans_per_request or made >= total_spans:
            service = "bench-agent"
            yield ExportTraceServiceRequest(resource_spans=[ResourceSpans(
                resource=Resource(attributes=[_kv("service.name", service)]),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name="bench"), spans=batch)])])
            batch = []


# Keys normalisation and assembly read, for `odd_type_requests`: each gets values of every type.
READ_KEYS = (
    "openinference.span.kind", "gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result", "tool.name", "tool.id", "tool.parameters", "input.value", "output.value", "gen_ai.agent.name",
    "gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.id", "gen_ai.provider.name", "gen_ai.system",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens", "llm.token_count.prompt",
    "gen_ai.response.finish_reasons", "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.agent.handoff.target.name",
    "traceloop.span.kind", "traceloop.entity.name", "traceloop.entity.input", "traceloop.entity.output", "error.type",
    "gen_ai.tool.status", "plumbline.task.key", "session.id", "gen_ai.conversation.id", "final_result", "llm.model_name",
    "llm.input_messages.0.message.role", "llm.input_messages.0.message.content", "llm.output_messages.0.message.role",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments",
    "llm.output_messages.0.message.contents.0.message_content.text", "gen_ai.prompt.0.content", "gen_ai.completion.0.role",
)
_ODD_JSON = ({"a": 1}, [1, 2], {"role": "user", "content": 5}, [{"role": "assistant", "tool_calls": [{"function": {"name": 3, "arguments": [1]}}]}],
             {"inputs": 3}, {"args": [None], "kwargs": {}}, None, 3, "s", {"messages": [{"role": "tool", "content": {"x": 1}}]},
             [{"role": 7, "parts": [{"type": "tool_call", "name": 5, "arguments": 7, "id": [1]}]}], [{"type": "tool_result", "id": 2, "content": None}])


def _odd_value(rng: random.Random, depth: int = 0) -> AnyValue:
    value, kind = AnyValue(), rng.randrange(11 if depth < 2 else 6)
    if kind == 0:
        value.string_value = rng.choice(["", "x", "TOOL", "LLM", "AGENT", "chat", "execute_tool", "error", "__REDACTED__", "12"])
    elif kind == 1:
        value.int_value = rng.choice([0, -1, 7, 2**62])
    elif kind == 2:
        value.double_value = rng.choice([0.5, float("nan"), 1e300])
    elif kind == 3:
        value.bool_value = rng.random() < 0.5
    elif kind == 4:
        value.string_value = json.dumps(rng.choice(_ODD_JSON))
    elif kind == 5:
        value.bytes_value = b"\x00\xff"
    elif kind in (6, 7):
        value.array_value.values.extend(_odd_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    else:
        value.kvlist_value.values.extend(KeyValue(key=rng.choice(["role", "content", "name", "arguments", "type", "id"]), value=_odd_value(rng, depth + 1))
                                         for _ in range(rng.randrange(3)))
    return value


def odd_type_requests(count: int, seed: int = 0) -> Iterator[ExportTraceServiceRequest]:
    """Requests of one small trace each whose spans carry the keys plumbline reads (`READ_KEYS`) with
    values of every type and shape (numbers for names, text for counts, lists, maps, bytes, NaN,
    messages with numeric roles and ids): what a buggy or unusual producer can send."""
    for n in range(count):
        rng = random.Random(seed * 1_000_003 + n)
        scope = ScopeSpans(scope=InstrumentationScope(name=rng.choice(["", "openinference.instrumentation.smolagents", "gcp.vertex.agent"])))
        for i in range(rng.randrange(1, 5)):
            span = scope.spans.add(trace_id=(n + 1).to_bytes(16, "big"), span_id=(n * 8 + i + 1).to_bytes(8, "big"),
                                   parent_span_id=(n * 8 + 1).to_bytes(8, "big") if i else b"",
                                   name=rng.choice(["x", "execute_tool t", "final_answer"]), start_time_unix_nano=10 + i, end_time_unix_nano=20 + i)
            span.attributes.extend(KeyValue(key=key, value=_odd_value(rng)) for key in rng.sample(READ_KEYS, rng.randrange(2, 9)))
            if rng.random() < 0.4:
                event = span.events.add(name=rng.choice(["gen_ai.choice", "gen_ai.tool.message", "exception", "gen_ai.user.message",
                                                         "gen_ai.client.inference.operation.details", "gen_ai.tool.call.decision"]))
                keys = ["content", "message", "id", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.input.messages",
                        "gen_ai.output.messages", "gen_ai.tool.call.decision.outcome", "exception.type"]
                event.attributes.extend(KeyValue(key=key, value=_odd_value(rng)) for key in rng.sample(keys, 3))
        resource = Resource(attributes=[KeyValue(key="service.name", value=_odd_value(rng))])
        yield ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=resource, scope_spans=[scope])])


def burst_request(spans: int, text: int = 300, service: str = "burst") -> bytes:
    """One serialized request of `spans` tool spans, 100 to a trace, each with a `text`-byte argument: the
    bursts the memory test and the edge bench send to `plumbline serve`."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = service
    scope = resource_spans.scope_spans.add()
    trace_id = os.urandom(16)
    for i in range(spans):
        if i and i % 100 == 0:
            trace_id = os.urandom(16)
        span = scope.spans.add(trace_id=trace_id, span_id=os.urandom(8), name=f"execute_tool step {i}",
                               start_time_unix_nano=1_000 + i, end_time_unix_nano=2_000 + i)
        span.attributes.add(key="gen_ai.operation.name").value.string_value = "execute_tool"
        span.attributes.add(key="gen_ai.tool.call.arguments").value.string_value = "x" * text
    data: bytes = request.SerializeToString()
    return data
