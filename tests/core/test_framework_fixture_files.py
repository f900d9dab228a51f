"""The framework fixtures hold what their expected.json says happened, and only where content was captured.

tests/fixtures/frameworks/generate_*.py drove real agent frameworks against a simulated model and recorded
expected.json while they ran. These checks read the trace files only (no product code), so that a
regenerated fixture that lost its runs, mixed them up or leaked content it claims not to capture fails
here, before any normaliser test has to explain it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FRAMEWORKS = FIXTURES / "frameworks"
# The set-ups written by generate_langchain/_smolagents/_llamaindex/_adk.py and by
# generate_strands/_openai_agents/_pydantic_ai.py: one that goes missing fails here.
SETUPS = ["adk_content", "adk_content_events", "adk_nocontent", "langchain_openinference", "langchain_traceloop",
          "llamaindex_openinference", "smolagents_openinference",
          "strands_default", "strands_latest", "pydantic_ai",
          "openai_agents_openinference_chat", "openai_agents_openinference_responses",
          "openai_agents_traceloop_chat", "openai_agents_traceloop_responses",
          # generate_js.py: Node set-ups, pinned by their npm lock file (package-lock-<set-up>.json)
          "aisdk6_chat", "aisdk7_legacy_chat", "aisdk7_otel_chat", "mastra",
          "langgraph_openinference", "langgraph_traceloop",
          "openai_agents_js_openinference_chat", "openai_agents_js_openinference_responses", "openai_agents_js_handoff",
          "haystack_openinference", "crewai_openinference", "dspy_openinference",
          # generate_autogen/_semantic_kernel/_mcp.py
          "autogen_agentchat", "autogen_swarm", "semantic_kernel", "mcp_openai_agents",
          # sub-agents (issue 29; the conversations are one line of three runs, tests/core/test_runs_split.py)
          "crewai_delegation", "semantic_kernel_subagent", "haystack_subagent",
          "dspy_subagent", "mcp_subagent",
          # issue 40: the next instrumentations (generate_anthropic/_langfuse/…)
          "anthropic_openinference", "langfuse_openai", "openai_agents_otel_chat", "litellm_otel", "adk_openinference", "beeai_openinference", "openlit_langgraph", "crewai_traceloop", "openai_agents_otel_responses", "openai_agents_otel_handoff", "openlit_openai_agents", "langfuse_langchain",
          # issue 40 item 12: a plain loop under openai-v2 only, a trace per model call (generate_openai_loop.py)
          "openai_v2_loop",
          # the same loop under OpenInference's and Traceloop's OpenAI and OpenInference's Anthropic instrumentation
          # (generate_per_call_loop.py)
          "openai_openinference_loop", "openai_traceloop_loop", "anthropic_openinference_loop", "openai_openlit_loop",
          "openai_traceloop_indexed_loop"]

_spec = importlib.util.spec_from_file_location("producers_generate", FIXTURES / "producers" / "generate.py")
assert _spec is not None and _spec.loader is not None
producers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(producers)  # stdlib-only at import: its `_any_value` and `_contains` helpers


def _values(line: str) -> list[Any]:
    """Every attribute value of every span, span event and log record (with its body) in one export line."""
    out: list[Any] = []
    request = json.loads(line)
    for rs in request.get("resourceSpans", []):
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                attrs = span.get("attributes", []) + [a for ev in span.get("events", []) for a in ev.get("attributes", [])]
                out.extend(producers._any_value(a["value"]) for a in attrs)
    for rl in request.get("resourceLogs", []):
        for sl in rl["scopeLogs"]:
            for record in sl["logRecords"]:
                out.extend(producers._any_value(a["value"]) for a in record.get("attributes", []))
                out.append(producers._any_value(record.get("body") or {}))
    return out


def _lines(setup: str, name: str) -> list[str]:
    path = FRAMEWORKS / setup / name
    return path.read_text().splitlines() if path.exists() else []


def _found(values: list[Any], wanted: Any) -> bool:
    """An object anywhere (JSON strings included), or a text inside any string, however deeply nested."""
    if isinstance(wanted, dict):
        return any(producers._contains(v, wanted) for v in values)
    if any(isinstance(v, str) and wanted in v for v in values):
        return True
    nested = [x for v in values if isinstance(v, (dict, list)) for x in (v.values() if isinstance(v, dict) else v)]
    return bool(nested) and _found(nested, wanted)


def test_every_set_up_has_its_fixture_and_pins() -> None:
    for setup in SETUPS:
        assert (FRAMEWORKS / setup / "expected.json").is_file() and (FRAMEWORKS / setup / "trace.otlp.jsonl").is_file()
        assert (FRAMEWORKS / f"requirements-{setup}.txt").is_file() or (FRAMEWORKS / f"package-lock-{setup}.json").is_file(), setup


@pytest.mark.parametrize("setup", SETUPS)
def test_each_run_is_in_its_own_line_with_what_expected_json_recorded(setup: str) -> None:
    expected = json.loads((FRAMEWORKS / setup / "expected.json").read_text())
    lines = _lines(setup, "trace.otlp.jsonl")
    log_lines = _lines(setup, "logs.otlp.jsonl")
    assert len(log_lines) in (0, len(lines))
    runs = expected["runs"]
    assert expected["setup"] == setup and expected["framework"]["version"]
    assert [r["label"] for r in runs] == ["clean", "tool_called_twice", "skipped_check", "wrong_amount",
                                           "tool_raises", "clean_repeat"]
    assert runs[0]["task"] == runs[-1]["task"] and runs[0]["input"] == runs[-1]["input"]
    assert len({r["task"] for r in runs}) == 5
    assert len(lines) == len(runs)
    assert set(expected["streamed_runs"]) <= {r["label"] for r in runs}
    for i, (run, line) in enumerate(zip(runs, lines)):
        values = _values(line) + (_values(log_lines[i]) if log_lines else [])
        assert run["llm_calls"] >= 2 and run["tool_calls"], run["label"]
        assert [c["failed"] for c in run["tool_calls"]].count(True) == (run["label"] == "tool_raises")
        captured = expected["content_captured"]
        assert _found(values, run["input"]) == captured, f"{setup}/{run['label']}: input"
        in_trace = captured and "final_output" not in expected.get("absent_from_trace", [])
        assert _found(values, run["final_output"]) == in_trace, f"{setup}/{run['label']}: final output"
        for call in run["tool_calls"]:
            assert _found(values, call["args"]) == captured, f"{setup}/{run['label']}: args of {call['name']}"
            assert any(v == call["name"] or (isinstance(v, str) and call["name"] in v) for v in values)


def test_langchain_openinference_has_a_streamed_run_and_two_parallel_tool_calls() -> None:
    expected = json.loads((FRAMEWORKS / "langchain_openinference" / "expected.json").read_text())
    assert expected["streamed_runs"] == ["skipped_check"]
    line = (FRAMEWORKS / "langchain_openinference" / "trace.otlp.jsonl").read_text().splitlines()[1]
    first_turn = [v for v in _values(line) if isinstance(v, str) and v.startswith("call_tool_called_twice_0_")]
    assert sorted(set(first_turn)) == ["call_tool_called_twice_0_0", "call_tool_called_twice_0_1"]


@pytest.mark.parametrize("setup", [s for s in SETUPS if s.startswith(("openai_agents_", "strands_", "pydantic_ai", "aisdk", "mastra", "autogen_", "langgraph_openinference",
                                                             "semantic_kernel", "mcp_"))])
def test_streamed_runs_and_parallel_calls_are_in_the_trace(setup: str) -> None:
    """A streamed model response and two parallel calls in one response, each with the id the stand-in gave it."""
    expected = json.loads((FRAMEWORKS / setup / "expected.json").read_text())
    assert "skipped_check" in expected["streamed_runs"]
    twice = expected["runs"][1]
    parallel = [c for c in twice["tool_calls"] if c["model_turn"] == 0]
    assert [c["call_id"] for c in parallel] == ["call_tool_called_twice_0_0", "call_tool_called_twice_0_1"]
    values = _values((FRAMEWORKS / setup / "trace.otlp.jsonl").read_text().splitlines()[1])
    assert all(_found(values, c["call_id"]) for c in parallel)


def test_traceloop_for_node_on_langgraph_drops_the_stream_handler_and_the_nesting() -> None:
    """An instrumentation bug the fixture keeps: Traceloop's patch of LangChain JS's callback manager replaces the
    inheritable handlers with a fresh handler of its own whenever they are a CallbackManager (not a list). LangGraph's
    stream handler goes, so streaming the graph no longer streams the model (the stand-in got no streamed request), and
    no LangChain span knows its parent: each is a child of the `withWorkflow` span."""
    expected = json.loads((FRAMEWORKS / "langgraph_traceloop" / "expected.json").read_text())
    assert expected["streamed_runs"] == []
    for line in (FRAMEWORKS / "langgraph_traceloop" / "trace.otlp.jsonl").read_text().splitlines():
        scopes = {ss["scope"]["name"]: ss["spans"] for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]}
        (workflow,) = scopes["@traceloop/node-server-sdk"]
        langchain = scopes["@traceloop/instrumentation-langchain"]
        assert workflow["name"] == "ap_agent.workflow" and len(langchain) > 10
        assert {s["parentSpanId"] for s in langchain} == {workflow["spanId"]}
        tools = [s for s in langchain if s["name"].startswith("execute_tool")]
        assert {s["name"] for s in tools} == {"execute_tool DynamicStructuredTool"}  # the class, not the tool
