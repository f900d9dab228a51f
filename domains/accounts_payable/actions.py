"""The effect tools: the only calls that change the system of record.

They refuse only what the system itself could not record: an unknown document or currency, a
non-positive or sub-penny amount, an unknown reason code, an approver role without authority for
the amount. They do NOT enforce the policy: paying a held invoice, paying twice or paying the
wrong amount is recorded as asked, so the invariants and the grader can see the agent do it.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from domains.accounts_payable import ledger as L
from domains.accounts_payable.checks import approval_band
from domains.accounts_payable.errors import DomainError
from domains.accounts_payable.reason_codes import REASON_CODES, REASON_PRIORITY
from domains.accounts_payable.system_of_record import SystemOfRecord

Args = dict[str, Any]


def _amount(value: float, arg: str = "amount") -> Decimal:
    amount = Decimal(str(value))
    if amount <= 0:
        raise DomainError(f"argument {arg!r} must be positive, got {value}")
    if amount != L.money(amount):
        raise DomainError(f"argument {arg!r} must have at most two decimal places, got {value}")
    return L.money(amount)


def _currency(sor: SystemOfRecord, value: str) -> str:
    code = L.norm_id(value)
    known = L.currencies(sor)
    if code not in known:
        raise DomainError(f"unknown currency {value!r}; known currencies: {', '.join(known)}")
    return code


def request_approval(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Record an approval by the given role; refused when the role's authority is below the amount."""
    doc = L.invoice(sor, args["invoice_id"])
    role = args["approver_role"].strip().lower()
    roles = sor.reference(
        "SELECT role, max(authority_limit_gbp) AS limit_gbp FROM approvers GROUP BY role ORDER BY limit_gbp"
    )
    limits = {r["role"]: r["limit_gbp"] for r in roles}
    if role not in limits:
        listed = ", ".join(f"{r} (up to {v:,.2f} GBP)" for r, v in limits.items())
        raise DomainError(f"unknown approver role {args['approver_role']!r}; roles: {listed}")
    amount = _amount(args["amount"])
    currency = _currency(sor, args["currency"])
    base = sor.setting("base_currency")
    amount_gbp, _, _ = L.convert(sor, amount, currency, base, doc["invoice_date"])
    band = approval_band(sor, amount_gbp)
    approver = sor.reference_row(
        "SELECT * FROM approvers WHERE role = ? AND authority_limit_gbp >= ? ORDER BY approver_id LIMIT 1",
        [role, amount_gbp],
    )
    if approver is None:
        raise DomainError(
            f"approval refused: {role} may approve up to {limits[role]:,.2f} {base}; {amount_gbp:,.2f} {base} "
            f"is in band {band['band']}, which requires {band['required_role']}"
        )
    row = sor.insert("approvals", {
        "invoice_id": doc["invoice_id"], "approver_id": approver["approver_id"], "approver_role": role,
        "amount": amount, "currency": currency, "amount_gbp": amount_gbp, "band": band["band"],
    })
    return {**row, "status": "approved", "approver_name": approver["name"], "required_role": band["required_role"]}


def schedule_payment(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Schedule a payment to the document's vendor, dated by the vendor's terms."""
    doc = L.invoice(sor, args["invoice_id"])
    amount = _amount(args["amount"])
    currency = _currency(sor, args["currency"])
    vendor = L.vendor(sor, doc["vendor_id"])
    terms = sor.reference_row("SELECT * FROM payment_terms WHERE terms_code = ?", [vendor["payment_terms"]])
    days = 30 if terms is None else (terms["discount_days"] if terms["discount_pct"] > 0 else terms["net_days"])
    row = sor.insert("payments", {
        "invoice_id": doc["invoice_id"], "vendor_id": doc["vendor_id"], "amount": amount, "currency": currency,
        "scheduled_for": doc["invoice_date"] + dt.timedelta(days=days), "status": "scheduled",
    })
    return row


def apply_credit_note(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Apply a credit note's value against an invoice of the same vendor."""
    note = L.invoice(sor, args["credit_note_id"], "credit_note_id")
    if note["document_type"] != "credit_note":
        raise DomainError(f"{note['invoice_id']} is an invoice, not a credit note; only credit notes can be applied")
    target = L.invoice(sor, args["against_invoice_id"], "against_invoice_id")
    if target["document_type"] != "invoice":
        raise DomainError(f"{target['invoice_id']} is a credit note; a credit note is applied against an invoice")
    row = sor.insert("credit_applications", {
        "credit_note_id": note["invoice_id"], "against_invoice_id": target["invoice_id"],
        "amount": _amount(args["amount"]), "currency": note["currency"],
    })
    return {**row, "status": "applied"}


def flag_exception(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Put the document on hold under a reason code."""
    doc = L.invoice(sor, args["invoice_id"])
    code = args["reason_code"].strip().upper()
    if code not in REASON_CODES:
        raise DomainError(f"unknown reason_code {args['reason_code']!r}; valid codes, highest priority first: "
                          f"{', '.join(REASON_PRIORITY)}")
    row = sor.insert("exceptions", {"invoice_id": doc["invoice_id"], "reason_code": code, "note": args["note"]})
    return {**row, "status": "on_hold"}


def post_audit_log(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Append an entry to the audit log."""
    doc = L.invoice(sor, args["invoice_id"])
    return sor.insert("audit_log", {"invoice_id": doc["invoice_id"], "action": args["action"].strip(),
                                    "detail": args.get("detail") or ""})
