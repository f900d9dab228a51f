"""A small study on the reference domain: every arm, every task, under meaning-preserving perturbations.

It is what `plumbline demo` runs to have something real to certify, and what a user copies to
run their own. Each trial's identity (`plumbline.trial.id`, `plumbline.perturbation`, …) rides on
its root span, so the traces carry everything certification needs; nothing is passed around
beside them.

Perturbations here:
- `baseline`: the request as written.
- `distractor`: the same request with office chatter appended (no id, amount or date changes).
- `tool_fault`: one transient 503 from `check_duplicate`, the first time it is called in the trial.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from domains.accounts_payable import tracing
from domains.accounts_payable.arms import ARMS, FaultSpec, TrialResult, run_trial
from domains.accounts_payable.run import model_backend
from domains.accounts_payable.tasks import TASKS

PERTURBATIONS = ("baseline", "distractor", "tool_fault")
DISTRACTION = (
    " By the way, the office move is next Thursday, so if you could also keep an eye on the kitchen"
    " rota, the parking passes and whoever keeps borrowing the good stapler, that would be great."
)
FAULT = FaultSpec("check_duplicate", "503")
# A plausible simulated model: it sometimes skips a check when distracted, sometimes gives up
# after a transient error, and rarely misreads an amount or picks the wrong reason code.
DEMO_IMPERFECTIONS = {"skip_check_under_distraction": 0.3, "stop_retrying": 0.3, "misread_amount": 0.03, "wrong_reason_code": 0.05}


def _variant(perturbation: str, request: str) -> tuple[str | None, FaultSpec | None]:
    if perturbation == "baseline":
        return None, None
    if perturbation == "distractor":
        return request + DISTRACTION, None
    if perturbation == "tool_fault":
        return None, FAULT
    raise ValueError(f"unknown perturbation {perturbation!r}; known: {', '.join(PERTURBATIONS)}")


def run_study(
    out_dir: str | Path,
    *,
    arms: Sequence[str] = ARMS,
    perturbations: Sequence[str] = PERTURBATIONS,
    repeats: int = 1,
    imperfections: dict[str, float] | None = None,
    study: str = "ap-demo",
    seed: int = 0,
    on_result: Callable[[str, str, TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Run the study on the simulated model, writing one OTLP JSON-lines file per arm into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: list[TrialResult] = []
    profile = DEMO_IMPERFECTIONS if imperfections is None else imperfections
    with model_backend(offline=True, imperfections=profile, seed=seed) as backend:
        for arm in arms:
            provider = tracing.make_tracer_provider(arm, otlp_file=out / f"{arm}.otlp.jsonl")
            try:
                for task in TASKS:
                    for perturbation in perturbations:
                        request, fault = _variant(perturbation, task.request)
                        for k in range(repeats):
                            trial = tracing.TrialIdentity(f"{study}/{arm}/{task.task_id}/{perturbation}/k{k}", perturbation, "0", study)
                            result = run_trial(arm, task.task_id, client=backend.client, model=backend.model, trial=trial,
                                               fault=fault, request_text=request, tracer_provider=provider)
                            results.append(result)
                            if on_result:
                                on_result(arm, perturbation, result)
            finally:
                provider.shutdown()
    return results
