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
- the driver is the witness: every planned trial and every attempt gets a *record* (status and
  reason, the attempt's trace, the fault and whether the driver saw it fire, the cost and whether
  a meter counted it), written to the ledger and, as a span in a trace of its own, to the study's
  sink beside the runs (`plumbline_otel.trials`); certify reads those, never the agent's word;
- an attempt is ``ok`` when the agent ran and its run reached the sink; ``errored`` when the agent
  ran and raised (``SystemExit`` included), timed out, exited non-zero or left no trace;
  ``missing`` when it never reached the agent (cap, interrupted, refused at the door). Only a
  missing attempt is retried or resumed: an errored one is the trial's result;
- the spend cap: an attempt starts only if its reservation fits; one that does not fit waits
  while running attempts may settle, and is missing only when none is left running;
- resume: decided trials (an attempt ran) are skipped; without ``resume`` such a study is
  refused, and ``rerun`` runs them again as *new trials* (the next free repeat numbers).
"""

from __future__ import annotations

import hashlib
import heapq
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import orjson
from opentelemetry import baggage, context, trace
from opentelemetry.trace import NonRecordingSpan

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.adapters import AttemptInterrupted, PythonAdapter, TransientAdapterError, Trial, TrialOutcome
from plumbline_otel.replay.budget import BudgetExceeded, SpendCap, TrialBudget, cost_usd
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.export import RecordWriter, SpanSink, trial_span_context
from plumbline_otel.replay.identity import TrialIdentity, trial_id_for
from plumbline_otel.replay.ledger import Ledger, write_jsonl
from plumbline_otel.replay.lock import StudyLock
from plumbline_otel.replay.perturb import Paraphraser, PerturbOptions, Variant, build_variants
from plumbline_otel.replay.pgstate import LeaseLost, PgLedger
from plumbline_otel.replay.scope import FaultInjector, TrialScope, activate
from plumbline_otel.replay.sequential import SequentialStop, order_seed, task_order
from plumbline_otel.replay.tape import base_perturbation, branch_variants
from plumbline_otel.replay.tasks import ReplayTask
from plumbline_otel.runs import (
    COST_BASIS,
    COST_METERED,
    COST_REPORTED,
    COST_USD,
    EVIDENCE,
    FAULT,
    FAULT_CLAIMED,
    FAULT_FIRED,
    FAULT_PERTURBATIONS,
    FAULT_PLANNED,
    FAULT_SOURCE,
    RECORD_AT,
    RECORD_KIND,
    REQUEST_PERTURBATIONS,
    RUN_TRACE,
    SEALED_SPANS,
    SEEN,
    SEEN_BY,
    SEQUENTIAL,
    TRACE_CLAIMED,
    TRIAL_REASON,
    TRIAL_STATUS,
    WINDOW_END,
)
from plumbline_otel.trials import DECIDED, RAN, STATE_FILE, KeyRing, new_key

RESERVATION_WAIT_S = 3600.0  # longest a reservation waits for running trials to free room


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff on transient errors; ``max_attempts`` counts the first try."""

    max_attempts: int = 3
    base_delay_s: float = 0.5
    factor: float = 2.0
    max_delay_s: float = 30.0
    # Only errors that say the agent was never reached: an in-process agent's own ConnectionError means it ran.
    transient: tuple[type[BaseException], ...] = (TransientAdapterError,)

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
    # Each attempt's evidence window: from its start to its end plus this grace (a BatchSpanProcessor's 5 s schedule,
    # with room for its export). Spans of its trace that arrive later are stored, marked late, and left out of its verdict.
    grace_s: float = 6.0
    # Whether a trace is in the store the sink feeds: how runs exported by agents in other
    # processes straight to an endpoint are seen (the CLI asks the server's API).
    trace_stored: Callable[[str], bool] | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    state_dir: str | Path | None = None  # ledger.jsonl, variants.jsonl, responses.jsonl
    cache_mode: str = "record"  # record | replay (offline) | off
    cassette: str | Path | None = None  # another study's state whose recorded exchanges serve this one, offline
    sink: SpanSink | None = None
    service: str | None = None  # label on the driver's records (default: the adapter's, then the task's)
    service_version: str | None = None
    # Witnesses in the agent's path, each with open_trial(trial, budget) -> route (.env()) and
    # close_trial(route) -> evidence (.as_dict()): the model-API proxy (`replay.proxy.ModelProxy`)
    # and the MCP proxy. Every attempt gets its own routes; what they saw goes into its record.
    proxies: Sequence[Any] = ()
    # Sequential: stop each cell once the anytime-valid bound decides it against `target`
    # (`replay.sequential`); `judge(trace_id, identity)` says whether a run, placed by its trial's identity, held every critical invariant.
    target: float | None = None
    min_tasks: int = 5
    judge: Callable[[str, Mapping[str, Any]], bool | None] | None = None
    # Shared study state (`replay.pgstate`): runners on several machines share one ledger, one exact
    # spend cap and the trials, each claimed by one runner at a time.
    state_url: str | None = None
    # Branch-point replay (issue 44, `replay.tape`): "each" or the steps to branch at, and each task's tape (by task key);
    # a task without one is listed in branch_missing with why. None: every trial starts from the task's first request.
    branch_at: str | tuple[int, ...] | None = None
    tapes: Mapping[str, Any] = field(default_factory=dict)
    branch_missing: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.study or "/" in self.study:
            raise ReplayError(f"study name {self.study!r}: must be non-empty and contain no '/'")
        if self.grace_s < 0:
            raise ReplayError("the evidence window's grace must not be negative")
        if self.repeats < 1 or self.concurrency < 1:
            raise ReplayError("repeats and concurrency must be at least 1")
        if self.trial_max_usd is not None and self.trial_max_usd < 0:
            raise ReplayError("trial_max_usd must not be negative")
        if self.target is not None and (self.judge is None or not 0.0 < self.target < 1.0 or self.min_tasks < 2):
            raise ReplayError("a sequential study needs a target in (0, 1), at least 2 --min-tasks and a judge of its runs (--spec)")


