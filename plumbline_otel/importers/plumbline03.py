"""Import a plumbline 0.3.0 run directory: the seed system's trials become runs like any other.

A 0.3.0 run directory holds any of ``trajectories.jsonl`` (one trial a line), ``ledger_states.json``
(trial id -> end state of the ledger), ``variants.json`` (task -> its perturbation variants, fault
targets among them), ``errors.json`` (trials that raised) and ``summary.json`` (the published
figures). Each trial is turned into the OTLP spans an OTel GenAI instrumentation would have sent
(an ``invoke_agent`` root, a ``chat`` span for the plan-execute arm's interpretation call, one
``execute_tool`` span per tool call with its arguments, result and error status) and ingested
through the ordinary path (`ingest.ingest_requests`), so every reader sees an imported run the
way it sees live traffic. Nothing is written to the store by hand.

Identity: a trial id reads ``arm/task/perturbation/variant/repeat``; the arm is the agent
(``service.name``), the task the task key. Trace and span ids are digests of (study, trial id), and
span times are a fixed nominal time (the seed recorded none), so importing a directory again
changes nothing.

Exposure (docs/statistics.md): the seed never recorded whether a trial's fault fired (its
injector fired once per variant, not per trial). A ``tool_fault`` trial gets
``plumbline.fault.tool`` and ``plumbline.fault.error`` (from ``variants.json``, else the seed's
fixed fault cycle), never ``plumbline.fault.fired``: the certificate decides exposure from the
steps alone, so a trial without a failed call of the target tool carrying that error is
unexposed. A trial recorded with an error is an errored run; a trial of the study's grid with no
record at all is missing.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from plumbline_otel.errors import InputError
from plumbline_otel.model import Trajectory
from plumbline_otel.runs import (
    FAULT_ERROR,
    FAULT_TOOL,
    OUTCOME,
    PERTURBATION,
    REPEAT,
    STUDY,
    TASK_KEY,
    TRIAL_ATTEMPT,
    TRIAL_ID,
    TRIAL_REASON,
    TRIAL_STATUS,
    VARIANT,
    is_marker,
)

FILES = ("trajectories.jsonl", "ledger_states.json", "variants.json", "errors.json", "summary.json")
SCOPE = "plumbline_otel.importers.plumbline03"
LEDGER = "plumbline.ledger"  # the end state itself, JSON
STEPS_RECORDED = "plumbline.import.steps_recorded"  # false: the directory kept the outcome, not the steps

# The seed recorded no times. Runs are placed at 0.3.0's release date, each at an offset drawn
# from its own id (so one trial's time never depends on the others), steps 1 ms apart.
_EPOCH_NS = 1_788_307_200 * 1_000_000_000  # 2026-09-02T00:00:00Z
_STEP_NS = 1_000_000

# The seed's TransientToolFault (plumbline 0.3.0 perturb/): variant i targets _FAULT_TOOLS[i % 3]
# with _FAULT_ERRORS[i % 3]. Used when a directory has no variants.json (the parity study's was
# never committed); the retry study's variants.json records exactly this cycle.
_FAULT_TOOLS = ("match_purchase_order", "check_duplicate", "check_vendor_status")
_FAULT_ERRORS = ("503 upstream temporarily unavailable", "429 rate limit exceeded, retry shortly", "connection reset by peer")


@dataclass(frozen=True)
class Expected:
    """What the seed's grader required of a task: pay `amount` once, or raise an exception and pay nothing."""

    pay: bool
    amount: float = 0.0


# The seed's domain "ap" (8 invoices): the expected outcome per task, from its published README.
AP_EXPECTED: dict[str, Expected] = {
    "INV-7002": Expected(True, 4500.00),
    "INV-7003": Expected(False),
    "INV-7004": Expected(False),
    "INV-7005": Expected(False),
    "INV-7006": Expected(True, 7750.00),
    "INV-7007": Expected(False),
    "INV-7008": Expected(False),
    "INV-7009": Expected(True, 14500.00),
}


