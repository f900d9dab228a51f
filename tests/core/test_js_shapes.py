"""JavaScript agent frameworks' own span shapes (issue 29), built with the real OpenTelemetry SDK in the shape
the framework writes (read from its source), beside the recorded fixtures in tests/fixtures/frameworks/.
"""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import Status, StatusCode, Tracer
from otlp import record

from plumbline_otel.assemble import assemble
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import normalise_request


def _records(build: Any) -> list[SpanRecord]:
    records, problems = normalise_request(record(build))
    assert problems == []
    return records


def _run(build: Any) -> Trajectory:
    trajectory = assemble(_records(build))
    assert trajectory is not None
    return trajectory


# --- the Vercel AI SDK's own spans -------------------------------------------------------------


def test_ai_sdk_4_spans_args_result_and_prompt_tokens() -> None:
    """AI SDK 4 wrote `args` (not `input`) in tool calls, `result` in tool results and `promptTokens`."""
    def build(tracer: Tracer) -> None:
        prompt = {"system": "You pay invoices.", "messages": [{"role": "user", "content": "Pay INV-1"}]}
        with tracer.start_as_current_span("ai.generateText", attributes={
                "ai.operationId": "ai.generateText", "ai.prompt": json.dumps(prompt), "ai.response.text": "Paid INV-1.",
                "ai.telemetry.functionId": "payer"}):
            with tracer.start_as_current_span("ai.generateText.doGenerate", attributes={
                    "ai.operationId": "ai.generateText.doGenerate", "ai.model.id": "gpt-4o", "ai.usage.promptTokens": 12,
                    "ai.usage.completionTokens": 5, "ai.prompt.messages": json.dumps(prompt["messages"]),
                    "ai.response.toolCalls": json.dumps([{"toolCallType": "function", "toolCallId": "c1", "toolName": "pay",
                                                          "args": json.dumps({"invoice_id": "INV-1"})}])}):
                pass
            with tracer.start_as_current_span("ai.toolCall", attributes={
                    "ai.operationId": "ai.toolCall", "ai.toolCall.name": "pay", "ai.toolCall.id": "c1",
                    "ai.toolCall.args": json.dumps({"invoice_id": "INV-1"}), "ai.toolCall.result": json.dumps({"ok": True})}):
                pass
            with tracer.start_as_current_span("ai.generateText.doGenerate", attributes={
                    "ai.operationId": "ai.generateText.doGenerate", "ai.model.id": "gpt-4o",
                    "ai.prompt.messages": json.dumps([{"role": "tool", "content": [
                        {"type": "tool-result", "toolCallId": "c1", "toolName": "pay", "result": {"ok": True}}]}]),
                    "ai.response.text": "Paid INV-1."}):
                pass

    run = _run(build)
    assert run.conventions == ("vercel_ai",) and run.agent_name == "payer"
    assert (run.input, run.final_output) == ("Pay INV-1", "Paid INV-1.")
    assert [(s.name, s.args, s.result, s.call_id, s.source) for s in run.tool_steps] == [
        ("pay", {"invoice_id": "INV-1"}, {"ok": True}, "c1", "tool_span+llm_output")]
    llm = [s for s in run.steps if s.kind == "llm_call"]
    assert [(s.model, s.input_tokens, s.output_tokens) for s in llm] == [("gpt-4o", 12, 5), ("gpt-4o", None, None)]


