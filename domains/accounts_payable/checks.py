"""The read-only tools: look up a document and run the controls over it.

Every check returns `passed` and `reason_codes` (highest priority first) alongside its evidence,
so a business finding is a successful call with a finding in it, never an error. A check that
does not apply to a document (a credit note has no three-way match) says `applicable: false`
and passes. Each function takes the system of record and validated arguments (see tools.py).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from domains.accounts_payable import ledger as L
from domains.accounts_payable.errors import DomainError
from domains.accounts_payable.reason_codes import in_priority_order
from domains.accounts_payable.system_of_record import SystemOfRecord

Args = dict[str, Any]

CONFIDENCE_EXACT = Decimal("1.0")  # same invoice number and same amount
CONFIDENCE_SAME_NUMBER = Decimal("0.9")  # same invoice number, different amount
CONFIDENCE_SAME_AMOUNT_AND_PO = Decimal("0.7")  # same amount on the same PO, different number


def _verdict(codes: list[str], applicable: bool = True) -> dict[str, Any]:
    ordered = in_priority_order(codes)
    return {"applicable": applicable, "passed": not ordered, "reason_codes": ordered}


def _not_applicable(doc: dict[str, Any], why: str) -> dict[str, Any]:
    return {"invoice_id": doc["invoice_id"], "document_type": doc["document_type"], **_verdict([], False), "note": why}


def get_invoice(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Header, lines and totals of an invoice or credit note."""
    doc = L.invoice(sor, args["invoice_id"])
    vendor = L.vendor(sor, doc["vendor_id"])
    lines = L.invoice_lines(sor, doc["invoice_id"])
    amounts = L.line_amounts(lines, L.tax_rates(sor))
    net = sum((n for n, _ in amounts), Decimal(0))
    tax = sum((t for _, t in amounts), Decimal(0))
    return {
        **doc,
        "vendor_name": vendor["name"],
        "lines": [
            {k: line[k] for k in ("line_no", "sku", "description", "qty", "unit_price", "tax_code")} | {"net": n}
            for line, (n, _) in zip(lines, amounts)
        ],
        "net_total": net,
        "tax_total": tax,
        "gross_total": L.money(net + tax + doc["freight"]),
    }


