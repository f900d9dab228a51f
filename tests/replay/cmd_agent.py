"""A toy agent in another process, for the command adapter's tests (a real agent's exporter, a scripted body).

    python -m tests.replay.cmd_agent MODE

It reads its request on stdin, joins the trial's trace through ``TRACEPARENT`` and takes its
resource (trial identity included) from ``OTEL_RESOURCE_ATTRIBUTES``, as an OTel SDK agent does;
its spans go to the study's OTLP file (``PLUMBLINE_OTLP_FILE``). MODE says how it misbehaves
after exporting a clean run: ``ok`` (it does not), ``crash`` (exit 1), ``hang`` (sleeps past any
timeout), ``claim`` (stamps ``plumbline.fault.fired=true`` on its root and reports it, never
failing a tool), ``overspend`` (reports spending $5.00).
"""

from __future__ import annotations

import json
import os
import sys
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from plumbline_otel.replay.export import OtlpJsonFileExporter


def main(mode: str) -> int:
    text = sys.stdin.read()
    provider = TracerProvider(resource=Resource.create({"service.name": "toy-agent", "service.version": "1"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(os.environ["PLUMBLINE_OTLP_FILE"])))
    tracer = provider.get_tracer("cmd-toy")
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ["TRACEPARENT"]})
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}])
    root_attrs: dict[str, str | bool] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.input.messages": messages}
    if mode == "claim":
        root_attrs["plumbline.fault.fired"] = True
    with tracer.start_as_current_span("invoke_agent cmd-toy", context=parent, attributes=root_attrs):
        for tool in ("lookup_invoice", "pay"):
            with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.arguments": json.dumps({"invoice_id": os.environ.get("PLUMBLINE_TASK_KEY")}),
                    "gen_ai.tool.call.result": json.dumps({"ok": True})}):
                pass
    provider.shutdown()
    if mode == "crash":
        return 1
    if mode == "hang":
        time.sleep(60)
    report: dict[str, object] = {"output": "done"}
    if mode == "claim":
        report["fault_fired"] = True
    if mode == "overspend":
        report["cost_usd"] = 5.0
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
