"""Every invariant kind: pass, fail and not_applicable on hand-built runs, failed calls included."""

from plumbline_otel.spec import (
    ArgEquals,
    ArgMatchesResult,
    ArgSatisfies,
    CallAtLeast,
    CallAtMost,
    MustCall,
    MustNotCall,
    Ordering,
    Rule,
    Spec,
    Verdict,
    invariant,
)
from plumbline_otel.spec.testing import call, llm, run

FAIL = "503 upstream unavailable"


def status(check, trajectory, context=None):
    return check(trajectory, context or {}).status


# --- must_call -------------------------------------------------------------------------------


def test_must_call_passes_on_a_successful_call():
    assert status(MustCall("post_audit_log"), run(llm(), call("post_audit_log"))) == "pass"


def test_must_call_is_not_satisfied_by_a_failed_call():
    verdict = MustCall("post_audit_log")(run(call("post_audit_log", error=FAIL)), {})
    assert verdict.status == "fail"
    assert "all failed" in verdict.detail and verdict.step_index is None


def test_must_call_fails_when_never_called():
    assert status(MustCall("post_audit_log"), run(call("other"))) == "fail"


# --- must_not_call ---------------------------------------------------------------------------


def test_must_not_call_fails_at_the_first_successful_call():
    verdict = MustNotCall("schedule_payment")(run(call("a"), call("schedule_payment"), call("schedule_payment")), {})
    assert (verdict.status, verdict.step_index, verdict.step_name) == ("fail", 1, "schedule_payment")


def test_must_not_call_ignores_a_failed_call_unless_count_failed():
    t = run(call("schedule_payment", error=FAIL))
    assert status(MustNotCall("schedule_payment"), t) == "pass"
    assert status(MustNotCall("schedule_payment", count_failed=True), t) == "fail"


def test_must_not_call_passes_when_never_called():
    assert status(MustNotCall("schedule_payment"), run(call("a"))) == "pass"


# --- ordering --------------------------------------------------------------------------------


def test_ordering_passes_when_a_successful_a_precedes_the_first_b():
    t = run(call("check_vendor_status"), call("schedule_payment"), call("schedule_payment"))
    assert status(Ordering(("check_vendor_status", "schedule_payment")), t) == "pass"


def test_ordering_is_not_licensed_by_a_failed_a():
    t = run(call("check_vendor_status", error=FAIL), call("schedule_payment"))
    verdict = Ordering(("check_vendor_status", "schedule_payment"))(t, {})
    assert (verdict.status, verdict.step_index) == ("fail", 1)
    assert "failed" in verdict.detail


def test_ordering_fails_when_b_comes_before_a_even_if_a_follows():
    t = run(call("schedule_payment"), call("check_vendor_status"), call("schedule_payment"))
    verdict = Ordering(("check_vendor_status", "schedule_payment"))(t, {})
    assert (verdict.status, verdict.step_index) == ("fail", 0)


def test_ordering_checks_every_b_not_only_whether_some_a_exists():
    # B, A, B: the second B is licensed, the first is not; the first decides.
    t = run(call("schedule_payment"), call("check_vendor_status"), call("schedule_payment"))
    assert status(Ordering(("check_vendor_status", "schedule_payment")), t) == "fail"


def test_ordering_is_not_applicable_when_b_never_ran_and_a_failed_b_does_not_count():
    o = Ordering(("check_vendor_status", "schedule_payment"))
    assert status(o, run(call("check_vendor_status"))) == "not_applicable"
    assert status(o, run(call("schedule_payment", error=FAIL))) == "not_applicable"
    assert status(Ordering(("check_vendor_status", "schedule_payment"), count_failed=True), run(call("schedule_payment", error=FAIL))) == "fail"


def test_ordering_chains_longer_lists():
    o = Ordering(("a", "b", "c"))
    assert status(o, run(call("a"), call("b"), call("c"))) == "pass"
    assert status(o, run(call("a"), call("c"), call("b"))) == "fail"


# --- counts ----------------------------------------------------------------------------------


