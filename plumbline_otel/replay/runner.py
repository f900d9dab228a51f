"""The replay driver: plan a study's trials, run them through an adapter, record what happened.

This module is the driver's front door; the work is in four modules along its seams:

- ``plan``: pure. Tasks × perturbations → guarded variants → trials (× repeats), each with its deterministic identity
  (`plan_study`); the study's settings (`StudyConfig`, `RetryPolicy`); each trial's spend reservation
  (`reservations_for`: the declared per-trial maximum, or the model price table × the task's recorded tokens × a
  margin);
- ``engine``: one attempt after another (`TrialRunner`). Every execution of a trial is a new *attempt* (numbered in
  the ledger, never reused) with its own trace, fresh ``TrialScope`` (cache, budget, a fault injector built from the
  variant's plan), routes through the proxies (`contracts.TrialProxy`) and OTel context (its trace, the identity in
  baggage); retries of transient errors are new attempts with exponential backoff. The spend cap: an attempt starts
  only if its reservation fits what the study has left; one that does not fit waits while running attempts may
  settle, and is missing only when none is left running; metered model calls grow the reservation or are refused; the
  account lives in the ledger under a file lock, so threads and processes share it;
- ``records``: the driver is the witness. Every planned trial and every attempt gets a *record*
  (`plumbline_otel.trials.AttemptRecord`: status and reason, the attempt's trace, the fault and whether the driver saw
  it fire, the cost and whether a meter counted it), written to the ledger and, as a span in a trace of its own, to
  the study's sink beside the runs; certify reads those, never the agent's word. An attempt is ``ok`` when the agent
  ran and its run reached the sink; ``errored`` when the agent ran and raised (``SystemExit`` included), timed out,
  exited non-zero or left no trace; ``missing`` when it never reached the agent (cap, interrupted, refused at the
  door). Only a missing attempt is retried or resumed: an errored one is the trial's result;
- ``study``: a study's state and one run of it (`open_study`, `run_study`): one runner per study (``lock.StudyLock``),
  bounded concurrency inside it (a thread pool); resume: decided trials (an attempt ran) are skipped; without
  ``resume`` such a study is refused, and ``rerun`` runs them again as *new trials* (the next free repeat numbers).

What the driver reads of an adapter and of a proxy is written down once, in `replay.contracts`.
"""

from plumbline_otel.replay.engine import RESERVATION_WAIT_S, Sealer, TrialRunner, otel_trial_context
from plumbline_otel.replay.plan import Plan, RetryPolicy, StudyConfig, plan_study, planned_fault, reservations_for
from plumbline_otel.replay.records import StudySummary, plumbline_failed, witness
from plumbline_otel.replay.study import Study, open_study, run_study, study_state
from plumbline_otel.trials import AttemptRecord

__all__ = ["RESERVATION_WAIT_S", "AttemptRecord", "Plan", "RetryPolicy", "Sealer", "Study", "StudyConfig", "StudySummary",
           "TrialRunner", "open_study", "otel_trial_context", "plan_study", "planned_fault", "plumbline_failed",
           "reservations_for", "run_study", "study_state", "witness"]
