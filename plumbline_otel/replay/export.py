"""Where a study's spans go, and the marker span of a trial that could not run.

``SpanSink`` is the study's destination: an OTLP JSON-lines file (what a Collector's file
exporter writes; ``plumbline ingest`` reads it) or an OTLP endpoint (a running
``plumbline serve``). In-process adapters export through ``sink.exporter()``; the file exporter
serialises writers per path, so the driver's markers and an agent's spans can share one file.

``TrialSpanBuffer`` is a span processor for in-process agents: it holds each trace's spans until
the adapter releases them (the trial produced a run) or discards them (the attempt failed, and
a retry or a marker will stand for it), so a trial's spans are exported all or nothing.

``RecordWriter`` writes the driver's records (`plumbline_otel.trials`): one plain root span per
planned trial and per attempt, each in a trace of its own, carrying the trial identity and what
the driver saw (status and reason, the attempt's trace, the fault and who saw it fire, the cost
and whether it was metered). They travel through the same sink as the agent's spans, so every
store that holds a study's runs holds its records too.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from plumbline_otel.replay.identity import TrialIdentity
from plumbline_otel.replay.jsonvalue import JsonObject
from plumbline_otel.runs import RECORD_MAC, RECORD_SPAN
from plumbline_otel.trials import record_mac

SCOPE_NAME = "plumbline_otel.replay"
# A span's ids as OTLP JSON writes them (trace id, then span id: protobuf's field order, which collectors keep too).
_SPAN_IDS = re.compile(rb'"traceId"\s*:\s*"([0-9a-fA-F]{32})"\s*,\s*"spanId"\s*:\s*"([0-9a-fA-F]{16})"')

_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()
_EXPORT_LOCKS: list[threading.Lock] = []  # one per shared exporter: held across a fork, like the path locks


def _path_lock(path: Path) -> threading.Lock:
    key = str(path.resolve())
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(key, threading.Lock())


def _export_lock() -> threading.Lock:
    lock = threading.Lock()
    with _PATH_LOCKS_GUARD:
        _EXPORT_LOCKS.append(lock)
    return lock


def _before_fork() -> None:
    """An isolated attempt forks while other trials export: take every export lock first, so the child
    never starts with one held by a thread it does not have (it would wait on it forever)."""
    _PATH_LOCKS_GUARD.acquire()
    for lock in [*_EXPORT_LOCKS, *_PATH_LOCKS.values()]:
        lock.acquire()


def _after_fork() -> None:
    for lock in [*_EXPORT_LOCKS, *_PATH_LOCKS.values()]:
        lock.release()
    _PATH_LOCKS_GUARD.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def _hex_ids(node: Any) -> Any:
    """Protobuf's JSON writes ids as base64; OTLP JSON writes them as hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
    return node


def to_otlp_json(request: Message) -> JsonObject:
    """A trace or logs export request as OTLP JSON: camelCase keys, integer enums, hex ids, 64-bit integers as strings."""
    found: JsonObject = _hex_ids(json_format.MessageToDict(request, use_integers_for_enums=True))
    return found