def test_call_at_most_locates_the_call_past_the_limit():
    verdict = CallAtMost("schedule_payment", 1)(run(call("schedule_payment"), call("x"), call("schedule_payment")), {})
    assert (verdict.status, verdict.step_index) == ("fail", 2)
    assert status(CallAtMost("schedule_payment", 1), run(call("schedule_payment"))) == "pass"
    assert status(CallAtMost("schedule_payment", 1), run()) == "pass"


def test_call_at_most_does_not_count_a_failed_retry():
    t = run(call("schedule_payment", error=FAIL), call("schedule_payment"))
    assert status(CallAtMost("schedule_payment", 1), t) == "pass"
    assert status(CallAtMost("schedule_payment", 1, count_failed=True), t) == "fail"


def test_call_at_least_never_counts_failed_calls():
    t = run(call("lookup"), call("lookup", error=FAIL))
    assert status(CallAtLeast("lookup", 2), t) == "fail"
    assert status(CallAtLeast("lookup", 1), t) == "pass"


# --- arg_equals ------------------------------------------------------------------------------


def test_arg_equals_from_context_with_a_tolerance():
    check = ArgEquals("schedule_payment", "amount", from_context="payable_amount", rule=Rule("number", tolerance=0.005))
    ctx = {"payable_amount": "4820.00"}
    assert status(check, run(call("schedule_payment", {"amount": 4820.004})), ctx) == "pass"
    verdict = check(run(call("schedule_payment", {"amount": 48200.0})), ctx)
    assert verdict.status == "fail" and "10× too large" in verdict.detail and verdict.step_index == 0


def test_arg_equals_with_a_literal_value_and_identifiers():
    check = ArgEquals("flag_exception", "reason_code", value="PRICE_VARIANCE", rule=Rule("identifier"))
    assert status(check, run(call("flag_exception", {"reason_code": " price_variance"}))) == "pass"
    assert status(check, run(call("flag_exception", {"reason_code": "DUPLICATE"}))) == "fail"


def test_arg_equals_is_not_applicable_when_the_tool_never_succeeded():
    check = ArgEquals("schedule_payment", "amount", value=10)
    assert status(check, run(call("other"))) == "not_applicable"
    assert status(check, run(call("schedule_payment", {"amount": 99}, error=FAIL))) == "not_applicable"


def test_arg_equals_ignores_failed_calls_and_checks_every_successful_one():
    check = ArgEquals("schedule_payment", "amount", value=10)
    t = run(call("schedule_payment", {"amount": 99}, error=FAIL), call("schedule_payment", {"amount": 10}))
    assert status(check, t) == "pass"
    t2 = run(call("schedule_payment", {"amount": 10}), call("schedule_payment", {"amount": 11}))
    assert check(t2, {}).step_index == 1


def test_arg_equals_without_ground_truth_or_captured_arguments_is_not_applicable():
    check = ArgEquals("schedule_payment", "amount", from_context="payable_amount")
    assert status(check, run(call("schedule_payment", {"amount": 1})), {}) == "not_applicable"
    assert status(check, run(call("schedule_payment", None)), {"payable_amount": 1}) == "fail"  # {} args: called without
    uncaptured = run(call("schedule_payment", "__REDACTED__"))
    assert status(check, uncaptured, {"payable_amount": 1}) == "not_applicable"


def test_arg_equals_fails_a_call_without_the_argument():
    verdict = ArgEquals("schedule_payment", "amount", value=1)(run(call("schedule_payment", {"amt": 1})), {})
    assert verdict.status == "fail" and "without amount" in verdict.detail


def test_arguments_given_as_a_json_string_are_read():
    check = ArgEquals("schedule_payment", "amount", value=10)
    assert status(check, run(call("schedule_payment", '{"amount": 10}'))) == "pass"


# --- arg_satisfies ---------------------------------------------------------------------------


def _authority(value, step, trajectory, context):
    return value in context.get("allowed_roles", [])


def test_arg_satisfies_uses_the_named_predicate():
    check = ArgSatisfies("request_approval", "approver_role", "approver_has_authority", _authority)
    ctx = {"allowed_roles": ["controller", "cfo"]}
    assert status(check, run(call("request_approval", {"approver_role": "cfo"})), ctx) == "pass"
    verdict = check(run(call("request_approval", {"approver_role": "clerk"})), ctx)
    assert verdict.status == "fail" and "approver_has_authority" in verdict.detail
    assert status(check, run(call("other")), ctx) == "not_applicable"


