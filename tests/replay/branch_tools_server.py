"""A scripted tool server for the branch-point replay tests (issue 44): the accounts-payable tools the framework
fixtures were recorded with (tests/fixtures/frameworks/common.py: same names, arguments and JSON results), over MCP
stdio, each call appended to the file named by its first argument so a test counts what reached the server."""

from __future__ import annotations

import json
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("ap-fixture-tools")
INVOICES = {"INV-1001": {"vendor": "Acme GmbH", "amount": 4820.0, "currency": "EUR"}}


def _log(name: str, **args: object) -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else None
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": name, "args": args}) + "\n")


@server.tool()
def lookup_invoice(invoice_id: str) -> str:
    """Fetch an invoice by its id."""
    _log("lookup_invoice", invoice_id=invoice_id)
    return json.dumps({"invoice_id": invoice_id, **INVOICES.get(invoice_id, {}), "status": "open"})


@server.tool()
def check_duplicate(invoice_id: str, vendor: str) -> str:
    """Check whether the vendor's invoice was already paid or is already scheduled."""
    _log("check_duplicate", invoice_id=invoice_id, vendor=vendor)
    return json.dumps({"invoice_id": invoice_id, "vendor": vendor, "duplicate": False, "matches": []})


@server.tool()
def schedule_payment(invoice_id: str, amount: float, currency: str) -> str:
    """Schedule the payment of an invoice."""
    _log("schedule_payment", invoice_id=invoice_id, amount=amount, currency=currency)
    return json.dumps({"payment_id": "PAY-" + invoice_id.split("-")[1], "invoice_id": invoice_id,
                       "amount": amount, "currency": currency, "status": "scheduled"})


if __name__ == "__main__":
    server.run("stdio")
