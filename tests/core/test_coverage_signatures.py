"""Coverage names what it did not read and the instrumentation bugs it can see (issue 29 item 9)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Tracer, set_span_in_context
from otlp import record, to_otlp_json

from plumbline_otel.coverage import coverage_report
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store


def _report(store: Store, tmp_path: Path, build: Any, scope: str = "tests") -> dict[str, Any]:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(to_otlp_json(record(build, scope=scope))) + "\n")
    summary = ingest_files(store, [str(path)])
    assert summary.exit_code == 0, summary.problems
    return coverage_report(store)["overall"]


def test_lost_parent_context_and_never_ended_parents_are_named(store: Store, tmp_path: Path) -> None:
    def build(tracer: Tracer) -> None:
        for name in ("lookup", "pay", "notify"):  # context lost: each tool span alone in its own trace
            with tracer.start_as_current_span(f"execute_tool {name}", context=otel_context.Context(), attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}):
                pass
        agent = tracer.start_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"})  # never ended
        with tracer.start_as_current_span("chat m", context=set_span_in_context(agent),
                                          attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}):
            pass

    section = _report(store, tmp_path, build)
    findings = "\n".join(section["findings"])
    assert section["spans"]["lone_step_traces"] == 4 and "lost the parent context" in findings
    assert section["spans"]["spans_without_parent"] == 1 and "never ended is never exported" in findings


def test_content_under_a_framework_namespace_is_listed_and_the_advice_fits_the_instrumentation(store: Store, tmp_path: Path) -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT"}):
            with tracer.start_as_current_span("haystack.component.run", attributes={
                    "haystack.component.input": '{"messages": ["hi"]}', "haystack.component.output": "{}"}):
                with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM", "llm.model_name": "m"}):
                    pass

    section = _report(store, tmp_path, build, scope="openinference.instrumentation.haystack")
    findings = "\n".join(section["findings"])
    assert {"haystack.component.input", "haystack.component.output"} <= set(section["unrecognised_keys"])
    assert "OPENINFERENCE_HIDE_INPUTS" in findings and "under keys plumbline does not read" in findings
    assert section["spans"]["by_scope"] == {"openinference.instrumentation.haystack": 3}


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"


def _fixture_report(store: Store, setup: str) -> dict[str, Any]:
    summary = ingest_files(store, [str(p) for p in sorted((FIXTURES / setup).glob("*.otlp.jsonl"))])
    assert summary.exit_code == 0, summary.problems
    return coverage_report(store)["overall"]


def test_traceloop_for_nodes_langchain_bugs_are_named_in_its_recorded_traces(store: Store) -> None:
    """LangGraph JS under Traceloop for Node (six runs, one trace each): every LangChain span a direct child of the
    workflow span, and each tool span named `execute_tool DynamicStructuredTool`."""
    section = _fixture_report(store, "langgraph_traceloop")
    findings = "\n".join(section["findings"])
    tool_spans = store.connection.execute(
        "SELECT count(*) FROM spans WHERE step_kind = 'tool_call' AND name = 'execute_tool DynamicStructuredTool'").fetchone()
    assert tool_spans is not None and tool_spans[0] > 0
    assert section["spans"]["flat_langchain_traces"] == section["spans"]["traces"] == 6
    assert section["spans"]["tool_spans_named_by_class"] == tool_spans[0]
    assert "6 traces hold LangChain spans all directly under one span" in findings and "CallbackManager._configureSync" in findings
    assert f"{tool_spans[0]} tool spans are named by the tool's class" in findings


def test_langchain_traced_with_its_tree_and_tool_names_has_neither_signature(store: Store) -> None:
    for setup in ("langgraph_openinference", "langchain_traceloop", "langchain_openinference"):
        _fixture_report(store, setup)
    section = coverage_report(store)["overall"]
    assert (section["spans"]["flat_langchain_traces"], section["spans"]["tool_spans_named_by_class"]) == (0, 0)
    assert section["spans"]["traces"] > 10
    assert not any("LangChain spans all directly under one span" in f or "named by the tool's class" in f for f in section["findings"])