@dataclass(frozen=True)
class Plan:
    variants: tuple[Variant, ...]
    trials: tuple[Trial, ...]

    @property
    def rejected(self) -> list[Variant]:
        return [v for v in self.variants if v.rejected]


def plan_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any = None, instance: str = "") -> Plan:
    """Variants and trials, in a deterministic order (task, perturbation, variant, repeat).

    A domain adapter may offer its own ``decoy_tools`` (used unless the options name others) and
    ``fault_tools`` (preferred fault targets, among the tools each task's source run called).
    ``instance`` is the study state's random id, carried by every attempt's identity.
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
        built = build_variants(task, config.perturbations, options)
        if config.branch_at is not None:  # each branch point a cell: its label carries the step (tool_fault@3)
            built = branch_variants(built, config.tapes.get(task.task_key), config.branch_at,
                                    config.branch_missing.get(task.task_key, ""))
        for variant in built:
            variants.append(variant)
            if variant.rejected:
                continue
            for k in range(config.repeats):
                identity = TrialIdentity(trial_id_for(config.study, task.task_key, variant.perturbation, variant.variant_id, k),
                                         variant.perturbation, variant.variant_id, config.study, k, task.task_key,
                                         fault=variant.fault, instance=instance)
                trials.append(Trial(identity, task, variant.text, dict(variant.metadata), variant.fault, config.sink))
    return Plan(tuple(variants), tuple(trials))


@dataclass
class TrialRecord:
    """How one trial ended in this run of the study, as the driver saw it.

    ``status``: ok (the agent ran and its run reached the sink), errored (the agent ran and crashed,
    hung, exited non-zero or left no trace) or missing (no attempt reached the agent: cap,
    interrupted, refused at the door). ``fault_fired`` is what the driver (or a proxy) saw; the
    adapter's own report is kept apart in ``fault_claimed``. ``metered`` is false when the cost is
    the adapter's own report (or the whole reservation), not what a plumbline meter counted.
    """

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
    fault_source: str | None = None
    fault_claimed: bool | None = None
    seen: bool | None = None  # decoy_tools / sampling: seen in a model request
    seen_by: str | None = None
    metered: bool | None = None
    cost_basis: str | None = None  # whose figure cost_usd is (`runs.COST_BASIS`)
    cost_reported_usd: float | None = None  # what the run's own spans reported (gen_ai.usage.cost.*), never what settles it
    reserved_usd: float = 0.0
    overrun_usd: float = 0.0  # an adapter's reported cost beyond its reservation
    trace_claimed: str | None = None  # a trace the adapter named that is not the attempt's: a conflict, never judged
    evidence: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {**self.__dict__, "at": time.time()}

    def attributes(self, cost_usd: float) -> dict[str, Any]:
        """The driver's record of the current attempt (`plumbline_otel.trials`), as span attributes."""
        return {
            RECORD_KIND: "attempt", TRIAL_STATUS: self.status, TRIAL_REASON: (self.reason or "")[:500] or None,
            RUN_TRACE: self.trace_id, FAULT_PLANNED: self.fault, FAULT_FIRED: self.fault_fired, FAULT_SOURCE: self.fault_source,
            FAULT_CLAIMED: self.fault_claimed, SEEN: self.seen, SEEN_BY: self.seen_by, COST_USD: round(cost_usd, 8),
            COST_METERED: self.metered, COST_BASIS: self.cost_basis, COST_REPORTED: self.cost_reported_usd,
            TRACE_CLAIMED: self.trace_claimed,
            RECORD_AT: time.time_ns(), EVIDENCE: orjson.dumps(self.evidence).decode() if self.evidence else None,
        }


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
    written: int = 0  # the driver's records sent to the sink
    cache_hits: int = 0
    cache_recorded: int = 0
    seconds: float = 0.0
    instance: str = ""
    rerun_as: int = 0  # trials run again as new trials (--rerun)
    released_usd: float = 0.0  # reservations of dead runners released on resume
    stopped: int = 0  # trials a sequential study did not run: their cell was decided first
    elsewhere: int = 0  # trials of a shared study another runner held or had decided
    decided_cells: dict[str, str] = field(default_factory=dict)  # perturbation -> how the study decided it
    recovered: list[TrialRecord] = field(default_factory=list)  # attempts a dead runner left unfinished
    keys: KeyRing = field(default_factory=KeyRing)  # the study state's key: what verifies its records (never an agent's)

    @property
    def ran(self) -> int:
        return self.ok + self.missing + self.errored + self.stopped

    def faults(self) -> tuple[int, int]:
        """(fired, planned) over faulted trials the agent ran, as the driver saw them."""
        faulted = [r for r in self.records if r.fault and r.status in ("ok", "errored")]
        return sum(r.fault_fired is True for r in faulted), len(faulted)

    def unmetered(self) -> list[TrialRecord]:
        """Trials the agent ran whose cost no plumbline meter fully saw (the reservation, an estimate, or the adapter's higher report)."""
        return [r for r in self.records if r.status in ("ok", "errored") and r.metered is False]

    def as_dict(self) -> dict[str, Any]:
        fired, faulted = self.faults()
        return {
            "study": self.study, "instance": self.instance, "planned": self.planned, "skipped_resume": self.skipped,
            "ok": self.ok, "missing": self.missing, "errored": self.errored, "stopped": self.stopped,
            "decided_cells": self.decided_cells, "rerun_as_new_trials": self.rerun_as,
            "rejected_variants": len(self.rejected),
            "rejections": [v.as_dict() for v in self.rejected], "spent_usd": self.spent_usd,
            "session_usd": self.session_usd, "budget_usd": self.budget_usd,
            "budget_high_water_usd": self.budget_high_water_usd, "records_written": self.written,
            "cache_hits": self.cache_hits, "cache_recorded": self.cache_recorded,
            "faults_fired": fired, "fault_trials": faulted, "seconds": round(self.seconds, 3),
            "unmetered_trials": [r.trial_id for r in self.unmetered()],
            "recovered": [{"trial_id": r.trial_id, "attempt": r.attempt, "reason": r.reason} for r in self.recovered],
            "overruns": [{"trial_id": r.trial_id, "reserved_usd": r.reserved_usd, "overrun_usd": r.overrun_usd}
                         for r in self.records if r.overrun_usd > 0],
        }

    def render(self) -> str:
        stopped = f", {self.stopped} stopped" if self.stopped else ""
        lines = [f"study {self.study}: {self.planned} trials planned; ran {self.ran} ({self.ok} ok, "
                 f"{self.missing} missing, {self.errored} errored{stopped}), {self.skipped} skipped by resume; "
                 f"{len(self.rejected)} variant(s) rejected by the guard; {self.seconds:.1f}s"]
        if self.elsewhere:
            lines.append(f"  shared study: {self.elsewhere} trial(s) were held or decided by other runners")
        for how in sorted(self.decided_cells.values()):
            lines.append(f"  sequential: {how.removeprefix('not run: ')}; its remaining trials were not run")
        if self.rerun_as:
            lines.append(f"  --rerun: {self.rerun_as} trial(s) already decided ran again as new trials (new repeat numbers)")
        for r in self.recovered[:10]:
            lines.append(f"  recorded missing {r.trial_id}: {r.reason}")
        if self.released_usd:
            lines.append(f"  released ${self.released_usd:.4f} a dead runner still held reserved")
        for v in self.rejected[:10]:
            lines.append(f"  rejected {v.task_key} {v.perturbation}/{v.variant_id}: {v.rejected}")
        if len(self.rejected) > 10:
            lines.append(f"  … and {len(self.rejected) - 10} more (variants.jsonl)")
        fired, faulted = self.faults()
        if faulted:
            lines.append(f"  faults seen by the driver to fire in {fired}/{faulted} faulted trials the agent ran")
        cap = f" of ${self.budget_usd:.2f}" if self.budget_usd is not None else ""
        lines.append(f"  spend ${self.session_usd:.4f} this run, ${self.spent_usd:.4f}{cap} for the study; "
                     f"cache: {self.cache_hits} hits, {self.cache_recorded} recorded")
        unmetered = self.unmetered()
        if unmetered:
            lines.append(f"  UNMETERED: {len(unmetered)} trial(s) spent money no plumbline meter fully saw; their cost is the whole "
                         "reservation, an upper-bound estimate of the calls whose usage never came, or the adapter's higher "
                         "report, never less (route the agent through `--proxy`)")
        for r in self.records:
            if r.overrun_usd > 0:
                lines.append(f"  OVERRUN {r.trial_id}: reported ${r.reserved_usd + r.overrun_usd:.4f} against a "
                             f"${r.reserved_usd:.4f} reservation; the study stopped (declare a larger --trial-max-usd)")
        problems = [r for r in self.records if r.status in ("missing", "errored", "duplicate")]
        for r in problems[:10]:
            lines.append(f"  {r.status} {r.trial_id}: {r.reason}")
        if len(problems) > 10:
            lines.append(f"  … and {len(problems) - 10} more (ledger.jsonl)")
        if self.written:
            lines.append(f"  {self.written} driver record(s) written beside the runs: certify takes each trial's status, "
                         "exposure and cost from them, never from the agent's spans")
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
                 ledger: Ledger | None, records: RecordWriter | None, reservations: dict[str, float],
                 sequential: SequentialStop | None = None, claims: Any = None, sealer: _Sealer | None = None) -> None:
        self.config, self.adapter, self.cap, self.cache = config, adapter, cap, cache
        self.ledger, self.records, self.reservations = ledger, records, reservations
        self.sequential, self.claims, self.sealer = sequential, claims, sealer
        self.stop = threading.Event()
        self.stop_reason: str | None = None
        self._attempts: dict[str, int] = {}  # without a ledger: attempt numbers of this process
        self._lock = threading.Lock()
        self._running = 0  # attempts holding a reservation: while any does, one that does not fit waits

    def _label(self, trial: Trial) -> tuple[str | None, str | None]:
        service = self.config.service or getattr(self.adapter, "service", None)
        if service:
            version = self.config.service_version or (getattr(self.adapter, "service_version", None) if not self.config.service else None)
            return service, version
        return trial.task.service, trial.task.service_version

    def _begin(self, trial: Trial) -> Trial:
        """The trial's next attempt, numbered before it runs (so no number, and no trace, is ever
        used twice, even after a crash)."""
        if self.ledger is not None:
            attempt = self.ledger.begin_attempt(trial.trial_id)
        else:
            with self._lock:
                attempt = self._attempts[trial.trial_id] = self._attempts.get(trial.trial_id, 0) + 1
        return replace(trial, identity=trial.identity.at_attempt(attempt))

    def plan(self, trials: Sequence[Trial]) -> None:
        """Record every planned trial, so one no attempt ever reached still counts as missing."""
        if self.records is None:
            return
        for trial in trials:
            service, version = self._label(trial)
            self.records.add(trial.identity, {RECORD_KIND: "plan", FAULT_PLANNED: planned_fault(trial),
                                              SEQUENTIAL: self.sequential is not None},
                             service=service, version=version)
        self.records.flush()

    def run(self, trial: Trial) -> TrialRecord:
        """Attempt the trial until an attempt reaches the agent (or retries run out); every attempt is recorded."""
        started = time.perf_counter()
        ident = trial.identity
        record = TrialRecord(ident.trial_id, ident.task_key, ident.perturbation, ident.variant, ident.repeat,
                             status="missing", fault=planned_fault(trial))
        if self.claims is not None and not self.claims.claim(ident.trial_id):
            record.status, record.reason = "elsewhere", "held or decided by another runner of the study"
            return record
        stopped = self.sequential.stopped(trial) if self.sequential is not None else None
        if stopped is not None:
            attempt = self._begin(trial)
            record.status, record.reason, record.attempt, record.trace_id = "stopped", stopped, attempt.identity.attempt, attempt.trace_id
            self._write(attempt, record, 0.0)
            self._release(record)
            return record
        while (delay := self._attempt(trial, record)) is not None:
            time.sleep(delay)
        self._release(record)
        if self.sequential is not None:
            self.sequential.finish(trial, self._score(trial, record))
        record.seconds = round(time.perf_counter() - started, 4)
        return record

    def _release(self, record: TrialRecord) -> None:
        """Let another runner of a shared study have the trial (free again when it is still missing)."""
        if self.claims is not None:
            self.claims.finish(record.trial_id, decided=record.status in DECIDED)

    def _score(self, trial: Trial, record: TrialRecord) -> bool | None:
        """For a sequential study: conforming, failing, or not scored, by the certificate's rules (`trials.py`)."""
        if record.status == "errored":
            return False
        if record.status != "ok" or self.config.judge is None or record.trace_id is None:
            return None
        if (base_perturbation(record.perturbation) in FAULT_PERTURBATIONS and not record.fault_fired) or (
                base_perturbation(record.perturbation) in REQUEST_PERTURBATIONS and not record.seen):
            return None
        return self.config.judge(record.trace_id, trial.identity.attributes())

    def _halt(self, reason: str) -> None:
        with self._lock:
            if not self.stop.is_set():
                self.stop_reason = reason
                self.stop.set()

    def _reserve(self, trial: Trial) -> tuple[TrialBudget | None, str | None]:
        """The attempt's reservation; one that does not fit waits while running attempts may free
        room, and gives up (the trial is missing) only when none is left running."""
        if self.stop.is_set():
            return None, f"not started: {self.stop_reason}"
        estimate = self.reservations.get(trial.trial_id, 0.0)
        budget = TrialBudget.open_wait(self.cap, estimate, RESERVATION_WAIT_S, lambda: self._running > 0 and not self.stop.is_set())
        if budget is None:
            return None, (f"budget: not started, its ${estimate:.4f} reservation does not fit the ${self.cap.limit:.2f} "
                          f"cap (spent ${self.cap.spent:.4f}, ${self.cap.reserved:.4f} reserved)")
        with self._lock:
            self._running += 1
        return budget, None

    def _attempt(self, trial: Trial, record: TrialRecord) -> float | None:
        """One attempt, numbered and recorded (ledger and store) whatever happens; the delay before a retry, or None."""
        attempt = self._begin(trial)
        record.attempts += 1
        record.attempt = attempt.identity.attempt
        record.trace_id, record.fault_fired, record.fault_source, record.fault_claimed = attempt.trace_id, None, None, None
        record.seen, record.seen_by, record.evidence, record.trace_claimed = None, None, {}, None
        budget: TrialBudget | None = None
        scope: TrialScope | None = None
        outcome: TrialOutcome | None = None
        retry: float | None = None
        routes: list[tuple[Any, Any]] = []
        status: str = "missing"
        reason: str | None = "driver: the attempt did not run"
        ran = False
        try:
            budget, reason = self._reserve(trial)
            if budget is not None:
                record.reserved_usd = budget.reserved
                scope = TrialScope(attempt.identity, budget, self.cache,
                                   FaultInjector(trial.fault) if trial.fault else None, attempt.identity.attempt,
                                   metadata=dict(trial.metadata))
                tape = self.config.tapes.get(trial.task.task_key) if trial.metadata.get("branch_at") else None
                routes = [(proxy, proxy.open_trial(attempt, budget) if tape is None else proxy.open_trial(attempt, budget, tape=tape))
                          for proxy in self.config.proxies]
                attempt = replace(attempt, routes={k: v for _, route in routes for k, v in route.env().items()})
                status, reason, outcome, retry = self._execute(attempt, scope, record.attempts)
                ran = status in RAN or (reason or "").startswith("interrupted: the runner was stopped during")  # it may have spent
        except Exception as exc:  # a driver bug: whether the agent ran is unknown, so the trial is not its result
            status, reason, retry = "missing", f"driver: {type(exc).__name__}: {exc}", None
        finally:
            evidence = [proxy.close_trial(route) for proxy, route in routes]
            if status == "ok":  # its run: the trace the driver minted, which the proxies wrote into or which must arrive
                status, reason = self._arrived(attempt, evidence)
            status, reason, retry = _plumbline_failed(status, reason, retry, evidence, self.config.retry,
                                                      record.attempts, self.stop.is_set())
            record.status, record.reason = status, reason
            cost = self._settle(record, budget, outcome, ran)
            self._witness(record, scope, outcome, evidence)
            self._write(attempt, record, cost)
            if self.sealer is not None and record.status in RAN:
                self.sealer.add(attempt, *self._label(attempt))
        return None if record.status == "duplicate" else retry  # fenced: the trial is another runner's now

    def _execute(self, attempt: Trial, scope: TrialScope, n: int) -> tuple[str, str | None, TrialOutcome | None, float | None]:
        """Run the agent once: (status, reason, outcome, retry delay); "ok" means it ran to the end (its trace is `_arrived`'s)."""
        try:
            with activate(scope), otel_trial_context(attempt):
                outcome = TrialOutcome.coerce(self.adapter.run(attempt))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # an agent's sys.exit (SystemExit) must not take the runner down
            status, reason, delay = self._failure(exc, scope, n)
            return status, reason, None, delay
        return "ok", None, outcome, None

    def _failure(self, exc: BaseException, scope: TrialScope, n: int) -> tuple[str, str, float | None]:
        """(status, reason, retry delay) of an attempt that raised."""
        if scope.abort_reason:  # the driver refused a model call (cap, offline cache): cut off, not the agent's failure
            return "missing", scope.abort_reason, None
        if isinstance(exc, BudgetExceeded):
            return "missing", f"budget: {exc}", None
        if isinstance(exc, AttemptInterrupted):  # the runner was stopped and stopped the agent: not the agent's result
            return "missing", f"interrupted: {exc}", None
        retry = self.config.retry
        if retry.is_transient(exc):  # it never reached the agent: not the agent's result
            if n < retry.max_attempts and not self.stop.is_set():
                return "missing", f"not reached: {exc}", retry.delay(n, getattr(exc, "retry_after", None))
            return "missing", f"not reached after {n} attempt(s): {exc}", None
        return "errored", f"{type(exc).__name__}: {exc}", None

    def _arrived(self, attempt: Trial, evidence: list[Any]) -> tuple[str, str | None]:
        """Whether the attempt left its run: the trace the driver minted for it, and no other.

        A plumbline proxy that served a call of the attempt wrote its span into that trace itself: the driver
        knows the run exists without waiting for it to come back through ingest. Otherwise the trace must
        reach the sink within ``trace_wait_s``, or the attempt is errored (the agent ran and left no run)."""
        sink = self.config.sink
        if sink is None or any(getattr(e, "calls", 0) for e in evidence):
            return "ok", None
        if sink.wait_for_trace(attempt.trace_id, self.config.trace_wait_s, self.config.trace_stored):
            return "ok", None
        return "errored", (f"no trace received: trace {attempt.trace_id} (the attempt's own) did not reach "
                           f"{sink.describe()} within {self.config.trace_wait_s:g}s")

    def _settle(self, record: TrialRecord, budget: TrialBudget | None, outcome: TrialOutcome | None, ran: bool) -> float:
        """Close the attempt's reservation: what a meter counted, else the whole reservation; a report may raise it, never lower it."""
        if budget is None:
            return 0.0
        sink = self.config.sink
        # The run's own gen_ai.usage.cost.* spans are the agent's word: kept beside the record, never what settles it,
        # or an agent could export a cost of zero and escape the cap.
        spans_usd = sink.reported_cost(record.trace_id) if sink is not None and record.trace_id else None
        reported = outcome.cost_usd if outcome is not None else None
        try:
            cost = budget.close(reported, ran=ran)
        finally:
            with self._lock:
                self._running -= 1
        record.cost_usd = round(record.cost_usd + cost, 8)
        record.cost_reported_usd = round(spans_usd, 8) if spans_usd is not None else None
        basis = budget.basis
        if basis != "reservation" or (ran and self.cap.limit is not None):  # with no cap and no meter, its cost is unknown
            record.metered, record.cost_basis = basis == "metered", basis
        record.overrun_usd = round(budget.overrun, 8) if self.cap.limit is not None else 0.0  # no cap, nothing to overrun
        if record.overrun_usd > 0:
            self._halt(f"adapter reported ${cost:.4f} for {record.trial_id}, over its ${budget.reserved:.4f} "
                       "reservation: the cap can no longer be guaranteed")
        return cost

    def _witness(self, record: TrialRecord, scope: TrialScope | None, outcome: TrialOutcome | None, evidence: list[Any]) -> None:
        """What the driver saw (its injector, its metered client) and its proxies saw, beside what the adapter claimed."""
        if scope is not None:
            record.model_calls, record.cache_hits, record.cache_misses = scope.model_calls, scope.cache_hits, scope.cache_misses
            if scope.fault is not None:
                record.fault_fired = scope.fault.fired
                record.fault_source = "injector" if scope.fault.fired else None
            if record.perturbation in scope.seen:
                record.seen, record.seen_by = True, "client"
        for seen in evidence:
            saw = seen.as_dict()
            witness = str(seen.witness)
            record.evidence[witness] = _brief(saw)
            record.cache_hits += int(saw.get("cache_hits") or 0)  # answered from the cassette at the proxy
            if record.fault and saw.get("faults") and not record.fault_fired:
                record.fault_fired, record.fault_source = True, witness
            if (base_perturbation(record.perturbation) == "decoy_tools" and saw.get("decoys_offered")) or (
                    base_perturbation(record.perturbation) == "sampling" and saw.get("sampling_changes")):
                record.seen, record.seen_by = True, witness
        if base_perturbation(record.perturbation) in REQUEST_PERTURBATIONS and record.seen is None:
            record.seen = False
        if outcome is not None:
            record.fault_claimed = outcome.fault_fired
            if outcome.trace_id and outcome.trace_id != record.trace_id:
                record.trace_claimed = outcome.trace_id  # the agent named another run: a conflict, never its run

    def _write(self, attempt: Trial, record: TrialRecord, cost: float) -> None:
        """The attempt's outcome: a ledger row (resume) and the driver's record beside the runs (certify)."""
        if self.ledger is not None:
            try:
                self.ledger.append({**record.row(), "attempt": attempt.identity.attempt, "attempt_cost_usd": cost})
            except LeaseLost as lost:  # a shared study's fencing: never the trial's result, shown as a duplicate execution
                record.status, record.reason = "duplicate", f"{lost} (this execution's own result: {record.status}: {record.reason or 'ok'})"
                self.ledger.append({**record.row(), "attempt": attempt.identity.attempt, "attempt_cost_usd": cost})
        if self.records is not None:
            service, version = self._label(attempt)
            self.records.write(attempt.identity, record.attributes(cost), service=service, version=version)


