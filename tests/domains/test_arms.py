"""The three accounts-payable arms, end to end on real components.

Real `anthropic` client -> loopback Messages API stand-in serving the simulated model; real
OpenTelemetry SDK with an in-memory exporter; a fresh system of record per trial; the domain's
own grader. No mocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from domains.accounts_payable.anthropic_standin import AnthropicStandIn
from domains.accounts_payable.arms import FaultPlan, TrialIdentity, make_client, run_trial
from domains.accounts_payable.ground_truth import expected_outcome
from domains.accounts_payable.simulated_model import SIMULATED_MODEL_NAME, SimulatedModel
from domains.accounts_payable.tasks import TASKS
from domains.accounts_payable.tracing import make_tracer_provider

ARMS = ("plan_execute", "plan_execute_retry", "react")
CLEAN_INVOICE = "INV-1001"  # pays 2,909.88 GBP, band A


@pytest.fixture(scope="module")
def model_client() -> Iterator[Any]:
    """The real anthropic client pointed at a stand-in serving the flawless simulated model."""
    with AnthropicStandIn(SimulatedModel()) as standin:
        yield make_client(standin.base_url, api_key="offline-test", max_retries=0)


def attrs(item: Any) -> dict[str, Any]:
    """A span's (or event's, or resource's) attributes as a plain dict: the SDK types them as optional."""
    return dict(item.attributes or {})


