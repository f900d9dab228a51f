"""The replay driver: plan a study's trials, run them through an adapter, record what happened.

``plan_study`` is pure: tasks × perturbations → guarded variants → trials (× repeats), each with
its deterministic identity. ``run_study`` runs a plan:

- bounded concurrency (a thread pool of ``concurrency`` workers; trials are I/O bound);
- per attempt, a fresh ``TrialScope`` (cache, budget, a fault injector built from the variant's
  plan) and the trial's OTel context (its trace, the identity in baggage) made current, so an
  in-process agent's spans join the trial and its tool wrapper fires the fault;
- retry with exponential backoff on the transient errors named in ``RetryPolicy.transient``;
- the spend cap: each trial reserves its estimate before it starts (``SpendCap.reserve`` is
  atomic; metered model calls grow the reservation), so concurrency cannot overshoot the cap;
  once the cap refuses, no further trial starts;
- a trial that could not run (budget stop, offline cache miss, adapter error after retries) is
  recorded as missing: a ledger row and a marker span (``plumbline.trial.status`` missing or
  error) that certification counts beside n, never as a failure;
- resume: trials whose run is in the store (by ``plumbline.trial.id``) or whose ledger row says
  ``ok`` are skipped; without ``resume`` such a study is refused rather than run twice.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opentelemetry import baggage, context, trace
from opentelemetry.trace import NonRecordingSpan

from plumbline_otel.analyse.conformance import is_missing
from plumbline_otel.errors import ReplayError
from plumbline_otel.model import Trajectory
from plumbline_otel.replay.adapters import PythonAdapter, Trial, TrialOutcome, TransientAdapterError
from plumbline_otel.replay.budget import BudgetExceeded, SpendCap, TrialBudget
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.export import MarkerWriter, SpanSink, trial_span_context
from plumbline_otel.replay.identity import FAULT, TrialIdentity, trial_id_for
from plumbline_otel.replay.ledger import Ledger, write_jsonl
from plumbline_otel.replay.perturb import PerturbOptions, Variant, build_variants
from plumbline_otel.replay.scope import FaultInjector, TrialScope, activate
from plumbline_otel.replay.tasks import ReplayTask


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff on transient errors; ``max_attempts`` counts the first try."""

    max_attempts: int = 3
    base_delay_s: float = 0.5
    factor: float = 2.0
    max_delay_s: float = 30.0
    transient: tuple[type[BaseException], ...] = (TransientAdapterError, ConnectionError, TimeoutError)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Sleep before attempt ``attempt + 1``: the backoff, or the peer's Retry-After if longer (capped)."""
        backoff = self.base_delay_s * self.factor ** (attempt - 1)
        return min(self.max_delay_s, max(backoff, retry_after or 0.0))

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, self.transient)


@dataclass
class StudyConfig:
    """Everything a study run needs besides the tasks and the adapter."""

    study: str
    perturbations: Sequence[str] = ("baseline",)
    repeats: int = 1
    options: PerturbOptions = field(default_factory=PerturbOptions)
    concurrency: int = 4
    budget_usd: float | None = None
    trial_estimate_usd: float = 0.0  # reserved per trial before it starts
    resume: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    state_dir: str | Path | None = None  # ledger.jsonl, variants.jsonl, responses.jsonl
    cache_mode: str = "record"  # record | replay (offline) | off
    sink: SpanSink | None = None
    service: str | None = None  # label on missing-trial markers (default: the adapter's, then the task's)
    service_version: str | None = None

    def __post_init__(self) -> None:
        if not self.study or "/" in self.study:
            raise ReplayError(f"study name {self.study!r}: must be non-empty and contain no '/'")
        if self.repeats < 1 or self.concurrency < 1:
            raise ReplayError("repeats and concurrency must be at least 1")


@dataclass(frozen=True)
class Plan:
    variants: tuple[Variant, ...]
    trials: tuple[Trial, ...]

    @property
    def rejected(self) -> list[Variant]:
        return [v for v in self.variants if v.rejected]


