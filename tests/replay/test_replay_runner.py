"""The driver's runtime: per-trial faults, identity in the agent's own spans, retries, missing trials, resume."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from plumbline_otel.errors import ReplayError
from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay import (
    AdapterError,
    RetryPolicy,
    SpanSink,
    StudyConfig,
    TransientAdapterError,
    Trial,
    run_study,
    select_tasks,
    stored_trials,
)
from plumbline_otel.report import build_certificate
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.store import Store
from plumbline_otel.trials import KeyRing

from .toy import ToyAgent, agent_runs, driver_records, one_task, tasks

SPEC = Spec.of("toy", [invariant("PAY", MustCall("pay"))])
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.001)


def config(tmp_path: Path, study: str = "s", **kw: object) -> StudyConfig:
    kw.setdefault("sink", SpanSink(otlp_file=str(tmp_path / "replay.otlp.jsonl")))
    kw.setdefault("state_dir", tmp_path / "state" / study)
    kw.setdefault("retry", FAST)
    kw.setdefault("grace_s", 0.2)
    return StudyConfig(study, **kw)  # type: ignore[arg-type]


def certify(tmp_path: Path, study: str) -> dict[str, dict[str, int]]:
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        cert = build_certificate(SPEC, store.trajectories(), study=study, keys=KeyRing.load([tmp_path / "state"]))
    return {c.perturbation: {"n": c.n, "missing": c.missing, "unexposed": c.unexposed}
            for a in cert.agents for c in a.perturbations}


def test_every_trial_of_a_variant_sees_its_own_fault(tmp_path: Path) -> None:
    agent = ToyAgent()
    summary = run_study(config(tmp_path, perturbations=("tool_fault",), repeats=3, concurrency=3), [one_task()], agent)
    assert summary.ok == 3
    assert [r.fault_fired for r in summary.records] == [True, True, True]  # the seed fired once per variant
    assert all(s["fired"] for s in agent.seen)
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        runs = agent_runs(store.trajectories())
    assert len(runs) == 3
    for t in runs:
        assert t.context["plumbline.fault.fired"] is True
        assert [(s.name, s.failed) for s in t.tool_steps] == [("lookup_invoice", True), ("lookup_invoice", False), ("pay", False)]


def test_the_agent_joins_the_trial_through_context_and_baggage(tmp_path: Path) -> None:
    agent = ToyAgent()
    summary = run_study(config(tmp_path, perturbations=("baseline", "distractor"), repeats=2), tasks(2), agent)
    assert summary.ok == 8
    by_trial = {s["trial_id"]: s for s in agent.seen}
    for record in summary.records:
        seen = by_trial[record.trial_id]
        assert seen["baggage"]["plumbline.trial.id"] == record.trial_id
        assert seen["baggage"]["plumbline.perturbation"] == record.perturbation
        assert seen["baggage"]["plumbline.study"] == "s"
        assert seen["trace_id"] == record.trace_id  # the agent's trace is the trial's trace
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        stored = {t.context["plumbline.trial.id"]: t for t in agent_runs(store.trajectories())}
    assert set(stored) == set(by_trial)
    assert {t.trace_id for t in stored.values()} == {r.trace_id for r in summary.records}
    assert {t.task_key for t in stored.values()} == {"INV-1000", "INV-1001"}


def test_transient_errors_are_retried_with_backoff_and_others_are_not(tmp_path: Path) -> None:
    attempts: Counter[str] = Counter()
    traces: dict[str, set[str]] = {}
    lock = threading.Lock()
    agent = ToyAgent()

    def flaky(trial: Trial) -> object:
        with lock:
            attempts[trial.trial_id] += 1
            n = attempts[trial.trial_id]
            traces.setdefault(trial.trial_id, set()).add(trial.trace_id)
        if trial.identity.task_key == "INV-1000" and n == 1:
            raise TransientAdapterError("503 at the door")
        if trial.identity.task_key == "INV-1001":
            raise TransientAdapterError("always busy", retry_after=0.0)
        if trial.identity.task_key == "INV-1002":
            raise AdapterError("agent crashed")
        return agent.run(trial)

    summary = run_study(config(tmp_path, concurrency=2), tasks(3), flaky)
    by_task = {r.task_key: r for r in summary.records}
    assert (by_task["INV-1000"].status, by_task["INV-1000"].attempts) == ("ok", 2)
    # Refused at the door every time: it never reached the agent, so it is missing, not the agent's failure.
    assert (by_task["INV-1001"].status, by_task["INV-1001"].attempts) == ("missing", 3)
    assert "after 3 attempt(s)" in (by_task["INV-1001"].reason or "")
    assert (by_task["INV-1002"].status, by_task["INV-1002"].attempts) == ("errored", 1)
    assert (summary.errored, summary.missing) == (1, 1)
    # every execution ran in a trace of its own, and the driver recorded each one
    assert [len(traces[r.trial_id]) for r in summary.records] == [2, 3, 1]
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        records = driver_records(store.trajectories(), summary.keys)
    last = {r.trial_id: r for r in sorted(records, key=lambda r: r.attempt)}
    assert len(records) == 6 and {r.trace_id for r in records} == set().union(*traces.values())
    assert last[by_task["INV-1002"].trial_id].status == "errored"
    assert "agent crashed" in (last[by_task["INV-1002"].trial_id].reason or "")
    assert (last[by_task["INV-1001"].trial_id].status, last[by_task["INV-1001"].trial_id].attempt) == ("missing", 3)
    assert FAST.delay(1) == pytest.approx(0.001) and FAST.delay(3) == pytest.approx(0.004)
    assert RetryPolicy(max_delay_s=5).delay(2, retry_after=60) == 5


def test_trials_the_cap_never_started_are_missing_and_resume_runs_them_as_new_attempts(tmp_path: Path) -> None:
    agent = ToyAgent(cost_usd=1.0)
    first = run_study(config(tmp_path, perturbations=("baseline",), repeats=2, concurrency=1, budget_usd=2.0,
                             trial_max_usd=1.0), tasks(2), agent)
    assert (first.ok, first.missing) == (2, 2)
    assert certify(tmp_path, "s")["baseline"]["n"] == 2

    # Resume with a larger (cumulative) cap: the missing trials run as attempt 2, in traces of
    # their own; the store then has a run of every trial.
    second = run_study(config(tmp_path, perturbations=("baseline",), repeats=2, concurrency=1, budget_usd=4.0,
                              trial_max_usd=1.0, resume=True), tasks(2), agent)
    assert (second.ok, second.missing, second.skipped) == (2, 0, 2)
    assert second.spent_usd == pytest.approx(4.0) and second.session_usd == pytest.approx(2.0)
    with Store(tmp_path / "p2.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        runs, only_markers = stored_trials(store, "s", second.keys)
        attempts = sorted(t.context["plumbline.trial.attempt"] for t in agent_runs(store.trajectories()))
    assert len(runs) == 4 and not only_markers
    assert attempts == ["1", "1", "2", "2"]  # the toy agent stamps its baggage (strings)


def test_resume_skips_trials_already_in_the_store_and_a_rerun_without_resume_is_refused(tmp_path: Path) -> None:
    agent = ToyAgent()
    first = run_study(config(tmp_path, perturbations=("baseline", "tool_fault"), state_dir=None), tasks(2), agent)
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        done, missing = stored_trials(store, "s", first.keys)
    assert len(done) == 4 and not missing

    with pytest.raises(ReplayError, match="already has 4 of its 4 trials decided"):
        run_study(config(tmp_path, perturbations=("baseline", "tool_fault"), state_dir=None), tasks(2), agent, completed=done)
    agent.seen.clear()
    summary = run_study(config(tmp_path, perturbations=("baseline", "tool_fault"), repeats=2, resume=True, state_dir=None),
                        tasks(2), agent, completed=done)
    assert (summary.planned, summary.skipped, summary.ok) == (8, 4, 4)
    assert all(s["trial_id"].endswith("/k1") for s in agent.seen)  # only the new repeats ran


def test_the_ledger_alone_is_enough_to_resume(tmp_path: Path) -> None:
    agent = ToyAgent()
    assert run_study(config(tmp_path), tasks(3), agent).ok == 3
    again = run_study(config(tmp_path, resume=True, repeats=2), tasks(3), agent)  # no store given
    assert (again.skipped, again.ok) == (3, 3)
    assert (tmp_path / "state" / "s" / "variants.jsonl").exists()


def test_tasks_come_from_the_latest_baseline_run_of_each_key(tmp_path: Path) -> None:
    agent = ToyAgent()
    run_study(config(tmp_path, "src", perturbations=("baseline", "distractor")), tasks(2), agent)
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        found = select_tasks(store, agent="toy-agent")
        assert [t.task_key for t in found] == ["INV-1000", "INV-1001"]
        assert [t.input for t in found] == [t.input for t in tasks(2)]  # never a distractor variant's input
        assert found[0].tools == ("lookup_invoice", "pay")
        assert select_tasks(store, agent="toy-agent@1", task_keys=["INV-1001"])[0].task_key == "INV-1001"
        assert select_tasks(store, agent="other") == []
        assert [t.task_key for t in select_tasks(store, where="task_key LIKE '%1'")] == ["INV-1001"]
        assert select_tasks(store, since_ns=2**62) == []
