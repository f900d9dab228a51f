"""The MCP proxy: replay any agent whose MCP server URL can be set, with no code change.

A loopback Streamable HTTP server in front of one MCP server (a Streamable HTTP URL, or a stdio
command it launches and bridges). For each trial's attempt (``McpProxy.open_trial``) it fails the
planned tool (``tool_fault``: the plan's error as an ``isError`` result, the server never called),
adds the trial's decoys to ``tools/list`` (``decoy_tools``: a call to one is answered with an error,
never forwarded), writes an ``execute_tool`` span per ``tools/call`` with its arguments and result
under the trial's trace, and hands back what it witnessed (``McpProxy.close_trial`` → ``McpEvidence``).
The same interface as ``replay.proxy.ModelProxy``:

    proxy = McpProxy(["python", "tools_server.py"], tracer_provider=provider)
    proxy.start()
    route = proxy.open_trial(trial, budget)
    run_agent(env={**os.environ, **route.env()})   # PLUMBLINE_MCP_URL=http://127.0.0.1:PORT/t/<token>/mcp
    evidence = proxy.close_trial(route)
    proxy.stop()
"""

from plumbline_otel.replay.mcp_proxy.evidence import McpEvidence
from plumbline_otel.replay.mcp_proxy.server import McpProxy, McpRoute

__all__ = ["McpEvidence", "McpProxy", "McpRoute"]