class _Sealer:
    """Closes each attempt's evidence window once its grace has passed: a signed *seal* record of the span ids of its
    trace that had reached the sink by then (`trials`: spans outside it are late, stored, and left out of the verdict).

    One thread for the study; `close` waits for the windows still open, so a study reports only once all are sealed.
    An endpoint sink that agents export to directly cannot say what arrived: no seal is written for it (docs/replay.md).
    """

    def __init__(self, sink: SpanSink, records: RecordWriter, grace_s: float) -> None:
        self.sink, self.records, self.grace_s = sink, records, grace_s
        self._pending: list[tuple[float, int, Trial, str | None, str | None]] = []
        self._seq = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="replay-sealer", daemon=True)
        self._thread.start()

    def add(self, attempt: Trial, service: str | None, version: str | None) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._pending, (time.monotonic() + self.grace_s, self._seq, attempt, service, version))
            self._cond.notify()

    def _due(self) -> list[tuple[float, int, Trial, str | None, str | None]]:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._pending and self._pending[0][0] <= now:
                    due = []
                    while self._pending and self._pending[0][0] <= now:
                        due.append(heapq.heappop(self._pending))
                    return due
                if self._closed and not self._pending:
                    return []
                self._cond.wait(self._pending[0][0] - now if self._pending else None)

    def _loop(self) -> None:
        while due := self._due():
            for _, _, attempt, service, version in due:
                sealed = self.sink.span_ids(attempt.trace_id)
                if sealed is None:
                    continue
                self.records.write(attempt.identity, {RECORD_KIND: "seal", RUN_TRACE: attempt.trace_id, WINDOW_END: time.time_ns(),
                                                      SEALED_SPANS: ",".join(sorted(sealed))}, service=service, version=version)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()


