"""OpenTelemetry for the accounts-payable arms: providers, exporters and GenAI span helpers.

The arms write their spans by hand with the SDK tracer in the current GenAI semantic
conventions (no instrumentation library), so every attribute the product reads is produced here:

    invoke_agent {arm}          root, one per task run (= one trace)
    ├── chat {model}            one per Messages API call
    └── execute_tool {tool}     one per tool call, failed attempts included

Exports go to an OTLP endpoint (gRPC on :4317 or HTTP on :4318/v1/traces), to an OTLP JSON-lines
file (one ``ExportTraceServiceRequest`` JSON object per line with lowercase hex ids, the way the
Collector's file exporter writes them), or to any ``SpanExporter`` a caller passes (tests use
``InMemorySpanExporter``).

Content capture: tool-call arguments and results are always recorded on ``execute_tool`` spans
(the product's argument invariants depend on them); chat message content
(``gen_ai.input.messages``, ``gen_ai.output.messages``, ``gen_ai.system_instructions``) is recorded
when ``capture_content`` is on, which is the default for these reference agents.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from plumbline_otel.replay import OtlpJsonFileExporter, exporter_for_endpoint
from plumbline_otel.replay.identity import TrialIdentity  # the one trial identity, shared with the driver
from plumbline_otel.runs import TASK_KEY

SERVICE_VERSION = "1.0.0"
SCOPE_NAME = "domains.accounts_payable"
PROVIDER_NAME = "anthropic"

# Anthropic stop_reason -> GenAI OutputMessage.finish_reason
_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_call",
    "max_tokens": "length",
    "refusal": "content_filter",
    "pause_turn": "stop",
}


# ---------------------------------------------------------------------------------------------
# Exporters and providers


def make_tracer_provider(
    arm: str,
    *,
    endpoint: str | None = None,
    otlp_file: str | Path | None = None,
    exporter: SpanExporter | None = None,
    trial: TrialIdentity | None = None,
    service_version: str = SERVICE_VERSION,
    batch: bool | None = None,
) -> TracerProvider:
    """A provider whose resource is ``service.name = ap-agent-<arm>``, exporting where asked.

    Exactly one destination is honoured (``exporter``, then ``otlp_file``, then ``endpoint``);
    with none the provider records nothing. OTLP endpoints and files are batched by default (a
    file line is then one export request of many spans, as a Collector writes); a caller's own
    exporter is synchronous, so tests see spans as soon as a trial returns. The caller owns the
    provider: ``force_flush()`` it after each trial to bound what a crash can lose, and
    ``shutdown()`` it at the end.
    """
    attrs: dict[str, Any] = {
        "service.name": f"ap-agent-{arm}",
        "service.version": service_version,
        "service.namespace": "plumbline.domains",
    }
    if trial is not None:
        attrs.update(trial.attributes())
    provider = TracerProvider(resource=Resource.create(attrs))
    chosen: SpanExporter | None = exporter
    network = False  # batched unless the caller passed its own exporter
    if chosen is None and otlp_file is not None:
        chosen = OtlpJsonFileExporter(otlp_file)
        network = True
    if chosen is None and endpoint is not None:
        chosen = exporter_for_endpoint(endpoint)
        network = True
    if chosen is not None:
        use_batch = network if batch is None else batch
        processor = BatchSpanProcessor(chosen) if use_batch else SimpleSpanProcessor(chosen)
        provider.add_span_processor(processor)
    return provider


# ---------------------------------------------------------------------------------------------
# Anthropic <-> GenAI message parts


def _block_to_part(block: Mapping[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind == "tool_use":
        return {
            "type": "tool_call",
            "id": block.get("id"),
            "name": block.get("name"),
            "arguments": block.get("input", {}),
        }
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            content = "".join(c.get("text", "") for c in content if isinstance(c, Mapping))
        part: dict[str, Any] = {
            "type": "tool_call_response",
            "id": block.get("tool_use_id"),
            "response": _maybe_json(content),
        }
        if block.get("is_error"):
            part["is_error"] = True
        return part
    if kind == "thinking":
        return {"type": "reasoning", "content": block.get("thinking", "")}
    return {"type": str(kind), **{k: v for k, v in block.items() if k != "type"}}


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _as_block_dicts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out = []
    for block in content or []:
        if hasattr(block, "model_dump"):
            out.append(block.model_dump(exclude_none=True))
        else:
            out.append(dict(block))
    return out


def to_genai_input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic ``messages`` -> GenAI ChatMessage list; tool results become ``role: tool``."""
    result: list[dict[str, Any]] = []
    for message in messages:
        parts = [_block_to_part(b) for b in _as_block_dicts(message.get("content"))]
        role = message.get("role", "user")
        responses = [p for p in parts if p["type"] == "tool_call_response"]
        others = [p for p in parts if p["type"] != "tool_call_response"]
        if responses:
            result.append({"role": "tool", "parts": responses})
        if others:
            result.append({"role": role, "parts": others})
    return result


