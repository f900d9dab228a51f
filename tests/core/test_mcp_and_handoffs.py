"""One MCP call at every layer is one step; answered proposals without a tool span are steps; hand-offs are named
by the function the model called, and followed over span links into other traces; the conventions' link
attribution binds a tool span to its generation and a retry to its first attempt (issue 29 items 5, 6 and 7)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from otlp import record, to_otlp_json

from plumbline_otel.assemble import assemble_runs
from plumbline_otel.decode import request_from_json
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import normalise_request
from plumbline_otel.store import SCHEMA_VERSION, Store

FRAMEWORKS = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"


def _run(build: Any) -> Trajectory:
    records, problems = normalise_request(record(build))
    assert problems == []
    (run,) = assemble_runs(records)
    return run


def _llm(tracer: Tracer, calls: list[dict[str, Any]], inputs: list[dict[str, Any]] | None = None) -> None:
    parts = [{"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c.get("args", {})} for c in calls]
    with tracer.start_as_current_span("chat m", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
            "gen_ai.input.messages": json.dumps(inputs or [{"role": "user", "parts": [{"type": "text", "content": "Pay INV-1"}]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": parts or [{"type": "text", "content": "Done."}]}])}):
        pass


def test_a_framework_tool_an_mcp_client_span_and_the_mcp_server_span_are_one_call() -> None:
    """The framework names the tool otherwise, a session span sits between, and the failure is on the server span."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("execute_tool billing_pay", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "billing_pay", "gen_ai.tool.call.id": "c1"}):
                with tracer.start_as_current_span("mcp session send"):
                    with tracer.start_as_current_span("tools/call pay", kind=SpanKind.CLIENT, attributes={
                            "mcp.method.name": "tools/call", "gen_ai.tool.name": "pay"}):
                        with tracer.start_as_current_span("tools/call pay", kind=SpanKind.SERVER, attributes={
                                "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay",
                                "gen_ai.tool.call.arguments": '{"invoice_id": "INV-1"}'}) as server:
                            server.set_status(Status(StatusCode.ERROR, "declined"))

    (step,) = _run(build).tool_steps
    assert (step.name, step.args, step.call_id, step.error) == ("billing_pay", {"invoice_id": "INV-1"}, "c1", "declined")


def test_tool_spans_of_a_sub_agent_are_not_merged_into_the_tool_that_started_it() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("execute_tool ask_expert", attributes={"gen_ai.operation.name": "execute_tool",
                                                                                    "gen_ai.tool.name": "ask_expert"}):
                with tracer.start_as_current_span("invoke_agent expert", attributes={"gen_ai.operation.name": "invoke_agent"}):
                    with tracer.start_as_current_span("tools/call lookup", attributes={"mcp.method.name": "tools/call",
                                                                                      "gen_ai.tool.name": "lookup"}):
                        pass

    assert [s.name for s in _run(build).tool_steps] == ["ask_expert", "lookup"]


def test_a_proposed_and_answered_call_without_a_tool_span_is_a_step_beside_traced_ones() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _llm(tracer, [{"id": "c1", "name": "lookup", "args": {"invoice_id": "INV-1"}}, {"id": "c2", "name": "web_search", "args": {"q": "x"}}])
            with tracer.start_as_current_span("execute_tool lookup", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "c1"}):
                pass
            _llm(tracer, [], [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "ok"},
                                                         {"type": "tool_call_response", "id": "c2", "response": "found"}]}])

    steps = _run(build).tool_steps
    assert [(s.name, s.source, s.result) for s in steps] == [("lookup", "tool_span+llm_output", "ok"), ("web_search", "llm_output", "found")]