def _plumbline_failed(status: str, reason: str | None, retry: float | None, evidence: list[Any],
                      policy: RetryPolicy, n: int, stopping: bool) -> tuple[str, str | None, float | None]:
    """An attempt in which plumbline itself, or a provider or tool server it stands in front of, failed is not the
    agent's result: it is missing with the real cause (whatever the agent then did). A refusal of plumbline's own
    (spend cap, cassette miss) is final; a provider, tool server or proxy that failed is retried within the
    policy. An agent that sent no model call through its route is unrouted (missing, never scored)."""
    if status not in RAN:
        return status, reason, retry
    own = status if status == "ok" else f"{status}: {reason}"
    for e in evidence:  # a branch-point replay whose agent left the recorded run in the prefix: measured, never scored
        diverged = e.as_dict().get("diverged") or ()
        if diverged:
            first = min(diverged, key=lambda d: int(d.get("step") or 0))
            return "missing", f"diverged at step {first.get('step')}: {first.get('detail')} (agent's own result: {own})", None
    for e in evidence:
        saw = e.as_dict()
        if saw.get("refused_budget"):
            return "missing", f"plumbline refused {saw['refused_budget']} model call(s) at the spend cap (agent's own result: {own})", None
        if saw.get("refused_offline"):
            return "missing", (f"cassette miss: plumbline had no recorded answer for {saw['refused_offline']} model call(s) "
                               f"offline (agent's own result: {own})"), None
    failures = []
    for e in evidence:
        saw = e.as_dict()
        for kind, label in (("provider_failures", "provider failed"), ("server_died", "tool server died"), ("proxy_errors", "proxy error")):
            for item in saw.get(kind) or ():  # never a fault the proxy injected itself (those are the perturbation)
                if not item.get("recovered"):  # a failure the agent's own retry got past is the world it works in
                    failures.append(f"{label}: {item.get('detail') or item.get('status') or item}")
    if failures:
        again = n < policy.max_attempts and not stopping
        return "missing", f"{failures[0]}{f' (+{len(failures) - 1} more)' if len(failures) > 1 else ''} (agent's own result: {own})", (
            policy.delay(n) if again else None)
    unseen = [e for e in evidence if e.witness == "model_proxy" and e.calls == 0]
    if unseen:
        return "missing", (f"unrouted: no model call reached this attempt's proxy route (the agent ignored OPENAI_BASE_URL / "
                           f"ANTHROPIC_BASE_URL, or sent calls the proxy could not route); agent's own result: {own}"), None
    return status, reason, retry