@dataclass(frozen=True)
class TrialId:
    """A seed trial id, ``arm/task/perturbation/variant/repeat``."""

    arm: str
    task: str
    perturbation: str
    variant: int
    repeat: int

    @property
    def variant_id(self) -> str:
        return f"{self.perturbation}/{self.variant}"

    def __str__(self) -> str:
        return f"{self.arm}/{self.task}/{self.perturbation}/{self.variant}/{self.repeat}"

    @classmethod
    def parse(cls, text: str, where: str) -> TrialId:
        """Raises InputError naming `where` when the id is not five parts with integer variant and repeat."""
        parts = str(text).split("/")
        if len(parts) != 5 or not all(parts[:3]) or not (parts[3].isdigit() and parts[4].isdigit()):
            raise InputError(f"{where}: trial id {text!r} is not arm/task/perturbation/variant/repeat")
        return cls(parts[0], parts[1], parts[2], int(parts[3]), int(parts[4]))


@dataclass
class Trial:
    """Everything a run directory says about one trial."""

    id: TrialId
    record: dict[str, Any] | None = None  # its trajectories.jsonl line
    ledger: dict[str, Any] | None = None
    error: str | None = None  # the seed's run-level error (trajectory or errors.json)


@dataclass
class RunDir:
    """A 0.3.0 run directory, read: trials by id, variants, the published summary, files present."""

    path: Path
    trials: dict[str, Trial]
    variants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    files: tuple[str, ...] = ()


# --- reading ---------------------------------------------------------------------------------


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None


def _trial(trials: dict[str, Trial], text: Any, where: str) -> Trial:
    tid = TrialId.parse(text, where)
    return trials.setdefault(str(tid), Trial(tid))


def _read_trajectories(path: Path, trials: dict[str, Trial]) -> None:
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{n}: invalid JSON: {exc.msg}") from None
            if not isinstance(record, dict) or "trial_id" not in record:
                raise InputError(f"{path}:{n}: a trajectory needs a trial_id")
            if not isinstance(record.get("steps", []), list):
                raise InputError(f"{path}:{n}: field steps is not a list")
            trial = _trial(trials, record["trial_id"], f"{path}:{n}")
            trial.record = record
            trial.error = record.get("error") or trial.error


def _read_ledgers(path: Path, trials: dict[str, Trial]) -> None:
    ledgers = _load_json(path)
    if not isinstance(ledgers, dict):
        raise InputError(f"{path}: expected an object of trial id -> ledger state")
    for tid, state in ledgers.items():
        if not isinstance(state, dict):
            raise InputError(f"{path}: field {tid!r} is not a ledger state object")
        _trial(trials, tid, f"{path}: field {tid!r}").ledger = state


