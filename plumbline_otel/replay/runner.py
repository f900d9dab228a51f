"""The replay driver: plan a study's trials, run them through an adapter, record what happened.

``plan_study`` is pure: tasks × perturbations → guarded variants → trials (× repeats), each with
its deterministic identity. ``run_study`` runs a plan:

- one runner per study (``lock.StudyLock``), bounded concurrency inside it (a thread pool);
- every execution of a trial is a new *attempt* (numbered in the ledger, never reused) with its
  own trace, fresh ``TrialScope`` (cache, budget, a fault injector built from the variant's plan)
  and OTel context (its trace, the identity in baggage); retries of transient errors are new
  attempts with exponential backoff;
- the spend cap: a trial starts only if its reservation (the declared per-trial maximum, or the
  model price table × the task's recorded tokens × a margin) fits what the study has left;
  metered model calls grow the reservation or are refused; the account lives in the ledger under
  a file lock, so threads and processes share it;
- a trial is ``ok`` only when its run reached the sink; a trial that started and left no run
  (the adapter raised, timed out, or no trace arrived) is ``errored``; one never started (cap,
  interrupted) is ``missing``. Both get a marker span with the reason in the attempt's trace;
- resume: trials whose run is in the store or whose ledger row says ``ok`` are skipped; without
  ``resume`` such a study is refused, and ``rerun`` runs finished trials again as new attempts.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opentelemetry import baggage, context, trace
from opentelemetry.trace import NonRecordingSpan

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.adapters import PythonAdapter, TransientAdapterError, Trial, TrialOutcome
from plumbline_otel.replay.budget import BudgetExceeded, SpendCap, TrialBudget, cost_usd
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.export import MarkerWriter, SpanSink, trial_span_context
from plumbline_otel.replay.identity import TrialIdentity, trial_id_for
from plumbline_otel.replay.ledger import Ledger, write_jsonl
from plumbline_otel.replay.lock import StudyLock
from plumbline_otel.replay.perturb import PerturbOptions, Variant, build_variants
from plumbline_otel.replay.scope import FaultInjector, TrialScope, activate
from plumbline_otel.replay.tasks import ReplayTask
from plumbline_otel.runs import FAULT


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
    trial_max_usd: float | None = None  # declared per-trial maximum: the reservation when given
    estimate_margin: float = 1.5  # a token-based reservation is the source run's cost × this
    resume: bool = False
    rerun: bool = False  # run trials already done again, each as a new attempt (a separate run)
    trace_wait_s: float = 5.0  # how long a finished attempt's trace may take to reach the sink
    # Whether a trace is in the store the sink feeds: how runs exported by agents in other
    # processes straight to an endpoint are seen (the CLI asks the server's API).
    trace_stored: Callable[[str], bool] | None = None
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
        if self.trial_max_usd is not None and self.trial_max_usd < 0:
            raise ReplayError("trial_max_usd must not be negative")


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
                                         variant.perturbation, variant.variant_id, config.study, k, task.task_key,
                                         fault=variant.fault)
                trials.append(Trial(identity, task, variant.text, dict(variant.metadata), variant.fault, config.sink))
    return Plan(tuple(variants), tuple(trials))


@dataclass
class TrialRecord:
    """How one trial ended: ok (its run reached the sink), errored (started, no run), missing (never started)."""

    trial_id: str
    task_key: str | None
    perturbation: str
    variant: str
    repeat: int
    status: str
    reason: str | None = None
    attempts: int = 0  # executions in this run of the study
    attempt: int = 0  # the number of the last one (0: never started)
    cost_usd: float = 0.0
    trace_id: str | None = None
    seconds: float = 0.0
    model_calls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    fault: str | None = None
    fault_fired: bool | None = None
    reserved_usd: float = 0.0
    overrun_usd: float = 0.0  # an adapter's reported cost beyond its reservation

    def row(self) -> dict[str, Any]:
        return {**self.__dict__, "at": time.time()}


@dataclass
class StudySummary:
    study: str
    planned: int = 0
    skipped: int = 0
    ok: int = 0
    missing: int = 0
    errored: int = 0
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
    recovered: list[TrialRecord] = field(default_factory=list)  # attempts a dead runner left unfinished

    @property
    def ran(self) -> int:
        return self.ok + self.missing + self.errored

    def faults(self) -> tuple[int, int]:
        """(fired, planned) over tool_fault trials that ran."""
        faulted = [r for r in self.records if r.fault and r.status == "ok"]
        return sum(bool(r.fault_fired) for r in faulted), len(faulted)

    def as_dict(self) -> dict[str, Any]:
        fired, faulted = self.faults()
        return {
            "study": self.study, "planned": self.planned, "skipped_resume": self.skipped, "ok": self.ok,
            "missing": self.missing, "errored": self.errored, "rejected_variants": len(self.rejected),
            "rejections": [v.as_dict() for v in self.rejected], "spent_usd": self.spent_usd,
            "session_usd": self.session_usd, "budget_usd": self.budget_usd,
            "budget_high_water_usd": self.budget_high_water_usd, "markers": self.markers,
            "cache_hits": self.cache_hits, "cache_recorded": self.cache_recorded,
            "faults_fired": fired, "fault_trials": faulted, "seconds": round(self.seconds, 3),
            "recovered": [{"trial_id": r.trial_id, "attempt": r.attempt, "reason": r.reason} for r in self.recovered],
            "overruns": [{"trial_id": r.trial_id, "reserved_usd": r.reserved_usd, "overrun_usd": r.overrun_usd}
                         for r in self.records if r.overrun_usd > 0],
        }

    def render(self) -> str:
        lines = [f"study {self.study}: {self.planned} trials planned; ran {self.ran} ({self.ok} ok, "
                 f"{self.missing} missing, {self.errored} errored), {self.skipped} skipped by resume; "
                 f"{len(self.rejected)} variant(s) rejected by the guard; {self.seconds:.1f}s"]
        for r in self.recovered[:10]:
            lines.append(f"  recorded missing {r.trial_id}: {r.reason}")
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
        for r in self.records:
            if r.overrun_usd > 0:
                lines.append(f"  OVERRUN {r.trial_id}: reported ${r.reserved_usd + r.overrun_usd:.4f} against a "
                             f"${r.reserved_usd:.4f} reservation; the study stopped (declare a larger --trial-max-usd)")
        problems = [r for r in self.records if r.status in ("missing", "errored")]
        for r in problems[:10]:
            lines.append(f"  {r.status} {r.trial_id}: {r.reason}")
        if len(problems) > 10:
            lines.append(f"  … and {len(problems) - 10} more (ledger.jsonl)")
        if self.markers:
            lines.append(f"  {self.markers} marker(s) exported: certify counts errored trials as failing runs, "
                         "missing ones beside n")
        return "\n".join(lines)


@contextmanager
def otel_trial_context(trial: Trial) -> Iterator[None]:
    """Make the attempt's trace (its virtual root as parent) and identity baggage current."""
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
                 ledger: Ledger | None, markers: MarkerWriter | None, reservations: dict[str, float]) -> None:
        self.config, self.adapter, self.cap, self.cache = config, adapter, cap, cache
        self.ledger, self.markers, self.reservations = ledger, markers, reservations
        self.stop = threading.Event()
        self.stop_reason: str | None = None
        self._attempts: dict[str, int] = {}  # without a ledger: attempt numbers of this process
        self._lock = threading.Lock()

    def _label(self, trial: Trial) -> tuple[str | None, str | None]:
        service = self.config.service or getattr(self.adapter, "service", None)
        if service:
            version = self.config.service_version or (getattr(self.adapter, "service_version", None) if not self.config.service else None)
            return service, version
        return trial.task.service, trial.task.service_version

    def _begin(self, trial: Trial) -> Trial:
        """The trial's next attempt, numbered before it runs or is marked (so no number, and no
        trace, is ever used twice, even after a crash)."""
        if self.ledger is not None:
            attempt = self.ledger.begin_attempt(trial.trial_id)
        else:
            with self._lock:
                attempt = self._attempts[trial.trial_id] = self._attempts.get(trial.trial_id, 0) + 1
        return replace(trial, identity=trial.identity.at_attempt(attempt))

    def run(self, trial: Trial) -> TrialRecord:
        started = time.perf_counter()
        ident = trial.identity
        record = TrialRecord(ident.trial_id, ident.task_key, ident.perturbation, ident.variant, ident.repeat,
                             status="missing", fault=str(trial.fault) if trial.fault else None)
        current = trial
        try:
            current = self._run(trial, record)
        except Exception as exc:  # a driver bug must not take the study down with it
            record.status, record.reason = "errored", f"driver: {type(exc).__name__}: {exc}"
        record.seconds = round(time.perf_counter() - started, 4)
        if record.status in ("missing", "errored") and self.markers is not None:
            if current is trial:  # never started: the marker still takes a number, so no later run shares its trace
                current = self._begin(trial)
            record.attempt = current.identity.attempt
            service, version = self._label(current)
            self.markers.write(current.identity, record.status, record.reason or record.status, service=service,
                               version=version, attempts=record.attempts)
        if self.ledger is not None:
            self.ledger.append(record.row())
        return record

    def _halt(self, reason: str) -> None:
        with self._lock:
            if not self.stop.is_set():
                self.stop_reason = reason
                self.stop.set()

    def _run(self, trial: Trial, record: TrialRecord) -> Trial:
        """Run the trial's attempts; returns the last attempt (whose trace a marker goes into)."""
        if self.stop.is_set():
            record.reason = f"not started: {self.stop_reason}"
            return trial
        estimate = self.reservations.get(trial.trial_id, 0.0)
        budget = TrialBudget.open(self.cap, estimate)
        if budget is None:
            reason = (f"budget: not started, its ${estimate:.4f} reservation does not fit the ${self.cap.limit:.2f} cap "
                      f"(spent ${self.cap.spent:.4f}, ${self.cap.reserved:.4f} reserved)")
            self._halt(reason)
            record.reason = reason
            return trial
        record.reserved_usd = estimate
        outcome: TrialOutcome | None = None
        scope: TrialScope | None = None
        attempt = trial
        try:
            while True:
                attempt = self._begin(trial)
                record.attempts += 1
                record.attempt = attempt.identity.attempt
                scope = TrialScope(attempt.identity, budget, self.cache,
                                   FaultInjector(trial.fault) if trial.fault else None, attempt.identity.attempt)
                outcome, error, retry = self._attempt(attempt, scope, record.attempts)
                if retry is not None:
                    time.sleep(retry)
                    continue
                if error is not None:
                    record.status, record.reason = "errored", error
                break
        finally:
            record.cost_usd = round(budget.close(outcome.cost_usd if outcome else None), 8)
            record.overrun_usd = round(budget.overrun, 8)
            if budget.overrun > 0:
                self._halt(f"adapter reported ${record.cost_usd:.4f} for {trial.trial_id}, over its ${estimate:.4f} "
                           "reservation: the cap can no longer be guaranteed")
            if scope is not None:
                record.model_calls, record.cache_hits, record.cache_misses = scope.model_calls, scope.cache_hits, scope.cache_misses
        if trial.fault is not None and scope is not None and scope.fault is not None:
            record.fault_fired = scope.fault.fired or bool(outcome is not None and outcome.fault_fired is True)
        if outcome is not None:
            self._confirm(attempt, outcome, record)
        return attempt

    def _attempt(self, attempt: Trial, scope: TrialScope, n: int) -> tuple[TrialOutcome | None, str | None, float | None]:
        """One execution: (outcome, None, None) on success, (None, reason, None) when it is over,
        (None, None, delay) when a transient error should be retried."""
        try:
            with activate(scope), otel_trial_context(attempt):
                return TrialOutcome.coerce(self.adapter.run(attempt)), None, None
        except Exception as exc:
            if scope.abort_reason:  # the driver refused a model call (cap, offline cache): the agent stopped
                return None, scope.abort_reason, None
            if isinstance(exc, BudgetExceeded):
                return None, f"budget: {exc}", None
            retry = self.config.retry
            if retry.is_transient(exc) and n < retry.max_attempts and not self.stop.is_set():
                return None, None, retry.delay(n, getattr(exc, "retry_after", None))
            retried = f" (after {n} attempts)" if n > 1 else ""
            return None, f"{type(exc).__name__}: {exc}{retried}", None

    def _confirm(self, attempt: Trial, outcome: TrialOutcome, record: TrialRecord) -> None:
        """ok only once the attempt's run reached the sink; otherwise errored, and resume runs it again."""
        trace_id = outcome.trace_id or attempt.trace_id
        record.trace_id = trace_id
        sink = self.config.sink
        if sink is None or sink.wait_for_trace(trace_id, self.config.trace_wait_s, self.config.trace_stored):
            record.status, record.reason = "ok", None
        else:
            record.status = "errored"
            record.reason = f"no trace received: trace {trace_id} did not reach {sink.describe()} within {self.config.trace_wait_s:g}s"


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


