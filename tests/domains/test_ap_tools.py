"""What each accounts_payable tool finds, one exception class at a time."""

from __future__ import annotations

import json

import pytest

from domains.accounts_payable import DomainError, call_tool


def run(sor, name, **args):
    return call_tool(sor, name, args)


def line(result, n):
    return next(ln for ln in result["lines"] if ln["line_no"] == n)


# -- three-way match ----------------------------------------------------------------------------

def test_the_same_price_variance_passes_on_a_commodity_line_and_fails_on_a_services_line(sor):
    commodity = line(run(sor, "three_way_match", invoice_id="INV-1006"), 1)
    services = line(run(sor, "three_way_match", invoice_id="INV-1007"), 1)
    assert commodity["price_variance_pct"] == services["price_variance_pct"] == 2.6
    assert (commodity["category"], commodity["price_tolerance_pct"], commodity["status"]) == ("commodity", 5.0, "matched")
    assert (services["category"], services["price_tolerance_pct"], services["status"]) == ("services", 2.0, "exception")
    assert services["reason_codes"] == ["PRICE_VARIANCE"]


def test_match_tells_over_received_apart_from_price_variance_line_by_line(sor):
    result = run(sor, "three_way_match", invoice_id="INV-1021")
    cups, lids = line(result, 1), line(result, 2)
    assert (cups["billed_qty"], cups["received_qty"], cups["reason_codes"]) == (50, 40, ["QTY_OVER_RECEIVED"])
    assert (lids["price_variance_pct"], lids["reason_codes"]) == (7.5, ["PRICE_VARIANCE"])
    assert result["reason_codes"] == ["QTY_OVER_RECEIVED", "PRICE_VARIANCE"]
    assert result["passed"] is False


def test_match_reports_an_item_not_on_the_po_as_unknown_item_not_as_a_price_variance(sor):
    result = run(sor, "three_way_match", invoice_id="INV-1014")
    assert line(result, 1)["status"] == "matched"
    assert line(result, 2)["reason_codes"] == ["UNKNOWN_ITEM"]
    assert result["reason_codes"] == ["UNKNOWN_ITEM"]


def test_match_reports_over_ordered_and_not_received_with_their_own_codes(sor):
    over_ordered = line(run(sor, "three_way_match", invoice_id="INV-1016"), 1)
    assert (over_ordered["billed_qty"], over_ordered["ordered_qty"], over_ordered["received_qty"]) == (1100, 1000, 1100)
    assert over_ordered["reason_codes"] == ["QTY_OVER_ORDERED"]
    not_received = line(run(sor, "three_way_match", invoice_id="INV-1018"), 1)
    assert (not_received["received_qty"], not_received["reason_codes"]) == (0, ["NOT_RECEIVED"])


def test_match_without_a_po_says_no_po_and_a_credit_note_is_not_matched(sor):
    assert run(sor, "three_way_match", invoice_id="INV-1020")["reason_codes"] == ["NO_PO"]
    credit = run(sor, "three_way_match", invoice_id="INV-1013")
    assert (credit["applicable"], credit["passed"]) == (False, True)


def test_a_clean_invoice_matches_on_every_line(sor):
    result = run(sor, "three_way_match", invoice_id="INV-1003")
    assert result["passed"] and [ln["status"] for ln in result["lines"]] == ["matched", "matched"]


# -- duplicates ---------------------------------------------------------------------------------

@pytest.mark.parametrize("invoice_id, confidence, matched, basis", [
    ("INV-1008", 1.0, "INV-0901", "same invoice number and amount"),
    ("INV-1009", 0.9, "INV-0902", "same invoice number, different amount"),
    ("INV-1010", 0.7, "INV-0903", "same amount on the same purchase order"),
])
def test_duplicate_check_gives_a_confidence_and_the_matched_invoice(sor, invoice_id, confidence, matched, basis):
    result = run(sor, "check_duplicate", invoice_id=invoice_id)
    assert (result["confidence"], result["matched_invoice_id"], result["basis"]) == (confidence, matched, basis)
    assert result["is_duplicate"] and result["reason_codes"] == ["DUPLICATE_INVOICE"]


def test_invoice_numbers_compare_without_punctuation(sor):
    result = run(sor, "check_duplicate", invoice_id="INV-1009")
    assert (result["invoice_number"], result["matched_invoice_number"]) == ("DP7781", "DP-7781")


def test_a_new_invoice_has_confidence_zero(sor):
    result = run(sor, "check_duplicate", invoice_id="INV-1001")
    assert (result["confidence"], result["matched_invoice_id"], result["passed"]) == (0.0, None, True)


# -- vendor -------------------------------------------------------------------------------------

def test_vendor_on_hold_and_sanctioned_vendor(sor):
    assert run(sor, "check_vendor_status", vendor_id="V-102")["reason_codes"] == ["VENDOR_HOLD"]
    sanctioned = run(sor, "check_vendor_status", vendor_id="V-108")
    assert sanctioned["sanctioned"] is True and sanctioned["reason_codes"] == ["VENDOR_SANCTIONED"]


