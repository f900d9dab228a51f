"""One span per ``tools/call`` the MCP proxy answered, in the GenAI and MCP semantic conventions.

Several instrumentations leave a tool call's arguments and result off their spans; the proxy saw
both on the wire, so it writes them (``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result``,
JSON text) on an ``execute_tool`` span under the trial's virtual root
(``export.trial_span_context``). The trial's ``plumbline.*`` identity rides on every span, and a
call the proxy failed on purpose carries ``plumbline.fault.injected`` and
``plumbline.fault.source = mcp_proxy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from plumbline_otel.replay.identity import TrialIdentity
from plumbline_otel.replay.limits import ProxyLimits, truncate_text
from plumbline_otel.runs import FAULT_INJECTED, FAULT_SOURCE

SCOPE = "plumbline_otel.replay.mcp_proxy"
SOURCE = "mcp_proxy"


@dataclass
class ToolCallRecord:
    """What one ``tools/call`` was, for its span."""

    identity: TrialIdentity
    tool: str
    call: int  # 1-based index among this attempt's calls of the tool
    arguments: Mapping[str, object] | None
    started_ns: int
    ended_ns: int
    source: str  # upstream, fault, decoy
    protocol_version: str = ""
    request_id: str | int | None = None
    tool_call_id: str | None = None
    result: str | None = None  # the CallToolResult on the wire (camelCase JSON), truncated past the span payload limit
    truncated: list[str] = field(default_factory=list)  # attributes cut to the span payload limit
    is_error: bool = False
    error_type: str | None = None  # a protocol-level failure (no result)
    error_message: str | None = None
    fault_kind: str | None = None


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def attributes(rec: ToolCallRecord, max_payload: int = ProxyLimits.span_payload_bytes, identity: bool = True) -> dict[str, AttributeValue]:
    """The span's attributes; arguments and result past ``max_payload`` bytes truncated with ingest's marker rule
    (``limits.truncate_text``) and named in ``plumbline.truncated``, so a 100 MiB tool result costs a bounded span."""
    arguments, arguments_cut = truncate_text(_json(rec.arguments or {}), max_payload)
    truncated = [*(["gen_ai.tool.call.arguments"] if arguments_cut else []), *rec.truncated]
    attrs: dict[str, AttributeValue] = {
        **(rec.identity.attributes() if identity else {}),
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": rec.tool,
        "gen_ai.tool.type": "extension",  # of the conventions' function / extension / datastore: a tool reached through a service
        "gen_ai.tool.call.arguments": arguments,
        "mcp.method.name": "tools/call",
        "plumbline.mcp.call": rec.call,
        "plumbline.mcp.source": rec.source,
    }
    if rec.protocol_version:
        attrs["mcp.protocol.version"] = rec.protocol_version
    if rec.request_id is not None:
        attrs["jsonrpc.request.id"] = str(rec.request_id)
    if rec.tool_call_id:
        attrs["gen_ai.tool.call.id"] = rec.tool_call_id
    if rec.result is not None:
        attrs["gen_ai.tool.call.result"] = rec.result
    if truncated:
        attrs["plumbline.truncated"] = truncated
    if rec.fault_kind is not None:
        attrs[FAULT_INJECTED] = True
        attrs[FAULT_SOURCE] = SOURCE
        attrs["plumbline.mcp.fault"] = rec.fault_kind
    return attrs


def emit(provider: TracerProvider, rec: ToolCallRecord, max_payload: int = ProxyLimits.span_payload_bytes,
         parent_context: SpanContext | None = None) -> None:
    """Write ``rec`` as a CLIENT span (the proxy calls the tool for the agent), child of the trial's root
    (or, in record mode, of the agent conversation ``parent_context``, with no trial identity)."""
    from plumbline_otel.replay.export import trial_span_context

    parent = trace.set_span_in_context(NonRecordingSpan(parent_context or trial_span_context(rec.identity)))
    span = provider.get_tracer(SCOPE).start_span(f"tools/call {rec.tool}", context=parent, kind=SpanKind.CLIENT,
                                                 start_time=rec.started_ns,
                                                 attributes=attributes(rec, max_payload, identity=parent_context is None))
    if rec.error_type is not None:
        span.set_status(Status(StatusCode.ERROR, rec.error_message or rec.error_type))
        span.set_attribute("error.type", rec.error_type)
    elif rec.is_error:
        span.set_status(Status(StatusCode.ERROR, rec.error_message or "tool_error"))
        span.set_attribute("error.type", "tool_error")  # the MCP conventions' value for a result with isError
    span.end(end_time=rec.ended_ns)
