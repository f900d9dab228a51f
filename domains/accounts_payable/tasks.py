"""The invoice tasks: one document waiting in the AP queue each, and the request an agent gets.

`exception_class` and `summary` say what each task was built to exercise. They are labels for
readers, not ground truth: the expected outcome is derived by the tools (ground_truth.py), and a
test checks every label against it, so a label cannot drift from the data unnoticed.

The request names the vendor as it appears on the document and never names the checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task: process this document."""

    task_id: str  # the document id, e.g. "INV-1001"; also the trajectory's task key
    vendor_name: str  # as printed on the document
    exception_class: str  # what the task exercises, e.g. "price_variance_services"
    summary: str  # one line for readers and reports
    request: str = ""  # the user's request as the agent receives it; derived when empty
    invoice_id: str = ""  # the document the task is about; the task id when empty

    def __post_init__(self) -> None:
        if not self.request:
            object.__setattr__(self, "request", f"Please process invoice {self.task_id} from {self.vendor_name}.")
        if not self.invoice_id:
            object.__setattr__(self, "invoice_id", self.task_id)

    @property
    def metadata(self) -> dict[str, Any]:
        """Attributes to attach to the trial (e.g. as span or baggage attributes)."""
        return {"invoice.id": self.task_id, "vendor.name": self.vendor_name,
                "task.exception_class": self.exception_class}


TASKS: list[Task] = [
    Task("INV-1001", "Northwind Supplies", "clean_band_a",
         "Clean two-line commodity invoice; 2% settlement discount; band A (ap_clerk)."),
    Task("INV-1002", "Delmar Packaging", "clean_band_b",
         "Clean invoice mixing S20 and R05 lines, with freight the PO authorises; band B (controller)."),
    Task("INV-1003", "Brightwater Engineering", "clean_band_c",
         "Clean pumps and installation; 1% settlement discount; band C (finance_director)."),
    Task("INV-1004", "Brightwater Engineering", "clean_band_d",
         "Clean capital purchase (chiller and installation); band D (cfo)."),
    Task("INV-1005", "Hansa Technik", "clean_foreign_currency",
         "Clean EUR invoice paid in EUR; rate moved 1.5% (within 2%). EUR 28,500 is GBP 23,940: band B, "
         "not the band C the EUR figure suggests."),
    Task("INV-1006", "Northwind Supplies", "price_variance_commodity_within_tolerance",
         "Price 2.6% above the PO on a commodity line: within the 5% commodity tolerance, so pay."),
    Task("INV-1007", "Kestrel Consulting", "price_variance_services",
         "Price 2.6% above the PO on a services line: beyond the 2% services tolerance, so hold."),
    Task("INV-1008", "Northwind Supplies", "duplicate_exact",
         "Re-sent copy of INV-0901 (same number NW-40112, same amount), already paid: confidence 1.0."),
    Task("INV-1009", "Delmar Packaging", "duplicate_same_number",
         "Number DP7781 is INV-0902's DP-7781 once punctuation is ignored; different amount: confidence 0.9."),
    Task("INV-1010", "Brightwater Engineering", "duplicate_same_amount_and_po",
         "Same amount on the same PO as the paid INV-0903, new number: confidence 0.7 (the hold threshold)."),
    Task("INV-1011", "Hansa Technik", "fx_variance",
         "EUR invoice; the EUR rate fell 2.9% between the PO date and the invoice date (tolerance 2%)."),
    Task("INV-1012", "Delmar Packaging", "tax_code_mismatch",
         "Insulation wrap billed at S20 where the PO line says R05."),
    Task("INV-1013", "Northwind Supplies", "credit_note",
         "Credit note for 10 damaged toner cartridges, against the posted, unpaid INV-0905."),
    Task("INV-1014", "Northwind Supply Co", "duplicate_vendor",
         "New vendor record V-107 sharing the bank account of the established V-100; also bills an item "
         "not on its PO."),
    Task("INV-1015", "Volkov Trading", "sanctioned_vendor",
         "Sanctioned counterparty, USD, no PO: VENDOR_SANCTIONED outranks NO_PO."),
    Task("INV-1016", "Corvin Industrial", "vendor_on_hold",
         "Vendor on hold; the invoice also bills more than was ordered."),
    Task("INV-1017", "Ashfield Logistics", "po_expired",
         "Invoice dated 2026-02-20 against a PO that expired on 2026-01-31."),
    Task("INV-1018", "Kestrel Consulting", "invoice_before_po",
         "Invoice dated six days before its PO; nothing received yet either."),
    Task("INV-1019", "Delmar Packaging", "unauthorised_freight",
         "GBP 95 freight on a PO that authorises none."),
    Task("INV-1020", "Meridian Office Services", "no_po",
         "Small services invoice quoting no purchase order."),
    Task("INV-1021", "Northwind Supplies", "qty_over_received",
         "Billed 50 cases, 40 received (line 1); lids 7.5% over the PO price (line 2): receipt outranks price."),
    Task("INV-1022", "Meridian Office Services", "po_closed",
         "Invoice against a purchase order that has been closed."),
]

TASKS_BY_ID: dict[str, Task] = {t.task_id: t for t in TASKS}


def task(task_id: str) -> Task:
    """The task with this id (trimmed, case-insensitive); KeyError when there is none."""
    return TASKS_BY_ID[task_id.strip().upper()]