def plan_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any = None) -> Plan:
    """Variants and trials, in a deterministic order (task, perturbation, variant, repeat).

    A domain adapter may offer its own ``decoy_tools`` (used unless the options name others) and
    ``fault_tools`` (preferred fault targets, among the tools each task's source run called).
    """
    options = config.options
    decoys = getattr(adapter, "decoy_tools", None)
    if decoys and options.decoy_tools == PerturbOptions().decoy_tools:
        options = replace(options, decoy_tools=tuple(decoys))
    preferred = getattr(adapter, "fault_tools", None)
    if preferred and not options.preferred_fault_tools:
        options = replace(options, preferred_fault_tools=tuple(preferred))
    variants: list[Variant] = []
    trials: list[Trial] = []
    for task in sorted(tasks, key=lambda t: t.task_key):
        for variant in build_variants(task, config.perturbations, options):
            variants.append(variant)
            if variant.rejected:
                continue
            for k in range(config.repeats):
                identity = TrialIdentity(trial_id_for(config.study, task.task_key, variant.perturbation, variant.variant_id, k),
                                         variant.perturbation, variant.variant_id, config.study, k, task.task_key)
                trials.append(Trial(identity, task, variant.text, dict(variant.metadata), variant.fault, config.sink))
    return Plan(tuple(variants), tuple(trials))


@dataclass
class TrialRecord:
    """How one trial ended: ok (a run was produced), missing, error, or skipped (resume)."""

    trial_id: str
    task_key: str | None
    perturbation: str
    variant: str
    repeat: int
    status: str
    reason: str | None = None
    attempts: int = 0
    cost_usd: float = 0.0
    trace_id: str | None = None
    seconds: float = 0.0
    model_calls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    fault: str | None = None
    fault_fired: bool | None = None

    def row(self) -> dict[str, Any]:
        return {**self.__dict__, "at": time.time()}


@dataclass
class StudySummary:
    study: str
    planned: int = 0
    skipped: int = 0
    ok: int = 0
    missing: int = 0
    errors: int = 0
    rejected: list[Variant] = field(default_factory=list)
    records: list[TrialRecord] = field(default_factory=list)
    spent_usd: float = 0.0  # cumulative for the study, prior runs included
    session_usd: float = 0.0
    budget_usd: float | None = None
    budget_high_water_usd: float = 0.0
    markers: int = 0
    cache_hits: int = 0
    cache_recorded: int = 0
    seconds: float = 0.0

    @property
    def ran(self) -> int:
        return self.ok + self.missing + self.errors

    def faults(self) -> tuple[int, int]:
        """(fired, planned) over tool_fault trials that ran."""
        faulted = [r for r in self.records if r.fault and r.status == "ok"]
        return sum(bool(r.fault_fired) for r in faulted), len(faulted)

    def as_dict(self) -> dict[str, Any]:
        fired, faulted = self.faults()
        return {
            "study": self.study, "planned": self.planned, "skipped_resume": self.skipped, "ok": self.ok,
            "missing": self.missing, "errors": self.errors, "rejected_variants": len(self.rejected),
            "rejections": [v.as_dict() for v in self.rejected], "spent_usd": self.spent_usd,
            "session_usd": self.session_usd, "budget_usd": self.budget_usd,
            "budget_high_water_usd": self.budget_high_water_usd, "markers": self.markers,
            "cache_hits": self.cache_hits, "cache_recorded": self.cache_recorded,
            "faults_fired": fired, "fault_trials": faulted, "seconds": round(self.seconds, 3),
        }

    def render(self) -> str:
        lines = [f"study {self.study}: {self.planned} trials planned; ran {self.ran} ({self.ok} ok, "
                 f"{self.missing} missing, {self.errors} error), {self.skipped} skipped by resume; "
                 f"{len(self.rejected)} variant(s) rejected by the guard; {self.seconds:.1f}s"]
        for v in self.rejected[:10]:
            lines.append(f"  rejected {v.task_key} {v.perturbation}/{v.variant_id}: {v.rejected}")
        if len(self.rejected) > 10:
            lines.append(f"  … and {len(self.rejected) - 10} more (variants.jsonl)")
        fired, faulted = self.faults()
        if faulted:
            lines.append(f"  tool faults fired in {fired}/{faulted} tool_fault trials")
        cap = f" of ${self.budget_usd:.2f}" if self.budget_usd is not None else ""
        lines.append(f"  spend ${self.session_usd:.4f} this run, ${self.spent_usd:.4f}{cap} for the study; "
                     f"cache: {self.cache_hits} hits, {self.cache_recorded} recorded")
        problems = [r for r in self.records if r.status in ("missing", "error")]
        for r in problems[:10]:
            lines.append(f"  {r.status} {r.trial_id}: {r.reason}")
        if len(problems) > 10:
            lines.append(f"  … and {len(problems) - 10} more (ledger.jsonl)")
        if self.markers:
            lines.append(f"  {self.markers} missing-trial marker(s) exported: certify counts them beside n, never as failures")
        return "\n".join(lines)


