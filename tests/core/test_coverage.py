"""The coverage report's fractions on traces built to have known gaps."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.trace import Tracer
from otlp import record, to_otlp_json

from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store


def _gappy_run(tracer: Tracer, session: str | None) -> None:
    """4 tool spans: 1 with args, 1 args recoverable from the LLM output, 1 unrecoverable, 1 redacted."""
    attrs = {"openinference.span.kind": "AGENT", "input.value": "reconcile account 7"}
    if session:
        attrs["session.id"] = session
    with tracer.start_as_current_span("agent", attributes=attrs):
        with tracer.start_as_current_span("llm", attributes={
                "openinference.span.kind": "LLM", "llm.model_name": "m",
                "llm.output_messages.0.message.tool_calls.0.tool_call.id": "c2",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "fetch",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"account": 7}'}):
            pass
        tools = [("lookup", {"input.value": '{"account": 7}'}), ("fetch", {"tool.id": "c2"}),
                 ("post", {}), ("notify", {"input.value": "__REDACTED__"})]
        for name, extra in tools:
            with tracer.start_as_current_span(name, attributes={"openinference.span.kind": "TOOL", "tool.name": name, **extra}):
                pass
        with tracer.start_as_current_span("step 2", attributes={"openinference.span.kind": "CHAIN"}):
            # no content, no tokens, and a key we do not know; under its own parent, so it is a call
            # (beside a sibling with content it would be local preparation, see test_assembly_rules)
            with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM", "gen_ai.token.kind": "x"}):
                pass


def test_coverage_fractions_on_known_gaps(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    runs = [record(lambda t: _gappy_run(t, "acct-7")), record(lambda t: _gappy_run(t, "acct-7")), record(lambda t: _gappy_run(t, None))]
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in runs))
    store.set_task_keys(["session.id"])  # these runs name their task by session
    ingest_files(store, [str(path)])
    report = coverage_report(store)
    section = report["overall"]
    assert section["tool_calls"] == {
        "tool_calls": 12, "with_structured_args": 6, "with_results": 0, "with_call_ids": 3, "failed": 0,
        "only_in_llm_output": 0, "tool_span_matched_to_llm_output": 3, "args_recovered_from_llm_output": 3,
        "bare_args_replaced_by_llm_output": 0}
    assert section["evidence_sources"] == {"tool_span": 9, "tool_span+llm_output": 3}
    assert section["task_key_sources"] == {"attribute:session.id": 2, "input_hash": 1}
    assert section["spans"]["tool_spans_without_args"] == 9
    assert section["llm_calls"] == {"llm_calls": 6, "with_content": 3, "with_tokens": 0}
    assert section["trajectories"]["task_key_from_attribute"] == 2 and section["trajectories"]["task_key_from_input_hash"] == 1
    assert section["trajectories"]["tasks_seen_more_than_once"] == 1  # acct-7, twice
    assert section["unrecognised_keys"] == {"gen_ai.token.kind": 3}
    text = render_text(report)
    assert "50% of tool calls (6 of 12) carry no structured arguments, so argument invariants" in text
    assert "9 tool spans carry no arguments; 3 of them were recovered from the parent LLM span's output messages." in text
    assert "3 of 6 LLM calls report no token usage" not in text and "6 of 6 LLM calls report no token usage" in text
    assert "Task keys: 2 from attribute session.id, 1 from a hash of the normalised request. A hashed request splits" in text
    assert "Evidence for tool calls: 9 from their own tool spans, 3 from tool spans matched to the model's proposal." in text
