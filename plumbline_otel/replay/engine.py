"""The replay driver's engine: one attempt after another of each trial, from the study's worker threads.

Every execution of a trial is a new *attempt* (numbered in the ledger before it runs, never reused) with its own
trace, a fresh ``TrialScope`` (cache, budget, a fault injector built from the variant's plan), its own route through
each proxy, and the OTel context (its trace, the identity in baggage); retries of transient errors are new attempts
with exponential backoff. Whatever happens, the attempt is recorded: a ledger row and, beside the runs, a signed
record (`plumbline_otel.trials.AttemptRecord`); ``Sealer`` closes each attempt's evidence window after its grace.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from opentelemetry import baggage, context, trace
from opentelemetry.trace import NonRecordingSpan

from plumbline_otel.replay.budget import BudgetExceeded, SpendCap, TrialBudget
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.contracts import (
    Adapter,
    AttemptInterrupted,
    BranchingProxy,
    Evidence,
    TransientAdapterError,
    Trial,
    TrialOutcome,
    TrialProxy,
    TrialRoute,
)
from plumbline_otel.replay.export import RecordWriter, SpanSink, trial_span_context
from plumbline_otel.replay.ledger import Ledger
from plumbline_otel.replay.pgstate import LeaseLost
from plumbline_otel.replay.plan import StudyConfig, planned_fault
from plumbline_otel.replay.records import plumbline_failed, witness
from plumbline_otel.replay.scope import FaultInjector, TrialScope, activate
from plumbline_otel.replay.sequential import SequentialStop
from plumbline_otel.replay.tape import base_perturbation
from plumbline_otel.runs import (
    FAULT,
    FAULT_PERTURBATIONS,
    FAULT_PLANNED,
    RECORD_KIND,
    REQUEST_PERTURBATIONS,
    RUN_TRACE,
    SEALED_SPANS,
    SEQUENTIAL,
    WINDOW_END,
)
from plumbline_otel.trials import DECIDED, RAN, AttemptRecord

if TYPE_CHECKING:
    from plumbline_otel.replay.pgstate import StudyClaims

RESERVATION_WAIT_S = 3600.0  # longest a reservation waits for running trials to free room

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


class TrialRunner:
    """Runs trials of one study, each until an attempt reaches the agent (or retries run out), from the study's worker
    threads; every attempt is numbered, reserved, routed, run, witnessed, settled and recorded (see `replay.runner`).
    ``halt`` stops it: attempts not yet started are recorded missing."""

    def __init__(self, config: StudyConfig, adapter: Adapter, cap: SpendCap, cache: ResponseCache | None,
                 ledger: Ledger | None, records: RecordWriter | None, reservations: dict[str, float],
                 sequential: SequentialStop | None = None, claims: StudyClaims | None = None, sealer: Sealer | None = None) -> None:
        self.config, self.adapter, self.cap, self.cache = config, adapter, cap, cache
        self.ledger, self.records, self.reservations = ledger, records, reservations
        self.sequential, self.claims, self.sealer = sequential, claims, sealer
        self.stop = threading.Event()
        self.stop_reason: str | None = None
        self._attempts: dict[str, int] = {}  # without a ledger: attempt numbers of this process
        self._lock = threading.Lock()
        self._running = 0  # attempts holding a reservation: while any does, one that does not fit waits

    def label(self, trial: Trial) -> tuple[str | None, str | None]:
        service = self.config.service or self.adapter.service
        if service:
            version = self.config.service_version or (self.adapter.service_version if not self.config.service else None)
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
            service, version = self.label(trial)
            self.records.add(trial.identity, {RECORD_KIND: "plan", FAULT_PLANNED: planned_fault(trial),
                                              SEQUENTIAL: self.sequential is not None},
                             service=service, version=version)
        self.records.flush()

    def run(self, trial: Trial) -> AttemptRecord:
        """Attempt the trial until an attempt reaches the agent (or retries run out); every attempt is recorded."""
        started = time.perf_counter()
        ident = trial.identity
        record = AttemptRecord(trial_id=ident.trial_id, task_key=ident.task_key, perturbation=ident.perturbation,
                               variant=ident.variant, repeat=ident.repeat, study=ident.study, instance=ident.instance,
                               status="missing", fault=planned_fault(trial))
        if self.claims is not None and not self.claims.claim(ident.trial_id):
            record.status, record.reason = "elsewhere", "held or decided by another runner of the study"
            return record
        stopped = self.sequential.stopped(trial) if self.sequential is not None else None
        if stopped is not None:
            attempt = self._begin(trial)
            record.status, record.reason, record.attempt, record.trace_id = "stopped", stopped, attempt.identity.attempt, attempt.trace_id
            self.write(attempt, record, 0.0)
            self._release(record)
            return record
        while (delay := self._attempt(trial, record)) is not None:
            time.sleep(delay)
        self._release(record)
        if self.sequential is not None:
            self.sequential.finish(trial, self._score(trial, record))
        record.seconds = round(time.perf_counter() - started, 4)
        return record

    def _release(self, record: AttemptRecord) -> None:
        """Let another runner of a shared study have the trial (free again when it is still missing)."""
        if self.claims is not None:
            self.claims.finish(record.trial_id, decided=record.status in DECIDED)

    def _score(self, trial: Trial, record: AttemptRecord) -> bool | None:
        """For a sequential study: conforming, failing, or not scored, by the certificate's rules (`trials.py`)."""
        if record.status == "errored":
            return False
        if record.status != "ok" or self.config.judge is None or record.trace_id is None:
            return None
        if (base_perturbation(record.perturbation) in FAULT_PERTURBATIONS and not record.fault_fired) or (
                base_perturbation(record.perturbation) in REQUEST_PERTURBATIONS and not record.seen) or record.seen is False:
            return None
        return self.config.judge(record.trace_id, trial.identity.attributes())

    def halt(self, reason: str) -> None:
        """Stop the study: attempts not yet started are recorded missing with ``reason``."""
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

    def _attempt(self, trial: Trial, record: AttemptRecord) -> float | None:
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
        routes: list[tuple[TrialProxy, TrialRoute]] = []
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
                # a branch-point trial's routes serve its tape's prefix (`contracts.BranchingProxy`; the command refuses
                # --branch-at without plumbline's proxies); any other trial's are opened as a `TrialProxy`'s
                routes = [(proxy, proxy.open_trial(attempt, budget) if tape is None
                           else cast(BranchingProxy, proxy).open_trial(attempt, budget, tape=tape)) for proxy in self.config.proxies]
                attempt = replace(attempt, routes={k: v for _, route in routes for k, v in route.env().items()})
                status, reason, outcome, retry = self._execute(attempt, scope, record.attempts)
                ran = status in RAN or (reason or "").startswith("interrupted: the runner was stopped during")  # it may have spent
        except Exception as exc:  # a driver bug: whether the agent ran is unknown, so the trial is not its result
            status, reason, retry = "missing", f"driver: {type(exc).__name__}: {exc}", None
        finally:
            evidence = [proxy.close_trial(route) for proxy, route in routes]
            if status == "ok":  # its run: the trace the driver minted, which the proxies wrote into or which must arrive
                status, reason = self._arrived(attempt, evidence)
            status, reason, retry = plumbline_failed(status, reason, retry, evidence, self.config.retry,
                                                      record.attempts, self.stop.is_set())
            record.status, record.reason = status, reason
            cost = self._settle(record, budget, outcome, ran)
            witness(record, scope, outcome, evidence)
            self.write(attempt, record, cost)
            if self.sealer is not None and record.status in RAN:
                self.sealer.add(attempt, *self.label(attempt))
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
                return "missing", f"not reached: {exc}", retry.delay(n, exc.retry_after if isinstance(exc, TransientAdapterError) else None)
            return "missing", f"not reached after {n} attempt(s): {exc}", None
        return "errored", f"{type(exc).__name__}: {exc}", None

    def _arrived(self, attempt: Trial, evidence: list[Evidence]) -> tuple[str, str | None]:
        """Whether the attempt left its run: the trace the driver minted for it, and no other.

        A plumbline proxy that served a call of the attempt wrote its span into that trace itself: the driver
        knows the run exists without waiting for it to come back through ingest. Otherwise the trace must
        reach the sink within ``trace_wait_s``, or the attempt is errored (the agent ran and left no run)."""
        sink = self.config.sink
        if sink is None or any(e.calls for e in evidence):
            return "ok", None
        if sink.wait_for_trace(attempt.trace_id, self.config.trace_wait_s, self.config.trace_stored):
            return "ok", None
        return "errored", (f"no trace received: trace {attempt.trace_id} (the attempt's own) did not reach "
                           f"{sink.describe()} within {self.config.trace_wait_s:g}s")

    def _settle(self, record: AttemptRecord, budget: TrialBudget | None, outcome: TrialOutcome | None, ran: bool) -> float:
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
            self.halt(f"adapter reported ${cost:.4f} for {record.trial_id}, over its ${budget.reserved:.4f} "
                       "reservation: the cap can no longer be guaranteed")
        return cost

    def write(self, attempt: Trial, record: AttemptRecord, cost: float) -> None:
        """The attempt's outcome: a ledger row (resume) and the driver's record beside the runs (certify)."""
        if self.ledger is not None:
            try:
                self.ledger.append({**record.row(), "attempt": attempt.identity.attempt, "attempt_cost_usd": cost})
            except LeaseLost as lost:  # a shared study's fencing: never the trial's result, shown as a duplicate execution
                record.status, record.reason = "duplicate", f"{lost} (this execution's own result: {record.status}: {record.reason or 'ok'})"
                self.ledger.append({**record.row(), "attempt": attempt.identity.attempt, "attempt_cost_usd": cost})
        if self.records is not None:
            service, version = self.label(attempt)
            self.records.write(attempt.identity, record.attributes(cost), service=service, version=version)


class Sealer:
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
        """Seal ``attempt``'s window once its grace has passed."""
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
        """Wait for every window still open, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
