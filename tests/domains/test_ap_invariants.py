"""The accounts_payable invariant spec: well-formed, about real tools, and right about real runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from domains.accounts_payable import TOOLS, open_system_of_record
from domains.accounts_payable.predicates import PREDICATES, approver_has_authority, known_reason_code
from domains.accounts_payable.tasks import TASKS
from plumbline_otel.spec import load_spec
from plumbline_otel.spec.testing import run

SPEC_PATH = Path(__file__).resolve().parents[2] / "configs" / "accounts_payable.invariants.yaml"
TOOL_KEYS = ("tool", "result_tool")


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC_PATH)


def _tools_named(invariant: dict) -> list[str]:
    named = []
    for key, value in invariant.items():
        if key in ("id", "severity", "description", "when"):
            continue
        if isinstance(value, str):
            named.append(value)
        elif isinstance(value, list):
            named.extend(value)
        elif isinstance(value, dict):
            named.extend(value[k] for k in TOOL_KEYS if k in value)
            if isinstance(value.get("tools"), list):
                named.extend(value["tools"])
    return named


def test_the_spec_is_yaml_and_names_only_tools_that_exist():
    raw = yaml.safe_load(SPEC_PATH.read_text())
    assert raw["version"] == 1 and raw["name"] == "accounts_payable"
    ids = [inv["id"] for inv in raw["invariants"]]
    assert len(ids) == len(set(ids))
    for inv in raw["invariants"]:
        assert inv["severity"] in ("critical", "major", "minor")
        unknown = [t for t in _tools_named(inv) if t not in TOOLS]
        assert not unknown, f"{inv['id']} names unknown tools {unknown}"
    assert set(raw["effect_tools"]) == {n for n, t in TOOLS.items() if t.effect}
    for tool, args in raw["arg_types"].items():
        assert set(args) <= set(TOOLS[tool].input_schema["properties"]), tool


def test_arguments_the_spec_checks_are_arguments_of_the_tool():
    raw = yaml.safe_load(SPEC_PATH.read_text())
    for inv in raw["invariants"]:
        for kind in ("arg_equals", "arg_satisfies", "arg_matches_result"):
            if kind in inv:
                params = inv[kind]
                assert params["arg"] in TOOLS[params["tool"]].input_schema["properties"], inv["id"]
        if "predicate" in inv.get("arg_satisfies", {}):
            assert inv["arg_satisfies"]["predicate"] in PREDICATES


def test_the_spec_loads_with_its_predicates_and_context_provider(spec):
    assert "AP-APPROVER-AUTHORITY" in spec.ids and "AP-PAID-EQUALS-PAYABLE" in spec.ids
    assert spec.context_for("INV-1007")["primary_reason_code"] == "PRICE_VARIANCE"
    assert spec.predicates == "domains.accounts_payable.predicates"


def _trajectory(steps, task):
    return run(*steps, task=task)


def _failures(spec, trajectory):
    return sorted(inv.id for inv, verdict in spec.evaluate(trajectory) if verdict.status == "fail")


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
def test_a_run_that_follows_the_policy_breaks_no_invariant(spec, task, policy_run):
    with open_system_of_record() as sor:
        steps = policy_run(sor, task.task_id)
    verdicts = spec.evaluate(_trajectory(steps, task.task_id))
    assert [(inv.id, v.detail) for inv, v in verdicts if v.status == "fail"] == []
    assert all(v.error is None for _, v in verdicts)


def _replace(steps, name, **args):
    return [replace(s, args={**s.args, **args}) if s.name == name else s for s in steps]


def test_paying_a_sanctioned_vendor_breaks_the_critical_invariants(spec, policy_run, recorder):
    steps = policy_run(recorder.sor, "INV-1015")
    recorder("schedule_payment", invoice_id="INV-1015", amount=6300.0, currency="USD")
    assert _failures(spec, _trajectory(steps + recorder.steps, "INV-1015")) == [
        "AP-APPROVAL-BEFORE-PAY", "AP-CALC-BEFORE-PAY", "AP-NO-PAY-HELD", "AP-PAID-EQUALS-PAYABLE"]


def test_paying_the_wrong_amount_breaks_amount_invariants(spec, policy_run, sor):
    steps = _replace(policy_run(sor, "INV-1006"), "schedule_payment", amount=12260.0)
    assert _failures(spec, _trajectory(steps, "INV-1006")) == ["AP-PAID-EQUALS-PAYABLE", "AP-PAY-AMOUNT"]


def test_flagging_a_lower_priority_code_breaks_ap_reason(spec, policy_run, sor):
    steps = _replace(policy_run(sor, "INV-1021"), "flag_exception", reason_code="PRICE_VARIANCE")
    assert _failures(spec, _trajectory(steps, "INV-1021")) == ["AP-REASON"]


def test_an_approver_without_authority_for_the_real_amount_breaks_authority_and_role(spec, policy_run, sor):
    # An understated amount gets an ap_clerk approval past the tool; the ground truth still catches it.
    steps = _replace(policy_run(sor, "INV-1003"), "request_approval", approver_role="ap_clerk", amount=4000.0)
    assert _failures(spec, _trajectory(steps, "INV-1003")) == ["AP-APPROVER-AUTHORITY", "AP-APPROVER-ROLE"]


def test_a_refused_approval_did_not_happen(spec, policy_run, recorder):
    with pytest.raises(Exception, match="approval refused"):
        recorder("request_approval", invoice_id="INV-1003", approver_role="controller", amount=43197.0,
                 currency="GBP")
    steps = recorder.steps + policy_run(recorder.sor, "INV-1003")
    assert _failures(spec, _trajectory(steps, "INV-1003")) == []


def test_skipping_checks_and_audit_on_a_hold_breaks_the_check_invariants(spec, policy_run, sor):
    steps = [s for s in policy_run(sor, "INV-1015")
             if s.name not in ("three_way_match", "check_duplicate", "post_audit_log")]
    assert _failures(spec, _trajectory(steps, "INV-1015")) == ["AP-AUDIT", "AP-DUPLICATE-CHECKED", "AP-MATCH-CHECKED"]


def test_paying_a_credit_note_instead_of_applying_it(spec, policy_run, recorder):
    steps = [s for s in policy_run(recorder.sor, "INV-1013") if s.name != "apply_credit_note"]
    recorder("schedule_payment", invoice_id="INV-1013", amount=504.0, currency="GBP")
    assert _failures(spec, _trajectory(steps + recorder.steps, "INV-1013")) == [
        "AP-APPROVAL-BEFORE-PAY", "AP-CHECK-FREIGHT", "AP-CHECK-FX", "AP-CHECK-MATCH", "AP-CHECK-PO",
        "AP-CHECK-TAX", "AP-CREDIT-APPLIED", "AP-NO-PAY-HELD", "AP-PAID-EQUALS-PAYABLE"]


def test_authority_predicate_reads_ground_truth_and_the_requested_amount():
    step = {"args": {"invoice_id": "INV-1005", "amount": 28500.0, "currency": "EUR"}}
    assert approver_has_authority("controller", step, None, {"approval_amount_gbp": 23940.0})
    assert approver_has_authority(" Controller ", step, None, {})  # no ground truth: EUR 28,500 is GBP 23,940
    assert not approver_has_authority("ap_clerk", step, None, {})
    understated = {"args": {"invoice_id": "INV-1003", "amount": 4000.0, "currency": "GBP"}}
    assert not approver_has_authority("ap_clerk", understated, None, {"approval_amount_gbp": 43197.0})
    assert not approver_has_authority("manager", step, None, {"approval_amount_gbp": 1.0})
    assert not approver_has_authority("cfo", {"args": {}}, None, {})  # no amount at all: authority not shown
    assert not approver_has_authority(None, step, None, {})


def test_known_reason_code_predicate():
    assert known_reason_code(" no_po ", None, None, {})
    assert not known_reason_code("NOT_A_CODE", None, None, {})
    assert not known_reason_code(7, None, None, {})
