"""The three agent arms of the accounts-payable domain, and ``run_trial`` to run one of them.

    run_trial(arm, task_id, client=..., trial=..., fault=..., tracer_provider=...) -> TrialResult

Arms (``ARMS``):
    plan_execute         one interpretation call, then fixed control flow; any tool error blocks
    plan_execute_retry   the same, retrying transient tool errors (503, 429, timeout, reset)
    react                a free-form tool-using loop; the model chooses every call

Faults are the replay driver's ``FaultPlan(tool, kind, on_call=1, times=1)``, injected per trial.
"""

from __future__ import annotations

from domains.accounts_payable.arms.runtime import TRANSIENT_KINDS, RetryPolicy, ToolStep, TrialResult
from domains.accounts_payable.arms.trial import ARMS, DEFAULT_MODEL, make_client, run_trial
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity

__all__ = [
    "ARMS",
    "DEFAULT_MODEL",
    "TRANSIENT_KINDS",
    "FaultPlan",
    "RetryPolicy",
    "ToolStep",
    "TrialIdentity",
    "TrialResult",
    "make_client",
    "run_trial",
]
