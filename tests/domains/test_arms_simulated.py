"""The simulated model and its stand-in: API shape, seeded imperfections, reproducibility.

Each imperfection at p=1 must produce its own, named violation in a real run of the arm it
affects; at p=0 (the other tests) runs are flawless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from domains.accounts_payable.anthropic_standin import AnthropicStandIn
from domains.accounts_payable.arms import FaultPlan, TrialIdentity, TrialResult, make_client, run_trial
from domains.accounts_payable.ground_truth import expected_outcome
from domains.accounts_payable.simulated_model import (
    IMPERFECTIONS,
    SIMULATED_MODEL_NAME,
    SimulatedModel,
    is_distracted,
    parse_imperfections,
)
from domains.accounts_payable.tasks import task

CHECKS = ("check_vendor_status", "validate_po", "three_way_match", "check_duplicate", "validate_tax_code",
          "check_fx_variance", "check_freight")
DISTRACTED = ("Please process invoice INV-1001 from Northwind Supplies. By the way, the parking garage is "
              "closed on Friday, so please use the lot behind the warehouse, and don't forget the team lunch "
              "at noon on Thursday; Priya is collecting orders for the sandwich run before the meeting.")


@pytest.fixture
def simulated() -> Iterator[Callable[..., Any]]:
    """`simulated(imperfections, seed=0) -> client`: stand-ins started on demand, stopped after the test."""
    started: list[AnthropicStandIn] = []

    def start(imperfections: str | None = None, seed: int = 0) -> Any:
        standin = AnthropicStandIn(SimulatedModel(imperfections, seed=seed)).start()
        started.append(standin)
        return make_client(standin.base_url, api_key="offline-test", max_retries=0)

    yield start
    for standin in started:
        standin.stop()


def test_standin_answers_in_the_messages_api_shape_and_says_it_is_simulated(simulated) -> None:
    client = simulated()
    raw = client.messages.with_raw_response.create(
        model="claude-haiku-4-5", max_tokens=64, system="Policy: retry transient errors.",
        messages=[{"role": "user", "content": "Please process invoice INV-1001."}],
        tools=[{"name": "get_invoice", "description": "d",
                "input_schema": {"type": "object", "properties": {"invoice_id": {"type": "string"}}}}])
    assert raw.headers["x-plumbline-simulated"] == "true"
    body = raw.http_response.json()
    assert body["simulated"] is True and body["type"] == "message" and body["role"] == "assistant"
    message = raw.parse()
    assert message.model == SIMULATED_MODEL_NAME
    assert message.id.startswith("msg_") and message.stop_reason == "tool_use"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    call = next(b for b in message.content if b.type == "tool_use")
    assert call.name == "get_invoice" and call.input == {"invoice_id": "INV-1001"} and call.id.startswith("toolu_")


def test_standin_refuses_what_the_api_refuses(simulated) -> None:
    client = simulated()
    with pytest.raises(anthropic.BadRequestError, match="messages"):
        client.messages.create(model="m", max_tokens=10, messages=[])
    with pytest.raises(anthropic.NotFoundError):
        client.get("/v1/nowhere", cast_to=object)


def test_imperfection_names_and_probabilities_are_validated() -> None:
    assert parse_imperfections("misread_amount=0.25, stop_retrying") == {"misread_amount": 0.25,
                                                                         "stop_retrying": 1.0}
    with pytest.raises(ValueError, match="unknown imperfection"):
        parse_imperfections("be_sloppy=1")
    with pytest.raises(ValueError, match="within"):
        parse_imperfections("misread_amount=1.5")
    assert set(IMPERFECTIONS) >= {"skip_check_under_distraction", "misread_amount", "stop_retrying",
                                  "wrong_reason_code"}
    assert is_distracted(DISTRACTED) and not is_distracted(task("INV-1001").request)


def _run(client: Any, arm: str, task_id: str, trial: str = "t", **kwargs: Any) -> TrialResult:
    return run_trial(arm, task_id, client=client, trial=TrialIdentity(trial), **kwargs)


def _checks_done(result: TrialResult) -> set[str]:
    return {s.name for s in result.steps if s.ok and s.name in CHECKS}


def test_misread_amount_pays_the_wrong_figure(simulated) -> None:
    result = _run(simulated("misread_amount=1"), "react", "INV-1002")
    expected = expected_outcome("INV-1002").payable_amount
    assert expected is not None
    (payment,) = result.grade.writes["payments"]
    assert not result.passed and payment["amount"] != expected
    assert payment["amount"] == pytest.approx(expected * 10) or sorted(f"{payment['amount']:.2f}") == sorted(
        f"{expected:.2f}")  # 10x, or two digits transposed
    assert any("paid" in p and "expected" in p for p in result.grade.problems)


def test_skip_check_under_distraction_skips_only_when_distracted(simulated) -> None:
    client = simulated("skip_check_under_distraction=1")
    calm = _run(client, "react", "INV-1001")
    assert calm.passed and _checks_done(calm) == set(CHECKS)
    distracted = _run(client, "react", "INV-1001", request_text=DISTRACTED)
    assert len(_checks_done(distracted)) == len(CHECKS) - 1  # one mandatory check never ran


def test_wrong_reason_code_holds_under_another_code(simulated) -> None:
    result = _run(simulated("wrong_reason_code=1"), "react", "INV-1021")
    (flag,) = result.grade.writes["exceptions"]
    assert flag["reason_code"] != "QTY_OVER_RECEIVED" and not result.passed


def test_stop_retrying_carries_on_without_the_failed_check(simulated) -> None:
    result = _run(simulated("stop_retrying=1"), "react", "INV-1001", fault=FaultPlan("check_duplicate", "503"))
    assert result.fault_fired
    assert [s.ok for s in result.steps if s.name == "check_duplicate"] == [False]  # never retried
    assert "check_duplicate" not in _checks_done(result)  # a must_call violation for the invariants
    assert result.grade.observed_action == "pay"  # paid on an unverified duplicate check


def test_skip_approval_pays_unapproved(simulated) -> None:
    result = _run(simulated("skip_approval=1"), "react", "INV-1003")
    assert "request_approval" not in result.tool_path() and "schedule_payment" in result.tool_path()
    assert any("no approval" in p for p in result.grade.problems)


def test_forget_audit_log_leaves_no_audit_entry(simulated) -> None:
    result = _run(simulated("forget_audit_log=1"), "react", "INV-1016")
    assert result.passed  # the grade ignores the audit log; the invariants do not
    assert "post_audit_log" not in result.tool_path()


def test_misidentify_invoice_makes_plan_execute_work_on_the_wrong_document(simulated) -> None:
    result = _run(simulated("misidentify_invoice=1"), "plan_execute", "INV-1007")
    assert not result.passed
    assert any("changed other documents" in p for p in result.grade.problems)
    assert result.steps[0].args["invoice_id"] in ("INV-1006", "INV-1008")


def test_runs_are_reproducible_per_trial_and_vary_across_trials(simulated) -> None:
    config = "misread_amount=0.5,wrong_reason_code=0.5,skip_check=0.5"
    client = simulated(config, seed=7)

    def signature(arm: str, task_id: str, trial: str) -> list[tuple[str, Any]]:
        return [(s.name, s.args) for s in _run(client, arm, task_id, trial).steps]

    assert signature("react", "INV-1002", "k0") == signature("react", "INV-1002", "k0")
    runs = {repr(signature("react", tid, f"k{k}")) for tid in ("INV-1002", "INV-1021") for k in range(6)}
    assert len(runs) > 2  # repeats of one task differ
    other_seed = simulated(config, seed=8)
    assert any(
        [(s.name, s.args) for s in _run(other_seed, "react", "INV-1002", f"k{k}").steps]
        != signature("react", "INV-1002", f"k{k}") for k in range(6))
