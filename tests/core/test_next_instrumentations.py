"""The next instrumentations' classes of miss (issue 40), each as a general rule on spans built with the real SDK in the
shape the instrumentation writes (the recorded set-ups in tests/fixtures/frameworks/ hold them as they came: OpenLIT,
Langfuse, LiteLLM, BeeAI, OpenTelemetry's openai-agents-v2, ADK 2 under OpenInference, the Anthropic SDK, CrewAI
under Traceloop). Names, scopes and values here are made up where the rule must not depend on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.trace import Tracer
from otlp import record, to_otlp_json

from plumbline_otel.assemble import assemble_runs
from plumbline_otel.coverage import coverage_report
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import normalise_request
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

FRAMEWORKS = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"


def _runs(build: Any, scope: str = "tests") -> list[Trajectory]:
    records, problems = normalise_request(record(build, scope=scope))
    assert problems == []
    return assemble_runs(records)


def _run(build: Any, scope: str = "tests") -> Trajectory:
    (run,) = _runs(build, scope)
    return run


def _msgs(role: str, *parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": role, "parts": list(parts)}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def _chat(tracer: Tracer, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], **attrs: Any) -> None:
    with tracer.start_as_current_span("chat m", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.input.messages": json.dumps(inputs),
            "gen_ai.output.messages": json.dumps(outputs), **attrs}):
        pass


# --- item 1: a run wrapper that looks like a model call ------------------------------------------------------------


def test_a_span_with_plain_text_messages_and_nothing_of_a_model_call_is_a_run_not_a_call() -> None:
    """OpenLIT's `start_trace` span carries only `gen_ai.output.messages` (the `set_result` text): the two chat spans
    under it are the run's model calls, and its text is the answer."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("ap_agent", attributes={"gen_ai.output.messages": "Paid INV-7."}):
            _chat(tracer, [_msgs("user", _text("Pay INV-7"))],
                  [_msgs("assistant", {"type": "tool_call", "id": "c1", "name": "pay", "arguments": {"id": "INV-7"}})])
            with tracer.start_as_current_span("execute_tool pay", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.id": "c1",
                    "gen_ai.tool.call.arguments": '{"id": "INV-7"}', "gen_ai.tool.call.result": "ok"}):
                pass
            _chat(tracer, [_msgs("user", _text("Pay INV-7"))], [_msgs("assistant", _text("Paid INV-7."))])

    run = _run(build)
    assert [s.kind for s in run.steps] == ["llm_call", "tool_call", "llm_call"]
    assert (run.input, run.final_output) == ("Pay INV-7", "Paid INV-7.")


def test_a_chat_span_without_an_operation_name_whose_messages_are_messages_is_still_a_call() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("llm", attributes={
                "gen_ai.input.messages": json.dumps([_msgs("user", _text("Hi"))]),
                "gen_ai.output.messages": json.dumps([_msgs("assistant", _text("Hello"))])}):
            pass

    assert [s.kind for s in _run(build).steps] == ["llm_call"]


# --- item 2: a framework's answer tool, by what it does, not by its name -------------------------------------------


def _answer_tool_run(tracer: Tracer, answer_tool: str, answer: str) -> None:
    with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT", "input.value": "Pay INV-8",
                                                           "output.value": "Paid INV-8."}):
        for name, args, out in (("lookup", {"id": "INV-8"}, "found"), (None, None, None), (answer_tool, {"text": answer}, "sent")):
            if name is None:
                with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM", "llm.token_count.prompt": 9,
                                                                      "llm.output_messages.0.message.role": "assistant"}):
                    pass
                continue
            with tracer.start_as_current_span(name, attributes={"openinference.span.kind": "TOOL", "tool.name": name,
                                                                 "input.value": json.dumps(args), "output.value": out}):
                pass


