"""One GenAI ``chat`` span per proxied model call, under the trial's trace.

An agent with no instrumentation still yields its LLM calls, and the tool calls its model
proposed, because the proxy saw them on the wire. Attributes follow the GenAI semantic
conventions (v1.37+ message JSON, v1.40 cache counts); the trial's ``plumbline.*`` identity rides
on every span so the store joins it to the right trial whatever the agent exports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TracerProvider

from plumbline_otel.replay.identity import TrialIdentity
from plumbline_otel.replay.limits import ProxyLimits, truncate_text
from plumbline_otel.replay.pricing import Usage
from plumbline_otel.replay.proxy.wire import PROVIDER, Api, Reply, input_messages, output_messages

SCOPE = "plumbline_otel.replay.proxy"


@dataclass
class CallRecord:
    """What one proxied call was, for its span."""

    identity: TrialIdentity
    api: Api
    call: int
    request: Mapping[str, object]  # the body the provider was sent (read, never changed)
    started_ns: int
    ended_ns: int
    status: int
    source: str  # live, cache, fault, refused
    reply: Reply | None = None
    usage: Usage | None = None
    cost_usd: float | None = None
    fault: str | None = None


def _attributes(rec: CallRecord, max_payload: int, identity: bool = True) -> dict[str, Any]:
    request = rec.request
    attrs: dict[str, Any] = {
        **(rec.identity.attributes() if identity else {}),
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER[rec.api],
        "gen_ai.request.model": str(request.get("model") or ""),
        "gen_ai.input.messages": orjson.dumps(input_messages(rec.api, request)).decode(),
        "http.response.status_code": rec.status,
        "plumbline.proxy.api": rec.api,
        "plumbline.proxy.call": rec.call,
        "plumbline.proxy.source": rec.source,
    }
    for param, key in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p"),
                       ("seed", "gen_ai.request.seed")):
        if isinstance(request.get(param), (int, float)):
            attrs[key] = request[param]
    max_tokens = request.get("max_tokens") or request.get("max_completion_tokens") or request.get("max_output_tokens")
    if isinstance(max_tokens, int):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    if rec.reply is not None:
        attrs["gen_ai.output.messages"] = orjson.dumps(output_messages(rec.reply)).decode()
        if rec.reply.model:
            attrs["gen_ai.response.model"] = rec.reply.model
        if rec.reply.response_id:
            attrs["gen_ai.response.id"] = rec.reply.response_id
        if rec.reply.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [rec.reply.finish_reason]
    if rec.usage is not None:
        attrs["gen_ai.usage.input_tokens"] = rec.usage.prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = rec.usage.output_tokens
        attrs["gen_ai.usage.cache_read.input_tokens"] = rec.usage.cache_read_tokens
        attrs["gen_ai.usage.cache_creation.input_tokens"] = rec.usage.cache_write_tokens + rec.usage.cache_write_1h_tokens
        if rec.usage.reasoning_tokens:
            attrs["gen_ai.usage.reasoning.output_tokens"] = rec.usage.reasoning_tokens
    if rec.cost_usd is not None:
        attrs["plumbline.proxy.cost_usd"] = rec.cost_usd
    if rec.fault:
        attrs["plumbline.proxy.fault"] = rec.fault
    cut = []
    for key in ("gen_ai.input.messages", "gen_ai.output.messages"):
        if key in attrs:
            attrs[key], was_cut = truncate_text(attrs[key], max_payload)
            if was_cut:
                cut.append(key)
    if cut:
        attrs["plumbline.truncated"] = cut
    return attrs


def emit(provider: TracerProvider, rec: CallRecord, max_payload: int = ProxyLimits.span_payload_bytes,
         parent_context: SpanContext | None = None) -> None:
    """Write ``rec`` as a CLIENT span, child of the trial's virtual root (``export.trial_span_context``).

    Message payloads longer than ``max_payload`` bytes are truncated with a marker
    (``limits.truncate_text``) and named in ``plumbline.truncated``: a span must stay small
    enough for ingest to keep, whatever the agent sent or the model answered. ``parent_context``: record
    mode's conversation (``record.ConversationRecorder``), in place of the trial's root; the span then
    carries no trial identity, being ordinary traffic."""
    from plumbline_otel.replay.export import trial_span_context

    parent = trace.set_span_in_context(NonRecordingSpan(parent_context or trial_span_context(rec.identity)))
    tracer = provider.get_tracer(SCOPE)
    name = f"chat {rec.request.get('model') or ''}".strip()
    span = tracer.start_span(name, context=parent, kind=SpanKind.CLIENT, start_time=rec.started_ns,
                             attributes=_attributes(rec, max_payload, identity=parent_context is None))
    if rec.status >= 400 or rec.fault:
        span.set_status(Status(StatusCode.ERROR, rec.fault or f"HTTP {rec.status}"))
        span.set_attribute("error.type", rec.fault or str(rec.status))
    span.end(end_time=rec.ended_ns)
