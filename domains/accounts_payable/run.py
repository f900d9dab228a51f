"""Run an arm over the accounts-payable tasks: pick the model backend, trace, grade, summarise.

``run_domain`` is what ``plumbline domain run accounts_payable`` calls. The model backend is,
in order of preference:

1. ``model_url``: any Messages-API-compatible server (a proxy, a recorded-response server);
2. the real Anthropic API, when ``ANTHROPIC_API_KEY`` is set and ``offline`` is not asked for;
3. otherwise the loopback stand-in serving the simulated model (``simulated-ap-policy-v1``),
   started for the run on 127.0.0.1 and stopped after it. Imperfections apply only here.

Traces go to ``endpoint`` (OTLP gRPC or HTTP) or ``otlp_file`` (OTLP JSON lines); the provider
is flushed after every trial, so an interrupted run keeps the traces of its finished trials.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domains.accounts_payable import tracing
from domains.accounts_payable.arms import FaultPlan, TrialResult, make_client, run_trial
from domains.accounts_payable.arms.trial import DEFAULT_MODEL
from domains.accounts_payable.simulated_model import SIMULATED_MODEL_NAME, SimulatedModel, parse_imperfections
from plumbline_otel.replay.identity import TrialIdentity, trial_id_for


@dataclass
class Backend:
    """Where model calls go for a run."""

    kind: str  # "simulated", "anthropic" or "url"
    base_url: str | None
    model: str
    client: Any

    @property
    def simulated(self) -> bool:
        return self.kind == "simulated"


@dataclass
class RunSummary:
    """The results of one run, in task order."""

    arm: str
    backend: str
    results: list[TrialResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)


def api_key_configured() -> bool:
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))


@contextmanager
def model_backend(
    *,
    model: str | None = None,
    model_url: str | None = None,
    offline: bool = False,
    imperfections: str | dict[str, float] | None = None,
    seed: int = 0,
) -> Iterator[Backend]:
    """Yield the backend for a run (starting and stopping the stand-in when it is the one)."""
    from domains.accounts_payable.anthropic_standin import AnthropicStandIn

    parsed = parse_imperfections(imperfections)
    if model_url or (api_key_configured() and not offline):
        if parsed:
            raise ValueError("imperfections apply only to the simulated model; drop them, or run --offline")
        kind = "url" if model_url else "anthropic"
        yield Backend(kind, model_url, model or DEFAULT_MODEL, make_client(model_url))
        return
    with AnthropicStandIn(SimulatedModel(parsed, seed=seed)) as standin:
        client = make_client(standin.base_url, api_key="offline-standin", max_retries=0)
        yield Backend("simulated", standin.base_url, model or SIMULATED_MODEL_NAME, client)


def select_tasks(task: str | Sequence[str] | None) -> list[str]:
    """``"all"``/None -> every task id; ``"INV-1001,INV-1007"`` or a list -> those (validated)."""
    from domains.accounts_payable.tasks import TASKS, TASKS_BY_ID

    if task is None or task == "all":
        return [t.task_id for t in TASKS]
    wanted = [t.strip().upper() for t in (task.split(",") if isinstance(task, str) else task) if t.strip()]
    unknown = [t for t in wanted if t not in TASKS_BY_ID]
    if unknown:
        raise ValueError(f"unknown task {', '.join(unknown)}; tasks are {TASKS[0].task_id}..{TASKS[-1].task_id}")
    return wanted


def run_domain(
    arm: str,
    task: str | Sequence[str] | None = "all",
    *,
    endpoint: str | None = None,
    otlp_file: str | Path | None = None,
    imperfections: str | dict[str, float] | None = None,
    fault: str | FaultPlan | None = None,
    seed: int = 0,
    model: str | None = None,
    model_url: str | None = None,
    offline: bool = False,
    repeats: int = 1,
    study: str | None = None,
    exporter: Any | None = None,
    on_result: Callable[[TrialResult], None] | None = None,
) -> RunSummary:
    """Run ``arm`` on the selected tasks (``repeats`` trials each) and grade every trial."""
    task_ids = select_tasks(task)
    spec = FaultPlan.parse(fault) if isinstance(fault, str) else fault
    study = study or f"ap-{arm}-seed{seed}"
    provider = tracing.make_tracer_provider(arm, endpoint=endpoint, otlp_file=otlp_file, exporter=exporter)
    started = time.perf_counter()
    try:
        with model_backend(model=model, model_url=model_url, offline=offline,
                           imperfections=imperfections, seed=seed) as backend:
            summary = RunSummary(arm, backend.kind)
            for task_id in task_ids:
                for k in range(repeats):
                    perturbation = "tool_fault" if spec else "baseline"
                    trial = TrialIdentity(trial_id_for(study, task_id, perturbation, "0", k), perturbation, "0", study,
                                          k, task_id)
                    result = run_trial(arm, task_id, client=backend.client, model=backend.model,
                                       trial=trial, fault=spec, tracer_provider=provider)
                    provider.force_flush()
                    summary.results.append(result)
                    if on_result is not None:
                        on_result(result)
    finally:
        provider.shutdown()
    summary.seconds = time.perf_counter() - started
    return summary


# ---------------------------------------------------------------------------------------------
# Rendering


def describe_expected(outcome: Any) -> str:
    if outcome.action == "pay":
        return f"pay {outcome.payable_amount:,.2f} {outcome.currency} ({outcome.approver_role})"
    if outcome.action == "hold":
        return f"hold {outcome.primary_reason_code}"
    return f"credit {outcome.credit_amount:,.2f} against {outcome.credit_target}"


def format_result(result: TrialResult) -> str:
    """One line per trial: verdict, expected and observed outcome, effort, the fault's fate."""
    grade = result.grade
    verdict = "PASS" if result.passed else "FAIL"
    parts = [f"{result.task_id:<9}", f"{verdict}", f"expected {describe_expected(grade.expected)}",
             f"observed {grade.observed_action}", f"{len(result.steps)} tool calls",
             f"{result.model_calls} model calls"]
    if result.fault is not None:
        parts.append(f"fault fired at step {result.fault_step}" if result.fault_fired else "fault NOT fired")
    if result.agent_error:
        parts.append(f"agent: {result.agent_error}")
    line = "  ".join(parts)
    if grade.problems:
        line += "\n           " + "; ".join(grade.problems)
    return line


def format_summary(summary: RunSummary) -> str:
    n = len(summary.results)
    rate = f"{summary.passed / n:.1%}" if n else "n/a"
    models = sorted({m for r in summary.results for m in r.response_models})
    calls = sum(r.model_calls for r in summary.results)
    tokens_in = sum(r.input_tokens for r in summary.results)
    tokens_out = sum(r.output_tokens for r in summary.results)
    text = (f"{summary.arm}: {summary.passed}/{n} passed ({rate}); model {', '.join(models) or '-'}"
            f"{' (simulated)' if summary.backend == 'simulated' else ''}; {calls} model calls, "
            f"{tokens_in}/{tokens_out} tokens in/out; {summary.seconds:.1f}s")
    faulted = [r for r in summary.results if r.fault is not None]
    if faulted:
        fired = sum(r.fault_fired for r in faulted)
        text += f"; fault {faulted[0].fault} fired in {fired}/{len(faulted)} trials"
    return text


def write_results(path: str | Path, results: Sequence[TrialResult]) -> None:
    """Trial results as JSON lines (``TrialResult.as_dict``)."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for result in results:
            fh.write(json.dumps(result.as_dict(), default=str) + "\n")