@contextmanager
def otel_trial_context(trial: Trial) -> Iterator[None]:
    """Make the trial's trace (its virtual root as parent) and identity baggage current."""
    ctx = trace.set_span_in_context(NonRecordingSpan(trial_span_context(trial.identity)))
    for key, value in trial.identity.attributes().items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    if trial.fault is not None:
        ctx = baggage.set_baggage(FAULT, str(trial.fault), ctx)
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


class _Runner:
    def __init__(self, config: StudyConfig, adapter: Any, cap: SpendCap, cache: ResponseCache | None,
                 ledger: Ledger | None, markers: MarkerWriter | None) -> None:
        self.config, self.adapter, self.cap, self.cache = config, adapter, cap, cache
        self.ledger, self.markers = ledger, markers
        self.stop = threading.Event()
        self.stop_reason: str | None = None

    def _label(self, trial: Trial) -> tuple[str | None, str | None]:
        service = self.config.service or getattr(self.adapter, "service", None)
        if service:
            version = self.config.service_version or (getattr(self.adapter, "service_version", None) if not self.config.service else None)
            return service, version
        return trial.task.service, trial.task.service_version

    def run(self, trial: Trial) -> TrialRecord:
        started = time.perf_counter()
        ident = trial.identity
        record = TrialRecord(ident.trial_id, ident.task_key, ident.perturbation, ident.variant, ident.repeat,
                             status="missing", fault=str(trial.fault) if trial.fault else None)
        try:
            self._run(trial, record)
        except Exception as exc:  # a driver bug must not take the study down with it
            record.status, record.reason = "error", f"driver: {type(exc).__name__}: {exc}"
        record.seconds = round(time.perf_counter() - started, 4)
        if record.status in ("missing", "error") and self.markers is not None:
            service, version = self._label(trial)
            self.markers.write(ident, record.status, record.reason or record.status, service=service,
                               version=version, attempts=record.attempts)
        if self.ledger is not None:
            self.ledger.append(record.row())
        return record

    def _refuse(self, record: TrialRecord, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()
        record.status, record.reason = "missing", reason

    def _run(self, trial: Trial, record: TrialRecord) -> None:
        config = self.config
        if self.stop.is_set():
            record.status, record.reason = "missing", f"not started: {self.stop_reason}"
            return
        budget = TrialBudget.open(self.cap, config.trial_estimate_usd)
        if budget is None:
            self._refuse(record, f"budget: spend cap ${self.cap.limit:.2f} reached (spent ${self.cap.spent:.4f}, "
                                 f"${self.cap.reserved:.4f} reserved)")
            return
        outcome: TrialOutcome | None = None
        scope: TrialScope | None = None
        try:
            while True:
                record.attempts += 1
                scope = TrialScope(trial.identity, budget, self.cache,
                                   FaultInjector(trial.fault) if trial.fault else None, record.attempts)
                try:
                    with activate(scope), otel_trial_context(trial):
                        outcome = TrialOutcome.coerce(self.adapter.run(trial))
                    record.status, record.reason = "ok", None
                    break
                except Exception as exc:
                    if scope.abort_reason:
                        if scope.abort_reason.startswith("budget"):
                            self._refuse(record, scope.abort_reason)
                        else:
                            record.status, record.reason = "missing", scope.abort_reason
                        break
                    if isinstance(exc, BudgetExceeded):
                        self._refuse(record, f"budget: {exc}")
                        break
                    if config.retry.is_transient(exc) and record.attempts < config.retry.max_attempts:
                        time.sleep(config.retry.delay(record.attempts, getattr(exc, "retry_after", None)))
                        continue
                    retried = f" (after {record.attempts} attempts)" if record.attempts > 1 else ""
                    record.status, record.reason = "error", f"{type(exc).__name__}: {exc}{retried}"
                    break
        finally:
            record.cost_usd = round(budget.close(outcome.cost_usd if outcome else None), 8)
            if scope is not None:
                record.model_calls, record.cache_hits, record.cache_misses = scope.model_calls, scope.cache_hits, scope.cache_misses
        if outcome is not None:
            record.trace_id = outcome.trace_id or trial.trace_id
            if trial.fault is not None:
                if outcome.fault_fired is not None:
                    record.fault_fired = bool(outcome.fault_fired)
                elif scope is not None and scope.fault is not None:
                    record.fault_fired = scope.fault.fired


class _ScopedParaphraser:
    """Runs a (model) paraphraser inside a scope of its own: its calls are cached per study, so
    re-planning on resume or offline gives the same variants (and trial ids), and they are paid
    from the study's cap."""

    def __init__(self, inner: Any, study: str, cap: SpendCap, cache: ResponseCache | None) -> None:
        self.inner, self.study, self.cap, self.cache = inner, study, cap, cache
        self.name = getattr(inner, "name", type(inner).__name__)

    def __call__(self, text: str, n: int, rng: Any) -> list[str]:
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        identity = TrialIdentity(f"{self.study}/paraphrase-generator/{digest}", "paraphrase", "generator", self.study)
        budget = TrialBudget.open(self.cap, 0.0)
        if budget is None:
            raise BudgetExceeded("spend cap reached before paraphrasing")
        try:
            with activate(TrialScope(identity, budget, self.cache)):
                return list(self.inner(text, n, rng))
        finally:
            budget.close()


class Study:
    """A study opened for running: its plan, ledger, cache and cap (``open_study`` builds it)."""

    def __init__(self, config: StudyConfig, adapter: Any, plan: Plan, ledger: Ledger | None, cache: ResponseCache | None,
                 cap: SpendCap) -> None:
        self.config, self.adapter, self.plan, self.ledger, self.cache, self.cap = config, adapter, plan, ledger, cache, cap

    def run(self, completed: set[str] | frozenset[str] = frozenset(),
            on_record: Callable[[TrialRecord, int, int], None] | None = None) -> StudySummary:
        """Run the planned trials not yet done (``completed``: trial ids with a stored run)."""
        config, plan, ledger, cache, cap = self.config, self.plan, self.ledger, self.cache, self.cap
        started = time.perf_counter()
        done = set(completed) | (ledger.completed() if ledger else set())
        already = [t for t in plan.trials if t.trial_id in done]
        if already and not config.resume:
            raise ReplayError(f"study {config.study!r} already has {len(already)} of its {len(plan.trials)} trials done "
                              f"(e.g. {already[0].trial_id}); pass --resume to run only the rest, or choose a new --study")
        todo = [t for t in plan.trials if t.trial_id not in done]
        markers = MarkerWriter(config.sink) if config.sink is not None else None
        runner = _Runner(config, self.adapter, cap, cache, ledger, markers)
        summary = StudySummary(config.study, planned=len(plan.trials), skipped=len(already), rejected=plan.rejected,
                               budget_usd=config.budget_usd)
        order = {t.trial_id: i for i, t in enumerate(plan.trials)}
        records: list[TrialRecord] = []
        pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="replay")
        try:
            futures = [pool.submit(runner.run, t) for t in todo]
            for n, future in enumerate(as_completed(futures), 1):
                record = future.result()
                records.append(record)
                if on_record is not None:
                    on_record(record, n, len(todo))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if markers is not None:
                markers.close()
        records.sort(key=lambda r: order[r.trial_id])
        summary.records = records
        for r in records:
            if r.status == "ok":
                summary.ok += 1
            elif r.status == "missing":
                summary.missing += 1
            else:
                summary.errors += 1
        summary.spent_usd, summary.session_usd, summary.budget_high_water_usd = cap.spent, cap.session_usd, cap.high_water
        summary.markers = markers.written if markers else 0
        summary.cache_hits = sum(r.cache_hits for r in records)
        summary.cache_recorded = cache.recorded if cache else 0
        summary.seconds = time.perf_counter() - started
        return summary