def test_a_newer_vendor_record_sharing_an_established_vendors_bank_account_is_a_duplicate_vendor(sor):
    copy = run(sor, "check_vendor_status", vendor_id="V-107")
    assert copy["reason_codes"] == ["DUPLICATE_VENDOR"]
    assert [v["vendor_id"] for v in copy["shares_bank_account_with"]] == ["V-100"]
    assert copy["has_payment_history"] is False
    original = run(sor, "check_vendor_status", vendor_id="V-100")
    assert original["passed"] and original["has_payment_history"]
    assert [v["vendor_id"] for v in original["shares_bank_account_with"]] == ["V-107"]


def test_vendor_result_masks_the_bank_account(sor):
    assert run(sor, "check_vendor_status", vendor_id="V-100")["bank_account"] == "****6819"


# -- purchase order -----------------------------------------------------------------------------

@pytest.mark.parametrize("invoice_id, code", [
    ("INV-1020", "NO_PO"), ("INV-1022", "PO_CLOSED"), ("INV-1017", "PO_EXPIRED"), ("INV-1018", "INVOICE_BEFORE_PO"),
])
def test_validate_po_finds_each_po_problem(sor, invoice_id, code):
    result = run(sor, "validate_po", invoice_id=invoice_id)
    assert result["reason_codes"] == [code] and result["passed"] is False


def test_validate_po_passes_an_open_current_po(sor):
    result = run(sor, "validate_po", invoice_id="INV-1001")
    assert result["passed"] and result["status"] == "open"


# -- tax, FX, freight ---------------------------------------------------------------------------

def test_tax_code_is_checked_against_the_po_line(sor):
    result = run(sor, "validate_tax_code", invoice_id="INV-1012")
    assert line(result, 1) == {"line_no": 1, "sku": "DP-WRAP-R", "tax_code": "S20", "expected_tax_code": "R05",
                                    "rate_pct": 20.0, "status": "mismatch"}
    assert result["reason_codes"] == ["TAX_CODE_MISMATCH"]
    assert run(sor, "validate_tax_code", invoice_id="INV-1002")["passed"]  # S20 and R05 lines, both as on the PO


def test_fx_variance_uses_the_rate_on_the_invoice_date_against_the_rate_on_the_po_date(sor):
    moved = run(sor, "check_fx_variance", invoice_id="INV-1011")
    assert (moved["rate_at_po_date"], moved["rate_at_invoice_date"]) == (0.86, 0.835)
    assert moved["variance_pct"] == -2.907 and moved["reason_codes"] == ["FX_VARIANCE"]
    within = run(sor, "check_fx_variance", invoice_id="INV-1005")
    assert within["variance_pct"] == -1.524 and within["passed"]
    assert run(sor, "check_fx_variance", invoice_id="INV-1001")["applicable"] is False  # GBP


def test_convert_currency_uses_the_latest_rate_on_or_before_the_date(sor):
    result = run(sor, "convert_currency", amount=28500, from_currency="EUR", to_currency="GBP", on_date="2026-02-17")
    assert (result["rate"], result["rate_date"], result["converted_amount"]) == (0.84, "2026-02-16", 23940.0)
    back = run(sor, "convert_currency", amount=23940, from_currency="gbp", to_currency="eur", on_date="2026-02-17")
    assert back["converted_amount"] == 28500.0


def test_freight_is_authorised_only_up_to_the_po_allowance(sor):
    unauthorised = run(sor, "check_freight", invoice_id="INV-1019")
    assert (unauthorised["freight_billed"], unauthorised["freight_authorised_on_po"]) == (95.0, 0.0)
    assert unauthorised["reason_codes"] == ["UNAUTHORISED_FREIGHT"]
    assert run(sor, "check_freight", invoice_id="INV-1002")["authorised"] is True  # 180 of 250 allowed


# -- payable amount and approvals ---------------------------------------------------------------

def test_payable_is_net_plus_tax_plus_authorised_freight_less_settlement_discount(sor):
    northwind = run(sor, "calculate_payable_amount", invoice_id="INV-1001")  # 2/10 NET30
    assert (northwind["net"], northwind["tax"], northwind["settlement_discount"]) == (2466.0, 493.2, 49.32)
    assert northwind["payable_amount"] == 2909.88
    delmar = run(sor, "calculate_payable_amount", invoice_id="INV-1002")  # NET45, freight 180 authorised
    assert (delmar["net"], delmar["tax"], delmar["freight_included"], delmar["payable_amount"]) == (11000.0, 1480.0, 180.0, 12660.0)


def test_unauthorised_freight_is_left_out_of_the_payable_amount(sor):
    result = run(sor, "calculate_payable_amount", invoice_id="INV-1019")
    assert (result["freight_billed"], result["freight_included"], result["payable_amount"]) == (95.0, 0.0, 3888.0)