def _read_errors(path: Path, trials: dict[str, Trial]) -> None:
    entries = _load_json(path)
    if not isinstance(entries, list):
        raise InputError(f"{path}: expected a list of {{trial, error}}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("trial") in (None, "-"):
            continue  # "-" is a study-level note (a budget stop), not a trial
        trial = _trial(trials, entry["trial"], f"{path}: entry {i}")
        trial.error = trial.error or str(entry.get("error") or "error")


def read_run_dir(path: str | Path) -> RunDir:
    """Read whichever of the run directory's files exist; InputError names the file and line or field."""
    root = Path(path)
    present = tuple(name for name in FILES if (root / name).is_file())
    if not root.is_dir() or not present:
        raise InputError(f"{root}: not a plumbline 0.3.0 run directory (none of {', '.join(FILES)})")
    trials: dict[str, Trial] = {}
    for name, reader in (("trajectories.jsonl", _read_trajectories), ("ledger_states.json", _read_ledgers),
                         ("errors.json", _read_errors)):
        if name in present:
            reader(root / name, trials)
    variants = _load_json(root / "variants.json") if "variants.json" in present else {}
    if not isinstance(variants, dict):
        raise InputError(f"{root / 'variants.json'}: expected an object of task id -> variants")
    summary = _load_json(root / "summary.json") if "summary.json" in present else None
    return RunDir(root, trials, variants, summary, present)


# --- what a trial means --------------------------------------------------------------------------


def _variant(tid: TrialId, variants: Mapping[str, list[dict[str, Any]]]) -> Mapping[str, Any]:
    return next((v for v in variants.get(tid.task, []) if isinstance(v, Mapping) and v.get("variant_id") == tid.variant_id), {})


def fault_of(tid: TrialId, variants: Mapping[str, list[dict[str, Any]]]) -> tuple[str, str] | None:
    """The (tool, error text) the seed injected into a tool_fault trial; None for other perturbations."""
    if tid.perturbation != "tool_fault":
        return None
    meta = _variant(tid, variants).get("meta") or {}
    if meta.get("target") and meta.get("error"):
        return str(meta["target"]), str(meta["error"])
    return _FAULT_TOOLS[tid.variant % 3], _FAULT_ERRORS[tid.variant % 3]


def outcome_correct(expected: Expected, ledger: Mapping[str, Any]) -> bool:
    """The seed's grader: paid, payment count (1 or 0), amount (within 0.005) and exception all as expected."""
    try:
        amount = float(ledger.get("amount_paid") or 0.0)
    except (TypeError, ValueError):
        return False
    return (
        bool(ledger.get("paid")) == expected.pay
        and ledger.get("payment_count") == (1 if expected.pay else 0)
        and abs(amount - (expected.amount if expected.pay else 0.0)) <= 0.005
        and bool(ledger.get("exception_raised")) == (not expected.pay)
    )


def missing_trials(trials: Mapping[str, Trial]) -> list[TrialId]:
    """Trials of the study's grid with no record: the seed runs every arm x task x variant x repeat.

    The grid is what the directory itself shows: every arm, task and repeat seen, and every
    variant seen per perturbation.
    """
    ids = [t.id for t in trials.values()]
    arms, tasks, repeats = ({getattr(i, a) for i in ids} for a in ("arm", "task", "repeat"))
    variants = {(i.perturbation, i.variant) for i in ids}
    grid = {TrialId(a, t, p, v, k) for a in arms for t in tasks for p, v in variants for k in repeats}
    return sorted(grid - set(ids), key=str)


# --- spans -----------------------------------------------------------------------------------


def _value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_value(v) for v in value]))
    if isinstance(value, Mapping):
        return AnyValue(kvlist_value=KeyValueList(values=_attrs(value)))
    return AnyValue(string_value=str(value))


def _attrs(values: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_value(v)) for k, v in values.items() if v is not None]


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _digest(study: str, tid: TrialId) -> bytes:
    return hashlib.sha256(f"plumbline03:{study}:{tid}".encode()).digest()


def _span_id(digest: bytes, n: int) -> bytes:
    return hashlib.sha256(digest + n.to_bytes(4, "big")).digest()[:8]


def _messages(role: str, text: Any) -> str | None:
    return None if text in (None, "") else _json([{"role": role, "parts": [{"type": "text", "content": str(text)}]}])


def _step_span(step: Mapping[str, Any], n: int, model: str | None) -> tuple[str, dict[str, Any], str | None]:
    """(span name, attributes, error) of one seed step; the final step is the root's output, not a span."""
    kind, name, error = step.get("kind"), str(step.get("name") or "unknown"), step.get("error")
    if kind == "tool_call":
        return f"execute_tool {name}", {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": f"call_{n}",
            "gen_ai.tool.call.arguments": _json(step.get("args") or {}),
            "gen_ai.tool.call.result": None if step.get("output") is None else _json(step.get("output")),
            "error.type": "ToolError" if error else None,
        }, error
    if name == "interpret_request":  # the plan-execute arm's one model call
        return f"chat {model or ''}".strip(), {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "anthropic",
            "gen_ai.request.model": model,
            "gen_ai.output.messages": _messages("assistant", step.get("output")),
            "plumbline.decision.args": _json(step.get("args") or {}),
        }, error
    return f"decision {name}", {"plumbline.decision.name": name, "plumbline.decision.output": _json(step.get("output"))}, error


