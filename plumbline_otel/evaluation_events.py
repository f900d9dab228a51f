"""Results back into the team's observability: OpenTelemetry `gen_ai.evaluation.result` log events.

The event and its four attributes are the GenAI semantic conventions' (v1.38+, now in
semantic-conventions-genai): `gen_ai.evaluation.name` (required), `gen_ai.evaluation.score.value`,
`gen_ai.evaluation.score.label`, `gen_ai.evaluation.explanation`. Every event carries the evaluator's
provenance as the convention's draft names it (`gen_ai.evaluation.evaluator.id`, `.version`, `.type`;
semantic-conventions-genai changelog #79): plumbline's own name and version, and `deterministic`, the
mechanism (invariants are checks, not a judge). A cell's event carries its interval as the proposed
`gen_ai.evaluation.score.ci.lower`/`.upper`/`.level` (semantic-conventions-genai #43; the method stays in
`plumbline.bound.method`). The convention has no slot yet for what makes a result reproducible, so
plumbline adds `plumbline.*` attributes: the spec and evidence hashes, the cell (agent, perturbation)
with its n and bound, and the evaluator.

Three kinds of result, each one event:
- a run of a certificate (`plumbline.critical_conformance`, 1 pass / 0 fail),
- a cell of a certificate (`plumbline.certificate.lower_bound`, the bound; pass when it meets the target),
- a violation a standing check found (`plumbline.invariant`, 0, fail), from `plumbline serve`.

The convention asks for an event to be parented to the span it evaluates. A run event and a
violation event carry the run's trace id, and the span id of the step the verdict blames when
there is one (a run with no blamed step is linked by trace only: the trajectory keeps no root
span id). Cell events summarise many runs and carry no trace context.

Building events is pure (`certificate_events`, `violation_events`); `EventEmitter` sends them
with the OpenTelemetry SDK's own OTLP log exporters (gRPC for `grpc://`/`grpcs://` URLs,
OTLP/HTTP for `http://`/`https://`, where a bare host gets `/v1/logs`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from plumbline_otel import __version__
from plumbline_otel.analyse.conformance import RunResult, evaluate
from plumbline_otel.errors import ConfigError, PlumblineError
from plumbline_otel.model import Trajectory
from plumbline_otel.report.model import Cell, Certificate
from plumbline_otel.runs import STUDY, TASK_KEY, TRIAL_ID, agent_label, perturbation_of
from plumbline_otel.spec import DeclaredInvariant, Spec, Verdict
from plumbline_otel.trials import KeyRing, account

EVENT_NAME = "gen_ai.evaluation.result"
EVALUATOR = "plumbline"
EVALUATOR_TYPE = "deterministic"  # the draft's mechanism values: llm_judge, deterministic, human
RUN_EVALUATION = "plumbline.critical_conformance"
CELL_EVALUATION = "plumbline.certificate.lower_bound"
VIOLATION_EVALUATION = "plumbline.invariant"


@dataclass(frozen=True)
class EvaluationEvent:
    """One `gen_ai.evaluation.result`: the convention's fields, plumbline's attributes, and its link."""

    name: str
    score_value: float
    score_label: str
    explanation: str
    attributes: dict[str, Any] = field(default_factory=dict)
    trace_id: str | None = None  # 32 hex digits
    span_id: str | None = None  # 16 hex digits
    time_ns: int = 0

    def otel_attributes(self) -> dict[str, Any]:
        """The log record's attributes: the convention's four, then plumbline's."""
        return {"gen_ai.evaluation.name": self.name, "gen_ai.evaluation.score.value": self.score_value,
                "gen_ai.evaluation.score.label": self.score_label, "gen_ai.evaluation.explanation": self.explanation,
                "gen_ai.evaluation.evaluator.id": EVALUATOR, "gen_ai.evaluation.evaluator.version": __version__,
                "gen_ai.evaluation.evaluator.type": EVALUATOR_TYPE, "plumbline.evaluator.name": EVALUATOR, "plumbline.evaluator.version": __version__, **self.attributes}


def _label(ok: bool) -> str:
    return "pass" if ok else "fail"


def _cell_attributes(cert: Certificate, cell: Cell) -> dict[str, Any]:
    return {"plumbline.spec.name": cert.spec.name, "plumbline.spec.hash": cert.spec.hash,
            "plumbline.evidence.sha256": cert.provenance.evidence_sha256,
            "plumbline.cell.agent": cell.agent, "plumbline.cell.perturbation": cell.perturbation,
            "plumbline.cell.n": cell.n, "plumbline.cell.conforming": cell.conforming,
            "plumbline.bound.lower": cell.gate_lower, "plumbline.bound.method": cell.gate_method,
            "plumbline.bound.confidence": cert.confidence, "plumbline.target": cert.target_bound}