class Traced:
    """A tracer provider for one arm with an in-memory exporter."""

    def __init__(self, arm: str) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = make_tracer_provider(arm, exporter=self.exporter)

    def spans(self, trace_id: str) -> list[ReadableSpan]:
        found = [s for s in self.exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
        return sorted(found, key=lambda s: s.start_time or 0)


def _trial(arm: str, task_id: str, client: Any, traced: Traced, **kwargs: Any):
    return run_trial(arm, task_id, client=client, tracer_provider=traced.provider, **kwargs)


@pytest.mark.parametrize("task_id", [t.task_id for t in TASKS])
@pytest.mark.parametrize("arm", ARMS)
def test_arm_without_imperfections_reaches_the_expected_outcome(arm: str, task_id: str, model_client: Any) -> None:
    traced = Traced(arm)
    result = _trial(arm, task_id, model_client, traced, trial=TrialIdentity(f"ok/{arm}/{task_id}"))
    assert result.passed, (result.grade.problems, result.tool_path(), result.final_answer)
    assert result.agent_error is None
    assert result.grade.observed_action == expected_outcome(task_id).action
    assert result.response_models == [SIMULATED_MODEL_NAME]
    spans = traced.spans(result.trace_id)
    assert [s.name for s in spans if s.parent is None] == [f"invoke_agent {arm}"]
    assert sum(s.name.startswith("execute_tool ") for s in spans) == len(result.steps)


def _tool_spans(spans: list[ReadableSpan], tool: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == f"execute_tool {tool}"]


def _root(spans: list[ReadableSpan]) -> ReadableSpan:
    return next(s for s in spans if s.parent is None)


def test_transient_fault_on_a_check_holds_a_clean_invoice_without_retry(model_client: Any) -> None:
    traced = Traced("plan_execute")
    result = _trial("plan_execute", CLEAN_INVOICE, model_client, traced,
                    trial=TrialIdentity("fault/no-retry"), fault=FaultPlan("check_duplicate", "503"))
    assert result.fault_fired and result.fault_step == 5  # get_invoice, vendor, po, match, then duplicate
    assert not result.passed
    assert result.grade.observed_action == "hold"
    assert [e["reason_code"] for e in result.grade.writes["exceptions"]] == ["DUPLICATE_INVOICE"]
    assert [s.name for s in result.steps].count("check_duplicate") == 1  # no retry

    spans = traced.spans(result.trace_id)
    (dup,) = _tool_spans(spans, "check_duplicate")
    assert dup.status.status_code is StatusCode.ERROR
    assert attrs(dup)["error.type"] == "503"
    assert attrs(dup)["plumbline.fault.injected"] is True
    assert "gen_ai.tool.call.result" not in attrs(dup)
    assert [e.name for e in dup.events] == ["exception"]
    assert "503 Service Unavailable" in attrs(dup.events[0])["exception.message"]
    root = _root(spans)
    assert attrs(root)["plumbline.fault.fired"] is True
    assert attrs(root)["plumbline.fault.step"] == 5
    assert _tool_spans(spans, "schedule_payment") == []


@pytest.mark.parametrize("arm", ["plan_execute_retry", "react"])
def test_transient_fault_on_a_check_is_retried_and_the_invoice_paid(arm: str, model_client: Any) -> None:
    traced = Traced(arm)
    result = _trial(arm, CLEAN_INVOICE, model_client, traced,
                    trial=TrialIdentity(f"fault/{arm}"), fault=FaultPlan("check_duplicate", "503"))
    assert result.fault_fired
    assert result.passed, result.grade.problems
    (payment,) = result.grade.writes["payments"]
    assert payment["amount"] == expected_outcome(CLEAN_INVOICE).payable_amount

    first, second = _tool_spans(traced.spans(result.trace_id), "check_duplicate")
    assert first.status.status_code is StatusCode.ERROR and attrs(first)["error.type"] == "503"
    assert second.status.status_code is StatusCode.UNSET and "error.type" not in attrs(second)
    assert json.loads(attrs(second)["gen_ai.tool.call.result"])["passed"] is True
    assert first.end_time is not None and second.start_time is not None and first.end_time <= second.start_time
    assert attrs(first)["gen_ai.tool.call.id"] != attrs(second)["gen_ai.tool.call.id"]


def test_retry_is_only_for_transient_errors(model_client: Any) -> None:
    traced = Traced("plan_execute_retry")
    # Three consecutive 429s are retried (4 attempts); a fourth failure would be a blocker.
    result = _trial("plan_execute_retry", CLEAN_INVOICE, model_client, traced,
                    fault=FaultPlan("validate_tax_code", "429", times=3))
    assert result.passed
    assert [s.error_type for s in result.steps if s.name == "validate_tax_code"] == ["429", "429", "429", None]
    exhausted = _trial("plan_execute_retry", CLEAN_INVOICE, model_client, traced,
                       fault=FaultPlan("validate_tax_code", "timeout", times=4))
    assert [s.name for s in exhausted.steps].count("validate_tax_code") == 4
    assert [e["reason_code"] for e in exhausted.grade.writes["exceptions"]] == ["TAX_CODE_MISMATCH"]


def test_faults_fire_per_trial_not_per_variant(model_client: Any) -> None:
    spec = FaultPlan("three_way_match", "connection_reset")  # one spec, shared like a variant's
    traced = Traced("plan_execute")
    identities = [TrialIdentity(f"tool_fault/0/k{k}", "tool_fault", "0", "per-trial") for k in range(4)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(
            lambda t: _trial("plan_execute", CLEAN_INVOICE, model_client, traced, trial=t, fault=spec),
            identities))
    assert [r.fault_fired for r in results] == [True] * 4
    assert [r.fault_step for r in results] == [4] * 4
    assert [r.grade.observed_action for r in results] == ["hold"] * 4
    for r in results:
        root = _root(traced.spans(r.trace_id))
        assert attrs(root)["plumbline.trial.id"] == r.trial.trial_id
        assert attrs(root)["plumbline.fault.fired"] is True
    assert len({r.trace_id for r in results}) == 4


def test_a_fault_on_a_tool_the_trial_never_calls_is_recorded_as_not_fired(model_client: Any) -> None:
    traced = Traced("react")
    result = _trial("react", "INV-1013", model_client, traced, fault=FaultPlan("three_way_match", "503"))
    assert result.passed  # a credit note has no three-way match
    assert result.fault_fired is False and result.fault_step is None
    root = _root(traced.spans(result.trace_id))
    assert attrs(root)["plumbline.fault.fired"] is False
    assert "plumbline.fault.step" not in attrs(root)


def test_react_spans_carry_the_genai_conventions(model_client: Any) -> None:
    traced = Traced("react")
    trial = TrialIdentity("genai/1", "paraphrase", "2", "conventions")
    result = _trial("react", "INV-1005", model_client, traced, trial=trial)
    spans = traced.spans(result.trace_id)
    root = _root(spans)

    assert root.name == "invoke_agent react"
    assert attrs(root.resource)["service.name"] == "ap-agent-react"
    assert attrs(root.resource)["service.version"]
    assert attrs(root)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(root)["gen_ai.agent.name"] == "react"
    assert attrs(root)["gen_ai.conversation.id"] == "INV-1005"
    assert json.loads(attrs(root)["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": result.request_text}]}]
    (final,) = json.loads(attrs(root)["gen_ai.output.messages"])
    assert final["parts"][0]["content"] == result.final_answer
    assert {k: attrs(root)[k] for k in trial.attributes()} == trial.attributes()
    assert "plumbline.fault.fired" not in attrs(root)

    chats = [s for s in spans if attrs(s).get("gen_ai.operation.name") == "chat"]
    tools = [s for s in spans if attrs(s).get("gen_ai.operation.name") == "execute_tool"]
    assert len(chats) == result.model_calls and len(tools) == len(result.steps)
    assert root.context is not None and all(s.parent is not None and s.parent.span_id == root.context.span_id for s in chats + tools)
    proposed: dict[str, dict[str, Any]] = {}
    for chat in chats:
        a = attrs(chat)
        assert chat.name == f"chat {result.model}" and chat.kind is SpanKind.CLIENT
        assert a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == result.model
        assert a["gen_ai.response.model"] == SIMULATED_MODEL_NAME
        assert a["gen_ai.response.id"].startswith("msg_")
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        inputs = json.loads(a["gen_ai.input.messages"])
        assert inputs[0]["role"] == "user" and inputs[0]["parts"][0]["type"] == "text"
        for message in inputs[1:]:
            for part in message["parts"]:
                if part["type"] == "tool_call_response":
                    assert message["role"] == "tool" and part["id"] in proposed
        (output,) = json.loads(a["gen_ai.output.messages"])
        assert output["role"] == "assistant"
        for part in output["parts"]:
            if part["type"] == "tool_call":
                assert isinstance(part["arguments"], dict)
                proposed[part["id"]] = part
        assert output["finish_reason"] in ("tool_call", "stop")
    assert json.loads(attrs(chats[0])["gen_ai.system_instructions"])[0]["type"] == "text"

    for tool in tools:
        a = attrs(tool)
        call = proposed[a["gen_ai.tool.call.id"]]  # the id the model gave, echoed on the tool span
        assert tool.name == f"execute_tool {a['gen_ai.tool.name']}" and a["gen_ai.tool.name"] == call["name"]
        assert json.loads(a["gen_ai.tool.call.arguments"]) == call["arguments"]
        assert isinstance(json.loads(a["gen_ai.tool.call.result"]), dict)
    pay = next(t for t in tools if attrs(t)["gen_ai.tool.name"] == "schedule_payment")
    assert json.loads(attrs(pay)["gen_ai.tool.call.arguments"]) == {
        "invoice_id": "INV-1005", "amount": 28500.0, "currency": "EUR"}


