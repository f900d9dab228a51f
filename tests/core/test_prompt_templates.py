"""The run's input is the user's request, not a framework's prompt template or message dump (issue 29 item 3).

Recorded cases are in tests/fixtures/frameworks/ (haystack_openinference: Haystack's OpenInference spans
record messages as Python reprs inside JSON). These tests hold the readers to the shapes' edges.
"""

from __future__ import annotations

import json

from plumbline_otel.normalise._shapes import repr_message, request_text

_USER = "ChatMessage(_role=<ChatRole.USER: 'user'>, _content=[TextContent(text=\"Pay INV-1 (it's due)\")], _name=None, _meta={})"


def test_haystack_message_reprs_are_read_as_messages() -> None:
    tool = ("ChatMessage(_role=<ChatRole.TOOL: 'tool'>, _content=[ToolCallResult(result='Failed to invoke Tool `pay`. Error: "
            "GatewayDown', origin=ToolCall(tool_name='pay', arguments={'invoice_id': 'INV-1'}, id='c1', extra=None), error=True)], "
            "_name=None, _meta={})")
    assert repr_message(_USER) == {"role": "user", "content": [{"type": "text", "text": "Pay INV-1 (it's due)"}], "name": None}
    assert repr_message(tool)["content"] == [{"type": "tool_call_response", "id": "c1", "is_error": True,
                                              "response": "Failed to invoke Tool `pay`. Error: GatewayDown"}]


def test_a_repr_that_does_not_parse_stays_as_it_came() -> None:
    cut = _USER[:60]  # a tracer's length limit cuts reprs short
    assert repr_message(cut) == cut and repr_message("plain text") == "plain text"
    assert repr_message("ChatMessage(__import__('os').system('x'))") == {"role": None, "content": None, "name": None}


def test_pipeline_data_and_agent_inputs_give_the_users_request() -> None:
    system = "ChatMessage(_role=<ChatRole.SYSTEM: 'system'>, _content=[TextContent(text='You pay.')], _name=None, _meta={})"
    assert request_text(json.dumps({"data": {"agent": {"messages": [_USER]}}})) == ("Pay INV-1 (it's due)", "pipeline_data")
    assert request_text(json.dumps({"messages": [system, _USER], "streaming_callback": None})) == ("Pay INV-1 (it's due)", "message_reprs")


def test_a_crewai_kickoff_gives_its_tasks_description_with_the_inputs_put_in() -> None:
    from opentelemetry.trace import Tracer
    from otlp import record

    from plumbline_otel.assemble import assemble_runs
    from plumbline_otel.normalise import normalise_request

    def build(tracer: Tracer) -> None:
        tasks = [{"description": "Pay invoice {invoice} now.", "expected_output": "One sentence."},
                 {"description": "Report on {invoice}.", "expected_output": "A report."}]
        output = {"raw": "Paid and reported.", "tasks_output": [], "token_usage": {}}
        with tracer.start_as_current_span("Crew_1.kickoff", attributes={
                "openinference.span.kind": "CHAIN", "crew_id": "1", "crew_tasks": json.dumps(tasks),
                "crew_inputs": json.dumps({"invoice": "INV-7"}), "output.value": json.dumps(output)}):
            for task, answer in zip(tasks, ["Paid.", "Reported."]):  # two agents in turn: one run, not two
                done = {**task, "description": task["description"].replace("{invoice}", "INV-7"), "raw": answer}
                with tracer.start_as_current_span("agent._execute_core", attributes={
                        "openinference.span.kind": "AGENT", "crew_id": "1", "task_id": task["description"],
                        "input.value": json.dumps({"agent": "{'role': 'payer'}", "context": ""}), "output.value": json.dumps(done)}):
                    with tracer.start_as_current_span("ChatCompletion", attributes={
                            "openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                            "llm.input_messages.0.message.content": "\\nCurrent Task: " + done["description"]}):
                        pass

    records, problems = normalise_request(record(build))
    (run,) = assemble_runs(records)
    assert (run.input, run.final_output) == ("Pay invoice INV-7 now.", "Paid and reported.")


def test_dspy_input_args_and_prediction_and_terminal_tools() -> None:
    """DSPy records a program's inputs as `{"input_args": {...}}` and its Prediction as a dict; ReAct's `finish` and
    ReActV2's `submit` end a run (its answer), and a tool span named `<tool>.__call__` is the tool `<tool>`."""
    from opentelemetry.trace import Tracer
    from otlp import record

    from plumbline_otel.assemble import assemble_runs
    from plumbline_otel.normalise import normalise_request

    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("ReAct.forward", attributes={
                "openinference.span.kind": "CHAIN", "input.value": json.dumps({"input_args": {"request": "Pay INV-3"}}),
                "output.value": json.dumps({"answer": "Paid INV-3.", "trajectory": {}})}):
            with tracer.start_as_current_span("LM.__call__", attributes={
                    "openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                    "llm.input_messages.0.message.content": "[[ ## request ## ]]\nPay INV-3"}):
                pass
            for name, args in (("pay", {"invoice_id": "INV-3"}), ("finish", {})):
                with tracer.start_as_current_span(f"{name}.__call__", attributes={
                        "openinference.span.kind": "TOOL", "input.value": json.dumps({"kwargs": args}), "output.value": '"ok"'}):
                    pass

    records, _ = normalise_request(record(build, scope="openinference.instrumentation.dspy"))
    (run,) = assemble_runs(records)
    assert (run.input, run.final_output) == ("Pay INV-3", "Paid INV-3.")
    assert [(s.name, s.args) for s in run.tool_steps] == [("pay", {"invoice_id": "INV-3"})]  # `finish` is no call


def test_frameworks_failure_wording_marks_a_result_failed() -> None:
    """Where only the framework's text says a tool failed (no tool span, no error flag): CrewAI, Haystack."""
    from plumbline_otel.normalise._messages import result_is_error

    assert result_is_error("Error executing tool: PaymentGatewayError: declined")
    assert result_is_error("Failed to invoke Tool `pay` with parameters {'a': 1}. Error: declined")
    assert not result_is_error("Errors were corrected in the invoice") and not result_is_error("Executed the tool")