def _interval(cert: Certificate, cell: Cell) -> dict[str, Any]:
    """The cell's gate interval as the proposed `score.ci.*`."""
    return {"gen_ai.evaluation.score.ci.lower": cell.gate_lower, "gen_ai.evaluation.score.ci.level": cert.confidence,
            "gen_ai.evaluation.score.ci.upper": cell.gate_upper}


def cell_event(cert: Certificate, cell: Cell, now_ns: int) -> EvaluationEvent:
    """A certificate cell: its gating lower bound, pass when it meets the certificate's target."""
    lower, target = cell.gate_lower, cert.target_bound
    explanation = (f"{cell.agent} under {cell.perturbation}: {cell.conforming} of {cell.n} runs hold every critical "
                   f"invariant; lower 95% bound {lower:.4f} ({cell.gate_method}) against a target of {target:.4f}")
    return EvaluationEvent(CELL_EVALUATION, lower, _label(lower >= target), explanation,
                           {**_cell_attributes(cert, cell), **_interval(cert, cell)}, time_ns=now_ns)


def _blamed_span(trajectory: Trajectory, verdicts: Sequence[Verdict]) -> str | None:
    for verdict in verdicts:
        if verdict.step_index is not None and 0 <= verdict.step_index < len(trajectory.steps):
            return trajectory.steps[verdict.step_index].span_id or None
    return None


def _run_attributes(trajectory: Trajectory) -> dict[str, Any]:
    attributes = {"plumbline.run.id": trajectory.trajectory_id}
    if trajectory.task_key is not None:
        attributes[TASK_KEY] = trajectory.task_key
    return attributes


def run_event(cert: Certificate, cell: Cell, trajectory: Trajectory, result: RunResult,
              errored_reason: str | None, now_ns: int) -> EvaluationEvent:
    """One run of a certificate: 1 when it held every critical invariant, 0 when not (or when it errored)."""
    critical = [(i, v) for i, v in result.violations if i.severity == "critical"]
    ok = not critical and errored_reason is None
    if errored_reason is not None:
        explanation = f"the trial errored: {errored_reason}"
    elif critical:
        explanation = "; ".join(f"violates {i.id}: {v.detail}" for i, v in critical)
    else:
        explanation = f"holds every critical invariant of {cert.spec.name}"
    attributes = {**_cell_attributes(cert, cell), **_run_attributes(trajectory)}
    return EvaluationEvent(RUN_EVALUATION, 1.0 if ok else 0.0, _label(ok), explanation, attributes,
                           trajectory.trace_id, _blamed_span(trajectory, [v for _, v in critical]), now_ns)


def certificate_events(cert: Certificate, spec: Spec, trajectories: Iterable[Trajectory], keys: KeyRing | None = None,
                       now_ns: int | None = None) -> list[EvaluationEvent]:
    """Every cell of `cert`, then every trial it scored (`trials.account`: unexposed, unwitnessed and missing ones have no score)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    cells = {(c.agent, c.perturbation): c for c in cert.cells}
    events = [cell_event(cert, cell, now_ns) for cell in cells.values()]
    errored = {key: {e.run: e.reason for e in cell.errored_runs} for key, cell in cells.items()}
    study = cert.provenance.filters.study
    books = account(trajectories, keys)
    witnessed = {id(r.run or r.record_trajectory) for r in books.results}
    unexposed = {key: set(cell.unexposed_runs) for key, cell in cells.items()}
    for trajectory, status in books.judged():
        key = (agent_label(trajectory.service, trajectory.service_version), perturbation_of(trajectory))
        label = str(trajectory.context.get(TRIAL_ID) or trajectory.trajectory_id)  # how the certificate lists a run
        unscored = status == "missing" or (status == "unexposed" and id(trajectory) in witnessed)
        if key not in cells or unscored or label in unexposed[key] or (study and trajectory.context.get(STUDY) != study):
            continue
        reason = errored[key].get(label, "errored") if status == "errored" else None
        events.append(run_event(cert, cells[key], trajectory, evaluate(spec, trajectory), reason, now_ns))
    return events


def violation_events(spec: Spec, found: Iterable[tuple[Trajectory, DeclaredInvariant, Verdict]],
                     now_ns: int | None = None) -> list[EvaluationEvent]:
    """Violations a standing check found, one event each, linked to the run and the step it blames."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    return [
        EvaluationEvent(VIOLATION_EVALUATION, 0.0, "fail", f"violates {inv.id} ({inv.severity}): {verdict.detail}",
                        {"plumbline.spec.name": spec.name, "plumbline.spec.hash": spec.hash, "plumbline.invariant.id": inv.id,
                         "plumbline.invariant.severity": inv.severity,
                         "plumbline.cell.agent": agent_label(t.service, t.service_version),
                         "plumbline.cell.perturbation": perturbation_of(t), **_run_attributes(t)},
                        t.trace_id, _blamed_span(t, [verdict]), now_ns)
        for t, inv, verdict in found
    ]


