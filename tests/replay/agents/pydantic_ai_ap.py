"""An accounts-payable agent on pydantic-ai (OpenAI Chat Completions), with plain tools."""

from __future__ import annotations

import json
import sys

from pydantic_ai import Agent

agent = Agent("openai:gpt-4o-mini", system_prompt="Look the invoice up, then pay it.")


@agent.tool_plain
def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice by its id."""
    return json.dumps({"invoice_id": invoice_id, "status": "open"})


@agent.tool_plain
def pay(invoice_id: str) -> str:
    """Pay an invoice by its id."""
    return json.dumps({"paid": invoice_id})


if __name__ == "__main__":
    print(json.dumps({"output": agent.run_sync(sys.stdin.read()).output}))
