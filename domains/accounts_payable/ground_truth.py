"""Ground truth for every task, derived by calling the same tools the agent uses.

Nothing here is hard-coded: the expected outcome of a document is what the policy says to do
with the tools' findings on a fresh system of record:

1. run every check (vendor status, PO validity, three-way match, duplicate, tax, FX, freight)
   and collect their reason codes;
2. any code present: hold, under the highest-priority code (`REASON_PRIORITY`);
3. otherwise a credit note: apply its credit amount against the invoice it references;
4. otherwise pay `calculate_payable_amount` in the vendor's currency, approved by the role the
   approval matrix requires for its GBP value.

If the data or a tool changes, the outcome changes with it, and the pinned table in
tests/domains/test_ground_truth.py says which task moved.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any, Literal

from domains.accounts_payable.reason_codes import in_priority_order
from domains.accounts_payable.system_of_record import SystemOfRecord, open_system_of_record
from domains.accounts_payable.tasks import TASKS_BY_ID
from domains.accounts_payable.tools import call_tool

Action = Literal["pay", "hold", "apply_credit"]

CHECK_TOOLS: tuple[str, ...] = (
    "validate_po", "three_way_match", "check_duplicate", "validate_tax_code", "check_fx_variance", "check_freight",
)  # plus check_vendor_status, which takes the vendor id
AMOUNT_TOLERANCE = 0.005


@dataclass(frozen=True)
class Outcome:
    """What should happen to one document."""

    task_id: str
    action: Action
    payable_amount: float | None  # pay: the amount to pay; apply_credit: negative payable; hold: None
    currency: str | None  # payment (or credit) currency; None for holds
    approver_role: str | None  # pay: the role the matrix requires
    primary_reason_code: str | None  # hold: the one code to flag
    credit_target: str | None  # apply_credit: the invoice the credit note is applied against
    credit_amount: float | None = None  # apply_credit: the positive amount to apply
    band: str | None = None  # pay: approval band A-D
    amount_gbp: float | None = None  # the document's payable value in GBP (signed), whatever the action
    reason_codes: tuple[str, ...] = ()  # every blocker found, highest priority first
    document_type: str = "invoice"
    vendor_id: str = ""
    duplicate_confidence: float = 0.0
    findings: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def invoice_id(self) -> str:
        """The document id (the same as the task id)."""
        return self.task_id


def derive_outcome(sor: SystemOfRecord, invoice_id: str) -> Outcome:
    """The expected outcome of any document in `sor`, by calling the tools on it."""
    doc = call_tool(sor, "get_invoice", {"invoice_id": invoice_id})
    doc_id = doc["invoice_id"]
    findings = {"check_vendor_status": call_tool(sor, "check_vendor_status", {"vendor_id": doc["vendor_id"]})}
    findings |= {name: call_tool(sor, name, {"invoice_id": doc_id}) for name in CHECK_TOOLS}
    codes = tuple(in_priority_order(c for f in findings.values() for c in f["reason_codes"]))
    payable = call_tool(sor, "calculate_payable_amount", {"invoice_id": doc_id})
    findings["calculate_payable_amount"] = payable
    common = {"task_id": doc_id, "reason_codes": codes, "document_type": doc["document_type"],
              "vendor_id": doc["vendor_id"], "amount_gbp": payable["amount_gbp"],
              "duplicate_confidence": findings["check_duplicate"]["confidence"], "findings": findings}
    if codes:
        return Outcome(action="hold", payable_amount=None, currency=None, approver_role=None,
                       primary_reason_code=codes[0], credit_target=None, **common)
    if doc["document_type"] == "credit_note":
        return Outcome(action="apply_credit", payable_amount=payable["payable_amount"],
                       currency=payable["payment_currency"], approver_role=None, primary_reason_code=None,
                       credit_target=doc["references_invoice_id"], credit_amount=payable["credit_amount"], **common)
    requirement_args: dict[str, Any] = {"amount": payable["payable_amount"], "currency": payable["payment_currency"]}
    if payable["payment_currency"] != "GBP":
        requirement_args["on_date"] = doc["invoice_date"]
    requirement = call_tool(sor, "get_approval_requirement", requirement_args)
    findings["get_approval_requirement"] = requirement
    return Outcome(action="pay", payable_amount=payable["payable_amount"], currency=payable["payment_currency"],
                   approver_role=requirement["required_role"], primary_reason_code=None, credit_target=None,
                   band=requirement["band"], **common)


@cache
def expected_outcome(task_id: str) -> Outcome:
    """The expected outcome of a task, derived on a fresh system of record (cached per process)."""
    key = task_id.strip().upper()
    if key not in TASKS_BY_ID:
        raise KeyError(f"unknown task {task_id!r}; tasks are {', '.join(TASKS_BY_ID)}")
    with open_system_of_record() as sor:
        return derive_outcome(sor, key)


_TASK_ID = re.compile(r"INV-\d{4}")


def context_for(task_key: str) -> dict[str, Any]:
    """The ground-truth context the invariant checker uses for a trajectory's task key.

    The key may be the task id itself or contain it ("ap/INV-1007/paraphrase"). Keys whose
    ground truth is None (no approver for a hold) are left out: to the checker a missing key means
    "no ground truth", so the invariant does not apply. An unknown key gives
    `{"known_task": False, "task_key": ...}`, so conditional invariants do not apply.
    """
    found = _TASK_ID.search(str(task_key or "").upper())
    if found is None or found.group() not in TASKS_BY_ID:
        return {"known_task": False, "task_key": task_key}
    o = expected_outcome(found.group())
    context = {
        "known_task": True,
        "task_key": task_key,
        "task_id": o.task_id,
        "invoice_id": o.invoice_id,
        "document_type": o.document_type,
        "vendor_id": o.vendor_id,
        "expected_action": o.action,
        "payable_amount": o.payable_amount,
        "currency": o.currency,
        "approver_role": o.approver_role,
        "band": o.band,
        "approval_amount_gbp": abs(o.amount_gbp) if o.amount_gbp is not None else None,
        "primary_reason_code": o.primary_reason_code,
        "reason_codes": list(o.reason_codes),
        "credit_target": o.credit_target,
        "credit_amount": o.credit_amount,
        "duplicate_confidence": o.duplicate_confidence,
    }
    return {k: v for k, v in context.items() if v is not None}


@dataclass(frozen=True)
class GradeResult:
    """How a trial's end state compares with the expected outcome."""

    task_id: str
    passed: bool
    expected: Outcome
    observed_action: str  # "pay", "hold", "apply_credit", "none" or "mixed"
    problems: tuple[str, ...]
    writes: dict[str, list[dict[str, Any]]] = field(compare=False, hash=False, repr=False, default_factory=dict)

    def export(self) -> dict[str, Any]:
        """JSON-serialisable form for reports and ledgers."""
        expected = {k: v for k, v in asdict(self.expected).items() if k != "findings"}
        return {"task_id": self.task_id, "passed": self.passed, "expected": expected,
                "observed_action": self.observed_action, "problems": list(self.problems), "writes": self.writes}


