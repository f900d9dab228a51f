"""Ground truth of every accounts_payable task, pinned; and the grader on real end states.

The table below is hard-coded on purpose: ground truth is derived by the tools from the data, so
this table is what catches drift in either. If a change to the data or a tool moves a row, the
failure names the task; update the table only when the new outcome is the intended one.
"""

from __future__ import annotations

import pytest

from domains.accounts_payable import call_tool, open_system_of_record
from domains.accounts_payable.ground_truth import context_for, expected_outcome, grade
from domains.accounts_payable.reason_codes import REASON_PRIORITY
from domains.accounts_payable.tasks import TASKS

# task: (action, amount, currency, approver role, primary reason code, credit target)
PINNED = {
    "INV-1001": ("pay", 2909.88, "GBP", "ap_clerk", None, None),
    "INV-1002": ("pay", 12660.00, "GBP", "controller", None, None),
    "INV-1003": ("pay", 43197.00, "GBP", "finance_director", None, None),
    "INV-1004": ("pay", 124831.00, "GBP", "cfo", None, None),
    "INV-1005": ("pay", 28500.00, "EUR", "controller", None, None),
    "INV-1006": ("pay", 12106.80, "GBP", "controller", None, None),
    "INV-1007": ("hold", None, None, None, "PRICE_VARIANCE", None),
    "INV-1008": ("hold", None, None, None, "DUPLICATE_INVOICE", None),
    "INV-1009": ("hold", None, None, None, "DUPLICATE_INVOICE", None),
    "INV-1010": ("hold", None, None, None, "DUPLICATE_INVOICE", None),
    "INV-1011": ("hold", None, None, None, "FX_VARIANCE", None),
    "INV-1012": ("hold", None, None, None, "TAX_CODE_MISMATCH", None),
    "INV-1013": ("apply_credit", 504.00, "GBP", None, None, "INV-0905"),
    "INV-1014": ("hold", None, None, None, "DUPLICATE_VENDOR", None),
    "INV-1015": ("hold", None, None, None, "VENDOR_SANCTIONED", None),
    "INV-1016": ("hold", None, None, None, "VENDOR_HOLD", None),
    "INV-1017": ("hold", None, None, None, "PO_EXPIRED", None),
    "INV-1018": ("hold", None, None, None, "INVOICE_BEFORE_PO", None),
    "INV-1019": ("hold", None, None, None, "UNAUTHORISED_FREIGHT", None),
    "INV-1020": ("hold", None, None, None, "NO_PO", None),
    "INV-1021": ("hold", None, None, None, "QTY_OVER_RECEIVED", None),
    "INV-1022": ("hold", None, None, None, "PO_CLOSED", None),
}

# Secondary blockers some holds carry, so the priority order is exercised, not just listed.
PINNED_ALL_CODES = {
    "INV-1014": ("DUPLICATE_VENDOR", "UNKNOWN_ITEM"),
    "INV-1015": ("VENDOR_SANCTIONED", "NO_PO"),
    "INV-1016": ("VENDOR_HOLD", "QTY_OVER_ORDERED"),
    "INV-1018": ("INVOICE_BEFORE_PO", "NOT_RECEIVED"),
    "INV-1021": ("QTY_OVER_RECEIVED", "PRICE_VARIANCE"),
}


def test_pinned_table_covers_exactly_the_tasks():
    assert sorted(PINNED) == sorted(t.task_id for t in TASKS)


@pytest.mark.parametrize("task_id", sorted(PINNED))
def test_expected_outcome_matches_the_pinned_table(task_id):
    o = expected_outcome(task_id)
    amount = o.credit_amount if o.action == "apply_credit" else o.payable_amount
    got = (o.action, amount, o.currency, o.approver_role, o.primary_reason_code, o.credit_target)
    assert got == PINNED[task_id]


@pytest.mark.parametrize("task_id", sorted(PINNED_ALL_CODES))
def test_holds_with_several_blockers_pick_the_highest_priority_code(task_id):
    o = expected_outcome(task_id)
    assert o.reason_codes == PINNED_ALL_CODES[task_id]
    assert o.primary_reason_code == o.reason_codes[0]


def test_the_tasks_cover_the_exception_classes():
    outcomes = [expected_outcome(t.task_id) for t in TASKS]
    assert [o.action for o in outcomes].count("pay") == 6
    assert [o.action for o in outcomes].count("apply_credit") == 1
    assert len({o.primary_reason_code for o in outcomes if o.action == "hold"}) == 13
    assert {o.band for o in outcomes if o.action == "pay"} == {"A", "B", "C", "D"}
    duplicates = sorted(o.duplicate_confidence for o in outcomes if o.primary_reason_code == "DUPLICATE_INVOICE")
    assert duplicates == [0.7, 0.9, 1.0]


def test_every_hold_has_exactly_one_primary_code_and_every_other_outcome_none():
    for t in TASKS:
        o = expected_outcome(t.task_id)
        if o.action == "hold":
            assert o.primary_reason_code in REASON_PRIORITY and o.approver_role is None
        else:
            assert o.primary_reason_code is None and o.reason_codes == ()


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
def test_task_labels_agree_with_the_derived_outcome(task):
    o = expected_outcome(task.task_id)
    label = task.exception_class
    if label.startswith("clean") or label == "price_variance_commodity_within_tolerance":
        assert o.action == "pay"
        if label.startswith("clean_band_"):
            assert o.band == label[-1].upper()
    elif label == "credit_note":
        assert o.action == "apply_credit"
    else:
        expected = {
            "price_variance_services": "PRICE_VARIANCE", "duplicate_exact": "DUPLICATE_INVOICE",
            "duplicate_same_number": "DUPLICATE_INVOICE", "duplicate_same_amount_and_po": "DUPLICATE_INVOICE",
            "fx_variance": "FX_VARIANCE", "tax_code_mismatch": "TAX_CODE_MISMATCH",
            "duplicate_vendor": "DUPLICATE_VENDOR", "sanctioned_vendor": "VENDOR_SANCTIONED",
            "vendor_on_hold": "VENDOR_HOLD", "po_expired": "PO_EXPIRED", "invoice_before_po": "INVOICE_BEFORE_PO",
            "unauthorised_freight": "UNAUTHORISED_FREIGHT", "no_po": "NO_PO",
            "qty_over_received": "QTY_OVER_RECEIVED", "po_closed": "PO_CLOSED",
        }[label]
        assert (o.action, o.primary_reason_code) == ("hold", expected)


