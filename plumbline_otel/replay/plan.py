"""A study's plan and configuration: what to run (tasks × perturbations → guarded variants → trials × repeats, each
with its deterministic identity), with which settings (`StudyConfig`), and what each trial reserves of the spend cap
before it starts. Pure: nothing here runs an agent (`replay.engine` does; `replay.study` opens a study's state).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.budget import cost_usd
from plumbline_otel.replay.contracts import DomainTools, TransientAdapterError, Trial, TrialProxy
from plumbline_otel.replay.identity import TrialIdentity, trial_id_for
from plumbline_otel.replay.perturb import PerturbOptions, Variant, build_variants
from plumbline_otel.replay.tape import branch_variants
from plumbline_otel.replay.tasks import ReplayTask

if TYPE_CHECKING:
    from plumbline_otel.replay.export import SpanSink
    from plumbline_otel.replay.tape import Tape

# How a sequential study judges a run: (its trace id, its trial's identity as span attributes) -> whether it held
# every critical invariant, or None when it cannot say (`replay.sequential.Judge`).
RunJudge = Callable[[str, Mapping[str, object]], "bool | None"]


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
        """Whether ``exc`` says the agent was never reached (worth another attempt)."""
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
    # Witnesses in the agent's path (`contracts.TrialProxy`): the model-API proxy (`replay.proxy.ModelProxy`) and the
    # MCP proxy. Every attempt gets its own routes; what they saw goes into its record.
    proxies: Sequence[TrialProxy] = ()
    # Sequential: stop each cell once the anytime-valid bound decides it against `target`
    # (`replay.sequential`); `judge(trace_id, identity)` says whether a run, placed by its trial's identity, held every critical invariant.
    target: float | None = None
    min_tasks: int = 5
    judge: RunJudge | None = None
    # Shared study state (`replay.pgstate`): runners on several machines share one ledger, one exact
    # spend cap and the trials, each claimed by one runner at a time.
    state_url: str | None = None
    # Branch-point replay (issue 44, `replay.tape`): "each" or the steps to branch at, and each task's tape (by task key);
    # a task without one is listed in branch_missing with why. None: every trial starts from the task's first request.
    branch_at: str | tuple[int, ...] | None = None
    tapes: Mapping[str, Tape] = field(default_factory=dict)
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
        """The variants the guard refused (no trial runs them)."""
        return [v for v in self.variants if v.rejected]


def plan_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: DomainTools | None = None, instance: str = "") -> Plan:
    """Variants and trials, in a deterministic order (task, perturbation, variant, repeat).

    A domain adapter may offer its own ``decoy_tools`` (used unless the options name others) and
    ``fault_tools`` (preferred fault targets, among the tools each task's source run called).
    ``instance`` is the study state's random id, carried by every attempt's identity.
    """
    options = config.options
    decoys = adapter.decoy_tools if adapter is not None else ()
    if decoys and options.decoy_tools == PerturbOptions().decoy_tools:
        options = replace(options, decoy_tools=tuple(dict(d) for d in decoys))
    preferred = adapter.fault_tools if adapter is not None else ()
    if preferred and not options.preferred_fault_tools:
        options = replace(options, preferred_fault_tools=tuple(preferred))
    variants: list[Variant] = []
    trials: list[Trial] = []
    for task in sorted(tasks, key=lambda t: t.task_key):
        built = build_variants(task, config.perturbations, options)
        if config.branch_at is not None:  # each branch point a cell: its label carries the step (tool_fault@3)
            built = branch_variants(built, config.tapes.get(task.task_key), config.branch_at,
                                    config.branch_missing.get(task.task_key, ""), options=options, task_input=task.input)
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



def planned_fault(trial: Trial) -> str | None:
    """The fault a trial plans, as text: a tool fault (``tool:kind:call:times``), or a proxy's plan."""
    if trial.fault is not None:
        return str(trial.fault)
    for key in ("model_fault", "tool_result_fault"):
        if trial.metadata.get(key):
            return f"{key} {orjson.dumps(trial.metadata[key], option=orjson.OPT_SORT_KEYS).decode()}"
    return None



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
