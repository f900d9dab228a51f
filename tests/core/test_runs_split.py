"""Several runs under one span that is no run itself are several trajectories (issue 29 item 4).

A conversation span holding the user's turns, an MCP client's connection-lifetime session span holding
the runs made over it, a web request's span: each top-level agent span beneath it (one with no agent
above it) starts a run. Where the turns are no agent spans (LangGraph's graph invocations are CHAIN spans)
or sit under one agent span for the whole conversation (the OpenAI Agents SDK's `withTrace`), the model
calls mark them: each turn sends the history so far, so a turn's first call holds an answered user message
and then a new one (`step:new_user_turn`). A root that records the run's request (a chain or workflow
span with input) is one run, whatever agents run beneath it; agents inside an agent are its sub-agents.
The recorded cases are tests/fixtures/frameworks/aisdk6_conversation (three turns of a real AI SDK
conversation in one trace), autogen_conversation (three runs of one AutoGen AssistantAgent under the app's
`conversation` span), langgraph_conversation and openai_agents_js_conversation, and in Python Semantic Kernel's, CrewAI's,
Haystack's, DSPy's (turns found by the model calls: each closed by DSPy's `submit`) and an MCP agent's conversations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import Tracer
from otlp import record

from plumbline_otel.assemble import assemble_runs, split_runs
from plumbline_otel.coverage import coverage_report
from plumbline_otel.decode import read_trace_file, request_from_json
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import normalise_request
from plumbline_otel.store import Store

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
    """The store splits a long trace on span id, parent, start, end, step kind, shapes and hand-off alone."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            for i in range(3):
                _agent_run(tracer, f"turn {i}", "lookup")

    records, _ = normalise_request(record(build))
    skeleton = [SpanRecord(r.trace_id, r.span_id, r.parent_span_id, "", r.start_ns, r.end_ns, step_kind=r.step_kind,
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


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "text", "content": text}]}


def _chat(tracer: Tracer, history: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """One model call given `history`; the history with the model's reply."""
    with tracer.start_as_current_span("chat m1", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
            "gen_ai.input.messages": json.dumps(history), "gen_ai.output.messages": json.dumps([reply])}):
        pass
    return [*history, reply]


