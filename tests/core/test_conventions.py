"""The newest GenAI conventions (semantic-conventions-genai, issue 11), each on a trace made with the real SDK.

Every test builds its spans (and, where the convention puts content there, its log records) with
the real OpenTelemetry SDK, writes them as OTLP JSON lines files the way a collector's file
exporter does, ingests them into a real DuckDB store and states the exact steps expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk._logs import Logger
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer
from otlp import record, record_with_logs, to_otlp_json

from core.spans import content_in_logs_run, genai_messages
from plumbline_otel.coverage import coverage_report
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import log_rows, normalise_request
from plumbline_otel.store import Store


def _write(path: Path, *requests: Any) -> Path:
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in requests))
    return path


def _ingest(store: Store, tmp_path: Path, *requests: Any) -> list[Trajectory]:
    summary = ingest_files(store, [str(_write(tmp_path / f"in{i}.jsonl", r)) for i, r in enumerate(requests)])
    assert summary.problems == [] and summary.exit_code == 0
    return list(store.trajectories())


def _steps(t: Trajectory) -> list[tuple[Any, ...]]:
    return [(s.kind, s.name, s.args, s.error) for s in t.steps]


def _chat(tracer: Tracer, out: str, *, tokens: tuple[int, int] = (10, 5), extra: dict[str, Any] | None = None) -> None:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "gen_ai.usage.input_tokens": tokens[0],
             "gen_ai.usage.output_tokens": tokens[1], "gen_ai.output.messages": out, **(extra or {})}
    with tracer.start_as_current_span("chat m1", attributes=attrs):
        pass


def _call(call_id: str, name: str, **args: Any) -> str:
    return genai_messages({"type": "tool_call", "id": call_id, "name": name, "arguments": args})


def _text(text: str) -> str:
    return genai_messages({"type": "text", "content": text})


def _tool(tracer: Tracer, name: str, call_id: str, args: dict[str, Any] | None = None, result: Any = None) -> None:
    attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}
    if args is not None:
        attrs["gen_ai.tool.call.arguments"] = json.dumps(args)
    if result is not None:
        attrs["gen_ai.tool.call.result"] = json.dumps(result)
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=attrs):
        pass


def _turn(tracer: Tracer, operation: str, request: str, invoice: str) -> None:
    """One conversation turn: the user's request, a lookup, the answer."""
    with tracer.start_as_current_span(f"{operation} ap", attributes={
            "gen_ai.operation.name": operation, "gen_ai.agent.name": "ap", "gen_ai.conversation.id": "conv-1",
            "gen_ai.input.messages": genai_messages({"type": "text", "content": request}, role="user")}):
        _chat(tracer, _call(f"c-{invoice}", "lookup_invoice", invoice_id=invoice))
        _tool(tracer, "lookup_invoice", f"c-{invoice}", {"invoice_id": invoice}, {"amount": 10})
        _chat(tracer, _text(f"{invoice} is open"))


@pytest.mark.parametrize("operation", ["handle_conversation_turn", "invoke_workflow"])
def test_a_single_invocation_keeps_the_trace_id_as_its_trajectory_id(operation: str, store: Store, tmp_path: Path) -> None:
    request = record(lambda t: _turn(t, operation, "Look up INV-1", "INV-1"))
    [t] = _ingest(store, tmp_path, request)
    assert t.trajectory_id == t.trace_id and (t.input, t.final_output) == ("Look up INV-1", "INV-1 is open")
    assert _steps(t) == [("llm_call", "m1", None, None), ("tool_call", "lookup_invoice", {"invoice_id": "INV-1"}, None),
                         ("llm_call", "m1", None, None)]


def test_a_conversations_turns_are_one_trajectory_each(store: Store, tmp_path: Path) -> None:
    def conversation(tracer: Tracer) -> None:
        with tracer.start_as_current_span("chat session"):  # the application's own span around the turns
            _turn(tracer, "handle_conversation_turn", "Look up INV-1", "INV-1")
            _turn(tracer, "handle_conversation_turn", "Now look up INV-2", "INV-2")

    first, second = _ingest(store, tmp_path, record(conversation))
    assert first.trace_id == second.trace_id and first.trajectory_id != second.trajectory_id
    assert [t.trajectory_id.split(":")[0] for t in (first, second)] == [first.trace_id] * 2
    assert [(t.input, t.final_output) for t in (first, second)] == [("Look up INV-1", "INV-1 is open"), ("Now look up INV-2", "INV-2 is open")]
    assert [[(s.name, s.args) for s in t.tool_steps] for t in (first, second)] == [
        [("lookup_invoice", {"invoice_id": "INV-1"})], [("lookup_invoice", {"invoice_id": "INV-2"})]]
    assert first.task_key != second.task_key and first.context["gen_ai.conversation.id"] == "conv-1"
    section = coverage_report(store)["overall"]
    assert section["trajectories"]["traces_with_several_runs"] == 1
    assert "1 traces held more than one run" in "\n".join(section["findings"])


