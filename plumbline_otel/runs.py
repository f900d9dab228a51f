"""A run's identity: the `plumbline.*` attributes the replay driver writes on a run's spans, and how every stage reads them.

The replay driver (`replay/identity.py`) writes these on every span of a trial (and as W3C baggage
for agents in other processes); analysis, reports, importers and evaluation events read them back
from a trajectory's context. One module owns the names, so writer and readers cannot drift apart.

How a run counts (`run_status`): a ``missing`` trial never started and is counted beside n; an
``errored`` one started and left no usable run, so it is in n as a failing run (the older marker
value ``error`` reads the same); a ``tool_fault`` run is ``exposed`` only on positive evidence that
its fault hit it, and is listed, not judged, otherwise.
"""

from __future__ import annotations

from typing import Any, Literal

from plumbline_otel.model import Trajectory

TASK_KEY = "plumbline.task.key"  # the first of the store's default task-key attributes
STUDY = "plumbline.study"
TRIAL_ID = "plumbline.trial.id"
TRIAL_STATUS = "plumbline.trial.status"  # "missing" / "errored" on a trial marker
TRIAL_REASON = "plumbline.trial.reason"
TRIAL_ATTEMPT = "plumbline.trial.attempt"  # int >= 1; every execution of a trial is a new attempt
TRIAL_ATTEMPTS = "plumbline.trial.attempts"  # on the replay driver's root span: how many attempts the trial took
REPEAT = "plumbline.trial.repeat"
PERTURBATION = "plumbline.perturbation"
VARIANT = "plumbline.variant"
VARIANT_ID = "plumbline.variant.id"  # how older exports named the variant
OUTCOME = "plumbline.outcome"  # the agent's final answer, when a harness records it
FAULT = "plumbline.fault"  # a fault plan in text form, for agents outside this process
FAULT_TOOL = "plumbline.fault.tool"  # the tool the plan targets
FAULT_ERROR = "plumbline.fault.error"  # the exact message the injector raises
FAULT_FIRED = "plumbline.fault.fired"  # true only when the driver saw its injector raise
FAULT_INJECTED = "plumbline.fault.injected"  # on the tool span an injected fault failed
FAULT_STEP = "plumbline.fault.step"  # on a trial's root span: the index of that step
REPLAY_TRIAL = "plumbline.replay.trial"  # the replay driver's root span name (a legacy marker)
INSTANCE = "plumbline.study.instance"
SEQUENTIAL = "plumbline.study.sequential"  # on a plan record: the study stops a cell once its answer is known  # random per study state: trace ids never repeat across state directories

# The driver's record of a trial (`trials.py`): one plain root span in a trace of its own, never the attempt's.
RECORD_SPAN = "plumbline.trial.record"
# "plan" (attempt 0: the trial was planned), "attempt", or "seal" (the attempt's evidence window closed: what had arrived)
RECORD_KIND = "plumbline.record.kind"
RECORD_KINDS = ("plan", "attempt", "seal")
RECORD_AT = "plumbline.record.at_ns"  # when the driver wrote it: attempts of one trial are ordered by it
RUN_TRACE = "plumbline.trial.trace_id"  # the attempt's trace, where the agent's run is
FAULT_PLANNED = "plumbline.fault.planned"  # the fault plan, as text
FAULT_SOURCE = "plumbline.fault.source"  # who saw the fault reach the agent: injector, model_proxy, mcp_proxy
FAULT_CLAIMED = "plumbline.fault.claimed"  # what the adapter reported (kept to show conflicts, never believed)
SEEN = "plumbline.perturbation.seen"  # decoy_tools / sampling: the driver or a proxy saw it in a model request
SEEN_BY = "plumbline.perturbation.seen_by"  # client (the metered in-process client) or model_proxy
COST_USD = "plumbline.cost.usd"
COST_METERED = "plumbline.cost.metered"  # true: every cent passed a plumbline meter; false: the adapter's own report
# Whose figure `COST_USD` is: metered (a plumbline meter saw every call), estimated (some calls' usage never came: charged an
# upper bound from their text), adapter (its report raised the charge) or reservation (no meter saw it: the whole reservation).
COST_BASIS = "plumbline.cost.basis"
# What the run's own gen_ai.usage.cost.* spans reported: the agent's word, kept beside `COST_USD`, never settling it.
COST_REPORTED = "plumbline.cost.reported_usd"
EVIDENCE = "plumbline.trial.evidence"  # JSON: what the proxies witnessed in the attempt
# HMAC-SHA256 over every other plumbline.* attribute of a record and its service, with the study state's secret key:
# a record counts only if the driver wrote it (`trials.verify_record`).
RECORD_MAC = "plumbline.record.mac"
TRACE_CLAIMED = "plumbline.trial.trace_claimed"  # a trace id the adapter reported that is not the attempt's (a conflict)
WINDOW_END = "plumbline.trial.window_end_ns"  # on a seal: when the attempt's evidence window closed (its end plus the grace)
SEALED_SPANS = "plumbline.trial.sealed_spans"  # on a seal: the span ids of the attempt's trace that had arrived by then