def test_task_requests_name_the_document_and_the_vendor_on_record(sor):
    for t in TASKS:
        doc = call_tool(sor, "get_invoice", {"invoice_id": t.task_id})
        assert doc["status"] == "received"
        assert t.vendor_name == doc["vendor_name"]
        assert t.request == f"Please process invoice {t.task_id} from {t.vendor_name}."


def test_context_carries_the_ground_truth_the_invariants_read():
    ctx = context_for("INV-1005")
    assert ctx["known_task"] is True
    assert (ctx["expected_action"], ctx["payable_amount"], ctx["currency"]) == ("pay", 28500.0, "EUR")
    assert (ctx["approver_role"], ctx["band"], ctx["approval_amount_gbp"]) == ("controller", "B", 23940.0)
    assert ctx["invoice_id"] == "INV-1005" and ctx["document_type"] == "invoice"
    assert "primary_reason_code" not in ctx  # no ground truth there: the invariant does not apply


def test_context_of_a_hold_and_a_credit_note():
    held = context_for("INV-1015")
    assert (held["expected_action"], held["primary_reason_code"]) == ("hold", "VENDOR_SANCTIONED")
    assert held["reason_codes"] == ["VENDOR_SANCTIONED", "NO_PO"]
    assert "payable_amount" not in held and "approver_role" not in held
    credit = context_for("INV-1013")
    assert (credit["expected_action"], credit["credit_target"], credit["credit_amount"]) == ("apply_credit", "INV-0905", 504.0)
    assert credit["document_type"] == "credit_note"


def test_context_finds_the_task_inside_a_longer_key_and_ignores_unknown_keys():
    assert context_for(" ap/inv-1007/paraphrase ")["task_id"] == "INV-1007"
    assert context_for("INV-0905") == {"known_task": False, "task_key": "INV-0905"}
    assert context_for("session-42")["known_task"] is False


def test_expected_outcome_of_an_unknown_task_is_a_key_error():
    with pytest.raises(KeyError, match="unknown task"):
        expected_outcome("INV-9999")


@pytest.mark.parametrize("task_id", sorted(PINNED))
def test_a_run_that_follows_the_policy_grades_as_passed(task_id, policy_run):
    with open_system_of_record() as sor:
        policy_run(sor, task_id)
        result = grade(sor, task_id)
    assert result.passed, result.problems
    assert result.observed_action == PINNED[task_id][0]


def test_grade_reports_a_wrong_amount_and_a_missing_approval(sor):
    call_tool(sor, "schedule_payment", {"invoice_id": "INV-1006", "amount": 12260.0, "currency": "GBP"})
    result = grade(sor, "INV-1006")
    assert not result.passed
    assert "paid 12260.00 GBP, expected 12106.80 GBP" in result.problems
    assert any("no approval with authority" in p for p in result.problems)


def test_grade_rejects_an_approval_by_a_role_without_authority_for_the_real_amount(sor):
    # The agent understated the amount, so the tool accepted an ap_clerk approval.
    call_tool(sor, "request_approval", {"invoice_id": "INV-1006", "approver_role": "ap_clerk", "amount": 1000.0,
                                        "currency": "GBP"})
    call_tool(sor, "schedule_payment", {"invoice_id": "INV-1006", "amount": 12106.8, "currency": "GBP"})
    assert any("band B needs controller" in p for p in grade(sor, "INV-1006").problems)


def test_grade_reports_a_paid_hold_a_second_code_and_work_on_other_documents(sor):
    call_tool(sor, "flag_exception", {"invoice_id": "INV-1021", "reason_code": "PRICE_VARIANCE", "note": "lids"})
    call_tool(sor, "flag_exception", {"invoice_id": "INV-1021", "reason_code": "QTY_OVER_RECEIVED", "note": "cups"})
    call_tool(sor, "schedule_payment", {"invoice_id": "INV-1021", "amount": 3003.1, "currency": "GBP"})
    call_tool(sor, "post_audit_log", {"invoice_id": "INV-1001", "action": "viewed"})
    result = grade(sor, "INV-1021")
    assert result.observed_action == "mixed"
    assert result.problems == (
        "changed other documents: INV-1001",
        "paid a document that should be held under QTY_OVER_RECEIVED",
        "flagged PRICE_VARIANCE, QTY_OVER_RECEIVED; expected exactly QTY_OVER_RECEIVED",
    )


def test_grade_of_a_credit_note_checks_target_and_amount(sor):
    call_tool(sor, "apply_credit_note", {"credit_note_id": "INV-1013", "against_invoice_id": "INV-0901",
                                         "amount": 504.0})
    assert grade(sor, "INV-1013").problems == ("applied 504.00 against INV-0901, expected 504.00 against INV-0905",)


def test_grade_of_an_untouched_document_says_nothing_happened(sor):
    result = grade(sor, "INV-1020")
    assert result.observed_action == "none"
    assert result.problems == ("not flagged; expected a hold under NO_PO",)
    assert result.export()["expected"]["primary_reason_code"] == "NO_PO"
