"""What an arm did is what plumbline reads back: its OTLP file, ingested, gives the same tool calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from domains.accounts_payable import tracing
from domains.accounts_payable.arms import ARMS, FaultPlan, run_trial
from domains.accounts_payable.run import model_backend
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store

TASKS = ("INV-1002", "INV-1008", "INV-1013")  # a payment with approval, a held duplicate, a credit note


@pytest.mark.parametrize("arm", ARMS)
def test_ingested_traces_match_the_calls_each_arm_made(arm: str, tmp_path: Path, store: Store) -> None:
    path = tmp_path / f"{arm}.otlp.jsonl"
    provider = tracing.make_tracer_provider(arm, otlp_file=path)
    results = {}
    with model_backend(offline=True) as backend:
        for task_id in TASKS:
            fault = FaultPlan("check_duplicate", "503") if task_id == "INV-1002" else None
            trial = tracing.TrialIdentity(f"t/{arm}/{task_id}", "tool_fault" if fault else "baseline", "0", "t")
            results[f"t/{arm}/{task_id}"] = run_trial(arm, task_id, client=backend.client, model=backend.model,
                                                      trial=trial, fault=fault, tracer_provider=provider)
    provider.shutdown()
    summary = ingest_files(store, [str(path)])
    assert summary.exit_code == 0 and summary.problems == []
    trajectories = {t.context["plumbline.trial.id"]: t for t in store.trajectories()}
    assert sorted(trajectories) == sorted(results)
    for trial_id, result in results.items():
        trajectory = trajectories[trial_id]
        assert [(s.name, s.args, s.failed) for s in trajectory.tool_steps] == [(s.name, s.args, not s.ok) for s in result.steps]
        assert [s.call_id for s in trajectory.tool_steps] == [s.call_id for s in result.steps]
        assert trajectory.service == f"ap-agent-{arm}" and trajectory.agent_name
        assert trajectory.task_key and result.task_id in trajectory.task_key
        assert trajectory.context.get("plumbline.fault.fired") is (True if "INV-1002" in trial_id else None)