def test_a_call_after_the_last_model_call_carrying_the_answer_is_the_frameworks_answer_tool_under_any_name() -> None:
    run = _run(lambda tracer: _answer_tool_run(tracer, "hand_over_reply", "Paid  INV-8."), scope="some.new.framework")
    assert [s.name for s in run.tool_steps] == ["lookup"]
    assert run.final_output == "Paid INV-8."


def test_a_last_call_that_does_not_carry_the_answer_is_a_tool_call() -> None:
    run = _run(lambda tracer: _answer_tool_run(tracer, "notify_vendor", "Your invoice is paid."), scope="some.new.framework")
    assert [s.name for s in run.tool_steps] == ["lookup", "notify_vendor"]


# --- item 3: Langfuse's own convention -----------------------------------------------------------------------------


def test_langfuse_observations_are_steps_and_level_error_is_a_failure() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("ap_agent", attributes={
                "langfuse.observation.type": "agent", "session.id": "s-1",
                "langfuse.observation.input": json.dumps({"args": ["Pay INV-9"], "kwargs": {}}),
                "langfuse.observation.output": "Could not pay INV-9."}):
            with tracer.start_as_current_span("OpenAI-generation", attributes={
                    "langfuse.observation.type": "generation", "langfuse.observation.model.name": "m-1",
                    "langfuse.observation.usage_details": json.dumps({"prompt_tokens": 12, "completion_tokens": 3}),
                    "langfuse.observation.input": json.dumps({"messages": [{"role": "user", "content": "Pay INV-9"}]}),
                    "langfuse.observation.output": json.dumps({"role": "assistant", "tool_calls": [
                        {"id": "c9", "type": "function", "function": {"name": "pay", "arguments": '{"id": "INV-9"}'}}]})}):
                pass
            with tracer.start_as_current_span("pay", attributes={
                    "langfuse.observation.type": "tool", "langfuse.observation.input": json.dumps({"args": [], "kwargs": {"id": "INV-9"}}),
                    "langfuse.observation.level": "ERROR", "langfuse.observation.status_message": "bank refused"}):
                pass

    run = _run(build, scope="langfuse-sdk")
    (llm,) = [s for s in run.steps if s.kind == "llm_call"]
    assert _run(lambda tracer: _langfuse_root_of_type_span(tracer, build), scope="langfuse-sdk").input == "Pay invoice nine"
    assert (llm.model, llm.input_tokens, llm.output_tokens) == ("m-1", 12, 3)
    assert [(s.name, s.args, s.error, s.call_id) for s in run.tool_steps] == [("pay", {"id": "INV-9"}, "bank refused", "c9")]
    assert (run.input, run.final_output, run.context.get("session.id")) == ("Pay INV-9", "Could not pay INV-9.", "s-1")


def _langfuse_root_of_type_span(tracer: Tracer, inner: Any) -> None:
    """A plain `span` observation around the run, with the trace's input set on it (`update_current_trace`)."""
    with tracer.start_as_current_span("request", attributes={"langfuse.observation.type": "span",
                                                             "langfuse.trace.input": "Pay invoice nine"}):
        inner(tracer)


# --- item 4: tool calls recorded the old way ----------------------------------------------------------------------


