"""An accounts-payable agent on LangGraph's prebuilt ReAct agent with LangChain's ChatOpenAI."""

from __future__ import annotations

import json
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice by its id."""
    return json.dumps({"invoice_id": invoice_id, "status": "open"})


@tool
def pay(invoice_id: str) -> str:
    """Pay an invoice by its id."""
    return json.dumps({"paid": invoice_id})


if __name__ == "__main__":
    graph = create_react_agent(ChatOpenAI(model="gpt-4o-mini"), [lookup_invoice, pay])
    state = graph.invoke({"messages": [("user", sys.stdin.read())]})
    print(json.dumps({"output": state["messages"][-1].content}))