# A trial's identity as the driver gives it (`replay.identity.TrialIdentity.attributes`): what places a run in a study,
# cell, task and repeat. A judged run carries the driver's values of these, never its own (`trials.witnessed`).
IDENTITY_KEYS = (TRIAL_ID, TRIAL_ATTEMPT, PERTURBATION, VARIANT, STUDY, REPEAT, INSTANCE, TASK_KEY, FAULT_TOOL, FAULT_ERROR)

TOOL_FAULT = "tool_fault"
# Perturbations whose runs are scored only when the fault was seen to reach the agent.
FAULT_PERTURBATIONS = frozenset({TOOL_FAULT, "tool_result_fault", "model_fault"})
# Perturbations that live in the model request: scored only when seen to reach the model.
REQUEST_PERTURBATIONS = frozenset({"decoy_tools", "sampling"})
ERRORED_STATUSES = frozenset({"errored", "error"})
MARKER_STATUSES = ERRORED_STATUSES | {"missing"}  # a trial marker: the attempt left no run of the agent
RunStatus = Literal["missing", "errored", "unexposed", "exposed"]


def perturbation_of(trajectory: Trajectory) -> str:
    """The perturbation a run was made under; "baseline" for ordinary traffic."""
    value = trajectory.context.get(PERTURBATION)
    return str(value) if value not in (None, "") else "baseline"


def agent_label(service: str | None, version: str | None) -> str:
    """How an agent is named in reports: ``service@version`` (``service`` when unversioned)."""
    name = service or "(unknown service)"
    return f"{name}@{version}" if version else name


def _status(trajectory: Trajectory) -> str:
    return str(trajectory.context.get(TRIAL_STATUS, "")).strip().lower()


def is_record(trajectory: Trajectory) -> bool:
    """The replay driver's record of a trial (`trials.py`): what the driver saw, not a run of the agent."""
    return not trajectory.steps and str(trajectory.context.get(RECORD_KIND, "")) in RECORD_KINDS


def is_missing(trajectory: Trajectory) -> bool:
    """A legacy marker of a trial never started (spend cap, interrupted): counted beside n, never in it."""
    return not is_record(trajectory) and _status(trajectory) == "missing"


def is_errored(trajectory: Trajectory) -> bool:
    """A legacy marker of a trial that started and produced no usable run: a run, and a failing one."""
    return not is_record(trajectory) and _status(trajectory) in ERRORED_STATUSES


def is_marker(trajectory: Trajectory) -> bool:
    """No run of the agent: a driver's record, or a legacy trial marker (missing or errored)."""
    return is_record(trajectory) or _status(trajectory) in MARKER_STATUSES


def errored_reason(trajectory: Trajectory) -> str:
    """Why an errored trial failed, as its marker recorded it."""
    reason = trajectory.context.get(TRIAL_REASON)
    return str(reason) if reason not in (None, "") else "(no reason recorded)"


def strict_bool(value: Any) -> bool | None:
    """True / "true" / 1 / "1" -> True; False / "false" / 0 / "0" -> False; anything else -> None.

    Exporters stringify attributes, so the text forms are accepted; "yes", 2 or "" are not
    evidence of anything.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return {"true": True, "1": True, "false": False, "0": False}.get(value.strip().lower())
    return None


def fault_exposed(trajectory: Trajectory) -> bool:
    """Positive evidence that the injected fault hit this run.

    Either a failed step of the targeted tool (``plumbline.fault.tool``) whose error contains the
    text the driver injected (``plumbline.fault.error``), or ``plumbline.fault.fired`` strictly
    true. Absent or unreadable evidence is no evidence: the run is unexposed.
    """
    return strict_bool(trajectory.context.get(FAULT_FIRED)) is True or fault_shown(trajectory)


def fault_shown(trajectory: Trajectory) -> bool:
    """The trace itself shows the injected fault: a failed step of the targeted tool carrying the injected error text."""
    tool, message = trajectory.context.get(FAULT_TOOL), trajectory.context.get(FAULT_ERROR)
    if tool in (None, "") or message in (None, ""):
        return False
    return any(s.name == str(tool) and s.error is not None and str(message) in s.error for s in trajectory.steps)


def run_status(trajectory: Trajectory) -> RunStatus:
    """How a run counts: missing (not in n), errored (in n, failing), unexposed (listed only), exposed (judged).

    Only ``tool_fault`` runs need exposure evidence; every other perturbation is exposed by
    construction (its variant is the prompt or tool set the agent saw).
    """
    if is_missing(trajectory):
        return "missing"
    if is_errored(trajectory):
        return "errored"
    if perturbation_of(trajectory) == TOOL_FAULT and not fault_exposed(trajectory):
        return "unexposed"
    return "exposed"


def run_label(trajectory: Trajectory) -> str:
    """How reports list one run: its trial id, else its trajectory id."""
    return str(trajectory.context.get(TRIAL_ID) or trajectory.trajectory_id)
