"""Lookups and money arithmetic the tools share.

Money is `Decimal`, rounded half-up to two places at each documented step (line net, line tax,
discount, conversion), so a figure the agent recomputes by hand agrees to the penny. Lookups of
documents the agent names raise `DomainError` with a hint when the name is close to a real one.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from domains.accounts_payable.errors import DomainError
from domains.accounts_payable.system_of_record import SystemOfRecord

CENT = Decimal("0.01")
HUNDRED = Decimal(100)


def money(value: Any) -> Decimal:
    """A money amount rounded half-up to two places."""
    return Decimal(str(value)).quantize(CENT, rounding=ROUND_HALF_UP)


def pct(part: Decimal, whole: Decimal) -> Decimal:
    """`part` as a percentage of `whole`, unrounded."""
    return part / whole * HUNDRED


def norm_id(value: str) -> str:
    """Ids compare trimmed and upper-cased: " inv-1001 " is INV-1001."""
    return value.strip().upper()


def parse_date(value: str, arg: str) -> dt.date:
    """An ISO date argument, or a DomainError naming the argument."""
    try:
        return dt.date.fromisoformat(value.strip())
    except ValueError:
        raise DomainError(f"argument {arg!r} must be a date as YYYY-MM-DD, got {value!r}") from None


def invoice(sor: SystemOfRecord, invoice_id: str, arg: str = "invoice_id") -> dict[str, Any]:
    """The invoice (or credit note) header; unknown ids get a hint."""
    key = norm_id(invoice_id)
    found = sor.reference_row("SELECT * FROM invoices WHERE invoice_id = ?", [key])
    if found is not None:
        return found
    by_number = sor.reference(
        "SELECT invoice_id FROM invoices WHERE upper(invoice_number) = ? ORDER BY invoice_id", [key]
    )
    hint = ""
    if by_number:
        ids = ", ".join(r["invoice_id"] for r in by_number)
        hint = f" {invoice_id!r} is the vendor's own invoice number of {ids}; pass the document id instead."
    raise DomainError(f"no invoice or credit note with {arg}={invoice_id!r}.{hint} Document ids look like INV-1001.")


def invoice_lines(sor: SystemOfRecord, invoice_id: str) -> list[dict[str, Any]]:
    """The lines of a document in line order."""
    return sor.reference("SELECT * FROM invoice_lines WHERE invoice_id = ? ORDER BY line_no", [invoice_id])


def vendor(sor: SystemOfRecord, vendor_id: str) -> dict[str, Any]:
    """The vendor record; a name passed as an id gets a hint naming the matching ids."""
    found = sor.reference_row("SELECT * FROM vendors WHERE vendor_id = ?", [norm_id(vendor_id)])
    if found is not None:
        return found
    like = sor.reference(
        "SELECT vendor_id, name FROM vendors WHERE lower(name) LIKE ? ORDER BY vendor_id",
        [f"%{vendor_id.strip().lower()}%"],
    )
    hint = ""
    if like and vendor_id.strip():
        names = "; ".join(f"{r['vendor_id']} is {r['name']}" for r in like)
        hint = f" Vendors with that name: {names}."
    raise DomainError(
        f"no vendor with vendor_id={vendor_id!r}. Vendor ids look like V-100; get_invoice returns the "
        f"invoice's vendor_id.{hint}"
    )


def purchase_order(sor: SystemOfRecord, po_id: str | None) -> dict[str, Any] | None:
    """The PO header, or None when there is no such PO."""
    if not po_id:
        return None
    return sor.reference_row("SELECT * FROM purchase_orders WHERE po_id = ?", [norm_id(po_id)])


def po_lines(sor: SystemOfRecord, po_id: str) -> list[dict[str, Any]]:
    """The PO's lines with the quantity received so far and the line category's tolerances."""
    return sor.reference(
        """
        SELECT l.*, t.price_tolerance_pct, t.qty_tolerance_pct, coalesce(g.received, 0) AS qty_received
        FROM po_lines l
        JOIN tolerance_rules t USING (category)
        LEFT JOIN (SELECT po_id, line_no, sum(qty_received) AS received FROM goods_receipts GROUP BY ALL) g
               USING (po_id, line_no)
        WHERE l.po_id = ? ORDER BY l.line_no
        """,
        [po_id],
    )


def tax_rates(sor: SystemOfRecord) -> dict[str, Decimal]:
    """Tax code -> rate in percent."""
    return {r["tax_code"]: r["rate_pct"] for r in sor.reference("SELECT tax_code, rate_pct FROM tax_codes")}


def currencies(sor: SystemOfRecord) -> list[str]:
    """Currencies the system of record has rates for."""
    return [r["currency"] for r in sor.reference("SELECT DISTINCT currency FROM fx_rates ORDER BY currency")]


def rate_to_gbp(sor: SystemOfRecord, currency: str, on_date: dt.date) -> tuple[Decimal, dt.date]:
    """GBP per unit of `currency` on `on_date`: the latest published rate on or before it."""
    code = norm_id(currency)
    found = sor.reference_row(
        "SELECT rate_to_gbp, rate_date FROM fx_rates WHERE currency = ? AND rate_date <= ? "
        "ORDER BY rate_date DESC LIMIT 1",
        [code, on_date],
    )
    if found is None:
        known = ", ".join(currencies(sor))
        if code not in currencies(sor):
            raise DomainError(f"unknown currency {currency!r}; known currencies: {known}")
        raise DomainError(f"no {code} rate published on or before {on_date.isoformat()}")
    return found["rate_to_gbp"], found["rate_date"]


def convert(
    sor: SystemOfRecord, amount: Decimal, from_currency: str, to_currency: str, on_date: dt.date
) -> tuple[Decimal, Decimal, dt.date]:
    """(converted amount, rate applied, rate date) at the rates in force on `on_date`."""
    src, src_date = rate_to_gbp(sor, from_currency, on_date)
    dst, dst_date = rate_to_gbp(sor, to_currency, on_date)
    rate = src / dst
    return money(amount * rate), rate.quantize(Decimal("0.000001")), max(src_date, dst_date)


def line_amounts(lines: list[dict[str, Any]], rates: dict[str, Decimal]) -> list[tuple[Decimal, Decimal]]:
    """(net, tax) per line: net = qty x unit price, tax = net x rate, each rounded to the penny.

    An unknown tax code contributes no tax (validate_tax_code reports it).
    """
    out = []
    for line in lines:
        net = money(line["qty"] * line["unit_price"])
        out.append((net, money(net * rates.get(line["tax_code"], Decimal(0)) / HUNDRED)))
    return out


def document_gross(sor: SystemOfRecord, doc: dict[str, Any]) -> Decimal:
    """Net + tax + billed freight of a document, in its own currency (what the vendor asks for)."""
    amounts = line_amounts(invoice_lines(sor, doc["invoice_id"]), tax_rates(sor))
    return money(sum((n + t for n, t in amounts), Decimal(0)) + doc["freight"])


def normalise_invoice_number(number: str) -> str:
    """Vendor invoice numbers compare without case, spaces or punctuation: "DP 7781" is "DP-7781"."""
    return re.sub(r"[^A-Z0-9]", "", number.upper())