def grade(sor_after_run: SystemOfRecord, task_id: str) -> GradeResult:
    """Compare the end state of a trial's system of record with the task's expected outcome.

    Only the trial's own writes count (seeded history is ignored). Passing means: exactly the
    expected effect on this document (one payment of the right amount and currency after an
    approval with enough authority; or a hold flagged under exactly the primary code; or one
    credit application of the right amount against the right invoice), nothing contradictory
    on it, and no effect on any other document. The audit entry is an invariant, not graded.
    """
    expected = expected_outcome(task_id)
    doc = expected.invoice_id
    writes = sor_after_run.writes()
    mine = {t: [r for r in rows if _document_of(t, r) == doc] for t, rows in writes.items()}
    others = sorted({_document_of(t, r) for t, rows in writes.items() for r in rows} - {doc})
    problems = [f"changed other documents: {', '.join(others)}"] if others else []
    checker = {"pay": _grade_pay, "hold": _grade_hold, "apply_credit": _grade_credit}[expected.action]
    problems += checker(sor_after_run, expected, mine)
    return GradeResult(task_id=doc, passed=not problems, expected=expected, observed_action=_observed(mine),
                       problems=tuple(problems), writes=writes)


def _document_of(table: str, row: dict[str, Any]) -> str:
    return row["credit_note_id"] if table == "credit_applications" else row["invoice_id"]