def to_genai_output_messages(content: Any, stop_reason: str | None) -> list[dict[str, Any]]:
    """An Anthropic response's content -> one GenAI OutputMessage."""
    parts = [_block_to_part(b) for b in _as_block_dicts(content)]
    return [
        {
            "role": "assistant",
            "parts": parts,
            "finish_reason": _FINISH_REASONS.get(stop_reason or "", stop_reason or "stop"),
        }
    ]


def text_message(role: str, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    """A GenAI message with a single text part."""
    msg: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text}]}
    if finish_reason is not None:
        msg["finish_reason"] = finish_reason
    return msg


def dumps(value: Any) -> str:
    """Compact JSON for attribute values (sorted keys so equal values serialise equally)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


# ---------------------------------------------------------------------------------------------
# Span helpers


@contextmanager
def agent_span(
    tracer: Tracer,
    arm: str,
    task_id: str,
    request_text: str,
    trial: TrialIdentity | None = None,
    model: str | None = None,
) -> Iterator[Span]:
    """The ``invoke_agent {arm}`` root span of one task run."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": arm,
        "gen_ai.conversation.id": task_id,
        TASK_KEY: task_id,  # the conversation is not the task key by default; name the task
        "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.input.messages": dumps([text_message("user", request_text)]),
        "invoice.id": task_id,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    if trial is not None:
        attributes.update(trial.attributes())
    with tracer.start_as_current_span(
        f"invoke_agent {arm}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


def finish_agent_span(span: Span, final_answer: str, error: str | None = None) -> None:
    """Record the run's final answer (and, when the agent failed to act, why)."""
    span.set_attribute(
        "gen_ai.output.messages", dumps([text_message("assistant", final_answer, "stop")])
    )
    if error:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))


@contextmanager
def chat_span(
    tracer: Tracer,
    model: str,
    *,
    system: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    max_tokens: int,
    capture_content: bool,
    server_address: str | None = None,
    server_port: int | None = None,
) -> Iterator[Span]:
    """A ``chat {model}`` CLIENT span around one Messages API call; see :func:`record_response`."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
    }
    if server_address:
        attributes["server.address"] = server_address
    if server_port:
        attributes["server.port"] = server_port
    if capture_content:
        attributes["gen_ai.input.messages"] = dumps(to_genai_input_messages(messages))
        if system:
            attributes["gen_ai.system_instructions"] = dumps([{"type": "text", "content": system}])
        if tools:
            attributes["gen_ai.tool.definitions"] = dumps(
                [
                    {
                        "type": "function",
                        "name": t.get("name"),
                        "description": t.get("description"),
                        "parameters": t.get("input_schema"),
                    }
                    for t in tools
                ]
            )
    with tracer.start_as_current_span(
        f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes, record_exception=False
    ) as span:
        try:
            yield span
        except Exception as exc:
            mark_error(span, exc)
            raise


def record_response(span: Span, response: Any, capture_content: bool) -> None:
    """Response attributes of a chat span from an ``anthropic.types.Message``."""
    span.set_attribute("gen_ai.response.model", response.model)
    span.set_attribute("gen_ai.response.id", response.id)
    finish = _FINISH_REASONS.get(response.stop_reason or "", response.stop_reason or "stop")
    span.set_attribute("gen_ai.response.finish_reasons", [finish])
    usage = response.usage
    span.set_attribute("gen_ai.usage.input_tokens", int(usage.input_tokens or 0))
    span.set_attribute("gen_ai.usage.output_tokens", int(usage.output_tokens or 0))
    for source, target in (
        ("cache_read_input_tokens", "gen_ai.usage.cache_read.input_tokens"),
        ("cache_creation_input_tokens", "gen_ai.usage.cache_creation.input_tokens"),
    ):
        value = getattr(usage, source, None)
        if value:
            span.set_attribute(target, int(value))
    if capture_content:
        span.set_attribute(
            "gen_ai.output.messages",
            dumps(to_genai_output_messages(response.content, response.stop_reason)),
        )


@contextmanager
def tool_span(
    tracer: Tracer,
    name: str,
    call_id: str,
    arguments: Mapping[str, Any],
    description: str | None = None,
    agent_name: str | None = None,
) -> Iterator[Span]:
    """An ``execute_tool {tool}`` span; the caller records the result or the error."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.arguments": dumps(arguments),
    }
    if description:
        attributes["gen_ai.tool.description"] = description
    if agent_name:
        attributes["gen_ai.agent.name"] = agent_name
    with tracer.start_as_current_span(
        f"execute_tool {name}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def mark_error(span: Span, exc: BaseException, error_type: str | None = None) -> None:
    """Mark a span failed the three ways receivers look for: status, error.type, exception event."""
    etype = error_type or type(exc).__name__
    span.set_attribute("error.type", etype)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{etype}: {exc}"))