def test_ai_sdk_tool_error_output_marks_a_proposed_call_failed() -> None:
    """No tool spans (a call the app ran itself): the proposal is the step, its `error-text` output a failure."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("ai.streamText", attributes={"ai.operationId": "ai.streamText",
                                                                         "ai.prompt": json.dumps({"prompt": "Pay INV-2"})}):
            with tracer.start_as_current_span("ai.streamText.doStream", attributes={
                    "ai.operationId": "ai.streamText.doStream",
                    "ai.response.toolCalls": json.dumps([{"type": "tool-call", "toolCallId": "c2", "toolName": "pay",
                                                          "input": {"invoice_id": "INV-2"}}]), "ai.response.text": ""}):
                pass
            with tracer.start_as_current_span("ai.streamText.doStream", attributes={
                    "ai.operationId": "ai.streamText.doStream",
                    "ai.prompt.messages": json.dumps([{"role": "tool", "content": [
                        {"type": "tool-result", "toolCallId": "c2", "toolName": "pay",
                         "output": {"type": "error-text", "value": "GatewayDown"}}]}]),
                    "ai.response.text": "Could not pay."}):
                pass

    run = _run(build)
    assert run.input == "Pay INV-2" and run.final_output == "Could not pay."
    assert [(s.name, s.args, s.failed) for s in run.tool_steps] == [("pay", {"invoice_id": "INV-2"}, True)]


def test_ai_sdk_tool_span_status_error_is_the_failure() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("ai.generateText", attributes={"ai.operationId": "ai.generateText"}):
            with tracer.start_as_current_span("ai.toolCall", attributes={
                    "ai.operationId": "ai.toolCall", "ai.toolCall.name": "pay", "ai.toolCall.id": "c3",
                    "ai.toolCall.args": "{}"}) as span:
                span.record_exception(RuntimeError("declined"))
                span.set_status(Status(StatusCode.ERROR, "declined"))

    (step,) = _run(build).tool_steps
    assert step.failed and "declined" in (step.error or "")


# --- Mastra's exporter ----------------------------------------------------------------------------


def test_mastra_run_text_under_its_own_keys_and_a_json_string_finish_reason() -> None:
    """`mastra.agent_run.input` (here a message list) and `.output` (`{text, files}`); the chat span's finish
    reasons as a JSON-encoded string; the model step's `{text, toolCalls}` fills the chat span it holds."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent payer", attributes={
                "gen_ai.operation.name": "invoke_agent", "mastra.span.type": "agent_run",
                "mastra.agent_run.input": json.dumps([{"role": "user", "content": "Pay INV-9"}]),
                "mastra.agent_run.output": json.dumps({"text": "Paid INV-9.", "files": []})}):
            with tracer.start_as_current_span("agent_step payer", attributes={
                    "gen_ai.operation.name": "agent_step", "mastra.model_step.input": json.dumps([{"role": "user", "content": "Pay INV-9"}]),
                    "mastra.model_step.output": json.dumps({"text": "", "toolCalls": [
                        {"toolCallId": "c9", "toolName": "pay", "args": {"invoice_id": "INV-9"}}]})}):
                with tracer.start_as_current_span("chat m", attributes={
                        "gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 9,
                        "gen_ai.response.finish_reasons": '["tool-calls"]',
                        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": ""}]}])}):
                    pass
                with tracer.start_as_current_span("execute_tool pay", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": '{"invoice_id": "INV-9"}',
                        "gen_ai.tool.call.result": '"done"'}):
                    pass

    run = _run(build)
    assert (run.input, run.final_output) == ("Pay INV-9", "Paid INV-9.")
    (llm,) = [s for s in run.steps if s.kind == "llm_call"]
    assert (llm.model, llm.input_tokens, llm.finish_reasons, llm.evidence) == ("m", 9, ("tool-calls",), "span")
    assert [(s.name, s.call_id, s.source) for s in run.tool_steps] == [("pay", "c9", "tool_span+llm_output")]


# --- Traceloop for Node on LangChain JS --------------------------------------------------------------


def test_traceloop_tool_spans_named_by_class_take_the_tool_and_call_from_the_tool_message_or_the_model() -> None:
    """Traceloop names a LangChain JS tool span by the tool's class (`DynamicStructuredTool`) and records its input as
    `{"args": ["<JSON text>"]}`: the ToolMessage of the output names the tool and the call; a raising tool has no
    output, and it is the model's call whose arguments it ran."""
    def tool_message(name: str, call_id: str, content: str) -> str:
        return json.dumps({"lc": 1, "type": "constructor", "id": ["langchain_core", "messages", "ToolMessage"],
                           "kwargs": {"status": "success", "content": content, "tool_call_id": call_id, "name": name}})

    def build(tracer: Tracer) -> None:
        base = {"gen_ai.provider.name": "langchain", "traceloop.workflow.name": "payer"}
        with tracer.start_as_current_span("payer.workflow", attributes={
                "traceloop.span.kind": "workflow", "traceloop.entity.name": "payer",
                "traceloop.entity.input": json.dumps({"args": [], "kwargs": {}})}):
            with tracer.start_as_current_span("chat m", attributes={
                    **base, "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                    "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Pay INV-3"}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                        {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"invoice_id": "INV-3"}},
                        {"type": "tool_call", "id": "c2", "name": "pay", "arguments": {"invoice_id": "INV-3", "amount": 5}}]}])}):
                pass
            for call_id, name, args in (("c1", "lookup", {"invoice_id": "INV-3"}), ("c2", "pay", {"invoice_id": "INV-3", "amount": 5})):
                with tracer.start_as_current_span("execute_tool DynamicStructuredTool", attributes={
                        **base, "gen_ai.operation.name": "execute_tool", "traceloop.span.kind": "task",
                        "traceloop.entity.name": "DynamicStructuredTool",
                        "traceloop.entity.input": json.dumps({"args": [json.dumps(args)]})}) as span:
                    if name == "lookup":
                        span.set_attribute("traceloop.entity.output", tool_message(name, call_id, '{"open": true}'))
                    else:
                        span.set_status(Status(StatusCode.ERROR, "declined"))
            with tracer.start_as_current_span("chat m", attributes={
                    **base, "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Not paid."}]}])}):
                pass

    run = _run(build)
    assert [(s.name, s.args, s.result, s.failed, s.call_id, s.source) for s in run.tool_steps] == [
        ("lookup", {"invoice_id": "INV-3"}, {"open": True}, False, "c1", "tool_span+llm_output"),
        ("pay", {"invoice_id": "INV-3", "amount": 5}, None, True, "c2", "tool_span+llm_output")]
