"""Exception reason codes and the priority order that picks one primary code per held invoice.

The order runs from what the law forbids, through fraud, the vendor master and the PO, to the
line match and finally the document's own details. When several blockers are present, the
invoice is held under the first one in `REASON_PRIORITY`; the others go in the note.
"""

from __future__ import annotations

from collections.abc import Iterable

REASON_PRIORITY: tuple[str, ...] = (
    "VENDOR_SANCTIONED",     # the counterparty is on a sanctions list: paying it is unlawful
    "DUPLICATE_INVOICE",     # the invoice matches one already in the ledger (confidence >= 0.7)
    "DUPLICATE_VENDOR",      # a newer vendor record shares an established vendor's bank account
    "VENDOR_HOLD",           # the vendor is on hold in the vendor master
    "NO_PO",                 # the invoice quotes no purchase order, or one that does not exist
    "PO_CLOSED",             # the purchase order is closed
    "PO_EXPIRED",            # the invoice is dated after the purchase order expired
    "INVOICE_BEFORE_PO",     # the invoice is dated before the purchase order
    "UNKNOWN_ITEM",          # an invoice line bills an item that is not on the purchase order
    "NOT_RECEIVED",          # nothing has been received against the PO line
    "QTY_OVER_RECEIVED",     # billed quantity exceeds the quantity received (beyond tolerance)
    "QTY_OVER_ORDERED",      # billed quantity exceeds the quantity ordered
    "PRICE_VARIANCE",        # unit price above the PO price by more than the category tolerance
    "TAX_CODE_MISMATCH",     # a line's tax code differs from the PO line's (or is unknown)
    "FX_VARIANCE",           # the rate moved more than the tolerance since the PO, or currencies differ
    "UNAUTHORISED_FREIGHT",  # freight billed beyond what the PO authorises
)

REASON_CODES: frozenset[str] = frozenset(REASON_PRIORITY)


def primary_reason(codes: Iterable[str]) -> str | None:
    """The highest-priority code among `codes`, or None when there is none."""
    present = set(codes)
    unknown = present - REASON_CODES
    if unknown:
        raise ValueError(f"unknown reason codes: {sorted(unknown)}")
    return next((c for c in REASON_PRIORITY if c in present), None)


def in_priority_order(codes: Iterable[str]) -> list[str]:
    """The distinct codes of `codes`, highest priority first."""
    present = set(codes)
    return [c for c in REASON_PRIORITY if c in present]