def test_several_root_agent_spans_in_one_trace_are_several_runs(store: Store, tmp_path: Path) -> None:
    remote = SpanContext(trace_id=0x1234 << 64, span_id=0xABCD, is_remote=True, trace_flags=TraceFlags(1))

    def two_runs(tracer: Tracer) -> None:  # a batch job starts two agents under a parent it does not export
        ctx = trace.set_span_in_context(NonRecordingSpan(remote))
        for invoice in ("INV-7", "INV-8"):
            with tracer.start_as_current_span("invoke_agent ap", context=ctx, attributes={
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ap",
                    "gen_ai.input.messages": genai_messages({"type": "text", "content": f"Pay {invoice}"}, role="user")}):
                _chat(tracer, _call(f"c-{invoice}", "pay", invoice_id=invoice))
                _tool(tracer, "pay", f"c-{invoice}", {"invoice_id": invoice}, "ok")

    runs = _ingest(store, tmp_path, record(two_runs))
    assert [(t.input, [s.args for s in t.tool_steps]) for t in runs] == [
        ("Pay INV-7", [{"invoice_id": "INV-7"}]), ("Pay INV-8", [{"invoice_id": "INV-8"}])]
    assert len({t.trajectory_id for t in runs}) == 2 and len({t.trace_id for t in runs}) == 1


def test_plan_and_fetch_response_are_model_work_whose_tokens_count(store: Store, tmp_path: Path) -> None:
    def background(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("plan ap", attributes={
                    "gen_ai.operation.name": "plan", "gen_ai.request.model": "m1",
                    "gen_ai.usage.input_tokens": 50, "gen_ai.usage.output_tokens": 20}):
                pass
            _chat(tracer, _call("c1", "lookup_invoice", invoice_id="INV-3"), tokens=(100, 10))
            _tool(tracer, "lookup_invoice", "c1", {"invoice_id": "INV-3"}, {"amount": 3})
            with tracer.start_as_current_span("fetch_response m1", attributes={
                    "gen_ai.operation.name": "fetch_response", "gen_ai.request.model": "m1", "gen_ai.response.id": "resp_1",
                    "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 30,
                    "gen_ai.output.messages": _text("INV-3 is 3.00")}):
                pass

    [t] = _ingest(store, tmp_path, record(background))
    assert [(s.kind, s.name) for s in t.steps] == [("llm_call", "m1"), ("llm_call", "m1"), ("tool_call", "lookup_invoice"), ("llm_call", "m1")]
    assert sum(s.input_tokens or 0 for s in t.steps) == 270 and sum(s.output_tokens or 0 for s in t.steps) == 60
    assert t.final_output == "INV-3 is 3.00"


def test_cache_write_tokens_and_their_former_name_cache_creation(store: Store, tmp_path: Path) -> None:
    def cached(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _chat(tracer, _text("a"), extra={"gen_ai.usage.cache_read.input_tokens": 300, "gen_ai.usage.cache_write.input_tokens": 120})
            _chat(tracer, _text("b"), extra={"gen_ai.usage.cache_creation.input_tokens": 80})

    [t] = _ingest(store, tmp_path, record(cached))
    assert [(s.cache_read_tokens, s.cache_write_tokens) for s in t.steps] == [(300, 120), (None, 80)]


def test_span_level_finish_reasons_are_kept_and_a_tool_calls_finish_is_not_the_answer(store: Store, tmp_path: Path) -> None:
    def finished(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _chat(tracer, _text("INV-4 is paid."), extra={"gen_ai.response.finish_reasons": ["stop"]})
            # the model's text came with calls this instrumentation did not record: not the run's answer
            _chat(tracer, _text("Let me also check the ledger."), extra={"gen_ai.response.finish_reasons": ["tool_calls"]})

    [t] = _ingest(store, tmp_path, record(finished))
    assert [s.finish_reasons for s in t.steps] == [("stop",), ("tool_calls",)]
    assert t.final_output == "INV-4 is paid."


@pytest.mark.parametrize("carrier", ["log_record", "span_event"])
def test_a_denied_or_unapproved_call_did_not_run(carrier: str, store: Store, tmp_path: Path) -> None:
    def decided(tracer: Tracer, logger: Logger) -> None:
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m1", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                        {"type": "tool_call", "id": "c1", "name": "lookup_invoice", "arguments": {"invoice_id": "INV-5"}},
                        {"type": "tool_call", "id": "c2", "name": "delete_vendor", "arguments": {"vendor": "Hooli"}},
                        {"type": "tool_call", "id": "c3", "name": "schedule_payment", "arguments": {"amount": 77}}]}])}):
                pass
            for call_id, name, outcome in (("c1", "lookup_invoice", "allow"), ("c2", "delete_vendor", "deny"),
                                           ("c3", "schedule_payment", "require_approval")):
                attributes = {"gen_ai.tool.call.decision.outcome": outcome, "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}
                if carrier == "log_record":  # how the conventions emit events now
                    logger.emit(event_name="gen_ai.tool.call.decision", body=f"decision {outcome}", attributes=attributes)
                else:
                    trace.get_current_span().add_event("gen_ai.tool.call.decision", attributes)
            _tool(tracer, "lookup_invoice", "c1", {"invoice_id": "INV-5"}, {"amount": 77})

    spans, logs = record_with_logs(decided)
    [t] = _ingest(store, tmp_path, spans, logs)
    # The stopped calls are steps at the moment they were proposed (before the allowed call ran), marked failed:
    # a failed call did not happen, so no invariant counts them as made.
    assert [(s.name, s.args, s.error, s.source) for s in t.tool_steps] == [
        ("delete_vendor", {"vendor": "Hooli"}, "not run: the tool call decision was deny", "llm_output"),
        ("schedule_payment", {"amount": 77}, "not run: the tool call required approval and none was given", "llm_output"),
        ("lookup_invoice", {"invoice_id": "INV-5"}, None, "tool_span+llm_output")]
    assert [s.failed for s in t.tool_steps] == [True, True, False]


def test_a_hand_off_is_an_agent_step_not_a_tool_call(store: Store, tmp_path: Path) -> None:
    def handoff(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent triage", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"}):
            _chat(tracer, _text("billing question"))
            with tracer.start_as_current_span("handoff billing", attributes={
                    "gen_ai.agent.handoff.source.name": "triage", "gen_ai.agent.handoff.target.name": "billing"}):
                pass
            with tracer.start_as_current_span("invoke_agent billing", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "billing"}):
                _tool(tracer, "refund", "r1", {"order": "O-1"}, "refunded")

    [t] = _ingest(store, tmp_path, record(handoff))
    assert [(s.kind, s.name) for s in t.steps] == [("llm_call", "m1"), ("agent", "handoff to billing"), ("agent", "billing"), ("tool_call", "refund")]
    assert [s.name for s in t.tool_steps] == ["refund"]


