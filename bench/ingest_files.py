"""File ingest benchmark: spans/s from OTLP files to committed DuckDB rows, by stage, with peak memory.

    .venv/bin/python bench/ingest_files.py [--spans 200000]

Builds a file of realistic agent spans (half OTel GenAI, half OpenInference; ~1 KB each with JSON
arguments and results), as OTLP JSON lines and as a length-prefixed protobuf stream (the
Collector file exporter's two formats), then ingests each in a fresh process into a fresh DuckDB
file. The peer, measured side by side on the same JSON, is `google.protobuf.json_format`, the
decoder this project would otherwise use for OTLP JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def _span(trace: int, n: int, parent: int | None, name: str, attrs: dict[str, object]) -> Span:
    start = 1_790_000_000_000_000_000 + trace * 10_000_000 + n * 1_000_000
    return Span(trace_id=trace.to_bytes(16, "big"), span_id=(trace * 16 + n + 1).to_bytes(8, "big"),
                parent_span_id=(trace * 16 + parent + 1).to_bytes(8, "big") if parent is not None else b"",
                name=name, kind=1, start_time_unix_nano=start, end_time_unix_nano=start + 900_000,
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


def build_requests(total_spans: int):  # type: ignore[no-untyped-def]
    """Yield export requests of SPANS_PER_REQUEST spans until `total_spans` are made."""
    trace, made, batch = 0, 0, []
    while made < total_spans:
        spans = (_genai_trace if trace % 2 == 0 else _openinference_trace)(trace)
        batch.extend(spans)
        made += len(spans)
        trace += 1
        if len(batch) >= SPANS_PER_REQUEST or made >= total_spans:
            service = "bench-agent"
            yield ExportTraceServiceRequest(resource_spans=[ResourceSpans(
                resource=Resource(attributes=[_kv("service.name", service)]),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name="bench"), spans=batch)])])
            batch = []


def write_files(total: int, directory: Path) -> tuple[Path, Path, int]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from otlp import to_otlp_json  # the spec's OTLP JSON, the same encoding the tests use

    jsonl, proto = directory / "spans.otlp.jsonl", directory / "spans.otlp.pb"
    size = 0
    with open(jsonl, "w") as j, open(proto, "wb") as p:
        for request in build_requests(total):
            body = request.SerializeToString()
            size += len(body)
            p.write(len(body).to_bytes(4, "big") + body)
            j.write(json.dumps(to_otlp_json(request)) + "\n")
    return jsonl, proto, size


def _timed(owner: object, name: str, bucket: str, t: dict[str, float]) -> None:
    """Wrap `owner.name` so the real ingest path records the time spent in it."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            t[bucket] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def run_ingest(path: str) -> dict[str, float]:
    """`plumbline_otel.ingest.ingest_files` on one file, with its stages timed (runs in its own process)."""
    from plumbline_otel import ingest
    from plumbline_otel.store import Store

    t = {"decode": 0.0, "normalise": 0.0, "write": 0.0, "assemble": 0.0}
    _timed(ingest, "decode_unit", "decode", t)
    _timed(ingest, "normalise_request", "normalise", t)
    _timed(Store, "write_spans", "write", t)
    _timed(Store, "assemble", "assemble", t)
    db = Path(path).with_suffix(".duckdb")
    db.unlink(missing_ok=True)
    start = time.perf_counter()
    with Store(db) as store:
        summary = ingest.ingest_files(store, [path])
    t["total"] = time.perf_counter() - start
    t["spans"] = summary.stored
    t["trajectories"] = summary.trajectories
    t["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    db.unlink(missing_ok=True)
    return t


def run_peer(path: str, limit: int) -> dict[str, float]:
    """Peer: google.protobuf.json_format on the same OTLP JSON lines (decode only, hex ids pre-fixed)."""
    import base64

    from google.protobuf.json_format import ParseDict

    def fix(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") and v else fix(v)) for k, v in node.items()}
        return [fix(v) for v in node] if isinstance(node, list) else node

    spans, start = 0, time.perf_counter()
    with open(path) as f:
        for line in f:
            request = ParseDict(fix(json.loads(line)), ExportTraceServiceRequest())
            spans += sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
            if spans >= limit:
                break
    return {"spans": spans, "total": time.perf_counter() - start}


def _child(mode: str, path: str, limit: int = 0) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, path, str(limit)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, path, limit = args.child
        print(json.dumps(run_ingest(path) if mode == "ingest" else run_peer(path, int(limit))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, proto, size = write_files(args.spans, Path(tmp))
        print(f"{args.spans} spans, {size / args.spans:.0f} B/span protobuf, JSON {os.path.getsize(jsonl) / 1e6:.0f} MB, {os.cpu_count()} cores")
        print(f"{'input':10} {'spans/s':>9} {'decode':>8} {'normalise':>10} {'write':>8} {'assemble':>9} {'total s':>8} {'peak RSS':>9}")
        results = {}
        for label, path in (("protobuf", proto), ("json", jsonl)):
            r = results[label] = _child("ingest", str(path))
            print(f"{label:10} {r['spans'] / r['total']:9.0f} {r['decode']:8.2f} {r['normalise']:10.2f} {r['write']:8.2f} {r['assemble']:9.2f} {r['total']:8.2f} {r['peak_rss_mb']:7.0f}MB")
        peer = _child("peer", str(jsonl), min(args.spans, 20_000))
        ours_decode = results["json"]["spans"] / results["json"]["decode"]
        peer_rate = peer["spans"] / peer["total"]
        print(f"\nJSON decode: plumbline {ours_decode:.0f} spans/s vs json_format {peer_rate:.0f} spans/s "
              f"(peer on {peer['spans']} spans): ratio {ours_decode / peer_rate:.1f}x")
        print(f"end to end: protobuf {results['protobuf']['spans'] / results['protobuf']['total']:.0f} spans/s (target 30000), "
              f"json {results['json']['spans'] / results['json']['total']:.0f} spans/s (target 15000)")


if __name__ == "__main__":
    main()
