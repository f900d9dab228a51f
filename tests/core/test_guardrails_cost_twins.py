"""Guardrail results and execution-state changes as steps a spec names, producer-reported cost on LLM steps, and one
streamed call traced by two instrumentations (issue 29 items 8 and 10). Spans and log records from the real SDK."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import Logger
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer
from otlp import record, record_with_logs, to_otlp_json

from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.assemble import assemble_runs
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import normalise_request
from plumbline_otel.spec import parse_spec
from plumbline_otel.store import Store


def _run(request: ExportTraceServiceRequest) -> Trajectory:
    records, problems = normalise_request(request)
    assert problems == []
    (run,) = assemble_runs(records)
    return run


def _two_scopes(build: Callable[[Tracer, Tracer], None]) -> ExportTraceServiceRequest:
    """Spans from two instrumentations in one process: the agent SDK's own tracer and OpenInference's."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("openai.agents"), provider.get_tracer("openinference.instrumentation.openai"))
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans())


def _sdk_chat(tracer: Tracer, response_id: str, text: str, tokens: tuple[int, int] = (20, 5)) -> Any:
    return tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini", "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "gen_ai.response.id": response_id, "gen_ai.usage.input_tokens": tokens[0], "gen_ai.usage.output_tokens": tokens[1],
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}])})


def _oi_stream(tracer: Tracer, text: str | None, tokens: tuple[int, int] | None = None) -> Any:
    """OpenInference's span of a streamed call: no response id (the stream's chunks carry it, the span does not)."""
    attrs: dict[str, Any] = {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini", "llm.is_streaming": True}
    if text is not None:
        attrs |= {"llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": text}
    if tokens:
        attrs |= {"llm.token_count.prompt": tokens[0], "llm.token_count.completion": tokens[1]}
    return tracer.start_span("ChatCompletion", attributes=attrs)


def test_a_streamed_call_traced_by_the_sdk_and_by_openinference_without_a_response_id_is_one_call() -> None:
    def build(sdk: Tracer, oi: Tracer) -> None:
        with sdk.start_as_current_span("invoke_agent payer", attributes={"gen_ai.operation.name": "invoke_agent"}):
            # Siblings, not parent and child: OpenInference starts its span first and ends it when the stream is read.
            first_oi = _oi_stream(oi, "Looking it up.", (20, 5))
            first_sdk = _sdk_chat(sdk, "resp_1", "Looking it up.")
            first_sdk.end()
            first_oi.end()
            second_oi = _oi_stream(oi, None)  # content capture off on OpenInference's side: timing, place and model tie it
            second_sdk = _sdk_chat(sdk, "resp_2", "Paid.", (30, 2))
            second_sdk.end()
            second_oi.end()

    run = _run(_two_scopes(build))
    llm = [s for s in run.steps if s.kind == "llm_call"]
    assert [(s.result, s.input_tokens, s.output_tokens) for s in llm] == [("Looking it up.", 20, 5), ("Paid.", 30, 2)]
    assert run.final_output == "Paid."


def test_calls_that_do_not_overlap_or_disagree_stay_apart() -> None:
    def build(sdk: Tracer, oi: Tracer) -> None:
        with sdk.start_as_current_span("invoke_agent payer", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _sdk_chat(sdk, "resp_1", "Looking it up.").end()
            _oi_stream(oi, "Looking it up.").end()  # after it, not during it: a second call
            parallel_a, parallel_b = _sdk_chat(sdk, "resp_3", "A"), _oi_stream(oi, "B")  # overlapping, different answers
            parallel_a.end()
            parallel_b.end()

    llm = [s.result for s in _run(_two_scopes(build)).steps if s.kind == "llm_call"]
    assert llm == ["Looking it up.", "Looking it up.", "A", "B"]


def test_a_reported_cost_is_on_the_llm_step_with_its_currency_and_source() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.cost.amount": 0.0042,
                    "gen_ai.usage.cost.currency": "USD", "gen_ai.usage.cost.source": "provider"}):
                pass
            with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                                                    "gen_ai.usage.cost.amount": "n/a"}):
                pass

    run = _run(record(build))
    assert [(s.cost_amount, s.cost_currency, s.cost_source) for s in run.steps] == [(0.0042, "USD", "provider"), (None, None, None)]