class OtlpJsonFileExporter(SpanExporter):
    """Appends one OTLP JSON ``ExportTraceServiceRequest`` line per export (hex ids, int enums)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _path_lock(self.path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = orjson.dumps(to_otlp_json(encode_spans(spans))) + b"\n"
        with self._lock, self.path.open("ab") as fh:
            fh.write(line)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


COST_KEY = "gen_ai.usage.cost.amount"


def _span_costs(spans: Sequence[ReadableSpan]) -> dict[str, dict[str, tuple[float, str | None, str | None]]]:
    """Trace id -> model-call span id -> (amount, currency, source), read by the normaliser (model calls only:
    an agent span's total would count its calls twice)."""
    from plumbline_otel.normalise import normalise_request

    priced = [s for s in spans if s.attributes and COST_KEY in s.attributes]
    out: dict[str, dict[str, tuple[float, str | None, str | None]]] = {}
    if priced:
        for rec in normalise_request(encode_spans(priced))[0]:
            if rec.step_kind == "llm_call" and rec.cost_amount is not None:
                out.setdefault(rec.trace_id, {})[rec.span_id] = (rec.cost_amount, rec.cost_currency, rec.cost_source)
    return out


class _Serialised(SpanExporter):
    """One exporter shared by many threads and providers: one export at a time, shut down once.

    It remembers every span it exported successfully, by trace: that is how the driver sees an
    in-process agent's run arrive, and what had arrived when a trial's evidence window closed. It
    keeps the cost the run's model-call spans reported, too."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._lock = _export_lock()
        self.delivered: dict[str, set[str]] = {}
        self.costs: dict[str, dict[str, tuple[float, str | None, str | None]]] = {}

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            result = self.inner.export(spans)
            if result is SpanExportResult.SUCCESS:
                for span in spans:
                    self.delivered.setdefault(format(span.context.trace_id, "032x"), set()).add(format(span.context.span_id, "016x"))
                for trace_id, costs in _span_costs(spans).items():
                    self.costs.setdefault(trace_id, {}).update(costs)
            return result

    def shutdown(self) -> None:
        pass  # the sink owns the exporter

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class SpanSink:
    """A study's span destination: an OTLP JSON-lines file, an OTLP endpoint, or an exporter."""

    otlp_file: str | None = None
    endpoint: str | None = None
    custom: SpanExporter | None = None
    _exporter: _Serialised | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    _file_spans: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _file_offset: int = field(default=0, repr=False)
    _delivered_elsewhere: set[str] = field(default_factory=set, repr=False)

    def describe(self) -> str:
        return self.otlp_file or self.endpoint or type(self.custom).__name__

    def has_trace(self, trace_id: str) -> bool:
        """Whether spans of ``trace_id`` reached this sink: exported through it, or (an OTLP file
        written by an agent in another process) found in the file."""
        exporter = self._exporter
        if (exporter is not None and trace_id in exporter.delivered) or trace_id in self._delivered_elsewhere:
            return True
        if self.otlp_file:
            with self._lock:
                self._scan_file()
                return trace_id in self._file_spans
        return False

    def span_ids(self, trace_id: str) -> frozenset[str] | None:
        """The span ids of ``trace_id`` that have reached this sink so far (what a trial's evidence window seals),
        or None when the sink cannot know: an endpoint that agents in other processes export to directly."""
        if self.endpoint and not self.otlp_file:
            return None
        found: set[str] = set()
        exporter = self._exporter
        if exporter is not None:
            found |= exporter.delivered.get(trace_id, set())
        if self.otlp_file:
            with self._lock:
                self._scan_file()
                found |= self._file_spans.get(trace_id, set())
        elif trace_id in self._delivered_elsewhere:
            return None  # an isolated child's spans, exported past this process's exporter
        return frozenset(found)

    def wait_for_trace(self, trace_id: str, timeout_s: float, stored: Callable[[str], bool] | None = None) -> bool:
        """``has_trace`` (or ``stored``: the trace is in the store the sink feeds), polled for up to
        ``timeout_s`` with a growing pause (agents export asynchronously)."""
        deadline = time.monotonic() + timeout_s
        pause = 0.02
        while True:
            if self.has_trace(trace_id) or (stored is not None and stored(trace_id)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.5)

    def _scan_file(self) -> None:
        path = Path(self.otlp_file or "")
        if not path.exists():
            return
        with path.open("rb") as fh:
            fh.seek(self._file_offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self._file_offset += end
        for trace_id, span_id in _SPAN_IDS.findall(chunk[:end]):
            self._file_spans.setdefault(trace_id.decode().lower(), set()).add(span_id.decode().lower())

    def reported_cost(self, trace_id: str) -> float | None:
        """What the spans of `trace_id` exported through this sink say the run cost, in USD: the agent's own word,
        which the driver keeps beside its record and never settles on. None when they say nothing, or price in
        another currency (converting would be a guess)."""
        exporter = self._exporter
        costs = list((exporter.costs.get(trace_id) or {}).values()) if exporter is not None else []
        if not costs or any((currency or "USD").upper() != "USD" for _, currency, _ in costs):
            return None
        return sum(amount for amount, _, _ in costs)

    def delivered(self, trace_ids: Sequence[str]) -> None:
        """Traces an isolated attempt's child process exported through its copy of this sink."""
        self._delivered_elsewhere.update(trace_ids)

    def flush_delivered(self) -> list[str]:
        """In an isolated attempt's child: flush the exporter, and the traces it delivered."""
        exporter = self._exporter
        if exporter is None:
            return []
        exporter.force_flush()
        return sorted(exporter.delivered)  # the trace ids

    def exporter(self) -> SpanExporter:
        """The sink's one shared exporter (thread-safe)."""
        with self._lock:
            if self._exporter is None:
                self._exporter = _Serialised(self._build())
            return self._exporter

    def _build(self) -> SpanExporter:
        if self.custom is not None:
            return self.custom
        if self.otlp_file:
            return OtlpJsonFileExporter(self.otlp_file)
        if self.endpoint:
            return exporter_for_endpoint(self.endpoint)
        raise ValueError("a span sink needs an OTLP file, an endpoint or an exporter")

    def close(self) -> None:
        with self._lock:
            if self._exporter is not None:
                self._exporter.inner.force_flush()
                self._exporter.inner.shutdown()
                self._exporter = None


def exporter_for_endpoint(endpoint: str, headers: Mapping[str, str] | None = None, protocol: str | None = None) -> SpanExporter:
    """An OTLP exporter for ``endpoint``, its protocol given, said by the URL, the OTel default of the port
    (4317, 4318), or asked of the endpoint (``otlp.resolve_endpoint``): never guessed from any other port."""
    from plumbline_otel.replay.otlp import resolve_endpoint

    exporter = resolve_endpoint(endpoint, protocol).exporter(headers)
    assert isinstance(exporter, SpanExporter)
    return exporter


class TrialSpanBuffer(SpanProcessor):
    """Holds ended spans per trace until the trial's adapter releases or discards them."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self._held: dict[int, list[ReadableSpan]] = {}
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self._held.setdefault(span.context.trace_id, []).append(span)

    def _take(self, trace_id: str | int) -> list[ReadableSpan]:
        key = int(trace_id, 16) if isinstance(trace_id, str) else trace_id
        with self._lock:
            return self._held.pop(key, [])

    def release(self, trace_id: str | int) -> int:
        """Export the trace's held spans (one export call); returns how many."""
        spans = self._take(trace_id)
        if spans:
            self.exporter.export(spans)
        return len(spans)

    def discard(self, trace_id: str | int) -> int:
        return len(self._take(trace_id))

    def shutdown(self) -> None:
        with self._lock:
            self._held.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def trial_span_context(identity: TrialIdentity) -> SpanContext:
    """The remote span context of the trial's virtual root (trace id fixed per trial)."""
    return SpanContext(int(identity.trace_id, 16), int(identity.parent_span_id, 16), is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))


class _Collected(SpanProcessor):
    """Keeps ended spans until `take`, so the driver's records are exported as one batch."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.spans.append(span)

    def take(self) -> list[ReadableSpan]:
        with self._lock:
            spans, self.spans = self.spans, []
            return spans

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class RecordWriter:
    """Writes the driver's records, one provider per agent label (the records' service is the agent's).

    Each record is signed with the study state's secret `key` (`trials.record_mac`), so certify counts a
    record only if the driver wrote it; each goes into a random trace of its own, which no agent can name
    beforehand to put spans beside it."""

    def __init__(self, sink: SpanSink, key: str) -> None:
        self.sink, self.key = sink, key
        self._providers: dict[tuple[str | None, str | None], TracerProvider] = {}
        self._collected = _Collected()
        self._lock = threading.Lock()
        self.written = 0

    def _provider(self, service: str, version: str | None) -> TracerProvider:
        with self._lock:
            key = (service, version)
            if key not in self._providers:
                attrs = {"service.name": service, **({"service.version": version} if version else {})}
                provider = TracerProvider(resource=Resource(attrs))  # exactly what is signed: no variable of the environment
                provider.add_span_processor(self._collected)
                self._providers[key] = provider
            return self._providers[key]

    def add(self, identity: TrialIdentity, attributes: Mapping[str, AttributeValue | None], *, service: str | None, version: str | None = None) -> None:
        """One signed root span in a random trace of its own, sent at the next `flush`."""
        service = service or "unknown_service"
        tracer = self._provider(service, version).get_tracer(SCOPE_NAME)
        parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            secrets.randbits(127) | 1, secrets.randbits(63) | 1, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        values = {k: v for k, v in {**identity.attributes(), **attributes}.items() if v is not None}
        values[RECORD_MAC] = record_mac(self.key, values, service, version)
        now = time.time_ns()
        span = tracer.start_span(RECORD_SPAN, context=parent, attributes=values, start_time=now)
        span.end(end_time=now)

    def flush(self) -> None:
        """Export the records added so far, in one call: a plan of thousands of trials is one export."""
        spans = self._collected.take()
        if spans:
            self.sink.exporter().export(spans)
            with self._lock:
                self.written += len(spans)

    def write(self, identity: TrialIdentity, attributes: Mapping[str, AttributeValue | None], *, service: str | None, version: str | None = None) -> None:
        """`add` one record and export it at once (an attempt's record survives the runner's crash)."""
        self.add(identity, attributes, service=service, version=version)
        self.flush()

    def close(self) -> None:
        with self._lock:
            for provider in self._providers.values():
                provider.shutdown()
            self._providers.clear()
