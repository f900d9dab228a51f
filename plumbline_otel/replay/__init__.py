"""The replay driver: re-run an agent on stored tasks under meaning-preserving perturbations.

    tasks   = select_tasks(store, agent="ap-agent-react")            # from stored trajectories
    config  = StudyConfig("nightly", perturbations=("baseline", "distractor", "tool_fault"),
                          repeats=2, sink=SpanSink(otlp_file="replay.otlp.jsonl"),
                          state_dir="replay-state/nightly", budget_usd=5.0)
    summary = run_study(config, tasks, load_adapter("python:domains.accounts_payable.replay_adapter:react"))

Then ``plumbline ingest replay.otlp.jsonl`` and ``plumbline certify --study nightly``.

Stages, one module each: ``tasks`` (selection), ``perturb`` and ``guard`` (variants),
``identity`` (trial ids and the carriers), ``adapters`` (python / command / http), ``scope``
(the running trial: cache, budget, fault), ``cache`` (model responses), ``budget`` (spend cap),
``export`` (span sink, markers), ``ledger`` (resume state and spend), ``lock`` (one runner per
study), ``contracts`` (what the driver reads of an adapter and a proxy), ``routing`` (which open attempt
a proxied request belongs to) and ``runner`` (the driver: ``plan``, ``engine``, ``records``, ``study``).
"""

from plumbline_otel.replay.adapters import (
    Adapter,
    AdapterError,
    CommandAdapter,
    HttpAdapter,
    IsolatedAdapter,
    PythonAdapter,
    TransientAdapterError,
    Trial,
    TrialOutcome,
    load_adapter,
)
from plumbline_otel.replay.budget import BudgetExceeded, SpendCap, TrialBudget, cost_usd, price_of
from plumbline_otel.replay.cache import ResponseCache, anthropic_client, cache_key, caching_transport
from plumbline_otel.replay.contracts import AdapterBase, TrialProxy, TrialRoute
from plumbline_otel.replay.export import OtlpJsonFileExporter, RecordWriter, SpanSink, TrialSpanBuffer, exporter_for_endpoint, to_otlp_json
from plumbline_otel.replay.guard import GuardVerdict, check_equivalent, protected_tokens
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity, trial_id_for
from plumbline_otel.replay.ledger import Ledger
from plumbline_otel.replay.lock import StudyLock, StudyLocked
from plumbline_otel.replay.perturb import (
    PERTURBATIONS,
    AnthropicParaphraser,
    PerturbOptions,
    Variant,
    build_variants,
    register,
)
from plumbline_otel.replay.plan import Plan, RetryPolicy, StudyConfig, plan_study, reservations_for
from plumbline_otel.replay.records import StudySummary
from plumbline_otel.replay.scope import (
    InjectedFault,
    TrialScope,
    current_scope,
    current_trial_attributes,
    inject_fault,
)
from plumbline_otel.replay.study import Study, open_study, run_study
from plumbline_otel.replay.tasks import ReplayTask, TaskSource, select_tasks, source_tasks, stored_trials, tasks_from_trajectories, trials_of

__all__ = [
    "PERTURBATIONS", "Adapter", "AdapterError", "AnthropicParaphraser", "BudgetExceeded", "CommandAdapter",
    "FaultPlan", "GuardVerdict", "HttpAdapter", "IsolatedAdapter", "InjectedFault", "Ledger", "RecordWriter", "OtlpJsonFileExporter",
    "PerturbOptions", "Plan", "PythonAdapter", "ReplayTask", "ResponseCache", "TaskSource", "RetryPolicy", "SpanSink", "SpendCap",
    "Study", "StudyConfig", "StudyLock", "StudyLocked", "StudySummary", "TransientAdapterError", "Trial", "TrialBudget", "TrialIdentity", "TrialOutcome",
    "TrialProxy", "TrialRoute", "AdapterBase", "TrialScope", "TrialSpanBuffer", "Variant", "anthropic_client", "build_variants", "cache_key",
    "caching_transport", "check_equivalent", "cost_usd", "current_scope", "current_trial_attributes", "inject_fault", "load_adapter",
    "open_study", "plan_study", "reservations_for", "price_of", "protected_tokens", "register", "run_study", "select_tasks", "source_tasks", "stored_trials",
    "tasks_from_trajectories", "to_otlp_json", "trial_id_for", "trials_of", "exporter_for_endpoint",
]