def _turn(tracer: Tracer, history: list[dict[str, Any]], request: str, invoice: str) -> list[dict[str, Any]]:
    """One user turn: a tool call then the answer, each model call sent the conversation so far."""
    call = {"type": "tool_call", "id": f"call_{invoice}", "name": "lookup_invoice", "arguments": {"invoice_id": invoice}}
    history = _chat(tracer, [*history, _user(request)], {"role": "assistant", "parts": [call]})
    with tracer.start_as_current_span("execute_tool lookup_invoice", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_invoice", "gen_ai.tool.call.id": f"call_{invoice}",
            "gen_ai.tool.call.arguments": json.dumps({"invoice_id": invoice})}):
        pass
    result = {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{invoice}", "response": "open"}]}
    return _chat(tracer, [*history, result], {"role": "assistant", "parts": [{"type": "text", "content": f"{invoice} is open"}]})


_REQUESTS = [("Look up INV-1", "INV-1"), ("Now INV-2", "INV-2"), ("And INV-3", "INV-3")]


def test_turns_under_chain_spans_in_one_conversation_span_are_one_run_each() -> None:
    """LangGraph's shape: the app's span, then per turn the graph's CHAIN span (no agent span anywhere)."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            history: list[dict[str, Any]] = []
            for request, invoice in _REQUESTS:
                with tracer.start_as_current_span("graph", attributes={"openinference.span.kind": "CHAIN"}):
                    history = _turn(tracer, history, request, invoice)

    runs = _runs(build)
    assert [(r.input, r.final_output, [(s.name, s.args) for s in r.tool_steps], sum(s.kind == "llm_call" for s in r.steps)) for r in runs] == [
        (request, f"{invoice} is open", [("lookup_invoice", {"invoice_id": invoice})], 2) for request, invoice in _REQUESTS]
    assert len({r.trajectory_id for r in runs}) == 3


def test_turns_with_no_span_of_their_own_under_one_agent_span_split_at_their_first_model_call() -> None:
    """One agent span for the whole conversation and its calls flat beneath it: each turn's spans follow its first call."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent chat", attributes={"gen_ai.operation.name": "invoke_agent"}):
            history: list[dict[str, Any]] = []
            for request, invoice in _REQUESTS:
                history = _turn(tracer, history, request, invoice)

    runs = _runs(build)
    assert [(r.input, [s.name for s in r.steps]) for r in runs] == [
        (request, ["m1", "lookup_invoice", "m1"]) for request, _ in _REQUESTS]


def test_one_run_sent_an_earlier_conversation_is_one_run() -> None:
    """A request that continues an earlier conversation (its history is in the first call) is still one run."""
    earlier = [_user("Look up INV-1"), {"role": "assistant", "parts": [{"type": "text", "content": "INV-1 is open"}]}]

    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            with tracer.start_as_current_span("graph", attributes={"openinference.span.kind": "CHAIN"}):
                _turn(tracer, earlier, "Now INV-2", "INV-2")

    (run,) = _runs(build)
    assert run.input == "Now INV-2" and [s.name for s in run.tool_steps] == ["lookup_invoice"]


def test_a_turns_first_call_traced_twice_side_by_side_opens_one_turn() -> None:
    """Two instrumentations' spans of one call, siblings overlapping in time (Traceloop for Node's LangChain span and
    its OpenAI span), both mark the new turn: the later one, started while the first ran, opens no turn of its own."""
    def twice(tracer: Tracer, history: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
                      "gen_ai.input.messages": json.dumps(history), "gen_ai.output.messages": json.dumps([reply])}
        first = tracer.start_span("chat m1", attributes=attributes)
        tracer.start_span("chat m1", attributes=attributes).end()
        first.end()
        return [*history, reply]

    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent chat", attributes={"gen_ai.operation.name": "invoke_agent"}):
            history: list[dict[str, Any]] = []
            for request, invoice in _REQUESTS:
                history = twice(tracer, [*history, _user(request)], {"role": "assistant", "parts": [{"type": "text", "content": f"{invoice} is open"}]})

    records, _ = normalise_request(record(build))
    assert sum("step:new_user_turn" in r.shapes for r in records) == 4
    assert [len(group) for _, group in split_runs(records)] == [2, 2, 2]


def test_a_model_call_that_continues_its_own_tool_loop_is_no_new_turn() -> None:
    """Only a new user message after an answer opens a turn: a request ending in tool results, or with no answer
    before its user message, does not."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            history = _turn(tracer, [], "Look up INV-1", "INV-1")
            _chat(tracer, [*history[:1], _user("also INV-2")], {"role": "assistant", "parts": [{"type": "text", "content": "ok"}]})

    records, _ = normalise_request(record(build))
    assert not any("step:new_user_turn" in r.shapes for r in records)
    assert len(assemble_runs(records)) == 1


def _dspy_turn(tracer: Tracer, history: list[dict[str, Any]], request: str, invoice: str) -> list[dict[str, Any]]:
    """One turn of DSPy ReActV2 as openinference-instrumentation-dspy traces it: the program's CHAIN span (its input
    fields as `input_args`), per model call an LLM span whose raw request (`input.value`) ends in DSPy's own template
    message, even after tool results, and whose flattened messages keep no assistant tool calls; the turn ends with
    a call of the `submit` tool, which goes back into the next turn's history."""
    template = "Respond with the corresponding output fields, starting with the field `[[ ## next_thought ## ]]`."

    def lm(messages: list[dict[str, Any]], call: dict[str, Any]) -> list[dict[str, Any]]:
        flat = {f"llm.input_messages.{i}.message.{k}": v for i, m in enumerate(messages)
                for k, v in (("role", m["role"]), ("content", m.get("content"))) if v}
        with tracer.start_as_current_span("LM.__call__", attributes={
                "openinference.span.kind": "LLM", "input.value": json.dumps({"messages": messages}), **flat,
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.tool_calls.0.tool_call.id": call["id"],
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": call["function"]["name"],
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": call["function"]["arguments"]}):
            pass
        return [*messages, {"role": "assistant", "content": None, "tool_calls": [call]}]

    def tool(name: str, args: dict[str, Any], result: str) -> dict[str, Any]:
        with tracer.start_as_current_span(f"{name}.__call__", attributes={
                "openinference.span.kind": "TOOL", "input.value": json.dumps({"kwargs": args}), "output.value": result}):
            pass
        return {"role": "tool", "tool_call_id": f"call_{invoice}_{name}", "name": name, "content": result}

    def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"call_{invoice}_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    answer = f"{invoice} is open"
    with tracer.start_as_current_span("ReActV2.forward", attributes={
            "openinference.span.kind": "CHAIN", "input.value": json.dumps({"input_args": {"request": request, "history": None}}),
            "output.value": json.dumps({"answer": answer})}):
        asked = [*history, {"role": "user", "content": f"[[ ## request ## ]]\n{request}\n\n{template}"}]
        messages = lm(asked, call("lookup_invoice", {"invoice_id": invoice}))
        messages = lm([*messages, tool("lookup_invoice", {"invoice_id": invoice}, "open"), {"role": "user", "content": template}],
                      call("submit", {"answer": answer}))
        return [*messages, tool("submit", {"answer": answer}, json.dumps({"answer": answer}))]


def test_dspy_turns_closed_by_the_answer_tool_are_one_run_each() -> None:
    """A turn answered by the framework's answer tool (DSPy's `submit`, its call only in the raw request) opens the next
    turn; a model call after tool results that ends in the framework's template message (a user message) opens none."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            history: list[dict[str, Any]] = [{"role": "system", "content": "Your input fields are: request"}]
            for request, invoice in _REQUESTS:
                history = _dspy_turn(tracer, history, request, invoice)

    records, problems = normalise_request(record(build, scope="openinference.instrumentation.dspy"))
    assert problems == [] and sum("step:new_user_turn" in r.shapes for r in records) == 2
    runs = assemble_runs(records)
    assert [(r.input, r.final_output, [s.name for s in r.tool_steps], sum(s.kind == "llm_call" for s in r.steps)) for r in runs] == [
        (request, f"{invoice} is open", ["lookup_invoice"], 2) for request, invoice in _REQUESTS]


@pytest.mark.parametrize("setup", ["langgraph_conversation", "openai_agents_js_conversation", "aisdk7_otel_conversation",
                                   "langgraph_traceloop_conversation", "mastra_conversation", "semantic_kernel_conversation",
                                   "crewai_conversation", "haystack_conversation", "dspy_conversation", "mcp_conversation"])
def test_a_recorded_conversation_rebuilt_run_by_run_by_the_store_is_as_if_assembled_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str) -> None:
    """The store's long-trace path splits on its few columns alone: the turn marks are among them."""
    import plumbline_otel.store._store as store_module

    monkeypatch.setattr(store_module, "LONG_TRACE_SPANS", 20)  # each fixture's one trace is "long": rebuilt run by run
    records = [rec for path in sorted((FRAMEWORKS / setup).glob("*.otlp.jsonl"))
               for decoded in read_trace_file(path) for rec in normalise_request(decoded.request)[0]]
    whole = sorted(json.dumps(t.export(), sort_keys=True) for t in assemble_runs(records))
    with Store(tmp_path / "s.duckdb") as store:
        store.write_spans(records)
        assert store.assemble() == 3
        assert sorted(json.dumps(t.export(), sort_keys=True) for t in store.trajectories()) == whole
        assert len(whole) == 3
        section = coverage_report(store)["overall"]
        assert section["trajectories"]["traces_with_several_runs"] == 1
        assert "1 traces held more than one run" in "\n".join(section["findings"])