def test_calls_only_in_the_older_indexed_keys_take_their_ids_and_results_from_the_next_request() -> None:
    """LiteLLM's callback: the response's calls as `gen_ai.completion.{j}.function_call.*` (one j per call, no ids),
    `gen_ai.output.messages` with empty parts; the next request's history has the ids and the results."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("app"):
            _chat(tracer, [_msgs("user", _text("Pay INV-10"))], [{"role": "assistant", "parts": [], "finish_reason": "tool_calls"}],
                  **{"gen_ai.completion.0.function_call.name": "lookup", "gen_ai.completion.0.function_call.arguments": '{"id": "INV-10"}',
                     "gen_ai.completion.1.function_call.name": "check", "gen_ai.completion.1.function_call.arguments": '{"id": "INV-10"}'})
            history = [_msgs("user", _text("Pay INV-10")),
                       {"role": "assistant", "parts": [], "tool_calls": [
                           {"id": "id-a", "type": "function", "function": {"name": "lookup", "arguments": '{"id": "INV-10"}'}},
                           {"id": "id-b", "type": "function", "function": {"name": "check", "arguments": '{"id": "INV-10"}'}}]},
                       {"role": "tool", "parts": [_text('{"amount": 5}')], "tool_call_id": "id-a"},
                       {"role": "tool", "parts": [_text("Error: no such vendor")], "tool_call_id": "id-b"}]
            _chat(tracer, history, [_msgs("assistant", _text("Could not check INV-10."))])

    run = _run(build)
    assert [(s.name, s.args, s.call_id, s.result, s.failed) for s in run.tool_steps] == [
        ("lookup", {"id": "INV-10"}, "id-a", {"amount": 5}, False), ("check", {"id": "INV-10"}, "id-b", "Error: no such vendor", True)]


# --- item 5: a failure only in the result's text ------------------------------------------------------------------


def test_a_langchain_tool_message_str_with_status_error_is_a_failed_call_with_its_content() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            for status, result in (("", '{"ok": true}'), (" status='error'", "PaymentGatewayError: refused")):
                message = f"content='{result}' name='pay' tool_call_id='c1'{status}"
                with tracer.start_as_current_span("execute_tool pay", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay",
                        "gen_ai.tool.call.arguments": '{"id": 1}', "gen_ai.tool.call.result": message}):
                    pass

    run = _run(build)
    assert [(s.result, s.failed) for s in run.tool_steps] == [({"ok": True}, False), ("PaymentGatewayError: refused", True)]


# --- item 6: a root holding the whole thread ----------------------------------------------------------------------


def test_a_run_span_holding_every_assistant_message_so_far_answers_with_its_last() -> None:
    def build(tracer: Tracer) -> None:
        thread = [_msgs("assistant", _text("Paid INV-1.")), _msgs("assistant", _text("Paid INV-2.")),
                  _msgs("assistant", _text("Could not pay INV-3."))]
        with tracer.start_as_current_span("invoke_workflow g", attributes={
                "gen_ai.operation.name": "invoke_workflow", "gen_ai.output.messages": json.dumps(thread)}):
            _chat(tracer, [_msgs("user", _text("Pay INV-3"))], [_msgs("assistant", _text("Could not pay INV-3."))])

    assert _run(build).final_output == "Could not pay INV-3."


# --- item 7: a run split where it should not be --------------------------------------------------------------------


def test_the_answered_request_sent_again_opens_no_new_turn() -> None:
    """A call whose user message the previous call had already sent (after the model's reply to it) is the same turn."""
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            _chat(tracer, [_msgs("user", _text("Pay INV-11"))], [_msgs("assistant", _text("Looking at it."))])
            _chat(tracer, [_msgs("user", _text("Pay INV-11")), _msgs("assistant", _text("Looking at it.")),
                           _msgs("user", _text("Pay INV-11"))], [_msgs("assistant", _text("Paid INV-11."))])

    run = _run(build)
    assert (sum(1 for s in run.steps if s.kind == "llm_call"), run.final_output) == (2, "Paid INV-11.")


def test_a_new_request_after_an_answer_still_opens_a_turn() -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("conversation"):
            _chat(tracer, [_msgs("user", _text("Pay INV-11"))], [_msgs("assistant", _text("Paid INV-11."))])
            _chat(tracer, [_msgs("user", _text("Pay INV-11")), _msgs("assistant", _text("Paid INV-11.")),
                           _msgs("user", _text("Pay INV-12"))], [_msgs("assistant", _text("Paid INV-12."))])

    assert [r.input for r in _runs(build)] == ["Pay INV-11", "Pay INV-12"]


# --- item 10: hand-offs in invariants ------------------------------------------------------------------------------


def test_invariants_name_a_hand_off_like_a_call(store: Store, tmp_path: Path) -> None:
    """`autogen_swarm`: ap_agent looks the invoice up, checks it, and hands off to payer by `transfer_to_payer` (`{}`, as
    the model sent it): an ordering, a count and a presence check name the hand-off as they name a tool."""
    ingest_files(store, [str(FRAMEWORKS / "autogen_swarm" / "trace.otlp.jsonl")])
    runs = list(store.trajectories())
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        "version: 1\nname: handoffs\ninvariants:\n"
        "  - id: CHECK-BEFORE-HANDOFF\n    severity: critical\n    ordering: [check_duplicate, transfer_to_payer]\n"
        "  - id: NO-HANDOFF\n    severity: minor\n    call_at_most: {tool: transfer_to_payer, n: 0}\n"
        "  - id: HANDED-OFF\n    severity: major\n    must_call: transfer_to_payer\n")
    spec = load_spec(spec_path)
    labels = [r["label"] for r in json.loads((FRAMEWORKS / "autogen_swarm" / "expected.json").read_text())["runs"]]
    verdicts = {(label, inv.id): v.status for label, run in zip(labels, runs) for inv, v in spec.evaluate(run, {})}
    assert {v for (_, inv), v in verdicts.items() if inv == "HANDED-OFF"} == {"pass"}
    assert {v for (_, inv), v in verdicts.items() if inv == "NO-HANDOFF"} == {"fail"}
    ordering = {label: v for (label, inv), v in verdicts.items() if inv == "CHECK-BEFORE-HANDOFF"}
    assert ordering == {label: "fail" if label == "skipped_check" else "pass" for label in labels}
    (handoff,) = [s for s in runs[0].steps if s.name == "transfer_to_payer"]
    assert (handoff.kind, handoff.args) == ("agent", {})