class _Counting:
    """Wraps an SDK log exporter to count what the collector accepted and what it did not."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.sent, self.failed = inner, 0, 0
        self._lock = threading.Lock()

    def export(self, batch: Sequence[Any]) -> Any:
        from opentelemetry.sdk._logs.export import LogRecordExportResult

        try:
            result = self.inner.export(batch)
        except Exception:
            result = LogRecordExportResult.FAILURE
        with self._lock:
            if result == LogRecordExportResult.SUCCESS:
                self.sent += len(batch)
            else:
                self.failed += len(batch)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def otlp_log_exporter(url: str, timeout: float = 10.0) -> Any:
    """The SDK's OTLP log exporter for `url`; `ConfigError` for a URL it cannot be."""
    parts = urlsplit(url)
    if parts.scheme in ("grpc", "grpcs") and parts.netloc:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        return GrpcExporter(endpoint=parts.netloc, insecure=parts.scheme == "grpc", timeout=timeout)
    if parts.scheme in ("http", "https") and parts.netloc:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter

        endpoint = url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/v1/logs"
        return HttpExporter(endpoint=endpoint, timeout=timeout)
    raise ConfigError(f"--emit: {url!r} is not an OTLP endpoint (grpc://HOST:PORT, http://HOST:PORT[/v1/logs] or https://…)")


class EventEmitter:
    """Sends evaluation events through the SDK's batching log pipeline; `close()` says how many arrived.

    Thread-safe (the SDK's logger is); `close()` flushes and shuts the exporter down.
    """

    def __init__(self, url: str, service_name: str = "plumbline") -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        self.url = url
        self._exporter = _Counting(otlp_log_exporter(url))
        self._provider = LoggerProvider(resource=Resource.create({"service.name": service_name, "service.version": __version__}))
        self._provider.add_log_record_processor(BatchLogRecordProcessor(self._exporter))  # type: ignore[arg-type]
        self._logger = self._provider.get_logger("plumbline_otel.evaluation_events", __version__)

    def emit(self, events: Iterable[EvaluationEvent]) -> None:
        """Queue the events for sending (the SDK batches them)."""
        from opentelemetry._logs import SeverityNumber

        for event in events:
            self._logger.emit(timestamp=event.time_ns or time.time_ns(), context=_context(event), event_name=EVENT_NAME,
                              severity_number=SeverityNumber.INFO, severity_text="INFO", attributes=event.otel_attributes())

    def close(self) -> tuple[int, int]:
        """Flush and shut down; (events the receiver accepted, events that failed)."""
        self._provider.force_flush()
        self._provider.shutdown()
        return self._exporter.sent, self._exporter.failed


class EmitError(PlumblineError):
    """The collector did not accept every event (unreachable, refused, or it answered an error)."""


def send(url: str, events: Sequence[EvaluationEvent]) -> int:
    """Send `events` to `url` and wait for them; the number accepted, or `EmitError` naming what was lost."""
    emitter = EventEmitter(url)
    emitter.emit(events)
    sent, failed = emitter.close()
    if failed or sent < len(events):
        raise EmitError(f"{url}: {len(events) - sent} of {len(events)} evaluation events were not accepted")
    return sent


def _context(event: EvaluationEvent) -> Any:
    """A context whose current span is the evaluated one, so the SDK puts its ids on the record."""
    if not event.trace_id:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    span_id = int(event.span_id, 16) if event.span_id else 0
    span_context = SpanContext(int(event.trace_id, 16), span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(span_context))


__all__ = ["CELL_EVALUATION", "EVENT_NAME", "EmitError", "EvaluationEvent", "EventEmitter", "RUN_EVALUATION", "VIOLATION_EVALUATION",
           "cell_event", "certificate_events", "otlp_log_exporter", "run_event", "send", "violation_events"]