def test_one_call_through_an_mcp_client_and_server_is_one_step_with_the_servers_arguments(store: Store, tmp_path: Path) -> None:
    def mcp(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("execute_tool get_weather", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather"}):
                with tracer.start_as_current_span("tools/call get_weather", kind=SpanKind.CLIENT, attributes={
                        "mcp.method.name": "tools/call", "gen_ai.tool.name": "get_weather", "jsonrpc.request.id": "7"}):
                    with tracer.start_as_current_span("tools/call get_weather", kind=SpanKind.SERVER, attributes={
                            "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool", "mcp.session.id": "s1",
                            "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.arguments": '{"city": "Oslo"}',
                            "gen_ai.tool.call.result": '{"temp_c": -3}'}) as server:
                        server.set_status(Status(StatusCode.OK))

    [t] = _ingest(store, tmp_path, record(mcp))
    assert [(s.name, s.args, s.result, s.error) for s in t.tool_steps] == [("get_weather", {"city": "Oslo"}, {"temp_c": -3}, None)]


_FOLDED = [("llm_call", "m1", None, None), ("tool_call", "audit", {"invoice_id": "INV-6"}, None),
           ("tool_call", "pay", {"invoice_id": "INV-6"}, None), ("llm_call", "m1", None, None)]


@pytest.mark.parametrize("order", ["logs_first", "spans_first", "one_run_of_files"])
def test_content_in_log_records_is_folded_into_its_span_whatever_the_arrival_order(order: str, store: Store, tmp_path: Path) -> None:
    spans, logs = record_with_logs(content_in_logs_run)
    if order == "one_run_of_files":
        [t] = _ingest(store, tmp_path, spans, logs)
    else:
        for i, request in enumerate((logs, spans) if order == "logs_first" else (spans, logs)):
            summary = ingest_files(store, [str(_write(tmp_path / f"{i}.jsonl", request))])
            assert summary.exit_code == 0 and summary.problems == []
        [t] = list(store.trajectories())
    assert _steps(t) == _FOLDED
    assert (t.input, t.final_output) == ("Pay INV-6", "Paid INV-6")
    assert [s.input_tokens for s in t.steps if s.kind == "llm_call"] == [40, None]
    assert [s.evidence for s in t.steps] == ["log_record", "log_record", "message_part", "log_record"]
    assert t.tool_steps[0].result == {"ok": True}


def test_a_shards_trajectory_is_not_stored_for_a_trace_with_log_records(store: Store, tmp_path: Path) -> None:
    """The shard saw the spans only; the store folds the log records in and stores that trajectory instead."""
    spans, logs = record_with_logs(content_in_logs_run)
    ingest_files(store, [str(_write(tmp_path / "logs.jsonl", logs))])
    summary = ingest_files(store, [str(_write(tmp_path / "spans.jsonl", spans))])
    assert summary.trajectories == 1  # written once, by the store's assembly (the shard's was refused)
    [t] = list(store.trajectories())
    assert _steps(t) == _FOLDED
    assert store.connection.execute("SELECT count(*) FROM dirty_traces").fetchone() == (0,)


def test_coverage_names_a_vendor_key_an_unknown_key_and_an_absent_attribute(store: Store, tmp_path: Path) -> None:
    def keys(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _chat(tracer, _text("working"))  # content is captured in this trace
            with tracer.start_as_current_span("execute_tool lookup", attributes={  # pydantic-ai's older key
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "tool_arguments": '{"id": 1}',
                    "tool_response": '"found"'}):
                pass
            with tracer.start_as_current_span("execute_tool pay", attributes={  # a key nobody maps
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.function.arguments": '{"id": 1}'}):
                pass
            with tracer.start_as_current_span("execute_tool notify", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "notify"}):
                pass

    [t] = _ingest(store, tmp_path, record(keys))
    assert [(s.name, s.evidence, s.gaps) for s in t.tool_steps] == [
        ("lookup", "vendor_key:tool_arguments", ()),
        ("pay", None, ("args:unknown_key:gen_ai.function.arguments", "result:unknown_key:gen_ai.function.arguments")),
        ("notify", None, ("args:attribute_absent", "result:attribute_absent"))]
    section = coverage_report(store)["overall"]
    assert section["step_evidence"]["tool_call"] == {"none": 2, "vendor_key:tool_arguments": 1}
    findings = "\n".join(section["findings"])
    assert "1 from a vendor key we mapped (tool_arguments, not the GenAI key)" in findings
    assert "a key we could not map (gen_ai.function.arguments)" in findings
    assert "1 tool arguments: the producer does not write it" in findings


def test_a_protobuf_logs_file_in_the_collectors_proto_format_is_read_as_logs(store: Store, tmp_path: Path) -> None:
    spans, logs = record_with_logs(content_in_logs_run)
    framed = tmp_path / "logs.pb"  # the file exporter's `proto` format: a 4-byte size before each request
    payload = logs.SerializeToString()
    framed.write_bytes(len(payload).to_bytes(4, "big") + payload)
    whole = tmp_path / "logs.bin"  # one request, unframed
    whole.write_bytes(payload)
    for path in (framed, whole):
        summary = ingest_files(store, [str(path)])
        assert summary.problems == [] and summary.exit_code == 0
    summary = ingest_files(store, [str(_write(tmp_path / "spans.jsonl", spans))])
    assert summary.log_records == 0 and store.connection.execute("SELECT count(*) FROM logs").fetchone() == (4,)
    [t] = list(store.trajectories())
    assert _steps(t) == _FOLDED


def test_coverage_counts_log_records_whose_span_has_not_arrived(store: Store, tmp_path: Path) -> None:
    spans, logs = record_with_logs(content_in_logs_run)
    ingest_files(store, [str(_write(tmp_path / "logs.jsonl", logs))])
    section = coverage_report(store)["overall"]
    assert section["log_records"] == {"records": 4, "without_span": 4}
    assert "4 of 4 GenAI log records name a span that is not stored (yet)" in "\n".join(section["findings"])
    ingest_files(store, [str(_write(tmp_path / "spans.jsonl", spans))])
    assert coverage_report(store)["overall"]["log_records"] == {"records": 4, "without_span": 0}


def test_log_records_of_a_trace_without_spans_never_hold_up_other_traces(store: Store) -> None:
    _, logs_only = record_with_logs(content_in_logs_run)
    spans_only, _ = record_with_logs(content_in_logs_run)
    store.write_logs(log_rows(logs_only))  # dirty, with no span to build from
    store.write_spans(normalise_request(spans_only)[0])
    assert store.assemble(chunk=1) == 1  # one trace per round: the span-less one is let go, the other built
    assert store.connection.execute("SELECT count(*) FROM dirty_traces").fetchone() == (0,)