def planned_fault(trial: Trial) -> str | None:
    """The fault a trial plans, as text: a tool fault (``tool:kind:call:times``), or a proxy's plan."""
    if trial.fault is not None:
        return str(trial.fault)
    for key in ("model_fault", "tool_result_fault"):
        if trial.metadata.get(key):
            return f"{key} {orjson.dumps(trial.metadata[key], option=orjson.OPT_SORT_KEYS).decode()}"
    return None


def _brief(evidence: dict[str, Any]) -> dict[str, Any]:
    """A proxy's evidence as the record keeps it: everything but the per-exchange list (the cassette has those)."""
    exchanges = evidence.get("exchanges")
    return {**{k: v for k, v in evidence.items() if k != "exchanges"},
            **({"exchanges": len(exchanges)} if isinstance(exchanges, (list, tuple)) else {})}


class _Scoped:
    """Runs a model helper of the plan (the paraphraser, the equivalence check) inside a scope of its
    own: its calls are cached per study, so re-planning on resume or offline gives the same variants
    (and trial ids), and they are paid from the study's cap. Keyed by the helper's text arguments."""

    def __init__(self, inner: Any, role: str, study: str, cap: SpendCap, cache: ResponseCache | None) -> None:
        self.inner, self.role, self.study, self.cap, self.cache = inner, role, study, cap, cache
        self.name = getattr(inner, "name", type(inner).__name__)

    def __call__(self, *args: Any) -> Any:
        digest = hashlib.sha256("\x00".join(a for a in args if isinstance(a, str)).encode()).hexdigest()[:16]
        identity = TrialIdentity(f"{self.study}/{self.role}/{digest}", "paraphrase", "generator", self.study)
        budget = TrialBudget.open(self.cap, 0.0)
        if budget is None:
            raise BudgetExceeded(f"spend cap reached before the {self.role} ran")
        try:
            with activate(TrialScope(identity, budget, self.cache)):
                return self.inner(*args)
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
                 cap: SpendCap, instance: str = "", key: str | None = None) -> None:
        self.config, self.adapter, self.plan, self.ledger, self.cache, self.cap = config, adapter, plan, ledger, cache, cap
        self.instance, self.key = instance, key or new_key()

    def run(self, completed: set[str] | frozenset[str] = frozenset(),
            on_record: Callable[[TrialRecord, int, int], None] | None = None) -> StudySummary:
        """Run the planned trials not yet decided (``completed``: trial ids the store holds a result for).

        Holds the study's lock throughout: a second runner is refused (``StudyLocked``).
        """
        if self.config.state_dir is None or self.config.state_url is not None:  # a shared study: claims, not a lock
            return self._run(completed, on_record)
        with StudyLock(self.config.state_dir, self.config.study):
            if self.ledger is not None:
                self.ledger.reload()  # what a runner that held the lock before us did
            return self._run(completed, on_record)

    def _run(self, completed: set[str] | frozenset[str],
             on_record: Callable[[TrialRecord, int, int], None] | None) -> StudySummary:
        config, ledger, cache, cap = self.config, self.ledger, self.cache, self.cap
        started = time.perf_counter()
        done = set(completed) | (ledger.decided() if ledger else set())
        already = [t for t in self.plan.trials if t.trial_id in done]
        if already and not (config.resume or config.rerun or config.state_url):  # a shared study is joined, not refused
            raise ReplayError(f"study {config.study!r} already has {len(already)} of its {len(self.plan.trials)} trials decided "
                              f"(e.g. {already[0].trial_id}); pass --resume to run only the rest, --rerun to run them "
                              "all again as new trials, or choose a new --study")
        plan = self.plan
        if config.rerun and already:
            plan = replace(plan, trials=tuple(_fresh(t, done, config.repeats) for t in plan.trials))
        todo = [t for t in plan.trials if t.trial_id not in done]
        if config.target is not None:  # a sequential study runs and judges its tasks in its recorded random order (issue 38)
            todo = task_order(todo, order_seed(config.state_dir, self.instance))
        reservations = reservations_for(config, todo)
        records_out = RecordWriter(config.sink, self.key) if config.sink is not None else None
        sequential = SequentialStop(todo, config.target, config.min_tasks) if config.target is not None else None
        claims = _claims(config, todo)
        if claims is not None and isinstance(ledger, PgLedger):
            ledger.fence = claims  # an outcome is recorded only under this runner's claim (`pgstate.PgLedger`)
        sealer = _Sealer(config.sink, records_out, config.grace_s) if config.sink is not None and records_out is not None else None
        runner = _Runner(config, self.adapter, cap, cache, ledger, records_out, reservations, sequential, claims, sealer)
        summary = StudySummary(config.study, planned=len(plan.trials), skipped=len(plan.trials) - len(todo),
                               rejected=plan.rejected, budget_usd=config.budget_usd, instance=self.instance,
                               keys=KeyRing.of(self.instance, self.key),
                               rerun_as=len(already) if config.rerun else 0)
        order = {t.trial_id: i for i, t in enumerate(plan.trials)}
        records: list[TrialRecord] = []
        pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="replay")
        interrupted = False
        try:
            runner.plan(plan.trials)
            if ledger is not None:
                summary.recovered = self._interrupted(runner, ledger, done)
                summary.released_usd = sum(r.usd for r in cap.release_dead())  # a dead runner's reservations stop holding the cap
            futures = [pool.submit(runner.run, t) for t in todo]
            collected: set[Any] = set()
            try:
                for future in as_completed(futures):
                    collected.add(future)
                    records.append(future.result())
                    if on_record is not None:
                        on_record(records[-1], len(records), len(todo))
            except KeyboardInterrupt as stop:
                # Ctrl-C or SIGTERM (`adapters.stop_on_sigterm`): an adapter that can stop its agents does (command agents:
                # SIGTERM, then SIGKILL after its grace), their attempts are recorded interrupted with what they spent;
                # queued trials are recorded missing ("not started: interrupted"); an in-process agent is waited for.
                interrupted = True
                runner._halt(f"interrupted ({stop})" if str(stop) else "interrupted")
                cancel = getattr(self.adapter, "cancel", None)
                running = sum(f.running() for f in futures)
                stopped = cancel() if callable(cancel) else 0
                queued = len(futures) - len(collected) - running
                print(f"plumbline replay: {runner.stop_reason}: stopping; {running} attempt(s) running"
                      + (f", {stopped} agent(s) sent SIGTERM (SIGKILL after {getattr(self.adapter, 'grace_s', 5.0):g}s)" if stopped
                         else ", waited for (their agents run in-process)" if running else "")
                      + f"; {queued} queued trial(s) recorded as not started", file=sys.stderr, flush=True)
                records.extend(f.result() for f in futures if f not in collected)
                print(f"plumbline replay: stopped; {sum(str(r.reason or '').startswith('interrupted') for r in records)} attempt(s) "
                      "recorded interrupted with their spend; resume with --resume", file=sys.stderr, flush=True)
        finally:
            pool.shutdown(wait=True)
            if claims is not None:
                claims.close()
            if sealer is not None:
                sealer.close()  # every window of this run closes (at most the grace from now) before the study reports
            if records_out is not None:
                summary.written = records_out.written
                records_out.close()
        records.sort(key=lambda r: order[r.trial_id])
        summary.records = records
        summary.ok = sum(r.status == "ok" for r in records)
        summary.missing = sum(r.status == "missing" for r in records)
        summary.errored = sum(r.status == "errored" for r in records)
        summary.stopped = sum(r.status == "stopped" for r in records)
        summary.elsewhere = sum(r.status == "elsewhere" for r in records)
        summary.records = [r for r in records if r.status != "elsewhere"]
        summary.decided_cells = dict(sequential.decided) if sequential is not None else {}
        summary.spent_usd, summary.session_usd, summary.budget_high_water_usd = cap.spent, cap.session_usd, cap.high_water
        summary.cache_hits = sum(r.cache_hits for r in records)
        summary.cache_recorded = cache.recorded if cache else 0
        summary.seconds = time.perf_counter() - started
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _interrupted(self, runner: _Runner, ledger: Ledger, done: set[str]) -> list[TrialRecord]:
        """Attempts a runner that died left started and unfinished: each is recorded missing
        ("interrupted"); the trial runs again as a new attempt."""
        by_id = {t.trial_id: t for t in self.plan.trials}
        out = []
        for trial_id, (attempt, pid) in ledger.unfinished().items():
            trial = by_id.get(trial_id)
            if trial is None or trial_id in done:
                continue
            if runner.claims is not None and not runner.claims.claim(trial_id):  # a live runner holds it: its attempt, not ours
                continue
            ident = trial.identity.at_attempt(attempt)
            record = TrialRecord(trial_id, ident.task_key, ident.perturbation, ident.variant, ident.repeat, "missing",
                                 f"interrupted: runner pid {pid} stopped during attempt {attempt}", attempts=1, attempt=attempt,
                                 trace_id=ident.trace_id, fault=str(trial.fault) if trial.fault else None)
            runner._write(replace(trial, identity=ident), record, 0.0)
            if runner.claims is not None:
                runner.claims.finish(trial_id, decided=False)  # fenced the lapsed runner out; free to run again
            out.append(record)
        return out