def _span(trace_id: bytes, span_id: bytes, parent: bytes | None, name: str, start: int, end: int,
          attrs: Mapping[str, Any], error: str | None, kind: int) -> Span:
    status = Status(code=Status.STATUS_CODE_ERROR, message=str(error)) if error else Status()
    return Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent or b"", name=name, kind=kind,  # type: ignore[arg-type]
                start_time_unix_nano=start, end_time_unix_nano=end, attributes=_attrs(attrs), status=status)


def _resource(study: str, trial: Trial, variants: Mapping[str, list[dict[str, Any]]], status: str | None, reason: str | None) -> dict[str, Any]:
    tid = trial.id
    attrs: dict[str, Any] = {
        "service.name": tid.arm,
        STUDY: study,
        TRIAL_ID: str(tid),
        TRIAL_ATTEMPT: 1,
        PERTURBATION: tid.perturbation,
        VARIANT: tid.variant_id,
        REPEAT: tid.repeat,
        TASK_KEY: tid.task,
        TRIAL_STATUS: status,
        TRIAL_REASON: reason,
    }
    fault = fault_of(tid, variants)
    if fault:
        attrs[FAULT_TOOL], attrs[FAULT_ERROR] = fault
    if trial.ledger is not None:
        attrs[LEDGER] = _json(trial.ledger)
        expected = AP_EXPECTED.get(tid.task)
        if expected is not None:
            attrs[OUTCOME] = "correct" if outcome_correct(expected, trial.ledger) else "incorrect"
    if trial.record is None and status is None:
        attrs[STEPS_RECORDED] = False
    return attrs


def _latency_ns(record: Mapping[str, Any]) -> int:
    try:
        return max(0, int(float(record.get("latency_ms") or 0) * 1_000_000))
    except (TypeError, ValueError):
        return 0  # a nominal duration only: the spans' order does not depend on it


def _run_spans(trial: Trial, digest: bytes, start: int, prompt: Any) -> list[Span]:
    """The agent run: an ``invoke_agent`` root over one span per recorded step, 1 ms apart.

    `prompt` is the variant's prompt from variants.json, the input when no trajectory was kept.
    """
    tid, record = trial.id, trial.record or {}
    trace_id, root_id = digest[:16], digest[16:24]
    model = record.get("model")
    steps = [s for s in record.get("steps") or [] if isinstance(s, Mapping) and s.get("kind") != "final"]
    usage = {"gen_ai.usage.input_tokens": record.get("tokens_in"), "gen_ai.usage.output_tokens": record.get("tokens_out")}
    # The seed counted tokens per run. With exactly one model call recorded (the plan-execute arm)
    # they are that call's; otherwise they stay on the root, since the calls were not recorded.
    model_calls = [n for n, step in enumerate(steps) if step.get("name") == "interpret_request"]
    spans = []
    for n, step in enumerate(steps):
        name, attrs, error = _step_span(step, n, model)
        if model_calls == [n]:
            attrs.update(usage)
        at = start + (n + 1) * _STEP_NS
        kind = Span.SPAN_KIND_INTERNAL if attrs.get("gen_ai.operation.name") == "execute_tool" else Span.SPAN_KIND_CLIENT
        spans.append(_span(trace_id, _span_id(digest, n), root_id, name, at, at + _STEP_NS // 2, attrs, error, kind))
    root_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": tid.arm,
        "gen_ai.provider.name": "anthropic" if model else None,
        "gen_ai.request.model": model,
        "gen_ai.input.messages": _messages("user", record.get("task_input") or prompt),
        "gen_ai.output.messages": _messages("assistant", record.get("final_output")),
        **({} if len(model_calls) == 1 else usage),
    }
    end = start + max(_latency_ns(record), (len(spans) + 1) * _STEP_NS)
    root = _span(trace_id, root_id, None, f"invoke_agent {tid.arm}", start, end, root_attrs, trial.error, Span.SPAN_KIND_INTERNAL)
    return [root, *spans]


def trial_request(study: str, trial: Trial, variants: Mapping[str, list[dict[str, Any]]],
                  missing_reason: str | None = None) -> ExportTraceServiceRequest:
    """One trial as one export request: its resource (every run attribute) and its spans.

    A missing trial (`missing_reason` given) is a single plain marker span, never an agent run.
    """
    digest = _digest(study, trial.id)
    start = _EPOCH_NS + int.from_bytes(digest[24:28], "big") % 86_400_000 * 1_000_000
    status = "missing" if missing_reason else ("errored" if trial.error else None)
    resource = _resource(study, trial, variants, status, missing_reason or trial.error)
    if missing_reason is None:
        spans = _run_spans(trial, digest, start, _variant(trial.id, variants).get("prompt"))
    else:
        spans = [_span(digest[:16], digest[16:24], None, "plumbline.import.trial", start, start + _STEP_NS, {}, None, Span.SPAN_KIND_INTERNAL)]
    scope = ScopeSpans(scope=InstrumentationScope(name=SCOPE), spans=spans)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=Resource(attributes=_attrs(resource)), scope_spans=[scope])])


