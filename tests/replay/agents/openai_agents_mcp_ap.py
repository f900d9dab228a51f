"""The OpenAI Agents SDK agent with its tools on an MCP server (Streamable HTTP at ``AP_MCP_URL``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import Agent, Runner
from agents.mcp import MCPServerStreamableHttp


async def main(text: str) -> str:
    async with MCPServerStreamableHttp(params={"url": os.environ["AP_MCP_URL"]}, cache_tools_list=False) as server:
        agent = Agent(name="ap", instructions="Look the invoice up, then pay it.", mcp_servers=[server], model="gpt-4o-mini")
        return str((await Runner.run(agent, text)).final_output)


if __name__ == "__main__":
    print(json.dumps({"output": asyncio.run(main(sys.stdin.read()))}))