# --- item 11: coverage names what it saw and what it did not read ----------------------------------------------------


def _coverage_of(store: Store, tmp_path: Path, *builds: Any) -> str:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(to_otlp_json(record(b))) + "\n" for b in builds))
    ingest_files(store, [str(path)])
    return "\n".join(coverage_report(store)["overall"]["findings"])


def test_coverage_names_vendor_keys_present_and_not_read_where_a_trace_gave_no_steps(store: Store, tmp_path: Path) -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("step", attributes={"langfuse.observation.type": "span",
                                                              "langfuse.observation.prompt.name": "pay-prompt"}):
            pass

    findings = _coverage_of(store, tmp_path, build)
    assert "1 of 1 traces hold no steps" in findings
    assert "langfuse.observation.prompt.name (present, not read)" in findings


def test_coverage_does_not_blame_capture_alone_when_no_log_records_came(store: Store, tmp_path: Path) -> None:
    def build(tracer: Tracer) -> None:
        with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}):
                pass

    findings = _coverage_of(store, tmp_path, build)
    assert "have no message content" in findings and "No GenAI log records were received" in findings


def test_coverage_names_a_run_span_holding_the_whole_thread(store: Store) -> None:
    ingest_files(store, [str(FRAMEWORKS / "openlit_conversation" / "trace.otlp.jsonl")])
    section = coverage_report(store)["overall"]
    assert section["shapes"]["unwrapped"].get("output:whole_thread", 0) >= 2  # the second and third turns' graphs
    assert "run spans holding the whole thread" in "\n".join(section["findings"])


# --- item 12 (coverage part): a lightly traced agent is named as such, not only as lost context ---------------------


def test_coverage_names_an_agent_with_no_span_of_its_own_for_one_trace_per_model_call(store: Store, tmp_path: Path) -> None:
    def call(n: int) -> Any:
        def build(tracer: Tracer) -> None:
            _chat(tracer, [_msgs("user", _text(f"Pay INV-{n}"))], [_msgs("assistant", _text("Paid."))])
        return build

    findings = _coverage_of(store, tmp_path, call(1), call(2), call(3))
    assert "3 traces hold a single tool or model span and no agent span" in findings
    assert "the agent has no span of its own" in findings and "wrap each run in a span of the app's" in findings
