"""One fault mechanism for the driver and the domain: the arms meet the replay driver's injected
fault, and each accounts-payable run records the evidence the certificate matches."""

from __future__ import annotations

from pathlib import Path

import pytest

from domains.accounts_payable.arms import FaultPlan, TrialIdentity, run_trial
from domains.accounts_payable.replay_adapter import APAdapter
from domains.accounts_payable.tasks import TASKS_BY_ID
from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay import (
    ReplayTask,
    SpanSink,
    StudyConfig,
    TrialScope,
    run_study,
)
from plumbline_otel.replay.scope import activate
from plumbline_otel.runs import is_record
from plumbline_otel.store import Store


def _task(task_id: str) -> ReplayTask:
    return ReplayTask(task_id, TASKS_BY_ID[task_id].request, f"src-{task_id}", "ap-agent-plan_execute_retry", "1.0.0", 0,
                      ("get_invoice", "check_duplicate", "three_way_match"))


def test_replayed_fault_trials_carry_the_tool_the_error_text_and_fired(tmp_path: Path) -> None:
    sink = SpanSink(otlp_file=str(tmp_path / "o.jsonl"))
    adapter = APAdapter("plan_execute")  # no retry: the fault decides the outcome
    config = StudyConfig("f", perturbations=("tool_fault",), repeats=2, sink=sink, state_dir=tmp_path / "s")
    try:
        summary = run_study(config, [_task("INV-1001"), _task("INV-1002")], adapter)
    finally:
        adapter.close()
        sink.close()
    assert summary.ok == 4 and summary.faults() == (4, 4)
    plan = FaultPlan("check_duplicate", "503")
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [sink.otlp_file or ""])
        runs = [t for t in store.trajectories() if not is_record(t)]
    assert len(runs) == 4
    for t in runs:
        assert t.context["plumbline.fault.tool"] == "check_duplicate"
        assert t.context["plumbline.fault.error"] == plan.error_message
        assert t.context["plumbline.fault.fired"] is True and t.context["plumbline.trial.attempt"] == 1
        failed = [s for s in t.tool_steps if s.failed and s.name == "check_duplicate"]
        assert len(failed) == 1 and plan.error_message in (failed[0].error or "")


def test_run_trial_inside_a_replay_trial_takes_the_driver_s_fault_not_its_own() -> None:
    with activate(TrialScope(TrialIdentity("x"))):
        with pytest.raises(ValueError, match="brings its own fault"):
            run_trial("react", "INV-1001", fault=FaultPlan("check_duplicate", "503"))