def test_a_handoff_is_named_by_the_function_the_model_called() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("Agent workflow", attributes={"openinference.span.kind": "AGENT", "input.value": "Refund me"}):
            with tracer.start_as_current_span("response", attributes={
                    "openinference.span.kind": "LLM",
                    "llm.output_messages.0.message.role": "assistant",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.id": "h1",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "transfer_to_billing_agent",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": "{}"}):
                pass
            with tracer.start_as_current_span("handoff to Billing agent", attributes={
                    "openinference.span.kind": "TOOL", "tool.name": "handoff to Billing agent"}):
                pass
            with tracer.start_as_current_span("response", attributes={
                    "openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "tool",
                    "llm.input_messages.0.message.tool_call_id": "h1",
                    "llm.input_messages.0.message.content": '{"assistant": "Billing agent"}',
                    "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "Refunded."}):
                pass

    run = _run(build)
    assert [(s.kind, s.name, s.call_id) for s in run.steps if s.kind != "llm_call"] == [("agent", "transfer_to_billing_agent", "h1")]
    assert run.tool_steps == ()


def test_a_tool_span_with_a_display_name_takes_the_name_the_model_called() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _llm(tracer, [{"id": "d1", "name": "delegate_work_to_coworker", "args": {"task": "check"}}])
            with tracer.start_as_current_span("Delegate work to coworker", attributes={
                    "openinference.span.kind": "TOOL", "tool.name": "Delegate work to coworker", "input.value": '{"task": "check"}'}):
                pass

    assert [(s.name, s.source) for s in _run(build).tool_steps] == [("delegate_work_to_coworker", "tool_span+llm_output")]


def test_a_recorded_mcp_call_is_traced_three_times_and_is_one_step(store: Store) -> None:
    """tests/fixtures/frameworks/mcp_openai_agents: the OpenAI Agents SDK's tool span (OpenInference), the `mcp`
    package's CLIENT span beneath it and the server process's SERVER span beneath that, for every call; one step
    each, the result the tool's text (not the MCP content block), the failure from the server span."""
    setup = FRAMEWORKS / "mcp_openai_agents"
    expected = json.loads((setup / "expected.json").read_text())
    for line, run in zip((setup / "trace.otlp.jsonl").read_text().splitlines(), expected["runs"]):
        spans = [s for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        by_id = {s["spanId"]: s for s in spans}
        servers = [s for s in spans if s["name"].startswith("tools/call ") and s["kind"] == 2]
        assert len(servers) == len(run["tool_calls"]), run["label"]
        for server in servers:
            client = by_id[server["parentSpanId"]]
            framework = by_id[client["parentSpanId"]]
            assert client["name"] == f"MCP send {server['name']}" and framework["name"] == server["name"].split()[1]
    summary = ingest_files(store, [str(setup / "trace.otlp.jsonl")])
    assert summary.problems == []
    for run, got in zip(expected["runs"], store.trajectories()):
        assert [(s.name, s.args, s.failed) for s in got.tool_steps] == [(c["name"], c["args"], c["failed"]) for c in run["tool_calls"]]
        assert [json.loads(s.result) if isinstance(s.result, str) else s.result for s in got.tool_steps if not s.failed] == \
            [json.loads(c["result"]) for c in run["tool_calls"] if not c["failed"]]


def _links_of(span: Span, link_type: str | None = None) -> list[Link]:
    return [Link(span.get_span_context(), {"gen_ai.attribution.link_type": link_type} if link_type else None)]


def _swarm(tracer: Tracer, link_type: str | None = None) -> None:
    """AutoGen's Swarm as its runtime traces it: the triage agent's trace, a hand-off message published from it, and
    the payer agent's work in a trace of its own whose root links to that message."""
    with tracer.start_as_current_span("invoke_agent triage", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                        "gen_ai.agent.name": "triage"}):
        _llm(tracer, [{"id": "h1", "name": "transfer_to_payer"}])
        with tracer.start_as_current_span("execute_tool transfer_to_payer", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "transfer_to_payer", "gen_ai.tool.call.id": "h1"}):
            pass
        with tracer.start_as_current_span("autogen create group_topic", kind=SpanKind.PRODUCER) as message:
            pass
    with tracer.start_as_current_span("autogen process payer", context=Context(), kind=SpanKind.CONSUMER,
                                      links=_links_of(message, link_type)):
        with tracer.start_as_current_span("invoke_agent payer", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                           "gen_ai.agent.name": "payer"}):
            _llm(tracer, [{"id": "p1", "name": "pay", "args": {"invoice_id": "INV-1"}}])
            with tracer.start_as_current_span("execute_tool pay", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.id": "p1"}):
                pass


def test_a_hand_off_into_a_trace_joined_only_by_a_span_link_is_one_run() -> None:
    records, problems = normalise_request(record(_swarm))
    assert problems == [] and len({r.trace_id for r in records}) == 2
    (run,) = assemble_runs(records)
    assert [(s.kind, s.name) for s in run.steps if s.kind != "llm_call"] == \
        [("agent", "transfer_to_payer"), ("agent", "payer"), ("tool_call", "pay")]
    assert run.input == "Pay INV-1" and run.trace_id == records[0].trace_id and run.trajectory_id == run.trace_id


def test_a_link_with_an_attribution_joins_no_traces() -> None:
    """INFORMED_BY (context only) is not a continuation: the payer's trace stays a run of its own."""
    records, _ = normalise_request(record(lambda tracer: _swarm(tracer, "INFORMED_BY")))
    assert [[s.name for s in r.steps if s.kind != "llm_call"] for r in assemble_runs(records)] == \
        [["transfer_to_payer"], ["pay"]]


def test_links_are_read_from_otlp_json_and_protobuf_alike() -> None:
    request = record(lambda tracer: _swarm(tracer, "INFORMED_BY"))
    from_json = request_from_json(to_otlp_json(request), "body")
    for decoded in (request, from_json.request):
        records, _ = normalise_request(decoded)
        (linked,) = [r for r in records if r.links]
        message = next(r for r in records if r.name == "autogen create group_topic")
        assert [(x.trace_id, x.span_id, x.link_type) for x in linked.links] == [(message.trace_id, message.span_id, "INFORMED_BY")]


def test_a_link_with_invalid_ids_is_dropped_and_said_so() -> None:
    request = record(_swarm)
    span = next(s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans if s.links)
    span.links[0].span_id = b"\x00" * 8
    records, problems = normalise_request(request)
    assert [r.links for r in records if r.span_id == span.span_id.hex()] == [[]]
    assert [p.where for p in problems] == [f"span {span.span_id.hex()} links[0]"] and "not valid OTLP ids" in problems[0].reason


def test_a_tool_span_linked_to_its_generation_takes_that_generations_call() -> None:
    """Two generations proposed `lookup` with different arguments; the tool span (no call id, no arguments) ran
    after the second began, but its CAUSED_BY_GENERATION link names the first."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Pay INV-1"}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                        {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"invoice_id": "INV-1"}}]}])}) as first:
                pass
            _llm(tracer, [{"id": "c2", "name": "lookup", "args": {"invoice_id": "INV-2"}}])
            with tracer.start_as_current_span("execute_tool lookup", links=_links_of(first, "CAUSED_BY_GENERATION"), attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}):
                pass

    steps = _run(build).tool_steps
    assert [(s.name, s.args, s.call_id, s.source) for s in steps][0] == ("lookup", {"invoice_id": "INV-1"}, "c1", "tool_span+llm_output")


def test_a_retry_is_one_step_with_the_last_attempts_outcome() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("execute_tool pay", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": '{"invoice_id": "INV-1"}'}) as first:
                first.set_status(Status(StatusCode.ERROR, "gateway timeout"))
            with tracer.start_as_current_span("execute_tool pay", links=_links_of(first, "RETRY_OF"), attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": '{"invoice_id": "INV-1"}'}):
                pass

    assert [(s.name, s.failed) for s in _run(build).tool_steps] == [("pay", False)]


def _trace_files(tmp_path: Path, request: ExportTraceServiceRequest) -> list[Path]:
    """One OTLP JSON file per trace of `request`, in the order the traces started: how two services export them."""
    paths: list[Path] = []
    trace_ids = list(dict.fromkeys(s.trace_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans))
    for i, trace_id in enumerate(trace_ids):
        part = ExportTraceServiceRequest()
        part.CopyFrom(request)
        for rs in part.resource_spans:
            for ss in rs.scope_spans:
                kept = [s for s in ss.spans if s.trace_id == trace_id]
                del ss.spans[:]
                ss.spans.extend(kept)
        paths.append(tmp_path / f"trace{i}.otlp.jsonl")
        paths[-1].write_text(json.dumps(to_otlp_json(part)) + "\n")
    return paths


def test_a_linked_trace_stored_after_the_run_was_built_joins_that_run(store: Store, tmp_path: Path) -> None:
    """The triage agent's trace is ingested and built on its own; the payer's trace, linked to it, comes in a later
    ingest: the store rebuilds both as one run and drops the first trajectory (the pipeline's own assembly of a trace
    with links is not final)."""
    first, second = _trace_files(tmp_path, record(_swarm))
    assert ingest_files(store, [str(first)]).problems == []
    [alone] = store.trajectories()
    assert [s.name for s in alone.steps if s.kind != "llm_call"] == ["transfer_to_payer"]  # no agent yet: a tool call
    assert ingest_files(store, [str(second)]).problems == []
    [run] = store.trajectories()
    assert [(s.kind, s.name) for s in run.steps if s.kind != "llm_call"] == \
        [("agent", "transfer_to_payer"), ("agent", "payer"), ("tool_call", "pay")]
    assert run.trajectory_id == alone.trajectory_id and store.pending_traces() == 0
    assert ingest_files(store, [str(first), str(second)]).stored == 0 and len(list(store.trajectories())) == 1


def test_a_version_8_store_gains_links_and_keeps_its_spans(tmp_path: Path) -> None:
    path = tmp_path / "v8.duckdb"
    first, second = _trace_files(tmp_path, record(_swarm))
    with Store(path) as store:
        ingest_files(store, [str(first)])
    with duckdb.connect(str(path)) as con:  # the file as version 8 wrote it: no links column, no trace_links table
        con.execute("ALTER TABLE spans DROP COLUMN links")
        con.execute("DROP TABLE trace_links")
        con.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION  # migrated past 8 to the current version
        ingest_files(store, [str(second)])
        [run] = store.trajectories()
        assert [s.name for s in run.tool_steps] == ["pay"] and run.input == "Pay INV-1"
