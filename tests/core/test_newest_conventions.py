"""The newest GenAI conventions (semantic-conventions-genai, Development; issue 29 item 10): input message deltas,
generic parts, A2A client and server spans."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import SpanKind, Tracer
from otlp import record

from plumbline_otel.assemble import assemble_runs
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import normalise_request


def _run(build: Any) -> Trajectory:
    records, problems = normalise_request(record(build))
    assert problems == []
    (run,) = assemble_runs(records)
    return run


def test_input_message_deltas_give_each_requests_new_results_and_the_request() -> None:
    """#365: a request records only what it appended; its tool results pair with the previous proposals."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m", attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.input.messages_delta": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Pay INV-4"}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                        {"type": "tool_call", "id": "c1", "name": "pay", "arguments": {"invoice_id": "INV-4"}},
                        {"type": "generic", "generic_type": "citation", "content": {"url": "x"}}]}])}):
                pass
            with tracer.start_as_current_span("chat m", attributes={
                    "gen_ai.input.messages_delta": json.dumps([{"role": "tool", "parts": [
                        {"type": "tool_call_response", "id": "c1", "response": "paid"}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Paid."}]}])}):
                pass

    run = _run(build)
    assert (run.input, run.final_output) == ("Pay INV-4", "Paid.")
    assert [(s.name, s.args, s.result) for s in run.tool_steps] == [("pay", {"invoice_id": "INV-4"}, "paid")]
    assert sum(1 for s in run.steps if s.kind == "llm_call") == 2


def test_an_a2a_client_span_is_a_call_of_a_remote_agent() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent planner", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                              "gen_ai.agent.name": "planner"}):
            with tracer.start_as_current_span("SendMessage", kind=SpanKind.CLIENT, attributes={
                    "a2a.method.name": "SendMessage", "a2a.task.id": "t1", "gen_ai.agent.name": "booker",
                    "gen_ai.conversation.id": "ctx-9"}):
                pass

    run = _run(build)
    assert [(s.kind, s.name) for s in run.steps] == [("agent", "booker")]
    assert run.context["gen_ai.conversation.id"] == "ctx-9"


def test_an_a2a_call_seen_by_client_server_and_remote_agent_is_one_agent_step() -> None:
    """The caller's A2A client span, the callee's server span and its invoke_agent, in one trace: one call of `booker`."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent planner", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                              "gen_ai.agent.name": "planner"}):
            a2a = {"a2a.method.name": "SendMessage", "a2a.task.id": "t1", "gen_ai.agent.name": "booker"}
            with tracer.start_as_current_span("SendMessage", kind=SpanKind.CLIENT, attributes=a2a):
                with tracer.start_as_current_span("SendMessage", kind=SpanKind.SERVER, attributes=a2a):
                    with tracer.start_as_current_span("invoke_agent booker", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                                         "gen_ai.agent.name": "booker"}):
                        with tracer.start_as_current_span("execute_tool book", attributes={
                                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "book"}):
                            pass
            with tracer.start_as_current_span("invoke_agent booker", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                                 "gen_ai.agent.name": "booker"}):
                pass  # a second, local call of an agent of the same name is a step of its own

    run = _run(build)
    assert [(s.kind, s.name) for s in run.steps] == [("agent", "booker"), ("tool_call", "book"), ("agent", "booker")]
