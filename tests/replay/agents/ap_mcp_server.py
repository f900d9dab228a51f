"""The agents' tool server: lookup_invoice and pay over MCP stdio (the proxy launches and bridges it)."""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer

server = MCPServer("ap-tools")


@server.tool()
def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice by its id."""
    return json.dumps({"invoice_id": invoice_id, "status": "open"})


@server.tool()
def pay(invoice_id: str) -> str:
    """Pay an invoice by its id."""
    return json.dumps({"paid": invoice_id})


if __name__ == "__main__":
    server.run("stdio")