def test_a_predicate_that_raises_is_an_evaluation_error_not_a_verdict():
    def broken(value, step, trajectory, context):
        raise KeyError("band")

    verdict = ArgSatisfies("request_approval", "approver_role", "broken", broken)(
        run(call("request_approval", {"approver_role": "cfo"})), {}
    )
    assert verdict.status == "not_applicable" and "KeyError" in (verdict.error or "")


# --- arg_matches_result ----------------------------------------------------------------------


def _paid(amount, payable=4820.0, **kw):
    return run(
        call("calculate_payable_amount", {"invoice_id": "INV-1"}, result={"payable_amount": payable}, **kw),
        call("schedule_payment", {"amount": amount}),
    )


def test_arg_matches_result_compares_with_the_earlier_result():
    check = ArgMatchesResult("schedule_payment", "amount", "calculate_payable_amount", "payable_amount", Rule("number", tolerance=0.005))
    assert status(check, _paid(4820.0)) == "pass"
    verdict = check(_paid(48200.0), {})
    assert verdict.status == "fail" and "10× too large" in verdict.detail


def test_arg_matches_result_needs_a_successful_earlier_result():
    check = ArgMatchesResult("schedule_payment", "amount", "calculate_payable_amount", "payable_amount")
    assert status(check, _paid(4820.0, error=FAIL)) == "fail"
    assert status(check, run(call("schedule_payment", {"amount": 1}), call("calculate_payable_amount", result={"payable_amount": 1}))) == "fail"
    assert status(check, run(call("other"))) == "not_applicable"


def test_arg_matches_result_uses_the_latest_earlier_result_and_reads_json_results():
    check = ArgMatchesResult("schedule_payment", "amount", "calculate_payable_amount", "payable_amount")
    t = run(
        call("calculate_payable_amount", result='{"payable_amount": 1}'),
        call("calculate_payable_amount", result='{"payable_amount": 2}'),
        call("schedule_payment", {"amount": 2}),
    )
    assert status(check, t) == "pass"


def test_arg_matches_result_with_an_uncaptured_result_is_not_applicable():
    check = ArgMatchesResult("schedule_payment", "amount", "calculate_payable_amount", "payable_amount")
    t = run(call("calculate_payable_amount", result=None), call("schedule_payment", {"amount": 2}))
    assert status(check, t) == "not_applicable"


# --- declared invariants, conditions, python form --------------------------------------------


def test_when_gates_applicability_on_the_task_context():
    inv = invariant("AP-NO-PAY-HELD", MustNotCall("schedule_payment"), when={"expected_action": {"in": ["hold", "apply_credit"]}})
    paid = run(call("schedule_payment"))
    assert inv(paid, {"expected_action": "hold"}).status == "fail"
    assert inv(paid, {"expected_action": "pay"}).status == "not_applicable"
    assert inv(paid, {}).status == "not_applicable"


def test_when_not_and_equality_and_run_attributes():
    inv = invariant("X", MustCall("a"), when={"expected_action": {"not": "pay"}})
    assert inv(run(), {"expected_action": "hold"}).status == "fail"
    assert inv(run(), {"expected_action": "PAY"}).status == "not_applicable"
    under_fault = invariant("Y", MustCall("a"), when={"plumbline.perturbation": "tool_fault"})
    assert under_fault(run(plumbline__perturbation="tool_fault"), {}).status == "fail"
    assert under_fault(run(), {}).status == "not_applicable"


def test_a_plain_function_is_an_invariant_via_the_decorator():
    @invariant("no-llm-after-pay", severity="major")
    def no_llm_after_pay(trajectory, context):
        return Verdict.ok()

    spec = Spec.of("x", [no_llm_after_pay])
    assert spec.evaluate(run())[0][1].status == "pass"
    assert spec.canonical()["invariants"][0]["python"]["ref"].endswith("no_llm_after_pay")
