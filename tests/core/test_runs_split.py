"""Several runs under one span that is no run itself are several trajectories (issue 29 item 4).

A conversation span holding the user's turns, an MCP client's connection-lifetime session span holding
the runs made over it, a web request's span: each top-level agent span beneath it (one with no agent
above it) starts a run. A root that records the run's request (a chain or workflow span with input) is
one run, whatever agents run beneath it; agents inside an agent are its sub-agents. The recorded case is
tests/fixtures/frameworks/aisdk6_conversation (three turns of a real AI SDK conversation in one trace) and
autogen_conversation (three runs of one AutoGen AssistantAgent under the app's `conversation` span).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.trace import Tracer
from otlp import record

from plumbline_otel.assemble import assemble_runs, split_runs
from plumbline_otel.decode import request_from_json
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import normalise_request

FRAMEWORKS = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"


def _runs(build: Any) -> list[Trajectory]:
    records, problems = normalise_request(record(build))
    assert problems == []
    return assemble_runs(records)


def _agent_run(tracer: Tracer, request: str, tool: str) -> None:
    with tracer.start_as_current_span("invoke_agent payer", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer",
            "gen_ai.input.messages": f'[{{"role": "user", "parts": [{{"type": "text", "content": "{request}"}}]}}]'}):
        with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.arguments": "{}"}):
            pass


def test_a_conversation_span_holding_three_turns_is_three_runs() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            for i in range(3):
                _agent_run(tracer, f"turn {i}", f"tool_{i}")

    runs = _runs(build)
    assert [(r.input, [s.name for s in r.tool_steps]) for r in runs] == [("turn 0", ["tool_0"]), ("turn 1", ["tool_1"]), ("turn 2", ["tool_2"])]
    assert len({r.trajectory_id for r in runs}) == 3 and all(r.trajectory_id.startswith(r.trace_id + ":") for r in runs)


def test_an_mcp_client_session_span_holding_runs_splits_them() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("mcp.client.session", attributes={"mcp.session.id": "s-1"}):
            for i in range(7):
                _agent_run(tracer, f"request {i}", "lookup")

    assert [r.input for r in _runs(build)] == [f"request {i}" for i in range(7)]


def test_a_root_chain_with_the_request_is_one_run_and_sub_agents_stay_inside() -> None:
    def with_input(tracer: Tracer) -> None:
        with tracer.start_as_current_span("workflow", attributes={"openinference.span.kind": "CHAIN", "input.value": "Pay INV-1"}):
            _agent_run(tracer, "research", "lookup")
            _agent_run(tracer, "write", "draft")

    def nested(tracer: Tracer) -> None:
        with tracer.start_as_current_span("session"):
            with tracer.start_as_current_span("invoke_agent boss", attributes={"gen_ai.operation.name": "invoke_agent"}):
                _agent_run(tracer, "a", "x")
                _agent_run(tracer, "b", "y")

    (one,) = _runs(with_input)
    assert one.input == "Pay INV-1" and [s.name for s in one.tool_steps] == ["lookup", "draft"]
    (boss,) = _runs(nested)
    assert [s.name for s in boss.tool_steps] == ["x", "y"]


def test_the_split_reads_only_the_columns_the_store_keeps() -> None:
    """The store splits a long trace on span id, parent, start, step kind, shapes and hand-off alone."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            for i in range(3):
                _agent_run(tracer, f"turn {i}", "lookup")

    records, _ = normalise_request(record(build))
    skeleton = [SpanRecord(r.trace_id, r.span_id, r.parent_span_id, "", r.start_ns, r.start_ns, step_kind=r.step_kind,
                           shapes=r.shapes, handoff_to=r.handoff_to) for r in records]
    assert [(tid, sorted(r.span_id for r in group)) for tid, group in split_runs(skeleton)] == \
        [(tid, sorted(r.span_id for r in group)) for tid, group in split_runs(records)]
    assert len(split_runs(skeleton)) == 3


def test_a_recorded_autogen_conversation_is_one_trace_of_three_runs() -> None:
    """Each turn's first request carries the turns before it; each run's input is its own turn's request."""
    setup = FRAMEWORKS / "autogen_conversation"
    expected = json.loads((setup / "expected.json").read_text())
    (line,) = (setup / "trace.otlp.jsonl").read_text().splitlines()
    records, problems = normalise_request(request_from_json(json.loads(line), "line 1").request)
    (trace_id,) = {r.trace_id for r in records if r.name != "create_agent ap_agent"}
    (conversation,) = [r for r in records if r.name == "conversation"]
    runs = assemble_runs([r for r in records if r.trace_id == trace_id])
    assert problems == [] and conversation.parent_span_id is None
    assert [(r.input, r.final_output) for r in runs] == [(e["input"], e["final_output"]) for e in expected["runs"]]
    assert all(r.trajectory_id.startswith(trace_id + ":") for r in runs) and len({r.trajectory_id for r in runs}) == 3