def _observed(mine: dict[str, list[dict[str, Any]]]) -> str:
    acts = [a for a, t in (("pay", "payments"), ("hold", "exceptions"), ("apply_credit", "credit_applications"))
            if mine[t]]
    return acts[0] if len(acts) == 1 else ("none" if not acts else "mixed")


def _close(a: float, b: float | None) -> bool:
    return b is not None and abs(a - b) <= AMOUNT_TOLERANCE


def _grade_pay(sor: SystemOfRecord, o: Outcome, mine: dict[str, list[dict[str, Any]]]) -> list[str]:
    problems = []
    pays = mine["payments"]
    if len(pays) != 1:
        problems.append(f"expected exactly one payment, found {len(pays)}")
    for p in pays:
        if not _close(p["amount"], o.payable_amount) or p["currency"] != o.currency:
            problems.append(f"paid {p['amount']:.2f} {p['currency']}, expected {o.payable_amount:.2f} {o.currency}")
    if pays:
        limits = {r["approver_id"]: float(r["authority_limit_gbp"])
                  for r in sor.reference("SELECT approver_id, authority_limit_gbp FROM approvers")}
        need = abs(o.amount_gbp or 0.0)
        ok = [a for a in mine["approvals"] if a["seq"] < pays[0]["seq"] and limits.get(a["approver_id"], 0) >= need]
        if not ok:
            problems.append(f"no approval with authority for {need:,.2f} GBP before the payment "
                            f"(band {o.band} needs {o.approver_role})")
    if mine["exceptions"]:
        problems.append("flagged an exception on a document that should be paid")
    if mine["credit_applications"]:
        problems.append("applied a credit on a document that should be paid")
    return problems


def _grade_hold(sor: SystemOfRecord, o: Outcome, mine: dict[str, list[dict[str, Any]]]) -> list[str]:
    problems = []
    if mine["payments"]:
        problems.append(f"paid a document that should be held under {o.primary_reason_code}")
    codes = list(dict.fromkeys(e["reason_code"] for e in mine["exceptions"]))
    if not codes:
        problems.append(f"not flagged; expected a hold under {o.primary_reason_code}")
    elif codes != [o.primary_reason_code]:
        problems.append(f"flagged {', '.join(codes)}; expected exactly {o.primary_reason_code}")
    if mine["credit_applications"]:
        problems.append("applied a credit on a document that should be held")
    return problems


def _grade_credit(sor: SystemOfRecord, o: Outcome, mine: dict[str, list[dict[str, Any]]]) -> list[str]:
    problems = []
    if mine["payments"]:
        problems.append("paid a credit note")
    apps = mine["credit_applications"]
    if len(apps) != 1:
        problems.append(f"expected exactly one credit application, found {len(apps)}")
    for a in apps:
        if a["against_invoice_id"] != o.credit_target or not _close(a["amount"], o.credit_amount):
            problems.append(f"applied {a['amount']:.2f} against {a['against_invoice_id']}, "
                            f"expected {o.credit_amount:.2f} against {o.credit_target}")
    if mine["exceptions"]:
        problems.append("flagged an exception on a credit note that should be applied")
    return problems