def open_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any) -> Study:
    """Open the study's state (ledger, response cache, cumulative cap) and plan it.

    ``adapter`` is an Adapter or a plain function of the trial. The variants file is rewritten.
    """
    if not hasattr(adapter, "run") and callable(adapter):
        adapter = PythonAdapter(adapter)
    state = Path(config.state_dir) if config.state_dir is not None else None
    ledger = Ledger(state / "ledger.jsonl") if state else None
    cap = SpendCap(config.budget_usd, prior_usd=ledger.spent_usd() if ledger else 0.0)
    cache = ResponseCache(state / "responses.jsonl", config.cache_mode) if state and config.cache_mode != "off" else None
    planning = config
    if config.options.paraphraser is not None:
        scoped = _ScopedParaphraser(config.options.paraphraser, config.study, cap, cache)
        planning = replace(config, options=replace(config.options, paraphraser=scoped))
    plan = plan_study(planning, tasks, adapter)
    if state:
        write_jsonl(state / "variants.jsonl", [v.as_dict() for v in plan.variants])
    return Study(config, adapter, plan, ledger, cache, cap)


def run_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any, *,
              completed: set[str] | frozenset[str] = frozenset(),
              on_record: Callable[[TrialRecord, int, int], None] | None = None) -> StudySummary:
    """Plan and run a study (``open_study(...).run(...)``).

    ``adapter`` is an Adapter or a function of the trial; ``completed`` are trial ids already
    stored; ``on_record(record, done, total)`` is called in the calling thread as each trial ends.
    """
    return open_study(config, tasks, adapter).run(completed, on_record)


def trials_of(trajectories: Iterable[Trajectory], study: str) -> tuple[set[str], set[str]]:
    """(trial ids with a run, trial ids only recorded missing) of ``study`` among these runs."""
    runs: set[str] = set()
    missing: set[str] = set()
    for t in trajectories:
        tid = t.context.get("plumbline.trial.id")
        if tid is None or str(t.context.get("plumbline.study", "")) != study:
            continue
        (missing if is_missing(t) else runs).add(str(tid))
    return runs, missing - runs


def stored_trials(store: Any, study: str) -> tuple[set[str], set[str]]:
    """(trial ids with a stored run, trial ids stored only as missing markers) of ``study``."""
    store.assemble()
    rows = store.connection.execute(
        "SELECT json_extract_string(doc, '$.context.\"plumbline.trial.id\"') AS tid, "
        "lower(coalesce(json_extract_string(doc, '$.context.\"plumbline.trial.status\"'), '')) AS status "
        "FROM trajectories WHERE json_extract_string(doc, '$.context.\"plumbline.study\"') = ?", [study]).fetchall()
    runs = {tid for tid, status in rows if tid and status not in ("missing", "error")}
    missing = {tid for tid, status in rows if tid and status in ("missing", "error")} - runs
    return runs, missing
