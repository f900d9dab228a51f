"""Framework wrappers and dumps (issue 15): what agent frameworks record instead of the value itself.

Each test builds spans with the real OpenTelemetry SDK in the shape a framework's tracer writes
(taken from the instrumentation's code), and checks the step fields a user relies on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.trace import Status, StatusCode, Tracer
from otlp import record, to_otlp_json

from plumbline_otel.assemble import assemble
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import normalise_request
from plumbline_otel.store import Store


def _records(build: Any) -> list[SpanRecord]:
    records, problems = normalise_request(record(build))
    assert problems == []
    return records


def _assembled(records: list[SpanRecord]) -> Trajectory:
    trajectory = assemble(records)
    assert trajectory is not None, "the spans make a run"
    return trajectory


def _one(attrs: dict[str, Any], name: str = "span", events: Sequence[tuple[str, dict[str, Any]]] = ()) -> SpanRecord:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span(name, attributes=attrs) as span:
            for event_name, event_attrs in events:
                span.add_event(event_name, event_attrs)

    return _records(build)[0]


def _oi_tool(name: str, input_value: str, output_value: str | None = None) -> dict[str, Any]:
    attrs = {"openinference.span.kind": "TOOL", "tool.name": name, "input.value": input_value}
    if output_value is not None:
        attrs["output.value"] = output_value
    return attrs


# --- item 1: argument wrappers ----------------------------------------------------------------


def test_smolagents_call_record_is_unwrapped_to_the_keyword_arguments() -> None:
    rec = _one(_oi_tool("get_invoice", json.dumps({"args": [], "sanitize_inputs_outputs": True, "kwargs": {"invoice_id": "INV-1"}})))
    assert (rec.args, rec.args_state, rec.shapes) == ({"invoice_id": "INV-1"}, "structured", ["args:smolagents_call"])


def test_llamaindex_kwargs_wrapper_is_unwrapped() -> None:
    rec = _one(_oi_tool("get_invoice", json.dumps({"kwargs": {"invoice_id": "INV-1"}})))
    assert (rec.args, rec.shapes) == ({"invoice_id": "INV-1"}, ["args:kwargs_wrapper"])


def test_langchain_callback_payload_under_traceloop_gives_inputs_and_the_call_id() -> None:
    payload = {"input_str": "{'invoice_id': 'INV-1'}", "tags": [], "metadata": {}, "inputs": {"invoice_id": "INV-1"},
               "kwargs": {"tool_call_id": "call_7", "color": "green"}}
    rec = _one({"traceloop.span.kind": "tool", "traceloop.entity.name": "get_invoice", "traceloop.entity.input": json.dumps(payload)})
    assert (rec.step_kind, rec.tool_name, rec.args, rec.call_id) == ("tool_call", "get_invoice", {"invoice_id": "INV-1"}, "call_7")
    assert rec.shapes == ["args:langchain_callback"]


def test_a_bare_value_for_a_one_argument_tool_gives_way_to_the_models_proposed_object() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT", "input.value": "Pay INV-1"}):
            with tracer.start_as_current_span("llm", attributes={
                    "openinference.span.kind": "LLM", "llm.model_name": "m",
                    "llm.output_messages.0.message.role": "assistant",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.id": "c1",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "get_invoice",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"invoice_id": "INV-1"}'}):
                pass
            with tracer.start_as_current_span("get_invoice", attributes=_oi_tool("get_invoice", "INV-1", '{"amount": 5}')):
                pass

    records = _records(build)
    assert next(r for r in records if r.step_kind == "tool_call").shapes == ["args:scalar"]
    [step] = _assembled(records).tool_steps
    assert (step.args, step.call_id, step.result, step.source) == ({"invoice_id": "INV-1"}, "c1", {"amount": 5}, "tool_span+llm_output")


# --- item 2: input and output as dumps -------------------------------------------------------


def test_graph_state_dumps_give_the_last_user_request_and_the_last_assistant_answer() -> None:
    state_in = {"messages": [{"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "HumanMessage"],
                              "kwargs": {"content": "Pay invoice INV-1", "type": "human"}}]}
    state_out = {"messages": [
        {"type": "human", "content": "Pay invoice INV-1"},
        {"type": "ai", "content": "", "tool_calls": [{"name": "pay", "args": {}, "id": "c1"}]},
        {"type": "tool", "content": "ok", "tool_call_id": "c1"},
        {"type": "ai", "content": "Paid."}]}
    rec = _one({"openinference.span.kind": "AGENT", "input.value": json.dumps(state_in), "output.value": json.dumps(state_out)})
    assert (rec.input_text, rec.output_text) == ("Pay invoice INV-1", "Paid.")
    assert rec.shapes == ["input:graph_state", "output:graph_state"]


def test_smolagents_run_keyword_dump_gives_the_task() -> None:
    rec = _one({"openinference.span.kind": "AGENT", "input.value": json.dumps({"task": "Pay invoice INV-1", "stream": False, "reset": True}),
                "output.value": "Paid."})
    assert (rec.input_text, rec.output_text, rec.shapes) == ("Pay invoice INV-1", "Paid.", ["input:run_kwargs"])


def test_an_input_of_unknown_shape_is_kept_as_it_came_and_named() -> None:
    rec = _one({"openinference.span.kind": "AGENT", "input.value": json.dumps({"weird": {"nested": 1}})})
    assert rec.input_text == '{"weird":{"nested":1}}' and rec.shapes == ["input:unrecognised"]


# --- items 3, 4, 5: which spans are calls ----------------------------------------------------


def test_input_comes_from_the_first_llm_span_that_has_one() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("run", attributes={"openinference.span.kind": "CHAIN"}):
            with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM", "llm.token_count.prompt": 3}):
                pass
            with tracer.start_as_current_span("llm", attributes={
                    "openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                    "llm.input_messages.0.message.content": "Pay INV-1",
                    "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "Paid."}):
                pass

    assert _assembled(_records(build)).input == "Pay INV-1"


def test_local_preparation_beside_the_real_call_is_not_a_call_but_a_stream_without_usage_is() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("FunctionAgent.run", attributes={"openinference.span.kind": "AGENT", "input.value": "Pay INV-1"}):
            with tracer.start_as_current_span("OpenAI._prepare_chat_with_tools", attributes={
                    "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini", "input.value": '{"tools": [], "user_msg": null}'}):
                pass
            with tracer.start_as_current_span("OpenAI.astream_chat", attributes={"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini"}):
                pass  # content capture off and a stream without usage: still a model request
            with tracer.start_as_current_span("OpenAI.achat", attributes={
                    "openinference.span.kind": "LLM", "llm.token_count.prompt": 10, "llm.token_count.completion": 2,
                    "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "Paid."}):
                pass

    trajectory = _assembled(_records(build))
    assert [s.name for s in trajectory.steps if s.kind == "llm_call"] == ["gpt-4o-mini", "OpenAI.achat"]


def test_a_provider_name_alone_is_not_a_chat_call_traceloop_kind_decides() -> None:
    root = _one({"gen_ai.provider.name": "openai", "traceloop.span.kind": "workflow", "traceloop.entity.name": "Agent workflow"})
    assert (root.convention, root.step_kind) == ("traceloop", "agent")
    bare = _one({"gen_ai.provider.name": "openai"})
    assert bare.step_kind == "other"


# --- items 6, 7: message text -----------------------------------------------------------------


def test_content_and_contents_written_together_are_read_once() -> None:
    rec = _one({"openinference.span.kind": "LLM",
                "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "Paid.",
                "llm.output_messages.0.message.contents.0.message_content.type": "text",
                "llm.output_messages.0.message.contents.0.message_content.text": "Paid."})
    assert rec.output_text == "Paid."


def test_strands_choice_events_plain_string_on_the_agent_and_content_blocks_on_chat() -> None:
    agent = _one({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer"},
                 events=[("gen_ai.user.message", {"content": json.dumps([{"text": "Pay INV-1"}])}),
                         ("gen_ai.choice", {"message": "Paid INV-1.", "finish_reason": "end_turn"})])
    assert (agent.agent_name, agent.input_text, agent.output_text) == ("payer", "Pay INV-1", "Paid INV-1.")
    chat = _one({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"},
                events=[("gen_ai.choice", {"message": json.dumps([{"text": "Looking it up."},
                                                                 {"toolUse": {"toolUseId": "t1", "name": "get_invoice", "input": {"invoice_id": "INV-1"}}}]),
                                           "finish_reason": "tool_use"})])
    assert chat.output_text == "Looking it up."
    assert [(c.name, c.args, c.call_id) for c in chat.proposed_calls] == [("get_invoice", {"invoice_id": "INV-1"}, "t1")]
    tool = _one({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_invoice"},
                events=[("gen_ai.tool.message", {"role": "tool", "content": '{"invoice_id": "INV-1"}', "id": "t1"}),
                        ("gen_ai.choice", {"message": json.dumps([{"text": '{"amount": 5}'}]), "id": "t1"})])
    assert (tool.args, tool.call_id, tool.result, tool.shapes) == ({"invoice_id": "INV-1"}, "t1", {"amount": 5}, ["result:content_blocks"])


# --- item 10: results as framework objects ---------------------------------------------------


def test_framework_result_objects_become_the_tools_content() -> None:
    tool_message = {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "ToolMessage"],
                    "kwargs": {"content": '{"amount": 5}', "type": "tool", "name": "get_invoice", "tool_call_id": "c1", "status": "success"}}
    rec = _one(_oi_tool("get_invoice", '{"invoice_id": "INV-1"}', json.dumps(tool_message)))
    assert (rec.result, rec.shapes) == ({"amount": 5}, ["result:langchain_tool_message"])
    tool_output = {"content": "{'amount': 5}", "tool_name": "get_invoice", "raw_input": {"kwargs": {"invoice_id": "INV-1"}},
                   "raw_output": {"amount": 5}, "is_error": False}
    rec = _one(_oi_tool("get_invoice", json.dumps({"kwargs": {"invoice_id": "INV-1"}}), json.dumps(tool_output)))
    assert (rec.result, rec.shapes) == ({"amount": 5}, ["args:kwargs_wrapper", "result:llamaindex_tool_output"])


# --- items 8, 9, 11: task keys, empty traces, coverage ----------------------------------------


def _conversation_run(tracer: Tracer, conversation: str, request: str) -> None:
    with tracer.start_as_current_span("invoke_agent payer", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": conversation,
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": request}]}])}):
        with tracer.start_as_current_span("execute_tool pay", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay",
                "gen_ai.tool.call.arguments": json.dumps({"args": [], "sanitize_inputs_outputs": False, "kwargs": {"id": 1}})}):
            pass


def _lone_create_agent(tracer: Tracer) -> None:
    with tracer.start_as_current_span("create_agent", attributes={"gen_ai.operation.name": "create_agent", "traceloop.span.kind": "task"}):
        pass


def _failing(tracer: Tracer) -> None:
    with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT", "input.value": "Pay INV-2"}):
        with tracer.start_as_current_span("pay", attributes=_oi_tool("pay", '{"id": 2}')) as span:
            span.set_status(Status(StatusCode.ERROR, "ValueError: refused"))


def test_conversations_are_not_tasks_empty_traces_are_not_runs_and_coverage_says_so(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    requests = [record(lambda t: _conversation_run(t, "conv-1", "Pay invoice 1")),
                record(lambda t: _conversation_run(t, "conv-2", "  pay INVOICE 1 ")),  # same task, new conversation
                record(lambda t: _conversation_run(t, "conv-2", "Pay invoice 2")),  # same conversation, new task
                record(_lone_create_agent), record(_failing)]
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in requests))
    ingest_files(store, [str(path)])
    runs = list(store.trajectories())
    assert len(runs) == 4  # the lone create_agent trace is no run
    first, second, third = runs[:3]
    assert first.task_key == second.task_key != third.task_key and first.task_key_source == "input_hash"
    assert (first.context["gen_ai.conversation.id"], third.context["gen_ai.conversation.id"]) == ("conv-1", "conv-2")
    section = coverage_report(store)["overall"]
    assert section["shapes"] == {"unwrapped": {"args:smolagents_call": 3}, "kept_as_is": {}}
    assert section["task_key_sources"] == {"input_hash": 4}
    text = render_text(coverage_report(store))
    assert "Recognised framework wrappers and dumps, unwrapped to the value inside: 3 tool arguments from smolagents call records" in text
    assert "set plumbline.task.key on the run's root span" in text
    assert "3 runs carry a session or conversation id; it is kept in the run's context, not used as the task key" in text
    assert "Evidence for tool calls: 4 from their own tool spans." in text


def test_a_tool_message_with_status_error_marks_the_call_failed_and_keeps_its_content() -> None:
    message = {"type": "tool", "data": {"content": "refused by the bank", "type": "tool", "name": "pay",
                                        "tool_call_id": "c1", "status": "error"}}
    rec = _one(_oi_tool("pay", '{"id": 1}', json.dumps(message)))
    assert (rec.result, rec.error, rec.shapes) == ("refused by the bank", "error result", ["result:langchain_tool_message_error"])


def test_smolagents_final_answer_is_the_runs_answer_not_a_tool_call() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("ToolCallingAgent.run", attributes={"openinference.span.kind": "AGENT",
                                                                               "input.value": json.dumps({"task": "Pay INV-1", "stream": False})}):
            for name, args, result in (("pay", {"id": 1}, "ok"), ("final_answer", {"answer": "Paid."}, "Paid.")):
                call = {"args": [], "sanitize_inputs_outputs": True, "kwargs": args}
                with tracer.start_as_current_span(name, attributes=_oi_tool(name, json.dumps(call), result)):
                    pass

    records, _ = normalise_request(record(build, scope="openinference.instrumentation.smolagents"))
    trajectory = _assembled(records)
    assert [s.name for s in trajectory.tool_steps] == ["pay"]
    assert (trajectory.input, trajectory.final_output) == ("Pay INV-1", "Paid.")
