"""``plan_execute`` and ``plan_execute_retry``: one interpretation call, then fixed control flow.

The model is asked once what the request is about: it answers by calling the
``record_interpretation`` tool (forced with ``tool_choice``) with the document id and the
operation. Everything after that is code following ``policy.md``:

1. ``get_invoice``;
2. the mandatory checks (vendor, then PO, match, duplicate, tax, FX, freight for an invoice;
   vendor and duplicate for a credit note), every one of them even after a finding;
3. any reason code: ``flag_exception`` once under the highest-priority code, the others in the
   note; otherwise a credit note is applied, and an invoice is paid: payable amount, approval
   requirement, approval by the required role, one payment;
4. ``post_audit_log``.

The two arms differ only in how a failed tool call is treated. ``plan_execute`` never retries:
any tool error is a blocker. ``plan_execute_retry`` retries the transient kinds (503, 429,
timeout, connection reset), and only those, with exponential backoff; a call that still fails
is a blocker.

A blocker on a check holds the document under the code that check guards (a duplicate check
that could not run holds under ``DUPLICATE_INVOICE``: the invoice cannot be cleared), ranked with
the codes the other checks found. A blocker after the checks (amount, approval, payment) leaves
the document unpaid and unflagged, with an audit entry saying what failed: there is no honest
reason code for "the payment service was down".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from domains.accounts_payable.arms.context import ArmContext
from domains.accounts_payable.arms.runtime import ArmOutcome, RetryPolicy, call_with_retry

INTERPRET_TOOL = "record_interpretation"

INTERPRET_SYSTEM = """You are the intake step of an accounts-payable agent. Read the user's request and
record, with the record_interpretation tool, which document it is about and what is asked.
Document ids look like INV-1001; the vendor's own invoice number (e.g. NW-40112) is not a
document id. Do not process anything yourself: a separate executor runs the checks and the
disposition required by policy."""

INTERPRET_SPEC: dict[str, Any] = {
    "name": INTERPRET_TOOL,
    "description": "Record the interpretation of an accounts-payable request.",
    "input_schema": {
        "type": "object",
        "properties": {
            "invoice_id": {
                "type": ["string", "null"],
                "description": "The document id the request is about (e.g. INV-1001), or null if none.",
            },
            "operation": {
                "type": "string",
                "enum": ["process", "none"],
                "description": "process: run the document through the AP policy.",
            },
            "vendor_name": {"type": "string", "description": "The vendor as named in the request."},
        },
        "required": ["invoice_id", "operation"],
    },
}

# The code a check guards: the hold reason when that check could not be completed.
CODE_IF_CHECK_FAILED: dict[str, str] = {
    "check_vendor_status": "VENDOR_HOLD",
    "validate_po": "NO_PO",
    "three_way_match": "NOT_RECEIVED",
    "check_duplicate": "DUPLICATE_INVOICE",
    "validate_tax_code": "TAX_CODE_MISMATCH",
    "check_fx_variance": "FX_VARIANCE",
    "check_freight": "UNAUTHORISED_FREIGHT",
}
INVOICE_CHECKS = ("validate_po", "three_way_match", "check_duplicate", "validate_tax_code",
                  "check_fx_variance", "check_freight")
CREDIT_NOTE_CHECKS = ("check_duplicate",)


class Blocked(Exception):
    """A tool call failed for good (after retries, if any)."""

    def __init__(self, tool: str, error: Exception) -> None:
        super().__init__(f"{tool} failed: {error}")
        self.tool = tool
        self.error = error


@dataclass
class Interpretation:
    invoice_id: str | None
    operation: str = "process"
    raw: dict[str, Any] = field(default_factory=dict)


def interpret(ctx: ArmContext) -> Interpretation | None:
    """The one model call: which document, what to do. None when the answer is unusable."""
    response = ctx.model.create(
        system=INTERPRET_SYSTEM,
        messages=[{"role": "user", "content": ctx.request_text}],
        tools=[INTERPRET_SPEC],
        tool_choice={"type": "tool", "name": INTERPRET_TOOL},
    )
    payload: dict[str, Any] | None = None
    for block in response.content:
        if block.type == "tool_use" and block.name == INTERPRET_TOOL:
            payload = dict(block.input or {})
            break
        if block.type == "text":  # a model that answered in JSON text instead
            try:
                payload = json.loads(block.text)
            except ValueError:
                continue
    if not isinstance(payload, dict):
        return None
    invoice_id = payload.get("invoice_id")
    if not isinstance(invoice_id, str) or not invoice_id.strip():
        return None
    return Interpretation(invoice_id.strip(), str(payload.get("operation") or "process"), payload)


class _Executor:
    """The fixed control flow for one document."""

    def __init__(self, ctx: ArmContext, retry: RetryPolicy, invoice_id: str) -> None:
        self.ctx = ctx
        self.retry = retry
        self.invoice_id = invoice_id
        self.log: list[str] = []

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        from domains.accounts_payable.tools import DomainError

        try:
            return call_with_retry(self.ctx.runner, self.retry, name, args)
        except DomainError as exc:
            raise Blocked(name, exc) from exc

    def run(self) -> ArmOutcome:
        doc_id = self.invoice_id
        try:
            doc = self.call("get_invoice", {"invoice_id": doc_id})
        except Blocked as exc:
            if not _is_transient(exc.error):  # no such document: nothing to act on
                return ArmOutcome(f"Could not read {doc_id}: {exc.error}", agent_error="interpretation failed")
            doc = None
        if doc is not None:
            doc_id = doc["invoice_id"]
        codes, notes, failed = self.run_checks(doc_id, doc)
        if codes:
            return self.hold(doc_id, codes, notes, failed)
        assert doc is not None, "run_checks holds a document it could not read"
        try:
            if doc["document_type"] == "credit_note":
                return self.apply_credit(doc_id)
            return self.pay(doc_id, doc)
        except Blocked as exc:
            return self.abandon(doc_id, exc)

    def run_checks(
        self, doc_id: str, doc: dict[str, Any] | None
    ) -> tuple[list[str], list[str], list[str]]:
        from domains.accounts_payable.reason_codes import in_priority_order

        codes: list[str] = []
        notes: list[str] = []
        failed: list[str] = []
        checks: list[tuple[str, dict[str, Any]]] = []
        if doc is None:  # the document could not be read: the vendor cannot be verified
            failed.append("get_invoice")
            codes.append(CODE_IF_CHECK_FAILED["check_vendor_status"])
            notes.append("the document could not be read, so the vendor could not be verified")
        else:
            checks.append(("check_vendor_status", {"vendor_id": doc["vendor_id"]}))
        is_credit = doc is not None and doc.get("document_type") == "credit_note"
        for name in CREDIT_NOTE_CHECKS if is_credit else INVOICE_CHECKS:
            checks.append((name, {"invoice_id": doc_id}))
        for name, args in checks:
            try:
                result = self.call(name, args)
            except Blocked as exc:
                failed.append(name)
                codes.append(CODE_IF_CHECK_FAILED[name])
                notes.append(f"{name} could not be completed ({exc.error}); held until it can be verified")
                continue
            found = list(result.get("reason_codes") or [])
            codes.extend(found)
            if found:
                notes.append(f"{name}: {', '.join(found)}")
        return in_priority_order(codes), notes, failed

    def hold(self, doc_id: str, codes: list[str], notes: list[str], failed: list[str]) -> ArmOutcome:
        primary, others = codes[0], codes[1:]
        note = "; ".join(notes)
        if others:
            note += f". Further codes: {', '.join(others)}"
        try:
            self.call("flag_exception", {"invoice_id": doc_id, "reason_code": primary, "note": note})
        except Blocked as exc:
            self.audit(doc_id, "hold_failed", f"could not flag {primary}: {exc.error}")
            return ArmOutcome(f"{doc_id} should be held under {primary}, but flagging failed: {exc.error}",
                              agent_error="blocked")
        self.audit(doc_id, "held", f"held under {primary}; {note}")
        why = f" ({', '.join(failed)} could not be completed)" if failed else ""
        return ArmOutcome(f"Held {doc_id} under {primary}{why}. {note}")

    def pay(self, doc_id: str, doc: dict[str, Any]) -> ArmOutcome:
        payable = self.call("calculate_payable_amount", {"invoice_id": doc_id})
        amount, currency = payable["payable_amount"], payable["payment_currency"]
        lookup: dict[str, Any] = {"amount": amount, "currency": currency}
        if currency != "GBP":
            lookup["on_date"] = doc["invoice_date"]
        requirement = self.call("get_approval_requirement", lookup)
        role = requirement["required_role"]
        self.call("request_approval", {"invoice_id": doc_id, "approver_role": role,
                                       "amount": amount, "currency": currency})
        payment = self.call("schedule_payment", {"invoice_id": doc_id, "amount": amount, "currency": currency})
        detail = (f"all checks passed; approved by {role} (band {requirement['band']}); "
                  f"paid {amount:.2f} {currency} as {payment.get('payment_id')}")
        self.audit(doc_id, "paid", detail)
        return ArmOutcome(f"Paid {doc_id}: {detail}.")

    def apply_credit(self, doc_id: str) -> ArmOutcome:
        payable = self.call("calculate_payable_amount", {"invoice_id": doc_id})
        amount, target = payable["credit_amount"], payable["references_invoice_id"]
        self.call("apply_credit_note", {"credit_note_id": doc_id, "against_invoice_id": target,
                                        "amount": amount})
        detail = f"vendor and duplicate checks passed; applied {amount:.2f} against {target}"
        self.audit(doc_id, "credit_applied", detail)
        return ArmOutcome(f"Applied credit note {doc_id}: {detail}.")

    def abandon(self, doc_id: str, exc: Blocked) -> ArmOutcome:
        self.audit(doc_id, "not_processed", f"{exc.tool} failed: {exc.error}; left for manual processing")
        return ArmOutcome(f"Could not complete {doc_id}: {exc.tool} failed ({exc.error}). Left unpaid.",
                          agent_error="blocked")

    def audit(self, doc_id: str, action: str, detail: str) -> None:
        try:
            self.call("post_audit_log", {"invoice_id": doc_id, "action": action, "detail": detail})
        except Blocked:
            pass  # the audit entry is best effort; its absence shows in the trajectory


def _is_transient(exc: Exception) -> bool:
    from domains.accounts_payable.arms.runtime import is_transient

    return is_transient(exc)


def _run(ctx: ArmContext) -> ArmOutcome:
    interpretation = interpret(ctx)
    if interpretation is None or interpretation.operation != "process":
        return ArmOutcome("I could not tell which document the request is about.",
                          agent_error="interpretation failed")
    assert interpretation.invoice_id is not None, "a process interpretation names its document"
    return _Executor(ctx, ctx.retry, interpretation.invoice_id).run()


def run_no_retry(ctx: ArmContext) -> ArmOutcome:
    """``plan_execute``: ``ctx.retry`` is ``NO_RETRY`` (set by ``run_trial``)."""
    return _run(ctx)


def run_with_retry(ctx: ArmContext) -> ArmOutcome:
    """``plan_execute_retry``: transient errors retried per ``ctx.retry``."""
    return _run(ctx)
