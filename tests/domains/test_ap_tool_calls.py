"""Calling accounts_payable tools: specs, argument checking, readable refusals, fresh copies."""

from __future__ import annotations

import threading

import pytest

from domains.accounts_payable import (
    TOOLS,
    DomainError,
    TransientToolError,
    call_tool,
    open_system_of_record,
    tool_specs,
)
from domains.accounts_payable.tools import Tool

EFFECT_TOOLS = {"request_approval", "schedule_payment", "apply_credit_note", "flag_exception", "post_audit_log"}


def test_sixteen_tools_and_exactly_the_five_effect_tools_change_the_world():
    assert len(TOOLS) == 16
    assert {n for n, t in TOOLS.items() if t.effect} == EFFECT_TOOLS
    assert all(isinstance(t, Tool) and t.name == n for n, t in TOOLS.items())


def test_tool_specs_are_in_the_anthropic_tools_format():
    specs = tool_specs()
    assert [s["name"] for s in specs] == list(TOOLS)
    for spec in specs:
        assert set(spec) == {"name", "description", "input_schema"}
        schema = spec["input_schema"]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])
        assert spec["description"]
    assert [s["name"] for s in tool_specs(["schedule_payment", "get_invoice"])] == ["schedule_payment", "get_invoice"]


def test_tool_is_frozen():
    with pytest.raises(AttributeError):
        TOOLS["get_invoice"].effect = True  # type: ignore[misc]


@pytest.mark.parametrize("name, args, message", [
    ("fetch_invoice", {"invoice_id": "INV-1001"},
     "unknown tool 'fetch_invoice'; available tools: get_invoice, three_way_match"),
    ("schedule_payment", {"invoice_id": "INV-1001"},
     "schedule_payment: missing required argument 'amount', 'currency'; expected "
     "schedule_payment(invoice_id (string), amount (number), currency (string))"),
    ("schedule_payment", {"invoice_id": "INV-1001", "amount": "2909.88", "currency": "GBP"},
     "schedule_payment: argument 'amount' must be a number, got string '2909.88'"),
    ("schedule_payment", {"invoice_id": "INV-1001", "amount": True, "currency": "GBP"},
     "schedule_payment: argument 'amount' must be a number, got boolean True"),
    ("get_invoice", {"invoice_id": 1001}, "get_invoice: argument 'invoice_id' must be a string, got integer 1001"),
    ("get_invoice", {"invoice_id": "  "}, "get_invoice: argument 'invoice_id' must not be empty"),
    ("get_invoice", {"invoice": "INV-1001"}, "get_invoice: missing required argument 'invoice_id'"),
    ("get_invoice", {"invoice_id": "INV-1001", "verbose": True}, "get_invoice: unexpected argument 'verbose'"),
    ("get_invoice", ["INV-1001"], "get_invoice: arguments must be a JSON object, got list"),
])
def test_malformed_calls_raise_domain_errors_that_say_what_to_fix(sor, name, args, message):
    with pytest.raises(DomainError) as err:
        call_tool(sor, name, args)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("name, args, message", [
    ("get_invoice", {"invoice_id": "NW-40388"}, "'NW-40388' is the vendor's own invoice number of INV-1001"),
    ("get_invoice", {"invoice_id": "INV-9999"}, "no invoice or credit note with invoice_id='INV-9999'"),
    ("check_vendor_status", {"vendor_id": "Northwind"},
     "Vendors with that name: V-100 is Northwind Supplies; V-107 is Northwind Supply Co."),
    ("schedule_payment", {"invoice_id": "INV-1001", "amount": -5, "currency": "GBP"}, "argument 'amount' must be positive"),
    ("schedule_payment", {"invoice_id": "INV-1001", "amount": 2909.875, "currency": "GBP"},
     "argument 'amount' must have at most two decimal places"),
    ("schedule_payment", {"invoice_id": "INV-1001", "amount": 10, "currency": "XYZ"},
     "unknown currency 'XYZ'; known currencies: EUR, GBP, USD"),
    ("flag_exception", {"invoice_id": "INV-1007", "reason_code": "PRICE", "note": "x"},
     "unknown reason_code 'PRICE'; valid codes, highest priority first: VENDOR_SANCTIONED, DUPLICATE_INVOICE"),
    ("request_approval", {"invoice_id": "INV-1001", "approver_role": "manager", "amount": 10.0, "currency": "GBP"},
     "unknown approver role 'manager'; roles: ap_clerk (up to 5,000.00 GBP), controller"),
    ("apply_credit_note", {"credit_note_id": "INV-1001", "against_invoice_id": "INV-0905", "amount": 10.0},
     "INV-1001 is an invoice, not a credit note"),
    ("convert_currency", {"amount": 1, "from_currency": "EUR", "to_currency": "GBP", "on_date": "17/02/2026"},
     "argument 'on_date' must be a date as YYYY-MM-DD, got '17/02/2026'"),
    ("convert_currency", {"amount": 1, "from_currency": "EUR", "to_currency": "GBP", "on_date": "1999-01-01"},
     "no EUR rate published on or before 1999-01-01"),
])
def test_refused_calls_explain_themselves(sor, name, args, message):
    with pytest.raises(DomainError) as err:
        call_tool(sor, name, args)
    assert message in str(err.value)
    assert sor.writes() == {t: [] for t in sor.writes()}


