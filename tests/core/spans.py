"""Agent traces built with the real OpenTelemetry SDK, in each convention, for the core tests."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.sdk._logs import Logger
from opentelemetry.trace import Status, StatusCode, Tracer


def genai_messages(*parts: dict[str, Any], role: str = "assistant") -> str:
    return json.dumps([{"role": role, "parts": list(parts)}])


def genai_run(tracer: Tracer, *, tool_spans: bool = True, task: str | None = "INV-1029", fail_second: bool = False) -> None:
    """invoke_agent → chat (proposes get_invoice) → execute_tool → chat (proposes pay) → execute_tool → answer."""
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer",
             "gen_ai.input.messages": genai_messages({"type": "text", "content": "Pay invoice INV-1029"}, role="user")}
    if task:
        attrs["gen_ai.conversation.id"] = task
    with tracer.start_as_current_span("invoke_agent payer", attributes=attrs) as root:
        with tracer.start_as_current_span("chat m1", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
            "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 10,
            "gen_ai.input.messages": genai_messages({"type": "text", "content": "Pay invoice INV-1029"}, role="user"),
            "gen_ai.output.messages": genai_messages({"type": "tool_call", "id": "call_1", "name": "get_invoice", "arguments": {"invoice_id": "INV-1029"}}),
        }):
            pass
        if tool_spans:
            with tracer.start_as_current_span("execute_tool get_invoice", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_invoice", "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.call.arguments": '{"invoice_id": "INV-1029"}', "gen_ai.tool.call.result": '{"amount": 4820.0}',
            }):
                pass
        with tracer.start_as_current_span("chat m1", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
            "gen_ai.usage.input_tokens": 150, "gen_ai.usage.output_tokens": 12,
            "gen_ai.input.messages": json.dumps([
                {"role": "user", "parts": [{"type": "text", "content": "Pay invoice INV-1029"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "get_invoice", "arguments": {"invoice_id": "INV-1029"}}]},
                # results on a `user` message, with `result` rather than `response`: pydantic-ai does this
                {"role": "user", "parts": [{"type": "tool_call_response", "id": "call_1", "result": {"amount": 4820.0}}]},
            ]),
            "gen_ai.output.messages": genai_messages({"type": "tool_call", "id": "call_2", "name": "schedule_payment", "arguments": {"invoice_id": "INV-1029", "amount": 4820.0}}),
        }):
            pass
        if tool_spans:
            with tracer.start_as_current_span("execute_tool schedule_payment", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "schedule_payment", "gen_ai.tool.call.id": "call_2",
                "gen_ai.tool.call.arguments": '{"invoice_id": "INV-1029", "amount": 4820.0}',
            }) as span:
                if fail_second:
                    span.set_status(Status(StatusCode.ERROR, "503 upstream unavailable"))
                    span.set_attribute("error.type", "503")
        root.set_attribute("gen_ai.output.messages", genai_messages({"type": "text", "content": "Paid 4820.00 EUR"}))


def content_in_logs_run(tracer: Tracer, logger: Logger) -> None:
    """Capture set to events only: the chat and tool spans hold no content; log records inside them do."""
    with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with tracer.start_as_current_span("chat m1", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1"}):
            logger.emit(event_name="gen_ai.client.inference.operation.details", attributes={
                "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "Pay INV-6"}]}],
                "gen_ai.output.messages": [{"role": "assistant", "parts": [
                    {"type": "tool_call", "id": "c6", "name": "pay", "arguments": {"invoice_id": "INV-6"}}]}],
                "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 8})
        with tracer.start_as_current_span("execute_tool audit", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "audit", "gen_ai.tool.call.id": "a1"}):
            logger.emit(event_name="gen_ai.tool.message", body={"content": '{"invoice_id": "INV-6"}', "id": "a1"})
            logger.emit(event_name="gen_ai.choice", body={"message": '{"ok": true}'})
        with tracer.start_as_current_span("execute_tool pay", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.id": "c6"}):
            pass
        with tracer.start_as_current_span("chat m1", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1"}):
            logger.emit(event_name="gen_ai.client.inference.operation.details", attributes={
                "gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": "Paid INV-6"}]}]})
