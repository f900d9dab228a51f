"""``run_trial``: one arm on one task, in one trace, against a fresh system of record.

This is the programmatic entry point the CLI and the replay driver use. Per call it builds
everything mutable from scratch (system of record, tool runner, model caller), so two trials
never share state, whatever the caller reuses (client, tracer provider, spec). Faults come from
the replay driver's trial scope (one mechanism for the driver and the domain); called on its own
with ``fault=``, it opens such a scope for this one trial.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from opentelemetry import trace

from domains.accounts_payable import tracing
from domains.accounts_payable.arms import plan_execute, react
from domains.accounts_payable.arms.context import ArmContext
from domains.accounts_payable.arms.runtime import (
    NO_RETRY,
    ArmOutcome,
    ModelCaller,
    RetryPolicy,
    ToolRunner,
    TrialResult,
)
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity
from plumbline_otel.replay.scope import FaultInjector, TrialScope, activate, current_scope, current_trial_attributes
from plumbline_otel.runs import FAULT, FAULT_STEP

DEFAULT_MODEL = "claude-haiku-4-5"
DEFAULT_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.05, max_delay_s=2.0)
_FAULT_PREFIX = FAULT + "."

ARMS: dict[str, Callable[[ArmContext], ArmOutcome]] = {
    "plan_execute": plan_execute.run_no_retry,
    "plan_execute_retry": plan_execute.run_with_retry,
    "react": react.run,
}


def make_client(base_url: str | None = None, api_key: str | None = None, **kwargs: Any) -> Any:
    """An ``anthropic.Anthropic`` client; the real API unless ``base_url`` points elsewhere."""
    import anthropic

    key = api_key or os.environ.get("ANTHROPIC_API_KEY") or "offline-standin"
    return anthropic.Anthropic(base_url=base_url, api_key=key, **kwargs)


def _trace_id(span: Any) -> str:
    return format(span.get_span_context().trace_id, "032x")


def run_trial(
    arm: str,
    task_id: str,
    *,
    client: Any | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = DEFAULT_MODEL,
    trial: TrialIdentity | None = None,
    fault: FaultPlan | None = None,
    tracer_provider: Any | None = None,
    request_text: str | None = None,
    capture_content: bool = True,
    retry: RetryPolicy | None = None,
    max_turns: int | None = None,
    temperature: float | None = None,
) -> TrialResult:
    """Run ``arm`` on ``task_id`` once and grade the system of record it leaves behind.

    Args:
        arm: ``plan_execute``, ``plan_execute_retry`` or ``react``.
        task_id: a task of ``domains.accounts_payable.tasks.TASKS`` (e.g. ``"INV-8001"``).
        client: an ``anthropic.Anthropic`` client; built from ``base_url``/``api_key`` if absent.
        model: the model requested (the response's model is recorded separately).
        trial: the trial identity, written on the root span.
        fault: a fault to inject when no replay trial is current (the driver's scope brings its
            own); a fresh injector is built from it for this trial only.
        tracer_provider: where spans go; the global provider when absent.
        request_text: the request as sent (a perturbed variant); the task's own text if absent.
        retry: the retry policy of ``plan_execute_retry`` (ignored by the other arms).

    Returns:
        The trial's result, including ``fault_fired``/``fault_step`` and the grade.
    """
    from domains.accounts_payable import tasks

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    task = tasks.task(task_id)
    task_id = task.task_id
    text = request_text if request_text is not None else _request_of(task)
    client = client if client is not None else make_client(base_url, api_key)
    provider = tracer_provider or trace.get_tracer_provider()
    tracer = provider.get_tracer(tracing.SCOPE_NAME, tracing.SERVICE_VERSION)
    own_scope = None
    if fault is not None:
        if current_scope() is not None:
            raise ValueError("run_trial(fault=…) inside a replay trial: the driver's trial brings its own fault")
        own_scope = TrialScope(replace(trial or TrialIdentity("adhoc"), fault=fault), fault=FaultInjector(fault))
    with activate(own_scope) if own_scope is not None else nullcontext():
        return _run(arm, task, text, client, model, trial, tracer, capture_content, retry, max_turns, temperature,
                    stamp_identity=trial is not None or own_scope is None)


def _run(arm: str, task: Any, text: str, client: Any, model: str, trial: TrialIdentity | None, tracer: Any,
         capture_content: bool, retry: RetryPolicy | None, max_turns: int | None, temperature: float | None,
         *, stamp_identity: bool) -> TrialResult:
    from domains.accounts_payable import ground_truth
    from domains.accounts_payable.system_of_record import open_system_of_record

    task_id = task.task_id
    scope = current_scope()
    injector = scope.fault if scope is not None else None
    sor = open_system_of_record()
    started = time.perf_counter()
    try:
        runner = ToolRunner(sor, tracer, arm)
        caller = ModelCaller(
            client,
            model,
            tracer,
            capture_content=capture_content,
            trial_id=trial.trial_id if trial else None,
            temperature=temperature,
        )
        policy = NO_RETRY if arm == "plan_execute" else (retry or DEFAULT_RETRY)
        ctx = ArmContext(task_id, text, runner, caller, policy, max_turns)
        with tracing.agent_span(tracer, arm, task_id, text, trial, model) as root:
            trace_id = _trace_id(root)
            outcome = ARMS[arm](ctx)
            # The trial's identity and fault evidence as the driver recorded them (fault.fired is
            # the injector's own account), read now that the run is over.
            evidence = current_trial_attributes()
            if not stamp_identity:  # an ad-hoc fault with no trial: only the fault's own evidence
                evidence = {k: v for k, v in evidence.items() if k.startswith(_FAULT_PREFIX)}
            root.set_attributes(evidence)
            fault_step = next((s.index for s in runner.steps if s.injected), None)
            if fault_step is not None:
                root.set_attribute(FAULT_STEP, fault_step)
            tracing.finish_agent_span(root, outcome.final_answer, outcome.agent_error)
        graded = ground_truth.grade(sor, task_id)
    finally:
        _close(sor)
    return TrialResult(
        arm=arm,
        task_id=task_id,
        model=model,
        request_text=text,
        trial=trial,
        trace_id=trace_id,
        final_answer=outcome.final_answer,
        steps=runner.steps,
        grade=graded,
        passed=_passed(graded),
        fault=injector.plan if injector else None,
        fault_fired=bool(injector and injector.fired),
        fault_step=fault_step,
        agent_error=outcome.agent_error,
        model_calls=caller.usage.calls,
        input_tokens=caller.usage.input_tokens,
        output_tokens=caller.usage.output_tokens,
        duration_s=time.perf_counter() - started,
        response_models=list(caller.response_models),
    )


def _request_of(task: Any) -> str:
    for attr in ("request", "request_text", "prompt", "text"):
        value = getattr(task, attr, None)
        if isinstance(value, str):
            return value
    if isinstance(task, dict):
        for key in ("request", "request_text", "prompt", "text"):
            if isinstance(task.get(key), str):
                return task[key]
    if isinstance(task, str):
        return task
    raise TypeError(f"cannot find the request text of task {task!r}")


def _passed(graded: Any) -> bool:
    for attr in ("passed", "ok", "correct"):
        value = getattr(graded, attr, None)
        if isinstance(value, bool):
            return value
        if isinstance(graded, dict) and isinstance(graded.get(attr), bool):
            return graded[attr]
    return bool(graded)


def _close(sor: Any) -> None:
    close = getattr(sor, "close", None)
    if callable(close):
        close()