def test_ids_are_trimmed_and_case_insensitive_and_null_optionals_are_dropped(sor):
    assert call_tool(sor, "get_invoice", {"invoice_id": " inv-1001 "})["invoice_id"] == "INV-1001"
    result = call_tool(sor, "get_approval_requirement", {"amount": 100, "currency": None, "on_date": None})
    assert result["currency"] == "GBP"


def test_transient_errors_are_domain_errors_with_a_kind():
    err = TransientToolError("503")
    assert isinstance(err, DomainError) and err.kind == "503"
    assert "retry" in str(err)
    assert TransientToolError("timeout", "gateway timeout").args == ("gateway timeout",)
    with pytest.raises(ValueError, match="unknown transient fault kind"):
        TransientToolError("500")


def test_fresh_copies_do_not_see_each_others_writes():
    a, b = open_system_of_record(), open_system_of_record()
    try:
        call_tool(a, "schedule_payment", {"invoice_id": "INV-1001", "amount": 2909.88, "currency": "GBP"})
        call_tool(a, "flag_exception", {"invoice_id": "INV-1020", "reason_code": "NO_PO", "note": "x"})
        assert len(a.writes()["payments"]) == 1
        assert b.writes() == {t: [] for t in a.writes()}
        c = open_system_of_record()
        assert c.writes()["payments"] == [] and len(c.writes(include_history=True)["payments"]) == 6
        c.close()
    finally:
        a.close()
        b.close()


def test_a_new_copy_after_a_closed_one_starts_clean_and_ids_restart():
    with open_system_of_record() as first:
        call_tool(first, "post_audit_log", {"invoice_id": "INV-1001", "action": "viewed"})
    with pytest.raises(RuntimeError, match="closed"):
        first.writes()
    with open_system_of_record() as second:
        entry = call_tool(second, "post_audit_log", {"invoice_id": "INV-1001", "action": "viewed"})
    assert entry["entry_id"] == "AUD-5001" and entry["seq"] == 1


def test_closing_a_copy_drops_its_schema(sor):
    other = open_system_of_record()
    schema = other.schema
    other.close()
    other.close()  # idempotent
    assert sor.scalar("SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?", [schema]) == 0


def test_copies_used_from_several_threads_stay_isolated():
    errors: list[BaseException] = []

    def trial(k: int) -> None:
        try:
            with open_system_of_record() as sor:
                for _ in range(k):
                    call_tool(sor, "post_audit_log", {"invoice_id": "INV-1001", "action": f"t{k}"})
                entries = sor.writes()["audit_log"]
                assert [e["action"] for e in entries] == [f"t{k}"] * k
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=trial, args=(k,)) for k in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_memoised_reference_queries_refuse_write_tables(sor):
    with pytest.raises(ValueError, match="reference tables only"):
        sor.reference("SELECT * FROM payments")
    first = sor.reference("SELECT * FROM vendors WHERE vendor_id = ?", ["V-100"])
    first[0]["name"] = "changed by a caller"
    assert sor.reference("SELECT * FROM vendors WHERE vendor_id = ?", ["V-100"])[0]["name"] == "Northwind Supplies"


def test_the_package_exports_what_it_lists():
    import domains.accounts_payable as ap

    assert all(hasattr(ap, name) for name in ap.__all__)
    assert ap.POLICY_PATH.is_file()