def reservations_for(config: StudyConfig, trials: Sequence[Trial]) -> dict[str, float]:
    """What each trial reserves before it starts: the declared per-trial maximum, else the model
    price table × the source run's recorded tokens × ``estimate_margin``.

    Refuses a capped study with a trial neither can price: a zero reservation let adapters that
    report their own cost overshoot a $1.00 cap to $3.30.
    """
    if config.budget_usd is None:
        return {t.trial_id: config.trial_max_usd or 0.0 for t in trials}
    if config.trial_max_usd is not None:
        return {t.trial_id: config.trial_max_usd for t in trials}
    out: dict[str, float] = {}
    unpriced: set[str] = set()
    for t in trials:
        task = t.task
        cost = cost_usd(task.model, task.input_tokens, task.output_tokens) if task.input_tokens or task.output_tokens else None
        if cost is None:
            unpriced.add(task.task_key)
        else:
            out[t.trial_id] = cost * config.estimate_margin
    if unpriced:
        raise ReplayError(f"a spend cap needs a reservation per trial, and {len(unpriced)} task(s) have no priced token "
                          f"counts to estimate one from (e.g. {sorted(unpriced)[0]}); declare a per-trial maximum "
                          "(--trial-max-usd)")
    return out


class Study:
    """A study opened for running: its plan, ledger, cache and cap (``open_study`` builds it)."""

    def __init__(self, config: StudyConfig, adapter: Any, plan: Plan, ledger: Ledger | None, cache: ResponseCache | None,
                 cap: SpendCap) -> None:
        self.config, self.adapter, self.plan, self.ledger, self.cache, self.cap = config, adapter, plan, ledger, cache, cap

    def run(self, completed: set[str] | frozenset[str] = frozenset(),
            on_record: Callable[[TrialRecord, int, int], None] | None = None) -> StudySummary:
        """Run the planned trials not yet done (``completed``: trial ids with a stored run).

        Holds the study's lock throughout: a second runner is refused (``StudyLocked``).
        """
        if self.config.state_dir is None:
            return self._run(completed, on_record)
        with StudyLock(self.config.state_dir, self.config.study):
            if self.ledger is not None:
                self.ledger.reload()  # what a runner that held the lock before us did
            return self._run(completed, on_record)

    def _run(self, completed: set[str] | frozenset[str],
             on_record: Callable[[TrialRecord, int, int], None] | None) -> StudySummary:
        config, plan, ledger, cache, cap = self.config, self.plan, self.ledger, self.cache, self.cap
        started = time.perf_counter()
        done = set(completed) | (ledger.completed() if ledger else set())
        already = [t for t in plan.trials if t.trial_id in done]
        if already and not (config.resume or config.rerun):
            raise ReplayError(f"study {config.study!r} already has {len(already)} of its {len(plan.trials)} trials done "
                              f"(e.g. {already[0].trial_id}); pass --resume to run only the rest, --rerun to run them "
                              "all again as new attempts (separate runs), or choose a new --study")
        todo = list(plan.trials) if config.rerun else [t for t in plan.trials if t.trial_id not in done]
        reservations = reservations_for(config, todo)
        markers = MarkerWriter(config.sink) if config.sink is not None else None
        runner = _Runner(config, self.adapter, cap, cache, ledger, markers, reservations)
        summary = StudySummary(config.study, planned=len(plan.trials), skipped=len(plan.trials) - len(todo),
                               rejected=plan.rejected, budget_usd=config.budget_usd)
        order = {t.trial_id: i for i, t in enumerate(plan.trials)}
        records: list[TrialRecord] = []
        recovered = self._interrupted(runner, ledger, done) if ledger is not None else []
        pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="replay")
        interrupted = False
        futures = [pool.submit(runner.run, t) for t in todo]
        collected: set[Any] = set()
        try:
            for future in as_completed(futures):
                collected.add(future)
                records.append(future.result())
                if on_record is not None:
                    on_record(records[-1], len(records), len(todo))
        except KeyboardInterrupt:
            # Ctrl-C: running trials finish; queued ones are recorded missing ("not started: interrupted")
            interrupted = True
            runner._halt("interrupted")
            records.extend(f.result() for f in futures if f not in collected)
        finally:
            pool.shutdown(wait=True)
            if markers is not None:
                markers.close()
        records.sort(key=lambda r: order[r.trial_id])
        summary.records = records
        summary.recovered = recovered
        summary.ok = sum(r.status == "ok" for r in records)
        summary.missing = sum(r.status == "missing" for r in records)
        summary.errored = sum(r.status == "errored" for r in records)
        summary.spent_usd, summary.session_usd, summary.budget_high_water_usd = cap.spent, cap.session_usd, cap.high_water
        summary.markers = markers.written if markers else 0
        summary.cache_hits = sum(r.cache_hits for r in records)
        summary.cache_recorded = cache.recorded if cache else 0
        summary.seconds = time.perf_counter() - started
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _interrupted(self, runner: _Runner, ledger: Ledger, done: set[str]) -> list[TrialRecord]:
        """Attempts a runner that died left started and unfinished: each is recorded missing
        ("interrupted"), with a marker in that attempt's trace; the trial runs again as a new attempt."""
        by_id = {t.trial_id: t for t in self.plan.trials}
        out = []
        for trial_id, (attempt, pid) in ledger.unfinished().items():
            trial = by_id.get(trial_id)
            if trial is None or trial_id in done:
                continue
            ident = trial.identity.at_attempt(attempt)
            reason = f"interrupted: runner pid {pid} stopped during attempt {attempt}"
            record = TrialRecord(trial_id, ident.task_key, ident.perturbation, ident.variant, ident.repeat, "missing",
                                 reason, attempt=attempt, fault=str(trial.fault) if trial.fault else None)
            if runner.markers is not None:
                service, version = runner._label(trial)
                runner.markers.write(ident, "missing", reason, service=service, version=version)
            ledger.append(record.row())
            out.append(record)
        return out


def open_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any) -> Study:
    """Open the study's state (ledger, response cache, cumulative cap) and plan it.

    ``adapter`` is an Adapter or a plain function of the trial. The variants file is rewritten.
    """
    if not hasattr(adapter, "run") and callable(adapter):
        adapter = PythonAdapter(adapter)
    state = Path(config.state_dir) if config.state_dir is not None else None
    ledger = Ledger(state / "ledger.jsonl") if state else None
    cap = SpendCap(config.budget_usd, journal=ledger.path if ledger else None)
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
