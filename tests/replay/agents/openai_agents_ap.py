"""An accounts-payable agent on the OpenAI Agents SDK (Responses API), with local function tools."""

from __future__ import annotations

import json
import sys

from agents import Agent, Runner, function_tool


@function_tool
def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice by its id."""
    return json.dumps({"invoice_id": invoice_id, "status": "open"})


@function_tool
def pay(invoice_id: str) -> str:
    """Pay an invoice by its id."""
    return json.dumps({"paid": invoice_id})


if __name__ == "__main__":
    agent = Agent(name="ap", instructions="Look the invoice up, then pay it.", tools=[lookup_invoice, pay], model="gpt-4o-mini")
    print(json.dumps({"output": Runner.run_sync(agent, sys.stdin.read()).final_output}))