MISSING_REASON = "no record in the run directory for this trial of the study's grid (never run)"


def requests_for(run: RunDir, study: str) -> Iterator[ExportTraceServiceRequest]:
    """Every trial's request, in trial-id order, then the missing trials' markers."""
    for key in sorted(run.trials):
        yield trial_request(study, run.trials[key], run.variants)
    for tid in missing_trials(run.trials):
        yield trial_request(study, Trial(tid), run.variants, missing_reason=MISSING_REASON)


# --- the import ------------------------------------------------------------------------------


@dataclass
class ImportResult:
    """What an import stored: trials by kind, and the ingest's own counts."""

    study: str
    files: tuple[str, ...]
    trials: int
    with_steps: int
    errored: int
    missing: int
    outcome_only: int
    spans_stored: int
    spans_duplicate: int
    trajectories: int
    published: dict[str, Any] | None = None


def import_run_dir(store: Any, path: str | Path, study: str | None = None) -> ImportResult:
    """Read a 0.3.0 run directory and ingest its trials into `store` (a `Store`) through the ordinary path."""
    from plumbline_otel.ingest import ingest_requests

    run = read_run_dir(path)
    study = study or run.path.resolve().name
    missing = missing_trials(run.trials)
    summary = ingest_requests(store, requests_for(run, study), source=f"import plumbline03 {run.path}")
    trials = run.trials.values()
    return ImportResult(
        study=study,
        files=run.files,
        trials=len(run.trials),
        with_steps=sum(t.record is not None and not t.error for t in trials),
        errored=sum(bool(t.error) for t in trials),
        missing=len(missing),
        outcome_only=sum(t.record is None and not t.error for t in trials),
        spans_stored=summary.stored,
        spans_duplicate=summary.duplicate,
        trajectories=summary.trajectories,
        published=(run.summary or {}).get("outcome_correctness"),
    )


# --- outcome correctness, per cell -------------------------------------------------------------


def outcome_cells(trajectories: Iterable[Trajectory],
                  scored: Callable[[Trajectory], bool] | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """(agent, perturbation) -> (correct, graded) over runs carrying ``plumbline.outcome``.

    Missing and errored trials have no outcome and are not graded (the seed excluded them too).
    `scored`, when given, is a predicate a run must pass to be graded (e.g. exposure).
    """
    counts: Counter[tuple[str, str, bool]] = Counter()
    for t in trajectories:
        outcome = t.context.get(OUTCOME)
        if outcome not in ("correct", "incorrect") or is_marker(t) or (scored and not scored(t)):
            continue
        counts[(t.service or "", str(t.context.get(PERTURBATION) or "baseline"), outcome == "correct")] += 1
    cells = {(a, p) for a, p, _ in counts}
    return {cell: (counts[(*cell, True)], counts[(*cell, True)] + counts[(*cell, False)]) for cell in sorted(cells)}