def test_plan_execute_interprets_with_one_forced_tool_call(model_client: Any) -> None:
    traced = Traced("plan_execute")
    result = _trial("plan_execute", "INV-1012", model_client, traced,
                    request_text="Hi team, can you deal with INV-1012 from Delmar today? Thanks!")
    assert result.passed and result.model_calls == 1
    (chat,) = [s for s in traced.spans(result.trace_id) if s.name.startswith("chat ")]
    (output,) = json.loads(attrs(chat)["gen_ai.output.messages"])
    assert output["parts"] == [{"type": "tool_call", "id": output["parts"][0]["id"], "name": "record_interpretation",
                                "arguments": {"invoice_id": "INV-1012", "operation": "process"}}]
    tool_calls = [s for s in traced.spans(result.trace_id) if s.name.startswith("execute_tool ")]
    assert [attrs(s)["gen_ai.tool.call.id"] for s in tool_calls] == [f"call_{i:03d}" for i in
                                                                        range(1, len(tool_calls) + 1)]


def test_content_capture_off_drops_messages_but_keeps_tool_arguments(model_client: Any) -> None:
    traced = Traced("react")
    result = _trial("react", "INV-1020", model_client, traced, capture_content=False)
    spans = traced.spans(result.trace_id)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert chats and all("gen_ai.input.messages" not in attrs(s) for s in chats)
    assert all("gen_ai.output.messages" not in attrs(s) for s in chats)
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert all(json.loads(attrs(s)["gen_ai.tool.call.arguments"]) for s in tools)