def _fresh(trial: Trial, done: set[str], repeats: int) -> Trial:
    """``trial`` as a new trial when it is decided: the next repeat number of its variant no trial has taken."""
    ident = trial.identity
    repeat = ident.repeat
    while trial_id_for(ident.study, ident.task_key or "", ident.perturbation, ident.variant, repeat) in done:
        repeat += repeats
    if repeat == ident.repeat:
        return trial
    tid = trial_id_for(ident.study, ident.task_key or "", ident.perturbation, ident.variant, repeat)
    return replace(trial, identity=replace(ident, trial_id=tid, repeat=repeat))


def _claims(config: StudyConfig, trials: Sequence[Trial]) -> Any:
    """A shared study's trial claims (`replay.pgstate.StudyClaims`), heartbeat started; None for a study of one runner."""
    if config.state_url is None:
        return None
    from plumbline_otel.replay.pgstate import StudyClaims

    claims = StudyClaims(config.state_url, config.study)
    claims.plan([t.trial_id for t in trials])
    claims.start_heartbeat()
    return claims


def study_state(state: Path | None, state_url: str | None = None, study: str = "") -> tuple[str, str]:
    """The study state's random instance id and secret key (``study.json``, readable by its owner only), made
    with the state; a fresh pair without a state directory; a shared study's one pair with ``state_url``.

    The key signs the driver's records (`trials.record_mac`) and is never given to an agent; a state made
    before records were signed gains a key (its earlier records stay unverified)."""
    def made() -> dict[str, str]:
        return {"instance": uuid.uuid4().hex[:16], "key": new_key(), "order_seed": uuid.uuid4().hex}  # order: sequential.task_order

    if state_url is not None:
        from plumbline_otel.replay.pgstate import shared_state

        found = shared_state(state_url, study, made)
    elif state is None:
        found = made()
    else:
        path = state / STATE_FILE
        doc: Any = {}
        if path.exists():
            try:
                doc = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise ReplayError(f"{path}: unreadable study state ({exc}); move it away to start a new instance of the study") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("instance"), str) or not doc["instance"]:
                raise ReplayError(f"{path}: no instance id; move it away to start a new instance of the study")
        found = {**made(), **doc} if isinstance(doc.get("key"), str) else {**made(), **doc, "key": new_key()}
        if found != doc:
            state.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps({"created_at": time.time(), **found}) + b"\n")
            os.replace(tmp, path)
    return str(found["instance"]), str(found["key"])