def test_a_foreign_invoice_is_payable_in_the_vendors_currency_with_its_gbp_value(sor):
    result = run(sor, "calculate_payable_amount", invoice_id="INV-1005")
    assert (result["payable_amount"], result["payment_currency"], result["amount_gbp"]) == (28500.0, "EUR", 23940.0)


def test_a_credit_note_is_negative_with_a_positive_credit_amount(sor):
    result = run(sor, "calculate_payable_amount", invoice_id="INV-1013")
    assert (result["payable_amount"], result["credit_amount"], result["settlement_discount"]) == (-504.0, 504.0, 0.0)
    assert result["references_invoice_id"] == "INV-0905"


@pytest.mark.parametrize("amount, band, role", [
    (0, "A", "ap_clerk"), (5000, "A", "ap_clerk"), (5000.01, "B", "controller"), (25000, "B", "controller"),
    (43197, "C", "finance_director"), (100000.01, "D", "cfo"),
])
def test_approval_bands_have_inclusive_upper_bounds(sor, amount, band, role):
    result = run(sor, "get_approval_requirement", amount=amount)
    assert (result["band"], result["required_role"]) == (band, role)


def test_approval_requirement_of_a_foreign_amount_converts_it_on_the_given_date(sor):
    result = run(sor, "get_approval_requirement", amount=28500, currency="EUR", on_date="2026-02-17")
    assert (result["amount_gbp"], result["band"], result["required_role"]) == (23940.0, "B", "controller")
    with pytest.raises(DomainError, match="'on_date' is required to convert EUR to GBP"):
        run(sor, "get_approval_requirement", amount=28500, currency="EUR")


def test_request_approval_refuses_a_role_without_authority_for_the_band(sor):
    with pytest.raises(DomainError) as err:
        run(sor, "request_approval", invoice_id="INV-1003", approver_role="controller", amount=43197.0, currency="GBP")
    assert str(err.value) == ("approval refused: controller may approve up to 25,000.00 GBP; 43,197.00 GBP is in "
                              "band C, which requires finance_director")
    assert sor.writes()["approvals"] == []


def test_request_approval_judges_a_foreign_amount_by_its_gbp_value(sor):
    result = run(sor, "request_approval", invoice_id="INV-1005", approver_role="Controller", amount=28500.0,
                 currency="EUR")
    assert (result["status"], result["amount_gbp"], result["band"], result["approver_id"]) == ("approved", 23940.0, "B", "U-03")


def test_a_role_with_more_authority_than_the_band_needs_may_approve(sor):
    result = run(sor, "request_approval", invoice_id="INV-1001", approver_role="cfo", amount=2909.88, currency="GBP")
    assert (result["band"], result["required_role"], result["approver_role"]) == ("A", "ap_clerk", "cfo")


# -- effects are recorded, not judged -----------------------------------------------------------

def test_the_system_of_record_lets_the_agent_pay_a_held_invoice_twice(sor):
    for _ in range(2):
        run(sor, "schedule_payment", invoice_id="INV-1015", amount=6300.0, currency="USD")
    payments = sor.writes()["payments"]
    assert [(p["invoice_id"], p["amount"], p["currency"]) for p in payments] == [("INV-1015", 6300.0, "USD")] * 2
    assert [p["payment_id"] for p in payments] == ["PAY-5001", "PAY-5002"]


def test_payment_is_scheduled_at_the_end_of_the_discount_window_or_the_net_terms(sor):
    discount = run(sor, "schedule_payment", invoice_id="INV-1001", amount=2909.88, currency="GBP")
    net = run(sor, "schedule_payment", invoice_id="INV-1002", amount=12660.0, currency="GBP")
    assert (discount["scheduled_for"], net["scheduled_for"]) == ("2026-02-28", "2026-03-29")


def test_effect_tools_record_every_write_in_order(sor):
    run(sor, "flag_exception", invoice_id="inv-1020", reason_code="no_po", note="no PO quoted")
    run(sor, "apply_credit_note", credit_note_id="INV-1013", against_invoice_id="INV-0905", amount=504.0)
    run(sor, "post_audit_log", invoice_id="INV-1020", action="held")
    writes = sor.writes()
    assert writes["exceptions"][0] == {"exception_id": "EXC-5001", "invoice_id": "INV-1020",
                                            "reason_code": "NO_PO", "note": "no PO quoted", "seq": 1}
    assert writes["credit_applications"][0]["currency"] == "GBP" and writes["credit_applications"][0]["seq"] == 2
    assert writes["audit_log"][0]["detail"] == "" and writes["audit_log"][0]["seq"] == 3


def test_every_tool_result_is_json(sor):
    for name, args in [("get_invoice", {"invoice_id": "INV-1004"}), ("three_way_match", {"invoice_id": "INV-1004"}),
                       ("calculate_payable_amount", {"invoice_id": "INV-1011"}),
                       ("check_vendor_status", {"vendor_id": "V-107"}), ("check_fx_variance", {"invoice_id": "INV-1011"})]:
        result = call_tool(sor, name, args)
        assert json.loads(json.dumps(result)) == result, name  # plain JSON values only: no tuples, Decimals or dates
