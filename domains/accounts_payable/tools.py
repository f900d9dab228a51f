"""The sixteen tools an accounts-payable agent sees, their JSON schemas, and one way to call them.

`call_tool(sor, name, args)` is the only entry point agents, ground truth and tests use: it
checks the arguments against the tool's schema (so a model's malformed call gets a sentence it
can act on, never a Python traceback), runs the tool on that trial's system of record and returns
a JSON-serialisable dict. Effect tools (`effect=True`) are the ones that change the world; the
others only read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domains.accounts_payable import actions, checks
from domains.accounts_payable.errors import DomainError, TransientToolError
from domains.accounts_payable.system_of_record import SystemOfRecord, to_json

__all__ = ["TOOLS", "DomainError", "Tool", "TransientToolError", "call_tool", "tool_specs"]


@dataclass(frozen=True)
class Tool:
    """One tool: what the model sees (name, description, input_schema) and what runs (fn)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[[SystemOfRecord, dict[str, Any]], Any]
    effect: bool

    def spec(self) -> dict[str, Any]:
        """The tool in the Anthropic tools format."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


def _str(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": description}


def _num(description: str) -> dict[str, Any]:
    return {"type": "number", "description": description}


def _schema(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": [p for p in properties if p not in optional],
        "additionalProperties": False,
    }


_INVOICE = {"invoice_id": _str("Document id, e.g. INV-1001 (not the vendor's own invoice number).")}

_DEFS: list[tuple[str, str, dict[str, Any], Callable[[SystemOfRecord, dict[str, Any]], Any], bool]] = [
    ("get_invoice",
     "Fetch an invoice or credit note: header (vendor_id, vendor_name, po_id, dates, currency, freight, "
     "document_type, references_invoice_id) and lines, with net, tax and gross totals.",
     _schema(_INVOICE), checks.get_invoice, False),
    ("three_way_match",
     "Match each invoice line against its purchase-order line and the goods received. Price tolerance depends on "
     "the PO line's category. Returns per-line status and reason codes (PRICE_VARIANCE, QTY_OVER_RECEIVED, "
     "QTY_OVER_ORDERED, NOT_RECEIVED, UNKNOWN_ITEM; NO_PO when there is no PO), plus passed and reason_codes.",
     _schema(_INVOICE), checks.three_way_match, False),
    ("check_duplicate",
     "Compare a document with the vendor's documents already in the ledger. Returns a confidence from 0 to 1 "
     "(1.0 same number and amount, 0.9 same number, 0.7 same amount on the same PO), the matched invoice id, "
     "is_duplicate (confidence at or above hold_threshold), passed and reason_codes.",
     _schema(_INVOICE), checks.check_duplicate, False),
    ("check_vendor_status",
     "Vendor master check: status (active or hold), sanctions flag, payment currency and terms, and other vendor "
     "records sharing its bank account. Returns passed and reason_codes.",
     _schema({"vendor_id": _str("Vendor id, e.g. V-100 (get_invoice returns it).")}),
     checks.check_vendor_status, False),
    ("validate_po",
     "Check the invoice's purchase order: it exists and belongs to the vendor, is open, had not expired on the "
     "invoice date, and is not dated after the invoice. Returns passed and reason_codes.",
     _schema(_INVOICE), checks.validate_po, False),
    ("validate_tax_code",
     "Check each invoice line's tax code is known and equals the tax code on its purchase-order line. "
     "Returns per-line status, tax_total, passed and reason_codes.",
     _schema(_INVOICE), checks.validate_tax_code, False),
    ("convert_currency",
     "Convert an amount between currencies at the rates in force on a date (the latest rate published on or "
     "before it).",
     _schema({"amount": _num("Amount to convert."), "from_currency": _str("ISO code, e.g. EUR."),
              "to_currency": _str("ISO code, e.g. GBP."), "on_date": _str("Date as YYYY-MM-DD.")}),
     checks.convert_currency, False),
    ("check_fx_variance",
     "For a foreign-currency invoice, compare the exchange rate on the PO date with the rate on the invoice date "
     "against the FX tolerance; flags an invoice billed in a currency other than its PO's. Returns variance_pct, "
     "tolerance_pct, passed and reason_codes.",
     _schema(_INVOICE), checks.check_fx_variance, False),
    ("check_freight",
     "Check the freight billed on the invoice against the freight its purchase order authorises. Returns "
     "passed and reason_codes.",
     _schema(_INVOICE), checks.check_freight, False),
    ("calculate_payable_amount",
     "Compute what to pay: net + tax + authorised freight - settlement discount (terms percentage of net), "
     "converted to the vendor's payment currency at the invoice-date rate. Returns payable_amount, "
     "payment_currency, amount_gbp and the parts. Credit notes come out negative, with credit_amount.",
     _schema(_INVOICE), checks.calculate_payable_amount, False),
    ("get_approval_requirement",
     "Look up the approval band and the approver role the approval matrix requires for an amount. Bands are "
     "in GBP; for another currency give on_date so the amount can be converted.",
     _schema({"amount": _num("Amount to be paid."),
              "currency": _str("ISO code of the amount; default GBP."),
              "on_date": _str("Date for the conversion, YYYY-MM-DD (the invoice date); needed unless GBP.")},
             optional=("currency", "on_date")),
     checks.get_approval_requirement, False),
    ("request_approval",
     "Request approval of a payment from an approver role (ap_clerk, controller, finance_director, cfo). "
     "Refused when the role's authority limit is below the amount.",
     _schema({**_INVOICE, "approver_role": _str("Role to approve, e.g. controller."),
              "amount": _num("Amount to be paid."), "currency": _str("ISO code of the amount, e.g. GBP.")}),
     actions.request_approval, True),
    ("schedule_payment",
     "Schedule payment of a document to its vendor. The payment date follows the vendor's terms.",
     _schema({**_INVOICE, "amount": _num("Amount to pay, two decimal places."),
              "currency": _str("ISO code of the payment currency, e.g. GBP.")}),
     actions.schedule_payment, True),
    ("apply_credit_note",
     "Apply a credit note's value against an invoice it credits.",
     _schema({"credit_note_id": _str("Document id of the credit note, e.g. INV-1013."),
              "against_invoice_id": _str("Document id of the invoice being credited."),
              "amount": _num("Positive amount to apply, in the credit note's currency.")}),
     actions.apply_credit_note, True),
    ("flag_exception",
     "Put a document on hold under an exception reason code, with a note for the AP team.",
     _schema({**_INVOICE, "reason_code": _str("Reason code, e.g. PRICE_VARIANCE."),
              "note": _str("What was found, including any further blockers.")}),
     actions.flag_exception, True),
    ("post_audit_log",
     "Append an entry to the audit log for a document.",
     _schema({**_INVOICE, "action": _str("What was done, e.g. paid, held, credit_applied."),
              "detail": {"type": "string", "description": "Free-text detail."}}, optional=("detail",)),
     actions.post_audit_log, True),
]

TOOLS: dict[str, Tool] = {name: Tool(name, desc, schema, fn, effect) for name, desc, schema, fn, effect in _DEFS}


def tool_specs(names: list[str] | None = None) -> list[dict[str, Any]]:
    """The tools (all, or the named ones in that order) in the Anthropic tools format."""
    return [TOOLS[n].spec() for n in (names if names is not None else list(TOOLS))]


def call_tool(sor: SystemOfRecord, name: str, args: dict[str, Any] | None) -> dict[str, Any]:
    """Validate `args` against the tool's schema, run it, and return a JSON-serialisable dict.

    Raises DomainError with a readable message for an unknown tool, a malformed call, or a call
    the system of record refuses.
    """
    tool = TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        raise DomainError(f"unknown tool {name!r}; available tools: {', '.join(TOOLS)}")
    result = tool.fn(sor, validate_args(tool, args))
    return to_json(result)


_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "string": ("a string", lambda v: isinstance(v, str)),
    "number": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
    "integer": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "boolean": ("true or false", lambda v: isinstance(v, bool)),
}


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _signature(tool: Tool) -> str:
    schema = tool.input_schema
    parts = [f"{p} ({s['type']}{'' if p in schema['required'] else ', optional'})"
             for p, s in schema["properties"].items()]
    return f"{tool.name}({', '.join(parts)})"


def validate_args(tool: Tool, args: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments checked against the tool's schema; null optional arguments are dropped."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise DomainError(f"{tool.name}: arguments must be a JSON object, got {type(args).__name__}; "
                          f"expected {_signature(tool)}")
    schema = tool.input_schema
    props, required = schema["properties"], schema["required"]
    missing = [p for p in required if args.get(p) is None]
    if missing:
        raise DomainError(f"{tool.name}: missing required argument {', '.join(map(repr, missing))}; "
                          f"expected {_signature(tool)}")
    unexpected = [k for k in args if k not in props]
    if unexpected:
        raise DomainError(f"{tool.name}: unexpected argument {', '.join(map(repr, unexpected))}; "
                          f"expected {_signature(tool)}")
    clean = {}
    for key, value in args.items():
        if value is None:
            continue
        kind, ok = _TYPES[props[key]["type"]]
        if not ok(value):
            raise DomainError(f"{tool.name}: argument {key!r} must be {kind}, got {_json_type(value)} {value!r}")
        if props[key].get("minLength") and not value.strip():
            raise DomainError(f"{tool.name}: argument {key!r} must not be empty")
        clean[key] = value
    return clean