def open_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any) -> Study:
    """Open the study's state (instance id, ledger, response cache, cumulative cap) and plan it.

    ``adapter`` is an Adapter or a plain function of the trial. The variants file is rewritten.
    """
    if not hasattr(adapter, "run") and callable(adapter):
        adapter = PythonAdapter(adapter)
    state = Path(config.state_dir) if config.state_dir is not None else None
    instance, key = study_state(state, config.state_url, config.study)
    ledger: Ledger | None = Ledger(state / "ledger.jsonl") if state else None
    cap = SpendCap(config.budget_usd, journal=ledger.path if ledger else None)
    if config.state_url is not None:
        from plumbline_otel.replay.pgstate import PgLedger, PgSpendCap

        ledger, cap = PgLedger(config.state_url, config.study), PgSpendCap(config.state_url, config.study, config.budget_usd)
    if config.cassette is not None:  # re-run another study from its recording: offline, its exchanges only
        cassette = Path(config.cassette) / "responses.jsonl"
        if not cassette.is_file():
            raise ReplayError(f"--cassette {config.cassette}: no recorded exchanges there (responses.jsonl): give a study's state directory")
        cache: ResponseCache | None = ResponseCache(cassette, "replay")
    else:
        cache = ResponseCache(state / "responses.jsonl", config.cache_mode) if state and config.cache_mode != "off" else None
    planning = config
    if config.options.paraphraser is not None:
        scoped = _Scoped(config.options.paraphraser, "paraphrase-generator", config.study, cap, cache)
        # A Paraphraser called positionally, as build_variants calls it; its name is the inner one's.
        planning = replace(planning, options=replace(planning.options, paraphraser=cast("Paraphraser", scoped)))
    if config.options.equivalence is not None:
        check = _Scoped(config.options.equivalence, "equivalence-check", config.study, cap, cache)
        planning = replace(planning, options=replace(planning.options, equivalence=check))
    plan = plan_study(planning, tasks, adapter, instance)
    if state:
        write_jsonl(state / "variants.jsonl", [v.as_dict() for v in plan.variants])
    return Study(config, adapter, plan, ledger, cache, cap, instance, key)


def run_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Any, *,
              completed: set[str] | frozenset[str] = frozenset(),
              on_record: Callable[[TrialRecord, int, int], None] | None = None) -> StudySummary:
    """Plan and run a study (``open_study(...).run(...)``).

    ``adapter`` is an Adapter or a function of the trial; ``completed`` are trial ids already
    stored; ``on_record(record, done, total)`` is called in the calling thread as each trial ends.
    """
    return open_study(config, tasks, adapter).run(completed, on_record)