def three_way_match(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Each invoice line against its PO line (price, quantity ordered) and goods received."""
    doc = L.invoice(sor, args["invoice_id"])
    if doc["document_type"] == "credit_note":
        return _not_applicable(doc, "credit notes are not matched; apply them with apply_credit_note")
    po = L.purchase_order(sor, doc["po_id"])
    head = {"invoice_id": doc["invoice_id"], "document_type": doc["document_type"], "po_id": doc["po_id"]}
    if po is None:
        note = f"{doc['po_id']} does not exist" if doc["po_id"] else "the invoice quotes no purchase order"
        return {**head, **_verdict(["NO_PO"]), "lines": [], "note": note}
    by_sku: dict[str, dict[str, Any]] = {}
    for pl in L.po_lines(sor, po["po_id"]):
        by_sku.setdefault(pl["sku"], pl)
    lines = [_match_line(sor, doc, po, line, by_sku.get(line["sku"]))
             for line in L.invoice_lines(sor, doc["invoice_id"])]
    return {**head, **_verdict([c for ln in lines for c in ln["reason_codes"]]), "lines": lines}


def _match_line(
    sor: SystemOfRecord, doc: dict[str, Any], po: dict[str, Any], line: dict[str, Any], pl: dict[str, Any] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"line_no": line["line_no"], "sku": line["sku"], "billed_qty": line["qty"]}
    if pl is None:
        note = f"{line['sku']} is not on {po['po_id']}"
        return out | {"status": "exception", "reason_codes": ["UNKNOWN_ITEM"], "note": note}
    price = line["unit_price"]
    if doc["currency"] != po["currency"]:  # compare in the PO's currency at the invoice-date rate
        price, _, _ = L.convert(sor, price, doc["currency"], po["currency"], doc["invoice_date"])
    variance = L.pct(price - pl["unit_price"], pl["unit_price"])
    codes = []
    if variance > pl["price_tolerance_pct"]:
        codes.append("PRICE_VARIANCE")
    received, billed = pl["qty_received"], line["qty"]
    if received <= 0:
        codes.append("NOT_RECEIVED")
    elif billed > received * (1 + pl["qty_tolerance_pct"] / L.HUNDRED):
        codes.append("QTY_OVER_RECEIVED")
    if billed > pl["qty_ordered"]:
        codes.append("QTY_OVER_ORDERED")
    return out | {
        "po_line_no": pl["line_no"],
        "category": pl["category"],
        "ordered_qty": pl["qty_ordered"],
        "received_qty": received,
        "qty_tolerance_pct": pl["qty_tolerance_pct"],
        "invoice_unit_price": price,
        "po_unit_price": pl["unit_price"],
        "price_variance_pct": variance.quantize(Decimal("0.01")),
        "price_tolerance_pct": pl["price_tolerance_pct"],
        "status": "exception" if codes else "matched",
        "reason_codes": in_priority_order(codes),
    }


def check_duplicate(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """How likely the document duplicates one already in the ledger (posted or paid), 0 to 1."""
    doc = L.invoice(sor, args["invoice_id"])
    gross = L.document_gross(sor, doc)
    number = L.normalise_invoice_number(doc["invoice_number"])
    threshold = Decimal(sor.setting("duplicate_hold_confidence"))
    best: tuple[Decimal, str, dict[str, Any] | None] = (Decimal(0), "no similar document in the ledger", None)
    for other in sor.reference(
        "SELECT * FROM invoices WHERE vendor_id = ? AND document_type = ? AND invoice_id <> ? "
        "AND status IN ('posted', 'paid') ORDER BY invoice_id",
        [doc["vendor_id"], doc["document_type"], doc["invoice_id"]],
    ):
        same_number = L.normalise_invoice_number(other["invoice_number"]) == number
        same_amount = other["currency"] == doc["currency"] and abs(L.document_gross(sor, other) - gross) <= L.CENT
        same_po = doc["po_id"] is not None and other["po_id"] == doc["po_id"]
        if same_number and same_amount:
            found = (CONFIDENCE_EXACT, "same invoice number and amount")
        elif same_number:
            found = (CONFIDENCE_SAME_NUMBER, "same invoice number, different amount")
        elif same_amount and same_po:
            found = (CONFIDENCE_SAME_AMOUNT_AND_PO, "same amount on the same purchase order")
        else:
            continue
        if found[0] > best[0]:
            best = (found[0], found[1], other)
    confidence, basis, match = best
    duplicate = confidence >= threshold
    return {
        "invoice_id": doc["invoice_id"],
        "invoice_number": doc["invoice_number"],
        "gross_amount": gross,
        "currency": doc["currency"],
        "confidence": float(confidence),
        "matched_invoice_id": match["invoice_id"] if match else None,
        "matched_invoice_number": match["invoice_number"] if match else None,
        "matched_invoice_status": match["status"] if match else None,
        "basis": basis,
        "hold_threshold": float(threshold),
        "is_duplicate": duplicate,
        **_verdict(["DUPLICATE_INVOICE"] if duplicate else []),
    }


def check_vendor_status(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Vendor master status, sanctions flag, and other vendor records sharing its bank account."""
    v = L.vendor(sor, args["vendor_id"])
    sharing = sor.reference(
        "SELECT vendor_id, name, created_on FROM vendors WHERE bank_account = ? AND vendor_id <> ? ORDER BY vendor_id",
        [v["bank_account"], v["vendor_id"]],
    )
    history = sor.scalar("SELECT count(*) FROM payments WHERE vendor_id = ? AND status = 'settled'", [v["vendor_id"]])
    codes = []
    if v["sanctioned"]:
        codes.append("VENDOR_SANCTIONED")
    if any(s["created_on"] < v["created_on"] for s in sharing):  # a newer record copying an older one's bank
        codes.append("DUPLICATE_VENDOR")
    if v["status"] != "active":
        codes.append("VENDOR_HOLD")
    return {
        "vendor_id": v["vendor_id"],
        "name": v["name"],
        "status": v["status"],
        "sanctioned": v["sanctioned"],
        "currency": v["currency"],
        "payment_terms": v["payment_terms"],
        "tax_id": v["tax_id"],
        "bank_account": "****" + v["bank_account"][-4:],
        "created_on": v["created_on"],
        "has_payment_history": history > 0,
        "shares_bank_account_with": sharing,
        **_verdict(codes),
    }


def validate_po(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """The invoice's purchase order exists, belongs to the vendor, is open, and covers the invoice date."""
    doc = L.invoice(sor, args["invoice_id"])
    if doc["document_type"] == "credit_note":
        return _not_applicable(doc, "credit notes are validated against the invoice they credit, not a PO")
    po = L.purchase_order(sor, doc["po_id"])
    head = {"invoice_id": doc["invoice_id"], "document_type": doc["document_type"], "po_id": doc["po_id"],
            "invoice_date": doc["invoice_date"]}
    if po is None:
        note = f"{doc['po_id']} does not exist" if doc["po_id"] else "the invoice quotes no purchase order"
        return {**head, "exists": False, **_verdict(["NO_PO"]), "note": note}
    if po["vendor_id"] != doc["vendor_id"]:
        note = f"{po['po_id']} was raised for vendor {po['vendor_id']}, not {doc['vendor_id']}"
        return {**head, "exists": True, "po_vendor_id": po["vendor_id"], **_verdict(["NO_PO"]), "note": note}
    codes = []
    if po["status"] == "closed":
        codes.append("PO_CLOSED")
    if doc["invoice_date"] > po["expires_on"]:
        codes.append("PO_EXPIRED")
    if doc["invoice_date"] < po["po_date"]:
        codes.append("INVOICE_BEFORE_PO")
    return {
        **head,
        "exists": True,
        "po_vendor_id": po["vendor_id"],
        "status": po["status"],
        "po_date": po["po_date"],
        "expires_on": po["expires_on"],
        **_verdict(codes),
    }


def validate_tax_code(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Each line's tax code is known and equals the tax code on its PO line."""
    doc = L.invoice(sor, args["invoice_id"])
    if doc["document_type"] == "credit_note":
        return _not_applicable(doc, "credit notes carry the tax codes of the invoice they credit")
    rates = L.tax_rates(sor)
    po = L.purchase_order(sor, doc["po_id"])
    by_sku: dict[str, dict[str, Any]] = {}
    for pl in L.po_lines(sor, po["po_id"]) if po else []:
        by_sku.setdefault(pl["sku"], pl)
    lines, codes = [], []
    for line in L.invoice_lines(sor, doc["invoice_id"]):
        expected = by_sku[line["sku"]]["tax_code"] if line["sku"] in by_sku else None
        if line["tax_code"] not in rates:
            status = "unknown_code"
        elif expected is None:
            status = "not_checked"  # no PO line to compare with; three_way_match reports why
        else:
            status = "ok" if line["tax_code"] == expected else "mismatch"
        if status in ("unknown_code", "mismatch"):
            codes.append("TAX_CODE_MISMATCH")
        lines.append({"line_no": line["line_no"], "sku": line["sku"], "tax_code": line["tax_code"],
                      "expected_tax_code": expected, "rate_pct": rates.get(line["tax_code"]), "status": status})
    tax_total = sum((t for _, t in L.line_amounts(L.invoice_lines(sor, doc["invoice_id"]), rates)), Decimal(0))
    return {"invoice_id": doc["invoice_id"], "document_type": doc["document_type"], "lines": lines,
            "tax_total": tax_total, **_verdict(codes)}


def convert_currency(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """An amount converted at the rates in force on a date (the latest published on or before it)."""
    on_date = L.parse_date(args["on_date"], "on_date")
    amount = Decimal(str(args["amount"]))
    converted, rate, rate_date = L.convert(sor, amount, args["from_currency"], args["to_currency"], on_date)
    return {"amount": amount, "from_currency": L.norm_id(args["from_currency"]),
            "to_currency": L.norm_id(args["to_currency"]), "on_date": on_date, "rate": rate,
            "rate_date": rate_date, "converted_amount": converted}


def check_fx_variance(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """How far the invoice currency's rate moved between the PO date and the invoice date."""
    doc = L.invoice(sor, args["invoice_id"])
    if doc["document_type"] == "credit_note":
        return _not_applicable(doc, "credit notes are applied in their own currency")
    po = L.purchase_order(sor, doc["po_id"])
    base = sor.setting("base_currency")
    tolerance = Decimal(sor.setting("fx_tolerance_pct"))
    head = {"invoice_id": doc["invoice_id"], "document_type": doc["document_type"], "currency": doc["currency"],
            "base_currency": base, "tolerance_pct": tolerance}
    if po is None:
        return {**head, **_verdict([], False), "note": "no purchase order to compare rates with"}
    if po["currency"] != doc["currency"]:
        note = f"invoice currency {doc['currency']} differs from the PO currency {po['currency']}"
        return {**head, "po_currency": po["currency"], **_verdict(["FX_VARIANCE"]), "note": note}
    if doc["currency"] == base:
        return {**head, "po_currency": po["currency"], **_verdict([], False),
                "note": f"invoice is in the base currency {base}"}
    at_po, po_rate_date = L.rate_to_gbp(sor, doc["currency"], po["po_date"])
    at_invoice, invoice_rate_date = L.rate_to_gbp(sor, doc["currency"], doc["invoice_date"])
    variance = L.pct(at_invoice - at_po, at_po)
    return {
        **head,
        "po_currency": po["currency"],
        "po_date": po["po_date"],
        "invoice_date": doc["invoice_date"],
        "rate_at_po_date": at_po,
        "rate_at_invoice_date": at_invoice,
        "rate_dates": [po_rate_date, invoice_rate_date],
        "variance_pct": variance.quantize(Decimal("0.001")),
        **_verdict(["FX_VARIANCE"] if abs(variance) > tolerance else []),
    }


def check_freight(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Freight billed on the invoice against the freight its PO authorises."""
    doc = L.invoice(sor, args["invoice_id"])
    if doc["document_type"] == "credit_note":
        return _not_applicable(doc, "credit notes carry no freight")
    allowed = _freight_allowance(sor, doc)
    authorised = doc["freight"] <= allowed
    return {"invoice_id": doc["invoice_id"], "document_type": doc["document_type"], "po_id": doc["po_id"],
            "freight_billed": doc["freight"], "freight_authorised_on_po": allowed, "authorised": authorised,
            **_verdict([] if authorised else ["UNAUTHORISED_FREIGHT"])}


def _freight_allowance(sor: SystemOfRecord, doc: dict[str, Any]) -> Decimal:
    po = L.purchase_order(sor, doc["po_id"])
    return po["freight_authorised"] if po else Decimal("0.00")


def calculate_payable_amount(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """Net + tax + authorised freight - settlement discount, in the vendor's payment currency.

    Unauthorised freight is left out. The settlement discount is the vendor's terms percentage of
    net (payments are scheduled inside the discount window). Conversion uses the rate on the
    invoice date. Credit notes come out negative, with `credit_amount` the positive figure.
    """
    doc = L.invoice(sor, args["invoice_id"])
    vendor = L.vendor(sor, doc["vendor_id"])
    terms = sor.reference_row("SELECT * FROM payment_terms WHERE terms_code = ?", [vendor["payment_terms"]])
    amounts = L.line_amounts(L.invoice_lines(sor, doc["invoice_id"]), L.tax_rates(sor))
    net = sum((n for n, _ in amounts), Decimal(0))
    tax = sum((t for _, t in amounts), Decimal(0))
    credit = doc["document_type"] == "credit_note"
    freight = doc["freight"] if doc["freight"] <= _freight_allowance(sor, doc) and not credit else Decimal("0.00")
    discount_pct = Decimal(0) if credit or terms is None else terms["discount_pct"]
    discount = L.money(net * discount_pct / L.HUNDRED)
    in_doc_currency = (net + tax + freight - discount) * (-1 if credit else 1)
    payable, rate, rate_date = L.convert(sor, in_doc_currency, doc["currency"], vendor["currency"], doc["invoice_date"])
    base = sor.setting("base_currency")
    amount_gbp, _, _ = L.convert(sor, in_doc_currency, doc["currency"], base, doc["invoice_date"])
    out = {
        "invoice_id": doc["invoice_id"],
        "document_type": doc["document_type"],
        "invoice_currency": doc["currency"],
        "net": net,
        "tax": tax,
        "freight_billed": doc["freight"],
        "freight_included": freight,
        "payment_terms": vendor["payment_terms"],
        "discount_pct": discount_pct,
        "settlement_discount": discount,
        "payable_in_invoice_currency": L.money(in_doc_currency),
        "payment_currency": vendor["currency"],
        "fx_rate": rate,
        "fx_rate_date": rate_date,
        "payable_amount": payable,
        "amount_gbp": amount_gbp,
    }
    if credit:
        out["credit_amount"] = -payable
        out["references_invoice_id"] = doc["references_invoice_id"]
    return out


def approval_band(sor: SystemOfRecord, amount_gbp: Decimal) -> dict[str, Any]:
    """The approval-matrix band an amount in GBP falls in (upper bounds inclusive)."""
    for band in sor.reference("SELECT * FROM approval_matrix ORDER BY lower_gbp"):
        if band["upper_gbp"] is None or amount_gbp <= band["upper_gbp"]:
            return band
    raise DomainError("the approval matrix has no band for this amount")  # unreachable with an open top band


def get_approval_requirement(sor: SystemOfRecord, args: Args) -> dict[str, Any]:
    """The band and the approver role the approval matrix requires for an amount."""
    amount = Decimal(str(args["amount"]))
    if amount < 0:
        raise DomainError("argument 'amount' must not be negative; approvals are for payments")
    currency = L.norm_id(args.get("currency") or "GBP")
    base = sor.setting("base_currency")
    if currency == base:
        amount_gbp = L.money(amount)
    elif args.get("on_date") is None:
        raise DomainError(f"argument 'on_date' is required to convert {currency} to {base} for the approval matrix")
    else:
        amount_gbp, _, _ = L.convert(sor, amount, currency, base, L.parse_date(args["on_date"], "on_date"))
    band = approval_band(sor, amount_gbp)
    approvers = sor.reference("SELECT approver_id, name FROM approvers WHERE role = ? ORDER BY approver_id",
                         [band["required_role"]])
    return {"amount": amount, "currency": currency, "amount_gbp": amount_gbp, "band": band["band"],
            "band_lower_gbp": band["lower_gbp"], "band_upper_gbp": band["upper_gbp"],
            "required_role": band["required_role"], "approvers": approvers}