def _guarded_run(tracer: Tracer, logger: Logger, *, tripped: bool) -> None:
    """OpenAI Agents-style guardrail results (span events), a Bedrock guardrail span, and a state change (a log record)."""
    with tracer.start_as_current_span("invoke_agent payer", attributes={"gen_ai.operation.name": "invoke_agent"}) as agent:
        with tracer.start_as_current_span("apply_guardrail Amazon Bedrock Guardrails", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "apply_guardrail", "gen_ai.provider.name": "aws.bedrock",
                "gen_ai.guardrail.component.name": "Amazon Bedrock Guardrails", "gen_ai.guardrail.source": "INPUT",
                "gen_ai.guardrail.result.type": "action", "gen_ai.guardrail.result.value": "NONE"}):
            pass
        with tracer.start_as_current_span("execute_tool lookup", attributes={"gen_ai.operation.name": "execute_tool",
                                                                             "gen_ai.tool.name": "lookup"}):
            pass
        agent.add_event("gen_ai.guardrail.result", {"gen_ai.guardrail.component.name": "pii_check", "gen_ai.guardrail.source": "tool_input",
                                                    "gen_ai.guardrail.result.type": "tripwire_triggered",
                                                    "gen_ai.guardrail.result.value": "true" if tripped else "false"})
        logger.emit(event_name="gen_ai.execution.state.changed", attributes={"gen_ai.execution.state.changed_key.count": 2})
        with tracer.start_as_current_span("execute_tool pay", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay"}):
            pass


SPEC = """
name: guarded payments
invariants:
  - id: no-tool-after-tripwire
    severity: critical
    no_call_after_event:
      event: gen_ai.guardrail.result
      where: {gen_ai.guardrail.result.type: tripwire_triggered, gen_ai.guardrail.result.value: true}
  - id: input-checked-before-lookup
    severity: major
    event_before: {event: gen_ai.guardrail.result, where: {gen_ai.guardrail.source: [INPUT, input]}, tool: lookup}
  - id: state-changed-before-pay
    severity: major
    event_before: {event: gen_ai.execution.state.changed, tool: pay}
  - id: no-bedrock-intervention
    severity: minor
    no_event: {event: gen_ai.guardrail.result, where: {gen_ai.guardrail.result.value: GUARDRAIL_INTERVENED}}
"""


def _stored(store: Store, tmp_path: Path, *, tripped: bool) -> Trajectory:
    spans, logs = record_with_logs(lambda tracer, logger: _guarded_run(tracer, logger, tripped=tripped))
    path = tmp_path / f"run-{tripped}.jsonl"
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in (spans, logs)))
    summary = ingest_files(store, [str(path)])
    assert summary.problems == [] and summary.exit_code == 0
    (run,) = list(store.trajectories())
    return run


def test_guardrail_results_and_state_changes_are_steps_a_spec_names(store: Store, tmp_path: Path) -> None:
    run = _stored(store, tmp_path, tripped=True)
    assert [(s.kind, s.name) for s in run.steps] == [
        ("event", "gen_ai.guardrail.result"), ("tool_call", "lookup"), ("event", "gen_ai.guardrail.result"),
        ("event", "gen_ai.execution.state.changed"), ("tool_call", "pay")]
    assert run.steps[0].args["gen_ai.guardrail.result.value"] == "NONE"  # provider-native, as reported
    assert run.steps[3].args == {"gen_ai.execution.state.changed_key.count": 2}  # from the log record, at its time

    result = evaluate(parse_spec(SPEC), run)
    verdicts = {inv.id: verdict for inv, verdict in result.verdicts}
    assert verdicts["no-tool-after-tripwire"].status == "fail" and verdicts["no-tool-after-tripwire"].step_index == 4
    assert "pay called at step 4 after gen_ai.guardrail.result" in verdicts["no-tool-after-tripwire"].detail
    assert (verdicts["input-checked-before-lookup"].status, verdicts["state-changed-before-pay"].status) == ("pass", "pass")
    assert verdicts["no-bedrock-intervention"].status == "pass"


def test_the_same_spec_passes_when_the_tripwire_did_not_fire(store: Store, tmp_path: Path) -> None:
    run = _stored(store, tmp_path, tripped=False)
    verdicts = {inv.id: verdict.status for inv, verdict in evaluate(parse_spec(SPEC), run).verdicts}
    assert verdicts == {"no-tool-after-tripwire": "not_applicable", "input-checked-before-lookup": "pass",
                        "state-changed-before-pay": "pass", "no-bedrock-intervention": "pass"}
