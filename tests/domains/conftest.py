"""Fixtures for the accounts_payable domain tests, and a policy-following reference run.

`follow_policy` does what domains/accounts_payable/policy.md tells an agent to do, with plain
code, and records each call as a `Step`. It is written from the policy, not from
ground_truth.py, so a run that passes the invariants and the grader cross-checks all three.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from domains.accounts_payable import DomainError, SystemOfRecord, call_tool, open_system_of_record
from domains.accounts_payable.reason_codes import in_priority_order
from plumbline_otel.model import Step

INVOICE_CHECKS = ("validate_po", "three_way_match", "check_duplicate", "validate_tax_code",
                  "check_fx_variance", "check_freight")


@pytest.fixture
def sor() -> Iterator[SystemOfRecord]:
    """A fresh system of record, closed after the test."""
    with open_system_of_record() as s:
        yield s


class Recorder:
    """Calls tools on one system of record and keeps the steps, failed calls included."""

    def __init__(self, sor: SystemOfRecord) -> None:
        self.sor = sor
        self.steps: list[Step] = []

    def __call__(self, name: str, **args: Any) -> dict[str, Any]:
        try:
            result = call_tool(self.sor, name, args)
        except DomainError as exc:
            self.steps.append(Step(kind="tool_call", name=name, args=args, error=str(exc)))
            raise
        self.steps.append(Step(kind="tool_call", name=name, args=args, result=result))
        return result


def follow_policy(sor: SystemOfRecord, invoice_id: str) -> list[Step]:
    """Process one document exactly as the policy says; returns the steps."""
    call = Recorder(sor)
    doc = call("get_invoice", invoice_id=invoice_id)
    found = [call("check_vendor_status", vendor_id=doc["vendor_id"])]
    checks = INVOICE_CHECKS if doc["document_type"] == "invoice" else ("check_duplicate",)
    found += [call(name, invoice_id=invoice_id) for name in checks]
    codes = in_priority_order(c for f in found for c in f["reason_codes"])
    if codes:
        call("flag_exception", invoice_id=invoice_id, reason_code=codes[0], note=f"also: {codes[1:]}")
        call("post_audit_log", invoice_id=invoice_id, action="held", detail=codes[0])
        return call.steps
    payable = call("calculate_payable_amount", invoice_id=invoice_id)
    if doc["document_type"] == "credit_note":
        call("apply_credit_note", credit_note_id=invoice_id, against_invoice_id=doc["references_invoice_id"],
             amount=payable["credit_amount"])
        call("post_audit_log", invoice_id=invoice_id, action="credit_applied", detail="")
        return call.steps
    amount, currency = payable["payable_amount"], payable["payment_currency"]
    extra = {} if currency == "GBP" else {"on_date": doc["invoice_date"]}
    need = call("get_approval_requirement", amount=amount, currency=currency, **extra)
    call("request_approval", invoice_id=invoice_id, approver_role=need["required_role"], amount=amount,
         currency=currency)
    call("schedule_payment", invoice_id=invoice_id, amount=amount, currency=currency)
    call("post_audit_log", invoice_id=invoice_id, action="paid", detail=f"{amount} {currency}")
    return call.steps


@pytest.fixture
def recorder(sor: SystemOfRecord) -> Recorder:
    """A step recorder on the test's fresh system of record."""
    return Recorder(sor)


@pytest.fixture
def policy_run():
    """`policy_run(sor, invoice_id) -> steps`: the policy-following reference run."""
    return follow_policy
