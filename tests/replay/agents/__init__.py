"""Agents on real frameworks, written as their users write them: no plumbline code, no tracing.

Each reads the request on stdin and prints ``{"output": …}``. Their model clients take the base
URL from ``OPENAI_BASE_URL`` (the OpenAI SDK's own variable), so `plumbline replay --proxy` reaches
them with no code change; the MCP-tooled one finds its tool server at ``AP_MCP_URL``, its own
setting, which the adapter command points at the proxy's per-trial URL.
"""
