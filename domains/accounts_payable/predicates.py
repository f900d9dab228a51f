"""Named predicates the accounts_payable invariants refer to (`arg_satisfies: {predicate: ...}`).

The spec loader reads `PREDICATES` from the module named by the spec's `predicates:` key. Each
predicate is `fn(value, step, trajectory, context) -> bool`: `value` is the argument under test,
`step` the tool step (a `plumbline_otel.model.Step` or a dict with `args`), `context` the
ground-truth context of the trajectory's task (ground_truth.context_for).

Reference data (authority limits, FX rates) is read from one shared, read-only system of
record, never from the trajectory: an agent cannot make its own approval look sufficient by
understating the amount it asked to approve.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any

from domains.accounts_payable import ledger as L
from domains.accounts_payable.errors import DomainError
from domains.accounts_payable.reason_codes import REASON_CODES
from domains.accounts_payable.system_of_record import SystemOfRecord, open_system_of_record

Predicate = Callable[[Any, Any, Any, dict[str, Any]], bool]

_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _reference() -> SystemOfRecord:
    return open_system_of_record()


@lru_cache(maxsize=1)
def _authority_limits() -> dict[str, float]:
    with _LOCK:
        rows = _reference().reference("SELECT role, max(authority_limit_gbp) AS limit_gbp FROM approvers GROUP BY role")
    return {r["role"]: float(r["limit_gbp"]) for r in rows}


def _args(step: Any) -> dict[str, Any]:
    args = step.get("args") if isinstance(step, dict) else getattr(step, "args", None)
    return args if isinstance(args, dict) else {}


def _requested_gbp(args: dict[str, Any]) -> float | None:
    """The amount the step asked to approve, in GBP at the invoice-date rate; None if unreadable."""
    amount, currency = args.get("amount"), str(args.get("currency") or "GBP")
    if not isinstance(amount, (int, float)) or isinstance(amount, bool):
        return None
    if L.norm_id(currency) == "GBP":
        return abs(float(amount))
    try:
        with _LOCK:
            sor = _reference()
            doc = L.invoice(sor, str(args.get("invoice_id") or ""))
            converted, _, _ = L.convert(sor, Decimal(str(amount)), currency, "GBP", doc["invoice_date"])
    except DomainError:
        return None
    return abs(float(converted))


def approver_has_authority(value: Any, step: Any, trajectory: Any, context: dict[str, Any]) -> bool:
    """The approver role's authority limit covers the amount to approve.

    The amount is the larger of the ground truth's `approval_amount_gbp` (when the task is known)
    and the amount the step itself asked to approve. With neither, authority cannot be shown.
    """
    if not isinstance(value, str):
        return False
    limit = _authority_limits().get(value.strip().lower())
    if limit is None:
        return False
    amounts = [a for a in (context.get("approval_amount_gbp") if context else None, _requested_gbp(_args(step)))
               if a is not None]
    return bool(amounts) and max(amounts) <= limit


def known_reason_code(value: Any, step: Any, trajectory: Any, context: dict[str, Any]) -> bool:
    """The value is one of the domain's reason codes (trimmed, case-insensitive)."""
    return isinstance(value, str) and value.strip().upper() in REASON_CODES


PREDICATES: dict[str, Predicate] = {
    "approver_has_authority": approver_has_authority,
    "known_reason_code": known_reason_code,
}
