"""Normalise: where a span becomes a step.

`normalise_request` turns every span of an `ExportTraceServiceRequest` into a `SpanRecord`
(`normalise_span`, one span), detecting the convention span by span (`_extract`: OpenInference,
GenAI in its current and older forms, Traceloop, frameworks' own namespaces), reading chat messages
in every producer's shape into one form (`parse_messages`) and unwrapping the wrappers frameworks
put around arguments, requests and results (`_shapes`, named for coverage). A span's links are kept
with their attribution. A value that breaks a limit (`Limits`) is dropped from its span (and
counted in `dropped_attributes_count`) with a `Problem` naming the span and key, and impossible
timestamps are repaired and reported; the span and its neighbours are kept.

Content some distributions write to log records rather than span attributes is read here too:
`log_rows` makes the store's ``logs`` rows (``gen_ai.*`` events, keyed by trace and span), and
`fold_logs` folds a span's records into it when the store assembles its trace
(`log_event_attributes` reads one stored record).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from plumbline_otel.decode import Problem
from plumbline_otel.model import SpanLink, SpanRecord
from plumbline_otel.normalise import _extract
from plumbline_otel.normalise._extract import VENDOR_ARGS_KEYS, VENDOR_RESULT_KEYS, begins_new_turn, call_messages
from plumbline_otel.normalise._logs import LogRows, log_rows
from plumbline_otel.normalise._messages import Message, parse_messages
from plumbline_otel.normalise._shapes import unwrap_scoped_result
from plumbline_otel.normalise._values import Limits, ValueRejected, any_value, as_text, maybe_json, unflatten

__all__ = ["VENDOR_ARGS_KEYS", "VENDOR_RESULT_KEYS", "Limits", "LogRows", "Message", "ValueRejected", "any_value", "as_text",
           "begins_new_turn", "call_messages", "fold_logs", "log_event_attributes", "log_rows", "maybe_json", "normalise_request", "normalise_span", "parse_messages",
           "unflatten", "unwrap_scoped_result"]

# Attribute namespaces we read, and frameworks' own namespaces where content may sit: a key in them that we do
# not know is reported by coverage, on any span (a framework's span in no convention we read included).
_NAMESPACES = ("gen_ai.", "llm.", "tool.", "openinference.", "traceloop.", "ai.", "mastra.", "crewai.", "haystack.", "dspy.",
               "langfuse.")
_KNOWN_PREFIXES = (
    "gen_ai.operation.", "gen_ai.provider.", "gen_ai.system", "gen_ai.request.", "gen_ai.response.",
    "gen_ai.usage.", "gen_ai.tool.", "gen_ai.input.messages", "gen_ai.output.messages",
    "gen_ai.conversation.", "gen_ai.agent.", "gen_ai.handoff.", "gen_ai.prompt", "gen_ai.completion", "gen_ai.output.type", "gen_ai.guardrail.",
    "gen_ai.openai.", "gen_ai.data_source.", "gen_ai.workflow.",
    "llm.input_messages", "llm.output_messages", "llm.model_name", "llm.token_count.", "llm.provider",
    "llm.system", "llm.invocation_parameters", "llm.tools", "llm.request.", "llm.response.",
    "llm.usage.", "llm.is_streaming", "llm.headers", "llm.finish_reason", "llm.cost.", "llm.prompts", "llm.choices",
    "tool.name", "tool.description", "tool.parameters", "tool.id", "tool.json_schema", "tool_call.",
    "openinference.span.kind", "traceloop.span.kind", "traceloop.entity.", "traceloop.workflow.",
    "traceloop.association.properties.",
    # The Vercel AI SDK's own keys (read: operationId, prompt, response text and tool calls, usage, toolCall.*).
    "ai.operationId", "ai.telemetry.", "ai.model.", "ai.settings.", "ai.request.", "ai.prompt", "ai.response.",
    "ai.usage.", "ai.toolCall.", "ai.stream.", "ai.schema", "ai.value", "ai.embedding", "ai.values",
    # Mastra's exporter (read: agent_run and model_step input/output; the rest is its bookkeeping).
    "mastra.span.type", "mastra.agent_run.", "mastra.workflow_run.", "mastra.model_step.", "mastra.model_generation.",
    "mastra.model_chunk.", "mastra.metadata.", "mastra.tags", "mastra.completion_start_time",
    # CrewAI's keys under Traceloop (read: the crew's tasks, inputs and result, a task's description).
    "crewai.crew.tasks", "crewai.crew.inputs", "crewai.crew.result", "crewai.task.description",
    # Langfuse's (read: observation type, input, output, model, usage, level; the rest is its bookkeeping).
    "langfuse.observation.type", "langfuse.observation.input", "langfuse.observation.output", "langfuse.observation.model.",
    "langfuse.observation.usage_details", "langfuse.observation.level", "langfuse.observation.status_message",
    "langfuse.observation.metadata.", "langfuse.observation.completion_start_time", "langfuse.internal.",
    "langfuse.observation.cost_details", "langfuse.trace.input", "langfuse.trace.output", "langfuse.trace.name",
    "langfuse.trace.tags", "langfuse.environment", "langfuse.release", "langfuse.version",
)


# What a key is to the rules, looked up once per key read (`_attributes`), not by scanning every span's map for
# each question: a key in a namespace we read but do not know (coverage reports it: `unknown_keys`). Bounded:
# cleared when full (ids in keys would otherwise grow it without end).
_UNKNOWN_KEY = 1
_ROLES: dict[str, int] = {}
_ROLES_MAX = 65536


def _role(key: str) -> int:
    role = _ROLES.get(key)
    if role is None:
        if len(_ROLES) >= _ROLES_MAX:
            _ROLES.clear()
        role = _ROLES[key] = _UNKNOWN_KEY if key.startswith(_NAMESPACES) and not key.startswith(_KNOWN_PREFIXES) else 0
    return role


def _attributes(pairs: Any, limits: Limits, where: str, problems: list[Problem]) -> tuple[dict[str, Any], int, int]:
    """The pairs as a map, the count of values dropped (reported in `problems`), and the roles of the keys read (`_role`)."""
    attrs: dict[str, Any] = {}
    dropped = 0
    roles = 0
    max_bytes = limits.max_value_bytes
    kv: KeyValue
    for i in range(len(pairs)):  # by index: iterating a repeated field ends in an IndexError, formatted (~1 µs)
        kv = pairs[i]
        value = kv.value
        key = kv.key
        text = value.string_value  # the common case, read without the oneof dispatch
        if text and len(text) <= max_bytes:
            attrs[key] = text
        else:
            try:
                attrs[key] = any_value(value, limits)
            except (ValueRejected, RecursionError) as exc:
                dropped += 1
                problems.append(Problem(f"{where} attribute {key!r}", f"dropped: {exc}"))
                continue
        roles |= _role(key)
    return attrs, dropped, roles


def _unknown_keys(attrs: dict[str, Any], roles: int) -> list[str]:
    return sorted(k for k in attrs if _role(k) & _UNKNOWN_KEY) if roles & _UNKNOWN_KEY else []


# What a link means, on the link (semantic-conventions-genai, Development; the values: `SpanLink`).
_LINK_TYPE_KEY = "gen_ai.attribution.link_type"


def _links(span: Span, limits: Limits, where: str, problems: list[Problem]) -> list[SpanLink]:
    """The span's links with their attribution (`_LINK_TYPE_KEY`); a link with invalid ids is dropped, and said so."""
    out = []
    for i, link in enumerate(span.links):
        if len(link.trace_id) != 16 or len(link.span_id) != 8 or not any(link.trace_id) or not any(link.span_id):
            problems.append(Problem(f"{where} links[{i}]", f"link dropped: trace id {link.trace_id.hex()[:40]!r} / span id "
                                                           f"{link.span_id.hex()[:40]!r} are not valid OTLP ids"))
            continue
        attrs, _, _ = _attributes(link.attributes, limits, f"{where} links[{i}]", problems)
        kind = attrs.get(_LINK_TYPE_KEY)
        out.append(SpanLink(link.trace_id.hex(), link.span_id.hex(), kind if isinstance(kind, str) else None))
    return out


def normalise_span(span: Span, resource: dict[str, Any], scope_name: str, limits: Limits, problems: list[Problem]) -> SpanRecord:
    """One protobuf span to one `SpanRecord`; limit breaches are appended to `problems`."""
    span_id = span.span_id.hex()
    where = f"span {span_id}"
    attrs, dropped, roles = _attributes(span.attributes, limits, where, problems)
    events = []
    timed = []
    span_events = span.events
    for e in range(len(span_events)):  # by index, as `_attributes` reads its pairs; most spans have none
        event = span_events[e]
        event_attrs, _, _ = _attributes(event.attributes, limits, f"{where} event {event.name!r}", problems)
        events.append((event.name, event_attrs))
        timed.append((event.name, event_attrs, event.time_unix_nano))
    convention, step_kind = _extract.detect(attrs)
    rec = SpanRecord(
        trace_id=span.trace_id.hex(),
        span_id=span_id,
        parent_span_id=span.parent_span_id.hex() or None,
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        kind=span.kind,
        status_code=span.status.code,
        status_message=span.status.message,
        service_name=as_text(resource.get("service.name")),
        service_version=as_text(resource.get("service.version")),
        scope_name=scope_name,
        convention=convention,
        step_kind=step_kind,
        dropped_attributes_count=span.dropped_attributes_count + dropped,
        attributes=attrs,
        resource=resource,
    )
    if span.links:
        rec.links = _links(span, limits, where, problems)
    _extract.extract(rec, attrs, events)
    _extract.guardrail_span(rec, attrs)
    if timed:
        _extract.add_run_events(rec, timed)
    rec.unknown_keys = _unknown_keys(attrs, roles)
    return rec


def log_event_attributes(attributes: str | None, body: str | None) -> dict[str, Any]:
    """A stored log record (JSON attributes and body) as event attributes: a map body's keys beneath the attributes."""
    attrs = orjson.loads(attributes) if attributes else {}
    content = orjson.loads(body) if body else None
    if isinstance(content, dict):
        return {**content, **attrs}
    return {"content": content, **attrs} if content not in (None, "") else attrs


def fold_logs(records: list[SpanRecord], events: dict[str, list[tuple[str, dict[str, Any], int]]]) -> list[SpanRecord]:
    """The trace's span records with the log records of each span (by span id, as (event name, attributes,
    time)) folded in; others unchanged.

    A folded record is a copy: the caller's records (a shard's, a writer's) are never changed.
    """
    out = []
    for rec in records:
        own = events.get(rec.span_id)
        if own:
            rec = replace(rec, evidence=list(rec.evidence), decisions=list(rec.decisions), shapes=list(rec.shapes),
                          run_events=list(rec.run_events))
            _extract.fold_events(rec, [(name, attrs) for name, attrs, _ in own])
            _extract.add_run_events(rec, own)
        out.append(rec)
    return out


def normalise_request(request: ExportTraceServiceRequest, limits: Limits | None = None,
                      keep: Callable[[bytes], bool] | None = None) -> tuple[list[SpanRecord], list[Problem]]:
    """Every span of a request as a `SpanRecord`, plus the problems met on the way.

    `keep`, given a span's trace id, says whether to read the span at all (a shard reads the
    spans it owns, and skips the rest without copying the request).
    """
    limits = limits or Limits()
    problems: list[Problem] = []
    records: list[SpanRecord] = []
    for resource_spans in request.resource_spans:
        resource, _, _ = _attributes(resource_spans.resource.attributes, limits, "resource", problems)
        for scope_spans in resource_spans.scope_spans:
            scope_name = scope_spans.scope.name
            for span in scope_spans.spans:
                if keep is not None and not keep(span.trace_id):
                    continue
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    problems.append(Problem(f"span {span.span_id.hex() or '?'}", "trace id must be 16 bytes and span id 8 bytes", spans=1))
                    continue
                rec = normalise_span(span, resource, scope_name, limits, problems)
                _repair_times(rec, problems)
                records.append(rec)
    return records, problems


def _repair_times(rec: SpanRecord, problems: list[Problem]) -> None:
    """Keep a span with impossible timestamps, reported, with times that order it sensibly.

    A missing start takes the end (and the reverse), and an end before the start is moved to the
    start, so the span sorts where it happened and never gets a negative duration.
    """
    start, end = rec.start_ns, rec.end_ns
    if start and end and end >= start:
        return
    if not start and not end:
        reason = "has no start or end time (kept, ordered first)"
    elif not start:
        reason, rec.start_ns = f"has no start time (kept, ordered by its end {end})", end
    elif not end:
        reason, rec.end_ns = f"has no end time (kept, ended at its start {start})", start
    else:
        reason, rec.end_ns = f"ends ({end}) before it starts ({start}) (kept, ended at its start)", start
    problems.append(Problem(f"span {rec.span_id}", reason))
